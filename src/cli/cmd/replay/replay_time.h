/*
 * replay_time.h - the time model of `kvprefix replay --tiers`: how long a request's prefill
 * takes when some of its prefix is found in a cache tier (docs/replay.md, "Time model").
 *
 * A request of n prompt tokens whose cached prefix is h[0] blocks in the GPU tier, h[1] in
 * the next tier (host memory), h[2] in the one after (disk)... loads tiers 1 .. c in order
 * and recomputes everything after them:
 *
 *   TTFT(c) = (n - R) / rate + attn x (n^2 - R^2)  +  sum over k in 1..c with h[k] > 0 of
 *             (latency[k] + h[k] x block_bytes / bandwidth[k]),     R = bs x (h[0] + ... + h[c])
 *
 * where the first term is the weights' work on the tokens computed and the second attention's
 * (token t attends to the t before it, so computing tokens R .. n - 1 costs in proportion to
 * n^2 - R^2; attn is 0 when the rate was given rather than derived from FLOPs),
 *
 * and the model takes the c in 0 .. K-1 with the least TTFT (the fewest tiers on a tie):
 * where loading a tier's blocks costs more than recomputing them, it recomputes. A tier
 * whose per-token load time is at least the per-token compute time never pays; one that is
 * faster pays for runs longer than latency / (1/rate - load time per token) tokens.
 *
 * Pure arithmetic over doubles: no allocation, no I/O; tests check it by hand.
 */
#ifndef CLI_REPLAY_TIME_H
#define CLI_REPLAY_TIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RP_MAX_TIERS 4 /* gpu, cpu, disk, remote */

typedef struct rp_time_model {
    double prefill_tok_s;            /* prefill rate of the replica, tokens/s (> 0) */
    double attn_s;                   /* seconds per unit of n^2 - R^2 (attention), >= 0 */
    uint32_t block_size;             /* tokens per block (> 0) */
    double block_bytes;              /* bytes one block load moves, all ranks (> 0) */
    size_t n_tiers;                  /* 1 .. RP_MAX_TIERS; tier 0 is the GPU */
    double bw_bytes_s[RP_MAX_TIERS]; /* tiers 1..: load bandwidth into the GPUs (> 0) */
    double latency_s[RP_MAX_TIERS];  /* tiers 1..: fixed cost of a load from it (>= 0) */
} rp_time_model;

/* Whether *m is usable: a finite attn_s >= 0, a positive finite rate, block size and block bytes, 1
 * .. RP_MAX_TIERS tiers, each lower tier with a positive finite bandwidth and a finite latency >=
 * 0. */
bool rp_time_valid(const rp_time_model *m);

/* Prefill rate of a replica from a model's FLOPs per token: 2 x n_params FLOPs per token
 * (the weights' multiply-adds; attention's own FLOPs are left out), spread over tp GPUs of
 * peak_flops each at utilisation mfu: tp x peak_flops x mfu / (2 x n_params). Returns 0 when
 * an argument is 0, negative or not finite. */
double rp_time_prefill_rate(uint64_t n_params, uint32_t tp, double peak_flops, double mfu);

/* The modelled TTFT of one request (seconds) of n_tokens prompt tokens whose cached blocks per
 * tier are hits[0 .. m->n_tiers) (already capped so one token is computed: the sum times the
 * block size is below n_tokens). *n_loaded, when not NULL, is set to the number of lower tiers
 * loaded (the c above: tiers 1 .. c are loaded, later ones recomputed). Cannot fail on a valid
 * model. */
double rp_time_request(const rp_time_model *m, uint64_t n_tokens, const uint32_t *hits,
                       size_t *n_loaded);

/* Attention's cost for rp_time_model.attn_s: 2 x layers x query heads x head dim FLOPs per
 * unit of n^2 - R^2 (QK^T and AV, a multiply-add each, summed over positions), over tp GPUs
 * of peak_flops at mfu. Returns 0 when an argument is 0 or not finite. */
double rp_time_attn(uint32_t n_layers, uint32_t n_heads, uint32_t head_dim, uint32_t tp,
                    double peak_flops, double mfu);

/* Whether lower tier k (1 .. n_tiers - 1) ever pays: its load time per token is below the
 * compute time per token at the linear rate (attention only makes deep runs pay more, so this
 * is the conservative statement; each request's choice uses its exact cost). When it does,
 * *breakeven_tokens (when not NULL) is the run length above which a load beats recomputing: latency
 * / (1/rate - load time per token); when it does not, it is set to INFINITY. */
bool rp_time_tier_pays(const rp_time_model *m, size_t k, double *breakeven_tokens);

#endif /* CLI_REPLAY_TIME_H */
