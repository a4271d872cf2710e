/*
 * rd_http.c - the HTTP side of `kvprefix router`, served by libmicrohttpd (a thread pool of
 * --http-threads threads, each with its own poll loop):
 *
 *   POST /score    {"tokens": [ids...], "model": S, "lora": S, "salt": S, "tenant": S,
 *                  "workers": [NAME...], "loads": {NAME: LOAD}}, or the ids as little-endian
 *                  uint32 (Content-Type application/octet-stream) with
 *                  ?model=S&lora=S&salt=S&tenant=S (no workers or loads); or, with
 *                  --tokenizer, "prompt" or "messages" (+ "tools", ...) instead of
 *                  "tokens": rd_req.c's text mode, then rd_text_tokens (rd_text.h)
 *                  -> {"prompt_tokens": N, "block_size": B, "workers": [{"engine", "dp_rank",
 *                      "blocks", "tokens", "weighted", "state", "load", "over_cap"}, ...],
 *                      "view": V}
 *                  sorted by weighted score, then blocks, then engine id, dp rank, then
 *                  ranked by rd_rank_rows (rd_load.c): "workers" keeps those candidates'
 *                  rows, "loads" gives loads for this request, each row has "load"
 *                  (requests running + waiting, null when unknown) and "over_cap".
 *                  V is "redis" when the shared store answered, "local" when the daemon's
 *                  own index did (always without --redis); with --redis, "fallback": true
 *                  says that the local view answered because Redis failed or was in its
 *                  retry pause (false otherwise).
 *   POST /load     {"engine", "dp_rank", "running", "waiting", "kv_usage"} or {"loads":
 *                  [...]}: a worker's load pushed by a gateway (rd_load_push); the body is
 *                  buffered whole (--max-body, the body budget) and parsed with jansson
 *   GET /metrics   Prometheus text format 0.0.4 (rd_metrics_write)
 *   GET /healthz   {"status": "ok", "workers": N, "stale": M, "view": V} (+ "redis": "up" or
 *                  "down" with --redis); 200 whichever view scores.
 *
 * The fast path. A /score body is scanned as it arrives (rd_req.c: no copy of the body, a
 * wrong byte or an unknown member refuses it at once), the ids go into the connection's
 * reused array, the rows into its reused arrays, and the answer is written by hand into
 * its reused buffer (jansson is left for /healthz and POST /load): once a connection's
 * buffers have grown, a /score allocates nothing per token; per request only
 * libmicrohttpd's response, rd_rank_rows' three scratch arrays (one entry per row, when
 * there are two rows or more) and, when the request names workers or loads, their two
 * pointer arrays (rd_rank_req). The daemon's own time per score (the handler's calls, body
 * scanning and the load-aware ranking included; not the network) is the histogram
 * kvprefix_router_score_seconds. Figures: docs/routing.md, bench/bench_routerd.c.
 *
 * Limits (rd_limits): a body above --max-body is refused by its Content-Length before it is
 * read (413), or when it passes the bound; the token arrays of all connections share
 * --body-budget (503 when spent); each request has an absolute deadline from its headers
 * (--request-timeout; past it the connection is closed, counted); libmicrohttpd caps
 * connections per client address and in all (--per-ip-connections, --max-connections) and
 * closes idle ones after 10 s.
 *
 * Every error answers with a JSON body {"error": "..."} and a 4xx/5xx status. Scoring calls
 * kvp_router_score_v2 concurrently from the pool's threads (the index is thread-safe). The
 * call itself says which view answered it (kvp_router_score_result.view: no counter read
 * around it, so concurrent requests cannot blur it) and hands each row's engine id (owned
 * by the router until kvp_router_free, valid even if the worker is removed meanwhile), so
 * ranking a row needs no look-up in the daemon's worker table; rd_daemon.lock is taken
 * only to count the lookup.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "cli.h"
#include "rd_http.h"
#include "rd_text.h"
#include "routerd.h"

/* What the request in progress is. */
enum { RD_K_NONE = 0, RD_K_SCORE = 1, RD_K_DONE = 2, RD_K_LOAD = 3 };

/* Bytes of token array and answer a connection keeps between requests. */
#define RD_KEEP_TOKEN_BYTES ((size_t)256 << 10)
#define RD_KEEP_OUT_BYTES   ((size_t)1 << 20)
/* libmicrohttpd's memory per connection (its default is 32 KiB): the upload chunks handed
 * to the scanner are about half of it, so an 8k-token JSON body comes in 2 calls, not 4. */
#define RD_CONN_MEMORY (128u << 10)

