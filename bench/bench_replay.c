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
 * PATH defaults to the kvprefix built next to this program (KVP_BENCH_KVPREFIX); TRACE is
 * e.g. ../shared/traces/conversation_trace.jsonl. Targets (issue 3): a single replay of the
 * conversation trace well under 1 s, the sweep under 1.5x a single replay.
 */
#include <jansson.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef KVP_BENCH_KVPREFIX
#define KVP_BENCH_KVPREFIX "kvprefix"
#endif

extern char **environ;

typedef struct sample {
    double wall;     /* seconds, process start to exit */
    double engine;   /* seconds the run spent in the engine */
    double requests; /* requests replayed */
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
    waitpid(pid, &st, 0);
    out->wall = now_s() - t0;
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

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

int main(int argc, char **argv)
{
    int reps = 7;
    const char *bin = KVP_BENCH_KVPREFIX, *trace = NULL;
    char *cap = (char *)"20000";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--bin") == 0 && i + 1 < argc)
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
        double w = median(wall[c], reps), e = median(eng[c], reps);
        if (c == 0)
            single_wall = w;
        printf("  %-28s %10.3f %12.0f %10.3f %9.0f%%\n", name[c], w, req / w, e,
               100.0 * (w - e) / w);
    }
    double r1 = median(ratio[0], reps), r2 = median(ratio[1], reps);
    printf("  sweep / single: %.2fx with the pool run, %.2fx sweep alone (target < 1.5x)\n", r1,
           r2);
    printf("  single replay %.3f s (target: well under 1 s) %s\n", single_wall,
           single_wall < 1.0 ? "PASS" : "MISS");
    printf("SUMMARY single_s=%.3f sweep_ratio=%.2f sweep_only_ratio=%.2f\n", single_wall, r1, r2);
    return 0;
}
