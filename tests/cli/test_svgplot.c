/*
 * test_svgplot.c - tests of the SVG hit-rate chart (src/cli/svgplot.c).
 *
 * Each test renders a chart into memory (open_memstream) and checks properties of the text
 * that a browser would rely on, parsing coordinates back out of the document rather than
 * comparing against a stored rendering: the document's shape, one <circle> per point, log
 * spacing on x, linear placement on y against the ygrid-P gridlines, XML escaping, the dashed
 * ceiling, every invalid input refused with a message and no output, and byte-identical
 * output for identical input.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "svgplot.h"

/* NAN and INFINITY are floats; as doubles they go into the arrays without a promotion. */
#define D_NAN ((double)NAN)
#define D_INF ((double)INFINITY)

/* A rendered chart. */
typedef struct render {
    int rc;        /* svg_write's return value */
    char *text;    /* the document (NUL-terminated), owned; may be empty */
    size_t len;    /* its length in bytes */
    char err[256]; /* the error message ("" when none) */
} render;

static render draw(const svg_plot *p)
{
    render r;
    memset(&r, 0, sizeof r);
    FILE *f = open_memstream(&r.text, &r.len);
    cr_assert_not_null(f);
    r.rc = svg_write(f, p, r.err, sizeof r.err);
    cr_assert_eq(fclose(f), 0);
    return r;
}

static void render_free(render *r)
{
    free(r->text);
    r->text = NULL;
}

static size_t count(const char *s, const char *needle)
{
    size_t n = 0;
    for (const char *q = strstr(s, needle); q != NULL; q = strstr(q + 1, needle))
        n++;
    return n;
}

/* The value of attribute name in the tag starting at tag (which must have it). */
static double attr(const char *tag, const char *name)
{
    char key[64];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *end = strchr(tag, '>');
    const char *q = strstr(tag, key);
    cr_assert(q != NULL && end != NULL && q < end, "no %s in tag %.60s", name, tag);
    return strtod(q + strlen(key), NULL);
}

/* Attribute name of the i-th (0-based) occurrence of the tag opening with prefix. */
static double nth_attr(const char *s, const char *prefix, size_t i, const char *name)
{
    const char *q = strstr(s, prefix);
    for (size_t k = 0; k < i && q != NULL; k++)
        q = strstr(q + 1, prefix);
    cr_assert_not_null(q, "fewer than %zu occurrences of %s", i + 1, prefix);
    return attr(q, name);
}

/* y1 of the gridline at pct percent. */
static double grid_y(const char *s, int pct)
{
    char key[32];
    snprintf(key, sizeof key, "<line id=\"ygrid-%d\"", pct);
    const char *q = strstr(s, key);
    cr_assert_not_null(q, "no gridline %d%%", pct);
    return attr(q, "y1");
}

static const double xs3[] = {1, 10, 100};
static const double ys3a[] = {0.1, 0.5, 0.9};
static const double ys3b[] = {0.0, 0.25, 1.0};

static svg_plot chart(const double *x, size_t n, const svg_series *series, size_t n_series)
{
    svg_plot p;
    memset(&p, 0, sizeof p);
    p.title = "trace.jsonl: LRU prefix-cache hit rate";
    p.x_label = "cache capacity (blocks of 512 tokens, log scale)";
    p.y_label = "hit rate (%)";
    p.x = x;
    p.n = n;
    p.series = series;
    p.n_series = n_series;
    p.ceiling = -1.0;
    return p;
}

