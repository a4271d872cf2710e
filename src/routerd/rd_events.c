/*
 * rd_events.c - the event thread of `kvprefix router`: one zmq_poll over every engine's SUB
 * socket and every replay DEALER in flight, each message decoded (kvp_kv_decode) and applied
 * to the index (kvp_router_apply) in arrival order.
 *
 *   SUB ──[topic, seq(8 B BE), payload]──> decode ──> worker (engine id, dp rank) ──> apply
 *                                                                  │ GAP / lost restart
 *   DEALER ──[empty, from(8 B)]──> replay ROUTER ──[empty, seq, payload]... [empty, ff*8, ""]
 *
 * Per worker, a small state machine:
 *   live      batches are applied as they come.
 *   replaying a DEALER asked the engine's replay socket for every batch from the first
 *             missing number; replies are applied in order, live batches wait in a bounded
 *             queue. The end marker ends the replay: the queue is applied (batches the
 *             replay already brought are DUPLICATE, ignored). A deadline
 *             (--replay-timeout), a replay whose first batch is past the missing number
 *             (the engine's buffer moved on), a refused batch, or a second replay that
 *             brings no progress: the worker is marked stale (kvp_router_mark_stale: its
 *             blocks removed, ignored by /score until its publisher restarts, sends
 *             AllBlocksCleared, or an operator asks) and a line is logged.
 * A worker without a replay endpoint is marked stale at once on a gap.
 *
 * Restarts. kvp_router_apply sees a restart at the new publisher's batch 0. If that batch
 * was lost (ZeroMQ's subscriber reconnects after the new process has started publishing),
 * the next ones look like DUPLICATEs; a DUPLICATE whose number is not above the highest
 * one seen but whose stamp is later than every batch seen cannot be one (a publisher's
 * stamps do not go back), so the daemon takes it as a restart and replays from 0 (or marks
 * the worker stale without a replay endpoint).
 *
 * Shared store (--redis). The library applies every batch to the local index and then to
 * Redis, where the worker's sequence state lives for the whole fleet, and returns Redis's
 * status (the local one while Redis is unavailable). So a batch that another router
 * applied first comes back DUPLICATE: normal with several routers, counted by the library
 * (n_redis_duplicates, kvprefix_router_redis_duplicates_total), never logged, and not a
 * lost restart (its number is the next one: the rule above compares with batches seen,
 * not applied, for this reason). A GAP is the fleet's (Redis missed batches, e.g. applied
 * during an outage) and starts the replay above: replayed batches are DUPLICATE locally
 * and APPLIED in Redis (or DUPLICATE there too when the other router replayed first). The loop's
 * tick (rd_redis_tick) logs the store's transitions. The workers of named engines (not ID '*') are
 * added when the sockets open, not at their first batch, so that a router started while the fleet
 * is quiet scores them from the shared view at once.
 *
 * Bad input never stops the thread: messages that are not 3 frames, payloads the decoder
 * refuses, topics that do not name an engine, batches the index refuses are counted per
 * source (rd_source.n_bad) and logged at most once a minute per source.
 *
 * An engine is not trusted with its identity or its size (docs/security.md). A worker is
 * (engine id, dp rank) where both come from the configuration: the id from --engine (or,
 * for ID '*', from the topic, whose pod and model must be UTF-8 without control
 * characters), the rank from the endpoint (dp=N declares rank r at port + r); a batch whose
 * data_parallel_rank is another rank is refused (reason dp_rank), not made a new worker.
 * An endpoint creates at most --endpoint-workers workers (ID '*': one per pod), and its
 * workers hold at most --endpoint-blocks blocks together: past it, the worker whose batch
 * passed it is marked stale (its blocks dropped) and the refusal counted (reason limit) and
 * logged. The index's own bounds (KVP_ROUTER_MAX_WORKERS workers, KVP_ROUTER_MAX_GROUPS
 * models) are named in the log line when a worker cannot be added.
 *
 * rd_events_intake() is the whole path of one received message (frames as bytes), so that
 * fuzz/fuzz_routerd_events.c drives it without sockets.
 *
 * Every call is bounded: zmq_poll waits at most 100 ms (then d->stop is checked), receives
 * and sends use ZMQ_DONTWAIT, sockets close with ZMQ_LINGER 0, a replay has a deadline.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "cli.h"
#include "escape.h"
#include "rd_req.h"
#include "routerd.h"

/* Messages taken from one socket before polling again (fairness between engines). */
#define RD_DRAIN_MAX 256
/* Frames kept of one message; more are read and dropped. */
#define RD_MAX_FRAMES 4
/* Minimum time between two refusal log lines of one source. */
#define RD_LOG_EVERY_MS 60000

