/*
 * inopts.c - the log-input options shared by replay, fleet and tokenize (inopts.h): their
 * choice tables, the parser of their values (flags.h helpers, so messages and exit status
 * are those of every other flag), the checks between them, the loading of the tokenizer
 * (bpe.h: a rank file, a tokenizer.json or a SentencePiece model) with the choice of chat
 * template and the check that its markers are single tokens, and the wording of how token
 * counts were made, which every report prints the same way.
 *
 * Layout: the choice tables, then parsing (in_apply), then loading and the reader's
 * options, then what reports print. Nothing here keeps state beyond the in_opts and
 * in_count the caller owns.
 *
 * Cost: O(length of the value) per flag; in_load reads the whole rank file (bpe.h gives its
 * memory); the rest is constant time.
 */
#include "inopts.h"

#include <jansson.h>
#include <string.h>

#include "cli.h"
#include "flags.h"
#include "jinja.h"
#include "kvprefix.h"
#include "template.h"
#include "tokenize.h"

static const cli_choice formats[] = {{"auto", 0},
                                     {"tokens", LOG_TOKENS},
                                     {"mooncake", LOG_MOONCAKE},
                                     {"openai", LOG_OPENAI},
                                     {NULL, 0}};
static const cli_choice kinds[] = {
    {"llama3", BPE_LLAMA3}, {"cl100k", BPE_CL100K}, {"o200k", BPE_O200K}, {NULL, 0}};
static const cli_choice templates[] = {{"model", TPL_JINJA},     {"llama3", TPL_LLAMA3},
                                       {"chatml", TPL_CHATML},   {"qwen2.5", TPL_QWEN25},
                                       {"mistral", TPL_MISTRAL}, {NULL, 0}};

void in_init(in_opts *o)
{
    memset(o, 0, sizeof *o);
    o->block_size = 16;
    o->trace_block_size = 512;
    o->max_line_bytes = LOG_DEFAULT_MAX_LINE;
    o->tokenizer = TOK_WORDS;
}

bool in_is_opt(int c)
{
    return c >= IN_OPT_FORMAT && c <= IN_OPT_TEMPLATE;
}

/* ---- parsing ------------------------------------------------------------------------------ */

int in_apply(const char *cmd, in_opts *o, int c, const char *v)
{
    uint64_t x = 0;
    int rc = 0;
    switch (c) {
    case IN_OPT_FORMAT:
        return cli_flag_choice(cmd, "--format", v, formats, &o->format);
    case IN_OPT_BLOCK_SIZE:
        if ((rc = cli_flag_uint(cmd, "--block-size", v, 1, KVP_MAX_BLOCK_SIZE, &x)) == 0)
            o->block_size = (uint32_t)x;
        return rc;
    case IN_OPT_TRACE_BS:
        if ((rc = cli_flag_uint(cmd, "--trace-block-size", v, 1, KVP_MAX_BLOCK_SIZE, &x)) == 0)
            o->trace_block_size = (uint32_t)x;
        return rc;
    case IN_OPT_MAX_LINE:
        if ((rc = cli_flag_bytes(cmd, "--max-line-bytes", v, 1024, LOG_MAX_LINE_LIMIT, &x)) == 0)
            o->max_line_bytes = (size_t)x;
        return rc;
    case IN_OPT_TOKENIZER:
        /* "words" and "bytes" name the stand-ins; anything else is a rank file. */
        o->tokenizer = strcmp(v, "bytes") == 0 ? TOK_BYTES : TOK_WORDS;
        o->tokenizer_file = strcmp(v, "words") == 0 || strcmp(v, "bytes") == 0 ? NULL : v;
        return 0;
    case IN_OPT_TOKENIZER_KIND:
        return cli_flag_choice(cmd, "--tokenizer-kind", v, kinds, &o->tokenizer_kind);
    case IN_OPT_TEMPLATE:
        return cli_flag_choice(cmd, "--template", v, templates, &o->tpl);
    default:
        return 0;
    }
}

int in_check(const char *cmd, const in_opts *o)
{
    if (o->tokenizer_kind && !o->tokenizer_file)
        return cli_fail(cmd, CLI_EXIT_USAGE, "--tokenizer-kind needs --tokenizer FILE");
    return 0;
}

/* ---- loading and the reader's options -------------------------------------------------- */

/* The control texts each template writes (besides the tokenizer's bos and eos). */
static const char *const markers_llama3[] = {"<|start_header_id|>", "<|end_header_id|>",
                                             "<|eot_id|>", NULL};
