/*
 * jinja_eval.c - the tree walker: renders a parsed template with a JSON context.
 *
 * Scopes follow jinja2: a stack of frames, each a small array of (name, value). Frame 0
 * holds the template's top-level `set`s; each loop iteration pushes a frame (so a `set`
 * inside a loop is gone at the end of the iteration, and namespaces are the way out, as
 * in jinja2); a macro call pushes a barrier frame, under which a name lookup skips to
 * frame 0. After the frames come the context's variables, then the global functions.
 *
 * Statements return 0, 1 (break), 2 (continue) or -1 (error, message in the context).
 * Output goes to the current buffer; macros and block sets swap in a buffer of their own.
 *
 * Limits: every statement and expression node costs one step (a filter or method also
 * its input's size, see jinja_step), the output is capped, macro calls are nested at most
 * max_depth deep; the parser already bounds expression nesting.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "jinja_int.h"

typedef struct var {
    const char *name; /* arena or static */
    jv v;             /* owned */
} var;

typedef struct frame {
    var *vars; /* malloc'd */
    size_t n, cap;
    bool barrier; /* a macro's frame: lookups below it go to frame 0 */
} frame;

struct jctx {
    const json_t *vars; /* the context object (borrowed) */
    frame *fr;          /* malloc'd stack */
    size_t n_fr, cap_fr;
    jbuf *out; /* where output goes now */
    uint64_t steps, max_steps;
    size_t max_output;
    uint32_t depth, max_depth;
    const char *now;
    char *err;
    size_t err_size;
    bool failed; /* an error message is set */
};

int jinja_fail(jctx *c, int line, const char *fmt, ...)
{
    if (c->failed)
        return -1;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cli_errf(c->err, c->err_size, "%d: %s", line, msg);
    c->failed = true;
    return -1;
}

int jinja_step(jctx *c, int line, uint64_t n)
{
    c->steps += n;
    if (c->steps > c->max_steps)
        return jinja_fail(c, line, "template takes too long to render (more than %llu steps)",
                          (unsigned long long)c->max_steps);
    return 0;
}

const char *jinja_now(const jctx *c)
{
    return c->now;
}

static int push_frame(jctx *c, int line, bool barrier)
{
    if (!cli_grow((void **)&c->fr, &c->cap_fr, c->n_fr + 1, sizeof(frame)))
        return jinja_fail(c, line, "out of memory");
    frame *f = &c->fr[c->n_fr++];
    memset(f, 0, sizeof *f);
    f->barrier = barrier;
    return 0;
}

static void pop_frame(jctx *c)
{
    frame *f = &c->fr[--c->n_fr];
    for (size_t k = 0; k < f->n; k++)
        jv_drop(&f->vars[k].v);
    free(f->vars);
}

/* Bind name in the top frame (takes v). */
static int bind(jctx *c, int line, const char *name, jv v)
{
    frame *f = &c->fr[c->n_fr - 1];
    for (size_t k = 0; k < f->n; k++)
        if (strcmp(f->vars[k].name, name) == 0) {
            jv_drop(&f->vars[k].v);
            f->vars[k].v = v;
            return 0;
        }
    if (!cli_grow((void **)&f->vars, &f->cap, f->n + 1, sizeof(var))) {
        jv_drop(&v);
        return jinja_fail(c, line, "out of memory");
    }
    f->vars[f->n].name = name;
    f->vars[f->n].v = v;
    f->n++;
    return 0;
}

static const jv *find_var(jctx *c, const char *name)
{
    for (size_t i = c->n_fr; i-- > 0;) {
        frame *f = &c->fr[i];
        for (size_t k = f->n; k-- > 0;)
            if (strcmp(f->vars[k].name, name) == 0)
                return &f->vars[k].v;
        if (f->barrier && i > 1)
            i = 1; /* next: frame 0 */
    }
    return NULL;
}

static jv lookup(jctx *c, const char *name)
{
    const jv *v = find_var(c, name);
    if (v)
        return jv_copy(*v);
    json_t *j = json_object_get(c->vars, name);
    if (j)
        return jv_json(json_incref(j));
    if (jinja_is_global(name)) {
        jv g = {JV_FUNC, false, NULL, NULL, name};
        return g;
    }
    return jv_undef(name);
}

