/*
 * pyjson_repr_dump.c - print pyjson_repr_double (src/cli/tok/pyjson.h) of many doubles, for
 * tests/cli/pyjson_repr_check.py to compare with CPython's repr().
 *
 * One line per double: its C99 hex form (%a, exact), a tab, our repr. The doubles: every
 * power of two from 2^-1074 to 2^1023 and its two neighbours, both signs (at a power of two
 * the doubles that read back to x reach twice as far above as below, where a shortest-digits
 * search that only tries the correctly rounded digits goes wrong); then N (argv[1], default
 * 100000) bit patterns from a fixed splitmix64 sequence, and as many below 2^52
 * (subnormals); non-finite values are skipped. Exit 0 unless output fails.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pyjson.h"

static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static void put(double x)
{
    char buf[48];
    if (!isfinite(x))
        return;
    pyjson_repr_double(x, buf, sizeof buf);
    printf("%a\t%s\n", x, buf);
}

static double from_bits(uint64_t b)
{
    double x;
    memcpy(&x, &b, sizeof x);
    return x;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? strtol(argv[1], NULL, 10) : 100000;
    for (int e = -1074; e <= 1023; e++)
        for (int sign = 1; sign >= -1; sign -= 2) {
            double p = sign * ldexp(1.0, e);
            put(p);
            put(nextafter(p, 0.0));
            put(nextafter(p, sign * (double)INFINITY));
        }
    uint64_t s = 12345;
    for (long i = 0; i < n; i++) {
        put(from_bits(next(&s)));
        put(from_bits(next(&s) >> 12));
    }
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}
