/*
 * fuzz_routerd_http.c - libFuzzer harness: the router daemon's HTTP request handling
 * (src/routerd/rd_http.c, rd_req.c) without a socket, through the calls libmicrohttpd's
 * callbacks make: rd_http_begin (method, path, Content-Type, Content-Length), rd_http_arg
 * (query arguments), rd_http_body (the body in chunks of fuzzed sizes), rd_http_end, then
 * rd_http_done; several requests per input on one connection, so the reused buffers carry
 * state from one request to the next. The daemon scores against a small token-mode index
 * (two workers holding one 64-token prompt) with a 1 MiB --max-body and a 4 MiB budget, and
 * ranks with the load table (rd_loads_new; POST /load among the paths fills it).
 *
 * Input: per request, a byte each for the method (GET, POST, HEAD, PUT, DELETE), the path
 * (/score, /metrics, /healthz, /, /load, or 0..15 input bytes), the content type (none, JSON,
 * octet-stream, or input bytes) and the Content-Length (none, the body's, the body's + 1,
 * above --max-body, not a number); a byte for the number of query arguments (0..3), each
 * a key from the request's members or input bytes and an input value; 2 bytes of body
 * length, then the body, fed in chunks whose sizes come from the next bytes.
 *
 * Asserted: every call returns one of its documented results; rd_req_check passes after
 * every call; an answer is JSON-shaped ({"...} for errors and /score, text for /metrics)
 * and valid UTF-8; a 200 /score for a JSON body was a body jansson parses too
 * (JSON_REJECT_DUPLICATES), with exactly the token ids, strings, workers and loads the
 * scanner decoded; and the other way round, a body jansson parses as an object of the known
 * members (RD_FIELD_LIST in rd_req.c) with the right types (ids 0..2^32-1, without a '-'
 * anywhere in the body since jansson reads -0 as 0, and no NUL byte, which jansson takes
 * after a number; strings of at most 1024 bytes without
 * NUL; workers null or at most 4096 such strings; loads null or an object of at most 4096
 * such keys whose values are numbers 0..1e12) is answered 200. Text mode (prompts as text,
 * rd_text.h): the daemon has a tokenizer for model "m" only (a rank file written at setup:
 * the 256 bytes, "ll", two specials). A body valid but for carrying text members (prompt,
 * messages, tools, add_generation_prompt, chat_template_kwargs) instead of tokens is, for
 * model "m", answered with exactly the ids replay's path gives when called directly on
 * jansson's tree of the whole body (in_template_for, oai_render, bpe_encode with specials),
 * or refused when that path refuses it; for any other model it is answered 400 by
 * rd_text_tokens ("... start the router with --tokenizer ..."), and that answer comes for
 * no other body: the scanner's text mode (the bytes kept from the first text key, jansson's
 * parse of them, the other members fed back) loses and alters nothing. The budget is back to
 * what the connection keeps after each request and to 0 when it is freed; nothing leaks.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "fuzz_util.h"
#include "inopts.h"
#include "openai.h"
#include "rd_http.h"
#include "rd_req.h"
#include "rd_text.h"
#include "routerd.h"

#include <unistd.h>

static rd_daemon daemon_;
static bool ready;
static bpe *ref_bpe; /* the text oracle's own copy of model "m"'s tokenizer */

/* A rank file (the 256 bytes, "ll" as 258) and its sidecar (cl100k, <|im_start|> 256,
 * <|im_end|> 257) at path. */
static void write_ranks(const char *path)
{
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    FILE *f = fopen(path, "w");
    FZ_ASSERT(f != NULL, "cannot write %s", path);
    for (int b = 0; b < 256; b++)
        fprintf(f, "%c%c== %d\n", b64[b >> 2], b64[(b & 3) << 4], b);
    fprintf(f, "bGw= 258\n");
    FZ_ASSERT(fclose(f) == 0, "close");
    char side[96];
    snprintf(side, sizeof side, "%s.json", path);
    f = fopen(side, "w");
    FZ_ASSERT(f != NULL, "cannot write %s", side);
    fputs("{\"kind\": \"cl100k\", \"special_tokens\": {\"<|im_start|>\": 256, "
          "\"<|im_end|>\": 257}}",
          f);
    FZ_ASSERT(fclose(f) == 0, "close");
}