static const char *const rd_state_names[] = {"scored", "stale", "model", "notsup", "token"};

uint64_t rd_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Room for n more bytes in the answer. Returns false (and marks it failed) when out of
 * memory. */
static bool rd_out_room(rd_conn *cn, size_t n)
{
    if (cn->out_failed)
        return false;
    if (n <= cn->out_cap - cn->out_n)
        return true;
    if (!cli_grow((void **)&cn->out, &cn->out_cap, cn->out_n + n, 1)) {
        cn->out_failed = true;
        return false;
    }
    return true;
}

static void rd_out_mem(rd_conn *cn, const char *s, size_t n)
{
    if (rd_out_room(cn, n)) {
        memcpy(cn->out + cn->out_n, s, n);
        cn->out_n += n;
    }
}

#define rd_out_lit(cn, s) rd_out_mem(cn, s, sizeof s - 1)

static void rd_out_u64(rd_conn *cn, uint64_t v)
{
    char b[24];
    size_t i = sizeof b;
    do {
        b[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    rd_out_mem(cn, b + i, sizeof b - i);
}

static void rd_out_i64(rd_conn *cn, int64_t v)
{
    if (v < 0) {
        rd_out_lit(cn, "-");
        rd_out_u64(cn, (uint64_t)0 - (uint64_t)v);
    } else {
        rd_out_u64(cn, (uint64_t)v);
    }
}

/* A real as jansson writes one (%.17g, ".0" added to integral values); integral values
 * below 2^53 take the integer path. */
static void rd_out_real(rd_conn *cn, double v)
{
    if (v >= 0 && v < 9007199254740992.0 && v == (double)(uint64_t)v) {
        rd_out_u64(cn, (uint64_t)v);
        rd_out_lit(cn, ".0");
        return;
    }
    char b[40];
    int n = snprintf(b, sizeof b, "%.17g", v);
    if (n <= 0 || (size_t)n >= sizeof b || v != v || v - v != 0) {
        rd_out_lit(cn, "0.0"); /* NaN and infinities are not JSON */
        return;
    }
    rd_out_mem(cn, b, (size_t)n);
    if (strpbrk(b, ".e") == NULL)
        rd_out_lit(cn, ".0");
}

/* s as a JSON string: quotes, backslashes and control characters escaped, bytes that are
 * not UTF-8 written as U+FFFD (an engine id from a topic, a message). */
static void rd_out_str(rd_conn *cn, const char *s)
{
    rd_out_lit(cn, "\"");
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        const unsigned char *run = p;
        while (*p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\')
            p++;
        rd_out_mem(cn, (const char *)run, (size_t)(p - run));
        if (*p == 0)
            break;
        if (*p == '"' || *p == '\\') {
            char e[2] = {'\\', (char)*p++};
            rd_out_mem(cn, e, 2);
        } else if (*p < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", *p++);
            rd_out_mem(cn, e, 6);
        } else {
            size_t len = *p >= 0xF0 ? 4 : *p >= 0xE0 ? 3 : 2;
            bool ok = *p >= 0xC2 && *p <= 0xF4;
            for (size_t k = 1; ok && k < len; k++)
                ok = p[k] >= 0x80 && p[k] <= 0xBF;
            ok = ok && !(p[0] == 0xE0 && p[1] < 0xA0) && !(p[0] == 0xED && p[1] > 0x9F) &&
                 !(p[0] == 0xF0 && p[1] < 0x90) && !(p[0] == 0xF4 && p[1] > 0x8F);
            if (ok) {
                rd_out_mem(cn, (const char *)p, len);
                p += len;
            } else {
                rd_out_lit(cn, "\\ufffd");
                p++;
            }
        }
    }
    rd_out_lit(cn, "\"");
}

/* Make the answer: status, type; the body is what was written to cn->out (a fixed 500
 * when it could not be). Returns RD_NEXT_REPLY. */
static int rd_answer(rd_conn *cn, unsigned status, const char *type)
{
    cn->answered = true;
    cn->kind = RD_K_DONE;
    cn->status = status;
    cn->type = type;
    if (cn->out_failed) { /* rd_send answers its fixed "out of memory" */
        cn->status = MHD_HTTP_INTERNAL_SERVER_ERROR;
        cn->type = "application/json";
        cn->out_n = 0;
        cn->out_failed = false;
    }
    return RD_NEXT_REPLY;
}

/* An error answer {"error": why}; counted. Returns RD_NEXT_REPLY. */
static int rd_error(rd_daemon *d, rd_conn *cn, unsigned status, const char *why)
{
    pthread_mutex_lock(&d->lock);
    d->n_http_errors++;
    if (status == MHD_HTTP_SERVICE_UNAVAILABLE)
        d->n_http_busy++;
    pthread_mutex_unlock(&d->lock);
    cn->out_n = 0;
    rd_out_lit(cn, "{\"error\":");
    rd_out_str(cn, why);
    rd_out_lit(cn, "}");
    return rd_answer(cn, status, "application/json");
}

/* The deadline passed: counted, the connection is closed. Returns RD_NEXT_CLOSE. */
static int rd_timeout(rd_daemon *d, rd_conn *cn)
{
    pthread_mutex_lock(&d->lock);
    d->n_http_timeouts++;
    pthread_mutex_unlock(&d->lock);
    cn->kind = RD_K_DONE;
    return RD_NEXT_CLOSE;
}

/* Best first: weighted score, blocks, engine id, dp rank. */
static int rd_rank_cmp(const void *pa, const void *pb)
{
    const rd_rank *a = pa, *b = pb;
    if (a->row.score != b->row.score)
        return a->row.score > b->row.score ? -1 : 1;
    if (a->row.n_blocks != b->row.n_blocks)
        return a->row.n_blocks > b->row.n_blocks ? -1 : 1;
    int c = strcmp(a->engine, b->engine);
    if (c)
        return c;
    return (a->row.dp_rank > b->row.dp_rank) - (a->row.dp_rank < b->row.dp_rank);
}

/* Room for cap rows in cn's arrays. Returns false on ENOMEM (arrays unchanged). */
static bool rd_rows_room(rd_conn *cn, size_t cap)
{
    if (cap <= cn->cap_rows)
        return true;
    kvp_router_row *rows = realloc(cn->rows, cap * sizeof *rows);
    if (rows)
        cn->rows = rows;
    const char **ids = rows ? realloc(cn->ids, cap * sizeof *ids) : NULL;
    if (ids)
        cn->ids = ids;
    rd_rank *rk = ids ? realloc(cn->rk, cap * sizeof *rk) : NULL;
    if (rk == NULL)
        return false;
    cn->rk = rk;
    cn->cap_rows = cap;
    return true;
}

/* Score tokens in ns into cn->rk[0 .. *n_out), ranked best first, and the view that
 * answered into *view. Returns KVP_OK or the router's code. */
static int rd_score_rows(rd_daemon *d, rd_conn *cn, const kvp_namespace *ns, size_t *n_out,
                         int *view)
{
    size_t need = cn->cap_rows ? cn->cap_rows : 64, n = 0;
    for (;;) {
        if (!rd_rows_room(cn, need))
            return KVP_ENOMEM;
        kvp_router_score_result res;
        kvp_router_score_result_init(&res);
        res.engine_ids = cn->ids;
        int rc = kvp_router_score_v2(d->router, ns, cn->req.tokens, cn->req.n_tokens, cn->rows,
                                     cn->cap_rows, &n, &res);
        if (rc == KVP_ENOSPC) {
            need = n + 16;
            continue;
        }
        if (rc != KVP_OK)
            return rc;
        for (size_t i = 0; i < n; i++)
            cn->rk[i] = (rd_rank){.row = cn->rows[i], .engine = cn->ids[i]};
        qsort(cn->rk, n, sizeof *cn->rk, rd_rank_cmp);
        *n_out = n;
        *view = res.view;
        return KVP_OK;
    }
}

/* The load-aware ranking of the scored rows cn->rk[0 .. *n) (rd_rank_rows) with the
 * request's "workers" and "loads" (pointer arrays into the scanner's names, allocated only
 * when the request has either). Returns KVP_OK or KVP_ENOMEM / KVP_EINVAL. */
static int rd_rank_req(rd_daemon *d, rd_conn *cn, size_t prompt_blocks, size_t *n)
{
    const rd_req *q = &cn->req;
    rd_score_opts o;
    memset(&o, 0, sizeof o);
    const char **names = NULL;
    double *values = NULL;
    if (q->workers_set || q->n_items > 0) {
        names = malloc((q->n_items + 1) * sizeof *names);
        values = malloc((q->n_loads + 1) * sizeof *values);
        if (names == NULL || values == NULL) {
            free(names);
            free(values);
            return KVP_ENOMEM;
        }
        for (size_t i = 0; i < q->n_items; i++) {
            if (q->items[i].is_load) {
                names[q->n_workers + o.n_loads] = rd_req_name(q, i);
                values[o.n_loads++] = q->items[i].value;
            } else {
                names[o.n_workers++] = rd_req_name(q, i);
            }
        }
        o.workers = q->workers_set ? names : NULL;
        o.load_names = names + q->n_workers;
        o.load_values = values;
    }
    int rc = rd_rank_rows(d, &o, prompt_blocks, cn->rk, n);
    free(names);
    free(values);
    return rc;
}

/* The scanned request: score it and write the answer. Returns RD_NEXT_REPLY. */
static int rd_score(rd_daemon *d, rd_conn *cn)
{
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    kvp_field *f[RD_REQ_N_STR] = {&ns.model, &ns.adapter, &ns.salt, &ns.tenant};
    for (int i = 0; i < RD_REQ_N_STR; i++)
        if (cn->req.str_set[i])
            *f[i] = (kvp_field){.ptr = cn->req.str[i], .len = cn->req.str_len[i]};
    size_t n = 0, n_tokens = cn->req.n_tokens;
    int view = 0;
    int rc = rd_score_rows(d, cn, &ns, &n, &view);
    if (rc == KVP_OK)
        rc = rd_rank_req(d, cn, n_tokens / d->hash.block_size, &n);
    if (rc != KVP_OK)
        return rd_error(d, cn,
                        rc == KVP_ENOMEM ? MHD_HTTP_INTERNAL_SERVER_ERROR : MHD_HTTP_BAD_REQUEST,
                        kvp_strerror(rc));
    pthread_mutex_lock(&d->lock);
    d->n_lookups++;
    d->n_lookup_blocks += n_tokens / d->hash.block_size;
    d->n_hit_blocks += n ? cn->rk[0].row.n_blocks : 0;
    pthread_mutex_unlock(&d->lock);
    cn->out_n = 0;
    rd_out_lit(cn, "{\"prompt_tokens\":");
    rd_out_u64(cn, n_tokens);
    rd_out_lit(cn, ",\"block_size\":");
    rd_out_u64(cn, d->hash.block_size);
    rd_out_lit(cn, ",\"workers\":[");
    for (size_t i = 0; i < n; i++) {
        const kvp_router_row *r = &cn->rk[i].row;
        rd_out_mem(cn, ",{\"engine\":" + (i == 0), sizeof ",{\"engine\":" - 1 - (i == 0));
        rd_out_str(cn, cn->rk[i].engine);
        rd_out_lit(cn, ",\"dp_rank\":");
        rd_out_i64(cn, r->dp_rank);
        rd_out_lit(cn, ",\"blocks\":");
        rd_out_u64(cn, r->n_blocks);
        rd_out_lit(cn, ",\"tokens\":");
        rd_out_u64(cn, r->n_tokens);
        rd_out_lit(cn, ",\"weighted\":");
        rd_out_real(cn, r->score);
        rd_out_lit(cn, ",\"state\":\"");
        bool known =
            r->state >= 0 && (size_t)r->state < sizeof rd_state_names / sizeof *rd_state_names;
        const char *st = known ? rd_state_names[r->state] : "unknown";
        rd_out_mem(cn, st, strlen(st));
        rd_out_lit(cn, "\",\"load\":");
        if (cn->rk[i].load_known)
            rd_out_real(cn, cn->rk[i].load);
        else
            rd_out_lit(cn, "null");
        if (cn->rk[i].over_cap)
            rd_out_lit(cn, ",\"over_cap\":true}");
        else
            rd_out_lit(cn, ",\"over_cap\":false}");
    }
    rd_out_lit(cn, "],\"view\":");
    if (view == KVP_ROUTER_VIEW_REDIS)
        rd_out_lit(cn, "\"redis\"");
    else
        rd_out_lit(cn, "\"local\"");
    if (d->redis.url != NULL) {
        if (view == KVP_ROUTER_VIEW_FALLBACK)
            rd_out_lit(cn, ",\"fallback\":true");
        else
            rd_out_lit(cn, ",\"fallback\":false");
    }
    rd_out_lit(cn, "}");
    return rd_answer(cn, MHD_HTTP_OK, "application/json");
}

/* A /score in text mode (rd_req.h): its tokens from the text (rd_text_tokens), then
 * rd_score; counted in the text families of /metrics. */
static int rd_score_text(rd_daemon *d, rd_conn *cn)
{
    char err[512];
    rd_text_scratch *ts = cn->txt;
    unsigned status = rd_text_tokens(d->text, &ts, &cn->req, err, sizeof err);
    cn->txt = ts;
    pthread_mutex_lock(&d->lock);
    if (status != 0)
        d->n_text_failed++;
    else {
        d->n_text_scored++;
        d->n_text_tokens += cn->req.n_tokens;
    }
    pthread_mutex_unlock(&d->lock);
    if (status != 0)
        return rd_error(d, cn, status, err);
    return rd_score(d, cn);
}

/* A scanner result other than RD_REQ_MORE / RD_REQ_DONE as an answer. */
static int rd_req_refused(rd_daemon *d, rd_conn *cn, int rc)
{
    if (cn->req.text) {
        pthread_mutex_lock(&d->lock);
        d->n_text_failed++;
        pthread_mutex_unlock(&d->lock);
    }
    rd_req_trim(&cn->req, RD_KEEP_TOKEN_BYTES); /* the budget back now, not at the body's end */
    if (rc == RD_REQ_BUSY)
        return rd_error(d, cn, MHD_HTTP_SERVICE_UNAVAILABLE,
                        "the daemon holds --body-budget of request bodies: retry later");
    if (rc == RD_REQ_NOMEM)
        return rd_error(d, cn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
    return rd_error(d, cn, MHD_HTTP_BAD_REQUEST, cn->req.err);
}

/* GET /metrics. */
static int rd_metrics(rd_daemon *d, rd_conn *cn)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (f == NULL)
        return rd_error(d, cn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
    int rc = rd_metrics_write(d, f);
    if (fclose(f) != 0 || rc != 0) {
        free(buf);
        return rd_error(d, cn, MHD_HTTP_INTERNAL_SERVER_ERROR, "metrics unavailable");
    }
    cn->out_n = 0;
    rd_out_mem(cn, buf, n);
    free(buf);
    return rd_answer(cn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8");
}

/* A JSON value as the answer (consumes v). */
static int rd_json(rd_daemon *d, rd_conn *cn, json_t *v)
{
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (s == NULL)
        return rd_error(d, cn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
    cn->out_n = 0;
    rd_out_mem(cn, s, strlen(s));
    free(s);
    return rd_answer(cn, MHD_HTTP_OK, "application/json");
}

/* GET /healthz. */
static int rd_health(rd_daemon *d, rd_conn *cn)
{
    kvp_router_stats st;
    if (kvp_router_stats_get(d->router, &st) != KVP_OK)
        return rd_error(d, cn, MHD_HTTP_INTERNAL_SERVER_ERROR, "stats unavailable");
    bool shared = st.redis && st.redis_up;
    bool tokens = d->index_by == KVP_ROUTER_INDEX_TOKENS;
    json_t *v = json_pack("{ss sI sI ss ss}", "status", "ok", "workers", (json_int_t)st.n_workers,
                          "stale", (json_int_t)st.n_stale, "view", shared ? "redis" : "local",
                          "index", tokens ? "tokens" : "engine-hash");
    if (v && st.redis)
        json_object_set_new(v, "redis", json_string(st.redis_up ? "up" : "down"));
    /* Engine-hash mode: every worker whose keys the router could not reproduce. */
    json_t *mm = tokens ? NULL : json_object();
    pthread_mutex_lock(&d->lock);
    for (size_t i = 0; mm && i < d->n_workers; i++) {
        const rd_worker *w = d->workers[i];
        if (w->n_key_mismatch == 0)
            continue;
        char key[RD_NAME_MAX + 32];
        snprintf(key, sizeof key, "%s/%" PRId64, w->engine, w->dp_rank);
        json_object_set_new(mm, key,
                            json_pack("{sI sI ss}", "mismatched", (json_int_t)w->n_key_mismatch,
                                      "checked", (json_int_t)w->n_key_checked, "likely",
                                      w->key_likely ? w->key_likely : "unknown"));
    }
    pthread_mutex_unlock(&d->lock);
    if (v && mm)
        json_object_set_new(v, "key_mismatch", mm);
    else
        json_decref(mm);
    return rd_json(d, cn, v);
}

int rd_http_begin(rd_daemon *d, rd_conn *cn, const char *method, const char *url, const char *ctype,
                  const char *clen, int64_t now_ms)
{
    cn->answered = false;
    cn->sent = false;
    cn->out_failed = false;
    cn->kind = RD_K_NONE;
    cn->body_bytes = 0;
    cn->busy_ns = 0;
    cn->deadline_ms = now_ms + (int64_t)d->lim.request_timeout_ms;
    bool post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    bool get =
        strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    if (post && strcmp(url, "/score") == 0) {
        if (clen != NULL) {
            char *end = NULL;
            unsigned long long v = strtoull(clen, &end, 10);
            if (end == clen || *end != '\0')
                return rd_error(d, cn, MHD_HTTP_BAD_REQUEST,
                                "a Content-Length that is not a number");
            if (v > d->max_body_bytes)
                return rd_error(d, cn, MHD_HTTP_CONTENT_TOO_LARGE, "the body is above --max-body");
        }
        bool binary = ctype && strncmp(ctype, "application/octet-stream", 24) == 0;
        rd_req_reset(&cn->req, &d->lim.body_budget, binary);
        cn->kind = RD_K_SCORE;
        return RD_NEXT_BODY;
    }
    if (post && strcmp(url, "/load") == 0) {
        if (clen != NULL) {
            char *end = NULL;
            unsigned long long v = strtoull(clen, &end, 10);
            if (end == clen || *end != '\0')
                return rd_error(d, cn, MHD_HTTP_BAD_REQUEST,
                                "a Content-Length that is not a number");
            if (v > d->max_body_bytes)
                return rd_error(d, cn, MHD_HTTP_CONTENT_TOO_LARGE, "the body is above --max-body");
        }
        cn->load_n = 0;
        cn->kind = RD_K_LOAD;
        return RD_NEXT_BODY;
    }
    if (get && strcmp(url, "/metrics") == 0)
        return rd_metrics(d, cn);
    if (get && strcmp(url, "/healthz") == 0)
        return rd_health(d, cn);
    if (strcmp(url, "/score") == 0 || strcmp(url, "/metrics") == 0 ||
        strcmp(url, "/healthz") == 0 || strcmp(url, "/load") == 0)
        return rd_error(d, cn, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed");
    return rd_error(d, cn, MHD_HTTP_NOT_FOUND,
                    "not found (POST /score, POST /load, GET /metrics, GET /healthz)");
}

int rd_http_arg(rd_daemon *d, rd_conn *cn, const char *key, const char *value)
{
    if (cn->answered || cn->kind != RD_K_SCORE)
        return cn->answered ? RD_NEXT_REPLY : RD_NEXT_BODY;
    int rc = rd_req_arg(&cn->req, key, value);
    return rc == RD_REQ_MORE ? RD_NEXT_BODY : rd_req_refused(d, cn, rc);
}

/* Give back the POST /load body (to the allocator and the budget). Cannot fail. */
static void rd_load_body_free(rd_conn *cn)
{
    if (cn->load_cap && cn->load_budget)
        atomic_fetch_sub(&cn->load_budget->used, cn->load_cap);
    free(cn->load_body);
    cn->load_body = NULL;
    cn->load_n = cn->load_cap = 0;
}

/* Append n bytes of a POST /load body, growing it geometrically within the body budget.
 * Returns RD_NEXT_BODY or RD_NEXT_REPLY (refused: 503 budget, 500 memory). */
static int rd_load_body_add(rd_daemon *d, rd_conn *cn, const char *data, size_t n)
{
    if (n > cn->load_cap - cn->load_n) {
        size_t cap = cn->load_cap ? cn->load_cap : 4096;
        while (cap - cn->load_n < n)
            cap *= 2;
        size_t add = cap - cn->load_cap;
        rd_budget *b = &d->lim.body_budget;
        size_t prev = atomic_fetch_add(&b->used, add);
        if (b->limit && prev + add > b->limit) {
            atomic_fetch_sub(&b->used, add);
            rd_load_body_free(cn);
            return rd_error(d, cn, MHD_HTTP_SERVICE_UNAVAILABLE,
                            "the daemon holds --body-budget of request bodies: retry later");
        }
        char *p = realloc(cn->load_body, cap);
        if (p == NULL) {
            atomic_fetch_sub(&b->used, add);
            rd_load_body_free(cn);
            return rd_error(d, cn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
        }
        cn->load_body = p;
        cn->load_cap = cap;
        cn->load_budget = b;
    }
    memcpy(cn->load_body + cn->load_n, data, n);
    cn->load_n += n;
    return RD_NEXT_BODY;
}

/* POST /load's body ended: rd_load_push. Returns RD_NEXT_REPLY. */
static int rd_load_end(rd_daemon *d, rd_conn *cn)
{
    char err[256];
    int rc = rd_load_push(d, cn->load_body ? cn->load_body : "", cn->load_n, err, sizeof err);
    rd_load_body_free(cn);
    if (rc)
        return rd_error(d, cn, MHD_HTTP_BAD_REQUEST, err);
    cn->out_n = 0;
    rd_out_lit(cn, "{\"status\":\"ok\"}");
    return rd_answer(cn, MHD_HTTP_OK, "application/json");
}

int rd_http_body(rd_daemon *d, rd_conn *cn, const char *data, size_t n, int64_t now_ms)
{
    if (cn->answered)
        return RD_NEXT_REPLY;
    if (cn->kind != RD_K_SCORE && cn->kind != RD_K_LOAD)
        return RD_NEXT_BODY; /* a GET's body: ignored */
    if (now_ms > cn->deadline_ms)
        return rd_timeout(d, cn);
    if (n > d->max_body_bytes - cn->body_bytes) {
        rd_load_body_free(cn);
        return rd_error(d, cn, MHD_HTTP_CONTENT_TOO_LARGE, "the body is above --max-body");
    }
    cn->body_bytes += n;
    if (cn->kind == RD_K_LOAD)
        return rd_load_body_add(d, cn, data, n);
    uint64_t t0 = rd_now_ns();
    int rc = rd_req_feed(&cn->req, data, n);
    cn->busy_ns += rd_now_ns() - t0;
    return rc == RD_REQ_MORE ? RD_NEXT_BODY : rd_req_refused(d, cn, rc);
}

int rd_http_end(rd_daemon *d, rd_conn *cn, int64_t now_ms)
{
    if (cn->answered)
        return RD_NEXT_REPLY;
    if (cn->kind != RD_K_SCORE && cn->kind != RD_K_LOAD)
        return rd_error(d, cn, MHD_HTTP_INTERNAL_SERVER_ERROR, "no request in progress");
    if (now_ms > cn->deadline_ms) {
        rd_load_body_free(cn);
        return rd_timeout(d, cn);
    }
    if (cn->kind == RD_K_LOAD)
        return rd_load_end(d, cn);
    uint64_t t0 = rd_now_ns();
    int rc = rd_req_finish(&cn->req);
    int next = rc == RD_REQ_DONE && cn->req.text ? rd_score_text(d, cn)
               : rc == RD_REQ_DONE               ? rd_score(d, cn)
                                                 : rd_req_refused(d, cn, rc);
    cn->busy_ns += rd_now_ns() - t0;
    if (cn->status == MHD_HTTP_OK)
        rd_hist_add(&d->score_hist, RD_HIST_SCORE, cn->busy_ns);
    return next;
}

void rd_http_done(rd_conn *cn)
{
    rd_req_trim(&cn->req, RD_KEEP_TOKEN_BYTES);
    rd_text_scratch *ts = cn->txt;
    rd_text_scratch_trim(&ts, RD_KEEP_OUT_BYTES);
    cn->txt = ts;
    rd_load_body_free(cn);
    if (cn->out_cap > RD_KEEP_OUT_BYTES) {
        free(cn->out);
        cn->out = NULL;
        cn->out_cap = 0;
    }
    cn->out_n = 0;
    cn->kind = RD_K_NONE;
    cn->answered = false;
}

void rd_conn_free(rd_conn *cn)
{
    if (cn == NULL)
        return;
    rd_req_trim(&cn->req, 0);
    rd_text_scratch *ts = cn->txt;
    rd_text_scratch_trim(&ts, 0);
    rd_load_body_free(cn);
    free(cn->out);
    free(cn->rows);
    free(cn->ids);
    free(cn->rk);
    free(cn);
}

/* libmicrohttpd's side ---------------------------------------------------------------- */

/* Queue cn's answer on c. */
static enum MHD_Result rd_send(struct MHD_Connection *c, rd_conn *cn)
{
    static char oom[] = "{\"error\":\"out of memory\"}";
    bool fixed = cn->out_n == 0 && cn->status == MHD_HTTP_INTERNAL_SERVER_ERROR;
    struct MHD_Response *r =
        fixed ? MHD_create_response_from_buffer(sizeof oom - 1, oom, MHD_RESPMEM_PERSISTENT)
              : MHD_create_response_from_buffer(cn->out_n, cn->out, MHD_RESPMEM_MUST_COPY);
    if (r == NULL)
        return MHD_NO;
    cn->sent = true;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, cn->type);
    enum MHD_Result ret = MHD_queue_response(c, cn->status, r);
    MHD_destroy_response(r);
    return ret;
}

/* One query argument to rd_http_arg (stops at the first refusal). */
static enum MHD_Result rd_arg_iter(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value)
{
    void **dc = cls;
    (void)kind;
    return rd_http_arg(dc[0], dc[1], key, value) == RD_NEXT_BODY ? MHD_YES : MHD_NO;
}

static enum MHD_Result rd_handler(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    rd_daemon *d = cls;
    (void)version;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    rd_conn *cn = ci ? ci->socket_context : NULL;
    if (cn == NULL)
        return MHD_NO;
    if (*con_cls == NULL) {
        *con_cls = cn;
        int next = rd_http_begin(
            d, cn, method, url,
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE),
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH),
            rd_now_ms());
        if (next == RD_NEXT_BODY) {
            void *dc[2] = {d, cn};
            MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, rd_arg_iter, dc);
        }
        /* Answered at the next call, never this one: libmicrohttpd closes a connection
         * whose answer is queued before the request was read whole (no keep-alive), and a
         * POST refused by its head still has its body coming (read into nothing). */
        return MHD_YES;
    }
    if (cn->sent)
        return MHD_YES;
    /* libmicrohttpd 0.9.75 cannot answer in the middle of an upload: a body refused part way
     * is read to its end into nothing (its deadline still holds), then answered. */
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        int64_t now = rd_now_ms();
        if (cn->answered)
            return now > cn->deadline_ms ? (rd_timeout(d, cn), MHD_NO) : MHD_YES;
        return rd_http_body(d, cn, upload_data, n, now) == RD_NEXT_CLOSE ? MHD_NO : MHD_YES;
    }
    if (rd_http_end(d, cn, rd_now_ms()) == RD_NEXT_CLOSE)
        return MHD_NO;
    return rd_send(c, cn);
}

/* A request ended: trim the connection's buffers. */
static void rd_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    (void)toe;
    if (*con_cls)
        rd_http_done(*con_cls);
    *con_cls = NULL;
}

/* A connection opened (its rd_conn allocated) or closed (freed). */
static void rd_conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                           enum MHD_ConnectionNotificationCode toe)
{
    (void)cls;
    (void)c;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        *socket_context = calloc(1, sizeof(rd_conn));
    } else {
        rd_conn_free(*socket_context);
        *socket_context = NULL;
    }
}

