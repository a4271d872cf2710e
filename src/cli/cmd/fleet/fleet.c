/*
 * fleet.c - `kvprefix fleet`: a what-if fleet simulation. Replays a request log against N
 * replicas (each its own kvp_cache) under several routing policies and a simple time model,
 * and reports fleet hit rate, per-replica hit rate, load imbalance and modelled time to
 * first token per policy and replica count (docs/routing.md, "Fleet simulation").
 *
 * Flow: parse the options; check what can be checked before reading (the capacity's unit,
 * the model preset, the output files, which are created now and renamed into place only
 * when everything succeeded, the --tokenizer rank file, loaded now); read the whole log into
 * memory with its keys (fleet_log.c; the input flags and the tokenizer are input/inopts.c's,
 * shared with replay);
 * convert the capacity to blocks of the log's block size; run every (replica count,
 * policy) pair (fleet_sim.c); write the report (fleet_report.c) and the chart.
 *
 * With --index memory|redis the cache-aware policies ask a router index (fleet_index.c)
 * fed by the replicas' events instead of the caches themselves; each simulation gets a
 * fresh index, and with Redis its own key prefix (the run's, plus ":<count>.<policy>").
 *
 * Every replica of every fleet shares one hash key (an explicit --hash-key, or one derived
 * from --random-seed), so the keys computed once from the log hold on all of them, and a
 * run is a pure function of its input and options.
 *
 * Exit status (cli.h): 0 done, 1 bad input or failed I/O (messages "FILE:LINE: what is
 * wrong"), 2 usage, 3 internal error (a check of the simulation failed).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "flags.h"
#include "hashopt.h"
#include "kvplan.h"
#include "logread.h"
#include "models.h"
#include "outfile.h"
#include "fleet.h"

#define fail(...) cli_fail("fleet", __VA_ARGS__)

static const char usage_text[] =
    "Usage: kvprefix fleet [options] --capacity C LOG\n"
    "\n"
    "What-if fleet simulation: replay a request log against N replicas, each a prefix\n"
    "cache of C blocks (the library's pool, LRU unless --eviction), under several routing\n"
    "policies, and\n"
    "compare fleet and per-replica hit rate, load imbalance and modelled time to first\n"
    "token (docs/routing.md). LOG is read as `kvprefix replay` reads it: token-id logs,\n"
    "Mooncake hash-id traces, OpenAI bodies; plain, .gz or .zst; '-' for standard input.\n"
    "\n"
    "Fleet:\n"
    "  --capacity C         per replica: blocks (20000, 64K), tokens (1Mtok) or KV\n"
    "                       memory with --model (40GiB)\n"
    "  --model NAME         model preset for byte capacities (kvprefix plan --list-models);\n"
    "                       --kv-dtype T overrides its KV dtype\n"
    "  --replicas A,B,..    replica counts to compare (default 1,2,4,8,16; 1..1024)\n"
    "  --policies P,..      any of round-robin, random, least-loaded, affinity,\n"
    "                       cache-aware, cache-aware-cap (default: all)\n"
    "  --load-cap F         cache-aware-cap: skip replicas whose outstanding work is above\n"
    "                       F x the fleet mean (default 1.5; at least 1)\n"
    "  --overlap-weight US  cache-aware policies: rank by the cost US x blocks to prefill +\n"
    "                       outstanding work (microseconds per block), as `kvprefix router\n"
    "                       --overlap-weight` does (default 0: most cached blocks first)\n"
    "  --vnodes N           affinity: hash-ring points per replica (default 160)\n"
    "  --affinity-blocks K  affinity: hash the prompt's first K blocks (default 1)\n"
    "  --eviction P         every replica's eviction policy: lru (default), slru, s3fifo,\n"
    "                       cdecay\n"
    "                       (kvprefix replay --policy compares them on one cache)\n"
    "  --random-seed N      random: the stream's seed; also places the ring and, without\n"
    "                       --hash-key, gives the keyed profiles their key (default 1)\n"
    "\n"
    "Time model (integer nanoseconds; docs/routing.md):\n"
    "  --concurrency N      requests a replica serves at once, FIFO beyond (default 1)\n"
    "  --prefill-us X       microseconds per uncached prompt token (default 50)\n"
    "  --decode-us X        microseconds per output token (default 1000)\n"
    "  --interarrival-ms X  arrival gap for lines without a timestamp (default 100)\n"
    "  --output-tokens N    output tokens of token-log and OpenAI lines that give none\n"
    "                       (default 128)\n"
    "  Service = prefill-us x uncached prompt tokens + decode-us x output tokens;\n"
    "  TTFT = queueing + prefill. Timestamps are milliseconds (Mooncake's unit).\n"
    "\n"
    "Input:\n" IN_HELP
    "  --sort               sort by arrival (stable) instead of refusing disorder\n" FL_TIERS_HELP;

/* The rest of --help (one string would exceed what ISO C requires compilers to take). */
static const char usage_text2[] =
    "\n"
    "Hashing (figures differ between profiles only through key collisions):\n" CLI_HASH_HELP
    "  --seed N             --hash xxh3: the public 64-bit seed (default 0)\n"
    "\n"
    "Output:\n"
    "  --json, --csv        machine-readable output instead of the table\n"
    "  -o, --output FILE    write the report to FILE (replaced only when the run succeeds)\n"
    "  --plot FILE.svg      fleet hit rate of each policy against the replica count\n"
    "  --check              check the simulation's invariants after every event (slow);\n"
    "                       with an index and no delay, also that it agrees with every cache\n"
    "\n"
    "Router index (what cache-aware and cache-aware-cap ask; docs/routing.md):\n"
    "  --index I            oracle (default: every replica's cache, exact and instant),\n"
    "                       memory (a kvp_router fed by the replicas' KV events) or redis\n"
    "  --redis URL          the router's shared store (redis://HOST:PORT[/DB], HOST:PORT,\n"
    "                       unix:PATH); implies --index redis\n"
    "  --redis-prefix P     key prefix (1..48 of A-Z a-z 0-9 _ . : -; default a fresh one\n"
    "                       per run); each simulation removes its workers at its end\n"
    "  --event-delay-ms D   events reach the index D ms of simulated time after they\n"
    "                       happen (default 0: decisions equal the oracle's)\n"
    "  The report adds real (wall-clock) timings of the index's calls: score p50/p99/max,\n"
    "  applies per second, Redis round trips and fallbacks.\n"
    "\n"
    "Examples:\n"
    "  kvprefix fleet --capacity 1024 conversation_trace.jsonl\n"
    "  kvprefix fleet --capacity 40GiB --model Llama-3.1-8B --plot fleet.svg trace.jsonl\n"
    "  kvprefix fleet --capacity 4096 --replicas 2 --policies round-robin,cache-aware \\\n"
    "      --json chat.jsonl\n"
    "  kvprefix fleet --capacity 1024 --replicas 8 --policies cache-aware \\\n"
    "      --redis redis://127.0.0.1:6379 trace.jsonl\n"
    "\n" CLI_EXIT_HELP;

