/*
 * json_names.c - JSON type names for error messages (see json_names.h).
 */
#include "json_names.h"

const char *cli_json_type_name(const json_t *v)
{
    if (v == NULL)
        return "missing";
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a non-integer number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "something else";
}
