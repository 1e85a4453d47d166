/* crc32c.c: CRC-32C, hardware (SSE4.2 crc32, three interleaved streams) or slicing-by-8.
 *
 * The three-stream method and the zeros operators follow Mark Adler's public crc32c.c: the
 * crc32 instruction has a latency of 3 cycles and a throughput of 1, so three independent
 * streams over adjacent blocks keep it busy; their CRCs are then combined by "shifting" each
 * one over the bytes that follow it (a linear map, precomputed as four 256-entry tables). */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "crc32c.h"

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t's fields: ps_crc32c_xxh3 carries its stream on */
#include <xxhash.h>
#if PS_HAVE_XXH3_DISPATCH
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>
#define XXH3_UPDATE XXH3_64bits_update_dispatch /* AVX2 / AVX-512 where the CPU has them */
#else
#define XXH3_UPDATE XXH3_64bits_update
#endif

#define POLY 0x82f63b78u

static uint32_t sw_table[8][256];

/* Whether any of the 4-byte floats in p[len] (len a multiple of 4) is a NaN or an infinity:
 * an exponent of all ones carries into bit 31 when 1 is added to it, no other does. The
 * ps_crc32c_floats paths' bytes that the folding loop does not take. */
static int odd_floats(const unsigned char *p, size_t len)
{
    uint32_t acc = 0;
    for (size_t i = 0; i + 4 <= len; i += 4) {
        uint32_t u;
        memcpy(&u, p + i, 4);
        acc |= (u & 0x7f800000u) + 0x00800000u;
    }
    return (int)(acc >> 31);
}

#if defined(__x86_64__)
#include <immintrin.h>
#include <nmmintrin.h>
#define HAVE_HW 1
#define LONG 8192
#define SHORT 256
static uint32_t long_shift[4][256], short_shift[4][256];
static int use_hw, use_clmul;
static int have_hw, have_clmul; /* what this CPU has (use_*: what ps_crc32c_use left on) */

/* Multiply a 32x32 GF(2) matrix by a vector. */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1) sum ^= *mat;
    return sum;
}

static void gf2_square(uint32_t *sq, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++) sq[n] = gf2_times(mat, mat[n]);
}

/* The operator that appends len zero bytes to a CRC (len a power of two). */
static void zeros_op(uint32_t *even, size_t len)
{
    uint32_t odd[32];
    odd[0] = POLY; /* one zero bit */
    for (int n = 1; n < 32; n++) odd[n] = 1u << (n - 1);
    gf2_square(even, odd); /* two zero bits */
    gf2_square(odd, even); /* four */
    do {
        gf2_square(even, odd); /* one zero byte first, then doubling */
        len >>= 1;
        if (len == 0) return;
        gf2_square(odd, even);
        len >>= 1;
    } while (len);
    memcpy(even, odd, sizeof odd);
}

static void zeros_table(uint32_t t[4][256], size_t len)
{
    uint32_t op[32];
    zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 0; k < 4; k++) t[k][n] = gf2_times(op, n << (8 * k));
}

static inline uint32_t shift(uint32_t t[4][256], uint32_t crc)
{
    return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
}

static inline uint64_t load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* CRCs of the blocks p[0, blk), p[blk, 2 blk), p[2 blk, 3 blk) side by side (the first one
 * continuing c0), combined into the CRC of all three. */
__attribute__((target("sse4.2"))) static inline uint64_t stripe(uint64_t c0, const unsigned char *p,
                                                                 size_t blk, uint32_t t[4][256])
{
    uint64_t c1 = 0, c2 = 0;
    for (const unsigned char *end = p + blk; p < end; p += 8) {
        c0 = _mm_crc32_u64(c0, load64(p));
        c1 = _mm_crc32_u64(c1, load64(p + blk));
        c2 = _mm_crc32_u64(c2, load64(p + 2 * blk));
    }
    c0 = shift(t, (uint32_t)c0) ^ c1;
    return shift(t, (uint32_t)c0) ^ c2;
}

