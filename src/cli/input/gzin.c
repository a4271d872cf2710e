/*
 * gzin.c - plain or gzip input from a file descriptor, with trailing data after the last
 * member reported (see gzin.h).
 *
 * Layout. in[in_pos, in_len) holds raw bytes read but not yet used. Plain input is copied
 * out of it; gzip input is inflated from it (z.next_in points into it). Between members
 * (in_member false) the next two raw bytes decide: the end of the input is a clean end,
 * 1F 8B starts another member, anything else is trailing data.
 *
 * Invariants: in_pos <= in_len <= in_cap; while inflating, z.next_in == in + in_pos and
 * z.avail_in == in_len - in_pos around each inflate call.
 */
#include "gzin.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define GZIN_CHUNK (1u << 18) /* raw bytes read at a time */

int log_gzin_init(log_gzin *g, int fd)
{
    memset(g, 0, sizeof *g);
    g->fd = fd;
    g->in_cap = GZIN_CHUNK;
    g->in = malloc(g->in_cap);
    return g->in ? 0 : -1;
}

void log_gzin_free(log_gzin *g)
{
    if (g->inflating)
        inflateEnd(&g->z);
    free(g->in);
    g->in = NULL;
    g->inflating = false;
}

uint64_t log_gzin_offset(const log_gzin *g)
{
    return g->n_read - (g->in_len - g->in_pos);
}

/* Read more raw bytes, keeping the unused ones (moved to the front). Returns 1 when bytes
 * were added, 0 at the end of fd, -1 on a read error (message in err). */
static int refill(log_gzin *g, char *err, size_t err_size)
{
    if (g->fd_eof)
        return 0;
    if (g->in_pos > 0) {
        memmove(g->in, g->in + g->in_pos, g->in_len - g->in_pos);
        g->in_len -= g->in_pos;
        g->in_pos = 0;
    }
    ssize_t n;
    do
        n = read(g->fd, g->in + g->in_len, g->in_cap - g->in_len);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        cli_errf(err, err_size, "read error: %s", strerror(errno));
        return -1;
    }
    if (n == 0) {
        g->fd_eof = true;
        return 0;
    }
    g->in_len += (size_t)n;
    g->n_read += (uint64_t)n;
    return 1;
}

/* Make at least need (<= in_cap) unused raw bytes available, unless the input ends first.
 * Returns the bytes available, or -1 on a read error. */
static long want_bytes(log_gzin *g, size_t need, char *err, size_t err_size)
{
    while (g->in_len - g->in_pos < need) {
        int rc = refill(g, err, err_size);
        if (rc < 0)
            return -1;
        if (rc == 0)
            break;
    }
    return (long)(g->in_len - g->in_pos);
}

/* Between members: decide whether another member starts. Returns 1 (it does; z reset), 0
 * (clean end) or -1 (trailing data or a read error; message in err). */
static int next_member(log_gzin *g, char *err, size_t err_size)
{
    long have = want_bytes(g, 2, err, err_size);
    if (have < 0)
        return -1;
    if (have == 0)
        return 0;
    if (have < 2 || g->in[g->in_pos] != 0x1f || g->in[g->in_pos + 1] != 0x8b) {
        cli_errf(err, err_size,
                 "trailing data after the gzip data at byte %" PRIu64
                 " (not another gzip member: a corrupt or padded file?)",
                 g->member_end);
        return -1;
    }
    if (!g->inflating) {
        if (inflateInit2(&g->z, 15 + 16) != Z_OK) {
            cli_errf(err, err_size, "out of memory starting gzip decompression");
            return -1;
        }
        g->inflating = true;
    } else if (inflateReset(&g->z) != Z_OK) {
        cli_errf(err, err_size, "internal error restarting gzip decompression");
        return -1;
    }
    g->in_member = true;
    return 1;
}

/* Inflate into dst until something comes out or the member ends. Returns the bytes
 * produced (0 when the member ended with nothing more), or -1 (message in err). */
static long inflate_some(log_gzin *g, unsigned char *dst, size_t want, char *err, size_t err_size)
{
    g->z.next_out = dst;
    g->z.avail_out = want > UINT32_MAX ? UINT32_MAX : (uInt)want;
    for (;;) {
        if (g->in_pos == g->in_len && refill(g, err, err_size) < 0)
            return -1;
        g->z.next_in = g->in + g->in_pos;
        g->z.avail_in = (uInt)(g->in_len - g->in_pos);
        int zr = inflate(&g->z, Z_NO_FLUSH);
        g->in_pos = g->in_len - g->z.avail_in;
        size_t made = (size_t)(g->z.next_out - dst);
        if (zr == Z_STREAM_END) {
            g->in_member = false;
            g->member_end = log_gzin_offset(g);
            return (long)made;
        }
        if (zr == Z_MEM_ERROR) {
            cli_errf(err, err_size, "out of memory in gzip decompression");
            return -1;
        }
        if (zr != Z_OK && zr != Z_BUF_ERROR) {
            cli_errf(err, err_size, "corrupt gzip data (%s)", g->z.msg ? g->z.msg : "inflate");
            return -1;
        }
        if (made > 0)
            return (long)made;
        if (g->fd_eof && g->in_pos == g->in_len) {
            cli_errf(err, err_size, "truncated gzip data (the input ends inside a member)");
            return -1;
        }
    }
}

long log_gzin_read(log_gzin *g, void *dst, size_t want, char *err, size_t err_size)
{
    if (g->done)
        return 0;
    if (!g->detected) {
        long have = want_bytes(g, 2, err, err_size);
        if (have < 0)
            return g->done = true, -1;
        g->detected = true;
        g->gzip = have >= 2 && g->in[g->in_pos] == 0x1f && g->in[g->in_pos + 1] == 0x8b;
    }
    if (!g->gzip) {
        long have = want_bytes(g, 1, err, err_size);
        if (have <= 0)
            return g->done = true, have;
        size_t n = (size_t)have < want ? (size_t)have : want;
        memcpy(dst, g->in + g->in_pos, n);
        g->in_pos += n;
        return (long)n;
    }
    for (;;) {
        if (!g->in_member) {
            int rc = next_member(g, err, err_size);
            if (rc <= 0)
                return g->done = true, rc;
        }
        long n = inflate_some(g, dst, want, err, err_size);
        if (n < 0)
            return g->done = true, -1;
        if (n > 0)
            return n;
    }
}
