/*
 * router_tmap.c - the token mode's map of engine block hashes to the router's own keys
 * (router_tmap.h has the layout). Robin hood open addressing with backward-shift deletion,
 * as router_table.c's table: probes stay short at 90% load, a miss ends early, removal
 * leaves no tombstones. Positions come from a seeded splitmix64 finalizer of the key scaled
 * to the capacity (any capacity, so growth can be 1.5x).
 *
 * Invariants (kvp__rt_tmap_check): n live entries (mask != 0); every live entry's distance
 * from its home slot is at most one more than its predecessor's (robin hood order); keys
 * distinct.
 */
#include <string.h>

#include "router_tmap.h"

#define MAX_LOAD_NUM 9u /* n <= cap * 9 / 10 */
#define MAX_LOAD_DEN 10u
#define MIN_CAP      16u
#define MAX_CAP      (UINT32_C(1) << 30)

static inline uint64_t mix(uint64_t k, uint64_t seed)
{
    k ^= seed;
    k = (k ^ (k >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    k = (k ^ (k >> 27)) * UINT64_C(0x94d049bb133111eb);
    return k ^ (k >> 31);
}

static inline uint32_t home_of(const kvp__rt_tmap *m, uint64_t key)
{
    return (uint32_t)(((mix(key, m->seed) >> 32) * (uint64_t)m->cap) >> 32);
}

static inline uint32_t next_pos(const kvp__rt_tmap *m, uint32_t pos)
{
    return pos + 1 == m->cap ? 0 : pos + 1;
}

static inline uint32_t dist_of(const kvp__rt_tmap *m, uint64_t key, uint32_t pos)
{
    uint32_t home = home_of(m, key);
    return pos >= home ? pos - home : pos + m->cap - home;
}

/* Place e (absent) by robin hood order. There is room. Cannot fail. */
static void place(kvp__rt_tmap *m, kvp__rt_tentry e)
{
    uint32_t pos = home_of(m, e.key), d = 0;
    for (;;) {
        kvp__rt_tentry *s = &m->e[pos];
        if (s->mask == 0) {
            *s = e;
            return;
        }
        uint32_t sd = dist_of(m, s->key, pos);
        if (sd < d) {
            kvp__rt_tentry t = *s;
            *s = e;
            e = t;
            d = sd;
        }
        pos = next_pos(m, pos);
        d++;
    }
}

/* Rebuild into new_cap slots. KVP_OK or KVP_ENOMEM (map unchanged). */
static int rehash(kvp__rt_tmap *m, kvp__rt_mem *mem, uint32_t new_cap)
{
    kvp__rt_tentry *fresh = kvp__rt_alloc(mem, (size_t)new_cap * sizeof *fresh);
    if (!fresh)
        return KVP_ENOMEM;
    memset(fresh, 0, (size_t)new_cap * sizeof *fresh);
    kvp__rt_tentry *old = m->e;
    uint32_t old_cap = m->cap;
    m->e = fresh;
    m->cap = new_cap;
    for (uint32_t i = 0; i < old_cap; i++) {
        if (old[i].mask != 0)
            place(m, old[i]);
    }
    kvp__rt_free(mem, old, (size_t)old_cap * sizeof *old);
    return KVP_OK;
}

int kvp__rt_tmap_reserve(kvp__rt_tmap *m, kvp__rt_mem *mem, uint64_t n_new)
{
    uint64_t need = (uint64_t)m->n + n_new;
    if (n_new == 0 || need * MAX_LOAD_DEN <= (uint64_t)m->cap * MAX_LOAD_NUM)
        return KVP_OK;
    uint64_t cap = m->cap < MIN_CAP ? MIN_CAP : m->cap;
    while (need * MAX_LOAD_DEN > cap * MAX_LOAD_NUM)
        cap += cap / 2;
    if (cap > MAX_CAP)
        return KVP_ENOMEM;
    return rehash(m, mem, (uint32_t)cap);
}

kvp__rt_tentry *kvp__rt_tmap_find(const kvp__rt_tmap *m, uint64_t key)
{
    if (m->n == 0)
        return NULL;
    uint32_t pos = home_of(m, key), d = 0;
    for (;;) {
        kvp__rt_tentry *s = &m->e[pos];
        if (s->mask == 0 || dist_of(m, s->key, pos) < d)
            return NULL;
        if (s->key == key)
            return s;
        pos = next_pos(m, pos);
        d++;
    }
}

void kvp__rt_tmap_insert(kvp__rt_tmap *m, const kvp__rt_tentry *e)
{
    assert(e->mask != 0 && !kvp__rt_tmap_find(m, e->key));
    assert(((uint64_t)m->n + 1) * MAX_LOAD_DEN <= (uint64_t)m->cap * MAX_LOAD_NUM);
    place(m, *e);
    m->n++;
}

void kvp__rt_tmap_delete(kvp__rt_tmap *m, uint64_t key)
{
    kvp__rt_tentry *s = kvp__rt_tmap_find(m, key);
    if (!s)
        return;
    uint32_t pos = (uint32_t)(s - m->e);
    for (;;) {
        uint32_t nx = next_pos(m, pos);
        kvp__rt_tentry *n = &m->e[nx];
        if (n->mask == 0 || dist_of(m, n->key, nx) == 0)
            break;
        m->e[pos] = *n;
        pos = nx;
    }
    memset(&m->e[pos], 0, sizeof m->e[pos]);
    m->n--;
}

void kvp__rt_tmap_reset(kvp__rt_tmap *m)
{
    if (m->cap)
        memset(m->e, 0, (size_t)m->cap * sizeof *m->e);
    m->n = 0;
}

void kvp__rt_tmap_clear(kvp__rt_tmap *m, kvp__rt_mem *mem)
{
    kvp__rt_free(mem, m->e, (size_t)m->cap * sizeof *m->e);
    m->e = NULL;
    m->cap = 0;
    m->n = 0;
}

int kvp__rt_tmap_check(const kvp__rt_tmap *m)
{
    if ((m->cap == 0) != (m->e == NULL) || (m->cap != 0 && m->cap < MIN_CAP) || m->n > m->cap)
        return KVP_ECORRUPT;
    uint32_t live = 0;
    for (uint32_t pos = 0; pos < m->cap; pos++) {
        const kvp__rt_tentry *s = &m->e[pos];
        if (s->mask == 0)
            continue;
        live++;
        uint32_t d = dist_of(m, s->key, pos);
        uint32_t prev = pos == 0 ? m->cap - 1 : pos - 1;
        const kvp__rt_tentry *p = &m->e[prev];
        /* Robin hood order: an entry away from home follows one at most one step closer. */
        if (d > 0 && (p->mask == 0 || dist_of(m, p->key, prev) + 1 < d))
            return KVP_ECORRUPT;
        if (kvp__rt_tmap_find(m, s->key) != s)
            return KVP_ECORRUPT;
    }
    return live == m->n ? KVP_OK : KVP_ECORRUPT;
}