static const char *const markers_chatml[] = {"<|im_start|>", "<|im_end|>", NULL};
static const char *const markers_mistral[] = {"[INST]", "[/INST]", NULL};

/* Find a marker of template tpl that t does not hold as one token: its text into
 * o->split_marker and the tokens it becomes into o->split_tokens. Returns 0, or -1 when
 * encoding a marker fails (out of memory). */
static int check_markers(in_opts *o, int tpl)
{
    const bpe *t = o->bpe;
    const char *const *m = tpl == TPL_LLAMA3    ? markers_llama3
                           : tpl == TPL_MISTRAL ? markers_mistral
                                                : markers_chatml;
    const char *all[8];
    size_t n = 0;
    for (; *m; m++)
        all[n++] = *m;
    if (*bpe_bos(t) && tpl != TPL_CHATML && tpl != TPL_QWEN25)
        all[n++] = bpe_bos(t);
    if (*bpe_eos(t) && tpl == TPL_MISTRAL)
        all[n++] = bpe_eos(t);
    o->split_marker[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (bpe_special(t, all[i], strlen(all[i]), NULL))
            continue;
        bpe_out out = {0};
        char err[128];
        int rc = bpe_encode(o->bpe, all[i], strlen(all[i]), true, 0, &out, err, sizeof err);
        o->split_tokens = out.n;
        bpe_out_free(&out);
        if (rc != BPE_OK)
            return -1;
        snprintf(o->split_marker, sizeof o->split_marker, "%s", all[i]);
        return 0;
    }
    return 0;
}

/* The model's own chat template: parse the tokenizer's chat_template (with its line in an
 * error) and make its variables. Its markers are the tokenizer's own added tokens, so they
 * are not checked one by one as a hand-written layout's are. Returns 0 or an exit status. */
static int load_jinja(const char *cmd, in_opts *o)
{
    const char *ct = bpe_chat_template(o->bpe);
    char err[512];
    if (!*ct)
        return cli_fail(cmd, CLI_EXIT_USAGE,
                        "--template model: %s has no chat_template (tokenizer_config.json); "
                        "name a layout: llama3, chatml, qwen2.5, mistral",
                        o->tokenizer_file);
    if (jinja_parse(ct, strlen(ct), &o->jinja, err, sizeof err) != 0)
        return cli_fail(cmd, CLI_EXIT_INPUT, "%s: chat_template line %s", o->tokenizer_file, err);
    o->jinja_vars = json_pack("{ssss}", "bos_token", bpe_bos(o->bpe), "eos_token", bpe_eos(o->bpe));
    if (!o->jinja_vars)
        return cli_fail(cmd, CLI_EXIT_INPUT, "--tokenizer: out of memory");
    return 0;
}

int in_load(const char *cmd, in_opts *o)
{
    if (!o->tokenizer_file)
        return 0;
    char err[512];
    if (bpe_load(o->tokenizer_file, o->tokenizer_kind, &o->bpe, err, sizeof err) != BPE_OK)
        return cli_fail(cmd, CLI_EXIT_INPUT, "--tokenizer: %s", err);
    int tpl = in_template_for(o->tpl, o->bpe);
    o->cmd = cmd;
    if (tpl == TPL_JINJA)
        return load_jinja(cmd, o);
    if (check_markers(o, tpl) != 0)
        return cli_fail(cmd, CLI_EXIT_INPUT, "--tokenizer: out of memory");
    return 0;
}

void in_warn_markers(const in_opts *o)
{
    if (o->bpe == NULL || !o->split_marker[0])
        return;
    fprintf(stderr,
            "kvprefix %s: warning: the %s template writes \"%s\", which is not one token of "
            "the tokenizer (it becomes %zu): token counts are approximate\n",
            o->cmd ? o->cmd : "", tpl_name(in_template_for(o->tpl, o->bpe)), o->split_marker,
            o->split_tokens);
}

int in_template_for(int tpl, const bpe *t)
{
    if (tpl || !t)
        return tpl;
    if (bpe_kind(t) != BPE_HF)
        return bpe_kind(t) == BPE_LLAMA3 ? TPL_LLAMA3 : TPL_CHATML;
    if (*bpe_chat_template(t)) /* the model's own, run by the Jinja interpreter */
        return TPL_JINJA;
    /* A tokenizer.json: the hand-written layout its chat_template is written for. */
    const char *ct = bpe_chat_template(t);
    if (strstr(ct, "You are Qwen, created by Alibaba Cloud") != NULL)
        return TPL_QWEN25;
    if (strstr(ct, "<|start_header_id|>") != NULL)
        return TPL_LLAMA3;
    if (strstr(ct, "[INST]") != NULL)
        return TPL_MISTRAL;
    return TPL_CHATML;
}

