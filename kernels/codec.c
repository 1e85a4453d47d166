/* codec.c: CPU reference for the gradient codecs; the payload formats are in codec.h. */
#include "codec.h"
#include "codec_bits.h"
#include "hash.h"

#include "ps/ps_error.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/*
 * Payload arrays are read and written with memcpy, which compiles to plain (unaligned) loads
 * and stores and lets the loops vectorize, but writes host byte order: the format is
 * little-endian, so the host must be too.
 */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "codec.c assumes a little-endian host (the payload format is little-endian)"
#endif

/*
 * What the compiler needs: as for optim.c, GCC 12 at -O2 vectorizes the loops only with
 * -fvect-cost-model=cheap (or -O3). No loop relies on -ffast-math: the conversions use
 * integer bit tricks and the FPU's round-to-nearest-even, so the results are the same with
 * and without vectorization. They assume the default rounding mode and no flush-to-zero.
 */

#define TOPK_BINS 2048 /* radix select: 11 + 11 + 9 bits of the 31-bit magnitude */
#define MAG_MASK 0x7fffffffu
#define INF_BITS 0x7f800000u

/* ---- bits and little-endian access ---- */

static inline uint16_t ld16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint32_t ld32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint64_t ld64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float ldf32(const uint8_t *p)
{
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void st16(uint8_t *p, uint16_t v)
{
    memcpy(p, &v, sizeof v);
}

static inline void st32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, sizeof v);
}

static inline void st64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, sizeof v);
}

static inline void stf32(uint8_t *p, float v)
{
    memcpy(p, &v, sizeof v);
}

/* ---- codec parameters and sizes ---- */

static int is_sparse(psk_codec_kind_t kind)
{
    return kind == PSK_CODEC_TOPK || kind == PSK_CODEC_RANDOMK;
}

static int codec_valid(const psk_codec_t *c)
{
    switch (c->kind) {
    case PSK_CODEC_NONE:
    case PSK_CODEC_FP16:
    case PSK_CODEC_BF16:
        return 1;
    case PSK_CODEC_INT8:
    case PSK_CODEC_SIGN:
        return c->block >= 1;
    case PSK_CODEC_TOPK:
    case PSK_CODEC_RANDOMK:
        return c->fraction > 0.0f && c->fraction <= 1.0f; /* false for NaN */
    }
    return 0;
}

static size_t ceil_div(size_t a, size_t b)
{
    return a / b + (a % b != 0);
}

size_t psk_codec_k(const psk_codec_t *c, size_t n)
{
    if (!codec_valid(c))
        return 0;
    if (!is_sparse(c->kind))
        return n;
    if (n == 0)
        return 0;
    /*
     * A fraction parsed from "0.1" is 0.1f = 0.100000001, so a plain ceil would send 101 of
     * 1000 values. A product within float's representation error of an integer is taken as
     * that integer. Done in double with IEEE operations, so both sides agree.
     */
    double p = (double)c->fraction * (double)n;
    double r = nearbyint(p);
    double k = fabs(p - r) <= p * 0x1.0p-23 ? r : ceil(p);
    if (k < 1.0)
        k = 1.0;
    if (k > (double)n)
        k = (double)n;
    return (size_t)k;
}

/* Bytes per sparse value. */
static size_t value_bytes(const psk_codec_t *c)
{
    return c->fp16_values ? 2 : 4;
}

/* Payload size for a valid codec and n <= UINT32_MAX. */
static size_t payload_bytes(const psk_codec_t *c, size_t n)
{
    size_t h = PSK_CODEC_HEADER_BYTES;
    switch (c->kind) {
    case PSK_CODEC_NONE:
        return h + 4 * n;
    case PSK_CODEC_FP16:
    case PSK_CODEC_BF16:
        return h + 2 * n;
    case PSK_CODEC_INT8:
        return h + 4 * ceil_div(n, c->block) + n;
    case PSK_CODEC_SIGN:
        return h + 4 * ceil_div(n, c->block) + ceil_div(n, 8);
    case PSK_CODEC_TOPK:
        return h + psk_codec_k(c, n) * (4 + value_bytes(c));
    case PSK_CODEC_RANDOMK:
        return h + 8 + psk_codec_k(c, n) * value_bytes(c);
    }
    return 0;
}

size_t psk_codec_max_bytes(const psk_codec_t *c, size_t n)
{
    if (!codec_valid(c) || n > UINT32_MAX)
        return 0;
    return payload_bytes(c, n);
}

size_t psk_codec_scratch_bytes(const psk_codec_t *c, size_t n)
{
    if (!codec_valid(c) || c->kind != PSK_CODEC_TOPK)
        return 0;
    return 4 * (4 * TOPK_BINS + n + 1);
}

/* The 16-byte header that (c, n) implies; encode writes it and decode compares against it. */
static void header_make(uint8_t h[PSK_CODEC_HEADER_BYTES], const psk_codec_t *c, size_t n)
{
    uint32_t param = 0;
    uint8_t flags = 0;
    if (is_sparse(c->kind)) {
        param = (uint32_t)psk_codec_k(c, n);
        flags = c->fp16_values ? 1 : 0;
    } else if (c->kind == PSK_CODEC_INT8 || c->kind == PSK_CODEC_SIGN) {
        param = c->block;
    }
    memset(h, 0, PSK_CODEC_HEADER_BYTES);
    h[0] = (uint8_t)c->kind;
    h[1] = flags;
    st32(h + 4, (uint32_t)n);
    st32(h + 8, param);
}

void psk_codec_header(uint8_t h[PSK_CODEC_HEADER_BYTES], const psk_codec_t *c, size_t n)
{
    header_make(h, c, n);
}

/* ---- sparse values and randomk indices ---- */

/* v[k] (fp32 or fp16) = x[idx[j]] for the k indices at idx (u32, payload bytes); with @p ef
 * (error feedback), fp16 values saturate (f16_saturate). */
static void gather_values(uint8_t *restrict v, const float *restrict x,
                          const uint8_t *restrict idx, size_t k, int fp16, bool ef)
{
    if (fp16) {
        for (size_t j = 0; j < k; j++) {
            float xj = x[ld32(idx + 4 * j)];
            uint16_t h = f16_from_f32(xj);
            st16(v + 2 * j, ef ? f16_saturate(h, xj) : h);
        }
    } else {
        for (size_t j = 0; j < k; j++)
            stf32(v + 4 * j, x[ld32(idx + 4 * j)]);
    }
}

static inline float value_at(const uint8_t *v, size_t j, int fp16)
{
    return fp16 ? f32_from_f16(ld16(v + 2 * j)) : ldf32(v + 4 * j);
}

/* Whether the k values of a top-k / random-k payload are all finite. */
static bool values_finite(const uint8_t *v, size_t k, int fp16)
{
    for (size_t j = 0; j < k; j++)
        if (!isfinite(value_at(v, j, fp16)))
            return false;
    return true;
}

/*
 * The randomk strata, walked in order: stratum j is [lo, lo + width) with lo = floor(j n / k).
 * Width is q or q + 1 (q = n / k, r = n % k); the extra element comes when (j r mod k) + r
 * reaches k, a Bresenham step, so the walk needs no division per index. A parallel
 * implementation computes floor(j n / k) directly; the two agree exactly.
 */
typedef struct {
    uint64_t seed, lo, q, r, k, acc;
} strata_t;

static void strata_init(strata_t *s, uint64_t seed, size_t n, size_t k)
{
    *s = (strata_t){.seed = seed, .lo = 0, .q = n / k, .r = n % k, .k = k, .acc = 0};
}

/* Index j (the j-th call): uniform in stratum j by the top 32 bits of psk_hash64(seed, j). */
static inline uint32_t strata_next(strata_t *s, uint64_t j)
{
    uint64_t width = s->q;
    s->acc += s->r;
    if (s->acc >= s->k) {
        s->acc -= s->k;
        width++;
    }
    uint64_t h = psk_hash64(s->seed, j) >> 32;
    uint64_t i = s->lo + ((h * width) >> 32); /* width <= n < 2^32: no overflow */
    s->lo += width;
    return (uint32_t)i;
}

void psk_codec_randomk_indices(uint32_t *idx, uint64_t seed, size_t n, size_t k)
{
    if (k == 0)
        return;
    strata_t s;
    strata_init(&s, seed, n, k);
    for (size_t j = 0; j < k; j++)
        idx[j] = strata_next(&s, j);
}

/* ---- topk: radix select on the magnitude bits ---- */

