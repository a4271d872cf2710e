/*
 * lifecycle.c - what an engine calls per request: lookup, acquire, grow, commit, release,
 * and the one-shot access used by replay and simulation.
 *
 *   kvp_lookup ──> kvp_acquire ──> (prefill) kvp_commit ──> (decode) kvp_grow/kvp_commit
 *   (read-only)    pin hits,                register full        ──> kvp_release
 *                  take fresh blocks        blocks by key             unpin tail first
 *
 * Every mutating entry point follows the same order: (1) validate arguments, (2) make every
 * allocation it could need (request record, block table, scratch arrays, interned
 * namespace), (3) check that the pool can supply the blocks, and only then (4) change the
 * cache. Step 4 cannot fail (index adds never allocate, see index.c), so a call that
 * returns an error has changed nothing.
 *
 * Matching walks the prompt block by block from the namespace root and stops at the first
 * key that is not indexed (or, in collision-proof mode, under which no candidate block
 * verifies: several blocks may share a key there, see index.c and find_verified);
 * keys are hashed in growing batches ahead of their probes (see match_mode). Cost per
 * block: one block hash of the cache's profile (XXH3-128 over 16 + 4 * block_size bytes
 * for xxh3 and keyed, inlined for 16-token blocks; hash_profile.c for the others) and one
 * hash-table probe, about 95 ns in a 1M-block cache (docs/performance.md); nothing
 * allocates. Under vllm-* the chain value is 256 bits wide: a walk and a request carry
 * its high half next to the key (last_high), the index keys on the low 128 bits.
 */
#include <string.h>

#include "blockhash.h"
#include "tier.h"

/* Where a match gets block i's key. Keys must be requested in order 0, 1, 2, ... */
typedef struct keysrc {
    const uint32_t *tokens; /* token mode: the prompt (also used for verification) */
    const kvp_key *ids;     /* external-id mode: the caller's ids, scoped by root */
    const kvp_key *keys;    /* precomputed mode: keys already scoped (kvp_access) */
    kvp_key root;           /* namespace root */
    kvp_key prev;           /* token mode: key of the block before the next one */
    uint32_t ns;            /* verify mode: interned namespace id, KVP_NIL if unknown */
    kvp_key prev_high;      /* token mode, vllm-sha256: high half of the chain value */
    kvp_key start;          /* the chain value before block 0 (its key): root or NONE_HASH */
    kvp__vctx vx;           /* token mode, vllm-*: the namespace's extra keys */
    kvp__qgroup *qg;        /* kvp_access with quotas on: the namespace's group, else NULL */
    kvp_key *ahead;         /* or NULL; 16-token modes: match copies the keys it hashed from
                               its first miss on here (2 * MATCH_BATCH at most) */
    uint32_t n_ahead;       /* keys match copied to ahead */
} keysrc;

enum { SRC_KEYS, SRC_IDS, SRC_IDS_XXH3, SRC_IDS_KEYED, SRC_TOKENS, SRC_TOKENS16, SRC_KEYED16 };

/* Set the chain start of a token-mode src whose root is set (any profile). */
static void src_start(const kvp_cache *cache, keysrc *src, const kvp_namespace *ns)
{
    kvp__hasher_start(&cache->hasher, src->root, &src->prev, &src->prev_high);
    src->start = src->prev;
    src->vx = kvp__hasher_vctx(ns);
}

/* Key i of src in the given mode; the mode is a constant in each specialised walk, so the
 * branches below fold away (and with 16-token blocks the hash input has a constant size). */
static KVP__ALWAYS_INLINE kvp_key src_key(const kvp_cache *cache, keysrc *src, size_t i, int mode)
{
    if (mode == SRC_KEYS)
        return src->keys[i];
    if (mode == SRC_IDS)
        return kvp__cache_external_key(cache, src->root, src->ids[i]);
    if (mode == SRC_IDS_XXH3)
        return kvp__external_key_seed(cache->hasher.seed, src->root, src->ids[i]);
    if (mode == SRC_IDS_KEYED)
        return kvp__external_key_secret(cache->hasher.secret, src->root, src->ids[i]);
    if (mode == SRC_TOKENS16)
        src->prev = kvp__hash_block16(cache->hasher.seed, src->prev, src->tokens + i * 16);
    else if (mode == SRC_KEYED16)
        src->prev = kvp__hash_block16_secret(cache->hasher.secret, src->prev, src->tokens + i * 16);
    else
        kvp__cache_chain(cache, &src->vx, &src->prev, &src->prev_high,
                         src->tokens + i * cache->cfg.block_size, i);
    return src->prev;
}

/* Collision-proof mode: the first block indexed under key, starting at candidate b and
 * going on along the bucket chain, that verifies as the query's block (these tokens, after
 * the accepted instance canon, or in namespace ns for a first block); KVP_NIL if none does.
 * At most one candidate can verify: two indexed blocks with equal tokens and provenance
 * would have been deduplicated when the second was committed. Cannot fail. */
static uint32_t find_verified(const kvp_cache *cache, const kvp__block *b, kvp_key key,
                              const uint32_t *tokens, kvp__vref canon, uint32_t ns)
{
    for (; b; b = kvp__index_find_next(&cache->index, b, key)) {
        uint32_t id = (uint32_t)(b - cache->pool.blocks);
        if (kvp__verify_block(cache, id, tokens, canon, ns))
            return id;
    }
    return KVP_NIL;
}

/* The result of walking the cached chain. */
typedef struct walk {
    uint32_t n_cached; /* cached (and verified) blocks from the start */
    bool rejected;     /* the walk stopped at a block that failed verification */
    kvp_key last_key;  /* key of block min(n_cached, cap) - 1, or the chain start */
    uint32_t last_id;  /* that block's id, or KVP_NIL */
    kvp_key last_high; /* vllm-sha256: the high half of that block's chain value */
} walk;

#define MATCH_BATCH 32 /* keys hashed ahead of the probes, at most */

/* One batch of a match in flight: its keys, and the chains they map to. */
typedef struct match_batch {
    uint32_t i0, n;                           /* blocks i0 .. i0 + n - 1 */
    bool ready;                               /* steps 1 and 3 done: keys and heads set */
    kvp_key keys[MATCH_BATCH];                /* their keys */
    kvp_key highs[MATCH_BATCH];               /* SRC_TOKENS: their chain values' high halves */
    const UT_hash_handle *heads[MATCH_BATCH]; /* their buckets' first entries (step 2) */
} match_batch;

/* Step 1 of match_mode: hash the keys of blocks t->i0 .. t->i0 + t->n - 1 and prefetch
 * their buckets. */
static KVP__ALWAYS_INLINE void batch_hash(kvp_cache *cache, keysrc *src, match_batch *t,
                                          uint32_t n_full, kvp__probe_view view, int mode)
{
    const size_t bs = cache->cfg.block_size;
    for (uint32_t j = 0; j < t->n; j++) {
        uint32_t i = t->i0 + j;
        if (mode >= SRC_TOKENS && i + 8 < n_full)
            KVP__PREFETCH(src->tokens + (size_t)(i + 8) * bs);
        t->keys[j] = src_key(cache, src, i, mode);
        if (mode == SRC_TOKENS)
            t->highs[j] = src->prev_high;
        kvp__prefetch_bucket(view, t->keys[j]);
    }
}