static int eval(jctx *c, const jnode *x, jv *out);

static int out_put(jctx *c, int line, const char *s, size_t n)
{
    if (c->out->len + n > c->max_output)
        return jinja_fail(c, line, "output longer than %zu bytes", c->max_output);
    if (jbuf_put(c->out, s, n) < 0)
        return jinja_fail(c, line, "out of memory");
    return 0;
}

/* Arguments of a call node: positional into args, keywords into kw/kwv (all owned). */
typedef struct args {
    jv pos[64];
    size_t n;
    jv kwv[64];
    const char *kw[64];
    size_t n_kw;
} args;

static void args_drop(args *a)
{
    for (size_t k = 0; k < a->n; k++)
        jv_drop(&a->pos[k]);
    for (size_t k = 0; k < a->n_kw; k++)
        jv_drop(&a->kwv[k]);
    a->n = a->n_kw = 0;
}

static int eval_args(jctx *c, const jnode *x, args *a)
{
    a->n = a->n_kw = 0;
    if (x->nv > 64 || x->nw > 64)
        return jinja_fail(c, x->line, "too many arguments");
    for (size_t k = 0; k < x->nv; k++) {
        if (eval(c, x->v[k], &a->pos[k]) < 0)
            return args_drop(a), -1;
        a->n++;
    }
    for (size_t k = 0; k < x->nw; k++) {
        if (eval(c, x->w[k], &a->kwv[k]) < 0)
            return args_drop(a), -1;
        a->kw[k] = x->names[k];
        a->n_kw++;
    }
    return 0;
}

static int exec_body(jctx *c, jnode *const *v, size_t n);

int jinja_call_macro(jctx *c, int line, const jnode *m, jv *pos, size_t n_pos, const char **kw,
                     jv *kwv, size_t n_kw, jv *out)
{
    if (c->depth >= c->max_depth)
        return jinja_fail(c, line, "macro calls nested more than %u deep", c->max_depth);
    if (n_pos > m->n_names)
        return jinja_fail(c, line, "macro '%s' takes %zu arguments, %zu given", m->s, m->n_names,
                          n_pos);
    if (push_frame(c, line, true) < 0)
        return -1;
    int rc = 0;
    for (size_t k = 0; k < m->n_names && rc == 0; k++) {
        jv v = jv_undef(m->names[k]);
        bool set = false;
        if (k < n_pos) {
            v = jv_copy(pos[k]);
            set = true;
        }
        for (size_t j = 0; j < n_kw; j++)
            if (strcmp(kw[j], m->names[k]) == 0) {
                if (set) {
                    jv_drop(&v);
                    rc = jinja_fail(c, line, "macro '%s' got two values for '%s'", m->s, kw[j]);
                    break;
                }
                v = jv_copy(kwv[j]);
                set = true;
            }
        if (rc == 0 && !set && m->w[k])
            rc = eval(c, m->w[k], &v);
        if (rc == 0)
            rc = bind(c, line, m->names[k], v);
    }
    for (size_t j = 0; j < n_kw && rc == 0; j++) {
        size_t k = 0;
        while (k < m->n_names && strcmp(kw[j], m->names[k]) != 0)
            k++;
        if (k == m->n_names)
            rc = jinja_fail(c, line, "macro '%s' has no parameter '%s'", m->s, kw[j]);
    }
    jbuf buf = {0}, *saved = c->out;
    if (rc == 0) {
        c->out = &buf;
        c->depth++;
        rc = exec_body(c, m->v, m->nv) < 0 ? -1 : 0;
        c->depth--;
        c->out = saved;
    }
    pop_frame(c);
    if (rc == 0) {
        json_t *s = json_stringn_nocheck(buf.p ? buf.p : "", buf.len);
        if (!s)
            rc = jinja_fail(c, line, "out of memory");
        else
            *out = jv_json(s);
    }
    free(buf.p);
    return rc;
}

