/*
 * kvpy.h - what the source files of the CPython extension kvprefix._kvprefix share: the
 * object structs, the argument tables, the value conversions and the one function that raises
 * a library error. Private to python/kvprefix/; nothing here is installed, and the extension
 * reaches the library through its public API (kvprefix.h) only.
 *
 * Files (one concern each):
 *   module.c     the module: initialisation, constants, exception classes, kvpy_raise (every
 *                library error), and the module-level functions
 *   args.c       argument tables: binding positional and keyword arguments, converting them
 *                by kind, and the docstrings whose first line is __text_signature__
 *   convert.c    single values between Python and C: ints, keys, tokens, key lists,
 *                namespace arguments, hash profiles
 *   records.c    the struct sequences Match, Stats, Event and Chain
 *   namespace.c  the Namespace type
 *   events.c     event batches: collected inside library calls without the GIL, handed to
 *                the Python callable after them
 *   cache.c      the Cache type
 *   request.c    the Request context manager that Cache.request returns
 *   hasher.c     the Hasher type
 *   retention.c  retention options (a dict) to a kvp_retention
 *   tiers.c      the lower tiers' methods of Cache and their records (TierOrder, ...)
 *
 * Names: kvpy_ for what these files share, so that a reader tells binding code from the
 * library's kvp_ API at a glance; what one file uses alone is static and unprefixed.
 *
 * Single-phase initialisation (one interpreter): the module's globals below are set once by
 * PyInit__kvprefix and never freed, like the module itself.
 */
#ifndef KVPY_H
#define KVPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvprefix.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the token buffer checks assume a little-endian host"
#endif

/* ---------------------------------------------------------------------------------------- */
/* Errors (module.c)                                                                         */
/* ---------------------------------------------------------------------------------------- */

extern PyObject *kvpy_err_base;        /* KvprefixError */
extern PyObject *kvpy_err_callback;    /* EventCallbackError */
extern PyObject *kvpy_err_by_code[13]; /* index -code: the class of each KVP_E* code */

/* Raise the exception of library code rc (< 0), which library function fn just returned on
 * this thread: the KvprefixError subclass of rc with .code and .function set. Every library
 * error goes through here and nowhere else. Returns NULL, for `return kvpy_raise(...)`. */
PyObject *kvpy_raise(int rc, const char *fn);

/* Raise exc for argument arg of function fn, the message "fn(): arg" followed by fmt; exc
 * NULL raises InvalidArgumentError (a ValueError, .code EINVAL, .function None): a bad value
 * found by the binding before any library call. Every argument message is made here. */
void kvpy_arg_error(PyObject *exc, const char *fn, const char *arg, const char *fmt, ...);

int kvpy_errors_add(PyObject *m);

/* ---------------------------------------------------------------------------------------- */
/* Conversions (convert.c)                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Tokens as the library sees them: borrowed from a buffer, or converted from a sequence. */
typedef struct tokens {
    Py_buffer view;      /* the exported buffer; valid when has_view */
    bool has_view;       /* a buffer is held (release it in kvpy_tokens_done) */
    uint32_t *owned;     /* PyMem array converted from a sequence or an unaligned buffer */
    const uint32_t *ptr; /* the tokens: into view.buf or owned */
    size_t n;            /* how many */
} tokens;

/* Block keys for the _ids and _keys forms: always an owned array, so alignment never
 * matters. */
typedef struct keylist {
    kvp_key *keys; /* PyMem array; NULL when empty or not given */
    size_t n;      /* how many */
} keylist;

/* Each converter reads obj for argument arg of function fn (both for messages only) and
 * returns 0, or -1 with an exception set and nothing held: TypeError for a wrong type,
 * InvalidArgumentError for a value out of range. */
