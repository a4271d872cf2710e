/*
 * rd_http.c - the HTTP side of `kvprefix router`, served by libmicrohttpd (a thread pool of
 * --http-threads threads, each with its own poll loop; connections time out after 10 s):
 *
 *   POST /score    {"tokens": [ids...], "model": S, "lora": S, "salt": S, "tenant": S}
 *                  -> {"prompt_tokens": N, "block_size": B, "workers": [{"engine", "dp_rank",
 *                      "blocks", "tokens", "weighted", "state"}, ...], "view": V}
 *                  ranked best first: weighted score, then blocks, then engine id, dp rank.
 *                  V is "redis" when the shared store answered, "local" when the daemon's
 *                  own index did (always without --redis); with --redis, "fallback": true
 *                  says that the local view answered because Redis failed or was in its
 *                  retry pause (false otherwise).
 *                  Each row also has "load" (requests running + waiting, null when unknown)
 *                  and "over_cap"; "workers": [...] limits the rows to those candidates and
 *                  "loads": {NAME: LOAD} gives loads for this request (rd_load.c ranks).
 *   POST /load     {"engine", "dp_rank", "running", "waiting", "kv_usage"} or {"loads":
 *                  [...]}: a worker's load pushed by a gateway (rd_load_push)
 *   GET /metrics   Prometheus text format 0.0.4 (rd_metrics_write)
 *   GET /healthz   {"status": "ok", "workers": N, "stale": M, "view": V} (+ "redis": "up" or
 *                  "down" with --redis); 200 whichever view scores.
 *
 * Bodies are read whole into memory up to --max-body (default 16 MiB; more: 413). Every
 * error answers with a JSON body {"error": "..."} and a 4xx/5xx status. Scoring calls
 * kvp_router_score_v2 concurrently from the pool's threads (the index is thread-safe). The
 * call itself says which view answered it (kvp_router_score_result.view: no counter read
 * around it, so concurrent requests cannot blur it) and hands each row's engine id (owned
 * by the router until kvp_router_free, valid even if the worker is removed meanwhile), so
 * ranking a row needs no look-up in the daemon's worker table; rd_daemon.lock is taken
 * only to count the lookup.
 */
#include <inttypes.h>
#include <jansson.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "cli.h"
#include "routerd.h"

/* One POST body being received (the connection's context). */
typedef struct rd_body {
    char *data;     /* bytes so far */
    size_t n;       /* bytes stored */
    size_t cap;     /* capacity of data */
    bool too_big;   /* more than max_body_bytes arrived: the rest is discarded */
    bool no_memory; /* the buffer could not grow */
} rd_body;

static const char *const rd_state_names[] = {"scored", "stale", "model", "notsup", "token"};

/* Queue a response of status with body[0 .. n) (copied) and its content type. */
static enum MHD_Result rd_reply(struct MHD_Connection *c, unsigned status, const char *type,
                                char *body, size_t n)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_COPY);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* A JSON value as the response (consumes v). */
static enum MHD_Result rd_reply_json(struct MHD_Connection *c, unsigned status, json_t *v)
{
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (s == NULL) {
        static char oom[] = "{\"error\":\"out of memory\"}";
        return rd_reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "application/json", oom, sizeof oom - 1);
    }
    enum MHD_Result ret = rd_reply(c, status, "application/json", s, strlen(s));
    free(s);
    return ret;
}

/* An error response {"error": why}; counted. */
static enum MHD_Result rd_reply_error(rd_daemon *d, struct MHD_Connection *c, unsigned status,
                                      const char *why)
{
    pthread_mutex_lock(&d->lock);
    d->n_http_errors++;
    pthread_mutex_unlock(&d->lock);
    return rd_reply_json(c, status, json_pack("{ss}", "error", why));
}

/* A namespace field from member key of req: absent/null, or a string. Returns false when
 * it is another type. */
