/*
 * test_gen_chatlog.c - tests of the example request-log generator (examples/gen_chatlog.c).
 *
 * The built generator (GEN_CHATLOG_BIN) is run as a child process writing into the build
 * directory (GEN_CHATLOG_OUT); its output is compared byte for byte between runs, parsed
 * line by line with jansson, and checked against the scenario the generator's opening
 * comment describes: three tenants, two models, the adapter on acme only, multi-turn
 * conversations that extend their previous turn, globex's clock at the end of its prompts
 * and initech's at the start, the shared document, the one-off requests. The token ids the
 * checks name are the generator's documented layout: template tokens 1 (begin), 2 (system),
 * 3 (user), 4 (assistant), 5 (end of turn); words from 1000; "Current" is 1568.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TOK_BOS       1
#define TOK_SYSTEM    2
#define TOK_USER      3
#define TOK_ASSISTANT 4
#define TOK_END       5
#define TOK_CURRENT   1568 /* the first token of "Current time: ..." */
#define TOK_MAX       1569 /* the largest text token id */
#define CLOCK_TOKENS  21   /* Current time : YYYY - MM - DD HH : MM : SS */

/* A path in the output directory. */
static const char *out_path(const char *name)
{
    static char buf[4][4096];
    static int next;
    const char *dir = getenv("GEN_CHATLOG_OUT");
    char *b = buf[next++ % 4];
    snprintf(b, sizeof buf[0], "%s/gen_chatlog_test_%s", dir ? dir : ".", name);
    return b;
}

/* Run the generator with args (NULL-terminated) and stdout to stdout_file (NULL: discarded);
 * returns its exit status, its stderr in err. */
static int run(const char *const *args, const char *stdout_file, char *err, size_t err_size)
{
    const char *bin = getenv("GEN_CHATLOG_BIN");
    if (bin == NULL)
        cr_skip_test("GEN_CHATLOG_BIN is not set");
    const char *err_file = out_path("stderr");
    char *argv[32];
    size_t n = 0;
    argv[n++] = (char *)bin;
    for (; args[n - 1] != NULL && n < 31; n++)
        argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        int o = open(stdout_file ? stdout_file : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
            _exit(127);
        execv(bin, argv);
        _exit(127);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st), "the generator died of a signal");
    FILE *f = fopen(err_file, "r");
    cr_assert_not_null(f);
    size_t len = fread(err, 1, err_size - 1, f);
    err[len] = '\0';
    fclose(f);
    return WEXITSTATUS(st);
}

/* The whole file at path, NUL-terminated; *len its length. */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long size = ftell(f);
    cr_assert(size >= 0);
    rewind(f);
    char *buf = malloc((size_t)size + 1);
    cr_assert_not_null(buf);
    cr_assert_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
    buf[size] = '\0';
    fclose(f);
    *len = (size_t)size;
    return buf;
}

/* Generate into out_path(name) with args; asserts success and returns the path. */
static const char *generate(const char *name, const char *const *args)
{
    const char *path = out_path(name);
    const char *a[16];
    size_t n = 0;
    for (; args[n] != NULL; n++)
        a[n] = args[n];
    a[n++] = "-o";
    a[n++] = path;
    a[n] = NULL;
    char err[1024];
    int rc = run(a, NULL, err, sizeof err);
    cr_assert_eq(rc, 0, "gen_chatlog failed (%d): %s", rc, err);
    cr_assert_eq(err[0], '\0', "gen_chatlog wrote to stderr: %s", err);
    return path;
}

static void assert_same_file(const char *a, const char *b)
{
    size_t la, lb;
    char *x = slurp(a, &la), *y = slurp(b, &lb);
    cr_assert(la > 0);
    cr_assert_eq(la, lb, "%s: %zu bytes, %s: %zu bytes", a, la, b, lb);
    cr_assert_eq(memcmp(x, y, la), 0, "%s and %s differ", a, b);
    free(x);
    free(y);
}

/* One request of a token-format log. */
typedef struct req {
    double ts;       /* timestamp */
    char tenant[16]; /* tenant, model, adapter ("" when absent) */
    char model[16];
    char adapter[32];
    uint32_t *tok; /* prompt token ids, owned */
    size_t n;      /* their number */
    uint32_t *out; /* output token ids, owned */
    size_t n_out;  /* their number */
} req;

