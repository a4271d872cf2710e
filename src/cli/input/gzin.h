/*
 * gzin.h - the log reader's first layer: bytes of a file descriptor, gunzipped when they
 * start with the gzip magic 1F 8B, passed through unchanged otherwise.
 *
 * Unlike zlib's gzread, which silently ignores whatever follows the last gzip member when
 * it is not another member, this layer reports such trailing data as an error naming its
 * offset, and reports an input that ends inside a member as truncated. Concatenated members
 * (as `cat a.gz b.gz` makes) are read as one stream, as gzip -d does.
 *
 * Memory: one READ_CHUNK input buffer and zlib's inflate state (about 40 KiB); nothing grows
 * with the input. The output is produced as the caller asks, so a gzip bomb costs no more
 * than what the caller keeps of it.
 */
#ifndef CLI_GZIN_H
#define CLI_GZIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

typedef struct log_gzin {
    int fd;              /* input; the caller owns it */
    unsigned char *in;   /* raw input buffer */
    size_t in_cap;       /* bytes allocated at in */
    size_t in_len;       /* bytes held in in */
    size_t in_pos;       /* bytes of in already used */
    bool fd_eof;         /* read() returned 0 */
    bool detected;       /* the first bytes were checked for the gzip magic */
    bool gzip;           /* the input is gzip data */
    bool inflating;      /* z is set up (inflateInit2 succeeded) */
    bool in_member;      /* inside a gzip member (its end not yet seen) */
    bool done;           /* the end, or an error, was returned */
    uint64_t n_read;     /* bytes read from fd so far */
    uint64_t member_end; /* raw offset where the last complete member ended */
    z_stream z;          /* inflate state when gzip */
} log_gzin;

/* Start reading fd (not taken over: the caller closes it). Returns 0, or -1 on out of
 * memory. */
int log_gzin_init(log_gzin *g, int fd);

/* Read up to want (> 0) bytes of the (gunzipped) input into dst. Returns the count, 0 at
 * the end, or -1 with a message "what is wrong" (without the file name) in err. */
long log_gzin_read(log_gzin *g, void *dst, size_t want, char *err, size_t err_size);

/* Raw bytes consumed from fd so far (compressed bytes for gzip). Cannot fail. */
uint64_t log_gzin_offset(const log_gzin *g);

/* Free the buffers and the inflate state (not fd). Accepts a zeroed log_gzin. */
void log_gzin_free(log_gzin *g);

#endif /* CLI_GZIN_H */
