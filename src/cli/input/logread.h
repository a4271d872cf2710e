/*
 * logread.h - a reader for request logs, shared by `kvprefix plan`, `replay` and `fleet`
 * (whose input flags fill log_options through inopts.h).
 *
 * Three line formats, detected per line, one JSON object per line (JSON Lines):
 *
 *   token log   {"tokens": [uint32, ...], "output_tokens": [uint32, ...]?,
 *                "model": s?, "adapter": s?, "tenant": s?, "cache_salt": s?,
 *                "timestamp": number?}
 *   Mooncake    {"timestamp": ms?, "input_length": n, "output_length": n,
 *                "hash_ids": [int, ...]}
 *   OpenAI      a /v1/chat/completions body {"messages": [...], ...} or a /v1/completions
 *               body {"prompt": ..., ...}, alone or wrapped as a Batch API input line
 *               {"custom_id": s, "method": "POST", "url": "/v1/...", "body": {...}};
 *               rendered to text by openai.h (chat layout documented there, or a model's
 *               chat template, template.h) and tokenized by tokenize.h (approximate
 *               counts) or, given log_options.bpe, by the model's BPE tokenizer (bpe.h).
 *
 * A line with "tokens" is a token log line, one with "hash_ids" a Mooncake line, one with
 * "messages" or "prompt" (at the top level or in "body") an OpenAI request; a line with more
 * than one of these, or none, is an error. log_options.format can force one format, and a
 * line of another shape is then an error naming the expected format. The namespace strings
 * (model, adapter, tenant, cache_salt) are optional in every format and may be null (absent);
 * the OpenAI mapping is in openai.h. Unknown fields are ignored. Blank lines are skipped.
 *
 * Any line may carry retention priorities (docs/replay.md, "Retention priorities"):
 *   "retention": {"priority": 0..100?, "duration": n?, "ranges": [[start, end, priority,
 *                 duration?], ...]?}
 * checked for shape here (at most LOG_MAX_RANGES ranges, start < end, priorities <= 100);
 * whether a range fits the prompt is the command's check. Such a line goes through jansson.
 *
 * The input is a path, "-" for standard input. It is gunzipped transparently when it is gzip
 * data and decompressed with libzstd's streaming API when it starts with the zstd magic
 * 28 B5 2F FD (several concatenated frames included), whatever its name. Detection looks at
 * the first bytes of the input (gzin.c) and then of what the gzip layer returns, so it works
 * on pipes and a gzipped .zst is unwrapped twice. Data after the last gzip member or zstd
 * frame, and a member or frame cut short, are errors. A UTF-8 byte order mark at the start
 * is skipped; a raw NUL byte or a carriage return inside a line that does not parse is named
 * in the message.
 *
 * Errors read "FILE:LINE: what is wrong" (or "FILE: ..." for the file as a whole). After an
 * error on one line the reader can go on with the next line; a read or decompression error
 * ends the file.
 *
 * Parsing: a token or Mooncake line is read by the validating single-pass scanner
 * (jsonl_scan.h), which accepts and rejects exactly what jansson does (RFC 8259, duplicate
 * keys, int64 integers) and decodes the id arrays straight into the record; the reader's
 * checks and messages are the same on both paths (only the text after "invalid JSON at
 * column N:" is the scanner's own). A line with "messages", "prompt" or "body" is parsed
 * again by jansson (the OpenAI renderer needs a tree), as is every line when the format is
 * forced to OpenAI or log_options.parser is LOG_PARSER_JANSSON.
 *
 * Memory: the reader holds one line (up to max_line_bytes, also after decompression, so a
 * compression bomb stops at its first over-long line) and the arrays of that line (at most
 * 4 bytes per line byte for token ids, 8 for hash ids, plus the scanner's 8 bytes per key of
 * the objects open at one time); a line parsed by jansson adds its tree (tens of bytes per
 * line byte). All of it is reused or freed at the next call.
 * An OpenAI line adds its rendered text (at most 8 times the line plus 4 KiB, and in practice
 * shorter than the line: see openai.h) and two 4-byte arrays per token (at most one token per
 * byte of text).
 */
