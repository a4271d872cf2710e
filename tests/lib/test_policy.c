/*
 * test_policy.c - the eviction policies other than LRU (kvp_config.eviction): SLRU,
 * S3-FIFO and CDECAY against small reference models, hand cases of each policy's defining
 * behaviour, the orphan count (kvp_config.count_orphans) against an index-based oracle under
 * every policy, and the policy checkers catching corruptions.
 *
 * The models below are written from the published descriptions (segmented LRU; S3-FIFO,
 * Yang et al., SOSP'23, Algorithm 1; CDECAY, the project's own, from its description in
 * docs/design.md) plus the two points where the cache must decide what
 * the papers do not say, as src/policy.h states them: a block is inserted at its first
 * release (a pinned block cannot be evicted, so it joins no queue before), and a block
 * leaves its queue while pinned and re-enters at its queue's tail when released. Every
 * pin is a hit. The models know nothing of the library's lists: they keep plain arrays of
 * node numbers, shifted on every removal.
 *
 * The random test drives kvp_access only (pins last for the call), over prompts that are
 * paths in a tree of 3-way branching and depth 4 with blocks of one token, and after every
 * call compares, for every node of the tree, the cached run kvp_lookup reports for the
 * node's path with the model's, and runs kvp_cache_check.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "internal.h"
#include "policy_list.h"
#include "tier.h"
#include "testutil.h"

/* ---------------------------------------------------------------------------------------- */
/* The tree of prompts                                                                      */
/* ---------------------------------------------------------------------------------------- */

#define FAN       3
#define DEPTH     4
#define MAX_NODES (FAN + FAN * FAN + FAN * FAN * FAN + FAN * FAN * FAN * FAN)

/* Node numbers: a path t[0 .. d) (tokens 1..FAN) is node sum of the sizes of the shallower
 * levels plus the path read as a base-FAN number. */
static int node_of(const uint32_t *t, size_t d)
{
    int base = 0, level = 1, v = 0;
    for (size_t i = 1; i < d; i++) {
        level *= FAN;
        base += level;
    }
    for (size_t i = 0; i < d; i++)
        v = v * FAN + (int)(t[i] - 1);
    return base + v;
}

static size_t path_of(int node, uint32_t *t)
{
    int level = FAN, base = 0;
    size_t d = 1;
    while (node >= base + level) {
        base += level;
        level *= FAN;
        d++;
    }
    int v = node - base;
    for (size_t i = d; i-- > 0;) {
        t[i] = (uint32_t)(v % FAN) + 1;
        v /= FAN;
    }
    return d;
}

/* ---------------------------------------------------------------------------------------- */
/* Reference models                                                                         */
/* ---------------------------------------------------------------------------------------- */

typedef struct queue {
    int v[MAX_NODES + 8];
    int n;
} queue;

static void q_push(queue *q, int x)
{
    q->v[q->n++] = x;
}

static int q_pop(queue *q)
{
    int x = q->v[0];
    memmove(q->v, q->v + 1, (size_t)(q->n - 1) * sizeof q->v[0]);
    q->n--;
    return x;
}

static bool q_remove(queue *q, int x)
{
    for (int i = 0; i < q->n; i++)
        if (q->v[i] == x) {
            memmove(q->v + i, q->v + i + 1, (size_t)(q->n - i - 1) * sizeof q->v[0]);
            q->n--;
            return true;
        }
    return false;
}

static bool q_has(const queue *q, int x)
{
    for (int i = 0; i < q->n; i++)
        if (q->v[i] == x)
            return true;
    return false;
}

enum { WHERE_NONE, WHERE_PINNED, WHERE_Q1, WHERE_Q2 };

typedef struct model {
    int policy;
    int n_blocks;
    int cap_protected; /* SLRU */
    int cap_small;     /* S3-FIFO */
    int cap_ghost;     /* S3-FIFO */
    queue q1, q2;      /* SLRU: probation, protected; S3-FIFO: S, M (head = oldest) */
    queue ghost;       /* S3-FIFO: G, oldest first */
    int where[MAX_NODES];
    int home[MAX_NODES]; /* queue to join at release: WHERE_Q1/Q2, or WHERE_NONE if new */
    int freq[MAX_NODES];
    int pins[MAX_NODES]; /* pins held on a pinned node (a lower tier's loads may overlap) */
    int n_pinned;        /* pinned nodes */
} model;

static void model_init(model *m, int policy, int n, int prot_pct, int small_pct, int ghost_pct)
{
    memset(m, 0, sizeof *m);
    m->policy = policy;
    m->n_blocks = n;
    m->cap_protected = n * prot_pct / 100;
    m->cap_small = n * small_pct / 100 > 0 ? n * small_pct / 100 : 1;
    m->cap_ghost = (n - m->cap_small) * ghost_pct / 100;
}

static bool cached(const model *m, int x)
{
    return m->where[x] == WHERE_Q1 || m->where[x] == WHERE_Q2;
}

/* SLRU: evict the LRU end of probation, else of protected. */
static int slru_victim(model *m)
{
    return m->q1.n ? q_pop(&m->q1) : q_pop(&m->q2);
}

/* S3-FIFO eviction (Algorithm 1: evictS when S is at its size or M is empty, else evictM). */
static int s3_victim(model *m)
{
    if (m->q1.n >= m->cap_small || m->q2.n == 0) {
        while (m->q1.n) {
            int t = q_pop(&m->q1);
            if (m->freq[t] > 0) {
                q_push(&m->q2, t); /* to M, freq kept */
                m->where[t] = WHERE_Q2;
                m->home[t] = WHERE_Q2;
                continue;
            }
            if (m->cap_ghost > 0) {
                if (m->ghost.n == m->cap_ghost)
                    q_pop(&m->ghost);
                q_push(&m->ghost, t);
            }
            return t;
        }
    }
    for (;;) {
        int t = q_pop(&m->q2);
        if (m->freq[t] == 0)
            return t;
        m->freq[t]--;
        q_push(&m->q2, t);
    }
}

/* One pin by a hit: off its queue (unless pinned already); the policy's hit rule. */
static void model_hit(model *m, int x)
{
    if (m->where[x] == WHERE_Q1)
        q_remove(&m->q1, x);
    else if (m->where[x] == WHERE_Q2)
        q_remove(&m->q2, x);
    if (m->pins[x]++ == 0)
        m->n_pinned++;
    m->where[x] = WHERE_PINNED;
    if (m->policy == KVP_EVICT_SLRU)
        m->home[x] = WHERE_Q2;
    else if (m->freq[x] < 3)
        m->freq[x]++;
}

