/*
 * pyjson.c - Python json.dumps output from a jansson value (rules in pyjson.h).
 *
 * Reals: repr finds the shortest of %.0e .. %.16e that strtod reads back to the same
 * double, or at the same precision the neighbour of those digits across x (at most 17
 * tries, each a snprintf and one or two strtod: reals are rare in tool schemas), takes its
 * digits and decimal exponent, and lays them out by Python's float_repr rule.
 * Strings are written in runs: the bytes between two escapes go out in one write.
 */
#include "pyjson.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int put(pyjson_write w, void *ctx, const char *s)
{
    return w(ctx, s, strlen(s));
}

/* Write s[0, n) as a JSON string with Python's escapes. */
static int dump_string(const char *s, size_t n, pyjson_write w, void *ctx)
{
    int rc = w(ctx, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8] = "";
        if (c == '"' || c == '\\')
            snprintf(esc, sizeof esc, "\\%c", c);
        else if (c == '\n')
            strcpy(esc, "\\n");
        else if (c == '\r')
            strcpy(esc, "\\r");
        else if (c == '\t')
            strcpy(esc, "\\t");
        else if (c == '\b')
            strcpy(esc, "\\b");
        else if (c == '\f')
            strcpy(esc, "\\f");
        else if (c < 0x20)
            snprintf(esc, sizeof esc, "\\u%04x", c);
        if (esc[0] == '\0')
            continue;
        if (i > run)
            rc = w(ctx, s + run, i - run);
        if (rc == 0)
            rc = put(w, ctx, esc);
        run = i + 1;
    }
    if (rc == 0 && n > run)
        rc = w(ctx, s + run, n - run);
    return rc ? rc : w(ctx, "\"", 1);
}

/* Append c to buf[*o] when there is room (one byte kept for the NUL). */
static void put_char(char *buf, size_t size, size_t *o, char c)
{
    if (*o + 1 < size)
        buf[(*o)++] = c;
}

/* Whether the p+1 significant digits of "%.{p}e" form e, moved by step (-1 or +1) in the
 * last digit, still read back to x; if so, e becomes that string. A step that would change
 * the number of digits (9.99 up, 1.00 down) is not tried: a shorter precision covers it. */
static bool try_neighbour(double x, char *e, size_t size, int step)
{
    char *mark = strchr(e, 'e');
    char t[40];
    if (mark == NULL || (size_t)(mark - e) >= sizeof t)
        return false;
    memcpy(t, e, (size_t)(mark - e));
    char *q = t + (mark - e);
    *q = '\0';
    char up = step > 0 ? '9' : '0', wrap = step > 0 ? '0' : '9';
    char *d = q - 1;
    while (d >= t && (*d == '.' || *d == up)) {
        if (*d != '.')
            *d = wrap;
        d--;
    }
    if (d < t || *d < '0' || *d > '9' || (step < 0 && *d == '1' && (d == t || d[-1] == '-')))
        return false;
    *d = (char)(*d + step);
    snprintf(q, sizeof t - (size_t)(q - t), "%s", mark);
    if (strtod(t, NULL) != x)
        return false;
    snprintf(e, size, "%s", t);
    return true;
}

