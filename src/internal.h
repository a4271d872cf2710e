/*
 * internal.h - the cache's private data structures and the kvp__ functions shared between
 * the library's source files. Nothing here is installed or exported.
 *
 * Layout of one cache:
 *
 *   kvp_cache
 *    |- pool: blocks[0 .. n_blocks)      one kvp__block record per physical KV block id
 *    |        state[0 .. n_blocks)       one 32-bit state word per block (below)
 *    |     free list: free_head -> b -> b -> NIL (singly linked via next), never-used or
 *    |                holding nothing reusable
 *    |     LRU ring:  lru[head % cap] .. lru[(tail - 1) % cap], block ids oldest first;
 *    |                an entry is live iff its block's state word is the entry's slot
 *    |                (pinning only rewrites the word: lazy deletion, pool.c)
 *    |- index: uthash table key -> block  every indexed block, plus a sentinel
 *    |                                    (in verify mode several blocks may share a key)
 *    |- requests: uthash table id -> kvp__request (block table, chain state)
 *    |- verify (optional): tokens per block, parent links, interned namespaces
 *    `- quota (optional): one group per quota scope (namespace, tenant or model), each
 *                         with its cached blocks in LRU order
 *
 * Each block is in exactly one of three states, kept in its state word (pool.state[id],
 * not in the record: release and the ring's liveness test touch 4 dense bytes, not the
 * block's 64-byte line) and named by the predicates kvp__st_is_free / _cached / _in_use
 * below:
 *   free    KVP__ST_FREE                on the free list
 *   cached  a ring slot s < lru_cap     in the index, with exactly one live entry in the
 *                                       LRU ring, in slot s (plain LRU);
 *           KVP__ST_CACHED              in the index, on no ring slot: on a policy's lists
 *                                       (or popped by an eviction under way);
 *           KVP__SLOT_RETAINED          in the index, on a retention queue (retention.h)
 *   in use  KVP__ST_IN_USE | c          pinned by requests (pin count c, bits 0..29; the
 *           [| KVP__ST_INDEXED]         value KVP__ST_REF_SAT says the count is in the
 *                                       record's ref_ext); indexed (shared, bit 30) or
 *                                       private (not indexed)
 * Ring slots stay below KVP__SLOT_LIMIT (2^31 - 16: the pool holds at most 2^30 blocks and
 * its ring min(2 n_blocks + 16, KVP__SLOT_LIMIT) entries), so neither the in-use bit nor a
 * special value is ever a slot.
 * kvp__cache_check() verifies this and every count; tests call it after each mutation.
 * Internal preconditions are assert()ed (compiled in unless NDEBUG: meson's b_ndebug is
 * if-release, so the debugoptimized test, sanitizer and fuzz builds keep them). Asserts are
 * for bugs in the library only; caller input is checked and answered with KVP_E* codes.
 */
#ifndef KVP_INTERNAL_H
#define KVP_INTERNAL_H

#include <assert.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Allocation failures inside uthash are reported, never fatal (see index.c, request.c).
 * The block index passes its own bucket hash (index.c); the small tables (requests by id,
 * namespaces by root key) hash their 8- or 16-byte keys with kvp__uthash_fn below. */
#define HASH_NONFATAL_OOM                    1
#define HASH_FUNCTION(keyptr, keylen, hashv) ((hashv) = kvp__uthash_fn((keyptr), (keylen)))
#include <uthash.h>
#include <string.h>

#include "hashprof.h"
#include "kvprefix.h"
#include "policy.h"
#include "retention.h"

#define KVP_NIL   UINT32_MAX /* "no block" in 32-bit links */
#define KVP__LINE 64u        /* bytes in a cache line: the size of a block record */

/* Cache hints and attributes of GCC and Clang; plain C elsewhere (slower, same results). */
#if defined(__GNUC__)
#define KVP__PREFETCH(addr)   __builtin_prefetch((addr))
#define KVP__PREFETCH_W(addr) __builtin_prefetch((addr), 1)
#define KVP__FLATTEN          __attribute__((flatten))
#define KVP__ALWAYS_INLINE    inline __attribute__((always_inline))
#else
#define KVP__PREFETCH(addr)   ((void)(addr))
#define KVP__PREFETCH_W(addr) ((void)(addr))
#define KVP__FLATTEN
#define KVP__ALWAYS_INLINE inline
#endif

/* uthash's hash for the small tables: 64-bit words mixed with the splitmix64 finalizer
 * (request ids are often sequential, so the bits must be spread). Cannot fail. */
