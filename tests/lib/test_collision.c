/*
 * test_collision.c - a forced hash collision, found deterministically, is a false hit
 * without verify_tokens and is rejected with it (issue 4: the unit-test half of
 * fuzz/fuzz_collision.c, which fuzzes the verify-on side).
 *
 * Keys are truncated to KEY_BITS bits with the internal hook kvp__cache_set_key_bits. A
 * search on a plain cache finds a second prompt (or a second namespace) whose truncated key
 * equals the first one's: with verify off the lookup of the second returns the first one's
 * block - someone else's KV. The very same pair is then replayed on a verify cache, where
 * the lookup finds nothing, counts a verify reject, and where storing the second prompt
 * puts b's block beside a's under the shared key: a keeps its block (nothing is removed or
 * replaced), each prompt then finds only its own blocks, and no wrong block is handed out.
 * Three shapes: two prompts colliding at their first block, two namespaces (tenants)
 * colliding on the same tokens, and prompts that share block 0 and collide at block 1 (the
 * parent-provenance path). The searches are deterministic (seed 0, fixed candidates) and
 * bounded; each asserts that it found its collision, so a hook that stops truncating fails
 * loudly instead of passing vacuously.
 */
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "internal.h"
#include "kvprefix.h"
#include "testutil.h"

#define KEY_BITS   8    /* a collision every ~256 candidates */
#define MAX_SEARCH 8192 /* candidates tried; the chance of none colliding is ~e^-32 */
#define BLOCK_SIZE 2

/* A 16-block cache with KEY_BITS-bit keys, recording events into ev when it is not NULL. */
static kvp_cache *truncated_cache(bool verify, th_events *ev)
{
    kvp_cache *c = th_cache(16, BLOCK_SIZE, verify, ev ? th_events_fn : NULL, ev);
    cr_assert_eq(kvp__cache_set_key_bits(c, KEY_BITS), KVP_OK);
    return c;
}

/* Candidate k: 5 tokens (two full blocks and one more, so both blocks may be hits). Block 0
 * is the same for every k when keep_first, else it varies with k. */
static void prompt(uint32_t k, bool keep_first, uint32_t *t)
{
    t[0] = keep_first ? 7 : 1000 + k;
    t[1] = keep_first ? 8 : 2000 + k;
    t[2] = 3000 + k;
    t[3] = 4000 + k;
    t[4] = 9;
}

/* Look up t in ns and return the hit block ids (up to 2) in ids; returns n_blocks_cached. */
static uint32_t lookup(kvp_cache *c, const kvp_namespace *ns, const uint32_t *t, uint32_t *ids)
{
    kvp_match m;
    cr_assert_eq(kvp_lookup(c, ns, t, 5, ids, 2, &m), KVP_OK);
    return m.n_blocks_cached;
}

/* On a verify-off cache holding `a` (accessed in ns_a), find a candidate prompt that is
 * reported cached to `depth` blocks in ns_b, block depth - 1 being a's block at the same
 * position, although it differs from a. Returns it in b. */
static void find_false_hit(const kvp_namespace *ns_a, const kvp_namespace *ns_b, bool keep_first,
                           uint32_t depth, const uint32_t *a, uint32_t *b)
{
    kvp_cache *c = truncated_cache(false, NULL);
    kvp_match m;
    cr_assert_eq(kvp_access(c, ns_a, a, 5, &m), KVP_OK);
    uint32_t a_ids[2], b_ids[2];
    cr_assert_eq(lookup(c, ns_a, a, a_ids), 2);
    for (uint32_t k = 1; k < MAX_SEARCH; k++) {
        prompt(k, keep_first, b);
        if (lookup(c, ns_b, b, b_ids) < depth || b_ids[depth - 1] != a_ids[depth - 1])
            continue;
        /* A false hit: the block of a's prefix, handed out for b's. */
        cr_assert(ns_a != ns_b || memcmp(a, b, sizeof(uint32_t) * BLOCK_SIZE * depth) != 0);
        kvp_cache_free(c);
        return;
    }
    cr_assert_fail("no %u-bit collision in %u candidates: is kvp__cache_set_key_bits working?",
                   KEY_BITS, MAX_SEARCH);
}

