/* test_codec.c: gradient codecs: round-trip error bounds, topk/randomk selection, error
 * feedback, decode-and-accumulate, payload validation and codec-name parsing. */
#include "codec.h"

#include "ps/ps_error.h"

#include <check.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define N 1001    /* values per chunk: not a multiple of BLOCK or 8, so partial blocks occur */
#define BLOCK 64  /* int8 and sign block size in the tests */
#define STEPS 200 /* error-feedback steps */

/* One codec of each kind and variant; the loop tests index this table. */
static const psk_codec_t CODECS[] = {
    {.kind = PSK_CODEC_NONE},
    {.kind = PSK_CODEC_FP16},
    {.kind = PSK_CODEC_BF16},
    {.kind = PSK_CODEC_INT8, .block = BLOCK},
    {.kind = PSK_CODEC_INT8, .block = BLOCK, .stochastic = 1, .seed = 7},
    {.kind = PSK_CODEC_TOPK, .fraction = 0.05f},
    {.kind = PSK_CODEC_TOPK, .fraction = 0.05f, .fp16_values = 1},
    {.kind = PSK_CODEC_RANDOMK, .fraction = 0.05f, .seed = 11},
    {.kind = PSK_CODEC_RANDOMK, .fraction = 0.05f, .fp16_values = 1, .seed = 11},
    {.kind = PSK_CODEC_SIGN, .block = BLOCK},
};
#define NCODECS ((int)(sizeof CODECS / sizeof CODECS[0]))

/* ---- helpers ---- */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1). */
static double rng_unit(void)
{
    return ((double)(rng_next() >> 11) + 0.5) * 0x1.0p-53;
}

/* x[n] ~ N(0, std^2). */
static void fill_normal(float *x, size_t n, uint64_t seed, double std)
{
    rng_state = seed;
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(std * sqrt(-2.0 * log(rng_unit())) * cos(6.283185307179586 * rng_unit()));
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes > 0 ? bytes : 1);
    ck_assert_ptr_nonnull(p);
    return p;
}

static float *zeros(size_t n)
{
    float *p = xmalloc(n * sizeof(float));
    memset(p, 0, n * sizeof(float));
    return p;
}

typedef struct {
    uint8_t *p; /* exactly len bytes, so that ASan or valgrind catch an overrun */
    size_t len;
} payload_t;

/* Encode x[n] into a fresh payload (checked to succeed with the exact advertised size). */
static payload_t encode(const psk_codec_t *c, const float *x, size_t n)
{
    size_t cap = psk_codec_max_bytes(c, n);
    ck_assert_uint_ge(cap, PSK_CODEC_HEADER_BYTES);
    payload_t pl = {.p = xmalloc(cap), .len = 0};
    void *scratch = xmalloc(psk_codec_scratch_bytes(c, n));
    ck_assert_int_eq(psk_codec_encode_cpu(pl.p, cap, &pl.len, x, n, c, scratch), 0);
    ck_assert_uint_eq(pl.len, cap);
    free(scratch);
    return pl;
}

/*
 * decode(x) as a fresh dense array: decode_add into -0.0, the exact additive identity
 * (+0.0 would turn a decoded -0.0 into +0.0).
 */
static float *round_trip(const psk_codec_t *c, const float *x, size_t n)
{
    payload_t pl = encode(c, x, n);
    float *y = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        y[i] = -0.0f;
    ck_assert_int_eq(psk_codec_decode_add_cpu(y, n, pl.p, pl.len, c, 1.0f), 0);
    free(pl.p);
    return y;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- parse, sizes ---- */

START_TEST(test_parse_accepts)
{
    static const struct {
        const char *text;
        psk_codec_kind_t kind;
        float fraction;
    } ok[] = {
        {"none", PSK_CODEC_NONE, 0.0f},        {"fp16", PSK_CODEC_FP16, 0.0f},
        {"bf16", PSK_CODEC_BF16, 0.0f},        {"int8", PSK_CODEC_INT8, 0.0f},
        {"sign", PSK_CODEC_SIGN, 0.0f},        {"topk:0.01", PSK_CODEC_TOPK, 0.01f},
        {"topk:1", PSK_CODEC_TOPK, 1.0f},      {"topk:.5", PSK_CODEC_TOPK, 0.5f},
        {"topk:1e-3", PSK_CODEC_TOPK, 1e-3f},  {"randomk:0.01", PSK_CODEC_RANDOMK, 0.01f},
        {"randomk:1.0", PSK_CODEC_RANDOMK, 1.0f},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        psk_codec_t c;
        memset(&c, 0xa5, sizeof c);
        ck_assert_msg(psk_codec_parse(&c, ok[i].text) == 0, "%s rejected", ok[i].text);
        ck_assert_int_eq(c.kind, ok[i].kind);
        ck_assert(c.fraction == ok[i].fraction);
        ck_assert_uint_eq(c.block, PSK_CODEC_BLOCK_DEFAULT);
        ck_assert_int_eq(c.fp16_values, 0);
        ck_assert_int_eq(c.stochastic, 0);
        ck_assert_uint_eq(c.seed, 0);
    }
}
END_TEST

START_TEST(test_parse_rejects)
{
    static const char *bad[] = {
        "",          "NONE",       "fp32",        "int4",        "topk",       "topk:",
        "topk:0",    "topk:0.0",   "topk:1.5",    "topk:abc",    "topk:-0.1",  "topk: 0.1",
        "topk:+0.1", "topk:0.1x",  "topk:nan",    "topk:inf",    "topk:1e-60", "topk:0.1:2",
        "randomk:0", "randomk:2",  "randomk",     "int8:128",    "fp16:",      "sign:0.5",
        "none ",     " none",      "topk0.1",     "topk:0x",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        psk_codec_t c = {.kind = PSK_CODEC_SIGN, .block = 99};
        ck_assert_msg(psk_codec_parse(&c, bad[i]) == PS_EINVAL, "'%s' accepted", bad[i]);
        ck_assert_int_eq(c.kind, PSK_CODEC_SIGN); /* untouched */
        ck_assert_uint_eq(c.block, 99);
    }
    psk_codec_t c;
    ck_assert_int_eq(psk_codec_parse(&c, NULL), PS_EINVAL);
}
END_TEST

START_TEST(test_sizes)
{
    psk_codec_t topk = {.kind = PSK_CODEC_TOPK, .fraction = 0.1f};
    ck_assert_uint_eq(psk_codec_k(&topk, 1000), 100); /* 0.1f * 1000 is 100.0000015 */
    ck_assert_uint_eq(psk_codec_k(&topk, 1001), 101);
    ck_assert_uint_eq(psk_codec_k(&topk, 1), 1);
    ck_assert_uint_eq(psk_codec_k(&topk, 0), 0);
    topk.fraction = 0.01f;
    ck_assert_uint_eq(psk_codec_k(&topk, 1000000), 10000);
    ck_assert_uint_eq(psk_codec_k(&topk, 5), 1);
    topk.fraction = 1.0f;
    ck_assert_uint_eq(psk_codec_k(&topk, 77), 77);

    const size_t n = 1000, h = PSK_CODEC_HEADER_BYTES;
    psk_codec_t c = {.kind = PSK_CODEC_NONE};
    ck_assert_uint_eq(psk_codec_max_bytes(&c, n), h + 4000);
    c.kind = PSK_CODEC_FP16;
    ck_assert_uint_eq(psk_codec_max_bytes(&c, n), h + 2000);
    c.kind = PSK_CODEC_BF16;
    ck_assert_uint_eq(psk_codec_max_bytes(&c, n), h + 2000);
    c = (psk_codec_t){.kind = PSK_CODEC_INT8, .block = 256};
    ck_assert_uint_eq(psk_codec_max_bytes(&c, n), h + 4 * 4 + 1000);
    c = (psk_codec_t){.kind = PSK_CODEC_SIGN, .block = 256};
    ck_assert_uint_eq(psk_codec_max_bytes(&c, n), h + 4 * 4 + 125);
    ck_assert_uint_eq(psk_codec_max_bytes(&c, 1001), h + 4 * 4 + 126);
    c = (psk_codec_t){.kind = PSK_CODEC_TOPK, .fraction = 0.01f};
    ck_assert_uint_eq(psk_codec_max_bytes(&c, n), h + 10 * 8);
    c.fp16_values = 1;
    ck_assert_uint_eq(psk_codec_max_bytes(&c, n), h + 10 * 6);
    ck_assert_uint_eq(psk_codec_scratch_bytes(&c, n), 4 * n + 32772);
    c = (psk_codec_t){.kind = PSK_CODEC_RANDOMK, .fraction = 0.01f};
    ck_assert_uint_eq(psk_codec_max_bytes(&c, n), h + 8 + 10 * 4);
    ck_assert_uint_eq(psk_codec_scratch_bytes(&c, n), 0);

    /* Invalid codecs. */
    c = (psk_codec_t){.kind = (psk_codec_kind_t)99};
    ck_assert_uint_eq(psk_codec_max_bytes(&c, n), 0);
    c = (psk_codec_t){.kind = PSK_CODEC_INT8, .block = 0};
    ck_assert_uint_eq(psk_codec_max_bytes(&c, n), 0);
    c = (psk_codec_t){.kind = PSK_CODEC_TOPK, .fraction = 0.0f};
    ck_assert_uint_eq(psk_codec_max_bytes(&c, n), 0);
    c = (psk_codec_t){.kind = PSK_CODEC_TOPK, .fraction = NAN};
    ck_assert_uint_eq(psk_codec_max_bytes(&c, n), 0);
}
END_TEST

/* ---- round trips ---- */

START_TEST(test_none_exact)
{
    float x[N];
    fill_normal(x, N, 1, 1.0);
    float *y = round_trip(&CODECS[0], x, N);
    ck_assert_mem_eq(y, x, sizeof x);
    free(y);
}
END_TEST

/* Values of both signs spread over fp16's normal range, 2^-14 .. 60000. */
static void fill_log_uniform(float *x, size_t n, uint64_t seed, double lo, double hi)
{
    rng_state = seed;
    for (size_t i = 0; i < n; i++) {
        double m = exp(log(lo) + (log(hi) - log(lo)) * rng_unit());
        x[i] = (float)((rng_next() & 1) ? m : -m);
    }
}

START_TEST(test_fp16_round_trip)
{
    float x[N];
    fill_log_uniform(x, N, 2, 0x1.0p-14, 60000.0);
    float *y = round_trip(&CODECS[1], x, N);
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(fabsf(y[i] - x[i]) <= 1e-3f * fabsf(x[i]), "x %g y %g", x[i], y[i]);
    free(y);
}
END_TEST

/* Every fp16 value survives fp16 -> fp32 -> fp16 exactly (NaN as NaN), which checks both
 * conversions over the whole range at once; plus rounding at the edges. */
START_TEST(test_fp16_exhaustive_and_special)
{
    const psk_codec_t *c = &CODECS[1];
    const size_t n = 65536;
    uint8_t *pl = xmalloc(psk_codec_max_bytes(c, n));
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = -0.0f; /* see round_trip */
    /* A valid fp16 payload (header from encoding zeros) holding all 65536 bit patterns. */
    size_t len;
    ck_assert_int_eq(psk_codec_encode_cpu(pl, psk_codec_max_bytes(c, n), &len, x, n, c, NULL), 0);
    for (size_t h = 0; h < n; h++) {
        uint16_t v = (uint16_t)h;
        memcpy(pl + PSK_CODEC_HEADER_BYTES + 2 * h, &v, 2);
    }
    ck_assert_int_eq(psk_codec_decode_add_cpu(x, n, pl, len, c, 1.0f), 0);
    payload_t back = encode(c, x, n);
    for (size_t h = 0; h < n; h++) {
        uint16_t v;
        memcpy(&v, back.p + PSK_CODEC_HEADER_BYTES + 2 * h, 2);
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) {
            ck_assert_msg(isnan(x[h]), "half %04zx: %g", h, x[h]);
            ck_assert_uint_eq(v, (h & 0x8000) | 0x7e00);
        } else {
            ck_assert_msg(v == h, "half %04zx -> %g -> %04x", h, x[h], v);
        }
    }
    ck_assert(x[0x3c00] == 1.0f && x[0x7bff] == 65504.0f && x[0x0001] == 0x1.0p-24f);
    free(back.p);

    /* Ties to even, overflow, subnormal rounding, signed zero. */
    float in[] = {1.0f + 0x1.0p-11f, 1.0f + 3 * 0x1.0p-11f, 65504.0f, 65519.0f, 65520.0f,
                  -1e6f,             0x1.8p-25f,          0x1.0p-25f, -0.0f,   INFINITY,
                  -INFINITY,         NAN};
    float want[] = {1.0f,      1.0f + 0x1.0p-9f, 65504.0f, 65504.0f, INFINITY,
                    -INFINITY, 0x1.0p-24f,       0.0f,     -0.0f,    INFINITY,
                    -INFINITY, NAN};
    size_t m = sizeof in / sizeof in[0];
    float *y = round_trip(c, in, m);
    for (size_t i = 0; i < m; i++) {
        if (isnan(want[i]))
            ck_assert(isnan(y[i]));
        else
            ck_assert_msg(bits_of(y[i]) == bits_of(want[i]), "%a -> %a, want %a", in[i], y[i],
                          want[i]);
    }
    free(y);
    free(x);
    free(pl);
}
END_TEST