/* What rd_apply did with a batch. */
enum {
    RD_DONE = 0, /* applied, ignored or refused: the caller frees it */
    RD_WAIT = 1, /* live: a replay started, the batch waits in the worker's queue */
    RD_GAP = 2,  /* replayed: a gap (the replay buffer no longer reaches back) */
    RD_BAD = 3   /* replayed: the index refused the batch */
};

static const char *const rd_bad_names[RD_BAD_KINDS] = {"frames", "topic",   "payload",
                                                       "batch",  "dp_rank", "limit"};

int64_t rd_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Count a refused message of src and log it unless a line was logged in the last minute. */
static void rd_refuse(rd_daemon *d, rd_source *src, int kind, const char *why)
{
    pthread_mutex_lock(&d->lock);
    src->n_bad[kind]++;
    src->n_unlogged++;
    int64_t now = rd_now_ms();
    bool log = src->last_log_ms == 0 || now - src->last_log_ms >= RD_LOG_EVERY_MS;
    uint64_t n = src->n_unlogged;
    if (log) {
        src->last_log_ms = now;
        src->n_unlogged = 0;
    }
    pthread_mutex_unlock(&d->lock);
    if (log)
        rd_log("%s: refused a message (%s: %s); %" PRIu64 " refused since the last line, "
               "next line in a minute at most",
               src->endpoint, rd_bad_names[kind], why, n);
}

static rd_worker *rd_worker_get(rd_daemon *d, rd_source *src, const char *engine, const char *model,
                                int64_t dp, char *buf, size_t buf_size, const char **why);

int rd_events_open(rd_daemon *d, char *err, size_t err_size)
{
    d->zmq_ctx = zmq_ctx_new();
    if (d->zmq_ctx == NULL) {
        cli_errf(err, err_size, "zmq_ctx_new: %s", zmq_strerror(errno));
        return 1;
    }
    /* Every socket of the context dual-stack: tcp://[ADDR]:PORT endpoints work too. */
    zmq_ctx_set(d->zmq_ctx, ZMQ_IPV6, 1);
    for (size_t i = 0; i < d->n_sources; i++) {
        rd_source *s = &d->sources[i];
        int zero = 0, hwm = 100000;
        s->sub = zmq_socket(d->zmq_ctx, ZMQ_SUB);
        if (s->sub == NULL || zmq_setsockopt(s->sub, ZMQ_LINGER, &zero, sizeof zero) ||
            zmq_setsockopt(s->sub, ZMQ_RCVHWM, &hwm, sizeof hwm) ||
            zmq_setsockopt(s->sub, ZMQ_SUBSCRIBE, s->topic, strlen(s->topic)) ||
            (s->bind ? zmq_bind(s->sub, s->endpoint) : zmq_connect(s->sub, s->endpoint))) {
            cli_errf(err, err_size, "%s: cannot %s: %s", s->endpoint, s->bind ? "bind" : "connect",
                     zmq_strerror(errno));
            return 1;
        }
        /* With a shared store, a named engine's worker may already hold blocks there. */
        char buf[512];
        const char *why = NULL;
        if (d->redis.url && s->engine &&
            rd_worker_get(d, s, s->engine, NULL, s->dp_rank, buf, sizeof buf, &why) == NULL) {
            cli_errf(err, err_size, "%s: %s", s->endpoint, why);
            return 1;
        }
    }
    return 0;
}

/* Receive one multipart message (ZMQ_DONTWAIT) into f[0 .. RD_MAX_FRAMES). Returns the number
 * of frames (extra frames counted but dropped), 0 when nothing was waiting, -1 on error. */
static int rd_recv(void *sock, zmq_msg_t f[RD_MAX_FRAMES])
{
    int n = 0;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(&m);
            return n == 0 && errno == EAGAIN ? 0 : (n ? n : -1);
        }
        bool more = zmq_msg_more(&m);
        if (n < RD_MAX_FRAMES)
            f[n] = m;
        else
            zmq_msg_close(&m);
        n++;
        if (!more)
            return n;
    }
}

static void rd_close_frames(zmq_msg_t f[RD_MAX_FRAMES], int n)
{
    for (int i = 0; i < n && i < RD_MAX_FRAMES; i++)
        zmq_msg_close(&f[i]);
}

