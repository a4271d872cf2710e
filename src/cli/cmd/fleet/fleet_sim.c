/*
 * fleet_sim.c - the fleet simulation of `kvprefix fleet` (fleet.h; the model is documented in
 * docs/routing.md, "Fleet simulation").
 *
 * A fleet is N replicas, each its own kvp_cache (public API only) of the same capacity and
 * the same hash fields, so the keys the log computed once are valid on every replica. The
 * simulation is a discrete-event loop over integer nanoseconds:
 *
 *   arrival ──route──> replica queue (FIFO) ──slot free──> start ──prefill──> commit
 *                                                           │                  │
 *                                                  kvp_acquire_keys     kvp_commit_keys
 *                                                           └──── decode ────> finish
 *                                                                           kvp_release
 *
 *   routing  at arrival, by the policy (below); affinity hashes the key of the prompt's
 *            first affinity_blocks blocks on a consistent-hash ring (fleet_ring.c).
 *   start    when one of the replica's `concurrency` slots is free and the request is at
 *            the head of its queue: kvp_acquire_keys pins the cached prefix and allocates
 *            the blocks of prompt + output. KVP_ENOSPC (in-flight requests pin too much of
 *            the pool) postpones the start to the replica's next finish; a request larger
 *            than the whole pool is served without the cache (counted as oversize).
 *   commit   prefill_ns x uncached prompt tokens later: the prompt's full blocks become
 *            cached (visible to later lookups), as an engine's do once computed.
 *   finish   decode_ns x output tokens after the commit: kvp_release, slot free, next start.
 *   TTFT     start - arrival + prefill.
 *
 * Events at the same instant run commits first, then finishes, then arrivals (so a slot or
 * a block freed at t serves a request arriving at t), each kind in the order it was
 * scheduled: the run is a pure function of the log and the configuration.
 *
 * Load. A replica's outstanding work at time t is the remaining service time of its
 * in-flight requests plus the estimated service time of its queued ones (estimated when
 * routed, from a lookup on that replica): W = queued_est + sum(finish) - in_flight * t.
 * least-loaded takes the smallest W; cache-aware the longest cached prefix
 * (kvp_lookup_keys' n_blocks_cached, what a router's score gives), then the smallest W;
 * cache-aware-cap does the same among replicas whose W is at most load_cap x the fleet's
 * mean W (the least-loaded replica always qualifies). Remaining ties go to the first
 * replica after the previous pick, so equal replicas take turns. These three decide through
 * kvp_router_rank (fl_rank_pick), the ranking `kvprefix router` answers /score with, so the
 * simulation describes the daemon's choices; --overlap-weight switches the cache-aware ones
 * to its cost mode (overlap_weight x blocks to prefill + W).
 *
 * Router index. With cfg->index (memory or redis) the cache-aware policies ask a kvp_router
 * (fleet_index.c) instead of the caches: every cache's events go to the index's collector,
 * each step's become one batch per replica (fl_index_step after every arrival or event), the
 * batches due are applied before each decision (fl_index_sync) and one score answers for all
 * replicas. With zero delay that is exactly the caches' state, so the decisions are the
 * oracle's; with cfg->check each decision compares the two (same_as_oracle). The prefix
 * query of every decision is timed in real time (score_ns) in every mode: the N lookups,
 * or the router's score call alone.
 *
 * Invariants (sim_check, run after every event with cfg->check): each queue is a well-formed
 * list of that replica's queued requests whose estimates sum to queued_est; in-flight
 * requests number at most `concurrency` per replica, their finishes sum to sum_finish, and
 * the pinned ones are exactly the cache's active requests; every cache passes
 * kvp_cache_check; the event heap is ordered.
 *
 * Cost: per request one kvp_lookup_keys per replica it asks (N for the cache-aware
 * policies, 1 otherwise; with an index one score instead of N), one acquire, commit and
 * release, and O(log events) heap work; memory 40 bytes per request (48 for the cache-aware
 * policies: the timing) plus the replicas' pools.
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "logread.h"
#include "fleet.h"

#define FL_NIL UINT32_MAX /* no request */

enum { EV_COMMIT = 0, EV_FINISH = 1 }; /* also their order at equal times */

/* Request states, in the order a request goes through them. */
enum { RQ_NEW = 0, RQ_QUEUED, RQ_PREFILL, RQ_DECODE, RQ_DONE };

enum {
    RQF_PINNED = 1,    /* holds blocks of its replica (acquired, not released) */
    RQF_WAITED = 2,    /* its start was postponed at least once by KVP_ENOSPC */
    RQF_OVERSIZE = 4,  /* larger than a replica's pool: served without the cache */
    RQF_START_WAIT = 8 /* returned by start(): not an actual flag of a request */
};

