/*
 * publisher.c - a kvp_cache's events as vLLM KV-event batches: configuration, the event
 * callback that builds wire events, and the flush that publishes them (kvp_publisher_*).
 * Sockets, sends and replay are in publisher_net.c; the state is drawn in publisher.h.
 *
 * Intake. The cache calls kvp_publisher_on_event under its own lock, once per block. A
 * STORED event extends the pending BlockStored when it continues that event's chain (its
 * parent is the full 128-bit key of the event's last block, tokens given or not alike), as
 * vLLM sends one BlockStored per request commit; otherwise it opens a new one whose parent
 * is nil for a chain's first block. Consecutive REMOVED events share one BlockRemoved (vLLM
 * sends one per block; consumers take lists either way). CLEARED is AllBlocksCleared.
 * Every reservation is made before anything is written, so an allocation failure drops
 * exactly the event being taken in and leaves the pending batch consistent.
 *
 * Flush. The pending events become one kvp_kv_batch whose arrays point into the pending
 * storage, encoded into a reused buffer (grown when kvp_kv_encode reports ENOSPC), copied
 * into the replay ring, then sent; only then is the pending storage reset, so a failure
 * before the send keeps everything for the next flush. Cost per flush: O(payload bytes);
 * no allocation in steady state (buffers keep their high-water capacity).
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

#include "codec.h"
#include "publisher.h"

KVP_EXPORT void kvp_publisher_config_init(kvp_publisher_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->endpoint = "tcp://*:5557";
    cfg->topic = "";
    cfg->form = KVP_KV_FORM_ARRAY;
    cfg->buffer_steps = 10000;
    cfg->hwm = 100000;
    cfg->medium = "GPU";
    cfg->group_idx = -1;
}

static int config_valid(const kvp_publisher_config *cfg)
{
    int ev_form = cfg->form & 3;
    if (!cfg->endpoint || (ev_form != KVP_KV_FORM_ARRAY && ev_form != KVP_KV_FORM_MAP) ||
        (cfg->form & ~(3 | KVP_KV_BATCH_MAP)) != 0)
        return KVP_EINVAL;
    if (cfg->hwm < 0 || cfg->dp_rank < 0 || cfg->group_idx < -1 || cfg->linger_ms < -1)
        return KVP_EINVAL;
    if (cfg->replay_endpoint && cfg->buffer_steps == 0)
        return KVP_EINVAL;
    if (cfg->replay_thread && !cfg->replay_endpoint)
        return KVP_EINVAL;
    return KVP_OK;
}

/* A malloc'ed copy of s (NULL stays NULL). Returns false when out of memory. */
static bool dup_str(const char *s, char **out)
{
    *out = NULL;
    if (!s)
        return true;
    size_t n = strlen(s) + 1;
    *out = malloc(n);
    if (!*out)
        return false;
    memcpy(*out, s, n);
    return true;
}

/* Free everything pub holds; the replay thread must be stopped. */
static void destroy(kvp_publisher *pub)
{
    kvp__pub_close(pub);
    kvp__ring_free(pub);
    free(pub->topic);
    free(pub->medium);
    for (unsigned k = 0; k < KVP_MAX_TIERS - 1; k++)
        free(pub->tier_medium[k]);
    free(pub->lora_name);
    free(pub->pev);
    free(pub->ph);
    free(pub->pt);
    free(pub->evs);
    free(pub->enc);
    pthread_mutex_destroy(&pub->replay_mu);
    pthread_mutex_destroy(&pub->mu);
    free(pub);
}

/* Steps 2-4 of kvp_publisher_new: copies, ring, sockets. */
static int publisher_setup(kvp_publisher *pub, const kvp_publisher_config *cfg)
{
    pub->form = cfg->form;
    pub->group_idx = cfg->group_idx;
    pub->dp_rank = cfg->dp_rank;
    pub->flush_at = cfg->batch_max_events && cfg->batch_max_events < KVP_PUBLISHER_MAX_PENDING
                        ? cfg->batch_max_events
                        : KVP_PUBLISHER_MAX_PENDING;
    pub->topic_len = cfg->topic ? strlen(cfg->topic) : 0;
    if (!dup_str(cfg->topic ? cfg->topic : "", &pub->topic) ||
        !dup_str(cfg->medium, &pub->medium) || !dup_str(cfg->lora_name, &pub->lora_name))
        return KVP_ENOMEM;
    for (unsigned k = 0; k < KVP_MAX_TIERS - 1; k++)
        if (!dup_str(cfg->tier_medium[k], &pub->tier_medium[k]))
            return KVP_ENOMEM;
    if (cfg->replay_endpoint) {
        pub->slots = calloc(cfg->buffer_steps, sizeof *pub->slots);
        if (!pub->slots)
            return KVP_ENOMEM;
        pub->ring_cap = cfg->buffer_steps;
    }
    pub->ctx = cfg->zmq_context;
    if (!pub->ctx) {
        pub->ctx = zmq_ctx_new();
        if (!pub->ctx)
            return KVP_EIO;
        pub->own_ctx = true;
    }
    return kvp__pub_open(pub, cfg);
}

