/*
 * module.c - the module kvprefix._kvprefix: its initialisation, its constants, the exception
 * classes with the one function that raises a library error, and the module-level functions.
 *
 * The extension is the CPython binding of the public C API (kvprefix.h) only; kvpy.h lists its
 * files. Why the C API and not cffi: Debian 12 ships python3-dev and python3-mesonpy, so meson
 * builds the extension like any other target and `pip install --no-build-isolation .` works
 * offline; the hot path (acquire + commit + release per request) costs a few argument
 * conversions instead of cffi's per-call marshalling, the GIL can be released around exactly
 * the library call, and the buffer protocol gives zero-copy access to array('I'), numpy
 * uint32 arrays and memoryviews. docs/python.md has the measured per-call overhead.
 *
 * Errors. Each KVP_E* code has a class under KvprefixError (a few also under a builtin:
 * InvalidArgumentError is a ValueError, ...), kept in kvpy_err_by_code by -code. Two
 * functions make every exception the binding raises with a code:
 *
 *   kvpy_raise(rc, fn)              a library call failed: .code rc, .function fn
 *   kvpy_arg_error(exc, fn, arg, ..) the binding refused an argument before any call:
 *                                   .code EINVAL, .function None (or a builtin exc)
 *
 * so the library's own detail of a failure (kvp_errmsg) is added in one place (kvpy_raise,
 * step 2), and shown in the message and as the exception's .detail.
 *
 * Keys are Python ints of 128 bits: (hi << 64) | lo of kvp_key.
 */
#include <string.h>

#include "kvpy.h"

PyObject *kvpy_err_base;
PyObject *kvpy_err_callback;
PyObject *kvpy_err_by_code[13];

static const char *const code_names[13] = {
    "KVP_OK",     "KVP_EINVAL",    "KVP_ENOMEM", "KVP_ENOSPC", "KVP_ENOENT",
    "KVP_EEXIST", "KVP_EOVERFLOW", "KVP_ERANGE", "KVP_EBUSY",  "KVP_ECORRUPT",
    "KVP_ETOKEN", "KVP_ENOTSUP",   "KVP_ETOOBIG"};

/* ---------------------------------------------------------------------------------------- */
/* Raising                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* Raise an instance of cls made from msg (a str), with .code code, .function fn (None when
 * fn is NULL) and .detail detail (None when NULL). When making it fails, that failure is what
 * is raised. */
static void raise_with(PyObject *cls, PyObject *msg, int code, const char *fn, const char *detail)
{
    PyObject *exc = PyObject_CallOneArg(cls, msg);
    if (exc == NULL)
        return;
    PyObject *c = PyLong_FromLong(code);
    PyObject *f = fn ? PyUnicode_FromString(fn) : Py_NewRef(Py_None);
    PyObject *d = detail ? PyUnicode_DecodeUTF8(detail, (Py_ssize_t)strlen(detail), "replace")
                         : Py_NewRef(Py_None);
    if (c != NULL && f != NULL && d != NULL && PyObject_SetAttrString(exc, "code", c) == 0 &&
        PyObject_SetAttrString(exc, "function", f) == 0 &&
        PyObject_SetAttrString(exc, "detail", d) == 0)
        PyErr_SetObject(cls, exc);
    Py_XDECREF(c);
    Py_XDECREF(f);
    Py_XDECREF(d);
    Py_DECREF(exc);
}

/* Steps: 1. the class of rc; 2. the message; 3. the exception with .code, .function and
 * .detail. It must run on the thread whose call failed, before that thread makes another
 * kvp_ call (finish() in cache.c raises before it delivers the call's events, whose callable
 * may call the cache again): kvp_errmsg() is that thread's detail of its last failure, valid
 * until its next call. */
PyObject *kvpy_raise(int rc, const char *fn)
{
    /* Step 1: the class of rc. */
    bool known = rc < 0 && rc > -13;
    PyObject *cls = known ? kvpy_err_by_code[-rc] : kvpy_err_base;
    /* Step 2: the message: the function, kvp_strerror's text, the library's detail (which
     * argument and why) when it says more than that text, the code's name and value. */
    const char *what = kvp_strerror(rc);
    const char *detail = kvp_errmsg();
    bool more = detail[0] != '\0' && strcmp(detail, what) != 0;
    PyObject *msg =
        PyUnicode_FromFormat("%s: %s%s%s (%s, %d)", fn, what, more ? ": " : "", more ? detail : "",
                             known ? code_names[-rc] : "unknown", rc);
    /* Step 3: the exception. */
    if (msg != NULL) {
        raise_with(cls, msg, rc, fn, more ? detail : NULL);
        Py_DECREF(msg);
    }
    return NULL;
}

void kvpy_arg_error(PyObject *exc, const char *fn, const char *arg, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PyObject *tail = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (tail == NULL)
        return;
    PyObject *msg = PyUnicode_FromFormat("%s(): %s%U", fn, arg, tail);
    Py_DECREF(tail);
    if (msg == NULL)
        return;
    if (exc == NULL)
        raise_with(kvpy_err_by_code[-KVP_EINVAL], msg, KVP_EINVAL, NULL, NULL);
    else
        PyErr_SetObject(exc, msg);
    Py_DECREF(msg);
}

