/*
 * keys.c - `kvprefix keys`: print the block keys of a token list under a hash profile, seed
 * or key, namespace and block size, as hex digests and as event integers (vLLM's KV-event
 * form: the digest's last 8 bytes read big-endian). The tool for "the router's keys and
 * the engine's keys disagree": run it with each side's settings and compare.
 *
 *   kvprefix keys --hash vllm-sha256-cbor --seed 0 --adapter my-lora 1,2,3,...
 *
 * Tokens come from the arguments, --file PATH, or stdin when there are neither; ids are
 * decimal, separated by commas, whitespace or brackets (a pasted Python list works). Output:
 * one line for the chain start ("root": the namespace root, or vLLM's NONE_HASH) and one per
 * full block (index, digest, event integer); a partial tail is reported, not hashed. --json
 * prints the same as one JSON object. Exit status: 0 done, 1 bad input (message naming
 * FILE:LINE or the argument), 2 usage. Memory: the token list (4 bytes per id) and one
 * 88-byte chain state per block.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "keys.h"
#include "kvprefix.h"

/* The parsed command line. */
typedef struct keys_opts {
    kvp_config cfg;   /* hash fields: profile, seed, key, vllm seed, block size, vocab */
    kvp_namespace ns; /* model/adapter/tenant/salt as given */
    const char *file; /* --file: path, "-" for stdin, or NULL */
    const char *seed; /* --seed as given (integer for xxh3, string for vllm-*) */
    bool json;        /* --json */
    bool have_key;    /* --key was given */
} keys_opts;

/* A growing token list and where the tokens came from, for messages. */
typedef struct token_list {
    uint32_t *ids;      /* the ids */
    size_t n;           /* ids stored */
    size_t cap;         /* capacity of ids, in ids */
    const char *source; /* file name, "<stdin>" or "argument" */
} token_list;

static void keys_usage(FILE *f)
{
    fprintf(f,
            "usage: kvprefix keys [options] [TOKEN...]\n"
            "\n"
            "Print the block keys of a token list: per full block its index, hex digest and\n"
            "event integer (the digest's last 8 bytes, big-endian, as in vLLM's KV events).\n"
            "Tokens: decimal ids separated by commas, spaces or brackets, from the arguments,\n"
            "--file, or stdin.\n"
            "\n"
            "options:\n"
            "  --hash PROFILE     keyed (default), xxh3, siphash, vllm-sha256-cbor,\n"
            "                     vllm-xxhash-cbor\n"
            "  --key HEX          keyed, siphash: the cache's key, 32..64 hex digits (required:\n"
            "                     a random key would match no cache)\n"
            "  --seed S           xxh3: the 64-bit seed (default 0); vllm-*: the NONE_HASH seed\n"
            "                     string (default vllm-none-hash; PYTHONHASHSEED if set there)\n"
            "  --model S, --adapter S, --tenant S, --salt S\n"
            "                     the namespace (vllm-*: adapter = LoRA name, salt =\n"
            "                     cache_salt; model and tenant cannot be expressed)\n"
            "  --block-size N     tokens per block (default 16)\n"
            "  --vocab-size N     refuse ids >= N (default: unchecked)\n"
            "  --file PATH        read tokens from PATH ('-' for stdin)\n"
            "  --json             one JSON object instead of lines\n"
            "  -h, --help         this message\n"
            "\n"
            "exit status: 0 done, 1 bad input, 2 usage\n");
}

/* Parse an unsigned decimal integer no larger than max. */
static bool parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (!s || !isdigit((unsigned char)s[0]))
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return false;
    *out = v;
    return true;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Parse --key: an even number of hex digits giving 16..32 bytes. */
static bool parse_key(const char *s, kvp_config *cfg)
{
    size_t n = strlen(s);
    if (n % 2 || n / 2 < KVP_HASH_KEY_MIN || n / 2 > KVP_HASH_KEY_MAX)
        return false;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hexval((unsigned char)s[2 * i]), lo = hexval((unsigned char)s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        cfg->hash_key[i] = (uint8_t)(hi * 16 + lo);
    }
    cfg->hash_key_len = (uint32_t)(n / 2);
    return true;
}

