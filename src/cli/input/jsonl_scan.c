/*
 * jsonl_scan.c - the single-pass JSON Lines scanner (contract in jsonl_scan.h).
 *
 * Layout. A cursor walks the line once, left to right, and never backs up except to re-read a
 * number that turned out to be a real. The top-level object is walked by scan_object_top(),
 * which looks each key up in a small table of known fields and hands the value to a typed
 * reader: the hot id arrays go to scan_ids(), whose loop reads integers straight into the
 * caller's array; every other value goes to skip_value(), an iterative validator whose only
 * stack is the scanner's key_base[] (one slot per open container, UINT32_MAX for an array):
 *
 *     line:     {"tokens": [1, 2, 3], "meta": {"a": [true], "b": {"a": 1}}, "model": "m"}
 *     depth:    1          2             1      2     3          3            1
 *     keys[]:   tokens meta | a b | a           (each object's keys, outermost first)
 *     key_base: [1]=0       [2]=2   [3]=4       (where each open object's keys begin)
 *
 * Duplicate keys. Each key is pushed as (hash of its decoded bytes, offset of its quote). While
 * an object has at most DUP_LINEAR keys a new key is compared with the others at once (hash
 * first, then the decoded bytes); a bigger object is checked when it closes, by heap-sorting
 * its keys by (hash, decoded bytes, offset), so that equal keys are neighbours, in
 * O(k log k) with no memory beyond the keys. Either way the error names the first key, in
 * line order, that repeats an earlier one. An object's keys are popped when it closes, so the
 * key set holds only the keys of the objects open at one time.
 *
 * Numbers follow jansson: an integer must fit in int64_t (19 digits at most, checked
 * without overflow); a real is rejected when strtod would return +-HUGE_VAL. That is decided
 * from the decimal exponent of the first significant digit, and only a number within a factor
 * of ten of DBL_MAX is handed to strtod, normalized to at most MAX_SIG significant digits plus
 * a sticky digit (enough to round as the whole text would: every halfway point between two
 * doubles has fewer than 770 significant digits).
 *
 * Invariants (between calls): n_keys == 0; keys == NULL exactly when keys_cap == 0; err is
 * NUL-terminated. Inside a call: the keys of the object open at depth d are keys[key_base[d],
 * key_base[d + 1]) (or up to n_keys for the innermost); the cursor never passes end.
 *
 * Cost: O(len) time, plus O(k log k) for each object with k > DUP_LINEAR keys. The id loop
 * in scan_ids keeps the cursor in a local and reads plain ids without the general number
 * path: bench/bench_jsonl_scan.c measures 750 MB/s of CPU time on token-log lines, 15x
 * jansson's json_loadb on the same lines (figures in its opening comment).
 */
#include "jsonl_scan.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DUP_LINEAR 32         /* objects up to this many keys are checked key by key */
#define MAX_SIG    780        /* significant digits kept when a real goes to strtod */
#define ARRAY_SLOT UINT32_MAX /* key_base value of an open array */

/* The cursor over one line. */
typedef struct cur {
    const unsigned char *p;   /* next byte to read; beg <= p <= end */
    const unsigned char *beg; /* the line's first byte */
    const unsigned char *end; /* one past the line's last byte */
    js_scanner *s;            /* scratch state and error message */
    js_record *rec;           /* what the line yields */
    unsigned depth;           /* containers open around p (0 at the top) */
} cur;

/* A number just read. */
typedef struct num {
    bool is_int;                /* no fraction and no exponent */
    int64_t i;                  /* the value when is_int */
    const unsigned char *start; /* its first byte */
    size_t len;                 /* its bytes */
} num;

/* The known top-level fields: the name and its JS_F_ bit; field_value and field_array find
 * where the value goes. */
typedef struct known {
    const char *name; /* the key */
    unsigned len;     /* strlen(name) */
    unsigned bit;     /* JS_F_* */
} known;

#define KNOWN(name, bit)                                                                           \
    {                                                                                              \
        name, sizeof name - 1, bit                                                                 \
    }
static const known known_fields[] = {
    KNOWN("tokens", JS_F_TOKENS),
    KNOWN("output_tokens", JS_F_OUTPUT_TOKENS),
    KNOWN("hash_ids", JS_F_HASH_IDS),
    KNOWN("model", JS_F_MODEL),
    KNOWN("adapter", JS_F_ADAPTER),
    KNOWN("tenant", JS_F_TENANT),
    KNOWN("cache_salt", JS_F_CACHE_SALT),
    KNOWN("timestamp", JS_F_TIMESTAMP),
    KNOWN("input_length", JS_F_INPUT_LENGTH),
    KNOWN("output_length", JS_F_OUTPUT_LENGTH),
    KNOWN("messages", JS_F_MESSAGES),
    KNOWN("prompt", JS_F_PROMPT),
    KNOWN("body", JS_F_BODY),
    KNOWN("retention", JS_F_RETENTION),
};
#define N_KNOWN       (sizeof known_fields / sizeof known_fields[0])
#define KNOWN_MAX_LEN 15 /* longer keys are not known fields */

static inline bool is_ws(unsigned char ch)
{
    return ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t';
}

