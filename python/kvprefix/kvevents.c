/*
 * kvevents.c - kvprefix._kvevents: libkvprefix-events' vLLM KV-event codec and ZeroMQ
 * publisher for Python (docs/python.md, "KV events to a router"), so that a Python frontend
 * can feed `kvprefix router` (or any router speaking vLLM's protocol) without writing vLLM's
 * framing itself. A module of its own, built only when libkvprefix-events is (ZeroMQ,
 * msgpack-c); kvprefix/__init__.py exposes its names when it imports.
 *
 *   encode_batch(events, ts=None, dp_rank=None, form="array", batch_map=False) -> bytes
 *   decode_batch(payload) -> (ts, events, dp_rank)
 *   Publisher(endpoint, replay_endpoint=None, topic="", dp_rank=0, buffer_steps=10000,
 *             hwm=100000, medium="GPU", form="array") with stored(), removed(), cleared(),
 *             flush(), poll(), endpoint(), stats(), close()
 *
 * Events are tuples in vLLM's array order: ("BlockStored", block_hashes, parent_block_hash,
 * token_ids, block_size, lora_id, medium, lora_name) (the last three optional),
 * ("BlockRemoved", block_hashes, medium) (medium optional), ("AllBlocksCleared",). Hashes
 * are ints 0 .. 2^64-1 (a negative int is taken as its two's complement, as vLLM's
 * decoders do). decode_batch returns the same tuples (all fields), so encode_batch(
 * *decode_batch(p)) round-trips a batch.
 *
 * Memory: encode_batch converts into arrays it frees before returning; decode_batch copies
 * out of the library's batch and frees it. A Publisher owns its kvp_publisher (freed by
 * close() or when collected); its calls hold the GIL (each is a copy into the publisher's
 * pending batch or one ZeroMQ send) except poll(), which releases it while it waits.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "kvprefix_events.h"

/* Raise for a library status. Returns NULL. */
static PyObject *kve_raise(int rc, const char *what)
{
    PyObject *exc = rc == KVP_ENOMEM ? PyExc_MemoryError
                    : rc == KVP_EIO  ? PyExc_OSError
                                     : PyExc_ValueError;
    PyErr_Format(exc, "%s: %s", what, kvp_strerror(rc));
    return NULL;
}

/* A hash: an int in -2^63 .. 2^64-1 as a uint64. Returns -1 with an exception. */
static int kve_u64(PyObject *o, uint64_t *out, const char *what)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s: expected an int, got %.80s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    unsigned long long u = PyLong_AsUnsignedLongLong(o);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        long long s = PyLong_AsLongLong(o);
        if (s == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s: not in -2**63 .. 2**64-1", what);
            return -1;
        }
        u = (unsigned long long)s;
    }
    *out = (uint64_t)u;
    return 0;
}

/* A sequence of ints into a malloc'ed uint64 (or uint32 when u32) array. Returns -1 with an
 * exception. */
static int kve_ints(PyObject *o, bool u32, void **out, size_t *n, const char *what)
{
    PyObject *seq = PySequence_Fast(o, what);
    if (seq == NULL)
        return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    void *arr = PyMem_Malloc((size_t)(len ? len : 1) * (u32 ? 4 : 8));
    if (arr == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *e = PySequence_Fast_GET_ITEM(seq, i);
        uint64_t v = 0;
        if (u32) {
            unsigned long x = PyLong_Check(e) ? PyLong_AsUnsignedLong(e) : (unsigned long)-1;
            if ((x == (unsigned long)-1 && PyErr_Occurred()) || !PyLong_Check(e) ||
                x > UINT32_MAX) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "%s[%zd]: not a token id in 0 .. 2**32-1", what, i);
                PyMem_Free(arr);
                Py_DECREF(seq);
                return -1;
            }
            ((uint32_t *)arr)[i] = (uint32_t)x;
        } else {
            if (kve_u64(e, &v, what) < 0) {
                PyMem_Free(arr);
                Py_DECREF(seq);
                return -1;
            }
            ((uint64_t *)arr)[i] = v;
        }
    }
    Py_DECREF(seq);
    *out = arr;
    *n = (size_t)len;
    return 0;
}

