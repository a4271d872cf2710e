/*
 * refmodel.c - the naive reference model of the kvprefix cache (see refmodel.h for the
 * model's data layout and why it never hashes; the shared test helpers are in testutil.c).
 *
 * Model invariants (kept by construction, no checker needed for code this small):
 *   - a block is free (ref 0, not indexed), cached (ref 0, indexed, in LRU order by stamp)
 *     or in use (ref > 0, indexed or a private block of one request);
 *   - outside collision-proof mode, no two indexed blocks have the same namespace and token
 *     prefix; in it, several may (a block whose parent left the index stays until evicted,
 *     and a new instance is stored beside it), but never two with the same parent_inst;
 *   - a request's committed blocks come first in its table; its first n_hit blocks are the
 *     hit blocks shared with the index;
 *   - collision-proof mode: every indexed block has a unique instance serial (inst), and a
 *     later block's parent_inst names an instance that was indexed when it was stored (it
 *     may have left the index since, and then the block never verifies again).
 */
#include "refmodel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RM_MAX_REQUESTS 256

typedef struct rm_block {
    uint32_t ref;         /* requests pinning the block */
    bool indexed;         /* holds a key (namespace + prefix) */
    size_t ns;            /* namespace number; valid when indexed */
    uint32_t *prefix;     /* owned copy of the tokens up to the end of this block; when indexed */
    size_t n_prefix;      /* tokens in prefix */
    uint64_t stamp;       /* LRU stamp; valid when cached (ref 0 and indexed) */
    uint64_t inst;        /* verify mode: instance serial of this indexing (> 0); when indexed */
    uint64_t parent_inst; /* verify mode: instance accepted before it; 0 for a first block */
} rm_block;

typedef struct rm_request {
    bool active;        /* between acquire and release */
    uint64_t id;        /* caller's request id */
    size_t ns;          /* namespace number */
    uint32_t *blocks;   /* model block numbers, in token order */
    size_t n_blocks;    /* blocks held */
    size_t n_committed; /* leading blocks already committed (hit blocks included) */
    uint64_t canon;     /* verify mode: instance accepted for block n_committed - 1 (the hit
                           block, the block deduplicated against or the request's own stored
                           block); 0 when n_committed is 0 */
} rm_request;

typedef struct rm_ns {
    bool present[4];        /* field present */
    size_t len[4];          /* field length */
    unsigned char *data[4]; /* owned copy of the field bytes (may be NULL when len 0) */
} rm_ns;

struct rm_model {
    uint32_t n_blocks;   /* pool size */
    uint32_t block_size; /* tokens per block */
    rm_block *blocks;    /* the pool */
    rm_request reqs[RM_MAX_REQUESTS];
    rm_ns *nss; /* every namespace seen */
    size_t n_nss;
    uint64_t clock;      /* LRU clock: ticks whenever a block becomes cached */
    kvp_stats st;        /* counters; the block counts are recomputed by rm_stats */
    bool verify;         /* collision-proof mode */
    uint64_t n_inst;     /* instance serials handed out (the last one) */
    uint64_t n_replaced; /* blocks removed with KVP_REMOVED_REPLACED: always 0 (never emitted) */
};

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "refmodel: out of memory\n");
        abort();
    }
    return p;
}

static const kvp_field *ns_field(const kvp_namespace *ns, int i)
{
    switch (i) {
    case 0:
        return &ns->model;
    case 1:
        return &ns->adapter;
    case 2:
        return &ns->tenant;
    default:
        return &ns->salt;
    }
}

static bool field_equal(const kvp_field *a, const kvp_field *b)
{
    if ((a->ptr == NULL) != (b->ptr == NULL))
        return false;
    if (a->ptr == NULL)
        return true;
    return a->len == b->len && (a->len == 0 || memcmp(a->ptr, b->ptr, a->len) == 0);
}

bool rm_namespace_equal(const kvp_namespace *a, const kvp_namespace *b)
{
    for (int i = 0; i < 4; i++)
        if (!field_equal(ns_field(a, i), ns_field(b, i)))
            return false;
    return true;
}

