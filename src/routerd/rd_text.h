/*
 * rd_text.h - prompts as text for `kvprefix router` (rd_text.c): the table of tokenizers
 * the daemon loaded at start (--tokenizer [MODEL=]PATH, --template [MODEL=]NAME) and the
 * step that turns a /score request in text mode ({"prompt": S} or {"messages": [...]},
 * rd_req.h) into token ids, exactly as `kvprefix replay --tokenizer PATH --template NAME`
 * does for the same OpenAI body: the tool's own layers do it (input/inopts.h loads the
 * tokenizer and picks the template, input/openai.h renders the body, tok/bpe.h encodes the
 * text with special tokens on), nothing here re-implements them.
 *
 * A model's tokenizer is the --tokenizer given for MODEL=, else the one given without
 * MODEL= (the default for every model); its template the --template for MODEL=, else the
 * one without MODEL=, else what in_template_for picks for the tokenizer (llama3 for a
 * Llama 3 tokenizer, chatml otherwise). A request names its model with "model" (absent:
 * the default tokenizer).
 *
 * Threads: the table is written at start only, then read by the HTTP threads. A bpe
 * tokenizer keeps scratch state (tok/bpe.h: not safe from two threads at once), so each
 * loaded tokenizer has a mutex held while a request renders and encodes with it; the
 * rendered text and ids are the connection's own (rd_text_scratch).
 */
#ifndef CLI_RD_TEXT_H
#define CLI_RD_TEXT_H

#include <stdbool.h>
#include <stddef.h>

#include "rd_req.h"

typedef struct rd_text rd_text;
typedef struct rd_text_scratch rd_text_scratch;

/* A new empty table into *out. Returns 0, non-zero when out of memory. */
int rd_text_new(rd_text **out);

/* --tokenizer [MODEL=]SPEC (SPEC as replay's --tokenizer: a tokenizer file; words and bytes
 * are refused, being approximate). The argument is split at its first '=', unless it names
 * an existing file or folder as a whole (a path with '=' in it). Returns 0 or an exit status after
 * "kvprefix router:
 * --tokenizer: ..." (a model given twice, a stand-in). Nothing is loaded yet. */
int rd_text_tokenizer(rd_text *t, const char *arg);

/* --template [MODEL=]NAME (a name replay's --template accepts). Returns 0 or an exit status
 * after the message. */
int rd_text_template(rd_text *t, const char *arg);

/* Load every tokenizer (in_load), after all flags. Returns 0 or an exit status after
 * "kvprefix router: --tokenizer: FILE: what is wrong" (CLI_EXIT_INPUT), or a --template for
 * a model without a tokenizer (CLI_EXIT_USAGE). Logs one line per tokenizer. */
int rd_text_load(rd_text *t);

/* Whether any tokenizer was given. Accepts NULL. Cannot fail. */
bool rd_text_enabled(const rd_text *t);

/* Render and tokenize the text members of q (rd_req_finish returned RD_REQ_DONE with
 * q->text) for the model q names, into q's token array (rd_req_set_tokens, in the budget),
 * with the connection's scratch *sp (allocated at first use; free with
 * rd_text_scratch_free). Returns 0, or an HTTP status with the message in err: 400 (no
 * tokenizer for the model, a body the renderer refuses with its message, an empty prompt),
 * 503 (the body budget), 500 (out of memory). Thread-safe. */
unsigned rd_text_tokens(rd_text *t, rd_text_scratch **sp, rd_req *q, char *err, size_t err_size);

/* Free the scratch when it holds more than keep_bytes (keep_bytes 0: always). Accepts a
 * NULL *sp. Cannot fail. */
void rd_text_scratch_trim(rd_text_scratch **sp, size_t keep_bytes);

/* The table's invariants (one entry per model, a loaded tokenizer and its mutex for every
 * entry given --tokenizer, each tokenizer's own bpe_check). Returns NULL or what is broken
 * (into err). For tests and fuzzers, after rd_text_load. Accepts NULL. */
const char *rd_text_check(const rd_text *t, char *err, size_t err_size);

/* Free the table and its tokenizers. Accepts NULL. */
void rd_text_free(rd_text *t);

#endif /* CLI_RD_TEXT_H */
