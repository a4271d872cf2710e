/*
 * test_check.c - the invariant checker catches every kind of corruption it claims to cover,
 * and the library's assert()s stop internal misuse.
 *
 * A checker is only trusted once a test shows it catching each kind of corruption. Each
 * test below builds the same small cache (a "scene" holding blocks in every state: free,
 * cached, in use and indexed, in use and private; an active request; in collision-proof
 * mode two interned namespaces), corrupts exactly one structure through the internals,
 * expects KVP_ECORRUPT from the module checker that owns the structure and from the public
 * kvp_cache_check, then restores the structure and expects KVP_OK again (so the failure was
 * the corruption's, and kvp_cache_free meets a sound cache). Where a corruption belongs to
 * one module only, the other checkers are shown to pass, so each checker is tested on its
 * own.
 *
 * The second half (suite check_asserts) runs internal functions with a broken precondition
 * and expects the process to abort on an assert(): unpinning at reference count 0, pinning
 * a free block, indexing a block twice, taking a non-free block from the free
 * list, bad request counts, a namespace reference dropped past zero. These need assert()
 * compiled in, which meson's b_ndebug=if-release does for every non-release build (the
 * test, sanitizer and fuzz builds); under NDEBUG they are left out.
 */
#include <signal.h>
#include <string.h>

#include <criterion/criterion.h>

#include "internal.h"
#include "kvprefix.h"
#include "testutil.h"

#define BS       4  /* tokens per block */
#define N_BLOCKS 16 /* pool size */
#define REQ_ID   1  /* the scene's active request */

/* The scene: one cache with a block in every state and the ids of one of each. */
typedef struct scene {
    kvp_cache *c;
    kvp__request *req;   /* the active request REQ_ID */
    uint32_t free_id;    /* the free-list head */
    uint32_t cached_id;  /* cached: indexed, unpinned, in the LRU ring */
    uint32_t pinned_id;  /* in use and indexed (a hit of the request) */
    uint32_t private_id; /* in use, not indexed (the request's partial last block) */
    uint32_t first_id;   /* an indexed first block (verify mode: names a namespace) */
    uint32_t later_id;   /* an indexed later block (verify mode: names a parent) */
} scene;

/* The first block satisfying pred, or fail the test. */
static uint32_t find_block(const kvp_cache *c, bool (*pred)(const kvp__pool *, uint32_t),
                           const char *what)
{
    for (uint32_t id = 0; id < c->pool.n_blocks; id++)
        if (pred(&c->pool, id))
            return id;
    cr_assert_fail("the scene has no %s block", what);
    return KVP_NIL;
}

static bool is_pinned_indexed(const kvp__pool *pool, uint32_t id)
{
    return kvp__block_is_in_use(pool, id) && kvp__block_is_indexed(pool, id);
}

/* Build the scene:
 *  1. kvp_access caches prompt A = 1..16 (4 full blocks) in namespace "t";
 *  2. request REQ_ID acquires A[0..8) + 5 other tokens: it pins A's first 2 blocks (hits)
 *     and takes 2 fresh ones, then commits 12 tokens, so its third block is indexed and
 *     its fourth (partial) stays private; A's last 2 blocks stay cached;
 *  3. in verify mode, a second namespace "u" caches 2 blocks of its own.
 * Every checker passes on it. */
