/*
 * logread.c - request-log reader: token-id JSON Lines and Mooncake hash-id traces
 * (see logread.h for the formats and the contract).
 *
 * Layout. Input goes through zlib's gzread, which passes plain data through unchanged, so
 * one code path serves plain and gzip files, and standard input. Lines are cut from a single
 * growable buffer:
 *
 *     buf: [ consumed | line being cut ... | read ahead ... ]       free space
 *          0          start                                  end     cap
 *
 * A line is found by scanning buf[start, end) for '\n'; when none is there the unread tail is
 * moved to the front and the buffer doubles (up to max_line_bytes + 1) before reading more.
 * Lines therefore have no length limit other than max_line_bytes, embedded NUL bytes are
 * seen (and rejected by the JSON parser) rather than silently truncating the line, and
 * memory is bounded by the longest line plus its parsed form.
 *
 * Invariants: start <= end <= cap; buf[start, end) is unread input; line_no counts the
 * lines handed out so far. The arrays of a record are reused across lines, grown to the
 * largest line's needs (each element takes at least two bytes of JSON text, so they never
 * exceed the line).
 */
#include "cli.h"
#include "logread.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define READ_CHUNK (1u << 20) /* bytes asked of gzread at a time */

struct kvp_log_reader {
    gzFile gz;             /* input; NULL once closed */
    char *name;            /* file name for messages ("<stdin>" for "-") */
    kvp_log_options opt;   /* options given to kvp_log_open */
    char *buf;             /* read buffer, see the picture above */
    size_t cap;            /* bytes allocated at buf */
    size_t start;          /* first unread byte */
    size_t end;            /* one past the last byte read */
    bool eof;              /* gzread reported the end (or an error: see failed) */
    bool failed;           /* a read, decompression or memory error ended the input */
    uint64_t line_no;      /* lines handed out so far */
    uint64_t n_records;    /* records returned so far */
    json_t *json;          /* parsed current line, kept so namespace strings stay valid */
    uint32_t *tokens;      /* token ids of the current line */
    size_t tokens_cap;     /* elements allocated at tokens */
    uint32_t *out_tokens;  /* output token ids of the current line */
    size_t out_tokens_cap; /* elements allocated at out_tokens */
    uint64_t *ids;         /* hash ids of the current line */
    size_t ids_cap;        /* elements allocated at ids */
    char err[512];         /* last error message */
};

void kvp_log_options_init(kvp_log_options *opt)
{
    if (opt == NULL)
        return;
    opt->max_line_bytes = (size_t)1 << 30;
    opt->hash_block_size = 512;
}

int kvp_log_open(const char *path, const kvp_log_options *opt, kvp_log_reader **out, char *err,
                 size_t err_size)
{
    if (path == NULL || out == NULL) {
        kvp_cli_errf(err, err_size, "no input file given");
        return KVP_LOG_EIO;
    }
    bool is_stdin = strcmp(path, "-") == 0;
    const char *name = is_stdin ? "<stdin>" : path;
    kvp_log_reader *r = calloc(1, sizeof *r);
    if (r == NULL || (r->name = strdup(name)) == NULL) {
        free(r);
        kvp_cli_errf(err, err_size, "%s: out of memory", name);
        return KVP_LOG_ENOMEM;
    }
    if (opt != NULL)
        r->opt = *opt;
    else
        kvp_log_options_init(&r->opt);
    if (r->opt.max_line_bytes == 0)
        r->opt.max_line_bytes = 1;

    int fd = is_stdin ? dup(STDIN_FILENO) : open(path, O_RDONLY);
    if (fd < 0) {
        kvp_cli_errf(err, err_size, "%s: cannot open: %s", name, strerror(errno));
        kvp_log_close(r);
        return KVP_LOG_EIO;
    }
    r->gz = gzdopen(fd, "rb");
    if (r->gz == NULL) {
        close(fd);
        kvp_cli_errf(err, err_size, "%s: cannot read (out of memory)", name);
        kvp_log_close(r);
        return KVP_LOG_ENOMEM;
    }
    *out = r;
    return 0;
}

void kvp_log_close(kvp_log_reader *r)
{
    if (r == NULL)
        return;
    if (r->gz != NULL)
        gzclose(r->gz);
    json_decref(r->json);
    free(r->buf);
    free(r->tokens);
    free(r->out_tokens);
    free(r->ids);
    free(r->name);
    free(r);
}