/*
 * Long buffers on CPUs with 512-bit VPCLMULQDQ: carry-less multiplication folding (Intel, "Fast
 * CRC Computation for Generic Polynomials Using PCLMULQDQ", 2009). Folding a 16-byte
 * accumulator A forward by d bytes gives A' = A.lo * k_lo ^ A.hi * k_hi (carry-less) with the
 * same CRC contribution, where k_lo, k_hi are the bit-reflected x^(8d + 31) and x^(8d - 33)
 * mod P (the exponents were found by checking candidates against this file's table CRC). Four
 * 64-byte accumulators 256 bytes apart are folded per step, then into one (d = 64), then its four
 * lanes into the last (d = 16), which is 16 bytes of message after a zero state: the crc32
 * instruction finishes it. hashbench, 1 MiB: 62 GB/s against 31.5 for the three crc32 streams.
 * The 128-bit PCLMULQDQ version of the same loop ran at 16 GB/s here (two multiplies per 16
 * bytes at one per cycle), so the crc32 streams stay the path without VPCLMULQDQ.
 */
#define CLMUL_MIN 1024 /* below this the crc32 streams are as fast */

#define CLMUL_TARGET "sse4.2,pclmul,avx512f,avx512vl,vpclmulqdq"

__attribute__((target(CLMUL_TARGET))) static inline __m128i fold16(__m128i a, __m128i k)
{
    return _mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x00), _mm_clmulepi64_si128(a, k, 0x11));
}

__attribute__((target(CLMUL_TARGET))) static inline __m512i fold64(__m512i a, __m512i k)
{
    return _mm512_xor_si512(_mm512_clmulepi64_epi128(a, k, 0x00),
                            _mm512_clmulepi64_epi128(a, k, 0x11));
}

/* Store one 256-byte group at @p d: streamed (64-byte aligned @p d) or plain. */
__attribute__((target(CLMUL_TARGET))) static inline void put256(unsigned char *d, __m512i a,
                                                                __m512i b, __m512i c, __m512i e,
                                                                int nt)
{
    if (nt) {
        _mm512_stream_si512((void *)d, a);
        _mm512_stream_si512((void *)(d + 64), b);
        _mm512_stream_si512((void *)(d + 128), c);
        _mm512_stream_si512((void *)(d + 192), e);
    } else {
        _mm512_storeu_si512(d, a);
        _mm512_storeu_si512(d + 64, b);
        _mm512_storeu_si512(d + 128, c);
        _mm512_storeu_si512(d + 192, e);
    }
}

/* The CRC state (not inverted) of four 64-byte accumulators: folded into one (d = 64), then
 * its four lanes into the last (d = 16), which the crc32 instruction finishes. */
__attribute__((target(CLMUL_TARGET))) static inline uint64_t reduce256(__m512i x0, __m512i x1,
                                                                       __m512i x2, __m512i x3)
{
    const __m512i k64 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x9e4addf8, 0x740eef02));
    const __m128i k16 = _mm_set_epi64x(0x493c7d27, 0xf20c0dfe);
    x1 = _mm512_xor_si512(x1, fold64(x0, k64));
    x2 = _mm512_xor_si512(x2, fold64(x1, k64));
    x3 = _mm512_xor_si512(x3, fold64(x2, k64));
    __m128i a = _mm512_extracti32x4_epi32(x3, 0);
    a = _mm_xor_si128(_mm512_extracti32x4_epi32(x3, 1), fold16(a, k16));
    a = _mm_xor_si128(_mm512_extracti32x4_epi32(x3, 2), fold16(a, k16));
    a = _mm_xor_si128(_mm512_extracti32x4_epi32(x3, 3), fold16(a, k16));
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(a));
    return _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(a, 1));
}

/* The CRC state (not inverted) after the whole 256-byte groups of p[len], len >= 256, from
 * state c0; *done = the bytes taken (the caller does the rest, < 256 bytes). With @p dst, the
 * bytes taken are also stored there as they are folded (ps_crc32c_copy), with streaming stores
 * if @p nt (then fenced before returning). */
/* With @p odd: *odd |= whether any 4-byte float of the bytes taken is a NaN or an infinity
 * (its exponent all ones), tested on the vectors the folding loads anyway. */
