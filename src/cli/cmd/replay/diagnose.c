/*
 * diagnose.c - `kvprefix replay --diagnose`: where shared prefixes break.
 *
 * For every request, find the most similar earlier request of its namespace (the longest
 * common prefix, LCP) and record how far that prefix reaches. When the two then agree again
 * a few tokens later (the next RESYNC_RUN tokens equal, at most RESYNC_MAX tokens after the
 * break, at the same positions), the break is a *divergence point*: a short variable field
 * (a timestamp, a request id) in front of otherwise repeated content. Positions are counted
 * and the most frequent are reported with an example (token ids, or the text around them for
 * OpenAI-style bodies).
 *
 * Layout: a trie of full blocks per namespace, stored as a uthash map from chained block key
 * (the namespace root for the trie root) to a node { latest request through it, first child,
 * next sibling }. Children are prepended, so a walk of siblings sees the most recent first.
 * The request's own symbols are kept (4 bytes each, plus its text for OpenAI bodies) so that
 * the LCP can be measured token by token inside the block where the trie walk stops.
 *
 * Cost: O(n + RECENT_SIBLINGS x block) per request; memory: every prompt symbol and text,
 * plus about 100 bytes per distinct block. It is a diagnostic for logs that fit in memory.
 * Hash-id traces are diagnosed at block granularity (a symbol is one hash id, `unit` tokens);
 * chained ids never agree again after a break, so traces show no divergence points.
 *
 * Causes. For OpenAI bodies (which keep their text) every break is also given a cause, from
 * the first byte where the two prompts differ and, with a chat template, the segment of
 * the prompt holding it (template.h: message i and its role, tool definition j, preamble):
 *
 *   new turn      the earlier request ends there: this one extends it (not a fault)
 *   layout        the byte lies in different parts of the two prompts (message 3 here,
 *                 the system message there): the template put something else first, as
 *                 Mistral's does when it moves the system message into the last user turn
 *   tool order    the byte is in the tool definitions, and both requests have the same
 *                 definitions in a different order
 *   whitespace    the segment (without segments: the rest of the prompt) differs only in
 *                 whitespace bytes
 *   timestamp     a run of digits and separators (: - / . T and spaces) differs, the text
 *                 agrees again right after it, and it is at the start: in the preamble or
 *                 the first message, or within the first 512 bytes without segments
 *   content       anything else, named by its segment
 *
 * and the causes are counted by (cause, segment) with an example each.
 */
#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "replay.h"

/* Node keys are uniform digests and point keys small integers: both hash by their first
 * 8 bytes (which also keeps uthash's default hash, with its case fallthroughs, out). */
#define HASH_FUNCTION(keyptr, keylen, hashv)                                                       \
    do {                                                                                           \
        uint64_t x_;                                                                               \
        memcpy(&x_, (keyptr), sizeof x_);                                                          \
        (hashv) = (unsigned)(x_ ^ (x_ >> 32));                                                     \
    } while (0)
static bool oom_flag; /* set when uthash fails to allocate a table (single-threaded tool) */
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj)                                                                   \
    do {                                                                                           \
        oom_flag = true;                                                                           \
    } while (0)
#include <uthash.h>

#define RECENT_SIBLINGS 64 /* siblings compared at the block where the trie walk stops */
#define RESYNC_MAX      64 /* a variable field is at most this many symbols long */
#define RESYNC_RUN      16 /* symbols that must agree again after it */
#define NONE            UINT32_MAX

typedef struct node {
    kvp_key key;               /* chained key of the block (the namespace root for a trie root) */
    uint32_t req;              /* latest request whose prompt went through this block; NONE for a
                                  root no request has passed yet */
    struct node *first_child;  /* most recent child first */
    struct node *next_sibling; /* older sibling */
    uint32_t block;            /* index of the block in the prompt (roots: UINT32_MAX) */
    UT_hash_handle hh;         /* map by key */
} node;

typedef struct dreq {
    uint32_t *sym; /* prompt symbols, owned */
    size_t n;      /* symbols */
    char *text;    /* rendered prompt, owned, or NULL */
    size_t text_len;
    uint32_t *offsets; /* byte offset of each symbol in text, owned, or NULL */
    tpl_seg *segs;     /* the text's template segments, owned, or NULL */
    size_t n_segs;     /* segments */
    uint64_t line_no;  /* line in the log */
} dreq;

enum {
    CAUSE_TURN = 1,   /* the earlier request ends: a new turn extends it */
    CAUSE_LAYOUT,     /* the byte is in different segments of the two prompts */
    CAUSE_TOOLS,      /* tool definitions reordered */
    CAUSE_WHITESPACE, /* a whitespace-only difference */
    CAUSE_TIMESTAMP,  /* a timestamp-like run at the start */
    CAUSE_CONTENT     /* the content differs */
};

/* One (cause, segment) pair and how often it ended a shared prefix. */
typedef struct cause {
    int kind;                 /* CAUSE_* */
    int seg_kind;             /* TPL_SEG_* of the segment, 0 without segments */
    uint32_t index;           /* the segment's message or tool index */
    char role[16];            /* the segment's role */
    int other_kind;           /* CAUSE_LAYOUT: the earlier request's segment there */
    uint32_t other_index;     /* its index */
    char other_role[16];      /* its role */
    uint64_t n;               /* breaks */
    uint32_t ex_req, ex_prev; /* an example: this request and the earlier one */
    size_t ex_byte;           /* where their texts first differ */
} cause;