static scene scene_new(bool verify)
{
    scene s;
    memset(&s, 0, sizeof s);
    s.c = th_cache(N_BLOCKS, BS, verify, NULL, NULL);
    kvp_namespace ns, other;
    th_ns(&ns, "m", NULL, "t", NULL);
    th_ns(&other, "m", NULL, "u", NULL);
    uint32_t a[16], p[13], b[8];
    for (uint32_t i = 0; i < 16; i++)
        a[i] = 1 + i;
    for (uint32_t i = 0; i < 13; i++)
        p[i] = i < 8 ? a[i] : 100 + i;
    for (uint32_t i = 0; i < 8; i++)
        b[i] = 200 + i;

    /* Step 1: cache A. */
    th_access_ok(s.c, &ns, a, 16);
    /* Step 2: the request. */
    kvp_match m = th_acquire_ok(s.c, REQ_ID, &ns, p, 13, 0);
    cr_assert_eq(m.n_blocks_hit, 2);
    size_t n_stored;
    cr_assert_eq(kvp_commit(s.c, REQ_ID, p, 12, &n_stored), KVP_OK);
    cr_assert_eq(n_stored, 1);
    /* Step 3: a second namespace. */
    if (verify)
        th_access_ok(s.c, &other, b, 8);

    s.req = kvp__request_find(s.c, REQ_ID);
    cr_assert_not_null(s.req);
    cr_assert_eq(s.req->n_blocks, 4);
    s.free_id = s.c->pool.free_head;
    cr_assert_neq(s.free_id, KVP_NIL);
    s.cached_id = find_block(s.c, kvp__block_is_cached, "cached");
    s.pinned_id = s.req->blocks[0];
    s.private_id = s.req->blocks[3];
    s.first_id = s.req->blocks[0];
    s.later_id = s.req->blocks[1];
    cr_assert(is_pinned_indexed(&s.c->pool, s.pinned_id));
    cr_assert(kvp__block_is_private(&s.c->pool, s.private_id));
    cr_assert_eq(find_block(s.c, kvp__block_is_private, "private"), s.private_id);
    cr_assert(kvp__block_is_free(&s.c->pool, s.free_id));
    cr_assert_eq(kvp__pool_check(s.c), KVP_OK);
    cr_assert_eq(kvp__index_check(s.c), KVP_OK);
    cr_assert_eq(kvp__requests_check(s.c), KVP_OK);
    cr_assert_eq(kvp__verify_check(s.c), KVP_OK);
    TH_CHECK(s.c);
    return s;
}

/* The scene after the corruption was undone: sound again, then released and freed. */
static void scene_end(scene *s)
{
    TH_CHECK(s->c);
    cr_assert_eq(kvp_release(s->c, REQ_ID), KVP_OK);
    TH_CHECK(s->c);
    kvp_cache_free(s->c);
}

/* The module checker `check` and the public checker both report the corruption. */
#define EXPECT_CORRUPT(c, check)                                                                   \
    do {                                                                                           \
        cr_assert_eq(check(c), KVP_ECORRUPT, #check " missed the corruption");                     \
        cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT, "kvp_cache_check missed the corruption");   \
    } while (0)

/* ---------------------------------------------------------------------------------------- */
/* Pool: reference counts, block states and counts                                          */
/* ---------------------------------------------------------------------------------------- */

Test(check, scene_is_sound)
{
    scene s = scene_new(false);
    scene_end(&s);
    scene v = scene_new(true);
    scene_end(&v);
}

Test(check, refcount_on_cached_block)
{
    scene s = scene_new(false);
    uint32_t saved = s.c->pool.state[s.cached_id];
    /* pinned, yet still on the LRU ring */
    s.c->pool.state[s.cached_id] = KVP__ST_IN_USE | KVP__ST_INDEXED | 1;
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    s.c->pool.state[s.cached_id] = saved;
    scene_end(&s);
}

Test(check, refcount_against_block_tables)
{
    /* One pin too many on an in-use block: every state and count still agrees, only the
     * requests' block tables tell. */
    scene s = scene_new(false);
    s.c->pool.state[s.pinned_id]++;
    cr_assert_eq(kvp__pool_check(s.c), KVP_OK);
    cr_assert_eq(kvp__index_check(s.c), KVP_OK);
    EXPECT_CORRUPT(s.c, kvp__requests_check);
    s.c->pool.state[s.pinned_id]--;

    s.c->pool.state[s.private_id]++;
    EXPECT_CORRUPT(s.c, kvp__requests_check);
    s.c->pool.state[s.private_id]--;
    scene_end(&s);
}

Test(check, refcount_marker_left_behind)
{
    /* count_unpinned (lifecycle.c) marks cached blocks' state words with KVP__ST_MARK and
     * must restore them. */
    scene s = scene_new(false);
    uint32_t saved = s.c->pool.state[s.cached_id];
    s.c->pool.blocks[s.cached_id].ref_ext = saved;
    s.c->pool.state[s.cached_id] = KVP__ST_MARK;
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    s.c->pool.state[s.cached_id] = saved;
    scene_end(&s);
}

