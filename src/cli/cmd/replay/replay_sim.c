/*
 * replay_sim.c - the replay engine: LRU stack distances of every block access in one pass,
 * cross-checked against the library's pool (see replay_sim.h for the rules).
 *
 * Layout.
 *
 *   ents, tab  every block key ever seen: ents[] holds entries { key, parent key, last touch
 *              time, first line } in order of creation, tab[] is an open-addressing table
 *              (linear probing, load <= 1/2) of { key.lo, entry index + 1 } over them. It
 *              answers "seen before?" (cold versus capacity misses) and, for hash-id traces,
 *              "does this id always follow the same prefix?" (ids must name whole prefixes,
 *              or LRU stops being a stack). Keys are uniform digests, so key.lo is the probe
 *              hash. A uthash map was first used here: its chains (up to 10 entries per bucket
 *              before it doubles) made 44% of the engine's perf samples on the conversation
 *              trace, one cache miss per link; a probe here is one line of tab[].
 *   bits, fen  touch times 1 .. n_time: bit t of bits is set when some key's last touch is t,
 *              and a Fenwick tree counts the set bits of each 64-bit word. The stack distance
 *              of a key is the number of keys touched after it: n_live - marks(1 .. last),
 *              a popcount plus a tree walk of O(log(T / 64)). Counting per word keeps the
 *              tree 64 times smaller than one over times (32 KiB for the conversation trace's
 *              290k touches), so its walks stay in cache. Both double (the tree is rebuilt
 *              from the bits) when time runs past their end.
 *   rq         per request, one record appended to a byte stream, every number a LEB128
 *              varint (7 bits a byte): prompt tokens, full prompt blocks, blocks touched,
 *              warm blocks W, the group of each dimension, then the running maximum of the
 *              stack distances along its touched blocks for the first W blocks, as deltas
 *              (2 d) or runs of k deltas of 1 (2 k + 1):
 *
 *                [n_tokens][n_full][n_touch][W][g0][g1][g2][2 pm0][2 k + 1][2 (pm - prev)]...
 *
 *              The running maximum is non-decreasing, so "blocks with running max < C" is the
 *              cached prefix at capacity C; a block never seen has RP_COLD, the largest
 *              value, so every block from the first cold one on is cold and only the W warm
 *              ones are stored. Why this and not a struct plus 4 bytes per block (121 bytes
 *              per request on a 2M-request token log): the hit figures of any capacity, and
 *              the percentiles of the per-request hit fraction in particular, need each
 *              request's whole step function C -> cached blocks when the capacities are only
 *              known at the end (the automatic sweep spans the distinct blocks seen); the
 *              deltas along a shared prefix are 1 (a prefix touched last to first has
 *              distances X + i at block i), so a run of them costs 1 or 2 bytes, a cold
 *              block nothing and the header about 8 (docs/replay.md, "Memory").
 *
 * Per request: Step 1 compute its block keys (chained token hashes, or scoped hash ids);
 * Step 2 look them up, creating entries for new keys (trace mode: check parents first, and
 * undo the new entries if one is wrong); Step 3 read every distance before any touch;
 * Step 4 drive the pool and compare its match with the model's; Step 5 touch the blocks
 * from the last to the first.
 *
 * Invariants: n_live == number of entries with last > 0 == set bits, all within 1 .. n_time;
 * each entry with last > 0 has bit last set, and no two entries share a time.
 *
 * Percentiles (rp_sim_eval) come without a per-request array: a first pass over rq sums
 * the figures and counts the hit fractions in N_BUCKETS buckets (0 exactly, then 1/65535-wide
 * bins of (0, 1)), keeping each bucket's least and largest value; the bucket holding each
 * wanted rank is then known, and when its values are not all equal a second pass collects
 * just that bucket's values and selects the rank among them, exactly as a sort would.
 *
 * Cost: O(B log(T / 64)) time for B block accesses and T touches; memory about 80 bytes
 * per distinct block (a 48-byte entry, two 16-byte slots at load <= 1/2), 1/4 byte per touch
 * (bits and tree), and per request its rq record: about 8 bytes plus 1-3 per run of warm blocks
 * (at most 5 per warm block and 35 for the header). Evaluation adds 1.5 MiB of buckets and the
 * values of at most three buckets.
 */
#include "replay_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "hashopt.h"

/* Group keys are uniform 128-bit digests: their low bits are already a good bucket hash. */
#define HASH_FUNCTION(keyptr, keylen, hashv)                                                       \
    do {                                                                                           \
        uint64_t lo_;                                                                              \
        memcpy(&lo_, (keyptr), sizeof lo_);                                                        \
        (hashv) = (unsigned)(lo_ ^ (lo_ >> 32));                                                   \
    } while (0)
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj)                                                                   \
    do {                                                                                           \
        oom_flag = true;                                                                           \
    } while (0)
#include <uthash.h>

#define RP_COLD        UINT32_MAX /* stack distance of a block never touched before */
#define RP_DIST_MAX    (UINT32_MAX - 1)
#define MAX_REQ_BLOCKS (UINT32_MAX - 1)
#define VARINT_MAX     10               /* bytes of the longest varint (a uint64_t) */
#define RQ_HEAD_MAX    (7 * VARINT_MAX) /* bytes of the longest record header */
#define N_BUCKETS      65536            /* percentile buckets: 0, then 65535 bins */

static bool oom_flag; /* set by uthash when a table allocation fails (single-threaded tool) */

typedef struct entry {
    kvp_key key;      /* the block key */
    kvp_key parent;   /* key of the block before it, or the namespace root */
    uint64_t last;    /* time of its last touch; 0 while not yet touched */
    uint64_t line_no; /* line where it was first seen */
} entry;

typedef struct slot {
    uint64_t lo;  /* key.lo of the entry, compared before the entry is read */
    uint64_t idx; /* entry index + 1; 0 for an empty slot */
} slot;

typedef struct group {
    kvp_key key;       /* digest of (dimension, presence, bytes) */
    uint32_t id;       /* index into names */
    UT_hash_handle hh; /* groups map of its dimension */
} group;

typedef struct group_name {
    char *bytes; /* copy of the value, NUL-terminated; NULL when absent */
    size_t len;  /* bytes in it */
} group_name;

