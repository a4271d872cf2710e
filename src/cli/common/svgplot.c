/*
 * svgplot.c - a standalone SVG line chart of hit rate against cache capacity (svgplot.h).
 *
 * Layout, in SVG user units on a fixed 800 x 480 canvas (picture in svgplot.h):
 *
 *   y = 26            title, centred, shrunk to fit the width when it is long
 *   y = 50, 68, ..    legend rows, left-aligned with the frame, wrapped when full
 *   FRAME_TOP ..      the plot frame, from x = 72 to 780; its top depends on the
 *     FRAME_BOTTOM    number of legend rows, its bottom is fixed at y = 400
 *   below the frame   x tick labels, the x label, the x_secondary note
 *
 * Mapping: a capacity c goes to x = left + (log10 c - lo) / (hi - lo) * width, where [lo, hi]
 * is the data range in decades (plus marker_x), widened about its centre to at least one
 * decade and then by 4 % on each side to keep points off the frame; tick marks go at every
 * decade inside it (every few decades over more than ten), with minor ticks at 2..9 times a
 * power of ten over four decades or less, labelled (2 and 5) over 3.5 decades or less and
 * all of them over 1.3 decades or less: at least two ticks are always labelled. (Whole-decade
 * ranges were tried first: a sweep ending at 13,747 blocks then left a quarter of the width empty
 * up to 100k.) A rate y in [0,1] goes to FRAME_BOTTOM - y * (FRAME_BOTTOM - frame_top), so the 0%
 * and 100% gridlines are the frame's bottom and top edges.
 *
 * Invariants: the input is validated completely before the first byte is written, so an
 * invalid chart writes nothing; every number goes through printf with fixed precision (no
 * locale-dependent or shortest-round-trip formatting), so output is a pure function of the
 * input. Text widths are estimated (6.6 units per character at 12px sans-serif), which is only
 * used to place the legend and the label backgrounds: a wrong guess spaces them badly but
 * never breaks the document.
 *
 * Cost: O(n * n_series) output; no allocation.
 */
#include "svgplot.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "cli.h"

#define FRAME_LEFT   72.0
#define FRAME_RIGHT  780.0
#define FRAME_BOTTOM 400.0
#define X_MARGIN     0.04 /* share of the x range added on each side */
#define LEGEND_Y0    50.0 /* baseline of the first legend row */
#define LEGEND_ROW   18.0 /* legend row height */
#define CHAR_W       6.6  /* estimated width of one character at font-size 12 */

static const char *const series_colour[SVG_MAX_SERIES] = {"#1f77b4", "#d62728", "#2ca02c",
                                                          "#9467bd", "#ff7f0e", "#8c564b"};

/* The geometry of one chart, computed once from the validated input. */
typedef struct plot_geom {
    double lo, hi;    /* x range in decades: 10^lo .. 10^hi, hi - lo >= 1 */
    double frame_top; /* y of the 100% gridline */
    double x_scale;   /* pixels per decade */
} plot_geom;

static inline bool is_unit(double v)
{
    return v >= 0.0 && v <= 1.0; /* false for NaN */
}

/*
 * Check everything svg_write's contract requires. Returns 0, or -1 with a message.
 */
