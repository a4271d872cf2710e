/*
 * rd_load.c - what `kvprefix router` knows of each worker's load, and the load-aware
 * ranking of a /score answer (docs/routing.md, "Load-aware ranking").
 *
 * The table holds one entry per (engine id, dp rank) ever given a load, by the scrape
 * thread (rd_scrape.c: the engine's own Prometheus figures) or by POST /load (a gateway
 * that counts its in-flight requests). The newest figures win, whatever their source.
 *
 *   rd_loads: lock ── entries[0 .. n): {engine, dp_rank, running, waiting, kv_usage,
 *                                       at_ms, source}
 *
 * A worker's load is running + waiting requests: the work already queued on it, in
 * requests (vLLM's num_requests_running + num_requests_waiting, SGLang's num_running_reqs +
 * num_queue_reqs). KV usage is kept and shown (/metrics, /score rows) but not ranked with:
 * a full pool evicts, it does not queue. A load older than --load-ttl is unknown, and an
 * unknown load ranks as 0 (a worker nobody reports on is not avoided).
 *
 * rd_rank_rows turns the rows of one score into kvp_router_rank inputs (cached = the
 * tier-weighted score, load as above, or the request's own "loads" when given) and applies
 * its order: the same function `kvprefix fleet` ranks its replicas with.
 *
 * Invariants: n <= cap <= RD_MAX_LOADS; (engine, dp_rank) unique; every figure finite and
 * >= 0 (kv_usage may be -1: unknown). Entries are never removed. Cost: a look-up is a scan
 * of the entries (the fleets this daemon serves have at most a few hundred workers); a
 * /score does one per row under the table's lock.
 */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "flags.h"
#include "routerd.h"

/* Most workers the table keeps figures for: beyond, new ones are refused. */
#define RD_MAX_LOADS 4096u

/* One worker's figures. */
typedef struct rd_load {
    char *engine;    /* engine id (owned) */
    int64_t dp_rank; /* its data-parallel rank */
    double running;  /* requests running */
    double waiting;  /* requests queued */
    double kv_usage; /* KV pool usage 0..1, or -1 when the source did not say */
    int64_t at_ms;   /* when learned (rd_now_ms) */
    int source;      /* RD_LOAD_* */
} rd_load;

struct rd_loads {
    pthread_mutex_t lock;            /* guards everything below */
    rd_load *entries;                /* n entries */
    size_t n;                        /* entries used */
    size_t cap;                      /* capacity of entries */
    uint64_t n_set[RD_LOAD_SOURCES]; /* updates received, by source */
    uint64_t n_refused;              /* updates refused (table full, out of memory) */
};

int rd_loads_new(rd_daemon *d)
{
    rd_loads *t = calloc(1, sizeof *t);
    if (t == NULL)
        return 1;
    pthread_mutex_init(&t->lock, NULL);
    d->loads = t;
    return 0;
}

void rd_loads_free(rd_loads *t)
{
    if (t == NULL)
        return;
    for (size_t i = 0; i < t->n; i++)
        free(t->entries[i].engine);
    free(t->entries);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

/* The entry of (engine, dp_rank), or NULL. Caller holds t->lock. */
static rd_load *rd_load_find_locked(rd_loads *t, const char *engine, int64_t dp_rank)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->entries[i].dp_rank == dp_rank && strcmp(t->entries[i].engine, engine) == 0)
            return &t->entries[i];
    return NULL;
}

int rd_load_set(rd_daemon *d, const char *engine, int64_t dp_rank, double running, double waiting,
                double kv_usage, int source)
{
    rd_loads *t = d->loads;
    pthread_mutex_lock(&t->lock);
    rd_load *e = rd_load_find_locked(t, engine, dp_rank);
    if (e == NULL && t->n < RD_MAX_LOADS &&
        cli_grow((void **)&t->entries, &t->cap, t->n + 1, sizeof *t->entries)) {
        size_t len = strlen(engine) + 1;
        char *copy = malloc(len);
        if (copy) {
            memcpy(copy, engine, len);
            e = &t->entries[t->n++];
            *e = (rd_load){.engine = copy, .dp_rank = dp_rank};
        }
    }
    if (e == NULL) {
        t->n_refused++;
        pthread_mutex_unlock(&t->lock);
        return 1;
    }
    e->running = running;
    e->waiting = waiting;
    e->kv_usage = kv_usage;
    e->at_ms = rd_now_ms();
    e->source = source;
    t->n_set[source]++;
    pthread_mutex_unlock(&t->lock);
    return 0;
}

/* A figure of a pushed object: a number >= 0 (kv_usage: 0..1), or absent when optional.
 * Returns false when it is wrong. */