static bool rd_ns_field(json_t *req, const char *key, kvp_field *out)
{
    json_t *v = json_object_get(req, key);
    if (v == NULL || json_is_null(v))
        return true;
    if (!json_is_string(v))
        return false;
    out->ptr = json_string_value(v);
    out->len = json_string_length(v);
    return true;
}

/* Parse a /score body into ns and a malloc'd token array. Returns NULL on success or a
 * static description of what is wrong. */
static const char *rd_parse_score(json_t *req, kvp_namespace *ns, uint32_t **tokens, size_t *n)
{
    static const char *const keys[] = {"tokens", "model",   "lora", "salt",
                                       "tenant", "workers", "loads"};
    const char *key;
    json_t *v;
    if (!json_is_object(req))
        return "the body is not a JSON object";
    json_object_foreach(req, key, v)
    {
        bool known = false;
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            known = known || strcmp(key, keys[i]) == 0;
        if (!known)
            return "unknown member (tokens, model, lora, salt, tenant, workers, loads)";
    }
    kvp_namespace_init(ns);
    if (!rd_ns_field(req, "model", &ns->model) || !rd_ns_field(req, "lora", &ns->adapter) ||
        !rd_ns_field(req, "salt", &ns->salt) || !rd_ns_field(req, "tenant", &ns->tenant))
        return "model, lora, salt and tenant must be strings or null";
    json_t *t = json_object_get(req, "tokens");
    if (!json_is_array(t))
        return "tokens must be an array of token ids";
    size_t count = json_array_size(t);
    uint32_t *ids = malloc((count ? count : 1) * sizeof *ids);
    if (ids == NULL)
        return "out of memory";
    for (size_t i = 0; i < count; i++) {
        json_t *e = json_array_get(t, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 ||
            json_integer_value(e) > UINT32_MAX) {
            free(ids);
            return "tokens must be integers in 0..4294967295";
        }
        ids[i] = (uint32_t)json_integer_value(e);
    }
    *tokens = ids;
    *n = count;
    return NULL;
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

/* Score tokens in ns: the rows for every worker, ranked best first, into *out (malloc'd),
 * *n_out of them, and the view that answered into *view (KVP_ROUTER_VIEW_*). Returns
 * KVP_OK or the router's code. */
static int rd_score_rows(rd_daemon *d, const kvp_namespace *ns, const uint32_t *tokens,
                         size_t n_tokens, rd_rank **out, size_t *n_out, int *view)
{
    size_t cap = 16, n = 0;
    for (;;) {
        kvp_router_row *rows = malloc(cap * sizeof *rows);
        const char **ids = malloc(cap * sizeof *ids);
        rd_rank *rk = malloc(cap * sizeof *rk);
        if (rows == NULL || ids == NULL || rk == NULL) {
            free(rows);
            free(ids);
            free(rk);
            return KVP_ENOMEM;
        }
        kvp_router_score_result res;
        kvp_router_score_result_init(&res);
        res.engine_ids = ids;
        int rc = kvp_router_score_v2(d->router, ns, tokens, n_tokens, rows, cap, &n, &res);
        if (rc == KVP_OK) {
            for (size_t i = 0; i < n; i++)
                rk[i] = (rd_rank){.row = rows[i], .engine = ids[i]};
            qsort(rk, n, sizeof *rk, rd_rank_cmp);
            *out = rk;
            *n_out = n;
            *view = res.view;
        }
        free(rows);
        free(ids);
        if (rc == KVP_OK)
            return KVP_OK;
        free(rk);
        if (rc != KVP_ENOSPC)
            return rc;
        cap = n + 16;
    }
}

/* The load-aware fields of a /score row (rd_rank_rows): "load" (null when unknown) and
 * "over_cap". */
static void rd_rank_json(json_t *row, const rd_rank *rk)
{
    if (row == NULL)
        return;
    json_object_set_new(row, "load", rk->load_known ? json_real(rk->load) : json_null());
    json_object_set_new(row, "over_cap", json_boolean(rk->over_cap));
}

/* Build the /score answer from the ranked rows rk[0 .. n); counts the lookup. Returns NULL
 * on ENOMEM. */
static json_t *rd_score_json(rd_daemon *d, const rd_rank *rk, size_t n, size_t n_tokens, int view)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        const kvp_router_row *r = &rk[i].row;
        json_t *row = json_pack("{ss sI sI sI sf ss}", "engine", rk[i].engine, "dp_rank",
                                (json_int_t)r->dp_rank, "blocks", (json_int_t)r->n_blocks, "tokens",
                                (json_int_t)r->n_tokens, "weighted", r->score, "state",
                                rd_state_names[r->state]);
        rd_rank_json(row, &rk[i]);
        json_array_append_new(arr, row);
    }
    pthread_mutex_lock(&d->lock);
    d->n_lookups++;
    d->n_lookup_blocks += n_tokens / d->hash.block_size;
    d->n_hit_blocks += n ? rk[0].row.n_blocks : 0;
    pthread_mutex_unlock(&d->lock);
    if (arr == NULL)
        return NULL;
    json_t *out = json_pack("{sI sI so ss}", "prompt_tokens", (json_int_t)n_tokens, "block_size",
                            (json_int_t)d->hash.block_size, "workers", arr, "view",
                            view == KVP_ROUTER_VIEW_REDIS ? "redis" : "local");
    if (out && d->redis.url != NULL)
        json_object_set_new(out, "fallback", json_boolean(view == KVP_ROUTER_VIEW_FALLBACK));
    return out;
}

