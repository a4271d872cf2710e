/*
 * jsonl_scan.h - a validating single-pass scanner for one JSON Lines record (js_*), the fast
 * path of the request-log reader for token logs and Mooncake traces.
 *
 * js_scan() reads one line (one top-level JSON value, no '\n' needed) in a single pass and
 * without building a tree. It validates the whole line as strict JSON exactly as the reader's
 * jansson call does (json_loadb with JSON_REJECT_DUPLICATES | JSON_DECODE_ANY):
 *   - RFC 8259 grammar; whitespace is space, tab, CR and LF; nothing but whitespace may follow
 *     the value;
 *   - strings: UTF-8 checked (no overlong forms, no encoded surrogates, nothing above
 *     U+10FFFF), no raw control characters, the eight escapes and \uXXXX with surrogate pairs
 *     matched; \u0000 is rejected, as jansson does without JSON_ALLOW_NUL;
 *   - numbers: an integer (no fraction, no exponent) must fit in int64_t, a real must not
 *     overflow a double (underflow to 0 is accepted), as jansson's strtoll / strtod do;
 *   - no value deeper than JS_MAX_DEPTH (jansson's JSON_PARSER_MAX_DEPTH, counted as jansson
 *     does: [[0]] has its 0 at depth 3);
 *   - duplicate keys are rejected in every object, at any depth, comparing decoded keys.
 * A UTF-8 byte order mark is not JSON: stripping it is the caller's job. One deliberate
 * difference: jansson drops a raw NUL byte that directly follows a number or a literal
 * ("[1\0]" parses); the scanner rejects every raw NUL byte.
 *
 * From a top-level object it extracts the fields the reader uses:
 *
 *   tokens, output_tokens   arrays of token ids (integers 0..2^32-1), decoded into the
 *                           record's uint32_t arrays
 *   hash_ids                array of hash ids (integers 0..2^63-1), into a uint64_t array
 *   model, adapter, tenant,
 *   cache_salt              strings (or null), as slices of the line; js_string_decode()
 *                           turns a slice into bytes
 *   timestamp, input_length,
 *   output_length           numbers, as int64_t and double
 *
 * Every other field is validated and skipped. A field of an unexpected type is not an error
 * for the scanner: its kind is recorded, and so is the first array element that is not a valid
 * id (its index, kind and value), so the caller can report it with its own words and in its
 * own order of checks. The OpenAI fields "messages", "prompt" and "body" are only noted
 * (JS_F_MESSAGES ...): such a line is fully validated and then js_scan() returns JS_FALLBACK,
 * meaning "valid JSON, but parse it with jansson" (the OpenAI renderer needs a tree).
 *
 * Memory: the record's three arrays (4 bytes per token id, 8 per hash id, grown geometrically
 * from 16 elements, reused across lines, owned by the caller) and the scanner's key set for
 * duplicate detection: 8 bytes per key of the objects open at one time, plus a fixed 8 KiB.
 * Nothing else grows with the line; no allocation per element. Worst case, since an element
 * takes at least 2 bytes of JSON ("0,") and a key at least 5 ("\"\":0,"), and capacities at
 * most double: 4 bytes per line byte for token ids, 8 for hash ids, 3.2 for keys. Measured
 * (bench/bench_jsonl_scan.c): 1.1 bytes per line byte on token-log lines, against 7.5 for
 * jansson's tree (allocator bytes, same lines).

 * Errors: JS_EJSON with a message "invalid JSON at column N: what is wrong" (N is the 1-based
 * byte column of the offending byte), JS_ENOTOBJ ("each line must be a JSON object, not an
 * array"), JS_ENOMEM; the caller prefixes "FILE:LINE: ".
 *
 * Use in the log reader (logread.c), replacing json_loadb for every line unless the format
 * is forced to OpenAI:
 *   1. rc = js_scan(&scanner, line, len, &rec). JS_EJSON / JS_ENOTOBJ: report scanner.err as
 *      the line's error; JS_ENOMEM: the reader's out-of-memory error. JS_FALLBACK: parse the
 *      line with jansson and take today's path unchanged (format detection included, so a
 *      line with both "tokens" and "messages" gets today's message).
 *   2. JS_OK: the format is JS_F_TOKENS / JS_F_HASH_IDS of rec.fields (both or neither: the
 *      detect_format messages, with "messages/prompt" never set).
 *   3. In today's order, the same checks on kinds instead of json_t types (js_kind_name gives
 *      today's words): model, adapter, tenant, cache_salt (JS_ABSENT or JS_NULL: none;
 *      JS_STRING: js_string_decode(&v, (char *)v.str) decodes in place in the reader's line
 *      buffer, NUL-terminated, valid until the next line); timestamp (JS_INT or JS_REAL: .d);
 *      tokens / output_tokens / hash_ids (kind JS_ARRAY, then bad_index with bad_kind and
 *      bad_int give "tokens[i] = v is outside the token id range" or "tokens[i] must be an
 *      integer token id, not ..."; the ids are rec.tokens_v[0, n) etc.); input_length and
 *      output_length (JS_INT and .i).
 */
