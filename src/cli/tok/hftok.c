/*
 * hftok.c - the Hugging Face tokenizer of hftok.h: reading tokenizer.json (jansson) into
 * the tables below (vocabulary, merges, added tokens, post-processor), the lookups, the
 * queries and the checker. Encoding is in hftok_enc.c, normalizers and pre-tokenizers in
 * hftok_pre.c; the struct is in hftok_int.h.
 *
 * Layout. Every id below n_ids has two texts in one arena: its model text (the
 * vocabulary's string: GPT-2 characters for byte-level models, U+2581 for spaces in
 * SentencePiece-derived ones; an added token's content) at str_off/str_len, and its
 * decoded bytes at dec_off/dec_len (len 0 and no vocabulary entry: no such id). Lookups:
 *
 *   vocab   open addressing, slots of id + 1 (0 empty), XXH3-64 of the model text
 *   merges  open addressing on the key (left id << 32 | right id): rank and result id
 *   added   open addressing on the content; per first byte and class (raw / normalized)
 *           the distinct lengths of added tokens, longest first, so finding an added
 *           token at a byte costs one hash lookup per distinct length
 *
 * Merging (step 5 of hftok.h): hftok_enc.c.
 *
 * Invariants (hf_check): every vocabulary id is found by its text; every merge's result
 * is the token whose text joins its parts; tables at most half full.
 */
#include "hftok.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cli.h"
#include "hftok_int.h"

#define MAX_ID (1u << 24) /* ids at or above are refused */

static inline uint64_t hash(const void *p, size_t n)
{
    return XXH3_64bits(p, n);
}

/* ---- tables ------------------------------------------------------------------------------- */

static bool arena_add(hftok *t, const char *p, size_t n, uint32_t *off)
{
    if (t->arena_n + n > UINT32_MAX)
        return false;
    if (t->arena_n + n > t->arena_cap) {
        size_t cap = t->arena_cap ? t->arena_cap : 1 << 16;
        while (cap < t->arena_n + n)
            cap *= 2;
        char *a = realloc(t->arena, cap);
        if (a == NULL)
            return false;
        t->arena = a;
        t->arena_cap = cap;
    }
    memcpy(t->arena + t->arena_n, p, n);
    *off = (uint32_t)t->arena_n;
    t->arena_n += n;
    return true;
}

uint32_t hft_vocab_find(const hftok *t, const char *p, size_t n)
{
    if (t->vslot == NULL)
        return UINT32_MAX;
    for (size_t i = hash(p, n) & t->vmask;; i = (i + 1) & t->vmask) {
        uint32_t s = t->vslot[i];
        if (s == 0)
            return UINT32_MAX;
        uint32_t id = s - 1;
        if (t->str_len[id] == n && memcmp(t->arena + t->str_off[id], p, n) == 0)
            return id;
    }
}

static void vocab_put(hftok *t, uint32_t id)
{
    const char *p = t->arena + t->str_off[id];
    size_t i = hash(p, t->str_len[id]) & t->vmask;
    while (t->vslot[i] != 0)
        i = (i + 1) & t->vmask;
    t->vslot[i] = id + 1;
}

const mslot *hft_merge_find(const hftok *t, uint32_t a, uint32_t b)
{
    if (t->mslots == NULL)
        return NULL;
    uint64_t key = (uint64_t)a << 32 | b;
    for (size_t i = XXH3_64bits(&key, sizeof key) & t->mmask;; i = (i + 1) & t->mmask) {
        if (t->mslots[i].key == key)
            return &t->mslots[i];
        if (t->mslots[i].key == UINT64_MAX)
            return NULL;
    }
}

const added *hft_added_find(const hftok *t, const char *p, size_t n)
{
    if (t->aslot == NULL)
        return NULL;
    for (size_t i = hash(p, n) & t->amask;; i = (i + 1) & t->amask) {
        uint32_t s = t->aslot[i];
        if (s == 0)
            return NULL;
        const added *a = &t->add[s - 1];
        if (a->len == n && memcmp(t->arena + a->off, p, n) == 0)
            return a;
    }
}

