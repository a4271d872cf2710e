/*
 * test_metrics.c - kvp_cache_metrics: the Prometheus text exposition output.
 *
 * Every family has its HELP and TYPE lines and one sample per line; each sample's value
 * equals the kvp_stats field it reports after a scripted workload (hits, misses, evictions,
 * dedup, active requests); the blocks-by-state gauge sums to the pool; caller labels appear
 * on every sample, in order, before "state", with values escaped; invalid labels give
 * KVP_EINVAL with the buffer untouched; a small buffer gives KVP_ENOSPC with the exact size
 * needed, and that size then works; the output does not depend on LC_NUMERIC; the call is
 * refused from inside an event callback. The Python tests parse the same text with
 * prometheus_client's parser.
 */
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "kvprefix.h"
#include "testutil.h"

#define BIG 16384

/* Render the metrics into a fresh heap string or fail the test. */
static char *render(const kvp_cache *c, const kvp_label *labels, size_t n_labels)
{
    size_t need = 0;
    cr_assert_eq(kvp_cache_metrics(c, labels, n_labels, NULL, 0, &need), KVP_ENOSPC);
    char *buf = malloc(need);
    cr_assert_not_null(buf);
    size_t n = 0;
    cr_assert_eq(kvp_cache_metrics(c, labels, n_labels, buf, need, &n), KVP_OK);
    cr_assert_eq(n + 1, need);
    cr_assert_eq(strlen(buf), n);
    return buf;
}

/* The value of the sample line that starts with prefix (name and labels), or fail. */
static unsigned long long sample(const char *text, const char *prefix)
{
    size_t len = strlen(prefix);
    for (const char *p = text; *p != '\0';) {
        const char *eol = strchr(p, '\n');
        cr_assert_not_null(eol, "every line ends with a newline");
        if (strncmp(p, prefix, len) == 0 && p[len] == ' ')
            return strtoull(p + len + 1, NULL, 10);
        p = eol + 1;
    }
    cr_assert_fail("no sample %s in:\n%s", prefix, text);
    return 0;
}

static size_t count_lines_starting(const char *text, const char *prefix)
{
    size_t n = 0, len = strlen(prefix);
    for (const char *p = text; *p != '\0'; p = strchr(p, '\n') + 1)
        n += strncmp(p, prefix, len) == 0;
    return n;
}

