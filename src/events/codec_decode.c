/*
 * codec_decode.c - a vLLM KV-event msgpack payload as a kvp_kv_batch (kvp_kv_decode,
 * kvp_kv_batch_free), read with msgpack-c.
 *
 * Steps:
 *   1. kvp__mp_walk proves the payload is one complete msgpack object whose containers
 *      claim no more elements than there are bytes, and nests at most KVP_KV_MAX_DEPTH
 *      deep (msgpack-c allocates claimed sizes up front: see codec.h);
 *   2. msgpack_unpack_next builds the object tree in a zone (strings and bins point into
 *      the payload);
 *   3. a measuring pass walks the tree, checks every field and adds up the bytes the batch
 *      needs; nothing is allocated and the first error ends the call;
 *   4. one allocation of exactly that size, and a filling pass over the same code, which
 *      cannot fail since the measuring pass succeeded on the same tree.
 *
 * The batch is a single block, freed with one free():
 *
 *   [kvp_kv_batch][events: kvp_kv_event x n][per event: hashes | tokens | strings | extra]
 *
 * The two passes run the same functions over an arena whose base is NULL while measuring:
 * arena_take then returns NULL and the callers skip their stores, so the measured size and
 * the filled layout cannot disagree.
 *
 * Memory per input byte: msgpack-c's tree holds one 24-byte msgpack_object per element (at
 * least one byte each, which the walk guarantees); the batch one 144-byte kvp_kv_event per
 * event (at least 18 bytes: ["AllBlocksCleared"]), 8 bytes per hash and 4 per token (at
 * least 1 byte each), a string's bytes plus 8 (at least 1 byte). So about 24 + 8 bytes per
 * input byte at most, plus msgpack-c's 8 KiB first chunk.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

/* ---------------------------------------------------------------------------------------- */
/* Step 1: the header walk                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* Big-endian unsigned integer of n (1, 2, 4) bytes at p. */
static uint64_t load_be(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* Classify lead byte b: the size of its length field (*len_bytes: 0, 1, 2 or 4), the bytes
 * that follow the header besides a body whose length that field gives (*fixed), what the
 * length counts (*mult 0: bytes; 1: array elements; 2: map pairs, so 2 elements each) and
 * the element count of a fix container (*n_items). Returns false for 0xc1, which msgpack
 * never uses. */
static bool lead_byte(uint8_t b, size_t *len_bytes, uint64_t *fixed, uint64_t *n_items,
                      unsigned *mult)
{
    /* Indexed by b - 0xc0. fixed: bytes after the header (the ext type byte, a number's
     * payload); len: the length field's size (str, bin, ext, array 16/32, map 16/32). */
    static const uint8_t fixed_of[32] = {
        0,  0, 0, 0, 0, 0, 0, 1, /* c0-c7: nil, (unused), false, true, bin 8/16/32, ext 8 */
        1,  1, 4, 8, 1, 2, 4, 8, /* c8-cf: ext 16/32, float 32/64, uint 8/16/32/64 */
        1,  2, 4, 8, 2, 3, 5, 9, /* d0-d7: int 8/16/32/64, fixext 1/2/4/8 */
        17, 0, 0, 0, 0, 0, 0, 0  /* d8-df: fixext 16, str 8/16/32, array 16/32, map 16/32 */
    };
    static const uint8_t len_of[32] = {
        0, 0, 0, 0, 1, 2, 4, 1, /* c0-c7 */
        2, 4, 0, 0, 0, 0, 0, 0, /* c8-cf */
        0, 0, 0, 0, 0, 0, 0, 0, /* d0-d7 */
        0, 1, 2, 4, 2, 4, 2, 4  /* d8-df */
    };
    *len_bytes = 0;
    *fixed = 0;
    *n_items = 0;
    *mult = 0;
    if (b <= 0x7f || b >= 0xe0)
        return true;
    if (b <= 0x8f) {
        *n_items = 2u * (b & 0x0fu);
        return true;
    }
    if (b <= 0x9f) {
        *n_items = b & 0x0fu;
        return true;
    }
    if (b <= 0xbf) {
        *fixed = b & 0x1fu;
        return true;
    }
    if (b == 0xc1)
        return false;
    *len_bytes = len_of[b - 0xc0];
    *fixed = fixed_of[b - 0xc0];
    *mult = b >= 0xdc ? (b >= 0xde ? 2u : 1u) : 0u;
    return true;
}

int kvp__mp_walk(const uint8_t *p, size_t len, size_t *consumed)
{
    uint64_t left[KVP_KV_MAX_DEPTH + 1]; /* elements still to read per open container */
    size_t depth = 1, pos = 0;
    uint64_t pending = 1; /* sum of left[]: each needs at least one more byte */
    left[0] = 1;
    while (depth > 0) {
        if (left[depth - 1] == 0) {
            depth--;
            continue;
        }
        left[depth - 1]--;
        pending--;
        if (pos >= len)
            return KVP_EFORMAT;
        size_t len_bytes;
        uint64_t body, n_items;
        unsigned mult;
        if (!lead_byte(p[pos++], &len_bytes, &body, &n_items, &mult))
            return KVP_EFORMAT;
        if (len_bytes) {
            if (len - pos < len_bytes)
                return KVP_EFORMAT;
            uint64_t v = load_be(p + pos, len_bytes);
            pos += len_bytes;
            if (mult)
                n_items = v * mult;
            else
                body += v;
        }
        if (body > len - pos)
            return KVP_EFORMAT;
        pos += (size_t)body;
        if (pending > len - pos)
            return KVP_EFORMAT;
        if (n_items == 0)
            continue;
        if (depth > KVP_KV_MAX_DEPTH || n_items > len - pos - pending)
            return KVP_EFORMAT;
        left[depth++] = n_items;
        pending += n_items;
    }
    *consumed = pos;
    return KVP_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Steps 3 and 4: the object tree as a batch                                                */
/* ---------------------------------------------------------------------------------------- */

/* The batch's block while filling; base == NULL while measuring. */
typedef struct arena {
    char *base;  /* the block, or NULL in the measuring pass */
    size_t used; /* bytes handed out so far (the block's size after a measuring pass) */
} arena;

/* n bytes aligned to 8: a pointer into the block, or NULL while measuring. Cannot fail. */
static void *arena_take(arena *a, size_t n)
{
    a->used = (a->used + 7u) & ~(size_t)7u;
    void *p = a->base ? a->base + a->used : NULL;
    a->used += n;
    return p;
}

/* The fields of every event type, in array-form order after the tag. */
enum {
    F_HASHES,
    F_PARENT,
    F_TOKENS,
    F_BLOCK_SIZE,
    F_LORA_ID,
    F_MEDIUM,
    F_LORA_NAME,
    F_EXTRA_KEYS,
    F_GROUP_IDX,
    F_SPEC_KIND,
    F_SLIDING_WINDOW,
    N_FIELDS
};

static const char *const field_names[N_FIELDS] = {"block_hashes",
                                                  "parent_block_hash",
                                                  "token_ids",
                                                  "block_size",
                                                  "lora_id",
                                                  "medium",
                                                  "lora_name",
                                                  "extra_keys",
                                                  "group_idx",
                                                  "kv_cache_spec_kind",
                                                  "kv_cache_spec_sliding_window"};

/* One event type: its tag, fields in array order and the ones it requires. */
typedef struct ev_kind {
    const char *tag;   /* the type string */
    int type;          /* KVP_EVENT_* */
    const int *fields; /* field ids in array-form order */
    size_t n_fields;   /* how many */
    unsigned required; /* bit (1 << field id) for each field that must be present */
} ev_kind;

static const int stored_fields[] = {F_HASHES,    F_PARENT,    F_TOKENS,        F_BLOCK_SIZE,
                                    F_LORA_ID,   F_MEDIUM,    F_LORA_NAME,     F_EXTRA_KEYS,
                                    F_GROUP_IDX, F_SPEC_KIND, F_SLIDING_WINDOW};
static const int removed_fields[] = {F_HASHES, F_MEDIUM, F_GROUP_IDX};

static const ev_kind kinds[] = {
    {"BlockStored", KVP_EVENT_STORED, stored_fields, 11,
     1u << F_HASHES | 1u << F_TOKENS | 1u << F_BLOCK_SIZE},
    {"BlockRemoved", KVP_EVENT_REMOVED, removed_fields, 3, 1u << F_HASHES},
    {"AllBlocksCleared", KVP_EVENT_CLEARED, NULL, 0, 0},
};

static bool str_is(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
           memcmp(o->via.str.ptr, s, n) == 0;
}

/* A signed 64-bit integer. KVP_EFORMAT for other types or values above INT64_MAX. */
static int get_i64(const msgpack_object *o, int64_t *out)
{
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *out = o->via.i64;
        return KVP_OK;
    }
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > INT64_MAX)
        return KVP_EFORMAT;
    *out = (int64_t)o->via.u64;
    return KVP_OK;
}

