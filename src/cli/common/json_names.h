/*
 * json_names.h - how a JSON value's type reads in the tool's error messages, shared by the
 * log readers (logread.c, openai.c) so that both say "must be an array, not a string".
 */
#ifndef CLI_JSON_NAMES_H
#define CLI_JSON_NAMES_H

#include <jansson.h>

/* The type of v as a noun phrase ("an array", "a string", "missing" for NULL...): a static
 * string. Cannot fail. */
const char *cli_json_type_name(const json_t *v);

#endif /* CLI_JSON_NAMES_H */
