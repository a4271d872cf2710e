/*
 * test_attack.c - the closed-form XXH3-128 collision of issue 13, written down from XXH3's
 * published algorithm, and what it achieves against each hash profile, with and without
 * collision-proof mode (docs/security.md, attack table rows A1-A4).
 *
 * The construction. A block's hashed input at block size 16 is 80 bytes: the parent key
 * (16 bytes, lo then hi, little-endian) and 16 tokens as little-endian u32. Read it as ten
 * 64-bit words w0..w9 (w0, w1 = parent; w2..w9 = token pairs). XXH3_128bits_withSeed takes
 * its 17..128-byte path (xxhash.h, XXH3_len_17to128_128b) with the default secret s (bytes
 * s[0..]) and the seed S; with M(a, b; i) = fold64((a ^ (s[i] + S)) * (b ^ (s[i+8] - S)))
 * (XXH3_mix16B, fold64 = low ^ high half of the 128-bit product), it computes
 *
 *   L = 80 * PRIME64_1, H = 0
 *   L += M(w4,w5; 64); L ^= w4 + w5;  H += M(w4,w5; 80); H ^= w4 + w5   (mix32B at s+64)
 *   L += M(w2,w3; 32); L ^= w6 + w7;  H += M(w6,w7; 48); H ^= w2 + w3   (mix32B at s+32)
 *   L += M(w0,w1;  0); L ^= w8 + w9;  H += M(w8,w9; 16); H ^= w0 + w1   (mix32B at s+0)
 *
 * and the digest is a fixed function of (L, H, length, S). A multiply term vanishes when
 * its first word equals s[i] + S, and then the word after it enters only through a sum.
 * Given a target (parent P, tokens T) and any other parent P' whose bytes the attacker
 * knows, set w2 = s[32] + S, w6 = s[48] + S, w8 = s[16] + S (three terms vanish), choose w4,
 * w5, w7 freely, and solve the two remaining equations, each linear in one word:
 *   w3 = (H1 ^ H_target ^ (P'0 + P'1)) - w2            (H after the s+0 round must match)
 *   w9 = ((L2 + M(P'0,P'1; 0)) ^ L_target) - w8        (L after the s+0 round must match)
 * where L_target, H_target are the target's final (L, H) and L2, H1 the attacker's
 * intermediate values. No search: the colliding 16 tokens are written down directly.
 *
 * What the attacker needs: the seed (public: the default is 0), the target parent's bytes
 * and tokens, and its own parent's bytes. A namespace root is XXH3 of a documented framed
 * encoding with that seed, so tenant B computes both A's root and its own: B's FIRST block
 * can collide with A's first block across namespaces, and then B's chain continues from
 * the same key as A's, so every later block of A's prefix is a hit for B as well. The
 * words the construction fixes are secret words plus the seed, and the solved ones are
 * arbitrary 64-bit values, so the token ids are large (typically above any vocabulary):
 * a vocab_size check rejects this exact construction, which is defence in depth, not the
 * fix (a search-based or seed-independent pair may fit a vocabulary; the fix is an
 * unforgeable key or verification).
 *
 * The construction itself is in tests/lib/forge.c (bench/bench_verify.c uses it too).
 * Profiles are rows of PROFILES below: adding one (e.g. keyed) is one line naming how to
 * configure it and whether the construction is expected to collide there.
 */
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "forge.h"
#include "kvprefix.h"
#include "testutil.h"

#define BS      16
#define SEED    UINT64_C(0x5eed) /* any known seed; the default (0) works the same way */
#define N_BLOCK 64               /* pool size: never full in these tests */

/* ---------------------------------------------------------------- profiles */

/* One hash profile under attack: how to configure it, and whether the construction (which
 * assumes today's XXH3 chain with roots from kvp_namespace_key) is expected to collide. */
typedef struct profile {
    const char *name;
    void (*setup)(kvp_config *cfg);
    bool collides;
} profile;

static void setup_xxh3(kvp_config *cfg)
{
    cfg->hash_profile = KVP_HASH_XXH3;
    cfg->seed = SEED;
}

/* The attacker knows everything but the key (the seed too: the keyed profiles ignore it). */
static void set_key(kvp_config *cfg, int hash_profile)
{
    cfg->hash_profile = hash_profile;
    cfg->seed = SEED;
    for (unsigned i = 0; i < 16; i++)
        cfg->hash_key[i] = (uint8_t)(0xa5 ^ (i * 17));
    cfg->hash_key_len = 16;
}