/* A workload with hits, misses, evictions, a duplicate commit and an active request. */
static kvp_cache *busy_cache(void)
{
    kvp_cache *c = th_cache(8, 4, false, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t a[17], b[17];
    for (uint32_t i = 0; i < 17; i++) {
        a[i] = i;
        b[i] = 100 + i;
    }
    kvp_match m;
    cr_assert_eq(kvp_access(c, &ns, a, 17, &m), KVP_OK);
    cr_assert_eq(kvp_access(c, &ns, a, 17, &m), KVP_OK);
    cr_assert_eq(kvp_lookup(c, &ns, a, 17, NULL, 0, &m), KVP_OK);
    cr_assert_eq(kvp_access(c, &ns, b, 17, &m), KVP_OK); /* evicts a's blocks */
    cr_assert_eq(kvp_acquire(c, 1, &ns, a, 8, 8, &m), KVP_OK);
    cr_assert_eq(kvp_acquire(c, 2, &ns, a, 8, 8, &m), KVP_OK);
    cr_assert_eq(kvp_commit(c, 1, a, 8, NULL), KVP_OK);
    cr_assert_eq(kvp_commit(c, 2, a, 8, NULL), KVP_OK); /* a private duplicate */
    cr_assert_eq(kvp_release(c, 2), KVP_OK);
    return c;
}

Test(metrics, values_match_stats)
{
    kvp_cache *c = busy_cache();
    kvp_stats s;
    cr_assert_eq(kvp_cache_stats(c, &s), KVP_OK);
    cr_assert_gt(s.n_evictions, 0);
    cr_assert_gt(s.n_blocks_deduped, 0);
    cr_assert_gt(s.n_tokens_hit, 0);
    char *t = render(c, NULL, 0);
    cr_assert_eq(sample(t, "kvprefix_prefix_cache_queries_total"), s.n_tokens_queried);
    cr_assert_eq(sample(t, "kvprefix_prefix_cache_hits_total"), s.n_tokens_hit);
    cr_assert_eq(sample(t, "kvprefix_requests_total"), s.n_requests);
    cr_assert_eq(sample(t, "kvprefix_lookups_total"), s.n_lookups);
    cr_assert_eq(sample(t, "kvprefix_block_hits_total"), s.n_blocks_hit);
    cr_assert_eq(sample(t, "kvprefix_block_misses_total"), s.n_blocks_missed);
    cr_assert_eq(sample(t, "kvprefix_blocks_stored_total"), s.n_blocks_stored);
    cr_assert_eq(sample(t, "kvprefix_blocks_deduped_total"), s.n_blocks_deduped);
    cr_assert_eq(sample(t, "kvprefix_evictions_total"), s.n_evictions);
    cr_assert_eq(sample(t, "kvprefix_verify_rejects_total"), s.n_verify_rejects);
    cr_assert_eq(sample(t, "kvprefix_blocks{state=\"free\"}"), s.n_blocks_free);
    cr_assert_eq(sample(t, "kvprefix_blocks{state=\"cached\"}"), s.n_blocks_cached);
    cr_assert_eq(sample(t, "kvprefix_blocks{state=\"in_use\"}"), s.n_blocks_in_use);
    cr_assert_eq(s.n_blocks_free + s.n_blocks_cached + s.n_blocks_in_use, 8);
    cr_assert_eq(sample(t, "kvprefix_pool_blocks"), 8);
    cr_assert_eq(sample(t, "kvprefix_requests_active"), 1);
    /* Request 1 pins 2 of 8 blocks. */
    cr_assert_not_null(strstr(t, "\nkvprefix_kv_cache_usage_perc 0.250000000\n"), "%s", t);
    free(t);
    kvp_cache_free(c);
}

Test(metrics, help_and_type_for_every_family)
{
    kvp_cache *c = busy_cache();
    char *t = render(c, NULL, 0);
    size_t n_help = count_lines_starting(t, "# HELP "), n_type = count_lines_starting(t, "# TYPE ");
    cr_assert_eq(n_help, 14);
    cr_assert_eq(n_type, 14);
    cr_assert_eq(count_lines_starting(t, "kvprefix_"), 16); /* 13 single + 3 states */
    cr_assert_not_null(strstr(t, "# TYPE kvprefix_evictions_total counter\n"));
    cr_assert_not_null(strstr(t, "# TYPE kvprefix_blocks gauge\n"));
    cr_assert_not_null(strstr(t, "# TYPE kvprefix_kv_cache_usage_perc gauge\n"));
    /* Every counter's name ends in _total. */
    for (const char *p = strstr(t, "counter\n"); p != NULL; p = strstr(p + 1, "counter\n"))
        cr_assert(strncmp(p - 7, "_total ", 7) == 0);
    cr_assert_eq(t[strlen(t) - 1], '\n');
    free(t);
    kvp_cache_free(c);
}

Test(metrics, labels_escaped_and_before_state)
{
    kvp_cache *c = busy_cache();
    kvp_label l[] = {{"model", "llama \"3\"\\8b\nx"}, {"engine", "vllm"}};
    char *t = render(c, l, 2);
    cr_assert_not_null(strstr(t, "\nkvprefix_requests_total{model=\"llama \\\"3\\\"\\\\8b\\nx\","
                                 "engine=\"vllm\"} "),
                       "%s", t);
    cr_assert_not_null(
        strstr(t, "\nkvprefix_blocks{model=\"llama \\\"3\\\"\\\\8b\\nx\",engine=\"vllm\","
                  "state=\"in_use\"} 2\n"),
        "%s", t);
    /* Labelled and unlabelled outputs carry the same samples. */
    char *u = render(c, NULL, 0);
    cr_assert_eq(count_lines_starting(t, "kvprefix_"), count_lines_starting(u, "kvprefix_"));
    free(u);
    kvp_label utf[] = {{"tenant", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"}};
    free(render(c, utf, 1));
    free(t);
    kvp_cache_free(c);
}

static void assert_einval(const kvp_cache *c, const kvp_label *l, size_t n)
{
    char buf[BIG];
    memset(buf, 'z', sizeof buf);
    size_t out = 12345;
    cr_assert_eq(kvp_cache_metrics(c, l, n, buf, sizeof buf, &out), KVP_EINVAL);
    cr_assert_eq(out, 12345);
    cr_assert_eq(buf[0], 'z');
}

Test(metrics, invalid_arguments)
{
    kvp_cache *c = th_cache(8, 4, false, NULL, NULL);
    char buf[BIG];
    size_t out;
    cr_assert_eq(kvp_cache_metrics(NULL, NULL, 0, buf, sizeof buf, &out), KVP_EINVAL);
    cr_assert_eq(kvp_cache_metrics(c, NULL, 0, buf, sizeof buf, NULL), KVP_EINVAL);
    cr_assert_eq(kvp_cache_metrics(c, NULL, 0, NULL, 10, &out), KVP_EINVAL);
    assert_einval(c, NULL, 1);
    const char *bad_names[] = {"", "1a", "a-b", "__x", "state", "a b", "é"};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        kvp_label l = {bad_names[i], "v"};
        assert_einval(c, &l, 1);
    }
    kvp_label null_name = {NULL, "v"}, null_value = {"a", NULL};
    assert_einval(c, &null_name, 1);
    assert_einval(c, &null_value, 1);
    kvp_label dup[] = {{"a", "1"}, {"b", "2"}, {"a", "3"}};
    assert_einval(c, dup, 3);
    const char *bad_utf8[] = {"\xff",      "\xc3", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                              "ok\xe2\x82"};
    for (size_t i = 0; i < sizeof bad_utf8 / sizeof bad_utf8[0]; i++) {
        kvp_label l = {"a", bad_utf8[i]};
        assert_einval(c, &l, 1);
    }
    kvp_label good[] = {{"_a", ""}, {"Z9_", "x"}};
    cr_assert_eq(kvp_cache_metrics(c, good, 2, buf, sizeof buf, &out), KVP_OK);
    kvp_cache_free(c);
}

Test(metrics, small_buffer_reports_size)
{
    kvp_cache *c = busy_cache();
    char *full = render(c, NULL, 0);
    size_t len = strlen(full);
    for (size_t cap = 0; cap <= len + 1; cap += (cap < 64 || cap > len - 4) ? 1 : 97) {
        char *buf = malloc(cap + 1);
        buf[cap] = '#';
        size_t out = 0;
        int rc = kvp_cache_metrics(c, NULL, 0, cap > 0 ? buf : NULL, cap, &out);
        if (cap <= len) {
            cr_assert_eq(rc, KVP_ENOSPC, "cap %zu", cap);
            cr_assert_eq(out, len + 1);
            if (cap > 0) {
                cr_assert_eq(buf[cap - 1], '\0');
                cr_assert_eq(strncmp(buf, full, cap - 1), 0);
            }
        } else {
            cr_assert_eq(rc, KVP_OK);
            cr_assert_eq(out, len);
            cr_assert_str_eq(buf, full);
        }
        cr_assert_eq(buf[cap], '#', "no write past cap %zu", cap);
        free(buf);
    }
    free(full);
    kvp_cache_free(c);
}

Test(metrics, locale_independent)
{
    kvp_cache *c = busy_cache();
    char *before = render(c, NULL, 0);
    /* de_DE may not be installed; the check is meaningful whenever a comma locale is. */
    const char *locs[] = {"de_DE.UTF-8", "fr_FR.UTF-8", "C.UTF-8"};
    for (size_t i = 0; i < 3; i++) {
        if (setlocale(LC_NUMERIC, locs[i]) == NULL)
            continue;
        char *after = render(c, NULL, 0);
        cr_assert_str_eq(after, before);
        free(after);
    }
    setlocale(LC_NUMERIC, "C");
    free(before);
    kvp_cache_free(c);
}

typedef struct cb_state {
    kvp_cache *cache; /* set after creation */
    int rc;           /* what kvp_cache_metrics returned inside the callback */
    bool called;      /* the callback ran */
} cb_state;

static void metrics_in_callback(void *ud, const kvp_event *ev)
{
    cb_state *st = ud;
    char buf[BIG];
    size_t n;
    (void)ev;
    st->rc = kvp_cache_metrics(st->cache, NULL, 0, buf, sizeof buf, &n);
    st->called = true;
}

Test(metrics, busy_inside_callback)
{
    cb_state st = {NULL, 0, false};
    kvp_cache *c = th_cache(8, 4, false, metrics_in_callback, &st);
    st.cache = c;
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kvp_match m;
    cr_assert_eq(kvp_access(c, &ns, a, 8, &m), KVP_OK);
    cr_assert(st.called);
    cr_assert_eq(st.rc, KVP_EBUSY);
    kvp_cache_free(c);
}
