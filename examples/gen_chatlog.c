/*
 * gen_chatlog.c - a deterministic generator of an example request log for `kvprefix replay`.
 *
 *   gen_chatlog [--seed N] [--requests N] [--format tokens|openai] [--variants] [-o FILE]
 *
 * The scripts run it to create the bundled example (the log is generated, not checked in).
 * Output is JSON Lines, one request per line, in time order with strictly increasing
 * "timestamp" (seconds from the start of the trace, three decimals). The same seed, request
 * count and format always give the same bytes: a fixed PRNG (splitmix64, default seed
 * 20261129) draws everything, and what is written is integers (the clock is kept in whole
 * milliseconds; floating point, libm's log for the exponential gaps included, only shapes
 * draws before they are rounded to integers).
 *
 * Text. A vocabulary of 553 English words (words[] below) plus digits and punctuation
 * (symbols[]); a text is a sequence of pieces, each a vocabulary index with a flag saying
 * whether it is glued to the previous piece (no space in front of it). The token id of a
 * piece is its index + 1000, so words are ids 1000..1552 and symbols 1553..1569. The clock
 * is written as "Current time: 2026-11-29 10:31:02" (a wall clock starting at 2026-11-29
 * 10:00:00), one token per word, digit and punctuation mark.
 *
 * The token format (default) renders a request with a fixed chat template of five special
 * token ids below 1000:
 *
 *   tokens         1 (begin of text), then for each message: 2 (system) | 3 (user) |
 *                  4 (assistant), its text, 5 (end of turn); then 4 (the generation prompt)
 *   output_tokens  the reply's text, then 5
 *
 *   {"timestamp":12.345,"model":"llama-3.1-8b","tenant":"acme",
 *    "adapter":"acme-support-lora","tokens":[...],"output_tokens":[...]}
 *
 * so turn k+1 of a conversation is exactly turn k's tokens + turn k's output_tokens + the
 * new user message (3, text, 5, 4). "adapter" appears only on requests that use it. The
 * openai format writes the same requests as /v1/chat/completions bodies with the text
 * joined by spaces (the vocabulary needs no JSON escapes):
 *
 *   {"model":"llama-3.1-8b","user":"acme","adapter":"acme-support-lora",
 *    "messages":[{"role":"system","content":"..."},{"role":"user","content":"..."},...],
 *    "max_tokens":97,"timestamp":12.345}
 *
 * with "adapter" a kvprefix extension (see src/cli/openai.h) rather than vLLM's habit of
 * naming the LoRA in "model", so both formats have the same namespaces; max_tokens is the
 * length of the token format's output_tokens.
 *
 * Scenario. Conversations start as a Poisson process (a mean gap of 9 s) and run 1-6 turns
 * (30/22/17/13/10/8 %) with 4 s plus an exponential think time (mean 25 s) plus the reply's
 * generation time between turns, so conversations of all tenants interleave in time. Each
 * tenant has one system message shared by all its requests: a system prompt followed by
 * tool definitions written as text (as the Qwen2.5 and Llama-3.1 templates put tools in the
 * system turn). User messages are 20-150 words, replies 30-160 words.
 *
 *   kind (share of conversations)  namespace                      system message
 *   acme chat (34 %)               llama-3.1-8b / acme, 40 % with  prompt 650 words + tools
 *                                  adapter acme-support-lora       150
 *   globex chat (18 %)             qwen2.5-7b / globex             prompt 450 + tools 150
 *   globex document QA (16 %)      qwen2.5-7b / globex             the same
 *   initech chat (24 %)            llama-3.1-8b / initech          clock, prompt 350, tools 150
 *   one-off (8 %)                  any tenant, either model        none
 *
 *   - globex appends "Current time: ..." to each user message, after the text: its prompts
 *     differ only at the end, and turn k+1 still extends turn k (the history keeps the
 *     clock of each earlier turn as sent).
 *   - initech starts its system prompt with "Current time: ..." and rewrites it on every
 *     request, turns of one conversation included: its requests share nothing past the
 *     clock (some 20 tokens in: the template tokens, the date and part of the time), so
 *     with 16-token blocks they share at most one block, and every turn recomputes the
 *     whole conversation. `kvprefix replay --diagnose` should point at it.
 *   - globex document QA: one user turn of "please read the following document and answer
 *     the question ." + a 1500-word document (the same one for every such request) +
 *     "Question: " + 8-30 words + "?" and the clock; about 8 % of requests, all sharing
 *     the system message and the document (~2500 tokens).
 *   - one-off requests: a single user message of 40-400 random words, no system message,
 *     sharing nothing past the first two template tokens.
 *
 * Expected sharing (token format, kvprefix's default 16-token blocks): acme's system message
 * is ~970 tokens and globex's ~750, shared by all requests of the tenant within one
 * namespace (acme with and without the adapter never share: the adapter is part of the
 * key); globex's document QA requests share ~2500 tokens up to the question; a turn k+1 of
 * acme or globex reuses all of turn k (and its reply, when output tokens are cached);
 * initech reuses at most the first block, and one-offs nothing. Measured on the default
 * run (seed 20261129, 600 requests over 38 minutes: 268 acme of which 83 with the adapter,
 * 191 globex of which 46 document QA, 141 initech, 23 one-offs; 4.2 MB as tokens, 3.6 MB as
 * openai) with an unbounded cache caching prompts only: 71 % of prompt tokens hit, acme
 * 85 %, globex 88 %, initech 3 %.
 *
 * Variants (--variants, openai format only; without it the output is the same bytes as
 * before the option existed): acme's requests also carry a "tools" array of four function
 * definitions (TOOLS below), and each conversation draws, from a generator of its own
 * (splitmix64 of the seed and the conversation's start, so the main draws are untouched),
 * one of: 20 % list the tools in another order (rotated by one, as a client that builds the
 * list from a hash map might), 20 % write the system message with two spaces after its
 * 20th word instead of one (an edit nobody sees), 60 % neither. `kvprefix replay
 * --diagnose` with a real tokenizer and template names both (docs/replay.md).
 *
 * Exit status: 0, 1 on an output or memory error, 2 on a usage error ("gen_chatlog: what is
 * wrong" on stderr).
 *
 * Cost: time linear in the output; memory for the histories of the conversations in
 * progress (a few dozen at a time) and the shared texts, well under 10 MB.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The vocabulary: common English words, then some of a support desk's. */
