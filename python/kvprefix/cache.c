/*
 * cache.c - the Cache type: a kvp_cache over a pool of KV blocks, its request lifecycle,
 * lookups, keys, statistics and metrics, each call made with the GIL released.
 *
 * Layout: CacheObject (kvpy.h) holds the kvp_cache (NULL once closed), a cache closed while
 * calls were in flight (doomed, freed by the last of them), the count of those calls, the
 * block table lock, the event callable and the configuration, read-only after construction.
 *
 * Threading. The library is thread-safe (a reader/writer lock per cache: lookups in
 * parallel, mutations one at a time; include/kvprefix.h), so the binding adds no lock
 * around library calls: every call on a cache releases the GIL around the library call and
 * threads run their calls concurrently. One exception: request_blocks copies the library's
 * block table after kvp_request_blocks returns, and the table is freed by the next grow or
 * release of that request, so those calls and the copy share a small per-cache table lock
 * (taken without the GIL; nothing else waits inside it), lest a racing Python program read
 * freed memory. Nothing touches a Python object while the GIL is released: token buffers
 * stay exported (Py_buffer), namespaces are immutable, keys are converted before. Lock order
 * is GIL -> (released) -> the library's lock, and no Python code runs under the library's
 * lock, so the two cannot deadlock. Closing a cache while other threads are inside calls on
 * it is safe: each call counts itself in flight (under the GIL) and the last one out frees a
 * cache closed meanwhile. Cache(single_threaded=True) makes the library skip its lock; the
 * binding then keeps the GIL during each call, so the GIL serialises them as the library
 * requires. Events: events.c.
 *
 * Invariants: n_inflight counts the calls between kvpy_cache_enter and kvpy_cache_leave, and
 * the Hashers of Cache.hasher() inside theirs; doomed is non-NULL only while n_inflight > 0;
 * every library error is raised by finish() (kvpy_raise) before the call's events are
 * delivered.
 *
 * Cost: per call, the argument table (args.c), one GIL release and re-acquire, and the
 * result's Python objects; docs/python.md has the measured figures.
 */
#include <string.h>

#include "kvpy.h"

/* ---------------------------------------------------------------------------------------- */
/* Calls: in-flight counting, the table lock, the GIL                                        */
/* ---------------------------------------------------------------------------------------- */

/* The block table lock, taken without the GIL (see blocks_copy_nogil); a single-threaded
 * cache's calls keep the GIL, which orders them already. Cannot fail. */
static void table_lock(CacheObject *self)
{
    if (!self->single_threaded)
        PyThread_acquire_lock(self->table_lock, WAIT_LOCK);
}

static void table_unlock(CacheObject *self)
{
    if (!self->single_threaded)
        PyThread_release_lock(self->table_lock);
}

kvp_cache *kvpy_cache_enter(CacheObject *self)
{
    if (self->cache != NULL)
        self->n_inflight++;
    return self->cache;
}

void kvpy_cache_leave(CacheObject *self)
{
    if (--self->n_inflight == 0 && self->doomed != NULL) {
        kvp_cache *c = self->doomed;
        self->doomed = NULL;
        kvp_cache_free(c);
    }
}

PyObject *kvpy_raise_closed(void)
{
    PyErr_SetString(PyExc_ValueError, "the cache is closed");
    return NULL;
}

/* The result of a library call: rc, the events it produced, and result (new reference,
 * stolen; used when rc is KVP_OK). Raises for rc < 0 or a closed cache (rc == 1). */
static PyObject *finish(CacheObject *self, int rc, const char *fn, evbatch *b, PyObject *result)
{
    if (rc != KVP_OK) {
        Py_XDECREF(result);
        result = NULL;
        if (rc == 1)
            kvpy_raise_closed();
        else
            kvpy_raise(rc, fn);
    }
    return kvpy_events_deliver(self, b, result);
}

#define CALL KVPY_CALL /* kvpy.h */

PyObject *kvpy_finish(CacheObject *self, int rc, const char *fn, evbatch *b, PyObject *result)
{
    return finish(self, rc, fn, b, result);
}

/* ---------------------------------------------------------------------------------------- */
/* Construction and lifetime                                                                */
/* ---------------------------------------------------------------------------------------- */

void kvpy_wipe(void *p, size_t n)
{
    volatile unsigned char *v = p;
    while (n-- > 0)
        *v++ = 0;
}

int kvpy_hash_cfg_fill(kvp_config *cfg, PyObject *key, PyObject *vllm_seed, const char *fn,
                       const char *key_arg)
{
    if (key != Py_None) {
        Py_buffer v;
        if (PyObject_GetBuffer(key, &v, PyBUF_SIMPLE) != 0)
            return -1;
        bool ok = v.len >= (Py_ssize_t)KVP_HASH_KEY_MIN && v.len <= (Py_ssize_t)KVP_HASH_KEY_MAX;
        if (ok) {
            memcpy(cfg->hash_key, v.buf, (size_t)v.len);
            cfg->hash_key_len = (uint32_t)v.len;
        }
        PyBuffer_Release(&v);
        if (!ok) {
            kvpy_arg_error(NULL, fn, key_arg, ": %u to %u bytes are needed", KVP_HASH_KEY_MIN,
                           KVP_HASH_KEY_MAX);
            return -1;
        }
    }
    if (vllm_seed != Py_None) {
        Py_ssize_t n;
        const char *str =
            PyUnicode_Check(vllm_seed) ? PyUnicode_AsUTF8AndSize(vllm_seed, &n) : NULL;
        if (str == NULL) {
            if (!PyErr_Occurred())
                kvpy_arg_error(PyExc_TypeError, fn, "vllm_seed", ": a str or None, got %.80s",
                               Py_TYPE(vllm_seed)->tp_name);
            return -1;
        }
        if (strlen(str) != (size_t)n) {
            kvpy_arg_error(NULL, fn, "vllm_seed", ": contains a NUL character");
            return -1;
        }
        cfg->vllm_seed = str;
    }
    return 0;
}

static const kvpy_sig new_sig = {
    "Cache",
    {{"n_blocks", KVPY_U32, 0, 0},
     {"block_size", KVPY_U32, KVPY_OPT, 16},
     {"seed", KVPY_U64, KVPY_KWONLY, KVP_DEFAULT_SEED},
     {"verify_tokens", KVPY_BOOL, KVPY_KWONLY, 0},
     {"on_event", KVPY_OBJECT, KVPY_KWONLY, 0},
     {"hash_profile", KVPY_PROFILE, KVPY_KWONLY, KVP_HASH_KEYED},
     {"hash_key", KVPY_OBJECT, KVPY_KWONLY, 0},
     {"vllm_seed", KVPY_OBJECT, KVPY_KWONLY, 0},
     {"vocab_size", KVPY_U32, KVPY_KWONLY, 0},
     {"ns_quota", KVPY_U32, KVPY_KWONLY, 0},
     {"single_threaded", KVPY_BOOL, KVPY_KWONLY, 0},
     {"quota_scope", KVPY_SCOPE, KVPY_KWONLY, KVP_QUOTA_SCOPE_NAMESPACE},
     {"eviction", KVPY_EVICTION, KVPY_KWONLY, KVP_EVICT_LRU},
     {"slru_protected_pct", KVPY_U32, KVPY_KWONLY, 80},
     {"s3fifo_small_pct", KVPY_U32, KVPY_KWONLY, 10},
     {"s3fifo_ghost_pct", KVPY_U32, KVPY_KWONLY, 100},
     {"cdecay_tau", KVPY_U32, KVPY_KWONLY, 0},
     {"cdecay_ghost_pct", KVPY_U32, KVPY_KWONLY, 0},
     {"count_orphans", KVPY_BOOL, KVPY_KWONLY, 0},
     {"block_bytes", KVPY_U64, KVPY_KWONLY, 0}}};

