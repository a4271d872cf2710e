/*
 * test_publisher.c - the ZeroMQ publisher (kvp_publisher_*), through real sockets.
 *
 * A SUB socket in the test receives what a kvp_cache with an attached publisher does:
 * with the vllm-sha256-cbor and vllm-xxhash-cbor profiles the block hashes equal the golden
 * event integers of docs/test-vectors.md's vLLM rows (plain, LoRA, salt, both; parents
 * chained across commits); messages are [topic, seq from 0 big-endian, payload] in the
 * configured form with the dp rank; evictions, resets and the _ids forms map to
 * BlockRemoved, AllBlocksCleared and empty token_ids; batch_max_events publishes by
 * itself; the replay ROUTER answers a DEALER from a bounded buffer with the end marker,
 * driven by kvp_publisher_poll or by the internal thread, and ignores malformed requests;
 * endpoints bind or connect and shift by dp rank as vLLM's do; the high-water mark is set;
 * bad configurations fail cleanly; lost events leave a sequence gap; the invariant checker
 * catches each kind of corruption.
 */
#include <string.h>
#include <time.h>

#include <criterion/criterion.h>
#include <zmq.h>

#include "events/publisher.h"
#include "kvprefix_events.h"
#include "testutil.h"

/* ---------------------------------------------------------------------------------------- */
/* Helpers                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* A publisher on inproc://name in ctx, with a SUB socket subscribed to everything. */
typedef struct rig {
    void *ctx;          /* the test's context, shared with the publisher */
    void *sub;          /* subscriber */
    kvp_publisher *pub; /* the publisher */
    kvp_cache *cache;   /* a cache publishing through it, or NULL */
} rig;

static void rig_open(rig *r, kvp_publisher_config *pc, const char *name)
{
    char ep[128];
    snprintf(ep, sizeof ep, "inproc://%s", name);
    r->ctx = zmq_ctx_new();
    cr_assert_not_null(r->ctx);
    pc->endpoint = ep;
    pc->zmq_context = r->ctx;
    int rc = kvp_publisher_new(pc, &r->pub);
    cr_assert_eq(rc, KVP_OK, "kvp_publisher_new: %s", kvp_strerror(rc));
    r->sub = zmq_socket(r->ctx, ZMQ_SUB);
    cr_assert_eq(zmq_connect(r->sub, ep), 0);
    cr_assert_eq(zmq_setsockopt(r->sub, ZMQ_SUBSCRIBE, "", 0), 0);
    struct timespec pause = {0, 20000000};
    nanosleep(&pause, NULL); /* let the subscription reach the PUB socket */
    r->cache = NULL;
}

/* A cache of n_blocks blocks of 16 tokens with hash profile, publishing through r->pub. */
static void rig_cache(rig *r, uint32_t n_blocks, int profile, const char *seed)
{
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = n_blocks;
    cfg.block_size = 16;
    cfg.hash_profile = profile;
    cfg.vllm_seed = seed;
    cr_assert_eq(kvp_publisher_attach(r->pub, &cfg), KVP_OK);
    r->cache = th_cache_new(&cfg);
}

static void rig_close(rig *r)
{
    kvp_cache_free(r->cache);
    cr_assert_eq(kvp__publisher_check(r->pub), KVP_OK);
    kvp_publisher_free(r->pub);
    zmq_close(r->sub);
    zmq_ctx_term(r->ctx);
}

/* One received message. */
typedef struct msg {
    char topic[128]; /* frame 1, NUL-terminated */
    uint64_t seq;    /* frame 2 */
    uint8_t payload[65536];
    size_t len;   /* frame 3's bytes */
    int n_frames; /* frames in the message */
} msg;

static uint64_t load_be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* Receive one multipart message from sock within 2 s (frames after the third are counted
 * and dropped), or fail the test. The first frame is the topic (PUB) or empty (DEALER). */
static void recv_msg(void *sock, msg *m)
{
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    cr_assert_eq(zmq_poll(&it, 1, 2000), 1, "no message within 2 s");
    memset(m->topic, 0, sizeof m->topic);
    m->n_frames = 0;
    int more = 1;
    while (more) {
        uint8_t buf[65536];
        int n = zmq_recv(sock, buf, sizeof buf, 0);
        cr_assert_geq(n, 0, "zmq_recv: %s", zmq_strerror(zmq_errno()));
        cr_assert_leq((size_t)n, sizeof buf, "frame truncated");
        if (m->n_frames == 0)
            memcpy(m->topic, buf, (size_t)n < sizeof m->topic - 1 ? (size_t)n : 0);
        if (m->n_frames == 1) {
            cr_assert_eq(n, 8, "the sequence frame has %d bytes", n);
            m->seq = load_be64(buf);
        }
        if (m->n_frames == 2) {
            memcpy(m->payload, buf, (size_t)n);
            m->len = (size_t)n;
        }
        m->n_frames++;
        size_t sz = sizeof more;
        zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz);
    }
}

