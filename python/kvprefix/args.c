/*
 * args.c - argument tables: one kvpy_sig per function binds its positional and keyword
 * arguments, converts each by kind, and writes the first line of its docstring, the
 * __text_signature__ that inspect.signature() and help() read.
 *
 * A table is the parameters in order, each a name, a kind (kvpy.h: what it accepts), flags
 * (optional, keyword-only, None counts as omitted) and a numeric default:
 *
 *   static const kvpy_sig acquire_sig = {"acquire", {{"req_id", KVPY_U64, 0, 0},
 *       {"ns", KVPY_NS, 0, 0}, {"tokens", KVPY_TOKENS, 0, 0},
 *       {"capacity", KVPY_SIZE, KVPY_OPT, 0}}};
 *     parses acquire(1, ns, p, capacity=8) into a.v[0].u64 ... a.v[3].size, and documents
 *     "acquire($self, req_id, ns, tokens, capacity=0)\n--\n\n...".
 *
 * Why one table rather than a PyArg_ParseTupleAndKeywords format per function: the same
 * mistake (a negative req_id, a list of floats as tokens) then gets the same message in every
 * function, "acquire(): req_id: -1 is not in 0 .. 2**64 - 1", and the signature help() shows
 * is made from what the parser accepts, so the two cannot drift apart. Methods are
 * METH_FASTCALL: no argument tuple or keyword dict is built per call (bench/bench_python.py
 * measures the per-call overhead).
 *
 * Invariants: a table has at most KVPY_MAX_PARAMS parameters; keyword-only ones come last
 * (they are all optional); kvpy_parse either returns 0 with every parameter converted (the
 * default where omitted) or -1 holding nothing.
 */
#include <string.h>

#include "kvpy.h"

/* Parameters of sig, and how many of them may be passed by position. */
static int sig_count(const kvpy_sig *sig, int *n_pos)
{
    int n = 0;
    *n_pos = -1;
    while (n < KVPY_MAX_PARAMS && sig->params[n].name != NULL) {
        if (*n_pos < 0 && (sig->params[n].flags & KVPY_KWONLY) == KVPY_KWONLY)
            *n_pos = n;
        n++;
    }
    if (*n_pos < 0)
        *n_pos = n;
    return n;
}

/* The default of an omitted parameter. Cannot fail. */
static void set_default(const kvpy_param *p, kvpy_value *v)
{
    static kvp_namespace empty; /* zero-initialised: every field absent */
    memset(v, 0, sizeof *v);
    switch (p->kind) {
    case KVPY_OBJECT:
        v->obj = Py_None;
        break;
    case KVPY_U64:
    case KVPY_U32:
        v->u64 = p->def;
        break;
    case KVPY_SIZE:
        v->size = (size_t)p->def;
        break;
    case KVPY_BOOL:
        v->flag = p->def != 0;
        break;
    case KVPY_PROFILE:
    case KVPY_EVICTION:
        v->profile = (int)p->def;
        break;
    case KVPY_SCOPE:
        v->scope = (int)p->def;
        break;
    case KVPY_NS:
        v->ns = &empty;
        break;
    default: /* KEY: the zero key; TOKENS, KEYS: empty */
        break;
    }
}

int kvpy_convert(const kvpy_sig *sig, int i, PyObject *obj, kvpy_value *v)
{
    const kvpy_param *p = &sig->params[i];
    const char *fn = sig->name, *arg = p->name;
    switch (p->kind) {
    case KVPY_OBJECT:
        v->obj = obj;
        return 0;
    case KVPY_U64:
        return kvpy_u64(obj, &v->u64, fn, arg);
    case KVPY_U32:
        if (kvpy_u64(obj, &v->u64, fn, arg) != 0)
            return -1;
        if (v->u64 > UINT32_MAX) {
            kvpy_arg_error(NULL, fn, arg, ": %R is not in 0 .. 2**32 - 1", obj);
            return -1;
        }
        return 0;
    case KVPY_SIZE: {
        uint64_t x;
        if (kvpy_u64(obj, &x, fn, arg) != 0)
            return -1;
        if (x > SIZE_MAX) {
            kvpy_arg_error(NULL, fn, arg, ": %R is too large", obj);
            return -1;
        }
        v->size = (size_t)x;
        return 0;
    }
    case KVPY_BOOL: {
        int t = PyObject_IsTrue(obj);
        v->flag = t > 0;
        return t < 0 ? -1 : 0;
    }
    case KVPY_KEY:
        return kvpy_key(obj, &v->key, fn, arg);
    case KVPY_NS:
        return (v->ns = kvpy_ns(obj, fn, arg)) != NULL ? 0 : -1;
    case KVPY_TOKENS:
        return kvpy_tokens_get(obj, &v->tokens, fn, arg);
    case KVPY_KEYS:
        return kvpy_keys_get(obj, &v->keys, fn, arg);
    case KVPY_PROFILE:
        return kvpy_profile(obj, &v->profile, fn, arg);
    case KVPY_SCOPE:
        return kvpy_scope(obj, &v->scope, fn, arg);
    case KVPY_EVICTION:
        return kvpy_eviction(obj, &v->profile, fn, arg);
    }
    return -1; /* not reached: every kind is handled */
}