enum {
    OPT_CAPACITY = 256,
    OPT_MODEL,
    OPT_KV_DTYPE,
    OPT_REPLICAS,
    OPT_POLICIES,
    OPT_LOAD_CAP,
    OPT_VNODES,
    OPT_AFFINITY_BLOCKS,
    OPT_EVICTION,
    OPT_RANDOM_SEED,
    OPT_CONCURRENCY,
    OPT_PREFILL,
    OPT_DECODE,
    OPT_INTERARRIVAL,
    OPT_OUTPUT_TOKENS,
    OPT_SORT,
    OPT_SEED,
    OPT_JSON,
    OPT_CSV,
    OPT_PLOT,
    OPT_CHECK,
    OPT_INDEX,
    OPT_REDIS,
    OPT_REDIS_PREFIX,
    OPT_EVENT_DELAY,
    OPT_OVERLAP_WEIGHT
};

static const struct option longopts[] = {
    {"capacity", required_argument, NULL, OPT_CAPACITY},
    {"model", required_argument, NULL, OPT_MODEL},
    {"kv-dtype", required_argument, NULL, OPT_KV_DTYPE},
    {"replicas", required_argument, NULL, OPT_REPLICAS},
    {"policies", required_argument, NULL, OPT_POLICIES},
    {"load-cap", required_argument, NULL, OPT_LOAD_CAP},
    {"overlap-weight", required_argument, NULL, OPT_OVERLAP_WEIGHT},
    {"vnodes", required_argument, NULL, OPT_VNODES},
    {"affinity-blocks", required_argument, NULL, OPT_AFFINITY_BLOCKS},
    {"eviction", required_argument, NULL, OPT_EVICTION},
    {"random-seed", required_argument, NULL, OPT_RANDOM_SEED},
    {"concurrency", required_argument, NULL, OPT_CONCURRENCY},
    {"prefill-us", required_argument, NULL, OPT_PREFILL},
    {"decode-us", required_argument, NULL, OPT_DECODE},
    {"interarrival-ms", required_argument, NULL, OPT_INTERARRIVAL},
    {"output-tokens", required_argument, NULL, OPT_OUTPUT_TOKENS},
    {"sort", no_argument, NULL, OPT_SORT},
    {"seed", required_argument, NULL, OPT_SEED},
    {"json", no_argument, NULL, OPT_JSON},
    {"csv", no_argument, NULL, OPT_CSV},
    {"output", required_argument, NULL, 'o'},
    {"plot", required_argument, NULL, OPT_PLOT},
    {"check", no_argument, NULL, OPT_CHECK},
    {"index", required_argument, NULL, OPT_INDEX},
    {"redis", required_argument, NULL, OPT_REDIS},
    {"redis-prefix", required_argument, NULL, OPT_REDIS_PREFIX},
    {"event-delay-ms", required_argument, NULL, OPT_EVENT_DELAY},
    {"help", no_argument, NULL, 'h'},
    CLI_HASH_LONGOPTS,
    IN_LONGOPTS,
    FL_TIERS_LONGOPTS,
    {NULL, 0, NULL, 0},
};

