/*
 * test_replay_cli.c - the `kvprefix replay` binary on fixtures of tests/cli/data/replay/: each
 * input format, the report's figures against hand-computed values (the worked example of
 * docs/replay.md), JSON/CSV/SVG output, --sort, --cache-output, --diagnose, byte
 * capacities, compressed and standard input, and every bad input with its exit status and
 * "FILE:LINE: what is wrong" message.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cliutil.h"

static char err[65536], out[1 << 20];

/* Run `kvprefix replay OPTS FILE` with FILE a fixture. */
static int replay(const char *opts, const char *file)
{
    char args[8192];
    snprintf(args, sizeof args, "%s '%s'", opts, cli_data(file));
    return cli_run("replay", args, err, sizeof err, out, sizeof out);
}

/* Parse out as JSON and return the integer at a dotted path of object keys. */
static json_int_t jint(json_t *root, const char *a, const char *b)
{
    json_t *v = json_object_get(root, a);
    if (b)
        v = json_object_get(v, b);
    cr_assert(json_is_integer(v), "%s.%s is not an integer", a, b ? b : "");
    return json_integer_value(v);
}

static json_t *parse_out(void)
{
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert_not_null(j, "not JSON (%s): %s", je.text, out);
    return j;
}

Test(replay_cli, worked_example_json)
{
    cr_assert_eq(replay("--block-size 2 --capacity 3 --json", "replay_hand.jsonl"), 0, "%s", err);
    json_t *j = parse_out();
    cr_assert_eq(jint(j, "capacity", "requests"), 5);
    cr_assert_eq(jint(j, "capacity", "prompt_tokens"), 24);
    cr_assert_eq(jint(j, "capacity", "hit_tokens"), 8);
    cr_assert_eq(jint(j, "capacity", "blocks_cached"), 5);
    cr_assert_eq(jint(j, "capacity", "cold_misses"), 4);
    cr_assert_eq(jint(j, "capacity", "capacity_misses"), 1);
    cr_assert_eq(jint(j, "capacity", "blocks_evicted"), 2);
    cr_assert_eq(jint(j, "ceiling", "hit_tokens"), 10);
    cr_assert_eq(jint(j, "distinct_blocks", NULL), 4);
    cr_assert_eq(jint(j, "lines", NULL), 6); /* the blank line is counted, not replayed */
    json_decref(j);
}

Test(replay_cli, table_shows_the_split_and_the_warning)
{
    cr_assert_eq(replay("--block-size 2 --capacity 2", "replay_hand.jsonl"), 0, "%s", err);
    cr_assert(strstr(out, "token hit rate 25.0%") != NULL, "%s", out); /* 6 / 24 */
    cr_assert(strstr(out, "2 capacity (seen before, evicted since)") != NULL, "%s", out);
    cr_assert(strstr(out, "4 cold") != NULL, "%s", out);
    cr_assert(strstr(out, "cold-miss ceiling        token hit rate 41.7%") != NULL, "%s", out);
    cr_assert(strstr(out, "not first-access rates") != NULL);
}

Test(replay_cli, sweep_csv_and_plot)
{
    char svg[] = "/tmp/kvp_plot_XXXXXX";
    int fd = mkstemp(svg);
    cr_assert(fd >= 0);
    char fmt[256];
    snprintf(fmt, sizeof fmt, "--block-size 2 --capacities 1,2,3,4 --csv --plot %s", svg);
    cr_assert_eq(replay(fmt, "replay_hand.jsonl"), 0, "%s", err);
    /* Header, the ceiling row, 4 sweep rows, one tenant row. */
    size_t lines = 0;
    for (const char *p = out; *p; p++)
        lines += *p == '\n';
    cr_assert_eq(lines, 1 + 1 + 4 + 1, "%s", out);
    cr_assert(strstr(out, "all,sweep,3,6,,5,24,8,") != NULL, "%s", out);
    cr_assert(strstr(out, "all,sweep,2,4,,5,24,6,") != NULL, "%s", out);
    cr_assert(strstr(out, "tenant,\"t\",") != NULL, "%s", out);
    close(fd);
    /* Reopened by name: the chart was written beside it and renamed over it. */
    FILE *f = fopen(svg, "r");
    cr_assert(f != NULL);
    char head[256] = {0};
    cr_assert(fread(head, 1, sizeof head - 1, f) > 0);
    fclose(f);
    remove(svg);
    cr_assert(strstr(head, "<svg") != NULL, "%s", head);
}

