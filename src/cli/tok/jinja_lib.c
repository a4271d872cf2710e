/*
 * jinja_lib.c - the built-ins chat templates call: jinja2's filters and tests, Python's
 * str and dict methods, and the globals Hugging Face adds (raise_exception, strftime_now)
 * beside jinja2's (namespace, range, dict).
 *
 *   filters  abs capitalize count d default dictsort e escape first float indent int items
 *            join last length list lower map max min reject rejectattr replace reverse
 *            round safe select selectattr sort string sum title tojson trim unique upper
 *   tests    boolean callable defined divisibleby eq equalto escaped even false float ge
 *            gt in integer iterable le lower lt mapping ne none number odd sameas
 *            sequence string true undefined upper (and the symbols == != < <= > >=)
 *   str      capitalize count endswith find isalnum isalpha isdigit islower isspace
 *            isupper join lower lstrip replace rfind rsplit rstrip split splitlines
 *            startswith strip title upper
 *   dict     get items keys values
 *
 * tojson is transformers' version: Python's json.dumps(x, ensure_ascii=False,
 * indent=indent) through pyjson.h (sort_keys refused). Case mappings (upper, lower, title,
 * capitalize) change ASCII letters only; Python would map every cased letter (docs/cli.md
 * lists this). Whitespace for strip/split is Python's str.isspace set.
 */
#define _DEFAULT_SOURCE /* timegm */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "jinja_int.h"
#include "pyjson.h"

typedef struct call {
    jctx *c;
    int line;
    const char *name;
    jv *pos;
    size_t n;
    const char **kw;
    jv *kwv;
    size_t n_kw;
} call;

/* Argument i (positional) or keyword `name`; NULL when absent. */
static jv *arg(call *a, size_t i, const char *name)
{
    if (i < a->n)
        return &a->pos[i];
    for (size_t k = 0; name && k < a->n_kw; k++)
        if (strcmp(a->kw[k], name) == 0)
            return &a->kwv[k];
    return NULL;
}

static bool is_str(const jv *v)
{
    return v && v->kind == JV_JSON && json_is_string(v->j);
}

static bool is_arr(const jv *v)
{
    return v && v->kind == JV_JSON && json_is_array(v->j);
}

static bool is_obj(const jv *v)
{
    return v && v->kind == JV_JSON && json_is_object(v->j);
}

static bool is_intv(const jv *v)
{
    return v && v->kind == JV_JSON && (json_is_integer(v->j) || json_is_boolean(v->j));
}

static json_int_t ival(const jv *v)
{
    return json_is_integer(v->j) ? json_integer_value(v->j) : json_is_true(v->j);
}

static int oom(call *a)
{
    return jinja_fail(a->c, a->line, "out of memory");
}

static int give(call *a, json_t *j, jv *out)
{
    if (!j)
        return oom(a);
    *out = jv_json(j);
    return 0;
}

static int bad(call *a, const char *what)
{
    return jinja_fail(a->c, a->line, "%s: %s", a->name, what);
}

/* ---- UTF-8 and Python's whitespace ---- */

static uint32_t cp_at(const char *s, size_t n, size_t i, size_t *w)
{
    unsigned char c = (unsigned char)s[i];
    size_t len = jinja_u8off(s + i, n - i, 1);
    *w = len;
    if (len == 1)
        return c;
    uint32_t cp = c & (0x7F >> len);
    for (size_t k = 1; k < len; k++)
        cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
    return cp;
}

static bool py_space(uint32_t cp)
{
    return (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Is cp in the set of code points of chars (NULL: Python whitespace)? */
static bool in_set(uint32_t cp, const json_t *chars)
{
    if (!chars)
        return py_space(cp);
    const char *s = json_string_value(chars);
    size_t n = json_string_length(chars), w;
    for (size_t i = 0; i < n; i += w)
        if (cp_at(s, n, i, &w) == cp)
            return true;
    return false;
}

static json_t *strip(const json_t *str, const json_t *chars, bool left, bool right)
{
    const char *s = json_string_value(str);
    size_t n = json_string_length(str), a = 0, b = n, w;
    while (left && a < b && in_set(cp_at(s, n, a, &w), chars))
        a += w;
    while (right && b > a) {
        size_t k = b - 1;
        while (k > a && ((unsigned char)s[k] >> 6) == 2)
            k--;
        if (!in_set(cp_at(s, n, k, &w), chars) || k + w != b)
            break;
        b = k;
    }
    return json_stringn_nocheck(s + a, b - a);
}

/* ASCII case mappings (see the file comment). mode: 'u' upper, 'l' lower, 't' title,
 * 'c' capitalize. */
static json_t *recase(const json_t *str, char mode)
{
    size_t n = json_string_length(str);
    char *d = malloc(n + 1);
    if (!d)
        return NULL;
    memcpy(d, json_string_value(str), n);
    bool prev_cased = false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)d[i];
        bool alpha = isalpha(c) && c < 0x80;
        if (mode == 'u' || (mode == 't' && !prev_cased) || (mode == 'c' && i == 0))
            d[i] = (char)(c < 0x80 ? toupper(c) : c);
        else if (mode != 'u')
            d[i] = (char)(c < 0x80 ? tolower(c) : c);
        prev_cased = alpha || c >= 0x80;
    }
    json_t *r = json_stringn_nocheck(d, n);
    free(d);
    return r;
}

