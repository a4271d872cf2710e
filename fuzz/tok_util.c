/*
 * tok_util.c - the tokenizer harnesses' shared pieces (tok_util.h): vocabularies and rank
 * files, the fixed tokenizers, the reference encoder and the checks on encoded text.
 *
 * The reference is deliberately plain: a sorted array and binary search where bpe.c has a
 * hash table, one scan over every special at every byte where bpe.c has a first-byte table,
 * PCRE2's interpreter where bpe.c uses the JIT, and one merge rule for pieces of every
 * length where bpe.c switches to a heap above 64 bytes. Cost: O(n^2) for a piece of n
 * bytes, fine for fuzz inputs of a few KiB.
 */
#define _GNU_SOURCE /* mkdtemp */
#include "tok_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_util.h"

#define NO_RANK  UINT32_MAX
#define MAX_TEMP 64 /* files the harnesses may write */

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL)
        fz_fail("out of memory (%zu bytes) in the harness", n);
    return q;
}

/* ---- vocabularies ---------------------------------------------------------------------- */

void tku_vocab_add(tku_vocab *v, const void *p, size_t n, uint32_t rank)
{
    if (v->arena_len + n > v->arena_cap) {
        v->arena_cap = 2 * (v->arena_len + n) + 256;
        v->arena = xrealloc(v->arena, v->arena_cap);
    }
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 512;
        v->e = xrealloc(v->e, v->cap * sizeof *v->e);
    }
    memcpy(v->arena + v->arena_len, p, n);
    v->e[v->n++] = (tku_entry){(uint32_t)v->arena_len, (uint32_t)n, rank};
    v->arena_len += n;
    v->sealed = false;
}

bool tku_vocab_has(const tku_vocab *v, const void *p, size_t n)
{
    if (v->sealed)
        return tku_vocab_rank(v, p, n) != NO_RANK;
    for (size_t i = 0; i < v->n; i++)
        if (v->e[i].len == n && memcmp(v->arena + v->e[i].off, p, n) == 0)
            return true;
    return false;
}

/* Bytes order: memcmp over the shorter, then the shorter first. */
static int cmp_bytes(const unsigned char *a, size_t na, const unsigned char *b, size_t nb)
{
    int c = memcmp(a, b, na < nb ? na : nb);
    if (c != 0)
        return c;
    return na < nb ? -1 : na > nb;
}

static const tku_vocab *sort_vocab; /* the vocabulary qsort is sorting */

static int cmp_entry(const void *x, const void *y)
{
    const tku_entry *a = x, *b = y;
    return cmp_bytes(sort_vocab->arena + a->off, a->len, sort_vocab->arena + b->off, b->len);
}

void tku_vocab_seal(tku_vocab *v)
{
    sort_vocab = v;
    qsort(v->e, v->n, sizeof *v->e, cmp_entry);
    v->sealed = true;
}

uint32_t tku_vocab_rank(const tku_vocab *v, const void *p, size_t n)
{
    size_t lo = 0, hi = v->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const tku_entry *e = &v->e[mid];
        int c = cmp_bytes(v->arena + e->off, e->len, p, n);
        if (c == 0)
            return e->rank;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NO_RANK;
}

static void b64_encode(const unsigned char *s, size_t n, char *out)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t x = (uint32_t)s[i] << 16;
        if (i + 1 < n)
            x |= (uint32_t)s[i + 1] << 8;
        if (i + 2 < n)
            x |= s[i + 2];
        out[o++] = tab[x >> 18 & 63];
        out[o++] = tab[x >> 12 & 63];
        out[o++] = i + 1 < n ? tab[x >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? tab[x & 63] : '=';
    }
    out[o] = '\0';
}

