/*
 * logread.c - request-log reader: token-id JSON Lines, Mooncake hash-id traces and OpenAI
 * request bodies (see logread.h for the formats and the contract; openai.c renders OpenAI
 * requests to text and tokenize.c splits the text into tokens).
 *
 * Layout. Input goes through gzin.c, which gunzips gzip data and passes plain data through
 * unchanged (and, unlike zlib's gzread, reports data after the last gzip member), so one
 * code path serves plain and gzip files, and standard input. On the first read the
 * first four bytes it returns are kept aside in head[] and compared with the zstd magic:
 * when they match, everything it returns (head[] first) is fed to a ZSTD_DStream and
 * its output is the input; otherwise head[] is handed out first and the rest follows. This
 * needs no seeking, so pipes work too. Lines are cut from a single growable buffer:
 *
 *     buf: [ consumed | line being cut ... | read ahead ... ]       free space
 *          0          start                                  end     cap
 *
 * A line is found by scanning buf[start, end) for '\n'; when none is there the unread tail is
 * moved to the front and the buffer doubles (up to max_line_bytes + 1) before reading more.
 * Lines therefore have no length limit other than max_line_bytes, embedded NUL bytes are
 * seen (and named in a message) rather than silently truncating the line, and memory is
 * bounded by the longest line plus its ids (or, on the jansson path, its parsed tree).
 *
 * Parsing. A line goes first to the scanner (jsonl_scan.c), which validates it as jansson
 * would and reads token and hash ids straight into its record's arrays, which become the
 * log_record's; namespace strings are decoded in place in buf. parse_scanned then runs the
 * checks of the jansson path (parse_json_line and the read_* helpers) in the same order and
 * with the same words, on the scanner's kinds instead of json_t types. Lines holding an
 * OpenAI request ("messages", "prompt", "body"), lines of a log forced to OpenAI, and every
 * line under LOG_PARSER_JANSSON take the jansson path. Measured on a 2M-request token log
 * (bench/bench_replay.c --tokens): replay went from 39 to 259 MB/s of CPU time, parsing
 * falling from 87% of the run (jansson) to about 30% (docs/replay.md, "Performance");
 * tests/cli/test_logread.c reads every fixture, both fuzz corpora and generated lines with both
 * paths and compares every call.
 *
 * Invariants: start <= end <= cap; buf[start, end) is unread input; line_no counts the
 * lines handed out so far. The arrays of a record are reused across lines, grown to the
 * largest line's needs (each element takes at least two bytes of JSON text, so they never
 * exceed the line; OpenAI token arrays are sized by a counting pass of the tokenizer).
 * zin[zin_pos, zin_len) is compressed input not yet given to libzstd;
 * zret is the result of the last ZSTD_decompressStream call that consumed input or produced
 * output, 0 exactly at a frame boundary, so the end of the raw input with zret != 0 is a
 * truncated frame.
 */
#include "cli.h"
#include "escape.h"
#include "gzin.h"
#include "jsonl_scan.h"
#include "logread.h"
#include "openai.h"
#include "tokenize.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#define READ_CHUNK (1u << 20) /* bytes asked of the gzip layer at a time */

static const unsigned char zstd_magic[4] = {0x28, 0xB5, 0x2F, 0xFD};

struct log_reader {
    int fd;                /* input (a dup of stdin for "-"); -1 once closed */
    log_gzin gz;           /* plain or gzip layer over fd */
    char *name;            /* file name for messages ("<stdin>" for "-") */
    log_options opt;       /* options given to log_open */
    char *buf;             /* read buffer, see the picture above */
    size_t cap;            /* bytes allocated at buf */
    size_t start;          /* first unread byte */
    size_t end;            /* one past the last byte read */
    bool eof;              /* the (decompressed) input ended, or an error ended it */
    bool detected;         /* head[] has been read and the zstd magic checked */
    bool raw_eof;          /* the gzip layer reported the end of its output */
    unsigned char head[4]; /* the first bytes the gzip layer returned, handed out first */
    size_t n_head;         /* bytes held in head */
    size_t head_pos;       /* bytes of head already handed out */
    ZSTD_DStream *zs;      /* zstd decoder when the input is zstd data, else NULL */
    char *zin;             /* compressed input buffer (zstd only) */
    size_t zin_cap;        /* bytes allocated at zin */
    size_t zin_len;        /* bytes held in zin */
    size_t zin_pos;        /* bytes of zin already given to the decoder */
    size_t zret;           /* last ZSTD_decompressStream result (0: at a frame boundary) */
    bool failed;           /* a read, decompression or memory error ended the input */
    uint64_t line_no;      /* lines handed out so far */
    uint64_t n_records;    /* records returned so far */
    json_t *json;          /* current line parsed by jansson (OpenAI, or LOG_PARSER_JANSSON),
                              kept so namespace strings stay valid; NULL after the scanner */
    js_scanner scan;       /* the scanner's scratch state (key set, message) */
    js_record scanned;     /* what the scanner read from the current line; its arrays are the
                              token and Mooncake records' arrays */
    uint32_t *tokens;      /* token ids of the current line */
    size_t tokens_cap;     /* elements allocated at tokens */
    uint32_t *out_tokens;  /* output token ids of the current line */
    size_t out_tokens_cap; /* elements allocated at out_tokens */
    uint64_t *ids;         /* hash ids of the current line */
    size_t ids_cap;        /* elements allocated at ids */
    uint32_t *offsets;     /* OpenAI: byte offset of each token in the rendered text */
    size_t offsets_cap;    /* elements allocated at offsets */
    oai_prompt prompt;     /* OpenAI: the rendered prompt of the current line */
    char err[512];         /* last error message */
    log_range ranges[LOG_MAX_RANGES]; /* the current line's retention ranges */
};

