/* mlp_ops.cu: the CUDA twin of mlp_ops.c. Grid-stride loops over the same index spaces as the
 * reference; softmax_xent takes one thread per row (a few classes) and colsum one thread per
 * column summing the rows in order, so both give the reference's result up to exp/log
 * rounding (softmax) and exactly (colsum). */
#include <cuda_runtime.h>

extern "C" {
#include "mlp_ops.h"
#include "ps/ps_error.h"
}

static const int threads = 256;

static unsigned blocks_for(size_t n)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

/* A failed launch is left for the stream's next psk_gpu_sync, which records its text. */
static int launched(void)
{
    return cudaPeekAtLastError() == cudaSuccess ? 0 : PS_EIO;
}

__global__ static void bias_rows_k(float *y, const float *b, uint32_t B, uint32_t n)
{
    size_t total = (size_t)B * n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = b[i % n];
}

__global__ static void relu_k(float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ static void relu_back_k(float *a, const float *d, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        a[i] = a[i] > 0.0f ? d[i] : 0.0f;
}

__global__ static void softmax_xent_k(float *z, const uint8_t *y, uint32_t B, uint32_t C,
                                      double *loss)
{
    float inv_b = 1.0f / (float)B;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < B; i += gridDim.x * blockDim.x) {
        float *zi = z + (size_t)i * C;
        uint32_t yi = y[i];
        if (yi >= C) { /* no such class: the row says so by its loss, and moves nothing */
            loss[i] = nan("");
            for (uint32_t j = 0; j < C; j++)
                zi[j] = 0.0f;
            continue;
        }
        float zmax = zi[0];
        for (uint32_t j = 1; j < C; j++)
            zmax = zi[j] > zmax ? zi[j] : zmax;
        double sum = 0.0;
        for (uint32_t j = 0; j < C; j++)
            sum += exp((double)(zi[j] - zmax));
        double lse = (double)zmax + log(sum);
        loss[i] = lse - (double)zi[yi];
        for (uint32_t j = 0; j < C; j++)
            zi[j] = (float)exp((double)zi[j] - lse) * inv_b;
        zi[yi] -= inv_b;
    }
}

__global__ static void colsum_k(float *s, const float *d, uint32_t B, uint32_t n)
{
    for (uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
        float acc = d[j];
        for (uint32_t i = 1; i < B; i++)
            acc += d[(size_t)i * n + j];
        s[j] = acc;
    }
}

extern "C" int psk_bias_rows_cuda(float *y, const float *b, uint32_t B, uint32_t n, void *stream)
{
    if (n == 0 || B == 0)
        return 0;
    bias_rows_k<<<blocks_for((size_t)B * n), threads, 0, (cudaStream_t)stream>>>(y, b, B, n);
    return launched();
}

extern "C" int psk_relu_cuda(float *x, size_t n, void *stream)
{
    if (n == 0)
        return 0;
    relu_k<<<blocks_for(n), threads, 0, (cudaStream_t)stream>>>(x, n);
    return launched();
}

extern "C" int psk_relu_back_cuda(float *a, const float *d, size_t n, void *stream)
{
    if (n == 0)
        return 0;
    relu_back_k<<<blocks_for(n), threads, 0, (cudaStream_t)stream>>>(a, d, n);
    return launched();
}

extern "C" int psk_softmax_xent_cuda(float *z, const uint8_t *y, uint32_t B, uint32_t C,
                                     double *loss, void *stream)
{
    if (C == 0)
        return PS_EINVAL;
    if (B == 0)
        return 0;
    softmax_xent_k<<<blocks_for(B), threads, 0, (cudaStream_t)stream>>>(z, y, B, C, loss);
    return launched();
}

extern "C" int psk_colsum_cuda(float *s, const float *d, uint32_t B, uint32_t n, void *stream)
{
    if (B == 0)
        return PS_EINVAL;
    if (n == 0)
        return 0;
    colsum_k<<<blocks_for(n), threads, 0, (cudaStream_t)stream>>>(s, d, B, n);
    return launched();
}
