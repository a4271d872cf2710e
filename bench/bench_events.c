/*
 * bench_events.c - the vLLM KV-event codec and publisher: how many batches and events per
 * second kvp_kv_encode and kvp_kv_decode handle, and what a publisher adds to a cache.
 *
 *   (a) codec  BlockStored events of 16-token blocks (hashes uniform 64-bit, so 0xcf; tokens
 *              uniform below 2^17, so 0xce), in two shapes: "per block", 64 events of one
 *              block each per batch (vLLM's worst case: many small commits in one step), and
 *              "per commit", one event of 32 blocks per batch (a 512-token prefill). For each
 *              shape and event form (array, map): encode into a reused buffer, and decode
 *              (kvp_kv_decode + kvp_kv_batch_free) of the same payload. Reported: batches/s,
 *              events/s, blocks/s, payload bytes per block.
 *   (b) publisher  kvp_access of distinct 16-block prompts (257 tokens) on a cache of 1M
 *              blocks with the xxh3 profile, with no event callback and with a publisher
 *              attached (inproc PUB, no subscriber, one flush per access): the cost per
 *              block stored and the ratio, measured in the same run with interleaved reps.
 *
 * Every figure is the median of --reps runs (default 5) after a warm-up; each run does a
 * fixed amount of work (--scale multiplies it). Options: --reps N, --scale F, --quick.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

#include "benchutil.h"
#include "kvprefix_events.h"

#define BS 16u

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_events: %s: %s\n", what, kvp_strerror(rc));
    exit(3);
}

/* A batch of n_events BlockStored events of blocks_per_event blocks each. */
typedef struct shape {
    const char *name;
    size_t n_events;
    size_t blocks_per_event;
} shape;

typedef struct built {
    kvp_kv_batch batch;
    kvp_kv_event *events;
    uint64_t *hashes;
    uint32_t *tokens;
    size_t n_blocks;
} built;

static void build(const shape *sh, built *b)
{
    uint64_t st = 42;
    b->n_blocks = sh->n_events * sh->blocks_per_event;
    b->events = calloc(sh->n_events, sizeof *b->events);
    b->hashes = malloc(b->n_blocks * sizeof *b->hashes);
    b->tokens = malloc(b->n_blocks * BS * sizeof *b->tokens);
    if (!b->events || !b->hashes || !b->tokens)
        die("build", KVP_ENOMEM);
    for (size_t i = 0; i < b->n_blocks; i++)
        b->hashes[i] = rng_next(&st);
    for (size_t i = 0; i < b->n_blocks * BS; i++)
        b->tokens[i] = (uint32_t)(rng_next(&st) % 131072u);
    for (size_t e = 0; e < sh->n_events; e++) {
        kvp_kv_event *ev = &b->events[e];
        ev->type = KVP_EVENT_STORED;
        ev->hashes = b->hashes + e * sh->blocks_per_event;
        ev->n_hashes = sh->blocks_per_event;
        ev->has_parent = e % 2 == 1;
        ev->parent = rng_next(&st);
        ev->tokens = b->tokens + e * sh->blocks_per_event * BS;
        ev->n_tokens = sh->blocks_per_event * BS;
        ev->block_size = BS;
        ev->medium = "GPU";
        ev->group_idx = -1;
    }
    memset(&b->batch, 0, sizeof b->batch);
    b->batch.ts = 1789095808.8378847;
    b->batch.events = b->events;
    b->batch.n_events = sh->n_events;
    b->batch.has_dp_rank = true;
}

/* Seconds for n_iter encodes (decode false) or decodes of the batch in form. */
static double run_codec(const built *b, int form, bool decode, long n_iter, uint8_t *buf,
                        size_t cap, size_t *len)
{
    int rc = kvp_kv_encode(&b->batch, form, buf, cap, len);
    if (rc != KVP_OK)
        die("kvp_kv_encode", rc);
    double t0 = now();
    for (long i = 0; i < n_iter; i++) {
        if (decode) {
            kvp_kv_batch *d = NULL;
            rc = kvp_kv_decode(buf, *len, &d);
            if (rc != KVP_OK)
                die("kvp_kv_decode", rc);
            kvp_kv_batch_free(d);
        } else {
            rc = kvp_kv_encode(&b->batch, form, buf, cap, len);
            if (rc != KVP_OK)
                die("kvp_kv_encode", rc);
        }
    }
    return now() - t0;
}