static const cli_choice policy_choices[] = {{"round-robin", FL_ROUND_ROBIN},
                                            {"random", FL_RANDOM},
                                            {"least-loaded", FL_LEAST_LOADED},
                                            {"affinity", FL_AFFINITY},
                                            {"cache-aware", FL_CACHE_AWARE},
                                            {"cache-aware-cap", FL_CACHE_CAP},
                                            {NULL, 0}};

/* --eviction: the library's policies (kvp_config.eviction), by name. */
static const cli_choice eviction_choices[] = {{"lru", KVP_EVICT_LRU},
                                              {"slru", KVP_EVICT_SLRU},
                                              {"s3fifo", KVP_EVICT_S3FIFO},
                                              {"cdecay", KVP_EVICT_CDECAY},
                                              {NULL, 0}};

static const cli_choice index_choices[] = {
    {"oracle", FL_INDEX_ORACLE}, {"memory", FL_INDEX_MEMORY}, {"redis", FL_INDEX_REDIS}, {NULL, 0}};

/* ---- flag values ------------------------------------------------------------------------- */

/* Parse a decimal with at most 3 fraction digits ("50", "0.5", ".125") into thousandths.
 * Returns true and *out, or false when it is not one or exceeds max thousandths. */
static bool parse_milli(const char *s, uint64_t max, uint64_t *out)
{
    uint64_t ip = 0, frac = 0, v = 0;
    int n_int = 0, n_frac = 0;
    for (; *s >= '0' && *s <= '9'; s++, n_int++)
        if (__builtin_mul_overflow(ip, 10, &ip) ||
            __builtin_add_overflow(ip, (uint64_t)(*s - '0'), &ip))
            return false;
    if (*s == '.') {
        for (s++; *s >= '0' && *s <= '9'; s++, n_frac++) {
            if (n_frac == 3)
                return false;
            frac = frac * 10 + (uint64_t)(*s - '0');
        }
        if (n_frac == 0)
            return false;
    }
    for (int i = n_frac; i < 3; i++)
        frac *= 10;
    if (*s != '\0' || (n_int == 0 && n_frac == 0) || __builtin_mul_overflow(ip, 1000, &v) ||
        __builtin_add_overflow(v, frac, &v) || v > max)
        return false;
    *out = v;
    return true;
}

/* A decimal flag with up to 3 decimals in min/1000 .. max/1000, into thousandths. */
static int flag_milli(const char *flag, const char *v, uint64_t min, uint64_t max, const char *what,
                      uint64_t *out)
{
    uint64_t x;
    if (!parse_milli(v, max, &x) || x < min)
        return fail(CLI_EXIT_USAGE, "%s: '%s' is not %s", flag, v, what);
    *out = x;
    return 0;
}

/* One --replicas item. */
static int count_item(void *ctx, const char *item, size_t len, size_t index)
{
    fl_options *o = ctx;
    char buf[32];
    uint64_t x;
    if (!cli_item_copy(item, len, buf, sizeof buf) ||
        cli_parse_uint(buf, FL_MAX_REPLICAS, &x) != CLI_OK || x == 0)
        return fail(CLI_EXIT_USAGE, "--replicas: '%.*s' is not an integer in 1..%u", (int)len, item,
                    FL_MAX_REPLICAS);
    if (index > 0 && x <= o->counts[index - 1])
        return fail(CLI_EXIT_USAGE, "--replicas: the counts must increase ('%.*s' after %u)",
                    (int)len, item, o->counts[index - 1]);
    o->counts[index] = (uint32_t)x;
    o->n_counts = index + 1;
    return 0;
}

/* One --policies item. */
static int policy_item(void *ctx, const char *item, size_t len, size_t index)
{
    fl_options *o = ctx;
    char buf[32];
    int p;
    (void)index;
    if (!cli_item_copy(item, len, buf, sizeof buf))
        snprintf(buf, sizeof buf, "%s", "?");
    int rc = cli_flag_choice("fleet", "--policies", buf, policy_choices, &p);
    if (rc == 0)
        o->policies[p] = true;
    return rc;
}

