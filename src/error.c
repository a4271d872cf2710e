/*
 * error.c - status code descriptions and the run-time version string.
 *
 * Every public function returns KVP_OK or one of the negative KVP_E* codes declared in
 * kvprefix.h; kvp_strerror() maps each to a fixed English sentence fragment. The strings
 * are static, so callers never free them. kvp_version and kvp_version_number report the
 * library's own version (the KVP_VERSION_* macros of the header it was built with).
 */
#include "internal.h"

KVP_EXPORT const char *kvp_strerror(int code)
{
    switch (code) {
    case KVP_OK:
        return "success";
    case KVP_EINVAL:
        return "invalid argument";
    case KVP_ENOMEM:
        return "out of memory";
    case KVP_ENOSPC:
        return "no free or evictable block: the pool is pinned by active requests";
    case KVP_ENOENT:
        return "no active request with this id";
    case KVP_EEXIST:
        return "a request with this id is already active";
    case KVP_EOVERFLOW:
        return "token or block count exceeds the cache's limits";
    case KVP_ERANGE:
        return "tokens beyond the blocks the request holds";
    case KVP_EBUSY:
        return "cache called from inside its own event callback";
    case KVP_ECORRUPT:
        return "cache invariant violated (internal error)";
    case KVP_ETOKEN:
        return "token id out of range: at or above the configured vocab_size";
    case KVP_ENOTSUP:
        return "not supported: the hash profile cannot express this namespace";
    case KVP_ETOOBIG:
        return "request needs more blocks than the whole pool has";
    case KVP_EFORMAT:
        return "malformed input: not a valid KV-event payload";
    case KVP_EIO:
        return "ZeroMQ transport failure (bind, connect or send)";
    default:
        return "unknown error";
    }
}

KVP_EXPORT const char *kvp_version(void)
{
    return KVP_VERSION_STRING;
}

KVP_EXPORT int kvp_version_number(void)
{
    return KVP_VERSION_NUMBER;
}
