/* init.c: CPU reference for the deterministic, chunk-independent tensor initializers. */
#include "init.h"
#include "hash.h"

#include <assert.h>
#include <math.h>

/*
 * The generator is counter-based: the random bits of element i are a hash of (seed, i), not
 * the i-th draw of a sequential stream, so any chunk [first, first + n) can be produced
 * without generating the elements before it. The hash is splitmix64's output function
 * applied to counter c of the stream that starts at seed, i.e. the c-th splitmix64 output.
 */

/* Uniform in [0, 1) on a 2^-24 grid: exact in float, and 2u - 1 is exact too. */
static float unit24(uint64_t h)
{
    return (float)(h >> 40) * 0x1.0p-24f;
}

/* Uniform in (0, 1] on a 2^-53 grid, for Box-Muller's log: never 0. */
static double unit53_open0(uint64_t h)
{
    return (double)((h >> 11) + 1) * 0x1.0p-53;
}

/*
 * out[n] = (2u - 1) * a with u = unit24(hash(seed, first + j)): in [-a, a). The float
 * product cannot round up to a, because a * 2^-23 is at least one ulp of a.
 */
static void fill_uniform(float *out, size_t n, uint64_t first, uint64_t seed, float a)
{
    for (size_t j = 0; j < n; j++) {
        float u = unit24(psk_hash64(seed, first + j));
        out[j] = (2.0f * u - 1.0f) * a;
    }
}

/*
 * out[n] = std * sqrt(-2 ln u1) * cos(2 pi u2), with u1, u2 from the two independent hashes
 * hash(seed, 2i) and hash(seed, 2i + 1) of element i = first + j. The sine half of each
 * Box-Muller pair is discarded so that element i depends on i alone. u1 uses 53 bits, so
 * the tail reaches about 8.6 std instead of the 5.8 std a 24-bit u1 would allow.
 */
static void fill_normal(float *out, size_t n, uint64_t first, uint64_t seed, float std)
{
    static const double two_pi = 6.28318530717958647692;

    for (size_t j = 0; j < n; j++) {
        uint64_t i = first + j;
        double u1 = unit53_open0(psk_hash64(seed, 2 * i));
        double u2 = (double)unit24(psk_hash64(seed, 2 * i + 1));
        out[j] = (float)((double)std * sqrt(-2.0 * log(u1)) * cos(two_pi * u2));
    }
}

void psk_init_cpu(float *out, size_t n, uint64_t first, const psk_init_t *init)
{
    switch (init->kind) {
    case PSK_INIT_ZEROS:
        for (size_t j = 0; j < n; j++)
            out[j] = 0.0f;
        return;
    case PSK_INIT_UNIFORM:
        fill_uniform(out, n, first, init->seed, init->arg);
        return;
    case PSK_INIT_XAVIER: {
        /* A zero fan would divide by zero; the header says callers pass 1 for a missing one. */
        double fan_in = init->fan_in ? init->fan_in : 1;
        double fan_out = init->fan_out ? init->fan_out : 1;
        fill_uniform(out, n, first, init->seed, (float)sqrt(6.0 / (fan_in + fan_out)));
        return;
    }
    case PSK_INIT_NORMAL:
        fill_normal(out, n, first, init->seed, init->arg);
        return;
    case PSK_INIT_CONSTANT:
        for (size_t j = 0; j < n; j++)
            out[j] = init->arg;
        return;
    case PSK_INIT_VALUES: /* sent, not made: the caller copies them */
        break;
    }
    assert(!"unknown psk_init_kind_t");
}

/* FNV-1a over the name's bytes, then combined with the seed through splitmix64. */
uint64_t psk_init_seed(const char *name, uint64_t seed)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64-bit offset basis */
    for (const unsigned char *s = (const unsigned char *)name; *s != '\0'; s++) {
        h ^= *s;
        h *= 0x100000001b3ull; /* FNV-1a 64-bit prime */
    }
    /* Mix the seed first, so small structured seeds (0, 1, 2) differ in many bits. */
    return psk_mix64(h ^ psk_mix64(seed + PSK_GOLDEN_GAMMA));
}
