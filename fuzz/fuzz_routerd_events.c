/*
 * fuzz_routerd_events.c - libFuzzer harness: the router daemon's event intake
 * (src/routerd/rd_events.c, rd_events_intake) fed what a hostile engine can send, without
 * sockets: messages of 1..4 frames on one of three endpoints (a named engine of rank 0, a
 * named engine declared as rank 2, an ID '*' endpoint taking engine and model from each
 * topic), with --endpoint-workers 4 and --endpoint-blocks 64. None has a replay endpoint, so
 * a gap marks the worker stale at once.
 *
 * Input: a sequence of messages. Per message a byte picks the endpoint (bits 0-1) and the
 * frame count (bits 2-3: 3 most of the time); the topic is one of a few shapes (empty,
 * kv@pod<k>@m<j>, a topic with a byte that is not UTF-8 or a control character) or input
 * bytes; the sequence frame is 8 input bytes (or a small number from one byte, so that
 * batches follow each other); the payload is either input bytes (2-byte length) or a batch
 * the harness encodes from a few input bytes (a BlockStored of 1..8 blocks chained from the
 * previous one, a BlockRemoved, an AllBlocksCleared; data_parallel_rank absent, the
 * endpoint's, or another), so that batches reach the index and its limits.
 *
 * Asserted after every message: kvp_router_check passes; every endpoint has at most
 * --endpoint-workers workers and every worker's rank is its endpoint's; the blocks the
 * workers of an endpoint hold together are at most --endpoint-blocks; the refusal counters
 * only grow; nothing leaks after rd_events_free and kvp_router_free (ASan).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "routerd.h"

#define N_SRC      3
#define EP_WORKERS 4
#define EP_BLOCKS  64

/* Build a batch from a few input bytes and encode it (msgpack, vLLM array form). Returns
 * the payload (malloc'd by the library, freed with kvp_kv_buf_free) or NULL. */