int kvpy_u64(PyObject *obj, uint64_t *out, const char *fn, const char *arg);
int kvpy_key(PyObject *obj, kvp_key *out, const char *fn, const char *arg); /* None: 0 */
int kvpy_profile(PyObject *obj, int *out, const char *fn, const char *arg);
/* A quota scope from its name ("namespace", "tenant", "model") or its QUOTA_SCOPE_* int
 * into *out: 0, or -1 with ValueError / TypeError (an int out of range is passed on, for
 * the library to refuse). kvpy_scope_name: the name of a KVP_QUOTA_SCOPE_*, or NULL. */
int kvpy_scope(PyObject *obj, int *out, const char *fn, const char *arg);
const char *kvpy_scope_name(int scope);
/* An eviction policy: its name or a KVP_EVICT_* int; 0 or -1 with the exception set. */
int kvpy_eviction(PyObject *obj, int *out, const char *fn, const char *arg);
/* The name of policy KVP_EVICT_*, or NULL for another value. Cannot fail. */
const char *kvpy_eviction_name(int policy);
/* The kvp_namespace of a Namespace or None (every field absent), or NULL (TypeError). */
const kvp_namespace *kvpy_ns(PyObject *obj, const char *fn, const char *arg);
/* A uint32 buffer (borrowed: 1-D, C-contiguous) or a sequence of ints (converted). */
int kvpy_tokens_get(PyObject *obj, tokens *t, const char *fn, const char *arg);
void kvpy_tokens_done(tokens *t); /* cannot fail */
/* Ints of up to 128 bits, a buffer of uint64 (lo, hi) pairs, or bytes (16 per key). */
int kvpy_keys_get(PyObject *obj, keylist *kl, const char *fn, const char *arg);

PyObject *kvpy_key_to_int(kvp_key k);
PyObject *kvpy_keys_to_list(const kvp_key *keys, size_t n);
PyObject *kvpy_u32_to_list(const uint32_t *v, size_t n);
/* True when a buffer format names a native-size 32-bit unsigned integer. */
bool kvpy_format_is_u32(const char *f, Py_ssize_t itemsize);

int kvpy_convert_init(void);

/* ---------------------------------------------------------------------------------------- */
/* Argument tables (args.c)                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* What a parameter accepts; each kind has one converter, so one message per mistake. */
typedef enum kvpy_kind {
    KVPY_OBJECT,   /* any object, as given (default None) */
    KVPY_U64,      /* an int in 0 .. 2**64 - 1 */
    KVPY_U32,      /* an int in 0 .. 2**32 - 1 */
    KVPY_SIZE,     /* an int in 0 .. SIZE_MAX */
    KVPY_BOOL,     /* any object's truth value */
    KVPY_KEY,      /* an int in 0 .. 2**128 - 1; None is the zero key */
    KVPY_NS,       /* a Namespace; None has every field absent */
    KVPY_TOKENS,   /* a uint32 buffer or a sequence of ints */
    KVPY_KEYS,     /* block keys (keylist) */
    KVPY_PROFILE,  /* a hash profile's name or HASH_* int */
    KVPY_SCOPE,    /* a quota scope's name or QUOTA_SCOPE_* int */
    KVPY_EVICTION, /* an eviction policy's name (lru, slru, s3fifo) or KVP_EVICT_* int */
} kvpy_kind;

#define KVPY_OPT        1u              /* may be omitted: the default applies */
#define KVPY_KWONLY     (2u | KVPY_OPT) /* keyword-only (and optional) */
#define KVPY_NONE       4u              /* None counts as omitted */
#define KVPY_MAX_PARAMS 20

typedef struct kvpy_param {
    const char *name; /* as Python names it; NULL ends the list */
    kvpy_kind kind;   /* what it accepts */
    unsigned flags;   /* KVPY_OPT, KVPY_KWONLY, KVPY_NONE */
    uint64_t def;     /* the default of an omitted U64, U32, SIZE, BOOL or PROFILE */
} kvpy_param;

/* A function's parameters: what kvpy_parse binds and converts, and what its
 * __text_signature__ shows, so that the two cannot disagree. */
