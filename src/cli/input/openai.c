/*
 * openai.c - rendering OpenAI completions and chat completions bodies to prompt text (the
 * layout and the accepted shapes are documented in openai.h).
 *
 * Layout. The text is one growable buffer in oai_prompt, reused across lines, with the
 * template markers recorded beside it as (offset, id) pairs:
 *
 *     text:  <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n
 *     marks: (0, IM_START) (19, IM_END) (30, IM_START)
 *
 * Every append goes through append(), which enforces the caller's limit and records an
 * out-of-memory or over-limit failure in p->failure, so the walk over the JSON can stop at
 * the first failed append and report it once. tools and tool_calls are written straight into
 * the buffer by json_dump_callback (no intermediate string).
 *
 * Invariants: text_len <= limit < 2^32; marks ascend and lie inside text; text[text_len] is
 * NUL whenever text_cap > 0. Cost: O(line) time; the buffers grow geometrically to the
 * largest rendered prompt and are kept.
 */
#include "openai.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "escape.h"
#include "logread.h"

enum {
    FAIL_NONE = 0, /* no append failed */
    FAIL_LIMIT,    /* the text would exceed p->limit */
    FAIL_NOMEM     /* cli_grow failed */
};

/* Append n bytes to the text. Returns 0, or -1 with p->failure set (the text unchanged). */
static int append(oai_prompt *p, const char *s, size_t n)
{
    if (p->failure != FAIL_NONE)
        return -1;
    if (n > p->limit - p->text_len) {
        p->failure = FAIL_LIMIT;
        return -1;
    }
    size_t need = p->text_len + n + 1;
    if (!cli_grow((void **)&p->text, &p->text_cap, need, 1)) {
        p->failure = FAIL_NOMEM;
        return -1;
    }
    memcpy(p->text + p->text_len, s, n);
    p->text_len += n;
    p->text[p->text_len] = '\0';
    return 0;
}

static int append_str(oai_prompt *p, const char *s)
{
    return append(p, s, strlen(s));
}

/* Append a JSON string's bytes. */
static int append_json_str(oai_prompt *p, const json_t *s)
{
    return append(p, json_string_value(s), json_string_length(s));
}

/* Append a template marker and record its position. Returns 0 or -1 (p->failure set). */
static int append_mark(oai_prompt *p, uint32_t id)
{
    if (p->failure != FAIL_NONE)
        return -1;
    if (!cli_grow((void **)&p->marks, &p->marks_cap, p->n_marks + 1, sizeof *p->marks)) {
        p->failure = FAIL_NOMEM;
        return -1;
    }
    size_t at = p->text_len;
    int rc = id == TOK_IM_START ? append_str(p, TOK_IM_START_TEXT) : append_str(p, TOK_IM_END_TEXT);
    if (rc != 0)
        return rc;
    p->marks[p->n_marks].offset = (uint32_t)at;
    p->marks[p->n_marks].id = id;
    p->n_marks++;
    return 0;
}

static int dump_cb(const char *buf, size_t size, void *data)
{
    return append(data, buf, size);
}

/* Append v as compact JSON, keys in their given order. */
static int append_json(oai_prompt *p, const json_t *v)
{
    if (json_dump_callback(v, dump_cb, p, JSON_COMPACT | JSON_PRESERVE_ORDER) != 0) {
        if (p->failure == FAIL_NONE)
            p->failure = FAIL_NOMEM; /* jansson's own allocation failed */
        return -1;
    }
    return 0;
}

