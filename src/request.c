/*
 * request.c - the table of active requests, keyed by the caller's 64-bit request id.
 *
 * A kvp__request owns its block table (an array of block ids, grown by doubling) and the
 * chain state needed to commit later blocks without hashing earlier ones again: the key of
 * its last committed block. Requests live in a uthash table hashed with kvp__uthash_fn
 * (ids are caller-chosen and often sequential, so their bits are mixed), allocating through
 * the cache's hooks in non-fatal OOM mode: a failed insert leaves the table as it was.
 *
 * A request also keeps a 64-bit fingerprint of each prompt block it has not committed yet
 * (from the end of its hit blocks), so that kvp_commit can check that the sequence it is
 * given begins with the prompt; they are freed as soon as every prompt token is committed,
 * and once only the prompt's partial last block is not, its one fingerprint moves into the
 * request (fp_last) and the array is freed then (kvp__request_narrow_prompt).
 * (A copy of the tokens did the same exactly but cost about 7% of workload (c): it wrote
 * and re-read 4 bytes per prompt token; the fingerprints write 8 bytes per block.)
 *
 * The same allocation also keeps the keys acquire's match hashed past its first miss (up to
 * two batches, 64 blocks), so that kvp_commit does not hash those blocks again: in workload
 * (c) that saves ~60 of a request's ~230 block hashes (docs/performance.md).
 *
 * Invariant: every block id in blocks[0 .. n_blocks) is pinned (ref counts one per
 * appearance across all requests); n_committed <= n_blocks; prompt_fp is NULL or holds
 * ceil((n_prompt - prompt_start) / block_size) fingerprints, followed by n_ahead <= that
 * many keys (ahead), or is &fp_last (one fingerprint, no keys); ahead is NULL and n_ahead 0
 * when prompt_fp is NULL or &fp_last.
 */
#include <string.h>

#include "blockhash.h"

#undef uthash_malloc
#undef uthash_free
#define uthash_malloc(sz)    kvp__mem_alloc(&cache->mem, (sz))
#define uthash_free(ptr, sz) kvp__mem_free(&cache->mem, (ptr), (sz))

/* The active request with this id, or NULL. Cannot fail. */
kvp__request *kvp__request_find(const kvp_cache *cache, uint64_t id)
{
    kvp__request *req;
    HASH_FIND(hh, cache->requests, &id, sizeof id, req);
    return req;
}

/* Create request id with room for cap_blocks block ids and insert it in the table. The
 * caller has checked that id is not active. Returns KVP_OK or KVP_ENOMEM (nothing changed). */
int kvp__request_new(kvp_cache *cache, uint64_t id, uint32_t cap_blocks, kvp__request **out)
{
    assert(kvp__request_find(cache, id) == NULL);
    kvp__request *req = kvp__mem_calloc(&cache->mem, 1, sizeof *req);
    if (!req)
        return kvp__fail(KVP_ENOMEM, "out of memory: the request record");
    if (cap_blocks == 0)
        cap_blocks = 1;
    req->blocks = kvp__mem_alloc(&cache->mem, (size_t)cap_blocks * sizeof(uint32_t));
    if (!req->blocks) {
        kvp__mem_free(&cache->mem, req, sizeof *req);
        return kvp__fail(KVP_ENOMEM, "out of memory: the request's table of %" PRIu32 " blocks",
                         cap_blocks);
    }
    req->id = id;
    req->cap_blocks = cap_blocks;
    req->ns = KVP_NIL;
    req->canon = KVP__VREF_NONE;
    HASH_ADD(hh, cache->requests, id, sizeof req->id, req);
    if (req->hh.tbl == NULL) {
        kvp__mem_free(&cache->mem, req->blocks, (size_t)cap_blocks * sizeof(uint32_t));
        kvp__mem_free(&cache->mem, req, sizeof *req);
        return kvp__fail(KVP_ENOMEM, "out of memory: the table of active requests");
    }
    *out = req;
    return KVP_OK;
}

/* Make req's block table hold at least cap_blocks entries. KVP_OK or KVP_ENOMEM (req
 * unchanged). */
int kvp__request_reserve(kvp_cache *cache, kvp__request *req, uint32_t cap_blocks)
{
    assert(kvp__request_counts_ok(req));
    if (cap_blocks <= req->cap_blocks)
        return KVP_OK;
    uint64_t cap = (uint64_t)req->cap_blocks * 2;
    if (cap < cap_blocks)
        cap = cap_blocks;
    if (cap > UINT32_MAX)
        cap = UINT32_MAX;
    uint32_t *blocks = kvp__mem_alloc(&cache->mem, (size_t)cap * sizeof(uint32_t));
    if (!blocks)
        return kvp__fail(KVP_ENOMEM, "out of memory: the request's table of %" PRIu64 " blocks",
                         cap);
    memcpy(blocks, req->blocks, (size_t)req->n_blocks * sizeof(uint32_t));
    kvp__mem_free(&cache->mem, req->blocks, (size_t)req->cap_blocks * sizeof(uint32_t));
    req->blocks = blocks;
    req->cap_blocks = (uint32_t)cap;
    return KVP_OK;
}