void tku_vocab_write(const tku_vocab *v, const char *path)
{
    size_t cap = 64, len = 0;
    for (size_t i = 0; i < v->n; i++)
        cap += v->e[i].len / 3 * 4 + 20;
    char *buf = xrealloc(NULL, cap);
    char *b64 = xrealloc(NULL, cap);
    for (size_t i = 0; i < v->n; i++) {
        b64_encode(v->arena + v->e[i].off, v->e[i].len, b64);
        len += (size_t)snprintf(buf + len, cap - len, "%s %u\n", b64, v->e[i].rank);
    }
    tku_write_file(path, buf, len);
    free(buf);
    free(b64);
}

void tku_vocab_free(tku_vocab *v)
{
    free(v->arena);
    free(v->e);
    memset(v, 0, sizeof *v);
}

/* ---- the temporary directory ----------------------------------------------------------- */

static char temp_dir[256];
static char *temp_files[MAX_TEMP];
static size_t n_temp;

static void remove_temp(void)
{
    for (size_t i = 0; i < n_temp; i++) {
        unlink(temp_files[i]);
        free(temp_files[i]);
    }
    n_temp = 0;
    if (temp_dir[0] != '\0')
        rmdir(temp_dir);
}

const char *tku_dir(void)
{
    if (temp_dir[0] != '\0')
        return temp_dir;
    const char *base = getenv("TMPDIR");
    snprintf(temp_dir, sizeof temp_dir, "%s/kvp-tokfuzz-XXXXXX",
             base != NULL && base[0] != '\0' ? base : "/tmp");
    if (mkdtemp(temp_dir) == NULL)
        fz_fail("cannot make a temporary directory %s", temp_dir);
    atexit(remove_temp);
    return temp_dir;
}

void tku_write_file(const char *path, const char *text, size_t len)
{
    bool known = false;
    for (size_t i = 0; i < n_temp && !known; i++)
        known = strcmp(temp_files[i], path) == 0;
    if (!known) {
        FZ_ASSERT(n_temp < MAX_TEMP, "too many temporary files");
        temp_files[n_temp] = strdup(path);
        FZ_ASSERT(temp_files[n_temp] != NULL, "out of memory");
        n_temp++;
    }
    FILE *f = fopen(path, "wb");
    FZ_ASSERT(f != NULL, "cannot write %s", path);
    bool ok = fwrite(text, 1, len, f) == len;
    ok = fclose(f) == 0 && ok;
    FZ_ASSERT(ok, "cannot write %s", path);
}

/* ---- the fixed tokenizers -------------------------------------------------------------- */

/* The merges of the fixed vocabulary (after the 256 single bytes), as (bytes, length). */
#define M(s)                                                                                       \
    {                                                                                              \
        s, sizeof s - 1                                                                            \
    }
static const struct {
    const char *s;
    size_t n;
} fixed_merges[] = {
    M("th"),
    M("he"),
    M(" t"),
    M("the"),
    M(" the"),
    M("in"),
    M("er"),
    M("an"),
    M(" a"),
    M("aa"),
    M("aaaa"),
    M("aaa"),
    M("ab"),
    M("ba"),
    M("bab"),
    M("abab"),
    M("  "),
    M("    "),
    M("   "),
    M("\n\n"),
    M("\r\n"),
    M(" \n"),
    M("12"),
    M("123"),
    M("00"),
    M("000"),
    M("\xc3\xa9"),
    M("\xc3\xa9t"),
    M("\xe6\x97"),
    M("\xe6\x97\xa5"),
    M("\xe6\x9c\xac"),
    M("\xe6\x97\xa5\xe6\x9c\xac"),
    M("\xf0\x9f"),
    M("\xf0\x9f\x98"),
    M("\xf0\x9f\x98\x80"),
    M("'s"),
    M("'ll"),
    M("xyz"),
    M("<|"),
    M("|>"),
    M("im"),
    M("_start"),
    M("!!"),
    M("!!!!"),
    M(".."),
    M("..."),
    M("->"),
    M("{\""),
    M("\":"),
    M("\n<"),
    M("<t"),
    M("ool"),
    M("IN"),
    M("INST"),
    M(" ["),
    M("[/"),
    M("\": \""),
    M("\xe2\x80"),
    M("\xe2\x80\xaf"),
    M("\xc2\x85"),
    M("ss"),
    M("sss"),
    M("ssss"),
    M("\t\t"),
};
#undef M

