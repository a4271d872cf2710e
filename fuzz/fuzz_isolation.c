/*
 * fuzz_isolation.c - libFuzzer harness: cache-key isolation between namespaces, checked
 * against an independent key oracle.
 *
 * An input decodes to a cache shape - block size 1..4, 16, 1021 or 1500 (fz_block_size), a
 * random 64-bit seed, a hash profile with its key or vLLM seed string (fz_keys_decode:
 * every profile; under vllm-* the namespaces are rewritten into ones vLLM can express and
 * the decoded ones must be refused with KVP_ENOTSUP), verify_tokens on or off, a small pool
 * (eviction pressure) or a large one, and, one time in four, keys truncated to 1..16 bits with
 * verify_tokens on (forced collisions, across namespaces too) - then 2..4 namespaces
 * (model/adapter/tenant/salt; 3 times in 4 from the adversarial table of fuzz_util.c: ("ab","c") vs
 * ("a","bc"), absent vs empty, embedded NULs, a value moved to another field, and empty fields at
 * distinct addresses that must be *equal*), and up to ISO_MAX_OPS interleaved kvp_lookup /
 * kvp_acquire / kvp_commit / kvp_grow / kvp_release / kvp_access / kvp_lookup_ids /
 * kvp_access_ids calls, each in one namespace, over prompts cut from two shared base
 * sequences of a 4-token alphabet with high bytes set (so byte order and width matter), so
 * that different namespaces send the same tokens, and the same external ids, all the time.
 * Prompts hold up to 40 blocks of 1 token, 6 of 16 or 3 of 1021/1500, plus a tail.
 *
 * Namespaces are grouped into classes by value (fz_ns_equal): two entries with equal fields
 * are one namespace for the cache and may share blocks; the oracle must agree (equal roots
 * exactly for equal classes). Each namespace entry has its own request ids (entry * 16 +
 * slot + 1), so requests of one class never collide by id with another's. External ids are
 * a function of the prompt's tokens only (as a trace's hash ids are), equal in every
 * namespace.
 *
 * Expected keys come from the oracle (fz_oracle_*: each profile's documented byte layout
 * rebuilt byte by byte and hashed once with libxxhash, libsodium or OpenSSL), never from
 * the library: before each call the cache's hasher (kvp_hasher_root, kvp_hasher_blocks,
 * kvp_hasher_external_key) and, under xxh3, kvp_namespace_key, kvp_hash_blocks and
 * kvp_external_key must give exactly the oracle's root, chain start, chain and external
 * keys for the input's profile and key material. Under vllm-* without verification,
 * namespaces with equal block-0 extra keys (adapter "x" alone, salt "x" alone) share block
 * 0 as vLLM's keys do, so they form one class (docs/fuzzing.md, the block-0 alias).
 *
 * What is asserted (abort with a message on any violation):
 *
 *   (a) ownership - in every run. Events give each block an owner: KVP_EVENT_STORED records
 *       the class of the call that caused it (the prompt's namespace for lookup, acquire and
 *       the access calls; the request's for commit), the key, and the identity of what it
 *       holds: the full 128-bit oracle key of (namespace, prefix), a short list of
 *       candidates when truncated keys repeat inside one prompt; KVP_EVENT_REMOVED clears
 *       it. Every STORED event must carry the oracle key of the calling prompt's chain (as
 *       the cache truncates it), in increasing block order, with the right parent key and
 *       parent_is_root. Every block id returned as a hit - kvp_lookup's and
 *       kvp_lookup_ids's block_ids[0 .. min(hit, cap)) and the first n_blocks_hit entries
 *       of kvp_request_blocks after kvp_acquire - must be indexed now, owned by the
 *       caller's class, hold the caller's expected key at that position and, with
 *       truncated keys, the caller's identity there (verification must have rejected any
 *       other namespace's or prefix's block). Expected sharing: n_blocks_cached of lookup,
 *       acquire and the access calls must equal (verify off) or not exceed (verify on: a
 *       stale block may fail verification) the longest run of the prompt's oracle keys that
 *       the events say are indexed, and n_blocks_hit must be min(that, (n_tokens - 1) / bs).
 *       kvp_cache_check passes after every call; no call fails except with KVP_ENOSPC (small
 *       pools), KVP_ENOENT (release/grow/commit of an idle slot), KVP_EEXIST (acquire of a
 *       busy slot) or KVP_EINVAL (exactly: an _ids call on a verify cache); nothing leaks.
 *
 *   (b) non-interference - only in large-pool mode with full keys, where the pool has at
 *       least as many blocks as the input could ever take (the sum over its calls of the
 *       blocks each acquire, grow and access may allocate, plus one), so that nothing is
 *       evicted: the harness checks n_evictions == 0. The ops are run once with every
 *       namespace, then once per class X with only X's ops. For each of X's ops the return
 *       code, and for lookups, acquires and accesses n_blocks_cached, n_blocks_hit and
 *       n_tokens_hit, and for commits n_stored, must be identical in both runs. (Forced
 *       collisions with verification are covered by (a) only: what a colliding commit may
 *       change for the victim is the business of fuzz_noninterference.)
 *
 * What is allowed: other namespaces may only cause eviction pressure. In a pool that is too
 * small (small-pool mode, 1..24 blocks) their blocks compete for the same LRU, so X's hit
 * counts may go down and X's acquires may fail with KVP_ENOSPC - but a block of another
 * namespace is never returned to X, and with room for everything the presence of other
 * namespaces changes nothing X can observe.
 *
 * Bounded work: at most ISO_MAX_OPS calls of at most about 6000 tokens per run, at most
 * 1 + ISO_MAX_NS runs, pools of at most a few thousand blocks. No state outlives a call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"

#define ISO_MAX_OPS   48 /* calls decoded from one input */
#define ISO_MAX_NS    4  /* namespaces per input */
#define ISO_SLOTS     3  /* request slots per namespace entry */
#define ISO_MAX_IDENT 8  /* identity candidates kept per block (more: not checked) */
#define ISO_EXT_SEED  UINT64_C(0x5eed0e87) /* seed of the external-id function */