void log_options_init(log_options *opt)
{
    if (opt == NULL)
        return;
    opt->max_line_bytes = LOG_DEFAULT_MAX_LINE;
    opt->hash_block_size = 512;
    opt->format = 0;
    opt->tokenizer = TOK_WORDS;
    opt->bpe = NULL;
    opt->tpl = 0;
    opt->jinja = NULL;
    opt->jinja_vars = NULL;
    opt->no_segments = false;
    const char *parser = getenv("KVPREFIX_LOG_PARSER");
    opt->parser =
        parser != NULL && strcmp(parser, "jansson") == 0 ? LOG_PARSER_JANSSON : LOG_PARSER_SCAN;
}

int log_open(const char *path, const log_options *opt, log_reader **out, char *err, size_t err_size)
{
    if (path == NULL || out == NULL) {
        cli_errf(err, err_size, "no input file given");
        return LOG_EIO;
    }
    bool is_stdin = strcmp(path, "-") == 0;
    const char *name = is_stdin ? "<stdin>" : path;
    log_reader *r = calloc(1, sizeof *r);
    if (r != NULL)
        r->fd = -1;
    if (r == NULL || (r->name = strdup(name)) == NULL) {
        free(r);
        cli_errf(err, err_size, "%s: out of memory", name);
        return LOG_ENOMEM;
    }
    if (opt != NULL)
        r->opt = *opt;
    else
        log_options_init(&r->opt);
    if (r->opt.max_line_bytes == 0)
        r->opt.max_line_bytes = 1;
    if (r->opt.tokenizer == 0)
        r->opt.tokenizer = TOK_WORDS;
    if (r->opt.format < 0 || r->opt.format > LOG_OPENAI ||
        (r->opt.tokenizer != TOK_WORDS && r->opt.tokenizer != TOK_BYTES) ||
        (r->opt.parser != LOG_PARSER_SCAN && r->opt.parser != LOG_PARSER_JANSSON)) {
        cli_errf(err, err_size, "%s: unknown log format %d, tokenizer %d or parser %d", name,
                 r->opt.format, r->opt.tokenizer, r->opt.parser);
        log_close(r);
        return LOG_EIO;
    }

    r->prompt.tpl = r->opt.tpl;
    r->prompt.jinja = r->opt.jinja;
    r->prompt.jinja_vars = r->opt.jinja_vars;
    r->prompt.no_segments = r->opt.no_segments;
    r->prompt.bos = r->opt.bpe != NULL ? bpe_bos(r->opt.bpe) : "";
    r->prompt.eos = r->opt.bpe != NULL ? bpe_eos(r->opt.bpe) : "";

    int fd = is_stdin ? dup(STDIN_FILENO) : open(path, O_RDONLY);
    if (fd < 0) {
        cli_errf(err, err_size, "%s: cannot open: %s", name, strerror(errno));
        log_close(r);
        return LOG_EIO;
    }
    r->fd = fd;
    if (log_gzin_init(&r->gz, fd) != 0) {
        cli_errf(err, err_size, "%s: cannot read (out of memory)", name);
        log_close(r);
        return LOG_ENOMEM;
    }
    *out = r;
    return 0;
}

void log_close(log_reader *r)
{
    if (r == NULL)
        return;
    log_gzin_free(&r->gz);
    if (r->fd >= 0)
        close(r->fd);
    ZSTD_freeDStream(r->zs);
    free(r->zin);
    free(r->offsets);
    oai_prompt_free(&r->prompt);
    json_decref(r->json);
    js_scanner_free(&r->scan);
    js_record_free(&r->scanned);
    free(r->buf);
    free(r->tokens);
    free(r->out_tokens);
    free(r->ids);
    free(r->name);
    free(r);
}

const char *log_error(const log_reader *r)
{
    return r == NULL ? "" : r->err;
}

uint64_t log_n_records(const log_reader *r)
{
    return r == NULL ? 0 : r->n_records;
}

uint64_t log_n_lines(const log_reader *r)
{
    return r == NULL ? 0 : r->line_no;
}

uint64_t log_bytes_in(const log_reader *r)
{
    return r == NULL ? 0 : log_gzin_offset(&r->gz);
}

/* Read up to want (> 0, <= READ_CHUNK) bytes of the gzip layer's output, head[] first, into dst.
 * Returns the number of bytes read, 0 at the end (raw_eof set), or LOG_EIO (message
 * set). */
static long raw_read(log_reader *r, void *dst, size_t want)
{
    if (r->head_pos < r->n_head) {
        size_t n = r->n_head - r->head_pos;
        if (n > want)
            n = want;
        memcpy(dst, r->head + r->head_pos, n);
        r->head_pos += n;
        return (long)n;
    }
    if (r->raw_eof)
        return 0;
    char msg[256];
    long n = log_gzin_read(&r->gz, dst, want, msg, sizeof msg);
    if (n < 0) {
        snprintf(r->err, sizeof r->err, "%s: %s", r->name, msg);
        r->raw_eof = true;
        return LOG_EIO;
    }
    if (n == 0)
        r->raw_eof = true;
    return n;
}

/* Read the first four bytes into head[] and, when they are the zstd magic, set up the
 * decoder. Returns 0, LOG_EIO or LOG_ENOMEM (message set). */
