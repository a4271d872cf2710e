/*
 * fuzz_tokenize.c - libFuzzer harness: the byte-level BPE tokenizer (src/cli/tok/bpe.h).
 *
 * The first byte picks a mode, the rest of the input is decoded by it:
 *
 *   text (half the inputs)   arbitrary bytes, invalid UTF-8 included, encoded by the fixed
 *                            tokenizer of one kind (tok_util.h: llama3, cl100k with its
 *                            sidecar, o200k), special tokens on or off, at a base offset of
 *                            0, a small one or one near 2^32, appended after 0-3 tokens
 *                            already in the output;
 *   piece (a quarter)        the bytes mapped to letters (a, b, s, t, h, e, é, 日), or to
 *                            spaces, tabs and newlines (a high bit: the first of them), so that
 * whole inputs become single long pieces and bpe.c's heap merge (pieces over 64 bytes) runs as
 * often as its scan; vocabulary (a quarter)   a rank file made from the input: the 256 single bytes
 * at shuffled ranks, up to 63 merges of letters, digits, spaces and é built from earlier tokens,
 * gaps in the ranks, CRLF line ends or blank lines; sometimes damaged (a rank given twice, a byte
 *                            changed, a single byte's line dropped); half the time with a
 *                            sidecar (FILE.json) that may name the kind, bos, and up to three
 *                            special tokens (new texts, ordinary text, built-in specials
 *                            moved; fresh ids, a built-in's, an ordinary token's, an earlier
 *                            entry's); loaded, and then the rest of the input encoded with it.
 *
 * Asserted:
 *   - every load succeeds (or, for a damaged file or a sidecar, fails with BPE_EINPUT and a
 *     message that starts with the file's path), and bpe_check passes after every
 *     successful load; a sidecar's specials are the reference's too;
 *   - invalid UTF-8 is refused with BPE_EINPUT, the message naming the first invalid byte
 *     as an independent validator finds it, and the tokens already in the output intact;
 *     the valid prefix is then encoded and checked like any text;
 *   - valid UTF-8 gives BPE_OK and tokens whose offsets start at the base, ascend and tile
 *     the text, each token's bytes (bpe_token_bytes) being exactly the text it spans, so
 *     the ids decode back to the input (specials included when they are on; with them off,
 *     only ordinary tokens);
 *   - the ids and offsets equal the reference encoder's (tok_util.h: PCRE2's interpreter,
 *     a plain merge loop, a sorted vocabulary), except for a damaged vocabulary;
 *   - encoding the same text again gives the same tokens;
 *   - no crash, no sanitizer report, no leak.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "tok_util.h"

#define MAX_TEXT 8192u /* longer inputs are cut: the reference is quadratic in a piece */

/* The tokens of one encoding, reused across inputs. */
static bpe_out out, again;

/* Encode text[0, len) (valid UTF-8) with t and check it (see the file comment). ref may be
 * NULL (no reference for this vocabulary). n_pre dummy tokens are in out beforehand. */
static void encode_valid(bpe *t, tku_ref *ref, const char *text, size_t len, bool specials,
                         uint32_t base, size_t n_pre)
{
    char err[256] = "";
    int rc = bpe_encode(t, text, len, specials, base, &out, err, sizeof err);
    FZ_ASSERT(rc == BPE_OK, "bpe_encode of %zu bytes of valid UTF-8: %d, %s", len, rc, err);
    for (size_t i = 0; i < n_pre; i++)
        FZ_ASSERT(out.ids[i] == 7 + i && out.offsets[i] == i,
                  "token %zu before the call was changed", i);
    size_t n = out.n - n_pre;
    if (n == 0) {
        FZ_ASSERT(len == 0, "%zu bytes of text gave no token", len);
        return;
    }
    const uint32_t *ids = out.ids + n_pre, *offs = out.offsets + n_pre;
    tku_check_tiling(t, text, len, base, ids, offs, n, "encode");
    if (ref != NULL) {
        tku_ref_encode(ref, text, len, specials, base);
        tku_check_ref(ref, ids, offs, n, "encode");
    }
    again.n = 0;
    rc = bpe_encode(t, text, len, specials, base, &again, err, sizeof err);
    FZ_ASSERT(rc == BPE_OK && again.n == n, "encoding again: %d, %zu tokens instead of %zu", rc,
              again.n, n);
    FZ_ASSERT(n == 0 || (memcmp(again.ids, ids, n * sizeof *ids) == 0 &&
                         memcmp(again.offsets, offs, n * sizeof *offs) == 0),
              "encoding again gives other tokens");
}