/* Model "m"'s tokenizer in the daemon (rd_text) and the oracle's copy; files removed after. */
static void setup_text(void)
{
    char dir[] = "/tmp/kvp-fuzz-rd-XXXXXX";
    FZ_ASSERT(mkdtemp(dir) != NULL, "mkdtemp");
    char path[64], side[80], arg[80];
    snprintf(path, sizeof path, "%s/t.tiktoken", dir);
    snprintf(side, sizeof side, "%s.json", path);
    write_ranks(path);
    snprintf(arg, sizeof arg, "m=%s", path);
    FZ_ASSERT(rd_text_new(&daemon_.text) == 0, "rd_text_new");
    FZ_ASSERT(rd_text_tokenizer(daemon_.text, arg) == 0 && rd_text_load(daemon_.text) == 0,
              "the tokenizer");
    char err[256];
    FZ_ASSERT(rd_text_check(daemon_.text, err, sizeof err) == NULL, "rd_text_check: %s", err);
    FZ_ASSERT(bpe_load(path, 0, &ref_bpe, err, sizeof err) == BPE_OK, "%s", err);
    unlink(side);
    unlink(path);
    rmdir(dir);
}

/* The daemon once: a token-mode index with two workers holding one prompt. */
static void setup(void)
{
    memset(&daemon_, 0, sizeof daemon_);
    kvp_config_init(&daemon_.hash);
    daemon_.hash.block_size = 16;
    daemon_.hash.hash_profile = KVP_HASH_XXH3;
    daemon_.index_by = KVP_ROUTER_INDEX_TOKENS;
    daemon_.max_body_bytes = (size_t)1 << 20;
    daemon_.lim.request_timeout_ms = 5000;
    daemon_.lim.body_budget.limit = (size_t)4 << 20;
    atomic_init(&daemon_.lim.body_budget.used, 0);
    pthread_mutex_init(&daemon_.lock, NULL);
    kvp_router_config rc;
    kvp_router_config_init(&rc);
    rc.hash = daemon_.hash;
    rc.index_by = KVP_ROUTER_INDEX_TOKENS;
    FZ_ASSERT(kvp_router_new(&rc, &daemon_.router) == KVP_OK, "router_new");
    kvp_router_rank_config_init(&daemon_.rank);
    daemon_.load_ttl_ms = 0;
    FZ_ASSERT(rd_loads_new(&daemon_) == 0, "rd_loads_new");
    static uint32_t toks[64];
    static uint64_t hashes[4];
    for (uint32_t i = 0; i < 64; i++)
        toks[i] = i + 1;
    for (uint32_t i = 0; i < 4; i++)
        hashes[i] = 100 + i;
    for (int w = 0; w < 2; w++) {
        kvp_router_worker_config wc;
        kvp_router_worker_config_init(&wc);
        wc.engine_id = w ? "w\"1" : "w0";
        wc.hash = daemon_.hash;
        uint32_t id = 0;
        FZ_ASSERT(kvp_router_worker_add(daemon_.router, &wc, &id) == KVP_OK, "worker_add");
        kvp_kv_event ev = {.type = KVP_EVENT_STORED,
                           .hashes = hashes,
                           .n_hashes = w ? 2 : 4,
                           .tokens = toks,
                           .n_tokens = w ? 32 : 64,
                           .block_size = 16,
                           .group_idx = -1};
        kvp_kv_batch b = {.ts = 1.0, .events = &ev, .n_events = 1};
        kvp_router_apply_result res;
        FZ_ASSERT(kvp_router_apply(daemon_.router, id, 0, &b, &res) == KVP_OK, "apply");
    }
    setup_text();
    ready = true;
}

/* n bytes of the input as a NUL-terminated string in buf (cap > n). */
static const char *take_str(fz_in *in, char *buf, size_t n)
{
    size_t i = 0;
    for (; i < n && fz_more(in); i++)
        buf[i] = (char)fz_u8(in);
    buf[i] = '\0';
    return buf;
}

/* Whether s[0 .. n) has a '-' (jansson reads -0 as the integer 0; the scanner refuses). */
static bool has_minus(const char *s, size_t n)
{
    return memchr(s, '-', n) != NULL;
}

/* Whether s is a string the scanner takes (at most 1024 bytes, no NUL). */
static bool name_ok(const json_t *s)
{
    return json_is_string(s) && json_string_length(s) <= RD_REQ_STR_MAX &&
           strlen(json_string_value(s)) == json_string_length(s);
}

/* "workers" (w) and "loads" (l) against the request's rules; when scored, against what the
 * scanner decoded. */
