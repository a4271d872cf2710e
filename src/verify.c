/*
 * verify.c - collision-proof mode: exact provenance for every cached block.
 *
 * With kvp_config.verify_tokens, a key match is trusted only after checking what the key
 * stands for, so even a forced hash collision can never hand one prefix's KV to another:
 *
 *   tokens[b * block_size ...]  the block's own tokens, compared on every hit;
 *   meta[b].parent, parent_gen  the indexed block it was chained to when stored, and that
 *                               block's generation then (every store draws a new 64-bit
 *                               serial, so a recycled parent never matches again);
 *   meta[b].ns                  for a first block: its interned namespace, compared by id.
 *
 * A hit on block i is accepted only if its tokens equal the query's, and either i == 0 and
 * its namespace is the query's, or its parent is the block accepted for i - 1 at the same
 * generation. By induction the whole prefix and the namespace are then equal byte for byte.
 *
 * Namespaces are interned exactly: each distinct (model, adapter, tenant, salt) gets one
 * kvp__nsrec holding its encoded bytes, found through a uthash table of kvp__nsroot entries
 * by root key; records whose roots collide share one entry's chain and are told apart by
 * their bytes. A record is referenced by
 * active requests and by indexed first blocks, and freed when the last reference goes.
 *
 * Cost: block_size * 4 + 16 bytes per pool block, one memcmp of block_size tokens per hit.
 */
#include <string.h>

#include "internal.h"

#undef uthash_malloc
#undef uthash_free
#define uthash_malloc(sz)    kvp__mem_alloc(&cache->mem, (sz))
#define uthash_free(ptr, sz) kvp__mem_free(&cache->mem, (ptr), (sz))

/* One entry of the by_key table: every interned namespace whose root key is `root`. */
typedef struct kvp__nsroot {
    UT_hash_handle hh; /* by_key linkage */
    kvp_key root;      /* the (possibly truncated) root key shared by the chain */
    kvp__nsrec *first; /* the chain; never empty while the entry is in the table */
} kvp__nsroot;

struct kvp__nsrec {
    kvp__nsroot *owner;    /* the by_key entry whose chain holds this record */
    kvp__nsrec *next;      /* next record with the same root key */
    uint32_t id;           /* index in verify.slots */
    uint32_t refs;         /* active requests + indexed first blocks using it */
    size_t n_bytes;        /* length of bytes */
    unsigned char bytes[]; /* the four fields, each: present byte, u64 length, data */
};

/* Bytes of ns's encoding, or SIZE_MAX if that does not fit a size_t (bogus lengths). */
static size_t ns_encoded_len(const kvp_namespace *ns)
{
    const kvp_field *f[4] = {&ns->model, &ns->adapter, &ns->tenant, &ns->salt};
    size_t n = 0;
    for (int i = 0; i < 4; i++) {
        size_t add = f[i]->ptr ? f[i]->len : 0;
        if (add > SIZE_MAX / 2 || n > SIZE_MAX / 2 - add - 9)
            return SIZE_MAX;
        n += 1 + (f[i]->ptr ? 8 + add : 0);
    }
    return n;
}

static void ns_encode(const kvp_namespace *ns, unsigned char *p)
{
    const kvp_field *f[4] = {&ns->model, &ns->adapter, &ns->tenant, &ns->salt};
    for (int i = 0; i < 4; i++) {
        *p++ = f[i]->ptr != NULL;
        if (!f[i]->ptr)
            continue;
        uint64_t len = f[i]->len;
        memcpy(p, &len, 8);
        p += 8;
        if (f[i]->len)
            memcpy(p, f[i]->ptr, f[i]->len);
        p += f[i]->len;
    }
}

/* Compare ns with a record's bytes without building the encoding. */
static bool ns_equal(const kvp_namespace *ns, const kvp__nsrec *rec)
{
    const kvp_field *f[4] = {&ns->model, &ns->adapter, &ns->tenant, &ns->salt};
    const unsigned char *p = rec->bytes, *end = rec->bytes + rec->n_bytes;
    for (int i = 0; i < 4; i++) {
        if (p >= end || *p++ != (f[i]->ptr != NULL))
            return false;
        if (!f[i]->ptr)
            continue;
        uint64_t len;
        if ((size_t)(end - p) < 8)
            return false;
        memcpy(&len, p, 8);
        p += 8;
        if (len != f[i]->len || (size_t)(end - p) < len)
            return false;
        if (len && memcmp(p, f[i]->ptr, len) != 0)
            return false;
        p += len;
    }
    return p == end;
}

