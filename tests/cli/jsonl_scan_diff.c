/*
 * jsonl_scan_diff.c - the scanner-versus-jansson property, a line generator and a mutator
 * (contract in jsonl_scan_diff.h).
 *
 * The generator builds lines from pieces chosen to sit on the scanner's decision boundaries:
 * ids at 2^32 - 1 / 2^32 / 2^63 - 1 / 2^63 / 2^64, reals near DBL_MAX and with huge exponents,
 * leading zeros, every escape, surrogate pairs (matched and not), \u0000, multi-byte UTF-8
 * (valid, overlong, encoded surrogates), keys that repeat (also through escapes), nesting, and
 * random whitespace. Output is cut at cap - 1 bytes, which makes some lines truncated.
 */
#include "jsonl_scan_diff.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonl_scan.h"

static js_scanner scanner;
static js_record record;

static void fail_at(const char *line, size_t len, const char *what)
{
    fprintf(stderr, "jsonl_scan differs from jansson: %s\nline (%zu bytes): ", what, len);
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)line[i];
        if (ch >= 0x20 && ch < 0x7f && ch != '\\')
            fputc(ch, stderr);
        else
            fprintf(stderr, "\\x%02x", ch);
    }
    fprintf(stderr, "\nscanner: %s\n", scanner.err);
    abort();
}

#define CHECK(cond, what)                                                                          \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail_at(line, len, what);                                                              \
    } while (0)

static js_kind kind_of(const json_t *v)
{
    if (v == NULL)
        return JS_ABSENT;
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return JS_OBJECT;
    case JSON_ARRAY:
        return JS_ARRAY;
    case JSON_STRING:
        return JS_STRING;
    case JSON_INTEGER:
        return JS_INT;
    case JSON_REAL:
        return JS_REAL;
    case JSON_TRUE:
    case JSON_FALSE:
        return JS_BOOL;
    default:
        return JS_NULL;
    }
}

/* Compare a scalar field with jansson's value of it. */
static void check_value(const char *line, size_t len, const json_t *j, const js_value *v)
{
    CHECK(v->kind == kind_of(j), "scalar kind");
    if (j == NULL)
        return;
    CHECK(v->column >= 1 && v->column <= len, "scalar column");
    if (json_is_integer(j)) {
        CHECK(v->i == json_integer_value(j), "integer value");
        CHECK(memcmp(&v->d, &(double){(double)json_integer_value(j)}, sizeof v->d) == 0,
              "integer as double");
    } else if (json_is_real(j)) {
        double d = json_real_value(j);
        CHECK(memcmp(&v->d, &d, sizeof d) == 0, "real value");
    } else if (json_is_boolean(j)) {
        CHECK(v->b == json_is_true(j), "boolean value");
    } else if (json_is_string(j)) {
        char *buf = malloc(v->str_len + 1);
        CHECK(buf != NULL, "out of memory in the test");
        size_t n = js_string_decode(v, buf);
        CHECK(n == json_string_length(j) && memcmp(buf, json_string_value(j), n) == 0 &&
                  buf[n] == '\0',
              "decoded string");
        free(buf);
    }
}

/* Compare an id array field (elem 4: token ids, 8: hash ids) with jansson's. */
static void check_ids(const char *line, size_t len, const json_t *j, const js_array *a,
                      const void *v, size_t elem, jsd_stats *st)
{
    CHECK(a->kind == kind_of(j), "array kind");
    if (!json_is_array(j))
        return;
    CHECK(a->n == json_array_size(j), "array length");
    size_t bad = JS_NO_INDEX;
    for (size_t i = 0; i < a->n; i++) {
        const json_t *e = json_array_get(j, i);
        json_int_t x = json_is_integer(e) ? json_integer_value(e) : -1;
        bool ok = json_is_integer(e) && x >= 0 && (elem == 8 || x <= (json_int_t)UINT32_MAX);
        if (ok)
            CHECK(elem == 4 ? ((const uint32_t *)v)[i] == (uint32_t)x
                            : ((const uint64_t *)v)[i] == (uint64_t)x,
                  "array element");
        if (!ok && bad == JS_NO_INDEX) {
            bad = i;
            CHECK(a->bad_kind == kind_of(e), "bad element kind");
            CHECK(!json_is_integer(e) || a->bad_int == x, "bad element value");
        }
    }
    CHECK(a->bad_index == bad, "first bad element");
    if (bad != JS_NO_INDEX && st != NULL)
        st->n_bad_element++;
}