enum {
    OP_LOOKUP,
    OP_ACQUIRE,
    OP_COMMIT,
    OP_GROW,
    OP_RELEASE,
    OP_ACCESS,
    OP_LOOKUP_IDS,
    OP_ACCESS_IDS,
    N_OPS
};
static const char *const op_names[N_OPS] = {"lookup",  "acquire", "commit",     "grow",
                                            "release", "access",  "lookup_ids", "access_ids"};

/* The token alphabet: small and large values, so a token's every byte reaches the key. */
static const uint32_t alphabet[4] = {0, 1, UINT32_C(0x00010000), UINT32_C(0xfffffffe)};

typedef struct iso_op {
    int kind;        /* OP_* */
    int ns;          /* namespace entry */
    int slot;        /* request slot (acquire, commit, grow, release) */
    int base;        /* base sequence the prompt is cut from */
    size_t n_tokens; /* prompt length (lookup, acquire, access calls), 1.. */
    size_t mut_pos;  /* position of the one mutated token, or SIZE_MAX */
    uint32_t mut;    /* its value */
    size_t extra;    /* acquire: capacity past the prompt; commit: tokens to decode; grow:
                        capacity in tokens */
    size_t cap;      /* lookup calls: block_ids capacity */
    bool ceil_ids;   /* _ids calls: pass an id for a trailing partial block too */
} iso_op;

typedef struct iso_input {
    uint32_t block_size;            /* fz_block_size */
    fz_keys keys;                   /* seed, and key bits when collisions are forced */
    bool verify;                    /* verify_tokens */
    bool large;                     /* large-pool mode */
    uint32_t small_blocks;          /* small-pool mode: pool size */
    size_t n_ns;                    /* namespace entries */
    fz_ns ns[ISO_MAX_NS];           /* the namespaces (rewritten for vllm-*: fz_ns_map_profile) */
    kvp_namespace orig[ISO_MAX_NS]; /* the namespaces as decoded (refused when the profile
                                       cannot express them) */
    int cls[ISO_MAX_NS];            /* class: the first entry that may share blocks with this one */
    size_t max_prompt;              /* longest prompt, in tokens */
    size_t max_seq;                 /* longest request sequence, in tokens */
    uint32_t *base[2];              /* the base sequences, max_seq tokens each */
    size_t n_ops;                   /* decoded calls */
    iso_op ops[ISO_MAX_OPS];        /* the calls */
    uint64_t max_blocks;            /* blocks the calls could take in total (an upper bound) */
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
    bool active;   /* acquired, not released */
    uint32_t *seq; /* prompt, then decoded tokens (max_seq entries) */
    size_t n_seq;  /* tokens in seq */
    size_t n_held; /* blocks the request holds */
} iso_req;

/* What the harness knows of one block, from events. */
typedef struct iso_block {
    int owner;                    /* class of the storing call, -1 if not indexed */
    kvp_key key;                  /* key given at STORED */
    uint32_t next;                /* next block in its key bucket (UINT32_MAX: end) */
    unsigned n_ident;             /* identity candidates; > ISO_MAX_IDENT: unknown */
    kvp_key ident[ISO_MAX_IDENT]; /* full oracle keys of what it may hold */
} iso_block;

/* One run of the ops on one cache. */
typedef struct iso_run {
    const iso_input *in;
    kvp_cache *cache;
    fz_alloc alloc;
    uint32_t n_blocks; /* pool size */
    iso_block *blk;    /* per block */
    uint32_t *buckets; /* indexed blocks by key: head per bucket, UINT32_MAX empty */
    uint32_t mask;     /* buckets - 1 */
    iso_req reqs[ISO_MAX_NS][ISO_SLOTS];
    uint32_t *tokens;  /* the current prompt (max_seq entries) */
    kvp_key *exp;      /* the current call's expected keys, as the cache keys them */
    kvp_key *full;     /* the same keys untruncated: the identities of the prefixes */
    kvp_key *highs;    /* the oracle's untruncated high halves (vllm-sha256-cbor) */
    kvp_chain *chains; /* the library's chain (kvp_hasher_blocks) of the current call */
    kvp_key *ext_ids;  /* the current _ids call's external ids */
    /* The call in progress, for the event callback. */
    int cur_cls;       /* caller's class, -1 when no STORED may happen */
    size_t cur_n_keys; /* entries in exp and full */
    size_t cur_next;   /* STORED must name block >= this one */
    kvp_key cur_root;  /* the caller's root key, as the cache keys it */
    size_t op_index;   /* for messages */
} iso_run;

static uint32_t blocks_for(uint32_t bs, size_t n)
{
    return (uint32_t)((n + bs - 1) / bs);
}

/* Prompts hold at most this many full blocks (plus a tail). */
static size_t max_prompt_blocks(uint32_t bs)
{
    return bs <= 4 ? 40 / bs : bs <= 16 ? 6 : 3;
}