/* Allocate the token store and provenance table. KVP_OK or KVP_ENOMEM (nothing kept). */
int kvp__verify_init(kvp_cache *cache)
{
    kvp__verify *v = &cache->verify;
    size_t n = cache->cfg.n_blocks, bs = cache->cfg.block_size;
    memset(v, 0, sizeof *v);
    if (bs && n > SIZE_MAX / sizeof(uint32_t) / bs)
        return kvp__fail(KVP_ENOMEM,
                         "the token store of %zu blocks of %zu tokens does not fit "
                         "in memory",
                         n, bs);
    v->tokens = kvp__mem_alloc(&cache->mem, n * bs * sizeof(uint32_t));
    v->meta = kvp__mem_calloc(&cache->mem, n, sizeof(kvp__vmeta));
    if (!v->tokens || !v->meta) {
        kvp__verify_free(cache);
        return kvp__fail(KVP_ENOMEM, "out of memory: the verify_tokens store of %zu blocks", n);
    }
    for (size_t i = 0; i < n; i++) {
        v->meta[i].parent = KVP_NIL;
        v->meta[i].ns = KVP_NIL;
    }
    return KVP_OK;
}

static void nsrec_free(kvp_cache *cache, kvp__nsrec *rec)
{
    kvp__mem_free(&cache->mem, rec, sizeof *rec + rec->n_bytes);
}

void kvp__verify_free(kvp_cache *cache)
{
    kvp__verify *v = &cache->verify;
    size_t n = cache->cfg.n_blocks, bs = cache->cfg.block_size;
    for (uint32_t i = 0; i < v->n_slots; i++)
        if (v->slots[i])
            nsrec_free(cache, v->slots[i]);
    kvp__nsroot *node, *tmp;
    HASH_ITER(hh, v->by_key, node, tmp)
    {
        HASH_DELETE(hh, v->by_key, node);
        kvp__mem_free(&cache->mem, node, sizeof *node);
    }
    kvp__mem_free(&cache->mem, v->slots, (size_t)v->n_slots * sizeof(kvp__nsrec *));
    kvp__mem_free(&cache->mem, v->tokens, n * bs * sizeof(uint32_t));
    kvp__mem_free(&cache->mem, v->meta, n * sizeof(kvp__vmeta));
    memset(v, 0, sizeof *v);
}

static kvp__nsrec *find_rec(const kvp_cache *cache, const kvp_namespace *ns, kvp_key root,
                            kvp__nsroot **node_out)
{
    kvp__nsroot *node;
    HASH_FIND(hh, cache->verify.by_key, &root, sizeof root, node);
    if (node_out)
        *node_out = node;
    for (kvp__nsrec *rec = node ? node->first : NULL; rec; rec = rec->next)
        if (ns_equal(ns, rec))
            return rec;
    return NULL;
}

/* The interned id of ns, or KVP_NIL if it was never interned. Does not allocate. */
uint32_t kvp__verify_ns_find(const kvp_cache *cache, const kvp_namespace *ns, kvp_key root)
{
    kvp__nsrec *rec = find_rec(cache, ns, root, NULL);
    return rec ? rec->id : KVP_NIL;
}

/* Intern ns and take one reference for the caller; *out receives its id. Returns KVP_OK or
 * KVP_ENOMEM (nothing changed). */
int kvp__verify_ns_intern(kvp_cache *cache, const kvp_namespace *ns, kvp_key root, uint32_t *out)
{
    kvp__verify *v = &cache->verify;
    kvp__nsroot *node;
    kvp__nsrec *rec = find_rec(cache, ns, root, &node);
    if (rec) {
        rec->refs++;
        *out = rec->id;
        return KVP_OK;
    }
    /* Step 1: find or make a free slot (allocation before any change). */
    uint32_t slot = v->free_slot;
    while (slot < v->n_slots && v->slots[slot])
        slot++;
    if (slot == v->n_slots) {
        uint32_t n = v->n_slots ? v->n_slots * 2 : 8;
        if (n <= v->n_slots || n >= KVP_NIL)
            return kvp__fail(KVP_ENOMEM, "too many namespaces interned: %" PRIu32, v->n_slots);
        kvp__nsrec **slots = kvp__mem_calloc(&cache->mem, n, sizeof(kvp__nsrec *));
        if (!slots)
            return kvp__fail(KVP_ENOMEM, "out of memory: the table of %" PRIu32 " namespaces", n);
        if (v->n_slots)
            memcpy(slots, v->slots, (size_t)v->n_slots * sizeof(kvp__nsrec *));
        kvp__mem_free(&cache->mem, v->slots, (size_t)v->n_slots * sizeof(kvp__nsrec *));
        v->slots = slots;
        v->n_slots = n;
    }
    /* Step 2: build the record, and a table entry if no namespace has this root yet. */
    size_t n_bytes = ns_encoded_len(ns);
    if (n_bytes > SIZE_MAX - sizeof *rec)
        return kvp__fail(KVP_ENOMEM, "the namespace's fields are too long to keep");
    rec = kvp__mem_alloc(&cache->mem, sizeof *rec + n_bytes);
    if (!rec)
        return kvp__fail(KVP_ENOMEM, "out of memory: a copy of the namespace (%zu bytes)", n_bytes);
    memset(rec, 0, sizeof *rec);
    rec->id = slot;
    rec->refs = 1;
    rec->n_bytes = n_bytes;
    ns_encode(ns, rec->bytes);
    if (!node) {
        node = kvp__mem_calloc(&cache->mem, 1, sizeof *node);
        if (!node) {
            nsrec_free(cache, rec);
            return kvp__fail(KVP_ENOMEM, "out of memory: the namespace's table entry");
        }
        node->root = root;
        HASH_ADD(hh, v->by_key, root, sizeof node->root, node);
        if (node->hh.tbl == NULL) {
            kvp__mem_free(&cache->mem, node, sizeof *node);
            nsrec_free(cache, rec);
            return kvp__fail(KVP_ENOMEM, "out of memory: the table of namespaces");
        }
    }
    /* Step 3: link it; nothing can fail from here on. */
    rec->owner = node;
    rec->next = node->first;
    node->first = rec;
    v->slots[slot] = rec;
    v->free_slot = slot + 1;
    *out = slot;
    return KVP_OK;
}

