/* test_codec_twin.c: kernels/codec.cu's arithmetic against codec.c, bit for bit, on the host
 * (built where nvcc is; no GPU needed). codec.cu's per-element functions (built on codec.c's
 * own conversions, codec_bits.h) are __host__ __device__ and psk_codec_encode_cuda_host /
 * psk_codec_decode_add_cuda_host run them in the kernels' order: the same payload bytes, residuals and sums as the CPU codecs for every dense codec,
 * with and without error feedback, across the fp16 / bf16 rounding boundaries of every
 * exponent and sign, tiny (int8's double path), subnormal and huge values, and non-finite
 * input (marked in the payload, residual left). What this cannot see (the launches, the
 * indexing, the block reduction) test_gpu checks on a device. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "ps/ps_error.h"

int psk_codec_encode_cuda_host(uint8_t *out, size_t cap, size_t *len, const float *g, float *r,
                               size_t n, const psk_codec_t *c);
int psk_codec_decode_add_cuda_host(float *o, size_t n, const uint8_t *payload, size_t len,
                                   const psk_codec_t *c, float weight);

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Every finite bit pattern's high 16 bits (sign, exponent, top mantissa bits) with low halves
 * at and around the fp16 and bf16 rounding boundaries, and random ones: n values. */
static float *boundary_values(size_t *n)
{
    static const uint16_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x2fff, 0x3000,
                                    0x7ffe, 0x7fff, 0x8000, 0x8001, 0xdfff, 0xe000, 0xe001,
                                    0xfffe, 0xffff};
    size_t nl = sizeof lows / sizeof lows[0] + 4, k = 0;
    float *x = malloc(65536 * nl * 4);
    uint64_t s = 7;
    for (uint32_t hi = 0; hi < 65536; hi++) {
        if ((hi & 0x7f80) == 0x7f80)
            continue; /* inf and NaN: their own case below */
        for (size_t l = 0; l < nl; l++) {
            uint32_t lo = l < nl - 4 ? lows[l] : (uint32_t)(rng_next(&s) & 0xffff);
            x[k++] = from_bits(hi << 16 | lo);
        }
    }
    *n = k;
    return x;
}

/* Payload bytes, residual and decode-add of codec @p name (block, stochastic) on x[n], both
 * ways; returns nothing, asserts once per comparison. */
static void compare(const char *name, uint32_t block, int stochastic, const float *x, size_t n,
                    uint64_t seed)
{
    psk_codec_t c;
    ck_assert_int_eq(psk_codec_parse(&c, name), 0);
    if (block)
        c.block = block;
    c.stochastic = stochastic;
    c.seed = seed;
    size_t cap = psk_codec_max_bytes(&c, n), la = 0, lb = 0;
    uint8_t *pa = malloc(cap), *pb = malloc(cap);
    float *ra = malloc(n * 4), *rb = malloc(n * 4);
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++)
        ra[i] = rb[i] = (float)((int64_t)(rng_next(&s) % 2001) - 1000) * 1e-3f;
    for (int ef = 0; ef < 2; ef++) {
        int rc = ef ? psk_codec_encode_ef_cpu(pa, cap, &la, x, ra, n, &c, NULL)
                    : psk_codec_encode_cpu(pa, cap, &la, x, n, &c, NULL);
        ck_assert_msg(rc == 0, "%s: the CPU refused (%d)", name, rc);
        ck_assert_int_eq(psk_codec_encode_cuda_host(pb, cap, &lb, x, ef ? rb : NULL, n, &c), 0);
        ck_assert_uint_eq(la, lb);
        size_t i = 0;
        while (i < la && pa[i] == pb[i])
            i++;
        ck_assert_msg(i == la, "%s block %u%s%s: payload byte %zu: %u on the CPU, %u by codec.cu",
                      name, c.block, stochastic ? " stochastic" : "", ef ? " ef" : "", i, pa[i],
                      pb[i]);
        if (ef) {
            i = 0;
            while (i < n && memcmp(&ra[i], &rb[i], 4) == 0)
                i++;
            ck_assert_msg(i == n, "%s block %u ef: residual %zu: %a on the CPU, %a by codec.cu",
                          name, c.block, i, ra[i], rb[i]);
        }
    }
    /* decode-add of the payload onto the residuals (equal now) */
    ck_assert_int_eq(psk_codec_decode_add_cpu(ra, n, pa, la, &c, 0.75f), 0);
    ck_assert_int_eq(psk_codec_decode_add_cuda_host(rb, n, pa, la, &c, 0.75f), 0);
    ck_assert_msg(memcmp(ra, rb, n * 4) == 0, "%s block %u: decode-add differs", name, c.block);
    free(pa);
    free(pb);
    free(ra);
    free(rb);
}

START_TEST(test_fp16_bf16_every_boundary)
{
    size_t n;
    float *x = boundary_values(&n);
    ck_assert_uint_gt(n, 1000000);
    compare("none", 0, 0, x, n, 1);
    compare("fp16", 0, 0, x, n, 2);
    compare("bf16", 0, 0, x, n, 3);
    free(x);
}
END_TEST