/*
 * For a non-negative float the IEEE bit pattern orders like the value, so |x| is compared as
 * the 31-bit integer bits(x) & 0x7fffffff (NaN above inf). The k-th largest key T is found
 * one digit at a time, 11 + 11 + 9 bits, each from a 2048-bin histogram:
 *   level 1 over all n: digit bin b1 holding the k-th largest; every element of a higher bin
 *     is selected. One more pass writes those indices (ascending) to the payload and
 *     collects bin b1's indices (ascending) in the scratch: the candidates.
 *   levels 2 and 3 over the candidates narrow T down to one key.
 * The candidates above T are selected, and of those equal to T the lowest-indexed ones
 * that are still needed. Merging the two ascending lists from the back, in place in the
 * payload, gives the k indices in order. Two passes over n plus passes over the candidates
 * (all n only when most magnitudes share their top 11 bits); no sort.
 */

static inline uint32_t mag_key(float x)
{
    return f32_bits(x) & MAG_MASK;
}

/* Largest magnitude key of x[n]: an integer max, which vectorizes (fmaxf would not). */
static uint32_t absmax_key(const float *x, size_t n)
{
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t key = mag_key(x[i]);
        m = key > m ? key : m;
    }
    return m;
}

/*
 * Highest bin b with hist[b] >= *need after taking every bin above it whole; *need becomes
 * the count still to take from bin b. The caller guarantees sum(hist) >= *need >= 1.
 */
static uint32_t find_bin(const uint32_t *hist, uint32_t nbins, size_t *need)
{
    for (uint32_t b = nbins; b-- > 0;) {
        if (hist[b] >= *need)
            return b;
        *need -= hist[b];
    }
    return 0; /* not reached */
}

/*
 * Level 1's split of index @p l (its key's top digit @p d): above bin b1 it is sure, appended to
 * idx_out at *ns; in b1 a candidate, appended to cand at *nc. Branch-free: both slots are
 * written, the one that applies advances. The spare writes stay in bounds: *ns ends below k
 * (level 1 left at least one to take from b1), and cand has room for the indices split.
 */
static inline void topk_split(uint8_t *restrict idx_out, size_t *ns, uint32_t *restrict cand,
                              size_t *nc, uint32_t l, uint32_t d, uint32_t b1)
{
    st32(idx_out + 4 * *ns, l);
    cand[*nc] = l;
    *ns += d > b1;
    *nc += d == b1;
}

/*
 * Levels 2 and 3 and the output, once level 1 chose bin b1: idx_out[0, ns) holds the indices
 * of the keys above bin b1 (ascending), cand[0, nc) those in it (ascending), of which `need`
 * (>= 1) are still to take. hist: [TOPK_BINS] u32.
 */
static void topk_finish(uint8_t *restrict idx_out, size_t ns, const float *restrict x,
                        uint32_t *restrict cand, size_t nc, size_t need, uint32_t b1,
                        uint32_t *restrict hist)
{
    memset(hist, 0, TOPK_BINS * sizeof *hist);
    for (size_t j = 0; j < nc; j++)
        hist[(mag_key(x[cand[j]]) >> 9) & 0x7ffu]++;
    uint32_t b2 = find_bin(hist, TOPK_BINS, &need);

    memset(hist, 0, 512 * sizeof *hist);
    for (size_t j = 0; j < nc; j++) {
        uint32_t key = mag_key(x[cand[j]]);
        if (((key >> 9) & 0x7ffu) == b2)
            hist[key & 0x1ffu]++;
    }
    uint32_t b3 = find_bin(hist, 512, &need);
    uint32_t t = (b1 << 20) | (b2 << 9) | b3;

    /* Keep the candidates above t and the first `need` equal to t, in index order. */
    size_t m = 0;
    for (size_t j = 0; j < nc; j++) {
        uint32_t key = mag_key(x[cand[j]]);
        if (key > t || (key == t && need > 0)) {
            need -= key == t;
            cand[m++] = cand[j];
        }
    }

    /* Merge sure[0, ns) (in the payload) and cand[0, m) into [0, ns + m) from the back. */
    size_t j = m, w = ns + m, i = ns;
    while (j > 0) {
        uint32_t a = i > 0 ? ld32(idx_out + 4 * (i - 1)) : 0;
        if (i > 0 && a > cand[j - 1]) {
            st32(idx_out + 4 * --w, a);
            i--;
        } else {
            st32(idx_out + 4 * --w, cand[--j]);
        }
    }
}

/*
 * The full path over all of x: idx_out: [k] u32 payload indices; x: [n]; scratch:
 * [4 * TOPK_BINS + n + 1] u32. 1 <= k <= n.
 */
static void topk_select_full(uint8_t *restrict idx_out, const float *restrict x, size_t n,
                             size_t k, uint32_t *restrict scratch)
{
    uint32_t *hist = scratch;
    uint32_t *cand = scratch + 4 * TOPK_BINS;
    size_t need = k;

    /*
     * Level 1 counts into four histograms in turn: gradients crowd into a few bins, and
     * consecutive increments of one counter would wait on each other.
     */
    memset(hist, 0, 4 * TOPK_BINS * sizeof *hist);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        hist[mag_key(x[i]) >> 20]++;
        hist[TOPK_BINS + (mag_key(x[i + 1]) >> 20)]++;
        hist[2 * TOPK_BINS + (mag_key(x[i + 2]) >> 20)]++;
        hist[3 * TOPK_BINS + (mag_key(x[i + 3]) >> 20)]++;
    }
    for (; i < n; i++)
        hist[mag_key(x[i]) >> 20]++;
    for (uint32_t b = 0; b < TOPK_BINS; b++)
        hist[b] += hist[TOPK_BINS + b] + hist[2 * TOPK_BINS + b] + hist[3 * TOPK_BINS + b];
    uint32_t b1 = find_bin(hist, TOPK_BINS, &need);

    /*
     * The split skips runs of 16 whose largest key is below bin b1 (a vectorized max), which
     * for a small fraction is most of them.
     */
    size_t ns = 0, nc = 0;
    uint32_t lo = b1 << 20;
    for (i = 0; i < n; i += 16) {
        size_t len = n - i < 16 ? n - i : 16;
        if (absmax_key(x + i, len) < lo)
            continue;
        for (size_t l = i; l < i + len; l++)
            topk_split(idx_out, &ns, cand, &nc, (uint32_t)l, mag_key(x[l]) >> 20, b1);
    }
    topk_finish(idx_out, ns, x, cand, nc, need, b1, hist);
}

/*
 * The same over a candidate list cand[0, nc) (ascending) that holds the top k: level 1 over the
 * candidates only, whose split compacts the list in place. hist: [TOPK_BINS] u32.
 */
static void topk_select_cand(uint8_t *restrict idx_out, const float *restrict x,
                             uint32_t *restrict cand, size_t nc, size_t k,
                             uint32_t *restrict hist)
{
    size_t need = k;
    memset(hist, 0, TOPK_BINS * sizeof *hist);
    for (size_t j = 0; j < nc; j++)
        hist[mag_key(x[cand[j]]) >> 20]++;
    uint32_t b1 = find_bin(hist, TOPK_BINS, &need);
    size_t ns = 0, m = 0;
    for (size_t j = 0; j < nc; j++) /* m <= j: the list is read before it is written */
        topk_split(idx_out, &ns, cand, &m, cand[j], mag_key(x[cand[j]]) >> 20, b1);
    topk_finish(idx_out, ns, x, cand, m, need, b1, hist);
}

/* ---- encode ---- */

/*
 * The same conversions with the F16C instructions, 8 values at a time, where the CPU has them
 * (checked once at run time). Both directions round to nearest even and are exact on
 * subnormals, like the scalar reference above; a group of 8 holding a NaN goes through the
 * scalar code, so NaN encodings are the reference's too. Results are identical bit for bit.
 */
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define PSK_HAVE_F16C 1

/* F16C read from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports has no "f16c";
 * "avx" also checks that the OS saves the ymm registers. */
static int f16c_ok(void)
{
    static int ok = -1;
    unsigned a, b, c, d;
    if (ok < 0)
        ok = __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    return ok;
}

__attribute__((target("avx,f16c"))) static size_t encode_fp16_f16c(uint8_t *restrict body,
                                                                  const float *restrict x,
                                                                  size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) {
            for (size_t k = i; k < i + 8; k++) st16(body + 2 * k, f16_from_f32(x[k]));
            continue;
        }
        __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(void *)(body + 2 * i), h);
    }
    return i;
}

__attribute__((target("avx,f16c"))) static size_t add_f16_f16c(float *restrict out,
                                                              const uint8_t *restrict v,
                                                              size_t n, float w)
{
    size_t i = 0;
    __m256 wv = _mm256_set1_ps(w);
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(v + 2 * i));
        /* exponent 31 (inf or NaN) in any lane: the scalar path keeps NaN payloads as is */
        __m128i e = _mm_and_si128(h, _mm_set1_epi16(0x7c00));
        if (_mm_movemask_epi8(_mm_cmpeq_epi16(e, _mm_set1_epi16(0x7c00)))) {
            for (size_t k = i; k < i + 8; k++) out[k] += w * f32_from_f16(ld16(v + 2 * k));
            continue;
        }
        __m256 f = _mm256_cvtph_ps(h);
        /* out += w * f, rounded like the scalar out[i] += w * f (no fused multiply-add) */
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), _mm256_mul_ps(wv, f)));
    }
    return i;
}