/* Steps: 1. convert and check the arguments; 2. allocate the object and its table lock;
 * 3. create the library cache (its failure frees the object); 4. record the configuration,
 * which cannot fail. */
static PyObject *Cache_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    /* Step 1: the arguments, into a kvp_config. */
    kvpy_args a;
    if (kvpy_parse_tuple(&new_sig, args, kw, &a) != 0)
        return NULL;
    PyObject *on_event = a.v[4].obj;
    if (on_event != Py_None && !PyCallable_Check(on_event)) {
        kvpy_arg_error(PyExc_TypeError, "Cache", "on_event", ": a callable or None, got %.80s",
                       Py_TYPE(on_event)->tp_name);
        return NULL;
    }
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = (uint32_t)a.v[0].u64;
    cfg.block_size = (uint32_t)a.v[1].u64;
    cfg.seed = a.v[2].u64;
    cfg.verify_tokens = a.v[3].flag;
    cfg.hash_profile = a.v[5].profile;
    cfg.vocab_size = (uint32_t)a.v[8].u64;
    cfg.ns_quota = (uint32_t)a.v[9].u64;
    cfg.single_threaded = a.v[10].flag;
    cfg.quota_scope = (uint8_t)a.v[11].scope;
    cfg.eviction = a.v[12].profile;
    cfg.slru_protected_pct = (uint32_t)a.v[13].u64;
    cfg.s3fifo_small_pct = (uint32_t)a.v[14].u64;
    cfg.s3fifo_ghost_pct = (uint32_t)a.v[15].u64;
    cfg.cdecay_tau = (uint32_t)a.v[16].u64;
    cfg.cdecay_ghost_pct = (uint32_t)a.v[17].u64;
    cfg.count_orphans = a.v[18].flag;
    cfg.block_bytes = a.v[19].u64;
    if (kvpy_hash_cfg_fill(&cfg, a.v[6].obj, a.v[7].obj, "Cache", "hash_key") != 0) {
        kvpy_wipe(cfg.hash_key, sizeof cfg.hash_key);
        return NULL;
    }
    /* Step 2: the object. */
    CacheObject *self = (CacheObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        kvpy_wipe(cfg.hash_key, sizeof cfg.hash_key);
        return NULL;
    }
    if ((self->table_lock = PyThread_allocate_lock()) == NULL) {
        kvpy_wipe(cfg.hash_key, sizeof cfg.hash_key);
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    if (on_event != Py_None) {
        self->on_event = Py_NewRef(on_event);
        cfg.on_event = kvpy_event_collect;
        cfg.event_ud = self;
    }
    /* Step 3: the library cache. */
    int rc = kvp_cache_new(&cfg, &self->cache);
    kvpy_wipe(cfg.hash_key, sizeof cfg.hash_key);
    if (rc != KVP_OK) {
        Py_DECREF(self);
        return kvpy_raise(rc, "kvp_cache_new");
    }
    /* Step 4: the configuration. */
    self->n_blocks = cfg.n_blocks;
    self->block_size = cfg.block_size;
    self->seed = cfg.seed;
    self->verify_tokens = cfg.verify_tokens;
    self->single_threaded = cfg.single_threaded;
    self->hash_profile = cfg.hash_profile;
    self->vocab_size = cfg.vocab_size;
    self->ns_quota = cfg.ns_quota;
    self->quota_scope = cfg.quota_scope;
    self->eviction = cfg.eviction;
    return (PyObject *)self;
}

static int Cache_traverse(CacheObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->on_event);
    Py_VISIT(self->tier_media);
    return 0;
}

static int Cache_clear(CacheObject *self)
{
    Py_CLEAR(self->on_event);
    Py_CLEAR(self->tier_media);
    return 0;
}

/* No call can be in flight here: each holds a reference to self. */
static void Cache_dealloc(CacheObject *self)
{
    PyObject_GC_UnTrack(self);
    kvp_cache_free(self->cache); /* emits no events */
    kvp_cache_free(self->doomed);
    if (self->table_lock != NULL)
        PyThread_free_lock(self->table_lock);
    Cache_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Close now; a cache still used by calls of other threads (a Hasher from Cache.hasher()
 * included) is freed by the last of them. Idempotent. */
static PyObject *Cache_close(CacheObject *self, PyObject *unused)
{
    kvp_cache *c = self->cache;
    self->cache = NULL;
    if (c != NULL && self->n_inflight > 0)
        self->doomed = c;
    else
        kvp_cache_free(c);
    Py_RETURN_NONE;
}

static PyObject *Cache_enter(CacheObject *self, PyObject *unused)
{
    return Py_NewRef(self);
}

static const kvpy_sig exit_sig = {"__exit__",
                                  {{"exc_type", KVPY_OBJECT, 0, 0},
                                   {"exc_value", KVPY_OBJECT, 0, 0},
                                   {"traceback", KVPY_OBJECT, 0, 0}}};

static PyObject *Cache_exit(CacheObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    kvpy_args a;
    if (kvpy_parse(&exit_sig, args, nargs, NULL, &a) != 0)
        return NULL;
    return Cache_close(self, NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* The request lifecycle                                                                    */
/* ---------------------------------------------------------------------------------------- */

PyObject *kvpy_cache_acquire(CacheObject *self, uint64_t req_id, const kvp_namespace *ns,
                             const tokens *t, size_t capacity)
{
    kvp_match m;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = kvp_acquire(kc, req_id, ns, t->ptr, t->n, capacity, &m));
    return finish(self, rc, "kvp_acquire", &b, rc == KVP_OK ? kvpy_match_to_py(&m, NULL) : NULL);
}

PyObject *kvpy_cache_grow(CacheObject *self, uint64_t req_id, size_t capacity)
{
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, (table_lock(self), rc = kvp_grow(kc, req_id, capacity), table_unlock(self)));
    return finish(self, rc, "kvp_grow", &b, Py_NewRef(Py_None));
}

/* A PyMem_Raw copy of request req_id's block table into *copy (NULL when out of memory)
 * and its length, without the GIL. The library's array stays valid only until the next
 * grow or release of the request, which another thread may make as soon as
 * kvp_request_blocks returns (a racing Python program must not make this read freed
 * memory), so the copy is made under the cache's table lock, which grow, release and
 * release_all also take. Returns kvp_request_blocks's code. */
static int blocks_copy_nogil(CacheObject *self, kvp_cache *kc, uint64_t req_id, uint32_t **copy,
                             size_t *n)
{
    const uint32_t *ids;
    table_lock(self);
    int rc = kvp_request_blocks(kc, req_id, &ids, n);
    if (rc == KVP_OK && (*copy = PyMem_RawMalloc(*n * sizeof **copy + 4)) != NULL)
        memcpy(*copy, ids, *n * sizeof **copy);
    table_unlock(self);
    return rc;
}

PyObject *kvpy_cache_blocks(CacheObject *self, uint64_t req_id)
{
    uint32_t *copy = NULL;
    size_t n = 0;
    evbatch b;
    int rc = 0;
    /* The list is built after the copy, with the GIL. */
    CALL(self, b, rc, rc = blocks_copy_nogil(self, kc, req_id, &copy, &n));
    PyObject *list = NULL;
    if (rc == KVP_OK)
        list = copy ? kvpy_u32_to_list(copy, n) : PyErr_NoMemory();
    PyMem_RawFree(copy);
    if (rc == KVP_OK && list == NULL)
        return kvpy_events_deliver(self, &b, NULL);
    return finish(self, rc, "kvp_request_blocks", &b, list);
}

PyObject *kvpy_cache_commit(CacheObject *self, uint64_t req_id, const tokens *t)
{
    size_t n_stored = 0;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = kvp_commit(kc, req_id, t->ptr, t->n, &n_stored));
    return finish(self, rc, "kvp_commit", &b, rc == KVP_OK ? PyLong_FromSize_t(n_stored) : NULL);
}