/* Take a block for new node x: a free one, else the policy's victim. false: none left. */
static bool model_take(model *m, int x)
{
    int n_cached = m->q1.n + m->q2.n;
    if (n_cached + m->n_pinned >= m->n_blocks) {
        if (n_cached == 0)
            return false;
        int v = m->policy == KVP_EVICT_SLRU ? slru_victim(m) : s3_victim(m);
        m->where[v] = WHERE_NONE;
    }
    m->where[x] = WHERE_PINNED;
    m->home[x] = WHERE_NONE;
    m->freq[x] = 0;
    m->pins[x] = 1;
    m->n_pinned++;
    return true;
}

/* A pin of node x dropped; the last one releases it. */
static void model_release(model *m, int x)
{
    if (--m->pins[x] > 0)
        return;
    m->n_pinned--;
    if (m->home[x] == WHERE_NONE)
        m->home[x] = m->policy == KVP_EVICT_S3FIFO && q_has(&m->ghost, x) ? WHERE_Q2 : WHERE_Q1;
    m->where[x] = m->home[x];
    q_push(m->home[x] == WHERE_Q1 ? &m->q1 : &m->q2, x);
    if (m->policy == KVP_EVICT_SLRU && m->q2.n > m->cap_protected) {
        int d = q_pop(&m->q2); /* protected overflow: to probation's MRU end */
        q_push(&m->q1, d);
        m->where[d] = WHERE_Q1;
        m->home[d] = WHERE_Q1;
    }
}

/* kvp_access of the path t[0 .. d): pin or insert every block in order, then release them
 * last first. */
static void model_access(model *m, const uint32_t *t, size_t d)
{
    int held[DEPTH];
    size_t n_held = 0;
    for (size_t i = 0; i < d; i++) {
        int x = node_of(t, i + 1);
        if (cached(m, x))
            model_hit(m, x);
        else if (!model_take(m, x))
            break;
        held[n_held++] = x;
    }
    while (n_held > 0)
        model_release(m, held[--n_held]);
}

/* The cached run of path t[0 .. d) in the model. */
static uint32_t model_run(const model *m, const uint32_t *t, size_t d)
{
    uint32_t r = 0;
    while (r < d && cached(m, node_of(t, r + 1)))
        r++;
    return r;
}

/* CDECAY, from its description (include/kvprefix.h and docs/design.md, "Eviction policies"):
 * time counts block releases; a release is a touch of class min(known, 2) * 9 +
 * min(bit length of the request's new blocks, 8), known being the block's earlier touches
 * while cached or remembered by the ghost (the count at its eviction, read once); a touch of a
 * block touched before credits the class of its previous touch with a reuse; at the start of each
 * request's release every class's offset is floor(tau ln((reuses + 1) / (trials + 2))); a
 * released block's key is the clock (after its tick) plus its class's offset, and it joins
 * that class's FIFO, unless the block released just before was its child with a greater key:
 * then it takes that key and the child's FIFO. The victim is the least key among the FIFOs'
 * oldest blocks, the deeper on a tie, then the lower class; it enters the ghost (a FIFO of
 * ghost_pct percent of the pool) with its touches and class. This model keeps plain arrays. */
#define CD_CLS 27

typedef struct cd_ghost {
    int x, hist, cls;
} cd_ghost;

typedef struct cdmodel {
    int n_blocks, cap_ghost;
    double tau;
    int where[MAX_NODES];  /* WHERE_NONE, WHERE_PINNED or WHERE_Q1 (cached) */
    bool fresh[MAX_NODES]; /* taken, not released since */
    int hist[MAX_NODES], cls[MAX_NODES], fifo[MAX_NODES];
    long long key[MAX_NODES];
    queue q[CD_CLS];
    cd_ghost ghost[2048]; /* oldest first */
    int n_ghost;
    double trials[CD_CLS], reused[CD_CLS];
    long long off[CD_CLS];
    long long clock;
    int n_pinned, n_cached;
} cdmodel;

static void cd_init(cdmodel *m, int n, uint32_t tau, uint32_t ghost_pct)
{
    memset(m, 0, sizeof *m);
    m->n_blocks = n;
    m->tau = tau ? tau : 20000;
    m->cap_ghost = n * (int)(ghost_pct ? ghost_pct : 1600) / 100;
    cr_assert(m->cap_ghost <= 2048);
}

static int node_depth(int x)
{
    uint32_t t[DEPTH];
    return (int)path_of(x, t) - 1;
}

static void cd_evict(cdmodel *m)
{
    int best = -1;
    for (int c = 0; c < CD_CLS; c++) {
        if (m->q[c].n == 0)
            continue;
        int x = m->q[c].v[0];
        if (best < 0 || m->key[x] < m->key[m->q[best].v[0]] ||
            (m->key[x] == m->key[m->q[best].v[0]] && node_depth(x) > node_depth(m->q[best].v[0])))
            best = c;
    }
    int v = q_pop(&m->q[best]);
    m->where[v] = WHERE_NONE;
    m->n_cached--;
    if (m->cap_ghost > 0) {
        if (m->n_ghost == m->cap_ghost) {
            memmove(m->ghost, m->ghost + 1, (size_t)(m->n_ghost - 1) * sizeof m->ghost[0]);
            m->n_ghost--;
        }
        m->ghost[m->n_ghost++] = (cd_ghost){v, m->hist[v], m->cls[v]};
    }
}

