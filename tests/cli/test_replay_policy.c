/*
 * test_replay_policy.c - `kvprefix replay --policy` (src/cli/cmd/replay/replay_pol.c and the
 * report): the library's policies replayed on the recorded touches, against the engine and
 * the optimum, and the binary on the example log (GEN_CHATLOG_BIN) and a fixture.
 *
 *   - replay_pol's LRU (the library's pool driven by dense block numbers) equals the engine's
 *     LRU figures at every capacity of random logs, cached output included, and the optimum
 *     is never below any policy there;
 *   - `--policy lru` prints exactly what no flag prints (table, JSON and CSV; the timings
 *     aside);
 *   - on the example log, opt >= lru, slru and s3fifo at every point of a sweep and at
 *     --capacity, each policy's figures in a combined run equal its run alone, lru's equal
 *     the top-level figures, and the chart has one curve per policy; on a hash-id trace too;
 *   - an unknown, repeated or empty policy name exits 2 with the flag's message.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cliutil.h"
#include "kvprefix.h"
#include "replay_opt.h"
#include "replay_pol.h"
#include "replay_sim.h"

/* Sanitizer builds run a quarter of the random logs below (the same property, within the
 * ASan step's time in scripts/test.sh, where this file took a minute); gcc runs them all. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifdef SANITIZED
#define RANDOM_LOGS(n) ((n) / 4)
#else
#define RANDOM_LOGS(n) (n)
#endif

static char err[65536], out[1 << 20], out2[1 << 20];

/* ---- the engine: random logs ------------------------------------------------------------- */

static uint64_t rng = 0x2545f4914f6cdd1du;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* Replay a random token log (prompts continuing earlier ones over a tiny alphabet, some
 * with cached output) into a fresh engine and touch log. */
static void random_log(rp_sim **sp, rp_opt **op, uint32_t *bs_out)
{
    uint32_t bs = 1 + rnd(3);
    rp_sim_config c = {bs, 0, 0, NULL};
    rp_sim *s = rp_sim_new(&c, err, sizeof err);
    cr_assert_not_null(s, "%s", err);
    rp_opt *o = rp_opt_new(bs);
    cr_assert_not_null(o);
    uint32_t tok[40][48];
    size_t n_tok[40];
    size_t n_req = 5 + rnd(35);
    for (size_t r = 0; r < n_req; r++) {
        size_t n = 1 + rnd(30), keep = 0, n_out = rnd(3) == 0 ? rnd(9) : 0;
        if (r > 0 && rnd(4) != 0) {
            size_t from = rnd((uint32_t)r);
            keep = rnd((uint32_t)n_tok[from] + 1);
            keep = keep < n ? keep : n;
            memcpy(tok[r], tok[from], keep * sizeof tok[r][0]);
        }
        for (size_t i = keep; i < n + n_out; i++)
            tok[r][i] = 1 + rnd(3);
        n_tok[r] = n;
        rp_request q;
        memset(&q, 0, sizeof q);
        kvp_namespace_init(&q.ns);
        q.tokens = tok[r];
        q.n_tokens = n;
        q.n_output_tokens = n_out;
        q.line_no = r + 1;
        cr_assert_eq(rp_sim_add(s, &q, err, sizeof err), RP_OK, "%s", err);
        const size_t *blocks;
        size_t k = rp_sim_last_blocks(s, &blocks);
        cr_assert_eq(rp_opt_add(o, n, (uint32_t)(n / bs), blocks, k), 0);
    }
    *sp = s;
    *op = o;
    *bs_out = bs;
}

