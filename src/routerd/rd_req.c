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
 *   workers: VALUE -'['-> LIST0 -'"'-> STR ... -'"'-> LIST_SEP -','-> LIST_ELEM -'"'-> STR
 *                        ']'-> NEXT                          ']'-> NEXT
 *   loads:   VALUE -'{'-> OBJ0 -'"'-> STR ... -'"'-> OBJ_COLON -':'-> OBJ_VAL -> REAL
 *                       '}'-> NEXT          REAL -> OBJ_SEP -','-> OBJ_KEY -'"'-> STR
 *                                                          '}'-> NEXT
 *   (workers and loads also take null, as strings do)
 *
 *   text:    KEY (a text member: prompt, messages, tools, add_generation_prompt,
 *            chat_template_kwargs) -'"'-> TEXT: every later byte is appended to text_buf
 *            (which starts as '{"KEY"'), bounded by RD_REQ_TEXT_MAX and the budget; at the
 *            end rd_text_finish parses it with jansson and feeds the members that are not
 *            text back through the states above as ',"KEY":VALUE' (replay: no positions)
 *
 * Whitespace (space, tab, CR, LF) is allowed between tokens, as RFC 8259 says. A member's
 * key is looked up when its closing quote arrives: an unknown or repeated key refuses the
 * request there, before its value is read. Strings are UTF-8 checked when they end (no
 * overlong forms, no surrogates, nothing above U+10FFFF; escapes decoded, \u0000 refused).
 * A name of workers or loads is decoded straight into rd_req.names (room for the longest
 * string is made before it starts, so the buffer does not move under it); a key of loads
 * given twice is refused (a scan of the loads before it: at most 4096, a few ms in the
 * worst case, as jansson's JSON_REJECT_DUPLICATES refuses it). A load is read into a
 * 32-byte buffer (digits, '.', 'e', 'E', '+', '-'), checked against RFC 8259's number
 * grammar and converted with strtod when a byte that cannot be part of it arrives.
 *
 * Token ids take the hot loop (rd_scan_ids): one pass over the bytes, digits folded into a
 * uint64_t, each id stored in the reused array; the common id (up to 10 digits then ',')
 * skips the state machine. Measured: 36 us for a 51 KB 8k-token body fed in 16 KB chunks
 * (0.7 ns per byte, hot; 13 instructions per byte under callgrind); reading eight bytes at
 * a time (SWAR digit conversion) was slower, 43 us, the byte loop's branches predicting
 * well. The daemon's figures (bench/bench_routerd.c) are in docs/routing.md.
 *
 * Invariants (rd_req_check): state is one of RD_S_* (RD_S_TEXT only in text mode);
 * text_n <= text_cap; key_len <= sizeof key (or the "too long"
 * mark); s_len <= s_max; n_tokens <= cap_tokens; names_n <= names_cap; n_items <= cap_items
 * and n_items = n_workers + n_loads; nbuf_len < sizeof nbuf; n_carry < 4; the budget's
 * reservation covers rd_req_reserved (it is never below it).
 */
#include <jansson.h>
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
    RD_S_LIST0,
    RD_S_LIST_SEP,
    RD_S_LIST_ELEM,
    RD_S_OBJ0,
    RD_S_OBJ_COLON,
    RD_S_OBJ_VAL,
    RD_S_REAL,
    RD_S_OBJ_SEP,
    RD_S_OBJ_KEY,
    RD_S_NEXT,
    RD_S_END,
    RD_S_BINARY,
    RD_S_TEXT, /* text mode: the rest of the body goes to text_buf */
    RD_S_FAILED,
    RD_S_COUNT
};

enum { RD_F_TOKENS, RD_F_STRING, RD_F_NAMES, RD_F_LOADS, RD_F_TEXT };

