/*
 * _kvprefix.c - the CPython extension module behind the `kvprefix` Python package: Cache,
 * Namespace, Hasher, the Match/Stats/Event/Chain records, the exception hierarchy and the
 * key functions, over the public C API (kvprefix.h) only.
 *
 * Why the C API and not cffi: Debian 12 ships python3-dev and python3-mesonpy, so meson
 * builds this file like any other target and `pip install --no-build-isolation .` works
 * offline; the hot path (acquire + commit + release per request) costs a few argument
 * conversions instead of cffi's per-call marshalling, the GIL can be released around
 * exactly the library call, and the buffer protocol gives zero-copy access to array('I'),
 * numpy uint32 arrays and memoryviews. docs/python.md has the measured per-call overhead.
 *
 * Threading. The library is thread-safe (a reader/writer lock per cache: lookups in
 * parallel, mutations one at a time; include/kvprefix.h), so the binding adds no lock
 * around library calls: every call on a cache releases the GIL around the library call and
 * threads run their calls concurrently. One exception: request_blocks copies the library's
 * block table after kvp_request_blocks returns, and the table is freed by the next grow or
 * release of that request, so those calls and the copy share a small per-cache table lock
 * (taken without the GIL; nothing else waits inside it), lest a racing Python program read
 * freed memory. Nothing touches a Python object while the GIL is released:
 * token buffers stay exported (Py_buffer), namespaces are immutable, keys are converted
 * before. Lock order is GIL -> (released) -> the library's lock, and no Python code runs
 * under the library's lock, so the two cannot deadlock. Closing a cache while other
 * threads are inside calls on it is safe: each call counts itself in flight (under the
 * GIL) and the last one out frees a cache closed meanwhile. Cache(single_threaded=True)
 * makes the library skip its lock; the binding then keeps the GIL during each call, so the
 * GIL serialises them as the library requires.
 *
 * Events. The library calls its callback synchronously inside a mutating call, on the
 * calling thread, under the cache's exclusive lock and without the GIL, so the C callback
 * (event_collect) only appends the event to the batch of the call in progress, which a
 * thread-local pointer names: concurrent calls each collect their own events. With the
 * GIL back, the calling thread hands each event of its batch to the Python callable in
 * order. Events of different threads' calls are delivered by each thread; a callable
 * shared between threads sees each call's events in order, and the calls' batches in any
 * interleaving (each batch comes after its call's mutation, so possibly after later
 * mutations of other threads). An exception raised by the callable does not stop delivery
 * of the rest of the batch; after the last one the first exception is re-raised as
 * EventCallbackError (its __cause__ is the original and .result what the call returned,
 * since the call itself completed). The callable may call the cache again: no lock is held
 * during delivery.
 *
 * Hashers. Hasher wraps kvp_hasher (profiles, vLLM-exact digests); Cache.hasher() the
 * cache's own, reached through the cache's in-flight count like any call.
 *
 * Keys are Python ints of 128 bits: (hi << 64) | lo of kvp_key.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "structmember.h"

#include "kvprefix.h"

/* ---------------------------------------------------------------------------------------- */
/* Module globals (single-phase initialisation: one interpreter)                            */
/* ---------------------------------------------------------------------------------------- */

static PyObject *err_base;        /* KvprefixError */
static PyObject *err_callback;    /* EventCallbackError */
static PyObject *err_by_code[13]; /* index -code: the subclass for each KVP_E* code */
static PyTypeObject *match_type;  /* Match struct sequence */
static PyTypeObject *stats_type;  /* Stats struct sequence */
static PyTypeObject *event_type;  /* Event struct sequence */
static PyTypeObject *chain_type;  /* Chain struct sequence */
static PyObject *int_0;           /* the int 0 */
static PyObject *int_64;          /* the int 64 */
static PyObject *int_2_128;       /* the int 2**128 */

static const char *const code_names[13] = {
    "KVP_OK",     "KVP_EINVAL",    "KVP_ENOMEM", "KVP_ENOSPC", "KVP_ENOENT",
    "KVP_EEXIST", "KVP_EOVERFLOW", "KVP_ERANGE", "KVP_EBUSY",  "KVP_ECORRUPT",
    "KVP_ETOKEN", "KVP_ENOTSUP",   "KVP_ETOOBIG"};

/* ---------------------------------------------------------------------------------------- */
/* Errors                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Raise the exception for library code rc (< 0) returned by function fn, with .code and
 * .function set. Returns NULL so callers can `return raise_code(...)`. */
static PyObject *raise_code(int rc, const char *fn)
{
    PyObject *cls = (rc < 0 && rc > -13) ? err_by_code[-rc] : err_base;
    const char *name = (rc < 0 && rc > -13) ? code_names[-rc] : "unknown";
    PyObject *msg = PyUnicode_FromFormat("%s: %s (%s, %d)", fn, kvp_strerror(rc), name, rc);
    if (msg == NULL)
        return NULL;
    PyObject *exc = PyObject_CallOneArg(cls, msg);
    Py_DECREF(msg);
    if (exc == NULL)
        return NULL;
    PyObject *code = PyLong_FromLong(rc);
    PyObject *fname = PyUnicode_FromString(fn);
    if (code != NULL && fname != NULL && PyObject_SetAttrString(exc, "code", code) == 0 &&
        PyObject_SetAttrString(exc, "function", fname) == 0)
        PyErr_SetObject(cls, exc);
    Py_XDECREF(code);
    Py_XDECREF(fname);
    Py_DECREF(exc);
    return NULL;
}

/* Raise InvalidArgumentError (a ValueError) for a bad argument found by the binding. */
static void raise_invalid(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (msg == NULL)
        return;
    PyObject *exc = PyObject_CallOneArg(err_by_code[1], msg);
    Py_DECREF(msg);
    if (exc == NULL)
        return;
    PyObject *code = PyLong_FromLong(KVP_EINVAL);
    if (code != NULL && PyObject_SetAttrString(exc, "code", code) == 0 &&
        PyObject_SetAttrString(exc, "function", Py_None) == 0)
        PyErr_SetObject(err_by_code[1], exc);
    Py_XDECREF(code);
    Py_DECREF(exc);
}

/* ---------------------------------------------------------------------------------------- */
/* Argument conversion                                                                      */
/* ---------------------------------------------------------------------------------------- */

/* O& converter: a Python int in 0 .. 2**64 - 1 to uint64_t. */
static int conv_u64(PyObject *obj, void *out)
{
    PyObject *v = PyNumber_Index(obj);
    if (v == NULL)
        return 0;
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        raise_invalid("%R is not in 0 .. 2**64 - 1", obj);
        return 0;
    }
    *(uint64_t *)out = x;
    return 1;
}

/* O& converter: a non-negative Python int to size_t. */
static int conv_size(PyObject *obj, void *out)
{
    uint64_t x;
    if (!conv_u64(obj, &x))
        return 0;
    if (x > SIZE_MAX) {
        raise_invalid("%R is too large", obj);
        return 0;
    }
    *(size_t *)out = (size_t)x;
    return 1;
}

/* Tokens as the library sees them: borrowed from a buffer, or converted from a sequence. */
typedef struct tokens {
    Py_buffer view;      /* the exported buffer; valid when has_view */
    bool has_view;       /* a buffer is held (release it in tokens_done) */
    uint32_t *owned;     /* PyMem array converted from a sequence or an unaligned buffer */
    const uint32_t *ptr; /* the tokens: into view.buf or owned */
    size_t n;            /* how many */
} tokens;

/* True when a buffer format string names a native-size 32-bit unsigned integer. */
static bool format_is_u32(const char *f, Py_ssize_t itemsize)
{
    if (f == NULL)
        f = "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++; /* '<' is native: the module only builds on little-endian hosts (see init) */
    return itemsize == 4 && (strcmp(f, "I") == 0 || strcmp(f, "L") == 0);
}

/* Tokens from any 1-D C-contiguous buffer of uint32, without copying. Returns 0 or -1. */
static int tokens_from_buffer(PyObject *obj, tokens *t)
{
    if (PyObject_GetBuffer(obj, &t->view, PyBUF_RECORDS_RO) != 0) {
        PyErr_Clear();
        if (PyObject_GetBuffer(obj, &t->view, PyBUF_FULL_RO) != 0)
            return -1;
    }
    t->has_view = true;
    if (!format_is_u32(t->view.format, t->view.itemsize)) {
        PyErr_Format(PyExc_TypeError,
                     "tokens: a buffer of uint32 is needed (format 'I', itemsize 4), got "
                     "format '%s' with itemsize %zd",
                     t->view.format ? t->view.format : "B", t->view.itemsize);
        return -1;
    }
    if (t->view.ndim != 1) {
        PyErr_Format(PyExc_ValueError, "tokens: a 1-D buffer is needed, got %d dimensions",
                     t->view.ndim);
        return -1;
    }
    if (!PyBuffer_IsContiguous(&t->view, 'C')) {
        PyErr_SetString(PyExc_ValueError,
                        "tokens: the buffer is not contiguous (numpy: np.ascontiguousarray)");
        return -1;
    }
    t->n = (size_t)t->view.len / 4;
    if (((uintptr_t)t->view.buf & 3u) == 0) {
        t->ptr = t->view.buf;
        return 0;
    }
    t->owned = PyMem_Malloc(t->n * 4 + 4);
    if (t->owned == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(t->owned, t->view.buf, t->n * 4);
    t->ptr = t->owned;
    return 0;
}

/* Tokens from a sequence of ints, each checked to be in 0 .. 2**32 - 1. Returns 0 or -1. */
static int tokens_from_sequence(PyObject *obj, tokens *t)
{
    PyObject *seq = PySequence_Fast(obj, "tokens: a uint32 buffer or a sequence of ints");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    t->owned = PyMem_Malloc((size_t)n * 4 + 4);
    if (t->owned == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = items[i];
        int overflow = 0;
        long long v;
        if (PyLong_Check(it)) {
            v = PyLong_AsLongLongAndOverflow(it, &overflow);
        } else {
            PyObject *ix = PyNumber_Index(it);
            if (ix == NULL) {
                PyErr_Format(PyExc_TypeError, "tokens[%zd]: an int is needed, got %.80s", i,
                             Py_TYPE(it)->tp_name);
                Py_DECREF(seq);
                return -1;
            }
            v = PyLong_AsLongLongAndOverflow(ix, &overflow);
            Py_DECREF(ix);
        }
        if (overflow != 0 || v < 0 || v > 0xffffffffLL) {
            raise_invalid("tokens[%zd] = %R is not in 0 .. 2**32 - 1", i, it);
            Py_DECREF(seq);
            return -1;
        }
        t->owned[i] = (uint32_t)v;
    }
    Py_DECREF(seq);
    t->ptr = t->owned;
    t->n = (size_t)n;
    return 0;
}

/* Release what tokens_get took. Cannot fail. */
static void tokens_done(tokens *t)
{
    if (t->has_view)
        PyBuffer_Release(&t->view);
    PyMem_Free(t->owned);
    t->has_view = false;
    t->owned = NULL;
}

/* Fill *t from obj: a uint32 buffer (borrowed) or a sequence of ints (converted). Returns 0,
 * or -1 with an exception set (TypeError for a wrong type or dtype, InvalidArgumentError for
 * an out-of-range token) and nothing held. */
static int tokens_get(PyObject *obj, tokens *t)
{
    memset(t, 0, sizeof *t);
    int rc = PyObject_CheckBuffer(obj) ? tokens_from_buffer(obj, t) : tokens_from_sequence(obj, t);
    if (rc != 0)
        tokens_done(t);
    return rc;
}

/* A 128-bit key as a Python int. */
static PyObject *key_to_int(kvp_key k)
{
    PyObject *lo = PyLong_FromUnsignedLongLong(k.lo);
    if (k.hi == 0 || lo == NULL)
        return lo;
    PyObject *hi = PyLong_FromUnsignedLongLong(k.hi), *sh = NULL, *res = NULL;
    if (hi != NULL)
        sh = PyNumber_Lshift(hi, int_64);
    if (sh != NULL)
        res = PyNumber_Or(sh, lo);
    Py_XDECREF(hi);
    Py_XDECREF(sh);
    Py_DECREF(lo);
    return res;
}

/* A Python int in 0 .. 2**128 - 1 as a key. Returns 0, or -1 with an exception set. */
static int key_from_obj(PyObject *obj, kvp_key *out)
{
    PyObject *v = PyNumber_Index(obj);
    if (v == NULL)
        return -1;
    int neg = PyObject_RichCompareBool(v, int_0, Py_LT);
    int big = PyObject_RichCompareBool(v, int_2_128, Py_GE);
    if (neg != 0 || big != 0) {
        Py_DECREF(v);
        if (neg >= 0 && big >= 0)
            raise_invalid("key %R is not in 0 .. 2**128 - 1", obj);
        return -1;
    }
    PyObject *hi = PyNumber_Rshift(v, int_64);
    if (hi == NULL) {
        Py_DECREF(v);
        return -1;
    }
    out->lo = PyLong_AsUnsignedLongLongMask(v);
    out->hi = PyLong_AsUnsignedLongLongMask(hi);
    Py_DECREF(hi);
    Py_DECREF(v);
    return PyErr_Occurred() ? -1 : 0;
}

/* O& converter for keys (None means the zero key). */
static int conv_key(PyObject *obj, void *out)
{
    if (obj == Py_None) {
        memset(out, 0, sizeof(kvp_key));
        return 1;
    }
    return key_from_obj(obj, out) == 0;
}

/* Block ids for the _ids forms: a sequence of ints, or a buffer of uint64 pairs (lo, hi),
 * or raw bytes (16 per key). Always an owned array, so alignment never matters. */
typedef struct keylist {
    kvp_key *keys; /* PyMem array */
    size_t n;      /* how many */
} keylist;

static int keys_from_buffer(PyObject *obj, keylist *kl)
{
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_FULL_RO) != 0)
        return -1;
    const char *f = v.format ? v.format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    bool u64 = v.itemsize == 8 && (strcmp(f, "Q") == 0 || strcmp(f, "L") == 0);
    bool bytes = v.itemsize == 1 && (strcmp(f, "B") == 0 || strcmp(f, "c") == 0);
    int rc = -1;
    if (!u64 && !bytes)
        PyErr_Format(PyExc_TypeError,
                     "ids: a buffer of uint64 (lo, hi) pairs or of bytes is needed, got "
                     "format '%s' with itemsize %zd",
                     f, v.itemsize);
    else if (!PyBuffer_IsContiguous(&v, 'C'))
        PyErr_SetString(PyExc_ValueError, "ids: the buffer is not contiguous");
    else if (v.len % 16 != 0)
        raise_invalid("ids: %zd bytes is not a whole number of 16-byte keys", v.len);
    else if ((kl->keys = PyMem_Malloc((size_t)v.len + 16)) == NULL)
        PyErr_NoMemory();
    else {
        memcpy(kl->keys, v.buf, (size_t)v.len);
        kl->n = (size_t)v.len / 16;
        rc = 0;
    }
    PyBuffer_Release(&v);
    return rc;
}

