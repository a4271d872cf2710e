/*
 * test_logread.c - tests of the request-log reader's OpenAI format (openai.c), its
 * tokenizers (tokenize.c), per-line and forced format detection, and its gzip and zstd input
 * (logread.c). The token-log and Mooncake formats are also covered by test_plan.c.
 *
 * Expected texts, token boundaries and byte ids are worked out by hand in the comments;
 * words token ids are computed here from the documented rule (XXH32 of the token's bytes,
 * seed 0, plus 1024 when below 1024), not taken from the code under test. Fixtures live in
 * tests/cli/data/replay/ (directory given by KVPREFIX_TEST_DATA); compressed inputs are made in
 * the tests with zlib and libzstd into temporary files.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include <zlib.h>
#include <zstd.h>

#include "jsonl_scan_diff.h"
#include "logread.h"
#include "openai.h"
#include "tokenize.h"

#define IMS TOK_IM_START
#define IME TOK_IM_END

static const char *data_path(const char *name)
{
    static char buf[4096];
    const char *dir = getenv("KVPREFIX_TEST_DATA");
    snprintf(buf, sizeof buf, "%s/replay/%s", dir ? dir : "tests/cli/data", name);
    return buf;
}

/* Open path with the given format and tokenizer (0 for the defaults). */
static log_reader *open_log(const char *path, int format, int tokenizer)
{
    log_options o;
    log_options_init(&o);
    if (format != 0)
        o.format = format;
    if (tokenizer != 0)
        o.tokenizer = tokenizer;
    log_reader *r = NULL;
    char err[512];
    cr_assert_eq(log_open(path, &o, &r, err, sizeof err), 0, "%s: %s", path, err);
    return r;
}

static void next_record(log_reader *r, log_record *rec)
{
    int rc = log_next(r, rec);
    cr_assert_eq(rc, LOG_RECORD, "rc %d: %s", rc, log_error(r));
}

/* The next call must fail with code and a message holding what. */
static void next_error(log_reader *r, int code, const char *what)
{
    log_record rec;
    int rc = log_next(r, &rec);
    cr_assert_eq(rc, code, "expected %d (%s), got %d: %s", code, what, rc, log_error(r));
    cr_assert(strstr(log_error(r), what) != NULL, "expected \"%s\" in: %s", what, log_error(r));
}

static void expect_end(log_reader *r)
{
    log_record rec;
    int rc = log_next(r, &rec);
    cr_assert_eq(rc, LOG_END, "rc %d: %s", rc, log_error(r));
}

/* The documented words id of a token. */
static uint32_t wid(const char *s)
{
    uint32_t h = XXH32(s, strlen(s), 0);
    return h < 1024 ? h + 1024 : h;
}

static void assert_text(const log_record *rec, const char *want)
{
    cr_assert_not_null(rec->text);
    cr_assert_eq(rec->text_len, strlen(want), "text_len %zu, want %zu:\n%s", rec->text_len,
                 strlen(want), rec->text);
    cr_assert(memcmp(rec->text, want, rec->text_len) == 0, "text:\n%s\nwant:\n%s", rec->text, want);
    cr_assert_eq(rec->text[rec->text_len], '\0');
}

/* Check tokens against pieces (NULL-terminated, "" for IM_START, "\x01" for IM_END): each
 * piece is one token at the next offset, with its words id. */
static void assert_words(const log_record *rec, const char *const *pieces)
{
    size_t i = 0, off = 0;
    for (; pieces[i] != NULL; i++) {
        cr_assert_lt(i, rec->n_tokens, "only %zu tokens", rec->n_tokens);
        cr_assert_eq(rec->token_offsets[i], off, "token %zu at %u, want %zu", i,
                     rec->token_offsets[i], off);
        if (pieces[i][0] == '\0') {
            cr_assert_eq(rec->tokens[i], IMS, "token %zu", i);
            off += 12;
        } else if (strcmp(pieces[i], "\x01") == 0) {
            cr_assert_eq(rec->tokens[i], IME, "token %zu", i);
            off += 10;
        } else {
            cr_assert_eq(rec->tokens[i], wid(pieces[i]), "token %zu \"%s\"", i, pieces[i]);
            off += strlen(pieces[i]);
        }
    }
    cr_assert_eq(rec->n_tokens, i);
    cr_assert_eq(off, rec->text_len);
}

/* ---- chat rendering ------------------------------------------------------------------- */

#define S  ""     /* <|im_start|> in assert_words */
#define E  "\x01" /* <|im_end|> in assert_words */
#define NL "\n"