typedef struct point {
    uint64_t pos;             /* symbol position where prefixes break (the map key) */
    uint64_t n;               /* breaks at this position */
    uint64_t n_resync;        /* of those, followed by repeated content */
    uint64_t run_sum;         /* symbols that agree again after the field, summed over resyncs */
    uint64_t span_sum;        /* length of the variable field, summed over resyncs */
    uint32_t ex_req, ex_prev; /* an example: this request and the earlier one */
    bool ex_resync;           /* the example is a resync */
    UT_hash_handle hh;        /* map by pos */
} point;

struct rp_diag {
    uint32_t block_size; /* symbols per trie block */
    uint32_t unit;       /* tokens per symbol */
    node *nodes;         /* uthash map */
    dreq *reqs;          /* every request */
    size_t n_reqs, reqs_cap;
    point *points;      /* uthash map of break positions */
    uint64_t n_first;   /* requests first in their namespace (nothing to compare with) */
    uint64_t n_full;    /* requests entirely covered by an earlier one */
    uint64_t bucket[5]; /* LCP / prompt: 0, (0,25%), [25,50%), [50,75%), [75,100%) */
    uint64_t *lcps;     /* LCP of each compared request, in symbols */
    size_t n_lcps, lcps_cap;
    kvp_key *keys; /* scratch: block keys of the current request */
    size_t keys_cap;
    cause *causes; /* OpenAI bodies: breaks by cause, in order of first appearance */
    size_t n_causes, causes_cap;
    uint64_t n_text_breaks; /* breaks between two requests that both have text */
};

rp_diag *rp_diag_new(uint32_t block_size, uint32_t unit)
{
    rp_diag *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->block_size = block_size ? block_size : 1;
    d->unit = unit ? unit : 1;
    return d;
}

static node *node_find(rp_diag *d, kvp_key k)
{
    node *n;
    HASH_FIND(hh, d->nodes, &k, sizeof k, n);
    return n;
}

static node *node_add(rp_diag *d, kvp_key k, uint32_t req, uint32_t block, node *parent)
{
    node *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->key = k;
    n->req = req;
    n->block = block;
    oom_flag = false;
    HASH_ADD(hh, d->nodes, key, sizeof n->key, n);
    if (oom_flag && node_find(d, k) != n) {
        free(n);
        return NULL;
    }
    if (parent) {
        n->next_sibling = parent->first_child;
        parent->first_child = n;
    }
    return n;
}