/* Compare every extracted field of an accepted object. */
static void check_fields(const char *line, size_t len, const json_t *o, jsd_stats *st)
{
    static const struct {
        const char *key;
        unsigned bit;
    } bits[] = {{"tokens", JS_F_TOKENS},
                {"output_tokens", JS_F_OUTPUT_TOKENS},
                {"hash_ids", JS_F_HASH_IDS},
                {"model", JS_F_MODEL},
                {"adapter", JS_F_ADAPTER},
                {"tenant", JS_F_TENANT},
                {"cache_salt", JS_F_CACHE_SALT},
                {"timestamp", JS_F_TIMESTAMP},
                {"input_length", JS_F_INPUT_LENGTH},
                {"output_length", JS_F_OUTPUT_LENGTH},
                {"messages", JS_F_MESSAGES},
                {"prompt", JS_F_PROMPT},
                {"body", JS_F_BODY}};
    unsigned want = 0;
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++)
        if (json_object_get(o, bits[i].key) != NULL)
            want |= bits[i].bit;
    CHECK(record.fields == want, "field bits");
    const js_record *r = &record;
    check_ids(line, len, json_object_get(o, "tokens"), &r->tokens, r->tokens_v, 4, st);
    check_ids(line, len, json_object_get(o, "output_tokens"), &r->output_tokens, r->output_tokens_v,
              4, st);
    check_ids(line, len, json_object_get(o, "hash_ids"), &r->hash_ids, r->hash_ids_v, 8, st);
    check_value(line, len, json_object_get(o, "model"), &r->model);
    check_value(line, len, json_object_get(o, "adapter"), &r->adapter);
    check_value(line, len, json_object_get(o, "tenant"), &r->tenant);
    check_value(line, len, json_object_get(o, "cache_salt"), &r->cache_salt);
    check_value(line, len, json_object_get(o, "timestamp"), &r->timestamp);
    check_value(line, len, json_object_get(o, "input_length"), &r->input_length);
    check_value(line, len, json_object_get(o, "output_length"), &r->output_length);
}

void jsd_check_stats(const char *line, size_t len, jsd_stats *st)
{
    json_error_t jerr;
    json_t *j = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    int rc = js_scan(&scanner, line, len, &record);
    CHECK(js_scanner_check(&scanner) == 0, "scanner invariants");
    if (j == NULL) {
        CHECK(rc == JS_EJSON, "jansson rejects the line, the scanner does not");
        CHECK(strncmp(scanner.err, "invalid JSON at column ", 23) == 0, "message");
        CHECK(scanner.err_column >= 1 && scanner.err_column <= len + 1, "error column");
        if (st != NULL)
            st->n_invalid++;
        return;
    }
    if (memchr(line, '\0', len) != NULL) {
        /* jansson's one leniency: a NUL byte right after a number or a literal is dropped
         * (its stream reads a NUL as "no byte buffered"). The scanner rejects every raw NUL. */
        CHECK(rc == JS_EJSON && line[scanner.err_column - 1] == '\0', "NUL byte accepted");
        json_decref(j);
        if (st != NULL)
            st->n_invalid++;
        return;
    }
    CHECK(rc != JS_EJSON, "the scanner rejects a line jansson accepts");
    if (!json_is_object(j)) {
        CHECK(rc == JS_ENOTOBJ, "not an object");
        char want[96];
        snprintf(want, sizeof want, "each line must be a JSON object, not %s",
                 js_kind_name(kind_of(j)));
        CHECK(strcmp(scanner.err, want) == 0, "not-an-object message");
        if (st != NULL)
            st->n_not_object++;
    } else {
        bool oai = json_object_get(j, "messages") || json_object_get(j, "prompt") ||
                   json_object_get(j, "body") || json_object_get(j, "retention");
        CHECK(rc == (oai ? JS_FALLBACK : JS_OK), "fallback signal");
        CHECK(scanner.err[0] == '\0', "message after success");
        check_fields(line, len, j, st);
        if (st != NULL)
            *(oai ? &st->n_fallback : &st->n_ok) += 1;
    }
    json_decref(j);
}

void jsd_check(const char *line, size_t len)
{
    jsd_check_stats(line, len, NULL);
}

void jsd_free(void)
{
    js_scanner_free(&scanner);
    js_record_free(&record);
}

/* ---- generator ---- */

/* A bounded output buffer: appends past cap - 1 are dropped. */
typedef struct out {
    char *buf;
    size_t cap, len;
    uint64_t *seed;
} out;

