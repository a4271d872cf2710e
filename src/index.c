/*
 * index.c - the block index: uthash buckets chaining the pool's blocks by 128-bit key.
 *
 *   buckets[0 .. 2^log2_buckets)  ->  chains of kvp__block.hh  (hh_next / hh_prev)
 *
 * Keys are already digests (keyed XXH3, XXH3 or SHA-256), so the table never hashes them
 * again: the bucket hash is the key's low 32 bits.
 *
 * Entries are linked only into uthash's bucket chains (what HASH_ADD_TO_BKT and
 * HASH_DEL_IN_BKT do, less the bucket counts: below);
 * uthash's insertion-order list (the handle's prev/next and the table's tail), which
 * HASH_ADD and HASH_DELETE maintain, is never written, because the index never iterates
 * in insertion order (a block's prev, next and tbl bytes hold other fields: internal.h). That saves
 * an insertion the write to the table's tail entry and a deletion the writes to its two list
 * neighbours: two scattered cache lines per eviction (bench_core (c) under callgrind,
 * docs/performance.md "The block index"). A probe walks the chain and compares the stored hash, the
 * key length and the 16 key bytes of the block itself (kvp__block starts with its handle and
 * continues with its key).
 *
 * Adding a key never allocates, so it cannot fail:
 *  - a sentinel entry with a 1-byte key is added at init (with HASH_ADD, which makes the
 *    table) and stays until kvp__index_free, so uthash never frees or re-creates its table
 *    (a 16-byte lookup never matches it, because the key lengths differ);
 *  - the bucket array is sized once, at init, to the power of two >= 2 n_blocks (the pool
 *    bounds the number of entries, so the load factor stays <= 1/2), and buckets never
 *    double (HASH_BKT_CAPACITY_THRESH is out of reach).
 *  - so the buckets' counts, which uthash keeps only to decide when to double the buckets,
 *    are not kept: a block is linked and unlinked by the two macros' pointer updates alone,
 *    and every bucket's count stays what init left (1 in bucket 0, the sentinel's; 0 in
 *    every other). An eviction then reads and writes the victim's bucket only when the
 *    victim heads its chain: with the count kept, HASH_DEL_IN_BKT touched it for every
 *    victim, and bench_core (c) missed 5.05 last-level lines per stored block instead of
 *    4.85 (docs/performance.md, "The pool at memory speed, part 4").
 * That is what lets kvp_commit and kvp_access mutate the cache with no failure path after
 * their allocations are done. Memory: 16 bytes per bucket, 32-64 bytes per pool block.
 * (Buckets at 2x the pool fit bench_core (d)'s 128-byte limit since a block record is 64
 * bytes: 104 bytes per cached block at 1M blocks. Against 1x they take bench_core (c)'s
 * missed last-level lines from 6.61 to 6.20 per stored block under callgrind, fewer chain
 * neighbours to probe and unlink: docs/performance.md.)
 *
 * Several blocks may share one key in collision-proof mode (verify_tokens): the table then
 * resolves a key collision the way any hash table resolves a bucket collision, by keeping
 * every entry and letting the caller check each candidate (kvp__index_find, then
 * kvp__index_find_next along the bucket chain; see lifecycle.c find_verified). New entries
 * go to the head of their chain, so the most recently indexed candidate is probed first.
 * Outside that mode a key is indexed at most once. Duplicates cost nothing extra on the
 * hot path: the first candidate is found exactly as before, and only a candidate that
 * fails verification makes the walk go on (bench/bench_verify: a cached 128k-token lookup
 * with verification takes 1.76x the verify-off time when every block has a forged
 * colliding candidate probed first, against 1.23x with none; docs/security.md).
 *
 * Invariant (checked by kvp__index_check in check.c): the bucket chains hold the sentinel
 * and exactly the blocks whose state word says indexed (internal.h), n_items of them, each once,
 * each in the bucket of its own key with a handle that names that key; tbl->num_items counts them
 * all.
 */
#include <string.h>

#include "internal.h"

#undef HASH_INITIAL_NUM_BUCKETS
#undef HASH_INITIAL_NUM_BUCKETS_LOG2
#undef HASH_BKT_CAPACITY_THRESH
#undef uthash_malloc
#undef uthash_free
/* The table is made once, by kvp__index_init, where `idx` and `mem` are in scope. */
#define HASH_INITIAL_NUM_BUCKETS      (1u << idx->log2_buckets)
#define HASH_INITIAL_NUM_BUCKETS_LOG2 (idx->log2_buckets)
#define HASH_BKT_CAPACITY_THRESH      0x7fffffffu
#define uthash_malloc(sz)             kvp__mem_alloc(mem, (sz))
#define uthash_free(ptr, sz)          kvp__mem_free(mem, (ptr), (sz))

#define KEY_BYTES ((unsigned)sizeof(kvp_key))

static inline unsigned bucket_hash(kvp_key key)
{
    return (unsigned)key.lo;
}

/* log2 of the bucket count for a pool of n_blocks: of the power of two >= 2 n_blocks, at
 * least 32 buckets and at most 2^31. Cannot fail. */