/* Decode the cache shape, the namespaces and the base sequences. Cannot fail. */
static void decode_shape(fz_in *in, iso_input *x)
{
    uint8_t shape = fz_u8(in);
    x->block_size = fz_block_size(in);
    fz_keys_decode(in, &x->keys, FZ_PROFILES_ALL);
    x->verify = (shape & 1) != 0;
    x->large = (shape & 2) == 0;
    if ((shape & 12) == 0) {
        x->keys.bits = 1 + (unsigned)fz_below(in, 16);
        x->verify = true;
    }
    x->small_blocks = 1 + (uint32_t)(shape >> 4) + (uint32_t)fz_below(in, 9);
    x->n_ns = 2 + fz_below(in, ISO_MAX_NS - 1);
    fz_ns_decode_set(in, x->ns, x->n_ns);
    fz_ns_map_profile(&x->keys, x->ns, x->n_ns, x->orig);
    /* Under vllm-* without verification, namespaces whose block-0 extra keys are equal
     * (adapter "x" alone, salt "x" alone) share block 0 exactly as vLLM's keys do: one
     * class. Verification checks the namespace itself, so there classes are by value. */
    bool alias = fz_keys_vllm(&x->keys) && !x->verify;
    for (size_t i = 0; i < x->n_ns; i++) {
        x->cls[i] = (int)i;
        for (size_t j = 0; j < i; j++)
            if (alias ? fz_ns_vllm_block0_equal(&x->ns[i].ns, &x->ns[j].ns)
                      : fz_ns_equal(&x->ns[i].ns, &x->ns[j].ns)) {
                x->cls[i] = x->cls[j];
                break;
            }
    }
    uint32_t bs = x->block_size;
    x->max_prompt = (max_prompt_blocks(bs) + 1) * bs;
    x->max_seq = x->max_prompt + (size_t)2 * bs + 16;
    uint8_t salt = fz_u8(in);
    for (int b = 0; b < 2; b++) {
        x->base[b] = malloc(x->max_seq * sizeof(uint32_t));
        FZ_ASSERT(x->base[b], "out of memory");
        for (size_t i = 0; i < x->max_seq; i++) {
            size_t v = (size_t)b * 7 + i * (i + 3) + (b ? (salt >> (i % 8)) & 1 : 0);
            x->base[b][i] = alphabet[v % 4];
        }
    }
}

/* Decode one call into op and add the blocks it may take to x->max_blocks. */
static void decode_op(fz_in *in, iso_input *x, iso_op *op)
{
    uint32_t bs = x->block_size;
    uint8_t b = fz_u8(in);
    op->kind = b % N_OPS;
    op->ns = (int)((b / N_OPS) % x->n_ns);
    op->slot = (int)fz_below(in, ISO_SLOTS);
    uint8_t p = fz_u8(in);
    op->base = p & 1;
    op->n_tokens = fz_prompt_len(in, bs, max_prompt_blocks(bs));
    op->mut_pos = SIZE_MAX;
    if ((p & 6) == 0) {
        op->mut_pos = fz_below(in, op->n_tokens);
        op->mut = alphabet[fz_below(in, 4)];
    }
    op->ceil_ids = (p & 8) != 0;
    op->extra = (p & 16) ? fz_below(in, 2 * bs + 16) : (size_t)(p >> 5);
    op->cap = fz_below(in, max_prompt_blocks(bs) + 2);
    switch (op->kind) {
    case OP_ACQUIRE:
        x->max_blocks += blocks_for(bs, op->n_tokens + op->extra);
        break;
    case OP_GROW:
        op->extra = op->n_tokens + op->extra; /* capacity in tokens */
        x->max_blocks += blocks_for(bs, op->extra);
        break;
    case OP_ACCESS:
    case OP_ACCESS_IDS:
        x->max_blocks += op->n_tokens / bs;
        break;
    default:
        break;
    }
}

/* The prompt of op, written to dst. */
static void make_prompt(const iso_input *x, const iso_op *op, uint32_t *dst)
{
    memcpy(dst, x->base[op->base], op->n_tokens * sizeof(uint32_t));
    if (op->mut_pos != SIZE_MAX)
        dst[op->mut_pos] = op->mut;
}

/* ---------------------------------------------------------------------------------------- */
/* What the events say is indexed                                                           */
/* ---------------------------------------------------------------------------------------- */

static uint32_t *bucket_of(iso_run *r, kvp_key k)
{
    return &r->buckets[(k.lo ^ (k.lo >> 29) ^ k.hi) & r->mask];
}

/* An indexed block with key k, or UINT32_MAX. */
static uint32_t indexed_find(iso_run *r, kvp_key k)
{
    for (uint32_t id = *bucket_of(r, k); id != UINT32_MAX; id = r->blk[id].next)
        if (fz_key_eq(r->blk[id].key, k))
            return id;
    return UINT32_MAX;
}

static void indexed_del(iso_run *r, uint32_t id)
{
    uint32_t *p = bucket_of(r, r->blk[id].key);
    while (*p != id) {
        FZ_ASSERT(*p != UINT32_MAX, "harness: block %u missing from its bucket", id);
        p = &r->blk[*p].next;
    }
    *p = r->blk[id].next;
    r->blk[id].owner = -1;
}

/* The longest run of the current call's expected keys that are indexed. */
static size_t expected_cached(iso_run *r, size_t n_full)
{
    size_t i = 0;
    while (i < n_full && indexed_find(r, r->exp[i]) != UINT32_MAX)
        i++;
    return i;
}