/* An integer in min .. max. */
static int get_range(const msgpack_object *o, int64_t min, int64_t max, int64_t *out)
{
    int64_t v;
    if (get_i64(o, &v) != KVP_OK || v < min || v > max)
        return KVP_EFORMAT;
    *out = v;
    return KVP_OK;
}

/* A block hash: an int (negative ones as two's complement) or a non-empty bin (its last 8
 * bytes big-endian). */
static int get_hash(const msgpack_object *o, uint64_t *out)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        *out = o->via.u64;
        return KVP_OK;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *out = (uint64_t)o->via.i64;
        return KVP_OK;
    case MSGPACK_OBJECT_BIN: {
        uint32_t n = o->via.bin.size;
        if (n == 0)
            return KVP_EFORMAT;
        uint32_t from = n > 8 ? n - 8 : 0;
        uint64_t v = 0;
        for (uint32_t i = from; i < n; i++)
            v = v << 8 | (uint8_t)o->via.bin.ptr[i];
        *out = v;
        return KVP_OK;
    }
    default:
        return KVP_EFORMAT;
    }
}

static int get_hashes(arena *a, const msgpack_object *o, kvp_kv_event *ev)
{
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return KVP_EFORMAT;
    size_t n = o->via.array.size;
    uint64_t *dst = arena_take(a, n * sizeof *dst);
    for (size_t i = 0; i < n; i++) {
        uint64_t h;
        if (get_hash(&o->via.array.ptr[i], &h) != KVP_OK)
            return KVP_EFORMAT;
        if (dst)
            dst[i] = h;
    }
    ev->hashes = dst;
    ev->n_hashes = n;
    return KVP_OK;
}

