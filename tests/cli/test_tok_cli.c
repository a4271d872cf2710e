/*
 * test_tok_cli.c - `kvprefix tokenize` and `kvprefix replay --tokenizer` run as a user runs
 * them: ids of a text and of a request body, the JSON spans, special tokens on and off,
 * every bad input with its message and exit status; replay of the example log's OpenAI
 * bodies with the Llama 3 rank file reported exact (no APPROXIMATE mark), and --diagnose
 * naming the tool-order, whitespace and timestamp breaks that gen_chatlog --variants puts in
 * it.
 *
 * The rank files come from scripts/tokref.sh (TOKREF_DIR); tests that need them skip when
 * it is empty. Scratch files go to TOK_TEST_DIR.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cliutil.h"

static char err[1 << 16], out[1 << 22];

static const char *scratch(const char *name, const char *text)
{
    static char buf[8][4096];
    static int k;
    char *b = buf[k++ % 8];
    const char *d = getenv("TOK_TEST_DIR");
    snprintf(b, sizeof buf[0], "%s/test_tok_cli_%s", d ? d : ".", name);
    if (text != NULL) {
        FILE *f = fopen(b, "wb");
        cr_assert(f != NULL);
        fputs(text, f);
        cr_assert_eq(fclose(f), 0);
    }
    return b;
}

/* The path of a reference rank file; skips the test when scripts/tokref.sh has not run. */
static const char *ref(const char *file)
{
    static char buf[4][4096];
    static int k;
    char *b = buf[k++ % 4];
    const char *d = getenv("TOKREF_DIR");
    snprintf(b, sizeof buf[0], "%s/%s", d ? d : "build-tok/ref", file);
    FILE *f = fopen(b, "rb");
    if (f == NULL)
        cr_skip_test("%s is missing: scripts/tokref.sh fetches it (npm)", b);
    fclose(f);
    return b;
}

