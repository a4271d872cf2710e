/*
 * test_tiers_router.c - a cache with a CPU tier, its publisher and the router: the router
 * scores a prompt whose blocks sit in the device pool with the GPU weight, and once the
 * device pool has evicted them and only the CPU tier holds them, with the CPU weight.
 *
 * The engine (a kvp_cache of 16 blocks of 16 tokens, xxh3, a CPU tier of 32 blocks)
 * publishes through a kvp_publisher whose tier_medium[0] is "CPU"; the test reads every
 * batch back from the publisher's replay socket (deterministic: no subscriber to join
 * late), decodes it and applies it to a router with its default tiers (GPU 1.0, CPU 0.8).
 * A second publisher without tier_medium shows that lower tiers are then not published.
 */
#include <string.h>

#include <criterion/criterion.h>
#include <zmq.h>

#include "kvprefix_events.h"
#include "testutil.h"

#define BS 16

static uint64_t be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* Receive one multipart message; returns its frames (0 on timeout), the seq frame and the
 * payload (*len bytes). */
static int recv_msg(void *sock, uint64_t *seq, uint8_t *payload, size_t *len)
{
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 2000) != 1)
        return 0;
    int n_frames = 0, more = 1;
    *len = 0;
    while (more) {
        static uint8_t buf[1 << 20];
        int n = zmq_recv(sock, buf, sizeof buf, 0);
        cr_assert(n >= 0 && (size_t)n <= sizeof buf);
        if (n_frames == 1 && n == 8)
            *seq = be64(buf);
        else if (n_frames == 2) {
            memcpy(payload, buf, (size_t)n);
            *len = (size_t)n;
        }
        n_frames++;
        size_t sz = sizeof more;
        zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz);
    }
    return n_frames;
}

/* Replay every batch from seq `from` on and apply it to the router's worker. Returns the
 * number of events applied whose medium is "CPU". */
static size_t replay_into(kvp_publisher *pub, void *dealer, kvp_router *r, uint32_t worker,
                          uint64_t from)
{
    uint8_t req[8];
    for (int k = 0; k < 8; k++)
        req[k] = (uint8_t)(from >> (56 - 8 * k));
    cr_assert_eq(zmq_send(dealer, "", 0, ZMQ_SNDMORE), 0);
    cr_assert_eq(zmq_send(dealer, req, 8, 0), 8);
    cr_assert_eq(kvp_publisher_poll(pub, 2000), KVP_OK);
    size_t n_cpu = 0;
    for (;;) {
        static uint8_t pl[1 << 20];
        uint64_t s = 0;
        size_t n = 0;
        cr_assert_eq(recv_msg(dealer, &s, pl, &n), 3, "replay did not answer");
        if (s == UINT64_MAX)
            break;
        kvp_kv_batch *b = NULL;
        cr_assert_eq(kvp_kv_decode(pl, n, &b), KVP_OK);
        for (size_t i = 0; i < b->n_events; i++)
            n_cpu += b->events[i].medium && strcmp(b->events[i].medium, "CPU") == 0;
        kvp_router_apply_result res;
        int arc = kvp_router_apply(r, worker, s, b, &res);
        cr_assert_eq(arc, KVP_OK, "apply: %s (%s)", kvp_strerror(arc), res.why ? res.why : "");
        cr_assert(res.status == KVP_ROUTER_APPLIED || res.status == KVP_ROUTER_DUPLICATE);
        kvp_kv_batch_free(b);
    }
    return n_cpu;
}

static kvp_router_row score(kvp_router *r, const uint32_t *t, size_t n)
{
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    kvp_router_row rows[2];
    size_t n_rows = 0;
    cr_assert_eq(kvp_router_score(r, &ns, t, n, rows, 2, &n_rows), KVP_OK);
    cr_assert_eq(n_rows, 1);
    return rows[0];
}

