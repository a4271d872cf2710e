/*
 * fleet_index_none.c - the router index of `kvprefix fleet` in a build without
 * libkvprefix-events (meson found no libzmq or msgpack-c): only --index oracle exists, and
 * fleet.c refuses the others before anything runs (fl_index_available). These definitions
 * keep the simulation's calls linkable; none of them is reached.
 */
#include "fleet.h"

bool fl_index_available(void)
{
    return false;
}

int fl_index_new(const fl_index_config *cfg, uint32_t n_replicas, uint32_t block_size,
                 fl_index **out, char *err, size_t err_size)
{
    (void)cfg;
    (void)n_replicas;
    (void)block_size;
    (void)out;
    snprintf(err, err_size, "this kvprefix was built without libkvprefix-events: no --index %s",
             fl_index_name(cfg->mode));
    return FL_EINPUT;
}

void fl_index_attach(fl_index *x, uint32_t r, kvp_config *kc)
{
    (void)x;
    (void)r;
    (void)kc;
}

int fl_index_step(fl_index *x, fl_time now, char *err, size_t err_size)
{
    (void)x;
    (void)now;
    snprintf(err, err_size, "no router index in this build");
    return FL_EINTERNAL;
}

int fl_index_sync(fl_index *x, fl_time now, char *err, size_t err_size)
{
    (void)x;
    (void)now;
    snprintf(err, err_size, "no router index in this build");
    return FL_EINTERNAL;
}

/* The signature is fleet.h's, whose outputs this stand-in never writes. */
/* NOLINTBEGIN(readability-non-const-parameter) */
int fl_index_score(fl_index *x, const kvp_key *keys, uint32_t n_keys, uint32_t *cached,
                   uint64_t *ns, char *err, size_t err_size)
{
    (void)ns;
    (void)x;
    (void)keys;
    (void)n_keys;
    (void)cached;
    snprintf(err, err_size, "no router index in this build");
    return FL_EINTERNAL;
}
/* NOLINTEND(readability-non-const-parameter) */

int fl_index_stats_get(fl_index *x, fl_index_stats *st)
{
    (void)x;
    (void)st;
    return FL_EINTERNAL;
}

bool fl_index_check(fl_index *x)
{
    (void)x;
    return false;
}

void fl_index_free(fl_index *x)
{
    (void)x;
}
