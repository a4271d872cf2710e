/*
 * template_jinja.c - an OpenAI chat body rendered with the model's own Jinja chat template
 * (jinja.h), as vLLM renders it, into the same tpl_out the hand-written templates fill.
 *
 * The context, as vLLM builds it before calling the template:
 *   messages   each {role, content[, name][, tool_calls][, tool_call_id]}: content as one
 *              string (vLLM's "string" content format: text parts joined by "\n", other
 *              parts as "<TYPE>", null as ""); tool_calls kept on assistant messages only,
 *              each call's "arguments" string parsed as JSON (kept as given when it is
 *              not JSON)
 *   tools      each tool through vLLM's pydantic model: {"type": "function", "function":
 *              {"name", "description", "parameters"}} in that order, absent fields null;
 *              null when the body has no tools
 *   add_generation_prompt  the body's (default true); documents null
 *   bos_token, eos_token and the other special tokens of tokenizer_config.json (extra)
 *   chat_template_kwargs   the body's object, merged over the rest (enable_thinking, ...)
 * continue_final_message is refused (vLLM trims the rendered end; not modelled).
 *
 * Segments (template.h) are found by rendering again: message i starts where the render of
 * messages[:i] (no generation prompt) stops agreeing with the full text, tool j where the
 * render with tools[:j] stops agreeing, the generation prompt where the render without it
 * stops. A partial render the template refuses (a check on roles, say) adds no boundary,
 * so its text stays with the segment before. Cost: one render per message and tool more
 * (each no longer than the full one), so only when segments are asked for.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "escape.h"
#include "jinja.h"
#include "template.h"

/* Content as one string (see the file comment); NULL on a bad content value. */
static json_t *content_string(const json_t *c)
{
    if (c == NULL || json_is_null(c))
        return json_string("");
    if (json_is_string(c))
        return json_incref((json_t *)c);
    if (!json_is_array(c))
        return NULL;
    size_t len = 0, cap = 0;
    char *s = NULL;
    for (size_t k = 0; k < json_array_size(c); k++) {
        const json_t *part = json_array_get(c, k), *type = json_object_get(part, "type");
        const json_t *text = json_object_get(part, "text");
        if (!json_is_string(type))
            goto fail;
        const char *t = json_string_value(type);
        bool is_text = strcmp(t, "text") == 0;
        if (is_text && !json_is_string(text))
            goto fail;
        size_t need = len + 3 + (is_text ? json_string_length(text) : strlen(t));
        if (!cli_grow((void **)&s, &cap, need + 1, 1))
            goto fail;
        if (k > 0)
            s[len++] = '\n';
        if (is_text) {
            memcpy(s + len, json_string_value(text), json_string_length(text));
            len += json_string_length(text);
        } else {
            s[len++] = '<';
            memcpy(s + len, t, strlen(t));
            len += strlen(t);
            s[len++] = '>';
        }
    }
    json_t *r = json_stringn_nocheck(s ? s : "", len);
    free(s);
    return r;
fail:
    free(s);
    return NULL;
}