static json_t *replace(const json_t *str, const json_t *old, const json_t *new, json_int_t count)
{
    const char *s = json_string_value(str), *o = json_string_value(old);
    size_t n = json_string_length(str), on = json_string_length(old);
    jbuf b = {0};
    size_t i = 0;
    int rc = 0;
    json_int_t done = 0;
    if (on == 0) { /* Python inserts new between every character */
        while (rc == 0 && (count < 0 || done < count)) {
            rc = jbuf_put(&b, json_string_value(new), json_string_length(new));
            done++;
            if (i >= n)
                break;
            size_t w = jinja_u8off(s + i, n - i, 1);
            rc = rc ? rc : jbuf_put(&b, s + i, w);
            i += w;
        }
    } else {
        while (rc == 0 && i + on <= n && (count < 0 || done < count)) {
            const char *p = NULL;
            for (size_t k = i; k + on <= n; k++)
                if (memcmp(s + k, o, on) == 0) {
                    p = s + k;
                    break;
                }
            if (!p)
                break;
            rc = jbuf_put(&b, s + i, (size_t)(p - s) - i);
            rc = rc ? rc : jbuf_put(&b, json_string_value(new), json_string_length(new));
            i = (size_t)(p - s) + on;
            done++;
        }
    }
    if (rc == 0)
        rc = jbuf_put(&b, s + i, n - i);
    json_t *r = rc == 0 ? json_stringn_nocheck(b.p ? b.p : "", b.len) : NULL;
    free(b.p);
    return r;
}

/* str.split / rsplit (sep NULL: runs of whitespace). */
static json_t *split(const json_t *str, const json_t *sep, json_int_t maxsplit, bool from_right)
{
    const char *s = json_string_value(str);
    size_t n = json_string_length(str);
    json_t *r = json_array();
    if (!r)
        return NULL;
    json_int_t done = 0;
    if (!sep) { /* runs of whitespace: the word spans first */
        size_t i = 0, w, n_words = 0, cap = 0;
        size_t *span = NULL; /* start, end pairs */
        while (i < n) {
            while (i < n && py_space(cp_at(s, n, i, &w)))
                i += w;
            if (i >= n)
                break;
            size_t st = i;
            while (i < n && !py_space(cp_at(s, n, i, &w)))
                i += w;
            if (!cli_grow((void **)&span, &cap, 2 * n_words + 2, sizeof(size_t))) {
                free(span);
                json_decref(r);
                return NULL;
            }
            span[2 * n_words] = st;
            span[2 * n_words + 1] = i;
            n_words++;
        }
        size_t lo = 0, hi = n_words; /* words taken one by one */
        if (maxsplit >= 0 && (size_t)maxsplit + 1 < n_words) {
            if (from_right)
                lo = n_words - (size_t)maxsplit;
            else
                hi = (size_t)maxsplit;
        }
        if (lo > 0) /* rsplit: the head keeps its leading whitespace */
            json_array_append_new(r, json_stringn_nocheck(s, span[2 * lo - 1]));
        for (size_t k = lo; k < hi; k++)
            json_array_append_new(
                r, json_stringn_nocheck(s + span[2 * k], span[2 * k + 1] - span[2 * k]));
        if (hi < n_words) /* split: the tail keeps its trailing whitespace */
            json_array_append_new(r, json_stringn_nocheck(s + span[2 * hi], n - span[2 * hi]));
        free(span);
        return r;
    }
    const char *p = json_string_value(sep);
    size_t pn = json_string_length(sep);
    if (!from_right) {
        size_t i = 0;
        for (size_t k = 0; k + pn <= n && (maxsplit < 0 || done < maxsplit);) {
            if (memcmp(s + k, p, pn) == 0) {
                json_array_append_new(r, json_stringn_nocheck(s + i, k - i));
                k += pn;
                i = k;
                done++;
            } else {
                k++;
            }
        }
        json_array_append_new(r, json_stringn_nocheck(s + i, n - i));
        return r;
    }
    size_t e = n;
    json_t *rev = json_array();
    for (size_t k = n; k >= pn && (maxsplit < 0 || done < maxsplit);) {
        if (memcmp(s + k - pn, p, pn) == 0) {
            json_array_append_new(rev, json_stringn_nocheck(s + k, e - k));
            k -= pn;
            e = k;
            done++;
        } else {
            k--;
        }
    }
    json_array_append_new(r, json_stringn_nocheck(s, e));
    for (size_t k = json_array_size(rev); k-- > 0;)
        json_array_append(r, json_array_get(rev, k));
    json_decref(rev);
    return r;
}

static bool has_affix(const json_t *s, const jv *x, bool end)
{
    if (is_arr(x)) { /* a tuple of affixes */
        for (size_t k = 0; k < json_array_size(x->j); k++) {
            jv e = {JV_JSON, false, json_array_get(x->j, k), NULL, NULL};
            if (is_str(&e) && has_affix(s, &e, end))
                return true;
        }
        return false;
    }
    size_t n = json_string_length(s), m = json_string_length(x->j);
    if (m > n)
        return false;
    return memcmp(json_string_value(s) + (end ? n - m : 0), json_string_value(x->j), m) == 0;
}

static json_t *join(call *a, const json_t *items, const char *sep, size_t sep_n, const char *attr)
{
    jbuf b = {0};
    int rc = 0;
    for (size_t k = 0; rc == 0 && k < json_array_size(items); k++) {
        json_t *it = json_array_get(items, k);
        if (attr)
            it = json_is_object(it) ? json_object_get(it, attr) : NULL;
        jv v = it ? (jv){JV_JSON, false, it, NULL, NULL} : jv_undef(NULL);
        if (k)
            rc = jbuf_put(&b, sep, sep_n);
        if (rc == 0)
            rc = jinja_str(&b, &v, false);
    }
    json_t *r = rc == 0 ? json_stringn_nocheck(b.p ? b.p : "", b.len) : NULL;
    free(b.p);
    if (!r)
        oom(a);
    return r;
}

/* ---- str and dict methods ---- */

static const char *const str_methods[] = {
    "capitalize", "count",   "endswith",   "find",       "isalnum", "isalpha", "isdigit", "islower",
    "isspace",    "isupper", "join",       "lower",      "lstrip",  "replace", "rfind",   "rsplit",
    "rstrip",     "split",   "splitlines", "startswith", "strip",   "title",   "upper",   NULL};
