/*
 * pyjson.h - JSON text exactly as the chat templates' `tojson` filter writes it: Hugging
 * Face transformers runs its templates with tojson = Python's
 * json.dumps(x, ensure_ascii=False, indent=indent), so the bytes a template puts in the
 * prompt (tool definitions, tool-call arguments) follow Python's rules, not jansson's:
 *
 *   separators   without indent ", " and ": "  ({"a": 1, "b": [1, 2]})
 *                with indent N  "," and ": ", every element on its own line, indented
 *                N spaces per level; an empty array or object stays "[]" / "{}"
 *   strings      UTF-8 as is; escaped: \" \\ \n \r \t \b \f, other bytes below 0x20 as
 *                \u00XX (lowercase hex); "/" and DEL are not escaped
 *   numbers      integers in decimal; reals as Python's repr: the shortest digits that
 *                read back to the same double, in positional notation when the decimal
 *                exponent is in -4..15 (always with a fraction: 1.0, 0.0001, 1e+16 is
 *                "1e+16"), otherwise as d.ddde±XX (at least two exponent digits)
 *   keys         in the object's order (jansson keeps the order of the line)
 *
 * Cost: one pass over the value, recursion as deep as the value (the JSON parser bounds
 * that). Output goes to a caller's write function.
 */
#ifndef CLI_PYJSON_H
#define CLI_PYJSON_H

#include <jansson.h>
#include <stddef.h>

/* Write n bytes; returns 0, or non-zero to stop the dump. */
typedef int (*pyjson_write)(void *ctx, const char *s, size_t n);

/* Write v as Python's json.dumps(v, ensure_ascii=False, indent=indent) would (indent < 0:
 * no indent). Returns 0, or the first non-zero value write returned. */
int pyjson_dump(const json_t *v, int indent, pyjson_write write, void *ctx);

/* Format double x as Python's repr(x) into buf (at least 32 bytes). Returns the length.
 * Cannot fail (inf and nan give "inf"/"nan", which JSON input cannot hold). */
size_t pyjson_repr_double(double x, char *buf, size_t size);

#endif /* CLI_PYJSON_H */
