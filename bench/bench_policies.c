/*
 * bench_policies.c - a policy lab: token hit rates of eviction policies on a request log
 * under the rules of `kvprefix replay` (docs/replay.md), against LRU and the offline optimum.
 *
 *   bench_policies [--capacities A,B,...] [--policies P,Q,...] [--param X] [--csv] LOG
 *
 * (default capacities 500,1000,2000,5000,10000,20000,50000, at most 32, each a positive
 * integer; every policy, or those named exactly in the --policies list; lru and min always;
 * an unknown name or a bad capacity is an error, exit status 2).
 *
 * LOG is a Mooncake trace or a token-id log (path argument; the tool's reader, block size 512
 * for traces, 16 for token logs, the namespace of each line). Every request is replayed once
 * through the replay engine (replay_sim.c, no pool), which yields the dense block numbers
 * and LRU's figures at any capacity; the touches are kept (replay_opt.c) and each policy is
 * then simulated on them at each capacity:
 *
 *   1. the hit: the longest cached prefix of the full prompt blocks, at most
 *      (tokens - 1) / block size blocks reused;
 *   2. the request's first min(blocks, C) blocks are touched from the last to the first: a
 *      cached one is a hit for the policy (policy->hit), a new one is admitted
 *      (policy->insert); they are pinned while the request runs;
 *   3. victims are taken (policy->victim, never a pinned block) until C blocks remain.
 *
 * The lab's own LRU must give exactly the replay engine's hit tokens at every capacity (the
 * program stops with status 3 otherwise). MIN is replay_opt.c. Reported per policy and
 * capacity: the token hit rate and the fraction of the LRU-to-MIN gap it closes.
 *
 * Policies: lru; slru (80% protected); s3fifo (10% small queue, a ghost of the main queue's
 * size, frequencies to 3); lfuda (LFU with dynamic aging); min (replay_opt.c); and the lab's:
 *
 *   freq2     recency plus 2 C touches once a block has been hit since its admission
 *   h2q       2Q with history: a block seen before (cached or not) enters main, a first
 *             sight a probation queue of 25% of C; a hit moves a block to main
 *   decay     learned reuse odds p (see learn_p) times an exponential decay of age
 *   cdecay    decay with chain-closed keys, learning from the whole log's history
 *   cdecay-gK the same with the history an online cache keeps (its blocks and a ghost of the
 *             last K C evicted keys, K = 1, 4, 16) (docs/replay.md, "Eviction policies
 *             against the optimum": definition, figures)
 *   cfifo-g16 cdecay-g16 with one FIFO per class, every FIFO ranked by its class's current
 *             odds (lost 1.2 points to LRU on the synthetic trace: dropped)
 *   cfifo2-g16 one FIFO per class with each key fixed at its touch: the form the library
 *             runs (KVP_EVICT_CDECAY, src/policy_cdecay.c, which refreshes the odds once per
 *             request); better than cdecay-g16 at three of the four target points
 *   o-whether not a policy: LRU told by an oracle whether a block will ever be touched again
 *             (not when); it measures how much of the LRU-to-MIN gap is "which blocks" and
 *             how much is "when"
 *   lhdg      hit density after LHD (Beckmann, Chen, Cidon, NSDI 2018): per class (earlier
 *             touches x new blocks x deepest block) a reuse-age distribution learned online
 *             from the blocks' next touches, cached or in a ghost of 8 C keys (Kaplan-Meier,
 *             running trials counted); a block's density is its best reuses per slot-touch
 *             over a horizon; victim: the least dense of 64 random cached leaves. Better than
 *             cdecay-g16 at all four target points, within 0.1 point of LRU everywhere
 *             (docs/replay.md, "lhdg": definition, figures)
 *   elhdg     lhdg choosing among all cached leaves (exact) instead of 64 random ones
 *   lhd-own   LHD as published: densities from the cache's own hits and evictions (blind to
 *             reuses after eviction; lost 5.1 points to LRU on the synthetic trace: dropped)
 *   o-lhdg    not a policy: elhdg with the table of the whole log kept fixed (learned by a
 *             first elhdg run): what this family reaches if it knew the log's statistics
 *
 * The hit-density policies read knobs from the environment (the defaults are the measured
 * form): LHD_FEAT (class features, see lhd_parse_feat; default e3,nb5,last2), LHD_GHOST (8),
 * LHD_SAMPLE (64), LHD_BPO (age bins per octave, 4), LHD_W (pooling, 10), LHD_RECOMP (1000
 * touches), LHD_SEED (1). Tried with them and dropped (within the noise of a different
 * sampling seed, about 1 point of gap, or worse): cdecay's 27 classes (26.2% / 10.9% / 2.0% /
 * 0.6% of the gap at the four target points), the features turn, og, rg, len, fan, dep, hit
 * (up to 256 classes; even with the whole log's table, at a ghost of 16 C, they raise o-lhdg by at
 * most 2 points of the gap),
 * ghosts of 4, 12, 16 and 32 C, 2, 3, 6 and 8 bins per octave, pooling of 1 to 300
 * pseudo-trials, ages in requests, histograms decayed by 0.95-0.997 per recompute, a key
 * leaving the ghost taken as never reused rather than censored, and EVA's ranking (reuses
 * minus the cache's reuse rate times the slot-time, Beckmann and Sanchez) instead of density.
 * LHD_HEADS=1 takes as candidates the least recent unpinned leaf of one list per class (in
 * touch order, as CDECAY's FIFOs) instead of 64 random leaves: 26.9% / 12.1% / 3.4% / 3.5%,
 * 0.42 points below LRU at the synthetic trace's 500 blocks (the density is not monotone in
 * age, so a list's tail is not its least dense block).
 *
 * --param X overrides the knob of the policies selected (freq2: bonus in C; h2q: probation
 * share; decay, cdecay: tau in touches). Tried and dropped (none both better than cdecay at
 * the target capacities and within a point of LRU everywhere): a continuation bonus (for a
 * request whose hit ends at a cached leaf), frequency bonuses of up to 7 levels, learned
 * odds as a linear bonus, tau proportional to C or scaled by the observed median reuse gap,
 * a learned time to live per class, and more features in the classes (continuation, depth):
 * more classes learned slower and did worse.
 *
 * Cost: the log's touches are held (9 bytes each: the block, MIN's next touch, the oracle's
 * bit) plus about 150 bytes per distinct block (the lab's arrays and the replay engine's); a
 * policy at one capacity is O(A) for A touches (the lists) or O(A log A) (the lazy heaps,
 * whose stale entries are dropped when popped); the hit-density policies are O(1) per touch
 * plus a census and table rebuild every 1,000 touches (O(C + ghost) and O(classes x 128^2))
 * and O(64) per victim (elhdg: O(cached leaves)). The conversation trace's full table (7
 * capacities, 17 policies) takes about 2 minutes, most of it elhdg's and o-lhdg's exact scans.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvprefix.h"
#include "logread.h"
#include "replay_opt.h"
#include "replay_sim.h"

#define NONE     UINT32_MAX
#define MAX_CAPS 32
#define MAX_POLS 32

/* ---- the log ------------------------------------------------------------------------------ */

typedef struct lab_log {
    rp_opt *opt;      /* the touches, per request (and MIN) */
    rp_sim *sim;      /* LRU's figures at any capacity */
    uint32_t bs;      /* tokens per block */
    uint64_t n_tok;   /* prompt tokens in all */
    uint32_t *depth;  /* per block: its depth */
    uint32_t *parent; /* per block: the block before it, or NONE */
    uint8_t *reused;  /* per touch (in replay_opt's order): 1 when a later request touches
                         the block again (for the calibration oracle only) */
    size_t n_blocks;
} lab_log;

/* ---- the simulator ------------------------------------------------------------------------- */

typedef struct hent {
    double prio;  /* priority when pushed */
    uint32_t b;   /* block */
    uint32_t ver; /* the block's version when pushed (stale when it changed) */
} hent;