#ifndef KVP_CLI_JSONL_SCAN_H
#define KVP_CLI_JSONL_SCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The deepest value accepted, counted as jansson does: the top-level value is at depth 1 and
 * every value, scalar or not, one deeper than its container. */
#define JS_MAX_DEPTH 2048
#define JS_MAX_LINE  UINT32_MAX   /* longest line js_scan() accepts, in bytes */
#define JS_NO_INDEX  ((size_t)-1) /* js_array.bad_index when every element is valid */

enum {
    JS_OK = 0,       /* a valid top-level object without OpenAI fields: *rec is filled */
    JS_FALLBACK = 1, /* a valid top-level object with "messages", "prompt", "body" or
                        "retention": parse it with jansson; *rec is filled all the same */
    JS_EJSON = -1,   /* not valid JSON (or over JS_MAX_DEPTH, or a duplicate key) */
    JS_ENOTOBJ = -2, /* valid JSON, but not an object */
    JS_ENOMEM = -3   /* out of memory for the arrays or the key set, or a line over
                        JS_MAX_LINE bytes */
};

/* The kind of a JSON value, as the reader names them in messages (js_kind_name). */
typedef enum js_kind {
    JS_ABSENT = 0, /* the field is not in the line */
    JS_NULL,
    JS_BOOL,
    JS_INT,  /* a number without fraction or exponent (jansson's JSON_INTEGER) */
    JS_REAL, /* any other number (JSON_REAL) */
    JS_STRING,
    JS_ARRAY,
    JS_OBJECT
} js_kind;

/* Bits of js_record.fields: which extracted or noted top-level keys the line holds. */
enum {
    JS_F_TOKENS = 1u << 0,
    JS_F_OUTPUT_TOKENS = 1u << 1,
    JS_F_HASH_IDS = 1u << 2,
    JS_F_MODEL = 1u << 3,
    JS_F_ADAPTER = 1u << 4,
    JS_F_TENANT = 1u << 5,
    JS_F_CACHE_SALT = 1u << 6,
    JS_F_TIMESTAMP = 1u << 7,
    JS_F_INPUT_LENGTH = 1u << 8,
    JS_F_OUTPUT_LENGTH = 1u << 9,
    JS_F_MESSAGES = 1u << 10, /* OpenAI chat body */
    JS_F_PROMPT = 1u << 11,   /* OpenAI completions body */
    JS_F_BODY = 1u << 12,     /* Batch API wrapper (its content is not looked at) */
    JS_F_OPENAI = JS_F_MESSAGES | JS_F_PROMPT | JS_F_BODY,
    JS_F_RETENTION = 1u << 13 /* retention priorities (logread.h): read by jansson too */
};

/* A scalar or string field. */
typedef struct js_value {
    js_kind kind;    /* JS_ABSENT when the key is not in the line */
    size_t column;   /* 1-based byte column where the value starts (0 when absent) */
    bool b;          /* JS_BOOL: the value */
    int64_t i;       /* JS_INT: the value */
    double d;        /* JS_INT or JS_REAL: the value as a double (strtod's rounding) */
    const char *str; /* JS_STRING: the raw bytes between the quotes, inside the line */
    size_t str_len;  /* JS_STRING: bytes at str (the decoded string is never longer) */
    bool escaped;    /* JS_STRING: str holds escapes, so decode it with js_string_decode */
} js_value;

