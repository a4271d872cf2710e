/*
 * hftok_pre.c - the normalizers and pre-tokenizers of a Hugging Face tokenizer.json
 * (hftok.h lists them): parsing each from its JSON, and running them over an hf_buf
 * (hftok_int.h), a text whose every byte remembers the byte of the input it came from.
 *
 * Each step reads one hf_buf and writes the next into a scratch hf_buf, then the two are
 * swapped, so a step may rewrite text (Replace, Prepend, Metaspace, NFC) and cut pieces in
 * one pass. Split follows the tokenizers library's rules for each behaviour exactly
 * (MergedWithPrevious joins a match to the piece before it unless that was a match too,
 * and so on), since a different grouping changes the tokens.
 *
 * Regular expressions: the file's Onig-flavoured patterns go to PCRE2 with UTF and
 * Unicode properties; \s and \S are rewritten to Unicode White_Space (Onig's meaning:
 * U+0085 is whitespace, U+FEFF is not), which PCRE2's \s does not give.
 *
 * Unicode normalization (NFC, NFKC, NFD, NFKD) uses utf8proc. A stretch that the form
 * leaves as it is (the common case, one call) keeps exact origins; otherwise each run
 * from one ASCII byte to the next is normalized on its own (no form combines a character
 * with an ASCII character before it), and a run that changed maps wholly to its start.
 *
 * Cost: one pass per step over the text; the regex steps cost what PCRE2 (JIT) costs.
 */
#include "hftok_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* Unicode White_Space, as Onig's \s. */
#define WS                                                                                         \
    "\\t-\\r "                                                                                     \
    "\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* GPT-2's expression, for ByteLevel with use_regex. */