static void on_event(void *ud, const kvp_event *ev)
{
    iso_run *r = ud;
    FZ_ASSERT(ev->block_id < r->n_blocks || ev->type == KVP_EVENT_CLEARED,
              "op %zu: event for block %u of %u", r->op_index, ev->block_id, r->n_blocks);
    if (ev->type == KVP_EVENT_REMOVED) {
        FZ_ASSERT(r->blk[ev->block_id].owner >= 0, "op %zu: REMOVED block %u was not indexed",
                  r->op_index, ev->block_id);
        indexed_del(r, ev->block_id);
        return;
    }
    if (ev->type != KVP_EVENT_STORED)
        return;
    FZ_ASSERT(r->cur_cls >= 0, "op %zu (%s): STORED during a call that stores nothing", r->op_index,
              op_names[r->in->ops[r->op_index].kind]);
    iso_block *b = &r->blk[ev->block_id];
    FZ_ASSERT(b->owner < 0, "op %zu: STORED block %u is already indexed", r->op_index,
              ev->block_id);
    /* With verify_tokens several blocks may share a key (a colliding block is stored beside
     * the one that failed verification, docs/security.md); without it a key is indexed once. */
    FZ_ASSERT(r->in->verify || indexed_find(r, ev->key) == UINT32_MAX,
              "op %zu: STORED key is already indexed", r->op_index);
    /* The key and parent must be the oracle's for a position at or after the last one
     * stored; with truncated keys several positions may fit, and each is a candidate. */
    size_t first = SIZE_MAX;
    b->n_ident = 0;
    for (size_t i = r->cur_next; i < r->cur_n_keys; i++) {
        kvp_key parent = i ? r->exp[i - 1] : r->cur_root;
        if (!fz_key_eq(r->exp[i], ev->key) || !fz_key_eq(parent, ev->parent) ||
            ev->parent_is_root != (i == 0))
            continue;
        if (first == SIZE_MAX)
            first = i;
        if (b->n_ident < ISO_MAX_IDENT)
            b->ident[b->n_ident] = r->full[i];
        b->n_ident++;
    }
    FZ_ASSERT(first != SIZE_MAX,
              "op %zu: STORED key/parent is not the oracle's for any block of the caller's "
              "prompt (key %016llx%016llx)",
              r->op_index, (unsigned long long)ev->key.hi, (unsigned long long)ev->key.lo);
    FZ_ASSERT(ev->n_tokens == r->in->block_size, "op %zu: STORED n_tokens %u", r->op_index,
              ev->n_tokens);
    r->cur_next = first + 1;
    b->owner = r->cur_cls;
    b->key = ev->key;
    uint32_t *head = bucket_of(r, ev->key);
    b->next = *head;
    *head = ev->block_id;
}

/* ---------------------------------------------------------------------------------------- */
/* Expected keys                                                                            */
/* ---------------------------------------------------------------------------------------- */

/* Check the library's root of ns against the oracle's full_root: through the cache's
 * hasher (kvp_hasher_root, every profile: the root and the chain start, NONE_HASH under
 * vllm-*) and, under xxh3, kvp_namespace_key too. Returns the library's root. */
static kvp_key check_lib_root(iso_run *r, const kvp_namespace *ns, kvp_key full_root,
                              kvp_chain *start)
{
    const fz_keys *k = &r->in->keys;
    FZ_ASSERT(kvp_hasher_root(kvp_cache_hasher(r->cache), ns, start) == KVP_OK &&
                  fz_key_eq(start->root, full_root) && start->n_blocks == 0,
              "op %zu: kvp_hasher_root differs from the oracle's root (%s)", r->op_index,
              kvp_hash_profile_name(k->profile));
    fz_chain s = fz_oracle_start(k, full_root);
    FZ_ASSERT(fz_key_eq(start->key, s.key) && fz_key_eq(start->high, s.high),
              "op %zu: kvp_hasher_root: chain start differs from the oracle's (%s)", r->op_index,
              kvp_hash_profile_name(k->profile));
    if (k->profile == KVP_HASH_XXH3) {
        kvp_key lib_root;
        FZ_ASSERT(kvp_namespace_key(k->seed, ns, &lib_root) == KVP_OK &&
                      fz_key_eq(lib_root, full_root),
                  "op %zu: kvp_namespace_key differs from the oracle's root", r->op_index);
    }
    return start->root;
}

/* Check the library's untruncated chain of tokens[0 .. n) (r->full, r->highs from the
 * oracle, n_full blocks): kvp_hasher_blocks of the cache's hasher for every profile, and
 * kvp_hash_blocks too under xxh3. */