static size_t pow2_above(size_t n)
{
    size_t c = 16;
    while (c < 2 * n + 1)
        c *= 2;
    return c;
}

/* ---- loading ------------------------------------------------------------------------------ */

static bool ids_reserve(hftok *t, size_t n)
{
    if (n <= t->n_ids)
        return true;
    uint32_t **arrs[4] = {&t->str_off, &t->str_len, &t->dec_off, &t->dec_len};
    for (int k = 0; k < 4; k++) {
        uint32_t *p = realloc(*arrs[k], n * sizeof *p);
        if (p == NULL)
            return false;
        memset(p + t->n_ids, 0, (n - t->n_ids) * sizeof *p);
        *arrs[k] = p;
    }
    t->n_ids = n;
    return true;
}

static int get_id(const json_t *v, uint32_t *id)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_ID)
        return -1;
    *id = (uint32_t)json_integer_value(v);
    return 0;
}

static int load_vocab(hftok *t, const json_t *vocab, char *err, size_t es)
{
    if (!json_is_object(vocab)) {
        cli_errf(err, es, "model has no \"vocab\" object");
        return -1;
    }
    size_t max = 0;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)vocab, k, v)
    {
        uint32_t id;
        if (get_id(v, &id) != 0) {
            cli_errf(err, es, "vocab: the id of \"%.40s\" is not an integer in [0, 2^24)", k);
            return -1;
        }
        if (id + 1 > max)
            max = id + 1;
    }
    if (!ids_reserve(t, max))
        return -3;
    t->n_vocab = json_object_size(vocab);
    t->vmask = pow2_above(t->n_vocab) - 1;
    if ((t->vslot = calloc(t->vmask + 1, sizeof *t->vslot)) == NULL)
        return -3;
    json_object_foreach((json_t *)vocab, k, v)
    {
        uint32_t id = (uint32_t)json_integer_value(v);
        size_t n = strlen(k);
        if (n == 0) {
            cli_errf(err, es, "vocab: an empty token (id %u)", id);
            return -1;
        }
        if (t->str_len[id] != 0) {
            cli_errf(err, es, "vocab: id %u is given to two tokens", id);
            return -1;
        }
        if (!arena_add(t, k, n, &t->str_off[id]))
            return -3;
        t->str_len[id] = (uint32_t)n;
        vocab_put(t, id);
    }
    return 0;
}

/* Split a merge entry into its two parts. */
static int merge_parts(const json_t *m, const char **a, size_t *al, const char **b, size_t *bl)
{
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        const char *sp = strchr(s, ' ');
        if (sp == NULL || strchr(sp + 1, ' ') != NULL)
            return -1;
        *a = s;
        *al = (size_t)(sp - s);
        *b = sp + 1;
        *bl = strlen(sp + 1);
        return 0;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *al = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *bl = json_string_length(json_array_get(m, 1));
        return 0;
    }
    return -1;
}

