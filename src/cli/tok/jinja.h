/*
 * jinja.h - a Jinja interpreter for the subset that chat templates use: the model's own
 * `chat_template` from tokenizer_config.json, rendered as Hugging Face transformers renders
 * it for vLLM (ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
 * loop-controls extension, `raise_exception`, `strftime_now` and a `tojson` that is
 * Python's json.dumps with ensure_ascii=False).
 *
 * The subset (docs/cli.md, "Chat templates", lists it with what is refused):
 *   statements  if / elif / else, for (tuple targets, `if` filter, else, loop.index,
 *               index0, revindex, revindex0, first, last, length, previtem, nextitem,
 *               cycle), break, continue, set (name, tuple, namespace attribute, block set),
 *               macro (positional and keyword parameters with defaults), raw, generation
 *               (transformers' assistant-mask tag: rendered as its body), comments,
 *               whitespace control (-, + and the two environment options)
 *   expressions literals (strings with Python escapes, integers, floats, lists, tuples,
 *               dicts, true/false/none in both cases), names, attributes, subscripts,
 *               slices, calls, filters, tests, `not and or`, comparisons, `in`, `not in`,
 *               `~ + - * / // % **`, `a if c else b`
 *   values      Python's: None, bool, int, float, str (indexed and measured in code
 *               points), list, dict (insertion order), plus undefined (jinja2's default:
 *               prints as "", false, empty when iterated, an error when its attribute is
 *               read), namespaces, macros. Printing uses Python's str(): True, None,
 *               ['a', 1], {'k': 'v'}.
 *   built-ins   the filters, tests and str/dict methods in jinja_lib.c's tables.
 *
 * Anything else (an unknown tag, filter, test, method or operator) is refused with the
 * template's line: "LINE: unknown filter 'wordwrap'". The interpreter is bounded: a
 * render stops with an error after `max_steps` evaluation steps, `max_output` bytes or
 * `max_depth` nested macro calls, so a hostile template costs bounded time and memory.
 *
 * Ownership: jinja_parse returns a template the caller frees with jinja_free; it keeps
 * no pointer to the source. jinja_render reads the context (not kept) and appends to a
 * caller's buffer (*out, grown with realloc; the caller frees it, also after an error).
 */
#ifndef CLI_JINJA_H
#define CLI_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct jinja_tmpl jinja_tmpl;

typedef struct jinja_limits {
    uint64_t max_steps; /* evaluation steps per render (default 50,000,000) */
    size_t max_output;  /* bytes of output (default 64 MiB) */
    uint32_t max_depth; /* nested macro calls (default 64) */
    const char *now;    /* strftime_now's time as "YYYY-MM-DD HH:MM:SS" (UTC), or NULL for
                           the current time; a fixed time makes renders reproducible */
} jinja_limits;

/* Parse template source src[0..n). Returns 0 and *out, or -1 with "LINE: what is wrong" in
 * err (nothing allocated). */
int jinja_parse(const char *src, size_t n, jinja_tmpl **out, char *err, size_t err_size);

/* Render t with the variables of ctx (a JSON object: messages, tools, bos_token, ...),
 * appending to *out (*len bytes used, *cap allocated; *out may be NULL with both 0).
 * lim may be NULL for the defaults. Returns 0, or -1 with "LINE: what is wrong" in err
 * (raise_exception's message included); *out then holds a partial render. */
int jinja_render(const jinja_tmpl *t, const json_t *ctx, const jinja_limits *lim, char **out,
                 size_t *len, size_t *cap, char *err, size_t err_size);

void jinja_free(jinja_tmpl *t);

#endif /* CLI_JINJA_H */
