/*
 * replay_pol.c - one policy at one capacity on the recorded log (see replay_pol.h for what is
 * replayed and why the dense block numbers can stand for the keys).
 *
 * Per request: Step 1 the prompt's match (kvp_lookup_ids over the full prompt blocks when
 * output blocks follow them, else the match kvp_access_ids returns); Step 2 every touched
 * block cached through kvp_access_ids, touched from the last to the first, the request's first
 * min(blocks, pool) kept when it is longer than the pool. Evictions are the pool's count at
 * the end, orphans its kvp_stats.n_blocks_orphaned then (kvp_config.count_orphans). With a
 * retention table (rp_retain), Step 2 passes the request's retention
 * (kvp_access_ids_retained) under slru, s3fifo, cdecay and retain.
 *
 * rp_retain: per request a flag, priority and duration, and the offset of its ranges in one
 * growing array of all requests' ranges (32 bytes per request, 32 per range).
 */
#include "replay_pol.h"

#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvprefix.h"

const char *rp_pol_name(int pol)
{
    static const char *const names[RP_N_POLICIES] = {"lru",    "slru", "s3fifo",
                                                     "cdecay", "opt",  "retain"};
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

typedef struct rp_retain_req {
    bool has;          /* the request carries retention */
    uint32_t priority; /* its own priority */
    uint64_t duration; /* its own duration */
    size_t first;      /* its ranges: ranges[first .. first + n) */
    size_t n;          /* number of ranges */
} rp_retain_req;

struct rp_retain {
    rp_retain_req *req;          /* one per request */
    size_t n_req, cap_req;       /* entries used and allocated */
    kvp_retention_range *ranges; /* every request's ranges */
    size_t n_ranges, cap_ranges; /* entries used and allocated */
};

rp_retain *rp_retain_new(void)
{
    return calloc(1, sizeof(rp_retain));
}

void rp_retain_free(rp_retain *t)
{
    if (!t)
        return;
    free(t->req);
    free(t->ranges);
    free(t);
}

int rp_retain_add(rp_retain *t, const kvp_retention *r)
{
    size_t n = r ? r->n_ranges : 0;
    if (!cli_grow((void **)&t->req, &t->cap_req, t->n_req + 1, sizeof *t->req) ||
        !cli_grow((void **)&t->ranges, &t->cap_ranges, t->n_ranges + n + 1, sizeof *t->ranges))
        return -1;
    rp_retain_req *q = &t->req[t->n_req++];
    memset(q, 0, sizeof *q);
    q->first = t->n_ranges;
    if (!r)
        return 0;
    q->has = true;
    q->priority = r->priority;
    q->duration = r->duration;
    q->n = n;
    if (n)
        memcpy(t->ranges + t->n_ranges, r->ranges, n * sizeof *r->ranges);
    t->n_ranges += n;
    return 0;
}

/* Request r's retention from ret into *out; false when it has none. */
static bool retention_of(const rp_retain *ret, size_t r, kvp_retention *out)
{
    if (!ret || r >= ret->n_req || !ret->req[r].has)
        return false;
    const rp_retain_req *q = &ret->req[r];
    kvp_retention_init(out);
    out->priority = q->priority;
    out->duration = q->duration;
    out->ranges = q->n ? ret->ranges + q->first : NULL;
    out->n_ranges = q->n;
    return true;
}

/* Replay every request of log through pool into *f, with each request's retention from ret
 * (NULL: none). Returns KVP_OK or the library's code. */
static int replay_pool(const rp_opt *log, const rp_retain *ret, uint32_t bs, kvp_cache *pool,
                       kvp_key *ids, rp_pol_figs *f)
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
        kvp_retention kr;
        bool retained = retention_of(ret, r, &kr);
        int rc;
        if (n > n_full) {
            /* Step 1: output blocks follow the prompt: match the prompt alone. */
            rc = kvp_lookup_ids(pool, &ns, ids, n_full, n_tokens, NULL, 0, &m);
            /* Step 2: cache prompt and output blocks. */
            if (rc == KVP_OK && retained)
                rc = kvp_access_ids_retained(pool, &ns, ids, n, (uint64_t)n * bs, &kr, &m2);
            else if (rc == KVP_OK)
                rc = kvp_access_ids(pool, &ns, ids, n, (uint64_t)n * bs, &m2);
        } else if (retained) {
            rc = kvp_access_ids_retained(pool, &ns, ids, n, n_tokens, &kr, &m);
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
    return rp_pol_eval_retained(log, NULL, block_size, pol, capacity, out, err, err_size);
}

int rp_pol_eval_retained(rp_opt *log, const rp_retain *ret, uint32_t block_size, int pol,
                         uint64_t capacity, rp_pol_figs *out, char *err, size_t err_size)
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
        rc = replay_pool(log, pol == RP_POL_LRU ? NULL : ret, block_size, pool, ids, &f);
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