/* Apply a model or fleet option. Returns 0 or the exit status. */
static int apply_model(fl_options *o, int c, const char *flag, const char *v)
{
    uint64_t x = 0;
    int rc = 0;
    switch (c) {
    case OPT_LOAD_CAP:
        if ((rc = flag_milli(flag, v, 1000, 1000000, "a factor in 1..1000 (3 decimals at most)",
                             &x)) == 0)
            o->model.load_cap = (double)x / 1000.0;
        return rc;
    case OPT_OVERLAP_WEIGHT:
        if ((rc = flag_milli(flag, v, 0, FL_MAX_COST_NS,
                             "microseconds in 0..1000000 (3 decimals at most)", &x)) == 0)
            o->model.overlap_weight = (double)x;
        return rc;
    case OPT_PREFILL:
    case OPT_DECODE:
        rc = flag_milli(flag, v, 0, FL_MAX_COST_NS,
                        "microseconds in 0..1000000 (3 decimals at most)",
                        c == OPT_PREFILL ? &o->model.prefill_ns : &o->model.decode_ns);
        return rc;
    case OPT_INTERARRIVAL:
        if ((rc = flag_milli(flag, v, 0, UINT64_C(1) << 40,
                             "milliseconds in 0..1099511627 (3 decimals at most)", &x)) == 0)
            o->log.interarrival = (fl_time)x * 1000;
        return rc;
    case OPT_CONCURRENCY:
        if ((rc = cli_flag_uint("fleet", flag, v, 1, FL_MAX_CONCURRENT, &x)) == 0)
            o->model.concurrency = (uint32_t)x;
        return rc;
    case OPT_VNODES:
        if ((rc = cli_flag_uint("fleet", flag, v, 1, 10000, &x)) == 0)
            o->model.vnodes = (uint32_t)x;
        return rc;
    case OPT_AFFINITY_BLOCKS:
        if ((rc = cli_flag_uint("fleet", flag, v, 1, UINT32_MAX, &x)) == 0)
            o->model.affinity_blocks = (uint32_t)x;
        return rc;
    case OPT_RANDOM_SEED:
        return cli_flag_uint("fleet", flag, v, 0, UINT64_MAX, &o->model.random_seed);
    case OPT_OUTPUT_TOKENS:
        if ((rc = cli_flag_uint("fleet", flag, v, 0, FL_MAX_TOKENS, &x)) == 0)
            o->log.default_output = (uint32_t)x;
        return rc;
    case OPT_EVENT_DELAY:
        if ((rc = flag_milli(flag, v, 0, UINT64_C(1) << 40,
                             "milliseconds in 0..1099511627 (3 decimals at most)", &x)) == 0)
            o->index.event_delay = (fl_time)x * 1000;
        o->delay_given = true;
        return rc;
    default:
        return 0;
    }
}

/* Apply a router index option. Returns 0 or the exit status. */
static int apply_index(fl_options *o, int c, const char *v)
{
    switch (c) {
    case OPT_INDEX:
        o->index_given = true;
        return cli_flag_choice("fleet", "--index", v, index_choices, &o->index.mode);
    case OPT_REDIS:
        o->index.redis_url = v;
        return 0;
    default:
        o->redis_prefix = v;
        return 0;
    }
}

/* Apply a list option or --seed. Returns 0 or the exit status. */
static int apply_input(fl_options *o, int c, const char *flag, const char *v)
{
    int rc = 0;
    switch (c) {
    case OPT_SEED:
        if ((rc = cli_flag_uint("fleet", flag, v, 0, UINT64_MAX, &o->hash.seed)) == 0)
            o->hash.seed_given = true;
        return rc;
    case OPT_REPLICAS:
        return cli_flag_list("fleet", flag, v, FL_MAX_COUNTS, count_item, o);
    case OPT_POLICIES:
        memset(o->policies, 0, sizeof o->policies);
        return cli_flag_list("fleet", flag, v, 32, policy_item, o);
    case OPT_EVICTION:
        return cli_flag_choice("fleet", flag, v, eviction_choices, &o->cache.eviction);
    default:
        return apply_model(o, c, flag, v);
    }
}

/* Apply one option getopt_long returned. Returns 0, -1 after --help, or the exit status. */
static int apply_opt(fl_options *o, int c, const char *v)
{
    char name[40] = "";
    switch (c) {
    case 'h':
        fputs(usage_text, stdout);
        fputs(usage_text2, stdout);
        return -1;
    case 'o':
        o->output_path = v;
        return 0;
    case OPT_CAPACITY:
        o->capacity = v;
        return 0;
    case OPT_MODEL:
        o->model_name = v;
        return 0;
    case OPT_KV_DTYPE:
        o->kv_dtype = v;
        return 0;
    case OPT_PLOT:
        o->plot_path = v;
        return 0;
    case OPT_SORT:
        o->log.sort = true;
        return 0;
    case OPT_JSON:
    case OPT_CSV:
        *(c == OPT_JSON ? &o->json : &o->csv) = true;
        return 0;
    case OPT_CHECK:
        o->check = true;
        return 0;
    case OPT_INDEX:
    case OPT_REDIS:
    case OPT_REDIS_PREFIX:
        return apply_index(o, c, v);
    default:
        if (cli_hash_is_opt(c))
            return cli_hash_apply("fleet", &o->hash, c, v);
        if (in_is_opt(c))
            return in_apply("fleet", &o->in, c, v);
        if (fl_tiers_is_opt(c))
            return fl_tiers_apply(&o->tiers, c, v);
        return apply_input(o, c, cli_opt_name(longopts, c, name, sizeof name), v);
    }
}