static void check_lib_chain(iso_run *r, const kvp_namespace *ns, kvp_key full_root,
                            const uint32_t *tokens, size_t n, size_t n_full)
{
    const fz_keys *k = &r->in->keys;
    uint32_t bs = r->in->block_size;
    const char *pname = kvp_hash_profile_name(k->profile);
    kvp_chain c;
    kvp_key lib_root = check_lib_root(r, ns, full_root, &c);
    size_t n_lib = 0;
    FZ_ASSERT(kvp_hasher_blocks(kvp_cache_hasher(r->cache), ns, &c, tokens, n, r->chains, n_full,
                                &n_lib) == KVP_OK &&
                  n_lib == n_full,
              "op %zu: kvp_hasher_blocks", r->op_index);
    for (size_t i = 0; i < n_full; i++)
        FZ_ASSERT(fz_key_eq(r->chains[i].key, r->full[i]) &&
                      fz_key_eq(r->chains[i].high, r->highs[i]) && r->chains[i].n_blocks == i + 1,
                  "op %zu: kvp_hasher_blocks: key of block %zu (%s, block size %u) differs from "
                  "the oracle's",
                  r->op_index, i, pname, bs);
    if (k->profile != KVP_HASH_XXH3)
        return;
    FZ_ASSERT(kvp_hash_blocks(k->seed, lib_root, tokens, n, bs, r->exp, n_full, &n_lib) == KVP_OK &&
                  n_lib == n_full,
              "op %zu: kvp_hash_blocks", r->op_index);
    for (size_t i = 0; i < n_full; i++)
        FZ_ASSERT(fz_key_eq(r->exp[i], r->full[i]),
                  "op %zu: kvp_hash_blocks: key of block %zu (block size %u) differs from the "
                  "oracle's",
                  r->op_index, i, bs);
}

/* Fill r->exp/r->full with the oracle's chain of tokens[0 .. n) in namespace ns, after
 * checking that the library's key functions agree with the oracle. Returns the number of
 * full blocks; *start is the key block 0 names as its parent, as the cache keys it (the
 * truncated root, or NONE_HASH under vllm-*). */
static size_t token_keys(iso_run *r, const kvp_namespace *ns, const uint32_t *tokens, size_t n,
                         kvp_key *start)
{
    const fz_keys *k = &r->in->keys;
    uint32_t bs = r->in->block_size;
    kvp_key full_root = fz_oracle_root(k, ns);
    size_t n_full =
        fz_oracle_chain(k, 128, ns, full_root, tokens, n, bs, r->full, r->highs, SIZE_MAX);
    check_lib_chain(r, ns, full_root, tokens, n, n_full);
    kvp_key root = fz_key_trunc(full_root, k->bits);
    *start = fz_oracle_start(k, root).key;
    if (k->bits < 128)
        fz_oracle_chain(k, k->bits, ns, root, tokens, n, bs, r->exp, NULL, n_full);
    else
        memcpy(r->exp, r->full, n_full * sizeof *r->exp);
    return n_full;
}

/* The external ids of a prompt: a chain over its blocks under an xxh3 seed of the
 * harness's own and a zero root (id i names the prefix up to block i, in every namespace
 * alike), plus an arbitrary id for a trailing partial block. Returns the number of ids. */
static size_t make_ext_ids(iso_run *r, const iso_op *op, const uint32_t *tokens)
{
    static const fz_keys ext = {.profile = KVP_HASH_XXH3, .seed = ISO_EXT_SEED, .bits = 128};
    uint32_t bs = r->in->block_size;
    kvp_key zero = {0, 0};
    size_t n = fz_oracle_chain(&ext, 128, NULL, zero, tokens, op->n_tokens, bs, r->ext_ids, NULL,
                               SIZE_MAX);
    if (op->ceil_ids && op->n_tokens % bs) {
        r->ext_ids[n].lo = UINT64_C(0xe47e0000) + op->n_tokens;
        r->ext_ids[n].hi = (uint64_t)op->base;
        n++;
    }
    return n;
}

/* Fill r->exp/r->full with the oracle's scoped keys of the external ids (checking
 * kvp_hasher_root, kvp_hasher_external_key and, under xxh3, kvp_namespace_key and
 * kvp_external_key against it). Returns the full blocks. */
static size_t ext_keys(iso_run *r, const kvp_namespace *ns, size_t n_full, kvp_key *root)
{
    const fz_keys *k = &r->in->keys;
    kvp_key full_root = fz_oracle_root(k, ns);
    kvp_chain c;
    kvp_key lib_root = check_lib_root(r, ns, full_root, &c);
    const kvp_hasher *h = kvp_cache_hasher(r->cache);
    *root = fz_key_trunc(full_root, k->bits);
    for (size_t i = 0; i < n_full; i++) {
        r->full[i] = fz_oracle_external(k, full_root, r->ext_ids[i]);
        FZ_ASSERT(fz_key_eq(kvp_hasher_external_key(h, lib_root, r->ext_ids[i]), r->full[i]),
                  "op %zu: kvp_hasher_external_key differs from the oracle's (%s)", r->op_index,
                  kvp_hash_profile_name(k->profile));
        FZ_ASSERT(k->profile != KVP_HASH_XXH3 ||
                      fz_key_eq(kvp_external_key(k->seed, lib_root, r->ext_ids[i]), r->full[i]),
                  "op %zu: kvp_external_key differs from the oracle's", r->op_index);
        r->exp[i] = fz_key_trunc(fz_oracle_external(k, *root, r->ext_ids[i]), k->bits);
    }
    return n_full;
}

/* ---------------------------------------------------------------------------------------- */
/* Calls                                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* Check that hit block ids[0 .. n) belong to class cls and hold the expected keys (and,
 * where known, the expected identities). */
