/*
 * inopts.h - the log-input options of the subcommands that read request logs (replay,
 * fleet), and the tokenizer options they share with tokenize: one option table, one
 * parser, one set of checks and one loader, so the same flag means the same thing and the
 * same mistake reads the same in every subcommand (flags.h's message shape, exit 2).
 *
 *   --format F            auto (per line), tokens, mooncake, openai
 *   --block-size N        tokens per block for token logs and OpenAI bodies (default 16)
 *   --trace-block-size N  tokens per Mooncake hash id (default 512)
 *   --tokenizer T         OpenAI bodies: words (default) or bytes, the stand-ins of
 *                         tokenize.h (approximate counts), or a model's tokenizer loaded
 *                         with bpe.h (exact counts): a Hugging Face model folder (its
 *                         tokenizer.json and tokenizer_config.json), a tokenizer.json, or a
 *                         tiktoken rank file
 *   --tokenizer-kind K    llama3, cl100k, o200k for a rank file (else its sidecar says,
 *                         else its number of ranks)
 *   --template T          model (the model's own chat_template, run by the Jinja
 *                         interpreter: the default when the tokenizer has one), or a
 *                         hand-written layout llama3, chatml, qwen2.5, mistral; without a
 *                         chat_template: llama3 for a llama3 rank file, chatml otherwise
 *
 * Template markers: in_load checks that every control text the template writes
 * (<|im_start|>, <|start_header_id|>, [INST], bos, ...) is one token of the tokenizer. When
 * one is not, the tokenizer would count it as several ordinary tokens where the model sees
 * one: in_load prints a warning and the reports say APPROXIMATE instead of exact.
 *   --max-line-bytes N    longest accepted line (default LOG_DEFAULT_MAX_LINE)
 *
 * Use: in_init; list IN_LONGOPTS (or IN_TOKENIZER_LONGOPTS alone) in the subcommand's
 * option table; for each option getopt_long returns with in_is_opt(c), call in_apply; once
 * every option is known, in_check; before reading, in_load (the rank file); then
 * in_log_options fills the reader's options. While reading, in_note records how the counts
 * of OpenAI bodies were made (in_count), and the report prints it with in_count_table and
 * in_count_json, so that every report says APPROXIMATE or exact in the same words.
 *
 * Invariants: tokenizer_file is NULL or a path other than "words" and "bytes"; bpe is
 * NULL until in_load succeeds with a tokenizer_file, and owned by the in_opts after it
 * (in_free).
 */
#ifndef CLI_INOPTS_H
#define CLI_INOPTS_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "bpe.h"
#include "logread.h"

struct json_t;

/* getopt_long values of the input flags (hashopt.h's are 0x1000..). */
enum {
    IN_OPT_FORMAT = 0x1100, /* --format F */
    IN_OPT_BLOCK_SIZE,      /* --block-size N */
    IN_OPT_TRACE_BS,        /* --trace-block-size N */
    IN_OPT_MAX_LINE,        /* --max-line-bytes N */
    IN_OPT_TOKENIZER,       /* --tokenizer T */
    IN_OPT_TOKENIZER_KIND,  /* --tokenizer-kind K */
    IN_OPT_TEMPLATE         /* --template T */
};

/* The option-table rows: the tokenizer's three (tokenize lists these alone), and all. */
/* clang-format off */
#define IN_TOKENIZER_LONGOPTS                                                                      \
    {"tokenizer", required_argument, NULL, IN_OPT_TOKENIZER},                                      \
    {"tokenizer-kind", required_argument, NULL, IN_OPT_TOKENIZER_KIND},                            \
    {"template", required_argument, NULL, IN_OPT_TEMPLATE}
#define IN_LONGOPTS                                                                                \
    {"format", required_argument, NULL, IN_OPT_FORMAT},                                            \
    {"block-size", required_argument, NULL, IN_OPT_BLOCK_SIZE},                                    \
    {"trace-block-size", required_argument, NULL, IN_OPT_TRACE_BS},                                \
    {"max-line-bytes", required_argument, NULL, IN_OPT_MAX_LINE},                                  \
    IN_TOKENIZER_LONGOPTS
/* clang-format on */

/* The lines of --help that describe them (two-space indent, 21-column flag field). */
#define IN_HELP                                                                                    \
    "  --format F           auto (per line, default), tokens, mooncake, openai\n"                  \
    "  --block-size N       tokens per block for token logs and OpenAI bodies (default 16)\n"      \
    "  --trace-block-size N tokens per Mooncake hash id (default 512)\n"                           \
    "  --tokenizer T        OpenAI bodies: words (default) or bytes (approximate), or\n"           \
    "                       the model's tokenizer (exact counts): a Hugging Face model\n"          \
    "                       folder or tokenizer.json, or a tiktoken rank file\n"                   \
    "  --tokenizer-kind K   a rank file's kind: llama3, cl100k or o200k (else \"kind\" in\n"       \
    "                       FILE.json, else its number of ranks)\n"                                \
    "  --template T         model (the model's own chat_template, the default when the\n"          \
    "                       tokenizer has one), or a layout: llama3, chatml, qwen2.5, mistral\n"   \
    "  --max-line-bytes N   longest accepted line (default 64MiB; also bounds what a\n"            \
    "                       compressed line may expand to)\n"