static int fail(char *err, size_t err_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Format the message into err and return LOG_EINPUT. */
static int fail(char *err, size_t err_size, const char *fmt, ...)
{
    if (err != NULL && err_size > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
    }
    return LOG_EINPUT;
}

/* Turn p->failure into the return code and message. */
static int append_failed(oai_prompt *p, char *err, size_t err_size)
{
    if (p->failure == FAIL_LIMIT)
        return fail(err, err_size,
                    "the rendered prompt would exceed %zu bytes (8 times the line plus 4 KiB)",
                    p->limit);
    cli_errf(err, err_size, "out of memory rendering a prompt of %zu bytes", p->text_len);
    return LOG_ENOMEM;
}

/* Render a message's content parts (an array). Returns 0, or a LOG_E* code. */
static int render_parts(oai_prompt *p, size_t i, const json_t *parts, char *err, size_t err_size)
{
    size_t n = json_array_size(parts);
    for (size_t k = 0; k < n; k++) {
        const json_t *part = json_array_get(parts, k);
        if (!json_is_object(part))
            return fail(err, err_size, "messages[%zu].content[%zu] must be an object, not %s", i, k,
                        cli_json_type_name(part));
        const json_t *type = json_object_get(part, "type");
        if (!json_is_string(type))
            return fail(err, err_size, "messages[%zu].content[%zu].type must be a string, not %s",
                        i, k, cli_json_type_name(type));
        if (strcmp(json_string_value(type), "text") == 0 && json_string_length(type) == 4) {
            const json_t *text = json_object_get(part, "text");
            if (!json_is_string(text))
                return fail(err, err_size,
                            "messages[%zu].content[%zu].text must be a string, not %s", i, k,
                            cli_json_type_name(text));
            if (append_json_str(p, text) != 0)
                return append_failed(p, err, err_size);
        } else if (append_str(p, "<") != 0 || append_json_str(p, type) != 0 ||
                   append_str(p, ">") != 0) {
            return append_failed(p, err, err_size);
        }
    }
    return 0;
}

/* Render a chat request in the layout of openai.h, steps 1-3. Returns 0 or a LOG_E*
 * code. */
static int render_chat(oai_prompt *p, const json_t *body, char *err, size_t err_size)
{
    const json_t *messages = json_object_get(body, "messages");
    if (!json_is_array(messages))
        return fail(err, err_size, "messages must be an array of messages, not %s",
                    cli_json_type_name(messages));
    size_t n = json_array_size(messages);
    if (n == 0)
        return fail(err, err_size, "messages is empty: a chat request needs a message");

    /* Step 1: the tools block. */
    const json_t *tools = json_object_get(body, "tools");
    if (tools != NULL && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return fail(err, err_size, "tools must be an array, not %s", cli_json_type_name(tools));
        if (json_array_size(tools) > 0 &&
            (append_mark(p, TOK_IM_START) != 0 || append_str(p, "tools\n") != 0 ||
             append_json(p, tools) != 0 || append_mark(p, TOK_IM_END) != 0 ||
             append_str(p, "\n") != 0))
            return append_failed(p, err, err_size);
    }

    /* Step 2: the messages. */
    for (size_t i = 0; i < n; i++) {
        const json_t *msg = json_array_get(messages, i);
        if (!json_is_object(msg))
            return fail(err, err_size, "messages[%zu] must be an object, not %s", i,
                        cli_json_type_name(msg));
        const json_t *role = json_object_get(msg, "role");
        if (!json_is_string(role))
            return fail(err, err_size, "messages[%zu].role must be a string, not %s", i,
                        cli_json_type_name(role));
        const json_t *content = json_object_get(msg, "content");
        const json_t *calls = json_object_get(msg, "tool_calls");
        if (calls != NULL && !json_is_null(calls) && !json_is_array(calls))
            return fail(err, err_size, "messages[%zu].tool_calls must be an array, not %s", i,
                        cli_json_type_name(calls));
        bool has_calls = json_is_array(calls);
        if (content == NULL && !has_calls)
            return fail(err, err_size,
                        "messages[%zu].content is missing (only a message with tool_calls may "
                        "omit it)",
                        i);
        if (content != NULL && !json_is_string(content) && !json_is_array(content) &&
            !json_is_null(content))
            return fail(err, err_size,
                        "messages[%zu].content must be a string, an array of parts or null, "
                        "not %s",
                        i, cli_json_type_name(content));
        if (append_mark(p, TOK_IM_START) != 0 || append_json_str(p, role) != 0 ||
            append_str(p, "\n") != 0)
            return append_failed(p, err, err_size);
        if (json_is_string(content)) {
            if (append_json_str(p, content) != 0)
                return append_failed(p, err, err_size);
        } else if (json_is_array(content)) {
            int rc = render_parts(p, i, content, err, err_size);
            if (rc != 0)
                return rc;
        }
        if (has_calls && append_json(p, calls) != 0)
            return append_failed(p, err, err_size);
        if (append_mark(p, TOK_IM_END) != 0 || append_str(p, "\n") != 0)
            return append_failed(p, err, err_size);
    }

    /* Step 3: the generation prompt. */
    if (append_mark(p, TOK_IM_START) != 0 || append_str(p, "assistant\n") != 0)
        return append_failed(p, err, err_size);
    return 0;
}

/* Render a chat request with the chat template p->tpl (template.h). Returns 0 or a LOG_E*
 * code. */
static int render_template(oai_prompt *p, const json_t *body, char *err, size_t err_size)
{
    const json_t *messages = json_object_get(body, "messages");
    if (!json_is_array(messages))
        return fail(err, err_size, "messages must be an array of messages, not %s",
                    cli_json_type_name(messages));
    if (json_array_size(messages) == 0)
        return fail(err, err_size, "messages is empty: a chat request needs a message");
    int rc = p->tpl == TPL_JINJA
                 ? tpl_render_jinja(p->jinja, body, p->jinja_vars, NULL, !p->no_segments, p->limit,
                                    &p->tout, err, err_size)
                 : tpl_render(p->tpl, body, p->bos, p->eos, p->limit, &p->tout, err, err_size);
    if (rc == TPL_ENOMEM)
        return LOG_ENOMEM;
    if (rc != TPL_OK)
        return LOG_EINPUT;
    p->templated = true;
    return 0;
}

/* Render a completions prompt: text as is, or note the token-id array. Returns 0 or a
 * LOG_E* code. */
static int render_completions(oai_prompt *p, const json_t *body, char *err, size_t err_size)
{
    const json_t *prompt = json_object_get(body, "prompt");
    if (json_is_string(prompt)) {
        if (append_json_str(p, prompt) != 0)
            return append_failed(p, err, err_size);
        return 0;
    }
    if (!json_is_array(prompt))
        return fail(err, err_size, "prompt must be a string or an array of token ids, not %s",
                    cli_json_type_name(prompt));
    size_t n = json_array_size(prompt);
    if (n == 0)
        return fail(err, err_size, "prompt is empty: a request needs at least one prompt token");
    const json_t *first = json_array_get(prompt, 0);
    if (!json_is_string(first) && !json_is_array(first)) {
        p->token_ids = prompt; /* logread checks every element */
        p->token_key = "prompt";
        return 0;
    }
    if (n > 1)
        return fail(err, err_size,
                    "batched prompts are not supported: one request per line (prompt holds %zu "
                    "prompts)",
                    n);
    if (json_is_array(first)) {
        p->token_ids = first;
        p->token_key = "prompt[0]";
        return 0;
    }
    if (append_json_str(p, first) != 0)
        return append_failed(p, err, err_size);
    return 0;
}

static bool has_request_keys(const json_t *o)
{
    return json_object_get(o, "messages") != NULL || json_object_get(o, "prompt") != NULL;
}

bool oai_is_request(const json_t *o)
{
    if (!json_is_object(o))
        return false;
    if (has_request_keys(o))
        return true;
    const json_t *body = json_object_get(o, "body");
    return json_is_object(body) && has_request_keys(body);
}

int oai_render(const json_t *o, size_t limit, oai_prompt *p, char *err, size_t err_size)
{
    p->body = NULL;
    p->chat = false;
    p->token_ids = NULL;
    p->token_key = NULL;
    p->text_len = 0;
    if (p->text_cap > 0)
        p->text[0] = '\0';
    p->n_marks = 0;
    p->limit = limit;
    p->failure = FAIL_NONE;
    p->templated = false;

    const json_t *body = o;
    if (!has_request_keys(o)) {
        body = json_object_get(o, "body");
        if (!json_is_object(body) || !has_request_keys(body))
            return fail(err, err_size,
                        "not an OpenAI request: no \"messages\" or \"prompt\", at the top level "
                        "or in \"body\"");
        const json_t *url = json_object_get(o, "url");
        if (url != NULL) {
            if (!json_is_string(url))
                return fail(err, err_size, "url must be a string, not %s", cli_json_type_name(url));
            const char *u = json_string_value(url);
            bool chat_url = strcmp(u, "/v1/chat/completions") == 0;
            char q[440];
            if (!chat_url && strcmp(u, "/v1/completions") != 0)
                return fail(err, err_size,
                            "url \"%s\" is not supported: only /v1/chat/completions and "
                            "/v1/completions",
                            cli_quote_prefix(q, sizeof q, u, json_string_length(url), 100));
            const char *want = chat_url ? "messages" : "prompt";
            if (json_object_get(body, want) == NULL)
                return fail(err, err_size, "url %s needs \"%s\" in body", u, want);
        }
    }
    p->body = body;
    const json_t *messages = json_object_get(body, "messages");
    const json_t *prompt = json_object_get(body, "prompt");
    if (messages != NULL && prompt != NULL)
        return fail(err, err_size,
                    "a request has either \"messages\" (chat) or \"prompt\" (completions), not "
                    "both");
    p->chat = messages != NULL;
    if (p->chat && p->tpl != 0)
        return render_template(p, body, err, err_size);
    return p->chat ? render_chat(p, body, err, err_size)
                   : render_completions(p, body, err, err_size);
}

const char *oai_text(const oai_prompt *p, size_t *len)
{
    if (p->templated) {
        *len = p->tout.len;
        return p->tout.text;
    }
    *len = p->text_len;
    return p->text;
}

void oai_prompt_free(oai_prompt *p)
{
    if (p == NULL)
        return;
    free(p->text);
    free(p->marks);
    tpl_out_free(&p->tout);
    memset(p, 0, sizeof *p);
}