/* Error feedback for fp16 in one pass: x = r + g, h = f16(x), r = x + (-1 * f32(h)); the same
 * operations, in the same order, as add_into + encode_fp16 + add_f16(w = -1). */
__attribute__((target("avx,f16c"))) static size_t ef_fp16_f16c(uint8_t *restrict body,
                                                              const float *restrict g,
                                                              float *restrict r, size_t n)
{
    size_t i = 0;
    const __m256 minus1 = _mm256_set1_ps(-1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_add_ps(_mm256_loadu_ps(r + i), _mm256_loadu_ps(g + i));
        if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q))) break; /* scalar from here */
        __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m128i e = _mm_and_si128(h, _mm_set1_epi16(0x7c00));
        if (_mm_movemask_epi8(_mm_cmpeq_epi16(e, _mm_set1_epi16(0x7c00)))) break; /* inf */
        _mm_storeu_si128((__m128i *)(void *)(body + 2 * i), h);
        _mm256_storeu_ps(r + i, _mm256_add_ps(x, _mm256_mul_ps(minus1, _mm256_cvtph_ps(h))));
    }
    return i;
}

/*
 * bf16 with AVX2, 16 values at a time, bit for bit the scalar bf16_from_f32 / f32_from_bf16:
 * the same integer rounding (add 0x7fff plus the lowest kept bit, shift); a group holding a
 * NaN goes through the scalar code (its quiet-NaN rule). Session 22: the scalar encode ran at
 * 6.6 GB/s, fp16's F16C one at 28 (psbench --only codecs).
 */
static int avx2_ok(void)
{
    static int ok = -1;
    if (ok < 0) ok = __builtin_cpu_supports("avx2");
    return ok;
}

/* 16 fp32 bit patterns (no NaN) -> 16 bf16, in order. */
__attribute__((target("avx2"))) static inline __m256i bf16_round16(__m256i u0, __m256i u1)
{
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    __m256i r0 = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u0, bias), _mm256_and_si256(_mm256_srli_epi32(u0, 16), one)), 16);
    __m256i r1 = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u1, bias), _mm256_and_si256(_mm256_srli_epi32(u1, 16), one)), 16);
    /* packus interleaves the 128-bit halves: 0..3 of r0, 0..3 of r1, 4..7 of r0, 4..7 of r1 */
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(r0, r1), 0xD8);
}

/* Whether any of the 16 lanes is a NaN. */
__attribute__((target("avx2"))) static inline int any_nan16(__m256i u0, __m256i u1)
{
    const __m256i mag = _mm256_set1_epi32((int)MAG_MASK), inf = _mm256_set1_epi32((int)INF_BITS);
    __m256i n = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_and_si256(u0, mag), inf),
                                _mm256_cmpgt_epi32(_mm256_and_si256(u1, mag), inf));
    return !_mm256_testz_si256(n, n);
}

__attribute__((target("avx2"))) static size_t encode_bf16_avx2(uint8_t *restrict body,
                                                              const float *restrict x, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i u0 = _mm256_loadu_si256((const __m256i *)(const void *)(x + i));
        __m256i u1 = _mm256_loadu_si256((const __m256i *)(const void *)(x + i + 8));
        if (any_nan16(u0, u1)) {
            for (size_t k = i; k < i + 16; k++) st16(body + 2 * k, bf16_from_f32(x[k]));
            continue;
        }
        _mm256_storeu_si256((__m256i *)(void *)(body + 2 * i), bf16_round16(u0, u1));
    }
    return i;
}

__attribute__((target("avx2"))) static size_t add_bf16_avx2(float *restrict out,
                                                           const uint8_t *restrict v, size_t n,
                                                           float w)
{
    size_t i = 0;
    __m256 wv = _mm256_set1_ps(w);
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(v + 2 * i));
        __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        /* out += w * f, rounded like the scalar out[i] += w * f (no fused multiply-add) */
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), _mm256_mul_ps(wv, f)));
    }
    return i;
}

/* Whether any of the 16 lanes is a NaN, an infinity or a float bf16 rounds up to one (its
 * magnitude above bf16's largest, 0x7f7f0000, by at least half a bf16 step). */
__attribute__((target("avx2"))) static inline int any_wide16(__m256i u0, __m256i u1)
{
    const __m256i mag = _mm256_set1_epi32((int)MAG_MASK), top = _mm256_set1_epi32(0x7f7f7fff);
    __m256i n = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_and_si256(u0, mag), top),
                                _mm256_cmpgt_epi32(_mm256_and_si256(u1, mag), top));
    return !_mm256_testz_si256(n, n);
}

/* Error feedback for bf16 in one pass, as ef_fp16_f16c: x = r + g, h = bf16(x),
 * r = x + (-1 * f32(h)); stops at a group holding a NaN or a value whose bf16 is an infinity
 * (the caller takes the rest, and keeps the residual finite). */
__attribute__((target("avx2"))) static size_t ef_bf16_avx2(uint8_t *restrict body,
                                                          const float *restrict g,
                                                          float *restrict r, size_t n)
{
    size_t i = 0;
    const __m256 minus1 = _mm256_set1_ps(-1.0f);
    for (; i + 16 <= n; i += 16) {
        __m256 x0 = _mm256_add_ps(_mm256_loadu_ps(r + i), _mm256_loadu_ps(g + i));
        __m256 x1 = _mm256_add_ps(_mm256_loadu_ps(r + i + 8), _mm256_loadu_ps(g + i + 8));
        __m256i u0 = _mm256_castps_si256(x0), u1 = _mm256_castps_si256(x1);
        if (any_wide16(u0, u1)) break; /* scalar from here */
        __m256i h = bf16_round16(u0, u1);
        _mm256_storeu_si256((__m256i *)(void *)(body + 2 * i), h);
        __m256 f0 = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16));
        __m256 f1 = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16));
        _mm256_storeu_ps(r + i, _mm256_add_ps(x0, _mm256_mul_ps(minus1, f0)));
        _mm256_storeu_ps(r + i + 8, _mm256_add_ps(x1, _mm256_mul_ps(minus1, f1)));
    }
    return i;
}

/*
 * int8 with AVX2, 32 values at a time, bit for bit quantize_nearest / quantize_stochastic /
 * add_int8 below: the same float operations in the same order (no fused multiply-add), the
 * same truncating conversions and clamps. The block's values are finite (encode_int8 checks).
 */

/* 4 x 8 int32 in [-127, 127] -> 32 int8 in order. */
__attribute__((target("avx2"))) static inline __m256i pack_i8x32(__m256i a, __m256i b, __m256i c,
                                                                 __m256i d)
{
    /* packs works per 128-bit half: the 32-bit groups come out as a0 b0 c0 d0 a1 b1 c1 d1 */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

__attribute__((target("avx2"))) static inline __m256i clamp127(__m256i v)
{
    return _mm256_max_epi32(_mm256_min_epi32(v, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
}

__attribute__((target("avx2"))) static size_t quantize_nearest_avx2(uint8_t *restrict q,
                                                                   const float *restrict x,
                                                                   size_t n, float inv)
{
    size_t i = 0;
    const __m256 iv = _mm256_set1_ps(inv), big = _mm256_set1_ps(0x1.8p23f);
    for (; i + 32 <= n; i += 32) {
        __m256i v[4];
        for (int k = 0; k < 4; k++) {
            __m256 r = _mm256_sub_ps(
                _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), iv), big), big);
            v[k] = clamp127(_mm256_cvttps_epi32(r));
        }
        _mm256_storeu_si256((__m256i *)(void *)(q + i), pack_i8x32(v[0], v[1], v[2], v[3]));
    }
    return i;
}

/* hash32 of 8 lanes at once. */
__attribute__((target("avx2"))) static inline __m256i hash32x8(__m256i x)
{
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x7feb352du));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x846ca68bu));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

__attribute__((target("avx2"))) static size_t quantize_stochastic_avx2(uint8_t *restrict q,
                                                                      const float *restrict x,
                                                                      size_t n, float inv,
                                                                      uint32_t key,
                                                                      uint32_t first)
{
    size_t i = 0;
    const __m256 iv = _mm256_set1_ps(inv), c128 = _mm256_set1_ps(128.0f);
    const __m256 unit = _mm256_set1_ps(0x1.0p-24f);
    const __m256i kv = _mm256_set1_epi32((int)key), lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (; i + 32 <= n; i += 32) {
        __m256i v[4];
        for (int k = 0; k < 4; k++) {
            __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)(first + (uint32_t)(i + 8 * k))),
                                           lanes);
            __m256i h = _mm256_srli_epi32(hash32x8(_mm256_xor_si256(idx, kv)), 8);
            __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(h), unit); /* h < 2^24: exact */
            __m256 val = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), iv), u);
            __m256i f = _mm256_sub_epi32(_mm256_cvttps_epi32(_mm256_add_ps(val, c128)),
                                         _mm256_set1_epi32(128));
            v[k] = clamp127(f);
        }
        _mm256_storeu_si256((__m256i *)(void *)(q + i), pack_i8x32(v[0], v[1], v[2], v[3]));
    }
    return i;
}

