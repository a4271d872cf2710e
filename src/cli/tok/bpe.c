/*
 * bpe.c - the byte-level BPE tokenizer of bpe.h: rank-file loader, special tokens, PCRE2
 * pre-tokenizer and the merge loop.
 *
 * Layout. The rank file's token bytes are decoded into one arena; token id r's bytes are
 * arena[off[r], off[r] + len[r]) (len 0: no token r). Lookup by bytes goes through an
 * open-addressing table of 8-byte slots { 32-bit hash tag, id + 1 } (0: empty), linear
 * probing, at most half full:
 *
 *     slots: [tag|id+1] [0|0] [tag|id+1] ...     hash = XXH3-64 of the bytes
 *                                                 slot = hash & mask, tag = hash >> 32
 *
 * Special tokens are kept sorted by first byte, longest first, with a 256-entry table of
 * the bytes that start one, so step 1 costs a table test per byte of text.
 *
 * Merging (step 3 of bpe.h). A piece of n bytes holds n parts; the pair (i, i+1) has the
 * rank of the concatenated bytes, or none. Pieces up to SMALL_PIECE bytes use tiktoken's
 * scan: find the lowest pair rank, merge, re-rank the two neighbouring pairs; O(n^2) but
 * n is small (words, numbers of 1-3 digits). Longer pieces (runs of spaces, long tokens of
 * punctuation or CJK) would make that quadratic, so they use a binary heap of candidate
 * pairs ordered by (rank, start) over a linked list of parts, with lazy deletion: an entry
 * is acted on only if its left part is alive and both parts still end where the entry
 * says. Both pick the same pair at every step (the lowest rank, the leftmost on a tie), so
 * both give the same tokens; the heap costs O(n log n).
 *
 * Invariants (bpe_check): every id with len > 0 is found by its bytes; the table is at
 * most half full; all 256 single bytes are tokens; specials are sorted as described and
 * no two share an id (so every id decodes to one text).
 * Cost: loading is one pass over the file (about 60 ms for o200k); encoding is one regex
 * pass plus one hash lookup for each piece that is a whole token, which most are.
 */
#include "bpe.h"
#include "cli.h"
#include "hftok.h"
#include "spm_shim.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "escape.h"

#define NO_RANK     UINT32_MAX
#define SMALL_PIECE 64         /* pieces up to this many bytes use the scan */
#define MAX_FILE    (1u << 30) /* largest rank file read */

/* Unicode White_Space, for \s in the expressions (as Rust's regex and tiktoken see it). */
#define WS                                                                                         \
    "\\t-\\r "                                                                                     \
    "\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define CONTRACTION "'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])"

/* cl100k_base and Llama 3: the same expression. */
static const char pat_cl100k[] = CONTRACTION "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
                                             "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
                                             "|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+";

/* o200k_base. */
#define O200K_UPPER "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define O200K_LOWER "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
static const char pat_o200k[] =
    "[^\\r\\n\\p{L}\\p{N}]?" O200K_UPPER "*" O200K_LOWER "+(?:" CONTRACTION ")?"
    "|[^\\r\\n\\p{L}\\p{N}]?" O200K_UPPER "+" O200K_LOWER "*(?:" CONTRACTION ")?"
    "|\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*"
    "|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+";

typedef struct special {
    char *text;  /* owned, NUL-terminated */
    size_t len;  /* bytes of text */
    uint32_t id; /* token id */
} special;

typedef struct slot {
    uint32_t tag; /* high 32 bits of the hash */
    uint32_t id1; /* token id + 1; 0 for an empty slot */
} slot;

/* A candidate merge in the heap: parts [left, mid) and [mid, end). */
typedef struct cand {
    uint32_t rank, left, mid, end;
} cand;

struct bpe {
    int kind;              /* BPE_* */
    hftok *hf;             /* BPE_HF: the tokenizer.json tokenizer every call forwards to */
    spm *sp;               /* BPE_SPM: the SentencePiece model every call forwards to */
    unsigned char *arena;  /* token bytes */
    uint32_t *off;         /* by id: offset in arena */
    uint32_t *len;         /* by id: byte length, 0 when the id is not a token */
    size_t n_ids;          /* entries of off and len: largest rank + 1 */
    size_t n_ranks;        /* tokens loaded */
    slot *slots;           /* hash table, mask + 1 slots */
    size_t mask;           /* slots - 1 (a power of two minus one) */
    special *specials;     /* sorted by first byte, then longest first */
    size_t n_specials;     /* entries of specials */
    bool starts[256];      /* bytes that begin some special */
    char *bos, *eos;       /* owned texts for the templates ("" when none) */
    pcre2_code *re;        /* the kind's expression */
    pcre2_match_data *md;  /* its match data */
    bool jit;              /* re was JIT-compiled */
    uint32_t *pos, *prank; /* merge scratch: part starts and pair ranks */
    uint32_t *nxt, *prv;   /* merge scratch (heap path): linked list by part start */
    cand *heap;            /* merge scratch (heap path) */
    size_t scratch_cap;    /* elements allocated in each scratch array */
    size_t heap_cap;       /* elements allocated at heap */
};

int bpe_kind_from_name(const char *name)
{
    if (name == NULL)
        return 0;
    if (strcmp(name, "llama3") == 0)
        return BPE_LLAMA3;
    if (strcmp(name, "cl100k") == 0)
        return BPE_CL100K;
    if (strcmp(name, "o200k") == 0)
        return BPE_O200K;
    return 0;
}

const char *bpe_kind_name(int kind)
{
    switch (kind) {
    case BPE_LLAMA3:
        return "llama3";
    case BPE_CL100K:
        return "cl100k";
    case BPE_O200K:
        return "o200k";
    case BPE_HF:
        return "tokenizer.json";
    case BPE_SPM:
        return "sentencepiece";
    default:
        return "?";
    }
}