/* The members of a request: name, kind, slot (rd_req.str index for RD_F_STRING). */
static const struct {
    const char *name;
    int kind;
    int slot;
} rd_req_fields[] = {
    {"tokens", RD_F_TOKENS, 0},
    {"model", RD_F_STRING, 0},
    {"lora", RD_F_STRING, 1},
    {"salt", RD_F_STRING, 2},
    {"tenant", RD_F_STRING, 3},
    {"workers", RD_F_NAMES, 0},
    {"loads", RD_F_LOADS, 0},
    {"prompt", RD_F_TEXT, 0},
    {"messages", RD_F_TEXT, 0},
    {"tools", RD_F_TEXT, 0},
    {"add_generation_prompt", RD_F_TEXT, 0},
    {"chat_template_kwargs", RD_F_TEXT, 0},
};
#define RD_N_FIELDS   (sizeof rd_req_fields / sizeof rd_req_fields[0])
#define RD_FIELD_LIST "tokens, model, lora, salt, tenant, workers, loads, " RD_REQ_TEXT_LIST

#define RD_MSG_WORKERS "workers must be an array of worker names (ENGINE or ENGINE/RANK)"
#define RD_MSG_LOADS   "loads must be an object {WORKER: LOAD} (LOAD a number >= 0)"

static inline bool rd_is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Refuse the request at body byte `at` (0-based) with a message. Returns RD_REQ_BAD. */
static int rd_bad(rd_req *q, uint64_t at, const char *what)
{
    if (q->replay)
        snprintf(q->err, sizeof q->err, "invalid body: %s", what);
    else
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
    q->names_n = 0;
    q->n_items = 0;
    q->n_workers = 0;
    q->n_loads = 0;
    q->workers_set = false;
    q->nbuf_len = 0;
    q->text = false;
    q->replay = false;
    q->text_n = 0;
    q->text_at = 0;
    json_decref(q->body);
    q->body = NULL;
}

/* Reserve add bytes in the budget. Returns RD_REQ_MORE or RD_REQ_BUSY (nothing reserved). */
static int rd_budget_take(rd_req *q, size_t add)
{
    if (q->budget) {
        size_t prev = atomic_fetch_add(&q->budget->used, add);
        if (q->budget->limit && prev + add > q->budget->limit) {
            atomic_fetch_sub(&q->budget->used, add);
            return RD_REQ_BUSY;
        }
    }
    return RD_REQ_MORE;
}

static void rd_budget_give(rd_req *q, size_t n)
{
    if (q->budget && n)
        atomic_fetch_sub(&q->budget->used, n);
}

size_t rd_req_reserved(const rd_req *q)
{
    return q->cap_tokens * sizeof(uint32_t) + q->names_cap + q->cap_items * sizeof(rd_req_item) +
           q->text_cap;
}

/* Room for one more item and a string of up to RD_REQ_STR_MAX bytes (and its NUL) in names,
 * each grown geometrically with the growth reserved in the budget first. Returns
 * RD_REQ_MORE, RD_REQ_BUSY or RD_REQ_NOMEM (buffers unchanged but for a growth that
 * succeeded, which stays reserved). */
static int rd_names_room(rd_req *q)
{
    int rc;
    if (q->n_items == q->cap_items) {
        size_t cap = q->cap_items ? q->cap_items * 2 : 16;
        size_t add = (cap - q->cap_items) * sizeof(rd_req_item);
        if ((rc = rd_budget_take(q, add)) != RD_REQ_MORE)
            return rc;
        rd_req_item *it = realloc(q->items, cap * sizeof *it);
        if (it == NULL) {
            rd_budget_give(q, add);
            return RD_REQ_NOMEM;
        }
        q->items = it;
        q->cap_items = cap;
    }
    if (q->names_cap - q->names_n < RD_REQ_STR_MAX + 1) {
        size_t cap = q->names_cap ? q->names_cap * 2 : 4 * (RD_REQ_STR_MAX + 1);
        while (cap - q->names_n < RD_REQ_STR_MAX + 1)
            cap *= 2;
        size_t add = cap - q->names_cap;
        if ((rc = rd_budget_take(q, add)) != RD_REQ_MORE)
            return rc;
        char *nb = realloc(q->names, cap);
        if (nb == NULL) {
            rd_budget_give(q, add);
            return RD_REQ_NOMEM;
        }
        q->names = nb;
        q->names_cap = cap;
    }
    return RD_REQ_MORE;
}

/* Room for one more id: double the array, reserving the growth in the budget first.
 * Returns RD_REQ_MORE, RD_REQ_BUSY (budget spent) or RD_REQ_NOMEM. */
