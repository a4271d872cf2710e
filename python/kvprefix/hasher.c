/*
 * hasher.c - the Hasher type: a cache's key function outside any cache (kvp_hasher), for
 * routers, replicas and vLLM-exact block hashes, and Cache.hasher(), a cache's own.
 *
 * Layout: a Hasher either owns a kvp_hasher (Hasher(...): own, freed with the object) or
 * borrows its cache's (Cache.hasher(): cache holds a reference, own is NULL), which each call
 * reaches through the cache's in-flight count (kvpy_cache_enter), so that close() cannot free
 * it under the call; a closed cache's hasher raises ValueError, as the cache does.
 * Invariants: immutable after construction; exactly one of own and cache is set until the
 * garbage collector clears a cache's hasher (then neither, and every call raises). A hasher
 * takes no lock, so Hasher.blocks runs without the GIL in parallel with anything.
 */
#include "kvpy.h"

typedef struct HasherObject {
    PyObject_HEAD kvp_hasher *own; /* made by Hasher(...), freed with the object; else NULL */
    CacheObject *cache;            /* Cache.hasher(): the cache (a reference); else NULL */
    int profile;                   /* KVP_HASH_* */
    uint32_t block_size;           /* tokens per block */
} HasherObject;

static PyTypeObject hasher_type;

/* The hasher to use now (GIL held), or NULL with ValueError set when it is a closed cache's
 * (or one the garbage collector cleared). Pair a non-NULL result with hasher_leave. */
static const kvp_hasher *hasher_enter(HasherObject *self)
{
    if (self->own != NULL)
        return self->own;
    kvp_cache *kc = self->cache ? kvpy_cache_enter(self->cache) : NULL;
    if (kc == NULL)
        kvpy_raise_closed();
    return kc ? kvp_cache_hasher(kc) : NULL;
}

static void hasher_leave(HasherObject *self)
{
    if (self->cache != NULL)
        kvpy_cache_leave(self->cache);
}

static const kvpy_sig new_sig = {"Hasher",
                                 {{"profile", KVPY_PROFILE, KVPY_OPT, KVP_HASH_KEYED},
                                  {"block_size", KVPY_U32, KVPY_KWONLY, 16},
                                  {"key", KVPY_OBJECT, KVPY_KWONLY, 0},
                                  {"seed", KVPY_U64, KVPY_KWONLY, KVP_DEFAULT_SEED},
                                  {"vllm_seed", KVPY_OBJECT, KVPY_KWONLY, 0},
                                  {"vocab_size", KVPY_U32, KVPY_KWONLY, 0}}};

static PyObject *Hasher_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    kvpy_args a;
    if (kvpy_parse_tuple(&new_sig, args, kw, &a) != 0)
        return NULL;
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.hash_profile = a.v[0].profile;
    cfg.block_size = (uint32_t)a.v[1].u64;
    cfg.seed = a.v[3].u64;
    cfg.vocab_size = (uint32_t)a.v[5].u64;
    HasherObject *self = NULL;
    if (kvpy_hash_cfg_fill(&cfg, a.v[2].obj, a.v[4].obj, "Hasher", "key") == 0)
        self = (HasherObject *)type->tp_alloc(type, 0);
    int rc = self ? kvp_hasher_new(&cfg, &self->own) : KVP_OK;
    kvpy_wipe(cfg.hash_key, sizeof cfg.hash_key);
    if (self == NULL)
        return NULL;
    if (rc != KVP_OK) {
        Py_DECREF(self);
        return kvpy_raise(rc, "kvp_hasher_new");
    }
    self->profile = cfg.hash_profile;
    self->block_size = cfg.block_size;
    return (PyObject *)self;
}

PyObject *kvpy_hasher_of_cache(CacheObject *cache)
{
    if (cache->cache == NULL)
        return kvpy_raise_closed();
    HasherObject *h = PyObject_GC_New(HasherObject, &hasher_type);
    if (h == NULL)
        return NULL;
    h->own = NULL;
    h->cache = (CacheObject *)Py_NewRef(cache);
    h->profile = cache->hash_profile;
    h->block_size = cache->block_size;
    PyObject_GC_Track(h);
    return (PyObject *)h;
}

static int Hasher_traverse(HasherObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->cache);
    return 0;
}

static int Hasher_clear(HasherObject *self)
{
    Py_CLEAR(self->cache);
    return 0;
}

