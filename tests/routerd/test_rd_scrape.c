/*
 * test_rd_scrape.c - the router daemon's Prometheus parser and HTTP client (rd_scrape.c)
 * against hostile and unusual input: what a scrape reads from an engine it does not trust.
 * The parser must take exactly the needed series by rank, skip everything else, and never
 * read past the text; the client must refuse what is not a 200 answer within its bounds.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include "routerd.h"

/* Parse text for dp ranks; returns the samples used. */
static size_t parse(const char *text, uint64_t dp, double *out, bool *found)
{
    return rd_scrape_parse(text, strlen(text), dp, 0, out, found);
}

Test(rd_scrape, vllm_series_by_rank)
{
    const char *text =
        "# HELP vllm:num_requests_running Number of requests.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n"
        "vllm:num_requests_running{model_name=\"m\",engine=\"1\"} 5\n"
        "vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 2e0 1700000000000\n"
        "vllm:num_requests_waiting{engine=\"1\",model_name=\"other\"} 1\n"
        "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n"
        "vllm:num_requests_running_total{engine=\"0\"} 99\n"  /* another name */
        "vllm:num_requests_runnin{engine=\"0\"} 99\n"         /* a prefix of the name */
        "vllm:prompt_tokens_total{model_name=\"m\"} 12345\n"; /* no newline after the last: ok */
    double out[6];
    bool found[2];
    cr_assert_eq(parse(text, 2, out, found), 5);
    cr_assert(found[0] && found[1]);
    cr_assert(out[0] == 3.0 && out[1] == 0.0 && out[2] == 0.25);
    cr_assert(out[3] == 5.0 && out[4] == 3.0 && out[5] == -1.0, "%g %g %g", out[3], out[4], out[5]);
}

Test(rd_scrape, sglang_series_and_default_rank)
{
    const char *text = "sglang:num_running_reqs{model_name=\"m\"} 4\n"
                       "sglang:num_queue_reqs 6\r\n"
                       "sglang:token_usage{dp_rank=\"0\"} 2.5\n"; /* clamped to 1 */
    double out[3];
    bool found[1];
    cr_assert_eq(rd_scrape_parse(text, strlen(text), 1, 0, out, found), 3);
    cr_assert(found[0] && out[0] == 4.0 && out[1] == 6.0 && out[2] == 1.0);
}

Test(rd_scrape, hostile_lines_are_skipped)
{
    const char *text =
        "vllm:num_requests_running{engine=\"0\"} -1\n"                   /* negative */
        "vllm:num_requests_running{engine=\"0\"} NaN\n"                  /* not finite */
        "vllm:num_requests_running{engine=\"0\"} +Inf\n"                 /* not finite */
        "vllm:num_requests_running{engine=\"7\"} 1\n"                    /* rank >= dp */
        "vllm:num_requests_running{engine=\"0\"} 1x\n"                   /* junk after */
        "vllm:num_requests_running{engine=\"0\"\n"                       /* no brace */
        "vllm:num_requests_running{engine=\"0} 1\n"                      /* open quote */
        "vllm:num_requests_running{a=\"}\\\"{\",engine=\"0\"} 2\n"       /* braces quoted */
        "vllm:num_requests_running{engine=\"99999999999999999999\"} 1\n" /* rank overflow */
        "vllm:num_requests_running \n"                                   /* no value */
        "\n\n#\n";
    double out[3];
    bool found[1];
    /* Only the quoted-braces line counts; the overflowing rank falls back to rank 0. */
    size_t used = parse(text, 1, out, found);
    cr_assert_eq(used, 2, "%zu", used);
    cr_assert(found[0] && out[0] == 3.0, "%g", out[0]);
    /* Nothing at all. */
    cr_assert_eq(parse("", 1, out, found), 0);
    cr_assert(!found[0] && out[0] == 0.0 && out[2] == -1.0);
    /* A text cut in the middle of a name is read only up to its length. */
    const char *cut = "vllm:num_requests_running 5\n";
    cr_assert_eq(rd_scrape_parse(cut, 10, 1, 0, out, found), 0);
}

/* A one-shot HTTP server on a loopback port: answers the first connection with reply. */
typedef struct srv {
    int fd;
    const char *reply;
    size_t n;
} srv;

static void *serve(void *arg)
{
    srv *s = arg;
    int c = accept(s->fd, NULL, NULL);
    char buf[2048];
    if (c >= 0) {
        (void)!read(c, buf, sizeof buf);
        (void)!write(c, s->reply, s->n);
        close(c);
    }
    return NULL;
}

/* GET http://127.0.0.1:PORT/metrics against reply; returns rd_http_get's status. */
static int get(const char *reply, char **body, size_t *n, char *err, size_t err_size)
{
    srv s = {.fd = socket(AF_INET, SOCK_STREAM, 0), .reply = reply, .n = strlen(reply)};
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(bind(s.fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(s.fd, 1) == 0);
    cr_assert(getsockname(s.fd, (struct sockaddr *)&a, &len) == 0);
    pthread_t t;
    pthread_create(&t, NULL, serve, &s);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%u/metrics", (unsigned)ntohs(a.sin_port));
    int rc = rd_http_get(url, 2000, 1 << 20, body, n, err, err_size);
    pthread_join(t, NULL);
    close(s.fd);
    return rc;
}

Test(rd_scrape, http_get)
{
    char *body = NULL, err[256];
    size_t n = 0;
    cr_assert_eq(
        get("HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nx 1\n", &body, &n, err, sizeof err),
        0, "%s", err);
    cr_assert(n == 4 && strcmp(body, "x 1\n") == 0);
    free(body);
    cr_assert_eq(get("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nx 1\r\n1\r\n\n\r\n"
                     "0\r\n\r\n",
                     &body, &n, err, sizeof err),
                 0, "%s", err);
    cr_assert(n == 4 && strcmp(body, "x 1\n") == 0, "%zu '%s'", n, body);
    free(body);
    cr_assert_neq(get("HTTP/1.0 500 Oops\r\n\r\n", &body, &n, err, sizeof err), 0);
    cr_assert(strstr(err, "500") != NULL, "%s", err);
    cr_assert_neq(get("SSH-2.0-OpenSSH\r\n", &body, &n, err, sizeof err), 0);
    cr_assert_neq(get("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", &body, &n, err,
                      sizeof err),
                  0);
    cr_assert_neq(rd_http_get("https://x/metrics", 100, 10, &body, &n, err, sizeof err), 0);
    cr_assert_neq(rd_http_get("http://127.0.0.1:0/", 100, 10, &body, &n, err, sizeof err), 0);
    cr_assert_neq(rd_http_get("http://[::1/", 100, 10, &body, &n, err, sizeof err), 0);
}
