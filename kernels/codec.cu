/* codec.cu: the CUDA twin of codec.c's dense codecs (none, fp16, bf16, int8, sign): encode,
 * encode with error feedback, decode-add. The conversions are codec.c's own (codec_bits.h,
 * compiled for both sides), and the arithmetic is the same operations in the same order (nvcc
 * -fmad=false, as the CPU side is built with -ffp-contract=off), so the payloads are the CPU's
 * byte for byte.
 *
 * Non-finite input (int8, sign): the header's last word (zero in the format) serves as a flag
 * on the device: nonfinite_k sets it, every later kernel of the call does nothing when it is
 * set, and seal_k turns it into an invalid kind byte (0xff) and clears it. */
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <string.h>

extern "C" {
#include "codec.h"
#include "hash.h"
#include "ps/ps_error.h"
}
#include "codec_bits.h" /* codec.c's own conversions, __host__ __device__ here */

static const int threads = 256;

/* The per-element arithmetic is __host__ __device__: the kernels run it on the device, and
 * psk_codec_encode_cuda_host (for tests) runs the same functions on the host in the kernels'
 * order, so that their results can be compared with codec.c's where no GPU is. On the device
 * the operations are the round-to-nearest intrinsics (no contraction into FMA whatever the
 * flags); on the host, plain operators (x86-64's baseline has no FMA to contract into). */
#ifdef __CUDA_ARCH__
#define FMUL(a, b) __fmul_rn((a), (b))
#define FADD(a, b) __fadd_rn((a), (b))
#define FSUB(a, b) __fsub_rn((a), (b))
#define FDIV(a, b) __fdiv_rn((a), (b))
#define DADD(a, b) __dadd_rn((a), (b))
#define DDIV(a, b) __ddiv_rn((a), (b))
#else
#define FMUL(a, b) ((float)(a) * (float)(b))
#define FADD(a, b) ((float)(a) + (float)(b))
#define FSUB(a, b) ((float)(a) - (float)(b))
#define FDIV(a, b) ((float)(a) / (float)(b))
#define DADD(a, b) ((double)(a) + (double)(b))
#define DDIV(a, b) ((double)(a) / (double)(b))
#endif

static unsigned blocks_for(size_t n)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

/* Little-endian stores and loads at any alignment (the payload is a byte stream). */
PSK_HD static inline void st16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

PSK_HD static inline uint16_t ld16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

PSK_HD static inline void st32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

PSK_HD static inline uint32_t ld32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The flag in the header's last word (see the top of the file). */
PSK_HD static inline bool flagged(const uint8_t *out)
{
    return ld32(out + 12) != 0;
}

#define FOR_EACH(i, n)                                                                      \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                 \
         i += (size_t)gridDim.x * blockDim.x)

/* ---- the per-element steps (host and device) ---- */

PSK_HD static inline bool nonfinite(float x)
{
    return (f32_bits(x) & 0x7fffffffu) >= 0x7f800000u;
}

/* none, fp16, bf16 (kind), value i; with r: x = g + r, x's encoding saturated (a finite x out
 * of the half format's range goes out as its largest value), r = x + (-1 * decode(x)), or 0
 * where that is a NaN or an infinity (codec.c keeps the residual finite the same way: the
 * value is sent on, and psd leaves that push out). */
PSK_HD static inline void dense_one(uint8_t *body, const float *g, float *r, size_t i, int kind)
{
    float x = r != NULL ? FADD(r[i], g[i]) : g[i];
    float d;
    if (kind == PSK_CODEC_FP16) {
        uint16_t h = f16_from_f32(x);
        if (r != NULL)
            h = f16_saturate(h, x);
        st16(body + 2 * i, h);
        d = f32_from_f16(h);
    } else if (kind == PSK_CODEC_BF16) {
        uint16_t h = bf16_from_f32(x);
        if (r != NULL)
            h = bf16_saturate(h, x);
        st16(body + 2 * i, h);
        d = f32_from_bf16(h);
    } else {
        st32(body + 4 * i, f32_bits(x));
        d = x;
    }
    if (r != NULL) {
        float e = FADD(x, FMUL(-1.0f, d));
        r[i] = nonfinite(e) ? 0.0f : e;
    }
}

