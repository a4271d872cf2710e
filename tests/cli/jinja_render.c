/*
 * jinja_render.c - renders one chat template with one context for the Jinja reference
 * checks (test_jinja_ref.py): `jinja_render TEMPLATE CONTEXT.json` writes the rendered text
 * to stdout and exits 0, or writes "TEMPLATE:LINE: message" to stderr and exits 1. With
 * --batch, CONTEXT.json is a JSON array of contexts and each result is written as one
 * JSON line {"out": TEXT} or {"error": MESSAGE}, so a check of hundreds of renders starts
 * one process. strftime_now reads the fixed time "2024-07-26 12:00:00".
 *
 * `jinja_render --chat TEMPLATE EXTRA.json BODIES.json [HAND]` renders OpenAI chat bodies
 * through tpl_render_jinja (template_jinja.c: vLLM's context, segments on) with EXTRA's
 * special tokens, one JSON line each: {"out": TEXT, "segs": [[offset, kind, index], ...]}
 * or {"error": MESSAGE}; with HAND (a hand-written template's name) also "hand": its text
 * for the same body (bos and eos from EXTRA), or "hand_error".
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "jinja.h"
#include "template.h"

static int render_one(const jinja_tmpl *t, const json_t *ctx, char **out, size_t *len, char *err,
                      size_t err_size)
{
    static size_t cap;
    jinja_limits lim = {.now = "2024-07-26 12:00:00"};
    *len = 0;
    return jinja_render(t, ctx, &lim, out, len, &cap, err, err_size);
}

static json_t *load(const char *path)
{
    json_error_t je;
    json_t *v = json_load_file(path, 0, &je);
    if (!v)
        fprintf(stderr, "%s:%d: %s\n", path, je.line, je.text);
    return v;
}

/* The --chat mode (see the file comment). */
static int chat_main(int argc, char **argv)
{
    FILE *f = fopen(argv[2], "rb");
    char *src = NULL, err[512];
    size_t n = 0;
    if (!f || cli_read_all(f, (size_t)16 << 20, &src, &n) != 0) {
        fprintf(stderr, "%s: cannot read\n", argv[2]);
        if (f)
            fclose(f);
        return 1;
    }
    fclose(f);
    json_t *extra = load(argv[3]), *bodies = load(argv[4]);
    jinja_tmpl *t = NULL;
    int hand = argc > 5 ? tpl_from_name(argv[5]) : 0, rc = 0;
    if (!extra || !bodies || jinja_parse(src, n, &t, err, sizeof err) < 0) {
        if (extra && bodies)
            fprintf(stderr, "%s:%s\n", argv[2], err);
        rc = 1;
    }
    tpl_out out = {0}, hout = {0};
    const char *bos = json_string_value(json_object_get(extra, "bos_token"));
    const char *eos = json_string_value(json_object_get(extra, "eos_token"));
    for (size_t i = 0; rc == 0 && i < json_array_size(bodies); i++) {
        json_t *body = json_array_get(bodies, i), *line;
        if (tpl_render_jinja(t, body, extra, "2024-07-26 12:00:00", true, (size_t)16 << 20, &out,
                             err, sizeof err) != TPL_OK) {
            line = json_pack("{ss}", "error", err);
        } else {
            json_t *segs = json_array();
            for (size_t k = 0; k < out.n_segs; k++)
                json_array_append_new(segs, json_pack("[iii]", (int)out.segs[k].offset,
                                                      out.segs[k].kind, (int)out.segs[k].index));
            line = json_pack("{ss%so}", "out", out.text ? out.text : "", out.len, "segs", segs);
        }
        if (hand && line) {
            if (tpl_render(hand, body, bos, eos, (size_t)16 << 20, &hout, err, sizeof err) !=
                TPL_OK)
                json_object_set_new(line, "hand_error", json_string(err));
            else
                json_object_set_new(line, "hand",
                                    json_stringn(hout.text ? hout.text : "", hout.len));
        }
        char *s = line ? json_dumps(line, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
        printf("%s\n", s ? s : "{\"error\": \"out of memory\"}");
        free(s);
        json_decref(line);
    }
    tpl_out_free(&out);
    tpl_out_free(&hout);
    jinja_free(t);
    json_decref(extra);
    json_decref(bodies);
    free(src);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc >= 5 && strcmp(argv[1], "--chat") == 0)
        return chat_main(argc, argv);
    bool batch = argc == 4 && strcmp(argv[1], "--batch") == 0;
    if (argc != 3 && !batch) {
        fprintf(stderr, "usage: jinja_render [--batch] TEMPLATE CONTEXT.json\n");
        return 2;
    }
    const char *tpath = argv[batch ? 2 : 1], *cpath = argv[batch ? 3 : 2];
    FILE *f = fopen(tpath, "rb");
    char *src = NULL, err[512], *out = NULL;
    size_t n = 0, len = 0;
    if (!f || cli_read_all(f, (size_t)16 << 20, &src, &n) != 0) {
        fprintf(stderr, "%s: cannot read\n", tpath);
        return 1;
    }
    fclose(f);
    json_error_t je;
    json_t *ctx = json_load_file(cpath, 0, &je);
    if (!ctx) {
        fprintf(stderr, "%s:%d: %s\n", cpath, je.line, je.text);
        free(src);
        return 1;
    }
    jinja_tmpl *t;
    int rc = 0;
    if (jinja_parse(src, n, &t, err, sizeof err) < 0) {
        fprintf(stderr, "%s:%s\n", tpath, err);
        rc = 1;
    } else if (!batch) {
        if (render_one(t, ctx, &out, &len, err, sizeof err) < 0) {
            fprintf(stderr, "%s:%s\n", tpath, err);
            rc = 1;
        } else {
            fwrite(out, 1, len, stdout);
        }
        jinja_free(t);
    } else {
        for (size_t i = 0; i < json_array_size(ctx); i++) {
            json_t *line;
            if (render_one(t, json_array_get(ctx, i), &out, &len, err, sizeof err) < 0)
                line = json_pack("{ss}", "error", err);
            else
                line = json_pack("{ss%}", "out", out ? out : "", len);
            char *s = line ? json_dumps(line, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
            printf("%s\n", s ? s : "{\"error\": \"out of memory\"}");
            free(s);
            json_decref(line);
        }
        jinja_free(t);
    }
    free(out);
    free(src);
    json_decref(ctx);
    return rc;
}
