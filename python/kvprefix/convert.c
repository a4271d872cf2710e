/*
 * convert.c - single values between Python and C: ints of 64 and 128 bits, token buffers and
 * sequences, block key lists, namespace arguments, hash profiles, and lists back to Python.
 *
 * Tokens are read in place when they are a 1-D C-contiguous buffer of uint32 (array('I'), a
 * numpy uint32 array, a memoryview cast to 'I'): the tokens struct then holds the exported
 * Py_buffer, so the object cannot be resized while the library reads it, and nothing is
 * copied. A buffer at an unaligned address, and any sequence of ints, is converted into a
 * PyMem array, each value checked to be in 0 .. 2**32 - 1. Anything else (another dtype, 2-D,
 * strided) is refused rather than copied silently. Block keys (the _ids and _keys forms) are
 * always copied into an owned array, so their alignment never matters.
 *
 * Every converter names the function and argument in its messages (kvpy_arg_error), so one
 * mistake reads the same in every call. None of them keeps anything on failure.
 */
#include <stdio.h>
#include <string.h>

#include "kvpy.h"

static PyObject *int_0;     /* the int 0 */
static PyObject *int_64;    /* the int 64 */
static PyObject *int_2_128; /* the int 2**128 */

int kvpy_convert_init(void)
{
    int_0 = PyLong_FromLong(0);
    int_64 = PyLong_FromLong(64);
    PyObject *one = PyLong_FromLong(1), *n128 = PyLong_FromLong(128);
    int_2_128 = (one && n128) ? PyNumber_Lshift(one, n128) : NULL;
    Py_XDECREF(one);
    Py_XDECREF(n128);
    return int_0 && int_64 && int_2_128 ? 0 : -1;
}

/* obj as an int (a new reference), or NULL with "an int is needed" TypeError. */
static PyObject *as_int(PyObject *obj, const char *fn, const char *arg)
{
    PyObject *v = PyNumber_Index(obj);
    if (v == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        kvpy_arg_error(PyExc_TypeError, fn, arg, ": an int is needed, got %.80s",
                       Py_TYPE(obj)->tp_name);
    }
    return v;
}

int kvpy_u64(PyObject *obj, uint64_t *out, const char *fn, const char *arg)
{
    PyObject *v = as_int(obj, fn, arg);
    if (v == NULL)
        return -1;
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        kvpy_arg_error(NULL, fn, arg, ": %R is not in 0 .. 2**64 - 1", obj);
        return -1;
    }
    *out = x;
    return 0;
}

int kvpy_key(PyObject *obj, kvp_key *out, const char *fn, const char *arg)
{
    if (obj == Py_None) {
        memset(out, 0, sizeof *out);
        return 0;
    }
    PyObject *v = as_int(obj, fn, arg);
    if (v == NULL)
        return -1;
    int neg = PyObject_RichCompareBool(v, int_0, Py_LT);
    int big = PyObject_RichCompareBool(v, int_2_128, Py_GE);
    if (neg != 0 || big != 0) {
        Py_DECREF(v);
        if (neg >= 0 && big >= 0)
            kvpy_arg_error(NULL, fn, arg, ": key %R is not in 0 .. 2**128 - 1", obj);
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

/* A hash profile given by name ("keyed", "xxh3", "siphash", "vllm-sha256-cbor",
 * "vllm-xxhash-cbor") or as a HASH_* int, checked by name only (the library checks ints:
 * KVP_EINVAL). */
int kvpy_profile(PyObject *obj, int *out, const char *fn, const char *arg)
{
    if (PyUnicode_Check(obj)) {
        const char *name = PyUnicode_AsUTF8(obj);
        if (name == NULL)
            return -1;
        if (kvp_hash_profile_parse(name, out) != KVP_OK) {
            kvpy_arg_error(NULL, fn, arg,
                           ": unknown hash profile %R (keyed, xxh3, siphash, vllm-sha256-cbor, "
                           "vllm-xxhash-cbor)",
                           obj);
            return -1;
        }
        return 0;
    }
    PyObject *v = as_int(obj, fn, arg);
    if (v == NULL)
        return -1;
    long x = PyLong_AsLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred())
        PyErr_Clear();
    *out = (x < 0 || x > INT32_MAX) ? 0 : (int)x;
    return 0;
}

/* A named choice of the library (a quota scope, an eviction policy): one of names[0 .. n)
 * given by name, or an int passed on as it is for the library to check (out of range: above
 * every valid value, so kvp_cache_new refuses it with its detail). what names the choice in
 * the message for an unknown name, which lists the names. Returns 0, or -1 with ValueError
 * (InvalidArgumentError) or TypeError set. */
static int named_choice(PyObject *obj, const char *const *names, int n, const char *what, int *out,
                        const char *fn, const char *arg)
{
    if (PyUnicode_Check(obj)) {
        const char *name = PyUnicode_AsUTF8(obj);
        if (name == NULL)
            return -1;
        for (int i = 0; i < n; i++) {
            if (strcmp(name, names[i]) == 0) {
                *out = i;
                return 0;
            }
        }
        char list[128] = "";
        for (int i = 0; i < n; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     names[i]);
        kvpy_arg_error(NULL, fn, arg, ": unknown %s %R (%s)", what, obj, list);
        return -1;
    }
    PyObject *v = as_int(obj, fn, arg);
    if (v == NULL)
        return -1;
    long x = PyLong_AsLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred())
        PyErr_Clear();
    *out = (x < 0 || x > 255) ? 255 : (int)x;
    return 0;
}

