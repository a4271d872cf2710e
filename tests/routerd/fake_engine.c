/*
 * fake_engine.c - a stand-in engine for tests/routerd/test_routerd.py: a kvp_cache whose events a
 * kvp_publisher publishes (vLLM's KV-event protocol), driven by commands on stdin so that
 * the test controls every batch.
 *
 *   fake_engine PUB_ENDPOINT REPLAY_ENDPOINT TOPIC PROFILE [SEED]
 *
 * SEED, the engine's own hash seed: for vllm-* the NONE_HASH seed string (vLLM without
 * PYTHONHASHSEED draws a random one per process: pass a random string), for xxh3 a decimal
 * 64-bit seed, for keyed and siphash the key as 32..64 hex digits. Default: the profile's
 * (vLLM's "vllm-none-hash", seed 0, a random key).
 *
 * Wiring. The publisher's PUB socket is bound on an inproc endpoint; this program
 * subscribes to it and forwards every message, unchanged, to an XPUB socket bound on
 * PUB_ENDPOINT, the one subscribers see. The forwarder is what lets `drop-next` lose a
 * batch on the wire while it keeps its sequence number and stays in the publisher's
 * replay buffer (REPLAY_ENDPOINT, served by the publisher's thread), as a batch lost to a
 * full high-water mark would; the XPUB lets `wait-sub` see a subscriber's subscription
 * arrive, so the test never publishes into ZeroMQ's slow-joiner window.
 *
 * Cache: block size 16, 64 blocks, the vLLM hash profile PROFILE, plain namespace.
 * Commands (one per line; each answers one line, "ERROR ..." on failure):
 *   access T1 T2 ...  kvp_access the tokens, flush     -> "OK <batches sent> <next seq>"
 *   lookup T1 T2 ...  kvp_lookup                        -> "HIT <cached blocks>"
 *   flush             kvp_publisher_flush               -> "OK <batches sent> <next seq>"
 *   drop-next         the next batch is not forwarded   -> "OK"
 *   restart           a new cache and publisher in this process (sequence back to 0)
 *   junk              garbage messages on the XPUB      -> "OK"
 *   wait-sub MS       wait for a subscription           -> "SUBSCRIBED" or "TIMEOUT"
 *   quit              exit 0
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "kvprefix_events.h"

#define INPROC "inproc://fake-engine"

/* The engine. */
typedef struct fe {
    void *ctx;          /* ZeroMQ context shared with the publisher */
    void *in;           /* SUB on the publisher's inproc PUB */
    void *out;          /* XPUB subscribers connect to */
    kvp_publisher *pub; /* the publisher */
    kvp_cache *cache;   /* its cache */
    const char *replay; /* replay endpoint */
    const char *topic;  /* topic of every message */
    int profile;        /* hash profile */
    const char *seed;   /* SEED as given, or NULL */
    bool drop_next;     /* do not forward the next batch */
    bool subscribed;    /* a subscription arrived on out */
} fe;

static void die(const char *what, int rc)
{
    printf("ERROR %s: %s\n", what, rc ? kvp_strerror(rc) : zmq_strerror(zmq_errno()));
    fflush(stdout);
    exit(1);
}

/* Create the publisher (retrying the replay bind while a previous one is released) and a
 * cache attached to it. */
