/*
 * replay_time.c - the time model of replay_time.h: a request's TTFT from the blocks each tier
 * holds of its prefix, loading the tiers that pay and recomputing the rest.
 *
 * The best cut is found by trying every c (at most RP_MAX_TIERS): TTFT(c) is a sum over
 * tiers, so each try is O(K) and a request O(K^2) with K <= 4. Loads are serial with
 * compute (no overlap of a layer's load with the previous layer's compute) and with each
 * other: an upper bound on what a pipelined engine spends (docs/replay.md, "Limits").
 */
#include "replay_time.h"

#include <math.h>

static bool pos_finite(double x)
{
    return isfinite(x) && x > 0.0;
}

bool rp_time_valid(const rp_time_model *m)
{
    if (!m || !pos_finite(m->prefill_tok_s) || !isfinite(m->attn_s) || m->attn_s < 0 ||
        m->block_size == 0 || !pos_finite(m->block_bytes) || m->n_tiers < 1 ||
        m->n_tiers > RP_MAX_TIERS)
        return false;
    for (size_t k = 1; k < m->n_tiers; k++)
        if (!pos_finite(m->bw_bytes_s[k]) || !isfinite(m->latency_s[k]) || m->latency_s[k] < 0)
            return false;
    return true;
}

double rp_time_prefill_rate(uint64_t n_params, uint32_t tp, double peak_flops, double mfu)
{
    if (n_params == 0 || tp == 0 || !pos_finite(peak_flops) || !pos_finite(mfu))
        return 0.0;
    return (double)tp * peak_flops * mfu / (2.0 * (double)n_params);
}

double rp_time_attn(uint32_t n_layers, uint32_t n_heads, uint32_t head_dim, uint32_t tp,
                    double peak_flops, double mfu)
{
    if (!n_layers || !n_heads || !head_dim || !tp || !pos_finite(peak_flops) || !pos_finite(mfu))
        return 0.0;
    return 2.0 * n_layers * n_heads * head_dim / ((double)tp * peak_flops * mfu);
}

/* Compute time of tokens reused .. n - 1 (reused <= n). */
static double compute_s(const rp_time_model *m, double n, double reused)
{
    return (n - reused) / m->prefill_tok_s + m->attn_s * (n * n - reused * reused);
}

double rp_time_request(const rp_time_model *m, uint64_t n_tokens, const uint32_t *hits,
                       size_t *n_loaded)
{
    double bs = (double)m->block_size;
    double reused = (double)hits[0] * bs; /* tokens not computed */
    double transfer = 0.0;                /* seconds of loads so far */
    double n = (double)n_tokens;
    double best = compute_s(m, n, reused);
    size_t best_c = 0;
    for (size_t c = 1; c < m->n_tiers; c++) {
        if (hits[c] > 0) {
            transfer += m->latency_s[c] + (double)hits[c] * m->block_bytes / m->bw_bytes_s[c];
            reused += (double)hits[c] * bs;
        }
        double t = compute_s(m, n, reused) + transfer;
        if (t < best) {
            best = t;
            best_c = c;
        }
    }
    if (n_loaded)
        *n_loaded = best_c;
    return best;
}

bool rp_time_tier_pays(const rp_time_model *m, size_t k, double *breakeven_tokens)
{
    double compute = 1.0 / m->prefill_tok_s;
    double load = m->block_bytes / (double)m->block_size / m->bw_bytes_s[k];
    bool pays = load < compute;
    if (breakeven_tokens)
        *breakeven_tokens = pays ? m->latency_s[k] / (compute - load) : (double)INFINITY;
    return pays;
}