static inline bool is_digit(unsigned char ch)
{
    return ch >= '0' && ch <= '9';
}

static inline void skip_ws(cur *c)
{
    while (c->p < c->end && is_ws(*c->p))
        c->p++;
}

static inline size_t column(const cur *c, const unsigned char *at)
{
    return (size_t)(at - c->beg) + 1;
}

static int fail(cur *c, const unsigned char *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Set "invalid JSON at column N: ..." for the byte at `at`. Returns JS_EJSON. */
static int fail(cur *c, const unsigned char *at, const char *fmt, ...)
{
    char msg[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->s->err_column = column(c, at);
    snprintf(c->s->err, sizeof c->s->err, "invalid JSON at column %zu: %s", c->s->err_column, msg);
    return JS_EJSON;
}

/* Report invalid UTF-8 at `at`, in the words logread uses for jansson's UTF-8 errors. */
static int fail_utf8(cur *c, const unsigned char *at)
{
    c->s->err_utf8 = true;
    return fail(c, at,
                "the line is not valid UTF-8 (unable to decode byte 0x%02x); JSON text "
                "must be UTF-8",
                *at);
}

static size_t utf8_len(const unsigned char *p, const unsigned char *end);

/* Report an unexpected byte (or the end of the line) where `what` was expected. */
static int fail_unexpected(cur *c, const char *what)
{
    if (c->p >= c->end)
        return fail(c, c->p, "unexpected end of line, %s expected", what);
    unsigned char ch = *c->p;
    if (ch >= 0x80 && utf8_len(c->p, c->end) == 0)
        return fail_utf8(c, c->p);
    if (ch == 0xEF && c->end - c->p >= 3 && c->p[1] == 0xBB && c->p[2] == 0xBF)
        return fail(c, c->p, "unexpected UTF-8 byte order mark, %s expected", what);
    if (ch >= 0x80)
        return fail(c, c->p, "unexpected non-ASCII character, %s expected", what);
    if (ch < 0x20 || ch == 0x7f)
        return fail(c, c->p, "unexpected byte 0x%02x, %s expected", ch, what);
    return fail(c, c->p, "unexpected '%c', %s expected", ch, what);
}

/* Length of the valid UTF-8 sequence of 2-4 bytes at p (p < end, *p >= 0x80), or 0 when it is
 * not one (overlong, an encoded surrogate, above U+10FFFF, truncated). Cannot fail. */
static size_t utf8_len(const unsigned char *p, const unsigned char *end)
{
    unsigned char b = p[0];
    size_t n = b >= 0xC2 && b <= 0xDF   ? 2
               : b >= 0xE0 && b <= 0xEF ? 3
               : b >= 0xF0 && b <= 0xF4 ? 4
                                        : 0;
    if (n == 0 || (size_t)(end - p) < n)
        return 0;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (b == 0xE0)
        lo = 0xA0;
    else if (b == 0xED)
        hi = 0x9F;
    else if (b == 0xF0)
        lo = 0x90;
    else if (b == 0xF4)
        hi = 0x8F;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t k = 2; k < n; k++)
        if ((p[k] & 0xC0) != 0x80)
            return 0;
    return n;
}

static int hex4(const unsigned char *p, const unsigned char *end, unsigned *out)
{
    if (end - p < 4)
        return -1;
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char ch = p[k];
        unsigned d = is_digit(ch)             ? (unsigned)(ch - '0')
                     : ch >= 'a' && ch <= 'f' ? (unsigned)(ch - 'a' + 10)
                     : ch >= 'A' && ch <= 'F' ? (unsigned)(ch - 'A' + 10)
                                              : 16u;
        if (d == 16)
            return -1;
        v = v * 16 + d;
    }
    *out = v;
    return 0;
}

/* Encode code point cp (<= 0x10FFFF, not a surrogate) as UTF-8 into out. Returns the length. */
static size_t utf8_put(unsigned cp, unsigned char *out)
{
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | cp >> 6);
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | cp >> 18);
    out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decode the escape at p (p[0] == '\\') of an already validated string into out[0..4).
 * Returns the bytes written and sets *next past the escape. Cannot fail. */
static size_t escape_decode(const unsigned char *p, const unsigned char **next, unsigned char *out)
{
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *k = strchr(from, p[1]);
    if (p[1] != 'u' && k != NULL) {
        out[0] = (unsigned char)to[k - from];
        *next = p + 2;
        return 1;
    }
    unsigned cp = 0, lo = 0;
    hex4(p + 2, p + 6, &cp);
    *next = p + 6;
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        hex4(p + 8, p + 12, &lo);
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        *next = p + 12;
    }
    return utf8_put(cp, out);
}

