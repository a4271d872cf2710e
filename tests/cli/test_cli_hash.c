/*
 * test_cli_hash.c - the hash profiles in the tools (--hash, --hash-key, --vllm-seed,
 * --vocab-size), run on the built kvprefix binary:
 *
 *  - replay's figures do not depend on the profile except through key collisions: the
 *    example log (examples/gen_chatlog output), a token log without model or tenant derived
 *    from it (tenant -> cache_salt, so the vllm-* profiles can express it too), a Mooncake
 *    trace fixture and OpenAI bodies give JSON reports equal field for field under every
 *    profile that can express their namespaces (only the timings and the profile's name
 *    differ), with a pool and evictions, and a sweep;
 *  - a vllm-* profile refuses a log line naming a model or tenant with FILE:LINE, exit 1,
 *    and no report; --vocab-size refuses an id with FILE:LINE in replay and plan, and
 *    --skip-invalid counts such lines;
 *  - the demo reuses the same blocks under every profile.
 *
 * The bad values of every hash flag are in test_cli_flags.c.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cliutil.h"

static char out[1 << 20], err[16384];

static const char *const ALL[] = {"keyed", "xxh3", "siphash", "vllm-sha256-cbor",
                                  "vllm-xxhash-cbor"};
#define N_ALL     5
#define N_NO_VLLM 3 /* the first three express model and tenant */
#define KEY_HEX   "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"

/* Write the example log (600 requests) to a new temporary file; returns its path (static). */
static const char *example_log(void)
{
    static char path[64];
    const char *gen = getenv("GEN_CHATLOG_BIN");
    cr_assert_not_null(gen, "GEN_CHATLOG_BIN is not set");
    snprintf(path, sizeof path, "/tmp/kvp_cli_hash_XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' -o '%s'", gen, path);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    return path;
}

/* Copy the token log at src to a new file with every tenant turned into a cache_salt and
 * every model dropped (what a vLLM deployment would send). Returns its path (static). */
static const char *vllm_shaped(const char *src)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/kvp_cli_hash_vllm_XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *o = fdopen(fd, "w");
    FILE *in = fopen(src, "r");
    cr_assert(o && in);
    char *line = NULL;
    size_t cap = 0;
    size_t n_salted = 0;
    while (getline(&line, &cap, in) > 0) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        cr_assert_not_null(j, "%s", je.text);
        json_t *t = json_object_get(j, "tenant");
        if (t) {
            json_object_set(j, "cache_salt", t);
            json_object_del(j, "tenant");
            n_salted++;
        }
        json_object_del(j, "model");
        char *s = json_dumps(j, JSON_COMPACT);
        fprintf(o, "%s\n", s);
        free(s);
        json_decref(j);
    }
    cr_assert_gt(n_salted, 0, "the example log has no tenants to turn into salts");
    free(line);
    fclose(in);
    cr_assert_eq(fclose(o), 0);
    return path;
}

/* Run replay with args on log; return the JSON report without the timings and the profile's
 * name (the caller owns it). The run must succeed. */
static json_t *figures(const char *args, const char *log)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "--json --no-progress %s '%s'", args, log);
    int rc = cli_run("replay", cmd, err, sizeof err, out, sizeof out);
    cr_assert_eq(rc, 0, "replay %s: exit %d: %s", cmd, rc, err);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert_not_null(j, "replay %s: not JSON (%s): %s", cmd, je.text, out);
    json_t *hash = json_object_get(j, "hash");
    cr_assert(json_is_string(hash), "no \"hash\" field: %s", out);
    json_object_del(j, "seconds");
    json_object_del(j, "seconds_engine");
    json_object_del(j, "hash");
    return j;
}

