/*
 * fuzz_router.c - libFuzzer harness: the router index (kvp_router) fed what a network
 * peer can send: arbitrary msgpack payloads with arbitrary sequence numbers, decoded by
 * kvp_kv_decode and applied to one of three workers, interleaved with stale marks,
 * resyncs, worker removal and re-adding, and scores.
 *
 * Input: a sequence of records. Each starts with an op byte: bits 0-1 pick the worker
 * (0..2; worker w uses block size 1, 4 or 16 and the xxh3 profile, so decoded BlockStored
 * events of each size can be accepted by one of them), bits 2-4 the operation (apply with
 * the next expected sequence number, apply with a sequence number from the input, mark
 * stale, resync, score, remove and re-add, clear through an empty AllBlocksCleared
 * batch); an apply reads a 2-byte little-endian length and that many payload bytes.
 * Allocations go through the checking allocator; one in 16 inputs arms an allocation
 * failure. Inputs of odd length run the router in token mode (KVP_ROUTER_INDEX_TOKENS: own
 * keys from the events' token_ids, the engine hash -> own key maps, which the checker
 * walks); every decoded batch also goes through kvp_router_check_keys.
 *
 * Asserted after every operation: every call returns one of its documented codes (apply:
 * KVP_OK, KVP_EINVAL, KVP_ENOMEM; a failed apply leaves the worker's expected sequence
 * number unchanged); an applied batch's result status is one of the four; kvp_router_check
 * passes; a score returns one row per worker with n_blocks no more than the prompt's full
 * blocks and n_tokens = n_blocks * block size; nothing leaks after kvp_router_free.
 */
#include <stdint.h>
#include <string.h>

#include "fuzz_util.h"
#include "kvprefix_events.h"

#define N_WORKERS 3
#define MAX_OPS   64

static const uint32_t worker_bs[N_WORKERS] = {1, 4, 16};

typedef struct world {
    kvp_router *r;
    uint32_t id[N_WORKERS];
    uint32_t prompt[256]; /* tokens of the last accepted BlockStored, as a score prompt */
    size_t n_prompt;
} world;

static void add_worker(world *w, int i)
{
    kvp_router_worker_config wc;
    kvp_router_worker_config_init(&wc);
    static const char *const names[N_WORKERS] = {"w0", "w1", "w2"};
    wc.engine_id = names[i];
    wc.hash.hash_profile = KVP_HASH_XXH3;
    wc.hash.block_size = worker_bs[i];
    int rc = kvp_router_worker_add(w->r, &wc, &w->id[i]);
    FZ_ASSERT(rc == KVP_OK || rc == KVP_ENOMEM, "worker_add: %s", kvp_strerror(rc));
    if (rc != KVP_OK)
        w->id[i] = UINT32_MAX;
}

static uint64_t expected_of(world *w, int i)
{
    kvp_router_worker_stats ws;
    if (w->id[i] == UINT32_MAX || kvp_router_worker_stats_get(w->r, w->id[i], &ws) != KVP_OK)
        return 0;
    return ws.seq_known ? ws.expected : 0;
}

static void remember_prompt(world *w, const kvp_kv_batch *b)
{
    for (size_t e = 0; e < b->n_events; e++) {
        const kvp_kv_event *ev = &b->events[e];
        if (ev->type == KVP_EVENT_STORED && ev->n_tokens && ev->tokens) {
            w->n_prompt = ev->n_tokens < 256 ? ev->n_tokens : 256;
            memcpy(w->prompt, ev->tokens, w->n_prompt * sizeof(uint32_t));
            return;
        }
    }
}

static void op_apply(world *w, int i, fz_in *in, bool own_seq)
{
    uint64_t seq = own_seq ? fz_u8(in) : expected_of(w, i);
    size_t len = fz_u8(in);
    len |= (size_t)fz_u8(in) << 8;
    if (len > in->n)
        len = in->n;
    const uint8_t *payload = in->p;
    in->p += len, in->n -= len;
    kvp_kv_batch *b = NULL;
    int rc = kvp_kv_decode(payload, len, &b);
    FZ_ASSERT(rc == KVP_OK || rc == KVP_EFORMAT || rc == KVP_ENOMEM, "decode: %s",
              kvp_strerror(rc));
    if (rc != KVP_OK || w->id[i] == UINT32_MAX) {
        kvp_kv_batch_free(b);
        return;
    }
    kvp_router_key_check kc;
    rc = kvp_router_check_keys(w->r, w->id[i], b, &kc);
    FZ_ASSERT(rc == KVP_OK && kc.n_mismatch <= kc.n_checked, "check_keys: %s", kvp_strerror(rc));
    uint64_t before = expected_of(w, i);
    kvp_router_apply_result res;
    rc = kvp_router_apply(w->r, w->id[i], seq, b, &res);
    FZ_ASSERT(rc == KVP_OK || rc == KVP_EINVAL || rc == KVP_ENOMEM, "apply: %s", kvp_strerror(rc));
    if (rc == KVP_OK) {
        FZ_ASSERT(res.status >= KVP_ROUTER_APPLIED && res.status <= KVP_ROUTER_GAP,
                  "apply: status %d", res.status);
        if (res.status == KVP_ROUTER_APPLIED || res.status == KVP_ROUTER_RESTARTED)
            remember_prompt(w, b);
    } else {
        FZ_ASSERT(expected_of(w, i) == before, "a failed apply moved the sequence number");
    }
    kvp_kv_batch_free(b);
}