static const char *const dict_methods[] = {"get", "items", "keys", "values", NULL};

static bool in_list(const char *const *l, const char *name)
{
    for (; *l; l++)
        if (strcmp(*l, name) == 0)
            return true;
    return false;
}

bool jinja_has_method(const jv *self, const char *name)
{
    if (self->kind != JV_JSON || self->ns)
        return false;
    if (json_is_string(self->j))
        return in_list(str_methods, name);
    if (json_is_object(self->j))
        return in_list(dict_methods, name);
    return false;
}

static json_t *dict_items(const json_t *o, int what) /* 0 items, 1 keys, 2 values */
{
    json_t *r = json_array();
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v)
    {
        json_t *e = what == 1   ? json_string_nocheck(k)
                    : what == 2 ? json_incref(v)
                                : json_pack("[sO]", k, v);
        if (!r || !e || json_array_append_new(r, e) < 0) {
            json_decref(r);
            return NULL;
        }
    }
    return r;
}

static int str_pred(call *a, const json_t *s, jv *out)
{
    const char *p = json_string_value(s);
    size_t n = json_string_length(s), w;
    bool any = false, ok = n > 0, cased = false;
    for (size_t i = 0; i < n; i += w) {
        uint32_t cp = cp_at(p, n, i, &w);
        any = true;
        if (strcmp(a->name, "isspace") == 0)
            ok = ok && py_space(cp);
        else if (strcmp(a->name, "isdigit") == 0)
            ok = ok && cp < 0x80 && isdigit((int)cp);
        else if (strcmp(a->name, "isalpha") == 0)
            ok = ok && cp < 0x80 && isalpha((int)cp);
        else if (strcmp(a->name, "isalnum") == 0)
            ok = ok && cp < 0x80 && isalnum((int)cp);
        else if (strcmp(a->name, "islower") == 0) {
            ok = ok && !(cp < 0x80 && isupper((int)cp));
            cased = cased || (cp < 0x80 && islower((int)cp));
        } else {
            ok = ok && !(cp < 0x80 && islower((int)cp));
            cased = cased || (cp < 0x80 && isupper((int)cp));
        }
    }
    if (a->name[2] == 'l' || a->name[2] == 'u') /* islower, isupper need a cased letter */
        ok = ok && cased;
    return give(a, json_boolean(any && ok), out);
}

static int str_method(call *a, const json_t *s, jv *out)
{
    const char *m = a->name;
    jv *x = arg(a, 0, NULL), *y = arg(a, 1, NULL);
    if (jinja_step(a->c, a->line, json_string_length(s) / 64 + 1) < 0)
        return -1;
    if (strcmp(m, "startswith") == 0 || strcmp(m, "endswith") == 0) {
        if (!is_str(x) && !is_arr(x))
            return bad(a, "expects a string or a tuple of strings");
        return give(a, json_boolean(has_affix(s, x, m[0] == 'e')), out);
    }
    if (strcmp(m, "strip") == 0 || strcmp(m, "lstrip") == 0 || strcmp(m, "rstrip") == 0) {
        jv *ch = arg(a, 0, "chars");
        if (ch && !is_str(ch) && !(ch->kind == JV_JSON && json_is_null(ch->j)))
            return bad(a, "expects a string of characters");
        return give(a, strip(s, is_str(ch) ? ch->j : NULL, m[0] != 'r', m[0] != 'l'), out);
    }
    if (strcmp(m, "split") == 0 || strcmp(m, "rsplit") == 0) {
        jv *sep = arg(a, 0, "sep"), *mx = arg(a, 1, "maxsplit");
        if (sep && !is_str(sep) && !(sep->kind == JV_JSON && json_is_null(sep->j)))
            return bad(a, "expects a string separator");
        if (is_str(sep) && json_string_length(sep->j) == 0)
            return bad(a, "empty separator");
        if (mx && !is_intv(mx))
            return bad(a, "maxsplit must be an integer");
        json_t *r = split(s, is_str(sep) ? sep->j : NULL, mx ? ival(mx) : -1, m[0] == 'r');
        return give(a, r, out);
    }
    if (strcmp(m, "splitlines") == 0) {
        json_t *nl = json_string("\n"), *r = split(s, nl, -1, false);
        json_decref(nl);
        if (r && json_array_size(r) > 0 &&
            json_string_length(json_array_get(r, json_array_size(r) - 1)) == 0)
            json_array_remove(r, json_array_size(r) - 1);
        return give(a, r, out);
    }
    if (strcmp(m, "upper") == 0 || strcmp(m, "lower") == 0 || strcmp(m, "title") == 0 ||
        strcmp(m, "capitalize") == 0)
        return give(a,
                    recase(s, m[0] == 'u'   ? 'u'
                              : m[0] == 'l' ? 'l'
                              : m[0] == 't' ? 't'
                                            : 'c'),
                    out);
    if (strcmp(m, "replace") == 0) {
        jv *cnt = arg(a, 2, "count");
        if (!is_str(x) || !is_str(y) || (cnt && !is_intv(cnt)))
            return bad(a, "expects (old, new[, count])");
        return give(a, replace(s, x->j, y->j, cnt ? ival(cnt) : -1), out);
    }
    if (strcmp(m, "find") == 0 || strcmp(m, "rfind") == 0 || strcmp(m, "count") == 0) {
        if (!is_str(x))
            return bad(a, "expects a string");
        const char *h = json_string_value(s), *nd = json_string_value(x->j);
        size_t hn = json_string_length(s), nn = json_string_length(x->j);
        json_int_t found = -1, count = 0;
        for (size_t i = 0; i + nn <= hn; i++)
            if (memcmp(h + i, nd, nn) == 0) {
                if (found < 0 || m[0] == 'r')
                    found = (json_int_t)jinja_u8len(h, i);
                count++;
                if (m[0] == 'c' && nn > 0)
                    i += nn - 1;
            }
        if (m[0] == 'c' && nn == 0)
            count = (json_int_t)jinja_u8len(h, hn) + 1;
        return give(a, json_integer(m[0] == 'c' ? count : found), out);
    }
    if (strcmp(m, "join") == 0) {
        json_t *items;
        if (!x || jinja_iter(a->c, a->line, x, &items) < 0)
            return x ? -1 : bad(a, "expects an iterable");
        json_t *r = join(a, items, json_string_value(s), json_string_length(s), NULL);
        json_decref(items);
        return r ? give(a, r, out) : -1;
    }
    return str_pred(a, s, out);
}