Test(svgplot, document_shape)
{
    svg_series s[] = {{"token hit rate", ys3a}};
    svg_plot p = chart(xs3, 3, s, 1);
    p.x_secondary = "1 block = 512 tokens = 64 MiB of KV (Llama-3.1-8B fp16)";
    render r = draw(&p);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    cr_assert_eq(strncmp(r.text, "<?xml", 5), 0);
    const char *svg = strstr(r.text, "<svg ");
    cr_assert_not_null(svg);
    cr_assert(strstr(svg, "xmlns=\"http://www.w3.org/2000/svg\"") != NULL);
    cr_assert(strstr(svg, "viewBox=\"0 0 800 480\"") != NULL);
    cr_assert(strstr(svg, "font-family=\"sans-serif\"") != NULL);
    cr_assert_eq(count(r.text, "<svg"), 1);
    cr_assert(r.len > 7 && strcmp(r.text + r.len - 7, "</svg>\n") == 0);
    /* Nothing external: no links, scripts, images or style sheets. */
    cr_assert_null(strstr(r.text, "href"));
    cr_assert_null(strstr(r.text, "<script"));
    cr_assert_null(strstr(r.text, "<image"));
    cr_assert_null(strstr(r.text, "<style"));
    /* The texts are all there, and the y axis has its 11 gridlines with labels. */
    cr_assert(strstr(r.text, ">trace.jsonl: LRU prefix-cache hit rate</text>") != NULL);
    cr_assert(strstr(r.text, ">cache capacity (blocks of 512 tokens, log scale)</text>") != NULL);
    cr_assert(strstr(r.text, ">hit rate (%)</text>") != NULL);
    cr_assert(strstr(r.text, ">1 block = 512 tokens = 64 MiB of KV (Llama-3.1-8B fp16)</text>"));
    cr_assert(strstr(r.text, ">token hit rate</text>") != NULL);
    cr_assert_eq(count(r.text, "<line id=\"ygrid-"), 11);
    cr_assert(strstr(r.text, ">0%</text>") && strstr(r.text, ">50%</text>") &&
              strstr(r.text, ">100%</text>"));
    /* Without a ceiling or marker there is no such line. */
    cr_assert_null(strstr(r.text, "id=\"ceiling\""));
    cr_assert_null(strstr(r.text, "id=\"marker\""));
    /* Every element that is opened is closed: as many '<' as '>' outside the XML header. */
    cr_assert_eq(count(r.text, "<"), count(r.text, ">"));
    render_free(&r);
}

Test(svgplot, one_circle_per_point_and_series)
{
    static const double x[] = {16, 32, 64, 128, 256};
    static const double y[SVG_MAX_SERIES][5] = {
        {0.1, 0.2, 0.3, 0.4, 0.5}, {0.0, 0.1, 0.2, 0.3, 0.4}, {0.2, 0.3, 0.5, 0.7, 0.7},
        {1.0, 1.0, 1.0, 1.0, 1.0}, {0.5, 0.5, 0.6, 0.6, 0.6}, {0.3, 0.2, 0.1, 0.0, 0.0}};
    for (size_t k = 1; k <= SVG_MAX_SERIES; k++) {
        svg_series s[SVG_MAX_SERIES];
        for (size_t i = 0; i < k; i++)
            s[i] = (svg_series){i == 2 ? NULL : "curve", y[i]};
        svg_plot p = chart(x, 5, s, k);
        render r = draw(&p);
        cr_assert_eq(r.rc, 0, "%s", r.err);
        cr_assert_eq(count(r.text, "<circle"), 5 * k, "%zu series", k);
        cr_assert_eq(count(r.text, "<polyline"), k);
        if (k >= 3)
            cr_assert(strstr(r.text, ">series 3</text>") != NULL, "unnamed series in legend");
        /* Distinct colours: the first circle of each series has its own fill. */
        for (size_t i = 0; i < k; i++) {
            const char *ci = strstr(r.text, "<circle");
            for (size_t j = 0; j < 5 * i; j++)
                ci = strstr(ci + 1, "<circle");
            const char *fi = strstr(ci, "fill=\"");
            for (size_t m = 0; m < i; m++) {
                const char *cm = strstr(r.text, "<circle");
                for (size_t j = 0; j < 5 * m; j++)
                    cm = strstr(cm + 1, "<circle");
                const char *fm = strstr(cm, "fill=\"");
                cr_assert_neq(strncmp(fi, fm, 13), 0, "series %zu and %zu share a colour", i, m);
            }
        }
        render_free(&r);
    }
}

