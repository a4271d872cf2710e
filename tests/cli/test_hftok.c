/*
 * test_hftok.c - the Hugging Face tokenizer.json reader (src/cli/tok/hftok.h) on small
 * hand-made files whose tokens can be worked out by hand: merge order by rank, byte
 * fallback and unk, added tokens with lstrip/rstrip and the specials switch, the
 * post-processor's tokens, each Split behaviour, Metaspace with and without split,
 * byte-level BPE with the GPT-2 expression and add_prefix_space, NFC through utf8proc,
 * decoding of token texts, and the refusal of unsupported components by name. The real
 * models are checked against the npm reference by tokref_hf_check.c.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hftok.h"
#include "hftok_int.h"

static char err[512];

static hftok *load(const char *json)
{
    hftok *t = NULL;
    int rc = hf_load_mem("t.json", json, strlen(json), &t, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(hf_check(t, err, sizeof err), 0, "%s", err);
    return t;
}

/* Encode text and return the ids as "1 2 3" (static buffer). */
static const char *ids(hftok *t, const char *text, bool specials, bool post)
{
    static char buf[4096];
    uint32_t *v = NULL, *o = NULL;
    size_t n = 0, cap = 0;
    int rc = hf_encode(t, text, strlen(text), specials, post, 0, &v, &o, &n, &cap, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    buf[0] = '\0';
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        at += (size_t)snprintf(buf + at, sizeof buf - at, "%s%u", i ? " " : "", v[i]);
        if (i > 0)
            cr_expect_geq(o[i], o[i - 1], "offsets ascend");
        cr_expect_leq(o[i], strlen(text));
    }
    free(v);
    free(o);
    return buf;
}

#define SPM_MODEL(fallback, merges)                                                                \
    "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, "               \
    "\"byte_fallback\": " fallback ", \"vocab\": {\"<unk>\": 0, \"<0xC3>\": 1, \"<0xA9>\": 2, "    \
    "\"a\": 3, \"b\": 4, \"c\": 5, \"ab\": 6, \"abc\": 7, \"\u2581\": 8, \"\u2581a\": 9, "         \
    "\"bc\": 10}, \"merges\": " merges "}, "                                                       \
    "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", "          \
    "\"prepend\": \"\u2581\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "         \
    "\"content\": \"\u2581\"}]}"

Test(hftok, merges_by_rank_and_byte_fallback)
{
    /* Merges as pairs and as strings: (a b) rank 0 beats (\u2581 a) rank 1, so
     * "\u2581abc" is \u2581 + abc; é is not in the vocabulary: its two bytes. */
    hftok *t = load(SPM_MODEL("true", "[[\"a\", \"b\"], \"\u2581 a\", \"ab c\", \"b c\"]") "}");
    cr_expect_str_eq(ids(t, "abc abc \xc3\xa9", true, false), "8 7 8 7 8 1 2");
    const char *p;
    size_t n;
    cr_assert(hf_token_bytes(t, 9, &p, &n));
    cr_expect(n == 2 && memcmp(p, " a", 2) == 0, "\u2581 decodes to a space");
    cr_assert(hf_token_bytes(t, 1, &p, &n));
    cr_expect(n == 1 && (unsigned char)p[0] == 0xc3, "<0xC3> decodes to its byte");
    cr_expect_str_eq(hf_form(t), "BPE with byte fallback");
    hf_free(t);
    /* Without byte fallback the unknown character is <unk>, consecutive ones fused. */
    t = load(SPM_MODEL("false", "[\"a b\", \"\u2581 a\", \"ab c\", \"b c\"]") "}");
    cr_expect_str_eq(ids(t, "abc \xc3\xa9\xc3\xa9", true, false), "8 7 8 0");
    hf_free(t);
}