/* absmax_key of x[n] (the largest magnitude's bit pattern): 16 lanes of unsigned max. */
__attribute__((target("avx2"))) static uint32_t absmax_key_avx2(const float *x, size_t n)
{
    const __m256i mag = _mm256_set1_epi32((int)MAG_MASK);
    __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        m0 = _mm256_max_epu32(m0, _mm256_and_si256(
                                      _mm256_loadu_si256((const __m256i *)(const void *)(x + i)), mag));
        m1 = _mm256_max_epu32(m1, _mm256_and_si256(
                                      _mm256_loadu_si256((const __m256i *)(const void *)(x + i + 8)), mag));
    }
    uint32_t lanes[8], m = 0;
    _mm256_storeu_si256((__m256i *)(void *)lanes, _mm256_max_epu32(m0, m1));
    for (int k = 0; k < 8; k++) m = lanes[k] > m ? lanes[k] : m;
    for (; i < n; i++) {
        uint32_t key = f32_bits(x[i]) & MAG_MASK;
        m = key > m ? key : m;
    }
    return m;
}

/* The sign codec's per-lane sums: acc[l] += |x[i + l]| in double over x[0, 8 * (n / 8)), each
 * lane in the scalar loop's order (so the same sums). Returns the values taken. */
__attribute__((target("avx2"))) static size_t abs_sums8_avx2(const float *x, size_t n,
                                                            double acc[8])
{
    const __m256d sign = _mm256_set1_pd(-0.0);
    __m256d a0 = _mm256_loadu_pd(acc), a1 = _mm256_loadu_pd(acc + 4);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        a0 = _mm256_add_pd(a0, _mm256_andnot_pd(sign, _mm256_cvtps_pd(_mm256_castps256_ps128(v))));
        a1 = _mm256_add_pd(a1, _mm256_andnot_pd(sign, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1))));
    }
    _mm256_storeu_pd(acc, a0);
    _mm256_storeu_pd(acc + 4, a1);
    return i;
}

/* The sign bits of x[0, 32 * words): value l of word j is bit l. */
__attribute__((target("avx2"))) static void sign_bits_avx2(uint8_t *restrict bits,
                                                          const float *restrict x, size_t words)
{
    for (size_t j = 0; j < words; j++) {
        const float *p = x + 32 * j;
        uint32_t v = (uint32_t)_mm256_movemask_ps(_mm256_loadu_ps(p)) |
                     (uint32_t)_mm256_movemask_ps(_mm256_loadu_ps(p + 8)) << 8 |
                     (uint32_t)_mm256_movemask_ps(_mm256_loadu_ps(p + 16)) << 16 |
                     (uint32_t)_mm256_movemask_ps(_mm256_loadu_ps(p + 24)) << 24;
        st32(bits + 4 * j, v);
    }
}

/* out[i] += sw * q[i] for one block. */
__attribute__((target("avx2"))) static size_t add_i8_avx2(float *restrict out,
                                                         const uint8_t *restrict q, size_t n,
                                                         float sw)
{
    size_t i = 0;
    const __m256 wv = _mm256_set1_ps(sw);
    for (; i + 8 <= n; i += 8) {
        __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)(q + i));
        __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), _mm256_mul_ps(wv, f)));
    }
    return i;
}

/* topk_gather over x[0, 16 * (n / 16)), 16 values at a time; returns the count found. */
__attribute__((target("avx2"))) static size_t topk_gather_avx2(uint32_t *restrict cand,
                                                              float *restrict x,
                                                              const float *restrict g, size_t n,
                                                              uint32_t t)
{
    const __m256i mag = _mm256_set1_epi32((int)MAG_MASK), below = _mm256_set1_epi32((int)(t - 1));
    size_t nc = 0;
    for (size_t i = 0; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        if (g) {
            a = _mm256_add_ps(a, _mm256_loadu_ps(g + i));
            b = _mm256_add_ps(b, _mm256_loadu_ps(g + i + 8));
            _mm256_storeu_ps(x + i, a);
            _mm256_storeu_ps(x + i + 8, b);
        }
        /* Keys are below 2^31, so a signed compare with t - 1 >= 0 is key >= t. */
        __m256i ka = _mm256_and_si256(_mm256_castps_si256(a), mag);
        __m256i kb = _mm256_and_si256(_mm256_castps_si256(b), mag);
        uint32_t m = (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(ka, below))) |
                     (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(kb, below)))
                         << 8;
        for (; m; m &= m - 1)
            cand[nc++] = (uint32_t)(i + (size_t)__builtin_ctz(m));
    }
    return nc;
}

/* r += g, 16 values at a time (the same additions as add_into), and whether a sum is a NaN or
 * an infinity: its exponent of all ones carries into bit 31 when 1 is added to it. Returns the
 * values done; *odd |= that. SSE2's version of the loop made random-k's encode ~30% slower. */
__attribute__((target("avx2"))) static size_t add_odd_avx2(float *restrict r,
                                                           const float *restrict g, size_t n,
                                                           bool *odd)
{
    const __m256i ex = _mm256_set1_epi32(0x7f800000), one = _mm256_set1_epi32(0x00800000);
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 x0 = _mm256_add_ps(_mm256_loadu_ps(r + i), _mm256_loadu_ps(g + i));
        __m256 x1 = _mm256_add_ps(_mm256_loadu_ps(r + i + 8), _mm256_loadu_ps(g + i + 8));
        _mm256_storeu_ps(r + i, x0);
        _mm256_storeu_ps(r + i + 8, x1);
        a0 = _mm256_or_si256(a0, _mm256_add_epi32(_mm256_and_si256(_mm256_castps_si256(x0), ex),
                                                  one));
        a1 = _mm256_or_si256(a1, _mm256_add_epi32(_mm256_and_si256(_mm256_castps_si256(x1), ex),
                                                  one));
    }
    a0 = _mm256_or_si256(a0, a1);
    *odd |= !_mm256_testz_si256(a0, _mm256_set1_epi32((int)0x80000000u));
    return i;
}
#endif

/* x[n] -> f16 or bf16 at body[2n]. */
static void encode_fp16(uint8_t *restrict body, const float *restrict x, size_t n)
{
    size_t i = 0;
#ifdef PSK_HAVE_F16C
    if (f16c_ok()) i = encode_fp16_f16c(body, x, n);
#endif
    for (; i < n; i++)
        st16(body + 2 * i, f16_from_f32(x[i]));
}

static void encode_bf16(uint8_t *restrict body, const float *restrict x, size_t n)
{
    size_t i = 0;
#ifdef PSK_HAVE_F16C
    if (avx2_ok()) i = encode_bf16_avx2(body, x, n);
#endif
    for (; i < n; i++)
        st16(body + 2 * i, bf16_from_f32(x[i]));
}

/* Error feedback's fp16 / bf16 body[2n] (encoded from x[n]): values whose encoding is an
 * infinity though x is finite become the format's largest (f16_saturate, bf16_saturate). */
static void saturate_half(uint8_t *restrict body, const float *restrict x, size_t n, int kind)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t h = ld16(body + 2 * i);
        uint16_t s = kind == PSK_CODEC_FP16 ? f16_saturate(h, x[i]) : bf16_saturate(h, x[i]);
        if (s != h)
            st16(body + 2 * i, s);
    }
}

/*
 * q[n] = round(x[n] * inv) to nearest even, clamped to [-127, 127]. Adding and subtracting
 * 1.5 * 2^23 rounds any |v| < 2^22 to an integer with the FPU's ties-to-even (SSE2 has no
 * vector round instruction); the clamp catches x * inv just above 127.
 */
static void quantize_nearest(uint8_t *restrict q, const float *restrict x, size_t n, float inv)
{
    size_t i = 0;
#ifdef PSK_HAVE_F16C
    if (avx2_ok()) i = quantize_nearest_avx2(q, x, n, inv);
#endif
    for (; i < n; i++) {
        float r = (x[i] * inv + 0x1.8p23f) - 0x1.8p23f;
        int32_t v = (int32_t)r;
        v = v > 127 ? 127 : v;
        v = v < -127 ? -127 : v;
        q[i] = (uint8_t)(int8_t)v;
    }
}

/*
 * q[n] = floor(x[n] * inv + u), u uniform in [0, 1) on a 2^-24 grid from hash32 of
 * (element index first + i) ^ key: unbiased, E[q] = x * inv. v + 128 is positive, so the
 * conversion (truncation) is the floor.
 */
