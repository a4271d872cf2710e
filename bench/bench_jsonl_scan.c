/*
 * bench_jsonl_scan.c - throughput and memory of the JSON Lines scanner (src/cli/input/
 * jsonl_scan.h) against jansson's json_loadb with the reader's flags, on the same lines.
 *
 *   bench_jsonl_scan [--runs N] [MOONCAKE.jsonl ...]
 *
 * Data sets, all held in memory before timing:
 *   tokens    1000 token-log lines, prompt lengths uniform in 500..8000 tokens, ids uniform
 *             in 0..151935 (a Qwen2-sized vocabulary), 1..256 output tokens, model, tenant
 *             and a real timestamp, as `kvprefix replay` reads them (seeded, so every run
 *             sees the same bytes);
 *   mooncake  the lines of the Mooncake traces given on the command line (for example
 *             the public FAST'25 traces, docs/replay.md), or 20000 synthetic lines of the
 *             same shape (input_length 1..32000, hash_ids accordingly) when none is given.
 * For each set, each round times one pass of the scanner and one pass of jansson (parse and
 * json_decref) over all lines; N rounds (default 5). Printed: the median MB/s of each in wall
 * time and in CPU time (the process's, which a loaded machine disturbs less), and the median
 * over rounds of the per-round wall-time ratio (scanner speed / jansson speed, measured in
 * the same round). Both passes sum every id they decode and the sums must match, so neither
 * can skip work.
 *
 * Memory per line: for jansson, the peak bytes its allocator holds while one line is parsed
 * (counted through json_set_alloc_funcs: malloc_usable_size plus glibc's 8-byte chunk
 * header), divided by the line's bytes; for the scanner, the capacities of the arrays and
 * the key set a fresh scanner and record need for that line alone, divided by the line's
 * bytes. The largest ratio over the set is printed (the line itself is not counted).
 *
 * Result (build-h/bench/bench_jsonl_scan conversation_trace.jsonl synthetic_trace.jsonl;
 * gcc 12, debugoptimized; 2 cores shared with other jobs at a load average of 16, so wall
 * figures are several times below an idle machine's and the CPU-time figures are the better guide):
 *
 *   set       MB    wall MB/s scanner / jansson  ratio   CPU MB/s scanner / jansson
 *   tokens    31.2        166.8 / 10.4           15.2x         752.4 / 44.5
 *   mooncake   4.2        205.4 / 13.6           15.1x         706.5 / 53.8
 *
 *   bytes per line byte: tokens 1.11 (scanner) vs 7.5 (jansson); mooncake 3.24 vs 11.6 (the
 *   scanner's maximum is a short line's 16-element minimum capacities)
 */
#include <jansson.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "benchutil.h"

#include "jsonl_scan.h"

#ifndef KVP_BENCH_BUILDTYPE
#define KVP_BENCH_BUILDTYPE "unknown"
#endif

#define MAX_RUNS 31

/* A set of lines in one buffer. */
typedef struct lines {
    char *buf;     /* all lines, each followed by '\n' */
    size_t len;    /* bytes used at buf */
    size_t cap;    /* bytes allocated at buf */
    size_t *start; /* offset of each line */
    size_t n;      /* lines */
    size_t n_cap;  /* elements allocated at start */
} lines;

static void die(const char *what)
{
    fprintf(stderr, "bench_jsonl_scan: %s\n", what);
    exit(1);
}

static void add_line(lines *ls, const char *s, size_t n)
{
    if (ls->len + n + 1 > ls->cap) {
        ls->cap = (ls->len + n + 1) * 2;
        if ((ls->buf = realloc(ls->buf, ls->cap)) == NULL)
            die("out of memory");
    }
    if (ls->n == ls->n_cap) {
        ls->n_cap = ls->n_cap ? ls->n_cap * 2 : 1024;
        if ((ls->start = realloc(ls->start, ls->n_cap * sizeof *ls->start)) == NULL)
            die("out of memory");
    }
    ls->start[ls->n++] = ls->len;
    memcpy(ls->buf + ls->len, s, n);
    ls->len += n;
    ls->buf[ls->len++] = '\n';
}

static uint64_t rng = 0x2545F4914F6CDD1Du;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* Append "[a, b, ...]" of n random ids below bound to s at *k. */
static size_t put_ids(char *s, size_t k, uint32_t n, uint64_t bound)
{
    s[k++] = '[';
    for (uint32_t i = 0; i < n; i++)
        k += (size_t)sprintf(
            s + k, "%s%llu", i ? ", " : "",
            (unsigned long long)(((uint64_t)rnd(1u << 31) << 31 | rnd(1u << 31)) % bound));
    s[k++] = ']';
    return k;
}

