/*
 * hftok_enc.c - encoding with a Hugging Face tokenizer (hftok.h, steps 1-6 of its comment):
 * the added tokens cut, then per stretch the normalizers and the added tokens matched in
 * the normalized text, the pre-tokenizers (hftok_pre.c), and the BPE merge of each piece.
 *
 * Merging uses a binary heap of candidate pairs ordered by (rank, position) over a linked
 * list of symbols, with lazy deletion: a popped candidate is acted on only if its left
 * symbol is alive, has a right neighbour, and the pair's merge still gives the same id, as
 * the tokenizers library does it. O(n log n) per piece, which matters for Gemma and
 * Mistral, whose normalizer leaves a whole stretch as one piece. Scratch arrays live in the
 * hftok and grow to the longest piece (hftok_int.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hftok.h"
#include "cli.h"
#include "hftok_int.h"

typedef struct outv {
    uint32_t **ids, **offs;
    size_t *n, *cap;
} outv;

static bool push(outv *o, uint32_t id, uint32_t off)
{
    if (*o->n == *o->cap) {
        size_t cap = *o->cap ? 2 * *o->cap : 256;
        uint32_t *a = realloc(*o->ids, cap * sizeof *a);
        if (a == NULL)
            return false;
        *o->ids = a;
        uint32_t *b = realloc(*o->offs, cap * sizeof *b);
        if (b == NULL)
            return false;
        *o->offs = b;
        *o->cap = cap;
    }
    (*o->ids)[*o->n] = id;
    (*o->offs)[*o->n] = off;
    (*o->n)++;
    return true;
}

static bool cand_less(const cand *a, const cand *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
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
    cand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const cand *best = &last;
        if (l < *n && cand_less(&h[l], best)) {
            m = l;
            best = &h[l];
        }
        if (r < *n && cand_less(&h[r], best))
            m = r;
        if (m == i)
            break;
        h[i] = h[m];
        i = m;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

static void push_pair(const hftok *t, sym *s, size_t l, cand *h, size_t *hn)
{
    if (s[l].next < 0)
        return;
    const mslot *m = hft_merge_find(t, s[l].id, s[s[l].next].id);
    if (m != NULL)
        heap_push(h, hn, (cand){m->rank, (uint32_t)l, m->id});
}

static bool word_reserve(hftok *t, size_t n)
{
    if (n <= t->word_cap)
        return true;
    size_t cap = t->word_cap ? t->word_cap : 256;
    while (cap < n)
        cap *= 2;
    char *w = realloc(t->word, cap);
    if (w == NULL)
        return false;
    t->word = w;
    uint32_t *o = realloc(t->word_org, cap * sizeof *o);
    if (o == NULL)
        return false;
    t->word_org = o;
    sym *s = realloc(t->syms, cap * sizeof *s);
    if (s == NULL)
        return false;
    t->syms = s;
    cand *h = realloc(t->heap, 2 * cap * sizeof *h);
    if (h == NULL)
        return false;
    t->heap = h;
    t->word_cap = cap;
    return true;
}

/* BPE over the word w[0, n) (model text), origins org. */
static int bpe_word(hftok *t, const char *w, const uint32_t *org, size_t n, outv *o)
{
    if (t->ignore_merges) {
        uint32_t id = hft_vocab_find(t, w, n);
        if (id != UINT32_MAX)
            return push(o, id, org[0]) ? 0 : -3;
    }
    /* Step 1: the characters, or their bytes' <0xXX>, or unk. */
    sym *s = t->syms;
    size_t ns = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)w[i];
        size_t l = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
        if (l > n - i)
            l = n - i;
        uint32_t id = hft_vocab_find(t, w + i, l);
        if (id != UINT32_MAX) {
            s[ns++] = (sym){id, org[i], 0, 0, false};
        } else {
            bool fell = false;
            if (t->byte_fallback) {
                fell = true;
                for (size_t k = 0; k < l; k++)
                    fell &= t->byte_id[(unsigned char)w[i + k]] != UINT32_MAX;
                for (size_t k = 0; fell && k < l; k++)
                    s[ns++] = (sym){t->byte_id[(unsigned char)w[i + k]], org[i], 0, 0, false};
            }
            if (!fell && t->has_unk) {
                bool fuse = t->fuse_unk && ns > 0 && s[ns - 1].id == t->unk;
                if (!fuse)
                    s[ns++] = (sym){t->unk, org[i], 0, 0, false};
            }
        }
        i += l;
    }
    for (size_t i = 0; i < ns; i++) {
        s[i].prev = (int32_t)i - 1;
        s[i].next = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    /* Step 2: merge the lowest-ranked pair, leftmost first. */
    size_t hn = 0;
    for (size_t i = 0; i + 1 < ns; i++)
        push_pair(t, s, i, t->heap, &hn);
    while (hn > 0) {
        cand c = heap_pop(t->heap, &hn);
        sym *l = &s[c.pos];
        if (l->dead || l->next < 0)
            continue;
        const mslot *m = hft_merge_find(t, l->id, s[l->next].id);
        if (m == NULL || m->id != c.id)
            continue;
        sym *r = &s[l->next];
        l->id = c.id;
        r->dead = true;
        l->next = r->next;
        if (r->next >= 0)
            s[r->next].prev = (int32_t)c.pos;
        if (l->prev >= 0)
            push_pair(t, s, (size_t)l->prev, t->heap, &hn);
        push_pair(t, s, c.pos, t->heap, &hn);
    }
    for (size_t i = 0; i < ns; i++)
        if (!s[i].dead && !push(o, s[i].id, s[i].off))
            return -3;
    return 0;
}