static uint64_t rd_be64(const void *p)
{
    const uint8_t *b = p;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | b[i];
    return v;
}

/* Why kvp_router_worker_add refused a worker, in words: its KVP_ENOSPC means either of the
 * index's two bounds, told apart by the stats. */
static const char *rd_add_error(rd_daemon *d, int rc)
{
    kvp_router_stats st;
    if (rc != KVP_ENOSPC)
        return kvp_strerror(rc);
    if (kvp_router_stats_get(d->router, &st) == KVP_OK && st.n_workers < KVP_ROUTER_MAX_WORKERS)
        return "the index holds 256 distinct models (hash configuration, model), its most "
               "(KVP_ROUTER_MAX_GROUPS): a worker of another model cannot be added";
    return "the index holds 32768 workers, its most (KVP_ROUTER_MAX_WORKERS)";
}

/* The worker (engine, dp) of src, created on first sight (kvp_router_worker_add with the
 * daemon's hash config, and model when given) unless src already has --endpoint-workers
 * workers. Returns NULL when it cannot be had, with *why saying why (static or in buf). */
static rd_worker *rd_worker_get(rd_daemon *d, rd_source *src, const char *engine, const char *model,
                                int64_t dp, char *buf, size_t buf_size, const char **why)
{
    uint32_t n_src = 0;
    for (size_t i = 0; i < d->n_workers; i++) {
        rd_worker *w = d->workers[i];
        if (w->src != src)
            continue;
        n_src++;
        if (w->dp_rank == dp && strcmp(w->engine, engine) == 0)
            return w;
    }
    if (n_src >= d->lim.endpoint_workers) {
        snprintf(buf, buf_size,
                 "engine '%s' would be worker %" PRIu32 " of this endpoint, above "
                 "--endpoint-workers %" PRIu32,
                 engine, n_src + 1, d->lim.endpoint_workers);
        *why = buf;
        return NULL;
    }
    kvp_router_worker_config wc;
    kvp_router_worker_config_init(&wc);
    wc.engine_id = engine;
    wc.dp_rank = dp;
    wc.model = model;
    wc.hash = d->hash;
    rd_worker *w = calloc(1, sizeof *w);
    char *name = malloc(strlen(engine) + 1);
    uint32_t id = 0;
    /* Room in the table first (under the lock: HTTP threads read it), then the worker. */
    pthread_mutex_lock(&d->lock);
    bool room =
        cli_grow((void **)&d->workers, &d->cap_workers, d->n_workers + 1, sizeof(rd_worker *));
    pthread_mutex_unlock(&d->lock);
    int rc = w && name && room ? kvp_router_worker_add(d->router, &wc, &id) : KVP_ENOMEM;
    if (rc != KVP_OK) {
        snprintf(buf, buf_size, "engine '%s' dp %" PRId64 ": cannot add the worker: %s", engine, dp,
                 rd_add_error(d, rc));
        *why = buf;
        free(w);
        free(name);
        return NULL;
    }
    memcpy(name, engine, strlen(engine) + 1);
    *w = (rd_worker){.src = src, .engine = name, .dp_rank = dp, .id = id};
    pthread_mutex_lock(&d->lock);
    d->workers[d->n_workers++] = w;
    pthread_mutex_unlock(&d->lock);
    rd_log("%s: worker '%s' dp %" PRId64 " added", src->endpoint, engine, dp);
    return w;
}

/* Give up on w's history: mark it stale, drop its replay. Cannot fail (logged). */
static void rd_give_up(rd_daemon *d, rd_worker *w, const char *why)
{
    int rc = kvp_router_mark_stale(d->router, w->id);
    pthread_mutex_lock(&d->lock);
    w->n_stale_marks++;
    pthread_mutex_unlock(&d->lock);
    rd_log("%s: worker '%s' dp %" PRId64 " marked stale (%s)%s%s", w->src->endpoint, w->engine,
           w->dp_rank, why, rc ? ": " : "", rc ? kvp_strerror(rc) : "");
}

/* Ask w's replay socket for every batch from `from`. Returns true when the request is on
 * its way (w->dealer set), false when it could not be sent (then w is marked stale). */
