/*
 * metrics.c - the cache's counters and gauges in the Prometheus text exposition format 0.0.4
 * (kvp_cache_metrics).
 *
 * Output. One family per figure, each as "# HELP", "# TYPE" and its sample lines:
 *
 *   # HELP kvprefix_prefix_cache_queries_total Prompt tokens queried ...
 *   # TYPE kvprefix_prefix_cache_queries_total counter
 *   kvprefix_prefix_cache_queries_total{model="m",engine="e"} 1234
 *
 * Counters come from kvp_stats and end in _total; gauges are the pool's state. The blocks by
 * state are one gauge with a "state" label (free, cached, in_use), which is why "state" is
 * not a caller label. Names follow vLLM's (vllm:prefix_cache_queries, vllm:prefix_cache_hits,
 * vllm:kv_cache_usage_perc) where the meaning matches, with the kvprefix_ prefix and no ':',
 * which Prometheus reserves for recording rules.
 *
 * Writing. A bounded writer (struct mwriter) appends to the caller's buffer while it has
 * room and keeps counting past the end, so one pass both fills a big enough buffer and
 * measures the capacity a small one needs (snprintf's convention). Numbers are formatted with
 * integer arithmetic only: the usage ratio is printed as a fixed-point decimal, so the output
 * never depends on the process's locale (LC_NUMERIC may turn printf's '.' into ',').
 *
 * Labels are validated completely before the first byte is written, so KVP_EINVAL leaves the
 * buffer untouched. Cost: O(output bytes), about 2.5 kB without labels; no allocation.
 */
#include <stdint.h>
#include <string.h>

#include "internal.h"

/* Append-only writer into buf[0 .. cap); len counts every byte appended, written or not. */
typedef struct mwriter {
    char *buf;  /* caller's buffer (may be NULL when cap is 0) */
    size_t cap; /* its size in bytes */
    size_t len; /* bytes appended so far; only buf[0 .. min(len, cap)) was written */
} mwriter;

/* One label list rendered for a sample: the caller's labels plus an optional state label. */
typedef struct mlabels {
    const kvp_label *labels; /* caller's labels, validated */
    size_t n_labels;         /* how many */
} mlabels;

static void mw_put(mwriter *w, const char *s, size_t n)
{
    if (w->len < w->cap) {
        size_t room = w->cap - w->len;
        memcpy(w->buf + w->len, s, n < room ? n : room);
    }
    w->len += n;
}

static void mw_str(mwriter *w, const char *s)
{
    mw_put(w, s, strlen(s));
}

/* Append v in decimal. Cannot fail. */
static void mw_u64(mwriter *w, uint64_t v)
{
    char tmp[24];
    size_t i = sizeof tmp;
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    mw_put(w, tmp + i, sizeof tmp - i);
}

/* Append num / den (num <= den, den > 0) as a decimal with nine fraction digits. */
static void mw_ratio(mwriter *w, uint64_t num, uint64_t den)
{
    uint64_t scaled = (num * UINT64_C(1000000000) + den / 2) / den; /* num < 2^32: no overflow */
    mw_u64(w, scaled / UINT64_C(1000000000));
    char frac[10];
    uint64_t f = scaled % UINT64_C(1000000000);
    for (int i = 8; i >= 0; i--) {
        frac[i] = (char)('0' + f % 10);
        f /= 10;
    }
    frac[9] = '\0';
    mw_put(w, ".", 1);
    mw_put(w, frac, 9);
}

/* Append a label value with the escapes of the text format: backslash, quote, newline. */
static void mw_escaped(mwriter *w, const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '\\')
            mw_put(w, "\\\\", 2);
        else if (*s == '"')
            mw_put(w, "\\\"", 2);
        else if (*s == '\n')
            mw_put(w, "\\n", 2);
        else
            mw_put(w, s, 1);
    }
}

static inline bool is_name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static inline bool is_name_char(char c)
{
    return is_name_start(c) || (c >= '0' && c <= '9');
}