Test(openai, chat_rendering_and_namespace)
{
    log_reader *r = open_log(data_path("openai_chat.jsonl"), 0, 0);
    log_record rec;

    /* Line 1: system + user. Offsets: 0 S, 12 system, 18 \n, 19 Be, 21 " brief", 27 ".",
     * 28 E, 38 \n, 39 S, 51 user, 55 \n, 56 Hi, 58 E, 68 \n, 69 S, 81 assistant, 90 \n;
     * 91 bytes. */
    next_record(r, &rec);
    cr_assert_eq(rec.format, LOG_OPENAI);
    cr_assert_eq(rec.line_no, 1);
    assert_text(&rec, "<|im_start|>system\nBe brief.<|im_end|>\n"
                      "<|im_start|>user\nHi<|im_end|>\n"
                      "<|im_start|>assistant\n");
    const char *const w1[] = {S,      "system", NL,   "Be", " brief", ".", E,           NL, S,
                              "user", NL,       "Hi", E,    NL,       S,   "assistant", NL, NULL};
    assert_words(&rec, w1);
    cr_assert_eq(rec.n_tokens, 17);
    cr_assert_eq(rec.input_length, 17);
    cr_assert_eq(rec.token_offsets[3], 19);
    cr_assert_eq(rec.token_offsets[16], 90);
    cr_assert_str_eq(rec.model, "llama");
    cr_assert_eq(rec.model_len, 5);
    cr_assert_str_eq(rec.tenant, "alice", "user maps to tenant");
    cr_assert_str_eq(rec.cache_salt, "s1");
    cr_assert_null(rec.adapter);
    cr_assert_eq(rec.output_length, 16, "max_completion_tokens wins over max_tokens");
    cr_assert_null(rec.output_tokens);
    cr_assert_eq(rec.n_output_tokens, 0);
    cr_assert(rec.has_timestamp);
    cr_assert_float_eq(rec.timestamp, 1.5, 1e-12);
    cr_assert_null(rec.hash_ids);

    /* Line 2: tools (compacted, keys in given order), parts with an image placeholder,
     * an assistant tool call with null content, a tool message. */
    next_record(r, &rec);
    cr_assert_eq(rec.line_no, 2);
    assert_text(&rec, "<|im_start|>tools\n"
                      "[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":"
                      "{\"b\":1,\"a\":[true,null]}}}]<|im_end|>\n"
                      "<|im_start|>user\nLook: <image_url>ok?<|im_end|>\n"
                      "<|im_start|>assistant\n"
                      "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get\","
                      "\"arguments\":\"{\\\"q\\\": 1}\"}}]<|im_end|>\n"
                      "<|im_start|>tool\n42<|im_end|>\n"
                      "<|im_start|>assistant\n");
    cr_assert_str_eq(rec.model, "m");
    cr_assert_str_eq(rec.tenant, "acme", "tenant overrides user");
    cr_assert_str_eq(rec.adapter, "lora1");
    cr_assert_null(rec.cache_salt);
    cr_assert_eq(rec.output_length, 0);
    cr_assert(!rec.has_timestamp);
    /* Markers: 5 starts and 4 ends, the only tokens below 1024. */
    size_t n_s = 0, n_e = 0;
    for (size_t i = 0; i < rec.n_tokens; i++) {
        n_s += rec.tokens[i] == IMS;
        n_e += rec.tokens[i] == IME;
        if (rec.tokens[i] != IMS && rec.tokens[i] != IME)
            cr_assert_geq(rec.tokens[i], 1024);
        if (i > 0)
            cr_assert_gt(rec.token_offsets[i], rec.token_offsets[i - 1]);
    }
    cr_assert_eq(n_s, 5);
    cr_assert_eq(n_e, 4);

    /* Line 4 (3 is blank): the markers inside user text are ordinary text; "tools": [] is
     * no tools block. Words: "<" "|" "im" "_" "start" "|" ">" "x". */
    next_record(r, &rec);
    cr_assert_eq(rec.line_no, 4);
    assert_text(&rec, "<|im_start|>user\n<|im_start|>x<|im_end|>\n<|im_start|>assistant\n");
    const char *const w4[] = {S,   "user", NL, "<", "|", "im",        "_", "start", "|",
                              ">", "x",    E,  NL,  S,   "assistant", NL,  NULL};
    assert_words(&rec, w4);

    /* Line 5: missing content with tool_calls [], null content; negative max_tokens. */
    next_record(r, &rec);
    assert_text(&rec, "<|im_start|>assistant\n[]<|im_end|>\n<|im_start|>user\n<|im_end|>\n"
                      "<|im_start|>assistant\n");
    cr_assert_eq(rec.output_length, 0);
    cr_assert_null(rec.tenant);
    cr_assert_null(rec.model);
    expect_end(r);
    cr_assert_eq(log_n_records(r), 4);
    cr_assert_eq(log_n_lines(r), 5);
    log_close(r);
}

Test(openai, bytes_tokenizer_chat)
{
    log_reader *r = open_log(data_path("openai_chat.jsonl"), 0, TOK_BYTES);
    log_record rec;
    next_record(r, &rec);
    /* 91 bytes, 56 of them in 3 starts and 2 ends: 91 - 56 + 5 = 40 tokens. */
    const char *plain[] = {"system\nBe brief.", "\n", "user\nHi", "\n", "assistant\n"};
    uint32_t want[40];
    size_t n = 0;
    want[n++] = IMS;
    for (int k = 0; k < 5; k++) {
        for (const char *c = plain[k]; *c; c++)
            want[n++] = (unsigned char)*c;
        if (k == 0 || k == 2)
            want[n++] = IME;
        else if (k == 1 || k == 3)
            want[n++] = IMS;
    }
    cr_assert_eq(n, 40);
    cr_assert_eq(rec.n_tokens, 40);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(rec.tokens[i], want[i], "token %zu: %u, want %u", i, rec.tokens[i], want[i]);
    /* Offsets: 1 -> 12 (s), 17 -> 28 (end), 18 -> 38, 19 -> 39, 20 -> 51, 29 -> 69,
     * 30 -> 81, 39 -> 90. */
    uint32_t idx[] = {0, 1, 7, 8, 16, 17, 18, 19, 20, 25, 27, 28, 29, 30, 39};
    uint32_t off[] = {0, 12, 18, 19, 27, 28, 38, 39, 51, 56, 58, 68, 69, 81, 90};
    for (size_t i = 0; i < sizeof idx / sizeof idx[0]; i++)
        cr_assert_eq(rec.token_offsets[idx[i]], off[i], "token %u at %u, want %u", idx[i],
                     rec.token_offsets[idx[i]], off[i]);

    /* Line 4: "<|im_start|>x" in user text is 13 byte tokens, none of them 256. */
    next_record(r, &rec);
    next_record(r, &rec);
    cr_assert_eq(rec.line_no, 4);
    /* S u s e r \n < | i m _ s t a r t | > x E \n S a s s i s t a n t \n */
    cr_assert_eq(rec.n_tokens, 1 + 5 + 13 + 1 + 1 + 1 + 10);
    cr_assert_eq(rec.tokens[6], '<');
    cr_assert_eq(rec.tokens[7], '|');
    cr_assert_eq(rec.tokens[18], 'x');
    cr_assert_eq(rec.tokens[19], IME);
    size_t n_s = 0;
    for (size_t i = 0; i < rec.n_tokens; i++)
        n_s += rec.tokens[i] == IMS;
    cr_assert_eq(n_s, 2);
    log_close(r);
}

/* ---- completions ---------------------------------------------------------------------- */

