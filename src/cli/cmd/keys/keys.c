/*
 * keys.c - `kvprefix keys`: print the block keys of a token list under a hash profile, seed
 * or key, namespace and block size, as hex digests and as event integers (vLLM's KV-event
 * form: the digest's last 8 bytes read big-endian). The tool for "the router's keys and
 * the engine's keys disagree": run it with each side's settings and compare.
 *
 *   kvprefix keys --hash vllm-sha256-cbor --vllm-seed 0 --adapter my-lora 1,2,3,...
 *
 * Tokens come from the arguments, --file PATH, or stdin when there are neither; ids are
 * decimal, separated by commas, whitespace or brackets (a pasted Python list works). Output:
 * one line for the chain start ("root": the namespace root, or vLLM's NONE_HASH) and one per
 * full block (index, digest, event integer); a partial tail is reported, not hashed. --json
 * prints the same as one JSON object. The hash flags are the tool's (common/hashopt.c), plus
 * --key for --hash-key and --seed for the xxh3 seed or vLLM's seed string; unlike replay, a
 * keyed profile needs its key here (a random one would match no cache). Exit status
 * (common/cli.h): 0 done, 1 bad input (a message naming FILE:LINE or the argument, a
 * namespace the profile cannot express, an unreadable file, standard output not
 * writable), 2 usage. Memory: the token list (4 bytes per id) and one 88-byte chain state
 * per block.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "escape.h"
#include "flags.h"
#include "hashopt.h"
#include "keys.h"
#include "kvprefix.h"
#include "outfile.h"

/* The parsed command line. */
typedef struct keys_opts {
    kvp_config cfg;     /* hash fields: profile, seed, key, vllm seed, block size, vocab */
    cli_hash_opts hash; /* --hash, --hash-key/--key, --vllm-seed, --vocab-size as given */
    kvp_namespace ns;   /* model/adapter/tenant/salt as given */
    const char *file;   /* --file: path, "-" for stdin, or NULL */
    const char *seed;   /* --seed as given (integer for xxh3, string for vllm-*), or NULL */
    bool json;          /* --json */
} keys_opts;

/* A growing token list and where the tokens came from, for messages. */
typedef struct keys_tokens {
    uint32_t *ids;      /* the ids */
    size_t n;           /* ids stored */
    size_t cap;         /* capacity of ids, in ids */
    const char *source; /* file name, "<stdin>" or "argument" */
} keys_tokens;

static const char keys_usage_text[] =
    "Usage: kvprefix keys [options] [TOKEN...]\n"
    "\n"
    "Print the block keys of a token list: per full block its index, hex digest and\n"
    "event integer (the digest's last 8 bytes, big-endian, as in vLLM's KV events).\n"
    "Tokens: decimal ids separated by commas, spaces or brackets, from the arguments,\n"
    "--file, or stdin.\n"
    "\n"
    "Options:\n"
    "  --hash PROFILE       keyed (default), xxh3, siphash, vllm-sha256-cbor,\n"
    "                       vllm-xxhash-cbor (docs/hash-profiles.md)\n"
    "  --hash-key HEX, --key HEX\n"
    "                       keyed, siphash: the cache's key, 32..64 hex digits (required:\n"
    "                       a random key would match no cache)\n"
    "  --seed S             xxh3: the 64-bit seed (default 0); vllm-*: the NONE_HASH seed\n"
    "                       string, as --vllm-seed (default vllm-none-hash; PYTHONHASHSEED\n"
    "                       if the engine sets it)\n"
    "  --vllm-seed STR      vllm-*: the NONE_HASH seed string\n"
    "  --model S, --adapter S, --tenant S, --salt S\n"
    "                       the namespace (vllm-*: adapter = LoRA name, salt =\n"
    "                       cache_salt; model and tenant cannot be expressed)\n"
    "  --block-size N       tokens per block (default 16)\n"
    "  --vocab-size N       refuse ids >= N (default: unchecked)\n"
    "  --file PATH          read tokens from PATH ('-' for stdin)\n"
    "  --json               one JSON object instead of lines\n"
    "  -h, --help           this message\n"
    "\n"
    "Example:\n"
    "  kvprefix keys --hash vllm-sha256-cbor --adapter my-lora --salt user-7 1,2,3,...\n"
    "\n" CLI_EXIT_HELP;

