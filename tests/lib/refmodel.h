/*
 * refmodel.h - a naive reference model of the kvprefix cache (the helpers the tests share
 * are in testutil.h).
 *
 * The model (rm_*) implements the contracts of include/kvprefix.h in the most direct way:
 *
 *   blocks[0 .. n_blocks)   plain array; each block has a ref count, an "indexed" flag and,
 *                           when indexed, a namespace number and a private copy of the whole
 *                           token prefix it ends (tokens[0 .. (i+1) * block_size)).
 *   namespaces[]            deep copies of every namespace seen, compared field by field.
 *
 * A block "key" is never hashed: two blocks have equal keys exactly when their namespaces
 * are equal (presence and bytes of all four fields) and their token prefixes are equal.
 * Every query is a linear scan. LRU order is a per-block stamp taken from a clock that
 * ticks whenever a block becomes evictable; the victim is the evictable block with the
 * smallest stamp. Free blocks are always taken before any victim. Because the model never
 * hashes, it is independent of src/keys.c and immune to hash collisions, which is what the
 * differential tests need. It costs O(n_blocks * prefix) per operation; fine for tests.
 *
 * Collision-proof mode (verify_tokens) adds exact provenance, as the library owner settled
 * it. Every time a block is indexed it becomes a new *instance* (a serial from a counter,
 * never reused). A first block is its namespace's; a later block records the instance that
 * was the accepted block for the position before it when it was stored: in rm_commit the
 * hit block, the indexed block it deduplicated against, or the request's own block stored
 * there; in rm_access the block that access pinned or stored there. A walk from block 0
 * accepts block i > 0 only if its recorded parent instance is exactly the instance accepted
 * at i - 1; otherwise it stops there and counts one verify reject (a missing key counts
 * none). Since model keys are exact, this is the only way a block fails: its parent was
 * evicted and cached again (a new instance) while it stayed. When rm_commit or rm_access
 * finds block i's key indexed but not verifying, it counts a reject, takes the old block out
 * of the index (KVP_REMOVED_REPLACED: free if unpinned, else private to its requests) and
 * stores the request's own block (commit) or a freshly taken block (access) under the key.
 *
 * Block ids of the model are its own array indexes and need not equal the library's; the
 * tests compare only what the contract fixes (return codes, match results, counters).
 */
#ifndef KVP_TESTS_REFMODEL_H
#define KVP_TESTS_REFMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvprefix.h"

/* ---------------------------------------------------------------------------------------- */
/* Reference model                                                                          */
/* ---------------------------------------------------------------------------------------- */

typedef struct rm_model rm_model;

/* Create a model of a cache with n_blocks blocks of block_size tokens, in collision-proof
 * mode when verify is true. Aborts the test program on allocation failure (the model is
 * test code). */
rm_model *rm_new(uint32_t n_blocks, uint32_t block_size, bool verify);
void rm_free(rm_model *m);

/* The same operations as the library, with the same return codes and results. */
int rm_lookup(rm_model *m, const kvp_namespace *ns, const uint32_t *tokens, size_t n_tokens,
              kvp_match *out);
int rm_acquire(rm_model *m, uint64_t req_id, const kvp_namespace *ns, const uint32_t *tokens,
               size_t n_tokens, size_t n_capacity, kvp_match *out);
int rm_grow(rm_model *m, uint64_t req_id, size_t n_capacity);
int rm_commit(rm_model *m, uint64_t req_id, const uint32_t *tokens, size_t n_tokens,
              size_t *n_stored);
int rm_release(rm_model *m, uint64_t req_id);
int rm_access(rm_model *m, const kvp_namespace *ns, const uint32_t *tokens, size_t n_tokens,
              kvp_match *out);
int rm_reset(rm_model *m);
void rm_stats(const rm_model *m, kvp_stats *out);

/* The first field in which two kvp_stats differ: its name (a static string) with the two
 * values in *a_val and *b_val; NULL when they are equal. Shared by the differential test and
 * fuzz_ops. Cannot fail. */
const char *rm_stats_diff(const kvp_stats *a, const kvp_stats *b, uint64_t *a_val, uint64_t *b_val);

/* Blocks the request holds (0 if it is not active) and blocks it has committed. */
size_t rm_request_n_blocks(const rm_model *m, uint64_t req_id);
size_t rm_request_n_committed(const rm_model *m, uint64_t req_id);
bool rm_request_active(const rm_model *m, uint64_t req_id);

/* Blocks that left the index as KVP_REMOVED_REPLACED (collision-proof mode) so far. */
uint64_t rm_n_replaced(const rm_model *m);

/* True when two namespaces are equal field by field (presence and bytes). */
bool rm_namespace_equal(const kvp_namespace *a, const kvp_namespace *b);

#endif /* KVP_TESTS_REFMODEL_H */
