/*
 * replay_opt.c - the offline optimum of a replay: Belady's MIN with next *useful* touches and
 * deeper-first ties (see replay_opt.h for the rules and why it is optimal).
 *
 * Layout.
 *
 *   blk[]       every touch, request after request: the dense block number (4 bytes)
 *   off[r]      where request r's touches start in blk[] (off[n_req] = number of touches)
 *   tok[r]      its prompt tokens; full[r] its full prompt blocks
 *   nxt[]       pass 1: for touch a, the request of the next touch of the same block, or
 *               NONE; built backwards over blk[] with one "last request seen" per block
 *   pass 2      per capacity: an indexed binary max-heap of the cached blocks keyed by
 *               (next useful request << 32 | depth), NONE for "never useful again"; hpos[b]
 *               is b's heap index + 1 (0: not cached)
 *
 * Per request in pass 2: Step 1 count the hit (leading cached full blocks, capped); Step 2
 * take the request's cached blocks out of the heap (they are pinned while it runs); Step 3
 * evict the largest keys until its blocks fit; Step 4 insert its blocks with their new keys.
 *
 * Invariants: the heap holds exactly the cached blocks, at most C of them; a block's depth
 * is its index in every request that touches it, so the key's low word is fixed per block.
 *
 * Cost: O(A) for pass 1 and O(A log C) per capacity for A touches (each touch is one heap
 * removal and one insertion); memory as replay_opt.h says.
 */
#include "replay_opt.h"

#include <assert.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define NONE UINT32_MAX /* no next touch (or not useful): the largest key */

struct rp_opt {
    uint32_t block_size;   /* tokens per block */
    uint32_t *blk;         /* dense block number of every touch */
    size_t n_blk, blk_cap; /* touches, allocated */
    uint64_t *off;         /* start of each request in blk, n_req + 1 entries */
    uint64_t *tok;         /* prompt tokens of each request */
    uint32_t *full;        /* full prompt blocks of each request */
    size_t n_req, req_cap; /* requests, allocated (off has req_cap + 1) */
    size_t n_blocks;       /* largest block number + 1 */
    uint32_t *nxt;         /* pass 1 result, or NULL when stale */
};

/* Heap of pass 2, over one capacity. */
typedef struct heap {
    uint32_t *h;    /* block numbers, h[0] the largest key */
    size_t n;       /* blocks in the heap */
    uint64_t *key;  /* per block: (next useful request << 32) | depth */
    uint32_t *hpos; /* per block: heap index + 1, 0 when not cached */
} heap;

static void heap_set(heap *hp, size_t i, uint32_t b)
{
    hp->h[i] = b;
    hp->hpos[b] = (uint32_t)i + 1;
}

