/*
 * fuzz_isolation.c - libFuzzer harness: cache-key isolation between namespaces.
 *
 * An input decodes to a cache shape (block size 1..4, verify_tokens on or off, pool mode),
 * 2..4 namespaces (model/adapter/tenant/salt; 3 times in 4 from the adversarial table of
 * fuzz_util.c: ("ab","c") vs ("a","bc"), absent vs empty, embedded NULs, a value moved to
 * another field, and empty fields at distinct addresses that must be *equal*), and up to
 * ISO_MAX_OPS interleaved kvp_lookup / kvp_acquire / kvp_commit / kvp_grow / kvp_release /
 * kvp_access calls, each in one namespace, over prompts cut from two shared base sequences
 * of a 4-token alphabet, so that different namespaces send the same tokens all the time.
 *
 * Namespaces are grouped into classes by value (fz_ns_equal): two entries with equal fields
 * are one namespace for the cache and may share blocks. Each namespace entry has its own
 * request ids (entry * 16 + slot + 1), so requests of one class never collide by id with
 * another's.
 *
 * What is asserted (abort with a message on any violation):
 *
 *   (a) ownership - in every run. Events give each block an owner: KVP_EVENT_STORED records
 *       the class of the call that caused it (the prompt's namespace for lookup, acquire and
 *       access; the request's for commit) and the key; KVP_EVENT_REMOVED clears it. Every
 *       block id returned as a hit - kvp_lookup's block_ids[0 .. min(hit, cap)) and the first
 *       n_blocks_hit entries of kvp_request_blocks after kvp_acquire - must be indexed now,
 *       owned by the caller's class, and hold the key the caller's prompt has at that
 *       position (root from kvp_namespace_key, chain from kvp_hash_blocks). Every STORED
 *       event must carry a key of the calling prompt's chain, in increasing block order,
 *       with the right parent key; a STORED block must not already be indexed and a REMOVED
 *       one must be; kvp_cache_check must pass after every call; no call may fail except
 *       with KVP_ENOSPC (small pools), KVP_ENOENT (release/grow/commit of an idle slot) or
 *       KVP_EEXIST (acquire of a busy slot); nothing may leak.
 *
 *   (b) non-interference - only in large-pool mode, where the pool has at least as many
 *       blocks as the input could ever take (the sum over its calls of the blocks each
 *       acquire, grow and access may allocate, plus one), so that nothing is evicted: the
 *       harness checks n_evictions == 0. The ops are run once with every namespace, then
 *       once per class X with only X's ops. For each of X's ops the return code, and for
 *       lookups, acquires and accesses n_blocks_cached, n_blocks_hit and n_tokens_hit, and
 *       for commits n_stored, must be identical in both runs.
 *
 * What is allowed: other namespaces may only cause eviction pressure. In a pool that is too
 * small (small-pool mode, 1..24 blocks, where only (a) is checked) their blocks compete for
 * the same LRU, so X's hit counts may go down and X's acquires may fail with KVP_ENOSPC -
 * but a block of another namespace is never returned to X, and with room for everything
 * the presence of other namespaces changes nothing X can observe.
 *
 * Bounded work: at most ISO_MAX_OPS calls of at most ISO_MAX_TOKENS tokens per run, at most
 * 1 + ISO_MAX_NS runs, pools of at most a few thousand blocks. No state outlives a call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"

#define ISO_MAX_OPS    48 /* calls decoded from one input */
#define ISO_MAX_NS     4  /* namespaces per input */
#define ISO_MAX_TOKENS 40 /* longest prompt */
#define ISO_SLOTS      3  /* request slots per namespace entry */
#define ISO_MAX_SEQ    (ISO_MAX_TOKENS + 16)

enum { OP_LOOKUP, OP_ACQUIRE, OP_COMMIT, OP_GROW, OP_RELEASE, OP_ACCESS, N_OPS };
static const char *const op_names[N_OPS] = {"lookup", "acquire", "commit",
                                            "grow",   "release", "access"};

typedef struct iso_op {
    int kind;                        /* OP_* */
    int ns;                          /* namespace entry */
    int slot;                        /* request slot (acquire, commit, grow, release) */
    size_t n_tokens;                 /* prompt length (lookup, acquire, access), 1.. */
    size_t extra;                    /* acquire: capacity past the prompt; commit: tokens to
                                        decode; grow: capacity in tokens */
    size_t cap;                      /* lookup: block_ids capacity */
    uint32_t tokens[ISO_MAX_TOKENS]; /* prompt, or the tokens a commit decodes */
} iso_op;