static int keys_from_sequence(PyObject *obj, keylist *kl)
{
    PyObject *seq = PySequence_Fast(obj, "ids: a sequence of ints or a buffer");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    kl->keys = PyMem_Malloc((size_t)n * sizeof(kvp_key) + 16);
    if (kl->keys == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (key_from_obj(PySequence_Fast_GET_ITEM(seq, i), &kl->keys[i]) != 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    kl->n = (size_t)n;
    Py_DECREF(seq);
    return 0;
}

/* Fill *kl from obj. Returns 0, or -1 with an exception set and nothing held. */
static int keys_get(PyObject *obj, keylist *kl)
{
    kl->keys = NULL;
    kl->n = 0;
    int rc = PyObject_CheckBuffer(obj) ? keys_from_buffer(obj, kl) : keys_from_sequence(obj, kl);
    if (rc != 0) {
        PyMem_Free(kl->keys);
        kl->keys = NULL;
    }
    return rc;
}

/* A list of Python ints from n keys, or NULL with an exception set. */
static PyObject *keys_to_list(const kvp_key *keys, size_t n)
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *k = key_to_int(keys[i]);
        if (k == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, k);
    }
    return list;
}

/* A list of Python ints from n uint32 values, or NULL with an exception set. */
static PyObject *u32_to_list(const uint32_t *v, size_t n)
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *x = PyLong_FromUnsignedLong(v[i]);
        if (x == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, x);
    }
    return list;
}

/* ---------------------------------------------------------------------------------------- */
/* Namespace                                                                                */
/* ---------------------------------------------------------------------------------------- */

/* An immutable namespace: the four fields as given (str, bytes or None) and their bytes. */
typedef struct NamespaceObject {
    PyObject_HEAD PyObject
        *given[4];      /* model, adapter, tenant, salt as passed (str, bytes or None) */
    PyObject *bytes[4]; /* the same as bytes, or NULL when absent */
    kvp_namespace ns;   /* points into bytes[]; valid while the object lives */
    Py_hash_t hash;     /* cached hash, -1 until computed */
} NamespaceObject;

static PyTypeObject Namespace_Type;
static const char *const ns_field_names[4] = {"model", "adapter", "tenant", "salt"};

/* The bytes of one field value: str (UTF-8), a bytes-like object, or None (NULL, absent).
 * Returns 0 or -1 with an exception set. */
static int ns_field_bytes(PyObject *v, const char *name, PyObject **out)
{
    *out = NULL;
    if (v == Py_None)
        return 0;
    if (PyUnicode_Check(v))
        *out = PyUnicode_AsUTF8String(v);
    else if (PyObject_CheckBuffer(v))
        *out = PyBytes_FromObject(v);
    else
        PyErr_Format(PyExc_TypeError, "Namespace %s: str, bytes or None, got %.80s", name,
                     Py_TYPE(v)->tp_name);
    return *out == NULL ? -1 : 0;
}

static PyObject *Namespace_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"model", "adapter", "tenant", "salt", NULL};
    PyObject *given[4] = {Py_None, Py_None, Py_None, Py_None};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOOO:Namespace", kwlist, &given[0], &given[1],
                                     &given[2], &given[3]))
        return NULL;
    NamespaceObject *self = (NamespaceObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->hash = -1;
    kvp_namespace_init(&self->ns);
    kvp_field *fields[4] = {&self->ns.model, &self->ns.adapter, &self->ns.tenant, &self->ns.salt};
    for (int i = 0; i < 4; i++) {
        self->given[i] = Py_NewRef(given[i]);
        if (ns_field_bytes(given[i], ns_field_names[i], &self->bytes[i]) != 0) {
            Py_DECREF(self);
            return NULL;
        }
        if (self->bytes[i] != NULL) {
            fields[i]->ptr = PyBytes_AS_STRING(self->bytes[i]);
            fields[i]->len = (size_t)PyBytes_GET_SIZE(self->bytes[i]);
        }
    }
    return (PyObject *)self;
}

static void Namespace_dealloc(NamespaceObject *self)
{
    for (int i = 0; i < 4; i++) {
        Py_XDECREF(self->given[i]);
        Py_XDECREF(self->bytes[i]);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Namespace_repr(NamespaceObject *self)
{
    return PyUnicode_FromFormat("Namespace(model=%R, adapter=%R, tenant=%R, salt=%R)",
                                self->given[0], self->given[1], self->given[2], self->given[3]);
}

/* A tuple of the four bytes-or-None fields: what equality and hashing compare. */
static PyObject *ns_identity(NamespaceObject *self)
{
    PyObject *t = PyTuple_New(4);
    for (int i = 0; t != NULL && i < 4; i++)
        PyTuple_SET_ITEM(t, i, Py_NewRef(self->bytes[i] ? self->bytes[i] : Py_None));
    return t;
}

static Py_hash_t Namespace_hash(NamespaceObject *self)
{
    if (self->hash != -1)
        return self->hash;
    PyObject *t = ns_identity(self);
    if (t == NULL)
        return -1;
    self->hash = PyObject_Hash(t);
    Py_DECREF(t);
    return self->hash;
}

static PyObject *Namespace_richcompare(PyObject *a, PyObject *b, int op)
{
    if (!PyObject_TypeCheck(b, &Namespace_Type) || (op != Py_EQ && op != Py_NE))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *ta = ns_identity((NamespaceObject *)a), *tb = ns_identity((NamespaceObject *)b);
    PyObject *res = (ta && tb) ? PyObject_RichCompare(ta, tb, op) : NULL;
    Py_XDECREF(ta);
    Py_XDECREF(tb);
    return res;
}

static PyObject *Namespace_get(NamespaceObject *self, void *closure)
{
    return Py_NewRef(self->given[(intptr_t)closure]);
}

static PyObject *Namespace_key(NamespaceObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"seed", NULL};
    uint64_t seed = KVP_DEFAULT_SEED;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O&:key", kwlist, conv_u64, &seed))
        return NULL;
    kvp_key k;
    int rc = kvp_namespace_key(seed, &self->ns, &k);
    return rc == KVP_OK ? key_to_int(k) : raise_code(rc, "kvp_namespace_key");
}

static PyGetSetDef Namespace_getset[] = {
    {"model", (getter)Namespace_get, NULL, "Base model name or revision, or None.", (void *)0},
    {"adapter", (getter)Namespace_get, NULL, "Adapter (LoRA) id, or None.", (void *)1},
    {"tenant", (getter)Namespace_get, NULL, "Tenant isolation domain, or None.", (void *)2},
    {"salt", (getter)Namespace_get, NULL, "Per-request cache salt, or None.", (void *)3},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Namespace_methods[] = {
    {"key", (PyCFunction)(void (*)(void))Namespace_key, METH_VARARGS | METH_KEYWORDS,
     "key(seed=0) -> int\n\nThe 128-bit namespace root key (kvp_namespace_key)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Namespace_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvprefix.Namespace",
    .tp_basicsize = sizeof(NamespaceObject),
    .tp_dealloc = (destructor)Namespace_dealloc,
    .tp_repr = (reprfunc)Namespace_repr,
    .tp_hash = (hashfunc)Namespace_hash,
    .tp_richcompare = Namespace_richcompare,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Namespace(model=None, adapter=None, tenant=None, salt=None)\n\n"
              "Who a request belongs to: two requests share cached blocks only when all four\n"
              "fields are equal. Each field is a str (UTF-8), bytes, or None (absent, which\n"
              "differs from every present value, the empty one included). Immutable and\n"
              "hashable.",
    .tp_methods = Namespace_methods,
    .tp_getset = Namespace_getset,
    .tp_new = Namespace_new,
};

/* The kvp_namespace of a Namespace argument (None: every field absent). Returns NULL with
 * TypeError set for anything else. */
static const kvp_namespace *ns_arg(PyObject *obj)
{
    static kvp_namespace empty; /* zero-initialised: every field absent */
    if (obj == Py_None)
        return &empty;
    if (!PyObject_TypeCheck(obj, &Namespace_Type)) {
        PyErr_Format(PyExc_TypeError, "ns: a kvprefix.Namespace or None, got %.80s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return &((NamespaceObject *)obj)->ns;
}

/* ---------------------------------------------------------------------------------------- */
/* Cache: state, locking and event delivery                                                 */
/* ---------------------------------------------------------------------------------------- */

/* Events collected during library calls, not yet handed to Python. */
typedef struct evbatch {
    kvp_event *ev; /* PyMem_Raw array (filled without the GIL) */
    size_t n;      /* events in it */
    size_t cap;    /* its capacity */
    size_t n_lost; /* events dropped because the array could not grow */
} evbatch;

typedef struct CacheObject {
    PyObject_HEAD kvp_cache *cache; /* NULL once closed; read and written with the GIL */
    kvp_cache *doomed;              /* closed while calls were in flight: freed by the last */
    Py_ssize_t n_inflight;          /* calls (and cache hashers) using cache now; GIL */
    PyThread_type_lock table_lock;  /* orders request_blocks' copy against grow/release */
    PyObject *on_event;             /* the Python callable, or NULL */
    uint32_t n_blocks;              /* configuration, immutable */
    uint32_t block_size;            /* tokens per block */
    uint64_t seed;                  /* xxh3 hash seed */
    bool verify_tokens;             /* collision-proof mode */
    bool single_threaded;           /* no library lock: calls keep the GIL (see the top) */
    int hash_profile;               /* KVP_HASH_* */
    uint32_t vocab_size;            /* token ids must be below it; 0 = unchecked */
    uint32_t ns_quota;              /* default per-namespace quota; 0 = quotas off */
} CacheObject;

/* The event batch of the library call this thread is making (NULL between calls). The
 * library runs a callback on the thread whose call caused it, so a thread-local pointer
 * gives every call its own batch, however many threads call one cache at once. */
static _Thread_local evbatch *tls_events;

/* The library's event callback: runs inside a library call, under the cache's exclusive
 * lock and without the GIL, so it only records the event in the calling thread's batch.
 * Cannot fail (a failed growth counts a lost event, reported after the call). */
static void event_collect(void *ud, const kvp_event *ev)
{
    evbatch *b = tls_events;
    (void)ud;
    if (b == NULL)
        return; /* not reached: every call on a cache with a callback sets the batch */
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        kvp_event *p = PyMem_RawRealloc(b->ev, cap * sizeof *p);
        if (p == NULL) {
            b->n_lost++;
            return;
        }
        b->ev = p;
        b->cap = cap;
    }
    b->ev[b->n++] = *ev;
}

/* The block table lock, taken without the GIL (see request_blocks_copy_nogil); a
 * single-threaded cache's calls keep the GIL, which orders them already. Cannot fail. */
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

/* Start a call on self's cache (GIL held): the cache, counted in flight so that close()
 * cannot free it under the call, or NULL when it is closed. Cannot fail otherwise. */
static kvp_cache *cache_enter(CacheObject *self)
{
    if (self->cache != NULL)
        self->n_inflight++;
    return self->cache;
}

/* End a call started by cache_enter (GIL held); the last call out frees a cache closed
 * meanwhile. Cannot fail. */
static void cache_leave(CacheObject *self)
{
    if (--self->n_inflight == 0 && self->doomed != NULL) {
        kvp_cache *c = self->doomed;
        self->doomed = NULL;
        kvp_cache_free(c);
    }
}

static PyObject *raise_closed(void)
{
    PyErr_SetString(PyExc_ValueError, "the cache is closed");
    return NULL;
}

/* A Python Event from a kvp_event, or NULL with an exception set. */
static PyObject *event_to_py(const kvp_event *e)
{
    PyObject *o = PyStructSequence_New(event_type);
    if (o == NULL)
        return NULL;
    PyObject *v[7] = {PyLong_FromLong(e->type),
                      PyLong_FromLong(e->reason),
                      PyLong_FromUnsignedLong(e->block_id),
                      PyLong_FromUnsignedLong(e->n_tokens),
                      key_to_int(e->key),
                      key_to_int(e->parent),
                      PyBool_FromLong(e->parent_is_root)};
    bool ok = true;
    for (int i = 0; i < 7; i++) {
        if (v[i] == NULL)
            ok = false;
        PyStructSequence_SET_ITEM(o, i, v[i] ? v[i] : Py_NewRef(Py_None));
    }
    if (!ok)
        Py_CLEAR(o);
    return o;
}

/* The pending exception as one object (normalised, traceback attached), or NULL; clears
 * it. The Python 3.11 spelling of 3.12's PyErr_GetRaisedException. */
static PyObject *exc_fetch(void)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    if (t == NULL)
        return NULL;
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb != NULL && v != NULL)
        PyException_SetTraceback(v, tb);
    Py_XDECREF(t);
    Py_XDECREF(tb);
    return v;
}

/* Make v (stolen; NULL: nothing) the pending exception again. */
static void exc_restore(PyObject *v)
{
    if (v == NULL)
        return;
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(v)), v, PyException_GetTraceback(v));
}