static void check_hits(const iso_run *r, const uint32_t *ids, size_t n, int cls)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t id = ids[i];
        FZ_ASSERT(id < r->n_blocks, "op %zu: hit block id %u out of range", r->op_index, id);
        const iso_block *b = &r->blk[id];
        FZ_ASSERT(b->owner >= 0, "op %zu: hit %zu is block %u, which is not cached", r->op_index, i,
                  id);
        FZ_ASSERT(b->owner == cls,
                  "op %zu: ISOLATION: hit %zu is block %u stored by namespace class %d, caller "
                  "is class %d",
                  r->op_index, i, id, b->owner, cls);
        FZ_ASSERT(fz_key_eq(b->key, r->exp[i]),
                  "op %zu: hit %zu is block %u, whose key is not the prompt's", r->op_index, i, id);
        bool known = b->n_ident <= ISO_MAX_IDENT, found = !known;
        for (unsigned k = 0; known && k < b->n_ident; k++)
            found = found || fz_key_eq(b->ident[k], r->full[i]);
        FZ_ASSERT(found,
                  "op %zu: COLLISION: hit %zu is block %u, which holds another prefix (verified "
                  "with %u key bits)",
                  r->op_index, i, id, r->in->keys.bits);
    }
}

/* The match of a successful call against what the events say is indexed (n_full keys in
 * r->exp, counted before the call). */
static void check_match(const iso_run *r, const kvp_match *m, size_t n_tokens, size_t expected)
{
    uint32_t bs = r->in->block_size;
    bool ok = r->in->verify ? m->n_blocks_cached <= expected : m->n_blocks_cached == expected;
    FZ_ASSERT(ok,
              "op %zu: SHARING: %u blocks cached, but %zu of the prompt's oracle keys are "
              "indexed",
              r->op_index, m->n_blocks_cached, expected);
    size_t cap = (n_tokens - 1) / bs;
    size_t hit = m->n_blocks_cached < cap ? m->n_blocks_cached : cap;
    FZ_ASSERT(m->n_blocks_hit == hit && m->n_tokens_hit == (uint64_t)hit * bs &&
                  m->n_blocks_full == n_tokens / bs && m->n_tokens == n_tokens,
              "op %zu: match of %zu tokens: full %u cached %u hit %u tokens %llu", r->op_index,
              n_tokens, m->n_blocks_full, m->n_blocks_cached, m->n_blocks_hit,
              (unsigned long long)m->n_tokens_hit);
}

static void begin_call(iso_run *r, int cls, size_t n_keys, kvp_key root)
{
    r->cur_cls = cls;
    r->cur_n_keys = n_keys;
    r->cur_next = 0;
    r->cur_root = root;
}

/* kvp_acquire of op; records the request on success. */
static int run_acquire(iso_run *r, const iso_op *op, iso_req *q, uint64_t id, kvp_match *m)
{
    const iso_input *x = r->in;
    int cls = x->cls[op->ns];
    kvp_key root;
    size_t n_keys = token_keys(r, &x->ns[op->ns].ns, r->tokens, op->n_tokens, &root);
    size_t expected = expected_cached(r, n_keys);
    begin_call(r, cls, n_keys, root);
    int rc = kvp_acquire(r->cache, id, &x->ns[op->ns].ns, r->tokens, op->n_tokens,
                         op->n_tokens + op->extra, m);
    if (rc != KVP_OK)
        return rc;
    check_match(r, m, op->n_tokens, expected);
    const uint32_t *held;
    size_t n_held = 0;
    FZ_ASSERT(kvp_request_blocks(r->cache, id, &held, &n_held) == KVP_OK &&
                  n_held == blocks_for(x->block_size, op->n_tokens + op->extra),
              "op %zu: acquired request holds %zu blocks", r->op_index, n_held);
    check_hits(r, held, m->n_blocks_hit, cls);
    FZ_ASSERT(!q->active, "op %zu: acquire of an active id succeeded", r->op_index);
    q->active = true;
    memcpy(q->seq, r->tokens, op->n_tokens * sizeof(uint32_t));
    q->n_seq = op->n_tokens;
    q->n_held = n_held;
    return rc;
}

/* kvp_commit of op: decode up to `extra` tokens within what the request holds, commit. */
static int run_commit(iso_run *r, const iso_op *op, iso_req *q, uint64_t id, size_t *n_stored)
{
    const iso_input *x = r->in;
    uint32_t dummy = 0;
    const uint32_t *seq = &dummy;
    size_t n_seq = 1;
    if (q->active) {
        size_t limit = q->n_held * x->block_size;
        for (size_t k = 0; k < op->extra && q->n_seq < limit && q->n_seq < x->max_seq; k++)
            q->seq[q->n_seq++] = r->tokens[k % op->n_tokens];
        seq = q->seq;
        n_seq = q->n_seq;
    }
    kvp_key root;
    size_t n_keys = token_keys(r, &x->ns[op->ns].ns, seq, n_seq, &root);
    begin_call(r, x->cls[op->ns], n_keys, root);
    return kvp_commit(r->cache, id, seq, n_seq, n_stored);
}

