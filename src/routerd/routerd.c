/*
 * routerd.c - `kvprefix router`: the subscriber daemon. Subscribes to N engines' KV-event
 * streams (vLLM's ZeroMQ protocol), keeps a kvp_router index of which worker holds which
 * block, and answers scoring queries and metrics over HTTP (docs/routing.md, "The router
 * daemon").
 *
 * Flow: block SIGINT and SIGTERM before any thread exists (every thread inherits the mask);
 * parse the options (engines from --engine and --config); create the index; open the SUB
 * sockets; start the event thread
 * (rd_events.c) and the HTTP server (rd_http.c); print "listening on http://ADDR:PORT" on
 * standard output (port 0 picks a free port: scripts and tests read it there); wait for
 * SIGINT or SIGTERM; stop the HTTP server (its threads finish their requests), stop and
 * join the event thread, free everything; exit 0.
 *
 * With --redis URL the index also keeps its state in a Redis database shared with other
 * routers (kvp_router_config.redis; rd_redis.c logs the store's state): an unreachable
 * Redis at start is not an error (the daemon scores from its local view and connects when
 * Redis answers), a build without hiredis is a usage error.
 *
 * Exit status (cli.h): 0 stopped by a signal, 1 bad input or failed I/O (the config file,
 * an endpoint ZeroMQ refuses, a port in use), 2 usage (a flag, an --engine spec, --redis in
 * a build without Redis support), 3 internal error.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#ifdef RD_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "cli.h"
#include "flags.h"
#include "hashopt.h"
#include "routerd.h"
#include "rd_text.h"

#define fail(...) cli_fail("router", __VA_ARGS__)

static const char usage_text[] =
    "Usage: kvprefix router [options] --engine ID=ENDPOINT[,...] ...\n"
    "\n"
    "Subscribe to engines' KV-event streams (vLLM's ZeroMQ protocol), index which\n"
    "worker holds which block, and answer over HTTP (docs/routing.md):\n"
    "  POST /score {\"tokens\": [...], \"model\", \"lora\", \"salt\", \"tenant\",\n"
    "              \"workers\": [candidates], \"loads\": {WORKER: LOAD}}\n"
    "               -> workers ranked by cached prefix and load (--overlap-weight)\n"
    "  POST /load {\"engine\", \"dp_rank\", \"running\", \"waiting\", \"kv_usage\"}\n"
    "  GET /metrics  Prometheus text format;  GET /healthz\n"
    "Runs until SIGINT or SIGTERM.\n"
    "\n"
    "Engines:\n"
    "  --engine ID=ENDPOINT[,replay=EP][,topic=PREFIX][,dp=N][,bind][,metrics=URL]\n"
    "                       an engine's PUB endpoint (repeatable). replay: its replay\n"
    "                       ROUTER (gaps are refilled from it); topic: subscription prefix\n"
    "                       (default: all); dp: data-parallel size, rank r at tcp port + r;\n"
    "                       bind: bind the SUB socket, publishers connect. ID '*': the\n"
    "                       engine id and model from each topic kv@<pod>@<model> (llm-d).\n"
    "                       metrics: the engine's Prometheus URL (http://HOST:PORT/metrics),\n"
    "                       scraped for its load. tcp://*:PORT is where an engine binds, not\n"
    "                       an address to connect to: refused unless bind is given\n"
    "  --config FILE        JSON {\"engines\": [{\"id\", \"endpoint\", \"replay\", \"topic\",\n"
    "                       \"dp\", \"bind\", \"metrics\"}, ...]} (with or instead of\n"
    "                       --engine); vLLM's --kv-events-config keys are accepted too\n"
    "  --replay-timeout MS  bound on one replay (default 2000; then the worker is stale)\n"
    "\n"
    "Index (docs/routing.md, \"Token mode\"):\n"
    "  --index-by MODE      tokens (default without --redis): the router keys each block\n"
    "                       by its own hash of the events' token_ids, so any engine hash\n"
    "                       algorithm and seed work (vLLM's random NONE_HASH included);\n"
    "                       requests with a salt or tenant score 'notsup'. engine-hash\n"
    "                       (default with --redis): the engines' block hashes, which the\n"
    "                       key flags below must reproduce (checked; mismatches counted)\n"
    "  --token-seed N       tokens: the seed of the router's own xxh3 keys (default 0)\n"
    "\n"
    "Keys (engine-hash: must equal the engines'; tokens: only --block-size is used):\n"
    "  --hash PROFILE       block keys: vllm-sha256-cbor (default here), vllm-xxhash-cbor,\n"
    "                       keyed, xxh3, siphash (docs/hash-profiles.md)\n"
    "  --hash-profile P     the same as --hash\n"
    "  --hash-key HEX       keyed, siphash: the engines' secret key, 32..64 hex digits\n"
    "                       (required: a random key could never equal theirs). Visible in\n"
    "                       ps: prefer --hash-key-file or KVPREFIX_HASH_KEY\n"
    "  --hash-key-file FILE the key's hex digits from FILE (surrounding blanks ignored);\n"
    "                       environment KVPREFIX_HASH_KEY: the same, when neither is "
    "given\n" CLI_HASH_HELP_TAIL "  --seed N             xxh3: the 64-bit seed\n"
    "  --block-size N       tokens per block (default 16)\n"
    "\n";

/* The second half (ISO C bounds one string literal's length). */
static const char usage_tail[] =
    "Load-aware ranking (docs/routing.md, \"Load-aware ranking\"):\n"
    "  --overlap-weight W   0 (default): most cached blocks first, then least load; > 0:\n"
    "                       smallest cost W x blocks to prefill + load (requests running +\n"
    "                       waiting), as NVIDIA Dynamo's KV router weighs them\n"
    "  --load-cap F         rank workers whose load is above F x the mean after the others\n"
    "                       (default 0: no cap; else >= 1, as kvprefix fleet's cache-aware-cap)\n"
    "  --scrape-interval MS period of the metrics= scrapes (default 1000, 50..600000)\n"
    "  --load-ttl MS        a load older than this is unknown, ranked as 0 (default 10000;\n"
    "                       0: never)\n"
    "\n"
    "HTTP:\n"
    "  --listen ADDR[:PORT] address to listen on: IPv4, or IPv6 as [ADDR] or [ADDR]:PORT\n"
    "                       (default 127.0.0.1)\n"
    "  --port N             port (default 8700; 0: any free port, printed at start)\n"
    "  --http-threads N     scoring threads (default 2, 1..64)\n"
    "  --max-body SIZE      largest /score body (default 16MiB)\n"
    "\n"
    "Limits as a network service (docs/security.md):\n"
    "  --request-timeout MS a request's whole life, headers to answer (default 5000)\n"
    "  --per-ip-connections N  open connections per client address (default 64)\n"
    "  --max-connections N  open connections in all (default 256)\n"
    "  --body-budget SIZE   /score bodies held by all connections (default 256MiB)\n"
    "  --endpoint-workers N workers one engine endpoint may create (default 64)\n"
    "  --endpoint-blocks N  blocks one endpoint's workers may hold (default 16777216)\n"
    "\n";

