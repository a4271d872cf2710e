/*
 * demo.c - `kvprefix demo`: a scripted serving session through the engine API.
 *
 * It plays an engine that serves a handful of chat requests from two tenants with a small
 * KV pool (block size 4 tokens, so short prompts span several blocks): acquire -> commit
 * the prompt after "prefill" -> grow and commit the generated answer during "decode" ->
 * release. For each request it prints how many prompt tokens were reused (prefill skipped)
 * and where reuse stopped, to show the rules the cache follows:
 *  - a shared system prompt is reused across requests of the same tenant;
 *  - the same text under another tenant reuses nothing (namespace isolation);
 *  - a timestamp placed before the system prompt ends sharing at its first token;
 *  - a later chat turn reuses the earlier turn, generated answer included;
 *  - a fully cached prompt still computes its last block (at least one token is computed);
 *  - when the pool fills, the least recently used blocks are evicted and a prefix that was
 *    reused before has to be computed again.
 * Text is split on spaces and each word hashed to a token id: a stand-in tokenizer, enough
 * to show prefix behaviour; real engines use the model's tokenizer.
 *
 * The hash flags (common/hashopt.c) pick the cache's hash profile; the session reuses the
 * same blocks under every profile. vLLM's keys have no model or tenant field, so under the
 * vllm-* profiles each tenant becomes a cache_salt (vLLM's per-user isolation) and the model
 * stays implicit, as in one vLLM engine.
 *
 * Exit status (common/cli.h): 0 done, 1 out of memory, standard output not writable or a
 * --vocab-size below the script's ids, 2 usage, 3 the library refused a step of the script
 * or its invariant check failed.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "demo.h"
#include "flags.h"
#include "hashopt.h"
#include "outfile.h"

#include "kvprefix.h"

#define DEMO_BLOCK    4
#define DEMO_POOL     48
#define MAX_TOKENS    256
#define DEMO_DOC_BASE 50000u                 /* words hash to ids below it; a document's above */
#define DEMO_MAX_ID   (DEMO_DOC_BASE + 149u) /* the largest id the script uses */

static const char *SYSTEM = "You are a helpful assistant for Acme Corp . Answer briefly and cite "
                            "the product manual when you can .";

typedef struct step {
    const char *tenant;   /* namespace tenant */
    const char *prefix;   /* text before the system prompt, or NULL */
    const char *question; /* the user's text after the system prompt */
    const char *answer;   /* what the "model" generates */
    const char *note;     /* what the step shows */
    unsigned n_document;  /* words of a generated document after the question, or 0 */
} step;

static const step STEPS[] = {
    {"acme", NULL, "How do I reset my home router ?", "Hold the reset button for ten seconds .",
     "cold start: nothing cached yet", 0},
    {"acme", NULL, "What is the warranty period ?", "Two years from purchase .",
     "same tenant, same system prompt: reused", 0},
    {"globex", NULL, "What is the warranty period ?", "Two years from purchase .",
     "same text, other tenant: isolated, nothing reused", 0},
    {"acme", "[2026-11-29 10:00:01]", "Is there a night mode ?", "Yes , in settings .",
     "timestamp before the system prompt: sharing ends at token 0", 0},
    {"acme", "[2026-11-29 10:00:02]", "Is there a night mode ?", "Yes , in settings .",
     "again with the next second: still nothing reused", 0},
    {"acme", NULL,
     "How do I reset my home router ? Hold the reset button for ten seconds . "
     "And then ?",
     "Wait for the green light .", "next chat turn: reuses turn 1 and its answer", 0},
    {"acme", NULL, "How do I reset my home router ?", "Hold the reset button for ten seconds .",
     "exact repeat of request 1: fully cached, yet its last block is computed", 0},
    {"globex", NULL, "Summarize this contract :", "It is a lease .",
     "a long document fills the pool: least recently used blocks are evicted", 150},
    {"acme", NULL, "What is the warranty period ?", "Two years from purchase .",
     "request 2 again: part of what it reused before was evicted", 0},
};

