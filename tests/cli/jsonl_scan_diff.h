/*
 * jsonl_scan_diff.h - the differential property of the JSON Lines scanner against jansson
 * (jsd_*), shared by tests/cli/test_jsonl_scan.c and fuzz/fuzz_jsonl_scan.c, with a generator of
 * log-like lines and a byte-level mutator for the test.
 *
 * jsd_check(line, len) parses the line with jansson using the reader's flags
 * (JSON_REJECT_DUPLICATES | JSON_DECODE_ANY) and with js_scan(), and asserts:
 *   - js_scan returns JS_EJSON (with a message "invalid JSON at column N: ..." and
 *     1 <= N <= len + 1) exactly when jansson rejects the line;
 *   - JS_ENOTOBJ exactly when jansson's value is not an object;
 *   - otherwise JS_FALLBACK exactly when the object has "messages", "prompt", "body" or
 *     "retention", and
 *     for each field the scanner extracts: the JS_F_ bit is set iff the key is present; the
 *     kind is jansson's type; integers, doubles (bit for bit), booleans and decoded strings
 *     equal jansson's; an id array has jansson's length, the same first bad element (index,
 *     kind, integer value) and the same values at every valid index;
 *   - js_scanner_check passes after the call.
 * A violation prints the line and the difference to stderr and aborts. Never returns an error.
 */
#ifndef KVP_TESTS_JSONL_SCAN_DIFF_H
#define KVP_TESTS_JSONL_SCAN_DIFF_H

#include <stddef.h>
#include <stdint.h>

/* Outcomes counted by jsd_check_stats. */
typedef struct jsd_stats {
    size_t n_ok;          /* JS_OK */
    size_t n_fallback;    /* JS_FALLBACK */
    size_t n_invalid;     /* JS_EJSON */
    size_t n_not_object;  /* JS_ENOTOBJ */
    size_t n_bad_element; /* accepted lines with a bad element in an id array */
} jsd_stats;

/* Check the property above for line[0, len); aborts on a violation. */
void jsd_check(const char *line, size_t len);

/* The same, counting the outcome in *st. */
void jsd_check_stats(const char *line, size_t len, jsd_stats *st);

/* Write a random log-like line (token log, Mooncake, OpenAI, or any JSON value, mostly valid)
 * of at most cap - 1 bytes into buf, drawing from *seed. Returns its length. */
size_t jsd_generate(uint64_t *seed, char *buf, size_t cap);

/* Write a mutant of line[0, len) (bytes changed, inserted, removed, cut) of at most cap bytes
 * into out. Returns its length. */
size_t jsd_mutate(uint64_t *seed, const char *line, size_t len, char *out, size_t cap);

/* Free the scanner state jsd_check keeps between calls. */
void jsd_free(void);

#endif /* KVP_TESTS_JSONL_SCAN_DIFF_H */
