/*
 * test_jsonl_scan.c - tests of the JSON Lines scanner (src/cli/input/jsonl_scan.h).
 *
 * Two kinds of tests:
 *   - hand cases: every extracted field and kind, escapes and surrogate pairs, numbers at the
 *     limits (2^32-1 / 2^32 token ids, 2^63-1 / 2^63 / 2^64 hash ids, negative, fractions,
 *     exponents, leading zeros, real overflow), duplicate keys at every depth, raw NUL and
 *     control bytes, invalid UTF-8, a BOM (not JSON: the caller strips it), nesting at
 *     JS_MAX_DEPTH and one deeper, truncated lines, the OpenAI fallback signal;
 *   - a differential test against jansson, called with the reader's flags
 *     (JSON_REJECT_DUPLICATES | JSON_DECODE_ANY): 40000 generated lines (token logs, Mooncake
 *     lines, OpenAI bodies, random nested values with random strings and numbers) and four
 *     byte-level mutants of each. For each line the scanner accepts iff jansson does (a raw
 *     NUL byte excepted, see jsonl_scan.h); it says "not an object" iff jansson's value is
 *     not an object; it signals the fallback iff the object has messages, prompt or body;
 *     and every extracted field (presence, kind, integer, double, decoded string, array
 *     length, first bad element, the elements themselves) equals what jansson gives. A run
 *     prints its counts with --verbose (last run: 20688 records, 1953 fallback lines, 174952
 *     invalid lines, 2407 other values, 4073 lines with a bad id).
 * The differential checker is shared with fuzz/fuzz_jsonl_scan.c through jsonl_scan_diff.h.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonl_scan.h"
#include "jsonl_scan_diff.h"

static js_scanner sc;
static js_record rec;

static void setup(void)
{
    js_scanner_init(&sc);
    js_record_init(&rec);
}

static void teardown(void)
{
    cr_assert_eq(js_scanner_check(&sc), 0);
    js_scanner_free(&sc);
    js_record_free(&rec);
}

TestSuite(jsonl_scan, .init = setup, .fini = teardown);

static int scan(const char *line)
{
    return js_scan(&sc, line, strlen(line), &rec);
}

/* Scan a line that must be rejected as invalid JSON; return the error column. */
static size_t scan_bad(const char *line, size_t len)
{
    int rc = js_scan(&sc, line, len, &rec);
    cr_assert_eq(rc, JS_EJSON, "accepted (rc %d): %.*s", rc, (int)len, line);
    cr_assert(strncmp(sc.err, "invalid JSON at column ", 23) == 0, "message: %s", sc.err);
    jsd_check(line, len); /* and jansson agrees */
    return sc.err_column;
}

static void bad(const char *line)
{
    scan_bad(line, strlen(line));
}

static void good(const char *line)
{
    int rc = scan(line);
    cr_assert(rc == JS_OK || rc == JS_FALLBACK, "rejected: %s: %s", line, sc.err);
    jsd_check(line, strlen(line));
}

Test(jsonl_scan, token_line_fields)
{
    const char *l = "{\"tokens\": [1, 2, 4294967295], \"output_tokens\": [7], \"model\": \"m\","
                    " \"adapter\": null, \"tenant\": \"t\", \"cache_salt\": \"s\\u00e9\","
                    " \"timestamp\": 12.5, \"extra\": {\"a\": [1, {\"b\": null}]}}";
    cr_assert_eq(scan(l), JS_OK, "%s", sc.err);
    cr_assert_eq(rec.tokens.kind, JS_ARRAY);
    cr_assert_eq(rec.tokens.n, 3);
    cr_assert_eq(rec.tokens.bad_index, JS_NO_INDEX);
    cr_assert_eq(rec.tokens_v[0], 1);
    cr_assert_eq(rec.tokens_v[2], 4294967295u);
    cr_assert_eq(rec.output_tokens.n, 1);
    cr_assert_eq(rec.output_tokens_v[0], 7);
    cr_assert_eq(rec.model.kind, JS_STRING);
    cr_assert_eq(rec.model.str_len, 1);
    cr_assert_eq(rec.model.str[0], 'm');
    cr_assert_eq(rec.adapter.kind, JS_NULL);
    cr_assert_eq(rec.hash_ids.kind, JS_ABSENT);
    cr_assert_eq(rec.timestamp.kind, JS_REAL);
    cr_assert(rec.timestamp.d == 12.5);
    char buf[32];
    cr_assert(rec.cache_salt.escaped);
    cr_assert_eq(js_string_decode(&rec.cache_salt, buf), 3);
    cr_assert_str_eq(buf, "s\xc3\xa9");
    cr_assert_eq(rec.fields, JS_F_TOKENS | JS_F_OUTPUT_TOKENS | JS_F_MODEL | JS_F_ADAPTER |
                                 JS_F_TENANT | JS_F_CACHE_SALT | JS_F_TIMESTAMP);
    jsd_check(l, strlen(l));
}