/* Specials of the cl100k sidecar (ids from 100264 on; the last one extends another, so the
 * longest must win) and o200k's moved one. */
static const char *const chat_specials[] = {"<|im_start|>",
                                            "<|im_end|>",
                                            "[INST]",
                                            "[/INST]",
                                            "[AVAILABLE_TOOLS]",
                                            "[/AVAILABLE_TOOLS]",
                                            "[TOOL_CALLS]",
                                            "[TOOL_RESULTS]",
                                            "[/TOOL_RESULTS]",
                                            "<s>",
                                            "</s>",
                                            "[TOOL_CALLS] ["};
#define N_CHAT_SPECIALS (sizeof chat_specials / sizeof chat_specials[0])
#define CHAT_SPECIAL_ID 100264u
#define O200K_MOVED_ID  200100u

static tku_vocab fixed_vocab;
static bpe *fixed_tok[4];
static tku_ref fixed_ref[4];

static void build_fixed_vocab(void)
{
    for (unsigned b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        tku_vocab_add(&fixed_vocab, &c, 1, (b * 167u + 13u) & 255u);
    }
    uint32_t rank = 256;
    for (size_t i = 0; i < sizeof fixed_merges / sizeof fixed_merges[0]; i++) {
        tku_vocab_add(&fixed_vocab, fixed_merges[i].s, fixed_merges[i].n, rank);
        rank += i % 7 == 3 ? 3 : 1; /* gaps: ids that are no token */
    }
}

static void write_sidecars(const char *dir)
{
    char path[512], text[2048];
    size_t o = (size_t)snprintf(text, sizeof text, "{\"kind\": \"cl100k\", \"special_tokens\": {");
    for (size_t i = 0; i < N_CHAT_SPECIALS; i++)
        o += (size_t)snprintf(text + o, sizeof text - o, "%s\"%s\": %u", i ? ", " : "",
                              chat_specials[i], CHAT_SPECIAL_ID + (uint32_t)i);
    o += (size_t)snprintf(text + o, sizeof text - o,
                          "}, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}\n");
    snprintf(path, sizeof path, "%s/cl100k.tiktoken.json", dir);
    tku_write_file(path, text, o);
    o = (size_t)snprintf(text, sizeof text, "{\"special_tokens\": {\"<|endofprompt|>\": %u}}",
                         O200K_MOVED_ID);
    snprintf(path, sizeof path, "%s/o200k.tiktoken.json", dir);
    tku_write_file(path, text, o);
}