Test(replay_policy, pool_lru_equals_the_engine_and_opt_bounds_every_policy, .timeout = 120)
{
    int n_pairs = 0, n_differ = 0;
    for (int iter = 0; iter < RANDOM_LOGS(120); iter++) {
        rp_sim *s;
        rp_opt *o;
        uint32_t bs;
        random_log(&s, &o, &bs);
        size_t n_blocks = rp_opt_n_blocks(o);
        for (uint64_t cap = 1; cap <= n_blocks + 2; cap++) {
            rp_metrics m;
            rp_pol_figs f[RP_N_POLICIES];
            cr_assert_eq(rp_sim_eval(s, cap, &m, NULL), RP_OK);
            for (int p = 0; p < RP_N_POLICIES; p++)
                cr_assert_eq(rp_pol_eval(o, bs, p, cap, &f[p], err, sizeof err), 0, "%s", err);
            cr_assert_eq(f[RP_POL_LRU].n_hit_tokens, m.n_hit_tokens, "iter %d cap %llu", iter,
                         (unsigned long long)cap);
            cr_assert_eq(f[RP_POL_LRU].n_blocks_cached, m.n_blocks_cached, "iter %d", iter);
            cr_assert_eq(f[RP_POL_LRU].n_blocks_hit, m.n_blocks_hit, "iter %d", iter);
            cr_assert_eq(f[RP_POL_LRU].n_evicted, m.n_evicted, "iter %d", iter);
            for (int p = 0; p < RP_POL_OPT; p++)
                cr_assert_geq(f[RP_POL_OPT].n_hit_tokens, f[p].n_hit_tokens, "iter %d cap %llu %s",
                              iter, (unsigned long long)cap, rp_pol_name(p));
            n_differ += f[RP_POL_SLRU].n_hit_tokens != m.n_hit_tokens ||
                        f[RP_POL_S3FIFO].n_hit_tokens != m.n_hit_tokens;
            n_pairs++;
        }
        rp_opt_free(o);
        rp_sim_free(s);
    }
    cr_log_info("%d (log, capacity) pairs; SLRU or S3-FIFO differ from LRU on %d", n_pairs,
                n_differ);
    cr_assert_gt(n_differ, 0); /* the policies really were switched */
}

/* ---- the binary ------------------------------------------------------------------------ */

/* Write the example log (600 requests) once; returns its path. */
static const char *example_log(void)
{
    static char path[64];
    if (path[0])
        return path;
    const char *gen = getenv("GEN_CHATLOG_BIN");
    cr_assert_not_null(gen, "GEN_CHATLOG_BIN is not set");
    snprintf(path, sizeof path, "/tmp/kvp_policy_XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' -o '%s'", gen, path);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    return path;
}

/* Run `kvprefix replay OPTS FILE` into buf. */
static int replay_into(const char *opts, const char *file, char *buf, size_t size)
{
    char args[8192];
    snprintf(args, sizeof args, "%s '%s'", opts, file);
    return cli_run("replay", args, err, sizeof err, buf, size);
}

/* Remove the lines holding needle (the timings) from s, in place. */
static void drop_lines(char *s, const char *needle)
{
    char *w = s;
    for (char *r = s; *r;) {
        char *nl = strchr(r, '\n');
        size_t len = nl ? (size_t)(nl - r) + 1 : strlen(r);
        char save = r[len];
        r[len] = '\0';
        bool drop = strstr(r, needle) != NULL;
        r[len] = save;
        if (!drop) {
            memmove(w, r, len);
            w += len;
        }
        r += len;
    }
    *w = '\0';
}

static json_t *parse(const char *s)
{
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    cr_assert_not_null(j, "not JSON (%s): %.400s", je.text, s);
    return j;
}

static json_int_t jget(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    cr_assert(json_is_integer(v), "%s is not an integer", key);
    return json_integer_value(v);
}

Test(replay_policy, lru_alone_changes_nothing, .timeout = 120)
{
    const char *log = example_log();
    static const char *const modes[] = {"", "--json", "--csv"};
    for (int i = 0; i < 3; i++) {
        char a[256], b[256];
        snprintf(a, sizeof a, "--capacity 400 --sweep=8 %s", modes[i]);
        snprintf(b, sizeof b, "--policy lru --capacity 400 --sweep=8 %s", modes[i]);
        cr_assert_eq(replay_into(a, log, out, sizeof out), 0, "%s", err);
        cr_assert_eq(replay_into(b, log, out2, sizeof out2), 0, "%s", err);
        drop_lines(out, "seconds");
        drop_lines(out2, "seconds");
        drop_lines(out, "  time  ");
        drop_lines(out2, "  time  ");
        cr_assert_str_eq(out, out2, "mode '%s'", modes[i]);
        cr_assert(strstr(out2, "Eviction policies") == NULL &&
                      strstr(out2, "\"policies\"") == NULL && strstr(out2, "policy:") == NULL,
                  "%s", out2);
    }
}