static void cd_access(cdmodel *m, const uint32_t *t, size_t d)
{
    int held[DEPTH];
    size_t n_held = 0;
    for (size_t i = 0; i < d; i++) {
        int x = node_of(t, i + 1);
        if (m->where[x] == WHERE_Q1) {
            q_remove(&m->q[m->fifo[x]], x);
            m->n_cached--;
        } else {
            if (m->n_cached + m->n_pinned >= m->n_blocks) {
                if (m->n_cached == 0)
                    break;
                cd_evict(m);
            }
            m->fresh[x] = true;
        }
        m->where[x] = WHERE_PINNED;
        m->n_pinned++;
        held[n_held++] = x;
    }
    int n_new = 0;
    for (size_t i = 0; i < n_held; i++)
        n_new += m->fresh[held[i]];
    int col = 0;
    while (n_new >> col)
        col++;
    col = col > 8 ? 8 : col;
    for (int c = 0; c < CD_CLS; c++)
        m->off[c] = (long long)floor(m->tau * log((m->reused[c] + 1) / (m->trials[c] + 2)));
    long long chain_key = 0;
    int chain_fifo = -1;
    for (size_t i = n_held; i-- > 0;) {
        int x = held[i], known = 0, prev = 0;
        if (m->fresh[x]) {
            m->fresh[x] = false;
            for (int g = m->n_ghost; g-- > 0;)
                if (m->ghost[g].x == x) {
                    known = m->ghost[g].hist;
                    prev = m->ghost[g].cls;
                    m->ghost[g].hist = m->ghost[g].cls = 0; /* read once */
                    break;
                }
        } else {
            known = m->hist[x];
            prev = m->cls[x];
        }
        if (known > 0)
            m->reused[prev]++;
        int c = (known > 2 ? 2 : known) * 9 + col;
        m->trials[c]++;
        m->cls[x] = c;
        m->hist[x] = known < 255 ? known + 1 : 255;
        long long key = ++m->clock + m->off[c];
        int f = c;
        if (i + 1 < n_held && key < chain_key) { /* held[i + 1] is its child, released before */
            key = chain_key;
            f = chain_fifo;
        }
        chain_key = key;
        chain_fifo = f;
        m->key[x] = key;
        m->fifo[x] = f;
        q_push(&m->q[f], x);
        m->where[x] = WHERE_Q1;
        m->n_pinned--;
        m->n_cached++;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Random operation sequences against the models                                            */
/* ---------------------------------------------------------------------------------------- */

static kvp_cache *policy_cache(int policy, uint32_t n, uint32_t prot, uint32_t small,
                               uint32_t ghost)
{
    kvp_config cfg = th_config(n, 1, false, NULL, NULL);
    cfg.eviction = policy;
    cfg.slru_protected_pct = prot;
    cfg.s3fifo_small_pct = small;
    cfg.s3fifo_ghost_pct = ghost;
    return th_cache_new(&cfg);
}

static void run_random(int policy, uint64_t seed, int steps)
{
    uint64_t rng = seed;
    uint32_t n = 4 + (uint32_t)(th_rand(&rng) % 28);
    uint32_t prot = (uint32_t)(th_rand(&rng) % 101), small = 1 + (uint32_t)(th_rand(&rng) % 60);
    uint32_t ghost = (uint32_t)(th_rand(&rng) % 201);
    kvp_cache *c = policy_cache(policy, n, prot, small, ghost);
    static model m;
    model_init(&m, policy, (int)n, (int)prot, (int)small, (int)ghost);
    kvp_namespace ns;
    th_ns(&ns, "policy", NULL, NULL, NULL);
    /* A skewed popularity: a few hot subtrees, many cold paths. */
    for (int s = 0; s < steps; s++) {
        uint32_t t[DEPTH];
        size_t d = 1 + th_rand(&rng) % DEPTH;
        bool hot = th_rand(&rng) % 3 == 0;
        for (size_t i = 0; i < d; i++)
            t[i] = hot && i < 2 ? 1 : 1 + (uint32_t)(th_rand(&rng) % FAN);
        th_access_ok(c, &ns, t, d);
        model_access(&m, t, d);
        for (int x = 0; x < MAX_NODES; x++) {
            uint32_t p[DEPTH];
            size_t pd = path_of(x, p);
            uint32_t got = th_lookup_ok(c, &ns, p, pd).n_blocks_cached;
            uint32_t want = model_run(&m, p, pd);
            cr_assert_eq(got, want,
                         "policy %d seed %llu step %d: node %d (depth %zu) run %u, model %u",
                         policy, (unsigned long long)seed, s, x, pd, got, want);
        }
        kvp_stats st = th_stats(c);
        cr_assert_eq(st.n_blocks_cached, (uint32_t)(m.q1.n + m.q2.n));
    }
    kvp_cache_free(c);
}

Test(policy, tree_numbering)
{
    for (int x = 0; x < MAX_NODES; x++) {
        uint32_t t[DEPTH];
        size_t d = path_of(x, t);
        cr_assert_eq(node_of(t, d), x, "node %d", x);
    }
}

Test(policy, slru_matches_model, .timeout = 120)
{
    for (uint64_t seed = 1; seed <= 40; seed++)
        run_random(KVP_EVICT_SLRU, seed, 150);
}

Test(policy, s3fifo_matches_model, .timeout = 120)
{
    for (uint64_t seed = 1; seed <= 40; seed++)
        run_random(KVP_EVICT_S3FIFO, seed, 150);
}

static void run_random_cdecay(uint64_t seed, int steps)
{
    uint64_t rng = seed;
    uint32_t n = 4 + (uint32_t)(th_rand(&rng) % 28);
    uint32_t tau = 1 + (uint32_t)(th_rand(&rng) % 40);
    uint32_t ghost = (uint32_t)(th_rand(&rng) % 8) * 100; /* 0: the default, 1600 */
    kvp_config cfg = th_config(n, 1, false, NULL, NULL);
    cfg.eviction = KVP_EVICT_CDECAY;
    cfg.cdecay_tau = tau;
    cfg.cdecay_ghost_pct = ghost;
    kvp_cache *c = th_cache_new(&cfg);
    static cdmodel m;
    cd_init(&m, (int)n, tau, ghost);
    kvp_namespace ns;
    th_ns(&ns, "policy", NULL, NULL, NULL);
    for (int s = 0; s < steps; s++) {
        uint32_t t[DEPTH];
        size_t d = 1 + th_rand(&rng) % DEPTH;
        bool hot = th_rand(&rng) % 3 == 0;
        for (size_t i = 0; i < d; i++)
            t[i] = hot && i < 2 ? 1 : 1 + (uint32_t)(th_rand(&rng) % FAN);
        th_access_ok(c, &ns, t, d);
        cd_access(&m, t, d);
        for (int x = 0; x < MAX_NODES; x++) {
            uint32_t p[DEPTH];
            size_t pd = path_of(x, p);
            uint32_t got = th_lookup_ok(c, &ns, p, pd).n_blocks_cached;
            uint32_t want = 0;
            while (want < pd && m.where[node_of(p, want + 1)] == WHERE_Q1)
                want++;
            cr_assert_eq(got, want,
                         "cdecay seed %llu step %d: node %d (depth %zu) run %u, model %u",
                         (unsigned long long)seed, s, x, pd, got, want);
        }
        cr_assert_eq(th_stats(c).n_blocks_cached, (uint32_t)m.n_cached);
        TH_CHECK(c);
    }
    kvp_cache_free(c);
}

Test(policy, cdecay_matches_model, .timeout = 120)
{
    for (uint64_t seed = 1; seed <= 40; seed++)
        run_random_cdecay(seed, 150);
}

/* ---------------------------------------------------------------------------------------- */
/* Hand cases                                                                               */
/* ---------------------------------------------------------------------------------------- */

static bool is_cached(kvp_cache *c, const kvp_namespace *ns, uint32_t tok)
{
    return th_lookup_ok(c, ns, &tok, 1).n_blocks_cached == 1;
}

/* A scan of blocks seen once does not flush SLRU's protected segment (LRU loses them). */
Test(policy, slru_scan_keeps_protected)
{
    kvp_namespace ns;
    th_ns(&ns, "scan", NULL, NULL, NULL);
    for (int policy = KVP_EVICT_LRU; policy <= KVP_EVICT_SLRU; policy++) {
        kvp_cache *c = policy_cache(policy, 10, 50, 10, 100);
        for (uint32_t hot = 1; hot <= 4; hot++) {
            th_access_ok(c, &ns, &hot, 1);
            th_access_ok(c, &ns, &hot, 1); /* hit again while cached: protected */
        }
        for (uint32_t cold = 100; cold < 130; cold++)
            th_access_ok(c, &ns, &cold, 1);
        for (uint32_t hot = 1; hot <= 4; hot++)
            cr_assert_eq(is_cached(c, &ns, hot), policy == KVP_EVICT_SLRU,
                         "policy %d: hot block %u", policy, hot);
        kvp_cache_free(c);
    }
}

/* Protected overflow demotes its LRU block to probation's MRU end, not out of the cache. */
Test(policy, slru_protected_overflow_demotes)
{
    kvp_namespace ns;
    th_ns(&ns, "demote", NULL, NULL, NULL);
    kvp_cache *c = policy_cache(KVP_EVICT_SLRU, 4, 25, 10, 100); /* protected holds 1 */
    uint32_t a = 1, b = 2;
    th_access_ok(c, &ns, &a, 1);
    th_access_ok(c, &ns, &a, 1); /* a protected */
    th_access_ok(c, &ns, &b, 1);
    th_access_ok(c, &ns, &b, 1); /* b protected, a demoted to probation's tail */
    const kvp__policy *p = &c->policy;
    cr_assert_eq(p->list[KVP__PL_B].n, 1);
    cr_assert_eq(p->list[KVP__PL_A].n, 1);
    cr_assert(is_cached(c, &ns, a) && is_cached(c, &ns, b));
    kvp_cache_free(c);
}

/* The block id kvp_lookup returns for the one-token prompt tok. */
static uint32_t block_of(kvp_cache *c, const kvp_namespace *ns, uint32_t tok)
{
    uint32_t id = KVP_NIL, t[2] = {tok, 0};
    kvp_match m;
    cr_assert_eq(kvp_lookup(c, ns, t, 2, &id, 1, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_cached, 1, "token %u is not cached", tok);
    return id;
}

/* One-hit wonders leave from S; a key the ghost remembers comes back into M. */
Test(policy, s3fifo_ghost_readmits_to_main)
{
    kvp_namespace ns;
    th_ns(&ns, "ghost", NULL, NULL, NULL);
    kvp_cache *c = policy_cache(KVP_EVICT_S3FIFO, 10, 80, 10, 100); /* S target 1, G 9 */
    uint32_t x = 7;
    th_access_ok(c, &ns, &x, 1);
    cr_assert_eq(c->policy.b[block_of(c, &ns, x)].list, KVP__PL_A, "a new block goes to S");
    for (uint32_t cold = 100; cold < 110; cold++) /* 10 one-hit wonders: x leaves S into G */
        th_access_ok(c, &ns, &cold, 1);
    cr_assert(!is_cached(c, &ns, x));
    th_access_ok(c, &ns, &x, 1);
    cr_assert_eq(c->policy.b[block_of(c, &ns, x)].list, KVP__PL_B, "the ghost readmits to M");
    kvp_cache_free(c);
}

Test(policy, s3fifo_one_hit_wonders_leave_from_small)
{
    kvp_namespace ns;
    th_ns(&ns, "wonders", NULL, NULL, NULL);
    kvp_cache *c = policy_cache(KVP_EVICT_S3FIFO, 10, 80, 20, 100); /* S target 2 */
    for (uint32_t hot = 1; hot <= 5; hot++) {
        th_access_ok(c, &ns, &hot, 1);
        th_access_ok(c, &ns, &hot, 1); /* freq 1 in S: moves to M when S is evicted */
    }
    for (uint32_t cold = 100; cold < 160; cold++) {
        th_access_ok(c, &ns, &cold, 1);
        TH_CHECK(c);
    }
    for (uint32_t hot = 1; hot <= 5; hot++)
        cr_assert(is_cached(c, &ns, hot), "hot block %u was evicted by one-hit wonders", hot);
    cr_assert_eq(c->policy.list[KVP__PL_B].n, 5);
    cr_assert(th_stats(c).n_evictions >= 50);
    kvp_cache_free(c);
}

/* Pinned blocks are never evicted, free blocks go first, quotas hold (every policy). */
Test(policy, pool_promises_hold)
{
    kvp_namespace a, b;
    th_ns(&a, "quota", NULL, "a", NULL);
    th_ns(&b, "quota", NULL, "b", NULL);
    for (int policy = KVP_EVICT_LRU; policy <= KVP_EVICT_CDECAY; policy++) {
        kvp_config cfg = th_config(8, 1, false, NULL, NULL);
        cfg.eviction = policy;
        cfg.ns_quota = 3;
        kvp_cache *c = th_cache_new(&cfg);
        uint32_t held[4] = {50, 51, 52, 53};
        th_acquire_ok(c, 1, &a, held, 4, 0);
        cr_assert_eq(kvp_commit(c, 1, held, 4, NULL), KVP_OK);
        for (uint32_t t = 1; t <= 4; t++) {
            th_access_ok(c, &b, &t, 1);
            cr_assert_eq(th_stats(c).n_evictions, t == 4 ? 1u : 0u,
                         "policy %d: an eviction while free blocks were left", policy);
        }
        cr_assert_eq(th_stats(c).n_blocks_cached, 3, "policy %d: b over its quota", policy);
        for (uint32_t t = 10; t < 30; t++)
            th_access_ok(c, &b, &t, 1);
        cr_assert_eq(th_lookup_ok(c, &a, held, 4).n_blocks_cached, 4,
                     "policy %d: a pinned block was evicted", policy);
        cr_assert_eq(kvp_release(c, 1), KVP_OK);
        TH_CHECK(c);
        cr_assert(th_stats(c).n_blocks_cached <= 6);
        kvp_cache_free(c);
    }
}

Test(policy, config_is_validated)
{
    kvp_config cfg = th_config(8, 1, false, NULL, NULL);
    kvp_cache *c = NULL;
    cfg.eviction = 4;
    cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_EINVAL);
    cfg.eviction = KVP_EVICT_CDECAY;
    cfg.cdecay_tau = 1000000001;
    cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_EINVAL);
    cfg.cdecay_tau = 0;
    cfg.cdecay_ghost_pct = 10001;
    cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_EINVAL);
    cfg.cdecay_ghost_pct = 0;
    cfg.eviction = KVP_EVICT_SLRU;
    cfg.slru_protected_pct = 101;
    cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_EINVAL);
    cfg.slru_protected_pct = 80;
    cfg.s3fifo_small_pct = 0;
    cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_EINVAL);
    cr_assert_null(c);
    kvp_config d;
    kvp_config_init(&d);
    cr_assert_eq(d.eviction, KVP_EVICT_LRU);
    cr_assert_eq(d.slru_protected_pct, 80);
    cr_assert_eq(d.s3fifo_small_pct, 10);
    cr_assert_eq(d.s3fifo_ghost_pct, 100);
    cr_assert_eq(d.cdecay_tau, 0, "0: the default tau");
    cr_assert_eq(d.cdecay_ghost_pct, 0, "0: the default ghost");
    cr_assert(!d.count_orphans);
}