Test(jsonl_scan, mooncake_line_fields)
{
    const char *l = "{\"timestamp\": 27482, \"input_length\": 6955, \"output_length\": 52, "
                    "\"hash_ids\": [46, 47, 9223372036854775807, 0]}";
    cr_assert_eq(scan(l), JS_OK, "%s", sc.err);
    cr_assert_eq(rec.timestamp.kind, JS_INT);
    cr_assert_eq(rec.timestamp.i, 27482);
    cr_assert(rec.timestamp.d == 27482.0);
    cr_assert_eq(rec.input_length.i, 6955);
    cr_assert_eq(rec.output_length.i, 52);
    cr_assert_eq(rec.hash_ids.n, 4);
    cr_assert_eq(rec.hash_ids_v[2], UINT64_C(9223372036854775807));
    cr_assert_eq(rec.hash_ids_v[3], 0);
    jsd_check(l, strlen(l));
}

Test(jsonl_scan, id_limits)
{
    cr_assert_eq(scan("{\"tokens\": [4294967296]}"), JS_OK);
    cr_assert_eq(rec.tokens.bad_index, 0);
    cr_assert_eq(rec.tokens.bad_kind, JS_INT);
    cr_assert_eq(rec.tokens.bad_int, INT64_C(4294967296));
    cr_assert_eq(scan("{\"tokens\": [0, -1]}"), JS_OK);
    cr_assert_eq(rec.tokens.bad_index, 1);
    cr_assert_eq(rec.tokens.bad_int, -1);
    cr_assert_eq(scan("{\"tokens\": [1, 2.0, \"3\", -7]}"), JS_OK);
    cr_assert_eq(rec.tokens.bad_index, 1);
    cr_assert_eq(rec.tokens.bad_kind, JS_REAL);
    cr_assert_eq(rec.tokens.n, 4);
    cr_assert_eq(scan("{\"tokens\": [1, [2], {}]}"), JS_OK);
    cr_assert_eq(rec.tokens.bad_kind, JS_ARRAY);
    cr_assert_eq(scan("{\"hash_ids\": [-9223372036854775808]}"), JS_OK);
    cr_assert_eq(rec.hash_ids.bad_index, 0);
    cr_assert_eq(rec.hash_ids.bad_int, INT64_MIN);
    cr_assert_eq(scan("{\"hash_ids\": [1e3]}"), JS_OK);
    cr_assert_eq(rec.hash_ids.bad_kind, JS_REAL);
    /* jansson's integers are int64_t: 2^63 and 2^64 are not valid JSON for the reader. */
    bad("{\"hash_ids\": [9223372036854775808]}");
    bad("{\"hash_ids\": [18446744073709551616]}");
    bad("{\"x\": -9223372036854775809}");
    bad("{\"x\": 100000000000000000000}");
    cr_assert_eq(scan("{\"tokens\": \"abc\", \"hash_ids\": null}"), JS_OK);
    cr_assert_eq(rec.tokens.kind, JS_STRING);
    cr_assert_eq(rec.hash_ids.kind, JS_NULL);
    cr_assert_eq(scan("{\"tokens\": []}"), JS_OK);
    cr_assert_eq(rec.tokens.kind, JS_ARRAY);
    cr_assert_eq(rec.tokens.n, 0);
}

Test(jsonl_scan, numbers)
{
    good("{\"timestamp\": -0}");
    cr_assert_eq(rec.timestamp.kind, JS_INT);
    good("{\"timestamp\": -0.0}");
    cr_assert_eq(rec.timestamp.kind, JS_REAL);
    good("{\"timestamp\": 1E+2}");
    cr_assert(rec.timestamp.d == 100.0);
    good("{\"timestamp\": 1e-400}");
    cr_assert(rec.timestamp.d == 0.0);
    good("{\"timestamp\": 1.7976931348623157e308}");
    good("{\"timestamp\": 0.00000000000000000000000000001e337}");
    /* DBL_MAX written out in full (309 digits) is finite; one more digit overflows. */
    char big[400];
    int k = snprintf(big, sizeof big, "{\"timestamp\": 17976931348623157");
    memset(big + k, '0', 292);
    snprintf(big + k + 292, sizeof big - (size_t)k - 292, ".0}");
    good(big);
    cr_assert(rec.timestamp.d > 1.79e308);
    big[k + 292] = '0';
    snprintf(big + k + 293, sizeof big - (size_t)k - 293, ".0}");
    bad(big);
    bad("{\"timestamp\": 1.7976931348623159e308}");
    bad("{\"timestamp\": 1e309}");
    bad("{\"x\": [-1e99999999999999999999]}");
    bad("{\"timestamp\": 01}");
    bad("{\"timestamp\": 1.}");
    bad("{\"timestamp\": .5}");
    bad("{\"timestamp\": +1}");
    bad("{\"timestamp\": 1e}");
    bad("{\"timestamp\": 1e+}");
    bad("{\"timestamp\": -}");
    bad("{\"timestamp\": 0x10}");
    bad("{\"timestamp\": NaN}");
    bad("{\"timestamp\": Infinity}");
    good("{\"timestamp\": 123456789.123456789e-3, \"input_length\": 9223372036854775807}");
    cr_assert_eq(rec.input_length.i, INT64_MAX);
}

