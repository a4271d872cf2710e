/*
 * template.c - the chat templates of template.h, each a function that walks the body the
 * way the model's Jinja template walks its messages and appends the same text.
 *
 * Layout. One growable text buffer with a limit (as openai.c's fixed layout has), the
 * segments beside it, and a scratch buffer where a message's text is assembled (its parts
 * joined) before it is trimmed and appended. Every append goes through app(), which
 * records an over-limit or out-of-memory failure in out->failure and turns every later
 * append into a no-op, so a renderer appends freely and tpl_render reports the failure
 * once at the end. Input errors (a role the template refuses, two tool calls where Llama
 * takes one) return TPL_EINPUT at once with the message.
 *
 * Invariants: len <= limit < 2^32; text[len] is NUL when cap > 0; segment offsets ascend
 * and are <= len. Cost: O(body) plus, for tool calls, one JSON parse of each "arguments".
 */
#include "template.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "escape.h"
#include "pyjson.h"

enum {
    FAIL_NONE = 0, /* no append failed */
    FAIL_LIMIT,    /* the text would exceed the limit */
    FAIL_NOMEM     /* out of memory */
};

/* The state of one rendering. */
typedef struct rnd {
    tpl_out *o;          /* the output */
    const json_t *msgs;  /* "messages" */
    size_t n;            /* messages */
    const json_t *tools; /* "tools" when it is an array, else NULL */
    size_t n_tools;      /* elements of tools */
    const char *bos;     /* bos_token text */
    const char *eos;     /* eos_token text */
    char *err;           /* message buffer */
    size_t err_size;     /* its size */
    bool gen;            /* add the generation prompt (the body's add_generation_prompt,
                            true when absent or null, as vLLM defaults it) */
} rnd;

int tpl_from_name(const char *name)
{
    static const struct {
        const char *name;
        int tpl;
    } names[] = {{"llama3", TPL_LLAMA3},
                 {"chatml", TPL_CHATML},
                 {"qwen2.5", TPL_QWEN25},
                 {"mistral", TPL_MISTRAL},
                 {"model", TPL_JINJA}};
    for (size_t i = 0; name != NULL && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].name) == 0)
            return names[i].tpl;
    return 0;
}

const char *tpl_name(int tpl)
{
    switch (tpl) {
    case TPL_LLAMA3:
        return "llama3";
    case TPL_CHATML:
        return "chatml";
    case TPL_QWEN25:
        return "qwen2.5";
    case TPL_MISTRAL:
        return "mistral";
    case TPL_JINJA:
        return "model";
    default:
        return "?";
    }
}

static int fail(rnd *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Format the message into r->err and return TPL_EINPUT. */
static int fail(rnd *r, const char *fmt, ...)
{
    if (r->err != NULL && r->err_size > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err, r->err_size, fmt, ap);
        va_end(ap);
    }
    return TPL_EINPUT;
}

/* ---- appending ------------------------------------------------------------------------ */

/* Append s[0, n) to the text; on failure set o->failure (the text unchanged). Returns 0 or
 * -1 (also once any earlier append failed). */
static int app(tpl_out *o, const char *s, size_t n)
{
    if (o->failure != FAIL_NONE)
        return -1;
    if (n > o->limit - o->len) {
        o->failure = FAIL_LIMIT;
        return -1;
    }
    if (!cli_grow((void **)&o->text, &o->cap, o->len + n + 1, 1)) {
        o->failure = FAIL_NOMEM;
        return -1;
    }
    memcpy(o->text + o->len, s, n);
    o->len += n;
    o->text[o->len] = '\0';
    return 0;
}

static int app_s(tpl_out *o, const char *s)
{
    return app(o, s, strlen(s));
}

static int app_cb(void *ctx, const char *s, size_t n)
{
    return app(ctx, s, n);
}