static const char *const scope_names[] = {"namespace", "tenant", "model"}; /* KVP_QUOTA_SCOPE_* */
static const char *const eviction_names[] = {"lru", "slru", "s3fifo", "cdecay"}; /* KVP_EVICT_* */
#define N_NAMES(a) ((int)(sizeof(a) / sizeof(a)[0]))

const char *kvpy_scope_name(int scope)
{
    return scope >= 0 && scope < N_NAMES(scope_names) ? scope_names[scope] : NULL;
}

int kvpy_scope(PyObject *obj, int *out, const char *fn, const char *arg)
{
    return named_choice(obj, scope_names, N_NAMES(scope_names), "quota scope", out, fn, arg);
}

const char *kvpy_eviction_name(int policy)
{
    return policy >= 0 && policy < N_NAMES(eviction_names) ? eviction_names[policy] : NULL;
}

int kvpy_eviction(PyObject *obj, int *out, const char *fn, const char *arg)
{
    return named_choice(obj, eviction_names, N_NAMES(eviction_names), "eviction policy", out, fn,
                        arg);
}

const kvp_namespace *kvpy_ns(PyObject *obj, const char *fn, const char *arg)
{
    static kvp_namespace empty; /* zero-initialised: every field absent */
    if (obj == Py_None)
        return &empty;
    if (!PyObject_TypeCheck(obj, &kvpy_namespace_type)) {
        kvpy_arg_error(PyExc_TypeError, fn, arg, ": a kvprefix.Namespace or None, got %.80s",
                       Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return &((NamespaceObject *)obj)->ns;
}

/* ---------------------------------------------------------------------------------------- */
/* Tokens                                                                                   */
/* ---------------------------------------------------------------------------------------- */

bool kvpy_format_is_u32(const char *f, Py_ssize_t itemsize)
{
    if (f == NULL)
        f = "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++; /* '<' is native: the module only builds on little-endian hosts (kvpy.h) */
    return itemsize == 4 && (strcmp(f, "I") == 0 || strcmp(f, "L") == 0);
}

/* Tokens from any 1-D C-contiguous buffer of uint32, without copying. Returns 0 or -1. */
static int tokens_from_buffer(PyObject *obj, tokens *t, const char *fn, const char *arg)
{
    if (PyObject_GetBuffer(obj, &t->view, PyBUF_RECORDS_RO) != 0) {
        PyErr_Clear();
        if (PyObject_GetBuffer(obj, &t->view, PyBUF_FULL_RO) != 0)
            return -1;
    }
    t->has_view = true;
    if (!kvpy_format_is_u32(t->view.format, t->view.itemsize)) {
        kvpy_arg_error(PyExc_TypeError, fn, arg,
                       ": a buffer of uint32 is needed (format 'I', itemsize 4), got format "
                       "'%s' with itemsize %zd",
                       t->view.format ? t->view.format : "B", t->view.itemsize);
        return -1;
    }
    if (t->view.ndim != 1) {
        kvpy_arg_error(PyExc_ValueError, fn, arg, ": a 1-D buffer is needed, got %d dimensions",
                       t->view.ndim);
        return -1;
    }
    if (!PyBuffer_IsContiguous(&t->view, 'C')) {
        kvpy_arg_error(PyExc_ValueError, fn, arg,
                       ": the buffer is not contiguous (numpy: np.ascontiguousarray)");
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
static int tokens_from_sequence(PyObject *obj, tokens *t, const char *fn, const char *arg)
{
    PyObject *seq = PySequence_Fast(obj, "");
    if (seq == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            kvpy_arg_error(PyExc_TypeError, fn, arg,
                           ": a uint32 buffer or a sequence of ints is needed, got %.80s",
                           Py_TYPE(obj)->tp_name);
        }
        return -1;
    }
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
                PyErr_Clear();
                kvpy_arg_error(PyExc_TypeError, fn, arg, "[%zd]: an int is needed, got %.80s", i,
                               Py_TYPE(it)->tp_name);
                Py_DECREF(seq);
                return -1;
            }
            v = PyLong_AsLongLongAndOverflow(ix, &overflow);
            Py_DECREF(ix);
        }
        if (overflow != 0 || v < 0 || v > 0xffffffffLL) {
            kvpy_arg_error(NULL, fn, arg, "[%zd] = %R is not in 0 .. 2**32 - 1", i, it);
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

void kvpy_tokens_done(tokens *t)
{
    if (t->has_view)
        PyBuffer_Release(&t->view);
    PyMem_Free(t->owned);
    t->has_view = false;
    t->owned = NULL;
}

int kvpy_tokens_get(PyObject *obj, tokens *t, const char *fn, const char *arg)
{
    memset(t, 0, sizeof *t);
    int rc = PyObject_CheckBuffer(obj) ? tokens_from_buffer(obj, t, fn, arg)
                                       : tokens_from_sequence(obj, t, fn, arg);
    if (rc != 0)
        kvpy_tokens_done(t);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Block keys                                                                               */
/* ---------------------------------------------------------------------------------------- */

static int keys_from_buffer(PyObject *obj, keylist *kl, const char *fn, const char *arg)
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
        kvpy_arg_error(PyExc_TypeError, fn, arg,
                       ": a buffer of uint64 (lo, hi) pairs or of bytes is needed, got format "
                       "'%s' with itemsize %zd",
                       f, v.itemsize);
    else if (!PyBuffer_IsContiguous(&v, 'C'))
        kvpy_arg_error(PyExc_ValueError, fn, arg, ": the buffer is not contiguous");
    else if (v.len % 16 != 0)
        kvpy_arg_error(NULL, fn, arg, ": %zd bytes is not a whole number of 16-byte keys", v.len);
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

static int keys_from_sequence(PyObject *obj, keylist *kl, const char *fn, const char *arg)
{
    PyObject *seq = PySequence_Fast(obj, "");
    if (seq == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            kvpy_arg_error(PyExc_TypeError, fn, arg,
                           ": a sequence of ints or a buffer is needed, got %.80s",
                           Py_TYPE(obj)->tp_name);
        }
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    kl->keys = PyMem_Malloc((size_t)n * sizeof(kvp_key) + 16);
    if (kl->keys == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (kvpy_key(PySequence_Fast_GET_ITEM(seq, i), &kl->keys[i], fn, arg) != 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    kl->n = (size_t)n;
    Py_DECREF(seq);
    return 0;
}

int kvpy_keys_get(PyObject *obj, keylist *kl, const char *fn, const char *arg)
{
    kl->keys = NULL;
    kl->n = 0;
    int rc = PyObject_CheckBuffer(obj) ? keys_from_buffer(obj, kl, fn, arg)
                                       : keys_from_sequence(obj, kl, fn, arg);
    if (rc != 0) {
        PyMem_Free(kl->keys);
        kl->keys = NULL;
    }
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Back to Python                                                                           */
/* ---------------------------------------------------------------------------------------- */

PyObject *kvpy_key_to_int(kvp_key k)
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

/* A list of n items, item i made by make(v, i); NULL with the exception set when one fails. */
static PyObject *list_of(const void *v, size_t n, PyObject *(*make)(const void *v, size_t i))
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *x = make(v, i);
        if (x == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, x);
    }
    return list;
}

static PyObject *key_item(const void *v, size_t i)
{
    return kvpy_key_to_int(((const kvp_key *)v)[i]);
}

static PyObject *u32_item(const void *v, size_t i)
{
    return PyLong_FromUnsignedLong(((const uint32_t *)v)[i]);
}

PyObject *kvpy_keys_to_list(const kvp_key *keys, size_t n)
{
    return list_of(keys, n, key_item);
}

PyObject *kvpy_u32_to_list(const uint32_t *v, size_t n)
{
    return list_of(v, n, u32_item);
}
