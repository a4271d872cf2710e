/*
 * bench_routerd.c - the router daemon's /score end to end, over loopback with keep-alive,
 * against the targets (p50 <= 0.3 ms, p99 <= 1 ms for an 8k-token prompt with 64
 * workers and 1M blocks indexed; the daemon's own time within 3x of bench_router's index
 * time).
 *
 * Setup. Starts `kvprefix router --engine '*=ipc://DIR/ev,bind' --port 0` (token mode, the
 * default) as a child, and feeds it over one PUB socket the workload of bench_router (b):
 * 128 prompts of 128k random tokens, prompt p stored whole on worker p % 64 and its first
 * half on worker (p + 17) % 64, as BlockStored events of 512 blocks chained by their parent
 * (topic kv@wNN@m: one worker per pod, model "m"): 1,048,576 blocks, 1.5 holders per block.
 * It waits until /metrics shows every holder indexed.
 *
 * Measure. One client connection (plain sockets, HTTP/1.1 keep-alive, Nagle off) asks
 * /score for the first 8k tokens of stored prompts (512 blocks cached on 2 workers; each
 * answer is checked to rank a worker with 512 blocks first), CALLS times per run, in two
 * encodings: JSON ({"tokens": [...], "model": "m"}, 49 KB) and binary (application/
 * octet-stream, 32 KB of little-endian uint32, ?model=m). Per run: p50 and p99 of the
 * client's time from the first byte written to the last byte read; the daemon's own mean
 * time per score from kvprefix_router_score_seconds_sum/_count around the run (wall time
 * inside the handler: preemption on a shared machine counts), and the daemon's CPU time per
 * score, every thread, kernel included (receiving and sending too), from
 * /proc/PID/task/TID/schedstat around the run. Reported: the median over RUNS runs of each
 * figure.
 *
 * With --tokenizer=FILE (a rank file as replay's --tokenizer takes it) the daemon is started
 * with --tokenizer FILE and a third encoding is measured: prompts as text, a chat body
 * {"model": "m", "messages": [system, user]} of 48 KB (pseudo-random words; 8k tokens with
 * Llama 3's tokenizer), whose ids (`kvprefix tokenize` of the same body: replay's path) were
 * stored on a worker first, so each answer ranks that worker first with every full block
 * cached, as the JSON answers do; the difference of the daemon's own time is the cost of
 * parsing, rendering and tokenizing the text.
 *
 * The daemon's log goes to /dev/null unless BENCH_ROUTERD_LOG is set.
 *
 * Usage: bench_routerd [runs] [--calls=N] [--kvprefix=PATH] [--tokenizer=FILE]
 *   runs        runs per figure, 1..16 (default 5)
 *   --calls=N   scores per run and encoding (default 2000)
 *   --kvprefix  the binary (default: the one built beside this program)
 *   --tokenizer a rank file: also measure text prompts
 */
#define _GNU_SOURCE /* strcasestr */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <zmq.h>

#define BENCH_PROG "bench_routerd"
#include "benchutil.h"
#include "kvprefix_events.h"

#ifndef KVP_BENCH_KVPREFIX
#define KVP_BENCH_KVPREFIX "kvprefix"
#endif

#define N_WORKERS     64
#define N_PROMPTS     128
#define PROMPT_BLOCKS 8192
#define BS            16
#define CHUNK_BLOCKS  512
#define QUERY_TOKENS  8192

/* Token i of prompt p: a fixed pseudo-random id (splitmix64). */
static uint32_t tok(uint32_t p, uint32_t i)
{
    uint64_t z = ((uint64_t)p << 32 | i) + 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return (uint32_t)((z ^ (z >> 31)) % 150000u);
}

/* The daemon: its pid, HTTP port and stdout. */
static pid_t child;
static int http_port;

