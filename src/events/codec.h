/*
 * codec.h - internals shared by the KV-event codec (codec_encode.c, codec_decode.c) and the
 * publisher (publisher.c). Nothing here is installed or exported.
 *
 * kvp__mpw is a bounded msgpack-c write target: msgpack_packer calls kvp__mpw_write with
 * each run of encoded bytes, which are copied while they fit and counted always, so one
 * packing pass both fills a large enough buffer and measures the size a small one needs
 * (snprintf's convention, as src/metrics.c does for text).
 *
 * kvp__mp_walk is the decoder's guard in front of msgpack-c: msgpack-c allocates every
 * container's claimed element count before reading the elements, so ten bytes claiming
 * 2^32 elements would ask for 96 GiB. The walk reads only headers and proves that every
 * claimed element fits in the bytes left (each needs at least one), bounding what
 * msgpack-c then allocates by about 24 bytes per input byte.
 */
#ifndef KVP_EVENTS_CODEC_H
#define KVP_EVENTS_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "kvprefix_events.h"

/* A bounded write target for msgpack_packer. */
typedef struct kvp__mpw {
    uint8_t *buf; /* destination (may be NULL when cap is 0) */
    size_t cap;   /* its size in bytes */
    size_t len;   /* bytes written so far; only buf[0 .. min(len, cap)) was stored */
} kvp__mpw;

/* msgpack_packer_write callback for a kvp__mpw (data). Copies what fits, counts the rest.
 * Never fails (returns 0). */
int kvp__mpw_write(void *data, const char *buf, size_t len);

/* Walk the msgpack object starting at p[0 .. len) reading only headers: on KVP_OK
 * *consumed is its size in bytes (it may be followed by more bytes). KVP_EFORMAT: it is
 * truncated, uses the never-used lead byte 0xc1, nests more than KVP_KV_MAX_DEPTH
 * containers, or some container claims more elements than bytes remain. Allocates
 * nothing; O(len). */
int kvp__mp_walk(const uint8_t *p, size_t len, size_t *consumed);

/* Pack batch in form (see kvp_kv_encode) with pk. The batch must have passed
 * kvp__kv_batch_valid. Cannot fail with a kvp__mpw target. */
void kvp__kv_pack_batch(msgpack_packer *pk, const kvp_kv_batch *batch, int form);

/* KVP_OK when kvp_kv_encode can encode batch in form, else KVP_EINVAL. */
int kvp__kv_batch_valid(const kvp_kv_batch *batch, int form);

#endif /* KVP_EVENTS_CODEC_H */