static int load_merges(hftok *t, const json_t *merges, char *err, size_t es)
{
    if (merges == NULL)
        return 0;
    if (!json_is_array(merges)) {
        cli_errf(err, es, "model \"merges\" is not an array");
        return -1;
    }
    size_t n = json_array_size(merges);
    t->mmask = pow2_above(n) - 1;
    if ((t->mslots = malloc((t->mmask + 1) * sizeof *t->mslots)) == NULL)
        return -3;
    for (size_t i = 0; i <= t->mmask; i++)
        t->mslots[i].key = UINT64_MAX;
    char *cat = NULL;
    size_t catcap = 0;
    int rc = 0;
    for (size_t r = 0; r < n && rc == 0; r++) {
        const char *a, *b;
        size_t al, bl;
        if (merge_parts(json_array_get(merges, r), &a, &al, &b, &bl) != 0) {
            cli_errf(err, es, "merge %zu is neither \"a b\" nor [\"a\", \"b\"]", r);
            rc = -1;
            break;
        }
        uint32_t ia = hft_vocab_find(t, a, al), ib = hft_vocab_find(t, b, bl);
        if (al + bl > catcap) {
            catcap = 2 * (al + bl);
            char *c = realloc(cat, catcap);
            if (c == NULL) {
                rc = -3;
                break;
            }
            cat = c;
        }
        memcpy(cat, a, al);
        memcpy(cat + al, b, bl);
        uint32_t ic = hft_vocab_find(t, cat, al + bl);
        if (ia == UINT32_MAX || ib == UINT32_MAX || ic == UINT32_MAX) {
            cli_errf(err, es, "merge %zu (\"%.30s\" \"%.30s\"): %s is not in the vocab", r, a, b,
                     ia == UINT32_MAX   ? "the first part"
                     : ib == UINT32_MAX ? "the second part"
                                        : "the result");
            rc = -1;
            break;
        }
        uint64_t key = (uint64_t)ia << 32 | ib;
        size_t i = XXH3_64bits(&key, sizeof key) & t->mmask;
        while (t->mslots[i].key != UINT64_MAX && t->mslots[i].key != key)
            i = (i + 1) & t->mmask;
        if (t->mslots[i].key == key)
            continue; /* a repeated merge keeps its first rank */
        t->mslots[i] = (mslot){key, (uint32_t)r, ic};
        t->n_merges++;
    }
    free(cat);
    return rc;
}

static int lens_add(lens *l, uint32_t len)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i] == len)
            return 0;
    uint32_t *v = realloc(l->v, (l->n + 1) * sizeof *v);
    if (v == NULL)
        return -3;
    l->v = v;
    size_t i = l->n++;
    while (i > 0 && v[i - 1] < len) {
        v[i] = v[i - 1];
        i--;
    }
    v[i] = len;
    return 0;
}

static int load_added(hftok *t, const json_t *arr, char *err, size_t es)
{
    if (arr == NULL || json_is_null(arr))
        return 0;
    if (!json_is_array(arr)) {
        cli_errf(err, es, "\"added_tokens\" is not an array");
        return -1;
    }
    size_t n = json_array_size(arr);
    if ((t->add = calloc(n ? n : 1, sizeof *t->add)) == NULL)
        return -3;
    t->amask = pow2_above(n) - 1;
    if ((t->aslot = calloc(t->amask + 1, sizeof *t->aslot)) == NULL)
        return -3;
    for (size_t i = 0; i < n; i++) {
        const json_t *a = json_array_get(arr, i);
        const json_t *c = json_object_get(a, "content");
        uint32_t id;
        if (!json_is_string(c) || json_string_length(c) == 0 ||
            get_id(json_object_get(a, "id"), &id) != 0) {
            cli_errf(err, es,
                     "added_tokens[%zu]: needs a non-empty \"content\" and an \"id\" in "
                     "[0, 2^24)",
                     i);
            return -1;
        }
        added *x = &t->add[t->n_add];
        x->id = id;
        x->len = (uint32_t)json_string_length(c);
        x->special = json_is_true(json_object_get(a, "special"));
        x->lstrip = json_is_true(json_object_get(a, "lstrip"));
        x->rstrip = json_is_true(json_object_get(a, "rstrip"));
        x->normalized = json_is_true(json_object_get(a, "normalized"));
        x->single_word = json_is_true(json_object_get(a, "single_word"));
        if (!arena_add(t, json_string_value(c), x->len, &x->off) || !ids_reserve(t, id + 1))
            return -3;
        if (t->str_len[id] == 0) {
            t->str_off[id] = x->off;
            t->str_len[id] = x->len;
        }
        t->dec_off[id] = x->off; /* an added token decodes to its content */
        t->dec_len[id] = x->len;
        const added *old = hft_added_find(t, t->arena + x->off, x->len);
        if (old != NULL) { /* the later entry wins */
            t->add[old - t->add] = *x;
            continue;
        }
        size_t s = hash(t->arena + x->off, x->len) & t->amask;
        while (t->aslot[s] != 0)
            s = (s + 1) & t->amask;
        t->aslot[s] = (uint32_t)(t->n_add + 1);
        if (lens_add(&t->alens[x->normalized][(unsigned char)t->arena[x->off]], x->len) != 0)
            return -3;
        t->n_add++;
    }
    return 0;
}

