/*
 * router_score.c - scoring a prompt against every worker: per worker, the longest run of
 * consecutive blocks from block 0 that it holds, and that run weighted by tier.
 *
 * kvp__rt_score:
 *   1. under the shared lock: fill one row per live worker (stale ones marked), note which
 *      hash groups have a fresh worker, and the worker set's epoch;
 *   2. per such group, outside the lock: the request's namespace as the group's engines
 *      hash it (the worker's model filled in or, for vllm-*, left out), its chain root,
 *      and the keys of the first SCORE_FIRST blocks;
 *   3. under the shared lock: probe the group's keys from block 0; a worker's run grows
 *      while it holds each next block, and the group stops at the first block none of its
 *      fresh workers extends. If the group ran past the keys hashed so far, unlock, hash 4
 *      times as many and probe on: from where it stopped if no writer ran meanwhile (the
 *      router's version), else again from block 0, so that every group's rows come from
 *      one consistent state of the index;
 *   4. if the worker set changed meanwhile (epoch), start again.
 *
 * Also here: kvp__rt_group_keys (a group's keys for the Redis store, which probes them
 * itself) and score_hashes (kvp_router_score_hashes on the local index: the given hashes
 * probed for every fresh worker, whatever its group, under one hold of the lock).
 *
 * Step 1 also hands out each row's engine id: the interned string of router_workers.c,
 * which outlives the worker, so the pointer stays valid whatever another thread does after
 * the shared lock is released.
 *
 * Cost: hashing is the bulk (a prompt is hashed once per group, never past the longest
 * cached prefix's next quadrupling); probing is one table lookup per block plus one step
 * per holder. Nothing is allocated up to SCORE_STACK_KEYS blocks; longer prompts take one
 * malloc'ed key buffer (the router's allocator counts writer-owned bytes, so this scratch,
 * taken under the shared lock's regime, does not use it).
 */
#include <stdlib.h>
#include <string.h>

#include "router_score.h"

#define SCORE_FIRST      32u   /* blocks hashed before the first probe */
#define SCORE_CHAINS     64u   /* kvp_chain states per kvp_hasher_blocks call (stack) */
#define SCORE_STACK_KEYS 1024u /* keys kept on the stack; longer prompts malloc */
#define SCORE_PREFETCH   8u    /* probes ahead whose home slot is prefetched */

/* Per-call scratch: the keys of one group's prompt. */
typedef struct score_keys {
    uint64_t *k;     /* keys[0 .. n_hashed) */
    size_t n_hashed; /* keys computed so far */
    size_t cap;      /* room at k */
    kvp_chain chain; /* the chain after key n_hashed - 1 (the root before key 0) */
    uint64_t *heap;  /* malloc'ed buffer, or NULL */
    size_t want;     /* keys the longest group needs */
} score_keys;

/* Step 1: rows for every live worker (engine ids into ids, unless NULL); fresh[g] says
 * whether group g has a fresh worker. Shared lock held. */
static void fill_rows_locked(const kvp__rt_index *ix, kvp_router_row *rows, const char **ids,
                             bool *fresh)
{
    memset(fresh, 0, ix->n_groups * sizeof *fresh);
    for (uint32_t i = 0; i < ix->n_slots; i++) {
        const kvp__rt_worker *w = &ix->workers[i];
        if (!w->live)
            continue;
        kvp_router_row *row = &rows[w->row];
        memset(row, 0, sizeof *row);
        row->worker = i;
        row->dp_rank = w->dp_rank;
        row->state = w->stale ? KVP_ROUTER_ROW_STALE : KVP_ROUTER_ROW_SCORED;
        if (ids)
            ids[w->row] = w->engine_id;
        fresh[w->group] |= !w->stale;
    }
}

/* Reset group g's rows to state (stale workers stay STALE); returns its fresh workers. */
static uint32_t reset_group_locked(const kvp__rt_index *ix, uint32_t g, kvp_router_row *rows,
                                   int state)
{
    uint32_t n_fresh = 0;
    for (uint32_t i = 0; i < ix->n_slots; i++) {
        const kvp__rt_worker *w = &ix->workers[i];
        if (!w->live || w->group != g)
            continue;
        kvp_router_row *row = &rows[w->row];
        row->state = w->stale ? KVP_ROUTER_ROW_STALE : state;
        row->n_blocks = 0;
        row->n_tokens = 0;
        row->score = 0;
        n_fresh += !w->stale;
    }
    return n_fresh;
}

