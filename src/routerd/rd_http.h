/*
 * rd_http.h - the HTTP request handling of `kvprefix router` without a socket (rd_http.c):
 * libmicrohttpd's callbacks are thin adapters over these calls, and fuzz/fuzz_routerd_http.c
 * drives them directly with fuzzed methods, paths, headers and bodies.
 *
 * One rd_conn per connection holds what its requests reuse (the /score scanner's token
 * array, the ranked rows, the answer's bytes), so a /score allocates nothing per token and,
 * once the buffers have grown, nothing but the load-aware ranking's scratch (rd_rank_rows)
 * and, when the request names workers or loads, their pointer arrays. A POST /load body is
 * buffered whole (it is small JSON, parsed by rd_load_push) under --max-body and the body
 * budget, and freed when the request ends. A request:
 *
 *   rd_http_begin(method, url, content type, content length)  -> RD_NEXT_BODY or _REPLY
 *   rd_http_arg(key, value)...    query arguments (binary /score bodies)
 *   rd_http_body(chunk)...        -> RD_NEXT_BODY, _REPLY (refused mid-body) or _CLOSE
 *   rd_http_end()                 the body ended: the answer
 *   rd_http_done()                the request is over (buffers trimmed)
 *
 * After RD_NEXT_REPLY, cn->status, cn->type and cn->out[0 .. out_n) are the answer (owned
 * by cn, valid until the next call on it).
 */
#ifndef CLI_RD_HTTP_H
#define CLI_RD_HTTP_H

#include "rd_req.h"
#include "routerd.h"

/* What the caller does next. */
enum {
    RD_NEXT_BODY = 0,  /* read the body (rd_http_body, then rd_http_end) */
    RD_NEXT_REPLY = 1, /* the answer is ready: send it (the rest of the body is ignored) */
    RD_NEXT_CLOSE = 2  /* the request's deadline passed: close the connection */
};

/* A connection's state, reused by its requests. Zero it before the first request; free
 * with rd_conn_free. */
typedef struct rd_conn {
    rd_req req;             /* the /score scanner */
    char *out;              /* the answer's bytes [0 .. out_n), owned */
    size_t out_n;           /* bytes of the answer */
    size_t out_cap;         /* capacity of out */
    unsigned status;        /* the answer's HTTP status, when answered */
    const char *type;       /* its content type (static), when answered */
    bool answered;          /* the answer is ready */
    bool sent;              /* libmicrohttpd has it (rd_http.c's adapter only) */
    bool out_failed;        /* out could not grow: the answer is a fixed 500 */
    int kind;               /* RD_K_* (rd_http.c) of the request in progress */
    kvp_router_row *rows;   /* score rows, cap_rows entries, reused */
    const char **ids;       /* their engine ids */
    rd_rank *rk;            /* ranked rows */
    size_t cap_rows;        /* capacity of rows, ids and rk */
    int64_t deadline_ms;    /* the request's deadline (monotonic ms) */
    uint64_t body_bytes;    /* body bytes received */
    uint64_t busy_ns;       /* time spent handling the request so far */
    char *load_body;        /* POST /load: its body [0 .. load_n), owned, freed when it ends */
    size_t load_n;          /* bytes of load_body */
    size_t load_cap;        /* capacity of load_body (reserved in load_budget) */
    rd_budget *load_budget; /* the budget load_cap is reserved in (the daemon's) */
    void *txt;              /* text mode's scratch (rd_text_scratch, rd_text.h), owned */
} rd_conn;

/* A request's head: method, url (the path, no query), the Content-Type and Content-Length
 * headers (NULL when absent), now_ms its arrival (monotonic). Returns RD_NEXT_BODY or
 * RD_NEXT_REPLY. Cannot fail otherwise (out of memory is a 500 answer). */
int rd_http_begin(rd_daemon *d, rd_conn *cn, const char *method, const char *url, const char *ctype,
                  const char *clen, int64_t now_ms);

/* A query argument (value NULL when it has no '='). Returns RD_NEXT_BODY or _REPLY. */
int rd_http_arg(rd_daemon *d, rd_conn *cn, const char *key, const char *value);

/* The next n bytes of the body, at now_ms. Returns RD_NEXT_BODY, _REPLY or _CLOSE. */
int rd_http_body(rd_daemon *d, rd_conn *cn, const char *data, size_t n, int64_t now_ms);

/* The body ended at now_ms: the answer. Returns RD_NEXT_REPLY or RD_NEXT_CLOSE. */
int rd_http_end(rd_daemon *d, rd_conn *cn, int64_t now_ms);

/* The request is over: keep at most a modest buffer for the next one. Cannot fail. */
void rd_http_done(rd_conn *cn);

/* Free a connection's buffers (its budget share given back). Accepts NULL. Cannot fail. */
void rd_conn_free(rd_conn *cn);

/* Nanoseconds of a monotonic clock. Cannot fail. */
uint64_t rd_now_ns(void);

#endif /* CLI_RD_HTTP_H */