/* True when s is a label name a caller may use (see kvp_label). */
static bool label_name_ok(const char *s)
{
    if (!is_name_start(s[0]) || (s[0] == '_' && s[1] == '_') || strcmp(s, "state") == 0)
        return false;
    for (const char *p = s + 1; *p != '\0'; p++)
        if (!is_name_char(*p))
            return false;
    return true;
}

/* KVP_EINVAL for the label name s of labels[i], which label_name_ok refused: why. */
static KVP__COLD int label_name_refused(const char *s, size_t i)
{
    if (strcmp(s, "state") == 0)
        return kvp__fail(KVP_EINVAL, "label name 'state' is reserved");
    if (s[0] == '_' && s[1] == '_')
        return kvp__fail(KVP_EINVAL, "labels[%zu].name begins with '__', reserved by Prometheus",
                         i);
    if (s[0] == '\0')
        return kvp__fail(KVP_EINVAL, "labels[%zu].name is empty", i);
    size_t bad = is_name_start(s[0]) ? 1 : 0;
    while (bad > 0 && is_name_char(s[bad]))
        bad++;
    return kvp__fail(KVP_EINVAL,
                     "labels[%zu].name has byte 0x%02x at %zu (after '%.*s'): names match "
                     "[a-zA-Z_][a-zA-Z0-9_]*",
                     i, (unsigned)(unsigned char)s[bad], bad, (int)(bad < 64 ? bad : 64), s);
}

/* The length of the longest well-formed UTF-8 prefix of s (no overlong forms, no
 * surrogates, nothing past U+10FFFF): strlen(s) when all of s is. */
static size_t utf8_prefix(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p != 0) {
        unsigned c = *p;
        size_t n;
        uint32_t cp, min;
        if (c < 0x80) {
            p++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            n = 1, cp = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            n = 2, cp = c & 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            n = 3, cp = c & 0x07, min = 0x10000;
        } else {
            break;
        }
        size_t i = 1;
        for (; i <= n && (p[i] & 0xc0) == 0x80; i++) /* also stops at the NUL */
            cp = (cp << 6) | (p[i] & 0x3f);
        if (i <= n || cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            break;
        p += n + 1;
    }
    return (size_t)(p - (const unsigned char *)s);
}

/* Check every caller label. Returns KVP_OK or KVP_EINVAL (see kvp_label). */
static int labels_check(const kvp_label *labels, size_t n_labels)
{
    if (n_labels > 0 && labels == NULL)
        return kvp__fail(KVP_EINVAL, "labels is NULL but n_labels is %zu", n_labels);
    for (size_t i = 0; i < n_labels; i++) {
        if (labels[i].name == NULL)
            return kvp__fail(KVP_EINVAL, "labels[%zu].name is NULL", i);
        if (labels[i].value == NULL)
            return kvp__fail(KVP_EINVAL, "labels[%zu].value is NULL", i);
        if (!label_name_ok(labels[i].name))
            return label_name_refused(labels[i].name, i);
        const char *v = labels[i].value;
        size_t ok = utf8_prefix(v);
        if (v[ok] != '\0')
            return kvp__fail(KVP_EINVAL,
                             "labels[%zu].value (label '%.64s') is not UTF-8: byte 0x%02x at %zu",
                             i, labels[i].name, (unsigned)(unsigned char)v[ok], ok);
        for (size_t j = 0; j < i; j++)
            if (strcmp(labels[i].name, labels[j].name) == 0)
                return kvp__fail(KVP_EINVAL,
                                 "label name '%.64s' appears twice: labels[%zu] and [%zu]",
                                 labels[i].name, j, i);
    }
    return KVP_OK;
}

/* Append "{a="x",b="y"[,state="s"]}" (nothing when there are no labels at all). */
static void mw_labels(mwriter *w, const mlabels *l, const char *state)
{
    if (l->n_labels == 0 && state == NULL)
        return;
    mw_put(w, "{", 1);
    for (size_t i = 0; i < l->n_labels; i++) {
        if (i > 0)
            mw_put(w, ",", 1);
        mw_str(w, l->labels[i].name);
        mw_put(w, "=\"", 2);
        mw_escaped(w, l->labels[i].value);
        mw_put(w, "\"", 1);
    }
    if (state != NULL) {
        if (l->n_labels > 0)
            mw_put(w, ",", 1);
        mw_str(w, "state=\"");
        mw_str(w, state);
        mw_put(w, "\"", 1);
    }
    mw_put(w, "}", 1);
}

