/*
 * jinja_value.c - template values as Python sees them: truth, ==, ordering, the binary
 * operators, iteration, str() and repr(), and code-point indexing of UTF-8 strings.
 *
 * Python's rules kept here because a template's output depends on them: bool is an int
 * (True + 1 == 2, 1 == True); / is always a float, // and % floor toward minus infinity;
 * str(1.0) is "1.0" and str(1e16) "1e+16" (pyjson_repr_double); str() of a list or dict is
 * its repr, strings inside in single quotes unless they hold a single quote and no
 * double quote; an undefined value prints as "" and is false. Strings are indexed,
 * sliced and measured in code points; invalid UTF-8 bytes count one each.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_int.h"
#include "pyjson.h"

int jbuf_put(jbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) {
            if (cap > SIZE_MAX / 2)
                return -1;
            cap *= 2;
        }
        char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

static size_t u8_step(const char *s, size_t n, size_t i)
{
    unsigned char c = (unsigned char)s[i];
    size_t w = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + w > n)
        return 1;
    for (size_t k = 1; k < w; k++)
        if (((unsigned char)s[i + k] >> 6) != 2)
            return 1;
    return w;
}

size_t jinja_u8len(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i += u8_step(s, n, i))
        k++;
    return k;
}

size_t jinja_u8off(const char *s, size_t n, size_t idx)
{
    size_t i = 0;
    for (size_t k = 0; k < idx && i < n; k++)
        i += u8_step(s, n, i);
    return i;
}

bool jinja_truthy(const jv *v)
{
    if (v->kind == JV_UNDEF)
        return false;
    if (v->kind != JV_JSON)
        return true;
    json_t *j = v->j;
    switch (json_typeof(j)) {
    case JSON_NULL:
    case JSON_FALSE:
        return false;
    case JSON_TRUE:
        return true;
    case JSON_INTEGER:
        return json_integer_value(j) != 0;
    case JSON_REAL:
        return json_real_value(j) != 0.0;
    case JSON_STRING:
        return json_string_length(j) > 0;
    case JSON_ARRAY:
        return json_array_size(j) > 0;
    case JSON_OBJECT:
        return json_object_size(j) > 0;
    }
    return true;
}

static bool is_num(const json_t *j)
{
    return json_is_integer(j) || json_is_real(j) || json_is_boolean(j);
}

static bool is_int(const json_t *j)
{
    return json_is_integer(j) || json_is_boolean(j);
}

static json_int_t int_of(const json_t *j)
{
    return json_is_integer(j) ? json_integer_value(j) : json_is_true(j);
}

static double num_of(const json_t *j)
{
    return json_is_real(j) ? json_real_value(j) : (double)int_of(j);
}

bool jinja_equal(const json_t *a, const json_t *b)
{
    if (is_num(a) && is_num(b)) {
        if (is_int(a) && is_int(b))
            return int_of(a) == int_of(b);
        return num_of(a) == num_of(b);
    }
    if (json_typeof(a) != json_typeof(b))
        return false;
    switch (json_typeof(a)) {
    case JSON_NULL:
        return true;
    case JSON_STRING:
        return json_string_length(a) == json_string_length(b) &&
               memcmp(json_string_value(a), json_string_value(b), json_string_length(a)) == 0;
    case JSON_ARRAY:
        if (json_array_size(a) != json_array_size(b))
            return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!jinja_equal(json_array_get(a, i), json_array_get(b, i)))
                return false;
        return true;
    case JSON_OBJECT: {
        if (json_object_size(a) != json_object_size(b))
            return false;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)a, k, v)
        {
            json_t *w = json_object_get(b, k);
            if (!w || !jinja_equal(v, w))
                return false;
        }
        return true;
    }
    default:
        return false;
    }
}

/* Python's ordering: -1, 0, 1, or 2 when the types cannot be ordered. */
static int order(const json_t *a, const json_t *b)
{
    if (is_num(a) && is_num(b)) {
        if (is_int(a) && is_int(b))
            return (int_of(a) > int_of(b)) - (int_of(a) < int_of(b));
        double x = num_of(a), y = num_of(b);
        return (x > y) - (x < y);
    }
    if (json_is_string(a) && json_is_string(b)) {
        size_t n = json_string_length(a), m = json_string_length(b);
        int r = memcmp(json_string_value(a), json_string_value(b), n < m ? n : m);
        if (r == 0)
            r = (n > m) - (n < m);
        return (r > 0) - (r < 0);
    }
    if (json_is_array(a) && json_is_array(b)) {
        size_t n = json_array_size(a), m = json_array_size(b);
        for (size_t i = 0; i < n && i < m; i++) {
            if (jinja_equal(json_array_get(a, i), json_array_get(b, i)))
                continue;
            return order(json_array_get(a, i), json_array_get(b, i));
        }
        return (n > m) - (n < m);
    }
    return 2;
}