Test(replay_cli, sweep_matches_single_runs)
{
    static const char *const fields[] = {"hit_tokens",    "blocks_cached",   "blocks_hit",
                                         "cold_misses",   "capacity_misses", "blocks_stored",
                                         "blocks_evicted"};
    json_int_t single[6][7];
    for (int c = 1; c <= 5; c++) {
        char opts[64];
        snprintf(opts, sizeof opts, "--block-size 2 --capacity %d --json", c);
        cr_assert_eq(replay(opts, "replay_hand.jsonl"), 0, "%s", err);
        json_t *j = parse_out();
        for (int k = 0; k < 7; k++)
            single[c][k] = jint(j, "capacity", fields[k]);
        json_decref(j);
    }
    cr_assert_eq(replay("--block-size 2 --capacities 5,1,3,2,4 --json", "replay_hand.jsonl"), 0);
    json_t *j = parse_out();
    json_t *sweep = json_object_get(j, "sweep");
    cr_assert_eq(json_array_size(sweep), 5);
    for (int c = 1; c <= 5; c++) {
        json_t *pt = json_array_get(sweep, (size_t)c - 1); /* sorted by capacity */
        cr_assert_eq(json_integer_value(json_object_get(pt, "capacity_blocks")), c);
        for (int k = 0; k < 7; k++)
            cr_assert_eq(json_integer_value(json_object_get(pt, fields[k])), single[c][k],
                         "capacity %d %s", c, fields[k]);
    }
    json_decref(j);
}

Test(replay_cli, trace_by_hand)
{
    cr_assert_eq(replay("--trace-block-size 4 --capacity 16 --json", "replay_trace.jsonl"), 0, "%s",
                 err);
    json_t *j = parse_out();
    cr_assert_eq(jint(j, "capacity", "prompt_tokens"), 27);
    cr_assert_eq(jint(j, "capacity", "hit_tokens"), 12);
    cr_assert_eq(jint(j, "capacity", "blocks_full"), 6);
    cr_assert_eq(jint(j, "capacity", "blocks_cached"), 4);
    cr_assert_str_eq(json_string_value(json_object_get(j, "format")), "Mooncake hash-id trace");
    json_decref(j);
}

Test(replay_cli, breakdown_by_model_adapter_tenant)
{
    cr_assert_eq(replay("--block-size 4 --capacity 100 --json", "replay_tenants.jsonl"), 0, "%s",
                 err);
    json_t *j = parse_out();
    /* Only request 2 shares (its first 2 blocks with request 1): every other request is in
     * a namespace of its own. */
    cr_assert_eq(jint(j, "capacity", "hit_tokens"), 8);
    json_t *tenants = json_object_get(json_object_get(j, "breakdown"), "tenant");
    cr_assert_eq(json_array_size(tenants), 2);
    json_t *acme = json_array_get(tenants, 0);
    cr_assert_str_eq(json_string_value(json_object_get(acme, "name")), "acme");
    cr_assert_eq(json_integer_value(json_object_get(acme, "requests")), 5);
    cr_assert_eq(json_integer_value(json_object_get(acme, "hit_tokens")), 8);
    json_t *adapters = json_object_get(json_object_get(j, "breakdown"), "adapter");
    cr_assert_eq(json_array_size(adapters), 2);
    cr_assert(json_is_null(json_object_get(json_array_get(adapters, 0), "name")));
    json_decref(j);
}

Test(replay_cli, sort_by_timestamp)
{
    cr_assert_eq(replay("--block-size 2 --capacity 2 --json", "replay_sort.jsonl"), 0);
    json_t *j = parse_out();
    cr_assert_eq(jint(j, "capacity", "hit_tokens"), 0);
    json_decref(j);
    cr_assert_eq(replay("--block-size 2 --capacity 2 --sort --json", "replay_sort.jsonl"), 0);
    j = parse_out();
    cr_assert_eq(jint(j, "capacity", "hit_tokens"), 4);
    json_decref(j);
    cr_assert_eq(replay("--block-size 2 --capacity 2 --sort", "replay_hand.jsonl"), 1);
    cr_assert(strstr(err, "replay_hand.jsonl:1: --sort needs a timestamp") != NULL, "%s", err);
}