static int eval_call(jctx *c, const jnode *x, jv *out)
{
    jv f;
    if (eval(c, x->a, &f) < 0)
        return -1;
    args a;
    if (eval_args(c, x, &a) < 0) {
        jv_drop(&f);
        return -1;
    }
    int rc;
    switch (f.kind) {
    case JV_MACRO:
        rc = jinja_call_macro(c, x->line, f.node, a.pos, a.n, a.kw, a.kwv, a.n_kw, out);
        break;
    case JV_FUNC:
        rc = jinja_global(c, x->line, f.name, a.pos, a.n, a.kw, a.kwv, a.n_kw, out);
        break;
    case JV_METHOD: {
        jv self = jv_json(f.j);
        rc = jinja_method(c, x->line, &self, f.name, a.pos, a.n, a.kw, a.kwv, a.n_kw, out);
        f.j = NULL;
        jv_drop(&self);
        break;
    }
    case JV_UNDEF:
        rc = jinja_fail(c, x->line, "'%s' is undefined", f.name ? f.name : "value");
        break;
    default:
        rc = jinja_fail(c, x->line, "value is not callable");
    }
    args_drop(&a);
    jv_drop(&f);
    return rc;
}

/* obj.name: a method of the value wins, then a key (jinja2's getattr, then getitem). */
static int get_attr(jctx *c, int line, jv *obj, const char *name, jv *out)
{
    if (obj->kind == JV_UNDEF)
        return jinja_fail(c, line, "'%s' is undefined", obj->name ? obj->name : "value");
    if (jinja_has_method(obj, name)) {
        jv m = {JV_METHOD, false, json_incref(obj->j), NULL, name};
        *out = m;
        return 0;
    }
    json_t *j =
        obj->kind == JV_JSON && json_is_object(obj->j) ? json_object_get(obj->j, name) : NULL;
    *out = j ? jv_json(json_incref(j)) : jv_undef(name);
    return 0;
}

/* obj[key]: an item first, then (for a string key) an attribute. */
static int get_item(jctx *c, int line, jv *obj, jv *key, jv *out)
{
    if (obj->kind == JV_UNDEF)
        return jinja_fail(c, line, "'%s' is undefined", obj->name ? obj->name : "value");
    json_t *o = obj->kind == JV_JSON ? obj->j : NULL, *k = key->kind == JV_JSON ? key->j : NULL;
    *out = jv_undef(NULL);
    if (!o || !k)
        return 0;
    if (json_is_object(o) && json_is_string(k)) {
        json_t *j = json_object_get(o, json_string_value(k));
        if (j) {
            *out = jv_json(json_incref(j));
            return 0;
        }
        return get_attr(c, line, obj, json_string_value(k), out);
    }
    if ((json_is_array(o) || json_is_string(o)) && (json_is_integer(k) || json_is_boolean(k))) {
        json_int_t i = json_is_integer(k) ? json_integer_value(k) : json_is_true(k);
        if (json_is_array(o)) {
            json_int_t n = (json_int_t)json_array_size(o);
            if (i < 0)
                i += n;
            if (i >= 0 && i < n)
                *out = jv_json(json_incref(json_array_get(o, (size_t)i)));
            return 0;
        }
        const char *s = json_string_value(o);
        size_t len = json_string_length(o), n = jinja_u8len(s, len);
        if (i < 0)
            i += (json_int_t)n;
        if (i >= 0 && (size_t)i < n) {
            size_t a = jinja_u8off(s, len, (size_t)i), b = jinja_u8off(s, len, (size_t)i + 1);
            json_t *r = json_stringn_nocheck(s + a, b - a);
            if (!r)
                return jinja_fail(c, line, "out of memory");
            *out = jv_json(r);
        }
        return 0;
    }
    if (json_is_string(k))
        return get_attr(c, line, obj, json_string_value(k), out);
    return 0;
}

static int slice_bound(jctx *c, const jnode *x, json_int_t *v, bool *set)
{
    *set = false;
    if (!x)
        return 0;
    jv b;
    if (eval(c, x, &b) < 0)
        return -1;
    if (b.kind == JV_JSON && json_is_integer(b.j)) {
        *v = json_integer_value(b.j);
        *set = true;
    } else if (!(b.kind == JV_JSON && json_is_null(b.j)) && b.kind != JV_UNDEF) {
        jv_drop(&b);
        return jinja_fail(c, x->line, "slice indices must be integers");
    }
    jv_drop(&b);
    return 0;
}