const char *kvp_log_error(const kvp_log_reader *r)
{
    return r == NULL ? "" : r->err;
}

uint64_t kvp_log_n_records(const kvp_log_reader *r)
{
    return r == NULL ? 0 : r->n_records;
}

uint64_t kvp_log_n_lines(const kvp_log_reader *r)
{
    return r == NULL ? 0 : r->line_no;
}

/* Read more input into buf, growing it as needed. Returns 1 if bytes were added, 0 at the
 * end of the input, or a negative KVP_LOG_E* code (message set). */
static int fill(kvp_log_reader *r)
{
    if (r->eof)
        return 0;
    if (r->start > 0) {
        memmove(r->buf, r->buf + r->start, r->end - r->start);
        r->end -= r->start;
        r->start = 0;
    }
    if (r->end == r->cap) {
        size_t limit = r->opt.max_line_bytes + 1;
        if (r->cap >= limit) {
            snprintf(r->err, sizeof r->err, "%s:%llu: line longer than %zu bytes", r->name,
                     (unsigned long long)r->line_no + 1, r->opt.max_line_bytes);
            return KVP_LOG_ENOMEM;
        }
        size_t ncap = r->cap == 0 ? 64 * 1024 : r->cap * 2;
        if (ncap > limit || ncap < r->cap)
            ncap = limit;
        char *nb = realloc(r->buf, ncap);
        if (nb == NULL) {
            snprintf(r->err, sizeof r->err, "%s:%llu: out of memory reading a %zu-byte line",
                     r->name, (unsigned long long)r->line_no + 1, r->cap);
            return KVP_LOG_ENOMEM;
        }
        r->buf = nb;
        r->cap = ncap;
    }
    size_t want = r->cap - r->end;
    if (want > READ_CHUNK)
        want = READ_CHUNK;
    int n = gzread(r->gz, r->buf + r->end, (unsigned)want);
    if (n < 0) {
        int zerr;
        const char *msg = gzerror(r->gz, &zerr);
        snprintf(r->err, sizeof r->err, "%s: read error: %s", r->name,
                 zerr == Z_ERRNO ? strerror(errno) : msg);
        r->eof = true;
        return KVP_LOG_EIO;
    }
    if (n == 0) {
        int zerr;
        const char *msg = gzerror(r->gz, &zerr);
        r->eof = true;
        if (zerr != Z_OK && zerr != Z_STREAM_END) {
            snprintf(r->err, sizeof r->err, "%s: corrupt or truncated gzip data (%s)", r->name,
                     msg);
            return KVP_LOG_EIO;
        }
        return 0;
    }
    r->end += (size_t)n;
    return 1;
}

/* Cut the next line (without its '\n' or "\r\n"). Returns 1 with *line and *len set, 0 at
 * the end, or a negative KVP_LOG_E* code. */
static int next_line(kvp_log_reader *r, char **line, size_t *len)
{
    size_t scanned = r->start;
    for (;;) {
        char *nl = r->end > scanned ? memchr(r->buf + scanned, '\n', r->end - scanned) : NULL;
        if (nl != NULL) {
            *line = r->buf + r->start;
            *len = (size_t)(nl - *line);
            r->start = (size_t)(nl - r->buf) + 1;
            break;
        }
        if (r->end - r->start > r->opt.max_line_bytes) {
            snprintf(r->err, sizeof r->err, "%s:%llu: line longer than %zu bytes", r->name,
                     (unsigned long long)r->line_no + 1, r->opt.max_line_bytes);
            r->failed = true;
            return KVP_LOG_ENOMEM;
        }
        size_t pending = r->end - r->start;
        int rc = fill(r);
        if (rc < 0) {
            r->failed = true;
            return rc;
        }
        if (rc == 0) {
            if (pending == 0)
                return 0;
            *line = r->buf + r->start; /* last line without a newline */
            *len = pending;
            r->start = r->end;
            break;
        }
        scanned = r->start + pending; /* fill moved the unread bytes to the front */
    }
    if (*len > 0 && (*line)[*len - 1] == '\r')
        (*len)--;
    r->line_no++;
    return 1;
}

