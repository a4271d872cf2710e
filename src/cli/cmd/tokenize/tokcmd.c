/*
 * tokcmd.c - `kvprefix tokenize`: print the token ids of a text or of an OpenAI request
 * body, so anyone can compare our tokenization with their engine's.
 *
 *   kvprefix tokenize --tokenizer FILE|DIR [--tokenizer-kind K] [--template T] [--json] [IN]
 *
 * IN is a file or "-" (standard input, the default). When the input is a JSON object with
 * "messages" or "prompt" (at the top level or in a Batch API line's "body"), it is an OpenAI
 * request: a chat request is rendered with the chat template (--template, else the
 * tokenizer's, inopts.h), a completions prompt string is taken as is; a template marker
 * that is not one token of the tokenizer is warned about (in_warn_markers).
 * Anything else (or any input with --text) is plain text, tokenized as it is. Special-token
 * text becomes the special token unless --no-special (then it is ordinary text).
 *
 * Output: the ids on one line, separated by spaces; with --json one object:
 *
 *   {"tokenizer": "llama3", "template": "llama3" | null, "n_tokens": N,
 *    "ids": [...], "spans": [[start, end], ...], "text": "the text tokenized"}
 *
 * where a span is the token's bytes in "text" as UTF-8 byte offsets (a token may end inside
 * a character; the spans of consecutive tokens meet).
 *
 * Memory: the input (at most --max-bytes, default 64 MiB), its parsed JSON for a body (tens
 * of bytes per byte), the rendered text and 8 bytes per token. Exit status (common/cli.h).
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "cli.h"
#include "flags.h"
#include "inopts.h"
#include "openai.h"
#include "outfile.h"
#include "template.h"
#include "tokcmd.h"

#define DEFAULT_MAX_BYTES ((uint64_t)64 << 20)

static const char usage_text[] =
    "Usage: kvprefix tokenize --tokenizer FILE|DIR [options] [IN]\n"
    "\n"
    "Print the token ids of a text or an OpenAI request body (IN, or '-' for standard\n"
    "input, the default) under a model's tokenizer and chat template.\n"
    "\n"
    "Options:\n"
    "  --tokenizer FILE|DIR the model's tokenizer: a Hugging Face model folder (with\n"
    "                       tokenizer.json) or tokenizer.json, or a tiktoken rank file\n"
    "                       (Llama 3's tokenizer.model, cl100k_base.tiktoken, ...)\n"
    "  --tokenizer-kind K   a rank file's kind: llama3, cl100k or o200k (else \"kind\" in\n"
    "                       FILE.json, else its number of ranks)\n"
    "  --template T         chat template for a chat request: llama3, chatml, qwen2.5,\n"
    "                       mistral (default: llama3 for Llama 3, else as the\n"
    "                       tokenizer.json's chat_template says, else chatml)\n"
    "  --text               the input is plain text even when it looks like a request\n"
    "  --no-special         special-token text is ordinary text\n"
    "  --json               one JSON object with ids, byte spans and the text\n"
    "  --max-bytes N        largest input (default 64MiB)\n"
    "  -h, --help           this message\n"
    "\n"
    "Examples:\n"
    "  echo 'Hello world' | kvprefix tokenize --tokenizer llama3.tiktoken -\n"
    "  kvprefix tokenize --tokenizer ./Qwen2.5-7B-Instruct --json body.json\n"
    "  kvprefix tokenize --tokenizer o200k_base.tiktoken --tokenizer-kind o200k --json body.json\n"
    "\n" CLI_EXIT_HELP;

#define fail(...) cli_fail("tokenize", __VA_ARGS__)

enum { OPT_TEXT = 256, OPT_NO_SPECIAL, OPT_JSON, OPT_MAX };

static const struct option longopts[] = {
    IN_TOKENIZER_LONGOPTS,
    {"text", no_argument, NULL, OPT_TEXT},
    {"no-special", no_argument, NULL, OPT_NO_SPECIAL},
    {"json", no_argument, NULL, OPT_JSON},
    {"max-bytes", required_argument, NULL, OPT_MAX},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* The parsed command line. */