static uint32_t *ids(json_t *a, size_t *n, size_t line)
{
    cr_assert(json_is_array(a) && json_array_size(a) > 0, "line %zu: not a token array", line);
    *n = json_array_size(a);
    uint32_t *v = malloc(*n * sizeof *v);
    cr_assert_not_null(v);
    for (size_t i = 0; i < *n; i++) {
        json_t *x = json_array_get(a, i);
        cr_assert(json_is_integer(x), "line %zu: a token is not an integer", line);
        json_int_t id = json_integer_value(x);
        cr_assert((id >= TOK_BOS && id <= TOK_END) || (id >= 1000 && id <= TOK_MAX),
                  "line %zu: token id %lld out of the vocabulary", line, (long long)id);
        v[i] = (uint32_t)id;
    }
    return v;
}

static void copy_string(char *dst, size_t size, json_t *s, size_t line, const char *key)
{
    cr_assert(json_is_string(s), "line %zu: %s is not a string", line, key);
    size_t len = strlen(json_string_value(s));
    cr_assert(len < size, "line %zu: %s too long", line, key);
    memcpy(dst, json_string_value(s), len + 1);
}

/* Parse a token-format log: every line one JSON object with exactly the documented keys. */
static req *load_tokens(const char *path, size_t *n_reqs)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    char *line = NULL;
    size_t cap = 0, n = 0, alloc = 0;
    req *r = NULL;
    while (getline(&line, &cap, f) > 0) {
        json_error_t jerr;
        json_t *o = json_loads(line, JSON_REJECT_DUPLICATES, &jerr);
        cr_assert_not_null(o, "line %zu: not JSON: %s", n + 1, jerr.text);
        cr_assert(json_is_object(o));
        if (n == alloc) {
            alloc = alloc ? 2 * alloc : 1024;
            r = realloc(r, alloc * sizeof *r);
            cr_assert_not_null(r);
        }
        req *q = &r[n++];
        memset(q, 0, sizeof *q);
        json_t *ts = json_object_get(o, "timestamp");
        cr_assert(json_is_real(ts), "line %zu: no timestamp", n);
        q->ts = json_real_value(ts);
        copy_string(q->tenant, sizeof q->tenant, json_object_get(o, "tenant"), n, "tenant");
        copy_string(q->model, sizeof q->model, json_object_get(o, "model"), n, "model");
        json_t *ad = json_object_get(o, "adapter");
        if (ad != NULL)
            copy_string(q->adapter, sizeof q->adapter, ad, n, "adapter");
        q->tok = ids(json_object_get(o, "tokens"), &q->n, n);
        q->out = ids(json_object_get(o, "output_tokens"), &q->n_out, n);
        cr_assert_eq(json_object_size(o), ad != NULL ? 6u : 5u, "line %zu: unexpected keys", n);
        json_decref(o);
    }
    free(line);
    fclose(f);
    *n_reqs = n;
    return r;
}

static void free_reqs(req *r, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(r[i].tok);
        free(r[i].out);
    }
    free(r);
}

static size_t common_prefix(const uint32_t *a, size_t na, const uint32_t *b, size_t nb)
{
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i])
        i++;
    return i;
}

static inline bool same_namespace(const req *a, const req *b)
{
    return strcmp(a->tenant, b->tenant) == 0 && strcmp(a->model, b->model) == 0 &&
           strcmp(a->adapter, b->adapter) == 0;
}

/* Whether b's prompt is a's prompt, then a's output, then more. */
static inline bool extends(const req *a, const req *b)
{
    return b->n > a->n + a->n_out && memcmp(b->tok, a->tok, a->n * sizeof *a->tok) == 0 &&
           memcmp(b->tok + a->n, a->out, a->n_out * sizeof *a->out) == 0;
}

Test(gen_chatlog, same_seed_same_bytes)
{
    const char *a = generate("det_a", (const char *const[]){NULL});
    const char *b = generate("det_b", (const char *const[]){"--seed", "20261129", NULL});
    assert_same_file(a, b);
    /* Standard output gets the same bytes as -o. */
    const char *c = out_path("det_c");
    char err[256];
    cr_assert_eq(run((const char *const[]){NULL}, c, err, sizeof err), 0, "%s", err);
    assert_same_file(a, c);

    a = generate("det_oa", (const char *const[]){"--format", "openai", "--seed", "5", NULL});
    b = generate("det_ob", (const char *const[]){"--seed=5", "--format=openai", NULL});
    assert_same_file(a, b);
}