/* fp16 encoding of random finite floats (all exponents, so overflow and subnormals too) equals
 * the compiler's own float -> _Float16 conversion (round to nearest even), whichever path the
 * kernel takes (F16C or scalar). */
START_TEST(test_fp16_matches_compiler)
{
#if defined(__FLT16_MAX__)
    const psk_codec_t *c = &CODECS[1];
    const size_t n = 100003; /* not a multiple of 8: the scalar tail runs too */
    float *x = xmalloc(n * sizeof(float));
    uint32_t s = 12345;
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        do {
            s = s * 1664525u + 1013904223u;
            b = s;
        } while ((b & 0x7f800000u) == 0x7f800000u); /* finite only */
        /* bias the exponents towards fp16's range, where the rounding matters */
        if (i % 2) b = (b & 0x807fffffu) | ((uint32_t)(100 + (b >> 24) % 60) << 23);
        memcpy(&x[i], &b, 4);
    }
    payload_t p = encode(c, x, n);
    for (size_t i = 0; i < n; i++) {
        _Float16 h = (_Float16)x[i];
        uint16_t want, got;
        memcpy(&want, &h, 2);
        memcpy(&got, p.p + PSK_CODEC_HEADER_BYTES + 2 * i, 2);
        ck_assert_msg(got == want, "%a -> %04x, want %04x", x[i], got, want);
    }
    free(p.p);
    free(x);
#endif
}
END_TEST

/* fp16 or bf16 (@p c) with error feedback (one fused pass where F16C or AVX2 runs it) gives
 * the payload and residual of the plain definition: x = r + g, payload = enc(x) but a finite x
 * whose encoding is an infinity sent as the format's largest value of its sign (session 60:
 * before, it went out as an infinity, psd left the push out each step and the residual lost
 * x), r = x - decode(payload), or 0 where that is a NaN or an infinity (the value went out as
 * one, and psd leaves that push out; before, the residual kept it and every later push of the
 * chunk carried it: "residual 0x0p+0, want nan"); with NaN, infinities and overflow among the
 * values, and a tail that is not a multiple of 8 or 16. */
static void ef_matches_definition(const psk_codec_t *c)
{
    const size_t n = 4099;
    float *g = xmalloc(n * 4), *r = xmalloc(n * 4), *r2 = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        g[i] = (float)((i * 2654435761u) % 20001) * 1e-3f - 10.0f;
        r[i] = (float)((i * 40503u) % 1001) * 1e-7f;
    }
    g[100] = NAN;
    g[2000] = INFINITY;
    g[3000] = 1e6f;                     /* overflows fp16 */
    g[3500] = float_of(0x7f7fffffu);    /* rounds to bf16 infinity */
    memcpy(r2, r, n * 4);
    size_t cap = psk_codec_max_bytes(c, n), len, len2;
    uint8_t *p = xmalloc(cap), *p2 = xmalloc(cap);
    for (int step = 0; step < 3; step++) {
        ck_assert_int_eq(psk_codec_encode_ef_cpu(p, cap, &len, g, r, n, c, NULL), 0);
        /* the definition, by hand; a payload holding a NaN or an infinity is one psd leaves
         * out: the residual keeps x then */
        for (size_t i = 0; i < n; i++) r2[i] += g[i];
        ck_assert_int_eq(psk_codec_encode_cpu(p2, cap, &len2, r2, n, c, NULL), 0);
        uint16_t inf = c->kind == PSK_CODEC_FP16 ? 0x7c00 : 0x7f80;
        for (size_t i = 0; i < n; i++) { /* saturate */
            uint8_t *h = p2 + PSK_CODEC_HEADER_BYTES + 2 * i;
            if (isfinite(r2[i]) && ((h[0] | h[1] << 8) & 0x7fff) == inf) {
                h[0] = (uint8_t)(inf - 1);
                h[1] = (uint8_t)(h[1] & 0x80) | (uint8_t)((inf - 1) >> 8);
            }
        }
        ck_assert_int_eq(psk_codec_decode_add_cpu(r2, n, p2, len2, c, -1.0f), 0);
        for (size_t i = 0; i < n; i++)
            if (!isfinite(r2[i])) r2[i] = 0.0f;
        ck_assert_uint_eq(len, len2);
        ck_assert_int_eq(memcmp(p, p2, len), 0);
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(bits_of(r[i]) == bits_of(r2[i]) && isfinite(r[i]),
                          "step %d value %zu: residual %a, want %a", step, i, r[i], r2[i]);
        if (step == 1) { /* the NaN gone from the gradient is gone from what is sent */
            float *d = xmalloc(n * 4);
            memset(d, 0, n * 4);
            ck_assert_int_eq(psk_codec_decode_add_cpu(d, n, p, len, c, 1.0f), 0);
            ck_assert_msg(isfinite(d[100]) && !isfinite(d[2000]), "sent %a at 100, %a at 2000",
                          d[100], d[2000]);
            free(d);
        }
        g[100] = 0.5f; /* later steps: the NaN is gone from the gradient */
    }
    free(g);
    free(r);
    free(r2);
    free(p);
    free(p2);
}

/* Error feedback keeps its residual finite with every codec that sends a NaN or an infinity
 * on (fp16, bf16, top-k with float32 or fp16 values, random-k): a gradient with many of them
 * (more than top-k's k) goes out holding one (random-k whatever it sampled), so psd leaves it
 * out, and top-k's and random-k's residual keeps what was not sent (x, 0 for those: what built
 * up at the k coordinates is not lost); the next, clean gradient goes out finite (before,
 * top-k and random-k kept the ones not sent in the residual for good, fp16 / bf16 every one;
 * random-k sent a finite payload when it sampled none of them). */
