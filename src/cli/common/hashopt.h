/*
 * hashopt.h - the hash-profile flags every subcommand that hashes shares (replay, plan,
 * demo, keys): --hash PROFILE, --hash-key HEX, --vllm-seed STR, --vocab-size N, and replay's
 * and keys' xxh3 --seed N. One parser, so the same mistake reads the same everywhere
 * (flags.h's message shape, exit 2), and one place that turns them into the hash fields of
 * a kvp_config.
 *
 * Use: cli_hash_init, then cli_hash_apply for each of these options getopt_long returns
 * (the subcommand lists CLI_HASH_LONGOPTS in its option table), then cli_hash_finish once
 * every option is known, which checks the combinations and fills the kvp_config.
 */
#ifndef CLI_HASHOPT_H
#define CLI_HASHOPT_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvprefix.h"

/* getopt_long values of the hash flags; subcommands number their own options below. */
enum {
    CLI_OPT_HASH = 0x1000, /* --hash PROFILE */
    CLI_OPT_HASH_KEY,      /* --hash-key HEX */
    CLI_OPT_VLLM_SEED,     /* --vllm-seed STR */
    CLI_OPT_VOCAB_SIZE     /* --vocab-size N */
};

/* The option-table rows of the four flags (a subcommand's longopts lists them). */
/* clang-format off */
#define CLI_HASH_LONGOPTS                                                                          \
    {"hash", required_argument, NULL, CLI_OPT_HASH},                                               \
    {"hash-key", required_argument, NULL, CLI_OPT_HASH_KEY},                                       \
    {"vllm-seed", required_argument, NULL, CLI_OPT_VLLM_SEED},                                     \
    {"vocab-size", required_argument, NULL, CLI_OPT_VOCAB_SIZE}
/* clang-format on */

/* The lines of --help that describe them (two-space indent, 21-column flag field);
 * CLI_HASH_HELP_TAIL alone for a subcommand that words --hash and --hash-key itself. */
#define CLI_HASH_HELP_TAIL                                                                         \
    "  --vllm-seed STR      vllm-*: vLLM's NONE_HASH seed string (default vllm-none-hash)\n"       \
    "  --vocab-size N       token ids at or above N are bad input (default: unchecked)\n"
#define CLI_HASH_HELP                                                                              \
    "  --hash PROFILE       block keys: keyed (default), xxh3, siphash, vllm-sha256-cbor,\n"       \
    "                       vllm-xxhash-cbor (docs/hash-profiles.md)\n"                            \
    "  --hash-key HEX       keyed, siphash: the secret key, 32..64 hex digits (default: a\n"       \
    "                       random key, which is fine within one process)\n" CLI_HASH_HELP_TAIL

/* The hash flags as given. */
typedef struct cli_hash_opts {
    int profile;                   /* KVP_HASH_* (default KVP_HASH_KEYED) */
    bool profile_given;            /* --hash was given */
    uint8_t key[KVP_HASH_KEY_MAX]; /* --hash-key bytes */
    uint32_t key_len;              /* bytes in key; 0 when --hash-key was not given */
    const char *vllm_seed;         /* --vllm-seed, or NULL */
    uint32_t vocab_size;           /* --vocab-size, 0 when not given */
    uint64_t seed;                 /* --seed (xxh3), valid when seed_given */
    bool seed_given;               /* --seed was given (by a subcommand that has it) */
} cli_hash_opts;

/* Defaults: keyed, no key (random), no vLLM seed, no vocabulary check. Cannot fail. */
void cli_hash_init(cli_hash_opts *h);

/* Apply one of the CLI_OPT_* options with value v (flag as the user spells it comes from
 * the option's name). Returns 0, or CLI_EXIT_USAGE after the flags.h message: an unknown
 * profile, a key that is not 32..64 hex digits, a vocabulary size outside 1..2^32-1.
 * Returns 0 for any other option value (not one of these). */
int cli_hash_apply(const char *cmd, cli_hash_opts *h, int c, const char *v);

/* True when c is one of the CLI_OPT_* values above. Cannot fail. */
bool cli_hash_is_opt(int c);

/* True when any of the flags was given (a subcommand may need another flag for them to
 * mean something). Cannot fail. */
bool cli_hash_any(const cli_hash_opts *h);

/* Check the combinations and write the hash fields (hash_profile, hash_key, hash_key_len,
 * seed, vllm_seed, vocab_size) of *cfg; the others are untouched. --hash-key applies to
 * keyed and siphash only, --vllm-seed to the vllm-* profiles, --seed to xxh3 only.
 * Returns 0, or CLI_EXIT_USAGE with a message naming the flags. */
int cli_hash_finish(const char *cmd, const cli_hash_opts *h, kvp_config *cfg);

/* Parse a key of 32..64 hex digits (16..32 bytes) into key[] and *len. Returns true, or
 * false (nothing written) when it is not one. */
bool cli_parse_hex_key(const char *s, uint8_t key[KVP_HASH_KEY_MAX], uint32_t *len);

/* A library code for a request the profile could not hash, as a sentence for "FILE:LINE:"
 * messages: KVP_ENOTSUP (vllm-*: names which field of ns cannot be expressed - a model, a
 * tenant, an empty salt, a name that is not UTF-8), KVP_ETOKEN (names the first id of
 * tokens at or above vocab_size), else kvp_strerror. Writes into buf[0 .. size) and returns
 * buf. Cannot fail. */
char *cli_hash_refusal(int rc, int profile, uint32_t vocab_size, const kvp_namespace *ns,
                       const uint32_t *tokens, size_t n_tokens, char *buf, size_t size);

#endif /* CLI_HASHOPT_H */