/* The figures of policy name in the "policies" array of j. */
static json_t *policy_of(json_t *j, const char *name)
{
    json_t *arr = json_object_get(j, "policies");
    cr_assert(json_is_array(arr));
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *p = json_array_get(arr, i);
        if (strcmp(json_string_value(json_object_get(p, "policy")), name) == 0)
            return p;
    }
    cr_assert_fail("no policy %s", name);
    return NULL;
}

static const char *const NAMES[] = {"lru", "slru", "s3fifo", "opt"};

Test(replay_policy, opt_bounds_every_policy_and_figures_match_single_runs, .timeout = 300)
{
    const char *log = example_log();
    cr_assert_eq(replay_into("--policy lru,slru,s3fifo,opt --capacity 400 --sweep=12 --json", log,
                             out, sizeof out),
                 0, "%s", err);
    json_t *all = parse(out);
    json_t *cap = json_object_get(all, "capacity");
    json_t *opt = policy_of(all, "opt");
    json_t *opt_sweep = json_object_get(opt, "sweep");
    cr_assert_eq(json_array_size(opt_sweep), json_array_size(json_object_get(all, "sweep")));
    for (int k = 0; k < 4; k++) {
        json_t *p = policy_of(all, NAMES[k]);
        json_t *sw = json_object_get(p, "sweep");
        cr_assert_geq(jget(json_object_get(opt, "capacity"), "hit_tokens"),
                      jget(json_object_get(p, "capacity"), "hit_tokens"), "%s", NAMES[k]);
        for (size_t i = 0; i < json_array_size(sw); i++)
            cr_assert_geq(jget(json_array_get(opt_sweep, i), "hit_tokens"),
                          jget(json_array_get(sw, i), "hit_tokens"), "%s point %zu", NAMES[k], i);
        /* The same policy alone gives the same figures (lru alone is today's report, whose
         * figures are checked against lru's object below). */
        if (k == 0)
            continue;
        char opts[128];
        snprintf(opts, sizeof opts, "--policy %s --capacity 400 --sweep=12 --json", NAMES[k]);
        cr_assert_eq(replay_into(opts, log, out2, sizeof out2), 0, "%s", err);
        json_t *one = parse(out2);
        json_t *q = policy_of(one, NAMES[k]);
        cr_assert(json_equal(q, p), "%s differs alone", NAMES[k]);
        json_decref(one);
    }
    /* lru's object is the top-level figures. */
    json_t *lru = json_object_get(policy_of(all, "lru"), "capacity");
    static const char *const same[] = {"hit_tokens",  "blocks_cached",   "blocks_hit",
                                       "cold_misses", "capacity_misses", "blocks_evicted"};
    for (int i = 0; i < 6; i++)
        cr_assert_eq(jget(lru, same[i]), jget(cap, same[i]), "%s", same[i]);
    double share = json_real_value(json_object_get(all, "lru_share_of_optimum"));
    cr_assert_float_eq(share,
                       (double)jget(cap, "hit_tokens") /
                           (double)jget(json_object_get(opt, "capacity"), "hit_tokens"),
                       1e-5); /* printed with 6 digits */
    cr_assert(share > 0.5 && share < 1.0, "%f", share);
    json_decref(all);
}