/* int8, sign with error feedback: x = r + g (g finite), or 0 where that overflowed float, as
 * codec.c keeps it (the value is lost, the rest of the chunk goes out). */
PSK_HD static inline float ef_x(float r, float g)
{
    float x = FADD(r, g);
    return nonfinite(x) ? 0.0f : x;
}

/* int8: a block's scale from its largest magnitude m (finite), as codec.c's encode_int8. */
PSK_HD static inline float int8_scale(float m)
{
    float scale = FDIV(m, 127.0f);
    if (scale < FLT_MIN && (double)scale * 127.0 < (double)m)
        scale = nextafterf(scale, INFINITY);
    else if ((double)scale * 127.0 > (double)FLT_MAX)
        scale = nextafterf(scale, 0.0f);
    return scale;
}

/* int8: value x at element index idx of a block with largest magnitude m and scale. */
PSK_HD static inline int8_t int8_q(float x, float m, float scale, int stochastic, uint32_t key,
                               uint32_t idx)
{
    int32_t v;
    if (m >= 0x1.0p-100f) {
        float inv = FDIV(127.0f, m);
        if (stochastic) {
            float u = FMUL((float)(hash32(idx ^ key) >> 8), 0x1.0p-24f);
            v = (int32_t)FADD(FADD(FMUL(x, inv), u), 128.0f) - 128;
        } else {
            v = (int32_t)FSUB(FADD(FMUL(x, inv), 0x1.8p23f), 0x1.8p23f);
        }
    } else { /* a tiny block: in double against the scale sent */
        double d = scale > 0.0f ? nearbyint((double)x / (double)scale) : 0.0;
        v = (int32_t)(d > 127.0 ? 127.0 : d < -127.0 ? -127.0 : d);
    }
    v = v > 127 ? 127 : v < -127 ? -127 : v;
    return (int8_t)v;
}

/* sign: a block's scale, mean |x| summed in double over 8 lanes in codec.c's order (value i
 * into lane i % 8). */
PSK_HD static inline float sign_scale(const float *x, size_t len)
{
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t i = 0; i < len; i++)
        acc[i % 8] = DADD(acc[i % 8], fabs((double)x[i]));
    double sum = DADD(DADD(DADD(acc[0], acc[1]), DADD(acc[2], acc[3])),
                      DADD(DADD(acc[4], acc[5]), DADD(acc[6], acc[7])));
    return (float)DDIV(sum, (double)len);
}

/* sign: byte j of the sign bits (value i: bit i % 8 of byte i / 8). */
PSK_HD static inline uint8_t sign_byte(const float *x, size_t n, size_t j)
{
    uint32_t v = 0;
    for (uint32_t l = 0; l < 8 && 8 * j + l < n; l++)
        v |= (f32_bits(x[8 * j + l]) >> 31) << l;
    return (uint8_t)v;
}

/* out[i] += w * value i of a checked payload's body. */
PSK_HD static inline void decode_one(float *o, const uint8_t *body, size_t i, size_t nb, int kind,
                                 uint32_t block, float w)
{
    float v;
    switch (kind) {
    case PSK_CODEC_FP16:
        v = FMUL(w, f32_from_f16(ld16(body + 2 * i)));
        break;
    case PSK_CODEC_BF16:
        v = FMUL(w, f32_from_bf16(ld16(body + 2 * i)));
        break;
    case PSK_CODEC_INT8: {
        float sw = FMUL(w, f32_from_bits(ld32(body + 4 * (i / block))));
        v = FMUL(sw, (float)(int8_t)body[4 * nb + i]);
        break;
    }
    case PSK_CODEC_SIGN: {
        uint32_t sw = f32_bits(FMUL(w, f32_from_bits(ld32(body + 4 * (i / block)))));
        uint32_t bit = (uint32_t)(body[4 * nb + i / 8] >> (i % 8)) & 1u;
        v = f32_from_bits(sw ^ (bit << 31));
        break;
    }
    default:
        v = FMUL(w, f32_from_bits(ld32(body + 4 * i)));
    }
    o[i] = FADD(o[i], v);
}

/* ---- kernels ---- */

#define FOR_EACH(i, n)                                                                      \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                 \
         i += (size_t)gridDim.x * blockDim.x)