START_TEST(test_ef_residual_stays_finite)
{
    static const char *const names[] = {"fp16", "bf16", "topk:0.01", "randomk:0.01",
                                        "topk:0.05"};
    psk_codec_t c;
    ck_assert_int_eq(psk_codec_parse(&c, names[_i % 5]), 0);
    c.fp16_values = _i >= 5; /* top-k / random-k values as fp16 */
    const size_t n = 3001;
    float *g = xmalloc(n * 4), *r = xmalloc(n * 4), *d = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        g[i] = (float)((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
        r[i] = 0.0f;
    }
    /* 73 of them: more than top-k's k of 30. A finite value out of fp16's range (fp16) is
     * sent as an infinity at once; one top-k did not send stays in its residual, finite, and
     * goes out (as an infinity, with fp16 values) when it is sent: only NaN and infinities
     * for the sparse codecs. */
    bool dense = c.kind == PSK_CODEC_FP16 || c.kind == PSK_CODEC_BF16;
    for (size_t i = 7; i < n; i += 41)
        g[i] = i % 3 == 0 ? NAN : i % 3 == 1 || !dense ? -INFINITY : 1e30f * (float)(i % 5 + 1);
    size_t cap = psk_codec_max_bytes(&c, n), len;
    uint8_t *p = xmalloc(cap), *scratch = xmalloc(psk_codec_scratch_bytes(&c, n) + 1);
    for (int step = 0; step < 2; step++) {
        c.seed = (uint64_t)step + 1;
        float *x = xmalloc(n * 4); /* top-k / random-k: what a push left out keeps in the
                                    * residual, 0 for a NaN or an infinity */
        for (size_t i = 0; i < n; i++)
            x[i] = step == 0 && i % 41 == 7 ? 0.0f : r[i] + g[i];
        ck_assert_int_eq(psk_codec_encode_ef_cpu(p, cap, &len, g, r, n, &c,
                                                 psk_codec_scratch_bytes(&c, n) ? scratch : NULL),
                         0);
        ck_assert_msg(psk_all_finite(r, n), "%s (fp16 values %d) step %d: the residual holds a "
                      "NaN or an infinity", names[_i % 5], c.fp16_values, step);
        memset(d, 0, n * 4);
        ck_assert_int_eq(psk_codec_decode_add_cpu(d, n, p, len, &c, 1.0f), 0);
        if (step == 1)
            ck_assert_msg(psk_all_finite(d, n), "%s step 1: a clean gradient went out holding "
                          "a NaN or an infinity", names[_i % 5]);
        if (step == 0) { /* psd leaves it out (random-k too, whatever it sampled); top-k's
                          * and random-k's residual keeps all that was not sent */
            ck_assert_msg(!psk_all_finite(d, n), "%s: a gradient holding NaN went out finite",
                          names[_i % 5]);
            for (size_t i = 0; !dense && i < n; i++)
                ck_assert_msg(bits_of(r[i]) == bits_of(x[i]), "%s: residual %zu is %a, want %a",
                              names[_i % 5], i, r[i], x[i]);
        }
        free(x);
        for (size_t i = 0; i < n; i++) /* the next gradient is clean */
            g[i] = (float)((i * 40503u) % 1001) * 1e-3f;
    }
    free(g);
    free(r);
    free(d);
    free(p);
    free(scratch);
}
END_TEST

/* Error feedback loses nothing to a finite value out of the half format's range (fp16, bf16,
 * top-k's and random-k's fp16 values): the payload is one psd applies (checked, every value
 * finite), the value goes out as the format's largest of its sign, and what was sent plus the
 * residual is what the gradients summed to, step after step. Before (session 59's note): such
 * a value went out as an infinity, psd left the chunk's push out each step, and the residual
 * lost it. */
START_TEST(test_ef_half_saturates)
{
    static const char *const names[] = {"fp16", "bf16", "topk:0.01", "randomk:1"};
    psk_codec_t c;
    ck_assert_int_eq(psk_codec_parse(&c, names[_i]), 0);
    c.fp16_values = 1;
    bool bf16 = c.kind == PSK_CODEC_BF16;
    const size_t n = 1000;
    const float big = bf16 ? FLT_MAX : 1e6f, top = bf16 ? 0x1.fep127f : 65504.0f;
    float *g = xmalloc(n * 4), *r = xmalloc(n * 4), *d = xmalloc(n * 4);
    double *sent = xmalloc(n * 8), *sum = xmalloc(n * 8);
    for (size_t i = 0; i < n; i++)
        r[i] = 0.0f, sent[i] = sum[i] = 0.0;
    size_t cap = psk_codec_max_bytes(&c, n), len;
    uint8_t *p = xmalloc(cap), *scratch = xmalloc(psk_codec_scratch_bytes(&c, n) + 4);
    for (int step = 0; step < 4; step++) {
        for (size_t i = 0; i < n; i++)
            g[i] = step > 0 ? 0.0f : (float)((i * 40503u) % 1001) * 1e-4f;
        if (step == 0)
            g[5] = big, g[6] = -big;
        for (size_t i = 0; i < n; i++)
            sum[i] += g[i];
        c.seed = (uint64_t)step + 1;
        ck_assert_int_eq(psk_codec_encode_ef_cpu(p, cap, &len, g, r, n, &c,
                                                 psk_codec_scratch_bytes(&c, n) ? scratch : NULL),
                         0);
        ck_assert_int_eq(psk_codec_check(p, len, n, &c), 0);
        memset(d, 0, n * 4);
        ck_assert_int_eq(psk_codec_decode_add_cpu(d, n, p, len, &c, 1.0f), 0);
        ck_assert_msg(psk_all_finite(d, n) && psk_all_finite(r, n),
                      "%s step %d: a finite gradient went out or stayed as a NaN or infinity",
                      names[_i], step);
        /* fp16: 1e6 is 15 steps' worth; bf16: FLT_MAX's excess over bf16's top is 2^120 */
        ck_assert_msg((d[5] == top && d[6] == -top) || (bf16 && step > 0),
                      "%s step %d: sent %a and %a, want %a",
                      names[_i], step, d[5], d[6], top);
        for (size_t i = 0; i < n; i++)
            sent[i] += d[i];
    }
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(fabs(sent[i] + r[i] - sum[i]) <= 1e-6 * fabs(sum[i]) + 1e-6,
                      "%s value %zu: sent %g + residual %g, the gradients %g", names[_i], i,
                      sent[i], (double)r[i], sum[i]);
    free(g);
    free(r);
    free(d);
    free(sent);
    free(sum);
    free(p);
    free(scratch);
}
END_TEST

START_TEST(test_fp16_ef_matches_definition) { ef_matches_definition(&CODECS[1]); }
END_TEST

START_TEST(test_bf16_ef_matches_definition) { ef_matches_definition(&CODECS[2]); }
END_TEST

/* bf16 encoding and decoding of many values at once (AVX2 where the CPU has it) equal, bit for
 * bit, the same values taken one at a time (the scalar reference): random bit patterns of every
 * exponent, exact ties, NaNs (with payloads) and infinities among them, and a tail past the
 * last 16. */
START_TEST(test_bf16_bulk_matches_scalar)
{
    const psk_codec_t *c = &CODECS[2];
    const size_t n = 100003;
    float *x = xmalloc(n * sizeof(float)), *y = xmalloc(n * sizeof(float));
    uint32_t st = 777;
    for (size_t i = 0; i < n; i++) {
        st = st * 1664525u + 1013904223u;
        uint32_t b = st;
        if (i % 997 == 5) b |= 0x7f800000u;                 /* infinities and NaNs */
        if (i % 101 == 7) b = (b & 0xffff0000u) | 0x8000u;  /* ties: to even */
        memcpy(&x[i], &b, 4);
        y[i] = (float)(i % 7) - 3.0f;
    }
    payload_t bulk = encode(c, x, n);
    float *acc = xmalloc(n * sizeof(float));
    memcpy(acc, y, n * sizeof(float));
    ck_assert_int_eq(psk_codec_decode_add_cpu(acc, n, bulk.p, bulk.len, c, 0.5f), 0);
    for (size_t i = 0; i < n; i++) {
        payload_t one = encode(c, &x[i], 1);
        ck_assert_msg(memcmp(one.p + PSK_CODEC_HEADER_BYTES,
                             bulk.p + PSK_CODEC_HEADER_BYTES + 2 * i, 2) == 0,
                      "value %zu (%08x): bulk and scalar encodings differ", i, bits_of(x[i]));
        float a = y[i];
        ck_assert_int_eq(psk_codec_decode_add_cpu(&a, 1, one.p, one.len, c, 0.5f), 0);
        ck_assert_msg(bits_of(a) == bits_of(acc[i]) || (isnan(a) && isnan(acc[i])),
                      "value %zu: bulk decode %a, scalar %a", i, acc[i], a);
        free(one.p);
    }
    free(bulk.p);
    free(acc);
    free(x);
    free(y);
}
END_TEST

START_TEST(test_bf16_round_trip)
{
    float x[N];
    fill_log_uniform(x, N, 3, 1e-30, 1e30);
    float *y = round_trip(&CODECS[2], x, N);
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(fabsf(y[i] - x[i]) <= 8e-3f * fabsf(x[i]), "x %g y %g", x[i], y[i]);
    free(y);

    /* Ties to even, overflow near FLT_MAX, NaN with only low payload bits stays NaN. */
    float in[] = {float_of(0x3f808000u), float_of(0x3f818000u), float_of(0x3f808001u),
                  FLT_MAX,               -FLT_MAX,              INFINITY,
                  -INFINITY,             float_of(0x7f800001u), float_of(0xff800001u),
                  -0.0f,                 float_of(0x00000001u)};
    uint32_t want[] = {0x3f800000u, 0x3f820000u, 0x3f810000u, 0x7f800000u,
                       0xff800000u, 0x7f800000u, 0xff800000u, 0,
                       0,           0x80000000u, 0x00000000u};
    size_t m = sizeof in / sizeof in[0];
    y = round_trip(&CODECS[2], in, m);
    for (size_t i = 0; i < m; i++) {
        if (bits_of(in[i]) == 0x7f800001u || bits_of(in[i]) == 0xff800001u) {
            ck_assert(isnan(y[i]));
            ck_assert_uint_eq(bits_of(y[i]) >> 31, bits_of(in[i]) >> 31);
        } else {
            ck_assert_msg(bits_of(y[i]) == want[i], "%a -> %a", in[i], y[i]);
        }
    }
    free(y);
}
END_TEST

/* int8 (nearest and stochastic) over blocks of 256 (AVX2 where the CPU has it) equals, bit for
 * bit, the same values over blocks of 7 (too short for the vector code: the scalar reference):
 * every 7th value is +-M, the largest magnitude, so every block of either size has scale M/127,
 * and stochastic rounding hashes the value's index in the chunk either way. Decoding-adds agree
 * too. */
START_TEST(test_int8_bulk_matches_scalar)
{
    const size_t n = 7 * 4099; /* blocks of 256 leave a tail */
    float *x = xmalloc(n * sizeof(float));
    uint32_t st = 99;
    for (size_t i = 0; i < n; i++) {
        st = st * 1664525u + 1013904223u;
        x[i] = i % 7 == 0 ? (i % 14 ? 3.0f : -3.0f)
                          : ((float)(st >> 8) * 0x1.0p-24f * 5.98f - 2.99f); /* |x| < 3 */
    }
    for (int stochastic = 0; stochastic < 2; stochastic++) {
        psk_codec_t big = {.kind = PSK_CODEC_INT8, .block = 256, .stochastic = stochastic,
                           .seed = 5},
                    small = big;
        small.block = 7;
        payload_t pb = encode(&big, x, n), ps = encode(&small, x, n);
        size_t nbb = (n + 255) / 256, nbs = n / 7;
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(pb.p[PSK_CODEC_HEADER_BYTES + 4 * nbb + i] ==
                              ps.p[PSK_CODEC_HEADER_BYTES + 4 * nbs + i],
                          "stochastic %d value %zu (%a): %d in blocks of 256, %d in blocks of 7",
                          stochastic, i, x[i], (int8_t)pb.p[PSK_CODEC_HEADER_BYTES + 4 * nbb + i],
                          (int8_t)ps.p[PSK_CODEC_HEADER_BYTES + 4 * nbs + i]);
        float *yb = xmalloc(n * sizeof(float)), *ys = xmalloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) yb[i] = ys[i] = (float)(i % 5) - 2.0f;
        ck_assert_int_eq(psk_codec_decode_add_cpu(yb, n, pb.p, pb.len, &big, -1.0f), 0);
        ck_assert_int_eq(psk_codec_decode_add_cpu(ys, n, ps.p, ps.len, &small, -1.0f), 0);
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(bits_of(yb[i]) == bits_of(ys[i]), "stochastic %d value %zu: %a, %a",
                          stochastic, i, yb[i], ys[i]);
        free(yb);
        free(ys);
        free(pb.p);
        free(ps.p);
    }
    free(x);
}
END_TEST