static void load_fixed(void)
{
    const char *dir = tku_dir();
    build_fixed_vocab();
    char path[512];
    static const char *const names[4] = {NULL, "llama3", "cl100k", "o200k"};
    write_sidecars(dir);
    for (int kind = BPE_LLAMA3; kind <= BPE_O200K; kind++) {
        snprintf(path, sizeof path, "%s/%s.tiktoken", dir, names[kind]);
        tku_vocab_write(&fixed_vocab, path);
    }
    tku_vocab_seal(&fixed_vocab);
    for (int kind = BPE_LLAMA3; kind <= BPE_O200K; kind++) {
        char err[512] = "";
        snprintf(path, sizeof path, "%s/%s.tiktoken", dir, names[kind]);
        int rc = bpe_load(path, kind == BPE_CL100K ? 0 : kind, &fixed_tok[kind], err, sizeof err);
        FZ_ASSERT(rc == BPE_OK, "bpe_load %s: %d, %s", path, rc, err);
        FZ_ASSERT(bpe_check(fixed_tok[kind], err, sizeof err) == 0, "bpe_check %s: %s", path, err);
        FZ_ASSERT(bpe_kind(fixed_tok[kind]) == kind, "%s loaded as kind %d", path,
                  bpe_kind(fixed_tok[kind]));
        FZ_ASSERT(bpe_n_ranks(fixed_tok[kind]) == fixed_vocab.n, "%s: %zu ranks, wrote %zu", path,
                  bpe_n_ranks(fixed_tok[kind]), fixed_vocab.n);
        tku_ref_init(&fixed_ref[kind], kind, &fixed_vocab);
    }
    for (size_t i = 0; i < N_CHAT_SPECIALS; i++)
        tku_ref_special(&fixed_ref[BPE_CL100K], chat_specials[i], CHAT_SPECIAL_ID + (uint32_t)i);
    tku_ref_special(&fixed_ref[BPE_O200K], "<|endofprompt|>", O200K_MOVED_ID);
    FZ_ASSERT(strcmp(bpe_bos(fixed_tok[BPE_CL100K]), "<s>") == 0 &&
                  strcmp(bpe_eos(fixed_tok[BPE_CL100K]), "</s>") == 0 &&
                  strcmp(bpe_bos(fixed_tok[BPE_LLAMA3]), "<|begin_of_text|>") == 0 &&
                  strcmp(bpe_eos(fixed_tok[BPE_LLAMA3]), "<|eot_id|>") == 0 &&
                  bpe_bos(fixed_tok[BPE_O200K])[0] == '\0',
              "bos/eos texts are not the kinds' and the sidecar's");
}

bpe *tku_fixed(int kind, tku_ref **ref)
{
    if (fixed_tok[BPE_LLAMA3] == NULL)
        load_fixed();
    FZ_ASSERT(kind >= BPE_LLAMA3 && kind <= BPE_O200K, "no fixed tokenizer of kind %d", kind);
    if (ref != NULL)
        *ref = &fixed_ref[kind];
    return fixed_tok[kind];
}

/* ---- the reference encoder ------------------------------------------------------------- */

void tku_ref_special(tku_ref *r, const char *text, uint32_t id)
{
    size_t len = strlen(text);
    FZ_ASSERT(len > 0 && len < sizeof r->sp[0].text, "special \"%s\" too long", text);
    for (size_t i = 0; i < r->n_sp; i++)
        if (strcmp(r->sp[i].text, text) == 0) {
            r->sp[i].id = id;
            return;
        }
    if (r->n_sp == r->sp_cap) {
        r->sp_cap = r->sp_cap ? 2 * r->sp_cap : 64;
        r->sp = xrealloc(r->sp, r->sp_cap * sizeof *r->sp);
    }
    tku_special *s = &r->sp[r->n_sp++];
    memcpy(s->text, text, len + 1);
    s->len = len;
    s->id = id;
}

/* The built-in specials of each kind, from the list in bpe.h. */
static void kind_specials(tku_ref *r)
{
    static const char *const llama3[11] = {"<|begin_of_text|>",
                                           "<|end_of_text|>",
                                           "<|reserved_special_token_0|>",
                                           "<|reserved_special_token_1|>",
                                           "<|finetune_right_pad_id|>",
                                           "<|reserved_special_token_2|>",
                                           "<|start_header_id|>",
                                           "<|end_header_id|>",
                                           "<|eom_id|>",
                                           "<|eot_id|>",
                                           "<|python_tag|>"};
    char name[48];
    switch (r->kind) {
    case BPE_LLAMA3:
        for (uint32_t i = 0; i < 11; i++)
            tku_ref_special(r, llama3[i], 128000 + i);
        for (uint32_t i = 3; i <= 247; i++) {
            snprintf(name, sizeof name, "<|reserved_special_token_%u|>", i);
            tku_ref_special(r, name, 128008 + i);
        }
        break;
    case BPE_CL100K:
        tku_ref_special(r, "<|endoftext|>", 100257);
        tku_ref_special(r, "<|fim_prefix|>", 100258);
        tku_ref_special(r, "<|fim_middle|>", 100259);
        tku_ref_special(r, "<|fim_suffix|>", 100260);
        tku_ref_special(r, "<|endofprompt|>", 100276);
        break;
    default:
        tku_ref_special(r, "<|endoftext|>", 199999);
        tku_ref_special(r, "<|endofprompt|>", 200018);
        break;
    }
}