Test(openai, completions_and_batch_api)
{
    log_reader *r = open_log(data_path("openai_completions.jsonl"), 0, 0);
    log_record rec;

    /* "Hello,  world 123\n": Hello | , | " " | " world" | " 123" | \n. */
    next_record(r, &rec);
    assert_text(&rec, "Hello,  world 123\n");
    const char *const w1[] = {"Hello", ",", " ", " world", " 123", "\n", NULL};
    assert_words(&rec, w1);
    cr_assert_eq(rec.output_length, 8);
    cr_assert_str_eq(rec.model, "gpt");

    /* Token ids used directly; a non-integer max_completion_tokens falls to max_tokens. */
    next_record(r, &rec);
    cr_assert_eq(rec.format, LOG_OPENAI);
    cr_assert_null(rec.text);
    cr_assert_eq(rec.text_len, 0);
    cr_assert_null(rec.token_offsets);
    cr_assert_eq(rec.n_tokens, 3);
    cr_assert_eq(rec.tokens[0], 1);
    cr_assert_eq(rec.tokens[2], UINT32_MAX);
    cr_assert_eq(rec.input_length, 3);
    cr_assert_eq(rec.output_length, 3);

    next_record(r, &rec); /* [[5, 6]] */
    cr_assert_null(rec.text);
    cr_assert_eq(rec.n_tokens, 2);
    cr_assert_eq(rec.tokens[0], 5);
    cr_assert_eq(rec.tokens[1], 6);

    next_record(r, &rec); /* ["café ok"]: é is C3 A9, a word byte pair */
    assert_text(&rec, "caf\xc3\xa9 ok");
    const char *const w4[] = {"caf\xc3\xa9", " ok", NULL};
    assert_words(&rec, w4);

    /* Batch API completions: the outer timestamp wins, user -> tenant. */
    next_record(r, &rec);
    assert_text(&rec, "a b");
    const char *const w5[] = {"a", " b", NULL};
    assert_words(&rec, w5);
    cr_assert_str_eq(rec.model, "m");
    cr_assert_str_eq(rec.tenant, "u");
    cr_assert(rec.has_timestamp);
    cr_assert_float_eq(rec.timestamp, 2.5, 1e-12);

    /* Batch API chat: outer tenant wins, the body's timestamp is used. */
    next_record(r, &rec);
    assert_text(&rec, "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
    cr_assert_str_eq(rec.tenant, "outer");
    cr_assert_float_eq(rec.timestamp, 4.0, 1e-12);
    expect_end(r);
    log_close(r);

    /* Bytes: "café ok" is 8 byte tokens. */
    r = open_log(data_path("openai_completions.jsonl"), LOG_OPENAI, TOK_BYTES);
    for (int i = 0; i < 4; i++)
        next_record(r, &rec);
    uint32_t want[] = {'c', 'a', 'f', 0xc3, 0xa9, ' ', 'o', 'k'};
    cr_assert_eq(rec.n_tokens, 8);
    for (size_t i = 0; i < 8; i++) {
        cr_assert_eq(rec.tokens[i], want[i]);
        cr_assert_eq(rec.token_offsets[i], i);
    }
    log_close(r);
}

/* ---- errors --------------------------------------------------------------------------- */

Test(openai, every_bad_line)
{
    static const char *const want[] = {
        "batched prompts are not supported: one request per line",
        "batched prompts are not supported",
        "not both",
        "messages must be an array",
        "messages is empty",
        "messages[0] must be an object, not a string",
        "messages[0].role must be a string, not missing",
        "messages[0].content is missing",
        "messages[0].content must be a string, an array of parts or null, not an integer",
        "messages[0].content[0].text must be a string, not missing",
        "messages[0].content[0] must be an object, not a string",
        "messages[0].content[0].type must be a string",
        "messages[0].tool_calls must be an array, not an object",
        "tools must be an array, not an object",
        "prompt must be a string or an array of token ids, not an integer",
        "prompt is empty",
        "prompt is empty",
        "prompt[1] = -2 is outside the token id range",
        "prompt[1] = 4294967296 is outside the token id range",
        "prompt[0][1] must be an integer token id, not a string",
        "prompt[0] must be an integer token id, not a non-integer number",
        "model must be a string or null, not an integer",
        "user must be a string or null, not an array",
        "timestamp must be a number, not a string",
        "max_tokens = 99999999999 is outside 0..4294967295",
        "this one has tokens messages/prompt",
        "this one has hash_ids messages/prompt",
        "url \"/v1/embeddings\" is not supported",
        "url /v1/chat/completions needs \"messages\" in body",
        "url must be a string, not an integer",
        "neither",
        "each line must be a JSON object, not an array",
        "each line must be a JSON object, not a string",
        "invalid JSON", /* an integer too big for jansson */
        "invalid JSON", /* a real that overflows */
        "invalid JSON", /* \u0000 */
        "invalid JSON", /* truncated */
        "invalid JSON", /* duplicate key */
    };
    size_t n = sizeof want / sizeof want[0];
    log_reader *r = open_log(data_path("openai_bad_lines.jsonl"), 0, 0);
    char where[64];
    for (size_t i = 0; i < n; i++) {
        next_error(r, LOG_EINPUT, want[i]);
        snprintf(where, sizeof where, "openai_bad_lines.jsonl:%zu: ", i + 1);
        cr_assert(strstr(log_error(r), where) != NULL, "%s", log_error(r));
    }
    log_record rec;
    next_record(r, &rec); /* the reader goes on after bad lines */
    cr_assert_eq(rec.line_no, n + 1);
    assert_text(&rec, "ok");
    expect_end(r);
    log_close(r);
}

Test(openai, invalid_utf8_is_reported_as_such)
{
    log_reader *r = open_log(data_path("openai_bad_utf8.jsonl"), 0, 0);
    next_error(r, LOG_EINPUT, "openai_bad_utf8.jsonl:1: invalid JSON");
    cr_assert(strstr(log_error(r), "not valid UTF-8") != NULL, "%s", log_error(r));
    next_error(r, LOG_EINPUT, "not valid UTF-8");
    log_record rec;
    next_record(r, &rec);
    cr_assert_eq(rec.line_no, 3);
    expect_end(r);
    log_close(r);
}

Test(openai, render_limit)
{
    /* The text bound is a safety net that valid lines do not reach with logread's 8x
     * limit; a small limit given directly shows the error. */
    json_error_t jerr;
    json_t *o =
        json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"hello\"}]}", 0, &jerr);
    cr_assert_not_null(o);
    oai_prompt p;
    memset(&p, 0, sizeof p);
    char err[256];
    cr_assert_eq(oai_render(o, 20, &p, err, sizeof err), LOG_EINPUT);
    cr_assert(strstr(err, "would exceed 20 bytes") != NULL, "%s", err);
    /* 12 + 5 + 5 + 11 + 22 = 55 bytes fit in 55. */
    cr_assert_eq(oai_render(o, 55, &p, err, sizeof err), 0, "%s", err);
    cr_assert_eq(p.text_len, 55);
    cr_assert_eq(p.n_marks, 3);
    cr_assert_eq(p.marks[1].offset, 22);
    cr_assert_eq(p.marks[1].id, IME);
    cr_assert(p.chat);
    oai_prompt_free(&p);
    oai_prompt_free(NULL);
    json_decref(o);
}

