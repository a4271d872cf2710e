/*
 * fuzz_collision.c - libFuzzer harness: collision-proof mode (verify_tokens) under forced
 * hash collisions.
 *
 * The cache's keys are truncated to 1..16 bits with the internal hook
 * kvp__cache_set_key_bits, so distinct prefixes, and distinct namespaces, share keys all the
 * time; verify_tokens is always on. The block size is 1..4, 16, 1021 or 1500 (fz_block_size:
 * the library's generic, 16-token and streaming hash paths), the seed is random and the
 * hash profile any of the five (fz_keys_decode; vllm-* namespaces rewritten into ones vLLM
 * can express, fz_ns_map_profile). Up to
 * COL_MAX_STEPS lookups, acquires, commits, grows, releases, accesses and resets run over 3
 * namespaces (fz_ns_decode_set: adversarial pairs and exact copies) and prompts cut from
 * three base sequences over 4 tokens (up to 48 tokens for blocks of 1..4, 6 blocks of 16 or
 * 3 large blocks, plus a tail).
 *
 * Oracle: what each block really holds, kept by the harness from what an engine would have
 * written into it, never from the cache's own token store:
 *   - kvp_acquire: the fresh blocks (after the hits) hold nothing yet;
 *   - kvp_commit: each newly committed block i of the request holds (namespace, the
 *     request's tokens[0 .. (i+1) * block_size)), whether it was indexed or deduplicated;
 *   - kvp_grow: the new blocks hold nothing;
 *   - kvp_access: a block it stores holds the prompt's prefix up to its position. Positions
 *     are not in the event, so the harness computes the prompt's truncated key chain with
 *     the independent oracle (fz_oracle_chain) and keeps every position whose key and parent key
 * match the STORED event (positions only increase within a call); the content is then "one of these
 * prefixes" - exact unless the prompt collides with itself. Namespaces are compared by value
 * (classes of fz_ns_equal).
 *
 * Asserted after every call: every block id a kvp_lookup returns as a hit, and the first
 * n_blocks_hit blocks of a request after kvp_acquire, hold exactly the caller's namespace
 * and the caller's tokens up to the end of that block (never another prefix or another
 * namespace's data, never a block that holds nothing); kvp_acquire and kvp_access report
 * the same n_blocks_cached and n_blocks_hit as a kvp_lookup of the same prompt made just
 * before (so their matches are checked through the lookup's ids); kvp_cache_check passes;
 * calls fail only with KVP_ENOSPC, KVP_ENOENT, KVP_EEXIST or KVP_ERANGE; nothing leaks.
 * The complementary check - that with verify_tokens off the same truncation produces a
 * false hit - is the unit test tests/lib/test_collision.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"

#define COL_MAX_STEPS 160 /* calls decoded from one input */
#define COL_MAX_KEYS  64  /* most full blocks in a sequence (positions are bits of a u64) */
#define COL_N_NS      3   /* namespaces */
#define COL_N_REQS    4   /* request ids 1..COL_N_REQS */

enum { C_LOOKUP, C_ACQUIRE, C_COMMIT, C_GROW, C_RELEASE, C_ACCESS, C_RESET, N_C };
static const char *const c_names[N_C] = {"lookup",  "acquire", "commit", "grow",
                                         "release", "access",  "reset"};

/* What a block holds: prefix (i+1) * block_size of tokens, for one i in positions. */
typedef struct col_content {
    int cls;            /* namespace class; -1: nothing (fresh or never written) */
    uint64_t positions; /* candidate block positions (bit i) */
    uint32_t *tokens;   /* the sequence the prefix is taken from (max_seq entries) */
} col_content;

typedef struct col_req {
    bool active;        /* acquired and not released */
    int ns;             /* namespace index */
    uint32_t *seq;      /* prompt, then decoded tokens (max_seq entries) */
    size_t n_seq;       /* tokens in seq */
    size_t n_committed; /* blocks committed (hits included) */
} col_req;

typedef struct col_world {
    kvp_cache *c;
    fz_alloc alloc;
    uint32_t n_blocks, bs;
    fz_keys keys;       /* seed, and the key bits kept */
    size_t max_blocks;  /* full blocks in the longest prompt */
    size_t base_len;    /* tokens in each base sequence */
    size_t max_seq;     /* longest request sequence (and prompt), at most COL_MAX_KEYS blocks */
    fz_ns ns[COL_N_NS]; /* namespaces */
    int cls[COL_N_NS];  /* their classes */
    uint32_t *bases[3]; /* base_len tokens each */
    uint32_t *prompt;   /* the current prompt (max_seq entries) */
    col_req reqs[COL_N_REQS + 1]; /* by request id */
    col_content *content;         /* per block */
    /* The access in progress, for the event callback. */
    bool in_access;
    int acc_cls;                    /* its namespace class */
    const uint32_t *acc_tokens;     /* its prompt */
    kvp_key acc_keys[COL_MAX_KEYS]; /* truncated chain keys of the prompt */
    size_t acc_n_keys;              /* full blocks */
    kvp_key acc_root;               /* block 0's parent: truncated root, or NONE_HASH */
    size_t acc_min;                 /* STORED positions must be >= this */
    size_t step;
    const char *op;
} col_world;