static size_t common(const uint32_t *a, size_t na, const uint32_t *b, size_t nb)
{
    size_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* Record a break at pos between request r and the earlier request e. */
static int record_break(rp_diag *d, uint32_t r, uint32_t e, size_t pos)
{
    const dreq *a = &d->reqs[r], *b = &d->reqs[e];
    size_t span = 0, run = 0;
    for (size_t w = 1; w <= RESYNC_MAX; w++) {
        if (pos + w + RESYNC_RUN > a->n || pos + w + RESYNC_RUN > b->n)
            break;
        if (memcmp(a->sym + pos + w, b->sym + pos + w, RESYNC_RUN * sizeof *a->sym) == 0) {
            span = w;
            run = common(a->sym + pos + w, a->n - pos - w, b->sym + pos + w, b->n - pos - w);
            break;
        }
    }
    uint64_t key = pos;
    point *p;
    HASH_FIND(hh, d->points, &key, sizeof key, p);
    if (!p) {
        p = calloc(1, sizeof *p);
        if (!p)
            return -1;
        p->pos = key;
        p->ex_req = r;
        p->ex_prev = e;
        oom_flag = false;
        HASH_ADD(hh, d->points, pos, sizeof p->pos, p);
        if (oom_flag) {
            point *check;
            HASH_FIND(hh, d->points, &key, sizeof key, check);
            if (check != p) {
                free(p);
                return -1;
            }
        }
    }
    p->n++;
    if (span) {
        p->n_resync++;
        p->run_sum += run;
        p->span_sum += span;
        if (!p->ex_resync) {
            p->ex_req = r;
            p->ex_prev = e;
            p->ex_resync = true;
        }
    }
    return 0;
}

/* Keep an owned copy of a request's symbols (and text and offsets) as request r. Returns 0,
 * or -1 on out of memory with nothing kept. */
static int keep_request(rp_diag *d, const uint32_t *sym, size_t n, const char *text,
                        size_t text_len, const uint32_t *offsets, const tpl_seg *segs,
                        size_t n_segs, uint64_t line_no)
{
    dreq q = {malloc((n ? n : 1) * sizeof *sym), n, NULL, text_len, NULL, NULL, 0, line_no};
    if (!q.sym)
        return -1;
    if (n)
        memcpy(q.sym, sym, n * sizeof *sym);
    if (text && offsets) {
        q.text = malloc(text_len + 1);
        q.offsets = malloc((n ? n : 1) * sizeof *offsets);
        if (!q.text || !q.offsets) {
            free(q.sym);
            free(q.text);
            free(q.offsets);
            return -1;
        }
        memcpy(q.text, text, text_len);
        q.text[text_len] = '\0';
        if (n)
            memcpy(q.offsets, offsets, n * sizeof *offsets);
        if (segs != NULL && n_segs > 0) {
            q.segs = malloc(n_segs * sizeof *segs);
            if (q.segs == NULL) {
                free(q.sym);
                free(q.text);
                free(q.offsets);
                return -1;
            }
            memcpy(q.segs, segs, n_segs * sizeof *segs);
            q.n_segs = n_segs;
        }
    }
    d->reqs[d->n_reqs++] = q;
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* ---- causes ------------------------------------------------------------------------------ */

#define TS_START_BYTES 512 /* "at the start" for prompts without segments */

static inline bool is_ws(unsigned char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

static inline bool is_ts_char(unsigned char c)
{
    return (c >= '0' && c <= '9') || c == ':' || c == '-' || c == '/' || c == '.' || c == 'T' ||
           c == 'Z' || c == '+' || c == ' ' || c == ',';
}

/* The segment of q holding byte b, or NULL when q has none. */
static const tpl_seg *seg_of(const dreq *q, size_t b)
{
    return q->segs ? tpl_seg_at(q->segs, q->n_segs, (uint32_t)b) : NULL;
}

static size_t seg_end(const dreq *q, size_t k)
{
    return k + 1 < q->n_segs ? q->segs[k + 1].offset : q->text_len;
}

/* A walk over the non-whitespace bytes of the pieces of one segment (kind, index) of q, or,
 * without segments, of q->text[from, to). */
typedef struct ws_cursor {
    const dreq *q;
    int kind;       /* segment kind, 0 for the plain range */
    uint32_t index; /* segment index */
    size_t k;       /* current segment */
    size_t pos;     /* next byte */
    size_t end;     /* end of the current piece */
} ws_cursor;

/* The next non-whitespace byte, or -1 at the end. */
static int ws_next(ws_cursor *c)
{
    for (;;) {
        while (c->pos < c->end) {
            unsigned char b = (unsigned char)c->q->text[c->pos++];
            if (!is_ws(b))
                return b;
        }
        if (c->kind == 0)
            return -1;
        while (++c->k < c->q->n_segs &&
               !(c->q->segs[c->k].kind == c->kind && c->q->segs[c->k].index == c->index))
            ;
        if (c->k >= c->q->n_segs)
            return -1;
        c->pos = c->q->segs[c->k].offset;
        c->end = seg_end(c->q, c->k);
    }
}

static ws_cursor ws_begin(const dreq *q, const tpl_seg *s, size_t from, size_t to)
{
    ws_cursor c = {q, s ? s->kind : 0, s ? s->index : 0, SIZE_MAX, from, to};
    if (s != NULL) {
        c.end = c.pos = 0; /* ws_next moves to the first piece */
        c.k = SIZE_MAX;
        for (size_t k = 0; k < q->n_segs; k++)
            if (q->segs[k].kind == s->kind && q->segs[k].index == s->index) {
                c.k = k;
                c.pos = q->segs[k].offset;
                c.end = seg_end(q, k);
                break;
            }
        if (c.k == SIZE_MAX)
            c.k = q->n_segs;
    }
    return c;
}

/* Whether the two requests differ only in whitespace around byte c: within the segment
 * holding it (all its pieces), or without segments up to the next end-of-turn marker. */
static bool whitespace_only(const dreq *a, const dreq *b, size_t c)
{
    const tpl_seg *s = seg_of(a, c);
    size_t ea = a->text_len, eb = b->text_len;
    if (s == NULL) {
        const char *ma = strstr(a->text + c, "<|im_end|>"), *mb = strstr(b->text + c, "<|im_end|>");
        ea = ma ? (size_t)(ma - a->text) : ea;
        eb = mb ? (size_t)(mb - b->text) : eb;
    }
    ws_cursor x = ws_begin(a, s, 0, ea), y = ws_begin(b, s, 0, eb);
    for (;;) {
        int p = ws_next(&x), q = ws_next(&y);
        if (p != q)
            return false;
        if (p < 0)
            return true;
    }
}

/* FNV-1a of a tool definition's text without its trailing separators (", " "]" "\n"). */
static uint64_t tool_hash(const dreq *q, size_t k)
{
    size_t a = q->segs[k].offset, b = seg_end(q, k);
    while (b > a &&
           (q->text[b - 1] == ',' || q->text[b - 1] == ']' || is_ws((unsigned char)q->text[b - 1])))
        b--;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = a; i < b; i++)
        h = (h ^ (unsigned char)q->text[i]) * 1099511628211ULL;
    return h;
}

/* The hashes of q's tool definitions into h (room for 64), in order. Returns their number
 * (stops at 64). */
static size_t tool_hashes(const dreq *q, uint64_t *h)
{
    size_t n = 0;
    for (size_t k = 0; k < q->n_segs && n < 64; k++)
        if (q->segs[k].kind == TPL_SEG_TOOL)
            h[n++] = tool_hash(q, k);
    return n;
}

/* Whether a and b have the same tool definitions in a different order. */
static bool tools_reordered(const dreq *a, const dreq *b)
{
    uint64_t ha[64], hb[64];
    size_t na = tool_hashes(a, ha), nb = tool_hashes(b, hb);
    if (na != nb || na < 2 || memcmp(ha, hb, na * sizeof *ha) == 0)
        return false;
    qsort(ha, na, sizeof *ha, cmp_u64);
    qsort(hb, nb, sizeof *hb, cmp_u64);
    return memcmp(ha, hb, na * sizeof *ha) == 0;
}

/* Whether the difference at byte c is a timestamp-like run at the start: digits and
 * separators that differ, the same text right after them, in the preamble or the first
 * message (without segments: the first TS_START_BYTES bytes). */
static bool timestamp_at_start(const dreq *a, const dreq *b, size_t c)
{
    const tpl_seg *s = seg_of(a, c);
    bool start = s ? s->kind == TPL_SEG_PREAMBLE || (s->kind == TPL_SEG_MESSAGE && s->index == 0)
                   : c < TS_START_BYTES;
    if (!start || !(isdigit((unsigned char)a->text[c]) || isdigit((unsigned char)b->text[c])))
        return false;
    size_t i = c;
    while (i > 0 && is_ts_char((unsigned char)a->text[i - 1]))
        i--;
    size_t ja = c, jb = c, digits = 0;
    while (ja < a->text_len && is_ts_char((unsigned char)a->text[ja]))
        ja++;
    while (jb < b->text_len && is_ts_char((unsigned char)b->text[jb]))
        jb++;
    for (size_t k = i; k < ja; k++)
        digits += isdigit((unsigned char)a->text[k]) != 0;
    size_t after = 8;
    if (a->text_len - ja < after || b->text_len - jb < after)
        after = a->text_len - ja == b->text_len - jb ? a->text_len - ja : SIZE_MAX;
    return digits >= 4 && after != SIZE_MAX && memcmp(a->text + ja, b->text + jb, after) == 0;
}

/* The key fields of a cause: kind, and the segment (or none) in this and the earlier
 * request, as the cause names them. */
static cause cause_key(int k, const tpl_seg *s, const tpl_seg *other)
{
    cause x;
    memset(&x, 0, sizeof x);
    x.kind = k;
    if (s != NULL && k != CAUSE_TOOLS) {
        x.seg_kind = s->kind;
        x.index = s->index;
        snprintf(x.role, sizeof x.role, "%s", s->role);
    } else if (s != NULL) {
        x.seg_kind = TPL_SEG_TOOL;
    }
    if (other != NULL && k == CAUSE_LAYOUT) {
        x.other_kind = other->kind;
        x.other_index = other->index;
        snprintf(x.other_role, sizeof x.other_role, "%s", other->role);
    }
    return x;
}

static bool same_cause(const cause *a, const cause *b)
{
    return a->kind == b->kind && a->seg_kind == b->seg_kind && a->index == b->index &&
           strcmp(a->role, b->role) == 0 && a->other_kind == b->other_kind &&
           a->other_index == b->other_index && strcmp(a->other_role, b->other_role) == 0;
}

/* Count one break of kind k at segment s (other: the earlier request's there) with an
 * example. Returns 0 or -1 on out of memory. */
static int add_cause(rp_diag *d, int k, const tpl_seg *s, const tpl_seg *other, uint32_t r,
                     uint32_t e, size_t c)
{
    cause key = cause_key(k, s, other);
    for (size_t i = 0; i < d->n_causes; i++)
        if (same_cause(&d->causes[i], &key)) {
            d->causes[i].n++;
            return 0;
        }
    if (!cli_grow((void **)&d->causes, &d->causes_cap, d->n_causes + 1, sizeof *d->causes))
        return -1;
    key.n = 1;
    key.ex_req = r;
    key.ex_prev = e;
    key.ex_byte = c;
    d->causes[d->n_causes++] = key;
    return 0;
}

/* Name the cause of the break at symbol lcp between request r and the earlier request e
 * (both with text) and count it. Returns 0 or -1 on out of memory. */
static int record_cause(rp_diag *d, uint32_t r, uint32_t e, size_t lcp)
{
    const dreq *a = &d->reqs[r], *b = &d->reqs[e];
    size_t c = lcp < a->n ? a->offsets[lcp] : a->text_len;
    while (c < a->text_len && c < b->text_len && a->text[c] == b->text[c])
        c++;
    d->n_text_breaks++;
    if (lcp >= b->n || c >= b->text_len)
        return add_cause(d, CAUSE_TURN, NULL, NULL, r, e, c);
    if (c >= a->text_len)
        c = a->text_len - (a->text_len > 0);
    const tpl_seg *s = seg_of(a, c), *o = seg_of(b, c);
    int k = CAUSE_CONTENT;
    if (s && s->kind == TPL_SEG_TOOL && tools_reordered(a, b))
        k = CAUSE_TOOLS;
    else if (s && o && (s->kind != o->kind || s->index != o->index))
        k = CAUSE_LAYOUT;
    else if (whitespace_only(a, b, c))
        k = CAUSE_WHITESPACE;
    else if (timestamp_at_start(a, b, c))
        k = CAUSE_TIMESTAMP;
    return add_cause(d, k, s, o, r, e, c);
}

/* Compare request r (symbols sym[0 .. n)) with the most similar earlier request: the best of
 * the recent siblings under at (matched blocks in), or the latest request through at; count
 * its common prefix and record where it breaks. Returns 0 or -1 on out of memory. */
static int compare_earlier(rp_diag *d, uint32_t r, const uint32_t *sym, size_t n, const node *at,
                           size_t matched)
{
    size_t bs = d->block_size;
    uint32_t best = at->req;
    size_t best_lcp = 0, k = 0;
    for (node *c = at->first_child; c && k < RECENT_SIBLINGS; c = c->next_sibling, k++) {
        const dreq *e = &d->reqs[c->req];
        size_t off = matched * bs;
        size_t l = off < e->n && off < n ? common(sym + off, n - off, e->sym + off, e->n - off) : 0;
        if (best == NONE || l > best_lcp) {
            best = c->req;
            best_lcp = l;
        }
    }
    if (best == NONE) {
        d->n_first++;
        return 0;
    }
    const dreq *e = &d->reqs[best];
    size_t lcp = common(sym, n, e->sym, e->n);
    d->lcps[d->n_lcps++] = lcp;
    double f = n ? (double)lcp / (double)n : 0.0;
    d->bucket[lcp == 0 ? 0 : f < 0.25 ? 1 : f < 0.5 ? 2 : f < 0.75 ? 3 : 4]++;
    if (lcp == n) {
        d->n_full++;
        return 0;
    }
    if (e->text != NULL && d->reqs[r].text != NULL && record_cause(d, r, best, lcp) != 0)
        return -1;
    return record_break(d, r, best, lcp);
}

/* Step 1 keep the request; Step 2 walk the trie as far as its blocks go; Step 3 compare it
 * with the most similar earlier request; Step 4 insert the rest of its blocks and mark the
 * matched path with it. */
int rp_diag_add(rp_diag *d, kvp_key root, const uint32_t *sym, size_t n, const char *text,
                size_t text_len, const uint32_t *offsets, const tpl_seg *segs, size_t n_segs,
                uint64_t line_no)
{
    size_t bs = d->block_size;
    size_t n_full = n / bs;
    if (d->n_reqs >= NONE - 1)
        return 0; /* enough to diagnose; the rest is not recorded */
    if (!cli_grow((void **)&d->reqs, &d->reqs_cap, d->n_reqs + 1, sizeof *d->reqs) ||
        !cli_grow((void **)&d->lcps, &d->lcps_cap, d->n_reqs + 1, sizeof *d->lcps) ||
        !cli_grow((void **)&d->keys, &d->keys_cap, n_full, sizeof *d->keys))
        return -1;
    /* Step 1: */
    uint32_t r = (uint32_t)d->n_reqs;
    if (keep_request(d, sym, n, text, text_len, offsets, segs, n_segs, line_no) != 0)
        return -1;
    size_t n_keys = 0;
    if (kvp_hash_blocks(0, root, sym, n, (uint32_t)bs, d->keys, n_full, &n_keys) != KVP_OK)
        return -1; /* not with a block size the replay accepted */

    /* Step 2: */
    node *at = node_find(d, root);
    if (!at && !(at = node_add(d, root, NONE, UINT32_MAX, NULL)))
        return -1;
    size_t matched = 0;
    for (node *c; matched < n_keys && (c = node_find(d, d->keys[matched])) != NULL; matched++)
        at = c;

    /* Step 3: */
    if (compare_earlier(d, r, sym, n, at, matched) != 0)
        return -1;

    /* Step 4: */
    at->req = r;
    for (size_t i = 0; i < matched; i++)
        node_find(d, d->keys[i])->req = r;
    for (size_t i = matched; i < n_keys; i++) {
        node *c = node_add(d, d->keys[i], r, (uint32_t)i, at);
        if (!c)
            return -1;
        at = c;
    }
    return 0;
}

/* Points ordered: resyncs first (most frequent first), then by frequency, then position. */
static int cmp_point(const void *a, const void *b)
{
    const point *x = *(const point *const *)a, *y = *(const point *const *)b;
    if (x->n_resync != y->n_resync)
        return x->n_resync > y->n_resync ? -1 : 1;
    if (x->n != y->n)
        return x->n > y->n ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* Points ordered by frequency alone, then position. */
static int cmp_point_n(const void *a, const void *b)
{
    const point *x = *(const point *const *)a, *y = *(const point *const *)b;
    if (x->n != y->n)
        return x->n > y->n ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static point **sorted_points(const rp_diag *d, size_t *n_out)
{
    size_t n = HASH_COUNT(d->points), i = 0;
    point **v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return NULL;
    for (point *p = d->points; p; p = p->hh.next)
        v[i++] = p;
    qsort(v, n, sizeof *v, cmp_point);
    *n_out = n;
    return v;
}

/* The text (or symbols) of request q around symbol position pos into buf. */
static void excerpt(const rp_diag *d, const dreq *q, size_t pos, size_t span, char *buf,
                    size_t size)
{
    size_t from = pos > 12 ? pos - 12 : 0, to = pos + span + 6;
    to = to < q->n ? to : q->n;
    size_t j = 0;
    buf[0] = '\0';
    if (q->text) {
        size_t a = from < q->n ? q->offsets[from] : q->text_len;
        size_t b = to < q->n ? q->offsets[to] : q->text_len;
        size_t mark = pos < q->n ? q->offsets[pos] : q->text_len;
        for (size_t i = a; i < b && i <= q->text_len && j + 8 < size; i++) {
            if (i == mark)
                buf[j++] = '|';
            unsigned char c = (unsigned char)q->text[i];
            if (c == '\n') {
                buf[j++] = '\\';
                buf[j++] = 'n';
            } else if (c < 0x20 || c == 0x7f) {
                j += (size_t)snprintf(buf + j, size - j, "\\x%02x", c);
            } else {
                buf[j++] = (char)c;
            }
        }
        buf[j] = '\0';
        return;
    }
    for (size_t i = from; i < to && j + 16 < size; i++)
        j += (size_t)snprintf(buf + j, size - j, "%s%s%u", i == from ? "" : " ",
                              i == pos ? "| " : "", q->sym[i]);
    (void)d;
}

/* Nearest-rank p50 and p90 of the common-prefix lengths, in tokens. Returns 0, or -1 on
 * out of memory. */
static int lcp_percentiles(const rp_diag *d, uint64_t *p50, uint64_t *p90)
{
    size_t n = d->n_lcps;
    *p50 = *p90 = 0;
    if (n == 0)
        return 0;
    uint64_t *l = malloc(n * sizeof *l);
    if (!l)
        return -1;
    memcpy(l, d->lcps, n * sizeof *l);
    qsort(l, n, sizeof *l, cmp_u64);
    *p50 = l[(n - 1) / 2] * d->unit;
    *p90 = l[(n * 9 + 9) / 10 - 1] * d->unit;
    free(l);
    return 0;
}

static const char *cause_name(int k)
{
    static const char *const names[] = {"?",          "new turn",  "layout", "tool order",
                                        "whitespace", "timestamp", "content"};
    _Static_assert(sizeof names / sizeof names[0] == CAUSE_CONTENT + 1, "a name per cause");
    return k >= CAUSE_TURN && k <= CAUSE_CONTENT ? names[k] : names[0];
}

/* Where a segment is, in words: "message 3 (user)". */
static void seg_words(int kind, uint32_t index, const char *role, char *buf, size_t size)
{
    switch (kind) {
    case TPL_SEG_MESSAGE:
        snprintf(buf, size, "message %u (%s)", index, role);
        break;
    case TPL_SEG_TOOL:
        snprintf(buf, size, "tool definition %u", index);
        break;
    case TPL_SEG_PREAMBLE:
        snprintf(buf, size, "the template's preamble");
        break;
    case TPL_SEG_GEN:
        snprintf(buf, size, "the generation prompt");
        break;
    default:
        snprintf(buf, size, "the prompt");
    }
}

/* What a cause says, for the table: "whitespace-only difference in message 0 (system)". */
static void cause_text(const cause *x, char *buf, size_t size)
{
    char where[48], other[48];
    seg_words(x->seg_kind, x->index, x->role, where, sizeof where);
    seg_words(x->other_kind, x->other_index, x->other_role, other, sizeof other);
    switch (x->kind) {
    case CAUSE_TURN:
        snprintf(buf, size, "new turn: the earlier request ends there (not a fault)");
        break;
    case CAUSE_LAYOUT:
        snprintf(buf, size, "layout: %s here, %s in the earlier request", where, other);
        break;
    case CAUSE_TOOLS:
        snprintf(buf, size, "tool definitions reordered (same tools, another order)");
        break;
    case CAUSE_WHITESPACE:
        snprintf(buf, size, "whitespace-only difference in %s", where);
        break;
    case CAUSE_TIMESTAMP:
        snprintf(buf, size, "timestamp-like run at the start, in %s", where);
        break;
    default:
        snprintf(buf, size, "content differs in %s", where);
    }
}

/* The text of q around byte c (40 bytes before, 30 after), '|' at c, escaped, into buf. */
static void byte_excerpt(const dreq *q, size_t c, char *buf, size_t size)
{
    size_t from = c > 40 ? c - 40 : 0, to = c + 30 < q->text_len ? c + 30 : q->text_len, j = 0;
    for (size_t i = from; i <= to && j + 8 < size; i++) {
        if (i == c)
            buf[j++] = '|';
        if (i == to)
            break;
        unsigned char ch = (unsigned char)q->text[i];
        if (ch == '\n') {
            buf[j++] = '\\';
            buf[j++] = 'n';
        } else if (ch < 0x20 || ch == 0x7f) {
            j += (size_t)snprintf(buf + j, size - j, "\\x%02x", ch);
        } else {
            buf[j++] = (char)ch;
        }
    }
    buf[j] = '\0';
}

static int cmp_cause(const void *a, const void *b)
{
    const cause *x = *(const cause *const *)a, *y = *(const cause *const *)b;
    if (x->n != y->n)
        return x->n > y->n ? -1 : 1;
    return x->kind - y->kind;
}

/* The causes ordered by frequency, or NULL (out of memory, or none). */
static const cause **sorted_causes(const rp_diag *d)
{
    const cause **v = malloc((d->n_causes ? d->n_causes : 1) * sizeof *v);
    if (v == NULL)
        return NULL;
    for (size_t i = 0; i < d->n_causes; i++)
        v[i] = &d->causes[i];
    qsort(v, d->n_causes, sizeof *v, cmp_cause);
    return v;
}

/* The causes section of the table report. Returns 0 or -1 (out of memory). */
static int print_causes(const rp_diag *d, FILE *f, unsigned top)
{
    if (d->n_causes == 0)
        return 0;
    const cause **v = sorted_causes(d);
    if (v == NULL)
        return -1;
    fprintf(f,
            "  why shared prefixes end (first differing byte against the most similar earlier "
            "request, %llu requests):\n",
            (unsigned long long)d->n_text_breaks);
    fprintf(f, "    %9s  %s\n", "requests", "cause");
    char t[192];
    for (size_t i = 0; i < d->n_causes && i < top; i++) {
        cause_text(v[i], t, sizeof t);
        fprintf(f, "    %9llu  %s\n", (unsigned long long)v[i]->n, t);
    }
    bool shown[CAUSE_CONTENT + 1] = {false};
    for (size_t i = 0; i < d->n_causes && i < top; i++) {
        if (v[i]->kind == CAUSE_TURN || shown[v[i]->kind])
            continue;
        shown[v[i]->kind] = true; /* one example of each cause */
        char a[512], b[512];
        const dreq *qa = &d->reqs[v[i]->ex_req], *qb = &d->reqs[v[i]->ex_prev];
        byte_excerpt(qa, v[i]->ex_byte, a, sizeof a);
        byte_excerpt(qb, v[i]->ex_byte, b, sizeof b);
        fprintf(f,
                "    example of %s (byte %zu, | marks it):\n      line %llu: %s\n"
                "      line %llu: %s\n",
                cause_name(v[i]->kind), v[i]->ex_byte, (unsigned long long)qa->line_no, a,
                (unsigned long long)qb->line_no, b);
    }
    free(v);
    return 0;
}

/* The causes as a JSON array, or NULL on out of memory. */
static json_t *causes_json(const rp_diag *d, unsigned top)
{
    json_t *arr = json_array();
    const cause **v = sorted_causes(d);
    if (arr == NULL || v == NULL) {
        json_decref(arr);
        free(v);
        return NULL;
    }
    for (size_t i = 0; i < d->n_causes && i < top; i++) {
        char t[192], a[512];
        cause_text(v[i], t, sizeof t);
        const dreq *qa = &d->reqs[v[i]->ex_req];
        byte_excerpt(qa, v[i]->ex_byte, a, sizeof a);
        json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I}", "cause", cause_name(v[i]->kind),
                              "description", t, "requests", (json_int_t)v[i]->n, "example_line",
                              (json_int_t)qa->line_no, "earlier_line",
                              (json_int_t)d->reqs[v[i]->ex_prev].line_no, "byte",
                              (json_int_t)v[i]->ex_byte);
        if (o == NULL)
            continue;
        if (v[i]->seg_kind == TPL_SEG_MESSAGE && v[i]->kind != CAUSE_TOOLS) {
            json_object_set_new(o, "message", json_integer(v[i]->index));
            json_object_set_new(o, "role", json_string(v[i]->role));
        }
        json_t *ex = json_string(a);
        json_object_set_new(o, "example", ex ? ex : json_null());
        json_array_append_new(arr, o);
    }
    free(v);
    return arr;
}

int rp_diag_print(const rp_diag *d, FILE *f, unsigned top)
{
    uint64_t n_cmp = d->n_lcps;
    fprintf(f, "\nPrompt layout (--diagnose): %llu requests, %llu first of their namespace\n",
            (unsigned long long)d->n_reqs, (unsigned long long)d->n_first);
    if (n_cmp) {
        uint64_t p50, p90;
        if (lcp_percentiles(d, &p50, &p90) != 0)
            return -1;
        fprintf(f,
                "  common prefix with the most similar earlier request: p50 %llu, p90 %llu "
                "tokens\n",
                (unsigned long long)p50, (unsigned long long)p90);
        static const char *const names[5] = {"none", "under 25%", "25-50%", "50-75%",
                                             "75% or more"};
        fprintf(f, "  share of the prompt it covers:");
        for (int i = 0; i < 5; i++)
            fprintf(f, "  %s %llu", names[i], (unsigned long long)d->bucket[i]);
        fprintf(f, "  (all of it: %llu)\n", (unsigned long long)d->n_full);
    }
    size_t n;
    point **v = sorted_points(d, &n);
    if (!v)
        return -1;
    size_t n_resync = 0;
    while (n_resync < n && v[n_resync]->n_resync > 0)
        n_resync++;
    if (n_resync == 0) {
        fprintf(f, "  no divergence point: where prefixes break, the content after the break "
                   "differs too\n");
    } else {
        fprintf(f, "  divergence points: the prompt breaks, then agrees again a few tokens "
                   "later (a timestamp or id in front of repeated content)\n");
        fprintf(f, "  %10s %9s %12s %16s\n", "position", "requests", "field (avg)",
                "agree after (avg)");
        for (size_t i = 0; i < n_resync && i < top; i++) {
            const point *p = v[i];
            fprintf(f, "  %10llu %9llu %8.1f tok %12.1f tok\n",
                    (unsigned long long)(p->pos * d->unit), (unsigned long long)p->n_resync,
                    (double)p->span_sum / (double)p->n_resync * d->unit,
                    (double)p->run_sum / (double)p->n_resync * d->unit);
        }
        for (size_t i = 0; i < n_resync && i < 2; i++) {
            const point *p = v[i];
            char a[512], b[512];
            excerpt(d, &d->reqs[p->ex_req], p->pos, 8, a, sizeof a);
            excerpt(d, &d->reqs[p->ex_prev], p->pos, 8, b, sizeof b);
            fprintf(f,
                    "  example at position %llu (| marks it):\n    line %llu: %s\n"
                    "    line %llu: %s\n",
                    (unsigned long long)(p->pos * d->unit),
                    (unsigned long long)d->reqs[p->ex_req].line_no, a,
                    (unsigned long long)d->reqs[p->ex_prev].line_no, b);
        }
    }
    fprintf(f, "  where common prefixes end most often:");
    qsort(v, n, sizeof *v, cmp_point_n);
    for (size_t i = 0; i < n && i < top; i++)
        fprintf(f, "%s %llu (%llu)", i ? "," : "", (unsigned long long)(v[i]->pos * d->unit),
                (unsigned long long)v[i]->n);
    fprintf(f, "%s\n", n ? "  [token position (requests)]" : " -");
    free(v);
    if (print_causes(d, f, top) != 0)
        return -1;
    return ferror(f) ? -1 : 0;
}

json_t *rp_diag_json(const rp_diag *d, unsigned top)
{
    json_t *j = json_object();
    if (!j)
        return NULL;
    json_object_set_new(j, "requests", json_integer((json_int_t)d->n_reqs));
    json_object_set_new(j, "first_in_namespace", json_integer((json_int_t)d->n_first));
    uint64_t p50, p90;
    if (lcp_percentiles(d, &p50, &p90) == 0 && d->n_lcps > 0) {
        json_object_set_new(j, "common_prefix_p50_tokens", json_integer((json_int_t)p50));
        json_object_set_new(j, "common_prefix_p90_tokens", json_integer((json_int_t)p90));
    }
    json_object_set_new(j, "fully_covered", json_integer((json_int_t)d->n_full));
    json_t *b = json_array();
    for (int i = 0; i < 5; i++)
        json_array_append_new(b, json_integer((json_int_t)d->bucket[i]));
    json_object_set_new(j, "coverage_buckets", b);
    size_t n;
    point **v = sorted_points(d, &n);
    json_t *arr = json_array();
    for (size_t i = 0; v && i < n && i < top; i++) {
        const point *p = v[i];
        json_t *o = json_object();
        json_object_set_new(o, "position_tokens", json_integer((json_int_t)(p->pos * d->unit)));
        json_object_set_new(o, "requests", json_integer((json_int_t)p->n));
        json_object_set_new(o, "resynced", json_integer((json_int_t)p->n_resync));
        if (p->n_resync) {
            json_object_set_new(o, "mean_field_tokens",
                                json_real((double)p->span_sum / (double)p->n_resync * d->unit));
            json_object_set_new(o, "mean_agree_after_tokens",
                                json_real((double)p->run_sum / (double)p->n_resync * d->unit));
        }
        char a[512];
        excerpt(d, &d->reqs[p->ex_req], p->pos, 8, a, sizeof a);
        json_object_set_new(o, "example_line",
                            json_integer((json_int_t)d->reqs[p->ex_req].line_no));
        json_t *ex = json_string(a);
        json_object_set_new(o, "example", ex ? ex : json_null());
        json_object_set_new(o, "earlier_line",
                            json_integer((json_int_t)d->reqs[p->ex_prev].line_no));
        json_array_append_new(arr, o);
    }
    free(v);
    json_object_set_new(j, "break_points", arr);
    if (d->n_causes > 0) {
        json_t *c = causes_json(d, top);
        json_object_set_new(j, "causes", c ? c : json_null());
    }
    return j;
}

void rp_diag_free(rp_diag *d)
{
    if (!d)
        return;
    node *n, *tn;
    HASH_ITER(hh, d->nodes, n, tn)
    {
        HASH_DEL(d->nodes, n);
        free(n);
    }
    point *p, *tp;
    HASH_ITER(hh, d->points, p, tp)
    {
        HASH_DEL(d->points, p);
        free(p);
    }
    for (size_t i = 0; i < d->n_reqs; i++) {
        free(d->reqs[i].sym);
        free(d->reqs[i].text);
        free(d->reqs[i].offsets);
        free(d->reqs[i].segs);
    }
    free(d->causes);
    free(d->reqs);
    free(d->lcps);
    free(d->keys);
    free(d);
}