/* Step 3: read each bucket's first entry and prefetch it. */
static KVP__ALWAYS_INLINE void batch_heads(match_batch *t, kvp__probe_view view)
{
    for (uint32_t j = 0; j < t->n; j++)
        t->heads[j] = kvp__prefetch_entry(view, t->keys[j]);
}

/* Step 2: where a chain's first entry (prefetched in step 3) is another key's, prefetch the
 * second, which the probe would otherwise wait for: with one bucket per block a hit finds
 * another entry ahead of its own in about a third of the probes. */
static KVP__ALWAYS_INLINE void batch_seconds(match_batch *t)
{
    for (uint32_t j = 0; j < t->n; j++) {
        const UT_hash_handle *hh = t->heads[j];
        if (hh && hh->hashv != (unsigned)t->keys[j].lo && hh->hh_next)
            kvp__prefetch_handle(hh->hh_next);
    }
}

/* Copy the keys a walk hashed from its first miss (block j of cur) on, the first n_next of
 * next included, to ahead; returns how many. Cannot fail. */
static uint32_t keep_ahead(kvp_key *ahead, const match_batch *cur, uint32_t j, uint32_t n_next,
                           const match_batch *next)
{
    uint32_t n = cur->n - j;
    memcpy(ahead, cur->keys + j, n * sizeof *ahead);
    memcpy(ahead + n, next->keys, n_next * sizeof *ahead);
    return n + n_next;
}

/* Match blocks 0 .. n_full-1 against the index. Writes the ids of the first min(n_cached,
 * cap) blocks to ids. Changes nothing but n_verify_rejects. Cannot fail.
 *
 * A probe is a chain of dependent cache misses (bucket, then entry), and the next key does
 * not depend on the probe's answer, so keys are hashed in batches ahead of their probes, and
 * two batches are in flight at once: while the keys of batch k + 1 are hashed (the long,
 * compute-bound step), the entries of batch k, prefetched before, arrive, and the buckets of
 * batch k + 1 arrive while batch k is probed. The loads that wait for memory are kept in
 * short loops of their own (steps 2 to 4), so the processor's window holds a whole batch of
 * them at once; a loop that hashed and probed in turn would hold only a couple. Batches
 * grow 1, 2, 4, ... up to MATCH_BATCH and overlap only from the second full one on (block
 * 63), so a prompt that misses at block k < 63 hashes at most 2k + 1 blocks (a full miss
 * hashes one), as without the overlap, and one that misses later at most 2 * MATCH_BATCH
 * more than it matched (in workload (c) a cached system prompt ends at block 16 to 128). Batching
 * took a cached 128k-token lookup in a 1M-block cache from 4.65 ms to under 1 ms (bench_core (b));
 * docs/performance.md gives the figures of the two-batch pipeline.
 *
 * Per batch k from block 63 on (before it, steps 1 and 3 for batch k + 1 follow step 4):
 *   Step 1: hash batch k + 1's keys, prefetch their buckets;
 *   Step 2: prefetch the second chain entry of batch k's keys whose first entry is another's;
 *   Step 3: read batch k + 1's buckets, prefetch their first entries;
 *   Step 4: probe batch k in order (verify in collision-proof mode), stop at the first miss. */
static KVP__ALWAYS_INLINE walk match_mode(kvp_cache *cache, keysrc *src, uint32_t n_full,
                                          uint32_t *ids, size_t cap, int mode)
{
    assert(ids || cap == 0);
    assert(!kvp__verifying(cache) || src->tokens); /* verification compares tokens */
    walk w = {0, false, src->start, KVP_NIL, src->prev_high};
    kvp__vref prev = KVP__VREF_NONE;
    const size_t bs = cache->cfg.block_size;
    const bool verifying = kvp__verifying(cache);
    const kvp__probe_view view = kvp__index_view(&cache->index);
    match_batch tb[2];
    match_batch *cur = &tb[0], *next = &tb[1];
    cur->i0 = 0;
    cur->n = n_full ? 1 : 0;
    cur->ready = false;
    while (cur->n) {
        /* Step 1: the next batch's keys (ahead of this batch's probes from block 63 on;
         * before, after them, so that a short match wastes no more hashing than one
         * batch). Steps 1 and 3 have one call site, so that each mode's copy of this walk
         * inlines its hash once. */
        const bool overlap = cur->i0 >= 2 * MATCH_BATCH - 1;
        next->i0 = cur->i0 + cur->n;
        next->n = cur->n < MATCH_BATCH / 2 ? 2 * cur->n : MATCH_BATCH;
        if (next->n > n_full - next->i0)
            next->n = n_full - next->i0;
        next->ready = false;
        match_batch *t = cur->ready ? (overlap ? next : NULL) : cur;
        while (t) {
            batch_hash(cache, src, t, n_full, view, mode);
            /* Step 3: its first entries. */
            batch_heads(t, view);
            t->ready = true;
            t = t == cur && overlap ? next : NULL;
        }
        /* Step 2: this batch's second entries. */
        if (overlap)
            batch_seconds(cur);
        /* Step 4: probe this batch. */
        for (uint32_t j = 0; j < cur->n; j++) {
            const uint32_t i = cur->i0 + j;
            kvp__block *b = kvp__index_scan(cur->heads[j], cur->keys[j]);
            if (!b) {
                if ((mode == SRC_TOKENS16 || mode == SRC_KEYED16) && src->ahead)
                    src->n_ahead = keep_ahead(src->ahead, cur, j, next->ready ? next->n : 0, next);
                return w;
            }
            uint32_t id = (uint32_t)(b - cache->pool.blocks);
            const uint32_t *blk_tokens = verifying ? src->tokens + (size_t)i * bs : NULL;
            if (verifying && !kvp__verify_block(cache, id, blk_tokens, prev, src->ns)) {
                id = find_verified(cache, b, cur->keys[j], blk_tokens, prev, src->ns);
                if (id == KVP_NIL) {
                    kvp__count_reject(cache);
                    w.rejected = true;
                    return w;
                }
            }
            if (i < cap) {
                ids[i] = id;
                w.last_key = cur->keys[j];
                w.last_id = id;
                if (mode == SRC_TOKENS)
                    w.last_high = cur->highs[j];
            }
            prev = kvp__vref_of(cache, id);
            w.n_cached++;
        }
        match_batch *done = cur;
        cur = next;
        next = done;
    }
    return w;
}

static walk match(kvp_cache *cache, keysrc *src, uint32_t n_full, uint32_t *ids, size_t cap)
{
    if (src->keys)
        return match_mode(cache, src, n_full, ids, cap, SRC_KEYS);
    if (src->ids && cache->key_bits == 128 && cache->hasher.profile == KVP_HASH_KEYED)
        return match_mode(cache, src, n_full, ids, cap, SRC_IDS_KEYED);
    if (src->ids && cache->key_bits == 128 && cache->hasher.profile == KVP_HASH_XXH3)
        return match_mode(cache, src, n_full, ids, cap, SRC_IDS_XXH3);
    if (src->ids)
        return match_mode(cache, src, n_full, ids, cap, SRC_IDS);
    if (cache->cfg.block_size == 16 && cache->key_bits == 128 &&
        cache->hasher.profile == KVP_HASH_XXH3)
        return match_mode(cache, src, n_full, ids, cap, SRC_TOKENS16);
    if (cache->cfg.block_size == 16 && cache->key_bits == 128 &&
        cache->hasher.profile == KVP_HASH_KEYED)
        return match_mode(cache, src, n_full, ids, cap, SRC_KEYED16);
    return match_mode(cache, src, n_full, ids, cap, SRC_TOKENS);
}