/* Python's slice semantics on a list or a string (by code points). */
static int eval_slice(jctx *c, const jnode *x, jv *out)
{
    jv o;
    if (eval(c, x->a, &o) < 0)
        return -1;
    json_int_t lo = 0, hi = 0, st = 1;
    bool has_lo, has_hi, has_st;
    if (slice_bound(c, x->v[0], &lo, &has_lo) < 0 || slice_bound(c, x->v[1], &hi, &has_hi) < 0 ||
        slice_bound(c, x->v[2], &st, &has_st) < 0)
        return jv_drop(&o), -1;
    if (!has_st)
        st = 1;
    if (st == 0)
        return jv_drop(&o), jinja_fail(c, x->line, "slice step cannot be zero");
    bool str = o.kind == JV_JSON && json_is_string(o.j);
    if (!str && !(o.kind == JV_JSON && json_is_array(o.j))) {
        jv_drop(&o);
        return jinja_fail(c, x->line, "cannot slice this value");
    }
    const char *s = str ? json_string_value(o.j) : NULL;
    size_t slen = str ? json_string_length(o.j) : 0;
    json_int_t n = str ? (json_int_t)jinja_u8len(s, slen) : (json_int_t)json_array_size(o.j);
    if (!has_lo)
        lo = st > 0 ? 0 : n - 1;
    else if (lo < 0)
        lo = lo + n < 0 ? (st > 0 ? 0 : -1) : lo + n;
    else if (lo >= n)
        lo = st > 0 ? n : n - 1;
    if (!has_hi)
        hi = st > 0 ? n : -1;
    else if (hi < 0)
        hi = hi + n < 0 ? (st > 0 ? 0 : -1) : hi + n;
    else if (hi >= n)
        hi = st > 0 ? n : n - 1;
    if (jinja_step(c, x->line, (uint64_t)n) < 0)
        return jv_drop(&o), -1;
    int rc = 0;
    if (str) {
        jbuf b = {0};
        for (json_int_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
            size_t a = jinja_u8off(s, slen, (size_t)i), e = jinja_u8off(s, slen, (size_t)i + 1);
            if (jbuf_put(&b, s + a, e - a) < 0)
                rc = -1;
        }
        json_t *r = rc == 0 ? json_stringn_nocheck(b.p ? b.p : "", b.len) : NULL;
        free(b.p);
        if (!r)
            rc = jinja_fail(c, x->line, "out of memory");
        else
            *out = jv_json(r);
    } else {
        json_t *r = json_array();
        for (json_int_t i = lo; r && (st > 0 ? i < hi : i > hi); i += st)
            if (json_array_append(r, json_array_get(o.j, (size_t)i)) < 0) {
                json_decref(r);
                r = NULL;
            }
        if (!r)
            rc = jinja_fail(c, x->line, "out of memory");
        else
            *out = jv_json(r);
    }
    jv_drop(&o);
    return rc;
}

/* A JSON value to store in a list or dict: undefined and callables cannot be. */
static int as_json(jctx *c, int line, jv *v, json_t **out)
{
    if (v->kind != JV_JSON)
        return jinja_fail(c, line, "%s cannot be stored in a list or dict",
                          v->kind == JV_UNDEF ? "an undefined value" : "a callable");
    *out = v->j;
    v->j = NULL;
    v->kind = JV_UNDEF;
    return 0;
}

static int eval_seq(jctx *c, const jnode *x, jv *out)
{
    json_t *r = x->kind == JN_DICT ? json_object() : json_array();
    if (!r)
        return jinja_fail(c, x->line, "out of memory");
    for (size_t k = 0; k < x->nv; k++) {
        jv v;
        json_t *j = NULL;
        if (eval(c, x->v[k], &v) < 0 || as_json(c, x->v[k]->line, &v, &j) < 0) {
            json_decref(r);
            return -1;
        }
        if (x->kind != JN_DICT) {
            if (json_array_append_new(r, j) < 0) {
                json_decref(r);
                return jinja_fail(c, x->line, "out of memory");
            }
            continue;
        }
        jv val;
        json_t *vj = NULL;
        if (!json_is_string(j)) {
            json_decref(j);
            json_decref(r);
            return jinja_fail(c, x->line, "dict keys must be strings");
        }
        if (eval(c, x->w[k], &val) < 0 || as_json(c, x->w[k]->line, &val, &vj) < 0) {
            json_decref(j);
            json_decref(r);
            return -1;
        }
        int rc = json_object_setn_new_nocheck(r, json_string_value(j), json_string_length(j), vj);
        json_decref(j);
        if (rc < 0) {
            json_decref(r);
            return jinja_fail(c, x->line, "out of memory");
        }
    }
    *out = jv_json(r);
    return 0;
}