/* Give every replica the same hash key: keyed and siphash without --hash-key get one
 * derived from --random-seed, so that a run is reproducible (the key changes the figures
 * only through key collisions and the affinity ring's placement of prefixes). Cannot fail. */
static void shared_key(kvp_config *c, uint64_t seed)
{
    if (c->hash_key_len != 0 ||
        (c->hash_profile != KVP_HASH_KEYED && c->hash_profile != KVP_HASH_SIPHASH))
        return;
    for (size_t i = 0; i < KVP_HASH_KEY_MAX; i += 8) {
        uint64_t w = fl_mix64(seed + UINT64_C(0x6b65792d726f7574) * (i / 8 + 1));
        memcpy(c->hash_key + i, &w, 8);
    }
    c->hash_key_len = KVP_HASH_KEY_MAX;
}

/* Is s a key prefix Redis keys may start with here: 1..48 of [A-Za-z0-9_.:-] (the router
 * takes 64; each simulation appends up to 7)? */
static bool prefix_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 48)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '.' || *s == ':' || *s == '-'))
            return false;
    return true;
}

/* The router index options against each other. Returns 0 or the exit status. */
static int check_index(fl_options *o)
{
    fl_index_config *x = &o->index;
    if (x->redis_url && !o->index_given)
        x->mode = FL_INDEX_REDIS;
    if (x->redis_url && x->mode != FL_INDEX_REDIS)
        return fail(CLI_EXIT_USAGE, "--redis URL needs --index redis (it implies it alone)");
    if (x->mode == FL_INDEX_REDIS && !x->redis_url)
        return fail(CLI_EXIT_USAGE, "--index redis needs --redis URL");
    if (o->redis_prefix && x->mode != FL_INDEX_REDIS)
        return fail(CLI_EXIT_USAGE, "--redis-prefix needs --redis URL");
    if (o->redis_prefix && !prefix_ok(o->redis_prefix))
        return fail(CLI_EXIT_USAGE,
                    "--redis-prefix: '%s' is not 1..48 characters of A-Z a-z 0-9 _ . : -",
                    o->redis_prefix);
    if (o->delay_given && x->mode == FL_INDEX_ORACLE)
        return fail(CLI_EXIT_USAGE, "--event-delay-ms needs --index memory or redis (the "
                                    "oracle has no events)");
    if (x->mode != FL_INDEX_ORACLE && !fl_index_available())
        return fail(CLI_EXIT_USAGE,
                    "--index %s: this kvprefix was built without libkvprefix-events",
                    fl_index_name(x->mode));
    return 0;
}

/* The checks between options, once all are known. Returns 0 or the exit status. */
static int check_args(fl_options *o)
{
    if (!o->log.path)
        return fail(CLI_EXIT_USAGE, "no log given");
    if (!o->capacity)
        return fail(CLI_EXIT_USAGE, "give --capacity C (blocks per replica)");
    if (o->json && o->csv)
        return fail(CLI_EXIT_USAGE, "--json and --csv exclude each other");
    bool any = false;
    for (int p = 0; p < FL_N_POLICIES; p++)
        any |= o->policies[p];
    if (!any)
        return fail(CLI_EXIT_USAGE, "--policies: no policy");
    if (check_index(o) != 0 || fl_tiers_check(&o->tiers, o->model_name != NULL) != 0)
        return CLI_EXIT_USAGE;
    if (in_check("fleet", &o->in) != 0 || cli_hash_finish("fleet", &o->hash, &o->cache) != 0)
        return CLI_EXIT_USAGE;
    shared_key(&o->cache, o->model.random_seed);
    const char *inputs[] = {o->log.path};
    return cli_out_check_pair("fleet", o->output_path, o->plot_path, inputs, 1);
}

static void defaults(fl_options *o)
{
    memset(o, 0, sizeof *o);
    in_init(&o->in);
    o->log.in = &o->in;
    o->log.interarrival = (fl_time)100 * 1000 * 1000;
    o->log.default_output = 128;
    o->log.cache = &o->cache;
    static const uint32_t counts[] = {1, 2, 4, 8, 16};
    memcpy(o->counts, counts, sizeof counts);
    o->n_counts = 5;
    for (int p = 0; p < FL_N_POLICIES; p++)
        o->policies[p] = true;
    o->model.concurrency = 1;
    o->model.prefill_ns = UINT64_C(50) * 1000;
    o->model.decode_ns = UINT64_C(1000) * 1000;
    o->model.load_cap = 1.5;
    o->model.vnodes = 160;
    o->model.affinity_blocks = 1;
    o->model.random_seed = 1;
    kvp_config_init(&o->cache);
    cli_hash_init(&o->hash);
}