/* The namespace number of ns, adding a deep copy if it is new. */
static size_t ns_number(rm_model *m, const kvp_namespace *ns)
{
    for (size_t k = 0; k < m->n_nss; k++) {
        rm_ns *s = &m->nss[k];
        bool eq = true;
        for (int i = 0; i < 4 && eq; i++) {
            const kvp_field *f = ns_field(ns, i);
            if (s->present[i] != (f->ptr != NULL))
                eq = false;
            else if (f->ptr &&
                     (s->len[i] != f->len || (f->len && memcmp(s->data[i], f->ptr, f->len) != 0)))
                eq = false;
        }
        if (eq)
            return k;
    }
    m->nss = realloc(m->nss, (m->n_nss + 1) * sizeof(*m->nss));
    if (!m->nss)
        abort();
    rm_ns *s = &m->nss[m->n_nss];
    for (int i = 0; i < 4; i++) {
        const kvp_field *f = ns_field(ns, i);
        s->present[i] = f->ptr != NULL;
        s->len[i] = f->ptr ? f->len : 0;
        s->data[i] = NULL;
        if (s->len[i]) {
            s->data[i] = xmalloc(s->len[i]);
            memcpy(s->data[i], f->ptr, s->len[i]);
        }
    }
    return m->n_nss++;
}

rm_model *rm_new(uint32_t n_blocks, uint32_t block_size, bool verify)
{
    rm_model *m = xmalloc(sizeof(*m));
    memset(m, 0, sizeof(*m));
    m->n_blocks = n_blocks;
    m->block_size = block_size;
    m->blocks = xmalloc(n_blocks * sizeof(*m->blocks));
    memset(m->blocks, 0, n_blocks * sizeof(*m->blocks));
    m->st.n_blocks_total = n_blocks;
    m->verify = verify;
    return m;
}

void rm_free(rm_model *m)
{
    if (!m)
        return;
    for (uint32_t b = 0; b < m->n_blocks; b++)
        free(m->blocks[b].prefix);
    free(m->blocks);
    for (size_t r = 0; r < RM_MAX_REQUESTS; r++)
        free(m->reqs[r].blocks);
    for (size_t k = 0; k < m->n_nss; k++)
        for (int i = 0; i < 4; i++)
            free(m->nss[k].data[i]);
    free(m->nss);
    free(m);
}

static bool is_free(const rm_block *b)
{
    return b->ref == 0 && !b->indexed;
}

static bool is_cached(const rm_block *b)
{
    return b->ref == 0 && b->indexed;
}

static uint32_t count_free(const rm_model *m)
{
    uint32_t n = 0;
    for (uint32_t b = 0; b < m->n_blocks; b++)
        n += is_free(&m->blocks[b]);
    return n;
}

static uint32_t count_cached(const rm_model *m)
{
    uint32_t n = 0;
    for (uint32_t b = 0; b < m->n_blocks; b++)
        n += is_cached(&m->blocks[b]);
    return n;
}

static void unindex(rm_block *b)
{
    b->indexed = false;
    free(b->prefix);
    b->prefix = NULL;
    b->n_prefix = 0;
    b->inst = 0;
    b->parent_inst = 0;
}

/* Index block b as a new instance whose accepted predecessor was parent_inst (0 for a first
 * block). Returns the new instance serial. */
static uint64_t index_block(rm_model *m, uint32_t b, size_t ns, const uint32_t *tokens,
                            size_t n_prefix, uint64_t parent_inst)
{
    rm_block *bl = &m->blocks[b];
    bl->indexed = true;
    bl->ns = ns;
    bl->prefix = xmalloc(n_prefix * sizeof(uint32_t));
    memcpy(bl->prefix, tokens, n_prefix * sizeof(uint32_t));
    bl->n_prefix = n_prefix;
    bl->inst = ++m->n_inst;
    bl->parent_inst = parent_inst;
    return bl->inst;
}

/* May indexed block b (found under the key of block i) stand for block i of a chain whose
 * accepted block i - 1 is instance prev_inst? Keys are exact in the model, so namespace and
 * tokens already agree and a first block always verifies; a later one only if it was stored
 * after exactly that instance. Always true outside collision-proof mode. */
static bool verifies(const rm_model *m, long b, size_t i, uint64_t prev_inst)
{
    return !m->verify || i == 0 || m->blocks[b].parent_inst == prev_inst;
}

/* The indexed block that may stand for block i of namespace ns's chain (tokens[0 ..
 * n_prefix)) after the accepted instance prev_inst, or -1. Outside collision-proof mode
 * that is the one block holding the prefix. In it, several instances may hold the prefix
 * and the one stored after prev_inst is chosen (there is at most one); *any says whether
 * some instance held the prefix at all (a reject when none verifies). Nothing is ever
 * removed here: a block that does not verify stays as it is. */