static bool rd_replay_start(rd_daemon *d, rd_worker *w, uint64_t from)
{
    if (w->src->replay == NULL) {
        rd_give_up(d, w, "a gap and no replay endpoint");
        return false;
    }
    if (w->replay_done && w->replay_done_at == from) {
        rd_give_up(d, w, "the replay brought nothing past the gap");
        return false;
    }
    uint8_t req[8];
    for (int i = 0; i < 8; i++)
        req[i] = (uint8_t)(from >> (56 - 8 * i));
    int zero = 0;
    void *s = zmq_socket(d->zmq_ctx, ZMQ_DEALER);
    if (s == NULL || zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_connect(s, w->src->replay) || zmq_send(s, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(s, req, 8, ZMQ_DONTWAIT) < 0) {
        if (s)
            zmq_close(s);
        rd_give_up(d, w, "the replay request could not be sent");
        return false;
    }
    w->dealer = s;
    w->replay_from = from;
    w->replay_n = 0;
    w->deadline_ms = rd_now_ms() + d->replay_timeout_ms;
    return true;
}

/* Count the result of an apply in w's counters. */
static void rd_count(rd_daemon *d, rd_worker *w, int status)
{
    pthread_mutex_lock(&d->lock);
    w->n_status[status]++;
    pthread_mutex_unlock(&d->lock);
}

/* Whether live batch (seq, ts), which the index called a DUPLICATE, is a restarted
 * publisher's whose first batches were lost: its number goes back (not above the highest
 * one seen) while its stamp goes forward (later than every batch seen). A batch that
 * another router applied first (a DUPLICATE in Redis) has the next number, and a replayed
 * or repeated one an older or equal stamp: neither is taken for a restart. */
static inline bool rd_is_lost_restart(const rd_worker *w, uint64_t seq, double ts)
{
    return w->has_seen && seq <= w->seen_seq && ts > w->seen_ts;
}

/* Note batch (seq, ts) of w as seen; restart: the publisher restarted at it (what was seen
 * before belongs to its previous life). Cannot fail. */
static void rd_seen(rd_worker *w, uint64_t seq, double ts, bool restart)
{
    if (restart || !w->has_seen) {
        w->seen_seq = seq;
        w->seen_ts = ts;
    } else {
        w->seen_seq = seq > w->seen_seq ? seq : w->seen_seq;
        w->seen_ts = ts > w->seen_ts ? ts : w->seen_ts;
    }
    w->has_seen = true;
}

/* Engine-hash mode: recompute the engine keys of b's root blocks (kvp_router_check_keys)
 * and count, per worker, what differs; the first mismatch of a worker is logged with its
 * likely cause. Nothing in token mode. Cannot fail (a check that fails is skipped). */
static void rd_check_keys(rd_daemon *d, rd_worker *w, const kvp_kv_batch *b)
{
    kvp_router_key_check kc;
    if (d->index_by != KVP_ROUTER_INDEX_ENGINE_HASH ||
        kvp_router_check_keys(d->router, w->id, b, &kc) != KVP_OK || kc.n_checked == 0)
        return;
    pthread_mutex_lock(&d->lock);
    bool first = kc.n_mismatch > 0 && w->n_key_mismatch == 0;
    w->n_key_checked += kc.n_checked;
    w->n_key_mismatch += kc.n_mismatch;
    if (first)
        w->key_likely = kc.likely;
    pthread_mutex_unlock(&d->lock);
    if (first)
        rd_log("%s: worker '%s' dp %" PRId64 ": block keys differ from the engine's (block hash "
               "%016" PRIx64 ", the router computes %016" PRIx64 "): /score cannot find this "
               "engine's blocks; likely cause: %s (counted in "
               "kvprefix_router_key_mismatch_total, logged once per worker)",
               w->src->endpoint, w->engine, w->dp_rank, kc.engine_hash, kc.router_hash,
               kc.likely ? kc.likely : "unknown");
}

/* The blocks src's workers hold together, with w's count refreshed (the others' as of
 * their last batch). */
static uint64_t rd_source_blocks(rd_daemon *d, rd_worker *w)
{
    kvp_router_worker_stats ws;
    if (kvp_router_worker_stats_get(d->router, w->id, &ws) == KVP_OK)
        w->n_blocks = ws.n_blocks;
    uint64_t sum = 0;
    for (size_t i = 0; i < d->n_workers; i++)
        if (d->workers[i]->src == w->src)
            sum += d->workers[i]->n_blocks;
    return sum;
}

/* After w's batch stored blocks: past --endpoint-blocks, w is marked stale (its blocks
 * dropped; it takes batches again from its next one) and the refusal counted and logged. */
static void rd_check_blocks(rd_daemon *d, rd_worker *w, const kvp_kv_batch *b)
{
    bool stores = false;
    for (size_t i = 0; i < b->n_events && !stores; i++)
        stores = b->events[i].type == KVP_EVENT_STORED;
    if (!stores)
        return;
    uint64_t sum = rd_source_blocks(d, w);
    if (sum <= d->lim.endpoint_blocks)
        return;
    char why[256];
    snprintf(why, sizeof why,
             "its workers hold %" PRIu64 " blocks, above --endpoint-blocks %" PRIu64
             ": worker '%s' dp %" PRId64 " marked stale",
             sum, d->lim.endpoint_blocks, w->engine, w->dp_rank);
    rd_refuse(d, w->src, RD_BAD_LIMIT, why);
    int rc = kvp_router_mark_stale(d->router, w->id);
    if (rc != KVP_OK)
        rd_log("%s: worker '%s': cannot mark it stale: %s", w->src->endpoint, w->engine,
               kvp_strerror(rc));
    w->n_blocks = 0;
    pthread_mutex_lock(&d->lock);
    w->n_stale_marks++;
    pthread_mutex_unlock(&d->lock);
}

/* Count the lag of a batch stamped ts (seconds since the epoch) applied now. */
static void rd_lag(rd_daemon *d, double ts)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    double lag = (double)now.tv_sec + (double)now.tv_nsec * 1e-9 - ts;
    if (!(lag > 0))
        lag = 0; /* a stamp in the future (clock skew), or not a number */
    if (lag > 1e6)
        lag = 1e6;
    rd_hist_add(&d->lag_hist, RD_HIST_LAG, (uint64_t)(lag * 1e9));
}