static bool rd_push_num(json_t *o, const char *key, bool optional, double max, double *out)
{
    json_t *v = json_object_get(o, key);
    if (v == NULL || json_is_null(v))
        return optional;
    if (!json_is_number(v))
        return false;
    double x = json_number_value(v);
    if (!isfinite(x) || x < 0.0 || x > max)
        return false;
    *out = x;
    return true;
}

/* One pushed object. Returns 0, or non-zero with err. */
static int rd_push_one(rd_daemon *d, json_t *o, char *err, size_t err_size)
{
    static const char *const keys[] = {"engine", "dp_rank", "running", "waiting", "kv_usage"};
    const char *key;
    json_t *v;
    if (!json_is_object(o)) {
        cli_errf(err, err_size,
                 "a load is an object {\"engine\", \"dp_rank\", \"running\", "
                 "\"waiting\", \"kv_usage\"}");
        return 1;
    }
    json_object_foreach(o, key, v)
    {
        bool known = false;
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            known = known || strcmp(key, keys[i]) == 0;
        if (!known) {
            cli_errf(err, err_size, "unknown member (engine, dp_rank, running, waiting, kv_usage)");
            return 1;
        }
    }
    json_t *eng = json_object_get(o, "engine"), *rank = json_object_get(o, "dp_rank");
    if (!json_is_string(eng) || json_string_length(eng) == 0 ||
        json_string_length(eng) > RD_NAME_MAX ||
        strlen(json_string_value(eng)) != json_string_length(eng)) {
        cli_errf(err, err_size, "engine must be a string of 1..%u bytes", RD_NAME_MAX);
        return 1;
    }
    if (rank && !json_is_null(rank) &&
        (!json_is_integer(rank) || json_integer_value(rank) < 0 ||
         json_integer_value(rank) > 65535)) {
        cli_errf(err, err_size, "dp_rank must be an integer in 0..65535");
        return 1;
    }
    double running = 0.0, waiting = 0.0, kv = -1.0;
    if (!rd_push_num(o, "running", false, 1e9, &running) ||
        !rd_push_num(o, "waiting", true, 1e9, &waiting) ||
        !rd_push_num(o, "kv_usage", true, 1.0, &kv)) {
        cli_errf(err, err_size,
                 "running (required), waiting must be numbers in 0..1e9, "
                 "kv_usage a number in 0..1");
        return 1;
    }
    int64_t r = json_is_integer(rank) ? (int64_t)json_integer_value(rank) : 0;
    if (rd_load_set(d, json_string_value(eng), r, running, waiting, kv, RD_LOAD_PUSH)) {
        cli_errf(err, err_size, "the load table is full (%u workers) or out of memory",
                 RD_MAX_LOADS);
        return 1;
    }
    return 0;
}

int rd_load_push(rd_daemon *d, const char *body, size_t n, char *err, size_t err_size)
{
    json_error_t jerr;
    json_t *req = json_loadb(body ? body : "", n, JSON_REJECT_DUPLICATES, &jerr);
    if (req == NULL) {
        cli_errf(err, err_size, "the body is not valid JSON");
        return 1;
    }
    int rc = 0;
    json_t *list = json_object_get(req, "loads");
    if (json_is_object(req) && list && json_object_size(req) == 1 && json_is_array(list)) {
        for (size_t i = 0; rc == 0 && i < json_array_size(list); i++)
            rc = rd_push_one(d, json_array_get(list, i), err, err_size);
    } else {
        rc = rd_push_one(d, req, err, err_size);
    }
    json_decref(req);
    return rc;
}

/* Whether name ("ENGINE" or "ENGINE/RANK") names worker (engine, rank). */
static bool rd_name_matches(const char *name, const char *engine, int64_t rank)
{
    size_t n = strlen(engine);
    if (strncmp(name, engine, n) != 0)
        return false;
    if (name[n] == '\0')
        return true;
    uint64_t r = 0;
    return name[n] == '/' && cli_parse_uint(name + n + 1, 65535, &r) == CLI_OK &&
           (int64_t)r == rank;
}

/* The load of row rk from the request's loads (the most specific name wins: ENGINE/RANK
 * over ENGINE) or the table. Caller holds the table's lock. */