typedef struct sim sim;
typedef struct policy {
    const char *name;
    void (*reset)(sim *s);
    void (*hit)(sim *s, uint32_t b, uint32_t depth);
    void (*insert)(sim *s, uint32_t b, uint32_t depth);
    uint32_t (*victim)(sim *s); /* an unpinned cached block, removed from the policy */
} policy;

struct sim {
    const lab_log *lg;
    uint64_t cap;      /* capacity in blocks */
    const policy *pol; /* the policy simulated */
    size_t n_cached;   /* blocks cached */
    uint8_t *cached;   /* per block: 1 when cached */
    uint32_t *pin;     /* per block: request index + 1 while pinned by it */
    uint64_t now;      /* touches so far (the clock) */
    size_t req;        /* the request being replayed */
    size_t touch_at;   /* index of the current touch in the log's order */
    size_t req_end;    /* one past the request's last touch stored (base + n) */
    double chain_prev; /* key given to the block touched just before (its child) */
    uint32_t req_hit;  /* its hit depth (leading cached blocks) */
    uint32_t req_n;    /* its blocks touched */
    /* lists (lru, slru, s3fifo): doubly linked through prev/next, one head per list */
    uint32_t *prev, *next;
    uint8_t *list;     /* per block: which list */
    uint32_t head[32]; /* most recent (front) of each list */
    uint32_t tail[32]; /* least recent (back) */
    size_t len[32];    /* blocks in each list */
    uint8_t *freq;     /* s3fifo frequency, 0..3 */
    uint64_t *ghost;   /* s3fifo: ghost insertion stamp + 1, or 0 */
    uint64_t ghost_in; /* ghost insertions so far */
    /* heap policies */
    hent *heap;
    size_t n_heap, heap_cap;
    hent *held; /* pinned entries popped while looking for a victim */
    size_t held_cap;
    uint32_t *ver;     /* per block: version (bumped on each push) */
    double *prio;      /* per block: current priority */
    double aging;      /* L: the priority of the last victim */
    uint32_t *cnt;     /* per block: requests that touched it while cached since admission */
    uint32_t *ever;    /* per block: requests that ever touched it (history, kept after
                          eviction) */
    uint64_t *last;    /* per block: clock of its last touch */
    double ghost_mult; /* learned policies: history kept for ghost_mult * C evicted keys
                          (0: the whole log's) */
    uint32_t *hist;    /* per block: touches known under that bounded history */
    uint8_t *cls;      /* per block: class of its last touch (learn) */
    double param;      /* a knob of the policy under test */
};

static bool is_pinned(const sim *s, uint32_t b)
{
    return s->pin[b] == s->req + 1;
}

/* ---- intrusive lists --------------------------------------------------------------------- */

static void list_push_front(sim *s, int l, uint32_t b)
{
    s->list[b] = (uint8_t)l;
    s->prev[b] = NONE;
    s->next[b] = s->head[l];
    if (s->head[l] != NONE)
        s->prev[s->head[l]] = b;
    else
        s->tail[l] = b;
    s->head[l] = b;
    s->len[l]++;
}

static void list_remove(sim *s, uint32_t b)
{
    int l = s->list[b];
    if (s->prev[b] != NONE)
        s->next[s->prev[b]] = s->next[b];
    else
        s->head[l] = s->next[b];
    if (s->next[b] != NONE)
        s->prev[s->next[b]] = s->prev[b];
    else
        s->tail[l] = s->prev[b];
    s->len[l]--;
}

/* The least recent unpinned block of list l, or NONE. */
static uint32_t list_oldest_unpinned(const sim *s, int l)
{
    uint32_t b = s->tail[l];
    while (b != NONE && is_pinned(s, b))
        b = s->prev[b];
    return b;
}

static void lists_reset(sim *s)
{
    for (int l = 0; l < 32; l++) {
        s->head[l] = s->tail[l] = NONE;
        s->len[l] = 0;
    }
}

/* ---- LRU ----------------------------------------------------------------------------------- */

static void lru_touch(sim *s, uint32_t b, uint32_t depth)
{
    (void)depth;
    if (s->cached[b])
        list_remove(s, b);
    list_push_front(s, 0, b);
}

static uint32_t lru_victim(sim *s)
{
    uint32_t b = list_oldest_unpinned(s, 0);
    list_remove(s, b);
    return b;
}

static const policy pol_lru = {"lru", lists_reset, lru_touch, lru_touch, lru_victim};

/* ---- SLRU: probation (list 0) and protected (list 1, 80% of the capacity) ----------------- */

static void slru_hit(sim *s, uint32_t b, uint32_t depth)
{
    (void)depth;
    list_remove(s, b);
    list_push_front(s, 1, b);
    size_t prot = (size_t)(s->cap * 8 / 10);
    while (s->len[1] > prot) {
        uint32_t d = s->tail[1];
        list_remove(s, d);
        list_push_front(s, 0, d);
    }
}

static void slru_insert(sim *s, uint32_t b, uint32_t depth)
{
    (void)depth;
    list_push_front(s, 0, b);
}

static uint32_t slru_victim(sim *s)
{
    uint32_t b = list_oldest_unpinned(s, 0);
    if (b == NONE)
        b = list_oldest_unpinned(s, 1);
    list_remove(s, b);
    return b;
}

static const policy pol_slru = {"slru", lists_reset, slru_hit, slru_insert, slru_victim};

/* ---- S3-FIFO: small (list 0, 10%), main (list 1), ghost of main's size -------------------- */

static void s3_hit(sim *s, uint32_t b, uint32_t depth)
{
    (void)depth;
    if (s->freq[b] < 3)
        s->freq[b]++;
}

static bool s3_in_ghost(const sim *s, uint32_t b)
{
    size_t main_size = s->cap - s->cap / 10;
    return s->ghost[b] != 0 && s->ghost_in - (s->ghost[b] - 1) <= main_size;
}

static void s3_insert(sim *s, uint32_t b, uint32_t depth)
{
    (void)depth;
    s->freq[b] = 0;
    if (s3_in_ghost(s, b)) {
        s->ghost[b] = 0;
        list_push_front(s, 1, b);
    } else {
        list_push_front(s, 0, b);
    }
}

static uint32_t s3_victim(sim *s)
{
    size_t small = s->cap / 10 ? s->cap / 10 : 1;
    /* Bounded: every pass either evicts, moves a block from small to main, or lowers a
     * frequency; pinned blocks are rotated, and some unpinned block is always cached. */
    for (size_t guard = 0;; guard++) {
        bool from_small = s->len[0] >= small || s->len[1] == 0;
        if (guard > 4 * (s->n_cached + 4))
            from_small = s->len[0] > 0 && list_oldest_unpinned(s, 0) != NONE;
        int l = from_small ? 0 : 1;
        uint32_t b = s->tail[l];
        if (b == NONE) {
            l = 1 - l;
            b = s->tail[l];
        }
        list_remove(s, b);
        if (is_pinned(s, b)) {
            list_push_front(s, l, b);
            continue;
        }
        if (l == 0) {
            if (s->freq[b] > 0) {
                s->freq[b] = 0;
                list_push_front(s, 1, b);
                continue;
            }
            s->ghost[b] = ++s->ghost_in;
            return b;
        }
        if (s->freq[b] > 0) {
            s->freq[b]--;
            list_push_front(s, 1, b);
            continue;
        }
        return b;
    }
}

static void s3_reset(sim *s)
{
    lists_reset(s);
    s->ghost_in = 0;
    memset(s->ghost, 0, s->lg->n_blocks * sizeof *s->ghost);
}

static const policy pol_s3fifo = {"s3fifo", s3_reset, s3_hit, s3_insert, s3_victim};

/* ---- 2Q with history: a block seen before (by any earlier request, cached or not) goes to
 * main (list 1), a first sight to probation (list 0, param of C, default 0.25); a hit moves
 * a block to main; victims: probation's oldest while probation is over its share, else
 * main's oldest. */
static double prob_share(const sim *s)
{
    return isnan(s->param) ? 0.25 : s->param;
}

static void h2q_hit(sim *s, uint32_t b, uint32_t depth)
{
    (void)depth;
    list_remove(s, b);
    list_push_front(s, 1, b);
}