/* Validate the escape at c->p (*c->p == '\\'), leave c->p after it. Returns 0 or JS_EJSON. */
static int escape_check(cur *c)
{
    const unsigned char *at = c->p;
    if (c->end - at < 2)
        return c->p = c->end, fail_unexpected(c, "an escape");
    if (at[1] != 'u') {
        if (strchr("\"\\/bfnrt", at[1]) == NULL || at[1] == '\0')
            return fail(c, at, "invalid escape '\\%c'",
                        at[1] >= 0x20 && at[1] < 0x7f ? at[1] : '?');
        c->p = at + 2;
        return 0;
    }
    unsigned cp, lo;
    if (hex4(at + 2, c->end, &cp) != 0)
        return fail(c, at, "invalid \\u escape: four hex digits expected");
    if (cp == 0)
        return fail(c, at, "\\u0000 is not allowed in a string");
    if (cp >= 0xDC00 && cp <= 0xDFFF)
        return fail(c, at, "invalid \\u escape: lone low surrogate \\u%04X", cp);
    c->p = at + 6;
    if (cp < 0xD800 || cp > 0xDBFF)
        return 0;
    if (c->end - c->p < 6 || c->p[0] != '\\' || c->p[1] != 'u' ||
        hex4(c->p + 2, c->end, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF)
        return fail(c, at, "invalid \\u escape: high surrogate \\u%04X without its low half", cp);
    c->p += 6;
    return 0;
}

/* Validate the string at c->p (*c->p == '"') and leave c->p after its closing quote; set
 * *escaped when it holds escapes. Returns 0 or JS_EJSON. */
static int scan_string(cur *c, bool *escaped)
{
    const unsigned char *p = c->p + 1, *end = c->end;
    bool esc = false;
    for (;;) {
        while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\')
            p++;
        if (p >= end)
            return c->p = end, fail_unexpected(c, "a closing '\"'");
        if (*p == '"')
            break;
        if (*p == '\\') {
            c->p = p;
            int rc = escape_check(c);
            if (rc != 0)
                return rc;
            p = c->p;
            esc = true;
        } else if (*p >= 0x80) {
            size_t n = utf8_len(p, end);
            if (n == 0)
                return fail_utf8(c, p);
            p += n;
        } else {
            return fail(c, p, "control character 0x%02x in a string (escape it)", *p);
        }
    }
    c->p = p + 1;
    *escaped = esc;
    return 0;
}

/* Iterator over the decoded bytes of a validated string, for key comparisons. */
typedef struct kit {
    const unsigned char *p; /* next raw byte */
    unsigned char buf[4];   /* bytes of the escape being handed out */
    size_t n, i;            /* buf holds n bytes, i handed out */
} kit;

/* The next decoded byte, or -1 at the closing quote. Cannot fail. */
static int kit_next(kit *k)
{
    if (k->i < k->n)
        return k->buf[k->i++];
    if (*k->p == '"')
        return -1;
    if (*k->p != '\\')
        return *k->p++;
    k->n = escape_decode(k->p, &k->p, k->buf);
    k->i = 1;
    return k->buf[0];
}

/* Compare the decoded keys whose quotes are at a and b: <0, 0 or >0. Cannot fail. */
static int key_cmp(const unsigned char *a, const unsigned char *b)
{
    kit x = {a + 1, {0}, 0, 0}, y = {b + 1, {0}, 0, 0};
    for (;;) {
        int u = kit_next(&x), v = kit_next(&y);
        if (u != v || u < 0)
            return u - v;
    }
}

/* FNV-1a over the decoded bytes of the validated string whose quote is at q. */
static uint32_t key_hash(const unsigned char *q, size_t *n_decoded, unsigned char *head,
                         size_t head_size)
{
    kit k = {q + 1, {0}, 0, 0};
    uint32_t h = 2166136261u;
    size_t n = 0;
    for (int b; (b = kit_next(&k)) >= 0; n++) {
        h = (h ^ (uint32_t)b) * 16777619u;
        if (n < head_size)
            head[n] = (unsigned char)b;
    }
    *n_decoded = n;
    return h;
}

/* Order keys by (hash, decoded bytes, offset). */
static int key_order(const unsigned char *beg, const js_key *a, const js_key *b)
{
    if (a->hash != b->hash)
        return a->hash < b->hash ? -1 : 1;
    int r = key_cmp(beg + a->off, beg + b->off);
    if (r != 0)
        return r;
    return a->off < b->off ? -1 : a->off > b->off;
}

static void sift_down(const unsigned char *beg, js_key *v, size_t i, size_t n)
{
    for (size_t child; (child = 2 * i + 1) < n; i = child) {
        if (child + 1 < n && key_order(beg, &v[child], &v[child + 1]) < 0)
            child++;
        if (key_order(beg, &v[i], &v[child]) >= 0)
            return;
        js_key t = v[i];
        v[i] = v[child];
        v[child] = t;
    }
}

/* Check the keys of the object closing at c->depth (more than DUP_LINEAR of them) for
 * duplicates by heap-sorting them. Returns 0 or JS_EJSON naming the first repeated key. */
static int dup_check_sorted(cur *c)
{
    js_key *v = c->s->keys + c->s->key_base[c->depth];
    size_t n = c->s->n_keys - c->s->key_base[c->depth];
    for (size_t i = n / 2; i-- > 0;)
        sift_down(c->beg, v, i, n);
    for (size_t m = n; m-- > 1;) {
        js_key t = v[0];
        v[0] = v[m];
        v[m] = t;
        sift_down(c->beg, v, 0, m);
    }
    uint32_t first = UINT32_MAX; /* offset of the earliest second occurrence */
    for (size_t i = 1; i < n; i++)
        if (v[i].hash == v[i - 1].hash && key_cmp(c->beg + v[i].off, c->beg + v[i - 1].off) == 0 &&
            (i < 2 || v[i - 2].hash != v[i].hash ||
             key_cmp(c->beg + v[i].off, c->beg + v[i - 2].off) != 0) &&
            v[i].off < first)
            first = v[i].off;
    if (first == UINT32_MAX)
        return 0;
    return fail(c, c->beg + first, "duplicate object key");
}

/* Push the key whose quote is at q (hash h) on the open object's key set, checking it against
 * the object's earlier keys while it has at most DUP_LINEAR. Returns 0, JS_EJSON (duplicate)
 * or JS_ENOMEM. */
static int key_push(cur *c, const unsigned char *q, uint32_t h)
{
    js_scanner *s = c->s;
    size_t base = s->key_base[c->depth];
    if (s->n_keys - base < DUP_LINEAR) {
        for (size_t i = base; i < s->n_keys; i++)
            if (s->keys[i].hash == h && key_cmp(c->beg + s->keys[i].off, q) == 0)
                return fail(c, q, "duplicate object key");
    }
    if (s->n_keys == s->keys_cap) {
        size_t ncap = s->keys_cap == 0 ? 16 : s->keys_cap * 2;
        js_key *k = ncap <= SIZE_MAX / sizeof *k ? realloc(s->keys, ncap * sizeof *k) : NULL;
        if (k == NULL) {
            s->err_column = column(c, q);
            snprintf(s->err, sizeof s->err, "out of memory for the keys of a line");
            return JS_ENOMEM;
        }
        s->keys = k;
        s->keys_cap = ncap;
    }
    s->keys[s->n_keys].hash = h;
    s->keys[s->n_keys].off = (uint32_t)(q - c->beg);
    s->n_keys++;
    return 0;
}

/* Close the object at c->depth: check it for duplicates if it is big, pop its keys, and leave
 * the depth. Returns 0 or JS_EJSON. */
static int object_close(cur *c)
{
    js_scanner *s = c->s;
    size_t base = s->key_base[c->depth];
    if (s->n_keys - base > DUP_LINEAR) {
        int rc = dup_check_sorted(c);
        if (rc != 0)
            return rc;
    }
    s->n_keys = base;
    c->depth--;
    return 0;
}

/* Open an object or array at c->p ('{' or '['). Returns 0 or JS_EJSON (too deep). */
static int container_open(cur *c, bool object)
{
    if (c->depth >= JS_MAX_DEPTH)
        return fail(c, c->p, "maximum nesting depth %d exceeded", JS_MAX_DEPTH);
    c->depth++;
    c->s->key_base[c->depth] = object ? (uint32_t)c->s->n_keys : ARRAY_SLOT;
    c->p++;
    return 0;
}

/* Read a key at c->p (whitespace skipped), push it, and read the ':' and the whitespace after
 * it. With head non-NULL, copy up to KNOWN_MAX_LEN + 1 decoded bytes there and set *n_key to
 * its decoded length. Returns 0, JS_EJSON or JS_ENOMEM. */
static int scan_key(cur *c, unsigned char *head, size_t *n_key)
{
    if (c->p >= c->end || *c->p != '"')
        return fail_unexpected(c, "a key string");
    const unsigned char *q = c->p;
    bool esc;
    int rc = scan_string(c, &esc);
    if (rc != 0)
        return rc;
    size_t n;
    unsigned char buf[KNOWN_MAX_LEN + 1];
    uint32_t h = key_hash(q, &n, head != NULL ? head : buf, KNOWN_MAX_LEN + 1);
    if (n_key != NULL)
        *n_key = n;
    if ((rc = key_push(c, q, h)) != 0)
        return rc;
    skip_ws(c);
    if (c->p >= c->end || *c->p != ':')
        return fail_unexpected(c, "':'");
    c->p++;
    skip_ws(c);
    return 0;
}

/* Whether the real at s[0, len) overflows a double as strtod sees it (see the file comment).
 * With value non-NULL, also store strtod's value there. Cannot fail. */
static bool real_value(const unsigned char *s, size_t len, double *value)
{
    char buf[MAX_SIG + 40];
    const unsigned char *p = s, *e = s + len;
    size_t k = 0, nd = 0;
    bool sig = false, sticky = false;
    long long e10 = 0, ex = 0;
    if (*p == '-')
        buf[k++] = (char)*p++;
    buf[k++] = '0';
    buf[k++] = '.';
    for (bool frac = false; p < e && (is_digit(*p) || (*p == '.' && !frac)); p++) {
        if (*p == '.') {
            frac = true;
            continue;
        }
        if (!sig && *p == '0') {
            e10 -= frac;
            continue;
        }
        sig = true;
        e10 += !frac;
        if (nd < MAX_SIG)
            buf[k++] = (char)*p, nd++;
        else if (*p != '0')
            sticky = true;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        bool neg = *++p == '-';
        p += *p == '-' || *p == '+';
        for (; p < e; p++)
            if (ex < 1000000000)
                ex = ex * 10 + (*p - '0');
        e10 += neg ? -ex : ex;
    }
    if (!sig) { /* all digits zero */
        if (value != NULL)
            *value = s[0] == '-' ? -0.0 : 0.0;
        return false;
    }
    if (value == NULL && e10 <= 308) /* below 10^308 < DBL_MAX */
        return false;
    if (value == NULL && e10 >= 310) /* at least 10^309 */
        return true;
    if (sticky)
        buf[k++] = '1';
    snprintf(buf + k, sizeof buf - k, "e%lld", e10);
    double d = strtod(buf, NULL);
    if (value != NULL)
        *value = d;
    return isinf(d);
}

/* Read the number at c->p (a '-' or a digit) into *n, leaving c->p after it. Returns 0 or
 * JS_EJSON (bad grammar, an integer outside int64_t, a real that overflows). */
static int scan_number(cur *c, num *n)
{
    const unsigned char *p = c->p, *end = c->end, *start = p;
    bool neg = *p == '-';
    p += neg;
    if (p >= end || !is_digit(*p))
        return c->p = p, fail_unexpected(c, "a digit");
    uint64_t u = 0;
    const unsigned char *d0 = p;
    if (*p == '0') {
        p++;
        if (p < end && is_digit(*p))
            return fail(c, p - 1, "leading zero in a number");
    } else {
        for (; p < end && is_digit(*p); p++)
            if (p - d0 < 19)
                u = u * 10 + (uint64_t)(*p - '0');
    }
    size_t n_dig = (size_t)(p - d0);
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) {
        if (*p == '.') {
            const unsigned char *f = ++p;
            while (p < end && is_digit(*p))
                p++;
            if (p == f)
                return c->p = p, fail_unexpected(c, "a digit after '.'");
        }
        if (p < end && (*p == 'e' || *p == 'E')) {
            p++;
            p += p < end && (*p == '+' || *p == '-');
            const unsigned char *x = p;
            while (p < end && is_digit(*p))
                p++;
            if (p == x)
                return c->p = p, fail_unexpected(c, "a digit in the exponent");
        }
        n->is_int = false;
        n->start = start;
        n->len = (size_t)(p - start);
        if (real_value(start, n->len, NULL))
            return fail(c, start, "real number overflow");
        c->p = p;
        return 0;
    }
    uint64_t lim = neg ? UINT64_C(9223372036854775808) : UINT64_C(9223372036854775807);
    if (n_dig > 19 || u > lim)
        return fail(c, start, neg ? "too big negative integer" : "too big integer");
    n->is_int = true;
    n->i = neg ? (int64_t)(0 - u) : (int64_t)u;
    n->start = start;
    n->len = (size_t)(p - start);
    c->p = p;
    return 0;
}

