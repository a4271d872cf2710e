/*
 * rd_spec.c - the engines `kvprefix router` subscribes to: `--engine` specs and the
 * `--config` JSON file, both turned into rd_source entries of the daemon.
 *
 *   --engine ID=ENDPOINT[,replay=EP][,topic=PREFIX][,dp=N][,bind][,metrics=URL]
 *   {"engines": [{"id": "pod-a", "endpoint": "tcp://10.0.0.5:5557",
 *                 "replay": "tcp://10.0.0.5:5558", "topic": "kv@", "dp": 2, "bind": false,
 *                 "metrics": "http://10.0.0.5:8000/metrics"}]}
 *
 * vLLM's own --kv-events-config keys are accepted in an engine object, so its JSON can be
 * pasted beside an "id": replay_endpoint (= replay), endpoint, topic, publisher (must be
 * "zmq"), enable_kv_cache_events (must be true), and the engine-side tuning keys
 * buffer_steps, hwm, max_queue_size (ignored: they size the engine's buffers, not ours).
 *
 * Bind addresses. vLLM's default endpoint is tcp://STAR:5557 (STAR the character '*'): a
 * wildcard the engine binds its PUB socket to, which a subscriber cannot connect to. Without
 * `bind`, an endpoint whose host is `*`, 0.0.0.0 or [::] is refused with a message naming the fix
 * (the engine's reachable address, or `bind` with the engines connecting to the router); with
 * `bind` it is what the router binds, as vLLM does.
 *
 * ID `*` takes the engine id (and the worker's model) from each message's topic, llm-d's
 * `kv@<pod>@<model>`. dp=N (1..256) is the engine's data-parallel size: vLLM opens one PUB
 * socket per rank, rank r at the tcp port + r, and so does the daemon (both endpoints);
 * an ipc/inproc endpoint with N > 1 is refused. Engine ids are unique per (id, rank).
 *
 * Errors are written to the caller's buffer (rd_main prints them with the exit status:
 * 2 for a flag, 1 for the file). Cost: O(length of the spec); the file is read once with
 * jansson (bounded by its size).
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "flags.h"
#include "routerd.h"

/* One engine as parsed, before dp expansion. */
typedef struct rd_spec {
    const char *id;       /* engine id, "*" for the topic's */
    const char *endpoint; /* PUB endpoint */
    const char *replay;   /* replay endpoint, or NULL */
    const char *topic;    /* subscription prefix, or NULL ("") */
    uint64_t dp;          /* data-parallel size (>= 1) */
    bool bind;            /* bind instead of connect */
    const char *metrics;  /* the engine's Prometheus URL, or NULL */
} rd_spec;

static char *rd_strdup(const char *s)
{
    if (s == NULL)
        return NULL;
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

/* Endpoint of rank r: the tcp port + r. Writes out (cap bytes). Returns 0, or non-zero with
 * err when r > 0 and the endpoint has no numeric tcp port. */
static int rd_rank_endpoint(const char *ep, uint64_t r, char *out, size_t cap, char *err,
                            size_t err_size)
{
    if (r == 0) {
        snprintf(out, cap, "%s", ep);
        return 0;
    }
    const char *colon = strrchr(ep, ':');
    uint64_t port = 0;
    if (strncmp(ep, "tcp://", 6) != 0 || colon == NULL ||
        cli_parse_uint(colon + 1, 65535, &port) != CLI_OK || port + r > 65535) {
        cli_errf(err, err_size, "'%s': dp > 1 needs a tcp endpoint with a numeric port", ep);
        return 1;
    }
    snprintf(out, cap, "%.*s:%" PRIu64, (int)(colon - ep), ep, port + r);
    return 0;
}

/* Append the sources of one parsed spec. Returns 0, or non-zero with err. */
static int rd_spec_expand(rd_daemon *d, const rd_spec *s, char *err, size_t err_size)
{
    if (d->n_sources + s->dp > RD_MAX_SOURCES) {
        cli_errf(err, err_size, "more than %u engine endpoints", RD_MAX_SOURCES);
        return 1;
    }
    rd_source *grown = realloc(d->sources, (d->n_sources + s->dp) * sizeof *grown);
    if (grown == NULL) {
        cli_errf(err, err_size, "out of memory");
        return 1;
    }
    d->sources = grown;
    for (uint64_t r = 0; r < s->dp; r++) {
        char ep[RD_NAME_MAX + 16], rep[RD_NAME_MAX + 16];
        if (rd_rank_endpoint(s->endpoint, r, ep, sizeof ep, err, err_size) ||
            (s->replay && rd_rank_endpoint(s->replay, r, rep, sizeof rep, err, err_size)))
            return 1;
        rd_source *src = &d->sources[d->n_sources];
        memset(src, 0, sizeof *src);
        src->engine = strcmp(s->id, "*") == 0 ? NULL : rd_strdup(s->id);
        src->endpoint = rd_strdup(ep);
        src->replay = s->replay ? rd_strdup(rep) : NULL;
        src->topic = rd_strdup(s->topic ? s->topic : "");
        src->dp_rank = (int64_t)r;
        src->bind = s->bind;
        src->dp_size = s->dp;
        src->metrics = r == 0 && s->metrics ? rd_strdup(s->metrics) : NULL;
        d->n_sources++;
        if ((s->id[0] != '*' && src->engine == NULL) || !src->endpoint || !src->topic ||
            (s->replay && !src->replay) || (r == 0 && s->metrics && !src->metrics)) {
            cli_errf(err, err_size, "out of memory");
            return 1;
        }
    }
    return 0;
}

/* Whether endpoint ep is a tcp wildcard (host *, 0.0.0.0, [::] or ::): an address to bind,
 * never one to connect to. */
static bool rd_is_wildcard(const char *ep)
{
    static const char *const hosts[] = {"tcp://*:", "tcp://0.0.0.0:", "tcp://[::]:", "tcp://:::"};
    for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++)
        if (strncmp(ep, hosts[i], strlen(hosts[i])) == 0)
            return true;
    return false;
}