static bool oracle_ranking(const json_t *w, const json_t *l, const rd_req *q, bool scored)
{
    bool ok = true;
    size_t k = 0;
    if (w != NULL && !json_is_null(w)) {
        ok = json_is_array(w) && json_array_size(w) <= RD_REQ_MAX_NAMES;
        for (size_t i = 0; ok && i < json_array_size(w); i++)
            ok = name_ok(json_array_get(w, i));
        if (ok && scored) {
            FZ_ASSERT(q->workers_set && q->n_workers == json_array_size(w),
                      "workers differ from jansson's");
            for (size_t i = 0; i < q->n_items; i++) {
                if (q->items[i].is_load)
                    continue;
                FZ_ASSERT(strcmp(rd_req_name(q, i), json_string_value(json_array_get(w, k++))) == 0,
                          "worker %zu differs from jansson's", k - 1);
            }
        }
    } else if (scored) {
        FZ_ASSERT(!q->workers_set && q->n_workers == 0, "workers set, jansson has none");
    }
    if (ok && l != NULL && !json_is_null(l)) {
        ok = json_is_object(l) && json_object_size(l) <= RD_REQ_MAX_NAMES;
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)l, key, v)
        {
            double x = json_is_number(v) ? json_number_value(v) : -1.0;
            ok = ok && x >= 0.0 && x <= 1e12 && strlen(key) <= RD_REQ_STR_MAX;
        }
        if (ok && scored) {
            FZ_ASSERT(q->n_loads == json_object_size(l), "loads differ from jansson's");
            for (size_t i = 0; i < q->n_items; i++) {
                if (!q->items[i].is_load)
                    continue;
                json_t *x = json_object_get(l, rd_req_name(q, i));
                FZ_ASSERT(x && json_number_value(x) == q->items[i].value,
                          "load of '%s' differs from jansson's", rd_req_name(q, i));
            }
        }
    } else if (ok && scored) {
        FZ_ASSERT(q->n_loads == 0, "loads set, jansson has none");
    }
    return ok;
}

/* The jansson oracle on a JSON body: 1 when it is a valid request, 2 when it is a valid
 * text request (text members, no tokens), 0 when jansson refuses it or it breaks the
 * request's rules. When it is valid and the scanner's answer was 200, the decoded fields
 * must agree. */
static int oracle(const char *body, size_t n, const rd_req *q, bool scored)
{
    json_error_t e;
    json_t *v = json_loadb(body, n, JSON_REJECT_DUPLICATES, &e);
    if (v == NULL) {
        FZ_ASSERT(!scored, "the scanner scored a body jansson refuses: %s", e.text);
        return 0;
    }
    static const char *const names[RD_REQ_N_STR] = {"model", "lora", "salt", "tenant"};
    static const char *const others[] = {"tokens", "workers", "loads"};
    static const char *const text[] = {"prompt", "messages", "tools", "add_generation_prompt",
                                       "chat_template_kwargs"};
    bool ok = json_is_object(v), has_text = false;
    const char *key;
    json_t *m;
    json_t *t = ok ? json_object_get(v, "tokens") : NULL;
    if (ok)
        json_object_foreach(v, key, m)
        {
            bool known = false;
            for (size_t i = 0; i < sizeof others / sizeof *others; i++)
                known = known || strcmp(key, others[i]) == 0;
            for (int i = 0; i < RD_REQ_N_STR; i++)
                known = known || strcmp(key, names[i]) == 0;
            for (size_t i = 0; i < sizeof text / sizeof *text; i++)
                if (strcmp(key, text[i]) == 0)
                    known = has_text = true;
            ok = ok && known;
        }
    ok = ok && (has_text ? t == NULL : json_is_array(t));
    for (size_t i = 0; ok && i < json_array_size(t); i++) {
        json_t *x = json_array_get(t, i);
        ok = json_is_integer(x) && json_integer_value(x) >= 0 &&
             json_integer_value(x) <= (json_int_t)UINT32_MAX;
        if (ok && scored)
            FZ_ASSERT(i < q->n_tokens && q->tokens[i] == (uint32_t)json_integer_value(x),
                      "token %zu differs from jansson's", i);
    }
    if (ok && scored && !has_text)
        FZ_ASSERT(json_array_size(t) == q->n_tokens, "token count differs from jansson's");
    for (int i = 0; ok && i < RD_REQ_N_STR; i++) {
        json_t *s = json_object_get(v, names[i]);
        if (s == NULL || json_is_null(s)) {
            if (scored)
                FZ_ASSERT(!q->str_set[i], "%s set, jansson has none", names[i]);
            continue;
        }
        ok = name_ok(s);
        if (ok && scored)
            FZ_ASSERT(q->str_set[i] && q->str_len[i] == json_string_length(s) &&
                          memcmp(q->str[i], json_string_value(s), q->str_len[i]) == 0,
                      "%s differs from jansson's", names[i]);
    }
    if (ok)
        ok = oracle_ranking(json_object_get(v, "workers"), json_object_get(v, "loads"), q, scored);
    json_decref(v);
    if (scored)
        FZ_ASSERT(ok, "the scanner scored a body that breaks the request's rules");
    /* jansson 2.14 takes a NUL byte right after a number ({"tokens": [5\0]}), which RFC
     * 8259 does not: such a body need not be answered 200. */
    if (!ok || (!has_text && has_minus(body, n)) || memchr(body, '\0', n) != NULL)
        return 0;
    return has_text ? 2 : 1;
}

