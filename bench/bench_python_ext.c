/*
 * bench_python_ext.c - the extension module _kvprefix_bench: the C loops that
 * bench/bench_python.py measures the Python binding against (workload (c)'s acquire + commit
 * + release per request, and kvp_cache_stats per call), on a cache of its own.
 *
 * Not part of the package: python/meson.build builds it beside kvprefix._kvprefix from the
 * same library objects and never installs it, so the wheel does not hold it; the benchmark
 * imports it from the build directory (build-py/build/python, or its --ext-dir). Its cache is
 * a kvp_cache of its own, made with the configuration the benchmark gives its Python caches,
 * so the C loop and the Python loop run the same library code on the same prompts, and
 * nothing here reaches into the binding's objects.
 *
 *     loop = _kvprefix_bench.Loop(n_blocks, block_size, hash_profile=..., hash_key=...,
 *                                 single_threaded=...)
 *     loop.run_batch(ns, buf, lens, first_id, ring) -> int   CPU ns of the whole batch
 *     loop.time_stats(n) -> float                             CPU ns per kvp_cache_stats
 *     loop.stats() -> tuple (kvp_stats in field order); loop.check() -> None
 *
 * Times are the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), which Python's
 * time.thread_time() reads too, so both sides of a comparison use one clock, and a machine
 * shared with other jobs does not count its waits for a core. The loops run without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "kvprefix.h"

typedef struct LoopObject {
    PyObject_HEAD kvp_cache *cache; /* the loop's own cache; never NULL after Loop_new */
} LoopObject;

/* Raise RuntimeError for library code rc of function fn. Returns NULL. */
static PyObject *raise_rc(int rc, const char *fn)
{
    PyErr_Format(PyExc_RuntimeError, "%s: %s (%d)", fn, kvp_strerror(rc), rc);
    return NULL;
}

/* The calling thread's CPU time in nanoseconds. */
static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static PyObject *Loop_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"n_blocks", "block_size",      "hash_profile",
                             "hash_key", "single_threaded", NULL};
    unsigned int n_blocks, block_size = 16;
    const char *profile = "keyed";
    Py_buffer key;
    int single = 0;
    memset(&key, 0, sizeof key); /* key.buf stays NULL when hash_key is None or omitted */
    if (!PyArg_ParseTupleAndKeywords(args, kw, "I|I$sz*p:Loop", kwlist, &n_blocks, &block_size,
                                     &profile, &key, &single))
        return NULL;
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = n_blocks;
    cfg.block_size = block_size;
    cfg.single_threaded = single != 0;
    int rc = kvp_hash_profile_parse(profile, &cfg.hash_profile);
    if (rc == KVP_OK && key.buf != NULL) {
        if (key.len < (Py_ssize_t)KVP_HASH_KEY_MIN || key.len > (Py_ssize_t)KVP_HASH_KEY_MAX)
            rc = KVP_EINVAL;
        else
            memcpy(cfg.hash_key, key.buf, (size_t)(cfg.hash_key_len = (uint32_t)key.len));
    }
    if (key.buf != NULL)
        PyBuffer_Release(&key);
    LoopObject *self = rc == KVP_OK ? (LoopObject *)type->tp_alloc(type, 0) : NULL;
    if (self != NULL && (rc = kvp_cache_new(&cfg, &self->cache)) != KVP_OK)
        Py_CLEAR(self);
    return self != NULL || PyErr_Occurred() ? (PyObject *)self : raise_rc(rc, "Loop");
}