/* The figures under profiles[0 .. n) (with their key or seed flags) equal the first's. */
static void expect_same_figures(const char *const *profiles, size_t n, const char *args,
                                const char *log)
{
    char a[1024];
    snprintf(a, sizeof a, "--hash %s %s", profiles[0], args);
    json_t *ref = figures(a, log);
    json_t *ceiling = json_object_get(ref, "ceiling");
    json_t *hit = ceiling ? json_object_get(ceiling, "hit_tokens") : NULL;
    cr_assert(json_is_integer(hit) && json_integer_value(hit) > 0,
              "the log reuses nothing: the comparison would be vacuous");
    for (size_t i = 0; i < n; i++) {
        const char *extra = strcmp(profiles[i], "keyed") == 0 || strcmp(profiles[i], "siphash") == 0
                                ? " --hash-key " KEY_HEX
                            : strcmp(profiles[i], "xxh3") == 0     ? " --seed 12345"
                            : strncmp(profiles[i], "vllm", 4) == 0 ? " --vllm-seed 0"
                                                                   : "";
        /* Each profile twice: with its default (random key, seed 0, vllm-none-hash) and with
         * an explicit key or seed. */
        for (int with = 0; with < 2; with++) {
            snprintf(a, sizeof a, "--hash %s%s %s", profiles[i], with ? extra : "", args);
            json_t *j = figures(a, log);
            char *x = json_dumps(ref, JSON_SORT_KEYS), *y = json_dumps(j, JSON_SORT_KEYS);
            cr_expect(json_equal(ref, j), "replay %s on %s differs from --hash %s:\n%s\n%s", a, log,
                      profiles[0], y, x);
            free(x);
            free(y);
            json_decref(j);
        }
    }
    json_decref(ref);
}

Test(cli_hash, example_log_same_figures_under_every_profile)
{
    const char *log = example_log();
    /* A pool small enough to evict, and a sweep from one pass. */
    expect_same_figures(ALL, N_NO_VLLM, "--capacity 300 --sweep=8", log);
    expect_same_figures(ALL, N_NO_VLLM, "--capacity 100000 --block-size 4", log);
    const char *vlog = vllm_shaped(log);
    expect_same_figures(ALL, N_ALL, "--capacity 300 --sweep=8", vlog);
    expect_same_figures(ALL, N_ALL, "--capacity 50 --cache-output --block-size 8", vlog);
    unlink(vlog);
    unlink(log);
}

Test(cli_hash, trace_and_openai_fixtures_same_figures)
{
    /* Mooncake lines carry no namespace: every profile expresses them. */
    expect_same_figures(ALL, N_ALL, "--capacity 2 --trace-block-size 4",
                        cli_data("replay_trace.jsonl"));
    expect_same_figures(ALL, N_NO_VLLM, "--capacity 64 --sweep=4 --block-size 4",
                        cli_data("replay_tenants.jsonl"));
    expect_same_figures(ALL, N_NO_VLLM, "--capacity 8 --block-size 2 --cache-output",
                        cli_data("replay_output.jsonl"));
    expect_same_figures(ALL, N_NO_VLLM, "--capacity 64 --block-size 2",
                        cli_data("replay_openai_ts_last.jsonl"));
}

/* A vllm-* profile on lines with a model or tenant: FILE:LINE, exit 1, no report. */
Test(cli_hash, vllm_refuses_model_and_tenant_lines)
{
    char args[1024];
    const char *log = cli_data("replay_hand.jsonl");
    snprintf(args, sizeof args, "--hash vllm-xxhash-cbor --capacity 8 '%s'", log);
    cr_assert_eq(cli_run("replay", args, err, sizeof err, out, sizeof out), 1, "%s", err);
    char where[1024];
    snprintf(where, sizeof where,
             "%s:1: --hash vllm-xxhash-cbor cannot express a tenant field: vLLM keys have none; "
             "give the tenant as cache_salt",
             log);
    cr_expect_not_null(strstr(err, where), "%s", err);
    cr_expect_eq(out[0], '\0', "a report was written: %s", out);

    log = cli_data("replay_tenants.jsonl");
    snprintf(args, sizeof args, "--hash vllm-sha256-cbor --capacity 8 '%s'", log);
    cr_assert_eq(cli_run("replay", args, err, sizeof err, out, sizeof out), 1, "%s", err);
    snprintf(where, sizeof where, "%s:1: --hash vllm-sha256-cbor cannot express a model field",
             log);
    cr_expect_not_null(strstr(err, where), "%s", err);

    /* --skip-invalid counts them like any bad line: here every line, so no requests. */
    snprintf(args, sizeof args, "--hash vllm-sha256-cbor --skip-invalid --capacity 8 '%s'", log);
    cr_assert_eq(cli_run("replay", args, err, sizeof err, out, sizeof out), 1, "%s", err);
    cr_expect_not_null(strstr(err, "no requests (every line was skipped)"), "%s", err);

    /* plan --trace refuses the same lines. */
    snprintf(args, sizeof args, "--model Llama-3.1-8B --hash vllm-sha256-cbor --trace '%s'", log);
    cr_assert_eq(cli_run("plan", args, err, sizeof err, out, sizeof out), 1, "%s", err);
    cr_expect_not_null(strstr(err, where), "%s", err);
}