Test(replay_policy, table_and_csv, .timeout = 120)
{
    const char *log = example_log();
    cr_assert_eq(replay_into("--policy slru,opt --capacity 400", log, out, sizeof out), 0, "%s",
                 err);
    cr_assert(strstr(out, "Eviction policies at this capacity") != NULL, "%s", out);
    cr_assert(strstr(out, "\n  slru ") != NULL && strstr(out, "\n  opt ") != NULL, "%s", out);
    cr_assert(strstr(out, "\n  lru ") == NULL, "%s", out);
    cr_assert(strstr(out, "LRU reaches ") != NULL, "%s", out);
    cr_assert(strstr(out, "of the optimum's hits at this size") != NULL, "%s", out);
    cr_assert(strstr(out, "cold-miss ceiling 71.0% for every policy") != NULL, "%s", out);
    cr_assert_eq(replay_into("--policy s3fifo --capacity 400", log, out, sizeof out), 0, "%s", err);
    cr_assert(strstr(out, "LRU reaches") == NULL, "%s", out); /* only with opt */
    cr_assert_eq(replay_into("--policy lru,opt --capacities 100,400 --csv", log, out, sizeof out),
                 0, "%s", err);
    size_t n_rows = 0;
    for (const char *p = out; (p = strstr(p, "\npolicy:sweep,")) != NULL; p++)
        n_rows++;
    cr_assert_eq(n_rows, 4, "%s", out); /* 2 policies x 2 points */
    cr_assert(strstr(out, "\npolicy:sweep,opt,400,6400,") != NULL, "%s", out);
}

Test(replay_policy, plot_has_one_curve_per_policy, .timeout = 300)
{
    const char *log = example_log();
    char svg[] = "/tmp/kvp_policy_plot_XXXXXX";
    int fd = mkstemp(svg);
    cr_assert(fd >= 0);
    close(fd);
    char opts[256];
    snprintf(opts, sizeof opts, "--policy lru,slru,s3fifo,opt --sweep=6 --plot %s", svg);
    cr_assert_eq(replay_into(opts, log, out, sizeof out), 0, "%s", err);
    FILE *f = fopen(svg, "r");
    cr_assert_not_null(f);
    size_t n = fread(out2, 1, sizeof out2 - 1, f);
    out2[n] = '\0';
    fclose(f);
    unlink(svg);
    size_t n_lines = 0;
    for (const char *p = out2; (p = strstr(p, "<polyline")) != NULL; p++)
        n_lines++;
    cr_assert_eq(n_lines, 4, "one curve per policy"); /* lru, slru, s3fifo and the optimum */
    cr_assert(strstr(out2, "opt (offline optimum)") != NULL);
    cr_assert(strstr(out2, "s3fifo") != NULL && strstr(out2, "slru") != NULL);
    cr_assert(strstr(out2, "id=\"ceiling\"") != NULL); /* and the cold-miss ceiling */
}

Test(replay_policy, bad_names_exit_2)
{
    const char *log = example_log();
    cr_assert_eq(replay_into("--policy lru,fifo --capacity 400", log, out, sizeof out), 2);
    cr_assert(strstr(err, "--policy: 'fifo' is not one of lru, slru, s3fifo, cdecay, opt") != NULL,
              "%s", err);
    cr_assert_eq(replay_into("--policy opt,opt --capacity 400", log, out, sizeof out), 2);
    cr_assert(strstr(err, "'opt' is given twice") != NULL, "%s", err);
    cr_assert_eq(replay_into("--policy lru, --capacity 400", log, out, sizeof out), 2);
    cr_assert(strstr(err, "--policy: 'lru,' is not a comma-separated list") != NULL, "%s", err);
    cr_assert_eq(replay_into("--policy LRU --capacity 400", log, out, sizeof out), 2);
    cr_assert_str_eq(out, "");
}

/* A hash-id trace goes through kvp_access_ids with the trace's own ids replaced by dense
 * numbers: lru's object equals the engine's figures and opt bounds the others. */
