/*
 * replay_pol.c - one policy at one capacity on the recorded log (see replay_pol.h for what is
 * replayed and why the dense block numbers can stand for the keys).
 *
 * Per request: Step 1 the prompt's match (kvp_lookup_ids over the full prompt blocks when
 * output blocks follow them, else the match kvp_access_ids returns); Step 2 every touched
 * block cached through kvp_access_ids, touched from the last to the first, the request's first
 * min(blocks, pool) kept when it is longer than the pool. Evictions are the pool's count at
 * the end, orphans its kvp_stats.n_blocks_orphaned then (kvp_config.count_orphans).
 */
#include "replay_pol.h"

#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvprefix.h"

const char *rp_pol_name(int pol)
{
    static const char *const names[RP_N_POLICIES] = {"lru", "slru", "s3fifo", "cdecay", "opt"};
    return pol >= 0 && pol < RP_N_POLICIES ? names[pol] : "?";
}

/* A pool of n_blocks blocks with policy pol. Returns KVP_OK or the library's code. */
static int pool_new(uint32_t block_size, uint32_t n_blocks, int pol, kvp_cache **out)
{
    kvp_config c;
    kvp_config_init(&c);
    c.block_size = block_size;
    c.n_blocks = n_blocks;
    c.single_threaded = true;
    c.count_orphans = true;
    c.eviction = pol == RP_POL_SLRU     ? KVP_EVICT_SLRU
                 : pol == RP_POL_S3FIFO ? KVP_EVICT_S3FIFO
                 : pol == RP_POL_CDECAY ? KVP_EVICT_CDECAY
                                        : KVP_EVICT_LRU;
    return kvp_cache_new(&c, out);
}

/* Replay every request of log through pool into *f. Returns KVP_OK or the library's code. */
static int replay_pool(const rp_opt *log, uint32_t bs, kvp_cache *pool, kvp_key *ids,
                       rp_pol_figs *f)
{
    kvp_namespace ns;
    memset(&ns, 0, sizeof ns);
    for (size_t r = 0; r < rp_opt_n_requests(log); r++) {
        const uint32_t *blocks;
        uint64_t n_tokens;
        uint32_t n_full;
        size_t n = rp_opt_request(log, r, &blocks, &n_tokens, &n_full);
        for (size_t i = 0; i < n; i++)
            ids[i] = (kvp_key){blocks[i], 0};
        kvp_match m, m2;
        int rc;
        if (n > n_full) {
            /* Step 1: output blocks follow the prompt: match the prompt alone. */
            rc = kvp_lookup_ids(pool, &ns, ids, n_full, n_tokens, NULL, 0, &m);
            /* Step 2: cache prompt and output blocks. */
            if (rc == KVP_OK)
                rc = kvp_access_ids(pool, &ns, ids, n, (uint64_t)n * bs, &m2);
        } else {
            /* Steps 1 and 2 in one call. */
            rc = kvp_access_ids(pool, &ns, ids, n, n_tokens, &m);
        }
        if (rc != KVP_OK)
            return rc;
        f->n_blocks_cached += m.n_blocks_cached;
        f->n_blocks_hit += m.n_blocks_hit;
        f->n_hit_tokens += m.n_tokens_hit;
    }
    kvp_stats st;
    int rc = kvp_cache_stats(pool, &st);
    if (rc == KVP_OK) {
        f->n_evicted = st.n_evictions;
        f->n_orphaned = st.n_blocks_orphaned;
    }
    return rc;
}

int rp_pol_eval(rp_opt *log, uint32_t block_size, int pol, uint64_t capacity, rp_pol_figs *out,
                char *err, size_t err_size)
{
    rp_pol_figs f;
    memset(&f, 0, sizeof f);
    f.capacity = capacity;
    if (pol == RP_POL_OPT) {
        rp_opt_result res;
        if (rp_opt_eval(log, capacity, RP_OPT_USEFUL, &res) != 0) {
            cli_errf(err, err_size, "out of memory (the optimum at %llu blocks)",
                     (unsigned long long)capacity);
            return -1;
        }
        f.n_hit_tokens = res.n_hit_tokens;
        f.n_blocks_cached = res.n_blocks_cached;
        f.n_blocks_hit = res.n_blocks_hit;
        f.n_evicted = res.n_evicted;
        f.n_orphaned = UINT64_MAX;
        *out = f;
        return 0;
    }
    uint64_t distinct = rp_opt_n_blocks(log) ? rp_opt_n_blocks(log) : 1;
    uint64_t blocks = capacity < distinct ? capacity : distinct;
    if (blocks > UINT32_MAX) {
        cli_errf(err, err_size, "%s at %llu blocks: more than a pool can hold", rp_pol_name(pol),
                 (unsigned long long)blocks);
        return -1;
    }
    size_t most = 1;
    for (size_t r = 0; r < rp_opt_n_requests(log); r++) {
        const uint32_t *b;
        uint64_t t;
        uint32_t n_full;
        size_t n = rp_opt_request(log, r, &b, &t, &n_full);
        most = n > most ? n : most;
    }
    kvp_key *ids = malloc(most * sizeof *ids);
    kvp_cache *pool = NULL;
    int rc = ids ? pool_new(block_size, (uint32_t)blocks, pol, &pool) : KVP_ENOMEM;
    if (rc == KVP_OK)
        rc = replay_pool(log, block_size, pool, ids, &f);
    if (rc == KVP_OK)
        rc = kvp_cache_check(pool);
    kvp_cache_free(pool);
    free(ids);
    if (rc != KVP_OK) {
        cli_errf(err, err_size, "%s at %llu blocks: %s", rp_pol_name(pol),
                 (unsigned long long)capacity, cli_kvp_error(rc));
        return -1;
    }
    *out = f;
    return 0;
}