Test(hftok, added_tokens_strip_specials_and_post_processor)
{
    hftok *t = load(SPM_MODEL(
        "true",
        "[\"a b\", \"\u2581 a\", \"ab c\", \"b c\"]") ", "
                                                      "\"added_tokens\": [{\"id\": 11, "
                                                      "\"content\": \"<X>\", \"special\": true}, "
                                                      "{\"id\": 12, \"content\": \"<Y>\", "
                                                      "\"special\": false, \"lstrip\": true, "
                                                      "\"rstrip\": true}], "
                                                      "\"post_processor\": {\"type\": "
                                                      "\"TemplateProcessing\", \"single\": ["
                                                      "{\"SpecialToken\": {\"id\": \"<X>\", "
                                                      "\"type_id\": 0}}, {\"Sequence\": {\"id\": "
                                                      "\"A\", "
                                                      "\"type_id\": 0}}, {\"SpecialToken\": "
                                                      "{\"id\": \"<Y>\", \"type_id\": 0}}], "
                                                      "\"special_tokens\": {\"<X>\": {\"id\": "
                                                      "\"<X>\", \"ids\": [11]}, \"<Y>\": {\"id\": "
                                                      "\"<Y>\", \"ids\": [12]}}}}");
    /* Each stretch between added tokens is normalized on its own (its own \u2581 prefix);
     * <Y> takes the spaces on both sides. */
    cr_expect_str_eq(ids(t, "a<X>b  <Y>  c", true, false), "9 11 8 4 12 8 5");
    cr_expect_str_eq(ids(t, "a<X>b  <Y>  c", true, true), "11 9 11 8 4 12 8 5 12");
    /* Specials off: <X> is text (its characters have no token and no <0xXX>: unk, fused);
     * <Y>, not special, still matches. */
    cr_expect_str_eq(ids(t, "a<X>b <Y>", false, false), "9 0 4 12");
    uint32_t id = 0;
    cr_expect(hf_added(t, "<Y>", 3, &id) && id == 12);
    cr_expect(!hf_added(t, "<Y", 2, NULL));
    hf_free(t);
}

#define SPLIT_JSON(behavior)                                                                       \
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"-\": 2, \"a-\": 3, "        \
    "\"-b\": 4}, \"merges\": [\"a -\", \"- b\"]}, \"pre_tokenizer\": {\"type\": \"Split\", "       \
    "\"pattern\": {\"String\": \"-\"}, \"behavior\": \"" behavior "\", \"invert\": false}}"

Test(hftok, split_behaviours)
{
    static const struct {
        const char *behavior, *want;
    } cases[] = {
        {"Isolated", "0 2 1"},         /* a | - | b */
        {"MergedWithPrevious", "3 1"}, /* a- | b */
        {"MergedWithNext", "0 4"},     /* a | -b */
        {"Removed", "0 1"},            /* a | b */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"-\": 2, "
                 "\"a-\": 3, \"-b\": 4}, \"merges\": [\"a -\", \"- b\"]}, \"pre_tokenizer\": "
                 "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"-\"}, \"behavior\": \"%s\"}}",
                 cases[i].behavior);
        hftok *t = load(json);
        cr_expect_str_eq(ids(t, "a-b", true, false), cases[i].want, "%s", cases[i].behavior);
        hf_free(t);
    }
    hftok *t = load(SPLIT_JSON("Isolated"));
    cr_expect_str_eq(ids(t, "a-b", true, false), "0 2 1", "a String pattern");
    hf_free(t);
}

#define MS_JSON(split)                                                                             \
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\u2581\": 0, \"a\": 1, \"\u2581a\": 2, "        \
    "\"\u2581\u2581\": 3}, \"merges\": [\"\u2581 a\", \"\u2581 \u2581\"]}, \"pre_tokenizer\": "    \
    "{\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"always\", "      \
    "\"split\": " split "}}"

Test(hftok, metaspace_split)
{
    /* "   a" is \u2581\u2581\u2581a (no prefix: it starts with a space). Split: a cut before
     * every \u2581 (\u2581 | \u2581 | \u2581a); unsplit: \u2581a merges first, then \u2581\u2581.
     */
    hftok *t = load(MS_JSON("true"));
    cr_expect_str_eq(ids(t, "   a", true, false), "0 0 2");
    cr_expect_str_eq(ids(t, "a", true, false), "2", "the prefix");
    hf_free(t);
    t = load(MS_JSON("false"));
    cr_expect_str_eq(ids(t, "   a", true, false), "3 2");
    hf_free(t);
}

Test(hftok, cut_before_spaces_only_where_no_token_spans_one)
{
    /* "a\u2581" and "a\u2581b" are tokens: a merge joins across the \u2581, so pieces must
     * not be cut before it (a cut would give a | \u2581b: 0 2 1). */
    hftok *t = load("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, "
                    "\"\u2581\": 2, \"a\u2581\": 3, \"a\u2581b\": 4}, \"merges\": "
                    "[\"a \u2581\", \"a\u2581 b\"]}}");
    cr_expect_str_eq(ids(t, "a\u2581b", true, false), "4");
    hf_free(t);
    /* Without such tokens the cut is made, and the tokens are those of the whole piece:
     * \u2581 a merges first (rank 0) either way. */
    t = load("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, "
             "\"\u2581\": 2, \"\u2581a\": 3, \"ab\": 4}, \"merges\": [\"\u2581 a\", "
             "\"a b\"]}}");
    cr_expect_str_eq(ids(t, "ab\u2581ab\u2581\u2581ab", true, false), "4 3 1 2 3 1");
    hf_free(t);
}