/* kvp_lookup, kvp_access or their _ids forms of op. */
static int run_match(iso_run *r, const iso_op *op, kvp_match *m)
{
    const iso_input *x = r->in;
    const kvp_namespace *ns = &x->ns[op->ns].ns;
    int cls = x->cls[op->ns];
    bool by_ids = op->kind == OP_LOOKUP_IDS || op->kind == OP_ACCESS_IDS;
    bool stores = op->kind == OP_ACCESS || op->kind == OP_ACCESS_IDS;
    uint32_t ids[64];
    size_t cap = op->cap < 64 ? op->cap : 64;
    memset(ids, 0xff, sizeof ids); /* an id the library did not write is out of range */
    size_t n_ids = 0, n_keys;
    kvp_key root;
    if (by_ids) {
        n_ids = make_ext_ids(r, op, r->tokens);
        n_keys = ext_keys(r, ns, op->n_tokens / x->block_size, &root);
    } else {
        n_keys = token_keys(r, ns, r->tokens, op->n_tokens, &root);
    }
    size_t expected = expected_cached(r, n_keys);
    begin_call(r, stores ? cls : -1, n_keys, root);
    int rc;
    switch (op->kind) {
    case OP_LOOKUP:
        rc = kvp_lookup(r->cache, ns, r->tokens, op->n_tokens, ids, cap, m);
        break;
    case OP_ACCESS:
        rc = kvp_access(r->cache, ns, r->tokens, op->n_tokens, m);
        break;
    case OP_LOOKUP_IDS:
        rc = kvp_lookup_ids(r->cache, ns, r->ext_ids, n_ids, op->n_tokens, ids, cap, m);
        break;
    default:
        rc = kvp_access_ids(r->cache, ns, r->ext_ids, n_ids, op->n_tokens, m);
        break;
    }
    FZ_ASSERT(!by_ids || (rc == KVP_EINVAL) == x->verify,
              "op %zu (%s): %s on a cache with verify_tokens %d", r->op_index, op_names[op->kind],
              kvp_strerror(rc), x->verify);
    if (rc != KVP_OK)
        return rc;
    check_match(r, m, op->n_tokens, expected);
    if (!stores)
        check_hits(r, ids, m->n_blocks_hit < cap ? m->n_blocks_hit : cap, cls);
    return rc;
}

/* Run one op; fill *res. */
static void run_op(iso_run *r, const iso_op *op, iso_result *res)
{
    const iso_input *x = r->in;
    iso_req *q = &r->reqs[op->ns][op->slot];
    uint64_t id = (uint64_t)op->ns * 16 + (uint64_t)op->slot + 1;
    kvp_key none = {0, 0};
    kvp_match m;
    memset(res, 0, sizeof *res);
    memset(&m, 0, sizeof m);
    make_prompt(x, op, r->tokens);
    switch (op->kind) {
    case OP_ACQUIRE:
        res->rc = run_acquire(r, op, q, id, &m);
        break;
    case OP_COMMIT:
        res->rc = run_commit(r, op, q, id, &res->n_stored);
        break;
    case OP_GROW:
        begin_call(r, -1, 0, none);
        res->rc = kvp_grow(r->cache, id, op->extra);
        if (res->rc == KVP_OK && blocks_for(x->block_size, op->extra) > q->n_held)
            q->n_held = blocks_for(x->block_size, op->extra);
        break;
    case OP_RELEASE:
        begin_call(r, -1, 0, none);
        res->rc = kvp_release(r->cache, id);
        if (res->rc == KVP_OK)
            q->active = false;
        break;
    default:
        res->rc = run_match(r, op, &m);
        break;
    }
    r->cur_cls = -1;
    res->n_blocks_cached = m.n_blocks_cached;
    res->n_blocks_hit = m.n_blocks_hit;
    res->n_tokens_hit = m.n_tokens_hit;
    bool by_ids = op->kind == OP_LOOKUP_IDS || op->kind == OP_ACCESS_IDS;
    bool allowed = res->rc == KVP_OK || res->rc == KVP_ENOSPC || res->rc == KVP_ETOOBIG ||
                   res->rc == KVP_ENOENT || res->rc == KVP_EEXIST ||
                   (res->rc == KVP_EINVAL && by_ids);
    FZ_ASSERT(allowed, "op %zu (%s): unexpected %s", r->op_index, op_names[op->kind],
              kvp_strerror(res->rc));
    FZ_ASSERT(res->rc != KVP_ENOENT || (!q->active && op->kind != OP_ACQUIRE),
              "op %zu (%s): ENOENT for an active request", r->op_index, op_names[op->kind]);
    FZ_ASSERT(res->rc != KVP_ENOSPC || !x->large, "op %zu (%s): ENOSPC in a large pool",
              r->op_index, op_names[op->kind]);
}

static iso_run *run_new(const iso_input *x, uint32_t n_blocks)
{
    iso_run *r = calloc(1, sizeof *r);
    FZ_ASSERT(r, "out of memory");
    r->in = x;
    r->n_blocks = n_blocks;
    r->mask = 1;
    while (r->mask < n_blocks)
        r->mask <<= 1;
    r->buckets = malloc(r->mask * sizeof *r->buckets);
    r->mask--;
    r->blk = calloc(n_blocks, sizeof *r->blk);
    size_t n_keys = x->max_seq / x->block_size + 2;
    r->tokens = malloc(x->max_seq * sizeof *r->tokens);
    r->exp = malloc(n_keys * sizeof *r->exp);
    r->full = malloc(n_keys * sizeof *r->full);
    r->ext_ids = malloc(n_keys * sizeof *r->ext_ids);
    r->highs = malloc(n_keys * sizeof *r->highs);
    r->chains = malloc(n_keys * sizeof *r->chains);
    FZ_ASSERT(r->buckets && r->blk && r->tokens && r->exp && r->full && r->ext_ids && r->highs &&
                  r->chains,
              "out of memory");
    for (uint32_t i = 0; i <= r->mask; i++)
        r->buckets[i] = UINT32_MAX;
    for (uint32_t b = 0; b < n_blocks; b++)
        r->blk[b].owner = -1;
    for (size_t n = 0; n < x->n_ns; n++)
        for (int s = 0; s < ISO_SLOTS; s++) {
            r->reqs[n][s].seq = malloc(x->max_seq * sizeof(uint32_t));
            FZ_ASSERT(r->reqs[n][s].seq, "out of memory");
        }
    r->cur_cls = -1;
    return r;
}