int jinja_method(jctx *c, int line, jv *self, const char *name, jv *pos, size_t n, const char **kw,
                 jv *kwv, size_t n_kw, jv *out)
{
    call a = {c, line, name, pos, n, kw, kwv, n_kw};
    if (json_is_string(self->j))
        return str_method(&a, self->j, out);
    if (strcmp(name, "get") == 0) {
        jv *k = arg(&a, 0, "key"), *d = arg(&a, 1, "default");
        json_t *v = is_str(k) ? json_object_get(self->j, json_string_value(k->j)) : NULL;
        if (v)
            return give(&a, json_incref(v), out);
        *out = d ? jv_copy(*d) : jv_json(json_null());
        return 0;
    }
    int what = strcmp(name, "items") == 0 ? 0 : strcmp(name, "keys") == 0 ? 1 : 2;
    return give(&a, dict_items(self->j, what), out);
}

/* ---- tests ---- */

int jinja_test(jctx *c, int line, const char *name, jv *x, jv *pos, size_t n, bool *out)
{
    call a = {c, line, name, pos, n, NULL, NULL, 0};
    json_t *j = x->kind == JV_JSON ? x->j : NULL;
    jv *y = arg(&a, 0, NULL);
    if (strcmp(name, "defined") == 0)
        *out = x->kind != JV_UNDEF;
    else if (strcmp(name, "undefined") == 0)
        *out = x->kind == JV_UNDEF;
    else if (strcmp(name, "none") == 0)
        *out = j && json_is_null(j);
    else if (strcmp(name, "boolean") == 0)
        *out = j && json_is_boolean(j);
    else if (strcmp(name, "true") == 0)
        *out = j && json_is_true(j);
    else if (strcmp(name, "false") == 0)
        *out = j && json_is_false(j);
    else if (strcmp(name, "integer") == 0)
        *out = j && json_is_integer(j);
    else if (strcmp(name, "float") == 0)
        *out = j && json_is_real(j);
    else if (strcmp(name, "number") == 0)
        *out = j && (json_is_number(j) || json_is_boolean(j));
    else if (strcmp(name, "string") == 0)
        *out = j && json_is_string(j);
    else if (strcmp(name, "mapping") == 0)
        *out = j && json_is_object(j);
    else if (strcmp(name, "iterable") == 0 || strcmp(name, "sequence") == 0)
        *out = j && (json_is_string(j) || json_is_array(j) || json_is_object(j));
    else if (strcmp(name, "callable") == 0)
        *out = x->kind == JV_MACRO || x->kind == JV_FUNC || x->kind == JV_METHOD;
    else if (strcmp(name, "escaped") == 0)
        *out = false;
    else if (strcmp(name, "lower") == 0 || strcmp(name, "upper") == 0) {
        if (!j || !json_is_string(j))
            return jinja_fail(c, line, "test '%s' needs a string", name);
        jv r;
        call m = {c, line, name[0] == 'l' ? "islower" : "isupper", NULL, 0, NULL, NULL, 0};
        if (str_pred(&m, j, &r) < 0)
            return -1;
        *out = json_is_true(r.j);
        jv_drop(&r);
    } else if (strcmp(name, "odd") == 0 || strcmp(name, "even") == 0 ||
               strcmp(name, "divisibleby") == 0) {
        if (!is_intv(x))
            return jinja_fail(c, line, "test '%s' needs an integer", name);
        json_int_t d = name[0] == 'd' ? (is_intv(y) ? ival(y) : 0) : 2;
        if (d == 0)
            return jinja_fail(c, line, "test 'divisibleby' needs a non-zero integer");
        json_int_t r = ival(x) % d;
        *out = name[0] == 'o' ? r != 0 : r == 0;
    } else {
        static const char *const sym[][3] = {{"eq", "equalto", "=="},    {"ne", "!=", NULL},
                                             {"lt", "<", "lessthan"},    {"le", "<=", NULL},
                                             {"gt", ">", "greaterthan"}, {"ge", ">=", NULL},
                                             {"in", NULL, NULL},         {"sameas", NULL, NULL}};
        static const int ops[] = {JO_EQ, JO_NE, JO_LT, JO_LE, JO_GT, JO_GE, JO_IN, JO_EQ};
        int op = -1;
        for (int k = 0; k < 8 && op < 0; k++)
            for (int s = 0; s < 3; s++)
                if (sym[k][s] && strcmp(name, sym[k][s]) == 0)
                    op = k;
        if (op < 0)
            return jinja_fail(c, line, "unknown test '%s'", name);
        if (!y)
            return jinja_fail(c, line, "test '%s' needs an argument", name);
        if (op == 7) { /* sameas: identity of singletons and the same object */
            *out = x->kind == JV_JSON && y->kind == JV_JSON &&
                   (x->j == y->j || (json_is_null(x->j) && json_is_null(y->j)) ||
                    (json_is_true(x->j) && json_is_true(y->j)) ||
                    (json_is_false(x->j) && json_is_false(y->j)));
            return 0;
        }
        jv r;
        if (jinja_binop(c, line, ops[op], x, y, &r) < 0)
            return -1;
        *out = json_is_true(r.j);
        jv_drop(&r);
    }
    return 0;
}

/* ---- filters ---- */

