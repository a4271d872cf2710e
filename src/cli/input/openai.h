/*
 * openai.h - rendering OpenAI request bodies to prompt text for the request-log reader
 * (logread.c calls it for lines in the OpenAI format; tokenize.h turns the text into tokens).
 *
 * Accepted lines:
 *
 *   a body          {"model": s, "messages": [...], ...}   (/v1/chat/completions)
 *                   {"model": s, "prompt": ..., ...}       (/v1/completions)
 *   a Batch API     {"custom_id": s, "method": "POST", "url": "/v1/chat/completions",
 *   input line       "body": {...}}
 *                   The request is "body". "url", when present, must be /v1/chat/completions
 *                   (body with "messages") or /v1/completions (body with "prompt").
 *
 * A body has "messages" or "prompt", not both.
 *
 * Completions. "prompt" is a string, rendered as is (no template, no markers); or an array
 * of integer token ids, used directly as the tokens (no tokenizer; the record's text is
 * NULL); or an array holding exactly one string or one token-id array, taken like those.
 * An array of several prompts is an error ("batched prompts are not supported: one request
 * per line"), as is an empty prompt.
 *
 * Chat. The prompt is rendered in this fixed ChatML-like layout (not the model's own chat
 * template, which the reader does not have); "\n" is one newline byte:
 *
 *   1. If the body has "tools" (an array; null or [] count as absent):
 *          "<|im_start|>tools\n" + TOOLS + "<|im_end|>\n"
 *      where TOOLS is the tools array as compact JSON (no spaces, keys in the given order).
 *   2. For each message of "messages" (a non-empty array of objects), in order:
 *          "<|im_start|>" + ROLE + "\n" + CONTENT + CALLS + "<|im_end|>\n"
 *      ROLE is the "role" string as given (any role is accepted). CONTENT is:
 *        - a string: the string;
 *        - null: nothing;
 *        - an array of parts: the parts concatenated with no separator, where
 *          {"type": "text", "text": s} gives s and a part of any other type T gives the
 *          placeholder "<T>" (e.g. "<image_url>", "<input_audio>");
 *        - missing: allowed only when the message has "tool_calls" (an assistant calling
 *          tools), and then nothing.
 *      CALLS is the message's "tool_calls" array as compact JSON when it is present and not
 *      null, else nothing; so an assistant message with null content and tool_calls renders
 *      as its tool calls. Other message fields (name, tool_call_id, ...) are not rendered.
 *   3. The generation prompt: "<|im_start|>assistant\n".
 *
 * With a chat template (oai_prompt.tpl, replay --template), a chat request is rendered by
 * template.h instead: the model's layout, no markers (the BPE tokenizer finds special tokens
 * by their text), and segments naming the message or tool each byte belongs to.
 *
 *   Example: {"messages": [{"role": "system", "content": "Be brief."},
 *                          {"role": "user", "content": "Hi"}]}
 *   renders as "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
 *              "<|im_start|>assistant\n".
 *
 * The "<|im_start|>" and "<|im_end|>" written by steps 1-3 are recorded as markers, which
 * the tokenizers turn into single reserved tokens; the same characters inside a message are
 * ordinary text.
 *
 * Namespace and lengths (read by logread.c from the body): "model" -> model; "user" ->
 * tenant, overridden by a "tenant" string (a kvprefix extension); "adapter" -> adapter (an
 * extension: vLLM selects a LoRA adapter by the model name, so model usually carries it);
 * "cache_salt" -> cache_salt (vLLM's field); output_length = "max_completion_tokens", else
 * "max_tokens", whichever first is a non-negative integer, else 0; "timestamp" (a number, an
 * extension) -> timestamp. For a Batch API line, "tenant" and "timestamp" in the outer object
 * take precedence over the body's.
 *
 * Strings are UTF-8: the JSON parser rejects invalid UTF-8 before rendering. Memory: the
 * text is bounded by the caller's limit (logread uses 8 times the line plus 4 KiB, and below
 * 4 GiB). Every byte of the text comes from a JSON string or compact JSON of the line, except
 * 24 bytes of markers and newlines per message (a message takes at least 24 bytes of JSON:
 * {"role":"","content":""}) and 22 bytes for the generation prompt; so only compact JSON of
 * tools and tool_calls can outgrow its source, where a number like 0.1 is written as
 * 0.10000000000000001 (at most about 5x).
 */
#ifndef CLI_OPENAI_H
#define CLI_OPENAI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "json_names.h"
#include "template.h"
#include "tokenize.h"

/* The rendered prompt of one request; zero it before first use, reuse it across lines, free
 * it with oai_prompt_free. */
typedef struct oai_prompt {
    const json_t *body;      /* the request body (the line, or its "body"); valid while the
                                line's JSON lives */
    bool chat;               /* a chat request ("messages") rather than completions */
    const json_t *token_ids; /* completions with a token-id prompt: that array (owned by the
                                line's JSON), the text is then empty; else NULL */
    const char *token_key;   /* name of token_ids for messages: "prompt" or "prompt[0]" */
    char *text;              /* rendered prompt, NUL-terminated when text_cap > 0 */
    size_t text_len;         /* bytes of text */
    size_t text_cap;         /* bytes allocated at text */
    tok_mark *marks;         /* template markers in text, ascending offsets */
    size_t n_marks;          /* number of markers */
    size_t marks_cap;        /* elements allocated at marks */
    size_t limit;            /* longest text allowed (set by oai_render) */
    int failure;             /* inside rendering: 0, or why an append failed */
    int tpl;                 /* chat template (TPL_*) for chat requests, 0 for the fixed
                                layout; set by the caller before oai_render */
    const char *bos;         /* bos_token and eos_token texts for tpl (the tokenizer's);
                                set by the caller, NULL for "" */
    const char *eos;
    const jinja_tmpl *jinja;  /* tpl TPL_JINJA: the model's template (owned by the caller) */
    const json_t *jinja_vars; /* tpl TPL_JINJA: bos_token, eos_token (caller's), or NULL */
    bool no_segments;         /* tpl TPL_JINJA: skip finding the segments (they cost a
                                 render per message and tool) */
    tpl_out tout;             /* the template's text and segments */
    bool templated;           /* the last oai_render rendered with tpl (text in tout) */
} oai_prompt;

/* Whether line object o is an OpenAI request: it has "messages" or "prompt", or its "body"
 * is an object that has one of them. Cannot fail. */
bool oai_is_request(const json_t *o);

/* Render the request in line object o (see above) into *p, allowing at most limit bytes of
 * text (limit < 2^32). Returns 0 on success; LOG_EINPUT when the request is malformed
 * or its text would exceed limit, with the message ("what is wrong", no file or line) in
 * err; LOG_ENOMEM when out of memory (message in err). After a failure *p holds partial
 * text but stays reusable and freeable. */
int oai_render(const json_t *o, size_t limit, oai_prompt *p, char *err, size_t err_size);

/* The text of the last rendering (the template's when p->templated), NUL-terminated, with
 * its length in *len; owned by p, valid until the next oai_render. Cannot fail. */
const char *oai_text(const oai_prompt *p, size_t *len);

/* Free what *p holds and zero it (tpl, bos and eos included). Accepts NULL. */
void oai_prompt_free(oai_prompt *p);

#endif /* CLI_OPENAI_H */