static uint32_t rnd(out *o, uint32_t n)
{
    uint64_t x = *o->seed += 0x9E3779B97F4A7C15u;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9u;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBu;
    x ^= x >> 31;
    return n == 0 ? 0 : (uint32_t)(x % n);
}

static void put(out *o, const char *s)
{
    for (; *s != '\0' && o->len + 1 < o->cap; s++)
        o->buf[o->len++] = *s;
}

/* Append prefix and the decimal digits of v. */
static void putu(out *o, const char *prefix, unsigned long long v)
{
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%s%llu", prefix, v);
    put(o, tmp);
}

static void ws(out *o)
{
    static const char *const w[] = {"", "", "", "", " ", " ", "  ", "\t", "\r\n", " \n "};
    put(o, w[rnd(o, 10)]);
}

static void gen_string(out *o)
{
    static const char *const pieces[] = {"abc",
                                         "m",
                                         "Llama-3",
                                         " ",
                                         "\\n",
                                         "\\\"",
                                         "\\\\",
                                         "\\/",
                                         "\\b\\f\\r\\t",
                                         "\\u0041",
                                         "\\u00e9",
                                         "\\u20AC",
                                         "\\uD83D\\uDE00",
                                         "\\uDBFF\\uDFFF",
                                         "\\uD800",
                                         "\\uDC00",
                                         "\\u0000",
                                         "\\uD83Dx",
                                         "\xc3\xa9",
                                         "\xe2\x82\xac",
                                         "\xf0\x9f\x98\x80",
                                         "\xc0\xaf",
                                         "\xed\xa0\x80",
                                         "\xf4\x90\x80\x80",
                                         "\xff",
                                         "\x01",
                                         "\x7f",
                                         "\\x",
                                         "\\u12"};
    put(o, "\"");
    for (uint32_t n = rnd(o, 4); n-- > 0;)
        put(o, pieces[rnd(o, rnd(o, 5) == 0 ? 29 : 21)]);
    put(o, "\"");
}

static void gen_number(out *o)
{
    static const char *const special[] = {"0",
                                          "-0",
                                          "1",
                                          "-1",
                                          "4294967295",
                                          "4294967296",
                                          "9223372036854775807",
                                          "9223372036854775808",
                                          "-9223372036854775808",
                                          "-9223372036854775809",
                                          "18446744073709551615",
                                          "18446744073709551616",
                                          "1.5",
                                          "-0.0",
                                          "1e3",
                                          "1E+2",
                                          "2e-5",
                                          "1.7976931348623157e308",
                                          "1.7976931348623159e308",
                                          "1e309",
                                          "-1e309",
                                          "1e-400",
                                          "0.1e310",
                                          "10e308",
                                          "0.00001e313",
                                          "01",
                                          "1.",
                                          ".5",
                                          "-",
                                          "1e",
                                          "+1",
                                          "0x1",
                                          "1e+"};
    if (rnd(o, 3) == 0) {
        put(o, special[rnd(o, rnd(o, 4) == 0 ? 33 : 25)]);
        return;
    }
    if (rnd(o, 4) == 0)
        put(o, "-");
    putu(o, "", rnd(o, 100000));
    if (rnd(o, 4) == 0)
        putu(o, ".", rnd(o, 1000));
    if (rnd(o, 6) == 0)
        putu(o, "e", rnd(o, 400));
}

static void gen_key(out *o)
{
    static const char *const keys[] = {"\"tokens\"",
                                       "\"output_tokens\"",
                                       "\"hash_ids\"",
                                       "\"model\"",
                                       "\"adapter\"",
                                       "\"tenant\"",
                                       "\"cache_salt\"",
                                       "\"timestamp\"",
                                       "\"input_length\"",
                                       "\"output_length\"",
                                       "\"messages\"",
                                       "\"prompt\"",
                                       "\"body\"",
                                       "\"a\"",
                                       "\"b\"",
                                       "\"x\"",
                                       "\"\"",
                                       "\"tok\\u0065ns\"",
                                       "\"mod\\u0065l\"",
                                       "\"\\u0061\""};
    if (rnd(o, 8) == 0)
        gen_string(o);
    else
        put(o, keys[rnd(o, 20)]);
}

static void gen_value(out *o, int depth);

static void gen_container(out *o, int depth, bool object)
{
    put(o, object ? "{" : "[");
    ws(o);
    for (uint32_t i = 0, n = rnd(o, 5); i < n; i++) {
        if (i > 0)
            put(o, ","), ws(o);
        if (object)
            gen_key(o), ws(o), put(o, ":"), ws(o);
        gen_value(o, depth + 1);
        ws(o);
    }
    put(o, object ? "}" : "]");
}

