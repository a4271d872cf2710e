/*
 * template.h - chat templates: an OpenAI /v1/chat/completions body rendered to the prompt
 * text a serving engine would build with the model's own template, for the BPE tokenizer
 * (bpe.h) to count. Each is written from the model's published Jinja template as Hugging
 * Face transformers renders it (and vLLM feeds it), for the inputs an OpenAI body carries:
 *
 *   llama3   Llama 3.1 / 3.2 / 3.3 Instruct (tokenizer_config.json of Llama-3.1-8B-Instruct):
 *            bos; a system header with "Cutting Knowledge Date: December 2023" and
 *            "Today Date: 26 Jul 2024" (the template's default date_string), then the
 *            system message (trimmed); "Environment: ipython" before the dates when the body
 *            has tools (an empty array counts); tools go into the FIRST USER message
 *            (tools_in_user_message, the default): an instruction paragraph, then each tool
 *            as tojson(indent=4) + "\n\n", then that message's text. Each message:
 *            <|start_header_id|>ROLE<|end_header_id|>\n\n TEXT(trimmed) <|eot_id|>; an
 *            assistant tool call (one per message) as {"name": "N", "parameters": ARGS};
 *            a tool result under the role "ipython", its text as a JSON string (the
 *            template's tojson of a string). Generation prompt: the assistant header.
 *   chatml   ChatML in the layout of Qwen2.5 Instruct: <|im_start|>ROLE\nTEXT<|im_end|>\n;
 *            with tools, the system turn carries the system message, then "# Tools" and
 *            each tool as tojson in <tools></tools>, then the <tool_call> instructions; an
 *            assistant's tool calls as <tool_call>\n{"name": "N", "arguments": ARGS}\n
 *            </tool_call>; consecutive tool results are one user turn of
 *            <tool_response>\nTEXT\n</tool_response>. Generation prompt:
 *            <|im_start|>assistant\n.
 *   qwen2.5  chatml plus Qwen2.5's default system message ("You are Qwen, created by
 *            Alibaba Cloud. You are a helpful assistant.") when the body has none.
 *   mistral  Mistral-7B-Instruct-v0.3: bos, then [INST] TEXT[/INST] per user message,
 *            " TEXT(trimmed)" + eos per assistant message; the system message is NOT at
 *            the start: it goes into the LAST user message ("[INST] SYSTEM\n\nTEXT[/INST]",
 *            and is dropped when the conversation does not end with a user message); tools
 *            as [AVAILABLE_TOOLS] [...][/AVAILABLE_TOOLS] just before the last user
 *            message; tool calls as [TOOL_CALLS] [...] + eos, results as [TOOL_RESULTS]
 *            {"content": TEXT, "call_id": "ID"}[/TOOL_RESULTS]. User and assistant messages
 *            must alternate (the template's check). No generation prompt (it ends with
 *            [/INST]).
 *
 * Tools are rendered as vLLM passes them (tpl_vllm_tools). The generation prompt follows the
 * body's add_generation_prompt (true when absent or null,
 * as vLLM defaults it).
 *
 * As vLLM prepares messages: content that is an array of parts becomes its text parts
 * joined by "\n" (other parts as "<TYPE>", where a multimodal model would put its own
 * placeholder); null content is ""; tool_calls count on assistant messages only; a tool
 * call's "arguments" string is parsed as JSON (kept as a string when it is not JSON); a
 * Mistral tool-call id longer than 9 characters keeps its last 9. JSON inside the prompt is
 * Python's json.dumps (pyjson.h). bos and eos are the tokenizer's texts (bpe_bos/bpe_eos;
 * "" when it has none), as a template's bos_token and eos_token are.
 *
 * These are checks beside the model's own template (TPL_JINJA, template_jinja.c), which
 * the Jinja interpreter runs; the qwen2.5 layout equals Qwen2.5's template on 36 bodies.
 * Not modelled here: arbitrary Jinja templates (only these layouts), Llama's builtin_tools and
 * custom date_string, Mistral's own tokenizers (SentencePiece, Tekken: with --template
 * mistral the control strings [INST] etc. are tokenized by the given tokenizer, as text
 * unless a sidecar declares them), multimodal placeholders, "name" fields of messages.
 *
 * Segments. While rendering, the text is cut into segments, each owned by one part of the
 * request: the template's preamble, message i (with its role), tool definition j, or the
 * generation prompt. Segments are contiguous and cover the text; a segment ends where the
 * next begins. replay --diagnose uses them to name where a shared prefix breaks.
 */