/* The cache's truncated key chain of tokens[0 .. n) in namespace ns, from the oracle;
 * *start is block 0's parent as the cache keys it (the truncated root, or NONE_HASH under
 * vllm-*). */
static size_t trunc_chain(const col_world *w, const kvp_namespace *ns, const uint32_t *tokens,
                          size_t n, kvp_key *start, kvp_key *keys)
{
    kvp_key root = fz_key_trunc(fz_oracle_root(&w->keys, ns), w->keys.bits);
    *start = fz_oracle_start(&w->keys, root).key;
    return fz_oracle_chain(&w->keys, w->keys.bits, ns, root, tokens, n, w->bs, keys, NULL,
                           COL_MAX_KEYS);
}

static void on_event(void *ud, const kvp_event *ev)
{
    col_world *w = ud;
    if (ev->type != KVP_EVENT_STORED || !w->in_access)
        return;
    FZ_ASSERT(ev->block_id < w->n_blocks, "STORED block %u", ev->block_id);
    uint64_t positions = 0;
    size_t first = SIZE_MAX;
    for (size_t i = w->acc_min; i < w->acc_n_keys; i++) {
        kvp_key parent = i ? w->acc_keys[i - 1] : w->acc_root;
        if (fz_key_eq(w->acc_keys[i], ev->key) && fz_key_eq(parent, ev->parent) &&
            ev->parent_is_root == (i == 0)) {
            positions |= UINT64_C(1) << i;
            if (first == SIZE_MAX)
                first = i;
        }
    }
    FZ_ASSERT(positions != 0, "step %zu access: STORED key/parent not in the prompt's chain",
              w->step);
    w->acc_min = first + 1;
    col_content *ct = &w->content[ev->block_id];
    ct->cls = w->acc_cls;
    ct->positions = positions;
    memcpy(ct->tokens, w->acc_tokens, w->acc_n_keys * w->bs * sizeof(uint32_t));
}

/* Fail unless block id holds namespace class cls and tokens[0 .. (i+1) * bs). */
static void check_holds(const col_world *w, uint32_t id, size_t i, int cls, const uint32_t *tokens)
{
    FZ_ASSERT(id < w->n_blocks, "step %zu %s: hit block id %u", w->step, w->op, id);
    const col_content *ct = &w->content[id];
    FZ_ASSERT(ct->cls >= 0, "step %zu %s: hit %zu is block %u, which holds nothing", w->step, w->op,
              i, id);
    FZ_ASSERT(ct->cls == cls,
              "step %zu %s: COLLISION: hit %zu is block %u of namespace class %d, caller is %d",
              w->step, w->op, i, id, ct->cls, cls);
    FZ_ASSERT(ct->positions & (UINT64_C(1) << i),
              "step %zu %s: COLLISION: hit %zu is block %u, which holds another position", w->step,
              w->op, i, id);
    FZ_ASSERT(memcmp(ct->tokens, tokens, (i + 1) * w->bs * sizeof(uint32_t)) == 0,
              "step %zu %s: COLLISION: hit %zu is block %u, which holds other tokens", w->step,
              w->op, i, id);
}

/* kvp_lookup of the prompt with its hit ids checked; returns the match. */
static kvp_match checked_lookup(col_world *w, int nsi, const uint32_t *t, size_t n)
{
    uint32_t ids[COL_MAX_KEYS];
    kvp_match m;
    int rc = kvp_lookup(w->c, &w->ns[nsi].ns, t, n, ids, COL_MAX_KEYS, &m);
    FZ_ASSERT(rc == KVP_OK, "step %zu: kvp_lookup: %s", w->step, kvp_strerror(rc));
    for (size_t i = 0; i < m.n_blocks_hit; i++)
        check_holds(w, ids[i], i, w->cls[nsi], t);
    return m;
}

static void same_match(const col_world *w, const kvp_match *a, const kvp_match *lookup)
{
    FZ_ASSERT(
        a->n_blocks_cached == lookup->n_blocks_cached && a->n_blocks_hit == lookup->n_blocks_hit,
        "step %zu %s: cached %u hit %u, but a lookup just before: cached %u hit %u", w->step, w->op,
        a->n_blocks_cached, a->n_blocks_hit, lookup->n_blocks_cached, lookup->n_blocks_hit);
}