Test(jsonl_scan, strings_and_escapes)
{
    good("{\"model\": \"\\\"\\\\\\/\\b\\f\\n\\r\\t\"}");
    char buf[64];
    cr_assert_eq(js_string_decode(&rec.model, buf), 8);
    cr_assert_eq(memcmp(buf, "\"\\/\b\f\n\r\t", 8), 0);
    good("{\"model\": \"\\uD83D\\uDE00 \xf0\x9f\x98\x80\"}");
    cr_assert_eq(js_string_decode(&rec.model, buf), 9);
    cr_assert_eq(memcmp(buf, "\xf0\x9f\x98\x80 \xf0\x9f\x98\x80", 9), 0);
    good("{\"tenant\": \"\\u0041\\u00e9\\u20AC\\uffff\"}");
    bad("{\"model\": \"\\uD83D\"}");        /* lone high surrogate */
    bad("{\"model\": \"\\uDE00\"}");        /* lone low surrogate */
    bad("{\"model\": \"\\uD83D\\u0041\"}"); /* high surrogate, then not a low one */
    bad("{\"model\": \"\\u0000\"}");        /* jansson without JSON_ALLOW_NUL */
    bad("{\"model\": \"\\u00G0\"}");
    bad("{\"model\": \"\\x41\"}");
    bad("{\"model\": \"\\'\"}");
    bad("{\"model\": \"a\tb\"}");             /* raw control character */
    bad("{\"model\": \"\xc0\x80\"}");         /* overlong NUL */
    bad("{\"model\": \"\xed\xa0\x80\"}");     /* encoded surrogate */
    bad("{\"model\": \"\xf4\x90\x80\x80\"}"); /* above U+10FFFF */
    bad("{\"model\": \"\xe2\x82\"}");         /* truncated sequence */
    bad("{\"model\": \"\xff\"}");
    cr_assert(sc.err_utf8);
    good("{\"model\": \"\x7f\"}"); /* DEL is not a control character in JSON */
    /* In-place decoding. */
    char line[] = "{\"model\": \"a\\nb\\u00e9c\"}";
    cr_assert_eq(scan(line), JS_OK);
    size_t n = js_string_decode(&rec.model, (char *)rec.model.str);
    cr_assert_eq(n, 6);
    cr_assert_eq(memcmp(rec.model.str,
                        "a\nb\xc3\xa9"
                        "c",
                        6),
                 0);
}

Test(jsonl_scan, bytes_outside_strings)
{
    static const char nul_line[] = "{\"tokens\": [1]}\0";
    cr_assert_eq(scan_bad(nul_line, sizeof nul_line - 1), 16);
    static const char nul_mid[] = "{\"tokens\": [1,\0 2]}";
    cr_assert_eq(scan_bad(nul_mid, sizeof nul_mid - 1), 15);
    bad("\xef\xbb\xbf{\"tokens\": [1]}"); /* a BOM is the caller's job */
    cr_assert(strstr(sc.err, "byte order mark") != NULL, "%s", sc.err);
    cr_assert(!sc.err_utf8);
    bad("{\"a\": \xc3\xa9}"); /* valid UTF-8, but not inside a string */
    cr_assert(strstr(sc.err, "non-ASCII") != NULL, "%s", sc.err);
    bad("{\"a\": 1\xff}");
    cr_assert(sc.err_utf8);
    bad("{\"tokens\": [1]} x");
    bad("{\"tokens\": [1]}{}");
    good("  \t{\"tokens\" :\r\n[ 1 ,2 ] }\r\n ");
    cr_assert_eq(rec.tokens.n, 2);
    bad("");
    bad("   ");
    bad("{\"a\" 1}");
    bad("{\"a\": 1,}");
    bad("{\"a\": [1,]}");
    bad("{,}");
    bad("{'a': 1}");
    bad("{a: 1}");
    bad("{\"a\": tru}");
    bad("{\"a\": nul}");
    bad("{\"a\": True}");
}