/* Append v as Python's json.dumps (indent < 0: none). */
static int app_json(tpl_out *o, const json_t *v, int indent)
{
    return pyjson_dump(v, indent, app_cb, o);
}

/* Start a segment at the current end of the text (replacing an empty one there). */
static void seg(tpl_out *o, int kind, size_t index, const char *role)
{
    if (o->failure != FAIL_NONE)
        return;
    tpl_seg *last = o->n_segs > 0 ? &o->segs[o->n_segs - 1] : NULL;
    if (last == NULL || last->offset != o->len) {
        if (!cli_grow((void **)&o->segs, &o->segs_cap, o->n_segs + 1, sizeof *o->segs)) {
            o->failure = FAIL_NOMEM;
            return;
        }
        last = &o->segs[o->n_segs++];
    }
    last->offset = (uint32_t)o->len;
    last->index = (uint32_t)index;
    last->kind = kind;
    role = role ? role : "";
    cli_quote_prefix(last->role, sizeof last->role, role, strlen(role), sizeof last->role - 1);
}

/* ---- messages ------------------------------------------------------------------------- */

static const char *role_of(const rnd *r, size_t i)
{
    return json_string_value(json_object_get(json_array_get(r->msgs, i), "role"));
}

static bool role_is(const rnd *r, size_t i, const char *role)
{
    return i < r->n && strcmp(role_of(r, i), role) == 0;
}

/* The tool_calls array of message i when it is an assistant's and not null, else NULL. */
static const json_t *calls_of(const rnd *r, size_t i)
{
    const json_t *c = json_object_get(json_array_get(r->msgs, i), "tool_calls");
    return json_is_array(c) && role_is(r, i, "assistant") ? c : NULL;
}

static int scratch_add(tpl_out *o, const char *s, size_t n)
{
    if (!cli_grow((void **)&o->scratch, &o->scratch_cap, o->scratch_len + n + 1, 1)) {
        o->failure = FAIL_NOMEM;
        return -1;
    }
    memcpy(o->scratch + o->scratch_len, s, n);
    o->scratch_len += n;
    o->scratch[o->scratch_len] = '\0';
    return 0;
}

/* Assemble message i's text into o->scratch (string; parts joined by "\n"; null: "").
 * Returns 0 or -1 (out of memory, o->failure set). */