/* Receive a batch message and decode its payload (freed by the caller). */
static kvp_kv_batch *recv_batch(rig *r, msg *m, uint64_t want_seq)
{
    recv_msg(r->sub, m);
    cr_assert_eq(m->n_frames, 3, "a message has %d frames", m->n_frames);
    cr_assert_eq(m->seq, want_seq, "seq %llu, expected %llu", (unsigned long long)m->seq,
                 (unsigned long long)want_seq);
    kvp_kv_batch *b = NULL;
    int rc = kvp_kv_decode(m->payload, m->len, &b);
    cr_assert_eq(rc, KVP_OK, "the payload does not decode: %s", kvp_strerror(rc));
    return b;
}

static bool nothing_waiting(void *sock)
{
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    return zmq_poll(&it, 1, 50) == 0;
}

static void seq_tokens(uint32_t *t, size_t n, uint32_t from)
{
    for (size_t i = 0; i < n; i++)
        t[i] = from + (uint32_t)i;
}

/* ---------------------------------------------------------------------------------------- */
/* The golden vLLM hashes on the wire                                                       */
/* ---------------------------------------------------------------------------------------- */

/* One row set of docs/test-vectors.md's vLLM table for a profile and seed string. */
typedef struct golden {
    int profile;
    const char *seed;
    uint64_t b0, b1;       /* block 0 and 1 of tokens 0..31, no extra keys */
    uint64_t salt_b0;      /* block 0, cache_salt "tenant-a" */
    uint64_t lora_salt_b0; /* block 0, LoRA "my-lora" and salt "tenant-a" */
    uint64_t lora_b0;      /* block 0, LoRA "my-lora" */
} golden;

static const golden goldens[] = {
    {KVP_HASH_VLLM_SHA256, "vllm-none-hash", UINT64_C(2233398808101521225),
     UINT64_C(17911472383915781900), UINT64_C(10721593076989655162), UINT64_C(14015761767082768237),
     UINT64_C(4419866080380130645)},
    {KVP_HASH_VLLM_SHA256, "0", UINT64_C(12687895063098490012), UINT64_C(1814341696565857452),
     UINT64_C(8020952614053081591), UINT64_C(14149053605448078159), UINT64_C(14363917845617146483)},
    {KVP_HASH_VLLM_XXHASH, "vllm-none-hash", UINT64_C(11534027033812148684),
     UINT64_C(206661239557022900), UINT64_C(12414837160817709242), UINT64_C(766334679991072576),
     UINT64_C(17831428689171471482)},
    {KVP_HASH_VLLM_XXHASH, "0", UINT64_C(4168120356241826254), UINT64_C(9934807162112882475),
     UINT64_C(14094106573164651161), UINT64_C(6250510208370285180), UINT64_C(1800048193177735191)},
};

/* What one BlockStored said. */
typedef struct stored {
    uint64_t h[4];   /* its first hashes */
    size_t n;        /* how many it has */
    bool has_parent; /* parent_block_hash not nil */
    uint64_t parent; /* the parent when has_parent */
} stored;

/* Store tokens 0 .. 16 * n_blocks - 1 (plus one token, so every block is a full prompt
 * block) under ns, publish, and return the batch's single BlockStored. */
static stored store_and_receive(rig *r, const kvp_namespace *ns, size_t n_blocks, uint64_t seq)
{
    uint32_t t[16 * 4 + 1];
    seq_tokens(t, 16 * n_blocks + 1, 0);
    kvp_match m;
    cr_assert_eq(kvp_access(r->cache, ns, t, 16 * n_blocks + 1, &m), KVP_OK);
    cr_assert_eq(kvp_publisher_flush(r->pub), KVP_OK);
    msg *mm = malloc(sizeof *mm);
    kvp_kv_batch *b = recv_batch(r, mm, seq);
    cr_assert_eq(b->n_events, 1, "one BlockStored per access");
    const kvp_kv_event *e = &b->events[0];
    cr_assert_eq(e->type, KVP_EVENT_STORED);
    cr_assert_eq(e->block_size, 16);
    stored out = {{0}, e->n_hashes, e->has_parent, e->parent};
    for (size_t i = 0; i < e->n_hashes && i < 4; i++)
        out.h[i] = e->hashes[i];
    cr_assert_eq(e->n_tokens, e->n_hashes * 16, "token_ids hold every stored block");
    for (size_t i = 0; i < e->n_tokens; i++)
        cr_assert_eq(e->tokens[i], t[16 * (n_blocks - e->n_hashes) + i]);
    kvp_kv_batch_free(b);
    free(mm);
    return out;
}