static int validate(FILE *f, const svg_plot *p, char *err, size_t err_size)
{
    if (f == NULL || p == NULL) {
        cli_errf(err, err_size, "plot: no %s", f == NULL ? "output file" : "chart");
        return -1;
    }
    if (p->n == 0 || p->x == NULL) {
        cli_errf(err, err_size, "plot: no data points");
        return -1;
    }
    if (p->series == NULL || p->n_series < 1 || p->n_series > SVG_MAX_SERIES) {
        cli_errf(err, err_size, "plot: %zu series (must be 1 to %d)",
                 p->series == NULL ? (size_t)0 : p->n_series, SVG_MAX_SERIES);
        return -1;
    }
    for (size_t i = 0; i < p->n; i++) {
        if (!(p->x[i] > 0.0) || !isfinite(p->x[i])) {
            cli_errf(err, err_size, "plot: x[%zu] = %g is not a finite positive capacity", i,
                     p->x[i]);
            return -1;
        }
        if (i > 0 && !(p->x[i] > p->x[i - 1])) {
            cli_errf(err, err_size, "plot: x[%zu] = %g does not increase (x[%zu] = %g)", i, p->x[i],
                     i - 1, p->x[i - 1]);
            return -1;
        }
    }
    for (size_t s = 0; s < p->n_series; s++) {
        if (p->series[s].y == NULL) {
            cli_errf(err, err_size, "plot: series %zu has no values", s + 1);
            return -1;
        }
        for (size_t i = 0; i < p->n; i++) {
            if (!is_unit(p->series[s].y[i])) {
                cli_errf(err, err_size, "plot: series %zu: y[%zu] = %g is not in [0,1]", s + 1, i,
                         p->series[s].y[i]);
                return -1;
            }
        }
    }
    if (isnan(p->ceiling) || p->ceiling > 1.0) {
        cli_errf(err, err_size, "plot: ceiling %g is not in [0,1] (or < 0 for none)", p->ceiling);
        return -1;
    }
    if (!isfinite(p->marker_x)) {
        cli_errf(err, err_size, "plot: marker_x %g is not finite", p->marker_x);
        return -1;
    }
    return 0;
}

