/*
 * forge.h - the closed-form XXH3-128 block collision (tests/lib/forge.c; derivation in
 * tests/lib/test_attack.c).
 */
#ifndef KVP_TESTS_FORGE_H
#define KVP_TESTS_FORGE_H

#include <stdint.h>

#include "kvprefix.h"

/* Write 16 tokens to out that, after parent key own_parent, hash under XXH3-128 with seed
 * exactly like the 16 tokens target after target_parent (the 80-byte block input of
 * kvp_hash_blocks at block size 16). Cannot fail. */
void forge_collide(uint64_t seed, kvp_key target_parent, const uint32_t *target, kvp_key own_parent,
                   uint32_t *out);

#endif /* KVP_TESTS_FORGE_H */