static int eval(jctx *c, const jnode *x, jv *out)
{
    if (jinja_step(c, x->line, 1) < 0)
        return -1;
    jv a, b;
    int rc = 0;
    switch (x->kind) {
    case JN_LIT:
        *out = jv_json(json_incref(x->lit));
        return 0;
    case JN_NAME:
        *out = lookup(c, x->s);
        return 0;
    case JN_ATTR:
        if (eval(c, x->a, &a) < 0)
            return -1;
        rc = get_attr(c, x->line, &a, x->s, out);
        jv_drop(&a);
        return rc;
    case JN_ITEM:
        if (eval(c, x->a, &a) < 0)
            return -1;
        if (eval(c, x->b, &b) < 0)
            return jv_drop(&a), -1;
        rc = get_item(c, x->line, &a, &b, out);
        jv_drop(&a);
        jv_drop(&b);
        return rc;
    case JN_SLICE:
        return eval_slice(c, x, out);
    case JN_CALL:
        return eval_call(c, x, out);
    case JN_FILTER: {
        args g;
        if (eval(c, x->a, &a) < 0)
            return -1;
        if (eval_args(c, x, &g) < 0)
            return jv_drop(&a), -1;
        rc = jinja_filter(c, x->line, x->s, &a, g.pos, g.n, g.kw, g.kwv, g.n_kw, out);
        args_drop(&g);
        jv_drop(&a);
        return rc;
    }
    case JN_TEST: {
        args g;
        bool r;
        if (eval(c, x->a, &a) < 0)
            return -1;
        if (eval_args(c, x, &g) < 0)
            return jv_drop(&a), -1;
        rc = jinja_test(c, x->line, x->s, &a, g.pos, g.n, &r);
        args_drop(&g);
        jv_drop(&a);
        if (rc == 0)
            *out = jv_json(json_boolean(x->op ? !r : r));
        return rc;
    }
    case JN_BIN:
        if (eval(c, x->a, &a) < 0)
            return -1;
        if (eval(c, x->b, &b) < 0)
            return jv_drop(&a), -1;
        rc = jinja_binop(c, x->line, x->op, &a, &b, out);
        jv_drop(&a);
        jv_drop(&b);
        return rc;
    case JN_NOT:
        if (eval(c, x->a, &a) < 0)
            return -1;
        *out = jv_json(json_boolean(!jinja_truthy(&a)));
        jv_drop(&a);
        return 0;
    case JN_AND:
    case JN_OR:
        if (eval(c, x->a, &a) < 0)
            return -1;
        if (jinja_truthy(&a) == (x->kind == JN_OR)) {
            *out = a;
            return 0;
        }
        jv_drop(&a);
        return eval(c, x->b, out);
    case JN_COND:
        if (eval(c, x->a, &a) < 0)
            return -1;
        rc = jinja_truthy(&a);
        jv_drop(&a);
        if (rc)
            return eval(c, x->b, out);
        if (!x->c) {
            *out = jv_undef(NULL);
            return 0;
        }
        return eval(c, x->c, out);
    case JN_NEG: {
        if (eval(c, x->a, &a) < 0)
            return -1;
        json_t *j = a.kind == JV_JSON ? a.j : NULL;
        if (j && json_is_integer(j))
            *out = jv_json(json_integer(x->op ? json_integer_value(j) : -json_integer_value(j)));
        else if (j && json_is_real(j))
            *out = jv_json(json_real(x->op ? json_real_value(j) : -json_real_value(j)));
        else if (j && json_is_boolean(j))
            *out = jv_json(json_integer(x->op ? json_is_true(j) : -(json_int_t)json_is_true(j)));
        else
            rc = jinja_fail(c, x->line, "bad operand for unary %c", x->op ? '+' : '-');
        jv_drop(&a);
        return rc;
    }
    case JN_LIST:
    case JN_TUPLE:
    case JN_DICT:
        return eval_seq(c, x, out);
    default:
        return jinja_fail(c, x->line, "not an expression");
    }
}