typedef struct iso_input {
    uint32_t block_size;     /* 1..4 */
    bool verify;             /* verify_tokens */
    bool large;              /* large-pool mode: (b) is checked too */
    uint32_t small_blocks;   /* small-pool mode: pool size */
    size_t n_ns;             /* namespace entries */
    fz_ns ns[ISO_MAX_NS];    /* the namespaces */
    int cls[ISO_MAX_NS];     /* class: the first entry equal to this one */
    size_t n_ops;            /* decoded calls */
    iso_op ops[ISO_MAX_OPS]; /* the calls */
    uint64_t max_blocks;     /* blocks the calls could take in total (an upper bound) */
} iso_input;

/* What one call returned, compared between runs. */
typedef struct iso_result {
    int rc;
    uint32_t n_blocks_cached;
    uint32_t n_blocks_hit;
    uint64_t n_tokens_hit;
    size_t n_stored;
} iso_result;

typedef struct iso_req {
    bool active;               /* acquired, not released */
    uint32_t seq[ISO_MAX_SEQ]; /* prompt, then decoded tokens */
    size_t n_seq;              /* tokens in seq */
    size_t n_held;             /* blocks the request holds */
} iso_req;

/* One run of the ops on one cache. */
typedef struct iso_run {
    const iso_input *in;
    kvp_cache *cache;
    fz_alloc alloc;
    uint32_t n_blocks; /* pool size */
    int *owner;        /* per block: class of the storing call, -1 if unindexed */
    kvp_key *key;      /* per block: key given at STORED */
    iso_req reqs[ISO_MAX_NS][ISO_SLOTS];
    /* The call in progress, for the event callback. */
    int cur_cls;             /* caller's class, -1 when no STORED may happen */
    const kvp_key *cur_keys; /* the caller's prompt chain keys */
    size_t cur_n_keys;       /* entries in cur_keys */
    size_t cur_next;         /* STORED must name block >= this one */
    kvp_key cur_root;        /* the caller's root key */
    size_t op_index;         /* for messages */
} iso_run;

static uint32_t blocks_for(uint32_t bs, size_t n)
{
    return (uint32_t)((n + bs - 1) / bs);
}

/* Decode the whole input. Cannot fail. */
static void decode(fz_in *in, iso_input *x)
{
    uint8_t shape = fz_u8(in);
    x->block_size = 1 + (shape & 3);
    x->verify = (shape & 4) != 0;
    x->large = (shape & 8) == 0;
    x->small_blocks = 1 + (uint32_t)(shape >> 4) + (uint32_t)fz_below(in, 9);
    x->n_ns = 2 + fz_below(in, ISO_MAX_NS - 1);
    fz_ns_decode_set(in, x->ns, x->n_ns);
    for (size_t i = 0; i < x->n_ns; i++) {
        x->cls[i] = (int)i;
        for (size_t j = 0; j < i; j++)
            if (fz_ns_equal(&x->ns[i].ns, &x->ns[j].ns)) {
                x->cls[i] = x->cls[j];
                break;
            }
    }
    /* Two base sequences over 4 tokens; prompts are their prefixes, sometimes mutated. */
    uint32_t base[2][ISO_MAX_TOKENS];
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < ISO_MAX_TOKENS; i++)
            base[b][i] = (uint32_t)((b * 7 + i * (i + 3)) % 4);
    uint8_t salt = fz_u8(in);
    for (int i = 0; i < ISO_MAX_TOKENS; i++)
        base[1][i] ^= (uint32_t)((salt >> (i % 8)) & 1);

    x->n_ops = 0;
    x->max_blocks = 0;
    uint32_t bs = x->block_size;
    while (fz_more(in) && x->n_ops < ISO_MAX_OPS) {
        iso_op *op = &x->ops[x->n_ops++];
        uint8_t b = fz_u8(in);
        op->kind = b % N_OPS;
        op->ns = (int)((b / N_OPS) % x->n_ns);
        op->slot = (int)fz_below(in, ISO_SLOTS);
        uint8_t p = fz_u8(in);
        const uint32_t *src = base[p & 1];
        op->n_tokens = 1 + fz_below(in, ISO_MAX_TOKENS);
        memcpy(op->tokens, src, sizeof op->tokens);
        if ((p & 6) == 0)
            op->tokens[fz_below(in, op->n_tokens)] = (uint32_t)fz_below(in, 4);
        op->extra = (p >> 3) & 15;
        op->cap = fz_below(in, ISO_MAX_TOKENS + 2);
        switch (op->kind) {
        case OP_ACQUIRE:
            x->max_blocks += blocks_for(bs, op->n_tokens + op->extra);
            break;
        case OP_GROW:
            op->extra = op->n_tokens + op->extra; /* capacity in tokens */
            x->max_blocks += blocks_for(bs, op->extra);
            break;
        case OP_ACCESS:
            x->max_blocks += op->n_tokens / bs;
            break;
        default:
            break;
        }
    }
}

