/*
 * rd_spec.c - the engines `kvprefix router` subscribes to: `--engine` specs and the
 * `--config` JSON file, both turned into rd_source entries of the daemon.
 *
 *   --engine ID=ENDPOINT[,replay=EP][,topic=PREFIX][,dp=N][,bind]
 *   {"engines": [{"id": "pod-a", "endpoint": "tcp://10.0.0.5:5557",
 *                 "replay": "tcp://10.0.0.5:5558", "topic": "kv@", "dp": 2, "bind": false}]}
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
        d->n_sources++;
        if ((s->id[0] != '*' && src->engine == NULL) || !src->endpoint || !src->topic ||
            (s->replay && !src->replay)) {
            cli_errf(err, err_size, "out of memory");
            return 1;
        }
    }
    return 0;
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
    return 0;
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
        cli_errf(err, err_size, "'%s' is not key=value (replay, topic, dp) or bind", item);
        return 1;
    }
    *eq = '\0';
    const char *v = eq + 1;
    if (strcmp(item, "replay") == 0)
        s->replay = v;
    else if (strcmp(item, "topic") == 0)
        s->topic = v;
    else if (strcmp(item, "dp") == 0) {
        if (cli_parse_uint(v, 256, &s->dp) != CLI_OK || s->dp == 0) {
            cli_errf(err, err_size, "dp: '%s' is not an integer in 1..256", v);
            return 1;
        }
    } else {
        cli_errf(err, err_size, "unknown option '%s' (replay, topic, dp, bind)", item);
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
        cli_errf(err, err_size, "'%s' is not ID=ENDPOINT[,replay=EP][,topic=P][,dp=N][,bind]",
                 spec);
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

/* One engine object of the file. Returns 0, or non-zero with err (without the prefix). */
static int rd_config_engine(rd_daemon *d, json_t *o, char *err, size_t err_size)
{
    static const char *const keys[] = {"id", "endpoint", "replay", "topic", "dp", "bind"};
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v)
    {
        bool known = false;
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            known = known || strcmp(key, keys[i]) == 0;
        if (!known) {
            cli_errf(err, err_size, "unknown key '%s' (id, endpoint, replay, topic, dp, bind)",
                     key);
            return 1;
        }
    }
    bool bad = false;
    rd_spec s = {.id = rd_json_str(o, "id", &bad),
                 .endpoint = rd_json_str(o, "endpoint", &bad),
                 .replay = rd_json_str(o, "replay", &bad),
                 .topic = rd_json_str(o, "topic", &bad),
                 .dp = 1};
    json_t *dp = json_object_get(o, "dp"), *bind = json_object_get(o, "bind");
    if (bad ||
        (dp &&
         (!json_is_integer(dp) || json_integer_value(dp) < 1 || json_integer_value(dp) > 256)) ||
        (bind && !json_is_boolean(bind))) {
        cli_errf(err, err_size,
                 "id, endpoint, replay, topic are strings, dp an integer in "
                 "1..256, bind a boolean");
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
    }
    free(d->sources);
    d->sources = NULL;
    d->n_sources = 0;
}