PyObject *kvpy_cache_release(CacheObject *self, uint64_t req_id)
{
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, (table_lock(self), rc = kvp_release(kc, req_id), table_unlock(self)));
    return finish(self, rc, "kvp_release", &b, Py_NewRef(Py_None));
}

static const kvpy_sig lookup_sig = {"lookup",
                                    {{"ns", KVPY_NS, 0, 0}, {"tokens", KVPY_TOKENS, 0, 0}}};

static PyObject *Cache_lookup(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&lookup_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    const kvp_namespace *ns = a.v[0].ns;
    const tokens *t = &a.v[1].tokens;
    size_t cap = t->n / self->block_size;
    uint32_t *ids = PyMem_Malloc(cap * sizeof *ids + 4);
    if (ids == NULL) {
        kvpy_args_done(&a);
        return PyErr_NoMemory();
    }
    kvp_match m;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = kvp_lookup(kc, ns, t->ptr, t->n, ids, cap, &m));
    kvpy_args_done(&a);
    PyObject *res = NULL;
    if (rc == KVP_OK) {
        PyObject *list = kvpy_u32_to_list(ids, m.n_blocks_hit < cap ? m.n_blocks_hit : cap);
        res = list ? kvpy_match_to_py(&m, list) : NULL;
    }
    PyMem_Free(ids);
    if (rc == KVP_OK && res == NULL)
        return kvpy_events_deliver(self, &b, NULL);
    return finish(self, rc, "kvp_lookup", &b, res);
}

static const kvpy_sig acquire_sig = {"acquire",
                                     {{"req_id", KVPY_U64, 0, 0},
                                      {"ns", KVPY_NS, 0, 0},
                                      {"tokens", KVPY_TOKENS, 0, 0},
                                      {"capacity", KVPY_SIZE, KVPY_OPT, 0}}};

static PyObject *Cache_acquire(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&acquire_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    PyObject *res = kvpy_cache_acquire(self, a.v[0].u64, a.v[1].ns, &a.v[2].tokens, a.v[3].size);
    kvpy_args_done(&a);
    return res;
}

/* The sig of request(): acquire's, but ns and tokens are kept as given until the request is
 * entered (request.c). */
static const kvpy_sig request_sig = {"request",
                                     {{"req_id", KVPY_U64, 0, 0},
                                      {"ns", KVPY_OBJECT, 0, 0},
                                      {"tokens", KVPY_OBJECT, 0, 0},
                                      {"capacity", KVPY_SIZE, KVPY_OPT, 0}}};

static PyObject *Cache_request(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&request_sig, args, nargs, kwnames, &a) != 0 ||
        kvpy_ns(a.v[1].obj, "request", "ns") == NULL)
        return NULL;
    return kvpy_request_new(self, a.v[0].u64, a.v[1].obj, a.v[2].obj, a.v[3].size);
}

static const kvpy_sig grow_sig = {"grow",
                                  {{"req_id", KVPY_U64, 0, 0}, {"capacity", KVPY_SIZE, 0, 0}}};

static PyObject *Cache_grow(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&grow_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    return kvpy_cache_grow(self, a.v[0].u64, a.v[1].size);
}

static const kvpy_sig request_blocks_sig = {"request_blocks", {{"req_id", KVPY_U64, 0, 0}}};

static PyObject *Cache_request_blocks(CacheObject *self, PyObject *arg)
{
    kvpy_value v;
    if (kvpy_convert(&request_blocks_sig, 0, arg, &v) != 0)
        return NULL;
    return kvpy_cache_blocks(self, v.u64);
}

static const kvpy_sig commit_sig = {"commit",
                                    {{"req_id", KVPY_U64, 0, 0}, {"tokens", KVPY_TOKENS, 0, 0}}};

static PyObject *Cache_commit(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&commit_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    PyObject *res = kvpy_cache_commit(self, a.v[0].u64, &a.v[1].tokens);
    kvpy_args_done(&a);
    return res;
}

static const kvpy_sig release_sig = {"release", {{"req_id", KVPY_U64, 0, 0}}};

static PyObject *Cache_release(CacheObject *self, PyObject *arg)
{
    kvpy_value v;
    if (kvpy_convert(&release_sig, 0, arg, &v) != 0)
        return NULL;
    return kvpy_cache_release(self, v.u64);
}

static const kvpy_sig access_sig = {"access",
                                    {{"ns", KVPY_NS, 0, 0},
                                     {"tokens", KVPY_TOKENS, 0, 0},
                                     {"retention", KVPY_OBJECT, KVPY_KWONLY | KVPY_NONE, 0}}};

static PyObject *Cache_access(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&access_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    const tokens *t = &a.v[1].tokens;
    kvp_retention r;
    kvp_retention_range ranges[KVP_RETENTION_MAX_RANGES];
    if (a.given[2] && kvpy_retention_get(a.v[2].obj, &r, ranges, "access") != 0) {
        kvpy_args_done(&a);
        return NULL;
    }
    kvp_match m;
    evbatch b;
    int rc = 0;
    if (a.given[2])
        CALL(self, b, rc, rc = kvp_access_retained(kc, a.v[0].ns, t->ptr, t->n, &r, &m));
    else
        CALL(self, b, rc, rc = kvp_access(kc, a.v[0].ns, t->ptr, t->n, &m));
    kvpy_args_done(&a);
    return finish(self, rc, "kvp_access", &b, rc == KVP_OK ? kvpy_match_to_py(&m, NULL) : NULL);
}