Test(check, state_word_malformed)
{
    /* In use with a pin count of 0; a saturated count whose record holds too few pins. */
    scene s = scene_new(false);
    uint32_t saved = s.c->pool.state[s.pinned_id];
    s.c->pool.state[s.pinned_id] = KVP__ST_IN_USE | KVP__ST_INDEXED;
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    s.c->pool.state[s.pinned_id] = KVP__ST_IN_USE | KVP__ST_INDEXED | KVP__ST_REF_SAT;
    s.c->pool.blocks[s.pinned_id].ref_ext = 1;
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    s.c->pool.state[s.pinned_id] = saved;
    scene_end(&s);
}

Test(check, pin_count_past_the_state_word)
{
    /* A pin count past the state word's 30 bits moves to the record's ref_ext and back:
     * the pool stays consistent and the count exact at each step (the block tables are not
     * consulted: only kvp__requests_check would count pins). */
    scene s = scene_new(false);
    kvp__pool *pool = &s.c->pool;
    uint32_t id = s.pinned_id, saved = pool->state[id];
    cr_assert_eq(kvp__block_ref(pool, id), 1);
    pool->state[id] = KVP__ST_IN_USE | KVP__ST_INDEXED | (KVP__ST_REF_SAT - 2);
    kvp__pool_pin(s.c, id); /* SAT - 1: still in the word */
    cr_assert_eq(pool->state[id] & KVP__ST_REFS, KVP__ST_REF_SAT - 1);
    kvp__pool_pin(s.c, id); /* SAT: in the record */
    cr_assert_eq(pool->state[id] & KVP__ST_REFS, KVP__ST_REF_SAT);
    cr_assert_eq(kvp__block_ref(pool, id), KVP__ST_REF_SAT);
    kvp__pool_hold(s.c, id);
    cr_assert_eq(kvp__block_ref(pool, id), KVP__ST_REF_SAT + 1);
    cr_assert_eq(kvp__pool_check(s.c), KVP_OK);
    kvp__pool_unhold(s.c, id, 0);
    kvp__pool_unhold(s.c, id, 0);
    cr_assert_eq(pool->state[id], KVP__ST_IN_USE | KVP__ST_INDEXED | (KVP__ST_REF_SAT - 1));
    cr_assert_eq(kvp__block_ref(pool, id), KVP__ST_REF_SAT - 1);
    cr_assert_eq(kvp__pool_check(s.c), KVP_OK);
    pool->state[id] = saved;
    scene_end(&s);
}

Test(check, pool_counts)
{
    scene s = scene_new(false);
    kvp__pool *pool = &s.c->pool;
    uint32_t *counts[] = {&pool->n_free, &pool->n_lru, &pool->n_in_use};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        (*counts[i])++;
        EXPECT_CORRUPT(s.c, kvp__pool_check);
        (*counts[i]) -= 2;
        EXPECT_CORRUPT(s.c, kvp__pool_check);
        (*counts[i])++;
        TH_CHECK(s.c);
    }
    scene_end(&s);
}

/* ---------------------------------------------------------------------------------------- */
/* Pool: the free list                                                                      */
/* ---------------------------------------------------------------------------------------- */

Test(check, free_list_cycle)
{
    scene s = scene_new(false);
    kvp__block *head = &s.c->pool.blocks[s.free_id];
    uint32_t saved = head->next;
    head->next = s.free_id;
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    head->next = saved;
    scene_end(&s);
}

Test(check, free_list_link_out_of_range)
{
    scene s = scene_new(false);
    kvp__block *head = &s.c->pool.blocks[s.free_id];
    uint32_t saved = head->next;
    head->next = N_BLOCKS + 5;
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    head->next = saved;
    scene_end(&s);
}

Test(check, free_list_links_cached_block)
{
    scene s = scene_new(false);
    uint32_t tail = s.free_id;
    while (s.c->pool.blocks[tail].next != KVP_NIL)
        tail = s.c->pool.blocks[tail].next;
    s.c->pool.blocks[tail].next = s.cached_id;
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    s.c->pool.blocks[tail].next = s.pinned_id;
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    s.c->pool.blocks[tail].next = KVP_NIL;
    scene_end(&s);
}

Test(check, free_list_loses_block)
{
    scene s = scene_new(false);
    s.c->pool.free_head = s.c->pool.blocks[s.free_id].next;
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    s.c->pool.free_head = s.free_id;
    scene_end(&s);
}

Test(check, free_block_claims_lru_slot)
{
    scene s = scene_new(false);
    s.c->pool.state[s.free_id] = 0; /* cached in slot 0, yet on the free list */
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    s.c->pool.state[s.free_id] = KVP__ST_FREE;
    scene_end(&s);
}