/* Parse argv. Returns 0, -1 after --help, or the exit status (message printed). */
static int parse_args(int argc, char **argv, fl_options *o)
{
    defaults(o);
    int c;
    cli_getopt_begin();
    while ((c = getopt_long(argc, argv, ":ho:", longopts, NULL)) != -1) {
        if (c == '?' || c == ':')
            return cli_getopt_error("fleet", c, argv, longopts);
        int rc = apply_opt(o, c, optarg);
        if (rc)
            return rc;
    }
    if (optind < argc)
        o->log.path = argv[optind++];
    if (optind < argc)
        return fail(CLI_EXIT_USAGE, "one log at a time ('%s' and '%s')", o->log.path, argv[optind]);
    return check_args(o);
}

/* ---- capacity ----------------------------------------------------------------------------- */

/* The capacity as given: an amount in blocks (0), tokens (1) or bytes (2). */
typedef struct capacity_spec {
    int unit;
    uint64_t amount;
} capacity_spec;

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Parse --capacity: "20000", "64K" (blocks), "1Mtok" (tokens), "40GiB" (bytes). Returns 0
 * or CLI_EXIT_USAGE. */
static int parse_cap(const char *s, capacity_spec *out)
{
    char buf[64];
    if (strlen(s) >= sizeof buf)
        return fail(CLI_EXIT_USAGE, "--capacity: '%.40s...' is not a capacity", s);
    snprintf(buf, sizeof buf, "%s", s);
    size_t n = strlen(buf);
    int rc;
    if (ends_with(buf, "tok") || ends_with(buf, "tokens")) {
        buf[n - (ends_with(buf, "tok") ? 3 : 6)] = '\0';
        out->unit = 1;
        rc = cli_parse_count(buf, &out->amount);
    } else if (n > 0 && (buf[n - 1] == 'B' || buf[n - 1] == 'b')) {
        out->unit = 2;
        rc = cli_parse_bytes(buf, &out->amount);
    } else {
        out->unit = 0;
        rc = cli_parse_count(buf, &out->amount);
    }
    if (rc != CLI_OK || out->amount == 0)
        return fail(CLI_EXIT_USAGE,
                    "--capacity: '%s' is not a positive capacity (blocks: 20000 or 64K; tokens: "
                    "1Mtok; KV memory: 40GiB with --model)",
                    s);
    return 0;
}

/* KV bytes per token of --model (and --kv-dtype) into *token_bytes and a description, or
 * 0 / "" without a model. Returns 0 or the exit status. */
static int model_bytes(const fl_options *o, uint64_t *token_bytes, char *desc, size_t size)
{
    if (!o->model_name)
        return o->kv_dtype ? fail(CLI_EXIT_USAGE, "--kv-dtype needs --model") : 0;
    const cap_model_preset *p = cap_model_find(o->model_name);
    if (!p)
        return fail(CLI_EXIT_USAGE, "--model: no preset '%s' (kvprefix plan --list-models)",
                    o->model_name);
    cap_model_shape m = p->shape;
    if (o->kv_dtype && cap_dtype_parse(o->kv_dtype, &m.kv_dtype) != CAP_OK)
        return fail(CLI_EXIT_USAGE, "--kv-dtype: unknown dtype '%s'", o->kv_dtype);
    if (cap_token_bytes(&m, m.n_kv_heads, token_bytes) != CAP_OK)
        return fail(CLI_EXIT_INPUT, "model shape: KV bytes overflow");
    snprintf(desc, size, "%s, %s KV", p->name, cap_dtype_name(m.kv_dtype));
    return 0;
}

/* Convert the capacity to blocks of the log's block size and check the fleet limits.
 * Returns 0 or the exit status. */
static int capacity_blocks(const fl_options *o, const capacity_spec *c, uint64_t token_bytes,
                           fl_report *rep)
{
    uint64_t b = c->amount, block_bytes = 0;
    if (token_bytes && cap_mul(token_bytes, rep->block_size, &block_bytes) != CAP_OK)
        return fail(CLI_EXIT_INPUT, "the KV bytes of one block overflow");
    if (c->unit == 1)
        b = c->amount / rep->block_size;
    if (c->unit == 2)
        b = c->amount / block_bytes;
    if (b == 0)
        return fail(CLI_EXIT_INPUT, "--capacity: less than one block of %u tokens",
                    rep->block_size);
    if (b > FL_MAX_CAPACITY)
        return fail(CLI_EXIT_INPUT, "--capacity: %llu blocks per replica is above the limit (%llu)",
                    (unsigned long long)b, (unsigned long long)FL_MAX_CAPACITY);
    uint32_t most = o->counts[o->n_counts - 1];
    if (b * most > FL_MAX_FLEET)
        return fail(CLI_EXIT_INPUT,
                    "--capacity: %u replicas of %llu blocks exceed the fleet limit of %llu blocks",
                    most, (unsigned long long)b, (unsigned long long)FL_MAX_FLEET);
    rep->capacity = b;
    rep->block_bytes = block_bytes;
    return 0;
}