static void sift_up(heap *hp, size_t i)
{
    uint32_t b = hp->h[i];
    while (i > 0 && hp->key[hp->h[(i - 1) / 2]] < hp->key[b]) {
        heap_set(hp, i, hp->h[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    heap_set(hp, i, b);
}

static void sift_down(heap *hp, size_t i)
{
    uint32_t b = hp->h[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= hp->n)
            break;
        if (c + 1 < hp->n && hp->key[hp->h[c + 1]] > hp->key[hp->h[c]])
            c++;
        if (hp->key[hp->h[c]] <= hp->key[b])
            break;
        heap_set(hp, i, hp->h[c]);
        i = c;
    }
    heap_set(hp, i, b);
}

/* Remove block b (cached) from the heap. */
static void heap_remove(heap *hp, uint32_t b)
{
    size_t i = hp->hpos[b] - 1;
    hp->hpos[b] = 0;
    uint32_t last = hp->h[--hp->n];
    if (i == hp->n)
        return;
    hp->h[i] = last;
    hp->hpos[last] = (uint32_t)i + 1;
    sift_up(hp, i);
    sift_down(hp, hp->hpos[last] - 1);
}

static void heap_push(heap *hp, uint32_t b)
{
    hp->h[hp->n] = b;
    hp->hpos[b] = (uint32_t)hp->n + 1;
    sift_up(hp, hp->n++);
}

rp_opt *rp_opt_new(uint32_t block_size)
{
    if (block_size == 0)
        return NULL;
    rp_opt *o = calloc(1, sizeof *o);
    if (!o)
        return NULL;
    o->block_size = block_size;
    return o;
}

int rp_opt_add(rp_opt *o, uint64_t n_tokens, uint32_t n_full, const size_t *blocks, size_t n_touch)
{
    if (n_tokens == 0 || n_full > n_touch || o->n_req >= NONE - 1 ||
        n_touch > SIZE_MAX / 2 - o->n_blk)
        return -1;
    for (size_t i = 0; i < n_touch; i++)
        if (blocks[i] >= NONE)
            return -1;
    size_t cap = o->req_cap;
    if (!cli_grow((void **)&o->blk, &o->blk_cap, o->n_blk + n_touch, sizeof *o->blk) ||
        !cli_grow((void **)&o->tok, &o->req_cap, o->n_req + 1, sizeof *o->tok))
        return -1;
    if (o->req_cap != cap) {
        uint64_t *off = realloc(o->off, (o->req_cap + 1) * sizeof *off);
        uint32_t *full = realloc(o->full, o->req_cap * sizeof *full);
        if (off)
            o->off = off;
        if (full)
            o->full = full;
        if (!off || !full) {
            o->req_cap = cap; /* tok is merely larger than needed */
            return -1;
        }
    }
    if (o->n_req == 0)
        o->off[0] = 0;
    for (size_t i = 0; i < n_touch; i++) {
        o->blk[o->n_blk + i] = (uint32_t)blocks[i];
        if (blocks[i] + 1 > o->n_blocks)
            o->n_blocks = blocks[i] + 1;
    }
    o->n_blk += n_touch;
    o->tok[o->n_req] = n_tokens;
    o->full[o->n_req] = n_full;
    o->off[++o->n_req] = o->n_blk;
    free(o->nxt);
    o->nxt = NULL;
    return 0;
}

/* Pass 1: nxt[a] = the request of the next touch of blk[a], or NONE. Returns false on
 * ENOMEM. */
static bool next_touches(rp_opt *o)
{
    if (o->nxt)
        return true;
    uint32_t *nxt = malloc((o->n_blk ? o->n_blk : 1) * sizeof *nxt);
    uint32_t *seen = malloc((o->n_blocks ? o->n_blocks : 1) * sizeof *seen);
    if (!nxt || !seen) {
        free(nxt);
        free(seen);
        return false;
    }
    for (size_t b = 0; b < o->n_blocks; b++)
        seen[b] = NONE;
    for (size_t r = o->n_req; r-- > 0;) {
        for (uint64_t a = o->off[r]; a < o->off[r + 1]; a++) {
            nxt[a] = seen[o->blk[a]];
            seen[o->blk[a]] = (uint32_t)r;
        }
    }
    free(seen);
    o->nxt = nxt;
    return true;
}

/* Blocks request r may reuse: min(full blocks, (tokens - 1) / block size). */
static uint64_t reuse_limit(const rp_opt *o, size_t r)
{
    uint64_t lim = (o->tok[r] - 1) / o->block_size;
    return lim < o->full[r] ? lim : o->full[r];
}

int rp_opt_eval(rp_opt *o, uint64_t cap, int rule, rp_opt_result *out)
{
    if (cap == 0 || !next_touches(o))
        return -1;
    size_t hcap = cap < o->n_blocks ? (size_t)cap : o->n_blocks;
    heap hp = {malloc((hcap ? hcap : 1) * sizeof(uint32_t)), 0,
               malloc((o->n_blocks ? o->n_blocks : 1) * sizeof(uint64_t)),
               calloc(o->n_blocks ? o->n_blocks : 1, sizeof(uint32_t))};
    if (!hp.h || !hp.key || !hp.hpos) {
        free(hp.h);
        free(hp.key);
        free(hp.hpos);
        return -1;
    }
    rp_opt_result res;
    memset(&res, 0, sizeof res);
    res.capacity = cap;
    for (size_t r = 0; r < o->n_req; r++) {
        const uint32_t *b = o->blk + o->off[r];
        const uint32_t *nx = o->nxt + o->off[r];
        uint64_t n_touch = o->off[r + 1] - o->off[r];
        size_t n = (size_t)(n_touch < cap ? n_touch : cap);

        /* Step 1: the hit. */
        size_t h = 0, n_full = o->full[r] < n ? o->full[r] : n;
        while (h < n_full && hp.hpos[b[h]])
            h++;
        uint64_t lim = reuse_limit(o, r);
        uint64_t hit = h < lim ? h : lim;
        res.n_blocks_cached += h;
        res.n_blocks_hit += hit;
        res.n_hit_tokens += hit * o->block_size;
        res.n_requests++;

        /* Step 2: pin the request's blocks by taking them out of the heap. */
        for (size_t i = 0; i < n; i++) {
            if (hp.hpos[b[i]])
                heap_remove(&hp, b[i]);
            else
                res.n_stored++;
        }

        /* Step 3: evict the farthest next useful touch, the deepest among equals. */
        while (hp.n + n > cap) {
            uint32_t v = hp.h[0];
            heap_remove(&hp, v);
            res.n_evicted++;
        }

        /* Step 4: the request's blocks with their keys. A block at depth i >= C is never
         * stored at this capacity, so only the first n are kept. */
        for (size_t i = 0; i < n; i++) {
            uint64_t k = nx[i];
            if (k != NONE && rule == RP_OPT_USEFUL && i >= reuse_limit(o, (size_t)k))
                k = NONE;
            hp.key[b[i]] = k << 32 | (uint64_t)i;
            heap_push(&hp, b[i]);
        }
        assert(hp.n <= cap);
    }
    free(hp.h);
    free(hp.key);
    free(hp.hpos);
    *out = res;
    return 0;
}

size_t rp_opt_n_requests(const rp_opt *o)
{
    return o->n_req;
}

size_t rp_opt_request(const rp_opt *o, size_t r, const uint32_t **blocks, uint64_t *n_tokens,
                      uint32_t *n_full)
{
    *blocks = o->blk + o->off[r];
    *n_tokens = o->tok[r];
    *n_full = o->full[r];
    return (size_t)(o->off[r + 1] - o->off[r]);
}

size_t rp_opt_n_blocks(const rp_opt *o)
{
    return o->n_blocks;
}

void rp_opt_free(rp_opt *o)
{
    if (!o)
        return;
    free(o->blk);
    free(o->off);
    free(o->tok);
    free(o->full);
    free(o->nxt);
    free(o);
}