/* ---------------------------------------------------------------------------------------- */
/* Pool: the LRU ring                                                                       */
/* ---------------------------------------------------------------------------------------- */

Test(check, lru_slot_points_elsewhere)
{
    scene s = scene_new(false);
    uint32_t *w = &s.c->pool.state[s.cached_id];
    uint32_t saved = *w;
    *w = (uint32_t)((saved + 1) % s.c->pool.lru_cap);
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    *w = KVP__ST_CACHED; /* cached with no entry at all */
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    *w = (uint32_t)s.c->pool.lru_cap; /* past the ring */
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    *w = saved;
    scene_end(&s);
}

Test(check, lru_entry_names_another_block)
{
    scene s = scene_new(false);
    uint32_t slot = s.c->pool.state[s.cached_id];
    s.c->pool.lru[slot] = s.free_id;
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    s.c->pool.lru[slot] = N_BLOCKS; /* no such block */
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    s.c->pool.lru[slot] = s.cached_id;
    scene_end(&s);
}

Test(check, lru_slot_on_pinned_block)
{
    /* A pinned block whose state word names a ring entry (so cached there: the pin is
     * lost) would be evicted from under its request. */
    scene s = scene_new(false);
    uint32_t slot = s.c->pool.state[s.cached_id], saved = s.c->pool.state[s.private_id];
    s.c->pool.state[s.private_id] = slot;
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    s.c->pool.state[s.private_id] = saved;
    scene_end(&s);
}

Test(check, lru_window_out_of_shape)
{
    scene s = scene_new(false);
    kvp__pool *pool = &s.c->pool;
    uint64_t head = pool->lru_head, tail = pool->lru_tail;
    pool->lru_tail = head - 1; /* tail before head */
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    pool->lru_tail = head + pool->lru_cap + 1; /* wider than the ring */
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    pool->lru_tail = tail;
    pool->lru_head = tail; /* empty window: the cached blocks' entries fall outside */
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    pool->lru_head = head;
    uint64_t cap = pool->lru_cap;
    pool->lru_cap = N_BLOCKS - 1; /* a ring smaller than the pool */
    EXPECT_CORRUPT(s.c, kvp__pool_check);
    pool->lru_cap = cap;
    scene_end(&s);
}

/* ---------------------------------------------------------------------------------------- */
/* Index                                                                                    */
/* ---------------------------------------------------------------------------------------- */

Test(check, index_entry_key_changed)
{
    /* The table keeps a pointer to the block's own key, so the key is stored once: a change
     * in the low half (the bucket hash) leaves the entry in the wrong bucket under a stale
     * hash and is caught; the high half has no second copy to compare with. */
    scene s = scene_new(false);
    kvp__block *b = &s.c->pool.blocks[s.cached_id];
    b->key.lo ^= 1;
    EXPECT_CORRUPT(s.c, kvp__index_check);
    b->key.lo ^= UINT64_C(1) << 31 | 1; /* the same bucket, another hash value */
    EXPECT_CORRUPT(s.c, kvp__index_check);
    b->key.lo ^= UINT64_C(1) << 31;
    scene_end(&s);
}

Test(check, index_entry_handle)
{
    scene s = scene_new(false);
    kvp__block *b = &s.c->pool.blocks[s.pinned_id];
    b->hh.hashv ^= 1; /* the entry's stored hash no longer matches its key */
    EXPECT_CORRUPT(s.c, kvp__index_check);
    b->hh.hashv ^= 1;
    b->hh.keylen = 15;
    EXPECT_CORRUPT(s.c, kvp__index_check);
    b->hh.keylen = (unsigned)sizeof(kvp_key);
    scene_end(&s);
}

Test(check, index_chain_cycle)
{
    scene s = scene_new(false);
    kvp__block *b = &s.c->pool.blocks[s.cached_id];
    UT_hash_handle *saved = b->hh.hh_next;
    b->hh.hh_next = &b->hh; /* a chain that loops on itself: a missing lookup never ends */
    EXPECT_CORRUPT(s.c, kvp__index_check);
    b->hh.hh_next = saved;
    scene_end(&s);
}