/* ---- tokenizers ----------------------------------------------------------------------- */

static size_t tok(int kind, const char *s, const tok_mark *m, size_t n_m, uint32_t *ids,
                  uint32_t *offs)
{
    size_t n = tok_split(kind, s, strlen(s), m, n_m, ids, offs);
    cr_assert_eq(tok_split(kind, s, strlen(s), m, n_m, NULL, NULL), n, "the counting pass agrees");
    return n;
}

Test(tokenize, words_rules)
{
    uint32_t ids[64], offs[64];
    /* The header's example: "Hi" "," " " " you" "\n". */
    cr_assert_eq(tok(TOK_WORDS, "Hi,  you\n", NULL, 0, ids, offs), 5);
    uint32_t o1[] = {0, 2, 3, 4, 8};
    for (int i = 0; i < 5; i++)
        cr_assert_eq(offs[i], o1[i]);
    cr_assert_eq(ids[3], wid(" you"));
    cr_assert_eq(ids[2], wid(" "));

    /* Tab and newline before a word are their own tokens; digits and UTF-8 join words:
     * "\t" "x1" "\n" "na\xc3\xafve" " caf\xc3\xa9" " " " " "-" "2" */
    cr_assert_eq(tok(TOK_WORDS, "\tx1\nna\xc3\xafve caf\xc3\xa9  -2", NULL, 0, ids, offs), 9);
    uint32_t o2[] = {0, 1, 3, 4, 10, 16, 17, 18, 19};
    for (int i = 0; i < 9; i++)
        cr_assert_eq(offs[i], o2[i], "token %d at %u", i, offs[i]);
    cr_assert_eq(ids[4], wid(" caf\xc3\xa9"));
    cr_assert_eq(tok(TOK_WORDS, "", NULL, 0, ids, offs), 0);

    /* Markers only where given: "<|im_start|>ab" is 8 tokens as text, 2 with a marker. */
    cr_assert_eq(tok(TOK_WORDS, "<|im_start|>ab", NULL, 0, ids, offs), 8);
    tok_mark m[] = {{0, IMS}, {14, IME}};
    cr_assert_eq(tok(TOK_WORDS, "<|im_start|>ab<|im_end|>", m, 2, ids, offs), 3);
    cr_assert_eq(ids[0], IMS);
    cr_assert_eq(ids[1], wid("ab"));
    cr_assert_eq(ids[2], IME);
    cr_assert_eq(offs[2], 14);
    /* A space right before a marker is a token by itself, not part of a word. */
    tok_mark m2[] = {{2, IME}};
    cr_assert_eq(tok(TOK_WORDS, "a <|im_end|>", m2, 1, ids, offs), 3);
    cr_assert_eq(ids[1], wid(" "));
}

Test(tokenize, words_ids_avoid_reserved_range)
{
    /* Find a decimal number whose XXH32 is below 1024 (about one in 4 million) and check
     * that its token id is moved up by 1024. */
    char s[32];
    uint32_t h = 0;
    unsigned i;
    for (i = 0; i < 100000000u; i++) {
        snprintf(s, sizeof s, "%u", i);
        h = XXH32(s, strlen(s), 0);
        if (h < 1024)
            break;
    }
    cr_assert_lt(h, 1024, "no number below 1e8 hashes below 1024");
    uint32_t id, off;
    cr_assert_eq(tok(TOK_WORDS, s, NULL, 0, &id, &off), 1);
    cr_assert_eq(id, h + 1024, "\"%s\": XXH32 %u, id %u", s, h, id);
}

Test(tokenize, bytes_rules)
{
    uint32_t ids[64], offs[64];
    cr_assert_eq(tok(TOK_BYTES, "a \xff\n", NULL, 0, ids, offs), 4);
    cr_assert_eq(ids[0], 'a');
    cr_assert_eq(ids[1], ' ');
    cr_assert_eq(ids[2], 0xff);
    cr_assert_eq(ids[3], '\n');
    tok_mark m[] = {{1, IMS}};
    cr_assert_eq(tok(TOK_BYTES, "x<|im_start|>y", m, 1, ids, offs), 3);
    cr_assert_eq(ids[1], IMS);
    cr_assert_eq(offs[2], 13);
    cr_assert_eq(tok_mark_bytes(IMS), 12);
    cr_assert_eq(tok_mark_bytes(IME), 10);
    cr_assert_eq(tok_mark_bytes(7), 0);
}

/* ---- formats -------------------------------------------------------------------------- */

Test(formats, detected_per_line)
{
    log_reader *r = open_log(data_path("mixed.jsonl"), 0, 0);
    log_record rec;
    next_record(r, &rec);
    cr_assert_eq(rec.format, LOG_TOKENS);
    cr_assert_null(rec.text);
    cr_assert_null(rec.token_offsets);
    next_record(r, &rec);
    cr_assert_eq(rec.format, LOG_MOONCAKE);
    cr_assert_null(rec.text);
    next_record(r, &rec);
    cr_assert_eq(rec.format, LOG_OPENAI);
    cr_assert_eq(rec.n_tokens, 2); /* "one" " two" */
    expect_end(r);
    log_close(r);
}

Test(formats, forced)
{
    log_reader *r = open_log(data_path("mixed.jsonl"), LOG_TOKENS, 0);
    log_record rec;
    next_record(r, &rec);
    next_error(r, LOG_EINPUT,
               "mixed.jsonl:2: expected a token log line (with \"tokens\"), but this line is a "
               "Mooncake trace line");
    next_error(r, LOG_EINPUT, "but this line is an OpenAI request");
    expect_end(r);
    log_close(r);

    r = open_log(data_path("mixed.jsonl"), LOG_OPENAI, 0);
    next_error(r, LOG_EINPUT, "expected an OpenAI request");
    next_error(r, LOG_EINPUT, "Mooncake");
    next_record(r, &rec);
    cr_assert_eq(rec.format, LOG_OPENAI);
    log_close(r);

    r = open_log(data_path("mixed.jsonl"), LOG_MOONCAKE, 0);
    next_error(r, LOG_EINPUT, "expected a Mooncake trace line");
    next_record(r, &rec);
    cr_assert_eq(rec.format, LOG_MOONCAKE);
    log_close(r);

    r = open_log(data_path("short.jsonl"), LOG_MOONCAKE, 0); /* "{}" */
    next_error(r, LOG_EINPUT, "none of the known formats");
    log_close(r);

    log_options o;
    log_options_init(&o);
    cr_assert_eq(o.format, 0);
    cr_assert_eq(o.tokenizer, TOK_WORDS);
    char err[256];
    o.format = 4;
    r = NULL;
    cr_assert_eq(log_open(data_path("mixed.jsonl"), &o, &r, err, sizeof err), LOG_EIO);
    cr_assert_null(r);
    cr_assert(strstr(err, "unknown log format 4") != NULL, "%s", err);
    o.format = 0;
    o.tokenizer = 3;
    cr_assert_eq(log_open(data_path("mixed.jsonl"), &o, &r, err, sizeof err), LOG_EIO);
    cr_assert(strstr(err, "tokenizer 3") != NULL, "%s", err);
}

