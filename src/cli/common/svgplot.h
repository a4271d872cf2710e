/*
 * svgplot.h - a standalone SVG line chart of prefix-cache hit rate against cache capacity,
 * written by `kvprefix replay --sweep --plot FILE.svg`.
 *
 * The chart is one SVG 1.1 document with nothing external (no scripts, no stylesheets, no
 * fonts, no images), so it opens in any browser on its own:
 *
 *   +--------------------------------------------------------------+
 *   |                       title                                  |
 *   |   (o) series 1   (o) series 2   ...          (legend rows)    |
 *   |  100% +------------------------------------------------+     |
 *   |       |                       :marker    ____o____o    |     |
 *   |   y   |  - - - - - - - - - - -:- - - - - - - - ceiling |     |
 *   | label |             o____o____:o----o                  |     |
 *   |       |     o____o            :                        |     |
 *   |    0% +-----+---------+---------+---------+------------+     |
 *   |             1        10       100        1k                  |
 *   |                 x label (log scale)                          |
 *   |                 x_secondary note                             |
 *   +--------------------------------------------------------------+
 *
 * The x axis is logarithmic over the data range (widened to at least one decade, plus a 4 %
 * margin on each side), with ticks and labels at the powers of ten (1, 10, 100, 1k, .., 1M)
 * and minor ticks between them over short ranges; the y axis is linear from 0% to 100%.
 * The output depends only on the input: numbers are printed with fixed precision, so the
 * same input gives the same bytes.
 */
#ifndef CLI_SVGPLOT_H
#define CLI_SVGPLOT_H

#include <stddef.h>
#include <stdio.h>

#define SVG_MAX_SERIES 6   /* most series one chart draws (one colour each) */
#define SVG_WIDTH      800 /* SVG width and height in user units (= viewBox) */
#define SVG_HEIGHT     480

/* One curve. */
typedef struct svg_series {
    const char *name; /* legend text, e.g. "token hit rate"; NULL: "series N" */
    const double *y;  /* n values in [0,1], one per x */
} svg_series;

/* A chart. Strings are UTF-8 (invalid bytes are drawn as U+FFFD) and may be NULL, which
 * leaves that text out; they are XML-escaped on output. */
typedef struct svg_plot {
    const char *title;         /* e.g. "conversation_trace.jsonl: LRU prefix-cache hit rate" */
    const char *x_label;       /* e.g. "cache capacity (blocks of 512 tokens, log scale)" */
    const char *y_label;       /* e.g. "hit rate (%)" */
    const double *x;           /* n capacities, finite, > 0, strictly increasing */
    size_t n;                  /* >= 1 */
    const svg_series *series;  /* n_series curves */
    size_t n_series;           /* 1 .. SVG_MAX_SERIES */
    double ceiling;            /* cold-miss ceiling in [0,1], drawn as a dashed horizontal line;
                                  < 0: none */
    const char *ceiling_label; /* text on the ceiling line, e.g. "cold-miss ceiling 71.2%
                                  (infinite cache)"; NULL: none */
    const char *x_secondary;   /* note under the x label, e.g. "1 block = 512 tokens = 64 MiB
                                  of KV (Llama-3.1-8B fp16)"; NULL: none */
    double marker_x;           /* a dotted vertical marker at this x (e.g. the single-capacity
                                  run), finite; <= 0: none. The x range widens to include it. */
    const char *marker_label;  /* text at the top of the marker; NULL: none */
} svg_plot;

/*
 * Write *p as a standalone SVG 1.1 document (SVG_WIDTH x SVG_HEIGHT, with a
 * viewBox) to f.
 *
 * Returns 0, or -1 with a message in err[0 .. err_size) when the data are invalid (f, p, x or
 * series NULL, n == 0, an x not finite and > 0 or not strictly increasing, a y NULL, NaN or
 * outside [0,1], n_series outside 1 .. SVG_MAX_SERIES, a ceiling NaN or above 1, a
 * marker_x NaN or infinite), in which case nothing has been written; or when writing fails
 * (the message names the error; f then holds part of the document).
 *
 * In the document each point is a <circle> (n * n_series of them), each y gridline a <line>
 * with id="ygrid-P" for P = 0, 10, .., 100, and the ceiling a <line id="ceiling"> with a
 * stroke-dasharray: tests rely on these.
 */
int svg_write(FILE *f, const svg_plot *p, char *err, size_t err_size);

#endif /* CLI_SVGPLOT_H */