void kvpy_args_done(kvpy_args *a)
{
    for (int i = 0; i < a->n; i++) {
        if (!a->given[i])
            continue;
        if (a->sig->params[i].kind == KVPY_TOKENS)
            kvpy_tokens_done(&a->v[i].tokens);
        else if (a->sig->params[i].kind == KVPY_KEYS)
            PyMem_Free(a->v[i].keys.keys);
        a->given[i] = false;
    }
}

/* Bind keyword name = value to its parameter in obj[]. Returns 0, or -1 with TypeError. */
static int bind_keyword(const kvpy_sig *sig, int n, PyObject *name, PyObject *value, PyObject **obj)
{
    for (int i = 0; i < n; i++) {
        if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, sig->params[i].name))
            continue;
        if (obj[i] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", sig->name,
                         sig->params[i].name);
            return -1;
        }
        obj[i] = value;
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%S'", sig->name, name);
    return -1;
}

/* Steps: 1. check the count of positional arguments; 2. bind the keywords (the caller, into
 * obj[]); 3. check that every required parameter is bound; 4. convert each, or set its
 * default. */
static int convert_all(const kvpy_sig *sig, int n, PyObject **obj, kvpy_args *a)
{
    /* Step 3: every required parameter is bound. */
    for (int i = 0; i < n; i++) {
        if (obj[i] == NULL && !(sig->params[i].flags & KVPY_OPT)) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s' (pos %d)", sig->name,
                         sig->params[i].name, i + 1);
            return -1;
        }
    }
    /* Step 4: convert. */
    for (int i = 0; i < n; i++) {
        const kvpy_param *p = &sig->params[i];
        if (obj[i] == NULL || (obj[i] == Py_None && (p->flags & KVPY_NONE))) {
            set_default(p, &a->v[i]);
            continue;
        }
        if (kvpy_convert(sig, i, obj[i], &a->v[i]) != 0) {
            kvpy_args_done(a);
            return -1;
        }
        a->given[i] = true;
    }
    return 0;
}

/* Step 1 for both entry points: n parameters, nargs positional arguments into obj[]. */
static int bind_positional(const kvpy_sig *sig, kvpy_args *a, int *n, PyObject *const *args,
                           Py_ssize_t nargs, PyObject **obj)
{
    int n_pos;
    *n = sig_count(sig, &n_pos);
    a->sig = sig;
    a->n = *n;
    memset(a->given, 0, sizeof a->given);
    if (nargs > n_pos) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional argument%s (%zd given)",
                     sig->name, n_pos, n_pos == 1 ? "" : "s", nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        obj[i] = args[i];
    return 0;
}

int kvpy_parse(const kvpy_sig *sig, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
               kvpy_args *a)
{
    PyObject *obj[KVPY_MAX_PARAMS] = {NULL};
    int n;
    nargs = PyVectorcall_NARGS(nargs);
    if (bind_positional(sig, a, &n, args, nargs, obj) != 0)
        return -1;
    /* Step 2: the keywords, whose values follow the positional arguments. */
    Py_ssize_t n_kw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < n_kw; k++)
        if (bind_keyword(sig, n, PyTuple_GET_ITEM(kwnames, k), args[nargs + k], obj) != 0)
            return -1;
    return convert_all(sig, n, obj, a);
}