unsigned kvp__index_log2_buckets(uint32_t n_blocks)
{
    unsigned log2 = 5;
    while (((uint64_t)1 << log2) < 2 * (uint64_t)n_blocks && log2 < 31)
        log2++;
    return log2;
}

/* Create the table for a pool of n_blocks. Returns KVP_OK or KVP_ENOMEM (idx unusable). */
int kvp__index_init(kvp__index *idx, kvp__mem *mem, uint32_t n_blocks)
{
    memset(idx, 0, sizeof *idx);
    idx->log2_buckets = kvp__index_log2_buckets(n_blocks);
    idx->sentinel_key = 0;
    kvp__block *s = &idx->sentinel;
    HASH_ADD_KEYPTR_BYHASHVALUE(hh, idx->head, &idx->sentinel_key, 1, 0u, s);
    if (!idx->head || s->hh.tbl == NULL) {
        idx->head = NULL;
        return kvp__fail(KVP_ENOMEM, "out of memory: the block index (2^%u buckets)",
                         idx->log2_buckets);
    }
    return KVP_OK;
}

/* Free the table. The blocks themselves belong to the pool. Cannot fail. */
void kvp__index_free(kvp__index *idx, kvp__mem *mem)
{
    if (idx->head)
        HASH_CLEAR(hh, idx->head);
    idx->head = NULL;
    idx->n_items = 0;
}

/* The first block from handle hh on along its chain whose key is key, or NULL (the probe
 * is kvp__index_scan in internal.h, shared with the pipelined walks of lifecycle.c). */
static inline kvp__block *scan(const UT_hash_handle *hh, kvp_key key)
{
    assert(bucket_hash(key) == (unsigned)key.lo && KEY_BYTES == sizeof(kvp_key));
    return kvp__index_scan(hh, key);
}

_Static_assert(offsetof(kvp__block, hh) == 0, "index.c casts a chain's handles to blocks");

/* The block indexed under key (in verify mode the most recently indexed of them), or NULL.
 * Cannot fail; does not change the table. */
kvp__block *kvp__index_find(const kvp__index *idx, kvp_key key)
{
    const UT_hash_table *tbl = idx->head->hh.tbl;
    return scan(tbl->buckets[bucket_hash(key) & (tbl->num_buckets - 1)].hh_head, key);
}

/* The next block indexed under key after prev (itself a block indexed under key) in prev's
 * bucket chain, or NULL. Together with kvp__index_find this visits every block indexed
 * under key exactly once. Cannot fail; does not change the table. */
kvp__block *kvp__index_find_next(const kvp__index *idx, const kvp__block *prev, kvp_key key)
{
    (void)idx;
    assert(prev->hh.key == &prev->key && kvp__key_eq(prev->key, key));
    return scan(prev->hh.hh_next, key);
}

/* Index blk, which is not indexed, under key, at the head of its bucket's chain. Outside
 * collision-proof mode the key must not be indexed yet; in it, other blocks may already be
 * indexed under the same key. The caller marks the block indexed in its state word (pool.c,
 * lifecycle.c). Cannot fail (see above). */
void kvp__index_add(kvp__index *idx, kvp__block *blk, kvp_key key)
{
    /* A second block under the same key is not asserted here (that costs a probe per store
     * in every build with asserts): callers add only after a find missed or unindexed the
     * holder, and kvp__index_check finds any block not reachable under its own key. */
    assert(blk != &idx->sentinel && blk->hh.key != &blk->key); /* not indexed yet */
    assert(idx->n_items < UINT32_MAX);
    UT_hash_table *tbl = idx->head->hh.tbl;
    /* hh.tbl, hh.prev and hh.next are not written: they hold ref_ext and the key
     * (internal.h), and a block is never on the insertion-order list. */
    blk->key = key;
    blk->hh.key = &blk->key;
    blk->hh.keylen = KEY_BYTES;
    blk->hh.hashv = bucket_hash(key);
    /* HASH_ADD_TO_BKT's links, without its count and expansion test (see above). */
    UT_hash_bucket *bkt = &tbl->buckets[blk->hh.hashv & (tbl->num_buckets - 1)];
    blk->hh.hh_prev = NULL;
    blk->hh.hh_next = bkt->hh_head;
    if (bkt->hh_head)
        bkt->hh_head->hh_prev = &blk->hh;
    bkt->hh_head = &blk->hh;
    tbl->num_items++;
    idx->n_items++;
}

/* Remove an indexed block from its bucket's chain (the caller updates its state word).
 * Cannot fail; never frees the table. */
void kvp__index_del(kvp__index *idx, kvp__block *blk)
{
    assert(blk != &idx->sentinel && idx->n_items > 0);
    kvp__index_unlink(idx, idx->head->hh.tbl, blk);
}

/* Bytes held by the table itself (bucket array and table header). Cannot fail. */
size_t kvp__index_bucket_bytes(const kvp__index *idx)
{
    if (!idx->head)
        return 0;
    return (size_t)idx->head->hh.tbl->num_buckets * sizeof(UT_hash_bucket) + sizeof(UT_hash_table);
}
