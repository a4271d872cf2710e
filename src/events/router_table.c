/*
 * router_table.c - the router's index: one hash table from block hash (the engine's 64-bit
 * event integer) to the set of workers holding the block, with the media each holds it in.
 *
 *   slots[0 .. cap)   16 bytes each: {key, hv}; open addressing, robin hood order
 *
 *   hv, inline (bit 63 = 0): three 21-bit holder fields, field k at bits 21k .. 21k+20,
 *       each worker slot (15 bits) << 6 | media mask (6 bits); used fields first, an
 *       unused field is 0; hv == 0 is an empty slot.
 *   hv, spill (bit 63 = 1): class (bits 48..52), count (bits 32..47), record (bits 0..31):
 *       holders [0 .. count) of record `record` in arenas[class], whose records have room
 *       for 4 << class holders of 32 bits (worker << 8 | mask), unordered.
 *
 * Invariants (kvp__rt_table_check): every live slot's key is found by a probe from its
 * home, no key twice, robin hood order (a slot's probe distance is at most its
 * predecessor's + 1, and only 0 after an empty slot); holder sets are non-empty, name each
 * worker once with a non-zero mask of registered media; a spill set has 3 or more holders
 * (it returns inline when it drops to 2) and at most its class's room; each spill record is
 * named by exactly one slot or is on its class's free list; the counters (entries, holders,
 * holder-media triples) equal what the slots hold; n_entries <= 0.9 cap.
 *
 * Cost and why. A (block, worker) pair costs the slot's share plus, beyond three holders,
 * 4 bytes in a record: at 1 holder per block and the table between 60% and 90% full (it
 * grows by 1.5x, not 2x, so that the low point stays high), 17.8 to 26.7 bytes; at 2
 * holders half that. An SGLang gateway publishes 26.9 B per holder-block. Robin hood
 * ordering keeps probes short at 90% load and lets a miss stop early (a score ends on a
 * miss). Removal shifts the run back (no tombstones), so a table that saw many removals
 * probes as fast as a fresh one. Positions come from a seeded mixer of the key (engine
 * hashes of public token data could otherwise be chosen to collide in the low bits); the
 * mixer is not a PRF, which only matters for probe length, never for correctness.
 *
 * Room ahead: kvp__rt_table_reserve and kvp__rt_prepare_add allocate everything a batch's
 * inserts can need, so that kvp__rt_add cannot fail and a batch is applied all or nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "router_table.h"

#define FIELD_BITS   21u
#define FIELD_MASK   ((UINT64_C(1) << FIELD_BITS) - 1)
#define MAX_LOAD_NUM 9u /* n_entries <= cap * 9 / 10 */
#define MAX_LOAD_DEN 10u
#define MIN_CAP      16u
#define MAX_CAP      (UINT32_C(1) << 31)

/* ---------------------------------------------------------------- positions */

static inline uint32_t next_pos(const kvp__rt_table *t, uint32_t pos)
{
    return pos + 1 == t->cap ? 0 : pos + 1;
}

static inline uint32_t dist_of(const kvp__rt_table *t, uint64_t key, uint32_t pos)
{
    uint32_t home = kvp__rt_home(t, key);
    return pos >= home ? pos - home : pos + t->cap - home;
}

/* ---------------------------------------------------------------- holder encoding */

static inline uint32_t field_get(uint64_t hv, unsigned k)
{
    return (uint32_t)((hv >> (FIELD_BITS * k)) & FIELD_MASK);
}

static inline uint64_t field_set(uint64_t hv, unsigned k, uint32_t f)
{
    hv &= ~(FIELD_MASK << (FIELD_BITS * k));
    return hv | ((uint64_t)f << (FIELD_BITS * k));
}

/* Inline field <-> holder word (worker << 8 | mask). */
static inline uint32_t field_to_holder(uint32_t f)
{
    return (f >> KVP__RT_MEDIA_BITS) << 8 | (f & ((1u << KVP__RT_MEDIA_BITS) - 1));
}

static inline uint32_t holder_to_field(uint32_t h)
{
    return kvp__rt_holder_worker(h) << KVP__RT_MEDIA_BITS | kvp__rt_holder_mask(h);
}

static inline uint32_t spill_class(uint64_t hv)
{
    return (uint32_t)(hv >> 48) & 0x1fu;
}

static inline uint32_t spill_count(uint64_t hv)
{
    return (uint32_t)(hv >> 32) & 0xffffu;
}