static void on_event(void *ud, const kvp_event *ev)
{
    iso_run *r = ud;
    FZ_ASSERT(ev->block_id < r->n_blocks || ev->type == KVP_EVENT_CLEARED,
              "op %zu: event for block %u of %u", r->op_index, ev->block_id, r->n_blocks);
    if (ev->type == KVP_EVENT_REMOVED) {
        FZ_ASSERT(r->owner[ev->block_id] >= 0, "op %zu: REMOVED block %u was not indexed",
                  r->op_index, ev->block_id);
        r->owner[ev->block_id] = -1;
        return;
    }
    if (ev->type != KVP_EVENT_STORED)
        return;
    FZ_ASSERT(r->cur_cls >= 0, "op %zu (%s): STORED during a call that stores nothing", r->op_index,
              op_names[r->in->ops[r->op_index].kind]);
    FZ_ASSERT(r->owner[ev->block_id] < 0, "op %zu: STORED block %u is already indexed", r->op_index,
              ev->block_id);
    /* The key must be one of the caller's chain, at or after the last stored position. */
    size_t i = r->cur_next;
    while (i < r->cur_n_keys &&
           (r->cur_keys[i].lo != ev->key.lo || r->cur_keys[i].hi != ev->key.hi))
        i++;
    FZ_ASSERT(i < r->cur_n_keys, "op %zu: STORED key is not in the caller's chain", r->op_index);
    kvp_key parent = i ? r->cur_keys[i - 1] : r->cur_root;
    FZ_ASSERT(ev->parent.lo == parent.lo && ev->parent.hi == parent.hi &&
                  ev->parent_is_root == (i == 0),
              "op %zu: STORED block %zu of the chain with the wrong parent", r->op_index, i);
    r->cur_next = i + 1;
    r->owner[ev->block_id] = r->cur_cls;
    r->key[ev->block_id] = ev->key;
}

/* The chain keys of tokens[0 .. n) in namespace ns (n / bs of them). */
static size_t chain_keys(const iso_run *r, const kvp_namespace *ns, const uint32_t *tokens,
                         size_t n, kvp_key *root, kvp_key *keys)
{
    size_t n_keys = 0;
    FZ_ASSERT(kvp_namespace_key(KVP_DEFAULT_SEED, ns, root) == KVP_OK, "kvp_namespace_key");
    FZ_ASSERT(kvp_hash_blocks(KVP_DEFAULT_SEED, *root, tokens, n, r->in->block_size, keys,
                              ISO_MAX_SEQ, &n_keys) == KVP_OK,
              "kvp_hash_blocks");
    return n_keys;
}

/* Check that hit block ids[0 .. n) belong to class cls and hold keys[0 .. n). */
static void check_hits(const iso_run *r, const uint32_t *ids, size_t n, int cls,
                       const kvp_key *keys)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t id = ids[i];
        FZ_ASSERT(id < r->n_blocks, "op %zu: hit block id %u out of range", r->op_index, id);
        FZ_ASSERT(r->owner[id] >= 0, "op %zu: hit %zu is block %u, which is not cached",
                  r->op_index, i, id);
        FZ_ASSERT(r->owner[id] == cls,
                  "op %zu: ISOLATION: hit %zu is block %u stored by namespace class %d, caller "
                  "is class %d",
                  r->op_index, i, id, r->owner[id], cls);
        FZ_ASSERT(r->key[id].lo == keys[i].lo && r->key[id].hi == keys[i].hi,
                  "op %zu: hit %zu is block %u, whose key is not the prompt's", r->op_index, i, id);
    }
}

static void begin_call(iso_run *r, int cls, const kvp_key *keys, size_t n_keys, kvp_key root)
{
    r->cur_cls = cls;
    r->cur_keys = keys;
    r->cur_n_keys = n_keys;
    r->cur_next = 0;
    r->cur_root = root;
}