/* Hand batch b to the callable, in order, then free it. result is what the call returns
 * (a new reference, stolen; NULL when the call failed with an exception already set).
 * Returns result, or NULL with EventCallbackError set when the callable raised (the first
 * exception is its __cause__; .result holds result). */
static PyObject *events_deliver(CacheObject *self, evbatch *b, PyObject *result)
{
    if (b->n == 0 && b->n_lost == 0) {
        PyMem_RawFree(b->ev);
        return result;
    }
    PyObject *saved = exc_fetch(); /* the call's own error, if any */
    PyObject *first = NULL;
    for (size_t i = 0; i < b->n && self->on_event != NULL; i++) {
        PyObject *ev = event_to_py(&b->ev[i]);
        PyObject *r = ev ? PyObject_CallOneArg(self->on_event, ev) : NULL;
        Py_XDECREF(ev);
        if (r == NULL) {
            PyObject *exc = exc_fetch();
            if (first == NULL)
                first = exc;
            else
                Py_XDECREF(exc);
        }
        Py_XDECREF(r);
    }
    size_t n_lost = b->n_lost;
    PyMem_RawFree(b->ev);
    if (first == NULL && n_lost == 0) {
        exc_restore(saved);
        return result;
    }
    if (saved != NULL) { /* the call failed too: its error wins, the callback's is its cause */
        PyException_SetCause(saved, first);
        exc_restore(saved);
        Py_XDECREF(result);
        return NULL;
    }
    PyObject *msg = first ? PyUnicode_FromFormat("the on_event callback raised %R", first)
                          : PyUnicode_FromFormat("%zu events lost: out of memory", n_lost);
    PyObject *exc = msg ? PyObject_CallOneArg(err_callback, msg) : NULL;
    Py_XDECREF(msg);
    if (exc != NULL) {
        PyObject *code = PyLong_FromLong(first ? KVP_OK : KVP_ENOMEM);
        if (code != NULL) {
            PyObject_SetAttrString(exc, "code", code);
            PyObject_SetAttrString(exc, "function", Py_None);
            PyObject_SetAttrString(exc, "result", result ? result : Py_None);
            Py_DECREF(code);
        }
        if (first != NULL)
            PyException_SetCause(exc, first); /* steals first */
        PyErr_SetObject(err_callback, exc);
        Py_DECREF(exc);
    } else {
        Py_XDECREF(first);
    }
    Py_XDECREF(result);
    return NULL;
}

/* The result of a library call: rc, the events it produced, and
 * result (new reference, stolen; used when rc is KVP_OK). Raises for rc < 0 or a closed
 * cache (rc == 1). */
static PyObject *finish(CacheObject *self, int rc, const char *fn, evbatch *b, PyObject *result)
{
    if (rc != KVP_OK) {
        Py_XDECREF(result);
        result = NULL;
        if (rc == 1)
            raise_closed();
        else
            raise_code(rc, fn);
    }
    return events_deliver(self, b, result);
}

/* A Match from a kvp_match; block_ids is stolen (NULL means None). */
static PyObject *match_to_py(const kvp_match *m, PyObject *block_ids)
{
    PyObject *o = PyStructSequence_New(match_type);
    if (o == NULL) {
        Py_XDECREF(block_ids);
        return NULL;
    }
    PyObject *v[5] = {
        PyLong_FromUnsignedLongLong(m->n_tokens), PyLong_FromUnsignedLong(m->n_blocks_full),
        PyLong_FromUnsignedLong(m->n_blocks_cached), PyLong_FromUnsignedLong(m->n_blocks_hit),
        PyLong_FromUnsignedLongLong(m->n_tokens_hit)};
    bool ok = true;
    for (int i = 0; i < 5; i++) {
        ok = ok && v[i] != NULL;
        PyStructSequence_SET_ITEM(o, i, v[i] ? v[i] : Py_NewRef(Py_None));
    }
    PyStructSequence_SET_ITEM(o, 5, block_ids ? block_ids : Py_NewRef(Py_None));
    PyObject *stored = PyLong_FromUnsignedLong(m->n_blocks_stored);
    ok = ok && stored != NULL;
    PyStructSequence_SET_ITEM(o, 6, stored ? stored : Py_NewRef(Py_None));
    if (!ok)
        Py_CLEAR(o);
    return o;
}

/* Run STMT, a library call on kc that assigns rc, with the GIL released (kept when the
 * cache is single-threaded: the GIL then serialises calls, as the library requires), and
 * collect the events it produced into b. rc becomes 1 when the cache is closed. STMT must
 * not touch Python objects. */
#define CALL(self, b, rc, STMT)                                                                    \
    do {                                                                                           \
        kvp_cache *const kc = cache_enter(self);                                                   \
        memset(&(b), 0, sizeof(b));                                                                \
        if (kc == NULL) {                                                                          \
            (rc) = 1;                                                                              \
            break;                                                                                 \
        }                                                                                          \
        PyThreadState *ts_ = (self)->single_threaded ? NULL : PyEval_SaveThread();                 \
        tls_events = &(b);                                                                         \
        STMT;                                                                                      \
        tls_events = NULL;                                                                         \
        if (ts_ != NULL)                                                                           \
            PyEval_RestoreThread(ts_);                                                             \
        cache_leave(self);                                                                         \
    } while (0)

/* ---------------------------------------------------------------------------------------- */
/* Cache: construction and lifetime                                                         */
/* ---------------------------------------------------------------------------------------- */

static PyTypeObject Cache_Type;

/* Overwrite a secret key's copy on the stack (a volatile store the compiler keeps). */
static void wipe(void *p, size_t n)
{
    volatile unsigned char *v = p;
    while (n-- > 0)
        *v++ = 0;
}

/* O& converter: a hash profile given by name ("keyed", "xxh3", "siphash",
 * "vllm-sha256-cbor", "vllm-xxhash-cbor") or as a HASH_* int, checked by name only (the
 * library checks ints: KVP_EINVAL). */
static int conv_profile(PyObject *obj, void *out)
{
    if (PyUnicode_Check(obj)) {
        const char *name = PyUnicode_AsUTF8(obj);
        if (name == NULL)
            return 0;
        if (kvp_hash_profile_parse(name, (int *)out) != KVP_OK) {
            raise_invalid("unknown hash profile %R (keyed, xxh3, siphash, vllm-sha256-cbor, "
                          "vllm-xxhash-cbor)",
                          obj);
            return 0;
        }
        return 1;
    }
    long v = PyLong_AsLong(obj);
    if (v == -1 && PyErr_Occurred())
        return 0;
    *(int *)out = (v < 0 || v > INT32_MAX) ? 0 : (int)v;
    return 1;
}

/* The hash fields of *cfg from Python values: key (bytes-like or None: a random key) and
 * vllm_seed (str or None: vLLM's default); the string stays owned by vllm_seed, which the
 * caller keeps alive until the config is used. Returns 0, or -1 with an exception set. */
static int hash_cfg_fill(kvp_config *cfg, PyObject *key, PyObject *vllm_seed)
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
            raise_invalid("hash_key: %u to %u bytes are needed", KVP_HASH_KEY_MIN,
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
                PyErr_SetString(PyExc_TypeError, "vllm_seed: a str or None");
            return -1;
        }
        if (strlen(str) != (size_t)n) {
            raise_invalid("vllm_seed contains a NUL character");
            return -1;
        }
        cfg->vllm_seed = str;
    }
    return 0;
}