static void setup_keyed(kvp_config *cfg)
{
    set_key(cfg, KVP_HASH_KEYED);
}

static void setup_siphash(kvp_config *cfg)
{
    set_key(cfg, KVP_HASH_SIPHASH);
}

static const profile PROFILES[] = {
    {"xxh3", setup_xxh3, true},
    {"keyed", setup_keyed, false},
    {"siphash", setup_siphash, false},
};
#define N_PROFILES (sizeof PROFILES / sizeof PROFILES[0])

/* ---------------------------------------------------------------- the scenario */

static kvp_namespace ns_a, ns_b;
static uint32_t victim[2 * BS + 1]; /* A's prompt: two full blocks and one more token */
static uint32_t forged[2 * BS + 1]; /* B's prompt: forged block 0, then A's block 1 */

/* Build both prompts: forged block 0 collides with A's block 0 across namespaces. */
static void build_prompts(void)
{
    th_ns(&ns_a, "llama", NULL, "alice", NULL);
    th_ns(&ns_b, "llama", NULL, "mallory", NULL);
    for (uint32_t i = 0; i < 2 * BS + 1; i++)
        victim[i] = 1000 + 7 * i;
    kvp_key root_a, root_b;
    cr_assert_eq(kvp_namespace_key(SEED, &ns_a, &root_a), KVP_OK);
    cr_assert_eq(kvp_namespace_key(SEED, &ns_b, &root_b), KVP_OK);
    forge_collide(SEED, root_a, victim, root_b, forged);
    memcpy(forged + BS, victim + BS, (BS + 1) * sizeof(uint32_t));
}

Test(attack, construction_collides_in_xxh3)
{
    build_prompts();
    kvp_key root_a, root_b, ka[2], kb[2];
    size_t n;
    cr_assert_eq(kvp_namespace_key(SEED, &ns_a, &root_a), KVP_OK);
    cr_assert_eq(kvp_namespace_key(SEED, &ns_b, &root_b), KVP_OK);
    cr_assert(!th_key_eq(root_a, root_b));
    cr_assert_neq(memcmp(victim, forged, BS * sizeof(uint32_t)), 0, "same tokens");
    cr_assert_eq(kvp_hash_blocks(SEED, root_a, victim, 2 * BS, BS, ka, 2, &n), KVP_OK);
    cr_assert_eq(kvp_hash_blocks(SEED, root_b, forged, 2 * BS, BS, kb, 2, &n), KVP_OK);
    cr_assert(th_key_eq(ka[0], kb[0]), "block 0 keys differ: the construction is wrong");
    cr_assert(th_key_eq(ka[1], kb[1]), "the chain does not continue from the same key");
    /* Also with the default seed (0), and for a block deep in a chain. */
    uint32_t t2[BS];
    forge_collide(0, ka[0], victim + BS, root_b, t2);
    kvp_key k0, k1;
    cr_assert_eq(kvp_hash_blocks(0, ka[0], victim + BS, BS, BS, &k0, 1, &n), KVP_OK);
    cr_assert_eq(kvp_hash_blocks(0, root_b, t2, BS, BS, &k1, 1, &n), KVP_OK);
    cr_assert(th_key_eq(k0, k1));
    /* The ids are far outside any vocabulary: a vocab_size check is defence in depth. */
    uint32_t big = 0;
    for (int i = 0; i < BS; i++)
        big += forged[i] >= 1u << 20;
    cr_assert_geq(big, 8, "only %u of the forged ids are >= 2^20", big);
}

/* What tenant B can observe in one world: its match results, its stored counts, and the
 * events of its own calls (keys, not block ids: an engine's tenant never sees those). */
typedef struct observed {
    kvp_match m_lookup, m_acquire, m_again;
    size_t n_stored;
    int rc_acquire;
    kvp_event ev[16];
    size_t n_ev;
    bool recording;
    uint64_t n_rejects; /* operator-level counter, not B's: shows the collision was met */
} observed;

static void record(void *ud, const kvp_event *ev)
{
    observed *o = ud;
    if (!o->recording || o->n_ev >= 16)
        return;
    o->ev[o->n_ev] = *ev;
    o->ev[o->n_ev].block_id = 0;
    o->n_ev++;
}

static kvp_cache *profile_cache(const profile *p, bool verify, observed *o)
{
    kvp_config cfg = th_config(N_BLOCK, BS, verify, record, o);
    p->setup(&cfg);
    return th_cache_new(&cfg);
}

/* One world: A's prompt cached first or not, then B looks up, runs and looks up again its
 * forged prompt. Returns A's block ids in a_ids[2] when A was present. */
