/*
 * test_events_e2e.c - kvprefix caches, their publishers, the wire and the router index
 * together: the router's view of each engine equals the engine's own cache.
 *
 * Two engines (kvp_caches of 48 blocks of 16 tokens, one under vllm-sha256-cbor and one
 * under xxh3) publish through kvp_publisher on inproc endpoints with topics "kv@a@m" and
 * "kv@b@m"; one SUB socket receives both streams, kvp_kv_decode decodes every payload and
 * kvp_router_apply applies it to the worker named by the topic. A message missed by the
 * subscriber (ZeroMQ's slow joiner, or one the test drops on purpose) shows up as a GAP,
 * which the test fills from the engine's replay socket ([empty, start seq] to a DEALER,
 * batches, then the all-0xff end marker), as a router daemon would.
 *
 * Random kvp_access calls over a few shared prefixes (so that pools evict and chains are
 * shared and cut) and resets run on both engines; after every step, for every prompt, the
 * router's score for each worker must equal that engine's kvp_lookup n_blocks_cached, and
 * the router's per-worker block count the engine's cached block count. The router's
 * invariant checker runs at the end.
 */
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>
#include <zmq.h>

#include "kvprefix_events.h"
#include "testutil.h"

#define N_ENGINES 2
#define BS        16
#define N_PROMPTS 8
#define MAX_TOK   (12 * BS)

typedef struct engine {
    kvp_publisher *pub;
    kvp_cache *cache;
    void *dealer;    /* replay client */
    uint32_t worker; /* router worker id */
    kvp_config cfg;  /* the cache's config (hash fields shared with the router) */
} engine;

typedef struct world {
    void *ctx, *sub;
    kvp_router *router;
    engine e[N_ENGINES];
    uint32_t prompts[N_PROMPTS][MAX_TOK];
    size_t n_tok[N_PROMPTS];
    uint64_t rng;
    size_t n_replayed; /* batches applied from replay */
    bool drop_next;    /* drop the next message received (as if lost) */
} world;

static uint64_t rnd(world *w)
{
    w->rng ^= w->rng << 13, w->rng ^= w->rng >> 7, w->rng ^= w->rng << 17;
    return w->rng;
}

static uint64_t be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* Receive one multipart message of up to 3 frames into f0 (topic or empty), seq, payload
 * (*len bytes). Returns the number of frames, 0 when nothing arrives within timeout_ms. */
static int recv3(void *sock, int timeout_ms, char *f0, size_t f0cap, uint64_t *seq,
                 uint8_t *payload, size_t *len)
{
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) != 1)
        return 0;
    int n_frames = 0, more = 1;
    *len = 0;
    while (more) {
        static uint8_t buf[1 << 20];
        int n = zmq_recv(sock, buf, sizeof buf, 0);
        cr_assert(n >= 0 && (size_t)n <= sizeof buf);
        if (n_frames == 0) {
            size_t k = (size_t)n < f0cap - 1 ? (size_t)n : f0cap - 1;
            memcpy(f0, buf, k);
            f0[k] = '\0';
        } else if (n_frames == 1) {
            cr_assert_eq(n, 8);
            *seq = be64(buf);
        } else if (n_frames == 2) {
            memcpy(payload, buf, (size_t)n);
            *len = (size_t)n;
        }
        n_frames++;
        size_t sz = sizeof more;
        zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz);
    }
    return n_frames;
}

/* Decode and apply one payload from engine i; returns the router's status. */
static int apply(world *w, int i, uint64_t seq, const uint8_t *payload, size_t len)
{
    kvp_kv_batch *b = NULL;
    cr_assert_eq(kvp_kv_decode(payload, len, &b), KVP_OK);
    kvp_router_apply_result res;
    int rc = kvp_router_apply(w->router, w->e[i].worker, seq, b, &res);
    kvp_kv_batch_free(b);
    cr_assert_eq(rc, KVP_OK, "apply: %s (%s)", kvp_strerror(rc), res.why ? res.why : "");
    if (res.status == KVP_ROUTER_GAP) {
        /* Replay from the first missing batch, as a daemon would. */
        static uint8_t req[8];
        for (int k = 0; k < 8; k++)
            req[k] = (uint8_t)(res.expected >> (56 - 8 * k));
        cr_assert_eq(zmq_send(w->e[i].dealer, "", 0, ZMQ_SNDMORE), 0);
        cr_assert_eq(zmq_send(w->e[i].dealer, req, 8, 0), 8);
        cr_assert_eq(kvp_publisher_poll(w->e[i].pub, 2000), KVP_OK);
        for (;;) {
            static uint8_t pl[1 << 20];
            char f0[8];
            uint64_t s = 0;
            size_t n = 0;
            cr_assert_eq(recv3(w->e[i].dealer, 2000, f0, sizeof f0, &s, pl, &n), 3,
                         "replay did not answer");
            if (s == UINT64_MAX)
                break;
            kvp_kv_batch *rb = NULL;
            cr_assert_eq(kvp_kv_decode(pl, n, &rb), KVP_OK);
            kvp_router_apply_result rr;
            cr_assert_eq(kvp_router_apply(w->router, w->e[i].worker, s, rb, &rr), KVP_OK);
            kvp_kv_batch_free(rb);
            cr_assert(rr.status == KVP_ROUTER_APPLIED || rr.status == KVP_ROUTER_DUPLICATE);
            w->n_replayed += rr.status == KVP_ROUTER_APPLIED;
        }
    }
    return res.status;
}

