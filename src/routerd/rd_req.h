/*
 * rd_req.h - the /score request scanner of `kvprefix router` (rd_req.c): a push scanner that
 * validates and decodes a request body chunk by chunk, as libmicrohttpd hands the chunks
 * over, so that a body is never buffered whole and a bad one is refused at its first wrong
 * byte.
 *
 * Two encodings of one request (docs/routing.md, "POST /score"):
 *   JSON    {"tokens": [ids...], "model": S, "lora": S, "salt": S, "tenant": S,
 *            "workers": [NAME...], "loads": {NAME: LOAD}}
 *           (strings, lists and objects or null; every member optional but tokens; unknown
 *           or repeated members refused at their key, before anything after it is read;
 *           a name is "ENGINE" or "ENGINE/RANK", a load a JSON number 0..1e12)
 *   text    {"prompt": S} or {"messages": [...], "tools": [...], "add_generation_prompt": B,
 *            "chat_template_kwargs": {...}} with the namespace, workers and loads as above
 *           and no "tokens": at the first text member the request switches to text mode,
 *           its bytes from that key on are kept (in rd_req.text, within the budget), and
 *           rd_req_finish parses them with jansson: the text members go to rd_req.body
 *           for rd_text.c to render and tokenize, the others are fed back through the
 *           scanner's own states (same checks, same messages, without byte positions);
 *           any other member is refused by name
 *   binary  Content-Type application/octet-stream: the token ids as little-endian uint32,
 *           the namespace from the query string (?model=S&lora=S&salt=S&tenant=S); no
 *           workers or loads (those are JSON only)
 *
 * Extending the request. The members are rows of rd_req_fields[] (rd_req.c): a name, a kind
 * and a slot. The kinds are RD_F_TOKENS (an array of ids into rd_req.tokens), RD_F_STRING (a
 * string or null into rd_req.str[slot]), RD_F_NAMES (an array of strings or null: "workers")
 * and RD_F_LOADS (an object of numbers or null: "loads"); the last two put their names into
 * rd_req.names and one rd_req_item each into rd_req.items. A new member of an existing kind
 * is one row (and a slot: RD_REQ_N_STR). Strings of every kind go through the same string
 * states; only what happens at the closing quote depends on the kind. The binary encoding
 * takes every RD_F_STRING member as a query argument of the same name.
 *
 * Memory: the token array (4 bytes per id, grown geometrically, reused across the requests
 * of a connection) counts against a budget shared by every connection (rd_budget): a growth
 * that would pass it is refused (RD_REQ_BUSY), so held uploads cost at most the budget.
 * Strings are at most RD_REQ_STR_MAX bytes each, in fixed buffers. The names of "workers"
 * and "loads" (at most RD_REQ_MAX_NAMES of each, RD_REQ_STR_MAX bytes each) go into one
 * growable buffer and their items into one growable array, both reserved in the same budget
 * (rd_req_reserved): a request that names workers costs what its names take, nothing more.
 */
#ifndef CLI_RD_REQ_H
#define CLI_RD_REQ_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest namespace string (model, lora, salt, tenant), in bytes once decoded. */
#define RD_REQ_STR_MAX 1024u
/* String members (slots of rd_req.str). */
#define RD_REQ_N_STR 4

/* Longest body in text mode, from the first text member on (a text request is parsed whole
 * by jansson, tens of bytes per byte while it is parsed, and rendered and tokenized: 4 MiB is
 * about a million tokens, past any context window). */
#define RD_REQ_TEXT_MAX ((size_t)4 << 20)

/* Most entries of "workers", and of "loads" (the daemon's load table holds as many). */
#define RD_REQ_MAX_NAMES 4096u

/* One name of "workers" or key of "loads", in rd_req.names. */
typedef struct rd_req_item {
    size_t off;   /* its first byte in rd_req.names (NUL-terminated) */
    bool is_load; /* a "loads" key (value set), else a "workers" entry */
    double value; /* the load, when is_load: finite, 0 .. 1e12 */
} rd_req_item;

/* Bytes of token arrays held by every connection together, and the limit. */
typedef struct rd_budget {
    atomic_size_t used; /* bytes reserved (capacity of the token arrays held) */
    size_t limit;       /* most bytes; 0: no limit */
} rd_budget;

/* What rd_req_feed / rd_req_finish return. */
enum {
    RD_REQ_MORE = 0, /* fine so far: feed more, or finish */
    RD_REQ_DONE = 1, /* rd_req_finish: a complete request is in tokens/str */
    RD_REQ_BAD = 2,  /* the body is wrong: err says where and why (400) */
    RD_REQ_BUSY = 3, /* the budget of buffered bodies is spent (503) */
    RD_REQ_NOMEM = 4 /* out of memory (500) */
};

