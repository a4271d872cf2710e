/*
 * publisher_threads.c - a publisher under concurrent use, for the sanitizer builds (ASan,
 * and TSan through the 'threads' suite).
 *
 * Four threads run kvp_access on one thread-safe cache (small pool: stores and evictions
 * interleave) whose events feed one publisher (batch_max_events 7, replay served by its
 * thread); a fifth thread calls kvp_publisher_flush in a loop and a sixth asks the replay
 * socket for old batches. The main thread subscribes and decodes every message. At the end:
 * every sequence number from 0 arrived once and in order, every payload decodes, the blocks
 * and clears in them add up to exactly the cache events the publisher took in, the
 * publisher's invariants hold, and the replay answers ended with the end marker.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "events/publisher.h"
#include "kvprefix_events.h"

#define N_WORKERS 4
#define N_ACCESS  6000

static kvp_cache *cache;
static kvp_publisher *pub;
static void *ctx;
static atomic_int workers_left;
static atomic_int n_replays_ok;

/* libzmq is not built with ThreadSanitizer: the copies it makes of a message in the sending
 * thread and in the receiving one are ordered by its own lock-free queues, which TSan cannot
 * see, so it would report them as races. Calls from libzmq are left out; every access of
 * kvprefix's own code is still checked. Read by TSan only. */
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void)
{
    return "called_from_lib:libzmq.so.5\n";
}

static void fail(const char *what)
{
    fprintf(stderr, "publisher_threads: FAILED: %s\n", what);
    exit(1);
}

static void *worker(void *arg)
{
    uint64_t st = (uint64_t)(uintptr_t)arg * 7919u + 1;
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    ns.model = kvp_field_str("m");
    for (int i = 0; i < N_ACCESS; i++) {
        st = st * 6364136223846793005u + 1442695040888963407u;
        uint32_t t[65];
        uint32_t base = (uint32_t)(st >> 40) % 64u * 16u;
        for (int k = 0; k < 65; k++)
            t[k] = base + (uint32_t)k;
        kvp_match m;
        if (kvp_access(cache, &ns, t, 1 + (st >> 20) % 65, &m) != KVP_OK)
            fail("kvp_access");
    }
    atomic_fetch_sub(&workers_left, 1);
    return NULL;
}

static void *flusher(void *arg)
{
    (void)arg;
    while (atomic_load(&workers_left) > 0) {
        int rc = kvp_publisher_flush(pub);
        if (rc != KVP_OK)
            fail(kvp_strerror(rc));
    }
    return NULL;
}

static void *replayer(void *arg)
{
    const char *ep = arg;
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(d, ep) != 0)
        fail("dealer connect");
    while (atomic_load(&workers_left) > 0) {
        uint8_t start[8] = {0};
        zmq_send(d, "", 0, ZMQ_SNDMORE);
        zmq_send(d, start, 8, 0);
        for (;;) {
            zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
            if (zmq_poll(&it, 1, 5000) != 1)
                fail("no replay answer");
            uint8_t f[3][16];
            int n[3] = {0, 0, 0}, more = 1, k = 0;
            while (more) {
                int got = zmq_recv(d, f[k < 3 ? k : 2], 16, 0);
                if (k < 3)
                    n[k] = got;
                k++;
                size_t sz = sizeof more;
                zmq_getsockopt(d, ZMQ_RCVMORE, &more, &sz);
            }
            if (k != 3 || n[1] != 8)
                fail("replay answer shape");
            if (memcmp(f[1], "\xff\xff\xff\xff\xff\xff\xff\xff", 8) == 0)
                break;
        }
        atomic_fetch_add(&n_replays_ok, 1);
    }
    zmq_close(d);
    return NULL;
}