/* Apply batch b (number seq) of w. live: the batch came from the SUB socket (a gap starts
 * a replay, a lost restart is recognised); else from a replay. Returns RD_DONE; live:
 * RD_WAIT when a replay started and the batch must wait for it; replayed: RD_GAP, RD_BAD
 * (the replay cannot fill the gap). */
static int rd_apply(rd_daemon *d, rd_worker *w, uint64_t seq, const kvp_kv_batch *b, bool live)
{
    kvp_router_apply_result res;
    int rc = kvp_router_apply(d->router, w->id, seq, b, &res);
    if (rc == KVP_EINVAL) {
        char why[256];
        snprintf(why, sizeof why, "seq %" PRIu64 ", event %zu: %s", seq,
                 res.bad_event == SIZE_MAX ? (size_t)0 : res.bad_event,
                 res.why ? res.why : "refused");
        rd_refuse(d, w->src, RD_BAD_BATCH, why);
        return live ? RD_DONE : RD_BAD;
    }
    if (rc != KVP_OK) {
        rd_log("%s: worker '%s': apply: %s", w->src->endpoint, w->engine, kvp_strerror(rc));
        return RD_DONE;
    }
    rd_count(d, w, res.status);
    if (res.status == KVP_ROUTER_APPLIED || res.status == KVP_ROUTER_RESTARTED) {
        rd_check_keys(d, w, b);
        rd_lag(d, b->ts);
        rd_check_blocks(d, w, b);
    }
    switch (res.status) {
    case KVP_ROUTER_GAP:
        if (!live)
            return RD_GAP;
        rd_seen(w, seq, b->ts, false);
        return rd_replay_start(d, w, res.expected) ? RD_WAIT : RD_DONE;
    case KVP_ROUTER_DUPLICATE:
        if (live && rd_is_lost_restart(w, seq, b->ts)) {
            rd_log("%s: worker '%s': seq %" PRIu64 " goes back but is stamped later than "
                   "every batch seen: the publisher restarted and its first batches were lost",
                   w->src->endpoint, w->engine, seq);
            rd_seen(w, seq, b->ts, false);
            w->replay_done = false;
            return rd_replay_start(d, w, 0) ? RD_WAIT : RD_DONE;
        }
        rd_seen(w, seq, b->ts, false);
        return RD_DONE;
    case KVP_ROUTER_RESTARTED:
        rd_log("%s: worker '%s' dp %" PRId64 ": the publisher restarted (seq 0): cleared",
               w->src->endpoint, w->engine, w->dp_rank);
        break;
    default:
        break;
    }
    /* Applied (APPLIED or RESTARTED): progress. */
    rd_seen(w, seq, b->ts, res.status == KVP_ROUTER_RESTARTED);
    w->replay_done = false;
    return RD_DONE;
}

/* Hold live batch b of w while its replay runs (owned by the queue from here; freed when
 * the queue is full or cannot grow, and counted). */