/* Common argument checks for a prompt whose data (tokens, ids or root) is the argument
 * named what: KVP_OK with *n_full set, or an error. */
static int check_prompt(const kvp_cache *cache, const kvp_namespace *ns, const void *data,
                        const char *what, size_t n_tokens, uint32_t *n_full)
{
    if (!cache)
        return kvp__fail(KVP_EINVAL, "cache is NULL");
    if (!data)
        return kvp__fail(KVP_EINVAL, "%s is NULL", what);
    if (n_tokens == 0)
        return kvp__fail(KVP_EINVAL, "n_tokens is 0: a prompt has at least one token");
    int rc = kvp__ns_valid(ns);
    if (rc == KVP_OK)
        rc = kvp__hasher_ns_check(&cache->hasher, ns);
    if (rc != KVP_OK)
        return rc;
    size_t full = n_tokens / cache->cfg.block_size;
    if (full >= KVP_NIL)
        return kvp__fail(KVP_EOVERFLOW,
                         "n_tokens is %zu: %zu full blocks of %" PRIu32 ", 2^32 - 1 or more",
                         n_tokens, full, cache->cfg.block_size);
    *n_full = (uint32_t)full;
    return KVP_OK;
}

/* Blocks the engine may reuse: at least one prompt token is always computed. */
static inline uint32_t hit_limit(const kvp_cache *cache, size_t n_tokens)
{
    return (uint32_t)((n_tokens - 1) / cache->cfg.block_size);
}

static void fill_match(const kvp_cache *cache, size_t n_tokens, uint32_t n_full, uint32_t n_cached,
                       kvp_match *out)
{
    uint32_t limit = hit_limit(cache, n_tokens);
    out->n_tokens = n_tokens;
    out->n_blocks_full = n_full;
    out->n_blocks_cached = n_cached;
    out->n_blocks_hit = n_cached < limit ? n_cached : limit;
    out->n_tokens_hit = (uint64_t)out->n_blocks_hit * cache->cfg.block_size;
    out->n_blocks_stored = 0;
}

static void count_request(kvp_cache *cache, const kvp_match *m)
{
    cache->stats.n_requests++;
    cache->stats.n_tokens_queried += m->n_tokens;
    cache->stats.n_tokens_hit += m->n_tokens_hit;
    cache->stats.n_blocks_hit += m->n_blocks_hit;
    cache->stats.n_blocks_missed += m->n_blocks_full - m->n_blocks_hit;
}

static int lookup_common(kvp_cache *cache, keysrc *src, size_t n_tokens, uint32_t n_full,
                         uint32_t *block_ids, size_t cap, kvp_match *out)
{
    if (!out)
        return kvp__fail(KVP_EINVAL, "out is NULL");
    if (!block_ids && cap)
        return kvp__fail(KVP_EINVAL, "block_ids is NULL but cap is %zu", cap);
    uint32_t limit = hit_limit(cache, n_tokens);
    walk w = match(cache, src, n_full, block_ids, cap < limit ? cap : limit);
    fill_match(cache, n_tokens, n_full, w.n_cached, out);
    atomic_fetch_add_explicit(&cache->n_lookups, 1, memory_order_relaxed);
    return KVP_OK;
}

int kvp__lookup_locked(kvp_cache *cache, const kvp_namespace *ns, const uint32_t *tokens,
                       size_t n_tokens, uint32_t *block_ids, size_t cap, kvp_match *out)
{
    uint32_t n_full = 0; /* set by check_prompt when it succeeds (GCC cannot see it) */
    int rc = check_prompt(cache, ns, tokens, "tokens", n_tokens, &n_full);
    if (rc == KVP_OK)
        rc = kvp__hasher_tokens_check(&cache->hasher, tokens, n_tokens);
    if (rc != KVP_OK)
        return rc;
    keysrc src = {.tokens = tokens, .root = kvp__cache_root(cache, ns), .ns = KVP_NIL};
    src_start(cache, &src, ns);
    if (kvp__verifying(cache))
        src.ns = kvp__verify_ns_find(cache, ns, src.root);
    return lookup_common(cache, &src, n_tokens, n_full, block_ids, cap, out);
}

/* Checks for the precomputed-key forms: keys may be NULL only when there are no full
 * blocks, and collision-proof mode needs the tokens to verify against. */
static int check_keys(const kvp_cache *cache, const kvp_key **keys, const uint32_t *tokens,
                      uint32_t n_full, bool keeps_chain)
{
    static const kvp_key no_keys; /* lets keys be NULL when there are none */
    if (!*keys && n_full == 0)
        *keys = &no_keys;
    if (!*keys)
        return kvp__fail(KVP_EINVAL, "keys is NULL but the prompt has %" PRIu32 " full blocks",
                         n_full);
    if (kvp__verifying(cache) && !tokens)
        return kvp__fail(KVP_EINVAL,
                         "tokens is NULL: a verify_tokens cache verifies every match against them");
    /* A request continues its chain from its last key; under vllm-sha256 the chain value is
     * 256 bits and a kvp_key holds only the index's 128 of them. */
    if (keeps_chain && cache->hasher.profile == KVP_HASH_VLLM_SHA256)
        return kvp__fail(KVP_ENOTSUP, "keys cannot start a request under vllm-sha256-cbor: its "
                                      "256-bit chain does not fit a kvp_key (use kvp_acquire)");
    return KVP_OK;
}

int kvp__lookup_keys_locked(kvp_cache *cache, const kvp_namespace *ns, kvp_key root,
                            const kvp_key *keys, const uint32_t *tokens, size_t n_tokens,
                            uint32_t *block_ids, size_t cap, kvp_match *out)
{
    uint32_t n_full = 0; /* set by check_prompt when it succeeds */
    int rc = check_prompt(cache, ns, &root, "root", n_tokens, &n_full);
    if (rc == KVP_OK)
        rc = check_keys(cache, &keys, tokens, n_full, false);
    if (rc != KVP_OK)
        return rc;
    keysrc src = {.tokens = tokens, .keys = keys, .root = root, .ns = KVP_NIL};
    src_start(cache, &src, ns);
    if (kvp__verifying(cache))
        src.ns = kvp__verify_ns_find(cache, ns, root);
    return lookup_common(cache, &src, n_tokens, n_full, block_ids, cap, out);
}

/* n_ids must cover n_tokens: ceil(n_tokens / bs) ids, or n_tokens / bs. */
static int check_ids(const kvp_cache *cache, size_t n_ids, size_t n_tokens, uint32_t n_full)
{
    size_t bs = cache->cfg.block_size;
    size_t n_ceil = n_tokens / bs + (n_tokens % bs != 0);
    if (kvp__verifying(cache))
        return kvp__fail(KVP_EINVAL,
                         "external ids cannot be verified: the cache has verify_tokens");
    if (n_ids != n_full && n_ids != n_ceil && n_full == n_ceil)
        return kvp__fail(KVP_EINVAL, "n_ids is %zu: n_tokens %zu in blocks of %zu takes %zu ids",
                         n_ids, n_tokens, bs, n_ceil);
    if (n_ids != n_full && n_ids != n_ceil)
        return kvp__fail(KVP_EINVAL,
                         "n_ids is %zu: n_tokens %zu in blocks of %zu takes %" PRIu32
                         " ids, or %zu with the partial last block",
                         n_ids, n_tokens, bs, n_full, n_ceil);
    return KVP_OK;
}