/* Run one op; fill *res. */
static void run_op(iso_run *r, const iso_op *op, iso_result *res)
{
    const iso_input *x = r->in;
    const kvp_namespace *ns = &x->ns[op->ns].ns;
    int cls = x->cls[op->ns];
    iso_req *q = &r->reqs[op->ns][op->slot];
    uint64_t id = (uint64_t)op->ns * 16 + (uint64_t)op->slot + 1;
    kvp_key keys[ISO_MAX_SEQ], root = {0, 0};
    uint32_t ids[ISO_MAX_TOKENS + 2];
    kvp_match m;
    memset(res, 0, sizeof *res);
    memset(&m, 0, sizeof m);
    switch (op->kind) {
    case OP_LOOKUP: {
        size_t n_keys = chain_keys(r, ns, op->tokens, op->n_tokens, &root, keys);
        begin_call(r, -1, keys, n_keys, root);
        res->rc = kvp_lookup(r->cache, ns, op->tokens, op->n_tokens, ids, op->cap, &m);
        if (res->rc == KVP_OK)
            check_hits(r, ids, m.n_blocks_hit < op->cap ? m.n_blocks_hit : op->cap, cls, keys);
        break;
    }
    case OP_ACQUIRE: {
        size_t n_keys = chain_keys(r, ns, op->tokens, op->n_tokens, &root, keys);
        begin_call(r, cls, keys, n_keys, root);
        res->rc =
            kvp_acquire(r->cache, id, ns, op->tokens, op->n_tokens, op->n_tokens + op->extra, &m);
        if (res->rc == KVP_OK) {
            const uint32_t *held;
            size_t n_held = 0;
            FZ_ASSERT(kvp_request_blocks(r->cache, id, &held, &n_held) == KVP_OK &&
                          n_held == blocks_for(x->block_size, op->n_tokens + op->extra),
                      "op %zu: acquired request holds %zu blocks", r->op_index, n_held);
            check_hits(r, held, m.n_blocks_hit, cls, keys);
            FZ_ASSERT(!q->active, "op %zu: acquire of an active id succeeded", r->op_index);
            q->active = true;
            memcpy(q->seq, op->tokens, op->n_tokens * sizeof(uint32_t));
            q->n_seq = op->n_tokens;
            q->n_held = n_held;
        }
        break;
    }
    case OP_COMMIT: {
        /* Decode up to `extra` tokens within what the request holds, then commit. */
        uint32_t dummy = 0;
        const uint32_t *seq = &dummy;
        size_t n_seq = 1;
        if (q->active) {
            size_t limit = q->n_held * x->block_size;
            for (size_t k = 0; k < op->extra && q->n_seq < limit && q->n_seq < ISO_MAX_SEQ; k++)
                q->seq[q->n_seq++] = op->tokens[k];
            seq = q->seq;
            n_seq = q->n_seq;
        }
        size_t n_keys = chain_keys(r, ns, seq, n_seq, &root, keys);
        begin_call(r, cls, keys, n_keys, root);
        size_t n_stored = 0;
        res->rc = kvp_commit(r->cache, id, seq, n_seq, &n_stored);
        res->n_stored = n_stored;
        break;
    }
    case OP_GROW:
        begin_call(r, -1, NULL, 0, root);
        res->rc = kvp_grow(r->cache, id, op->extra);
        if (res->rc == KVP_OK && blocks_for(x->block_size, op->extra) > q->n_held)
            q->n_held = blocks_for(x->block_size, op->extra);
        break;
    case OP_RELEASE:
        begin_call(r, -1, NULL, 0, root);
        res->rc = kvp_release(r->cache, id);
        if (res->rc == KVP_OK)
            q->active = false;
        break;
    default: {
        size_t n_keys = chain_keys(r, ns, op->tokens, op->n_tokens, &root, keys);
        begin_call(r, cls, keys, n_keys, root);
        res->rc = kvp_access(r->cache, ns, op->tokens, op->n_tokens, &m);
        break;
    }
    }
    r->cur_cls = -1;
    res->n_blocks_cached = m.n_blocks_cached;
    res->n_blocks_hit = m.n_blocks_hit;
    res->n_tokens_hit = m.n_tokens_hit;
    bool allowed = res->rc == KVP_OK || res->rc == KVP_ENOSPC || res->rc == KVP_ETOOBIG || res->rc == KVP_ENOENT ||
                   res->rc == KVP_EEXIST;
    FZ_ASSERT(allowed, "op %zu (%s): unexpected %s", r->op_index, op_names[op->kind],
              kvp_strerror(res->rc));
    FZ_ASSERT(res->rc != KVP_ENOENT || (!q->active && op->kind != OP_ACQUIRE),
              "op %zu (%s): ENOENT for an active request", r->op_index, op_names[op->kind]);
    FZ_ASSERT(res->rc != KVP_ENOSPC || !x->large, "op %zu (%s): ENOSPC in a large pool",
              r->op_index, op_names[op->kind]);
}