Test(svgplot, x_is_log_spaced)
{
    svg_series s[] = {{"a", ys3a}, {"b", ys3b}};
    svg_plot p = chart(xs3, 3, s, 2);
    render r = draw(&p);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    double c0 = nth_attr(r.text, "<circle", 0, "cx");
    double c1 = nth_attr(r.text, "<circle", 1, "cx");
    double c2 = nth_attr(r.text, "<circle", 2, "cx");
    cr_assert(c1 - c0 > 100.0, "points spread over the width: %f %f", c0, c1);
    cr_assert(fabs((c1 - c0) - (c2 - c1)) < 0.5, "gaps %f and %f", c1 - c0, c2 - c1);
    /* The range fits the data: equal margins, each under a tenth of the frame. */
    const char *g = strstr(r.text, "<line id=\"ygrid-0\"");
    double left = c0 - attr(g, "x1"), right = attr(g, "x2") - c2;
    cr_assert(fabs(left - right) < 0.5 && left > 5.0 && left < (right + c2 - c0) / 10.0,
              "margins %f and %f", left, right);
    /* The second series sits at the same x positions. */
    cr_assert(fabs(nth_attr(r.text, "<circle", 3, "cx") - c0) < 0.01);
    cr_assert(fabs(nth_attr(r.text, "<circle", 5, "cx") - c2) < 0.01);
    /* Decade labels. */
    cr_assert(strstr(r.text, ">1</text>") && strstr(r.text, ">10</text>") &&
              strstr(r.text, ">100</text>"));
    render_free(&r);

    /* 1, 10, 1000: the second gap is twice the first; 1, 2, 4, 8: equal gaps. */
    static const double xa[] = {1, 10, 1000}, xb[] = {1, 2, 4, 8};
    static const double ya[] = {0.1, 0.2, 0.3, 0.4};
    svg_series sa[] = {{"a", ya}};
    p = chart(xa, 3, sa, 1);
    r = draw(&p);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    c0 = nth_attr(r.text, "<circle", 0, "cx");
    c1 = nth_attr(r.text, "<circle", 1, "cx");
    c2 = nth_attr(r.text, "<circle", 2, "cx");
    cr_assert(fabs(2.0 * (c1 - c0) - (c2 - c1)) < 0.5, "gaps %f and %f", c1 - c0, c2 - c1);
    cr_assert(strstr(r.text, ">1k</text>") != NULL);
    render_free(&r);
    p = chart(xb, 4, sa, 1);
    r = draw(&p);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    for (size_t i = 1; i + 1 < 4; i++) {
        double a = nth_attr(r.text, "<circle", i, "cx") - nth_attr(r.text, "<circle", i - 1, "cx");
        double b = nth_attr(r.text, "<circle", i + 1, "cx") - nth_attr(r.text, "<circle", i, "cx");
        cr_assert(fabs(a - b) < 0.5, "gaps %f and %f", a, b);
    }
    render_free(&r);
}