static int get_tokens(arena *a, const msgpack_object *o, kvp_kv_event *ev)
{
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return KVP_EFORMAT;
    size_t n = o->via.array.size;
    uint32_t *dst = arena_take(a, n * sizeof *dst);
    for (size_t i = 0; i < n; i++) {
        const msgpack_object *t = &o->via.array.ptr[i];
        if (t->type != MSGPACK_OBJECT_POSITIVE_INTEGER || t->via.u64 > UINT32_MAX)
            return KVP_EFORMAT;
        if (dst)
            dst[i] = (uint32_t)t->via.u64;
    }
    ev->tokens = dst;
    ev->n_tokens = n;
    return KVP_OK;
}

/* A string or nil (*out = NULL), copied NUL-terminated; strings holding NUL are refused. */
static int get_opt_str(arena *a, const msgpack_object *o, const char **out)
{
    if (o->type == MSGPACK_OBJECT_NIL) {
        *out = NULL;
        return KVP_OK;
    }
    if (o->type != MSGPACK_OBJECT_STR)
        return KVP_EFORMAT;
    size_t n = o->via.str.size;
    if (n && memchr(o->via.str.ptr, 0, n))
        return KVP_EFORMAT;
    char *dst = arena_take(a, n + 1);
    if (dst) {
        memcpy(dst, o->via.str.ptr, n);
        dst[n] = '\0';
    }
    *out = a->base ? dst : "";
    return KVP_OK;
}

/* extra_keys: nil, or a list whose entries are nil or lists; kept re-packed by msgpack-c. */
static int get_extra_keys(arena *a, const msgpack_object *o, kvp_kv_event *ev)
{
    if (o->type == MSGPACK_OBJECT_NIL) {
        ev->extra_keys = NULL;
        ev->extra_keys_bytes = 0;
        return KVP_OK;
    }
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return KVP_EFORMAT;
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        msgpack_object_type t = o->via.array.ptr[i].type;
        if (t != MSGPACK_OBJECT_NIL && t != MSGPACK_OBJECT_ARRAY)
            return KVP_EFORMAT;
    }
    kvp__mpw w = {NULL, 0, 0};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &w, kvp__mpw_write);
    msgpack_pack_object(&pk, *o);
    uint8_t *dst = arena_take(a, w.len);
    if (dst) {
        kvp__mpw fill = {dst, w.len, 0};
        msgpack_packer_init(&pk, &fill, kvp__mpw_write);
        msgpack_pack_object(&pk, *o);
    }
    ev->extra_keys = a->base ? dst : (const uint8_t *)"";
    ev->extra_keys_bytes = w.len;
    return KVP_OK;
}