/* A tool call as vLLM hands it over: arguments parsed. NULL on a bad call. */
static json_t *norm_call(const json_t *call)
{
    const json_t *f = json_object_get(call, "function");
    if (!json_is_object(f) || !json_is_string(json_object_get(f, "name")))
        return NULL;
    json_t *c = json_deep_copy(call), *fn = json_object_get(c, "function");
    const json_t *a = json_object_get(fn, "arguments");
    if (json_is_string(a)) {
        json_t *v = json_loadb(json_string_value(a), json_string_length(a),
                               JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
        if (v)
            json_object_set_new(fn, "arguments", v);
    }
    return c;
}

/* The template's context for body; NULL with a message in err. */
static json_t *build_context(const json_t *body, const json_t *extra, char *err, size_t err_size)
{
    const json_t *msgs = json_object_get(body, "messages"), *tools = json_object_get(body, "tools");
    const json_t *agp = json_object_get(body, "add_generation_prompt");
    const json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (json_is_true(json_object_get(body, "continue_final_message")))
        return cli_errf(err, err_size, "continue_final_message is not supported"), NULL;
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return cli_errf(err, err_size, "tools must be an array"), NULL;
    if (kw && !json_is_null(kw) && !json_is_object(kw))
        return cli_errf(err, err_size, "chat_template_kwargs must be an object"), NULL;
    json_t *ctx = json_is_object(extra) ? json_deep_copy(extra) : json_object();
    json_t *m = json_array();
    if (!ctx || !m) {
        json_decref(m);
        goto nomem;
    }
    json_object_set_new(ctx, "messages", m);
    json_object_set_new(ctx, "tools", json_null());
    json_object_set_new(ctx, "documents", json_null());
    json_object_set_new(ctx, "add_generation_prompt",
                        json_boolean(agp == NULL || json_is_null(agp) || json_is_true(agp)));
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *in = json_array_get(msgs, i), *role = json_object_get(in, "role");
        if (!json_is_object(in) || !json_is_string(role)) {
            cli_errf(err, err_size, "messages[%zu] must be an object with a string \"role\"", i);
            goto fail;
        }
        json_t *c = content_string(json_object_get(in, "content"));
        if (!c) {
            cli_errf(err, err_size,
                     "messages[%zu].content must be a string, an array of parts or null", i);
            goto fail;
        }
        json_t *o = json_pack("{s:O, s:o}", "role", role, "content", c);
        if (!o || json_array_append_new(m, o) < 0)
            goto nomem;
        const json_t *name = json_object_get(in, "name"), *id = json_object_get(in, "tool_call_id");
        const json_t *calls = json_object_get(in, "tool_calls");
        if (json_is_string(name))
            json_object_set(o, "name", (json_t *)name);
        if (json_is_string(id) && strcmp(json_string_value(role), "tool") == 0)
            json_object_set(o, "tool_call_id", (json_t *)id);
        if (json_is_array(calls) && strcmp(json_string_value(role), "assistant") == 0) {
            json_t *cs = json_array();
            json_object_set_new(o, "tool_calls", cs);
            for (size_t k = 0; k < json_array_size(calls); k++) {
                json_t *nc = norm_call(json_array_get(calls, k));
                if (!nc) {
                    cli_errf(err, err_size,
                             "messages[%zu].tool_calls[%zu] needs a \"function\" with a \"name\"",
                             i, k);
                    goto fail;
                }
                json_array_append_new(cs, nc);
            }
        } else if (calls && !json_is_null(calls) && !json_is_array(calls)) {
            cli_errf(err, err_size, "messages[%zu].tool_calls must be an array", i);
            goto fail;
        }
    }
    for (size_t j = 0; j < json_array_size(tools); j++)
        if (!json_is_string(
                json_object_get(json_object_get(json_array_get(tools, j), "function"), "name"))) {
            cli_errf(err, err_size, "tools[%zu] needs a \"function\" with a \"name\"", j);
            goto fail;
        }
    if (json_is_array(tools)) {
        json_t *nt = tpl_vllm_tools(tools);
        if (!nt)
            goto nomem;
        json_object_set_new(ctx, "tools", nt);
    }
    if (json_is_object(kw))
        json_object_update(ctx, (json_t *)kw);
    return ctx;
nomem:
    cli_errf(err, err_size, "out of memory");
fail:
    json_decref(ctx);
    return NULL;
}

static size_t common_prefix(const char *a, size_t na, const char *b, size_t nb)
{
    size_t k = 0;
    while (k < na && k < nb && a[k] == b[k])
        k++;
    return k;
}

typedef struct bound {
    uint32_t offset;
    int kind;
    uint32_t index;
} bound;

static int cmp_bound(const void *p, const void *q)
{
    const bound *a = p, *b = q;
    if (a->offset != b->offset)
        return a->offset < b->offset ? -1 : 1;
    return a->kind - b->kind;
}

/* Where the render of ctx with key set to val stops agreeing with the full text; or -1 when
 * the template refuses it. */
static long probe(const jinja_tmpl *t, json_t *ctx, const char *key, json_t *val,
                  const tpl_out *out, const char *now, char **buf, size_t *cap)
{
    json_t *saved = json_incref(json_object_get(ctx, key));
    json_object_set_new(ctx, key, val);
    char err[8];
    size_t len = 0;
    jinja_limits lim = {.max_output = out->limit, .now = now};
    int rc = jinja_render(t, ctx, &lim, buf, &len, cap, err, sizeof err);
    json_object_set_new(ctx, key, saved);
    if (rc < 0)
        return -1;
    return (long)common_prefix(*buf ? *buf : "", len, out->text, out->len);
}