enum {
    OPT_HASH = 256,
    OPT_KEY,
    OPT_SEED,
    OPT_MODEL,
    OPT_ADAPTER,
    OPT_TENANT,
    OPT_SALT,
    OPT_BS,
    OPT_VOCAB,
    OPT_FILE,
    OPT_JSON
};

/* Apply one option. Returns 0, or 2 after a usage message. */
static int apply_opt(keys_opts *o, int c, const char *arg)
{
    uint64_t v;
    switch (c) {
    case OPT_HASH:
        if (kvp_hash_profile_parse(arg, &o->cfg.hash_profile) != KVP_OK)
            return cli_fail("keys", CLI_EXIT_USAGE, "unknown --hash '%s'", arg);
        return 0;
    case OPT_KEY:
        if (!parse_key(arg, &o->cfg))
            return cli_fail("keys", CLI_EXIT_USAGE, "--key needs 32..64 hex digits (16..32 bytes)");
        o->have_key = true;
        return 0;
    case OPT_SEED:
        o->seed = arg;
        return 0;
    case OPT_MODEL:
        o->ns.model = kvp_field_str(arg);
        return 0;
    case OPT_ADAPTER:
        o->ns.adapter = kvp_field_str(arg);
        return 0;
    case OPT_TENANT:
        o->ns.tenant = kvp_field_str(arg);
        return 0;
    case OPT_SALT:
        o->ns.salt = kvp_field_str(arg);
        return 0;
    case OPT_BS:
        if (!parse_u64(arg, KVP_MAX_BLOCK_SIZE, &v) || v == 0)
            return cli_fail("keys", CLI_EXIT_USAGE, "--block-size must be 1..%u", KVP_MAX_BLOCK_SIZE);
        o->cfg.block_size = (uint32_t)v;
        return 0;
    case OPT_VOCAB:
        if (!parse_u64(arg, UINT32_MAX, &v) || v == 0)
            return cli_fail("keys", CLI_EXIT_USAGE, "--vocab-size must be 1..%" PRIu32, UINT32_MAX);
        o->cfg.vocab_size = (uint32_t)v;
        return 0;
    case OPT_FILE:
        o->file = arg;
        return 0;
    default:
        o->json = true;
        return 0;
    }
}

/* Check option combinations and fill the seed fields. Returns 0 or 2. */
static int finish_opts(keys_opts *o)
{
    int p = o->cfg.hash_profile;
    bool keyed = p == KVP_HASH_KEYED || p == KVP_HASH_SIPHASH;
    if (keyed && !o->have_key)
        return cli_fail("keys", CLI_EXIT_USAGE, "--hash %s needs --key HEX (the cache's key)",
                            kvp_hash_profile_name(p));
    if (!keyed && o->have_key)
        return cli_fail("keys", CLI_EXIT_USAGE, "--key applies to keyed and siphash only");
    if (keyed && o->seed)
        return cli_fail("keys", CLI_EXIT_USAGE, "--seed applies to xxh3 and vllm-* only");
    if (p == KVP_HASH_XXH3 && o->seed) {
        uint64_t v;
        if (!parse_u64(o->seed, UINT64_MAX, &v))
            return cli_fail("keys", CLI_EXIT_USAGE, "--seed must be an unsigned 64-bit integer for xxh3");
        o->cfg.seed = v;
    }
    if (p == KVP_HASH_VLLM_SHA256 || p == KVP_HASH_VLLM_XXHASH)
        o->cfg.vllm_seed = o->seed;
    return 0;
}