/* The rest of the usage (one string would pass the 4095 bytes C guarantees). */
static const char usage_text2[] =
    "Prompts as text (/score with \"prompt\" or \"messages\", docs/routing.md):\n"
    "  --tokenizer [MODEL=]PATH  the model's tokenizer, as replay's --tokenizer takes it\n"
    "                       (repeatable; without MODEL= the default for every model)\n"
    "  --template [MODEL=]NAME   its chat template, as replay's --template (default: the\n"
    "                       tokenizer's)\n"
    "\n"
    "Shared index (several routers on one Redis, docs/routing.md):\n"
    "  --redis URL          redis://HOST[:PORT][/DB] (port 6379), HOST:PORT or\n"
    "                       unix:PATH; scores come from Redis, from the local view\n"
    "                       while it does not answer\n"
    "  --redis-prefix P     first bytes of every key (default kvp): 1..64 of\n"
    "                       [A-Za-z0-9_.:-], one per fleet sharing a database\n"
    "  --redis-timeout MS   connect and per-call timeout (default 250, 1..60000)\n"
    "  --redis-retry MS     after a failure, use the local view this long before trying\n"
    "                       Redis again (default 1000, 0..600000)\n"
    "  --worker-ttl SECONDS a worker without a batch for this long stops counting in\n"
    "                       scores, fleet-wide (default 0: never)\n"
    "\n"
    "Operation:\n"
    "  --log-format F       text (default) or logfmt (ts=... level=... msg=\"...\")\n"
    "  --log-level L        least level logged: debug, info (default), warn, error\n"
    "  Under systemd (Type=notify) READY=1 is sent once the sockets are bound and\n"
    "  subscribed and the HTTP server listens, STOPPING=1 at SIGTERM\n"
    "  (contrib/systemd/kvprefix-router.service).\n"
    "  -h, --help           this message\n"
    "\n" CLI_EXIT_HELP;

