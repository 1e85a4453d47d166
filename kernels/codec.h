/* codec.h: gradient compression for fp32 chunks (one C signature per operation, CPU
 * reference in codec.c): a worker encodes its gradient chunk into a payload, the shard
 * decodes it and adds it to the chunk's gradient sum.
 *
 * Payload format, little-endian, no alignment required. A 16-byte header:
 *   u8  kind     psk_codec_kind_t
 *   u8  flags    bit 0: values are fp16 (topk, randomk only); other bits 0
 *   u16 zero
 *   u32 n        values in the chunk
 *   u32 param    topk, randomk: k (psk_codec_k); int8, sign: block; otherwise 0
 *   u32 zero
 * then the body (nb = ceil(n / block) blocks, vs = 2 with fp16 values, else 4):
 *   none     f32 x[n]
 *   fp16     f16 x[n]                  round to nearest even; NaN stays NaN, |x| >= 65520 -> inf
 *                                      (with error feedback: -> +-65504, the rest kept)
 *   bf16     bf16 x[n]                 round to nearest even; NaN stays NaN (with error
 *                                      feedback a finite x beyond bf16's range -> its largest)
 *   int8     f32 scale[nb], i8 q[n]    scale = absmax(block) / 127 (rounded so that 127 *
 *                                      scale stays finite), x ~ q * scale, |q| <= 127
 *   topk     u32 index[k], value[k]    the k largest |x| (values vs bytes each), indices
 *                                      strictly increasing
 *   randomk  u64 seed, value[k]        indices from psk_codec_randomk_indices(seed, n, k);
 *                                      decode takes the seed from here, not from its codec;
 *                                      value[0] is a NaN when any x is a NaN or an infinity
 *   sign     f32 scale[nb], u8 bits[ceil(n / 8)]
 *                                      scale = mean |x| of the block; bit i (byte i / 8,
 *                                      bit i % 8) is x's sign bit; x ~ bit ? -scale : scale;
 *                                      unused bits of the last byte are 0
 * The payload size follows from (codec, n) alone; psk_codec_max_bytes gives it. */
#ifndef PSK_CODEC_H
#define PSK_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    PSK_CODEC_NONE = 0,
    PSK_CODEC_FP16 = 1,
    PSK_CODEC_BF16 = 2,
    PSK_CODEC_INT8 = 3,
    PSK_CODEC_TOPK = 4,
    PSK_CODEC_RANDOMK = 5,
    PSK_CODEC_SIGN = 6
} psk_codec_kind_t;

#define PSK_CODEC_HEADER_BYTES 16
#define PSK_CODEC_BLOCK_DEFAULT 256

/*
 * Both sides of a transfer use the same psk_codec_t (the codec is part of the tensor's
 * declaration); decode rejects a payload whose header disagrees with it.
 */
typedef struct {
    psk_codec_kind_t kind;
    float fraction;     /* topk, randomk: share of values sent, in (0, 1] */
    uint32_t block;     /* int8, sign: values per scale, >= 1 */
    int fp16_values;    /* topk, randomk: send the values as fp16 (half the value bytes) */
    int stochastic;     /* int8: stochastic rounding (unbiased) instead of nearest */
    uint64_t seed;      /* randomk indices, int8 stochastic rounding: vary it per step and
                           per chunk (e.g. hash of step, tensor, chunk); encode only */
} psk_codec_t;

/**
 * @brief Parse a codec name: "none", "fp16", "bf16", "int8", "sign", "topk:F", "randomk:F"
 * with F a decimal fraction in (0, 1] ("topk:0.01").
 * @param[out] c filled on success: block PSK_CODEC_BLOCK_DEFAULT, fp16_values, stochastic and
 *               seed 0 (set them afterwards); untouched on failure.
 * @return 0, or PS_EINVAL for anything else (unknown name, F missing, <= 0, > 1, not a
 *         number, trailing characters).
 * @note F goes through strtod, so it needs the "C" numeric locale (the default).
 */
int psk_codec_parse(psk_codec_t *c, const char *text);

/**
 * @brief Values a sparse codec sends for a chunk of n: k = ceil(fraction * n), at least 1 and
 * at most n (0 when n is 0); a product within float rounding (2^-23 relative) of an integer
 * counts as that integer, so topk:0.1 of 1000 values is 100, not 101.
 * @return k for topk and randomk, n for the other codecs, 0 if @p c is invalid.
 */
size_t psk_codec_k(const psk_codec_t *c, size_t n);

/**
 * @brief Payload bytes for a chunk of n values (exact for every codec here: encode writes
 * this many, decode accepts only this many).
 * @return the size, or 0 if @p c is invalid or n > UINT32_MAX.
 */
size_t psk_codec_max_bytes(const psk_codec_t *c, size_t n);

/**
 * @brief Scratch bytes psk_codec_encode_cpu and psk_codec_encode_ef_cpu need for n values:
 * topk 4 * n + 32772 (histograms and candidate list), 0 for the other codecs. The scratch
 * must be 4-byte aligned.
 */