/* ---- the run ------------------------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The run at rep->runs[at] again with the tiers below the GPU pools, into rep->tiers.runs[at]
 * and rep->tiers.figs[at]. Returns 0 or the exit status. */
static int simulate_tiers(const fl_options *o, const fl_log *log, fl_report *rep, fl_sim_config *sc,
                          size_t at)
{
    char err[1024];
    fl_tier_sim *ts = fl_tier_sim_new(&rep->tiers.setup, sc->n_replicas);
    if (!ts)
        return fail(CLI_EXIT_INPUT, "out of memory");
    sc->tiers = ts;
    char prefix[sizeof rep->redis_prefix + 48];
    snprintf(prefix, sizeof prefix, "%s:%zu.t", rep->redis_prefix, at);
    fl_index_config ic = *sc->index;
    ic.key_prefix = prefix;
    sc->index = &ic;
    int rc = fl_sim_run(log, sc, &rep->tiers.runs[at], err, sizeof err);
    if (rc == FL_OK && o->check && !fl_tier_sim_check(ts))
        rc = FL_EINTERNAL, snprintf(err, sizeof err, "internal error: the tiers fail their check");
    fl_tier_sim_figs(ts, &rep->tiers.figs[at]);
    fl_tier_sim_free(ts);
    if (rc == FL_EINPUT) {
        fprintf(stderr, "%s\n", err);
        return CLI_EXIT_INPUT;
    }
    if (rc != FL_OK)
        return fail(rc == FL_ENOMEM ? CLI_EXIT_INPUT : CLI_EXIT_INTERNAL, "%s", err);
    return 0;
}

/* Run every (replica count, policy) pair into rep->runs. Returns 0 or the exit status. */
static int simulate(const fl_options *o, const fl_log *log, fl_report *rep)
{
    rep->runs = calloc(o->n_counts * FL_N_POLICIES, sizeof *rep->runs);
    if (!rep->runs)
        return fail(CLI_EXIT_INPUT, "out of memory");
    double t0 = now_s();
    for (size_t k = 0; k < o->n_counts; k++)
        for (int p = 0; p < FL_N_POLICIES; p++) {
            if (!o->policies[p])
                continue;
            char prefix[sizeof rep->redis_prefix + 48];
            snprintf(prefix, sizeof prefix, "%s:%zu.%d", rep->redis_prefix, k, p);
            fl_index_config ic = o->index;
            ic.key_prefix = prefix;
            fl_sim_config sc = {o->log.path, o->counts[k], p,     (uint32_t)rep->capacity,
                                &o->cache,   o->model,     false, o->check,
                                &ic,         NULL};
            char err[1024];
            int rc =
                fl_sim_run(log, &sc, &rep->runs[k * FL_N_POLICIES + (size_t)p], err, sizeof err);
            if (rc != FL_OK) {
                if (rc == FL_EINPUT) {
                    fprintf(stderr, "%s\n", err);
                    return CLI_EXIT_INPUT;
                }
                return fail(rc == FL_ENOMEM ? CLI_EXIT_INPUT : CLI_EXIT_INTERNAL, "%s", err);
            }
            size_t at = k * FL_N_POLICIES + (size_t)p;
            if (rep->tiers.figs && (rc = simulate_tiers(o, log, rep, &sc, at)) != 0)
                return rc;
        }
    rep->seconds_sim = now_s() - t0;
    return 0;
}

/* The run's Redis key prefix: --redis-prefix, or "kvpfleet-<pid>-<ns>" in hex, so that
 * runs never see each other's keys. Cannot fail. */