static inline uint32_t spill_record(uint64_t hv)
{
    return (uint32_t)hv;
}

static inline uint64_t spill_hv(uint32_t cls, uint32_t count, uint32_t rec)
{
    return KVP__RT_SPILL_BIT | (uint64_t)cls << 48 | (uint64_t)count << 32 | rec;
}

static inline uint32_t class_room(uint32_t cls)
{
    return 4u << cls;
}

static inline uint32_t *record_ptr(const kvp__rt_table *t, uint32_t cls, uint32_t rec)
{
    return t->arenas[cls].words + (size_t)rec * class_room(cls);
}

static inline uint32_t inline_count(uint64_t hv)
{
    uint32_t n = 0;
    while (n < KVP__RT_INLINE && field_get(hv, n) != 0)
        n++;
    return n;
}

void kvp__rt_holders_of(const kvp__rt_table *t, uint32_t slot, kvp__rt_holders *out)
{
    uint64_t hv = t->slots[slot].hv;
    assert(hv != 0);
    if (kvp__rt_hv_is_spill(hv)) {
        out->h = record_ptr(t, spill_class(hv), spill_record(hv));
        out->n = spill_count(hv);
        return;
    }
    out->n = 0;
    for (unsigned k = 0; k < KVP__RT_INLINE; k++) {
        uint32_t f = field_get(hv, k);
        if (f == 0)
            break;
        out->inl[out->n++] = field_to_holder(f);
    }
    out->h = out->inl;
}

/* ---------------------------------------------------------------- spill records */

/* Take a record of class cls: KVP_OK with *rec, or KVP_ENOMEM (nothing changed). */
static int record_alloc(kvp__rt_table *t, uint32_t cls, uint32_t *rec)
{
    kvp__rt_arena *a = &t->arenas[cls];
    size_t room = class_room(cls);
    if (a->free_head != KVP__RT_NIL) {
        *rec = a->free_head;
        a->free_head = a->words[(size_t)a->free_head * room];
        a->n_free--;
        return KVP_OK;
    }
    if (a->n_records == a->cap_records) {
        uint64_t first = 256u >> cls ? 256u >> cls : 1u;
        uint64_t cap = a->cap_records ? (uint64_t)a->cap_records * 2 : first;
        if (cap * room > (uint64_t)UINT32_MAX)
            return KVP_ENOMEM;
        uint32_t *w = kvp__rt_alloc(t->mem, (size_t)cap * room * sizeof *w);
        if (!w)
            return KVP_ENOMEM;
        if (a->words)
            memcpy(w, a->words, (size_t)a->n_records * room * sizeof *w);
        kvp__rt_free(t->mem, a->words, (size_t)a->cap_records * room * sizeof *w);
        a->words = w;
        a->cap_records = (uint32_t)cap;
    }
    *rec = a->n_records++;
    return KVP_OK;
}

static void record_free(kvp__rt_table *t, uint32_t cls, uint32_t rec)
{
    kvp__rt_arena *a = &t->arenas[cls];
    a->words[(size_t)rec * class_room(cls)] = a->free_head;
    a->free_head = rec;
    a->n_free++;
}

/* ---------------------------------------------------------------- the table */

void kvp__rt_table_init(kvp__rt_table *t, kvp__rt_mem *mem, uint64_t seed)
{
    memset(t, 0, sizeof *t);
    t->mem = mem;
    t->seed = seed;
    for (unsigned c = 0; c < KVP__RT_N_CLASSES; c++)
        t->arenas[c].free_head = KVP__RT_NIL;
}

void kvp__rt_table_destroy(kvp__rt_table *t)
{
    kvp__rt_free(t->mem, t->slots, (size_t)t->cap * sizeof *t->slots);
    for (unsigned c = 0; c < KVP__RT_N_CLASSES; c++) {
        kvp__rt_arena *a = &t->arenas[c];
        kvp__rt_free(t->mem, a->words, (size_t)a->cap_records * class_room(c) * sizeof(uint32_t));
    }
    t->slots = NULL;
    t->cap = 0;
}