#ifndef CLI_TEMPLATE_H
#define CLI_TEMPLATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    TPL_LLAMA3 = 1,  /* Llama 3.1 Instruct */
    TPL_CHATML = 2,  /* ChatML, Qwen2.5's layout without its default system message */
    TPL_QWEN25 = 3,  /* ChatML with Qwen2.5's default system message */
    TPL_MISTRAL = 4, /* Mistral-7B-Instruct-v0.3 */
    TPL_JINJA = 5    /* the model's own chat template (tokenizer_config.json), run by the
                        Jinja interpreter: tpl_render_jinja, not tpl_render */
};

enum {
    TPL_OK = 0,
    TPL_EINPUT = -1, /* the body does not fit the template (message in err) */
    TPL_ENOMEM = -3  /* out of memory */
};

enum {
    TPL_SEG_PREAMBLE = 1, /* template text before or around the messages (bos, headers) */
    TPL_SEG_MESSAGE = 2,  /* message index of "messages" */
    TPL_SEG_TOOL = 3,     /* tool definition index of "tools" */
    TPL_SEG_GEN = 4       /* the generation prompt */
};

/* One segment of the rendered text. */
typedef struct tpl_seg {
    uint32_t offset; /* first byte in the text; the segment ends where the next begins */
    uint32_t index;  /* message or tool index (TPL_SEG_MESSAGE, TPL_SEG_TOOL), else 0 */
    int kind;        /* TPL_SEG_* */
    char role[16];   /* TPL_SEG_MESSAGE: the role for reports: cut at a character with "..."
                        when longer than 12 bytes, control characters as \xNN (escape.h);
                        else "" */
} tpl_seg;

/* A rendered prompt; zero it before first use, reuse it, free it with tpl_out_free. */
typedef struct tpl_out {
    char *text;         /* the prompt, NUL-terminated when cap > 0 */
    size_t len;         /* bytes of text */
    size_t cap;         /* bytes allocated at text */
    size_t limit;       /* longest text allowed (set by tpl_render) */
    tpl_seg *segs;      /* segments by ascending offset */
    size_t n_segs;      /* segments held */
    size_t segs_cap;    /* elements allocated at segs */
    char *scratch;      /* a message's text before trimming */
    size_t scratch_len; /* bytes used at scratch */
    size_t scratch_cap; /* bytes allocated at scratch */
    int failure;        /* inside rendering: 0, or why an append failed */
} tpl_out;

/* The template named name ("llama3", "chatml", "qwen2.5", "mistral"), or 0. Cannot fail. */
int tpl_from_name(const char *name);

/* Name of template tpl; "?" for anything else. Cannot fail. */
const char *tpl_name(int tpl);

/* Render chat body (an object with "messages", checked by the caller to be a non-empty
 * array) with template tpl into *out, allowing at most limit bytes (limit < 2^32); bos and
 * eos are the texts of bos_token and eos_token. Returns TPL_OK; TPL_EINPUT when the body
 * does not fit the template or the text would exceed limit (message, without file or line,
 * in err); TPL_ENOMEM. After a failure *out holds partial text but stays reusable. */
int tpl_render(int tpl, const json_t *body, const char *bos, const char *eos, size_t limit,
               tpl_out *out, char *err, size_t err_size);

/* The segment holding byte offset of the text (the last one when offset is past the end),
 * or NULL when there are none. Cannot fail. */
const tpl_seg *tpl_seg_at(const tpl_seg *segs, size_t n, uint32_t offset);

/* The tools as vLLM hands them to a template, through its pydantic model: each
 * {"type": "function", "function": {"name", "description", "parameters"}} in that order,
 * absent fields null, other fields dropped. tools: an array whose elements each have a
 * "function" with a string "name" (the caller checks). Returns a new array, or NULL when out
 * of memory. Both renderers use it, so the hand-written layouts and the model's own
 * template see the same tools. */
json_t *tpl_vllm_tools(const json_t *tools);

/* Free what *out holds and zero it. Accepts NULL. */
void tpl_out_free(tpl_out *out);

/* Render chat body with the model's own Jinja chat template t (template_jinja.c: the
 * context vLLM builds; extra holds bos_token, eos_token and the other special tokens of
 * tokenizer_config.json, or NULL), allowing at most limit bytes, into *out; the segments
 * only when segments is true (one more render per message and tool). now fixes the time
 * strftime_now reads ("YYYY-MM-DD HH:MM:SS", UTC), NULL for the current time. Returns TPL_OK;
 * TPL_EINPUT when the body does not fit or the template fails or raises (its message and
 * line in err); TPL_ENOMEM. */
typedef struct jinja_tmpl jinja_tmpl;
int tpl_render_jinja(const jinja_tmpl *t, const json_t *body, const json_t *extra, const char *now,
                     bool segments, size_t limit, tpl_out *out, char *err, size_t err_size);

#endif /* CLI_TEMPLATE_H */
