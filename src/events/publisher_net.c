/*
 * publisher_net.c - the publisher's ZeroMQ side: endpoints (vLLM's bind-or-connect rule and
 * data-parallel offsets), the PUB socket and its sends, the replay ring and the ROUTER
 * socket that serves it, and the optional replay thread.
 *
 * Messages. A batch is [topic, seq (8 bytes big-endian), payload], sent with ZMQ_DONTWAIT:
 * a PUB socket never blocks, it drops messages for a subscriber that is hwm behind, as
 * vLLM's does (the subscriber sees a gap and asks the replay socket).
 *
 * Replay. A request is [identity, empty, start_seq (8 bytes big-endian)] as the ROUTER
 * receives it from a DEALER sending [empty, start_seq]. The answer is one message
 * [identity, empty, seq, payload] per kept batch with seq >= start_seq, oldest first, then
 * [identity, empty, ff ff ff ff ff ff ff ff, empty]. A request of any other shape gets no
 * answer and is counted. The ROUTER's send high-water mark is raised to hold a whole answer
 * (buffer_steps + 1 messages) so that one client's replay is never cut short; a client
 * that stops reading loses messages past that, as with vLLM.
 *
 * Ring. buffer_steps slots, oldest at ring_head; a full ring overwrites its oldest slot,
 * reusing the slot's allocation (grown with realloc only when a batch is larger than any it
 * held before). Memory: buffer_steps times the largest batch payload, at most.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "publisher.h"

bool kvp__endpoint_binds(const char *ep)
{
    return strchr(ep, '*') || strstr(ep, "::") || strncmp(ep, "ipc://", 6) == 0 ||
           strncmp(ep, "inproc://", 9) == 0;
}

static int copy_str(const char *s, char *out, size_t cap)
{
    size_t n = strlen(s);
    if (n >= cap)
        return KVP_ENOSPC;
    memcpy(out, s, n + 1);
    return KVP_OK;
}

int kvp__endpoint_for_rank(const char *ep, int64_t rank, char *out, size_t cap)
{
    if (rank < 0)
        return KVP_EINVAL;
    if (rank == 0)
        return copy_str(ep, out, cap);
    int n;
    if (strstr(ep, "inproc")) {
        n = snprintf(out, cap, "%s_dp%lld", ep, (long long)rank);
    } else if (strstr(ep, "tcp")) {
        const char *colon = strrchr(ep, ':');
        const char *port = colon + 1;
        if (strcmp(port, "*") == 0)
            return copy_str(ep, out, cap);
        size_t digits = strspn(port, "0123456789");
        if (digits == 0 || digits > 5 || port[digits] != '\0')
            return KVP_EINVAL;
        long p = strtol(port, NULL, 10) + (long)(rank > 65535 ? 65536 : rank);
        if (p > 65535)
            return KVP_EINVAL;
        n = snprintf(out, cap, "%.*s:%ld", (int)(colon - ep), ep, p);
    } else {
        return KVP_EINVAL;
    }
    return n >= 0 && (size_t)n < cap ? KVP_OK : KVP_ENOSPC;
}

/* A socket of type on ep (offset for rank), bound or connected; *out set even on failure
 * (NULL if none was made). */