/* Number of characters (UTF-8 code points) in s, for width estimates. Cannot fail. */
static size_t text_chars(const char *s)
{
    size_t n = 0;
    for (; s != NULL && *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static double text_width(const char *s, double font_size)
{
    return (double)text_chars(s) * CHAR_W * font_size / 12.0;
}

/* Length of the well-formed UTF-8 sequence at s (1..4), or 0 when s starts an invalid one. */
static size_t utf8_len(const unsigned char *s)
{
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, min = 0x10000;
    else
        return 0;
    unsigned cp = c & (0x3F >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

/*
 * Write s as XML character data or attribute text: & < > " ' escaped, control characters
 * XML 1.0 does not allow dropped (tab, newline and carriage return become spaces), and each
 * byte that does not start well-formed UTF-8 replaced by U+FFFD.
 */
static void put_text(FILE *f, const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    while (u != NULL && *u) {
        size_t len = utf8_len(u);
        if (len == 0) {
            fputs("\xEF\xBF\xBD", f);
            u++;
            continue;
        }
        switch (*u) {
        case '&':
            fputs("&amp;", f);
            break;
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        case '\'':
            fputs("&apos;", f);
            break;
        case '\t':
        case '\n':
        case '\r':
            fputc(' ', f);
            break;
        default:
            if (*u >= 0x20)
                fwrite(u, 1, len, f);
        }
        u += len;
    }
}

/*
 * Format m * 10^e (m in 1..9) as a short axis label: "1", "20", "500", "1k", "2M", "0.5",
 * "0.002", and "3e21" / "1e-7" beyond the named prefixes.
 */
static void tick_label(char *buf, size_t size, int m, int e)
{
    static const char *const suffix[] = {"", "k", "M", "G", "T", "P", "E"};
    if (e >= 0 && e / 3 < (int)(sizeof suffix / sizeof suffix[0])) {
        int v = m;
        for (int i = 0; i < e % 3; i++)
            v *= 10;
        snprintf(buf, size, "%d%s", v, suffix[e / 3]);
    } else if (e < 0 && e >= -4) {
        snprintf(buf, size, "%.*f", -e, m * pow(10.0, e));
    } else {
        snprintf(buf, size, "%de%d", m, e);
    }
}

static double map_x(const plot_geom *g, double x)
{
    return FRAME_LEFT + (log10(x) - g->lo) * g->x_scale;
}

static double map_y(const plot_geom *g, double y)
{
    return FRAME_BOTTOM - y * (FRAME_BOTTOM - g->frame_top);
}

/* Place the legend entries left to right from FRAME_LEFT, wrapping at FRAME_RIGHT; stores
 * each entry's position when xs/ys are not NULL. Returns the number of rows (>= 1). */
static int legend_layout(const svg_plot *p, double *xs, double *ys)
{
    double x = FRAME_LEFT;
    int rows = 1;
    for (size_t s = 0; s < p->n_series; s++) {
        char fallback[32];
        const char *name = p->series[s].name;
        if (name == NULL) {
            snprintf(fallback, sizeof fallback, "series %zu", s + 1);
            name = fallback;
        }
        double w = 28.0 + text_width(name, 12.0) + 24.0;
        if (x > FRAME_LEFT && x + w > FRAME_RIGHT) {
            rows++;
            x = FRAME_LEFT;
        }
        if (xs != NULL) {
            xs[s] = x;
            ys[s] = LEGEND_Y0 + (rows - 1) * LEGEND_ROW;
        }
        x += w;
    }
    return rows;
}

/* Step 1 of svg_write: the x range and the frame. Cannot fail. */
static void geometry(const svg_plot *p, plot_geom *g)
{
    double l = log10(p->x[0]), h = log10(p->x[p->n - 1]);
    if (p->marker_x > 0.0) {
        double m = log10(p->marker_x);
        l = m < l ? m : l;
        h = m > h ? m : h;
    }
    if (h - l < 1.0) { /* less than a decade (a lone point too): one decade about the centre */
        double c = (l + h) / 2.0;
        l = c - 0.5;
        h = c + 0.5;
    }
    g->lo = l - X_MARGIN * (h - l);
    g->hi = h + X_MARGIN * (h - l);
    g->x_scale = (FRAME_RIGHT - FRAME_LEFT) / (g->hi - g->lo);
    g->frame_top = LEGEND_Y0 + legend_layout(p, NULL, NULL) * LEGEND_ROW;
}

/* A label on a white background box, so gridlines and curves do not run through it. */
static void put_boxed_label(FILE *f, double x, double y, const char *anchor, const char *colour,
                            const char *text)
{
    double w = text_width(text, 11.0) + 6.0;
    double bx = strcmp(anchor, "end") == 0 ? x - w + 3.0 : x - 3.0;
    fprintf(f,
            "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"15.00\" fill=\"#ffffff\" "
            "fill-opacity=\"0.85\"/>\n",
            bx, y - 11.5, w);
    fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" font-size=\"11\" fill=\"%s\" text-anchor=\"%s\">", x, y,
            colour, anchor);
    put_text(f, text);
    fputs("</text>\n", f);
}

/* Step 2: the x gridlines, ticks and tick labels, at m * 10^e inside the range. */
static void put_x_axis(FILE *f, const plot_geom *g)
{
    double span = g->hi - g->lo;
    int step = span <= 10.5 ? 1 : (int)ceil(span / 10.0); /* decades between labels */
    bool minor = span <= 4.0;
    int minor_labels = span <= 1.3 ? 2 : span <= 3.5 ? 1 : 0; /* 2: all, 1: 2 and 5, 0: none */
    char label[32];
    for (int e = (int)floor(g->lo); e <= (int)ceil(g->hi); e++) {
        for (int m = 1; m <= 9; m++) {
            bool major = m == 1;
            if ((!major && !minor) || (major && e % step != 0 && span > 40.0))
                continue;
            double v = e + log10((double)m);
            if (v < g->lo || v > g->hi)
                continue;
            double px = FRAME_LEFT + (v - g->lo) * g->x_scale;
            fprintf(f,
                    "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" "
                    "stroke-width=\"1\"/>\n",
                    px, g->frame_top, px, FRAME_BOTTOM, major ? "#d0d0d0" : "#eeeeee");
            fprintf(f,
                    "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#333333\" "
                    "stroke-width=\"1\"/>\n",
                    px, FRAME_BOTTOM, px, FRAME_BOTTOM + (major ? 6.0 : 3.0));
            bool labelled = major ? e % step == 0
                                  : minor_labels == 2 || (minor_labels == 1 && (m == 2 || m == 5));
            if (!labelled)
                continue;
            tick_label(label, sizeof label, m, e);
            fprintf(f,
                    "<text x=\"%.2f\" y=\"%.2f\" font-size=\"%s\" fill=\"%s\" "
                    "text-anchor=\"middle\">%s</text>\n",
                    px, FRAME_BOTTOM + 20.0, major ? "12" : "10", major ? "#222222" : "#666666",
                    label);
        }
    }
}

/* Step 3: the y gridlines every 10% (ids ygrid-0 .. ygrid-100) and their labels. */
static void put_y_axis(FILE *f, const plot_geom *g)
{
    for (int pct = 0; pct <= 100; pct += 10) {
        double py = map_y(g, pct / 100.0);
        fprintf(f,
                "<line id=\"ygrid-%d\" x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" "
                "stroke=\"%s\" stroke-width=\"1\"/>\n",
                pct, FRAME_LEFT, py, FRAME_RIGHT, py, pct % 20 == 0 ? "#d0d0d0" : "#eeeeee");
        fprintf(f,
                "<text x=\"%.2f\" y=\"%.2f\" font-size=\"12\" fill=\"#222222\" "
                "text-anchor=\"end\">%d%%</text>\n",
                FRAME_LEFT - 8.0, py + 4.0, pct);
    }
}

/* Step 5: one polyline and n circles per series, each circle with a tooltip. */
static void put_series(FILE *f, const svg_plot *p, const plot_geom *g)
{
    for (size_t s = 0; s < p->n_series; s++) {
        const char *colour = series_colour[s];
        const double *y = p->series[s].y;
        if (p->n > 1) {
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"",
                    colour);
            for (size_t i = 0; i < p->n; i++)
                fprintf(f, "%s%.2f,%.2f", i ? " " : "", map_x(g, p->x[i]), map_y(g, y[i]));
            fputs("\"/>\n", f);
        }
        for (size_t i = 0; i < p->n; i++) {
            fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3.5\" fill=\"%s\"><title>",
                    map_x(g, p->x[i]), map_y(g, y[i]), colour);
            if (p->series[s].name != NULL) {
                put_text(f, p->series[s].name);
                fputs(": ", f);
            }
            fprintf(f, "%.1f%% at %g</title></circle>\n", y[i] * 100.0, p->x[i]);
        }
    }
}

/* Step 6: the legend rows above the frame. */
static void put_legend(FILE *f, const svg_plot *p)
{
    double xs[SVG_MAX_SERIES], ys[SVG_MAX_SERIES];
    legend_layout(p, xs, ys);
    for (size_t s = 0; s < p->n_series; s++) {
        const char *colour = series_colour[s];
        fprintf(f,
                "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" "
                "stroke-width=\"2\"/>\n",
                xs[s], ys[s] - 4.0, xs[s] + 22.0, ys[s] - 4.0, colour);
        fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"7.00\" height=\"7.00\" fill=\"%s\"/>\n",
                xs[s] + 7.5, ys[s] - 7.5, colour);
        fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" font-size=\"12\" fill=\"#222222\">", xs[s] + 28.0,
                ys[s]);
        if (p->series[s].name != NULL)
            put_text(f, p->series[s].name);
        else
            fprintf(f, "series %zu", s + 1);
        fputs("</text>\n", f);
    }
}