/* A str or None field (UTF-8, owned by o). Returns -1 with an exception. */
static int kve_str(PyObject *o, const char **out, const char *what)
{
    if (o == NULL || o == Py_None) {
        *out = NULL;
        return 0;
    }
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s: expected str or None", what);
        return -1;
    }
    *out = PyUnicode_AsUTF8(o);
    return *out ? 0 : -1;
}

/* Free the arrays of events ev[0 .. n). */
static void kve_events_free(kvp_kv_event *ev, size_t n)
{
    for (size_t i = 0; ev && i < n; i++) {
        PyMem_Free((void *)ev[i].hashes);
        PyMem_Free((void *)ev[i].tokens);
    }
    PyMem_Free(ev);
}

/* One event tuple into *e (arrays malloc'ed; strings borrowed from t). Returns -1 with an
 * exception. */
static int kve_event(PyObject *t, kvp_kv_event *e, Py_ssize_t i)
{
    memset(e, 0, sizeof *e);
    e->group_idx = -1;
    Py_ssize_t n = PyTuple_Check(t) ? PyTuple_GET_SIZE(t) : 0;
    const char *type = n ? PyUnicode_Check(PyTuple_GET_ITEM(t, 0))
                               ? PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, 0))
                               : NULL
                         : NULL;
    if (type == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "events[%zd]: not a tuple starting with the event type", i);
        return -1;
    }
    if (strcmp(type, "AllBlocksCleared") == 0) {
        e->type = KVP_EVENT_CLEARED;
        return 0;
    }
    if (strcmp(type, "BlockRemoved") == 0 && n >= 2 && n <= 3) {
        e->type = KVP_EVENT_REMOVED;
        return kve_ints(PyTuple_GET_ITEM(t, 1), false, (void **)&e->hashes, &e->n_hashes,
                        "block_hashes") < 0 ||
                       kve_str(n > 2 ? PyTuple_GET_ITEM(t, 2) : NULL, &e->medium, "medium") < 0
                   ? -1
                   : 0;
    }
    if (strcmp(type, "BlockStored") == 0 && n >= 5 && n <= 8) {
        e->type = KVP_EVENT_STORED;
        PyObject *parent = PyTuple_GET_ITEM(t, 2), *bs = PyTuple_GET_ITEM(t, 4);
        unsigned long b = PyLong_Check(bs) ? PyLong_AsUnsignedLong(bs) : 0;
        if (b == 0 || b > UINT32_MAX || PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "events[%zd]: block_size must be an int >= 1", i);
            return -1;
        }
        e->block_size = (uint32_t)b;
        if (parent != Py_None) {
            e->has_parent = true;
            if (kve_u64(parent, &e->parent, "parent_block_hash") < 0)
                return -1;
        }
        if (kve_ints(PyTuple_GET_ITEM(t, 1), false, (void **)&e->hashes, &e->n_hashes,
                     "block_hashes") < 0 ||
            kve_ints(PyTuple_GET_ITEM(t, 3), true, (void **)&e->tokens, &e->n_tokens, "token_ids") <
                0)
            return -1;
        if (n > 5 && PyTuple_GET_ITEM(t, 5) != Py_None) {
            e->has_lora_id = true;
            e->lora_id = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 5));
            if (e->lora_id == -1 && PyErr_Occurred())
                return -1;
        }
        return kve_str(n > 6 ? PyTuple_GET_ITEM(t, 6) : NULL, &e->medium, "medium") < 0 ||
                       kve_str(n > 7 ? PyTuple_GET_ITEM(t, 7) : NULL, &e->lora_name, "lora_name") <
                           0
                   ? -1
                   : 0;
    }
    PyErr_Format(PyExc_ValueError,
                 "events[%zd]: not (\"BlockStored\", hashes, parent, token_ids, block_size"
                 "[, lora_id, medium, lora_name]), (\"BlockRemoved\", hashes[, medium]) or "
                 "(\"AllBlocksCleared\",)",
                 i);
    return -1;
}