/* The decoded bytes of every vocabulary id that is not an added token. */
static int decode_vocab(hftok *t)
{
    unsigned rev[512]; /* GPT-2 character (code point < 512) -> byte + 1 */
    memset(rev, 0, sizeof rev);
    for (unsigned b = 0; b < 256; b++) {
        char c[2];
        size_t n = hfp_byte_char((unsigned char)b, c);
        unsigned cp = n == 1 ? (unsigned char)c[0]
                             : (((unsigned char)c[0] & 0x1fu) << 6) | ((unsigned char)c[1] & 0x3fu);
        rev[cp] = b + 1;
    }
    char *buf = NULL;
    size_t cap = 0;
    for (size_t id = 0; id < t->n_ids; id++) {
        if (t->dec_len[id] != 0 || t->str_len[id] == 0)
            continue;
        size_t n = t->str_len[id];
        if (n * 3 > cap) {
            cap = n * 3 + 16;
            char *p = realloc(buf, cap);
            if (p == NULL) {
                free(buf);
                return -3;
            }
            buf = p;
        }
        const unsigned char *s = (const unsigned char *)t->arena + t->str_off[id];
        size_t m = 0;
        if (t->byte_level) {
            for (size_t i = 0; i < n;) {
                unsigned cp = s[i];
                size_t l = 1;
                if ((s[i] & 0xe0) == 0xc0 && i + 1 < n) {
                    cp = ((s[i] & 0x1fu) << 6) | (s[i + 1] & 0x3fu);
                    l = 2;
                }
                if (cp < 512 && rev[cp] != 0 && (l == 2 || cp < 0x80)) {
                    buf[m++] = (char)(rev[cp] - 1);
                    i += l;
                } else { /* not a GPT-2 character: keep the text */
                    buf[m++] = (char)s[i++];
                }
            }
        } else if (n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>') {
            buf[m++] = (char)strtoul((const char *)s + 3, NULL, 16);
        } else {
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                    buf[m++] = ' ';
                    i += 3;
                } else {
                    buf[m++] = (char)s[i++];
                }
            }
        }
        if (!arena_add(t, buf, m, &t->dec_off[id])) {
            free(buf);
            return -3;
        }
        t->dec_len[id] = (uint32_t)m;
    }
    free(buf);
    return 0;
}

static int load_model(hftok *t, const json_t *m, char *err, size_t es)
{
    const char *type = json_string_value(json_object_get(m, "type"));
    if (!json_is_object(m)) {
        cli_errf(err, es, "no \"model\" object");
        return -1;
    }
    if (type != NULL && strcmp(type, "BPE") != 0) {
        cli_errf(err, es, "unsupported model \"%.40s\"", type);
        return -1;
    }
    const json_t *d = json_object_get(m, "dropout");
    if (d != NULL && !json_is_null(d) && json_number_value(d) != 0.0) {
        cli_errf(err, es, "unsupported model option \"dropout\"");
        return -1;
    }
    const char *fixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const char *s = json_string_value(json_object_get(m, fixes[i]));
        if (s != NULL && *s) {
            cli_errf(err, es, "unsupported model option \"%s\"", fixes[i]);
            return -1;
        }
    }
    t->byte_fallback = json_is_true(json_object_get(m, "byte_fallback"));
    t->fuse_unk = json_is_true(json_object_get(m, "fuse_unk"));
    t->ignore_merges = json_is_true(json_object_get(m, "ignore_merges"));
    int rc = load_vocab(t, json_object_get(m, "vocab"), err, es);
    if (rc == 0)
        rc = load_merges(t, json_object_get(m, "merges"), err, es);
    if (rc != 0)
        return rc;
    const json_t *unk = json_object_get(m, "unk_token");
    if (json_is_string(unk)) {
        t->unk = hft_vocab_find(t, json_string_value(unk), json_string_length(unk));
        t->has_unk = t->unk != UINT32_MAX;
    }
    for (unsigned b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        t->byte_id[b] = hft_vocab_find(t, s, 6);
    }
    return 0;
}