static inline unsigned kvp__uthash_fn(const void *key, size_t len)
{
    const unsigned char *p = key;
    uint64_t h = UINT64_C(0x9e3779b97f4a7c15) ^ len;
    while (len > 0) {
        uint64_t w = 0;
        size_t n = len < 8 ? len : 8;
        memcpy(&w, p, n);
        h ^= w;
        h = (h ^ (h >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
        h = (h ^ (h >> 27)) * UINT64_C(0x94d049bb133111eb);
        h ^= h >> 31;
        p += n;
        len -= n;
    }
    return (unsigned)(h ^ (h >> 32));
}

/* ---------------------------------------------------------------- failure details (error.c) */

#if defined(__GNUC__)
#define KVP__COLD            __attribute__((cold, noinline))
#define KVP__NOINLINE        __attribute__((noinline))
#define KVP__PRINTF(fmt, va) __attribute__((format(printf, fmt, va)))
#define KVP__LIKELY(x)       __builtin_expect(!!(x), 1)
#else
#define KVP__COLD
#define KVP__NOINLINE
#define KVP__PRINTF(fmt, va)
#define KVP__LIKELY(x) (x)
#endif

/* Record the detail of a failure for kvp_errmsg, formatted like printf (say which argument
 * or limit and why, with the values; no function name, no final period), and return code
 * (negative). Used as `return kvp__fail(KVP_EINVAL, "out is NULL");` at each failure site.
 * Cold and out of line: nothing is formatted unless a call fails. Cannot fail. */
int kvp__fail(int code, const char *fmt, ...) KVP__COLD KVP__PRINTF(2, 3);

/* Return code, keeping as this call's detail the one a public call made from inside the
 * library has just set (kvp_cache_metrics -> kvp_cache_stats). Cannot fail. */
int kvp__fail_kept(int code) KVP__COLD;

/* The failing exit of a public call: write kvp_strerror(code) as the detail unless a site
 * of this call wrote one, then mark the call finished. Returns code. Cannot fail. */
int kvp__fail_done(int code) KVP__COLD;

/* Every public function that returns a status returns kvp__public(its status). */
static inline int kvp__public(int rc)
{
    return KVP__LIKELY(rc >= 0) ? rc : kvp__fail_done(rc);
}

/* ---------------------------------------------------------------- memory (mem.c) */

/* The cache's allocator: the user's hooks (or malloc/free) plus a live-byte count. */
typedef struct kvp__mem {
    kvp_allocator hooks; /* alloc/free never NULL after kvp__mem_init */
    size_t live_bytes;   /* bytes currently allocated through these hooks */
} kvp__mem;

void kvp__mem_init(kvp__mem *mem, const kvp_allocator *hooks);
void *kvp__mem_alloc(kvp__mem *mem, size_t size);
void *kvp__mem_calloc(kvp__mem *mem, size_t n, size_t size);
void kvp__mem_free(kvp__mem *mem, void *ptr, size_t size);

/* ---------------------------------------------------------------- keys (keys.c) */

static inline bool kvp__key_eq(kvp_key a, kvp_key b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

/* Keep the low `bits` bits of a key (bits in 1..128); test-only collision forcing. */
static inline kvp_key kvp__key_truncate(kvp_key k, unsigned bits)
{
    assert(bits >= 1);
    if (bits >= 128)
        return k;
    if (bits >= 64) {
        k.hi &= bits == 64 ? 0 : (UINT64_MAX >> (128 - bits));
    } else {
        k.hi = 0;
        k.lo &= UINT64_MAX >> (64 - bits);
    }
    return k;
}

/* ---------------------------------------------------------------- blocks, index, pool */

/* One 64-byte record per block, one cache line (the pool aligns the array): eviction, a
 * probe of the chain and a store each touch one line of the block, not two. The index
 * links blocks only through uthash's bucket chains (index.c), so of the 56-byte handle a
 * block uses hh_prev, hh_next, key, keylen and hashv; tbl, prev and next (the table
 * pointer and the insertion-order list, which uthash reads only for entries added with
 * HASH_ADD and for a bucket expansion, neither of which happens to a block) hold ref_ext
 * and the key instead. The index's sentinel is a full uthash entry and uses none of the
 * overlaid fields. At 88 bytes (handle, key, four u32s) a block straddled two lines in
 * three cases out of four; bench_core (c) under callgrind: docs/performance.md. The
 * block's state (pin count, ring slot, indexed) is not here but in pool.state (top of this
 * file): a release then does not touch the record, which has usually left the CPU cache
 * by the time a request ends ("The pool at memory speed, part 4" in docs/performance.md). */
typedef struct kvp__block {
    union {
        UT_hash_handle hh; /* index linkage (bucket chains only); valid while indexed */
        struct {
            uint32_t ref_ext; /* in use with the state word's count at KVP__ST_REF_SAT: the
                                 pin count (hh.tbl); count_unpinned's saved state word */
            uint32_t spare;   /* unused (hh.tbl) */
            kvp_key key;      /* the block's key, meaningful while indexed (hh.prev, hh.next) */
        };
    };
    uint32_t next; /* free list: the next free block; KVP_NIL at the end */
    uint32_t pad;  /* unused */
} kvp__block;

_Static_assert(offsetof(UT_hash_handle, hh_prev) >= 8 + sizeof(kvp_key),
               "ref_ext and key must overlay only the handle's tbl, prev and next");
_Static_assert(sizeof(kvp__block) == 64, "a block record is one cache line");

/* The state word (top of this file). */
#define KVP__ST_IN_USE  UINT32_C(0x80000000) /* pinned; the pin count in KVP__ST_REFS */
#define KVP__ST_INDEXED UINT32_C(0x40000000) /* in use and indexed (shared) */
#define KVP__ST_REFS    UINT32_C(0x3fffffff) /* in use: the pin count, 1 .. REF_SAT */
#define KVP__ST_REF_SAT KVP__ST_REFS         /* the count is the record's ref_ext */
#define KVP__ST_FREE    UINT32_C(0x7fffffff) /* on the free list */
#define KVP__ST_MARK    UINT32_C(0x7ffffffe) /* count_unpinned's mark (lifecycle.c) */
#define KVP__ST_CACHED  UINT32_C(0x7ffffffd) /* cached, on no ring slot */
/* KVP__SLOT_RETAINED, 0x7ffffffc (retention.h): cached, on a retention queue */
#define KVP__SLOT_LIMIT UINT32_C(0x7ffffff0) /* ring slots are below this */
#define KVP__POOL_MAX   (UINT32_C(1) << 30)  /* the largest pool, in blocks */

/* The block states of a state word w (see the top of this file). A block is in exactly one
 * of free, cached and in use; in-use blocks are indexed (shared) or private. Cannot fail. */
static inline bool kvp__st_is_in_use(uint32_t w)
{
    return w >= KVP__ST_IN_USE;
}

static inline bool kvp__st_is_free(uint32_t w)
{
    return w == KVP__ST_FREE;
}

static inline bool kvp__st_is_cached(uint32_t w)
{
    return w < KVP__ST_IN_USE && w != KVP__ST_FREE;
}

static inline bool kvp__st_is_indexed(uint32_t w)
{
    return kvp__st_is_in_use(w) ? (w & KVP__ST_INDEXED) != 0 : w != KVP__ST_FREE;
}

/* In use but not indexed: a partial tail, a deduplicated copy or a replaced block; it
 * returns to the free list on its last unpin. */
static inline bool kvp__st_is_private(uint32_t w)
{
    return (w & (KVP__ST_IN_USE | KVP__ST_INDEXED)) == KVP__ST_IN_USE;
}

/* The key -> block table: uthash buckets whose chains link the indexed blocks (never
 * uthash's insertion-order list). A sentinel entry with a 1-byte key keeps the table alive
 * for the cache's lifetime, and buckets are sized once for the whole pool, so adding and
 * deleting keys never allocates and cannot fail (see index.c). */
typedef struct kvp__index {
    kvp__block *head;      /* uthash head: always the sentinel (nothing else is listed) */
    kvp__block sentinel;   /* never matches a 16-byte key */
    uint8_t sentinel_key;  /* the sentinel's 1-byte key */
    unsigned log2_buckets; /* log2 of the bucket count: kvp__index_log2_buckets(n_blocks) */
    uint32_t n_items;      /* indexed blocks (the sentinel excluded) */
} kvp__index;

unsigned kvp__index_log2_buckets(uint32_t n_blocks);
int kvp__index_init(kvp__index *idx, kvp__mem *mem, uint32_t n_blocks);
void kvp__index_free(kvp__index *idx, kvp__mem *mem);
kvp__block *kvp__index_find(const kvp__index *idx, kvp_key key);
kvp__block *kvp__index_find_next(const kvp__index *idx, const kvp__block *prev, kvp_key key);
void kvp__index_add(kvp__index *idx, kvp__block *blk, kvp_key key);
void kvp__index_del(kvp__index *idx, kvp__block *blk);

/* kvp__index_del's body, for callers that unlink many blocks in a loop with the table's
 * bucket array in a register (pool.c's batched eviction): blk leaves its bucket's chain.
 * HASH_DEL_IN_BKT without its bucket count (index.c: the counts are not kept), so that a
 * block which does not head its chain (hh_prev set) is unlinked without reading its
 * bucket. Cannot fail. */
static inline void kvp__index_unlink(kvp__index *idx, UT_hash_table *tbl, kvp__block *blk)
{
    assert(idx->n_items > 0 && tbl == idx->head->hh.tbl);
    assert(blk->hh.key == &blk->key); /* an entry of the index (kvp__index_add) */
    UT_hash_handle *hh = &blk->hh;
    if (hh->hh_prev)
        hh->hh_prev->hh_next = hh->hh_next;
    else
        tbl->buckets[hh->hashv & (tbl->num_buckets - 1)].hh_head = hh->hh_next;
    if (hh->hh_next)
        hh->hh_next->hh_prev = hh->hh_prev;
    tbl->num_items--;
    idx->n_items--;
#ifndef NDEBUG
    blk->hh.key = NULL; /* out of the index, for kvp__index_add's assert */
#endif
}
size_t kvp__index_bucket_bytes(const kvp__index *idx);

/* Prefetch hints for pipelined probes (see match() in lifecycle.c): first the bucket a key
 * maps to, then, once that has had time to arrive, the first entry of its chain. A probe
 * reads the handle's hh_next/keylen/hashv and the block's key right after the handle
 * (kvp__block starts with hh): the lines of hashv and of the key's last byte cover them.
 * The bucket array and mask are read once per walk into a kvp__probe_view. */
typedef struct kvp__probe_view {
    const UT_hash_bucket *buckets; /* the index's bucket array */
    unsigned mask;                 /* num_buckets - 1 */
} kvp__probe_view;

static inline kvp__probe_view kvp__index_view(const kvp__index *idx)
{
    const UT_hash_table *tbl = idx->head->hh.tbl;
    kvp__probe_view v = {tbl->buckets, tbl->num_buckets - 1};
    return v;
}

static inline void kvp__prefetch_bucket(kvp__probe_view v, kvp_key key)
{
    KVP__PREFETCH(&v.buckets[(unsigned)key.lo & v.mask]);
}

static inline void kvp__prefetch_handle(const UT_hash_handle *hh)
{
    KVP__PREFETCH((const char *)hh + offsetof(UT_hash_handle, hashv));
    KVP__PREFETCH((const char *)hh + sizeof(UT_hash_handle) + sizeof(kvp_key) - 1);
}

static inline const UT_hash_handle *kvp__prefetch_entry(kvp__probe_view v, kvp_key key)
{
    const UT_hash_handle *hh = v.buckets[(unsigned)key.lo & v.mask].hh_head;
    if (hh)
        kvp__prefetch_handle(hh);
    return hh; /* the chain's first handle: kvp__index_scan(hh, key) probes without the bucket */
}

/* The first block from handle hh on along its bucket chain whose key is key, or NULL: the
 * probe of kvp__index_find once the bucket's head is known (a pipelined walk reads it when
 * it prefetches the entry). hh is at offset 0 of kvp__block (index.c). Cannot fail. */
static inline kvp__block *kvp__index_scan(const UT_hash_handle *hh, kvp_key key)
{
    const unsigned hv = (unsigned)key.lo;
    for (; hh; hh = hh->hh_next) {
        const kvp__block *b = (const kvp__block *)(const void *)hh;
        if (hh->hashv == hv && hh->keylen == sizeof(kvp_key) && kvp__key_eq(b->key, key))
            return (kvp__block *)(uintptr_t)b;
    }
    return NULL;
}

typedef struct kvp__pool {
    kvp__block *blocks; /* n_blocks entries, indexed by block id, KVP__LINE-aligned */
    void *blocks_mem;   /* the allocation holding blocks: n_blocks + 1 records */
    uint32_t *state;    /* n_blocks state words, indexed by block id (top of this file) */
    uint32_t n_blocks;  /* pool size */
    uint32_t free_head; /* first free block, KVP_NIL if none */
    uint32_t n_free;    /* blocks on the free list */
    uint32_t n_lru;     /* cached blocks: live entries in the LRU ring */
    uint32_t n_in_use;  /* blocks in use (pinned) */
    uint32_t *lru;      /* the LRU ring: lru_cap block ids, live and stale (see pool.c) */
    uint64_t lru_cap;   /* entries in the ring: kvp__pool_ring_cap(n_blocks) */
    uint64_t lru_head;  /* absolute position of the oldest entry (evicted first) */
    uint64_t lru_tail;  /* absolute position after the newest entry; tail - head < cap */
    uint64_t clean_w;   /* while cleaning: [head, clean_w) cleaned, [clean_w, clean_r) a gap */
    uint64_t clean_r;   /*   of dead slots, [clean_r, tail) not cleaned yet */
    bool cleaning;      /* a cleaning pass is under way (clean_w/clean_r valid) */
    /* Retention priorities (retention.c): */
    uint32_t n_retained; /* cached blocks on retention queues, not counted in n_lru */
    bool general;        /* not the plain LRU path: the policy is not LRU, or retention is on */
} kvp__pool;

/* The ring's size for a pool of n blocks: 2 n + 16, within KVP__SLOT_LIMIT (a 2^30-block
 * pool gets 2 n - 16, still enough for the cleaning passes of pool.c). Cannot fail. */
static inline uint64_t kvp__pool_ring_cap(uint32_t n)
{
    uint64_t cap = 2 * (uint64_t)n + 16;
    return cap < KVP__SLOT_LIMIT ? cap : KVP__SLOT_LIMIT;
}

/* Block id's state word, and the predicates of the top of this file on it. Cannot fail. */
static inline uint32_t kvp__block_state(const kvp__pool *pool, uint32_t id)
{
    assert(id < pool->n_blocks);
    return pool->state[id];
}

static inline bool kvp__block_is_in_use(const kvp__pool *pool, uint32_t id)
{
    return kvp__st_is_in_use(kvp__block_state(pool, id));
}

static inline bool kvp__block_is_free(const kvp__pool *pool, uint32_t id)
{
    return kvp__st_is_free(kvp__block_state(pool, id));
}

static inline bool kvp__block_is_cached(const kvp__pool *pool, uint32_t id)
{
    return kvp__st_is_cached(kvp__block_state(pool, id));
}

static inline bool kvp__block_is_indexed(const kvp__pool *pool, uint32_t id)
{
    return kvp__st_is_indexed(kvp__block_state(pool, id));
}

static inline bool kvp__block_is_private(const kvp__pool *pool, uint32_t id)
{
    return kvp__st_is_private(kvp__block_state(pool, id));
}

/* Block id's pin count (0 unless in use). Cannot fail. */
static inline uint32_t kvp__block_ref(const kvp__pool *pool, uint32_t id)
{
    uint32_t w = kvp__block_state(pool, id);
    if (!kvp__st_is_in_use(w))
        return 0;
    return (w & KVP__ST_REFS) == KVP__ST_REF_SAT ? pool->blocks[id].ref_ext : w & KVP__ST_REFS;
}

/* The id of pool block b. Cannot fail. */
static inline uint32_t kvp__block_id(const kvp__pool *pool, const kvp__block *b)
{
    assert(b >= pool->blocks && b < pool->blocks + pool->n_blocks);
    return (uint32_t)(b - pool->blocks);
}

/* Is the ring entry in slot s, naming block id, that block's live LRU entry? The block's
 * state word is the slot exactly when it is cached there (see pool.c). Cannot fail. */
static inline bool kvp__lru_entry_live(const kvp__pool *pool, uint32_t id, uint32_t s)
{
    return kvp__block_state(pool, id) == s;
}

/* ---------------------------------------------------------------- verify (verify.c) */

/* Per-block provenance kept in collision-proof mode. Generations are 64-bit serials drawn
 * from one counter per cache, so a (block, generation) pair is never reused. */
typedef struct kvp__vmeta {
    uint64_t gen;        /* serial of the store that indexed the block's current content */
    uint64_t parent_gen; /* the parent's gen when this block was stored */
    uint32_t parent;     /* id of the indexed parent block, KVP_NIL for a first block */
    uint32_t ns;         /* first blocks: interned namespace id; KVP_NIL otherwise */
} kvp__vmeta;

/* A reference to one indexed instance of a block: its id and its generation then. */
typedef struct kvp__vref {
    uint32_t id;  /* block id, KVP_NIL for none */
    uint64_t gen; /* meta[id].gen when the reference was taken */
} kvp__vref;

#define KVP__VREF_NONE ((kvp__vref){KVP_NIL, 0})

typedef struct kvp__nsrec kvp__nsrec;
typedef struct kvp__nsroot kvp__nsroot;

typedef struct kvp__verify {
    uint32_t *tokens;    /* n_blocks * block_size tokens: block b at b * block_size */
    kvp__vmeta *meta;    /* n_blocks entries */
    kvp__nsroot *by_key; /* uthash by namespace root key; each entry chains its records */
    kvp__nsrec **slots;  /* interned namespaces by id; NULL slots are free */
    uint32_t n_slots;    /* capacity of slots */
    uint32_t free_slot;  /* lowest possibly free slot (search hint) */
    uint64_t serial;     /* last generation handed out (2^64: never wraps in practice) */
} kvp__verify;

/* ---------------------------------------------------------------- quotas (quota.c) */

/* One quota scope's group (a namespace, a tenant or a model: kvp_config.quota_scope): its
 * cached blocks in LRU order and its limit. */
typedef struct kvp__qgroup {
    UT_hash_handle hh;   /* quota.by_root linkage */
    kvp_key root;        /* the group key, kvp__quota_key: a full (untruncated) root key */
    uint32_t quota;      /* most cached blocks the scope may hold */
    uint32_t n_cached;   /* its cached (indexed, unpinned) blocks: the list's length */
    uint32_t head;       /* its least recently used cached block, KVP_NIL if none */
    uint32_t tail;       /* its most recently used cached block, KVP_NIL if none */
    uint32_t refs;       /* active requests + indexed blocks tagged + explicit_quota */
    bool explicit_quota; /* set by kvp_cache_set_quota: kept for the cache's lifetime */
} kvp__qgroup;

typedef struct kvp__quota {
    kvp__qgroup *by_root; /* uthash head of the groups */
    kvp__qgroup **group;  /* n_blocks entries: an indexed block's group; NULL: quotas off */
    uint32_t *prev;       /* n_blocks entries: previous block in its group's cached list */
    uint32_t *next;       /* n_blocks entries: next block in its group's cached list */
} kvp__quota;

int kvp__quota_init(kvp_cache *cache);
void kvp__quota_free(kvp_cache *cache);
int kvp__quota_intern(kvp_cache *cache, const kvp_namespace *ns, kvp__qgroup **out);
void kvp__quota_unref(kvp_cache *cache, kvp__qgroup *g);
void kvp__quota_tag(kvp_cache *cache, uint32_t id, kvp__qgroup *g);
void kvp__quota_untag(kvp_cache *cache, uint32_t id);
void kvp__quota_link(kvp_cache *cache, uint32_t id);
void kvp__quota_unlink(kvp_cache *cache, uint32_t id);
uint32_t kvp__quota_victim(const kvp_cache *cache, uint32_t id);
kvp_key kvp__quota_key(const kvp_cache *cache, const kvp_namespace *ns);

/* ---------------------------------------------------------------- requests (request.c) */

typedef struct kvp__request {
    UT_hash_handle hh;    /* requests table linkage, keyed by id */
    uint64_t id;          /* caller's request id */
    kvp_key root;         /* namespace root key */
    kvp_key last_key;     /* key of block n_committed-1, or root when none */
    uint32_t *blocks;     /* block table: cap_blocks entries, n_blocks used */
    uint32_t n_blocks;    /* blocks held (pinned) */
    uint32_t cap_blocks;  /* allocated entries in blocks */
    uint32_t n_committed; /* leading blocks that have keys (hit or committed) */
    uint32_t ns;          /* verify mode: interned namespace id, else KVP_NIL */
    kvp__vref canon;      /* verify mode: the accepted instance holding last_key, or none */
    uint64_t *prompt_fp;  /* fingerprints of the acquired prompt's blocks from prompt_start
                             on (kvp__tokens_fp of each block's prompt tokens), kept until
                             every prompt token is committed (kvp_commit compares); or NULL */
    size_t n_prompt;      /* the acquired prompt's length in tokens */
    size_t prompt_start;  /* first token fingerprinted: the hit blocks' end (block-aligned) */
    const kvp_key *ahead; /* keys of the n_ahead prompt blocks from prompt_start on that
                             acquire's match hashed past its first miss (in the prompt_fp
                             allocation, after the fingerprints), or NULL: kvp_commit takes
                             them instead of hashing those blocks again */
    uint32_t n_ahead;     /* entries in ahead; 0 when ahead is NULL */
    uint64_t fp_last;     /* once only the prompt's partial last block is uncommitted: its
                             fingerprint, which prompt_fp then points to (a one-entry array
                             from prompt_start on; kvp__request_narrow_prompt) */
    kvp_key last_high;    /* vllm-sha256: high half of the chain value after last_key */
    kvp__vctx vx;         /* vllm-*: extra keys, pointing into vx_mem */
    void *vx_mem;         /* vllm-*: copy of the adapter and salt bytes, or NULL */
    size_t vx_len;        /* size of vx_mem */
    kvp__qgroup *qg;      /* quotas on: the namespace's quota group (one reference), else NULL */
} kvp__request;

/* The request's counts are in order: committed blocks are held, held blocks fit the table.
 * Cannot fail. */
static inline bool kvp__request_counts_ok(const kvp__request *req)
{
    return req->n_committed <= req->n_blocks && req->n_blocks <= req->cap_blocks;
}

/* ---------------------------------------------------------------- the cache (cache.c) */

struct kvp_cache {
    kvp_config cfg;         /* copy of the creation config */
    kvp__mem mem;           /* allocator and live-byte count */
    kvp__pool pool;         /* physical blocks, free list, LRU ring */
    kvp__index index;       /* key -> block */
    kvp__request *requests; /* uthash head of active requests */
    kvp__verify verify;     /* collision-proof mode state; zeroed when off */
    kvp__quota quota;       /* quotas per scope; zeroed when off (cfg.ns_quota == 0) */
    kvp__policy policy;     /* eviction policy state; zeroed under LRU (policy.h) */
    kvp_stats stats;        /* counters (pool gauges filled in on read) */
    kvp_key *scratch_keys;  /* kvp_access: keys of the current prompt */
    uint32_t *scratch_ids;  /* kvp_access: blocks touched by the current prompt */
    size_t scratch_cap;     /* entries in both scratch arrays */
    unsigned key_bits;      /* 128, or fewer in collision tests (kvp__cache_set_key_bits) */
    pthread_rwlock_t lock;  /* readers: lookups, stats, checks; writers: every mutation */
    bool lock_ready;        /* lock was initialised (kvp_cache_new got that far) */
    /* Counters that readers bump under the shared lock; summed into kvp_stats on read. */
    _Atomic uint64_t n_lookups;        /* kvp_stats.n_lookups */
    _Atomic uint64_t n_verify_rejects; /* kvp_stats.n_verify_rejects */
    kvp_hasher hasher; /* the key function (profile, key, seeds); fixed at creation */

    kvp__retention retention; /* retention priorities; zeroed until first used (retention.c) */
    struct kvp__tiers *tiers; /* lower tiers and their orders (tier.h), or NULL: none */
};

/* Has any request carried retention (kvp_retention)? Until then every retention hook is
 * skipped by this one test. Cannot fail. */
static inline bool kvp__retention_on(const kvp_cache *cache)
{
    return cache->retention.on;
}

/* ---------------------------------------------------------------- locking (lock.c) */

/* One event callback running on this thread: the cache it came from and the frame of the
 * callback it is nested in (a callback of cache A may call cache B, whose callback runs
 * while A's still does). The frames live on the emitting threads' stacks. */
typedef struct kvp__cb_frame {
    const kvp_cache *cache;   /* the cache whose callback runs */
    struct kvp__cb_frame *up; /* the enclosing frame on this thread, or NULL */
} kvp__cb_frame;

/* The frame list is read on every public call, so it uses the initial-exec TLS model: a
 * plain thread-pointer offset instead of a __tls_get_addr call per read in a shared
 * library (one pointer fits the static TLS surplus that dlopen leaves, also for the Python
 * extension). */
#if defined(__GNUC__)
#define KVP__TLS _Thread_local __attribute__((tls_model("initial-exec")))
#else
#define KVP__TLS _Thread_local
#endif
extern KVP__TLS kvp__cb_frame *kvp__cb_top; /* innermost frame of this thread */

/* Is this thread inside one of cache's event callbacks? Then every call on cache returns
 * KVP_EBUSY: the thread holds the cache's write lock, and the cache is mid-operation. */
static inline bool kvp__in_callback(const kvp_cache *cache)
{
    for (const kvp__cb_frame *f = kvp__cb_top; f; f = f->up)
        if (f->cache == cache)
            return true;
    return false;
}

int kvp__lock_init(kvp_cache *cache);
void kvp__lock_destroy(kvp_cache *cache);

/* Emit an event if a callback is set (marks the cache busy on this thread meanwhile). */
void kvp__emit(kvp_cache *cache, const kvp_event *ev);

/* Count a key match that failed verification (any lock mode). Cannot fail. */
static inline void kvp__count_reject(kvp_cache *cache)
{
    atomic_fetch_add_explicit(&cache->n_verify_rejects, 1, memory_order_relaxed);
}

/* The bodies of the public calls, run by lock.c with the cache's lock held (shared for
 * lookups, stats and checks; exclusive for the rest) and cache non-NULL. Each returns what
 * its public form documents in kvprefix.h. Where a body takes root and keys, NULL keys
 * means "hash tokens here" (then root may be NULL too: computed from ns), and non-NULL keys
 * are the caller's precomputed block keys (kvp_cache_keys) under the given root. */
int kvp__lookup_locked(kvp_cache *cache, const kvp_namespace *ns, const uint32_t *tokens,
                       size_t n_tokens, uint32_t *block_ids, size_t cap, kvp_match *out);
int kvp__lookup_ids_locked(kvp_cache *cache, const kvp_namespace *ns, const kvp_key *ids,
                           size_t n_ids, size_t n_tokens, uint32_t *block_ids, size_t cap,
                           kvp_match *out);
int kvp__lookup_keys_locked(kvp_cache *cache, const kvp_namespace *ns, kvp_key root,
                            const kvp_key *keys, const uint32_t *tokens, size_t n_tokens,
                            uint32_t *block_ids, size_t cap, kvp_match *out);
int kvp__acquire_locked(kvp_cache *cache, uint64_t req_id, const kvp_namespace *ns,
                        const kvp_key *root, const kvp_key *keys, const uint32_t *tokens,
                        size_t n_tokens, size_t n_capacity, kvp_match *out);
int kvp__grow_locked(kvp_cache *cache, uint64_t req_id, size_t n_capacity);
int kvp__request_blocks_locked(const kvp_cache *cache, uint64_t req_id, const uint32_t **ids,
                               size_t *n);
int kvp__commit_locked(kvp_cache *cache, uint64_t req_id, const kvp_key *keys,
                       const uint32_t *tokens, size_t n_tokens, size_t *n_stored);
int kvp__release_locked(kvp_cache *cache, uint64_t req_id);
int kvp__requests_locked(const kvp_cache *cache, uint64_t *ids, size_t cap, size_t *n_active);
int kvp__release_all_locked(kvp_cache *cache, size_t *n_released);
int kvp__access_locked(kvp_cache *cache, const kvp_namespace *ns, const kvp_key *root,
                       const kvp_key *keys, const uint32_t *tokens, size_t n_tokens,
                       kvp_match *out);
int kvp__access_ids_locked(kvp_cache *cache, const kvp_namespace *ns, const kvp_key *ids,
                           size_t n_ids, size_t n_tokens, kvp_match *out);
int kvp__cache_stats_locked(const kvp_cache *cache, kvp_stats *out);
void kvp__cache_destroy(kvp_cache *cache);
int kvp__cache_reset_locked(kvp_cache *cache);
int kvp__set_quota_locked(kvp_cache *cache, const kvp_namespace *ns, uint32_t max_cached_blocks);

/* Pool operations (pool.c). None allocates; none can fail unless stated. */
int kvp__pool_init(kvp_cache *cache);
void kvp__pool_free(kvp_cache *cache);
void kvp__pool_pin(kvp_cache *cache, uint32_t id);
void kvp__pool_unpin_tail_first(kvp_cache *cache, const uint32_t *ids, uint32_t n);
uint32_t kvp__pool_take(kvp_cache *cache); /* KVP_NIL when no free or cached block */
void kvp__pool_take_n(kvp_cache *cache, uint32_t *ids, uint32_t n);
void kvp__pool_unindex(kvp_cache *cache, uint32_t id, int reason);
void kvp__pool_drop_cached(kvp_cache *cache, int reason);
void kvp__pool_enforce_quota(kvp_cache *cache, kvp__qgroup *g);
void kvp__pool_requeue(kvp_cache *cache, uint32_t id, uint32_t depth);
void kvp__pool_hold(kvp_cache *cache, uint32_t id);
void kvp__pool_unhold(kvp_cache *cache, uint32_t id, uint32_t depth);

/* Is the eviction policy LRU (the pool's own ring, pool.c)? Cannot fail. */
static inline bool kvp__policy_is_lru(const kvp_cache *cache)
{
    return cache->cfg.eviction == KVP_EVICT_LRU;
}

/* Does the pool run its plain LRU path (LRU, retention never used)? Cannot fail. */
static inline bool kvp__pool_plain(const kvp_cache *cache)
{
    return !cache->pool.general;
}

static inline bool kvp__quotas_on(const kvp_cache *cache)
{
    return cache->quota.group != NULL;
}

static inline uint32_t kvp__pool_available(const kvp__pool *pool)
{
    return pool->n_free + pool->n_lru + pool->n_retained;
}

/* Requests table (request.c). */
kvp__request *kvp__request_find(const kvp_cache *cache, uint64_t id);
int kvp__request_new(kvp_cache *cache, uint64_t id, uint32_t cap_blocks, kvp__request **out);
int kvp__request_reserve(kvp_cache *cache, kvp__request *req, uint32_t cap_blocks);
void kvp__request_delete(kvp_cache *cache, kvp__request *req);
int kvp__request_keep_prompt(kvp_cache *cache, kvp__request *req, const uint32_t *tokens,
                             size_t n_tokens, size_t start, const kvp_key *ahead, uint32_t n_ahead);
void kvp__request_drop_prompt(kvp_cache *cache, kvp__request *req);
void kvp__request_narrow_prompt(kvp_cache *cache, kvp__request *req);

/* Verify mode (verify.c). */
int kvp__verify_init(kvp_cache *cache);
void kvp__verify_free(kvp_cache *cache);
int kvp__verify_ns_intern(kvp_cache *cache, const kvp_namespace *ns, kvp_key root, uint32_t *out);
uint32_t kvp__verify_ns_find(const kvp_cache *cache, const kvp_namespace *ns, kvp_key root);
void kvp__verify_ns_ref(kvp_cache *cache, uint32_t ns);
void kvp__verify_ns_unref(kvp_cache *cache, uint32_t ns);
bool kvp__verify_block(const kvp_cache *cache, uint32_t id, const uint32_t *tokens,
                       kvp__vref parent, uint32_t ns);
void kvp__verify_store(kvp_cache *cache, uint32_t id, const uint32_t *tokens, kvp__vref parent,
                       uint32_t ns);
void kvp__verify_forget(kvp_cache *cache, uint32_t id);
uint32_t kvp__verify_ns_refs(const kvp_cache *cache, uint32_t s);

static inline bool kvp__verifying(const kvp_cache *cache)
{
    return cache->cfg.verify_tokens;
}

/* A reference to block id as it is indexed now (none outside verify mode or for KVP_NIL). */
static inline kvp__vref kvp__vref_of(const kvp_cache *cache, uint32_t id)
{
    if (!kvp__verifying(cache) || id == KVP_NIL)
        return KVP__VREF_NONE;
    assert(id < cache->pool.n_blocks);
    kvp__vref r = {id, cache->verify.meta[id].gen};
    return r;
}

/* The cache's key functions (apply the test-only truncation). */
kvp_key kvp__cache_root(const kvp_cache *cache, const kvp_namespace *ns);
kvp_key kvp__cache_external_key(const kvp_cache *cache, kvp_key root, kvp_key id);

/* The xxh3 profile's namespace root (keys.c); also the vllm-* scope root. Cannot fail. */
kvp_key kvp__ns_root_xxh3(uint64_t seed, const kvp_namespace *ns);

/* Validate a namespace's fields: KVP_OK or KVP_EINVAL. */
int kvp__ns_valid(const kvp_namespace *ns);

/* Invariant checkers (check.c), one per stateful module, and all of them in turn: each
 * returns KVP_OK, KVP_ECORRUPT, or KVP_ENOMEM when its counters cannot be allocated. */
int kvp__pool_check(const kvp_cache *cache);
int kvp__pool_policy_check(const kvp_cache *cache);
int kvp__index_check(const kvp_cache *cache);
int kvp__requests_check(const kvp_cache *cache);
int kvp__verify_check(const kvp_cache *cache);
int kvp__quota_check(const kvp_cache *cache);
int kvp__cache_check(const kvp_cache *cache);

/* Test hook: truncate every key this cache computes to `bits` low bits (1..128), so that
 * collisions become common. Only valid on an empty cache (no cached blocks, no requests).
 * Returns KVP_OK or KVP_EINVAL. */
int kvp__cache_set_key_bits(kvp_cache *cache, unsigned bits);

#endif /* KVP_INTERNAL_H */