enum {
    RD_OPT_ENGINE = 256,
    RD_OPT_CONFIG,
    RD_OPT_TIMEOUT,
    RD_OPT_SEED,
    RD_OPT_BS,
    RD_OPT_LISTEN,
    RD_OPT_PORT,
    RD_OPT_THREADS,
    RD_OPT_MAX_BODY,
    RD_OPT_REDIS,
    RD_OPT_REDIS_PREFIX,
    RD_OPT_REDIS_TIMEOUT,
    RD_OPT_REDIS_RETRY,
    RD_OPT_WORKER_TTL,
    RD_OPT_INDEX_BY,
    RD_OPT_TOKEN_SEED,
    RD_OPT_OVERLAP_WEIGHT,
    RD_OPT_LOAD_CAP,
    RD_OPT_SCRAPE_INTERVAL,
    RD_OPT_LOAD_TTL,
    RD_OPT_LOG_FORMAT,
    RD_OPT_LOG_LEVEL,
    RD_OPT_HASH_KEY_FILE,
    RD_OPT_REQ_TIMEOUT,
    RD_OPT_PER_IP,
    RD_OPT_MAX_CONNS,
    RD_OPT_BODY_BUDGET,
    RD_OPT_EP_WORKERS,
    RD_OPT_EP_BLOCKS,
    RD_OPT_TOKENIZER,
    RD_OPT_TEMPLATE
};