static int rd_grow_tokens(rd_req *q)
{
    size_t cap = q->cap_tokens ? q->cap_tokens * 2 : 1024;
    if (cap > SIZE_MAX / (2 * sizeof(uint32_t)))
        return RD_REQ_NOMEM;
    size_t add = (cap - q->cap_tokens) * sizeof(uint32_t);
    int rc = rd_budget_take(q, add);
    if (rc != RD_REQ_MORE)
        return rc;
    uint32_t *t = realloc(q->tokens, cap * sizeof *t);
    if (t == NULL) {
        rd_budget_give(q, add);
        return RD_REQ_NOMEM;
    }
    q->tokens = t;
    q->cap_tokens = cap;
    return RD_REQ_MORE;
}

int rd_req_set_tokens(rd_req *q, const uint32_t *ids, size_t n)
{
    q->n_tokens = 0;
    while (q->cap_tokens < n) {
        int rc = rd_grow_tokens(q);
        if (rc != RD_REQ_MORE)
            return rc;
    }
    if (n)
        memcpy(q->tokens, ids, n * sizeof *ids);
    q->n_tokens = n;
    return RD_REQ_MORE;
}

void rd_req_trim(rd_req *q, size_t keep_bytes)
{
    json_decref(q->body);
    q->body = NULL;
    if (q->text_cap > keep_bytes || (keep_bytes == 0 && q->text_buf)) {
        rd_budget_give(q, q->text_cap);
        free(q->text_buf);
        q->text_buf = NULL;
        q->text_cap = q->text_n = 0;
    }
    size_t extra = q->names_cap + q->cap_items * sizeof(rd_req_item);
    if (extra > keep_bytes || (keep_bytes == 0 && (q->names || q->items))) {
        rd_budget_give(q, extra);
        free(q->names);
        free(q->items);
        q->names = NULL;
        q->items = NULL;
        q->names_cap = q->names_n = 0;
        q->cap_items = q->n_items = q->n_workers = q->n_loads = 0;
    }
    if (q->cap_tokens * sizeof(uint32_t) <= keep_bytes && q->cap_tokens)
        return;
    rd_budget_give(q, q->cap_tokens * sizeof(uint32_t));
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

/* Append n bytes to the text buffer, growing it geometrically with the growth reserved in
 * the budget first. Returns RD_REQ_MORE, RD_REQ_BUSY or RD_REQ_NOMEM. */
static int rd_text_add(rd_req *q, const char *p, size_t n)
{
    if (n > RD_REQ_TEXT_MAX - q->text_n)
        return rd_bad(q, q->offset, "a text prompt's body is above 4 MiB (send \"tokens\")");
    if (n > q->text_cap - q->text_n) {
        size_t cap = q->text_cap ? q->text_cap : 4096;
        while (cap - q->text_n < n) {
            if (cap > SIZE_MAX / 4)
                return RD_REQ_NOMEM;
            cap *= 2;
        }
        size_t add = cap - q->text_cap;
        int rc = rd_budget_take(q, add);
        if (rc != RD_REQ_MORE)
            return rc;
        char *b = realloc(q->text_buf, cap);
        if (b == NULL) {
            rd_budget_give(q, add);
            return RD_REQ_NOMEM;
        }
        q->text_buf = b;
        q->text_cap = cap;
    }
    memcpy(q->text_buf + q->text_n, p, n);
    q->text_n += n;
    return RD_REQ_MORE;
}

/* The first text member's key just closed (its closing quote at at): switch to text mode,
 * the buffer starting as '{"KEY"'. Returns RD_REQ_MORE, _BAD (tokens given), _BUSY or
 * _NOMEM. */
static int rd_text_begin(rd_req *q, uint64_t at)
{
    q->text = true; /* also when refused below: a text request, for the counters */
    if (q->seen & 1u)
        return rd_bad(q, at, "a request has tokens or a text prompt (prompt, messages), not both");
    q->text_n = 0;
    q->text_at = at - q->key_len - 1; /* the key's opening quote */
    int rc = rd_text_add(q, "{\"", 2);
    if (rc == RD_REQ_MORE)
        rc = rd_text_add(q, q->key, q->key_len);
    if (rc == RD_REQ_MORE)
        rc = rd_text_add(q, "\"", 1);
    if (rc != RD_REQ_MORE) {
        q->state = RD_S_FAILED;
        return rc;
    }
    q->state = RD_S_TEXT;
    return RD_REQ_MORE;
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
        if (rd_req_fields[i].kind == RD_F_TEXT)
            return rd_text_begin(q, at);
        q->state = RD_S_COLON;
        return RD_REQ_MORE;
    }
    return rd_bad(q, at, "unknown member (" RD_FIELD_LIST ")");
}

