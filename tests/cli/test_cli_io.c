/*
 * test_cli_io.c - the built kvprefix binary's handling of files and hostile input: outputs
 * that never cost a user's file (a temporary file renamed on success, nothing removed that
 * the tool did not create, an output equal to an input refused), write errors reported in
 * every subcommand, escaping in every output format, odd bytes in logs (BOM, CR-only line
 * endings, NUL), stdin named the same everywhere, gzip trailing data, a gzip bomb stopped at
 * the line limit, a huge --capacity that costs nothing, and a run killed by SIGTERM, SIGINT
 * or SIGHUP while its outputs are open: no temporary file left, the targets untouched, the
 * run dead of that signal (and an inherited SIG_IGN kept).
 *
 * Each test here failed before the issue-9 work: --plot LOG LOG wiped the log, a failing run
 * deleted an existing chart, replay and demo exited 0 on /dev/full, --csv wrote formulas
 * and escape sequences raw, a BOM was an invalid token, a NUL read as "invalid token near end
 * of file", gzip trailing data was ignored, a 1 GiB zero bomb cost 2.2 GB and --capacity
 * 2^31 allocated a 200 GB pool.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cliutil.h"

static char err[65536];

/* A fresh scratch directory (its path in a static buffer). */
static const char *scratch(void)
{
    static char dir[64];
    snprintf(dir, sizeof dir, "/tmp/kvp_io_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    return dir;
}

static void write_file(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

static size_t read_file(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
    fclose(f);
    return n;
}

/* Run a shell command line with $KVPREFIX_BIN as "K" (stderr into err, stdout discarded
 * unless redirected by the line). Returns the exit status. */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    const char *bin = getenv("KVPREFIX_BIN");
    if (bin == NULL || *bin == '\0')
        cr_skip_test("KVPREFIX_BIN is not set");
    char line[8192], cmd[16384], errf[] = "/tmp/kvp_io_errXXXXXX";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    int fd = mkstemp(errf);
    cr_assert(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof cmd, "K='%s'; { %s ; } 2>'%s'", bin, line, errf);
    int st = system(cmd);
    cr_assert(WIFEXITED(st), "%s did not exit normally", line);
    read_file(errf, err, sizeof err);
    remove(errf);
    return WEXITSTATUS(st);
}

/* Files in dir whose name starts with prefix (the tool's temporary files are ".NAME."). */
static int count_prefixed(const char *dir, const char *prefix)
{
    char cmd[512], buf[64];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | grep -c '^%s' || true", dir, prefix);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    int n = fgets(buf, sizeof buf, p) ? atoi(buf) : -1;
    pclose(p);
    return n;
}

/* ---- write errors ------------------------------------------------------------------------ */

Test(io, write_errors_exit_1_in_every_subcommand)
{
    const char *log = cli_data("replay_hand.jsonl");
    cr_expect_eq(sh("$K replay --capacity 4 '%s' >/dev/full", log), 1, "%s", err);
    cr_expect(strstr(err, "standard output: cannot write") != NULL, "%s", err);
    cr_expect_eq(sh("$K plan --model Llama-3.1-8B --seq-len 4096 >/dev/full"), 1, "%s", err);
    cr_expect(strstr(err, "standard output: cannot write") != NULL, "%s", err);
    cr_expect_eq(sh("$K demo >/dev/full"), 1, "%s", err);
    cr_expect(strstr(err, "standard output: cannot write") != NULL, "%s", err);
    cr_expect_eq(sh("$K replay --help >/dev/full"), 1, "%s", err);
    cr_expect_eq(sh("$K replay --capacity 4 -o /dev/full '%s'", log), 1, "%s", err);
    cr_expect(strstr(err, "/dev/full: cannot write") != NULL, "%s", err);
    cr_expect_eq(sh("$K replay --sweep --plot /dev/full '%s' >/dev/null", log), 1, "%s", err);
    cr_expect(strstr(err, "/dev/full: ") != NULL && strstr(err, "No space left") != NULL, "%s",
              err);
}

/* ---- outputs and inputs ----------------------------------------------------------------- */

Test(io, output_equal_to_input_is_refused)
{
    const char *dir = scratch();
    char log[256], hard[256], keep[4096], now[4096];
    snprintf(log, sizeof log, "%s/log.jsonl", dir);
    snprintf(hard, sizeof hard, "%s/hard.jsonl", dir);
    size_t n = read_file(cli_data("replay_hand.jsonl"), keep, sizeof keep);
    write_file(log, keep, n);
    cr_assert_eq(link(log, hard), 0);
    cr_expect_eq(sh("$K replay --sweep --plot '%s' '%s'", log, log), 2, "%s", err);
    cr_expect(strstr(err, "is also an input; refusing to overwrite it") != NULL, "%s", err);
    cr_expect_eq(sh("$K replay --sweep --plot '%s' '%s'", hard, log), 2, "%s", err);
    cr_expect_eq(sh("$K replay --capacity 4 -o '%s' '%s'", log, log), 2, "%s", err);
    cr_expect_eq(sh("$K replay --capacity 4 --output '%s' '%s'", hard, log), 2, "%s", err);
    cr_expect_eq(read_file(log, now, sizeof now), n);
    cr_expect_eq(memcmp(now, keep, n), 0, "the log changed");
    sh("rm -rf '%s'", dir);
}

Test(io, failing_run_keeps_existing_chart)
{
    const char *dir = scratch();
    char chart[256], bad[256], buf[256];
    snprintf(chart, sizeof chart, "%s/curve.svg", dir);
    snprintf(bad, sizeof bad, "%s/bad.jsonl", dir);
    write_file(chart, "KEEP ME", 7);
    cr_assert_eq(chmod(chart, 0640), 0);
    write_file(bad, "{\"tokens\": [1, 2, 3]}\nnot json\n", 30);
    cr_expect_eq(sh("$K replay --sweep --plot '%s' '%s'", chart, bad), 1, "%s", err);
    cr_expect_eq(read_file(chart, buf, sizeof buf), 7);
    cr_expect_str_eq(buf, "KEEP ME");
    cr_expect_eq(count_prefixed(dir, ".curve.svg."), 0, "a temporary file was left behind");
    /* A run that fails at the end (the report cannot be written) keeps it too. */
    cr_expect_eq(
        sh("$K replay --sweep --plot '%s' '%s' >/dev/full", chart, cli_data("replay_hand.jsonl")),
        1, "%s", err);
    cr_expect_eq(read_file(chart, buf, sizeof buf), 7);
    /* A successful run replaces it, keeping its mode. */
    cr_expect_eq(
        sh("$K replay --sweep --plot '%s' '%s' >/dev/null", chart, cli_data("replay_hand.jsonl")),
        0, "%s", err);
    read_file(chart, buf, sizeof buf);
    cr_expect(strstr(buf, "<svg") != NULL || strstr(buf, "<?xml") != NULL, "%s", buf);
    struct stat st;
    cr_assert_eq(stat(chart, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0640, "mode %o", st.st_mode & 0777);
    cr_expect_eq(count_prefixed(dir, ".curve.svg."), 0);
    sh("rm -rf '%s'", dir);
}

Test(io, report_to_file_with_o)
{
    const char *dir = scratch();
    char rep[256], buf[65536];
    snprintf(rep, sizeof rep, "%s/report.json", dir);
    write_file(rep, "OLD", 3);
    cr_expect_eq(
        sh("$K replay --capacity 4 --json -o '%s' '%s'", rep, cli_data("replay_bad_mixed.jsonl")),
        1, "%s", err);
    read_file(rep, buf, sizeof buf);
    cr_expect_str_eq(buf, "OLD");
    cr_expect_eq(sh("$K replay --block-size 2 --capacity 3 --json -o '%s' '%s'", rep,
                    cli_data("replay_hand.jsonl")),
                 0, "%s", err);
    read_file(rep, buf, sizeof buf);
    cr_expect(strstr(buf, "\"hit_tokens\": 8") != NULL, "%s", buf);
    sh("rm -rf '%s'", dir);
}

Test(io, dev_null_is_written_never_removed)
{
    cr_expect_eq(
        sh("$K replay --sweep --plot /dev/null '%s' >/dev/null", cli_data("replay_hand.jsonl")), 0,
        "%s", err);
    cr_expect_eq(sh("$K replay --sweep --plot /dev/null '%s' >/dev/null",
                    cli_data("replay_bad_mixed.jsonl")),
                 1, "%s", err);
    struct stat st;
    cr_assert_eq(stat("/dev/null", &st), 0);
    cr_expect(S_ISCHR(st.st_mode), "/dev/null is no longer a device");
}

/* ---- escaping ------------------------------------------------------------------------------ */

Test(io, csv_and_table_neutralise_names)
{
    const char *dir = scratch();
    char log[256];
    snprintf(log, sizeof log, "%s/inj.jsonl", dir);
    const char text[] = "{\"tokens\": [1, 2, 3, 4], \"tenant\": \"=1+1\"}\n"
                        "{\"tokens\": [1, 2, 3, 4], \"tenant\": \"@SUM(A1)\"}\n"
                        "{\"tokens\": [1, 2, 3, 4], \"tenant\": \"+cmd\"}\n"
                        "{\"tokens\": [1, 2, 3, 4], \"tenant\": \"-2\"}\n"
                        "{\"tokens\": [1, 2, 3, 4], \"tenant\": \"\\u001b[31mred\\u0007\"}\n"
                        "{\"tokens\": [1, 2, 3, 4], \"tenant\": \"\\tab\"}\n"
                        "{\"tokens\": [1, 2, 3, 4], \"tenant\": \"\\u009bc1\"}\n";
    write_file(log, text, sizeof text - 1);
    cr_assert_eq(sh("$K replay --block-size 2 --capacity 4 --csv '%s' >'%s.csv'", log, log), 0,
                 "%s", err);
    char path[300], buf[65536];
    snprintf(path, sizeof path, "%s.csv", log);
    read_file(path, buf, sizeof buf);
    cr_expect(strstr(buf, "tenant,\"'=1+1\",") != NULL, "%s", buf);
    cr_expect(strstr(buf, "tenant,\"'@SUM(A1)\",") != NULL, "%s", buf);
    cr_expect(strstr(buf, "tenant,\"'+cmd\",") != NULL, "%s", buf);
    cr_expect(strstr(buf, "tenant,\"'-2\",") != NULL, "%s", buf);
    cr_expect(strstr(buf, "tenant,\"\\x1b[31mred\\x07\",") != NULL, "%s", buf);
    cr_expect(strstr(buf, "tenant,\"'\\x09ab\",") != NULL, "%s", buf);
    cr_expect(strstr(buf, "tenant,\"\\xc2\\x9bc1\",") != NULL, "%s", buf);
    cr_expect(strchr(buf, '\x1b') == NULL && strchr(buf, '\t') == NULL, "raw control bytes");
    cr_assert_eq(sh("$K replay --block-size 2 --capacity 4 '%s' >'%s.txt'", log, log), 0);
    snprintf(path, sizeof path, "%s.txt", log);
    read_file(path, buf, sizeof buf);
    cr_expect(strchr(buf, '\x1b') == NULL && strchr(buf, '\a') == NULL, "raw control bytes");
    sh("rm -rf '%s'", dir);
}

/* ---- odd bytes in logs -------------------------------------------------------------------- */

Test(io, bom_cr_and_nul)
{
    const char *dir = scratch();
    char path[256];
    snprintf(path, sizeof path, "%s/bom.jsonl", dir);
    const char bom[] = "\xEF\xBB\xBF{\"tokens\": [1, 2, 3, 4]}\n{\"tokens\": [1, 2, 3, 5]}\n";
    write_file(path, bom, sizeof bom - 1);
    cr_expect_eq(sh("$K replay --block-size 2 --capacity 4 '%s' >/dev/null", path), 0, "%s", err);
    snprintf(path, sizeof path, "%s/cr.jsonl", dir);
    const char cr[] = "{\"tokens\": [1, 2, 3, 4]}\r{\"tokens\": [1, 2, 3, 5]}\r";
    write_file(path, cr, sizeof cr - 1);
    cr_expect_eq(sh("$K replay --block-size 2 --capacity 4 '%s'", path), 1, "%s", err);
    cr_expect(strstr(err, "cr.jsonl:1: ") != NULL && strstr(err, "carriage return") != NULL, "%s",
              err);
    snprintf(path, sizeof path, "%s/nul.jsonl", dir);
    const char nul[] = "{\"tokens\": [1, 2, 3, 4]}\n{\"tokens\": [1, \0 2]}\n";
    write_file(path, nul, sizeof nul - 1);
    cr_expect_eq(sh("$K replay --block-size 2 --capacity 4 '%s'", path), 1, "%s", err);
    cr_expect(strstr(err, "nul.jsonl:2: a raw NUL byte at column 16") != NULL, "%s", err);
    sh("rm -rf '%s'", dir);
}

Test(io, stdin_is_named_the_same_everywhere)
{
    cr_expect_eq(sh(": | $K replay --capacity 4 -"), 1);
    cr_expect(strstr(err, "<stdin>: no requests") != NULL, "%s", err);
    cr_expect_eq(sh(": | $K plan --model Llama-3.1-8B --trace -"), 1);
    cr_expect(strstr(err, "<stdin>: no requests") != NULL, "%s", err);
    cr_expect_eq(sh("echo x | $K replay --capacity 4 -"), 1);
    cr_expect(strstr(err, "<stdin>:1: ") != NULL, "%s", err);
    cr_expect(strstr(err, " -:") == NULL && strstr(err, ": -") == NULL, "%s", err);
}

Test(io, gzip_trailing_data_and_members)
{
    const char *dir = scratch();
    const char *one = "{\"tokens\": [1, 2, 3, 4]}";
    cr_assert_eq(sh("cd '%s' && echo '%s' | gzip > a.gz && cat a.gz a.gz > two.gz && "
                    "cp a.gz tail.gz && printf 'garbage' >> tail.gz && head -c 20 a.gz > cut.gz",
                    dir, one),
                 0, "%s", err);
    cr_expect_eq(sh("$K replay --block-size 2 --capacity 4 --json '%s/two.gz' | grep -q "
                    "'\"requests\": 2'",
                    dir),
                 0, "%s", err);
    cr_expect_eq(sh("$K replay --block-size 2 --capacity 4 '%s/tail.gz'", dir), 1);
    cr_expect(strstr(err, "tail.gz: trailing data after the gzip data at byte") != NULL, "%s", err);
    cr_expect_eq(sh("$K replay --block-size 2 --capacity 4 '%s/cut.gz'", dir), 1);
    cr_expect(strstr(err, "cut.gz: truncated gzip data") != NULL, "%s", err);
    sh("rm -rf '%s'", dir);
}

/* ---- bounded memory ----------------------------------------------------------------------- */

/* Peak resident set of the children waited for so far, in KiB. */
static long children_maxrss_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    return ru.ru_maxrss;
}

Test(io, gzip_bomb_stops_at_the_line_limit, .timeout = 300)
{
    const char *dir = scratch();
    /* 1 GiB of zeros: about 1 MB of gzip, a single line with no newline. */
    cr_assert_eq(sh("head -c 1073741824 /dev/zero | gzip -1 > '%s/bomb.gz'", dir), 0, "%s", err);
    cr_expect_eq(sh("$K replay --capacity 4 '%s/bomb.gz'", dir), 1);
    cr_expect(strstr(err, "bomb.gz:1: line longer than 67108864 bytes (--max-line-bytes)") != NULL,
              "%s", err);
    cr_expect_eq(sh("$K replay --capacity 4 --max-line-bytes 1MiB '%s/bomb.gz'", dir), 1);
    cr_expect(strstr(err, "bomb.gz:1: line longer than 1048576 bytes (--max-line-bytes)") != NULL,
              "%s", err);
    /* Before, it buffered the whole gigabyte (2.2 GB peak); now at most the 64 MiB line. */
    long kib = children_maxrss_kib();
    cr_expect_lt(kib, 1024 * 1024, "peak RSS %ld KiB", kib);
    sh("rm -rf '%s'", dir);
}

/* A huge --capacity gives the same figures as a capacity of exactly the distinct blocks, and
 * costs no more memory (the pool holds at most 65536 blocks). */
Test(io, huge_capacity_costs_nothing)
{
    const char *dir = scratch();
    char log[256];
    snprintf(log, sizeof log, "%s/log.jsonl", dir);
    FILE *f = fopen(log, "w");
    cr_assert_not_null(f);
    unsigned seed = 7;
    for (int i = 0; i < 1000; i++) {
        fprintf(f, "{\"tenant\": \"t%d\", \"tokens\": [", i % 5);
        for (int k = 0; k < 64; k++)
            fprintf(f, "%s%u", k ? ", " : "",
                    k < 32 ? (unsigned)k : (seed = seed * 1103515245u + 12345u) % 50u);
        fputs("]}\n", f);
    }
    cr_assert_eq(fclose(f), 0);
    char a[300], b[300], buf_a[1 << 16], buf_b[1 << 16];
    snprintf(a, sizeof a, "%s/a.json", dir);
    snprintf(b, sizeof b, "%s/b.json", dir);
    cr_assert_eq(sh("$K replay --capacity 2147483648 --json -o '%s' '%s'", a, log), 0, "%s", err);
    read_file(a, buf_a, sizeof buf_a);
    const char *d = strstr(buf_a, "\"distinct_blocks\": ");
    cr_assert_not_null(d);
    long distinct = atol(d + 19);
    cr_assert_gt(distinct, 1000);
    cr_assert_eq(sh("$K replay --capacity %ld --json -o '%s' '%s'", distinct, b, log), 0, "%s",
                 err);
    read_file(b, buf_b, sizeof buf_b);
    /* Everything from "requests" of the capacity block to the end of the ceiling block. */
    const char *pa = strstr(strstr(buf_a, "\"capacity\": {"), "\"requests\"");
    const char *pb = strstr(strstr(buf_b, "\"capacity\": {"), "\"requests\"");
    const char *ea = strstr(pa, "\"pool_blocks\""), *eb = strstr(pb, "\"pool_blocks\"");
    cr_assert(pa && pb && ea && eb);
    cr_expect_eq(ea - pa, eb - pb);
    cr_expect_eq(strncmp(pa, pb, (size_t)(ea - pa)), 0, "%.*s\nvs\n%.*s", (int)(ea - pa), pa,
                 (int)(eb - pb), pb);
    long kib = children_maxrss_kib();
    cr_expect_lt(kib, 512 * 1024, "peak RSS %ld KiB", kib);
    sh("rm -rf '%s'", dir);
}

/* A chart path that is a symbolic link stays a link: the file it names is replaced. */
Test(io, symlink_target_is_replaced_not_the_link)
{
    const char *dir = scratch();
    char real[256], lnk[256], buf[256];
    snprintf(real, sizeof real, "%s/real.svg", dir);
    snprintf(lnk, sizeof lnk, "%s/link.svg", dir);
    write_file(real, "OLD", 3);
    cr_assert_eq(symlink("real.svg", lnk), 0);
    cr_expect_eq(
        sh("$K replay --sweep --plot '%s' '%s' >/dev/null", lnk, cli_data("replay_hand.jsonl")), 0,
        "%s", err);
    struct stat st;
    cr_assert_eq(lstat(lnk, &st), 0);
    cr_expect(S_ISLNK(st.st_mode), "the link was replaced by a file");
    read_file(real, buf, sizeof buf);
    cr_expect(strstr(buf, "<?xml") != NULL, "%s", buf);
    sh("rm -rf '%s'", dir);
}

/* ---- killed runs ------------------------------------------------------------------------- */

typedef struct killed_run {
    char dir[64];     /* scratch directory */
    char report[128]; /* DIR/report.txt, -o (pre-existing: "old report\n") */
    char chart[128];  /* DIR/chart.svg, --plot (pre-existing: "old chart\n") */
    int log_fd;       /* write end of the run's standard input, held open */
    pid_t pid;        /* the run */
} killed_run;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Start "kvprefix replay --capacity 8 --sweep -o REPORT --plot CHART -" on a pipe the test
 * keeps open, with ignored_sig (0 for none) set to SIG_IGN in the child, and wait until both
 * temporary files exist: the run is then past creating its outputs and blocked reading the
 * log, which never ends until the test closes the pipe. */
static void start_blocked_run(killed_run *r, int ignored_sig)
{
    const char *bin = getenv("KVPREFIX_BIN");
    if (bin == NULL || *bin == '\0')
        cr_skip_test("KVPREFIX_BIN is not set");
    snprintf(r->dir, sizeof r->dir, "%s", scratch());
    snprintf(r->report, sizeof r->report, "%s/report.txt", r->dir);
    snprintf(r->chart, sizeof r->chart, "%s/chart.svg", r->dir);
    write_file(r->report, "old report\n", 11);
    write_file(r->chart, "old chart\n", 10);
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    r->pid = fork();
    cr_assert(r->pid >= 0);
    if (r->pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (dup2(fds[0], 0) < 0 || null < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0)
            _exit(126);
        close(fds[0]);
        close(fds[1]);
        if (ignored_sig)
            signal(ignored_sig, SIG_IGN); /* kept across exec, as nohup does */
        execl(bin, bin, "replay", "--capacity", "8", "--sweep", "-o", r->report, "--plot", r->chart,
              "-", (char *)NULL);
        _exit(127);
    }
    close(fds[0]);
    r->log_fd = fds[1];
    static const char line[] = "{\"tokens\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, "
                               "15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, "
                               "31, 32, 33]}\n";
    for (int i = 0; i < 4; i++)
        cr_assert_eq(write(r->log_fd, line, sizeof line - 1), (ssize_t)(sizeof line - 1));
    int waited = 0;
    while ((count_prefixed(r->dir, "\\.report\\.txt\\.") < 1 ||
            count_prefixed(r->dir, "\\.chart\\.svg\\.") < 1) &&
           waited < 20000) {
        sleep_ms(20);
        waited += 20;
    }
    cr_assert_eq(count_prefixed(r->dir, "\\.report\\.txt\\."), 1, "no temporary report");
    cr_assert_eq(count_prefixed(r->dir, "\\.chart\\.svg\\."), 1, "no temporary chart");
    cr_assert_eq(waitpid(r->pid, NULL, WNOHANG), 0, "the run ended before it was signalled");
}

/* The run's directory holds no temporary file and the targets hold their old content. */
static void expect_untouched(const killed_run *r)
{
    char buf[256];
    cr_expect_eq(count_prefixed(r->dir, "\\."), 0, "a temporary file was left in %s", r->dir);
    read_file(r->report, buf, sizeof buf);
    cr_expect_str_eq(buf, "old report\n");
    read_file(r->chart, buf, sizeof buf);
    cr_expect_str_eq(buf, "old chart\n");
}

static void killed_by(int sig)
{
    killed_run r;
    start_blocked_run(&r, 0);
    cr_assert_eq(kill(r.pid, sig), 0);
    int st;
    cr_assert_eq(waitpid(r.pid, &st, 0), r.pid);
    close(r.log_fd);
    cr_expect(WIFSIGNALED(st), "the run exited (status %d) instead of dying of signal %d",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1, sig);
    if (WIFSIGNALED(st))
        cr_expect_eq(WTERMSIG(st), sig, "died of signal %d, not %d", WTERMSIG(st), sig);
    expect_untouched(&r);
    sh("rm -rf '%s'", r.dir);
}

Test(io, sigterm_removes_temporaries_and_keeps_targets, .timeout = 60)
{
    killed_by(SIGTERM);
}

Test(io, sigint_removes_temporaries_and_keeps_targets, .timeout = 60)
{
    killed_by(SIGINT);
}

Test(io, sighup_removes_temporaries_and_keeps_targets, .timeout = 60)
{
    killed_by(SIGHUP);
}

/* A signal the caller ignores stays ignored: the run survives SIGINT and SIGHUP, then
 * finishes its log and replaces both targets, leaving no temporary file. */
Test(io, ignored_signal_stays_ignored, .timeout = 60)
{
    killed_run r;
    start_blocked_run(&r, SIGINT);
    cr_assert_eq(kill(r.pid, SIGINT), 0);
    sleep_ms(300);
    cr_expect_eq(waitpid(r.pid, NULL, WNOHANG), 0, "an ignored SIGINT stopped the run");
    close(r.log_fd);
    int st;
    cr_assert_eq(waitpid(r.pid, &st, 0), r.pid);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
    char buf[4096];
    cr_expect_eq(count_prefixed(r.dir, "\\."), 0, "a temporary file was left in %s", r.dir);
    read_file(r.report, buf, sizeof buf);
    cr_expect(strstr(buf, "old report") == NULL && buf[0] != '\0', "report not replaced");
    read_file(r.chart, buf, sizeof buf);
    cr_expect(strstr(buf, "<?xml") != NULL, "chart not replaced: %.60s", buf);
    sh("rm -rf '%s'", r.dir);
}