Test(cli_hash, vocab_size_refuses_ids_with_file_line)
{
    char args[1024], where[1024];
    const char *log = cli_data("replay_hand.jsonl");
    /* Line 1 is [1, 2, 3, 4, 5]: 5 is the first id not below 5, in the partial block. */
    snprintf(args, sizeof args, "--vocab-size 5 --capacity 8 '%s'", log);
    cr_assert_eq(cli_run("replay", args, err, sizeof err, out, sizeof out), 1, "%s", err);
    snprintf(where, sizeof where, "%s:1: token id 5 (token 4) is not below --vocab-size 5", log);
    cr_expect_not_null(strstr(err, where), "%s", err);
    cr_expect_eq(out[0], '\0', "a report was written: %s", out);

    /* Every id of the fixture is below 10: accepted. */
    snprintf(args, sizeof args, "--vocab-size 10 --capacity 8 '%s'", log);
    cr_assert_eq(cli_run("replay", args, err, sizeof err, out, sizeof out), 0, "%s", err);

    /* --skip-invalid: the refused lines are counted, the others replayed. */
    snprintf(args, sizeof args, "--vocab-size 6 --skip-invalid --json --capacity 8 '%s'", log);
    cr_assert_eq(cli_run("replay", args, err, sizeof err, out, sizeof out), 0, "%s", err);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert_not_null(j, "%s", out);
    json_int_t skipped = json_integer_value(json_object_get(j, "skipped_lines"));
    cr_expect_gt(skipped, 0, "%s", out);
    json_decref(j);

    snprintf(args, sizeof args, "--model Llama-3.1-8B --vocab-size 5 --trace '%s'", log);
    cr_assert_eq(cli_run("plan", args, err, sizeof err, out, sizeof out), 1, "%s", err);
    cr_expect_not_null(strstr(err, where), "%s", err);
}

/* The demo's table (everything after its header line) is the same under every profile. */
Test(cli_hash, demo_same_session_under_every_profile)
{
    static char first[65536];
    for (size_t i = 0; i < N_ALL; i++) {
        char args[256];
        snprintf(args, sizeof args, "--hash %s", ALL[i]);
        cr_assert_eq(cli_run("demo", args, err, sizeof err, out, sizeof out), 0, "%s: %s", args,
                     err);
        char head[256];
        snprintf(head, sizeof head, "--hash %s\n", ALL[i]);
        char *nl = strchr(out, '\n');
        cr_assert_not_null(nl);
        cr_expect_not_null(strstr(out, head), "%s", out);
        if (i == 0)
            snprintf(first, sizeof first, "%s", nl);
        else
            cr_expect_str_eq(nl, first, "demo --hash %s differs from --hash keyed", ALL[i]);
    }
    cr_assert_eq(cli_run("demo", "--vocab-size 50000", err, sizeof err, out, sizeof out), 1);
    cr_expect_not_null(strstr(err, "--vocab-size must be above that"), "%s", err);
    cr_assert_eq(cli_run("demo", "--vocab-size 50150", err, sizeof err, out, sizeof out), 0, "%s",
                 err);
}
