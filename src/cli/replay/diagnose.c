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
 */
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
    uint64_t line_no;  /* line in the log */
} dreq;

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
                        size_t text_len, const uint32_t *offsets, uint64_t line_no)
{
    dreq q = {malloc((n ? n : 1) * sizeof *sym), n, NULL, text_len, NULL, line_no};
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
    }
    d->reqs[d->n_reqs++] = q;
    return 0;
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
    if (keep_request(d, sym, n, text, text_len, offsets, line_no) != 0)
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

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
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
    }
    free(d->reqs);
    free(d->lcps);
    free(d->keys);
    free(d);
}