/* ---- compressed, empty and large input ------------------------------------------------ */

/* Write n bytes to a new temporary file; returns its path (static storage per slot). */
static const char *temp_file(int slot, const void *data, size_t n)
{
    static char paths[4][64];
    snprintf(paths[slot], sizeof paths[slot], "/tmp/kvp_logread_XXXXXX");
    int fd = mkstemp(paths[slot]);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, data, n), (ssize_t)n);
    close(fd);
    return paths[slot];
}

/* Lines of the mixed fixture, as text. */
static const char mixed_text[] =
    "{\"tokens\": [1, 2, 3], \"output_tokens\": [4], \"model\": \"m\"}\n"
    "{\"timestamp\": 10, \"input_length\": 3, \"output_length\": 2, \"hash_ids\": [7]}\n"
    "{\"prompt\": \"one two\", \"model\": \"m\"}\n";

static void expect_mixed(log_reader *r, int times)
{
    log_record rec;
    for (int t = 0; t < times; t++) {
        for (int f = LOG_TOKENS; f <= LOG_OPENAI; f++) {
            next_record(r, &rec);
            cr_assert_eq(rec.format, f);
        }
    }
    expect_end(r);
}

Test(input, gzip_whatever_the_name)
{
    char path[] = "/tmp/kvp_logread_gzXXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    gzFile gz = gzdopen(fd, "wb");
    cr_assert_not_null(gz);
    cr_assert_eq(gzwrite(gz, mixed_text, sizeof mixed_text - 1), (int)sizeof mixed_text - 1);
    cr_assert_eq(gzclose(gz), Z_OK);
    log_reader *r = open_log(path, 0, 0);
    expect_mixed(r, 1);
    log_close(r);

    /* Truncated gzip: an I/O error naming the file. */
    FILE *f = fopen(path, "rb");
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    const char *cut = temp_file(0, buf, n / 2);
    r = open_log(cut, 0, 0);
    log_record rec;
    int rc;
    while ((rc = log_next(r, &rec)) == LOG_RECORD)
        ;
    cr_assert_eq(rc, LOG_EIO, "rc %d: %s", rc, log_error(r));
    cr_assert(strstr(log_error(r), cut) != NULL, "%s", log_error(r));
    cr_assert(strstr(log_error(r), "gzip") != NULL, "%s", log_error(r));
    expect_end(r);
    log_close(r);
    unlink(path);
    unlink(cut);
}

/* Compress text as one zstd frame into a malloc'd buffer. */
static void *zstd_frame(const char *text, size_t n, size_t *out_n)
{
    size_t cap = ZSTD_compressBound(n);
    void *z = malloc(cap);
    cr_assert_not_null(z);
    *out_n = ZSTD_compress(z, cap, text, n, 3);
    cr_assert(!ZSTD_isError(*out_n), "%s", ZSTD_getErrorName(*out_n));
    return z;
}

Test(input, zstd_two_frames_and_stdin)
{
    size_t zn;
    char *z = zstd_frame(mixed_text, sizeof mixed_text - 1, &zn);
    char *two = malloc(2 * zn);
    memcpy(two, z, zn);
    memcpy(two + zn, z, zn);
    const char *path = temp_file(0, two, 2 * zn); /* no .zst suffix */
    log_reader *r = open_log(path, 0, 0);
    expect_mixed(r, 2);
    log_close(r);

    /* The same through standard input. */
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(dup2(fd, STDIN_FILENO), STDIN_FILENO);
    close(fd);
    r = open_log("-", 0, 0);
    expect_mixed(r, 2);
    log_close(r);
    unlink(path);
    free(two);
    free(z);
}

Test(input, zstd_large_streamed)
{
    /* About 3 MB of lines in two frames: many input refills, output crossing buffer
     * growths, a frame boundary inside a read. */
    size_t n_lines = 50000, cap = n_lines * 64;
    char *text = malloc(cap);
    size_t len = 0;
    for (size_t i = 0; i < n_lines; i++)
        len +=
            (size_t)snprintf(text + len, cap - len, "{\"prompt\": \"line %zu of the log\"}\n", i);
    size_t half = len / 2;
    while (text[half - 1] != '\n')
        half++;
    size_t z1n, z2n;
    char *z1 = zstd_frame(text, half, &z1n);
    char *z2 = zstd_frame(text + half, len - half, &z2n);
    char *both = malloc(z1n + z2n);
    memcpy(both, z1, z1n);
    memcpy(both + z1n, z2, z2n);
    const char *path = temp_file(0, both, z1n + z2n);
    log_reader *r = open_log(path, 0, 0);
    log_record rec;
    for (size_t i = 0; i < n_lines; i++) {
        next_record(r, &rec);
        cr_assert_eq(rec.n_tokens, 5); /* "line" " N" " of" " the" " log" */
    }
    expect_end(r);
    log_close(r);
    unlink(path);
    free(both);
    free(z2);
    free(z1);
    free(text);
}