/* Step 3: probe keys[from .. n) for group g; rows hold the group's runs over keys[0 ..
 * from) (from == 0: reset them first). Returns the number of blocks some fresh worker of g
 * holds in a run (< n: the group stopped). Shared lock held. */
static size_t probe_group_locked(const kvp__rt_index *ix, uint32_t g, const uint64_t *keys,
                                 size_t from, size_t n, kvp_router_row *rows)
{
    if (from == 0 && reset_group_locked(ix, g, rows, KVP_ROUTER_ROW_SCORED) == 0)
        return 0;
    if (ix->table.n_entries == 0)
        return from;
    uint32_t bs = ix->groups[g]->hash.block_size;
    for (size_t i = from; i < n; i++) {
        kvp__rt_prefetch(&ix->table, keys[i + SCORE_PREFETCH < n ? i + SCORE_PREFETCH : i]);
        uint32_t pos = kvp__rt_find(&ix->table, keys[i]);
        if (pos == KVP__RT_NIL)
            return i;
        kvp__rt_holders hs;
        kvp__rt_holders_of(&ix->table, pos, &hs);
        uint32_t extended = 0;
        for (uint32_t j = 0; j < hs.n; j++) {
            const kvp__rt_worker *w = &ix->workers[kvp__rt_holder_worker(hs.h[j])];
            if (w->group != g || w->stale)
                continue;
            kvp_router_row *row = &rows[w->row];
            if (row->n_blocks != i)
                continue;
            row->n_blocks++;
            row->n_tokens += bs;
            row->score += ix->weight_of_mask[kvp__rt_holder_mask(hs.h[j])];
            extended++;
        }
        if (extended == 0)
            return i;
    }
    return n;
}

/* The namespace group g's engines hash the request under, or false when the request names
 * another model than the group's. */
/* Token mode: whether the router's own keys can express namespace ns. Events carry no
 * cache_salt and no tenant, so blocks are indexed without them: a request with either would
 * be scored against blocks of other salts (over-reported), and is refused instead. */
static inline bool own_namespace_ok(const kvp__rt_group *g, const kvp_namespace *ns)
{
    return !g->own || (!ns->salt.ptr && !ns->tenant.ptr);
}

static bool group_namespace(const kvp__rt_group *g, const kvp_namespace *ns, kvp_namespace *eff)
{
    *eff = *ns;
    if (ns->model.ptr && g->model &&
        !(ns->model.len == g->model_len && memcmp(ns->model.ptr, g->model, g->model_len) == 0))
        return false;
    if (g->is_vllm) {
        eff->model.ptr = NULL;
        eff->model.len = 0;
    } else if (!ns->model.ptr && g->model) {
        eff->model.ptr = g->model;
        eff->model.len = g->model_len;
    }
    return true;
}

/* Hash keys up to `want` (<= sk->cap). KVP_OK or the hasher's code. */
static int hash_more(const kvp__rt_group *g, const kvp_namespace *ns, const uint32_t *tokens,
                     score_keys *sk, size_t want)
{
    uint32_t bs = g->hash.block_size;
    kvp_chain out[SCORE_CHAINS];
    while (sk->n_hashed < want) {
        size_t n = want - sk->n_hashed < SCORE_CHAINS ? want - sk->n_hashed : SCORE_CHAINS;
        size_t got = 0;
        int rc = kvp_hasher_blocks(g->hasher, ns, &sk->chain, tokens + sk->n_hashed * bs, n * bs,
                                   out, n, &got);
        if (rc != KVP_OK)
            return rc;
        assert(got == n);
        for (size_t i = 0; i < got; i++)
            sk->k[sk->n_hashed + i] = out[i].key.lo;
        sk->n_hashed += got;
    }
    return KVP_OK;
}

/* Is every token below the group's vocab_size (the engine refuses the prompt otherwise)? */
static bool tokens_in_vocab(const kvp__rt_group *g, const uint32_t *tokens, size_t n)
{
    if (g->hash.vocab_size == 0)
        return true;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] >= g->hash.vocab_size)
            return false;
    }
    return true;
}

/* Mark group g's fresh rows with state, under the lock. Returns KVP_OK, or 1 when the
 * worker set changed since epoch (nothing marked). */
static int mark_group(kvp__rt_index *ix, uint32_t g, kvp_router_row *rows, int state,
                      uint64_t epoch)
{
    kvp__rt_rdlock(&ix->lock);
    int changed = ix->epoch != epoch;
    if (!changed)
        (void)reset_group_locked(ix, g, rows, state);
    kvp__rt_unlock(&ix->lock);
    return changed;
}