Test(svgplot, decade_labels_over_a_wide_range)
{
    static const double x[] = {1, 1e2, 1e4, 1e6};
    static const double y[] = {0.0, 0.3, 0.6, 0.7};
    svg_series s[] = {{"a", y}};
    svg_plot p = chart(x, 4, s, 1);
    render r = draw(&p);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    static const char *const want[] = {">1<", ">10<", ">100<", ">1k<", ">10k<", ">100k<", ">1M<"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert(strstr(r.text, want[i]) != NULL, "no tick label %s", want[i]);
    cr_assert_null(strstr(r.text, ">10M<"));
    cr_assert_null(strstr(r.text, ">2k<"), "no minor labels over six decades");
    render_free(&r);

    /* Within one decade the minor ticks 2..9 are labelled. */
    static const double xn[] = {150, 300, 600};
    p = chart(xn, 3, s, 1);
    r = draw(&p);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    cr_assert(strstr(r.text, ">100<") && strstr(r.text, ">1k<"));
    cr_assert(strstr(r.text, ">200<") && strstr(r.text, ">500<") && strstr(r.text, ">900<"));
    render_free(&r);
}

Test(svgplot, y_is_linear_between_the_gridlines)
{
    static const double y[] = {0.5, 0.0, 1.0, 0.3};
    static const double x[] = {1, 2, 3, 4};
    svg_series s[] = {{"a", y}};
    svg_plot p = chart(x, 4, s, 1);
    render r = draw(&p);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    double g0 = grid_y(r.text, 0), g100 = grid_y(r.text, 100), g30 = grid_y(r.text, 30);
    cr_assert(g0 - g100 > 200.0, "0%% below 100%%: %f %f", g0, g100);
    cr_assert(fabs(nth_attr(r.text, "<circle", 0, "cy") - (g0 + g100) / 2.0) < 0.5);
    cr_assert(fabs(nth_attr(r.text, "<circle", 1, "cy") - g0) < 0.01);
    cr_assert(fabs(nth_attr(r.text, "<circle", 2, "cy") - g100) < 0.01);
    cr_assert(fabs(nth_attr(r.text, "<circle", 3, "cy") - g30) < 0.01);
    cr_assert(fabs(g30 - (g0 + 0.3 * (g100 - g0))) < 0.01);
    render_free(&r);
}

Test(svgplot, text_is_escaped)
{
    static const double y[] = {0.5};
    static const double x[] = {100};
    svg_series s[] = {{"tok <&> \"q\"", y}};
    svg_plot p = chart(x, 1, s, 1);
    p.title = "a<&>b 'it'";
    p.x_label = "x\x01y\tz";        /* a control character (dropped) and a tab (a space) */
    p.y_label = "caf\xc3\xa9 \xff"; /* valid UTF-8 kept, an invalid byte replaced */
    render r = draw(&p);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    cr_assert(strstr(r.text, ">a&lt;&amp;&gt;b &apos;it&apos;</text>") != NULL);
    cr_assert(strstr(r.text, "<title>a&lt;&amp;&gt;b &apos;it&apos;</title>") != NULL);
    cr_assert(strstr(r.text, ">tok &lt;&amp;&gt; &quot;q&quot;</text>") != NULL);
    cr_assert_null(strstr(r.text, "<&>"));
    cr_assert(strstr(r.text, ">xy z</text>") != NULL);
    cr_assert(strstr(r.text, ">caf\xc3\xa9 \xef\xbf\xbd</text>") != NULL);
    cr_assert_null(strchr(r.text, '\x01'));
    cr_assert_null(strchr(r.text, '\xff'));
    render_free(&r);
}

Test(svgplot, ceiling_is_dashed_and_labelled)
{
    svg_series s[] = {{"token hit rate", ys3a}};
    svg_plot p = chart(xs3, 3, s, 1);
    p.ceiling = 0.712;
    p.ceiling_label = "cold-miss ceiling 71.2% (infinite cache)";
    render r = draw(&p);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    const char *c = strstr(r.text, "<line id=\"ceiling\"");
    cr_assert_not_null(c);
    const char *end = strchr(c, '>');
    const char *dash = strstr(c, "stroke-dasharray=\"");
    cr_assert(dash != NULL && dash < end, "the ceiling line is dashed");
    double g0 = grid_y(r.text, 0), g100 = grid_y(r.text, 100);
    cr_assert(fabs(attr(c, "y1") - (g0 + 0.712 * (g100 - g0))) < 0.01);
    cr_assert(fabs(attr(c, "y1") - attr(c, "y2")) < 1e-9, "horizontal");
    cr_assert(strstr(r.text, ">cold-miss ceiling 71.2% (infinite cache)</text>") != NULL);
    render_free(&r);

    /* A ceiling of 0 and of 1 are drawn too (on the frame edges). */
    p.ceiling = 1.0;
    r = draw(&p);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    cr_assert(fabs(attr(strstr(r.text, "<line id=\"ceiling\""), "y1") - grid_y(r.text, 100)) <
              0.01);
    render_free(&r);
}

Test(svgplot, single_point_and_marker)
{
    static const double y[] = {0.42};
    static const double x1[] = {10}, x2[] = {37};
    svg_series s[] = {{"a", y}};
    for (int k = 0; k < 2; k++) {
        svg_plot p = chart(k ? x2 : x1, 1, s, 1);
        render r = draw(&p);
        cr_assert_eq(r.rc, 0, "%s", r.err);
        cr_assert_eq(count(r.text, "<circle"), 1);
        cr_assert_eq(count(r.text, "<polyline"), 0);
        const char *g = strstr(r.text, "<line id=\"ygrid-0\"");
        double cx = nth_attr(r.text, "<circle", 0, "cx");
        cr_assert(cx > attr(g, "x1") + 5.0 && cx < attr(g, "x2") - 5.0, "inside: %f", cx);
        if (k == 0) /* a lone power of ten is centred */
            cr_assert(fabs(cx - (attr(g, "x1") + attr(g, "x2")) / 2.0) < 0.5, "%f", cx);
        render_free(&r);
    }

    /* A marker outside the data widens the x range and stays inside the frame. */
    static const double xm[] = {16, 64, 256}, ym[] = {0.2, 0.4, 0.6};
    svg_series sm[] = {{"a", ym}};
    svg_plot p = chart(xm, 3, sm, 1);
    p.marker_x = 5000;
    p.marker_label = "--capacity 5000";
    render r = draw(&p);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    const char *m = strstr(r.text, "<line id=\"marker\"");
    cr_assert_not_null(m);
    const char *g = strstr(r.text, "<line id=\"ygrid-0\"");
    double mx = attr(m, "x1");
    cr_assert(mx > nth_attr(r.text, "<circle", 2, "cx") && mx < attr(g, "x2"), "%f", mx);
    cr_assert(strstr(r.text, ">--capacity 5000</text>") != NULL);
    cr_assert(strstr(r.text, ">1k</text>") != NULL);
    render_free(&r);
}

Test(svgplot, same_input_same_bytes)
{
    static const double x[] = {3, 17, 250, 4096, 65536};
    static const double y1[] = {0.013, 0.123456789, 0.5, 2.0 / 3.0, 0.71};
    static const double y2[] = {0.0, 0.1, 0.3, 0.6, 0.7};
    svg_series s[] = {{"token hit rate", y1}, {"request hit rate", y2}};
    svg_plot p = chart(x, 5, s, 2);
    p.ceiling = 0.712;
    p.ceiling_label = "ceiling";
    p.marker_x = 1000;
    p.marker_label = "run";
    render a = draw(&p), b = draw(&p);
    cr_assert_eq(a.rc, 0, "%s", a.err);
    cr_assert_eq(b.rc, 0, "%s", b.err);
    cr_assert_eq(a.len, b.len);
    cr_assert_eq(memcmp(a.text, b.text, a.len), 0);
    render_free(&a);
    render_free(&b);
}

/* Render p, which must be refused: -1, a message, and nothing written. */
static void refused(const svg_plot *p, const char *what)
{
    render r = draw(p);
    cr_assert_eq(r.rc, -1, "%s accepted", what);
    cr_assert(r.err[0] != '\0', "%s: no message", what);
    cr_assert(strncmp(r.err, "plot: ", 6) == 0, "%s: %s", what, r.err);
    cr_assert_eq(r.len, 0, "%s: %zu bytes written", what, r.len);
    render_free(&r);
}

Test(svgplot, invalid_input_is_refused)
{
    static const double x[] = {1, 10, 100};
    static const double y[] = {0.1, 0.2, 0.3};
    svg_series s[] = {{"a", y}, {"b", y}, {"c", y}, {"d", y}, {"e", y}, {"f", y}, {"g", y}};
    svg_plot p;

    p = chart(x, 0, s, 1);
    refused(&p, "n == 0");
    p = chart(NULL, 3, s, 1);
    refused(&p, "x NULL");
    p = chart(x, 3, s, 0);
    refused(&p, "no series");
    p = chart(x, 3, s, SVG_MAX_SERIES + 1);
    refused(&p, "too many series");
    p = chart(x, 3, NULL, 1);
    refused(&p, "series NULL");

    static const double bad_x[][3] = {
        {0, 10, 100},    {-1, 10, 100},  {1, 10, 10},           {1, 10, 5},
        {1, D_NAN, 100}, {1, 10, D_INF}, {D_NAN, D_NAN, D_NAN}, {1, 1e300, 1e-300}};
    for (size_t i = 0; i < sizeof bad_x / sizeof bad_x[0]; i++) {
        p = chart(bad_x[i], 3, s, 1);
        refused(&p, "bad x");
    }

    static const double bad_y[][3] = {
        {-0.1, 0.2, 0.3}, {0.1, 1.0001, 0.3}, {0.1, 0.2, D_NAN}, {0.1, D_INF, 0.3}};
    for (size_t i = 0; i < sizeof bad_y / sizeof bad_y[0]; i++) {
        svg_series sb[] = {{"good", y}, {"bad", bad_y[i]}};
        p = chart(x, 3, sb, 2);
        refused(&p, "bad y");
    }
    svg_series sn[] = {{"no values", NULL}};
    p = chart(x, 3, sn, 1);
    refused(&p, "y NULL");

    p = chart(x, 3, s, 1);
    p.ceiling = D_NAN;
    refused(&p, "ceiling NaN");
    p.ceiling = 1.5;
    refused(&p, "ceiling 1.5");
    p.ceiling = -1.0;
    p.marker_x = D_NAN;
    refused(&p, "marker NaN");
    p.marker_x = D_INF;
    refused(&p, "marker infinite");

    /* No chart, no file. */
    char err[128] = "";
    cr_assert_eq(svg_write(stdout, NULL, err, sizeof err), -1);
    cr_assert(err[0] != '\0');
    p = chart(x, 3, s, 1);
    err[0] = '\0';
    cr_assert_eq(svg_write(NULL, &p, err, sizeof err), -1);
    cr_assert(err[0] != '\0');
    /* A NULL or empty message buffer is allowed. */
    cr_assert_eq(svg_write(NULL, &p, NULL, 0), -1);
}

Test(svgplot, write_error_is_reported)
{
    FILE *f = fopen("/dev/full", "w");
    if (f == NULL)
        cr_skip_test("no /dev/full");
    static const double y[] = {0.1, 0.2, 0.3};
    svg_series s[] = {{"a", y}};
    svg_plot p = chart(xs3, 3, s, 1);
    char err[128] = "";
    cr_assert_eq(svg_write(f, &p, err, sizeof err), -1);
    cr_assert(strstr(err, "write error") != NULL, "%s", err);
    fclose(f);
}
