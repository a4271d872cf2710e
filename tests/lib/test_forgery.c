/*
 * test_forgery.c - the closed-form XXH3 collision of issue #13, derived from XXH3's
 * published algorithm, against each profile.
 *
 * XXH3-128 on an 80-byte input (parent key ‖ 16 tokens) keeps two 64-bit accumulators and
 * folds four 16-byte lanes into them (XXH3_len_17to128_128b, XXH128_mix32B):
 *
 *   start      lo = 80 * P1, hi = 0
 *   lane 32    lo += m(L32, s64); lo ^= sum(L32); hi += m(L32, s80); hi ^= sum(L32)
 *   lanes 16/48 lo += m(L16, s32); lo ^= sum(L48); hi += m(L48, s48); hi ^= sum(L16)
 *   lanes 0/64 lo += m(L0, s0);   lo ^= sum(L64); hi += m(L64, s16); hi ^= sum(L0)
 *
 * with m(L, s) = fold64((L.lo ^ (s.lo + seed)) * (L.hi ^ (s.hi - seed))), sum(L) = L.lo +
 * L.hi, and the digest a fixed bijection of (lo, hi) for a given length. Setting
 * L.lo = s.lo + seed zeroes m(L, s) whatever L.hi is; L.hi then enters only through sum(L),
 * an XOR the attacker can steer. So, knowing the secret words and the seed (xxh3: the public
 * default secret and the seed) and both chain values (xxh3: computable from the public
 * namespace fields), an attacker in namespace B writes down 16 token ids whose block has
 * exactly the key of a victim's block in namespace A: zero m(L16), m(L48), m(L64), pick
 * L16.hi to land hi, L64.hi to land lo. No search.
 *
 * Asserted: under xxh3 (seed 0 and a known nonzero seed) the forged block collides and the
 * attacker's lookup hits the victim's block (documented, expected); with verify_tokens the
 * same lookup gets no hit; under keyed and siphash the construction, even given the true
 * keyed roots, produces a different key and no hit; vocab_size refuses the forged ids.
 */
#include <string.h>

#include <criterion/criterion.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvprefix.h"
#include "testutil.h"

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8); /* little-endian host, as XXH_readLE64 on x86 and arm64 */
    return v;
}

/* The 128-bit product folded to 64 bits (xxHash's own helper, inlined from its header). */
static uint64_t fold(uint64_t a, uint64_t b)
{
    return XXH3_mul128_fold64(a, b);
}

/* The accumulator state of XXH3-128 over the 80-byte input (parent ‖ t[0..16)). */
typedef struct acc2 {
    uint64_t lo, hi;
} acc2;

typedef struct lane {
    uint64_t lo, hi;
} lane;

static lane lane_of(const uint32_t *t)
{
    lane l = {t[0] | (uint64_t)t[1] << 32, t[2] | (uint64_t)t[3] << 32};
    return l;
}

static uint64_t m16(lane l, const uint8_t *s, uint64_t seed)
{
    return fold(l.lo ^ (rd64(s) + seed), l.hi ^ (rd64(s + 8) - seed));
}

static uint64_t sum(lane l)
{
    return l.lo + l.hi;
}

/* Accumulators after the lane-32 step and before the last two. */
static acc2 acc_after_32(lane l32, const uint8_t *sec, uint64_t seed)
{
    acc2 a = {80 * XXH_PRIME64_1, 0};
    a.lo += m16(l32, sec + 64, seed);
    a.lo ^= sum(l32);
    a.hi += m16(l32, sec + 80, seed);
    a.hi ^= sum(l32);
    return a;
}

static acc2 acc_full(kvp_key parent, const uint32_t *t, const uint8_t *sec, uint64_t seed)
{
    lane l0 = {parent.lo, parent.hi}, l16 = lane_of(t), l32 = lane_of(t + 4), l48 = lane_of(t + 8),
         l64 = lane_of(t + 12);
    acc2 a = acc_after_32(l32, sec, seed);
    a.lo += m16(l16, sec + 32, seed);
    a.lo ^= sum(l48);
    a.hi += m16(l48, sec + 48, seed);
    a.hi ^= sum(l16);
    a.lo += m16(l0, sec, seed);
    a.lo ^= sum(l64);
    a.hi += m16(l64, sec + 16, seed);
    a.hi ^= sum(l0);
    return a;
}

static void set_lane(uint32_t *t, lane l)
{
    t[0] = (uint32_t)l.lo;
    t[1] = (uint32_t)(l.lo >> 32);
    t[2] = (uint32_t)l.hi;
    t[3] = (uint32_t)(l.hi >> 32);
}

/* Forge 16 tokens out[] whose block under parent_b has the key of (parent_a, victim) under
 * XXH3-128 with the default secret and this seed. */
static void forge(uint64_t seed, kvp_key parent_a, const uint32_t *victim, kvp_key parent_b,
                  uint32_t *out)
{
    const uint8_t *sec = XXH3_kSecret;
    acc2 target = acc_full(parent_a, victim, sec, seed);
    memcpy(out + 4, victim + 4, 4 * sizeof *out); /* lane 32: anything; the victim's */
    acc2 a = acc_after_32(lane_of(out + 4), sec, seed);
    lane l0 = {parent_b.lo, parent_b.hi};
    lane l16 = {rd64(sec + 32) + seed, 0}, l48 = {rd64(sec + 48) + seed, 0},
         l64 = {rd64(sec + 16) + seed, 0};
    /* hi: (a.hi + 0) ^ sum(l16) ^ sum(l0) must equal target.hi. */
    l16.hi = (target.hi ^ sum(l0) ^ a.hi) - l16.lo;
    /* lo: ((a.lo + 0) ^ sum(l48)) + m(l0)) ^ sum(l64) must equal target.lo. */
    uint64_t lo3 = a.lo ^ sum(l48);
    l64.hi = (((lo3 + m16(l0, sec, seed)) ^ target.lo)) - l64.lo;
    set_lane(out, l16);
    set_lane(out + 8, l48);
    set_lane(out + 12, l64);
}

