/*
 * fuzz_ops.c - libFuzzer harness: the cache's whole state machine against the reference
 * model (tests/lib/refmodel.c), with invalid arguments, re-entrant calls from callbacks and
 * injected allocation failures.
 *
 * An input decodes to a cache shape (1..32 blocks of 1..4, 16, 1021 or 1500 tokens - see
 * fz_block_size -, a random 64-bit seed, verify_tokens on or off, events on or off,
 * re-entrant callback probes on or off, the eviction policy: the shape byte's low two bits,
 * a 3-bit mode, the shape byte's low two bits plus bit 3 of the block-size byte (which
 * fz_block_size reads mod 8) as bit 2: 0 LRU, 1 SLRU, 2 S3-FIFO, 3 CDECAY (its tau 5 when
 * the pool's size is a multiple of 3, so that learned odds reorder blocks within a few
 * requests), 4..7 the same policies with retention priorities (4: LRU with retention); the
 * orphan count on with the shape's bit 6) and up to OPS_MAX_STEPS steps. With retention,
 * every kvp_access and kvp_access_ids is the _retained form and every kvp_release of an
 * active request is preceded by kvp_request_set_retention, with options derived from the
 * call (priority, duration, one range); the model is not consulted then, as under SLRU,
 * S3-FIFO and CDECAY (test_retention.c has the model of the priorities). A
 * step is one of: kvp_lookup, kvp_acquire, kvp_grow, kvp_commit, kvp_release, kvp_access,
 * kvp_lookup_ids, kvp_access_ids, kvp_cache_reset; a battery of calls with invalid
 * arguments (NULL cache, NULL pointers, invalid namespaces, bad configs, n_tokens 0, huge
 * counts); or "fail allocation k of the next step". Arguments are often invalid on
 * purpose: NULL namespace/tokens/out/ids, a field with ptr NULL and len > 0, n_tokens 0,
 * 2^32 blocks, unknown request ids (so double releases), commits past the capacity or
 * shorter than what is committed, n_ids that match neither floor nor ceil of the prompt.
 * Prompts are prefixes of three base sequences over 4 tokens (48 tokens for blocks of 1..4,
 * 7 blocks of 16, 4 larger blocks; sometimes mutated, sometimes a prefix of an active
 * request's own sequence), so hits, dedup, eviction, stale blocks and (in verify mode)
 * replacements are all common; commits decode up to 7 tokens (7/4 of a block past 4).
 *
 * Oracle. The model answers every valid call; the harness itself knows the answers the
 * model does not cover (which invalid argument each call rejects first, KVP_EOVERFLOW,
 * verify mode's KVP_EINVAL for the _ids calls). External ids are modelled exactly: the
 * harness derives id i from the prefix up to block i (as the contract requires), and the
 * model sees the same prompt with the top bit set in every token, a token space no token
 * call uses, just as external keys are domain-separated from token keys in the library.
 * The model evicts as LRU does, so under SLRU and S3-FIFO (whose victims differ, and with
 * them every later hit, dedup and count) the model is not consulted: a valid call must
 * still never fail but for the codes its arguments or the pool's state allow, the pool's
 * counts must add up, the requests the harness saw acquired must hold their blocks, and
 * kvp_cache_check (each policy's checker with it) must pass after every step. Under LRU,
 * after every step:
 *   - the return code equals the expected one, and on success the match (n_tokens,
 *     n_blocks_full, n_blocks_cached, n_blocks_hit, n_tokens_hit) and n_stored too;
 *   - every kvp_stats counter equals the model's, each active request holds as many blocks
 *     as in the model (kvp_request_blocks), and kvp_cache_check passes;
 *   - with events on: a STORED block was not indexed and a REMOVED one was; STORED events
 *     match the n_blocks_stored increase, EVICTED ones n_evictions, REPLACED ones the
 *     model's replacements, RESET ones the cached blocks dropped; CLEARED comes only from a
 *     reset that leaves nothing indexed; every hit id kvp_lookup returns is indexed;
 *   - with probes on, each callback calls one API function on the cache, which must return
 *     KVP_EBUSY (kvp_cache_free must be ignored);
 *   - an armed allocation failure that the call reached must make it return KVP_ENOMEM and
 *     change nothing (stats, events, check); the harness then repeats the call without the
 *     failure and compares that with the model. KVP_ENOMEM without an injected failure is
 *     a failure. kvp_cache_new is also run with each of its allocations failing in turn.
 *   - at the end, kvp_cache_free returns every byte to the allocator, whose hooks also
 *     check that each free passes the size given to alloc.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "refmodel.h"

#define OPS_MAX_STEPS 160                  /* steps decoded from one input */
#define OPS_N_IDS     6                    /* request ids the steps use (plus one never acquired) */
#define OPS_MAX_SEQ   8192                 /* longest request sequence, any block size */
#define OPS_MAX_KEYS  64                   /* most full blocks in a sequence */
#define OPS_N_NS      3                    /* namespaces per input */
#define OPS_SHADOW    UINT32_C(0x80000000) /* token bit that marks _ids calls in the model */

static const uint64_t req_ids[OPS_N_IDS + 1] = {1, 2, 3, 0, UINT64_MAX, 42, 7777};

enum {
    K_LOOKUP,
    K_ACQUIRE,
    K_GROW,
    K_COMMIT,
    K_RELEASE,
    K_ACCESS,
    K_LOOKUP_IDS,
    K_ACCESS_IDS,
    K_RESET,
    K_INVALID,
    K_ARM,
    N_KINDS
};
static const char *const kind_names[N_KINDS] = {"lookup",  "acquire", "grow",       "commit",
                                                "release", "access",  "lookup_ids", "access_ids",
                                                "reset",   "invalid", "arm"};