/* The TemplateProcessing "single" template's special tokens around $A. */
static int load_post(hftok *t, const json_t *p, char *err, size_t es)
{
    if (p == NULL || json_is_null(p))
        return 0;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (type == NULL) {
        cli_errf(err, es, "a post_processor without a \"type\"");
        return -1;
    }
    if (strcmp(type, "ByteLevel") == 0)
        return 0;
    if (strcmp(type, "Sequence") == 0) {
        const json_t *a = json_object_get(p, "processors");
        size_t i;
        const json_t *x;
        json_array_foreach(a, i, x)
        {
            int rc = load_post(t, x, err, es);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    if (strcmp(type, "TemplateProcessing") != 0) {
        cli_errf(err, es, "unsupported post_processor \"%.40s\"", type);
        return -1;
    }
    const json_t *single = json_object_get(p, "single");
    const json_t *sp = json_object_get(p, "special_tokens");
    bool after = false;
    size_t i;
    const json_t *x;
    json_array_foreach(single, i, x)
    {
        const json_t *st = json_object_get(x, "SpecialToken");
        if (st == NULL) {
            after = true; /* the Sequence */
            continue;
        }
        const char *name = json_string_value(json_object_get(st, "id"));
        const json_t *ids = json_object_get(json_object_get(sp, name ? name : ""), "ids");
        if (!json_is_array(ids)) {
            cli_errf(err, es, "post_processor: special token \"%.40s\" has no ids",
                     name ? name : "?");
            return -1;
        }
        size_t j;
        const json_t *y;
        json_array_foreach(ids, j, y)
        {
            uint32_t id;
            if (get_id(y, &id) != 0 || id >= t->n_ids || t->str_len[id] == 0) {
                cli_errf(err, es, "post_processor: the id of \"%.40s\" is not a token", name);
                return -1;
            }
            uint32_t **v = after ? &t->post_ids : &t->pre_ids;
            size_t *n = after ? &t->n_post_ids : &t->n_pre_ids;
            uint32_t *nv = realloc(*v, (*n + 1) * sizeof *nv);
            if (nv == NULL)
                return -3;
            nv[(*n)++] = id;
            *v = nv;
        }
    }
    return 0;
}

static int config_text(const json_t *cfg, const char *key, char **dst)
{
    const json_t *v = json_object_get(cfg, key);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    const char *s = json_is_string(v) ? json_string_value(v) : "";
    *dst = strdup(s);
    return *dst ? 0 : -3;
}

/* The config's chat_template: a string, or a list of {"name", "template"} ("default"). */
static int chat_template(const json_t *cfg, char **dst)
{
    const json_t *v = json_object_get(cfg, "chat_template");
    if (json_is_array(v)) {
        size_t i;
        const json_t *x, *pick = NULL;
        json_array_foreach(v, i, x)
        {
            const char *name = json_string_value(json_object_get(x, "name"));
            if (name != NULL && strcmp(name, "default") == 0)
                pick = json_object_get(x, "template");
        }
        v = pick;
    }
    *dst = strdup(json_is_string(v) ? json_string_value(v) : "");
    return *dst ? 0 : -3;
}

/* Whether no vocabulary token holds U+2581 after another character (and U+2581 is a token,
 * the model is not byte-level and has no ignore_merges): then no merge joins across such a
 * U+2581, and hftok_enc.c may cut pieces before it. Cannot fail. */
static bool can_split_space(const hftok *t)
{
    static const char sp[3] = {'\xe2', '\x96', '\x81'};
    if (t->byte_level || t->ignore_merges || hft_vocab_find(t, sp, 3) == UINT32_MAX)
        return false;
    for (size_t id = 0; id < t->n_ids; id++) {
        const char *s = t->arena + t->str_off[id];
        size_t n = t->str_len[id];
        for (size_t i = 1; i + 3 <= n; i++)
            if (memcmp(s + i, sp, 3) == 0 && (i < 3 || memcmp(s + i - 3, sp, 3) != 0))
                return false;
    }
    return true;
}

static int load_tree(hftok *t, const json_t *root, char *err, size_t es)
{
    if (!json_is_object(root)) {
        cli_errf(err, es, "not a tokenizer.json object");
        return -1;
    }
    int rc = load_model(t, json_object_get(root, "model"), err, es);
    if (rc == 0)
        rc = hfp_parse_norm(json_object_get(root, "normalizer"), &t->norm, &t->n_norm, err, es);
    if (rc == 0)
        rc = hfp_parse_pre(json_object_get(root, "pre_tokenizer"), &t->pre, &t->n_pre, err, es);
    if (rc == 0)
        rc = load_added(t, json_object_get(root, "added_tokens"), err, es);
    if (rc == 0)
        rc = load_post(t, json_object_get(root, "post_processor"), err, es);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < t->n_pre; i++)
        t->byte_level |= t->pre[i].type == HP_BYTELEVEL;
    t->split_space = can_split_space(t);
    return decode_vocab(t);
}

static int finish(hftok *t, const char *name, json_t *root, const json_t *cfg, hftok **out,
                  char *err, size_t es)
{
    char msg[400];
    msg[0] = '\0';
    int rc = load_tree(t, root, msg, sizeof msg);
    if (rc == 0)
        rc = config_text(cfg, "bos_token", &t->bos);
    if (rc == 0)
        rc = config_text(cfg, "eos_token", &t->eos);
    if (rc == 0)
        rc = chat_template(cfg, &t->chat_template);
    if (rc != 0) {
        cli_errf(err, es, "%s: %s", name, rc == -3 ? "out of memory" : msg);
        hf_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int hf_load_mem(const char *name, const char *buf, size_t len, hftok **out, char *err,
                size_t err_size)
{
    json_error_t je;
    json_t *root = json_loadb(buf, len, 0, &je);
    if (root == NULL) {
        cli_errf(err, err_size, "%s:%d: not a tokenizer.json (one JSON object): %s", name, je.line,
                 je.text);
        return -1;
    }
    hftok *t = calloc(1, sizeof *t);
    if (t == NULL) {
        json_decref(root);
        cli_errf(err, err_size, "%s: out of memory", name);
        return -3;
    }
    int rc = finish(t, name, root, NULL, out, err, err_size);
    json_decref(root);
    return rc;
}

static int read_all(const char *path, char **buf, size_t *len, char *err, size_t es)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        cli_errf(err, es, "%s: %s", path, strerror(errno));
        return -2;
    }
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    int rc = 0;
    while (b != NULL) {
        if (n == cap) {
            if (cap >= HF_MAX_FILE) {
                cli_errf(err, es, "%s: larger than %u MiB", path, HF_MAX_FILE >> 20);
                rc = -1;
                break;
            }
            char *nb = realloc(b, cap * 2);
            if (nb == NULL) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
            cap *= 2;
        }
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) {
                cli_errf(err, es, "%s: %s", path, strerror(errno));
                rc = -2;
            }
            break;
        }
    }
    fclose(f);
    if (b == NULL) {
        cli_errf(err, es, "%s: out of memory", path);
        return -3;
    }
    if (rc != 0) {
        free(b);
        return rc;
    }
    *buf = b;
    *len = n;
    return 0;
}