static const kvpy_sig lookup_ids_sig = {"lookup_ids",
                                        {{"ns", KVPY_NS, 0, 0},
                                         {"ids", KVPY_KEYS, 0, 0},
                                         {"n_tokens", KVPY_SIZE, KVPY_OPT | KVPY_NONE, 0}}};
static const kvpy_sig access_ids_sig = {"access_ids",
                                        {{"ns", KVPY_NS, 0, 0},
                                         {"ids", KVPY_KEYS, 0, 0},
                                         {"n_tokens", KVPY_SIZE, KVPY_OPT | KVPY_NONE, 0},
                                         {"retention", KVPY_OBJECT, KVPY_KWONLY | KVPY_NONE, 0}}};

/* Shared by lookup_ids (lookup true) and access_ids. */
static PyObject *ids_call(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames, bool lookup)
{
    kvpy_args a;
    if (kvpy_parse(lookup ? &lookup_ids_sig : &access_ids_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    const kvp_namespace *ns = a.v[0].ns;
    const keylist *kl = &a.v[1].keys;
    size_t n_tokens = a.given[2] ? a.v[2].size : kl->n * self->block_size;
    kvp_retention r;
    kvp_retention_range ranges[KVP_RETENTION_MAX_RANGES];
    bool retained = !lookup && a.given[3];
    if (retained && kvpy_retention_get(a.v[3].obj, &r, ranges, "access_ids") != 0) {
        kvpy_args_done(&a);
        return NULL;
    }
    uint32_t *ids = lookup ? PyMem_Malloc(kl->n * sizeof *ids + 4) : NULL;
    if (lookup && ids == NULL) {
        kvpy_args_done(&a);
        return PyErr_NoMemory();
    }
    kvp_match m;
    evbatch b;
    int rc = 0;
    if (lookup)
        CALL(self, b, rc, rc = kvp_lookup_ids(kc, ns, kl->keys, kl->n, n_tokens, ids, kl->n, &m));
    else if (retained)
        CALL(self, b, rc, rc = kvp_access_ids_retained(kc, ns, kl->keys, kl->n, n_tokens, &r, &m));
    else
        CALL(self, b, rc, rc = kvp_access_ids(kc, ns, kl->keys, kl->n, n_tokens, &m));
    kvpy_args_done(&a);
    PyObject *res = NULL;
    if (rc == KVP_OK) {
        PyObject *list = lookup ? kvpy_u32_to_list(ids, m.n_blocks_hit) : NULL;
        res = (!lookup || list) ? kvpy_match_to_py(&m, list) : NULL;
    }
    PyMem_Free(ids);
    if (rc == KVP_OK && res == NULL)
        return kvpy_events_deliver(self, &b, NULL);
    return finish(self, rc, lookup ? "kvp_lookup_ids" : "kvp_access_ids", &b, res);
}

static PyObject *Cache_lookup_ids(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    return ids_call(self, args, nargs, kwnames, true);
}

static PyObject *Cache_access_ids(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    return ids_call(self, args, nargs, kwnames, false);
}

/* ---------------------------------------------------------------------------------------- */
/* Keys and the *_keys forms                                                                */
/* ---------------------------------------------------------------------------------------- */

/* kvp_cache_keys for ns and t into *root and a new PyMem_Raw array *keys of *n keys
 * (keys may be NULL when want_keys is false). The call takes no lock, so the GIL is released
 * even on a single-threaded cache. Returns the library's code, 1 when the cache is closed,
 * or 2 when out of memory (no exception set in any case). */
static int cache_keys_nogil(CacheObject *self, const kvp_namespace *ns, const tokens *t,
                            bool want_keys, kvp_key *root, kvp_key **keys, size_t *n)
{
    static const uint32_t none[1] = {0};
    size_t cap = want_keys ? t->n / self->block_size : 0;
    *keys = PyMem_RawMalloc(cap * sizeof **keys + sizeof **keys);
    *n = 0;
    if (*keys == NULL)
        return 2;
    kvp_cache *kc = kvpy_cache_enter(self);
    if (kc == NULL)
        return 1;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc =
        kvp_cache_keys(kc, ns, t->n ? t->ptr : none, t->n, root, *keys, cap, n);
    Py_END_ALLOW_THREADS kvpy_cache_leave(self);
    return rc;
}

/* Raise for a non-OK code of cache_keys_nogil. Returns NULL. */
static PyObject *raise_keys(int rc)
{
    if (rc == 1)
        return kvpy_raise_closed();
    if (rc == 2)
        return PyErr_NoMemory();
    return kvpy_raise(rc, "kvp_cache_keys");
}

/* (root, keys) of ns and t: keys a list of ints, or bytes (16 per key) when raw. */
static PyObject *keys_pair(CacheObject *self, const kvp_namespace *ns, const tokens *t, bool raw)
{
    kvp_key root, *keys;
    size_t n;
    int rc = cache_keys_nogil(self, ns, t, true, &root, &keys, &n);
    PyObject *res = NULL;
    if (rc != KVP_OK)
        raise_keys(rc);
    else if (raw)
        res = Py_BuildValue("(Ny#)", kvpy_key_to_int(root), (const char *)keys,
                            (Py_ssize_t)(n * sizeof *keys));
    else
        res = Py_BuildValue("(NN)", kvpy_key_to_int(root), kvpy_keys_to_list(keys, n));
    PyMem_RawFree(keys);
    return res;
}

static const kvpy_sig keys_sig = {
    "keys",
    {{"ns", KVPY_NS, 0, 0}, {"tokens", KVPY_TOKENS, 0, 0}, {"raw", KVPY_BOOL, KVPY_KWONLY, 0}}};

static PyObject *Cache_keys(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&keys_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    PyObject *res = keys_pair(self, a.v[0].ns, &a.v[1].tokens, a.v[2].flag);
    kvpy_args_done(&a);
    return res;
}

static const kvpy_sig hash_blocks_sig = {"hash_blocks",
                                         {{"ns", KVPY_NS, 0, 0}, {"tokens", KVPY_TOKENS, 0, 0}}};

static PyObject *Cache_hash_blocks(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&hash_blocks_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    PyObject *pair = keys_pair(self, a.v[0].ns, &a.v[1].tokens, false);
    kvpy_args_done(&a);
    if (pair == NULL)
        return NULL;
    PyObject *keys = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
    Py_DECREF(pair);
    return keys;
}

static const kvpy_sig namespace_key_sig = {"namespace_key", {{"ns", KVPY_NS, 0, 0}}};

static PyObject *Cache_namespace_key(CacheObject *self, PyObject *arg)
{
    kvpy_value v;
    if (kvpy_convert(&namespace_key_sig, 0, arg, &v) != 0)
        return NULL;
    tokens t;
    memset(&t, 0, sizeof t);
    kvp_key root, *keys;
    size_t n;
    int rc = cache_keys_nogil(self, v.ns, &t, false, &root, &keys, &n);
    PyMem_RawFree(keys);
    return rc == KVP_OK ? kvpy_key_to_int(root) : raise_keys(rc);
}

/* Parse a *_keys call by sig into *a, and the prompt length it covers into *n_tokens:
 * n_tokens when given (it must equal len(tokens) when tokens are given), else len(tokens),
 * else len(keys) * block_size; when keys are given, there must be one per full block, since
 * the library reads n_tokens / block_size keys. i_keys, i_tok and i_nt are the parameters'
 * indices in sig (i_nt -1: no n_tokens). Returns 0 (release a with kvpy_args_done), or -1
 * with an exception set and nothing held. */
static int keys_parse(const CacheObject *self, const kvpy_sig *sig, PyObject *const *args,
                      Py_ssize_t nargs, PyObject *kwnames, int i_keys, int i_tok, int i_nt,
                      kvpy_args *a, size_t *n_tokens)
{
    if (kvpy_parse(sig, args, nargs, kwnames, a) != 0)
        return -1;
    const keylist *kl = &a->v[i_keys].keys;
    const tokens *t = &a->v[i_tok].tokens;
    bool has_tokens = a->given[i_tok];
    *n_tokens = has_tokens ? t->n : kl->n * self->block_size;
    if (i_nt >= 0 && a->given[i_nt]) {
        if (has_tokens && a->v[i_nt].size != t->n) {
            kvpy_arg_error(NULL, sig->name, "n_tokens", ": %zu differs from len(tokens) %zu",
                           a->v[i_nt].size, t->n);
            goto fail;
        }
        *n_tokens = a->v[i_nt].size;
    }
    if (a->given[i_keys] && kl->n != *n_tokens / self->block_size) {
        kvpy_arg_error(NULL, sig->name, "keys", ": %zu given, but %zu tokens have %zu full blocks",
                       kl->n, *n_tokens, *n_tokens / self->block_size);
        goto fail;
    }
    return 0;
fail:
    kvpy_args_done(a);
    return -1;
}

static const kvpy_sig lookup_keys_sig = {"lookup_keys",
                                         {{"ns", KVPY_NS, 0, 0},
                                          {"root", KVPY_KEY, 0, 0},
                                          {"keys", KVPY_KEYS, 0, 0},
                                          {"tokens", KVPY_TOKENS, KVPY_OPT | KVPY_NONE, 0},
                                          {"n_tokens", KVPY_SIZE, KVPY_KWONLY | KVPY_NONE, 0}}};

static PyObject *Cache_lookup_keys(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    kvpy_args a;
    size_t n_tokens;
    if (keys_parse(self, &lookup_keys_sig, args, nargs, kwnames, 2, 3, 4, &a, &n_tokens) != 0)
        return NULL;
    const keylist *kl = &a.v[2].keys;
    const uint32_t *tp = a.given[3] ? a.v[3].tokens.ptr : NULL;
    uint32_t *ids = PyMem_Malloc(kl->n * sizeof *ids + 4);
    if (ids == NULL) {
        kvpy_args_done(&a);
        return PyErr_NoMemory();
    }
    kvp_match m;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc,
         rc = kvp_lookup_keys(kc, a.v[0].ns, a.v[1].key, kl->keys, tp, n_tokens, ids, kl->n, &m));
    size_t cap = kl->n;
    kvpy_args_done(&a);
    PyObject *res = NULL;
    if (rc == KVP_OK) {
        PyObject *list = kvpy_u32_to_list(ids, m.n_blocks_hit < cap ? m.n_blocks_hit : cap);
        res = list ? kvpy_match_to_py(&m, list) : NULL;
    }
    PyMem_Free(ids);
    if (rc == KVP_OK && res == NULL)
        return kvpy_events_deliver(self, &b, NULL);
    return finish(self, rc, "kvp_lookup_keys", &b, res);
}

static const kvpy_sig acquire_keys_sig = {"acquire_keys",
                                          {{"req_id", KVPY_U64, 0, 0},
                                           {"ns", KVPY_NS, 0, 0},
                                           {"root", KVPY_KEY, 0, 0},
                                           {"keys", KVPY_KEYS, 0, 0},
                                           {"tokens", KVPY_TOKENS, KVPY_OPT | KVPY_NONE, 0},
                                           {"capacity", KVPY_SIZE, KVPY_OPT, 0},
                                           {"n_tokens", KVPY_SIZE, KVPY_KWONLY | KVPY_NONE, 0}}};

static PyObject *Cache_acquire_keys(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames)
{
    kvpy_args a;
    size_t n_tokens;
    if (keys_parse(self, &acquire_keys_sig, args, nargs, kwnames, 3, 4, 6, &a, &n_tokens) != 0)
        return NULL;
    const uint32_t *tp = a.given[4] ? a.v[4].tokens.ptr : NULL;
    kvp_match m;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc,
         rc = kvp_acquire_keys(kc, a.v[0].u64, a.v[1].ns, a.v[2].key, a.v[3].keys.keys, tp,
                               n_tokens, a.v[5].size, &m));
    kvpy_args_done(&a);
    return finish(self, rc, "kvp_acquire_keys", &b,
                  rc == KVP_OK ? kvpy_match_to_py(&m, NULL) : NULL);
}