/* One request being scanned. Zero it, then rd_req_reset before each request. */
typedef struct rd_req {
    /* Results (valid after rd_req_finish returns RD_REQ_DONE). */
    uint32_t *tokens;  /* token ids [0 .. n_tokens), owned, reused */
    size_t n_tokens;   /* ids decoded */
    size_t cap_tokens; /* capacity of tokens, in ids (reserved in budget) */
    char str[RD_REQ_N_STR][RD_REQ_STR_MAX + 1]; /* model, lora, salt, tenant (NUL added) */
    size_t str_len[RD_REQ_N_STR];               /* their lengths, when str_set */
    bool str_set[RD_REQ_N_STR];                 /* the member was given and not null */
    char *names;        /* names of workers and loads, each NUL-terminated, owned, reused */
    size_t names_n;     /* bytes used in names */
    size_t names_cap;   /* capacity of names (reserved in budget) */
    rd_req_item *items; /* the workers' and loads' entries [0 .. n_items), owned, reused */
    size_t n_items;     /* entries decoded */
    size_t cap_items;   /* capacity of items (reserved in budget) */
    size_t n_workers;   /* entries of items that are workers */
    size_t n_loads;     /* entries of items that are loads */
    bool workers_set;   /* "workers" was given and not null (an empty list keeps no row) */
    char err[256];      /* why the body was refused, when RD_REQ_BAD */
    /* Scanner state. */
    rd_budget *budget; /* shared budget, or NULL: none */
    bool binary;       /* application/octet-stream body */
    int state;         /* RD_S_* (rd_req.c) */
    int field;         /* index of the member whose value is being read, or -1 */
    uint32_t seen;     /* members seen (bit per rd_req_fields row) */
    uint64_t num;      /* token id being read */
    int num_digits;    /* its digits so far */
    char key[32];      /* key being read (longer keys are unknown) */
    size_t key_len;    /* its bytes, or sizeof key + 1 once too long */
    char *sbuf;        /* where the string being read goes */
    size_t s_len;      /* its bytes so far */
    size_t s_max;      /* room in sbuf */
    uint32_t uesc;     /* \uXXXX being read */
    int uesc_n;        /* its hex digits so far */
    uint32_t high;     /* a high surrogate waiting for its low half, or 0 */
    int lit;           /* bytes of "null" matched */
    char nbuf[32];     /* a load number being read */
    int nbuf_len;      /* its bytes so far */
    uint8_t carry[4];  /* binary: bytes of an id split between chunks */
    int n_carry;       /* their count */
    uint64_t offset;   /* body bytes consumed: error positions */
    /* Text mode (a text member was met). */
    bool text;           /* the request is in text mode */
    bool replay;         /* feeding members back from jansson: no byte positions */
    char *text_buf;      /* the body from the first text key on (as '{"KEY"...'), owned */
    size_t text_n;       /* bytes in text_buf */
    size_t text_cap;     /* capacity of text_buf (reserved in budget) */
    uint64_t text_at;    /* body offset that text_buf[1] stands at (error positions) */
    struct json_t *body; /* after rd_req_finish in text mode: the text members (owned) */
} rd_req;

/* Text members: "prompt", "messages", "tools", "add_generation_prompt",
 * "chat_template_kwargs" (rd_req.c's table). */
#define RD_REQ_TEXT_LIST "prompt, messages, tools, add_generation_prompt, chat_template_kwargs"

/* Start a request (binary: an octet-stream body) with budget (or NULL). Keeps the token
 * array (its capacity stays reserved). Cannot fail. */
void rd_req_reset(rd_req *q, rd_budget *budget, bool binary);

/* A query-string argument of a binary request. Returns RD_REQ_MORE or RD_REQ_BAD (an
 * unknown or repeated argument, a string too long, a JSON request with arguments). */
int rd_req_arg(rd_req *q, const char *key, const char *value);

/* Scan the next n bytes of the body. Returns RD_REQ_MORE, RD_REQ_BAD (err set),
 * RD_REQ_BUSY or RD_REQ_NOMEM; after anything but RD_REQ_MORE the request is over. */
int rd_req_feed(rd_req *q, const char *data, size_t n);

/* The body ended. Returns RD_REQ_DONE or RD_REQ_BAD (truncated, no tokens member, in text
 * mode invalid JSON or a member refused), or RD_REQ_NOMEM. In text mode (q->text) the ids
 * are not set: q->body holds the text members for rd_text_tokens. */
int rd_req_finish(rd_req *q);

/* Put ids[0 .. n) as the request's tokens (text mode, after rd_req_finish), growing the
 * array within the budget. Returns RD_REQ_MORE, RD_REQ_BUSY or RD_REQ_NOMEM. */
int rd_req_set_tokens(rd_req *q, const uint32_t *ids, size_t n);

/* Give back the token array beyond keep_bytes of capacity, the names and items beyond
 * keep_bytes together, the text buffer beyond keep_bytes (and the parsed body always) (to the
 * allocator and the budget); keep_bytes 0 frees them all. Cannot fail. */
void rd_req_trim(rd_req *q, size_t keep_bytes);

/* Bytes q holds in its budget (token array, names, items, text). Cannot fail. */
size_t rd_req_reserved(const rd_req *q);

/* The name of item i (i < n_items), valid until the next rd_req_reset or feed. */
static inline const char *rd_req_name(const rd_req *q, size_t i)
{
    return q->names + q->items[i].off;
}

/* Whether s[0 .. n) is valid UTF-8 (RFC 3629: no overlong forms, no surrogates, at most
 * U+10FFFF). Cannot fail. */
bool rd_utf8_ok(const unsigned char *s, size_t n);

/* The scanner's invariants (state in range, lengths within buffers, budget covers the
 * token array). Returns NULL or what is broken. For tests and fuzzers. */
const char *rd_req_check(const rd_req *q);

#endif /* CLI_RD_REQ_H */