/* A byte-level file: the 256 GPT-2 characters as ids 0..255 (id = byte), "Hi" 256 and
 * "\u0120t" 257, merges "H i" and "\u0120 t", with the pre-tokenizer and normalizer given. */
static hftok *byte_level(const char *pre, const char *norm)
{
    json_t *vocab = json_object();
    for (unsigned b = 0; b < 256; b++) {
        char c[3] = {0};
        hfp_byte_char((unsigned char)b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    json_object_set_new(vocab, "Hi", json_integer(256));
    json_object_set_new(vocab, "\xc4\xa0t", json_integer(257));
    json_t *root = json_pack("{s:{s:s, s:o, s:[s, s]}, s:o?, s:o?}", "model", "type", "BPE",
                             "vocab", vocab, "merges", "H i", "\xc4\xa0 t", "pre_tokenizer",
                             json_loads(pre, 0, NULL), "normalizer", json_loads(norm, 0, NULL));
    cr_assert(root != NULL);
    char *s = json_dumps(root, 0);
    json_decref(root);
    hftok *t = load(s);
    free(s);
    return t;
}

Test(hftok, byte_level_gpt2_expression_prefix_space_and_nfc)
{
    hftok *t = byte_level("{\"type\": \"ByteLevel\", \"add_prefix_space\": false}", "null");
    cr_expect_str_eq(ids(t, "Hi there", true, false), "256 257 104 101 114 101");
    const char *p;
    size_t n;
    cr_assert(hf_token_bytes(t, 257, &p, &n));
    cr_expect(n == 2 && memcmp(p, " t", 2) == 0);
    cr_expect_str_eq(hf_form(t), "byte-level BPE");
    /* e + U+0301 stays three bytes without a normalizer. */
    cr_expect_str_eq(ids(t, "e\xcc\x81", true, false), "101 204 129");
    hf_free(t);
    t = byte_level("{\"type\": \"ByteLevel\", \"add_prefix_space\": true}", "{\"type\": \"NFC\"}");
    cr_expect_str_eq(ids(t, "Hi there", true, false), "32 256 257 104 101 114 101");
    /* NFC composes e + U+0301 into U+00E9 (C3 A9). */
    cr_expect_str_eq(ids(t, "e\xcc\x81", true, false), "32 195 169");
    hf_free(t);
}

/* Loading json fails with a message containing want. */
static void refused(const char *json, const char *want)
{
    hftok *t = NULL;
    err[0] = '\0';
    cr_expect_neq(hf_load_mem("t.json", json, strlen(json), &t, err, sizeof err), 0, "%s", json);
    cr_expect(t == NULL);
    cr_expect(strstr(err, want) != NULL, "want '%s' in '%s'", want, err);
    cr_expect(strncmp(err, "t.json", 6) == 0, "names the file: %s", err);
}

Test(hftok, refuses_unsupported_components_by_name)
{
    const char *m = "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}";
    char j[512];
    snprintf(j, sizeof j, "{\"model\": %s, \"normalizer\": {\"type\": \"Precompiled\"}}", m);
    refused(j, "unsupported normalizer \"Precompiled\"");
    snprintf(j, sizeof j, "{\"model\": %s, \"pre_tokenizer\": {\"type\": \"Whitespace\"}}", m);
    refused(j, "unsupported pre-tokenizer \"Whitespace\"");
    snprintf(j, sizeof j, "{\"model\": %s, \"post_processor\": {\"type\": \"BertProcessing\"}}", m);
    refused(j, "unsupported post_processor \"BertProcessing\"");
    refused("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}",
            "unsupported model \"WordPiece\"");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}",
            "merge 0");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}}}", "not an integer");
    refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}}}",
            "id 0 is given to two tokens");
    refused("{\"model\": ", "not a tokenizer.json");
    snprintf(j, sizeof j,
             "{\"model\": %s, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": "
             "\"(\"}, \"behavior\": \"Isolated\"}}",
             m);
    refused(j, "does not compile");
}