static int detect(log_reader *r)
{
    r->detected = true;
    while (r->n_head < sizeof r->head) {
        long n = raw_read(r, r->head + r->n_head, sizeof r->head - r->n_head);
        if (n < 0)
            return (int)n;
        if (n == 0)
            break;
        r->n_head += (size_t)n;
        r->head_pos = r->n_head; /* raw_read serves head[] only after detect */
    }
    r->head_pos = 0;
    if (r->n_head < sizeof zstd_magic || memcmp(r->head, zstd_magic, sizeof zstd_magic) != 0)
        return 0;
    r->zin_cap = ZSTD_DStreamInSize();
    if (r->zin_cap > READ_CHUNK)
        r->zin_cap = READ_CHUNK;
    r->zin = malloc(r->zin_cap);
    r->zs = ZSTD_createDStream();
    if (r->zin == NULL || r->zs == NULL || ZSTD_isError(ZSTD_initDStream(r->zs))) {
        snprintf(r->err, sizeof r->err, "%s: out of memory starting zstd decompression", r->name);
        return LOG_ENOMEM;
    }
    r->zret = 1; /* inside the first frame */
    return 0;
}

/* Decompress up to want (> 0) bytes of zstd data into dst. Returns the number of bytes
 * written, 0 at the end of the input after a complete frame, or LOG_EIO for corrupt
 * or truncated data or a read error (message set). */
static long zstd_read(log_reader *r, void *dst, size_t want)
{
    ZSTD_outBuffer out = {dst, want, 0};
    while (out.pos == 0) {
        if (r->zin_pos == r->zin_len && !r->raw_eof) {
            long n = raw_read(r, r->zin, r->zin_cap);
            if (n < 0)
                return n;
            r->zin_len = (size_t)n;
            r->zin_pos = 0;
        }
        ZSTD_inBuffer in = {r->zin, r->zin_len, r->zin_pos};
        size_t ret = ZSTD_decompressStream(r->zs, &out, &in);
        bool progress = in.pos > r->zin_pos || out.pos > 0;
        r->zin_pos = in.pos;
        if (ZSTD_isError(ret)) {
            snprintf(r->err, sizeof r->err, "%s: %s (%s)", r->name,
                     r->zret == 0 ? "trailing data after the last zstd frame (not another frame)"
                                  : "corrupt zstd data",
                     ZSTD_getErrorName(ret));
            return LOG_EIO;
        }
        /* A call without input after a frame ends returns the next header's size, not 0:
         * only a call that did something says where in a frame the stream is. */
        if (progress)
            r->zret = ret;
        if (out.pos == 0 && r->raw_eof && r->zin_pos == r->zin_len) {
            if (r->zret != 0) {
                snprintf(r->err, sizeof r->err,
                         "%s: truncated zstd data (the input ends inside a frame)", r->name);
                return LOG_EIO;
            }
            return 0;
        }
    }
    return (long)out.pos;
}

/* Read more input into buf, growing it as needed. Returns 1 if bytes were added, 0 at the
 * end of the input, or a negative LOG_E* code (message set). */
static int fill(log_reader *r)
{
    if (r->eof)
        return 0;
    if (!r->detected) {
        int rc = detect(r);
        if (rc < 0) {
            r->eof = true;
            return rc;
        }
    }
    if (r->start > 0) {
        memmove(r->buf, r->buf + r->start, r->end - r->start);
        r->end -= r->start;
        r->start = 0;
    }
    if (r->end == r->cap) {
        size_t limit = r->opt.max_line_bytes + 1;
        if (r->cap >= limit) {
            snprintf(r->err, sizeof r->err,
                     "%s:%llu: line longer than %zu bytes (--max-line-bytes)", r->name,
                     (unsigned long long)r->line_no + 1, r->opt.max_line_bytes);
            return LOG_ENOMEM;
        }
        size_t ncap = r->cap == 0 ? 64 * 1024 : r->cap * 2;
        if (ncap > limit || ncap < r->cap)
            ncap = limit;
        char *nb = realloc(r->buf, ncap);
        if (nb == NULL) {
            snprintf(r->err, sizeof r->err, "%s:%llu: out of memory reading a %zu-byte line",
                     r->name, (unsigned long long)r->line_no + 1, r->cap);
            return LOG_ENOMEM;
        }
        r->buf = nb;
        r->cap = ncap;
    }
    size_t want = r->cap - r->end;
    if (want > READ_CHUNK)
        want = READ_CHUNK;
    long n =
        r->zs != NULL ? zstd_read(r, r->buf + r->end, want) : raw_read(r, r->buf + r->end, want);
    if (n < 0) {
        r->eof = true;
        return (int)n;
    }
    if (n == 0) {
        r->eof = true;
        return 0;
    }
    r->end += (size_t)n;
    return 1;
}

/* Cut the next line (without its '\n' or "\r\n"). Returns 1 with *line and *len set, 0 at
 * the end, or a negative LOG_E* code. */
static int next_line(log_reader *r, char **line, size_t *len)
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
            snprintf(r->err, sizeof r->err,
                     "%s:%llu: line longer than %zu bytes (--max-line-bytes)", r->name,
                     (unsigned long long)r->line_no + 1, r->opt.max_line_bytes);
            r->failed = true;
            return LOG_ENOMEM;
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
    /* A UTF-8 byte order mark some editors write at the start of a file is not JSON. */
    if (r->line_no == 0 && *len >= 3 && memcmp(*line, "\xEF\xBB\xBF", 3) == 0) {
        *line += 3;
        *len -= 3;
    }
    r->line_no++;
    return 1;
}