/* Refuse a wildcard endpoint the router would connect to (what). Returns 0, or non-zero
 * with err. */
static int rd_check_wildcard(const char *what, const char *ep, bool bind, char *err,
                             size_t err_size)
{
    if (bind || ep == NULL || !rd_is_wildcard(ep))
        return 0;
    const char *port = strrchr(ep, ':') + 1;
    cli_errf(err, err_size,
             "%s'%s' is a bind address (vLLM's default `endpoint`, where the engine binds its "
             "PUB socket on every interface), not one the router can connect to: give the "
             "engine's reachable address, e.g. tcp://ENGINE-HOST:%s, or add `bind` (JSON "
             "\"bind\": true) to bind it here and point the engines' endpoint at "
             "tcp://ROUTER-HOST:%s (docs/routing.md, \"Endpoints\")",
             what, ep, port, port);
    return 1;
}

/* Check one parsed spec's values. Returns 0, or non-zero with err. */
static int rd_spec_validate(const rd_spec *s, char *err, size_t err_size)
{
    if (s->id == NULL || s->id[0] == '\0' || strlen(s->id) > RD_NAME_MAX || strchr(s->id, '@')) {
        cli_errf(err, err_size, "engine id must be 1..%u bytes without '@' (or '*')", RD_NAME_MAX);
        return 1;
    }
    if (s->endpoint == NULL || strstr(s->endpoint, "://") == NULL ||
        strlen(s->endpoint) > RD_NAME_MAX) {
        cli_errf(err, err_size, "'%s' is not an endpoint (tcp://HOST:PORT, ipc://PATH)",
                 s->endpoint ? s->endpoint : "");
        return 1;
    }
    if (s->replay && (strstr(s->replay, "://") == NULL || strlen(s->replay) > RD_NAME_MAX)) {
        cli_errf(err, err_size, "replay: '%s' is not an endpoint", s->replay);
        return 1;
    }
    if (s->topic && strlen(s->topic) > RD_NAME_MAX) {
        cli_errf(err, err_size, "topic longer than %u bytes", RD_NAME_MAX);
        return 1;
    }
    if (s->metrics && (strncmp(s->metrics, "http://", 7) != 0 || strlen(s->metrics) > RD_NAME_MAX ||
                       strlen(s->metrics) < 8)) {
        cli_errf(err, err_size, "metrics: '%s' is not http://HOST[:PORT][/PATH]", s->metrics);
        return 1;
    }
    if (s->metrics && strcmp(s->id, "*") == 0) {
        cli_errf(err, err_size, "metrics needs a fixed engine id (not '*')");
        return 1;
    }
    /* The replay socket is bound by the engine as well (vLLM: port 5558 on every interface), and a
     * ROUTER socket is never bound by the router, bind or not. */
    return rd_check_wildcard("", s->endpoint, s->bind, err, err_size) ||
           rd_check_wildcard("replay: ", s->replay, false, err, err_size);
}

/* Parse one "key=value" or "bind" option of a spec (item[0 .. len) inside buf, which this
 * function may cut with NULs). Returns 0, or non-zero with err. */
