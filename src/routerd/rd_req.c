/*
 * rd_req.c - the /score request scanner (rd_req.h): a push scanner over the body's chunks.
 *
 * The JSON grammar accepted is one object whose members are the rows of rd_req_fields[]:
 *
 *   BEGIN -'{'-> KEY0 -'"'-> KEY -'"'-> COLON -':'-> VALUE -> (kind's states) -> NEXT
 *                  '}'-> END                                      ','-> KEYN -'"'-> KEY
 *                                                                 '}'-> END
 *   tokens:  VALUE -'['-> ARR0 -digit-> NUM -> ARR_SEP -','-> ARR_ELEM -digit-> NUM
 *                        ']'-> NEXT           ']'-> NEXT
 *   strings: VALUE -'"'-> STR (ESC, UESC for escapes) -'"'-> NEXT;  VALUE -'n'-> NULL
 *
 * Whitespace (space, tab, CR, LF) is allowed between tokens, as RFC 8259 says. A member's
 * key is looked up when its closing quote arrives: an unknown or repeated key refuses the
 * request there, before its value is read. Strings are UTF-8 checked when they end (no
 * overlong forms, no surrogates, nothing above U+10FFFF; escapes decoded, \u0000 refused).
 *
 * Token ids take the hot loop (rd_scan_ids): one pass over the bytes, digits folded into a
 * uint64_t, each id stored in the reused array; the common id (up to 10 digits then ',')
 * skips the state machine. Measured: 36 us for a 51 KB 8k-token body fed in 16 KB chunks
 * (0.7 ns per byte, hot; 13 instructions per byte under callgrind); reading eight bytes at
 * a time (SWAR digit conversion) was slower, 43 us, the byte loop's branches predicting
 * well. The daemon's figures (bench/bench_routerd.c) are in docs/routing.md.
 *
 * Invariants (rd_req_check): state is one of RD_S_*; key_len <= sizeof key (or the "too long"
 * mark); s_len <= s_max; n_tokens <= cap_tokens; n_carry < 4; the budget's reservation covers
 * cap_tokens * 4 bytes (it is never below them).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rd_req.h"

enum {
    RD_S_BEGIN,
    RD_S_KEY0,
    RD_S_KEYN,
    RD_S_KEY,
    RD_S_COLON,
    RD_S_VALUE,
    RD_S_ARR0,
    RD_S_ARR_SEP,
    RD_S_ARR_ELEM,
    RD_S_NUM,
    RD_S_STR,
    RD_S_ESC,
    RD_S_UESC,
    RD_S_NULL,
    RD_S_NEXT,
    RD_S_END,
    RD_S_BINARY,
    RD_S_FAILED,
    RD_S_COUNT
};

enum { RD_F_TOKENS, RD_F_STRING };

/* The members of a request: name, kind, slot (rd_req.str index for RD_F_STRING). */
static const struct {
    const char *name;
    int kind;
    int slot;
} rd_req_fields[] = {
    {"tokens", RD_F_TOKENS, 0}, {"model", RD_F_STRING, 0},  {"lora", RD_F_STRING, 1},
    {"salt", RD_F_STRING, 2},   {"tenant", RD_F_STRING, 3},
};
#define RD_N_FIELDS   (sizeof rd_req_fields / sizeof rd_req_fields[0])
#define RD_FIELD_LIST "tokens, model, lora, salt, tenant"

static inline bool rd_is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Refuse the request at body byte `at` (0-based) with a message. Returns RD_REQ_BAD. */
static int rd_bad(rd_req *q, uint64_t at, const char *what)
{
    snprintf(q->err, sizeof q->err, "invalid body at byte %llu: %s", (unsigned long long)at + 1,
             what);
    q->state = RD_S_FAILED;
    return RD_REQ_BAD;
}

void rd_req_reset(rd_req *q, rd_budget *budget, bool binary)
{
    q->n_tokens = 0;
    for (int i = 0; i < RD_REQ_N_STR; i++) {
        q->str_set[i] = false;
        q->str_len[i] = 0;
        q->str[i][0] = '\0';
    }
    q->err[0] = '\0';
    q->budget = budget;
    q->binary = binary;
    q->state = binary ? RD_S_BINARY : RD_S_BEGIN;
    q->field = -1;
    q->seen = 0;
    q->num = 0;
    q->num_digits = 0;
    q->key_len = 0;
    q->sbuf = NULL;
    q->s_len = q->s_max = 0;
    q->uesc = 0;
    q->uesc_n = 0;
    q->high = 0;
    q->lit = 0;
    q->n_carry = 0;
    q->offset = 0;
}

