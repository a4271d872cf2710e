/*
 * escape.c - control characters as \xNN and CSV cells that cannot start a formula (see
 * escape.h for the rules).
 *
 * Cost: one pass over the text; nothing is allocated.
 */
#include "escape.h"

#include <stdbool.h>
#include <string.h>

/* Bytes of the control character at s[i .. len): 1 (C0 or DEL), 2 (a C1 pair), 0 (none). */
static size_t control_len(const unsigned char *s, size_t i, size_t len)
{
    if (s[i] < 0x20 || s[i] == 0x7f)
        return 1;
    if (s[i] == 0xc2 && i + 1 < len && s[i + 1] >= 0x80 && s[i + 1] <= 0x9f)
        return 2;
    return 0;
}

void cli_put_escaped(FILE *f, const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        size_t n = control_len(u, i, len);
        if (n == 0) {
            fputc(u[i++], f);
            continue;
        }
        for (; n > 0; n--)
            fprintf(f, "\\x%02x", u[i++]);
    }
}

void cli_csv_field(FILE *f, const char *s, size_t len)
{
    fputc('"', f);
    if (len > 0 && strchr("=+-@\t\r", s[0]) != NULL && s[0] != '\0')
        fputc('\'', f);
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        size_t n = control_len(u, i, len);
        if (n > 0) {
            for (; n > 0; n--)
                fprintf(f, "\\x%02x", u[i++]);
            continue;
        }
        if (u[i] == '"')
            fputc('"', f);
        fputc(u[i++], f);
    }
    fputc('"', f);
}

void cli_escape_str(char *dst, size_t size, const char *src)
{
    const unsigned char *u = (const unsigned char *)src;
    size_t len = strlen(src), j = 0;
    for (size_t i = 0; i < len && j + 1 < size;) {
        size_t n = control_len(u, i, len);
        if (n == 0) {
            dst[j++] = (char)u[i++];
            continue;
        }
        if (j + 4 * n + 1 > size)
            break;
        for (; n > 0; n--, j += 4)
            snprintf(dst + j, size - j, "\\x%02x", u[i++]);
    }
    dst[j] = '\0';
}

const char *cli_quote_prefix(char *dst, size_t size, const char *s, size_t len, size_t max)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t n = len < max ? len : max, j = 0;
    while (n < len && n > 0 && (u[n] & 0xc0) == 0x80)
        n--; /* not inside a UTF-8 character */
    bool cut = n < len;
    for (size_t i = 0; i < n;) {
        size_t c = control_len(u, i, n), k = 1;
        while (c == 0 && i + k < n && (u[i + k] & 0xc0) == 0x80)
            k++; /* the whole character, or none of it */
        if (j + (c ? 4 * c : k) + 4 > size) {
            cut = true;
            break;
        }
        if (c == 0) {
            memcpy(dst + j, u + i, k);
            j += k;
            i += k;
            continue;
        }
        for (; c > 0; c--, j += 4)
            snprintf(dst + j, size - j, "\\x%02x", u[i++]);
    }
    if (cut && j + 4 <= size) {
        memcpy(dst + j, "...", 3);
        j += 3;
    }
    dst[j < size ? j : size - 1] = '\0';
    return dst;
}