static void fe_open(fe *e)
{
    kvp_publisher_config pc;
    kvp_publisher_config_init(&pc);
    pc.endpoint = INPROC;
    pc.replay_endpoint = e->replay;
    pc.topic = e->topic;
    pc.buffer_steps = 256;
    pc.replay_thread = true;
    pc.zmq_context = e->ctx;
    int rc = KVP_EIO;
    for (int i = 0; i < 100 && rc == KVP_EIO; i++) {
        rc = kvp_publisher_new(&pc, &e->pub);
        if (rc == KVP_EIO) {
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    if (rc != KVP_OK)
        die("kvp_publisher_new", rc);
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = 64;
    cfg.block_size = 16;
    cfg.hash_profile = e->profile;
    if (e->seed && (e->profile == KVP_HASH_VLLM_SHA256 || e->profile == KVP_HASH_VLLM_XXHASH)) {
        cfg.vllm_seed = e->seed;
    } else if (e->seed && e->profile == KVP_HASH_XXH3) {
        cfg.seed = strtoull(e->seed, NULL, 10);
    } else if (e->seed) {
        size_t n = strlen(e->seed) / 2;
        if (n < KVP_HASH_KEY_MIN || n > KVP_HASH_KEY_MAX)
            die("SEED: a key of 32..64 hex digits", KVP_EINVAL);
        for (size_t i = 0; i < n; i++) {
            unsigned v = 0;
            if (sscanf(e->seed + 2 * i, "%2x", &v) != 1)
                die("SEED: not hex", KVP_EINVAL);
            cfg.hash_key[i] = (uint8_t)v;
        }
        cfg.hash_key_len = (uint32_t)n;
    }
    if ((rc = kvp_publisher_attach(e->pub, &cfg)) || (rc = kvp_cache_new(&cfg, &e->cache)))
        die("kvp_cache_new", rc);
    e->in = zmq_socket(e->ctx, ZMQ_SUB);
    int zero = 0;
    if (e->in == NULL || zmq_setsockopt(e->in, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_setsockopt(e->in, ZMQ_SUBSCRIBE, "", 0) || zmq_connect(e->in, INPROC))
        die("inproc SUB", 0);
}

static void fe_close(fe *e)
{
    kvp_cache_free(e->cache);
    kvp_publisher_free(e->pub);
    zmq_close(e->in);
}

/* Note the subscriptions waiting on out (wait up to ms for the first one). */
static void fe_read_subs(fe *e, long ms)
{
    zmq_pollitem_t it = {.socket = e->out, .events = ZMQ_POLLIN};
    while (zmq_poll(&it, 1, e->subscribed ? 0 : ms) > 0) {
        char buf[512];
        int n = zmq_recv(e->out, buf, sizeof buf, ZMQ_DONTWAIT);
        if (n > 0 && buf[0] == 1)
            e->subscribed = true;
        if (e->subscribed)
            ms = 0;
    }
}

/* Forward n_batches messages from the publisher to out (one dropped if asked). */
static void fe_forward(fe *e, uint64_t n_batches)
{
    for (uint64_t k = 0; k < n_batches; k++) {
        bool drop = e->drop_next;
        e->drop_next = false;
        for (int more = 1; more;) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            zmq_pollitem_t it = {.socket = e->in, .events = ZMQ_POLLIN};
            if (zmq_poll(&it, 1, 5000) <= 0 || zmq_msg_recv(&m, e->in, 0) < 0)
                die("forward: no batch from the publisher", 0);
            more = zmq_msg_more(&m);
            if (drop)
                zmq_msg_close(&m);
            else if (zmq_msg_send(&m, e->out, more ? ZMQ_SNDMORE : 0) < 0)
                die("forward", 0);
        }
    }
}

/* Flush the publisher and forward what it sent. */
static void fe_flush(fe *e)
{
    kvp_publisher_stats a, b;
    kvp_publisher_stats_get(e->pub, &a);
    int rc = kvp_publisher_flush(e->pub);
    if (rc != KVP_OK)
        die("kvp_publisher_flush", rc);
    kvp_publisher_stats_get(e->pub, &b);
    fe_forward(e, b.n_batches - a.n_batches);
    printf("OK %llu %llu\n", (unsigned long long)(b.n_batches - a.n_batches),
           (unsigned long long)b.next_seq);
}

/* Parse the token ids after a command. Returns the count (at most cap). */
static size_t fe_tokens(char *s, uint32_t *t, size_t cap)
{
    size_t n = 0;
    for (char *tok = strtok(s, " \t\n"); tok && n < cap; tok = strtok(NULL, " \t\n"))
        t[n++] = (uint32_t)strtoul(tok, NULL, 10);
    return n;
}

/* Garbage on the wire: a 1-frame message, a short sequence frame, a payload that is not
 * msgpack, one that is msgpack but not a batch, 4 frames. */
static void fe_junk(fe *e)
{
    static const uint8_t seq[8] = {0, 0, 0, 0, 0, 0, 0, 9};
    const char *t = e->topic;
    zmq_send(e->out, t, strlen(t), 0);
    zmq_send(e->out, t, strlen(t), ZMQ_SNDMORE);
    zmq_send(e->out, "abc", 3, ZMQ_SNDMORE);
    zmq_send(e->out, "\x93", 1, 0);
    zmq_send(e->out, t, strlen(t), ZMQ_SNDMORE);
    zmq_send(e->out, seq, 8, ZMQ_SNDMORE);
    zmq_send(e->out, "\xc1\xc1\xc1", 3, 0);
    zmq_send(e->out, t, strlen(t), ZMQ_SNDMORE);
    zmq_send(e->out, seq, 8, ZMQ_SNDMORE);
    zmq_send(e->out, "\x05", 1, 0);
    zmq_send(e->out, t, strlen(t), ZMQ_SNDMORE);
    zmq_send(e->out, seq, 8, ZMQ_SNDMORE);
    zmq_send(e->out, "\x90", 1, ZMQ_SNDMORE);
    zmq_send(e->out, "x", 1, 0);
    printf("OK\n");
}

/* Run one command line. Returns false on quit. */
static bool fe_command(fe *e, char *line)
{
    uint32_t t[4096];
    fe_read_subs(e, 0);
    if (strncmp(line, "access", 6) == 0) {
        kvp_namespace ns;
        kvp_namespace_init(&ns);
        kvp_match m;
        size_t n = fe_tokens(line + 6, t, 4096);
        int rc = kvp_access(e->cache, &ns, t, n, &m);
        if (rc != KVP_OK)
            die("kvp_access", rc);
        fe_flush(e);
    } else if (strncmp(line, "lookup", 6) == 0) {
        kvp_namespace ns;
        kvp_namespace_init(&ns);
        kvp_match m;
        size_t n = fe_tokens(line + 6, t, 4096);
        int rc = kvp_lookup(e->cache, &ns, t, n, NULL, 0, &m);
        if (rc != KVP_OK)
            die("kvp_lookup", rc);
        printf("HIT %u\n", m.n_blocks_cached);
    } else if (strncmp(line, "flush", 5) == 0) {
        fe_flush(e);
    } else if (strncmp(line, "drop-next", 9) == 0) {
        e->drop_next = true;
        printf("OK\n");
    } else if (strncmp(line, "restart", 7) == 0) {
        fe_close(e);
        fe_open(e);
        printf("OK\n");
    } else if (strncmp(line, "junk", 4) == 0) {
        fe_junk(e);
    } else if (strncmp(line, "wait-sub", 8) == 0) {
        fe_read_subs(e, strtol(line + 8, NULL, 10));
        printf(e->subscribed ? "SUBSCRIBED\n" : "TIMEOUT\n");
    } else if (strncmp(line, "quit", 4) == 0) {
        return false;
    } else {
        printf("ERROR unknown command\n");
    }
    fflush(stdout);
    return true;
}

int main(int argc, char **argv)
{
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: %s PUB_ENDPOINT REPLAY_ENDPOINT TOPIC PROFILE [SEED]\n", argv[0]);
        return 2;
    }
    fe e = {.replay = argv[2], .topic = argv[3], .seed = argc == 6 ? argv[5] : NULL};
    int rc = kvp_hash_profile_parse(argv[4], &e.profile);
    if (rc != KVP_OK)
        die("profile", rc);
    e.ctx = zmq_ctx_new();
    int zero = 0;
    e.out = zmq_socket(e.ctx, ZMQ_XPUB);
    int one = 1; /* dual-stack: PUB_ENDPOINT may be tcp://[ADDR]:PORT */
    if (e.out == NULL || zmq_setsockopt(e.out, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_setsockopt(e.out, ZMQ_IPV6, &one, sizeof one) || zmq_bind(e.out, argv[1]))
        die("XPUB bind", 0);
    fe_open(&e);
    printf("READY\n");
    fflush(stdout);
    char line[65536];
    while (fgets(line, sizeof line, stdin) && fe_command(&e, line))
        ;
    fe_close(&e);
    zmq_close(e.out);
    zmq_ctx_term(e.ctx);
    return 0;
}