static void start_daemon(const char *exe, const char *ep, const char *tokenizer)
{
    int out[2];
    if (pipe(out) != 0)
        exit(1);
    char engine[256];
    snprintf(engine, sizeof engine, "*=%s,bind", ep);
    child = fork();
    if (child == 0) {
        dup2(out[1], 1);
        close(out[0]);
        if (getenv("BENCH_ROUTERD_LOG") == NULL && freopen("/dev/null", "w", stderr) == NULL)
            _exit(127);
        if (tokenizer)
            execl(exe, exe, "router", "--engine", engine, "--port", "0", "--http-threads", "2",
                  "--tokenizer", tokenizer, (char *)NULL);
        else
            execl(exe, exe, "router", "--engine", engine, "--port", "0", "--http-threads", "2",
                  (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    FILE *f = fdopen(out[0], "r");
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *p = strstr(line, "http://127.0.0.1:");
        if (p) {
            http_port = atoi(p + strlen("http://127.0.0.1:"));
            return;
        }
    }
    fprintf(stderr, "bench_routerd: the daemon did not start (%s)\n", exe);
    exit(1);
}

/* One keep-alive HTTP connection. */
typedef struct conn {
    int fd;
    char *buf; /* response bytes */
    size_t cap;
} conn;

static void conn_open(conn *c)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)http_port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        perror("bench_routerd: connect");
        exit(1);
    }
    if (c->buf == NULL) {
        c->cap = 1 << 20;
        c->buf = xmalloc(c->cap);
    }
}

static void write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) {
            perror("bench_routerd: write");
            exit(1);
        }
        p += w;
        n -= (size_t)w;
    }
}

/* Send head + body, read the whole answer. Returns the status; *body points into c->buf. */
static int roundtrip(conn *c, const char *head, size_t head_n, const char *body, size_t body_n,
                     const char **out, size_t *out_n)
{
    write_all(c->fd, head, head_n);
    if (body_n)
        write_all(c->fd, body, body_n);
    size_t n = 0;
    char *end = NULL;
    long clen = -1;
    for (;;) {
        ssize_t r = read(c->fd, c->buf + n, c->cap - n - 1);
        if (r <= 0) {
            fprintf(stderr, "bench_routerd: the daemon closed the connection\n");
            kill(child, SIGTERM);
            exit(1);
        }
        n += (size_t)r;
        c->buf[n] = '\0';
        if (end == NULL && (end = strstr(c->buf, "\r\n\r\n")) != NULL) {
            char *cl = strcasestr(c->buf, "content-length:");
            clen = cl && cl < end ? atol(cl + 15) : 0;
        }
        if (end && n >= (size_t)(end + 4 - c->buf) + (size_t)clen)
            break;
    }
    *out = end + 4;
    *out_n = (size_t)clen;
    int status = atoi(c->buf + 9);
    /* A daemon that closes after its answer (libmicrohttpd does when an answer is queued
     * before the request was read whole, as kvprefix's daemon did for GETs before issue
     * 22): the next request gets a new connection, and the answer stays in c->buf. */
    char *cl = strcasestr(c->buf, "connection: close");
    if (cl && cl < end) {
        close(c->fd);
        conn_open(c);
    }
    return status;
}

static int get(conn *c, const char *path, const char **out, size_t *out_n)
{
    char head[256];
    int n = snprintf(head, sizeof head, "GET %s HTTP/1.1\r\nHost: b\r\n\r\n", path);
    return roundtrip(c, head, (size_t)n, NULL, 0, out, out_n);
}

/* A sample's value from /metrics (the first line starting with name and a space). */
static double metric(conn *c, const char *name)
{
    const char *b;
    size_t n;
    if (get(c, "/metrics", &b, &n) != 200)
        return -1;
    size_t len = strlen(name);
    for (const char *p = b; p && p < b + n; p = strchr(p, '\n')) {
        if (*p == '\n')
            p++;
        if (strncmp(p, name, len) == 0 && p[len] == ' ')
            return atof(p + len + 1);
    }
    return -1;
}

/* CPU time (ns) of every thread of the daemon so far: the first field of each
 * /proc/PID/task/TID/schedstat (time on a CPU, user and kernel). */
static double daemon_cpu_ns(void)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)child);
    DIR *dir = opendir(path);
    double sum = 0;
    struct dirent *e;
    while (dir && (e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char f[384];
        snprintf(f, sizeof f, "%s/%s/schedstat", path, e->d_name);
        FILE *fp = fopen(f, "r");
        unsigned long long on_cpu = 0;
        if (fp && fscanf(fp, "%llu", &on_cpu) == 1)
            sum += (double)on_cpu;
        if (fp)
            fclose(fp);
    }
    if (dir)
        closedir(dir);
    return sum;
}

/* Store blocks [from, to) of prompt p on worker w (one event per CHUNK_BLOCKS); the tokens
 * are ids[] when given (to blocks of them), else tok(p, i). */