int kvp__lookup_ids_locked(kvp_cache *cache, const kvp_namespace *ns, const kvp_key *ids,
                           size_t n_ids, size_t n_tokens, uint32_t *block_ids, size_t cap,
                           kvp_match *out)
{
    static const kvp_key no_ids; /* lets ids be NULL when there are none */
    if (!ids && n_ids == 0)
        ids = &no_ids;
    uint32_t n_full = 0; /* set by check_prompt when it succeeds */
    int rc = check_prompt(cache, ns, ids, "ids", n_tokens, &n_full);
    if (rc == KVP_OK)
        rc = check_ids(cache, n_ids, n_tokens, n_full);
    if (rc != KVP_OK)
        return rc;
    keysrc src = {.ids = ids, .root = kvp__cache_root(cache, ns), .ns = KVP_NIL};
    src.start = src.root;
    return lookup_common(cache, &src, n_tokens, n_full, block_ids, cap, out);
}

/* Pin the first n_hit blocks of req (already in req->blocks) and take n_take fresh ones
 * after them. The caller checked availability. Cannot fail. */
static void pin_and_take(kvp_cache *cache, kvp__request *req, uint32_t n_hit, uint32_t n_take)
{
    assert(req->n_blocks == 0 && (uint64_t)n_hit + n_take <= req->cap_blocks);
    for (uint32_t i = 0; i < n_hit; i++)
        kvp__pool_pin(cache, req->blocks[i]);
    kvp__pool_take_n(cache, req->blocks + n_hit, n_take);
    req->n_blocks = n_hit + n_take;
}

/* How many distinct blocks among ids[0 .. n) are unpinned (they leave the LRU list when
 * pinned, so fresh blocks cannot come from them). An id can repeat only after a key
 * collision, but then it must be counted once: repeats are found by marking the state word
 * KVP__ST_MARK during the walk (the cached state saved in the record's ref_ext, unused while
 * a block is not in use) and restoring it after. Changes nothing in the end. */
static uint32_t count_unpinned(kvp_cache *cache, const uint32_t *ids, uint32_t n)
{
    uint32_t count = 0, *const state = cache->pool.state;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = ids[i], w = state[id];
        assert(w == KVP__ST_MARK || kvp__st_is_indexed(w));
        /* Indexed, so not free: below the mark is cached and not marked yet. */
        if (w < KVP__ST_MARK) {
            cache->pool.blocks[id].ref_ext = w;
            state[id] = KVP__ST_MARK;
            count++;
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = ids[i];
        if (state[id] == KVP__ST_MARK)
            state[id] = cache->pool.blocks[id].ref_ext;
    }
    return count;
}

/* vllm-*: give req its own copy of the namespace's extra keys, which every later commit
 * hashes (the caller's namespace is only valid during kvp_acquire). KVP_OK or KVP_ENOMEM
 * (req unchanged). */
static int request_keep_vctx(kvp_cache *cache, kvp__request *req, const kvp__vctx *vx)
{
    int profile = cache->hasher.profile;
    if (profile != KVP_HASH_VLLM_SHA256 && profile != KVP_HASH_VLLM_XXHASH)
        return KVP_OK; /* the other profiles hash no namespace bytes per block */
    size_t n = (vx->has_adapter ? vx->adapter_len : 0) + (vx->has_salt ? vx->salt_len : 0);
    req->vx = *vx;
    if (n == 0)
        return KVP_OK;
    unsigned char *p = kvp__mem_alloc(&cache->mem, n);
    if (!p)
        return kvp__fail(KVP_ENOMEM,
                         "out of memory: a copy of the namespace's adapter and salt "
                         "(%zu bytes)",
                         n);
    size_t a = vx->has_adapter ? vx->adapter_len : 0;
    if (a)
        memcpy(p, vx->adapter, a);
    if (vx->has_salt)
        memcpy(p + a, vx->salt, vx->salt_len);
    req->vx.adapter = p;
    req->vx.salt = p + a;
    req->vx_mem = p;
    req->vx_len = n;
    return KVP_OK;
}

/* Blocks needed to hold n tokens, or KVP_NIL when that does not fit in 32 bits. */
static uint32_t blocks_for(const kvp_cache *cache, size_t n)
{
    size_t bs = cache->cfg.block_size;
    size_t blocks = n / bs + (n % bs != 0);
    return blocks >= KVP_NIL ? KVP_NIL : (uint32_t)blocks;
}

/* Take what a request of namespace ns refers to for its lifetime: its interned namespace
 * (verify mode, *ns_id) and its quota group (quotas on, *qg); each is left untouched when
 * its mode is off. Returns KVP_OK or KVP_ENOMEM (nothing taken). */
static int intern_ns(kvp_cache *cache, const kvp_namespace *ns, kvp_key root, uint32_t *ns_id,
                     kvp__qgroup **qg)
{
    int rc;
    if (kvp__verifying(cache) && (rc = kvp__verify_ns_intern(cache, ns, root, ns_id)))
        return rc;
    if (kvp__quotas_on(cache) && (rc = kvp__quota_intern(cache, ns, qg))) {
        if (*ns_id != KVP_NIL)
            kvp__verify_ns_unref(cache, *ns_id);
        return rc;
    }
    return KVP_OK;
}

/* Drop what intern_ns took (KVP_NIL / NULL: nothing). Cannot fail. */
static void unref_ns(kvp_cache *cache, uint32_t ns_id, kvp__qgroup *qg)
{
    if (ns_id != KVP_NIL)
        kvp__verify_ns_unref(cache, ns_id);
    if (qg)
        kvp__quota_unref(cache, qg);
}