/* Read the literal true, false or null at c->p. Returns 0 (kind in *kind) or JS_EJSON. */
static int scan_literal(cur *c, js_kind *kind, bool *b)
{
    static const char *const words[] = {"true", "false", "null"};
    for (int w = 0; w < 3; w++) {
        size_t n = strlen(words[w]);
        if ((size_t)(c->end - c->p) >= n && memcmp(c->p, words[w], n) == 0) {
            c->p += n;
            *kind = w == 2 ? JS_NULL : JS_BOOL;
            *b = w == 0;
            return 0;
        }
    }
    return fail_unexpected(c, "a value");
}

/* After a value inside the containers above `floor`: read ',' (then the next key in an
 * object) or the closers. Sets *done when depth is back to floor. Returns 0 or an error. */
static int after_value(cur *c, unsigned floor, bool *done)
{
    while (c->depth > floor) {
        skip_ws(c);
        bool object = c->s->key_base[c->depth] != ARRAY_SLOT;
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            skip_ws(c);
            *done = false;
            return object ? scan_key(c, NULL, NULL) : 0;
        }
        if (c->p < c->end && *c->p == (object ? '}' : ']')) {
            c->p++;
            int rc = object ? object_close(c) : (c->depth--, 0);
            if (rc != 0)
                return rc;
            continue;
        }
        return fail_unexpected(c, object ? "',' or '}'" : "',' or ']'");
    }
    *done = true;
    return 0;
}