static long find_verified(const rm_model *m, size_t ns, const uint32_t *tokens, size_t n_prefix,
                          size_t i, uint64_t prev_inst, bool *any)
{
    *any = false;
    for (uint32_t b = 0; b < m->n_blocks; b++) {
        const rm_block *bl = &m->blocks[b];
        if (!bl->indexed || bl->ns != ns || bl->n_prefix != n_prefix ||
            memcmp(bl->prefix, tokens, n_prefix * sizeof(uint32_t)) != 0)
            continue;
        *any = true;
        if (verifies(m, b, i, prev_inst))
            return (long)b;
    }
    return -1;
}

/* Take one block for new data: a free block first, else the least recently used cached
 * block not in skip[] (which it evicts). Returns the block number or -1. */
static long take_block(rm_model *m, const bool *skip)
{
    for (uint32_t b = 0; b < m->n_blocks; b++)
        if (is_free(&m->blocks[b]) && !(skip && skip[b]))
            return (long)b;
    long victim = -1;
    for (uint32_t b = 0; b < m->n_blocks; b++) {
        const rm_block *bl = &m->blocks[b];
        if (is_cached(bl) && !(skip && skip[b]) &&
            (victim < 0 || bl->stamp < m->blocks[victim].stamp))
            victim = (long)b;
    }
    if (victim >= 0) {
        unindex(&m->blocks[victim]);
        m->st.n_evictions++;
    }
    return victim;
}

static rm_request *find_request(rm_model *m, uint64_t req_id)
{
    for (size_t r = 0; r < RM_MAX_REQUESTS; r++)
        if (m->reqs[r].active && m->reqs[r].id == req_id)
            return &m->reqs[r];
    return NULL;
}

/* The match of tokens in namespace number ns; also the model block of each cached block in
 * hit[] (which has room for n_tokens / block_size entries) when hit is not NULL. The walk
 * covers every full block (not only those under the at-least-one-token cap). In
 * collision-proof mode a prefix that is indexed but under which no instance verifies ends
 * the walk and counts one reject. */
static void match(rm_model *m, size_t ns, const uint32_t *tokens, size_t n_tokens, kvp_match *out,
                  long *hit)
{
    size_t bs = m->block_size;
    size_t n_full = n_tokens / bs;
    size_t n_cached = 0;
    uint64_t prev_inst = 0;
    while (n_cached < n_full) {
        bool any;
        long b = find_verified(m, ns, tokens, (n_cached + 1) * bs, n_cached, prev_inst, &any);
        if (b < 0) {
            m->st.n_verify_rejects += any && m->verify;
            break;
        }
        prev_inst = m->blocks[b].inst;
        if (hit)
            hit[n_cached] = b;
        n_cached++;
    }
    size_t cap = (n_tokens - 1) / bs;
    out->n_tokens = n_tokens;
    out->n_blocks_full = (uint32_t)n_full;
    out->n_blocks_cached = (uint32_t)n_cached;
    out->n_blocks_hit = (uint32_t)(n_cached < cap ? n_cached : cap);
    out->n_tokens_hit = (uint64_t)out->n_blocks_hit * bs;
    out->n_blocks_stored = 0;
}

static void count_request(rm_model *m, const kvp_match *mt)
{
    m->st.n_requests++;
    m->st.n_tokens_queried += mt->n_tokens;
    m->st.n_tokens_hit += mt->n_tokens_hit;
    m->st.n_blocks_hit += mt->n_blocks_hit;
    m->st.n_blocks_missed += mt->n_blocks_full - mt->n_blocks_hit;
}

int rm_lookup(rm_model *m, const kvp_namespace *ns, const uint32_t *tokens, size_t n_tokens,
              kvp_match *out)
{
    if (!ns || !tokens || !out || n_tokens == 0)
        return KVP_EINVAL;
    match(m, ns_number(m, ns), tokens, n_tokens, out, NULL);
    m->st.n_lookups++;
    return KVP_OK;
}

static size_t blocks_for(const rm_model *m, size_t n_tokens)
{
    return (n_tokens + m->block_size - 1) / m->block_size;
}