__attribute__((target(CLMUL_TARGET))) static inline uint64_t crc_clmul(uint64_t c0,
                                                                       const unsigned char *p,
                                                                       size_t len, size_t *done,
                                                                       unsigned char *dst, int nt,
                                                                       int *odd)
{
    const __m512i ex = _mm512_set1_epi32(0x7f800000);
    __mmask16 bad = 0;
#define ODD(v) (bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512((v), ex), ex))
    const __m512i k256 = _mm512_broadcast_i32x4(_mm_set_epi64x(0xb9e02b86, 0xdcb17aa4));
    __m512i x0 = _mm512_loadu_si512(p), x1 = _mm512_loadu_si512(p + 64);
    __m512i x2 = _mm512_loadu_si512(p + 128), x3 = _mm512_loadu_si512(p + 192);
    if (dst) put256(dst, x0, x1, x2, x3, nt);
    if (odd) ODD(x0), ODD(x1), ODD(x2), ODD(x3);
    /* The state enters as the first 4 bytes' XOR. */
    x0 = _mm512_xor_si512(x0, _mm512_castsi128_si512(_mm_cvtsi32_si128((int)(uint32_t)c0)));
    size_t i = 256;
    for (; i + 256 <= len; i += 256) {
        __m512i y0 = _mm512_loadu_si512(p + i), y1 = _mm512_loadu_si512(p + i + 64);
        __m512i y2 = _mm512_loadu_si512(p + i + 128), y3 = _mm512_loadu_si512(p + i + 192);
        if (dst) put256(dst + i, y0, y1, y2, y3, nt);
        if (odd) ODD(y0), ODD(y1), ODD(y2), ODD(y3);
        x0 = _mm512_xor_si512(fold64(x0, k256), y0);
        x1 = _mm512_xor_si512(fold64(x1, k256), y1);
        x2 = _mm512_xor_si512(fold64(x2, k256), y2);
        x3 = _mm512_xor_si512(fold64(x3, k256), y3);
    }
    if (dst && nt) _mm_sfence(); /* the streamed stores are ordered before what follows */
    *done = i;
    if (odd) *odd |= bad != 0;
    return reduce256(x0, x1, x2, x3);
#undef ODD
}

/* ---- CRC-32C and XXH3-64 in one pass (ps_crc32c_xxh3) -------------------------------------- */

/* XXH3's accumulation of one 64-byte stripe @p d with the secret at @p key, and its scramble of
 * the accumulators: xxhash.h 0.8's XXH3_accumulate_512 and XXH3_scrambleAcc (the AVX-512 form;
 * every form gives the same value). */
__attribute__((target(CLMUL_TARGET))) static inline __m512i xxh_acc(__m512i acc, __m512i d,
                                                                    const unsigned char *key)
{
    __m512i dk = _mm512_xor_si512(d, _mm512_loadu_si512(key));
    __m512i prod = _mm512_mul_epu32(dk, _mm512_shuffle_epi32(dk, (_MM_PERM_ENUM)0x31));
    __m512i swapped = _mm512_shuffle_epi32(d, (_MM_PERM_ENUM)0x4e); /* the 64-bit halves */
    return _mm512_add_epi64(prod, _mm512_add_epi64(acc, swapped));
}

__attribute__((target(CLMUL_TARGET))) static inline __m512i xxh_scramble(__m512i acc,
                                                                         const unsigned char *key)
{
    const __m512i prime = _mm512_set1_epi32((int)0x9E3779B1u); /* XXH_PRIME32_1 */
    __m512i dk = _mm512_xor_si512(_mm512_xor_si512(acc, _mm512_srli_epi64(acc, 47)),
                                  _mm512_loadu_si512(key));
    __m512i lo = _mm512_mul_epu32(dk, prime);
    __m512i hi = _mm512_mul_epu32(_mm512_shuffle_epi32(dk, (_MM_PERM_ENUM)0x31), prime);
    return _mm512_add_epi64(lo, _mm512_slli_epi64(hi, 32));
}

/* Where an XXH3 stream stands: its accumulators, secret, the secret offset of its scramble
 * (secretLimit) and the stripes taken of the current block (16 of them for the default secret:
 * the scramble follows the last). */
typedef struct {
    uint64_t *acc; /* XXH3_state_t.acc (aligned in the library's layout; not relied on) */
    const unsigned char *secret;
    size_t limit, per_block, *so_far;
} xxh_run_t;

/* One stripe into @p acc, the scramble after a block's last. */
#define XXH_STRIPE(acc, v, x)                                                                   \
    do {                                                                                       \
        (acc) = xxh_acc((acc), (v), (x)->secret + 8 * *(x)->so_far);                            \
        if (++*(x)->so_far == (x)->per_block) {                                                \
            (acc) = xxh_scramble((acc), (x)->secret + (x)->limit);                             \
            *(x)->so_far = 0;                                                                  \
        }                                                                                      \
    } while (0)