/* Append the HELP and TYPE lines of family name. */
static void mw_family(mwriter *w, const char *name, const char *type, const char *help)
{
    mw_str(w, "# HELP ");
    mw_str(w, name);
    mw_put(w, " ", 1);
    mw_str(w, help);
    mw_str(w, "\n# TYPE ");
    mw_str(w, name);
    mw_put(w, " ", 1);
    mw_str(w, type);
    mw_put(w, "\n", 1);
}

/* Append one whole family holding a single integer sample. */
static void mw_metric(mwriter *w, const mlabels *l, const char *name, const char *type,
                      const char *help, uint64_t v)
{
    mw_family(w, name, type, help);
    mw_str(w, name);
    mw_labels(w, l, NULL);
    mw_put(w, " ", 1);
    mw_u64(w, v);
    mw_put(w, "\n", 1);
}

/* One counter of kvp_stats: its name (with _total), help text and field. */
typedef struct mcounter {
    const char *name; /* family and sample name */
    const char *help; /* HELP text: no backslash or newline */
    size_t offset;    /* offsetof the uint64_t field in kvp_stats */
} mcounter;

static const mcounter counters[] = {
    {"kvprefix_prefix_cache_queries_total",
     "Prompt tokens queried by requests (acquire and access), as vLLM's prefix_cache_queries.",
     offsetof(kvp_stats, n_tokens_queried)},
    {"kvprefix_prefix_cache_hits_total",
     "Prompt tokens served from the cache (prefill skipped), as vLLM's prefix_cache_hits.",
     offsetof(kvp_stats, n_tokens_hit)},
    {"kvprefix_requests_total", "Requests started (acquire and access calls that succeeded).",
     offsetof(kvp_stats, n_requests)},
    {"kvprefix_lookups_total", "Read-only lookups that succeeded.", offsetof(kvp_stats, n_lookups)},
    {"kvprefix_block_hits_total", "Full prompt blocks reused by requests.",
     offsetof(kvp_stats, n_blocks_hit)},
    {"kvprefix_block_misses_total", "Full prompt blocks of requests that were not reused.",
     offsetof(kvp_stats, n_blocks_missed)},
    {"kvprefix_blocks_stored_total", "Blocks newly indexed under their key.",
     offsetof(kvp_stats, n_blocks_stored)},
    {"kvprefix_blocks_deduped_total",
     "Committed blocks whose key was already indexed (private duplicates).",
     offsetof(kvp_stats, n_blocks_deduped)},
    {"kvprefix_evictions_total", "Cached blocks evicted (recycled for new data).",
     offsetof(kvp_stats, n_evictions)},
    {"kvprefix_verify_rejects_total",
     "Collision-proof mode: key matches whose tokens failed verification.",
     offsetof(kvp_stats, n_verify_rejects)},
};

/* Append every family for the snapshot s. Cannot fail. */
static void mw_all(mwriter *w, const mlabels *l, const kvp_stats *s)
{
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) {
        uint64_t v;
        memcpy(&v, (const char *)s + counters[i].offset, sizeof v);
        mw_metric(w, l, counters[i].name, "counter", counters[i].help, v);
    }
    mw_family(w, "kvprefix_kv_cache_usage_perc", "gauge",
              "Fraction of the pool pinned by active requests (0 to 1), as vLLM's "
              "kv_cache_usage_perc.");
    mw_str(w, "kvprefix_kv_cache_usage_perc");
    mw_labels(w, l, NULL);
    mw_put(w, " ", 1);
    mw_ratio(w, s->n_blocks_in_use, s->n_blocks_total);
    mw_put(w, "\n", 1);
    mw_family(w, "kvprefix_blocks", "gauge",
              "Blocks of the pool by state: free, cached (evictable) and in_use (pinned).");
    static const char *const states[] = {"free", "cached", "in_use"};
    const uint32_t values[] = {s->n_blocks_free, s->n_blocks_cached, s->n_blocks_in_use};
    for (size_t i = 0; i < 3; i++) {
        mw_str(w, "kvprefix_blocks");
        mw_labels(w, l, states[i]);
        mw_put(w, " ", 1);
        mw_u64(w, values[i]);
        mw_put(w, "\n", 1);
    }
    mw_metric(w, l, "kvprefix_pool_blocks", "gauge", "Blocks in the pool.", s->n_blocks_total);
    mw_metric(w, l, "kvprefix_requests_active", "gauge",
              "Requests between acquire and release, as vLLM's num_requests_running.",
              s->n_requests_active);
}