/* Run the ops whose class is only_cls (all when -1) on a fresh cache of n_blocks blocks;
 * results go to res[op index]. */
static void run(const iso_input *x, uint32_t n_blocks, int only_cls, bool check, iso_result *res)
{
    iso_run *r = calloc(1, sizeof *r);
    FZ_ASSERT(r, "out of memory");
    r->in = x;
    r->n_blocks = n_blocks;
    r->owner = malloc(n_blocks * sizeof *r->owner);
    r->key = calloc(n_blocks, sizeof *r->key);
    FZ_ASSERT(r->owner && r->key, "out of memory");
    for (uint32_t b = 0; b < n_blocks; b++)
        r->owner[b] = -1;
    r->cur_cls = -1;
    fz_alloc_init(&r->alloc);
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.hash_profile = KVP_HASH_XXH3; /* the oracle computes xxh3 keys */
    cfg.n_blocks = n_blocks;
    cfg.block_size = x->block_size;
    cfg.verify_tokens = x->verify;
    cfg.alloc = fz_alloc_hooks(&r->alloc);
    cfg.on_event = on_event;
    cfg.event_ud = r;
    FZ_ASSERT(kvp_cache_new(&cfg, &r->cache) == KVP_OK, "kvp_cache_new");
    for (size_t k = 0; k < x->n_ops; k++) {
        const iso_op *op = &x->ops[k];
        if (only_cls >= 0 && x->cls[op->ns] != only_cls)
            continue;
        r->op_index = k;
        run_op(r, op, &res[k]);
        if (check) {
            int rc = kvp_cache_check(r->cache);
            FZ_ASSERT(rc == KVP_OK, "op %zu (%s): kvp_cache_check: %s", k, op_names[op->kind],
                      kvp_strerror(rc));
        }
    }
    if (x->large) {
        kvp_stats st;
        FZ_ASSERT(kvp_cache_stats(r->cache, &st) == KVP_OK, "kvp_cache_stats");
        FZ_ASSERT(st.n_evictions == 0, "large pool of %u blocks evicted %llu", n_blocks,
                  (unsigned long long)st.n_evictions);
    }
    kvp_cache_free(r->cache);
    fz_alloc_check_empty(&r->alloc, "kvp_cache_free");
    free(r->owner);
    free(r->key);
    free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_harness = "fuzz_isolation";
    static iso_input x; /* rewritten from scratch for every input */
    static iso_result all[ISO_MAX_OPS], only[ISO_MAX_OPS];
    fz_in in = {data, size};
    memset(&x, 0, sizeof x);
    decode(&in, &x);
    if (!x.large) {
        run(&x, x.small_blocks, -1, true, all);
        return 0;
    }
    uint32_t n_blocks = (uint32_t)x.max_blocks + 1;
    run(&x, n_blocks, -1, true, all);
    for (size_t c = 0; c < x.n_ns; c++) {
        if (x.cls[c] != (int)c)
            continue; /* each class once, under its first entry */
        run(&x, n_blocks, (int)c, false, only);
        for (size_t k = 0; k < x.n_ops; k++) {
            const iso_op *op = &x.ops[k];
            if (x.cls[op->ns] != (int)c)
                continue;
            const iso_result *a = &all[k], *b = &only[k];
            FZ_ASSERT(a->rc == b->rc && a->n_blocks_cached == b->n_blocks_cached &&
                          a->n_blocks_hit == b->n_blocks_hit &&
                          a->n_tokens_hit == b->n_tokens_hit && a->n_stored == b->n_stored,
                      "INTERFERENCE: op %zu (%s, namespace %d): with all namespaces rc %d "
                      "cached %u hit %u tokens %llu stored %zu; alone rc %d cached %u hit %u "
                      "tokens %llu stored %zu",
                      k, op_names[op->kind], op->ns, a->rc, a->n_blocks_cached, a->n_blocks_hit,
                      (unsigned long long)a->n_tokens_hit, a->n_stored, b->rc, b->n_blocks_cached,
                      b->n_blocks_hit, (unsigned long long)b->n_tokens_hit, b->n_stored);
        }
    }
    return 0;
}