Test(jsonl_scan, not_an_object)
{
    const char *lines[] = {"[1, 2]", "\"s\"", "12", "-1.5", "null", "true", " [] "};
    const char *names[] = {"an array", "a string",  "an integer", "a non-integer number",
                           "null",     "a boolean", "an array"};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        cr_assert_eq(scan(lines[i]), JS_ENOTOBJ, "%s", lines[i]);
        char want[96];
        snprintf(want, sizeof want, "each line must be a JSON object, not %s", names[i]);
        cr_assert_str_eq(sc.err, want);
        jsd_check(lines[i], strlen(lines[i]));
    }
    bad("[1, 2");
    bad("12 13");
}

Test(jsonl_scan, duplicate_keys)
{
    cr_assert_eq(scan_bad("{\"tokens\": [1], \"tokens\": [2]}", 30), 17);
    cr_assert(strstr(sc.err, "duplicate object key") != NULL, "%s", sc.err);
    bad("{\"tokens\": [1], \"tok\\u0065ns\": [2]}"); /* the same key, escaped */
    bad("{\"a\": {\"x\": 1, \"y\": 2, \"x\": 3}}");
    bad("{\"a\": [{\"x\": 1, \"x\": 1}]}");
    good("{\"a\": {\"x\": 1}, \"b\": {\"x\": 1}, \"x\": {\"x\": {\"x\": 1}}}");
    good("{\"\": 1, \"x\\u0001\": 2, \"x\\u0002\": 3}");
    /* A big object is checked when it closes; the error names the first repeated key. */
    char line[8192];
    size_t n = (size_t)snprintf(line, sizeof line, "{\"o\": {");
    for (int i = 0; i < 200; i++)
        n += (size_t)snprintf(line + n, sizeof line - n, "\"k%d\": %d, ", i, i);
    size_t dup_at = n;
    n += (size_t)snprintf(line + n, sizeof line - n, "\"k17\": 0, \"k5\": 1}}");
    cr_assert_eq(scan_bad(line, n), dup_at + 1);
    line[dup_at + 2] = 'z'; /* "kz7": no longer a duplicate of k17, but k5 still is */
    cr_assert_eq(scan_bad(line, n), dup_at + 11);
    line[dup_at + 12] = 'z';
    good(line);
    /* The top-level object, big too. */
    n = (size_t)snprintf(line, sizeof line, "{");
    for (int i = 0; i < 100; i++)
        n += (size_t)snprintf(line + n, sizeof line - n, "\"k%d\": %d, ", i, i);
    n += (size_t)snprintf(line + n, sizeof line - n, "\"tokens\": [1], \"k99\": 1}");
    scan_bad(line, n);
}

/* A token line whose "x" member nests arrays or objects so that the deepest holds 0 at depth
 * n (the top-level object is depth 1). */
static char *nested(int n, bool objects)
{
    char *s = malloc((size_t)n * 6 + 64);
    size_t k = (size_t)sprintf(s, "{\"tokens\": [1], \"x\": ");
    for (int i = 2; i < n; i++)
        k += (size_t)sprintf(s + k, objects ? "{\"a\":" : "[");
    s[k++] = '0';
    for (int i = 2; i < n; i++)
        s[k++] = objects ? '}' : ']';
    s[k++] = '}';
    s[k] = '\0';
    return s;
}

Test(jsonl_scan, depth_limit)
{
    /* jansson counts every value: n empty arrays nest to depth n, a 0 inside them to n + 1. */
    char *s = malloc(2 * JS_MAX_DEPTH + 8);
    memset(s, '[', JS_MAX_DEPTH);
    memset(s + JS_MAX_DEPTH, ']', JS_MAX_DEPTH);
    cr_assert_eq(js_scan(&sc, s, 2 * JS_MAX_DEPTH, &rec), JS_ENOTOBJ, "%s", sc.err);
    jsd_check(s, 2 * JS_MAX_DEPTH);
    memmove(s + JS_MAX_DEPTH + 1, s + JS_MAX_DEPTH, JS_MAX_DEPTH);
    s[JS_MAX_DEPTH] = '0';
    cr_assert_eq(scan_bad(s, 2 * JS_MAX_DEPTH + 1), JS_MAX_DEPTH + 1);
    free(s);
    for (int objects = 0; objects < 2; objects++) {
        char *ok = nested(JS_MAX_DEPTH, objects);
        good(ok);
        free(ok);
        char *deep = nested(JS_MAX_DEPTH + 1, objects);
        bad(deep);
        cr_assert(strstr(sc.err, "depth") != NULL, "%s", sc.err);
        free(deep);
    }
    /* Far deeper than the limit costs nothing: the scanner stops at the limit. */
    size_t n = 1 << 20;
    s = malloc(n);
    memset(s, '[', n);
    scan_bad(s, n);
    free(s);
}