static uint64_t seqs[N_WORKERS];
static double stamp; /* every batch's ts: the wall clock at start */
static void store_ids(void *pub, int w, uint32_t p, uint32_t to, const uint32_t *ids)
{
    static uint32_t tokens[CHUNK_BLOCKS * BS];
    static uint64_t hashes[CHUNK_BLOCKS];
    char topic[32];
    int tn = snprintf(topic, sizeof topic, "kv@w%02d@m", w);
    for (uint32_t b0 = 0; b0 < to; b0 += CHUNK_BLOCKS) {
        for (uint32_t k = 0; k < CHUNK_BLOCKS; k++) {
            hashes[k] = ((uint64_t)(p + 1) << 32) | (b0 + k + 1);
            for (uint32_t t = 0; t < BS; t++)
                tokens[k * BS + t] = ids ? ids[(b0 + k) * BS + t] : tok(p, (b0 + k) * BS + t);
        }
        kvp_kv_event ev = {.type = KVP_EVENT_STORED,
                           .hashes = hashes,
                           .n_hashes = CHUNK_BLOCKS,
                           .has_parent = b0 > 0,
                           .parent = ((uint64_t)(p + 1) << 32) | b0,
                           .tokens = tokens,
                           .n_tokens = CHUNK_BLOCKS * BS,
                           .block_size = BS,
                           .medium = "GPU",
                           .group_idx = -1};
        kvp_kv_batch batch = {.ts = stamp, .events = &ev, .n_events = 1};
        if (to - b0 < CHUNK_BLOCKS) {
            ev.n_hashes = to - b0;
            ev.n_tokens = (to - b0) * BS;
        }
        uint8_t *buf = NULL;
        size_t n = 0;
        check(kvp_kv_encode_alloc(&batch, KVP_KV_FORM_ARRAY, &buf, &n), "encode");
        uint8_t seq[8];
        for (int i = 0; i < 8; i++)
            seq[i] = (uint8_t)(seqs[w] >> (56 - 8 * i));
        seqs[w]++;
        zmq_send(pub, topic, (size_t)tn, ZMQ_SNDMORE);
        zmq_send(pub, seq, 8, ZMQ_SNDMORE);
        zmq_send(pub, buf, n, 0);
        kvp_kv_buf_free(buf);
    }
}

static void store(void *pub, int w, uint32_t p, uint32_t to)
{
    store_ids(pub, w, p, to, NULL);
}

/* The JSON and binary requests for prompt p (heads and bodies, written once). */
typedef struct req {
    char *head, *body;
    size_t head_n, body_n;
} req;

static void make_reqs(uint32_t p, req *json, req *bin)
{
    json->body = xmalloc(QUERY_TOKENS * 12 + 64);
    size_t n = (size_t)sprintf(json->body, "{\"model\":\"m\",\"tokens\":[");
    for (uint32_t i = 0; i < QUERY_TOKENS; i++)
        n += (size_t)sprintf(json->body + n, i ? ",%u" : "%u", tok(p, i));
    n += (size_t)sprintf(json->body + n, "]}");
    json->body_n = n;
    json->head = xmalloc(256);
    json->head_n = (size_t)sprintf(json->head,
                                   "POST /score HTTP/1.1\r\nHost: b\r\nContent-Type: "
                                   "application/json\r\nContent-Length: %zu\r\n\r\n",
                                   n);
    bin->body = xmalloc(QUERY_TOKENS * 4);
    for (uint32_t i = 0; i < QUERY_TOKENS; i++) {
        uint32_t t = tok(p, i);
        for (int k = 0; k < 4; k++)
            bin->body[4 * i + k] = (char)(t >> (8 * k));
    }
    bin->body_n = QUERY_TOKENS * 4;
    bin->head = xmalloc(256);
    bin->head_n = (size_t)sprintf(bin->head,
                                  "POST /score?model=m HTTP/1.1\r\nHost: b\r\nContent-Type: "
                                  "application/octet-stream\r\nContent-Length: %zu\r\n\r\n",
                                  bin->body_n);
}

/* A text request (a chat body of about 8k tokens of pseudo-random words, variant v) and its
 * ids by `kvprefix tokenize` (replay's path) into *ids / *n_ids (malloc'ed). */