/* ---- the rank table ------------------------------------------------------------------- */

static inline uint64_t hash_bytes(const void *p, size_t n)
{
    return XXH3_64bits(p, n);
}

/* The id of the token with bytes p[0, n), or NO_RANK. Cannot fail. */
static inline uint32_t rank_of(const bpe *t, const unsigned char *p, size_t n)
{
    uint64_t h = hash_bytes(p, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = (size_t)h & t->mask;; i = (i + 1) & t->mask) {
        const slot *s = &t->slots[i];
        if (s->id1 == 0)
            return NO_RANK;
        uint32_t id = s->id1 - 1;
        if (s->tag == tag && t->len[id] == n && memcmp(t->arena + t->off[id], p, n) == 0)
            return id;
    }
}

/* Insert id (its bytes already in the arena). Returns false when the bytes are already
 * there (the other id in *dup). The table has room (at most half full). */
static bool table_insert(bpe *t, uint32_t id, uint32_t *dup)
{
    const unsigned char *p = t->arena + t->off[id];
    size_t n = t->len[id];
    uint64_t h = hash_bytes(p, n);
    uint32_t tag = (uint32_t)(h >> 32);
    size_t i = (size_t)h & t->mask;
    for (; t->slots[i].id1 != 0; i = (i + 1) & t->mask) {
        uint32_t o = t->slots[i].id1 - 1;
        if (t->slots[i].tag == tag && t->len[o] == n && memcmp(t->arena + t->off[o], p, n) == 0) {
            *dup = o;
            return false;
        }
    }
    t->slots[i].tag = tag;
    t->slots[i].id1 = id + 1;
    return true;
}

/* ---- loading -------------------------------------------------------------------------- */

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* Decode standard base64 s[0, n) (padded to a multiple of 4) into out. Returns the number
 * of bytes, or -1 when s is not base64. out has room for n / 4 * 3 bytes. */
static long b64_decode(const char *s, size_t n, unsigned char *out)
{
    if (n == 0 || n % 4 != 0)
        return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            unsigned char c = (unsigned char)s[i + k];
            if (c == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
                continue;
            }
            if (pad > 0 || (v[k] = b64_value(c)) < 0)
                return -1;
        }
        uint32_t x =
            (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[o++] = (unsigned char)(x >> 16);
        if (pad < 2)
            out[o++] = (unsigned char)(x >> 8);
        if (pad < 1)
            out[o++] = (unsigned char)x;
    }
    return (long)o;
}

/* Read all of path into a NUL-terminated buffer. Returns BPE_OK or BPE_EIO/ENOMEM, or
 * BPE_EINPUT for a file over MAX_FILE bytes. */
static int read_file(const char *path, char **buf, size_t *len, char *err, size_t err_size)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        cli_errf(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        return BPE_EIO;
    }
    int r = cli_read_all(f, MAX_FILE, buf, len);
    int e = errno;
    fclose(f);
    switch (r) {
    case CLI_READ_OK:
        return BPE_OK;
    case CLI_READ_NOMEM:
        cli_errf(err, err_size, "%s: out of memory reading the rank file", path);
        return BPE_ENOMEM;
    case CLI_READ_TOOBIG:
        cli_errf(err, err_size, "%s: larger than %u bytes: not a rank file", path, MAX_FILE);
        return BPE_EINPUT;
    default:
        cli_errf(err, err_size, "%s: read error: %s", path, strerror(e));
        return BPE_EIO;
    }
}

/* One parsed line of a rank file. */
typedef struct rank_line {
    const char *b64; /* base64 text */
    size_t b64_len;  /* its bytes */
    uint32_t rank;   /* the rank */
} rank_line;

/* Parse line [p, e) (no newline) as "BASE64 RANK". Returns 0 or -1 with err set. */
static int parse_line(const char *path, size_t line_no, const char *p, const char *e, rank_line *l,
                      char *err, size_t err_size)
{
    if (e > p && e[-1] == '\r')
        e--;
    const char *sp = memchr(p, ' ', (size_t)(e - p));
    if (sp == NULL || sp == p || sp + 1 == e) {
        cli_errf(err, err_size, "%s:%zu: expected \"BASE64 RANK\"", path, line_no);
        return -1;
    }
    uint64_t r = 0;
    for (const char *q = sp + 1; q < e; q++) {
        if (*q < '0' || *q > '9' || r >= BPE_MAX_RANKS) {
            cli_errf(err, err_size, "%s:%zu: rank '%.*s' is not an integer below %u", path, line_no,
                     (int)(e - sp - 1 > 20 ? 20 : e - sp - 1), sp + 1, BPE_MAX_RANKS);
            return -1;
        }
        r = r * 10 + (uint64_t)(*q - '0');
    }
    if (r >= BPE_MAX_RANKS) {
        cli_errf(err, err_size, "%s:%zu: rank %llu is not below %u", path, line_no,
                 (unsigned long long)r, BPE_MAX_RANKS);
        return -1;
    }
    l->b64 = p;
    l->b64_len = (size_t)(sp - p);
    l->rank = (uint32_t)r;
    return 0;
}