void kvp__verify_ns_ref(kvp_cache *cache, uint32_t ns)
{
    assert(ns < cache->verify.n_slots && cache->verify.slots[ns]);
    assert(cache->verify.slots[ns]->refs > 0 && cache->verify.slots[ns]->refs < UINT32_MAX);
    cache->verify.slots[ns]->refs++;
}

/* Drop one reference; the last one unlinks and frees the record (and its table entry when
 * the chain empties: deleting from uthash never allocates). Cannot fail. */
void kvp__verify_ns_unref(kvp_cache *cache, uint32_t ns)
{
    kvp__verify *v = &cache->verify;
    assert(ns < v->n_slots && v->slots[ns] && v->slots[ns]->id == ns);
    kvp__nsrec *rec = v->slots[ns];
    assert(rec->refs > 0);
    if (--rec->refs > 0)
        return;
    kvp__nsroot *node = rec->owner;
    kvp__nsrec **link = &node->first;
    while (*link != rec) {
        assert(*link); /* the record is on its owner's chain */
        link = &(*link)->next;
    }
    *link = rec->next;
    if (!node->first) {
        HASH_DELETE(hh, v->by_key, node);
        kvp__mem_free(&cache->mem, node, sizeof *node);
    }
    v->slots[ns] = NULL;
    if (ns < v->free_slot)
        v->free_slot = ns;
    nsrec_free(cache, rec);
}

/* Is block id what the query expects: these block_size tokens, and (first block, parent.id
 * == KVP_NIL) namespace ns, or (later block) exactly the parent instance `parent` (the
 * block accepted before it, at the generation it had when accepted)? */
bool kvp__verify_block(const kvp_cache *cache, uint32_t id, const uint32_t *tokens,
                       kvp__vref parent, uint32_t ns)
{
    const kvp__verify *v = &cache->verify;
    assert(id < cache->pool.n_blocks && tokens);
    const kvp__vmeta *m = &v->meta[id];
    size_t bs = cache->cfg.block_size;
    if (memcmp(v->tokens + (size_t)id * bs, tokens, bs * sizeof(uint32_t)) != 0)
        return false;
    if (parent.id == KVP_NIL)
        return ns != KVP_NIL && m->parent == KVP_NIL && m->ns == ns;
    return m->parent == parent.id && m->parent_gen == parent.gen;
}

/* Record the provenance of block id, just indexed: its tokens, and either its accepted
 * parent instance (parent.id != KVP_NIL) or, for a first block, namespace ns (which gains a
 * reference). The parent instance may be stale: a commit that deduplicated block i - 1
 * against an unpinned cached block does not pin it, so that block may have been evicted
 * since and even recycled into this request as block i itself (parent.id == id, at an
 * older generation). The block is then stored after an instance that no lookup can accept
 * again, so verified lookups never reach it; it is evicted like any other. Cannot fail. */
void kvp__verify_store(kvp_cache *cache, uint32_t id, const uint32_t *tokens, kvp__vref parent,
                       uint32_t ns)
{
    kvp__verify *v = &cache->verify;
    assert(id < cache->pool.n_blocks && tokens && v->meta[id].ns == KVP_NIL);
    assert((parent.id == KVP_NIL) == (ns != KVP_NIL));
    kvp__vmeta *m = &v->meta[id];
    size_t bs = cache->cfg.block_size;
    memcpy(v->tokens + (size_t)id * bs, tokens, bs * sizeof(uint32_t));
    m->gen = ++v->serial;
    m->parent = parent.id;
    m->parent_gen = parent.gen;
    m->ns = parent.id == KVP_NIL ? ns : KVP_NIL;
    if (m->ns != KVP_NIL)
        kvp__verify_ns_ref(cache, m->ns);
}

/* Block id left the index: drop its namespace reference. Cannot fail. */
void kvp__verify_forget(kvp_cache *cache, uint32_t id)
{
    assert(id < cache->pool.n_blocks);
    kvp__vmeta *m = &cache->verify.meta[id];
    if (m->ns != KVP_NIL)
        kvp__verify_ns_unref(cache, m->ns);
    m->ns = KVP_NIL;
    m->parent = KVP_NIL;
}

/* For the checker: the reference count of interned namespace slot s (0 if s is free). */
uint32_t kvp__verify_ns_refs(const kvp_cache *cache, uint32_t s)
{
    const kvp__verify *v = &cache->verify;
    return s < v->n_slots && v->slots[s] && v->slots[s]->id == s ? v->slots[s]->refs : 0;
}