static void run_prefix(const fl_options *o, char *buf, size_t size)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (o->redis_prefix)
        snprintf(buf, size, "%s", o->redis_prefix);
    else
        snprintf(buf, size, "kvpfleet-%lx-%llx", (unsigned long)getpid(),
                 (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
}

/* Say on standard error when Redis did not always answer: the decisions are still the
 * index's (the router's local view takes every batch), but those timings are not Redis's.
 * Cannot fail. */
static void redis_note(const fl_options *o, const fl_report *rep)
{
    uint64_t scores = 0, fell = 0, applies = 0;
    for (size_t i = 0; o->index.mode == FL_INDEX_REDIS && i < o->n_counts * FL_N_POLICIES; i++) {
        scores += rep->runs[i].index.n_scores;
        fell += rep->runs[i].index.n_fallback_scores;
        applies += rep->runs[i].index.n_fallback_applies;
    }
    if (fell + applies)
        fprintf(stderr,
                "kvprefix fleet: Redis at %s did not always answer: %llu of %llu scores and "
                "%llu applies used the router's local view (the fallback column)\n",
                o->index.redis_url, (unsigned long long)fell, (unsigned long long)scores,
                (unsigned long long)applies);
}

/* Read, simulate and write. Returns 0 or the exit status. */
static int run(const fl_options *o, const capacity_spec *cap, uint64_t token_bytes, fl_report *rep,
               cli_out *report, cli_out *plot)
{
    double t0 = now_s();
    fl_log *log = NULL;
    char err[1024];
    int rc = fl_log_read(&o->log, &log, err, sizeof err);
    if (rc != FL_OK) {
        fprintf(stderr, "%s\n", err);
        return CLI_EXIT_INPUT;
    }
    rep->format = fl_log_format(log);
    rep->block_size = fl_log_block_size(log);
    rep->n_requests = fl_log_n(log);
    rep->n_prompt_tokens = fl_log_prompt_tokens(log);
    rep->n_lines = fl_log_n_lines(log);
    rep->timestamps = fl_log_all_timestamps(log);
    rep->count = *fl_log_count(log);
    rc = capacity_blocks(o, cap, token_bytes, rep);
    if (rc == 0 && fl_tiers_on(&o->tiers)) {
        rc = fl_tiers_setup(&o->tiers, rep->block_size, rep->block_bytes, o->model.prefill_ns,
                            &rep->tiers.setup);
        rep->tiers.figs = calloc(o->n_counts * FL_N_POLICIES, sizeof *rep->tiers.figs);
        rep->tiers.runs = calloc(o->n_counts * FL_N_POLICIES, sizeof *rep->tiers.runs);
        if (rc == 0 && (!rep->tiers.figs || !rep->tiers.runs))
            rc = fail(CLI_EXIT_INPUT, "out of memory");
    }
    if (rc == 0 && (rc = simulate(o, log, rep)) == 0)
        redis_note(o, rep);
    fl_log_free(log);
    rep->seconds = now_s() - t0;
    if (rc == 0 && plot->f && fl_plot_write(plot->f, o, rep, err, sizeof err) != 0)
        rc = fail(CLI_EXIT_INPUT, "%s: %s", o->plot_path, err);
    if (rc == 0 && fl_report_write(report->f, o, rep) != 0 && report->f != stdout)
        rc = fail(CLI_EXIT_INPUT, "%s: cannot write the report", o->output_path);
    /* The report first: a chart is only replaced when the report could be written too. */
    if (rc == 0)
        rc = cli_out_commit("fleet", report);
    if (rc == 0 && plot->f)
        rc = cli_out_commit("fleet", plot);
    return rc;
}

int fl_main(int argc, char **argv)
{
    fl_options o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? cli_stdout_check("fleet") : rc;
    capacity_spec cap = {0, 0};
    uint64_t token_bytes = 0;
    fl_report rep;
    memset(&rep, 0, sizeof rep);
    rep.input = cli_input_name(o.log.path);
    run_prefix(&o, rep.redis_prefix, sizeof rep.redis_prefix);
    if ((rc = parse_cap(o.capacity, &cap)) != 0)
        return rc;
    if ((rc = model_bytes(&o, &token_bytes, rep.model_desc, sizeof rep.model_desc)) != 0)
        return rc;
    if (cap.unit == 2 && token_bytes == 0)
        return fail(CLI_EXIT_USAGE, "--capacity: a capacity in bytes needs --model");
    cli_out report, plot;
    memset(&plot, 0, sizeof plot);
    /* Created now, so that a path that cannot be written stops the run before the log is
     * read; nothing replaces a target before every output is complete. */
    if (o.plot_path && (rc = cli_out_open("fleet", &plot, o.plot_path)) != 0)
        return rc;
    if ((rc = cli_out_open("fleet", &report, o.output_path ? o.output_path : "-")) != 0) {
        cli_out_abort(&plot);
        return rc;
    }
    /* The rank file after the outputs, as replay does: both are checked before the log. */
    rc = in_load("fleet", &o.in);
    if (rc == 0)
        rc = run(&o, &cap, token_bytes, &rep, &report, &plot);
    cli_out_abort(&plot);
    cli_out_abort(&report);
    in_free(&o.in);
    for (size_t i = 0; rep.runs && i < o.n_counts * FL_N_POLICIES; i++)
        fl_result_free(&rep.runs[i]);
    free(rep.runs);
    for (size_t i = 0; rep.tiers.runs && i < o.n_counts * FL_N_POLICIES; i++)
        fl_result_free(&rep.tiers.runs[i]);
    free(rep.tiers.runs);
    free(rep.tiers.figs);
    return rc;
}