/* Validate one value of any kind at c->p (whitespace skipped), leaving c->p after it, with no
 * recursion: containers are tracked in key_base. Returns 0, JS_EJSON or JS_ENOMEM. */
static int skip_value(cur *c)
{
    unsigned floor = c->depth;
    for (bool done = false; !done;) {
        int rc = 0;
        if (c->p >= c->end)
            return fail_unexpected(c, "a value");
        if (c->depth >= JS_MAX_DEPTH)
            return fail(c, c->p, "maximum nesting depth %d exceeded", JS_MAX_DEPTH);
        unsigned char ch = *c->p;
        if (ch == '{' || ch == '[') {
            if ((rc = container_open(c, ch == '{')) != 0)
                return rc;
            skip_ws(c);
            if (c->p < c->end && *c->p == (ch == '{' ? '}' : ']')) {
                c->p++;
                c->depth--;
            } else {
                if (ch == '{' && (rc = scan_key(c, NULL, NULL)) != 0)
                    return rc;
                continue;
            }
        } else if (ch == '"') {
            bool esc;
            rc = scan_string(c, &esc);
        } else if (ch == '-' || is_digit(ch)) {
            num n;
            rc = scan_number(c, &n);
        } else {
            js_kind k;
            bool b;
            rc = scan_literal(c, &k, &b);
        }
        if (rc != 0 || (rc = after_value(c, floor, &done)) != 0)
            return rc;
    }
    return 0;
}

