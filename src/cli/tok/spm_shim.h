/*
 * spm_shim.h - a C interface to Debian's libsentencepiece (a C++ library) for SentencePiece
 * .model files, the form some models ship beside (or instead of) tokenizer.json. Built from
 * spm_shim.cc when meson's 'sentencepiece' feature finds the library, else from spm_none.c,
 * which refuses every model with a message saying so. bpe.h loads a .model through it
 * (kind BPE_SPM) and forwards its calls here.
 *
 * Encoding: with specials on, the text is cut at the text of every control or unknown
 * piece (<s>, </s>, <unk>: each becomes its id, the longest first where two start at one
 * byte), as Hugging Face's tokenizers treat a model's special tokens; each stretch between
 * them is encoded by SentencePieceProcessor::EncodeAsImmutableProto (so each gets the
 * model's dummy prefix, as a separate call would), its pieces' byte offsets kept.
 */
#ifndef CLI_SPM_SHIM_H
#define CLI_SPM_SHIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spm spm;

/* Whether this build reads SentencePiece models. Cannot fail. */
bool spm_available(void);

/* Load the model at path. Returns 0 and sets *out (spm_free), or -1 (not a model, or this
 * build has no SentencePiece), -3 out of memory, with "FILE: what is wrong" in err. */
int spm_load(const char *path, spm **out, char *err, size_t err_size);

void spm_free(spm *t);

/* Number of pieces. Cannot fail. */
size_t spm_n_pieces(const spm *t);

/* The bos / eos pieces' texts ("" when the model has none). Owned by t. */
const char *spm_bos(const spm *t);
const char *spm_eos(const spm *t);

/* Whether text[0, len) is a control or unknown piece's text; sets *id (may be NULL). */
bool spm_special(const spm *t, const char *text, size_t len, uint32_t *id);

/* Encode valid UTF-8 text[0, len), appending to ids/offs (realloc'd, *cap each) from *n;
 * offsets count from text plus base. Returns 0, or -3 out of memory (message in err). */
int spm_encode(spm *t, const char *text, size_t len, bool specials, uint32_t base, uint32_t **ids,
               uint32_t **offs, size_t *n, size_t *cap, char *err, size_t err_size);

/* The decoded bytes of piece id (U+2581 as a space, <0xXX> as its byte, a control piece as
 * its text). Owned by t. False for an id out of range. */
bool spm_token_bytes(const spm *t, uint32_t id, const char **p, size_t *len);

#ifdef __cplusplus
}
#endif

#endif /* CLI_SPM_SHIM_H */