/* Bind a loop item to the loop's targets (unpacking a list for several). */
static int bind_targets(jctx *c, const jnode *x, json_t *item)
{
    if (x->n_names == 1)
        return bind(c, x->line, x->names[0], jv_json(json_incref(item)));
    if (!json_is_array(item) || json_array_size(item) != x->n_names)
        return jinja_fail(c, x->line, "cannot unpack the item into %zu names", x->n_names);
    for (size_t k = 0; k < x->n_names; k++)
        if (bind(c, x->line, x->names[k], jv_json(json_incref(json_array_get(item, k)))) < 0)
            return -1;
    return 0;
}

static json_t *loop_object(json_t *items, size_t i)
{
    size_t n = json_array_size(items);
    json_t *l = json_pack("{sIsIsIsIsbsbsI}", "index", (json_int_t)i + 1, "index0", (json_int_t)i,
                          "revindex", (json_int_t)(n - i), "revindex0", (json_int_t)(n - i - 1),
                          "first", i == 0, "last", i + 1 == n, "length", (json_int_t)n);
    if (l && i > 0)
        json_object_set(l, "previtem", json_array_get(items, i - 1));
    if (l && i + 1 < n)
        json_object_set(l, "nextitem", json_array_get(items, i + 1));
    return l;
}

static int exec_for(jctx *c, const jnode *x)
{
    jv it;
    json_t *all, *items;
    if (eval(c, x->a, &it) < 0)
        return -1;
    int rc = jinja_iter(c, x->line, &it, &all);
    jv_drop(&it);
    if (rc < 0)
        return -1;
    items = all;
    if (x->b) { /* the `if` filter, evaluated with the targets bound */
        items = json_array();
        if (!items) {
            json_decref(all);
            return jinja_fail(c, x->line, "out of memory");
        }
        for (size_t i = 0; i < json_array_size(all) && rc == 0; i++) {
            jv keep;
            if (push_frame(c, x->line, false) < 0) {
                rc = -1;
                break;
            }
            if ((rc = bind_targets(c, x, json_array_get(all, i))) == 0 &&
                (rc = eval(c, x->b, &keep)) == 0) {
                if (jinja_truthy(&keep) && json_array_append(items, json_array_get(all, i)) < 0)
                    rc = jinja_fail(c, x->line, "out of memory");
                jv_drop(&keep);
            }
            pop_frame(c);
        }
        json_decref(all);
        if (rc < 0) {
            json_decref(items);
            return -1;
        }
    }
    size_t n = json_array_size(items);
    for (size_t i = 0; i < n; i++) {
        if (push_frame(c, x->line, false) < 0) {
            rc = -1;
            break;
        }
        json_t *loop = loop_object(items, i);
        rc = loop ? bind(c, x->line, "loop", jv_json(loop))
                  : jinja_fail(c, x->line, "out of memory");
        if (rc == 0)
            rc = bind_targets(c, x, json_array_get(items, i));
        if (rc == 0)
            rc = exec_body(c, x->v, x->nv);
        pop_frame(c);
        if (rc < 0)
            break;
        if (rc == 1) { /* break */
            rc = 0;
            break;
        }
        rc = 0;
    }
    json_decref(items);
    if (rc == 0 && n == 0 && x->nw)
        rc = exec_body(c, x->w, x->nw);
    return rc;
}