/* Step 1 of loading: decode every line into the arena and the id arrays. */
static int load_ranks(bpe *t, const char *path, const char *buf, size_t n, char *err,
                      size_t err_size)
{
    size_t n_lines = 0;
    for (size_t i = 0; i < n; i++)
        n_lines += buf[i] == '\n';
    n_lines++;
    rank_line *lines = malloc(n_lines * sizeof *lines);
    t->arena = malloc(n / 4 * 3 + 1);
    if (lines == NULL || t->arena == NULL) {
        free(lines);
        cli_errf(err, err_size, "%s: out of memory", path);
        return BPE_ENOMEM;
    }
    size_t k = 0, line_no = 0;
    uint32_t max_rank = 0;
    for (const char *p = buf, *end = buf + n; p < end;) {
        const char *e = memchr(p, '\n', (size_t)(end - p));
        e = e ? e : end;
        line_no++;
        if (e > p && !(e == p + 1 && *p == '\r')) {
            if (parse_line(path, line_no, p, e, &lines[k], err, err_size) != 0) {
                free(lines);
                return BPE_EINPUT;
            }
            if (lines[k].rank > max_rank)
                max_rank = lines[k].rank;
            k++;
        }
        p = e + 1;
    }
    if (k == 0) {
        free(lines);
        cli_errf(err, err_size, "%s: no ranks: not a tiktoken rank file", path);
        return BPE_EINPUT;
    }
    t->n_ids = (size_t)max_rank + 1;
    t->off = calloc(t->n_ids, sizeof *t->off);
    t->len = calloc(t->n_ids, sizeof *t->len);
    if (t->off == NULL || t->len == NULL) {
        free(lines);
        cli_errf(err, err_size, "%s: out of memory", path);
        return BPE_ENOMEM;
    }
    size_t at = 0;
    line_no = 0;
    for (size_t i = 0; i < k; i++) {
        long m = b64_decode(lines[i].b64, lines[i].b64_len, t->arena + at);
        uint32_t r = lines[i].rank;
        if (m <= 0 || t->len[r] != 0) {
            cli_errf(err, err_size, "%s: rank %u: %s", path, r,
                     m <= 0 ? "token bytes are not base64" : "rank given twice");
            free(lines);
            return BPE_EINPUT;
        }
        t->off[r] = (uint32_t)at;
        t->len[r] = (uint32_t)m;
        at += (size_t)m;
    }
    t->n_ranks = k;
    free(lines);
    return BPE_OK;
}

/* Step 2 of loading: the hash table, and the single bytes. */
static int build_table(bpe *t, const char *path, char *err, size_t err_size)
{
    size_t cap = 1024;
    while (cap < 2 * t->n_ranks + 2)
        cap *= 2;
    t->slots = calloc(cap, sizeof *t->slots);
    if (t->slots == NULL) {
        cli_errf(err, err_size, "%s: out of memory", path);
        return BPE_ENOMEM;
    }
    t->mask = cap - 1;
    for (size_t id = 0; id < t->n_ids; id++) {
        uint32_t dup;
        if (t->len[id] != 0 && !table_insert(t, (uint32_t)id, &dup)) {
            cli_errf(err, err_size, "%s: ranks %u and %zu have the same bytes", path, dup, id);
            return BPE_EINPUT;
        }
    }
    for (unsigned b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        if (rank_of(t, &c, 1) == NO_RANK) {
            cli_errf(err, err_size, "%s: byte 0x%02x is not a token: not a byte-level BPE", path,
                     b);
            return BPE_EINPUT;
        }
    }
    return BPE_OK;
}

/* ---- special tokens ------------------------------------------------------------------- */

/* Add (or re-map) special token text -> id. Returns BPE_OK or BPE_ENOMEM. */
static int add_special(bpe *t, const char *text, size_t len, uint32_t id, size_t *cap)
{
    for (size_t i = 0; i < t->n_specials; i++)
        if (t->specials[i].len == len && memcmp(t->specials[i].text, text, len) == 0) {
            t->specials[i].id = id;
            return BPE_OK;
        }
    if (t->n_specials == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        special *ns = realloc(t->specials, nc * sizeof *ns);
        if (ns == NULL)
            return BPE_ENOMEM;
        t->specials = ns;
        *cap = nc;
    }
    char *c = malloc(len + 1);
    if (c == NULL)
        return BPE_ENOMEM;
    memcpy(c, text, len);
    c[len] = '\0';
    t->specials[t->n_specials++] = (special){c, len, id};
    return BPE_OK;
}

static int add_special_str(bpe *t, const char *text, uint32_t id, size_t *cap)
{
    return add_special(t, text, strlen(text), id, cap);
}