/* Lower tiers (docs/design.md, "Tiers"): families written only for a cache that has some,
 * one sample per lower tier labelled medium="CPU" etc. (so a cache without tiers writes
 * exactly what it did). */
typedef struct mtiers {
    int n;                               /* lower tiers: 0 .. KVP_MAX_TIERS - 1 */
    kvp_tier_stats t[KVP_MAX_TIERS - 1]; /* their counters */
} mtiers;

/* One label list plus medium="m" (and state="s" when not NULL). */
static void mw_tier_labels(mwriter *w, const mlabels *l, const char *medium, const char *state)
{
    mw_put(w, "{", 1);
    for (size_t i = 0; i < l->n_labels; i++) {
        mw_str(w, l->labels[i].name);
        mw_put(w, "=\"", 2);
        mw_escaped(w, l->labels[i].value);
        mw_put(w, "\",", 2);
    }
    mw_str(w, "medium=\"");
    mw_str(w, medium);
    mw_put(w, "\"", 1);
    if (state != NULL) {
        mw_str(w, ",state=\"");
        mw_str(w, state);
        mw_put(w, "\"", 1);
    }
    mw_put(w, "}", 1);
}

/* One counter of kvp_tier_stats. */
static const mcounter tier_counters[] = {
    {"kvprefix_tier_hits_total", "Blocks found in a lower tier by acquires (load orders issued).",
     offsetof(kvp_tier_stats, n_hits)},
    {"kvprefix_tier_loads_total", "Load orders from a lower tier confirmed complete.",
     offsetof(kvp_tier_stats, n_loads)},
    {"kvprefix_tier_loads_failed_total", "Load orders from a lower tier failed or cancelled.",
     offsetof(kvp_tier_stats, n_loads_failed)},
    {"kvprefix_tier_stores_total", "Store orders into a lower tier confirmed complete.",
     offsetof(kvp_tier_stats, n_stores)},
    {"kvprefix_tier_stores_failed_total", "Store orders into a lower tier failed or cancelled.",
     offsetof(kvp_tier_stats, n_stores_failed)},
    {"kvprefix_tier_stores_skipped_total",
     "Committed blocks not written to a lower tier: all its blocks were pending or loading.",
     offsetof(kvp_tier_stats, n_stores_skipped)},
    {"kvprefix_tier_evictions_total", "Ready blocks of a lower tier evicted for new stores.",
     offsetof(kvp_tier_stats, n_evictions)},
    {"kvprefix_tier_loaded_bytes_total",
     "Bytes moved out of a lower tier by loads (blocks when block_bytes is 0).",
     offsetof(kvp_tier_stats, n_bytes_loaded)},
    {"kvprefix_tier_stored_bytes_total",
     "Bytes moved into a lower tier by stores (blocks when block_bytes is 0).",
     offsetof(kvp_tier_stats, n_bytes_stored)},
};