static const kvpy_sig access_keys_sig = {"access_keys",
                                         {{"ns", KVPY_NS, 0, 0},
                                          {"root", KVPY_KEY, 0, 0},
                                          {"keys", KVPY_KEYS, 0, 0},
                                          {"tokens", KVPY_TOKENS, KVPY_OPT | KVPY_NONE, 0},
                                          {"n_tokens", KVPY_SIZE, KVPY_KWONLY | KVPY_NONE, 0}}};

static PyObject *Cache_access_keys(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    kvpy_args a;
    size_t n_tokens;
    if (keys_parse(self, &access_keys_sig, args, nargs, kwnames, 2, 3, 4, &a, &n_tokens) != 0)
        return NULL;
    const uint32_t *tp = a.given[3] ? a.v[3].tokens.ptr : NULL;
    kvp_match m;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc,
         rc = kvp_access_keys(kc, a.v[0].ns, a.v[1].key, a.v[2].keys.keys, tp, n_tokens, &m));
    kvpy_args_done(&a);
    return finish(self, rc, "kvp_access_keys", &b,
                  rc == KVP_OK ? kvpy_match_to_py(&m, NULL) : NULL);
}

static const kvpy_sig commit_keys_sig = {
    "commit_keys",
    {{"req_id", KVPY_U64, 0, 0}, {"keys", KVPY_KEYS, KVPY_NONE, 0}, {"tokens", KVPY_TOKENS, 0, 0}}};

