/*
 * fuzz_replay_input.c - libFuzzer harness: the request-log reader (src/cli/logread.h).
 *
 * The input is a whole log file: JSON Lines in any of the reader's formats (token log,
 * Mooncake trace, OpenAI request bodies and Batch API lines), plain, gzip or zstd. It is
 * written to an anonymous memory file (memfd_create; a temporary file where that is
 * missing) and read through the path /proc/self/fd/N, exactly as the tool reads a log,
 * three times with different options:
 *   1. the defaults (format detection, words tokenizer, 512-token hash blocks), except
 *      max_line_bytes = 1 MiB so memory stays bounded;
 *   2. hash_block_size = 4 (Mooncake lines must then have ceil or floor of input_length/4
 *      hash ids) and the bytes tokenizer;
 *   3. max_line_bytes = 64 and one format forced (chosen by the input's length).
 * Each run reads until LOG_END, at most REPLAY_MAX_CALLS calls.
 *
 * Asserted for every call:
 *   - LOG_RECORD: log_error() is empty; line_no equals log_n_lines() and grows;
 *     log_n_records() counts the records; format is TOKENS, MOONCAKE or OPENAI (the
 *     forced one in run 3); namespace strings are NUL-terminated at their length (and have
 *     length 0 when absent); a timestamp is not negative; every array is readable over its
 *     whole length (ASan checks the bytes); and per format:
 *       TOKENS   tokens non-NULL, n_tokens >= 1, input_length == n_tokens,
 *                output_length == n_output_tokens, no hash ids, no text;
 *       MOONCAKE no tokens, 1 <= input_length <= LOG_MAX_LEN, output_length <= that,
 *                n_hash_ids is ceil or floor of input_length / hash_block_size (when set);
 *       OPENAI   tokens non-NULL, n_tokens >= 1, input_length == n_tokens, no output
 *                tokens, no hash ids; with text: text[text_len] == '\0', the offsets start
 *                at 0, ascend strictly and stay inside the text, and each token is what the
 *                tokenizer (tokenize.h) makes of its bytes: a marker where the text holds
 *                "<|im_start|>" / "<|im_end|>", else the byte itself (bytes tokenizer, one
 *                byte per token) or XXH32 of its bytes moved out of 0..1023 (words).
 *   - LOG_EINPUT: the message is "PATH:LINE: ..." with LINE == log_n_lines();
 *     reading goes on with the next line.
 *   - LOG_EIO / LOG_ENOMEM: the message is "PATH: ..." or "PATH:LINE: ..."; the
 *     next call returns LOG_END.
 *   - no crash, no sanitizer report, no leak (LeakSanitizer, per input under libFuzzer).
 *
 * The reader's sources come from the meson variables logread_sources and logread_deps
 * (src/cli/meson.build), so every format the reader learns is fuzzed here as well.
 */
#define _GNU_SOURCE /* memfd_create */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "fuzz_util.h"
#include "logread.h"

#define REPLAY_MAX_CALLS 100000 /* log_next calls per run */

/* Write data to a fresh file; returns its descriptor (or -1) and its path in path. */
static int make_file(const uint8_t *data, size_t size, char *path, size_t path_size)
{
    int fd = -1;
#ifdef MFD_CLOEXEC
    fd = memfd_create("replay_input", MFD_CLOEXEC);
#endif
    if (fd < 0) {
        char tmpl[] = "/tmp/kvp-fuzz-XXXXXX";
        fd = mkstemp(tmpl);
        if (fd < 0)
            return -1;
        unlink(tmpl);
    }
    size_t off = 0;
    while (off < size) {
        ssize_t n = write(fd, data + off, size - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            close(fd);
            return -1;
        }
        off += (size_t)n;
    }
    snprintf(path, path_size, "/proc/self/fd/%d", fd);
    return fd;
}

/* Read every byte of [p, p + n) (so ASan checks the range); returns a checksum. */
static unsigned touch(const void *p, size_t n)
{
    const unsigned char *b = p;
    unsigned sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += b[i];
    return sum;
}

static void check_string(const char *what, const char *s, size_t len)
{
    if (s == NULL) {
        FZ_ASSERT(len == 0, "%s is absent with length %zu", what, len);
        return;
    }
    touch(s, len);
    FZ_ASSERT(s[len] == '\0', "%s is not NUL-terminated at its length %zu", what, len);
}