/* Steps 2-3 for group g. Returns KVP_OK, 1 (the worker set changed: start again),
 * KVP_EINVAL (a namespace field is invalid). */
static int score_group(kvp__rt_index *ix, uint32_t g, const kvp_namespace *ns,
                       const uint32_t *tokens, size_t n_tokens, kvp_router_row *rows,
                       score_keys *sk, uint64_t epoch)
{
    const kvp__rt_group *grp = ix->groups[g];
    kvp_namespace eff;
    if (!group_namespace(grp, ns, &eff))
        return mark_group(ix, g, rows, KVP_ROUTER_ROW_MODEL, epoch);
    int rc = kvp_hasher_root(grp->hasher, &eff, &sk->chain);
    if (rc == KVP_EINVAL)
        return rc;
    if (rc != KVP_OK || !own_namespace_ok(grp, &eff))
        return mark_group(ix, g, rows, KVP_ROUTER_ROW_NOTSUP, epoch);
    if (!tokens_in_vocab(grp, tokens, n_tokens))
        return mark_group(ix, g, rows, KVP_ROUTER_ROW_TOKEN, epoch);
    size_t n_full = n_tokens / grp->hash.block_size;
    size_t want = n_full < SCORE_FIRST ? n_full : SCORE_FIRST, probed = 0;
    uint64_t version = 0;
    sk->n_hashed = 0;
    for (;;) {
        rc = hash_more(grp, &eff, tokens, sk, want);
        if (rc != KVP_OK)
            return mark_group(ix, g, rows, KVP_ROUTER_ROW_NOTSUP, epoch);
        kvp__rt_rdlock(&ix->lock);
        int changed = ix->epoch != epoch;
        /* Unchanged since the last pass: its rows still hold, continue where it stopped. */
        size_t from = probed > 0 && ix->lock.version == version ? probed : 0;
        size_t run = changed ? 0 : probe_group_locked(ix, g, sk->k, from, want, rows);
        version = ix->lock.version;
        kvp__rt_unlock(&ix->lock);
        if (changed)
            return 1;
        if (run < want || want == n_full)
            break;
        probed = want;
        want = n_full / 4 < want ? n_full : want * 4;
    }
    return KVP_OK;
}

/* The most keys any group needs for n_tokens (the smallest block size's count). */
static size_t max_keys_locked(const kvp__rt_index *ix, size_t n_tokens)
{
    uint32_t min_bs = UINT32_MAX;
    for (uint32_t g = 0; g < ix->n_groups; g++) {
        if (ix->groups[g]->hash.block_size < min_bs)
            min_bs = ix->groups[g]->hash.block_size;
    }
    return min_bs == UINT32_MAX ? 0 : n_tokens / min_bs;
}

/* One attempt at steps 1-3. Returns KVP_OK, KVP_ENOSPC, KVP_EINVAL, 1 (start again) or 2
 * (start again with room for sk->want keys). */
static int score_once(kvp__rt_index *ix, const kvp__rt_query *q, size_t *n_rows, score_keys *sk)
{
    const kvp_namespace *ns = q->ns;
    const uint32_t *tokens = q->tokens;
    size_t n_tokens = q->n_tokens;
    kvp_router_row *rows = q->rows;
    bool fresh[KVP_ROUTER_MAX_GROUPS];
    /* Step 1: rows. */
    kvp__rt_rdlock(&ix->lock);
    uint32_t n = ix->n_workers, n_groups = ix->n_groups;
    uint64_t epoch = ix->epoch;
    if (q->cap < n) {
        kvp__rt_unlock(&ix->lock);
        *n_rows = n;
        return KVP_ENOSPC;
    }
    sk->want = max_keys_locked(ix, n_tokens);
    if (sk->want > sk->cap) {
        kvp__rt_unlock(&ix->lock);
        return 2;
    }
    fill_rows_locked(ix, rows, q->engine_ids, fresh);
    kvp__rt_unlock(&ix->lock);
    /* Steps 2 and 3: each group with a fresh worker. */
    for (uint32_t g = 0; g < n_groups; g++) {
        if (!fresh[g])
            continue;
        int rc = score_group(ix, g, ns, tokens, n_tokens, rows, sk, epoch);
        if (rc != KVP_OK)
            return rc;
    }
    *n_rows = n;
    return KVP_OK;
}