/* The @p n stripes at @p p into @p x's stream (no CRC). */
__attribute__((target(CLMUL_TARGET))) static void xxh_stripes(const xxh_run_t *x,
                                                              const unsigned char *p, size_t n)
{
    __m512i acc = _mm512_loadu_si512(x->acc);
    for (size_t k = 0; k < n; k++) XXH_STRIPE(acc, _mm512_loadu_si512(p + 64 * k), x);
    _mm512_storeu_si512(x->acc, acc);
}

/* crc_clmul over the whole 256-byte groups of p[len] (len >= 256) that also feeds each group's
 * four stripes to @p x's XXH3 stream (p at a stripe boundary of it). @return the CRC state (not
 * inverted); *done = the bytes taken. */
__attribute__((target(CLMUL_TARGET))) static uint64_t crc_xxh3_clmul(uint64_t c0,
                                                                     const unsigned char *p,
                                                                     size_t len, size_t *done,
                                                                     const xxh_run_t *x, int *odd)
{
    const __m512i ex = _mm512_set1_epi32(0x7f800000);
    __mmask16 bad = 0;
#define ODD(v) (bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512((v), ex), ex))
    const __m512i k256 = _mm512_broadcast_i32x4(_mm_set_epi64x(0xb9e02b86, 0xdcb17aa4));
    __m512i acc = _mm512_loadu_si512(x->acc);
    __m512i x0 = _mm512_loadu_si512(p), x1 = _mm512_loadu_si512(p + 64);
    __m512i x2 = _mm512_loadu_si512(p + 128), x3 = _mm512_loadu_si512(p + 192);
    ODD(x0), ODD(x1), ODD(x2), ODD(x3);
    XXH_STRIPE(acc, x0, x);
    XXH_STRIPE(acc, x1, x);
    XXH_STRIPE(acc, x2, x);
    XXH_STRIPE(acc, x3, x);
    x0 = _mm512_xor_si512(x0, _mm512_castsi128_si512(_mm_cvtsi32_si128((int)(uint32_t)c0)));
    size_t i = 256;
    for (; i + 256 <= len; i += 256) {
        __m512i y0 = _mm512_loadu_si512(p + i), y1 = _mm512_loadu_si512(p + i + 64);
        __m512i y2 = _mm512_loadu_si512(p + i + 128), y3 = _mm512_loadu_si512(p + i + 192);
        ODD(y0), ODD(y1), ODD(y2), ODD(y3);
        x0 = _mm512_xor_si512(fold64(x0, k256), y0);
        x1 = _mm512_xor_si512(fold64(x1, k256), y1);
        x2 = _mm512_xor_si512(fold64(x2, k256), y2);
        x3 = _mm512_xor_si512(fold64(x3, k256), y3);
        XXH_STRIPE(acc, y0, x);
        XXH_STRIPE(acc, y1, x);
        XXH_STRIPE(acc, y2, x);
        XXH_STRIPE(acc, y3, x);
    }
    _mm512_storeu_si512(x->acc, acc);
    *done = i;
    if (odd) *odd |= bad != 0;
    return reduce256(x0, x1, x2, x3);
#undef ODD
}

/* With @p odd: *odd |= whether a float of buf[len] is a NaN or an infinity. */
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const void *buf,
                                                          size_t len, int *odd)
{
    const unsigned char *p = buf;
    uint64_t c0 = crc ^ 0xffffffffu;
    if (use_clmul && len >= CLMUL_MIN) {
        size_t done;
        c0 = crc_clmul(c0, p, len, &done, NULL, 0, odd);
        p += done;
        len -= done;
    }
    if (odd) *odd |= odd_floats(p, len);
    while (len && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        len--;
    }
    for (; len >= 3 * LONG; p += 3 * LONG, len -= 3 * LONG) c0 = stripe(c0, p, LONG, long_shift);
    for (; len >= 3 * SHORT; p += 3 * SHORT, len -= 3 * SHORT)
        c0 = stripe(c0, p, SHORT, short_shift);
    for (; len >= 8; len -= 8, p += 8) c0 = _mm_crc32_u64(c0, load64(p));
    while (len--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return (uint32_t)c0 ^ 0xffffffffu;
}
#else
#define HAVE_HW 0
/* Never set here (no SSE4.2 nor carry-less multiply off x86-64), but init() and
 * ps_crc32c_use() read them: without them the file did not compile elsewhere (a review,
 * session 71). */
static int use_hw, use_clmul;
static int have_hw, have_clmul;
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        sw_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 1; k < 8; k++)
            sw_table[k][n] = (sw_table[k - 1][n] >> 8) ^ sw_table[0][sw_table[k - 1][n] & 0xff];
