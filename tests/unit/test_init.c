/* test_init.c: deterministic initializers: chunk independence, ranges and moments, seeding. */
#include "init.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BIG 100000 /* elements for the statistical checks */
#define WHOLE 1001 /* elements for the chunking checks */

/* One initializer of each kind; .seed is filled in per test. */
static const psk_init_t KINDS[] = {
    {.kind = PSK_INIT_ZEROS},
    {.kind = PSK_INIT_NORMAL, .arg = 0.02f},
    {.kind = PSK_INIT_UNIFORM, .arg = 0.5f},
    {.kind = PSK_INIT_XAVIER, .fan_in = 300, .fan_out = 100},
    {.kind = PSK_INIT_CONSTANT, .arg = 1.0f},
};

static float *xmalloc_floats(size_t n)
{
    float *p = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(p);
    return p;
}

/* Mean and (population) standard deviation of x[n], in double. */
static void moments(const float *x, size_t n, double *mean, double *std)
{
    double sum = 0.0, sum2 = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += x[i];
    *mean = sum / (double)n;
    for (size_t i = 0; i < n; i++)
        sum2 += ((double)x[i] - *mean) * ((double)x[i] - *mean);
    *std = sqrt(sum2 / (double)n);
}

/* Chunks split at odd offsets reproduce the whole tensor bit for bit. */
START_TEST(test_chunked_equals_whole)
{
    static const size_t cuts[] = {0, 1, 8, 333, 334, 777, WHOLE};
    psk_init_t init = KINDS[_i];
    init.seed = psk_init_seed("layers.3.mlp.weight", 1234);
    float whole[WHOLE], chunked[WHOLE];

    psk_init_cpu(whole, WHOLE, 0, &init);
    for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++)
        psk_init_cpu(chunked + cuts[c], cuts[c + 1] - cuts[c], cuts[c], &init);
    ck_assert_mem_eq(chunked, whole, sizeof whole);
}
END_TEST

/* Element indices past 2^32 work the same way: a chunk at first - 2 overlaps one at first. */
START_TEST(test_chunked_large_offset)
{
    psk_init_t init = KINDS[_i];
    init.seed = psk_init_seed("embed.weight", 7);
    uint64_t first = (1ull << 33) + 5;
    float a[7], b[5];

    psk_init_cpu(a, 7, first - 2, &init);
    psk_init_cpu(b, 5, first, &init);
    ck_assert_mem_eq(a + 2, b, sizeof b);
}
END_TEST

START_TEST(test_zeros)
{
    psk_init_t init = KINDS[0];
    init.seed = psk_init_seed("bias", 1);
    float out[WHOLE], zero[WHOLE] = {0};

    memset(out, 0xff, sizeof out); /* NaN everywhere, so every element must be written */
    psk_init_cpu(out, WHOLE, 12345, &init);
    ck_assert_mem_eq(out, zero, sizeof out); /* +0.0f, not -0.0f */
}
END_TEST

/* All of x[n] in [-a, a), reaching within 1% of both ends. */
static void expect_uniform_range(const float *x, size_t n, float a)
{
    float lo = x[0], hi = x[0];
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(x[i] >= -a && x[i] < a, "x[%zu] = %.9g outside [-%g, %g)", i,
                      (double)x[i], (double)a, (double)a);
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    ck_assert_float_lt(lo, -0.99f * a);
    ck_assert_float_gt(hi, 0.99f * a);
}

/*
 * uniform(a = 2): mean 0, std a / sqrt(3) = 1.1547. Over 1e5 samples the mean's standard
 * error is 1.1547 / 316 = 0.00365; the bounds are about 5 standard errors.
 */
START_TEST(test_uniform)
{
    psk_init_t init = {.kind = PSK_INIT_UNIFORM, .arg = 2.0f, .seed = psk_init_seed("w", 0)};
    float *x = xmalloc_floats(BIG);
    double mean, std;

    psk_init_cpu(x, BIG, 0, &init);
    expect_uniform_range(x, BIG, 2.0f);
    moments(x, BIG, &mean, &std);
    ck_assert_msg(fabs(mean) < 0.02, "mean %g", mean);
    ck_assert_msg(fabs(std / (2.0 / sqrt(3.0)) - 1.0) < 0.02, "std %g", std);
    free(x);
}
END_TEST