/* Read field f of ev from o. nil is "absent" for every optional field. */
static int get_field(arena *a, int f, const msgpack_object *o, kvp_kv_event *ev)
{
    bool nil = o->type == MSGPACK_OBJECT_NIL;
    int64_t v = 0;
    int rc = KVP_OK;
    switch (f) {
    case F_HASHES:
        return get_hashes(a, o, ev);
    case F_PARENT:
        ev->has_parent = !nil;
        return nil ? KVP_OK : get_hash(o, &ev->parent);
    case F_TOKENS:
        return get_tokens(a, o, ev);
    case F_BLOCK_SIZE:
        rc = get_range(o, 1, UINT32_MAX, &v);
        ev->block_size = (uint32_t)v;
        return rc;
    case F_LORA_ID:
        ev->has_lora_id = !nil;
        return nil ? KVP_OK : get_i64(o, &ev->lora_id);
    case F_MEDIUM:
        return get_opt_str(a, o, &ev->medium);
    case F_LORA_NAME:
        return get_opt_str(a, o, &ev->lora_name);
    case F_EXTRA_KEYS:
        return get_extra_keys(a, o, ev);
    case F_GROUP_IDX:
        rc = nil ? KVP_OK : get_range(o, 0, INT32_MAX, &v);
        ev->group_idx = nil ? -1 : (int32_t)v;
        return rc;
    case F_SPEC_KIND:
        return get_opt_str(a, o, &ev->spec_kind);
    default:
        ev->has_sliding_window = !nil;
        return nil ? KVP_OK : get_i64(o, &ev->sliding_window);
    }
}

static const ev_kind *kind_of(const msgpack_object *tag)
{
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (str_is(tag, kinds[i].tag))
            return &kinds[i];
    return NULL;
}

/* An event in array form: [tag, fields in order...]; extra trailing elements ignored. */
static int get_event_array(arena *a, const msgpack_object *o, kvp_kv_event *ev)
{
    const msgpack_object *el = o->via.array.ptr;
    uint32_t n = o->via.array.size;
    const ev_kind *k = n ? kind_of(&el[0]) : NULL;
    if (!k)
        return KVP_EFORMAT;
    ev->type = k->type;
    unsigned seen = 0;
    for (uint32_t i = 1; i < n && i - 1 < k->n_fields; i++) {
        int f = k->fields[i - 1];
        if (get_field(a, f, &el[i], ev) != KVP_OK)
            return KVP_EFORMAT;
        seen |= 1u << f;
    }
    return (seen & k->required) == k->required ? KVP_OK : KVP_EFORMAT;
}

/* The field id named by key within kind k, or -1 (an unknown key, ignored). */
static int field_of(const ev_kind *k, const msgpack_object *key)
{
    for (size_t i = 0; i < k->n_fields; i++)
        if (str_is(key, field_names[k->fields[i]]))
            return k->fields[i];
    return -1;
}

/* An event in map form: {"type": tag, name: value, ...}; unknown keys ignored, a known key
 * given twice refused. */
static int get_event_map(arena *a, const msgpack_object *o, kvp_kv_event *ev)
{
    const msgpack_object_kv *kv = o->via.map.ptr;
    uint32_t n = o->via.map.size;
    const ev_kind *k = NULL;
    for (uint32_t i = 0; i < n; i++)
        if (str_is(&kv[i].key, "type")) {
            if (k)
                return KVP_EFORMAT;
            k = kind_of(&kv[i].val);
            if (!k)
                return KVP_EFORMAT;
        }
    if (!k)
        return KVP_EFORMAT;
    ev->type = k->type;
    unsigned seen = 0;
    for (uint32_t i = 0; i < n; i++) {
        int f = field_of(k, &kv[i].key);
        if (f < 0)
            continue;
        if ((seen & 1u << f) || get_field(a, f, &kv[i].val, ev) != KVP_OK)
            return KVP_EFORMAT;
        seen |= 1u << f;
    }
    return (seen & k->required) == k->required ? KVP_OK : KVP_EFORMAT;
}

static int get_event(arena *a, const msgpack_object *o, kvp_kv_event *ev)
{
    memset(ev, 0, sizeof *ev);
    ev->group_idx = -1;
    if (o->type == MSGPACK_OBJECT_ARRAY)
        return get_event_array(a, o, ev);
    if (o->type == MSGPACK_OBJECT_MAP)
        return get_event_map(a, o, ev);
    return KVP_EFORMAT;
}

