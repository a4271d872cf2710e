/*
 * bpe.h - a byte-level BPE tokenizer for the model families whose vocabulary is published
 * as a tiktoken rank file: OpenAI's cl100k_base and o200k_base, and Llama 3 (its
 * tokenizer.model). Used by `kvprefix tokenize` and by the OpenAI-body reader when replay
 * is given --tokenizer; the words/bytes stand-ins of input/tokenize.h remain the fallback.
 *
 * The rank file has one token a line, "BASE64 RANK": the token's bytes in standard base64
 * and its rank, which is also its id. Encoding text (each step as tiktoken does it):
 *
 *   1. Special tokens. The text is cut at every occurrence of a special token's text (the
 *      kind's list below, plus a sidecar's); each becomes its id. The longest special
 *      token wins where two start at one byte. With specials off, they are ordinary text.
 *   2. Pre-tokenization. Each stretch between specials is split by the kind's regular
 *      expression (compiled with PCRE2, UTF and Unicode properties, JIT when available)
 *      into pieces; text the expression does not match is skipped, as in tiktoken.
 *   3. Merging. A piece that is a token is that token. Otherwise it starts as its bytes and
 *      the adjacent pair whose concatenation has the lowest rank is merged, the leftmost
 *      on a tie, until no adjacent pair is a token.
 *
 * Kinds (bpe_kind_from_name):
 *
 *   llama3  Llama 3, 3.1, 3.2, 3.3: 128000 ranks; specials <|begin_of_text|> 128000,
 *           <|end_of_text|> 128001, <|reserved_special_token_0|> 128002, ..._1| 128003,
 *           <|finetune_right_pad_id|> 128004, ..._2| 128005, <|start_header_id|> 128006,
 *           <|end_header_id|> 128007, <|eom_id|> 128008, <|eot_id|> 128009,
 *           <|python_tag|> 128010, <|reserved_special_token_3|> .. _247| 128011..128255.
 *           bos <|begin_of_text|>, eos <|eot_id|> (the instruct models' end of turn).
 *   cl100k  cl100k_base (GPT-4, GPT-3.5): <|endoftext|> 100257, <|fim_prefix|> 100258,
 *           <|fim_middle|> 100259, <|fim_suffix|> 100260, <|endofprompt|> 100276.
 *   o200k   o200k_base (GPT-4o): <|endoftext|> 199999, <|endofprompt|> 200018.
 *
 * llama3 and cl100k share one expression, o200k has its own (bpe.c). Two deliberate
 * choices, both as OpenAI's tiktoken (Rust) behaves: \s is Unicode White_Space (so U+0085
 * is whitespace and U+FEFF is not; JavaScript's \s says the opposite for both), and the
 * contractions ('s 't 're 've 'm 'll 'd) match ASCII letters of either case only.
 *
 * Loading (bpe_load): a folder holding tokenizer.json, or a file starting with '{', is a
 * Hugging Face tokenizer (kind BPE_HF): hftok.h reads it (with tokenizer_config.json beside
 * it for bos/eos) and every call below forwards to it. A folder with only tokenizer.model
 * reads that file: Llama 3's is a rank file; a SentencePiece model (protobuf) is read by
 * spm_shim.h (kind BPE_SPM) when the build has libsentencepiece, else refused with a
 * message. A rank file's kind comes from --tokenizer-kind, else its sidecar, else
 * its number of ranks (each published file has its own: 128000, 100256, 199998).
 *
 * Sidecar. FILE.json beside the rank file (FILE being the --tokenizer path), optional:
 *
 *   {"kind": "cl100k", "special_tokens": {"<|im_start|>": 100264, "<|im_end|>": 100265},
 *    "bos_token": "<s>", "eos_token": "</s>"}
 *
 * "kind" names the kind when none is given on the command line; "special_tokens" adds
 * tokens (or moves a built-in one to another id; no two specials may end up with one id,
 * and none may take an ordinary token's); "bos_token"/"eos_token" name the texts
 * the chat templates write for bos_token and eos_token (template.h). Every field is
 * optional.
 *
 * Memory: the ranks' bytes once (about 1.1 MB for o200k) plus 12 bytes per token and a
 * hash table of 8 bytes per token; encoding grows scratch arrays to the longest piece.
 * A tokenizer is not safe to use from two threads at once (its scratch state is shared).
 */
#ifndef CLI_BPE_H
#define CLI_BPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    BPE_LLAMA3 = 1, /* Llama 3 family */
    BPE_CL100K = 2, /* cl100k_base */
    BPE_O200K = 3,  /* o200k_base */
    BPE_HF = 4,     /* a Hugging Face tokenizer.json (hftok.h); not a --tokenizer-kind */
    BPE_SPM = 5     /* a SentencePiece .model (spm_shim.h); not a --tokenizer-kind */
};