#ifndef CLI_LOGREAD_H
#define CLI_LOGREAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bpe.h"
#include "template.h"
#include "tokenize.h"

enum {
    LOG_RECORD = 1,  /* *rec holds the next request */
    LOG_END = 0,     /* no more lines */
    LOG_EINPUT = -1, /* this line is malformed; the next call reads the next line */
    LOG_EIO = -2,    /* read or decompression error; the reader is at its end */
    LOG_ENOMEM = -3  /* out of memory, or a line over max_line_bytes; at its end */
};

enum {
    LOG_TOKENS = 1,   /* token-id log line */
    LOG_MOONCAKE = 2, /* Mooncake hash-id trace line */
    LOG_OPENAI = 3    /* OpenAI completions or chat completions request body */
};

enum {
    LOG_PARSER_SCAN = 0,   /* jsonl_scan for token and Mooncake lines, jansson for OpenAI */
    LOG_PARSER_JANSSON = 1 /* jansson for every line */
};

/* Default and largest --max-line-bytes. The default bounds what one line can cost: a parsed
 * JSON line takes up to tens of bytes per input byte, so 64 MiB keeps one line below a few
 * GiB of memory however hostile the input (docs/replay.md, "Bad and hostile input"). */
#define LOG_DEFAULT_MAX_LINE ((size_t)64 << 20)
#define LOG_MAX_LINE_LIMIT   (UINT64_C(1) << 40)

/* Largest length, in tokens, a record may declare (input_length, output_length). */
#define LOG_MAX_LEN UINT64_C(4294967295)

typedef struct log_options {
    size_t max_line_bytes;    /* longest accepted line (default LOG_DEFAULT_MAX_LINE) */
    uint32_t hash_block_size; /* Mooncake: tokens per hash id; when > 0, len(hash_ids) must
                                 be ceil or floor of input_length / hash_block_size (default
                                 512, the Mooncake traces' block size; 0 disables) */
    int format;               /* 0: detect per line (default); or LOG_TOKENS,
                                 LOG_MOONCAKE or LOG_OPENAI to require that format */
    int tokenizer;            /* OpenAI lines: TOK_WORDS (default) or
                                 TOK_BYTES */
    int parser;               /* LOG_PARSER_SCAN (default): token and Mooncake lines go
                                 through the single-pass scanner (jsonl_scan.h) and OpenAI
                                 lines through jansson; LOG_PARSER_JANSSON: every line
                                 through jansson (the reference the scanner is tested
                                 against; also set by KVPREFIX_LOG_PARSER=jansson) */
    bpe *bpe;                 /* OpenAI lines: a model tokenizer (tok/bpe.h, owned by the
                                 caller) used instead of tokenizer, or NULL (default) */
    int tpl;                  /* OpenAI chat lines: a chat template (TPL_*, tok/template.h)
                                 instead of the fixed layout of openai.h, or 0 (default) */
    const jinja_tmpl *jinja;  /* tpl TPL_JINJA: the model's own template (owned by the
                                 caller), else NULL */
    const json_t *jinja_vars; /* tpl TPL_JINJA: its bos_token and eos_token (caller's) */
    bool no_segments;         /* tpl TPL_JINJA: do not find the text's segments (they cost
                                 one render per message and tool; replay --diagnose and
                                 tokenize use them) */
} log_options;

/* Fill *opt with the defaults above (parser: LOG_PARSER_JANSSON when the environment
 * variable KVPREFIX_LOG_PARSER is "jansson", else LOG_PARSER_SCAN). Cannot fail (does
 * nothing if opt is NULL). */
void log_options_init(log_options *opt);

/* One request. Every pointer is owned by the reader and valid until the next
 * log_next or log_close. */
/* One range of a line's "retention" field: tokens [start, end) of the prompt at priority,
 * lapsing after duration requests (0: never). */