static void rd_enqueue(rd_daemon *d, rd_worker *w, uint64_t seq, kvp_kv_batch *b)
{
    if (w->q_n - w->q_head >= RD_QUEUE_MAX ||
        !cli_grow((void **)&w->queue, &w->q_cap, w->q_n + 1, sizeof *w->queue)) {
        pthread_mutex_lock(&d->lock);
        w->n_queue_drops++;
        pthread_mutex_unlock(&d->lock);
        kvp_kv_batch_free(b);
        return;
    }
    w->queue[w->q_n++] = (rd_item){.seq = seq, .b = b};
}

/* Apply w's queued live batches in order until one starts another replay. */
static void rd_drain_queue(rd_daemon *d, rd_worker *w)
{
    while (w->dealer == NULL && w->q_head < w->q_n) {
        rd_item *it = &w->queue[w->q_head];
        if (rd_apply(d, w, it->seq, it->b, true) == RD_WAIT)
            return;
        kvp_kv_batch_free(it->b);
        w->q_head++;
    }
    if (w->q_head == w->q_n)
        w->q_head = w->q_n = 0;
}

/* End w's replay: close the DEALER; ok: count it as filled, else mark w stale. Then apply
 * the batches that waited. */
static void rd_replay_end(rd_daemon *d, rd_worker *w, bool ok, const char *why)
{
    zmq_close(w->dealer);
    w->dealer = NULL;
    kvp_router_worker_stats ws;
    bool have = kvp_router_worker_stats_get(d->router, w->id, &ws) == KVP_OK;
    pthread_mutex_lock(&d->lock);
    if (ok)
        w->n_replays_ok++;
    else
        w->n_replays_fail++;
    pthread_mutex_unlock(&d->lock);
    if (ok) {
        rd_log("%s: worker '%s' dp %" PRId64 ": replay from seq %" PRIu64 " done, next %" PRIu64,
               w->src->endpoint, w->engine, w->dp_rank, w->replay_from, have ? ws.expected : 0);
        w->replay_done = have && ws.seq_known;
        w->replay_done_at = have ? ws.expected : 0;
    } else {
        rd_give_up(d, w, why);
    }
    rd_drain_queue(d, w);
}

/* One reply frame set of w's replay: a batch (applied) or the end marker. */
static void rd_replay_reply(rd_daemon *d, rd_worker *w, zmq_msg_t f[RD_MAX_FRAMES], int n)
{
    if (n != 3 || zmq_msg_size(&f[0]) != 0 || zmq_msg_size(&f[1]) != 8) {
        rd_replay_end(d, w, false, "a malformed replay reply");
        return;
    }
    uint64_t seq = rd_be64(zmq_msg_data(&f[1]));
    bool first = w->replay_n++ == 0;
    if (seq == UINT64_MAX && zmq_msg_size(&f[2]) == 0) {
        rd_replay_end(d, w, !first, "the replay brought nothing");
        return;
    }
    /* The buffer must still hold the first batch asked for: otherwise the batches between
     * are lost (a GAP replay would see it as a gap; a replay from 0 after a lost restart
     * would only bring duplicates, and ask again forever). */
    if (first && seq != w->replay_from) {
        rd_replay_end(d, w, false, "the replay buffer no longer reaches the gap");
        return;
    }
    kvp_kv_batch *b = NULL;
    int rc = kvp_kv_decode(zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), &b);
    pthread_mutex_lock(&d->lock);
    w->n_replayed++;
    pthread_mutex_unlock(&d->lock);
    if (rc != KVP_OK) {
        rd_replay_end(d, w, false, "the replay sent a payload that does not decode");
        return;
    }
    int st = rd_apply(d, w, seq, b, false);
    kvp_kv_batch_free(b);
    if (st == RD_GAP)
        rd_replay_end(d, w, false, "the replay buffer no longer reaches the gap");
    else if (st == RD_BAD)
        rd_replay_end(d, w, false, "the replay brought a batch the index refuses");
}

/* Drain the replies waiting on w's DEALER. */
static void rd_replay_read(rd_daemon *d, rd_worker *w)
{
    for (int k = 0; k < RD_DRAIN_MAX && w->dealer; k++) {
        zmq_msg_t f[RD_MAX_FRAMES];
        int n = rd_recv(w->dealer, f);
        if (n == 0)
            return;
        if (n < 0) {
            rd_replay_end(d, w, false, "the replay socket failed");
            return;
        }
        rd_replay_reply(d, w, f, n);
        rd_close_frames(f, n);
    }
}