void tku_ref_init(tku_ref *r, int kind, const tku_vocab *v)
{
    memset(r, 0, sizeof *r);
    FZ_ASSERT(v->sealed, "the reference needs a sealed vocabulary");
    r->kind = kind;
    r->v = v;
    kind_specials(r);
    const char *pat = bpe_pattern(kind);
    FZ_ASSERT(pat != NULL, "bpe_pattern(%d) is NULL", kind);
    int ec;
    PCRE2_SIZE eo;
    r->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo,
                          NULL);
    FZ_ASSERT(r->re != NULL, "the %s expression does not compile (error %d at %zu)",
              bpe_kind_name(kind), ec, (size_t)eo);
    r->md = pcre2_match_data_create_from_pattern(r->re, NULL);
    FZ_ASSERT(r->md != NULL, "out of memory");
}

void tku_ref_free(tku_ref *r)
{
    free(r->sp);
    pcre2_match_data_free(r->md);
    pcre2_code_free(r->re);
    free(r->ids);
    free(r->offs);
    free(r->st);
    free(r->rk);
    memset(r, 0, sizeof *r);
}

static void ref_push(tku_ref *r, uint32_t id, size_t off)
{
    if (r->n_out == r->out_cap) {
        r->out_cap = r->out_cap ? 2 * r->out_cap : 256;
        r->ids = xrealloc(r->ids, r->out_cap * sizeof *r->ids);
        r->offs = xrealloc(r->offs, r->out_cap * sizeof *r->offs);
    }
    r->ids[r->n_out] = id;
    r->offs[r->n_out] = (uint32_t)off;
    r->n_out++;
}

/* Merge piece p[0, n) (tiktoken's rule) and push its tokens at offset at. */
static void ref_merge(tku_ref *r, const unsigned char *p, size_t n, size_t at)
{
    uint32_t whole = tku_vocab_rank(r->v, p, n);
    if (whole != NO_RANK) {
        ref_push(r, whole, at);
        return;
    }
    if (n + 1 > r->st_cap) {
        r->st_cap = 2 * n + 2;
        r->st = xrealloc(r->st, r->st_cap * sizeof *r->st);
        r->rk = xrealloc(r->rk, r->st_cap * sizeof *r->rk);
    }
    size_t parts = n; /* part k is p[st[k], st[k + 1]) */
    for (size_t k = 0; k <= n; k++)
        r->st[k] = (uint32_t)k;
    for (size_t k = 0; k + 1 < parts; k++)
        r->rk[k] = tku_vocab_rank(r->v, p + k, 2);
    for (;;) {
        size_t best = parts;
        for (size_t k = 0; k + 1 < parts; k++)
            if (r->rk[k] != NO_RANK && (best == parts || r->rk[k] < r->rk[best]))
                best = k;
        if (best == parts)
            break;
        /* Parts best and best + 1 become one: drop the start of best + 1. */
        memmove(r->st + best + 1, r->st + best + 2, (parts - best - 1) * sizeof *r->st);
        memmove(r->rk + best, r->rk + best + 1, (parts - best - 2) * sizeof *r->rk);
        parts--;
        for (size_t k = best > 0 ? best - 1 : 0; k <= best && k + 1 < parts; k++)
            r->rk[k] = tku_vocab_rank(r->v, p + r->st[k], r->st[k + 2] - r->st[k]);
    }
    for (size_t k = 0; k < parts; k++) {
        uint32_t id = tku_vocab_rank(r->v, p + r->st[k], r->st[k + 1] - r->st[k]);
        FZ_ASSERT(id != NO_RANK, "reference: part of %u bytes is no token",
                  r->st[k + 1] - r->st[k]);
        ref_push(r, id, at + r->st[k]);
    }
}

