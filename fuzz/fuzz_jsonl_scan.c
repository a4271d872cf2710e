/*
 * fuzz_jsonl_scan.c - libFuzzer harness: the JSON Lines scanner (src/cli/input/jsonl_scan.h)
 * against jansson.
 *
 * The input is one line. It is given to js_scan() and to json_loadb() with the reader's flags
 * (JSON_REJECT_DUPLICATES | JSON_DECODE_ANY), and jsd_check (tests/cli/jsonl_scan_diff.h, shared
 * with tests/cli/test_jsonl_scan.c) asserts the differential property: the scanner rejects
 * exactly the lines jansson rejects (plus lines with a raw NUL byte, which jansson sometimes
 * skips), says "not an object" exactly for other values, signals the OpenAI fallback exactly
 * for objects with messages, prompt or body, and extracts every field (ids, strings, numbers,
 * the first bad id) as jansson sees it. Then the input is cut at every '\n' and each piece is
 * checked the same way, so a corpus file may also hold several lines. Inputs over 64 KiB are
 * skipped so that every run stays fast.
 *
 * A violation aborts (a crash for libFuzzer and for the driver); ASan, UBSan and
 * LeakSanitizer check the rest.
 */
#include <stdint.h>
#include <string.h>

#include "fuzz_util.h"
#include "jsonl_scan_diff.h"

#define MAX_FUZZ_LINE (64u << 10) /* longer inputs are skipped */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_harness = "fuzz_jsonl_scan";
    if (size > MAX_FUZZ_LINE)
        return 0;
    const char *s = (const char *)data;
    jsd_check(s, size);
    const char *nl = memchr(s, '\n', size);
    while (nl != NULL) {
        jsd_check(s, (size_t)(nl - s));
        size -= (size_t)(nl - s) + 1;
        s = nl + 1;
        nl = memchr(s, '\n', size);
    }
    if (s != (const char *)data)
        jsd_check(s, size);
    jsd_free();
    return 0;
}