/* Split text on spaces into token ids (FNV-1a of each word); returns the count. */
static size_t tokenize(const char *text, uint32_t *out, size_t cap, size_t n)
{
    const char *p = text;
    while (p && *p && n < cap) {
        while (*p == ' ')
            p++;
        if (!*p)
            break;
        uint32_t h = 2166136261u;
        while (*p && *p != ' ')
            h = (h ^ (unsigned char)*p++) * 16777619u;
        out[n++] = h % DEMO_DOC_BASE;
    }
    return n;
}

/* Print the words of the prompt with a bar where reuse stopped. */
static void show_boundary(const char *const parts[3], size_t n_reused)
{
    size_t word = 0;
    int bar_done = n_reused == 0;
    printf("      ");
    if (bar_done)
        printf("| ");
    for (int i = 0; i < 3; i++) {
        const char *p = parts[i];
        while (p && *p) {
            while (*p == ' ')
                p++;
            if (!*p)
                break;
            const char *start = p;
            while (*p && *p != ' ')
                p++;
            printf("%.*s ", (int)(p - start), start);
            if (++word == n_reused && !bar_done) {
                printf("| ");
                bar_done = 1;
            }
        }
    }
    printf("\n");
}

/* Report a library error in a step of the script: out of memory is a failed resource (1),
 * an id at or above --vocab-size bad input (1), anything else means the script or the
 * library is wrong (3). Returns the exit status. */
static int fail(const char *what, int rc)
{
    if (rc == KVP_ETOKEN)
        return cli_fail("demo", CLI_EXIT_INPUT,
                        "%s: the script's token ids reach %u: --vocab-size must be above that",
                        what, DEMO_MAX_ID);
    return cli_fail("demo", rc == KVP_ENOMEM ? CLI_EXIT_INPUT : CLI_EXIT_INTERNAL, "%s: %s", what,
                    kvp_strerror(rc));
}

static const char usage_text[] =
    "Usage: kvprefix demo [options]\n"
    "\n"
    "Run a scripted serving session (two tenants, a pool of %d blocks of %d tokens) through\n"
    "the engine API and show, per request, what the prefix cache reused and why.\n"
    "\n"
    "Options (the cache's hash profile; the session reuses the same blocks under "
    "each):\n" CLI_HASH_HELP
    "  Under vllm-* each tenant is a cache_salt and the model is implicit (vLLM keys have\n"
    "  no model or tenant field). The script's ids reach %u.\n"
    "  -h, --help           this text\n"
    "\n" CLI_EXIT_HELP;

/* Parse argv into the cache's hash fields (*cfg). Returns -1 to run, or the exit status. */
static int parse_args(int argc, char **argv, kvp_config *cfg)
{
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'}, CLI_HASH_LONGOPTS, {NULL, 0, NULL, 0}};
    cli_hash_opts hash;
    cli_hash_init(&hash);
    int c;
    cli_getopt_begin();
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        if (c == 'h') {
            printf(usage_text, DEMO_POOL, DEMO_BLOCK, DEMO_MAX_ID);
            return cli_stdout_check("demo");
        }
        if (!cli_hash_is_opt(c))
            return cli_getopt_error("demo", c, argv, longopts);
        int rc = cli_hash_apply("demo", &hash, c, optarg);
        if (rc)
            return rc;
    }
    if (optind < argc)
        return cli_fail("demo", CLI_EXIT_USAGE, "unexpected argument '%s'", argv[optind]);
    return cli_hash_finish("demo", &hash, cfg) ? CLI_EXIT_USAGE : -1;
}

/* The namespace of a step: model and tenant, or under vllm-* the tenant as cache_salt. */
static kvp_namespace step_ns(const kvp_config *cfg, const step *st)
{
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    if (cfg->hash_profile == KVP_HASH_VLLM_SHA256 || cfg->hash_profile == KVP_HASH_VLLM_XXHASH) {
        ns.salt = kvp_field_str(st->tenant);
    } else {
        ns.model = kvp_field_str("demo-model");
        ns.tenant = kvp_field_str(st->tenant);
    }
    return ns;
}