/* "PATH:LINE: " with LINE == line (line_required), or "PATH: " / "PATH:N: " otherwise. */
static void check_message(const char *msg, const char *path, uint64_t line, bool line_required)
{
    size_t plen = strlen(path);
    FZ_ASSERT(strncmp(msg, path, plen) == 0 && msg[plen] == ':',
              "error message \"%s\" does not start with \"%s:\"", msg, path);
    const char *p = msg + plen + 1;
    if (!line_required && *p == ' ') {
        FZ_ASSERT(p[1] != '\0', "error message \"%s\" says nothing", msg);
        return;
    }
    char *end;
    errno = 0;
    unsigned long long n = strtoull(p, &end, 10);
    FZ_ASSERT(end != p && errno == 0 && end[0] == ':' && end[1] == ' ' && end[2] != '\0',
              "error message \"%s\" is not \"%s:LINE: ...\"", msg, path);
    FZ_ASSERT(!line_required || n == line, "error message \"%s\" names line %llu, reader at %llu",
              msg, n, (unsigned long long)line);
}

/* The token the tokenizer makes of text[off, end), which is not a marker. */
static uint32_t text_token(int tokenizer, const char *text, size_t off, size_t end)
{
    if (tokenizer == TOK_BYTES) {
        FZ_ASSERT(end == off + 1, "bytes tokenizer: token of %zu bytes", end - off);
        return (unsigned char)text[off];
    }
    uint32_t h = XXH32(text + off, end - off, 0);
    return h < TOK_N_RESERVED ? h + TOK_N_RESERVED : h;
}

static void check_openai_text(const log_record *rec, int tokenizer)
{
    check_string("text", rec->text, rec->text_len);
    FZ_ASSERT(rec->token_offsets != NULL, "line %llu: OpenAI text without token offsets",
              (unsigned long long)rec->line_no);
    for (size_t i = 0; i < rec->n_tokens; i++) {
        size_t off = rec->token_offsets[i];
        size_t end = i + 1 < rec->n_tokens ? rec->token_offsets[i + 1] : rec->text_len;
        FZ_ASSERT(i > 0 || off == 0, "line %llu: first token at offset %zu",
                  (unsigned long long)rec->line_no, off);
        FZ_ASSERT(off < end && end <= rec->text_len,
                  "line %llu: token %zu spans [%zu, %zu) of %zu bytes",
                  (unsigned long long)rec->line_no, i, off, end, rec->text_len);
        uint32_t id = rec->tokens[i];
        if (id == TOK_IM_START || id == TOK_IM_END) {
            const char *mark = id == TOK_IM_START ? "<|im_start|>" : "<|im_end|>";
            FZ_ASSERT(end - off == strlen(mark) && memcmp(rec->text + off, mark, end - off) == 0,
                      "line %llu: marker token %zu over other text",
                      (unsigned long long)rec->line_no, i);
            continue;
        }
        uint32_t want = text_token(tokenizer, rec->text, off, end);
        FZ_ASSERT(id == want, "line %llu: token %zu is %u, its text gives %u",
                  (unsigned long long)rec->line_no, i, id, want);
    }
}