/* Room for one more id: double the array, reserving the growth in the budget first.
 * Returns RD_REQ_MORE, RD_REQ_BUSY (budget spent) or RD_REQ_NOMEM. */
static int rd_grow_tokens(rd_req *q)
{
    size_t cap = q->cap_tokens ? q->cap_tokens * 2 : 1024;
    if (cap > SIZE_MAX / (2 * sizeof(uint32_t)))
        return RD_REQ_NOMEM;
    size_t add = (cap - q->cap_tokens) * sizeof(uint32_t);
    if (q->budget) {
        size_t prev = atomic_fetch_add(&q->budget->used, add);
        if (q->budget->limit && prev + add > q->budget->limit) {
            atomic_fetch_sub(&q->budget->used, add);
            return RD_REQ_BUSY;
        }
    }
    uint32_t *t = realloc(q->tokens, cap * sizeof *t);
    if (t == NULL) {
        if (q->budget)
            atomic_fetch_sub(&q->budget->used, add);
        return RD_REQ_NOMEM;
    }
    q->tokens = t;
    q->cap_tokens = cap;
    return RD_REQ_MORE;
}

void rd_req_trim(rd_req *q, size_t keep_bytes)
{
    if (q->cap_tokens * sizeof(uint32_t) <= keep_bytes && q->cap_tokens)
        return;
    if (q->budget)
        atomic_fetch_sub(&q->budget->used, q->cap_tokens * sizeof(uint32_t));
    free(q->tokens);
    q->tokens = NULL;
    q->cap_tokens = 0;
    q->n_tokens = 0;
}

bool rd_utf8_ok(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else
            return false;
        if (n - i < len || s[i + 1] < lo || s[i + 1] > hi)
            return false;
        for (size_t k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF)
                return false;
        i += len;
    }
    return true;
}

/* Append code point cp (already checked: not a surrogate, not 0, <= 0x10FFFF) as UTF-8 to
 * the string. Returns false when it does not fit. */
