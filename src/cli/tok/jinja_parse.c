/*
 * jinja_parse.c - tokens to a syntax tree by recursive descent, with jinja2's precedence
 * (loosest first):
 *
 *   a if c else b  >  or  >  and  >  not  >  == != < <= > >= in "not in"  >  + -  >  ~
 *   >  * / // %  >  **  >  unary - +  >  primary with postfix . [] () then | filter and
 *   "is" test (so `a + b is defined` tests b, `x|length > 0` compares the length)
 *
 * A test takes its argument in parentheses or, as jinja2 allows, one bare primary
 * (`x is divisibleby 3`, `x is sameas none`). Tags end bodies by name (endif, elif, else,
 * endfor, endset, endmacro, endgeneration). Nesting is bounded (256 levels) so a hostile
 * template cannot exhaust the stack; every node lives in the template's arena.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "jinja_int.h"

#define MAX_NEST 256

typedef struct parser {
    jinja_tmpl *t;
    jtok *tk;
    size_t n, pos;
    int depth;
    char *err;
    size_t err_size;
} parser;

/* A growable list of nodes, copied into the arena when done. */
typedef struct nvec {
    jnode **p;
    size_t n, cap;
} nvec;

static int pfail(parser *P, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int pfail(parser *P, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = P->tk[P->pos < P->n ? P->pos : P->n - 1].line;
    cli_errf(P->err, P->err_size, "%d: %s", line, msg);
    return -1;
}

static jtok *cur(parser *P)
{
    return &P->tk[P->pos];
}

static bool is_op(parser *P, const char *op)
{
    return cur(P)->type == JT_OP && strcmp(cur(P)->op, op) == 0;
}

static bool is_name(parser *P, const char *name)
{
    return cur(P)->type == JT_NAME && strcmp(cur(P)->s, name) == 0;
}

static bool accept_op(parser *P, const char *op)
{
    if (!is_op(P, op))
        return false;
    P->pos++;
    return true;
}

static bool accept_name(parser *P, const char *name)
{
    if (!is_name(P, name))
        return false;
    P->pos++;
    return true;
}

static const char *tok_desc(jtok *t)
{
    switch (t->type) {
    case JT_EOF:
        return "end of template";
    case JT_TEXT:
        return "text";
    case JT_VAR_END:
        return "'}}'";
    case JT_BLOCK_END:
        return "'%}'";
    case JT_NAME:
        return t->s;
    case JT_STRING:
        return "a string";
    case JT_INT:
    case JT_FLOAT:
        return "a number";
    case JT_OP:
        return t->op;
    default:
        return "a tag";
    }
}

static int expect_op(parser *P, const char *op)
{
    if (accept_op(P, op))
        return 0;
    return pfail(P, "expected '%s', found '%s'", op, tok_desc(cur(P)));
}

static jnode *node(parser *P, int kind)
{
    jnode *x = jarena_alloc(&P->t->arena, sizeof *x);
    if (!x) {
        pfail(P, "out of memory");
        return NULL;
    }
    x->kind = (uint8_t)kind;
    x->line = cur(P)->line;
    return x;
}

static int nvec_push(parser *P, nvec *v, jnode *x)
{
    if (!cli_grow((void **)&v->p, &v->cap, v->n + 1, sizeof(jnode *)))
        return pfail(P, "out of memory");
    v->p[v->n++] = x;
    return 0;
}

/* Move v into the arena: *out, *n. Frees v's array. */
static int nvec_done(parser *P, nvec *v, jnode ***out, size_t *n)
{
    *n = v->n;
    *out = NULL;
    if (v->n) {
        *out = jarena_alloc(&P->t->arena, v->n * sizeof(jnode *));
        if (!*out) {
            free(v->p);
            return pfail(P, "out of memory");
        }
        memcpy(*out, v->p, v->n * sizeof(jnode *));
    }
    free(v->p);
    v->p = NULL;
    return 0;
}

static int names_done(parser *P, const char **tmp, size_t n, const char ***out)
{
    *out = jarena_alloc(&P->t->arena, (n ? n : 1) * sizeof(char *));
    if (!*out)
        return pfail(P, "out of memory");
    memcpy(*out, tmp, n * sizeof(char *));
    return 0;
}

static int add_lit(parser *P, jnode *x, json_t *j)
{
    jinja_tmpl *t = P->t;
    if (!j)
        return pfail(P, "out of memory");
    if (!cli_grow((void **)&t->lits, &t->cap_lits, t->n_lits + 1, sizeof(json_t *))) {
        json_decref(j);
        return pfail(P, "out of memory");
    }
    t->lits[t->n_lits++] = j;
    x->lit = j;
    return 0;
}

static jnode *parse_expr(parser *P, bool condexpr);
static jnode *parse_unary(parser *P, bool with_filter);
static jnode *parse_primary(parser *P);

static int enter(parser *P)
{
    if (++P->depth > MAX_NEST)
        return pfail(P, "nested too deeply (more than %d levels)", MAX_NEST);
    return 0;
}

/* Arguments of a call, filter or test after '(' : positional in v, keywords in names/w. */
static int parse_args(parser *P, jnode *x)
{
    nvec pos = {0}, kwv = {0};
    const char *kwn[64];
    size_t n_kw = 0;
    while (!is_op(P, ")")) {
        if (cur(P)->type == JT_NAME && P->pos + 1 < P->n && P->tk[P->pos + 1].type == JT_OP &&
            strcmp(P->tk[P->pos + 1].op, "=") == 0) {
            if (n_kw == 64) {
                pfail(P, "too many keyword arguments");
                goto fail;
            }
            kwn[n_kw++] = cur(P)->s;
            P->pos += 2;
            jnode *v = parse_expr(P, true);
            if (!v || nvec_push(P, &kwv, v) < 0)
                goto fail;
        } else {
            if (n_kw) {
                pfail(P, "positional argument after a keyword argument");
                goto fail;
            }
            jnode *v = parse_expr(P, true);
            if (!v || nvec_push(P, &pos, v) < 0)
                goto fail;
        }
        if (!accept_op(P, ","))
            break;
    }
    if (expect_op(P, ")") < 0)
        goto fail;
    if (nvec_done(P, &pos, &x->v, &x->nv) < 0 || nvec_done(P, &kwv, &x->w, &x->nw) < 0 ||
        names_done(P, kwn, n_kw, &x->names) < 0)
        goto fail;
    x->n_names = n_kw;
    return 0;
fail:
    free(pos.p);
    free(kwv.p);
    return -1;
}

static jnode *parse_subscript(parser *P, jnode *obj)
{
    jnode *parts[3] = {NULL, NULL, NULL};
    int k = 0;
    bool slice = false;
    for (;;) {
        if (!is_op(P, ":") && !is_op(P, "]")) {
            parts[k] = parse_expr(P, true);
            if (!parts[k])
                return NULL;
        }
        if (accept_op(P, ":")) {
            slice = true;
            if (++k == 3)
                return pfail(P, "too many ':' in a slice"), NULL;
            continue;
        }
        break;
    }
    if (expect_op(P, "]") < 0)
        return NULL;
    jnode *x = node(P, slice ? JN_SLICE : JN_ITEM);
    if (!x)
        return NULL;
    x->a = obj;
    if (!slice) {
        if (!parts[0])
            return pfail(P, "expected an index inside '[]'"), NULL;
        x->b = parts[0];
        return x;
    }
    x->v = jarena_alloc(&P->t->arena, 3 * sizeof(jnode *));
    if (!x->v)
        return pfail(P, "out of memory"), NULL;
    memcpy(x->v, parts, sizeof parts);
    x->nv = 3;
    return x;
}

/* A call of callee x after its '(' (at line). */
static jnode *parse_call(parser *P, jnode *x, int line)
{
    jnode *y = node(P, JN_CALL);
    if (!y)
        return NULL;
    y->a = x;
    y->line = line;
    return parse_args(P, y) < 0 ? NULL : y;
}

static jnode *parse_postfix(parser *P, jnode *x)
{
    for (;;) {
        int line = cur(P)->line;
        if (accept_op(P, ".")) {
            jnode *y = node(P, JN_ATTR);
            if (!y)
                return NULL;
            if (cur(P)->type == JT_NAME) {
                y->s = cur(P)->s;
            } else if (cur(P)->type == JT_INT) {
                /* a.0 is a[0] */
                y->kind = JN_ITEM;
                y->b = node(P, JN_LIT);
                if (!y->b || add_lit(P, y->b, json_integer(cur(P)->i)) < 0)
                    return NULL;
            } else {
                return pfail(P, "expected an attribute name after '.'"), NULL;
            }
            P->pos++;
            y->a = x;
            y->line = line;
            x = y;
        } else if (accept_op(P, "[")) {
            x = parse_subscript(P, x);
            if (!x)
                return NULL;
            x->line = line;
        } else if (accept_op(P, "(")) {
            if (!(x = parse_call(P, x, line)))
                return NULL;
        } else {
            return x;
        }
    }
}

/* `|` filters and `is` tests after a unary expression. */
static jnode *parse_filter_expr(parser *P, jnode *x)
{
    for (;;) {
        int line = cur(P)->line;
        if (accept_op(P, "|")) {
            if (cur(P)->type != JT_NAME)
                return pfail(P, "expected a filter name after '|'"), NULL;
            jnode *y = node(P, JN_FILTER);
            if (!y)
                return NULL;
            y->s = cur(P)->s;
            P->pos++;
            /* dotted filter names do not exist in the subset */
            if (accept_op(P, "(") && parse_args(P, y) < 0)
                return NULL;
            y->a = x;
            y->line = line;
            x = y;
        } else if (accept_name(P, "is")) {
            jnode *y = node(P, JN_TEST);
            if (!y)
                return NULL;
            if (accept_name(P, "not"))
                y->op = 1;
            if (cur(P)->type != JT_NAME)
                return pfail(P, "expected a test name after 'is'"), NULL;
            y->s = cur(P)->s;
            P->pos++;
            if (accept_op(P, "(")) {
                if (parse_args(P, y) < 0)
                    return NULL;
            } else {
                jtok *t = cur(P);
                bool arg =
                    t->type == JT_STRING || t->type == JT_INT || t->type == JT_FLOAT ||
                    (t->type == JT_OP && (strcmp(t->op, "[") == 0 || strcmp(t->op, "{") == 0 ||
                                          strcmp(t->op, "(") == 0)) ||
                    (t->type == JT_NAME && strcmp(t->s, "else") != 0 && strcmp(t->s, "or") != 0 &&
                     strcmp(t->s, "and") != 0);
                if (arg) {
                    jnode *a = parse_primary(P);
                    if (!a || !(a = parse_postfix(P, a)))
                        return NULL;
                    y->v = jarena_alloc(&P->t->arena, sizeof(jnode *));
                    if (!y->v)
                        return pfail(P, "out of memory"), NULL;
                    y->v[0] = a;
                    y->nv = 1;
                }
            }
            y->a = x;
            y->line = line;
            x = y;
        } else if (accept_op(P, "(")) {
            if (!(x = parse_call(P, x, line)))
                return NULL;
        } else {
            return x;
        }
    }
}

/* A parenthesised expression or tuple, a list or a dict, after its opening token. */
static jnode *parse_seq(parser *P, int kind, const char *close)
{
    jnode *x = node(P, kind);
    if (!x)
        return NULL;
    nvec a = {0}, b = {0};
    bool comma = false;
    while (!is_op(P, close)) {
        jnode *e = parse_expr(P, true);
        if (!e || nvec_push(P, &a, e) < 0)
            goto fail;
        if (kind == JN_DICT) {
            if (expect_op(P, ":") < 0)
                goto fail;
            jnode *v = parse_expr(P, true);
            if (!v || nvec_push(P, &b, v) < 0)
                goto fail;
        }
        if (!accept_op(P, ","))
            break;
        comma = true;
    }
    if (expect_op(P, close) < 0)
        goto fail;
    if (kind == JN_TUPLE && a.n == 1 && !comma) { /* (expr) */
        jnode *e = a.p[0];
        free(a.p);
        return e;
    }
    if (nvec_done(P, &a, &x->v, &x->nv) < 0 || nvec_done(P, &b, &x->w, &x->nw) < 0)
        goto fail;
    return x;
fail:
    free(a.p);
    free(b.p);
    return NULL;
}

static jnode *parse_primary(parser *P)
{
    if (enter(P) < 0)
        return NULL;
    jtok *t = cur(P);
    jnode *x = NULL;
    if (t->type == JT_NAME) {
        static const char *const lits[] = {"true", "True", "false", "False", "none", "None"};
        int k = 0;
        while (k < 6 && strcmp(t->s, lits[k]) != 0)
            k++;
        if (k < 6) {
            x = node(P, JN_LIT);
            if (!x || add_lit(P, x, k < 2 ? json_true() : k < 4 ? json_false() : json_null()) < 0)
                return NULL;
        } else {
            x = node(P, JN_NAME);
            if (!x)
                return NULL;
            x->s = t->s;
        }
        P->pos++;
    } else if (t->type == JT_STRING) {
        /* adjacent strings are one */
        size_t total = 0, k = P->pos;
        for (; P->tk[k].type == JT_STRING; k++)
            total += P->tk[k].n;
        char *s = malloc(total + 1);
        if (!s)
            return pfail(P, "out of memory"), NULL;
        total = 0;
        for (; P->tk[P->pos].type == JT_STRING; P->pos++) {
            memcpy(s + total, P->tk[P->pos].s, P->tk[P->pos].n);
            total += P->tk[P->pos].n;
        }
        x = node(P, JN_LIT);
        int rc = x ? add_lit(P, x, json_stringn_nocheck(s, total)) : -1;
        if (x)
            x->line = t->line;
        free(s);
        if (rc < 0)
            return NULL;
    } else if (t->type == JT_INT || t->type == JT_FLOAT) {
        x = node(P, JN_LIT);
        if (!x || add_lit(P, x, t->type == JT_INT ? json_integer(t->i) : json_real(t->f)) < 0)
            return NULL;
        P->pos++;
    } else if (accept_op(P, "(")) {
        x = parse_seq(P, JN_TUPLE, ")");
    } else if (accept_op(P, "[")) {
        x = parse_seq(P, JN_LIST, "]");
    } else if (accept_op(P, "{")) {
        x = parse_seq(P, JN_DICT, "}");
    } else {
        return pfail(P, "unexpected '%s'", tok_desc(t)), NULL;
    }
    P->depth--;
    return x;
}

static jnode *parse_unary(parser *P, bool with_filter)
{
    if (enter(P) < 0)
        return NULL;
    jnode *x;
    if (is_op(P, "-") || is_op(P, "+")) {
        x = node(P, JN_NEG);
        if (!x)
            return NULL;
        x->op = is_op(P, "+");
        P->pos++;
        x->a = parse_unary(P, false);
        if (!x->a)
            return NULL;
    } else {
        x = parse_primary(P);
        if (!x || !(x = parse_postfix(P, x)))
            return NULL;
    }
    if (with_filter && !(x = parse_filter_expr(P, x)))
        return NULL;
    P->depth--;
    return x;
}

static jnode *binary(parser *P, int op, jnode *a, jnode *b, int line)
{
    if (!b)
        return NULL;
    jnode *x = node(P, JN_BIN);
    if (!x)
        return NULL;
    x->op = (uint8_t)op;
    x->a = a;
    x->b = b;
    x->line = line;
    return x;
}

static jnode *parse_pow(parser *P)
{
    jnode *x = parse_unary(P, true);
    while (x && is_op(P, "**")) {
        int line = cur(P)->line;
        P->pos++;
        x = binary(P, JO_POW, x, parse_unary(P, true), line);
    }
    return x;
}

static jnode *parse_math2(parser *P)
{
    jnode *x = parse_pow(P);
    for (;;) {
        int op = is_op(P, "*")    ? JO_MUL
                 : is_op(P, "/")  ? JO_DIV
                 : is_op(P, "//") ? JO_FLOORDIV
                 : is_op(P, "%")  ? JO_MOD
                                  : -1;
        if (!x || op < 0)
            return x;
        int line = cur(P)->line;
        P->pos++;
        x = binary(P, op, x, parse_pow(P), line);
    }
}

static jnode *parse_concat(parser *P)
{
    jnode *x = parse_math2(P);
    while (x && is_op(P, "~")) {
        int line = cur(P)->line;
        P->pos++;
        x = binary(P, JO_CONCAT, x, parse_math2(P), line);
    }
    return x;
}

static jnode *parse_math1(parser *P)
{
    jnode *x = parse_concat(P);
    for (;;) {
        int op = is_op(P, "+") ? JO_ADD : is_op(P, "-") ? JO_SUB : -1;
        if (!x || op < 0)
            return x;
        int line = cur(P)->line;
        P->pos++;
        x = binary(P, op, x, parse_concat(P), line);
    }
}

static jnode *parse_compare(parser *P)
{
    jnode *x = parse_math1(P);
    for (;;) {
        if (!x)
            return NULL;
        int line = cur(P)->line, op = -1;
        static const char *const sym[] = {"==", "!=", "<", "<=", ">", ">="};
        static const int code[] = {JO_EQ, JO_NE, JO_LT, JO_LE, JO_GT, JO_GE};
        for (int k = 0; k < 6; k++)
            if (is_op(P, sym[k]))
                op = code[k];
        if (op >= 0) {
            P->pos++;
        } else if (is_name(P, "in")) {
            op = JO_IN;
            P->pos++;
        } else if (is_name(P, "not") && P->tk[P->pos + 1].type == JT_NAME &&
                   strcmp(P->tk[P->pos + 1].s, "in") == 0) {
            op = JO_NOTIN;
            P->pos += 2;
        } else {
            return x;
        }
        x = binary(P, op, x, parse_math1(P), line);
    }
}

static jnode *parse_not(parser *P)
{
    if (is_name(P, "not")) {
        if (enter(P) < 0)
            return NULL;
        jnode *x = node(P, JN_NOT);
        if (!x)
            return NULL;
        P->pos++;
        x->a = parse_not(P);
        P->depth--;
        return x->a ? x : NULL;
    }
    return parse_compare(P);
}

/* `a and b ...` (word "and", over parse_not) or `a or b ...` (word "or", over the "and"
 * chains): left-associative chains of JN_AND / JN_OR. */
static jnode *parse_logic(parser *P, bool is_or)
{
    jnode *x = is_or ? parse_logic(P, false) : parse_not(P);
    while (x && is_name(P, is_or ? "or" : "and")) {
        jnode *y = node(P, is_or ? JN_OR : JN_AND);
        if (!y)
            return NULL;
        P->pos++;
        y->a = x;
        y->b = is_or ? parse_logic(P, false) : parse_not(P);
        x = y->b ? y : NULL;
    }
    return x;
}

static jnode *parse_expr(parser *P, bool condexpr)
{
    if (enter(P) < 0)
        return NULL;
    jnode *x = parse_logic(P, true);
    while (condexpr && x && is_name(P, "if")) {
        jnode *y = node(P, JN_COND);
        if (!y)
            return NULL;
        P->pos++;
        y->b = x;
        y->a = parse_logic(P, true);
        if (!y->a)
            return NULL;
        if (accept_name(P, "else")) {
            y->c = parse_expr(P, true);
            if (!y->c)
                return NULL;
        }
        x = y;
    }
    P->depth--;
    return x;
}

/* An expression, or a bare tuple `a, b` (set and for's iterable). */
static jnode *parse_tuple(parser *P, bool condexpr)
{
    jnode *x = parse_expr(P, condexpr);
    if (!x || !is_op(P, ","))
        return x;
    nvec v = {0};
    jnode *t = node(P, JN_TUPLE);
    if (!t || nvec_push(P, &v, x) < 0)
        goto fail;
    while (accept_op(P, ",")) {
        if (cur(P)->type == JT_BLOCK_END || cur(P)->type == JT_VAR_END || is_name(P, "if"))
            break;
        jnode *e = parse_expr(P, condexpr);
        if (!e || nvec_push(P, &v, e) < 0)
            goto fail;
    }
    if (nvec_done(P, &v, &t->v, &t->nv) < 0)
        return NULL;
    return t;
fail:
    free(v.p);
    return NULL;
}

/* Names separated by commas (for targets, set targets), optionally in parentheses. */
static int parse_targets(parser *P, jnode *x)
{
    const char *tmp[16];
    size_t n = 0;
    bool paren = accept_op(P, "(");
    do {
        if (cur(P)->type != JT_NAME)
            return pfail(P, "expected a variable name, found '%s'", tok_desc(cur(P)));
        if (n == 16)
            return pfail(P, "too many names to unpack");
        tmp[n++] = cur(P)->s;
        P->pos++;
    } while (accept_op(P, ","));
    if (paren && expect_op(P, ")") < 0)
        return -1;
    x->n_names = n;
    return names_done(P, tmp, n, &x->names);
}

static int end_tag(parser *P)
{
    if (cur(P)->type != JT_BLOCK_END)
        return pfail(P, "expected '%%}', found '%s'", tok_desc(cur(P)));
    P->pos++;
    return 0;
}

static int parse_body(parser *P, const char *const *stop, jnode ***out, size_t *n,
                      const char **found);

/* {% if %} after its name: condition, body, elif/else chain, endif. */
static jnode *parse_if(parser *P)
{
    static const char *const stop[] = {"elif", "else", "endif", NULL};
    jnode *x = node(P, JN_IF);
    if (!x || !(x->a = parse_tuple(P, true)) || end_tag(P) < 0)
        return NULL;
    const char *found;
    if (parse_body(P, stop, &x->v, &x->nv, &found) < 0)
        return NULL;
    if (strcmp(found, "elif") == 0) {
        jnode *e = parse_if(P);
        if (!e)
            return NULL;
        x->w = jarena_alloc(&P->t->arena, sizeof(jnode *));
        if (!x->w)
            return pfail(P, "out of memory"), NULL;
        x->w[0] = e;
        x->nw = 1;
        return x;
    }
    if (strcmp(found, "else") == 0) {
        static const char *const stop2[] = {"endif", NULL};
        if (end_tag(P) < 0 || parse_body(P, stop2, &x->w, &x->nw, &found) < 0)
            return NULL;
    }
    return end_tag(P) < 0 ? NULL : x;
}

static jnode *parse_for(parser *P)
{
    static const char *const stop[] = {"else", "endfor", NULL};
    static const char *const stop2[] = {"endfor", NULL};
    jnode *x = node(P, JN_FOR);
    if (!x || parse_targets(P, x) < 0)
        return NULL;
    if (!accept_name(P, "in"))
        return pfail(P, "expected 'in' in a for loop"), NULL;
    if (!(x->a = parse_tuple(P, false)))
        return NULL;
    if (accept_name(P, "if") && !(x->b = parse_expr(P, true)))
        return NULL;
    if (is_name(P, "recursive"))
        return pfail(P, "recursive loops are not supported"), NULL;
    const char *found;
    if (end_tag(P) < 0 || parse_body(P, stop, &x->v, &x->nv, &found) < 0)
        return NULL;
    if (strcmp(found, "else") == 0 &&
        (end_tag(P) < 0 || parse_body(P, stop2, &x->w, &x->nw, &found) < 0))
        return NULL;
    return end_tag(P) < 0 ? NULL : x;
}

static jnode *parse_set(parser *P)
{
    jnode *x = node(P, JN_SET);
    if (!x)
        return NULL;
    if (cur(P)->type == JT_NAME && P->tk[P->pos + 1].type == JT_OP &&
        strcmp(P->tk[P->pos + 1].op, ".") == 0) {
        /* set ns.attr = value */
        const char **nm = jarena_alloc(&P->t->arena, 2 * sizeof(char *));
        if (!nm)
            return pfail(P, "out of memory"), NULL;
        nm[0] = cur(P)->s;
        P->pos += 2;
        if (cur(P)->type != JT_NAME)
            return pfail(P, "expected an attribute name after '.'"), NULL;
        nm[1] = cur(P)->s;
        P->pos++;
        x->names = nm;
        x->n_names = 2;
        x->op = 1;
    } else if (parse_targets(P, x) < 0) {
        return NULL;
    }
    if (cur(P)->type == JT_BLOCK_END && x->op == 0 && x->n_names == 1) {
        static const char *const stop[] = {"endset", NULL};
        const char *found;
        x->kind = JN_SETBLOCK;
        if (end_tag(P) < 0 || parse_body(P, stop, &x->v, &x->nv, &found) < 0)
            return NULL;
        return end_tag(P) < 0 ? NULL : x;
    }
    if (expect_op(P, "=") < 0 || !(x->a = parse_tuple(P, true)))
        return NULL;
    return end_tag(P) < 0 ? NULL : x;
}

static jnode *parse_macro(parser *P)
{
    static const char *const stop[] = {"endmacro", NULL};
    jnode *x = node(P, JN_MACRO);
    if (!x)
        return NULL;
    if (cur(P)->type != JT_NAME)
        return pfail(P, "expected a macro name"), NULL;
    x->s = cur(P)->s;
    P->pos++;
    if (expect_op(P, "(") < 0)
        return NULL;
    const char *names[64];
    jnode *defs[64];
    size_t n = 0;
    while (!is_op(P, ")")) {
        if (cur(P)->type != JT_NAME)
            return pfail(P, "expected a parameter name"), NULL;
        if (n == 64)
            return pfail(P, "too many macro parameters"), NULL;
        names[n] = cur(P)->s;
        defs[n] = NULL;
        P->pos++;
        if (accept_op(P, "=") && !(defs[n] = parse_expr(P, true)))
            return NULL;
        n++;
        if (!accept_op(P, ","))
            break;
    }
    if (expect_op(P, ")") < 0 || end_tag(P) < 0)
        return NULL;
    if (names_done(P, names, n, &x->names) < 0)
        return NULL;
    x->n_names = n;
    x->w = jarena_alloc(&P->t->arena, (n ? n : 1) * sizeof(jnode *));
    if (!x->w)
        return pfail(P, "out of memory"), NULL;
    memcpy(x->w, defs, n * sizeof(jnode *));
    x->nw = n;
    const char *found;
    if (parse_body(P, stop, &x->v, &x->nv, &found) < 0)
        return NULL;
    if (cur(P)->type == JT_NAME) /* {% endmacro name %} */
        P->pos++;
    return end_tag(P) < 0 ? NULL : x;
}

/* One {% ... %} statement after its opening delimiter; *x NULL for a tag that adds no
 * node (generation). Returns 1 when the tag is in stop (left unconsumed at its name). */
static int parse_tag(parser *P, const char *const *stop, jnode **x, const char **found)
{
    *x = NULL;
    if (cur(P)->type != JT_NAME)
        return pfail(P, "expected a tag name, found '%s'", tok_desc(cur(P)));
    const char *name = cur(P)->s;
    for (size_t k = 0; stop && stop[k]; k++)
        if (strcmp(name, stop[k]) == 0) {
            *found = stop[k];
            P->pos++;
            return 1;
        }
    P->pos++;
    if (strcmp(name, "if") == 0)
        *x = parse_if(P);
    else if (strcmp(name, "for") == 0)
        *x = parse_for(P);
    else if (strcmp(name, "set") == 0)
        *x = parse_set(P);
    else if (strcmp(name, "macro") == 0)
        *x = parse_macro(P);
    else if (strcmp(name, "break") == 0 || strcmp(name, "continue") == 0) {
        *x = node(P, name[0] == 'b' ? JN_BREAK : JN_CONTINUE);
        if (*x && end_tag(P) < 0)
            return -1;
    } else if (strcmp(name, "generation") == 0 || strcmp(name, "endgeneration") == 0) {
        return end_tag(P); /* transformers' mask marker: its body renders as usual */
    } else {
        return pfail(P, "unknown tag '%s'", name);
    }
    return *x ? 0 : -1;
}

/* Statements up to a block tag named in stop (NULL: to the end). *found: the stop tag. */
static int parse_body(parser *P, const char *const *stop, jnode ***out, size_t *n,
                      const char **found)
{
    if (enter(P) < 0)
        return -1;
    nvec v = {0};
    *found = NULL;
    for (;;) {
        jtok *t = cur(P);
        jnode *x = NULL;
        if (t->type == JT_EOF) {
            if (stop) {
                pfail(P, "unexpected end of template: expected {%% %s %%}", stop[0]);
                goto fail;
            }
            break;
        } else if (t->type == JT_TEXT) {
            if (!(x = node(P, JN_TEXT)))
                goto fail;
            x->s = t->s;
            x->slen = t->n;
            P->pos++;
        } else if (t->type == JT_VAR_BEGIN) {
            P->pos++;
            if (!(x = node(P, JN_OUT)) || !(x->a = parse_tuple(P, true)))
                goto fail;
            if (cur(P)->type != JT_VAR_END) {
                pfail(P, "expected '}}', found '%s'", tok_desc(cur(P)));
                goto fail;
            }
            P->pos++;
        } else if (t->type == JT_BLOCK_BEGIN) {
            P->pos++;
            int rc = parse_tag(P, stop, &x, found);
            if (rc < 0)
                goto fail;
            if (rc == 1)
                break;
        } else {
            pfail(P, "unexpected '%s'", tok_desc(t));
            goto fail;
        }
        if (x && nvec_push(P, &v, x) < 0)
            goto fail;
    }
    P->depth--;
    return nvec_done(P, &v, out, n);
fail:
    free(v.p);
    return -1;
}

void jinja_free(jinja_tmpl *t)
{
    if (!t)
        return;
    for (size_t k = 0; k < t->n_lits; k++)
        json_decref(t->lits[k]);
    free(t->lits);
    jarena_free(&t->arena);
    free(t);
}

int jinja_parse(const char *src, size_t n, jinja_tmpl **out, char *err, size_t err_size)
{
    jinja_tmpl *t = calloc(1, sizeof *t);
    if (!t)
        return cli_errf(err, err_size, "1: out of memory"), -1;
    jtok *toks = NULL;
    size_t n_toks = 0;
    if (jinja_lex(&t->arena, src, n, &toks, &n_toks, err, err_size) < 0) {
        jinja_free(t);
        return -1;
    }
    parser P = {.t = t, .tk = toks, .n = n_toks, .err = err, .err_size = err_size};
    const char *found;
    t->root = jarena_alloc(&t->arena, sizeof(jnode));
    int rc = t->root ? parse_body(&P, NULL, &t->root->v, &t->root->nv, &found)
                     : pfail(&P, "out of memory");
    free(toks);
    if (rc < 0) {
        jinja_free(t);
        return -1;
    }
    *out = t;
    return 0;
}
