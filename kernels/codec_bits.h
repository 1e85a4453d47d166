/* codec_bits.h: the scalar conversions the codecs are built on (fp32 <-> fp16 / bf16, the bits
 * of a float, the per-element hash of stochastic rounding), shared by the CPU reference
 * (codec.c) and its CUDA twin (codec.cu), so that both compute them with the same code.
 * Plain operators only: nvcc builds codec.cu with -fmad=false and codec.c is built with
 * -ffp-contract=off, so no product is contracted into an FMA on either side. */
#ifndef PSK_CODEC_BITS_H
#define PSK_CODEC_BITS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define PSK_HD __host__ __device__
#else
#define PSK_HD
#endif

PSK_HD static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

PSK_HD static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- fp16 and bf16 ---- */

/*
 * fp32 -> fp16, round to nearest even, branch-free (the method of Marat Dukhan's FP16
 * library). For |f| with exponent e (at least -14, the smallest fp16 exponent), adding
 * 2^(e + 15) to 4|f| makes the FPU round 4|f| to a multiple of 2^(e - 8), i.e. |f| to a
 * multiple of fp16's spacing 2^(e - 10), with ties to even. The sum's exponent field,
 * taken mod 32, plus its top mantissa bit (fp16's implicit 1, carried into the exponent by
 * the addition below) is then the fp16 exponent, and its low mantissa bits are fp16's
 * mantissa; a rounding carry moves into the exponent by itself. Multiplying by 2^112 and
 * then 2^-110 (= 4) sends |f| >= 2^16 to infinity, and 65520 <= |f| < 2^16 rounds up to
 * 2^16, whose fp16 exponent field is 31: both give fp16 infinity. NaN becomes the quiet NaN
 * 0x7e00 with the sign kept.
 */
PSK_HD static inline uint16_t f16_from_f32(float f)
{
    uint32_t w = f32_bits(f);
    uint32_t shl1 = w + w; /* exponent and mantissa, sign shifted out */
    uint32_t sign = w & 0x80000000u;
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    uint32_t bias = shl1 & 0xff000000u;
    bias = bias < 0x71000000u ? 0x71000000u : bias; /* fp16 subnormals: exponent -14 */
    base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
    uint32_t bits = f32_bits(base);
    uint32_t nonsign = ((bits >> 13) & 0x7c00u) + (bits & 0x0fffu);
    uint32_t nan = 0u - (uint32_t)(shl1 > 0xff000000u); /* all ones for NaN */
    return (uint16_t)((sign >> 16) | (0x7e00u & nan) | (nonsign & ~nan));
}

/*
 * fp16 -> fp32, exact. Normal values and inf/NaN: move exponent and mantissa into fp32's
 * fields, add 224 to the exponent (so 31 becomes 255: inf and NaN stay so) and scale by
 * 2^-112 to correct the finite ones (224 - 112 = 127 - 15). Subnormals: put the 10-bit
 * mantissa m under 0.5's exponent, giving 0.5 + m * 2^-24, and subtract 0.5.
 */
PSK_HD static inline float f32_from_f16(uint16_t h)
{
    uint32_t w = (uint32_t)h << 16;
    uint32_t sign = w & 0x80000000u;
    uint32_t two_w = w + w;
    float normal = f32_from_bits((two_w >> 4) + (0xe0u << 23)) * 0x1.0p-112f;
    float subnormal = f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
    uint32_t sub = 0u - (uint32_t)(two_w < (1u << 27)); /* all ones for subnormals */
    return f32_from_bits(sign | (f32_bits(subnormal) & sub) | (f32_bits(normal) & ~sub));
}

/*
 * fp32 -> bf16, round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
 * A carry out of the mantissa rounds into the exponent, so values near FLT_MAX correctly
 * become infinity; inf stays inf. NaN is kept as a quiet NaN (it could otherwise round to
 * inf), with the sign and the top payload bits.
 */
PSK_HD static inline uint16_t bf16_from_f32(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

PSK_HD static inline float f32_from_bf16(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

/*
 * Error feedback's half encodings (fp16 and bf16 payload values): h is @p f's encoding; a
 * finite f beyond the format's range (its encoding an infinity) becomes the largest finite
 * value of its sign instead (fp16 65504, bf16 0x1.fep+127), so the payload stays one psd
 * applies and the residual keeps the excess, f - that value. NaN and infinity stay as they are.
 */
PSK_HD static inline uint16_t f16_saturate(uint16_t h, float f)
{
    bool over = (h & 0x7fffu) == 0x7c00u && (f32_bits(f) & 0x7fffffffu) < 0x7f800000u;
    return over ? (uint16_t)((h & 0x8000u) | 0x7bffu) : h;
}

PSK_HD static inline uint16_t bf16_saturate(uint16_t h, float f)
{
    bool over = (h & 0x7fffu) == 0x7f80u && (f32_bits(f) & 0x7fffffffu) < 0x7f800000u;
    return over ? (uint16_t)((h & 0x8000u) | 0x7f7fu) : h;
}

/*
 * Chris Wellons' lowbias32: a 32-bit bijection with good avalanche. It is used per element
 * for stochastic rounding because 32-bit multiplies vectorize where 64-bit ones do not.
 */
PSK_HD static inline uint32_t hash32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

#endif