/* Place (key, hv) in robin hood order; key must be absent and a slot free. */
static void place(kvp__rt_table *t, uint64_t key, uint64_t hv)
{
    uint32_t pos = kvp__rt_home(t, key), d = 0;
    for (;;) {
        kvp__rt_slot *s = &t->slots[pos];
        if (s->hv == 0) {
            s->key = key;
            s->hv = hv;
            return;
        }
        uint32_t sd = dist_of(t, s->key, pos);
        if (sd < d) {
            kvp__rt_slot tmp = *s;
            s->key = key;
            s->hv = hv;
            key = tmp.key;
            hv = tmp.hv;
            d = sd;
        }
        pos = next_pos(t, pos);
        d++;
    }
}

/* Rebuild into new_cap slots. KVP_OK or KVP_ENOMEM (table unchanged). */
static int rehash(kvp__rt_table *t, uint32_t new_cap)
{
    kvp__rt_slot *fresh = kvp__rt_alloc(t->mem, (size_t)new_cap * sizeof *fresh);
    if (!fresh)
        return KVP_ENOMEM;
    memset(fresh, 0, (size_t)new_cap * sizeof *fresh);
    kvp__rt_slot *old = t->slots;
    uint32_t old_cap = t->cap;
    t->slots = fresh;
    t->cap = new_cap;
    for (uint32_t i = 0; i < old_cap; i++) {
        if (old[i].hv != 0)
            place(t, old[i].key, old[i].hv);
    }
    kvp__rt_free(t->mem, old, (size_t)old_cap * sizeof *old);
    return KVP_OK;
}

int kvp__rt_table_reserve(kvp__rt_table *t, uint64_t n_new)
{
    uint64_t need = (uint64_t)t->n_entries + n_new;
    if (need * MAX_LOAD_DEN <= (uint64_t)t->cap * MAX_LOAD_NUM)
        return KVP_OK;
    uint64_t cap = t->cap < MIN_CAP ? MIN_CAP : t->cap;
    while (need * MAX_LOAD_DEN > cap * MAX_LOAD_NUM)
        cap += cap / 2;
    if (cap > MAX_CAP)
        return KVP_ENOMEM;
    return rehash(t, (uint32_t)cap);
}

uint32_t kvp__rt_find(const kvp__rt_table *t, uint64_t key)
{
    if (t->n_entries == 0)
        return KVP__RT_NIL;
    uint32_t pos = kvp__rt_home(t, key), d = 0;
    for (;;) {
        const kvp__rt_slot *s = &t->slots[pos];
        if (s->hv == 0)
            return KVP__RT_NIL;
        if (s->key == key)
            return pos;
        if (dist_of(t, s->key, pos) < d)
            return KVP__RT_NIL;
        pos = next_pos(t, pos);
        d++;
    }
}

/* Empty slot pos and shift the following run back by one. Cannot fail. */
static void delete_at(kvp__rt_table *t, uint32_t pos)
{
    for (;;) {
        uint32_t nx = next_pos(t, pos);
        kvp__rt_slot *s = &t->slots[nx];
        if (s->hv == 0 || dist_of(t, s->key, nx) == 0)
            break;
        t->slots[pos] = *s;
        pos = nx;
    }
    t->slots[pos].key = 0;
    t->slots[pos].hv = 0;
    t->n_entries--;
}

/* ---------------------------------------------------------------- holder sets */

/* Index of worker among h[0 .. n), or -1. */
static int holder_index(const uint32_t *h, uint32_t n, uint32_t worker)
{
    for (uint32_t i = 0; i < n; i++) {
        if (kvp__rt_holder_worker(h[i]) == worker)
            return (int)i;
    }
    return -1;
}

int kvp__rt_prepare_add(kvp__rt_table *t, uint64_t key, uint32_t worker, bool *absent)
{
    uint32_t pos = kvp__rt_find(t, key);
    *absent = pos == KVP__RT_NIL;
    if (pos == KVP__RT_NIL)
        return KVP_OK;
    kvp__rt_holders hs;
    kvp__rt_holders_of(t, pos, &hs);
    if (holder_index(hs.h, hs.n, worker) >= 0)
        return KVP_OK;
    uint64_t hv = t->slots[pos].hv;
    bool spill = kvp__rt_hv_is_spill(hv);
    uint32_t room = spill ? class_room(spill_class(hv)) : KVP__RT_INLINE;
    if (hs.n < room)
        return KVP_OK;
    uint32_t cls = spill ? spill_class(hv) + 1 : 0, rec;
    assert(cls < KVP__RT_N_CLASSES);
    int rc = record_alloc(t, cls, &rec);
    if (rc != KVP_OK)
        return rc;
    /* The arena may have moved: decode again before copying. */
    kvp__rt_holders_of(t, pos, &hs);
    memcpy(record_ptr(t, cls, rec), hs.h, (size_t)hs.n * sizeof *hs.h);
    if (spill)
        record_free(t, spill_class(hv), spill_record(hv));
    t->slots[pos].hv = spill_hv(cls, hs.n, rec);
    return KVP_OK;
}