size_t psk_codec_scratch_bytes(const psk_codec_t *c, size_t n);

/**
 * @brief Encode in[n] into out.
 * @param[out] out     [cap] payload
 * @param[out] len     bytes written (psk_codec_max_bytes), set on success only
 * @param[in]  in      [n] values
 * @param[in]  scratch [psk_codec_scratch_bytes] bytes, NULL when that is 0
 * @return 0; PS_EINVAL if @p c is invalid, n > UINT32_MAX, cap is too small, scratch is
 *         missing, or (int8, sign) a block holds a NaN or an infinity (its scale would not
 *         be finite). On error out may be partly written.
 * @note topk selects the k largest |x| by a radix select on the magnitude bits (three
 *       histogram levels, O(n), no sort); NaN counts as the largest magnitude, and ties go to
 *       the lower index; randomk marks a payload whose x holds a NaN or an infinity (its
 *       first value a NaN: a reader leaves the push out). Encoding is deterministic: same
 *       input and codec, same bytes.
 */
int psk_codec_encode_cpu(uint8_t *out, size_t cap, size_t *len, const float *in, size_t n,
                         const psk_codec_t *c, void *scratch);

/**
 * @brief Decode a payload and accumulate it: out[i] += weight * decode(payload)[i].
 * topk and randomk add only their k values (no dense temporary).
 * @param[in,out] out [n] accumulator
 * @return 0; PS_EINVAL if @p c is invalid; PS_EPROTO if the payload is malformed: header
 *         disagrees with (c, n), len differs from psk_codec_max_bytes, topk indices out of
 *         range or not strictly increasing, an int8 or sign scale negative or not finite, an
 *         int8 q of -128, or sign padding bits set. The payload is checked in full before
 *         anything is written: on error out is unchanged.
 * @note Values themselves (none, fp16, bf16, topk, randomk) may be NaN or infinite; they are
 *       added as they are, like an uncompressed gradient.
 */
int psk_codec_decode_add_cpu(float *out, size_t n, const uint8_t *payload, size_t len,
                             const psk_codec_t *c, float weight);

/**
 * @brief Validate a payload without decoding it (the same checks as psk_codec_decode_add_cpu).
 * @return 0, PS_EINVAL if @p c is invalid, PS_EPROTO if the payload is malformed.
 */
int psk_codec_check(const uint8_t *payload, size_t len, size_t n, const psk_codec_t *c);

/**
 * @brief psk_codec_check, saying what is wrong: on a non-zero return @p why (@p whylen bytes,
 *  the caller's; NULL: not said) names the first fault found (the length, a header byte, an
 *  int8 or sign scale out of range, an int8 value of -128, sign padding bits, a top-k index
 *  that does not rise or lies past the chunk).
 */
int psk_codec_check_why(const uint8_t *payload, size_t len, size_t n, const psk_codec_t *c,
                        char *why, size_t whylen);

/**
 * @brief Encode with error feedback: x = g + residual; encode x into out;
 * residual = x - decode(x). The residual starts at zeros and carries, per chunk, what
 * earlier steps did not send, so the sum of everything sent plus the residual equals the sum
 * of the gradients (up to float rounding).
 * @param[in]     g        [n] this step's gradient
 * @param[in,out] residual [n] error-feedback state; must not overlap g
 * @return as psk_codec_encode_cpu. Argument errors, and a NaN or infinity in @p g for int8 and
 *         sign (PS_EINVAL: they cannot encode one), leave residual unchanged. fp16, bf16,
 *         top-k and random-k send such a value on (psd leaves that push out) and keep the
 *         residual finite: where x is a NaN or an infinity (g held one, or g + residual
 *         overflowed float) the residual becomes 0, so one bad gradient does not make every
 *         later push of the chunk one psd leaves out. A finite x beyond fp16's or bf16's
 *         range (fp16 and bf16 payloads, top-k's and random-k's fp16 values) is sent as the
 *         format's largest value of its sign and the residual keeps x minus that (not an
 *         infinity: the push stays one psd applies, nothing is lost). For int8 and sign a
 *         value where g + residual overflows float becomes 0 (lost, like the non-finite x of
 *         the others) and the rest of the chunk is encoded (the CUDA twin alike).
 * @note residual holds x during the encode, so no n-sized temporary is needed.
 */
/** @brief Whether @p x[n] holds no NaN and no infinity (one read pass, vectorized). */
bool psk_all_finite(const float *x, size_t n);

/** @brief Whether codec @p c refuses non-finite values (int8 and sign: their scales). */
bool psk_codec_needs_finite(const psk_codec_t *c);

int psk_codec_encode_ef_cpu(uint8_t *out, size_t cap, size_t *len, const float *g,
                            float *residual, size_t n, const psk_codec_t *c, void *scratch);