Test(replay_cli, cache_output)
{
    cr_assert_eq(replay("--block-size 2 --capacity 64 --json", "replay_output.jsonl"), 0);
    json_t *j = parse_out();
    cr_assert_eq(jint(j, "capacity", "hit_tokens"), 4);
    json_decref(j);
    cr_assert_eq(
        replay("--block-size 2 --capacity 64 --cache-output --json", "replay_output.jsonl"), 0);
    j = parse_out();
    cr_assert_eq(jint(j, "capacity", "hit_tokens"), 8); /* blocks up to token 8 */
    json_decref(j);
}

Test(replay_cli, openai_relative_comparison_and_diagnose)
{
    cr_assert_eq(replay("--capacity 1000 --diagnose", "replay_openai_ts_first.jsonl"), 0, "%s",
                 err);
    cr_assert(strstr(out, "APPROXIMATE") != NULL, "%s", out);
    cr_assert(strstr(out, "divergence points") != NULL, "%s", out);
    cr_assert(strstr(out, "Current time") != NULL, "%s", out);
    cr_assert_eq(replay("--capacity 1000 --json", "replay_openai_ts_first.jsonl"), 0);
    json_t *j = parse_out();
    json_int_t first = jint(j, "capacity", "hit_tokens");
    cr_assert(json_is_true(json_object_get(j, "approximate_tokens")));
    json_decref(j);
    cr_assert_eq(replay("--capacity 1000 --json --diagnose", "replay_openai_ts_last.jsonl"), 0);
    j = parse_out();
    json_int_t last = jint(j, "capacity", "hit_tokens");
    json_t *pts = json_object_get(json_object_get(j, "diagnose"), "break_points");
    cr_assert(json_is_array(pts) && json_array_size(pts) > 0);
    for (size_t i = 0; i < json_array_size(pts); i++)
        cr_assert_eq(json_integer_value(json_object_get(json_array_get(pts, i), "resynced")), 0);
    json_decref(j);
    cr_assert_eq(first, 0, "a timestamp first shares nothing past the first block");
    cr_assert_gt(last, 0);
}

Test(replay_cli, byte_capacity_needs_a_model)
{
    cr_assert_eq(replay("--capacity 1GiB", "replay_hand.jsonl"), 2);
    cr_assert(strstr(err, "needs --model") != NULL, "%s", err);
    cr_assert_eq(replay("--capacity 1GiB --model Llama-3.1-8B --json", "replay_hand.jsonl"), 0,
                 "%s", err);
    json_t *j = parse_out();
    /* Llama-3.1-8B: 2 x 32 x 8 x 128 x 2 B = 128 KiB per token, 2 MiB per 16-token block. */
    cr_assert_eq(jint(j, "block_bytes", NULL), 2097152);
    cr_assert_eq(jint(j, "capacity", "capacity_blocks"), 512);
    json_decref(j);
    /* The planner's per-layer bytes (kvplan.h, cap_cache_block_bytes): DeepSeek-V3's latent
     * is 61 x 576 x 2 = 70272 bytes per token, 1124352 per block: 954 blocks in 1 GiB;
     * Gemma-3-27B's 10 full layers 81920 per token (its 52 sliding layers hold a window per
     * prefix end, not per block): 1310720 per block, 819 blocks. */
    static const struct {
        const char *model;
        json_int_t block_bytes, blocks;
    } per_layer[] = {{"DeepSeek-V3", 1124352, 954}, {"Gemma-3-27B", 1310720, 819}};
    for (size_t i = 0; i < 2; i++) {
        char args[128];
        snprintf(args, sizeof args, "--capacity 1GiB --model %s --json", per_layer[i].model);
        cr_assert_eq(replay(args, "replay_hand.jsonl"), 0, "%s", err);
        j = parse_out();
        cr_assert_eq(jint(j, "block_bytes", NULL), per_layer[i].block_bytes);
        cr_assert_eq(jint(j, "capacity", "capacity_blocks"), per_layer[i].blocks);
        cr_assert_gt(per_layer[i].blocks, 512, "more blocks than a GQA model in the same memory");
        json_decref(j);
    }
}

