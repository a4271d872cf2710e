/*
 * test_jinja.c - the Jinja interpreter's contract beyond what Jinja2 can check
 * (jinja_ref_check.py compares outputs): errors name the template's line, every limit holds
 * against hostile templates (steps, output, macro depth, nesting, repetition), renders
 * repeat exactly and leave no state, and bytes that are not UTF-8 pass through unchanged.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"

/* Render src with ctx (JSON text) under lim; returns the rc, the output or error in *res. */
static int render(const char *src, const char *ctx, const jinja_limits *lim, char **res)
{
    char err[512] = "";
    jinja_tmpl *t = NULL;
    if (jinja_parse(src, strlen(src), &t, err, sizeof err) < 0) {
        *res = strdup(err);
        return -2;
    }
    json_t *c = json_loads(ctx ? ctx : "{}", 0, NULL);
    cr_assert(c != NULL);
    char *out = NULL;
    size_t len = 0, cap = 0;
    int rc = jinja_render(t, c, lim, &out, &len, &cap, err, sizeof err);
    if (rc < 0) {
        free(out);
        *res = strdup(err);
    } else {
        *res = out ? out : strdup("");
    }
    json_decref(c);
    jinja_free(t);
    return rc;
}

static void expect_error(const char *src, const jinja_limits *lim, int want_rc, const char *want)
{
    char *res;
    int rc = render(src, NULL, lim, &res);
    cr_expect_eq(rc, want_rc, "%s: rc %d (%s)", src, rc, res);
    cr_expect(strstr(res, want) != NULL, "%s: got \"%s\", want \"%s\"", src, res, want);
    free(res);
}

Test(jinja, parse_errors_name_the_line)
{
    expect_error("a\n{% if x %}\nb\n{% endfor %}", NULL, -2, "4: unknown tag 'endfor'");
    expect_error("{{ x", NULL, -2, "1: unclosed tag");
    expect_error("a\nb\n{% for x in y %}", NULL, -2, "3: unexpected end of template");
    expect_error("\n\n{{ 'abc }}", NULL, -2, "3: unterminated string");
    expect_error("{{ x[] }}", NULL, -2, "1: expected an index");
    expect_error("{# open", NULL, -2, "1: unclosed comment");
    expect_error("{% raw %}x", NULL, -2, "unclosed {% raw %}");
    expect_error("{{ a.b.c(1, k=2, 3) }}", NULL, -2, "positional argument after a keyword");
    expect_error("{% macro %}{% endmacro %}", NULL, -2, "expected a macro name");
}

Test(jinja, render_errors_name_the_line)
{
    expect_error("a\nb\n{{ 1 / 0 }}", NULL, -1, "3: division by zero");
    expect_error("\n{{ raise_exception('no system role') }}", NULL, -1,
                 "2: raise_exception: no system role");
    expect_error("{{ missing.attr }}", NULL, -1, "1: 'missing' is undefined");
    expect_error("{{ x|wordwrap }}", NULL, -1, "unknown filter 'wordwrap'");
    expect_error("{{ 1 is frobbed }}", NULL, -1, "unknown test 'frobbed'");
    expect_error("{% for x in 5 %}{% endfor %}", NULL, -1, "'int' object is not iterable");
    expect_error("{% set n.x = 1 %}", NULL, -1, "not a namespace");
    expect_error("{{ 9223372036854775807 + 1 }}", NULL, -1, "integer overflow");
}

Test(jinja, limits_hold)
{
    jinja_limits lim = {.max_steps = 100000, .max_output = 1000, .max_depth = 8};
    expect_error("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
                 &lim, -1, "too long to render");
    expect_error("{% for i in range(500) %}xxxxxxxxxx{% endfor %}", &lim, -1,
                 "output longer than 1000 bytes");
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", &lim, -1,
                 "nested more than 8 deep");
    expect_error("{{ 'a' * 1000000000 }}", &lim, -1, "repeated too many times");
    expect_error("{{ range(10000000) }}", &lim, -1, "more than 1,000,000 items");
    /* nesting past the parser's bound is refused, not a stack overflow */
    size_t depth = 100000;
    char *deep = malloc(2 * depth + 16);
    strcpy(deep, "{{ ");
    memset(deep + 3, '(', depth);
    strcpy(deep + 3 + depth, "1");
    memset(deep + 4 + depth, ')', depth);
    strcpy(deep + 4 + 2 * depth, " }}");
    expect_error(deep, NULL, -2, "nested too deeply");
    free(deep);
}

Test(jinja, renders_repeat_and_keep_no_state)
{
    const char *src =
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{% endfor %}{{ ns.n }}{% set y = 5 %}{{ y }}";
    char err[128];
    jinja_tmpl *t;
    cr_assert_eq(jinja_parse(src, strlen(src), &t, err, sizeof err), 0);
    json_t *c = json_loads("{\"messages\": [1, 2, 3]}", 0, NULL);
    for (int k = 0; k < 3; k++) {
        char *out = NULL;
        size_t len = 0, cap = 0;
        cr_assert_eq(jinja_render(t, c, NULL, &out, &len, &cap, err, sizeof err), 0);
        cr_expect_str_eq(out, "35");
        free(out);
    }
    /* the context is not changed by a render */
    cr_expect_eq(json_object_size(c), 1);
    json_decref(c);
    jinja_free(t);
}

Test(jinja, bytes_pass_through)
{
    char *res;
    cr_assert_eq(render("a\xff\xfe{{ s }}\xc3", "{\"s\": \"\\u00e9\"}", NULL, &res), 0);
    cr_expect_eq(memcmp(res, "a\xff\xfe\xc3\xa9\xc3", 6), 0);
    free(res);
    cr_assert_eq(render("{{ s|length }} {{ s[1] }}", "{\"s\": \"h\\u00e9llo\"}", NULL, &res), 0);
    cr_expect_str_eq(res, "5 \xc3\xa9");
    free(res);
}

Test(jinja, context_must_be_an_object)
{
    char err[128];
    jinja_tmpl *t;
    cr_assert_eq(jinja_parse("x", 1, &t, err, sizeof err), 0);
    json_t *c = json_array();
    char *out = NULL;
    size_t len = 0, cap = 0;
    cr_expect_eq(jinja_render(t, c, NULL, &out, &len, &cap, err, sizeof err), -1);
    cr_expect(strstr(err, "must be a JSON object") != NULL);
    free(out);
    json_decref(c);
    jinja_free(t);
}