/* Steps: 1. validate; 2. allocate and initialise the locks; 3. copy the configuration and
 * make the ring; 4. open the sockets; 5. start the replay thread. */
KVP_EXPORT int kvp_publisher_new(const kvp_publisher_config *cfg, kvp_publisher **out)
{
    /* Step 1: validate. */
    if (!cfg || !out)
        return KVP_EINVAL;
    int rc = config_valid(cfg);
    if (rc != KVP_OK)
        return rc;
    /* Step 2: allocate. */
    kvp_publisher *pub = calloc(1, sizeof *pub);
    if (!pub)
        return KVP_ENOMEM;
    if (pthread_mutex_init(&pub->mu, NULL) != 0) {
        free(pub);
        return KVP_ENOMEM;
    }
    if (pthread_mutex_init(&pub->replay_mu, NULL) != 0) {
        pthread_mutex_destroy(&pub->mu);
        free(pub);
        return KVP_ENOMEM;
    }
    atomic_init(&pub->stop, false);
    /* Steps 3 and 4: configuration, ring, sockets. */
    rc = publisher_setup(pub, cfg);
    /* Step 5: the replay thread. */
    if (rc == KVP_OK && cfg->replay_thread)
        rc = kvp__replay_thread_start(pub);
    if (rc != KVP_OK) {
        destroy(pub);
        return rc;
    }
    *out = pub;
    return KVP_OK;
}

/* Make room for need more elements of size elem at *p (capacity *cap). Returns false when
 * out of memory (nothing changed). */
static bool reserve(void **p, size_t *cap, size_t used, size_t need, size_t elem)
{
    if (*cap - used >= need)
        return true;
    if (need > SIZE_MAX / elem - used)
        return false;
    size_t want = *cap ? *cap : 16;
    while (want < used + need)
        want = want > SIZE_MAX / 2 / elem ? used + need : want * 2;
    void *q = realloc(*p, want * elem);
    if (!q)
        return false;
    *p = q;
    *cap = want;
    return true;
}