/* The sign payload (AVX2 where the CPU has it) equals, byte for byte, its definition computed
 * here: per block the mean |x| summed in double over 8 lanes (lane l takes values l, l + 8, ...
 * in order; the lanes added pairwise), then value i's sign as bit i % 8 of byte i / 8. Blocks
 * of 256 and of 13, a chunk length past the last 32. */
START_TEST(test_sign_matches_definition)
{
    const size_t n = 4099;
    float *x = xmalloc(n * sizeof(float));
    fill_log_uniform(x, n, 9, 1e-6, 1e3);
    for (size_t i = 0; i < n; i += 3) x[i] = -x[i];
    static const uint32_t blocks[] = {256, 13};
    for (int bi = 0; bi < 2; bi++) {
        psk_codec_t c = {.kind = PSK_CODEC_SIGN, .block = blocks[bi]};
        payload_t p = encode(&c, x, n);
        size_t nb = (n + c.block - 1) / c.block;
        const uint8_t *body = p.p + PSK_CODEC_HEADER_BYTES;
        for (size_t b = 0; b < nb; b++) {
            size_t s0 = b * c.block, len = n - s0 < c.block ? n - s0 : c.block;
            double acc[8] = {0};
            for (size_t i = 0; i < len; i++) acc[i % 8] += fabs((double)x[s0 + i]);
            double sum =
                ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            float want = (float)(sum / (double)len), got;
            memcpy(&got, body + 4 * b, 4);
            ck_assert_msg(bits_of(got) == bits_of(want), "block %u: scale %a, want %a",
                          blocks[bi], got, want);
        }
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(((body[4 * nb + i / 8] >> (i % 8)) & 1) == (bits_of(x[i]) >> 31),
                          "block %u value %zu: wrong sign bit", blocks[bi], i);
        free(p.p);
    }
    free(x);
}
END_TEST