/* The kind's built-in special tokens (bpe.h). Returns BPE_OK or BPE_ENOMEM. */
static int kind_specials(bpe *t, size_t *cap)
{
    static const char *const llama3[] = {"<|begin_of_text|>",
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
    int rc = BPE_OK;
    switch (t->kind) {
    case BPE_LLAMA3:
        for (uint32_t i = 0; i < 11 && rc == BPE_OK; i++)
            rc = add_special_str(t, llama3[i], 128000 + i, cap);
        for (uint32_t i = 3; i <= 247 && rc == BPE_OK; i++) {
            char name[40];
            snprintf(name, sizeof name, "<|reserved_special_token_%u|>", i);
            rc = add_special_str(t, name, 128011 + (i - 3), cap);
        }
        break;
    case BPE_CL100K:
        rc = add_special_str(t, "<|endoftext|>", 100257, cap);
        rc = rc ? rc : add_special_str(t, "<|fim_prefix|>", 100258, cap);
        rc = rc ? rc : add_special_str(t, "<|fim_middle|>", 100259, cap);
        rc = rc ? rc : add_special_str(t, "<|fim_suffix|>", 100260, cap);
        rc = rc ? rc : add_special_str(t, "<|endofprompt|>", 100276, cap);
        break;
    case BPE_O200K:
        rc = add_special_str(t, "<|endoftext|>", 199999, cap);
        rc = rc ? rc : add_special_str(t, "<|endofprompt|>", 200018, cap);
        break;
    }
    return rc;
}

static int cmp_special(const void *a, const void *b)
{
    const special *x = a, *y = b;
    unsigned char cx = (unsigned char)x->text[0], cy = (unsigned char)y->text[0];
    if (cx != cy)
        return cx < cy ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return strcmp(x->text, y->text);
}

static void sort_specials(bpe *t)
{
    qsort(t->specials, t->n_specials, sizeof *t->specials, cmp_special);
    memset(t->starts, 0, sizeof t->starts);
    for (size_t i = 0; i < t->n_specials; i++)
        t->starts[(unsigned char)t->specials[i].text[0]] = true;
}

/* ---- the sidecar ---------------------------------------------------------------------- */

/* Read "bos_token"/"eos_token" of sidecar s into *dst. Returns BPE_OK or an error. */
static int sidecar_text(const json_t *s, const char *key, char **dst, const char *name, char *err,
                        size_t err_size)
{
    const json_t *v = json_object_get(s, key);
    if (v == NULL)
        return BPE_OK;
    if (!json_is_string(v) || json_string_length(v) == 0) {
        cli_errf(err, err_size, "%s: %s must be a non-empty string", name, key);
        return BPE_EINPUT;
    }
    char *c = strdup(json_string_value(v));
    if (c == NULL)
        return BPE_ENOMEM;
    free(*dst);
    *dst = c;
    return BPE_OK;
}

/* Read the sidecar name (if it exists): its kind into *kind when *kind is 0, its special
 * tokens and texts into t. Returns BPE_OK or an error with the message in err. */
static int read_sidecar(bpe *t, const char *name, int *kind, json_t **out, char *err,
                        size_t err_size)
{
    FILE *f = fopen(name, "rb");
    if (f == NULL) {
        if (errno == ENOENT)
            return BPE_OK;
        cli_errf(err, err_size, "%s: cannot open: %s", name, strerror(errno));
        return BPE_EIO;
    }
    json_error_t je;
    json_t *s = json_loadf(f, JSON_REJECT_DUPLICATES, &je);
    fclose(f);
    if (s == NULL || !json_is_object(s)) {
        cli_errf(err, err_size, "%s:%d: %s", name, s ? 1 : je.line,
                 s ? "the sidecar must be a JSON object" : je.text);
        json_decref(s);
        return BPE_EINPUT;
    }
    *out = s;
    const json_t *k = json_object_get(s, "kind");
    if (k != NULL) {
        int kk = json_is_string(k) ? bpe_kind_from_name(json_string_value(k)) : 0;
        if (kk == 0) {
            cli_errf(err, err_size, "%s: kind must be \"llama3\", \"cl100k\" or \"o200k\"", name);
            return BPE_EINPUT;
        }
        if (*kind == 0)
            *kind = kk;
    }
    const json_t *sp = json_object_get(s, "special_tokens");
    if (sp != NULL && !json_is_object(sp)) {
        cli_errf(err, err_size, "%s: special_tokens must be an object {\"text\": id, ...}", name);
        return BPE_EINPUT;
    }
    int rc = sidecar_text(s, "bos_token", &t->bos, name, err, err_size);
    return rc ? rc : sidecar_text(s, "eos_token", &t->eos, name, err, err_size);
}

/* Whether two specials share an id (the first such pair in *a, *b): then an id would not
 * name one text, and decoding would not give back the text. Cannot fail. */
static bool special_ids_clash(const bpe *t, size_t *a, size_t *b)
{
    for (size_t i = 0; i < t->n_specials; i++)
        for (size_t j = i + 1; j < t->n_specials; j++)
            if (t->specials[i].id == t->specials[j].id) {
                *a = i;
                *b = j;
                return true;
            }
    return false;
}

/* Add the sidecar's special tokens. Returns BPE_OK or an error. */
static int sidecar_specials(bpe *t, const json_t *s, const char *name, size_t *cap, char *err,
                            size_t err_size)
{
    const json_t *sp = json_object_get(s, "special_tokens");
    const char *text;
    const json_t *v;
    char q[260], q2[260]; /* texts quoted in a message (escape.h) */
    json_object_foreach((json_t *)sp, text, v)
    {
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= (json_int_t)BPE_MAX_RANKS || text[0] == '\0') {
            cli_errf(err, err_size,
                     "%s: special_tokens[\"%s\"] must be a non-empty text with an id below %u",
                     name, cli_quote_prefix(q, sizeof q, text, strlen(text), 60), BPE_MAX_RANKS);
            return BPE_EINPUT;
        }
        if ((size_t)id < t->n_ids && t->len[id] != 0) {
            cli_errf(err, err_size, "%s: special token \"%s\" takes id %lld of an ordinary token",
                     name, cli_quote_prefix(q, sizeof q, text, strlen(text), 60), (long long)id);
            return BPE_EINPUT;
        }
        if (add_special_str(t, text, (uint32_t)id, cap) != BPE_OK)
            return BPE_ENOMEM;
    }
    size_t a, b;
    if (special_ids_clash(t, &a, &b)) {
        const special *x = &t->specials[a], *y = &t->specials[b];
        cli_errf(err, err_size, "%s: special tokens \"%s\" and \"%s\" both have id %u", name,
                 cli_quote_prefix(q, sizeof q, x->text, x->len, 60),
                 cli_quote_prefix(q2, sizeof q2, y->text, y->len, 60), x->id);
        return BPE_EINPUT;
    }
    return BPE_OK;
}

/* ---- the expression ------------------------------------------------------------------- */

const char *bpe_pattern(int kind)
{
    if (kind == BPE_LLAMA3 || kind == BPE_CL100K)
        return pat_cl100k;
    return kind == BPE_O200K ? pat_o200k : NULL;
}

static int compile_pattern(bpe *t, char *err, size_t err_size)
{
    const char *pat = bpe_pattern(t->kind);
    int ec;
    PCRE2_SIZE eo;
    t->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo,
                          NULL);
    if (t->re == NULL) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        cli_errf(err, err_size, "internal error: the %s expression does not compile at %zu: %s",
                 bpe_kind_name(t->kind), (size_t)eo, (const char *)msg);
        return BPE_EINPUT;
    }
    t->jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    t->md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (t->md == NULL) {
        cli_errf(err, err_size, "out of memory");
        return BPE_ENOMEM;
    }
    return BPE_OK;
}