typedef struct fl_event {
    fl_time t;    /* when */
    uint64_t seq; /* scheduling order, to break ties */
    uint32_t req; /* the request */
    uint8_t kind; /* EV_* */
} fl_event;

typedef struct fl_rep {
    kvp_cache *cache;    /* its pool */
    uint32_t in_flight;  /* requests started and not finished */
    uint32_t q_head;     /* first queued request, or FL_NIL */
    uint32_t q_tail;     /* last queued request, or FL_NIL */
    uint32_t n_queued;   /* requests in the queue */
    fl_time queued_est;  /* sum of the queued requests' estimated service times */
    fl_time sum_finish;  /* sum of the in-flight requests' finish times */
    fl_replica_stats st; /* what it served */
} fl_rep;

typedef struct sim {
    const fl_log *log;
    const fl_sim_config *cfg;
    uint32_t n;       /* replicas */
    uint32_t bs;      /* tokens per block */
    fl_rep *rep;      /* n replicas */
    fl_ring *ring;    /* affinity only */
    uint32_t *where;  /* per request: its replica */
    uint32_t *next;   /* per request: the next in its queue, or FL_NIL */
    fl_time *est;     /* per request: estimated service time (when routed) */
    fl_time *finish;  /* per request: when it finishes (once started) */
    fl_time *start;   /* per request: when it started */
    fl_time *ttft;    /* per request: time to first token */
    uint32_t *hit;    /* per request: prompt tokens reused */
    uint8_t *state;   /* per request: RQ_* */
    uint8_t *flags;   /* per request: RQF_* */
    uint32_t *cached; /* per replica: the routed request's cached prefix, in blocks */
    uint32_t *hits;   /* per replica: its hit tokens there */
    double *work;     /* per replica: outstanding work W */
    fl_event *heap;   /* pending commits and finishes, a binary min-heap */
    size_t n_heap, heap_cap;
    uint64_t seq;           /* events scheduled so far */
    uint32_t *scratch;      /* a Mooncake prompt (fl_log_tokens), zeroed at allocation */
    uint64_t rng;           /* splitmix64 state (random) */
    uint64_t n_routed;      /* requests routed so far */
    uint32_t last;          /* previous pick, for the turn-taking of ties */
    fl_time now;            /* the current instant */
    bool token_forms;       /* vllm-sha256: keys cannot continue a request's chain, so acquire
                               and commit hash the tokens themselves */
    uint64_t n_block_waits; /* requests whose start KVP_ENOSPC postponed */
    fl_index *index;        /* the cache-aware policies' router index; NULL: the oracle */
    uint64_t *score_ns;     /* wall time of each routing decision's prefix query */
    size_t n_score, cap_score;
    char *err;
    size_t err_size;
    /* per replica: kvp_router_rank's inputs (scratch of pick_scored) */
    kvp_router_rank_input *rank_in;
} sim;

static const char *const policy_names[FL_N_POLICIES] = {
    "round-robin", "random", "least-loaded", "affinity", "cache-aware", "cache-aware-cap"};

const char *fl_policy_name(int policy)
{
    return policy >= 0 && policy < FL_N_POLICIES ? policy_names[policy] : NULL;
}

static const char *const index_names[FL_N_INDEX] = {"oracle", "memory", "redis"};

const char *fl_index_name(int mode)
{
    return mode >= 0 && mode < FL_N_INDEX ? index_names[mode] : NULL;
}

/* Real time, for the index's figures (never for the model). */
static uint64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

static inline bool policy_scores(int policy)
{
    return policy == FL_CACHE_AWARE || policy == FL_CACHE_CAP;
}

static inline bool rq_in_flight(const sim *s, uint32_t i)
{
    return s->state[i] == RQ_PREFILL || s->state[i] == RQ_DECODE;
}

static inline bool rq_pinned(const sim *s, uint32_t i)
{
    return (s->flags[i] & RQF_PINNED) != 0;
}

static int sim_fail(sim *s, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int sim_fail(sim *s, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, s->err_size, fmt, ap);
    va_end(ap);
    return code;
}