/* select/reject/selectattr/rejectattr/map over items: one item's value. */
static int item_attr(call *a, json_t *it, const char *attr, jv *out)
{
    if (!attr) {
        *out = jv_json(json_incref(it));
        return 0;
    }
    json_t *v = json_is_object(it) ? json_object_get(it, attr) : NULL;
    *out = v ? jv_json(json_incref(v)) : jv_undef(attr);
    (void)a;
    return 0;
}

/* The items of x and an empty result list, for the filters that map or select. */
static int items_and_result(call *a, jv *x, json_t **items, json_t **r)
{
    *r = json_array();
    if (!*r)
        return oom(a);
    if (jinja_iter(a->c, a->line, x, items) < 0) {
        json_decref(*r);
        return -1;
    }
    return 0;
}

/* Hand over r as the result, or drop it after a failure. */
static int result_of(json_t *items, json_t *r, int rc, jv *out)
{
    json_decref(items);
    if (rc < 0) {
        json_decref(r);
        return -1;
    }
    *out = jv_json(r);
    return 0;
}

static int select_filter(call *a, jv *x, jv *out)
{
    bool attr = strstr(a->name, "attr") != NULL, reject = a->name[0] == 'r';
    size_t first = attr ? 1 : 0;
    jv *an = attr ? arg(a, 0, NULL) : NULL, *tn = arg(a, first, NULL);
    if (attr && !is_str(an))
        return bad(a, "expects an attribute name");
    if (tn && !is_str(tn))
        return bad(a, "expects a test name");
    json_t *items, *r;
    if (items_and_result(a, x, &items, &r) < 0)
        return -1;
    int rc = 0;
    for (size_t k = 0; rc == 0 && k < json_array_size(items); k++) {
        json_t *it = json_array_get(items, k);
        jv v;
        bool ok;
        item_attr(a, it, an ? json_string_value(an->j) : NULL, &v);
        if (tn)
            rc = jinja_test(a->c, a->line, json_string_value(tn->j), &v, a->pos + first + 1,
                            a->n > first + 1 ? a->n - first - 1 : 0, &ok);
        else
            ok = jinja_truthy(&v);
        jv_drop(&v);
        if (rc == 0 && ok != reject && json_array_append(r, it) < 0)
            rc = oom(a);
    }
    return result_of(items, r, rc, out);
}

static int map_filter(call *a, jv *x, jv *out)
{
    jv *attr = arg(a, 99, "attribute"), *fname = arg(a, 0, NULL), *dflt = arg(a, 99, "default");
    if (!attr && !is_str(fname))
        return bad(a, "expects a filter name or attribute=");
    if (attr && !is_str(attr))
        return bad(a, "attribute must be a string");
    json_t *items, *r;
    if (items_and_result(a, x, &items, &r) < 0)
        return -1;
    int rc = 0;
    for (size_t k = 0; rc == 0 && k < json_array_size(items); k++) {
        jv v, res;
        item_attr(a, json_array_get(items, k), attr ? json_string_value(attr->j) : NULL, &v);
        if (attr) {
            res = v.kind == JV_UNDEF && dflt ? jv_copy(*dflt) : v;
            if (res.kind == JV_UNDEF)
                rc = bad(a, "an item has no such attribute");
        } else {
            rc = jinja_filter(a->c, a->line, json_string_value(fname->j), &v, a->pos + 1, a->n - 1,
                              NULL, NULL, 0, &res);
            jv_drop(&v);
        }
        if (rc == 0) {
            if (res.kind != JV_JSON)
                rc = bad(a, "a result cannot be stored in a list");
            else if (json_array_append(r, res.j) < 0)
                rc = oom(a);
            jv_drop(&res);
        }
    }
    return result_of(items, r, rc, out);
}

static int cmp_items(const void *p, const void *q)
{
    const json_t *a = *(json_t *const *)p, *b = *(json_t *const *)q;
    jv x = {JV_JSON, false, (json_t *)a, NULL, NULL}, y = {JV_JSON, false, (json_t *)b, NULL, NULL};
    (void)x;
    (void)y;
    if (json_is_string(a) && json_is_string(b))
        return strcmp(json_string_value(a), json_string_value(b));
    double u = json_is_number(a) ? json_number_value(a) : 0,
           v = json_is_number(b) ? json_number_value(b) : 0;
    return (u > v) - (u < v);
}

static int sort_filter(call *a, jv *x, jv *out, bool dict)
{
    json_t *items;
    if (dict) {
        if (!is_obj(x))
            return bad(a, "expects a dict");
        items = dict_items(x->j, 0);
        if (!items)
            return oom(a);
    } else if (jinja_iter(a->c, a->line, x, &items) < 0) {
        return -1;
    }
    jv *rev = arg(a, 0, "reverse"), *attr = arg(a, 99, "attribute");
    size_t n = json_array_size(items);
    json_t **v = malloc((n ? n : 1) * 2 * sizeof(json_t *));
    if (!v) {
        json_decref(items);
        return oom(a);
    }
    /* pairs (key, item), stable by index */
    for (size_t k = 0; k < n; k++) {
        json_t *it = json_array_get(items, k), *key = it;
        if (dict)
            key = json_array_get(it, 0);
        else if (attr && is_str(attr) && json_is_object(it))
            key = json_object_get(it, json_string_value(attr->j));
        if (!key || !(json_is_string(key) || json_is_number(key))) {
            free(v);
            json_decref(items);
            return bad(a, "can only sort strings or numbers");
        }
        v[2 * k] = key;
        v[2 * k + 1] = it;
    }
    /* insertion sort keeps it stable; lists in templates are short */
    if (jinja_step(a->c, a->line, (uint64_t)n * n / 16) < 0) {
        free(v);
        json_decref(items);
        return -1;
    }
    bool desc = rev && jinja_truthy(rev);
    for (size_t i = 1; i < n; i++)
        for (size_t k = i; k > 0; k--) {
            int cmp = cmp_items(&v[2 * (k - 1)], &v[2 * k]);
            if (desc ? cmp >= 0 : cmp <= 0)
                break;
            json_t *t0 = v[2 * k], *t1 = v[2 * k + 1];
            v[2 * k] = v[2 * (k - 1)];
            v[2 * k + 1] = v[2 * (k - 1) + 1];
            v[2 * (k - 1)] = t0;
            v[2 * (k - 1) + 1] = t1;
        }
    json_t *r = json_array();
    for (size_t k = 0; r && k < n; k++)
        if (json_array_append(r, v[2 * k + 1]) < 0) {
            json_decref(r);
            r = NULL;
        }
    free(v);
    json_decref(items);
    return give(a, r, out);
}