static void make_prompt(col_world *w, fz_in *in, uint32_t *t, size_t *n)
{
    uint8_t b = fz_u8(in);
    const uint32_t *base = w->bases[b % 3];
    *n = fz_prompt_len(in, w->bs, (b & 0x80) ? 2 : w->max_blocks);
    memcpy(t, base, *n * sizeof(uint32_t));
    if ((b & 0x0c) == 0)
        t[fz_below(in, *n)] = (uint32_t)fz_below(in, 4);
}

static void step(col_world *w, fz_in *in)
{
    uint8_t op = fz_u8(in);
    int kind = op % N_C;
    int nsi = (int)((op / N_C) % COL_N_NS);
    uint64_t id = 1 + fz_below(in, COL_N_REQS);
    col_req *q = &w->reqs[id];
    uint32_t *t = w->prompt;
    size_t n = 0;
    kvp_match m, before;
    int rc = KVP_OK;
    w->op = c_names[kind];
    switch (kind) {
    case C_LOOKUP:
        make_prompt(w, in, t, &n);
        checked_lookup(w, nsi, t, n);
        break;
    case C_ACQUIRE: {
        make_prompt(w, in, t, &n);
        uint8_t c = fz_u8(in);
        size_t cap = n + ((c & 0x80) ? fz_below(in, (size_t)2 * w->bs) : c % 12);
        before = checked_lookup(w, nsi, t, n);
        rc = kvp_acquire(w->c, id, &w->ns[nsi].ns, t, n, cap, &m);
        if (rc != KVP_OK)
            break;
        same_match(w, &m, &before);
        const uint32_t *blocks;
        size_t n_held;
        FZ_ASSERT(kvp_request_blocks(w->c, id, &blocks, &n_held) == KVP_OK, "request_blocks");
        for (size_t i = 0; i < m.n_blocks_hit; i++)
            check_holds(w, blocks[i], i, w->cls[nsi], t);
        for (size_t i = m.n_blocks_hit; i < n_held; i++)
            w->content[blocks[i]].cls = -1;
        q->active = true;
        q->ns = nsi;
        memcpy(q->seq, t, n * sizeof(uint32_t));
        q->n_seq = n;
        q->n_committed = m.n_blocks_hit;
        break;
    }
    case C_COMMIT: {
        uint8_t a = fz_u8(in);
        size_t add = (a & 0x80) ? fz_below(in, (size_t)2 * w->bs) : a % 8;
        if (!q->active) {
            rc = kvp_commit(w->c, id, t, 0, NULL);
            break;
        }
        size_t n_seq = q->n_seq;
        while (add-- > 0 && n_seq < w->max_seq)
            q->seq[n_seq++] = (uint32_t)fz_below(in, 4);
        rc = kvp_commit(w->c, id, q->seq, n_seq, NULL);
        if (rc != KVP_OK)
            break; /* KVP_ERANGE: decoded past what the request holds */
        q->n_seq = n_seq;
        const uint32_t *blocks;
        size_t n_held;
        FZ_ASSERT(kvp_request_blocks(w->c, id, &blocks, &n_held) == KVP_OK, "request_blocks");
        for (size_t i = q->n_committed; i < n_seq / w->bs; i++) {
            col_content *ct = &w->content[blocks[i]];
            ct->cls = w->cls[q->ns];
            ct->positions = UINT64_C(1) << i;
            memcpy(ct->tokens, q->seq, n_seq * sizeof(uint32_t));
        }
        q->n_committed = n_seq / w->bs;
        break;
    }
    case C_GROW: {
        const uint32_t *blocks;
        size_t n_old = 0, n_new = 0;
        if (q->active)
            FZ_ASSERT(kvp_request_blocks(w->c, id, &blocks, &n_old) == KVP_OK, "request_blocks");
        rc = kvp_grow(w->c, id, fz_below(in, w->max_seq + 4));
        if (rc == KVP_OK) {
            FZ_ASSERT(kvp_request_blocks(w->c, id, &blocks, &n_new) == KVP_OK, "request_blocks");
            for (size_t i = n_old; i < n_new; i++)
                w->content[blocks[i]].cls = -1;
        }
        break;
    }
    case C_RELEASE:
        rc = kvp_release(w->c, id);
        if (rc == KVP_OK)
            q->active = false;
        break;
    case C_ACCESS:
        make_prompt(w, in, t, &n);
        before = checked_lookup(w, nsi, t, n);
        w->in_access = true;
        w->acc_cls = w->cls[nsi];
        w->acc_tokens = t;
        w->acc_n_keys = trunc_chain(w, &w->ns[nsi].ns, t, n, &w->acc_root, w->acc_keys);
        w->acc_min = 0;
        rc = kvp_access(w->c, &w->ns[nsi].ns, t, n, &m);
        w->in_access = false;
        if (rc == KVP_OK)
            same_match(w, &m, &before);
        break;
    default:
        rc = kvp_cache_reset(w->c);
        break;
    }
    FZ_ASSERT(rc == KVP_OK || rc == KVP_ENOSPC || rc == KVP_ETOOBIG || rc == KVP_ENOENT ||
                  rc == KVP_EEXIST || rc == KVP_ERANGE,
              "step %zu %s: unexpected %s", w->step, w->op, kvp_strerror(rc));
    rc = kvp_cache_check(w->c);
    FZ_ASSERT(rc == KVP_OK, "step %zu %s: kvp_cache_check: %s", w->step, w->op, kvp_strerror(rc));
}