struct header {
    uint8_t b[PSK_CODEC_HEADER_BYTES];
};

__global__ static void header_k(uint8_t *out, header h)
{
    if (threadIdx.x < PSK_CODEC_HEADER_BYTES)
        out[threadIdx.x] = h.b[threadIdx.x];
}

__global__ static void nonfinite_k(uint8_t *out, const float *x, size_t n)
{
    bool bad = false;
    FOR_EACH(i, n)
    bad |= nonfinite(x[i]);
    if (bad)
        out[12] = 1; /* any nonzero value flags it; racing writers write the same */
}

__global__ static void seal_k(uint8_t *out)
{
    if (flagged(out))
        out[0] = 0xff;
    st32(out + 12, 0);
}

__global__ static void dense_k(uint8_t *out, const float *g, float *r, size_t n, int kind)
{
    FOR_EACH(i, n)
    dense_one(out + PSK_CODEC_HEADER_BYTES, g, r, i, kind);
}

/* x = g + r into r (ef_x), unless flagged (int8 and sign take x from r afterwards). */
__global__ static void add_k(const uint8_t *out, const float *g, float *r, size_t n)
{
    if (flagged(out))
        return;
    FOR_EACH(i, n)
    r[i] = ef_x(r[i], g[i]);
}

/* int8: one thread block per codec block. x is the input (r after add_k with error feedback);
 * with ef, r = x + ((-1 * scale) * q) after. */
__global__ static void int8_k(uint8_t *out, const float *x, float *r, size_t n, uint32_t block,
                              int stochastic, uint32_t key)
{
    if (flagged(out))
        return;
    __shared__ uint32_t red[threads];
    size_t b = blockIdx.x, s = b * block, nb = (n + block - 1) / block;
    size_t len = n - s < block ? n - s : block;
    uint8_t *scales = out + PSK_CODEC_HEADER_BYTES, *q = scales + 4 * nb;
    uint32_t mk = 0;
    for (size_t i = threadIdx.x; i < len; i += blockDim.x) {
        uint32_t k = f32_bits(x[s + i]) & 0x7fffffffu;
        mk = k > mk ? k : mk;
    }
    red[threadIdx.x] = mk;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
        if (threadIdx.x < w && red[threadIdx.x + w] > red[threadIdx.x])
            red[threadIdx.x] = red[threadIdx.x + w];
        __syncthreads();
    }
    float m = f32_from_bits(red[0]); /* finite: nonfinite_k ran before */
    float scale = int8_scale(m), sw = FMUL(-1.0f, scale);
    if (threadIdx.x == 0)
        st32(scales + 4 * b, f32_bits(scale));
    for (size_t i = threadIdx.x; i < len; i += blockDim.x) {
        int8_t v = int8_q(x[s + i], m, scale, stochastic, key, (uint32_t)(s + i));
        q[s + i] = (uint8_t)v;
        if (r != NULL)
            r[s + i] = FADD(r[s + i], FMUL(sw, (float)v));
    }
}

/* sign, 1: each codec block's scale, one thread per codec block. */
__global__ static void sign_scale_k(uint8_t *out, const float *x, size_t n, uint32_t block)
{
    if (flagged(out))
        return;
    size_t nb = (n + block - 1) / block;
    FOR_EACH(b, nb) {
        size_t s = b * block, len = n - s < block ? n - s : block;
        st32(out + PSK_CODEC_HEADER_BYTES + 4 * b, f32_bits(sign_scale(x + s, len)));
    }
}

/* sign, 2: one thread per byte of sign bits. */
__global__ static void sign_bits_k(uint8_t *out, const float *x, size_t n, uint32_t block)
{
    if (flagged(out))
        return;
    size_t nb = (n + block - 1) / block, nbytes = (n + 7) / 8;
    uint8_t *bits = out + PSK_CODEC_HEADER_BYTES + 4 * nb;
    FOR_EACH(j, nbytes)
    bits[j] = sign_byte(x, n, j);
}

/* sign, 3 (error feedback): r[i] += -scale with x's sign, as decode_add(-1) of the payload. */
__global__ static void sign_ef_k(const uint8_t *out, float *r, size_t n, uint32_t block)
{
    if (flagged(out))
        return;
    size_t nb = (n + block - 1) / block;
    FOR_EACH(i, n)
    decode_one(r, out + PSK_CODEC_HEADER_BYTES, i, nb, PSK_CODEC_SIGN, block, -1.0f);
}

