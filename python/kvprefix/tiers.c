/*
 * tiers.c - the lower tiers of a Cache (host memory, disk, remote store; kvp_cache_add_tier):
 * the methods add_tier, acquire_tiers, tier_orders, tier_confirm, lookup_tiers and
 * tier_stats, and their records TierOrder, TierMatch and TierStats.
 *
 * Each method is one library call made like cache.c's (KVPY_CALL: the GIL released, the
 * call's events collected and delivered after it). The media names of the tiers are kept in
 * the Cache (tier_media, a list of str, index tier - 1) so that an Event of a lower tier can
 * name its medium after the call without reading the library's memory (events.c).
 *
 * Invariants: tier_media is NULL until the first add_tier, then holds one str per tier
 * added, in order; a TierOrder is a plain copy (the cache keeps no reference to it).
 */
#include <string.h>

#include "kvpy.h"

static PyTypeObject *order_type;  /* TierOrder */
static PyTypeObject *match_type;  /* TierMatch */
static PyTypeObject *tstats_type; /* TierStats */

static PyStructSequence_Field order_fields[] = {
    {"id", "pass to tier_confirm"},
    {"kind", "ORDER_LOAD (tier -> device) or ORDER_STORE (device -> tier)"},
    {"tier", "the lower tier, 1 .. 3"},
    {"tier_block", "block id in that tier: the source of a load, the destination of a store"},
    {"device_block", "device block id: the destination of a load, the source of a store"},
    {"block_index", "the block's position in its request"},
    {"key", "the block key (int)"},
    {"req_id", "the acquiring request (load) or the committing one (store)"},
    {NULL, NULL},
};

static PyStructSequence_Field match_fields[] = {
    {"n_blocks_full", "full blocks in the prompt"},
    {"n_blocks_prefix", "longest run from the start found in some tier"},
    {"n_blocks_usable", "n_blocks_prefix capped so that one prompt token is computed"},
    {"blocks_per_tier", "blocks of the prefix found in each tier (a tuple, tier 0 first)"},
    {"where", "the tier of each block of the prefix (a list of int)"},
    {NULL, NULL},
};

static PyStructSequence_Field tstats_fields[] = {
    {"medium", "the tier's medium name ('GPU' for tier 0)"},
    {"n_blocks_total", "capacity"},
    {"n_blocks_ready", "confirmed, hit-able blocks"},
    {"n_blocks_pending", "blocks reserved by store orders not confirmed yet"},
    {"n_blocks_loading", "ready blocks read by load orders in flight"},
    {"n_hits", "blocks found (load orders issued); tier 0: Stats.n_blocks_hit"},
    {"n_loads", "load orders confirmed ok"},
    {"n_loads_failed", "load orders confirmed failed or cancelled"},
    {"n_stores", "store orders confirmed ok"},
    {"n_stores_failed", "store orders confirmed failed or cancelled"},
    {"n_stores_skipped", "committed blocks not written: the tier was pending or loading"},
    {"n_evictions", "ready blocks evicted for new stores"},
    {"n_bytes_loaded", "moved out of this tier by loads (blocks; bytes with block_bytes)"},
    {"n_bytes_stored", "moved into this tier by stores (blocks; bytes with block_bytes)"},
    {NULL, NULL},
};

static PyStructSequence_Desc order_desc = {
    "kvprefix.TierOrder", "One copy the engine must make (kvp_tier_order).", order_fields, 8};
static PyStructSequence_Desc match_desc = {
    "kvprefix.TierMatch", "Where the longest prefix lives (kvp_tier_match).", match_fields, 5};
static PyStructSequence_Desc tstats_desc = {
    "kvprefix.TierStats", "One tier's counters (kvp_tier_stats).", tstats_fields, 14};

/* Set o's n fields from v (stolen); o is freed and NULL returned if any is NULL. */
static PyObject *fill(PyObject *o, PyObject **v, int n)
{
    bool ok = o != NULL;
    for (int i = 0; i < n; i++) {
        ok = ok && v[i] != NULL;
        if (o != NULL)
            PyStructSequence_SET_ITEM(o, i, v[i] ? v[i] : Py_NewRef(Py_None));
        else
            Py_XDECREF(v[i]);
    }
    if (!ok)
        Py_CLEAR(o);
    return o;
}

static PyObject *order_to_py(const kvp_tier_order *o)
{
    PyObject *v[8] = {PyLong_FromUnsignedLongLong(o->id),
                      PyLong_FromLong(o->kind),
                      PyLong_FromLong(o->tier),
                      PyLong_FromUnsignedLong(o->tier_block),
                      PyLong_FromUnsignedLong(o->device_block),
                      PyLong_FromUnsignedLong(o->block_index),
                      kvpy_key_to_int(o->key),
                      PyLong_FromUnsignedLongLong(o->req_id)};
    return fill(PyStructSequence_New(order_type), v, 8);
}