/* One request's record, decoded from rq (or about to be encoded into it). */
typedef struct req {
    uint64_t n_tokens;      /* prompt tokens */
    uint32_t n_prompt_full; /* full prompt blocks */
    uint32_t n_touch;       /* blocks touched (prompt, then cached output) */
    uint32_t n_warm;        /* leading blocks with a distance below RP_COLD (<= n_touch) */
    uint32_t g[RP_N_DIMS];  /* group of each dimension */
    const uint8_t *pm;      /* decoding: the first delta of its distances, inside rq */
} req;

struct rp_sim {
    rp_sim_config cfg; /* as given */
    entry *ents;       /* every key seen, in order of creation */
    size_t n_ents, ents_cap;
    slot *tab; /* open-addressing index over ents, tab_mask + 1 slots */
    size_t tab_mask;
    uint64_t n_live;       /* keys touched at least once */
    uint64_t *bits;        /* bit t is set when time t is some key's last touch */
    uint32_t *fen;         /* Fenwick tree over the marks per word of bits, 1-based */
    uint64_t n_words;      /* words of bits (times 0 .. 64 n_words - 1; time 0 is never used) */
    uint64_t n_time;       /* times used so far */
    uint8_t *rq;           /* one record per request replayed, see the picture */
    size_t n_rq;           /* bytes used at rq */
    size_t rq_cap;         /* bytes allocated at rq */
    size_t n_reqs;         /* requests replayed (records in rq) */
    uint32_t *pm;          /* running-maximum distances of the current request */
    size_t pm_cap;         /* elements allocated at pm */
    kvp_key *scratch_keys; /* keys of the current request */
    size_t *scratch_ent;   /* their entries' indexes */
    kvp_key *scratch_ids;  /* hash ids as keys for kvp_access_ids */
    size_t keys_cap, ent_cap, ids_cap; /* elements allocated in each scratch array */
    uint32_t n_last;                   /* blocks touched by the last request added */
    group *groups[RP_N_DIMS];          /* uthash heads */
    group_name *names[RP_N_DIMS];      /* values by id */
    size_t n_names[RP_N_DIMS], names_cap[RP_N_DIMS];
    kvp_cache *pool;          /* pool mode: the library's cache */
    kvp_config hash;          /* the hash fields in use (profile, vocab_size, for messages) */
    const kvp_hasher *hasher; /* the block keys: the pool's, or own_hasher without a pool */
    kvp_hasher *own_hasher;   /* made here when there is no pool; else NULL */
};

/* ---- Fenwick tree ------------------------------------------------------------------------ */

static bool is_marked(const rp_sim *s, uint64_t t)
{
    return (s->bits[t >> 6] >> (t & 63)) & 1;
}

/* Marks at times 1 .. t: the Fenwick sum of the words before t's, plus t's word up to t. */
static uint64_t fen_prefix(const rp_sim *s, uint64_t t)
{
    uint64_t sum = 0;
    for (uint64_t i = t >> 6; i > 0; i &= i - 1)
        sum += s->fen[i];
    uint64_t below = (UINT64_C(2) << (t & 63)) - 1; /* bits 0 .. t & 63 (all when 63) */
    return sum + (uint64_t)__builtin_popcountll(s->bits[t >> 6] & below);
}

/* Set (delta 1) or clear (delta -1) the mark at time t. */
static void fen_mark(rp_sim *s, uint64_t t, int delta)
{
    uint64_t w = t >> 6;
    s->bits[w] ^= UINT64_C(1) << (t & 63);
    for (uint64_t i = w + 1; i <= s->n_words; i += i & (~i + 1))
        s->fen[i] = (uint32_t)((int64_t)s->fen[i] + delta);
}

/* Make room for time t: double the bitmap and rebuild the tree over its words. Returns false
 * on ENOMEM (nothing changed). */
static bool fen_reserve(rp_sim *s, uint64_t t)
{
    if (t < s->n_words * 64)
        return true;
    uint64_t words = s->n_words ? s->n_words : 64;
    while (words * 64 <= t)
        words *= 2;
    uint64_t *bits = calloc(words, sizeof *bits);
    uint32_t *fen = calloc(words + 1, sizeof *fen);
    if (!bits || !fen) {
        free(bits);
        free(fen);
        return false;
    }
    if (s->bits)
        memcpy(bits, s->bits, s->n_words * sizeof *bits);
    for (uint64_t i = 1; i <= words; i++) {
        fen[i] += (uint32_t)__builtin_popcountll(bits[i - 1]);
        uint64_t j = i + (i & (~i + 1));
        if (j <= words)
            fen[j] += fen[i];
    }
    free(s->fen);
    free(s->bits);
    s->fen = fen;
    s->bits = bits;
    s->n_words = words;
    return true;
}

/* ---- request records ----------------------------------------------------------------------- */

/* Write v at p as a LEB128 varint; returns the byte after it. Cannot fail (room reserved). */
static inline uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* Read the varint at *p (one put_varint wrote) and move *p past it. Cannot fail. */
static inline uint64_t get_varint(const uint8_t **p)
{
    const uint8_t *q = *p;
    if (*q < 0x80) {
        *p = q + 1;
        return *q;
    }
    uint64_t v = 0;
    unsigned shift = 0;
    uint8_t b;
    do {
        b = *q++;
        v |= (uint64_t)(b & 0x7f) << shift;
        shift += 7;
    } while (b & 0x80);
    *p = q;
    return v;
}

/* Append request q with the running maxima pm[0, q->n_warm) to rq (room reserved by
 * check_request). Cannot fail. */
static void rq_append(rp_sim *s, const req *q, const uint32_t *pm)
{
    uint8_t *p = s->rq + s->n_rq;
    p = put_varint(p, q->n_tokens);
    p = put_varint(p, q->n_prompt_full);
    p = put_varint(p, q->n_touch);
    p = put_varint(p, q->n_warm);
    for (int d = 0; d < RP_N_DIMS; d++)
        p = put_varint(p, q->g[d]);
    uint32_t prev = 0;
    for (uint32_t i = 0; i < q->n_warm;) {
        uint32_t k = 0;
        while (i + k < q->n_warm && pm[i + k] - (k ? pm[i + k - 1] : prev) == 1)
            k++;
        if (k > 0) {
            p = put_varint(p, (uint64_t)k << 1 | 1); /* a run of k deltas of 1 */
            i += k;
        } else {
            p = put_varint(p, (uint64_t)(pm[i] - prev) << 1);
            i++;
        }
        prev = pm[i - 1];
    }
    s->n_rq = (size_t)(p - s->rq);
    s->n_reqs++;
}

