/*
 * jinja_int.h - the Jinja interpreter's insides, shared by its four files:
 *
 *   jinja_lex.c    source -> tokens (text runs, tag delimiters, names, literals,
 *                  operators), whitespace control applied to the text runs
 *   jinja_parse.c  tokens -> syntax tree (jnode), allocated in the template's arena
 *   jinja_eval.c   the tree walker: scopes, statements, expressions, calls, limits
 *   jinja_lib.c    values as Python sees them (truth, equality, str(), repr()), and the
 *                  built-in filters, tests and methods
 *
 * Values (jv) are JSON values (jansson, one reference owned by the jv) plus the kinds JSON
 * has no room for: undefined, a macro, a bound method or a global function. A jv is owned
 * by whoever holds it: jv_drop releases it, jv_copy takes another reference.
 */
#ifndef CLI_JINJA_INT_H
#define CLI_JINJA_INT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jinja.h"

/* The arena: every token string and tree node of one template, freed at once. */
typedef struct jarena_blk {
    struct jarena_blk *next;
    size_t used, size;
    max_align_t data[];
} jarena_blk;

typedef struct jarena {
    jarena_blk *head; /* newest block first */
} jarena;

void *jarena_alloc(jarena *a, size_t n); /* zeroed; NULL when out of memory */
void jarena_free(jarena *a);

/* Tokens. */
enum {
    JT_EOF,
    JT_TEXT,        /* s/n: a text run after whitespace control */
    JT_VAR_BEGIN,   /* {{ */
    JT_VAR_END,     /* }} */
    JT_BLOCK_BEGIN, /* {% */
    JT_BLOCK_END,   /* %} */
    JT_NAME,        /* s/n */
    JT_STRING,      /* s/n: unescaped bytes */
    JT_INT,         /* i */
    JT_FLOAT,       /* f */
    JT_OP           /* op: one of the operator spellings, NUL-terminated */
};

typedef struct jtok {
    uint8_t type;
    char op[4];    /* JT_OP: "==", "//", "(", ... */
    int line;      /* 1-based line of the token's start */
    const char *s; /* JT_TEXT, JT_NAME, JT_STRING: bytes in the arena (NUL-terminated) */
    size_t n;      /* their length */
    json_int_t i;  /* JT_INT */
    double f;      /* JT_FLOAT */
} jtok;

/* Tokenize src[0..n) (newlines normalised, one trailing newline dropped, as jinja2 does).
 * Returns 0 with *toks (realloc'd array, caller frees) and *n_toks, or -1 with err. */
int jinja_lex(jarena *a, const char *src, size_t n, jtok **toks, size_t *n_toks, char *err,
              size_t err_size);

/* Syntax tree. */
enum {
    /* statements */
    JN_TEXT,     /* s/n */
    JN_OUT,      /* {{ a }} */
    JN_IF,       /* a: condition; v: then; w: else (elif is an if in w) */
    JN_FOR,      /* names: targets; a: iterable; b: filter or NULL; v: body; w: else */
    JN_SET,      /* names[0] (+ names[1] attribute when op=1; more names: tuple); a */
    JN_SETBLOCK, /* names[0]; v: body */
    JN_MACRO,    /* s: name; names: parameters; w: defaults (NULL entries: none); v: body */
    JN_BREAK,
    JN_CONTINUE,
    /* expressions */
    JN_LIT,    /* lit */
    JN_NAME,   /* s */
    JN_ATTR,   /* a.s */
    JN_ITEM,   /* a[b] */
    JN_SLICE,  /* a[v[0]:v[1]:v[2]] (NULL entries: omitted) */
    JN_CALL,   /* a(v..., names[i]=w[i]...) */
    JN_FILTER, /* a | s(v..., names=w...) ; a NULL inside a filter block never happens */
    JN_TEST,   /* a is [not (op=1)] s(v...) */
    JN_BIN,    /* a op b (op: JO_*) */
    JN_NOT,    /* not a */
    JN_NEG,    /* -a (op=1: +a) */
    JN_AND,
    JN_OR,
    JN_COND,  /* b if a else c (c NULL: undefined) */
    JN_LIST,  /* [v...] */
    JN_TUPLE, /* (v...) : a list as Python sees a tuple here */
    JN_DICT   /* {v[i]: w[i]} */
};

enum {
    JO_ADD,
    JO_SUB,
    JO_MUL,
    JO_DIV,
    JO_FLOORDIV,
    JO_MOD,
    JO_POW,
    JO_CONCAT,
    JO_EQ,
    JO_NE,
    JO_LT,
    JO_LE,
    JO_GT,
    JO_GE,
    JO_IN,
    JO_NOTIN
};