static PyObject *Cache_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {
        "n_blocks", "block_size", "seed",       "verify_tokens", "on_event",        "hash_profile",
        "hash_key", "vllm_seed",  "vocab_size", "ns_quota",      "single_threaded", NULL};
    uint64_t n_blocks = 0, block_size = 16, seed = KVP_DEFAULT_SEED, vocab = 0, quota = 0;
    int verify = 0, single = 0, profile = KVP_HASH_KEYED;
    PyObject *on_event = Py_None, *key = Py_None, *vseed = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O&$O&pOO&OOO&O&p:Cache", kwlist, conv_u64,
                                     &n_blocks, conv_u64, &block_size, conv_u64, &seed, &verify,
                                     &on_event, conv_profile, &profile, &key, &vseed, conv_u64,
                                     &vocab, conv_u64, &quota, &single))
        return NULL;
    if (on_event != Py_None && !PyCallable_Check(on_event)) {
        PyErr_SetString(PyExc_TypeError, "on_event: a callable or None");
        return NULL;
    }
    if (n_blocks > UINT32_MAX || block_size > UINT32_MAX || vocab > UINT32_MAX ||
        quota > UINT32_MAX) {
        raise_invalid("n_blocks, block_size, vocab_size and ns_quota must fit in 32 bits");
        return NULL;
    }
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = (uint32_t)n_blocks;
    cfg.block_size = (uint32_t)block_size;
    cfg.seed = seed;
    cfg.verify_tokens = verify != 0;
    cfg.hash_profile = profile;
    cfg.vocab_size = (uint32_t)vocab;
    cfg.ns_quota = (uint32_t)quota;
    cfg.single_threaded = single != 0;
    if (hash_cfg_fill(&cfg, key, vseed) != 0)
        return NULL;
    CacheObject *self = (CacheObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if ((self->table_lock = PyThread_allocate_lock()) == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    if (on_event != Py_None) {
        self->on_event = Py_NewRef(on_event);
        cfg.on_event = event_collect;
        cfg.event_ud = self;
    }
    int rc = kvp_cache_new(&cfg, &self->cache);
    wipe(cfg.hash_key, sizeof cfg.hash_key);
    if (rc != KVP_OK) {
        Py_DECREF(self);
        return raise_code(rc, "kvp_cache_new");
    }
    self->n_blocks = cfg.n_blocks;
    self->block_size = cfg.block_size;
    self->seed = seed;
    self->verify_tokens = cfg.verify_tokens;
    self->single_threaded = cfg.single_threaded;
    self->hash_profile = cfg.hash_profile;
    self->vocab_size = cfg.vocab_size;
    self->ns_quota = cfg.ns_quota;
    return (PyObject *)self;
}

static int Cache_traverse(CacheObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->on_event);
    return 0;
}

static int Cache_clear(CacheObject *self)
{
    Py_CLEAR(self->on_event);
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

static PyObject *Cache_exit(CacheObject *self, PyObject *args)
{
    return Cache_close(self, NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* Cache: lookups and the request lifecycle                                                 */
/* ---------------------------------------------------------------------------------------- */

static PyObject *Cache_lookup(CacheObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ns", "tokens", NULL};
    PyObject *ns_obj, *tok_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:lookup", kwlist, &ns_obj, &tok_obj))
        return NULL;
    const kvp_namespace *ns = ns_arg(ns_obj);
    tokens t;
    if (ns == NULL || tokens_get(tok_obj, &t) != 0)
        return NULL;
    size_t cap = t.n / self->block_size;
    uint32_t *ids = PyMem_Malloc(cap * sizeof *ids + 4);
    if (ids == NULL) {
        tokens_done(&t);
        return PyErr_NoMemory();
    }
    kvp_match m;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = kvp_lookup(kc, ns, t.ptr, t.n, ids, cap, &m));
    tokens_done(&t);
    PyObject *res = NULL;
    if (rc == KVP_OK) {
        size_t n = m.n_blocks_hit < cap ? m.n_blocks_hit : cap;
        PyObject *list = u32_to_list(ids, n);
        res = list ? match_to_py(&m, list) : NULL;
        if (res == NULL)
            rc = 2; /* the exception is set; still deliver events */
    }
    PyMem_Free(ids);
    return rc == 2 ? events_deliver(self, &b, NULL) : finish(self, rc, "kvp_lookup", &b, res);
}

static PyObject *Cache_acquire(CacheObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"req_id", "ns", "tokens", "capacity", NULL};
    uint64_t req_id;
    size_t capacity = 0;
    PyObject *ns_obj, *tok_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&OO|O&:acquire", kwlist, conv_u64, &req_id,
                                     &ns_obj, &tok_obj, conv_size, &capacity))
        return NULL;
    const kvp_namespace *ns = ns_arg(ns_obj);
    tokens t;
    if (ns == NULL || tokens_get(tok_obj, &t) != 0)
        return NULL;
    kvp_match m;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = kvp_acquire(kc, req_id, ns, t.ptr, t.n, capacity, &m));
    tokens_done(&t);
    return finish(self, rc, "kvp_acquire", &b, rc == KVP_OK ? match_to_py(&m, NULL) : NULL);
}

static PyObject *Cache_grow(CacheObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"req_id", "capacity", NULL};
    uint64_t req_id;
    size_t capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&:grow", kwlist, conv_u64, &req_id, conv_size,
                                     &capacity))
        return NULL;
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
static int request_blocks_copy_nogil(CacheObject *self, kvp_cache *kc, uint64_t req_id,
                                     uint32_t **copy, size_t *n)
{
    const uint32_t *ids;
    table_lock(self);
    int rc = kvp_request_blocks(kc, req_id, &ids, n);
    if (rc == KVP_OK && (*copy = PyMem_RawMalloc(*n * sizeof **copy + 4)) != NULL)
        memcpy(*copy, ids, *n * sizeof **copy);
    table_unlock(self);
    return rc;
}

static PyObject *Cache_request_blocks(CacheObject *self, PyObject *arg)
{
    uint64_t req_id;
    if (!conv_u64(arg, &req_id))
        return NULL;
    uint32_t *copy = NULL;
    size_t n = 0;
    evbatch b;
    int rc = 0;
    /* The list is built after the copy, with the GIL. */
    CALL(self, b, rc, rc = request_blocks_copy_nogil(self, kc, req_id, &copy, &n));
    PyObject *list = NULL;
    if (rc == KVP_OK)
        list = copy ? u32_to_list(copy, n) : PyErr_NoMemory();
    PyMem_RawFree(copy);
    if (rc == KVP_OK && list == NULL)
        return events_deliver(self, &b, NULL);
    return finish(self, rc, "kvp_request_blocks", &b, list);
}

static PyObject *Cache_commit(CacheObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"req_id", "tokens", NULL};
    uint64_t req_id;
    PyObject *tok_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O:commit", kwlist, conv_u64, &req_id, &tok_obj))
        return NULL;
    tokens t;
    if (tokens_get(tok_obj, &t) != 0)
        return NULL;
    size_t n_stored = 0;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = kvp_commit(kc, req_id, t.ptr, t.n, &n_stored));
    tokens_done(&t);
    return finish(self, rc, "kvp_commit", &b, rc == KVP_OK ? PyLong_FromSize_t(n_stored) : NULL);
}

static PyObject *Cache_release(CacheObject *self, PyObject *arg)
{
    uint64_t req_id;
    if (!conv_u64(arg, &req_id))
        return NULL;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, (table_lock(self), rc = kvp_release(kc, req_id), table_unlock(self)));
    return finish(self, rc, "kvp_release", &b, Py_NewRef(Py_None));
}

static PyObject *Cache_access(CacheObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ns", "tokens", NULL};
    PyObject *ns_obj, *tok_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:access", kwlist, &ns_obj, &tok_obj))
        return NULL;
    const kvp_namespace *ns = ns_arg(ns_obj);
    tokens t;
    if (ns == NULL || tokens_get(tok_obj, &t) != 0)
        return NULL;
    kvp_match m;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = kvp_access(kc, ns, t.ptr, t.n, &m));
    tokens_done(&t);
    return finish(self, rc, "kvp_access", &b, rc == KVP_OK ? match_to_py(&m, NULL) : NULL);
}

/* Shared by lookup_ids (lookup true) and access_ids. */
static PyObject *ids_call(CacheObject *self, PyObject *args, PyObject *kw, bool lookup)
{
    static char *kwlist[] = {"ns", "ids", "n_tokens", NULL};
    PyObject *ns_obj, *ids_obj, *nt_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, lookup ? "OO|O:lookup_ids" : "OO|O:access_ids",
                                     kwlist, &ns_obj, &ids_obj, &nt_obj))
        return NULL;
    const kvp_namespace *ns = ns_arg(ns_obj);
    keylist kl;
    if (ns == NULL || keys_get(ids_obj, &kl) != 0)
        return NULL;
    size_t n_tokens = kl.n * self->block_size;
    uint32_t *ids = lookup ? PyMem_Malloc(kl.n * sizeof *ids + 4) : NULL;
    if ((nt_obj != Py_None && !conv_size(nt_obj, &n_tokens)) || (lookup && ids == NULL)) {
        if (lookup && ids == NULL && !PyErr_Occurred())
            PyErr_NoMemory();
        PyMem_Free(kl.keys);
        PyMem_Free(ids);
        return NULL;
    }
    kvp_match m;
    evbatch b;
    int rc = 0;
    if (lookup)
        CALL(self, b, rc, rc = kvp_lookup_ids(kc, ns, kl.keys, kl.n, n_tokens, ids, kl.n, &m));
    else
        CALL(self, b, rc, rc = kvp_access_ids(kc, ns, kl.keys, kl.n, n_tokens, &m));
    PyMem_Free(kl.keys);
    PyObject *res = NULL;
    if (rc == KVP_OK) {
        PyObject *list = lookup ? u32_to_list(ids, m.n_blocks_hit) : NULL;
        res = (!lookup || list) ? match_to_py(&m, list) : NULL;
    }
    PyMem_Free(ids);
    if (rc == KVP_OK && res == NULL)
        return events_deliver(self, &b, NULL);
    return finish(self, rc, lookup ? "kvp_lookup_ids" : "kvp_access_ids", &b, res);
}

static PyObject *Cache_lookup_ids(CacheObject *self, PyObject *args, PyObject *kw)
{
    return ids_call(self, args, kw, true);
}

static PyObject *Cache_access_ids(CacheObject *self, PyObject *args, PyObject *kw)
{
    return ids_call(self, args, kw, false);
}

/* ---------------------------------------------------------------------------------------- */
/* Cache: maintenance, statistics, metrics, keys                                            */
/* ---------------------------------------------------------------------------------------- */

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

static PyObject *stats_to_py(const kvp_stats *s)
{
    PyObject *o = PyStructSequence_New(stats_type);
    if (o == NULL)
        return NULL;
    const unsigned long long v[15] = {
        s->n_requests,      s->n_lookups,        s->n_tokens_queried, s->n_tokens_hit,
        s->n_blocks_hit,    s->n_blocks_missed,  s->n_blocks_stored,  s->n_blocks_deduped,
        s->n_evictions,     s->n_verify_rejects, s->n_blocks_total,   s->n_blocks_free,
        s->n_blocks_cached, s->n_blocks_in_use,  s->n_requests_active};
    for (int i = 0; i < 15; i++) {
        PyObject *x = PyLong_FromUnsignedLongLong(v[i]);
        if (x == NULL) {
            Py_DECREF(o);
            return NULL;
        }
        PyStructSequence_SET_ITEM(o, i, x);
    }
    return o;
}

static PyObject *Cache_stats(CacheObject *self, PyObject *unused)
{
    kvp_stats s;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = kvp_cache_stats(kc, &s));
    return finish(self, rc, "kvp_cache_stats", &b, rc == KVP_OK ? stats_to_py(&s) : NULL);
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
            PyErr_SetString(PyExc_TypeError, "labels: a dict of str to str, or (str, str) pairs");
            goto fail;
        }
        if ((l[i].name = PyUnicode_AsUTF8AndSize(k, &nk)) == NULL ||
            (l[i].value = PyUnicode_AsUTF8AndSize(v, &nv)) == NULL)
            goto fail;
        if (strlen(l[i].name) != (size_t)nk || strlen(l[i].value) != (size_t)nv) {
            raise_invalid("labels: %R contains a NUL character", pair);
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

static PyObject *Cache_metrics(CacheObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"labels", NULL};
    PyObject *lab_obj = Py_None, *keep;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:metrics", kwlist, &lab_obj))
        return NULL;
    size_t n_l;
    kvp_label *l = labels_get(lab_obj, &n_l, &keep);
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
        return events_deliver(self, &b, NULL);
    return finish(self, rc, "kvp_cache_metrics", &b, res);
}