static PyObject *orders_to_list(const kvp_tier_order *o, size_t n)
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *x = order_to_py(&o[i]);
        if (x == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, x);
    }
    return list;
}

/* ---------------------------------------------------------------------------------------- */
/* Methods                                                                                  */
/* ---------------------------------------------------------------------------------------- */

const kvpy_sig kvpy_add_tier_sig = {"add_tier",
                                    {{"medium", KVPY_OBJECT, 0, 0},
                                     {"n_blocks", KVPY_U32, 0, 0},
                                     {"eviction", KVPY_EVICTION, KVPY_KWONLY, KVP_EVICT_LRU},
                                     {"slru_protected_pct", KVPY_U32, KVPY_KWONLY, 80},
                                     {"s3fifo_small_pct", KVPY_U32, KVPY_KWONLY, 10},
                                     {"s3fifo_ghost_pct", KVPY_U32, KVPY_KWONLY, 100},
                                     {"cdecay_tau", KVPY_U32, KVPY_KWONLY, 0},
                                     {"cdecay_ghost_pct", KVPY_U32, KVPY_KWONLY, 0}}};

PyObject *kvpy_cache_add_tier(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&kvpy_add_tier_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    PyObject *medium = a.v[0].obj;
    if (!PyUnicode_Check(medium)) {
        kvpy_arg_error(PyExc_TypeError, "add_tier", "medium", ": a str, got %.80s",
                       Py_TYPE(medium)->tp_name);
        return NULL;
    }
    const char *name = PyUnicode_AsUTF8(medium);
    if (name == NULL)
        return NULL;
    if (self->tier_media == NULL && (self->tier_media = PyList_New(0)) == NULL)
        return NULL;
    kvp_tier_config tc;
    kvp_tier_config_init(&tc);
    tc.medium = name;
    tc.n_blocks = (uint32_t)a.v[1].u64;
    tc.eviction = a.v[2].profile;
    tc.slru_protected_pct = (uint32_t)a.v[3].u64;
    tc.s3fifo_small_pct = (uint32_t)a.v[4].u64;
    tc.s3fifo_ghost_pct = (uint32_t)a.v[5].u64;
    tc.cdecay_tau = (uint32_t)a.v[6].u64;
    tc.cdecay_ghost_pct = (uint32_t)a.v[7].u64;
    int tier = 0;
    evbatch b;
    int rc = 0;
    KVPY_CALL(self, b, rc, rc = kvp_cache_add_tier(kc, &tc, &tier));
    if (rc == KVP_OK && PyList_Append(self->tier_media, medium) != 0)
        return kvpy_events_deliver(self, &b, NULL);
    return kvpy_finish(self, rc, "kvp_cache_add_tier", &b,
                       rc == KVP_OK ? PyLong_FromLong(tier) : NULL);
}

const kvpy_sig kvpy_acquire_tiers_sig = {"acquire_tiers",
                                         {{"req_id", KVPY_U64, 0, 0},
                                          {"ns", KVPY_NS, 0, 0},
                                          {"tokens", KVPY_TOKENS, 0, 0},
                                          {"capacity", KVPY_SIZE, KVPY_OPT, 0}}};

PyObject *kvpy_cache_acquire_tiers(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&kvpy_acquire_tiers_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    const tokens *t = &a.v[2].tokens;
    size_t cap = t->n / self->block_size + 1;
    kvp_tier_order *loads = PyMem_Malloc(cap * sizeof *loads);
    if (loads == NULL) {
        kvpy_args_done(&a);
        return PyErr_NoMemory();
    }
    kvp_match m;
    size_t n = 0;
    evbatch b;
    int rc = 0;
    KVPY_CALL(self, b, rc,
              rc = kvp_acquire_tiers(kc, a.v[0].u64, a.v[1].ns, t->ptr, t->n, a.v[3].size, &m,
                                     loads, cap, &n));
    kvpy_args_done(&a);
    PyObject *res = NULL;
    if (rc == KVP_OK) {
        PyObject *mo = kvpy_match_to_py(&m, NULL);
        PyObject *lo = orders_to_list(loads, n);
        res = mo && lo ? PyTuple_Pack(2, mo, lo) : NULL;
        Py_XDECREF(mo);
        Py_XDECREF(lo);
    }
    PyMem_Free(loads);
    if (rc == KVP_OK && res == NULL)
        return kvpy_events_deliver(self, &b, NULL);
    return kvpy_finish(self, rc, "kvp_acquire_tiers", &b, res);
}