static void check_record(const log_record *rec, const log_options *opt)
{
    unsigned long long ln = (unsigned long long)rec->line_no;
    check_string("model", rec->model, rec->model_len);
    check_string("adapter", rec->adapter, rec->adapter_len);
    check_string("tenant", rec->tenant, rec->tenant_len);
    check_string("cache_salt", rec->cache_salt, rec->cache_salt_len);
    FZ_ASSERT(!rec->has_timestamp || rec->timestamp >= 0.0, "line %llu: timestamp %g", ln,
              rec->timestamp);
    FZ_ASSERT(opt->format == 0 || rec->format == opt->format,
              "line %llu: format %d, but %d was forced", ln, rec->format, opt->format);
    if (rec->tokens)
        touch(rec->tokens, rec->n_tokens * sizeof *rec->tokens);
    if (rec->output_tokens)
        touch(rec->output_tokens, rec->n_output_tokens * sizeof *rec->output_tokens);
    if (rec->hash_ids)
        touch(rec->hash_ids, rec->n_hash_ids * sizeof *rec->hash_ids);
    switch (rec->format) {
    case LOG_TOKENS:
        FZ_ASSERT(rec->tokens && rec->n_tokens >= 1 && rec->input_length == rec->n_tokens,
                  "line %llu: token record with %zu tokens, input_length %llu", ln, rec->n_tokens,
                  (unsigned long long)rec->input_length);
        FZ_ASSERT(rec->output_length == rec->n_output_tokens &&
                      (rec->n_output_tokens == 0 || rec->output_tokens),
                  "line %llu: token record output_length %llu, %zu output tokens", ln,
                  (unsigned long long)rec->output_length, rec->n_output_tokens);
        FZ_ASSERT(!rec->hash_ids && rec->n_hash_ids == 0 && !rec->text && !rec->token_offsets,
                  "line %llu: token record with hash ids or text", ln);
        break;
    case LOG_MOONCAKE: {
        FZ_ASSERT(!rec->tokens && rec->n_tokens == 0 && !rec->output_tokens && !rec->text,
                  "line %llu: Mooncake record with tokens or text", ln);
        FZ_ASSERT(rec->input_length >= 1 && rec->input_length <= LOG_MAX_LEN &&
                      rec->output_length <= LOG_MAX_LEN,
                  "line %llu: Mooncake lengths %llu, %llu", ln,
                  (unsigned long long)rec->input_length, (unsigned long long)rec->output_length);
        FZ_ASSERT(rec->hash_ids || rec->n_hash_ids == 0, "line %llu: hash ids NULL", ln);
        uint32_t bs = opt->hash_block_size;
        if (bs > 0) {
            uint64_t lo = rec->input_length / bs, hi = lo + (rec->input_length % bs != 0);
            FZ_ASSERT(rec->n_hash_ids == lo || rec->n_hash_ids == hi,
                      "line %llu: %zu hash ids for input_length %llu in %u-token blocks", ln,
                      rec->n_hash_ids, (unsigned long long)rec->input_length, bs);
        }
        break;
    }
    case LOG_OPENAI:
        FZ_ASSERT(rec->tokens && rec->n_tokens >= 1 && rec->input_length == rec->n_tokens,
                  "line %llu: OpenAI record with %zu tokens, input_length %llu", ln, rec->n_tokens,
                  (unsigned long long)rec->input_length);
        FZ_ASSERT(!rec->output_tokens && rec->n_output_tokens == 0 && !rec->hash_ids &&
                      rec->n_hash_ids == 0,
                  "line %llu: OpenAI record with output tokens or hash ids", ln);
        if (rec->text)
            check_openai_text(rec, opt->tokenizer);
        else
            FZ_ASSERT(!rec->token_offsets && rec->text_len == 0,
                      "line %llu: token offsets without text", ln);
        break;
    default:
        fz_fail("line %llu: unknown format %d", ln, rec->format);
    }
}

/* Read the whole file at path with opt, checking every call. */
static void read_all(const char *path, const log_options *opt)
{
    char err[256];
    log_reader *r = NULL;
    int rc = log_open(path, opt, &r, err, sizeof err);
    if (rc != 0) {
        check_message(err, path, 0, false);
        FZ_ASSERT(r == NULL, "log_open failed but set the reader");
        return;
    }
    uint64_t n_records = 0, last_line = 0;
    for (int calls = 0; calls < REPLAY_MAX_CALLS; calls++) {
        log_record rec;
        rc = log_next(r, &rec);
        uint64_t lines = log_n_lines(r);
        const char *msg = log_error(r);
        if (rc == LOG_END) {
            FZ_ASSERT(msg[0] == '\0', "LOG_END with message \"%s\"", msg);
            break;
        }
        if (rc == LOG_RECORD) {
            FZ_ASSERT(msg[0] == '\0', "a record with message \"%s\"", msg);
            FZ_ASSERT(rec.line_no == lines && rec.line_no > last_line,
                      "record of line %llu, reader at line %llu, previous record line %llu",
                      (unsigned long long)rec.line_no, (unsigned long long)lines,
                      (unsigned long long)last_line);
            last_line = rec.line_no;
            n_records++;
            FZ_ASSERT(log_n_records(r) == n_records, "log_n_records %llu, counted %llu",
                      (unsigned long long)log_n_records(r), (unsigned long long)n_records);
            check_record(&rec, opt);
            continue;
        }
        if (rc == LOG_EINPUT) {
            check_message(msg, path, lines, true);
            continue;
        }
        FZ_ASSERT(rc == LOG_EIO || rc == LOG_ENOMEM, "log_next returned %d", rc);
        check_message(msg, path, 0, false);
        rc = log_next(r, &rec);
        FZ_ASSERT(rc == LOG_END, "after an I/O error log_next returned %d", rc);
        break;
    }
    log_close(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_harness = "fuzz_replay_input";
    char path[64];
    int fd = make_file(data, size, path, sizeof path);
    FZ_ASSERT(fd >= 0, "cannot make a file for the input: %s", strerror(errno));

    log_options opt;
    log_options_init(&opt);
    opt.max_line_bytes = (size_t)1 << 20;
    read_all(path, &opt);

    opt.hash_block_size = 4;
    opt.tokenizer = TOK_BYTES;
    read_all(path, &opt);

    log_options_init(&opt);
    opt.max_line_bytes = 64;
    opt.hash_block_size = 1;
    opt.format = 1 + (int)(size % 3);
    read_all(path, &opt);

    close(fd);
    return 0;
}
