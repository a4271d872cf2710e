/*
 * bench_replay.c - how fast `kvprefix replay` is on a real trace: one capacity through the
 * pool, a 20-point sweep, and the sweep alone, each run --reps times (default 7) as a child
 * process; the wall time of each run (process start to exit), its requests/s, and the time
 * it spent in the engine (pool, LRU stack model and evaluation, as its --json reports) versus
 * reading and parsing the log. Medians over the runs, and the ratio sweep / single measured
 * as the median of per-round ratios (the two runs of a round are back to back, so machine
 * noise hits both).
 *
 *   bench_replay [--reps N] [--bin PATH] [--capacity C] TRACE
 *
 * PATH defaults to the kvprefix built next to this program (KVP_BENCH_KVPREFIX); TRACE is a
 * path, e.g. the Mooncake conversation_trace.jsonl (docs/replay.md names its public source).
 * Targets (issue 3): a single replay of the conversation trace well under 1 s, the sweep
 * under 1.5x a single replay.
 *
 * Large token logs (issue 9): throughput and memory per request.
 *
 *   bench_replay --tokens N1,N2 [--reps R] [--bin PATH] [--before PATH2] [--capacity C]
 *
 * writes a token log of N1 and one of N2 requests to /tmp (deleted at the end), then runs
 * `PATH replay --capacity C --json` (and PATH2, e.g. a build of main, back to back with it)
 * R times (default 3) on each, and reports medians of: wall MB/s and requests/s, MB/s per
 * CPU second (user + system, from wait4: the machine is shared, so the CPU figure is the
 * stable one), user CPU seconds, peak RSS (ru_maxrss), and the RSS per request, from the
 * two sizes: (RSS(N2) - RSS(N1)) / (N2 - N1). The logs are built so that their distinct
 * blocks stop growing early (every prompt is one of 16 system prompts followed by one of
 * 1024 user turns: 16384 prompts, all seen within the first ~200k requests), so that slope
 * is what a request costs, not what new blocks cost. Lines look like a serving log's:
 *
 *   {"timestamp": 12.345, "model": "llama-3.1-8b", "tenant": "t07", "tokens": [...],
 *    "output_tokens": [...]}
 *
 * with token ids below 128000, system prompts of 50-250 tokens, user turns of 20-180 and
 * 0-40 output tokens (about 2 KB a line; 2M requests make about 3.9 GB).
 *
 *   bench_replay --write N FILE     writes that log of N requests to FILE and exits (to
 *                                   profile a run, or to time other tools on it)
 */
#define _DEFAULT_SOURCE /* wait4 */
#include <inttypes.h>
#include <jansson.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "benchutil.h"

#ifndef KVP_BENCH_KVPREFIX
#define KVP_BENCH_KVPREFIX "kvprefix"
#endif

extern char **environ;

typedef struct sample {
    double wall;     /* seconds, process start to exit */
    double engine;   /* seconds the run spent in the engine */
    double requests; /* requests replayed */
    double user;     /* user CPU seconds of the child (wait4) */
    double sys;      /* system CPU seconds of the child */
    double rss_mb;   /* peak resident set of the child, MB (ru_maxrss) */
} sample;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Run kvprefix replay ARGS... --json TRACE and read its figures. Returns 0 or -1. */
static int run(const char *bin, char *const *extra, const char *trace, sample *out)
{
    char *argv[16];
    int n = 0;
    argv[n++] = (char *)bin;
    argv[n++] = (char *)"replay";
    for (int i = 0; extra[i]; i++)
        argv[n++] = extra[i];
    argv[n++] = (char *)"--json";
    argv[n++] = (char *)"--no-progress";
    argv[n++] = (char *)trace;
    argv[n] = NULL;
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    pid_t pid;
    double t0 = now_s();
    int rc = posix_spawn(&pid, bin, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    if (rc != 0) {
        close(fd[0]);
        fprintf(stderr, "bench_replay: cannot run %s\n", bin);
        return -1;
    }
    FILE *f = fdopen(fd[0], "r");
    json_error_t je;
    json_t *j = json_loadf(f, 0, &je);
    fclose(f);
    int st;
    struct rusage ru;
    wait4(pid, &st, 0, &ru);
    out->wall = now_s() - t0;
    out->user = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6;
    out->sys = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
    out->rss_mb = (double)ru.ru_maxrss / 1024.0;
    if (!j || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "bench_replay: %s replay failed\n", bin);
        json_decref(j);
        return -1;
    }
    out->engine = json_real_value(json_object_get(j, "seconds_engine"));
    out->requests =
        (double)json_integer_value(json_object_get(json_object_get(j, "ceiling"), "requests"));
    json_decref(j);
    return 0;
}

/* ---- large token logs ---------------------------------------------------------------- */

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

enum { N_SYS = 16, N_TURNS = 1024 };

typedef struct piece {
    char *text; /* the ids as JSON array elements, "12, 345, ..." with a trailing ", " */
    size_t len; /* bytes at text */
} piece;

