/*
 * jinja_render.c - renders one chat template with one context for the Jinja reference
 * checks (test_jinja_ref.py): `jinja_render TEMPLATE CONTEXT.json` writes the rendered text
 * to stdout and exits 0, or writes "TEMPLATE:LINE: message" to stderr and exits 1. With
 * --batch, CONTEXT.json is a JSON array of contexts and each result is written as one
 * JSON line {"out": TEXT} or {"error": MESSAGE}, so a check of hundreds of renders starts
 * one process. strftime_now reads the fixed time "2024-07-26 12:00:00".
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "jinja.h"

static int render_one(const jinja_tmpl *t, const json_t *ctx, char **out, size_t *len,
                      char *err, size_t err_size)
{
    static size_t cap;
    jinja_limits lim = {.now = "2024-07-26 12:00:00"};
    *len = 0;
    return jinja_render(t, ctx, &lim, out, len, &cap, err, err_size);
}

int main(int argc, char **argv)
{
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