static int exec_set(jctx *c, const jnode *x)
{
    jv v;
    if (eval(c, x->a, &v) < 0)
        return -1;
    if (x->op == 1) { /* ns.attr = v */
        const jv *ns = find_var(c, x->names[0]);
        json_t *j = NULL;
        if (!ns || !ns->ns) {
            jv_drop(&v);
            return jinja_fail(c, x->line, "cannot set '%s.%s': '%s' is not a namespace",
                              x->names[0], x->names[1], x->names[0]);
        }
        if (as_json(c, x->line, &v, &j) < 0)
            return jv_drop(&v), -1;
        if (json_object_set_new(ns->j, x->names[1], j) < 0)
            return jinja_fail(c, x->line, "out of memory");
        return 0;
    }
    if (x->n_names == 1)
        return bind(c, x->line, x->names[0], v);
    json_t *t = v.kind == JV_JSON ? v.j : NULL;
    if (!t || !json_is_array(t) || json_array_size(t) != x->n_names) {
        jv_drop(&v);
        return jinja_fail(c, x->line, "cannot unpack the value into %zu names", x->n_names);
    }
    int rc = 0;
    for (size_t k = 0; k < x->n_names && rc == 0; k++)
        rc = bind(c, x->line, x->names[k], jv_json(json_incref(json_array_get(t, k))));
    jv_drop(&v);
    return rc;
}

static int exec_one(jctx *c, const jnode *x)
{
    if (jinja_step(c, x->line, 1) < 0)
        return -1;
    switch (x->kind) {
    case JN_TEXT:
        return out_put(c, x->line, x->s, x->slen);
    case JN_OUT: {
        jv v;
        if (eval(c, x->a, &v) < 0)
            return -1;
        size_t before = c->out->len;
        int rc = jinja_str(c->out, &v, false);
        jv_drop(&v);
        if (rc < 0)
            return jinja_fail(c, x->line, "out of memory");
        if (c->out->len > c->max_output) {
            c->out->len = before;
            return jinja_fail(c, x->line, "output longer than %zu bytes", c->max_output);
        }
        return jinja_step(c, x->line, (c->out->len - before) / 64);
    }
    case JN_IF: {
        jv v;
        if (eval(c, x->a, &v) < 0)
            return -1;
        bool t = jinja_truthy(&v);
        jv_drop(&v);
        return t ? exec_body(c, x->v, x->nv) : exec_body(c, x->w, x->nw);
    }
    case JN_FOR:
        return exec_for(c, x);
    case JN_SET:
        return exec_set(c, x);
    case JN_SETBLOCK: {
        jbuf buf = {0}, *saved = c->out;
        c->out = &buf;
        int rc = exec_body(c, x->v, x->nv);
        c->out = saved;
        json_t *s = rc == 0 ? json_stringn_nocheck(buf.p ? buf.p : "", buf.len) : NULL;
        free(buf.p);
        if (rc != 0)
            return rc < 0 ? -1 : jinja_fail(c, x->line, "break or continue outside a loop");
        if (!s)
            return jinja_fail(c, x->line, "out of memory");
        return bind(c, x->line, x->names[0], jv_json(s));
    }
    case JN_MACRO: {
        jv m = {JV_MACRO, false, NULL, x, x->s};
        return bind(c, x->line, x->s, m);
    }
    case JN_BREAK:
        return 1;
    case JN_CONTINUE:
        return 2;
    default:
        return jinja_fail(c, x->line, "not a statement");
    }
}

static int exec_body(jctx *c, jnode *const *v, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        int rc = exec_one(c, v[k]);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int jinja_render(const jinja_tmpl *t, const json_t *vars, const jinja_limits *lim, char **out,
                 size_t *len, size_t *cap, char *err, size_t err_size)
{
    jbuf buf = {*out, *len, *cap};
    jctx c = {.vars = vars,
              .out = &buf,
              .max_steps = lim && lim->max_steps ? lim->max_steps : 50000000,
              .max_output = lim && lim->max_output ? lim->max_output : (size_t)64 << 20,
              .max_depth = lim && lim->max_depth ? lim->max_depth : 64,
              .now = lim ? lim->now : NULL,
              .err = err,
              .err_size = err_size};
    int rc = json_is_object(vars) ? push_frame(&c, 1, false)
                                  : jinja_fail(&c, 1, "the context must be a JSON object");
    if (rc == 0) {
        rc = exec_body(&c, t->root->v, t->root->nv);
        if (rc > 0)
            rc = jinja_fail(&c, 1, "break or continue outside a loop");
    }
    while (c.n_fr > 0)
        pop_frame(&c);
    free(c.fr);
    *out = buf.p;
    *len = buf.len;
    *cap = buf.cap;
    return rc < 0 ? -1 : 0;
}
