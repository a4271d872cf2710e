/*
 * route_index_none.c - the router index of `kvprefix route` in a build without
 * libkvprefix-events (meson found no libzmq or msgpack-c): only --index oracle exists, and
 * route.c refuses the others before anything runs (rt_index_available). These definitions
 * keep the simulation's calls linkable; none of them is reached.
 */
#include "route.h"

bool rt_index_available(void)
{
    return false;
}

int rt_index_new(const rt_index_config *cfg, uint32_t n_replicas, uint32_t block_size,
                 rt_index **out, char *err, size_t err_size)
{
    (void)cfg;
    (void)n_replicas;
    (void)block_size;
    (void)out;
    snprintf(err, err_size, "this kvprefix was built without libkvprefix-events: no --index %s",
             rt_index_name(cfg->mode));
    return RT_EINPUT;
}

void rt_index_attach(rt_index *x, uint32_t r, kvp_config *kc)
{
    (void)x;
    (void)r;
    (void)kc;
}

int rt_index_step(rt_index *x, rt_time now, char *err, size_t err_size)
{
    (void)x;
    (void)now;
    snprintf(err, err_size, "no router index in this build");
    return RT_EINTERNAL;
}

int rt_index_sync(rt_index *x, rt_time now, char *err, size_t err_size)
{
    (void)x;
    (void)now;
    snprintf(err, err_size, "no router index in this build");
    return RT_EINTERNAL;
}

/* The signature is route.h's, whose outputs this stand-in never writes. */
/* NOLINTBEGIN(readability-non-const-parameter) */
int rt_index_score(rt_index *x, const kvp_key *keys, uint32_t n_keys, uint32_t *cached,
                   uint64_t *ns, char *err, size_t err_size)
{
    (void)ns;
    (void)x;
    (void)keys;
    (void)n_keys;
    (void)cached;
    snprintf(err, err_size, "no router index in this build");
    return RT_EINTERNAL;
}
/* NOLINTEND(readability-non-const-parameter) */

int rt_index_stats_get(rt_index *x, rt_index_stats *st)
{
    (void)x;
    (void)st;
    return RT_EINTERNAL;
}

bool rt_index_check(rt_index *x)
{
    (void)x;
    return false;
}

void rt_index_free(rt_index *x)
{
    (void)x;
}