Test(gen_chatlog, seed_changes_output_and_fewer_requests_are_a_prefix)
{
    size_t la, lb, lc;
    char *a = slurp(generate("seed_1", (const char *const[]){"--seed", "1", NULL}), &la);
    char *b = slurp(generate("seed_2", (const char *const[]){"--seed", "2", NULL}), &lb);
    cr_assert(la != lb || memcmp(a, b, la) != 0, "seeds 1 and 2 give the same log");
    /* The simulation streams: 37 requests are the first 37 lines of the 600. */
    char *c = slurp(
        generate("seed_1_37", (const char *const[]){"--seed", "1", "--requests", "37", NULL}), &lc);
    size_t lines = 0;
    for (size_t i = 0; i < lc; i++)
        lines += c[i] == '\n';
    cr_assert_eq(lines, 37);
    cr_assert(lc < la && memcmp(a, c, lc) == 0);
    free(a);
    free(b);
    free(c);
}

Test(gen_chatlog, token_lines_are_valid)
{
    const char *path = generate("tokens", (const char *const[]){NULL});
    size_t n, size;
    free(slurp(path, &size));
    cr_assert(size > 1000000 && size < 8000000, "%zu bytes", size);
    req *r = load_tokens(path, &n);
    cr_assert_eq(n, 600);

    static const char *const tenants[] = {"acme", "globex", "initech"};
    static const char *const models[] = {"llama-3.1-8b", "qwen2.5-7b"};
    size_t per_tenant[3] = {0}, per_model[2] = {0}, n_adapter = 0;
    for (size_t i = 0; i < n; i++) {
        const req *q = &r[i];
        cr_assert(i == 0 || q->ts > r[i - 1].ts, "line %zu: timestamp does not increase", i + 1);
        size_t t = 0, m = 0;
        while (t < 3 && strcmp(q->tenant, tenants[t]) != 0)
            t++;
        while (m < 2 && strcmp(q->model, models[m]) != 0)
            m++;
        cr_assert(t < 3, "line %zu: tenant %s", i + 1, q->tenant);
        cr_assert(m < 2, "line %zu: model %s", i + 1, q->model);
        per_tenant[t]++;
        per_model[m]++;
        if (q->adapter[0] != '\0') {
            cr_assert_str_eq(q->adapter, "acme-support-lora");
            cr_assert_str_eq(q->tenant, "acme", "line %zu: adapter on %s", i + 1, q->tenant);
            n_adapter++;
        }
        /* The template: begin, a system or user turn first, the generation prompt last. */
        cr_assert_eq(q->tok[0], TOK_BOS);
        cr_assert(q->tok[1] == TOK_SYSTEM || q->tok[1] == TOK_USER);
        cr_assert(q->n > 3 && q->tok[q->n - 2] == TOK_END && q->tok[q->n - 1] == TOK_ASSISTANT);
        cr_assert_eq(q->out[q->n_out - 1], TOK_END);
    }
    for (size_t t = 0; t < 3; t++)
        cr_assert(per_tenant[t] >= 50, "%s: %zu requests", tenants[t], per_tenant[t]);
    for (size_t m = 0; m < 2; m++)
        cr_assert(per_model[m] >= 50, "%s: %zu requests", models[m], per_model[m]);
    cr_assert(n_adapter >= 10, "%zu adapter requests", n_adapter);
    free_reqs(r, n);
}