const kvpy_sig kvpy_tier_orders_sig = {"tier_orders",
                                       {{"max", KVPY_SIZE, KVPY_OPT | KVPY_NONE, 0}}};

PyObject *kvpy_cache_tier_orders(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&kvpy_tier_orders_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    size_t limit = a.given[0] ? a.v[0].size : SIZE_MAX;
    PyObject *list = PyList_New(0);
    kvp_tier_order buf[256];
    size_t left = 1;
    while (list != NULL && left > 0 && (size_t)PyList_GET_SIZE(list) < limit) {
        size_t want = limit - (size_t)PyList_GET_SIZE(list);
        size_t n = 0;
        evbatch b;
        int rc = 0;
        KVPY_CALL(self, b, rc, rc = kvp_tier_orders(kc, buf, want < 256 ? want : 256, &n, &left));
        if (kvpy_finish(self, rc, "kvp_tier_orders", &b, Py_NewRef(Py_None)) == NULL) {
            Py_CLEAR(list);
            break;
        }
        Py_DECREF(Py_None);
        for (size_t i = 0; list != NULL && i < n; i++) {
            PyObject *x = order_to_py(&buf[i]);
            if (x == NULL || PyList_Append(list, x) != 0)
                Py_CLEAR(list); /* the orders already taken are lost: confirm them failed */
            Py_XDECREF(x);
        }
    }
    return list;
}

const kvpy_sig kvpy_tier_confirm_sig = {
    "tier_confirm", {{"order_id", KVPY_U64, 0, 0}, {"ok", KVPY_BOOL, KVPY_OPT, 1}}};

PyObject *kvpy_cache_tier_confirm(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&kvpy_tier_confirm_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    evbatch b;
    int rc = 0;
    KVPY_CALL(self, b, rc, rc = kvp_tier_confirm(kc, a.v[0].u64, a.v[1].flag));
    return kvpy_finish(self, rc, "kvp_tier_confirm", &b, Py_NewRef(Py_None));
}

const kvpy_sig kvpy_lookup_tiers_sig = {"lookup_tiers",
                                        {{"ns", KVPY_NS, 0, 0}, {"tokens", KVPY_TOKENS, 0, 0}}};

PyObject *kvpy_cache_lookup_tiers(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&kvpy_lookup_tiers_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    const tokens *t = &a.v[1].tokens;
    size_t cap = t->n / self->block_size;
    uint8_t *where = PyMem_Malloc(cap + 1);
    if (where == NULL) {
        kvpy_args_done(&a);
        return PyErr_NoMemory();
    }
    kvp_tier_match m;
    evbatch b;
    int rc = 0;
    KVPY_CALL(self, b, rc, rc = kvp_lookup_tiers(kc, a.v[0].ns, t->ptr, t->n, where, cap, &m));
    kvpy_args_done(&a);
    PyObject *res = NULL;
    if (rc == KVP_OK) {
        PyObject *per = PyTuple_New(KVP_MAX_TIERS);
        for (unsigned k = 0; per != NULL && k < KVP_MAX_TIERS; k++) {
            PyObject *x = PyLong_FromUnsignedLong(m.n_blocks_tier[k]);
            if (x == NULL)
                Py_CLEAR(per);
            else
                PyTuple_SET_ITEM(per, k, x);
        }
        PyObject *wl = PyList_New(m.n_blocks_prefix);
        for (uint32_t i = 0; wl != NULL && i < m.n_blocks_prefix; i++) {
            PyObject *x = PyLong_FromLong(where[i]);
            if (x == NULL)
                Py_CLEAR(wl);
            else
                PyList_SET_ITEM(wl, i, x);
        }
        PyObject *v[5] = {PyLong_FromUnsignedLong(m.n_blocks_full),
                          PyLong_FromUnsignedLong(m.n_blocks_prefix),
                          PyLong_FromUnsignedLong(m.n_blocks_usable), per, wl};
        res = fill(PyStructSequence_New(match_type), v, 5);
    }
    PyMem_Free(where);
    if (rc == KVP_OK && res == NULL)
        return kvpy_events_deliver(self, &b, NULL);
    return kvpy_finish(self, rc, "kvp_lookup_tiers", &b, res);
}

const kvpy_sig kvpy_tier_stats_sig = {"tier_stats", {{"tier", KVPY_U32, KVPY_OPT | KVPY_NONE, 0}}};