static int line_err(log_reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Set "FILE:LINE: message" and return LOG_EINPUT. */
static int line_err(log_reader *r, const char *fmt, ...)
{
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char line[sizeof r->err];
    snprintf(line, sizeof line, "%s:%llu: %s", r->name, (unsigned long long)r->line_no, msg);
    cli_escape_str(r->err, sizeof r->err, line); /* jansson quotes bytes of the line */
    return LOG_EINPUT;
}

/* Make *arr hold at least n elements of size elem (cli_grow). Returns 0 or LOG_ENOMEM. */
static int reserve(void **arr, size_t *cap, size_t n, size_t elem)
{
    return cli_grow(arr, cap, n, elem) ? 0 : LOG_ENOMEM;
}

/* Read a token-id array field into *dst. Returns 0, LOG_EINPUT or LOG_ENOMEM. */
static int read_tokens(log_reader *r, const json_t *arr, const char *key, uint32_t **dst,
                       size_t *cap, size_t *n_out)
{
    if (!json_is_array(arr))
        return line_err(r, "%s must be an array of token ids, not %s", key,
                        cli_json_type_name(arr));
    size_t n = json_array_size(arr);
    if (reserve((void **)dst, cap, n == 0 ? 1 : n, sizeof **dst) != 0)
        return line_err(r, "out of memory for %zu %s", n, key), LOG_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v))
            return line_err(r, "%s[%zu] must be an integer token id, not %s", key, i,
                            cli_json_type_name(v));
        json_int_t t = json_integer_value(v);
        if (t < 0 || t > (json_int_t)UINT32_MAX)
            return line_err(r, "%s[%zu] = %lld is outside the token id range 0..4294967295", key, i,
                            (long long)t);
        (*dst)[i] = (uint32_t)t;
    }
    *n_out = n;
    return 0;
}

/* Read an optional namespace string. Returns 0 or LOG_EINPUT. */
static int read_ns(log_reader *r, const json_t *obj, const char *key, const char **s, size_t *len)
{
    const json_t *v = json_object_get(obj, key);
    *s = NULL;
    *len = 0;
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return line_err(r, "%s must be a string or null, not %s", key, cli_json_type_name(v));
    *s = json_string_value(v);
    *len = json_string_length(v);
    return 0;
}

/* Read a required Mooncake length field (0 .. LOG_MAX_LEN). Returns 0 or
 * LOG_EINPUT. */
static int read_len(log_reader *r, const json_t *obj, const char *key, uint64_t *out)
{
    const json_t *v = json_object_get(obj, key);
    if (v == NULL)
        return line_err(r,
                        "%s is missing (Mooncake lines need input_length, output_length "
                        "and hash_ids)",
                        key);
    if (!json_is_integer(v))
        return line_err(r, "%s must be an integer, not %s", key, cli_json_type_name(v));
    json_int_t i = json_integer_value(v);
    if (i < 0 || (uint64_t)i > LOG_MAX_LEN)
        return line_err(r, "%s = %lld is outside 0..%llu", key, (long long)i,
                        (unsigned long long)LOG_MAX_LEN);
    *out = (uint64_t)i;
    return 0;
}

/* Read an optional non-negative "timestamp" of o into x. Returns 0 or LOG_EINPUT. */
static int read_timestamp(log_reader *r, const json_t *o, log_record *x)
{
    const json_t *ts = json_object_get(o, "timestamp");
    if (ts == NULL || json_is_null(ts))
        return 0;
    if (!json_is_number(ts))
        return line_err(r, "timestamp must be a number, not %s", cli_json_type_name(ts));
    x->timestamp = json_number_value(ts);
    if (!(x->timestamp >= 0.0))
        return line_err(r, "timestamp must not be negative");
    x->has_timestamp = true;
    return 0;
}

static const char *format_desc(int format)
{
    switch (format) {
    case LOG_TOKENS:
        return "a token log line (with \"tokens\")";
    case LOG_MOONCAKE:
        return "a Mooncake trace line (with \"hash_ids\")";
    default:
        return "an OpenAI request (with \"messages\" or \"prompt\", or a Batch API \"body\" "
               "holding one)";
    }
}

/* Decide the format of a line from which of "tokens", "hash_ids" and an OpenAI request it
 * holds (and check it against a forced format). Returns 0 with *format set, or LOG_EINPUT. */
static int pick_format(log_reader *r, bool tokens, bool ids, bool oai, int *format)
{
    if (tokens + ids + oai > 1)
        return line_err(r,
                        "a line has only one of \"tokens\" (token log), \"hash_ids\" (Mooncake "
                        "trace), \"messages\" or \"prompt\" (OpenAI request); this one has%s%s%s",
                        tokens ? " tokens" : "", ids ? " hash_ids" : "",
                        oai ? " messages/prompt" : "");
    int f = tokens ? LOG_TOKENS : ids ? LOG_MOONCAKE : oai ? LOG_OPENAI : 0;
    int want = r->opt.format;
    if (want != 0 && f != want)
        return line_err(r, "expected %s, but this line is %s", format_desc(want),
                        f == 0 ? "none of the known formats" : format_desc(f));
    if (f == 0)
        return line_err(r, "neither \"tokens\" (token log), \"hash_ids\" (Mooncake trace), "
                           "nor \"messages\" or \"prompt\" (OpenAI request) is present");
    *format = f;
    return 0;
}

/* Decide the format of line object o (pick_format). Returns 0 or LOG_EINPUT. */
static int detect_format(log_reader *r, const json_t *o, int *format)
{
    return pick_format(r, json_object_get(o, "tokens") != NULL,
                       json_object_get(o, "hash_ids") != NULL, oai_is_request(o), format);
}

/* Tokenize the rendered prompt text[0, len) of p into r->tokens and r->offsets (x->n_tokens):
 * with the BPE tokenizer when the options give one, else with the approximate tokenizer and
 * the fixed layout's markers. Returns 0 or a negative code with the message set. */