Test(input, zstd_truncated_and_corrupt)
{
    size_t zn;
    char *z = zstd_frame(mixed_text, sizeof mixed_text - 1, &zn);
    const char *cut = temp_file(0, z, zn - 3);
    log_reader *r = open_log(cut, 0, 0);
    log_record rec;
    int rc;
    while ((rc = log_next(r, &rec)) == LOG_RECORD)
        ;
    cr_assert_eq(rc, LOG_EIO, "rc %d: %s", rc, log_error(r));
    cr_assert(strstr(log_error(r), cut) != NULL, "%s", log_error(r));
    cr_assert(strstr(log_error(r), "truncated zstd data") != NULL, "%s", log_error(r));
    expect_end(r);
    log_close(r);
    unlink(cut);

    /* The magic alone is a truncated frame; the magic and garbage is corrupt; a valid
     * frame followed by garbage fails after the frame's records. */
    const char *magic = temp_file(0, "\x28\xb5\x2f\xfd", 4);
    r = open_log(magic, 0, 0);
    next_error(r, LOG_EIO, "truncated zstd data");
    log_close(r);
    unlink(magic);
    const char *bad = temp_file(0, "\x28\xb5\x2f\xfdgarbage, not a frame", 25);
    r = open_log(bad, 0, 0);
    next_error(r, LOG_EIO, "corrupt zstd data");
    log_close(r);
    unlink(bad);
    char *tail = malloc(zn + 8);
    memcpy(tail, z, zn);
    memcpy(tail + zn, "garbage!", 8);
    const char *trail = temp_file(0, tail, zn + 8);
    r = open_log(trail, 0, 0);
    for (int i = 0; i < 3; i++)
        next_record(r, &rec);
    next_error(r, LOG_EIO, "trailing data after the last zstd frame");
    expect_end(r);
    log_close(r);
    unlink(trail);
    free(tail);
    free(z);
}

Test(input, empty_and_tiny_files)
{
    log_reader *r = open_log(data_path("empty.jsonl"), 0, 0);
    expect_end(r);
    cr_assert_eq(log_n_lines(r), 0);
    log_close(r);
    r = open_log(data_path("short.jsonl"), 0, 0); /* 2 bytes, shorter than the magic */
    next_error(r, LOG_EINPUT, "short.jsonl:1: neither");
    expect_end(r);
    log_close(r);
    /* An empty zstd frame holds no lines. */
    size_t zn;
    char *z = zstd_frame("", 0, &zn);
    const char *path = temp_file(0, z, zn);
    r = open_log(path, 0, 0);
    expect_end(r);
    log_close(r);
    unlink(path);
    free(z);
}

Test(input, large_line)
{
    /* A 100 MB line made of one JSON string: one words token of 100 MB minus 2 bytes... */
    size_t n = (size_t)100 << 20;
    char *line = malloc(n + 1);
    cr_assert_not_null(line);
    memcpy(line, "{\"prompt\": \"", 12);
    memset(line + 12, 'a', n - 14);
    memcpy(line + n - 2, "\"}", 2);
    line[n] = '\n';
    const char *path = temp_file(0, line, n + 1);
    free(line);

    log_options o;
    log_options_init(&o);
    o.max_line_bytes = (size_t)128 << 20;
    log_reader *r = NULL;
    char err[256];
    cr_assert_eq(log_open(path, &o, &r, err, sizeof err), 0, "%s", err);
    log_record rec;
    next_record(r, &rec);
    cr_assert_eq(rec.text_len, n - 14);
    cr_assert_eq(rec.n_tokens, 1);
    cr_assert_eq(rec.token_offsets[0], 0);
    expect_end(r);
    log_close(r);

    /* Over the limit: a clear ENOMEM naming the line and the limit, then the end. */
    o.max_line_bytes = (size_t)1 << 20;
    cr_assert_eq(log_open(path, &o, &r, err, sizeof err), 0, "%s", err);
    next_error(r, LOG_ENOMEM, ":1: line longer than 1048576 bytes");
    expect_end(r);
    log_close(r);
    unlink(path);
}

/* ---- jansson out of memory ------------------------------------------------------------- */

static int json_allocs_left; /* allocations jansson may still make */

static void *failing_malloc(size_t n)
{
    return json_allocs_left-- > 0 ? malloc(n) : NULL;
}

/* When jansson cannot allocate, the line is reported as out of memory (LOG_ENOMEM, and the
 * message says so), not as "invalid JSON at column -1". Token lines go to the scanner, so
 * the reader is told to use jansson for every line (KVPREFIX_LOG_PARSER=jansson). */
Test(input, json_out_of_memory_is_named)
{
    setenv("KVPREFIX_LOG_PARSER", "jansson", 1);
    char line[65536];
    size_t n = (size_t)snprintf(line, sizeof line, "{\"tokens\": [");
    for (int i = 0; i < 5000; i++)
        n += (size_t)snprintf(line + n, sizeof line - n, "%s%d", i ? "," : "", i);
    n += (size_t)snprintf(line + n, sizeof line - n, "]}\n");
    const char *path = temp_file(0, line, n);
    log_reader *r = open_log(path, 0, 0);
    unsetenv("KVPREFIX_LOG_PARSER");
    log_record rec;
    json_allocs_left = 100;
    json_set_alloc_funcs(failing_malloc, free);
    int rc = log_next(r, &rec);
    json_set_alloc_funcs(malloc, free);
    cr_expect_eq(rc, LOG_ENOMEM);
    cr_expect(strstr(log_error(r), ":1: out of memory parsing a ") != NULL, "%s", log_error(r));
    cr_expect(strstr(log_error(r), "invalid JSON") == NULL, "%s", log_error(r));
    log_close(r);
    unlink(path);
}

/* ---- the scanner against jansson, through the whole reader ------------------------------ */

/* Both parsers on the same input: log_options.parser LOG_PARSER_SCAN (js_scan for token and
 * Mooncake lines) and LOG_PARSER_JANSSON (json_loadb for every line, the reader as it was)
 * must return the same codes, the same records (every field, byte for byte) and the same
 * messages; the one allowed difference is the text after "invalid JSON at column " (each
 * parser words its syntax errors its own way, and may name a different first error: jansson
 * decodes UTF-8 before it looks at tokens, so in "[n\x9e" it names the byte 0x9e where the
 * scanner names the bad literal), where both must still agree on the line and on the
 * carriage-return note. */

typedef struct diff_stats {
    size_t n_files;       /* inputs read */
    size_t n_records;     /* records compared */
    size_t n_errors;      /* line errors compared (same message) */
    size_t n_json_errors; /* syntax errors compared (same place and notes) */
} diff_stats;

static void same_bytes(const void *a, size_t na, const void *b, size_t nb, const char *what,
                       const char *where)
{
    cr_assert_eq(a == NULL, b == NULL, "%s: %s: NULL on one side only", where, what);
    cr_assert_eq(na, nb, "%s: %s: %zu against %zu", where, what, na, nb);
    if (a != NULL && na > 0)
        cr_assert(memcmp(a, b, na) == 0, "%s: %s differ", where, what);
}