int hf_load(const char *path, const char *cfg_path, hftok **out, char *err, size_t err_size)
{
    char *buf;
    size_t len;
    int rc = read_all(path, &buf, &len, err, err_size);
    if (rc != 0)
        return rc;
    json_error_t je;
    json_t *root = json_loadb(buf, len, 0, &je);
    free(buf);
    if (root == NULL) {
        cli_errf(err, err_size, "%s:%d: not a tokenizer.json (one JSON object): %s", path, je.line,
                 je.text);
        return -1;
    }
    json_t *cfg = NULL;
    if (cfg_path != NULL) {
        FILE *f = fopen(cfg_path, "rb");
        if (f != NULL) {
            fclose(f);
            cfg = json_load_file(cfg_path, JSON_DECODE_INT_AS_REAL, &je);
            if (cfg == NULL) {
                json_decref(root);
                cli_errf(err, err_size, "%s:%d: not JSON: %s", cfg_path, je.line, je.text);
                return -1;
            }
        }
    }
    hftok *t = calloc(1, sizeof *t);
    rc = t ? finish(t, path, root, cfg, out, err, err_size) : -3;
    if (t == NULL)
        cli_errf(err, err_size, "%s: out of memory", path);
    json_decref(root);
    json_decref(cfg);
    return rc;
}

