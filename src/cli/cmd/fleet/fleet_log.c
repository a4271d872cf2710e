/*
 * fleet_log.c - the request log of `kvprefix fleet` held in memory, with every request's
 * block keys computed once (fleet.h).
 *
 * Layout: one fl_req per request, in arrival order, and four growable arrays they index:
 *
 *   reqs[]    arrival, lengths, offsets, namespace index, root, affinity key
 *   tokens[]  token logs and OpenAI bodies: prompt token ids, 4 bytes per token
 *   ids[]     Mooncake traces: hash ids, 8 bytes per id
 *   keys[]    full prompt blocks' keys, 16 bytes per block
 *   ns[]      distinct consecutive namespaces (strings in one byte pool); ns[0] = none
 *
 * Keys come from kvp_cache_keys on a one-block cache made with the hash fields every
 * replica shares (the options give them an explicit key), so they are valid for every
 * replica's kvp_lookup_keys / kvp_acquire_keys / kvp_commit_keys. A Mooncake line has no
 * tokens: its prompt is synthesized from its hash ids (fl_log_tokens) and keyed like any
 * prompt, which keeps equal-id prefixes equal and different ones apart.
 *
 * Arrival times: a line's "timestamp" (milliseconds, Mooncake's unit) or, without one, the
 * previous arrival plus the configured gap. Arrivals must not go backwards unless the log
 * is sorted (cfg->sort: a stable sort by arrival after reading).
 *
 * Invariants: every offset plus its count lies inside its array; n_keys == n_prompt /
 * block_size; arrivals are non-decreasing once fl_log_read returns.
 * Cost: one pass over the log; memory about the size of its id arrays plus 16 bytes per
 * block and 96 bytes per request (plus the reader's one line).
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cli.h"
#include "logread.h"
#include "fleet.h"

/* One namespace: offsets of its four strings in the byte pool. */
typedef struct fl_ns {
    size_t off[4];   /* model, adapter, tenant, salt: where each starts in strs[] */
    size_t len[4];   /* their byte lengths */
    bool present[4]; /* absent fields have no bytes */
} fl_ns;

struct fl_log {
    fl_req *reqs; /* the requests, in arrival order */
    size_t n_reqs, reqs_cap;
    uint32_t *tokens; /* token prompts */
    size_t n_tokens, tokens_cap;
    uint64_t *ids; /* Mooncake hash ids */
    size_t n_ids, ids_cap;
    kvp_key *keys; /* block keys */
    size_t n_keys, keys_cap;
    fl_ns *ns; /* namespaces; ns[0] has every field absent */
    size_t n_ns, ns_cap;
    char *strs; /* namespace bytes, each string NUL-terminated */
    size_t n_strs, strs_cap;
    uint32_t *synth; /* scratch: a Mooncake prompt being keyed */
    size_t synth_cap;
    int format;          /* LOG_* of its lines; 0 before the first */
    uint32_t block_size; /* tokens per block of that format */
    uint32_t max_prompt; /* longest prompt */
    uint64_t prompt_tokens;
    uint64_t n_lines;
    bool all_timestamps; /* every line had a timestamp */
    in_count count;      /* how OpenAI bodies were counted */
    kvp_cache *keyer;    /* one-block cache computing the keys */
};

/* The reading state of fl_log_read. */
typedef struct reading {
    const fl_log_config *cfg;
    fl_log *log;
    log_reader *reader;
    const char *name; /* the log's name in messages */
    fl_time last;     /* previous arrival */
    uint64_t last_line;
    bool any;  /* a request was read */
    char *err; /* the caller's message buffer */
    size_t err_size;
} reading;