static void make_tokens(lines *ls, size_t n_lines)
{
    char *s = malloc(8000 * 12 + 4096);
    if (s == NULL)
        die("out of memory");
    for (size_t l = 0; l < n_lines; l++) {
        size_t k = (size_t)sprintf(s, "{\"tokens\": ");
        k = put_ids(s, k, 500 + rnd(7501), 151936);
        k += (size_t)sprintf(s + k, ", \"output_tokens\": ");
        k = put_ids(s, k, 1 + rnd(256), 151936);
        k += (size_t)sprintf(s + k,
                             ", \"model\": \"Qwen2.5-7B-Instruct\", \"tenant\": \"t%u\", "
                             "\"timestamp\": %u.%03u}",
                             rnd(100), 1700000000 + (unsigned)l, rnd(1000));
        add_line(ls, s, k);
    }
    free(s);
}

static void make_mooncake(lines *ls, size_t n_lines)
{
    char *s = malloc(63 * 24 + 4096);
    if (s == NULL)
        die("out of memory");
    for (size_t l = 0; l < n_lines; l++) {
        uint32_t in = 1 + rnd(32000);
        size_t k = (size_t)sprintf(s,
                                   "{\"timestamp\": %zu, \"input_length\": %u, "
                                   "\"output_length\": %u, \"hash_ids\": ",
                                   l * 37, in, 1 + rnd(1000));
        k = put_ids(s, k, (in + 511) / 512, 200000);
        s[k++] = '}';
        add_line(ls, s, k);
    }
    free(s);
}

static void read_file(lines *ls, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        die(path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            n--;
        if (n > 0)
            add_line(ls, line, (size_t)n);
    }
    free(line);
    fclose(f);
}

/* Seconds on clock (CLOCK_MONOTONIC: wall time; CLOCK_PROCESS_CPUTIME_ID: CPU time). */
static double now(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t line_len(const lines *ls, size_t i)
{
    size_t end = i + 1 < ls->n ? ls->start[i + 1] : ls->len;
    return end - ls->start[i] - 1;
}

/* jansson's allocator, counting live and peak bytes as glibc's malloc hands them out: the
 * usable size of each block plus its 8-byte chunk header. */
static size_t j_live, j_peak;

static void *j_malloc(size_t n)
{
    void *p = malloc(n);
    if (p == NULL)
        return NULL;
    j_live += malloc_usable_size(p) + 8;
    if (j_live > j_peak)
        j_peak = j_live;
    return p;
}

static void j_free(void *p)
{
    if (p == NULL)
        return;
    j_live -= malloc_usable_size(p) + 8;
    free(p);
}

/* The bytes the scanner needs for line i alone: a fresh scanner and record, whose arrays
 * grow geometrically from 16 elements, measured by their capacities. */
static double scan_bytes(const lines *ls, size_t i)
{
    js_scanner s;
    js_record rec;
    js_scanner_init(&s);
    js_record_init(&rec);
    if (js_scan(&s, ls->buf + ls->start[i], line_len(ls, i), &rec) != JS_OK)
        die(s.err);
    double held = (double)(rec.tokens_cap * 4 + rec.output_tokens_cap * 4 + rec.hash_ids_cap * 8 +
                           s.keys_cap * sizeof(js_key));
    js_scanner_free(&s);
    js_record_free(&rec);
    return held;
}

/* One scanner pass; returns the sum of every id and sets *max_ratio to the largest
 * retained-bytes / line-bytes ratio. */
static uint64_t pass_scan(const lines *ls, js_scanner *s, js_record *rec, double *max_ratio)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < ls->n; i++) {
        size_t n = line_len(ls, i);
        int rc = js_scan(s, ls->buf + ls->start[i], n, rec);
        if (rc != JS_OK)
            die(s->err);
        for (size_t k = 0; k < rec->tokens.n; k++)
            sum += rec->tokens_v[k];
        for (size_t k = 0; k < rec->output_tokens.n; k++)
            sum += rec->output_tokens_v[k];
        for (size_t k = 0; k < rec->hash_ids.n; k++)
            sum += rec->hash_ids_v[k];
        if (max_ratio != NULL && scan_bytes(ls, i) / (double)n > *max_ratio)
            *max_ratio = scan_bytes(ls, i) / (double)n;
    }
    return sum;
}