static int open_socket(kvp_publisher *pub, int type, const char *ep, bool bind, int hwm, int linger,
                       void **out)
{
    char where[1024];
    int rc = kvp__endpoint_for_rank(ep, pub->dp_rank, where, sizeof where);
    if (rc != KVP_OK)
        return KVP_EINVAL;
    *out = zmq_socket(pub->ctx, type);
    if (!*out)
        return KVP_EIO;
    if (zmq_setsockopt(*out, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
        zmq_setsockopt(*out, ZMQ_LINGER, &linger, sizeof linger) != 0)
        return KVP_EIO;
    rc = bind ? zmq_bind(*out, where) : zmq_connect(*out, where);
    return rc == 0 ? KVP_OK : KVP_EIO;
}

int kvp__pub_open(kvp_publisher *pub, const kvp_publisher_config *cfg)
{
    int rc = open_socket(pub, ZMQ_PUB, cfg->endpoint, kvp__endpoint_binds(cfg->endpoint), cfg->hwm,
                         cfg->linger_ms, &pub->pub);
    if (rc != KVP_OK || !cfg->replay_endpoint)
        return rc;
    int hwm = cfg->buffer_steps >= INT32_MAX - 1 ? 0 : (int)cfg->buffer_steps + 1;
    if (hwm && hwm < cfg->hwm)
        hwm = cfg->hwm;
    return open_socket(pub, ZMQ_ROUTER, cfg->replay_endpoint, true, hwm, cfg->linger_ms,
                       &pub->replay);
}

void kvp__pub_close(kvp_publisher *pub)
{
    if (pub->pub)
        zmq_close(pub->pub);
    if (pub->replay)
        zmq_close(pub->replay);
    pub->pub = pub->replay = NULL;
    if (pub->own_ctx && pub->ctx)
        zmq_ctx_term(pub->ctx);
    pub->ctx = NULL;
}

/* Send one frame without blocking, retrying on EINTR. KVP_OK or KVP_EIO. */
static int send_frame(void *sock, const void *p, size_t n, int flags)
{
    for (;;) {
        if (zmq_send(sock, p, n, flags | ZMQ_DONTWAIT) >= 0)
            return KVP_OK;
        if (zmq_errno() != EINTR)
            return KVP_EIO;
    }
}

static void store_be64(uint8_t out[8], uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        out[i] = (uint8_t)v;
}

int kvp__pub_send_locked(kvp_publisher *pub, uint64_t seq, const uint8_t *payload, size_t len)
{
    uint8_t sb[8];
    store_be64(sb, seq);
    if (send_frame(pub->pub, pub->topic, pub->topic_len, ZMQ_SNDMORE) != KVP_OK ||
        send_frame(pub->pub, sb, 8, ZMQ_SNDMORE) != KVP_OK)
        return KVP_EIO;
    return send_frame(pub->pub, payload, len, 0);
}

int kvp__ring_push_locked(kvp_publisher *pub, uint64_t seq, const uint8_t *payload, size_t len)
{
    if (pub->ring_cap == 0)
        return KVP_OK;
    bool full = pub->ring_n == pub->ring_cap;
    kvp__slot *s = &pub->slots[(pub->ring_head + (full ? 0 : pub->ring_n)) % pub->ring_cap];
    if (s->cap < len) {
        uint8_t *p = realloc(s->data, len);
        if (!p)
            return KVP_ENOMEM;
        s->data = p;
        s->cap = len;
    }
    memcpy(s->data, payload, len);
    s->len = len;
    s->seq = seq;
    if (full)
        pub->ring_head = (pub->ring_head + 1) % pub->ring_cap;
    else
        pub->ring_n++;
    return KVP_OK;
}

void kvp__ring_free(kvp_publisher *pub)
{
    for (uint32_t i = 0; i < pub->ring_cap; i++)
        free(pub->slots[i].data);
    free(pub->slots);
    pub->slots = NULL;
    pub->ring_cap = pub->ring_n = pub->ring_head = 0;
}

/* Send every kept batch from seq start on to the client id, then the end marker. */
static void answer(kvp_publisher *pub, const uint8_t *id, size_t id_len, uint64_t start)
{
    static const uint8_t end[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    pthread_mutex_lock(&pub->mu);
    uint64_t n_sent = 0;
    for (uint32_t i = 0; i < pub->ring_n; i++) {
        const kvp__slot *s = &pub->slots[(pub->ring_head + i) % pub->ring_cap];
        if (s->seq < start)
            continue;
        uint8_t sb[8];
        store_be64(sb, s->seq);
        if (send_frame(pub->replay, id, id_len, ZMQ_SNDMORE) == KVP_OK &&
            send_frame(pub->replay, "", 0, ZMQ_SNDMORE) == KVP_OK &&
            send_frame(pub->replay, sb, 8, ZMQ_SNDMORE) == KVP_OK &&
            send_frame(pub->replay, s->data, s->len, 0) == KVP_OK)
            n_sent++;
    }
    if (send_frame(pub->replay, id, id_len, ZMQ_SNDMORE) == KVP_OK &&
        send_frame(pub->replay, "", 0, ZMQ_SNDMORE) == KVP_OK &&
        send_frame(pub->replay, end, 8, ZMQ_SNDMORE) == KVP_OK)
        (void)send_frame(pub->replay, "", 0, 0);
    pub->st.n_replay_requests++;
    pub->st.n_replay_batches += n_sent;
    pthread_mutex_unlock(&pub->mu);
}

/* Receive one whole message without blocking: its first three frames' bytes (up to 255
 * each) into f[], their sizes into n[], the frame count into *n_frames. Returns false when
 * no message is waiting. */
static bool recv_request(void *sock, uint8_t f[3][256], size_t n[3], int *n_frames)
{
    *n_frames = 0;
    int more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, *n_frames ? 0 : ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            if (*n_frames == 0)
                return false;
            break;
        }
        size_t sz = zmq_msg_size(&m);
        if (*n_frames < 3) {
            n[*n_frames] = sz;
            memcpy(f[*n_frames], zmq_msg_data(&m), sz < 256 ? sz : 256);
        }
        (*n_frames)++;
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
    return true;
}

/* Answer every request already waiting on the replay socket. */
static void serve_waiting(kvp_publisher *pub)
{
    uint8_t f[3][256];
    size_t n[3];
    int n_frames;
    while (recv_request(pub->replay, f, n, &n_frames)) {
        if (n_frames == 3 && n[0] <= 255 && n[1] == 0 && n[2] == 8) {
            uint64_t start = 0;
            for (int i = 0; i < 8; i++)
                start = start << 8 | f[2][i];
            answer(pub, f[0], n[0], start);
        } else {
            pthread_mutex_lock(&pub->mu);
            pub->st.n_bad_requests++;
            pthread_mutex_unlock(&pub->mu);
        }
    }
}

int kvp__replay_serve(kvp_publisher *pub, int timeout_ms)
{
    pthread_mutex_lock(&pub->replay_mu);
    zmq_pollitem_t it = {pub->replay, 0, ZMQ_POLLIN, 0};
    int rc = zmq_poll(&it, 1, timeout_ms);
    if (rc > 0)
        serve_waiting(pub);
    pthread_mutex_unlock(&pub->replay_mu);
    return rc >= 0 || zmq_errno() == EINTR ? KVP_OK : KVP_EIO;
}

static void *replay_main(void *arg)
{
    kvp_publisher *pub = arg;
    while (!atomic_load(&pub->stop))
        (void)kvp__replay_serve(pub, 20);
    return NULL;
}

int kvp__replay_thread_start(kvp_publisher *pub)
{
    if (pthread_create(&pub->thread, NULL, replay_main, pub) != 0)
        return KVP_ENOMEM;
    pub->has_thread = true;
    return KVP_OK;
}

void kvp__replay_thread_stop(kvp_publisher *pub)
{
    if (!pub->has_thread)
        return;
    atomic_store(&pub->stop, true);
    pthread_join(pub->thread, NULL);
    pub->has_thread = false;
}

KVP_EXPORT int kvp_publisher_endpoint(kvp_publisher *pub, int which, char *buf, size_t cap)
{
    if (!pub || !buf || (which != 0 && which != 1))
        return KVP_EINVAL;
    pthread_mutex_t *mu = which ? &pub->replay_mu : &pub->mu;
    pthread_mutex_lock(mu);
    void *sock = which ? pub->replay : pub->pub;
    char ep[1024];
    size_t n = sizeof ep;
    int rc = !sock                                                  ? KVP_EINVAL
             : zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &n) != 0 ? KVP_EIO
             : n > cap                                              ? KVP_ENOSPC
                                                                    : KVP_OK;
    pthread_mutex_unlock(mu);
    if (rc == KVP_OK)
        memcpy(buf, ep, n);
    return rc;
}