/* Decode the n_warm distances of a record whose first code is at *p (q->pm) and count the
 * blocks whose running maximum is below `below` into *n_below; move *p past the record.
 * Returns the last running maximum (0 when there is none), or UINT64_MAX when the codes do
 * not add up to n_warm blocks (only a corrupted record). */
static uint64_t rq_distances(const uint8_t **p, uint32_t n_warm, uint64_t below, uint32_t *n_below)
{
    const uint8_t *c = *p;
    uint64_t run = 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < n_warm;) {
        uint64_t v = get_varint(&c);
        if (v & 1) {
            uint64_t k = v >> 1; /* run + 1, ..., run + k */
            if (k == 0 || k > n_warm - i)
                return UINT64_MAX;
            n += below > run + 1 ? (uint32_t)(below - run - 1 < k ? below - run - 1 : k) : 0;
            run += k;
            i += (uint32_t)k;
        } else {
            run += v >> 1;
            n += run < below;
            i++;
        }
    }
    *p = c;
    *n_below = n;
    return run;
}

/* One past the last record (s->rq itself, maybe NULL, when there is none). */
static const uint8_t *rq_end(const rp_sim *s)
{
    return s->n_rq > 0 ? s->rq + s->n_rq : s->rq;
}

/* Decode the header of the record at p into *q (q->pm: its first distance delta). Returns
 * the byte after the header. Cannot fail. */
static const uint8_t *rq_header(const uint8_t *p, req *q)
{
    q->n_tokens = get_varint(&p);
    q->n_prompt_full = (uint32_t)get_varint(&p);
    q->n_touch = (uint32_t)get_varint(&p);
    q->n_warm = (uint32_t)get_varint(&p);
    for (int d = 0; d < RP_N_DIMS; d++)
        q->g[d] = (uint32_t)get_varint(&p);
    q->pm = p;
    return p;
}

static bool scratch_reserve(rp_sim *s, size_t n)
{
    return cli_grow((void **)&s->scratch_keys, &s->keys_cap, n, sizeof *s->scratch_keys) &&
           cli_grow((void **)&s->scratch_ent, &s->ent_cap, n, sizeof *s->scratch_ent) &&
           cli_grow((void **)&s->scratch_ids, &s->ids_cap, n, sizeof *s->scratch_ids);
}

/* ---- key map ----------------------------------------------------------------------------- */

/* The entry index of key k, or SIZE_MAX. */
static size_t key_find(const rp_sim *s, kvp_key k)
{
    for (size_t i = (size_t)k.lo & s->tab_mask;; i = (i + 1) & s->tab_mask) {
        const slot *t = &s->tab[i];
        if (t->idx == 0)
            return SIZE_MAX;
        if (t->lo == k.lo && s->ents[t->idx - 1].key.hi == k.hi)
            return (size_t)t->idx - 1;
    }
}

static void slot_put(slot *tab, size_t mask, uint64_t lo, uint64_t idx)
{
    size_t i = (size_t)lo & mask;
    while (tab[i].idx != 0)
        i = (i + 1) & mask;
    tab[i].lo = lo;
    tab[i].idx = idx;
}

/* Append a new entry for k and index it. Returns its index, or SIZE_MAX on ENOMEM. */
static size_t key_add(rp_sim *s, kvp_key k, kvp_key parent, uint64_t line_no)
{
    if (!cli_grow((void **)&s->ents, &s->ents_cap, s->n_ents + 1, sizeof *s->ents))
        return SIZE_MAX;
    if ((s->n_ents + 1) * 2 > s->tab_mask + 1) {
        size_t n = (s->tab_mask + 1) * 2;
        slot *tab = calloc(n, sizeof *tab);
        if (!tab)
            return SIZE_MAX;
        /* Walk the old table in order: each slot lands at its home or near it, so the new
         * table is written almost sequentially (walking ents instead was one cache miss per
         * entry, 15% of the engine's samples). */
        for (size_t i = 0; i <= s->tab_mask; i++)
            if (s->tab[i].idx != 0)
                slot_put(tab, n - 1, s->tab[i].lo, s->tab[i].idx);
        free(s->tab);
        s->tab = tab;
        s->tab_mask = n - 1;
    }
    entry *e = &s->ents[s->n_ents];
    e->key = k;
    e->parent = parent;
    e->last = 0;
    e->line_no = line_no;
    slot_put(s->tab, s->tab_mask, k.lo, ++s->n_ents);
    return s->n_ents - 1;
}

/* Remove the newest entry (undo of key_add): empty its slot and shift the rest of its
 * probe run back so no lookup stops early. Cannot fail. */
static void key_pop(rp_sim *s)
{
    uint64_t idx = s->n_ents--;
    size_t i = (size_t)s->ents[idx - 1].key.lo & s->tab_mask;
    while (s->tab[i].idx != idx)
        i = (i + 1) & s->tab_mask;
    for (size_t j = (i + 1) & s->tab_mask; s->tab[j].idx != 0; j = (j + 1) & s->tab_mask) {
        size_t home = (size_t)s->tab[j].lo & s->tab_mask;
        /* Move j into the hole at i unless its home lies cyclically in (i, j]. */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            s->tab[i] = s->tab[j];
            i = j;
        }
    }
    s->tab[i].idx = 0;
    s->tab[i].lo = 0;
}

