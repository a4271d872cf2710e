/*
 * request.c - the Request type: one request of a cache as a context manager, which
 * Cache.request() returns; entering acquires, leaving releases, also when the body raises.
 *
 *     with cache.request(req_id, ns, prompt, capacity=n) as req:
 *         prefill(prompt[req.match.n_tokens_hit:], req.blocks)
 *         req.commit(prompt)
 *
 * Layout: the cache (a reference), req_id, the namespace and tokens as given (kept until the
 * request is entered, then dropped), the capacity, acquire's Match, and the state:
 *
 *     NEW --__enter__--> ENTERING --acquired--> ACTIVE --__exit__--> DONE
 *                           |  (failed: back to NEW, nothing held)
 *                           +-- acquired, but the on_event callable raised: released, DONE
 *
 * Invariants: the state changes only with the GIL held, before the library call it leads to,
 * so of two threads leaving one request only the first releases it (it moves ACTIVE to DONE
 * before releasing); a request is released at most once by its Request, and a DONE request is
 * never touched again, so a later request with the same id is safe from it. commit, grow and
 * blocks need ACTIVE and raise ValueError otherwise; match is readable once entered, after
 * the exit too.
 *
 * Why acquire on entry rather than in Cache.request(): a Request that is never entered holds
 * nothing, so `req = cache.request(...)` without `with` cannot leak pinned blocks. Why a C
 * type: the state check and change happen under the GIL without a lock of their own, and the
 * calls go straight to the cache's C functions (cache.c) with no extra Python frame.
 *
 * A Request dropped while ACTIVE (entered by hand, never left) keeps its request active, as a
 * forgotten Cache.release would: its dealloc makes no library call.
 */
#include "kvpy.h"

typedef enum req_state { REQ_NEW, REQ_ENTERING, REQ_ACTIVE, REQ_DONE } req_state;

typedef struct RequestObject {
    PyObject_HEAD CacheObject *cache; /* the cache (a reference) */
    uint64_t req_id;                  /* the request's id in the cache */
    PyObject *ns;                     /* Namespace or None as given; NULL once ACTIVE */
    PyObject *tokens;                 /* the prompt as given; NULL once ACTIVE */
    size_t capacity;                  /* acquire's capacity */
    PyObject *match;                  /* acquire's Match; NULL before ACTIVE */
    req_state state;                  /* see the picture above; GIL */
} RequestObject;

static PyTypeObject request_type;

PyObject *kvpy_request_new(CacheObject *cache, uint64_t req_id, PyObject *ns, PyObject *tok_obj,
                           size_t capacity)
{
    RequestObject *self = PyObject_GC_New(RequestObject, &request_type);
    if (self == NULL)
        return NULL;
    self->cache = (CacheObject *)Py_NewRef(cache);
    self->req_id = req_id;
    self->ns = Py_NewRef(ns);
    self->tokens = Py_NewRef(tok_obj);
    self->capacity = capacity;
    self->match = NULL;
    self->state = REQ_NEW;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static int Request_traverse(RequestObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->cache);
    Py_VISIT(self->ns);
    Py_VISIT(self->tokens);
    Py_VISIT(self->match);
    return 0;
}

static int Request_clear(RequestObject *self)
{
    Py_CLEAR(self->cache);
    Py_CLEAR(self->ns);
    Py_CLEAR(self->tokens);
    Py_CLEAR(self->match);
    return 0;
}

static void Request_dealloc(RequestObject *self)
{
    PyObject_GC_UnTrack(self);
    Request_clear(self);
    PyObject_GC_Del(self);
}

/* True when the request is ACTIVE; else false with ValueError saying why. */
static bool is_active(RequestObject *self)
{
    if (self->state == REQ_ACTIVE && self->cache != NULL)
        return true;
    unsigned long long id = (unsigned long long)self->req_id;
    if (self->state == REQ_DONE || self->cache == NULL)
        PyErr_Format(PyExc_ValueError,
                     "request %llu has ended: it was released when its with block was left", id);
    else
        PyErr_Format(PyExc_ValueError,
                     "request %llu is not active: use it inside `with cache.request(...) as "
                     "req:`",
                     id);
    return false;
}