/* The same pair on a verify cache: b never hits a's blocks, a reject is counted, storing b
 * leaves a's colliding block in place, and then each of a and b finds only its own blocks. */
static void verify_rejects(const kvp_namespace *ns_a, const kvp_namespace *ns_b, uint32_t depth,
                           const uint32_t *a, const uint32_t *b)
{
    static th_events ev; /* large: off the stack */
    memset(&ev, 0, sizeof ev);
    kvp_cache *c = truncated_cache(true, &ev);
    kvp_match m;
    cr_assert_eq(kvp_access(c, ns_a, a, 5, &m), KVP_OK);
    uint32_t a_ids[2], b_ids[2];
    cr_assert_eq(lookup(c, ns_a, a, a_ids), 2);

    cr_assert_eq(lookup(c, ns_b, b, b_ids), depth - 1, "verify mode returned the false hit");
    cr_assert_eq(th_stats(c).n_verify_rejects, 1);
    TH_CHECK(c);

    /* Storing b puts b's own block beside a's under the shared key; nothing leaves. */
    uint64_t stored = th_stats(c).n_blocks_stored;
    cr_assert_eq(kvp_access(c, ns_b, b, 5, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_cached, depth - 1);
    cr_assert_eq(th_stats(c).n_blocks_stored - stored, 2 - (depth - 1));
    cr_assert_eq(th_events_count(&ev, KVP_EVENT_REMOVED, -1), 0);
    TH_CHECK(c);
    cr_assert_eq(lookup(c, ns_b, b, b_ids), 2, "b is now cached under the shared key");
    cr_assert_eq(lookup(c, ns_a, a, a_ids), 2, "a lost its block to a colliding commit");
    cr_assert(b_ids[depth - 1] != a_ids[depth - 1]);
    kvp_cache_free(c);
}

Test(collision, first_block_tokens)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, "t", NULL);
    uint32_t a[5], b[5];
    prompt(0, false, a);
    find_false_hit(&ns, &ns, false, 1, a, b);
    verify_rejects(&ns, &ns, 1, a, b);
}

Test(collision, namespaces_same_tokens)
{
    /* Same tokens, tenant "alice" against tenants "t1", "t2", ...: with truncated root keys
     * a tenant collides with alice and would read her KV without verification. */
    kvp_namespace alice, other;
    th_ns(&alice, "m", NULL, "alice", NULL);
    uint32_t a[5];
    prompt(0, false, a);
    kvp_cache *c = truncated_cache(false, NULL);
    kvp_match m;
    cr_assert_eq(kvp_access(c, &alice, a, 5, &m), KVP_OK);
    uint32_t a_ids[2], b_ids[2];
    cr_assert_eq(lookup(c, &alice, a, a_ids), 2);
    char tenant[16];
    bool found = false;
    for (uint32_t k = 1; k < MAX_SEARCH && !found; k++) {
        snprintf(tenant, sizeof tenant, "t%u", k);
        th_ns(&other, "m", NULL, tenant, NULL);
        /* The other tenant gets alice's first block. */
        found = lookup(c, &other, a, b_ids) >= 1 && b_ids[0] == a_ids[0];
    }
    cr_assert(found, "no tenant collided with alice in %u candidates", MAX_SEARCH);
    kvp_cache_free(c);
    verify_rejects(&alice, &other, 1, a, a);
}

Test(collision, second_block_after_a_shared_first)
{
    /* Both prompts share block 0 (a true hit) and collide at block 1: the parent chain is
     * right, only the block's own tokens differ. */
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t a[5], b[5];
    prompt(0, true, a);
    find_false_hit(&ns, &ns, true, 2, a, b);
    verify_rejects(&ns, &ns, 2, a, b);
}