static void make_text(const char *exe, const char *tokenizer, const char *dir, uint32_t v, req *q,
                      uint32_t **ids, size_t *n_ids)
{
    static const char *const words[] = {
        "the",     "cache",  "router",  "prefix",  "block",  "token", "model",  "engine", "request",
        "latency", "worker", "score",   "serve",   "memory", "batch", "prompt", "answer", "load",
        "index",   "hash",   "quickly", "because", "while",  "every", "other"};
    size_t cap = 64 << 10, n = 0;
    q->body = xmalloc(cap + 256);
    n += (size_t)sprintf(q->body,
                         "{\"model\":\"m\",\"messages\":[{\"role\":\"system\","
                         "\"content\":\"You are a helpful assistant.\"},{\"role\":"
                         "\"user\",\"content\":\"Variant %u:",
                         v);
    uint64_t z = 0x9e3779b97f4a7c15u * (v + 1);
    while (n < 48000) {
        z ^= z << 13;
        z ^= z >> 7;
        z ^= z << 17;
        n += (size_t)sprintf(q->body + n, " %s%s", words[z % 25], z % 11 == 0 ? "." : "");
    }
    n += (size_t)sprintf(q->body + n, "\"}]}");
    q->body_n = n;
    q->head = xmalloc(256);
    q->head_n = (size_t)sprintf(q->head,
                                "POST /score HTTP/1.1\r\nHost: b\r\nContent-Type: "
                                "application/json\r\nContent-Length: %zu\r\n\r\n",
                                n);
    char path[256], cmd[1024];
    snprintf(path, sizeof path, "%s/text%u.json", dir, v);
    FILE *f = fopen(path, "w");
    if (f == NULL || fwrite(q->body, 1, n, f) != n || fclose(f) != 0)
        exit(1);
    snprintf(cmd, sizeof cmd, "'%s' tokenize --tokenizer '%s' '%s'", exe, tokenizer, path);
    FILE *p = popen(cmd, "r");
    size_t cap_ids = 1 << 16;
    *ids = xmalloc(cap_ids * sizeof **ids);
    *n_ids = 0;
    unsigned long id;
    while (p && *n_ids < cap_ids && fscanf(p, "%lu", &id) == 1)
        (*ids)[(*n_ids)++] = (uint32_t)id;
    if (p == NULL || pclose(p) != 0 || *n_ids < BS) {
        fprintf(stderr, "bench_routerd: kvprefix tokenize failed on %s\n", path);
        exit(1);
    }
    unlink(path);
}

