/*
 * events.c - event batches: the library's events, collected inside a library call without the
 * GIL, handed to the cache's Python callable after the call, in order, on the calling thread.
 *
 * The library calls its callback synchronously inside a mutating call, on the calling thread,
 * under the cache's exclusive lock and without the GIL, so the C callback
 * (kvpy_event_collect) only appends the event to the batch of the call in progress, which a
 * thread-local pointer names: concurrent calls each collect their own events. With the GIL
 * back, the calling thread hands each event of its batch to the Python callable in order.
 * Events of different threads' calls are delivered by each thread; a callable shared between
 * threads sees each call's events in order, and the calls' batches in any interleaving (each
 * batch comes after its call's mutation, so possibly after later mutations of other threads).
 * An exception raised by the callable does not stop delivery of the rest of the batch; after
 * the last one the first exception is re-raised as EventCallbackError (its __cause__ is the
 * original and .result what the call returned, since the call itself completed). The
 * callable may call the cache again: no lock is held during delivery.
 *
 * Cost: nothing for a cache without a callable (the batch stays empty, and delivery returns
 * at once); otherwise one PyMem_Raw array per call that emits events, doubling from 64.
 */
#include "kvpy.h"

_Thread_local evbatch *kvpy_tls_events;

/* Runs inside a library call, under the cache's exclusive lock and without the GIL, so it only
 * records the event in the calling thread's batch. Cannot fail (a failed growth counts a lost
 * event, reported after the call). */
void kvpy_event_collect(void *ud, const kvp_event *ev)
{
    evbatch *b = kvpy_tls_events;
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

/* Returns result, or NULL with EventCallbackError set when the callable raised (the first
 * exception is its __cause__; .result holds result), or with the call's own exception when
 * result is NULL (the callable's first exception is then its __cause__). */
PyObject *kvpy_events_deliver(CacheObject *self, evbatch *b, PyObject *result)
{
    if (b->n == 0 && b->n_lost == 0) {
        PyMem_RawFree(b->ev);
        return result;
    }
    PyObject *saved = exc_fetch(); /* the call's own error, if any */
    PyObject *first = NULL;
    for (size_t i = 0; i < b->n && self->on_event != NULL; i++) {
        PyObject *ev = kvpy_event_to_py(&b->ev[i], kvpy_tier_medium(self, b->ev[i].tier));
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
    PyObject *exc = msg ? PyObject_CallOneArg(kvpy_err_callback, msg) : NULL;
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
        PyErr_SetObject(kvpy_err_callback, exc);
        Py_DECREF(exc);
    } else {
        Py_XDECREF(first);
    }
    Py_XDECREF(result);
    return NULL;
}