/* Intern the value of field f in dimension dim; returns its id, or UINT32_MAX on ENOMEM. */
static uint32_t group_intern(rp_sim *s, int dim, kvp_field f)
{
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    kvp_field *field = dim == RP_DIM_MODEL     ? &ns.model
                       : dim == RP_DIM_ADAPTER ? &ns.adapter
                                               : &ns.tenant;
    *field = f;
    kvp_key k;
    if (kvp_namespace_key(0, &ns, &k) != KVP_OK)
        return UINT32_MAX;
    group *g;
    HASH_FIND(hh, s->groups[dim], &k, sizeof k, g);
    if (g)
        return g->id;
    if (!cli_grow((void **)&s->names[dim], &s->names_cap[dim], s->n_names[dim] + 1,
                  sizeof *s->names[dim]))
        return UINT32_MAX;
    group_name name = {NULL, f.len};
    if (f.ptr) {
        name.bytes = malloc(f.len + 1);
        if (!name.bytes)
            return UINT32_MAX;
        memcpy(name.bytes, f.ptr, f.len);
        name.bytes[f.len] = '\0';
    }
    g = calloc(1, sizeof *g);
    if (!g) {
        free(name.bytes);
        return UINT32_MAX;
    }
    g->key = k;
    g->id = (uint32_t)s->n_names[dim];
    oom_flag = false;
    HASH_ADD(hh, s->groups[dim], key, sizeof g->key, g);
    if (oom_flag) {
        group *check;
        HASH_FIND(hh, s->groups[dim], &k, sizeof k, check);
        if (!check) {
            free(g);
            free(name.bytes);
            return UINT32_MAX;
        }
    }
    s->names[dim][s->n_names[dim]++] = name;
    return g->id;
}

/* ---- public -------------------------------------------------------------------------------- */

/* The hash fields of cfg (or xxh3 with cfg->seed), the pool when pool_blocks > 0, and the
 * hasher of the block keys. Returns KVP_OK or the library's code (err filled). */
static int make_hasher_and_pool(rp_sim *s, const rp_sim_config *cfg, char *err, size_t err_size)
{
    kvp_config kc;
    if (cfg->hash) {
        kc = *cfg->hash;
    } else {
        kvp_config_init(&kc);
        kc.hash_profile = KVP_HASH_XXH3;
        kc.seed = cfg->seed;
    }
    kc.block_size = cfg->block_size;
    kc.vllm_seed = NULL; /* only read at creation: the copy must not keep the pointer */
    s->hash = kc;
    kc.vllm_seed = cfg->hash ? cfg->hash->vllm_seed : NULL;
    int rc;
    if (cfg->pool_blocks > 0) {
        kc.n_blocks = cfg->pool_blocks;
        rc = kvp_cache_new(&kc, &s->pool);
        if (rc != KVP_OK) {
            cli_errf(err, err_size, "cannot create a cache of %u blocks: %s", cfg->pool_blocks,
                     cli_kvp_error(rc));
            return rc;
        }
        s->hasher = kvp_cache_hasher(s->pool);
        return KVP_OK;
    }
    rc = kvp_hasher_new(&kc, &s->own_hasher);
    if (rc != KVP_OK) {
        cli_errf(err, err_size, "cannot make the hash function: %s", cli_kvp_error(rc));
        return rc;
    }
    s->hasher = s->own_hasher;
    return KVP_OK;
}