int kvp__acquire_locked(kvp_cache *cache, uint64_t req_id, const kvp_namespace *ns,
                        const kvp_key *root_in, const kvp_key *keys, const uint32_t *tokens,
                        size_t n_tokens, size_t n_capacity, kvp_match *out)
{
    /* Step 1: validate. */
    uint32_t n_full;
    int rc = check_prompt(cache, ns, keys ? (const void *)root_in : tokens,
                          keys ? "root" : "tokens", n_tokens, &n_full);
    if (rc == KVP_OK && keys)
        rc = check_keys(cache, &keys, tokens, n_full, true);
    if (rc == KVP_OK && !tokens)
        rc = kvp__fail(KVP_EINVAL, "tokens is NULL: the prompt is kept to check later commits");
    if (rc == KVP_OK)
        rc = kvp__hasher_tokens_check(&cache->hasher, tokens, n_tokens);
    if (rc != KVP_OK)
        return rc;
    if (!out)
        return kvp__fail(KVP_EINVAL, "out is NULL");
    if (kvp__request_find(cache, req_id))
        return kvp__fail(KVP_EEXIST, "req_id %" PRIu64 " is already an active request", req_id);
    size_t n_need = n_capacity > n_tokens ? n_capacity : n_tokens;
    uint32_t n_total = blocks_for(cache, n_need);
    if (n_total == KVP_NIL)
        return kvp__fail(KVP_EOVERFLOW,
                         "%zu tokens (n_capacity %zu, n_tokens %zu) take 2^32 - 1 or "
                         "more blocks of %" PRIu32,
                         n_need, n_capacity, n_tokens, cache->cfg.block_size);
    if (n_total > cache->pool.n_blocks)
        return kvp__fail(KVP_ETOOBIG,
                         "%zu tokens take %" PRIu32 " blocks of %" PRIu32
                         ", more than the pool's %" PRIu32,
                         n_need, n_total, cache->cfg.block_size, cache->pool.n_blocks);

    /* Step 2: allocate the request (and intern its namespace in verify mode and its quota
     * group when quotas are on). */
    kvp_key root = root_in ? *root_in : kvp__cache_root(cache, ns);
    uint32_t ns_id = KVP_NIL;
    kvp__qgroup *qg = NULL;
    if ((rc = intern_ns(cache, ns, root, &ns_id, &qg)))
        return rc;
    kvp__request *req;
    kvp_key ahead[2 * MATCH_BATCH];
    keysrc src = {.tokens = tokens, .root = root, .ns = ns_id, .ahead = ahead};
    src_start(cache, &src, ns);
    if ((rc = kvp__request_new(cache, req_id, n_total, &req)) == KVP_OK &&
        (rc = request_keep_vctx(cache, req, &src.vx)) != KVP_OK)
        kvp__request_delete(cache, req);
    if (rc != KVP_OK) {
        unref_ns(cache, ns_id, qg);
        return rc;
    }

    /* Step 3: match into the block table, then check the pool can supply the rest. */
    src.keys = keys;
    uint32_t limit = hit_limit(cache, n_tokens);
    uint64_t rejects_before = atomic_load_explicit(&cache->n_verify_rejects, memory_order_relaxed);
    walk w = match(cache, &src, n_full, req->blocks, limit);
    kvp_match m;
    fill_match(cache, n_tokens, n_full, w.n_cached, &m);
    uint32_t n_hit = m.n_blocks_hit, n_take = n_total - n_hit;
    uint32_t n_avail =
        kvp__pool_available(&cache->pool) - count_unpinned(cache, req->blocks, n_hit);
    rc = KVP_OK;
    if (n_take > n_avail)
        rc = kvp__fail(KVP_ENOSPC,
                       "the request needs %" PRIu32 " fresh blocks; %" PRIu32
                       " of the pool's %" PRIu32 " are free or evictable, the rest are pinned",
                       n_take, n_avail, cache->pool.n_blocks);
    else
        rc = kvp__request_keep_prompt(cache, req, tokens, n_tokens,
                                      (size_t)n_hit * cache->cfg.block_size, ahead,
                                      w.n_cached == n_hit && !keys ? src.n_ahead : 0);
    if (rc != KVP_OK) {
        /* A failed call changes nothing; no reader runs under the exclusive lock. */
        atomic_store_explicit(&cache->n_verify_rejects, rejects_before, memory_order_relaxed);
        kvp__request_delete(cache, req);
        unref_ns(cache, ns_id, qg);
        return rc;
    }

    /* Step 4: pin, take, record the chain state. */
    pin_and_take(cache, req, n_hit, n_take);
    req->root = root;
    req->last_key = w.last_key;
    req->last_high = w.last_high;
    req->canon = kvp__vref_of(cache, w.last_id);
    req->n_committed = n_hit;
    req->ns = ns_id;
    req->qg = qg;
    count_request(cache, &m);
    *out = m;
    return KVP_OK;
}

/* KVP_ENOENT for req_id (cold: the detail is formatted only on failure). */
static KVP__COLD int no_request(uint64_t req_id)
{
    return kvp__fail(KVP_ENOENT, "req_id %" PRIu64 " is not an active request", req_id);
}

int kvp__grow_locked(kvp_cache *cache, uint64_t req_id, size_t n_capacity)
{
    if (!cache)
        return kvp__fail(KVP_EINVAL, "cache is NULL");
    kvp__request *req = kvp__request_find(cache, req_id);
    if (!req)
        return no_request(req_id);
    uint32_t n_total = blocks_for(cache, n_capacity);
    if (n_total == KVP_NIL)
        return kvp__fail(KVP_EOVERFLOW, "n_capacity %zu takes 2^32 - 1 or more blocks of %" PRIu32,
                         n_capacity, cache->cfg.block_size);
    if (n_total <= req->n_blocks)
        return KVP_OK;
    if (n_total > cache->pool.n_blocks)
        return kvp__fail(KVP_ETOOBIG,
                         "n_capacity %zu takes %" PRIu32 " blocks of %" PRIu32
                         ", more than the pool's %" PRIu32,
                         n_capacity, n_total, cache->cfg.block_size, cache->pool.n_blocks);
    uint32_t n_take = n_total - req->n_blocks;
    if (n_take > kvp__pool_available(&cache->pool))
        return kvp__fail(KVP_ENOSPC,
                         "n_capacity %zu needs %" PRIu32 " more blocks; %" PRIu32
                         " of the pool's %" PRIu32 " are free or evictable, the rest are pinned",
                         n_capacity, n_take, kvp__pool_available(&cache->pool),
                         cache->pool.n_blocks);
    int rc = kvp__request_reserve(cache, req, n_total);
    if (rc != KVP_OK)
        return rc;
    assert(req->n_blocks + n_take <= req->cap_blocks);
    kvp__pool_take_n(cache, req->blocks + req->n_blocks, n_take);
    req->n_blocks += n_take;
    return KVP_OK;
}

int kvp__request_blocks_locked(const kvp_cache *cache, uint64_t req_id, const uint32_t **ids,
                               size_t *n)
{
    if (!cache)
        return kvp__fail(KVP_EINVAL, "cache is NULL");
    if (!ids)
        return kvp__fail(KVP_EINVAL, "ids is NULL");
    if (!n)
        return kvp__fail(KVP_EINVAL, "n is NULL");
    kvp__request *req = kvp__request_find(cache, req_id);
    if (!req)
        return no_request(req_id);
    *ids = req->blocks;
    *n = req->n_blocks;
    return KVP_OK;
}

/* Emit STORED for block id, just indexed under key after parent_key (the namespace root
 * when root), holding tokens (NULL when the call had none). Kept out of line: most engines
 * run without a callback. Cannot fail. */
static void emit_stored(kvp_cache *cache, uint32_t id, kvp_key key, kvp_key parent_key, bool root,
                        const uint32_t *tokens)
{
    kvp_event ev = {0};
    ev.type = KVP_EVENT_STORED;
    ev.block_id = id;
    ev.n_tokens = cache->cfg.block_size;
    ev.key = key;
    ev.parent = parent_key;
    ev.parent_is_root = root;
    ev.tokens = tokens;
    kvp__emit(cache, &ev);
}

/* Index block id under key as block i of a chain whose accepted previous instance is canon
 * (none for i == 0), in quota group qg (NULL when quotas are off), emit STORED. Inlined
 * into its two callers (commit, access): it runs once per stored block, and as a call its
 * nine arguments and the event built for no callback cost 14% of kvp_commit's instructions
 * in workload (c) (callgrind). Cannot fail. */