static void quantize_stochastic(uint8_t *restrict q, const float *restrict x, size_t n,
                                float inv, uint32_t key, uint32_t first)
{
    size_t i = 0;
#ifdef PSK_HAVE_F16C
    if (avx2_ok()) i = quantize_stochastic_avx2(q, x, n, inv, key, first);
#endif
    for (; i < n; i++) {
        float u = (float)(hash32((first + (uint32_t)i) ^ key) >> 8) * 0x1.0p-24f;
        float v = x[i] * inv + u;
        int32_t f = (int32_t)(v + 128.0f) - 128;
        f = f > 127 ? 127 : f;
        f = f < -127 ? -127 : f;
        q[i] = (uint8_t)(int8_t)f;
    }
}

/* body: f32 scale[nb] then i8 q[n]. */
static int encode_int8(uint8_t *restrict body, const float *restrict x, size_t n,
                       const psk_codec_t *c)
{
    size_t block = c->block;
    size_t nb = ceil_div(n, block);
    uint8_t *q = body + 4 * nb;
    uint32_t key = (uint32_t)psk_mix64(c->seed + PSK_GOLDEN_GAMMA);

    for (size_t b = 0; b < nb; b++) {
        size_t s = b * block;
        size_t len = n - s < block ? n - s : block;
        uint32_t mk;
#ifdef PSK_HAVE_F16C
        if (avx2_ok())
            mk = absmax_key_avx2(x + s, len);
        else
#endif
            mk = absmax_key(x + s, len);
        if (mk >= INF_BITS)
            return PS_EINVAL;
        float m = f32_from_bits(mk);
        float scale = m / 127.0f;
        /* A subnormal scale is coarse: round it up so that 127 steps still reach m; one
         * rounded up near FLT_MAX would decode 127 steps as an infinity: round it down. */
        if (scale < FLT_MIN && (double)scale * 127.0 < (double)m)
            scale = nextafterf(scale, INFINITY);
        else if ((double)scale * 127.0 > (double)FLT_MAX)
            scale = nextafterf(scale, 0.0f);
        stf32(body + 4 * b, scale);
        if (m >= 0x1.0p-100f) {
            /* 127 / m is finite and the products stay in [-127, 127] (give or take an ulp). */
            float inv = 127.0f / m;
            if (c->stochastic)
                quantize_stochastic(q + s, x + s, len, inv, key, (uint32_t)s);
            else
                quantize_nearest(q + s, x + s, len, inv);
        } else {
            /*
             * Tiny block: 127 / m may overflow float and scale may be subnormal, so round
             * x / scale in double, against the scale actually sent. Rare (and nearest
             * rounding only): such gradients are zero for every practical purpose.
             */
            for (size_t i = 0; i < len; i++) {
                double v = scale > 0.0f ? nearbyint((double)x[s + i] / (double)scale) : 0.0;
                v = v > 127.0 ? 127.0 : v < -127.0 ? -127.0 : v;
                q[s + i] = (uint8_t)(int8_t)v;
            }
        }
    }
    return 0;
}

/*
 * body: f32 scale[nb] then the sign bits. The block's mean |x| is summed in double over 8
 * lanes: no overflow for finite input, NaN or inf show up in the sum, and a fixed
 * summation order keeps the result identical everywhere.
 */
static int encode_sign(uint8_t *restrict body, const float *restrict x, size_t n,
                       const psk_codec_t *c)
{
    size_t block = c->block;
    size_t nb = ceil_div(n, block);
    uint8_t *bits = body + 4 * nb;

    for (size_t b = 0; b < nb; b++) {
        size_t s = b * block;
        size_t len = n - s < block ? n - s : block;
        const float *xb = x + s;
        double acc[8] = {0};
        size_t i = 0;
#ifdef PSK_HAVE_F16C
        if (avx2_ok()) i = abs_sums8_avx2(xb, len, acc);
#endif
        for (; i + 8 <= len; i += 8)
            for (size_t l = 0; l < 8; l++)
                acc[l] += fabs((double)xb[i + l]);
        for (; i < len; i++)
            acc[i % 8] += fabs((double)xb[i]);
        double sum =
            ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        if (!isfinite(sum))
            return PS_EINVAL;
        stf32(body + 4 * b, (float)(sum / (double)len));
    }

    /*
     * Four bytes at a time: all-ones for a set sign bit, masked to its bit by a table (SSE2
     * has no per-lane shift), OR-reduced; the compiler vectorizes the loop over 32 values.
     */
    static const uint32_t bit[32] = {
        1u << 0,  1u << 1,  1u << 2,  1u << 3,  1u << 4,  1u << 5,  1u << 6,  1u << 7,
        1u << 8,  1u << 9,  1u << 10, 1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15,
        1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, 1u << 22, 1u << 23,
        1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31,
    };
    size_t words = n / 32, j0 = 0;
#ifdef PSK_HAVE_F16C
    if (avx2_ok()) {
        sign_bits_avx2(bits, x, words);
        j0 = words;
    }
#endif
    for (size_t j = j0; j < words; j++) {
        uint32_t v = 0;
        for (uint32_t l = 0; l < 32; l++)
            v |= (0u - (f32_bits(x[32 * j + l]) >> 31)) & bit[l];
        st32(bits + 4 * j, v); /* little-endian: value l is bit l % 8 of byte 4j + l / 8 */
    }
    size_t full = n / 8;
    for (size_t j = 4 * words; j < full; j++) {
        uint32_t v = 0;
        for (uint32_t l = 0; l < 8; l++)
            v |= (f32_bits(x[8 * j + l]) >> 31) << l;
        bits[j] = (uint8_t)v;
    }
    if (n % 8) {
        uint32_t v = 0;
        for (uint32_t l = 0; l < n % 8; l++)
            v |= (f32_bits(x[8 * full + l]) >> 31) << l;
        bits[full] = (uint8_t)v;
    }
    return 0;
}

static int encode_args_check(size_t cap, size_t n, const psk_codec_t *c, const void *scratch)
{
    if (!codec_valid(c) || n > UINT32_MAX)
        return PS_EINVAL;
    if (cap < payload_bytes(c, n))
        return PS_EINVAL;
    if (psk_codec_scratch_bytes(c, n) > 0 && scratch == NULL)
        return PS_EINVAL;
    return 0;
}

/* r[n] += g[n]: error feedback's x = g + r, in place. */
static void add_into(float *restrict r, const float *restrict g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        r[i] += g[i];
}

/* add_into that also says whether a sum is a NaN or an infinity (an exponent of all ones
 * carries into bit 31 when 1 is added to it; OR-reduced, so the loop vectorizes). */
static bool add_into_odd(float *restrict r, const float *restrict g, size_t n)
{
    uint32_t acc = 0;
    bool odd = false;
    size_t i = 0;
#ifdef PSK_HAVE_F16C
    if (avx2_ok()) i = add_odd_avx2(r, g, n, &odd);
#endif
    for (; i < n; i++) {
        float x = r[i] + g[i];
        uint32_t b;
        memcpy(&b, &x, 4);
        acc |= (b & 0x7f800000u) + 0x00800000u;
        r[i] = x;
    }
    return odd || acc >> 31;
}

/*
 * ---- topk: the sampled path ----
 *
 * The full path reads all of x twice (level 1's histogram, then the split), and incrementing a
 * histogram counter per value is what it spends its time on (session 22: 2-3 GB/s). For large
 * chunks a sample guesses a threshold t below the k-th largest key; one vectorized pass
 * collects the indices whose key is >= t, and the radix select runs over those only. It is
 * exact whatever the guess: when the pass finds k or more, every key of the top k is >= t
 * (they are the k largest), so the same k are chosen, ties included; when it finds fewer, the
 * guess was too high and the full path runs. With error feedback the pass also adds g into
 * the residual, so x = g + r costs no pass of its own.
 */
#define TOPK_FAST_MIN_N 32768 /* smaller chunks take the full path */
#define TOPK_SAMPLE_RUNS 64   /* the sample: 64 runs of 64 values spread evenly over x */
#define TOPK_SAMPLE_RUN 64

/* Keys >= t among x[from, n) (x + g with g, stored into x) appended to cand at nc; new count. */
static size_t topk_gather_scalar(uint32_t *restrict cand, size_t nc, float *restrict x,
                                 const float *restrict g, size_t from, size_t n, uint32_t t)
{
    for (size_t i = from; i < n; i++) {
        if (g)
            x[i] += g[i];
        cand[nc] = (uint32_t)i; /* branch-free; cand has room for n + 1 */
        nc += mag_key(x[i]) >= t;
    }
    return nc;
}

/*
 * The indices of x[n] (ascending) whose key is >= t (t >= 1) into cand[n + 1]; returns their
 * count. With g, x[i] += g[i] first and stored (x is written only then).
 */