/* decode-add of a checked payload. */
__global__ static void decode_add_k(float *o, const uint8_t *payload, size_t n, int kind,
                                    uint32_t block, float w)
{
    size_t nb = kind == PSK_CODEC_INT8 || kind == PSK_CODEC_SIGN ? (n + block - 1) / block : 0;
    FOR_EACH(i, n)
    decode_one(o, payload + PSK_CODEC_HEADER_BYTES, i, nb, kind, block, w);
}

/* ---- launchers ---- */

static bool dense_kind(psk_codec_kind_t k)
{
    return k == PSK_CODEC_NONE || k == PSK_CODEC_FP16 || k == PSK_CODEC_BF16 ||
           k == PSK_CODEC_INT8 || k == PSK_CODEC_SIGN;
}

static int encode(uint8_t *out, size_t cap, size_t *len, const float *g, float *r, size_t n,
                  const psk_codec_t *c, cudaStream_t st)
{
    size_t bytes = psk_codec_max_bytes(c, n);
    if (bytes == 0 || cap < bytes)
        return PS_EINVAL;
    if (!dense_kind(c->kind))
        return PS_ENOTSUP;
    header h;
    psk_codec_header(h.b, c, n);
    header_k<<<1, 32, 0, st>>>(out, h);
    if (n > 0) {
        if (psk_codec_needs_finite(c))
            nonfinite_k<<<blocks_for(n), threads, 0, st>>>(out, g, n);
        if (c->kind == PSK_CODEC_INT8 || c->kind == PSK_CODEC_SIGN) {
            const float *x = g;
            if (r != NULL) {
                add_k<<<blocks_for(n), threads, 0, st>>>(out, g, r, n);
                x = r;
            }
            if (c->kind == PSK_CODEC_INT8) {
                size_t nb = (n + c->block - 1) / c->block;
                uint32_t key = (uint32_t)psk_mix64(c->seed + PSK_GOLDEN_GAMMA);
                int8_k<<<(unsigned)nb, threads, 0, st>>>(out, x, r, n, c->block,
                                                         c->stochastic ? 1 : 0, key);
            } else {
                size_t nb = (n + c->block - 1) / c->block;
                sign_scale_k<<<blocks_for(nb), threads, 0, st>>>(out, x, n, c->block);
                sign_bits_k<<<blocks_for((n + 7) / 8), threads, 0, st>>>(out, x, n, c->block);
                if (r != NULL)
                    sign_ef_k<<<blocks_for(n), threads, 0, st>>>(out, r, n, c->block);
            }
        } else {
            dense_k<<<blocks_for(n), threads, 0, st>>>(out, g, r, n, (int)c->kind);
        }
    }
    seal_k<<<1, 1, 0, st>>>(out);
    if (cudaPeekAtLastError() != cudaSuccess) /* its text: the next psk_gpu_sync's */
        return PS_EIO;
    *len = bytes;
    return 0;
}

extern "C" int psk_codec_encode_cuda(uint8_t *out, size_t cap, size_t *len, const float *in,
                                     size_t n, const psk_codec_t *c, void *stream)
{
    return encode(out, cap, len, in, NULL, n, c, (cudaStream_t)stream);
}

extern "C" int psk_codec_encode_ef_cuda(uint8_t *out, size_t cap, size_t *len, const float *g,
                                        float *residual, size_t n, const psk_codec_t *c,
                                        void *stream)
{
    return encode(out, cap, len, g, residual, n, c, (cudaStream_t)stream);
}

extern "C" int psk_codec_decode_add_cuda(float *out, size_t n, const uint8_t *payload,
                                         size_t len, const psk_codec_t *c, float weight,
                                         void *stream)
{
    size_t bytes = psk_codec_max_bytes(c, n);
    if (bytes == 0 || len != bytes)
        return PS_EINVAL;
    if (!dense_kind(c->kind))
        return PS_ENOTSUP;
    if (n == 0)
        return 0;
    decode_add_k<<<blocks_for(n), threads, 0, (cudaStream_t)stream>>>(
        out, payload, n, (int)c->kind, c->block, weight);
    return cudaPeekAtLastError() == cudaSuccess ? 0 : PS_EIO;
}