/* The kind of the value starting with byte ch (which must start a valid value). */
static js_kind kind_of(unsigned char ch, const num *n)
{
    switch (ch) {
    case '{':
        return JS_OBJECT;
    case '[':
        return JS_ARRAY;
    case '"':
        return JS_STRING;
    case 'n':
        return JS_NULL;
    case 't':
    case 'f':
        return JS_BOOL;
    default:
        return n != NULL && n->is_int ? JS_INT : JS_REAL;
    }
}

/* Make room for element n of an id array. n may be past the capacity by more than one
 * (bad elements count in n without a slot being reserved for them), so the capacity
 * doubles until it holds n. Returns 0 or JS_ENOMEM. */
static int ids_reserve(cur *c, void **v, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return 0;
    size_t ncap = *cap < 16 ? 16 : *cap;
    while (ncap <= n && ncap <= SIZE_MAX / 2)
        ncap *= 2;
    void *p = ncap > n && ncap <= SIZE_MAX / elem ? realloc(*v, ncap * elem) : NULL;
    if (p == NULL) {
        c->s->err_column = column(c, c->p);
        snprintf(c->s->err, sizeof c->s->err, "out of memory for %zu array elements", n + 1);
        return JS_ENOMEM;
    }
    *v = p;
    *cap = ncap;
    return 0;
}

/* Read one element of an id array at c->p into slot n of *v (elem 4: uint32 token ids,
 * 8: uint64 hash ids), or note it in *a as the first bad element. Returns 0 or an error. */
static int scan_id(cur *c, js_array *a, void **v, size_t *cap, size_t elem)
{
    unsigned char ch = *c->p;
    num n = {0};
    int rc = ch == '-' || is_digit(ch) ? scan_number(c, &n) : skip_value(c);
    if (rc != 0)
        return rc;
    bool ok = n.is_int && n.i >= 0 && (elem == 8 || n.i <= (int64_t)UINT32_MAX);
    if (ok) {
        if ((rc = ids_reserve(c, v, cap, a->n, elem)) != 0)
            return rc;
        if (elem == 4)
            ((uint32_t *)*v)[a->n] = (uint32_t)n.i;
        else
            ((uint64_t *)*v)[a->n] = (uint64_t)n.i;
    } else if (a->bad_index == JS_NO_INDEX) {
        a->bad_index = a->n;
        a->bad_kind = kind_of(ch, &n);
        a->bad_int = n.is_int ? n.i : 0;
    }
    a->n++;
    return 0;
}

/* Read one id whose first byte is '1'..'9' at p, the hot case: at most 18 digits, not
 * followed by a digit, '.', 'e' or 'E', and within range (elem 4: below 2^32). Returns the
 * byte after it with the value in *u, or NULL when the id needs the general path (scan_id).
 * Cannot fail. */
static inline const unsigned char *fast_id(const unsigned char *p, const unsigned char *end,
                                           size_t elem, uint64_t *u)
{
    const unsigned char *lim = end - p > 18 ? p + 18 : end;
    uint64_t x = (uint64_t)(*p++ - '0');
    while (p < lim && is_digit(*p))
        x = x * 10 + (uint64_t)(*p++ - '0');
    if (p < end && (is_digit(*p) || *p == '.' || *p == 'e' || *p == 'E'))
        return NULL;
    if (elem == 4 && x > UINT32_MAX)
        return NULL;
    *u = x;
    return p;
}

/* Read the id array at c->p ('[') into *v (elem 4: uint32 token ids, 8: uint64 hash ids).
 * The loop keeps the cursor in a local and stores plain ids directly; anything else (0,
 * negative, real, too long, not a number) goes through scan_id. Returns 0 or an error. */
static int scan_ids(cur *c, js_array *a, void **v, size_t *cap, size_t elem)
{
    int rc = container_open(c, false);
    if (rc != 0)
        return rc;
    skip_ws(c);
    if (c->p < c->end && *c->p == ']') {
        c->p++;
        c->depth--;
        return 0;
    }
    const unsigned char *p = c->p, *end = c->end, *q;
    for (uint64_t u;;) {
        if (p < end && *p >= '1' && *p <= '9' && (q = fast_id(p, end, elem, &u)) != NULL &&
            (a->n < *cap || (c->p = p, rc = ids_reserve(c, v, cap, a->n, elem)) == 0)) {
            if (elem == 4)
                ((uint32_t *)*v)[a->n] = (uint32_t)u;
            else
                ((uint64_t *)*v)[a->n] = u;
            a->n++;
            p = q;
        } else if (rc != 0) {
            return rc;
        } else {
            c->p = p;
            if (p >= end)
                return fail_unexpected(c, "a value");
            if ((rc = scan_id(c, a, v, cap, elem)) != 0)
                return rc;
            p = c->p;
        }
        while (p < end && is_ws(*p))
            p++;
        if (p < end && *p == ',') {
            p++;
            while (p < end && is_ws(*p))
                p++;
            continue;
        }
        c->p = p;
        if (p < end && *p == ']') {
            c->p++;
            c->depth--;
            return 0;
        }
        return fail_unexpected(c, "',' or ']'");
    }
}