/* "array" or "map" into KVP_KV_FORM_*. Returns -1 with an exception. */
static int kve_form(const char *form, int batch_map, int *out)
{
    if (strcmp(form, "array") == 0)
        *out = KVP_KV_FORM_ARRAY;
    else if (strcmp(form, "map") == 0)
        *out = KVP_KV_FORM_MAP;
    else {
        PyErr_Format(PyExc_ValueError, "form: '%s' is not \"array\" or \"map\"", form);
        return -1;
    }
    *out |= batch_map ? KVP_KV_BATCH_MAP : 0;
    return 0;
}

static PyObject *kve_encode_batch(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"events", "ts", "dp_rank", "form", "batch_map", NULL};
    PyObject *events, *ts_o = Py_None, *rank_o = Py_None;
    const char *form_s = "array";
    int batch_map = 0, form = 0;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOsp:encode_batch", kwlist, &events, &ts_o,
                                     &rank_o, &form_s, &batch_map) ||
        kve_form(form_s, batch_map, &form) < 0)
        return NULL;
    kvp_kv_batch b;
    memset(&b, 0, sizeof b);
    b.ts = ts_o == Py_None ? 0.0 : PyFloat_AsDouble(ts_o);
    if (ts_o == Py_None) {
        PyObject *time = PyImport_ImportModule("time"), *now = NULL;
        if (time)
            now = PyObject_CallMethod(time, "time", NULL);
        Py_XDECREF(time);
        if (now == NULL)
            return NULL;
        b.ts = PyFloat_AsDouble(now);
        Py_DECREF(now);
    }
    if (PyErr_Occurred())
        return NULL;
    if (rank_o != Py_None) {
        b.has_dp_rank = true;
        b.dp_rank = PyLong_AsLongLong(rank_o);
        if (b.dp_rank == -1 && PyErr_Occurred())
            return NULL;
    }
    PyObject *seq = PySequence_Fast(events, "events: expected a sequence of event tuples");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    kvp_kv_event *ev = PyMem_Calloc((size_t)(n ? n : 1), sizeof *ev);
    PyObject *out = NULL;
    Py_ssize_t done = 0;
    if (ev == NULL)
        PyErr_NoMemory();
    for (; ev && done < n; done++)
        if (kve_event(PySequence_Fast_GET_ITEM(seq, done), &ev[done], done) < 0) {
            done++;
            goto end;
        }
    if (ev) {
        b.events = ev;
        b.n_events = (size_t)n;
        uint8_t *buf = NULL;
        size_t len = 0;
        int rc = kvp_kv_encode_alloc(&b, form, &buf, &len);
        if (rc != KVP_OK)
            kve_raise(rc, "encode_batch");
        else
            out = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)len);
        kvp_kv_buf_free(buf);
    }
end:
    kve_events_free(ev, (size_t)done);
    Py_DECREF(seq);
    return out;
}

/* A list of n uint64 hashes as Python ints. */
static PyObject *kve_hash_list(const uint64_t *h, size_t n)
{
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(h[i]);
        if (v == NULL) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, v);
    }
    return l;
}