typedef struct kvpy_sig {
    const char *name;                       /* the function, as messages and help() name it */
    kvpy_param params[KVPY_MAX_PARAMS + 1]; /* in order, ended by a NULL name */
} kvpy_sig;

/* One converted argument. */
typedef union kvpy_value {
    PyObject *obj;           /* OBJECT: borrowed */
    uint64_t u64;            /* U64, U32 */
    size_t size;             /* SIZE */
    bool flag;               /* BOOL */
    int profile;             /* PROFILE: KVP_HASH_*; EVICTION: KVP_EVICT_* */
    int scope;               /* SCOPE: KVP_QUOTA_SCOPE_* */
    kvp_key key;             /* KEY */
    const kvp_namespace *ns; /* NS: into the Namespace, or a static empty one */
    tokens tokens;           /* TOKENS: held until kvpy_args_done */
    keylist keys;            /* KEYS: held until kvpy_args_done */
} kvpy_value;

typedef struct kvpy_args {
    const kvpy_sig *sig;           /* the table the values were converted by */
    int n;                         /* its parameters */
    bool given[KVPY_MAX_PARAMS];   /* passed, and not a None that counts as omitted */
    kvpy_value v[KVPY_MAX_PARAMS]; /* each value; the default where not given */
} kvpy_args;

/* Bind a vectorcall's arguments (METH_FASTCALL | METH_KEYWORDS) to sig's parameters and
 * convert each. Returns 0 (release with kvpy_args_done), or -1 with TypeError for a wrong
 * count or name, or the converter's exception, and nothing held. */
int kvpy_parse(const kvpy_sig *sig, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
               kvpy_args *a);
/* The same for a tuple and a dict of keywords (tp_new). */
int kvpy_parse_tuple(const kvpy_sig *sig, PyObject *args, PyObject *kw, kvpy_args *a);
/* Convert one object as parameter i of sig (METH_O). Returns 0 or -1, as kvpy_parse. */
int kvpy_convert(const kvpy_sig *sig, int i, PyObject *obj, kvpy_value *v);
/* Release what kvpy_parse holds (tokens, key lists). Cannot fail. */
void kvpy_args_done(kvpy_args *a);

/* A method (or module function) with its parameter table and its docstring's body. */
typedef struct kvpy_def {
    const kvpy_sig *sig; /* name and parameters */
    PyCFunction fn;      /* the C function */
    int flags;           /* METH_* */
    const char *doc;     /* the docstring after the signature line */
} kvpy_def;

/* A PyMethodDef array, NULL-terminated, for defs (ended by a NULL sig), each ml_doc being
 * "name($self, params)\n--\n\n" and the body (self: "$self" or "$module"). Never freed: the
 * module lives as long as the process. NULL with MemoryError set. */
PyMethodDef *kvpy_methods(const kvpy_def *defs, const char *self);
/* A type's docstring, "Name(params)\n--\n\n" and the body, for tp_doc. */
const char *kvpy_type_doc(const kvpy_sig *sig, const char *body);

#define KVPY_FASTKW (METH_FASTCALL | METH_KEYWORDS)
#define KVPY_FN(f)  ((PyCFunction)(void (*)(void))(f))

/* ---------------------------------------------------------------------------------------- */
/* Records (records.c)                                                                       */
/* ---------------------------------------------------------------------------------------- */

/* A Match from a kvp_match; block_ids is stolen (NULL means None). */
PyObject *kvpy_match_to_py(const kvp_match *m, PyObject *block_ids);
PyObject *kvpy_stats_to_py(const kvp_stats *s);
/* medium (stolen; NULL counts as a failure): the event's tier's medium, or None. */
PyObject *kvpy_event_to_py(const kvp_event *e, PyObject *medium);

/* A chain state and its canonical digest. */
typedef struct chaindig {
    kvp_chain chain; /* the state after the block */
    uint8_t dig[32]; /* its canonical digest */
    size_t n_dig;    /* 16, or 32 for vllm-sha256-cbor */
} chaindig;