static uint8_t *make_batch(fz_in *in, int64_t rank, uint64_t *chain, size_t *n_out)
{
    static uint64_t hashes[8];
    static uint32_t toks[8 * 16];
    kvp_kv_event ev;
    memset(&ev, 0, sizeof ev);
    ev.group_idx = -1;
    int kind = (int)fz_below(in, 4);
    size_t nb = 1 + fz_below(in, 8);
    if (kind <= 1) {
        ev.type = KVP_EVENT_STORED;
        ev.has_parent = *chain != 0 && fz_below(in, 4) != 0;
        ev.parent = *chain;
        for (size_t i = 0; i < nb; i++) {
            hashes[i] = ++*chain * 2654435761u;
            for (int t = 0; t < 16; t++)
                toks[i * 16 + (size_t)t] = (uint32_t)(fz_u8(in) + (*chain << 8));
        }
        ev.hashes = hashes;
        ev.n_hashes = nb;
        ev.tokens = toks;
        ev.n_tokens = nb * 16;
        ev.block_size = 16;
        ev.medium = "GPU";
    } else if (kind == 2) {
        ev.type = KVP_EVENT_REMOVED;
        for (size_t i = 0; i < nb; i++)
            hashes[i] = (*chain - fz_below(in, 16)) * 2654435761u;
        ev.hashes = hashes;
        ev.n_hashes = nb;
    } else {
        ev.type = KVP_EVENT_CLEARED;
    }
    kvp_kv_batch b = {.ts = 1.0, .events = &ev, .n_events = 1};
    int rk = (int)fz_below(in, 3);
    b.has_dp_rank = rk != 0;
    b.dp_rank = rk == 1 ? rank : (int64_t)fz_u8(in);
    uint8_t *buf = NULL;
    if (kvp_kv_encode_alloc(&b, KVP_KV_FORM_ARRAY, &buf, n_out) != KVP_OK)
        return NULL;
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_harness = "fuzz_routerd_events";
    fz_in in = {data, size};
    rd_daemon d;
    memset(&d, 0, sizeof d);
    kvp_config_init(&d.hash);
    d.hash.block_size = 16;
    d.index_by = size % 2 ? KVP_ROUTER_INDEX_ENGINE_HASH : KVP_ROUTER_INDEX_TOKENS;
    d.lim.endpoint_workers = EP_WORKERS;
    d.lim.endpoint_blocks = EP_BLOCKS;
    d.replay_timeout_ms = 100;
    pthread_mutex_init(&d.lock, NULL);
    kvp_router_config rc;
    kvp_router_config_init(&rc);
    d.hash.hash_profile = KVP_HASH_XXH3;
    rc.hash = d.hash;
    rc.index_by = d.index_by;
    FZ_ASSERT(kvp_router_new(&rc, &d.router) == KVP_OK, "router_new");
    static char ep[N_SRC][16] = {"ipc://a", "ipc://b", "ipc://pods"};
    static char eng[2][4] = {"a", "b"};
    static char topic0[] = "";
    rd_source src[N_SRC];
    memset(src, 0, sizeof src);
    for (int i = 0; i < N_SRC; i++) {
        src[i].endpoint = ep[i];
        src[i].topic = topic0;
        src[i].engine = i < 2 ? eng[i] : NULL;
        src[i].dp_rank = i == 1 ? 2 : 0;
    }
    d.sources = src;
    d.n_sources = N_SRC;
    uint64_t chain = 0, bad_before = 0;
    uint64_t seq[N_SRC] = {0};
    for (int m = 0; m < 64 && fz_more(&in); m++) {
        uint8_t op = fz_u8(&in);
        int s = (op & 3) % N_SRC;
        int n_frames = (op >> 2 & 3) == 0 ? 1 + (int)fz_below(&in, 4) : 3;
        const void *frames[4] = {NULL};
        size_t sizes[4] = {0};
        char topic[64];
        size_t tk = fz_below(&in, 5);
        if (tk == 0)
            topic[0] = '\0';
        else if (tk == 1)
            snprintf(topic, sizeof topic, "kv@pod%u@m%u", (unsigned)fz_below(&in, 8),
                     (unsigned)fz_below(&in, 3));
        else if (tk == 2)
            snprintf(topic, sizeof topic, "kv@p\xff%u@m", (unsigned)fz_below(&in, 4));
        else if (tk == 3)
            snprintf(topic, sizeof topic, "kv@p\x01@m");
        else {
            size_t n = fz_below(&in, 32), i = 0;
            for (; i < n; i++)
                topic[i] = (char)fz_u8(&in);
            topic[i] = '\0';
        }
        frames[0] = topic;
        sizes[0] = strlen(topic);
        uint8_t seqb[8] = {0};
        if (fz_below(&in, 4) == 0) {
            for (int i = 0; i < 8; i++)
                seqb[i] = fz_u8(&in);
        } else {
            uint64_t v = seq[s] + fz_below(&in, 3) - (fz_below(&in, 4) == 0);
            seq[s] = v + 1;
            for (int i = 0; i < 8; i++)
                seqb[i] = (uint8_t)(v >> (56 - 8 * i));
        }
        frames[1] = seqb;
        sizes[1] = 8 - (fz_below(&in, 16) == 0);
        uint8_t *built = NULL;
        uint8_t raw[512];
        if (fz_below(&in, 4) == 0) {
            size_t n = fz_below(&in, sizeof raw), i = 0;
            for (; i < n && fz_more(&in); i++)
                raw[i] = fz_u8(&in);
            frames[2] = raw;
            sizes[2] = i;
        } else {
            size_t n = 0;
            built = make_batch(&in, src[s].dp_rank, &chain, &n);
            frames[2] = built ? (const void *)built : (const void *)raw;
            sizes[2] = built ? n : 0;
        }
        frames[3] = raw;
        rd_events_intake(&d, &src[s], frames, sizes, n_frames);
        kvp_kv_buf_free(built);

        /* The invariants. */
        FZ_ASSERT(kvp_router_check(d.router) == KVP_OK, "kvp_router_check");
        uint64_t bad = 0;
        for (int i = 0; i < N_SRC; i++) {
            uint32_t nw = 0;
            uint64_t blocks = 0;
            for (size_t k = 0; k < d.n_workers; k++) {
                rd_worker *w = d.workers[k];
                if (w->src != &src[i])
                    continue;
                nw++;
                FZ_ASSERT(w->dp_rank == src[i].dp_rank, "worker rank %lld on an endpoint of %lld",
                          (long long)w->dp_rank, (long long)src[i].dp_rank);
                kvp_router_worker_stats ws;
                if (kvp_router_worker_stats_get(d.router, w->id, &ws) == KVP_OK)
                    blocks += ws.n_blocks;
            }
            FZ_ASSERT(nw <= EP_WORKERS, "endpoint %d has %u workers", i, nw);
            FZ_ASSERT(blocks <= EP_BLOCKS, "endpoint %d holds %llu blocks", i,
                      (unsigned long long)blocks);
            for (int k = 0; k < RD_BAD_KINDS; k++)
                bad += src[i].n_bad[k];
        }
        FZ_ASSERT(bad >= bad_before, "refusal counters went back");
        bad_before = bad;
    }
    rd_events_free(&d);
    kvp_router_free(d.router);
    pthread_mutex_destroy(&d.lock);
    return 0;
}