static const char *const words[] = {

    "the",          "of",           "and",      "to",       "a",         "in",
    "is",           "it",           "you",      "that",     "he",        "was",
    "for",          "on",           "are",      "with",     "as",        "i",
    "his",          "they",         "be",       "at",       "one",       "have",
    "this",         "from",         "or",       "had",      "by",        "not",
    "word",         "but",          "what",     "some",     "we",        "can",
    "out",          "other",        "were",     "all",      "there",     "when",
    "up",           "use",          "your",     "how",      "said",      "an",
    "each",         "she",          "which",    "do",       "their",     "time",
    "if",           "will",         "way",      "about",    "many",      "then",
    "them",         "write",        "would",    "like",     "so",        "these",
    "her",          "long",         "make",     "thing",    "see",       "him",
    "two",          "has",          "look",     "more",     "day",       "could",
    "go",           "come",         "did",      "number",   "sound",     "no",
    "most",         "people",       "my",       "over",     "know",      "water",
    "than",         "call",         "first",    "who",      "may",       "down",
    "side",         "been",         "now",      "find",     "any",       "new",
    "work",         "part",         "take",     "get",      "place",     "made",
    "live",         "where",        "after",    "back",     "little",    "only",
    "round",        "man",          "year",     "came",     "show",      "every",
    "good",         "me",           "give",     "our",      "under",     "name",
    "very",         "through",      "just",     "form",     "sentence",  "great",
    "think",        "say",          "help",     "low",      "line",      "differ",
    "turn",         "cause",        "much",     "mean",     "before",    "move",
    "right",        "boy",          "old",      "too",      "same",      "tell",
    "does",         "set",          "three",    "want",     "air",       "well",
    "also",         "play",         "small",    "end",      "put",       "home",
    "read",         "hand",         "port",     "large",    "spell",     "add",
    "even",         "land",         "here",     "must",     "big",       "high",
    "such",         "follow",       "act",      "why",      "ask",       "men",
    "change",       "went",         "light",    "kind",     "off",       "need",
    "house",        "picture",      "try",      "us",       "again",     "animal",
    "point",        "mother",       "world",    "near",     "build",     "self",
    "earth",        "father",       "head",     "stand",    "own",       "page",
    "should",       "country",      "found",    "answer",   "school",    "grow",
    "study",        "still",        "learn",    "plant",    "cover",     "food",
    "sun",          "four",         "between",  "state",    "keep",      "eye",
    "never",        "last",         "let",      "thought",  "city",      "tree",
    "cross",        "farm",         "hard",     "start",    "might",     "story",
    "saw",          "far",          "sea",      "draw",     "left",      "late",
    "run",          "while",        "press",    "close",    "night",     "real",
    "life",         "few",          "north",    "open",     "seem",      "together",
    "next",         "white",        "children", "begin",    "got",       "walk",
    "example",      "ease",         "paper",    "group",    "always",    "music",
    "those",        "both",         "mark",     "often",    "letter",    "until",
    "mile",         "river",        "car",      "feet",     "care",      "second",
    "book",         "carry",        "took",     "science",  "eat",       "room",
    "friend",       "began",        "idea",     "fish",     "mountain",  "stop",
    "once",         "base",         "hear",     "horse",    "cut",       "sure",
    "watch",        "color",        "face",     "wood",     "main",      "enough",
    "plain",        "girl",         "usual",    "young",    "ready",     "above",
    "ever",         "red",          "list",     "though",   "feel",      "talk",
    "bird",         "soon",         "body",     "dog",      "family",    "direct",
    "pose",         "leave",        "song",     "measure",  "door",      "product",
    "black",        "short",        "numeral",  "class",    "wind",      "question",
    "happen",       "complete",     "ship",     "area",     "half",      "rock",
    "order",        "fire",         "south",    "problem",  "piece",     "told",
    "knew",         "pass",         "since",    "top",      "whole",     "king",
    "space",        "heard",        "best",     "hour",     "better",    "true",
    "during",       "hundred",      "five",     "remember", "step",      "early",
    "hold",         "west",         "ground",   "interest", "reach",     "fast",
    "verb",         "sing",         "listen",   "six",      "table",     "travel",
    "less",         "morning",      "ten",      "simple",   "several",   "vowel",
    "toward",       "war",          "lay",      "against",  "pattern",   "slow",
    "center",       "love",         "person",   "money",    "serve",     "appear",
    "road",         "map",          "rain",     "rule",     "govern",    "pull",
    "cold",         "notice",       "voice",    "unit",     "power",     "town",
    "fine",         "certain",      "fly",      "fall",     "lead",      "cry",
    "dark",         "machine",      "note",     "wait",     "plan",      "figure",
    "star",         "box",          "noun",     "field",    "rest",      "correct",
    "able",         "pound",        "done",     "beauty",   "drive",     "stood",
    "contain",      "front",        "teach",    "week",     "final",     "gave",
    "green",        "quick",        "develop",  "ocean",    "warm",      "free",
    "minute",       "strong",       "special",  "mind",     "behind",    "clear",
    "tail",         "produce",      "fact",     "street",   "inch",      "multiply",
    "nothing",      "course",       "stay",     "wheel",    "full",      "force",
    "blue",         "object",       "decide",   "surface",  "deep",      "moon",
    "island",       "foot",         "system",   "busy",     "test",      "record",
    "boat",         "common",       "gold",     "possible", "plane",     "stead",
    "dry",          "wonder",       "laugh",    "thousand", "ago",       "ran",
    "check",        "game",         "shape",    "equate",   "miss",      "brought",
    "heat",         "snow",         "tire",     "bring",    "yes",       "distant",
    "fill",         "east",         "paint",    "language", "among",     "account",
    "invoice",      "customer",     "support",  "refund",   "shipping",  "delivery",
    "password",     "login",        "error",    "server",   "request",   "response",
    "document",     "report",       "summary",  "policy",   "contract",  "assistant",
    "helpful",      "user",         "tool",     "function", "parameter", "query",
    "search",       "database",     "ticket",   "priority", "status",    "update",
    "cancel",       "subscription", "payment",  "billing",  "address",   "email",
    "phone",        "manager",      "team",     "project",  "deadline",  "meeting",
    "schedule",     "review",       "approve",  "budget",   "quarter",   "revenue",
    "growth",       "market",       "sales",    "please",   "following", "tools",
    "conversation",
};
#define N_WORDS (sizeof words / sizeof words[0])
_Static_assert(N_WORDS == 553, "the opening comment gives the vocabulary's size and ids");