void in_log_options(const in_opts *o, log_options *lo)
{
    lo->format = o->format;
    lo->tokenizer = o->tokenizer;
    lo->hash_block_size = o->trace_block_size;
    lo->max_line_bytes = o->max_line_bytes;
    lo->bpe = o->bpe;
    lo->tpl = in_template_for(o->tpl, o->bpe);
    lo->jinja = o->jinja;
    lo->jinja_vars = o->jinja_vars;
}

uint32_t in_block_size(const in_opts *o, int format)
{
    return format == LOG_MOONCAKE ? o->trace_block_size : o->block_size;
}

bool in_format_clash(int log_format, int rec_format, char *msg, size_t size)
{
    if (rec_format == log_format || (rec_format != LOG_MOONCAKE && log_format != LOG_MOONCAKE))
        return false;
    snprintf(msg, size,
             "a %s line in a %s log: hash ids and tokens cannot share one cache (use --format "
             "to pick one)",
             rec_format == LOG_MOONCAKE ? "Mooncake" : "token",
             log_format == LOG_MOONCAKE ? "Mooncake" : "token");
    return true;
}

void in_free(in_opts *o)
{
    if (!o)
        return;
    bpe_free(o->bpe);
    o->bpe = NULL;
    jinja_free(o->jinja);
    o->jinja = NULL;
    json_decref(o->jinja_vars);
    o->jinja_vars = NULL;
}

/* ---- what reports print ---------------------------------------------------------------- */

void in_note(const in_opts *o, int rec_format, in_count *c)
{
    if (rec_format != LOG_OPENAI || c->openai)
        return;
    c->openai = true;
    in_warn_markers(o);
    c->approximate = o->bpe == NULL || o->split_marker[0] != '\0';
    c->split = o->bpe != NULL && o->split_marker[0] != '\0';
    const char *tpl = o->bpe ? tpl_name(in_template_for(o->tpl, o->bpe)) : "";
    if (o->bpe == NULL)
        snprintf(c->desc, sizeof c->desc, "%s", o->tokenizer == TOK_BYTES ? "bytes" : "words");
    else if (c->split)
        snprintf(c->desc, sizeof c->desc,
                 "the %s template's \"%.40s\" is %zu tokens of the %s tokenizer, not one", tpl,
                 o->split_marker, o->split_tokens, bpe_kind_name(bpe_kind(o->bpe)));
    else if (bpe_kind(o->bpe) == BPE_HF)
        snprintf(c->desc, sizeof c->desc, "tokenizer.json (%s, %zu tokens), %s", bpe_form(o->bpe),
                 bpe_n_ranks(o->bpe),
                 in_template_for(o->tpl, o->bpe) == TPL_JINJA ? "the model's own chat template"
                                                              : tpl);
    else
        snprintf(c->desc, sizeof c->desc, "%s tokenizer (%zu ranks), %s template",
                 bpe_kind_name(bpe_kind(o->bpe)), bpe_n_ranks(o->bpe), tpl);
}

const char *in_format_name(int format)
{
    return format == LOG_TOKENS     ? "token-id log"
           : format == LOG_MOONCAKE ? "Mooncake hash-id trace"
           : format == LOG_OPENAI   ? "OpenAI-style request bodies"
                                    : "empty";
}

void in_count_table(FILE *f, const char *label, const in_count *c)
{
    if (!c->openai)
        return;
    if (c->split)
        fprintf(f, "%sAPPROXIMATE: %s; counts are not the model's\n", label, c->desc);
    else if (c->approximate)
        fprintf(f,
                "%sAPPROXIMATE: stand-in '%s' tokenizer and a fixed chat layout, not the "
                "model's; compare runs, not absolute counts\n",
                label, c->desc);
    else
        fprintf(f, "%sexact: %s\n", label, c->desc);
}

void in_count_json(struct json_t *j, const in_count *c)
{
    json_object_set_new(j, "approximate_tokens", json_boolean(c->openai && c->approximate));
    if (c->openai)
        json_object_set_new(j, "tokenizer", json_string(c->desc));
}