static PyObject *Cache_commit_keys(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    kvpy_args a;
    size_t n_tokens;
    if (keys_parse(self, &commit_keys_sig, args, nargs, kwnames, 1, 2, -1, &a, &n_tokens) != 0)
        return NULL;
    const tokens *t = &a.v[2].tokens;
    size_t n_stored = 0;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc,
         rc = kvp_commit_keys(kc, a.v[0].u64, a.v[1].keys.keys, t->ptr, t->n, &n_stored));
    kvpy_args_done(&a);
    return finish(self, rc, "kvp_commit_keys", &b,
                  rc == KVP_OK ? PyLong_FromSize_t(n_stored) : NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* Maintenance, statistics, metrics                                                         */
/* ---------------------------------------------------------------------------------------- */

/* Every active request id into a new PyMem_Raw array (*ids, *n); the count is asked first
 * and asked again when requests started in between. Returns the library's code, or
 * KVP_ENOMEM. */
static int requests_nogil(kvp_cache *kc, uint64_t **ids, size_t *n)
{
    size_t cap = 0;
    *ids = NULL;
    for (;;) {
        int rc = kvp_cache_requests(kc, *ids, cap, n);
        if (rc != KVP_OK || *n <= cap)
            return rc;
        PyMem_RawFree(*ids);
        cap = *n + 16;
        if ((*ids = PyMem_RawMalloc(cap * sizeof **ids)) == NULL)
            return KVP_ENOMEM;
    }
}

static PyObject *Cache_requests(CacheObject *self, PyObject *unused)
{
    uint64_t *ids = NULL;
    size_t n = 0;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = requests_nogil(kc, &ids, &n));
    PyObject *list = rc == KVP_OK ? PyList_New((Py_ssize_t)n) : NULL;
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *x = PyLong_FromUnsignedLongLong(ids[i]);
        if (x == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, x);
    }
    PyMem_RawFree(ids);
    if (rc == KVP_OK && list == NULL)
        return kvpy_events_deliver(self, &b, NULL);
    return finish(self, rc, "kvp_cache_requests", &b, list);
}

static PyObject *Cache_release_all(CacheObject *self, PyObject *unused)
{
    size_t n = 0;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, (table_lock(self), rc = kvp_release_all(kc, &n), table_unlock(self)));
    return finish(self, rc, "kvp_release_all", &b, rc == KVP_OK ? PyLong_FromSize_t(n) : NULL);
}

static const kvpy_sig set_quota_sig = {
    "set_quota", {{"ns", KVPY_NS, 0, 0}, {"max_cached_blocks", KVPY_U32, KVPY_NONE, 0}}};

static PyObject *Cache_set_quota(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&set_quota_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    uint32_t n = a.given[1] ? (uint32_t)a.v[1].u64 : KVP_QUOTA_UNLIMITED;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = kvp_cache_set_quota(kc, a.v[0].ns, n));
    return finish(self, rc, "kvp_cache_set_quota", &b, Py_NewRef(Py_None));
}

static const kvpy_sig set_retention_sig = {
    "set_retention", {{"req_id", KVPY_U64, 0, 0}, {"retention", KVPY_OBJECT, 0, 0}}};

static PyObject *Cache_set_retention(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&set_retention_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    kvp_retention r;
    kvp_retention_range ranges[KVP_RETENTION_MAX_RANGES];
    int prc = kvpy_retention_get(a.v[1].obj, &r, ranges, "set_retention");
    uint64_t req_id = a.v[0].u64;
    kvpy_args_done(&a);
    if (prc != 0)
        return NULL;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = kvp_request_set_retention(kc, req_id, &r));
    return finish(self, rc, "kvp_request_set_retention", &b, Py_NewRef(Py_None));
}

static const kvpy_sig block_retention_sig = {"block_retention", {{"block_id", KVPY_U32, 0, 0}}};

static PyObject *Cache_block_retention(CacheObject *self, PyObject *arg)
{
    kvpy_value v;
    if (kvpy_convert(&block_retention_sig, 0, arg, &v) != 0)
        return NULL;
    int p = 0;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = kvp_block_retention(kc, (uint32_t)v.u64, &p));
    return finish(self, rc, "kvp_block_retention", &b, rc == KVP_OK ? PyLong_FromLong(p) : NULL);
}

static PyObject *Cache_reset(CacheObject *self, PyObject *unused)
{
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = kvp_cache_reset(kc));
    return finish(self, rc, "kvp_cache_reset", &b, Py_NewRef(Py_None));
}

static PyObject *Cache_check(CacheObject *self, PyObject *unused)
{
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = kvp_cache_check(kc));
    return finish(self, rc, "kvp_cache_check", &b, Py_NewRef(Py_None));
}

static PyObject *Cache_stats(CacheObject *self, PyObject *unused)
{
    kvp_stats s;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = kvp_cache_stats(kc, &s));
    return finish(self, rc, "kvp_cache_stats", &b, rc == KVP_OK ? kvpy_stats_to_py(&s) : NULL);
}

/* Caller labels for kvp_cache_metrics from a mapping or an iterable of (name, value) pairs
 * of str. *keep holds the objects the returned strings point into. Returns the array
 * (PyMem) or NULL: with an exception set, or without one when there are no labels. */
static kvp_label *labels_get(PyObject *obj, size_t *n, PyObject **keep)
{
    *n = 0;
    *keep = NULL;
    if (obj == Py_None)
        return NULL;
    PyObject *items = PyMapping_Check(obj) && !PySequence_Check(obj) ? PyMapping_Items(obj)
                                                                     : PySequence_List(obj);
    if (items == NULL)
        return NULL;
    Py_ssize_t len = PyList_GET_SIZE(items);
    kvp_label *l = PyMem_Malloc((size_t)len * sizeof *l + sizeof *l);
    if (l == NULL) {
        Py_DECREF(items);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *pair = PyList_GET_ITEM(items, i), *k, *v;
        Py_ssize_t nk, nv;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyUnicode_Check(k = PyTuple_GET_ITEM(pair, 0)) ||
            !PyUnicode_Check(v = PyTuple_GET_ITEM(pair, 1))) {
            kvpy_arg_error(PyExc_TypeError, "metrics", "labels",
                           ": a dict of str to str, or (str, str) pairs");
            goto fail;
        }
        if ((l[i].name = PyUnicode_AsUTF8AndSize(k, &nk)) == NULL ||
            (l[i].value = PyUnicode_AsUTF8AndSize(v, &nv)) == NULL)
            goto fail;
        if (strlen(l[i].name) != (size_t)nk || strlen(l[i].value) != (size_t)nv) {
            kvpy_arg_error(NULL, "metrics", "labels", ": %R contains a NUL character", pair);
            goto fail;
        }
    }
    *keep = items;
    *n = (size_t)len;
    return l;
fail:
    Py_DECREF(items);
    PyMem_Free(l);
    return NULL;
}

/* kvp_cache_metrics into a PyMem_Raw buffer, growing it as the library asks; runs without
 * the GIL. Returns the library's code; *out is the text on KVP_OK (NULL when out of memory,
 * reported as KVP_ENOMEM). */
