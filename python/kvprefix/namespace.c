/*
 * namespace.c - the Namespace type: who a request belongs to (model, adapter, tenant, salt),
 * immutable and hashable, holding the kvp_namespace that library calls read.
 *
 * Layout: given[i] is each field as passed (str, bytes or None: what the getters and repr
 * show); bytes[i] the same as a bytes object, or NULL when absent; ns points into bytes[], so
 * it is valid as long as the object lives, and a call may read it without the GIL.
 * Invariants: immutable after Namespace_new; equality and hash compare bytes[] only, so
 * Namespace(model="m") == Namespace(model=b"m"); the hash is cached (-1 until computed).
 */
#include "kvpy.h"

static const char *const field_names[4] = {"model", "adapter", "tenant", "salt"};

/* The bytes of one field value: str (UTF-8), a bytes-like object, or None (NULL, absent).
 * Returns 0 or -1 with an exception set. */
static int field_bytes(PyObject *v, const char *name, PyObject **out)
{
    *out = NULL;
    if (v == Py_None)
        return 0;
    if (PyUnicode_Check(v))
        *out = PyUnicode_AsUTF8String(v);
    else if (PyObject_CheckBuffer(v))
        *out = PyBytes_FromObject(v);
    else
        kvpy_arg_error(PyExc_TypeError, "Namespace", name, ": str, bytes or None, got %.80s",
                       Py_TYPE(v)->tp_name);
    return *out == NULL ? -1 : 0;
}

static const kvpy_sig new_sig = {"Namespace",
                                 {{"model", KVPY_OBJECT, KVPY_OPT, 0},
                                  {"adapter", KVPY_OBJECT, KVPY_OPT, 0},
                                  {"tenant", KVPY_OBJECT, KVPY_OPT, 0},
                                  {"salt", KVPY_OBJECT, KVPY_OPT, 0}}};

static PyObject *Namespace_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    kvpy_args a;
    if (kvpy_parse_tuple(&new_sig, args, kw, &a) != 0)
        return NULL;
    NamespaceObject *self = (NamespaceObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->hash = -1;
    kvp_namespace_init(&self->ns);
    kvp_field *fields[4] = {&self->ns.model, &self->ns.adapter, &self->ns.tenant, &self->ns.salt};
    for (int i = 0; i < 4; i++) {
        self->given[i] = Py_NewRef(a.v[i].obj);
        if (field_bytes(a.v[i].obj, field_names[i], &self->bytes[i]) != 0) {
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
static PyObject *identity(NamespaceObject *self)
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
    PyObject *t = identity(self);
    if (t == NULL)
        return -1;
    self->hash = PyObject_Hash(t);
    Py_DECREF(t);
    return self->hash;
}

static PyObject *Namespace_richcompare(PyObject *a, PyObject *b, int op)
{
    if (!PyObject_TypeCheck(b, &kvpy_namespace_type) || (op != Py_EQ && op != Py_NE))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *ta = identity((NamespaceObject *)a), *tb = identity((NamespaceObject *)b);
    PyObject *res = (ta && tb) ? PyObject_RichCompare(ta, tb, op) : NULL;
    Py_XDECREF(ta);
    Py_XDECREF(tb);
    return res;
}

static PyObject *Namespace_get(NamespaceObject *self, void *closure)
{
    return Py_NewRef(self->given[(intptr_t)closure]);
}

static const kvpy_sig key_sig = {"key", {{"seed", KVPY_U64, KVPY_OPT, KVP_DEFAULT_SEED}}};

static PyObject *Namespace_key(NamespaceObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    kvpy_args a;
    if (kvpy_parse(&key_sig, args, nargs, kwnames, &a) != 0)
        return NULL;
    kvp_key k;
    int rc = kvp_namespace_key(a.v[0].u64, &self->ns, &k);
    return rc == KVP_OK ? kvpy_key_to_int(k) : kvpy_raise(rc, "kvp_namespace_key");
}

static PyGetSetDef Namespace_getset[] = {
    {"model", (getter)Namespace_get, NULL, "Base model name or revision, or None.", (void *)0},
    {"adapter", (getter)Namespace_get, NULL, "Adapter (LoRA) id, or None.", (void *)1},
    {"tenant", (getter)Namespace_get, NULL, "Tenant isolation domain, or None.", (void *)2},
    {"salt", (getter)Namespace_get, NULL, "Per-request cache salt, or None.", (void *)3},
    {NULL, NULL, NULL, NULL, NULL},
};

static const kvpy_def Namespace_defs[] = {
    {&key_sig, KVPY_FN(Namespace_key), KVPY_FASTKW,
     "The 128-bit namespace root key, an int (kvp_namespace_key)."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject kvpy_namespace_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvprefix.Namespace",
    .tp_basicsize = sizeof(NamespaceObject),
    .tp_dealloc = (destructor)Namespace_dealloc,
    .tp_repr = (reprfunc)Namespace_repr,
    .tp_hash = (hashfunc)Namespace_hash,
    .tp_richcompare = Namespace_richcompare,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_getset = Namespace_getset,
    .tp_new = Namespace_new,
};

int kvpy_namespace_add(PyObject *m)
{
    kvpy_namespace_type.tp_doc = kvpy_type_doc(
        &new_sig, "Who a request belongs to: two requests share cached blocks only when all four\n"
                  "fields are equal. Each field is a str (UTF-8), bytes, or None (absent, which\n"
                  "differs from every present value, the empty one included). Immutable and\n"
                  "hashable.");
    kvpy_namespace_type.tp_methods = kvpy_methods(Namespace_defs, "$self");
    if (kvpy_namespace_type.tp_doc == NULL || kvpy_namespace_type.tp_methods == NULL ||
        PyType_Ready(&kvpy_namespace_type) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "Namespace", (PyObject *)&kvpy_namespace_type);
}