/* Whether s[0 .. n) holds the string w. */
static bool holds(const char *s, size_t n, const char *w)
{
    size_t k = strlen(w);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(s + i, w, k) == 0)
            return true;
    return false;
}

/* The text oracle for a valid text body of model "m": replay's path called directly on
 * jansson's tree of the whole body (in_template_for, oai_render, bpe_encode with specials,
 * as logread.c does) must give exactly the daemon's ids when it succeeds, and the daemon
 * must refuse (400) when it fails or gives no token. */
static void text_oracle(const char *body, size_t n, const rd_conn *cn)
{
    json_t *v = json_loadb(body, n, JSON_REJECT_DUPLICATES, NULL);
    FZ_ASSERT(v != NULL, "the oracle's body no longer parses");
    oai_prompt p;
    memset(&p, 0, sizeof p);
    p.tpl = in_template_for(0, ref_bpe);
    p.bos = bpe_bos(ref_bpe);
    p.eos = bpe_eos(ref_bpe);
    bpe_out o;
    memset(&o, 0, sizeof o);
    char err[384];
    int rc = oai_render(v, 8 * n + 4096, &p, err, sizeof err);
    if (rc == 0 && p.token_ids == NULL) {
        size_t len;
        const char *text = oai_text(&p, &len);
        rc = bpe_encode(ref_bpe, text, len, true, 0, &o, err, sizeof err);
    }
    if (rc == 0 && p.token_ids == NULL && o.n > 0) {
        FZ_ASSERT(cn->status == 200, "replay renders the text body, the daemon answered %u: %.*s",
                  cn->status, (int)cn->out_n, cn->out);
        FZ_ASSERT(cn->req.n_tokens == o.n &&
                      memcmp(cn->req.tokens, o.ids, o.n * sizeof *o.ids) == 0,
                  "the daemon's %zu ids differ from replay's %zu", cn->req.n_tokens, o.n);
    } else {
        FZ_ASSERT(cn->status == 400 || (rc == LOG_ENOMEM && cn->status == 500),
                  "replay refuses the text body, the daemon answered %u", cn->status);
    }
    bpe_out_free(&o);
    oai_prompt_free(&p);
    json_decref(v);
}

/* Whether the valid text body names model "m" (jansson's view). */
static bool text_model_m(const char *body, size_t n)
{
    json_t *v = json_loadb(body, n, JSON_REJECT_DUPLICATES, NULL);
    const json_t *m = json_object_get(v, "model");
    bool yes = json_is_string(m) && json_string_length(m) == 1 && json_string_value(m)[0] == 'm';
    json_decref(v);
    return yes;
}

/* Check an answer's shape. */
static void check_answer(const rd_conn *cn)
{
    FZ_ASSERT(cn->answered && cn->status >= 200 && cn->status < 600, "status %u", cn->status);
    FZ_ASSERT(rd_utf8_ok((const unsigned char *)cn->out, cn->out_n), "answer not UTF-8");
    if (strncmp(cn->type, "application/json", 16) == 0 && cn->out_n > 0) {
        json_error_t e;
        json_t *v = json_loadb(cn->out, cn->out_n, JSON_REJECT_DUPLICATES, &e);
        FZ_ASSERT(v && json_is_object(v), "answer is not a JSON object: %s", e.text);
        json_decref(v);
    }
}

