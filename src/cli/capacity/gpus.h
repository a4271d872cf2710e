/*
 * gpus.h - GPU presets for `kvprefix plan --gpu` and `kvprefix replay --gpu`: the memory a
 * card has (in binary units, as the card's name means it: an "H100 80GB" holds 80 GiB of
 * HBM, not 80 x 10^9 bytes), its dense BF16 tensor throughput (for a prefill rate from a
 * model's FLOPs per token) and the host link each card has (for the load bandwidth of a
 * host-memory tier). Values are the vendors' data-sheet figures; see gpus.c.
 */
#ifndef CLI_GPUS_H
#define CLI_GPUS_H

#include <stddef.h>
#include <stdint.h>

typedef struct cap_gpu_preset {
    const char *name;      /* preset name given to --gpu, e.g. "H100-80GB" */
    uint64_t mem_bytes;    /* memory of one card, bytes */
    double bf16_flops;     /* dense BF16 tensor throughput, FLOP/s (no sparsity) */
    double host_bw_bytes;  /* host link of one card, bytes/s a pinned copy reaches */
    const char *host_link; /* its name, e.g. "PCIe 5.0 x16" */
} cap_gpu_preset;

/* Number of presets. Cannot fail. */
size_t cap_gpu_count(void);

/* Preset i (0 .. cap_gpu_count() - 1), a static object, or NULL when out of range. */
const cap_gpu_preset *cap_gpu_at(size_t i);

/* Find a preset by name, case-insensitively ("h100-80gb"). Returns a static object or NULL. */
const cap_gpu_preset *cap_gpu_find(const char *name);

#endif /* CLI_GPUS_H */