/*
 * Write the chart. Steps:
 *   0. validate (nothing written on failure);
 *   1. compute the geometry;
 *   2. header, background, title, x axis;
 *   3. y axis and frame;
 *   4. the ceiling line and the marker;
 *   5. the series;
 *   6. the legend and axis labels, then close and flush.
 */
/* Step 2 of svg_write: the document, its title, the background and the x axis. */
static void put_head(FILE *f, const svg_plot *p, const plot_geom *pg)
{
    const plot_geom g = *pg;
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" "
            "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n",
            SVG_WIDTH, SVG_HEIGHT, SVG_WIDTH, SVG_HEIGHT);
    if (p->title != NULL) {
        fputs("<title>", f);
        put_text(f, p->title);
        fputs("</title>\n", f);
    }
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", SVG_WIDTH,
            SVG_HEIGHT);
    if (p->title != NULL) {
        double size = 16.0, w = text_width(p->title, 16.0 * 1.1);
        if (w > SVG_WIDTH - 20.0)
            size = fmax(8.0, size * (SVG_WIDTH - 20.0) / w);
        fprintf(f,
                "<text x=\"%.2f\" y=\"26.00\" font-size=\"%.1f\" font-weight=\"bold\" "
                "fill=\"#111111\" text-anchor=\"middle\">",
                SVG_WIDTH / 2.0, size);
        put_text(f, p->title);
        fputs("</text>\n", f);
    }
    put_x_axis(f, &g);
}