static int line_err(kvp_log_reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Set "FILE:LINE: message" and return KVP_LOG_EINPUT. */
static int line_err(kvp_log_reader *r, const char *fmt, ...)
{
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(r->err, sizeof r->err, "%s:%llu: %s", r->name, (unsigned long long)r->line_no, msg);
    return KVP_LOG_EINPUT;
}

static const char *type_name(const json_t *v)
{
    if (v == NULL)
        return "missing";
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a non-integer number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "something else";
}

/* Make *arr hold at least n elements of size elem. Returns 0 or KVP_LOG_ENOMEM. */
static int reserve(void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n <= *cap)
        return 0;
    if (n > SIZE_MAX / elem)
        return KVP_LOG_ENOMEM;
    void *p = realloc(*arr, n * elem);
    if (p == NULL)
        return KVP_LOG_ENOMEM;
    *arr = p;
    *cap = n;
    return 0;
}

/* Read a token-id array field into *dst. Returns 0, KVP_LOG_EINPUT or KVP_LOG_ENOMEM. */
static int read_tokens(kvp_log_reader *r, const json_t *arr, const char *key, uint32_t **dst,
                       size_t *cap, size_t *n_out)
{
    if (!json_is_array(arr))
        return line_err(r, "%s must be an array of token ids, not %s", key, type_name(arr));
    size_t n = json_array_size(arr);
    if (reserve((void **)dst, cap, n == 0 ? 1 : n, sizeof **dst) != 0)
        return line_err(r, "out of memory for %zu %s", n, key), KVP_LOG_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v))
            return line_err(r, "%s[%zu] must be an integer token id, not %s", key, i, type_name(v));
        json_int_t t = json_integer_value(v);
        if (t < 0 || t > (json_int_t)UINT32_MAX)
            return line_err(r, "%s[%zu] = %lld is outside the token id range 0..4294967295", key, i,
                            (long long)t);
        (*dst)[i] = (uint32_t)t;
    }
    *n_out = n;
    return 0;
}

/* Read an optional namespace string. Returns 0 or KVP_LOG_EINPUT. */
static int read_ns(kvp_log_reader *r, const json_t *obj, const char *key, const char **s,
                   size_t *len)
{
    const json_t *v = json_object_get(obj, key);
    *s = NULL;
    *len = 0;
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return line_err(r, "%s must be a string or null, not %s", key, type_name(v));
    *s = json_string_value(v);
    *len = json_string_length(v);
    return 0;
}

/* Read a required Mooncake length field (0 .. KVP_LOG_MAX_LEN). Returns 0 or
 * KVP_LOG_EINPUT. */
static int read_len(kvp_log_reader *r, const json_t *obj, const char *key, uint64_t *out)
{
    const json_t *v = json_object_get(obj, key);
    if (v == NULL)
        return line_err(r,
                        "%s is missing (Mooncake lines need input_length, output_length "
                        "and hash_ids)",
                        key);
    if (!json_is_integer(v))
        return line_err(r, "%s must be an integer, not %s", key, type_name(v));
    json_int_t i = json_integer_value(v);
    if (i < 0 || (uint64_t)i > KVP_LOG_MAX_LEN)
        return line_err(r, "%s = %lld is outside 0..%llu", key, (long long)i,
                        (unsigned long long)KVP_LOG_MAX_LEN);
    *out = (uint64_t)i;
    return 0;
}