/* Step 2 of tpl_render_jinja: the segments. */
static int find_segments(const jinja_tmpl *t, json_t *ctx, const char *now, tpl_out *out)
{
    json_t *msgs = json_incref(json_object_get(ctx, "messages"));
    json_t *tools = json_incref(json_object_get(ctx, "tools"));
    size_t n = json_array_size(msgs), nt = json_array_size(tools);
    bound *b = malloc((n + nt + 2) * sizeof *b);
    char *buf = NULL;
    size_t cap = 0, nb = 0;
    int rc = b ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        json_t *part = json_array();
        for (size_t k = 0; part && k < i; k++)
            json_array_append(part, json_array_get(msgs, k));
        json_t *agp = json_incref(json_object_get(ctx, "add_generation_prompt"));
        json_object_set_new(ctx, "add_generation_prompt", json_false());
        long off = part ? probe(t, ctx, "messages", part, out, now, &buf, &cap) : -1;
        json_object_set_new(ctx, "add_generation_prompt", agp);
        if (i == 0 && off < 0)
            off = 0;
        if (off >= 0)
            b[nb++] = (bound){(uint32_t)off, TPL_SEG_MESSAGE, (uint32_t)i};
    }
    for (size_t j = 0; rc == 0 && j < nt; j++) {
        json_t *part = json_array();
        for (size_t k = 0; part && k < j; k++)
            json_array_append(part, json_array_get(tools, k));
        long off = part ? probe(t, ctx, "tools", part, out, now, &buf, &cap) : -1;
        if (off >= 0)
            b[nb++] = (bound){(uint32_t)off, TPL_SEG_TOOL, (uint32_t)j};
    }
    if (rc == 0 && json_is_true(json_object_get(ctx, "add_generation_prompt"))) {
        long off = probe(t, ctx, "add_generation_prompt", json_false(), out, now, &buf, &cap);
        if (off >= 0 && (size_t)off < out->len)
            b[nb++] = (bound){(uint32_t)off, TPL_SEG_GEN, 0};
    }
    free(buf);
    if (rc == 0) {
        qsort(b, nb, sizeof *b, cmp_bound);
        out->n_segs = 0;
        if (!cli_grow((void **)&out->segs, &out->segs_cap, nb + 1, sizeof *out->segs))
            rc = -1;
    }
    for (size_t k = 0; rc == 0 && k <= nb; k++) {
        tpl_seg s = {0, 0, TPL_SEG_PREAMBLE, ""};
        if (k > 0) {
            s.offset = b[k - 1].offset;
            s.kind = b[k - 1].kind;
            s.index = b[k - 1].index;
        }
        if (k == 0 && nb > 0 && b[0].offset == 0)
            continue; /* no preamble */
        if (s.kind == TPL_SEG_MESSAGE) {
            const char *role =
                json_string_value(json_object_get(json_array_get(msgs, s.index), "role"));
            cli_quote_prefix(s.role, sizeof s.role, role, strlen(role), sizeof s.role - 1);
        }
        /* a later boundary at the same offset replaces an earlier one */
        if (out->n_segs > 0 && out->segs[out->n_segs - 1].offset == s.offset)
            out->segs[out->n_segs - 1] = s;
        else
            out->segs[out->n_segs++] = s;
    }
    free(b);
    json_decref(msgs);
    json_decref(tools);
    return rc;
}

int tpl_render_jinja(const jinja_tmpl *t, const json_t *body, const json_t *extra, const char *now,
                     bool segments, size_t limit, tpl_out *out, char *err, size_t err_size)
{
    out->len = 0;
    if (out->cap > 0)
        out->text[0] = '\0';
    out->n_segs = 0;
    out->limit = limit;
    if (t == NULL)
        return cli_errf(err, err_size, "no chat template to render with"), TPL_EINPUT;
    /* Step 1: the context and the full render. */
    json_t *ctx = build_context(body, extra, err, err_size);
    if (!ctx)
        return TPL_EINPUT;
    jinja_limits lim = {.max_output = limit, .now = now};
    char jerr[400];
    int rc = TPL_OK;
    if (jinja_render(t, ctx, &lim, &out->text, &out->len, &out->cap, jerr, sizeof jerr) < 0) {
        cli_errf(err, err_size, "chat template line %s", jerr);
        rc = strstr(jerr, "out of memory") ? TPL_ENOMEM : TPL_EINPUT;
    } else if (segments && find_segments(t, ctx, now, out) < 0) {
        cli_errf(err, err_size, "out of memory finding the prompt's segments");
        rc = TPL_ENOMEM;
    }
    json_decref(ctx);
    return rc;
}