static void Loop_dealloc(LoopObject *self)
{
    kvp_cache_free(self->cache);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The namespace of a kvprefix.Namespace (its four attributes: str, bytes or None) or of None,
 * with its fields' bytes in keep[] (to release with Py_XDECREF). Returns 0 or -1. */
static int ns_from(PyObject *obj, kvp_namespace *ns, PyObject *keep[4])
{
    static const char *const names[4] = {"model", "adapter", "tenant", "salt"};
    kvp_field *fields[4] = {&ns->model, &ns->adapter, &ns->tenant, &ns->salt};
    kvp_namespace_init(ns);
    for (int i = 0; i < 4; i++) {
        PyObject *v = obj == Py_None ? Py_NewRef(Py_None) : PyObject_GetAttrString(obj, names[i]);
        if (v == NULL)
            return -1;
        keep[i] = PyUnicode_Check(v) ? PyUnicode_AsUTF8String(v)
                  : v == Py_None     ? NULL
                                     : PyBytes_FromObject(v);
        bool failed = v != Py_None && keep[i] == NULL;
        Py_DECREF(v);
        if (failed)
            return -1;
        if (keep[i] != NULL) {
            fields[i]->ptr = PyBytes_AS_STRING(keep[i]);
            fields[i]->len = (size_t)PyBytes_GET_SIZE(keep[i]);
        }
    }
    return 0;
}

/* For each row k of buf, acquire + commit request first + k and release request
 * first + k - ring, without the GIL. Returns the first failing code (its function in *fn)
 * or KVP_OK, and the CPU time spent in *dt. */
static int batch_nogil(kvp_cache *kc, const kvp_namespace *ns, const Py_buffer *buf,
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

static bool is_u32(const Py_buffer *b)
{
    const char *f = b->format ? b->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    return b->itemsize == 4 && (strcmp(f, "I") == 0 || strcmp(f, "L") == 0);
}

static PyObject *Loop_run_batch(LoopObject *self, PyObject *args)
{
    PyObject *ns_obj, *buf_obj, *len_obj, *keep[4] = {NULL, NULL, NULL, NULL};
    unsigned long long first, ring;
    if (!PyArg_ParseTuple(args, "OOOKK:run_batch", &ns_obj, &buf_obj, &len_obj, &first, &ring))
        return NULL;
    kvp_namespace ns;
    Py_buffer buf, lens;
    PyObject *res = NULL;
    if (ns_from(ns_obj, &ns, keep) != 0 ||
        PyObject_GetBuffer(buf_obj, &buf, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0)
        goto out;
    if (PyObject_GetBuffer(len_obj, &lens, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyBuffer_Release(&buf);
        goto out;
    }
    if (buf.ndim != 2 || !is_u32(&buf) || lens.ndim != 1 || !is_u32(&lens) ||
        lens.shape[0] != buf.shape[0]) {
        PyErr_SetString(PyExc_TypeError, "run_batch: buf (n, width) and lens (n,) of uint32");
    } else {
        const char *fn = "";
        uint64_t dt = 0;
        int rc;
        Py_BEGIN_ALLOW_THREADS rc =
            batch_nogil(self->cache, &ns, &buf, lens.buf, first, ring, &fn, &dt);
        Py_END_ALLOW_THREADS res =
            rc == KVP_OK ? PyLong_FromUnsignedLongLong(dt) : raise_rc(rc, fn);
    }
    PyBuffer_Release(&buf);
    PyBuffer_Release(&lens);
out:
    for (int i = 0; i < 4; i++)
        Py_XDECREF(keep[i]);
    return res;
}

/* n calls of kvp_cache_stats, without the GIL. Returns CPU ns per call, or -1. */
static double stats_nogil(kvp_cache *kc, unsigned long long n)
{
    kvp_stats s;
    uint64_t t0 = now_ns();
    for (unsigned long long i = 0; i < n; i++) {
        if (kvp_cache_stats(kc, &s) != KVP_OK)
            return -1.0;
        __asm__ volatile("" : : "r"(&s) : "memory"); /* keep every call */
    }
    return (double)(now_ns() - t0) / (double)n;
}

static PyObject *Loop_time_stats(LoopObject *self, PyObject *arg)
{
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred())
        return NULL;
    if (n == 0)
        return raise_rc(KVP_EINVAL, "time_stats");
    double per_call;
    Py_BEGIN_ALLOW_THREADS per_call = stats_nogil(self->cache, n);
    Py_END_ALLOW_THREADS return per_call < 0 ? raise_rc(KVP_EBUSY, "kvp_cache_stats")
                                             : PyFloat_FromDouble(per_call);
}

static PyObject *Loop_stats(LoopObject *self, PyObject *unused)
{
    kvp_stats s;
    int rc = kvp_cache_stats(self->cache, &s);
    if (rc != KVP_OK)
        return raise_rc(rc, "kvp_cache_stats");
    return Py_BuildValue("(KKKKKKKKKKKKKKK)", s.n_requests, s.n_lookups, s.n_tokens_queried,
                         s.n_tokens_hit, s.n_blocks_hit, s.n_blocks_missed, s.n_blocks_stored,
                         s.n_blocks_deduped, s.n_evictions, s.n_verify_rejects, s.n_blocks_total,
                         s.n_blocks_free, s.n_blocks_cached, s.n_blocks_in_use,
                         s.n_requests_active);
}

static PyObject *Loop_check(LoopObject *self, PyObject *unused)
{
    int rc = kvp_cache_check(self->cache);
    return rc == KVP_OK ? Py_NewRef(Py_None) : raise_rc(rc, "kvp_cache_check");
}

static PyMethodDef Loop_methods[] = {
    {"run_batch", (PyCFunction)Loop_run_batch, METH_VARARGS,
     "run_batch($self, ns, buf, lens, first_id, ring, /)\n--\n\n"
     "For each row k of buf (a 2-D C-contiguous uint32 array, one prompt per row, lens[k] "
     "tokens used): acquire + commit request first_id + k, release request first_id + k - "
     "ring; in C without the GIL. Returns the thread CPU nanoseconds spent."},
    {"time_stats", (PyCFunction)Loop_time_stats, METH_O,
     "time_stats($self, n, /)\n--\n\nThread CPU nanoseconds per kvp_cache_stats call, n calls "
     "timed in C."},
    {"stats", (PyCFunction)Loop_stats, METH_NOARGS,
     "stats($self, /)\n--\n\nkvp_cache_stats as a tuple, in kvprefix.Stats' field order."},
    {"check", (PyCFunction)Loop_check, METH_NOARGS,
     "check($self, /)\n--\n\nkvp_cache_check; raises RuntimeError on a problem."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Loop_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_kvprefix_bench.Loop",
    .tp_basicsize = sizeof(LoopObject),
    .tp_dealloc = (destructor)Loop_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Loop(n_blocks, block_size=16, *, hash_profile='keyed', hash_key=None, "
              "single_threaded=False)\n--\n\nA kvp_cache of its own for the benchmark's C loops.",
    .tp_methods = Loop_methods,
    .tp_new = Loop_new,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "_kvprefix_bench",
    "The C loops of bench/bench_python.py (not part of the kvprefix package).",
    -1,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__kvprefix_bench(void);

PyMODINIT_FUNC PyInit__kvprefix_bench(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyType_Ready(&Loop_Type) < 0 ||
        PyModule_AddObjectRef(m, "Loop", (PyObject *)&Loop_Type) < 0 ||
        PyModule_AddStringConstant(m, "__version__", kvp_version()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