enum {
    BPE_OK = 0,
    BPE_EINPUT = -1, /* malformed rank file, sidecar or text (message in err) */
    BPE_EIO = -2,    /* a file cannot be read */
    BPE_ENOMEM = -3  /* out of memory */
};

#define BPE_MAX_RANKS (1u << 24) /* most tokens a rank file may hold */

typedef struct bpe bpe;

/* Token ids of encoded text and where each token starts: a caller-owned growable pair of
 * arrays, zeroed before first use, reused across calls, freed with bpe_out_free. */
typedef struct bpe_out {
    uint32_t *ids;     /* token ids */
    uint32_t *offsets; /* byte offset in the text of each token's first byte, ascending */
    size_t n;          /* tokens held */
    size_t cap;        /* elements allocated at ids and at offsets */
} bpe_out;

/* The kind named name ("llama3", "cl100k", "o200k"), or 0 when unknown. Cannot fail. */
int bpe_kind_from_name(const char *name);

/* Name of a kind ("llama3", ...); "?" for anything else. Cannot fail. */
const char *bpe_kind_name(int kind);

/* Load the rank file at path with its sidecar path + ".json" when that exists. kind is a
 * BPE_* kind, or 0 to take it from the sidecar. Every line must be "BASE64 RANK" (a
 * trailing "\r" is allowed, blank lines are skipped), ranks below BPE_MAX_RANKS, ranks and
 * byte strings each unique, and all 256 single bytes present. Returns BPE_OK and sets *out
 * (free it with bpe_free); BPE_EINPUT, BPE_EIO or BPE_ENOMEM with "FILE:LINE: what is
 * wrong" in err, *out untouched. */
int bpe_load(const char *path, int kind, bpe **out, char *err, size_t err_size);

/* The pre-tokenization expression of kind (a PCRE2 pattern, compiled with PCRE2_UTF |
 * PCRE2_UCP), or NULL for an unknown kind; a static string. For tests that run the same
 * expression through another matcher. Cannot fail. */
const char *bpe_pattern(int kind);

/* How the tokenizer was read: "tiktoken ranks", or hftok.h's form ("byte-level BPE",
 * "BPE with byte fallback"). Static. Cannot fail. */
const char *bpe_form(const bpe *t);

/* A tokenizer.json's chat template text (tokenizer_config.json), "" otherwise. Owned by t.
 * Cannot fail. */
const char *bpe_chat_template(const bpe *t);

/* Free a tokenizer. Accepts NULL. */
void bpe_free(bpe *t);

/* The tokenizer's kind. Cannot fail. */
int bpe_kind(const bpe *t);

/* Number of ranks loaded (the ordinary vocabulary, specials excluded). Cannot fail. */
size_t bpe_n_ranks(const bpe *t);

/* Text of bos_token / eos_token for the chat templates, NUL-terminated, or "" when the
 * kind has none and the sidecar names none. Owned by t. Cannot fail. */
const char *bpe_bos(const bpe *t);
const char *bpe_eos(const bpe *t);

/* Whether text[0, len) is a special token; sets *id when it is (id may be NULL). Cannot
 * fail. */
bool bpe_special(const bpe *t, const char *text, size_t len, uint32_t *id);

/* Encode text[0, len) (steps 1-3 above; specials: whether step 1 applies) and append the
 * tokens to *out (their offsets count from text, plus base). The text must be valid UTF-8
 * and len + base below 2^32. Returns BPE_OK; BPE_EINPUT for invalid UTF-8 (message names
 * the byte offset) or a regular-expression failure; BPE_ENOMEM. After a failure *out holds
 * the tokens appended so far and stays usable. */
int bpe_encode(bpe *t, const char *text, size_t len, bool specials, uint32_t base, bpe_out *out,
               char *err, size_t err_size);

/* bpe_encode with specials on, plus the tokens a tokenizer.json's post-processor puts
 * around a text when the caller asks for special tokens (Llama 3.1's <|begin_of_text|>,
 * Gemma's <bos>); for a rank file the same as bpe_encode. Same returns. */
int bpe_encode_post(bpe *t, const char *text, size_t len, uint32_t base, bpe_out *out, char *err,
                    size_t err_size);

/* The bytes of token id (an ordinary token or a special): sets *p (owned by t) and *len and
 * returns true, or returns false for an id the tokenizer does not have. Cannot fail. */
bool bpe_token_bytes(const bpe *t, uint32_t id, const char **p, size_t *len);

/* Free what *out holds and zero it. Accepts NULL. */
void bpe_out_free(bpe_out *out);

/* Check the tokenizer's invariants (every rank found by its bytes through the hash table,
 * table load below 1/2, all single bytes present, specials sorted, no two specials with
 * one id). Returns 0, or -1 with the first violation in err. */
int bpe_check(const bpe *t, char *err, size_t err_size);

#endif /* CLI_BPE_H */