/* Print "kvprefix keys: message" to stderr and return code (the exit status). */
#define fail(...) cli_fail("keys", __VA_ARGS__)

enum {
    KEYS_OPT_SEED = 256,
    KEYS_OPT_MODEL,
    KEYS_OPT_ADAPTER,
    KEYS_OPT_TENANT,
    KEYS_OPT_SALT,
    KEYS_OPT_BS,
    KEYS_OPT_FILE,
    KEYS_OPT_JSON
};

static const struct option keys_longopts[] = {
    CLI_HASH_LONGOPTS,
    {"key", required_argument, NULL, CLI_OPT_HASH_KEY},
    {"seed", required_argument, NULL, KEYS_OPT_SEED},
    {"model", required_argument, NULL, KEYS_OPT_MODEL},
    {"adapter", required_argument, NULL, KEYS_OPT_ADAPTER},
    {"tenant", required_argument, NULL, KEYS_OPT_TENANT},
    {"salt", required_argument, NULL, KEYS_OPT_SALT},
    {"block-size", required_argument, NULL, KEYS_OPT_BS},
    {"file", required_argument, NULL, KEYS_OPT_FILE},
    {"json", no_argument, NULL, KEYS_OPT_JSON},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* Apply one option. Returns 0, -1 after --help, or CLI_EXIT_USAGE after a message. */
static int keys_apply_opt(keys_opts *o, int c, const char *arg)
{
    uint64_t v = 0;
    int rc;
    if (cli_hash_is_opt(c))
        return cli_hash_apply("keys", &o->hash, c, arg);
    switch (c) {
    case 'h':
        fputs(keys_usage_text, stdout);
        return -1;
    case KEYS_OPT_SEED:
        o->seed = arg;
        return 0;
    case KEYS_OPT_MODEL:
        o->ns.model = kvp_field_str(arg);
        return 0;
    case KEYS_OPT_ADAPTER:
        o->ns.adapter = kvp_field_str(arg);
        return 0;
    case KEYS_OPT_TENANT:
        o->ns.tenant = kvp_field_str(arg);
        return 0;
    case KEYS_OPT_SALT:
        o->ns.salt = kvp_field_str(arg);
        return 0;
    case KEYS_OPT_BS:
        if ((rc = cli_flag_uint("keys", "--block-size", arg, 1, KVP_MAX_BLOCK_SIZE, &v)) == 0)
            o->cfg.block_size = (uint32_t)v;
        return rc;
    case KEYS_OPT_FILE:
        o->file = arg;
        return 0;
    default:
        o->json = true;
        return 0;
    }
}

/* Check option combinations and fill the hash fields of o->cfg. --seed is the xxh3 seed or
 * the vLLM seed string, by profile. Returns 0 or CLI_EXIT_USAGE. */
static int keys_finish_opts(keys_opts *o)
{
    cli_hash_opts *h = &o->hash;
    int p = h->profile;
    bool keyed = p == KVP_HASH_KEYED || p == KVP_HASH_SIPHASH;
    if (keyed && h->key_len == 0)
        return fail(CLI_EXIT_USAGE, "--hash %s needs --hash-key HEX (the cache's key)",
                    kvp_hash_profile_name(p));
    if (o->seed && keyed)
        return fail(CLI_EXIT_USAGE, "--seed applies to xxh3 and vllm-* only");
    if (o->seed && p == KVP_HASH_XXH3) {
        int rc = cli_flag_uint("keys", "--seed", o->seed, 0, UINT64_MAX, &h->seed);
        if (rc)
            return rc;
        h->seed_given = true;
    } else if (o->seed) {
        if (h->vllm_seed)
            return fail(CLI_EXIT_USAGE, "--seed and --vllm-seed both give the vLLM seed");
        h->vllm_seed = o->seed;
    }
    return cli_hash_finish("keys", h, &o->cfg);
}

/* Parse argv. Returns 0, -1 after --help, or CLI_EXIT_USAGE (message printed). */
static int keys_parse_args(int argc, char **argv, keys_opts *o)
{
    int c;
    cli_getopt_begin();
    /* '+': options stop at the first token, so a negative id is reported as a bad token. */
    while ((c = getopt_long(argc, argv, "+:h", keys_longopts, NULL)) != -1) {
        if (c == '?' || c == ':')
            return cli_getopt_error("keys", c, argv, keys_longopts);
        int rc = keys_apply_opt(o, c, optarg);
        if (rc)
            return rc;
    }
    if (o->file && optind < argc)
        return fail(CLI_EXIT_USAGE, "give tokens as arguments or with --file, not both");
    return keys_finish_opts(o);
}

/* Report a bad line of the token input: "SOURCE:LINE: message" with control characters
 * escaped (the message quotes the input). Returns CLI_EXIT_INPUT. */
static int keys_line_error(const keys_tokens *list, size_t line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int keys_line_error(const keys_tokens *list, size_t line, const char *fmt, ...)
{
    char msg[512], safe[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cli_escape_str(safe, sizeof safe, msg);
    char src[256];
    cli_escape_str(src, sizeof src, list->source);
    fprintf(stderr, "%s:%zu: %s\n", src, line, safe);
    return CLI_EXIT_INPUT;
}

static bool keys_is_sep(int c)
{
    return isspace(c) || c == ',' || c == '[' || c == ']' || c == '(' || c == ')';
}

/* Add the ids in text (one line of a file, or one argument) to list. Returns 0, or
 * CLI_EXIT_INPUT after a message naming where (source:line). */
static int keys_add_ids(keys_tokens *list, const char *text, size_t line, uint32_t vocab)
{
    const char *p = text;
    for (;;) {
        while (*p && keys_is_sep((unsigned char)*p))
            p++;
        if (!*p)
            return 0;
        const char *start = p;
        while (*p && !keys_is_sep((unsigned char)*p))
            p++;
        char word[32];
        size_t len = (size_t)(p - start);
        uint64_t v = 0;
        snprintf(word, sizeof word, "%.*s", (int)(len < 31 ? len : 31), start);
        if (len > 20 || cli_parse_uint(word, UINT32_MAX, &v) != CLI_OK)
            return keys_line_error(list, line, "bad token id '%s' (decimal 0..4294967295)", word);
        if (vocab && v >= vocab)
            return keys_line_error(
                list, line, "token id %" PRIu64 " is not below --vocab-size %" PRIu32, v, vocab);
        if (!cli_grow((void **)&list->ids, &list->cap, list->n + 1, sizeof *list->ids))
            return fail(CLI_EXIT_INPUT, "out of memory");
        list->ids[list->n++] = (uint32_t)v;
    }
}

/* Read every line of f into list. Returns 0 or CLI_EXIT_INPUT (message printed). */
static int keys_read_ids(keys_tokens *list, FILE *f, uint32_t vocab)
{
    char *line = NULL;
    size_t cap = 0, n_line = 0;
    int rc = 0;
    while (rc == 0 && getline(&line, &cap, f) >= 0)
        rc = keys_add_ids(list, line, ++n_line, vocab);
    if (rc == 0 && ferror(f))
        rc = fail(CLI_EXIT_INPUT, "%s: cannot read: %s", list->source, strerror(errno));
    free(line);
    return rc;
}

/* Gather the tokens from the arguments, --file or stdin. Returns 0 or CLI_EXIT_INPUT. */
static int keys_load_tokens(const keys_opts *o, int argc, char **argv, keys_tokens *list)
{
    if (!o->file && optind < argc) {
        list->source = "argument";
        for (int i = optind; i < argc; i++) {
            int rc = keys_add_ids(list, argv[i], (size_t)(i - optind + 1), o->cfg.vocab_size);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (!o->file || strcmp(o->file, "-") == 0) {
        list->source = cli_input_name(NULL);
        return keys_read_ids(list, stdin, o->cfg.vocab_size);
    }
    FILE *f = fopen(o->file, "r");
    if (!f)
        return fail(CLI_EXIT_INPUT, "%s: cannot open: %s", o->file, strerror(errno));
    list->source = o->file;
    int rc = keys_read_ids(list, f, o->cfg.vocab_size);
    fclose(f);
    return rc;
}

static void keys_print_digest(const kvp_hasher *h, const kvp_chain *c)
{
    uint8_t d[32];
    size_t n = kvp_chain_digest(h, c, d);
    for (size_t i = 0; i < n; i++)
        printf("%02x", d[i]);
}

/* Print the chain start and the blocks, as lines or as one JSON object. Write errors are
 * found by the caller's cli_stdout_check. */
static void keys_print(const keys_opts *o, const kvp_hasher *h, const kvp_chain *root,
                       const kvp_chain *blocks, size_t n_blocks, size_t n_tokens)
{
    const char *name = kvp_hash_profile_name(o->cfg.hash_profile);
    size_t tail = n_tokens - n_blocks * o->cfg.block_size;
    if (o->json) {
        printf("{\"profile\":\"%s\",\"block_size\":%" PRIu32 ",\"n_tokens\":%zu,"
               "\"n_tail_tokens\":%zu,\"root\":{\"digest\":\"",
               name, o->cfg.block_size, n_tokens, tail);
        keys_print_digest(h, root);
        printf("\",\"event\":%" PRIu64 "},\"blocks\":[", root->key.lo);
        for (size_t i = 0; i < n_blocks; i++) {
            printf("%s{\"index\":%zu,\"digest\":\"", i ? "," : "", i);
            keys_print_digest(h, &blocks[i]);
            printf("\",\"event\":%" PRIu64 "}", blocks[i].key.lo);
        }
        printf("]}\n");
        return;
    }
    printf("# profile %s, block size %" PRIu32 ", %zu tokens: %zu full blocks, %zu tail tokens "
           "not hashed\n# block  digest  event\n",
           name, o->cfg.block_size, n_tokens, n_blocks, tail);
    printf("root ");
    keys_print_digest(h, root);
    printf(" %" PRIu64 "\n", root->key.lo);
    for (size_t i = 0; i < n_blocks; i++) {
        printf("%zu ", i);
        keys_print_digest(h, &blocks[i]);
        printf(" %" PRIu64 "\n", blocks[i].key.lo);
    }
}

/* Hash and print. Returns 0, or CLI_EXIT_INPUT (the library refused the namespace or the
 * tokens, out of memory, standard output not writable). */
static int keys_run(const keys_opts *o, const keys_tokens *list)
{
    kvp_hasher *h;
    int rc = kvp_hasher_new(&o->cfg, &h);
    if (rc != KVP_OK)
        return fail(CLI_EXIT_INPUT, "%s", kvp_strerror(rc));
    kvp_chain root, chain;
    size_t n_blocks = list->n / o->cfg.block_size, n_out = 0;
    kvp_chain *blocks = calloc(n_blocks ? n_blocks : 1, sizeof *blocks);
    if (!blocks) {
        kvp_hasher_free(h);
        return fail(CLI_EXIT_INPUT, "out of memory");
    }
    rc = kvp_hasher_root(h, &o->ns, &root);
    chain = root;
    if (rc == KVP_OK)
        rc = kvp_hasher_blocks(h, &o->ns, &chain, list->ids, list->n, blocks, n_blocks, &n_out);
    if (rc == KVP_OK)
        keys_print(o, h, &root, blocks, n_out, list->n);
    free(blocks);
    kvp_hasher_free(h);
    if (rc != KVP_OK) {
        char why[512];
        return fail(CLI_EXIT_INPUT, "%s",
                    cli_hash_refusal(rc, o->cfg.hash_profile, o->cfg.vocab_size, &o->ns, list->ids,
                                     list->n, why, sizeof why));
    }
    return cli_stdout_check("keys");
}

int keys_main(int argc, char **argv)
{
    keys_opts o;
    memset(&o, 0, sizeof o);
    kvp_config_init(&o.cfg);
    kvp_namespace_init(&o.ns);
    cli_hash_init(&o.hash);
    int rc = keys_parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? cli_stdout_check("keys") : rc;
    keys_tokens list = {NULL, 0, 0, NULL};
    rc = keys_load_tokens(&o, argc, argv, &list);
    if (rc == 0)
        rc = keys_run(&o, &list);
    free(list.ids);
    return rc;
}