/* Read a scalar field's value at c->p into *v (containers are validated and only their kind
 * kept). Returns 0 or an error. */
static int scan_scalar(cur *c, js_value *v)
{
    unsigned char ch = *c->p;
    num n = {0};
    int rc;
    memset(v, 0, sizeof *v);
    v->column = column(c, c->p);
    if (ch == '"') {
        v->str = (const char *)c->p + 1;
        rc = scan_string(c, &v->escaped);
        v->str_len = rc == 0 ? (size_t)((const char *)c->p - 1 - v->str) : 0;
    } else if (ch == '-' || is_digit(ch)) {
        if ((rc = scan_number(c, &n)) == 0) {
            v->i = n.is_int ? n.i : 0;
            if (n.is_int)
                v->d = (double)n.i;
            else
                real_value(n.start, n.len, &v->d);
        }
    } else if (ch == 't' || ch == 'f' || ch == 'n') {
        js_kind k;
        rc = scan_literal(c, &k, &v->b);
    } else {
        rc = skip_value(c);
    }
    v->kind = kind_of(ch, &n);
    return rc;
}

/* Find the known field named by the decoded key head[0, n), or NULL. */
static const known *known_find(const unsigned char *head, size_t n)
{
    if (n > KNOWN_MAX_LEN)
        return NULL;
    for (size_t i = 0; i < N_KNOWN; i++)
        if (known_fields[i].len == n && memcmp(known_fields[i].name, head, n) == 0)
            return &known_fields[i];
    return NULL;
}

/* The scalar field of rec with JS_F_ bit `bit`, or NULL when the field is not a scalar. */
static js_value *field_value(js_record *rec, unsigned bit)
{
    switch (bit) {
    case JS_F_MODEL:
        return &rec->model;
    case JS_F_ADAPTER:
        return &rec->adapter;
    case JS_F_TENANT:
        return &rec->tenant;
    case JS_F_CACHE_SALT:
        return &rec->cache_salt;
    case JS_F_TIMESTAMP:
        return &rec->timestamp;
    case JS_F_INPUT_LENGTH:
        return &rec->input_length;
    case JS_F_OUTPUT_LENGTH:
        return &rec->output_length;
    default:
        return NULL;
    }
}

/* Read the value of an id-array field (bit JS_F_TOKENS, JS_F_OUTPUT_TOKENS or
 * JS_F_HASH_IDS) at c->p. Returns 0 or an error. */
static int field_array(cur *c, unsigned bit)
{
    js_record *rec = c->rec;
    js_array *a = bit == JS_F_TOKENS          ? &rec->tokens
                  : bit == JS_F_OUTPUT_TOKENS ? &rec->output_tokens
                                              : &rec->hash_ids;
    memset(a, 0, sizeof *a);
    a->bad_index = JS_NO_INDEX;
    a->column = column(c, c->p);
    if (*c->p != '[') {
        js_value other;
        int rc = scan_scalar(c, &other);
        a->kind = other.kind;
        return rc;
    }
    a->kind = JS_ARRAY;
    if (bit == JS_F_HASH_IDS)
        return scan_ids(c, a, (void **)&rec->hash_ids_v, &rec->hash_ids_cap, 8);
    if (bit == JS_F_TOKENS)
        return scan_ids(c, a, (void **)&rec->tokens_v, &rec->tokens_cap, 4);
    return scan_ids(c, a, (void **)&rec->output_tokens_v, &rec->output_tokens_cap, 4);
}

/* Read the value of a top-level member whose key is known as k (or NULL: skip it). Returns 0
 * or an error. */
static int scan_member(cur *c, const known *k)
{
    if (c->p >= c->end)
        return fail_unexpected(c, "a value");
    if (k == NULL)
        return skip_value(c);
    c->rec->fields |= k->bit;
    if (k->bit & (JS_F_OPENAI | JS_F_RETENTION))
        return skip_value(c);
    js_value *v = field_value(c->rec, k->bit);
    return v != NULL ? scan_scalar(c, v) : field_array(c, k->bit);
}

/* Read the top-level object at c->p ('{'). Returns 0 or an error. */
static int scan_object_top(cur *c)
{
    int rc = container_open(c, true);
    if (rc != 0)
        return rc;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        c->depth--;
        return 0;
    }
    for (;;) {
        unsigned char head[KNOWN_MAX_LEN + 1];
        size_t n_key;
        if ((rc = scan_key(c, head, &n_key)) != 0 ||
            (rc = scan_member(c, known_find(head, n_key))) != 0)
            return rc;
        skip_ws(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            skip_ws(c);
            continue;
        }
        if (c->p < c->end && *c->p == '}') {
            c->p++;
            return object_close(c);
        }
        return fail_unexpected(c, "',' or '}'");
    }
}