/* Receive and check one message; returns false on timeout. */
static bool receive(void *sub, uint64_t *next_seq, uint64_t *n_units, uint8_t *buf, size_t cap)
{
    zmq_pollitem_t it = {sub, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 200) != 1)
        return false;
    uint8_t seq[8];
    if (zmq_recv(sub, buf, cap, 0) < 0 || zmq_recv(sub, seq, 8, 0) != 8)
        fail("frames");
    int n = zmq_recv(sub, buf, cap, 0);
    if (n < 0 || (size_t)n > cap)
        fail("payload frame");
    uint64_t s = 0;
    for (int i = 0; i < 8; i++)
        s = s << 8 | seq[i];
    if (s != *next_seq)
        fail("sequence numbers are not consecutive");
    (*next_seq)++;
    kvp_kv_batch *b = NULL;
    if (kvp_kv_decode(buf, (size_t)n, &b) != KVP_OK)
        fail("payload does not decode");
    for (size_t i = 0; i < b->n_events; i++)
        *n_units += b->events[i].type == KVP_EVENT_CLEARED ? 1 : b->events[i].n_hashes;
    kvp_kv_batch_free(b);
    return true;
}

int main(void)
{
    ctx = zmq_ctx_new();
    kvp_publisher_config pc;
    kvp_publisher_config_init(&pc);
    pc.endpoint = "inproc://threads";
    pc.replay_endpoint = "inproc://threads-replay";
    pc.replay_thread = true;
    pc.buffer_steps = 32;
    pc.batch_max_events = 7;
    pc.hwm = 0; /* no drops: every message must arrive */
    pc.zmq_context = ctx;
    if (kvp_publisher_new(&pc, &pub) != KVP_OK)
        fail("kvp_publisher_new");
    void *sub = zmq_socket(ctx, ZMQ_SUB);
    int hwm = 0;
    zmq_setsockopt(sub, ZMQ_RCVHWM, &hwm, sizeof hwm);
    if (zmq_connect(sub, pc.endpoint) != 0 || zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0) != 0)
        fail("subscribe");
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = 96;
    cfg.hash_profile = KVP_HASH_XXH3;
    (void)kvp_publisher_attach(pub, &cfg);
    if (kvp_cache_new(&cfg, &cache) != KVP_OK)
        fail("kvp_cache_new");

    atomic_init(&workers_left, N_WORKERS);
    atomic_init(&n_replays_ok, 0);
    pthread_t th[N_WORKERS + 2];
    for (uintptr_t i = 0; i < N_WORKERS; i++)
        pthread_create(&th[i], NULL, worker, (void *)i);
    pthread_create(&th[N_WORKERS], NULL, flusher, NULL);
    pthread_create(&th[N_WORKERS + 1], NULL, replayer, (void *)pc.replay_endpoint);

    static uint8_t buf[1 << 20];
    uint64_t next = 0, units = 0;
    while (atomic_load(&workers_left) > 0)
        (void)receive(sub, &next, &units, buf, sizeof buf);
    for (int i = 0; i < N_WORKERS + 2; i++)
        pthread_join(th[i], NULL);
    if (kvp_cache_reset(cache) != KVP_OK || kvp_publisher_flush(pub) != KVP_OK)
        fail("reset and flush");
    while (receive(sub, &next, &units, buf, sizeof buf))
        ;
    kvp_publisher_stats st;
    (void)kvp_publisher_stats_get(pub, &st);
    if (next != st.next_seq)
        fail("not every batch arrived");
    if (units != st.n_cache_events || st.n_dropped != 0)
        fail("the batches do not add up to the cache events");
    if (kvp__publisher_check(pub) != KVP_OK)
        fail("kvp__publisher_check");
    printf("publisher_threads: ok: %llu batches, %llu cache events, %d replays\n",
           (unsigned long long)next, (unsigned long long)units, atomic_load(&n_replays_ok));
    kvp_cache_free(cache);
    kvp_publisher_free(pub);
    zmq_close(sub);
    zmq_ctx_term(ctx);
    return 0;
}
