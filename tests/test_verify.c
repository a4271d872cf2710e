/*
 * test_verify.c - collision-proof mode (kvp_config.verify_tokens).
 *
 * With full 128-bit keys, verify mode behaves like the plain cache, also after the first
 * block of a chain was evicted and cached again. With keys truncated to 4 bits by the
 * internal test hook kvp__cache_set_key_bits, collisions are constant: in verify mode no lookup may
 * return a block whose namespace or token prefix differs from the query, and the cached run must
 * equal the true run of blocks holding exactly the query's prefix (tracked by a shadow table fed
 * from STORED/REMOVED events). Without verify, the same truncation demonstrably produces false
 * hits. n_verify_rejects counts the rejections.
 */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "internal.h"
#include "kvprefix.h"
#include "refmodel.h"

#define CHECK(c) cr_assert_eq(kvp_cache_check(c), KVP_OK, "kvp_cache_check failed")

static kvp_stats stats(const kvp_cache *c)
{
    kvp_stats s;
    cr_assert_eq(kvp_cache_stats(c, &s), KVP_OK);
    return s;
}

Test(verify, normal_hits_work)
{
    kvp_cache *c = th_cache(32, 4, true, NULL, NULL);
    kvp_namespace ns, other;
    th_ns(&ns, "m", NULL, "t", NULL);
    th_ns(&other, "m", NULL, "u", NULL);
    uint32_t t[17];
    for (int i = 0; i < 17; i++)
        t[i] = 40 + (uint32_t)i;
    kvp_match m;
    cr_assert_eq(kvp_access(c, &ns, t, 17, &m), KVP_OK);
    CHECK(c);
    cr_assert_eq(kvp_lookup(c, &ns, t, 17, NULL, 0, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_cached, 4);
    cr_assert_eq(m.n_blocks_hit, 4);
    cr_assert_eq(kvp_lookup(c, &other, t, 17, NULL, 0, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_cached, 0, "verify mode shares across namespaces");
    t[9] = 0;
    cr_assert_eq(kvp_lookup(c, &ns, t, 17, NULL, 0, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_cached, 2);
    t[9] = 49;

    /* Lifecycle with a hit, decode and dedup. */
    cr_assert_eq(kvp_acquire(c, 1, &ns, t, 10, 0, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_hit, 2);
    cr_assert_eq(kvp_acquire(c, 2, &ns, t, 10, 0, &m), KVP_OK);
    size_t st;
    cr_assert_eq(kvp_commit(c, 1, t, 12, &st), KVP_OK);
    cr_assert_eq(st, 0, "block 2 is cached from the access: a duplicate");
    cr_assert_eq(kvp_grow(c, 1, 20), KVP_OK);
    uint32_t u[20];
    memcpy(u, t, sizeof t);
    u[17] = 1, u[18] = 2, u[19] = 3;
    cr_assert_eq(kvp_commit(c, 1, u, 20, &st), KVP_OK);
    cr_assert_eq(st, 1, "block 4 differs from the accessed prompt's continuation");
    CHECK(c);
    cr_assert_eq(kvp_release(c, 1), KVP_OK);
    cr_assert_eq(kvp_release(c, 2), KVP_OK);
    CHECK(c);
    cr_assert_eq(kvp_lookup(c, &ns, u, 20, NULL, 0, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_cached, 5);
    cr_assert_eq(stats(c).n_verify_rejects, 0, "rejects without collisions");
    kvp_cache_free(c);
}

Test(verify, hit_survives_recached_first_block)
{
    /* Block 0 of a chain is evicted while a request pins a private copy of it and the
     * indexed blocks 1 and 2; then block 0 is cached again. No key collides, so verify mode
     * must report the same run as the plain cache (3 blocks) and count no reject. */
    for (int verify = 0; verify < 2; verify++) {
        kvp_cache *c = th_cache(4, 1, verify, NULL, NULL);
        kvp_namespace ns;
        th_ns(&ns, "m", NULL, NULL, NULL);
        uint32_t t[4] = {1, 2, 3, 4}, x = 9;
        kvp_match m;
        cr_assert_eq(kvp_acquire(c, 1, &ns, t, 3, 0, &m), KVP_OK);  /* nothing cached yet */
        cr_assert_eq(kvp_access(c, &ns, t, 1, &m), KVP_OK);         /* block 0 cached */
        cr_assert_eq(kvp_commit(c, 1, t, 3, NULL), KVP_OK);         /* 0 dedups; 1, 2 stored */
        cr_assert_eq(kvp_acquire(c, 2, &ns, &x, 1, 0, &m), KVP_OK); /* evicts block 0 */
        cr_assert_eq(kvp_release(c, 2), KVP_OK);
        cr_assert_eq(kvp_access(c, &ns, t, 1, &m), KVP_OK); /* block 0 cached again */
        CHECK(c);
        cr_assert_eq(kvp_lookup(c, &ns, t, 4, NULL, 0, &m), KVP_OK);
        cr_assert_eq(m.n_blocks_cached, 3, "verify %d: cached run %u, expected 3", verify,
                     m.n_blocks_cached);
        cr_assert_eq(stats(c).n_verify_rejects, 0, "verify %d: a reject without a collision",
                     verify);
        kvp_cache_free(c);
    }
}

Test(verify, key_bits_hook)
{
    kvp_cache *c = th_cache(8, 2, true, NULL, NULL);
    cr_assert_eq(kvp__cache_set_key_bits(c, 0), KVP_EINVAL);
    cr_assert_eq(kvp__cache_set_key_bits(c, 129), KVP_EINVAL);
    cr_assert_eq(kvp__cache_set_key_bits(c, 128), KVP_OK);
    cr_assert_eq(kvp__cache_set_key_bits(c, 4), KVP_OK);
    kvp_cache_free(c);
}

/* Probe: a fixed prompt A cached, then many random one-block prompts looked up. Returns the
 * number of lookups that reported a cached block although its tokens differ from A's. */
static int false_hits(bool verify, uint64_t *rejects)
{
    kvp_cache *c = th_cache(16, 4, verify, NULL, NULL);
    cr_assert_eq(kvp__cache_set_key_bits(c, 4), KVP_OK);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t a[5] = {1, 2, 3, 4, 5};
    kvp_match m;
    cr_assert_eq(kvp_access(c, &ns, a, 5, &m), KVP_OK);
    int n_false = 0;
    uint64_t rs = 12345;
    for (int i = 0; i < 400; i++) {
        uint32_t b[5];
        for (int j = 0; j < 5; j++)
            b[j] = 100 + (uint32_t)(th_rand(&rs) % 1000);
        cr_assert_eq(kvp_lookup(c, &ns, b, 5, NULL, 0, &m), KVP_OK);
        if (m.n_blocks_cached > 0)
            n_false++;
    }
    CHECK(c);
    *rejects = stats(c).n_verify_rejects;
    kvp_cache_free(c);
    return n_false;
}

Test(verify, truncated_keys_give_false_hits_without_verify)
{
    uint64_t rejects = 99;
    int n = false_hits(false, &rejects);
    cr_assert_gt(n, 0, "4-bit keys never collided in 400 lookups: the hook has no effect?");
    cr_assert_eq(rejects, 0, "rejects counted without verify");
}

Test(verify, truncated_keys_no_false_hits_with_verify)
{
    uint64_t rejects = 0;
    int n = false_hits(true, &rejects);
    cr_assert_eq(n, 0, "verify mode returned %d false hits", n);
    cr_assert_gt(rejects, 0, "collisions happened but n_verify_rejects is 0");
}

/* ------------------------------------------------------------------ randomized shadow test */

#define MAXLEN 24
#define POOL   24

/* What each block truly holds, from the events: namespace number and token prefix. */
typedef struct shadow {
    bool valid[POOL];
    int ns[POOL];
    uint32_t prefix[POOL][MAXLEN];
    size_t n_prefix[POOL];
} shadow;

typedef struct req {
    bool active;
    int ns;
    uint32_t seq[MAXLEN + 8];
    size_t n_seq;
    size_t cap; /* tokens the request holds blocks for */
} req;

typedef struct ctx {
    th_events ev;
    size_t seen;
    shadow sh;
    req reqs[4];
    kvp_namespace nss[3];
} ctx;

/* Apply the events since the last call; `r` is the request whose commit stored blocks. */
static void absorb(ctx *x, kvp_cache *c, uint64_t req_id, const req *r, uint32_t bs)
{
    for (; x->seen < x->ev.n; x->seen++) {
        const kvp_event *e = &x->ev.ev[x->seen];
        cr_assert_lt(e->block_id, POOL);
        if (e->type == KVP_EVENT_REMOVED) {
            cr_assert(x->sh.valid[e->block_id], "REMOVED for a block that held nothing");
            x->sh.valid[e->block_id] = false;
        } else if (e->type == KVP_EVENT_STORED) {
            cr_assert_not_null(r, "STORED outside a commit");
            const uint32_t *ids;
            size_t n;
            cr_assert_eq(kvp_request_blocks(c, req_id, &ids, &n), KVP_OK);
            size_t i = 0;
            while (i < n && ids[i] != e->block_id)
                i++;
            cr_assert_lt(i, n, "STORED block %u is not in the request", e->block_id);
            size_t len = (i + 1) * bs;
            cr_assert_leq(len, r->n_seq);
            x->sh.valid[e->block_id] = true;
            x->sh.ns[e->block_id] = r->ns;
            memcpy(x->sh.prefix[e->block_id], r->seq, len * sizeof(uint32_t));
            x->sh.n_prefix[e->block_id] = len;
        }
    }
}

static bool holds(const shadow *sh, uint32_t b, int ns, const uint32_t *t, size_t len)
{
    return sh->valid[b] && sh->ns[b] == ns && sh->n_prefix[b] == len &&
           memcmp(sh->prefix[b], t, len * sizeof(uint32_t)) == 0;
}

static uint32_t true_run(const shadow *sh, int ns, const uint32_t *t, size_t n, uint32_t bs)
{
    uint32_t run = 0;
    for (size_t i = 0; (i + 1) * bs <= n; i++) {
        bool found = false;
        for (uint32_t b = 0; b < POOL && !found; b++)
            found = holds(sh, b, ns, t, (i + 1) * bs);
        if (!found)
            break;
        run++;
    }
    return run;
}

static void random_prompt(uint64_t *rs, uint32_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        t[i] = (uint32_t)(th_rand(rs) % 3); /* tiny alphabet: prefixes repeat */
}

static void collision_run(uint32_t bs, uint64_t seed)
{
    ctx *x = calloc(1, sizeof *x);
    cr_assert_not_null(x);
    th_ns(&x->nss[0], "m", NULL, NULL, NULL);
    th_ns(&x->nss[1], "m", NULL, "t", NULL);
    th_ns(&x->nss[2], "m2", "a", NULL, NULL);
    kvp_cache *c = th_cache(POOL, bs, true, th_events_fn, &x->ev);
    cr_assert_eq(kvp__cache_set_key_bits(c, 4), KVP_OK);
    uint64_t rs = seed;
    uint64_t n_hits = 0;
    for (int step = 0; step < 3000; step++) {
        int op = (int)(th_rand(&rs) % 4);
        int ri = (int)(th_rand(&rs) % 4);
        req *r = &x->reqs[ri];
        kvp_match m;
        if (op == 0 && !r->active) {
            r->ns = (int)(th_rand(&rs) % 3);
            r->n_seq = 1 + th_rand(&rs) % 12;
            random_prompt(&rs, r->seq, r->n_seq);
            r->cap = r->n_seq + 6;
            int rc = kvp_acquire(c, (uint64_t)ri, &x->nss[r->ns], r->seq, r->n_seq, r->cap, &m);
            cr_assert(rc == KVP_OK || rc == KVP_ENOSPC, "acquire: %s", kvp_strerror(rc));
            absorb(x, c, (uint64_t)ri, NULL, bs);
            if (rc == KVP_OK) {
                r->active = true;
                /* The hit blocks must really hold this prompt's prefix. */
                const uint32_t *ids;
                size_t n;
                cr_assert_eq(kvp_request_blocks(c, (uint64_t)ri, &ids, &n), KVP_OK);
                for (uint32_t i = 0; i < m.n_blocks_hit; i++)
                    cr_assert(holds(&x->sh, ids[i], r->ns, r->seq, (i + 1) * bs),
                              "step %d: acquire pinned block %u that holds other tokens", step,
                              ids[i]);
            }
        } else if (op == 1 && r->active) {
            /* Decode a few tokens and commit. */
            size_t add = th_rand(&rs) % 4;
            while (add-- > 0 && r->n_seq < r->cap)
                r->seq[r->n_seq++] = (uint32_t)(th_rand(&rs) % 3);
            cr_assert_eq(kvp_commit(c, (uint64_t)ri, r->seq, r->n_seq, NULL), KVP_OK);
            absorb(x, c, (uint64_t)ri, r, bs);
        } else if (op == 2 && r->active) {
            cr_assert_eq(kvp_release(c, (uint64_t)ri), KVP_OK);
            absorb(x, c, (uint64_t)ri, NULL, bs);
            r->active = false;
        } else {
            int ns = (int)(th_rand(&rs) % 3);
            uint32_t t[MAXLEN];
            size_t n = 1 + th_rand(&rs) % MAXLEN;
            random_prompt(&rs, t, n);
            uint32_t ids[MAXLEN];
            cr_assert_eq(kvp_lookup(c, &x->nss[ns], t, n, ids, MAXLEN, &m), KVP_OK);
            uint32_t truth = true_run(&x->sh, ns, t, n, bs);
            cr_assert_leq(m.n_blocks_cached, truth,
                          "step %d: %u blocks reported cached, only %u hold the prefix", step,
                          m.n_blocks_cached, truth);
            cr_assert_eq(m.n_blocks_cached, truth,
                         "step %d: %u blocks reported cached, %u truly cached", step,
                         m.n_blocks_cached, truth);
            for (uint32_t i = 0; i < m.n_blocks_hit; i++)
                cr_assert(holds(&x->sh, ids[i], ns, t, (i + 1) * bs),
                          "step %d: hit block %u holds other tokens", step, ids[i]);
            n_hits += m.n_blocks_cached;
        }
        CHECK(c);
    }
    kvp_stats s = stats(c);
    cr_assert_gt(n_hits, 0, "no lookup ever hit: the test exercised nothing");
    cr_assert_gt(s.n_verify_rejects, 0, "4-bit keys but no rejected collision");
    kvp_cache_free(c);
    free(x);
}

Test(verify, collisions_never_hit_wrong_blocks)
{
    for (uint32_t bs = 1; bs <= 3; bs++)
        collision_run(bs, 1000 + bs);
}