/* Encode arbitrary bytes: refused at the first invalid byte, else checked. */
static void encode_any(bpe *t, tku_ref *ref, const char *text, size_t len, bool specials,
                       uint32_t base, size_t n_pre)
{
    /* bpe_out is the caller's: grow it here as logread.c does, then fill the dummies. */
    if (out.cap < n_pre) {
        out.ids = realloc(out.ids, n_pre * sizeof *out.ids);
        out.offsets = realloc(out.offsets, n_pre * sizeof *out.offsets);
        FZ_ASSERT(out.ids != NULL && out.offsets != NULL, "out of memory");
        out.cap = n_pre;
    }
    for (size_t i = 0; i < n_pre; i++) {
        out.ids[i] = 7 + (uint32_t)i;
        out.offsets[i] = (uint32_t)i;
    }
    out.n = n_pre;
    size_t bad = tku_utf8_invalid_at((const unsigned char *)text, len);
    if (bad < len) {
        char err[256] = "", want[64];
        int rc = bpe_encode(t, text, len, specials, base, &out, err, sizeof err);
        snprintf(want, sizeof want, "at byte %zu", bad);
        FZ_ASSERT(rc == BPE_EINPUT && strstr(err, want) != NULL,
                  "invalid UTF-8 at byte %zu of %zu: %d, \"%s\"", bad, len, rc, err);
        for (size_t i = 0; i < n_pre; i++)
            FZ_ASSERT(out.ids[i] == 7 + i && out.offsets[i] == i,
                      "token %zu before the failed call was changed", i);
        out.n = n_pre;
        len = bad;
    }
    encode_valid(t, ref, text, len, specials, base, n_pre);
}

/* Mode text: arbitrary bytes through a fixed tokenizer. */
static void mode_text(fz_in *in)
{
    uint8_t b = fz_u8(in);
    int kind = BPE_LLAMA3 + (b & 3) % 3;
    bool specials = (b & 4) != 0;
    size_t n_pre = (b >> 5) & 3;
    tku_ref *ref;
    bpe *t = tku_fixed(kind, &ref);
    size_t len = in->n > MAX_TEXT ? MAX_TEXT : in->n;
    uint32_t base = 0;
    switch ((b >> 3) & 3) {
    case 1:
        base = 1 + fz_u8(in);
        len = in->n > MAX_TEXT ? MAX_TEXT : in->n;
        break;
    case 2:
        base = UINT32_C(0x7fffff00);
        break;
    case 3:
        base = (uint32_t)(UINT32_MAX - 1 - len);
        break;
    }
    encode_any(t, ref, (const char *)in->p, len, specials, base, n_pre);
}

/* Mode piece: long runs of letters or of whitespace. */
static void mode_piece(fz_in *in)
{
    static const char *const letters[8] = {"a", "b", "s",        "t",
                                           "h", "e", "\xc3\xa9", "\xe6\x97\xa5"};
    static const char *const spaces[8] = {" ", " ", " ", " ", "\t", "\n", "\r\n", "a"};
    static char *text;
    static size_t cap;
    uint8_t b = fz_u8(in);
    int kind = BPE_LLAMA3 + (b & 3) % 3;
    const char *const *alpha = (b & 4) ? spaces : letters;
    size_t n = in->n > MAX_TEXT / 2 ? MAX_TEXT / 2 : in->n;
    if (cap < 3 * n + 1) {
        cap = 3 * n + 1;
        text = realloc(text, cap);
        FZ_ASSERT(text != NULL, "out of memory");
    }
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = fz_u8(in);
        const char *s = alpha[c & 7];
        size_t sl = strlen(s);
        /* A high bit gives the first character instead (long equal runs). */
        if (c & 0x80)
            s = alpha[0], sl = strlen(s);
        memcpy(text + len, s, sl);
        len += sl;
    }
    tku_ref *ref;
    bpe *t = tku_fixed(kind, &ref);
    encode_any(t, ref, text, len, (b & 8) != 0, 0, 0);
}