static bool rd_put_cp(rd_req *q, uint32_t cp)
{
    char b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xC0 | cp >> 6);
        b[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (char)(0xE0 | cp >> 12);
        b[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        b[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        b[0] = (char)(0xF0 | cp >> 18);
        b[1] = (char)(0x80 | (cp >> 12 & 0x3F));
        b[2] = (char)(0x80 | (cp >> 6 & 0x3F));
        b[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    if (q->s_max - q->s_len < n)
        return false;
    memcpy(q->sbuf + q->s_len, b, n);
    q->s_len += n;
    return true;
}

/* The key just closed: find its row, refuse unknown and repeated ones. */
static int rd_key_done(rd_req *q, uint64_t at)
{
    char msg[120];
    for (size_t i = 0; q->key_len <= sizeof q->key && i < RD_N_FIELDS; i++) {
        if (strlen(rd_req_fields[i].name) != q->key_len ||
            memcmp(rd_req_fields[i].name, q->key, q->key_len) != 0)
            continue;
        if (q->seen & (1u << i)) {
            snprintf(msg, sizeof msg, "member '%s' given twice", rd_req_fields[i].name);
            return rd_bad(q, at, msg);
        }
        q->seen |= 1u << i;
        q->field = (int)i;
        q->state = RD_S_COLON;
        return RD_REQ_MORE;
    }
    return rd_bad(q, at, "unknown member (" RD_FIELD_LIST ")");
}

/* The string value just closed: check it and store it. */
static int rd_string_done(rd_req *q, uint64_t at)
{
    if (q->high)
        return rd_bad(q, at, "a \\u escape's high surrogate has no low half");
    if (!rd_utf8_ok((const unsigned char *)q->sbuf, q->s_len))
        return rd_bad(q, at, "a string that is not UTF-8");
    int slot = rd_req_fields[q->field].slot;
    q->str[slot][q->s_len] = '\0';
    q->str_len[slot] = q->s_len;
    q->str_set[slot] = true;
    q->state = RD_S_NEXT;
    return RD_REQ_MORE;
}

/* One \uXXXX escape decoded into q->uesc. */
static int rd_uesc_done(rd_req *q, uint64_t at)
{
    uint32_t u = q->uesc;
    q->state = RD_S_STR;
    if (u >= 0xD800 && u <= 0xDBFF) {
        if (q->high)
            return rd_bad(q, at, "two high surrogates in a row");
        q->high = u;
        return RD_REQ_MORE;
    }
    if (u >= 0xDC00 && u <= 0xDFFF) {
        if (!q->high)
            return rd_bad(q, at, "a low surrogate without its high half");
        u = 0x10000 + ((q->high - 0xD800) << 10) + (u - 0xDC00);
        q->high = 0;
    } else if (q->high)
        return rd_bad(q, at, "a \\u escape's high surrogate has no low half");
    if (u == 0)
        return rd_bad(q, at, "\\u0000 in a string");
    if (!rd_put_cp(q, u))
        return rd_bad(q, at, "a string longer than 1024 bytes");
    return RD_REQ_MORE;
}

/* The token array's states: a tight loop over p[0 .. end), returning where it stopped (the
 * array ended, or the chunk did). *rc receives RD_REQ_MORE or an error. */
static const char *rd_scan_ids(rd_req *q, const char *p, const char *end, uint64_t base, int *rc)
{
    const char *start = p;
    int st = q->state;
    uint64_t v = q->num;
    int nd = q->num_digits;
    *rc = RD_REQ_MORE;
    while (p < end) {
        /* The common case first: an id of up to 10 digits right after a separator and
         * followed by ',' (at least 16 bytes left, so the digits cannot pass the chunk). */
        if (st == RD_S_ARR_ELEM && end - p >= 16) {
            const unsigned char *u = (const unsigned char *)p;
            unsigned d0 = (unsigned)u[0] - '0', d;
            if (d0 < 10 && (d0 != 0 || (unsigned)u[1] - '0' >= 10)) {
                uint64_t w = d0;
                size_t k = 1;
                while ((d = (unsigned)u[k] - '0') < 10 && k < 10) {
                    w = w * 10 + d;
                    k++;
                }
                if (u[k] == ',' && w <= UINT32_MAX) {
                    if (q->n_tokens == q->cap_tokens && (*rc = rd_grow_tokens(q)) != RD_REQ_MORE) {
                        q->state = RD_S_FAILED;
                        return p;
                    }
                    q->tokens[q->n_tokens++] = (uint32_t)w;
                    p += k + 1;
                    p += *p == ' '; /* ", " as Python's json.dumps writes it */
                    continue;
                }
            }
        }
        unsigned char c = (unsigned char)*p;
        unsigned dig = (unsigned)c - '0';
        if (st == RD_S_NUM) {
            if (dig < 10) {
                if (v == 0 && nd > 0) {
                    *rc = rd_bad(q, base + (uint64_t)(p - start), "a number with a leading zero");
                    return p;
                }
                v = v * 10 + dig;
                nd++;
                if (v > UINT32_MAX) {
                    *rc = rd_bad(q, base + (uint64_t)(p - start),
                                 "tokens must be integers in 0..4294967295");
                    return p;
                }
                p++;
                continue;
            }
            if (q->n_tokens == q->cap_tokens && (*rc = rd_grow_tokens(q)) != RD_REQ_MORE) {
                q->state = RD_S_FAILED;
                return p;
            }
            q->tokens[q->n_tokens++] = (uint32_t)v;
            st = RD_S_ARR_SEP;
            continue; /* c is looked at again as a separator */
        }
        if (rd_is_ws(c)) {
            p++;
            continue;
        }
        if (st == RD_S_ARR_SEP) {
            if (c == ',') {
                st = RD_S_ARR_ELEM;
                p++;
                continue;
            }
            if (c == ']') {
                st = RD_S_NEXT;
                p++;
                break;
            }
            *rc =
                rd_bad(q, base + (uint64_t)(p - start),
                       c == '.' || c == 'e' || c == 'E' ? "tokens must be integers in 0..4294967295"
                                                        : "expected ',' or ']' in tokens");
            return p;
        }
        if (dig < 10) {
            st = RD_S_NUM;
            v = 0;
            nd = 0;
            continue;
        }
        if (st == RD_S_ARR0 && c == ']') {
            st = RD_S_NEXT;
            p++;
            break;
        }
        *rc = rd_bad(q, base + (uint64_t)(p - start), "tokens must be integers in 0..4294967295");
        return p;
    }
    q->state = st;
    q->num = v;
    q->num_digits = nd;
    return p;
}

/* Binary body: append whole little-endian ids, keep a split one's bytes in carry. */
static int rd_feed_binary(rd_req *q, const unsigned char *p, size_t n)
{
    int rc;
    while (n > 0) {
        if (q->n_carry > 0 || n < 4) {
            q->carry[q->n_carry++] = *p++;
            n--;
            if (q->n_carry < 4)
                continue;
            if (q->n_tokens == q->cap_tokens && (rc = rd_grow_tokens(q)) != RD_REQ_MORE)
                return rc;
            q->tokens[q->n_tokens++] = (uint32_t)q->carry[0] | (uint32_t)q->carry[1] << 8 |
                                       (uint32_t)q->carry[2] << 16 | (uint32_t)q->carry[3] << 24;
            q->n_carry = 0;
            continue;
        }
        size_t whole = n / 4;
        while (q->cap_tokens - q->n_tokens < whole)
            if ((rc = rd_grow_tokens(q)) != RD_REQ_MORE)
                return rc;
        for (size_t i = 0; i < whole; i++, p += 4)
            q->tokens[q->n_tokens++] =
                (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        n -= whole * 4;
    }
    return RD_REQ_MORE;
}

int rd_req_arg(rd_req *q, const char *key, const char *value)
{
    if (!q->binary)
        return rd_bad(q, 0, "query arguments are for binary (application/octet-stream) bodies");
    if (value == NULL)
        value = "";
    for (size_t i = 0; i < RD_N_FIELDS; i++) {
        if (rd_req_fields[i].kind != RD_F_STRING || strcmp(rd_req_fields[i].name, key) != 0)
            continue;
        int slot = rd_req_fields[i].slot;
        size_t n = strlen(value);
        if (q->str_set[slot])
            return rd_bad(q, 0, "a query argument given twice");
        if (n > RD_REQ_STR_MAX)
            return rd_bad(q, 0, "a query argument longer than 1024 bytes");
        if (!rd_utf8_ok((const unsigned char *)value, n))
            return rd_bad(q, 0, "a query argument that is not UTF-8");
        memcpy(q->str[slot], value, n + 1);
        q->str_len[slot] = n;
        q->str_set[slot] = true;
        return RD_REQ_MORE;
    }
    return rd_bad(q, 0, "unknown query argument (model, lora, salt, tenant)");
}

/* Step through one byte c at body offset at in the structural states. */
static int rd_step(rd_req *q, unsigned char c, uint64_t at)
{
    switch (q->state) {
    case RD_S_BEGIN:
        if (c == '{')
            q->state = RD_S_KEY0;
        else if (!rd_is_ws(c))
            return rd_bad(q, at, "the body is not a JSON object");
        return RD_REQ_MORE;
    case RD_S_KEY0:
    case RD_S_KEYN:
        if (c == '"') {
            q->state = RD_S_KEY;
            q->key_len = 0;
        } else if (c == '}' && q->state == RD_S_KEY0)
            q->state = RD_S_END;
        else if (!rd_is_ws(c))
            return rd_bad(q, at, "expected a member name");
        return RD_REQ_MORE;
    case RD_S_KEY:
        if (c == '"')
            return rd_key_done(q, at);
        if (c == '\\' || c < 0x20)
            return rd_bad(q, at, "unknown member (" RD_FIELD_LIST ")");
        if (q->key_len < sizeof q->key)
            q->key[q->key_len++] = (char)c;
        else
            q->key_len = sizeof q->key + 1;
        return RD_REQ_MORE;
    case RD_S_COLON:
        if (c == ':')
            q->state = RD_S_VALUE;
        else if (!rd_is_ws(c))
            return rd_bad(q, at, "expected ':'");
        return RD_REQ_MORE;
    case RD_S_VALUE:
        if (rd_is_ws(c))
            return RD_REQ_MORE;
        if (rd_req_fields[q->field].kind == RD_F_TOKENS) {
            if (c != '[')
                return rd_bad(q, at, "tokens must be an array of token ids");
            q->state = RD_S_ARR0;
            return RD_REQ_MORE;
        }
        if (c == '"') {
            int slot = rd_req_fields[q->field].slot;
            q->sbuf = q->str[slot];
            q->s_len = 0;
            q->s_max = RD_REQ_STR_MAX;
            q->high = 0;
            q->state = RD_S_STR;
            return RD_REQ_MORE;
        }
        if (c == 'n') {
            q->lit = 1;
            q->state = RD_S_NULL;
            return RD_REQ_MORE;
        }
        return rd_bad(q, at, "model, lora, salt and tenant must be strings or null");
    case RD_S_NULL:
        if (c != (unsigned char)"null"[q->lit])
            return rd_bad(q, at, "model, lora, salt and tenant must be strings or null");
        if (++q->lit == 4)
            q->state = RD_S_NEXT;
        return RD_REQ_MORE;
    case RD_S_STR:
        if (c == '"')
            return rd_string_done(q, at);
        if (c == '\\') {
            q->state = RD_S_ESC;
            return RD_REQ_MORE;
        }
        if (c < 0x20)
            return rd_bad(q, at, "a control character in a string");
        if (q->high)
            return rd_bad(q, at, "a \\u escape's high surrogate has no low half");
        if (q->s_len == q->s_max)
            return rd_bad(q, at, "a string longer than 1024 bytes");
        q->sbuf[q->s_len++] = (char)c;
        return RD_REQ_MORE;
    case RD_S_ESC: {
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        if (c == 'u') {
            q->uesc = 0;
            q->uesc_n = 0;
            q->state = RD_S_UESC;
            return RD_REQ_MORE;
        }
        const char *k = c ? strchr(from, c) : NULL;
        if (k == NULL)
            return rd_bad(q, at, "an unknown escape in a string");
        if (q->high)
            return rd_bad(q, at, "a \\u escape's high surrogate has no low half");
        if (q->s_len == q->s_max)
            return rd_bad(q, at, "a string longer than 1024 bytes");
        q->sbuf[q->s_len++] = to[k - from];
        q->state = RD_S_STR;
        return RD_REQ_MORE;
    }
    case RD_S_UESC: {
        unsigned h = c >= '0' && c <= '9'   ? (unsigned)c - '0'
                     : c >= 'a' && c <= 'f' ? c - 'a' + 10u
                     : c >= 'A' && c <= 'F' ? c - 'A' + 10u
                                            : 16u;
        if (h == 16)
            return rd_bad(q, at, "a \\u escape without 4 hex digits");
        q->uesc = q->uesc << 4 | h;
        if (++q->uesc_n == 4)
            return rd_uesc_done(q, at);
        return RD_REQ_MORE;
    }
    case RD_S_NEXT:
        if (c == ',')
            q->state = RD_S_KEYN;
        else if (c == '}')
            q->state = RD_S_END;
        else if (!rd_is_ws(c))
            return rd_bad(q, at, "expected ',' or '}'");
        return RD_REQ_MORE;
    case RD_S_END:
        if (!rd_is_ws(c))
            return rd_bad(q, at, "something after the object");
        return RD_REQ_MORE;
    default:
        return rd_bad(q, at, "the request already failed");
    }
}

int rd_req_feed(rd_req *q, const char *data, size_t n)
{
    if (q->state == RD_S_FAILED)
        return RD_REQ_BAD;
    if (q->binary) {
        int rc = rd_feed_binary(q, (const unsigned char *)data, n);
        q->offset += n;
        if (rc != RD_REQ_MORE)
            q->state = RD_S_FAILED;
        return rc;
    }
    const char *p = data, *end = data + n;
    while (p < end) {
        uint64_t at = q->offset + (uint64_t)(p - data);
        int rc;
        if (q->state >= RD_S_ARR0 && q->state <= RD_S_NUM) {
            p = rd_scan_ids(q, p, end, at, &rc);
            if (rc != RD_REQ_MORE) {
                q->state = RD_S_FAILED;
                return rc;
            }
            continue;
        }
        rc = rd_step(q, (unsigned char)*p, at);
        if (rc != RD_REQ_MORE)
            return rc;
        p++;
    }
    q->offset += n;
    return RD_REQ_MORE;
}

int rd_req_finish(rd_req *q)
{
    if (q->state == RD_S_FAILED)
        return RD_REQ_BAD;
    if (q->binary) {
        if (q->n_carry)
            return rd_bad(q, q->offset, "a binary body's length must be a multiple of 4");
        return RD_REQ_DONE;
    }
    if (q->state != RD_S_END)
        return rd_bad(q, q->offset,
                      q->offset ? "the body ends inside the object" : "the body is empty");
    if (!(q->seen & 1u))
        return rd_bad(q, q->offset, "tokens must be an array of token ids");
    return RD_REQ_DONE;
}

const char *rd_req_check(const rd_req *q)
{
    if (q->state < 0 || q->state >= RD_S_COUNT)
        return "state out of range";
    if (q->key_len > sizeof q->key + 1)
        return "key length past its buffer";
    if (q->s_len > q->s_max || q->s_max > RD_REQ_STR_MAX)
        return "string length past its buffer";
    if (q->n_tokens > q->cap_tokens)
        return "more tokens than capacity";
    if ((q->cap_tokens == 0) != (q->tokens == NULL))
        return "token array and capacity disagree";
    if (q->n_carry < 0 || q->n_carry > 3)
        return "binary carry out of range";
    if (q->field >= (int)RD_N_FIELDS)
        return "field out of range";
    if (q->budget && atomic_load(&q->budget->used) < q->cap_tokens * sizeof(uint32_t))
        return "budget below the token array's capacity";
    return NULL;
}