/* ---------------------------------------------------------------------------------------- */
/* Exception classes and constants                                                          */
/* ---------------------------------------------------------------------------------------- */

/* The exception classes: name, code, extra builtin base (or NULL), docstring. */
typedef struct errdef {
    const char *name; /* attribute name in the module */
    int code;         /* KVP_E* */
    PyObject **base;  /* a builtin exception also inherited, or NULL */
    const char *doc;  /* docstring */
} errdef;

int kvpy_errors_add(PyObject *m)
{
    kvpy_err_base = PyErr_NewExceptionWithDoc(
        "kvprefix.KvprefixError",
        "An error from the kvprefix library: .code is the KVP_E* code (negative int), "
        ".function the C function that returned it (None for argument checks made by the "
        "binding).",
        NULL, NULL);
    if (kvpy_err_base == NULL || PyModule_AddObjectRef(m, "KvprefixError", kvpy_err_base) < 0)
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
        PyObject *bases = defs[i].base ? PyTuple_Pack(2, kvpy_err_base, *defs[i].base)
                                       : PyTuple_Pack(1, kvpy_err_base);
        PyObject *cls = bases ? PyErr_NewExceptionWithDoc(qual, defs[i].doc, bases, NULL) : NULL;
        Py_XDECREF(bases);
        if (cls == NULL || PyModule_AddObjectRef(m, defs[i].name, cls) < 0)
            return -1;
        kvpy_err_by_code[-defs[i].code] = cls;
    }
    kvpy_err_by_code[0] = kvpy_err_base;
    kvpy_err_callback = PyErr_NewExceptionWithDoc(
        "kvprefix.EventCallbackError",
        "The on_event callable raised (its exception is __cause__). The library call itself "
        "completed and the cache is consistent; .result holds what the call returned.",
        kvpy_err_base, NULL);
    if (kvpy_err_callback == NULL ||
        PyModule_AddObjectRef(m, "EventCallbackError", kvpy_err_callback) < 0)
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
        {"QUOTA_SCOPE_NAMESPACE", KVP_QUOTA_SCOPE_NAMESPACE},
        {"QUOTA_SCOPE_TENANT", KVP_QUOTA_SCOPE_TENANT},
        {"QUOTA_SCOPE_MODEL", KVP_QUOTA_SCOPE_MODEL},
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

/* ---------------------------------------------------------------------------------------- */
/* Module-level functions                                                                   */
/* ---------------------------------------------------------------------------------------- */

static const kvpy_sig hash_blocks_sig = {"hash_blocks",
                                         {{"tokens", KVPY_TOKENS, 0, 0},
                                          {"block_size", KVPY_U32, KVPY_OPT, 16},
                                          {"seed", KVPY_U64, KVPY_KWONLY, KVP_DEFAULT_SEED},
                                          {"parent", KVPY_KEY, KVPY_KWONLY, 0}}};

/* kvp_hash_blocks without the GIL, into a new list of ints. The library checks block_size
 * (1 .. KVP_MAX_BLOCK_SIZE); 0 only keeps the division below defined. */