/* ---- mode vocabulary ------------------------------------------------------------------- */

/* Build a vocabulary from the input into v (see the file comment). */
static void random_vocab(fz_in *in, tku_vocab *v)
{
    static const unsigned char alpha[] = {'a', 'b', 'c', ' ', '\n', '1', 0xc3, 0xa9};
    uint8_t mult = (uint8_t)(fz_u8(in) | 1), add = fz_u8(in);
    for (unsigned b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        tku_vocab_add(v, &c, 1, (uint8_t)(b * mult + add));
    }
    size_t n_merges = fz_u8(in) % 64;
    uint32_t rank = 256;
    for (size_t m = 0; m < n_merges; m++) {
        uint8_t x = fz_u8(in), y = fz_u8(in);
        unsigned char buf[32];
        size_t n = 0;
        /* Each half is an alphabet byte, or an earlier merge (x, y pick which). */
        for (int half = 0; half < 2; half++) {
            uint8_t sel = half ? y : x;
            const tku_entry *e = NULL;
            if ((sel & 0x80) && v->n > 256)
                e = &v->e[256 + (sel & 0x7f) % (v->n - 256)];
            if (e != NULL && n + e->len <= 16) {
                memcpy(buf + n, v->arena + e->off, e->len);
                n += e->len;
            } else {
                buf[n++] = alpha[sel & 7];
            }
        }
        if (!tku_vocab_has(v, buf, n))
            tku_vocab_add(v, buf, n, rank);
        rank += 1 + (x & 0x40 ? (y & 3) : 0);
    }
}

/* Write v with its line layout (b: CRLF ends, blank lines) and damage (d), into path.
 * Returns whether the file was damaged. */
static bool write_vocab(const tku_vocab *v, const char *path, uint8_t b, uint8_t d, uint8_t at)
{
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.plain", path);
    tku_vocab_write(v, tmp);
    FILE *f = fopen(tmp, "rb");
    FZ_ASSERT(f != NULL, "cannot read back %s", tmp);
    static char buf[1 << 16], outb[1 << 17];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t o = 0, line = 0, drop = d % 4 == 3 ? (size_t)(at % 256) : SIZE_MAX;
    size_t dup = d % 4 == 1 ? (size_t)at % v->n : SIZE_MAX;
    for (size_t i = 0, start = 0; i < n; i++) {
        if (buf[i] != '\n')
            continue;
        size_t ll = i - start;
        if (line != drop) {
            for (int k = 0; k < (line == dup ? 2 : 1); k++) {
                memcpy(outb + o, buf + start, ll);
                o += ll;
                if (b & 1)
                    outb[o++] = '\r';
                outb[o++] = '\n';
                if ((b & 2) && line % 17 == 0)
                    outb[o++] = '\n';
            }
        }
        start = i + 1;
        line++;
    }
    bool damaged = drop != SIZE_MAX || dup != SIZE_MAX;
    if (d % 4 == 2 && o > 0) {
        outb[(size_t)at * 131 % o] = (char)(d ^ at);
        damaged = true;
    }
    tku_write_file(path, outb, o);
    return damaged;
}

/* A sidecar for the random vocabulary (or none: then any old one is removed): maybe the
 * kind (then bpe_load gets kind 0), up to three special tokens whose texts may be built-in
 * specials (moved), ordinary text or new, with ids that are fresh, a built-in special's,
 * an ordinary token's or an earlier entry's; maybe bos/eos texts. The specials the load
 * should then have are added to ref in the same order. Returns the kind for bpe_load. */