static void h2q_insert(sim *s, uint32_t b, uint32_t depth)
{
    (void)depth;
    list_push_front(s, s->ever[b] > 0 ? 1 : 0, b);
}

static uint32_t h2q_victim(sim *s)
{
    uint32_t b = NONE;
    if ((double)s->len[0] > prob_share(s) * (double)s->cap || s->len[1] == 0)
        b = list_oldest_unpinned(s, 0);
    if (b == NONE)
        b = list_oldest_unpinned(s, 1);
    if (b == NONE)
        b = list_oldest_unpinned(s, 0);
    list_remove(s, b);
    return b;
}

static const policy pol_h2q = {"h2q", lists_reset, h2q_hit, h2q_insert, h2q_victim};

/* ---- priority policies: a lazy min-heap of (priority, block) ------------------------------ */

static bool hent_less(const sim *s, const hent *a, const hent *b)
{
    if (a->prio != b->prio)
        return a->prio < b->prio;
    /* Ties: the deeper block first, so chains stay whole. */
    return s->lg->depth[a->b] > s->lg->depth[b->b];
}

static void heap_push(sim *s, uint32_t b, double prio)
{
    if (s->n_heap == s->heap_cap) {
        s->heap_cap = s->heap_cap ? 2 * s->heap_cap : 1024;
        s->heap = realloc(s->heap, s->heap_cap * sizeof *s->heap);
        if (!s->heap) {
            fprintf(stderr, "bench_policies: out of memory\n");
            exit(1);
        }
    }
    s->prio[b] = prio;
    hent e = {prio, b, ++s->ver[b]};
    size_t i = s->n_heap++;
    while (i > 0 && hent_less(s, &e, &s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = e;
}

static hent heap_pop(sim *s)
{
    hent top = s->heap[0], e = s->heap[--s->n_heap];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= s->n_heap)
            break;
        if (c + 1 < s->n_heap && hent_less(s, &s->heap[c + 1], &s->heap[c]))
            c++;
        if (!hent_less(s, &s->heap[c], &e))
            break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (s->n_heap > 0)
        s->heap[i] = e;
    return top;
}

static void heap_reset(sim *s)
{
    s->n_heap = 0;
    s->aging = 0;
}

/* The cached, unpinned block of least priority; pinned ones are pushed back afterwards. */
static uint32_t heap_victim(sim *s)
{
    size_t n_held = 0;
    uint32_t v = NONE;
    while (s->n_heap > 0) {
        hent e = heap_pop(s);
        if (!s->cached[e.b] || e.ver != s->ver[e.b])
            continue; /* stale */
        if (is_pinned(s, e.b)) {
            if (!cli_grow((void **)&s->held, &s->held_cap, n_held + 1, sizeof *s->held)) {
                fprintf(stderr, "bench_policies: out of memory\n");
                exit(1);
            }
            s->held[n_held++] = e;
            continue;
        }
        v = e.b;
        s->aging = e.prio;
        break;
    }
    for (size_t i = 0; i < n_held; i++)
        heap_push(s, s->held[i].b, s->held[i].prio);
    return v;
}

/* LFU with dynamic aging (GDSF with unit cost and size): L + hits since admission. */
static void lfuda_touch(sim *s, uint32_t b, uint32_t depth)
{
    (void)depth;
    s->cnt[b] = s->cached[b] ? s->cnt[b] + 1 : 1;
    heap_push(s, b, s->aging + s->cnt[b]);
}

static const policy pol_lfuda = {"lfuda", heap_reset, lfuda_touch, lfuda_touch, heap_victim};

/* ---- an oracle for calibration, not a policy: LRU that knows whether a block will ever be
 * touched again (but not when), and evicts the blocks that will not first. */
static void owhether_touch(sim *s, uint32_t b, uint32_t depth)
{
    (void)depth;
    heap_push(s, b, (double)s->now - (s->lg->reused[s->touch_at] ? 0.0 : 1e18));
}

static const policy pol_owhether = {"o-whether", heap_reset, owhether_touch, owhether_touch,
                                    heap_victim};

/* ---- candidates ---------------------------------------------------------------------------- */

/* The knob of the policy under test (--param), or its default. */
static double knob(const sim *s, double dflt)
{
    return isnan(s->param) ? dflt : s->param;
}

/* freq2: recency plus a bonus of param * C touches (default 2 C) once a block has been touched
 * by two requests since its admission. */
static void freq2_touch(sim *s, uint32_t b, uint32_t depth)
{
    (void)depth;
    s->cnt[b] = s->cached[b] ? s->cnt[b] + 1 : 1;
    heap_push(s, b, (double)s->now + (s->cnt[b] >= 2 ? knob(s, 2.0) * (double)s->cap : 0.0));
}

static const policy pol_freq2 = {"freq2", heap_reset, freq2_touch, freq2_touch, heap_victim};

/* Learned reuse odds. Each touch of a block is a trial of "will some later request touch it
 * again", in one of 27 classes: the block's earlier touches (0, 1, 2 or more; kept after it
 * is evicted) times the log2 bucket (0 .. 8) of the new blocks of the request touching it
 * (its blocks past the cached prefix: how far it extends the chain). When a block is touched
 * again, the class of its previous touch gets a success. p = (successes + 1) /
 * (trials + 2). */
#define N_CLS 27
static uint64_t cls_trials[N_CLS], cls_reused[N_CLS];

static int bits_of(uint32_t v)
{
    int b = 0;
    for (; v; v >>= 1)
        b++;
    return b;
}

/* Earlier touches of b the policy may know: all of them (unbounded history), or, with a
 * ghost of ghost_mult * C evicted keys, those since b last entered the cache or the ghost. */
static uint32_t known_touches(sim *s, uint32_t b)
{
    if (s->ghost_mult == 0)
        return s->ever[b];
    bool in_ghost = s->ghost[b] != 0 &&
                    s->ghost_in - (s->ghost[b] - 1) <= (uint64_t)(s->ghost_mult * (double)s->cap);
    uint32_t e = s->cached[b] || in_ghost ? s->hist[b] : 0;
    s->hist[b] = e + 1;
    return e;
}

static double learn_p(sim *s, uint32_t b)
{
    int nb = bits_of(s->req_n - s->req_hit);
    uint32_t e = known_touches(s, b);
    int c = (e >= 2 ? 2 : (int)e) * 9 + (nb > 8 ? 8 : nb);
    if (e > 0)
        cls_reused[s->cls[b]]++;
    s->cls[b] = (uint8_t)c;
    cls_trials[c]++;
    return ((double)cls_reused[c] + 1.0) / ((double)cls_trials[c] + 2.0);
}

static void learn_reset(sim *s)
{
    heap_reset(s);
    s->ghost_mult = 0;
    memset(cls_trials, 0, sizeof cls_trials);
    memset(cls_reused, 0, sizeof cls_reused);
}

/* decay: evict the least p exp(-(now - last) / tau), tau = param touches (default 30000).
 * Ranking by it is ranking by last + tau ln p, a key fixed at the touch: O(log n). */
static void decay_touch(sim *s, uint32_t b, uint32_t depth)
{
    (void)depth;
    heap_push(s, b, (double)s->now + knob(s, 30000.0) * log(learn_p(s, b)));
}

static const policy pol_decay = {"decay", learn_reset, decay_touch, decay_touch, heap_victim};

/* cdecay: decay with chain-closed keys. A block's key is raised to its child's in the same
 * request (the touches go from the last block to the first, so the child's key is known),
 * so a parent never leaves before its child: a child is useless without its parent. Without
 * it, decay broke chains (on the synthetic trace a block touched once is likelier to be
 * reused than one touched more, so children outranked their parents) and lost up to 1.9
 * points to LRU; with it no capacity of either trace is a point below LRU. */
static void cdecay_touch(sim *s, uint32_t b, uint32_t depth)
{
    (void)depth;
    double key = (double)s->now + knob(s, 30000.0) * log(learn_p(s, b));
    if (s->touch_at + 1 != s->req_end && key < s->chain_prev)
        key = s->chain_prev;
    s->chain_prev = key;
    heap_push(s, b, key);
}

static const policy pol_cdecay = {"cdecay", learn_reset, cdecay_touch, cdecay_touch, heap_victim};

/* cdecay with a bounded history: a ghost of the last 1 C, 4 C or 16 C (cdecay-g1, -g4,
 * -g16) evicted keys, as an online cache would keep it; a block out of both cache and ghost is
 * a first sight again. */
static uint32_t ghosted_victim(sim *s)
{
    uint32_t v = heap_victim(s);
    if (v != NONE)
        s->ghost[v] = ++s->ghost_in;
    return v;
}

static void g1_reset(sim *s)
{
    learn_reset(s);
    s3_reset(s);
    s->ghost_mult = 1;
}

static void g4_reset(sim *s)
{
    learn_reset(s);
    s3_reset(s);
    s->ghost_mult = 4;
}

static void g16_reset(sim *s)
{
    learn_reset(s);
    s3_reset(s);
    s->ghost_mult = 16;
}

static const policy pol_cdecay_g16 = {"cdecay-g16", g16_reset, cdecay_touch, cdecay_touch,
                                      ghosted_victim};
static const policy pol_cdecay_g1 = {"cdecay-g1", g1_reset, cdecay_touch, cdecay_touch,
                                     ghosted_victim};
static const policy pol_cdecay_g4 = {"cdecay-g4", g4_reset, cdecay_touch, cdecay_touch,
                                     ghosted_victim};

/* cfifo-gK: cdecay-gK in the form the library runs (policy_cdecay.c): one FIFO per class
 * instead of a heap. A block touched joins its class's FIFO stamped with the clock; its key
 * is stamp + tau ln p(class), with p the class's odds as of the request's start (all 27
 * offsets recomputed once per request), so each FIFO is in key order and the victim is the
 * least key among the FIFOs' oldest unpinned blocks. Chain closure: a block whose own key is
 * below its child's (the block touched just before in the request) joins the child's FIFO with
 * the child's stamp, right behind it. */
static double cf_off[N_CLS];
static uint64_t *cf_stamp;
static double *cf_key;
static bool cf_at_touch;
static size_t cf_req = SIZE_MAX;
static double cf_prev_key;
static int cf_prev_list;
static uint64_t cf_prev_stamp;

static void cf_touch(sim *s, uint32_t b, uint32_t depth)
{
    (void)depth;
    if (s->req != cf_req) {
        cf_req = s->req;
        for (int c = 0; c < N_CLS; c++)
            cf_off[c] = knob(s, 30000.0) *
                        log(((double)cls_reused[c] + 1.0) / ((double)cls_trials[c] + 2.0));
    }
    if (s->cached[b])
        list_remove(s, b);
    double pr = learn_p(s, b);
    int l = 3 + s->cls[b];
    uint64_t st = s->now;
    double key = (double)st + (cf_at_touch ? knob(s, 30000.0) * log(pr) : cf_off[s->cls[b]]);
    if (s->touch_at + 1 != s->req_end && key < cf_prev_key) {
        l = cf_prev_list;
        st = cf_prev_stamp;
        key = cf_prev_key;
    }
    cf_prev_key = key;
    cf_prev_list = l;
    cf_prev_stamp = st;
    cf_stamp[b] = st;
    cf_key[b] = key;
    list_push_front(s, l, b);
}

static uint32_t cf_victim(sim *s)
{
    uint32_t v = NONE;
    double vk = 0;
    for (int l = 3; l < 3 + N_CLS; l++) {
        uint32_t b = list_oldest_unpinned(s, l);
        if (b == NONE)
            continue;
        double k = cf_at_touch ? cf_key[b] : (double)cf_stamp[b] + cf_off[l - 3];
        if (v == NONE || k < vk || (k == vk && s->lg->depth[b] > s->lg->depth[v])) {
            v = b;
            vk = k;
        }
    }
    if (v != NONE) {
        list_remove(s, v);
        s->ghost[v] = ++s->ghost_in;
    }
    return v;
}

static const policy pol_cfifo2;
static void cf_reset(sim *s)
{
    g16_reset(s);
    lists_reset(s);
    cf_req = SIZE_MAX;
    if (!cf_stamp)
        cf_stamp = calloc(s->lg->n_blocks + 1, sizeof *cf_stamp);
    if (!cf_key)
        cf_key = calloc(s->lg->n_blocks + 1, sizeof *cf_key);
    cf_at_touch = s->pol == &pol_cfifo2;
    const char *g = getenv("CF_GHOST");
    if (g)
        s->ghost_mult = atof(g);
}

static const policy pol_cfifo = {"cfifo-g16", cf_reset, cf_touch, cf_touch, cf_victim};
static const policy pol_cfifo2 = {"cfifo2-g16", cf_reset, cf_touch, cf_touch, cf_victim};

/* ---- hit density (after LHD: Beckmann, Chen, Cidon, NSDI 2018) -----------------------------
 *
 * Every touch of a block starts a trial in a class (lhd_class: features of the block and the
 * request, LHD_FEAT); the trial ends with a reuse at age x (the block's next touch while it is
 * cached or in the ghost: hits[c][bin(x)]), or is censored at age x when its key leaves the
 * ghost unreused (ends[c][bin(x)]), or is still running (cached or ghost keys, counted by
 * lhd_census at each recompute). Ages are in block touches, in LHD_BPO log-spaced bins per
 * octave. Every LHD_RECOMP touches the density table is rebuilt:
 *
 *   lhdg    Kaplan-Meier: the reuse hazard of bin i is hits[c][i] / trials of c at risk at
 *           bin i (ended or running at an age in bin i or later), pooled with the hazard of
 *           all classes for LHD_W pseudo-trials; with f the reuse distribution and S the
 *           survival it gives, the density of a block of class c at age a (bin i, a its lower
 *           edge) is the best rate over a horizon T (the end of bin j >= i):
 *             max_j  sum_{i..j} f  /  (sum_{i..j} (mid - a) f + (T - a) S(T))
 *           reuses per slot-touch if it is kept until its reuse or T, whichever is first.
 *   lhd-own the published form: hits and evictions of the cache's own blocks at their age,
 *           density = hits beyond a / expected lifetime left beyond a; blind to reuses after
 *           eviction, it learns only what the cache already keeps (dropped).
 *
 * Victims: cached blocks without a cached child (leaves; the set is kept exactly), so a chain
 * is cut from its tail and a parent never leaves before its child; the least dense of
 * LHD_SAMPLE random unpinned leaves (lhdg: 64, as LHD; elhdg: all of them), the least recent
 * among equals. The ghost is a FIFO of the last LHD_GHOST * C evicted keys (default 8), each
 * with its class, last touch and touch count (a cache would keep 16 bytes a key).
 *
 * o-lhdg is a calibration, not a policy: elhdg run once to the end, then again with the
 * table of the whole log (all its trials) kept fixed: what this family could reach if it knew
 * the log's statistics in advance.
 */
#define LHD_NB 128 /* age bins */
#define LHD_NC 256 /* classes at most */

static double lhd_hits[LHD_NC][LHD_NB], lhd_ends[LHD_NC][LHD_NB];
static double lhd_risk[LHD_NC][LHD_NB]; /* trials at risk in each age bin */
static double lhd_hz_all[LHD_NB];       /* the hazard over all classes */
static double lhd_dens[LHD_NC][LHD_NB]; /* the table the victim choice reads */
static double lhd_frozen_dens[LHD_NC][LHD_NB];
static bool lhd_frozen;               /* o-lhdg: the table is lhd_frozen_dens */
static int lhd_own;                   /* lhd-own: learn from the cache's own lifetimes */
static int lhd_bpo;                   /* bins per octave of age */
static size_t lhd_sample;             /* leaves sampled per victim (0: all) */
static double lhd_w;                  /* pseudo-trials of the pooled hazard per class */
static uint64_t lhd_recomp, lhd_next; /* touches between recomputes; the next one */
static uint8_t *lhd_cls;              /* per block: the class of its last touch */
static uint32_t *lhd_lastreq;         /* per block: the request of its last touch */
static uint8_t *lhd_turn;             /* per block: the turn of the request that last touched it */
static uint8_t *lhd_fan;              /* per block: children first seen under it */
static uint32_t *lhd_ncc;             /* per block: cached children */
static uint32_t *lhd_leaves;          /* cached blocks without a cached child */
static uint32_t *lhd_lpos;            /* per block: position in lhd_leaves + 1, or 0 */
static size_t lhd_n_leaves;
static uint32_t *lhd_cset; /* the cached blocks */
static uint32_t *lhd_cpos; /* per block: position in lhd_cset + 1, or 0 */
static size_t lhd_n_cset;
static uint32_t *lhd_ring;   /* the ghost FIFO: evicted blocks */
static uint64_t *lhd_rstamp; /* their ghost stamps */
static size_t lhd_ring_n;
static uint64_t lhd_rng;
static uint32_t lhd_depth;        /* the depth of the block being touched */
static size_t lhd_req = SIZE_MAX; /* the request lhd_rturn and lhd_rgap describe */
static int lhd_rturn, lhd_rgap;   /* its turn, its gap bucket (lhd_request_scan) */
static bool lhd_heads;            /* lhdf: candidates from one list per class */
static int lhd_nc;                /* classes in use: the product of the levels */
static int lhd_nfeat;             /* the class features: names and levels */
static char lhd_fname[8][8];
static int lhd_flev[8];

static double env_or(const char *name, double dflt)
{
    const char *v = getenv(name);
    return v ? atof(v) : dflt;
}

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

static int lhd_bin(uint64_t age)
{
    int i = (int)floor(lhd_bpo * log2((double)age + 1.0));
    return i < LHD_NB ? i : LHD_NB - 1;
}

static double lhd_lo(int i)
{
    return exp2((double)i / lhd_bpo) - 1.0;
}

static double lhd_mid(int i)
{
    return exp2((i + 0.5) / lhd_bpo) - 1.0;
}

static uint64_t lhd_age(const sim *s, uint32_t b)
{
    return s->now - s->last[b];
}

static bool lhd_in_ghost(const sim *s, uint32_t b)
{
    return s->ghost[b] != 0 &&
           s->ghost_in - (s->ghost[b] - 1) <= (uint64_t)(s->ghost_mult * (double)s->cap);
}

static void set_add(uint32_t *set, uint32_t *pos, size_t *n, uint32_t b)
{
    if (!pos[b]) {
        set[(*n)++] = b;
        pos[b] = (uint32_t)*n;
    }
}

static void set_del(uint32_t *set, uint32_t *pos, size_t *n, uint32_t b)
{
    if (pos[b]) {
        uint32_t last = set[--*n];
        set[pos[b] - 1] = last;
        pos[last] = pos[b];
        pos[b] = 0;
    }
}

/* LHD_FEAT: comma-separated features with their levels, e.g. "e3,nb5,last2" (the default):
 *   e     earlier touches known (cached or ghost)     nb    bitlen of the request's new blocks
 *   last  the request's deepest stored block          hit   within the request's hit
 *   dep   bitlen of the depth                         len   bitlen of the request's blocks - 3
 *   og    the block's gap since its last touch (requests, log2 buckets from 64; 0: unknown)
 *   rg    the same for the request's deepest known block      fan   children first seen under it
 *   turn  1 + the turn of the request's deepest known block (a conversation's turn)
 *   or    an oracle, for calibration only: whether the block will be touched again
 * (values past the last level count as the last). e3,nb9 is cdecay's 27 classes. */
static void lhd_parse_feat(void)
{
    const char *f = getenv("LHD_FEAT");
    if (!f)
        f = "e3,nb5,last2";
    lhd_nfeat = 0;
    while (*f && lhd_nfeat < 8) {
        int k = 0;
        while (*f >= 'a' && *f <= 'z' && k < 7)
            lhd_fname[lhd_nfeat][k++] = *f++;
        lhd_fname[lhd_nfeat][k] = 0;
        char *end;
        lhd_flev[lhd_nfeat++] = (int)strtol(f, &end, 10);
        f = *end == ',' ? end + 1 : end;
    }
    lhd_nc = 1;
    for (int i = 0; i < lhd_nfeat; i++)
        lhd_nc = lhd_nc * lhd_flev[i] > LHD_NC ? LHD_NC : lhd_nc * lhd_flev[i];
}

/* The request's turn and gap bucket, from its deepest block with a known history. */
static void lhd_request_scan(sim *s)
{
    const uint32_t *blk;
    uint64_t t;
    uint32_t f;
    rp_opt_request(s->lg->opt, s->req, &blk, &t, &f);
    lhd_req = s->req;
    lhd_rturn = 1;
    lhd_rgap = 0;
    for (size_t i = s->req_n; i-- > 0;) {
        uint32_t b = blk[i];
        if (s->ever[b] > 0 && (s->cached[b] || lhd_in_ghost(s, b))) {
            lhd_rturn = lhd_turn[b] < 255 ? lhd_turn[b] + 1 : 255;
            lhd_rgap = 1 + clampi(bits_of((uint32_t)(s->req - lhd_lastreq[b])) - 6, 0, 30);
            return;
        }
    }
}

static int lhd_class(sim *s, uint32_t b)
{
    uint32_t e = known_touches(s, b);
    if (s->req != lhd_req)
        lhd_request_scan(s);
    lhd_turn[b] = (uint8_t)lhd_rturn;
    uint32_t p = s->lg->parent[b];
    if (e == 0 && p != NONE && lhd_fan[p] < 255)
        lhd_fan[p]++;
    int c = 0;
    for (int i = 0; i < lhd_nfeat; i++) {
        const char *n = lhd_fname[i];
        int v = 0;
        if (!strcmp(n, "e"))
            v = (int)(e > 255 ? 255 : e);
        else if (!strcmp(n, "nb"))
            v = bits_of(s->req_n - s->req_hit);
        else if (!strcmp(n, "last"))
            v = lhd_depth + 1 == s->req_n;
        else if (!strcmp(n, "hit"))
            v = lhd_depth < s->req_hit;
        else if (!strcmp(n, "dep"))
            v = bits_of(lhd_depth);
        else if (!strcmp(n, "len"))
            v = bits_of(s->req_n) - 3;
        else if (!strcmp(n, "og"))
            v = e == 0 ? 0 : 1 + clampi(bits_of((uint32_t)(s->req - lhd_lastreq[b])) - 6, 0, 30);
        else if (!strcmp(n, "rg"))
            v = lhd_rgap;
        else if (!strcmp(n, "fan"))
            v = lhd_fan[b];
        else if (!strcmp(n, "turn"))
            v = lhd_rturn - 1;
        else if (!strcmp(n, "or"))
            v = s->lg->reused[s->touch_at];
        c = c * lhd_flev[i] + clampi(v, 0, lhd_flev[i] - 1);
    }
    return c < LHD_NC ? c : LHD_NC - 1;
}

/* The trials at risk per class and age bin: the ended ones (a reuse or a censoring at age x
 * was at risk in every bin up to x's) and the running ones (cached or ghost keys: at risk up
 * to their current age); and the pooled hazard. O(C + ghost) per recompute. */
static void lhd_census(sim *s)
{
    static double endat[LHD_NC][LHD_NB];
    for (int c = 0; c < LHD_NC; c++)
        for (int i = 0; i < LHD_NB; i++)
            endat[c][i] = lhd_hits[c][i] + lhd_ends[c][i];
    for (size_t k = 0; k < lhd_n_cset; k++) {
        uint32_t b = lhd_cset[k];
        endat[lhd_cls[b]][lhd_bin(lhd_age(s, b))] += 1;
    }
    for (size_t k = 0; k < lhd_ring_n; k++) {
        uint32_t b = lhd_ring[k];
        if (b != NONE && !s->cached[b] && s->ghost[b] == lhd_rstamp[k] && lhd_in_ghost(s, b))
            endat[lhd_cls[b]][lhd_bin(lhd_age(s, b))] += 1;
    }
    double all_h[LHD_NB] = {0}, all_r[LHD_NB] = {0};
    for (int c = 0; c < LHD_NC; c++) {
        double r = 0;
        for (int i = LHD_NB; i-- > 0;) {
            r += endat[c][i];
            lhd_risk[c][i] = r;
            all_r[i] += r;
            all_h[i] += lhd_hits[c][i];
        }
    }
    for (int i = 0; i < LHD_NB; i++)
        lhd_hz_all[i] = all_r[i] > 0 ? all_h[i] / all_r[i] : 0;
}

/* Rebuild the density table from the histograms (see the section's opening comment). */
static void lhd_recompute(void)
{
    for (int c = 0; c < lhd_nc; c++) {
        double *H = lhd_hits[c], *E = lhd_ends[c];
        if (lhd_own) {
            double sh = 0, sn = 0, sm = 0;
            for (int i = LHD_NB; i-- > 0;) {
                sh += H[i];
                sn += H[i] + E[i];
                sm += lhd_mid(i) * (H[i] + E[i]);
                double life = sm - lhd_lo(i) * sn;
                lhd_dens[c][i] = life > 0 ? (sh + 1e-3) / (life + 1.0) : 0;
            }
            continue;
        }
        double surv[LHD_NB + 1], f[LHD_NB];
        surv[0] = 1;
        for (int i = 0; i < LHD_NB; i++) {
            double h = (H[i] + lhd_w * lhd_hz_all[i]) / (lhd_risk[c][i] + lhd_w);
            f[i] = surv[i] * (h > 1 ? 1 : h);
            surv[i + 1] = surv[i] - f[i];
        }
        for (int i = 0; i < LHD_NB; i++) {
            double a = lhd_lo(i), hits = 0, cost = 0, best = 0;
            for (int j = i; j < LHD_NB; j++) {
                hits += f[j];
                cost += (lhd_mid(j) - a) * f[j];
                double r = hits / (cost + (lhd_lo(j + 1) - a) * surv[j + 1] + 1e-300);
                if (r > best)
                    best = r;
            }
            lhd_dens[c][i] = surv[i] > 0 ? best : 0;
        }
    }
}

static void lhd_maybe_recompute(sim *s)
{
    if (lhd_frozen) {
        memcpy(lhd_dens, lhd_frozen_dens, sizeof lhd_dens);
        return;
    }
    if (s->now < lhd_next)
        return;
    lhd_next = s->now + lhd_recomp;
    if (!lhd_own)
        lhd_census(s);
    lhd_recompute();
}

static void lhd_touch(sim *s, uint32_t b, uint32_t depth)
{
    lhd_depth = depth;
    bool was = s->cached[b];
    if (s->ever[b] > 0 && (was || (!lhd_own && lhd_in_ghost(s, b))))
        lhd_hits[lhd_cls[b]][lhd_bin(lhd_age(s, b))] += 1;
    if (lhd_heads && was)
        list_remove(s, b);
    lhd_cls[b] = (uint8_t)lhd_class(s, b);
    lhd_lastreq[b] = (uint32_t)s->req;
    if (lhd_heads)
        list_push_front(s, lhd_cls[b], b);
    if (!was) {
        uint32_t p = s->lg->parent[b];
        if (p != NONE && lhd_ncc[p]++ == 0)
            set_del(lhd_leaves, lhd_lpos, &lhd_n_leaves, p);
        if (lhd_ncc[b] == 0)
            set_add(lhd_leaves, lhd_lpos, &lhd_n_leaves, b);
        set_add(lhd_cset, lhd_cpos, &lhd_n_cset, b);
    }
    lhd_maybe_recompute(s);
}

static uint64_t lhd_rand(void)
{
    lhd_rng ^= lhd_rng << 13;
    lhd_rng ^= lhd_rng >> 7;
    lhd_rng ^= lhd_rng << 17;
    return lhd_rng;
}

static uint32_t lhd_victim(sim *s)
{
    uint32_t v = NONE;
    double vd = 0;
    if (lhd_heads) {
        /* lhdf: the least recent unpinned leaf of each class's list (at most 16 steps from
         * its tail), the least dense of them */
        for (int l = 0; l < lhd_nc; l++) {
            uint32_t b = s->tail[l];
            for (int k = 0; b != NONE && k < 16 && (is_pinned(s, b) || lhd_ncc[b]); k++)
                b = s->prev[b];
            if (b == NONE || is_pinned(s, b) || lhd_ncc[b])
                continue;
            double d = lhd_dens[lhd_cls[b]][lhd_bin(lhd_age(s, b))];
            if (v == NONE || d < vd || (d == vd && s->last[b] < s->last[v])) {
                v = b;
                vd = d;
            }
        }
    }
    bool all = lhd_sample == 0 || lhd_sample >= lhd_n_leaves;
    size_t n = all ? lhd_n_leaves : lhd_sample;
    /* all leaves if every one drawn is pinned */
    for (int pass = lhd_heads ? 1 : 0; pass < 2 && v == NONE; pass++) {
        for (size_t k = 0; k < n; k++) {
            uint32_t b = all ? lhd_leaves[k] : lhd_leaves[lhd_rand() % lhd_n_leaves];
            if (is_pinned(s, b))
                continue;
            double d = lhd_dens[lhd_cls[b]][lhd_bin(lhd_age(s, b))];
            if (v == NONE || d < vd || (d == vd && s->last[b] < s->last[v])) {
                v = b;
                vd = d;
            }
        }
        all = true;
        n = lhd_n_leaves;
    }
    if (v == NONE)
        return NONE;
    set_del(lhd_leaves, lhd_lpos, &lhd_n_leaves, v);
    set_del(lhd_cset, lhd_cpos, &lhd_n_cset, v);
    if (lhd_heads)
        list_remove(s, v);
    uint32_t p = s->lg->parent[v];
    if (p != NONE && --lhd_ncc[p] == 0 && s->cached[p])
        set_add(lhd_leaves, lhd_lpos, &lhd_n_leaves, p);
    if (lhd_own)
        lhd_ends[lhd_cls[v]][lhd_bin(lhd_age(s, v))] += 1;
    /* the ghost: a key leaving it unreused censors its trial */
    s->ghost[v] = ++s->ghost_in;
    if (lhd_ring_n) {
        size_t at = s->ghost_in % lhd_ring_n;
        uint32_t o = lhd_ring[at];
        if (o != NONE && !lhd_own && !s->cached[o] && s->ghost[o] == lhd_rstamp[at])
            lhd_ends[lhd_cls[o]][lhd_bin(lhd_age(s, o))] += 1;
        lhd_ring[at] = v;
        lhd_rstamp[at] = s->ghost_in;
    }
    return v;
}

static void *lhd_alloc(void *p, size_t n, size_t size)
{
    free(p);
    p = calloc(n, size);
    if (!p) {
        fprintf(stderr, "bench_policies: out of memory\n");
        exit(1);
    }
    return p;
}

static const policy pol_lhd_own, pol_elhdg, pol_olhdg;
static void lhd_reset(sim *s)
{
    g16_reset(s);
    size_t nb = s->lg->n_blocks + 1;
    lhd_cls = lhd_alloc(lhd_cls, nb, 1);
    lhd_lastreq = lhd_alloc(lhd_lastreq, nb, sizeof *lhd_lastreq);
    lhd_turn = lhd_alloc(lhd_turn, nb, 1);
    lhd_fan = lhd_alloc(lhd_fan, nb, 1);
    lhd_ncc = lhd_alloc(lhd_ncc, nb, sizeof *lhd_ncc);
    lhd_leaves = lhd_alloc(lhd_leaves, nb, sizeof *lhd_leaves);
    lhd_lpos = lhd_alloc(lhd_lpos, nb, sizeof *lhd_lpos);
    lhd_cset = lhd_alloc(lhd_cset, nb, sizeof *lhd_cset);
    lhd_cpos = lhd_alloc(lhd_cpos, nb, sizeof *lhd_cpos);
    lhd_n_leaves = lhd_n_cset = 0;
    memset(lhd_hits, 0, sizeof lhd_hits);
    memset(lhd_ends, 0, sizeof lhd_ends);
    memset(lhd_risk, 0, sizeof lhd_risk);
    memset(lhd_dens, 0, sizeof lhd_dens);
    lhd_own = s->pol == &pol_lhd_own;
    lhd_frozen = s->pol == &pol_olhdg;
    lhd_bpo = (int)env_or("LHD_BPO", 4);
    lhd_sample = s->pol == &pol_elhdg || lhd_frozen ? 0 : (size_t)env_or("LHD_SAMPLE", 64);
    lhd_w = env_or("LHD_W", 10);
    lhd_recomp = (uint64_t)env_or("LHD_RECOMP", 1000);
    lhd_parse_feat();
    lhd_heads = env_or("LHD_HEADS", 0) != 0 && lhd_nc <= 32;
    lists_reset(s);
    s->ghost_mult = env_or("LHD_GHOST", 8);
    lhd_next = 0;
    lhd_req = SIZE_MAX;
    lhd_rng = 0x9e3779b97f4a7c15ull * (uint64_t)env_or("LHD_SEED", 1);
    lhd_ring_n = (size_t)(s->ghost_mult * (double)s->cap);
    lhd_ring = lhd_alloc(lhd_ring, lhd_ring_n + 1, sizeof *lhd_ring);
    lhd_rstamp = lhd_alloc(lhd_rstamp, lhd_ring_n + 1, sizeof *lhd_rstamp);
    for (size_t i = 0; i <= lhd_ring_n; i++)
        lhd_ring[i] = NONE;
}

static const policy pol_lhd_own = {"lhd-own", lhd_reset, lhd_touch, lhd_touch, lhd_victim};
static const policy pol_lhdg = {"lhdg", lhd_reset, lhd_touch, lhd_touch, lhd_victim};
static const policy pol_elhdg = {"elhdg", lhd_reset, lhd_touch, lhd_touch, lhd_victim};
static const policy pol_olhdg = {"o-lhdg", lhd_reset, lhd_touch, lhd_touch, lhd_victim};

/* o-lhdg: an elhdg run to the end, whose table (the whole log's trials) is then kept fixed. */
static uint64_t run_policy(sim *s, const policy *pol, uint64_t cap);
static void olhdg_learn(sim *s, uint64_t cap)
{
    run_policy(s, &pol_elhdg, cap);
    lhd_census(s);
    lhd_recompute();
    memcpy(lhd_frozen_dens, lhd_dens, sizeof lhd_dens);
}

/* ---- driver -------------------------------------------------------------------------------- */

/* Replay the log under policy pol at capacity cap; returns the hit tokens. */
static uint64_t run_policy(sim *s, const policy *pol, uint64_t cap)
{
    const lab_log *lg = s->lg;
    s->pol = pol;
    s->cap = cap;
    s->n_cached = 0;
    s->now = 0;
    memset(s->cached, 0, lg->n_blocks);
    memset(s->pin, 0, lg->n_blocks * sizeof *s->pin);
    memset(s->cnt, 0, lg->n_blocks * sizeof *s->cnt);
    memset(s->ever, 0, lg->n_blocks * sizeof *s->ever);
    memset(s->last, 0, lg->n_blocks * sizeof *s->last);
    memset(s->hist, 0, lg->n_blocks * sizeof *s->hist);
    pol->reset(s);
    uint64_t hit_tokens = 0;
    size_t n_req = rp_opt_n_requests(lg->opt);
    const uint32_t *first;
    uint64_t t0;
    uint32_t f0;
    rp_opt_request(lg->opt, 0, &first, &t0, &f0);
    for (size_t r = 0; r < n_req; r++) {
        const uint32_t *blk;
        uint64_t n_tokens;
        uint32_t n_full;
        size_t n_touch = rp_opt_request(lg->opt, r, &blk, &n_tokens, &n_full);
        size_t n = n_touch < cap ? n_touch : (size_t)cap;
        s->req = r;
        size_t base = (size_t)(blk - first);
        s->req_end = base + n;

        /* Step 1: the hit. */
        size_t h = 0, nf = n_full < n ? n_full : n;
        while (h < nf && s->cached[blk[h]])
            h++;
        uint64_t lim = (n_tokens - 1) / lg->bs;
        hit_tokens += (h < lim ? h : lim) * lg->bs;
        s->req_hit = (uint32_t)h;
        s->req_n = (uint32_t)n;

        /* Step 2: touch from the last block to the first, pinned. */
        for (size_t i = n; i-- > 0;) {
            uint32_t b = blk[i];
            s->touch_at = base + i;
            s->now++;
            s->pin[b] = (uint32_t)r + 1;
            if (s->cached[b]) {
                pol->hit(s, b, (uint32_t)i);
            } else {
                pol->insert(s, b, (uint32_t)i);
                s->cached[b] = 1;
                s->n_cached++;
            }
            s->ever[b]++;
            s->last[b] = s->now;
        }

        /* Step 3: evict down to the capacity. */
        while (s->n_cached > cap) {
            uint32_t v = pol->victim(s);
            if (v == NONE || !s->cached[v] || is_pinned(s, v)) {
                fprintf(stderr, "bench_policies: %s chose no valid victim\n", pol->name);
                exit(3);
            }
            s->cached[v] = 0;
            s->n_cached--;
        }
    }
    return hit_tokens;
}

static int load_log(const char *path, lab_log *lg)
{
    char err[512];
    log_options lo;
    log_options_init(&lo);
    log_reader *rd;
    if (log_open(path, &lo, &rd, err, sizeof err) != 0) {
        fprintf(stderr, "bench_policies: %s\n", err);
        return 1;
    }
    memset(lg, 0, sizeof *lg);
    log_record rec;
    int rc;
    size_t n_req = 0;
    while ((rc = log_next(rd, &rec)) != LOG_END) {
        if (rc != LOG_RECORD) {
            fprintf(stderr, "bench_policies: %s\n", log_error(rd));
            return 1;
        }
        if (!lg->sim) {
            lg->bs = rec.format == LOG_MOONCAKE ? 512 : 16;
            rp_sim_config sc = {lg->bs, 0, 0, NULL};
            lg->sim = rp_sim_new(&sc, err, sizeof err);
            lg->opt = rp_opt_new(lg->bs);
            if (!lg->sim || !lg->opt)
                return 1;
        }
        rp_request q;
        memset(&q, 0, sizeof q);
        kvp_namespace_init(&q.ns);
        q.ns.model = (kvp_field){rec.model, rec.model_len};
        q.ns.adapter = (kvp_field){rec.adapter, rec.adapter_len};
        q.ns.tenant = (kvp_field){rec.tenant, rec.tenant_len};
        q.ns.salt = (kvp_field){rec.cache_salt, rec.cache_salt_len};
        q.line_no = rec.line_no;
        if (rec.hash_ids) {
            q.hash_ids = rec.hash_ids;
            q.n_hash_ids = rec.n_hash_ids;
            q.input_length = rec.input_length;
        } else {
            q.tokens = rec.tokens;
            q.n_tokens = rec.n_tokens;
        }
        if (rp_sim_add(lg->sim, &q, err, sizeof err) != RP_OK) {
            fprintf(stderr, "bench_policies: %s:%llu: %s\n", path, (unsigned long long)rec.line_no,
                    err);
            return 1;
        }
        const size_t *blocks;
        size_t n = rp_sim_last_blocks(lg->sim, &blocks);
        uint64_t n_prompt = rec.hash_ids ? rec.input_length : rec.n_tokens;
        if (rp_opt_add(lg->opt, n_prompt, (uint32_t)(n_prompt / lg->bs), blocks, n) != 0)

            return 1;
        lg->n_tok += n_prompt;
        n_req++;
    }
    log_close(rd);
    if (!lg->sim)
        return 1;
    lg->n_blocks = rp_opt_n_blocks(lg->opt);
    lg->depth = calloc(lg->n_blocks + 1, sizeof *lg->depth);
    lg->parent = calloc(lg->n_blocks + 1, sizeof *lg->parent);
    if (!lg->depth || !lg->parent)
        return 1;
    const uint32_t *first;
    uint64_t t0;
    uint32_t f0;
    rp_opt_request(lg->opt, 0, &first, &t0, &f0);
    uint8_t *later = calloc(lg->n_blocks + 1, 1);
    size_t n_touch_all = 0;
    for (size_t r = 0; r < n_req; r++) {
        const uint32_t *blk;
        uint64_t t;
        uint32_t f;
        size_t n = rp_opt_request(lg->opt, r, &blk, &t, &f);
        n_touch_all = (size_t)(blk - first) + n;
        for (size_t i = 0; i < n; i++) {
            lg->depth[blk[i]] = (uint32_t)i;
            lg->parent[blk[i]] = i ? blk[i - 1] : NONE;
        }
    }
    lg->reused = calloc(n_touch_all + 1, 1);
    if (!later || !lg->reused)
        return 1;
    for (size_t a = n_touch_all; a-- > 0;) {
        lg->reused[a] = later[first[a]];
        later[first[a]] = 1;
    }
    free(later);
    return 0;
}

static const policy *all_policies[] = {
    &pol_lru,    &pol_slru,     &pol_s3fifo,    &pol_lfuda,     &pol_freq2,      &pol_h2q,
    &pol_decay,  &pol_cdecay,   &pol_cdecay_g1, &pol_cdecay_g4, &pol_cdecay_g16, &pol_cfifo,
    &pol_cfifo2, &pol_owhether, &pol_lhd_own,   &pol_lhdg,      &pol_elhdg,      &pol_olhdg};

/* 1 if NAME is one of the comma-separated names of LIST (exactly), else 0. */
static int in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n))
            return 1;
        if (!e)
            break;
        p = e + 1;
    }
    return 0;
}