typedef struct log_range {
    uint64_t start;    /* first token */
    uint64_t end;      /* one past the last token; start < end */
    uint32_t priority; /* 0 .. 100 */
    uint64_t duration; /* requests; 0: never lapses */
} log_range;

#define LOG_MAX_RANGES 64 /* most ranges one line's retention may hold */

typedef struct log_record {
    uint64_t line_no;  /* 1-based line number in the (decompressed) input */
    int format;        /* LOG_TOKENS, LOG_MOONCAKE or LOG_OPENAI */
    const char *model; /* namespace strings, NUL-terminated; NULL when absent */
    const char *adapter;
    const char *tenant;
    const char *cache_salt;
    size_t model_len; /* byte lengths of the strings above (they may hold NULs) */
    size_t adapter_len;
    size_t tenant_len;
    size_t cache_salt_len;
    const uint32_t *tokens;        /* token log and OpenAI: prompt token ids; NULL for Mooncake */
    size_t n_tokens;               /* number of tokens */
    const uint32_t *output_tokens; /* token log: generated token ids, or NULL (always NULL
                                      for OpenAI lines) */
    size_t n_output_tokens;        /* number of output tokens (0 when absent) */
    const uint64_t *hash_ids;      /* Mooncake: block hash ids; NULL for token logs */
    size_t n_hash_ids;             /* number of hash ids */
    uint64_t input_length;         /* prompt tokens: n_tokens, or Mooncake input_length */
    uint64_t output_length;        /* output tokens: n_output_tokens, Mooncake output_length,
                                      or OpenAI max_completion_tokens / max_tokens (0 when
                                      neither is a non-negative integer) */
    bool has_timestamp;            /* whether timestamp is valid */
    double timestamp;              /* as given in the line (Mooncake: ms from trace start) */
    const char *text;              /* OpenAI: the rendered prompt, NUL-terminated, kept for
                                      diagnostics; NULL for other formats and for token-id
                                      prompts */
    size_t text_len;               /* bytes at text (0 when text is NULL) */
    const uint32_t *token_offsets; /* n_tokens byte offsets into text: where token i begins
                                      (ascending); NULL when text is NULL */
    const tpl_seg *segs;           /* OpenAI chat with a template: the text's segments
                                      (template.h), ascending; NULL otherwise */
    size_t n_segs;                 /* segments at segs */
    /* The line's "retention" field (all zero when it has none). */
    bool has_retention;                /* the line has a "retention" object */
    uint32_t retention_priority;       /* its "priority" (default 35) */
    uint64_t retention_duration;       /* its "duration" (default 0: never lapses) */
    const log_range *retention_ranges; /* its "ranges", or NULL */
    size_t n_retention_ranges;         /* entries at retention_ranges */
} log_record;

typedef struct log_reader log_reader;

/* Open path ("-" for standard input, which log_close then leaves open). opt may be NULL
 * for the defaults. Returns 0 and sets *out to a new reader (free it with log_close), or
 * LOG_EIO / LOG_ENOMEM with "FILE: what is wrong" in err (truncated to err_size). */
int log_open(const char *path, const log_options *opt, log_reader **out, char *err,
             size_t err_size);

/* Read the next request into *rec. Returns LOG_RECORD, LOG_END, or a negative
 * LOG_E* code with the message in log_error(). *rec is only written on
 * LOG_RECORD. */
int log_next(log_reader *r, log_record *rec);

/* The last error message, "FILE:LINE: what is wrong"; "" if none. Owned by the reader. */
const char *log_error(const log_reader *r);

/* Records returned so far, and lines read so far (blank lines included). */
uint64_t log_n_records(const log_reader *r);
uint64_t log_n_lines(const log_reader *r);

/* Bytes of the input file consumed so far (compressed bytes for .gz and .zst), for progress
 * bars; 0 when unknown. Cannot fail. */
uint64_t log_bytes_in(const log_reader *r);

/* Close the reader and free everything it holds. Accepts NULL. */
void log_close(log_reader *r);

#endif /* CLI_LOGREAD_H */