static int tokenize_text(log_reader *r, const oai_prompt *p, const char *text, size_t len,
                         log_record *x)
{
    if (r->opt.bpe != NULL) {
        size_t cap = r->tokens_cap < r->offsets_cap ? r->tokens_cap : r->offsets_cap;
        bpe_out o = {r->tokens, r->offsets, 0, cap}; /* both arrays hold at least cap */
        char msg[256];
        int rc = bpe_encode(r->opt.bpe, text, len, true, 0, &o, msg, sizeof msg);
        r->tokens = o.ids;
        r->offsets = o.offsets;
        if (o.cap != cap)
            r->tokens_cap = r->offsets_cap = o.cap;
        if (rc != BPE_OK)
            return line_err(r, "tokenizing the prompt: %s", msg),
                   rc == BPE_ENOMEM ? LOG_ENOMEM : LOG_EINPUT;
        x->n_tokens = o.n;
        return 0;
    }
    const tok_mark *marks = p->templated ? NULL : p->marks;
    size_t n_marks = p->templated ? 0 : p->n_marks;
    size_t n = tok_split(r->opt.tokenizer, text, len, marks, n_marks, NULL, NULL);
    if (reserve((void **)&r->tokens, &r->tokens_cap, n == 0 ? 1 : n, sizeof *r->tokens) ||
        reserve((void **)&r->offsets, &r->offsets_cap, n == 0 ? 1 : n, sizeof *r->offsets))
        return line_err(r, "out of memory for the %zu tokens of a %zu-byte prompt", n, len),
               LOG_ENOMEM;
    x->n_tokens = tok_split(r->opt.tokenizer, text, len, marks, n_marks, r->tokens, r->offsets);
    return 0;
}

/* Parse an OpenAI request line o (len bytes of JSON) into *rec, starting from *x (line_no
 * and format set): render and tokenize the prompt, map the namespace (see openai.h).
 * Returns LOG_RECORD or a negative code. */
static int parse_openai(log_reader *r, const json_t *o, size_t len, log_record *rec, log_record *x)
{
    /* Step 1: render (or find the token-id prompt). */
    size_t limit = len > (UINT32_MAX - 4096) / 8 ? UINT32_MAX - 1 : 8 * len + 4096;
    char msg[384];
    oai_prompt *p = &r->prompt;
    int rc = oai_render(o, limit, p, msg, sizeof msg);
    if (rc != 0)
        return line_err(r, "%s", msg), rc;
    const json_t *body = p->body;

    /* Step 2: the namespace, output length and timestamp. */
    const char *user = NULL;
    size_t user_len = 0;
    if ((rc = read_ns(r, body, "model", &x->model, &x->model_len)) != 0 ||
        (rc = read_ns(r, body, "adapter", &x->adapter, &x->adapter_len)) != 0 ||
        (rc = read_ns(r, body, "cache_salt", &x->cache_salt, &x->cache_salt_len)) != 0 ||
        (rc = read_ns(r, body, "user", &user, &user_len)) != 0 ||
        (rc = read_ns(r, body, "tenant", &x->tenant, &x->tenant_len)) != 0)
        return rc;
    if (o != body) {
        const char *t;
        size_t t_len;
        if ((rc = read_ns(r, o, "tenant", &t, &t_len)) != 0)
            return rc;
        if (t != NULL) {
            x->tenant = t;
            x->tenant_len = t_len;
        }
    }
    if (x->tenant == NULL) {
        x->tenant = user;
        x->tenant_len = user_len;
    }
    const char *len_keys[] = {"max_completion_tokens", "max_tokens"};
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(body, len_keys[i]);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            continue;
        json_int_t n = json_integer_value(v);
        if ((uint64_t)n > LOG_MAX_LEN)
            return line_err(r, "%s = %lld is outside 0..%llu", len_keys[i], (long long)n,
                            (unsigned long long)LOG_MAX_LEN);
        x->output_length = (uint64_t)n;
        break;
    }
    if (o != body && json_object_get(o, "timestamp") != NULL)
        rc = read_timestamp(r, o, x);
    else
        rc = read_timestamp(r, body, x);
    if (rc != 0)
        return rc;

    /* Step 3: the tokens. */
    if (p->token_ids != NULL) {
        if ((rc = read_tokens(r, p->token_ids, p->token_key, &r->tokens, &r->tokens_cap,
                              &x->n_tokens)))
            return rc;
    } else {
        size_t len_text;
        const char *text = oai_text(p, &len_text);
        if ((rc = tokenize_text(r, p, text, len_text, x)) != 0)
            return rc;
        x->text = text;
        x->text_len = len_text;
        x->token_offsets = r->offsets;
        x->segs = p->templated ? p->tout.segs : NULL;
        x->n_segs = p->templated ? p->tout.n_segs : 0;
    }
    if (x->n_tokens == 0)
        return line_err(r, "prompt is empty: a request needs at least one prompt token");
    x->tokens = r->tokens;
    x->input_length = x->n_tokens;
    *rec = *x;
    r->n_records++;
    return LOG_RECORD;
}

/* A token log line's tokens and output_tokens into *x. Returns 0 or a negative code. */
static int parse_token_fields(log_reader *r, const json_t *o, const json_t *tokens, log_record *x)
{
    int rc;
    if ((rc = read_tokens(r, tokens, "tokens", &r->tokens, &r->tokens_cap, &x->n_tokens)))
        return rc;
    if (x->n_tokens == 0)
        return line_err(r, "tokens is empty: a request needs at least one prompt token");
    x->tokens = r->tokens;
    const json_t *out = json_object_get(o, "output_tokens");
    if (out != NULL && !json_is_null(out)) {
        if ((rc = read_tokens(r, out, "output_tokens", &r->out_tokens, &r->out_tokens_cap,
                              &x->n_output_tokens)))
            return rc;
        x->output_tokens = r->out_tokens;
    }
    x->input_length = x->n_tokens;
    x->output_length = x->n_output_tokens;
    return 0;
}

