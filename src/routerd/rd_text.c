/*
 * rd_text.c - prompts as text for `kvprefix router` (rd_text.h): the tokenizer table and the
 * render-and-encode step of a /score request in text mode.
 *
 * Layout: the table (an array of entries, each a model name or NULL for the default, with
 * its tokenizer's in_opts as the tool's flag parser fills them, or only a template), the
 * flags, loading, then rd_text_tokens. The table is only written before the HTTP threads
 * start.
 *
 * The request path is replay's, call for call (input/logread.c, parse_openai and
 * tokenize_text): in_log_options gives the tokenizer and template of the model's in_opts;
 * the oai_prompt gets that template and the tokenizer's bos and eos texts; oai_render
 * renders the body; oai_text is the text; bpe_encode with special tokens on gives the ids.
 * Both calls run under the tokenizer's mutex (bpe.h keeps scratch state in the tokenizer;
 * the renderer is kept under it too, so a template the loader may attach to the tokenizer
 * is never shared between threads either).
 *
 * Invariants: at most one entry per model name (and one default); an entry with a loaded
 * tokenizer has in.bpe non-NULL after rd_text_load and a mutex initialised; a template-only
 * entry borrows its tokenizer from the default entry.
 */
#include "rd_text.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "inopts.h"
#include "openai.h"
#include "routerd.h"

typedef struct rd_text_entry {
    char *model;        /* the model, or NULL: the default (owned) */
    bool has_tok;       /* --tokenizer was given for it */
    in_opts in;         /* its tokenizer flags and, after rd_text_load, in.bpe (owned) */
    int tpl;            /* --template for it (TPL_*), 0 when not given */
    pthread_mutex_t mu; /* held while its tokenizer renders and encodes (has_tok) */
    bool mu_init;       /* mu was initialised */
} rd_text_entry;

struct rd_text {
    rd_text_entry *e; /* n entries */
    size_t n;
};

struct rd_text_scratch {
    oai_prompt p; /* the rendered prompt (reused) */
    bpe_out out;  /* the ids and offsets (reused) */
};

int rd_text_new(rd_text **out)
{
    *out = calloc(1, sizeof **out);
    return *out == NULL;
}

bool rd_text_enabled(const rd_text *t)
{
    if (t == NULL)
        return false;
    for (size_t i = 0; i < t->n; i++)
        if (t->e[i].has_tok)
            return true;
    return false;
}

/* The entry of model (NULL: the default), or NULL. */
static rd_text_entry *rd_find(const rd_text *t, const char *model, size_t len)
{
    for (size_t i = 0; i < t->n; i++) {
        const char *m = t->e[i].model;
        if (model == NULL ? m == NULL : m != NULL && strlen(m) == len && memcmp(m, model, len) == 0)
            return &t->e[i];
    }
    return NULL;
}

/* The entry of model (NULL: the default), added when missing. NULL when out of memory. */
static rd_text_entry *rd_entry(rd_text *t, const char *model, size_t len)
{
    rd_text_entry *e = rd_find(t, model, len);
    if (e != NULL)
        return e;
    rd_text_entry *ne = realloc(t->e, (t->n + 1) * sizeof *ne);
    if (ne == NULL)
        return NULL;
    t->e = ne;
    e = &t->e[t->n];
    memset(e, 0, sizeof *e);
    in_init(&e->in);
    if (model != NULL && (e->model = strndup(model, len)) == NULL)
        return NULL;
    t->n++;
    return e;
}

/* Split "[MODEL=]VALUE" of a flag: *model (NULL when none) and its length, the value. A
 * value that names an existing path as a whole (path_ok) is not split. */
static const char *rd_split(const char *arg, bool path_ok, const char **model, size_t *len)
{
    const char *eq = strchr(arg, '=');
    *model = NULL;
    *len = 0;
    if (eq == NULL || (path_ok && access(arg, F_OK) == 0))
        return arg;
    *model = arg;
    *len = (size_t)(eq - arg);
    return eq + 1;
}