/* ---- the same encode and decode on the host (tests) ----
 * The kernels' per-element functions in the kernels' order, on host memory: what the device
 * computes, checkable against codec.c where no GPU is (unit test codec_twin). Not the device's
 * indexing, launches or reductions (max is order-free), which test_gpu checks on a device. */

extern "C" int psk_codec_encode_cuda_host(uint8_t *out, size_t cap, size_t *len, const float *g,
                                          float *r, size_t n, const psk_codec_t *c)
{
    size_t bytes = psk_codec_max_bytes(c, n);
    if (bytes == 0 || cap < bytes)
        return PS_EINVAL;
    if (!dense_kind(c->kind))
        return PS_ENOTSUP;
    psk_codec_header(out, c, n); /* header_k */
    uint8_t *body = out + PSK_CODEC_HEADER_BYTES;
    bool flag = false;
    for (size_t i = 0; psk_codec_needs_finite(c) && i < n; i++) /* nonfinite_k */
        flag |= nonfinite(g[i]);
    if (!flag && (c->kind == PSK_CODEC_INT8 || c->kind == PSK_CODEC_SIGN)) {
        const float *x = g;
        if (r != NULL) { /* add_k */
            for (size_t i = 0; i < n; i++)
                r[i] = ef_x(r[i], g[i]);
            x = r;
        }
        size_t nb = (n + c->block - 1) / c->block;
        for (size_t b = 0; b < nb; b++) {
            size_t s = b * c->block, len = n - s < c->block ? n - s : c->block;
            if (c->kind == PSK_CODEC_SIGN) { /* sign_scale_k */
                st32(body + 4 * b, f32_bits(sign_scale(x + s, len)));
                continue;
            }
            uint32_t mk = 0; /* int8_k */
            for (size_t i = 0; i < len; i++) {
                uint32_t k = f32_bits(x[s + i]) & 0x7fffffffu;
                mk = k > mk ? k : mk;
            }
            float m = f32_from_bits(mk), scale = int8_scale(m), sw = FMUL(-1.0f, scale);
            st32(body + 4 * b, f32_bits(scale));
            uint32_t key = (uint32_t)psk_mix64(c->seed + PSK_GOLDEN_GAMMA);
            for (size_t i = 0; i < len; i++) {
                int8_t v = int8_q(x[s + i], m, scale, c->stochastic ? 1 : 0, key,
                                  (uint32_t)(s + i));
                body[4 * nb + s + i] = (uint8_t)v;
                if (r != NULL)
                    r[s + i] = FADD(r[s + i], FMUL(sw, (float)v));
            }
        }
        if (c->kind == PSK_CODEC_SIGN) {
            for (size_t j = 0; j < (n + 7) / 8; j++) /* sign_bits_k */
                body[4 * nb + j] = sign_byte(x, n, j);
            for (size_t i = 0; r != NULL && i < n; i++) /* sign_ef_k */
                decode_one(r, body, i, nb, PSK_CODEC_SIGN, c->block, -1.0f);
        }
    } else if (!flag) {
        for (size_t i = 0; i < n; i++) /* dense_k */
            dense_one(body, g, r, i, (int)c->kind);
    }
    if (flag) /* seal_k */
        out[0] = 0xff;
    *len = bytes;
    return 0;
}

extern "C" int psk_codec_decode_add_cuda_host(float *o, size_t n, const uint8_t *payload,
                                              size_t len, const psk_codec_t *c, float weight)
{
    size_t bytes = psk_codec_max_bytes(c, n);
    if (bytes == 0 || len != bytes)
        return PS_EINVAL;
    if (!dense_kind(c->kind))
        return PS_ENOTSUP;
    size_t nb = c->kind == PSK_CODEC_INT8 || c->kind == PSK_CODEC_SIGN
                    ? (n + c->block - 1) / c->block
                    : 0;
    for (size_t i = 0; i < n; i++) /* decode_add_k */
        decode_one(o, payload + PSK_CODEC_HEADER_BYTES, i, nb, (int)c->kind, c->block, weight);
    return 0;
}