static void one_request(fz_in *in, rd_conn *cn)
{
    static const char *const methods[] = {"GET", "POST", "HEAD", "PUT", "DELETE", "POST"};
    static const char *const paths[] = {"/score", "/metrics", "/healthz", "/", "/load"};
    static const char *const types[] = {NULL, "application/json", "application/octet-stream",
                                        "application/octet-stream; x=1"};
    static const char *const keys[] = {"model", "lora", "salt", "tenant"};
    char pbuf[16], tbuf[16], lbuf[32];
    rd_daemon *d = &daemon_;
    const char *method = methods[fz_below(in, 6)];
    size_t pk = fz_below(in, 6);
    const char *path = pk < 5 ? paths[pk] : take_str(in, pbuf, fz_below(in, 16));
    size_t tk = fz_below(in, 5);
    const char *ctype = tk < 4 ? types[tk] : take_str(in, tbuf, fz_below(in, 16));
    size_t lk = fz_below(in, 5);
    size_t n_args = fz_below(in, 4);
    struct {
        const char *k, *v;
    } args[3];
    static char kstore[3][8], vstore[3][40];
    for (size_t i = 0; i < n_args; i++) {
        size_t kk = fz_below(in, 5);
        args[i].k = kk < 4 ? keys[kk] : take_str(in, kstore[i], fz_below(in, 8));
        args[i].v = fz_below(in, 8) ? take_str(in, vstore[i], fz_below(in, 40)) : NULL;
    }
    size_t body_n = fz_below(in, 65536);
    if (body_n > in->n)
        body_n = in->n;
    const char *body = (const char *)in->p;
    in->p += body_n;
    in->n -= body_n;
    const char *clen = NULL;
    if (lk == 1)
        clen = (snprintf(lbuf, sizeof lbuf, "%zu", body_n), lbuf);
    else if (lk == 2)
        clen = (snprintf(lbuf, sizeof lbuf, "%zu", body_n + 1), lbuf);
    else if (lk == 3)
        clen = "99999999999";
    else if (lk == 4)
        clen = "12x";

    int next = rd_http_begin(d, cn, method, path, ctype, clen, 0);
    FZ_ASSERT(next == RD_NEXT_BODY || next == RD_NEXT_REPLY, "begin: %d", next);
    FZ_ASSERT(rd_req_check(&cn->req) == NULL, "after begin: %s", rd_req_check(&cn->req));
    for (size_t i = 0; i < n_args; i++) {
        next = rd_http_arg(d, cn, args[i].k, args[i].v);
        FZ_ASSERT(next == RD_NEXT_BODY || next == RD_NEXT_REPLY, "arg: %d", next);
        FZ_ASSERT(rd_req_check(&cn->req) == NULL, "after arg: %s", rd_req_check(&cn->req));
    }
    bool scoring = cn->kind != 0 && !cn->answered;
    size_t off = 0;
    while (off < body_n) {
        size_t c = 1 + fz_below(in, 4096);
        if (c > body_n - off)
            c = body_n - off;
        next = rd_http_body(d, cn, body + off, c, 0);
        FZ_ASSERT(next == RD_NEXT_BODY || next == RD_NEXT_REPLY, "body: %d", next);
        FZ_ASSERT(rd_req_check(&cn->req) == NULL, "after body: %s", rd_req_check(&cn->req));
        off += c;
    }
    next = rd_http_end(d, cn, 0);
    FZ_ASSERT(next == RD_NEXT_REPLY, "end: %d", next);
    check_answer(cn);
    /* The oracle for JSON /score bodies that reached the scanner whole. */
    bool json_body = scoring && strcmp(path, "/score") == 0 && !cn->req.binary && n_args == 0 &&
                     body_n <= d->max_body_bytes && (lk == 0 || lk == 1);
    if (json_body && cn->status != 503) {
        int ok = oracle(body, body_n, &cn->req, cn->status == 200);
        bool no_tok =
            cn->status == 400 && holds(cn->out, cn->out_n, "start the router with --tokenizer");
        FZ_ASSERT(ok != 1 || cn->status == 200,
                  "jansson takes the body, the daemon answered %u: %.*s", cn->status,
                  (int)cn->out_n, cn->out);
        bool model_m = ok == 2 && text_model_m(body, body_n);
        if (model_m)
            text_oracle(body, body_n, cn);
        FZ_ASSERT(ok != 2 || model_m || no_tok, "a valid text body, the daemon answered %u: %.*s",
                  cn->status, (int)cn->out_n, cn->out);
        FZ_ASSERT(!no_tok || has_minus(body, body_n) || memchr(body, '\0', body_n) != NULL ||
                      ok == 2,
                  "the daemon took an invalid text body to its tokenizer: %.*s", (int)body_n, body);
    }
    rd_http_done(cn);
    FZ_ASSERT(atomic_load(&d->lim.body_budget.used) == rd_req_reserved(&cn->req),
              "budget holds more than the connection's arrays");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_harness = "fuzz_routerd_http";
    if (!ready)
        setup();
    fz_in in = {data, size};
    rd_conn *cn = calloc(1, sizeof *cn);
    FZ_ASSERT(cn != NULL, "calloc");
    for (int r = 0; r < 4 && (r == 0 || fz_more(&in)); r++)
        one_request(&in, cn);
    rd_conn_free(cn);
    FZ_ASSERT(atomic_load(&daemon_.lim.body_budget.used) == 0, "budget not given back");
    return 0;
}