/* POST /score with body b. */
static enum MHD_Result rd_handle_score(rd_daemon *d, struct MHD_Connection *c, rd_body *b)
{
    if (b->too_big)
        return rd_reply_error(d, c, MHD_HTTP_CONTENT_TOO_LARGE, "the body is above --max-body");
    if (b->no_memory)
        return rd_reply_error(d, c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
    json_error_t jerr;
    json_t *req = json_loadb(b->data ? b->data : "", b->n, JSON_REJECT_DUPLICATES, &jerr);
    if (req == NULL)
        return rd_reply_error(d, c, MHD_HTTP_BAD_REQUEST, "the body is not valid JSON");
    kvp_namespace ns;
    uint32_t *tokens = NULL;
    size_t n_tokens = 0;
    rd_score_opts opts;
    const char *why = rd_parse_score(req, &ns, &tokens, &n_tokens);
    const char *why_opts = why ? NULL : rd_score_opts_json(req, &opts);
    if (why || why_opts) {
        if (why_opts)
            rd_score_opts_free(&opts);
        free(tokens);
        json_decref(req);
        return rd_reply_error(d, c, MHD_HTTP_BAD_REQUEST, why ? why : why_opts);
    }
    rd_rank *rk = NULL;
    size_t n = 0;
    int view = 0;
    int rc = rd_score_rows(d, &ns, tokens, n_tokens, &rk, &n, &view);
    if (rc == KVP_OK)
        rc = rd_rank_rows(d, &opts, n_tokens / d->hash.block_size, rk, &n);
    json_t *out = rc == KVP_OK ? rd_score_json(d, rk, n, n_tokens, view) : NULL;
    rd_score_opts_free(&opts);
    free(rk);
    free(tokens);
    json_decref(req);
    if (rc != KVP_OK)
        return rd_reply_error(
            d, c, rc == KVP_ENOMEM ? MHD_HTTP_INTERNAL_SERVER_ERROR : MHD_HTTP_BAD_REQUEST,
            kvp_strerror(rc));
    if (out == NULL)
        return rd_reply_error(d, c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
    return rd_reply_json(c, MHD_HTTP_OK, out);
}

/* POST /load with body b (rd_load_push). */
static enum MHD_Result rd_handle_load(rd_daemon *d, struct MHD_Connection *c, rd_body *b)
{
    if (b->too_big)
        return rd_reply_error(d, c, MHD_HTTP_CONTENT_TOO_LARGE, "the body is above --max-body");
    if (b->no_memory)
        return rd_reply_error(d, c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
    char err[256];
    if (rd_load_push(d, b->data, b->n, err, sizeof err))
        return rd_reply_error(d, c, MHD_HTTP_BAD_REQUEST, err);
    return rd_reply_json(c, MHD_HTTP_OK, json_pack("{ss}", "status", "ok"));
}

/* GET /metrics. */
static enum MHD_Result rd_handle_metrics(rd_daemon *d, struct MHD_Connection *c)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (f == NULL)
        return rd_reply_error(d, c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
    int rc = rd_metrics_write(d, f);
    if (fclose(f) != 0 || rc != 0) {
        free(buf);
        return rd_reply_error(d, c, MHD_HTTP_INTERNAL_SERVER_ERROR, "metrics unavailable");
    }
    enum MHD_Result ret =
        rd_reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", buf, n);
    free(buf);
    return ret;
}

/* GET /healthz. */
static enum MHD_Result rd_handle_health(rd_daemon *d, struct MHD_Connection *c)
{
    kvp_router_stats st;
    if (kvp_router_stats_get(d->router, &st) != KVP_OK)
        return rd_reply_error(d, c, MHD_HTTP_INTERNAL_SERVER_ERROR, "stats unavailable");
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
    return rd_reply_json(c, MHD_HTTP_OK, v);
}

/* Append one upload chunk to b (or discard it once b is too big). */
static void rd_body_append(rd_daemon *d, rd_body *b, const char *data, size_t n)
{
    if (b->too_big || b->no_memory)
        return;
    if (n > d->max_body_bytes - b->n) {
        b->too_big = true;
        return;
    }
    if (!cli_grow((void **)&b->data, &b->cap, b->n + n, 1)) {
        b->no_memory = true;
        return;
    }
    memcpy(b->data + b->n, data, n);
    b->n += n;
}

static enum MHD_Result rd_handler(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    rd_daemon *d = cls;
    bool post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    bool get =
        strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    bool load = post && strcmp(url, "/load") == 0;
    if (load || (post && strcmp(url, "/score") == 0)) {
        if (*con_cls == NULL) {
            rd_body *b = calloc(1, sizeof *b);
            if (b == NULL)
                return MHD_NO;
            *con_cls = b;
            return MHD_YES;
        }
        rd_body *b = *con_cls;
        if (*upload_data_size) {
            rd_body_append(d, b, upload_data, *upload_data_size);
            *upload_data_size = 0;
            return MHD_YES;
        }
        return load ? rd_handle_load(d, c, b) : rd_handle_score(d, c, b);
    }
    if (get && strcmp(url, "/metrics") == 0)
        return rd_handle_metrics(d, c);
    if (get && strcmp(url, "/healthz") == 0)
        return rd_handle_health(d, c);
    if (strcmp(url, "/score") == 0 || strcmp(url, "/metrics") == 0 ||
        strcmp(url, "/healthz") == 0 || strcmp(url, "/load") == 0)
        return rd_reply_error(d, c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed");
    return rd_reply_error(d, c, MHD_HTTP_NOT_FOUND,
                          "not found (POST /score, POST /load, GET /metrics, "
                          "GET /healthz)");
}

/* Free a connection's body when the request ends. */
static void rd_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    rd_body *b = *con_cls;
    if (b) {
        free(b->data);
        free(b);
    }
    *con_cls = NULL;
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
        rd_handler, d, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_THREAD_POOL_SIZE,
        n_threads, MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_CONNECTION_LIMIT, 256u,
        MHD_OPTION_NOTIFY_COMPLETED, rd_completed, d, MHD_OPTION_END);
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