Test(replay_cli, gzip_and_stdin)
{
    char gz[] = "/tmp/kvp_gz_XXXXXX";
    int fd = mkstemp(gz);
    cr_assert(fd >= 0);
    close(fd);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "gzip -c '%s' > '%s'", cli_data("replay_hand.jsonl"), gz);
    cr_assert_eq(system(cmd), 0);
    char args[8192];
    snprintf(args, sizeof args, "--block-size 2 --capacity 3 --json '%s'", gz);
    cr_assert_eq(cli_run("replay", args, err, sizeof err, out, sizeof out), 0, "%s", err);
    json_t *j = parse_out();
    cr_assert_eq(jint(j, "capacity", "hit_tokens"), 8);
    json_decref(j);
    /* Standard input, still gzip: cli_run's own "</dev/null" comes after ours in the
     * command, so pipe through cat instead. */
    snprintf(cmd, sizeof cmd, "cat '%s' | '%s' replay --block-size 2 --capacity 3 --json -", gz,
             getenv("KVPREFIX_BIN"));
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    cr_assert_eq(pclose(p), 0);
    j = parse_out();
    cr_assert_eq(jint(j, "capacity", "hit_tokens"), 8);
    cr_assert_str_eq(json_string_value(json_object_get(j, "input")), "<stdin>");
    json_decref(j);
    remove(gz);
}

static void expect(const char *opts, const char *file, int code, const char *msg)
{
    int rc = replay(opts, file);
    cr_assert_eq(rc, code, "%s on %s: exit %d, stderr %s", opts, file, rc, err);
    cr_assert(strstr(err, msg) != NULL, "%s on %s: stderr lacks '%s': %s", opts, file, msg, err);
}

Test(replay_cli, bad_input)
{
    expect("--capacity 8", "replay_bad_truncated.jsonl", 1, "replay_bad_truncated.jsonl:2:");
    expect("--capacity 8", "replay_bad_huge.jsonl", 1, "replay_bad_huge.jsonl:2:");
    expect("--capacity 8", "replay_bad_negative.jsonl", 1, "replay_bad_negative.jsonl:1:");
    expect("--capacity 8", "replay_bad_utf8.jsonl", 1, "replay_bad_utf8.jsonl:1:");
    expect("--capacity 8", "replay_empty.jsonl", 1, "no requests");
    expect("--trace-block-size 4 --capacity 8", "replay_bad_moved.jsonl", 1,
           "replay_bad_moved.jsonl:2: hash id 2 at block 1 follows a different prefix than on "
           "line 1");
    expect("--capacity 8", "replay_bad_mixed.jsonl", 1,
           "replay_bad_mixed.jsonl:2: a Mooncake line in a token log");
    expect("--capacity 8", "no_such_file.jsonl", 1, "no_such_file.jsonl");
    /* Options are checked before anything is read: a bad one on an empty log is a usage
     * error, not "no requests". */
    expect("--capacity abc", "replay_empty.jsonl", 2, "'abc' is not a positive capacity");
    /* Every line skipped: no requests, not an empty report. */
    expect("--block-size 2 --capacity 3 --sort --skip-invalid", "replay_hand.jsonl", 1,
           "no requests (every line was skipped)");
}

Test(replay_cli, skip_invalid_counts_lines)
{
    cr_assert_eq(
        replay("--block-size 2 --capacity 8 --skip-invalid --json", "replay_bad_truncated.jsonl"),
        0, "%s", err);
    json_t *j = parse_out();
    cr_assert_eq(jint(j, "skipped_lines", NULL), 1);
    cr_assert_eq(jint(j, "capacity", "requests"), 2);
    cr_assert(strstr(json_string_value(json_object_get(j, "first_skipped")),
                     "replay_bad_truncated.jsonl:2:") != NULL);
    json_decref(j);
    cr_assert_eq(
        replay("--trace-block-size 4 --capacity 8 --skip-invalid --json", "replay_bad_moved.jsonl"),
        0, "%s", err);
    j = parse_out();
    cr_assert_eq(jint(j, "skipped_lines", NULL), 1);
    json_decref(j);
}

