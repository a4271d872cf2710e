/*
 * gpus.c - the GPU presets of gpus.h.
 *
 *   preset         memory    dense BF16   host link (pinned copy, one direction)
 *   A100-40GB      40 GiB    312 TFLOP/s  PCIe 4.0 x16, 25 GB/s
 *   A100-80GB      80 GiB    312 TFLOP/s  PCIe 4.0 x16, 25 GB/s
 *   H100-80GB      80 GiB    989 TFLOP/s  PCIe 5.0 x16, 50 GB/s   (SXM5)
 *   H200-141GB    141 GiB    989 TFLOP/s  PCIe 5.0 x16, 50 GB/s
 *   L40S-48GB      48 GiB    362 TFLOP/s  PCIe 4.0 x16, 25 GB/s
 *   MI300X-192GB  192 GiB   1307 TFLOP/s  PCIe 5.0 x16, 50 GB/s
 *
 * Memory is the size in the card's name read in binary units, which is what the HBM stacks
 * hold (an H100 SXM has five 16 GiB stacks); the driver reserves a little of it (nvidia-smi
 * shows 81,559 MiB of an H100's 81,920), which --util already leaves room for. Throughput is
 * the data sheets' dense figure (half the "with sparsity" one). A PCIe link's usable copy rate
 * is about 80 % of its raw rate (4.0 x16: 32 GB/s raw; 5.0 x16: 64 GB/s), hence 25 and 50.
 */
#include "gpus.h"

#include <strings.h>

#define GIB (UINT64_C(1) << 30)

static const cap_gpu_preset presets[] = {
    {"A100-40GB", 40 * GIB, 312e12, 25e9, "PCIe 4.0 x16"},
    {"A100-80GB", 80 * GIB, 312e12, 25e9, "PCIe 4.0 x16"},
    {"H100-80GB", 80 * GIB, 989e12, 50e9, "PCIe 5.0 x16"},
    {"H200-141GB", 141 * GIB, 989e12, 50e9, "PCIe 5.0 x16"},
    {"L40S-48GB", 48 * GIB, 362e12, 25e9, "PCIe 4.0 x16"},
    {"MI300X-192GB", 192 * GIB, 1307e12, 50e9, "PCIe 5.0 x16"},
};

size_t cap_gpu_count(void)
{
    return sizeof presets / sizeof presets[0];
}

const cap_gpu_preset *cap_gpu_at(size_t i)
{
    return i < cap_gpu_count() ? &presets[i] : NULL;
}

const cap_gpu_preset *cap_gpu_find(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < cap_gpu_count(); i++)
        if (strcasecmp(presets[i].name, name) == 0)
            return &presets[i];
    return NULL;
}