static void rd_row_load_locked(rd_daemon *d, const rd_score_opts *o, int64_t now, rd_rank *rk)
{
    int best = 0; /* 0 none, 1 engine name, 2 engine/rank name */
    for (size_t i = 0; o && i < o->n_loads; i++) {
        if (!rd_name_matches(o->load_names[i], rk->engine, rk->row.dp_rank))
            continue;
        int level = strcmp(o->load_names[i], rk->engine) == 0 ? 1 : 2;
        if (level > best) {
            best = level;
            rk->load = o->load_values[i];
            rk->load_known = true;
        }
    }
    if (best)
        return;
    rd_load *e = rd_load_find_locked(d->loads, rk->engine, rk->row.dp_rank);
    if (e && (d->load_ttl_ms == 0 || now - e->at_ms <= d->load_ttl_ms)) {
        rk->load = e->running + e->waiting;
        rk->load_known = true;
    }
}

int rd_rank_rows(rd_daemon *d, const rd_score_opts *o, size_t prompt_blocks, rd_rank *rk, size_t *n)
{
    /* Step 1: keep the candidates, in the index's order. */
    size_t kept = 0;
    for (size_t i = 0; i < *n; i++) {
        bool keep = o == NULL || o->workers == NULL;
        for (size_t j = 0; !keep && j < o->n_workers; j++)
            keep = rd_name_matches(o->workers[j], rk[i].engine, rk[i].row.dp_rank);
        if (keep)
            rk[kept++] = rk[i];
    }
    /* Step 2: each row's load. */
    int64_t now = rd_now_ms();
    pthread_mutex_lock(&d->loads->lock);
    for (size_t i = 0; i < kept; i++) {
        rk[i].load = 0.0;
        rk[i].load_known = false;
        rk[i].over_cap = false;
        rd_row_load_locked(d, o, now, &rk[i]);
    }
    pthread_mutex_unlock(&d->loads->lock);
    *n = kept;
    if (kept < 2)
        return KVP_OK;
    /* Step 3: kvp_router_rank's order, applied through a copy. */
    kvp_router_rank_input *in = malloc(kept * sizeof *in);
    uint32_t *order = malloc(kept * sizeof *order);
    rd_rank *copy = malloc(kept * sizeof *copy);
    int rc = in && order && copy ? KVP_OK : KVP_ENOMEM;
    size_t n_order = 0, n_within = 0;
    for (size_t i = 0; rc == KVP_OK && i < kept; i++)
        in[i] = (kvp_router_rank_input){.cached = rk[i].row.score, .load = rk[i].load};
    if (rc == KVP_OK)
        rc = kvp_router_rank(&d->rank, (double)prompt_blocks, in, kept, order, kept, &n_order,
                             &n_within);
    if (rc == KVP_OK) {
        memcpy(copy, rk, kept * sizeof *copy);
        for (size_t i = 0; i < kept; i++) {
            rk[i] = copy[order[i]];
            rk[i].over_cap = i >= n_within;
        }
    }
    free(in);
    free(order);
    free(copy);
    return rc;
}

void rd_metrics_load(rd_daemon *d, FILE *f)
{
    rd_loads *t = d->loads;
    if (t == NULL)
        return;
    static const char *const src_names[RD_LOAD_SOURCES] = {"scrape", "push"};
    pthread_mutex_lock(&t->lock);
    fputs("# HELP kvprefix_router_load_updates_total Worker load figures received, by source "
          "(scrape: the engines' /metrics; push: POST /load; refused: table full).\n"
          "# TYPE kvprefix_router_load_updates_total counter\n",
          f);
    for (int s = 0; s < RD_LOAD_SOURCES; s++)
        fprintf(f, "kvprefix_router_load_updates_total{source=\"%s\"} %" PRIu64 "\n", src_names[s],
                t->n_set[s]);
    fprintf(f, "kvprefix_router_load_updates_total{source=\"refused\"} %" PRIu64 "\n",
            t->n_refused);
    fputs("# HELP kvprefix_router_worker_load Requests running + waiting on a worker, as last "
          "learned (ranked with by /score).\n# TYPE kvprefix_router_worker_load gauge\n",
          f);
    char esc[2 * RD_NAME_MAX + 8];
    for (size_t i = 0; i < t->n; i++) {
        const rd_load *e = &t->entries[i];
        size_t k = 0;
        for (const char *c = e->engine; *c && k + 3 < sizeof esc; c++) {
            if (*c == '\\' || *c == '"' || *c == '\n') {
                esc[k++] = '\\';
                esc[k++] = *c == '\n' ? 'n' : *c;
            } else {
                esc[k++] = *c;
            }
        }
        esc[k] = '\0';
        fprintf(f, "kvprefix_router_worker_load{engine=\"%s\",dp_rank=\"%" PRId64 "\"} %.17g\n",
                esc, e->dp_rank, e->running + e->waiting);
    }
    pthread_mutex_unlock(&t->lock);
}