Test(jsonl_scan, truncated)
{
    const char *l = "{\"tokens\": [1, 22, 333], \"model\": \"a\\u00e9\\n\", \"timestamp\": 1.5e3,"
                    " \"x\": [true, false, null, {\"y\": -0.5}]}";
    size_t len = strlen(l);
    for (size_t k = 0; k < len; k++)
        scan_bad(l, k);
    good(l);
}

Test(jsonl_scan, openai_fallback)
{
    cr_assert_eq(
        scan("{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}"),
        JS_FALLBACK);
    cr_assert_eq(rec.fields & JS_F_OPENAI, JS_F_MESSAGES);
    cr_assert_eq(scan("{\"prompt\": [1, 2]}"), JS_FALLBACK);
    cr_assert_eq(scan("{\"custom_id\": \"a\", \"body\": {\"prompt\": \"x\"}}"), JS_FALLBACK);
    cr_assert_eq(rec.fields & JS_F_OPENAI, JS_F_BODY);
    cr_assert_eq(scan("{\"x\": {\"messages\": []}, \"tokens\": [1]}"), JS_OK);
    /* A fallback line is still validated in full. */
    bad("{\"messages\": [], \"x\": [1,]}");
}

Test(jsonl_scan, record_reuse)
{
    cr_assert_eq(scan("{\"tokens\": [5, 6, 7], \"model\": \"m\"}"), JS_OK);
    cr_assert_eq(scan("{\"hash_ids\": [1]}"), JS_OK);
    cr_assert_eq(rec.tokens.kind, JS_ABSENT);
    cr_assert_eq(rec.model.kind, JS_ABSENT);
    cr_assert_eq(rec.fields, JS_F_HASH_IDS);
    cr_assert_eq(rec.tokens.bad_index, JS_NO_INDEX);
    cr_assert_neq(rec.tokens_v, NULL); /* the array is kept for the next line */
    /* A long line grows the array geometrically. */
    size_t n_tok = 100000;
    char *s = malloc(n_tok * 12 + 32);
    size_t k = (size_t)sprintf(s, "{\"tokens\": [");
    for (size_t i = 0; i < n_tok; i++)
        k += (size_t)sprintf(s + k, "%s%zu", i ? "," : "", i * 40503 % 4294967296u);
    k += (size_t)sprintf(s + k, "]}");
    cr_assert_eq(js_scan(&sc, s, k, &rec), JS_OK);
    cr_assert_eq(rec.tokens.n, n_tok);
    cr_assert(rec.tokens_cap < 2 * n_tok + 256);
    for (size_t i = 0; i < n_tok; i++)
        cr_assert_eq(rec.tokens_v[i], (uint32_t)(i * 40503 % 4294967296u));
    free(s);
}

Test(jsonl_scan, differential_generated, .timeout = 240)
{
    jsd_stats st = {0};
    uint64_t seed = 0x9E3779B97F4A7C15u;
    for (int i = 0; i < 40000; i++) {
        char line[4096];
        size_t len = jsd_generate(&seed, line, sizeof line);
        jsd_check_stats(line, len, &st);
        for (int m = 0; m < 4; m++) {
            char mut[4096 + 16];
            size_t mlen = jsd_mutate(&seed, line, len, mut, sizeof mut);
            jsd_check_stats(mut, mlen, &st);
        }
    }
    /* Both outcomes must be well represented, or the test proves little. */
    cr_assert(st.n_ok > 10000, "%zu accepted records", st.n_ok);
    cr_assert(st.n_invalid > 10000, "%zu rejected lines", st.n_invalid);
    cr_assert(st.n_fallback > 500, "%zu fallback lines", st.n_fallback);
    cr_assert(st.n_not_object > 50, "%zu non-objects", st.n_not_object);
    cr_assert(st.n_bad_element > 500, "%zu lines with a bad id", st.n_bad_element);
    cr_log_info("differential: %zu records, %zu fallback, %zu invalid, %zu not objects, %zu with "
                "a bad id",
                st.n_ok, st.n_fallback, st.n_invalid, st.n_not_object, st.n_bad_element);
}