/* One decoded event as its tuple. */
static PyObject *kve_event_tuple(const kvp_kv_event *e)
{
    if (e->type == KVP_EVENT_CLEARED)
        return Py_BuildValue("(s)", "AllBlocksCleared");
    PyObject *hashes = kve_hash_list(e->hashes, e->n_hashes);
    if (hashes == NULL)
        return NULL;
    if (e->type == KVP_EVENT_REMOVED)
        return Py_BuildValue("(sNz)", "BlockRemoved", hashes, e->medium);
    PyObject *tok = PyList_New((Py_ssize_t)e->n_tokens);
    for (size_t i = 0; tok && i < e->n_tokens; i++) {
        PyObject *v = PyLong_FromUnsignedLong(e->tokens[i]);
        if (v == NULL) {
            Py_CLEAR(tok);
            break;
        }
        PyList_SET_ITEM(tok, (Py_ssize_t)i, v);
    }
    PyObject *parent = e->has_parent ? PyLong_FromUnsignedLongLong(e->parent) : Py_NewRef(Py_None);
    PyObject *lora = e->has_lora_id ? PyLong_FromLongLong(e->lora_id) : Py_NewRef(Py_None);
    if (tok == NULL || parent == NULL || lora == NULL) {
        Py_DECREF(hashes);
        Py_XDECREF(tok);
        Py_XDECREF(parent);
        Py_XDECREF(lora);
        return NULL;
    }
    return Py_BuildValue("(sNNNINzz)", "BlockStored", hashes, parent, tok,
                         (unsigned int)e->block_size, lora, e->medium, e->lora_name);
}

static PyObject *kve_decode_batch(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    (void)self;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    kvp_kv_batch *b = NULL;
    int rc = kvp_kv_decode(view.buf, (size_t)view.len, &b);
    PyBuffer_Release(&view);
    if (rc != KVP_OK)
        return kve_raise(rc, "decode_batch");
    PyObject *events = PyList_New((Py_ssize_t)b->n_events), *out = NULL;
    for (size_t i = 0; events && i < b->n_events; i++) {
        PyObject *t = kve_event_tuple(&b->events[i]);
        if (t == NULL) {
            Py_CLEAR(events);
            break;
        }
        PyList_SET_ITEM(events, (Py_ssize_t)i, t);
    }
    if (events) {
        PyObject *rank = b->has_dp_rank ? PyLong_FromLongLong(b->dp_rank) : Py_NewRef(Py_None);
        out = rank ? Py_BuildValue("(dNN)", b->ts, events, rank) : NULL;
        if (out == NULL)
            Py_XDECREF(rank);
    }
    kvp_kv_batch_free(b);
    return out;
}

/* ---- Publisher ------------------------------------------------------------------------ */

typedef struct kve_pub {
    PyObject_HEAD kvp_publisher *pub; /* owned; NULL once closed */
} kve_pub;

static int kve_pub_init(kve_pub *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"endpoint", "replay_endpoint", "topic", "dp_rank", "buffer_steps",
                             "hwm",      "medium",          "form",  NULL};
    kvp_publisher_config cfg;
    kvp_publisher_config_init(&cfg);
    const char *form_s = "array";
    unsigned int steps = cfg.buffer_steps;
    long long rank = 0;
    PyObject *replay = Py_None, *medium = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|OsLIiOs:Publisher", kwlist, &cfg.endpoint,
                                     &replay, &cfg.topic, &rank, &steps, &cfg.hwm, &medium,
                                     &form_s) ||
        kve_str(replay, &cfg.replay_endpoint, "replay_endpoint") < 0 ||
        (medium && kve_str(medium, &cfg.medium, "medium") < 0) ||
        kve_form(form_s, 0, &cfg.form) < 0)
        return -1;
    cfg.dp_rank = rank;
    cfg.buffer_steps = steps;
    cfg.replay_thread = cfg.replay_endpoint != NULL;
    if (self->pub) {
        PyErr_SetString(PyExc_RuntimeError, "Publisher: already initialised");
        return -1;
    }
    int rc = kvp_publisher_new(&cfg, &self->pub);
    if (rc != KVP_OK) {
        kve_raise(rc, "Publisher");
        return -1;
    }
    return 0;
}