static void same_record(const log_record *x, const log_record *y, const char *where)
{
    cr_assert_eq(x->line_no, y->line_no, "%s", where);
    cr_assert_eq(x->format, y->format, "%s", where);
    same_bytes(x->model, x->model_len, y->model, y->model_len, "model", where);
    same_bytes(x->adapter, x->adapter_len, y->adapter, y->adapter_len, "adapter", where);
    same_bytes(x->tenant, x->tenant_len, y->tenant, y->tenant_len, "tenant", where);
    same_bytes(x->cache_salt, x->cache_salt_len, y->cache_salt, y->cache_salt_len, "cache_salt",
               where);
    same_bytes(x->tokens, x->n_tokens * 4, y->tokens, y->n_tokens * 4, "tokens", where);
    same_bytes(x->output_tokens, x->n_output_tokens * 4, y->output_tokens, y->n_output_tokens * 4,
               "output_tokens", where);
    same_bytes(x->hash_ids, x->n_hash_ids * 8, y->hash_ids, y->n_hash_ids * 8, "hash_ids", where);
    cr_assert_eq(x->input_length, y->input_length, "%s", where);
    cr_assert_eq(x->output_length, y->output_length, "%s", where);
    cr_assert_eq(x->has_timestamp, y->has_timestamp, "%s", where);
    cr_assert(memcmp(&x->timestamp, &y->timestamp, sizeof x->timestamp) == 0, "%s: timestamp",
              where);
    same_bytes(x->text, x->text_len, y->text, y->text_len, "text", where);
    same_bytes(x->token_offsets, x->token_offsets ? x->n_tokens * 4 : 0, y->token_offsets,
               y->token_offsets ? y->n_tokens * 4 : 0, "token_offsets", where);
    if (x->model)
        cr_assert_eq(x->model[x->model_len], '\0', "%s", where);
}

static void same_error(const char *a, const char *b, const char *where, diff_stats *st)
{
    const char *tag = ": invalid JSON at column ";
    const char *ja = strstr(a, tag), *jb = strstr(b, tag);
    cr_assert_eq(ja == NULL, jb == NULL, "%s:\n  scanner: %s\n  jansson: %s", where, a, b);
    if (ja == NULL) {
        cr_assert_str_eq(a, b, "%s", where);
        st->n_errors += a[0] != '\0';
        return;
    }
    cr_assert_eq(ja - a, jb - b, "%s:\n  scanner: %s\n  jansson: %s", where, a, b);
    cr_assert(strncmp(a, b, (size_t)(ja - a)) == 0, "%s: %s / %s", where, a, b);
    cr_assert_eq(strstr(a, "carriage return") == NULL, strstr(b, "carriage return") == NULL,
                 "%s:\n  scanner: %s\n  jansson: %s", where, a, b);
    st->n_json_errors++;
}

/* Read path with both parsers in lock step and compare every call. */
static void diff_file(const char *path, const log_options *base, diff_stats *st)
{
    log_options oa = *base, ob = *base;
    oa.parser = LOG_PARSER_SCAN;
    ob.parser = LOG_PARSER_JANSSON;
    log_reader *a = NULL, *b = NULL;
    char ea[512] = "", eb[512] = "";
    int ra = log_open(path, &oa, &a, ea, sizeof ea), rb = log_open(path, &ob, &b, eb, sizeof eb);
    cr_assert_eq(ra, rb, "%s: open", path);
    cr_assert_str_eq(ea, eb, "%s: open", path);
    if (ra != 0)
        return;
    st->n_files++;
    char where[600];
    for (int call = 0; call < 200000; call++) {
        log_record x, y;
        memset(&x, 0, sizeof x);
        memset(&y, 0, sizeof y);
        ra = log_next(a, &x);
        rb = log_next(b, &y);
        snprintf(where, sizeof where, "%s (format %d, hash block %u, tokenizer %d), call %d", path,
                 base->format, base->hash_block_size, base->tokenizer, call);
        cr_assert_eq(ra, rb, "%s: scanner %d (%s), jansson %d (%s)", where, ra, log_error(a), rb,
                     log_error(b));
        same_error(log_error(a), log_error(b), where, st);
        if (ra == LOG_RECORD) {
            same_record(&x, &y, where);
            st->n_records++;
        }
        if (ra == LOG_END)
            break;
    }
    cr_assert_eq(log_n_records(a), log_n_records(b), "%s", path);
    cr_assert_eq(log_n_lines(a), log_n_lines(b), "%s", path);
    log_close(a);
    log_close(b);
}

/* Every file of directory dir through diff_file with each of the option sets the fuzz
 * harness uses (defaults; 4-token hash blocks and the bytes tokenizer; each format forced;
 * no block-size check). */
static void diff_dir(const char *dir, diff_stats *st)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        for (int set = 0; set < 6; set++) {
            log_options o;
            log_options_init(&o);
            o.max_line_bytes = (size_t)1 << 20;
            if (set == 1) {
                o.hash_block_size = 4;
                o.tokenizer = TOK_BYTES;
            }
            if (set >= 2 && set <= 4)
                o.format = set - 1; /* LOG_TOKENS, LOG_MOONCAKE, LOG_OPENAI */
            if (set == 5)
                o.hash_block_size = 0;
            diff_file(path, &o, st);
        }
    }
    closedir(d);
}

/* The data directory's sibling fuzz corpus: tests/cli/data -> fuzz/corpus/NAME. */
static const char *corpus_path(const char *name)
{
    static char buf[4096];
    const char *dir = getenv("KVPREFIX_TEST_DATA");
    snprintf(buf, sizeof buf, "%s/../../../fuzz/corpus/%s", dir ? dir : "tests/cli/data", name);
    return buf;
}

Test(scanner, same_as_jansson_on_fixtures_and_corpus)
{
    const char *dir = getenv("KVPREFIX_TEST_DATA");
    char plan[4096], replay[4096];
    snprintf(plan, sizeof plan, "%s/plan", dir ? dir : "tests/cli/data");
    snprintf(replay, sizeof replay, "%s/replay", dir ? dir : "tests/cli/data");
    diff_stats st = {0, 0, 0, 0};
    diff_dir(replay, &st);
    diff_dir(plan, &st);
    diff_dir(corpus_path("replay_input"), &st);
    diff_dir(corpus_path("jsonl_scan"), &st);
    cr_log_info("%zu files x option sets, %zu records, %zu messages, %zu syntax errors", st.n_files,
                st.n_records, st.n_errors, st.n_json_errors);
    /* The inputs hold every kind of line: a run that compared nothing would prove nothing. */
    cr_assert_gt(st.n_records, 400);
    cr_assert_gt(st.n_errors, 900);
    cr_assert_gt(st.n_json_errors, 600);
}

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