/* One decoded call. */
typedef struct ops_call {
    int kind;                     /* K_* */
    int ns;                       /* namespace index; -1: NULL; -2: invalid field */
    int req;                      /* index into req_ids */
    uint32_t tokens[OPS_MAX_SEQ]; /* the prompt, or the commit's sequence */
    size_t n_tokens;              /* tokens given (may exceed the array only when huge) */
    bool null_tokens;             /* pass NULL for tokens (or ids) */
    bool null_out;                /* pass NULL for the match (or n_stored) */
    bool huge;                    /* n_tokens or n_capacity of 2^32 blocks or more */
    size_t cap;                   /* lookup: block_ids capacity */
    bool null_ids_buf;            /* lookup: NULL block_ids with cap */
    size_t n_capacity;            /* acquire, grow */
    size_t n_ids;                 /* _ids calls: ids given */
} ops_call;

/* The outcome of a call, compared with the model's. */
typedef struct ops_res {
    int rc;
    kvp_match m;
    size_t n_stored;
} ops_res;

typedef struct ops_req {
    uint32_t seq[OPS_MAX_SEQ]; /* the request's sequence: prompt, then decoded tokens */
    size_t n_seq;              /* tokens in seq; 0 when idle */
    int ns;                    /* its namespace */
} ops_req;

typedef struct ops_world {
    kvp_cache *c;                             /* the cache under test */
    rm_model *m;                              /* the reference model */
    fz_alloc alloc;                           /* the cache's allocator */
    uint32_t n_blocks, bs;                    /* shape */
    bool verify, events, probes;              /* modes */
    int eviction;                             /* KVP_EVICT_*: the model applies to LRU only */
    bool retain;                              /* retention priorities: the model is not used */
    fz_ns ns[OPS_N_NS];                       /* namespaces */
    kvp_namespace bad_ns;                     /* a field with ptr NULL and len 1 */
    fz_keys keys;                             /* the cache's seed */
    size_t base_len;                          /* tokens in each base sequence */
    size_t max_seq;                           /* longest request sequence here */
    uint32_t bases[3][OPS_MAX_SEQ];           /* prompts are cut from these */
    ops_req reqs[OPS_N_IDS + 1];              /* harness view of each request id */
    uint8_t *indexed;                         /* events: 1 while a block is indexed */
    uint64_t ev_stored, ev_evicted, ev_reset; /* events seen, by kind */
    uint64_t ev_replaced, ev_cleared;
    uint64_t ev_total; /* every event */
    uint64_t probe;    /* which API function the next probe calls */
    bool in_reset;     /* CLEARED is legal now */
    size_t step;       /* for messages */
    const char *op;
} ops_world;

/* Is the model's answer the library's? Only under LRU (see the top of this file). */
static bool modelled(const ops_world *w)
{
    return w->eviction == KVP_EVICT_LRU && !w->retain;
}

/* Retention options derived from call k (retention mode): a priority and duration, and one
 * range of the first min(n_range, 2 blocks) tokens (none when n_range is 0). */
static kvp_retention options_for(const ops_world *w, const ops_call *k, size_t n_range,
                                 kvp_retention_range *g)
{
    kvp_retention r;
    kvp_retention_init(&r);
    r.priority = (uint32_t)((k->n_tokens * 37 + (size_t)k->req * 11) % 101);
    r.duration = k->n_tokens % 5;
    if (n_range > 0) {
        g->token_start = 0;
        g->token_end = n_range < 2 * (size_t)w->bs ? n_range : 2 * (size_t)w->bs;
        g->priority = (uint32_t)((k->n_tokens * 13) % 101);
        g->duration = (k->n_tokens % 3) * 2;
        r.ranges = g;
        r.n_ranges = 1;
    }
    return r;
}

static bool shadow_ok(const ops_world *w)
{
    return !w->verify;
}

/* ---------------------------------------------------------------------------------------- */
/* Events and re-entrant probes                                                             */
/* ---------------------------------------------------------------------------------------- */

static void probe(ops_world *w)
{
    kvp_cache *c = w->c;
    const kvp_namespace *ns = &w->ns[0].ns;
    uint32_t t[2] = {1, 2};
    kvp_key ids[2] = {{1, 2}, {3, 4}};
    kvp_match m;
    kvp_stats st;
    const uint32_t *blocks;
    size_t n;
    int rc;
    switch (w->probe++ % 13) {
    case 0:
        rc = kvp_lookup(c, ns, t, 2, NULL, 0, &m);
        break;
    case 1:
        rc = kvp_acquire(c, 99, ns, t, 2, 0, &m);
        break;
    case 2:
        rc = kvp_commit(c, 1, t, 2, NULL);
        break;
    case 3:
        rc = kvp_release(c, 1);
        break;
    case 4:
        rc = kvp_grow(c, 1, 8);
        break;
    case 5:
        rc = kvp_access(c, ns, t, 2, &m);
        break;
    case 6:
        rc = kvp_lookup_ids(c, ns, ids, 2, 2 * w->bs, NULL, 0, &m);
        break;
    case 7:
        rc = kvp_access_ids(c, ns, ids, 2, 2 * w->bs, &m);
        break;
    case 8:
        rc = kvp_cache_reset(c);
        break;
    case 9:
        rc = kvp_cache_stats(c, &st);
        break;
    case 10:
        rc = kvp_cache_check(c);
        break;
    case 11:
        rc = kvp_request_blocks(c, 1, &blocks, &n);
        break;
    default:
        kvp_cache_free(c); /* must be ignored: ASan reports the use after free otherwise */
        rc = KVP_EBUSY;
        break;
    }
    FZ_ASSERT(rc == KVP_EBUSY, "step %zu %s: re-entrant call %llu from a callback returned %d",
              w->step, w->op, (unsigned long long)((w->probe - 1) % 13), rc);
}

