/*
 * rd_scrape.c - the scrape thread of `kvprefix router`: every --scrape-interval it fetches
 * each engine's Prometheus endpoint (--engine ...,metrics=URL) and records its workers'
 * running and waiting requests and KV usage in the load table (rd_load.c), which /score
 * ranks with (docs/routing.md, "Load-aware ranking").
 *
 *   scrape thread: for each source with a metrics URL:
 *       rd_http_get(url) ──> rd_scrape_parse(text, dp_size) ──> rd_load_set(engine, rank)
 *     then wait for the next period (or for rd_scrape_stop, which wakes it at once)
 *
 * HTTP is a plain socket: GET with HTTP/1.0 (so no chunked body, though one is decoded if
 * a server sends it anyway), Connection: close, the whole exchange bounded by a deadline
 * (min(interval, 2 s)) and the body by 8 MiB. Only the needed series are parsed, line by
 * line; anything else (other families, comments, timestamps) is skipped. A data-parallel
 * engine serves one endpoint for all its ranks: a series' rank is its `engine` label
 * (vLLM) or `dp_rank` label (SGLang), rank 0 without either; series of one rank are summed
 * (one per model name). A failed scrape is logged when a target goes from working to failing
 * and back (not on every attempt) and counted; the workers' last figures age out with
 * --load-ttl.
 *
 * Invariant: only this thread writes rd_scrape.targets' counters; the stop flag is read
 * under the thread's mutex. Cost per period: one connection and one pass over each body.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <fcntl.h>
#include <sys/socket.h>

#include "cli.h"
#include "flags.h"
#include "routerd.h"

#define RD_SCRAPE_MAX_BYTES ((size_t)8 << 20) /* largest /metrics body read */
#define RD_SCRAPE_MAX_MS    2000              /* longest one scrape may take */
#define RD_SCRAPE_MAX_DP    256u              /* ranks per engine (rd_spec.c's dp limit) */

/* The scrape thread's state (d->scraper). */
typedef struct rd_scrape {
    rd_daemon *d;         /* the daemon (its sources and load table) */
    pthread_t thread;     /* the scrape thread */
    pthread_mutex_t lock; /* guards stop (with wake) */
    pthread_cond_t wake;  /* signalled by rd_scrape_stop */
    bool stop;            /* set by rd_scrape_stop */
    bool *failing;        /* per source: its last scrape failed (thread only) */
} rd_scrape;

/* ---- HTTP GET ------------------------------------------------------------------------ */

/* Milliseconds left until deadline (monotonic), at least 0. */
static int rd_left_ms(int64_t deadline)
{
    int64_t left = deadline - rd_now_ms();
    return left > 0 ? (int)left : 0;
}

/* Split url into host, port and path. Returns 0, or non-zero with err. */
static int rd_url_split(const char *url, char *host, size_t host_cap, char *port, size_t port_cap,
                        const char **path, char *err, size_t err_size)
{
    if (strncmp(url, "http://", 7) != 0) {
        cli_errf(err, err_size, "'%s' is not http://HOST[:PORT][/PATH]", url);
        return 1;
    }
    const char *h = url + 7, *end;
    if (*h == '[') {
        end = strchr(h, ']');
        if (end == NULL || (size_t)(end - h - 1) >= host_cap) {
            cli_errf(err, err_size, "'%s': an IPv6 host is [ADDR]", url);
            return 1;
        }
        memcpy(host, h + 1, (size_t)(end - h - 1));
        host[end - h - 1] = '\0';
        end++;
    } else {
        end = h + strcspn(h, ":/");
        if (end == h || (size_t)(end - h) >= host_cap) {
            cli_errf(err, err_size, "'%s' has no host", url);
            return 1;
        }
        memcpy(host, h, (size_t)(end - h));
        host[end - h] = '\0';
    }
    snprintf(port, port_cap, "80");
    if (*end == ':') {
        size_t n = strcspn(end + 1, "/");
        uint64_t p = 0;
        char digits[8] = "";
        if (n == 0 || n >= sizeof digits) {
            cli_errf(err, err_size, "'%s': the port is not 1..65535", url);
            return 1;
        }
        memcpy(digits, end + 1, n);
        if (cli_parse_uint(digits, 65535, &p) != CLI_OK || p == 0) {
            cli_errf(err, err_size, "'%s': the port is not 1..65535", url);
            return 1;
        }
        snprintf(port, port_cap, "%u", (unsigned)(p & 0xffffu));
        end += 1 + n;
    }
    if (*end != '\0' && *end != '/') {
        cli_errf(err, err_size, "'%s' is not http://HOST[:PORT][/PATH]", url);
        return 1;
    }
    *path = *end ? end : "/";
    return 0;
}