static void Hasher_dealloc(HasherObject *self)
{
    PyObject_GC_UnTrack(self);
    kvp_hasher_free(self->own);
    Hasher_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static const kvpy_sig root_sig = {"root", {{"ns", KVPY_NS, 0, 0}}};

static PyObject *Hasher_root(HasherObject *self, PyObject *arg)
{
    kvpy_value v;
    if (kvpy_convert(&root_sig, 0, arg, &v) != 0)
        return NULL;
    const kvp_hasher *h = hasher_enter(self);
    if (h == NULL)
        return NULL;
    chaindig c;
    int rc = kvp_hasher_root(h, v.ns, &c.chain);
    if (rc == KVP_OK)
        c.n_dig = kvp_chain_digest(h, &c.chain, c.dig);
    hasher_leave(self);
    return rc == KVP_OK ? kvpy_chain_to_py(&c) : kvpy_raise(rc, "kvp_hasher_root");
}

/* Hash t's full blocks from *start into d[0 .. *n) with their digests. Runs without the
 * GIL. Returns kvp_hasher_blocks's code. */
static int blocks_nogil(const kvp_hasher *h, const kvp_namespace *ns, kvp_chain *start,
                        const tokens *t, kvp_chain *out, chaindig *d, size_t cap, size_t *n)
{
    static const uint32_t none[1] = {0};
    int rc = kvp_hasher_blocks(h, ns, start, t->n ? t->ptr : none, t->n, out, cap, n);
    for (size_t i = 0; rc == KVP_OK && i < *n; i++) {
        d[i].chain = out[i];
        d[i].n_dig = kvp_chain_digest(h, &out[i], d[i].dig);
    }
    return rc;
}

static const kvpy_sig blocks_sig = {"blocks",
                                    {{"ns", KVPY_NS, 0, 0},
                                     {"tokens", KVPY_TOKENS, 0, 0},
                                     {"parent", KVPY_OBJECT, KVPY_OPT | KVPY_NONE, 0}}};

/* Steps: 1. convert (parent None: the root of ns); 2. hash without the GIL (the root first,
 * with it); 3. build the list of Chains. */
static PyObject *Hasher_blocks(HasherObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    /* Step 1: the arguments. */
    kvpy_args a;
    if (kvpy_parse(&blocks_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    const kvp_namespace *ns = a.v[0].ns;
    const tokens *t = &a.v[1].tokens;
    kvp_chain start;
    if (a.given[2] && kvpy_chain_from_py(a.v[2].obj, &start, "blocks", "parent") != 0) {
        kvpy_args_done(&a);
        return NULL;
    }
    /* Step 2: hash. */
    size_t cap = t->n / self->block_size, n = 0;
    kvp_chain *out = PyMem_RawMalloc(cap * sizeof *out + sizeof *out);
    chaindig *d = PyMem_RawMalloc(cap * sizeof *d + sizeof *d);
    const kvp_hasher *h = (out && d) ? hasher_enter(self) : NULL;
    int rc = KVP_OK;
    if (h != NULL) {
        if (!a.given[2])
            rc = kvp_hasher_root(h, ns, &start);
        if (rc == KVP_OK) {
            Py_BEGIN_ALLOW_THREADS rc = blocks_nogil(h, ns, &start, t, out, d, cap, &n);
            Py_END_ALLOW_THREADS
        }
        hasher_leave(self);
    } else if (!PyErr_Occurred()) {
        PyErr_NoMemory();
    }
    kvpy_args_done(&a);
    /* Step 3: the Chains. */
    PyObject *list = NULL;
    if (h != NULL && rc != KVP_OK)
        kvpy_raise(rc, "kvp_hasher_blocks");
    else if (h != NULL)
        list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *c = kvpy_chain_to_py(&d[i]);
        if (c == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, c);
    }
    PyMem_RawFree(out);
    PyMem_RawFree(d);
    return list;
}

static const kvpy_sig external_key_sig = {
    "external_key", {{"root", KVPY_KEY, 0, 0}, {"external_id", KVPY_KEY, 0, 0}}};

static PyObject *Hasher_external_key(HasherObject *self, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&external_key_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    const kvp_hasher *h = hasher_enter(self);
    if (h == NULL)
        return NULL;
    kvp_key k = kvp_hasher_external_key(h, a.v[0].key, a.v[1].key);
    hasher_leave(self);
    return kvpy_key_to_int(k);
}

static PyObject *Hasher_get(HasherObject *self, void *closure)
{
    if ((intptr_t)closure == 0)
        return PyUnicode_FromString(kvp_hash_profile_name(self->profile));
    return PyLong_FromUnsignedLong(self->block_size);
}

static PyGetSetDef Hasher_getset[] = {
    {"profile", (getter)Hasher_get, NULL, "The hash profile's name.", (void *)0},
    {"block_size", (getter)Hasher_get, NULL, "Tokens per block.", (void *)1},
    {NULL, NULL, NULL, NULL, NULL},
};

static const kvpy_def Hasher_defs[] = {
    {&root_sig, (PyCFunction)Hasher_root, METH_O,
     "The chain start of namespace ns, a Chain (kvp_hasher_root): n_blocks 0; under the vLLM "
     "profiles its digest is NONE_HASH."},
    {&blocks_sig, KVPY_FN(Hasher_blocks), KVPY_FASTKW,
     "Hash the full blocks of tokens (kvp_hasher_blocks) continuing parent (None: the root of "
     "ns): a list of one Chain per block, with .key (the cache's index key), .digest (bytes) "
     "and .event (vLLM's KV-event int). Releases the GIL."},
    {&external_key_sig, KVPY_FN(Hasher_external_key), KVPY_FASTKW,
     "The key (an int) an external block id is cached under in the namespace with root key "
     "root (as lookup_ids computes it)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject hasher_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvprefix.Hasher",
    .tp_basicsize = sizeof(HasherObject),
    .tp_dealloc = (destructor)Hasher_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Hasher_traverse,
    .tp_clear = (inquiry)Hasher_clear,
    .tp_getset = Hasher_getset,
    .tp_new = Hasher_new,
};

int kvpy_hasher_add(PyObject *m)
{
    hasher_type.tp_doc = kvpy_type_doc(
        &new_sig, "A cache's key function outside any cache (kvp_hasher): a router computes the\n"
                  "keys an engine's cache computes, or vLLM's exact block hashes under the\n"
                  "vllm-sha256-cbor and vllm-xxhash-cbor profiles. key=None under keyed and\n"
                  "siphash draws a random key (equal to no other hasher). Cache.hasher() returns\n"
                  "the hasher of a cache. Immutable: share it between threads freely.");
    hasher_type.tp_methods = kvpy_methods(Hasher_defs, "$self");
    if (hasher_type.tp_doc == NULL || hasher_type.tp_methods == NULL ||
        PyType_Ready(&hasher_type) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "Hasher", (PyObject *)&hasher_type);
}