/* Check that n hash ids fit input_length tokens (ceil or floor of input_length /
 * hash_block_size; any number when that is 0). Returns 0 or LOG_EINPUT. */
static int check_n_ids(log_reader *r, uint64_t input_length, size_t n)
{
    uint32_t bs = r->opt.hash_block_size;
    if (bs == 0)
        return 0;
    uint64_t lo = input_length / bs, hi = lo + (input_length % bs != 0);
    if (n != lo && n != hi)
        return line_err(r,
                        "%zu hash_ids do not match input_length %llu with %u-token "
                        "blocks (expected %llu)",
                        n, (unsigned long long)input_length, bs, (unsigned long long)hi);
    return 0;
}

/* A Mooncake line's lengths and hash_ids into *x, checked against the block size. Returns 0
 * or a negative code. */
static int parse_trace_fields(log_reader *r, const json_t *o, const json_t *ids, log_record *x)
{
    int rc;
    if ((rc = read_len(r, o, "input_length", &x->input_length)) != 0 ||
        (rc = read_len(r, o, "output_length", &x->output_length)) != 0)
        return rc;
    if (x->input_length == 0)
        return line_err(r, "input_length must be at least 1");
    if (!json_is_array(ids))
        return line_err(r, "hash_ids must be an array of integers, not %s",
                        cli_json_type_name(ids));
    size_t n = json_array_size(ids);
    if (reserve((void **)&r->ids, &r->ids_cap, n == 0 ? 1 : n, sizeof *r->ids) != 0)
        return line_err(r, "out of memory for %zu hash ids", n), LOG_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v))
            return line_err(r, "hash_ids[%zu] must be an integer, not %s", i,
                            cli_json_type_name(v));
        json_int_t h = json_integer_value(v);
        if (h < 0)
            return line_err(r, "hash_ids[%zu] = %lld is negative", i, (long long)h);
        r->ids[i] = (uint64_t)h;
    }
    if ((rc = check_n_ids(r, x->input_length, n)) != 0)
        return rc;
    x->hash_ids = r->ids;
    x->n_hash_ids = n;
    return 0;
}

/* ---- the scanner's path: the checks above, in the same order and words, on js_record ---- */

/* What an id field that is present but empty points at (the scanner allocates nothing for
 * it, and a record's arrays are never NULL when the field is there). */
static const uint32_t no_tokens[1];
static const uint64_t no_ids[1];

/* An optional namespace string the scanner found: decoded in place in the line buffer
 * (never longer than its JSON form) and NUL-terminated there, valid until the next line.
 * Returns 0 or LOG_EINPUT. */
static int scan_ns(log_reader *r, const js_value *v, const char *key, const char **s, size_t *len)
{
    *s = NULL;
    *len = 0;
    if (v->kind == JS_ABSENT || v->kind == JS_NULL)
        return 0;
    if (v->kind != JS_STRING)
        return line_err(r, "%s must be a string or null, not %s", key, js_kind_name(v->kind));
    char *dst = r->buf + (v->str - r->buf); /* the line is r->buf's: writable */
    *len = js_string_decode(v, dst);
    *s = dst;
    return 0;
}

/* An optional non-negative timestamp (read_timestamp). Returns 0 or LOG_EINPUT. */
static int scan_timestamp(log_reader *r, const js_value *v, log_record *x)
{
    if (v->kind == JS_ABSENT || v->kind == JS_NULL)
        return 0;
    if (v->kind != JS_INT && v->kind != JS_REAL)
        return line_err(r, "timestamp must be a number, not %s", js_kind_name(v->kind));
    x->timestamp = v->d;
    if (!(x->timestamp >= 0.0))
        return line_err(r, "timestamp must not be negative");
    x->has_timestamp = true;
    return 0;
}

/* A token-id array field (read_tokens): *dst points at the scanner's ids v. Returns 0 or
 * LOG_EINPUT. */
static int scan_tokens(log_reader *r, const js_array *a, const uint32_t *v, const char *key,
                       const uint32_t **dst, size_t *n_out)
{
    if (a->kind != JS_ARRAY)
        return line_err(r, "%s must be an array of token ids, not %s", key, js_kind_name(a->kind));
    if (a->bad_index != JS_NO_INDEX && a->bad_kind == JS_INT)
        return line_err(r, "%s[%zu] = %lld is outside the token id range 0..4294967295", key,
                        a->bad_index, (long long)a->bad_int);
    if (a->bad_index != JS_NO_INDEX)
        return line_err(r, "%s[%zu] must be an integer token id, not %s", key, a->bad_index,
                        js_kind_name(a->bad_kind));
    *dst = a->n > 0 ? v : no_tokens;
    *n_out = a->n;
    return 0;
}

/* A required Mooncake length (read_len). Returns 0 or LOG_EINPUT. */
static int scan_len(log_reader *r, const js_value *v, const char *key, uint64_t *out)
{
    if (v->kind == JS_ABSENT)
        return line_err(r,
                        "%s is missing (Mooncake lines need input_length, output_length "
                        "and hash_ids)",
                        key);
    if (v->kind != JS_INT)
        return line_err(r, "%s must be an integer, not %s", key, js_kind_name(v->kind));
    if (v->i < 0 || (uint64_t)v->i > LOG_MAX_LEN)
        return line_err(r, "%s = %lld is outside 0..%llu", key, (long long)v->i,
                        (unsigned long long)LOG_MAX_LEN);
    *out = (uint64_t)v->i;
    return 0;
}