/* xavier(300, 100): bound sqrt(6 / 400) = 0.122474487. */
START_TEST(test_xavier)
{
    psk_init_t init = KINDS[3];
    init.seed = psk_init_seed("fc1.weight", 3);
    float *x = xmalloc_floats(BIG);

    psk_init_cpu(x, BIG, 0, &init);
    expect_uniform_range(x, BIG, 0.122474487f);

    /* Same seed, so xavier is exactly uniform(bound). */
    psk_init_t uni = {.kind = PSK_INIT_UNIFORM, .arg = (float)sqrt(6.0 / 400.0), .seed = init.seed};
    float *y = xmalloc_floats(BIG);
    psk_init_cpu(y, BIG, 0, &uni);
    ck_assert_mem_eq(x, y, BIG * sizeof(float));
    free(y);
    free(x);
}
END_TEST

/* A fan past 2^32 (a [1, 2^33] tensor: fan_out = 2^33) keeps its size: bound
 * sqrt(6 / (1 + 2^33)). Before, psd passed it as a uint32 that wrapped to 0 (bound sqrt(3)). */
START_TEST(test_xavier_huge_fan)
{
    psk_init_t init = {.kind = PSK_INIT_XAVIER, .fan_in = 1, .fan_out = 1ull << 33,
                       .seed = psk_init_seed("wide", 0)};
    float a[WHOLE];
    psk_init_cpu(a, WHOLE, 0, &init);
    expect_uniform_range(a, WHOLE, (float)sqrt(6.0 / (1.0 + 8589934592.0)));
}
END_TEST

/* A zero fan counts as 1 rather than dividing by zero: bound sqrt(6 / 2). */
START_TEST(test_xavier_zero_fan)
{
    psk_init_t zero = {.kind = PSK_INIT_XAVIER, .seed = psk_init_seed("scalar", 0)};
    psk_init_t one = zero;
    one.fan_in = one.fan_out = 1;
    float a[WHOLE], b[WHOLE];

    psk_init_cpu(a, WHOLE, 0, &zero);
    psk_init_cpu(b, WHOLE, 0, &one);
    ck_assert_mem_eq(a, b, sizeof a);
    expect_uniform_range(a, WHOLE, (float)sqrt(3.0));
}
END_TEST

/*
 * normal(std 0.02): the mean's standard error over 1e5 samples is 0.02 / 316 = 6.3e-5 (bound
 * about 5 of them); the sample std's relative standard error is 1 / sqrt(2e5) = 0.22%, so 2%
 * is loose. About 2.7 samples in 1000 lie beyond 3 std.
 */
START_TEST(test_normal)
{
    psk_init_t init = KINDS[1];
    init.seed = psk_init_seed("h.0.attn.c_attn.weight", 42);
    float *x = xmalloc_floats(BIG);
    double mean, std;

    psk_init_cpu(x, BIG, 0, &init);
    size_t beyond3 = 0;
    for (size_t i = 0; i < BIG; i++) {
        ck_assert_msg(isfinite(x[i]), "x[%zu] = %g", i, (double)x[i]);
        beyond3 += fabsf(x[i]) > 3.0f * 0.02f;
    }
    moments(x, BIG, &mean, &std);
    ck_assert_msg(fabs(mean) < 3e-4, "mean %g", mean);
    ck_assert_msg(fabs(std / 0.02 - 1.0) < 0.02, "std %g", std);
    ck_assert_msg(beyond3 > 170 && beyond3 < 370, "%zu samples beyond 3 std", beyond3);
    free(x);
}
END_TEST

/* Neighbouring elements come from neighbouring counters; their correlation must be ~0. */
START_TEST(test_neighbours_uncorrelated)
{
    psk_init_t init = KINDS[_i + 1]; /* normal, uniform, xavier */
    init.seed = psk_init_seed("w", 9);
    float *x = xmalloc_floats(BIG);
    double mean, std, cov = 0.0;

    psk_init_cpu(x, BIG, 0, &init);
    moments(x, BIG, &mean, &std);
    for (size_t i = 0; i + 1 < BIG; i++)
        cov += ((double)x[i] - mean) * ((double)x[i + 1] - mean);
    double r = cov / (double)(BIG - 1) / (std * std);
    ck_assert_msg(fabs(r) < 0.02, "lag-1 correlation %g", r); /* standard error 0.0032 */
    free(x);
}
END_TEST