rp_sim *rp_sim_new(const rp_sim_config *cfg, char *err, size_t err_size)
{
    if (!cfg || cfg->block_size == 0 || cfg->block_size > KVP_MAX_BLOCK_SIZE) {
        cli_errf(err, err_size, "block size must be 1..%u", KVP_MAX_BLOCK_SIZE);
        return NULL;
    }
    rp_sim *s = calloc(1, sizeof *s);
    if (!s) {
        cli_errf(err, err_size, "out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    s->cfg.hash = NULL; /* read here only */
    if (make_hasher_and_pool(s, cfg, err, err_size) != KVP_OK) {
        rp_sim_free(s);
        return NULL;
    }
    s->tab = calloc(1024, sizeof *s->tab);
    s->tab_mask = 1023;
    if (!s->tab || !fen_reserve(s, 1)) {
        rp_sim_free(s);
        cli_errf(err, err_size, "out of memory");
        return NULL;
    }
    return s;
}

/* Step 1 for a token log: chained keys of the prompt and cached output, continuing chain
 * (the namespace's start), a few blocks per call so that the chain states stay on the
 * stack. Returns KVP_OK or the hasher's code (KVP_ETOKEN, KVP_ENOTSUP). */
static int token_keys(rp_sim *s, const rp_request *r, kvp_chain *chain, uint32_t n_touch)
{
    kvp_chain out[64];
    size_t bs = s->cfg.block_size;
    for (uint32_t done = 0; done < n_touch;) {
        size_t n = n_touch - done < 64 ? n_touch - done : 64, n_out = 0;
        int rc = kvp_hasher_blocks(s->hasher, &r->ns, chain, r->tokens + (size_t)done * bs, n * bs,
                                   out, n, &n_out);
        if (rc != KVP_OK)
            return rc;
        if (n_out != n)
            return KVP_EINVAL;
        for (size_t i = 0; i < n; i++)
            s->scratch_keys[done + i] = out[i].key;
        done += (uint32_t)n;
    }
    return KVP_OK;
}

/* Step 1: the keys of every block the request touches into scratch_keys, and its chain
 * start into *root. Returns RP_OK, RP_EINPUT (the profile cannot express the namespace, a
 * token id at or above vocab_size: message in err) or RP_EINTERNAL. */
static int request_keys(rp_sim *s, const rp_request *r, uint32_t n_touch, kvp_key *root, char *err,
                        size_t err_size)
{
    kvp_chain chain;
    memset(&chain, 0, sizeof chain);
    size_t n_tok = r->hash_ids ? 0 : r->n_tokens + r->n_output_tokens;
    int rc = kvp_hasher_root(s->hasher, &r->ns, &chain);
    /* The partial last block is never hashed, but its ids are checked as the pool does. */
    for (size_t i = 0; rc == KVP_OK && s->hash.vocab_size && i < n_tok; i++)
        rc = r->tokens[i] >= s->hash.vocab_size ? KVP_ETOKEN : KVP_OK;
    if (rc == KVP_OK && r->hash_ids) {
        for (uint32_t i = 0; i < n_touch; i++)
            s->scratch_keys[i] =
                kvp_hasher_external_key(s->hasher, chain.root, (kvp_key){r->hash_ids[i], 0});
    }
    *root = chain.key;
    if (rc == KVP_OK && !r->hash_ids)
        rc = token_keys(s, r, &chain, n_touch);
    if (rc == KVP_OK)
        return RP_OK;
    if (rc == KVP_ENOTSUP || rc == KVP_ETOKEN || rc == KVP_EINVAL) {
        if (rc == KVP_EINVAL)
            cli_errf(err, err_size, "invalid namespace");
        else
            cli_hash_refusal(rc, s->hash.hash_profile, s->hash.vocab_size, &r->ns, r->tokens, n_tok,
                             err, err_size);
        return RP_EINPUT;
    }
    cli_errf(err, err_size, "internal error: cannot hash the prompt: %s", cli_kvp_error(rc));
    return RP_EINTERNAL;
}

/* Step 2: find or create the entry of every key. Trace mode checks that each id follows the
 * same prefix as when it was first seen (which also rules out repeats within the request);
 * on a mismatch the entries created here are removed again. */
static int find_entries(rp_sim *s, const rp_request *r, kvp_key root, uint32_t n_touch, char *err,
                        size_t err_size)
{
    bool trace = r->hash_ids != NULL;
    size_t first_new = s->n_ents;
    int rc = RP_OK;
    /* The probes are independent: start all their cache misses first. */
    for (uint32_t i = 0; i < n_touch; i++)
        __builtin_prefetch(&s->tab[(size_t)s->scratch_keys[i].lo & s->tab_mask]);
    for (uint32_t i = 0; i < n_touch; i++) {
        kvp_key k = s->scratch_keys[i];
        kvp_key parent = i ? s->scratch_keys[i - 1] : root;
        size_t at = key_find(s, k);
        const entry *e = at == SIZE_MAX ? NULL : &s->ents[at];
        if (e && trace && (e->parent.lo != parent.lo || e->parent.hi != parent.hi)) {
            if (at >= first_new)
                cli_errf(err, err_size, "hash id %llu repeats within the request (block %u)",
                         (unsigned long long)r->hash_ids[i], i);
            else
                cli_errf(err, err_size,
                         "hash id %llu at block %u follows a different prefix than on line "
                         "%llu (a hash id must name its whole prefix)",
                         (unsigned long long)r->hash_ids[i], i, (unsigned long long)e->line_no);
            rc = RP_EINPUT;
            break;
        }
        if (!e && (at = key_add(s, k, parent, r->line_no)) == SIZE_MAX) {
            cli_errf(err, err_size, "out of memory");
            rc = RP_ENOMEM;
            break;
        }
        s->scratch_ent[i] = at;
    }
    /* Undo: the entries made for this request are the newest ones. */
    while (rc != RP_OK && s->n_ents > first_new)
        key_pop(s);
    return rc;
}

/* Blocks whose running maximum is below cap: the cached prefix at capacity cap. */
static uint32_t count_below(const uint32_t *pm, uint32_t n, uint64_t cap)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if ((uint64_t)pm[mid] < cap)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Step 4: drive the pool and compare its longest cached prefix with the model's. */
static int drive_pool(rp_sim *s, const rp_request *r, uint32_t n_prompt_full, const uint32_t *pm,
                      char *err, size_t err_size)
{
    kvp_match m;
    int rc;
    if (r->hash_ids) {
        for (size_t i = 0; i < r->n_hash_ids; i++)
            s->scratch_ids[i] = (kvp_key){r->hash_ids[i], 0};
        rc = kvp_access_ids(s->pool, &r->ns, s->scratch_ids, r->n_hash_ids, r->input_length, &m);
    } else if (r->n_output_tokens == 0) {
        rc = kvp_access(s->pool, &r->ns, r->tokens, r->n_tokens, &m);
    } else {
        kvp_match m2;
        rc = kvp_lookup(s->pool, &r->ns, r->tokens, r->n_tokens, NULL, 0, &m);
        if (rc == KVP_OK)
            rc = kvp_access(s->pool, &r->ns, r->tokens, r->n_tokens + r->n_output_tokens, &m2);
    }
    if (rc == KVP_ENOMEM) {
        cli_errf(err, err_size, "out of memory");
        return RP_ENOMEM;
    }
    if (rc != KVP_OK) {
        cli_errf(err, err_size, "internal error: the cache refused the request: %s",
                 cli_kvp_error(rc));
        return RP_EINTERNAL;
    }
    uint32_t model = count_below(pm, n_prompt_full, s->cfg.pool_blocks);
    if (m.n_blocks_cached != model) {
        cli_errf(err, err_size,
                 "internal error: the pool matched %u blocks, the LRU model %u (please "
                 "report this with the input)",
                 m.n_blocks_cached, model);
        return RP_EINTERNAL;
    }
    return RP_OK;
}

/* Step 0: check the request's shape and make room for it: *n_touch blocks to touch, *n_full
 * full prompt blocks. Returns RP_OK, RP_EINPUT (message in err, nothing changed) or
 * RP_ENOMEM. */
static int check_request(rp_sim *s, const rp_request *r, uint32_t *n_touch_out,
                         uint32_t *n_full_out, char *err, size_t err_size)
{
    uint64_t bs = s->cfg.block_size;
    uint64_t n_prompt = r->hash_ids ? r->input_length : r->n_tokens;
    uint64_t full = n_prompt / bs;
    uint64_t touch = r->hash_ids ? full : (r->n_tokens + r->n_output_tokens) / bs;
    if (n_prompt == 0) {
        cli_errf(err, err_size, "empty prompt");
        return RP_EINPUT;
    }
    if (r->hash_ids && r->n_hash_ids != full && r->n_hash_ids != (n_prompt + bs - 1) / bs) {
        cli_errf(err, err_size,
                 "%zu hash ids for %llu tokens: blocks of %llu tokens need %llu or %llu",
                 r->n_hash_ids, (unsigned long long)n_prompt, (unsigned long long)bs,
                 (unsigned long long)full, (unsigned long long)((n_prompt + bs - 1) / bs));
        return RP_EINPUT;
    }
    if (touch > MAX_REQ_BLOCKS) {
        cli_errf(err, err_size, "request too long: %llu blocks", (unsigned long long)touch);
        return RP_EINPUT;
    }
    uint32_t n_touch = (uint32_t)touch;
    if (!scratch_reserve(s, (r->hash_ids ? r->n_hash_ids : 0) + n_touch + 1) ||
        !cli_grow((void **)&s->pm, &s->pm_cap, (size_t)n_touch + 1, sizeof *s->pm) ||
        !cli_grow((void **)&s->rq, &s->rq_cap, s->n_rq + RQ_HEAD_MAX + (size_t)n_touch * 5, 1) ||
        !fen_reserve(s, s->n_time + n_touch + 1)) {
        cli_errf(err, err_size, "out of memory");
        return RP_ENOMEM;
    }
    *n_touch_out = n_touch;
    *n_full_out = (uint32_t)full;
    return RP_OK;
}

int rp_sim_add(rp_sim *s, const rp_request *r, char *err, size_t err_size)
{
    uint32_t n_touch, n_full;
    s->n_last = 0;
    int rc = check_request(s, r, &n_touch, &n_full, err, err_size);
    if (rc != RP_OK)
        return rc;
    uint64_t n_prompt = r->hash_ids ? r->input_length : r->n_tokens;

    /* Step 1: keys. */
    kvp_key root;
    rc = request_keys(s, r, n_touch, &root, err, err_size);
    if (rc != RP_OK)
        return rc;

    /* Step 2: entries. */
    rc = find_entries(s, r, root, n_touch, err, err_size);
    if (rc != RP_OK)
        return rc;
    req q = {n_prompt, n_full, n_touch, 0, {0, 0, 0}, NULL};
    for (int d = 0; d < RP_N_DIMS; d++) {
        kvp_field f = d == RP_DIM_MODEL     ? r->ns.model
                      : d == RP_DIM_ADAPTER ? r->ns.adapter
                                            : r->ns.tenant;
        q.g[d] = group_intern(s, d, f);
        if (q.g[d] == UINT32_MAX) {
            cli_errf(err, err_size, "out of memory");
            return RP_ENOMEM;
        }
    }

    /* Step 3: distances before any touch, as running maxima. */
    uint32_t *pm = s->pm;
    uint32_t run = 0;
    for (uint32_t i = 0; i < n_touch; i++) {
        entry *e = &s->ents[s->scratch_ent[i]];
        uint32_t d = RP_COLD;
        if (e->last > 0) {
            uint64_t after = s->n_live - fen_prefix(s, e->last);
            d = after > RP_DIST_MAX ? RP_DIST_MAX : (uint32_t)after;
        }
        run = d > run ? d : run;
        pm[i] = run;
        q.n_warm += run < RP_COLD;
    }

    /* Step 4: the pool. */
    if (s->pool) {
        rc = drive_pool(s, r, n_full, pm, err, err_size);
        if (rc != RP_OK)
            return rc;
    }

    /* Step 5: touch from the last block to the first. */
    for (uint32_t i = n_touch; i-- > 0;) {
        entry *e = &s->ents[s->scratch_ent[i]];
        if (e->last > 0) {
            fen_mark(s, e->last, -1);
        } else {
            s->n_live++;
        }
        e->last = ++s->n_time;
        fen_mark(s, e->last, +1);
    }
    rq_append(s, &q, pm);
    s->n_last = n_touch;
    return RP_OK;
}

size_t rp_sim_last_blocks(const rp_sim *s, const size_t **blocks)
{
    *blocks = s->scratch_ent;
    return s->n_last;
}

int rp_sim_finish(rp_sim *s, char *err, size_t err_size)
{
    if (!s->pool)
        return RP_OK;
    kvp_stats st;
    rp_metrics m;
    int rc = rp_sim_eval(s, s->cfg.pool_blocks, &m, NULL);
    if (rc != RP_OK) {
        cli_errf(err, err_size, "out of memory");
        return rc;
    }
    if (kvp_cache_stats(s->pool, &st) != KVP_OK || kvp_cache_check(s->pool) != KVP_OK) {
        cli_errf(err, err_size, "internal error: the cache fails its check");
        return RP_EINTERNAL;
    }
    if (st.n_evictions != m.n_evicted || st.n_blocks_cached != m.n_stored - m.n_evicted) {
        cli_errf(err, err_size,
                 "internal error: the pool evicted %llu blocks and caches %u, the LRU model "
                 "%llu and %llu",
                 (unsigned long long)st.n_evictions, st.n_blocks_cached,
                 (unsigned long long)m.n_evicted, (unsigned long long)(m.n_stored - m.n_evicted));
        return RP_EINTERNAL;
    }
    return RP_OK;
}

/* ---- evaluation ---------------------------------------------------------------------------- */

/* One request's figures at one capacity. */
typedef struct req_fig {
    uint32_t cached;     /* full prompt blocks in the cached prefix */
    uint32_t seen;       /* full prompt blocks seen before (warm) */
    uint32_t cached_all; /* touched blocks in the cached prefix */
    uint64_t hit;        /* blocks reused (capped so one token is computed) */
    double frac;         /* hit tokens / prompt tokens */
} req_fig;

/* Decode the record at *p into *q and its figures at capacity cap into *f; move *p past the
 * record. Cannot fail. */
static void req_eval(const rp_sim *s, const uint8_t **p, uint64_t cap, req *q, req_fig *f)
{
    *p = rq_header(*p, q);
    uint64_t below = cap < RP_COLD ? cap : RP_COLD; /* a cold block never hits */
    uint32_t n_below = 0; /* blocks whose running maximum is below the capacity */
    rq_distances(p, q->n_warm, below, &n_below);
    /* The running maximum never decreases: the blocks below are a prefix. */
    f->cached = n_below < q->n_prompt_full ? n_below : q->n_prompt_full;
    f->seen = q->n_warm < q->n_prompt_full ? q->n_warm : q->n_prompt_full;
    f->cached_all = n_below;
    uint64_t limit = (q->n_tokens - 1) / s->cfg.block_size;
    f->hit = f->cached < limit ? f->cached : limit;
    f->frac = (double)(f->hit * s->cfg.block_size) / (double)q->n_tokens;
}

/* Hit fractions counted per bucket: bucket 0 holds exactly 0, bucket 1 + floor(f (N - 1))
 * the f in (0, 1) (a fraction is below 1: one token is always computed). */
typedef struct frac_hist {
    uint64_t n[N_BUCKETS]; /* fractions in each bucket */
    double lo[N_BUCKETS];  /* the least of them (valid when n > 0) */
    double hi[N_BUCKETS];  /* the largest */
} frac_hist;

static size_t bucket_of(double f)
{
    if (!(f > 0.0))
        return 0;
    size_t b = 1 + (size_t)(f * (double)(N_BUCKETS - 1));
    return b < N_BUCKETS ? b : N_BUCKETS - 1;
}

static void hist_add(frac_hist *h, double f)
{
    size_t b = bucket_of(f);
    if (h->n[b] == 0 || f < h->lo[b])
        h->lo[b] = f;
    if (h->n[b] == 0 || f > h->hi[b])
        h->hi[b] = f;
    h->n[b]++;
}

/* The element of 0-based rank k among the n fractions counted in h: *bucket and *rank (its
 * rank inside the bucket) say where it is; returns true with *value set when the bucket's
 * values are all equal, false when they must be collected (second pass). */
static bool hist_find(const frac_hist *h, uint64_t k, size_t *bucket, uint64_t *rank, double *value)
{
    size_t b = 0;
    while (k >= h->n[b]) {
        k -= h->n[b];
        b++;
    }
    *bucket = b;
    *rank = k;
    *value = h->lo[b];
    return h->lo[b] == h->hi[b];
}

/* Put the k-th smallest of v[lo .. hi] (inclusive) at v[k], smaller ones before it and
 * larger ones after (Hoare's selection, expected O(n)). */
static void select_kth(double *v, size_t lo, size_t hi, size_t k)
{
    while (lo < hi) {
        double pivot = v[lo + (hi - lo) / 2];
        size_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] < pivot)
                i++;
            while (v[j] > pivot)
                j--;
            if (i <= j) {
                double t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                if (j == 0)
                    break;
                j--;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            return;
    }
}

/* The nearest-rank percentiles 50, 90 and 99 of the hit fractions at capacity cap into m,
 * from the histogram h of a first pass: a bucket with distinct values is collected by a
 * second pass over rq and the rank selected in it. Returns RP_OK or RP_ENOMEM. */
static int percentiles(const rp_sim *s, uint64_t cap, const frac_hist *h, rp_metrics *m)
{
    static const unsigned pct[3] = {50, 90, 99};
    double *out[3] = {&m->p50_hit, &m->p90_hit, &m->p99_hit};
    size_t bucket[3];
    uint64_t rank[3];
    bool known[3], need = false;
    for (int j = 0; j < 3; j++) {
        uint64_t r = (s->n_reqs * pct[j] + 99) / 100; /* ceil(n p / 100), 1-based */
        known[j] = s->n_reqs == 0 || hist_find(h, r ? r - 1 : 0, &bucket[j], &rank[j], out[j]);
        if (s->n_reqs == 0)
            *out[j] = 0.0;
        need |= !known[j];
    }
    if (!need)
        return RP_OK;
    double *vals[3] = {NULL, NULL, NULL};
    size_t n_vals[3] = {0, 0, 0};
    int rc = RP_OK;
    for (int j = 0; j < 3 && rc == RP_OK; j++)
        if (!known[j] && !(vals[j] = malloc(h->n[bucket[j]] * sizeof *vals[j])))
            rc = RP_ENOMEM;
    const uint8_t *p = s->rq, *end = rq_end(s);
    while (rc == RP_OK && p < end) {
        req q;
        req_fig f;
        req_eval(s, &p, cap, &q, &f);
        size_t b = bucket_of(f.frac);
        for (int j = 0; j < 3; j++)
            if (!known[j] && b == bucket[j])
                vals[j][n_vals[j]++] = f.frac;
    }
    for (int j = 0; j < 3 && rc == RP_OK; j++) {
        if (known[j])
            continue;
        select_kth(vals[j], 0, n_vals[j] - 1, (size_t)rank[j]);
        *out[j] = vals[j][rank[j]];
    }
    for (int j = 0; j < 3; j++)
        free(vals[j]);
    return rc;
}

/* Add one request's figures to m and, when groups is not NULL, to its groups. */
static void add_figures(rp_metrics *m, rp_group_metrics **groups, const req *q, const req_fig *f,
                        uint64_t cap, uint64_t bs)
{
    uint64_t keep = q->n_touch < cap ? q->n_touch : cap;
    m->n_requests++;
    m->n_prompt_tokens += q->n_tokens;
    m->n_hit_tokens += f->hit * bs;
    m->n_blocks_full += q->n_prompt_full;
    m->n_blocks_cached += f->cached;
    m->n_blocks_hit += f->hit;
    m->n_cold_misses += q->n_prompt_full - f->seen;
    m->n_capacity_misses += f->seen - f->cached;
    m->n_stored += keep > f->cached_all ? keep - f->cached_all : 0;
    if (!groups)
        return;
    for (int d = 0; d < RP_N_DIMS; d++) {
        rp_group_metrics *g = &groups[d][q->g[d]];
        g->n_requests++;
        g->n_prompt_tokens += q->n_tokens;
        g->n_hit_tokens += f->hit * bs;
        g->n_blocks_full += q->n_prompt_full;
        g->n_blocks_cached += f->cached;
        g->n_cold_misses += q->n_prompt_full - f->seen;
    }
}

/*
 * Evaluate capacity cap. Steps:
 *   1. one pass over rq: every request's figures summed (and per group), its hit fraction
 *      summed for the mean and counted in the histogram;
 *   2. the evictions from what was stored and what stays resident;
 *   3. the percentiles from the histogram (and a second pass when a bucket needs it).
 */
int rp_sim_eval(const rp_sim *s, uint64_t cap, rp_metrics *out, rp_group_metrics **groups)
{
    frac_hist *h = calloc(1, sizeof *h);
    if (!h)
        return RP_ENOMEM;
    rp_metrics m;
    memset(&m, 0, sizeof m);
    m.capacity = cap;
    if (groups)
        for (int d = 0; d < RP_N_DIMS; d++)
            memset(groups[d], 0, s->n_names[d] * sizeof *groups[d]);

    /* Step 1: the figures. */
    double sum = 0.0;
    const uint8_t *p = s->rq, *end = rq_end(s);
    while (p < end) {
        req q;
        req_fig f;
        req_eval(s, &p, cap, &q, &f);
        add_figures(&m, groups, &q, &f, cap, s->cfg.block_size);
        sum += f.frac;
        hist_add(h, f.frac);
    }

    /* Step 2: evictions. */
    uint64_t resident = s->n_live < cap ? s->n_live : cap;
    m.n_evicted = m.n_stored - resident;
    m.mean_hit = s->n_reqs ? sum / (double)s->n_reqs : 0.0;

    /* Step 3: percentiles. */
    int rc = percentiles(s, cap, h, &m);
    free(h);
    if (rc != RP_OK)
        return rc;
    *out = m;
    return RP_OK;
}

/* Decode the n_warm distances of the record at *p and count, for each of the n_caps
 * capacities caps[k], the blocks whose running maximum is below it into n_below[k]; move *p
 * past the record. Cannot fail on a record rq_append wrote. */
static void rq_distances_multi(const uint8_t **p, uint32_t n_warm, const uint64_t *caps,
                               size_t n_caps, uint32_t *n_below)
{
    const uint8_t *c = *p;
    uint64_t run = 0;
    for (size_t k = 0; k < n_caps; k++)
        n_below[k] = 0;
    for (uint32_t i = 0; i < n_warm;) {
        uint64_t v = get_varint(&c);
        uint64_t k_run = 1, first;
        if (v & 1) {
            k_run = v >> 1; /* run + 1, ..., run + k_run */
            if (k_run == 0 || k_run > n_warm - i)
                break;
            first = run + 1;
            run += k_run;
        } else {
            run += v >> 1;
            first = run;
        }
        /* The values first, first + 1, ..., run (k_run of them; one when not a run). */
        for (size_t k = 0; k < n_caps; k++) {
            uint64_t below = caps[k] < RP_COLD ? caps[k] : RP_COLD;
            if (below > first)
                n_below[k] += (uint32_t)(below - first < k_run ? below - first : k_run);
        }
        i += (uint32_t)k_run;
    }
    *p = c;
}

int rp_sim_scan(const rp_sim *s, const uint64_t *caps, size_t n_caps, rp_scan_fn fn, void *ctx)
{
    if (n_caps > RP_SCAN_MAX_CAPS)
        return RP_EINPUT;
    for (size_t k = 1; k < n_caps; k++)
        if (caps[k] < caps[k - 1])
            return RP_EINPUT;
    const uint8_t *p = s->rq, *end = rq_end(s);
    while (p < end) {
        req q;
        p = rq_header(p, &q);
        rp_scan_req r;
        r.n_tokens = q.n_tokens;
        r.n_prompt_full = q.n_prompt_full;
        rq_distances_multi(&p, q.n_warm, caps, n_caps, r.n_below);
        /* Touched output blocks follow the prompt's: only prompt blocks are looked up. */
        for (size_t k = 0; k < n_caps; k++)
            if (r.n_below[k] > q.n_prompt_full)
                r.n_below[k] = q.n_prompt_full;
        r.limit = (uint32_t)((q.n_tokens - 1) / s->cfg.block_size);
        fn(ctx, &r);
    }
    return RP_OK;
}

uint64_t rp_sim_distinct(const rp_sim *s)
{
    return s->n_live;
}

size_t rp_sim_n_groups(const rp_sim *s, int dim)
{
    return dim >= 0 && dim < RP_N_DIMS ? s->n_names[dim] : 0;
}

const char *rp_sim_group_name(const rp_sim *s, int dim, size_t i, size_t *len)
{
    if (dim < 0 || dim >= RP_N_DIMS || i >= s->n_names[dim]) {
        *len = 0;
        return NULL;
    }
    *len = s->names[dim][i].len;
    return s->names[dim][i].bytes;
}

bool rp_sim_check(const rp_sim *s)
{
    uint64_t n_marked = 0, n_touched = 0;
    for (uint64_t t = 0; t < s->n_words * 64; t++) {
        if (is_marked(s, t) && (t == 0 || t > s->n_time))
            return false;
        n_marked += is_marked(s, t);
    }
    for (size_t i = 0; i < s->n_ents; i++) {
        const entry *e = &s->ents[i];
        if (key_find(s, e->key) != i)
            return false;
        if (e->last == 0)
            continue;
        n_touched++;
        if (e->last > s->n_time || !is_marked(s, e->last))
            return false;
    }
    if (n_marked != s->n_live || n_touched != s->n_live ||
        fen_prefix(s, s->n_words * 64 - 1) != s->n_live)
        return false;
    size_t n_reqs = 0;
    const uint8_t *p = s->rq, *end = rq_end(s);
    while (p < end) {
        req q;
        p = rq_header(p, &q);
        if (q.n_prompt_full > q.n_touch || q.n_warm > q.n_touch || q.n_tokens == 0)
            return false;
        for (int d = 0; d < RP_N_DIMS; d++)
            if (q.g[d] >= s->n_names[d])
                return false;
        uint32_t n_below;
        if (rq_distances(&p, q.n_warm, RP_COLD, &n_below) > RP_DIST_MAX || n_below != q.n_warm)
            return false;
        n_reqs++;
    }
    if (p != end || n_reqs != s->n_reqs)
        return false;
    return true;
}

void rp_sim_free(rp_sim *s)
{
    if (!s)
        return;
    free(s->ents);
    free(s->tab);
    kvp_hasher_free(s->own_hasher);
    for (int d = 0; d < RP_N_DIMS; d++) {
        group *g, *tmp;
        HASH_ITER(hh, s->groups[d], g, tmp)
        {
            HASH_DEL(s->groups[d], g);
            free(g);
        }
        for (size_t i = 0; i < s->n_names[d]; i++)
            free(s->names[d][i].bytes);
        free(s->names[d]);
    }
    kvp_cache_free(s->pool);
    free(s->fen);
    free(s->bits);
    free(s->rq);
    free(s->pm);
    free(s->scratch_keys);
    free(s->scratch_ent);
    free(s->scratch_ids);
    free(s);
}