/* Encode the pieces of b (pre-tokenized). */
/* BPE over a piece of a SentencePiece-derived model. With split_space (hftok_int.h: no
 * token holds U+2581 after another character, so no merge can join across one) the piece
 * is cut before each U+2581 that follows another character, and each part is merged on its
 * own: the same tokens, but the merge works on words rather than on a whole stretch, which
 * these files' normalizers leave as one piece. */
static int split_space_word(hftok *t, const char *w, const uint32_t *org, size_t n, outv *o)
{
    static const char sp[3] = {'\xe2', '\x96', '\x81'};
    size_t from = 0;
    for (size_t i = 1; t->split_space && i + 3 <= n; i++) {
        if (memcmp(w + i, sp, 3) != 0 || (i >= 3 && memcmp(w + i - 3, sp, 3) == 0))
            continue;
        int rc = bpe_word(t, w + from, org + from, i - from, o);
        if (rc != 0)
            return rc;
        from = i;
        i += 2;
    }
    return bpe_word(t, w + from, org + from, n - from, o);
}

static int encode_pieces(hftok *t, const hf_buf *b, outv *o)
{
    for (size_t k = 0; k + 1 < b->ncut; k++) {
        size_t a = b->cut[k], e = b->cut[k + 1];
        if (!word_reserve(t, 2 * (e - a) + 4))
            return -3;
        size_t n = 0;
        if (t->byte_level) {
            for (size_t i = a; i < e; i++) {
                char c[2];
                size_t l = hfp_byte_char((unsigned char)b->s[i], c);
                for (size_t j = 0; j < l; j++) {
                    t->word[n] = c[j];
                    t->word_org[n++] = b->org[i];
                }
            }
        } else {
            int rc = split_space_word(t, b->s + a, b->org + a, e - a, o);
            if (rc != 0)
                return rc;
            continue;
        }
        int rc = bpe_word(t, t->word, t->word_org, n, o);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static bool is_ws(const char *s, size_t n, size_t i, size_t *len)
{
    unsigned char c = (unsigned char)s[i];
    if (c == ' ' || (c >= '\t' && c <= '\r')) {
        *len = 1;
        return true;
    }
    (void)n;
    return false;
}

static bool word_byte(unsigned char c)
{
    return c == '_' || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') ||
           c >= 0x80;
}

/* The added token of class cls matching at s[i] (longest), or NULL. */
static const added *match_at(const hftok *t, const char *s, size_t n, size_t i, int cls,
                             bool specials)
{
    const lens *l = &t->alens[cls][(unsigned char)s[i]];
    for (size_t k = 0; k < l->n; k++) {
        if (l->v[k] > n - i)
            continue;
        const added *a = hft_added_find(t, s + i, l->v[k]);
        if (a == NULL || a->normalized != cls || (a->special && !specials))
            continue;
        if (a->single_word && ((i > 0 && word_byte((unsigned char)s[i - 1])) ||
                               (i + a->len < n && word_byte((unsigned char)s[i + a->len]))))
            continue;
        return a;
    }
    return NULL;
}

/* Steps 3-5 for one normalized stretch b (origins set). */
static int encode_normalized(hftok *t, hf_buf *b, bool first_stretch, bool specials, outv *o,
                             char *err, size_t es)
{
    hf_buf *piece = &t->b3, *tmp = &t->b1;
    size_t last = 0;
    for (size_t i = 0; i <= b->n; i++) {
        const added *a = i < b->n ? match_at(t, b->s, b->n, i, 1, specials) : NULL;
        if (a == NULL && i < b->n)
            continue;
        size_t start = i, end = a ? i + a->len : i;
        size_t wl;
        if (a && a->lstrip)
            while (start > last && is_ws(b->s, b->n, start - 1, &wl))
                start--;
        if (a && a->rstrip)
            while (end < b->n && is_ws(b->s, b->n, end, &wl))
                end++;
        if (start > last) {
            piece->n = 0;
            if (!hfb_reserve(piece, start - last) || !hfb_reserve_cuts(piece, 2))
                return -3;
            memcpy(piece->s, b->s + last, start - last);
            memcpy(piece->org, b->org + last, (start - last) * sizeof *b->org);
            piece->n = start - last;
            piece->cut[0] = 0;
            piece->cut[1] = (uint32_t)piece->n;
            piece->ncut = 2;
            int rc =
                hfp_pretokenize(t->pre, t->n_pre, piece, tmp, first_stretch && last == 0, err, es);
            if (rc == 0)
                rc = encode_pieces(t, piece, o);
            if (rc != 0)
                return rc;
        }
        if (a && !push(o, a->id, b->org[i]))
            return -3;
        if (a)
            i = end - 1;
        last = end;
    }
    return 0;
}

/* Steps 2-5 for the raw stretch text[from, to). */
static int encode_stretch(hftok *t, const char *text, size_t from, size_t to, uint32_t base,
                          bool specials, outv *o, char *err, size_t es)
{
    hf_buf *b = &t->b2;
    b->n = 0;
    if (!hfb_reserve(b, to - from) || !hfb_reserve_cuts(b, 2))
        return -3;
    memcpy(b->s, text + from, to - from);
    for (size_t i = from; i < to; i++)
        b->org[i - from] = base + (uint32_t)i;
    b->n = to - from;
    int rc = hfp_normalize(t->norm, t->n_norm, b, &t->b1);
    if (rc != 0)
        return rc;
    return encode_normalized(t, b, from == 0, specials, o, err, es);
}

int hf_encode(hftok *t, const char *text, size_t len, bool specials, bool add_special,
              uint32_t base, uint32_t **ids, uint32_t **offs, size_t *n, size_t *cap, char *err,
              size_t err_size)
{
    outv o = {ids, offs, n, cap};
    int rc = 0;
    for (size_t i = 0; add_special && i < t->n_pre_ids; i++)
        if (!push(&o, t->pre_ids[i], base))
            return -3;
    /* Step 1: the added tokens matched in the raw text. */
    size_t last = 0;
    for (size_t i = 0; i <= len && rc == 0; i++) {
        const added *a = i < len ? match_at(t, text, len, i, 0, specials) : NULL;
        if (a == NULL && i < len)
            continue;
        size_t start = i, end = a ? i + a->len : i, wl;
        if (a && a->lstrip)
            while (start > last && is_ws(text, len, start - 1, &wl))
                start--;
        if (a && a->rstrip)
            while (end < len && is_ws(text, len, end, &wl))
                end++;
        if (start > last)
            rc = encode_stretch(t, text, last, start, base, specials, &o, err, err_size);
        if (rc == 0 && a && !push(&o, a->id, base + (uint32_t)i))
            rc = -3;
        if (a)
            i = end - 1;
        last = end;
    }
    for (size_t i = 0; rc == 0 && add_special && i < t->n_post_ids; i++)
        if (!push(&o, t->post_ids[i], base + (uint32_t)len))
            rc = -3;
    if (rc == -3)
        cli_errf(err, err_size, "out of memory");
    return rc;
}