/* Digits and punctuation, after the words in the vocabulary. */
static const char *const symbols[] = {"0", "1", "2", "3", "4", "5", "6",       "7",       "8",
                                      "9", ":", "-", ".", ",", "?", "Current", "Question"};
enum {
    SYM_DIGIT0 = 0, /* "0" .. "9" are SYM_DIGIT0 + 0 .. 9 */
    SYM_COLON = 10,
    SYM_DASH,
    SYM_PERIOD,
    SYM_COMMA,
    SYM_QMARK,
    SYM_CURRENT,
    SYM_QUESTION,
    N_SYMBOLS
};
_Static_assert(sizeof symbols / sizeof symbols[0] == N_SYMBOLS, "one name per symbol");

#define TOKEN_BASE 1000u       /* token id of vocabulary index 0 */
#define GLUE       0x80000000u /* piece flag: no space before this piece */
#define SYM(k)     ((uint32_t)(N_WORDS + (k)))

/* The chat template's special tokens. */
enum { TOK_BOS = 1, TOK_SYSTEM = 2, TOK_USER = 3, TOK_ASSISTANT = 4, TOK_END = 5 };

#define DEFAULT_SEED     UINT64_C(20261129)
#define DEFAULT_REQUESTS 600
#define MAX_REQUESTS     10000000

static const char *const tenant_names[] = {"acme", "globex", "initech"};
static const char *const model_names[] = {"llama-3.1-8b", "qwen2.5-7b"};
static const char *const adapter_name = "acme-support-lora";
enum { ACME, GLOBEX, INITECH, N_TENANTS };
enum { LLAMA, QWEN };