static void run(bool name_cpu)
{
    void *ctx = zmq_ctx_new();
    kvp_publisher_config pc;
    kvp_publisher_config_init(&pc);
    pc.endpoint = name_cpu ? "inproc://tiers-pub-a" : "inproc://tiers-pub-b";
    pc.replay_endpoint = name_cpu ? "inproc://tiers-replay-a" : "inproc://tiers-replay-b";
    pc.zmq_context = ctx;
    if (name_cpu)
        pc.tier_medium[0] = "CPU";
    kvp_publisher *pub = NULL;
    cr_assert_eq(kvp_publisher_new(&pc, &pub), KVP_OK);
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = 16;
    cfg.block_size = BS;
    cfg.hash_profile = KVP_HASH_XXH3;
    cr_assert_eq(kvp_publisher_attach(pub, &cfg), KVP_OK);
    kvp_cache *c = th_cache_new(&cfg);
    kvp_tier_config tc;
    kvp_tier_config_init(&tc);
    tc.n_blocks = 32;
    cr_assert_eq(kvp_cache_add_tier(c, &tc, NULL), KVP_OK);
    void *dealer = zmq_socket(ctx, ZMQ_DEALER);
    cr_assert_eq(zmq_connect(dealer, pc.replay_endpoint), 0);
    kvp_router_config rc;
    kvp_router_config_init(&rc);
    kvp_router *r = NULL;
    cr_assert_eq(kvp_router_new(&rc, &r), KVP_OK);
    kvp_router_worker_config wc;
    kvp_router_worker_config_init(&wc);
    wc.engine_id = "a";
    wc.hash = cfg;
    uint32_t worker;
    cr_assert_eq(kvp_router_worker_add(r, &wc, &worker), KVP_OK);

    /* A 4-block prompt committed and written through to the CPU tier. */
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    uint32_t p[4 * BS + 3];
    for (uint32_t i = 0; i < 4 * BS + 3; i++)
        p[i] = 7 + i;
    kvp_match m;
    size_t n_loads;
    cr_assert_eq(kvp_acquire_tiers(c, 1, &ns, p, 4 * BS + 3, 0, &m, NULL, 0, &n_loads), KVP_OK);
    cr_assert_eq(kvp_commit(c, 1, p, 4 * BS + 3, NULL), KVP_OK);
    cr_assert_eq(kvp_release(c, 1), KVP_OK);
    kvp_tier_order st[8];
    size_t n, left;
    cr_assert_eq(kvp_tier_orders(c, st, 8, &n, &left), KVP_OK);
    cr_assert_eq(n, 4);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(kvp_tier_confirm(c, st[i].id, true), KVP_OK);
    cr_assert_eq(kvp_publisher_flush(pub), KVP_OK);
    size_t n_cpu = replay_into(pub, dealer, r, worker, 0);
    cr_assert_eq(n_cpu, name_cpu ? 1 : 0, "CPU BlockStored events: %zu", n_cpu);
    kvp_router_row row = score(r, p, 4 * BS + 3);
    cr_assert_eq(row.n_blocks, 4);
    cr_assert_float_eq(row.score, 4.0, 1e-9, "in GPU (and CPU): the best tier's weight");

    /* Evict the device copies: another prompt takes the whole pool. */
    uint32_t q[16 * BS];
    for (uint32_t i = 0; i < 16 * BS; i++)
        q[i] = 90000 + i;
    cr_assert_eq(kvp_acquire(c, 2, &ns, q, 16 * BS, 0, &m), KVP_OK);
    cr_assert_eq(kvp_release(c, 2), KVP_OK);
    cr_assert_eq(kvp_publisher_flush(pub), KVP_OK);
    kvp_publisher_stats ps;
    cr_assert_eq(kvp_publisher_stats_get(pub, &ps), KVP_OK);
    (void)replay_into(pub, dealer, r, worker, 1);
    kvp_tier_match tm;
    cr_assert_eq(kvp_lookup_tiers(c, &ns, p, 4 * BS + 3, NULL, 0, &tm), KVP_OK);
    cr_assert_eq(tm.n_blocks_tier[1], 4, "the CPU tier holds the prompt");
    cr_assert_eq(tm.n_blocks_tier[0], 0, "the device pool does not");
    row = score(r, p, 4 * BS + 3);
    if (name_cpu) {
        cr_assert_eq(row.n_blocks, 4);
        cr_assert_float_eq(row.score, 4 * 0.8, 1e-9, "CPU only: score %f", row.score);
    } else {
        cr_assert_eq(row.n_blocks, 0, "an unnamed tier is not published");
    }
    cr_assert_eq(kvp_router_check(r), KVP_OK);
    zmq_close(dealer);
    kvp_cache_free(c);
    kvp_publisher_free(pub);
    kvp_router_free(r);
    zmq_ctx_term(ctx);
}

Test(tiers_router, cpu_blocks_score_with_the_cpu_weight)
{
    run(true);
}

Test(tiers_router, unnamed_tiers_are_not_published)
{
    run(false);
}