static void bench_codec(int reps, double scale)
{
    static const shape shapes[2] = {{"per block", 64, 1}, {"per commit", 1, 32}};
    static const int forms[2] = {KVP_KV_FORM_ARRAY, KVP_KV_FORM_MAP};
    static const char *const form_names[2] = {"array", "map"};
    size_t cap = 1u << 20;
    uint8_t *buf = malloc(cap);
    if (!buf)
        die("buffer", KVP_ENOMEM);
    printf("(a) codec: BlockStored of %u-token blocks, median of %d runs\n", BS, reps);
    printf("%-11s %-5s %-6s %12s %12s %12s %8s\n", "shape", "form", "op", "batches/s", "events/s",
           "blocks/s", "B/block");
    for (int s = 0; s < 2; s++) {
        built b;
        build(&shapes[s], &b);
        long n_iter = (long)(20000.0 * scale / (double)b.n_blocks * 32.0);
        for (int f = 0; f < 2; f++)
            for (int op = 0; op < 2; op++) {
                double t[64];
                size_t len = 0;
                (void)run_codec(&b, forms[f], op, n_iter / 10 + 1, buf, cap, &len);
                for (int r = 0; r < reps; r++)
                    t[r] = run_codec(&b, forms[f], op, n_iter, buf, cap, &len);
                double bps = (double)n_iter / bench_median(t, reps);
                printf("%-11s %-5s %-6s %12.0f %12.0f %12.0f %8.1f\n", shapes[s].name,
                       form_names[f], op ? "decode" : "encode", bps,
                       bps * (double)shapes[s].n_events, bps * (double)b.n_blocks,
                       (double)len / (double)b.n_blocks);
            }
        free(b.events);
        free(b.hashes);
        free(b.tokens);
    }
    free(buf);
}

/* Seconds for n prompts of 16 blocks through kvp_access (+ a flush when pub is set). */
static double run_access(kvp_cache *c, kvp_publisher *pub, uint32_t *next, long n)
{
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    ns.model = kvp_field_str("bench");
    uint32_t t[16 * BS + 1];
    double t0 = now();
    for (long i = 0; i < n; i++) {
        for (size_t k = 0; k < sizeof t / sizeof t[0]; k++)
            t[k] = (*next)++;
        kvp_match m;
        int rc = kvp_access(c, &ns, t, sizeof t / sizeof t[0], &m);
        if (rc != KVP_OK)
            die("kvp_access", rc);
        if (pub && (rc = kvp_publisher_flush(pub)) != KVP_OK)
            die("kvp_publisher_flush", rc);
    }
    return now() - t0;
}

static kvp_cache *make_cache(kvp_publisher *pub)
{
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = 1u << 20;
    cfg.block_size = BS;
    cfg.hash_profile = KVP_HASH_XXH3;
    if (pub && kvp_publisher_attach(pub, &cfg) != KVP_OK)
        die("attach", KVP_EINVAL);
    kvp_cache *c = NULL;
    int rc = kvp_cache_new(&cfg, &c);
    if (rc != KVP_OK)
        die("kvp_cache_new", rc);
    return c;
}

static void bench_publisher(int reps, double scale)
{
    void *ctx = zmq_ctx_new();
    kvp_publisher_config pc;
    kvp_publisher_config_init(&pc);
    pc.endpoint = "inproc://bench";
    pc.zmq_context = ctx;
    kvp_publisher *pub = NULL;
    int rc = kvp_publisher_new(&pc, &pub);
    if (rc != KVP_OK)
        die("kvp_publisher_new", rc);
    kvp_cache *plain = make_cache(NULL), *published = make_cache(pub);
    long n = (long)(4000.0 * scale);
    uint32_t next_a = 0, next_b = 0;
    double ta[64], tb[64];
    (void)run_access(plain, NULL, &next_a, n / 10 + 1);
    (void)run_access(published, pub, &next_b, n / 10 + 1);
    for (int r = 0; r < reps; r++) {
        ta[r] = run_access(plain, NULL, &next_a, n);
        tb[r] = run_access(published, pub, &next_b, n);
    }
    double blocks = (double)n * 16.0;
    double a = bench_median(ta, reps) / blocks * 1e9, b = bench_median(tb, reps) / blocks * 1e9;
    kvp_publisher_stats st;
    (void)kvp_publisher_stats_get(pub, &st);
    printf("\n(b) publisher: kvp_access of 16-block prompts, 1M-block cache, one flush per "
           "access, median of %d runs\n",
           reps);
    printf("  no callback        %8.1f ns per block stored\n", a);
    printf("  with publisher     %8.1f ns per block stored (x%.2f; %.1f payload bytes per "
           "block)\n",
           b, b / a, (double)st.n_bytes / (double)st.n_cache_events);
    kvp_cache_free(plain);
    kvp_cache_free(published);
    kvp_publisher_free(pub);
    zmq_ctx_term(ctx);
}

int main(int argc, char **argv)
{
    int reps = 5;
    double scale = 1.0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--scale") == 0 && i + 1 < argc)
            scale = atof(argv[++i]);
        else if (strcmp(argv[i], "--quick") == 0)
            scale = 0.1;
        else {
            fprintf(stderr, "usage: %s [--reps N] [--scale F] [--quick]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > 64 || !(scale > 0)) {
        fprintf(stderr, "bench_events: --reps 1..64, --scale > 0\n");
        return 2;
    }
    bench_codec(reps, scale);
    bench_publisher(reps, scale);
    return 0;
}