/* Connect to host:port before deadline. Returns the socket, or -1 with err. */
static int rd_connect(const char *host, const char *port, int64_t deadline, char *err,
                      size_t err_size)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(host, port, &hints, &res);
    if (g != 0) {
        cli_errf(err, err_size, "cannot resolve '%s': %s", host, gai_strerror(g));
        return -1;
    }
    int fd = -1, why = 0;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            why = errno;
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
            why = errno;
            close(fd);
            fd = -1;
            continue;
        }
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int soerr = 0;
        socklen_t len = sizeof soerr;
        if (poll(&p, 1, rd_left_ms(deadline)) != 1 ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0 || soerr != 0) {
            why = soerr ? soerr : ETIMEDOUT;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        cli_errf(err, err_size, "cannot connect to %s:%s: %s", host, port, strerror(why));
    return fd;
}

/* Decode a chunked body in place (buf[0 .. *n)). Returns false when it is malformed. */
static bool rd_dechunk(char *buf, size_t *n)
{
    size_t in = 0, out = 0;
    for (;;) {
        char *end = NULL;
        if (in >= *n)
            return false;
        unsigned long long size = strtoull(buf + in, &end, 16);
        char *crlf = memchr(buf + in, '\n', *n - in);
        if (end == buf + in || crlf == NULL)
            return false;
        in = (size_t)(crlf - buf) + 1;
        if (size == 0)
            break;
        if (size > *n - in)
            return false;
        memmove(buf + out, buf + in, (size_t)size);
        out += (size_t)size;
        in += (size_t)size;
        if (in < *n && buf[in] == '\r')
            in++;
        if (in < *n && buf[in] == '\n')
            in++;
    }
    *n = out;
    buf[out] = '\0';
    return true;
}

/* Check the response head in buf[0 .. head) and move the body to the front of buf.
 * Returns 0, or non-zero with err. */
static int rd_response(char *buf, size_t *n, char *err, size_t err_size)
{
    char *sep = strstr(buf, "\r\n\r\n");
    size_t skip = 4;
    if (sep == NULL) {
        sep = strstr(buf, "\n\n");
        skip = 2;
    }
    int status = 0;
    if (sep == NULL || sscanf(buf, "HTTP/%*d.%*d %d", &status) != 1) {
        cli_errf(err, err_size, "not an HTTP response");
        return 1;
    }
    if (status != 200) {
        cli_errf(err, err_size, "HTTP status %d", status);
        return 1;
    }
    *sep = '\0';
    bool chunked = false;
    for (char *line = strchr(buf, '\n'); line; line = strchr(line + 1, '\n'))
        chunked = chunked || strncasecmp(line + 1, "transfer-encoding:", 18) == 0;
    chunked = chunked && strstr(buf, "chunked") != NULL;
    size_t body = (size_t)(sep - buf) + skip;
    memmove(buf, buf + body, *n - body);
    *n -= body;
    buf[*n] = '\0';
    if (chunked && !rd_dechunk(buf, n)) {
        cli_errf(err, err_size, "malformed chunked body");
        return 1;
    }
    return 0;
}

int rd_http_get(const char *url, int timeout_ms, size_t max_bytes, char **body, size_t *n,
                char *err, size_t err_size)
{
    char host[RD_NAME_MAX + 1], port[8];
    const char *path = NULL;
    if (rd_url_split(url, host, sizeof host, port, sizeof port, &path, err, err_size))
        return 1;
    int64_t deadline = rd_now_ms() + timeout_ms;
    int fd = rd_connect(host, port, deadline, err, err_size);
    if (fd < 0)
        return 1;
    char req[2 * RD_NAME_MAX + 128];
    int len =
        snprintf(req, sizeof req,
                 "GET %s HTTP/1.0\r\nHost: %s%s%s:%s\r\nAccept: text/plain\r\n"
                 "User-Agent: kvprefix-router\r\nConnection: close\r\n\r\n",
                 path, strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "", port);
    size_t sent = 0, cap = 0, got = 0;
    char *buf = NULL;
    int rc = 0;
    while (rc == 0 && sent < (size_t)len) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        ssize_t w = poll(&p, 1, rd_left_ms(deadline)) == 1
                        ? send(fd, req + sent, (size_t)len - sent, MSG_NOSIGNAL)
                        : -1;
        if (w < 0 && errno != EAGAIN) {
            cli_errf(err, err_size, "%s: cannot send the request (timeout or reset)", url);
            rc = 1;
        }
        sent += w > 0 ? (size_t)w : 0;
    }
    for (;;) {
        if (rc)
            break;
        if (!cli_grow((void **)&buf, &cap, got + 4097, 1)) {
            cli_errf(err, err_size, "out of memory");
            rc = 1;
            break;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, rd_left_ms(deadline)) != 1) {
            cli_errf(err, err_size, "%s: no complete answer within %d ms", url, timeout_ms);
            rc = 1;
            break;
        }
        ssize_t r = recv(fd, buf + got, 4096, 0);
        if (r == 0)
            break;
        if (r < 0 && errno != EAGAIN && errno != EINTR) {
            cli_errf(err, err_size, "%s: %s", url, strerror(errno));
            rc = 1;
        }
        got += r > 0 ? (size_t)r : 0;
        if (got > max_bytes + 4096) {
            cli_errf(err, err_size, "%s: the answer is above %zu bytes", url, max_bytes);
            rc = 1;
        }
    }
    close(fd);
    if (rc == 0) {
        buf[got] = '\0';
        rc = rd_response(buf, &got, err, err_size);
    }
    if (rc) {
        free(buf);
        return 1;
    }
    *body = buf;
    *n = got;
    return 0;
}