static int random_sidecar(fz_in *in, const char *path, int kind, bool on, tku_ref *ref)
{
    static const char *const texts[8] = {
        "<|a|>",      "<|ab|>",       "ab", "<|endoftext|>", "<|begin_of_text|>",
        "<|eot_id|>", "<|im_start|>", "a"};
    static const uint32_t builtin[4] = {0, 128009, 100257, 199999};
    char name[600], text[512];
    snprintf(name, sizeof name, "%s.json", path);
    if (!on) {
        unlink(name);
        return kind;
    }
    uint8_t f = fz_u8(in);
    size_t o = (size_t)snprintf(text, sizeof text, "{\"special_tokens\": {");
    uint32_t prev = 1000;
    for (size_t k = 0, n = f % 4; k < n; k++) {
        uint8_t c = fz_u8(in), x = fz_u8(in);
        uint32_t ids[4] = {1000 + x, builtin[kind], x, prev};
        uint32_t id = ids[c % 4];
        const char *t = texts[(c >> 2) % 8];
        o += (size_t)snprintf(text + o, sizeof text - o, "%s\"%s\": %u", k ? ", " : "", t, id);
        tku_ref_special(ref, t, id);
        prev = id;
    }
    o += (size_t)snprintf(text + o, sizeof text - o, "}");
    if (f & 0x10)
        o += (size_t)snprintf(text + o, sizeof text - o, ", \"kind\": \"%s\"", bpe_kind_name(kind));
    if (f & 0x20)
        o += (size_t)snprintf(text + o, sizeof text - o, ", \"bos_token\": \"<s>\"");
    o += (size_t)snprintf(text + o, sizeof text - o, "}\n");
    tku_write_file(name, text, o);
    return f & 0x10 ? 0 : kind;
}

static void mode_vocab(fz_in *in)
{
    uint8_t b = fz_u8(in), d = fz_u8(in), at = fz_u8(in);
    int kind = BPE_LLAMA3 + (b & 3) % 3;
    tku_vocab v = {0};
    random_vocab(in, &v);
    char path[512];
    snprintf(path, sizeof path, "%s/random.tiktoken", tku_dir());
    bool damaged = (d & 0x30) == 0x30 && write_vocab(&v, path, b >> 2, d, at);
    if (!damaged)
        write_vocab(&v, path, b >> 2, 0, 0);
    tku_ref ref;
    tku_vocab_seal(&v);
    tku_ref_init(&ref, kind, &v);
    bool sidecar = (b & 0x80) != 0;
    int load_kind = random_sidecar(in, path, kind, sidecar, &ref);
    bpe *t = NULL;
    char err[512] = "";
    int rc = bpe_load(path, load_kind, &t, err, sizeof err);
    if ((damaged || sidecar) && rc != BPE_OK) {
        /* "PATH:..." for the rank file, "PATH.json:..." for the sidecar. */
        size_t pl = strlen(path);
        bool named =
            strncmp(err, path, pl) == 0 && (err[pl] == ':' || strncmp(err + pl, ".json:", 6) == 0);
        FZ_ASSERT(rc == BPE_EINPUT && named && strlen(err) > pl + 8,
                  "damaged rank file or sidecar: %d, \"%s\"", rc, err);
        FZ_ASSERT(t == NULL, "a failed load set the tokenizer");
        tku_ref_free(&ref);
        tku_vocab_free(&v);
        return;
    }
    FZ_ASSERT(rc == BPE_OK, "bpe_load of a valid rank file: %d, %s", rc, err);
    FZ_ASSERT(bpe_check(t, err, sizeof err) == 0, "bpe_check after load: %s", err);
    size_t len = in->n > 4096 ? 4096 : in->n;
    char *text = malloc(len + 1);
    FZ_ASSERT(text != NULL, "out of memory");
    /* The text mostly in the vocabulary's alphabet, so the merges apply. */
    static const char map[] = "abcabcab  \n1aab";
    for (size_t i = 0; i < len; i++) {
        uint8_t c = fz_u8(in);
        text[i] = c < 0x80 ? map[c & 15] : (char)(c & 0x7f);
    }
    encode_any(t, damaged ? NULL : &ref, text, len, (b & 0x40) != 0, 0, 0);
    free(text);
    tku_ref_free(&ref);
    tku_vocab_free(&v);
    bpe_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_harness = "fuzz_tokenize";
    fz_in in = {data, size};
    uint8_t mode = fz_u8(&in);
    if (mode % 4 < 2)
        mode_text(&in);
    else if (mode % 4 == 2)
        mode_piece(&in);
    else
        mode_vocab(&in);
    return 0;
}