/* kvp_cache_reset drops every cached block under each policy and leaves the ghost as it is. */
Test(policy, reset_drops_everything)
{
    kvp_namespace ns;
    th_ns(&ns, "reset", NULL, NULL, NULL);
    for (int policy = KVP_EVICT_SLRU; policy <= KVP_EVICT_CDECAY; policy++) {
        kvp_cache *c = policy_cache(policy, 6, 50, 20, 100);
        for (uint32_t t = 1; t < 20; t++)
            th_access_ok(c, &ns, &t, 1);
        uint32_t g = c->policy.ghost_n;
        cr_assert_eq(kvp_cache_reset(c), KVP_OK);
        TH_CHECK(c);
        cr_assert_eq(th_stats(c).n_blocks_cached, 0);
        cr_assert_eq(c->policy.ghost_n, g);
        kvp_cache_free(c);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* CDECAY hand cases                                                                        */
/* ---------------------------------------------------------------------------------------- */

/* Blocks touched again and again outlive a stream of one-time blocks once the policy has
 * learned that first touches are rarely followed by another: rounds of 4 hot blocks and 8
 * cold ones in a pool of 10 (LRU loses the hot blocks every round). */
Test(policy, cdecay_learns_that_one_time_blocks_are_not_reused)
{
    kvp_namespace ns;
    th_ns(&ns, "scan", NULL, NULL, NULL);
    for (int policy = KVP_EVICT_LRU; policy <= KVP_EVICT_CDECAY; policy += KVP_EVICT_CDECAY) {
        kvp_cache *c = policy_cache(policy, 10, 80, 10, 100);
        uint32_t cold = 100, hits = 0;
        for (int round = 0; round < 20; round++) {
            for (uint32_t hot = 1; hot <= 4; hot++)
                hits += th_access_ok(c, &ns, &hot, 1).n_blocks_cached;
            for (int k = 0; k < 8; k++, cold++)
                th_access_ok(c, &ns, &cold, 1);
            TH_CHECK(c);
        }
        bool kept = true;
        for (uint32_t hot = 1; hot <= 4; hot++)
            kept = kept && is_cached(c, &ns, hot);
        cr_assert_eq(kept, policy == KVP_EVICT_CDECAY, "policy %d: hot blocks kept %d (%u hits)",
                     policy, kept, hits);
        cr_assert(policy == KVP_EVICT_LRU ? hits == 0 : hits >= 60, "policy %d: %u hits", policy,
                  hits);
        kvp_cache_free(c);
    }
}

/* A chain released together: each parent's key is at least its child's, so the tail goes
 * first and no parent leaves before its child. */
Test(policy, cdecay_chain_closure)
{
    kvp_namespace ns;
    th_ns(&ns, "closure", NULL, NULL, NULL);
    kvp_cache *c = policy_cache(KVP_EVICT_CDECAY, 8, 80, 10, 100);
    uint32_t t[5] = {1, 2, 3, 4, 0};
    th_access_ok(c, &ns, t, 4);
    uint32_t cold = 9;
    th_access_ok(c, &ns, &cold, 1); /* the class of a short new chain: a different offset */
    th_access_ok(c, &ns, t, 4);
    uint32_t ids[4];
    kvp_match m;
    cr_assert_eq(kvp_lookup(c, &ns, t, 5, ids, 4, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_cached, 4);
    for (uint32_t i = 1; i < 4; i++)
        cr_assert(c->policy.b[ids[i - 1]].key >= c->policy.b[ids[i]].key, "block %u", i);
    for (uint32_t x = 20; x < 24; x++) { /* four new blocks: the chain leaves tail first */
        th_access_ok(c, &ns, &x, 1);
        uint32_t run = th_lookup_ok(c, &ns, t, 5).n_blocks_cached;
        cr_assert(run == 4 || th_stats(c).n_blocks_cached < 8, "run %u", run);
    }
    TH_CHECK(c);
    kvp_cache_free(c);
}

/* ---------------------------------------------------------------------------------------- */
/* Orphans (kvp_config.count_orphans)                                                       */
/* ---------------------------------------------------------------------------------------- */

/* The index key of node x's block, from the cache's own hasher. */
static kvp_key node_key(kvp_cache *c, const kvp_namespace *ns, int x)
{
    uint32_t t[DEPTH];
    size_t d = path_of(x, t), n = 0;
    const kvp_hasher *h = kvp_cache_hasher(c);
    kvp_chain ch, out[DEPTH];
    cr_assert_eq(kvp_hasher_root(h, ns, &ch), KVP_OK);
    cr_assert_eq(kvp_hasher_blocks(h, ns, &ch, t, d, out, DEPTH, &n), KVP_OK);
    cr_assert_eq(n, d);
    return out[d - 1].key;
}

static int parent_of(int x)
{
    uint32_t t[DEPTH];
    size_t d = path_of(x, t);
    return d > 1 ? node_of(t, d - 1) : -1;
}

/* Is node x an orphan by the index: its block cached, its parent's key indexed nowhere? */
static bool oracle_orphan(kvp_cache *c, const kvp_key *keys, int x)
{
    const kvp__block *b = kvp__index_find(&c->index, keys[x]);
    int px = parent_of(x);
    return px >= 0 && b && kvp__block_is_cached(&c->pool, kvp__block_id(&c->pool, b)) &&
           !kvp__index_find(&c->index, keys[px]);
}

/* Under every policy, random accesses with the orphan count on: after every step the count
 * equals the index's; an orphan whose parent is stored again is re-adopted at once (a lookup
 * reaches it and it no longer counts). S3-FIFO and CDECAY orphan blocks; LRU and SLRU never
 * do (each release of a child is followed by its parent's, and their orders keep a parent
 * behind its child; see policy_slru.c). */
Test(policy, orphans_counted_and_readopted, .timeout = 120)
{
    kvp_namespace ns;
    th_ns(&ns, "orphans", NULL, NULL, NULL);
    for (int policy = KVP_EVICT_LRU; policy <= KVP_EVICT_CDECAY; policy++) {
        uint32_t n_orphaned = 0, n_readopted = 0;
        for (uint64_t seed = 1; seed <= 30; seed++) {
            uint64_t rng = seed;
            kvp_config cfg = th_config(4 + (uint32_t)(th_rand(&rng) % 20), 1, false, NULL, NULL);
            cfg.eviction = policy;
            cfg.count_orphans = true;
            cfg.slru_protected_pct = 50;
            cfg.s3fifo_small_pct = 20;
            cfg.cdecay_tau = 5 * (uint32_t)(1 + th_rand(&rng) % 200);
            kvp_cache *c = th_cache_new(&cfg);
            kvp_key keys[MAX_NODES];
            for (int x = 0; x < MAX_NODES; x++)
                keys[x] = node_key(c, &ns, x);
            for (int s = 0; s < 120; s++) {
                uint32_t t[DEPTH];
                size_t d = 1 + th_rand(&rng) % DEPTH;
                bool hot = th_rand(&rng) % 2 == 0;
                for (size_t i = 0; i < d; i++)
                    t[i] = hot && i < 2 ? 1 : 1 + (uint32_t)(th_rand(&rng) % FAN);
                th_access_ok(c, &ns, t, d);
                uint32_t want = 0;
                int orphan = -1;
                for (int x = 0; x < MAX_NODES; x++)
                    if (oracle_orphan(c, keys, x)) {
                        want++;
                        orphan = x;
                    }
                cr_assert_eq(th_stats(c).n_blocks_orphaned, want,
                             "policy %d seed %llu step %d: %u orphans, the index %u", policy,
                             (unsigned long long)seed, s, th_stats(c).n_blocks_orphaned, want);
                n_orphaned += want;
                if (orphan < 0 || th_rand(&rng) % 2)
                    continue;
                /* Store the parent's chain again (it may evict the orphan; then try later). */
                uint32_t p[DEPTH];
                size_t pd = path_of(parent_of(orphan), p);
                th_access_ok(c, &ns, p, pd);
                if (!oracle_orphan(c, keys, orphan) && kvp__index_find(&c->index, keys[orphan]) &&
                    kvp__block_is_cached(
                        &c->pool,
                        kvp__block_id(&c->pool, kvp__index_find(&c->index, keys[orphan])))) {
                    uint32_t o[DEPTH];
                    size_t od = path_of(orphan, o);
                    cr_assert_eq(th_lookup_ok(c, &ns, o, od).n_blocks_cached, (uint32_t)od,
                                 "a re-adopted block is reachable again");
                    n_readopted++;
                }
                TH_CHECK(c);
            }
            kvp_cache_free(c);
        }
        if (policy == KVP_EVICT_LRU || policy == KVP_EVICT_SLRU) {
            cr_assert_eq(n_orphaned, 0, "policy %d orphaned %u blocks", policy, n_orphaned);
        } else {
            cr_assert(n_orphaned > 0, "policy %d: no orphan in 30 runs", policy);
            cr_assert(n_readopted > 0, "policy %d: no re-adoption", policy);
        }
    }
}

/* Without count_orphans the count is 0 and nothing is allocated for it. */
Test(policy, orphans_off_by_default)
{
    kvp_namespace ns;
    th_ns(&ns, "orphans", NULL, NULL, NULL);
    kvp_cache *c = policy_cache(KVP_EVICT_SLRU, 4, 50, 10, 100);
    cr_assert_null(c->policy.link);
    for (uint32_t t = 1; t < 40; t++) {
        uint32_t p[3] = {t % 3, t % 5, t};
        th_access_ok(c, &ns, p, 3);
    }
    cr_assert_eq(th_stats(c).n_blocks_orphaned, 0);
    kvp_cache_free(c);
}

/* ---------------------------------------------------------------------------------------- */
/* The checkers catch corruptions                                                           */
/* ---------------------------------------------------------------------------------------- */

/* Each policy's own checker, on the cache's device-pool policy. */
static int slru_check(const kvp_cache *c)
{
    return kvp__policy_slru_check(&c->policy);
}

static int s3fifo_check(const kvp_cache *c)
{
    return kvp__policy_s3fifo_check(&c->policy);
}

static int cdecay_check(const kvp_cache *c)
{
    return kvp__policy_cdecay_check(&c->policy);
}

#define EXPECT_CORRUPT(c, check)                                                                   \
    do {                                                                                           \
        cr_assert_eq(check(c), KVP_ECORRUPT, #check " missed the corruption");                     \
        cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT, "kvp_cache_check missed the corruption");   \
    } while (0)

/* A cache of the policy with blocks on both lists (and, for S3-FIFO, ghost keys). */
static kvp_cache *busy_cache(int policy, kvp_namespace *ns)
{
    th_ns(ns, "corrupt", NULL, NULL, NULL);
    kvp_cache *c = policy_cache(policy, 8, 50, 25, 100);
    for (uint32_t t = 1; t <= 3; t++) {
        th_access_ok(c, ns, &t, 1);
        th_access_ok(c, ns, &t, 1);
    }
    for (uint32_t t = 10; t < 20; t++)
        th_access_ok(c, ns, &t, 1);
    cr_assert_eq(kvp__pool_policy_check(c), KVP_OK);
    cr_assert(c->policy.list[KVP__PL_A].n >= 2 && c->policy.list[KVP__PL_B].n >= 2);
    return c;
}

Test(policy_check, broken_link)
{
    for (int policy = KVP_EVICT_SLRU; policy <= KVP_EVICT_S3FIFO; policy++) {
        kvp_namespace ns;
        kvp_cache *c = busy_cache(policy, &ns);
        kvp__policy *p = &c->policy;
        uint32_t h = p->list[KVP__PL_B].head, nx = p->b[h].next;
        p->b[nx].prev = KVP_NIL;
        EXPECT_CORRUPT(c, kvp__pool_policy_check);
        p->b[nx].prev = h;
        p->b[h].next = h; /* a cycle */
        EXPECT_CORRUPT(c, kvp__pool_policy_check);
        p->b[h].next = nx;
        cr_assert_eq(kvp_cache_check(c), KVP_OK);
        kvp_cache_free(c);
    }
}

Test(policy_check, counts_and_membership)
{
    for (int policy = KVP_EVICT_SLRU; policy <= KVP_EVICT_S3FIFO; policy++) {
        kvp_namespace ns;
        kvp_cache *c = busy_cache(policy, &ns);
        kvp__policy *p = &c->policy;
        p->list[KVP__PL_A].n++;
        EXPECT_CORRUPT(c, kvp__pool_policy_check);
        p->list[KVP__PL_A].n--;
        uint32_t h = p->list[KVP__PL_A].head;
        p->b[h].list = KVP__PL_B; /* says protected / main, sits on A */
        EXPECT_CORRUPT(c, kvp__pool_policy_check);
        p->b[h].list = KVP__PL_A;
        p->b[h].home = KVP__PL_B; /* on A, but its history sends it to B */
        EXPECT_CORRUPT(c, kvp__pool_policy_check);
        p->b[h].home = KVP__PL_A;
        uint64_t last = p->b[h].last_use;
        p->b[h].last_use = p->clock + 1; /* from the future */
        EXPECT_CORRUPT(c, kvp__pool_policy_check);
        p->b[h].last_use = last;
        cr_assert_eq(kvp_cache_check(c), KVP_OK);
        kvp_cache_free(c);
    }
}

Test(policy_check, slru_protected_overflow)
{
    kvp_namespace ns;
    kvp_cache *c = busy_cache(KVP_EVICT_SLRU, &ns);
    uint32_t cap = c->policy.cap_b;
    c->policy.cap_b = c->policy.list[KVP__PL_B].n - 1;
    EXPECT_CORRUPT(c, slru_check);
    c->policy.cap_b = cap;
    cr_assert_eq(kvp_cache_check(c), KVP_OK);
    kvp_cache_free(c);
}

Test(policy_check, s3fifo_freq_and_ghost)
{
    kvp_namespace ns;
    kvp_cache *c = busy_cache(KVP_EVICT_S3FIFO, &ns);
    kvp__policy *p = &c->policy;
    cr_assert(p->ghost_n >= 2);
    uint32_t h = p->list[KVP__PL_B].head;
    uint8_t f = p->b[h].freq;
    p->b[h].freq = KVP__S3_FREQ_MAX + 1;
    EXPECT_CORRUPT(c, s3fifo_check);
    p->b[h].freq = f;

    uint64_t *slot = &p->ghost[p->ghost_head];
    uint64_t fp = *slot;
    *slot ^= 0x5a5a; /* a ring entry the table does not hold */
    EXPECT_CORRUPT(c, s3fifo_check);
    *slot = fp;

    uint32_t s = 0;
    while (p->gtab_fp[s] != fp)
        s++;
    p->gtab_n[s]++; /* the table counts one occurrence too many */
    EXPECT_CORRUPT(c, s3fifo_check);
    p->gtab_n[s]--;

    p->ghost_n = p->ghost_cap + 1;
    EXPECT_CORRUPT(c, s3fifo_check);
    p->ghost_n = p->ghost_cap;
    kvp_cache_free(c);
}

Test(policy_check, cdecay_lists_keys_and_history)
{
    kvp_namespace ns;
    th_ns(&ns, "corrupt", NULL, NULL, NULL);
    kvp_cache *c = policy_cache(KVP_EVICT_CDECAY, 8, 50, 25, 100);
    for (uint32_t t = 1; t < 20; t++) {
        uint32_t p[2] = {t % 4, t};
        th_access_ok(c, &ns, p, 2);
    }
    kvp__policy *p = &c->policy;
    cr_assert_eq(kvp__pool_policy_check(c), KVP_OK);
    cr_assert(p->ghost_n >= 2);
    uint32_t h = KVP_NIL;
    uint8_t l = 0;
    for (l = KVP__PL_C0; l < KVP__PL_N && h == KVP_NIL; l++)
        h = p->list[l].head;
    cr_assert_neq(h, KVP_NIL);
    uint8_t hist = p->b[h].hist;
    p->b[h].hist = 0; /* cached without a touch */
    EXPECT_CORRUPT(c, cdecay_check);
    p->b[h].hist = hist;
    int64_t key = p->b[h].key;
    p->b[h].key = (int64_t)p->cd_clock + 1; /* a key from the future */
    EXPECT_CORRUPT(c, cdecay_check);
    p->b[h].key = key;
    uint8_t w = p->cd_win[1];
    p->cd_win[1] = 0xff; /* the tournament names no victim */
    EXPECT_CORRUPT(c, cdecay_check);
    p->cd_win[1] = w;
    p->cd_off[3] = 1; /* odds above 1 */
    EXPECT_CORRUPT(c, cdecay_check);
    p->cd_off[3] = 0;
    /* A cached block moved to SLRU's probation list, which CDECAY does not use. */
    kvp__plist_remove(&c->policy, h);
    c->pool.n_lru++;
    kvp__plist_push(&c->policy, KVP__PL_A, h);
    c->pool.n_lru--;
    EXPECT_CORRUPT(c, kvp__pool_policy_check);
    kvp_cache_free(c);
}

/* The pool's own checker: under a policy the LRU ring must stay empty. */
Test(policy_check, ring_unused)
{
    kvp_namespace ns;
    kvp_cache *c = busy_cache(KVP_EVICT_SLRU, &ns);
    uint32_t id = c->policy.list[KVP__PL_A].head;
    c->pool.state[id] = 0; /* a ring slot */
    EXPECT_CORRUPT(c, kvp__pool_check);
    c->pool.state[id] = KVP__ST_CACHED;
    cr_assert_eq(kvp_cache_check(c), KVP_OK);
    kvp_cache_free(c);
}

/* The hooks a prefix-aware policy gets: chain depth, hits since taken, clock of last use. */
Test(policy, records_depth_hits_and_clock)
{
    kvp_namespace ns;
    th_ns(&ns, "hooks", NULL, NULL, NULL);
    kvp_cache *c = policy_cache(KVP_EVICT_SLRU, 8, 50, 10, 100);
    uint32_t t[5] = {1, 2, 3, 4, 0};
    th_access_ok(c, &ns, t, 4);
    th_access_ok(c, &ns, t, 2);
    uint32_t ids[4];
    kvp_match m;
    cr_assert_eq(kvp_lookup(c, &ns, t, 5, ids, 4, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_cached, 4);
    for (uint32_t i = 0; i < 4; i++) {
        const kvp__pblock *b = &c->policy.b[ids[i]];
        cr_assert_eq(b->depth, i);
        cr_assert_eq(b->n_hits, i < 2 ? 1u : 0u, "block %u", i);
        cr_assert(b->last_use <= c->policy.clock);
        if (i > 0 && i < 2)
            cr_assert(b->last_use < c->policy.b[ids[i - 1]].last_use, "released tail first");
    }
    kvp_cache_free(c);
}

/* ---------------------------------------------------------------------------------------- */
/* A lower tier's policy (kvp_tier_config.eviction)                                         */
/* ---------------------------------------------------------------------------------------- */

/* tier.c's policy surface driven directly, against the models above: a store's reservation
 * is a take, its confirmation the first release, its failure a drop (the block goes without
 * ever being cached), a load order's pin a hit (every pin), its confirmation a release on
 * the last pin. After every step each node's state in the tier (free, pending or pinned,
 * cached) must be the model's, and the tier's checker must pass (the table's: no orders
 * exist here, so kvp_cache_check's order invariants do not hold). */
typedef struct tier_rig {
    kvp_cache *c;
    kvp__tier *t;
    uint32_t id[MAX_NODES]; /* the node's tier block, KVP_NIL when the tier has none */
    bool pending[MAX_NODES];
} tier_rig;

static kvp_key tier_node_key(int x)
{
    kvp_key k = {UINT64_C(0x9e3779b97f4a7c15) * (uint64_t)(x + 1), (uint64_t)x};
    return k;
}

static void model_drop(model *m, int x)
{
    m->pins[x] = 0;
    m->n_pinned--;
    m->where[x] = WHERE_NONE;
}

static void tier_rig_compare(tier_rig *r, const model *m, int policy, uint64_t seed, int step)
{
    for (int x = 0; x < MAX_NODES; x++) {
        uint32_t id = kvp__tier_find(r->t, tier_node_key(x));
        int got = WHERE_NONE;
        if (id != KVP_NIL) {
            const kvp__tblock *b = &r->t->blocks[id];
            got = b->state == KVP__TB_PENDING || b->ref > 0 ? WHERE_PINNED : WHERE_Q1;
        }
        int want = m->where[x] == WHERE_Q2 ? WHERE_Q1 : m->where[x];
        cr_assert_eq(got, want,
                     "policy %d seed %llu step %d: node %d is %d in the tier, %d in "
                     "the model",
                     policy, (unsigned long long)seed, step, x, got, want);
        cr_assert_eq(id, r->id[x]);
    }
    cr_assert_eq(kvp__tier_table_check(r->t), KVP_OK, "seed %llu step %d", (unsigned long long)seed,
                 step);
}

static void run_tier_random(int policy, uint64_t seed, int steps)
{
    uint64_t rng = seed;
    uint32_t n = 2 + (uint32_t)(th_rand(&rng) % 14);
    uint32_t prot = (uint32_t)(th_rand(&rng) % 101), small = 1 + (uint32_t)(th_rand(&rng) % 60);
    uint32_t ghost = (uint32_t)(th_rand(&rng) % 201);
    int n_nodes = 3 * (int)n < MAX_NODES ? 3 * (int)n : MAX_NODES;
    tier_rig r;
    memset(&r, 0, sizeof r);
    r.c = th_cache(8, 1, false, NULL, NULL);
    kvp_tier_config tc;
    kvp_tier_config_init(&tc);
    tc.n_blocks = n;
    tc.eviction = policy;
    tc.slru_protected_pct = prot;
    tc.s3fifo_small_pct = small;
    tc.s3fifo_ghost_pct = ghost;
    cr_assert_eq(kvp_cache_add_tier(r.c, &tc, NULL), KVP_OK);
    r.t = &r.c->tiers->tier[1];
    for (int x = 0; x < MAX_NODES; x++)
        r.id[x] = KVP_NIL;
    static model m;
    model_init(&m, policy, (int)n, (int)prot, (int)small, (int)ghost);
    for (int s = 0; s < steps; s++) {
        int x = (int)(th_rand(&rng) % (uint64_t)n_nodes);
        if (th_rand(&rng) % 4 == 0)
            x = (int)(th_rand(&rng) % 3); /* a few hot nodes */
        bool ok = th_rand(&rng) % 5 != 0;
        if (r.id[x] == KVP_NIL) { /* a store order: reserve */
            uint32_t id = kvp__tier_reserve_block(r.c, 1, tier_node_key(x));
            bool took = model_take(&m, x);
            cr_assert_eq(id != KVP_NIL, took, "seed %llu step %d: reserve",
                         (unsigned long long)seed, s);
            for (int y = 0; y < MAX_NODES; y++) /* a victim's node lost its block */
                if (y != x && r.id[y] != KVP_NIL &&
                    kvp__tier_find(r.t, tier_node_key(y)) == KVP_NIL)
                    r.id[y] = KVP_NIL;
            r.id[x] = id;
            r.pending[x] = id != KVP_NIL;
        } else if (r.pending[x]) { /* the store's confirmation */
            r.pending[x] = false;
            if (ok) {
                kvp__tier_ready(r.t, r.id[x], (uint32_t)(x % 4));
                model_release(&m, x);
            } else {
                kvp__tier_drop(r.t, r.id[x]);
                model_drop(&m, x);
                r.id[x] = KVP_NIL;
            }
        } else if (r.t->blocks[r.id[x]].ref > 0 && th_rand(&rng) % 2) { /* a load confirmed */
            kvp__tier_unpin(r.t, r.id[x], (uint32_t)(x % 4), ok);
            model_release(&m, x);
        } else { /* a load order: pin */
            kvp__tier_pin(r.t, r.id[x]);
            model_hit(&m, x);
        }
        tier_rig_compare(&r, &m, policy, seed, s);
    }
    kvp_cache_free(r.c);
}

Test(tier_policy, slru_matches_model, .timeout = 120)
{
    for (uint64_t seed = 1; seed <= 100; seed++)
        run_tier_random(KVP_EVICT_SLRU, seed, 600);
}

Test(tier_policy, s3fifo_matches_model, .timeout = 120)
{
    for (uint64_t seed = 1; seed <= 100; seed++)
        run_tier_random(KVP_EVICT_S3FIFO, seed, 600);
}