void hf_free(hftok *t)
{
    if (t == NULL)
        return;
    free(t->arena);
    free(t->str_off);
    free(t->str_len);
    free(t->dec_off);
    free(t->dec_len);
    free(t->vslot);
    free(t->mslots);
    free(t->add);
    free(t->aslot);
    for (int c = 0; c < 2; c++)
        for (int b = 0; b < 256; b++)
            free(t->alens[c][b].v);
    hfp_free_norm(t->norm, t->n_norm);
    hfp_free_pre(t->pre, t->n_pre);
    free(t->pre_ids);
    free(t->post_ids);
    free(t->bos);
    free(t->eos);
    free(t->chat_template);
    hfb_free(&t->b1);
    hfb_free(&t->b2);
    hfb_free(&t->b3);
    free(t->word);
    free(t->word_org);
    free(t->syms);
    free(t->heap);
    free(t);
}

/* ---- queries ------------------------------------------------------------------------------ */

size_t hf_n_tokens(const hftok *t)
{
    size_t n = 0;
    for (size_t i = 0; i < t->n_ids; i++)
        n += t->str_len[i] != 0;
    return n;
}

const char *hf_form(const hftok *t)
{
    return t->byte_level ? "byte-level BPE" : t->byte_fallback ? "BPE with byte fallback" : "BPE";
}

const char *hf_bos(const hftok *t)
{
    return t->bos ? t->bos : "";
}

const char *hf_eos(const hftok *t)
{
    return t->eos ? t->eos : "";
}

const char *hf_chat_template(const hftok *t)
{
    return t->chat_template ? t->chat_template : "";
}

bool hf_added(const hftok *t, const char *text, size_t len, uint32_t *id)
{
    const added *a = hft_added_find(t, text, len);
    if (a != NULL && id != NULL)
        *id = a->id;
    return a != NULL;
}

bool hf_token_bytes(const hftok *t, uint32_t id, const char **p, size_t *len)
{
    if (id >= t->n_ids || (t->dec_len[id] == 0 && t->str_len[id] == 0))
        return false;
    *p = t->arena + t->dec_off[id];
    *len = t->dec_len[id];
    return true;
}

int hf_check(const hftok *t, char *err, size_t es)
{
    for (size_t id = 0; id < t->n_ids; id++) {
        if (t->str_len[id] == 0 || hft_added_find(t, t->arena + t->str_off[id], t->str_len[id]))
            continue;
        if (hft_vocab_find(t, t->arena + t->str_off[id], t->str_len[id]) != id) {
            cli_errf(err, es, "vocab id %zu is not found by its text", id);
            return -1;
        }
    }
    for (size_t i = 0; t->mslots && i <= t->mmask; i++) {
        const mslot *m = &t->mslots[i];
        if (m->key == UINT64_MAX)
            continue;
        uint32_t a = (uint32_t)(m->key >> 32), b = (uint32_t)m->key;
        if (a >= t->n_ids || b >= t->n_ids || m->id >= t->n_ids ||
            t->str_len[a] + t->str_len[b] != t->str_len[m->id] ||
            memcmp(t->arena + t->str_off[a], t->arena + t->str_off[m->id], t->str_len[a]) != 0 ||
            memcmp(t->arena + t->str_off[b], t->arena + t->str_off[m->id] + t->str_len[a],
                   t->str_len[b]) != 0) {
            cli_errf(err, es, "merge (%u, %u) -> %u does not join its parts", a, b, m->id);
            return -1;
        }
    }
    if (t->n_vocab * 2 > t->vmask + 1 || t->n_merges * 2 > t->mmask + 1) {
        cli_errf(err, es, "a table is more than half full");
        return -1;
    }
    return 0;
}