/* The input options as given, and the tokenizer once loaded. */
typedef struct in_opts {
    int format;                 /* 0 auto, or LOG_TOKENS / LOG_MOONCAKE / LOG_OPENAI */
    uint32_t block_size;        /* token logs and OpenAI bodies (default 16) */
    uint32_t trace_block_size;  /* tokens per Mooncake hash id (default 512) */
    size_t max_line_bytes;      /* longest accepted line (default LOG_DEFAULT_MAX_LINE) */
    int tokenizer;              /* OpenAI bodies without a FILE: TOK_* (default words) */
    const char *tokenizer_file; /* --tokenizer FILE: a tiktoken rank file, or NULL */
    int tokenizer_kind;         /* --tokenizer-kind: BPE_*, or 0 (the sidecar's) */
    int tpl;                    /* --template: TPL_*, or 0 (not given) */
    bpe *bpe;                   /* the loaded FILE after in_load, else NULL (owned) */
    char split_marker[64];      /* after in_load: a template marker that is not one token
                                   of the tokenizer, or "" */
    size_t split_tokens;        /* the tokens split_marker becomes (valid when set) */
    const char *cmd;            /* the subcommand given to in_load (for the warning) */
    jinja_tmpl *jinja;          /* after in_load, when the template is the model's own
                                   (TPL_JINJA): its chat_template parsed, else NULL (owned) */
    json_t *jinja_vars;         /* with jinja: bos_token and eos_token for it (owned) */
} in_opts;

/* How the token counts of a log's OpenAI bodies were made, for the report. */
typedef struct in_count {
    bool openai;      /* an OpenAI body was read: the fields below are valid */
    bool approximate; /* counted by a stand-in tokenizer (words or bytes), or split */
    bool split;       /* a template marker is not one token of the tokenizer (desc says) */
    char desc[160];   /* approximate: "words" or "bytes"; exact: "KIND tokenizer (N
                         ranks), TEMPLATE template" */
} in_count;

/* The defaults above, no tokenizer loaded. Cannot fail. */
void in_init(in_opts *o);

/* Whether getopt_long value c is one of the input flags. Cannot fail. */
bool in_is_opt(int c);

/* Apply input flag c with value v for subcommand cmd ("replay"). Returns 0, or
 * CLI_EXIT_USAGE with the flags.h message printed (o unchanged for that flag). */
int in_apply(const char *cmd, in_opts *o, int c, const char *v);

/* The checks between the input flags once all are known (--tokenizer-kind needs
 * --tokenizer FILE). Returns 0, or CLI_EXIT_USAGE with the message printed. */
int in_check(const char *cmd, const in_opts *o);

/* Load --tokenizer FILE into o->bpe (nothing to do without one). Returns 0, or
 * CLI_EXIT_INPUT with "kvprefix CMD: --tokenizer: FILE...: what is wrong" printed and
 * o->bpe left NULL. */
int in_load(const char *cmd, in_opts *o);

/* Print the warning about o->split_marker ("kvprefix CMD: warning: the T template writes
 * "M", which is not one token of the tokenizer ...") when there is one; in_note does it
 * at the first OpenAI body, tokenize when it renders a chat body. Cannot fail. */
void in_warn_markers(const in_opts *o);

/* The chat template for tokenizer t: tpl when given (non-zero), else llama3 for a llama3
 * tokenizer and chatml for the others; 0 when t is NULL and tpl is 0 (the fixed layout of
 * openai.h). Cannot fail. */
int in_template_for(int tpl, const bpe *t);

/* Fill *lo (after log_options_init) with the options: format, Mooncake block size, line
 * limit, stand-in tokenizer, and the loaded tokenizer with its template. Cannot fail. */
void in_log_options(const in_opts *o, log_options *lo);

/* Tokens per block of a log whose lines are of format (LOG_*). Cannot fail. */
uint32_t in_block_size(const in_opts *o, int format);

/* Whether a line of rec_format cannot join a log whose first line was of log_format (hash
 * ids and tokens cannot share one cache); when so, the sentence that says it goes into
 * msg[0 .. size). Cannot fail. */
bool in_format_clash(int log_format, int rec_format, char *msg, size_t size);

/* Record in *c how a line of rec_format was counted (only OpenAI bodies change it).
 * Cannot fail. */
void in_note(const in_opts *o, int rec_format, in_count *c);

/* The report's name of a log format ("token-id log", ...; "empty" for 0). Cannot fail. */
const char *in_format_name(int format);

/* Print the table line for *c after label (the report's indented "tokens" column): the
 * APPROXIMATE warning or "exact: ..."; nothing when no OpenAI body was read. */
void in_count_table(FILE *f, const char *label, const in_count *c);

/* Set "approximate_tokens" (true only for OpenAI bodies counted by a stand-in) and, after
 * an OpenAI body, "tokenizer" in JSON object j. Cannot fail (jansson's allocation failures
 * leave the fields out). */
void in_count_json(struct json_t *j, const in_count *c);

/* Free the loaded tokenizer; o stays valid with bpe NULL. Accepts NULL. */
void in_free(in_opts *o);

#endif /* CLI_INOPTS_H */