static int dump_write(void *ctx, const char *s, size_t n)
{
    return jbuf_put(ctx, s, n);
}

static int tojson_filter(call *a, jv *x, jv *out)
{
    jv *ind = arg(a, 0, "indent"), *sk = arg(a, 99, "sort_keys");
    if (x->kind != JV_JSON)
        return bad(a, x->kind == JV_UNDEF ? "value is undefined" : "cannot serialise a function");
    if (sk && jinja_truthy(sk))
        return bad(a, "sort_keys is not supported");
    for (size_t k = 0; k < a->n_kw; k++)
        if (strcmp(a->kw[k], "indent") != 0 && strcmp(a->kw[k], "sort_keys") != 0 &&
            strcmp(a->kw[k], "ensure_ascii") != 0)
            return jinja_fail(a->c, a->line, "tojson: unsupported argument '%s'", a->kw[k]);
    int indent = -1;
    if (ind && !(ind->kind == JV_JSON && json_is_null(ind->j))) {
        if (!is_intv(ind) || ival(ind) < 0 || ival(ind) > 64)
            return bad(a, "indent must be an integer 0..64");
        indent = (int)ival(ind);
    }
    jbuf b = {0};
    if (pyjson_dump(x->j, indent, dump_write, &b) != 0) {
        free(b.p);
        return oom(a);
    }
    json_t *r = json_stringn_nocheck(b.p ? b.p : "", b.len);
    if (jinja_step(a->c, a->line, b.len / 64) < 0) {
        free(b.p);
        json_decref(r);
        return -1;
    }
    free(b.p);
    return give(a, r, out);
}

static int indent_filter(call *a, jv *x, jv *out)
{
    jv *w = arg(a, 0, "width"), *first = arg(a, 1, "first"), *blank = arg(a, 2, "blank");
    json_t *s = x->kind == JV_UNDEF ? json_string("") : NULL;
    if (!s) {
        jbuf t = {0};
        if (jinja_str(&t, x, false) < 0)
            return oom(a);
        s = json_stringn_nocheck(t.p ? t.p : "", t.len);
        free(t.p);
    }
    jbuf pad = {0};
    if (w && is_str(w))
        jbuf_put(&pad, json_string_value(w->j), json_string_length(w->j));
    else
        for (json_int_t k = 0; k < (w && is_intv(w) ? ival(w) : 4) && k < 256; k++)
            jbuf_put(&pad, " ", 1);
    const char *p = json_string_value(s);
    size_t n = json_string_length(s);
    jbuf b = {0};
    bool at_start = true;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || p[i] == '\n') {
            size_t st = i;
            while (st > 0 && p[st - 1] != '\n')
                st--;
            bool empty = st == i;
            bool pad_it = (st > 0 || (first && jinja_truthy(first))) &&
                          (!empty || (blank && jinja_truthy(blank)));
            if (pad_it)
                jbuf_put(&b, pad.p ? pad.p : "", pad.len);
            jbuf_put(&b, p + st, i - st);
            if (i < n)
                jbuf_put(&b, "\n", 1);
            at_start = false;
        }
    }
    (void)at_start;
    json_t *r = json_stringn_nocheck(b.p ? b.p : "", b.len);
    free(b.p);
    free(pad.p);
    json_decref(s);
    return give(a, r, out);
}