/* kvp_hash_blocks without the GIL into a new list of ints. */
static PyObject *hash_blocks_list(uint64_t seed, kvp_key parent, PyObject *tok_obj,
                                  uint64_t block_size)
{
    if (block_size == 0 || block_size > KVP_MAX_BLOCK_SIZE)
        return raise_code(KVP_EINVAL, "kvp_hash_blocks");
    tokens t;
    if (tokens_get(tok_obj, &t) != 0)
        return NULL;
    size_t cap = t.n / block_size, n = 0;
    kvp_key *keys = PyMem_RawMalloc(cap * sizeof *keys + sizeof *keys);
    if (keys == NULL) {
        tokens_done(&t);
        return PyErr_NoMemory();
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS rc =
        kvp_hash_blocks(seed, parent, t.ptr, t.n, (uint32_t)block_size, keys, cap, &n);
    Py_END_ALLOW_THREADS tokens_done(&t);
    PyObject *res = rc == KVP_OK ? keys_to_list(keys, n) : raise_code(rc, "kvp_hash_blocks");
    PyMem_RawFree(keys);
    return res;
}

/* kvp_cache_keys for ns and t into *root and a new PyMem_Raw array *keys of *n keys
 * (keys may be NULL when want_keys is false). The call takes no lock, so the GIL is released
 * even on a single-threaded cache. Returns the library's code, 1 when the cache is closed,
 * or KVP_ENOMEM (no exception set in any case). */
static int cache_keys_nogil(CacheObject *self, const kvp_namespace *ns, const tokens *t,
                            bool want_keys, kvp_key *root, kvp_key **keys, size_t *n)
{
    static const uint32_t none[1] = {0};
    size_t cap = want_keys ? t->n / self->block_size : 0;
    *keys = PyMem_RawMalloc(cap * sizeof **keys + sizeof **keys);
    *n = 0;
    if (*keys == NULL)
        return KVP_ENOMEM;
    kvp_cache *kc = cache_enter(self);
    if (kc == NULL)
        return 1;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc =
        kvp_cache_keys(kc, ns, t->n ? t->ptr : none, t->n, root, *keys, cap, n);
    Py_END_ALLOW_THREADS cache_leave(self);
    return rc;
}

/* Raise for a non-OK code of cache_keys_nogil. Returns NULL. */
static PyObject *raise_keys(int rc)
{
    if (rc == 1)
        return raise_closed();
    if (rc == KVP_ENOMEM)
        return PyErr_NoMemory();
    return raise_code(rc, "kvp_cache_keys");
}

static PyObject *Cache_keys(CacheObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ns", "tokens", "raw", NULL};
    PyObject *ns_obj, *tok_obj;
    int raw = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$p:keys", kwlist, &ns_obj, &tok_obj, &raw))
        return NULL;
    const kvp_namespace *ns = ns_arg(ns_obj);
    tokens t;
    if (ns == NULL || tokens_get(tok_obj, &t) != 0)
        return NULL;
    kvp_key root, *keys;
    size_t n;
    int rc = cache_keys_nogil(self, ns, &t, true, &root, &keys, &n);
    tokens_done(&t);
    PyObject *res = NULL;
    if (rc != KVP_OK)
        raise_keys(rc);
    else if (raw)
        res = Py_BuildValue("(Ny#)", key_to_int(root), (const char *)keys,
                            (Py_ssize_t)(n * sizeof *keys));
    else
        res = Py_BuildValue("(NN)", key_to_int(root), keys_to_list(keys, n));
    PyMem_RawFree(keys);
    return res;
}

static PyObject *Cache_hash_blocks(CacheObject *self, PyObject *args, PyObject *kw)
{
    PyObject *pair = Cache_keys(self, args, kw);
    if (pair == NULL)
        return NULL;
    PyObject *keys = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
    Py_DECREF(pair);
    return keys;
}

static PyObject *Cache_namespace_key(CacheObject *self, PyObject *ns_obj)
{
    const kvp_namespace *ns = ns_arg(ns_obj);
    if (ns == NULL)
        return NULL;
    tokens t;
    memset(&t, 0, sizeof t);
    kvp_key root, *keys;
    size_t n;
    int rc = cache_keys_nogil(self, ns, &t, false, &root, &keys, &n);
    PyMem_RawFree(keys);
    return rc == KVP_OK ? key_to_int(root) : raise_keys(rc);
}

/* The converted arguments of a *_keys call. */
typedef struct keyargs {
    keylist kl;      /* the block keys (kl.keys NULL when None was given) */
    tokens t;        /* the tokens, when has_tokens */
    bool has_tokens; /* tokens were given */
    size_t n_tokens; /* prompt length the keys cover */
} keyargs;

static void keyargs_done(keyargs *a)
{
    PyMem_Free(a->kl.keys);
    a->kl.keys = NULL;
    if (a->has_tokens)
        tokens_done(&a->t);
    a->has_tokens = false;
}

/* Convert keys (None allowed), tokens (None allowed) and n_tokens (None: len(tokens), or
 * len(keys) * block_size without tokens), and check that there is exactly one key per full
 * block, since the library reads n_tokens / block_size keys. Returns 0, or -1 with an
 * exception set and nothing held. */
static int keyargs_get(CacheObject *self, PyObject *keys_obj, PyObject *tok_obj, PyObject *nt_obj,
                       keyargs *a)
{
    memset(a, 0, sizeof *a);
    if (tok_obj != Py_None) {
        if (tokens_get(tok_obj, &a->t) != 0)
            return -1;
        a->has_tokens = true;
    }
    if (keys_obj != Py_None && keys_get(keys_obj, &a->kl) != 0)
        goto fail;
    a->n_tokens = a->has_tokens ? a->t.n : a->kl.n * self->block_size;
    if (nt_obj != Py_None) {
        size_t nt;
        if (!conv_size(nt_obj, &nt))
            goto fail;
        if (a->has_tokens && nt != a->t.n) {
            raise_invalid("n_tokens %zu differs from len(tokens) %zu", nt, a->t.n);
            goto fail;
        }
        a->n_tokens = nt;
    }
    if (keys_obj != Py_None && a->kl.n != a->n_tokens / self->block_size) {
        raise_invalid("keys: %zu given, but %zu tokens have %zu full blocks", a->kl.n, a->n_tokens,
                      a->n_tokens / self->block_size);
        goto fail;
    }
    return 0;
fail:
    keyargs_done(a);
    return -1;
}

static PyObject *Cache_lookup_keys(CacheObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ns", "root", "keys", "tokens", "n_tokens", NULL};
    PyObject *ns_obj, *keys_obj, *tok_obj = Py_None, *nt_obj = Py_None;
    kvp_key root;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO&O|O$O:lookup_keys", kwlist, &ns_obj, conv_key,
                                     &root, &keys_obj, &tok_obj, &nt_obj))
        return NULL;
    const kvp_namespace *ns = ns_arg(ns_obj);
    keyargs a;
    if (ns == NULL || keys_obj == Py_None || keyargs_get(self, keys_obj, tok_obj, nt_obj, &a) != 0)
        return ns != NULL && keys_obj == Py_None ? PyErr_Format(PyExc_TypeError, "keys: None")
                                                 : NULL;
    uint32_t *ids = PyMem_Malloc(a.kl.n * sizeof *ids + 4);
    if (ids == NULL) {
        keyargs_done(&a);
        return PyErr_NoMemory();
    }
    const uint32_t *tp = a.has_tokens ? a.t.ptr : NULL;
    kvp_match m;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc,
         rc = kvp_lookup_keys(kc, ns, root, a.kl.keys, tp, a.n_tokens, ids, a.kl.n, &m));
    keyargs_done(&a);
    PyObject *res = NULL;
    if (rc == KVP_OK) {
        PyObject *list = u32_to_list(ids, m.n_blocks_hit < a.kl.n ? m.n_blocks_hit : a.kl.n);
        res = list ? match_to_py(&m, list) : NULL;
    }
    PyMem_Free(ids);
    if (rc == KVP_OK && res == NULL)
        return events_deliver(self, &b, NULL);
    return finish(self, rc, "kvp_lookup_keys", &b, res);
}

static PyObject *Cache_acquire_keys(CacheObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"req_id", "ns",       "root",     "keys",
                             "tokens", "capacity", "n_tokens", NULL};
    PyObject *ns_obj, *keys_obj, *tok_obj = Py_None, *nt_obj = Py_None;
    uint64_t req_id;
    size_t capacity = 0;
    kvp_key root;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&OO&O|OO&$O:acquire_keys", kwlist, conv_u64,
                                     &req_id, &ns_obj, conv_key, &root, &keys_obj, &tok_obj,
                                     conv_size, &capacity, &nt_obj))
        return NULL;
    const kvp_namespace *ns = ns_arg(ns_obj);
    keyargs a;
    if (ns == NULL || keys_obj == Py_None || keyargs_get(self, keys_obj, tok_obj, nt_obj, &a) != 0)
        return ns != NULL && keys_obj == Py_None ? PyErr_Format(PyExc_TypeError, "keys: None")
                                                 : NULL;
    const uint32_t *tp = a.has_tokens ? a.t.ptr : NULL;
    kvp_match m;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc,
         rc = kvp_acquire_keys(kc, req_id, ns, root, a.kl.keys, tp, a.n_tokens, capacity, &m));
    keyargs_done(&a);
    return finish(self, rc, "kvp_acquire_keys", &b, rc == KVP_OK ? match_to_py(&m, NULL) : NULL);
}

static PyObject *Cache_access_keys(CacheObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ns", "root", "keys", "tokens", "n_tokens", NULL};
    PyObject *ns_obj, *keys_obj, *tok_obj = Py_None, *nt_obj = Py_None;
    kvp_key root;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO&O|O$O:access_keys", kwlist, &ns_obj, conv_key,
                                     &root, &keys_obj, &tok_obj, &nt_obj))
        return NULL;
    const kvp_namespace *ns = ns_arg(ns_obj);
    keyargs a;
    if (ns == NULL || keys_obj == Py_None || keyargs_get(self, keys_obj, tok_obj, nt_obj, &a) != 0)
        return ns != NULL && keys_obj == Py_None ? PyErr_Format(PyExc_TypeError, "keys: None")
                                                 : NULL;
    const uint32_t *tp = a.has_tokens ? a.t.ptr : NULL;
    kvp_match m;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = kvp_access_keys(kc, ns, root, a.kl.keys, tp, a.n_tokens, &m));
    keyargs_done(&a);
    return finish(self, rc, "kvp_access_keys", &b, rc == KVP_OK ? match_to_py(&m, NULL) : NULL);
}

static PyObject *Cache_commit_keys(CacheObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"req_id", "keys", "tokens", NULL};
    PyObject *keys_obj, *tok_obj;
    uint64_t req_id;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&OO:commit_keys", kwlist, conv_u64, &req_id,
                                     &keys_obj, &tok_obj))
        return NULL;
    keyargs a;
    if (tok_obj == Py_None) {
        PyErr_SetString(PyExc_TypeError, "commit_keys: tokens are required");
        return NULL;
    }
    if (keyargs_get(self, keys_obj, tok_obj, Py_None, &a) != 0)
        return NULL;
    size_t n_stored = 0;
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = kvp_commit_keys(kc, req_id, a.kl.keys, a.t.ptr, a.t.n, &n_stored));
    keyargs_done(&a);
    return finish(self, rc, "kvp_commit_keys", &b,
                  rc == KVP_OK ? PyLong_FromSize_t(n_stored) : NULL);
}

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
        return events_deliver(self, &b, NULL);
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

static PyObject *Cache_set_quota(CacheObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ns", "max_cached_blocks", NULL};
    PyObject *ns_obj, *n_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:set_quota", kwlist, &ns_obj, &n_obj))
        return NULL;
    const kvp_namespace *ns = ns_arg(ns_obj);
    uint64_t n = KVP_QUOTA_UNLIMITED;
    if (ns == NULL || (n_obj != Py_None && !conv_u64(n_obj, &n)))
        return NULL;
    if (n > UINT32_MAX) {
        raise_invalid("max_cached_blocks must fit in 32 bits (None: unlimited)");
        return NULL;
    }
    evbatch b;
    int rc = 0;
    CALL(self, b, rc, rc = kvp_cache_set_quota(kc, ns, (uint32_t)n));
    return finish(self, rc, "kvp_cache_set_quota", &b, Py_NewRef(Py_None));
}

static PyObject *Cache_get_u64(CacheObject *self, void *closure)
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
    default:
        return PyBool_FromLong(self->cache == NULL);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Hasher: a cache's key function outside any cache (routers, replicas, vLLM-exact keys)     */
/* ---------------------------------------------------------------------------------------- */

/* A kvp_hasher: owned (Hasher(...)), or a cache's (Cache.hasher()), which each call reaches
 * through the cache's in-flight count so that close() cannot free it under the call. */