static int rd_spec_option(rd_spec *s, char *item, char *err, size_t err_size)
{
    char *eq = strchr(item, '=');
    if (strcmp(item, "bind") == 0) {
        s->bind = true;
        return 0;
    }
    if (eq == NULL) {
        cli_errf(err, err_size, "'%s' is not key=value (replay, topic, dp, metrics) or bind", item);
        return 1;
    }
    *eq = '\0';
    const char *v = eq + 1;
    if (strcmp(item, "replay") == 0)
        s->replay = v;
    else if (strcmp(item, "topic") == 0)
        s->topic = v;
    else if (strcmp(item, "metrics") == 0)
        s->metrics = v;
    else if (strcmp(item, "dp") == 0) {
        if (cli_parse_uint(v, 256, &s->dp) != CLI_OK || s->dp == 0) {
            cli_errf(err, err_size, "dp: '%s' is not an integer in 1..256", v);
            return 1;
        }
    } else {
        cli_errf(err, err_size, "unknown option '%s' (replay, topic, dp, metrics, bind)", item);
        return 1;
    }
    return 0;
}

int rd_spec_add(rd_daemon *d, const char *spec, char *err, size_t err_size)
{
    char buf[4 * RD_NAME_MAX];
    if (strlen(spec) >= sizeof buf) {
        cli_errf(err, err_size, "'%.40s...' is too long", spec);
        return 1;
    }
    snprintf(buf, sizeof buf, "%s", spec);
    char *eq = strchr(buf, '=');
    if (eq == NULL) {
        cli_errf(err, err_size,
                 "'%s' is not ID=ENDPOINT[,replay=EP][,topic=P][,dp=N][,bind][,metrics=URL]", spec);
        return 1;
    }
    *eq = '\0';
    rd_spec s = {.id = buf, .endpoint = eq + 1, .dp = 1};
    /* Cut the options at their commas first: each value then ends at its own NUL. */
    char *items[16];
    size_t n_items = 0;
    for (char *comma = strchr(eq + 1, ','); comma; comma = strchr(comma + 1, ',')) {
        if (n_items == 16) {
            cli_errf(err, err_size, "too many options in '%s'", spec);
            return 1;
        }
        *comma = '\0';
        items[n_items++] = comma + 1;
    }
    for (size_t i = 0; i < n_items; i++)
        if (rd_spec_option(&s, items[i], err, err_size))
            return 1;
    return rd_spec_validate(&s, err, err_size) || rd_spec_expand(d, &s, err, err_size);
}

/* A string member of an engine object: NULL when absent or null; *bad on another type. */
static const char *rd_json_str(json_t *o, const char *key, bool *bad)
{
    json_t *v = json_object_get(o, key);
    if (v == NULL || json_is_null(v))
        return NULL;
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
        *bad = true;
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* The keys of an engine object: ours, then vLLM's KVEventsConfig names. */
static const char *const rd_engine_keys[] = {
    "id",           "endpoint", "replay",          "topic",     "dp",
    "bind",         "metrics",  "replay_endpoint", "publisher", "enable_kv_cache_events",
    "buffer_steps", "hwm",      "max_queue_size"};

/* Refuse unknown keys, and vLLM keys whose value means the engine publishes nothing the
 * router could read. Returns 0, or non-zero with err. */
static int rd_config_keys(json_t *o, char *err, size_t err_size)
{
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v)
    {
        bool known = false;
        for (size_t i = 0; i < sizeof rd_engine_keys / sizeof rd_engine_keys[0]; i++)
            known = known || strcmp(key, rd_engine_keys[i]) == 0;
        if (!known) {
            cli_errf(err, err_size,
                     "unknown key '%s' (id, endpoint, replay, topic, dp, bind, metrics; vLLM's "
                     "replay_endpoint, publisher, enable_kv_cache_events, buffer_steps, hwm, "
                     "max_queue_size)",
                     key);
            return 1;
        }
    }
    json_t *pub = json_object_get(o, "publisher"),
           *en = json_object_get(o, "enable_kv_cache_events");
    if (pub && !json_is_null(pub) &&
        (!json_is_string(pub) || strcmp(json_string_value(pub), "zmq") != 0)) {
        cli_errf(err, err_size,
                 "publisher: only \"zmq\" publishes events the router can read "
                 "(vLLM's \"null\" publishes nothing)");
        return 1;
    }
    if (en && !json_is_true(en)) {
        cli_errf(err, err_size,
                 "enable_kv_cache_events is not true: that engine publishes no "
                 "events (set it true in its --kv-events-config)");
        return 1;
    }
    if (json_object_get(o, "replay") && json_object_get(o, "replay_endpoint")) {
        cli_errf(err, err_size, "replay and replay_endpoint are the same key: give one");
        return 1;
    }
    return 0;
}