bool kvp__rt_add(kvp__rt_table *t, uint64_t key, uint32_t worker, uint32_t bit)
{
    assert(bit != 0 && bit < (1u << KVP__RT_MEDIA_BITS));
    uint32_t pos = kvp__rt_find(t, key);
    uint32_t fresh = worker << 8 | bit;
    if (pos == KVP__RT_NIL) {
        assert((uint64_t)(t->n_entries + 1) * MAX_LOAD_DEN <= (uint64_t)t->cap * MAX_LOAD_NUM);
        place(t, key, holder_to_field(fresh));
        t->n_entries++;
        t->n_holders++;
        t->n_holder_media++;
        return true;
    }
    uint64_t hv = t->slots[pos].hv;
    if (kvp__rt_hv_is_spill(hv)) {
        uint32_t *h = record_ptr(t, spill_class(hv), spill_record(hv)), n = spill_count(hv);
        int i = holder_index(h, n, worker);
        if (i >= 0) {
            t->n_holder_media += (h[i] & bit) == 0;
            h[i] |= bit;
            return false;
        }
        assert(n < class_room(spill_class(hv)));
        h[n] = fresh;
        t->slots[pos].hv = spill_hv(spill_class(hv), n + 1, spill_record(hv));
    } else {
        uint32_t n = inline_count(hv);
        for (uint32_t k = 0; k < n; k++) {
            uint32_t f = field_get(hv, k);
            if (f >> KVP__RT_MEDIA_BITS == worker) {
                t->n_holder_media += (f & bit) == 0;
                t->slots[pos].hv = field_set(hv, k, f | bit);
                return false;
            }
        }
        assert(n < KVP__RT_INLINE);
        t->slots[pos].hv = field_set(hv, n, holder_to_field(fresh));
    }
    t->n_holders++;
    t->n_holder_media++;
    return true;
}

/* Drop holder i of the spill set at pos; back to inline at 2 holders. Cannot fail. */
static void spill_drop(kvp__rt_table *t, uint32_t pos, uint32_t i)
{
    uint64_t hv = t->slots[pos].hv;
    uint32_t cls = spill_class(hv), rec = spill_record(hv), n = spill_count(hv);
    uint32_t *h = record_ptr(t, cls, rec);
    h[i] = h[n - 1];
    n--;
    if (n > 2) {
        t->slots[pos].hv = spill_hv(cls, n, rec);
        return;
    }
    uint64_t inl = 0;
    for (uint32_t k = 0; k < n; k++)
        inl = field_set(inl, k, holder_to_field(h[k]));
    record_free(t, cls, rec);
    t->slots[pos].hv = inl;
}

/* Remove `mask` from holder `i` of the live slot pos. Returns true when the holder went
 * (and the slot may now hold another entry after a shift: re-read it). */
static bool drop_media(kvp__rt_table *t, uint32_t pos, uint32_t i, uint32_t mask)
{
    uint64_t hv = t->slots[pos].hv;
    if (kvp__rt_hv_is_spill(hv)) {
        uint32_t *h = record_ptr(t, spill_class(hv), spill_record(hv));
        uint32_t had = kvp__rt_holder_mask(h[i]);
        t->n_holder_media -= (uint64_t)__builtin_popcount(had & mask);
        if ((had & ~mask) != 0) {
            h[i] &= ~mask;
            return false;
        }
        spill_drop(t, pos, i);
        t->n_holders--;
        return true;
    }
    uint32_t f = field_get(hv, i), had = f & ((1u << KVP__RT_MEDIA_BITS) - 1);
    t->n_holder_media -= (uint64_t)__builtin_popcount(had & mask);
    if ((had & ~mask) != 0) {
        t->slots[pos].hv = field_set(hv, i, f & ~mask);
        return false;
    }
    uint32_t n = inline_count(hv);
    for (uint32_t k = i; k + 1 < n; k++)
        hv = field_set(hv, k, field_get(hv, k + 1));
    hv = field_set(hv, n - 1, 0);
    t->n_holders--;
    if (hv == 0)
        delete_at(t, pos);
    else
        t->slots[pos].hv = hv;
    return true;
}