typedef struct HasherObject {
    PyObject_HEAD kvp_hasher *own; /* made by Hasher(...), freed with the object; else NULL */
    CacheObject *cache;            /* Cache.hasher(): the cache (a reference); else NULL */
    int profile;                   /* KVP_HASH_* */
    uint32_t block_size;           /* tokens per block */
} HasherObject;

static PyTypeObject Hasher_Type;

/* Most chains one call returns digests for in its no-GIL part, and their digest bytes. */
typedef struct chaindig {
    kvp_chain chain; /* the state after the block */
    uint8_t dig[32]; /* its canonical digest */
    size_t n_dig;    /* 16, or 32 for vllm-sha256-cbor */
} chaindig;

/* A Chain from a state and its digest, or NULL with an exception set. */
static PyObject *chain_to_py(const chaindig *c)
{
    PyObject *o = PyStructSequence_New(chain_type);
    if (o == NULL)
        return NULL;
    PyObject *v[6] = {key_to_int(c->chain.key),
                      key_to_int(c->chain.high),
                      key_to_int(c->chain.root),
                      PyLong_FromUnsignedLongLong(c->chain.n_blocks),
                      PyBytes_FromStringAndSize((const char *)c->dig, (Py_ssize_t)c->n_dig),
                      PyLong_FromUnsignedLongLong(c->chain.key.lo)};
    bool ok = true;
    for (int i = 0; i < 6; i++) {
        ok = ok && v[i] != NULL;
        PyStructSequence_SET_ITEM(o, i, v[i] ? v[i] : Py_NewRef(Py_None));
    }
    if (!ok)
        Py_CLEAR(o);
    return o;
}

/* A kvp_chain from a Chain. Returns 0, or -1 with an exception set. */
static int chain_from_py(PyObject *obj, kvp_chain *out)
{
    if (!PyObject_TypeCheck(obj, chain_type)) {
        PyErr_Format(PyExc_TypeError, "parent: a kvprefix.Chain or None, got %.80s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (key_from_obj(PyStructSequence_GET_ITEM(obj, 0), &out->key) != 0 ||
        key_from_obj(PyStructSequence_GET_ITEM(obj, 1), &out->high) != 0 ||
        key_from_obj(PyStructSequence_GET_ITEM(obj, 2), &out->root) != 0 ||
        !conv_u64(PyStructSequence_GET_ITEM(obj, 3), &out->n_blocks))
        return -1;
    return 0;
}

/* The hasher to use now (GIL held), or NULL with ValueError set when it is a closed
 * cache's. Pair with hasher_leave. */
static const kvp_hasher *hasher_enter(HasherObject *self)
{
    if (self->own != NULL)
        return self->own;
    kvp_cache *kc = cache_enter(self->cache);
    if (kc == NULL)
        raise_closed();
    return kc ? kvp_cache_hasher(kc) : NULL;
}

static void hasher_leave(HasherObject *self)
{
    if (self->cache != NULL)
        cache_leave(self->cache);
}

static PyObject *Hasher_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"profile",   "block_size", "key", "seed",
                             "vllm_seed", "vocab_size", NULL};
    int profile = KVP_HASH_KEYED;
    uint64_t block_size = 16, seed = KVP_DEFAULT_SEED, vocab = 0;
    PyObject *key = Py_None, *vseed = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O&$O&OO&OO&:Hasher", kwlist, conv_profile,
                                     &profile, conv_u64, &block_size, &key, conv_u64, &seed, &vseed,
                                     conv_u64, &vocab))
        return NULL;
    if (block_size > UINT32_MAX || vocab > UINT32_MAX) {
        raise_invalid("block_size and vocab_size must fit in 32 bits");
        return NULL;
    }
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.hash_profile = profile;
    cfg.block_size = (uint32_t)block_size;
    cfg.seed = seed;
    cfg.vocab_size = (uint32_t)vocab;
    if (hash_cfg_fill(&cfg, key, vseed) != 0)
        return NULL;
    HasherObject *self = (HasherObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    int rc = kvp_hasher_new(&cfg, &self->own);
    wipe(cfg.hash_key, sizeof cfg.hash_key);
    if (rc != KVP_OK) {
        Py_DECREF(self);
        return raise_code(rc, "kvp_hasher_new");
    }
    self->profile = profile;
    self->block_size = cfg.block_size;
    return (PyObject *)self;
}

static PyObject *Cache_hasher(CacheObject *self, PyObject *unused)
{
    if (self->cache == NULL)
        return raise_closed();
    HasherObject *h = PyObject_GC_New(HasherObject, &Hasher_Type);
    if (h == NULL)
        return NULL;
    h->own = NULL;
    h->cache = (CacheObject *)Py_NewRef(self);
    h->profile = self->hash_profile;
    h->block_size = self->block_size;
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

/* A closed cache's hasher, once cleared by the garbage collector, is unusable too. */
static bool hasher_dead(HasherObject *self)
{
    if (self->own == NULL && self->cache == NULL) {
        raise_closed();
        return true;
    }
    return false;
}

static PyObject *Hasher_root(HasherObject *self, PyObject *ns_obj)
{
    const kvp_namespace *ns = ns_arg(ns_obj);
    if (ns == NULL || hasher_dead(self))
        return NULL;
    const kvp_hasher *h = hasher_enter(self);
    if (h == NULL)
        return NULL;
    chaindig c;
    int rc = kvp_hasher_root(h, ns, &c.chain);
    if (rc == KVP_OK)
        c.n_dig = kvp_chain_digest(h, &c.chain, c.dig);
    hasher_leave(self);
    return rc == KVP_OK ? chain_to_py(&c) : raise_code(rc, "kvp_hasher_root");
}

/* Hash t's full blocks from *start into d[0 .. *n) with their digests. Runs without the
 * GIL. Returns kvp_hasher_blocks's code. */
static int hasher_blocks_nogil(const kvp_hasher *h, const kvp_namespace *ns, kvp_chain *start,
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

static PyObject *Hasher_blocks(HasherObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ns", "tokens", "parent", NULL};
    PyObject *ns_obj, *tok_obj, *parent = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O:blocks", kwlist, &ns_obj, &tok_obj, &parent))
        return NULL;
    const kvp_namespace *ns = ns_arg(ns_obj);
    kvp_chain start;
    if (ns == NULL || hasher_dead(self) || (parent != Py_None && chain_from_py(parent, &start)))
        return NULL;
    tokens t;
    if (tokens_get(tok_obj, &t) != 0)
        return NULL;
    size_t cap = t.n / self->block_size, n = 0;
    kvp_chain *out = PyMem_RawMalloc(cap * sizeof *out + sizeof *out);
    chaindig *d = PyMem_RawMalloc(cap * sizeof *d + sizeof *d);
    const kvp_hasher *h = (out && d) ? hasher_enter(self) : NULL;
    int rc = KVP_OK;
    if (h != NULL) {
        if (parent == Py_None)
            rc = kvp_hasher_root(h, ns, &start);
        if (rc == KVP_OK) {
            Py_BEGIN_ALLOW_THREADS rc = hasher_blocks_nogil(h, ns, &start, &t, out, d, cap, &n);
            Py_END_ALLOW_THREADS
        }
        hasher_leave(self);
    } else if (!PyErr_Occurred()) {
        PyErr_NoMemory();
    }
    tokens_done(&t);
    PyObject *list = NULL;
    if (h != NULL && rc != KVP_OK)
        raise_code(rc, "kvp_hasher_blocks");
    else if (h != NULL)
        list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *c = chain_to_py(&d[i]);
        if (c == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, c);
    }
    PyMem_RawFree(out);
    PyMem_RawFree(d);
    return list;
}

static PyObject *Hasher_external_key(HasherObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"root", "external_id", NULL};
    kvp_key root, ext;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&:external_key", kwlist, conv_key, &root,
                                     conv_key, &ext) ||
        hasher_dead(self))
        return NULL;
    const kvp_hasher *h = hasher_enter(self);
    if (h == NULL)
        return NULL;
    kvp_key k = kvp_hasher_external_key(h, root, ext);
    hasher_leave(self);
    return key_to_int(k);
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