/* ---- load / free ---------------------------------------------------------------------- */

/* The kind a rank file without a sidecar names by its size: each published file has its
 * own number of ranks (Llama 3 128000, cl100k_base 100256, o200k_base 199998); 0 for any
 * other. Cannot fail. */
static int kind_from_size(size_t n_ranks)
{
    return n_ranks == 128000   ? BPE_LLAMA3
           : n_ranks == 100256 ? BPE_CL100K
           : n_ranks == 199998 ? BPE_O200K
                               : 0;
}

/* Steps 3-4 of loading: the sidecar, the specials, the bos/eos defaults, the expression. */
static int load_rest(bpe *t, const char *path, int kind, char *err, size_t err_size)
{
    size_t name_len = strlen(path) + 6;
    char *name = malloc(name_len);
    if (name == NULL)
        return BPE_ENOMEM;
    snprintf(name, name_len, "%s.json", path);
    json_t *s = NULL;
    int rc = read_sidecar(t, name, &kind, &s, err, err_size);
    if (rc == BPE_OK && kind == 0)
        kind = kind_from_size(t->n_ranks);
    if (rc == BPE_OK && kind == 0) {
        cli_errf(
            err, err_size,
            "%s: the tokenizer kind is not known: give --tokenizer-kind llama3|cl100k|o200k or "
            "\"kind\" in %s",
            path, name);
        rc = BPE_EINPUT;
    }
    size_t cap = 0;
    if (rc == BPE_OK) {
        t->kind = kind;
        rc = kind_specials(t, &cap);
    }
    if (rc == BPE_OK && s != NULL)
        rc = sidecar_specials(t, s, name, &cap, err, err_size);
    json_decref(s);
    free(name);
    if (rc == BPE_ENOMEM)
        cli_errf(err, err_size, "%s: out of memory", path);
    if (rc != BPE_OK)
        return rc;
    sort_specials(t);
    if (t->bos == NULL)
        t->bos = strdup(kind == BPE_LLAMA3 ? "<|begin_of_text|>" : "");
    if (t->eos == NULL)
        t->eos = strdup(kind == BPE_LLAMA3 ? "<|eot_id|>" : "");
    if (t->bos == NULL || t->eos == NULL) {
        cli_errf(err, err_size, "%s: out of memory", path);
        return BPE_ENOMEM;
    }
    return compile_pattern(t, err, err_size);
}

/* Whether path names a Hugging Face tokenizer: a folder holding tokenizer.json, or a file
 * whose first non-blank byte is '{'. Sets json (tokenizer.json's path) and cfg
 * (tokenizer_config.json beside it). Returns 1 yes, 0 no (a rank file), or an error. */
static int hf_paths(const char *path, char *json, size_t jsize, char *cfg, size_t csize, char *err,
                    size_t err_size)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        cli_errf(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        return BPE_EIO;
    }
    if (S_ISDIR(st.st_mode)) {
        snprintf(json, jsize, "%s/tokenizer.json", path);
        snprintf(cfg, csize, "%s/tokenizer_config.json", path);
        if (stat(json, &st) == 0)
            return 1;
        snprintf(json, jsize, "%s/tokenizer.model", path);
        if (stat(json, &st) == 0)
            return 2; /* tokenizer.model: a tiktoken file (Llama 3) or SentencePiece */
        cli_errf(err, err_size, "%s: a folder without tokenizer.json (or tokenizer.model)", path);
        return BPE_EINPUT;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        cli_errf(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        return BPE_EIO;
    }
    int c;
    while ((c = getc(f)) == ' ' || c == '\n' || c == '\r' || c == '\t')
        ;
    fclose(f);
    if (c != '{')
        return 0;
    snprintf(json, jsize, "%s", path);
    const char *slash = strrchr(path, '/');
    snprintf(cfg, csize, "%.*stokenizer_config.json", slash ? (int)(slash - path + 1) : 0, path);
    return 1;
}

/* Load a tokenizer.json (and its config) as a BPE_HF tokenizer. */
static int load_hf(const char *json, const char *cfg, bpe **out, char *err, size_t err_size)
{
    bpe *t = calloc(1, sizeof *t);
    if (t == NULL) {
        cli_errf(err, err_size, "%s: out of memory", json);
        return BPE_ENOMEM;
    }
    int rc = hf_load(json, cfg, &t->hf, err, err_size);
    if (rc != 0) {
        free(t);
        return rc == -2 ? BPE_EIO : rc == -3 ? BPE_ENOMEM : BPE_EINPUT;
    }
    t->kind = BPE_HF;
    t->n_ranks = hf_n_tokens(t->hf);
    *out = t;
    return BPE_OK;
}

/* Load a SentencePiece model as a BPE_SPM tokenizer. */
static int load_spm(const char *path, int kind, bpe **out, char *err, size_t err_size)
{
    if (kind != 0) {
        cli_errf(err, err_size,
                 "%s: a SentencePiece model: --tokenizer-kind is for tiktoken rank "
                 "files",
                 path);
        return BPE_EINPUT;
    }
    bpe *t = calloc(1, sizeof *t);
    if (t == NULL) {
        cli_errf(err, err_size, "%s: out of memory", path);
        return BPE_ENOMEM;
    }
    int rc = spm_load(path, &t->sp, err, err_size);
    if (rc != 0) {
        free(t);
        return rc == -3 ? BPE_ENOMEM : BPE_EINPUT;
    }
    t->kind = BPE_SPM;
    t->n_ranks = spm_n_pieces(t->sp);
    *out = t;
    return BPE_OK;
}

/* Steps: 0 a Hugging Face tokenizer goes to hftok.h; for a rank file 1 decode the ranks,
 * 2 build the table, 3 sidecar and specials, 4 the expression. */