/* Fingerprint the prompt's blocks from token start (block-aligned) to n_tokens into req,
 * for kvp_commit to compare, and keep the keys ahead[0 .. n_ahead) of the full prompt blocks
 * from start on (NULL, 0: none) for it to reuse (nothing is kept when start == n_tokens).
 * KVP_OK or KVP_ENOMEM (req unchanged). */
int kvp__request_keep_prompt(kvp_cache *cache, kvp__request *req, const uint32_t *tokens,
                             size_t n_tokens, size_t start, const kvp_key *ahead, uint32_t n_ahead)
{
    size_t bs = cache->cfg.block_size;
    size_t n_fp = start < n_tokens ? (n_tokens - start + bs - 1) / bs : 0;
    uint64_t *fp = NULL;
    if (n_fp == 0)
        n_ahead = 0;
    assert(n_ahead <= (n_tokens - start) / bs);
    if (n_fp) {
        fp = kvp__mem_alloc(&cache->mem, n_fp * sizeof *fp + n_ahead * sizeof(kvp_key));
        if (!fp)
            return kvp__fail(KVP_ENOMEM, "out of memory: the fingerprints of %zu prompt blocks",
                             n_fp);
        size_t n_whole = (n_tokens - start) / bs;
        kvp__tokens_fp_blocks(tokens + start, bs, n_whole, fp, NULL);
        if (n_whole < n_fp) /* the partial last block */
            fp[n_whole] = kvp__tokens_fp(tokens + start + n_whole * bs, n_tokens % bs);
        if (n_ahead)
            memcpy(fp + n_fp, ahead, n_ahead * sizeof(kvp_key));
    }
    req->prompt_fp = fp;
    req->ahead = n_ahead ? (const kvp_key *)(const void *)(fp + n_fp) : NULL;
    req->n_ahead = n_ahead;
    req->n_prompt = n_tokens;
    req->prompt_start = start;
    return KVP_OK;
}

/* Free req's prompt fingerprints and keys (once every prompt token is committed). Cannot
 * fail. */
void kvp__request_drop_prompt(kvp_cache *cache, kvp__request *req)
{
    size_t bs = cache->cfg.block_size;
    if (req->prompt_fp && req->prompt_fp != &req->fp_last)
        kvp__mem_free(&cache->mem, req->prompt_fp,
                      (req->n_prompt - req->prompt_start + bs - 1) / bs * sizeof *req->prompt_fp +
                          req->n_ahead * sizeof(kvp_key));
    req->prompt_fp = NULL;
    req->ahead = NULL;
    req->n_ahead = 0;
}

/* Once every full prompt block is committed and only the prompt's partial last block is
 * not: keep that block's fingerprint in req itself and free the array (with the keys ahead,
 * all committed by now). The array is freed while its lines are still cached, so the next
 * request's allocations reuse warm memory instead of an array that a request released 32
 * requests ago freed (bench_core (c): docs/performance.md). Cannot fail. */
void kvp__request_narrow_prompt(kvp_cache *cache, kvp__request *req)
{
    size_t bs = cache->cfg.block_size, start = (size_t)req->n_committed * bs;
    assert(req->prompt_fp && req->prompt_fp != &req->fp_last);
    assert(start >= req->prompt_start && start < req->n_prompt && req->n_prompt - start < bs);
    uint64_t last = req->prompt_fp[(start - req->prompt_start) / bs];
    kvp__request_drop_prompt(cache, req);
    req->fp_last = last;
    req->prompt_fp = &req->fp_last;
    req->prompt_start = start;
}

/* Remove req from the table and free it. The caller has unpinned its blocks, or is
 * destroying the whole cache. Cannot fail. */
void kvp__request_delete(kvp_cache *cache, kvp__request *req)
{
    assert(kvp__request_find(cache, req->id) == req && kvp__request_counts_ok(req));
    kvp__request_drop_prompt(cache, req);
    HASH_DELETE(hh, cache->requests, req);
    kvp__mem_free(&cache->mem, req->vx_mem, req->vx_len);
    kvp__mem_free(&cache->mem, req->blocks, (size_t)req->cap_blocks * sizeof(uint32_t));
    kvp__mem_free(&cache->mem, req, sizeof *req);
}