static PyMethodDef Hasher_methods[] = {
    {"root", (PyCFunction)Hasher_root, METH_O,
     "root(ns) -> Chain\n\nThe chain start of namespace ns (kvp_hasher_root): n_blocks 0; under "
     "the vLLM profiles its digest is NONE_HASH."},
    {"blocks", (PyCFunction)(void (*)(void))Hasher_blocks, METH_VARARGS | METH_KEYWORDS,
     "blocks(ns, tokens, parent=None) -> list[Chain]\n\nHash the full blocks of tokens "
     "(kvp_hasher_blocks) continuing parent (None: the root of ns): one Chain per block, "
     "with .key (the cache's index key), .digest (bytes) and .event (vLLM's KV-event int). "
     "Releases the GIL."},
    {"external_key", (PyCFunction)(void (*)(void))Hasher_external_key, METH_VARARGS | METH_KEYWORDS,
     "external_key(root, external_id) -> int\n\nThe key an external block id is cached under "
     "in the namespace with root key root (as lookup_ids computes it)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Hasher_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvprefix.Hasher",
    .tp_basicsize = sizeof(HasherObject),
    .tp_dealloc = (destructor)Hasher_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Hasher(profile='keyed', *, block_size=16, key=None, seed=0, vllm_seed=None,\n"
              "       vocab_size=0)\n\n"
              "A cache's key function outside any cache (kvp_hasher): a router computes the\n"
              "keys an engine's cache computes, or vLLM's exact block hashes under the\n"
              "vllm-sha256-cbor and vllm-xxhash-cbor profiles. key=None under keyed and\n"
              "siphash draws a random key (equal to no other hasher). Cache.hasher() returns\n"
              "the hasher of a cache. Immutable: share it between threads freely.",
    .tp_traverse = (traverseproc)Hasher_traverse,
    .tp_clear = (inquiry)Hasher_clear,
    .tp_methods = Hasher_methods,
    .tp_getset = Hasher_getset,
    .tp_new = Hasher_new,
};

/* ---------------------------------------------------------------------------------------- */
/* Benchmark hooks (bench/bench_python.py): the same work without the Python layer          */
/* ---------------------------------------------------------------------------------------- */

/* The calling thread's CPU time: the benchmark compares it with Python's time.thread_time(),
 * which stays meaningful on a machine shared with other jobs (wall time does not). */
static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The loop of _run_batch, without the GIL and under the table lock (it releases). Returns the first
 * failing code (its function in *fn) or KVP_OK, and the CPU time spent in *dt. */
static int run_batch_nogil(kvp_cache *kc, const kvp_namespace *ns, const Py_buffer *buf,
                           const uint32_t *len, uint64_t first, uint64_t ring, const char **fn,
                           uint64_t *dt)
{
    size_t n = (size_t)buf->shape[0], width = (size_t)buf->shape[1];
    int rc = KVP_OK;
    uint64_t t0 = now_ns();
    for (size_t k = 0; k < n && rc == KVP_OK; k++) {
        const uint32_t *tok = (const uint32_t *)buf->buf + k * width;
        kvp_match m;
        uint64_t id = first + k;
        if ((rc = kvp_acquire(kc, id, ns, tok, len[k], 0, &m)) != KVP_OK)
            *fn = "kvp_acquire";
        else if ((rc = kvp_commit(kc, id, tok, len[k], NULL)) != KVP_OK)
            *fn = "kvp_commit";
        else if (id >= ring && (rc = kvp_release(kc, id - ring)) != KVP_OK)
            *fn = "kvp_release";
    }
    *dt = now_ns() - t0;
    return rc;
}

/* _run_batch(ns, buf, lens, first_id, ring) -> int: for each row k of buf (a 2-D C-contiguous
 * uint32 buffer, one prompt per row, lens[k] tokens used), acquire + commit request
 * first_id + k and release request first_id + k - ring, all in C with the GIL released. Returns the
 * thread CPU nanoseconds spent; the first failing call raises. */
static PyObject *Cache_run_batch(CacheObject *self, PyObject *args)
{
    PyObject *ns_obj, *buf_obj, *len_obj;
    uint64_t first, ring;
    if (!PyArg_ParseTuple(args, "OOOO&O&:_run_batch", &ns_obj, &buf_obj, &len_obj, conv_u64, &first,
                          conv_u64, &ring))
        return NULL;
    const kvp_namespace *ns = ns_arg(ns_obj);
    Py_buffer buf, lens;
    if (ns == NULL || PyObject_GetBuffer(buf_obj, &buf, PyBUF_ND | PyBUF_FORMAT) != 0)
        return NULL;
    if (PyObject_GetBuffer(len_obj, &lens, PyBUF_ND | PyBUF_FORMAT) != 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (buf.ndim != 2 || !format_is_u32(buf.format, buf.itemsize) || lens.ndim != 1 ||
        !format_is_u32(lens.format, lens.itemsize) || lens.shape[0] != buf.shape[0]) {
        PyBuffer_Release(&buf);
        PyBuffer_Release(&lens);
        PyErr_SetString(PyExc_TypeError, "_run_batch: buf (n, width) and lens (n,) of uint32");
        return NULL;
    }
    int rc = 0;
    const char *fn = "";
    uint64_t dt = 0;
    evbatch b;
    CALL(self, b, rc,
         (table_lock(self), rc = run_batch_nogil(kc, ns, &buf, lens.buf, first, ring, &fn, &dt),
          table_unlock(self)));
    PyBuffer_Release(&buf);
    PyBuffer_Release(&lens);
    return finish(self, rc, fn, &b, PyLong_FromUnsignedLongLong(dt));
}

/* _time_stats(n) -> float: thread CPU nanoseconds per kvp_cache_stats call, n calls timed
 * in C. */
/* The loop of _time_stats, without the GIL. Returns ns per call, or -1. */
static double time_stats_nogil(kvp_cache *kc, uint64_t n)
{
    kvp_stats s;
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < n; i++) {
        if (kvp_cache_stats(kc, &s) != KVP_OK)
            return -1.0;
        __asm__ volatile("" : : "r"(&s) : "memory"); /* keep every call */
    }
    return (double)(now_ns() - t0) / (double)n;
}

static PyObject *Cache_time_stats(CacheObject *self, PyObject *arg)
{
    uint64_t n = 0;
    if (!conv_u64(arg, &n))
        return NULL;
    if (n == 0)
        return raise_code(KVP_EINVAL, "_time_stats");
    double per_call = 0;
    int rc = 0;
    evbatch b;
    CALL(self, b, rc, per_call = time_stats_nogil(kc, n));
    if (rc == 0 && per_call < 0)
        rc = KVP_EBUSY;
    return finish(self, rc, "kvp_cache_stats", &b, PyFloat_FromDouble(per_call));
}

#define KW (PyCFunction)(void (*)(void))
#define VK (METH_VARARGS | METH_KEYWORDS)

static PyMethodDef Cache_methods[] = {
    {"lookup", KW Cache_lookup, VK,
     "lookup(ns, tokens) -> Match\n\nThe longest reusable cached prefix (read-only; kvp_lookup). "
     "Match.block_ids lists the reused block ids. Releases the GIL."},
    {"acquire", KW Cache_acquire, VK,
     "acquire(req_id, ns, tokens, capacity=0) -> Match\n\nStart a request: pin its cached "
     "prefix and allocate blocks for max(len(tokens), capacity) tokens (kvp_acquire). "
     "Match.block_ids is None: see request_blocks. Releases the GIL."},
    {"grow", KW Cache_grow, VK,
     "grow(req_id, capacity) -> None\n\nMake the request hold blocks for capacity tokens."},
    {"request_blocks", (PyCFunction)Cache_request_blocks, METH_O,
     "request_blocks(req_id) -> list[int]\n\nA copy of the request's block table, in token "
     "order."},
    {"commit", KW Cache_commit, VK,
     "commit(req_id, tokens) -> int\n\nRegister the request's newly full blocks; tokens is its "
     "whole sequence so far. Returns the number of blocks newly indexed. Releases the GIL."},
    {"release", (PyCFunction)Cache_release, METH_O,
     "release(req_id) -> None\n\nEnd the request: unpin its blocks, tail first."},
    {"access", KW Cache_access, VK,
     "access(ns, tokens) -> Match\n\nLookup, cache every full block and release, in one call "
     "(replay and simulation). Releases the GIL."},
    {"lookup_ids", KW Cache_lookup_ids, VK,
     "lookup_ids(ns, ids, n_tokens=None) -> Match\n\nlookup for precomputed block ids (ints "
     "of up to 128 bits, or a buffer of uint64 (lo, hi) pairs or of 16-byte keys); n_tokens "
     "defaults to len(ids) * block_size."},
    {"access_ids", KW Cache_access_ids, VK,
     "access_ids(ns, ids, n_tokens=None) -> Match\n\naccess for precomputed block ids."},
    {"keys", KW Cache_keys, VK,
     "keys(ns, tokens, *, raw=False) -> (int, list[int] | bytes)\n\nThe namespace root and "
     "the keys of the full blocks of tokens, exactly as this cache computes them (its profile, "
     "key and block size; kvp_cache_keys), for the *_keys forms. Takes no lock and releases "
     "the GIL. raw=True returns the keys as bytes, 16 per key (uint64 lo, hi)."},
    {"lookup_keys", KW Cache_lookup_keys, VK,
     "lookup_keys(ns, root, keys, tokens=None, *, n_tokens=None) -> Match\n\nlookup with keys "
     "from keys(): one per full block. tokens are required in collision-proof mode (they are "
     "verified); n_tokens defaults to len(tokens), else len(keys) * block_size."},
    {"acquire_keys", KW Cache_acquire_keys, VK,
     "acquire_keys(req_id, ns, root, keys, tokens=None, capacity=0, *, n_tokens=None) -> "
     "Match\n\nacquire with keys from keys()."},
    {"commit_keys", KW Cache_commit_keys, VK,
     "commit_keys(req_id, keys, tokens) -> int\n\ncommit with keys from keys() for the whole "
     "sequence (None: hash under the lock, as commit)."},
    {"access_keys", KW Cache_access_keys, VK,
     "access_keys(ns, root, keys, tokens=None, *, n_tokens=None) -> Match\n\naccess with "
     "keys from keys()."},
    {"requests", (PyCFunction)Cache_requests, METH_NOARGS,
     "requests() -> list[int]\n\nThe ids of the active requests, in no particular order."},
    {"release_all", (PyCFunction)Cache_release_all, METH_NOARGS,
     "release_all() -> int\n\nRelease every active request (e.g. a scheduler restarting); "
     "returns how many. Committed blocks stay cached."},
    {"set_quota", KW Cache_set_quota, VK,
     "set_quota(ns, max_cached_blocks) -> None\n\nThe namespace's quota of cached blocks "
     "(None: unlimited); needs Cache(ns_quota=...) != 0. Evicts its excess now."},
    {"hasher", (PyCFunction)Cache_hasher, METH_NOARGS,
     "hasher() -> Hasher\n\nThe cache's key function (kvp_cache_hasher), usable while the "
     "cache is open."},
    {"hash_blocks", KW Cache_hash_blocks, VK,
     "hash_blocks(ns, tokens) -> list[int]\n\nkeys(ns, tokens)[1]."},
    {"namespace_key", (PyCFunction)Cache_namespace_key, METH_O,
     "namespace_key(ns) -> int\n\nThe namespace root key as this cache computes it."},
    {"reset", (PyCFunction)Cache_reset, METH_NOARGS,
     "reset() -> None\n\nDrop every cached block that no request pins."},
    {"check", (PyCFunction)Cache_check, METH_NOARGS,
     "check() -> None\n\nRun the invariant checker; raises CorruptError on a problem."},
    {"stats", (PyCFunction)Cache_stats, METH_NOARGS, "stats() -> Stats\n\nCounters and gauges."},
    {"metrics", KW Cache_metrics, VK,
     "metrics(labels=None) -> str\n\nThe Prometheus text exposition (format 0.0.4) of the "
     "cache; labels is a dict of str to str added to every sample."},
    {"close", (PyCFunction)Cache_close, METH_NOARGS,
     "close() -> None\n\nFree the cache now (idempotent); later calls raise ValueError."},
    {"_run_batch", (PyCFunction)Cache_run_batch, METH_VARARGS,
     "_run_batch(ns, buf, lens, first_id, ring) -> int\n\nFor bench/bench_python.py: workload "
     "(c)'s acquire + commit + release loop in C; returns nanoseconds."},
    {"_time_stats", (PyCFunction)Cache_time_stats, METH_O,
     "_time_stats(n) -> float\n\nFor bench/bench_python.py: ns per kvp_cache_stats in C."},
    {"__enter__", (PyCFunction)Cache_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Cache_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Cache_getset[] = {
    {"n_blocks", (getter)Cache_get_u64, NULL, "Blocks in the pool.", (void *)0},
    {"block_size", (getter)Cache_get_u64, NULL, "Tokens per block.", (void *)1},
    {"seed", (getter)Cache_get_u64, NULL, "Hash seed.", (void *)2},
    {"verify_tokens", (getter)Cache_get_u64, NULL, "Collision-proof mode.", (void *)3},
    {"on_event", (getter)Cache_get_u64, NULL, "The event callable, or None.", (void *)4},
    {"closed", (getter)Cache_get_u64, NULL, "True after close().", (void *)5},
    {"hash_profile", (getter)Cache_get_u64, NULL, "The hash profile's name.", (void *)6},
    {"vocab_size", (getter)Cache_get_u64, NULL, "Token ids must be below it; 0: unchecked.",
     (void *)7},
    {"ns_quota", (getter)Cache_get_u64, NULL,
     "Default per-namespace quota of cached blocks; 0: quotas off.", (void *)8},
    {"single_threaded", (getter)Cache_get_u64, NULL,
     "No library lock: calls keep the GIL, which serialises them.", (void *)9},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Cache_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvprefix.Cache",
    .tp_basicsize = sizeof(CacheObject),
    .tp_dealloc = (destructor)Cache_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Cache(n_blocks, block_size=16, *, seed=0, verify_tokens=False, on_event=None,\n"
              "      hash_profile='keyed', hash_key=None, vllm_seed=None, vocab_size=0,\n"
              "      ns_quota=0, single_threaded=False)\n\n"
              "A prefix cache over a pool of n_blocks KV blocks (kvp_cache). Tokens are any\n"
              "C-contiguous buffer of uint32 (used without copying) or a sequence of ints.\n"
              "on_event(event) receives each Event after the call that caused it, on the\n"
              "calling thread. Safe to share between threads: calls run concurrently with the\n"
              "GIL released (lookups in parallel, mutations one at a time), unless\n"
              "single_threaded=True, where calls keep the GIL and the library takes no lock.",
    .tp_traverse = (traverseproc)Cache_traverse,
    .tp_clear = (inquiry)Cache_clear,
    .tp_methods = Cache_methods,
    .tp_getset = Cache_getset,
    .tp_new = Cache_new,
};

/* ---------------------------------------------------------------------------------------- */
/* Module functions                                                                         */
/* ---------------------------------------------------------------------------------------- */

static PyObject *mod_hash_blocks(PyObject *m, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"tokens", "block_size", "seed", "parent", NULL};
    PyObject *tok_obj;
    uint64_t block_size = 16, seed = KVP_DEFAULT_SEED;
    kvp_key parent = {0, 0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O&$O&O&:hash_blocks", kwlist, &tok_obj, conv_u64,
                                     &block_size, conv_u64, &seed, conv_key, &parent))
        return NULL;
    return hash_blocks_list(seed, parent, tok_obj, block_size);
}

static PyObject *mod_namespace_key(PyObject *m, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ns", "seed", NULL};
    PyObject *ns_obj;
    uint64_t seed = KVP_DEFAULT_SEED;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O&:namespace_key", kwlist, &ns_obj, conv_u64,
                                     &seed))
        return NULL;
    const kvp_namespace *ns = ns_arg(ns_obj);
    kvp_key k;
    if (ns == NULL)
        return NULL;
    int rc = kvp_namespace_key(seed, ns, &k);
    return rc == KVP_OK ? key_to_int(k) : raise_code(rc, "kvp_namespace_key");
}

static PyObject *mod_external_key(PyObject *m, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"root", "external_id", "seed", NULL};
    kvp_key root, ext;
    uint64_t seed = KVP_DEFAULT_SEED;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&|O&:external_key", kwlist, conv_key, &root,
                                     conv_key, &ext, conv_u64, &seed))
        return NULL;
    return key_to_int(kvp_external_key(seed, root, ext));
}