typedef struct jnode jnode;
struct jnode {
    uint8_t kind; /* JN_* */
    uint8_t op;   /* JO_* for JN_BIN; flags noted at the kinds */
    int line;     /* source line, for errors */
    jnode *a, *b, *c;
    jnode **v; /* first child list (body, arguments, items) */
    size_t nv;
    jnode **w; /* second list (else body, keyword values, dict values, defaults) */
    size_t nw;
    const char **names; /* targets, parameters, keyword names */
    size_t n_names;
    const char *s; /* name or text (arena) */
    size_t slen;
    json_t *lit; /* JN_LIT: the value (one reference, released by jinja_free) */
};

struct jinja_tmpl {
    jarena arena;  /* every node and string */
    jnode *root;   /* JN_SETBLOCK-like body: v/nv */
    json_t **lits; /* every literal, for jinja_free (realloc'd) */
    size_t n_lits, cap_lits;
};

/* Values. */
enum {
    JV_UNDEF,  /* name: what was undefined (may be NULL) */
    JV_JSON,   /* j */
    JV_MACRO,  /* node: the JN_MACRO */
    JV_METHOD, /* j: the object; name: the method */
    JV_FUNC    /* name: a global function */
};

typedef struct jv {
    uint8_t kind;
    bool ns;           /* JV_JSON object made by namespace(): attributes may be set */
    json_t *j;         /* one reference owned by this jv (JV_JSON, JV_METHOD) */
    const jnode *node; /* JV_MACRO */
    const char *name;  /* JV_UNDEF, JV_METHOD, JV_FUNC: static or arena string */
} jv;

static inline jv jv_json(json_t *j) /* takes the reference; NULL j gives none... */
{
    jv v = {JV_JSON, false, j, NULL, NULL};
    return v;
}
static inline jv jv_undef(const char *name)
{
    jv v = {JV_UNDEF, false, NULL, NULL, name};
    return v;
}
static inline void jv_drop(jv *v)
{
    if (v->j)
        json_decref(v->j);
    v->j = NULL;
    v->kind = JV_UNDEF;
}
static inline jv jv_copy(jv v)
{
    if (v.j)
        json_incref(v.j);
    return v;
}

/* The render state (jinja_eval.c). */
typedef struct jctx jctx;

/* Raise an error at line: formats "LINE: msg" into the render's error buffer; returns -1. */
int jinja_fail(jctx *c, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Count n steps against the limit; -1 (with the error set) when past it. */
int jinja_step(jctx *c, int line, uint64_t n);
/* Call macro m with positional args and keyword args; result (a string) in *out. */
int jinja_call_macro(jctx *c, int line, const jnode *m, jv *args, size_t n_args, const char **kw,
                     jv *kw_vals, size_t n_kw, jv *out);
/* The fixed time for strftime_now, or NULL. */
const char *jinja_now(const jctx *c);

/* Python semantics (jinja_lib.c). */
bool jinja_truthy(const jv *v);
bool jinja_equal(const json_t *a, const json_t *b);
/* Python's str(v) (repr = false) or repr(v) appended to a buffer; -1 on out of memory. */
typedef struct jbuf {
    char *p;
    size_t len, cap;
} jbuf;
int jbuf_put(jbuf *b, const char *s, size_t n);
int jinja_str(jbuf *b, const jv *v, bool repr);
/* Length in code points of UTF-8 s[0..n) (invalid bytes count one each). */
size_t jinja_u8len(const char *s, size_t n);
/* Byte offset of code point i of s[0..n) (i <= length). */
size_t jinja_u8off(const char *s, size_t n, size_t i);

/* Built-ins (jinja_lib.c): each returns 0 and *out, or -1 after jinja_fail. Arguments are
 * borrowed. */
int jinja_filter(jctx *c, int line, const char *name, jv *x, jv *args, size_t n_args,
                 const char **kw, jv *kw_vals, size_t n_kw, jv *out);
int jinja_test(jctx *c, int line, const char *name, jv *x, jv *args, size_t n_args, bool *out);
int jinja_method(jctx *c, int line, jv *self, const char *name, jv *args, size_t n_args,
                 const char **kw, jv *kw_vals, size_t n_kw, jv *out);
int jinja_global(jctx *c, int line, const char *name, jv *args, size_t n_args, const char **kw,
                 jv *kw_vals, size_t n_kw, jv *out);
bool jinja_is_global(const char *name);
/* Does `name` name a method of this value (for attribute lookup: methods win)? */
bool jinja_has_method(const jv *self, const char *name);
/* Binary operator on two values. */
int jinja_binop(jctx *c, int line, int op, jv *a, jv *b, jv *out);
/* Iterate: the items of a list, the keys of a dict, the characters of a string, nothing
 * for undefined; returns a new JSON array in *out. */
int jinja_iter(jctx *c, int line, jv *x, json_t **out);

#endif /* CLI_JINJA_INT_H */