/* A token log line's arrays (parse_token_fields). Returns 0 or LOG_EINPUT. */
static int scan_token_fields(log_reader *r, const js_record *j, log_record *x)
{
    int rc;
    if ((rc = scan_tokens(r, &j->tokens, j->tokens_v, "tokens", &x->tokens, &x->n_tokens)))
        return rc;
    if (x->n_tokens == 0)
        return line_err(r, "tokens is empty: a request needs at least one prompt token");
    const js_array *out = &j->output_tokens;
    if (out->kind != JS_ABSENT && out->kind != JS_NULL &&
        (rc = scan_tokens(r, out, j->output_tokens_v, "output_tokens", &x->output_tokens,
                          &x->n_output_tokens)))
        return rc;
    x->input_length = x->n_tokens;
    x->output_length = x->n_output_tokens;
    return 0;
}

/* A Mooncake line's lengths and ids (parse_trace_fields). Returns 0 or LOG_EINPUT. */
static int scan_trace_fields(log_reader *r, const js_record *j, log_record *x)
{
    int rc;
    if ((rc = scan_len(r, &j->input_length, "input_length", &x->input_length)) != 0 ||
        (rc = scan_len(r, &j->output_length, "output_length", &x->output_length)) != 0)
        return rc;
    if (x->input_length == 0)
        return line_err(r, "input_length must be at least 1");
    const js_array *a = &j->hash_ids;
    if (a->kind != JS_ARRAY)
        return line_err(r, "hash_ids must be an array of integers, not %s", js_kind_name(a->kind));
    if (a->bad_index != JS_NO_INDEX && a->bad_kind == JS_INT)
        return line_err(r, "hash_ids[%zu] = %lld is negative", a->bad_index, (long long)a->bad_int);
    if (a->bad_index != JS_NO_INDEX)
        return line_err(r, "hash_ids[%zu] must be an integer, not %s", a->bad_index,
                        js_kind_name(a->bad_kind));
    if ((rc = check_n_ids(r, x->input_length, a->n)) != 0)
        return rc;
    x->hash_ids = a->n > 0 ? j->hash_ids_v : no_ids;
    x->n_hash_ids = a->n;
    return 0;
}

/* Finish a line js_scan returned rc for (anything but JS_FALLBACK): its error in the
 * reader's words, or the record with the checks of the jansson path in the same order
 * (format, namespace strings, timestamp, arrays or lengths). Returns LOG_RECORD or a
 * negative code. */
static int parse_scanned(log_reader *r, int rc, const char *line, size_t len, log_record *rec)
{
    const js_record *j = &r->scanned;
    if (rc == JS_ENOMEM) {
        r->failed = true;
        line_err(r,
                 "out of memory parsing a %zu-byte line (lower --max-line-bytes to refuse "
                 "such lines sooner)",
                 len);
        return LOG_ENOMEM;
    }
    if (rc == JS_EJSON && memchr(line, '\r', len) != NULL)
        return line_err(r,
                        "%s; the line holds a carriage return (CR-only line endings are not "
                        "supported: use \\n or \\r\\n)",
                        r->scan.err);
    if (rc != JS_OK)
        return line_err(r, "%s", r->scan.err);
    log_record x;
    memset(&x, 0, sizeof x);
    x.line_no = r->line_no;
    if ((rc = pick_format(r, j->fields & JS_F_TOKENS, j->fields & JS_F_HASH_IDS, false,
                          &x.format)) != 0 ||
        (rc = scan_ns(r, &j->model, "model", &x.model, &x.model_len)) != 0 ||
        (rc = scan_ns(r, &j->adapter, "adapter", &x.adapter, &x.adapter_len)) != 0 ||
        (rc = scan_ns(r, &j->tenant, "tenant", &x.tenant, &x.tenant_len)) != 0 ||
        (rc = scan_ns(r, &j->cache_salt, "cache_salt", &x.cache_salt, &x.cache_salt_len)) != 0 ||
        (rc = scan_timestamp(r, &j->timestamp, &x)) != 0)
        return rc;
    rc = x.format == LOG_TOKENS ? scan_token_fields(r, j, &x) : scan_trace_fields(r, j, &x);
    if (rc != 0)
        return rc;
    *rec = x;
    r->n_records++;
    return LOG_RECORD;
}

/* ---- one line ---------------------------------------------------------------------------- */

/* An integer field of the retention object in 0 .. max into *out, or a line error naming
 * what (a "retention.x" path). */
static int retention_int(log_reader *r, const json_t *v, uint64_t max, const char *what,
                         uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > max)
        return line_err(r, "%s must be an integer from 0 to %llu", what, (unsigned long long)max);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* The line's "retention" field into x (see the top of logread.h), or a line error. */