int jinja_filter(jctx *c, int line, const char *name, jv *x, jv *pos, size_t n, const char **kw,
                 jv *kwv, size_t n_kw, jv *out)
{
    call a = {c, line, name, pos, n, kw, kwv, n_kw};
    json_t *j = x->kind == JV_JSON ? x->j : NULL;
    if (strcmp(name, "safe") == 0) {
        *out = jv_copy(*x);
        return 0;
    }
    if (strcmp(name, "default") == 0 || strcmp(name, "d") == 0) {
        jv *d = arg(&a, 0, "default_value"), *b = arg(&a, 1, "boolean");
        bool use = x->kind == JV_UNDEF || (b && jinja_truthy(b) && !jinja_truthy(x));
        *out = use ? (d ? jv_copy(*d) : jv_json(json_string(""))) : jv_copy(*x);
        return 0;
    }
    if (strcmp(name, "length") == 0 || strcmp(name, "count") == 0) {
        size_t len = 0;
        if (j && json_is_string(j))
            len = jinja_u8len(json_string_value(j), json_string_length(j));
        else if (j && json_is_array(j))
            len = json_array_size(j);
        else if (j && json_is_object(j))
            len = json_object_size(j);
        else if (x->kind != JV_UNDEF)
            return bad(&a, "value has no length");
        return give(&a, json_integer((json_int_t)len), out);
    }
    if (strcmp(name, "tojson") == 0)
        return tojson_filter(&a, x, out);
    if (strcmp(name, "string") == 0) {
        jbuf b = {0};
        if (jinja_str(&b, x, false) < 0)
            return free(b.p), oom(&a);
        json_t *r = json_stringn_nocheck(b.p ? b.p : "", b.len);
        free(b.p);
        return give(&a, r, out);
    }
    if (strcmp(name, "items") == 0) {
        if (x->kind == JV_UNDEF)
            return give(&a, json_array(), out);
        if (!j || !json_is_object(j))
            return bad(&a, "expects a dict");
        return give(&a, dict_items(j, 0), out);
    }
    if (strcmp(name, "list") == 0) {
        json_t *r;
        if (jinja_iter(c, line, x, &r) < 0)
            return -1;
        *out = jv_json(r);
        return 0;
    }
    if (strcmp(name, "first") == 0 || strcmp(name, "last") == 0) {
        json_t *items;
        if (jinja_iter(c, line, x, &items) < 0)
            return -1;
        size_t len = json_array_size(items);
        *out = len ? jv_json(json_incref(json_array_get(items, name[0] == 'f' ? 0 : len - 1)))
                   : jv_undef(name);
        json_decref(items);
        return 0;
    }
    if (strcmp(name, "join") == 0) {
        jv *sep = arg(&a, 0, "d"), *attr = arg(&a, 1, "attribute");
        json_t *items;
        if (sep && !is_str(sep))
            return bad(&a, "separator must be a string");
        if (jinja_iter(c, line, x, &items) < 0)
            return -1;
        json_t *r = join(&a, items, sep ? json_string_value(sep->j) : "",
                         sep ? json_string_length(sep->j) : 0,
                         is_str(attr) ? json_string_value(attr->j) : NULL);
        json_decref(items);
        return r ? give(&a, r, out) : -1;
    }
    if (strcmp(name, "select") == 0 || strcmp(name, "reject") == 0 ||
        strcmp(name, "selectattr") == 0 || strcmp(name, "rejectattr") == 0)
        return select_filter(&a, x, out);
    if (strcmp(name, "map") == 0)
        return map_filter(&a, x, out);
    if (strcmp(name, "sort") == 0 || strcmp(name, "dictsort") == 0)
        return sort_filter(&a, x, out, name[0] == 'd');
    if (strcmp(name, "indent") == 0)
        return indent_filter(&a, x, out);
    if (strcmp(name, "reverse") == 0 || strcmp(name, "unique") == 0) {
        json_t *items, *r = json_array();
        if (!r)
            return oom(&a);
        if (jinja_iter(c, line, x, &items) < 0)
            return json_decref(r), -1;
        size_t len = json_array_size(items);
        for (size_t k = 0; k < len; k++) {
            json_t *it = json_array_get(items, name[0] == 'r' ? len - 1 - k : k);
            bool dup = false;
            for (size_t i = 0; name[0] == 'u' && i < json_array_size(r) && !dup; i++)
                dup = jinja_equal(json_array_get(r, i), it);
            if (!dup)
                json_array_append(r, it);
        }
        json_decref(items);
        if (name[0] == 'r' && j && json_is_string(j)) { /* a reversed string stays a string */
            json_t *s = join(&a, r, "", 0, NULL);
            json_decref(r);
            return s ? give(&a, s, out) : -1;
        }
        return give(&a, r, out);
    }
    if (strcmp(name, "min") == 0 || strcmp(name, "max") == 0 || strcmp(name, "sum") == 0) {
        json_t *items;
        if (jinja_iter(c, line, x, &items) < 0)
            return -1;
        jv acc = name[1] == 'u' ? jv_json(json_integer(0)) : jv_undef(name);
        int rc = 0;
        for (size_t k = 0; rc == 0 && k < json_array_size(items); k++) {
            jv it = {JV_JSON, false, json_array_get(items, k), NULL, NULL}, r;
            if (acc.kind == JV_UNDEF) {
                acc = jv_copy(it);
                continue;
            }
            rc = jinja_binop(c, line,
                             name[1] == 'u'   ? JO_ADD
                             : name[1] == 'i' ? JO_LT
                                              : JO_GT,
                             &it, &acc, &r);
            if (rc == 0 && name[1] == 'u') {
                jv_drop(&acc);
                acc = r;
            } else if (rc == 0) {
                if (json_is_true(r.j)) {
                    jv_drop(&acc);
                    acc = jv_copy(it);
                }
                jv_drop(&r);
            }
        }
        json_decref(items);
        if (rc < 0)
            return jv_drop(&acc), -1;
        *out = acc;
        return 0;
    }
    if (strcmp(name, "abs") == 0 || strcmp(name, "int") == 0 || strcmp(name, "float") == 0 ||
        strcmp(name, "round") == 0) {
        double v = 0;
        bool num = j && (json_is_number(j) || json_is_boolean(j));
        if (num)
            v = json_is_boolean(j) ? json_is_true(j) : json_number_value(j);
        else if (j && json_is_string(j)) {
            char *end;
            const char *s = json_string_value(j);
            v = strtod(s, &end);
            num = end != s && *end == 0;
        }
        if (strcmp(name, "abs") == 0) {
            if (!num || json_is_string(j))
                return bad(&a, "expects a number");
            return give(&a,
                        json_is_real(j) ? json_real(v < 0 ? -v : v)
                                        : json_integer((json_int_t)(v < 0 ? -v : v)),
                        out);
        }
        if (strcmp(name, "round") == 0) {
            jv *prec = arg(&a, 0, "precision");
            json_int_t p = prec && is_intv(prec) ? ival(prec) : 0;
            double f = 1;
            for (json_int_t k = 0; k < p && k < 15; k++)
                f *= 10;
            double r = v * f, fl = (double)(long long)r;
            r = (r - fl >= 0.5) ? fl + 1 : (r - fl <= -0.5 ? fl - 1 : fl);
            return give(&a, json_real(r / f), out);
        }
        if (!num) {
            jv *d = arg(&a, 0, "default");
            *out = d ? jv_copy(*d) : jv_json(name[0] == 'i' ? json_integer(0) : json_real(0));
            return 0;
        }
        return give(&a, name[0] == 'i' ? json_integer((json_int_t)v) : json_real(v), out);
    }
    /* string filters */
    if (x->kind == JV_UNDEF)
        j = NULL;
    json_t *s = NULL;
    if (j && json_is_string(j))
        s = json_incref(j);
    else {
        jbuf b = {0};
        if (jinja_str(&b, x, false) < 0)
            return free(b.p), oom(&a);
        s = json_stringn_nocheck(b.p ? b.p : "", b.len);
        free(b.p);
        if (!s)
            return oom(&a);
    }
    int rc = 0;
    if (strcmp(name, "trim") == 0) {
        jv *ch = arg(&a, 0, "chars");
        rc = give(&a, strip(s, is_str(ch) ? ch->j : NULL, true, true), out);
    } else if (strcmp(name, "upper") == 0 || strcmp(name, "lower") == 0 ||
               strcmp(name, "title") == 0 || strcmp(name, "capitalize") == 0) {
        rc = give(&a,
                  recase(s, name[0] == 'u'   ? 'u'
                            : name[0] == 'l' ? 'l'
                            : name[0] == 't' ? 't'
                                             : 'c'),
                  out);
    } else if (strcmp(name, "replace") == 0) {
        jv *o = arg(&a, 0, "old"), *nw = arg(&a, 1, "new"), *cnt = arg(&a, 2, "count");
        if (!is_str(o) || !is_str(nw))
            rc = bad(&a, "expects (old, new[, count])");
        else
            rc = give(&a, replace(s, o->j, nw->j, cnt && is_intv(cnt) ? ival(cnt) : -1), out);
    } else if (strcmp(name, "e") == 0 || strcmp(name, "escape") == 0) {
        json_t *t = json_incref(s);
        static const char *const from[] = {"&", "<", ">", "\"", "'"};
        static const char *const to[] = {"&amp;", "&lt;", "&gt;", "&#34;", "&#39;"};
        for (int k = 0; k < 5 && t; k++) {
            json_t *f = json_string(from[k]), *g = json_string(to[k]);
            json_t *u = f && g ? replace(t, f, g, -1) : NULL;
            json_decref(f);
            json_decref(g);
            json_decref(t);
            t = u;
        }
        rc = give(&a, t, out);
    } else {
        rc = jinja_fail(c, line, "unknown filter '%s'", name);
    }
    json_decref(s);
    return rc;
}