/* absmax of x[s, s + len). */
static float absmax(const float *x, size_t s, size_t len)
{
    float m = 0;
    for (size_t i = s; i < s + len; i++)
        m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

/* Block sizes for the int8 and sign round trips: byte-aligned, odd, one, a partial chunk. */
static const uint32_t BLOCKS[] = {BLOCK, 13, 1, 256};

START_TEST(test_int8_round_trip)
{
    psk_codec_t c = CODECS[3];
    c.block = BLOCKS[_i];
    float x[N];
    fill_normal(x, N, 4, 3.0);
    for (size_t i = 128; i < 192; i++) /* one all-zero block */
        x[i] = 0.0f;
    for (size_t i = 192; i < 256; i++) /* one block of tiny values */
        x[i] *= 1e-40f;
    float *y = round_trip(&c, x, N);
    for (size_t s = 0; s < N; s += c.block) {
        size_t len = N - s < c.block ? N - s : c.block;
        float step = absmax(x, s, len) / 127.0f;
        for (size_t i = s; i < s + len; i++)
            ck_assert_msg(fabsf(y[i] - x[i]) <= 0.5f * step * (1.0f + 1e-4f) + 1e-44f,
                          "i %zu x %g y %g step %g", i, x[i], y[i], step);
    }
    for (size_t i = 128; i < 192; i++)
        ck_assert(y[i] == 0.0f);
    free(y);
}
END_TEST

START_TEST(test_int8_stochastic)
{
    float x[N];
    fill_normal(x, N, 5, 1.0);
    psk_codec_t c = CODECS[4];
    double *mean = xmalloc(N * sizeof(double));
    memset(mean, 0, N * sizeof(double));
    const int trials = 400;
    for (int t = 0; t < trials; t++) {
        c.seed = (uint64_t)t * 7919u + 1;
        float *y = round_trip(&c, x, N);
        for (size_t s = 0; s < N; s += BLOCK) {
            size_t len = N - s < BLOCK ? N - s : BLOCK;
            float step = absmax(x, s, len) / 127.0f;
            for (size_t i = s; i < s + len; i++) {
                ck_assert_msg(fabsf(y[i] - x[i]) <= step * (1.0f + 1e-4f), "x %g y %g", x[i],
                              y[i]);
                mean[i] += y[i];
            }
        }
        free(y);
    }
    /* Unbiased: the mean over seeds approaches x (std of the mean <= step / 2 / sqrt(400)). */
    for (size_t s = 0; s < N; s += BLOCK) {
        size_t len = N - s < BLOCK ? N - s : BLOCK;
        float step = absmax(x, s, len) / 127.0f;
        for (size_t i = s; i < s + len; i++)
            ck_assert_msg(fabs(mean[i] / trials - x[i]) <= 0.15 * step, "i %zu", i);
    }
    /* Same seed, same bytes; another seed, other bytes. */
    c.seed = 42;
    payload_t a = encode(&c, x, N), b = encode(&c, x, N);
    ck_assert_mem_eq(a.p, b.p, a.len);
    c.seed = 43;
    payload_t d = encode(&c, x, N);
    ck_assert(memcmp(a.p, d.p, a.len) != 0);
    free(a.p);
    free(b.p);
    free(d.p);
    free(mean);
}
END_TEST

START_TEST(test_sign_round_trip)
{
    psk_codec_t c = CODECS[9];
    c.block = BLOCKS[_i];
    float x[N];
    fill_normal(x, N, 6, 2.0);
    x[5] = 0.0f;
    float *y = round_trip(&c, x, N);
    for (size_t s = 0; s < N; s += c.block) {
        size_t len = N - s < c.block ? N - s : c.block;
        double mean = 0;
        for (size_t i = s; i < s + len; i++)
            mean += fabs((double)x[i]);
        mean /= (double)len;
        for (size_t i = s; i < s + len; i++) {
            ck_assert_msg(fabs(fabs((double)y[i]) - mean) <= 1e-6 * mean, "i %zu", i);
            ck_assert(signbit(y[i]) == signbit(x[i])); /* +0 -> +scale */
        }
    }
    free(y);
}
END_TEST

/* Reference topk: sort indices by (|x| desc, index asc), take k. */
static const float *ref_x;
static int by_mag_desc(const void *a, const void *b)
{
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    uint32_t ki = bits_of(ref_x[i]) & 0x7fffffffu, kj = bits_of(ref_x[j]) & 0x7fffffffu;
    if (ki != kj)
        return ki > kj ? -1 : 1;
    return i < j ? -1 : 1;
}

/* Checks topk on x[n]: exactly the reference indices, values x there (or their fp16), zeros
 * elsewhere, indices in the payload ascending. */
static void check_topk(const psk_codec_t *c, const float *x, size_t n)
{
    size_t k = psk_codec_k(c, n);
    uint32_t *order = xmalloc(n * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    ref_x = x;
    qsort(order, n, sizeof *order, by_mag_desc);
    char *chosen = xmalloc(n);
    memset(chosen, 0, n);
    for (size_t j = 0; j < k; j++)
        chosen[order[j]] = 1;

    payload_t pl = encode(c, x, n);
    size_t wrong = k; /* the first payload index not in the top k, or not ascending */
    for (size_t j = 0, prev = 0; j < k && wrong == k; j++) {
        uint32_t idx;
        memcpy(&idx, pl.p + PSK_CODEC_HEADER_BYTES + 4 * j, 4);
        wrong = idx < n && chosen[idx] && (j == 0 || idx > prev) ? k : j;
        prev = idx;
    }
    ck_assert_msg(wrong == k, "payload index %zu of %zu not in the top k or not ascending", wrong,
                  k);
    float *y = zeros(n);
    ck_assert_int_eq(psk_codec_decode_add_cpu(y, n, pl.p, pl.len, c, 1.0f), 0);
    /* One assertion after the loop: Check's assertions cost a system call each. */
    size_t bad = n;
    for (size_t i = n; i-- > 0;) {
        bool ok;
        if (!chosen[i])
            ok = bits_of(y[i]) == 0;
        else if (isnan(x[i]) || isinf(x[i]))
            ok = isnan(x[i]) ? isnan(y[i]) : y[i] == x[i];
        else if (c->fp16_values)
            ok = fabsf(y[i] - x[i]) <= 1e-3f * fabsf(x[i]);
        else
            ok = bits_of(y[i]) == bits_of(x[i]) || x[i] == 0.0f;
        bad = ok ? bad : i;
    }
    ck_assert_msg(bad == n, "y[%zu] = %g for x %g (%s)", bad, bad < n ? y[bad] : 0.0f,
                  bad < n ? x[bad] : 0.0f, bad < n && chosen[bad] ? "sent" : "not sent");
    free(y);
    free(pl.p);
    free(chosen);
    free(order);
}

/*
 * The selection cases for x[n] of any size: normal values, magnitudes in one level-1 bin
 * (decided by the lower levels: @p low_bits of mantissa vary), heavy ties (three magnitudes;
 * ties go to the lowest indices), all zeros; at each of @p fractions where the case depends
 * on it. Leaves x zeroed.
 */
static void topk_cases(psk_codec_t *c, float *x, size_t n, const float *fractions, size_t nf,
                       uint32_t low_bits, uint64_t seed)
{
    fill_normal(x, n, seed, 1.0);
    for (size_t f = 0; f < nf; f++) {
        c->fraction = fractions[f];
        check_topk(c, x, n);
    }
    rng_state = seed + 1;
    for (size_t i = 0; i < n; i++)
        x[i] = float_of(0x3f800000u | (uint32_t)(rng_next() % low_bits)) * ((i & 1) ? -1 : 1);
    c->fraction = 0.01f;
    check_topk(c, x, n);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(i % 3) * ((i & 4) ? -1.0f : 1.0f);
    for (size_t f = 0; f < nf; f++) {
        c->fraction = fractions[f];
        check_topk(c, x, n);
    }
    memset(x, 0, n * sizeof(float));
    c->fraction = 0.01f;
    check_topk(c, x, n);
}

START_TEST(test_topk_selects_largest)
{
    const size_t n = 10007;
    float *x = xmalloc(n * sizeof(float));
    psk_codec_t c = CODECS[5 + _i % 2];
    static const float fractions[] = {0.001f, 0.01f, 0.05f, 0.5f, 1.0f};
    /* Every magnitude in [1, 1 + 2^-12) for the one-bin case. */
    topk_cases(&c, x, n, fractions, sizeof fractions / sizeof fractions[0], 2048, 7);
    x[0] = -3.0f; /* a single element */
    check_topk(&c, x, 1);
    free(x);
}
END_TEST

/*
 * Error feedback's topk (x = g + r summed inside the selection's pass) against the plain
 * encode of the same x: the same payload byte for byte, and the residual x - decode(x).
 */
static void check_topk_ef(const psk_codec_t *c, const float *x, size_t n)
{
    float *g = xmalloc(n * sizeof(float)), *r = xmalloc(n * sizeof(float));
    float *xs = xmalloc(n * sizeof(float));
    fill_normal(g, n, 99, 0.5);
    for (size_t i = 0; i < n; i++) {
        r[i] = x[i] - g[i];
        xs[i] = r[i] + g[i]; /* what the codec sees (x itself, to rounding) */
    }
    check_topk(c, xs, n);
    payload_t want = encode(c, xs, n);
    ck_assert_int_eq(psk_codec_decode_add_cpu(xs, n, want.p, want.len, c, -1.0f), 0);
    uint8_t *got = xmalloc(want.len);
    void *scratch = xmalloc(psk_codec_scratch_bytes(c, n));
    size_t len = 0;
    ck_assert_int_eq(psk_codec_encode_ef_cpu(got, want.len, &len, g, r, n, c, scratch), 0);
    ck_assert_uint_eq(len, want.len);
    ck_assert_mem_eq(got, want.p, len);
    size_t bad = n;
    for (size_t i = n; i-- > 0;)
        bad = bits_of(r[i]) == bits_of(xs[i]) ? bad : i;
    ck_assert_msg(bad == n, "residual %zu: %g, not %g", bad, bad < n ? r[bad] : 0.0f,
                  bad < n ? xs[bad] : 0.0f);
    free(scratch);
    free(got);
    free(want.p);
    free(xs);
    free(r);
    free(g);
}

/*
 * Chunks of 32768 values and more take the sampled path (a threshold guessed from 64 runs of
 * 64 values, then one pass for the candidates): the same selection as the definition whether
 * the guess is right, too high (fewer than k candidates: the full path again) or too low.
 */
START_TEST(test_topk_sampled_path)
{
    const size_t n = 262147; /* not a multiple of 16: the scalar tail */
    float *x = xmalloc(n * sizeof(float));
    psk_codec_t c = CODECS[5 + _i % 2];
    static const float fractions[] = {0.001f, 0.01f, 0.1f, 0.2f, 0.3f};

    fill_normal(x, n, 21, 1.0);
    c.fraction = 0.01f;
    check_topk_ef(&c, x, n);
    /* NaNs and infinities among them (NaN magnitudes rank above infinity). */
    for (size_t i = 0; i < n; i += 997)
        x[i] = (i / 997) % 3 == 0 ? NAN : (i / 997) % 3 == 1 ? INFINITY : -INFINITY;
    check_topk(&c, x, n);

    /* The sample's runs (at r * (n - 64) / 63) large, the rest small: the guess is too high. */
    fill_normal(x, n, 22, 1e-3);
    for (size_t r = 0; r < 64; r++)
        for (size_t l = r * (n - 64) / 63; l < r * (n - 64) / 63 + 64; l++)
            x[l] = 1000.0f + (float)(l % 4096);
    check_topk(&c, x, n);
    check_topk_ef(&c, x, n);
    /* The other way round: the guess is too low, nearly every value a candidate. */
    fill_normal(x, n, 23, 1000.0);
    for (size_t r = 0; r < 64; r++)
        for (size_t l = r * (n - 64) / 63; l < r * (n - 64) / 63 + 64; l++)
            x[l] = 1e-6f;
    check_topk(&c, x, n);
    check_topk_ef(&c, x, n);

    /* Ties across the threshold; magnitudes that share their top 22 bits, decided by the
     * last 9; all zeros (no threshold above zero: the full path). */
    topk_cases(&c, x, n, fractions, sizeof fractions / sizeof fractions[0], 512, 24);
    free(x);
}
END_TEST

START_TEST(test_topk_deterministic)
{
    float x[N];
    for (size_t i = 0; i < N; i++)
        x[i] = (float)(i % 7);
    payload_t a = encode(&CODECS[5], x, N), b = encode(&CODECS[5], x, N);
    ck_assert_mem_eq(a.p, b.p, a.len);
    free(a.p);
    free(b.p);
}
END_TEST

START_TEST(test_randomk_indices)
{
    static const size_t ns[] = {1, 7, 1000, 10007};
    static const double fractions[] = {0.001, 0.05, 0.3, 1.0};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
        for (size_t f = 0; f < sizeof fractions / sizeof fractions[0]; f++) {
            size_t n = ns[a];
            psk_codec_t c = {.kind = PSK_CODEC_RANDOMK, .fraction = (float)fractions[f]};
            size_t k = psk_codec_k(&c, n);
            uint32_t *idx = xmalloc(k * sizeof(uint32_t));
            uint32_t *again = xmalloc(k * sizeof(uint32_t));
            psk_codec_randomk_indices(idx, 1234, n, k);
            psk_codec_randomk_indices(again, 1234, n, k);
            ck_assert_mem_eq(idx, again, k * sizeof(uint32_t));
            for (size_t j = 0; j < k; j++) {
                ck_assert_uint_lt(idx[j], n);
                ck_assert(j == 0 || idx[j] > idx[j - 1]); /* sorted, hence distinct */
                /* In its stratum [j n / k, (j + 1) n / k). */
                ck_assert_uint_ge(idx[j], (uint64_t)j * n / k);
                ck_assert_uint_lt(idx[j], (uint64_t)(j + 1) * n / k);
            }
            if (k == n)
                for (size_t j = 0; j < k; j++)
                    ck_assert_uint_eq(idx[j], j);
            free(idx);
            free(again);
        }
    }
    /* Other seeds give other sets; each element is picked about k / n of the time. */
    const size_t n = 1000, k = 50, seeds = 2000;
    uint32_t idx[50], first[50];
    unsigned hits[1000] = {0};
    int differ = 0;
    psk_codec_randomk_indices(first, 0, n, k);
    for (uint64_t s = 0; s < seeds; s++) {
        psk_codec_randomk_indices(idx, s, n, k);
        differ += memcmp(idx, first, sizeof idx) != 0;
        for (size_t j = 0; j < k; j++)
            hits[idx[j]]++;
    }
    ck_assert_int_eq(differ, seeds - 1);
    for (size_t i = 0; i < n; i++) /* expected 100, std about 9.7 */
        ck_assert_msg(hits[i] > 50 && hits[i] < 150, "element %zu picked %u times", i, hits[i]);
}
END_TEST

START_TEST(test_randomk_round_trip)
{
    float x[N];
    fill_normal(x, N, 9, 1.0);
    psk_codec_t c = CODECS[7 + _i];
    size_t k = psk_codec_k(&c, N);
    uint32_t idx[N];
    psk_codec_randomk_indices(idx, c.seed, N, k);

    payload_t pl = encode(&c, x, N);
    /* Only the values travel: the payload's (fp32) values are x at the shared indices. */
    for (size_t j = 0; j < k && !c.fp16_values; j++) {
        float v;
        memcpy(&v, pl.p + PSK_CODEC_HEADER_BYTES + 8 + 4 * j, 4);
        ck_assert(v == x[idx[j]]);
    }
    /* The receiver adds exactly there, whatever its own psk_codec_t.seed says. */
    psk_codec_t receiver = c;
    receiver.seed = 999;
    float *y = zeros(N);
    ck_assert_int_eq(psk_codec_decode_add_cpu(y, N, pl.p, pl.len, &receiver, 1.0f), 0);
    size_t j = 0;
    for (size_t i = 0; i < N; i++) {
        if (j < k && idx[j] == i) {
            ck_assert_msg(fabsf(y[i] - x[i]) <= (c.fp16_values ? 1e-3f : 0.0f) * fabsf(x[i]),
                          "y[%zu]", i);
            j++;
        } else {
            ck_assert(bits_of(y[i]) == 0);
        }
    }
    free(y);
    free(pl.p);
}
END_TEST

/* Without error feedback, random-k's k values may miss a NaN or an infinity of x: its first
 * value says so (a NaN), so that psd leaves the push out as it does every other codec's
 * (before, a probe found, the rest of such a push was applied without a word). */
START_TEST(test_randomk_marks_nonfinite)
{
    psk_codec_t c = CODECS[7 + _i];
    const size_t n = 64;
    size_t k = psk_codec_k(&c, n);
    ck_assert_uint_lt(k, n);
    float x[64];
    const float odd[] = {NAN, INFINITY, -INFINITY};
    for (size_t o = 0; o < 3; o++)
        for (size_t at = 0; at < n; at++) {
            for (size_t i = 0; i < n; i++) x[i] = 0.25f * (float)(i + 1);
            x[at] = odd[o];
            payload_t pl = encode(&c, x, n);
            const uint8_t *v = pl.p + PSK_CODEC_HEADER_BYTES + 8;
            if (c.fp16_values)
                ck_assert_uint_eq((unsigned)(v[0] | v[1] << 8) & 0x7c00u, 0x7c00u);
            else {
                float f;
                memcpy(&f, v, 4);
                ck_assert(!isfinite(f));
            }
            free(pl.p);
        }
    /* A finite x is sent as it is. */
    for (size_t i = 0; i < n; i++) x[i] = 0.25f * (float)(i + 1);
    payload_t pl = encode(&c, x, n);
    float *y = zeros(n);
    ck_assert_int_eq(psk_codec_decode_add_cpu(y, n, pl.p, pl.len, &c, 1.0f), 0);
    ck_assert(psk_all_finite(y, n));
    free(y);
    free(pl.p);
}
END_TEST

/* int8 near FLT_MAX: the scale absmax / 127 rounded up made 127 * scale an infinity, and a
 * finite gradient decoded as one (psd then left it out as not finite: a probe). */
START_TEST(test_int8_largest_finite)
{
    psk_codec_t c = CODECS[3 + _i];
    const float big[] = {FLT_MAX, -FLT_MAX, 3.3895314e38f, 3.4e38f, 1.7e38f};
    for (size_t b = 0; b < sizeof big / sizeof big[0]; b++) {
        float x[4] = {big[b], 1.0f, -2.0f, 0.5f};
        payload_t pl = encode(&c, x, 4);
        float *y = zeros(4);
        ck_assert_int_eq(psk_codec_decode_add_cpu(y, 4, pl.p, pl.len, &c, 1.0f), 0);
        ck_assert_msg(isfinite(y[0]), "%g decodes as %g", (double)x[0], (double)y[0]);
        double step = fabs((double)big[b]) / 127.0;
        ck_assert_msg(fabs((double)y[0] - (double)x[0]) <= 0.5 * step * (1.0 + 1e-4),
                      "%g decodes as %g", (double)x[0], (double)y[0]);
        free(y);
        free(pl.p);
    }
}
END_TEST

/* Every codec handles an empty chunk: a bare header. */
START_TEST(test_empty_chunk)
{
    const psk_codec_t *c = &CODECS[_i];
    float x[1] = {0}, y[1] = {5.0f};
    uint8_t pl[64];
    size_t len = 0;
    uint32_t scratch[8193];
    size_t want = PSK_CODEC_HEADER_BYTES + (c->kind == PSK_CODEC_RANDOMK ? 8 : 0);
    ck_assert_uint_eq(psk_codec_max_bytes(c, 0), want);
    ck_assert_int_eq(psk_codec_encode_cpu(pl, sizeof pl, &len, x, 0, c, scratch), 0);
    ck_assert_uint_eq(len, want);
    ck_assert_int_eq(psk_codec_decode_add_cpu(y, 0, pl, len, c, 1.0f), 0);
    ck_assert(y[0] == 5.0f);
}
END_TEST

/* ---- decode_add accumulates ---- */

START_TEST(test_decode_add_weight)
{
    const psk_codec_t *c = &CODECS[_i];
    float x[N], base[N];
    fill_normal(x, N, 10, 1.0);
    fill_normal(base, N, 11, 5.0);
    float *d = round_trip(c, x, N);

    payload_t pl = encode(c, x, N);
    float out[N];
    memcpy(out, base, sizeof out);
    ck_assert_int_eq(psk_codec_decode_add_cpu(out, N, pl.p, pl.len, c, 0.25f), 0);
    ck_assert_int_eq(psk_codec_decode_add_cpu(out, N, pl.p, pl.len, c, -1.5f), 0);
    for (size_t i = 0; i < N; i++) {
        float want = (base[i] + 0.25f * d[i]) + -1.5f * d[i];
        ck_assert_msg(fabsf(out[i] - want) <= 1e-6f * (fabsf(base[i]) + fabsf(d[i])),
                      "out[%zu] %g want %g", i, out[i], want);
    }
    free(pl.p);
    free(d);
}
END_TEST

/* ---- error feedback ---- */

/*
 * Over STEPS steps of fresh gradients: everything decoded so far plus the residual equals
 * the sum of the gradients, element by element, up to float rounding; the tolerance grows
 * with the magnitudes that went through float additions.
 */
/* psk_codec_ef_put_back_cpu takes back an encode whose push was not summed, for every codec:
 * from a residual that is not zero, the residual before the encode, up to rounding (to 1e-6 of
 * the values involved); with NaN and infinities in the gradient, 0 at those and the residual
 * before elsewhere, also for top-k and random-k, whose encode had kept x whole (before the
 * function, libps added the payload to that: a review, session 60). */
START_TEST(test_ef_put_back)
{
    psk_codec_t c = CODECS[_i % NCODECS];
    bool odd = _i >= NCODECS;
    if (odd && psk_codec_needs_finite(&c))
        return; /* int8 and sign refuse such a gradient, the residual unchanged */
    c.seed = 5;
    float *g = zeros(N), *r = zeros(N), *r0 = zeros(N), *d = zeros(N);
    fill_normal(g, N, 77, 1.0);
    fill_normal(r0, N, 78, 0.05);
    if (odd)
        for (size_t i = 3; i < N; i += 97)
            g[i] = i % 2 ? NAN : -INFINITY;
    memcpy(r, r0, N * sizeof *r);
    size_t cap = psk_codec_max_bytes(&c, N), len = 0;
    uint8_t *pl = xmalloc(cap);
    void *scratch = xmalloc(psk_codec_scratch_bytes(&c, N) + 4);
    ck_assert_int_eq(psk_codec_encode_ef_cpu(pl, cap, &len, g, r, N, &c, scratch), 0);
    ck_assert_int_eq(psk_codec_decode_add_cpu(d, N, pl, len, &c, 1.0f), 0);
    ck_assert_int_eq(psk_codec_ef_put_back_cpu(r, g, N, pl, len, &c), 0);
    for (size_t i = 0; i < N; i++) {
        if (!isfinite(g[i])) {
            ck_assert_msg(r[i] == 0.0f, "codec %d: residual %zu is %a, want 0", _i, i, r[i]);
            continue;
        }
        double tol = 1e-6 * (fabs(g[i]) + fabs(r0[i]) + (isfinite(d[i]) ? fabs(d[i]) : 0)) +
                     1e-9;
        ck_assert_msg(fabs((double)r[i] - r0[i]) <= tol, "codec %d%s: residual %zu is %a, was %a",
                      _i % NCODECS, odd ? " (odd gradient)" : "", i, r[i], r0[i]);
    }
    /* A payload that does not fit the codec is refused, the residual left. */
    memcpy(d, r, N * sizeof *d);
    ck_assert_int_ne(psk_codec_ef_put_back_cpu(r, g, N, pl, len - 1, &c), 0);
    ck_assert_int_eq(memcmp(d, r, N * sizeof *d), 0);
    free(g);
    free(r);
    free(r0);
    free(d);
    free(pl);
    free(scratch);
}
END_TEST

START_TEST(test_error_feedback_invariant)
{
    psk_codec_t c = CODECS[_i];
    float *g = zeros(N), *r = zeros(N), *acc = zeros(N);
    double *gsum = xmalloc(N * sizeof(double)), *mag = xmalloc(N * sizeof(double));
    memset(gsum, 0, N * sizeof(double));
    memset(mag, 0, N * sizeof(double));
    size_t cap = psk_codec_max_bytes(&c, N);
    uint8_t *pl = xmalloc(cap);
    void *scratch = xmalloc(psk_codec_scratch_bytes(&c, N));
    float *d = zeros(N);

    for (int t = 0; t < STEPS; t++) {
        fill_normal(g, N, 1000 + (uint64_t)t, 1.0);
        c.seed = CODECS[_i].seed + (uint64_t)t; /* a fresh sample per step */
        size_t len = 0;
        ck_assert_int_eq(psk_codec_encode_ef_cpu(pl, cap, &len, g, r, N, &c, scratch), 0);
        ck_assert_uint_eq(len, cap);
        memset(d, 0, N * sizeof(float));
        ck_assert_int_eq(psk_codec_decode_add_cpu(d, N, pl, len, &c, 1.0f), 0);
        for (size_t i = 0; i < N; i++) {
            acc[i] += d[i];
            gsum[i] += g[i];
            mag[i] += fabs((double)g[i]) + fabs((double)d[i]) + fabs((double)r[i]) +
                      fabs((double)acc[i]);
        }
    }
    for (size_t i = 0; i < N; i++) {
        double err = fabs((double)acc[i] + (double)r[i] - gsum[i]);
        ck_assert_msg(err <= 1e-6 * mag[i] + 1e-6, "i %zu: sent %g + residual %g vs %g", i,
                      acc[i], r[i], gsum[i]);
    }
    if (c.kind == PSK_CODEC_NONE)
        for (size_t i = 0; i < N; i++)
            ck_assert(r[i] == 0.0f);
    free(d);
    free(scratch);
    free(pl);
    free(mag);
    free(gsum);
    free(acc);
    free(r);
    free(g);
}
END_TEST

/* Error feedback really feeds back: topk with it sends, over time, what it held back. */
START_TEST(test_error_feedback_residual_sent)
{
    psk_codec_t c = {.kind = PSK_CODEC_TOPK, .fraction = 0.01f};
    float g[N], r[N] = {0};
    uint8_t pl[PSK_CODEC_HEADER_BYTES + 11 * 8]; /* k = ceil(0.01 * 1001) = 11 */
    ck_assert_uint_eq(psk_codec_max_bytes(&c, N), sizeof pl);
    void *scratch = xmalloc(psk_codec_scratch_bytes(&c, N));
    for (size_t i = 0; i < N; i++)
        g[i] = 1.0f + (float)i * 1e-4f; /* constant gradient: every element must get a turn */
    float acc[N] = {0};
    for (int t = 0; t < 150; t++) {
        size_t len;
        ck_assert_int_eq(psk_codec_encode_ef_cpu(pl, sizeof pl, &len, g, r, N, &c, scratch), 0);
        ck_assert_int_eq(psk_codec_decode_add_cpu(acc, N, pl, len, &c, 1.0f), 0);
    }
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(acc[i] > 0.0f, "element %zu never sent", i);
    free(scratch);
}
END_TEST

/* int8 and sign cannot encode a NaN or an infinity: with error feedback such a gradient is
 * refused (PS_EINVAL) and the residual left as it was, so the next, clean push goes through.
 * Before, the residual took the NaN first and every later push of the chunk failed. */
START_TEST(test_error_feedback_nonfinite_refused)
{
    psk_codec_t cs[2] = {{.kind = PSK_CODEC_INT8, .block = 64}, {.kind = PSK_CODEC_SIGN,
                                                                  .block = 64}};
    const psk_codec_t *c = &cs[_i];
    float g[N], r[N], r0[N];
    fill_normal(g, N, 3, 1.0);
    fill_normal(r, N, 4, 0.1);
    memcpy(r0, r, sizeof r);
    size_t cap = psk_codec_max_bytes(c, N), len;
    uint8_t *pl = xmalloc(cap);
    void *scratch = xmalloc(psk_codec_scratch_bytes(c, N) + 1);
    ck_assert(psk_all_finite(g, N));
    for (int bad = 0; bad < 3; bad++) {
        g[500] = bad == 0 ? NAN : bad == 1 ? INFINITY : -INFINITY;
        ck_assert(!psk_all_finite(g, N));
        ck_assert_int_eq(psk_codec_encode_ef_cpu(pl, cap, &len, g, r, N, c, scratch), PS_EINVAL);
        ck_assert_mem_eq(r, r0, sizeof r);
    }
    g[500] = 0.25f;
    ck_assert_int_eq(psk_codec_encode_ef_cpu(pl, cap, &len, g, r, N, c, scratch), 0);
    ck_assert(psk_all_finite(r, N));
    free(scratch);
    free(pl);
}
END_TEST

/* ---- malformed payloads and bad arguments ---- */

/* Decode must fail with rc and leave out untouched. */
static void expect_reject(const psk_codec_t *c, const uint8_t *p, size_t len, size_t n, int rc)
{
    float *out = xmalloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        out[i] = (float)i * 0.5f - 3.0f;
    float *copy = xmalloc(n * sizeof(float) + 4);
    memcpy(copy, out, n * sizeof(float));
    ck_assert_int_eq(psk_codec_decode_add_cpu(out, n, p, len, c, 1.0f), rc);
    ck_assert_mem_eq(out, copy, n * sizeof(float));
    free(copy);
    free(out);
}

/* A payload of c for N normal values, and a scratch copy to corrupt. */
static payload_t sample_payload(const psk_codec_t *c)
{
    float x[N];
    fill_normal(x, N, 12, 1.0);
    return encode(c, x, N);
}

START_TEST(test_reject_length_and_header)
{
    const psk_codec_t *c = &CODECS[_i];
    payload_t pl = sample_payload(c);
    uint8_t *bad = xmalloc(pl.len + 1);

    expect_reject(c, pl.p, pl.len - 1, N, PS_EPROTO); /* short */
    memcpy(bad, pl.p, pl.len);
    bad[pl.len] = 0;
    expect_reject(c, bad, pl.len + 1, N, PS_EPROTO); /* long */
    expect_reject(c, pl.p, 0, N, PS_EPROTO); /* empty */
    expect_reject(c, pl.p, PSK_CODEC_HEADER_BYTES - 1, N, PS_EPROTO);
    expect_reject(c, pl.p, pl.len, N - 1, PS_EPROTO); /* n disagrees */
    static const size_t flip[] = {0, 1, 2, 3, 4, 7, 8, 11, 12, 15};
    for (size_t f = 0; f < sizeof flip / sizeof flip[0]; f++) {
        memcpy(bad, pl.p, pl.len);
        bad[flip[f]] ^= 0x10;
        expect_reject(c, bad, pl.len, N, PS_EPROTO);
    }
    /* Invalid codec on the receiving side. */
    psk_codec_t inval = *c;
    inval.kind = (psk_codec_kind_t)99;
    expect_reject(&inval, pl.p, pl.len, N, PS_EINVAL);
    /* Unchanged, it still decodes. */
    float *y = zeros(N);
    ck_assert_int_eq(psk_codec_decode_add_cpu(y, N, pl.p, pl.len, c, 1.0f), 0);
    free(y);
    free(bad);
    free(pl.p);
}
END_TEST

/* Decoding with a different configuration than the sender's is a protocol error. */
START_TEST(test_reject_codec_mismatch)
{
    psk_codec_t a = {.kind = PSK_CODEC_TOPK, .fraction = 0.01f};
    payload_t pl = sample_payload(&a);
    psk_codec_t b = a;
    b.fraction = 0.02f;
    expect_reject(&b, pl.p, pl.len, N, PS_EPROTO);
    b = a;
    b.kind = PSK_CODEC_RANDOMK;
    expect_reject(&b, pl.p, pl.len, N, PS_EPROTO);
    free(pl.p);

    a = (psk_codec_t){.kind = PSK_CODEC_RANDOMK, .fraction = 0.01f, .fp16_values = 1};
    pl = sample_payload(&a);
    b = a;
    b.fp16_values = 0;
    expect_reject(&b, pl.p, pl.len, N, PS_EPROTO);
    free(pl.p);

    a = (psk_codec_t){.kind = PSK_CODEC_INT8, .block = 256};
    pl = sample_payload(&a);
    b = a;
    b.block = 128;
    expect_reject(&b, pl.p, pl.len, N, PS_EPROTO);
    b = (psk_codec_t){.kind = PSK_CODEC_SIGN, .block = 256};
    expect_reject(&b, pl.p, pl.len, N, PS_EPROTO);
    free(pl.p);
}
END_TEST

static void put_u32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

START_TEST(test_reject_topk_indices)
{
    const psk_codec_t *c = &CODECS[5 + _i];
    payload_t pl = sample_payload(c);
    size_t k = psk_codec_k(c, N);
    uint8_t *idx0 = pl.p + PSK_CODEC_HEADER_BYTES;
    uint8_t *bad = xmalloc(pl.len);
    uint8_t *idx = bad + PSK_CODEC_HEADER_BYTES;
    ck_assert_uint_ge(k, 3);

    memcpy(bad, pl.p, pl.len); /* last index out of range */
    put_u32(idx + 4 * (k - 1), N);
    expect_reject(c, bad, pl.len, N, PS_EPROTO);
    memcpy(bad, pl.p, pl.len); /* far out of range */
    put_u32(idx + 4 * (k - 1), 0xffffffffu);
    expect_reject(c, bad, pl.len, N, PS_EPROTO);
    memcpy(bad, pl.p, pl.len); /* repeated index */
    put_u32(idx + 4, get_u32(idx0));
    expect_reject(c, bad, pl.len, N, PS_EPROTO);
    memcpy(bad, pl.p, pl.len); /* decreasing: swap two */
    put_u32(idx + 4, get_u32(idx0 + 8));
    put_u32(idx + 8, get_u32(idx0 + 4));
    expect_reject(c, bad, pl.len, N, PS_EPROTO);
    memcpy(bad, pl.p, pl.len); /* in range but out of order at the start */
    put_u32(idx, get_u32(idx0 + 4 * (k - 1)));
    expect_reject(c, bad, pl.len, N, PS_EPROTO);
    free(bad);
    free(pl.p);
}
END_TEST

START_TEST(test_reject_bad_scales)
{
    /* _i: 0 int8, 1 sign. */
    const psk_codec_t *c = &CODECS[_i == 0 ? 3 : 9];
    payload_t pl = sample_payload(c);
    uint8_t *bad = xmalloc(pl.len);
    size_t nb = (N + BLOCK - 1) / BLOCK;
    const float scales[] = {NAN, -NAN, INFINITY, -INFINITY, -1.0f};
    for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
        for (size_t b = 0; b < nb; b += nb - 1) { /* first and last block */
            memcpy(bad, pl.p, pl.len);
            memcpy(bad + PSK_CODEC_HEADER_BYTES + 4 * b, &scales[s], 4);
            expect_reject(c, bad, pl.len, N, PS_EPROTO);
        }
    }
    memcpy(bad, pl.p, pl.len);
    uint8_t *body = bad + PSK_CODEC_HEADER_BYTES + 4 * nb;
    if (c->kind == PSK_CODEC_INT8) {
        body[N / 2] = 0x80; /* q = -128 */
    } else {
        ck_assert(N % 8 != 0);
        body[N / 8] |= 0x80; /* a padding bit */
    }
    expect_reject(c, bad, pl.len, N, PS_EPROTO);
    free(bad);
    free(pl.p);
}
END_TEST