/* Decode the shape, namespaces and base sequences, and allocate the per-input arrays. */
static void world_init(col_world *w, fz_in *in)
{
    uint8_t shape = fz_u8(in);
    w->bs = fz_block_size(in);
    fz_keys_decode(in, &w->keys, FZ_PROFILES_ALL);
    w->keys.bits = 1 + (shape >> 2) % 16;
    w->max_blocks = w->bs <= 4 ? 48 / w->bs : w->bs <= 16 ? 6 : 3;
    w->base_len = (w->max_blocks + 1) * w->bs;
    w->max_seq = w->base_len + (w->bs <= 4 ? 16 : 2 * w->bs);
    w->n_blocks = 1 + (uint32_t)fz_below(in, 32);
    fz_ns_decode_set(in, w->ns, COL_N_NS);
    kvp_namespace orig[COL_N_NS]; /* as decoded; vllm-* refusals are fuzz_isolation's */
    fz_ns_map_profile(&w->keys, w->ns, COL_N_NS, orig);
    for (int i = 0; i < COL_N_NS; i++) {
        w->cls[i] = i;
        for (int j = 0; j < i; j++)
            if (fz_ns_equal(&w->ns[i].ns, &w->ns[j].ns)) {
                w->cls[i] = w->cls[j];
                break;
            }
    }
    uint8_t salt = fz_u8(in);
    for (int b = 0; b < 3; b++) {
        w->bases[b] = malloc(w->base_len * sizeof(uint32_t));
        FZ_ASSERT(w->bases[b], "out of memory");
        for (size_t i = 0; i < w->base_len; i++)
            w->bases[b][i] =
                (uint32_t)(((size_t)b * 3 + i * (i + b + 2) + ((salt >> (i % 8)) & 1)) % 4);
    }
    w->prompt = malloc(w->max_seq * sizeof(uint32_t));
    w->content = calloc(w->n_blocks, sizeof *w->content);
    FZ_ASSERT(w->prompt && w->content, "out of memory");
    for (uint32_t b = 0; b < w->n_blocks; b++) {
        w->content[b].cls = -1;
        w->content[b].tokens = malloc(w->max_seq * sizeof(uint32_t));
        FZ_ASSERT(w->content[b].tokens, "out of memory");
    }
    for (int r = 0; r <= COL_N_REQS; r++) {
        w->reqs[r].seq = malloc(w->max_seq * sizeof(uint32_t));
        FZ_ASSERT(w->reqs[r].seq, "out of memory");
    }
}

static void world_free(col_world *w)
{
    for (int b = 0; b < 3; b++)
        free(w->bases[b]);
    for (uint32_t b = 0; b < w->n_blocks; b++)
        free(w->content[b].tokens);
    for (int r = 0; r <= COL_N_REQS; r++)
        free(w->reqs[r].seq);
    free(w->content);
    free(w->prompt);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_harness = "fuzz_collision";
    static col_world w;
    fz_in in = {data, size};
    memset(&w, 0, sizeof w);
    world_init(&w, &in);
    fz_alloc_init(&w.alloc);
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = w.n_blocks;
    cfg.block_size = w.bs;
    cfg.verify_tokens = true;
    cfg.alloc = fz_alloc_hooks(&w.alloc);
    cfg.on_event = on_event;
    cfg.event_ud = &w;
    fz_keys_apply(&w.keys, &cfg);
    FZ_ASSERT(kvp_cache_new(&cfg, &w.c) == KVP_OK, "kvp_cache_new");
    fz_keys_truncate_cache(&w.keys, w.c);
    for (w.step = 0; w.step < COL_MAX_STEPS && fz_more(&in); w.step++)
        step(&w, &in);
    kvp_cache_free(w.c);
    fz_alloc_check_empty(&w.alloc, "kvp_cache_free");
    world_free(&w);
    return 0;
}