int demo_main(int argc, char **argv)
{
    kvp_config cfg;
    kvp_config_init(&cfg);
    int status = parse_args(argc, argv, &cfg);
    if (status >= 0)
        return status;
    cfg.n_blocks = DEMO_POOL;
    cfg.block_size = DEMO_BLOCK;
    kvp_cache *cache;
    int rc = kvp_cache_new(&cfg, &cache);
    if (rc != KVP_OK)
        return fail("creating the cache", rc);

    printf("kvprefix %s demo: block size %d tokens, pool of %d blocks, words as tokens, "
           "--hash %s\n\n",
           kvp_version(), DEMO_BLOCK, DEMO_POOL, kvp_hash_profile_name(cfg.hash_profile));
    printf("  #  tenant  prompt  reused  computed  what it shows\n");
    for (size_t s = 0; s < sizeof STEPS / sizeof STEPS[0]; s++) {
        const step *st = &STEPS[s];
        uint32_t tokens[MAX_TOKENS];
        size_t n = tokenize(st->prefix, tokens, MAX_TOKENS, 0);
        n = tokenize(SYSTEM, tokens, MAX_TOKENS, n);
        n = tokenize(st->question, tokens, MAX_TOKENS, n);
        for (unsigned w = 0; w < st->n_document && n < MAX_TOKENS; w++)
            tokens[n++] = DEMO_DOC_BASE + w; /* the document's words: ids no sentence uses */
        size_t n_prompt = n;
        n = tokenize(st->answer, tokens, MAX_TOKENS, n);

        kvp_namespace ns = step_ns(&cfg, st);
        kvp_match m;
        uint64_t id = s + 1;
        /* The engine's calls: acquire, prefill, commit, decode (grow, commit), release. */
        if ((rc = kvp_acquire(cache, id, &ns, tokens, n_prompt, n_prompt + 1, &m)))
            return fail("acquire", rc);
        if ((rc = kvp_commit(cache, id, tokens, n_prompt, NULL)))
            return fail("commit", rc);
        if ((rc = kvp_grow(cache, id, n)) || (rc = kvp_commit(cache, id, tokens, n, NULL)))
            return fail("decode", rc);
        if ((rc = kvp_release(cache, id)))
            return fail("release", rc);

        printf("%3zu  %-6s  %6zu  %6llu  %8llu  %s\n", s + 1, st->tenant, n_prompt,
               (unsigned long long)m.n_tokens_hit, (unsigned long long)(n_prompt - m.n_tokens_hit),
               st->note);
        const char *parts[3] = {st->prefix, SYSTEM, st->question};
        show_boundary(parts, (size_t)m.n_tokens_hit);
        if (st->n_document)
            printf("      ... followed by a %u-word document\n", st->n_document);
    }

    kvp_stats stats;
    if ((rc = kvp_cache_stats(cache, &stats)) != KVP_OK)
        return fail("statistics", rc);
    printf("\nrequests %llu, prompt tokens %llu, reused %llu (%.1f%% of prefill skipped)\n",
           (unsigned long long)stats.n_requests, (unsigned long long)stats.n_tokens_queried,
           (unsigned long long)stats.n_tokens_hit,
           stats.n_tokens_queried
               ? 100.0 * (double)stats.n_tokens_hit / (double)stats.n_tokens_queried
               : 0.0);
    printf("blocks stored %llu, deduplicated %llu, evicted %llu; now cached %u, free %u\n",
           (unsigned long long)stats.n_blocks_stored, (unsigned long long)stats.n_blocks_deduped,
           (unsigned long long)stats.n_evictions, stats.n_blocks_cached, stats.n_blocks_free);
    printf("(the bar | marks where reuse stopped: only whole %d-token blocks are reused)\n",
           DEMO_BLOCK);
    rc = kvp_cache_check(cache);
    kvp_cache_free(cache);
    if (rc != KVP_OK)
        return fail("invariant check", rc);
    return cli_stdout_check("demo");
}
