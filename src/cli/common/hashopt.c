/*
 * hashopt.c - the hash-profile flags shared by replay, plan, demo and keys (see hashopt.h):
 * parsing each value with the flags.h message shape, checking their combinations, filling
 * a kvp_config's hash fields, and wording the library's refusals of a request for
 * "FILE:LINE:" messages.
 *
 * The profile names are the library's (kvp_hash_profile_parse / kvp_hash_profile_name), so
 * a profile added there is accepted here without a change; the list in the message is
 * built from the library's names too.
 *
 * Cost: O(length of the value) per flag; nothing is allocated.
 */
#include "hashopt.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "flags.h"

/* The profiles the library knows, in KVP_HASH_* order (for the message's list). */
#define N_PROFILES 5

void cli_hash_init(cli_hash_opts *h)
{
    memset(h, 0, sizeof *h);
    h->profile = KVP_HASH_KEYED;
}

bool cli_hash_is_opt(int c)
{
    return c >= CLI_OPT_HASH && c <= CLI_OPT_VOCAB_SIZE;
}

bool cli_hash_any(const cli_hash_opts *h)
{
    return h->profile_given || h->key_len || h->vllm_seed || h->vocab_size || h->seed_given;
}

int cli_hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

bool cli_parse_hex_key(const char *s, uint8_t key[KVP_HASH_KEY_MAX], uint32_t *len)
{
    size_t n = s ? strlen(s) : 0;
    if (n % 2 || n / 2 < KVP_HASH_KEY_MIN || n / 2 > KVP_HASH_KEY_MAX)
        return false;
    uint8_t tmp[KVP_HASH_KEY_MAX];
    for (size_t i = 0; i < n / 2; i++) {
        int hi = cli_hexval((unsigned char)s[2 * i]), lo = cli_hexval((unsigned char)s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        tmp[i] = (uint8_t)(hi * 16 + lo);
    }
    memcpy(key, tmp, n / 2);
    *len = (uint32_t)(n / 2);
    return true;
}

/* --hash: one of the library's profile names; the message lists them. */
static int apply_profile(const char *cmd, cli_hash_opts *h, const char *v)
{
    if (kvp_hash_profile_parse(v, &h->profile) == KVP_OK) {
        h->profile_given = true;
        return 0;
    }
    char names[256] = "";
    size_t used = 0;
    for (int p = 1; p <= N_PROFILES; p++) {
        const char *name = kvp_hash_profile_name(p);
        int n = snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "",
                         name ? name : "?");
        if (n > 0 && (size_t)n < sizeof names - used)
            used += (size_t)n;
    }
    return cli_fail(cmd, CLI_EXIT_USAGE, "--hash: '%s' is not one of %s", v, names);
}

int cli_hash_apply(const char *cmd, cli_hash_opts *h, int c, const char *v)
{
    uint64_t x = 0;
    int rc;
    switch (c) {
    case CLI_OPT_HASH:
        return apply_profile(cmd, h, v);
    case CLI_OPT_HASH_KEY:
        if (!cli_parse_hex_key(v, h->key, &h->key_len))
            return cli_fail(cmd, CLI_EXIT_USAGE,
                            "--hash-key: '%s' is not a key of %u..%u hex digits (%u..%u bytes)", v,
                            2 * KVP_HASH_KEY_MIN, 2 * KVP_HASH_KEY_MAX, KVP_HASH_KEY_MIN,
                            KVP_HASH_KEY_MAX);
        return 0;
    case CLI_OPT_VLLM_SEED:
        h->vllm_seed = v;
        return 0;
    case CLI_OPT_VOCAB_SIZE:
        if ((rc = cli_flag_uint(cmd, "--vocab-size", v, 1, UINT32_MAX, &x)) == 0)
            h->vocab_size = (uint32_t)x;
        return rc;
    default:
        return 0;
    }
}

int cli_hash_finish(const char *cmd, const cli_hash_opts *h, kvp_config *cfg)
{
    int p = h->profile;
    const char *name = kvp_hash_profile_name(p);
    bool keyed = p == KVP_HASH_KEYED || p == KVP_HASH_SIPHASH;
    bool vllm = p == KVP_HASH_VLLM_SHA256 || p == KVP_HASH_VLLM_XXHASH;
    if (h->key_len && !keyed)
        return cli_fail(cmd, CLI_EXIT_USAGE,
                        "--hash-key applies to --hash keyed and siphash, not %s", name);
    if (h->vllm_seed && !vllm)
        return cli_fail(cmd, CLI_EXIT_USAGE,
                        "--vllm-seed applies to --hash vllm-sha256-cbor and vllm-xxhash-cbor, "
                        "not %s",
                        name);
    if (h->seed_given && p != KVP_HASH_XXH3)
        return cli_fail(cmd, CLI_EXIT_USAGE,
                        "--seed is the xxh3 profile's seed: add --hash xxh3 "
                        "(%s has no public seed)",
                        name);
    cfg->hash_profile = p;
    memcpy(cfg->hash_key, h->key, sizeof cfg->hash_key);
    cfg->hash_key_len = h->key_len;
    cfg->seed = h->seed_given ? h->seed : KVP_DEFAULT_SEED;
    cfg->vllm_seed = h->vllm_seed;
    cfg->vocab_size = h->vocab_size;
    return 0;
}

/* Why a vllm-* profile refused ns: the first field it cannot express. */
static void why_not_vllm(const char *name, const kvp_namespace *ns, char *buf, size_t size)
{
    if (ns && ns->model.ptr)
        snprintf(buf, size,
                 "--hash %s cannot express a model field: vLLM keys have none (an engine "
                 "serves one model); drop it from the log or use keyed, xxh3 or siphash",
                 name);
    else if (ns && ns->tenant.ptr)
        snprintf(buf, size,
                 "--hash %s cannot express a tenant field: vLLM keys have none; give the "
                 "tenant as cache_salt (vLLM's per-user isolation) or use keyed, xxh3 or "
                 "siphash",
                 name);
    else if (ns && ns->salt.ptr && ns->salt.len == 0)
        snprintf(buf, size,
                 "--hash %s cannot express an empty cache_salt (vLLM drops it, which would "
                 "merge it with no salt)",
                 name);
    else
        snprintf(buf, size, "--hash %s cannot express an adapter or cache_salt that is not UTF-8",
                 name);
}

char *cli_hash_refusal(int rc, int profile, uint32_t vocab_size, const kvp_namespace *ns,
                       const uint32_t *tokens, size_t n_tokens, char *buf, size_t size)
{
    const char *name = kvp_hash_profile_name(profile);
    if (rc == KVP_ENOTSUP) {
        why_not_vllm(name ? name : "?", ns, buf, size);
        return buf;
    }
    if (rc == KVP_ETOKEN && vocab_size > 0 && tokens) {
        for (size_t i = 0; i < n_tokens; i++)
            if (tokens[i] >= vocab_size) {
                snprintf(buf, size,
                         "token id %" PRIu32 " (token %zu) is not below --vocab-size %" PRIu32,
                         tokens[i], i, vocab_size);
                return buf;
            }
    }
    snprintf(buf, size, "%s", kvp_strerror(rc));
    return buf;
}