PyObject *kvpy_chain_to_py(const chaindig *c);
/* A kvp_chain from a Chain, for argument arg of fn. Returns 0, or -1 with an exception. */
int kvpy_chain_from_py(PyObject *obj, kvp_chain *out, const char *fn, const char *arg);

int kvpy_records_add(PyObject *m);

/* ---------------------------------------------------------------------------------------- */
/* Namespace (namespace.c)                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* An immutable namespace: the four fields as given (str, bytes or None) and their bytes. */
typedef struct NamespaceObject {
    PyObject_HEAD PyObject
        *given[4];      /* model, adapter, tenant, salt as passed (str, bytes or None) */
    PyObject *bytes[4]; /* the same as bytes, or NULL when absent */
    kvp_namespace ns;   /* points into bytes[]; valid while the object lives */
    Py_hash_t hash;     /* cached hash, -1 until computed */
} NamespaceObject;

extern PyTypeObject kvpy_namespace_type;
int kvpy_namespace_add(PyObject *m);

/* ---------------------------------------------------------------------------------------- */
/* Events (events.c)                                                                         */
/* ---------------------------------------------------------------------------------------- */

/* Events collected during a library call, not yet handed to Python. */
typedef struct evbatch {
    kvp_event *ev; /* PyMem_Raw array (filled without the GIL) */
    size_t n;      /* events in it */
    size_t cap;    /* its capacity */
    size_t n_lost; /* events dropped because the array could not grow */
} evbatch;

/* The batch of the library call this thread is making (NULL between calls). */
extern _Thread_local evbatch *kvpy_tls_events;

/* The library's event callback (kvp_config.on_event). Cannot fail. */
void kvpy_event_collect(void *ud, const kvp_event *ev);

/* ---------------------------------------------------------------------------------------- */
/* Cache (cache.c)                                                                           */
/* ---------------------------------------------------------------------------------------- */

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
    bool single_threaded;           /* no library lock: calls keep the GIL (cache.c) */
    int hash_profile;               /* KVP_HASH_* */
    uint32_t vocab_size;            /* token ids must be below it; 0 = unchecked */
    uint32_t ns_quota;              /* default per-namespace quota; 0 = quotas off */
    int quota_scope;                /* KVP_QUOTA_SCOPE_* */
    int eviction;                   /* KVP_EVICT_* */
    PyObject *tier_media;           /* list of str: the medium of tier k + 1 at k (tiers.c),
                                       or NULL before the first add_tier */
} CacheObject;

extern PyTypeObject kvpy_cache_type;

/* Hand batch b to the cache's callable, then free it; result (stolen; NULL when the call
 * failed with its exception set) is returned unless the callable raised (events.c). */
PyObject *kvpy_events_deliver(CacheObject *self, evbatch *b, PyObject *result);

/* Start a call on self's cache (GIL held): the cache, counted in flight so that close()
 * cannot free it under the call, or NULL when it is closed (nothing raised). */
kvp_cache *kvpy_cache_enter(CacheObject *self);
/* End it; the last call out frees a cache closed meanwhile. Cannot fail. */
void kvpy_cache_leave(CacheObject *self);
PyObject *kvpy_raise_closed(void);

/* The hash fields of *cfg from Python values: key (bytes-like or None: a random key; argument
 * key_arg of fn) and vllm_seed (str or None: vLLM's default); the string stays owned by
 * vllm_seed, which the caller keeps alive until the config is used. Returns 0, or -1 with an
 * exception set. Pair with kvpy_wipe(cfg->hash_key, ...) once the config is used. */
/* The retention options of mapping obj (retention.c) into *r, its ranges in buf (room for
 * KVP_RETENTION_MAX_RANGES); fn names the function for messages. Returns 0, or -1 with an
 * exception set. */
int kvpy_retention_get(PyObject *obj, kvp_retention *r, kvp_retention_range *buf, const char *fn);

int kvpy_hash_cfg_fill(kvp_config *cfg, PyObject *key, PyObject *vllm_seed, const char *fn,
                       const char *key_arg);