/* Number of positions where a[n] and b[n] hold the same value. */
static size_t count_equal(const float *a, const float *b, size_t n)
{
    size_t same = 0;
    for (size_t i = 0; i < n; i++)
        same += a[i] == b[i];
    return same;
}

/* constant: every element the value, whatever the seed or the offset. */
START_TEST(test_constant)
{
    psk_init_t init = KINDS[4];
    init.seed = psk_init_seed("ln.weight", 3);
    float out[WHOLE];

    memset(out, 0xff, sizeof out);
    psk_init_cpu(out, WHOLE, (1ull << 33) + 1, &init);
    for (size_t i = 0; i < WHOLE; i++) ck_assert_float_eq(out[i], 1.0f);
}
END_TEST

START_TEST(test_names_differ)
{
    static const char *names[] = {"layer1.weight", "layer1.bias", "layer2.weight", "", "a"};
    enum { NNAMES = sizeof names / sizeof names[0] };
    float x[NNAMES][WHOLE];

    for (size_t k = 0; k < NNAMES; k++) {
        psk_init_t init = {.kind = PSK_INIT_UNIFORM, .arg = 1.0f};
        init.seed = psk_init_seed(names[k], 0);
        psk_init_cpu(x[k], WHOLE, 0, &init);
        for (size_t j = 0; j < k; j++) {
            ck_assert_uint_ne(psk_init_seed(names[k], 0), psk_init_seed(names[j], 0));
            /* 24-bit values: a chance match is about 1001 / 2^24 per pair. */
            ck_assert_uint_le(count_equal(x[k], x[j], WHOLE), 1);
        }
    }
}
END_TEST

START_TEST(test_seeds_differ)
{
    float a[WHOLE], b[WHOLE];
    psk_init_t init = {.kind = PSK_INIT_NORMAL, .arg = 1.0f};

    ck_assert_uint_ne(psk_init_seed("w", 0), psk_init_seed("w", 1));
    init.seed = psk_init_seed("w", 0);
    psk_init_cpu(a, WHOLE, 0, &init);
    init.seed = psk_init_seed("w", 1);
    psk_init_cpu(b, WHOLE, 0, &init);
    ck_assert_uint_le(count_equal(a, b, WHOLE), 1);
}
END_TEST

START_TEST(test_reproducible)
{
    psk_init_t init = KINDS[_i];
    float a[WHOLE], b[WHOLE];

    ck_assert_uint_eq(psk_init_seed("blocks.0.ln.weight", 99),
                      psk_init_seed("blocks.0.ln.weight", 99));
    init.seed = psk_init_seed("blocks.0.ln.weight", 99);
    psk_init_cpu(a, WHOLE, 17, &init);
    init.seed = psk_init_seed("blocks.0.ln.weight", 99);
    psk_init_cpu(b, WHOLE, 17, &init);
    ck_assert_mem_eq(a, b, sizeof a);
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("init");
    const int nkinds = (int)(sizeof KINDS / sizeof KINDS[0]);

    TCase *tc = tcase_create("chunking");
    tcase_add_loop_test(tc, test_chunked_equals_whole, 0, nkinds);
    tcase_add_loop_test(tc, test_chunked_large_offset, 0, nkinds);
    suite_add_tcase(s, tc);

    tc = tcase_create("distributions");
    tcase_add_test(tc, test_zeros);
    tcase_add_test(tc, test_constant);
    tcase_add_test(tc, test_uniform);
    tcase_add_test(tc, test_xavier);
    tcase_add_test(tc, test_xavier_zero_fan);
    tcase_add_test(tc, test_xavier_huge_fan);
    tcase_add_test(tc, test_normal);
    tcase_add_loop_test(tc, test_neighbours_uncorrelated, 0, 3); /* normal, uniform, xavier */
    suite_add_tcase(s, tc);

    tc = tcase_create("seeding");
    tcase_add_test(tc, test_names_differ);
    tcase_add_test(tc, test_seeds_differ);
    tcase_add_loop_test(tc, test_reproducible, 0, nkinds);
    suite_add_tcase(s, tc);

    return s;
}