/* Every name of LIST must be a policy of all_policies or "min"; 0, or -1 with a message. */
static int check_policy_list(const char *list, const policy *const *pols, size_t n_pol)
{
    for (const char *p = list;;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int known = len == 3 && !strncmp(p, "min", 3);
        for (size_t i = 0; i < n_pol && !known; i++)
            known = strlen(pols[i]->name) == len && !strncmp(p, pols[i]->name, len);
        if (!known) {
            fprintf(stderr, "bench_policies: --policies: unknown policy '%.*s'; known:", (int)len,
                    p);
            for (size_t i = 0; i < n_pol; i++)
                fprintf(stderr, " %s", pols[i]->name);
            fprintf(stderr, " min\n");
            return -1;
        }
        if (!e)
            return 0;
        p = e + 1;
    }
}

/* Parses "A,B,..." into caps (each a positive integer, at most MAX_CAPS); 0, or -1 with a
 * message. */
static int parse_capacities(const char *text, uint64_t *caps, size_t *n_caps)
{
    *n_caps = 0;
    for (const char *p = text;;) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || *p == '-' || errno || v == 0 || (*end != ',' && *end != '\0')) {
            fprintf(stderr,
                    "bench_policies: --capacities: '%s' is not a list of positive "
                    "integers (A,B,...)\n",
                    text);
            return -1;
        }
        if (*n_caps == MAX_CAPS) {
            fprintf(stderr, "bench_policies: --capacities: at most %d capacities\n", MAX_CAPS);
            return -1;
        }
        caps[(*n_caps)++] = v;
        if (*end == '\0')
            return 0;
        p = end + 1;
    }
}