/* One array element: mostly a valid id, sometimes one on or past a boundary or of a wrong
 * kind. */
static const char *gen_id(uint64_t *s, char *buf, size_t size)
{
    static const char *odd[] = {
        "0",   "4294967295",          "4294967296",          "-1", "1.0",  "1e3", "\"7\"", "null",
        "[1]", "9223372036854775807", "9223372036854775808", "-0", "true", "{}"};
    if (rnd(s) % 40 == 0)
        return odd[rnd(s) % (sizeof odd / sizeof odd[0])];
    snprintf(buf, size, "%llu", (unsigned long long)(rnd(s) % 200000));
    return buf;
}

/* An array of n ids with random spacing. */
static size_t gen_array(uint64_t *s, char *out, size_t cap, size_t n)
{
    size_t k = (size_t)snprintf(out, cap, "[");
    char id[32];
    for (size_t i = 0; i < n && k + 64 < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%s%s", i ? "," : "", rnd(s) % 8 == 0 ? " " : "",
                              gen_id(s, id, sizeof id));
    return k + (size_t)snprintf(out + k, cap - k, "]");
}

/* A token-log or Mooncake line with its fields in random order, optional namespace strings
 * (escapes, UTF-8, null, a wrong kind), timestamps of every kind and an unknown field. */
static size_t gen_log_line(uint64_t *s, char *out, size_t cap)
{
    static const char *strs[] = {
        "\"llama\"", "\"t\\u00e9n\\\"a\\nt\"",   "null", "\"\"",
        "7",         "\"\xc3\xa9\xe2\x82\xac\"", "[]",   "\"a\\ud83d\\ude00\""};
    static const char *keys[] = {"model", "adapter", "tenant", "cache_salt"};
    static const char *stamps[] = {"12", "1.5e3", "0.25", "-1", "null", "\"x\"", "1e400"};
    char f[10][2048]; /* at most 9 fields */
    int nf = 0;
    bool trace = rnd(s) % 3 == 0;
    if (trace) {
        uint64_t len = rnd(s) % 3000 + (rnd(s) % 50 == 0 ? 0 : 1);
        size_t n = (size_t)(len / 512 + (len % 512 != 0)) + (rnd(s) % 30 == 0);
        snprintf(f[nf++], sizeof f[0], "\"input_length\": %llu", (unsigned long long)len);
        if (rnd(s) % 30 != 0)
            snprintf(f[nf++], sizeof f[0], "\"output_length\": %llu",
                     (unsigned long long)(rnd(s) % 500));
        size_t k = (size_t)snprintf(f[nf], sizeof f[0], "\"hash_ids\":");
        gen_array(s, f[nf++] + k, sizeof f[0] - k, n);
    } else {
        size_t k = (size_t)snprintf(f[nf], sizeof f[0], "\"tokens\": ");
        gen_array(s, f[nf++] + k, sizeof f[0] - k, rnd(s) % 120 + (rnd(s) % 50 != 0));
        if (rnd(s) % 2) {
            k = (size_t)snprintf(f[nf], sizeof f[0], "\"output_tokens\":");
            gen_array(s, f[nf++] + k, sizeof f[0] - k, rnd(s) % 30);
        }
    }
    for (int i = 0; i < 4; i++)
        if (rnd(s) % 3 == 0)
            snprintf(f[nf++], sizeof f[0], "\"%s\": %s", keys[i],
                     strs[rnd(s) % (sizeof strs / sizeof strs[0])]);
    if (rnd(s) % 2)
        snprintf(f[nf++], sizeof f[0], "\"timestamp\": %s",
                 stamps[rnd(s) % (sizeof stamps / sizeof stamps[0])]);
    if (rnd(s) % 4 == 0)
        snprintf(f[nf++], sizeof f[0], "\"meta\": {\"a\": [1, {\"b\": null}], \"c\": \"d\"}");
    for (int i = nf - 1; i > 0; i--) { /* shuffle */
        int j = (int)(rnd(s) % (uint64_t)(i + 1));
        char t[2048];
        memcpy(t, f[i], sizeof t);
        memcpy(f[i], f[j], sizeof t);
        memcpy(f[j], t, sizeof t);
    }
    size_t k = (size_t)snprintf(out, cap, "{");
    for (int i = 0; i < nf && k + 2100 < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%s", i ? ", " : "", f[i]);
    return k + (size_t)snprintf(out + k, cap - k, "}");
}

/* Generated token-log and Mooncake lines, the scanner's own generator of JSON values
 * (tests/cli/jsonl_scan_diff.c), and byte-level mutants of both, through both readers. */
Test(scanner, same_as_jansson_on_generated_lines, .timeout = 120)
{
    size_t cap = (size_t)12 << 20, n = 0;
    char *buf = malloc(cap);
    cr_assert_not_null(buf);
    uint64_t seed = 0x5ca77e12;
    char line[20000], mut[20000 + 16];
    while (n + 3 * sizeof mut < cap) {
        size_t len = rnd(&seed) % 4 == 0 ? jsd_generate(&seed, line, 4096)
                                         : gen_log_line(&seed, line, sizeof line);
        memcpy(buf + n, line, len);
        n += len;
        buf[n++] = '\n';
        if (rnd(&seed) % 3 != 0)
            continue;
        size_t mlen = jsd_mutate(&seed, line, len, mut, sizeof mut);
        memcpy(buf + n, mut, mlen);
        n += mlen;
        buf[n++] = '\n';
    }
    const char *path = temp_file(0, buf, n);
    free(buf);
    diff_stats st = {0, 0, 0, 0};
    for (int set = 0; set < 3; set++) {
        log_options o;
        log_options_init(&o);
        o.hash_block_size = set == 0 ? 0 : set == 1 ? 4 : 512;
        diff_file(path, &o, &st);
    }
    unlink(path);
    cr_log_info("%zu records, %zu messages, %zu syntax errors", st.n_records, st.n_errors,
                st.n_json_errors);
    cr_assert_gt(st.n_records, 10000);
    cr_assert_gt(st.n_errors, 10000);
    cr_assert_gt(st.n_json_errors, 1000);
}