static int read_retention(log_reader *r, const json_t *o, log_record *x)
{
    const json_t *ret = json_object_get(o, "retention");
    if (ret == NULL || json_is_null(ret))
        return 0;
    if (!json_is_object(ret))
        return line_err(r, "retention must be an object, not %s", cli_json_type_name(ret));
    const char *key;
    const json_t *v;
    uint64_t u;
    int rc;
    x->has_retention = true;
    x->retention_priority = 35;
    json_object_foreach((json_t *)ret, key, v)
    {
        if (strcmp(key, "priority") == 0) {
            if ((rc = retention_int(r, v, 100, "retention.priority", &u)) != 0)
                return rc;
            x->retention_priority = (uint32_t)u;
        } else if (strcmp(key, "duration") == 0) {
            if ((rc = retention_int(r, v, INT64_MAX, "retention.duration", &u)) != 0)
                return rc;
            x->retention_duration = u;
        } else if (strcmp(key, "ranges") == 0) {
            if (!json_is_array(v))
                return line_err(r, "retention.ranges must be an array, not %s",
                                cli_json_type_name(v));
            size_t n = json_array_size(v);
            if (n > LOG_MAX_RANGES)
                return line_err(r, "retention.ranges has %zu ranges, more than %d", n,
                                LOG_MAX_RANGES);
            for (size_t i = 0; i < n; i++) {
                const json_t *g = json_array_get(v, i);
                size_t k = json_is_array(g) ? json_array_size(g) : 0;
                if (k != 3 && k != 4)
                    return line_err(r,
                                    "retention.ranges[%zu] must be [start, end, priority] or "
                                    "[start, end, priority, duration]",
                                    i);
                uint64_t f[4] = {0, 0, 0, 0};
                const uint64_t max[4] = {INT64_MAX, INT64_MAX, 100, INT64_MAX};
                static const char *const what[4] = {"start", "end", "priority", "duration"};
                for (size_t j = 0; j < k; j++) {
                    char path[64];
                    snprintf(path, sizeof path, "retention.ranges[%zu] %s", i, what[j]);
                    if ((rc = retention_int(r, json_array_get(g, j), max[j], path, &f[j])) != 0)
                        return rc;
                }
                if (f[0] >= f[1])
                    return line_err(r, "retention.ranges[%zu] is [%llu, %llu): empty", i,
                                    (unsigned long long)f[0], (unsigned long long)f[1]);
                r->ranges[i] = (log_range){f[0], f[1], (uint32_t)f[2], f[3]};
            }
            x->retention_ranges = n ? r->ranges : NULL;
            x->n_retention_ranges = n;
        } else {
            return line_err(r, "retention: unknown field \"%s\" (priority, duration, ranges)", key);
        }
    }
    return 0;
}

/* Parse one non-blank line with jansson into *rec. Returns LOG_RECORD or a negative code. */
static int parse_json_line(log_reader *r, const char *line, size_t len, log_record *rec)
{
    json_error_t jerr;
    r->json = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (r->json == NULL) {
        /* jansson 2.14 leaves the error unset (no text, column -1) when an allocation
         * fails inside the parser; newer versions say json_error_out_of_memory. */
        if (json_error_code(&jerr) == json_error_out_of_memory ||
            (jerr.text[0] == '\0' && jerr.column == -1)) {
            r->failed = true;
            line_err(r,
                     "out of memory parsing a %zu-byte line (lower --max-line-bytes to refuse "
                     "such lines sooner)",
                     len);
            return LOG_ENOMEM;
        }
        if (memchr(line, '\r', len) != NULL)
            return line_err(r,
                            "invalid JSON at column %d: %s; the line holds a carriage return "
                            "(CR-only line endings are not supported: use \\n or \\r\\n)",
                            jerr.column, jerr.text);
        if (json_error_code(&jerr) == json_error_invalid_utf8)
            return line_err(r,
                            "invalid JSON at column %d: the line is not valid UTF-8 (%s); "
                            "JSON text must be UTF-8",
                            jerr.column, jerr.text);
        return line_err(r, "invalid JSON at column %d: %s", jerr.column, jerr.text);
    }
    const json_t *o = r->json;
    if (!json_is_object(o))
        return line_err(r, "each line must be a JSON object, not %s", cli_json_type_name(o));

    log_record x;
    memset(&x, 0, sizeof x);
    x.line_no = r->line_no;
    int rc = detect_format(r, o, &x.format);
    if (rc == 0)
        rc = read_retention(r, o, &x);
    if (rc != 0)
        return rc;
    if (x.format == LOG_OPENAI)
        return parse_openai(r, o, len, rec, &x);
    const json_t *tokens = json_object_get(o, "tokens");
    const json_t *ids = json_object_get(o, "hash_ids");
    if ((rc = read_ns(r, o, "model", &x.model, &x.model_len)) != 0 ||
        (rc = read_ns(r, o, "adapter", &x.adapter, &x.adapter_len)) != 0 ||
        (rc = read_ns(r, o, "tenant", &x.tenant, &x.tenant_len)) != 0 ||
        (rc = read_ns(r, o, "cache_salt", &x.cache_salt, &x.cache_salt_len)) != 0)
        return rc;

    if ((rc = read_timestamp(r, o, &x)) != 0)
        return rc;

    rc = tokens != NULL ? parse_token_fields(r, o, tokens, &x) : parse_trace_fields(r, o, ids, &x);
    if (rc != 0)
        return rc;
    *rec = x;
    r->n_records++;
    return LOG_RECORD;
}

/* Parse one non-blank line into *rec: through the scanner unless the line (or the options)
 * need jansson. Returns LOG_RECORD or a negative code. */
static int parse_line(log_reader *r, const char *line, size_t len, log_record *rec)
{
    json_decref(r->json);
    r->json = NULL;
    const char *nul = memchr(line, '\0', len);
    if (nul != NULL)
        return line_err(r,
                        "a raw NUL byte at column %zu (JSON text cannot hold one: a binary or "
                        "corrupt file?)",
                        (size_t)(nul - line) + 1);
    if (r->opt.parser == LOG_PARSER_SCAN && r->opt.format != LOG_OPENAI && len <= JS_MAX_LINE) {
        int rc = js_scan(&r->scan, line, len, &r->scanned);
        if (rc != JS_FALLBACK)
            return parse_scanned(r, rc, line, len, rec);
    }
    return parse_json_line(r, line, len, rec);
}

static bool is_blank(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

int log_next(log_reader *r, log_record *rec)
{
    if (r == NULL || rec == NULL)
        return LOG_EIO;
    r->err[0] = '\0';
    if (r->failed)
        return LOG_END;
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