Test(replay_policy, hash_id_trace)
{
    cr_assert_eq(replay_into("--trace-block-size 4 --policy lru,slru,s3fifo,opt --capacities "
                             "1,2,3 --json",
                             cli_data("replay_trace.jsonl"), out, sizeof out),
                 0, "%s", err);
    json_t *all = parse(out);
    json_t *sweep = json_object_get(all, "sweep");
    json_t *lru = json_object_get(policy_of(all, "lru"), "sweep");
    json_t *opt = json_object_get(policy_of(all, "opt"), "sweep");
    cr_assert_eq(json_array_size(sweep), 3);
    for (size_t i = 0; i < 3; i++) {
        cr_assert_eq(jget(json_array_get(lru, i), "hit_tokens"),
                     jget(json_array_get(sweep, i), "hit_tokens"));
        for (int k = 1; k < 3; k++)
            cr_assert_geq(
                jget(json_array_get(opt, i), "hit_tokens"),
                jget(json_array_get(json_object_get(policy_of(all, NAMES[k]), "sweep"), i),
                     "hit_tokens"));
    }
    json_decref(all);
}

/* ---- retention priorities (docs/replay.md) ------------------------------------------------ */

/* Write a token log: every 10th of 200 requests is a 256-token system prompt (tokens 1..256)
 * and a 64-token question of its own, the others 256 tokens of their own (a scan); with
 * sys_retention, the system-prompt lines carry "retention" for tokens [0, 256) at 90;
 * with all_ranges, every line carries {"ranges": [[0, min(len, 192), 70]]}. */
static void retention_log(char *path, size_t size, bool sys_retention, bool all_ranges)
{
    snprintf(path, size, "/tmp/kvp_retention_XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    cr_assert_not_null(f);
    for (uint32_t i = 0; i < 200; i++) {
        bool sys = i % 10 == 0;
        uint32_t n = sys ? 320 : 256;
        fputs("{\"tokens\": [", f);
        for (uint32_t j = 0; j < n; j++) {
            uint32_t t = sys ? (j < 256 ? j + 1 : 10000 + i * 100 + j) : 50000 + i * 300 + j;
            fprintf(f, "%s%u", j ? ", " : "", t);
        }
        fputs("]", f);
        if (sys && sys_retention)
            fputs(", \"retention\": {\"priority\": 35, \"ranges\": [[0, 256, 90]]}", f);
        else if (all_ranges)
            fprintf(f, ", \"retention\": {\"ranges\": [[0, %u, 70]]}", n < 192 ? n : 192);
        fputs("}\n", f);
    }
    cr_assert_eq(fclose(f), 0);
}

/* 60 blocks of 16 tokens: LRU loses the 16-block system prompt to the nine scans between its
 * uses (9 x 16 blocks > 60), so it never hits; with priority 90 the prompt stays, and each
 * of the 19 later system-prompt requests skips its 256 tokens. */
Test(replay_policy, retention_keeps_the_system_prompt, .timeout = 120)
{
    char log[64];
    retention_log(log, sizeof log, true, false);
    cr_assert_eq(replay_into("--block-size 16 --policy lru,retain,slru,s3fifo,opt --capacity 60 "
                             "--json",
                             log, out, sizeof out),
                 0, "%s", err);
    json_t *all = parse(out);
    json_int_t lru = jget(json_object_get(policy_of(all, "lru"), "capacity"), "hit_tokens");
    json_int_t ret = jget(json_object_get(policy_of(all, "retain"), "capacity"), "hit_tokens");
    json_int_t opt = jget(json_object_get(policy_of(all, "opt"), "capacity"), "hit_tokens");
    cr_assert_eq(lru, 0);
    cr_assert_eq(ret, 19 * 256);
    cr_assert_geq(opt, ret);
    for (int k = 1; k < 3; k++) /* slru and s3fifo apply the lines' retention too */
        cr_assert_eq(jget(json_object_get(policy_of(all, NAMES[k]), "capacity"), "hit_tokens"), ret,
                     "%s", NAMES[k]);
    json_decref(all);
    /* Without the lines' retention, retain is LRU. */
    char plain[64];
    retention_log(plain, sizeof plain, false, false);
    cr_assert_eq(replay_into("--block-size 16 --policy lru,retain --capacity 60 --json", plain, out,
                             sizeof out),
                 0, "%s", err);
    all = parse(out);
    cr_assert_eq(jget(json_object_get(policy_of(all, "retain"), "capacity"), "hit_tokens"),
                 jget(json_object_get(policy_of(all, "lru"), "capacity"), "hit_tokens"));
    json_decref(all);
    unlink(log);
    unlink(plain);
}

/* --retain-prefix T:P is the same as a range [0, min(T, prompt)) at P on every line. */
Test(replay_policy, retain_prefix_equals_ranges_on_every_line, .timeout = 120)
{
    char plain[64], ranged[64];
    retention_log(plain, sizeof plain, false, false);
    retention_log(ranged, sizeof ranged, false, true);
    cr_assert_eq(replay_into("--block-size 16 --policy retain,slru --capacities 40,60,90 --json "
                             "--retain-prefix 192:70",
                             plain, out, sizeof out),
                 0, "%s", err);
    cr_assert_eq(replay_into("--block-size 16 --policy retain,slru --capacities 40,60,90 --json",
                             ranged, out2, sizeof out2),
                 0, "%s", err);
    json_t *a = parse(out), *b = parse(out2);
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "slru" : "retain";
        json_t *sa = json_object_get(policy_of(a, name), "sweep");
        json_t *sb = json_object_get(policy_of(b, name), "sweep");
        cr_assert_eq(json_array_size(sa), 3);
        for (size_t i = 0; i < 3; i++)
            cr_assert(json_equal(json_array_get(sa, i), json_array_get(sb, i)), "%s point %zu",
                      name, i);
    }
    json_decref(a);
    json_decref(b);
    unlink(plain);
    unlink(ranged);
}