static int run(const char *sub, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int run(const char *sub, const char *fmt, ...)
{
    char args[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return cli_run(sub, args, err, sizeof err, out, sizeof out);
}

Test(tokenize, text_and_body)
{
    const char *l3 = ref("llama3.tiktoken");
    cr_assert_eq(
        run("tokenize", "--tokenizer '%s' --text '%s'", l3, scratch("hello.txt", "Hello world!")),
        0, "%s", err);
    cr_expect_str_eq(out, "9906 1917 0\n");
    /* A body: rendered with the default template for a llama3 tokenizer (llama3). */
    const char *body =
        scratch("hi.json", "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}");
    cr_assert_eq(run("tokenize", "--tokenizer '%s' '%s'", l3, body), 0, "%s", err);
    cr_expect(strncmp(out, "128000 128006 9125 128007 271 38766 ", 36) == 0, "%s", out);
    cr_expect(strstr(out, " 128006 882 128007 271 13347 128009 128006 78191 128007 271\n") != NULL,
              "%s", out);
    /* The same file as text: its JSON characters are tokenized. */
    cr_assert_eq(run("tokenize", "--tokenizer '%s' --text '%s'", l3, body), 0, "%s", err);
    cr_expect(strncmp(out, "5018", 4) == 0, "'{\"' first: %s", out);
}

Test(tokenize, json_spans_and_specials)
{
    const char *l3 = ref("llama3.tiktoken");
    const char *in = scratch("sp.txt", "a<|eot_id|>\xc3\xa9");
    cr_assert_eq(run("tokenize", "--tokenizer '%s' --json '%s'", l3, in), 0, "%s", err);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert(j != NULL, "%s", out);
    cr_expect_str_eq(json_string_value(json_object_get(j, "tokenizer")), "llama3");
    cr_expect(json_is_null(json_object_get(j, "template")));
    cr_expect_str_eq(json_string_value(json_object_get(j, "text")), "a<|eot_id|>\xc3\xa9");
    const json_t *ids = json_object_get(j, "ids"), *spans = json_object_get(j, "spans");
    size_t n = json_array_size(ids);
    cr_assert_eq(json_integer_value(json_object_get(j, "n_tokens")), (json_int_t)n);
    cr_assert_eq(json_array_size(spans), n);
    cr_expect_eq(json_integer_value(json_array_get(ids, 1)), 128009);
    json_int_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_array_get(spans, i);
        cr_expect_eq(json_integer_value(json_array_get(s, 0)), at, "span %zu starts", i);
        at = json_integer_value(json_array_get(s, 1));
    }
    cr_expect_eq(at, 13, "the spans cover the 13 bytes");
    json_decref(j);
    /* --no-special: the same text has no special token. */
    cr_assert_eq(run("tokenize", "--tokenizer '%s' --no-special '%s'", l3, in), 0, "%s", err);
    cr_expect(strstr(out, "128009") == NULL, "%s", out);
}

Test(tokenize, bad_inputs)
{
    const char *l3 = ref("llama3.tiktoken");
    cr_expect_eq(run("tokenize", "--tokenizer '%s' '%s'", l3, scratch("bad.txt", "ok\xff")), 1);
    cr_expect(strstr(err, "the text is not valid UTF-8 at byte 2") != NULL, "%s", err);
    cr_expect_eq(run("tokenize", "--tokenizer '%s' '%s'", l3,
                     scratch("badmsg.json", "{\"messages\": [{\"role\": 5}]}")),
                 1);
    cr_expect(strstr(err, "messages[0] must be an object with a string \"role\"") != NULL, "%s",
              err);
    cr_expect_eq(run("tokenize", "--tokenizer '%s' '%s'", l3,
                     scratch("ids.json", "{\"prompt\": [1, 2, 3]}")),
                 1);
    cr_expect(strstr(err, "prompt is already token ids") != NULL, "%s", err);
    cr_expect_eq(run("tokenize", "--tokenizer '%s' --template llama3 '%s'", l3,
                     scratch("plain.txt", "just text")),
                 1);
    cr_expect(strstr(err, "--template needs an OpenAI request body") != NULL, "%s", err);
    cr_expect_eq(run("tokenize", "--tokenizer '%s' --max-bytes 1KiB '%s'", l3,
                     scratch("big.txt", "0123456789012345678901234567890123456789012345678901234"
                                        "567890123456789012345678901234567890123456789012345678"
                                        "901234567890123456789012345678901234567890123456789012"
                                        "3456789")),
                 0, "%s", err);
    cr_expect_eq(
        run("tokenize", "--tokenizer '%s' --max-bytes 16 '%s'", l3, scratch("big.txt", NULL)), 1);
    cr_expect(strstr(err, "larger than --max-bytes 16") != NULL, "%s", err);
}

/* Write the example log with gen_chatlog (args) to scratch file name. */
static const char *example(const char *name, const char *args)
{
    const char *gen = getenv("GEN_CHATLOG_BIN");
    cr_assert_not_null(gen);
    const char *path = scratch(name, NULL);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' %s -o '%s'", gen, args, path);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    return path;
}

Test(replay_tok, exact_counts_without_the_approximate_mark)
{
    const char *l3 = ref("llama3.tiktoken");
    const char *log = example("chat.jsonl", "--format openai --requests 120");
    cr_assert_eq(run("replay", "--capacity 20000 --json '%s'", log), 0, "%s", err);
    cr_expect(strstr(out, "\"approximate_tokens\": true") != NULL, "%.300s", out);
    cr_assert_eq(run("replay", "--capacity 20000 --json --tokenizer '%s' '%s'", l3, log), 0, "%s",
                 err);
    cr_expect(strstr(out, "\"approximate_tokens\": false") != NULL, "%.300s", out);
    cr_expect(strstr(out, "llama3 tokenizer (128000 ranks), llama3 template") != NULL, "%.400s",
              out);
    /* ChatML's markers are not tokens of Llama 3: the counts are not the model's. */
    cr_assert_eq(run("replay", "--capacity 20000 --tokenizer '%s' --template chatml '%s'", l3, log),
                 0, "%s", err);
    cr_expect(strstr(out, "APPROXIMATE: the chatml template's \"<|im_start|>\" is 6 tokens of "
                          "the llama3 tokenizer, not one") != NULL,
              "%s", out);
    cr_expect(strstr(err, "warning: the chatml template writes \"<|im_start|>\"") != NULL, "%s",
              err);
    cr_expect_eq(run("replay", "--capacity 20 --tokenizer '%s' '%s'",
                     scratch("missing.tiktoken", NULL), log),
                 1);
    cr_expect(strstr(err, "--tokenizer: ") != NULL && strstr(err, "cannot open") != NULL, "%s",
              err);
}

/* Copy file to scratch name (no sidecar beside it). */
static const char *copy_to_scratch(const char *file, const char *name)
{
    const char *dst = scratch(name, NULL);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s' && rm -f '%s.json'", file, dst, dst);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    return dst;
}

Test(replay_tok, rank_file_kind_from_its_size_without_sidecar)
{
    /* The documented example works with the bare file (it failed without a sidecar or
     * --tokenizer-kind before). */
    const char *l3 = copy_to_scratch(ref("llama3.tiktoken"), "bare_llama3.tiktoken");
    const char *log = example("bare.jsonl", "--format openai --requests 20");
    cr_assert_eq(run("replay", "--capacity 2000 --tokenizer '%s' --template llama3 '%s'", l3, log),
                 0, "%s", err);
    cr_expect(strstr(out, "exact: llama3 tokenizer (128000 ranks), llama3 template") != NULL, "%s",
              out);
    cr_expect(strstr(err, "warning") == NULL, "%s", err);
    const char *o2 = copy_to_scratch(ref("o200k_base.tiktoken"), "bare_o200k.tiktoken");
    cr_assert_eq(run("tokenize", "--tokenizer '%s' --json --text '%s'", o2,
                     scratch("hw.txt", "Hello world!")),
                 0, "%s", err);
    cr_expect(strstr(out, "\"tokenizer\": \"o200k\"") != NULL || strstr(out, "\"o200k\"") != NULL,
              "%s", out);
}

Test(replay_tok, template_markers_that_are_not_tokens_make_counts_approximate)
{
    const char *l3 = ref("llama3.tiktoken");
    const char *log = example("markers.jsonl", "--format openai --requests 20");
    cr_assert_eq(
        run("replay", "--capacity 2000 --json --tokenizer '%s' --template qwen2.5 '%s'", l3, log),
        0, "%s", err);
    cr_expect(strstr(out, "\"approximate_tokens\": true") != NULL, "%.400s", out);
    cr_expect(strstr(err, "warning: the qwen2.5 template writes \"<|im_start|>\", which is not "
                          "one token of the tokenizer (it becomes 6)") != NULL,
              "%s", err);
    /* With the markers as specials (the cl100k_im sidecar) the same layout is exact. */
    cr_assert_eq(run("replay", "--capacity 2000 --tokenizer '%s' --template chatml '%s'",
                     ref("cl100k_im.tiktoken"), log),
                 0, "%s", err);
    cr_expect(strstr(out, "exact: cl100k tokenizer") != NULL, "%s", out);
    cr_expect(strstr(err, "warning") == NULL, "%s", err);
    /* Plain text through tokenize uses no template: no warning. */
    cr_assert_eq(run("tokenize", "--tokenizer '%s' --template qwen2.5 '%s'", l3,
                     scratch("m.json", "{\"messages\": [{\"role\": \"user\", \"content\": "
                                       "\"Hi\"}]}")),
                 0, "%s", err);
    cr_expect(strstr(err, "warning: the qwen2.5 template") != NULL, "%s", err);
    cr_assert_eq(run("tokenize", "--tokenizer '%s' --text '%s'", l3, scratch("m.json", NULL)), 0,
                 "%s", err);
    cr_expect(strstr(err, "warning") == NULL, "%s", err);
}

/* The folder of a reference model holding file; skips without scripts/tokref.sh. */
static const char *hf_dir_of(const char *model, const char *what)
{
    char file[256];
    snprintf(file, sizeof file, "hf/%s/%s", model, what);
    static char buf[4][4096];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s", ref(file));
    *strrchr(b, '/') = '\0';
    return b;
}

static const char *hf_dir(const char *model)
{
    return hf_dir_of(model, "tokenizer.json");
}

Test(tokenize, hugging_face_model_folders)
{
    static const struct {
        const char *model, *ids;
    } cases[] = {
        {"qwen2_5", "9707 1879 0\n"},
        {"deepseek_v3", "19923 2058 3\n"},
        {"llama3_1", "9906 1917 0\n"},
        {"gemma3", "9259 1902 236888\n"},
    };
    const char *hw = scratch("hw.txt", "Hello world!");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *d = hf_dir(cases[i].model);
        cr_assert_eq(run("tokenize", "--tokenizer '%s' --text '%s'", d, hw), 0, "%s", err);
        cr_expect_str_eq(out, cases[i].ids, "%s", cases[i].model);
    }
    /* A Qwen2.5 folder: its own chat_template is the default template (run by the Jinja
     * interpreter; it writes Qwen2.5's default system message); the file itself works as
     * well as the folder. */
    const char *q = hf_dir("qwen2_5");
    const char *body =
        scratch("q.json", "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}");
    cr_assert_eq(run("tokenize", "--tokenizer '%s' --json '%s'", q, body), 0, "%s", err);
    cr_expect(strstr(out, "\"template\": \"model\"") != NULL ||
                  strstr(out, "\"template\":\"model\"") != NULL,
              "%s", out);
    cr_expect(strstr(out, "[151644, 8948, 198, 2610, 525, 1207, 16948") != NULL ||
                  strstr(out, "[151644,8948,198,2610,525,1207,16948") != NULL,
              "%s", out);
    cr_expect(strstr(err, "warning") == NULL, "%s", err);
    char file[4200];
    snprintf(file, sizeof file, "%s/tokenizer.json", q);
    cr_assert_eq(run("tokenize", "--tokenizer '%s' --text '%s'", file, hw), 0, "%s", err);
    cr_expect_str_eq(out, "9707 1879 0\n");
    /* replay with the folder: exact. */
    const char *log = example("qwen.jsonl", "--format openai --requests 20");
    cr_assert_eq(run("replay", "--capacity 2000 --tokenizer '%s' '%s'", q, log), 0, "%s", err);
    cr_expect(strstr(out, "exact: tokenizer.json (byte-level BPE, 151665 tokens), the model's "
                          "own chat template") != NULL,
              "%s", out);
    /* a hand-written layout on request: the qwen2.5 layout gives the same ids here */
    cr_assert_eq(run("tokenize", "--tokenizer '%s' --template qwen2.5 --json '%s'", q, body), 0,
                 "%s", err);
    cr_expect(strstr(out, "[151644, 8948, 198, 2610, 525, 1207, 16948") != NULL ||
                  strstr(out, "[151644,8948,198,2610,525,1207,16948") != NULL,
              "%s", out);
}