/* Step 4 of svg_write: the ceiling and the marker lines. */
static void put_lines(FILE *f, const svg_plot *p, const plot_geom *g)
{
    if (p->ceiling >= 0.0) {
        double py = map_y(g, p->ceiling);
        fprintf(f,
                "<line id=\"ceiling\" x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" "
                "stroke=\"#555555\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n",
                FRAME_LEFT, py, FRAME_RIGHT, py);
    }
    if (p->marker_x > 0.0) {
        double px = map_x(g, p->marker_x);
        fprintf(f,
                "<line id=\"marker\" x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" "
                "stroke=\"#7f7f7f\" stroke-width=\"1.5\" stroke-dasharray=\"2 3\"/>\n",
                px, g->frame_top, px, FRAME_BOTTOM);
    }
}

/* Step 6 of svg_write: the labels, last so that they are drawn over the curves. */
static void put_labels(FILE *f, const svg_plot *p, const plot_geom *g)
{
    if (p->ceiling >= 0.0 && p->ceiling_label != NULL) {
        double py = map_y(g, p->ceiling);
        double ly = py - 6.0 < g->frame_top + 14.0 ? py + 16.0 : py - 6.0;
        put_boxed_label(f, FRAME_RIGHT - 6.0, ly, "end", "#333333", p->ceiling_label);
    }
    if (p->marker_x > 0.0 && p->marker_label != NULL) {
        double px = map_x(g, p->marker_x);
        bool left = px + 4.0 + text_width(p->marker_label, 11.0) > FRAME_RIGHT;
        put_boxed_label(f, left ? px - 4.0 : px + 4.0, g->frame_top + 14.0, left ? "end" : "start",
                        "#555555", p->marker_label);
    }
    put_legend(f, p);
    if (p->x_label != NULL) {
        fprintf(f,
                "<text x=\"%.2f\" y=\"%.2f\" font-size=\"13\" fill=\"#111111\" "
                "text-anchor=\"middle\">",
                (FRAME_LEFT + FRAME_RIGHT) / 2.0, FRAME_BOTTOM + 42.0);
        put_text(f, p->x_label);
        fputs("</text>\n", f);
    }
    if (p->x_secondary != NULL) {
        fprintf(f,
                "<text x=\"%.2f\" y=\"%.2f\" font-size=\"11\" fill=\"#555555\" "
                "text-anchor=\"middle\">",
                (FRAME_LEFT + FRAME_RIGHT) / 2.0, FRAME_BOTTOM + 62.0);
        put_text(f, p->x_secondary);
        fputs("</text>\n", f);
    }
    if (p->y_label != NULL) {
        double cy = (g->frame_top + FRAME_BOTTOM) / 2.0;
        fprintf(f,
                "<text x=\"20.00\" y=\"%.2f\" font-size=\"13\" fill=\"#111111\" "
                "text-anchor=\"middle\" transform=\"rotate(-90 20.00 %.2f)\">",
                cy, cy);
        put_text(f, p->y_label);
        fputs("</text>\n", f);
    }
}

int svg_write(FILE *f, const svg_plot *p, char *err, size_t err_size)
{
    plot_geom g;

    /* Step 0: */
    if (validate(f, p, err, err_size) != 0)
        return -1;

    /* Step 1: */
    geometry(p, &g);

    /* Step 2: */
    put_head(f, p, &g);

    /* Step 3: */
    put_y_axis(f, &g);
    fprintf(f,
            "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"none\" "
            "stroke=\"#333333\" stroke-width=\"1\"/>\n",
            FRAME_LEFT, g.frame_top, FRAME_RIGHT - FRAME_LEFT, FRAME_BOTTOM - g.frame_top);

    /* Step 4: */
    put_lines(f, p, &g);

    /* Step 5: */
    put_series(f, p, &g);

    /* Step 6: the labels go last so that they are drawn over the curves. */
    put_labels(f, p, &g);
    fputs("</svg>\n", f);
    if (fflush(f) != 0 || ferror(f)) {
        cli_errf(err, err_size, "plot: write error: %s", strerror(errno));
        return -1;
    }
    return 0;
}