static int line_err(reading *rd, uint64_t line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int line_err(reading *rd, uint64_t line, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cli_errf(rd->err, rd->err_size, "%s:%llu: %s", rd->name, (unsigned long long)line, msg);
    return FL_EINPUT;
}

static int oom(reading *rd)
{
    cli_errf(rd->err, rd->err_size, "out of memory reading %s", rd->name);
    return FL_ENOMEM;
}

/* ---- accessors ---------------------------------------------------------------------------- */

size_t fl_log_n(const fl_log *log)
{
    return log->n_reqs;
}

const fl_req *fl_log_req(const fl_log *log, size_t i)
{
    return &log->reqs[i];
}

int fl_log_format(const fl_log *log)
{
    return log->format;
}

uint32_t fl_log_block_size(const fl_log *log)
{
    return log->block_size;
}

uint64_t fl_log_prompt_tokens(const fl_log *log)
{
    return log->prompt_tokens;
}

uint32_t fl_log_max_prompt(const fl_log *log)
{
    return log->max_prompt;
}

uint64_t fl_log_n_lines(const fl_log *log)
{
    return log->n_lines;
}

bool fl_log_all_timestamps(const fl_log *log)
{
    return log->all_timestamps;
}

const in_count *fl_log_count(const fl_log *log)
{
    return &log->count;
}

const kvp_key *fl_log_keys(const fl_log *log, const fl_req *q)
{
    return log->keys + q->key;
}

kvp_namespace fl_log_ns(const fl_log *log, const fl_req *q)
{
    const fl_ns *n = &log->ns[q->ns];
    kvp_field *f[4];
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    f[0] = &ns.model;
    f[1] = &ns.adapter;
    f[2] = &ns.tenant;
    f[3] = &ns.salt;
    for (int i = 0; i < 4; i++)
        if (n->present[i]) {
            f[i]->ptr = log->strs + n->off[i];
            f[i]->len = n->len[i];
        }
    return ns;
}

/* Write the synthetic prompt of n_prompt tokens from ids[0 .. n_ids) into buf. Only the
 * first two tokens of each block are written: every other position of buf is 0 from its
 * zeroed allocation and is never written, so no clearing is needed between prompts. */
static void synth_tokens(const uint64_t *ids, size_t n_ids, uint32_t n_prompt, uint32_t bs,
                         uint32_t *buf)
{
    /* A partial last block without an id of its own starts with zeros. */
    for (size_t i = 0, at = 0; at < n_prompt; i++, at += bs) {
        uint64_t id = i < n_ids ? ids[i] : 0;
        buf[at] = (uint32_t)id;
        if (bs >= 2 && at + 1 < n_prompt)
            buf[at + 1] = (uint32_t)(id >> 32);
    }
}

const uint32_t *fl_log_tokens(const fl_log *log, const fl_req *q, uint32_t *buf)
{
    if (log->format != LOG_MOONCAKE)
        return log->tokens + q->data;
    synth_tokens(log->ids + q->data, q->n_ids, q->n_prompt, log->block_size, buf);
    return buf;
}

bool fl_log_check(const fl_log *log)
{
    size_t keys = 0, data = 0;
    for (size_t i = 0; i < log->n_reqs; i++) {
        const fl_req *q = &log->reqs[i];
        bool mooncake = log->format == LOG_MOONCAKE;
        size_t n_data = mooncake ? q->n_ids : q->n_prompt,
               have = mooncake ? log->n_ids : log->n_tokens;
        if (q->n_prompt == 0 || q->n_prompt > FL_MAX_TOKENS || q->n_output > FL_MAX_TOKENS ||
            q->n_keys != q->n_prompt / log->block_size || q->key + q->n_keys > log->n_keys ||
            q->data + n_data > have || q->ns >= log->n_ns || q->n_prompt > log->max_prompt ||
            (i > 0 && q->arrival < log->reqs[i - 1].arrival) || q->arrival > FL_TIME_MAX)
            return false;
        keys += q->n_keys;
        data += n_data;
    }
    /* Every stored key and token or id belongs to exactly one request. */
    return keys == log->n_keys &&
           data == (log->format == LOG_MOONCAKE ? log->n_ids : log->n_tokens);
}

void fl_log_free(fl_log *log)
{
    if (!log)
        return;
    free(log->reqs);
    free(log->tokens);
    free(log->ids);
    free(log->keys);
    free(log->ns);
    free(log->strs);
    free(log->synth);
    kvp_cache_free(log->keyer);
    free(log);
}

/* ---- reading ------------------------------------------------------------------------------ */

/* Add the record's namespace, or reuse the previous request's when it is the same. Returns
 * its index in *out, or FL_ENOMEM. */
static int add_ns(reading *rd, const log_record *rec, uint32_t *out)
{
    fl_log *log = rd->log;
    const char *s[4] = {rec->model, rec->adapter, rec->tenant, rec->cache_salt};
    size_t l[4] = {rec->model_len, rec->adapter_len, rec->tenant_len, rec->cache_salt_len};
    bool any = false;
    for (int i = 0; i < 4; i++)
        any |= s[i] != NULL;
    if (!any) {
        *out = 0;
        return FL_OK;
    }
    const fl_ns *prev = &log->ns[log->n_ns - 1];
    bool same = log->n_ns > 1;
    for (int i = 0; i < 4 && same; i++)
        same =
            prev->present[i] == (s[i] != NULL) &&
            (!s[i] || (prev->len[i] == l[i] && memcmp(log->strs + prev->off[i], s[i], l[i]) == 0));
    if (same) {
        *out = (uint32_t)(log->n_ns - 1);
        return FL_OK;
    }
    if (log->n_ns >= UINT32_MAX ||
        !cli_grow((void **)&log->ns, &log->ns_cap, log->n_ns + 1, sizeof *log->ns))
        return oom(rd);
    fl_ns n;
    memset(&n, 0, sizeof n);
    for (int i = 0; i < 4; i++) {
        if (!s[i])
            continue;
        if (!cli_grow((void **)&log->strs, &log->strs_cap, log->n_strs + l[i] + 1, 1))
            return oom(rd);
        memcpy(log->strs + log->n_strs, s[i], l[i]);
        log->strs[log->n_strs + l[i]] = '\0';
        n.off[i] = log->n_strs;
        n.len[i] = l[i];
        n.present[i] = true;
        log->n_strs += l[i] + 1;
    }
    log->ns[log->n_ns] = n;
    *out = (uint32_t)log->n_ns++;
    return FL_OK;
}

/* The arrival of a record: its timestamp (ms) or the previous arrival plus the gap. Returns
 * FL_OK or FL_EINPUT. */
static int arrival_of(reading *rd, const log_record *rec, fl_time *out)
{
    fl_time t;
    if (rec->has_timestamp) {
        double ns = rec->timestamp * 1e6;
        if (!(ns >= 0.0) || ns > (double)FL_TIME_MAX)
            return line_err(rd, rec->line_no,
                            "timestamp %.17g ms is outside 0 .. %.0f ms (the model's time range)",
                            rec->timestamp, (double)FL_TIME_MAX / 1e6);
        t = (fl_time)llround(ns);
    } else {
        rd->log->all_timestamps = false;
        t = rd->any ? rd->last + rd->cfg->interarrival : 0;
        if (t > FL_TIME_MAX)
            return line_err(rd, rec->line_no, "arrival passes the model's time range (%.0f ms)",
                            (double)FL_TIME_MAX / 1e6);
    }
    if (rd->any && t < rd->last && !rd->cfg->sort)
        return line_err(rd, rec->line_no,
                        "arrives at %.3f ms, before line %llu (%.3f ms): sort the log or pass "
                        "--sort",
                        (double)t / 1e6, (unsigned long long)rd->last_line, (double)rd->last / 1e6);
    *out = t;
    return FL_OK;
}

/* Fix the format and block size with the first record and create the keying cache.
 * Returns FL_OK, FL_EINPUT (a line of the other family), FL_ENOMEM. */
static int check_format(reading *rd, const log_record *rec)
{
    fl_log *log = rd->log;
    if (log->format == 0) {
        if (rec->format == LOG_MOONCAKE && rd->cfg->cache->vocab_size != 0)
            return line_err(rd, rec->line_no,
                            "--vocab-size checks token ids, and a Mooncake trace has none");
        log->format = rec->format;
        log->block_size = in_block_size(rd->cfg->in, rec->format);
        kvp_config kc = *rd->cfg->cache;
        kc.n_blocks = 1;
        kc.block_size = log->block_size;
        kc.single_threaded = true;
        int rc = kvp_cache_new(&kc, &log->keyer);
        if (rc != KVP_OK) {
            cli_errf(rd->err, rd->err_size, "cannot create the keying cache: %s",
                     cli_kvp_error(rc));
            return rc == KVP_ENOMEM ? FL_ENOMEM : FL_EINPUT;
        }
        return FL_OK;
    }
    char msg[160];
    if (in_format_clash(log->format, rec->format, msg, sizeof msg))
        return line_err(rd, rec->line_no, "%s", msg);
    return FL_OK;
}

/* The lengths of a record: n_prompt in 1 .. FL_MAX_TOKENS, n_output in 0 .. FL_MAX_TOKENS.
 * Returns FL_OK or FL_EINPUT. */
static int lengths_of(reading *rd, const log_record *rec, uint32_t *n_prompt, uint32_t *n_output)
{
    uint64_t in = rec->format == LOG_MOONCAKE ? rec->input_length : rec->n_tokens;
    uint64_t out = rec->output_length;
    if (rec->format != LOG_MOONCAKE && out == 0)
        out = rd->cfg->default_output;
    if (in == 0)
        return line_err(rd, rec->line_no, "empty prompt: nothing to route");
    if (in > FL_MAX_TOKENS || out > FL_MAX_TOKENS)
        return line_err(rd, rec->line_no, "%s of %llu tokens is above the limit (%llu)",
                        in > FL_MAX_TOKENS ? "a prompt" : "an output",
                        (unsigned long long)(in > FL_MAX_TOKENS ? in : out),
                        (unsigned long long)FL_MAX_TOKENS);
    *n_prompt = (uint32_t)in;
    *n_output = (uint32_t)out;
    return FL_OK;
}

/* Copy the record's prompt (tokens or ids) into the log; sets q->data and q->n_ids, and
 * *tokens to the prompt to key (the log's copy, or the synthesized one). */
static int store_prompt(reading *rd, const log_record *rec, fl_req *q, const uint32_t **tokens)
{
    fl_log *log = rd->log;
    if (rec->format == LOG_MOONCAKE) {
        if (!cli_grow((void **)&log->ids, &log->ids_cap, log->n_ids + rec->n_hash_ids, 8))
            return oom(rd);
        memcpy(log->ids + log->n_ids, rec->hash_ids, rec->n_hash_ids * 8);
        q->data = log->n_ids;
        q->n_ids = (uint32_t)rec->n_hash_ids;
        log->n_ids += rec->n_hash_ids;
        if (q->n_prompt > log->synth_cap) {
            /* Zeroed and only ever written at block heads (synth_tokens). */
            uint32_t *p = calloc(q->n_prompt, sizeof *p);
            if (!p)
                return oom(rd);
            if (log->synth)
                memcpy(p, log->synth, log->synth_cap * sizeof *p);
            free(log->synth);
            log->synth = p;
            log->synth_cap = q->n_prompt;
        }
        *tokens = fl_log_tokens(log, q, log->synth);
        return FL_OK;
    }
    uint32_t vocab = rd->cfg->cache->vocab_size;
    for (size_t i = 0; vocab && i < rec->n_tokens; i++)
        if (rec->tokens[i] >= vocab)
            return line_err(rd, rec->line_no, "token %zu is %u, at or above --vocab-size %u", i,
                            rec->tokens[i], vocab);
    if (!cli_grow((void **)&log->tokens, &log->tokens_cap, log->n_tokens + rec->n_tokens, 4))
        return oom(rd);
    memcpy(log->tokens + log->n_tokens, rec->tokens, rec->n_tokens * 4);
    q->data = log->n_tokens;
    log->n_tokens += rec->n_tokens;
    *tokens = log->tokens + q->data;
    return FL_OK;
}

/* Compute q's keys and affinity key from its prompt. Returns FL_OK, FL_EINPUT (the profile
 * refuses the namespace), FL_ENOMEM. */
static int key_prompt(reading *rd, fl_req *q, const uint32_t *tokens, uint64_t line_no)
{
    fl_log *log = rd->log;
    uint32_t n_full = q->n_prompt / log->block_size;
    /* One more than needed, so that keys is never NULL (a prompt without a full block). */
    if (!cli_grow((void **)&log->keys, &log->keys_cap, log->n_keys + n_full + 1, sizeof *log->keys))
        return oom(rd);
    kvp_namespace ns = fl_log_ns(log, q);
    size_t n = 0;
    int rc = kvp_cache_keys(log->keyer, &ns, tokens, q->n_prompt, &q->root, log->keys + log->n_keys,
                            n_full, &n);
    if (rc != KVP_OK || n != n_full) {
        char why[256];
        cli_hash_refusal(rc, rd->cfg->cache->hash_profile, rd->cfg->cache->vocab_size, &ns, tokens,
                         q->n_prompt, why, sizeof why);
        return line_err(rd, line_no, "%s", why);
    }
    q->key = log->n_keys;
    q->n_keys = n_full;
    log->n_keys += n_full;
    if (n_full == 0)
        q->affinity =
            XXH3_64bits_withSeed(tokens, (size_t)q->n_prompt * 4, q->root.lo ^ q->root.hi);
    return FL_OK;
}

/* Turn one record into a request. Returns FL_OK or an FL_E* code with the message set. */
static int add_record(reading *rd, const log_record *rec)
{
    fl_log *log = rd->log;
    int rc = check_format(rd, rec);
    fl_req q;
    memset(&q, 0, sizeof q);
    q.line_no = rec->line_no;
    if (rc == FL_OK)
        rc = lengths_of(rd, rec, &q.n_prompt, &q.n_output);
    if (rc == FL_OK)
        rc = arrival_of(rd, rec, &q.arrival);
    if (rc == FL_OK)
        rc = add_ns(rd, rec, &q.ns);
    const uint32_t *tokens = NULL;
    if (rc == FL_OK)
        rc = store_prompt(rd, rec, &q, &tokens);
    if (rc == FL_OK)
        rc = key_prompt(rd, &q, tokens, rec->line_no);
    if (rc != FL_OK)
        return rc;
    in_note(rd->cfg->in, rec->format, &log->count);
    if (!cli_grow((void **)&log->reqs, &log->reqs_cap, log->n_reqs + 1, sizeof *log->reqs))
        return oom(rd);
    log->reqs[log->n_reqs++] = q;
    log->prompt_tokens += q.n_prompt;
    if (q.n_prompt > log->max_prompt)
        log->max_prompt = q.n_prompt;
    rd->last = q.arrival;
    rd->last_line = q.line_no;
    rd->any = true;
    return FL_OK;
}

static int cmp_arrival(const void *a, const void *b)
{
    const fl_req *x = a, *y = b;
    if (x->arrival != y->arrival)
        return x->arrival < y->arrival ? -1 : 1;
    /* Line numbers are distinct and increasing in file order: the sort is stable. */
    return (x->line_no > y->line_no) - (x->line_no < y->line_no);
}

/* Read every record of the open reader. Returns FL_OK or an FL_E* code. */
static int read_all(reading *rd)
{
    log_record rec;
    int rc;
    while ((rc = log_next(rd->reader, &rec)) != LOG_END) {
        if (rc < 0) {
            cli_errf(rd->err, rd->err_size, "%s", log_error(rd->reader));
            return rc == LOG_ENOMEM ? FL_ENOMEM : FL_EINPUT;
        }
        if ((rc = add_record(rd, &rec)) != FL_OK)
            return rc;
    }
    return FL_OK;
}

int fl_log_read(const fl_log_config *cfg, fl_log **out, char *err, size_t err_size)
{
    fl_log *log = calloc(1, sizeof *log);
    if (!log || !cli_grow((void **)&log->ns, &log->ns_cap, 1, sizeof *log->ns)) {
        free(log);
        cli_errf(err, err_size, "out of memory");
        return FL_ENOMEM;
    }
    memset(&log->ns[0], 0, sizeof log->ns[0]);
    log->n_ns = 1;
    log->all_timestamps = true;
    reading rd = {cfg, log, NULL, cli_input_name(cfg->path), 0, 0, false, err, err_size};
    log_options lo;
    log_options_init(&lo);
    in_log_options(cfg->in, &lo);
    lo.no_segments = true; /* fleet reads no segments */
    int rc = log_open(cfg->path, &lo, &rd.reader, err, err_size);
    if (rc != 0) {
        fl_log_free(log);
        return rc == LOG_ENOMEM ? FL_ENOMEM : FL_EINPUT;
    }
    rc = read_all(&rd);
    log->n_lines = log_n_lines(rd.reader);
    log_close(rd.reader);
    if (rc == FL_OK && log->n_reqs == 0) {
        cli_errf(err, err_size, "%s: no requests", rd.name);
        rc = FL_EINPUT;
    }
    if (rc != FL_OK) {
        fl_log_free(log);
        return rc;
    }
    if (cfg->sort)
        qsort(log->reqs, log->n_reqs, sizeof *log->reqs, cmp_arrival);
    *out = log;
    return FL_OK;
}