static int put_s(jbuf *b, const char *s)
{
    return jbuf_put(b, s, strlen(s));
}

/* Python's repr of a string. */
static int repr_string(jbuf *b, const char *s, size_t n)
{
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    if (jbuf_put(b, &q, 1) < 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        const char *e = NULL;
        if (c == '\\')
            e = "\\\\";
        else if (c == (unsigned char)q)
            e = q == '\'' ? "\\'" : "\\\"";
        else if (c == '\n')
            e = "\\n";
        else if (c == '\r')
            e = "\\r";
        else if (c == '\t')
            e = "\\t";
        else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", c);
            e = esc;
        } else if (c == 0xC2 && i + 1 < n &&
                   (((unsigned char)s[i + 1] >= 0x80 && (unsigned char)s[i + 1] <= 0xA0) ||
                    (unsigned char)s[i + 1] == 0xAD)) {
            /* U+0080..U+00A0 and U+00AD are not printable in Python */
            unsigned char d = (unsigned char)s[i + 1];
            snprintf(esc, sizeof esc, "\\x%02x", d);
            if (jbuf_put(b, esc, 4) < 0)
                return -1;
            i++;
            continue;
        }
        if (e ? put_s(b, e) < 0 : jbuf_put(b, (const char *)&s[i], 1) < 0)
            return -1;
    }
    return jbuf_put(b, &q, 1);
}

static int str_json(jbuf *b, const json_t *j, bool repr)
{
    char tmp[64];
    switch (json_typeof(j)) {
    case JSON_NULL:
        return put_s(b, "None");
    case JSON_TRUE:
        return put_s(b, "True");
    case JSON_FALSE:
        return put_s(b, "False");
    case JSON_INTEGER:
        snprintf(tmp, sizeof tmp, "%lld", (long long)json_integer_value(j));
        return put_s(b, tmp);
    case JSON_REAL:
        pyjson_repr_double(json_real_value(j), tmp, sizeof tmp);
        return put_s(b, tmp);
    case JSON_STRING:
        return repr ? repr_string(b, json_string_value(j), json_string_length(j))
                    : jbuf_put(b, json_string_value(j), json_string_length(j));
    case JSON_ARRAY:
        if (put_s(b, "[") < 0)
            return -1;
        for (size_t i = 0; i < json_array_size(j); i++)
            if ((i && put_s(b, ", ") < 0) || str_json(b, json_array_get(j, i), true) < 0)
                return -1;
        return put_s(b, "]");
    case JSON_OBJECT: {
        if (put_s(b, "{") < 0)
            return -1;
        const char *k;
        json_t *v;
        bool first = true;
        json_object_foreach((json_t *)j, k, v)
        {
            if ((!first && put_s(b, ", ") < 0) || repr_string(b, k, strlen(k)) < 0 ||
                put_s(b, ": ") < 0 || str_json(b, v, true) < 0)
                return -1;
            first = false;
        }
        return put_s(b, "}");
    }
    }
    return 0;
}

int jinja_str(jbuf *b, const jv *v, bool repr)
{
    switch (v->kind) {
    case JV_UNDEF:
        return repr ? put_s(b, "Undefined") : 0;
    case JV_JSON:
        return str_json(b, v->j, repr);
    case JV_MACRO:
        return put_s(b, "<macro>");
    default:
        return put_s(b, "<function>");
    }
}

static json_t *str_of(const jv *v)
{
    jbuf b = {0};
    if (jinja_str(&b, v, false) < 0) {
        free(b.p);
        return NULL;
    }
    json_t *s = json_stringn_nocheck(b.p ? b.p : "", b.len);
    free(b.p);
    return s;
}

static bool contains(const json_t *hay, const json_t *x)
{
    if (json_is_string(hay)) {
        if (!json_is_string(x))
            return false;
        const char *h = json_string_value(hay), *n = json_string_value(x);
        size_t hn = json_string_length(hay), nn = json_string_length(x);
        if (nn == 0)
            return true;
        for (size_t i = 0; i + nn <= hn; i++)
            if (memcmp(h + i, n, nn) == 0)
                return true;
        return false;
    }
    if (json_is_array(hay)) {
        for (size_t i = 0; i < json_array_size(hay); i++)
            if (jinja_equal(json_array_get(hay, i), x))
                return true;
        return false;
    }
    if (json_is_object(hay))
        return json_is_string(x) && json_object_get(hay, json_string_value(x)) != NULL;
    return false;
}

