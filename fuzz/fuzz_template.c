/*
 * fuzz_template.c - libFuzzer harness: OpenAI request bodies through the OpenAI reader
 * (src/cli/input/openai.h), each chat template (src/cli/tok/template.h), Python's
 * json.dumps writer (pyjson.h) and the BPE tokenizer (bpe.h).
 *
 * The input is a JSON request body (chat/completions with messages, tools, tool_calls and
 * their "arguments" strings, content parts; completions; a Batch API line), or a few of
 * them, one per line. Inputs over 16 KiB are skipped.
 *
 * 1. When the whole input parses (jansson, the reader's flags) to an object, it is rendered
 *    with oai_render in the fixed layout and with each template (llama3, chatml, qwen2.5,
 *    mistral), bos/eos from the fixed tokenizers (tok_util.h: llama3 for its template,
 *    cl100k with <s>, </s> and the control words for the others), under the reader's limit
 *    (8 times the input plus 4 KiB) or, for one input length in five, half the input.
 *    Asserted:
 *      - a refusal is LOG_EINPUT with a message (valid UTF-8, as the body is, without control
 *        characters: input it quotes is cut at a character and escaped as escape.h says), and
 *        rendering again refuses with the same message;
 *      - a rendering stays within the limit, is NUL-terminated, is valid UTF-8 (every byte
 *        comes from a JSON string or from JSON the writer made), and is deterministic:
 *        rendered again, into a fresh prompt and into the same one, it is byte for byte
 *        the same, with the same segments (templates) or markers (fixed layout);
 *      - template segments: the first at offset 0, offsets ascending, inside the text,
 *        message indexes below the number of messages, each role fit for a report (valid
 *        UTF-8 without controls; the message's own role when short and plain), tool
 *        indexes below the number of tools, the generation prompt last;
 *      - fixed layout markers: ascending, each over the text of its marker;
 *      - the text encodes (special tokens on) without error into tokens that tile it,
 *        equal to the reference encoder's (texts up to 16 KiB);
 *    and the body itself is written by pyjson_dump (without indent and with indent 0..4),
 *    which must read back (jansson) to an equal value and, for a value without reals or
 *    odd control bytes and an indent other than 0, equal jansson's own dump byte for byte.
 * 2. The input is read as a log file by the request-log reader with the BPE tokenizer and
 *    each template (as `kvprefix replay --tokenizer --template` does): every record's
 *    tokens tile its text, its segments are the template's; every refused line has a
 *    "PATH:LINE: ..." message (valid UTF-8 without control characters when the input is
 *    valid UTF-8).
 * No crash, no sanitizer report, no leak.
 */
#define _GNU_SOURCE /* memfd_create */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "logread.h"
#include "openai.h"
#include "pyjson.h"
#include "template.h"
#include "tok_util.h"

#define MAX_BODY    (16u << 10) /* longer inputs are skipped */
#define MAX_REF_LEN (16u << 10) /* longest text compared with the reference encoder */
#define MAX_CALLS   1000        /* log_next calls per read */

static const int templates[5] = {0, TPL_LLAMA3, TPL_CHATML, TPL_QWEN25, TPL_MISTRAL};

static bpe_out out;

static bpe *tokenizer_for(int tpl)
{
    return tku_fixed(tpl == TPL_LLAMA3 ? BPE_LLAMA3 : BPE_CL100K, NULL);
}

/* A growable byte buffer for pyjson_dump. */
typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static int buf_write(void *ctx, const char *s, size_t n)
{
    buf *b = ctx;
    if (b->n + n + 1 > b->cap) {
        b->cap = 2 * (b->n + n) + 64;
        b->p = realloc(b->p, b->cap);
        FZ_ASSERT(b->p != NULL, "out of memory");
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

/* Whether message s is fit for a terminal and for a JSON report: valid UTF-8 and free of
 * control characters (C0, DEL, C1; escape.h writes them as \xNN). */
static bool safe_message(const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n; i++)
        if (u[i] < 0x20 || u[i] == 0x7f || (u[i] == 0xc2 && i + 1 < n && u[i + 1] <= 0x9f))
            return false;
    return tku_utf8_invalid_at(u, n) == n;
}

/* Whether s[0, n) has no control byte that jansson and Python escape differently (jansson
 * writes \u001F, Python \u001f; both write \b \t \n \f \r the short way). */
static bool plain_string(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 && strchr("\b\t\n\f\r", s[i]) == NULL)
            return false;
    return true;
}