Test(check, index_chain_link_out_of_pool)
{
    /* The checker range-checks a link before it reads through it (ASan would see it). */
    scene s = scene_new(false);
    kvp__block *b = &s.c->pool.blocks[s.pinned_id];
    UT_hash_handle *saved = b->hh.hh_next;
    b->hh.hh_next = (UT_hash_handle *)(void *)(s.c->pool.blocks + N_BLOCKS);
    EXPECT_CORRUPT(s.c, kvp__index_check);
    b->hh.hh_next = (UT_hash_handle *)(void *)((char *)&s.c->pool.blocks[1] + 8);
    EXPECT_CORRUPT(s.c, kvp__index_check); /* inside the pool, but not at a block */
    b->hh.hh_next = saved;
    scene_end(&s);
}

Test(check, index_chain_links_unindexed_block)
{
    scene s = scene_new(false);
    kvp__block *b = &s.c->pool.blocks[s.cached_id];
    kvp__block *p = &s.c->pool.blocks[s.private_id];
    UT_hash_handle *saved = b->hh.hh_next;
    b->hh.hh_next = &p->hh; /* in use, not indexed: no chain may hold it */
    p->hh.hh_next = saved;
    EXPECT_CORRUPT(s.c, kvp__index_check);
    b->hh.hh_next = saved;
    scene_end(&s);
}

Test(check, index_chain_back_link)
{
    scene s = scene_new(false);
    kvp__block *b = &s.c->pool.blocks[s.cached_id];
    UT_hash_handle *saved = b->hh.hh_prev;
    b->hh.hh_prev = &b->hh;
    EXPECT_CORRUPT(s.c, kvp__index_check);
    b->hh.hh_prev = saved;
    scene_end(&s);
}

Test(check, index_bucket_counts)
{
    /* The chain holding the cached block is cut off at its bucket; then the bucket's count
     * is not the one init left (the counts are not kept: index.c), and the table's item
     * count disagrees with the chains. */
    scene s = scene_new(false);
    UT_hash_table *tbl = s.c->index.head->hh.tbl;
    kvp__block *b = &s.c->pool.blocks[s.cached_id];
    UT_hash_bucket *bucket = &tbl->buckets[b->hh.hashv & (tbl->num_buckets - 1)];
    UT_hash_handle *saved = bucket->hh_head;
    bucket->hh_head = NULL;
    EXPECT_CORRUPT(s.c, kvp__index_check);
    bucket->hh_head = saved;
    bucket->count++;
    EXPECT_CORRUPT(s.c, kvp__index_check);
    bucket->count--;
    tbl->num_items++;
    EXPECT_CORRUPT(s.c, kvp__index_check);
    tbl->num_items--;
    scene_end(&s);
}

Test(check, indexed_flag_cleared)
{
    /* An in-use block forgets it is indexed: the pool cannot tell (it looks private), the
     * index can (its entry count no longer matches). */
    scene s = scene_new(false);
    s.c->pool.state[s.pinned_id] &= ~KVP__ST_INDEXED;
    cr_assert_eq(kvp__pool_check(s.c), KVP_OK);
    EXPECT_CORRUPT(s.c, kvp__index_check);
    s.c->pool.state[s.pinned_id] |= KVP__ST_INDEXED;
    scene_end(&s);
}

Test(check, indexed_flag_set_without_entry)
{
    scene s = scene_new(false);
    s.c->pool.state[s.private_id] |= KVP__ST_INDEXED;
    cr_assert_eq(kvp__pool_check(s.c), KVP_OK);
    EXPECT_CORRUPT(s.c, kvp__index_check);
    s.c->pool.state[s.private_id] &= ~KVP__ST_INDEXED;
    scene_end(&s);
}

Test(check, index_item_count)
{
    scene s = scene_new(false);
    s.c->index.n_items++;
    EXPECT_CORRUPT(s.c, kvp__index_check);
    s.c->index.n_items -= 2;
    EXPECT_CORRUPT(s.c, kvp__index_check);
    s.c->index.n_items++;
    scene_end(&s);
}

Test(check, index_bucket_count_changed)
{
    scene s = scene_new(false);
    s.c->index.log2_buckets++;
    EXPECT_CORRUPT(s.c, kvp__index_check);
    s.c->index.log2_buckets--;
    scene_end(&s);
}

Test(check, index_key_outside_truncation)
{
    /* The cache claims 64-bit keys while its indexed keys use all 128 bits. */
    scene s = scene_new(false);
    s.c->key_bits = 64;
    EXPECT_CORRUPT(s.c, kvp__index_check);
    s.c->key_bits = 128;
    scene_end(&s);
}