static KVP__ALWAYS_INLINE void store_block(kvp_cache *cache, uint32_t id, kvp_key key,
                                           kvp_key parent_key, uint32_t i, const uint32_t *tokens,
                                           kvp__vref canon, uint32_t ns, kvp__qgroup *qg)
{
    /* Only a block held by the caller is stored: one of its request's or a fresh one. */
    assert(id < cache->pool.n_blocks && kvp__block_is_private(&cache->pool, id));
    assert(!kvp__verifying(cache) || tokens);
    kvp__index_add(&cache->index, &cache->pool.blocks[id], key);
    cache->pool.state[id] |= KVP__ST_INDEXED;
    if (kvp__verifying(cache))
        kvp__verify_store(cache, id, tokens, canon, i == 0 ? ns : KVP_NIL);
    if (qg)
        kvp__quota_tag(cache, id, qg);
    cache->stats.n_blocks_stored++;
    if (cache->cfg.on_event)
        emit_stored(cache, id, key, parent_key, i == 0, tokens);
}

/* The indexed block that may stand for block i of this chain, whose key is key, or KVP_NIL.
 * Without verification that is whatever is indexed under key. In collision-proof mode it is
 * the candidate that verifies against the query (find_verified); candidates that do not -
 * a hash collision, another namespace's block, or a block whose recorded parent has been
 * evicted since - are left exactly as they are: never removed, never replaced, never
 * touched in the LRU order, so nothing the caller can observe depends on them. The caller
 * then stores its own block beside them under the same key. A key that is indexed with no
 * verifying candidate counts in n_verify_rejects, unless the caller's own match already
 * counted it (counted). Cannot fail. */
static KVP__ALWAYS_INLINE uint32_t probe_existing(kvp_cache *cache, kvp_key key,
                                                  const uint32_t *tokens, kvp__vref canon,
                                                  uint32_t ns, bool counted)
{
    const kvp__probe_view view = kvp__index_view(&cache->index);
    const kvp__block *b = kvp__index_scan(view.buckets[(unsigned)key.lo & view.mask].hh_head, key);
    if (!b)
        return KVP_NIL;
    if (!kvp__verifying(cache))
        return (uint32_t)(b - cache->pool.blocks);
    uint32_t id = find_verified(cache, b, key, tokens, canon, ns);
    if (id == KVP_NIL && !counted)
        kvp__count_reject(cache);
    return id;
}

/* Does tokens[0 .. n_tokens) agree with the acquired prompt where it is not committed yet?
 * Committed blocks are not read again (their keys already chain them). Each prompt block
 * from the first uncommitted one whose prompt tokens all lie within n_tokens is compared
 * by fingerprint; a block the call gives only part of is not full, so this call does not
 * commit it, and a later call compares it. Cannot fail. */
static bool prompt_matches(const kvp_cache *cache, const kvp__request *req, const uint32_t *tokens,
                           size_t n_tokens)
{
    if (!req->prompt_fp)
        return true;
    size_t bs = cache->cfg.block_size;
    size_t to = n_tokens < req->n_prompt ? n_tokens : req->n_prompt;
    size_t lo = (size_t)req->n_committed * bs;
    if (lo < req->prompt_start)
        lo = req->prompt_start;
    if (lo >= to)
        return true;
    /* The full prompt blocks first, in one call; then the partial last one if given. */
    const uint64_t *want = req->prompt_fp + (lo - req->prompt_start) / bs;
    size_t n_whole = (to - lo) / bs;
    if (kvp__tokens_fp_blocks(tokens + lo, bs, n_whole, NULL, want) != n_whole)
        return false;
    lo += n_whole * bs;
    if (lo < to && to == req->n_prompt) /* the prompt's partial last block, all given */
        return kvp__tokens_fp(tokens + lo, to - lo) == want[n_whole];
    return true;
}

/* KVP_EINVAL for tokens that prompt_matches refused, naming the first prompt block whose
 * fingerprint differs as the token range tokens[a..b): a whole block, or the prompt's
 * partial last block. A different fingerprint means different tokens, so the range is
 * exact; which token of it differs is not known (only fingerprints are kept). */
static KVP__COLD int prompt_refused(const kvp_cache *cache, const kvp__request *req,
                                    const uint32_t *tokens, size_t n_tokens)
{
    size_t bs = cache->cfg.block_size;
    size_t to = n_tokens < req->n_prompt ? n_tokens : req->n_prompt;
    size_t lo = (size_t)req->n_committed * bs;
    if (lo < req->prompt_start)
        lo = req->prompt_start;
    const uint64_t *want = req->prompt_fp + (lo - req->prompt_start) / bs;
    size_t n_whole = (to - lo) / bs;
    size_t k = kvp__tokens_fp_blocks(tokens + lo, bs, n_whole, NULL, want);
    size_t a = lo + k * bs, b = k < n_whole ? a + bs : to;
    return kvp__fail(KVP_EINVAL, "tokens[%zu..%zu) differ from the acquired prompt", a, b);
}

enum { COMMIT_KEYS, COMMIT_CHAIN, COMMIT_TOKENS16, COMMIT_KEYED16 };

/* Step 4 of kvp_commit: probe and store blocks req->n_committed .. n_full - 1 (their keys
 * given in keys, or hashed from tokens in the given mode, a constant in each copy, as in
 * match_mode), leaving req's chain state after the last. Returns the blocks stored. The
 * chain state lives in locals during the walk and is written back once: through req, each
 * block cost five stores the compiler could not keep in registers. Cannot fail.
 *
 * As in match(): a batch of keys is hashed ahead (they depend only on the tokens), their
 * buckets and entries and the blocks they will be stored in are prefetched, then they are
 * probed and stored in order, so the probes' cache misses overlap. Unlike match, a batch's
 * buckets are read again at its probes: storing a block may have changed them. */