#if HAVE_HW
    zeros_table(long_shift, LONG);
    zeros_table(short_shift, SHORT);
    __builtin_cpu_init();
    use_hw = __builtin_cpu_supports("sse4.2");
    use_clmul = use_hw && __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("avx512f") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("vpclmulqdq");
#endif
    have_hw = use_hw;
    have_clmul = use_clmul;
}

int ps_crc32c_use(const char *impl)
{
    pthread_once(&once, init);
    int hw = have_hw, clmul = have_clmul;
    if (impl == NULL || strcmp(impl, "sse4.2+vpclmulqdq") == 0) {
        if (impl && !clmul) return -EINVAL;
    } else if (strcmp(impl, "sse4.2") == 0) {
        if (!hw) return -EINVAL;
        clmul = 0;
    } else if (strcmp(impl, "slicing-by-8") == 0) {
        hw = clmul = 0;
    } else {
        return -EINVAL;
    }
    use_hw = hw;
    use_clmul = clmul;
    return 0;
}

uint32_t ps_crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&once, init);
    const unsigned char *p = buf;
    uint32_t c = crc ^ 0xffffffffu;
    while (len && ((uintptr_t)p & 7)) {
        c = (c >> 8) ^ sw_table[0][(c ^ *p++) & 0xff];
        len--;
    }
    for (; len >= 8; len -= 8, p += 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= c; /* little-endian load: byte 0 is the low byte */
        c = sw_table[7][lo & 0xff] ^ sw_table[6][(lo >> 8) & 0xff] ^
            sw_table[5][(lo >> 16) & 0xff] ^ sw_table[4][lo >> 24] ^ sw_table[3][hi & 0xff] ^
            sw_table[2][(hi >> 8) & 0xff] ^ sw_table[1][(hi >> 16) & 0xff] ^ sw_table[0][hi >> 24];
    }
    while (len--) c = (c >> 8) ^ sw_table[0][(c ^ *p++) & 0xff];
    return c ^ 0xffffffffu;
}