static void run_free(iso_run *r)
{
    for (size_t n = 0; n < r->in->n_ns; n++)
        for (int s = 0; s < ISO_SLOTS; s++)
            free(r->reqs[n][s].seq);
    free(r->buckets);
    free(r->blk);
    free(r->tokens);
    free(r->exp);
    free(r->full);
    free(r->ext_ids);
    free(r->highs);
    free(r->chains);
    free(r);
}

/* Every namespace the profile cannot express (vllm-*: model or tenant present, empty salt)
 * must be refused with KVP_ENOTSUP by the hasher and by a lookup and an access (which would
 * store), and must leave the cache as it was: no event, the checker passes. */
static void check_refusals(iso_run *r)
{
    const iso_input *x = r->in;
    for (size_t i = 0; i < x->n_ns; i++) {
        const kvp_namespace *ns = &x->orig[i];
        if (fz_ns_expressible(&x->keys, ns))
            continue;
        kvp_chain c;
        kvp_match m;
        uint32_t ids[4];
        size_t n =
            x->max_prompt < 2 * (size_t)x->block_size ? x->max_prompt : 2 * (size_t)x->block_size;
        int rc = kvp_hasher_root(kvp_cache_hasher(r->cache), ns, &c);
        FZ_ASSERT(rc == KVP_ENOTSUP, "namespace %zu: kvp_hasher_root: %s, not KVP_ENOTSUP", i,
                  kvp_strerror(rc));
        r->cur_cls = -1; /* a STORED event now fails the input */
        rc = kvp_lookup(r->cache, ns, x->base[0], n, ids, 4, &m);
        FZ_ASSERT(rc == KVP_ENOTSUP, "namespace %zu: kvp_lookup: %s, not KVP_ENOTSUP", i,
                  kvp_strerror(rc));
        rc = kvp_access(r->cache, ns, x->base[0], n, &m);
        FZ_ASSERT(rc == KVP_ENOTSUP, "namespace %zu: kvp_access: %s, not KVP_ENOTSUP", i,
                  kvp_strerror(rc));
        FZ_ASSERT(kvp_cache_check(r->cache) == KVP_OK, "kvp_cache_check after a refusal");
    }
}

/* Run the ops whose class is only_cls (all when -1) on a fresh cache of n_blocks blocks;
 * results go to res[op index]. */
static void run(const iso_input *x, uint32_t n_blocks, int only_cls, bool check, iso_result *res)
{
    iso_run *r = run_new(x, n_blocks);
    fz_alloc_init(&r->alloc);
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = n_blocks;
    cfg.block_size = x->block_size;
    cfg.verify_tokens = x->verify;
    cfg.alloc = fz_alloc_hooks(&r->alloc);
    cfg.on_event = on_event;
    cfg.event_ud = r;
    fz_keys_apply(&x->keys, &cfg);
    FZ_ASSERT(kvp_cache_new(&cfg, &r->cache) == KVP_OK, "kvp_cache_new");
    fz_keys_truncate_cache(&x->keys, r->cache);
    check_refusals(r);
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
    run_free(r);
}

/* Equal classes must have equal oracle roots and distinct ones distinct roots: the
 * oracle's framing agrees with field-by-field comparison. */
static void check_classes(const iso_input *x)
{
    for (size_t i = 0; i < x->n_ns; i++)
        for (size_t j = 0; j < i; j++) {
            bool same = fz_key_eq(fz_oracle_root(&x->keys, &x->ns[i].ns),
                                  fz_oracle_root(&x->keys, &x->ns[j].ns));
            bool equal = fz_ns_equal(&x->ns[i].ns, &x->ns[j].ns);
            FZ_ASSERT(same == equal, "namespaces %zu and %zu: %s but oracle roots %s", i, j,
                      equal ? "equal" : "different", same ? "equal" : "different");
        }
}

/* Rerun each class alone and compare its results with the run of all namespaces. */
static void check_noninterference(const iso_input *x, uint32_t n_blocks, const iso_result *all)
{
    static iso_result only[ISO_MAX_OPS];
    for (size_t c = 0; c < x->n_ns; c++) {
        if (x->cls[c] != (int)c)
            continue; /* each class once, under its first entry */
        run(x, n_blocks, (int)c, false, only);
        for (size_t k = 0; k < x->n_ops; k++) {
            const iso_op *op = &x->ops[k];
            if (x->cls[op->ns] != (int)c)
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
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_harness = "fuzz_isolation";
    static iso_input x; /* rewritten from scratch for every input */
    static iso_result all[ISO_MAX_OPS];
    fz_in in = {data, size};
    memset(&x, 0, sizeof x);
    decode_shape(&in, &x);
    while (fz_more(&in) && x.n_ops < ISO_MAX_OPS)
        decode_op(&in, &x, &x.ops[x.n_ops++]);
    check_classes(&x);
    if (!x.large) {
        run(&x, x.small_blocks, -1, true, all);
    } else {
        uint32_t n_blocks = (uint32_t)x.max_blocks + 1;
        run(&x, n_blocks, -1, true, all);
        if (x.keys.bits == 128)
            check_noninterference(&x, n_blocks, all);
    }
    free(x.base[0]);
    free(x.base[1]);
    return 0;
}