static void kve_pub_dealloc(kve_pub *self)
{
    kvp_publisher_free(self->pub);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The open publisher, or NULL with ValueError. */
static kvp_publisher *kve_pub_get(kve_pub *self)
{
    if (self->pub == NULL)
        PyErr_SetString(PyExc_ValueError, "Publisher is closed");
    return self->pub;
}

/* stored(block_hashes, token_ids, parent=None): one BlockStored chain (block size =
 * len(token_ids) / len(block_hashes)), queued for the next flush(). */
static PyObject *kve_pub_stored(kve_pub *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"block_hashes", "token_ids", "parent", NULL};
    PyObject *h_o, *t_o, *p_o = Py_None;
    kvp_publisher *pub = kve_pub_get(self);
    if (pub == NULL ||
        !PyArg_ParseTupleAndKeywords(args, kw, "OO|O:stored", kwlist, &h_o, &t_o, &p_o))
        return NULL;
    uint64_t *h = NULL, parent = 0;
    uint32_t *t = NULL;
    size_t nh = 0, nt = 0;
    PyObject *out = NULL;
    if ((p_o != Py_None && kve_u64(p_o, &parent, "parent") < 0) ||
        kve_ints(h_o, false, (void **)&h, &nh, "block_hashes") < 0 ||
        kve_ints(t_o, true, (void **)&t, &nt, "token_ids") < 0)
        goto end;
    if (nh == 0 || nt % nh != 0 || nt / nh == 0 || nt / nh > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "stored: token_ids must hold the same number (>= 1) "
                                          "of tokens for every block hash");
        goto end;
    }
    uint32_t bs = (uint32_t)(nt / nh);
    for (size_t i = 0; i < nh; i++) {
        kvp_event ev;
        memset(&ev, 0, sizeof ev);
        ev.type = KVP_EVENT_STORED;
        ev.n_tokens = bs;
        ev.key.lo = h[i];
        ev.parent_is_root = i == 0 && p_o == Py_None;
        ev.parent.lo = i == 0 ? parent : h[i - 1];
        ev.tokens = t + i * bs;
        kvp_publisher_on_event(pub, &ev);
    }
    out = Py_NewRef(Py_None);
end:
    PyMem_Free(h);
    PyMem_Free(t);
    return out;
}

/* removed(block_hashes): BlockRemoved, queued. */
static PyObject *kve_pub_removed(kve_pub *self, PyObject *arg)
{
    kvp_publisher *pub = kve_pub_get(self);
    uint64_t *h = NULL;
    size_t nh = 0;
    if (pub == NULL || kve_ints(arg, false, (void **)&h, &nh, "block_hashes") < 0)
        return NULL;
    for (size_t i = 0; i < nh; i++) {
        kvp_event ev;
        memset(&ev, 0, sizeof ev);
        ev.type = KVP_EVENT_REMOVED;
        ev.key.lo = h[i];
        kvp_publisher_on_event(pub, &ev);
    }
    PyMem_Free(h);
    Py_RETURN_NONE;
}

static PyObject *kve_pub_cleared(kve_pub *self, PyObject *unused)
{
    (void)unused;
    kvp_publisher *pub = kve_pub_get(self);
    if (pub == NULL)
        return NULL;
    kvp_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = KVP_EVENT_CLEARED;
    kvp_publisher_on_event(pub, &ev);
    Py_RETURN_NONE;
}

static PyObject *kve_pub_flush(kve_pub *self, PyObject *unused)
{
    (void)unused;
    kvp_publisher *pub = kve_pub_get(self);
    int rc = pub ? kvp_publisher_flush(pub) : KVP_OK;
    if (pub == NULL)
        return NULL;
    return rc == KVP_OK ? Py_NewRef(Py_None) : kve_raise(rc, "flush");
}

static PyObject *kve_pub_endpoint(kve_pub *self, PyObject *args)
{
    int which = 0;
    kvp_publisher *pub = kve_pub_get(self);
    if (pub == NULL || !PyArg_ParseTuple(args, "|i:endpoint", &which))
        return NULL;
    char buf[1024];
    int rc = kvp_publisher_endpoint(pub, which, buf, sizeof buf);
    return rc == KVP_OK ? PyUnicode_FromString(buf) : kve_raise(rc, "endpoint");
}