int rm_acquire(rm_model *m, uint64_t req_id, const kvp_namespace *ns, const uint32_t *tokens,
               size_t n_tokens, size_t n_capacity, kvp_match *out)
{
    if (!ns || !tokens || !out || n_tokens == 0)
        return KVP_EINVAL;
    if (find_request(m, req_id))
        return KVP_EEXIST;
    size_t need = blocks_for(m, n_tokens > n_capacity ? n_tokens : n_capacity);
    /* A request larger than the whole pool fails before matching (no reject is counted). */
    if (need > m->n_blocks)
        return KVP_ETOOBIG;
    size_t nsn = ns_number(m, ns);
    long *hit = xmalloc((n_tokens / m->block_size + 1) * sizeof(long));
    kvp_match mt;
    uint64_t rejects_before = m->st.n_verify_rejects;
    match(m, nsn, tokens, n_tokens, &mt, hit);

    /* Evictable blocks that the hits would pin are not available for fresh blocks. */
    size_t hit_cached = 0;
    for (uint32_t i = 0; i < mt.n_blocks_hit; i++)
        hit_cached += is_cached(&m->blocks[hit[i]]);
    size_t avail = count_free(m) + count_cached(m) - hit_cached;
    if (need - mt.n_blocks_hit > avail) {
        m->st.n_verify_rejects = rejects_before; /* a failed call changes nothing */
        free(hit);
        return KVP_ENOSPC;
    }
    rm_request *r = NULL;
    for (size_t k = 0; k < RM_MAX_REQUESTS && !r; k++)
        if (!m->reqs[k].active)
            r = &m->reqs[k];
    if (!r)
        abort();
    free(r->blocks);
    r->blocks = xmalloc(need * sizeof(uint32_t));
    r->active = true;
    r->id = req_id;
    r->ns = nsn;
    r->n_blocks = need;
    r->n_committed = mt.n_blocks_hit;
    r->canon = mt.n_blocks_hit ? m->blocks[hit[mt.n_blocks_hit - 1]].inst : 0;
    for (uint32_t i = 0; i < mt.n_blocks_hit; i++) {
        m->blocks[hit[i]].ref++;
        r->blocks[i] = (uint32_t)hit[i];
    }
    for (size_t i = mt.n_blocks_hit; i < need; i++) {
        long b = take_block(m, NULL);
        if (b < 0)
            abort(); /* counted above */
        m->blocks[b].ref = 1;
        r->blocks[i] = (uint32_t)b;
    }
    free(hit);
    count_request(m, &mt);
    *out = mt;
    return KVP_OK;
}

int rm_grow(rm_model *m, uint64_t req_id, size_t n_capacity)
{
    rm_request *r = find_request(m, req_id);
    if (!r)
        return KVP_ENOENT;
    size_t need = blocks_for(m, n_capacity);
    if (need <= r->n_blocks)
        return KVP_OK;
    if (need > m->n_blocks)
        return KVP_ETOOBIG;
    if (need - r->n_blocks > (size_t)count_free(m) + count_cached(m))
        return KVP_ENOSPC;
    uint32_t *nb = xmalloc(need * sizeof(uint32_t));
    memcpy(nb, r->blocks, r->n_blocks * sizeof(uint32_t));
    free(r->blocks);
    r->blocks = nb;
    for (size_t i = r->n_blocks; i < need; i++) {
        long b = take_block(m, NULL);
        if (b < 0)
            abort();
        m->blocks[b].ref = 1;
        r->blocks[i] = (uint32_t)b;
    }
    r->n_blocks = need;
    return KVP_OK;
}

int rm_commit(rm_model *m, uint64_t req_id, const uint32_t *tokens, size_t n_tokens,
              size_t *n_stored)
{
    if (!tokens)
        return KVP_EINVAL;
    rm_request *r = find_request(m, req_id);
    if (!r)
        return KVP_ENOENT;
    size_t n_full = n_tokens / m->block_size;
    if (n_full > r->n_blocks)
        return KVP_ERANGE;
    if (n_full < r->n_committed)
        return KVP_EINVAL;
    size_t stored = 0;
    for (size_t i = r->n_committed; i < n_full; i++) {
        size_t n_prefix = (i + 1) * m->block_size;
        bool any;
        long b = find_verified(m, r->ns, tokens, n_prefix, i, r->canon, &any);
        if (b >= 0) {
            m->st.n_blocks_deduped++;
            r->canon = m->blocks[b].inst;
            continue;
        }
        m->st.n_verify_rejects += any && m->verify;
        r->canon = index_block(m, r->blocks[i], r->ns, tokens, n_prefix, r->canon);
        stored++;
    }
    r->n_committed = n_full;
    m->st.n_blocks_stored += stored;
    if (n_stored)
        *n_stored = stored;
    return KVP_OK;
}

int rm_release(rm_model *m, uint64_t req_id)
{
    rm_request *r = find_request(m, req_id);
    if (!r)
        return KVP_ENOENT;
    for (size_t i = r->n_blocks; i-- > 0;) {
        rm_block *b = &m->blocks[r->blocks[i]];
        if (--b->ref == 0 && b->indexed)
            b->stamp = ++m->clock;
    }
    r->active = false;
    r->n_blocks = 0;
    r->n_committed = 0;
    return KVP_OK;
}