static bool key_eq(kvp_key a, kvp_key b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

/* The last pending event when it has type and tier, else NULL. */
static kvp__pev *last_of_type(kvp_publisher *pub, int type, uint8_t tier)
{
    if (pub->n_pev == 0 || pub->pev[pub->n_pev - 1].type != type ||
        pub->pev[pub->n_pev - 1].tier != tier)
        return NULL;
    return &pub->pev[pub->n_pev - 1];
}

/* Reserve one more event, n_hashes hashes and n_tokens tokens. */
static bool reserve_all(kvp_publisher *pub, size_t n_hashes, size_t n_tokens)
{
    return reserve((void **)&pub->pev, &pub->cap_pev, pub->n_pev, 1, sizeof *pub->pev) &&
           reserve((void **)&pub->ph, &pub->cap_ph, pub->n_ph, n_hashes, sizeof *pub->ph) &&
           reserve((void **)&pub->pt, &pub->cap_pt, pub->n_pt, n_tokens, sizeof *pub->pt);
}

/* A new pending event of type at the current ends of ph and pt (capacity reserved). */
static kvp__pev *open_event(kvp_publisher *pub, int type)
{
    kvp__pev *e = &pub->pev[pub->n_pev++];
    memset(e, 0, sizeof *e);
    e->type = type;
    e->hash_off = pub->n_ph;
    e->tok_off = pub->n_pt;
    return e;
}

static int intake_stored(kvp_publisher *pub, const kvp_event *ev)
{
    bool has_tokens = ev->tokens != NULL;
    size_t n_tok = has_tokens ? ev->n_tokens : 0;
    if (!reserve_all(pub, 1, n_tok))
        return KVP_ENOMEM;
    kvp__pev *e = last_of_type(pub, KVP_EVENT_STORED, ev->tier);
    if (!e || ev->parent_is_root || !key_eq(e->last_key, ev->parent) ||
        e->has_tokens != has_tokens || e->bsize != ev->n_tokens) {
        e = open_event(pub, KVP_EVENT_STORED);
        e->has_parent = !ev->parent_is_root;
        e->parent = ev->parent.lo;
        e->has_tokens = has_tokens;
        e->bsize = ev->n_tokens;
        e->tier = ev->tier;
    }
    pub->ph[pub->n_ph++] = ev->key.lo;
    e->n_hashes++;
    if (n_tok) {
        memcpy(pub->pt + pub->n_pt, ev->tokens, n_tok * sizeof *pub->pt);
        pub->n_pt += n_tok;
        e->n_tokens += n_tok;
    }
    e->last_key = ev->key;
    return KVP_OK;
}

static int intake_locked(kvp_publisher *pub, const kvp_event *ev)
{
    if (ev->type == KVP_EVENT_STORED)
        return intake_stored(pub, ev);
    if (!reserve_all(pub, 1, 0))
        return KVP_ENOMEM;
    if (ev->type == KVP_EVENT_CLEARED) {
        open_event(pub, KVP_EVENT_CLEARED);
        return KVP_OK;
    }
    kvp__pev *e = last_of_type(pub, KVP_EVENT_REMOVED, ev->tier);
    if (!e) {
        e = open_event(pub, KVP_EVENT_REMOVED);
        e->tier = ev->tier;
    }
    pub->ph[pub->n_ph++] = ev->key.lo;
    e->n_hashes++;
    return KVP_OK;
}

/* The wire form of pending event e. */
static kvp_kv_event wire_event(const kvp_publisher *pub, const kvp__pev *e)
{
    kvp_kv_event w;
    memset(&w, 0, sizeof w);
    w.type = e->type;
    w.group_idx = e->type == KVP_EVENT_CLEARED ? -1 : pub->group_idx;
    if (e->type == KVP_EVENT_CLEARED)
        return w;
    w.hashes = pub->ph + e->hash_off;
    w.n_hashes = e->n_hashes;
    w.medium = e->tier ? pub->tier_medium[e->tier - 1] : pub->medium;
    if (e->type == KVP_EVENT_REMOVED)
        return w;
    w.has_parent = e->has_parent;
    w.parent = e->parent;
    w.tokens = pub->pt + e->tok_off;
    w.n_tokens = e->n_tokens;
    w.block_size = e->bsize;
    w.lora_name = pub->lora_name;
    return w;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Encode the pending events as a batch into pub->enc; *len its size. KVP_OK or
 * KVP_ENOMEM. */
static int encode_pending_locked(kvp_publisher *pub, size_t *len)
{
    if (!reserve((void **)&pub->evs, &pub->cap_evs, 0, pub->n_pev, sizeof *pub->evs))
        return KVP_ENOMEM;
    for (size_t i = 0; i < pub->n_pev; i++)
        pub->evs[i] = wire_event(pub, &pub->pev[i]);
    kvp_kv_batch b;
    memset(&b, 0, sizeof b);
    b.ts = now_seconds();
    b.events = pub->evs;
    b.n_events = pub->n_pev;
    b.has_dp_rank = true;
    b.dp_rank = pub->dp_rank;
    int rc = kvp_kv_encode(&b, pub->form, pub->enc, pub->cap_enc, len);
    if (rc == KVP_ENOSPC) {
        if (!reserve((void **)&pub->enc, &pub->cap_enc, 0, *len, 1))
            return KVP_ENOMEM;
        rc = kvp_kv_encode(&b, pub->form, pub->enc, pub->cap_enc, len);
    }
    assert(rc == KVP_OK);
    return rc;
}

/* Steps: 1. encode; 2. keep the batch for replay under its sequence number (one more when
 * events were lost); 3. send; 4. reset the pending storage and count. */
static int flush_locked(kvp_publisher *pub)
{
    if (pub->n_pev == 0)
        return KVP_OK;
    /* Step 1: encode. */
    size_t len = 0;
    int rc = encode_pending_locked(pub, &len);
    if (rc != KVP_OK)
        return rc;
    /* Step 2: keep for replay. */
    uint64_t seq = pub->next_seq + (pub->lost ? 1 : 0);
    rc = kvp__ring_push_locked(pub, seq, pub->enc, len);
    if (rc != KVP_OK)
        return rc;
    /* Step 3: send. */
    rc = kvp__pub_send_locked(pub, seq, pub->enc, len);
    if (rc != KVP_OK)
        pub->st.n_send_errors++;
    /* Step 4: reset and count. */
    pub->next_seq = seq + 1;
    pub->lost = false;
    pub->st.n_batches++;
    pub->st.n_events += pub->n_pev;
    pub->st.n_bytes += len;
    pub->n_pev = pub->n_ph = pub->n_pt = 0;
    pub->n_pending = 0;
    return rc;
}

KVP_EXPORT void kvp_publisher_on_event(void *ud, const kvp_event *ev)
{
    kvp_publisher *pub = ud;
    if (!pub || !ev || ev->type < KVP_EVENT_STORED || ev->type > KVP_EVENT_CLEARED)
        return;
    /* A lower tier's event is published only under the medium configured for it. */
    if (ev->tier && (ev->tier >= KVP_MAX_TIERS || !pub->tier_medium[ev->tier - 1]))
        return;
    pthread_mutex_lock(&pub->mu);
    if (intake_locked(pub, ev) != KVP_OK) {
        pub->st.n_dropped++;
        pub->lost = true;
        pub->sticky = KVP_ENOMEM;
    } else {
        pub->st.n_cache_events++;
        pub->n_pending++;
        if (pub->n_pending >= pub->flush_at)
            (void)flush_locked(pub);
    }
    pthread_mutex_unlock(&pub->mu);
}

KVP_EXPORT int kvp_publisher_attach(kvp_publisher *pub, kvp_config *cfg)
{
    if (!pub || !cfg)
        return KVP_EINVAL;
    cfg->on_event = kvp_publisher_on_event;
    cfg->event_ud = pub;
    return KVP_OK;
}

KVP_EXPORT int kvp_publisher_flush(kvp_publisher *pub)
{
    if (!pub)
        return KVP_EINVAL;
    pthread_mutex_lock(&pub->mu);
    int rc = flush_locked(pub);
    if (rc == KVP_OK && pub->sticky != KVP_OK) {
        rc = pub->sticky;
        pub->sticky = KVP_OK;
    }
    pthread_mutex_unlock(&pub->mu);
    return rc;
}

KVP_EXPORT void kvp_publisher_free(kvp_publisher *pub)
{
    if (!pub)
        return;
    pthread_mutex_lock(&pub->mu);
    (void)flush_locked(pub);
    pthread_mutex_unlock(&pub->mu);
    kvp__replay_thread_stop(pub);
    destroy(pub);
}

KVP_EXPORT int kvp_publisher_poll(kvp_publisher *pub, int timeout_ms)
{
    if (!pub || !pub->replay || pub->has_thread)
        return KVP_EINVAL;
    return kvp__replay_serve(pub, timeout_ms);
}

KVP_EXPORT int kvp_publisher_stats_get(kvp_publisher *pub, kvp_publisher_stats *out)
{
    if (!pub || !out)
        return KVP_EINVAL;
    pthread_mutex_lock(&pub->mu);
    *out = pub->st;
    out->next_seq = pub->next_seq + (pub->lost ? 1 : 0);
    out->n_pending = pub->n_pending;
    out->n_buffered = pub->ring_n;
    pthread_mutex_unlock(&pub->mu);
    return KVP_OK;
}

/* The pending events tile ph[0 .. n_ph) and pt[0 .. n_pt) in order, and every cache event
 * taken in since the last batch added one hash or one AllBlocksCleared. */
static bool pending_ok(const kvp_publisher *pub)
{
    size_t h = 0, t = 0, n_cleared = 0;
    for (size_t i = 0; i < pub->n_pev; i++) {
        const kvp__pev *e = &pub->pev[i];
        bool cleared = e->type == KVP_EVENT_CLEARED;
        if (e->type < KVP_EVENT_STORED || e->type > KVP_EVENT_CLEARED || e->hash_off != h ||
            e->tok_off != t || cleared != (e->n_hashes == 0) ||
            e->n_tokens != (e->has_tokens ? e->n_hashes * e->bsize : 0))
            return false;
        h += e->n_hashes;
        t += e->n_tokens;
        n_cleared += cleared;
    }
    return h == pub->n_ph && t == pub->n_pt && pub->n_pending == h + n_cleared;
}

/* The ring's batches have increasing sequence numbers below next_seq. */
static bool ring_ok(const kvp_publisher *pub)
{
    if (pub->ring_n > pub->ring_cap || (pub->ring_cap && pub->ring_head >= pub->ring_cap))
        return false;
    for (uint32_t i = 0; i < pub->ring_n; i++) {
        const kvp__slot *s = &pub->slots[(pub->ring_head + i) % pub->ring_cap];
        const kvp__slot *prev = i ? &pub->slots[(pub->ring_head + i - 1) % pub->ring_cap] : NULL;
        if (s->len > s->cap || !s->data || (prev && prev->seq >= s->seq) || s->seq >= pub->next_seq)
            return false;
    }
    return true;
}

int kvp__publisher_check(kvp_publisher *pub)
{
    pthread_mutex_lock(&pub->mu);
    bool ok =
        pending_ok(pub) && ring_ok(pub) && (pub->sticky == KVP_OK || pub->sticky == KVP_ENOMEM);
    pthread_mutex_unlock(&pub->mu);
    return ok ? KVP_OK : KVP_ECORRUPT;
}