int rd_text_tokenizer(rd_text *t, const char *arg)
{
    const char *model;
    size_t len;
    const char *v = rd_split(arg, true, &model, &len);
    if ((model != NULL && len == 0) || *v == '\0')
        return cli_fail("router", CLI_EXIT_USAGE, "--tokenizer: '%s' is not [MODEL=]PATH", arg);
    if (strcmp(v, "words") == 0 || strcmp(v, "bytes") == 0)
        return cli_fail("router", CLI_EXIT_USAGE,
                        "--tokenizer: '%s' is an approximate stand-in; the router needs the "
                        "model's own tokenizer (its ids must be the engine's)",
                        v);
    rd_text_entry *e = rd_entry(t, model, len);
    if (e == NULL)
        return cli_fail("router", CLI_EXIT_INTERNAL, "out of memory");
    if (e->has_tok)
        return cli_fail("router", CLI_EXIT_USAGE, "--tokenizer: %s%.*s%s given twice",
                        model ? "model '" : "the default (no MODEL=)", (int)len, model ? model : "",
                        model ? "'" : "");
    e->has_tok = true;
    return in_apply("router", &e->in, IN_OPT_TOKENIZER, v);
}

int rd_text_template(rd_text *t, const char *arg)
{
    const char *model;
    size_t len;
    const char *v = rd_split(arg, false, &model, &len);
    if (model != NULL && len == 0)
        return cli_fail("router", CLI_EXIT_USAGE, "--template: '%s' is not [MODEL=]NAME", arg);
    in_opts probe; /* the tool's parser checks the name */
    in_init(&probe);
    int rc = in_apply("router", &probe, IN_OPT_TEMPLATE, v);
    if (rc != 0)
        return rc;
    rd_text_entry *e = rd_entry(t, model, len);
    if (e == NULL)
        return cli_fail("router", CLI_EXIT_INTERNAL, "out of memory");
    e->tpl = probe.tpl;
    return 0;
}

int rd_text_load(rd_text *t)
{
    if (t == NULL)
        return 0;
    rd_text_entry *def = rd_find(t, NULL, 0);
    for (size_t i = 0; i < t->n; i++) {
        rd_text_entry *e = &t->e[i];
        if (!e->has_tok) {
            if (def == NULL || !def->has_tok)
                return cli_fail("router", CLI_EXIT_USAGE,
                                "--template %s%s: no --tokenizer for %s (give %s=PATH or a "
                                "default --tokenizer PATH)",
                                e->model ? e->model : "", e->model ? "=..." : "",
                                e->model ? "that model" : "any model",
                                e->model ? e->model : "MODEL");
            continue;
        }
        e->in.tpl = e->tpl;
        int rc = in_load("router", &e->in);
        if (rc != 0)
            return rc;
        if (pthread_mutex_init(&e->mu, NULL) != 0)
            return cli_fail("router", CLI_EXIT_INTERNAL, "cannot create a mutex");
        e->mu_init = true;
        log_options lo;
        log_options_init(&lo);
        in_log_options(&e->in, &lo);
        rd_log("tokenizer for %s%s%s: %s (%s, %zu ranks), %s template", e->model ? "model '" : "",
               e->model ? e->model : "every other model", e->model ? "'" : "", e->in.tokenizer_file,
               bpe_kind_name(bpe_kind(lo.bpe)), bpe_n_ranks(lo.bpe), tpl_name(lo.tpl));
    }
    char err[512];
    if (rd_text_check(t, err, sizeof err) != NULL)
        return cli_fail("router", CLI_EXIT_INTERNAL, "the tokenizer table is broken: %s", err);
    return 0;
}

/* Render and encode with entry e's tokenizer and template tpl (0: the tokenizer's own),
 * under its mutex. Returns 0, or 400 / 500 with err. */
static unsigned rd_render(rd_text_entry *e, int tpl, rd_text_scratch *s, const rd_req *q, char *err,
                          size_t err_size)
{
    in_opts view = e->in; /* borrows e->in.bpe: never freed through view */
    if (tpl)
        view.tpl = tpl;
    log_options lo;
    log_options_init(&lo);
    in_log_options(&view, &lo);
    s->p.tpl = lo.tpl;
    s->p.bos = bpe_bos(lo.bpe);
    s->p.eos = bpe_eos(lo.bpe);
    s->p.jinja = lo.jinja; /* the model's own template (parsed at load), read only */
    s->p.jinja_vars = lo.jinja_vars;
    s->p.no_segments = true;
    if (lo.tpl == TPL_JINJA && lo.jinja == NULL) {
        snprintf(err, err_size, "--template model: this model's tokenizer has no chat_template");
        return 400;
    }
    size_t len = q->text_n;
    size_t limit = len > (UINT32_MAX - 4096) / 8 ? UINT32_MAX - 1 : 8 * len + 4096;
    char msg[384];
    unsigned status = 0;
    pthread_mutex_lock(&e->mu);
    int rc = oai_render(q->body, limit, &s->p, msg, sizeof msg);
    if (rc != 0) {
        status = rc == LOG_ENOMEM ? 500 : 400;
        snprintf(err, err_size, "%s", msg);
    } else if (s->p.token_ids != NULL) {
        status = 400;
        snprintf(err, err_size, "a prompt of token ids: send them as \"tokens\"");
    } else {
        size_t n_text;
        const char *text = oai_text(&s->p, &n_text);
        s->out.n = 0;
        rc = bpe_encode(lo.bpe, text, n_text, true, 0, &s->out, msg, sizeof msg);
        if (rc != BPE_OK) {
            status = rc == BPE_ENOMEM ? 500 : 400;
            snprintf(err, err_size, "tokenizing the prompt: %s", msg);
        }
    }
    pthread_mutex_unlock(&e->mu);
    return status;
}