/* Overwrite a secret key's copy on the stack (a volatile store the compiler keeps). */
void kvpy_wipe(void *p, size_t n);

/* The request lifecycle on converted arguments, shared by Cache's methods and Request's:
 * each returns what the method returns, or NULL with an exception set. */
PyObject *kvpy_cache_acquire(CacheObject *self, uint64_t req_id, const kvp_namespace *ns,
                             const tokens *t, size_t capacity);
PyObject *kvpy_cache_grow(CacheObject *self, uint64_t req_id, size_t capacity);
PyObject *kvpy_cache_blocks(CacheObject *self, uint64_t req_id);
PyObject *kvpy_cache_commit(CacheObject *self, uint64_t req_id, const tokens *t);
PyObject *kvpy_cache_release(CacheObject *self, uint64_t req_id);

int kvpy_cache_add(PyObject *m);

/* The result of a library call on self: raises for rc < 0 (or 1: the cache is closed),
 * then delivers the call's events; result is stolen (used when rc is KVP_OK). */
PyObject *kvpy_finish(CacheObject *self, int rc, const char *fn, evbatch *b, PyObject *result);

/* Run STMT, a library call on kc that assigns rc, with the GIL released (kept when the
 * cache is single-threaded: the GIL then serialises calls, as the library requires), and
 * collect the events it produced into b. rc becomes 1 when the cache is closed. STMT must
 * not touch Python objects. */
#define KVPY_CALL(self, b, rc, STMT)                                                               \
    do {                                                                                           \
        kvp_cache *const kc = kvpy_cache_enter(self);                                              \
        memset(&(b), 0, sizeof(b));                                                                \
        if (kc == NULL) {                                                                          \
            (rc) = 1;                                                                              \
            break;                                                                                 \
        }                                                                                          \
        PyThreadState *ts_ = (self)->single_threaded ? NULL : PyEval_SaveThread();                 \
        kvpy_tls_events = &(b);                                                                    \
        STMT;                                                                                      \
        kvpy_tls_events = NULL;                                                                    \
        if (ts_ != NULL)                                                                           \
            PyEval_RestoreThread(ts_);                                                             \
        kvpy_cache_leave(self);                                                                    \
    } while (0)

/* ---------------------------------------------------------------------------------------- */
/* Tiers (tiers.c): the lower-tier methods of Cache and their records                        */
/* ---------------------------------------------------------------------------------------- */

extern const kvpy_sig kvpy_add_tier_sig, kvpy_acquire_tiers_sig, kvpy_tier_orders_sig,
    kvpy_tier_confirm_sig, kvpy_lookup_tiers_sig, kvpy_tier_stats_sig;
PyObject *kvpy_cache_add_tier(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames);
PyObject *kvpy_cache_acquire_tiers(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames);
PyObject *kvpy_cache_tier_orders(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames);
PyObject *kvpy_cache_tier_confirm(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames);
PyObject *kvpy_cache_lookup_tiers(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames);
PyObject *kvpy_cache_tier_stats(CacheObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames);
/* An Event's medium: the str of its lower tier, or None (tier 0). New reference. */
PyObject *kvpy_tier_medium(CacheObject *self, int tier);
int kvpy_tiers_add(PyObject *m);

/* ---------------------------------------------------------------------------------------- */
/* Request (request.c) and Hasher (hasher.c)                                                 */
/* ---------------------------------------------------------------------------------------- */

/* A new, not yet entered Request of cache self (Cache.request's arguments, converted but for
 * the tokens, which are converted on entry). */
PyObject *kvpy_request_new(CacheObject *self, uint64_t req_id, PyObject *ns, PyObject *tok_obj,
                           size_t capacity);
int kvpy_request_add(PyObject *m);

/* The Hasher of a cache (Cache.hasher), or NULL with an exception set. */
PyObject *kvpy_hasher_of_cache(CacheObject *self);
int kvpy_hasher_add(PyObject *m);

#endif /* KVPY_H */
