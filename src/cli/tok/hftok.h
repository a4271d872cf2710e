/*
 * hftok.h - a tokenizer read from a Hugging Face tokenizers file (tokenizer.json), the
 * form Qwen, DeepSeek, Llama 3.1, Gemma and Mistral ship. bpe.h loads it when --tokenizer
 * names a model folder or a .json file and forwards its calls here, so the rest of the tool
 * sees one tokenizer type.
 *
 * Supported components (anything else is refused by name: `FILE: unsupported normalizer
 * "Precompiled"`):
 *
 *   model          BPE (vocab, merges as "a b" strings or [a, b] pairs, byte_fallback,
 *                  unk_token, fuse_unk, ignore_merges); no dropout, no subword prefix or
 *                  suffix. WordPiece, Unigram, WordLevel are refused.
 *   normalizer     null, Sequence, NFC, NFKC, NFD, NFKD (utf8proc), Replace (a String
 *                  pattern), Prepend.
 *   pre_tokenizer  null, Sequence, Split (a Regex pattern through PCRE2 with UTF and
 *                  Unicode properties, or a String; behaviours Removed, Isolated,
 *                  MergedWithPrevious, MergedWithNext, Contiguous; invert), ByteLevel
 *                  (add_prefix_space, use_regex with GPT-2's expression), Digits
 *                  (individual_digits), Metaspace (replacement, prepend_scheme always /
 *                  first / never or the older add_prefix_space, split).
 *   post_processor null, ByteLevel (offsets only: nothing to do), TemplateProcessing (the
 *                  "single" form's special tokens before and after the text), Sequence.
 *   added_tokens   every entry: matched before the normalizer (normalized false) or in the
 *                  normalized text (normalized true), leftmost and longest first; flags
 *                  special, lstrip, rstrip, single_word honoured.
 *
 * Encoding (hf_encode), as the tokenizers library does it: (1) cut the text at added tokens
 * (with specials off, those flagged special are ordinary text; the unflagged ones still
 * match, as in the library); (2) normalize each stretch between them; (3) cut it at the
 * normalized added tokens; (4) run the pre-tokenizer chain, giving pieces; (5) encode each
 * piece with BPE: byte-level models map its bytes to GPT-2's printable characters first;
 * the piece starts as its characters (a character not in the vocabulary becomes its bytes'
 * <0xXX> tokens with byte_fallback, else unk_token), then the adjacent pair with the
 * lowest merge rank is merged, the leftmost on a tie, until no pair has a merge; with
 * ignore_merges a piece that is itself a token is that token. (SentencePiece-derived files
 * leave a whole stretch as one piece; when no token holds U+2581 after another character,
 * it is merged word by word, which gives the same tokens: hftok_enc.c.) (6) With add_special (the
 * post-processor's "add_special_tokens"), the TemplateProcessing tokens go around it.
 *
 * Simplifications (none matters for the models checked): a normalized added token is
 * matched by its content as written, not by its content normalized (the files checked
 * have no normalizer that changes one); lstrip/rstrip take ASCII whitespace only;
 * single_word's word characters are ASCII letters, digits, '_' and every non-ASCII byte.
 *
 * Offsets: each token's offset is the byte of the original text where its first
 * character came from; where a normalizer rewrote a stretch (NFC changing it, Replace,
 * Prepend) they point at the start of what was rewritten, still ascending.
 *
 * Memory: jansson's tree of the file while loading (about 15x the file: a 33 MB Gemma 3
 * file peaks near 500 MB), then the tokens' text once, 16 bytes per token and 16 per merge
 * in hash tables. A tokenizer is not safe to use from two threads at once (scratch).
 */
#ifndef CLI_HFTOK_H
#define CLI_HFTOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct hftok hftok;

#define HF_MAX_FILE (256u << 20) /* largest tokenizer.json read */

/* Load a tokenizer.json (path names the file) and, when cfg_path is not NULL and exists,
 * tokenizer_config.json for bos_token and eos_token. Returns 0 and sets *out (hf_free), or
 * -1 (bad input), -2 (unreadable), -3 (out of memory) with "FILE: what is wrong" in err. */
int hf_load(const char *path, const char *cfg_path, hftok **out, char *err, size_t err_size);

/* Load from a tokenizer.json already in memory (buf[0, len); for the fuzz target); name is
 * used in messages. Same returns as hf_load. */
int hf_load_mem(const char *name, const char *buf, size_t len, hftok **out, char *err,
                size_t err_size);

/* Free. Accepts NULL. */
void hf_free(hftok *t);

/* Vocabulary size: the model's tokens plus added tokens not in it. Cannot fail. */
size_t hf_n_tokens(const hftok *t);

/* A short description ("byte-level BPE", "BPE with byte fallback"). Static. */
const char *hf_form(const hftok *t);

/* bos_token / eos_token texts from tokenizer_config.json ("" when absent). Owned by t. */
const char *hf_bos(const hftok *t);
const char *hf_eos(const hftok *t);

/* The chat_template of tokenizer_config.json (the "default" one of a list), "" when
 * absent. Owned by t. Cannot fail. */
const char *hf_chat_template(const hftok *t);

/* Whether text[0, len) is exactly one added token (special or not); sets *id. */
bool hf_added(const hftok *t, const char *text, size_t len, uint32_t *id);

/* Encode valid UTF-8 text[0, len): append ids to ids/offs (grown with realloc; *cap
 * elements each) starting at *n; offsets count from text plus base. specials: whether
 * added tokens flagged special match; add_special: the post-processor's tokens. Returns 0,
 * -1 with a message (regular-expression failure), -3 out of memory. */
int hf_encode(hftok *t, const char *text, size_t len, bool specials, bool add_special,
              uint32_t base, uint32_t **ids, uint32_t **offs, size_t *n, size_t *cap, char *err,
              size_t err_size);

/* The text of token id (decoded: GPT-2 characters back to bytes, <0xXX> to the byte, the
 * Metaspace character to a space); owned by t. False for an unknown id. */
bool hf_token_bytes(const hftok *t, uint32_t id, const char **p, size_t *len);

/* Invariants: every vocabulary token found by its text, every merge's result the join of
 * its parts, added tokens' ids below the id bound. Returns 0, or -1 with the first
 * violation in err. */
int hf_check(const hftok *t, char *err, size_t err_size);

#endif /* CLI_HFTOK_H */
