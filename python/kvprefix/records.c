/*
 * records.c - the struct sequences Match, Stats, Event and Chain: the library's result structs
 * (kvp_match, kvp_stats, kvp_event, kvp_chain) as named, immutable tuples.
 *
 * Struct sequences rather than classes of our own: they are tuples (comparable, unpackable,
 * cheap to build: one allocation and a store per field), have named read-only fields and a
 * repr naming them, and kvprefix.stats_dict reads their __match_args__. Their field order is
 * the C structs' and must only grow at the end (scripts index them).
 */
#include "kvpy.h"

static PyTypeObject *match_type; /* Match */
static PyTypeObject *stats_type; /* Stats */
static PyTypeObject *event_type; /* Event */
static PyTypeObject *chain_type; /* Chain */

/* Fill o's first n fields from v[], which it steals (a NULL counts as a failure and is stored
 * as None). Returns o, or NULL (o freed) when any was NULL. */
static PyObject *fill(PyObject *o, PyObject **v, int n)
{
    bool ok = true;
    for (int i = 0; i < n; i++) {
        ok = ok && v[i] != NULL;
        PyStructSequence_SET_ITEM(o, i, v[i] ? v[i] : Py_NewRef(Py_None));
    }
    if (!ok)
        Py_CLEAR(o);
    return o;
}

PyObject *kvpy_match_to_py(const kvp_match *m, PyObject *block_ids)
{
    PyObject *o = PyStructSequence_New(match_type);
    if (o == NULL) {
        Py_XDECREF(block_ids);
        return NULL;
    }
    PyObject *v[7] = {
        PyLong_FromUnsignedLongLong(m->n_tokens),     PyLong_FromUnsignedLong(m->n_blocks_full),
        PyLong_FromUnsignedLong(m->n_blocks_cached),  PyLong_FromUnsignedLong(m->n_blocks_hit),
        PyLong_FromUnsignedLongLong(m->n_tokens_hit), block_ids ? block_ids : Py_NewRef(Py_None),
        PyLong_FromUnsignedLong(m->n_blocks_stored)};
    return fill(o, v, 7);
}

PyObject *kvpy_stats_to_py(const kvp_stats *s)
{
    PyObject *o = PyStructSequence_New(stats_type);
    if (o == NULL)
        return NULL;
    const unsigned long long u[16] = {
        s->n_requests,      s->n_lookups,        s->n_tokens_queried,  s->n_tokens_hit,
        s->n_blocks_hit,    s->n_blocks_missed,  s->n_blocks_stored,   s->n_blocks_deduped,
        s->n_evictions,     s->n_verify_rejects, s->n_blocks_total,    s->n_blocks_free,
        s->n_blocks_cached, s->n_blocks_in_use,  s->n_requests_active, s->n_blocks_orphaned};
    PyObject *v[16];
    for (int i = 0; i < 16; i++)
        v[i] = PyLong_FromUnsignedLongLong(u[i]);
    return fill(o, v, 16);
}

PyObject *kvpy_event_to_py(const kvp_event *e, PyObject *medium)
{
    PyObject *o = PyStructSequence_New(event_type);
    if (o == NULL) {
        Py_XDECREF(medium);
        return NULL;
    }
    PyObject *v[9] = {PyLong_FromLong(e->type),
                      PyLong_FromLong(e->reason),
                      PyLong_FromUnsignedLong(e->block_id),
                      PyLong_FromUnsignedLong(e->n_tokens),
                      kvpy_key_to_int(e->key),
                      kvpy_key_to_int(e->parent),
                      PyBool_FromLong(e->parent_is_root),
                      PyLong_FromLong(e->tier),
                      medium};
    return fill(o, v, 9);
}

PyObject *kvpy_chain_to_py(const chaindig *c)
{
    PyObject *o = PyStructSequence_New(chain_type);
    if (o == NULL)
        return NULL;
    PyObject *v[6] = {kvpy_key_to_int(c->chain.key),
                      kvpy_key_to_int(c->chain.high),
                      kvpy_key_to_int(c->chain.root),
                      PyLong_FromUnsignedLongLong(c->chain.n_blocks),
                      PyBytes_FromStringAndSize((const char *)c->dig, (Py_ssize_t)c->n_dig),
                      PyLong_FromUnsignedLongLong(c->chain.key.lo)};
    return fill(o, v, 6);
}