/* ---- the Prometheus text format ------------------------------------------------------- */

/* Series the scrape reads: name and the figure it gives (0 running, 1 waiting, 2 KV). */
static const struct {
    const char *name;
    int slot;
} rd_series[] = {
    {"vllm:num_requests_running", 0}, {"vllm:num_requests_waiting", 1},
    {"vllm:kv_cache_usage_perc", 2},  {"vllm:gpu_cache_usage_perc", 2},
    {"sglang:num_running_reqs", 0},   {"sglang:num_queue_reqs", 1},
    {"sglang:token_usage", 2},
};

/* Find label key's value in the label set lab[0 .. n) (between the braces), unescaped into
 * out. Returns false when absent or malformed. */
static bool rd_label_value(const char *lab, size_t n, const char *key, char *out, size_t cap)
{
    size_t klen = strlen(key), i = 0;
    while (i < n) {
        while (i < n && (lab[i] == ' ' || lab[i] == ','))
            i++;
        size_t name = i;
        while (i < n && lab[i] != '=')
            i++;
        bool match = i - name == klen && memcmp(lab + name, key, klen) == 0;
        if (i + 1 >= n || lab[i + 1] != '"')
            return false;
        i += 2;
        size_t k = 0;
        while (i < n && lab[i] != '"') {
            char c = lab[i];
            if (c == '\\' && i + 1 < n) {
                c = lab[++i] == 'n' ? '\n' : lab[i];
            }
            if (k + 1 < cap)
                out[k++] = c;
            i++;
        }
        out[k] = '\0';
        if (i >= n)
            return false;
        i++;
        if (match)
            return true;
    }
    return false;
}

size_t rd_scrape_parse(const char *text, size_t n, uint64_t dp_size, int64_t default_rank,
                       double *out, bool *found)
{
    bool have_kv[RD_SCRAPE_MAX_DP];
    size_t used = 0;
    if (dp_size > RD_SCRAPE_MAX_DP)
        dp_size = RD_SCRAPE_MAX_DP;
    for (uint64_t r = 0; r < dp_size; r++) {
        out[r * 3] = out[r * 3 + 1] = 0.0;
        out[r * 3 + 2] = -1.0;
        found[r] = false;
        have_kv[r] = false;
    }
    for (size_t pos = 0; pos < n;) {
        const char *line = text + pos;
        const char *nl = memchr(line, '\n', n - pos);
        size_t len = nl ? (size_t)(nl - line) : n - pos;
        pos += len + 1;
        if (len == 0 || line[0] == '#')
            continue;
        size_t name_len = 0;
        while (name_len < len && line[name_len] != '{' && line[name_len] != ' ')
            name_len++;
        int slot = -1;
        for (size_t s = 0; s < sizeof rd_series / sizeof rd_series[0] && slot < 0; s++)
            if (strlen(rd_series[s].name) == name_len &&
                memcmp(rd_series[s].name, line, name_len) == 0)
                slot = rd_series[s].slot;
        if (slot < 0)
            continue;
        int64_t rank = default_rank;
        size_t rest = name_len;
        if (rest < len && line[rest] == '{') {
            /* The label set ends at the first '}' outside a quoted value. */
            bool quoted = false;
            size_t close = rest + 1;
            for (; close < len && (quoted || line[close] != '}'); close++) {
                if (line[close] == '\\' && quoted)
                    close++;
                else if (line[close] == '"')
                    quoted = !quoted;
            }
            if (close >= len)
                continue;
            char v[32];
            uint64_t r = 0;
            if ((rd_label_value(line + rest + 1, close - rest - 1, "engine", v, sizeof v) ||
                 rd_label_value(line + rest + 1, close - rest - 1, "dp_rank", v, sizeof v)) &&
                cli_parse_uint(v, 65535, &r) == CLI_OK)
                rank = (int64_t)r;
            rest = close + 1;
        }
        char num[64];
        size_t a = rest;
        while (a < len && line[a] == ' ')
            a++;
        size_t b = a;
        while (b < len && line[b] != ' ' && line[b] != '\r')
            b++;
        if (b == a || b - a >= sizeof num)
            continue;
        memcpy(num, line + a, b - a);
        num[b - a] = '\0';
        char *end = NULL;
        double x = strtod(num, &end);
        if (*end != '\0' || !isfinite(x) || x < 0.0 || rank < 0 || (uint64_t)rank >= dp_size)
            continue;
        found[rank] = true;
        if (slot == 2 && !have_kv[rank]) {
            out[rank * 3 + 2] = 0.0;
            have_kv[rank] = true;
        }
        out[rank * 3 + slot] += x;
        used++;
    }
    for (uint64_t r = 0; r < dp_size; r++)
        if (out[r * 3 + 2] > 1.0)
            out[r * 3 + 2] = 1.0;
    return used;
}