static const char gpt2_pat[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* The first occurrence of needle[0, m) in hay[0, n), or NULL (memmem is not POSIX). */
static const char *find_bytes(const char *hay, size_t n, const char *needle, size_t m)
{
    if (m == 0 || m > n)
        return NULL;
    for (const char *p = hay; (p = memchr(p, needle[0], (size_t)(hay + n - m + 1 - p))) != NULL;
         p++)
        if (memcmp(p, needle, m) == 0)
            return p;
    return NULL;
}

/* ---- buffers ---------------------------------------------------------------------------- */

bool hfb_reserve(hf_buf *b, size_t need)
{
    if (need <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap *= 2;
    char *s = realloc(b->s, cap);
    if (s == NULL)
        return false;
    b->s = s;
    uint32_t *o = realloc(b->org, cap * sizeof *o);
    if (o == NULL)
        return false;
    b->org = o;
    b->cap = cap;
    return true;
}

bool hfb_reserve_cuts(hf_buf *b, size_t need)
{
    if (need <= b->cutcap)
        return true;
    size_t cap = b->cutcap ? b->cutcap : 16;
    while (cap < need)
        cap *= 2;
    uint32_t *c = realloc(b->cut, cap * sizeof *c);
    if (c == NULL)
        return false;
    b->cut = c;
    b->cutcap = cap;
    return true;
}

void hfb_free(hf_buf *b)
{
    free(b->s);
    free(b->org);
    free(b->cut);
    memset(b, 0, sizeof *b);
}

static void swap_buf(hf_buf *a, hf_buf *b)
{
    hf_buf t = *a;
    *a = *b;
    *b = t;
}

/* Start writing into o: empty text, one cut at 0. */
static bool out_begin(hf_buf *o)
{
    o->n = 0;
    o->ncut = 0;
    if (!hfb_reserve_cuts(o, 1))
        return false;
    o->cut[o->ncut++] = 0;
    return true;
}

/* Append bytes p[0, n) with origins org (or all origin one when org is NULL). */
static bool out_bytes(hf_buf *o, const char *p, size_t n, const uint32_t *org, uint32_t one)
{
    if (!hfb_reserve(o, o->n + n))
        return false;
    memcpy(o->s + o->n, p, n);
    for (size_t i = 0; i < n; i++)
        o->org[o->n + i] = org ? org[i] : one;
    o->n += n;
    return true;
}

/* End the current piece (nothing when it is empty). */
static bool out_cut(hf_buf *o)
{
    if (o->cut[o->ncut - 1] == o->n)
        return true;
    if (!hfb_reserve_cuts(o, o->ncut + 1))
        return false;
    o->cut[o->ncut++] = (uint32_t)o->n;
    return true;
}

/* Copy b[from, to) as text of the current piece. */
static bool out_copy(hf_buf *o, const hf_buf *b, size_t from, size_t to)
{
    return out_bytes(o, b->s + from, to - from, b->org + from, 0);
}

/* ---- GPT-2 bytes ------------------------------------------------------------------------- */

size_t hfp_byte_char(unsigned char b, char out[2])
{
    unsigned cp;
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae))
        cp = b;
    else if (b <= 0x20)
        cp = 256 + b;
    else if (b <= 0xa0)
        cp = 256 + 33 + (b - 0x7f); /* 0x7f..0xa0 follow the 33 bytes 0..0x20 */
    else
        cp = 256 + 33 + 34; /* 0xad */
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

/* ---- regular expressions -------------------------------------------------------------- */

pcre2_code *hfp_compile(const char *pat, size_t len, char *err, size_t err_size)
{
    /* Rewrite \s and \S to White_Space; inside a class \S cannot be written that way. */
    size_t cap = len * 8 + 256;
    char *p = malloc(cap);
    if (p == NULL) {
        snprintf(err, err_size, "out of memory");
        return NULL;
    }
    size_t n = 0;
    bool in_class = false;
    for (size_t i = 0; i < len; i++) {
        char c = pat[i];
        if (n + sizeof WS + 8 >= cap) {
            free(p);
            snprintf(err, err_size, "regular expression too long");
            return NULL;
        }
        if (c == '\\' && i + 1 < len) {
            char d = pat[i + 1];
            i++;
            if (d == 's') {
                n += (size_t)sprintf(p + n, in_class ? "%s" : "[%s]", WS);
            } else if (d == 'S') {
                if (in_class) {
                    free(p);
                    snprintf(err, err_size, "\\S inside a character class is not supported");
                    return NULL;
                }
                n += (size_t)sprintf(p + n, "[^%s]", WS);
            } else {
                p[n++] = '\\';
                p[n++] = d;
            }
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = true;
            p[n++] = c;
            if (i + 1 < len && pat[i + 1] == '^')
                p[n++] = pat[++i];
            if (i + 1 < len && pat[i + 1] == ']') /* a leading ] is literal */
                p[n++] = pat[++i];
            continue;
        }
        if (c == ']' && in_class)
            in_class = false;
        p[n++] = c;
    }
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)p, n, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    free(p);
    if (re == NULL) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        snprintf(err, err_size, "regular expression does not compile: %s", (const char *)msg);
        return NULL;
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}

/* ---- parsing ------------------------------------------------------------------------------ */

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d != NULL) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* A {"String": s} or {"Regex": r} pattern: sets *lit (String) or *re (Regex). */
static int parse_pattern(const json_t *pat, const char *what, char **lit, size_t *litlen,
                         pcre2_code **re, char *err, size_t err_size)
{
    const json_t *s = json_object_get(pat, "String");
    const json_t *r = json_object_get(pat, "Regex");
    if (json_is_string(s)) {
        *litlen = json_string_length(s);
        if (*litlen == 0) {
            snprintf(err, err_size, "%s: empty String pattern", what);
            return -1;
        }
        *lit = dup_n(json_string_value(s), *litlen);
        return *lit ? 0 : -3;
    }
    if (json_is_string(r) && re != NULL) {
        char msg[200];
        *re = hfp_compile(json_string_value(r), json_string_length(r), msg, sizeof msg);
        if (*re == NULL) {
            snprintf(err, err_size, "%s: %s", what, msg);
            return -1;
        }
        return 0;
    }
    snprintf(err, err_size, "%s: the pattern is not a String%s", what, re ? " or a Regex" : "");
    return -1;
}