bool kvp__rt_remove(kvp__rt_table *t, uint64_t key, uint32_t worker, uint32_t mask)
{
    uint32_t pos = kvp__rt_find(t, key);
    if (pos == KVP__RT_NIL)
        return false;
    kvp__rt_holders hs;
    kvp__rt_holders_of(t, pos, &hs);
    int i = holder_index(hs.h, hs.n, worker);
    if (i < 0)
        return false;
    return drop_media(t, pos, (uint32_t)i, mask);
}

uint32_t kvp__rt_held_mask(const kvp__rt_table *t, uint64_t key, uint32_t worker)
{
    uint32_t pos = kvp__rt_find(t, key);
    if (pos == KVP__RT_NIL)
        return 0;
    kvp__rt_holders hs;
    kvp__rt_holders_of(t, pos, &hs);
    int i = holder_index(hs.h, hs.n, worker);
    return i < 0 ? 0 : kvp__rt_holder_mask(hs.h[i]);
}

/* Index of worker in the holder set hv, or -1; straight on hv for inline sets (the scan of
 * kvp__rt_clear_worker visits every slot). */
static inline int holder_slot_index(const kvp__rt_table *t, uint64_t hv, uint32_t worker)
{
    if (kvp__rt_hv_is_spill(hv))
        return holder_index(record_ptr(t, spill_class(hv), spill_record(hv)), spill_count(hv),
                            worker);
    for (unsigned k = 0; k < KVP__RT_INLINE; k++) {
        uint32_t f = field_get(hv, k);
        if (f == 0)
            return -1;
        if (f >> KVP__RT_MEDIA_BITS == worker)
            return (int)k;
    }
    return -1;
}

uint64_t kvp__rt_clear_worker(kvp__rt_table *t, uint32_t worker)
{
    if (t->n_entries == 0)
        return 0;
    /* Start after an empty slot (load <= 90%: one exists), so that the back shifts of a
     * removal only pull entries the scan has not passed yet. */
    uint32_t start = 0;
    while (t->slots[start].hv != 0)
        start++;
    uint64_t n_cleared = 0;
    uint32_t pos = next_pos(t, start);
    for (uint32_t left = t->cap - 1; left > 0;) {
        uint64_t hv = t->slots[pos].hv;
        int i = hv == 0 ? -1 : holder_slot_index(t, hv, worker);
        if (i < 0) {
            pos = next_pos(t, pos);
            left--;
            continue;
        }
        bool slot_gone = hv >> FIELD_BITS == 0; /* one inline holder: the slot empties */
        (void)drop_media(t, pos, (uint32_t)i, (1u << KVP__RT_MEDIA_BITS) - 1);
        n_cleared++;
        if (!slot_gone) {
            pos = next_pos(t, pos);
            left--;
        } /* else the shift moved the next entry here: look at pos again */
    }
    return n_cleared;
}

uint64_t kvp__rt_table_bytes(const kvp__rt_table *t)
{
    uint64_t bytes = (uint64_t)t->cap * sizeof *t->slots;
    for (unsigned c = 0; c < KVP__RT_N_CLASSES; c++)
        bytes += (uint64_t)t->arenas[c].cap_records * class_room(c) * sizeof(uint32_t);
    return bytes;
}

/* ---------------------------------------------------------------- checker */

/* Walk each class's free list, marking free records in freed[c] (malloc'ed bitmaps).
 * KVP_OK, KVP_ECORRUPT (cycle, bad link, wrong n_free), KVP_ENOMEM. */
static int check_free_lists(const kvp__rt_table *t, uint8_t *freed[KVP__RT_N_CLASSES])
{
    for (unsigned c = 0; c < KVP__RT_N_CLASSES; c++) {
        const kvp__rt_arena *a = &t->arenas[c];
        if (a->n_records > a->cap_records || a->n_free > a->n_records)
            return KVP_ECORRUPT;
        freed[c] = calloc((size_t)a->n_records + 1, 1);
        if (!freed[c])
            return KVP_ENOMEM;
        uint32_t n = 0;
        for (uint32_t r = a->free_head; r != KVP__RT_NIL; r = a->words[(size_t)r * class_room(c)]) {
            if (r >= a->n_records || freed[c][r] || ++n > a->n_free)
                return KVP_ECORRUPT;
            freed[c][r] = 1;
        }
        if (n != a->n_free)
            return KVP_ECORRUPT;
    }
    return KVP_OK;
}

