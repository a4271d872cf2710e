/*
 * forge.c - the closed-form XXH3-128 collision for 80-byte block inputs (block size 16),
 * derived in tests/lib/test_attack.c's opening comment from XXH3's published algorithm
 * (Debian's xxhash.h, XXH3_len_17to128_128b). Shared by tests/lib/test_attack.c and
 * bench/bench_verify.c (which forges a whole colliding chain to measure verification
 * under collisions). Plain C11; no search.
 */
#include "forge.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t secret_word(size_t i)
{
    return rd64(XXH3_kSecret + i);
}

/* The 128-bit product of x and y folded to 64 bits (low half ^ high half), schoolbook on
 * 32-bit halves so that it is plain C11. */
static uint64_t mul_fold(uint64_t x, uint64_t y)
{
    uint64_t xl = x & 0xffffffffu, xh = x >> 32, yl = y & 0xffffffffu, yh = y >> 32;
    uint64_t ll = xl * yl, lh = xl * yh, hl = xh * yl, hh = xh * yh;
    uint64_t mid = (ll >> 32) + (lh & 0xffffffffu) + (hl & 0xffffffffu);
    uint64_t lo = (ll & 0xffffffffu) | mid << 32;
    uint64_t hi = hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
    return lo ^ hi;
}

/* XXH3_mix16B on two words, with the secret words at offset i. */
static uint64_t mix16(uint64_t a, uint64_t b, size_t i, uint64_t seed)
{
    return mul_fold(a ^ (secret_word(i) + seed), b ^ (secret_word(i + 8) - seed));
}

/* The ten words of a block's 80-byte input. */
static void words_of(kvp_key parent, const uint32_t *tokens, uint64_t w[10])
{
    w[0] = parent.lo;
    w[1] = parent.hi;
    for (int k = 0; k < 8; k++)
        w[2 + k] = (uint64_t)tokens[2 * k] | (uint64_t)tokens[2 * k + 1] << 32;
}

/* The accumulator (L, H) after each of the three rounds, as in the header comment. */
typedef struct acc {
    uint64_t l1, h1, l2, h2, l3, h3;
} acc;

static acc run_rounds(const uint64_t w[10], uint64_t seed)
{
    acc a;
    uint64_t l = 80 * XXH_PRIME64_1, h = 0;
    l = (l + mix16(w[4], w[5], 64, seed)) ^ (w[4] + w[5]);
    h = (h + mix16(w[4], w[5], 80, seed)) ^ (w[4] + w[5]);
    a.l1 = l, a.h1 = h;
    l = (l + mix16(w[2], w[3], 32, seed)) ^ (w[6] + w[7]);
    h = (h + mix16(w[6], w[7], 48, seed)) ^ (w[2] + w[3]);
    a.l2 = l, a.h2 = h;
    l = (l + mix16(w[0], w[1], 0, seed)) ^ (w[8] + w[9]);
    h = (h + mix16(w[8], w[9], 16, seed)) ^ (w[0] + w[1]);
    a.l3 = l, a.h3 = h;
    return a;
}

/* Write 16 tokens that, after own_parent, hash like target (16 tokens) after
 * target_parent under XXH3-128 with seed: the closed form of the header comment. */
void forge_collide(uint64_t seed, kvp_key target_parent, const uint32_t *target, kvp_key own_parent,
                   uint32_t *out)
{
    uint64_t tw[10], w[10];
    words_of(target_parent, target, tw);
    acc t = run_rounds(tw, seed);
    w[0] = own_parent.lo;
    w[1] = own_parent.hi;
    w[4] = UINT64_C(0x0123456789abcdef); /* free */
    w[5] = UINT64_C(0x0fedcba987654321); /* free */
    w[7] = 0;                            /* free */
    w[2] = secret_word(32) + seed;       /* M(w2, w3; 32) = 0 */
    w[6] = secret_word(48) + seed;       /* M(w6, w7; 48) = 0 */
    w[8] = secret_word(16) + seed;       /* M(w8, w9; 16) = 0 */
    w[3] = w[9] = 0;
    acc a = run_rounds(w, seed); /* l1, h1, l2 do not depend on w3 or w9 */
    w[3] = (a.h1 ^ t.h3 ^ (w[0] + w[1])) - w[2];
    w[9] = ((a.l2 + mix16(w[0], w[1], 0, seed)) ^ t.l3) - w[8];
    for (int k = 0; k < 8; k++) {
        out[2 * k] = (uint32_t)w[2 + k];
        out[2 * k + 1] = (uint32_t)(w[2 + k] >> 32);
    }
}