static uint64_t sum_array(const json_t *a)
{
    uint64_t sum = 0;
    for (size_t k = 0; k < json_array_size(a); k++)
        sum += (uint64_t)json_integer_value(json_array_get(a, k));
    return sum;
}

/* One jansson pass; as pass_scan, with the ratio of jansson's peak bytes. */
static uint64_t pass_jansson(const lines *ls, double *max_ratio)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < ls->n; i++) {
        size_t n = line_len(ls, i);
        json_error_t err;
        j_peak = j_live;
        json_t *o =
            json_loadb(ls->buf + ls->start[i], n, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &err);
        if (o == NULL)
            die(err.text);
        sum += sum_array(json_object_get(o, "tokens"));
        sum += sum_array(json_object_get(o, "output_tokens"));
        sum += sum_array(json_object_get(o, "hash_ids"));
        json_decref(o);
        if (max_ratio != NULL && (double)j_peak / (double)n > *max_ratio)
            *max_ratio = (double)j_peak / (double)n;
    }
    return sum;
}

static void bench_set(const char *name, const lines *ls, int runs)
{
    js_scanner s;
    js_record rec;
    js_scanner_init(&s);
    js_record_init(&rec);
    double mb = (double)ls->len / 1e6, mem_scan = 0, mem_j = 0;
    double v_scan[MAX_RUNS], v_j[MAX_RUNS], ratio[MAX_RUNS], c_scan[MAX_RUNS], c_j[MAX_RUNS];
    uint64_t sum_scan = pass_scan(ls, &s, &rec, &mem_scan); /* warm-up, and memory */
    uint64_t sum_j = pass_jansson(ls, &mem_j);
    if (sum_scan != sum_j)
        die("the scanner and jansson decoded different ids");
    for (int r = 0; r < runs; r++) {
        double t0 = now(CLOCK_MONOTONIC), u0 = now(CLOCK_PROCESS_CPUTIME_ID);
        sum_scan = pass_scan(ls, &s, &rec, NULL);
        double t1 = now(CLOCK_MONOTONIC), u1 = now(CLOCK_PROCESS_CPUTIME_ID);
        sum_j = pass_jansson(ls, NULL);
        double t2 = now(CLOCK_MONOTONIC), u2 = now(CLOCK_PROCESS_CPUTIME_ID);
        if (sum_scan != sum_j)
            die("the scanner and jansson decoded different ids");
        v_scan[r] = mb / (t1 - t0);
        v_j[r] = mb / (t2 - t1);
        c_scan[r] = mb / (u1 - u0);
        c_j[r] = mb / (u2 - u1);
        ratio[r] = v_scan[r] / v_j[r];
    }
    printf("%-9s %6zu lines %5.1f MB  wall MB/s: scanner %6.1f jansson %5.1f ratio %5.2fx"
           "  CPU MB/s: scanner %6.1f jansson %5.1f  bytes per line byte: scanner %.2f, "
           "jansson %.1f\n",
           name, ls->n, mb, bench_median(v_scan, runs), bench_median(v_j, runs),
           bench_median(ratio, runs), bench_median(c_scan, runs), bench_median(c_j, runs), mem_scan,
           mem_j);
    js_scanner_free(&s);
    js_record_free(&rec);
}

int main(int argc, char **argv)
{
    int runs = 5, first = 1;
    if (argc > 2 && strcmp(argv[1], "--runs") == 0) {
        runs = atoi(argv[2]);
        first = 3;
    }
    if (runs < 1 || runs > MAX_RUNS)
        die("--runs takes 1..31");
    json_set_alloc_funcs(j_malloc, j_free);
    lines tok = {0}, moon = {0};
    make_tokens(&tok, 1000);
    for (int i = first; i < argc; i++)
        read_file(&moon, argv[i]);
    bool synthetic = moon.n == 0;
    if (synthetic)
        make_mooncake(&moon, 20000);
    printf("bench_jsonl_scan: build %s, medians of %d runs%s\n", KVP_BENCH_BUILDTYPE, runs,
           synthetic ? ", synthetic Mooncake lines" : "");
    bench_set("tokens", &tok, runs);
    bench_set("mooncake", &moon, runs);
    free(tok.buf);
    free(tok.start);
    free(moon.buf);
    free(moon.start);
    return 0;
}