/* Set the message for a valid value that is not an object. Returns JS_ENOTOBJ. */
static int fail_not_object(cur *c, js_kind kind)
{
    c->s->err_column = 1;
    snprintf(c->s->err, sizeof c->s->err, "each line must be a JSON object, not %s",
             js_kind_name(kind));
    return JS_ENOTOBJ;
}

/* Empty the record's fields for a new line, keeping its arrays. */
static void record_reset(js_record *rec)
{
    js_record keep = *rec;
    memset(rec, 0, sizeof *rec);
    rec->tokens_v = keep.tokens_v;
    rec->tokens_cap = keep.tokens_cap;
    rec->output_tokens_v = keep.output_tokens_v;
    rec->output_tokens_cap = keep.output_tokens_cap;
    rec->hash_ids_v = keep.hash_ids_v;
    rec->hash_ids_cap = keep.hash_ids_cap;
    rec->tokens.bad_index = JS_NO_INDEX;
    rec->output_tokens.bad_index = JS_NO_INDEX;
    rec->hash_ids.bad_index = JS_NO_INDEX;
}

/*
 * Scan one line. Steps:
 *   1. reset the record and the scanner's message; refuse lines over JS_MAX_LINE;
 *   2. the value: the top-level object with its fields, or any other value, validated;
 *   3. nothing but whitespace may follow;
 *   4. classify: not an object, an OpenAI line for jansson, or a record.
 */
int js_scan(js_scanner *s, const char *line, size_t len, js_record *rec)
{
    /* Step 1: reset. */
    record_reset(rec);
    s->err[0] = '\0';
    s->err_column = 0;
    s->err_utf8 = false;
    s->n_keys = 0;
    cur c = {(const unsigned char *)line,
             (const unsigned char *)line,
             (const unsigned char *)line + len,
             s,
             rec,
             0};
    if (len > JS_MAX_LINE) {
        snprintf(s->err, sizeof s->err, "line longer than %llu bytes",
                 (unsigned long long)JS_MAX_LINE);
        return JS_ENOMEM;
    }

    /* Step 2: the value. */
    skip_ws(&c);
    unsigned char first = c.p < c.end ? *c.p : 0;
    num n = {0};
    int rc;
    if (first == '{')
        rc = scan_object_top(&c);
    else if (first == '-' || is_digit(first))
        rc = scan_number(&c, &n);
    else
        rc = skip_value(&c);

    /* Step 3: trailing whitespace only. */
    if (rc == 0) {
        skip_ws(&c);
        if (c.p < c.end)
            rc = fail_unexpected(&c, "the end of the line");
    }
    s->n_keys = 0;
    if (rc != 0)
        return rc;

    /* Step 4: classify. */
    if (first != '{')
        return fail_not_object(&c, kind_of(first, &n));
    return rec->fields & (JS_F_OPENAI | JS_F_RETENTION) ? JS_FALLBACK : JS_OK;
}

size_t js_string_decode(const js_value *v, char *dst)
{
    const unsigned char *p = (const unsigned char *)v->str, *end = p + v->str_len;
    unsigned char *out = (unsigned char *)dst;
    if (!v->escaped) {
        memmove(out, p, v->str_len);
        out[v->str_len] = '\0';
        return v->str_len;
    }
    size_t n = 0;
    while (p < end) {
        if (*p != '\\') {
            out[n++] = *p++;
            continue;
        }
        unsigned char buf[4];
        size_t k = escape_decode(p, &p, buf);
        memcpy(out + n, buf, k);
        n += k;
    }
    out[n] = '\0';
    return n;
}

const char *js_kind_name(js_kind kind)
{
    switch (kind) {
    case JS_ABSENT:
        return "missing";
    case JS_NULL:
        return "null";
    case JS_BOOL:
        return "a boolean";
    case JS_INT:
        return "an integer";
    case JS_REAL:
        return "a non-integer number";
    case JS_STRING:
        return "a string";
    case JS_ARRAY:
        return "an array";
    case JS_OBJECT:
        return "an object";
    }
    return "something else";
}

void js_scanner_init(js_scanner *s)
{
    if (s != NULL)
        memset(s, 0, sizeof *s);
}

void js_record_init(js_record *rec)
{
    if (rec == NULL)
        return;
    memset(rec, 0, sizeof *rec);
    rec->tokens.bad_index = JS_NO_INDEX;
    rec->output_tokens.bad_index = JS_NO_INDEX;
    rec->hash_ids.bad_index = JS_NO_INDEX;
}

void js_scanner_free(js_scanner *s)
{
    if (s == NULL)
        return;
    free(s->keys);
    js_scanner_init(s);
}

void js_record_free(js_record *rec)
{
    if (rec == NULL)
        return;
    free(rec->tokens_v);
    free(rec->output_tokens_v);
    free(rec->hash_ids_v);
    js_record_init(rec);
}

int js_scanner_check(const js_scanner *s)
{
    if (s == NULL || s->n_keys != 0 || (s->keys == NULL) != (s->keys_cap == 0) ||
        memchr(s->err, '\0', sizeof s->err) == NULL || (s->err[0] == '\0' && s->err_column != 0))
        return -1;
    return 0;
}