typedef struct tk_opts {
    in_opts in;         /* --tokenizer FILE, --tokenizer-kind, --template (inopts.h) */
    bool text;          /* --text */
    bool no_special;    /* --no-special */
    bool json;          /* --json */
    uint64_t max_bytes; /* --max-bytes */
    const char *input;  /* IN ("-" by default) */
} tk_opts;

/* Apply one option. Returns 0, -1 after --help, or CLI_EXIT_USAGE. */
static int apply_opt(tk_opts *o, int c, const char *v)
{
    switch (c) {
    case 'h':
        fputs(usage_text, stdout);
        return -1;
    case OPT_TEXT:
        o->text = true;
        return 0;
    case OPT_NO_SPECIAL:
        o->no_special = true;
        return 0;
    case OPT_JSON:
        o->json = true;
        return 0;
    case OPT_MAX:
        return cli_flag_bytes("tokenize", "--max-bytes", v, 1, (uint64_t)1 << 32, &o->max_bytes);
    default:
        return in_apply("tokenize", &o->in, c, v);
    }
}

static int parse_args(int argc, char **argv, tk_opts *o)
{
    memset(o, 0, sizeof *o);
    in_init(&o->in);
    o->max_bytes = DEFAULT_MAX_BYTES;
    o->input = "-";
    cli_getopt_begin();
    int c;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        if (c == '?' || c == ':')
            return cli_getopt_error("tokenize", c, argv, longopts);
        int rc = apply_opt(o, c, optarg);
        if (rc)
            return rc;
    }
    if (optind < argc)
        o->input = argv[optind++];
    if (optind < argc)
        return fail(CLI_EXIT_USAGE, "one input at a time ('%s' and '%s')", o->input, argv[optind]);
    if (!o->in.tokenizer_file)
        return fail(CLI_EXIT_USAGE, "give --tokenizer FILE|DIR (the model's tokenizer.json or "
                                    "folder, or its tiktoken rank file)");
    if (o->text && o->in.tpl)
        return fail(CLI_EXIT_USAGE, "--template applies to request bodies, not --text");
    return 0;
}

/* Read all of the input (at most max bytes) into *buf (NUL-terminated). Returns 0 or
 * CLI_EXIT_INPUT (message printed). */