/* A refusal says what is wrong (psk_codec_check_why; psd sends it to the pusher, libps names it
 * for a pull). An int8 scale whose 127-fold is no float is refused: finite, it decoded to an
 * infinity (a review, session 71); the same scale is a sign payload's value, decoded as it is. */
static void expect_why(const psk_codec_t *c, const uint8_t *p, size_t len, const char *want)
{
    char why[160] = "";
    ck_assert_int_eq(psk_codec_check_why(p, len, N, c, why, sizeof why), PS_EPROTO);
    ck_assert_int_eq(psk_codec_check(p, len, N, c), PS_EPROTO);
    ck_assert_msg(strcmp(why, want) == 0, "got \"%s\", want \"%s\"", why, want);
}

START_TEST(test_reject_says_why)
{
    size_t nb = (N + BLOCK - 1) / BLOCK;
    char want[160];
    for (int sign = 0; sign < 2; sign++) {
        const psk_codec_t *c = &CODECS[sign ? 9 : 3];
        payload_t pl = sample_payload(c);
        uint8_t *bad = xmalloc(pl.len);
        memcpy(bad, pl.p, pl.len);
        const float huge = 1e37f, neg = -2.0f;
        memcpy(bad + PSK_CODEC_HEADER_BYTES + 4 * 3, &huge, 4);
        if (sign) {
            ck_assert_int_eq(psk_codec_check_why(bad, pl.len, N, c, NULL, 0), 0);
            memcpy(bad + PSK_CODEC_HEADER_BYTES + 4 * 3, &neg, 4);
            expect_why(c, bad, pl.len, "the scale of block 3 is -2 (0 to FLT_MAX)");
            memcpy(bad, pl.p, pl.len);
            bad[PSK_CODEC_HEADER_BYTES + 4 * nb + N / 8] |= 0x80;
            snprintf(want, sizeof want, "the sign bits past value %d are set (padding must be 0)",
                     N);
            expect_why(c, bad, pl.len, want);
        } else {
            expect_why(c, bad, pl.len, "the scale of block 3 is 1e+37 (0 to FLT_MAX / 127, so "
                                       "that 127 x scale is finite)");
            /* The largest scale whose 127-fold is finite passes. */
            float top = FLT_MAX / 127.0f;
            while ((double)top * 127.0 > (double)FLT_MAX) top = nextafterf(top, 0.0f);
            memcpy(bad + PSK_CODEC_HEADER_BYTES + 4 * 3, &top, 4);
            ck_assert_int_eq(psk_codec_check(bad, pl.len, N, c), 0);
            top = nextafterf(top, INFINITY);
            memcpy(bad + PSK_CODEC_HEADER_BYTES + 4 * 3, &top, 4);
            ck_assert_int_eq(psk_codec_check(bad, pl.len, N, c), PS_EPROTO);
            memcpy(bad, pl.p, pl.len);
            bad[PSK_CODEC_HEADER_BYTES + 4 * nb + 500] = 0x80;
            expect_why(c, bad, pl.len, "value 500 is -128 (int8 values are -127 to 127)");
        }
        snprintf(want, sizeof want, "%zu bytes, where %d values take %zu", pl.len - 1, N, pl.len);
        expect_why(c, pl.p, pl.len - 1, want);
        memcpy(bad, pl.p, pl.len);
        bad[1] = 4;
        expect_why(c, bad, pl.len, "header byte 1 is 0x04, expected 0x00 (its flags)");
        free(bad);
        free(pl.p);
    }
    const psk_codec_t *c = &CODECS[5];
    payload_t pl = sample_payload(c);
    size_t k = psk_codec_k(c, N);
    uint8_t *bad = xmalloc(pl.len), *idx = bad + PSK_CODEC_HEADER_BYTES;
    memcpy(bad, pl.p, pl.len);
    put_u32(idx + 4, get_u32(idx));
    snprintf(want, sizeof want, "index 1 is %u, not above index 0 (%u): indices must rise",
             get_u32(idx), get_u32(idx));
    expect_why(c, bad, pl.len, want);
    memcpy(bad, pl.p, pl.len);
    put_u32(idx + 4 * (k - 1), N);
    snprintf(want, sizeof want, "index %zu is %d, past the chunk's %d values", k - 1, N, N);
    expect_why(c, bad, pl.len, want);
    free(bad);
    free(pl.p);
}
END_TEST