static int req_fail(sim *s, int code, uint32_t i, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Fail with "NAME:LINE: message" for request i. Returns code. */
static int req_fail(sim *s, int code, uint32_t i, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return sim_fail(s, code, "%s:%llu: %s", cli_input_name(s->cfg->name),
                    (unsigned long long)fl_log_req(s->log, i)->line_no, msg);
}

/* ---- the event heap ----------------------------------------------------------------------- */

static inline bool ev_before(const fl_event *a, const fl_event *b)
{
    if (a->t != b->t)
        return a->t < b->t;
    if (a->kind != b->kind)
        return a->kind < b->kind;
    return a->seq < b->seq;
}

/* Schedule an event. Returns FL_OK or FL_ENOMEM. */
static int heap_push(sim *s, fl_time t, uint32_t req, uint8_t kind)
{
    if (!cli_grow((void **)&s->heap, &s->heap_cap, s->n_heap + 1, sizeof *s->heap))
        return sim_fail(s, FL_ENOMEM, "out of memory");
    fl_event e = {t, s->seq++, req, kind};
    size_t i = s->n_heap++;
    while (i > 0 && ev_before(&e, &s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = e;
    return FL_OK;
}

/* Remove and return the earliest event (the heap is not empty). Cannot fail. */
static fl_event heap_pop(sim *s)
{
    fl_event top = s->heap[0], e = s->heap[--s->n_heap];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= s->n_heap)
            break;
        if (c + 1 < s->n_heap && ev_before(&s->heap[c + 1], &s->heap[c]))
            c++;
        if (!ev_before(&s->heap[c], &e))
            break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (s->n_heap > 0)
        s->heap[i] = e;
    return top;
}

/* ---- routing ------------------------------------------------------------------------------ */

/* splitmix64: the next value of the stream. Cannot fail. */
static uint64_t rng_next(sim *s)
{
    uint64_t z = fl_mix64(s->rng);
    s->rng += UINT64_C(0x9e3779b97f4a7c15);
    return z;
}

/* Uniform in 0 .. n-1 by rejection (no modulo bias). Cannot fail. */
static uint32_t rng_below(sim *s, uint32_t n)
{
    uint64_t threshold = (0 - (uint64_t)n) % n; /* 2^64 mod n */
    for (;;) {
        uint64_t x = rng_next(s);
        if (x >= threshold)
            return (uint32_t)(x % n);
    }
}

/* Does request q need more blocks than a whole pool (prompt and output)? */
static bool too_big(const sim *s, const fl_req *q)
{
    uint64_t need = ((uint64_t)q->n_prompt + q->n_output + s->bs - 1) / s->bs;
    return need > s->cfg->capacity;
}

/* Ask replica r what it holds of request i: cached[r] and hits[r]. Returns FL_OK or
 * FL_EINTERNAL. */
static int ask(sim *s, uint32_t i, uint32_t r)
{
    const fl_req *q = fl_log_req(s->log, i);
    kvp_namespace ns = fl_log_ns(s->log, q);
    kvp_match m;
    int rc = kvp_lookup_keys(s->rep[r].cache, &ns, q->root, fl_log_keys(s->log, q), NULL,
                             q->n_prompt, NULL, 0, &m);
    if (rc != KVP_OK)
        return req_fail(s, FL_EINTERNAL, i, "kvp_lookup_keys: %s", cli_kvp_error(rc));
    s->cached[r] = m.n_blocks_cached;
    s->hits[r] = too_big(s, q) ? 0 : (uint32_t)m.n_tokens_hit;
    return FL_OK;
}

/* The prompt tokens request q would reuse on a replica holding its first cached blocks:
 * kvp_lookup's rule (at least one prompt token computed), 0 when q is oversize. */
static uint32_t hits_of(const sim *s, const fl_req *q, uint32_t cached)
{
    uint32_t most = (q->n_prompt - 1) / s->bs;
    return too_big(s, q) ? 0 : (cached < most ? cached : most) * s->bs;
}

/* With --check and no event delay: the index must say what every cache says. Overwrites
 * cached[] and hits[] with the caches' (equal) answers. Returns FL_OK or an error. */
static int same_as_oracle(sim *s, uint32_t i)
{
    for (uint32_t r = 0; r < s->n; r++) {
        uint32_t said = s->cached[r];
        int rc = ask(s, i, r);
        if (rc != FL_OK)
            return rc;
        if (said != s->cached[r])
            return req_fail(s, FL_EINTERNAL, i,
                            "the router index says replica %u holds %u blocks, its cache %u", r,
                            said, s->cached[r]);
    }
    return FL_OK;
}

/* Learn what every replica holds of request i (cached[], hits[]): the oracle asks each
 * cache; an index first applies the batches due now, then answers with one score. The query
 * itself is timed (wall clock) into score_ns. Returns FL_OK or an error. */
static int ask_all(sim *s, uint32_t i)
{
    const fl_req *q = fl_log_req(s->log, i);
    int rc = FL_OK;
    if (!cli_grow((void **)&s->score_ns, &s->cap_score, s->n_score + 1, sizeof *s->score_ns))
        return sim_fail(s, FL_ENOMEM, "out of memory");
    if (s->index && (rc = fl_index_sync(s->index, s->now, s->err, s->err_size)) != FL_OK)
        return rc;
    uint64_t t0 = wall_ns(), ns = 0;
    if (s->index)
        rc = fl_index_score(s->index, fl_log_keys(s->log, q), q->n_keys, s->cached, &ns, s->err,
                            s->err_size);
    for (uint32_t r = 0; !s->index && rc == FL_OK && r < s->n; r++)
        rc = ask(s, i, r);
    s->score_ns[s->n_score++] = s->index ? ns : wall_ns() - t0;
    if (rc != FL_OK || !s->index)
        return rc;
    for (uint32_t r = 0; r < s->n; r++)
        s->hits[r] = hits_of(s, q, s->cached[r]);
    return s->cfg->check && s->cfg->index->event_delay == 0 ? same_as_oracle(s, i) : FL_OK;
}

/* The service time of request q with hit prompt tokens reused. Cannot fail (bounded by
 * FL_MAX_TOKENS and FL_MAX_COST_NS: below 2^55). */
static fl_time service(const sim *s, const fl_req *q, uint32_t hit)
{
    return (fl_time)(s->cfg->model.prefill_ns * (q->n_prompt - hit) +
                     s->cfg->model.decode_ns * q->n_output);
}

static void update_work(sim *s)
{
    for (uint32_t r = 0; r < s->n; r++) {
        const fl_rep *p = &s->rep[r];
        s->work[r] =
            (double)p->queued_est + (double)(p->sum_finish - (fl_time)p->in_flight * s->now);
    }
}

int fl_rank_pick(const fl_model *m, int policy, uint32_t prompt_blocks, const uint32_t *cached,
                 const double *work, uint32_t n, uint32_t last, kvp_router_rank_input *scratch,
                 uint32_t *out)
{
    kvp_router_rank_config rc;
    kvp_router_rank_config_init(&rc);
    bool by_cache = policy_scores(policy);
    rc.overlap_weight = by_cache ? m->overlap_weight : 0.0;
    rc.load_cap = policy == FL_CACHE_CAP ? m->load_cap : 0.0;
    rc.start = n ? ((size_t)last + 1) % n : 0;
    for (uint32_t r = 0; r < n; r++) {
        scratch[r].cached = by_cache ? (double)cached[r] : 0.0;
        scratch[r].load = work[r];
    }
    size_t n_order = 0;
    return kvp_router_rank(&rc, prompt_blocks, scratch, n, out, 1, &n_order, NULL) == KVP_OK &&
                   n_order == 1
               ? FL_OK
               : FL_EINTERNAL;
}

/* least-loaded and the cache-aware policies: kvp_router_rank's best replica (fl_rank_pick).
 * Returns FL_OK or an error. */
static int pick_scored(sim *s, uint32_t i, uint32_t *out)
{
    int policy = s->cfg->policy;
    int rc;
    update_work(s);
    if (policy_scores(policy) && (rc = ask_all(s, i)) != FL_OK)
        return rc;
    uint32_t blocks = fl_log_req(s->log, i)->n_keys;
    if ((rc = fl_rank_pick(&s->cfg->model, policy, blocks, s->cached, s->work, s->n, s->last,
                           s->rank_in, out)) != FL_OK)
        return req_fail(s, rc, i, "kvp_router_rank refused the replicas' loads");
    return FL_OK;
}

/* What the ring hashes for q: the key of its prefix of affinity_blocks blocks (or of all
 * its full blocks when it has fewer), else the hash of its partial first block. */
static uint64_t affinity_key(const sim *s, const fl_req *q)
{
    uint32_t k = s->cfg->model.affinity_blocks;
    if (q->n_keys == 0)
        return q->affinity;
    return fl_log_keys(s->log, q)[(k < q->n_keys ? k : q->n_keys) - 1].lo;
}

/* Choose the replica of request i and its estimated service time there. Returns FL_OK or
 * an error. */
static int route(sim *s, uint32_t i, uint32_t *out, fl_time *est)
{
    const fl_req *q = fl_log_req(s->log, i);
    uint32_t r = 0;
    int rc;
    switch (s->cfg->policy) {
    case FL_ROUND_ROBIN:
        r = (uint32_t)(s->n_routed % s->n);
        break;
    case FL_RANDOM:
        r = rng_below(s, s->n);
        break;
    case FL_AFFINITY:
        r = fl_ring_pick(s->ring, affinity_key(s, q));
        break;
    default:
        if ((rc = pick_scored(s, i, &r)) != FL_OK)
            return rc;
        break;
    }
    if (!policy_scores(s->cfg->policy) && (rc = ask(s, i, r)) != FL_OK)
        return rc;
    *est = service(s, q, s->hits[r]);
    s->last = r;
    s->n_routed++;
    *out = r;
    return FL_OK;
}

/* ---- the request's life ------------------------------------------------------------------- */

/* Start request i on its replica now: acquire, schedule commit and finish. Returns FL_OK,
 * RQF_START_WAIT (KVP_ENOSPC: nothing changed), FL_EINPUT (past FL_TIME_MAX), FL_ENOMEM,
 * FL_EINTERNAL. */
static int start(sim *s, uint32_t i)
{
    const fl_req *q = fl_log_req(s->log, i);
    fl_rep *p = &s->rep[s->where[i]];
    kvp_match m;
    memset(&m, 0, sizeof m);
    int rc = KVP_ETOOBIG;
    if (!too_big(s, q)) {
        kvp_namespace ns = fl_log_ns(s->log, q);
        const uint32_t *tokens = fl_log_tokens(s->log, q, s->scratch);
        size_t cap = (size_t)q->n_prompt + q->n_output;
        rc = s->token_forms ? kvp_acquire(p->cache, i, &ns, tokens, q->n_prompt, cap, &m)
                            : kvp_acquire_keys(p->cache, i, &ns, q->root, fl_log_keys(s->log, q),
                                               tokens, q->n_prompt, cap, &m);
    }
    if (rc == KVP_ENOSPC)
        return RQF_START_WAIT;
    if (rc == KVP_ETOOBIG) {
        s->flags[i] |= RQF_OVERSIZE;
        memset(&m, 0, sizeof m);
    } else if (rc != KVP_OK) {
        return req_fail(s, FL_EINTERNAL, i, "kvp_acquire: %s", cli_kvp_error(rc));
    } else {
        s->flags[i] |= RQF_PINNED;
    }
    uint32_t hit = (uint32_t)m.n_tokens_hit;
    int64_t tier_ns = 0; /* what tiers below the pool change in the prefill (fl_tiers.c) */
    if (s->cfg->tiers && !(s->flags[i] & RQF_OVERSIZE) &&
        fl_tier_sim_start(s->cfg->tiers, s->log, i, s->where[i], hit, &tier_ns) != FL_OK)
        return sim_fail(s, FL_ENOMEM, "out of memory");
    fl_time prefill = (fl_time)(s->cfg->model.prefill_ns * (q->n_prompt - hit)) + tier_ns;
    fl_time end = s->now + service(s, q, hit) + tier_ns;
    if (end > FL_TIME_MAX)
        return req_fail(s, FL_EINPUT, i,
                        "the modelled time passes %.0f s: the fleet never catches up (lower the "
                        "per-token costs or add replicas)",
                        (double)FL_TIME_MAX / 1e9);
    if (rq_pinned(s, i) && (rc = heap_push(s, s->now + prefill, i, EV_COMMIT)) != FL_OK)
        return rc;
    if ((rc = heap_push(s, end, i, EV_FINISH)) != FL_OK)
        return rc;
    s->state[i] = RQ_PREFILL;
    s->hit[i] = hit;
    s->start[i] = s->now;
    s->finish[i] = end;
    s->ttft[i] = s->now - q->arrival + prefill;
    p->in_flight++;
    p->sum_finish += end;
    p->st.n_requests++;
    p->st.n_prompt_tokens += q->n_prompt;
    p->st.n_hit_tokens += hit;
    p->st.busy += end - s->now;
    return FL_OK;
}

/* Start queued requests of replica r while it has free slots. Returns FL_OK or an error. */
static int fill_slots(sim *s, uint32_t r)
{
    fl_rep *p = &s->rep[r];
    while (p->in_flight < s->cfg->model.concurrency && p->q_head != FL_NIL) {
        uint32_t i = p->q_head;
        int rc = start(s, i);
        if (rc == RQF_START_WAIT) {
            /* Only in-flight requests pin blocks: with none, the whole pool is free or
             * evictable and a request that fits cannot be refused. */
            if (p->in_flight == 0)
                return req_fail(s, FL_EINTERNAL, i, "no space on an idle replica");
            if (!(s->flags[i] & RQF_WAITED))
                s->n_block_waits++;
            s->flags[i] |= RQF_WAITED;
            return FL_OK;
        }
        if (rc != FL_OK)
            return rc;
        p->q_head = s->next[i];
        if (p->q_head == FL_NIL)
            p->q_tail = FL_NIL;
        p->n_queued--;
        p->queued_est -= s->est[i];
    }
    return FL_OK;
}

/* Route request i and queue it. Returns FL_OK or an error. */
static int arrive(sim *s, uint32_t i)
{
    uint32_t r;
    fl_time est;
    int rc = route(s, i, &r, &est);
    if (rc != FL_OK)
        return rc;
    fl_rep *p = &s->rep[r];
    if (p->queued_est > FL_TIME_MAX * 128 - est)
        return req_fail(s, FL_EINPUT, i,
                        "a replica's queue holds more than %.0f s of work: the fleet never "
                        "catches up (lower the per-token costs or add replicas)",
                        (double)FL_TIME_MAX * 128 / 1e9);
    s->where[i] = r;
    s->est[i] = est;
    s->next[i] = FL_NIL;
    s->state[i] = RQ_QUEUED;
    if (p->q_tail == FL_NIL)
        p->q_head = i;
    else
        s->next[p->q_tail] = i;
    p->q_tail = i;
    p->n_queued++;
    p->queued_est += est;
    return fill_slots(s, r);
}

/* Run one event: a commit or a finish. Returns FL_OK or an error. */
static int handle(sim *s, const fl_event *e)
{
    uint32_t i = e->req;
    const fl_req *q = fl_log_req(s->log, i);
    fl_rep *p = &s->rep[s->where[i]];
    int rc = KVP_OK;
    if (e->kind == EV_COMMIT) {
        const uint32_t *tokens = fl_log_tokens(s->log, q, s->scratch);
        rc = s->token_forms
                 ? kvp_commit(p->cache, i, tokens, q->n_prompt, NULL)
                 : kvp_commit_keys(p->cache, i, fl_log_keys(s->log, q), tokens, q->n_prompt, NULL);
        s->state[i] = RQ_DECODE;
    } else {
        if (rq_pinned(s, i))
            rc = kvp_release(p->cache, i);
        s->flags[i] &= (uint8_t)~RQF_PINNED;
        s->state[i] = RQ_DONE;
        p->in_flight--;
        p->sum_finish -= s->finish[i];
        if (s->finish[i] > s->now)
            return req_fail(s, FL_EINTERNAL, i, "finished early");
    }
    if (rc != KVP_OK)
        return req_fail(s, FL_EINTERNAL, i, "kvp_%s: %s",
                        e->kind == EV_COMMIT ? "commit" : "release", cli_kvp_error(rc));
    return e->kind == EV_FINISH ? fill_slots(s, s->where[i]) : FL_OK;
}

/* ---- invariants --------------------------------------------------------------------------- */

/* Check one replica's queue and in-flight requests against its counters. */
static bool rep_check(const sim *s, uint32_t r)
{
    const fl_rep *p = &s->rep[r];
    uint32_t n = 0, last = FL_NIL;
    fl_time est = 0, fin = 0;
    for (uint32_t i = p->q_head; i != FL_NIL && n <= p->n_queued; i = s->next[i], n++) {
        if (s->state[i] != RQ_QUEUED || s->where[i] != r)
            return false;
        est += s->est[i];
        last = i;
    }
    if (n != p->n_queued || last != p->q_tail || est != p->queued_est)
        return false;
    uint32_t fly = 0, pinned = 0;
    for (size_t i = 0; i < fl_log_n(s->log); i++)
        if (s->state[i] >= RQ_QUEUED && s->where[i] == r && rq_in_flight(s, (uint32_t)i)) {
            fly++;
            pinned += rq_pinned(s, (uint32_t)i);
            fin += s->finish[i];
        }
    size_t active = 0;
    if (kvp_cache_requests(p->cache, NULL, 0, &active) != KVP_OK)
        return false;
    return fly == p->in_flight && fly <= s->cfg->model.concurrency && fin == p->sum_finish &&
           active == pinned && kvp_cache_check(p->cache) == KVP_OK;
}

/* The simulation's invariants (see the file comment). Returns true when they hold. */
static bool sim_check(const sim *s)
{
    for (size_t i = 1; i < s->n_heap; i++)
        if (ev_before(&s->heap[i], &s->heap[(i - 1) / 2]))
            return false;
    for (uint32_t r = 0; r < s->n; r++)
        if (!rep_check(s, r))
            return false;
    return true;
}

/* ---- setup, the loop, the result ---------------------------------------------------------- */

static void sim_free(sim *s)
{
    for (uint32_t r = 0; s->rep && r < s->n; r++)
        kvp_cache_free(s->rep[r].cache);
    fl_index_free(s->index); /* after the caches, which emit no events when freed */
    free(s->score_ns);
    free(s->rep);
    fl_ring_free(s->ring);
    free(s->where);
    free(s->next);
    free(s->est);
    free(s->finish);
    free(s->start);
    free(s->ttft);
    free(s->hit);
    free(s->state);
    free(s->flags);
    free(s->cached);
    free(s->hits);
    free(s->work);
    free(s->rank_in);
    free(s->heap);
    free(s->scratch);
}

/* Allocate the arrays and the replicas' caches. Returns FL_OK or an error. */
static int sim_init(sim *s)
{
    size_t n = fl_log_n(s->log);
    s->where = calloc(n, sizeof *s->where);
    s->next = calloc(n, sizeof *s->next);
    s->est = calloc(n, sizeof *s->est);
    s->finish = calloc(n, sizeof *s->finish);
    s->start = calloc(n, sizeof *s->start);
    s->ttft = calloc(n, sizeof *s->ttft);
    s->hit = calloc(n, sizeof *s->hit);
    s->state = calloc(n, 1);
    s->flags = calloc(n, 1);
    s->cached = calloc(s->n, sizeof *s->cached);
    s->hits = calloc(s->n, sizeof *s->hits);
    s->work = calloc(s->n, sizeof *s->work);
    s->rank_in = calloc(s->n, sizeof *s->rank_in);
    s->rep = calloc(s->n, sizeof *s->rep);
    s->scratch = fl_log_format(s->log) == LOG_MOONCAKE
                     ? calloc(fl_log_max_prompt(s->log), sizeof *s->scratch)
                     : malloc(1);
    if (s->cfg->policy == FL_AFFINITY)
        s->ring = fl_ring_new(s->n, s->cfg->model.vnodes, s->cfg->model.random_seed);
    if (!s->where || !s->next || !s->est || !s->finish || !s->start || !s->ttft || !s->hit ||
        !s->state || !s->flags || !s->cached || !s->hits || !s->work || !s->rank_in || !s->rep ||
        !s->scratch || (s->cfg->policy == FL_AFFINITY && !s->ring))
        return sim_fail(s, FL_ENOMEM, "out of memory");
    kvp_config kc = *s->cfg->cache;
    kc.n_blocks = s->cfg->capacity;
    kc.block_size = s->bs;
    kc.single_threaded = true;
    kc.on_event = NULL;
    const fl_index_config *ic = s->cfg->index;
    if (ic && ic->mode != FL_INDEX_ORACLE && policy_scores(s->cfg->policy)) {
        int rc = fl_index_new(ic, s->n, s->bs, &s->index, s->err, s->err_size);
        if (rc != FL_OK)
            return rc;
    }
    for (uint32_t r = 0; r < s->n; r++) {
        s->rep[r].q_head = s->rep[r].q_tail = FL_NIL;
        if (s->index)
            fl_index_attach(s->index, r, &kc);
        int rc = kvp_cache_new(&kc, &s->rep[r].cache);
        if (rc != KVP_OK)
            return sim_fail(s, rc == KVP_ENOMEM ? FL_ENOMEM : FL_EINTERNAL,
                            "cannot create replica %u's cache of %u blocks: %s", r,
                            s->cfg->capacity, cli_kvp_error(rc));
    }
    s->token_forms = kc.hash_profile == KVP_HASH_VLLM_SHA256;
    s->rng = s->cfg->model.random_seed;
    s->last = s->n - 1; /* so the first turn goes to replica 0 */
    return FL_OK;
}

/* Run every arrival and event in time order. Returns FL_OK or an error. */
static int sim_loop(sim *s)
{
    size_t n = fl_log_n(s->log), i = 0;
    while (i < n || s->n_heap > 0) {
        int rc;
        if (s->n_heap > 0 && (i == n || s->heap[0].t <= fl_log_req(s->log, i)->arrival)) {
            fl_event e = heap_pop(s);
            s->now = e.t;
            rc = handle(s, &e);
        } else {
            s->now = fl_log_req(s->log, i)->arrival;
            rc = arrive(s, (uint32_t)i++);
        }
        if (rc != FL_OK)
            return rc;
        if (s->index && (rc = fl_index_step(s->index, s->now, s->err, s->err_size)) != FL_OK)
            return rc;
        if (s->cfg->check && (!sim_check(s) || (s->index && !fl_index_check(s->index))))
            return sim_fail(s, FL_EINTERNAL, "the simulation's invariants failed at %.6f s",
                            (double)s->now / 1e9);
    }
    /* The last steps' events too, so that the index's figures count every event. */
    int rc = s->index ? fl_index_sync(s->index, INT64_MAX, s->err, s->err_size) : FL_OK;
    if (rc != FL_OK)
        return rc;
    for (uint32_t r = 0; r < s->n; r++)
        if (s->rep[r].n_queued || s->rep[r].in_flight)
            return sim_fail(s, FL_EINTERNAL, "replica %u still has requests at the end", r);
    return FL_OK;
}

static int cmp_time(const void *a, const void *b)
{
    fl_time x = *(const fl_time *)a, y = *(const fl_time *)b;
    return (x > y) - (x < y);
}

/* The nearest-rank p-th percentile of sorted[0 .. n), n > 0. */
static fl_time percentile(const fl_time *sorted, size_t n, unsigned p)
{
    size_t rank = (n * p + 99) / 100;
    return sorted[rank ? rank - 1 : 0];
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The index's figures: score percentiles (sorting score_ns in place) and the router's
 * counters. Returns FL_OK or FL_EINTERNAL. */
static int index_result(sim *s, fl_index_stats *st)
{
    memset(st, 0, sizeof *st);
    st->mode = s->cfg->index ? s->cfg->index->mode : FL_INDEX_ORACLE;
    if (s->index && fl_index_stats_get(s->index, st) != FL_OK)
        return sim_fail(s, FL_EINTERNAL, "kvp_router_stats_get failed");
    size_t n = s->n_score;
    st->n_scores = n;
    if (n == 0)
        return FL_OK;
    qsort(s->score_ns, n, sizeof *s->score_ns, cmp_u64);
    st->score_p50_ns = s->score_ns[(n * 50 + 99) / 100 - 1];
    st->score_p99_ns = s->score_ns[(n * 99 + 99) / 100 - 1];
    st->score_max_ns = s->score_ns[n - 1];
    for (size_t i = 0; i < n; i++)
        st->score_ns += s->score_ns[i];
    return FL_OK;
}

/* Fill *out from the finished simulation. Returns FL_OK, FL_ENOMEM or FL_EINTERNAL. */
static int sim_result(sim *s, fl_result *out)
{
    size_t n = fl_log_n(s->log);
    fl_result r;
    memset(&r, 0, sizeof r);
    r.policy = s->cfg->policy;
    r.n_replicas = s->n;
    r.n_requests = n;
    r.n_block_waits = s->n_block_waits;
    int rc = index_result(s, &r.index);
    if (rc != FL_OK)
        return rc;
    fl_time *sorted = malloc(n * sizeof *sorted);
    r.replicas = calloc(s->n, sizeof *r.replicas);
    r.per_req = s->cfg->record ? calloc(n, sizeof *r.per_req) : NULL;
    if (!sorted || !r.replicas || (s->cfg->record && !r.per_req)) {
        free(sorted);
        fl_result_free(&r);
        return sim_fail(s, FL_ENOMEM, "out of memory");
    }
    double sum = 0.0, busy = 0.0, max_busy = 0.0;
    for (size_t i = 0; i < n; i++) {
        sorted[i] = s->ttft[i];
        sum += (double)s->ttft[i];
        r.end = s->finish[i] > r.end ? s->finish[i] : r.end;
        r.n_oversize += (s->flags[i] & RQF_OVERSIZE) != 0;
        if (r.per_req) {
            fl_req_outcome *o = &r.per_req[i];
            o->replica = s->where[i];
            o->hit = s->hit[i];
            o->start = s->start[i];
            o->ttft = s->ttft[i];
            o->oversize = (s->flags[i] & RQF_OVERSIZE) != 0;
        }
    }
    qsort(sorted, n, sizeof *sorted, cmp_time);
    r.ttft_p50 = percentile(sorted, n, 50);
    r.ttft_p99 = percentile(sorted, n, 99);
    r.ttft_mean = sum / (double)n;
    free(sorted);
    for (uint32_t k = 0; k < s->n; k++) {
        r.replicas[k] = s->rep[k].st;
        r.n_prompt_tokens += s->rep[k].st.n_prompt_tokens;
        r.n_hit_tokens += s->rep[k].st.n_hit_tokens;
        busy += (double)s->rep[k].st.busy;
        max_busy = (double)s->rep[k].st.busy > max_busy ? (double)s->rep[k].st.busy : max_busy;
    }
    r.imbalance = busy > 0.0 ? max_busy / (busy / s->n) : 1.0;
    *out = r;
    return FL_OK;
}

int fl_sim_run(const fl_log *log, const fl_sim_config *cfg, fl_result *out, char *err,
               size_t err_size)
{
    sim s;
    memset(&s, 0, sizeof s);
    s.log = log;
    s.cfg = cfg;
    s.n = cfg->n_replicas;
    s.bs = fl_log_block_size(log);
    s.err = err;
    s.err_size = err_size;
    if (s.n == 0 || s.n > FL_MAX_REPLICAS || cfg->policy < 0 || cfg->policy >= FL_N_POLICIES ||
        cfg->model.concurrency == 0 || cfg->capacity == 0 || fl_log_n(log) >= FL_NIL)
        return sim_fail(&s, FL_EINTERNAL, "invalid simulation configuration");
    uint64_t t0 = wall_ns();
    int rc = sim_init(&s);
    if (rc == FL_OK)
        rc = sim_loop(&s);
    if (rc == FL_OK)
        rc = sim_result(&s, out);
    sim_free(&s);
    if (rc == FL_OK)
        out->index.seconds = (double)(wall_ns() - t0) / 1e9;
    return rc;
}

void fl_result_free(fl_result *r)
{
    if (!r)
        return;
    free(r->replicas);
    free(r->per_req);
    r->replicas = NULL;
    r->per_req = NULL;
}