static _Noreturn void die(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Print "gen_chatlog: MESSAGE" on stderr and exit with status. */
static _Noreturn void die(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("gen_chatlog: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(status);
}

/* splitmix64: small, fast, and its output depends only on the seed. */
typedef struct rng {
    uint64_t s; /* state */
} rng;

static uint64_t rng_next(rng *r)
{
    uint64_t z = (r->s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi] (the modulo bias is below 2^-50 for these ranges). */
static uint64_t rng_range(rng *r, uint64_t lo, uint64_t hi)
{
    return lo + rng_next(r) % (hi - lo + 1);
}

/* Uniform in [0, 1). */
static double rng_unit(rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

/* Exponentially distributed, mean mean_ms, rounded down to whole milliseconds. */
static uint64_t rng_exp_ms(rng *r, double mean_ms)
{
    return (uint64_t)(-mean_ms * log(1.0 - rng_unit(r)));
}

/* A growable array of pieces or token ids. */
typedef struct vec {
    uint32_t *v; /* elements, owned */
    size_t n;    /* elements used */
    size_t cap;  /* elements allocated */
} vec;

static void vec_push(vec *a, uint32_t x)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 256;
        uint32_t *v = realloc(a->v, cap * sizeof *v);
        if (v == NULL)
            die(1, "%s", "out of memory");
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
}

static void vec_append(vec *a, const vec *b)
{
    for (size_t i = 0; i < b->n; i++)
        vec_push(a, b->v[i]);
}

/* Index of word w in words[]; w must be there (the phrases below are checked at startup by
 * using them). */
static uint32_t word_index(const char *w, size_t len)
{
    for (size_t i = 0; i < N_WORDS; i++)
        if (strlen(words[i]) == len && memcmp(words[i], w, len) == 0)
            return (uint32_t)i;
    fprintf(stderr, "gen_chatlog: internal error: '%.*s' is not in the vocabulary\n", (int)len, w);
    abort();
}

/* Append the words of phrase (separated by single spaces) and a glued period. */
static void put_phrase(vec *a, const char *phrase)
{
    while (*phrase) {
        size_t len = strcspn(phrase, " ");
        vec_push(a, word_index(phrase, len));
        phrase += len + (phrase[len] == ' ');
    }
    vec_push(a, SYM(SYM_PERIOD) | GLUE);
}

/* Append about n_words words of running text: sentences of 5-16 words, skewed towards the
 * common words at the front of the vocabulary, with an occasional comma. */
static void put_words(vec *a, rng *r, size_t n_words)
{
    const size_t n_vocab = N_WORDS;
    size_t left = (size_t)rng_range(r, 5, 16);
    for (size_t i = 0; i < n_words; i++) {
        double u = rng_unit(r);
        vec_push(a, (uint32_t)((double)n_vocab * u * u));
        if (--left == 0 || i + 1 == n_words) {
            vec_push(a, SYM(SYM_PERIOD) | GLUE);
            left = (size_t)rng_range(r, 5, 16);
        } else if (rng_range(r, 0, 11) == 0) {
            vec_push(a, SYM(SYM_COMMA) | GLUE);
        }
    }
}

/* Append the decimal digits of v, zero-padded to width; the first digit is glued when glue. */
static void put_digits(vec *a, unsigned v, int width, bool glue)
{
    char buf[16];
    snprintf(buf, sizeof buf, "%0*u", width, v);
    for (const char *c = buf; *c; c++)
        vec_push(a, SYM(SYM_DIGIT0 + (*c - '0')) | (c > buf || glue ? GLUE : 0));
}

/* Days since 1970-01-01 of a proleptic Gregorian date, and back (H. Hinnant's algorithms). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

static void civil_from_days(int64_t z, int64_t *y, unsigned *m, unsigned *d)
{
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (int64_t)yoe + era * 400 + (*m <= 2);
}

/* Append "Current time: YYYY-MM-DD HH:MM:SS" for t_ms after 2026-11-29 10:00:00. */
static void put_clock(vec *a, uint64_t t_ms)
{
    uint64_t secs = UINT64_C(36000) + t_ms / 1000; /* from 10:00:00 */
    int64_t y;
    unsigned m, d, sod = (unsigned)(secs % 86400);
    civil_from_days(days_from_civil(2026, 11, 29) + (int64_t)(secs / 86400), &y, &m, &d);
    vec_push(a, SYM(SYM_CURRENT));
    vec_push(a, word_index("time", 4));
    vec_push(a, SYM(SYM_COLON) | GLUE);
    put_digits(a, (unsigned)y, 4, false);
    vec_push(a, SYM(SYM_DASH) | GLUE);
    put_digits(a, m, 2, true);
    vec_push(a, SYM(SYM_DASH) | GLUE);
    put_digits(a, d, 2, true);
    put_digits(a, sod / 3600, 2, false);
    vec_push(a, SYM(SYM_COLON) | GLUE);
    put_digits(a, sod / 60 % 60, 2, true);
    vec_push(a, SYM(SYM_COLON) | GLUE);
    put_digits(a, sod % 60, 2, true);
}

/* What every request of a kind shares, drawn once from the seed before the simulation. */
typedef struct corpus {
    vec system[N_TENANTS]; /* each tenant's system message: prompt, then tool definitions
                              (initech's without its leading clock) */
    vec document;          /* globex's document for document QA */
} corpus;

/* Append tool definitions of about n_words words: "function W W: description. parameter
 * W: description." entries after an introduction. */
static void put_tools(vec *a, rng *r, size_t n_words)
{
    put_phrase(a, "you can call these tools to help the customer");
    size_t used = 10;
    while (used < n_words) {
        size_t desc = (size_t)rng_range(r, 10, 20), pdesc = (size_t)rng_range(r, 4, 8);
        vec_push(a, word_index("function", 8));
        put_words(a, r, 2);
        a->n--; /* no period after the name: a colon */
        vec_push(a, SYM(SYM_COLON) | GLUE);
        put_words(a, r, desc);
        vec_push(a, word_index("parameter", 9));
        put_words(a, r, 1);
        a->n--;
        vec_push(a, SYM(SYM_COLON) | GLUE);
        put_words(a, r, pdesc);
        used += 5 + desc + pdesc;
    }
}

static void corpus_build(corpus *c, uint64_t seed)
{
    static const char *const intro[N_TENANTS] = {
        "you are a helpful support assistant for the customer of our product",
        "you are a helpful assistant for the sales team and the manager",
        "you are a helpful assistant for the project team",
    };
    static const size_t prompt_words[N_TENANTS] = {650, 450, 350};
    rng r = {seed ^ UINT64_C(0x636F72707573)}; /* a stream apart from the simulation's */
    memset(c, 0, sizeof *c);
    for (int t = 0; t < N_TENANTS; t++) {
        put_phrase(&c->system[t], intro[t]);
        put_words(&c->system[t], &r, prompt_words[t]);
        put_tools(&c->system[t], &r, 150);
    }
    put_words(&c->document, &r, 1500);
}

static void corpus_free(corpus *c)
{
    for (int t = 0; t < N_TENANTS; t++)
        free(c->system[t].v);
    free(c->document.v);
}

typedef enum conv_kind {
    CONV_ACME,
    CONV_GLOBEX_CHAT,
    CONV_GLOBEX_DOCQA,
    CONV_INITECH,
    CONV_ONEOFF
} conv_kind;

enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT };
static const char *const role_names[] = {"system", "user", "assistant"};
static const uint32_t role_tokens[] = {TOK_SYSTEM, TOK_USER, TOK_ASSISTANT};

/* One message of a conversation. */
typedef struct msg {
    int role;    /* ROLE_* */
    vec content; /* its pieces */
} msg;

/* What a conversation varies under --variants. */
enum { VAR_NONE, VAR_TOOL_ORDER, VAR_WHITESPACE };

/* A conversation in progress. */
typedef struct conv {
    conv_kind kind;
    int variant;         /* VAR_*, drawn at the start (always VAR_NONE without --variants) */
    bool tools;          /* requests carry TOOLS (acme under --variants) */
    int tenant, model;   /* indexes into tenant_names, model_names */
    bool adapter;        /* requests carry adapter_name */
    unsigned turns_left; /* requests still to send, >= 1 while the conversation is active */
    uint64_t next_ms;    /* when the next one is sent */
    msg *msgs;           /* the history, owned */
    size_t n_msgs;       /* messages in it */
} conv;

static msg *conv_add(conv *c, int role)
{
    msg *m = realloc(c->msgs, (c->n_msgs + 1) * sizeof *m);
    if (m == NULL)
        die(1, "%s", "out of memory");
    c->msgs = m;
    m = &c->msgs[c->n_msgs++];
    m->role = role;
    memset(&m->content, 0, sizeof m->content);
    return m;
}

static void conv_free(conv *c)
{
    for (size_t i = 0; i < c->n_msgs; i++)
        free(c->msgs[i].content.v);
    free(c->msgs);
    free(c);
}

/* Start a conversation at t_ms: its kind, namespace, length and system message. */
static conv *conv_new(rng *r, const corpus *cp, uint64_t t_ms)
{
    static const unsigned turn_weights[] = {30, 22, 17, 13, 10, 8}; /* 1..6 turns, % */
    conv *c = calloc(1, sizeof *c);
    if (c == NULL)
        die(1, "%s", "out of memory");
    unsigned k = (unsigned)rng_range(r, 0, 99);
    c->kind = k < 34   ? CONV_ACME
              : k < 52 ? CONV_GLOBEX_CHAT
              : k < 68 ? CONV_GLOBEX_DOCQA
              : k < 92 ? CONV_INITECH
                       : CONV_ONEOFF;
    switch (c->kind) {
    case CONV_ACME:
        c->tenant = ACME;
        c->model = LLAMA;
        c->adapter = rng_range(r, 0, 9) < 4;
        break;
    case CONV_GLOBEX_CHAT:
    case CONV_GLOBEX_DOCQA:
        c->tenant = GLOBEX;
        c->model = QWEN;
        break;
    case CONV_INITECH:
        c->tenant = INITECH;
        c->model = LLAMA;
        break;
    case CONV_ONEOFF:
        c->tenant = (int)rng_range(r, 0, N_TENANTS - 1);
        c->model = (int)rng_range(r, 0, 1);
        break;
    }
    c->turns_left = 1;
    if (c->kind != CONV_GLOBEX_DOCQA && c->kind != CONV_ONEOFF) {
        unsigned w = (unsigned)rng_range(r, 0, 99);
        for (size_t i = 0; i < sizeof turn_weights / sizeof turn_weights[0] - 1; i++) {
            if (w < turn_weights[i])
                break;
            w -= turn_weights[i];
            c->turns_left++;
        }
    }
    c->next_ms = t_ms;
    if (c->kind != CONV_ONEOFF && c->kind != CONV_INITECH)
        vec_append(&conv_add(c, ROLE_SYSTEM)->content, &cp->system[c->tenant]);
    else if (c->kind == CONV_INITECH)
        conv_add(c, ROLE_SYSTEM); /* filled with the clock at each turn */
    return c;
}

/* The tool definitions acme's requests carry under --variants, one JSON object each. */
static const char *const TOOLS[] = {
    "{\"type\":\"function\",\"function\":{\"name\":\"get_order_status\",\"description\":"
    "\"Look up the delivery status of an order.\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"order_id\":{\"type\":\"string\"}},\"required\":[\"order_id\"]}}}",
    "{\"type\":\"function\",\"function\":{\"name\":\"cancel_subscription\",\"description\":"
    "\"Cancel the customer's subscription at the end of the billing period.\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"customer_id\":{\"type\":\"string\"},"
    "\"reason\":{\"type\":\"string\"}},\"required\":[\"customer_id\"]}}}",
    "{\"type\":\"function\",\"function\":{\"name\":\"update_address\",\"description\":"
    "\"Change the shipping address of an open order.\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"order_id\":{\"type\":\"string\"},\"address\":{\"type\":\"string\"}},"
    "\"required\":[\"order_id\",\"address\"]}}}",
    "{\"type\":\"function\",\"function\":{\"name\":\"search_knowledge_base\","
    "\"description\":\"Search the support articles.\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"query\":{\"type\":\"string\"},\"limit\":{\"type\":\"integer\","
    "\"minimum\":1,\"maximum\":20}},\"required\":[\"query\"]}}}",
};
#define N_TOOLS (sizeof TOOLS / sizeof TOOLS[0])

/* The variant of a conversation starting at t_ms: its own splitmix64 draw, so the main
 * generator's sequence (and every other byte of the output) does not depend on it. */
static int conv_variant(uint64_t seed, uint64_t t_ms)
{
    rng v = {seed ^ (t_ms * UINT64_C(0xD1B54A32D192ED03))};
    uint64_t k = rng_range(&v, 0, 9);
    return k < 2 ? VAR_TOOL_ORDER : k < 4 ? VAR_WHITESPACE : VAR_NONE;
}

/* Write s as the inside of a JSON string. */
static void json_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
}

/* Write pieces as text: the vocabulary entries separated by spaces except before glued ones;
 * two spaces before piece wide (0: none). */
static void put_text(FILE *f, const vec *a, size_t wide)
{
    for (size_t i = 0; i < a->n; i++) {
        uint32_t idx = a->v[i] & ~GLUE;
        if (i > 0 && i == wide)
            fputc(' ', f);
        if (i > 0 && !(a->v[i] & GLUE))
            fputc(' ', f);
        json_text(f, idx < N_WORDS ? words[idx] : symbols[idx - N_WORDS]);
    }
}

/* Write token ids, comma-separated. */
static void put_ids(FILE *f, const vec *a, bool *first)
{
    for (size_t i = 0; i < a->n; i++) {
        fprintf(f, *first ? "%u" : ",%u", TOKEN_BASE + (a->v[i] & ~GLUE));
        *first = false;
    }
}

static void put_special(FILE *f, uint32_t id, bool *first)
{
    fprintf(f, *first ? "%u" : ",%u", id);
    *first = false;
}

/* Write the request of c's current history (sent at t_ms, answered by reply) as one line. */
static void write_request(FILE *f, bool openai, const conv *c, const vec *reply, uint64_t t_ms)
{
    if (openai) {
        fprintf(f, "{\"model\":\"%s\",\"user\":\"%s\",", model_names[c->model],
                tenant_names[c->tenant]);
        if (c->adapter)
            fprintf(f, "\"adapter\":\"%s\",", adapter_name);
        fputs("\"messages\":[", f);
        for (size_t i = 0; i < c->n_msgs; i++) {
            fprintf(f, "%s{\"role\":\"%s\",\"content\":\"", i ? "," : "",
                    role_names[c->msgs[i].role]);
            bool wide = c->variant == VAR_WHITESPACE && c->msgs[i].role == ROLE_SYSTEM;
            put_text(f, &c->msgs[i].content, wide ? 20 : 0);
            fputs("\"}", f);
        }
        fputs("]", f);
        for (size_t k = 0; c->tools && k < N_TOOLS; k++) {
            size_t j = c->variant == VAR_TOOL_ORDER ? (k + 1) % N_TOOLS : k;
            fprintf(f, "%s%s", k ? "," : ",\"tools\":[", TOOLS[j]);
        }
        fprintf(f, "%s,\"max_tokens\":%zu,\"timestamp\":%llu.%03llu}\n", c->tools ? "]" : "",
                reply->n + 1, (unsigned long long)(t_ms / 1000), (unsigned long long)(t_ms % 1000));
        return;
    }
    bool first = true;
    fprintf(f, "{\"timestamp\":%llu.%03llu,\"model\":\"%s\",\"tenant\":\"%s\",",
            (unsigned long long)(t_ms / 1000), (unsigned long long)(t_ms % 1000),
            model_names[c->model], tenant_names[c->tenant]);
    if (c->adapter)
        fprintf(f, "\"adapter\":\"%s\",", adapter_name);
    fputs("\"tokens\":[", f);
    put_special(f, TOK_BOS, &first);
    for (size_t i = 0; i < c->n_msgs; i++) {
        put_special(f, role_tokens[c->msgs[i].role], &first);
        put_ids(f, &c->msgs[i].content, &first);
        put_special(f, TOK_END, &first);
    }
    put_special(f, TOK_ASSISTANT, &first);
    fputs("],\"output_tokens\":[", f);
    first = true;
    put_ids(f, reply, &first);
    put_special(f, TOK_END, &first);
    fputs("]}\n", f);
}

/*
 * Send c's next turn at t_ms. Steps:
 *   1. initech: rewrite the system message with the clock first;
 *   2. add the user message of c's kind;
 *   3. draw the reply;
 *   4. write the request;
 *   5. add the reply to the history and schedule the next turn.
 */
static void send_turn(FILE *f, bool openai, rng *r, const corpus *cp, conv *c, uint64_t t_ms)
{
    vec reply = {0};

    /* Step 1: */
    if (c->kind == CONV_INITECH) {
        vec *sys = &c->msgs[0].content;
        sys->n = 0;
        put_clock(sys, t_ms);
        vec_append(sys, &cp->system[INITECH]);
    }

    /* Step 2: */
    vec *user = &conv_add(c, ROLE_USER)->content;
    switch (c->kind) {
    case CONV_GLOBEX_DOCQA:
        put_phrase(user, "please read the following document and answer the question");
        vec_append(user, &cp->document);
        vec_push(user, SYM(SYM_QUESTION));
        vec_push(user, SYM(SYM_COLON) | GLUE);
        put_words(user, r, (size_t)rng_range(r, 8, 30));
        user->v[user->n - 1] = SYM(SYM_QMARK) | GLUE;
        put_clock(user, t_ms);
        break;
    case CONV_ONEOFF:
        put_words(user, r, (size_t)rng_range(r, 40, 400));
        break;
    default:
        put_words(user, r, (size_t)rng_range(r, 20, 150));
        if (c->kind == CONV_GLOBEX_CHAT)
            put_clock(user, t_ms);
        break;
    }

    /* Step 3: */
    put_words(&reply, r, (size_t)rng_range(r, 30, 160));

    /* Step 4: */
    write_request(f, openai, c, &reply, t_ms);

    /* Step 5: the reply takes 30 ms a token to generate, then the user reads and types. */
    conv_add(c, ROLE_ASSISTANT)->content = reply;
    c->turns_left--;
    c->next_ms = t_ms + 30 * (reply.n + 1) + 4000 + rng_exp_ms(r, 25000.0);
}

/*
 * Run the simulation: conversations arrive and send their turns in time order until
 * n_requests lines are written. Each step takes the earliest of the next arrival and the
 * active conversations' next turns (a linear scan: a few dozen are active at a time).
 */
static void simulate(FILE *f, bool openai, bool variants, uint64_t seed, uint64_t n_requests)
{
    corpus cp;
    rng r = {seed};
    conv **active = NULL;
    size_t n_active = 0, cap_active = 0;
    uint64_t next_arrival = 0, last_ms = 0;

    corpus_build(&cp, seed);
    for (uint64_t sent = 0; sent < n_requests;) {
        size_t best = n_active;
        for (size_t i = 0; i < n_active; i++)
            if (best == n_active || active[i]->next_ms < active[best]->next_ms)
                best = i;
        if (best == n_active || next_arrival <= active[best]->next_ms) {
            if (n_active == cap_active) {
                cap_active = cap_active ? 2 * cap_active : 64;
                conv **a = realloc(active, cap_active * sizeof(conv *));
                if (a == NULL)
                    die(1, "%s", "out of memory");
                active = a;
            }
            conv *nc = conv_new(&r, &cp, next_arrival);
            if (variants) {
                nc->variant = conv_variant(seed, next_arrival);
                nc->tools = nc->tenant == ACME;
            }
            active[n_active++] = nc;
            next_arrival += 1 + rng_exp_ms(&r, 9000.0);
            continue;
        }
        conv *c = active[best];
        /* Strictly increasing timestamps: a turn due at the same millisecond as the last
         * request goes a millisecond later. */
        uint64_t t = c->next_ms > last_ms || sent == 0 ? c->next_ms : last_ms + 1;
        send_turn(f, openai, &r, &cp, c, t);
        last_ms = t;
        sent++;
        if (c->turns_left == 0) {
            conv_free(c);
            active[best] = active[--n_active];
        }
    }
    for (size_t i = 0; i < n_active; i++)
        conv_free(active[i]);
    free(active);
    corpus_free(&cp);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: gen_chatlog [--seed N] [--requests N] [--format tokens|openai] [--variants]\n"
            "                   [-o FILE]\n"
            "Write a deterministic example request log (JSON Lines) for kvprefix replay.\n"
            "  --seed N        PRNG seed (default %llu)\n"
            "  --requests N    number of requests, 1 to %d (default %d)\n"
            "  --format F      tokens: token-id lines (default); openai: chat completions bodies\n"
            "  --variants      openai: acme requests carry tools, and some conversations\n"
            "                  reorder them or change whitespace (for replay --diagnose)\n"
            "  -o FILE         output file (default: standard output; - too)\n",
            (unsigned long long)DEFAULT_SEED, MAX_REQUESTS, DEFAULT_REQUESTS);
}