static const struct option rd_longopts[] = {
    CLI_HASH_LONGOPTS,
    {"hash-profile", required_argument, NULL, CLI_OPT_HASH},
    {"engine", required_argument, NULL, RD_OPT_ENGINE},
    {"config", required_argument, NULL, RD_OPT_CONFIG},
    {"replay-timeout", required_argument, NULL, RD_OPT_TIMEOUT},
    {"seed", required_argument, NULL, RD_OPT_SEED},
    {"block-size", required_argument, NULL, RD_OPT_BS},
    {"listen", required_argument, NULL, RD_OPT_LISTEN},
    {"port", required_argument, NULL, RD_OPT_PORT},
    {"http-threads", required_argument, NULL, RD_OPT_THREADS},
    {"max-body", required_argument, NULL, RD_OPT_MAX_BODY},
    {"redis", required_argument, NULL, RD_OPT_REDIS},
    {"redis-prefix", required_argument, NULL, RD_OPT_REDIS_PREFIX},
    {"redis-timeout", required_argument, NULL, RD_OPT_REDIS_TIMEOUT},
    {"redis-retry", required_argument, NULL, RD_OPT_REDIS_RETRY},
    {"worker-ttl", required_argument, NULL, RD_OPT_WORKER_TTL},
    {"index-by", required_argument, NULL, RD_OPT_INDEX_BY},
    {"token-seed", required_argument, NULL, RD_OPT_TOKEN_SEED},
    {"overlap-weight", required_argument, NULL, RD_OPT_OVERLAP_WEIGHT},
    {"load-cap", required_argument, NULL, RD_OPT_LOAD_CAP},
    {"scrape-interval", required_argument, NULL, RD_OPT_SCRAPE_INTERVAL},
    {"load-ttl", required_argument, NULL, RD_OPT_LOAD_TTL},
    {"log-format", required_argument, NULL, RD_OPT_LOG_FORMAT},
    {"log-level", required_argument, NULL, RD_OPT_LOG_LEVEL},
    {"hash-key-file", required_argument, NULL, RD_OPT_HASH_KEY_FILE},
    {"request-timeout", required_argument, NULL, RD_OPT_REQ_TIMEOUT},
    {"per-ip-connections", required_argument, NULL, RD_OPT_PER_IP},
    {"max-connections", required_argument, NULL, RD_OPT_MAX_CONNS},
    {"body-budget", required_argument, NULL, RD_OPT_BODY_BUDGET},
    {"endpoint-workers", required_argument, NULL, RD_OPT_EP_WORKERS},
    {"endpoint-blocks", required_argument, NULL, RD_OPT_EP_BLOCKS},
    {"tokenizer", required_argument, NULL, RD_OPT_TOKENIZER},
    {"template", required_argument, NULL, RD_OPT_TEMPLATE},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* The command line, beyond what goes straight into the daemon. */
typedef struct rd_opts {
    cli_hash_opts hash;     /* the hash flags as given */
    const char *config;     /* --config, or NULL */
    const char *listen;     /* --listen */
    uint64_t port;          /* --port */
    uint64_t threads;       /* --http-threads */
    bool redis_flag;        /* a --redis-* or --worker-ttl flag was given */
    bool index_given;       /* --index-by was given */
    bool token_seed;        /* --token-seed was given */
    char listen_buf[64];    /* --listen's address without brackets or port */
    bool port_given;        /* --port was given */
    bool listen_port;       /* --listen carried a port */
    const char *log_format; /* --log-format, or NULL */
    const char *log_level;  /* --log-level, or NULL */
    const char *key_file;   /* --hash-key-file, or NULL */
    bool key_flag;          /* --hash-key was given */
} rd_opts;

/* A non-negative decimal (--overlap-weight, --load-cap) in min..max. Returns 0 or an exit
 * status after a message. */
static int rd_flag_real(const char *flag, const char *arg, double min, double max, double *out)
{
    char *end = NULL;
    errno = 0;
    double x = strtod(arg, &end);
    if (end == arg || *end != '\0' || errno != 0 || !isfinite(x) || x < min || x > max)
        return fail(CLI_EXIT_USAGE, "%s: '%s' is not a number in %g..%g", flag, arg, min, max);
    *out = x;
    return 0;
}

/* --listen ADDR, ADDR:PORT (IPv4), [ADDR] or [ADDR]:PORT (IPv6), or a bare IPv6 ADDR, into
 * o->listen (the address alone) and, with a port, o->port. Returns 0 or an exit status. */
static int rd_listen_parse(rd_opts *o, const char *arg)
{
    const char *addr = arg, *port = NULL;
    size_t len = strlen(arg);
    if (arg[0] == '[') {
        const char *close = strchr(arg, ']');
        if (close == NULL || (close[1] != '\0' && close[1] != ':'))
            return fail(CLI_EXIT_USAGE, "--listen: '%s' is not [IPV6] or [IPV6]:PORT", arg);
        addr = arg + 1;
        len = (size_t)(close - addr);
        port = close[1] == ':' ? close + 2 : NULL;
    } else if (strchr(arg, ':') && strchr(arg, ':') == strrchr(arg, ':')) {
        len = (size_t)(strchr(arg, ':') - arg); /* one colon: IPv4:PORT */
        port = arg + len + 1;
    }
    if (len == 0 || len >= sizeof o->listen_buf)
        return fail(CLI_EXIT_USAGE, "--listen: '%s' is not an address", arg);
    memcpy(o->listen_buf, addr, len);
    o->listen_buf[len] = '\0';
    o->listen = o->listen_buf;
    o->listen_port = port != NULL;
    return port ? cli_flag_uint("router", "--listen's port", port, 0, 65535, &o->port) : 0;
}

/* Give the key in text (hex digits, surrounding blanks ignored) to the hash options, naming
 * its origin in messages. Returns 0 or an exit status. */
static int rd_key_text(rd_opts *o, const char *origin, char *text)
{
    size_t n = strlen(text);
    while (n && isspace((unsigned char)text[n - 1]))
        text[--n] = '\0';
    char *p = text;
    while (*p && isspace((unsigned char)*p))
        p++;
    if (*p == '\0')
        return fail(CLI_EXIT_USAGE, "%s: no key (32..64 hex digits)", origin);
    int rc = cli_hash_apply("router", &o->hash, CLI_OPT_HASH_KEY, p);
    if (rc)
        fprintf(stderr, "kvprefix router: (the key came from %s)\n", origin);
    return rc;
}

/* The secret key from --hash-key-file, else KVPREFIX_HASH_KEY when --hash-key was not given
 * either, so that it need not appear on the command line (ps). Returns 0 or an exit status. */
static int rd_key_load(rd_opts *o)
{
    if (o->key_file && o->key_flag)
        return fail(CLI_EXIT_USAGE, "--hash-key and --hash-key-file: give one");
    if (o->key_file) {
        FILE *f = fopen(o->key_file, "r");
        if (f == NULL)
            return fail(CLI_EXIT_INPUT, "--hash-key-file: cannot open '%s': %s", o->key_file,
                        strerror(errno));
        char buf[256];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        bool more = fgetc(f) != EOF;
        fclose(f);
        buf[n] = '\0';
        if (more || strlen(buf) != n)
            return fail(CLI_EXIT_INPUT, "%s: not a key file (hex digits and blanks only)",
                        o->key_file);
        int rc = rd_key_text(o, o->key_file, buf);
        memset(buf, 0, sizeof buf);
        return rc;
    }
    const char *env = getenv("KVPREFIX_HASH_KEY");
    if (o->key_flag || env == NULL || env[0] == '\0')
        return 0;
    char buf[256];
    if (strlen(env) >= sizeof buf)
        return fail(CLI_EXIT_USAGE, "KVPREFIX_HASH_KEY: longer than a key");
    snprintf(buf, sizeof buf, "%s", env);
    int rc = rd_key_text(o, "KVPREFIX_HASH_KEY", buf);
    memset(buf, 0, sizeof buf);
    return rc;
}

/* Apply one of the load-ranking and operation options. Returns 0 or an exit status. */
static int rd_apply_ops_opt(rd_daemon *d, rd_opts *o, int c, const char *arg)
{
    uint64_t v = 0;
    int rc = 0;
    switch (c) {
    case RD_OPT_OVERLAP_WEIGHT:
        return rd_flag_real("--overlap-weight", arg, 0.0, 1e9, &d->rank.overlap_weight);
    case RD_OPT_LOAD_CAP:
        if ((rc = rd_flag_real("--load-cap", arg, 0.0, 1000.0, &d->rank.load_cap)) == 0 &&
            d->rank.load_cap != 0.0 && d->rank.load_cap < 1.0)
            return fail(CLI_EXIT_USAGE, "--load-cap: '%s' is not 0 (no cap) or at least 1", arg);
        return rc;
    case RD_OPT_SCRAPE_INTERVAL:
        if ((rc = cli_flag_uint("router", "--scrape-interval", arg, 50, 600000, &v)) == 0)
            d->scrape_interval_ms = (int)v;
        return rc;
    case RD_OPT_LOAD_TTL:
        if ((rc = cli_flag_uint("router", "--load-ttl", arg, 0, 86400000, &v)) == 0)
            d->load_ttl_ms = (int)v;
        return rc;
    case RD_OPT_LOG_FORMAT:
        o->log_format = arg;
        return 0;
    case RD_OPT_LOG_LEVEL:
        o->log_level = arg;
        return 0;
    default:
        o->key_file = arg;
        return 0;
    }
}

/* Apply one of the --redis options to d->redis. Returns 0 or an exit status after a
 * message. */
static int rd_apply_redis_opt(rd_daemon *d, int c, const char *arg)
{
    uint64_t v = 0;
    int rc = 0;
    switch (c) {
    case RD_OPT_REDIS:
        d->redis.url = arg; /* its shape is the library's to judge (rd_router_new) */
        return 0;
    case RD_OPT_REDIS_PREFIX:
        if (!rd_redis_prefix_ok(arg))
            return fail(CLI_EXIT_USAGE, "--redis-prefix: '%s' is not 1..64 of [A-Za-z0-9_.:-]",
                        arg);
        d->redis.key_prefix = arg;
        return 0;
    case RD_OPT_REDIS_TIMEOUT:
        if ((rc = cli_flag_uint("router", "--redis-timeout", arg, 1, 60000, &v)) == 0)
            d->redis.timeout_ms = (uint32_t)v;
        return rc;
    case RD_OPT_REDIS_RETRY:
        if ((rc = cli_flag_uint("router", "--redis-retry", arg, 0, 600000, &v)) == 0)
            d->redis.retry_ms = (uint32_t)v;
        return rc;
    default:
        if ((rc = cli_flag_uint("router", "--worker-ttl", arg, 0, UINT32_MAX, &v)) == 0)
            d->redis.worker_ttl_s = (uint32_t)v;
        return rc;
    }
}

/* Apply one of the limits' options (rd_limits). Returns 0 or an exit status after a
 * message. */
static int rd_apply_limit_opt(rd_daemon *d, int c, const char *arg)
{
    uint64_t v = 0;
    int rc = 0;
    rd_limits *l = &d->lim;
    switch (c) {
    case RD_OPT_REQ_TIMEOUT:
        if ((rc = cli_flag_uint("router", "--request-timeout", arg, 1, 3600000, &v)) == 0)
            l->request_timeout_ms = (unsigned)v;
        return rc;
    case RD_OPT_PER_IP:
        if ((rc = cli_flag_uint("router", "--per-ip-connections", arg, 1, 65535, &v)) == 0)
            l->per_ip_connections = (unsigned)v;
        return rc;
    case RD_OPT_MAX_CONNS:
        if ((rc = cli_flag_uint("router", "--max-connections", arg, 1, 65535, &v)) == 0)
            l->max_connections = (unsigned)v;
        return rc;
    case RD_OPT_BODY_BUDGET:
        if ((rc = cli_flag_bytes("router", "--body-budget", arg, 4096, UINT64_C(1) << 40, &v)) == 0)
            l->body_budget.limit = (size_t)v;
        return rc;
    case RD_OPT_EP_WORKERS:
        if ((rc = cli_flag_uint("router", "--endpoint-workers", arg, 1, KVP_ROUTER_MAX_WORKERS,
                                &v)) == 0)
            l->endpoint_workers = (uint32_t)v;
        return rc;
    default:
        return cli_flag_uint("router", "--endpoint-blocks", arg, 1, UINT64_MAX,
                             &l->endpoint_blocks);
    }
}

/* Apply one option. Returns 0, -1 after --help, or an exit status after a message. */
static int rd_apply_opt(rd_daemon *d, rd_opts *o, int c, const char *arg)
{
    char err[512];
    uint64_t v = 0;
    int rc = 0;
    if (cli_hash_is_opt(c)) {
        o->key_flag = o->key_flag || c == CLI_OPT_HASH_KEY;
        return cli_hash_apply("router", &o->hash, c, arg);
    }
    if (c >= RD_OPT_OVERLAP_WEIGHT && c <= RD_OPT_HASH_KEY_FILE)
        return rd_apply_ops_opt(d, o, c, arg);
    if (c >= RD_OPT_REDIS && c <= RD_OPT_WORKER_TTL)
        return rd_apply_redis_opt(d, c, arg);
    if (c >= RD_OPT_REQ_TIMEOUT && c <= RD_OPT_EP_BLOCKS)
        return rd_apply_limit_opt(d, c, arg);
    switch (c) {
    case 'h':
        fputs(usage_text, stdout);
        fputs(usage_tail, stdout);
        fputs(usage_text2, stdout);
        return -1;
    case RD_OPT_ENGINE:
        return rd_spec_add(d, arg, err, sizeof err) ? fail(CLI_EXIT_USAGE, "--engine: %s", err) : 0;
    case RD_OPT_CONFIG:
        o->config = arg;
        return 0;
    case RD_OPT_TOKENIZER:
        return rd_text_tokenizer(d->text, arg);
    case RD_OPT_TEMPLATE:
        return rd_text_template(d->text, arg);
    case RD_OPT_TIMEOUT:
        if ((rc = cli_flag_uint("router", "--replay-timeout", arg, 1, 600000, &v)) == 0)
            d->replay_timeout_ms = (int)v;
        return rc;
    case RD_OPT_SEED:
        if ((rc = cli_flag_uint("router", "--seed", arg, 0, UINT64_MAX, &o->hash.seed)) == 0)
            o->hash.seed_given = true;
        return rc;
    case RD_OPT_BS:
        if ((rc = cli_flag_uint("router", "--block-size", arg, 1, KVP_MAX_BLOCK_SIZE, &v)) == 0)
            d->hash.block_size = (uint32_t)v;
        return rc;
    case RD_OPT_LISTEN:
        return rd_listen_parse(o, arg);
    case RD_OPT_PORT:
        o->port_given = true;
        return cli_flag_uint("router", "--port", arg, 0, 65535, &o->port);
    case RD_OPT_THREADS:
        return cli_flag_uint("router", "--http-threads", arg, 1, 64, &o->threads);
    case RD_OPT_INDEX_BY:
        o->index_given = true;
        if (strcmp(arg, "tokens") == 0)
            d->index_by = KVP_ROUTER_INDEX_TOKENS;
        else if (strcmp(arg, "engine-hash") == 0)
            d->index_by = KVP_ROUTER_INDEX_ENGINE_HASH;
        else
            return fail(CLI_EXIT_USAGE, "--index-by: '%s' is not tokens or engine-hash", arg);
        return 0;
    case RD_OPT_TOKEN_SEED:
        o->token_seed = true;
        return cli_flag_uint("router", "--token-seed", arg, 0, UINT64_MAX, &d->token_seed);
    default:
        if ((rc = cli_flag_bytes("router", "--max-body", arg, 1, UINT64_C(1) << 32, &v)) == 0)
            d->max_body_bytes = (size_t)v;
        return rc;
    }
}

/* Parse argv into d and o. Returns 0, -1 after --help, or an exit status after a message. */
static int rd_parse_args(int argc, char **argv, rd_daemon *d, rd_opts *o)
{
    int c;
    cli_getopt_begin();
    while ((c = getopt_long(argc, argv, ":h", rd_longopts, NULL)) != -1) {
        if (c == '?' || c == ':')
            return cli_getopt_error("router", c, argv, rd_longopts);
        o->redis_flag = o->redis_flag || (c > RD_OPT_REDIS && c <= RD_OPT_WORKER_TTL);
        int rc = rd_apply_opt(d, o, c, optarg);
        if (rc)
            return rc;
    }
    if (optind < argc)
        return fail(CLI_EXIT_USAGE, "unexpected argument '%s'", argv[optind]);
    char lerr[256];
    if (rd_log_config(o->log_format, o->log_level, lerr, sizeof lerr))
        return fail(CLI_EXIT_USAGE, "%s", lerr);
    if (o->listen_port && o->port_given)
        return fail(CLI_EXIT_USAGE, "--listen ADDR:PORT and --port: give the port once");
    int krc = rd_key_load(o);
    if (krc)
        return krc;
    if (!o->hash.profile_given) {
        o->hash.profile = KVP_HASH_VLLM_SHA256;
        o->hash.profile_given = true;
    }
    /* Token mode is the default where it is safe: it needs no engine key or seed, but the
     * shared store keeps engine hashes. */
    if (!o->index_given)
        d->index_by = d->redis.url ? KVP_ROUTER_INDEX_ENGINE_HASH : KVP_ROUTER_INDEX_TOKENS;
    if (d->index_by == KVP_ROUTER_INDEX_TOKENS && d->redis.url)
        return fail(CLI_EXIT_USAGE, "--index-by tokens cannot be used with --redis (the shared "
                                    "index keeps engine hashes): use --index-by engine-hash");
    if (o->token_seed && d->index_by != KVP_ROUTER_INDEX_TOKENS)
        return fail(CLI_EXIT_USAGE, "--token-seed needs --index-by tokens");
    int p = o->hash.profile;
    if ((p == KVP_HASH_KEYED || p == KVP_HASH_SIPHASH) && o->hash.key_len == 0)
        return fail(CLI_EXIT_USAGE, "--hash %s needs --hash-key HEX (the engines' key)",
                    kvp_hash_profile_name(p));
    int rc = cli_hash_finish("router", &o->hash, &d->hash);
    if (rc)
        return rc;
    if (d->redis.url == NULL && o->redis_flag)
        return fail(CLI_EXIT_USAGE, "--redis-prefix, --redis-timeout, --redis-retry and "
                                    "--worker-ttl need --redis URL");
    char err[1024];
    if (o->config && rd_config_load(d, o->config, err, sizeof err))
        return fail(CLI_EXIT_INPUT, "%s", err);
    if (rd_spec_check(d, err, sizeof err))
        return fail(CLI_EXIT_USAGE, "%s", err);
    return 0;
}

/* Whether the hash settings alone make a router: then a KVP_EINVAL with --redis was the
 * URL's (the other --redis values are checked as flags). */
static bool rd_hash_ok(const kvp_router_config *rc)
{
    kvp_router_config plain = *rc;
    plain.redis.url = NULL;
    kvp_router *r = NULL;
    bool ok = kvp_router_new(&plain, &r) == KVP_OK;
    kvp_router_free(r);
    return ok;
}

/* Create the index with the daemon's hash config and shared store. Returns 0 or an exit
 * status. */
static int rd_router_new(rd_daemon *d)
{
    kvp_router_config rc;
    kvp_router_config_init(&rc);
    rc.hash = d->hash;
    rc.redis = d->redis;
    rc.index_by = d->index_by;
    rc.token_hash.seed = d->token_seed;
    int r = kvp_router_new(&rc, &d->router);
    if (r == KVP_ENOTSUP && d->redis.url)
        return fail(CLI_EXIT_USAGE,
                    "--redis: this build has no Redis support (libkvprefix-events was built "
                    "without hiredis: install libhiredis-dev and configure with -Dredis=enabled)");
    if (r == KVP_EINVAL && d->redis.url && rd_hash_ok(&rc))
        return fail(CLI_EXIT_USAGE,
                    "--redis: '%s' is not redis://HOST[:PORT][/DB], HOST:PORT or unix:PATH",
                    d->redis.url);
    if (r != KVP_OK)
        return fail(r == KVP_EINVAL ? CLI_EXIT_USAGE : CLI_EXIT_INPUT,
                    "cannot create the index with these %s settings: %s",
                    d->redis.url ? "hash and --redis" : "hash", kvp_strerror(r));
    if (d->index_by == KVP_ROUTER_INDEX_TOKENS)
        rd_log(
            "index: by tokens (the router's own xxh3 keys of the events' token_ids, seed %" PRIu64
            ", block size %" PRIu32 "): any engine hash algorithm and seed",
            d->token_seed, d->hash.block_size);
    else
        rd_log("index: by engine hash (%s, block size %" PRIu32 "; keys checked against the "
               "events' token_ids)",
               kvp_hash_profile_name(d->hash.hash_profile), d->hash.block_size);
    if (d->redis.url)
        rd_log("redis: shared index at %s, key prefix '%s', timeout %" PRIu32 " ms, retry %" PRIu32
               " ms, worker ttl %" PRIu32 " s",
               d->redis.url, d->redis.key_prefix, d->redis.timeout_ms, d->redis.retry_ms,
               d->redis.worker_ttl_s);
    return 0;
}

/* Tell systemd (Type=notify, NOTIFY_SOCKET set) the daemon's state; nothing in a build
 * without libsystemd or outside systemd. Cannot fail. */
static void rd_notify(const char *state)
{
#ifdef RD_HAVE_SYSTEMD
    int rc = sd_notify(0, state);
    if (rc < 0)
        rd_logl(RD_LOG_WARN, "sd_notify: %s", strerror(-rc));
#else
    (void)state;
#endif
}

/* Run the threads until SIGINT or SIGTERM (blocked in every thread, taken by sigwait).
 * Returns an exit status. */
static int rd_serve(rd_daemon *d, const rd_opts *o)
{
    sigset_t set; /* blocked since rd_main began (rd_block_signals) */
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_t ev;
    if (pthread_create(&ev, NULL, rd_events_run, d) != 0)
        return fail(CLI_EXIT_INPUT, "cannot start the event thread");
    void *http = NULL;
    uint16_t port = 0;
    char err[512];
    int status = CLI_EXIT_OK;
    if (rd_http_start(d, o->listen, (uint16_t)o->port, (unsigned)o->threads, &http, &port, err,
                      sizeof err) ||
        rd_scrape_start(d, err, sizeof err)) {
        status = fail(CLI_EXIT_INPUT, "%s", err);
    } else {
        bool v6 = strchr(o->listen, ':') != NULL;
        printf("kvprefix router: listening on http://%s%s%s:%u (%zu engine endpoints)\n",
               v6 ? "[" : "", o->listen, v6 ? "]" : "", (unsigned)port, d->n_sources);
        fflush(stdout);
        rd_notify("READY=1\nSTATUS=listening, subscribed to every engine endpoint");
        int sig = 0;
        sigwait(&set, &sig);
        rd_notify("STOPPING=1");
        rd_log("%s: stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
    }
    rd_scrape_stop(d);
    rd_http_stop(http);
    atomic_store(&d->stop, true);
    pthread_join(ev, NULL);
    return status;
}

/* Block SIGINT and SIGTERM (sigwait takes them in rd_serve) and ignore SIGPIPE, before any
 * thread exists: a thread inherits its creator's mask, and ZeroMQ starts its I/O threads
 * when the event sockets open, before rd_serve; a signal delivered to one of those with the
 * default action would end the daemon without its shutdown (seen as exit -15 in tests). */
static void rd_block_signals(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int rd_main(int argc, char **argv)
{
    rd_block_signals();
    rd_daemon d;
    memset(&d, 0, sizeof d);
    kvp_config_init(&d.hash);
    d.hash.block_size = 16;
    d.replay_timeout_ms = 2000;
    d.max_body_bytes = (size_t)16 << 20;
    d.lim.request_timeout_ms = 5000;
    d.lim.per_ip_connections = 64;
    d.lim.max_connections = 256;
    d.lim.body_budget.limit = (size_t)256 << 20;
    atomic_init(&d.lim.body_budget.used, 0);
    d.lim.endpoint_workers = 64;
    d.lim.endpoint_blocks = (uint64_t)16 << 20; /* 64 pods of 256k blocks on one ID '*' endpoint */
    kvp_router_config defaults;
    kvp_router_config_init(&defaults);
    d.redis = defaults.redis;
    atomic_init(&d.stop, false);
    pthread_mutex_init(&d.lock, NULL);
    rd_opts o;
    memset(&o, 0, sizeof o);
    cli_hash_init(&o.hash);
    o.listen = "127.0.0.1";
    o.port = 8700;
    o.threads = 2;
    kvp_router_rank_config_init(&d.rank);
    d.scrape_interval_ms = 1000;
    d.load_ttl_ms = 10000;
    int rc =
        rd_loads_new(&d) || rd_text_new(&d.text) ? fail(CLI_EXIT_INTERNAL, "out of memory") : 0;
    if (rc == 0)
        rc = rd_parse_args(argc, argv, &d, &o);
    if (rc == 0)
        rc = rd_text_load(d.text);
    char err[512];
    if (rc == 0)
        rc = rd_router_new(&d);
    if (rc == 0 && rd_events_open(&d, err, sizeof err))
        rc = fail(CLI_EXIT_INPUT, "%s", err);
    if (rc == 0)
        rc = rd_serve(&d, &o);
    rd_events_free(&d);
    kvp_router_free(d.router);
    rd_spec_free(&d);
    rd_loads_free(d.loads);
    rd_text_free(d.text);
    pthread_mutex_destroy(&d.lock);
    return rc < 0 ? CLI_EXIT_OK : rc;
}