static int score_hashes(kvp__rt_index *ix, const kvp__rt_query *q, size_t *n_rows);

int kvp__rt_score(kvp__rt_index *ix, const kvp__rt_query *q, size_t *n_rows)
{
    if (!q->ns)
        return score_hashes(ix, q, n_rows);
    uint64_t stack_keys[SCORE_STACK_KEYS];
    score_keys sk;
    memset(&sk, 0, sizeof sk);
    sk.k = stack_keys;
    sk.cap = SCORE_STACK_KEYS;
    /* Step 4: start again while the worker set changes under us (or the key buffer must
     * grow for a group added meanwhile). */
    int rc;
    for (;;) {
        rc = score_once(ix, q, n_rows, &sk);
        if (rc == 2) {
            free(sk.heap);
            sk.heap = malloc(sk.want * sizeof *sk.heap);
            if (!sk.heap) {
                rc = KVP_ENOMEM;
                break;
            }
            sk.k = sk.heap;
            sk.cap = sk.want;
            continue;
        }
        if (rc != 1)
            break;
    }
    free(sk.heap);
    if (rc == KVP_OK)
        atomic_fetch_add_explicit(&ix->n_scores, 1, memory_order_relaxed);
    return rc;
}

int kvp__rt_group_keys(const kvp__rt_group *g, const kvp_namespace *ns, const uint32_t *tokens,
                       size_t n_tokens, uint64_t *keys, int *state)
{
    kvp_namespace eff;
    score_keys sk;
    memset(&sk, 0, sizeof sk);
    *state = KVP_ROUTER_ROW_MODEL;
    if (!group_namespace(g, ns, &eff))
        return KVP_OK;
    int rc = kvp_hasher_root(g->hasher, &eff, &sk.chain);
    *state = KVP_ROUTER_ROW_NOTSUP;
    if (rc == KVP_EINVAL)
        return rc;
    if (rc != KVP_OK || !own_namespace_ok(g, &eff))
        return KVP_OK;
    *state = KVP_ROUTER_ROW_TOKEN;
    if (!tokens_in_vocab(g, tokens, n_tokens))
        return KVP_OK;
    sk.k = keys;
    sk.cap = n_tokens / g->hash.block_size;
    *state = hash_more(g, &eff, tokens, &sk, sk.cap) == KVP_OK ? KVP_ROUTER_ROW_SCORED
                                                               : KVP_ROUTER_ROW_NOTSUP;
    return KVP_OK;
}

/* score_hashes' probe: keys[0 .. n) against every fresh worker, whatever its
 * group. Shared lock held; rows filled by fill_rows_locked. */
static void probe_all_locked(const kvp__rt_index *ix, const uint64_t *keys, size_t n,
                             kvp_router_row *rows)
{
    for (size_t i = 0; i < n && ix->table.n_entries > 0; i++) {
        kvp__rt_prefetch(&ix->table, keys[i + SCORE_PREFETCH < n ? i + SCORE_PREFETCH : i]);
        uint32_t pos = kvp__rt_find(&ix->table, keys[i]);
        if (pos == KVP__RT_NIL)
            return;
        kvp__rt_holders hs;
        kvp__rt_holders_of(&ix->table, pos, &hs);
        uint32_t extended = 0;
        for (uint32_t j = 0; j < hs.n; j++) {
            const kvp__rt_worker *w = &ix->workers[kvp__rt_holder_worker(hs.h[j])];
            kvp_router_row *row = &rows[w->row];
            if (w->stale || row->n_blocks != i)
                continue;
            row->n_blocks++;
            row->n_tokens += ix->groups[w->group]->hash.block_size;
            row->score += ix->weight_of_mask[kvp__rt_holder_mask(hs.h[j])];
            extended++;
        }
        if (extended == 0)
            return;
    }
}

/* kvp_router_score_hashes on the index, under one hold of the shared lock. */
static int score_hashes(kvp__rt_index *ix, const kvp__rt_query *q, size_t *n_rows)
{
    bool fresh[KVP_ROUTER_MAX_GROUPS];
    kvp__rt_rdlock(&ix->lock);
    uint32_t n = ix->n_workers;
    if (q->cap < n) {
        kvp__rt_unlock(&ix->lock);
        *n_rows = n;
        return KVP_ENOSPC;
    }
    fill_rows_locked(ix, q->rows, q->engine_ids, fresh);
    probe_all_locked(ix, q->hashes, q->n_hashes, q->rows);
    kvp__rt_unlock(&ix->lock);
    *n_rows = n;
    atomic_fetch_add_explicit(&ix->n_scores, 1, memory_order_relaxed);
    return KVP_OK;
}