Test(tokenize, sentencepiece_model)
{
    /* Llama 2's tokenizer.model (scripts/tokref.sh) through the libsentencepiece shim. */
    const char *d = hf_dir_of("llama2_spm", "tokenizer.model");
    const char *hw = scratch("hw.txt", "Hello world!");
    int rc = run("tokenize", "--tokenizer '%s' --text '%s'", d, hw);
    if (rc != 0 && strstr(err, "which this build does not read") != NULL)
        cr_skip_test("built without libsentencepiece: %s", err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect_str_eq(out, "15043 3186 29991\n");
    /* Control pieces in the text are single tokens (specials on), or text (--no-special). */
    const char *sp = scratch("sp.txt", "<s>Hi</s>");
    cr_assert_eq(run("tokenize", "--tokenizer '%s' --json '%s'", d, sp), 0, "%s", err);
    cr_expect(strstr(out, "\"tokenizer\": \"sentencepiece\"") != NULL ||
                  strstr(out, "\"tokenizer\":\"sentencepiece\"") != NULL,
              "%s", out);
    cr_assert_eq(run("tokenize", "--tokenizer '%s' '%s'", d, sp), 0, "%s", err);
    cr_expect(strncmp(out, "1 ", 2) == 0 && strstr(out, " 2\n") != NULL, "%s", out);
    cr_assert_eq(run("tokenize", "--tokenizer '%s' --no-special '%s'", d, sp), 0, "%s", err);
    cr_expect(strncmp(out, "1 ", 2) != 0, "%s", out);
}

Test(tokenize, tokenizer_refusals)
{
    const char *hw = scratch("hw.txt", "Hello world!");
    cr_expect_eq(run("tokenize", "--tokenizer '%s' --text '%s'",
                     scratch("pc.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, "
                                        "\"normalizer\": {\"type\": \"Precompiled\"}}"),
                     hw),
                 1);
    cr_expect(strstr(err, "pc.json: unsupported normalizer \"Precompiled\"") != NULL, "%s", err);
    cr_expect_eq(run("tokenize", "--tokenizer '%s' --tokenizer-kind llama3 --text '%s'",
                     scratch("pc.json", NULL), hw),
                 1);
    cr_expect(strstr(err, "--tokenizer-kind is for tiktoken rank files") != NULL, "%s", err);
    /* A SentencePiece model (protobuf) is refused with what to give instead. */
    const char *spm = scratch("spm.model", NULL);
    FILE *f = fopen(spm, "wb");
    cr_assert(f != NULL);
    fwrite("\x0a\x0b\x0a\x05<unk>\x15\x00\x00\x00\x00", 1, 13, f);
    cr_assert_eq(fclose(f), 0);
    cr_expect_eq(run("tokenize", "--tokenizer '%s' --text '%s'", spm, hw), 1);
    cr_expect(strstr(err, "not a SentencePiece model") != NULL ||
                  strstr(err, "a SentencePiece model (protobuf), which this build does not read") !=
                      NULL,
              "%s", err);
    /* A folder without a tokenizer. */
    cr_expect_eq(run("tokenize", "--tokenizer '%s' --text '%s'",
                     getenv("TOK_TEST_DIR") ? getenv("TOK_TEST_DIR") : ".", hw),
                 1);
    cr_expect(strstr(err, "a folder without tokenizer.json") != NULL, "%s", err);
}

Test(replay_tok, diagnose_names_tool_order_whitespace_and_timestamp)
{
    const char *l3 = ref("llama3.tiktoken");
    const char *log = example("variants.jsonl", "--format openai --variants");
    cr_assert_eq(run("replay", "--capacity 20000 --diagnose --tokenizer '%s' '%s'", l3, log), 0,
                 "%s", err);
    cr_expect(strstr(out, "tool definitions reordered (same tools, another order)") != NULL, "%s",
              out);
    cr_expect(strstr(out, "whitespace-only difference in message 0 (system)") != NULL, "%s", out);
    cr_expect(strstr(out, "timestamp-like run at the start, in message 0 (system)") != NULL, "%s",
              out);
    cr_expect(strstr(out, "new turn: the earlier request ends there") != NULL, "%s", out);
    cr_assert_eq(run("replay", "--capacity 20000 --diagnose --json --tokenizer '%s' '%s'", l3, log),
                 0, "%s", err);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert(j != NULL);
    const json_t *causes = json_object_get(json_object_get(j, "diagnose"), "causes");
    cr_assert(json_is_array(causes), "%.500s", out);
    bool tools = false, ws = false;
    for (size_t i = 0; i < json_array_size(causes); i++) {
        const json_t *c = json_array_get(causes, i);
        const char *name = json_string_value(json_object_get(c, "cause"));
        tools |= strcmp(name, "tool order") == 0;
        if (strcmp(name, "whitespace") == 0) {
            ws = true;
            cr_expect_eq(json_integer_value(json_object_get(c, "message")), 0);
            cr_expect_str_eq(json_string_value(json_object_get(c, "role")), "system");
        }
    }
    cr_expect(tools && ws);
    json_decref(j);
    /* The mistral template moves the system message into the last user turn: a layout break
     * at every new turn. */
    cr_assert_eq(run("replay",
                     "--capacity 20000 --diagnose --tokenizer '%s' --template mistral "
                     "'%s'",
                     l3, log),
                 0, "%s", err);
    cr_expect(strstr(out, "layout: message 3 (user) here, message 0 (system) in the earlier "
                          "request") != NULL,
              "%s", out);
}