int bpe_load(const char *path, int kind, bpe **out, char *err, size_t err_size)
{
    if (kind < 0 || kind > BPE_O200K || path == NULL || out == NULL) {
        cli_errf(err, err_size, "internal error: bad arguments to bpe_load");
        return BPE_EINPUT;
    }
    /* Step 0: */
    char json[4096], cfg[4096];
    int hf = hf_paths(path, json, sizeof json, cfg, sizeof cfg, err, err_size);
    if (hf < 0)
        return hf;
    if (hf == 1) {
        if (kind != 0) {
            cli_errf(err, err_size,
                     "%s: a tokenizer.json tokenizer: --tokenizer-kind is for "
                     "tiktoken rank files",
                     path);
            return BPE_EINPUT;
        }
        return load_hf(json, cfg, out, err, err_size);
    }
    if (hf == 2)
        path = json;
    char *buf;
    size_t n;
    int rc = read_file(path, &buf, &n, err, err_size);
    if (rc != BPE_OK)
        return rc;
    /* A SentencePiece model is protobuf: field 1 (0x0a) first, NUL bytes in its scores. */
    if (n >= 2 && buf[0] == 0x0a && memchr(buf, 0, n > 256 ? 256 : n) != NULL) {
        free(buf);
        return load_spm(path, kind, out, err, err_size);
    }
    bpe *t = calloc(1, sizeof *t);
    if (t == NULL) {
        free(buf);
        cli_errf(err, err_size, "%s: out of memory", path);
        return BPE_ENOMEM;
    }
    /* Step 1: */
    rc = load_ranks(t, path, buf, n, err, err_size);
    free(buf);
    /* Step 2: */
    if (rc == BPE_OK)
        rc = build_table(t, path, err, err_size);
    /* Steps 3 and 4: */
    if (rc == BPE_OK)
        rc = load_rest(t, path, kind, err, err_size);
    if (rc != BPE_OK) {
        bpe_free(t);
        return rc;
    }
    *out = t;
    return BPE_OK;
}

void bpe_free(bpe *t)
{
    if (t == NULL)
        return;
    hf_free(t->hf);
    spm_free(t->sp);
    for (size_t i = 0; i < t->n_specials; i++)
        free(t->specials[i].text);
    free(t->specials);
    free(t->arena);
    free(t->off);
    free(t->len);
    free(t->slots);
    free(t->bos);
    free(t->eos);
    pcre2_match_data_free(t->md);
    pcre2_code_free(t->re);
    free(t->pos);
    free(t->prank);
    free(t->nxt);
    free(t->prv);
    free(t->heap);
    free(t);
}

int bpe_kind(const bpe *t)
{
    return t->kind;
}

size_t bpe_n_ranks(const bpe *t)
{
    return t->n_ranks;
}

const char *bpe_bos(const bpe *t)
{
    return t->hf ? hf_bos(t->hf) : t->sp ? spm_bos(t->sp) : t->bos;
}

const char *bpe_eos(const bpe *t)
{
    return t->hf ? hf_eos(t->hf) : t->sp ? spm_eos(t->sp) : t->eos;
}

const char *bpe_form(const bpe *t)
{
    return t->hf ? hf_form(t->hf) : t->sp ? "SentencePiece model" : "tiktoken ranks";
}

const char *bpe_chat_template(const bpe *t)
{
    return t->hf ? hf_chat_template(t->hf) : "";
}

bool bpe_special(const bpe *t, const char *text, size_t len, uint32_t *id)
{
    if (t->hf)
        return hf_added(t->hf, text, len, id);
    if (t->sp)
        return spm_special(t->sp, text, len, id);
    for (size_t i = 0; i < t->n_specials; i++)
        if (t->specials[i].len == len && memcmp(t->specials[i].text, text, len) == 0) {
            if (id != NULL)
                *id = t->specials[i].id;
            return true;
        }
    return false;
}

bool bpe_token_bytes(const bpe *t, uint32_t id, const char **p, size_t *len)
{
    if (t->hf)
        return hf_token_bytes(t->hf, id, p, len);
    if (t->sp)
        return spm_token_bytes(t->sp, id, p, len);
    if (id < t->n_ids && t->len[id] != 0) {
        *p = (const char *)t->arena + t->off[id];
        *len = t->len[id];
        return true;
    }
    for (size_t i = 0; i < t->n_specials; i++)
        if (t->specials[i].id == id) {
            *p = t->specials[i].text;
            *len = t->specials[i].len;
            return true;
        }
    return false;
}

void bpe_out_free(bpe_out *out)
{
    if (out == NULL)
        return;
    free(out->ids);
    free(out->offsets);
    memset(out, 0, sizeof *out);
}

/* ---- encoding ------------------------------------------------------------------------- */

/* Make room for need more tokens in out. Returns false on out of memory. */
static bool out_reserve(bpe_out *out, size_t need)
{
    if (out->n + need <= out->cap)
        return true;
    size_t cap = out->cap ? out->cap : 256;
    while (cap < out->n + need)
        cap *= 2;
    uint32_t *ids = realloc(out->ids, cap * sizeof *ids);
    if (ids == NULL)
        return false;
    out->ids = ids;
    uint32_t *offs = realloc(out->offsets, cap * sizeof *offs);
    if (offs == NULL)
        return false;
    out->offsets = offs;
    out->cap = cap;
    return true;
}

static inline void out_push(bpe_out *out, uint32_t id, uint32_t offset)
{
    out->ids[out->n] = id;
    out->offsets[out->n] = offset;
    out->n++;
}

/* Make the merge scratch hold n + 1 entries. Returns false on out of memory. */
static bool scratch_reserve(bpe *t, size_t n)
{
    if (n + 1 <= t->scratch_cap)
        return true;
    size_t cap = t->scratch_cap ? t->scratch_cap : 256;
    while (cap < n + 1)
        cap *= 2;
    uint32_t **arrs[4] = {&t->pos, &t->prank, &t->nxt, &t->prv};
    for (int i = 0; i < 4; i++) {
        uint32_t *a = realloc(*arrs[i], cap * sizeof **arrs[i]);
        if (a == NULL)
            return false;
        *arrs[i] = a;
    }
    t->scratch_cap = cap;
    return true;
}

