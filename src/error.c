/*
 * error.c - status code descriptions, the per-thread detail of the last failure
 * (kvp_errmsg), and the run-time version string.
 *
 * Every public function returns KVP_OK or one of the negative KVP_E* codes declared in
 * kvprefix.h; kvp_strerror() maps each to a fixed English sentence fragment. The strings
 * are static, so callers never free them. kvp_version and kvp_version_number report the
 * library's own version (the KVP_VERSION_* macros of the header it was built with).
 *
 * Details. Each thread has one buffer and one flag (thread-local, so threads sharing a
 * cache, and kvp_cache_new before any cache exists, need nothing else):
 *
 *   detail[KVP__DETAIL_BYTES]   "tokens[16..32) differ from the acquired prompt"
 *   detail_fresh                a site wrote detail during the public call now running
 *
 * A failure site returns kvp__fail(code, fmt, ...): it formats into detail and sets the
 * flag. Every public function that returns int exits through kvp__public(rc), which on
 * rc < 0 calls kvp__fail_done: if no site of this call wrote a detail it writes
 * kvp_strerror(rc) instead, and it clears the flag. So the text always belongs to the latest
 * failure, never to an earlier one, even on a path that has nothing specific to say.
 * Invariant: detail_fresh is false between public calls (no library code writes a detail and
 * then succeeds). A success touches neither: the whole cost on the success path is one
 * compare of rc with 0 per public call, and formatting (vsnprintf, no allocation) happens
 * only in these cold, never-inlined functions. The buffer uses the default TLS model, not
 * initial-exec as kvp__cb_top does: 256 bytes would eat the static TLS surplus that dlopen
 * leaves (the Python extension), and it is read on failure paths only.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define KVP__DETAIL_BYTES 256 /* the longest detail plus its NUL; longer ones are cut */

static _Thread_local char detail[KVP__DETAIL_BYTES]; /* "" until this thread's first failure */
static _Thread_local bool detail_fresh; /* written by the public call that is running */

int kvp__fail(int code, const char *fmt, ...)
{
    assert(code < 0);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    for (char *p = detail; *p != '\0'; p++) /* caller bytes (a name) keep it one line */
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    detail_fresh = true;
    return code;
}

int kvp__fail_kept(int code)
{
    assert(code < 0);
    detail_fresh = true;
    return code;
}

int kvp__fail_done(int code)
{
    assert(code < 0);
    if (!detail_fresh)
        snprintf(detail, sizeof detail, "%s", kvp_strerror(code));
    detail_fresh = false;
    return code;
}

KVP_EXPORT const char *kvp_errmsg(void)
{
    return detail;
}

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