static int get_events(arena *a, const msgpack_object *o, kvp_kv_batch *b)
{
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return KVP_EFORMAT;
    size_t n = o->via.array.size;
    kvp_kv_event *dst = arena_take(a, n * sizeof *dst);
    for (size_t i = 0; i < n; i++) {
        kvp_kv_event scratch;
        if (get_event(a, &o->via.array.ptr[i], dst ? &dst[i] : &scratch) != KVP_OK)
            return KVP_EFORMAT;
    }
    b->events = dst;
    b->n_events = n;
    return KVP_OK;
}

static int get_ts(const msgpack_object *o, double *out)
{
    switch (o->type) {
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        *out = o->via.f64;
        return KVP_OK;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        *out = (double)o->via.u64;
        return KVP_OK;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *out = (double)o->via.i64;
        return KVP_OK;
    default:
        return KVP_EFORMAT;
    }
}

static int get_dp_rank(const msgpack_object *o, kvp_kv_batch *b)
{
    b->has_dp_rank = o->type != MSGPACK_OBJECT_NIL;
    return b->has_dp_rank ? get_i64(o, &b->dp_rank) : KVP_OK;
}

/* The batch as a map: "ts" and "events" required, "data_parallel_rank" optional. */
static int get_batch_map(arena *a, const msgpack_object *o, kvp_kv_batch *b)
{
    const msgpack_object_kv *kv = o->via.map.ptr;
    bool seen[3] = {false, false, false};
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        static const char *const names[3] = {"ts", "events", "data_parallel_rank"};
        int f = -1;
        for (int j = 0; j < 3; j++)
            if (str_is(&kv[i].key, names[j]))
                f = j;
        if (f < 0)
            continue;
        if (seen[f])
            return KVP_EFORMAT;
        seen[f] = true;
        int rc = f == 0   ? get_ts(&kv[i].val, &b->ts)
                 : f == 1 ? get_events(a, &kv[i].val, b)
                          : get_dp_rank(&kv[i].val, b);
        if (rc != KVP_OK)
            return rc;
    }
    return seen[0] && seen[1] ? KVP_OK : KVP_EFORMAT;
}

/* The whole batch into *b (the arena's first bytes when filling). */
static int get_batch(arena *a, const msgpack_object *o, kvp_kv_batch *b)
{
    memset(b, 0, sizeof *b);
    if (o->type == MSGPACK_OBJECT_MAP)
        return get_batch_map(a, o, b);
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < 2)
        return KVP_EFORMAT;
    const msgpack_object *el = o->via.array.ptr;
    if (get_ts(&el[0], &b->ts) != KVP_OK || get_events(a, &el[1], b) != KVP_OK)
        return KVP_EFORMAT;
    return o->via.array.size > 2 ? get_dp_rank(&el[2], b) : KVP_OK;
}

KVP_EXPORT int kvp_kv_decode(const void *payload, size_t len, kvp_kv_batch **out)
{
    if (!out || (!payload && len))
        return KVP_EINVAL;
    /* Step 1: the header walk. */
    size_t used;
    if (kvp__mp_walk(payload, len, &used) != KVP_OK || used != len)
        return KVP_EFORMAT;
    /* Step 2: msgpack-c's object tree. */
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack_next(&up, payload, len, &off);
    int rc = ur == MSGPACK_UNPACK_SUCCESS && off == len ? KVP_OK
             : ur == MSGPACK_UNPACK_NOMEM_ERROR         ? KVP_ENOMEM
                                                        : KVP_EFORMAT;
    /* Step 3: measure. */
    arena a = {NULL, 0};
    kvp_kv_batch scratch;
    if (rc == KVP_OK) {
        (void)arena_take(&a, sizeof scratch);
        rc = get_batch(&a, &up.data, &scratch);
    }
    /* Step 4: allocate and fill. */
    char *block = rc == KVP_OK ? malloc(a.used) : NULL;
    if (rc == KVP_OK && !block)
        rc = KVP_ENOMEM;
    if (rc == KVP_OK) {
        arena fill = {block, 0};
        kvp_kv_batch *b = arena_take(&fill, sizeof *b);
        int rc2 = get_batch(&fill, &up.data, b);
        assert(rc2 == KVP_OK && fill.used == a.used);
        (void)rc2;
        *out = b;
    }
    msgpack_unpacked_destroy(&up);
    return rc;
}

KVP_EXPORT void kvp_kv_batch_free(kvp_kv_batch *batch)
{
    free(batch);
}