unsigned rd_text_tokens(rd_text *t, rd_text_scratch **sp, rd_req *q, char *err, size_t err_size)
{
    const char *model = q->str_set[0] ? q->str[0] : NULL;
    size_t len = q->str_set[0] ? q->str_len[0] : 0;
    rd_text_entry *m = t && model ? rd_find(t, model, len) : NULL;
    rd_text_entry *def = t ? rd_find(t, NULL, 0) : NULL;
    rd_text_entry *e = m && m->has_tok ? m : def && def->has_tok ? def : NULL;
    if (e == NULL) {
        if (model)
            snprintf(err, err_size,
                     "no tokenizer for model '%.200s': start the router with --tokenizer "
                     "%.200s=PATH (or a default --tokenizer PATH), or send \"tokens\"",
                     model, model);
        else
            snprintf(err, err_size,
                     "a text prompt needs a tokenizer: start the router with --tokenizer "
                     "PATH (or MODEL=PATH and name the \"model\"), or send \"tokens\"");
        return 400;
    }
    int tpl = m && m->tpl ? m->tpl : e->tpl ? e->tpl : def && def->tpl ? def->tpl : 0;
    if (*sp == NULL && (*sp = calloc(1, sizeof **sp)) == NULL) {
        snprintf(err, err_size, "out of memory");
        return 500;
    }
    rd_text_scratch *s = *sp;
    unsigned status = rd_render(e, tpl, s, q, err, err_size);
    if (status != 0)
        return status;
    if (s->out.n == 0) {
        snprintf(err, err_size, "prompt is empty: a request needs at least one prompt token");
        return 400;
    }
    int rc = rd_req_set_tokens(q, s->out.ids, s->out.n);
    if (rc == RD_REQ_BUSY) {
        snprintf(err, err_size, "the daemon holds --body-budget of request bodies: retry later");
        return 503;
    }
    if (rc != RD_REQ_MORE) {
        snprintf(err, err_size, "out of memory");
        return 500;
    }
    return 0;
}

void rd_text_scratch_trim(rd_text_scratch **sp, size_t keep_bytes)
{
    rd_text_scratch *s = *sp;
    if (s == NULL)
        return;
    size_t held = s->out.cap * 2 * sizeof(uint32_t) + s->p.text_cap + s->p.tout.cap;
    if (keep_bytes && held <= keep_bytes)
        return;
    oai_prompt_free(&s->p);
    bpe_out_free(&s->out);
    free(s);
    *sp = NULL;
}

const char *rd_text_check(const rd_text *t, char *err, size_t err_size)
{
    for (size_t i = 0; t && i < t->n; i++) {
        const rd_text_entry *e = &t->e[i];
        if (rd_find(t, e->model, e->model ? strlen(e->model) : 0) != e) /* the first match */
            return snprintf(err, err_size, "model '%s' has two entries",
                            e->model ? e->model : "(default)"),
                   err;
        if (e->has_tok && (e->in.bpe == NULL || !e->mu_init))
            return snprintf(err, err_size, "model '%s': a tokenizer given but not loaded",
                            e->model ? e->model : "(default)"),
                   err;
        if (!e->has_tok && e->in.bpe != NULL)
            return snprintf(err, err_size, "model '%s': a tokenizer loaded but not given",
                            e->model ? e->model : "(default)"),
                   err;
        char why[256];
        if (e->in.bpe != NULL && bpe_check(e->in.bpe, why, sizeof why) != 0)
            return snprintf(err, err_size, "model '%s': %s", e->model ? e->model : "(default)",
                            why),
                   err;
    }
    return NULL;
}

void rd_text_free(rd_text *t)
{
    if (t == NULL)
        return;
    for (size_t i = 0; i < t->n; i++) {
        in_free(&t->e[i].in);
        if (t->e[i].mu_init)
            pthread_mutex_destroy(&t->e[i].mu);
        free(t->e[i].model);
    }
    free(t->e);
    free(t);
}