int kvpy_chain_from_py(PyObject *obj, kvp_chain *out, const char *fn, const char *arg)
{
    if (!PyObject_TypeCheck(obj, chain_type)) {
        kvpy_arg_error(PyExc_TypeError, fn, arg, ": a kvprefix.Chain or None, got %.80s",
                       Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (kvpy_key(PyStructSequence_GET_ITEM(obj, 0), &out->key, fn, arg) != 0 ||
        kvpy_key(PyStructSequence_GET_ITEM(obj, 1), &out->high, fn, arg) != 0 ||
        kvpy_key(PyStructSequence_GET_ITEM(obj, 2), &out->root, fn, arg) != 0 ||
        kvpy_u64(PyStructSequence_GET_ITEM(obj, 3), &out->n_blocks, fn, arg) != 0)
        return -1;
    return 0;
}

static PyStructSequence_Field match_fields[] = {
    {"n_tokens", "prompt tokens given"},
    {"n_blocks_full", "full blocks in the prompt"},
    {"n_blocks_cached", "longest run of cached blocks from the start"},
    {"n_blocks_hit", "blocks the engine may reuse (at least one token is computed)"},
    {"n_tokens_hit", "prefill tokens skipped: n_blocks_hit * block_size"},
    {"block_ids", "lookup: the reused block ids (list); None for acquire and access"},
    {"n_blocks_stored", "access: full prompt blocks this call newly cached; else 0"},
    {NULL, NULL},
};

static PyStructSequence_Field stats_fields[] = {
    {"n_requests", "acquire + access calls that succeeded"},
    {"n_lookups", "lookup calls that succeeded"},
    {"n_tokens_queried", "prompt tokens of those requests"},
    {"n_tokens_hit", "prefill tokens skipped"},
    {"n_blocks_hit", "reused blocks"},
    {"n_blocks_missed", "full prompt blocks not reused"},
    {"n_blocks_stored", "blocks newly indexed"},
    {"n_blocks_deduped", "committed blocks whose key was already indexed"},
    {"n_evictions", "cached blocks recycled for new data"},
    {"n_verify_rejects", "collision-proof mode: key matches that failed verification"},
    {"n_blocks_total", "pool size"},
    {"n_blocks_free", "never used, or holding nothing reusable"},
    {"n_blocks_cached", "indexed and unpinned: evictable"},
    {"n_blocks_in_use", "pinned by at least one request"},
    {"n_requests_active", "requests between acquire and release"},
    {"n_blocks_orphaned", "cached blocks whose parent is not indexed (count_orphans only)"},
    {NULL, NULL},
};

static PyStructSequence_Field event_fields[] = {
    {"type", "EVENT_STORED, EVENT_REMOVED or EVENT_CLEARED"},
    {"reason", "REMOVED only: REMOVED_EVICTED or REMOVED_RESET; else 0"},
    {"block_id", "the physical block (0 for CLEARED)"},
    {"n_tokens", "STORED: tokens in the block"},
    {"key", "the block key (int)"},
    {"parent", "STORED: the parent block's key, or the namespace root"},
    {"parent_is_root", "STORED: the block is the first of its chain"},
    {"tier", "the tier the event is about: 0 the device pool, 1.. a lower tier (attribute "
             "only: the tuple keeps its 7 fields)"},
    {"medium", "a lower tier's medium name (add_tier), None for tier 0 (attribute only)"},
    {NULL, NULL},
};

static PyStructSequence_Field chain_fields[] = {
    {"key", "the cache's index key of the last block hashed (the root before block 0)"},
    {"high", "vllm-sha256-cbor: high 128 bits of the 256-bit digest; else 0"},
    {"root", "the namespace root"},
    {"n_blocks", "blocks hashed since the root"},
    {"digest", "the canonical digest (bytes: 16, or 32 for vllm-sha256-cbor)"},
    {"event", "vLLM's KV-event int: the digest's last 8 bytes, big-endian (key & (2**64-1))"},
    {NULL, NULL},
};

static PyStructSequence_Desc match_desc = {"kvprefix.Match", "The result of matching a prompt.",
                                           match_fields, 7};
static PyStructSequence_Desc stats_desc = {"kvprefix.Stats", "Cache counters and gauges.",
                                           stats_fields, 16};
static PyStructSequence_Desc event_desc = {"kvprefix.Event", "One cache event.", event_fields, 7};
static PyStructSequence_Desc chain_desc = {
    "kvprefix.Chain", "A key chain after some blocks (kvp_chain), with its digest.", chain_fields,
    6};

int kvpy_records_add(PyObject *m)
{
    if ((match_type = PyStructSequence_NewType(&match_desc)) == NULL ||
        (stats_type = PyStructSequence_NewType(&stats_desc)) == NULL ||
        (event_type = PyStructSequence_NewType(&event_desc)) == NULL ||
        (chain_type = PyStructSequence_NewType(&chain_desc)) == NULL)
        return -1;
    if (PyModule_AddObjectRef(m, "Match", (PyObject *)match_type) < 0 ||
        PyModule_AddObjectRef(m, "Stats", (PyObject *)stats_type) < 0 ||
        PyModule_AddObjectRef(m, "Event", (PyObject *)event_type) < 0 ||
        PyModule_AddObjectRef(m, "Chain", (PyObject *)chain_type) < 0)
        return -1;
    return 0;
}