static PyObject *mod_strerror(PyObject *m, PyObject *arg)
{
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(kvp_strerror(code < INT32_MIN || code > INT32_MAX ? 1 : (int)code));
}

static PyObject *mod_hash_profile_name(PyObject *m, PyObject *arg)
{
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    const char *name = kvp_hash_profile_name(v < INT32_MIN || v > INT32_MAX ? 0 : (int)v);
    if (name == NULL) {
        raise_invalid("unknown hash profile %R", arg);
        return NULL;
    }
    return PyUnicode_FromString(name);
}

static PyObject *mod_hash_profile_parse(PyObject *m, PyObject *arg)
{
    int profile;
    return conv_profile(arg, &profile) ? PyLong_FromLong(profile) : NULL;
}

static PyObject *mod_version(PyObject *m, PyObject *unused)
{
    return PyUnicode_FromString(kvp_version());
}

/* For the tests: the address the library would read tokens from, and whether that is the
 * caller's own memory (True) or a converted copy (False). */
static PyObject *mod_token_address(PyObject *m, PyObject *obj)
{
    tokens t;
    if (tokens_get(obj, &t) != 0)
        return NULL;
    PyObject *res = Py_BuildValue("(KO)", (unsigned long long)(uintptr_t)t.ptr,
                                  t.owned == NULL ? Py_True : Py_False);
    tokens_done(&t);
    return res;
}

static PyMethodDef module_methods[] = {
    {"hash_blocks", KW mod_hash_blocks, VK,
     "hash_blocks(tokens, block_size=16, *, seed=0, parent=None) -> list[int]\n\nChain-hash "
     "the full blocks of tokens (kvp_hash_blocks); parent is the key before the first block "
     "(a namespace root from namespace_key; None: the zero key). Releases the GIL."},
    {"namespace_key", KW mod_namespace_key, VK,
     "namespace_key(ns, seed=0) -> int\n\nThe namespace root key (kvp_namespace_key)."},
    {"external_key", KW mod_external_key, VK,
     "external_key(root, external_id, seed=0) -> int\n\nThe key of an externally computed "
     "block id in the namespace with root key root (kvp_external_key)."},
    {"strerror", (PyCFunction)mod_strerror, METH_O,
     "strerror(code) -> str\n\nThe library's description of a status code."},
    {"hash_profile_name", (PyCFunction)mod_hash_profile_name, METH_O,
     "hash_profile_name(profile) -> str\n\nThe name of a HASH_* profile."},
    {"hash_profile_parse", (PyCFunction)mod_hash_profile_parse, METH_O,
     "hash_profile_parse(name) -> int\n\nThe HASH_* constant of a profile name."},
    {"version", (PyCFunction)mod_version, METH_NOARGS,
     "version() -> str\n\nThe C library's version."},
    {"_token_address", (PyCFunction)mod_token_address, METH_O,
     "_token_address(tokens) -> (int, bool)\n\nFor tests: the address the library reads the "
     "tokens at, and whether it is the caller's memory (no copy)."},
    {NULL, NULL, 0, NULL},
};

/* ---------------------------------------------------------------------------------------- */
/* Module initialisation                                                                    */
/* ---------------------------------------------------------------------------------------- */

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the token buffer checks assume a little-endian host"
#endif

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
    {NULL, NULL},
};

static PyStructSequence_Desc match_desc = {"kvprefix.Match", "The result of matching a prompt.",
                                           match_fields, 7};
static PyStructSequence_Desc stats_desc = {"kvprefix.Stats", "Cache counters and gauges.",
                                           stats_fields, 15};
static PyStructSequence_Desc event_desc = {"kvprefix.Event", "One cache event.", event_fields, 7};

static PyStructSequence_Field chain_fields[] = {
    {"key", "the cache's index key of the last block hashed (the root before block 0)"},
    {"high", "vllm-sha256-cbor: high 128 bits of the 256-bit digest; else 0"},
    {"root", "the namespace root"},
    {"n_blocks", "blocks hashed since the root"},
    {"digest", "the canonical digest (bytes: 16, or 32 for vllm-sha256-cbor)"},
    {"event", "vLLM's KV-event int: the digest's last 8 bytes, big-endian (key & (2**64-1))"},
    {NULL, NULL},
};

static PyStructSequence_Desc chain_desc = {
    "kvprefix.Chain", "A key chain after some blocks (kvp_chain), with its digest.", chain_fields,
    6};

/* The exception classes: name, code, extra builtin base (or NULL), docstring. */
typedef struct errdef {
    const char *name; /* attribute name in the module */
    int code;         /* KVP_E* */
    PyObject **base;  /* a builtin exception also inherited, or NULL */
    const char *doc;  /* docstring */
} errdef;

static int add_errors(PyObject *m)
{
    err_base = PyErr_NewExceptionWithDoc(
        "kvprefix.KvprefixError",
        "An error from the kvprefix library: .code is the KVP_E* code (negative int), "
        ".function the C function that returned it (None for argument checks made by the "
        "binding).",
        NULL, NULL);
    if (err_base == NULL || PyModule_AddObjectRef(m, "KvprefixError", err_base) < 0)
        return -1;
    const errdef defs[] = {
        {"InvalidArgumentError", KVP_EINVAL, &PyExc_ValueError, "KVP_EINVAL"},
        {"OutOfMemoryError", KVP_ENOMEM, &PyExc_MemoryError, "KVP_ENOMEM"},
        {"NoSpaceError", KVP_ENOSPC, NULL, "KVP_ENOSPC: too many blocks are pinned"},
        {"NotFoundError", KVP_ENOENT, &PyExc_LookupError, "KVP_ENOENT: no such request"},
        {"AlreadyExistsError", KVP_EEXIST, NULL, "KVP_EEXIST: the request id is active"},
        {"TooLargeError", KVP_EOVERFLOW, NULL, "KVP_EOVERFLOW"},
        {"OutOfRangeError", KVP_ERANGE, NULL, "KVP_ERANGE"},
        {"BusyError", KVP_EBUSY, NULL, "KVP_EBUSY"},
        {"CorruptError", KVP_ECORRUPT, NULL, "KVP_ECORRUPT: the invariant checker failed"},
        {"TokenError", KVP_ETOKEN, &PyExc_ValueError,
         "KVP_ETOKEN: a token id is at or above the cache's vocab_size"},
        {"NotSupportedError", KVP_ENOTSUP, NULL,
         "KVP_ENOTSUP: the hash profile cannot express this namespace (or no random source)"},
        {"RequestTooBigError", KVP_ETOOBIG, NULL,
         "KVP_ETOOBIG: the request needs more blocks than the whole pool: retrying never "
         "helps (unlike NoSpaceError)"},
    };
    for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++) {
        char qual[64];
        snprintf(qual, sizeof qual, "kvprefix.%s", defs[i].name);
        PyObject *bases =
            defs[i].base ? PyTuple_Pack(2, err_base, *defs[i].base) : PyTuple_Pack(1, err_base);
        PyObject *cls = bases ? PyErr_NewExceptionWithDoc(qual, defs[i].doc, bases, NULL) : NULL;
        Py_XDECREF(bases);
        if (cls == NULL || PyModule_AddObjectRef(m, defs[i].name, cls) < 0)
            return -1;
        err_by_code[-defs[i].code] = cls;
    }
    err_by_code[0] = err_base;
    err_callback = PyErr_NewExceptionWithDoc(
        "kvprefix.EventCallbackError",
        "The on_event callable raised (its exception is __cause__). The library call itself "
        "completed and the cache is consistent; .result holds what the call returned.",
        err_base, NULL);
    if (err_callback == NULL || PyModule_AddObjectRef(m, "EventCallbackError", err_callback) < 0)
        return -1;
    return 0;
}

static int add_constants(PyObject *m)
{
    const struct {
        const char *name;
        long value;
    } c[] = {
        {"OK", KVP_OK},
        {"EINVAL", KVP_EINVAL},
        {"ENOMEM", KVP_ENOMEM},
        {"ENOSPC", KVP_ENOSPC},
        {"ENOENT", KVP_ENOENT},
        {"EEXIST", KVP_EEXIST},
        {"EOVERFLOW", KVP_EOVERFLOW},
        {"ERANGE", KVP_ERANGE},
        {"EBUSY", KVP_EBUSY},
        {"ECORRUPT", KVP_ECORRUPT},
        {"ETOKEN", KVP_ETOKEN},
        {"ENOTSUP", KVP_ENOTSUP},
        {"ETOOBIG", KVP_ETOOBIG},
        {"HASH_KEYED", KVP_HASH_KEYED},
        {"HASH_XXH3", KVP_HASH_XXH3},
        {"HASH_SIPHASH", KVP_HASH_SIPHASH},
        {"HASH_VLLM_SHA256", KVP_HASH_VLLM_SHA256},
        {"HASH_VLLM_XXHASH", KVP_HASH_VLLM_XXHASH},
        {"HASH_KEY_MIN", KVP_HASH_KEY_MIN},
        {"HASH_KEY_MAX", KVP_HASH_KEY_MAX},
        {"QUOTA_UNLIMITED", (long)KVP_QUOTA_UNLIMITED},
        {"EVENT_STORED", KVP_EVENT_STORED},
        {"EVENT_REMOVED", KVP_EVENT_REMOVED},
        {"EVENT_CLEARED", KVP_EVENT_CLEARED},
        {"REMOVED_EVICTED", KVP_REMOVED_EVICTED},
        {"REMOVED_RESET", KVP_REMOVED_RESET},
        {"REMOVED_REPLACED", KVP_REMOVED_REPLACED},
        {"MAX_BLOCK_SIZE", KVP_MAX_BLOCK_SIZE},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        if (PyModule_AddIntConstant(m, c[i].name, c[i].value) < 0)
            return -1;
    return PyModule_AddStringConstant(m, "VLLM_SEED_DEFAULT", KVP_VLLM_SEED_DEFAULT);
}

static int add_types(PyObject *m)
{
    if ((match_type = PyStructSequence_NewType(&match_desc)) == NULL ||
        (stats_type = PyStructSequence_NewType(&stats_desc)) == NULL ||
        (event_type = PyStructSequence_NewType(&event_desc)) == NULL ||
        (chain_type = PyStructSequence_NewType(&chain_desc)) == NULL)
        return -1;
    if (PyType_Ready(&Namespace_Type) < 0 || PyType_Ready(&Cache_Type) < 0 ||
        PyType_Ready(&Hasher_Type) < 0)
        return -1;
    if (PyModule_AddObjectRef(m, "Match", (PyObject *)match_type) < 0 ||
        PyModule_AddObjectRef(m, "Stats", (PyObject *)stats_type) < 0 ||
        PyModule_AddObjectRef(m, "Event", (PyObject *)event_type) < 0 ||
        PyModule_AddObjectRef(m, "Chain", (PyObject *)chain_type) < 0 ||
        PyModule_AddObjectRef(m, "Hasher", (PyObject *)&Hasher_Type) < 0 ||
        PyModule_AddObjectRef(m, "Namespace", (PyObject *)&Namespace_Type) < 0 ||
        PyModule_AddObjectRef(m, "Cache", (PyObject *)&Cache_Type) < 0)
        return -1;
    return 0;
}

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "kvprefix._kvprefix",
    "The C extension behind the kvprefix package (see kvprefix's docstring).",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__kvprefix(void);

PyMODINIT_FUNC PyInit__kvprefix(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    int_0 = PyLong_FromLong(0);
    int_64 = PyLong_FromLong(64);
    PyObject *one = PyLong_FromLong(1), *n128 = PyLong_FromLong(128);
    int_2_128 = (one && n128) ? PyNumber_Lshift(one, n128) : NULL;
    Py_XDECREF(one);
    Py_XDECREF(n128);
    if (int_0 == NULL || int_64 == NULL || int_2_128 == NULL || add_errors(m) < 0 ||
        add_constants(m) < 0 || add_types(m) < 0 ||
        PyModule_AddStringConstant(m, "__version__", kvp_version()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