/* Append the lower tiers' families. Cannot fail. */
static void mw_tiers(mwriter *w, const mlabels *l, const mtiers *t)
{
    if (t->n == 0)
        return;
    for (size_t i = 0; i < sizeof tier_counters / sizeof tier_counters[0]; i++) {
        mw_family(w, tier_counters[i].name, "counter", tier_counters[i].help);
        for (int k = 0; k < t->n; k++) {
            uint64_t v;
            memcpy(&v, (const char *)&t->t[k] + tier_counters[i].offset, sizeof v);
            mw_str(w, tier_counters[i].name);
            mw_tier_labels(w, l, t->t[k].medium, NULL);
            mw_put(w, " ", 1);
            mw_u64(w, v);
            mw_put(w, "\n", 1);
        }
    }
    mw_family(w, "kvprefix_tier_blocks", "gauge",
              "Blocks of a lower tier by state: ready (hit-able), pending (stores in flight), "
              "loading (ready, read by loads in flight), free.");
    for (int k = 0; k < t->n; k++) {
        const kvp_tier_stats *ts = &t->t[k];
        static const char *const states[] = {"ready", "pending", "loading", "free"};
        const uint32_t values[] = {ts->n_blocks_ready, ts->n_blocks_pending, ts->n_blocks_loading,
                                   ts->n_blocks_total - ts->n_blocks_ready - ts->n_blocks_pending};
        for (size_t i = 0; i < 4; i++) {
            mw_str(w, "kvprefix_tier_blocks");
            mw_tier_labels(w, l, ts->medium, states[i]);
            mw_put(w, " ", 1);
            mw_u64(w, values[i]);
            mw_put(w, "\n", 1);
        }
    }
}

/* The lower tiers' counters (each tier's a snapshot of its own). KVP_OK or the error of
 * kvp_cache_tier_stats. */
static int tiers_snapshot(const kvp_cache *cache, const kvp_label *labels, size_t n_labels,
                          mtiers *t)
{
    int n_tiers = 1;
    t->n = 0;
    int rc = kvp_cache_tier_stats(cache, 0, NULL, &n_tiers);
    for (int k = 1; rc == KVP_OK && k < n_tiers; k++)
        rc = kvp_cache_tier_stats(cache, k, &t->t[k - 1], &n_tiers);
    if (rc != KVP_OK)
        return kvp__fail_kept(rc);
    t->n = n_tiers - 1;
    for (size_t i = 0; t->n > 0 && i < n_labels; i++)
        if (strcmp(labels[i].name, "medium") == 0)
            return kvp__fail(KVP_EINVAL, "label name 'medium' is reserved on a cache with tiers");
    return KVP_OK;
}

/* See kvprefix.h. Steps: 1. validate; 2. take one stats snapshot; 3. write (or measure). */
static int cache_metrics(const kvp_cache *cache, const kvp_label *labels, size_t n_labels,
                         char *buf, size_t cap, size_t *n_out)
{
    /* Step 1: validate everything before writing anything. */
    if (cache == NULL)
        return kvp__fail(KVP_EINVAL, "cache is NULL");
    if (n_out == NULL)
        return kvp__fail(KVP_EINVAL, "n_out is NULL");
    if (buf == NULL && cap > 0)
        return kvp__fail(KVP_EINVAL, "buf is NULL but cap is %zu", cap);
    int rc = labels_check(labels, n_labels);
    if (rc != KVP_OK)
        return rc;
    /* Step 2: one snapshot, so that the families agree with each other. */
    kvp_stats s;
    rc = kvp_cache_stats(cache, &s);
    if (rc != KVP_OK)
        return kvp__fail_kept(rc); /* kvp_cache_stats said why */
    mtiers t;
    if ((rc = tiers_snapshot(cache, labels, n_labels, &t)) != KVP_OK)
        return rc;
    /* Step 3: write what fits and count the rest. */
    mwriter w = {buf, cap, 0};
    mlabels l = {labels, n_labels};
    mw_all(&w, &l, &s);
    mw_tiers(&w, &l, &t);
    if (w.len >= cap) {
        if (cap > 0)
            buf[cap - 1] = '\0';
        *n_out = w.len + 1;
        return kvp__fail(KVP_ENOSPC, "cap is %zu bytes; the text and its NUL take %zu", cap,
                         w.len + 1);
    }
    buf[w.len] = '\0';
    *n_out = w.len;
    return KVP_OK;
}

KVP_EXPORT int kvp_cache_metrics(const kvp_cache *cache, const kvp_label *labels, size_t n_labels,
                                 char *buf, size_t cap, size_t *n_out)
{
    return kvp__public(cache_metrics(cache, labels, n_labels, buf, cap, n_out));
}