/* One live slot's holder set. seen[w] holds the slot position + 1 of w's last holder. */
static int check_holders(const kvp__rt_table *t, uint32_t pos, uint8_t *freed[], uint32_t *seen,
                         uint64_t *counts, const bool *live, uint32_t n_workers, uint32_t media_ok,
                         uint64_t sums[3], uint32_t used[])
{
    uint64_t hv = t->slots[pos].hv;
    if (kvp__rt_hv_is_spill(hv)) {
        uint32_t c = spill_class(hv), rec = spill_record(hv), n = spill_count(hv);
        if (c >= KVP__RT_N_CLASSES || rec >= t->arenas[c].n_records || freed[c][rec] || n < 3 ||
            n > class_room(c) || (hv & (UINT64_C(0x7fe0) << 48)) != 0)
            return KVP_ECORRUPT;
        freed[c][rec] = 1; /* now "named": a second slot naming it fails the test above */
        used[c]++;
    } else {
        for (unsigned k = inline_count(hv); k < KVP__RT_INLINE; k++) {
            if (field_get(hv, k) != 0)
                return KVP_ECORRUPT;
        }
    }
    kvp__rt_holders hs;
    kvp__rt_holders_of(t, pos, &hs);
    if (hs.n == 0)
        return KVP_ECORRUPT;
    for (uint32_t i = 0; i < hs.n; i++) {
        uint32_t w = kvp__rt_holder_worker(hs.h[i]), m = kvp__rt_holder_mask(hs.h[i]);
        if (w >= n_workers || !live[w] || m == 0 || (m & ~media_ok) != 0 || seen[w] == pos + 1)
            return KVP_ECORRUPT;
        seen[w] = pos + 1;
        counts[w]++;
        sums[1]++;
        sums[2] += (uint64_t)__builtin_popcount(m);
    }
    sums[0]++;
    return KVP_OK;
}

/* Robin hood order and reachability of the live slot pos. */
static bool slot_placed(const kvp__rt_table *t, uint32_t pos)
{
    uint64_t key = t->slots[pos].key;
    uint32_t d = dist_of(t, key, pos);
    uint32_t prev = pos == 0 ? t->cap - 1 : pos - 1;
    if (d > 0) {
        const kvp__rt_slot *p = &t->slots[prev];
        if (p->hv == 0 || dist_of(t, p->key, prev) + 1 < d)
            return false;
    }
    return kvp__rt_find(t, key) == pos;
}

int kvp__rt_table_check(const kvp__rt_table *t, uint64_t *counts, const bool *live,
                        uint32_t n_workers, uint32_t media_ok)
{
    if ((t->cap == 0) != (t->slots == NULL) || (t->cap != 0 && t->cap < MIN_CAP) ||
        (uint64_t)t->n_entries * MAX_LOAD_DEN > (uint64_t)t->cap * MAX_LOAD_NUM)
        return KVP_ECORRUPT;
    uint8_t *freed[KVP__RT_N_CLASSES] = {0};
    uint32_t used[KVP__RT_N_CLASSES] = {0};
    uint32_t *seen = calloc((size_t)n_workers + 1, sizeof *seen);
    int rc = seen ? check_free_lists(t, freed) : KVP_ENOMEM;
    uint64_t sums[3] = {0, 0, 0};
    for (uint32_t pos = 0; rc == KVP_OK && pos < t->cap; pos++) {
        if (t->slots[pos].hv == 0)
            continue;
        if (!slot_placed(t, pos))
            rc = KVP_ECORRUPT;
        else
            rc = check_holders(t, pos, freed, seen, counts, live, n_workers, media_ok, sums, used);
    }
    for (unsigned c = 0; rc == KVP_OK && c < KVP__RT_N_CLASSES; c++) {
        if (used[c] + t->arenas[c].n_free != t->arenas[c].n_records)
            rc = KVP_ECORRUPT;
    }
    if (rc == KVP_OK &&
        (sums[0] != t->n_entries || sums[1] != t->n_holders || sums[2] != t->n_holder_media))
        rc = KVP_ECORRUPT;
    for (unsigned c = 0; c < KVP__RT_N_CLASSES; c++)
        free(freed[c]);
    free(seen);
    return rc;
}