/* A name of workers or loads starts (its opening quote at at): room for it in names, the
 * string states pointed there. Returns RD_REQ_MORE, _BAD (too many), _BUSY or _NOMEM. */
static int rd_name_begin(rd_req *q, uint64_t at)
{
    bool load = rd_req_fields[q->field].kind == RD_F_LOADS;
    if ((load ? q->n_loads : q->n_workers) >= RD_REQ_MAX_NAMES)
        return rd_bad(q, at, load ? "more than 4096 loads" : "more than 4096 workers");
    int rc = rd_names_room(q);
    if (rc != RD_REQ_MORE) {
        q->state = RD_S_FAILED;
        return rc;
    }
    q->sbuf = q->names + q->names_n;
    q->s_len = 0;
    q->s_max = RD_REQ_STR_MAX;
    q->high = 0;
    q->state = RD_S_STR;
    return RD_REQ_MORE;
}

/* A name of workers or loads just closed (checked as UTF-8): record it as an item. */
static int rd_name_done(rd_req *q, uint64_t at)
{
    bool load = rd_req_fields[q->field].kind == RD_F_LOADS;
    q->sbuf[q->s_len] = '\0';
    for (size_t i = 0; load && i < q->n_items; i++) {
        const rd_req_item *it = &q->items[i];
        if (it->is_load && memcmp(q->names + it->off, q->sbuf, q->s_len + 1) == 0)
            return rd_bad(q, at, "a worker given twice in loads");
    }
    q->items[q->n_items++] = (rd_req_item){.off = q->names_n, .is_load = load, .value = 0.0};
    q->names_n += q->s_len + 1;
    if (load)
        q->n_loads++;
    else
        q->n_workers++;
    q->state = load ? RD_S_OBJ_COLON : RD_S_LIST_SEP;
    return RD_REQ_MORE;
}

/* Whether b[0 .. n) is a JSON number (RFC 8259: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?). */
static bool rd_json_number(const char *b, size_t n)
{
    size_t i = 0;
    i += i < n && b[i] == '-';
    if (i < n && b[i] == '0')
        i++;
    else if (i < n && b[i] >= '1' && b[i] <= '9')
        while (i < n && b[i] >= '0' && b[i] <= '9')
            i++;
    else
        return false;
    if (i < n && b[i] == '.') {
        size_t d = ++i;
        while (i < n && b[i] >= '0' && b[i] <= '9')
            i++;
        if (i == d)
            return false;
    }
    if (i < n && (b[i] == 'e' || b[i] == 'E')) {
        i++;
        i += i < n && (b[i] == '+' || b[i] == '-');
        size_t d = i;
        while (i < n && b[i] >= '0' && b[i] <= '9')
            i++;
        if (i == d)
            return false;
    }
    return i == n;
}

/* The load number in nbuf ended (at the byte after it): check it, store it in the last
 * item. */
static int rd_real_done(rd_req *q, uint64_t at)
{
    q->nbuf[q->nbuf_len] = '\0';
    if (!rd_json_number(q->nbuf, (size_t)q->nbuf_len))
        return rd_bad(q, at, RD_MSG_LOADS);
    double x = strtod(q->nbuf, NULL);
    if (!(x >= 0.0 && x <= 1e12)) /* NaN cannot come from the grammar; inf fails too */
        return rd_bad(q, at, RD_MSG_LOADS);
    q->items[q->n_items - 1].value = x;
    q->nbuf_len = 0;
    q->state = RD_S_OBJ_SEP;
    return RD_REQ_MORE;
}

static inline bool rd_is_num_byte(unsigned char c)
{
    return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
}