static size_t topk_gather(uint32_t *restrict cand, float *restrict x, const float *restrict g,
                          size_t n, uint32_t t)
{
    size_t i = 0, nc = 0;
#ifdef PSK_HAVE_F16C
    if (avx2_ok()) {
        nc = topk_gather_avx2(cand, x, g, n, t);
        i = n & ~(size_t)15;
    }
#endif
    return topk_gather_scalar(cand, nc, x, g, i, n, t);
}

/*
 * A threshold for the top k of x[n] (x + g with g, read only here), n >= TOPK_FAST_MIN_N: the key
 * of the sample (64 runs of 64) at its rank k/n of it, plus four standard deviations and 8 of
 * margin, cut to its top 22 bits (levels 1 and 2 of the radix select on the sample), so that
 * probably a bit more than k keys are >= it. 0 when that would take over a quarter of x (the
 * full path is as fast then) or everything. keys: [4096] u32; hist: [TOPK_BINS] u32.
 */
static uint32_t topk_guess(const float *x, const float *g, size_t n, size_t k,
                           uint32_t *restrict keys, uint32_t *restrict hist)
{
    const size_t ns = TOPK_SAMPLE_RUNS * TOPK_SAMPLE_RUN;
    size_t m = 0;
    for (size_t r = 0; r < TOPK_SAMPLE_RUNS; r++) {
        size_t at = r * (n - TOPK_SAMPLE_RUN) / (TOPK_SAMPLE_RUNS - 1);
        for (size_t l = at; l < at + TOPK_SAMPLE_RUN; l++)
            keys[m++] = mag_key(g ? x[l] + g[l] : x[l]);
    }
    double ks = (double)k * (double)ns / (double)n;
    size_t need = (size_t)(ks + 4.0 * sqrt(ks) + 8.0);
    if (need > ns / 4)
        return 0;
    memset(hist, 0, TOPK_BINS * sizeof *hist);
    for (size_t j = 0; j < ns; j++)
        hist[keys[j] >> 20]++;
    uint32_t b1 = find_bin(hist, TOPK_BINS, &need);
    memset(hist, 0, TOPK_BINS * sizeof *hist);
    for (size_t j = 0; j < ns; j++)
        if (keys[j] >> 20 == b1)
            hist[(keys[j] >> 9) & 0x7ffu]++;
    uint32_t b2 = find_bin(hist, TOPK_BINS, &need);
    return b1 << 20 | b2 << 9;
}

/*
 * The top k of x[n] (1 <= k <= n) as ascending u32 indices at idx_out: the k largest
 * magnitudes, of equal ones the lowest indices. With g (error feedback), x += g first: x is
 * written then and only then. scratch: [4 * TOPK_BINS + n + 1] u32.
 */
static void topk_select(uint8_t *restrict idx_out, float *restrict x, const float *restrict g,
                        size_t n, size_t k, uint32_t *restrict scratch)
{
    uint32_t *hist = scratch, *cand = scratch + 4 * TOPK_BINS;
    uint32_t t = n >= TOPK_FAST_MIN_N ? topk_guess(x, g, n, k, cand, hist) : 0;
    if (t == 0) {
        if (g)
            add_into(x, g, n);
        topk_select_full(idx_out, x, n, k, scratch);
        return;
    }
    size_t nc = topk_gather(cand, x, g, n, t);
    if (nc >= k)
        topk_select_cand(idx_out, x, cand, nc, k, hist);
    else /* the guess was too high (x holds g now) */
        topk_select_full(idx_out, x, n, k, scratch);
}

/* Header and body for valid arguments; @p ef: error feedback's encoding (half values
 * saturate: saturate_half). */
static int encode(uint8_t *out, const float *in, size_t n, const psk_codec_t *c, void *scratch,
                  bool ef)
{
    uint8_t *body = out + PSK_CODEC_HEADER_BYTES;
    size_t k = psk_codec_k(c, n);

    header_make(out, c, n);
    switch (c->kind) {
    case PSK_CODEC_NONE:
        memcpy(body, in, 4 * n);
        return 0;
    case PSK_CODEC_FP16:
        encode_fp16(body, in, n);
        if (ef)
            saturate_half(body, in, n, c->kind);
        return 0;
    case PSK_CODEC_BF16:
        encode_bf16(body, in, n);
        if (ef)
            saturate_half(body, in, n, c->kind);
        return 0;
    case PSK_CODEC_INT8:
        return encode_int8(body, in, n, c);
    case PSK_CODEC_SIGN:
        return encode_sign(body, in, n, c);
    case PSK_CODEC_TOPK:
        if (k > 0) {
            /* x is only read: no g */
            topk_select(body, (float *)(uintptr_t)in, NULL, n, k, scratch);
            gather_values(body + 4 * k, in, body, k, c->fp16_values, ef);
        }
        return 0;
    case PSK_CODEC_RANDOMK: {
        st64(body, c->seed);
        uint8_t *v = body + 8;
        if (k == 0)
            return 0;
        strata_t s;
        strata_init(&s, c->seed, n, k);
        for (size_t j = 0; j < k; j++) {
            float x = in[strata_next(&s, j)];
            if (c->fp16_values)
                st16(v + 2 * j, ef ? f16_saturate(f16_from_f32(x), x) : f16_from_f32(x));
            else
                stf32(v + 4 * j, x);
        }
        return 0;
    }
    }
    return PS_EINVAL; /* not reached: codec_valid */
}

int psk_codec_encode_cpu(uint8_t *out, size_t cap, size_t *len, const float *in, size_t n,
                         const psk_codec_t *c, void *scratch)
{
    int rc = encode_args_check(cap, n, c, scratch);
    if (rc != 0)
        return rc;
    rc = encode(out, in, n, c, scratch, false);
    if (rc != 0)
        return rc;
    /* random-k's k values may miss a NaN or an infinity of x: the first one says so, so that
     * psd leaves the push out (and the worker is told) as it does every other codec's (as the
     * error-feedback encode does; before, a probe found, the rest of such a push was applied
     * without a word). */
    size_t k = psk_codec_k(c, n);
    if (c->kind == PSK_CODEC_RANDOMK && k && !psk_all_finite(in, n)) {
        uint8_t *v = out + PSK_CODEC_HEADER_BYTES + 8;
        if (c->fp16_values)
            st16(v, 0x7e00);
        else
            stf32(v, NAN);
    }
    *len = payload_bytes(c, n);
    return 0;
}

/* ---- decode ---- */

/* Scales: >= 0 and @p mul x scale finite (NaN fails the comparison; in double, exact): int8
 * takes mul 127, its largest value (the encoder rounds its scale down so; a larger one decoded
 * to an infinity, taken for a worker's exploding gradient, a review, session 71), sign 1.
 * Returns nonzero if any is bad. */
static int scales_bad(const uint8_t *scales, size_t nb, double mul)
{
    int bad = 0;
    for (size_t b = 0; b < nb; b++) {
        float s = ldf32(scales + 4 * b);
        bad |= !(s >= 0.0f && (double)s * mul <= (double)FLT_MAX);
    }
    return bad;
}

/* The body checks beyond the header and length; 0 if the payload is well formed. */
static int body_check(const uint8_t *body, size_t n, const psk_codec_t *c)
{
    switch (c->kind) {
    case PSK_CODEC_NONE:
    case PSK_CODEC_FP16:
    case PSK_CODEC_BF16:
    case PSK_CODEC_RANDOMK:
        return 0;
    case PSK_CODEC_INT8: {
        size_t nb = ceil_div(n, c->block);
        const uint8_t *q = body + 4 * nb;
        int bad = scales_bad(body, nb, 127.0);
        for (size_t i = 0; i < n; i++)
            bad |= q[i] == 0x80; /* -128: never encoded, |q| <= 127 */
        return bad;
    }
    case PSK_CODEC_SIGN: {
        size_t nb = ceil_div(n, c->block);
        int bad = scales_bad(body, nb, 1.0);
        if (n % 8)
            bad |= (body[4 * nb + n / 8] >> (n % 8)) != 0;
        return bad;
    }
    case PSK_CODEC_TOPK: {
        /* Strictly increasing, and the last one (hence all) below n. */
        size_t k = psk_codec_k(c, n);
        if (k == 0)
            return 0;
        int bad = ld32(body + 4 * (k - 1)) >= n;
        for (size_t j = 1; j < k; j++)
            bad |= ld32(body + 4 * j) <= ld32(body + 4 * (j - 1));
        return bad;
    }
    }
    return 1;
}

/* out[n] += w * body values, for the dense fp32 / fp16 / bf16 bodies. */
static void add_f32(float *restrict out, const uint8_t *restrict v, size_t n, float w)
{
    for (size_t i = 0; i < n; i++)
        out[i] += w * ldf32(v + 4 * i);
}