/* Pre-tokenize and merge text[from, to). */
static void ref_stretch(tku_ref *r, const unsigned char *u, size_t from, size_t to, uint32_t base)
{
    size_t off = from;
    while (off < to) {
        int m = pcre2_match(r->re, u, to, off, 0, r->md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        FZ_ASSERT(m > 0, "reference: pcre2_match failed with %d at byte %zu", m, off);
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(r->md);
        FZ_ASSERT(ov[1] > ov[0], "the %s expression matched empty text at byte %zu",
                  bpe_kind_name(r->kind), (size_t)ov[0]);
        ref_merge(r, u + ov[0], ov[1] - ov[0], base + ov[0]);
        off = ov[1];
    }
}

void tku_ref_encode(tku_ref *r, const char *text, size_t len, bool specials, uint32_t base)
{
    const unsigned char *u = (const unsigned char *)text;
    r->n_out = 0;
    size_t from = 0;
    for (size_t i = 0; specials && i < len; i++) {
        const tku_special *best = NULL;
        for (size_t k = 0; k < r->n_sp; k++) {
            const tku_special *s = &r->sp[k];
            if (s->len <= len - i && memcmp(u + i, s->text, s->len) == 0 &&
                (best == NULL || s->len > best->len))
                best = s;
        }
        if (best == NULL)
            continue;
        ref_stretch(r, u, from, i, base);
        ref_push(r, best->id, base + i);
        i += best->len - 1;
        from = i + 1;
    }
    ref_stretch(r, u, from, len, base);
}

/* ---- checks ---------------------------------------------------------------------------- */

size_t tku_utf8_invalid_at(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t k;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            k = 2, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            k = 3, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            k = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return i;
        }
        if (n - i < k)
            return i;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return i;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return i;
        i += k;
    }
    return n;
}

void tku_check_tiling(const bpe *t, const char *text, size_t len, uint32_t base,
                      const uint32_t *ids, const uint32_t *offs, size_t n, const char *what)
{
    FZ_ASSERT(len == 0 || n > 0, "%s: %zu bytes of text gave no token", what, len);
    FZ_ASSERT(n == 0 || offs[0] == base, "%s: first token at %u, text starts at %u", what,
              n ? offs[0] : 0, base);
    for (size_t i = 0; i < n; i++) {
        size_t at = offs[i] - base;
        size_t end = i + 1 < n ? offs[i + 1] - base : len;
        FZ_ASSERT(offs[i] >= base && at < end && end <= len,
                  "%s: token %zu spans [%zu, %zu) of %zu bytes", what, i, at, end, len);
        const char *p;
        size_t tl;
        FZ_ASSERT(bpe_token_bytes(t, ids[i], &p, &tl), "%s: token %zu is id %u, which has no bytes",
                  what, i, ids[i]);
        FZ_ASSERT(tl == end - at && memcmp(p, text + at, tl) == 0,
                  "%s: token %zu (id %u, %zu bytes) is not the %zu bytes it spans at %zu", what, i,
                  ids[i], tl, end - at, at);
    }
}

void tku_check_ref(const tku_ref *r, const uint32_t *ids, const uint32_t *offs, size_t n,
                   const char *what)
{
    for (size_t i = 0; i < n && i < r->n_out; i++)
        FZ_ASSERT(ids[i] == r->ids[i] && offs[i] == r->offs[i],
                  "%s: token %zu is id %u at %u, the reference's id %u at %u", what, i, ids[i],
                  offs[i], r->ids[i], r->offs[i]);
    FZ_ASSERT(n == r->n_out, "%s: %zu tokens, the reference has %zu", what, n, r->n_out);
}
