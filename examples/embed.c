/*
 * embed.c - the README's embedding example as a program that runs: an engine loop that
 * serves two requests sharing a system prompt through the request lifecycle
 * (acquire -> prefill -> commit -> decode with grow/commit -> release) and prints what the
 * second request reused. Built and run by the test suite, so the README stays true.
 */
#include <stdio.h>

#include <kvprefix.h>

#define PROMPT_LEN 100
#define MAX_NEW    20

static int check(int rc, const char *what)
{
    if (rc != KVP_OK)
        fprintf(stderr, "embed: %s: %s\n", what, kvp_strerror(rc));
    return rc;
}

/* Serve one request: prompt[0 .. n_prompt) then MAX_NEW generated tokens. */
static int serve(kvp_cache *cache, uint64_t req_id, const kvp_namespace *ns, uint32_t *tokens,
                 size_t n_prompt, kvp_match *m)
{
    if (check(kvp_acquire(cache, req_id, ns, tokens, n_prompt, n_prompt + MAX_NEW, m), "acquire"))
        return 1;
    const uint32_t *blocks;
    size_t n_blocks;
    if (check(kvp_request_blocks(cache, req_id, &blocks, &n_blocks), "request_blocks"))
        return 1;
    /* The engine would prefill tokens m->n_tokens_hit .. n_prompt into blocks[] here. */
    if (check(kvp_commit(cache, req_id, tokens, n_prompt, NULL), "commit"))
        return 1;
    for (size_t n = n_prompt + 1; n <= n_prompt + MAX_NEW; n++) {
        tokens[n - 1] = 7000 + (uint32_t)n; /* one decode step writes one token */
        if (check(kvp_commit(cache, req_id, tokens, n, NULL), "commit (decode)"))
            return 1;
    }
    return check(kvp_release(cache, req_id), "release") != KVP_OK;
}

int main(void)
{
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = 1024;
    cfg.block_size = 16;
    kvp_cache *cache;
    if (check(kvp_cache_new(&cfg, &cache), "cache_new"))
        return 1;

    kvp_namespace ns;
    kvp_namespace_init(&ns);
    ns.model = kvp_field_str("llama-3.1-8b");
    ns.tenant = kvp_field_str("acme");

    uint32_t a[PROMPT_LEN + MAX_NEW], b[PROMPT_LEN + MAX_NEW];
    for (size_t i = 0; i < PROMPT_LEN; i++)
        a[i] = b[i] = 1000 + (uint32_t)i; /* a 64-token shared system prompt, then ... */
    for (size_t i = 64; i < PROMPT_LEN; i++)
        b[i] = 5000 + (uint32_t)i; /* ... a different question */

    kvp_match m1, m2;
    int rc = serve(cache, 1, &ns, a, PROMPT_LEN, &m1) || serve(cache, 2, &ns, b, PROMPT_LEN, &m2);
    if (rc == 0) {
        printf("request 1 reused %llu of %d prompt tokens\n", (unsigned long long)m1.n_tokens_hit,
               PROMPT_LEN);
        printf("request 2 reused %llu of %d prompt tokens (the shared 64-token prefix)\n",
               (unsigned long long)m2.n_tokens_hit, PROMPT_LEN);
        rc = m1.n_tokens_hit != 0 || m2.n_tokens_hit != 64;
    }
    kvp_cache_free(cache);
    return rc;
}