static void run_world(const profile *p, bool verify, bool victim_present, observed *o,
                      uint32_t *a_ids, uint32_t *b_ids)
{
    memset(o, 0, sizeof *o);
    kvp_cache *c = profile_cache(p, verify, o);
    if (victim_present) {
        th_access_ok(c, &ns_a, victim, 2 * BS + 1);
        kvp_match m;
        cr_assert_eq(kvp_lookup(c, &ns_a, victim, 2 * BS + 1, a_ids, 2, &m), KVP_OK);
        cr_assert_eq(m.n_blocks_hit, 2);
    }
    o->recording = true;
    cr_assert_eq(kvp_lookup(c, &ns_b, forged, 2 * BS + 1, b_ids, 2, &o->m_lookup), KVP_OK);
    o->rc_acquire = kvp_acquire(c, 1, &ns_b, forged, 2 * BS + 1, 0, &o->m_acquire);
    cr_assert_eq(o->rc_acquire, KVP_OK);
    cr_assert_eq(kvp_commit(c, 1, forged, 2 * BS + 1, &o->n_stored), KVP_OK);
    cr_assert_eq(kvp_release(c, 1), KVP_OK);
    cr_assert_eq(kvp_lookup(c, &ns_b, forged, 2 * BS + 1, NULL, 0, &o->m_again), KVP_OK);
    o->recording = false;
    o->n_rejects = th_stats(c).n_verify_rejects;
    TH_CHECK(c);
    if (victim_present) {
        /* A still finds its own two blocks, whatever B did. */
        uint32_t again[2];
        kvp_match m;
        cr_assert_eq(kvp_lookup(c, &ns_a, victim, 2 * BS + 1, again, 2, &m), KVP_OK);
        if (verify || !p->collides) {
            cr_assert_eq(m.n_blocks_hit, 2);
            cr_assert_eq(again[0], a_ids[0]);
            cr_assert_eq(again[1], a_ids[1]);
        }
    }
    kvp_cache_free(c);
}

/* Field by field: kvp_match has padding. */
static bool match_eq(const kvp_match *x, const kvp_match *y)
{
    return x->n_tokens == y->n_tokens && x->n_blocks_full == y->n_blocks_full &&
           x->n_blocks_cached == y->n_blocks_cached && x->n_blocks_hit == y->n_blocks_hit &&
           x->n_tokens_hit == y->n_tokens_hit;
}

/* Field by field too: kvp_event has padding (record() copies whole events, so the events
 * are compared through their fields). */
static bool event_eq(const kvp_event *x, const kvp_event *y)
{
    return x->type == y->type && x->reason == y->reason && x->n_tokens == y->n_tokens &&
           th_key_eq(x->key, y->key) && th_key_eq(x->parent, y->parent) &&
           x->parent_is_root == y->parent_is_root;
}

static bool same_observations(const observed *x, const observed *y)
{
    bool same = match_eq(&x->m_lookup, &y->m_lookup) && match_eq(&x->m_acquire, &y->m_acquire) &&
                match_eq(&x->m_again, &y->m_again) && x->n_stored == y->n_stored &&
                x->rc_acquire == y->rc_acquire && x->n_ev == y->n_ev;
    for (size_t i = 0; same && i < x->n_ev; i++)
        same = event_eq(&x->ev[i], &y->ev[i]);
    return same;
}

/* Attack A1 (read A's KV) and A3 (activity oracle) without verification: under xxh3 B's
 * forged prompt hits A's two blocks - the very block ids A's KV lives in - and B's
 * observations differ between "A cached it" and "A did not". Documented and expected. */
Test(attack, without_verify)
{
    build_prompts();
    for (size_t k = 0; k < N_PROFILES; k++) {
        const profile *p = &PROFILES[k];
        static observed with, without;
        uint32_t a_ids[2], b_ids[2] = {UINT32_MAX, UINT32_MAX}, dummy[2];
        run_world(p, false, true, &with, a_ids, b_ids);
        run_world(p, false, false, &without, dummy, dummy);
        if (p->collides) {
            cr_assert_eq(with.m_lookup.n_blocks_hit, 2, "%s: no cross-tenant hit", p->name);
            cr_assert_eq(b_ids[0], a_ids[0], "%s: B was not handed A's block 0", p->name);
            cr_assert_eq(b_ids[1], a_ids[1], "%s: B was not handed A's block 1", p->name);
            cr_assert(!same_observations(&with, &without), "%s: no oracle", p->name);
        } else {
            cr_assert_eq(with.m_lookup.n_blocks_hit, 0, "%s: cross-tenant hit", p->name);
            cr_assert(same_observations(&with, &without), "%s: B observes A", p->name);
        }
    }
}