/* Release the request while an exception is pending, keeping that exception; the release's
 * own result or error is dropped. Cannot fail. */
static void release_keeping_error(RequestObject *self)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyObject *r = kvpy_cache_release(self->cache, self->req_id);
    Py_XDECREF(r);
    PyErr_Clear();
    PyErr_Restore(t, v, tb);
}

/* Steps: 1. check the state and convert the arguments kept since request(); 2. acquire in
 * state ENTERING (the GIL is released during the call, and another thread must see the
 * request as neither new nor active meanwhile); 3. on success, ACTIVE; on failure, NEW again
 * (nothing is held), unless the request did start and only the on_event callable raised:
 * then it is released at once, since no __exit__ will follow a failed __enter__. */
static PyObject *Request_enter(RequestObject *self, PyObject *unused)
{
    /* Step 1: the state and the arguments. */
    if (self->state != REQ_NEW) {
        PyErr_Format(PyExc_ValueError,
                     "request %llu was entered already: a Request is used once; make another "
                     "with cache.request()",
                     (unsigned long long)self->req_id);
        return NULL;
    }
    const kvp_namespace *ns = kvpy_ns(self->ns, "request", "ns");
    tokens t;
    if (ns == NULL || kvpy_tokens_get(self->tokens, &t, "request", "tokens") != 0)
        return NULL;
    /* Step 2: acquire. */
    self->state = REQ_ENTERING;
    PyObject *m = kvpy_cache_acquire(self->cache, self->req_id, ns, &t, self->capacity);
    kvpy_tokens_done(&t);
    /* Step 3: the new state. */
    if (m == NULL) {
        if (PyErr_ExceptionMatches(kvpy_err_callback)) {
            release_keeping_error(self);
            self->state = REQ_DONE;
        } else {
            self->state = REQ_NEW;
        }
        return NULL;
    }
    self->match = m;
    self->state = REQ_ACTIVE;
    Py_CLEAR(self->ns);
    Py_CLEAR(self->tokens);
    return Py_NewRef(self);
}

static const kvpy_sig exit_sig = {"__exit__",
                                  {{"exc_type", KVPY_OBJECT, 0, 0},
                                   {"exc_value", KVPY_OBJECT, 0, 0},
                                   {"traceback", KVPY_OBJECT, 0, 0}}};

/* Record the pending release error on the body's exception exc as a note (Python 3.11's
 * add_note; dropped where there is none), and clear it: the body's exception is what
 * propagates. Cannot fail. */
static void note_release_error(PyObject *exc, uint64_t req_id)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    PyObject *add = PyObject_GetAttrString(exc, "add_note");
    PyObject *note = add ? PyUnicode_FromFormat("releasing request %llu on leaving the with block "
                                                "failed too: %R",
                                                (unsigned long long)req_id, v)
                         : NULL;
    PyObject *r = note ? PyObject_CallOneArg(add, note) : NULL;
    Py_XDECREF(r);
    Py_XDECREF(note);
    Py_XDECREF(add);
    PyErr_Clear();
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
}

/* Release once: an exit of a request that is not ACTIVE (never entered, or left already)
 * does nothing, and a closed cache has no requests left to release. A release error
 * propagates when the body completed, and is noted on the body's exception otherwise.
 * Returns False: the body's exception, if any, is never suppressed. */
static PyObject *Request_exit(RequestObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    kvpy_args a;
    if (kvpy_parse(&exit_sig, args, nargs, NULL, &a) != 0)
        return NULL;
    if (self->state != REQ_ACTIVE || self->cache == NULL)
        Py_RETURN_FALSE;
    self->state = REQ_DONE;
    if (self->cache->cache == NULL)
        Py_RETURN_FALSE;
    PyObject *r = kvpy_cache_release(self->cache, self->req_id);
    if (r != NULL) {
        Py_DECREF(r);
        Py_RETURN_FALSE;
    }
    if (a.v[0].obj == Py_None)
        return NULL;
    note_release_error(a.v[1].obj, self->req_id);
    Py_RETURN_FALSE;
}

