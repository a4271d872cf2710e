/*
 * tiers.c - an engine embedding a two-tier cache: a small device pool (tier 0, "GPU") and
 * a larger host-memory tier (tier 1, "CPU"). It shows what an engine does with the orders:
 *
 *   kvp_acquire_tiers  -> device hits + LOAD orders (CPU block -> fresh device block): the
 *                         engine copies them (asynchronously), confirms each, then computes
 *                         the rest and commits the whole prompt as usual;
 *   kvp_commit         -> STORE orders (device block -> CPU block), written through as
 *                         blocks complete: kvp_tier_orders hands them out, the engine copies
 *                         and confirms; only then can a later request load them.
 *
 * The "KV" of a block is simulated as one 64-bit word per block computed from its tokens,
 * so the program can check that every loaded block holds exactly what computing it would
 * have produced. Copies complete one engine step late and in reverse order, as DMA
 * completions might. Built and run by the test suite (exit status 0 = all checks held).
 */
#include <stdio.h>
#include <string.h>

#include <kvprefix.h>

#define BS        16
#define N_GPU     48
#define N_CPU     256
#define N_PENDING 1024
#define MAX_TOK   (24 * BS)

static uint64_t gpu_kv[N_GPU]; /* the engine's device memory, one word per block */
static uint64_t cpu_kv[N_CPU]; /* its host memory */

/* What "computing" a block's KV gives: a function of the block's whole prefix. */
static uint64_t compute_kv(const uint32_t *tokens, size_t block)
{
    uint64_t h = 1469598103934665603u;
    for (size_t i = 0; i < (block + 1) * BS; i++)
        h = (h ^ tokens[i]) * 1099511628211u;
    return h;
}

/* Copies in flight: issued in one step, completed in the next. */
static kvp_tier_order pending[N_PENDING];
static size_t n_pending;
static int failures;

static int check(int rc, const char *what)
{
    if (rc != KVP_OK) {
        fprintf(stderr, "tiers: %s: %s (%s)\n", what, kvp_strerror(rc), kvp_errmsg());
        failures++;
    }
    return rc;
}

/* Complete every copy in flight, last issued first, and confirm each. */
static void complete_copies(kvp_cache *cache)
{
    while (n_pending > 0) {
        const kvp_tier_order *o = &pending[--n_pending];
        if (o->kind == KVP_ORDER_STORE)
            cpu_kv[o->tier_block] = gpu_kv[o->device_block];
        else
            gpu_kv[o->device_block] = cpu_kv[o->tier_block];
        check(kvp_tier_confirm(cache, o->id, true), "tier_confirm");
    }
}

/* Take the store orders the last commits made and start their copies. */
static void start_stores(kvp_cache *cache)
{
    size_t n, left;
    do {
        if (check(kvp_tier_orders(cache, pending + n_pending, N_PENDING - n_pending, &n, &left),
                  "tier_orders"))
            return;
        n_pending += n;
    } while (left > 0 && n > 0);
}

/* Serve one request: acquire (with loads), wait for the loads, prefill the rest, commit,
 * release. */
static void serve(kvp_cache *cache, uint64_t id, const kvp_namespace *ns, const uint32_t *t,
                  size_t n, const char *name)
{
    kvp_match m;
    kvp_tier_order loads[MAX_TOK / BS];
    size_t n_loads = 0;
    if (check(kvp_acquire_tiers(cache, id, ns, t, n, 0, &m, loads, MAX_TOK / BS, &n_loads),
              "acquire_tiers"))
        return;
    const uint32_t *blocks;
    size_t n_blocks;
    if (check(kvp_request_blocks(cache, id, &blocks, &n_blocks), "request_blocks"))
        return;
    /* The loads run in the background; this engine waits for them before prefill. */
    memcpy(pending + n_pending, loads, n_loads * sizeof *loads);
    n_pending += n_loads;
    complete_copies(cache);
    size_t n_ready = m.n_blocks_hit + n_loads;
    for (size_t b = 0; b < n_ready; b++)
        if (gpu_kv[blocks[b]] != compute_kv(t, b)) {
            fprintf(stderr, "tiers: %s block %zu holds the wrong KV\n", name, b);
            failures++;
        }
    /* Prefill computes the blocks that were neither hit nor loaded. */
    for (size_t b = n_ready; b < n / BS; b++)
        gpu_kv[blocks[b]] = compute_kv(t, b);
    check(kvp_commit(cache, id, t, n, NULL), "commit");
    start_stores(cache); /* write-through: copy the new blocks to host memory */
    check(kvp_release(cache, id), "release");
    printf("%-10s %3zu blocks: %2u from GPU, %2zu loaded from CPU, %2zu computed\n", name, n / BS,
           m.n_blocks_hit, n_loads, n / BS - n_ready);
}

int main(void)
{
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = N_GPU;
    cfg.block_size = BS;
    cfg.block_bytes = 2 * 32 * 8 * 128 * 2 * BS; /* K and V, 32 layers, 8 heads of 128, fp16 */
    kvp_cache *cache;
    if (check(kvp_cache_new(&cfg, &cache), "cache_new"))
        return 1;
    kvp_tier_config tc;
    kvp_tier_config_init(&tc); /* medium "CPU" */
    tc.n_blocks = N_CPU;
    int tier;
    if (check(kvp_cache_add_tier(cache, &tc, &tier), "add_tier"))
        return 1;

    kvp_namespace ns;
    kvp_namespace_init(&ns);
    ns.model = kvp_field_str("llama-3.1-8b");
    static uint32_t chat[MAX_TOK], other[MAX_TOK];
    for (size_t i = 0; i < MAX_TOK; i++)
        chat[i] = 1000 + (uint32_t)i;

    /* A conversation's first turn, then enough other traffic to evict it from the GPU. */
    serve(cache, 1, &ns, chat, 12 * BS + 5, "turn 1");
    for (uint64_t r = 0; r < 6; r++) {
        for (size_t i = 0; i < MAX_TOK; i++)
            other[i] = 50000 + (uint32_t)(r * MAX_TOK + i);
        serve(cache, 100 + r, &ns, other, 20 * BS, "other");
    }
    complete_copies(cache);
    /* The second turn extends the first: its prefix comes back from host memory. */
    serve(cache, 2, &ns, chat, 18 * BS + 3, "turn 2");
    complete_copies(cache);

    kvp_tier_stats st;
    int n_tiers;
    if (check(kvp_cache_tier_stats(cache, tier, &st, &n_tiers), "tier_stats") == KVP_OK)
        printf("%s tier: %u blocks ready, %llu loads (%llu bytes), %llu stores (%llu bytes)\n",
               st.medium, st.n_blocks_ready, (unsigned long long)st.n_loads,
               (unsigned long long)st.n_bytes_loaded, (unsigned long long)st.n_stores,
               (unsigned long long)st.n_bytes_stored);
    if (st.n_loads == 0) {
        fprintf(stderr, "tiers: the second turn loaded nothing from the CPU tier\n");
        failures++;
    }
    check(kvp_cache_check(cache), "cache_check");
    kvp_cache_free(cache);
    return failures != 0;
}