static KVP__ALWAYS_INLINE size_t commit_mode(kvp_cache *cache, kvp__request *req,
                                             const kvp_key *keys, const uint32_t *tokens,
                                             uint32_t n_full, int mode)
{
    const size_t bs = cache->cfg.block_size;
    const kvp__probe_view view = kvp__index_view(&cache->index);
    const kvp_hasher *h = &cache->hasher;
    kvp_key last_key = req->last_key, last_high = req->last_high;
    kvp__vref canon = req->canon;
    const uint32_t ns = req->ns;
    kvp__qgroup *const qg = req->qg;
    const uint32_t *const own_ids = req->blocks;
    const kvp_key *const ahead = req->ahead; /* keys of blocks a0 .. a0 + n_ahead - 1 */
    const uint32_t a0 = (uint32_t)(req->prompt_start / bs), n_ahead = req->n_ahead;
    assert(!n_ahead || req->n_committed >= a0);
    size_t stored = 0;
    kvp_key batch[MATCH_BATCH], highs[MATCH_BATCH];
    for (uint32_t i0 = req->n_committed; i0 < n_full; i0 += MATCH_BATCH) {
        uint32_t n = n_full - i0 < MATCH_BATCH ? n_full - i0 : MATCH_BATCH;
        kvp_key parent = last_key, parent_high = last_high;
        for (uint32_t j = 0; j < n; j++) {
            const uint32_t *blk_tokens = tokens + (size_t)(i0 + j) * bs;
            if (i0 + j + 8 < n_full)
                KVP__PREFETCH(blk_tokens + 8 * bs);
            if (mode == COMMIT_KEYS)
                parent = keys[i0 + j]; /* precomputed: not vllm-sha256 (check_keys) */
            else if (mode >= COMMIT_TOKENS16 && i0 + j - a0 < n_ahead)
                parent = ahead[i0 + j - a0]; /* hashed by acquire from these tokens */
            else if (mode == COMMIT_TOKENS16)
                parent = kvp__hash_block16(h->seed, parent, blk_tokens);
            else if (mode == COMMIT_KEYED16)
                parent = kvp__hash_block16_secret(h->secret, parent, blk_tokens);
            else
                kvp__cache_chain(cache, &req->vx, &parent, &parent_high, blk_tokens, i0 + j);
            batch[j] = parent;
            highs[j] = parent_high;
            kvp__prefetch_bucket(view, batch[j]);
            KVP__PREFETCH_W(&cache->pool.blocks[own_ids[i0 + j]]);
        }
        for (uint32_t j = 0; j < n; j++)
            kvp__prefetch_entry(view, batch[j]);
        for (uint32_t j = 0; j < n; j++) {
            uint32_t i = i0 + j, own = own_ids[i];
            const uint32_t *blk_tokens = tokens + (size_t)i * bs;
            uint32_t found = probe_existing(cache, batch[j], blk_tokens, canon, ns, false);
            if (found != KVP_NIL) {
                cache->stats.n_blocks_deduped++;
                canon = kvp__vref_of(cache, found);
            } else {
                store_block(cache, own, batch[j], last_key, i, blk_tokens, canon, ns, qg);
                canon = kvp__vref_of(cache, own);
                stored++;
            }
            last_key = batch[j];
            last_high = highs[j];
        }
    }
    if (n_full > req->n_committed) {
        req->last_key = last_key;
        req->last_high = last_high;
        req->canon = canon;
        req->n_committed = n_full;
    }
    return stored;
}

/* The body of kvp_commit, out of line: kvp__commit_locked below jumps here, or, on a cache
 * with lower tiers, kvp__tier_commit (tier_orders.c) calls it between its hooks. Kept apart
 * so that those hooks do not change this function's code (with them inside, register
 * allocation cost 1.5% of kvp_commit's instructions in workload (c), callgrind). */
#if defined(__GNUC__)
__attribute__((noinline))
#endif
int kvp__commit_body(kvp_cache *cache, uint64_t req_id, const kvp_key *keys,
                     const uint32_t *tokens, size_t n_tokens, size_t *n_stored)
{
    if (!tokens && n_tokens)
        return kvp__fail(KVP_EINVAL, "tokens is NULL but n_tokens is %zu", n_tokens);
    kvp__request *req = kvp__request_find(cache, req_id);
    if (!req)
        return no_request(req_id);
    assert(kvp__request_counts_ok(req));
    size_t bs = cache->cfg.block_size;
    if (n_tokens / bs < req->n_committed)
        return kvp__fail(KVP_EINVAL,
                         "n_tokens is %zu, fewer than the request's %" PRIu32
                         " committed blocks of %zu tokens",
                         n_tokens, req->n_committed, bs);
    int rc = kvp__hasher_tokens_check(&cache->hasher, tokens, n_tokens);
    if (rc != KVP_OK)
        return rc;
    if (n_tokens / bs > req->n_blocks)
        return kvp__fail(KVP_ERANGE,
                         "n_tokens is %zu: %zu full blocks, more than the %" PRIu32
                         " the request holds",
                         n_tokens, n_tokens / bs, req->n_blocks);
    if (!prompt_matches(cache, req, tokens, n_tokens))
        return prompt_refused(cache, req, tokens, n_tokens);
    if (keys && cache->hasher.profile == KVP_HASH_VLLM_SHA256) /* see check_keys */
        return kvp__fail(KVP_ENOTSUP, "keys cannot continue a chain under vllm-sha256-cbor: its "
                                      "256-bit chain does not fit a kvp_key (pass keys NULL)");
    uint32_t n_full = (uint32_t)(n_tokens / bs);
    size_t stored;
    if (keys)
        stored = commit_mode(cache, req, keys, tokens, n_full, COMMIT_KEYS);
    else if (bs == 16 && cache->key_bits == 128 && cache->hasher.profile == KVP_HASH_KEYED)
        stored = commit_mode(cache, req, NULL, tokens, n_full, COMMIT_KEYED16);
    else if (bs == 16 && cache->key_bits == 128 && cache->hasher.profile == KVP_HASH_XXH3)
        stored = commit_mode(cache, req, NULL, tokens, n_full, COMMIT_TOKENS16);
    else
        stored = commit_mode(cache, req, NULL, tokens, n_full, COMMIT_CHAIN);
    assert(req->n_committed == n_full && kvp__request_counts_ok(req));
    if (req->prompt_fp && (size_t)req->n_committed * bs >= req->n_prompt)
        kvp__request_drop_prompt(cache, req);
    else if (req->prompt_fp && req->prompt_fp != &req->fp_last &&
             req->n_prompt - (size_t)req->n_committed * bs < bs)
        kvp__request_narrow_prompt(cache, req);
    if (n_stored)
        *n_stored = stored;
    return KVP_OK;
}

int kvp__commit_locked(kvp_cache *cache, uint64_t req_id, const kvp_key *keys,
                       const uint32_t *tokens, size_t n_tokens, size_t *n_stored)
{
    if (!cache)
        return kvp__fail(KVP_EINVAL, "cache is NULL");
    if (cache->tiers)
        return kvp__tier_commit(cache, req_id, keys, tokens, n_tokens, n_stored);
    return kvp__commit_body(cache, req_id, keys, tokens, n_tokens, n_stored);
}

static void release_request(kvp_cache *cache, kvp__request *req);

int kvp__release_locked(kvp_cache *cache, uint64_t req_id)
{
    if (!cache)
        return kvp__fail(KVP_EINVAL, "cache is NULL");
    kvp__request *req = kvp__request_find(cache, req_id);
    if (!req)
        return no_request(req_id);
    release_request(cache, req);
    return KVP_OK;
}

int kvp__requests_locked(const kvp_cache *cache, uint64_t *ids, size_t cap, size_t *n_active)
{
    if (!n_active)
        return kvp__fail(KVP_EINVAL, "n_active is NULL");
    if (!ids && cap)
        return kvp__fail(KVP_EINVAL, "ids is NULL but cap is %zu", cap);
    size_t n = 0;
    const kvp__request *req, *tmp;
    HASH_ITER(hh, cache->requests, req, tmp)
    {
        if (n < cap)
            ids[n] = req->id;
        n++;
    }
    *n_active = n;
    return KVP_OK;
}

int kvp__release_all_locked(kvp_cache *cache, size_t *n_released)
{
    size_t n = 0;
    kvp__request *req, *tmp;
    HASH_ITER(hh, cache->requests, req, tmp)
    {
        release_request(cache, req);
        n++;
    }
    if (n_released)
        *n_released = n;
    return KVP_OK;
}

/* Unpin req's blocks tail first and delete it. Cannot fail. */
static void release_request(kvp_cache *cache, kvp__request *req)
{
    assert(kvp__request_counts_ok(req));
    if (KVP__LIKELY(!kvp__retention_on(cache)))
        kvp__pool_unpin_tail_first(cache, req->blocks, req->n_blocks);
    else
        kvp__retention_release(cache, req); /* the same, noting req's retention */
    unref_ns(cache, req->ns, req->qg);
    kvp__request_delete(cache, req);
}

