/*
 * escape.h - untrusted text (namespace strings, file names, bytes of a log quoted in a
 * message) made safe for each output: no control character reaches a terminal, and no CSV
 * cell starts a spreadsheet formula.
 *
 * Control characters are C0 (bytes 0x00-0x1F), DEL (0x7F) and C1 (U+0080-U+009F, the UTF-8
 * pairs C2 80 .. C2 9F, which some terminals obey as escape sequences); each of their bytes
 * is written as \xNN. Other bytes, UTF-8 text included, pass through. JSON output needs none
 * of this (jansson escapes control characters) and SVG text has its own (svgplot.c).
 */
#ifndef CLI_ESCAPE_H
#define CLI_ESCAPE_H

#include <stddef.h>
#include <stdio.h>

/* Write s[0 .. len) to f with control characters as \xNN. Cannot fail (errors show in
 * ferror(f)). */
void cli_put_escaped(FILE *f, const char *s, size_t len);

/* Write s[0 .. len) as one quoted CSV cell: control characters as \xNN, '"' doubled, and a
 * cell that would start with '=', '+', '-', '@', tab or CR prefixed with a single quote
 * (OWASP's advice against CSV injection), so a spreadsheet shows it as text. Cannot fail. */
void cli_csv_field(FILE *f, const char *s, size_t len);

/* Copy the NUL-terminated src into dst[0 .. size) with control characters as \xNN,
 * truncating; dst is always terminated (size > 0). Cannot fail. */
void cli_escape_str(char *dst, size_t size, const char *src);

/* Quote input text in a message: at most max bytes of s[0 .. len) (cut at the start of a
 * UTF-8 character, so valid text stays valid, with "..." when cut) into dst[0 .. size),
 * control characters as \xNN; dst is always terminated (size >= 4). Returns dst. Cannot
 * fail. */
const char *cli_quote_prefix(char *dst, size_t size, const char *s, size_t len, size_t max);

#endif /* CLI_ESCAPE_H */