static void on_event(void *ud, const kvp_event *ev)
{
    ops_world *w = ud;
    w->ev_total++;
    if (w->probes)
        probe(w);
    switch (ev->type) {
    case KVP_EVENT_STORED:
        FZ_ASSERT(ev->block_id < w->n_blocks && !w->indexed[ev->block_id],
                  "step %zu %s: STORED block %u is out of range or already indexed", w->step, w->op,
                  ev->block_id);
        FZ_ASSERT(ev->n_tokens == w->bs && ev->reason == 0, "step %zu %s: STORED fields", w->step,
                  w->op);
        w->indexed[ev->block_id] = 1;
        w->ev_stored++;
        break;
    case KVP_EVENT_REMOVED:
        FZ_ASSERT(ev->block_id < w->n_blocks && w->indexed[ev->block_id],
                  "step %zu %s: REMOVED block %u is out of range or not indexed", w->step, w->op,
                  ev->block_id);
        w->indexed[ev->block_id] = 0;
        if (ev->reason == KVP_REMOVED_EVICTED)
            w->ev_evicted++;
        else if (ev->reason == KVP_REMOVED_RESET)
            w->ev_reset++;
        else if (ev->reason == KVP_REMOVED_REPLACED)
            w->ev_replaced++;
        else
            fz_fail("step %zu %s: REMOVED with reason %d", w->step, w->op, ev->reason);
        break;
    case KVP_EVENT_CLEARED:
        FZ_ASSERT(w->in_reset, "step %zu %s: CLEARED outside kvp_cache_reset", w->step, w->op);
        for (uint32_t b = 0; b < w->n_blocks; b++)
            FZ_ASSERT(!w->indexed[b], "step %zu %s: CLEARED while block %u is indexed", w->step,
                      w->op, b);
        w->ev_cleared++;
        break;
    default:
        fz_fail("step %zu %s: event type %d", w->step, w->op, ev->type);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Decoding                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static void make_prompt(ops_world *w, fz_in *in, ops_call *k)
{
    uint8_t b = fz_u8(in);
    const ops_req *r = &w->reqs[b % (OPS_N_IDS + 1)];
    if ((b & 0x18) == 0 && r->n_seq > 0) {
        /* A prefix of an active request's own sequence, in its namespace: the request's
         * later commit deduplicates against these blocks (stale blocks in verify mode). */
        k->ns = r->ns;
        k->n_tokens = 1 + fz_below(in, r->n_seq);
        memcpy(k->tokens, r->seq, k->n_tokens * sizeof(uint32_t));
        return;
    }
    const uint32_t *base = w->bases[(b >> 5) % 3];
    if (w->bs <= 4)
        k->n_tokens = 1 + fz_below(in, (b & 0x80) ? 2 * w->bs + 1 : w->base_len);
    else
        k->n_tokens = fz_prompt_len(in, w->bs, (b & 0x80) ? 2 : w->base_len / w->bs - 1);
    memcpy(k->tokens, base, k->n_tokens * sizeof(uint32_t));
    if ((b & 7) == 0)
        k->tokens[fz_below(in, k->n_tokens)] = (uint32_t)fz_below(in, 4);
}

/* Decode one call. Argument faults come from one byte so that most calls are valid. */
static void decode_call(ops_world *w, fz_in *in, ops_call *k)
{
    memset(k, 0, sizeof *k);
    uint8_t op = fz_u8(in);
    k->kind = op % N_KINDS;
    k->req = (int)fz_below(in, OPS_N_IDS + 1);
    uint8_t ns = fz_u8(in);
    k->ns = (int)(ns % OPS_N_NS);
    uint8_t fault = fz_u8(in);
    if (fault >= 232) {
        switch (fault % 6) {
        case 0:
            k->ns = -1;
            break;
        case 1:
            k->ns = -2;
            break;
        case 2:
            k->null_tokens = true;
            break;
        case 3:
            k->null_out = true;
            break;
        case 4:
            k->huge = true;
            break;
        default:
            k->null_ids_buf = true;
            break;
        }
    }
    int ns_kept = k->ns;
    switch (k->kind) {
    case K_LOOKUP:
    case K_ACQUIRE:
    case K_ACCESS:
    case K_LOOKUP_IDS:
    case K_ACCESS_IDS:
        make_prompt(w, in, k);
        if (ns_kept < 0)
            k->ns = ns_kept;
        if (fault >= 226 && fault < 232)
            k->n_tokens = 0;
        k->cap = fz_below(in, w->base_len / w->bs + 2);
        if (k->kind == K_ACQUIRE) {
            uint8_t c = fz_u8(in);
            k->n_capacity =
                c < 64 ? 0 : k->n_tokens + (size_t)(c % 24) * (w->bs > 4 ? w->bs / 8 : 1);
            if (c >= 250)
                k->n_capacity = (size_t)w->n_blocks * w->bs + 1 + c % 3; /* > pool */
        }
        if (k->kind == K_LOOKUP_IDS || k->kind == K_ACCESS_IDS) {
            size_t floor_ids = k->n_tokens / w->bs;
            size_t ceil_ids = floor_ids + (k->n_tokens % w->bs != 0);
            uint8_t c = fz_u8(in);
            k->n_ids = c < 120 ? floor_ids : c < 240 ? ceil_ids : ceil_ids + 1 + c % 2;
        }
        break;
    case K_GROW: {
        uint8_t c = fz_u8(in);
        k->n_capacity = (size_t)(c % 72) * w->max_seq / 64;
        if (c >= 250)
            k->n_capacity = (size_t)w->n_blocks * w->bs + 1 + c % 3;
        break;
    }
    case K_COMMIT: {
        /* The tokens always extend the request's own sequence (or are a prefix of it): the
         * contract requires them to begin with the prompt, and the cache cannot check. */
        const ops_req *r = &w->reqs[k->req];
        uint8_t c = fz_u8(in);
        memcpy(k->tokens, r->seq, r->n_seq * sizeof(uint32_t));
        k->n_tokens = r->n_seq;
        if (r->n_seq == 0) {
            k->tokens[0] = 0; /* an idle id: 0 tokens or one dummy token */
            k->n_tokens = fz_below(in, 2);
        } else if (c < 200) {
            /* Decode up to 7 tokens (the model decides whether the request holds them). */
            size_t n_add = (size_t)(c & 7) * (w->bs > 4 ? w->bs / 4 : 1);
            for (size_t a = 0; a < n_add && k->n_tokens < w->max_seq; a++)
                k->tokens[k->n_tokens++] = (uint32_t)fz_below(in, 4);
        } else {
            k->n_tokens = fz_below(in, k->n_tokens); /* shorter: EINVAL below committed */
        }
        break;
    }
    default:
        break;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Calls                                                                                    */
/* ---------------------------------------------------------------------------------------- */

static const kvp_namespace *ns_ptr(ops_world *w, const ops_call *k)
{
    if (k->ns == -1)
        return NULL;
    if (k->ns == -2)
        return &w->bad_ns;
    return &w->ns[k->ns].ns;
}

/* The ids for an _ids call: id i names the prefix up to block i (chain keys of the prompt
 * under a private seed); a trailing partial block gets an arbitrary id. */
static void make_ids(const ops_world *w, const ops_call *k, kvp_key *ids)
{
    size_t n_keys = 0, n_full = k->n_tokens / w->bs;
    kvp_key zero = {0, 0};
    FZ_ASSERT(kvp_hash_blocks(UINT64_C(0x1d5), zero, k->tokens, k->n_tokens, w->bs, ids,
                              OPS_MAX_KEYS, &n_keys) == KVP_OK,
              "kvp_hash_blocks");
    for (size_t i = n_full; i < k->n_ids && i < OPS_MAX_KEYS + 2; i++) {
        ids[i].lo = 0xabcdef00u + i;
        ids[i].hi = k->n_tokens;
    }
}

/* The size_t n_tokens passed for a huge call: 2^32 blocks (nothing is read past the
 * harness's array: the library must reject the count before touching the tokens). */
static size_t huge_tokens(const ops_world *w)
{
    return ((size_t)UINT32_MAX + 1) * w->bs;
}

static void call_lib(ops_world *w, const ops_call *k, ops_res *res)
{
    const kvp_namespace *ns = ns_ptr(w, k);
    const uint32_t *t = k->null_tokens ? NULL : k->tokens;
    size_t n = k->huge ? huge_tokens(w) : k->n_tokens;
    kvp_match *out = k->null_out ? NULL : &res->m;
    uint64_t id = req_ids[k->req];
    uint32_t ids_buf[OPS_MAX_KEYS + 2];
    kvp_key ids[OPS_MAX_KEYS + 4];
    kvp_retention_range range;
    memset(&res->m, 0xa5, sizeof res->m);
    res->n_stored = 0xa5a5;
    switch (k->kind) {
    case K_LOOKUP:
        res->rc = kvp_lookup(w->c, ns, t, n, k->null_ids_buf ? NULL : ids_buf, k->cap, out);
        if (res->rc == KVP_OK && w->events) {
            size_t n_ids = res->m.n_blocks_hit < k->cap ? res->m.n_blocks_hit : k->cap;
            for (size_t i = 0; i < n_ids; i++)
                FZ_ASSERT(ids_buf[i] < w->n_blocks && w->indexed[ids_buf[i]],
                          "step %zu lookup: hit %zu is block %u, which is not indexed", w->step, i,
                          ids_buf[i]);
        }
        break;
    case K_ACQUIRE:
        res->rc = kvp_acquire(w->c, id, ns, t, n, k->huge ? SIZE_MAX : k->n_capacity, out);
        break;
    case K_GROW:
        res->rc = kvp_grow(w->c, id, k->huge ? SIZE_MAX : k->n_capacity);
        break;
    case K_COMMIT:
        res->rc = kvp_commit(w->c, id, t, k->n_tokens, k->null_out ? NULL : &res->n_stored);
        break;
    case K_RELEASE:
        if (w->retain && w->reqs[k->req].n_seq > 0) {
            /* Token 0 is in every prompt. A failed allocation is the step's outcome. */
            kvp_retention r = options_for(w, k, 1, &range);
            int rc = kvp_request_set_retention(w->c, id, &r);
            FZ_ASSERT(rc == KVP_OK || rc == KVP_ENOMEM, "step %zu release: set_retention %d",
                      w->step, rc);
            if (rc == KVP_ENOMEM) {
                res->rc = rc;
                break;
            }
        }
        res->rc = kvp_release(w->c, id);
        break;
    case K_ACCESS:
        if (w->retain) {
            kvp_retention r = options_for(w, k, k->huge ? 0 : k->n_tokens, &range);
            res->rc = kvp_access_retained(w->c, ns, t, n, &r, out);
        } else {
            res->rc = kvp_access(w->c, ns, t, n, out);
        }
        break;
    case K_LOOKUP_IDS:
    case K_ACCESS_IDS:
        make_ids(w, k, ids);
        if (k->kind == K_LOOKUP_IDS) {
            res->rc = kvp_lookup_ids(w->c, ns, k->null_tokens ? NULL : ids, k->n_ids, n,
                                     k->null_ids_buf ? NULL : ids_buf, k->cap, out);
        } else if (w->retain) {
            kvp_retention r = options_for(w, k, k->huge ? 0 : k->n_tokens, &range);
            res->rc = kvp_access_ids_retained(w->c, ns, k->null_tokens ? NULL : ids, k->n_ids, n,
                                              &r, out);
        } else {
            res->rc = kvp_access_ids(w->c, ns, k->null_tokens ? NULL : ids, k->n_ids, n, out);
        }
        break;
    case K_RESET:
        w->in_reset = true;
        res->rc = kvp_cache_reset(w->c);
        w->in_reset = false;
        break;
    default:
        fz_fail("call_lib: kind %d", k->kind);
    }
}

/* What the library must return for k, from the model for every call it can answer. */
static void call_model(ops_world *w, const ops_call *k, ops_res *res)
{
    const kvp_namespace *ns = ns_ptr(w, k);
    bool ns_ok = ns && k->ns != -2;
    bool active = rm_request_active(w->m, req_ids[k->req]);
    bool prompt_ok = ns_ok && !k->null_tokens && k->n_tokens > 0;
    kvp_match *out = &res->m;
    memset(res, 0, sizeof *res);
    switch (k->kind) {
    case K_LOOKUP:
        if (!prompt_ok)
            res->rc = KVP_EINVAL;
        else if (k->huge)
            res->rc = KVP_EOVERFLOW;
        else if (k->null_out || (k->null_ids_buf && k->cap))
            res->rc = KVP_EINVAL;
        else
            res->rc = rm_lookup(w->m, ns, k->tokens, k->n_tokens, out);
        break;
    case K_ACQUIRE:
        if (!prompt_ok)
            res->rc = KVP_EINVAL;
        else if (k->huge && k->n_tokens > 0)
            res->rc = KVP_EOVERFLOW; /* the prompt's block count is checked first */
        else if (k->null_out)
            res->rc = KVP_EINVAL;
        else if (active)
            res->rc = KVP_EEXIST;
        else
            res->rc =
                rm_acquire(w->m, req_ids[k->req], ns, k->tokens, k->n_tokens, k->n_capacity, out);
        break;
    case K_GROW:
        if (!active)
            res->rc = KVP_ENOENT;
        else if (k->huge)
            res->rc = KVP_EOVERFLOW;
        else
            res->rc = rm_grow(w->m, req_ids[k->req], k->n_capacity);
        break;
    case K_COMMIT:
        if (k->null_tokens && k->n_tokens)
            res->rc = KVP_EINVAL;
        else if (!active)
            res->rc = KVP_ENOENT;
        else
            res->rc = rm_commit(w->m, req_ids[k->req], k->tokens, k->n_tokens,
                                k->null_out ? NULL : &res->n_stored);
        break;
    case K_RELEASE:
        res->rc = rm_release(w->m, req_ids[k->req]);
        break;
    case K_ACCESS:
        if (!prompt_ok)
            res->rc = KVP_EINVAL;
        else if (k->huge)
            res->rc = KVP_EOVERFLOW;
        else if (k->null_out)
            res->rc = KVP_EINVAL;
        else
            res->rc = rm_access(w->m, ns, k->tokens, k->n_tokens, out);
        break;
    case K_LOOKUP_IDS:
    case K_ACCESS_IDS: {
        size_t n_tok = k->huge ? huge_tokens(w) : k->n_tokens;
        size_t floor_ids = n_tok / w->bs, ceil_ids = floor_ids + (n_tok % w->bs != 0);
        bool null_ids = k->null_tokens && k->n_ids > 0;
        if (!ns_ok || null_ids || k->n_tokens == 0)
            res->rc = KVP_EINVAL;
        else if (k->huge)
            res->rc = KVP_EOVERFLOW;
        else if (!shadow_ok(w) || (k->n_ids != floor_ids && k->n_ids != ceil_ids))
            res->rc = KVP_EINVAL;
        else if (k->null_out || (k->kind == K_LOOKUP_IDS && k->null_ids_buf && k->cap))
            res->rc = KVP_EINVAL;
        else {
            static uint32_t shadow[OPS_MAX_SEQ];
            for (size_t i = 0; i < k->n_tokens; i++)
                shadow[i] = k->tokens[i] | OPS_SHADOW;
            if (k->kind == K_LOOKUP_IDS)
                res->rc = rm_lookup(w->m, ns, shadow, k->n_tokens, out);
            else
                res->rc = rm_access(w->m, ns, shadow, k->n_tokens, out);
        }
        break;
    }
    case K_RESET:
        res->rc = rm_reset(w->m);
        break;
    default:
        fz_fail("call_model: kind %d", k->kind);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Comparisons                                                                              */
/* ---------------------------------------------------------------------------------------- */

/* SLRU, S3-FIFO and CDECAY: what holds whichever blocks the policy evicted. */
static void compare_state_unmodelled(ops_world *w, const kvp_stats *s)
{
    FZ_ASSERT(s->n_blocks_orphaned <= s->n_blocks_cached, "step %zu %s: %u orphans of %u cached",
              w->step, w->op, s->n_blocks_orphaned, s->n_blocks_cached);
    FZ_ASSERT(s->n_blocks_free + s->n_blocks_cached + s->n_blocks_in_use == s->n_blocks_total &&
                  s->n_blocks_total == w->n_blocks,
              "step %zu %s: %u free + %u cached + %u in use != %u", w->step, w->op,
              s->n_blocks_free, s->n_blocks_cached, s->n_blocks_in_use, s->n_blocks_total);
    int rc = kvp_cache_check(w->c);
    FZ_ASSERT(rc == KVP_OK, "step %zu %s: kvp_cache_check: %s (%s)", w->step, w->op,
              kvp_strerror(rc), kvp_errmsg());
    uint32_t n_active = 0;
    for (int r = 0; r <= OPS_N_IDS; r++) {
        const uint32_t *ids;
        size_t n = 0;
        bool active = w->reqs[r].n_seq > 0;
        n_active += active;
        rc = kvp_request_blocks(w->c, req_ids[r], &ids, &n);
        FZ_ASSERT(rc == (active ? KVP_OK : KVP_ENOENT), "step %zu %s: request %d: rc %d", w->step,
                  w->op, r, rc);
        for (size_t i = 0; active && i < n; i++)
            FZ_ASSERT(ids[i] < w->n_blocks, "step %zu: request block id %u", w->step, ids[i]);
    }
    FZ_ASSERT(s->n_requests_active == n_active, "step %zu %s: %u requests active, harness %u",
              w->step, w->op, s->n_requests_active, n_active);
    if (w->events)
        FZ_ASSERT(w->ev_stored == s->n_blocks_stored && w->ev_evicted == s->n_evictions,
                  "step %zu %s: STORED/EVICTED events disagree with the stats", w->step, w->op);
}

static void compare_state(ops_world *w)
{
    kvp_stats s, e;
    FZ_ASSERT(kvp_cache_stats(w->c, &s) == KVP_OK, "kvp_cache_stats");
    if (!modelled(w)) {
        compare_state_unmodelled(w, &s);
        return;
    }
    rm_stats(w->m, &e);
    uint64_t got, want;
    const char *field = rm_stats_diff(&s, &e, &got, &want);
    FZ_ASSERT(field == NULL, "step %zu %s: stats.%s %llu, model %llu", w->step, w->op,
              field ? field : "", (unsigned long long)got, (unsigned long long)want);
    int rc = kvp_cache_check(w->c);
    FZ_ASSERT(rc == KVP_OK, "step %zu %s: kvp_cache_check: %s", w->step, w->op, kvp_strerror(rc));
    for (int r = 0; r <= OPS_N_IDS; r++) {
        const uint32_t *ids;
        size_t n = 0;
        bool active = rm_request_active(w->m, req_ids[r]);
        rc = kvp_request_blocks(w->c, req_ids[r], &ids, &n);
        FZ_ASSERT(rc == (active ? KVP_OK : KVP_ENOENT), "step %zu %s: request %d: rc %d", w->step,
                  w->op, r, rc);
        FZ_ASSERT(!active || n == rm_request_n_blocks(w->m, req_ids[r]),
                  "step %zu %s: request %d holds %zu blocks, model %zu", w->step, w->op, r, n,
                  rm_request_n_blocks(w->m, req_ids[r]));
        for (size_t i = 0; active && i < n; i++)
            FZ_ASSERT(ids[i] < w->n_blocks, "step %zu: request block id %u", w->step, ids[i]);
    }
    if (w->events) {
        FZ_ASSERT(w->ev_stored == s.n_blocks_stored, "step %zu %s: %llu STORED events, stats %llu",
                  w->step, w->op, (unsigned long long)w->ev_stored,
                  (unsigned long long)s.n_blocks_stored);
        FZ_ASSERT(w->ev_evicted == s.n_evictions, "step %zu %s: %llu EVICTED events, stats %llu",
                  w->step, w->op, (unsigned long long)w->ev_evicted,
                  (unsigned long long)s.n_evictions);
        FZ_ASSERT(w->ev_replaced == rm_n_replaced(w->m),
                  "step %zu %s: %llu REPLACED events, model %llu", w->step, w->op,
                  (unsigned long long)w->ev_replaced, (unsigned long long)rm_n_replaced(w->m));
        uint32_t n_indexed = 0;
        for (uint32_t b = 0; b < w->n_blocks; b++)
            n_indexed += w->indexed[b];
        FZ_ASSERT(n_indexed >= s.n_blocks_cached &&
                      n_indexed <= s.n_blocks_cached + s.n_blocks_in_use,
                  "step %zu %s: %u blocks indexed by events, %u cached, %u in use", w->step, w->op,
                  n_indexed, s.n_blocks_cached, s.n_blocks_in_use);
    }
}

static void compare_res(ops_world *w, const ops_call *k, const ops_res *got, const ops_res *exp)
{
    FZ_ASSERT(got->rc == exp->rc, "step %zu %s: rc %d (%s), expected %d (%s)", w->step, w->op,
              got->rc, kvp_strerror(got->rc), exp->rc, kvp_strerror(exp->rc));
    if (got->rc != KVP_OK)
        return;
    bool has_match = k->kind == K_LOOKUP || k->kind == K_ACQUIRE || k->kind == K_ACCESS ||
                     k->kind == K_LOOKUP_IDS || k->kind == K_ACCESS_IDS;
    if (has_match) {
#define M(x)                                                                                       \
    FZ_ASSERT(got->m.x == exp->m.x, "step %zu %s: match." #x " %llu, model %llu", w->step, w->op,  \
              (unsigned long long)got->m.x, (unsigned long long)exp->m.x)
        M(n_tokens);
        M(n_blocks_full);
        M(n_blocks_cached);
        M(n_blocks_hit);
        M(n_tokens_hit);
#undef M
    }
    if (k->kind == K_COMMIT && !k->null_out)
        FZ_ASSERT(got->n_stored == exp->n_stored, "step %zu commit: n_stored %zu, model %zu",
                  w->step, got->n_stored, exp->n_stored);
}

/* Invalid calls that never change anything, each with its fixed answer. */
static void invalid_battery(ops_world *w, fz_in *in)
{
    kvp_cache *c = w->c;
    const kvp_namespace *ns = &w->ns[0].ns;
    uint32_t t[4] = {0, 1, 2, 3};
    kvp_key keys[4], root = {0, 0};
    kvp_match m;
    kvp_stats st;
    const uint32_t *ids;
    size_t n;
    uint8_t b = fz_u8(in);
    int rc = KVP_EINVAL, exp = KVP_EINVAL;
    switch (b % 24) {
    case 0:
        rc = kvp_lookup(NULL, ns, t, 4, NULL, 0, &m);
        break;
    case 1:
        rc = kvp_acquire(NULL, 1, ns, t, 4, 0, &m);
        break;
    case 2:
        rc = kvp_grow(NULL, 1, 4);
        break;
    case 3:
        rc = kvp_commit(NULL, 1, t, 4, NULL);
        break;
    case 4:
        rc = kvp_release(NULL, 1);
        break;
    case 5:
        rc = kvp_access(NULL, ns, t, 4, &m);
        break;
    case 6:
        rc = kvp_lookup_ids(NULL, ns, keys, 1, 1, NULL, 0, &m);
        break;
    case 7:
        rc = kvp_access_ids(NULL, ns, keys, 1, 1, &m);
        break;
    case 8:
        rc = kvp_cache_reset(NULL);
        break;
    case 9:
        rc = kvp_cache_stats(NULL, &st);
        break;
    case 10:
        rc = kvp_cache_stats(c, NULL);
        break;
    case 11:
        rc = kvp_cache_check(NULL);
        break;
    case 12:
        rc = kvp_request_blocks(NULL, 1, &ids, &n);
        break;
    case 13:
        rc = kvp_request_blocks(c, 1, NULL, &n);
        break;
    case 14:
        rc = kvp_request_blocks(c, 1, &ids, NULL);
        break;
    case 15:
        rc = kvp_namespace_key(0, NULL, &root);
        break;
    case 16:
        rc = kvp_namespace_key(0, &w->bad_ns, &root);
        break;
    case 17:
        rc = kvp_namespace_key(0, ns, NULL);
        break;
    case 18:
        rc = kvp_hash_blocks(0, root, t, 4, 1 + (b >> 5), keys, 4, NULL);
        break;
    case 19:
        rc = kvp_hash_blocks(0, root, NULL, 1 + (b >> 5), 1, keys, 4, &n);
        break;
    case 20:
        rc = kvp_hash_blocks(0, root, t, 4, (b & 0x20) ? 0 : KVP_MAX_BLOCK_SIZE + 1, keys, 4, &n);
        break;
    case 21:
        rc = kvp_hash_blocks(0, root, t, 4, 1, NULL, 1, &n);
        break;
    case 22: {
        kvp_config cfg;
        kvp_cache *out = (kvp_cache *)&cfg; /* must stay untouched */
        kvp_config_init(&cfg);
        cfg.n_blocks = (b & 0x20) ? 0 : (UINT32_C(1) << 31) + 1;
        if (b & 0x40) {
            cfg.n_blocks = 4;
            cfg.block_size = (b & 0x80) ? 0 : KVP_MAX_BLOCK_SIZE + 1;
        }
        rc = kvp_cache_new(&cfg, &out);
        FZ_ASSERT(out == (kvp_cache *)&cfg, "kvp_cache_new wrote *out on failure");
        if (rc == KVP_EINVAL)
            rc = kvp_cache_new(NULL, &out);
        if (rc == KVP_EINVAL)
            rc = kvp_cache_new(&cfg, NULL);
        break;
    }
    default: {
        const char *s = kvp_strerror((int)(int8_t)fz_u8(in));
        FZ_ASSERT(s != NULL && s[0] != '\0', "kvp_strerror");
        FZ_ASSERT(strcmp(kvp_version(), KVP_VERSION_STRING) == 0, "kvp_version");
        kvp_cache_free(NULL);
        kvp_config_init(NULL);
        kvp_namespace_init(NULL);
        rc = exp = KVP_OK;
        break;
    }
    }
    FZ_ASSERT(rc == exp, "step %zu invalid call %d: rc %d (%s), expected %d", w->step, b % 24, rc,
              kvp_strerror(rc), exp);
}

/* ---------------------------------------------------------------------------------------- */
/* The run                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* kvp_cache_new with allocation k failing, for k = 0, 1, ... until it succeeds: every
 * failure must be KVP_ENOMEM with *out untouched and nothing left allocated. */
static kvp_cache *new_cache_failing(ops_world *w, kvp_config *cfg)
{
    for (int64_t k = 0;; k++) {
        kvp_cache *c = (kvp_cache *)cfg;
        w->alloc.fail_in = k;
        uint64_t failed = w->alloc.n_failed;
        int rc = kvp_cache_new(cfg, &c);
        w->alloc.fail_in = -1;
        if (rc == KVP_OK) {
            FZ_ASSERT(w->alloc.n_failed == failed, "kvp_cache_new survived a failed allocation");
            return c;
        }
        FZ_ASSERT(rc == KVP_ENOMEM && w->alloc.n_failed == failed + 1,
                  "kvp_cache_new with allocation %lld failing: %s", (long long)k, kvp_strerror(rc));
        FZ_ASSERT(c == (kvp_cache *)cfg, "kvp_cache_new wrote *out on failure");
        fz_alloc_check_empty(&w->alloc, "failed kvp_cache_new");
        FZ_ASSERT(k < 64, "kvp_cache_new never succeeds");
    }
}

static void step(ops_world *w, fz_in *in, int64_t *armed)
{
    static ops_call k;
    decode_call(w, in, &k);
    w->op = kind_names[k.kind];
    if (k.kind == K_ARM) {
        *armed = (int64_t)fz_below(in, 4);
        return;
    }
    if (k.kind == K_INVALID) {
        invalid_battery(w, in);
        compare_state(w);
        return;
    }
    kvp_stats before, after;
    FZ_ASSERT(kvp_cache_stats(w->c, &before) == KVP_OK, "kvp_cache_stats");
    uint64_t ev_before = w->ev_total, failed = w->alloc.n_failed;
    ops_res got, exp;
    w->alloc.fail_in = *armed;
    call_lib(w, &k, &got);
    w->alloc.fail_in = -1;
    bool injected = w->alloc.n_failed != failed;
    if (*armed >= 0) {
        *armed = -1;
        FZ_ASSERT(!injected || got.rc == KVP_ENOMEM,
                  "step %zu %s: an allocation failed but the call returned %d (%s)", w->step, w->op,
                  got.rc, kvp_strerror(got.rc));
        if (injected) {
            FZ_ASSERT(kvp_cache_stats(w->c, &after) == KVP_OK &&
                          memcmp(&before, &after, sizeof before) == 0,
                      "step %zu %s: KVP_ENOMEM changed the statistics", w->step, w->op);
            FZ_ASSERT(w->ev_total == ev_before, "step %zu %s: KVP_ENOMEM emitted events", w->step,
                      w->op);
            compare_state(w); /* the model has not seen the call: nothing may differ */
            call_lib(w, &k, &got);
        }
    }
    FZ_ASSERT(got.rc != KVP_ENOMEM, "step %zu %s: KVP_ENOMEM without an injected failure", w->step,
              w->op);
    if (modelled(w)) {
        call_model(w, &k, &exp);
        compare_res(w, &k, &got, &exp);
    } else {
        FZ_ASSERT(got.rc == KVP_OK || got.rc == KVP_EINVAL || got.rc == KVP_ENOENT ||
                      got.rc == KVP_EEXIST || got.rc == KVP_ENOSPC || got.rc == KVP_EOVERFLOW ||
                      got.rc == KVP_ERANGE || got.rc == KVP_ETOKEN || got.rc == KVP_ETOOBIG,
                  "step %zu %s: rc %d (%s)", w->step, w->op, got.rc, kvp_strerror(got.rc));
    }
    if (got.rc == KVP_OK) {
        ops_req *r = &w->reqs[k.req];
        if (k.kind == K_ACQUIRE) {
            memcpy(r->seq, k.tokens, k.n_tokens * sizeof(uint32_t));
            r->n_seq = k.n_tokens;
            r->ns = k.ns;
        } else if (k.kind == K_COMMIT && k.n_tokens > r->n_seq) {
            memcpy(r->seq, k.tokens, k.n_tokens * sizeof(uint32_t));
            r->n_seq = k.n_tokens;
        } else if (k.kind == K_RELEASE) {
            r->n_seq = 0;
        }
    }
    compare_state(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_harness = "fuzz_ops";
    static ops_world w;
    fz_in in = {data, size};
    memset(&w, 0, sizeof w);
    uint8_t shape = fz_u8(&in);
    uint8_t mode = (uint8_t)((shape & 3) | (in.n > 0 && (in.p[0] & 8) ? 4 : 0));
    w.bs = fz_block_size(&in);                         /* reads the byte peeked above, mod 8 */
    fz_keys_decode(&in, &w.keys, FZ_PROFILES_NO_VLLM); /* the model knows no KVP_ENOTSUP */
    w.base_len = w.bs <= 4 ? 48 : (size_t)(w.bs <= 16 ? 7 : 4) * w.bs;
    w.max_seq = w.bs <= 4 ? 64 : w.base_len + w.bs;
    w.verify = (shape & 4) != 0;
    w.events = (shape & 0x18) != 0;
    w.probes = w.events && (shape & 0x20) != 0;
    w.eviction = (mode & 3) == 1   ? KVP_EVICT_SLRU
                 : (mode & 3) == 2 ? KVP_EVICT_S3FIFO
                 : (mode & 3) == 3 ? KVP_EVICT_CDECAY
                                   : KVP_EVICT_LRU;
    w.retain = (mode & 4) != 0;
    bool fail_new = (shape & 0xc0) == 0xc0;
    w.n_blocks = 1 + (uint32_t)fz_below(&in, 32);
    fz_ns_decode_set(&in, w.ns, OPS_N_NS);
    w.bad_ns.tenant.ptr = NULL;
    w.bad_ns.tenant.len = 1;
    uint8_t salt = fz_u8(&in);
    for (int b = 0; b < 3; b++)
        for (size_t i = 0; i < w.base_len; i++)
            w.bases[b][i] =
                (uint32_t)(((size_t)b * 5 + i * (i + b + 1) + ((salt >> (i % 8)) & 1)) % 4);
    w.indexed = calloc(w.n_blocks, 1);
    FZ_ASSERT(w.indexed, "out of memory");
    fz_alloc_init(&w.alloc);

    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = w.n_blocks;
    cfg.block_size = w.bs;
    cfg.verify_tokens = w.verify;
    cfg.eviction = w.eviction;
    cfg.cdecay_tau = w.n_blocks % 3 == 0 ? 5 : 0;
    cfg.count_orphans = (shape & 0x40) != 0;
    fz_keys_apply(&w.keys, &cfg);
    cfg.alloc = fz_alloc_hooks(&w.alloc);
    if (w.events) {
        cfg.on_event = on_event;
        cfg.event_ud = &w;
    }
    if (fail_new) {
        w.c = new_cache_failing(&w, &cfg);
    } else {
        FZ_ASSERT(kvp_cache_new(&cfg, &w.c) == KVP_OK, "kvp_cache_new");
    }
    w.m = rm_new(w.n_blocks, w.bs, w.verify);
    compare_state(&w);
    int64_t armed = -1;
    for (w.step = 0; w.step < OPS_MAX_STEPS && fz_more(&in); w.step++)
        step(&w, &in, &armed);
    kvp_cache_free(w.c);
    fz_alloc_check_empty(&w.alloc, "kvp_cache_free");
    rm_free(w.m);
    free(w.indexed);
    return 0;
}