/* Receive and apply everything the subscriber has. */
static void drain(world *w)
{
    static uint8_t payload[1 << 20];
    char topic[64];
    uint64_t seq = 0;
    size_t len = 0;
    while (recv3(w->sub, 50, topic, sizeof topic, &seq, payload, &len) == 3) {
        int i = strcmp(topic, "kv@a@m") == 0 ? 0 : 1;
        cr_assert(i == 0 || strcmp(topic, "kv@b@m") == 0, "topic %s", topic);
        if (w->drop_next) {
            w->drop_next = false;
            continue;
        }
        apply(w, i, seq, payload, len);
    }
}

static void engine_open(world *w, int i, int profile)
{
    engine *e = &w->e[i];
    char ep[64], rep[64], topic[16];
    snprintf(ep, sizeof ep, "inproc://e2e-pub-%d", i);
    snprintf(rep, sizeof rep, "inproc://e2e-replay-%d", i);
    snprintf(topic, sizeof topic, "kv@%c@m", 'a' + i);
    kvp_publisher_config pc;
    kvp_publisher_config_init(&pc);
    pc.endpoint = ep;
    pc.replay_endpoint = rep;
    pc.topic = topic;
    pc.form = i == 0 ? KVP_KV_FORM_ARRAY : KVP_KV_FORM_MAP;
    pc.zmq_context = w->ctx;
    cr_assert_eq(kvp_publisher_new(&pc, &e->pub), KVP_OK);
    kvp_config_init(&e->cfg);
    e->cfg.n_blocks = 48;
    e->cfg.block_size = BS;
    e->cfg.hash_profile = profile;
    cr_assert_eq(kvp_publisher_attach(e->pub, &e->cfg), KVP_OK);
    e->cache = th_cache_new(&e->cfg);
    e->dealer = zmq_socket(w->ctx, ZMQ_DEALER);
    cr_assert_eq(zmq_connect(e->dealer, rep), 0);
    cr_assert_eq(zmq_connect(w->sub, ep), 0);

    kvp_router_worker_config wc;
    kvp_router_worker_config_init(&wc);
    wc.engine_id = i == 0 ? "a" : "b";
    wc.hash = e->cfg;
    cr_assert_eq(kvp_router_worker_add(w->router, &wc, &e->worker), KVP_OK);
}

/* Has the router applied every batch engine i published? A batch lost on the way (the
 * slow joiner, or a drop) is only noticed at the engine's next message, which fills the
 * gap from replay; until then the router is behind and that engine is not compared. */
static bool caught_up(world *w, int i)
{
    kvp_publisher_stats ps;
    kvp_router_worker_stats ws;
    cr_assert_eq(kvp_publisher_stats_get(w->e[i].pub, &ps), KVP_OK);
    cr_assert_eq(kvp_router_worker_stats_get(w->router, w->e[i].worker, &ws), KVP_OK);
    cr_assert(ws.seq_known && ws.expected <= ps.next_seq);
    return ws.expected == ps.next_seq;
}

/* The router's rows against each engine's own lookup, for every prompt, for the engines
 * the router has caught up with; returns how many engines were compared. */
