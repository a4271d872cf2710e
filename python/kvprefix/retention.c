/*
 * retention.c - retention options from Python: the mapping that Cache.set_retention,
 * Cache.access(retention=...) and Cache.access_ids(retention=...) take, converted to a
 * kvp_retention (docs/python.md, "Retention priorities"):
 *
 *   {"priority": 80, "duration": 0, "ranges": [(0, 512, 90), (512, 600, 10, 30)]}
 *
 * Every key is optional (priority 35, duration 0: never lapses, no ranges); a range is
 * (token_start, token_end, priority) or (token_start, token_end, priority, duration). The same
 * shape as the "retention" field of a replay log line (docs/replay.md). Ranges past the
 * prompt and priorities above 100 are left to the library, which names them (EINVAL); the
 * binding checks only the Python types and the 64-range limit (the buffer is the caller's).
 */
#include <string.h>

#include "kvpy.h"

/* One int field of a retention mapping or range into *out, in 0 .. max. */
static int small_int(PyObject *obj, uint64_t max, uint64_t *out, const char *fn, const char *arg)
{
    if (kvpy_u64(obj, out, fn, arg) != 0)
        return -1;
    if (*out > max) {
        kvpy_arg_error(NULL, fn, arg, ": %llu is above %llu", (unsigned long long)*out,
                       (unsigned long long)max);
        return -1;
    }
    return 0;
}

int kvpy_retention_get(PyObject *obj, kvp_retention *r, kvp_retention_range *buf, const char *fn)
{
    kvp_retention_init(r);
    if (!PyDict_Check(obj)) {
        kvpy_arg_error(PyExc_TypeError, fn, "retention",
                       ": expected a dict with priority, duration and ranges, got %s",
                       Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(obj, &pos, &k, &v)) {
        if (!PyUnicode_Check(k) || (PyUnicode_CompareWithASCIIString(k, "priority") != 0 &&
                                    PyUnicode_CompareWithASCIIString(k, "duration") != 0 &&
                                    PyUnicode_CompareWithASCIIString(k, "ranges") != 0)) {
            kvpy_arg_error(NULL, fn, "retention", ": unknown key %R (priority, duration, ranges)",
                           k);
            return -1;
        }
    }
    uint64_t u;
    PyObject *item = PyDict_GetItemString(obj, "priority"); /* borrowed */
    if (item && item != Py_None) {
        if (small_int(item, UINT32_MAX, &u, fn, "retention['priority']") != 0)
            return -1;
        r->priority = (uint32_t)u;
    }
    item = PyDict_GetItemString(obj, "duration");
    if (item && item != Py_None && kvpy_u64(item, &r->duration, fn, "retention['duration']") != 0)
        return -1;
    item = PyDict_GetItemString(obj, "ranges");
    if (!item || item == Py_None)
        return 0;
    PyObject *seq = PySequence_Fast(item, "ranges must be a sequence of tuples");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > (Py_ssize_t)KVP_RETENTION_MAX_RANGES) {
        kvpy_arg_error(NULL, fn, "retention['ranges']", ": %zd ranges, more than %u", n,
                       KVP_RETENTION_MAX_RANGES);
        Py_DECREF(seq);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(seq, i);
        kvp_retention_range *g = &buf[i];
        memset(g, 0, sizeof *g);
        Py_ssize_t len = PyTuple_Check(t) || PyList_Check(t) ? PySequence_Size(t) : -1;
        if (len != 3 && len != 4) {
            kvpy_arg_error(NULL, fn, "retention['ranges']",
                           "[%zd]: expected (token_start, token_end, priority[, duration])", i);
            Py_DECREF(seq);
            return -1;
        }
        uint64_t f[4] = {0, 0, 0, 0};
        for (Py_ssize_t j = 0; j < len; j++) {
            PyObject *x = PySequence_GetItem(t, j);
            int rc = x ? kvpy_u64(x, &f[j], fn, "retention['ranges']") : -1;
            Py_XDECREF(x);
            if (rc != 0) {
                Py_DECREF(seq);
                return -1;
            }
        }
        if (f[2] > UINT32_MAX) {
            kvpy_arg_error(NULL, fn, "retention['ranges']", "[%zd]: priority %llu is above 100", i,
                           (unsigned long long)f[2]);
            Py_DECREF(seq);
            return -1;
        }
        g->token_start = f[0];
        g->token_end = f[1];
        g->priority = (uint32_t)f[2];
        g->duration = f[3];
    }
    Py_DECREF(seq);
    r->ranges = n ? buf : NULL;
    r->n_ranges = (size_t)n;
    return 0;
}