/* What a member of field's kind must be, for refusals of its value. */
static const char *rd_kind_msg(int field)
{
    switch (rd_req_fields[field].kind) {
    case RD_F_NAMES:
        return RD_MSG_WORKERS;
    case RD_F_LOADS:
        return RD_MSG_LOADS;
    default:
        return "model, lora, salt and tenant must be strings or null";
    }
}

/* The string value just closed: check it and store it. */
static int rd_string_done(rd_req *q, uint64_t at)
{
    if (q->high)
        return rd_bad(q, at, "a \\u escape's high surrogate has no low half");
    if (!rd_utf8_ok((const unsigned char *)q->sbuf, q->s_len))
        return rd_bad(q, at, "a string that is not UTF-8");
    if (rd_req_fields[q->field].kind != RD_F_STRING)
        return rd_name_done(q, at);
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
        if (rd_req_fields[q->field].kind == RD_F_NAMES && c == '[') {
            q->workers_set = true;
            q->state = RD_S_LIST0;
            return RD_REQ_MORE;
        }
        if (rd_req_fields[q->field].kind == RD_F_LOADS && c == '{') {
            q->state = RD_S_OBJ0;
            return RD_REQ_MORE;
        }
        if (c == '"' && rd_req_fields[q->field].kind == RD_F_STRING) {
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
        return rd_bad(q, at, rd_kind_msg(q->field));
    case RD_S_NULL:
        if (c != (unsigned char)"null"[q->lit])
            return rd_bad(q, at, rd_kind_msg(q->field));
        if (++q->lit == 4)
            q->state = RD_S_NEXT;
        return RD_REQ_MORE;
    case RD_S_LIST0:
    case RD_S_LIST_ELEM:
    case RD_S_OBJ0:
    case RD_S_OBJ_KEY:
        if (rd_is_ws(c))
            return RD_REQ_MORE;
        if (c == '"')
            return rd_name_begin(q, at);
        if ((q->state == RD_S_LIST0 && c == ']') || (q->state == RD_S_OBJ0 && c == '}')) {
            q->state = RD_S_NEXT;
            return RD_REQ_MORE;
        }
        return rd_bad(q, at, rd_kind_msg(q->field));
    case RD_S_LIST_SEP:
    case RD_S_OBJ_SEP:
        if (rd_is_ws(c))
            return RD_REQ_MORE;
        if (c == ',')
            q->state = q->state == RD_S_LIST_SEP ? RD_S_LIST_ELEM : RD_S_OBJ_KEY;
        else if (c == (q->state == RD_S_LIST_SEP ? ']' : '}'))
            q->state = RD_S_NEXT;
        else
            return rd_bad(q, at, rd_kind_msg(q->field));
        return RD_REQ_MORE;
    case RD_S_OBJ_COLON:
        if (c == ':')
            q->state = RD_S_OBJ_VAL;
        else if (!rd_is_ws(c))
            return rd_bad(q, at, "expected ':'");
        return RD_REQ_MORE;
    case RD_S_OBJ_VAL:
        if (rd_is_ws(c))
            return RD_REQ_MORE;
        if (c != '-' && (c < '0' || c > '9'))
            return rd_bad(q, at, RD_MSG_LOADS);
        q->nbuf_len = 0;
        q->state = RD_S_REAL;
        return rd_step(q, c, at); /* c is the number's first byte */
    case RD_S_REAL: {
        if (rd_is_num_byte(c)) {
            if ((size_t)q->nbuf_len + 1 >= sizeof q->nbuf)
                return rd_bad(q, at, "a load longer than 31 bytes");
            q->nbuf[q->nbuf_len++] = (char)c;
            return RD_REQ_MORE;
        }
        int rc = rd_real_done(q, at);
        return rc == RD_REQ_MORE ? rd_step(q, c, at) : rc; /* c again, after the number */
    }
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
        if (q->state == RD_S_TEXT) {
            rc = rd_text_add(q, p, (size_t)(end - p));
            if (rc != RD_REQ_MORE) {
                q->state = RD_S_FAILED;
                return rc;
            }
            break;
        }
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

/* Feed s[0 .. n) through the structural states (text mode's members fed back; never token
 * ids, which text mode refuses). Returns RD_REQ_MORE or what the states returned. */
static int rd_feed_states(rd_req *q, const char *s, size_t n)
{
    int rc = RD_REQ_MORE;
    for (size_t i = 0; i < n && rc == RD_REQ_MORE; i++)
        rc = rd_step(q, (unsigned char)s[i], 0);
    return rc;
}

/* Text mode's end: parse text_buf with jansson, keep the text members in q->body and feed
 * the others back through the states as ',"KEY":VALUE' (so workers, loads and strings are
 * checked as in a token request, and a member given twice is refused). Returns
 * RD_REQ_DONE, RD_REQ_BAD or RD_REQ_NOMEM. */
static int rd_text_finish(rd_req *q)
{
    json_error_t e;
    json_t *o = json_loadb(q->text_buf, q->text_n, JSON_REJECT_DUPLICATES, &e);
    if (o == NULL) {
        /* text_buf[i] is body byte text_at + i - 1 (text_buf[0] is the '{' put first); the
         * byte jansson stopped at is text_buf[position - 1]. */
        uint64_t i = e.position > 0 ? (uint64_t)e.position - 1 : 0;
        char msg[sizeof e.text + 16];
        snprintf(msg, sizeof msg, "invalid JSON: %s", e.text);
        return rd_bad(q, i > 0 ? q->text_at + i - 1 : q->text_at, msg);
    }
    q->body = o;
    q->replay = true;
    q->state = RD_S_NEXT; /* as after a member's value */
    const char *key;
    json_t *v;
    int rc = RD_REQ_MORE;
    json_object_foreach(o, key, v)
    {
        size_t i = 0;
        while (i < RD_N_FIELDS && strcmp(rd_req_fields[i].name, key) != 0)
            i++;
        char msg[200];
        if (i == RD_N_FIELDS) {
            snprintf(msg, sizeof msg, "unknown member '%.40s' (" RD_FIELD_LIST ")", key);
            return rd_bad(q, 0, msg);
        }
        if (rd_req_fields[i].kind == RD_F_TEXT)
            continue;
        if (rd_req_fields[i].kind == RD_F_TOKENS)
            return rd_bad(q, 0,
                          "a request has tokens or a text prompt (prompt, messages), not both");
        char *val = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        if (val == NULL)
            return q->state = RD_S_FAILED, RD_REQ_NOMEM;
        size_t vl = strlen(val);
        char head[48];
        int hl = snprintf(head, sizeof head, ",\"%s\":", key);
        rc = rd_feed_states(q, head, (size_t)hl);
        if (rc == RD_REQ_MORE)
            rc = rd_feed_states(q, val, vl);
        free(val);
        if (rc != RD_REQ_MORE)
            return rc;
    }
    rc = rd_feed_states(q, "}", 1);
    if (rc != RD_REQ_MORE)
        return rc;
    return q->state == RD_S_END ? RD_REQ_DONE : rd_bad(q, 0, "the body ends inside the object");
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
    if (q->state == RD_S_TEXT)
        return rd_text_finish(q);
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
    if (q->names_n > q->names_cap || (q->names_cap == 0) != (q->names == NULL))
        return "names past their buffer";
    if (q->n_items > q->cap_items || (q->cap_items == 0) != (q->items == NULL))
        return "more items than capacity";
    if (q->n_items != q->n_workers + q->n_loads)
        return "items and their counts disagree";
    if (q->nbuf_len < 0 || (size_t)q->nbuf_len >= sizeof q->nbuf)
        return "load number past its buffer";
    if ((q->cap_tokens == 0) != (q->tokens == NULL))
        return "token array and capacity disagree";
    if (q->n_carry < 0 || q->n_carry > 3)
        return "binary carry out of range";
    if (q->field >= (int)RD_N_FIELDS)
        return "field out of range";
    if (q->text_n > q->text_cap || (q->text_cap == 0) != (q->text_buf == NULL))
        return "text past its buffer";
    if (q->state == RD_S_TEXT && !q->text)
        return "text state outside text mode";
    if (q->budget && atomic_load(&q->budget->used) < rd_req_reserved(q))
        return "budget below the token array's, names', items' and text's capacity";
    return NULL;
}