Test(gen_chatlog, scenario_sharing)
{
    size_t n;
    req *r = load_tokens(generate("scenario", (const char *const[]){NULL}), &n);
    size_t n_extends = 0, n_initech = 0, n_docqa_pairs = 0, n_oneoff = 0, n_globex = 0;
    const req *first_globex = NULL, *first_acme = NULL, *prev_initech = NULL;
    for (size_t j = 0; j < n; j++) {
        const req *b = &r[j];
        bool initech = strcmp(b->tenant, "initech") == 0 && b->tok[1] == TOK_SYSTEM;
        bool globex = strcmp(b->tenant, "globex") == 0 && b->tok[1] == TOK_SYSTEM;
        bool acme = strcmp(b->tenant, "acme") == 0 && b->tok[1] == TOK_SYSTEM;
        n_oneoff += b->tok[1] == TOK_USER;

        /* Multi-turn: turn k+1 = turn k + its reply + a new user message, except at initech
         * whose clock first changes every request. */
        for (size_t i = 0; i < j; i++) {
            if (same_namespace(&r[i], b) && extends(&r[i], b)) {
                cr_assert(!initech, "line %zu: an initech request extends line %zu", j + 1, i + 1);
                n_extends++;
                break;
            }
        }

        /* Each tenant's system message is shared by all its requests in one namespace. */
        if (globex) {
            n_globex++;
            if (first_globex != NULL)
                cr_assert(common_prefix(first_globex->tok, first_globex->n, b->tok, b->n) > 700,
                          "line %zu", j + 1);
            first_globex = first_globex ? first_globex : b;
            /* The clock comes last, after the user's text. */
            cr_assert_eq(b->tok[b->n - 2 - CLOCK_TOKENS], TOK_CURRENT, "line %zu", j + 1);
            for (size_t i = 0; i < j; i++)
                n_docqa_pairs += same_namespace(&r[i], b) &&
                                 common_prefix(r[i].tok, r[i].n, b->tok, b->n) > 2000;
        }
        if (acme && b->adapter[0] == '\0') {
            if (first_acme != NULL)
                cr_assert(common_prefix(first_acme->tok, first_acme->n, b->tok, b->n) > 900,
                          "line %zu", j + 1);
            first_acme = first_acme ? first_acme : b;
        }

        /* initech: the clock opens the system prompt; two requests in different seconds
         * share at most the template tokens and part of the clock, then nothing until the
         * clock ends, after which the system message is the same. */
        if (initech) {
            n_initech++;
            cr_assert_eq(b->tok[2], TOK_CURRENT, "line %zu", j + 1);
            const req *a = prev_initech;
            if (a != NULL && (long long)a->ts != (long long)b->ts) {
                cr_assert(common_prefix(a->tok, a->n, b->tok, b->n) < 2 + CLOCK_TOKENS,
                          "lines %zu: initech shares past its clock", j + 1);
                size_t rest = 2 + CLOCK_TOKENS;
                cr_assert(common_prefix(a->tok + rest, a->n - rest, b->tok + rest, b->n - rest) >
                              500,
                          "line %zu: initech's system prompt differs past the clock", j + 1);
            }
            prev_initech = b;
        }
    }
    cr_assert(n_extends >= 100, "%zu requests extend an earlier turn", n_extends);
    cr_assert(n_initech >= 50, "%zu initech requests", n_initech);
    cr_assert(n_globex >= 50, "%zu globex requests", n_globex);
    cr_assert(n_docqa_pairs >= 20, "%zu pairs share the document", n_docqa_pairs);
    cr_assert(n_oneoff >= 5, "%zu one-off requests", n_oneoff);
    free_reqs(r, n);
}