static int parse_args(int argc, char **argv, keys_opts *o)
{
    static const struct option longopts[] = {
        {"hash", required_argument, NULL, OPT_HASH},
        {"key", required_argument, NULL, OPT_KEY},
        {"seed", required_argument, NULL, OPT_SEED},
        {"model", required_argument, NULL, OPT_MODEL},
        {"adapter", required_argument, NULL, OPT_ADAPTER},
        {"tenant", required_argument, NULL, OPT_TENANT},
        {"salt", required_argument, NULL, OPT_SALT},
        {"block-size", required_argument, NULL, OPT_BS},
        {"vocab-size", required_argument, NULL, OPT_VOCAB},
        {"file", required_argument, NULL, OPT_FILE},
        {"json", no_argument, NULL, OPT_JSON},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
        if (c == 'h') {
            keys_usage(stdout);
            return -1;
        }
        if (c == '?' || c == ':')
            return cli_fail("keys", CLI_EXIT_USAGE, "unknown option or missing value: '%s'",
                                argv[optind - 1]);
        int rc = apply_opt(o, c, optarg);
        if (rc)
            return rc;
    }
    if (o->file && optind < argc)
        return cli_fail("keys", CLI_EXIT_USAGE, "give tokens as arguments or with --file, not both");
    return finish_opts(o);
}

/* Add the ids in text (one line of a file, or one argument) to list. Returns 0 or 1 after
 * a message naming where (source:line). */
static int add_ids(token_list *list, const char *text, size_t line, uint32_t vocab)
{
    const char *p = text;
    for (;;) {
        while (*p && (isspace((unsigned char)*p) || *p == ',' || *p == '[' || *p == ']' ||
                      *p == '(' || *p == ')'))
            p++;
        if (!*p)
            return 0;
        const char *start = p;
        while (*p && !isspace((unsigned char)*p) && *p != ',' && *p != ']' && *p != ')')
            p++;
        char word[32];
        size_t len = (size_t)(p - start);
        uint64_t v;
        snprintf(word, sizeof word, "%.*s", (int)(len < 31 ? len : 31), start);
        if (len > 20 || !parse_u64(word, UINT32_MAX, &v)) {
            fprintf(stderr, "%s:%zu: bad token id '%s' (decimal 0..4294967295)\n", list->source,
                    line, word);
            return 1;
        }
        if (vocab && v >= vocab) {
            fprintf(stderr, "%s:%zu: token id %" PRIu64 " is not below --vocab-size %" PRIu32 "\n",
                    list->source, line, v, vocab);
            return 1;
        }
        if (!cli_grow((void **)&list->ids, &list->cap, list->n + 1, sizeof *list->ids)) {
            fprintf(stderr, "kvprefix keys: out of memory\n");
            return 1;
        }
        list->ids[list->n++] = (uint32_t)v;
    }
}

static int read_ids(token_list *list, FILE *f, uint32_t vocab)
{
    char *line = NULL;
    size_t cap = 0, n_line = 0;
    int rc = 0;
    while (rc == 0 && getline(&line, &cap, f) >= 0)
        rc = add_ids(list, line, ++n_line, vocab);
    if (rc == 0 && ferror(f)) {
        fprintf(stderr, "%s: read error\n", list->source);
        rc = 1;
    }
    free(line);
    return rc;
}

/* Gather the tokens from the arguments, --file or stdin. Returns 0 or 1. */
static int load_tokens(const keys_opts *o, int argc, char **argv, token_list *list)
{
    if (!o->file && optind < argc) {
        list->source = "argument";
        for (int i = optind; i < argc; i++)
            if (add_ids(list, argv[i], (size_t)(i - optind + 1), o->cfg.vocab_size))
                return 1;
        return 0;
    }
    if (!o->file || strcmp(o->file, "-") == 0) {
        list->source = "<stdin>";
        return read_ids(list, stdin, o->cfg.vocab_size);
    }
    FILE *f = fopen(o->file, "r");
    if (!f) {
        fprintf(stderr, "%s: %s\n", o->file, strerror(errno));
        return 1;
    }
    list->source = o->file;
    int rc = read_ids(list, f, o->cfg.vocab_size);
    fclose(f);
    return rc;
}