/* Parse one non-blank line into *rec. Returns KVP_LOG_RECORD or a negative code. */
static int parse_line(kvp_log_reader *r, const char *line, size_t len, kvp_log_record *rec)
{
    json_error_t jerr;
    json_decref(r->json);
    r->json = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (r->json == NULL)
        return line_err(r, "invalid JSON at column %d: %s", jerr.column, jerr.text);
    const json_t *o = r->json;
    if (!json_is_object(o))
        return line_err(r, "each line must be a JSON object, not %s", type_name(o));

    kvp_log_record x;
    memset(&x, 0, sizeof x);
    x.line_no = r->line_no;
    const json_t *tokens = json_object_get(o, "tokens");
    const json_t *ids = json_object_get(o, "hash_ids");
    if (tokens != NULL && ids != NULL)
        return line_err(r, "a line has either \"tokens\" (token log) or \"hash_ids\" "
                           "(Mooncake trace), not both");
    if (tokens == NULL && ids == NULL)
        return line_err(r, "neither \"tokens\" (token log) nor \"hash_ids\" (Mooncake trace) "
                           "is present");
    int rc;
    if ((rc = read_ns(r, o, "model", &x.model, &x.model_len)) != 0 ||
        (rc = read_ns(r, o, "adapter", &x.adapter, &x.adapter_len)) != 0 ||
        (rc = read_ns(r, o, "tenant", &x.tenant, &x.tenant_len)) != 0 ||
        (rc = read_ns(r, o, "cache_salt", &x.cache_salt, &x.cache_salt_len)) != 0)
        return rc;

    const json_t *ts = json_object_get(o, "timestamp");
    if (ts != NULL && !json_is_null(ts)) {
        if (!json_is_number(ts))
            return line_err(r, "timestamp must be a number, not %s", type_name(ts));
        x.timestamp = json_number_value(ts);
        if (!(x.timestamp >= 0.0))
            return line_err(r, "timestamp must not be negative");
        x.has_timestamp = true;
    }

    if (tokens != NULL) {
        x.format = KVP_LOG_TOKENS;
        if ((rc = read_tokens(r, tokens, "tokens", &r->tokens, &r->tokens_cap, &x.n_tokens)))
            return rc;
        if (x.n_tokens == 0)
            return line_err(r, "tokens is empty: a request needs at least one prompt token");
        x.tokens = r->tokens;
        const json_t *out = json_object_get(o, "output_tokens");
        if (out != NULL && !json_is_null(out)) {
            if ((rc = read_tokens(r, out, "output_tokens", &r->out_tokens, &r->out_tokens_cap,
                                  &x.n_output_tokens)))
                return rc;
            x.output_tokens = r->out_tokens;
        }
        x.input_length = x.n_tokens;
        x.output_length = x.n_output_tokens;
    } else {
        x.format = KVP_LOG_MOONCAKE;
        if ((rc = read_len(r, o, "input_length", &x.input_length)) != 0 ||
            (rc = read_len(r, o, "output_length", &x.output_length)) != 0)
            return rc;
        if (x.input_length == 0)
            return line_err(r, "input_length must be at least 1");
        if (!json_is_array(ids))
            return line_err(r, "hash_ids must be an array of integers, not %s", type_name(ids));
        size_t n = json_array_size(ids);
        if (reserve((void **)&r->ids, &r->ids_cap, n == 0 ? 1 : n, sizeof *r->ids) != 0)
            return line_err(r, "out of memory for %zu hash ids", n), KVP_LOG_ENOMEM;
        for (size_t i = 0; i < n; i++) {
            const json_t *v = json_array_get(ids, i);
            if (!json_is_integer(v))
                return line_err(r, "hash_ids[%zu] must be an integer, not %s", i, type_name(v));
            json_int_t h = json_integer_value(v);
            if (h < 0)
                return line_err(r, "hash_ids[%zu] = %lld is negative", i, (long long)h);
            r->ids[i] = (uint64_t)h;
        }
        uint32_t bs = r->opt.hash_block_size;
        if (bs > 0) {
            uint64_t lo = x.input_length / bs, hi = lo + (x.input_length % bs != 0);
            if (n != lo && n != hi)
                return line_err(r,
                                "%zu hash_ids do not match input_length %llu with %u-token "
                                "blocks (expected %llu)",
                                n, (unsigned long long)x.input_length, bs, (unsigned long long)hi);
        }
        x.hash_ids = r->ids;
        x.n_hash_ids = n;
    }
    *rec = x;
    r->n_records++;
    return KVP_LOG_RECORD;
}

static bool is_blank(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

int kvp_log_next(kvp_log_reader *r, kvp_log_record *rec)
{
    if (r == NULL || rec == NULL)
        return KVP_LOG_EIO;
    r->err[0] = '\0';
    if (r->failed)
        return KVP_LOG_END;
    for (;;) {
        char *line;
        size_t len;
        int rc = next_line(r, &line, &len);
        if (rc <= 0)
            return rc;
        if (is_blank(line, len))
            continue;
        return parse_line(r, line, len, rec);
    }
}