/* ---- the thread ----------------------------------------------------------------------- */

/* Scrape source i once. */
static void rd_scrape_one(rd_scrape *s, size_t i)
{
    rd_daemon *d = s->d;
    const rd_source *src = &d->sources[i];
    int timeout =
        d->scrape_interval_ms < RD_SCRAPE_MAX_MS ? d->scrape_interval_ms : RD_SCRAPE_MAX_MS;
    char err[512];
    char *body = NULL;
    size_t n = 0;
    double figs[RD_SCRAPE_MAX_DP * 3];
    bool found[RD_SCRAPE_MAX_DP];
    uint64_t dp = src->dp_size ? src->dp_size : 1;
    if (rd_http_get(src->metrics, timeout, RD_SCRAPE_MAX_BYTES, &body, &n, err, sizeof err) == 0) {
        size_t used = rd_scrape_parse(body, n, dp, src->dp_rank, figs, found);
        free(body);
        if (used == 0)
            cli_errf(err, sizeof err,
                     "%s: none of vllm:num_requests_running/_waiting, "
                     "sglang:num_running_reqs/num_queue_reqs in the answer",
                     src->metrics);
        for (uint64_t r = 0; used && r < dp; r++)
            if (found[r])
                rd_load_set(d, src->engine, (int64_t)r, figs[r * 3], figs[r * 3 + 1],
                            figs[r * 3 + 2], RD_LOAD_SCRAPE);
        if (used) {
            if (s->failing[i])
                rd_logl(RD_LOG_INFO, "scrape: %s (engine %s) answers again", src->metrics,
                        src->engine);
            s->failing[i] = false;
            return;
        }
    }
    if (!s->failing[i])
        rd_logl(RD_LOG_WARN, "scrape: engine %s: %s (its load is unknown after --load-ttl)",
                src->engine, err);
    s->failing[i] = true;
}

static void *rd_scrape_run(void *arg)
{
    rd_scrape *s = arg;
    rd_daemon *d = s->d;
    pthread_mutex_lock(&s->lock);
    while (!s->stop) {
        pthread_mutex_unlock(&s->lock);
        int64_t t0 = rd_now_ms();
        for (size_t i = 0; i < d->n_sources; i++)
            if (d->sources[i].metrics)
                rd_scrape_one(s, i);
        int64_t next = t0 + d->scrape_interval_ms;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t wait = next - rd_now_ms();
        wait = wait > 0 ? wait : 0;
        ts.tv_sec += wait / 1000;
        ts.tv_nsec += (wait % 1000) * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_mutex_lock(&s->lock);
        while (!s->stop && pthread_cond_timedwait(&s->wake, &s->lock, &ts) == 0)
            ;
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

int rd_scrape_start(rd_daemon *d, char *err, size_t err_size)
{
    size_t n_targets = 0;
    for (size_t i = 0; i < d->n_sources; i++)
        n_targets += d->sources[i].metrics != NULL;
    if (n_targets == 0)
        return 0;
    rd_scrape *s = calloc(1, sizeof *s);
    bool *failing = calloc(d->n_sources, sizeof *failing);
    if (s == NULL || failing == NULL) {
        free(s);
        free(failing);
        cli_errf(err, err_size, "out of memory");
        return 1;
    }
    s->d = d;
    s->failing = failing;
    pthread_mutex_init(&s->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->wake, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&s->thread, NULL, rd_scrape_run, s) != 0) {
        pthread_cond_destroy(&s->wake);
        pthread_mutex_destroy(&s->lock);
        free(failing);
        free(s);
        cli_errf(err, err_size, "cannot start the scrape thread");
        return 1;
    }
    d->scraper = s;
    rd_logl(RD_LOG_INFO, "scrape: %zu engine metrics endpoint(s) every %d ms", n_targets,
            d->scrape_interval_ms);
    return 0;
}

void rd_scrape_stop(rd_daemon *d)
{
    rd_scrape *s = d->scraper;
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->lock);
    s->stop = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->lock);
    free(s->failing);
    free(s);
    d->scraper = NULL;
}