/* A run of n random token ids, each followed by ", ". */
static piece make_piece(uint64_t *seed, size_t n)
{
    piece p = {malloc(n * 8 + 1), 0};
    for (size_t i = 0; p.text && i < n; i++)
        p.len += (size_t)sprintf(p.text + p.len, "%u, ", (unsigned)(rng(seed) % 128000));
    return p;
}

/* Write the token log of n requests described in the opening comment to path. Returns 0 or
 * -1; *bytes is its size. */
static int generate(const char *path, uint64_t n, uint64_t *bytes)
{
    uint64_t seed = 20261130;
    piece sys[N_SYS], turn[N_TURNS];
    for (int i = 0; i < N_SYS; i++)
        sys[i] = make_piece(&seed, 50 + rng(&seed) % 201);
    for (int i = 0; i < N_TURNS; i++)
        turn[i] = make_piece(&seed, 20 + rng(&seed) % 161);
    FILE *f = fopen(path, "w");
    int rc = f ? 0 : -1;
    static char buf[1 << 20];
    if (f)
        setvbuf(f, buf, _IOFBF, sizeof buf);
    for (uint64_t r = 0; f && r < n; r++) {
        const piece *a = &sys[rng(&seed) % N_SYS], *b = &turn[rng(&seed) % N_TURNS];
        fprintf(f,
                "{\"timestamp\": %.3f, \"model\": \"llama-3.1-8b\", \"tenant\": \"t%02u\", "
                "\"tokens\": [",
                (double)r * 0.05, (unsigned)(a - sys));
        fwrite(a->text, 1, a->len, f);
        fwrite(b->text, 1, b->len - 2, f); /* without the last ", " */
        fputs("], \"output_tokens\": [", f);
        unsigned n_out = (unsigned)(rng(&seed) % 41);
        for (unsigned i = 0; i < n_out; i++)
            fprintf(f, "%s%u", i ? ", " : "", (unsigned)(rng(&seed) % 128000));
        fputs("]}\n", f);
    }
    if (f && fclose(f) != 0)
        rc = -1;
    for (int i = 0; i < N_SYS; i++)
        free(sys[i].text);
    for (int i = 0; i < N_TURNS; i++)
        free(turn[i].text);
    struct stat st;
    *bytes = rc == 0 && stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
    return rc == 0 && *bytes > 0 ? 0 : -1;
}

/* Medians of one binary on one log. */
typedef struct scale_fig {
    double wall, user, cpu, rss_mb, requests;
} scale_fig;

/* Run bins[0..n_bins) back to back reps times on path; medians into fig[]. Returns 0 or -1. */
static int scale_runs(const char *const *bins, int n_bins, const char *path, char *cap, int reps,
                      scale_fig *fig)
{
    char *args[] = {(char *)"--capacity", cap, NULL};
    static double w[2][1000], u[2][1000], c[2][1000], m[2][1000];
    sample s;
    for (int r = 0; r < reps; r++)
        for (int b = 0; b < n_bins; b++) {
            if (run(bins[b], args, path, &s) != 0)
                return -1;
            w[b][r] = s.wall;
            u[b][r] = s.user;
            c[b][r] = s.user + s.sys;
            m[b][r] = s.rss_mb;
            fig[b].requests = s.requests;
        }
    for (int b = 0; b < n_bins; b++) {
        fig[b].wall = bench_median(w[b], reps);
        fig[b].user = bench_median(u[b], reps);
        fig[b].cpu = bench_median(c[b], reps);
        fig[b].rss_mb = bench_median(m[b], reps);
    }
    return 0;
}

/* --tokens N1,N2 mode (see the opening comment). Returns the exit status. */
static int scale_main(const char *sizes, const char *bin, const char *before, char *cap, int reps)
{
    uint64_t n[2] = {0, 0};
    if (sscanf(sizes, "%" SCNu64 ",%" SCNu64, &n[0], &n[1]) != 2 || n[0] == 0 || n[1] <= n[0]) {
        fprintf(stderr, "bench_replay: --tokens N1,N2 with 0 < N1 < N2\n");
        return 2;
    }
    const char *bins[2] = {bin, before};
    const char *names[2] = {"this build", "before"};
    int n_bins = before ? 2 : 1;
    scale_fig fig[2][2];
    uint64_t bytes[2];
    for (int k = 0; k < 2; k++) {
        char path[64];
        snprintf(path, sizeof path, "/tmp/bench_replay_tokens_%d.jsonl", (int)getpid());
        int rc = generate(path, n[k], &bytes[k]);
        if (rc == 0)
            rc = scale_runs(bins, n_bins, path, cap, reps, fig[k]);
        unlink(path);
        if (rc != 0) {
            fprintf(stderr, "bench_replay: the %" PRIu64 "-request log failed\n", n[k]);
            return 1;
        }
    }
    printf("bench_replay --tokens: token logs of %" PRIu64 " and %" PRIu64 " requests "
           "(%.0f and %.0f MB), --capacity %s, %d runs each (medians)\n",
           n[0], n[1], (double)bytes[0] / 1e6, (double)bytes[1] / 1e6, cap, reps);
    printf("  %-11s %9s %8s %8s %10s %9s %10s %9s %9s\n", "binary", "requests", "wall s", "MB/s",
           "requests/s", "user s", "MB/cpu-s", "peak MB", "B/request");
    for (int b = 0; b < n_bins; b++)
        for (int k = 0; k < 2; k++) {
            const scale_fig *f = &fig[k][b];
            double mb = (double)bytes[k] / 1e6;
            double slope =
                (fig[1][b].rss_mb - fig[0][b].rss_mb) * 1048576.0 / (double)(n[1] - n[0]);
            printf("  %-11s %9.0f %8.2f %8.1f %10.0f %9.2f %10.1f %9.1f %9.1f\n", names[b],
                   f->requests, f->wall, mb / f->wall, f->requests / f->wall, f->user, mb / f->cpu,
                   f->rss_mb, slope);
        }
    if (n_bins == 2)
        printf("  speed-up on %" PRIu64 " requests: %.2fx wall, %.2fx CPU\n", n[1],
               fig[1][1].wall / fig[1][0].wall, fig[1][1].cpu / fig[1][0].cpu);
    printf("SUMMARY mb_s=%.1f mb_cpu_s=%.1f rss_per_request=%.1f\n",
           (double)bytes[1] / 1e6 / fig[1][0].wall, (double)bytes[1] / 1e6 / fig[1][0].cpu,
           (fig[1][0].rss_mb - fig[0][0].rss_mb) * 1048576.0 / (double)(n[1] - n[0]));
    return 0;
}