static int compare(world *w)
{
    bool up[N_ENGINES];
    int n_up = 0;
    for (int i = 0; i < N_ENGINES; i++)
        n_up += up[i] = caught_up(w, i);
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    for (int p = 0; p < N_PROMPTS; p++) {
        kvp_router_row rows[N_ENGINES];
        size_t n_rows = 0;
        cr_assert_eq(
            kvp_router_score(w->router, &ns, w->prompts[p], w->n_tok[p], rows, N_ENGINES, &n_rows),
            KVP_OK);
        cr_assert_eq(n_rows, N_ENGINES);
        for (int i = 0; i < N_ENGINES; i++) {
            if (!up[i])
                continue;
            kvp_match m;
            cr_assert_eq(kvp_lookup(w->e[i].cache, &ns, w->prompts[p], w->n_tok[p], NULL, 0, &m),
                         KVP_OK);
            const kvp_router_row *row = &rows[w->e[i].worker];
            cr_assert_eq(row->state, KVP_ROUTER_ROW_SCORED);
            cr_assert_eq(row->n_blocks, m.n_blocks_cached,
                         "engine %d prompt %d: router %u blocks, cache %u", i, p, row->n_blocks,
                         m.n_blocks_cached);
        }
    }
    for (int i = 0; i < N_ENGINES; i++) {
        if (!up[i])
            continue;
        kvp_router_worker_stats ws;
        kvp_stats st = th_stats(w->e[i].cache);
        cr_assert_eq(st.n_blocks_in_use, 0); /* kvp_access pins nothing past the call */
        cr_assert_eq(kvp_router_worker_stats_get(w->router, w->e[i].worker, &ws), KVP_OK);
        cr_assert_eq(ws.n_blocks, st.n_blocks_cached,
                     "engine %d: router holds %llu blocks, cache indexes %u", i,
                     (unsigned long long)ws.n_blocks, st.n_blocks_cached);
    }
    return n_up;
}

Test(events_e2e, router_mirrors_every_engine)
{
    world w;
    memset(&w, 0, sizeof w);
    w.rng = 0x9e3779b97f4a7c15u;
    w.ctx = zmq_ctx_new();
    w.sub = zmq_socket(w.ctx, ZMQ_SUB);
    cr_assert_eq(zmq_setsockopt(w.sub, ZMQ_SUBSCRIBE, "kv@", 3), 0);
    kvp_router_config rc;
    kvp_router_config_init(&rc);
    rc.table_seed = 1;
    cr_assert_eq(kvp_router_new(&rc, &w.router), KVP_OK);
    engine_open(&w, 0, KVP_HASH_VLLM_SHA256);
    engine_open(&w, 1, KVP_HASH_XXH3);

    /* Prompts: 3 shared stems, each continued differently. */
    for (int p = 0; p < N_PROMPTS; p++) {
        w.n_tok[p] = (size_t)(4 + rnd(&w) % 8) * BS + rnd(&w) % BS;
        for (size_t t = 0; t < w.n_tok[p]; t++)
            w.prompts[p][t] =
                t < 3 * BS ? (uint32_t)(1000 * (p % 3) + t) : (uint32_t)rnd(&w) % 5000;
    }
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    int n_compared = 0;
    for (int step = 0; step < 300; step++) {
        int i = (int)(rnd(&w) % N_ENGINES), p = (int)(rnd(&w) % N_PROMPTS);
        if (rnd(&w) % 40 == 0) {
            cr_assert_eq(kvp_cache_reset(w.e[i].cache), KVP_OK);
        } else {
            kvp_match m;
            cr_assert_eq(kvp_access(w.e[i].cache, &ns, w.prompts[p], w.n_tok[p], &m), KVP_OK);
        }
        cr_assert_eq(kvp_publisher_flush(w.e[i].pub), KVP_OK);
        if (rnd(&w) % 25 == 0)
            w.drop_next = true; /* lose a message: the router must replay it */
        drain(&w);
        n_compared += compare(&w);
    }
    cr_assert_gt(n_compared, 300 * N_ENGINES * 8 / 10, "compared %d engine-steps of %d", n_compared,
                 300 * N_ENGINES);
    cr_assert_gt(w.n_replayed, 0, "no message was ever recovered from replay");
    kvp_router_stats st;
    cr_assert_eq(kvp_router_stats_get(w.router, &st), KVP_OK);
    cr_assert_gt(st.n_gaps, 0);
    cr_assert_eq(st.n_malformed, 0);
    cr_assert_eq(st.n_stale, 0);
    cr_assert_eq(kvp_router_check(w.router), KVP_OK);

    for (int i = 0; i < N_ENGINES; i++) {
        zmq_close(w.e[i].dealer);
        kvp_cache_free(w.e[i].cache);
        kvp_publisher_free(w.e[i].pub);
    }
    kvp_router_free(w.router);
    zmq_close(w.sub);
    zmq_ctx_term(w.ctx);
}