static void add_f16(float *restrict out, const uint8_t *restrict v, size_t n, float w)
{
    size_t i = 0;
#ifdef PSK_HAVE_F16C
    if (f16c_ok()) i = add_f16_f16c(out, v, n, w);
#endif
    for (; i < n; i++)
        out[i] += w * f32_from_f16(ld16(v + 2 * i));
}

static void add_bf16(float *restrict out, const uint8_t *restrict v, size_t n, float w)
{
    size_t i = 0;
#ifdef PSK_HAVE_F16C
    if (avx2_ok()) i = add_bf16_avx2(out, v, n, w);
#endif
    for (; i < n; i++)
        out[i] += w * f32_from_bf16(ld16(v + 2 * i));
}

/* out[n] += (w * scale[b]) * q[i] per block. */
static void add_int8(float *restrict out, const uint8_t *restrict body, size_t n, size_t block,
                     float w)
{
    size_t nb = ceil_div(n, block);
    const uint8_t *q = body + 4 * nb;
    for (size_t b = 0; b < nb; b++) {
        size_t s = b * block;
        size_t len = n - s < block ? n - s : block;
        float sw = w * ldf32(body + 4 * b);
        size_t i = s;
#ifdef PSK_HAVE_F16C
        if (avx2_ok()) i += add_i8_avx2(out + s, q + s, len, sw);
#endif
        for (; i < s + len; i++)
            out[i] += sw * (float)(int8_t)q[i];
    }
}

/* The sign masks of four values from a nibble of sign bits (bit l -> value l). */
#define NIB(v)                                                                           \
    {((v)&1) ? 0x80000000u : 0u, ((v)&2) ? 0x80000000u : 0u, ((v)&4) ? 0x80000000u : 0u, \
     ((v)&8) ? 0x80000000u : 0u}
static const uint32_t SIGN_NIBBLE[16][4] = {
    NIB(0), NIB(1), NIB(2),  NIB(3),  NIB(4),  NIB(5),  NIB(6),  NIB(7),
    NIB(8), NIB(9), NIB(10), NIB(11), NIB(12), NIB(13), NIB(14), NIB(15),
};
#undef NIB

/*
 * out[n] += +-(w * scale[b]): the sign bit of x flips the sign bit of w * scale. Whole bytes
 * go through SIGN_NIBBLE (SSE2 has no per-lane shift to pick the bits apart).
 */
static void add_sign(float *restrict out, const uint8_t *restrict body, size_t n, size_t block,
                     float w)
{
    size_t nb = ceil_div(n, block);
    const uint8_t *bits = body + 4 * nb;
    for (size_t b = 0; b < nb; b++) {
        size_t s = b * block;
        size_t len = n - s < block ? n - s : block;
        uint32_t sw = f32_bits(w * ldf32(body + 4 * b));
        size_t i = s, e = s + len;
        /* A block that does not start or end on a byte boundary has scalar edges. */
        for (; i < e && (i & 7) != 0; i++)
            out[i] += f32_from_bits(sw ^ (((uint32_t)(bits[i >> 3] >> (i & 7)) & 1u) << 31));
        for (; i + 8 <= e; i += 8) {
            const uint32_t *lo = SIGN_NIBBLE[bits[i >> 3] & 15];
            const uint32_t *hi = SIGN_NIBBLE[bits[i >> 3] >> 4];
            for (uint32_t l = 0; l < 4; l++)
                out[i + l] += f32_from_bits(sw ^ lo[l]);
            for (uint32_t l = 0; l < 4; l++)
                out[i + 4 + l] += f32_from_bits(sw ^ hi[l]);
        }
        for (; i < e; i++)
            out[i] += f32_from_bits(sw ^ (((uint32_t)(bits[i >> 3] >> (i & 7)) & 1u) << 31));
    }
}

/* Accumulate a checked payload body: out[n] += w * decode(body). */
static void decode_add(float *out, size_t n, const uint8_t *body, const psk_codec_t *c, float w)
{
    size_t k = psk_codec_k(c, n);
    switch (c->kind) {
    case PSK_CODEC_NONE:
        add_f32(out, body, n, w);
        return;
    case PSK_CODEC_FP16:
        add_f16(out, body, n, w);
        return;
    case PSK_CODEC_BF16:
        add_bf16(out, body, n, w);
        return;
    case PSK_CODEC_INT8:
        add_int8(out, body, n, c->block, w);
        return;
    case PSK_CODEC_SIGN:
        add_sign(out, body, n, c->block, w);
        return;
    case PSK_CODEC_TOPK: {
        const uint8_t *v = body + 4 * k;
        for (size_t j = 0; j < k; j++)
            out[ld32(body + 4 * j)] += w * value_at(v, j, c->fp16_values);
        return;
    }
    case PSK_CODEC_RANDOMK: {
        if (k == 0)
            return;
        const uint8_t *v = body + 8;
        strata_t s;
        strata_init(&s, ld64(body), n, k);
        for (size_t j = 0; j < k; j++)
            out[strata_next(&s, j)] += w * value_at(v, j, c->fp16_values);
        return;
    }
    }
}

/* What body_check found wrong in @p body, into @p why: the first offending value, found by a
 * second, plain scan (the check itself stays a branch-free pass). */
static void body_why(const uint8_t *body, size_t n, const psk_codec_t *c, char *why, size_t len)
{
    snprintf(why, len, "a malformed body");
    if (c->kind == PSK_CODEC_INT8 || c->kind == PSK_CODEC_SIGN) {
        size_t nb = ceil_div(n, c->block);
        double mul = c->kind == PSK_CODEC_INT8 ? 127.0 : 1.0;
        for (size_t b = 0; b < nb; b++) {
            float s = ldf32(body + 4 * b);
            if (!(s >= 0.0f && (double)s * mul <= (double)FLT_MAX)) {
                snprintf(why, len, "the scale of block %zu is %g (%s)", b, (double)s,
                         c->kind == PSK_CODEC_INT8 ? "0 to FLT_MAX / 127, so that 127 x scale "
                                                     "is finite"
                                                   : "0 to FLT_MAX");
                return;
            }
        }
        if (c->kind == PSK_CODEC_INT8) {
            for (size_t i = 0; i < n; i++)
                if (body[4 * nb + i] == 0x80) {
                    snprintf(why, len, "value %zu is -128 (int8 values are -127 to 127)", i);
                    return;
                }
        } else if (n % 8) {
            snprintf(why, len, "the sign bits past value %zu are set (padding must be 0)", n);
        }
    } else if (c->kind == PSK_CODEC_TOPK) {
        size_t k = psk_codec_k(c, n);
        for (size_t j = 0; j < k; j++) {
            uint32_t v = ld32(body + 4 * j), prev = j ? ld32(body + 4 * (j - 1)) : 0;
            if (j && v <= prev) {
                snprintf(why, len, "index %zu is %u, not above index %zu (%u): indices must rise",
                         j, v, j - 1, prev);
                return;
            }
            if (v >= n) {
                snprintf(why, len, "index %zu is %u, past the chunk's %zu values", j, v, n);
                return;
            }
        }
    }
}

int psk_codec_check_why(const uint8_t *payload, size_t len, size_t n, const psk_codec_t *c,
                        char *why, size_t whylen)
{
    if (!codec_valid(c) || n > UINT32_MAX) {
        if (why) snprintf(why, whylen, "the codec or the chunk's size is not a valid one");
        return PS_EINVAL;
    }
    /* Length first: every valid payload is at least a header long, so the header is there. */
    size_t want_len = payload_bytes(c, n);
    if (len != want_len) {
        if (why) snprintf(why, whylen, "%zu bytes, where %zu values take %zu", len, n, want_len);
        return PS_EPROTO;
    }
    uint8_t want[PSK_CODEC_HEADER_BYTES];
    header_make(want, c, n);
    if (memcmp(payload, want, sizeof want) != 0) {
        if (why) {
            size_t i = 0;
            while (payload[i] == want[i]) i++;
            snprintf(why, whylen, "header byte %zu is 0x%02x, expected 0x%02x (%s)", i,
                     payload[i], want[i], i == 0 ? "the codec" : i == 1 ? "its flags"
                                          : i >= 4 && i < 8 ? "the values' count"
                                          : i >= 8 && i < 12 ? "k or the block size"
                                                             : "reserved: 0");
        }
        return PS_EPROTO;
    }
    if (body_check(payload + PSK_CODEC_HEADER_BYTES, n, c) != 0) {
        if (why) body_why(payload + PSK_CODEC_HEADER_BYTES, n, c, why, whylen);
        return PS_EPROTO;
    }
    return 0;
}

int psk_codec_check(const uint8_t *payload, size_t len, size_t n, const psk_codec_t *c)
{
    return psk_codec_check_why(payload, len, n, c, NULL, 0);
}

int psk_codec_decode_add_cpu(float *out, size_t n, const uint8_t *payload, size_t len,
                             const psk_codec_t *c, float weight)
{
    int rc = psk_codec_check(payload, len, n, c);
    if (rc != 0)
        return rc;
    decode_add(out, n, payload + PSK_CODEC_HEADER_BYTES, c, weight);
    return 0;
}