Test(replay_policy, retention_bad_input)
{
    static const struct {
        const char *line, *msg;
    } cases[] = {
        {"{\"tokens\": [1, 2, 3], \"retention\": {\"priority\": 101}}",
         ":1: retention.priority must be an integer from 0 to 100"},
        {"{\"tokens\": [1, 2, 3], \"retention\": {\"ranges\": [[0, 5, 50]]}}",
         ":1: retention.ranges[0] ends at token 5, past the prompt's 3 tokens"},
        {"{\"tokens\": [1, 2, 3], \"retention\": {\"ranges\": [[2, 2, 50]]}}",
         ":1: retention.ranges[0] is [2, 2): empty"},
        {"{\"tokens\": [1, 2, 3], \"retention\": {\"ranges\": [[0, 2]]}}",
         ":1: retention.ranges[0] must be [start, end, priority] or [start, end, priority, "
         "duration]"},
        {"{\"tokens\": [1, 2, 3], \"retention\": {\"prio\": 1}}",
         ":1: retention: unknown field \"prio\""},
        {"{\"tokens\": [1, 2, 3], \"retention\": [1]}", ":1: retention must be an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[64];
        snprintf(path, sizeof path, "/tmp/kvp_retention_bad_XXXXXX");
        int fd = mkstemp(path);
        cr_assert(fd >= 0);
        cr_assert(write(fd, cases[i].line, strlen(cases[i].line)) > 0);
        close(fd);
        cr_assert_eq(
            replay_into("--block-size 1 --policy lru,retain --capacity 4", path, out, sizeof out),
            1, "case %zu: %s", i, err);
        cr_assert(strstr(err, cases[i].msg) != NULL, "case %zu: %s", i, err);
        unlink(path);
    }
    const char *log = example_log();
    cr_assert_eq(replay_into("--retain-prefix 512 --capacity 400", log, out, sizeof out), 2);
    cr_assert(strstr(err, "--retain-prefix: '512' is not TOKENS:PRIORITY") != NULL, "%s", err);
    cr_assert_eq(replay_into("--retain-prefix 512:101 --capacity 400", log, out, sizeof out), 2);
    cr_assert_eq(replay_into("--retain-prefix 0:50 --capacity 400", log, out, sizeof out), 2);
}