/* Engine id and model from an llm-d topic "kv@<pod>@<model>" (topic[0 .. len)). Writes
 * NUL-terminated copies. Returns false when the topic is not of that shape, not UTF-8, or
 * holds a control character. */
static bool rd_topic_ids(const char *topic, size_t len, char *pod, char *model, size_t cap)
{
    if (len < 5 || memcmp(topic, "kv@", 3) != 0 || memchr(topic, '\0', len))
        return false;
    const char *p = topic + 3, *end = topic + len;
    const char *at = memchr(p, '@', (size_t)(end - p));
    if (at == NULL || at == p || at + 1 == end || (size_t)(at - p) >= cap ||
        (size_t)(end - at - 1) >= cap)
        return false;
    /* The pod becomes a label of every scrape and a string of every /score answer. */
    for (const char *c = topic; c < end; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            return false;
    if (!rd_utf8_ok((const unsigned char *)topic, len))
        return false;
    memcpy(pod, p, (size_t)(at - p));
    pod[at - p] = '\0';
    memcpy(model, at + 1, (size_t)(end - at - 1));
    model[end - at - 1] = '\0';
    return true;
}

void rd_events_intake(rd_daemon *d, rd_source *src, const void *const *frames, const size_t *sizes,
                      int n)
{
    pthread_mutex_lock(&d->lock);
    src->n_messages++;
    pthread_mutex_unlock(&d->lock);
    if (n != 3 || sizes[1] != 8) {
        char why[64];
        snprintf(why, sizeof why, "%d frames, sequence frame of %zu bytes", n,
                 n >= 2 ? sizes[1] : (size_t)0);
        rd_refuse(d, src, RD_BAD_FRAMES, why);
        return;
    }
    char pod[RD_NAME_MAX + 1], model[RD_NAME_MAX + 1];
    const char *engine = src->engine, *mdl = NULL;
    if (engine == NULL) {
        if (!rd_topic_ids(frames[0], sizes[0], pod, model, sizeof pod)) {
            rd_refuse(d, src, RD_BAD_TOPIC,
                      "the topic is not kv@<pod>@<model> (UTF-8, no control characters)");
            return;
        }
        engine = pod;
        mdl = model;
    }
    uint64_t seq = rd_be64(frames[1]);
    kvp_kv_batch *b = NULL;
    int rc = kvp_kv_decode(frames[2], sizes[2], &b);
    if (rc != KVP_OK) {
        rd_refuse(d, src, RD_BAD_PAYLOAD, kvp_strerror(rc));
        return;
    }
    /* The endpoint, not the batch, says which rank it is. */
    if (b->has_dp_rank && b->dp_rank != src->dp_rank) {
        char why[160];
        snprintf(why, sizeof why,
                 "the batch says data_parallel_rank %" PRId64 ", the endpoint is rank %" PRId64
                 " (dp=N in --engine declares ranks)",
                 b->dp_rank, src->dp_rank);
        rd_refuse(d, src, RD_BAD_RANK, why);
        kvp_kv_batch_free(b);
        return;
    }
    char buf[512];
    const char *why = NULL;
    rd_worker *w = rd_worker_get(d, src, engine, mdl, src->dp_rank, buf, sizeof buf, &why);
    if (w == NULL) {
        rd_refuse(d, src, RD_BAD_LIMIT, why);
        kvp_kv_batch_free(b);
        return;
    }
    if (w->dealer) {
        rd_enqueue(d, w, seq, b);
        return;
    }
    if (rd_apply(d, w, seq, b, true) == RD_WAIT)
        rd_enqueue(d, w, seq, b);
    else
        kvp_kv_batch_free(b);
}

/* Handle one received message of src (frames f[0 .. n)). */
static void rd_on_message(rd_daemon *d, rd_source *src, zmq_msg_t f[RD_MAX_FRAMES], int n)
{
    const void *data[RD_MAX_FRAMES] = {NULL};
    size_t sizes[RD_MAX_FRAMES] = {0};
    for (int i = 0; i < n && i < RD_MAX_FRAMES; i++) {
        data[i] = zmq_msg_data(&f[i]);
        sizes[i] = zmq_msg_size(&f[i]);
    }
    rd_events_intake(d, src, data, sizes, n);
}

/* Drain what waits on src's SUB socket (at most RD_DRAIN_MAX messages). */
static void rd_source_read(rd_daemon *d, rd_source *src)
{
    for (int k = 0; k < RD_DRAIN_MAX; k++) {
        zmq_msg_t f[RD_MAX_FRAMES];
        int n = rd_recv(src->sub, f);
        if (n <= 0)
            return;
        rd_on_message(d, src, f, n);
        rd_close_frames(f, n);
    }
}

/* Fill the poll set: every SUB socket, then the DEALER of each replay in flight (who[] says
 * which worker). Returns the number of items and the poll timeout in ms. */
static size_t rd_poll_set(rd_daemon *d, zmq_pollitem_t *items, rd_worker **who, long *timeout)
{
    size_t n = 0;
    int64_t now = rd_now_ms();
    *timeout = 100;
    for (size_t i = 0; i < d->n_sources; i++)
        items[n++] = (zmq_pollitem_t){.socket = d->sources[i].sub, .events = ZMQ_POLLIN};
    for (size_t i = 0; i < d->n_workers; i++) {
        rd_worker *w = d->workers[i];
        if (w->dealer == NULL)
            continue;
        who[n] = w;
        items[n++] = (zmq_pollitem_t){.socket = w->dealer, .events = ZMQ_POLLIN};
        int64_t left = w->deadline_ms - now;
        if (left < *timeout)
            *timeout = left < 0 ? 0 : (long)left;
    }
    return n;
}

/* End the replays past their deadline. */
static void rd_check_deadlines(rd_daemon *d)
{
    int64_t now = rd_now_ms();
    for (size_t i = 0; i < d->n_workers; i++) {
        rd_worker *w = d->workers[i];
        if (w->dealer && now >= w->deadline_ms)
            rd_replay_end(d, w, false, "the replay timed out");
    }
}

/* The poll set's storage, grown as workers appear. */
typedef struct rd_pollbuf {
    zmq_pollitem_t *items; /* poll items */
    rd_worker **who;       /* the worker of each DEALER item */
    size_t cap;            /* entries of both */
} rd_pollbuf;

/* Make room for every source and worker. Returns false when memory runs out (the buffer
 * is unchanged but still valid). */
static bool rd_poll_room(rd_daemon *d, rd_pollbuf *pb)
{
    size_t need = d->n_sources + d->n_workers + 1;
    if (need <= pb->cap && pb->items && pb->who)
        return true;
    if (need == 0 || need > SIZE_MAX / sizeof(zmq_pollitem_t))
        return false;
    zmq_pollitem_t *ni = realloc(pb->items, need * sizeof(zmq_pollitem_t));
    if (ni == NULL)
        return false;
    pb->items = ni;
    rd_worker **nw = realloc(pb->who, need * sizeof(rd_worker *));
    if (nw == NULL)
        return false;
    pb->who = nw;
    pb->cap = need;
    return true;
}

void *rd_events_run(void *arg)
{
    rd_daemon *d = arg;
    rd_pollbuf pb = {NULL, NULL, 0};
    while (!atomic_load(&d->stop)) {
        if (!rd_poll_room(d, &pb)) {
            rd_log("out of memory in the event loop; retrying");
            struct timespec ts = {0, 100 * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        long timeout = 100;
        size_t n = rd_poll_set(d, pb.items, pb.who, &timeout);
        int rc = zmq_poll(pb.items, (int)n, timeout);
        if (rc < 0 && errno != EINTR) {
            rd_log("zmq_poll: %s", zmq_strerror(errno));
            break;
        }
        for (size_t i = 0; rc > 0 && i < n; i++) {
            if (!(pb.items[i].revents & ZMQ_POLLIN))
                continue;
            if (i < d->n_sources)
                rd_source_read(d, &d->sources[i]);
            else if (pb.who[i]->dealer == pb.items[i].socket)
                rd_replay_read(d, pb.who[i]);
        }
        rd_check_deadlines(d);
        rd_redis_tick(d);
    }
    free(pb.items);
    free(pb.who);
    return NULL;
}

void rd_events_free(rd_daemon *d)
{
    for (size_t i = 0; i < d->n_workers; i++) {
        rd_worker *w = d->workers[i];
        if (w->dealer)
            zmq_close(w->dealer);
        for (size_t k = w->q_head; k < w->q_n; k++)
            kvp_kv_batch_free(w->queue[k].b);
        free(w->queue);
        free(w->engine);
        free(w);
    }
    free(d->workers);
    d->workers = NULL;
    d->n_workers = 0;
    for (size_t i = 0; i < d->n_sources; i++)
        if (d->sources[i].sub)
            zmq_close(d->sources[i].sub);
    if (d->zmq_ctx)
        zmq_ctx_term(d->zmq_ctx);
    d->zmq_ctx = NULL;
}