static PyObject *kve_pub_stats(kve_pub *self, PyObject *unused)
{
    (void)unused;
    kvp_publisher *pub = kve_pub_get(self);
    kvp_publisher_stats st;
    if (pub == NULL)
        return NULL;
    int rc = kvp_publisher_stats_get(pub, &st);
    if (rc != KVP_OK)
        return kve_raise(rc, "stats");
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsI}", "next_seq", (unsigned long long)st.next_seq, "batches",
        (unsigned long long)st.n_batches, "events", (unsigned long long)st.n_events, "bytes",
        (unsigned long long)st.n_bytes, "send_errors", (unsigned long long)st.n_send_errors,
        "dropped", (unsigned long long)st.n_dropped, "replay_requests",
        (unsigned long long)st.n_replay_requests, "pending", (unsigned int)st.n_pending);
}

static PyObject *kve_pub_close(kve_pub *self, PyObject *unused)
{
    (void)unused;
    kvp_publisher *pub = self->pub;
    self->pub = NULL;
    Py_BEGIN_ALLOW_THREADS kvp_publisher_free(pub);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *kve_pub_enter(kve_pub *self, PyObject *unused)
{
    (void)unused;
    return Py_NewRef((PyObject *)self);
}

static PyObject *kve_pub_exit(kve_pub *self, PyObject *args)
{
    (void)args;
    return kve_pub_close(self, NULL);
}

static PyMethodDef kve_pub_methods[] = {
    {"stored", (PyCFunction)(void (*)(void))kve_pub_stored, METH_VARARGS | METH_KEYWORDS,
     "stored(block_hashes, token_ids, parent=None): queue one BlockStored chain."},
    {"removed", (PyCFunction)kve_pub_removed, METH_O, "removed(block_hashes): queue BlockRemoved."},
    {"cleared", (PyCFunction)kve_pub_cleared, METH_NOARGS, "cleared(): queue AllBlocksCleared."},
    {"flush", (PyCFunction)kve_pub_flush, METH_NOARGS,
     "flush(): publish the queued events as one batch (the next sequence number)."},
    {"endpoint", (PyCFunction)kve_pub_endpoint, METH_VARARGS,
     "endpoint(which=0): the PUB (0) or replay (1) endpoint in use (a wildcard port resolved)."},
    {"stats", (PyCFunction)kve_pub_stats, METH_NOARGS, "stats(): the publisher's counters."},
    {"close", (PyCFunction)kve_pub_close, METH_NOARGS,
     "close(): publish what is queued, close the sockets."},
    {"__enter__", (PyCFunction)kve_pub_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)kve_pub_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject kve_pub_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvprefix.Publisher",
    .tp_basicsize = sizeof(kve_pub),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Publisher(endpoint, replay_endpoint=None, topic='', dp_rank=0, "
              "buffer_steps=10000, hwm=100000, medium='GPU', form='array'): vLLM's KV-event "
              "protocol on a ZeroMQ PUB socket (bound when the endpoint has '*', connected "
              "otherwise), with a replay ROUTER served by a thread.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)kve_pub_init,
    .tp_dealloc = (destructor)kve_pub_dealloc,
    .tp_methods = kve_pub_methods,
};

static PyMethodDef kve_methods[] = {
    {"encode_batch", (PyCFunction)(void (*)(void))kve_encode_batch, METH_VARARGS | METH_KEYWORDS,
     "encode_batch(events, ts=None, dp_rank=None, form='array', batch_map=False) -> bytes: "
     "a vLLM KV-event batch payload (msgpack), the third frame of a message."},
    {"decode_batch", (PyCFunction)kve_decode_batch, METH_O,
     "decode_batch(payload) -> (ts, events, dp_rank): a payload in either vLLM encoding."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kve_module = {
    PyModuleDef_HEAD_INIT,
    "kvprefix._kvevents",
    "libkvprefix-events' vLLM KV-event codec and ZeroMQ publisher.",
    -1,
    kve_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__kvevents(void);

PyMODINIT_FUNC PyInit__kvevents(void)
{
    PyObject *m = PyModule_Create(&kve_module);
    if (m == NULL)
        return NULL;
    if (PyType_Ready(&kve_pub_type) < 0 ||
        PyModule_AddObjectRef(m, "Publisher", (PyObject *)&kve_pub_type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