/* Whether jansson's dump of v is Python's: no reals (jansson writes %.17g, Python repr)
 * and only plain strings. */
static bool plain_value(const json_t *v)
{
    const char *key;
    const json_t *x;
    switch (json_typeof(v)) {
    case JSON_REAL:
        return false;
    case JSON_STRING:
        return plain_string(json_string_value(v), json_string_length(v));
    case JSON_ARRAY:
        for (size_t i = 0; i < json_array_size(v); i++)
            if (!plain_value(json_array_get(v, i)))
                return false;
        return true;
    case JSON_OBJECT:
        json_object_foreach((json_t *)v, key, x)
        {
            if (!plain_string(key, strlen(key)) || !plain_value(x))
                return false;
        }
        return true;
    default:
        return true;
    }
}

/* pyjson_dump of o reads back to an equal value and is valid UTF-8; for a plain value
 * (plain_value) and an indent other than 0 (jansson's JSON_INDENT(0) means none, Python's
 * indent=0 means newlines), it is byte for byte jansson's dump with the same separators and
 * indent, an independent writer of the same layout. */
static void check_pyjson(const json_t *o, int indent)
{
    buf b = {0};
    FZ_ASSERT(pyjson_dump(o, indent, buf_write, &b) == 0, "pyjson_dump failed");
    FZ_ASSERT(b.n > 0 && tku_utf8_invalid_at((const unsigned char *)b.p, b.n) == b.n,
              "pyjson_dump (indent %d) wrote invalid UTF-8", indent);
    json_error_t je;
    json_t *back = json_loadb(b.p, b.n, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    FZ_ASSERT(back != NULL,
              "pyjson_dump (indent %d) wrote JSON that does not read back: %s in %.200s", indent,
              je.text, b.p);
    FZ_ASSERT(json_equal(o, back), "pyjson_dump (indent %d) wrote another value: %.300s", indent,
              b.p);
    json_decref(back);
    if (indent != 0 && plain_value(o)) {
        size_t flags = JSON_PRESERVE_ORDER | JSON_ENCODE_ANY;
        char *j = json_dumps(o, flags | (indent > 0 ? JSON_INDENT(indent) : 0));
        FZ_ASSERT(j != NULL, "out of memory");
        FZ_ASSERT(strcmp(j, b.p) == 0, "pyjson_dump (indent %d) is not jansson's layout: %.200s",
                  indent, b.p);
        free(j);
    }
    free(b.p);
}

static const char *message_role(const json_t *body, size_t i)
{
    const json_t *m = json_array_get(json_object_get(body, "messages"), i);
    return json_string_value(json_object_get(m, "role"));
}

/* The segments of a templated rendering (see the file comment). */
static void check_segs(const oai_prompt *p, size_t len, const char *name)
{
    const tpl_out *t = &p->tout;
    size_t n_msgs = json_array_size(json_object_get(p->body, "messages"));
    size_t n_tools = json_array_size(json_object_get(p->body, "tools"));
    FZ_ASSERT(t->n_segs > 0 && t->segs[0].offset == 0, "%s: %zu segments, the first at %u", name,
              t->n_segs, t->n_segs ? t->segs[0].offset : 0);
    for (size_t i = 0; i < t->n_segs; i++) {
        const tpl_seg *s = &t->segs[i];
        FZ_ASSERT(s->offset <= len && (i == 0 || s->offset > t->segs[i - 1].offset),
                  "%s: segment %zu at %u (text of %zu bytes, previous at %u)", name, i, s->offset,
                  len, i ? t->segs[i - 1].offset : 0);
        FZ_ASSERT(s->kind >= TPL_SEG_PREAMBLE && s->kind <= TPL_SEG_GEN, "%s: segment kind %d",
                  name, s->kind);
        FZ_ASSERT(s->kind != TPL_SEG_GEN || i + 1 == t->n_segs,
                  "%s: the generation prompt is segment %zu of %zu", name, i, t->n_segs);
        if (s->kind == TPL_SEG_TOOL)
            FZ_ASSERT(s->index < n_tools, "%s: tool segment %u of %zu tools", name, s->index,
                      n_tools);
        if (s->kind != TPL_SEG_MESSAGE)
            continue;
        FZ_ASSERT(s->index < n_msgs, "%s: message segment %u of %zu messages", name, s->index,
                  n_msgs);
        /* The role as reports show it: the message's own when short and plain; always
         * valid UTF-8 without control characters. */
        const char *role = message_role(p->body, s->index);
        FZ_ASSERT(safe_message(s->role), "%s: segment %zu's role is not fit for a report", name, i);
        FZ_ASSERT(strlen(role) > 12 || !safe_message(role) || strcmp(s->role, role) == 0,
                  "%s: segment of message %u has role \"%s\", the message \"%.40s\"", name,
                  s->index, s->role, role);
    }
}

/* The markers of a fixed-layout rendering. */
static void check_marks(const oai_prompt *p, const char *text, size_t len)
{
    size_t end = 0; /* where the previous marker ends */
    for (size_t i = 0; i < p->n_marks; i++) {
        const tok_mark *m = &p->marks[i];
        const char *want = m->id == TOK_IM_START ? TOK_IM_START_TEXT : TOK_IM_END_TEXT;
        size_t wl = strlen(want);
        FZ_ASSERT(m->id == TOK_IM_START || m->id == TOK_IM_END, "marker %zu has id %u", i, m->id);
        FZ_ASSERT(m->offset + wl <= len && memcmp(text + m->offset, want, wl) == 0 &&
                      m->offset >= end,
                  "marker %zu at %u is not over its text", i, m->offset);
        end = m->offset + wl;
    }
}

/* Render o with tpl into *p. Returns oai_render's code. */
static int render(const json_t *o, int tpl, size_t limit, oai_prompt *p, char *err, size_t size)
{
    bpe *t = tokenizer_for(tpl);
    p->tpl = tpl;
    p->bos = bpe_bos(t);
    p->eos = bpe_eos(t);
    err[0] = '\0';
    return oai_render(o, limit, p, err, size);
}

/* Two renderings of one body are the same. */
static void check_same(const oai_prompt *a, const oai_prompt *b, const char *name)
{
    size_t la, lb;
    const char *ta = oai_text(a, &la), *tb = oai_text(b, &lb);
    FZ_ASSERT(la == lb && (la == 0 || memcmp(ta, tb, la) == 0),
              "%s: rendering again gives other text (%zu and %zu bytes)", name, la, lb);
    FZ_ASSERT(a->templated == b->templated && a->token_ids == b->token_ids,
              "%s: rendering again gives another kind of prompt", name);
    if (a->templated) {
        FZ_ASSERT(a->tout.n_segs == b->tout.n_segs,
                  "%s: rendering again gives %zu segments, not %zu", name, b->tout.n_segs,
                  a->tout.n_segs);
        for (size_t i = 0; i < a->tout.n_segs; i++) {
            const tpl_seg *x = &a->tout.segs[i], *y = &b->tout.segs[i];
            FZ_ASSERT(x->offset == y->offset && x->index == y->index && x->kind == y->kind &&
                          strcmp(x->role, y->role) == 0,
                      "%s: rendering again gives another segment %zu", name, i);
        }
    } else {
        FZ_ASSERT(
            a->n_marks == b->n_marks &&
                (a->n_marks == 0 || memcmp(a->marks, b->marks, a->n_marks * sizeof *a->marks) == 0),
            "%s: rendering again gives other markers", name);
    }
}

/* Encode a rendered prompt and check its tokens. */
static void check_encode(int tpl, const char *text, size_t len, const char *name)
{
    tku_ref *ref;
    bpe *t = tku_fixed(tpl == TPL_LLAMA3 ? BPE_LLAMA3 : BPE_CL100K, &ref);
    char err[256] = "";
    out.n = 0;
    int rc = bpe_encode(t, text, len, true, 0, &out, err, sizeof err);
    FZ_ASSERT(rc == BPE_OK, "%s: encoding the %zu-byte prompt: %d, %s", name, len, rc, err);
    tku_check_tiling(t, text, len, 0, out.ids, out.offsets, out.n, name);
    if (len <= MAX_REF_LEN) {
        tku_ref_encode(ref, text, len, true, 0);
        tku_check_ref(ref, out.ids, out.offsets, out.n, name);
    }
}

static void check_render(const json_t *o, int tpl, size_t limit)
{
    const char *name = tpl ? tpl_name(tpl) : "fixed layout";
    char err[512], err2[512];
    oai_prompt p = {0}, q = {0};
    int rc = render(o, tpl, limit, &p, err, sizeof err);
    int rc2 = render(o, tpl, limit, &q, err2, sizeof err2);
    FZ_ASSERT(rc == rc2, "%s: rendering again returns %d, not %d", name, rc2, rc);
    if (rc != 0) {
        FZ_ASSERT(rc == LOG_EINPUT, "%s: oai_render returned %d (%s)", name, rc, err);
        FZ_ASSERT(err[0] != '\0' && strchr(err, '\n') == NULL, "%s: refused with message \"%s\"",
                  name, err);
        FZ_ASSERT(strcmp(err, err2) == 0, "%s: refused with \"%s\", then \"%s\"", name, err, err2);
        FZ_ASSERT(safe_message(err), "%s: the message is not valid UTF-8 free of controls: \"%s\"",
                  name, err);
    } else {
        size_t len;
        const char *text = oai_text(&p, &len);
        FZ_ASSERT(len <= limit && (len == 0 || text[len] == '\0'),
                  "%s: %zu bytes of text for a limit of %zu", name, len, limit);
        FZ_ASSERT(p.templated == (tpl != 0 && p.chat), "%s: templated %d, chat %d", name,
                  p.templated, p.chat);
        check_same(&p, &q, name);
        size_t bad = tku_utf8_invalid_at((const unsigned char *)text, len);
        FZ_ASSERT(bad == len, "%s: the rendered prompt is not valid UTF-8 at byte %zu of %zu", name,
                  bad, len);
        if (p.templated)
            check_segs(&p, len, name);
        else
            check_marks(&p, text, len);
        /* Render into the same prompt again: the reused buffers give the same result. */
        FZ_ASSERT(render(o, tpl, limit, &q, err2, sizeof err2) == 0, "%s: third rendering failed",
                  name);
        check_same(&p, &q, name);
        if (p.token_ids == NULL)
            check_encode(tpl, text, len, name);
    }
    oai_prompt_free(&p);
    oai_prompt_free(&q);
}

/* ---- the reader ------------------------------------------------------------------------ */

static int make_file(const uint8_t *data, size_t size, char *path, size_t path_size)
{
    int fd = memfd_create("template", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    for (size_t off = 0; off < size;) {
        ssize_t n = write(fd, data + off, size - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            close(fd);
            return -1;
        }
        off += (size_t)n;
    }
    snprintf(path, path_size, "/proc/self/fd/%d", fd);
    return fd;
}

static void check_record(const log_record *rec, bpe *t, int tpl)
{
    FZ_ASSERT(rec->n_tokens >= 1 && rec->tokens != NULL, "line %llu: a record of %zu tokens",
              (unsigned long long)rec->line_no, rec->n_tokens);
    if (rec->text == NULL) {
        FZ_ASSERT(rec->segs == NULL && rec->token_offsets == NULL, "line %llu: offsets, no text",
                  (unsigned long long)rec->line_no);
        return;
    }
    tku_check_tiling(t, rec->text, rec->text_len, 0, rec->tokens, rec->token_offsets, rec->n_tokens,
                     tpl ? tpl_name(tpl) : "fixed layout");
    FZ_ASSERT(rec->segs == NULL || (rec->n_segs > 0 && rec->segs[0].offset == 0 &&
                                    rec->segs[rec->n_segs - 1].offset <= rec->text_len),
              "line %llu: segments outside the text", (unsigned long long)rec->line_no);
}

/* Read the file at path with the tokenizer and template tpl, checking every call (and,
 * when the whole input is valid UTF-8, that every message is too). */
static void read_log(const char *path, int tpl, bool utf8_input)
{
    log_options opt;
    log_options_init(&opt);
    opt.max_line_bytes = MAX_BODY;
    opt.bpe = tokenizer_for(tpl);
    opt.tpl = tpl;
    log_reader *r = NULL;
    char err[256];
    FZ_ASSERT(log_open(path, &opt, &r, err, sizeof err) == 0, "log_open: %s", err);
    size_t plen = strlen(path);
    for (int calls = 0; calls < MAX_CALLS; calls++) {
        log_record rec;
        int rc = log_next(r, &rec);
        if (rc == LOG_END)
            break;
        if (rc == LOG_RECORD) {
            check_record(&rec, opt.bpe, tpl);
            continue;
        }
        /* "PATH:LINE: ..." for a refused line; an I/O error (a damaged compressed file)
         * may also say "PATH: ...", and ends the reading. */
        const char *msg = log_error(r);
        FZ_ASSERT(strncmp(msg, path, plen) == 0 && msg[plen] == ':', "%s: log_next %d: \"%s\"",
                  tpl_name(tpl), rc, msg);
        char *end;
        unsigned long long line = strtoull(msg + plen + 1, &end, 10);
        bool with_line = end != msg + plen + 1 && end[0] == ':' && line == log_n_lines(r);
        FZ_ASSERT((with_line || (rc != LOG_EINPUT && msg[plen + 1] == ' ')) &&
                      strlen(msg) > plen + 3,
                  "%s: log_next %d with message \"%s\"", tpl_name(tpl), rc, msg);
        FZ_ASSERT(!utf8_input || safe_message(msg),
                  "%s: the message for a valid UTF-8 input is not valid UTF-8 free of controls: "
                  "\"%s\"",
                  tpl_name(tpl), msg);
        if (rc != LOG_EINPUT) {
            FZ_ASSERT(rc == LOG_EIO || rc == LOG_ENOMEM, "log_next returned %d", rc);
            break;
        }
    }
    log_close(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_harness = "fuzz_template";
    if (size > MAX_BODY)
        return 0;
    json_error_t je;
    json_t *o = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (json_is_object(o)) {
        size_t limit = size % 5 == 4 ? size / 2 : 8 * size + 4096;
        for (size_t i = 0; i < sizeof templates / sizeof templates[0]; i++)
            check_render(o, templates[i], limit);
        check_pyjson(o, -1);
        check_pyjson(o, (int)(size % 5));
    } else if (o != NULL) {
        check_pyjson(o, -1);
    }
    json_decref(o);

    char path[64];
    int fd = make_file(data, size, path, sizeof path);
    FZ_ASSERT(fd >= 0, "cannot make a file for the input: %s", strerror(errno));
    bool utf8 = tku_utf8_invalid_at(data, size) == size;
    for (size_t i = 0; i < sizeof templates / sizeof templates[0]; i++)
        read_log(path, templates[i], utf8);
    close(fd);
    return 0;
}