/* Parse a decimal unsigned integer from s into *out, within [lo, hi]. Returns false when s
 * is not one (signs, spaces, trailing text, overflow). */
static bool parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (*s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

int main(int argc, char **argv)
{
    uint64_t seed = DEFAULT_SEED, n_requests = DEFAULT_REQUESTS;
    bool openai = false, variants = false;
    const char *out_path = NULL;

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = NULL;
        char name[32];
        size_t len = strcspn(arg, "=");
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(arg, "--variants") == 0) {
            variants = true;
            continue;
        }
        if (strncmp(arg, "--", 2) == 0 && arg[len] == '=' && len < sizeof name) {
            memcpy(name, arg, len);
            name[len] = '\0';
            val = arg + len + 1;
            arg = name;
        }
        bool known = strcmp(arg, "--seed") == 0 || strcmp(arg, "--requests") == 0 ||
                     strcmp(arg, "--format") == 0 || strcmp(arg, "-o") == 0;
        if (!known)
            die(2,
                arg[0] == '-' ? "unknown option '%s' (see --help)"
                              : "unexpected argument '%s' (see --help)",
                argv[i]);
        if (val == NULL) {
            if (i + 1 == argc)
                die(2, "%s needs a value (see --help)", arg);
            val = argv[++i];
        }
        if (strcmp(arg, "--seed") == 0) {
            if (!parse_u64(val, 0, UINT64_MAX, &seed))
                die(2, "--seed: '%s' is not an unsigned 64-bit integer", val);
        } else if (strcmp(arg, "--requests") == 0) {
            if (!parse_u64(val, 1, MAX_REQUESTS, &n_requests))
                die(2, "--requests: '%s' is not a number from 1 to 10000000", val);
        } else if (strcmp(arg, "--format") == 0) {
            if (strcmp(val, "tokens") == 0)
                openai = false;
            else if (strcmp(val, "openai") == 0)
                openai = true;
            else
                die(2, "--format: '%s' is not tokens or openai", val);
        } else {
            if (val[0] == '\0')
                die(2, "%s", "-o: empty file name");
            out_path = val;
        }
    }

    if (variants && !openai)
        die(2, "%s", "--variants needs --format openai (token lines have no tools)");
    FILE *f = stdout;
    if (out_path != NULL && strcmp(out_path, "-") != 0) {
        f = fopen(out_path, "w");
        if (f == NULL) {
            fprintf(stderr, "gen_chatlog: %s: %s\n", out_path, strerror(errno));
            return 1;
        }
    }
    simulate(f, openai, variants, seed, n_requests);
    if (fflush(f) != 0 || ferror(f) || (f != stdout && fclose(f) != 0)) {
        fprintf(stderr, "gen_chatlog: %s: write error: %s\n", out_path ? out_path : "<stdout>",
                strerror(errno));
        return 1;
    }
    return 0;
}
