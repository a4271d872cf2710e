/*
 * replay_opt.h - the offline optimum of a replay (Belady's MIN adapted to prefix caching):
 * the most prefill tokens any eviction policy could skip on a request log at a capacity in
 * blocks, under exactly the rules of replay_sim.h (docs/replay.md, "The rules of a replay").
 *
 * The log is given as it was replayed: per request its prompt tokens, its full prompt blocks
 * and the dense block numbers it touched (rp_sim_last_blocks after each rp_sim_add), so MIN
 * sees the same keys, the same requests and the same rules as the LRU engine:
 *
 *   - a request hits the longest cached prefix of its full prompt blocks, and reuses at most
 *     lim = min(full blocks, (prompt tokens - 1) / block size) of them (one prompt token is
 *     always computed);
 *   - it then stores all the blocks it touched (no bypass: every full block is admitted), or
 *     its first C when it has more than the capacity C; its own blocks are never victims;
 *   - the victims are chosen with knowledge of the future: the cached block whose next
 *     *useful* touch is farthest away goes first, ties to the deeper block.
 *
 * A touch of block b (depth d) by request r is useful when d < lim(r): only then can b count as
 * a hit. A block whose next touch is not useful (the last full block of a prompt whose length
 * is a multiple of the block size, an output block) or that is never touched again is worth
 * nothing now: that touch admits it again for free. Its eviction key is "infinite".
 *
 * Why this is the optimum (not merely a bound). Relax the hit rule to "every useful block
 * found cached counts" (no prefix condition): for the same schedule that counts at least as
 * many hits, so the relaxed optimum bounds every policy. In the relaxed problem (forced
 * admission, requests as sets that must all stay, free re-admission) the usual exchange
 * argument shows that evicting the largest next-useful-touch key is optimal: swapping a kept
 * block a for an evicted b with key(b) <= key(a) loses at most a's hit and gains b's first.
 * And the schedule it makes counts the same under the real rule: every request touching a
 * child touches its parent, so from the parent's last touch before a useful use of the child
 * both have the same key and the deeper child is evicted first; a useful cached block
 * therefore always has its parent cached, and the relaxed hits are the longest cached
 * prefix. Plain Belady (next touch of any kind) is not optimal: it keeps blocks whose next
 * touch cannot hit (tests/cli/test_replay_opt.c finds such logs and checks this MIN against
 * an exhaustive search over every eviction choice on small logs).
 *
 * Cost: rp_opt_add stores 4 bytes per block touch and 20 per request; the first evaluation
 * adds the next-touch pass, O(A) time and 4 bytes per touch (A touches) plus 4 per distinct
 * block while it runs. Each evaluation at capacity C is then O(A log C) time (an indexed
 * binary heap over the cached blocks) and 12 bytes per distinct block plus 4 per cached one.
 */
#ifndef CLI_REPLAY_OPT_H
#define CLI_REPLAY_OPT_H

#include <stddef.h>
#include <stdint.h>

enum {
    RP_OPT_USEFUL = 0, /* evict the farthest next useful touch (the optimum) */
    RP_OPT_PLAIN = 1   /* evict the farthest next touch of any kind (textbook Belady; for tests) */
};

typedef struct rp_opt_result {
    uint64_t capacity;        /* blocks */
    uint64_t n_requests;      /* requests */
    uint64_t n_hit_tokens;    /* prefill tokens skipped */
    uint64_t n_blocks_cached; /* full prompt blocks in the longest cached prefix (uncapped) */
    uint64_t n_blocks_hit;    /* blocks reused (capped so one token is computed) */
    uint64_t n_stored;        /* blocks newly cached */
    uint64_t n_evicted;       /* cached blocks evicted to make room */
} rp_opt_result;

typedef struct rp_opt rp_opt;

/* A new, empty log for blocks of block_size tokens (>= 1). NULL on ENOMEM or size 0. */
rp_opt *rp_opt_new(uint32_t block_size);

/* Append one request: n_tokens prompt tokens (>= 1), n_full full prompt blocks, and the
 * n_touch >= n_full blocks it touched (blocks[i] the dense number of the block at depth i).
 * Returns 0, or -1 on ENOMEM or a bad shape (nothing appended). */
int rp_opt_add(rp_opt *o, uint64_t n_tokens, uint32_t n_full, const size_t *blocks, size_t n_touch);

/* Hits of the offline optimum (rule RP_OPT_USEFUL) or of textbook Belady (RP_OPT_PLAIN) at
 * capacity blocks (>= 1) into *out. The first call builds the next-touch indexes; later
 * rp_opt_add calls discard them. Returns 0, or -1 on ENOMEM (*out untouched). */
int rp_opt_eval(rp_opt *o, uint64_t capacity, int rule, rp_opt_result *out);

/* Requests appended, and touches of request r (its blocks into *blocks, owned by o, valid
 * until the next rp_opt_add), its prompt tokens and full blocks: the log for other offline
 * simulators (bench/bench_policies.c). */
size_t rp_opt_n_requests(const rp_opt *o);
size_t rp_opt_request(const rp_opt *o, size_t r, const uint32_t **blocks, uint64_t *n_tokens,
                      uint32_t *n_full);

/* Distinct block numbers: one more than the largest appended (0 when empty). */
size_t rp_opt_n_blocks(const rp_opt *o);

void rp_opt_free(rp_opt *o);

#endif /* CLI_REPLAY_OPT_H */