static int read_input(const tk_opts *o, char **buf, size_t *len)
{
    bool is_stdin = strcmp(o->input, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(o->input, "rb");
    if (f == NULL)
        return fail(CLI_EXIT_INPUT, "%s: cannot open: %s", o->input, strerror(errno));
    int r = cli_read_all(f, o->max_bytes, buf, len);
    int err = errno;
    if (!is_stdin)
        fclose(f);
    const char *name = cli_input_name(o->input);
    if (r == CLI_READ_NOMEM)
        return fail(CLI_EXIT_INPUT, "%s: out of memory", name);
    if (r == CLI_READ_TOOBIG)
        return fail(CLI_EXIT_INPUT, "%s: larger than --max-bytes %llu", name,
                    (unsigned long long)o->max_bytes);
    if (r == CLI_READ_EIO)
        return fail(CLI_EXIT_INPUT, "%s: read error: %s", name, strerror(err));
    return 0;
}

/* What is tokenized: the input itself, or a request's rendered prompt. */
typedef struct tk_text {
    const char *text; /* the text (the input buffer, or owned by prompt) */
    size_t len;       /* its bytes */
    int tpl;          /* the template used, or 0 */
    json_t *json;     /* the parsed body, or NULL */
    oai_prompt prompt;
} tk_text;

/* Decide whether the input is a request and render it. Returns 0 or CLI_EXIT_INPUT. */
static int input_text(const tk_opts *o, const bpe *t, const char *in, size_t n, tk_text *x)
{
    x->text = in;
    x->len = n;
    if (o->text)
        return 0;
    x->json = json_loadb(in, n, JSON_REJECT_DUPLICATES, NULL);
    if (!oai_is_request(x->json)) {
        if (o->in.tpl)
            return fail(CLI_EXIT_INPUT,
                        "%s: --template needs an OpenAI request body (a JSON "
                        "object with \"messages\")",
                        cli_input_name(o->input));
        return 0;
    }
    x->tpl = in_template_for(o->in.tpl, t);
    x->prompt.tpl = x->tpl;
    x->prompt.bos = bpe_bos(t);
    x->prompt.eos = bpe_eos(t);
    x->prompt.jinja = o->in.jinja;
    x->prompt.jinja_vars = o->in.jinja_vars;
    char err[512];
    size_t limit = n > (UINT32_MAX - 4096) / 8 ? UINT32_MAX - 1 : 8 * n + 4096;
    if (oai_render(x->json, limit, &x->prompt, err, sizeof err) != 0)
        return fail(CLI_EXIT_INPUT, "%s: %s", cli_input_name(o->input), err);
    if (x->prompt.token_ids != NULL)
        return fail(CLI_EXIT_INPUT, "%s: %s is already token ids", cli_input_name(o->input),
                    x->prompt.token_key);
    if (!x->prompt.chat)
        x->tpl = 0;
    else
        in_warn_markers(&o->in);
    x->text = oai_text(&x->prompt, &x->len);
    return 0;
}

/* Print the ids (or the JSON object). Returns 0 or -1 on out of memory. */
static int print_tokens(const tk_opts *o, const bpe *t, const tk_text *x, const bpe_out *out)
{
    if (!o->json) {
        for (size_t i = 0; i < out->n; i++)
            printf(i ? " %u" : "%u", out->ids[i]);
        putchar('\n');
        return 0;
    }
    json_t *j = json_object(), *ids = json_array(), *spans = json_array();
    if (!j || !ids || !spans) {
        json_decref(j);
        json_decref(ids);
        json_decref(spans);
        return -1;
    }
    for (size_t i = 0; i < out->n; i++) {
        size_t end = i + 1 < out->n ? out->offsets[i + 1] : x->len;
        json_array_append_new(ids, json_integer(out->ids[i]));
        json_array_append_new(spans,
                              json_pack("[II]", (json_int_t)out->offsets[i], (json_int_t)end));
    }
    json_object_set_new(j, "tokenizer", json_string(bpe_kind_name(bpe_kind(t))));
    json_object_set_new(j, "template", x->tpl ? json_string(tpl_name(x->tpl)) : json_null());
    json_object_set_new(j, "n_tokens", json_integer((json_int_t)out->n));
    json_object_set_new(j, "ids", ids);
    json_object_set_new(j, "spans", spans);
    json_object_set_new(j, "text", json_stringn(x->text, x->len));
    int rc = json_dumpf(j, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER);
    putchar('\n');
    json_decref(j);
    return rc;
}

/* Steps: 1 load the tokenizer, 2 read and render the input, 3 encode, 4 print. */
static int run(tk_opts *o)
{
    char err[512];
    /* Step 1: */
    if (in_load("tokenize", &o->in) != 0)
        return CLI_EXIT_INPUT;
    bpe *t = o->in.bpe;
    /* Step 2: */
    char *in = NULL;
    size_t n = 0;
    tk_text x;
    memset(&x, 0, sizeof x);
    int rc = read_input(o, &in, &n);
    if (rc == 0)
        rc = input_text(o, t, in, n, &x);
    /* Step 3: */
    bpe_out out = {0};
    if (rc == 0 && x.len >= UINT32_MAX)
        rc = fail(CLI_EXIT_INPUT, "%s: the text is 4 GiB or more", cli_input_name(o->input));
    if (rc == 0 && bpe_encode(t, x.text, x.len, !o->no_special, 0, &out, err, sizeof err) != 0)
        rc = fail(CLI_EXIT_INPUT, "%s: %s", cli_input_name(o->input), err);
    /* Step 4: */
    if (rc == 0 && print_tokens(o, t, &x, &out) != 0)
        rc = fail(CLI_EXIT_INPUT, "out of memory");
    bpe_out_free(&out);
    oai_prompt_free(&x.prompt);
    json_decref(x.json);
    free(in);
    in_free(&o->in);
    return rc;
}

int tokcmd_main(int argc, char **argv)
{
    tk_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? cli_stdout_check("tokenize") : rc;
    rc = run(&o);
    if (rc)
        return rc;
    return cli_stdout_check("tokenize");
}