/* Make the scratch arrays hold n entries. KVP_OK or KVP_ENOMEM (nothing changed). */
static int scratch_reserve(kvp_cache *cache, size_t n)
{
    if (n <= cache->scratch_cap)
        return KVP_OK;
    size_t cap = cache->scratch_cap * 2 > n ? cache->scratch_cap * 2 : n;
    kvp_key *keys = kvp__mem_alloc(&cache->mem, cap * sizeof *keys);
    uint32_t *ids = kvp__mem_alloc(&cache->mem, cap * sizeof *ids);
    if (!keys || !ids) {
        kvp__mem_free(&cache->mem, keys, cap * sizeof *keys);
        kvp__mem_free(&cache->mem, ids, cap * sizeof *ids);
        return kvp__fail(KVP_ENOMEM, "out of memory: the scratch arrays for a prompt of %zu blocks",
                         n);
    }
    kvp__mem_free(&cache->mem, cache->scratch_keys, cache->scratch_cap * sizeof *keys);
    kvp__mem_free(&cache->mem, cache->scratch_ids, cache->scratch_cap * sizeof *ids);
    cache->scratch_keys = keys;
    cache->scratch_ids = ids;
    cache->scratch_cap = cap;
    return KVP_OK;
}

/* The body of kvp_access and kvp_access_ids once keys[0 .. n_full) are in scratch_keys:
 *  1. match the cached run (its blocks' ids land in scratch_ids);
 *  2. walk every full block in order: pin a cached (verified) block, or take a fresh one
 *     and index it; stop when the pool has nothing left to give (the prefix is kept);
 *  3. unpin from the last block to the first, so parents end up more recent than children.
 * Cannot fail. */
static void access_keys(kvp_cache *cache, keysrc *src, size_t n_tokens, uint32_t n_full,
                        kvp_match *out)
{
    /* Step 1: match. */
    uint32_t *ids = cache->scratch_ids;
    const kvp_key *keys = src->keys;
    walk w = match(cache, src, n_full, ids, n_full);
    kvp_match m;
    fill_match(cache, n_tokens, n_full, w.n_cached, &m);

    /* Step 2: pin or insert every block. */
    size_t bs = cache->cfg.block_size;
    uint32_t n_held = 0;
    kvp__vref canon = KVP__VREF_NONE;
    for (uint32_t i = 0; i < n_full; i++) {
        const uint32_t *blk_tokens = src->tokens ? src->tokens + (size_t)i * bs : NULL;
        uint32_t id;
        if (i < w.n_cached) {
            id = ids[i];
            kvp__pool_pin(cache, id);
        } else {
            id = probe_existing(cache, keys[i], blk_tokens, canon, src->ns,
                                i == w.n_cached && w.rejected);
            if (id != KVP_NIL) {
                kvp__pool_pin(cache, id);
            } else {
                if (kvp__pool_available(&cache->pool) == 0)
                    break;
                id = kvp__pool_take(cache);
                store_block(cache, id, keys[i], i ? keys[i - 1] : src->start, i, blk_tokens, canon,
                            src->ns, src->qg);
                m.n_blocks_stored++;
            }
        }
        ids[i] = id;
        canon = kvp__vref_of(cache, id);
        n_held = i + 1;
    }

    /* Step 3: release tail first. */
    assert(n_held <= n_full && w.n_cached <= n_full);
    kvp__pool_unpin_tail_first(cache, ids, n_held);
    count_request(cache, &m);
    *out = m;
}

/* Steps shared by both access forms before the keys exist: scratch, verify namespace. */
static int access_prepare(kvp_cache *cache, kvp_match *out, uint32_t n_full)
{
    if (!out)
        return kvp__fail(KVP_EINVAL, "out is NULL");
    return scratch_reserve(cache, n_full);
}

int kvp__access_locked(kvp_cache *cache, const kvp_namespace *ns, const kvp_key *root,
                       const kvp_key *keys, const uint32_t *tokens, size_t n_tokens, kvp_match *out)
{
    uint32_t n_full;
    int rc = check_prompt(cache, ns, keys ? (const void *)root : tokens, keys ? "root" : "tokens",
                          n_tokens, &n_full);
    if (rc == KVP_OK && keys)
        rc = check_keys(cache, &keys, tokens, n_full, false);
    if (rc == KVP_OK)
        rc = kvp__hasher_tokens_check(&cache->hasher, tokens, n_tokens);
    if (rc == KVP_OK)
        rc = access_prepare(cache, out, n_full);
    if (rc != KVP_OK)
        return rc;
    keysrc src = {.tokens = tokens,
                  .keys = keys,
                  .root = root ? *root : kvp__cache_root(cache, ns),
                  .ns = KVP_NIL};
    if ((rc = intern_ns(cache, ns, src.root, &src.ns, &src.qg)))
        return rc;
    src_start(cache, &src, ns);
    if (!keys) {
        kvp_key parent = src.prev, parent_high = src.prev_high;
        for (uint32_t i = 0; i < n_full; i++) {
            kvp__cache_chain(cache, &src.vx, &parent, &parent_high,
                             tokens + (size_t)i * cache->cfg.block_size, i);
            cache->scratch_keys[i] = parent;
        }
        src.keys = cache->scratch_keys;
    }
    access_keys(cache, &src, n_tokens, n_full, out);
    unref_ns(cache, src.ns, src.qg);
    return KVP_OK;
}

int kvp__access_ids_locked(kvp_cache *cache, const kvp_namespace *ns, const kvp_key *ids,
                           size_t n_ids, size_t n_tokens, kvp_match *out)
{
    static const kvp_key no_ids; /* lets ids be NULL when there are none */
    if (!ids && n_ids == 0)
        ids = &no_ids;
    uint32_t n_full;
    int rc = check_prompt(cache, ns, ids, "ids", n_tokens, &n_full);
    if (rc == KVP_OK)
        rc = check_ids(cache, n_ids, n_tokens, n_full);
    if (rc == KVP_OK)
        rc = access_prepare(cache, out, n_full);
    if (rc != KVP_OK)
        return rc;
    keysrc src = {.root = kvp__cache_root(cache, ns), .ns = KVP_NIL};
    src.start = src.root;
    if (kvp__quotas_on(cache) && (rc = kvp__quota_intern(cache, ns, &src.qg)))
        return rc;
    const bool full = cache->key_bits == 128;
    for (uint32_t i = 0; i < n_full; i++) {
        if (full && cache->hasher.profile == KVP_HASH_KEYED)
            cache->scratch_keys[i] =
                kvp__external_key_secret(cache->hasher.secret, src.root, ids[i]);
        else if (full && cache->hasher.profile == KVP_HASH_XXH3)
            cache->scratch_keys[i] = kvp__external_key_seed(cache->hasher.seed, src.root, ids[i]);
        else
            cache->scratch_keys[i] = kvp__cache_external_key(cache, src.root, ids[i]);
    }
    src.keys = cache->scratch_keys;
    access_keys(cache, &src, n_tokens, n_full, out);
    unref_ns(cache, KVP_NIL, src.qg);
    return KVP_OK;
}