/**
 * @brief Take back an encode with error feedback whose payload was not applied (a shard
 * acknowledged the push as not summed): residual += decode(payload) - g, the residual that
 * encode started from (up to float rounding: (r + g) - g); where that encode had kept x whole
 * (top-k / random-k whose payload holds a NaN or an infinity), residual -= g. A value that
 * comes out a NaN or an infinity becomes 0 (as the encode keeps it). For int8 and sign, a
 * value whose g + residual overflowed float was zeroed by the encode and comes back as -g.
 * @param[in]     g        [n] the gradient that encode took, unchanged since
 * @param[in,out] residual [n] as that encode left it
 * @param[in]     payload  that encode's payload (len bytes)
 * @return 0; PS_EINVAL / PS_EPROTO as psk_codec_check (residual unchanged).
 */
int psk_codec_ef_put_back_cpu(float *residual, const float *g, size_t n, const uint8_t *payload,
                              size_t len, const psk_codec_t *c);

/**
 * @brief The randomk index set: idx[k], strictly increasing, in [0, n), a function of
 * (seed, n, k) only. Stratified: [0, n) is cut into k nearly equal strata
 * [j * n / k, (j + 1) * n / k) and index j is uniform in stratum j, by a counter-based hash
 * of (seed, j). Each element is sent with probability about k / n, but two elements of one
 * stratum never travel together (not a uniform k-subset). Requires k <= n <= UINT32_MAX.
 */
void psk_codec_randomk_indices(uint32_t *idx, uint64_t seed, size_t n, size_t k);

/** @brief The 16-byte header encode writes for (@p c, @p n) (and decode expects); @p c valid. */
void psk_codec_header(uint8_t h[PSK_CODEC_HEADER_BYTES], const psk_codec_t *c, size_t n);

/*
 * CUDA twins (codec.cu) of encode, encode with error feedback and decode-add, for the dense
 * codecs none, fp16, bf16, int8 (nearest and stochastic) and sign: device pointers, work queued
 * on @p stream (a cudaStream_t), the same payload bytes as the CPU reference, bit for bit
 * (nvcc builds codec.cu without FMA contraction, as the CPU side is built), but for a NaN's
 * sign and payload: the device's arithmetic gives its one canonical NaN (0x7fffffff) where x86
 * keeps the input's (a NaN is a NaN to every reader: psd leaves such a push out either way).
 * The decode-add twin checks nothing: give it payloads psk_codec_check passed.
 *
 * Encode returns once the work is queued: 0 with *len = psk_codec_max_bytes(c, n); PS_EINVAL
 * (codec invalid, n > UINT32_MAX, cap too small), PS_ENOTSUP (topk, randomk: encode those on the
 * host; or a build without CUDA), PS_EIO (a launch failed). A NaN or infinity where the codec
 * cannot take one (int8, sign) is found on the device: the payload's kind byte becomes 0xff, so
 * psk_codec_check (on the host copy, after the stream completes) refuses it, and with error
 * feedback the residual is left as it was, as on the CPU.
 * decode_add_cuda: out[n] += weight * decode(payload) on the device; the payload must have
 * passed psk_codec_check (the device does not check it); PS_EINVAL for len !=
 * psk_codec_max_bytes, PS_ENOTSUP for the sparse codecs.
 */
int psk_codec_encode_cuda(uint8_t *out, size_t cap, size_t *len, const float *in, size_t n,
                          const psk_codec_t *c, void *stream);
int psk_codec_encode_ef_cuda(uint8_t *out, size_t cap, size_t *len, const float *g,
                             float *residual, size_t n, const psk_codec_t *c, void *stream);
int psk_codec_decode_add_cuda(float *out, size_t n, const uint8_t *payload, size_t len,
                              const psk_codec_t *c, float weight, void *stream);

/** @brief Whether codec @p kind sends every value on its own, rounded at most (none, fp16,
 *  bf16): what parameters travel as (pulls), and what a mean tensor's values may. */
static inline bool psk_codec_elementwise(uint32_t kind)
{
    return kind == PSK_CODEC_NONE || kind == PSK_CODEC_FP16 || kind == PSK_CODEC_BF16;
}

/** @brief A tensor's key for psk_codec_push_seed: its name hashed (FNV-1a), the same in every
 *  worker of a cluster and in `psworker --local`'s reference run (a shard's tensor id depends on
 *  what its store held before: seeded by it, the two differed then; session 60). */
static inline uint32_t psk_codec_tensor_key(const char *name)
{
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h;
}

/** @brief The per-push seed workers use for randomk indices and int8 stochastic rounding:
 *  different for every (step, tensor, chunk), the same in every process; @p tensor is the
 *  tensor's psk_codec_tensor_key. */
static inline uint64_t psk_codec_push_seed(uint64_t step, uint32_t tensor, uint32_t chunk)
{
    return (step + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)tensor << 32 | chunk); /* golden gamma */
}

#endif