/* libmicrohttpd's own messages ("Connection was closed by remote side...": one per dropped
 * client, so a hostile client could flood the log): through rd_log, at most one line per
 * 10 s, with the count of those left out. */
static void rd_mhd_log(void *cls, const char *fmt, va_list ap)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static int64_t last_ms;
    static uint64_t n_quiet;
    (void)cls;
    char msg[256];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    pthread_mutex_lock(&mu);
    int64_t now = rd_now_ms();
    bool log = last_ms == 0 || now - last_ms >= 10000;
    uint64_t quiet = n_quiet;
    if (log) {
        last_ms = now;
        n_quiet = 0;
    } else {
        n_quiet++;
    }
    pthread_mutex_unlock(&mu);
    if (log)
        rd_logl(RD_LOG_WARN,
                "http: %s (%" PRIu64 " such messages left out before; at most one every 10 s)", msg,
                quiet);
}

int rd_http_start(rd_daemon *d, const char *addr, uint16_t port, unsigned n_threads, void **handle,
                  uint16_t *bound_port, char *err, size_t err_size)
{
    /* An IPv4 or IPv6 literal (rd_listen_parse has taken the brackets off). */
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *sa = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *sa6 = (struct sockaddr_in6 *)&ss;
    unsigned v6 = 0;
    if (inet_pton(AF_INET, addr, &sa->sin_addr) == 1) {
        sa->sin_family = AF_INET;
        sa->sin_port = htons(port);
    } else if (inet_pton(AF_INET6, addr, &sa6->sin6_addr) == 1) {
        sa6->sin6_family = AF_INET6;
        sa6->sin6_port = htons(port);
        v6 = MHD_USE_IPv6;
    } else {
        cli_errf(err, err_size, "--listen: '%s' is not an IPv4 or IPv6 address", addr);
        return 1;
    }
    struct MHD_Daemon *h = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG | v6, port, NULL, NULL,
        rd_handler, d, MHD_OPTION_EXTERNAL_LOGGER, rd_mhd_log, d, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&ss, MHD_OPTION_THREAD_POOL_SIZE, n_threads,
        MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_CONNECTION_LIMIT, d->lim.max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, d->lim.per_ip_connections,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)RD_CONN_MEMORY, MHD_OPTION_NOTIFY_COMPLETED,
        rd_completed, d, MHD_OPTION_NOTIFY_CONNECTION, rd_conn_notify, d, MHD_OPTION_END);
    if (h == NULL) {
        cli_errf(err, err_size,
                 "cannot listen on %s%s%s:%u (in use, or not an address of this "
                 "machine)",
                 v6 ? "[" : "", addr, v6 ? "]" : "", (unsigned)port);
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h, MHD_DAEMON_INFO_BIND_PORT);
    *bound_port = info ? info->port : port;
    *handle = h;
    return 0;
}

void rd_http_stop(void *handle)
{
    if (handle)
        MHD_stop_daemon(handle);
}