int main(int argc, char **argv)
{
    int runs = 5, calls = 2000;
    const char *exe = KVP_BENCH_KVPREFIX, *tokenizer = NULL;
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--tokenizer=", 12) == 0)
            tokenizer = argv[i] + 12;
        else if (strncmp(argv[i], "--calls=", 8) == 0)
            calls = atoi(argv[i] + 8);
        else if (strncmp(argv[i], "--kvprefix=", 11) == 0)
            exe = argv[i] + 11;
        else
            runs = atoi(argv[i]);
    }
    if (runs < 1 || runs > 16 || calls < 10) {
        fprintf(stderr, "usage: bench_routerd [runs 1..16] [--calls=N>=10] [--kvprefix=PATH] "
                        "[--tokenizer=FILE]\n");
        return 2;
    }
    char dir[] = "/tmp/bench_routerd.XXXXXX";
    if (mkdtemp(dir) == NULL)
        return 1;
    char ep[128];
    snprintf(ep, sizeof ep, "ipc://%s/ev", dir);
    start_daemon(exe, ep, tokenizer);
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    stamp = (double)wall.tv_sec + (double)wall.tv_nsec * 1e-9;

    /* Step 1: feed the index (the PUB must have the daemon's subscription first). */
    void *ctx = zmq_ctx_new();
    void *pub = zmq_socket(ctx, ZMQ_PUB);
    int zero = 0;
    zmq_setsockopt(pub, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_connect(pub, ep);
    conn c = {0};
    conn_open(&c);
    uint64_t t0 = now_ns();
    while (metric(&c, "kvprefix_router_workers") < 1) {
        seqs[0] = 0;
        store(pub, 0, 0, CHUNK_BLOCKS); /* repeats are DUPLICATEs (same number and stamp) */
        usleep(50000);
    }
    memset(seqs, 0, sizeof seqs);
    for (uint32_t p = 0; p < N_PROMPTS; p++) {
        store(pub, (int)(p % N_WORKERS), p, PROMPT_BLOCKS);
        store(pub, (int)((p + 17) % N_WORKERS), p, PROMPT_BLOCKS / 2);
    }
    double want = (double)N_PROMPTS * PROMPT_BLOCKS * 3 / 2;
    enum { N_T = 4 };
    req tx[N_T];
    char tx_want[N_T][40];
    size_t tx_tokens = 0;
    for (uint32_t v = 0; tokenizer && v < N_T; v++) {
        uint32_t *ids;
        size_t n_ids;
        make_text(exe, tokenizer, dir, v, &tx[v], &ids, &n_ids);
        uint32_t blocks = (uint32_t)(n_ids / BS);
        store_ids(pub, (int)(v * 5 % N_WORKERS), N_PROMPTS + v, blocks, ids);
        want += blocks;
        tx_tokens += n_ids;
        snprintf(tx_want[v], sizeof tx_want[v], "\"blocks\":%u,", blocks);
        free(ids);
    }
    while (metric(&c, "kvprefix_router_index_holders") < want) {
        if (now_ns() - t0 > 300 * 1000000000ull) {
            fprintf(stderr,
                    "bench_routerd: the index holds %.0f of %.0f (block, worker) pairs "
                    "after 300 s\n",
                    metric(&c, "kvprefix_router_index_holders"), want);
            kill(child, SIGTERM);
            return 1;
        }
        usleep(100000);
    }
    printf("bench_routerd: %d workers, %.0f blocks, %.0f holders indexed in %.1f s; %d runs of "
           "%d scores, 8k-token prompts, one keep-alive connection\n",
           (int)metric(&c, "kvprefix_router_workers"), metric(&c, "kvprefix_router_index_blocks"),
           want, (double)(now_ns() - t0) * 1e-9, runs, calls);

    /* Step 2: score, each encoding in turn. */
    enum { N_Q = 16 };
    req js[N_Q], bn[N_Q];
    for (int i = 0; i < N_Q; i++)
        make_reqs((uint32_t)(i * 7 % N_PROMPTS), &js[i], &bn[i]);
    double *lat = xmalloc((size_t)calls * sizeof *lat);
    static const char *const names[] = {"json", "binary", "text"};
    for (int e = 0; e < (tokenizer ? 3 : 2); e++) {
        double p50[16], p99[16], own[16], cpu[16];
        for (int r = 0; r < runs; r++) {
            double s0 = metric(&c, "kvprefix_router_score_seconds_sum");
            double n0 = metric(&c, "kvprefix_router_score_seconds_count");
            double c0 = daemon_cpu_ns();
            for (int k = 0; k < calls; k++) {
                const req *q = e == 0 ? &js[k % N_Q] : e == 1 ? &bn[k % N_Q] : &tx[k % N_T];
                const char *b;
                size_t bn_;
                uint64_t a = now_ns();
                int st = roundtrip(&c, q->head, q->head_n, q->body, q->body_n, &b, &bn_);
                lat[k] = (double)(now_ns() - a) * 1e-3;
                if (st != 200 || strstr(b, e == 2 ? tx_want[k % N_T] : "\"blocks\":512") == NULL) {
                    fprintf(stderr, "bench_routerd: unexpected answer %d: %.200s\n", st, b);
                    kill(child, SIGTERM);
                    return 1;
                }
            }
            double c1 = daemon_cpu_ns();
            double s1 = metric(&c, "kvprefix_router_score_seconds_sum");
            double n1 = metric(&c, "kvprefix_router_score_seconds_count");
            qsort(lat, (size_t)calls, sizeof *lat, bench_cmp_double);
            p50[r] = lat[calls / 2];
            p99[r] = lat[(size_t)calls * 99 / 100];
            own[r] = (s1 - s0) / (n1 - n0) * 1e6;
            cpu[r] = (c1 - c0) / calls * 1e-3;
        }
        printf("  %-6s  end to end p50 %7.1f us  p99 %7.1f us   daemon's own time per score "
               "(mean) %6.1f us, its CPU per score (all threads, kernel included) %6.1f us\n",
               names[e], bench_median(p50, runs), bench_median(p99, runs), bench_median(own, runs),
               bench_median(cpu, runs));
    }
    if (tokenizer)
        printf("  (text: chat bodies of %zu tokens on average, %zu bytes)\n", tx_tokens / N_T,
               tx[0].body_n);
    kill(child, SIGTERM);
    waitpid(child, NULL, 0);
    zmq_close(pub);
    zmq_ctx_term(ctx);
    char path[160];
    snprintf(path, sizeof path, "%s/ev", dir);
    unlink(path);
    rmdir(dir);
    return 0;
}