static int metrics_nogil(kvp_cache *kc, const kvp_label *l, size_t n_l, char **out, size_t *len)
{
    size_t cap = 4096;
    *out = NULL;
    for (;;) {
        char *buf = PyMem_RawMalloc(cap);
        if (buf == NULL)
            return KVP_ENOMEM;
        size_t n = 0;
        int rc = kvp_cache_metrics(kc, l, n_l, buf, cap, &n);
        if (rc == KVP_OK) {
            *out = buf;
            *len = n;
            return rc;
        }
        PyMem_RawFree(buf);
        if (rc != KVP_ENOSPC)
            return rc;
        cap = n;
    }
}

static const kvpy_sig metrics_sig = {"metrics", {{"labels", KVPY_OBJECT, KVPY_OPT, 0}}};

static PyObject *Cache_metrics(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&metrics_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    size_t n_l;
    PyObject *keep;
    kvp_label *l = labels_get(a.v[0].obj, &n_l, &keep);
    if (l == NULL && PyErr_Occurred())
        return NULL;
    char *text = NULL;
    size_t len = 0;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = metrics_nogil(kc, l, n_l, &text, &len));
    PyMem_Free(l);
    Py_XDECREF(keep);
    PyObject *res = rc == KVP_OK ? PyUnicode_DecodeUTF8(text, (Py_ssize_t)len, "strict") : NULL;
    PyMem_RawFree(text);
    if (rc == KVP_OK && res == NULL)
        return kvpy_events_deliver(self, &b, NULL);
    return finish(self, rc, "kvp_cache_metrics", &b, res);
}

static PyObject *Cache_hasher(CacheObject *self, PyObject *unused)
{
    return kvpy_hasher_of_cache(self);
}