/* ---- globals ---- */

static const char *const globals[] = {"dict",  "namespace",    "raise_exception",
                                      "range", "strftime_now", NULL};

bool jinja_is_global(const char *name)
{
    return in_list(globals, name);
}

int jinja_global(jctx *c, int line, const char *name, jv *pos, size_t n, const char **kw, jv *kwv,
                 size_t n_kw, jv *out)
{
    call a = {c, line, name, pos, n, kw, kwv, n_kw};
    if (strcmp(name, "raise_exception") == 0) {
        jbuf b = {0};
        if (n > 0)
            jinja_str(&b, &pos[0], false);
        int rc = jinja_fail(c, line, "raise_exception: %s", b.p ? b.p : "");
        free(b.p);
        return rc;
    }
    if (strcmp(name, "namespace") == 0 || strcmp(name, "dict") == 0) {
        json_t *o = json_object();
        if (!o)
            return oom(&a);
        if (n > 0 && is_obj(&pos[0]))
            json_object_update(o, pos[0].j);
        else if (n > 0)
            return json_decref(o), bad(&a, "takes keyword arguments or a dict");
        for (size_t k = 0; k < n_kw; k++) {
            if (kwv[k].kind != JV_JSON) {
                json_decref(o);
                return bad(&a, "values must be plain values");
            }
            if (json_object_set(o, kw[k], kwv[k].j) < 0) {
                json_decref(o);
                return oom(&a);
            }
        }
        *out = jv_json(o);
        out->ns = name[0] == 'n';
        return 0;
    }
    if (strcmp(name, "range") == 0) {
        json_int_t lo = 0, hi, st = 1;
        for (size_t k = 0; k < n; k++)
            if (!is_intv(&pos[k]))
                return bad(&a, "expects integers");
        if (n == 1)
            hi = ival(&pos[0]);
        else if (n == 2 || n == 3) {
            lo = ival(&pos[0]);
            hi = ival(&pos[1]);
            st = n == 3 ? ival(&pos[2]) : 1;
        } else
            return bad(&a, "expects 1 to 3 integers");
        if (st == 0)
            return bad(&a, "step must not be zero");
        json_t *r = json_array();
        size_t count = 0;
        for (json_int_t i = lo; r && (st > 0 ? i < hi : i > hi); i += st) {
            if (++count > 1000000) {
                json_decref(r);
                return bad(&a, "more than 1,000,000 items");
            }
            if (json_array_append_new(r, json_integer(i)) < 0) {
                json_decref(r);
                r = NULL;
            }
        }
        if (r && jinja_step(c, line, count) < 0) {
            json_decref(r);
            return -1;
        }
        return give(&a, r, out);
    }
    /* strftime_now */
    if (n != 1 || !is_str(&pos[0]))
        return bad(&a, "expects a format string");
    struct tm tm;
    const char *now = jinja_now(c);
    memset(&tm, 0, sizeof tm);
    if (now) {
        if (sscanf(now, "%d-%d-%d %d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                   &tm.tm_min, &tm.tm_sec) != 6)
            return bad(&a, "the fixed time is not YYYY-MM-DD HH:MM:SS");
        tm.tm_year -= 1900;
        tm.tm_mon -= 1;
        time_t t = timegm(&tm);
        gmtime_r(&t, &tm);
    } else {
        time_t t = time(NULL);
        localtime_r(&t, &tm);
    }
    char buf[256];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    size_t len = strftime(buf, sizeof buf, json_string_value(pos[0].j), &tm);
#pragma GCC diagnostic pop
    return give(&a, json_stringn_nocheck(buf, len), out);
}