/* Attack A2 (poisoning) without verification: B stores its forged prompt first, and A's
 * own request then reuses B's block as if it held A's KV. */
Test(attack, poisoning_without_verify)
{
    build_prompts();
    for (size_t k = 0; k < N_PROFILES; k++) {
        const profile *p = &PROFILES[k];
        observed o;
        memset(&o, 0, sizeof o);
        kvp_cache *c = profile_cache(p, false, &o);
        th_access_ok(c, &ns_b, forged, 2 * BS + 1);
        uint32_t b_ids[2], a_ids[2];
        kvp_match m;
        cr_assert_eq(kvp_lookup(c, &ns_b, forged, 2 * BS + 1, b_ids, 2, &m), KVP_OK);
        cr_assert_eq(kvp_lookup(c, &ns_a, victim, 2 * BS + 1, a_ids, 2, &m), KVP_OK);
        cr_assert_eq(m.n_blocks_hit, p->collides ? 2u : 0u, "%s", p->name);
        if (p->collides)
            cr_assert_eq(a_ids[0], b_ids[0], "%s: A did not reuse B's block", p->name);
        kvp_cache_free(c);
    }
}

/* With verification: no hit on A's blocks, A's blocks untouched (run_world checks A still
 * hits its own), and every observation of B identical whether A cached the prefix or not:
 * match results, stored counts, and the events of B's own calls. */
Test(attack, verify_gives_no_hit_and_no_observable_difference)
{
    build_prompts();
    for (size_t k = 0; k < N_PROFILES; k++) {
        const profile *p = &PROFILES[k];
        static observed with, without;
        uint32_t a_ids[2], b_ids[2], dummy[2];
        run_world(p, true, true, &with, a_ids, b_ids);
        run_world(p, true, false, &without, dummy, dummy);
        cr_assert_eq(with.m_lookup.n_blocks_cached, 0, "%s: a false hit in verify mode", p->name);
        cr_assert_eq(with.n_rejects > 0, p->collides, "%s: collision not met", p->name);
        cr_assert_eq(without.n_rejects, 0, "%s", p->name);
        cr_assert_eq(with.m_acquire.n_blocks_hit, 0, "%s", p->name);
        cr_assert_eq(with.n_stored, 2, "%s: B's blocks were not stored", p->name);
        cr_assert_eq(with.m_again.n_blocks_hit, 2, "%s: B does not find its own blocks", p->name);
        cr_assert(same_observations(&with, &without), "%s: B can tell whether A cached it",
                  p->name);
        for (size_t i = 0; i < with.n_ev; i++)
            cr_assert_eq(with.ev[i].type, KVP_EVENT_STORED, "%s: B's calls removed a block",
                         p->name);
    }
}

/* With verification, poisoning fails: after B stored its forged prompt, A's request hits
 * nothing of B's and stores its own blocks beside B's under the same keys; A observes the
 * same as in a cache where B never came. */
Test(attack, verify_stops_poisoning)
{
    build_prompts();
    for (size_t k = 0; k < N_PROFILES; k++) {
        const profile *p = &PROFILES[k];
        kvp_match seen[2][2];
        size_t stored[2];
        for (int b_first = 0; b_first < 2; b_first++) {
            observed o;
            memset(&o, 0, sizeof o);
            kvp_cache *c = profile_cache(p, true, &o);
            if (b_first)
                th_access_ok(c, &ns_b, forged, 2 * BS + 1);
            cr_assert_eq(kvp_acquire(c, 7, &ns_a, victim, 2 * BS + 1, 0, &seen[b_first][0]),
                         KVP_OK);
            cr_assert_eq(kvp_commit(c, 7, victim, 2 * BS + 1, &stored[b_first]), KVP_OK);
            cr_assert_eq(kvp_release(c, 7), KVP_OK);
            seen[b_first][1] = th_lookup_ok(c, &ns_a, victim, 2 * BS + 1);
            TH_CHECK(c);
            kvp_cache_free(c);
        }
        cr_assert_eq(seen[1][0].n_blocks_hit, 0, "%s: A reused B's forged block", p->name);
        cr_assert(match_eq(&seen[0][0], &seen[1][0]), "%s", p->name);
        cr_assert(match_eq(&seen[0][1], &seen[1][1]), "%s", p->name);
        cr_assert_eq(stored[0], stored[1], "%s", p->name);
    }
}