static const uint32_t victim_prompt[17] = {
    128000, 9125, 374, 264, 11190, 18328, 13, 1472, 6013, 6067, 7347, 4860, 13, 128009, 882, 25, 40,
};

static kvp_key block_key(uint64_t seed, kvp_key parent, const uint32_t *t)
{
    kvp_key k;
    size_t n;
    cr_assert_eq(kvp_hash_blocks(seed, parent, t, 16, 16, &k, 1, &n), KVP_OK);
    return k;
}

/* The attacker's lookup after the victim cached its prompt: how many blocks it hits. */
static uint32_t attack(kvp_config cfg, const uint32_t *forged, kvp_namespace *a, kvp_namespace *b)
{
    kvp_cache *c = th_cache_new(&cfg);
    kvp_match m;
    cr_assert_eq(kvp_access(c, a, victim_prompt, 17, &m), KVP_OK);
    uint32_t probe[17];
    memcpy(probe, forged, 16 * sizeof *probe);
    probe[16] = 1;
    cr_assert_eq(kvp_lookup(c, b, probe, 17, NULL, 0, &m), KVP_OK);
    TH_CHECK(c);
    kvp_cache_free(c);
    return m.n_blocks_cached;
}

Test(forgery, xxh3_collides_in_closed_form_keyed_does_not)
{
    kvp_namespace a, b;
    th_ns(&a, "llama-3-8b", NULL, "victim", NULL);
    th_ns(&b, "llama-3-8b", NULL, "attacker", NULL);
    static const uint64_t seeds[] = {0, UINT64_C(0x5eed5eed12345678)};
    for (size_t s = 0; s < 2; s++) {
        uint64_t seed = seeds[s];
        kvp_key ra, rb;
        cr_assert_eq(kvp_namespace_key(seed, &a, &ra), KVP_OK);
        cr_assert_eq(kvp_namespace_key(seed, &b, &rb), KVP_OK);
        uint32_t forged[16];
        forge(seed, ra, victim_prompt, rb, forged);
        cr_assert(memcmp(forged, victim_prompt, sizeof forged) != 0);
        kvp_key ka = block_key(seed, ra, victim_prompt), kb = block_key(seed, rb, forged);
        cr_assert(th_key_eq(ka, kb), "seed %zu: the closed-form forgery did not collide", s);

        /* xxh3 without verification: the attacker reads the victim's block (expected). */
        kvp_config cfg = th_config(64, 16, false, NULL, NULL);
        cfg.seed = seed;
        cr_assert_eq(attack(cfg, forged, &a, &b), 1, "xxh3: the forged block should hit");
        /* xxh3 with verification: no hit. */
        cfg.verify_tokens = true;
        cr_assert_eq(attack(cfg, forged, &a, &b), 0, "xxh3 + verify: the forged block hit");
        /* vocab_size refuses the forged ids (defence in depth). */
        cfg.verify_tokens = false;
        cfg.vocab_size = 128256;
        kvp_cache *c = th_cache_new(&cfg);
        kvp_match m;
        cr_assert_eq(kvp_lookup(c, &b, forged, 16, NULL, 0, &m), KVP_ETOKEN);
        kvp_cache_free(c);
    }

    /* keyed and siphash (random key, the default): the same construction, even handed the
     * true keyed roots, gives another key, and the attacker hits nothing. */
    static const int keyed[] = {KVP_HASH_KEYED, KVP_HASH_SIPHASH};
    for (size_t p = 0; p < 2; p++) {
        kvp_config cfg = th_config(64, 16, false, NULL, NULL);
        cfg.hash_profile = keyed[p];
        kvp_cache *c = th_cache_new(&cfg);
        const kvp_hasher *h = kvp_cache_hasher(c);
        kvp_chain ca, cb, out[1];
        size_t n;
        cr_assert_eq(kvp_hasher_root(h, &a, &ca), KVP_OK);
        cr_assert_eq(kvp_hasher_root(h, &b, &cb), KVP_OK);
        uint32_t forged[16];
        forge(0, ca.root, victim_prompt, cb.root, forged);
        kvp_chain va = ca;
        cr_assert_eq(kvp_hasher_blocks(h, &a, &va, victim_prompt, 16, out, 1, &n), KVP_OK);
        kvp_key ka = out[0].key;
        cr_assert_eq(kvp_hasher_blocks(h, &b, &cb, forged, 16, out, 1, &n), KVP_OK);
        cr_assert(!th_key_eq(ka, out[0].key), "%s: the forgery collided",
                  kvp_hash_profile_name(keyed[p]));
        kvp_cache_free(c);
        cr_assert_eq(attack(cfg, forged, &a, &b), 0, "%s: the forged block hit",
                     kvp_hash_profile_name(keyed[p]));
    }
}