int kvpy_parse_tuple(const kvpy_sig *sig, PyObject *args, PyObject *kw, kvpy_args *a)
{
    PyObject *obj[KVPY_MAX_PARAMS] = {NULL};
    int n;
    if (bind_positional(sig, a, &n, PySequence_Fast_ITEMS(args), PyTuple_GET_SIZE(args), obj) != 0)
        return -1;
    /* Step 2: the keywords of the dict. */
    Py_ssize_t pos = 0;
    PyObject *name, *value;
    while (kw != NULL && PyDict_Next(kw, &pos, &name, &value))
        if (bind_keyword(sig, n, name, value, obj) != 0)
            return -1;
    return convert_all(sig, n, obj, a);
}

/* ---------------------------------------------------------------------------------------- */
/* Signatures                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* Append s to the buffer at *end (sized by the caller). */
static void put(char **end, const char *s)
{
    size_t n = strlen(s);
    memcpy(*end, s, n);
    *end += n;
}

/* The text of a parameter's default, as inspect's parser reads it. */
static void put_default(char **end, const kvpy_param *p)
{
    char num[32];
    if ((p->flags & KVPY_NONE) || p->kind == KVPY_OBJECT || p->kind == KVPY_KEY ||
        p->kind == KVPY_TOKENS || p->kind == KVPY_KEYS || p->kind == KVPY_NS) {
        put(end, "None");
    } else if (p->kind == KVPY_BOOL) {
        put(end, p->def ? "True" : "False");
    } else if (p->kind == KVPY_PROFILE || p->kind == KVPY_EVICTION) {
        const char *name = p->kind == KVPY_PROFILE ? kvp_hash_profile_name((int)p->def)
                                                   : kvpy_eviction_name((int)p->def);
        put(end, "'");
        put(end, name ? name : "?");
        put(end, "'");
    } else if (p->kind == KVPY_SCOPE) {
        const char *name = kvpy_scope_name((int)p->def);
        put(end, "'");
        put(end, name ? name : "?");
        put(end, "'");
    } else {
        snprintf(num, sizeof num, "%llu", (unsigned long long)p->def);
        put(end, num);
    }
}

/* "name(self, params[, /])\n--\n\n" and body in a PyMem buffer that is never freed, or NULL
 * with MemoryError. positional_only adds the "/" of METH_O, METH_NOARGS and fast calls without
 * keywords; otherwise "*" stands before the first keyword-only parameter. */
static char *make_doc(const kvpy_sig *sig, const char *self, bool positional_only, const char *body)
{
    int n_pos, n = sig_count(sig, &n_pos);
    size_t size = strlen(sig->name) + strlen(body) + 64 + (self ? strlen(self) : 0);
    for (int i = 0; i < n; i++)
        size += strlen(sig->params[i].name) + 48; /* ", ", "=", a default, "*, " */
    char *doc = PyMem_Malloc(size), *end = doc;
    if (doc == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    put(&end, sig->name);
    put(&end, "(");
    const char *sep = "";
    if (self != NULL) {
        put(&end, self);
        sep = ", ";
    }
    for (int i = 0; i < n; i++) {
        const kvpy_param *p = &sig->params[i];
        put(&end, sep);
        sep = ", ";
        if (i == n_pos && !positional_only)
            put(&end, "*, ");
        put(&end, p->name);
        if (p->flags & KVPY_OPT) {
            put(&end, "=");
            put_default(&end, p);
        }
    }
    if (positional_only && (self != NULL || n > 0)) {
        put(&end, sep);
        put(&end, "/");
    }
    put(&end, ")\n--\n\n");
    put(&end, body);
    *end = '\0';
    return doc;
}

PyMethodDef *kvpy_methods(const kvpy_def *defs, const char *self)
{
    size_t n = 0;
    while (defs[n].sig != NULL)
        n++;
    PyMethodDef *m = PyMem_Calloc(n + 1, sizeof *m);
    if (m == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        int f = defs[i].flags;
        bool positional_only = (f & METH_KEYWORDS) == 0;
        m[i].ml_name = defs[i].sig->name;
        m[i].ml_meth = defs[i].fn;
        m[i].ml_flags = f;
        m[i].ml_doc = make_doc(defs[i].sig, self, positional_only, defs[i].doc);
        if (m[i].ml_doc == NULL)
            return NULL;
    }
    return m;
}

const char *kvpy_type_doc(const kvpy_sig *sig, const char *body)
{
    return make_doc(sig, NULL, false, body);
}