/* Merge a piece of n (2..SMALL_PIECE) bytes by tiktoken's scan and append its tokens. */
static void merge_scan(bpe *t, const unsigned char *p, size_t n, uint32_t at, bpe_out *out)
{
    uint32_t *pos = t->pos, *rk = t->prank;
    size_t parts = n;
    for (size_t i = 0; i <= n; i++)
        pos[i] = (uint32_t)i;
    for (size_t i = 0; i + 1 < n; i++)
        rk[i] = rank_of(t, p + i, 2);
    while (parts > 1) {
        uint32_t best = NO_RANK;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < parts; i++)
            if (rk[i] < best) {
                best = rk[i];
                bi = i;
            }
        if (best == NO_RANK)
            break;
        memmove(pos + bi + 1, pos + bi + 2, (parts - bi - 1) * sizeof *pos);
        if (bi + 3 <= parts)
            memmove(rk + bi + 1, rk + bi + 2, (parts - bi - 3) * sizeof *rk);
        parts--;
        rk[bi] = bi + 1 < parts ? rank_of(t, p + pos[bi], pos[bi + 2] - pos[bi]) : NO_RANK;
        if (bi > 0)
            rk[bi - 1] = rank_of(t, p + pos[bi - 1], pos[bi + 1] - pos[bi - 1]);
    }
    for (size_t i = 0; i < parts; i++)
        out_push(out, rank_of(t, p + pos[i], pos[i + 1] - pos[i]), at + pos[i]);
}

static inline bool cand_less(const cand *a, const cand *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

static void heap_push(cand *h, size_t *n, cand c)
{
    size_t i = (*n)++;
    while (i > 0 && cand_less(&c, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n)
{
    cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c]))
            c++;
        if (!cand_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

/* Push the pair starting at part l (ending where its next part ends), if it is a token. */
static void push_pair(bpe *t, const unsigned char *p, size_t n, uint32_t l, size_t *hn)
{
    uint32_t m = t->nxt[l];
    if (m >= n)
        return;
    uint32_t e = t->nxt[m];
    uint32_t r = rank_of(t, p + l, e - l);
    if (r != NO_RANK)
        heap_push(t->heap, hn, (cand){r, l, m, e});
}

/* Merge a long piece with the heap (same result as merge_scan). The heap never holds more
 * than 3n entries: n - 1 pairs to start, at most two pushes per merge and n - 1 merges.
 * Returns false on out of memory. Parts are named by their first byte: nxt[s] is the next part's
 * start (n at the end), prv[s] the previous one's (UINT32_MAX at the start); a merged-away part has
 * prv == nxt == s. */
static bool merge_heap(bpe *t, const unsigned char *p, size_t n, uint32_t at, bpe_out *out)
{
    if (t->heap_cap < 3 * n) {
        cand *h = realloc(t->heap, 3 * n * sizeof *h);
        if (h == NULL)
            return false;
        t->heap = h;
        t->heap_cap = 3 * n;
    }
    for (size_t i = 0; i < n; i++) {
        t->nxt[i] = (uint32_t)i + 1;
        t->prv[i] = i == 0 ? UINT32_MAX : (uint32_t)i - 1;
    }
    size_t hn = 0;
    for (uint32_t i = 0; i + 1 < n; i++)
        push_pair(t, p, n, i, &hn);
    while (hn > 0) {
        cand c = heap_pop(t->heap, &hn);
        bool dead = t->nxt[c.left] == c.left && t->prv[c.left] == c.left;
        if (dead || t->nxt[c.left] != c.mid || t->nxt[c.mid] != c.end)
            continue;
        t->nxt[c.left] = c.end;
        if (c.end < n)
            t->prv[c.end] = c.left;
        t->nxt[c.mid] = t->prv[c.mid] = c.mid;
        push_pair(t, p, n, c.left, &hn);
        if (t->prv[c.left] != UINT32_MAX)
            push_pair(t, p, n, t->prv[c.left], &hn);
    }
    for (uint32_t s = 0; s < n; s = t->nxt[s])
        out_push(out, rank_of(t, p + s, t->nxt[s] - s), at + s);
    return true;
}

/* Append the tokens of one piece p[0, n) starting at text offset at. Returns BPE_OK or
 * BPE_ENOMEM. */
static int encode_piece(bpe *t, const unsigned char *p, size_t n, uint32_t at, bpe_out *out)
{
    if (!out_reserve(out, n))
        return BPE_ENOMEM;
    uint32_t id = rank_of(t, p, n);
    if (id != NO_RANK) {
        out_push(out, id, at);
        return BPE_OK;
    }
    if (!scratch_reserve(t, n))
        return BPE_ENOMEM;
    if (n <= SMALL_PIECE) {
        merge_scan(t, p, n, at, out);
        return BPE_OK;
    }
    return merge_heap(t, p, n, at, out) ? BPE_OK : BPE_ENOMEM;
}

/* Length of a valid UTF-8 sequence at s[0, n), or 0 when it is not valid. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (k == 0 || c > 0xF4 || k > n)
        return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] >= 0xA0) || (c == 0xF0 && s[1] < 0x90) ||
        (c == 0xF4 && s[1] >= 0x90))
        return 0; /* overlong, surrogate, or above U+10FFFF */
    return k;
}

/* Offset of the first invalid UTF-8 byte in s[0, n), or n. Cannot fail. */
static size_t utf8_invalid_at(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_seq(s + i, n - i);
        if (k == 0)
            return i;
        i += k;
    }
    return n;
}