Test(gen_chatlog, openai_lines_are_valid)
{
    const char *path = generate("openai", (const char *const[]){"--format", "openai", NULL});
    size_t n_tok;
    req *r = load_tokens(generate("openai_tok", (const char *const[]){NULL}), &n_tok);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    char *line = NULL;
    size_t cap = 0, n = 0, n_initech = 0, n_globex = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t jerr;
        json_t *o = json_loads(line, JSON_REJECT_DUPLICATES, &jerr);
        cr_assert_not_null(o, "line %zu: not JSON: %s", n + 1, jerr.text);
        cr_assert(n < n_tok);
        const req *q = &r[n++];
        /* The same requests as the token format, in the same order. */
        cr_assert_str_eq(json_string_value(json_object_get(o, "user")), q->tenant);
        cr_assert_str_eq(json_string_value(json_object_get(o, "model")), q->model);
        json_t *ad = json_object_get(o, "adapter");
        cr_assert_str_eq(ad ? json_string_value(ad) : "", q->adapter);
        cr_assert(json_real_value(json_object_get(o, "timestamp")) == q->ts, "line %zu", n);
        cr_assert_eq(json_integer_value(json_object_get(o, "max_tokens")), (json_int_t)q->n_out);
        /* messages: a system message first when the tokens have one, roles alternating. */
        json_t *msgs = json_object_get(o, "messages");
        size_t n_msgs = json_array_size(msgs);
        cr_assert(n_msgs >= 1);
        size_t first_user = q->tok[1] == TOK_SYSTEM ? 1 : 0;
        for (size_t i = 0; i < n_msgs; i++) {
            json_t *m = json_array_get(msgs, i);
            const char *role = json_string_value(json_object_get(m, "role"));
            const char *content = json_string_value(json_object_get(m, "content"));
            cr_assert(role != NULL && content != NULL && content[0] != '\0', "line %zu", n);
            const char *want = i < first_user              ? "system"
                               : (i - first_user) % 2 == 0 ? "user"
                                                           : "assistant";
            cr_assert_str_eq(role, want, "line %zu message %zu", n, i);
        }
        cr_assert_eq((n_msgs - first_user) % 2, 1, "line %zu ends with a user message", n);
        const char *sys = json_string_value(json_object_get(json_array_get(msgs, 0), "content"));
        const char *last =
            json_string_value(json_object_get(json_array_get(msgs, n_msgs - 1), "content"));
        if (strcmp(q->tenant, "initech") == 0 && first_user == 1) {
            n_initech++;
            cr_assert(strncmp(sys, "Current time: 2026-1", 20) == 0, "line %zu: %.40s", n, sys);
        }
        if (strcmp(q->tenant, "globex") == 0 && first_user == 1) {
            n_globex++;
            const char *clock = strstr(last, "Current time: ");
            cr_assert(clock != NULL && strlen(clock) == strlen("Current time: 2026-11-29 10:31:02"),
                      "line %zu: the clock ends globex's user message", n);
            cr_assert(clock[18] == '-' && clock[21] == '-' && clock[27] == ':' && clock[30] == ':');
        }
        json_decref(o);
    }
    cr_assert_eq(n, n_tok);
    cr_assert(n_initech > 0 && n_globex > 0);
    free(line);
    fclose(f);
    free_reqs(r, n_tok);
}

Test(gen_chatlog, bad_arguments)
{
    static const char *const bad[][4] = {
        {"--requests", "0", NULL},
        {"--requests", "abc", NULL},
        {"--requests", "-5", NULL},
        {"--requests", "10000001", NULL},
        {"--seed", "-1", NULL},
        {"--seed", "99999999999999999999", NULL},
        {"--seed", "", NULL},
        {"--format", "xml", NULL},
        {"--format=", NULL},
        {"--bogus", NULL},
        {"-o", NULL},
        {"--seed", NULL},
        {"extra", NULL},
        {"-o", "", NULL},
    };
    char err[1024];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *out = out_path("bad_stdout");
        int rc = run(bad[i], out, err, sizeof err);
        cr_assert_eq(rc, 2, "%s %s: exit %d", bad[i][0], bad[i][1] ? bad[i][1] : "", rc);
        cr_assert(strncmp(err, "gen_chatlog: ", 13) == 0 && strlen(err) > 14, "message: %s", err);
        cr_assert(strchr(err, '\n') == err + strlen(err) - 1, "one line: %s", err);
        size_t len;
        free(slurp(out, &len));
        cr_assert_eq(len, 0, "%s: wrote %zu bytes", bad[i][0], len);
    }
    /* An output file that cannot be created is an I/O error, status 1. */
    int rc =
        run((const char *const[]){"-o", "/nonexistent-dir/log.jsonl", NULL}, NULL, err, sizeof err);
    cr_assert_eq(rc, 1);
    cr_assert(strstr(err, "gen_chatlog: /nonexistent-dir/log.jsonl: ") == err, "%s", err);
    /* --help prints the usage on standard output. */
    const char *out = out_path("help");
    cr_assert_eq(run((const char *const[]){"--help", NULL}, out, err, sizeof err), 0);
    size_t len;
    char *text = slurp(out, &len);
    cr_assert(strncmp(text, "usage: gen_chatlog", 18) == 0, "%s", text);
    free(text);
}