START_TEST(test_encode_errors)
{
    float x[N];
    fill_normal(x, N, 13, 1.0);
    uint8_t *pl = xmalloc(8 * N);
    size_t len = 12345;
    psk_codec_t c = {.kind = PSK_CODEC_FP16};
    /* Too small an output. */
    ck_assert_int_eq(psk_codec_encode_cpu(pl, psk_codec_max_bytes(&c, N) - 1, &len, x, N, &c,
                                          NULL),
                     PS_EINVAL);
    ck_assert_uint_eq(len, 12345);
    /* topk without its scratch. */
    c = (psk_codec_t){.kind = PSK_CODEC_TOPK, .fraction = 0.01f};
    ck_assert_int_eq(psk_codec_encode_cpu(pl, 8 * N, &len, x, N, &c, NULL), PS_EINVAL);
    /* Invalid codecs. */
    c = (psk_codec_t){.kind = PSK_CODEC_INT8, .block = 0};
    ck_assert_int_eq(psk_codec_encode_cpu(pl, 8 * N, &len, x, N, &c, NULL), PS_EINVAL);
    c = (psk_codec_t){.kind = PSK_CODEC_RANDOMK, .fraction = 1.5f};
    ck_assert_int_eq(psk_codec_encode_cpu(pl, 8 * N, &len, x, N, &c, NULL), PS_EINVAL);
    /* A block with a NaN or inf has no finite scale (int8, sign); the others carry it. */
    static const float specials[] = {NAN, INFINITY, -INFINITY};
    for (size_t s = 0; s < 3; s++) {
        float y[N];
        memcpy(y, x, sizeof y);
        y[N - 1] = specials[s];
        c = (psk_codec_t){.kind = PSK_CODEC_INT8, .block = BLOCK};
        ck_assert_int_eq(psk_codec_encode_cpu(pl, 8 * N, &len, y, N, &c, NULL), PS_EINVAL);
        c = (psk_codec_t){.kind = PSK_CODEC_SIGN, .block = BLOCK};
        ck_assert_int_eq(psk_codec_encode_cpu(pl, 8 * N, &len, y, N, &c, NULL), PS_EINVAL);
        c = (psk_codec_t){.kind = PSK_CODEC_TOPK, .fraction = 0.01f};
        float *z = round_trip(&c, y, N); /* a NaN or inf is the largest magnitude */
        ck_assert(bits_of(z[N - 1]) == bits_of(y[N - 1]) || (isnan(z[N - 1]) && isnan(y[N - 1])));
        free(z);
    }
    ck_assert_uint_eq(len, 12345);

    /* Error feedback: argument errors leave the residual alone. */
    float r[N];
    fill_normal(r, N, 14, 1.0);
    float r0[N];
    memcpy(r0, r, sizeof r);
    c = (psk_codec_t){.kind = PSK_CODEC_TOPK, .fraction = 0.01f};
    ck_assert_int_eq(psk_codec_encode_ef_cpu(pl, 8 * N, &len, x, r, N, &c, NULL), PS_EINVAL);
    ck_assert_int_eq(psk_codec_encode_ef_cpu(pl, 10, &len, x, r, N, &c, pl), PS_EINVAL);
    ck_assert_mem_eq(r, r0, sizeof r);
    free(pl);
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("codec");
    TCase *tc;

    tc = tcase_create("parse");
    tcase_add_test(tc, test_parse_accepts);
    tcase_add_test(tc, test_parse_rejects);
    tcase_add_test(tc, test_sizes);
    suite_add_tcase(s, tc);

    tc = tcase_create("round_trip");
    tcase_add_test(tc, test_none_exact);
    tcase_add_test(tc, test_fp16_round_trip);
    tcase_add_test(tc, test_fp16_exhaustive_and_special);
    tcase_add_test(tc, test_fp16_matches_compiler);
    tcase_add_test(tc, test_fp16_ef_matches_definition);
    tcase_add_test(tc, test_bf16_round_trip);
    tcase_add_test(tc, test_bf16_ef_matches_definition);
    tcase_add_loop_test(tc, test_ef_residual_stays_finite, 0, 10);
    tcase_add_loop_test(tc, test_ef_half_saturates, 0, 4);
    tcase_add_test(tc, test_bf16_bulk_matches_scalar);
    tcase_add_test(tc, test_int8_bulk_matches_scalar);
    tcase_add_test(tc, test_sign_matches_definition);
    tcase_add_loop_test(tc, test_int8_round_trip, 0, 4);
    tcase_add_test(tc, test_int8_stochastic);
    tcase_add_loop_test(tc, test_sign_round_trip, 0, 4);
    tcase_add_loop_test(tc, test_empty_chunk, 0, NCODECS);
    suite_add_tcase(s, tc);

    tc = tcase_create("topk");
    tcase_add_loop_test(tc, test_topk_selects_largest, 0, 2);
    tcase_add_test(tc, test_topk_deterministic);
    tcase_add_loop_test(tc, test_topk_sampled_path, 0, 2);
    suite_add_tcase(s, tc);

    tc = tcase_create("randomk");
    tcase_add_test(tc, test_randomk_indices);
    tcase_add_loop_test(tc, test_randomk_round_trip, 0, 2);
    tcase_add_loop_test(tc, test_randomk_marks_nonfinite, 0, 2);
    tcase_add_loop_test(tc, test_int8_largest_finite, 0, 2);
    suite_add_tcase(s, tc);

    tc = tcase_create("decode_add");
    tcase_add_loop_test(tc, test_decode_add_weight, 0, NCODECS);
    suite_add_tcase(s, tc);

    tc = tcase_create("error_feedback");
    tcase_add_loop_test(tc, test_error_feedback_invariant, 0, NCODECS);
    tcase_add_loop_test(tc, test_ef_put_back, 0, 2 * NCODECS);
    tcase_add_test(tc, test_error_feedback_residual_sent);
    tcase_add_loop_test(tc, test_error_feedback_nonfinite_refused, 0, 2);
    suite_add_tcase(s, tc);

    tc = tcase_create("malformed");
    tcase_add_loop_test(tc, test_reject_length_and_header, 0, NCODECS);
    tcase_add_test(tc, test_reject_codec_mismatch);
    tcase_add_loop_test(tc, test_reject_topk_indices, 0, 2);
    tcase_add_loop_test(tc, test_reject_bad_scales, 0, 2);
    tcase_add_test(tc, test_reject_says_why);
    tcase_add_test(tc, test_encode_errors);
    suite_add_tcase(s, tc);

    return s;
}