Test(replay_cli, usage_errors)
{
    expect("", "replay_hand.jsonl", 2, "give --capacity");
    expect("--capacity 0", "replay_hand.jsonl", 2, "not a positive capacity");
    expect("--capacity 8 --bogus", "replay_hand.jsonl", 2, "unknown option '--bogus'");
    expect("--capacity 8 --json --csv", "replay_hand.jsonl", 2, "exclude each other");
    expect("--capacity 8 --plot x.svg", "replay_hand.jsonl", 2, "--plot draws a sweep");
    expect("--capacity 8 --format xml", "replay_hand.jsonl", 2, "--format");
    expect("--capacity 8 --block-size 0", "replay_hand.jsonl", 2, "--block-size");
    expect("--capacity 1tok", "replay_hand.jsonl", 1, "less than one block");
    expect("--capacity 0tok", "replay_hand.jsonl", 2, "'0tok' is not a positive capacity");
    expect("--capacities 1,,2", "replay_hand.jsonl", 2,
           "--capacities: '1,,2' is not a comma-separated list");
    expect("--capacities=", "replay_hand.jsonl", 2,
           "--capacities: '' is not a comma-separated list");
    expect("--capacity 8 --kv-dtype fp8", "replay_hand.jsonl", 2, "--kv-dtype needs --model");
    expect("--capacities 1,2GiB", "replay_hand.jsonl", 2, "needs --model or --config");
    expect("--capacities 300T", "replay_hand.jsonl", 1, "is too large");
    expect("--capacity 8 --sweep --plot /nonexistent/dir/x.svg", "replay_hand.jsonl", 1,
           "/nonexistent/dir/x.svg: cannot create");
    cr_assert_eq(cli_run("replay", "--help", err, sizeof err, out, sizeof out), 0);
    cr_assert(strstr(out, "Examples:") != NULL);
}

Test(replay_cli, progress_bar_when_asked)
{
    cr_assert_eq(replay("--block-size 2 --capacity 3 --progress", "replay_hand.jsonl"), 0);
    cr_assert(strstr(err, "requests") != NULL, "no progress on stderr: %s", err);
    cr_assert_eq(replay("--block-size 2 --capacity 3", "replay_hand.jsonl"), 0);
    cr_assert_eq(err[0], '\0', "stderr is not a terminal, yet: %s", err);
}

/* A 100 MB line (a long string in an unknown field, then tokens) is refused by default and
 * read with --max-line-bytes 128MiB. */
Test(replay_cli, hundred_megabyte_line, .timeout = 120)
{
    char path[] = "/tmp/kvp_big_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("{\"note\": \"", f);
    static char chunk[1 << 20];
    memset(chunk, 'a', sizeof chunk);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(fwrite(chunk, 1, sizeof chunk, f), sizeof chunk);
    fputs("\", \"tokens\": [1, 2, 3, 4, 5]}\n{\"tokens\": [1, 2, 3, 4, 6]}\n", f);
    cr_assert_eq(fclose(f), 0);
    char args[8192];
    /* Over the default limit of 64 MiB: refused with the limit and the flag named. */
    snprintf(args, sizeof args, "--block-size 2 --capacity 8 --json '%s'", path);
    int rc = cli_run("replay", args, err, sizeof err, out, sizeof out);
    cr_assert_eq(rc, 1, "%s", err);
    cr_assert(strstr(err, ":1: line longer than 67108864 bytes (--max-line-bytes)") != NULL, "%s",
              err);
    snprintf(args, sizeof args, "--block-size 2 --capacity 8 --max-line-bytes 128MiB --json '%s'",
             path);
    rc = cli_run("replay", args, err, sizeof err, out, sizeof out);
    remove(path);
    cr_assert_eq(rc, 0, "%s", err);
    json_t *j = parse_out();
    cr_assert_eq(jint(j, "capacity", "requests"), 2);
    cr_assert_eq(jint(j, "capacity", "hit_tokens"), 4);
    json_decref(j);
}