int main(int argc, char **argv)
{
    uint64_t caps[MAX_CAPS];
    size_t n_caps = 0;
    const char *pols = NULL, *path = NULL;
    bool csv = false;
    double param = NAN;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--capacities") && i + 1 < argc) {
            if (parse_capacities(argv[++i], caps, &n_caps) != 0)
                return 2;
        } else if (!strcmp(argv[i], "--policies") && i + 1 < argc) {
            pols = argv[++i];
        } else if (!strcmp(argv[i], "--param") && i + 1 < argc) {
            param = strtod(argv[++i], NULL);
        } else if (!strcmp(argv[i], "--csv")) {
            csv = true;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "usage: bench_policies [--capacities A,B,...] [--policies P,...] "
                            "[--param X] [--csv] LOG\n");
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        fprintf(stderr, "bench_policies: a log is needed (a path argument)\n");
        return 2;
    }
    if (pols &&
        check_policy_list(pols, all_policies, sizeof all_policies / sizeof all_policies[0]) != 0)
        return 2;
    if (n_caps == 0) {
        const uint64_t d[] = {500, 1000, 2000, 5000, 10000, 20000, 50000};
        n_caps = sizeof d / sizeof d[0];
        memcpy(caps, d, sizeof d);
    }
    lab_log lg;
    if (load_log(path, &lg) != 0)
        return 1;
    size_t nb = lg.n_blocks + 1;
    sim s;
    memset(&s, 0, sizeof s);
    s.lg = &lg;
    s.param = param;
    s.cached = calloc(nb, 1);
    s.pin = calloc(nb, sizeof *s.pin);
    s.prev = calloc(nb, sizeof *s.prev);
    s.next = calloc(nb, sizeof *s.next);
    s.list = calloc(nb, 1);
    s.freq = calloc(nb, 1);
    s.ghost = calloc(nb, sizeof *s.ghost);
    s.ver = calloc(nb, sizeof *s.ver);
    s.prio = calloc(nb, sizeof *s.prio);
    s.cnt = calloc(nb, sizeof *s.cnt);
    s.ever = calloc(nb, sizeof *s.ever);
    s.last = calloc(nb, sizeof *s.last);
    s.cls = calloc(nb, 1);
    s.hist = calloc(nb, sizeof *s.hist);
    if (!s.cached || !s.pin || !s.prev || !s.next || !s.list || !s.freq || !s.ghost || !s.ver ||
        !s.prio || !s.cnt || !s.ever || !s.last || !s.cls || !s.hist) {
        fprintf(stderr, "bench_policies: out of memory\n");
        return 1;
    }
    size_t n_pol = sizeof all_policies / sizeof all_policies[0];
    printf("%s: %zu requests, %llu prompt tokens, %zu distinct blocks of %u tokens\n", path,
           rp_opt_n_requests(lg.opt), (unsigned long long)lg.n_tok, lg.n_blocks, lg.bs);
    if (csv)
        printf("capacity,policy,hit_tokens,token_hit_rate,gap_closed\n");
    else
        printf("%10s %-10s %12s %9s %11s\n", "capacity", "policy", "hit tokens", "hit rate",
               "gap closed");
    for (size_t c = 0; c < n_caps; c++) {
        rp_metrics m;
        rp_opt_result o;
        if (rp_sim_eval(lg.sim, caps[c], &m, NULL) != RP_OK ||
            rp_opt_eval(lg.opt, caps[c], RP_OPT_USEFUL, &o) != 0)
            return 1;
        uint64_t lru = run_policy(&s, &pol_lru, caps[c]);
        if (lru != m.n_hit_tokens) {
            fprintf(stderr,
                    "bench_policies: the lab's LRU skips %llu tokens at %llu, the replay "
                    "engine %llu\n",
                    (unsigned long long)lru, (unsigned long long)caps[c],
                    (unsigned long long)m.n_hit_tokens);
            return 3;
        }
        double gap = (double)o.n_hit_tokens - (double)lru;
        for (size_t p = 0; p <= n_pol; p++) {
            const policy *pol = p < n_pol ? all_policies[p] : NULL;
            const char *name = pol ? pol->name : "min";
            if (pols && !in_list(pols, name) && strcmp(name, "lru") != 0 && strcmp(name, "min"))
                continue;
            if (pol == &pol_olhdg)
                olhdg_learn(&s, caps[c]);
            uint64_t hit =
                pol ? (pol == &pol_lru ? lru : run_policy(&s, pol, caps[c])) : o.n_hit_tokens;
            double rate = (double)hit / (double)lg.n_tok;
            double closed = gap > 0 ? ((double)hit - (double)lru) / gap : 0.0;
            if (csv)
                printf("%llu,%s,%llu,%.6f,%.4f\n", (unsigned long long)caps[c], name,
                       (unsigned long long)hit, rate, closed);
            else
                printf("%10llu %-10s %12llu %8.2f%% %10.1f%%\n", (unsigned long long)caps[c], name,
                       (unsigned long long)hit, 100 * rate, 100 * closed);
        }
        fflush(stdout);
    }
    return 0;
}