/* Step 2 and 3 for text[from, to): split with the expression, merge each piece. */
static int encode_stretch(bpe *t, const char *text, size_t from, size_t to, uint32_t base,
                          bpe_out *out, char *err, size_t err_size)
{
    const unsigned char *u = (const unsigned char *)text;
    size_t off = from;
    while (off < to) {
        int m = t->jit ? pcre2_jit_match(t->re, u, to, off, PCRE2_NO_UTF_CHECK, t->md, NULL)
                       : pcre2_match(t->re, u, to, off, PCRE2_NO_UTF_CHECK, t->md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof msg);
            cli_errf(err, err_size, "pre-tokenizer failed at byte %zu: %s", off, (const char *)msg);
            return BPE_EINPUT;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) {
            off = ms + (ms < to ? utf8_seq(u + ms, to - ms) : 1);
            continue;
        }
        if (encode_piece(t, u + ms, me - ms, base + (uint32_t)ms, out) != BPE_OK) {
            cli_errf(err, err_size, "out of memory encoding %zu bytes", to - from);
            return BPE_ENOMEM;
        }
        off = me;
    }
    return BPE_OK;
}

/* The special token starting at u[i] (within n bytes), or NULL. */
static const special *special_at(const bpe *t, const unsigned char *u, size_t i, size_t n)
{
    for (size_t k = 0; k < t->n_specials; k++) {
        const special *s = &t->specials[k];
        unsigned char c = (unsigned char)s->text[0];
        if (c < u[i])
            continue;
        if (c > u[i])
            break;
        if (s->len <= n - i && memcmp(u + i, s->text, s->len) == 0)
            return s;
    }
    return NULL;
}

/* Forward to hftok.h; its codes become BPE_* codes. */
static int encode_hf(bpe *t, const char *text, size_t len, bool specials, bool add_special,
                     uint32_t base, bpe_out *out, char *err, size_t err_size)
{
    int rc = hf_encode(t->hf, text, len, specials, add_special, base, &out->ids, &out->offsets,
                       &out->n, &out->cap, err, err_size);
    return rc == 0 ? BPE_OK : rc == -3 ? BPE_ENOMEM : BPE_EINPUT;
}

int bpe_encode_post(bpe *t, const char *text, size_t len, uint32_t base, bpe_out *out, char *err,
                    size_t err_size)
{
    size_t bad = utf8_invalid_at((const unsigned char *)text, len);
    if (bad < len) {
        cli_errf(err, err_size, "the text is not valid UTF-8 at byte %zu", bad);
        return BPE_EINPUT;
    }
    if (t->hf)
        return encode_hf(t, text, len, true, true, base, out, err, err_size);
    return bpe_encode(t, text, len, true, base, out, err, err_size);
}

int bpe_encode(bpe *t, const char *text, size_t len, bool specials, uint32_t base, bpe_out *out,
               char *err, size_t err_size)
{
    const unsigned char *u = (const unsigned char *)text;
    size_t bad = utf8_invalid_at(u, len);
    if (bad < len) {
        cli_errf(err, err_size, "the text is not valid UTF-8 at byte %zu", bad);
        return BPE_EINPUT;
    }
    if (t->hf)
        return encode_hf(t, text, len, specials, false, base, out, err, err_size);
    if (t->sp)
        return spm_encode(t->sp, text, len, specials, base, &out->ids, &out->offsets, &out->n,
                          &out->cap, err, err_size) == 0
                   ? BPE_OK
                   : BPE_ENOMEM;
    size_t from = 0;
    for (size_t i = 0; specials && i < len; i++) {
        if (!t->starts[u[i]])
            continue;
        const special *s = special_at(t, u, i, len);
        if (s == NULL)
            continue;
        int rc = encode_stretch(t, text, from, i, base, out, err, err_size);
        if (rc != BPE_OK)
            return rc;
        if (!out_reserve(out, 1)) {
            cli_errf(err, err_size, "out of memory encoding %zu bytes", len);
            return BPE_ENOMEM;
        }
        out_push(out, s->id, base + (uint32_t)i);
        i += s->len - 1;
        from = i + 1;
    }
    return encode_stretch(t, text, from, len, base, out, err, err_size);
}

int bpe_check(const bpe *t, char *err, size_t err_size)
{
    if (t->hf)
        return hf_check(t->hf, err, err_size);
    if (t->sp)
        return 0; /* the library keeps its own tables */
    size_t used = 0;
    for (size_t i = 0; i <= t->mask; i++)
        used += t->slots[i].id1 != 0;
    if (used != t->n_ranks || 2 * used > t->mask + 1) {
        cli_errf(err, err_size, "table holds %zu of %zu ranks in %zu slots", used, t->n_ranks,
                 t->mask + 1);
        return -1;
    }
    for (size_t id = 0; id < t->n_ids; id++)
        if (t->len[id] != 0 && rank_of(t, t->arena + t->off[id], t->len[id]) != id) {
            cli_errf(err, err_size, "token %zu is not found by its bytes", id);
            return -1;
        }
    for (unsigned b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        if (rank_of(t, &c, 1) == NO_RANK) {
            cli_errf(err, err_size, "byte 0x%02x is not a token", b);
            return -1;
        }
    }
    for (size_t i = 0; i < t->n_specials; i++) {
        if (i > 0 && cmp_special(&t->specials[i - 1], &t->specials[i]) >= 0) {
            cli_errf(err, err_size, "specials %zu and %zu are out of order", i - 1, i);
            return -1;
        }
        if (!t->starts[(unsigned char)t->specials[i].text[0]]) {
            cli_errf(err, err_size, "special %zu's first byte is not marked", i);
            return -1;
        }
    }
    size_t a, b;
    if (special_ids_clash(t, &a, &b)) {
        cli_errf(err, err_size, "specials %zu and %zu have the same id %u", a, b,
                 t->specials[a].id);
        return -1;
    }
    return 0;
}
