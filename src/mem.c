/*
 * mem.c - the cache's allocator: the caller's kvp_allocator hooks, or malloc/free, plus a
 * count of live bytes.
 *
 * Every allocation the library makes goes through kvp__mem_alloc, uthash's included (the
 * uthash_malloc macro is redirected in index.c, request.c and verify.c), so that an
 * allocator hook sees all memory and an ENOMEM injection test reaches every allocation.
 * live_bytes makes the "bytes per cached block" benchmark a measurement, not an estimate.
 */
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

#define HUGE_ALIGN ((size_t)2 << 20) /* 2 MiB: an x86-64 huge page */

/* Large tables (the pool's blocks, the index's buckets) are probed at random, so with 4 KiB
 * pages nearly every probe also misses the TLB. They are aligned to 2 MiB and offered to
 * the kernel for transparent huge pages (where THP is "madvise" or "always"). */
static void *default_alloc(void *ud, size_t size)
{
    (void)ud;
#ifdef MADV_HUGEPAGE
    if (size >= 2 * HUGE_ALIGN) {
        void *p = NULL;
        size_t rounded = (size + HUGE_ALIGN - 1) & ~(HUGE_ALIGN - 1);
        if (posix_memalign(&p, HUGE_ALIGN, rounded) != 0)
            return NULL;
        (void)madvise(p, rounded, MADV_HUGEPAGE);
        return p;
    }
#endif
    return malloc(size);
}

static void default_free(void *ud, void *ptr, size_t size)
{
    (void)ud;
    (void)size;
    free(ptr);
}

void kvp__mem_init(kvp__mem *mem, const kvp_allocator *hooks)
{
    mem->hooks.alloc = hooks && hooks->alloc ? hooks->alloc : default_alloc;
    mem->hooks.free = hooks && hooks->alloc && hooks->free ? hooks->free : default_free;
    mem->hooks.ud = hooks ? hooks->ud : NULL;
    mem->live_bytes = 0;
}

/* Allocate size bytes (size 0 is treated as 1). Returns NULL on failure. */
void *kvp__mem_alloc(kvp__mem *mem, size_t size)
{
    void *p = mem->hooks.alloc(mem->hooks.ud, size ? size : 1);
    if (p)
        mem->live_bytes += size ? size : 1;
    return p;
}

/* Allocate n * size zeroed bytes; NULL on failure or on overflow of n * size. */
void *kvp__mem_calloc(kvp__mem *mem, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    void *p = kvp__mem_alloc(mem, n * size);
    if (p)
        memset(p, 0, (n * size) != 0 ? n * size : 1);
    return p;
}

/* Free ptr, which was allocated with size bytes. Accepts NULL. Cannot fail. */
void kvp__mem_free(kvp__mem *mem, void *ptr, size_t size)
{
    if (!ptr)
        return;
    assert(mem->live_bytes >= (size ? size : 1));
    mem->hooks.free(mem->hooks.ud, ptr, size ? size : 1);
    mem->live_bytes -= size ? size : 1;
}