static const char *type_name(const jv *v)
{
    if (v->kind == JV_UNDEF)
        return "undefined";
    if (v->kind != JV_JSON)
        return "function";
    switch (json_typeof(v->j)) {
    case JSON_NULL:
        return "NoneType";
    case JSON_TRUE:
    case JSON_FALSE:
        return "bool";
    case JSON_INTEGER:
        return "int";
    case JSON_REAL:
        return "float";
    case JSON_STRING:
        return "str";
    case JSON_ARRAY:
        return "list";
    default:
        return "dict";
    }
}

static int arith(jctx *c, int line, int op, const json_t *a, const json_t *b, jv *out)
{
    static const char *const sym[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (is_int(a) && is_int(b) && op != JO_DIV) {
        json_int_t x = int_of(a), y = int_of(b), r;
        if ((op == JO_FLOORDIV || op == JO_MOD) && y == 0)
            return jinja_fail(c, line, "integer division or modulo by zero");
        bool ovf = false;
        switch (op) {
        case JO_ADD:
            ovf = __builtin_add_overflow(x, y, &r);
            break;
        case JO_SUB:
            ovf = __builtin_sub_overflow(x, y, &r);
            break;
        case JO_MUL:
            ovf = __builtin_mul_overflow(x, y, &r);
            break;
        case JO_FLOORDIV:
            if (x == INT64_MIN && y == -1) {
                ovf = true;
                break;
            }
            r = x / y - ((x % y != 0) && ((x < 0) != (y < 0)));
            break;
        case JO_MOD:
            if (y == -1) {
                r = 0;
                break;
            }
            r = x % y;
            if (r != 0 && ((r < 0) != (y < 0)))
                r += y;
            break;
        default: /* JO_POW */
            if (y < 0) {
                *out = jv_json(json_real(pow((double)x, (double)y)));
                return 0;
            }
            r = 1;
            for (json_int_t k = 0; k < y && !ovf; k++)
                ovf = __builtin_mul_overflow(r, x, &r);
            break;
        }
        if (ovf)
            return jinja_fail(c, line, "integer overflow in '%s'", sym[op]);
        *out = jv_json(json_integer(r));
        return 0;
    }
    double x = num_of(a), y = num_of(b), r;
    if ((op == JO_DIV || op == JO_FLOORDIV || op == JO_MOD) && y == 0)
        return jinja_fail(c, line, "division by zero");
    switch (op) {
    case JO_ADD:
        r = x + y;
        break;
    case JO_SUB:
        r = x - y;
        break;
    case JO_MUL:
        r = x * y;
        break;
    case JO_DIV:
        r = x / y;
        break;
    case JO_FLOORDIV:
        r = floor(x / y);
        break;
    case JO_MOD:
        r = fmod(x, y);
        if (r != 0 && ((r < 0) != (y < 0)))
            r += y;
        break;
    default:
        r = pow(x, y);
        break;
    }
    *out = jv_json(json_real(r));
    return 0;
}

/* s * n (a string or list repeated). */
static int repeat(jctx *c, int line, const json_t *s, json_int_t n, jv *out)
{
    if (n < 0)
        n = 0;
    if (json_is_string(s)) {
        size_t len = json_string_length(s);
        if (len && (uint64_t)n > ((uint64_t)64 << 20) / len)
            return jinja_fail(c, line, "string repeated too many times");
        if (jinja_step(c, line, (uint64_t)n * len / 64) < 0)
            return -1;
        jbuf b = {0};
        for (json_int_t k = 0; k < n; k++)
            if (jbuf_put(&b, json_string_value(s), len) < 0) {
                free(b.p);
                return jinja_fail(c, line, "out of memory");
            }
        json_t *r = json_stringn_nocheck(b.p ? b.p : "", b.len);
        free(b.p);
        if (!r)
            return jinja_fail(c, line, "out of memory");
        *out = jv_json(r);
        return 0;
    }
    size_t len = json_array_size(s);
    if (len && (uint64_t)n > ((uint64_t)1 << 20) / len)
        return jinja_fail(c, line, "list repeated too many times");
    json_t *r = json_array();
    for (json_int_t k = 0; r && k < n; k++)
        if (json_array_extend(r, (json_t *)s) < 0) {
            json_decref(r);
            r = NULL;
        }
    if (!r)
        return jinja_fail(c, line, "out of memory");
    *out = jv_json(r);
    return 0;
}

int jinja_binop(jctx *c, int line, int op, jv *a, jv *b, jv *out)
{
    if (op == JO_CONCAT) {
        json_t *x = str_of(a), *y = str_of(b);
        int rc = -1;
        if (x && y && json_string_length(x) + json_string_length(y) <= ((size_t)64 << 20)) {
            jbuf buf = {0};
            if (jbuf_put(&buf, json_string_value(x), json_string_length(x)) == 0 &&
                jbuf_put(&buf, json_string_value(y), json_string_length(y)) == 0) {
                json_t *r = json_stringn_nocheck(buf.p, buf.len);
                if (r) {
                    *out = jv_json(r);
                    rc = 0;
                }
            }
            free(buf.p);
        }
        json_decref(x);
        json_decref(y);
        return rc == 0 ? jinja_step(c, line, (uint64_t)json_string_length(out->j) / 64)
                       : jinja_fail(c, line, "out of memory");
    }
    if (op == JO_EQ || op == JO_NE) {
        bool eq = a->kind == JV_JSON && b->kind == JV_JSON
                      ? jinja_equal(a->j, b->j)
                      : a->kind == JV_UNDEF && b->kind == JV_UNDEF;
        *out = jv_json(json_boolean(op == JO_EQ ? eq : !eq));
        return 0;
    }
    if (op == JO_IN || op == JO_NOTIN) {
        bool in = a->kind == JV_JSON && b->kind == JV_JSON && contains(b->j, a->j);
        if (b->kind == JV_JSON && !json_is_string(b->j) && !json_is_array(b->j) &&
            !json_is_object(b->j))
            return jinja_fail(c, line, "argument of type '%s' is not iterable", type_name(b));
        *out = jv_json(json_boolean(op == JO_IN ? in : !in));
        return 0;
    }
    if (a->kind == JV_UNDEF || b->kind == JV_UNDEF) {
        const jv *u = a->kind == JV_UNDEF ? a : b;
        return jinja_fail(c, line, "'%s' is undefined", u->name ? u->name : "value");
    }
    if (a->kind != JV_JSON || b->kind != JV_JSON)
        return jinja_fail(c, line, "unsupported operand types");
    json_t *x = a->j, *y = b->j;
    if (op >= JO_LT && op <= JO_GE) {
        int r = order(x, y);
        if (r == 2)
            return jinja_fail(c, line, "cannot compare '%s' with '%s'", type_name(a), type_name(b));
        bool t = op == JO_LT ? r < 0 : op == JO_LE ? r <= 0 : op == JO_GT ? r > 0 : r >= 0;
        *out = jv_json(json_boolean(t));
        return 0;
    }
    if (is_num(x) && is_num(y))
        return arith(c, line, op, x, y, out);
    if (op == JO_ADD && json_is_string(x) && json_is_string(y))
        return jinja_binop(c, line, JO_CONCAT, a, b, out);
    if (op == JO_ADD && json_is_array(x) && json_is_array(y)) {
        json_t *r = json_copy(x);
        if (!r || json_array_extend(r, y) < 0) {
            json_decref(r);
            return jinja_fail(c, line, "out of memory");
        }
        *out = jv_json(r);
        return 0;
    }
    if (op == JO_MUL && (json_is_string(x) || json_is_array(x)) && is_int(y))
        return repeat(c, line, x, int_of(y), out);
    if (op == JO_MUL && (json_is_string(y) || json_is_array(y)) && is_int(x))
        return repeat(c, line, y, int_of(x), out);
    static const char *const sym[] = {"+", "-", "*", "/", "//", "%", "**"};
    return jinja_fail(c, line, "unsupported operand types for %s: '%s' and '%s'",
                      op <= JO_POW ? sym[op] : "?", type_name(a), type_name(b));
}

int jinja_iter(jctx *c, int line, jv *x, json_t **out)
{
    if (x->kind == JV_UNDEF) {
        *out = json_array();
        return *out ? 0 : jinja_fail(c, line, "out of memory");
    }
    if (x->kind != JV_JSON)
        return jinja_fail(c, line, "a function is not iterable");
    json_t *j = x->j, *r = NULL;
    if (json_is_array(j)) {
        r = json_copy(j);
    } else if (json_is_object(j)) {
        r = json_array();
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v)
        {
            (void)v;
            if (r && json_array_append_new(r, json_string_nocheck(k)) < 0) {
                json_decref(r);
                r = NULL;
            }
        }
    } else if (json_is_string(j)) {
        const char *s = json_string_value(j);
        size_t n = json_string_length(j);
        r = json_array();
        for (size_t i = 0; r && i < n;) {
            size_t e = jinja_u8off(s + i, n - i, 1);
            if (json_array_append_new(r, json_stringn_nocheck(s + i, e)) < 0) {
                json_decref(r);
                r = NULL;
            }
            i += e;
        }
    } else {
        return jinja_fail(c, line, "'%s' object is not iterable", type_name(x));
    }
    if (!r)
        return jinja_fail(c, line, "out of memory");
    if (jinja_step(c, line, json_array_size(r)) < 0) {
        json_decref(r);
        return -1;
    }
    *out = r;
    return 0;
}