/* ---------------------------------------------------------------------------------------- */
/* Requests                                                                                 */
/* ---------------------------------------------------------------------------------------- */

Test(check, request_block_table_entry)
{
    scene s = scene_new(false);
    s.req->blocks[3] = s.free_id; /* holds a block it never pinned */
    cr_assert_eq(kvp__pool_check(s.c), KVP_OK);
    EXPECT_CORRUPT(s.c, kvp__requests_check);
    s.req->blocks[3] = N_BLOCKS; /* a block outside the pool */
    EXPECT_CORRUPT(s.c, kvp__requests_check);
    s.req->blocks[3] = s.private_id;
    scene_end(&s);
}

Test(check, request_counts)
{
    scene s = scene_new(false);
    uint32_t committed = s.req->n_committed, cap = s.req->cap_blocks;
    s.req->n_committed = s.req->n_blocks + 1;
    EXPECT_CORRUPT(s.c, kvp__requests_check);
    s.req->n_committed = committed;
    s.req->cap_blocks = s.req->n_blocks - 1;
    EXPECT_CORRUPT(s.c, kvp__requests_check);
    s.req->cap_blocks = cap;
    scene_end(&s);
}

Test(check, request_verify_state_outside_verify_mode)
{
    scene s = scene_new(false);
    s.req->ns = 0;
    EXPECT_CORRUPT(s.c, kvp__requests_check);
    s.req->ns = KVP_NIL;
    s.req->canon.id = s.pinned_id;
    EXPECT_CORRUPT(s.c, kvp__requests_check);
    s.req->canon.id = KVP_NIL;
    scene_end(&s);
}

Test(check, request_canon_out_of_range)
{
    scene s = scene_new(true);
    kvp__vref saved = s.req->canon;
    cr_assert_neq(saved.id, KVP_NIL);
    s.req->canon.id = N_BLOCKS;
    EXPECT_CORRUPT(s.c, kvp__requests_check);
    s.req->canon = saved;
    scene_end(&s);
}

/* ---------------------------------------------------------------------------------------- */
/* Verify mode: provenance and interned namespaces                                          */
/* ---------------------------------------------------------------------------------------- */

Test(check, namespace_refs)
{
    scene s = scene_new(true);
    uint32_t ns = s.req->ns;
    cr_assert_eq(kvp__verify_ns_refs(s.c, ns), 2, "the request and A's first block");
    kvp__verify_ns_ref(s.c, ns);
    cr_assert_eq(kvp__pool_check(s.c), KVP_OK);
    EXPECT_CORRUPT(s.c, kvp__verify_check);
    kvp__verify_ns_unref(s.c, ns);
    kvp__verify_ns_unref(s.c, ns); /* one reference short (the record stays: refs 1) */
    EXPECT_CORRUPT(s.c, kvp__verify_check);
    kvp__verify_ns_ref(s.c, ns);
    scene_end(&s);
}

Test(check, request_names_free_namespace_slot)
{
    scene s = scene_new(true);
    kvp__verify *v = &s.c->verify;
    uint32_t ns = s.req->ns, empty = KVP_NIL;
    for (uint32_t i = 0; i < v->n_slots && empty == KVP_NIL; i++)
        if (!v->slots[i])
            empty = i;
    cr_assert_neq(empty, KVP_NIL);
    s.req->ns = empty;
    EXPECT_CORRUPT(s.c, kvp__verify_check);
    s.req->ns = v->n_slots; /* beyond the slot table */
    EXPECT_CORRUPT(s.c, kvp__verify_check);
    s.req->ns = ns;
    scene_end(&s);
}

Test(check, namespace_slots_swapped)
{
    /* Two interned namespaces trade slots: each record's id no longer names its slot. */
    scene s = scene_new(true);
    kvp__verify *v = &s.c->verify;
    uint32_t a = KVP_NIL, b = KVP_NIL;
    for (uint32_t i = 0; i < v->n_slots; i++) {
        if (v->slots[i] && a == KVP_NIL)
            a = i;
        else if (v->slots[i] && b == KVP_NIL)
            b = i;
    }
    cr_assert(a != KVP_NIL && b != KVP_NIL, "the scene interns two namespaces");
    kvp__nsrec *tmp = v->slots[a];
    v->slots[a] = v->slots[b];
    v->slots[b] = tmp;
    EXPECT_CORRUPT(s.c, kvp__verify_check);
    v->slots[b] = v->slots[a];
    v->slots[a] = tmp;
    scene_end(&s);
}