static PyObject *mod_hash_blocks(PyObject *m, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&hash_blocks_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    const tokens *t = &a.v[0].tokens;
    uint32_t block_size = (uint32_t)a.v[1].u64;
    size_t cap = block_size ? t->n / block_size : 0, n = 0;
    kvp_key *keys = PyMem_RawMalloc(cap * sizeof *keys + sizeof *keys);
    if (keys == NULL) {
        kvpy_args_done(&a);
        return PyErr_NoMemory();
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS rc =
        kvp_hash_blocks(a.v[2].u64, a.v[3].key, t->ptr, t->n, block_size, keys, cap, &n);
    Py_END_ALLOW_THREADS kvpy_args_done(&a);
    PyObject *res = rc == KVP_OK ? kvpy_keys_to_list(keys, n) : kvpy_raise(rc, "kvp_hash_blocks");
    PyMem_RawFree(keys);
    return res;
}

static const kvpy_sig namespace_key_sig = {
    "namespace_key", {{"ns", KVPY_NS, 0, 0}, {"seed", KVPY_U64, KVPY_OPT, KVP_DEFAULT_SEED}}};

static PyObject *mod_namespace_key(PyObject *m, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&namespace_key_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    kvp_key k;
    int rc = kvp_namespace_key(a.v[1].u64, a.v[0].ns, &k);
    return rc == KVP_OK ? kvpy_key_to_int(k) : kvpy_raise(rc, "kvp_namespace_key");
}

static const kvpy_sig external_key_sig = {"external_key",
                                          {{"root", KVPY_KEY, 0, 0},
                                           {"external_id", KVPY_KEY, 0, 0},
                                           {"seed", KVPY_U64, KVPY_OPT, KVP_DEFAULT_SEED}}};

static PyObject *mod_external_key(PyObject *m, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&external_key_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    return kvpy_key_to_int(kvp_external_key(a.v[2].u64, a.v[0].key, a.v[1].key));
}

static const kvpy_sig strerror_sig = {"strerror", {{"code", KVPY_OBJECT, 0, 0}}};

static PyObject *mod_strerror(PyObject *m, PyObject *arg)
{
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(kvp_strerror(code < INT32_MIN || code > INT32_MAX ? 1 : (int)code));
}

static const kvpy_sig profile_name_sig = {"hash_profile_name", {{"profile", KVPY_OBJECT, 0, 0}}};

static PyObject *mod_hash_profile_name(PyObject *m, PyObject *arg)
{
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    const char *name = kvp_hash_profile_name(v < INT32_MIN || v > INT32_MAX ? 0 : (int)v);
    if (name == NULL) {
        kvpy_arg_error(NULL, "hash_profile_name", "profile", ": unknown hash profile %R", arg);
        return NULL;
    }
    return PyUnicode_FromString(name);
}

static const kvpy_sig profile_parse_sig = {"hash_profile_parse", {{"name", KVPY_PROFILE, 0, 0}}};

static PyObject *mod_hash_profile_parse(PyObject *m, PyObject *arg)
{
    kvpy_value v;
    if (kvpy_convert(&profile_parse_sig, 0, arg, &v) != 0)
        return NULL;
    return PyLong_FromLong(v.profile);
}

static const kvpy_sig version_sig = {"version", {{NULL, KVPY_OBJECT, 0, 0}}};

static PyObject *mod_version(PyObject *m, PyObject *unused)
{
    return PyUnicode_FromString(kvp_version());
}

static const kvpy_sig token_address_sig = {"_token_address", {{"tokens", KVPY_TOKENS, 0, 0}}};

/* For the tests: the address the library would read tokens from, and whether that is the
 * caller's own memory (True) or a converted copy (False). */
static PyObject *mod_token_address(PyObject *m, PyObject *obj)
{
    kvpy_value v;
    if (kvpy_convert(&token_address_sig, 0, obj, &v) != 0)
        return NULL;
    PyObject *res = Py_BuildValue("(KO)", (unsigned long long)(uintptr_t)v.tokens.ptr,
                                  v.tokens.owned == NULL ? Py_True : Py_False);
    kvpy_tokens_done(&v.tokens);
    return res;
}

static const kvpy_def module_defs[] = {
    {&hash_blocks_sig, KVPY_FN(mod_hash_blocks), KVPY_FASTKW,
     "Chain-hash the full blocks of tokens (kvp_hash_blocks, the xxh3 profile) into a list of "
     "int keys; parent is the key before the first block (a namespace root from "
     "namespace_key; None: the zero key). Releases the GIL."},
    {&namespace_key_sig, KVPY_FN(mod_namespace_key), KVPY_FASTKW,
     "The namespace root key, an int (kvp_namespace_key)."},
    {&external_key_sig, KVPY_FN(mod_external_key), KVPY_FASTKW,
     "The key (an int) of an externally computed block id in the namespace with root key "
     "root (kvp_external_key)."},
    {&strerror_sig, (PyCFunction)mod_strerror, METH_O,
     "The library's description (a str) of a status code."},
    {&profile_name_sig, (PyCFunction)mod_hash_profile_name, METH_O,
     "The name (a str) of a HASH_* profile."},
    {&profile_parse_sig, (PyCFunction)mod_hash_profile_parse, METH_O,
     "The HASH_* constant (an int) of a profile name."},
    {&version_sig, (PyCFunction)mod_version, METH_NOARGS, "The C library's version (a str)."},
    {&token_address_sig, (PyCFunction)mod_token_address, METH_O,
     "For tests: (address, borrowed), the address the library reads the tokens at, and "
     "whether it is the caller's memory (no copy)."},
    {NULL, NULL, 0, NULL},
};

/* ---------------------------------------------------------------------------------------- */
/* Initialisation                                                                           */
/* ---------------------------------------------------------------------------------------- */

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "kvprefix._kvprefix",
    "The C extension behind the kvprefix package (see kvprefix's docstring).",
    -1,
    NULL, /* module_defs, with their signatures, once built */
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__kvprefix(void);

PyMODINIT_FUNC PyInit__kvprefix(void)
{
    if (module_def.m_methods == NULL &&
        (module_def.m_methods = kvpy_methods(module_defs, "$module")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (kvpy_convert_init() < 0 || kvpy_errors_add(m) < 0 || add_constants(m) < 0 ||
        kvpy_records_add(m) < 0 || kvpy_namespace_add(m) < 0 || kvpy_cache_add(m) < 0 ||
        kvpy_request_add(m) < 0 || kvpy_hasher_add(m) < 0 || kvpy_tiers_add(m) < 0 ||
        PyModule_AddStringConstant(m, "__version__", kvp_version()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
