/*
 * index.c - the block index: a chained hash table from 128-bit block key to pool block.
 *
 *   buckets[0 .. 2^log2_buckets)   u32 block id of the chain's first entry, or KVP_NIL
 *   blocks[id].next                 the next block id in the same chain, or KVP_NIL
 *
 *   buckets: [ NIL | 17 | NIL | 4 | ... ]        blocks[17] {key, next=903} -> blocks[903]
 *                                                {key, next=NIL}
 *
 * Keys are already keyed XXH3 (or SHA-256) digests, so the table never hashes them again:
 * the bucket is the key's low bits. The entries are the pool's own blocks: a block's key
 * and its chain link sit in the first 20 bytes of its 32-byte kvp__block, so a probe reads
 * one bucket word and then one cache line per candidate. The chain link shares the block's
 * `next` field with the free list: a free block is never indexed and an indexed block is
 * never free (see internal.h).
 *
 * Adding a key never allocates, so it cannot fail: the bucket array is sized once, at init,
 * to the power of two >= 2 * n_blocks (the pool bounds the number of entries, so the load
 * factor stays <= 1/2). That is what lets kvp_commit and kvp_access mutate the cache with
 * no failure path after their allocations are done. Memory: 4 bytes per bucket, so 8-16
 * bytes per pool block, and no per-entry bytes beyond the key and link in the block.
 *
 * Why not uthash, which this table replaced: its 56-byte handle per block (key pointer, key
 * length, stored hash, table pointer, an insertion-order list and a doubly linked bucket
 * chain) made kvp__block 88 bytes, and an insertion and a deletion rewrote up to four
 * scattered neighbours. Here an insertion writes the bucket word and the block; a deletion
 * walks the (short) chain from its bucket to the predecessor. bench_core and callgrind A/B:
 * docs/performance.md, "The block index".
 *
 * Several blocks may share one key in collision-proof mode (verify_tokens): the table then
 * resolves a key collision the way it resolves a bucket collision, by keeping every entry
 * and letting the caller check each candidate (kvp__index_find, then kvp__index_find_next
 * along the chain; see lifecycle.c find_verified). New entries go to the head of their
 * chain, so the most recently indexed candidate is probed first. Outside that mode a key is
 * indexed at most once.
 *
 * Invariant (checked by kvp__index_check in check.c): the chains hold exactly the blocks
 * with indexed == 1, n_items of them, each once, each in the bucket of its own key.
 */
#include <string.h>

#include "internal.h"

#define MIN_LOG2_BUCKETS 5u

/* log2 of the bucket count for a pool of n_blocks: of the power of two >= 2 n_blocks, at
 * least 32 buckets and at most 2^32 (bucket numbers are u32). Cannot fail. */
unsigned kvp__index_log2_buckets(uint32_t n_blocks)
{
    unsigned log2 = MIN_LOG2_BUCKETS;
    while (((uint64_t)1 << log2) < 2 * (uint64_t)n_blocks && log2 < 32)
        log2++;
    return log2;
}

/* Create the empty table for the pool blocks[0 .. n_blocks). Returns KVP_OK or KVP_ENOMEM
 * (then idx holds no memory and kvp__index_free is still safe). */
int kvp__index_init(kvp__index *idx, kvp__mem *mem, kvp__block *blocks, uint32_t n_blocks)
{
    memset(idx, 0, sizeof *idx);
    unsigned log2 = kvp__index_log2_buckets(n_blocks);
    size_t n = (size_t)1 << log2;
    uint32_t *buckets = kvp__mem_alloc(mem, n * sizeof *buckets);
    if (!buckets)
        return KVP_ENOMEM;
    memset(buckets, 0xff, n * sizeof *buckets); /* every word KVP_NIL */
    idx->buckets = buckets;
    idx->blocks = blocks;
    idx->mask = (uint32_t)(n - 1);
    idx->log2_buckets = log2;
    return KVP_OK;
}

/* Free the bucket array. The blocks belong to the pool. Cannot fail. */
void kvp__index_free(kvp__index *idx, kvp__mem *mem)
{
    if (idx->buckets)
        kvp__mem_free(mem, idx->buckets, kvp__index_bucket_bytes(idx));
    idx->buckets = NULL;
    idx->n_items = 0;
}

/* The first block at or after chain position id whose key is key, or NULL. */
static inline kvp__block *scan(const kvp__index *idx, uint32_t id, kvp_key key)
{
    while (id != KVP_NIL) {
        kvp__block *b = &idx->blocks[id];
        if (kvp__key_eq(b->key, key))
            return b;
        id = b->next;
    }
    return NULL;
}

/* The block indexed under key (in verify mode: the most recently indexed of them), or
 * NULL. Cannot fail; does not change the table. */
kvp__block *kvp__index_find(const kvp__index *idx, kvp_key key)
{
    return scan(idx, idx->buckets[kvp__index_bucket(idx->mask, key)], key);
}

/* The next block indexed under key after prev (itself a block indexed under key) in their
 * chain, or NULL. Together with kvp__index_find this visits every block indexed under key
 * exactly once. Cannot fail; does not change the table. */
kvp__block *kvp__index_find_next(const kvp__index *idx, const kvp__block *prev, kvp_key key)
{
    assert(kvp__block_is_indexed(prev) && kvp__key_eq(prev->key, key));
    return scan(idx, prev->next, key);
}

/* Index blk under key, at the head of its chain. Outside collision-proof mode the key must
 * not be indexed yet; in it, other blocks may already be indexed under the same key.
 * Cannot fail (see above). */
void kvp__index_add(kvp__index *idx, kvp__block *blk, kvp_key key)
{
    /* A second block under the same key is not asserted here (that costs a probe per store
     * in every build with asserts): callers add only after a find missed or unindexed the
     * holder, and kvp__index_check finds any block not reachable under its own key. */
    assert(!kvp__block_is_indexed(blk) && blk >= idx->blocks);
    assert(idx->n_items < UINT32_MAX);
    uint32_t *head = &idx->buckets[kvp__index_bucket(idx->mask, key)];
    blk->key = key;
    blk->next = *head;
    *head = (uint32_t)(blk - idx->blocks);
    blk->indexed = 1;
    idx->n_items++;
}

/* Remove an indexed block from its chain: walks from the bucket to the link that names it
 * (chains average under 1.25 entries at load 1/2). Cannot fail. */
void kvp__index_del(kvp__index *idx, kvp__block *blk)
{
    assert(kvp__block_is_indexed(blk) && idx->n_items > 0);
    uint32_t id = (uint32_t)(blk - idx->blocks);
    uint32_t *link = &idx->buckets[kvp__index_bucket(idx->mask, blk->key)];
    while (*link != id) {
        assert(*link != KVP_NIL); /* blk is in this chain */
        link = &idx->blocks[*link].next;
    }
    *link = blk->next;
    blk->next = KVP_NIL;
    blk->indexed = 0;
    idx->n_items--;
}

/* Bytes held by the table itself (the bucket array). Cannot fail. */
size_t kvp__index_bucket_bytes(const kvp__index *idx)
{
    return idx->buckets ? ((size_t)idx->mask + 1) * sizeof *idx->buckets : 0;
}