static bool grow(void **v, size_t n, size_t size)
{
    /* Arrays grow one step at a time: the chains are a handful of steps long. */
    void *p = realloc(*v, (n + 1) * size);
    if (p == NULL)
        return false;
    *v = p;
    return true;
}

static bool jbool(const json_t *o, const char *k, bool dflt)
{
    const json_t *v = json_object_get(o, k);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

int hfp_parse_norm(const json_t *j, hf_norm **v, size_t *n, char *err, size_t err_size)
{
    if (j == NULL || json_is_null(j))
        return 0;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (type == NULL) {
        snprintf(err, err_size, "a normalizer without a \"type\"");
        return -1;
    }
    if (strcmp(type, "Sequence") == 0) {
        const json_t *a = json_object_get(j, "normalizers");
        if (!json_is_array(a)) {
            snprintf(err, err_size, "normalizer Sequence without a \"normalizers\" array");
            return -1;
        }
        size_t i;
        const json_t *x;
        json_array_foreach(a, i, x)
        {
            int rc = hfp_parse_norm(x, v, n, err, err_size);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    hf_norm m = {0};
    if (strcmp(type, "NFC") == 0)
        m.type = HN_NFC;
    else if (strcmp(type, "NFKC") == 0)
        m.type = HN_NFKC;
    else if (strcmp(type, "NFD") == 0)
        m.type = HN_NFD;
    else if (strcmp(type, "NFKD") == 0)
        m.type = HN_NFKD;
    else if (strcmp(type, "Replace") == 0) {
        m.type = HN_REPLACE;
        const json_t *c = json_object_get(j, "content");
        if (!json_is_string(c)) {
            snprintf(err, err_size, "normalizer Replace without a \"content\" string");
            return -1;
        }
        int rc = parse_pattern(json_object_get(j, "pattern"), "normalizer Replace", &m.a, &m.alen,
                               NULL, err, err_size);
        if (rc != 0)
            return rc;
        m.blen = json_string_length(c);
        m.b = dup_n(json_string_value(c), m.blen);
        if (m.b == NULL) {
            free(m.a);
            return -3;
        }
    } else if (strcmp(type, "Prepend") == 0) {
        m.type = HN_PREPEND;
        const json_t *c = json_object_get(j, "prepend");
        if (!json_is_string(c)) {
            snprintf(err, err_size, "normalizer Prepend without a \"prepend\" string");
            return -1;
        }
        m.alen = json_string_length(c);
        if ((m.a = dup_n(json_string_value(c), m.alen)) == NULL)
            return -3;
    } else {
        snprintf(err, err_size, "unsupported normalizer \"%.60s\"", type);
        return -1;
    }
    if (!grow((void **)v, *n, sizeof **v)) {
        free(m.a);
        free(m.b);
        return -3;
    }
    (*v)[(*n)++] = m;
    return 0;
}

static int behavior_of(const char *s)
{
    if (s == NULL)
        return 0;
    return strcmp(s, "Removed") == 0              ? HB_REMOVED
           : strcmp(s, "Isolated") == 0           ? HB_ISOLATED
           : strcmp(s, "MergedWithPrevious") == 0 ? HB_PREV
           : strcmp(s, "MergedWithNext") == 0     ? HB_NEXT
           : strcmp(s, "Contiguous") == 0         ? HB_CONTIG
                                                  : 0;
}

static void free_pre(hf_pre *p)
{
    pcre2_match_data_free(p->md);
    pcre2_code_free(p->re);
    free(p->lit);
}

/* Parse one non-Sequence pre-tokenizer into *p. */
static int parse_pre1(const json_t *j, const char *type, hf_pre *p, char *err, size_t err_size)
{
    if (strcmp(type, "Split") == 0) {
        p->type = HP_SPLIT;
        const char *b = json_string_value(json_object_get(j, "behavior"));
        if ((p->behavior = behavior_of(b)) == 0) {
            snprintf(err, err_size, "pre-tokenizer Split: unsupported behavior \"%.40s\"",
                     b ? b : "(none)");
            return -1;
        }
        p->invert = jbool(j, "invert", false);
        return parse_pattern(json_object_get(j, "pattern"), "pre-tokenizer Split", &p->lit,
                             &p->litlen, &p->re, err, err_size);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        p->type = HP_BYTELEVEL;
        p->prefix_space = jbool(j, "add_prefix_space", true);
        if (jbool(j, "use_regex", true)) {
            p->re = hfp_compile(gpt2_pat, strlen(gpt2_pat), err, err_size);
            if (p->re == NULL)
                return -1;
        }
        return 0;
    }
    if (strcmp(type, "Digits") == 0) {
        p->type = HP_DIGITS;
        p->individual = jbool(j, "individual_digits", false);
        return 0;
    }
    if (strcmp(type, "Metaspace") == 0) {
        p->type = HP_METASPACE;
        const json_t *r = json_object_get(j, "replacement");
        const char *rs = json_is_string(r) ? json_string_value(r) : "\xe2\x96\x81";
        p->litlen = strlen(rs);
        if (p->litlen == 0) {
            snprintf(err, err_size, "pre-tokenizer Metaspace: empty replacement");
            return -1;
        }
        if ((p->lit = dup_n(rs, p->litlen)) == NULL)
            return -3;
        const char *ps = json_string_value(json_object_get(j, "prepend_scheme"));
        if (ps == NULL)
            p->prepend = jbool(j, "add_prefix_space", true) ? MS_ALWAYS : MS_NEVER;
        else if (strcmp(ps, "always") == 0)
            p->prepend = MS_ALWAYS;
        else if (strcmp(ps, "first") == 0)
            p->prepend = MS_FIRST;
        else if (strcmp(ps, "never") == 0)
            p->prepend = MS_NEVER;
        else {
            snprintf(err, err_size, "pre-tokenizer Metaspace: unknown prepend_scheme \"%.20s\"",
                     ps);
            return -1;
        }
        p->split = jbool(j, "split", true);
        return 0;
    }
    snprintf(err, err_size, "unsupported pre-tokenizer \"%.60s\"", type);
    return -1;
}

int hfp_parse_pre(const json_t *j, hf_pre **v, size_t *n, char *err, size_t err_size)
{
    if (j == NULL || json_is_null(j))
        return 0;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (type == NULL) {
        snprintf(err, err_size, "a pre-tokenizer without a \"type\"");
        return -1;
    }
    if (strcmp(type, "Sequence") == 0) {
        const json_t *a = json_object_get(j, "pretokenizers");
        if (!json_is_array(a)) {
            snprintf(err, err_size, "pre-tokenizer Sequence without a \"pretokenizers\" array");
            return -1;
        }
        size_t i;
        const json_t *x;
        json_array_foreach(a, i, x)
        {
            int rc = hfp_parse_pre(x, v, n, err, err_size);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    if (*n > 0 && (*v)[*n - 1].type == HP_BYTELEVEL) {
        snprintf(err, err_size, "pre-tokenizer \"%.40s\" after ByteLevel is not supported", type);
        return -1;
    }
    hf_pre p = {0};
    int rc = parse_pre1(j, type, &p, err, err_size);
    if (rc == 0 && p.re != NULL &&
        (p.md = pcre2_match_data_create_from_pattern(p.re, NULL)) == NULL)
        rc = -3;
    if (rc == 0 && !grow((void **)v, *n, sizeof **v))
        rc = -3;
    if (rc != 0) {
        free_pre(&p);
        return rc;
    }
    (*v)[(*n)++] = p;
    return 0;
}

void hfp_free_norm(hf_norm *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(v[i].a);
        free(v[i].b);
    }
    free(v);
}

void hfp_free_pre(hf_pre *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free_pre(&v[i]);
    free(v);
}

/* ---- normalizers -------------------------------------------------------------------------- */

static utf8proc_option_t norm_options(int type)
{
    utf8proc_option_t o = UTF8PROC_STABLE;
    if (type == HN_NFC || type == HN_NFKC)
        o |= UTF8PROC_COMPOSE;
    else
        o |= UTF8PROC_DECOMPOSE;
    if (type == HN_NFKC || type == HN_NFKD)
        o |= UTF8PROC_COMPAT;
    return o;
}

/* Normalize b[from, to) into o; returns false when out of memory or utf8proc refuses. */
static bool norm_run(hf_buf *o, const hf_buf *b, size_t from, size_t to, utf8proc_option_t opt)
{
    utf8proc_uint8_t *d = NULL;
    utf8proc_ssize_t m =
        utf8proc_map((const utf8proc_uint8_t *)b->s + from, (utf8proc_ssize_t)(to - from), &d, opt);
    if (m < 0) {
        free(d);
        return out_copy(o, b, from, to); /* invalid UTF-8 cannot reach here: keep it */
    }
    bool same = (size_t)m == to - from && memcmp(d, b->s + from, (size_t)m) == 0;
    bool ok = same ? out_copy(o, b, from, to)
                   : out_bytes(o, (const char *)d, (size_t)m, NULL, b->org[from]);
    free(d);
    return ok;
}

static int norm_unicode(int type, hf_buf *b, hf_buf *o)
{
    utf8proc_option_t opt = norm_options(type);
    utf8proc_uint8_t *d = NULL;
    utf8proc_ssize_t m =
        utf8proc_map((const utf8proc_uint8_t *)b->s, (utf8proc_ssize_t)b->n, &d, opt);
    bool same = m >= 0 && (size_t)m == b->n && memcmp(d, b->s, b->n) == 0;
    free(d);
    if (m == UTF8PROC_ERROR_NOMEM)
        return -3;
    if (same || m < 0)
        return 0;
    if (!out_begin(o))
        return -3;
    for (size_t i = 0; i < b->n;) {
        size_t j = i + 1;
        while (j < b->n && (unsigned char)b->s[j] >= 0x80)
            j++;
        if (!norm_run(o, b, i, j, opt))
            return -3;
        i = j;
    }
    if (!out_cut(o))
        return -3;
    swap_buf(b, o);
    return 0;
}

int hfp_normalize(const hf_norm *v, size_t n, hf_buf *b, hf_buf *tmp)
{
    for (size_t k = 0; k < n && b->n > 0; k++) {
        const hf_norm *m = &v[k];
        if (m->type == HN_REPLACE) {
            if (!out_begin(tmp))
                return -3;
            for (size_t i = 0; i < b->n;) {
                const char *hit = find_bytes(b->s + i, b->n - i, m->a, m->alen);
                size_t at = hit ? (size_t)(hit - b->s) : b->n;
                if (!out_copy(tmp, b, i, at))
                    return -3;
                if (hit == NULL)
                    break;
                if (!out_bytes(tmp, m->b, m->blen, NULL, b->org[at]))
                    return -3;
                i = at + m->alen;
            }
        } else if (m->type == HN_PREPEND) {
            if (!out_begin(tmp) || !out_bytes(tmp, m->a, m->alen, NULL, b->org[0]) ||
                !out_copy(tmp, b, 0, b->n))
                return -3;
        } else {
            int rc = norm_unicode(m->type, b, tmp);
            if (rc != 0)
                return rc;
            continue;
        }
        if (!out_cut(tmp))
            return -3;
        swap_buf(b, tmp);
    }
    b->ncut = 0;
    if (!hfb_reserve_cuts(b, 2))
        return -3;
    b->cut[b->ncut++] = 0;
    if (b->n > 0)
        b->cut[b->ncut++] = (uint32_t)b->n;
    return 0;
}

/* ---- pre-tokenizers ----------------------------------------------------------------------- */

/* A piece's segments: [start, end) and whether it was a match. */
typedef struct seg {
    size_t a, e;
    bool match;
} seg;

typedef struct segs {
    seg *v;
    size_t n, cap;
} segs;

static bool seg_push(segs *s, size_t a, size_t e, bool match)
{
    if (a == e)
        return true;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        seg *v = realloc(s->v, cap * sizeof *v);
        if (v == NULL)
            return false;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (seg){a, e, match};
    return true;
}

/* Length of the UTF-8 sequence starting with byte c (the text is valid). */
static size_t u8len(unsigned char c)
{
    return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}

/* Find the matches of p in b[a, e) as segments (gaps are non-matches). */
static int find_matches(hf_pre *p, const hf_buf *b, size_t a, size_t e, segs *out, char *err,
                        size_t err_size)
{
    out->n = 0;
    size_t prev = a;
    if (p->re == NULL) {
        for (size_t i = a; i < e;) {
            const char *hit = find_bytes(b->s + i, e - i, p->lit, p->litlen);
            if (hit == NULL)
                break;
            size_t at = (size_t)(hit - b->s);
            if (!seg_push(out, prev, at, false) || !seg_push(out, at, at + p->litlen, true))
                return -3;
            prev = i = at + p->litlen;
        }
    } else {
        const unsigned char *s = (const unsigned char *)b->s + a;
        size_t n = e - a, off = 0;
        while (off < n) {
            int m = pcre2_match(p->re, s, n, off, PCRE2_NO_UTF_CHECK, p->md, NULL);
            if (m == PCRE2_ERROR_NOMATCH)
                break;
            if (m < 0) {
                PCRE2_UCHAR msg[120];
                pcre2_get_error_message(m, msg, sizeof msg);
                snprintf(err, err_size, "regular expression failed: %s", (const char *)msg);
                return -1;
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(p->md);
            size_t ms = ov[0], me = ov[1];
            if (me == ms) { /* an empty match: step over one character */
                off = ms + u8len(s[ms]);
                continue;
            }
            if (!seg_push(out, prev, a + ms, false) || !seg_push(out, a + ms, a + me, true))
                return -3;
            prev = a + me;
            off = me;
        }
    }
    if (!seg_push(out, prev, e, false))
        return -3;
    if (p->invert)
        for (size_t i = 0; i < out->n; i++)
            out->v[i].match = !out->v[i].match;
    return 0;
}

/* Group segments by behaviour (the tokenizers library's rules) into pieces of o. */
static int emit_split(int behavior, const segs *sg, const hf_buf *b, hf_buf *o)
{
    bool prev_match = false;
    for (size_t i = 0; i < sg->n; i++) {
        const seg *x = &sg->v[i];
        bool join;
        switch (behavior) {
        case HB_REMOVED:
            if (x->match)
                continue;
            join = false;
            break;
        case HB_ISOLATED:
            join = false;
            break;
        case HB_PREV:
            join = x->match && !prev_match && i > 0;
            break;
        case HB_NEXT: /* a match joins the non-match after it */
            join = i > 0 && sg->v[i - 1].match && !x->match;
            break;
        default: /* HB_CONTIG */
            join = i > 0 && x->match == prev_match;
            break;
        }
        if (!join && !out_cut(o))
            return -3;
        if (!out_copy(o, b, x->a, x->e))
            return -3;
        prev_match = x->match;
    }
    return out_cut(o) ? 0 : -3;
}

static int pre_split(hf_pre *p, hf_buf *b, hf_buf *o, segs *sg, char *err, size_t err_size)
{
    if (!out_begin(o))
        return -3;
    for (size_t k = 0; k + 1 < b->ncut; k++) {
        int rc = find_matches(p, b, b->cut[k], b->cut[k + 1], sg, err, err_size);
        if (rc == 0)
            rc = emit_split(p->behavior, sg, b, o);
        if (rc != 0)
            return rc;
    }
    swap_buf(b, o);
    return 0;
}

/* Digits: numeric characters (Unicode N*) are the matches. */
static int digit_segs(const hf_buf *b, size_t a, size_t e, bool individual, segs *out)
{
    out->n = 0;
    for (size_t i = a; i < e;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t l =
            utf8proc_iterate((const utf8proc_uint8_t *)b->s + i, (utf8proc_ssize_t)(e - i), &cp);
        size_t len = l > 0 ? (size_t)l : 1;
        utf8proc_category_t c = l > 0 ? utf8proc_category(cp) : UTF8PROC_CATEGORY_CN;
        bool num =
            c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
        if (out->n > 0 && out->v[out->n - 1].e == i && out->v[out->n - 1].match == num &&
            !(num && individual))
            out->v[out->n - 1].e = i + len;
        else if (!seg_push(out, i, i + len, num))
            return -3;
        i += len;
    }
    return 0;
}

static int pre_digits(hf_pre *p, hf_buf *b, hf_buf *o, segs *sg)
{
    if (!out_begin(o))
        return -3;
    for (size_t k = 0; k + 1 < b->ncut; k++) {
        if (digit_segs(b, b->cut[k], b->cut[k + 1], p->individual, sg) != 0 ||
            emit_split(p->individual ? HB_ISOLATED : HB_CONTIG, sg, b, o) != 0)
            return -3;
    }
    swap_buf(b, o);
    return 0;
}

/* ByteLevel: the prefix space, then GPT-2's expression (Isolated) when use_regex. */
static int pre_bytelevel(hf_pre *p, hf_buf *b, hf_buf *o, segs *sg, char *err, size_t err_size)
{
    if (p->prefix_space) {
        if (!out_begin(o))
            return -3;
        for (size_t k = 0; k + 1 < b->ncut; k++) {
            size_t a = b->cut[k], e = b->cut[k + 1];
            if (b->s[a] != ' ' && !out_bytes(o, " ", 1, NULL, b->org[a]))
                return -3;
            if (!out_copy(o, b, a, e) || !out_cut(o))
                return -3;
        }
        swap_buf(b, o);
    }
    if (p->re == NULL)
        return 0;
    p->behavior = HB_ISOLATED;
    return pre_split(p, b, o, sg, err, err_size);
}

/* Metaspace: spaces become the replacement, the prefix by prepend_scheme, then (split) a
 * cut before every replacement (MergedWithNext). */
static int pre_metaspace(hf_pre *p, hf_buf *b, hf_buf *o, segs *sg, bool first, char *err,
                         size_t err_size)
{
    if (!out_begin(o))
        return -3;
    for (size_t k = 0; k + 1 < b->ncut; k++) {
        size_t a = b->cut[k], e = b->cut[k + 1];
        bool starts =
            (e - a >= p->litlen && memcmp(b->s + a, p->lit, p->litlen) == 0) || b->s[a] == ' ';
        bool pre = p->prepend == MS_ALWAYS || (p->prepend == MS_FIRST && first && k == 0);
        if (pre && !starts && !out_bytes(o, p->lit, p->litlen, NULL, b->org[a]))
            return -3;
        for (size_t i = a; i < e; i++) {
            bool ok = b->s[i] == ' ' ? out_bytes(o, p->lit, p->litlen, NULL, b->org[i])
                                     : out_bytes(o, b->s + i, 1, b->org + i, 0);
            if (!ok)
                return -3;
        }
        if (!out_cut(o))
            return -3;
    }
    swap_buf(b, o);
    if (!p->split)
        return 0;
    pcre2_code *re = p->re;
    p->re = NULL; /* the replacement is a literal */
    int saved = p->behavior;
    bool inv = p->invert;
    p->behavior = HB_NEXT;
    p->invert = false;
    int rc = pre_split(p, b, o, sg, err, err_size);
    p->re = re;
    p->behavior = saved;
    p->invert = inv;
    return rc;
}

int hfp_pretokenize(hf_pre *v, size_t n, hf_buf *b, hf_buf *tmp, bool first, char *err,
                    size_t err_size)
{
    segs sg = {0};
    int rc = 0;
    for (size_t k = 0; k < n && rc == 0 && b->n > 0; k++) {
        hf_pre *p = &v[k];
        switch (p->type) {
        case HP_SPLIT:
            rc = pre_split(p, b, tmp, &sg, err, err_size);
            break;
        case HP_DIGITS:
            rc = pre_digits(p, b, tmp, &sg);
            break;
        case HP_BYTELEVEL:
            rc = pre_bytelevel(p, b, tmp, &sg, err, err_size);
            break;
        default:
            rc = pre_metaspace(p, b, tmp, &sg, first, err, err_size);
            break;
        }
    }
    free(sg.v);
    return rc;
}