static PyObject *tstats_to_py(const kvp_tier_stats *s)
{
    PyObject *v[14] = {PyUnicode_FromString(s->medium),
                       PyLong_FromUnsignedLong(s->n_blocks_total),
                       PyLong_FromUnsignedLong(s->n_blocks_ready),
                       PyLong_FromUnsignedLong(s->n_blocks_pending),
                       PyLong_FromUnsignedLong(s->n_blocks_loading),
                       PyLong_FromUnsignedLongLong(s->n_hits),
                       PyLong_FromUnsignedLongLong(s->n_loads),
                       PyLong_FromUnsignedLongLong(s->n_loads_failed),
                       PyLong_FromUnsignedLongLong(s->n_stores),
                       PyLong_FromUnsignedLongLong(s->n_stores_failed),
                       PyLong_FromUnsignedLongLong(s->n_stores_skipped),
                       PyLong_FromUnsignedLongLong(s->n_evictions),
                       PyLong_FromUnsignedLongLong(s->n_bytes_loaded),
                       PyLong_FromUnsignedLongLong(s->n_bytes_stored)};
    return fill(PyStructSequence_New(tstats_type), v, 14);
}

/* The counters of tier one into st[0], or of every tier (one < 0) into st[0 .. *n_tiers),
 * without the GIL. Returns the library's status. */
static int stats_nogil(kvp_cache *kc, int one, kvp_tier_stats *st, int *n_tiers)
{
    int rc = kvp_cache_tier_stats(kc, one < 0 ? 0 : one, &st[0], n_tiers);
    for (int k = 1; rc == KVP_OK && one < 0 && k < *n_tiers; k++)
        rc = kvp_cache_tier_stats(kc, k, &st[k], n_tiers);
    return rc;
}

/* tier_stats(tier): one TierStats; tier_stats(): a list of every tier's, tier 0 first. */
PyObject *kvpy_cache_tier_stats(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&kvpy_tier_stats_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    kvp_tier_stats st[KVP_MAX_TIERS];
    int n_tiers = 0, one = a.given[0] ? (int)a.v[0].u64 : -1;
    if (a.given[0] && a.v[0].u64 >= KVP_MAX_TIERS)
        one = KVP_MAX_TIERS; /* refused below with the library's message */
    evbatch b;
    int rc = 0;
    KVPY_CALL(self, b, rc, rc = stats_nogil(kc, one, st, &n_tiers));
    PyObject *res = NULL;
    if (rc == KVP_OK && one >= 0) {
        res = tstats_to_py(&st[0]);
    } else if (rc == KVP_OK) {
        res = PyList_New(n_tiers);
        for (int k = 0; res != NULL && k < n_tiers; k++) {
            PyObject *x = tstats_to_py(&st[k]);
            if (x == NULL)
                Py_CLEAR(res);
            else
                PyList_SET_ITEM(res, k, x);
        }
    }
    if (rc == KVP_OK && res == NULL)
        return kvpy_events_deliver(self, &b, NULL);
    return kvpy_finish(self, rc, "kvp_cache_tier_stats", &b, res);
}

/* The medium of an event's tier, a new reference: None for tier 0 (the device pool, whose
 * medium the consumer names) or an unknown tier. Cannot fail. */
PyObject *kvpy_tier_medium(CacheObject *self, int tier)
{
    if (tier > 0 && self->tier_media != NULL && tier - 1 < PyList_GET_SIZE(self->tier_media))
        return Py_NewRef(PyList_GET_ITEM(self->tier_media, tier - 1));
    return Py_NewRef(Py_None);
}

int kvpy_tiers_add(PyObject *m)
{
    if ((order_type = PyStructSequence_NewType(&order_desc)) == NULL ||
        (match_type = PyStructSequence_NewType(&match_desc)) == NULL ||
        (tstats_type = PyStructSequence_NewType(&tstats_desc)) == NULL)
        return -1;
    if (PyModule_AddObjectRef(m, "TierOrder", (PyObject *)order_type) < 0 ||
        PyModule_AddObjectRef(m, "TierMatch", (PyObject *)match_type) < 0 ||
        PyModule_AddObjectRef(m, "TierStats", (PyObject *)tstats_type) < 0 ||
        PyModule_AddIntConstant(m, "ORDER_LOAD", KVP_ORDER_LOAD) < 0 ||
        PyModule_AddIntConstant(m, "ORDER_STORE", KVP_ORDER_STORE) < 0 ||
        PyModule_AddIntConstant(m, "MAX_TIERS", KVP_MAX_TIERS) < 0)
        return -1;
    return 0;
}