static void op_score(world *w)
{
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    kvp_router_row rows[N_WORKERS];
    size_t n_rows = 0;
    int rc = kvp_router_score(w->r, &ns, w->prompt, w->n_prompt, rows, N_WORKERS, &n_rows);
    FZ_ASSERT(rc == KVP_OK || rc == KVP_ENOMEM, "score: %s", kvp_strerror(rc));
    if (rc != KVP_OK)
        return;
    kvp_router_stats st;
    FZ_ASSERT(kvp_router_stats_get(w->r, &st) == KVP_OK, "stats");
    FZ_ASSERT(n_rows == st.n_workers, "score: %zu rows for %u workers", n_rows, st.n_workers);
    for (size_t k = 0; k < n_rows; k++) {
        int i = -1;
        for (int j = 0; j < N_WORKERS; j++)
            if (w->id[j] == rows[k].worker)
                i = j;
        FZ_ASSERT(i >= 0, "score: a row for an unknown worker %u", rows[k].worker);
        FZ_ASSERT(rows[k].n_blocks <= w->n_prompt / worker_bs[i], "score: %u blocks of %zu tokens",
                  rows[k].n_blocks, w->n_prompt);
        FZ_ASSERT(rows[k].n_tokens == (uint64_t)rows[k].n_blocks * worker_bs[i], "score: tokens");
    }
}

static void op_clear(world *w, int i)
{
    if (w->id[i] == UINT32_MAX)
        return;
    kvp_kv_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = KVP_EVENT_CLEARED;
    ev.group_idx = -1;
    kvp_kv_batch b = {0.0, &ev, 1, false, 0};
    kvp_router_apply_result res;
    int rc = kvp_router_apply(w->r, w->id[i], expected_of(w, i), &b, &res);
    FZ_ASSERT(rc == KVP_OK || rc == KVP_ENOMEM, "clear: %s", kvp_strerror(rc));
}

static void step(world *w, fz_in *in)
{
    uint8_t op = fz_u8(in);
    int i = (op & 3) % N_WORKERS;
    uint32_t id = w->id[i];
    int rc;
    switch ((op >> 2) & 7) {
    case 0:
    case 1:
        op_apply(w, i, in, false);
        break;
    case 2:
        op_apply(w, i, in, true);
        break;
    case 3:
        rc = id == UINT32_MAX ? KVP_OK : kvp_router_mark_stale(w->r, id);
        FZ_ASSERT(rc == KVP_OK, "mark_stale: %s", kvp_strerror(rc));
        break;
    case 4:
        rc = id == UINT32_MAX ? KVP_OK : kvp_router_resync(w->r, id);
        FZ_ASSERT(rc == KVP_OK, "resync: %s", kvp_strerror(rc));
        break;
    case 5:
        op_score(w);
        break;
    case 6:
        if (id != UINT32_MAX) {
            rc = kvp_router_worker_remove(w->r, id);
            FZ_ASSERT(rc == KVP_OK, "worker_remove: %s", kvp_strerror(rc));
        }
        add_worker(w, i);
        break;
    default:
        op_clear(w, i);
        break;
    }
    FZ_ASSERT(kvp_router_check(w->r) == KVP_OK, "kvp_router_check failed after op %u", op);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_harness = "router";
    fz_in in = {data, size};
    fz_alloc alloc;
    fz_alloc_init(&alloc);
    uint8_t arm = fz_u8(&in);
    kvp_router_config cfg;
    kvp_router_config_init(&cfg);
    cfg.table_seed = 1;
    cfg.alloc = fz_alloc_hooks(&alloc);
    if (size & 1)
        cfg.index_by = KVP_ROUTER_INDEX_TOKENS;
    world w;
    memset(&w, 0, sizeof w);
    int rc = kvp_router_new(&cfg, &w.r);
    FZ_ASSERT(rc == KVP_OK, "kvp_router_new: %s", kvp_strerror(rc));
    for (int i = 0; i < N_WORKERS; i++)
        add_worker(&w, i);
    if ((arm & 15) == 0)
        alloc.fail_in = arm >> 4; /* fail one allocation during the operations */
    for (int k = 0; k < MAX_OPS && fz_more(&in); k++)
        step(&w, &in);
    alloc.fail_in = -1;
    kvp_router_free(w.r);
    fz_alloc_check_empty(&alloc, "kvp_router_free");
    return 0;
}