/* ---------------------------------------------------------------- key check */

/* The engine-hash mode's key check: hash one root block with a hasher of cfg's profile, or
 * report that it could not. */
static bool root_key(const kvp_config *cfg, const kvp_namespace *ns, const uint32_t *tokens,
                     kvp_key *key)
{
    kvp_hasher *h = NULL;
    kvp_chain c, out;
    size_t got = 0;
    bool ok = kvp_hasher_new(cfg, &h) == KVP_OK && kvp_hasher_root(h, ns, &c) == KVP_OK &&
              kvp_hasher_blocks(h, ns, &c, tokens, cfg->block_size, &out, 1, &got) == KVP_OK &&
              got == 1;
    kvp_hasher_free(h);
    if (ok)
        *key = out.key;
    return ok;
}

/* Why group g's key of a root block differs from the engine's: another profile with the
 * same seeds reproduces it (the hash algorithm), else the seed (vLLM's NONE_HASH is random
 * per process without PYTHONHASHSEED) or a key. Static sentences. */
static const char *likely_cause(const kvp__rt_group *g, const kvp_namespace *ns,
                                const kvp_kv_event *e)
{
    static const int alt[] = {KVP_HASH_VLLM_SHA256, KVP_HASH_VLLM_XXHASH, KVP_HASH_XXH3};
    static const char *const why_alt[] = {
        "hash algorithm: the engine hashes with vllm-sha256-cbor (sha256_cbor), not the "
        "router's profile",
        "hash algorithm: the engine hashes with vllm-xxhash-cbor (xxhash_cbor), not the "
        "router's profile",
        "hash algorithm: the engine hashes with xxh3, not the router's profile",
    };
    for (size_t i = 0; i < sizeof alt / sizeof alt[0]; i++) {
        if (alt[i] == g->hash.hash_profile)
            continue;
        kvp_config cfg = g->hash;
        kvp_config_init(&cfg);
        cfg.hash_profile = alt[i];
        cfg.block_size = g->hash.block_size;
        cfg.seed = g->hash.seed;
        cfg.vllm_seed = g->hash.vllm_seed;
        kvp_namespace alt_ns = *ns;
        if (alt[i] != KVP_HASH_XXH3)
            alt_ns.model = (kvp_field){NULL, 0};
        kvp_key k;
        if (root_key(&cfg, &alt_ns, e->tokens, &k) && k.lo == e->hashes[0])
            return why_alt[i];
    }
    if (g->is_vllm)
        return "seed: the engine's NONE_HASH is not the router's (vLLM draws a random one per "
               "process unless PYTHONHASHSEED is set: set it and the router's vLLM seed, or "
               "index by tokens), or the hash algorithm, or a cache_salt the events do not carry";
    return "hash algorithm, seed or key differ from the engine's, or a cache_salt the events "
           "do not carry (index by tokens, or give the router the engine's settings)";
}

int kvp__rt_group_check_keys(const kvp__rt_group *g, int32_t kv_group, const kvp_kv_batch *b,
                             kvp_router_key_check *out)
{
    memset(out, 0, sizeof *out);
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    if (!g->is_vllm && g->model)
        ns.model = (kvp_field){g->model, g->model_len};
    uint32_t bs = g->hash.block_size;
    for (size_t i = 0; i < b->n_events; i++) {
        const kvp_kv_event *e = &b->events[i];
        if (e->type != KVP_EVENT_STORED || e->has_parent || e->n_hashes == 0 || !e->hashes ||
            !e->tokens || e->block_size != bs || e->n_tokens < bs ||
            (e->group_idx >= 0 && e->group_idx != kv_group) || e->lora_name || e->has_lora_id ||
            !kvp__rt_extra_keys_none(e))
            continue;
        kvp_chain c, k;
        size_t got = 0;
        if (kvp_hasher_root(g->hasher, &ns, &c) != KVP_OK ||
            kvp_hasher_blocks(g->hasher, &ns, &c, e->tokens, bs, &k, 1, &got) != KVP_OK || got != 1)
            continue;
        out->n_checked++;
        if (k.key.lo == e->hashes[0])
            continue;
        if (out->n_mismatch++ == 0) {
            out->engine_hash = e->hashes[0];
            out->router_hash = k.key.lo;
            out->likely = likely_cause(g, &ns, e);
        }
    }
    return KVP_OK;
}
