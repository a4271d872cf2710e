/*
 * fuzz_jinja.c - libFuzzer harness: the Jinja interpreter (src/cli/tok/jinja.h) on random
 * templates and contexts.
 *
 * The input is a template, optionally followed by a NUL byte and a JSON context; when the
 * context is missing or not a JSON object a fixed chat context (messages, tools, flags) is
 * used, so mutations of the template alone reach every construct. The render runs under
 * small limits (200,000 steps, 256 KiB of output, 16 nested macro calls). Asserted: parse
 * and render return 0 or -1 and never crash; a failure leaves a message that starts with
 * a line number ("LINE: ..."); the output never exceeds its limit; a second render of the
 * same template and context gives the same bytes (no state leaks between renders).
 * ASan, UBSan and LeakSanitizer check the rest.
 */
#include <ctype.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "jinja.h"

#define MAX_FUZZ_INPUT (64u << 10)

static const char fixed_ctx[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
    "\"content\": \"Hi \\u00e9\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
    "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": "
    "{\"a\": 1}}}]}, {\"role\": \"tool\", \"content\": \"{}\"}], \"tools\": [{\"type\": "
    "\"function\", \"function\": {\"name\": \"f\", \"description\": null, \"parameters\": "
    "{\"type\": \"object\"}}}], \"add_generation_prompt\": true, \"bos_token\": \"<s>\", "
    "\"eos_token\": \"</s>\", \"n\": 3, \"x\": 1.5}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_harness = "fuzz_jinja";
    if (size > MAX_FUZZ_INPUT)
        return 0;
    const char *s = (const char *)data;
    const char *nul = memchr(s, 0, size);
    size_t tlen = nul ? (size_t)(nul - s) : size;
    json_t *ctx = NULL;
    if (nul)
        ctx = json_loadb(nul + 1, size - tlen - 1, 0, NULL);
    if (!json_is_object(ctx)) {
        json_decref(ctx);
        ctx = json_loads(fixed_ctx, 0, NULL);
    }
    FZ_ASSERT(ctx != NULL, "the fixed context does not parse");
    char err[256];
    jinja_tmpl *t = NULL;
    int rc = jinja_parse(s, tlen, &t, err, sizeof err);
    FZ_ASSERT(rc == 0 || rc == -1, "jinja_parse returned %d", rc);
    if (rc < 0) {
        FZ_ASSERT(isdigit((unsigned char)err[0]), "parse error without a line: %s", err);
        json_decref(ctx);
        return 0;
    }
    jinja_limits lim = {.max_steps = 200000,
                        .max_output = 256u << 10,
                        .max_depth = 16,
                        .now = "2024-07-26 12:00:00"};
    char *out = NULL, *out2 = NULL;
    size_t len = 0, cap = 0, len2 = 0, cap2 = 0;
    rc = jinja_render(t, ctx, &lim, &out, &len, &cap, err, sizeof err);
    FZ_ASSERT(rc == 0 || rc == -1, "jinja_render returned %d", rc);
    FZ_ASSERT(len <= lim.max_output, "output of %zu bytes past the limit", len);
    if (rc < 0)
        FZ_ASSERT(isdigit((unsigned char)err[0]), "render error without a line: %s", err);
    int rc2 = jinja_render(t, ctx, &lim, &out2, &len2, &cap2, err, sizeof err);
    FZ_ASSERT(rc2 == rc, "a second render returned %d, the first %d", rc2, rc);
    if (rc == 0)
        FZ_ASSERT(len2 == len && (len == 0 || memcmp(out, out2, len) == 0),
                  "a second render gave other bytes");
    free(out);
    free(out2);
    jinja_free(t);
    json_decref(ctx);
    return 0;
}