Test(publisher, golden_vllm_hashes_on_the_wire)
{
    for (size_t g = 0; g < sizeof goldens / sizeof goldens[0]; g++) {
        const golden *gv = &goldens[g];
        rig r;
        kvp_publisher_config pc;
        kvp_publisher_config_init(&pc);
        char name[32];
        snprintf(name, sizeof name, "golden-%zu", g);
        rig_open(&r, &pc, name);
        rig_cache(&r, 64, gv->profile, gv->seed);
        kvp_namespace ns;
        th_ns(&ns, NULL, NULL, NULL, NULL);
        stored st = store_and_receive(&r, &ns, 2, 0);
        cr_assert_eq(st.n, 2, "%s: two hashes", gv->seed);
        cr_assert_eq(st.h[0], gv->b0, "row %zu: block 0 is %llu", g, (unsigned long long)st.h[0]);
        cr_assert_eq(st.h[1], gv->b1, "row %zu: block 1 is %llu", g, (unsigned long long)st.h[1]);
        cr_assert_not(st.has_parent, "the first block's parent is nil");
        /* A longer prompt stores block 2 alone, its parent block 1. */
        st = store_and_receive(&r, &ns, 3, 1);
        cr_assert_eq(st.n, 1, "only block 2 is new");
        cr_assert(st.has_parent);
        cr_assert_eq(st.parent, gv->b1, "block 2's parent is block 1's hash");
        /* Salt, LoRA and both: block 0's extra keys. */
        const char *adapters[3] = {NULL, "my-lora", "my-lora"};
        const char *salts[3] = {"tenant-a", "tenant-a", NULL};
        uint64_t want[3] = {gv->salt_b0, gv->lora_salt_b0, gv->lora_b0};
        for (int k = 0; k < 3; k++) {
            th_ns(&ns, NULL, adapters[k], NULL, salts[k]);
            st = store_and_receive(&r, &ns, 1, 2 + (uint64_t)k);
            cr_assert_eq(st.h[0], want[k], "row %zu, case %d: %llu", g, k,
                         (unsigned long long)st.h[0]);
            cr_assert_not(st.has_parent);
        }
        rig_close(&r);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Messages, forms, events                                                                  */
/* ---------------------------------------------------------------------------------------- */

Test(publisher, topic_seq_dp_rank_and_forms)
{
    static const int forms[3] = {KVP_KV_FORM_ARRAY, KVP_KV_FORM_MAP,
                                 KVP_KV_FORM_MAP | KVP_KV_BATCH_MAP};
    static const uint8_t first_event_byte[3] = {0x98, 0x88, 0x88};
    for (int f = 0; f < 3; f++) {
        rig r;
        kvp_publisher_config pc;
        kvp_publisher_config_init(&pc);
        pc.topic = "kv@pod-a@Qwen/Qwen3-8B";
        pc.form = forms[f];
        pc.dp_rank = 0;
        pc.medium = "CPU";
        pc.lora_name = "my-lora";
        char name[32];
        snprintf(name, sizeof name, "forms-%d", f);
        rig_open(&r, &pc, name);
        rig_cache(&r, 64, KVP_HASH_XXH3, NULL);
        kvp_namespace ns;
        th_ns(&ns, "m", NULL, NULL, NULL);
        for (uint64_t s = 0; s < 3; s++) {
            uint32_t t[17];
            seq_tokens(t, 17, 100 * (uint32_t)s);
            kvp_match m;
            cr_assert_eq(kvp_access(r.cache, &ns, t, 17, &m), KVP_OK);
            cr_assert_eq(kvp_publisher_flush(r.pub), KVP_OK);
            msg *mm = malloc(sizeof *mm);
            kvp_kv_batch *b = recv_batch(&r, mm, s);
            cr_assert_str_eq(mm->topic, "kv@pod-a@Qwen/Qwen3-8B");
            cr_assert_eq(mm->payload[0], forms[f] & KVP_KV_BATCH_MAP ? 0x83 : 0x93);
            cr_assert(memchr(mm->payload, first_event_byte[f], mm->len) != NULL);
            cr_assert(b->has_dp_rank);
            cr_assert_eq(b->dp_rank, 0);
            cr_assert_str_eq(b->events[0].medium, "CPU");
            cr_assert_str_eq(b->events[0].lora_name, "my-lora");
            cr_assert_eq(b->events[0].group_idx, -1);
            kvp_kv_batch_free(b);
            free(mm);
        }
        /* An empty flush publishes nothing. */
        cr_assert_eq(kvp_publisher_flush(r.pub), KVP_OK);
        cr_assert(nothing_waiting(r.sub));
        kvp_publisher_stats st;
        cr_assert_eq(kvp_publisher_stats_get(r.pub, &st), KVP_OK);
        cr_assert_eq(st.next_seq, 3);
        cr_assert_eq(st.n_batches, 3);
        cr_assert_eq(st.n_cache_events, 3);
        cr_assert_eq(st.n_events, 3);
        rig_close(&r);
    }
}

/* Evictions become BlockRemoved (merged), a reset BlockRemoved then AllBlocksCleared; the
 * _ids forms give no tokens; a chain interrupted by a removal continues with its parent. */
Test(publisher, removed_cleared_and_no_tokens)
{
    rig r;
    kvp_publisher_config pc;
    kvp_publisher_config_init(&pc);
    pc.group_idx = 0;
    rig_open(&r, &pc, "removed");
    rig_cache(&r, 2, KVP_HASH_VLLM_SHA256, NULL);
    kvp_namespace ns;
    th_ns(&ns, NULL, NULL, NULL, NULL);
    uint32_t a[33], b[33];
    seq_tokens(a, 33, 0);
    seq_tokens(b, 33, 1000);
    kvp_match m;
    cr_assert_eq(kvp_access(r.cache, &ns, a, 33, &m), KVP_OK);
    cr_assert_eq(kvp_access(r.cache, &ns, b, 33, &m), KVP_OK); /* evicts a's two blocks */
    cr_assert_eq(kvp_publisher_flush(r.pub), KVP_OK);
    msg *mm = malloc(sizeof *mm);
    kvp_kv_batch *bt = recv_batch(&r, mm, 0);
    /* Each of b's blocks evicts one of a's first: stored(a0 a1), removed(a), stored(b0),
     * removed(a), stored(b1, parent b0). */
    static const int types[5] = {KVP_EVENT_STORED, KVP_EVENT_REMOVED, KVP_EVENT_STORED,
                                 KVP_EVENT_REMOVED, KVP_EVENT_STORED};
    cr_assert_eq(bt->n_events, 5);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(bt->events[i].type, types[i], "event %d", i);
        cr_assert_eq(bt->events[i].group_idx, 0);
        cr_assert_str_eq(bt->events[i].medium, "GPU");
    }
    const kvp_kv_event *e = bt->events;
    cr_assert_eq(e[0].n_hashes, 2);
    cr_assert(e[1].hashes[0] != e[3].hashes[0]);
    for (int i = 1; i <= 3; i += 2)
        cr_assert(e[i].hashes[0] == e[0].hashes[0] || e[i].hashes[0] == e[0].hashes[1],
                  "a removed hash is one that was stored");
    cr_assert_not(e[2].has_parent);
    cr_assert_eq(e[2].tokens[0], 1000);
    cr_assert(e[4].has_parent);
    cr_assert_eq(e[4].parent, e[2].hashes[0], "b's chain continues across the removal");
    cr_assert_eq(e[4].tokens[0], 1016);
    kvp_kv_batch_free(bt);

    cr_assert_eq(kvp_cache_reset(r.cache), KVP_OK);
    cr_assert_eq(kvp_publisher_flush(r.pub), KVP_OK);
    bt = recv_batch(&r, mm, 1);
    cr_assert_eq(bt->n_events, 2);
    cr_assert_eq(bt->events[0].type, KVP_EVENT_REMOVED);
    cr_assert_eq(bt->events[0].n_hashes, 2);
    cr_assert_eq(bt->events[1].type, KVP_EVENT_CLEARED);
    kvp_kv_batch_free(bt);

    kvp_key ids[2] = {{1, 2}, {3, 4}};
    cr_assert_eq(kvp_access_ids(r.cache, &ns, ids, 2, 32, &m), KVP_OK);
    cr_assert_eq(kvp_publisher_flush(r.pub), KVP_OK);
    bt = recv_batch(&r, mm, 2);
    cr_assert_eq(bt->n_events, 1);
    cr_assert_eq(bt->events[0].n_hashes, 2);
    cr_assert_eq(bt->events[0].n_tokens, 0, "no tokens for the _ids forms");
    cr_assert_eq(bt->events[0].block_size, 16);
    kvp_kv_batch_free(bt);
    free(mm);
    rig_close(&r);
}

Test(publisher, batch_max_events_publishes_by_itself)
{
    rig r;
    kvp_publisher_config pc;
    kvp_publisher_config_init(&pc);
    pc.batch_max_events = 2;
    rig_open(&r, &pc, "batchmax");
    rig_cache(&r, 64, KVP_HASH_VLLM_XXHASH, "0");
    kvp_namespace ns;
    th_ns(&ns, NULL, NULL, NULL, NULL);
    uint32_t t[16 * 5 + 1];
    seq_tokens(t, sizeof t / sizeof t[0], 0);
    kvp_match m;
    cr_assert_eq(kvp_access(r.cache, &ns, t, sizeof t / sizeof t[0], &m), KVP_OK);
    msg *mm = malloc(sizeof *mm);
    uint64_t prev_last = 0;
    for (uint64_t s = 0; s < 2; s++) {
        kvp_kv_batch *b = recv_batch(&r, mm, s);
        cr_assert_eq(b->n_events, 1);
        cr_assert_eq(b->events[0].n_hashes, 2, "batch %llu holds two blocks",
                     (unsigned long long)s);
        cr_assert_eq(b->events[0].has_parent, s > 0);
        if (s > 0)
            cr_assert_eq(b->events[0].parent, prev_last, "the chain continues across batches");
        prev_last = b->events[0].hashes[1];
        kvp_kv_batch_free(b);
    }
    cr_assert(nothing_waiting(r.sub), "the fifth block waits for a flush");
    kvp_publisher_stats st;
    cr_assert_eq(kvp_publisher_stats_get(r.pub, &st), KVP_OK);
    cr_assert_eq(st.n_pending, 1);
    cr_assert_eq(kvp__publisher_check(r.pub), KVP_OK);
    cr_assert_eq(kvp_publisher_flush(r.pub), KVP_OK);
    kvp_kv_batch *b = recv_batch(&r, mm, 2);
    cr_assert_eq(b->events[0].n_hashes, 1);
    cr_assert_eq(b->events[0].parent, prev_last);
    kvp_kv_batch_free(b);
    free(mm);
    rig_close(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* Replay                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Publish n single-block batches through r (tokens differ per batch). */
static void publish_n(rig *r, int n, msg *mm)
{
    kvp_namespace ns;
    th_ns(&ns, NULL, NULL, NULL, NULL);
    for (int i = 0; i < n; i++) {
        uint32_t t[17];
        seq_tokens(t, 17, 1000 * (uint32_t)i);
        kvp_match m;
        cr_assert_eq(kvp_access(r->cache, &ns, t, 17, &m), KVP_OK);
        cr_assert_eq(kvp_publisher_flush(r->pub), KVP_OK);
        kvp_kv_batch_free(recv_batch(r, mm, (uint64_t)i));
    }
}

/* Send [empty, start (8 bytes)] on the dealer, serve if poll, and check the answer: seqs
 * first .. last, each payload decodable with token first * 1000, then the end marker. */
static void replay_expect(rig *r, void *dealer, uint64_t start, bool poll, int first, int last,
                          msg *mm)
{
    uint8_t sb[8];
    for (int i = 7; i >= 0; i--, start >>= 8)
        sb[i] = (uint8_t)start;
    cr_assert_eq(zmq_send(dealer, "", 0, ZMQ_SNDMORE), 0);
    cr_assert_eq(zmq_send(dealer, sb, 8, 0), 8);
    if (poll)
        cr_assert_eq(kvp_publisher_poll(r->pub, 2000), KVP_OK);
    for (int s = first; s <= last; s++) {
        recv_msg(dealer, mm);
        cr_assert_eq(mm->n_frames, 3, "[empty, seq, payload]");
        cr_assert_eq(mm->topic[0], 0, "the first frame is empty");
        cr_assert_eq(mm->seq, (uint64_t)s);
        kvp_kv_batch *b = NULL;
        cr_assert_eq(kvp_kv_decode(mm->payload, mm->len, &b), KVP_OK);
        cr_assert_eq(b->events[0].tokens[0], 1000u * (uint32_t)s);
        kvp_kv_batch_free(b);
    }
    recv_msg(dealer, mm);
    cr_assert_eq(mm->n_frames, 3);
    cr_assert_eq(mm->seq, UINT64_MAX, "the end marker's sequence is ff x 8");
    cr_assert_eq(mm->len, 0, "the end marker's payload is empty");
}

static void replay_case(bool thread)
{
    rig r;
    kvp_publisher_config pc;
    kvp_publisher_config_init(&pc);
    pc.replay_endpoint = thread ? "inproc://replay-t" : "inproc://replay-p";
    pc.buffer_steps = 3;
    pc.replay_thread = thread;
    rig_open(&r, &pc, thread ? "replay-pub-t" : "replay-pub-p");
    rig_cache(&r, 64, KVP_HASH_VLLM_SHA256, NULL);
    msg *mm = malloc(sizeof *mm);
    publish_n(&r, 5, mm);
    void *dealer = zmq_socket(r.ctx, ZMQ_DEALER);
    cr_assert_eq(zmq_connect(dealer, pc.replay_endpoint), 0);
    replay_expect(&r, dealer, 0, !thread, 2, 4, mm);
    replay_expect(&r, dealer, 3, !thread, 3, 4, mm);
    replay_expect(&r, dealer, 10, !thread, 1, 0, mm);
    /* A malformed request gets no answer. */
    cr_assert_eq(zmq_send(dealer, "", 0, ZMQ_SNDMORE), 0);
    cr_assert_eq(zmq_send(dealer, "abc", 3, 0), 3);
    if (!thread)
        cr_assert_eq(kvp_publisher_poll(r.pub, 500), KVP_OK);
    cr_assert(nothing_waiting(dealer));
    kvp_publisher_stats st;
    cr_assert_eq(kvp_publisher_stats_get(r.pub, &st), KVP_OK);
    cr_assert_eq(st.n_replay_requests, 3);
    cr_assert_eq(st.n_replay_batches, 5);
    cr_assert_eq(st.n_bad_requests, 1);
    cr_assert_eq(st.n_buffered, 3);
    if (thread)
        cr_assert_eq(kvp_publisher_poll(r.pub, 0), KVP_EINVAL, "the thread serves");
    else
        cr_assert_eq(kvp_publisher_poll(r.pub, 0), KVP_OK, "nothing waiting");
    zmq_close(dealer);
    free(mm);
    rig_close(&r);
}

Test(publisher, replay_polled)
{
    replay_case(false);
}

Test(publisher, replay_thread)
{
    replay_case(true);
}

/* ---------------------------------------------------------------------------------------- */
/* Endpoints, options, errors                                                               */
/* ---------------------------------------------------------------------------------------- */

Test(publisher, endpoint_rules)
{
    cr_assert(kvp__endpoint_binds("tcp://*:5557"));
    cr_assert(kvp__endpoint_binds("tcp://[::]:5557"));
    cr_assert(kvp__endpoint_binds("ipc:///tmp/x"));
    cr_assert(kvp__endpoint_binds("inproc://x"));
    cr_assert_not(kvp__endpoint_binds("tcp://router.local:5557"));
    cr_assert_not(kvp__endpoint_binds("tcp://10.0.0.1:5557"));
    char out[64];
    static const struct {
        const char *ep;
        int64_t rank;
        int rc;
        const char *want;
    } cases[] = {
        {"tcp://*:5557", 0, KVP_OK, "tcp://*:5557"},
        {"tcp://*:5557", 2, KVP_OK, "tcp://*:5559"},
        {"tcp://host:5557", 1, KVP_OK, "tcp://host:5558"},
        {"tcp://127.0.0.1:*", 3, KVP_OK, "tcp://127.0.0.1:*"},
        {"inproc://cache", 1, KVP_OK, "inproc://cache_dp1"},
        {"ipc:///tmp/kv", 1, KVP_EINVAL, NULL},
        {"ipc:///tmp/kv", 0, KVP_OK, "ipc:///tmp/kv"},
        {"tcp://host:65535", 1, KVP_EINVAL, NULL},
        {"tcp://host:55x", 1, KVP_EINVAL, NULL},
        {"tcp://host", 1, KVP_EINVAL, NULL},
        {"tcp://*:5557", -1, KVP_EINVAL, NULL},
        {"tcp://*:5557", INT64_MAX, KVP_EINVAL, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = kvp__endpoint_for_rank(cases[i].ep, cases[i].rank, out, sizeof out);
        cr_assert_eq(rc, cases[i].rc, "%s rank %lld: %d", cases[i].ep, (long long)cases[i].rank,
                     rc);
        if (rc == KVP_OK)
            cr_assert_str_eq(out, cases[i].want);
    }
    cr_assert_eq(kvp__endpoint_for_rank("tcp://*:5557", 1, out, 5), KVP_ENOSPC);
}

/* A free TCP port on the loopback (bound then released). */
static int free_port(void *ctx)
{
    void *s = zmq_socket(ctx, ZMQ_PUB);
    cr_assert_eq(zmq_bind(s, "tcp://127.0.0.1:*"), 0);
    char ep[64];
    size_t n = sizeof ep;
    cr_assert_eq(zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &n), 0);
    zmq_close(s);
    return atoi(strrchr(ep, ':') + 1);
}

/* Over TCP with dp rank 1: the PUB binds port + 1 (as vLLM), a SUB on that port receives a
 * batch stamped with rank 1; the high-water mark is the configured one. */
Test(publisher, tcp_dp_rank_offset_and_hwm)
{
    void *ctx = zmq_ctx_new();
    int port = free_port(ctx);
    int rport = free_port(ctx);
    char ep[64], rep[64];
    snprintf(ep, sizeof ep, "tcp://*:%d", port - 1);
    snprintf(rep, sizeof rep, "tcp://*:%d", rport - 1);
    kvp_publisher_config pc;
    kvp_publisher_config_init(&pc);
    pc.endpoint = ep;
    pc.replay_endpoint = rep;
    pc.dp_rank = 1;
    pc.hwm = 1234;
    kvp_publisher *pub = NULL;
    int rc = KVP_EIO;
    for (int i = 0; i < 100 && rc == KVP_EIO; i++) { /* the probe's close is asynchronous */
        rc = kvp_publisher_new(&pc, &pub);
        struct timespec pause = {0, 10000000};
        if (rc == KVP_EIO)
            nanosleep(&pause, NULL);
    }
    cr_assert_eq(rc, KVP_OK, "%s", kvp_strerror(rc));
    char got[128];
    cr_assert_eq(kvp_publisher_endpoint(pub, 0, got, sizeof got), KVP_OK);
    cr_assert_eq(atoi(strrchr(got, ':') + 1), port, "bound at %s", got);
    cr_assert_eq(kvp_publisher_endpoint(pub, 1, got, sizeof got), KVP_OK);
    cr_assert_eq(atoi(strrchr(got, ':') + 1), rport, "replay bound at %s", got);
    cr_assert_eq(kvp_publisher_endpoint(pub, 1, got, 3), KVP_ENOSPC);
    cr_assert_eq(kvp_publisher_endpoint(pub, 2, got, sizeof got), KVP_EINVAL);
    int hwm = 0;
    size_t n = sizeof hwm;
    cr_assert_eq(zmq_getsockopt(pub->pub, ZMQ_SNDHWM, &hwm, &n), 0);
    cr_assert_eq(hwm, 1234);

    void *sub = zmq_socket(ctx, ZMQ_SUB);
    char conn[64];
    snprintf(conn, sizeof conn, "tcp://127.0.0.1:%d", port);
    cr_assert_eq(zmq_connect(sub, conn), 0);
    cr_assert_eq(zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0), 0);
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = 8;
    cfg.hash_profile = KVP_HASH_XXH3;
    cr_assert_eq(kvp_publisher_attach(pub, &cfg), KVP_OK);
    kvp_cache *c = th_cache_new(&cfg);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t t[17] = {0};
    kvp_match m;
    msg *mm = malloc(sizeof *mm);
    kvp_kv_batch *b = NULL;
    /* TCP subscriptions take a moment: publish until one arrives (replay covers the rest). */
    for (int attempt = 0; attempt < 100 && !b; attempt++) {
        t[0] = (uint32_t)attempt;
        cr_assert_eq(kvp_access(c, &ns, t, 17, &m), KVP_OK);
        cr_assert_eq(kvp_publisher_flush(pub), KVP_OK);
        zmq_pollitem_t it = {sub, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 50) == 1) {
            recv_msg(sub, mm);
            cr_assert_eq(kvp_kv_decode(mm->payload, mm->len, &b), KVP_OK);
        }
    }
    cr_assert_not_null(b, "nothing arrived over TCP");
    cr_assert_eq(b->dp_rank, 1);
    kvp_kv_batch_free(b);
    free(mm);
    kvp_cache_free(c);
    kvp_publisher_free(pub);
    zmq_close(sub);
    zmq_ctx_term(ctx);
}

Test(publisher, bad_configurations_fail_cleanly)
{
    kvp_publisher *pub = (kvp_publisher *)&pub, *sentinel = pub;
    kvp_publisher_config pc;
    kvp_publisher_config_init(&pc);
    pc.endpoint = "inproc://bad";
    cr_assert_eq(kvp_publisher_new(NULL, &pub), KVP_EINVAL);
    cr_assert_eq(kvp_publisher_new(&pc, NULL), KVP_EINVAL);
    kvp_publisher_config c = pc;
    c.endpoint = NULL;
    cr_assert_eq(kvp_publisher_new(&c, &pub), KVP_EINVAL);
    c = pc;
    c.form = 0;
    cr_assert_eq(kvp_publisher_new(&c, &pub), KVP_EINVAL);
    c = pc;
    c.hwm = -1;
    cr_assert_eq(kvp_publisher_new(&c, &pub), KVP_EINVAL);
    c = pc;
    c.replay_endpoint = "inproc://bad-r";
    c.buffer_steps = 0;
    cr_assert_eq(kvp_publisher_new(&c, &pub), KVP_EINVAL);
    c = pc;
    c.replay_thread = true;
    cr_assert_eq(kvp_publisher_new(&c, &pub), KVP_EINVAL, "a replay thread without replay");
    c = pc;
    c.dp_rank = 1;
    c.endpoint = "ipc:///tmp/kvprefix-bad";
    cr_assert_eq(kvp_publisher_new(&c, &pub), KVP_EINVAL, "ipc cannot shift by rank");
    c = pc;
    c.endpoint = "nonsense://x";
    cr_assert_eq(kvp_publisher_new(&c, &pub), KVP_EIO);
    cr_assert_eq(pub, sentinel, "*out untouched on failure");

    /* The same inproc name twice in one context: the second bind fails. */
    void *ctx = zmq_ctx_new();
    c = pc;
    c.zmq_context = ctx;
    kvp_publisher *a = NULL;
    cr_assert_eq(kvp_publisher_new(&c, &a), KVP_OK);
    cr_assert_eq(kvp_publisher_new(&c, &pub), KVP_EIO, "address in use");
    cr_assert_eq(pub, sentinel);
    cr_assert_eq(kvp_publisher_poll(a, 0), KVP_EINVAL, "no replay endpoint");
    cr_assert_eq(kvp_publisher_poll(NULL, 0), KVP_EINVAL);
    cr_assert_eq(kvp_publisher_flush(NULL), KVP_EINVAL);
    cr_assert_eq(kvp_publisher_attach(a, NULL), KVP_EINVAL);
    cr_assert_eq(kvp_publisher_attach(NULL, NULL), KVP_EINVAL);
    cr_assert_eq(kvp_publisher_stats_get(a, NULL), KVP_EINVAL);
    char buf[8];
    cr_assert_eq(kvp_publisher_endpoint(a, 1, buf, sizeof buf), KVP_EINVAL, "no replay socket");
    cr_assert_eq(kvp_publisher_endpoint(NULL, 0, buf, sizeof buf), KVP_EINVAL);
    kvp_publisher_on_event(NULL, NULL);
    kvp_publisher_on_event(a, NULL);
    kvp_publisher_free(a);
    kvp_publisher_free(NULL);
    zmq_ctx_term(ctx);
    kvp_publisher_config_init(NULL);
}

/* Events lost to memory exhaustion (simulated: the flag the intake sets) make the next
 * batch skip a sequence number, and flush reports KVP_ENOMEM once. */
Test(publisher, lost_events_leave_a_gap)
{
    rig r;
    kvp_publisher_config pc;
    kvp_publisher_config_init(&pc);
    rig_open(&r, &pc, "lost");
    rig_cache(&r, 64, KVP_HASH_XXH3, NULL);
    msg *mm = malloc(sizeof *mm);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t t[17] = {0};
    kvp_match m;
    cr_assert_eq(kvp_access(r.cache, &ns, t, 17, &m), KVP_OK);
    cr_assert_eq(kvp_publisher_flush(r.pub), KVP_OK);
    kvp_kv_batch_free(recv_batch(&r, mm, 0));
    r.pub->lost = true;
    r.pub->sticky = KVP_ENOMEM;
    t[0] = 1;
    cr_assert_eq(kvp_access(r.cache, &ns, t, 17, &m), KVP_OK);
    cr_assert_eq(kvp_publisher_flush(r.pub), KVP_ENOMEM, "the loss is reported");
    kvp_kv_batch_free(recv_batch(&r, mm, 2));
    cr_assert_eq(kvp_publisher_flush(r.pub), KVP_OK, "once");
    free(mm);
    rig_close(&r);
}

/* The checker catches each kind of corruption: pending ranges, the pending count, ring
 * order, a ring sequence at or past next_seq. */
Test(publisher, checker_catches_corruption)
{
    rig r;
    kvp_publisher_config pc;
    kvp_publisher_config_init(&pc);
    pc.replay_endpoint = "inproc://check-r";
    pc.buffer_steps = 4;
    rig_open(&r, &pc, "check");
    rig_cache(&r, 64, KVP_HASH_XXH3, NULL);
    msg *mm = malloc(sizeof *mm);
    publish_n(&r, 3, mm);
    kvp_namespace ns;
    th_ns(&ns, NULL, NULL, NULL, NULL);
    uint32_t t[33];
    seq_tokens(t, 33, 5);
    kvp_match m;
    cr_assert_eq(kvp_access(r.cache, &ns, t, 33, &m), KVP_OK);
    cr_assert_eq(kvp__publisher_check(r.pub), KVP_OK);
    kvp_publisher *p = r.pub;
    p->n_ph++;
    cr_assert_eq(kvp__publisher_check(p), KVP_ECORRUPT, "hashes past the events");
    p->n_ph--;
    p->n_pending++;
    cr_assert_eq(kvp__publisher_check(p), KVP_ECORRUPT, "pending count");
    p->n_pending--;
    p->pev[0].n_tokens--;
    cr_assert_eq(kvp__publisher_check(p), KVP_ECORRUPT, "tokens of a block missing");
    p->pev[0].n_tokens++;
    uint64_t s0 = p->slots[p->ring_head].seq;
    p->slots[p->ring_head].seq = p->slots[(p->ring_head + 1) % p->ring_cap].seq;
    cr_assert_eq(kvp__publisher_check(p), KVP_ECORRUPT, "ring order");
    p->slots[p->ring_head].seq = s0;
    p->next_seq--;
    cr_assert_eq(kvp__publisher_check(p), KVP_ECORRUPT, "a kept batch at next_seq");
    p->next_seq++;
    cr_assert_eq(kvp__publisher_check(p), KVP_OK);
    free(mm);
    rig_close(&r);
}