/* The shape of an id-array field; its elements are in the record's v array. */
typedef struct js_array {
    js_kind kind;     /* JS_ABSENT, JS_ARRAY, or the kind of a value that is not an array */
    size_t column;    /* 1-based byte column where the value starts (0 when absent) */
    size_t n;         /* JS_ARRAY: number of elements (valid or not) */
    size_t bad_index; /* first element that is not a valid id, or JS_NO_INDEX */
    js_kind bad_kind; /* its kind: JS_INT when it is an integer out of range */
    int64_t bad_int;  /* its value when bad_kind is JS_INT */
} js_array;

/* What js_scan() extracted from one line. Zero it (or js_record_init) before the first line
 * and reuse it: the arrays below belong to the caller, grow with realloc to the largest line
 * and are kept; js_record_free releases them. */
typedef struct js_record {
    unsigned fields;           /* JS_F_* bits of the top-level keys present */
    js_array tokens;           /* "tokens" */
    js_array output_tokens;    /* "output_tokens" */
    js_array hash_ids;         /* "hash_ids" */
    uint32_t *tokens_v;        /* tokens: the first tokens.n elements are valid when the field
                                  is an array and bad_index is JS_NO_INDEX */
    size_t tokens_cap;         /* elements allocated at tokens_v */
    uint32_t *output_tokens_v; /* output_tokens, as tokens_v */
    size_t output_tokens_cap;  /* elements allocated at output_tokens_v */
    uint64_t *hash_ids_v;      /* hash_ids, as tokens_v (ids 0..2^63-1) */
    size_t hash_ids_cap;       /* elements allocated at hash_ids_v */
    js_value model;            /* "model" */
    js_value adapter;          /* "adapter" */
    js_value tenant;           /* "tenant" */
    js_value cache_salt;       /* "cache_salt" */
    js_value timestamp;        /* "timestamp" */
    js_value input_length;     /* "input_length" */
    js_value output_length;    /* "output_length" */
} js_record;

/* One key of an open object, for duplicate detection. */
typedef struct js_key {
    uint32_t hash; /* hash of the decoded key */
    uint32_t off;  /* offset of its opening quote in the line */
} js_key;

/* The scanner: scratch state reused across lines. Zero it (or js_scanner_init) before use
 * and release it with js_scanner_free. */
typedef struct js_scanner {
    js_key *keys;                        /* keys of the open objects, outermost first */
    size_t n_keys;                       /* keys held (inside a js_scan call) */
    size_t keys_cap;                     /* elements allocated at keys */
    uint32_t key_base[JS_MAX_DEPTH + 1]; /* per open object: index of its first key */
    size_t err_column;                   /* column of the last error (0 when none) */
    bool err_utf8;                       /* the last JS_EJSON was invalid UTF-8 */
    char err[256];                       /* the last error message; "" after success */
} js_scanner;

/* Zero a scanner or a record. Cannot fail (accept NULL). */
void js_scanner_init(js_scanner *s);
void js_record_init(js_record *rec);

/* Free what they hold and zero them. Accept NULL. */
void js_scanner_free(js_scanner *s);
void js_record_free(js_record *rec);

/* Scan line[0, len) (it need not be NUL-terminated and may hold NUL bytes, which are invalid
 * JSON). Returns JS_OK or JS_FALLBACK with *rec filled (fields not in the line are JS_ABSENT);
 * JS_EJSON, JS_ENOTOBJ or JS_ENOMEM with s->err and s->err_column set, and then *rec holds
 * whatever was extracted before the error (its arrays stay valid and owned by the caller).
 * Slices in *rec point into line. */
int js_scan(js_scanner *s, const char *line, size_t len, js_record *rec);

/* Decode a JS_STRING value into dst, which has room for v->str_len + 1 bytes, and
 * NUL-terminate it; dst may be v->str itself (decoding in place never overtakes reading).
 * Returns the decoded length (the bytes may include no NUL: js_scan rejects \u0000). Only for
 * values returned by a successful js_scan. Cannot fail. */
size_t js_string_decode(const js_value *v, char *dst);

/* The reader's name of a kind in messages ("an array", "a non-integer number", "null" ...):
 * a static string. Cannot fail. */
const char *js_kind_name(js_kind kind);

/* Check a scanner's invariants (between calls: no keys held, the message NUL-terminated).
 * Returns 0 or -1. */
int js_scanner_check(const js_scanner *s);

#endif /* KVP_CLI_JSONL_SCAN_H */