int main(int argc, char **argv)
{
    int reps = 7;
    const char *bin = KVP_BENCH_KVPREFIX, *trace = NULL, *before = NULL, *sizes = NULL;
    char *cap = (char *)"20000";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc)
            sizes = argv[++i];
        else if (strcmp(argv[i], "--before") == 0 && i + 1 < argc)
            before = argv[++i];
        else if (strcmp(argv[i], "--write") == 0 && i + 2 < argc) {
            uint64_t bytes;
            return generate(argv[i + 2], strtoull(argv[i + 1], NULL, 10), &bytes) ? 1 : 0;
        } else if (strcmp(argv[i], "--bin") == 0 && i + 1 < argc)
            bin = argv[++i];
        else if (strcmp(argv[i], "--capacity") == 0 && i + 1 < argc)
            cap = argv[++i];
        else if (argv[i][0] != '-' && !trace)
            trace = argv[i];
        else {
            fprintf(stderr, "usage: bench_replay [--reps N] [--bin PATH] [--capacity C] TRACE\n");
            return 2;
        }
    }
    if (sizes && reps >= 1 && reps <= 1000 && !trace)
        return scale_main(sizes, bin, before, cap, reps);
    if (!trace || reps < 1 || reps > 1000) {
        fprintf(stderr, "usage: bench_replay [--reps N] [--bin PATH] [--capacity C] TRACE\n");
        return 2;
    }
    char *single[] = {(char *)"--capacity", cap, NULL};
    char *both[] = {(char *)"--capacity", cap, (char *)"--sweep=20", NULL};
    char *sweep[] = {(char *)"--sweep=20", NULL};
    char *const *cfg[3] = {single, both, sweep};
    const char *name[3] = {"single capacity (pool)", "capacity + 20-point sweep",
                           "20-point sweep alone"};
    double wall[3][1000], eng[3][1000], ratio[2][1000], req = 0;
    sample s;
    if (run(bin, single, trace, &s) != 0) /* warm the page cache */
        return 1;
    for (int r = 0; r < reps; r++) {
        for (int c = 0; c < 3; c++) {
            if (run(bin, cfg[c], trace, &s) != 0)
                return 1;
            wall[c][r] = s.wall;
            eng[c][r] = s.engine;
            req = s.requests;
        }
        ratio[0][r] = wall[1][r] / wall[0][r];
        ratio[1][r] = wall[2][r] / wall[0][r];
    }
    printf("bench_replay: %s, %.0f requests, capacity %s, %d runs each (medians)\n", trace, req,
           cap, reps);
    printf("  %-28s %10s %12s %10s %10s\n", "run", "wall s", "requests/s", "engine s", "reading");
    double single_wall = 0;
    for (int c = 0; c < 3; c++) {
        double w = bench_median(wall[c], reps), e = bench_median(eng[c], reps);
        if (c == 0)
            single_wall = w;
        printf("  %-28s %10.3f %12.0f %10.3f %9.0f%%\n", name[c], w, req / w, e,
               100.0 * (w - e) / w);
    }
    double r1 = bench_median(ratio[0], reps), r2 = bench_median(ratio[1], reps);
    printf("  sweep / single: %.2fx with the pool run, %.2fx sweep alone (target < 1.5x)\n", r1,
           r2);
    printf("  single replay %.3f s (target: well under 1 s) %s\n", single_wall,
           single_wall < 1.0 ? "PASS" : "MISS");
    printf("SUMMARY single_s=%.3f sweep_ratio=%.2f sweep_only_ratio=%.2f\n", single_wall, r1, r2);
    return 0;
}