static int text_of(rnd *r, size_t i)
{
    tpl_out *o = r->o;
    o->scratch_len = 0;
    if (scratch_add(o, "", 0) != 0)
        return -1;
    const json_t *c = json_object_get(json_array_get(r->msgs, i), "content");
    if (json_is_string(c))
        return scratch_add(o, json_string_value(c), json_string_length(c));
    for (size_t k = 0; k < json_array_size(c); k++) {
        const json_t *part = json_array_get(c, k);
        const json_t *type = json_object_get(part, "type");
        const json_t *text = json_object_get(part, "text");
        int rc = k > 0 ? scratch_add(o, "\n", 1) : 0;
        if (strcmp(json_string_value(type), "text") == 0)
            rc = rc ? rc : scratch_add(o, json_string_value(text), json_string_length(text));
        else if (rc == 0 &&
                 (scratch_add(o, "<", 1) != 0 ||
                  scratch_add(o, json_string_value(type), json_string_length(type)) != 0 ||
                  scratch_add(o, ">", 1) != 0))
            rc = -1;
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* Length of the Python whitespace character at s[0, n) (str.isspace), or 0. */
static size_t py_space(const unsigned char *s, size_t n)
{
    if (s[0] == ' ' || (s[0] >= '\t' && s[0] <= '\r') || (s[0] >= 0x1c && s[0] <= 0x1f))
        return 1;
    if (n >= 2 && s[0] == 0xC2 && (s[1] == 0x85 || s[1] == 0xA0))
        return 2;
    if (n >= 3 && s[0] == 0xE1 && s[1] == 0x9A && s[2] == 0x80)
        return 3; /* U+1680 */
    if (n >= 3 && s[0] == 0xE2 && s[1] == 0x80 &&
        (s[2] <= 0x8A || s[2] == 0xA8 || s[2] == 0xA9 || s[2] == 0xAF))
        return 3; /* U+2000..200A, 2028, 2029, 202F */
    if (n >= 3 && s[0] == 0xE2 && s[1] == 0x81 && s[2] == 0x9F)
        return 3; /* U+205F */
    if (n >= 3 && s[0] == 0xE3 && s[1] == 0x80 && s[2] == 0x80)
        return 3; /* U+3000 */
    return 0;
}

/* Append the scratch text, trimmed of Python whitespace at both ends when trim is set. */
static int app_text(tpl_out *o, bool trim)
{
    const unsigned char *s = (const unsigned char *)o->scratch;
    size_t a = 0, b = o->scratch_len;
    while (trim && a < b) {
        size_t k = py_space(s + a, b - a);
        if (k == 0)
            break;
        a += k;
    }
    while (trim && b > a) {
        size_t k = 0;
        for (size_t back = 1; back <= 3 && back <= b - a && k == 0; back++)
            if (py_space(s + b - back, back) == back)
                k = back;
        if (k == 0)
            break;
        b -= k;
    }
    return app(o, o->scratch + a, b - a);
}

/* Append message i's text (trimmed when trim). */
static int app_msg(rnd *r, size_t i, bool trim)
{
    return text_of(r, i) != 0 ? -1 : app_text(r->o, trim);
}

/* The "function" object of tool call k, or NULL. */
static const json_t *call_function(const json_t *calls, size_t k)
{
    const json_t *f = json_object_get(json_array_get(calls, k), "function");
    return json_is_object(f) ? f : NULL;
}

/* A new reference to the call's arguments as vLLM hands them to templates: the "arguments"
 * string parsed as JSON, else the value as given (null when missing). NULL: no memory. */
static json_t *call_args(const json_t *function)
{
    const json_t *a = json_object_get(function, "arguments");
    if (json_is_string(a)) {
        json_t *v = json_loadb(json_string_value(a), json_string_length(a),
                               JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
        if (v != NULL)
            return v;
    }
    return a != NULL ? json_incref((json_t *)a) : json_null();
}

/* Check message i and its tool calls as every template needs them. Returns 0 or
 * TPL_EINPUT. */
static int check_message(rnd *r, size_t i)
{
    const json_t *m = json_array_get(r->msgs, i);
    const json_t *role = json_object_get(m, "role"), *c = json_object_get(m, "content");
    if (!json_is_object(m) || !json_is_string(role))
        return fail(r, "messages[%zu] must be an object with a string \"role\"", i);
    if (c != NULL && !json_is_string(c) && !json_is_array(c) && !json_is_null(c))
        return fail(r, "messages[%zu].content must be a string, an array of parts or null", i);
    for (size_t k = 0; k < json_array_size(c); k++) {
        const json_t *part = json_array_get(c, k), *type = json_object_get(part, "type");
        if (!json_is_string(type))
            return fail(r, "messages[%zu].content[%zu] must be an object with a string \"type\"", i,
                        k);
        if (strcmp(json_string_value(type), "text") == 0 &&
            !json_is_string(json_object_get(part, "text")))
            return fail(r, "messages[%zu].content[%zu].text must be a string", i, k);
    }
    const json_t *calls = json_object_get(m, "tool_calls");
    if (calls != NULL && !json_is_null(calls) && !json_is_array(calls))
        return fail(r, "messages[%zu].tool_calls must be an array", i);
    for (size_t k = 0; calls_of(r, i) != NULL && k < json_array_size(calls); k++) {
        const json_t *f = call_function(calls, k);
        if (f == NULL || !json_is_string(json_object_get(f, "name")))
            return fail(r, "messages[%zu].tool_calls[%zu] needs a \"function\" with a \"name\"", i,
                        k);
    }
    return 0;
}

/* ---- llama3 --------------------------------------------------------------------------- */

#define L3_HEADER(role) "<|start_header_id|>" role "<|end_header_id|>\n\n"
#define L3_EOT          "<|eot_id|>"

static void l3_header(tpl_out *o, const char *role)
{
    app_s(o, "<|start_header_id|>");
    app_s(o, role);
    app_s(o, "<|end_header_id|>\n\n");
}

/* The system turn (and bos). Returns the index of the first message after it. */
static size_t l3_system(rnd *r)
{
    tpl_out *o = r->o;
    bool sys = role_is(r, 0, "system");
    seg(o, TPL_SEG_PREAMBLE, 0, NULL);
    app_s(o, r->bos);
    if (sys)
        seg(o, TPL_SEG_MESSAGE, 0, "system");
    app_s(o, L3_HEADER("system"));
    if (r->tools != NULL)
        app_s(o, "Environment: ipython\n");
    app_s(o, "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
    if (sys)
        app_msg(r, 0, true);
    app_s(o, L3_EOT);
    return sys ? 1 : 0;
}

/* The tools, in the first message after the system message (i). */
static int l3_tools(rnd *r, size_t i)
{
    tpl_out *o = r->o;
    if (i >= r->n)
        return fail(r, "the llama3 template puts tools in the first user message, and there is "
                       "none");
    seg(o, TPL_SEG_MESSAGE, i, role_of(r, i));
    app_s(o, L3_HEADER("user"));
    app_s(o, "Given the following functions, please respond with a JSON for a function call "
             "with its proper arguments that best answers the given prompt.\n\n"
             "Respond in the format {\"name\": function name, \"parameters\": dictionary of "
             "argument name and its value}.Do not use variables.\n\n");
    for (size_t j = 0; j < r->n_tools; j++) {
        seg(o, TPL_SEG_TOOL, j, NULL);
        app_json(o, json_array_get(r->tools, j), 4);
        app_s(o, "\n\n");
    }
    seg(o, TPL_SEG_MESSAGE, i, role_of(r, i));
    app_msg(r, i, true);
    app_s(o, L3_EOT);
    return 0;
}

/* An assistant's tool call (exactly one) as {"name": "N", "parameters": ARGS}. */
static int l3_call(rnd *r, size_t i, const json_t *calls)
{
    tpl_out *o = r->o;
    if (json_array_size(calls) != 1)
        return fail(r,
                    "messages[%zu] has %zu tool calls: the llama3 template takes one per "
                    "message",
                    i, json_array_size(calls));
    const json_t *f = call_function(calls, 0);
    json_t *args = call_args(f);
    if (args == NULL) {
        o->failure = FAIL_NOMEM;
        return 0;
    }
    app_s(o, L3_HEADER("assistant"));
    app_s(o, "{\"name\": \"");
    app_s(o, json_string_value(json_object_get(f, "name")));
    app_s(o, "\", \"parameters\": ");
    app_json(o, args, -1);
    app_s(o, "}" L3_EOT);
    json_decref(args);
    return 0;
}

static int render_llama3(rnd *r)
{
    tpl_out *o = r->o;
    size_t i = l3_system(r);
    if (r->tools != NULL) {
        int rc = l3_tools(r, i);
        if (rc != 0)
            return rc;
        i++;
    }
    for (; i < r->n; i++) {
        const char *role = role_of(r, i);
        const json_t *calls = calls_of(r, i);
        seg(o, TPL_SEG_MESSAGE, i, role);
        if (calls != NULL) {
            int rc = l3_call(r, i, calls);
            if (rc != 0)
                return rc;
        } else if (strcmp(role, "tool") == 0 || strcmp(role, "ipython") == 0) {
            app_s(o, L3_HEADER("ipython"));
            if (text_of(r, i) == 0) {
                json_t *s = json_stringn(o->scratch, o->scratch_len);
                if (s == NULL)
                    o->failure = FAIL_NOMEM;
                app_json(o, s, -1);
                json_decref(s);
            }
            app_s(o, L3_EOT);
        } else {
            l3_header(o, role);
            app_msg(r, i, true);
            app_s(o, L3_EOT);
        }
    }
    if (r->gen) {
        seg(o, TPL_SEG_GEN, 0, NULL);
        app_s(o, L3_HEADER("assistant"));
    }
    return 0;
}

/* ---- chatml / qwen2.5 ----------------------------------------------------------------- */

#define QWEN_SYSTEM "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
#define QWEN_TOOLS_HEAD                                                                            \
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are " \
    "provided with function signatures within <tools></tools> XML tags:\n<tools>"
#define QWEN_TOOLS_TAIL                                                                            \
    "\n</tools>\n\nFor each function call, return a json object with function name and "           \
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "                 \
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"

/* The system turn: with tools, or the system message, or Qwen's default. */
static void chatml_system(rnd *r, bool qwen)
{
    tpl_out *o = r->o;
    bool sys = role_is(r, 0, "system");
    if (sys)
        seg(o, TPL_SEG_MESSAGE, 0, "system");
    else
        seg(o, TPL_SEG_PREAMBLE, 0, NULL);
    if (r->n_tools > 0) {
        app_s(o, "<|im_start|>system\n");
        if (sys)
            app_msg(r, 0, false);
        else if (qwen)
            app_s(o, QWEN_SYSTEM);
        app_s(o, QWEN_TOOLS_HEAD);
        for (size_t j = 0; j < r->n_tools; j++) {
            seg(o, TPL_SEG_TOOL, j, NULL);
            app_s(o, "\n");
            app_json(o, json_array_get(r->tools, j), -1);
        }
        if (sys)
            seg(o, TPL_SEG_MESSAGE, 0, "system");
        else
            seg(o, TPL_SEG_PREAMBLE, 0, NULL);
        app_s(o, QWEN_TOOLS_TAIL);
    } else if (sys) {
        app_s(o, "<|im_start|>system\n");
        app_msg(r, 0, false);
        app_s(o, "<|im_end|>\n");
    } else if (qwen) {
        app_s(o, "<|im_start|>system\n" QWEN_SYSTEM "<|im_end|>\n");
    }
}

/* An assistant message with tool calls. */
static void chatml_calls(rnd *r, size_t i, const json_t *calls)
{
    tpl_out *o = r->o;
    app_s(o, "<|im_start|>assistant");
    if (text_of(r, i) == 0 && o->scratch_len > 0) {
        app_s(o, "\n");
        app_text(o, false);
    }
    for (size_t k = 0; k < json_array_size(calls); k++) {
        const json_t *f = call_function(calls, k);
        json_t *args = call_args(f);
        if (args == NULL) {
            o->failure = FAIL_NOMEM;
            return;
        }
        app_s(o, "\n<tool_call>\n{\"name\": \"");
        app_s(o, json_string_value(json_object_get(f, "name")));
        app_s(o, "\", \"arguments\": ");
        app_json(o, args, -1);
        app_s(o, "}\n</tool_call>");
        json_decref(args);
    }
    app_s(o, "<|im_end|>\n");
}

static int render_chatml(rnd *r, bool qwen)
{
    tpl_out *o = r->o;
    chatml_system(r, qwen);
    for (size_t i = role_is(r, 0, "system") ? 1 : 0; i < r->n; i++) {
        const char *role = role_of(r, i);
        const json_t *calls = calls_of(r, i);
        seg(o, TPL_SEG_MESSAGE, i, role);
        if (calls != NULL && json_array_size(calls) > 0) {
            chatml_calls(r, i, calls);
        } else if (strcmp(role, "tool") == 0) {
            if (i == 0 || !role_is(r, i - 1, "tool"))
                app_s(o, "<|im_start|>user");
            app_s(o, "\n<tool_response>\n");
            app_msg(r, i, false);
            app_s(o, "\n</tool_response>");
            if (i + 1 == r->n || !role_is(r, i + 1, "tool"))
                app_s(o, "<|im_end|>\n");
        } else {
            app_s(o, "<|im_start|>");
            app_s(o, role);
            app_s(o, "\n");
            app_msg(r, i, false);
            app_s(o, "<|im_end|>\n");
        }
    }
    if (r->gen) {
        seg(o, TPL_SEG_GEN, 0, NULL);
        app_s(o, "<|im_start|>assistant\n");
    }
    return 0;
}

/* ---- mistral -------------------------------------------------------------------------- */

static bool is_tool_role(const rnd *r, size_t i)
{
    return role_is(r, i, "tool") || role_is(r, i, "tool_results");
}

/* The template's checks: roles alternate user/assistant after the optional system message
 * (tool results and tool calls aside), and only those roles appear. */
static int mistral_check(rnd *r, size_t first)
{
    size_t k = 0;
    for (size_t i = first; i < r->n; i++) {
        bool user = role_is(r, i, "user");
        if (!user && !role_is(r, i, "assistant") && !is_tool_role(r, i)) {
            char q[200];
            const char *role = role_of(r, i);
            return fail(r,
                        "messages[%zu]: the mistral template takes user, assistant and tool "
                        "messages after one optional system message, not \"%s\"",
                        i, cli_quote_prefix(q, sizeof q, role, strlen(role), 40));
        }
        if (is_tool_role(r, i) || calls_of(r, i) != NULL)
            continue;
        if (user != (k % 2 == 0))
            return fail(r,
                        "messages[%zu]: the mistral template needs user and assistant "
                        "messages to alternate",
                        i);
        k++;
    }
    return 0;
}

/* The [AVAILABLE_TOOLS] block: each tool's "function" keys except "return"; strings are
 * written raw between quotes, other values as tojson. */
static void mistral_tools(rnd *r)
{
    tpl_out *o = r->o;
    app_s(o, "[AVAILABLE_TOOLS] [");
    for (size_t j = 0; j < r->n_tools; j++) {
        seg(o, TPL_SEG_TOOL, j, NULL);
        app_s(o, "{\"type\": \"function\", \"function\": {");
        const json_t *f = json_object_get(json_array_get(r->tools, j), "function");
        const char *key;
        const json_t *val;
        size_t k = 0;
        json_object_foreach((json_t *)f, key, val)
        {
            if (strcmp(key, "return") == 0)
                continue;
            app_s(o, k++ > 0 ? ", \"" : "\"");
            app_s(o, key);
            app_s(o, "\": ");
            if (json_is_string(val)) {
                app_s(o, "\"");
                app(o, json_string_value(val), json_string_length(val));
                app_s(o, "\"");
            } else {
                app_json(o, val, -1);
            }
        }
        app_s(o, j + 1 < r->n_tools ? "}}, " : "}}]");
    }
}

/* Characters (code points) of JSON string id: the bytes that do not continue a UTF-8
 * sequence (jansson holds valid UTF-8). Cannot fail. */
static size_t id_chars(const json_t *id)
{
    const unsigned char *s = (const unsigned char *)json_string_value(id);
    size_t n = 0;
    for (size_t i = 0; i < json_string_length(id); i++)
        n += (s[i] & 0xC0) != 0x80;
    return n;
}

/* Append Python's id[-9:]: the last 9 characters of id (which has at least 9), not its
 * last 9 bytes, which could cut a character in two. */
static void app_id9(tpl_out *o, const json_t *id)
{
    const char *s = json_string_value(id);
    size_t at = json_string_length(id), left = 9;
    while (left > 0 && at > 0)
        left -= ((unsigned char)s[--at] & 0xC0) != 0x80;
    app(o, s + at, json_string_length(id) - at);
}

/* [TOOL_CALLS] [...] + eos: each call's function (arguments parsed) as tojson without its
 * closing brace, then its id (the last 9 characters). */
static int mistral_calls(rnd *r, size_t i, const json_t *calls)
{
    tpl_out *o = r->o;
    app_s(o, "[TOOL_CALLS] [");
    for (size_t k = 0; k < json_array_size(calls); k++) {
        const json_t *id = json_object_get(json_array_get(calls, k), "id");
        if (!json_is_string(id) || id_chars(id) < 9)
            return fail(r,
                        "messages[%zu].tool_calls[%zu].id: the mistral template needs an id "
                        "of at least 9 characters",
                        i, k);
        json_t *f = json_deep_copy(call_function(calls, k));
        json_t *args = f ? call_args(f) : NULL;
        if (args == NULL || json_object_set_new(f, "arguments", args) != 0) {
            json_decref(f);
            o->failure = FAIL_NOMEM;
            return 0;
        }
        size_t at = o->len;
        app_json(o, f, -1);
        json_decref(f);
        if (o->failure == FAIL_NONE && o->len > at)
            o->text[--o->len] = '\0'; /* the closing brace */
        app_s(o, ", \"id\": \"");
        app_id9(o, id);
        app_s(o, "\"}");
        app_s(o, k + 1 < json_array_size(calls) ? ", " : "]");
    }
    if (json_array_size(calls) > 0)
        app_s(o, r->eos);
    return 0;
}

/* A tool result. */
static int mistral_result(rnd *r, size_t i)
{
    tpl_out *o = r->o;
    const json_t *id = json_object_get(json_array_get(r->msgs, i), "tool_call_id");
    if (!json_is_string(id) || id_chars(id) < 9)
        return fail(r,
                    "messages[%zu].tool_call_id: the mistral template needs an id of at "
                    "least 9 characters",
                    i);
    app_s(o, "[TOOL_RESULTS] {\"content\": ");
    app_msg(r, i, false);
    app_s(o, ", \"call_id\": \"");
    app_id9(o, id);
    app_s(o, "\"}[/TOOL_RESULTS]");
    return 0;
}

/* A user message (with the tools and the system message where the template puts them). */
static void mistral_user(rnd *r, size_t i, size_t last_user, bool sys)
{
    tpl_out *o = r->o;
    if (r->tools != NULL && i == last_user) {
        mistral_tools(r);
        seg(o, TPL_SEG_MESSAGE, i, "user");
        app_s(o, "[/AVAILABLE_TOOLS]");
    }
    app_s(o, "[INST] ");
    if (sys && i + 1 == r->n) {
        seg(o, TPL_SEG_MESSAGE, 0, "system");
        app_msg(r, 0, false);
        app_s(o, "\n\n");
        seg(o, TPL_SEG_MESSAGE, i, "user");
    }
    app_msg(r, i, false);
    app_s(o, "[/INST]");
}

static int render_mistral(rnd *r)
{
    tpl_out *o = r->o;
    bool sys = role_is(r, 0, "system");
    size_t first = sys ? 1 : 0, last_user = r->n;
    int rc = mistral_check(r, first);
    for (size_t i = first; i < r->n; i++)
        if (role_is(r, i, "user"))
            last_user = i;
    seg(o, TPL_SEG_PREAMBLE, 0, NULL);
    app_s(o, r->bos);
    for (size_t i = first; rc == 0 && i < r->n; i++) {
        const json_t *calls = calls_of(r, i);
        seg(o, TPL_SEG_MESSAGE, i, role_of(r, i));
        if (role_is(r, i, "user")) {
            mistral_user(r, i, last_user, sys);
        } else if (calls != NULL) {
            rc = mistral_calls(r, i, calls);
        } else if (is_tool_role(r, i)) {
            rc = mistral_result(r, i);
        } else {
            app_s(o, " ");
            app_msg(r, i, true);
            app_s(o, r->eos);
        }
    }
    return rc;
}

/* ---- entry points --------------------------------------------------------------------- */

json_t *tpl_vllm_tools(const json_t *tools)
{
    json_t *r = json_array();
    for (size_t j = 0; r && j < json_array_size(tools); j++) {
        const json_t *f = json_object_get(json_array_get(tools, j), "function");
        const json_t *d = json_object_get(f, "description"), *p = json_object_get(f, "parameters");
        json_t *t = json_pack("{s:s, s:{s:O, s:O, s:O}}", "type", "function", "function", "name",
                              json_object_get(f, "name"), "description", d ? d : json_null(),
                              "parameters", p ? p : json_null());
        if (!t || json_array_append_new(r, t) < 0) {
            json_decref(r);
            r = NULL;
        }
    }
    return r;
}

int tpl_render(int tpl, const json_t *body, const char *bos, const char *eos, size_t limit,
               tpl_out *out, char *err, size_t err_size)
{
    out->len = 0;
    if (out->cap > 0)
        out->text[0] = '\0';
    out->n_segs = 0;
    out->limit = limit;
    out->failure = FAIL_NONE;
    rnd r = {out,
             json_object_get(body, "messages"),
             0,
             NULL,
             0,
             bos ? bos : "",
             eos ? eos : "",
             err,
             err_size,
             true};
    r.n = json_array_size(r.msgs);
    const json_t *agp = json_object_get(body, "add_generation_prompt");
    r.gen = agp == NULL || json_is_null(agp) || json_is_true(agp);
    const json_t *tools = json_object_get(body, "tools");
    if (tools != NULL && !json_is_null(tools) && !json_is_array(tools))
        return fail(&r, "tools must be an array");
    json_t *norm = NULL;
    if (json_is_array(tools)) {
        for (size_t j = 0; j < json_array_size(tools); j++)
            if (!json_is_string(
                    json_object_get(json_object_get(json_array_get(tools, j), "function"), "name")))
                return fail(&r, "tools[%zu] needs a \"function\" with a \"name\"", j);
        norm = tpl_vllm_tools(tools);
        if (!norm) {
            fail(&r, "out of memory");
            return TPL_ENOMEM;
        }
    }
    r.tools = norm;
    r.n_tools = json_array_size(norm);
    int rc = TPL_OK;
    for (size_t i = 0; i < r.n && rc == TPL_OK; i++)
        rc = check_message(&r, i);
    switch (rc == TPL_OK ? tpl : -1) {
    case -1:
        break;
    case TPL_LLAMA3:
        rc = render_llama3(&r);
        break;
    case TPL_CHATML:
    case TPL_QWEN25:
        rc = render_chatml(&r, tpl == TPL_QWEN25);
        break;
    case TPL_MISTRAL:
        rc = render_mistral(&r);
        break;
    default:
        rc = fail(&r, "unknown chat template %d", tpl);
    }
    json_decref(norm);
    if (rc != TPL_OK)
        return rc;
    if (out->failure == FAIL_LIMIT)
        return fail(&r, "the rendered prompt would exceed %zu bytes (8 times the line plus 4 KiB)",
                    limit);
    if (out->failure == FAIL_NOMEM) {
        fail(&r, "out of memory rendering a prompt of %zu bytes", out->len);
        return TPL_ENOMEM;
    }
    return TPL_OK;
}

const tpl_seg *tpl_seg_at(const tpl_seg *segs, size_t n, uint32_t offset)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (segs[mid].offset <= offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 ? &segs[lo - 1] : n > 0 ? &segs[0] : NULL;
}

void tpl_out_free(tpl_out *out)
{
    if (out == NULL)
        return;
    free(out->text);
    free(out->segs);
    free(out->scratch);
    memset(out, 0, sizeof *out);
}