static void print_digest(const kvp_hasher *h, const kvp_chain *c)
{
    uint8_t d[32];
    size_t n = kvp_chain_digest(h, c, d);
    for (size_t i = 0; i < n; i++)
        printf("%02x", d[i]);
}

static void print_keys(const keys_opts *o, const kvp_hasher *h, const kvp_chain *root,
                       const kvp_chain *blocks, size_t n_blocks, size_t n_tokens)
{
    const char *name = kvp_hash_profile_name(o->cfg.hash_profile);
    size_t tail = n_tokens - n_blocks * o->cfg.block_size;
    if (o->json) {
        printf("{\"profile\":\"%s\",\"block_size\":%" PRIu32 ",\"n_tokens\":%zu,"
               "\"n_tail_tokens\":%zu,\"root\":{\"digest\":\"",
               name, o->cfg.block_size, n_tokens, tail);
        print_digest(h, root);
        printf("\",\"event\":%" PRIu64 "},\"blocks\":[", root->key.lo);
        for (size_t i = 0; i < n_blocks; i++) {
            printf("%s{\"index\":%zu,\"digest\":\"", i ? "," : "", i);
            print_digest(h, &blocks[i]);
            printf("\",\"event\":%" PRIu64 "}", blocks[i].key.lo);
        }
        printf("]}\n");
        return;
    }
    printf("# profile %s, block size %" PRIu32 ", %zu tokens: %zu full blocks, %zu tail tokens "
           "not hashed\n# block  digest  event\n",
           name, o->cfg.block_size, n_tokens, n_blocks, tail);
    printf("root ");
    print_digest(h, root);
    printf(" %" PRIu64 "\n", root->key.lo);
    for (size_t i = 0; i < n_blocks; i++) {
        printf("%zu ", i);
        print_digest(h, &blocks[i]);
        printf(" %" PRIu64 "\n", blocks[i].key.lo);
    }
}

/* Hash and print. Returns 0 or 1 (the library refused the namespace or the tokens). */
static int run_keys(const keys_opts *o, const token_list *list)
{
    kvp_hasher *h;
    int rc = kvp_hasher_new(&o->cfg, &h);
    if (rc != KVP_OK)
        return cli_fail("keys", CLI_EXIT_INPUT, "%s", kvp_strerror(rc));
    kvp_chain root, chain;
    size_t n_blocks = list->n / o->cfg.block_size, n_out = 0;
    kvp_chain *blocks = calloc(n_blocks ? n_blocks : 1, sizeof *blocks);
    if (!blocks) {
        kvp_hasher_free(h);
        return cli_fail("keys", CLI_EXIT_INPUT, "out of memory");
    }
    rc = kvp_hasher_root(h, &o->ns, &root);
    chain = root;
    if (rc == KVP_OK)
        rc = kvp_hasher_blocks(h, &o->ns, &chain, list->ids, list->n, blocks, n_blocks, &n_out);
    if (rc == KVP_OK)
        print_keys(o, h, &root, blocks, n_out, list->n);
    free(blocks);
    kvp_hasher_free(h);
    if (rc == KVP_ENOTSUP)
        return cli_fail("keys", CLI_EXIT_INPUT,
                            "%s cannot express this namespace: vLLM keys have no model or "
                            "tenant field, an empty salt and non-UTF-8 names are refused",
                            kvp_hash_profile_name(o->cfg.hash_profile));
    if (rc != KVP_OK)
        return cli_fail("keys", CLI_EXIT_INPUT, "%s", kvp_strerror(rc));
    return fflush(stdout) == 0 ? 0 : cli_fail("keys", CLI_EXIT_INPUT, "write error");
}

int keys_main(int argc, char **argv)
{
    keys_opts o;
    memset(&o, 0, sizeof o);
    kvp_config_init(&o.cfg);
    kvp_namespace_init(&o.ns);
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    token_list list = {NULL, 0, 0, NULL};
    rc = load_tokens(&o, argc, argv, &list);
    if (rc == 0)
        rc = run_keys(&o, &list);
    free(list.ids);
    return rc;
}