/* One engine object of the file. Returns 0, or non-zero with err (without the prefix). */
static int rd_config_engine(rd_daemon *d, json_t *o, char *err, size_t err_size)
{
    if (rd_config_keys(o, err, err_size))
        return 1;
    bool bad = false;
    const char *replay = rd_json_str(o, "replay", &bad);
    rd_spec s = {.id = rd_json_str(o, "id", &bad),
                 .endpoint = rd_json_str(o, "endpoint", &bad),
                 .replay = replay ? replay : rd_json_str(o, "replay_endpoint", &bad),
                 .topic = rd_json_str(o, "topic", &bad),
                 .metrics = rd_json_str(o, "metrics", &bad),
                 .dp = 1};
    json_t *dp = json_object_get(o, "dp"), *bind = json_object_get(o, "bind");
    if (bad ||
        (dp &&
         (!json_is_integer(dp) || json_integer_value(dp) < 1 || json_integer_value(dp) > 256)) ||
        (bind && !json_is_boolean(bind))) {
        cli_errf(err, err_size,
                 "id, endpoint, replay, topic, metrics are strings, dp an integer in "
                 "1..256, bind a boolean");
        return 1;
    }
    if (s.id == NULL) {
        cli_errf(err, err_size,
                 "no \"id\": vLLM's --kv-events-config names no engine; add "
                 "\"id\": \"NAME\" beside its keys");
        return 1;
    }
    if (dp)
        s.dp = (uint64_t)json_integer_value(dp);
    s.bind = json_is_true(bind);
    return rd_spec_validate(&s, err, err_size) || rd_spec_expand(d, &s, err, err_size);
}

int rd_config_load(rd_daemon *d, const char *path, char *err, size_t err_size)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        if (jerr.line > 0)
            cli_errf(err, err_size, "%s:%d: %s", path, jerr.line, jerr.text);
        else
            cli_errf(err, err_size, "%s: %s", path, jerr.text);
        return 1;
    }
    json_t *engines = json_object_get(root, "engines");
    int rc = 0;
    if (!json_is_object(root) || !json_is_array(engines) || json_array_size(engines) == 0) {
        cli_errf(err, err_size,
                 "%s: expected {\"engines\": [{...}, ...]} with at least one "
                 "engine",
                 path);
        rc = 1;
    }
    for (size_t i = 0; rc == 0 && i < json_array_size(engines); i++) {
        char why[512] = "";
        json_t *o = json_array_get(engines, i);
        if (!json_is_object(o))
            cli_errf(why, sizeof why, "not an object");
        if (!json_is_object(o) || rd_config_engine(d, o, why, sizeof why)) {
            cli_errf(err, err_size, "%s: engines[%zu]: %s", path, i, why);
            rc = 1;
        }
    }
    json_decref(root);
    return rc;
}

/* Same engine id on the same rank twice, or an endpoint given twice: refused. */
int rd_spec_check(const rd_daemon *d, char *err, size_t err_size)
{
    if (d->n_sources == 0) {
        cli_errf(err, err_size, "no engine: give --engine ID=ENDPOINT or --config FILE");
        return 1;
    }
    for (size_t i = 0; i < d->n_sources; i++) {
        const rd_source *a = &d->sources[i];
        for (size_t j = 0; j < i; j++) {
            const rd_source *b = &d->sources[j];
            if (strcmp(a->endpoint, b->endpoint) == 0) {
                cli_errf(err, err_size, "endpoint '%s' given twice", a->endpoint);
                return 1;
            }
            if (a->engine && b->engine && strcmp(a->engine, b->engine) == 0 &&
                a->dp_rank == b->dp_rank) {
                cli_errf(err, err_size, "engine '%s' (dp rank %" PRId64 ") given twice", a->engine,
                         a->dp_rank);
                return 1;
            }
        }
    }
    return 0;
}

void rd_spec_free(rd_daemon *d)
{
    for (size_t i = 0; i < d->n_sources; i++) {
        free(d->sources[i].engine);
        free(d->sources[i].endpoint);
        free(d->sources[i].replay);
        free(d->sources[i].topic);
        free(d->sources[i].metrics);
    }
    free(d->sources);
    d->sources = NULL;
    d->n_sources = 0;
}