static void gen_value(out *o, int depth)
{
    uint32_t k = rnd(o, depth > 6 ? 5 : 8);
    if (k == 0)
        gen_string(o);
    else if (k <= 2)
        gen_number(o);
    else if (k == 3)
        put(o, rnd(o, 2) ? "true" : "null");
    else if (k == 4)
        put(o, rnd(o, 2) ? "false" : (rnd(o, 2) ? "nul" : "tru"));
    else
        gen_container(o, depth, k == 5 || k == 7);
}

static void gen_ids(out *o, bool tokens)
{
    put(o, "[");
    ws(o);
    for (uint32_t i = 0, n = rnd(o, 40); i < n; i++) {
        if (i > 0)
            put(o, ","), ws(o);
        uint32_t k = rnd(o, 40);
        if (k == 0)
            gen_value(o, 2);
        else if (k < 4)
            gen_number(o);
        else
            putu(o, "",
                 tokens ? (unsigned long long)rnd(o, 200000)
                        : (unsigned long long)rnd(o, 0xFFFFFFFFu) * rnd(o, 0x7FFFFFFF));
        ws(o);
    }
    put(o, "]");
}

/* A top-level object mixing known fields (mostly of the right types) and others. */
static void gen_record(out *o)
{
    static const char *const scalars[] = {"\"model\"",        "\"adapter\"",   "\"tenant\"",
                                          "\"cache_salt\"",   "\"timestamp\"", "\"input_length\"",
                                          "\"output_length\""};
    uint32_t shape = rnd(o, 10); /* 0-4 token log, 5-7 Mooncake, 8 OpenAI, 9 anything */
    put(o, "{");
    ws(o);
    for (uint32_t i = 0, n = 1 + rnd(o, 6); i < n; i++) {
        if (i > 0)
            put(o, ","), ws(o);
        uint32_t f = rnd(o, 10);
        if (f < 3 && shape < 8) {
            put(o, shape < 5 ? (f == 0 ? "\"output_tokens\"" : "\"tokens\"") : "\"hash_ids\"");
            ws(o), put(o, ":"), ws(o);
            rnd(o, 12) == 0 ? gen_value(o, 1) : gen_ids(o, shape < 5);
        } else if (f < 7) {
            put(o, scalars[rnd(o, 7)]);
            ws(o), put(o, ":"), ws(o);
            rnd(o, 3) == 0 ? gen_string(o) : rnd(o, 5) == 0 ? gen_value(o, 1) : gen_number(o);
        } else if (f == 7 && shape == 8) {
            put(o,
                rnd(o, 2) ? "\"messages\": [{\"role\": \"user\", \"content\": " : "\"prompt\": [");
            gen_string(o);
            put(o, rnd(o, 2) ? "}]" : "]");
        } else {
            gen_key(o), ws(o), put(o, ":"), ws(o);
            gen_value(o, 1);
        }
        ws(o);
    }
    put(o, "}");
}

size_t jsd_generate(uint64_t *seed, char *buf, size_t cap)
{
    out o = {buf, cap, 0, seed};
    ws(&o);
    if (rnd(&o, 20) == 0)
        gen_value(&o, 0);
    else
        gen_record(&o);
    ws(&o);
    if (o.len < cap)
        buf[o.len] = '\0';
    return o.len;
}

size_t jsd_mutate(uint64_t *seed, const char *line, size_t len, char *dst, size_t cap)
{
    static const char bytes[] = "{}[]\",:\\0123456789eE.-+ \tntfu\x80\xff";
    out o = {dst, cap + 1, 0, seed};
    size_t n = len < cap ? len : cap;
    memcpy(dst, line, n);
    for (uint32_t m = 1 + rnd(&o, 2); m-- > 0 && n > 0;) {
        size_t at = rnd(&o, (uint32_t)n);
        char ch = rnd(&o, 16) == 0 ? '\0' : bytes[rnd(&o, sizeof bytes - 1)];
        switch (rnd(&o, 5)) {
        case 0:
            dst[at] = ch;
            break;
        case 1:
            if (n < cap) {
                memmove(dst + at + 1, dst + at, n - at);
                dst[at] = ch;
                n++;
            }
            break;
        case 2:
            memmove(dst + at, dst + at + 1, n - at - 1);
            n--;
            break;
        case 3:
            n = at;
            break;
        default:
            dst[at] = dst[rnd(&o, (uint32_t)n)];
            break;
        }
    }
    return n;
}