START_TEST(test_int8_sign_blocks)
{
    /* Blocks of mixed magnitudes: ordinary, subnormal and tiny (int8's double path), huge, a
     * block of zeros; partial last blocks and bytes. */
    const size_t n = 200003;
    float *x = malloc(n * 4);
    uint64_t s = 11;
    for (size_t i = 0; i < n; i++) {
        size_t b = (i / 256) % 6;
        float u = (float)((int64_t)(rng_next(&s) % 2000001) - 1000000) * 1e-6f;
        x[i] = b == 0 ? u : b == 1 ? u * 1e-39f : b == 2 ? u * 1e-32f : b == 3 ? u * 3e38f
                                                                      : b == 4 ? 0.0f : u * 7.0f;
    }
    x[5] = -0.0f;
    static const uint32_t blocks[] = {256, 100, 1, 7, 4096};
    for (size_t k = 0; k < sizeof blocks / sizeof blocks[0]; k++) {
        compare("int8", blocks[k], 0, x, n, 20 + k);
        compare("int8", blocks[k], 1, x, n, 30 + k);
        compare("sign", blocks[k], 0, x, n, 40 + k);
    }
    free(x);
}
END_TEST

START_TEST(test_nonfinite_marked)
{
    /* int8 and sign cannot encode a NaN or an infinity: the CPU refuses (residual left), the
     * device's payload is marked (kind 0xff, refused by the check) with the residual left. */
    const size_t n = 1000;
    float x[1000], r0[1000], r[1000];
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)i * 0.01f;
        r0[i] = r[i] = 0.5f;
    }
    x[700] = INFINITY;
    const char *names[] = {"int8", "sign"};
    for (int k = 0; k < 2; k++) {
        psk_codec_t c;
        ck_assert_int_eq(psk_codec_parse(&c, names[k]), 0);
        size_t cap = psk_codec_max_bytes(&c, n), len;
        uint8_t *p = malloc(cap);
        ck_assert_int_eq(psk_codec_encode_ef_cpu(p, cap, &len, x, r, n, &c, NULL), PS_EINVAL);
        ck_assert_int_eq(psk_codec_encode_cuda_host(p, cap, &len, x, r, n, &c), 0);
        ck_assert_int_eq(p[0], 0xff);
        ck_assert_int_ne(psk_codec_check(p, len, n, &c), 0);
        ck_assert_int_eq(psk_codec_encode_cuda_host(p, cap, &len, x, NULL, n, &c), 0);
        ck_assert_int_eq(p[0], 0xff);
        ck_assert_msg(memcmp(r, r0, sizeof r) == 0, "%s: the residual changed", names[k]);
        free(p);
    }
    /* The sparse codecs are the host's. */
    psk_codec_t c;
    ck_assert_int_eq(psk_codec_parse(&c, "topk:0.1"), 0);
    uint8_t buf[16384];
    size_t len;
    ck_assert_int_eq(psk_codec_encode_cuda_host(buf, sizeof buf, &len, x, NULL, n, &c),
                     PS_ENOTSUP);
}
END_TEST

/* int8 and sign with error feedback, g finite but g + residual overflowing float at two values:
 * both sides zero them and encode the rest, to the same bytes and residuals (session 60: the CPU
 * refused the push and kept the infinity in the residual, so every later push failed; the
 * device wrote an infinite scale and NaN residuals for the block). */
START_TEST(test_residual_overflow_zeroed)
{
    const size_t n = 1000;
    float x[1000], ra[1000], rb[1000];
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)i * 0.01f - 3.0f;
        ra[i] = rb[i] = 0.25f;
    }
    x[10] = FLT_MAX, ra[10] = rb[10] = FLT_MAX;
    x[300] = -FLT_MAX, ra[300] = rb[300] = -0x1.8p127f;
    const char *names[] = {"int8", "sign"};
    for (int k = 0; k < 2; k++) {
        psk_codec_t c;
        ck_assert_int_eq(psk_codec_parse(&c, names[k]), 0);
        size_t cap = psk_codec_max_bytes(&c, n), la, lb;
        uint8_t *pa = malloc(cap), *pb = malloc(cap);
        float r0[1000];
        memcpy(r0, ra, sizeof r0);
        ck_assert_int_eq(psk_codec_encode_ef_cpu(pa, cap, &la, x, ra, n, &c, NULL), 0);
        ck_assert_int_eq(psk_codec_encode_cuda_host(pb, cap, &lb, x, rb, n, &c), 0);
        ck_assert_int_eq(psk_codec_check(pa, la, n, &c), 0);
        ck_assert_uint_eq(la, lb);
        ck_assert_msg(memcmp(pa, pb, la) == 0, "%s: the payloads differ", names[k]);
        ck_assert_msg(memcmp(ra, rb, sizeof ra) == 0, "%s: the residuals differ", names[k]);
        /* The rest went out: residual + decode = g + the residual before. */
        float d[1000] = {0};
        ck_assert_int_eq(psk_codec_decode_add_cpu(d, n, pa, la, &c, 1.0f), 0);
        for (size_t i = 0; i < n; i++) {
            ck_assert_msg(isfinite(ra[i]), "%s: residual %zu is %a", names[k], i, ra[i]);
            if (i != 10 && i != 300)
                ck_assert_msg(ra[i] + d[i] == x[i] + r0[i], "%s value %zu: %a + %a, want %a",
                              names[k], i, ra[i], d[i], x[i] + r0[i]);
        }
        memcpy(ra, r0, sizeof r0), memcpy(rb, r0, sizeof r0);
        free(pa);
        free(pb);
    }
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("codec_twin");
    TCase *tc = tcase_create("codec_cu_on_host");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_fp16_bf16_every_boundary);
    tcase_add_test(tc, test_int8_sign_blocks);
    tcase_add_test(tc, test_nonfinite_marked);
    tcase_add_test(tc, test_residual_overflow_zeroed);
    suite_add_tcase(s, tc);
    return s;
}