/* Residual values that are a NaN or an infinity become 0: kept, they would make every later
 * push of the chunk one psd leaves out (fp16 / bf16: x was one, g held it or g + residual
 * overflowed; the value was sent on as one, so psd leaves this push out). */
static void residual_zero_odd(float *r, size_t n)
{
    if (psk_all_finite(r, n)) /* vectorized; the loop below is not */
        return;
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, r + i, 4);
        if ((b & 0x7f800000u) == 0x7f800000u)
            r[i] = 0.0f;
    }
}

/* Top-k / random-k whose push psd leaves out (its payload holds a NaN or an infinity): the
 * residual keeps what it would have sent, residual = x (the payload's values added back: x - d
 * + d is x, the subtraction exact), but 0 for a NaN or an infinity. What built up at the k
 * coordinates over many steps is not lost with the push. */
static void residual_unsent(float *r, size_t n, const uint8_t *body, const psk_codec_t *c)
{
    decode_add(r, n, body, c, 1.0f);
    residual_zero_odd(r, n);
}

bool psk_all_finite(const float *x, size_t n)
{
    /* An exponent of all ones is a NaN or an infinity; OR-reduced over the bits, so that the
     * compiler vectorizes it (a float compare reduction would need reassociation). */
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, x + i, 4);
        bad |= (uint32_t)((b & 0x7f800000u) == 0x7f800000u);
    }
    return bad == 0;
}

bool psk_codec_needs_finite(const psk_codec_t *c)
{
    return c->kind == PSK_CODEC_INT8 || c->kind == PSK_CODEC_SIGN;
}

int psk_codec_encode_ef_cpu(uint8_t *out, size_t cap, size_t *len, const float *g,
                            float *residual, size_t n, const psk_codec_t *c, void *scratch)
{
    int rc = encode_args_check(cap, n, c, scratch);
    if (rc != 0)
        return rc;
    /* Refused before the residual takes g: added first, one bad gradient made every later
     * push of the chunk fail (its residual NaN for good). */
    if (psk_codec_needs_finite(c) && !psk_all_finite(g, n))
        return PS_EINVAL;
    /* residual[n] = x = g + residual; encode x; residual = x - decode(x). */
#ifdef PSK_HAVE_F16C
    /* fp16 (F16C) and bf16 (AVX2) in one fused pass; a group with a NaN (fp16: or infinity),
     * and the tail, take the three passes below it (the same arithmetic). */
    size_t (*pass)(uint8_t *restrict, const float *restrict, float *restrict, size_t) = NULL;
    void (*enc)(uint8_t *restrict, const float *restrict, size_t) = NULL;
    void (*add)(float *restrict, const uint8_t *restrict, size_t, float) = NULL;
    if (c->kind == PSK_CODEC_FP16 && f16c_ok())
        pass = ef_fp16_f16c, enc = encode_fp16, add = add_f16;
    else if (c->kind == PSK_CODEC_BF16 && avx2_ok())
        pass = ef_bf16_avx2, enc = encode_bf16, add = add_bf16;
    if (pass) {
        header_make(out, c, n);
        uint8_t *body = out + PSK_CODEC_HEADER_BYTES;
        size_t i = pass(body, g, residual, n);
        if (i < n) { /* a NaN, an infinity (or one fp16 / bf16 rounds to: saturated), or
                      * the tail */
            add_into(residual + i, g + i, n - i);
            enc(body + 2 * i, residual + i, n - i);
            saturate_half(body + 2 * i, residual + i, n - i, c->kind);
            add(residual + i, body + 2 * i, n - i, -1.0f);
            residual_zero_odd(residual + i, n - i);
        }
        *len = payload_bytes(c, n);
        return 0;
    }
#endif
    if (c->kind == PSK_CODEC_TOPK) {
        /* The selection adds g into the residual in its own pass (topk_select). */
        size_t k = psk_codec_k(c, n);
        uint8_t *body = out + PSK_CODEC_HEADER_BYTES;
        header_make(out, c, n);
        if (k == 0) {
            add_into(residual, g, n);
        } else {
            topk_select(body, residual, g, n, k, scratch);
            gather_values(body + 4 * k, residual, body, k, c->fp16_values, true);
            decode_add(residual, n, body, c, -1.0f);
            /* A NaN or an infinity outranks every finite value: none among the k sent, none
             * in the residual. */
            if (!values_finite(body + 4 * k, k, c->fp16_values))
                residual_unsent(residual, n, body, c);
        }
        *len = payload_bytes(c, n);
        return 0;
    }
    bool odd = add_into_odd(residual, g, n);
    /* int8 and sign (g finite, checked above): g + residual overflowed float; that value is
     * lost (0), the rest of the chunk goes out (before, the push was refused and the residual
     * kept the infinity, so every later push of the chunk failed). */
    if (odd && psk_codec_needs_finite(c))
        residual_zero_odd(residual, n);
    rc = encode(out, residual, n, c, scratch, true);
    if (rc != 0)
        return rc;
    decode_add(residual, n, out + PSK_CODEC_HEADER_BYTES, c, -1.0f);
    /* A non-finite x (g held one, or g + residual overflowed); a finite one out of fp16's or
     * bf16's range went out saturated (encode's ef), its excess kept. int8 and sign refused a
     * non-finite g above and zeroed an overflow of g + residual. */
    uint8_t *body = out + PSK_CODEC_HEADER_BYTES;
    if (c->kind == PSK_CODEC_RANDOMK) {
        size_t k = psk_codec_k(c, n);
        if (k && (odd || !values_finite(body + 8, k, c->fp16_values))) {
            residual_unsent(residual, n, body, c);
            /* Its k values may have missed it: the first one says so, so that psd leaves the
             * push out (and the worker is told) as it does every other codec's. */
            if (c->fp16_values)
                st16(body + 8, 0x7e00);
            else
                stf32(body + 8, NAN);
        }
    } else if (!psk_codec_needs_finite(c)) {
        residual_zero_odd(residual, n);
    }
    *len = payload_bytes(c, n);
    return 0;
}

int psk_codec_ef_put_back_cpu(float *residual, const float *g, size_t n, const uint8_t *payload,
                              size_t len, const psk_codec_t *c)
{
    int rc = psk_codec_check(payload, len, n, c);
    if (rc != 0)
        return rc;
    const uint8_t *body = payload + PSK_CODEC_HEADER_BYTES;
    size_t k = psk_codec_k(c, n);
    bool kept = false; /* residual_unsent ran: the residual holds x */
    if (c->kind == PSK_CODEC_TOPK && k)
        kept = !values_finite(body + 4 * k, k, c->fp16_values);
    else if (c->kind == PSK_CODEC_RANDOMK && k)
        kept = !values_finite(body + 8, k, c->fp16_values);
    if (!kept)
        decode_add(residual, n, body, c, 1.0f);
    for (size_t i = 0; i < n; i++) {
        float e = residual[i] - g[i];
        residual[i] = isfinite(e) ? e : 0.0f;
    }
    return 0;
}

/* ---- parse ---- */

int psk_codec_parse(psk_codec_t *c, const char *text)
{
    static const struct {
        const char *name;
        psk_codec_kind_t kind;
    } names[] = {
        {"none", PSK_CODEC_NONE}, {"fp16", PSK_CODEC_FP16},   {"bf16", PSK_CODEC_BF16},
        {"int8", PSK_CODEC_INT8}, {"topk", PSK_CODEC_TOPK},   {"randomk", PSK_CODEC_RANDOMK},
        {"sign", PSK_CODEC_SIGN},
    };

    if (text == NULL)
        return PS_EINVAL;
    const char *colon = strchr(text, ':');
    size_t len = colon != NULL ? (size_t)(colon - text) : strlen(text);
    psk_codec_t r = {.block = PSK_CODEC_BLOCK_DEFAULT};
    size_t i = 0;
    for (; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i].name) == len && memcmp(names[i].name, text, len) == 0)
            break;
    if (i == sizeof names / sizeof names[0])
        return PS_EINVAL;
    r.kind = names[i].kind;

    if (is_sparse(r.kind)) {
        if (colon == NULL)
            return PS_EINVAL;
        const char *arg = colon + 1;
        /* strtod alone would also take leading spaces, signs, "nan" and "inf". */
        if (!((*arg >= '0' && *arg <= '9') || *arg == '.'))
            return PS_EINVAL;
        char *end;
        double f = strtod(arg, &end);
        if (end == arg || *end != '\0' || !(f > 0.0 && f <= 1.0))
            return PS_EINVAL;
        r.fraction = (float)f;
        if (!(r.fraction > 0.0f)) /* underflowed */
            return PS_EINVAL;
    } else if (colon != NULL) {
        return PS_EINVAL;
    }
    *c = r;
    return 0;
}