void ps_memcpy_nt(void *dst, const void *src, size_t len)
{
#if HAVE_HW
    unsigned char *d = dst;
    const unsigned char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (len < 256 + head) {
        memcpy(d, s, len);
        return;
    }
    memcpy(d, s, head);
    d += head;
    s += head;
    len -= head;
    size_t i = 0;
    for (; i + 64 <= len; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    _mm_sfence();
    memcpy(d + i, s + i, len - i);
#else
    memcpy(dst, src, len);
#endif
}

/* With @p odd: *odd |= whether a float of src[len] is a NaN or an infinity. */
static uint32_t crc_copy(uint32_t crc, void *dst, const void *src, size_t len, int nt, int *odd)
{
    pthread_once(&once, init);
#if HAVE_HW
    /* Streaming stores need 64-byte aligned destinations: the bytes before the first 64-byte
     * boundary go the plain way. */
    size_t head = nt ? (64 - ((uintptr_t)dst & 63)) & 63 : 0;
    if (odd && (head & 3)) /* the check's 4-byte windows would straddle floats after it */
        head = 0, nt = 0;
    if (head && len >= CLMUL_MIN + head) {
        crc = crc_copy(crc, dst, src, head, 0, odd);
        dst = (unsigned char *)dst + head;
        src = (const unsigned char *)src + head;
        len -= head;
    } else if (head) {
        nt = 0;
    }
    if (use_clmul && len >= CLMUL_MIN) {
        size_t done;
        uint32_t c =
            (uint32_t)crc_clmul(crc ^ 0xffffffffu, src, len, &done, dst, nt, odd) ^ 0xffffffffu;
        memcpy((unsigned char *)dst + done, (const unsigned char *)src + done, len - done);
        return ps_crc32c_floats(c, (const unsigned char *)dst + done, len - done, odd);
    }
    if (nt) {
        /* No folding copy on this CPU: per 64 KiB block, the CRC of the source, then the
         * block streamed from cache (one pass over the source in memory, not two). */
        const unsigned char *s = src;
        unsigned char *d = dst;
        for (size_t off = 0, b; off < len; off += b) {
            b = len - off < 65536 ? len - off : 65536;
            crc = ps_crc32c_floats(crc, s + off, b, odd);
            ps_memcpy_nt(d + off, s + off, b);
        }
        return crc;
    }
#endif
    memcpy(dst, src, len);
    return ps_crc32c_floats(crc, dst, len, odd);
}

uint32_t ps_crc32c_copy(uint32_t crc, void *dst, const void *src, size_t len)
{
    return crc_copy(crc, dst, src, len, 0, NULL);
}

uint32_t ps_crc32c_copy_nt(uint32_t crc, void *dst, const void *src, size_t len)
{
    return crc_copy(crc, dst, src, len, 1, NULL);
}

uint32_t ps_crc32c_copy_nt_floats(uint32_t crc, void *dst, const void *src, size_t len, int *odd)
{
    return crc_copy(crc, dst, src, len, 1, odd);
}

/* Below this many bytes ps_crc32c_xxh3 makes the two calls: the stream's carried bytes and the
 * ends are taken apart from the folding loop. */
#define XXH3_FUSE_MIN (CLMUL_MIN + 512)

uint32_t ps_crc32c_xxh3(uint32_t crc, struct XXH3_state_s *st, const void *buf, size_t len,
                        int *odd)
{
    pthread_once(&once, init);
    const unsigned char *s = buf;
#if HAVE_HW
    /* XXH3's streaming update (xxhash.h 0.8, XXH3_update) keeps the bytes it has not taken as
     * stripes in its 256-byte buffer, and takes a stripe only when a byte follows it; when it
     * keeps fewer than a stripe, the 64 bytes before them sit at the buffer's end (the digest's
     * last stripe). Here: the buffered bytes and the head of buf that completes their last
     * stripe (f bytes) go as whole stripes, the middle in the folding loop, and the last r bytes
     * (1 to 64) are kept as the update would, so the library's next update and digest carry on
     * with the same value. Floats need 4-byte pieces: a buffered count that is not a multiple
     * of 4 (never in psd) takes the two calls. */
    size_t b = st->bufferedSize;
    if (use_clmul && len >= XXH3_FUSE_MIN && !(len & 3) && !(b & 3) && b <= sizeof st->buffer) {
        xxh_run_t x = {.acc = st->acc,
                       .secret = st->extSecret ? st->extSecret : st->customSecret,
                       .limit = st->secretLimit,
                       .per_block = st->nbStripesPerBlock,
                       .so_far = &st->nbStripesSoFar};
        size_t f = (64 - b % 64) % 64, r = (len - f) % 64 ? (len - f) % 64 : 64;
        size_t mid = len - f - r; /* whole stripes, >= 1024 */
        crc = ps_crc32c_floats(crc, s, f, odd);
        if (b + f) {
            unsigned char head[sizeof st->buffer + 64];
            memcpy(head, st->buffer, b);
            memcpy(head + b, s, f);
            xxh_stripes(&x, head, (b + f) / 64);
        }
        size_t done;
        uint32_t c =
            (uint32_t)crc_xxh3_clmul(crc ^ 0xffffffffu, s + f, mid, &done, &x, odd) ^ 0xffffffffu;
        xxh_stripes(&x, s + f + done, (mid - done) / 64);
        crc = ps_crc32c_floats(c, s + f + done, len - f - done, odd);
        memcpy(st->buffer, s + len - r, r);
        memcpy(st->buffer + sizeof st->buffer - 64, s + len - r - 64, 64);
        st->bufferedSize = (XXH32_hash_t)r;
        st->totalLen += len;
        return crc;
    }
#endif
    crc = ps_crc32c_floats(crc, s, len, odd);
    XXH3_UPDATE(st, s, len);
    return crc;
}

uint32_t ps_crc32c_floats(uint32_t crc, const void *buf, size_t len, int *odd)
{
    pthread_once(&once, init);
#if HAVE_HW
    if (use_hw) return crc_hw(crc, buf, len, odd);
#endif
    if (odd) *odd |= odd_floats(buf, len);
    return ps_crc32c_sw(crc, buf, len);
}

uint32_t ps_crc32c(uint32_t crc, const void *buf, size_t len)
{
    return ps_crc32c_floats(crc, buf, len, NULL);
}

const char *ps_crc32c_impl(void)
{
    pthread_once(&once, init);
#if HAVE_HW
    if (use_clmul) return "sse4.2+vpclmulqdq";
    if (use_hw) return "sse4.2";
#endif
    return "slicing-by-8";
}