Test(check, namespace_slot_cleared)
{
    scene s = scene_new(true);
    kvp__verify *v = &s.c->verify;
    kvp__nsrec *saved = v->slots[s.req->ns];
    v->slots[s.req->ns] = NULL;
    EXPECT_CORRUPT(s.c, kvp__verify_check);
    v->slots[s.req->ns] = saved;
    scene_end(&s);
}

Test(check, unindexed_block_names_namespace)
{
    scene s = scene_new(true);
    s.c->verify.meta[s.free_id].ns = s.req->ns;
    EXPECT_CORRUPT(s.c, kvp__verify_check);
    s.c->verify.meta[s.free_id].ns = KVP_NIL;
    scene_end(&s);
}

Test(check, block_provenance)
{
    scene s = scene_new(true);
    kvp__vmeta *first = &s.c->verify.meta[s.first_id], *later = &s.c->verify.meta[s.later_id];
    cr_assert(first->ns != KVP_NIL && first->parent == KVP_NIL);
    cr_assert(later->ns == KVP_NIL && later->parent != KVP_NIL);
    uint32_t parent = later->parent;
    later->parent = N_BLOCKS; /* a parent outside the pool */
    EXPECT_CORRUPT(s.c, kvp__verify_check);
    later->parent = KVP_NIL; /* a later block with neither parent nor namespace */
    EXPECT_CORRUPT(s.c, kvp__verify_check);
    later->parent = parent;
    first->parent = s.later_id; /* a first block with both */
    EXPECT_CORRUPT(s.c, kvp__verify_check);
    first->parent = KVP_NIL;
    scene_end(&s);
}

/* ---------------------------------------------------------------------------------------- */
/* Asserts on internal preconditions                                                        */
/* ---------------------------------------------------------------------------------------- */

#ifndef NDEBUG

Test(check_asserts, unpin_at_refcount_zero, .signal = SIGABRT)
{
    scene s = scene_new(false);
    kvp__pool_unpin_tail_first(s.c, &s.cached_id, 1); /* would wrap the count to 2^32 - 1 */
}

Test(check_asserts, pin_free_block, .signal = SIGABRT)
{
    scene s = scene_new(false);
    kvp__pool_pin(s.c, s.free_id); /* free blocks are handed out by kvp__pool_take only */
}

Test(check_asserts, unpin_block_with_lru_slot, .signal = SIGABRT)
{
    scene s = scene_new(false);
    s.c->pool.state[s.pinned_id] = 0; /* a ring slot: cached, not in use */
    kvp__pool_unpin_tail_first(s.c, &s.pinned_id, 1);
}

Test(check_asserts, index_block_twice, .signal = SIGABRT)
{
    scene s = scene_new(false);
    kvp__block *b = &s.c->pool.blocks[s.cached_id];
    kvp__index_add(&s.c->index, b, b->key);
}

Test(check_asserts, take_cached_block_from_free_list, .signal = SIGABRT)
{
    scene s = scene_new(false);
    s.c->pool.free_head = s.cached_id;
    (void)kvp__pool_take(s.c);
}

Test(check_asserts, take_more_than_available, .signal = SIGABRT)
{
    scene s = scene_new(false);
    uint32_t ids[N_BLOCKS + 1];
    kvp__pool_take_n(s.c, ids, kvp__pool_available(&s.c->pool) + 1);
}

Test(check_asserts, release_with_bad_counts, .signal = SIGABRT)
{
    scene s = scene_new(false);
    s.req->n_committed = s.req->n_blocks + 1;
    cr_assert_eq(kvp_release(s.c, REQ_ID), KVP_OK);
}

Test(check_asserts, namespace_unref_past_zero, .signal = SIGABRT)
{
    scene s = scene_new(true);
    uint32_t ns = s.req->ns;
    kvp__verify_ns_unref(s.c, ns);
    kvp__verify_ns_unref(s.c, ns); /* the record is gone: its slot is empty */
    kvp__verify_ns_unref(s.c, ns);
}

#endif /* NDEBUG */