int rm_access(rm_model *m, const kvp_namespace *ns, const uint32_t *tokens, size_t n_tokens,
              kvp_match *out)
{
    if (!ns || !tokens || !out || n_tokens == 0)
        return KVP_EINVAL;
    size_t nsn = ns_number(m, ns);
    kvp_match mt;
    long *hit = xmalloc((n_tokens / m->block_size + 1) * sizeof(long));
    match(m, nsn, tokens, n_tokens, &mt, hit);
    count_request(m, &mt);

    /* Walk the full blocks in order, holding each one (found or newly placed) so it cannot
     * be chosen as a victim for a later block; stop at the first block with no room. The
     * matched run is held as is; past it, a prefix that is indexed with no instance that
     * verifies after the block held before it counts one reject (when the match stopped on
     * that same block, the match's reject is the one), and a fresh block is stored beside
     * the instances that did not verify. */
    bool *held = xmalloc(m->n_blocks * sizeof(bool));
    memset(held, 0, m->n_blocks * sizeof(bool));
    uint32_t *order = xmalloc((mt.n_blocks_full + 1) * sizeof(uint32_t));
    size_t n_held = 0;
    uint64_t prev_inst = 0;
    for (size_t i = 0; i < mt.n_blocks_full; i++) {
        size_t n_prefix = (i + 1) * m->block_size;
        long b = i < mt.n_blocks_cached ? hit[i] : -1;
        if (i >= mt.n_blocks_cached) {
            bool any, counted = i == mt.n_blocks_cached;
            b = find_verified(m, nsn, tokens, n_prefix, i, prev_inst, &any);
            if (b < 0 && any && m->verify && !counted)
                m->st.n_verify_rejects++;
        }
        if (b < 0) {
            b = take_block(m, held);
            if (b < 0)
                break;
            index_block(m, (uint32_t)b, nsn, tokens, n_prefix, prev_inst);
            m->st.n_blocks_stored++;
            mt.n_blocks_stored++;
        }
        held[b] = true;
        prev_inst = m->blocks[b].inst;
        order[n_held++] = (uint32_t)b;
    }
    /* Touch from the last to the first: parents end up at least as recent as children. */
    for (size_t i = n_held; i-- > 0;) {
        rm_block *bl = &m->blocks[order[i]];
        if (bl->ref == 0)
            bl->stamp = ++m->clock;
    }
    free(order);
    free(held);
    free(hit);
    *out = mt;
    return KVP_OK;
}

int rm_reset(rm_model *m)
{
    for (uint32_t b = 0; b < m->n_blocks; b++)
        if (is_cached(&m->blocks[b]))
            unindex(&m->blocks[b]);
    return KVP_OK;
}

void rm_stats(const rm_model *m, kvp_stats *out)
{
    *out = m->st;
    out->n_blocks_total = m->n_blocks;
    out->n_blocks_free = count_free(m);
    out->n_blocks_cached = count_cached(m);
    out->n_blocks_in_use = m->n_blocks - out->n_blocks_free - out->n_blocks_cached;
    uint32_t n_active = 0;
    for (size_t r = 0; r < RM_MAX_REQUESTS; r++)
        n_active += m->reqs[r].active;
    out->n_requests_active = n_active;
}

size_t rm_request_n_blocks(const rm_model *m, uint64_t req_id)
{
    const rm_request *r = find_request((rm_model *)m, req_id);
    return r ? r->n_blocks : 0;
}

size_t rm_request_n_committed(const rm_model *m, uint64_t req_id)
{
    const rm_request *r = find_request((rm_model *)m, req_id);
    return r ? r->n_committed : 0;
}

bool rm_request_active(const rm_model *m, uint64_t req_id)
{
    return find_request((rm_model *)m, req_id) != NULL;
}

uint64_t rm_n_replaced(const rm_model *m)
{
    return m->n_replaced;
}

const char *rm_stats_diff(const kvp_stats *a, const kvp_stats *b, uint64_t *a_val, uint64_t *b_val)
{
#define S(x)                                                                                       \
    if (a->x != b->x) {                                                                            \
        *a_val = a->x;                                                                             \
        *b_val = b->x;                                                                             \
        return #x;                                                                                 \
    }
    S(n_blocks_total);
    S(n_blocks_free);
    S(n_blocks_cached);
    S(n_blocks_in_use);
    S(n_requests_active);
    S(n_requests);
    S(n_lookups);
    S(n_tokens_queried);
    S(n_tokens_hit);
    S(n_blocks_hit);
    S(n_blocks_missed);
    S(n_blocks_stored);
    S(n_blocks_deduped);
    S(n_evictions);
    S(n_verify_rejects);
#undef S
    return NULL;
}