size_t pyjson_repr_double(double x, char *buf, size_t size)
{
    if (!isfinite(x))
        return (size_t)snprintf(buf, size, "%s", isnan(x) ? "nan" : x < 0 ? "-inf" : "inf");
    /* The shortest digits that read back to x, the nearest to x among those (Python's
     * repr). At precision p the correctly rounded digits are the nearest; when they miss,
     * the other p-digit neighbour across x may still hit (the interval of doubles that
     * read back to x is lopsided at a power of two), so it is tried too. */
    char e[40];
    for (int p = 0; p <= 16; p++) {
        snprintf(e, sizeof e, "%.*e", p, x);
        double back = strtod(e, NULL);
        if (back == x || try_neighbour(x, e, sizeof e, (back < x) == (x > 0) ? 1 : -1))
            break;
    }
    /* e is "[-]d[.ddd]e[+-]XX": collect the digits (trailing zeros dropped) and exponent. */
    char digits[24];
    size_t nd = 0, o = 0;
    const char *q = e;
    if (*q == '-')
        put_char(buf, size, &o, *q++);
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9' && nd < sizeof digits - 1)
            digits[nd++] = *q;
    int exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    if (exp10 < -4 || exp10 >= 16) {
        put_char(buf, size, &o, digits[0]);
        if (nd > 1)
            put_char(buf, size, &o, '.');
        for (size_t i = 1; i < nd; i++)
            put_char(buf, size, &o, digits[i]);
        o += (size_t)snprintf(buf + o, size - o, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
        return o < size ? o : size - 1;
    }
    size_t n_int = exp10 < 0 ? 0 : (size_t)exp10 + 1; /* digits before the point */
    if (n_int == 0)
        put_char(buf, size, &o, '0');
    for (size_t i = 0; i < n_int; i++)
        put_char(buf, size, &o, i < nd ? digits[i] : '0');
    put_char(buf, size, &o, '.');
    for (int i = exp10 + 1; i < 0; i++)
        put_char(buf, size, &o, '0');
    if (nd <= n_int)
        put_char(buf, size, &o, '0');
    for (size_t i = n_int; i < nd; i++)
        put_char(buf, size, &o, digits[i]);
    buf[o] = '\0';
    return o;
}

static int newline_indent(int indent, int depth, pyjson_write w, void *ctx)
{
    int rc = w(ctx, "\n", 1);
    for (int i = 0; rc == 0 && i < indent * depth; i++)
        rc = w(ctx, " ", 1);
    return rc;
}

static int dump_value(const json_t *v, int indent, int depth, pyjson_write w, void *ctx);

/* An array or object: open, the elements with their separators, close. */
static int dump_container(const json_t *v, int indent, int depth, pyjson_write w, void *ctx)
{
    bool obj = json_is_object(v);
    size_t n = obj ? json_object_size(v) : json_array_size(v);
    int rc = w(ctx, obj ? "{" : "[", 1);
    if (n == 0)
        return rc ? rc : w(ctx, obj ? "}" : "]", 1);
    const char *sep = indent >= 0 ? "," : ", ";
    size_t i = 0;
    const char *key;
    const json_t *val;
    if (obj) {
        json_object_foreach((json_t *)v, key, val)
        {
            if (rc == 0 && i++ > 0)
                rc = put(w, ctx, sep);
            if (rc == 0 && indent >= 0)
                rc = newline_indent(indent, depth + 1, w, ctx);
            if (rc == 0)
                rc = dump_string(key, strlen(key), w, ctx);
            if (rc == 0)
                rc = w(ctx, ": ", 2);
            if (rc == 0)
                rc = dump_value(val, indent, depth + 1, w, ctx);
        }
    } else {
        for (i = 0; rc == 0 && i < n; i++) {
            if (i > 0)
                rc = put(w, ctx, sep);
            if (rc == 0 && indent >= 0)
                rc = newline_indent(indent, depth + 1, w, ctx);
            if (rc == 0)
                rc = dump_value(json_array_get(v, i), indent, depth + 1, w, ctx);
        }
    }
    if (rc == 0 && indent >= 0)
        rc = newline_indent(indent, depth, w, ctx);
    return rc ? rc : w(ctx, obj ? "}" : "]", 1);
}

static int dump_value(const json_t *v, int indent, int depth, pyjson_write w, void *ctx)
{
    char buf[48];
    switch (json_typeof(v)) {
    case JSON_OBJECT:
    case JSON_ARRAY:
        return dump_container(v, indent, depth, w, ctx);
    case JSON_STRING:
        return dump_string(json_string_value(v), json_string_length(v), w, ctx);
    case JSON_INTEGER:
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        return put(w, ctx, buf);
    case JSON_REAL:
        return w(ctx, buf, pyjson_repr_double(json_real_value(v), buf, sizeof buf));
    case JSON_TRUE:
        return put(w, ctx, "true");
    case JSON_FALSE:
        return put(w, ctx, "false");
    default:
        return put(w, ctx, "null");
    }
}

int pyjson_dump(const json_t *v, int indent, pyjson_write write, void *ctx)
{
    return dump_value(v, indent, 0, write, ctx);
}