static PyObject *Cache_get(CacheObject *self, void *closure)
{
    switch ((intptr_t)closure) {
    case 0:
        return PyLong_FromUnsignedLong(self->n_blocks);
    case 1:
        return PyLong_FromUnsignedLong(self->block_size);
    case 2:
        return PyLong_FromUnsignedLongLong(self->seed);
    case 3:
        return PyBool_FromLong(self->verify_tokens);
    case 4:
        return Py_NewRef(self->on_event ? self->on_event : Py_None);
    case 6:
        return PyUnicode_FromString(kvp_hash_profile_name(self->hash_profile));
    case 7:
        return PyLong_FromUnsignedLong(self->vocab_size);
    case 8:
        return PyLong_FromUnsignedLong(self->ns_quota);
    case 9:
        return PyBool_FromLong(self->single_threaded);
    case 10:
        return PyUnicode_FromString(kvpy_scope_name(self->quota_scope));
    case 11:
        return PyUnicode_FromString(kvpy_eviction_name(self->eviction));
    default:
        return PyBool_FromLong(self->cache == NULL);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* The type                                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* The signatures of the methods without parameters. */
#define NOARGS_SIG(var, name) static const kvpy_sig var = {name, {{NULL, KVPY_OBJECT, 0, 0}}}
NOARGS_SIG(requests_sig, "requests");
NOARGS_SIG(release_all_sig, "release_all");
NOARGS_SIG(hasher_sig, "hasher");
NOARGS_SIG(reset_sig, "reset");
NOARGS_SIG(check_sig, "check");
NOARGS_SIG(stats_sig, "stats");
NOARGS_SIG(close_sig, "close");
NOARGS_SIG(enter_sig, "__enter__");

static const kvpy_def Cache_defs[] = {
    {&lookup_sig, KVPY_FN(Cache_lookup), KVPY_FASTKW,
     "The longest reusable cached prefix of tokens, a Match (read-only; kvp_lookup); "
     "Match.block_ids lists the reused block ids. Releases the GIL."},
    {&acquire_sig, KVPY_FN(Cache_acquire), KVPY_FASTKW,
     "Start a request: pin its cached prefix and allocate blocks for max(len(tokens), "
     "capacity) tokens (kvp_acquire). Returns a Match whose block_ids is None: see "
     "request_blocks. Releases the GIL."},
    {&request_sig, KVPY_FN(Cache_request), KVPY_FASTKW,
     "A Request for `with`: entering it acquires (as acquire(req_id, ns, tokens, capacity)), "
     "exiting releases, also when the body raises. Inside, req.match, req.blocks, "
     "req.commit(tokens) and req.grow(capacity)."},
    {&grow_sig, KVPY_FN(Cache_grow), KVPY_FASTKW,
     "Make the request hold blocks for capacity tokens (kvp_grow). Returns None."},
    {&request_blocks_sig, (PyCFunction)Cache_request_blocks, METH_O,
     "A copy of the request's block table, in token order: a list of int."},
    {&commit_sig, KVPY_FN(Cache_commit), KVPY_FASTKW,
     "Register the request's newly full blocks; tokens is its whole sequence so far. Returns "
     "the number of blocks newly indexed. Releases the GIL."},
    {&release_sig, (PyCFunction)Cache_release, METH_O,
     "End the request: unpin its blocks, tail first. Returns None."},
    {&access_sig, KVPY_FN(Cache_access), KVPY_FASTKW,
     "Lookup, cache every full block and release, in one call (replay and simulation). "
     "retention: a dict as set_retention takes, noted on the blocks at the release "
     "(kvp_access_retained). Returns a Match. Releases the GIL."},
    {&lookup_ids_sig, KVPY_FN(Cache_lookup_ids), KVPY_FASTKW,
     "lookup for precomputed block ids (ints of up to 128 bits, or a buffer of uint64 (lo, hi) "
     "pairs or of 16-byte keys); n_tokens defaults to len(ids) * block_size. Returns a Match."},
    {&access_ids_sig, KVPY_FN(Cache_access_ids), KVPY_FASTKW,
     "access for precomputed block ids (retention as access). Returns a Match."},
    {&keys_sig, KVPY_FN(Cache_keys), KVPY_FASTKW,
     "(root, keys): the namespace root and the keys of the full blocks of tokens, exactly as "
     "this cache computes them (its profile, key and block size; kvp_cache_keys), for the "
     "*_keys forms. Takes no lock and releases the GIL. raw=True returns the keys as bytes, "
     "16 per key (uint64 lo, hi), else as a list of int."},
    {&lookup_keys_sig, KVPY_FN(Cache_lookup_keys), KVPY_FASTKW,
     "lookup with keys from keys(): one per full block. tokens are required in "
     "collision-proof mode (they are verified); n_tokens defaults to len(tokens), else "
     "len(keys) * block_size. Returns a Match."},
    {&acquire_keys_sig, KVPY_FN(Cache_acquire_keys), KVPY_FASTKW,
     "acquire with keys from keys(). Returns a Match."},
    {&commit_keys_sig, KVPY_FN(Cache_commit_keys), KVPY_FASTKW,
     "commit with keys from keys() for the whole sequence (None: hash under the lock, as "
     "commit). Returns the number of blocks newly indexed."},
    {&access_keys_sig, KVPY_FN(Cache_access_keys), KVPY_FASTKW,
     "access with keys from keys(). Returns a Match."},
    {&requests_sig, (PyCFunction)Cache_requests, METH_NOARGS,
     "The ids of the active requests, a list of int in no particular order."},
    {&release_all_sig, (PyCFunction)Cache_release_all, METH_NOARGS,
     "Release every active request (e.g. a scheduler restarting); returns how many. "
     "Committed blocks stay cached."},
    {&set_quota_sig, KVPY_FN(Cache_set_quota), KVPY_FASTKW,
     "The namespace's quota of cached blocks (None: unlimited); needs Cache(ns_quota=...) != "
     "0. Evicts its excess now. Returns None."},
    {&hasher_sig, (PyCFunction)Cache_hasher, METH_NOARGS,
     "The cache's key function, a Hasher (kvp_cache_hasher), usable while the cache is open."},
    {&hash_blocks_sig, KVPY_FN(Cache_hash_blocks), KVPY_FASTKW,
     "keys(ns, tokens)[1]: the keys of the full blocks, a list of int."},
    {&namespace_key_sig, (PyCFunction)Cache_namespace_key, METH_O,
     "The namespace root key (an int) as this cache computes it."},
    {&set_retention_sig, KVPY_FN(Cache_set_retention), KVPY_FASTKW,
     "Give active request req_id retention priorities, applied at its release: a dict "
     "{'priority': 0..100 (default 35), 'duration': requests (0: never lapses), 'ranges': "
     "[(token_start, token_end, priority[, duration]), ...]} (kvp_request_set_retention). "
     "Returns None."},
    {&block_retention_sig, (PyCFunction)Cache_block_retention, METH_O,
     "The effective retention priority (0..100; 35 by default) of block block_id now."},
    {&reset_sig, (PyCFunction)Cache_reset, METH_NOARGS,
     "Drop every cached block that no request pins. Returns None."},
    {&check_sig, (PyCFunction)Cache_check, METH_NOARGS,
     "Run the invariant checker; raises CorruptError on a problem. Returns None."},
    {&stats_sig, (PyCFunction)Cache_stats, METH_NOARGS, "Counters and gauges: a Stats."},
    {&metrics_sig, KVPY_FN(Cache_metrics), KVPY_FASTKW,
     "The Prometheus text exposition (format 0.0.4) of the cache, a str; labels is a dict of "
     "str to str added to every sample."},
    {&close_sig, (PyCFunction)Cache_close, METH_NOARGS,
     "Free the cache now (idempotent); later calls raise ValueError."},
    {&kvpy_add_tier_sig, KVPY_FN(kvpy_cache_add_tier), KVPY_FASTKW,
     "Add a lower tier (host memory, disk, remote store) of n_blocks blocks named medium "
     "('CPU', 'DISK', ...) below the existing ones, before the first acquire "
     "(kvp_cache_add_tier). Returns its number, 1 for the first."},
    {&kvpy_acquire_tiers_sig, KVPY_FN(kvpy_cache_acquire_tiers), KVPY_FASTKW,
     "acquire, plus load orders for the blocks after the device hit that a lower tier holds "
     "(kvp_acquire_tiers): (Match, [TierOrder]). Load k goes into the request's block "
     "Match.n_blocks_hit + k; confirm each with tier_confirm, then commit as after prefill."},
    {&kvpy_tier_orders_sig, KVPY_FN(kvpy_cache_tier_orders), KVPY_FASTKW,
     "The store orders not handed out yet, oldest first (at most max): a list of TierOrder. "
     "Copy each device block to its tier block and confirm it with tier_confirm."},
    {&kvpy_tier_confirm_sig, KVPY_FN(kvpy_cache_tier_confirm), KVPY_FASTKW,
     "Answer an order: ok=True when the copy is complete (a stored block becomes hit-able), "
     "False when it failed or was cancelled (nothing changes). Returns None."},
    {&kvpy_lookup_tiers_sig, KVPY_FN(kvpy_cache_lookup_tiers), KVPY_FASTKW,
     "Where the longest prefix of tokens lives, block by block: a TierMatch (read-only; "
     "kvp_lookup_tiers)."},
    {&kvpy_tier_stats_sig, KVPY_FN(kvpy_cache_tier_stats), KVPY_FASTKW,
     "The counters of tier (a TierStats), or of every tier (a list, tier 0 first)."},
    {&enter_sig, (PyCFunction)Cache_enter, METH_NOARGS, "Returns the cache itself."},
    {&exit_sig, KVPY_FN(Cache_exit), METH_FASTCALL, "Closes the cache."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Cache_getset[] = {
    {"n_blocks", (getter)Cache_get, NULL, "Blocks in the pool.", (void *)0},
    {"block_size", (getter)Cache_get, NULL, "Tokens per block.", (void *)1},
    {"seed", (getter)Cache_get, NULL, "Hash seed.", (void *)2},
    {"verify_tokens", (getter)Cache_get, NULL, "Collision-proof mode.", (void *)3},
    {"on_event", (getter)Cache_get, NULL, "The event callable, or None.", (void *)4},
    {"closed", (getter)Cache_get, NULL, "True after close().", (void *)5},
    {"hash_profile", (getter)Cache_get, NULL, "The hash profile's name.", (void *)6},
    {"vocab_size", (getter)Cache_get, NULL, "Token ids must be below it; 0: unchecked.", (void *)7},
    {"ns_quota", (getter)Cache_get, NULL,
     "Default per-namespace quota of cached blocks; 0: quotas off.", (void *)8},
    {"single_threaded", (getter)Cache_get, NULL,
     "No library lock: calls keep the GIL, which serialises them.", (void *)9},
    {"quota_scope", (getter)Cache_get, NULL,
     "What one quota counts: 'namespace', 'tenant' (across its salts, adapters and models) or "
     "'model'.",
     (void *)10},
    {"eviction", (getter)Cache_get, NULL, "The eviction policy's name (lru, slru, s3fifo, cdecay).",
     (void *)11},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject kvpy_cache_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvprefix.Cache",
    .tp_basicsize = sizeof(CacheObject),
    .tp_dealloc = (destructor)Cache_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Cache_traverse,
    .tp_clear = (inquiry)Cache_clear,
    .tp_getset = Cache_getset,
    .tp_new = Cache_new,
};

int kvpy_cache_add(PyObject *m)
{
    kvpy_cache_type.tp_doc = kvpy_type_doc(
        &new_sig, "A prefix cache over a pool of n_blocks KV blocks (kvp_cache). Tokens are any\n"
                  "C-contiguous buffer of uint32 (used without copying) or a sequence of ints.\n"
                  "on_event(event) receives each Event after the call that caused it, on the\n"
                  "calling thread. Safe to share between threads: calls run concurrently with the\n"
                  "GIL released (lookups in parallel, mutations one at a time), unless\n"
                  "single_threaded=True, where calls keep the GIL and the library takes no lock.");
    kvpy_cache_type.tp_methods = kvpy_methods(Cache_defs, "$self");
    if (kvpy_cache_type.tp_doc == NULL || kvpy_cache_type.tp_methods == NULL ||
        PyType_Ready(&kvpy_cache_type) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "Cache", (PyObject *)&kvpy_cache_type);
}