static const kvpy_sig commit_sig = {"commit", {{"tokens", KVPY_TOKENS, 0, 0}}};

static PyObject *Request_commit(RequestObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames)
{
    kvpy_args a;
    if (!is_active(self) || kvpy_parse(&commit_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    PyObject *res = kvpy_cache_commit(self->cache, self->req_id, &a.v[0].tokens);
    kvpy_args_done(&a);
    return res;
}

static const kvpy_sig grow_sig = {"grow", {{"capacity", KVPY_SIZE, 0, 0}}};

static PyObject *Request_grow(RequestObject *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    kvpy_args a;
    if (!is_active(self) || kvpy_parse(&grow_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    return kvpy_cache_grow(self->cache, self->req_id, a.v[0].size);
}

static PyObject *Request_get_blocks(RequestObject *self, void *closure)
{
    return is_active(self) ? kvpy_cache_blocks(self->cache, self->req_id) : NULL;
}

static PyObject *Request_get_match(RequestObject *self, void *closure)
{
    if (self->match != NULL)
        return Py_NewRef(self->match);
    (void)is_active(self); /* never true without a match: it raises, saying why */
    return NULL;
}

static PyObject *Request_get_req_id(RequestObject *self, void *closure)
{
    return PyLong_FromUnsignedLongLong(self->req_id);
}

static PyObject *Request_get_active(RequestObject *self, void *closure)
{
    return PyBool_FromLong(self->state == REQ_ACTIVE);
}

static PyObject *Request_repr(RequestObject *self)
{
    static const char *const names[] = {"new", "entering", "active", "ended"};
    return PyUnicode_FromFormat("<kvprefix.Request %llu, %s>", (unsigned long long)self->req_id,
                                names[self->state]);
}

static const kvpy_sig enter_sig = {"__enter__", {{NULL, KVPY_OBJECT, 0, 0}}};

static const kvpy_def Request_defs[] = {
    {&enter_sig, (PyCFunction)Request_enter, METH_NOARGS,
     "Acquire the request (Cache.acquire with request()'s arguments); returns the Request. "
     "A Request is entered once."},
    {&exit_sig, KVPY_FN(Request_exit), METH_FASTCALL,
     "Release the request (once; nothing when it is not active or the cache is closed). A "
     "release error propagates when the body completed, and is added as a note to the "
     "body's exception otherwise. Never suppresses the body's exception."},
    {&commit_sig, KVPY_FN(Request_commit), KVPY_FASTKW,
     "Cache.commit(req_id, tokens): register the newly full blocks of tokens, the request's "
     "whole sequence so far. Returns the number of blocks newly indexed."},
    {&grow_sig, KVPY_FN(Request_grow), KVPY_FASTKW,
     "Cache.grow(req_id, capacity): hold blocks for capacity tokens. Returns None."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Request_getset[] = {
    {"match", (getter)Request_get_match, NULL,
     "The Match acquire returned (readable once entered, and after the exit).", NULL},
    {"blocks", (getter)Request_get_blocks, NULL,
     "The request's block ids in token order, a new list (Cache.request_blocks).", NULL},
    {"req_id", (getter)Request_get_req_id, NULL, "The request's id.", NULL},
    {"active", (getter)Request_get_active, NULL, "Entered and not yet left.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject request_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvprefix.Request",
    .tp_basicsize = sizeof(RequestObject),
    .tp_dealloc = (destructor)Request_dealloc,
    .tp_repr = (reprfunc)Request_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One request of a Cache as a context manager, made by Cache.request():\n"
              "entering acquires, leaving releases (also when the body raises).",
    .tp_traverse = (traverseproc)Request_traverse,
    .tp_clear = (inquiry)Request_clear,
    .tp_getset = Request_getset,
};

int kvpy_request_add(PyObject *m)
{
    request_type.tp_methods = kvpy_methods(Request_defs, "$self");
    if (request_type.tp_methods == NULL || PyType_Ready(&request_type) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "Request", (PyObject *)&request_type);
}
