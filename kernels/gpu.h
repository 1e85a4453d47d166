/* gpu.h: the CUDA device as the rest of psd sees it: plain C, no CUDA headers (STYLE.md 7).
 *
 * One psk_gpu_t is one device with one stream and one cuBLAS handle. Every call that takes it
 * queues work on that stream; psk_gpu_sync waits for it and reports the first error the
 * stream met. gpu.cu implements this with the CUDA runtime and cuBLAS; cuda_none.c, built where
 * nvcc is not found, answers PS_ENOTSUP ("built without CUDA"), so callers need no #ifdef.
 *
 * Device memory is plain `void *` / `float *`; it must not be dereferenced on the host.
 * A psk_gpu_t serves one thread at a time, the thread that opened it (the device is that
 * thread's current one). cuBLAS (libcublas.so.<major>) is loaded at the first open: $PSD_CUBLAS
 * (a path) first, then the loader's search path, $CUDA_HOME/lib64, $CUDA_PATH/lib64 and
 * /usr/local/cuda/lib64. */
#ifndef PSK_GPU_H
#define PSK_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct psk_gpu psk_gpu_t;

/** @brief Whether this build has the CUDA kernels (nvcc was found at build time). */
bool psk_gpu_built(void);

/**
 * @brief Number of CUDA devices this process can use.
 * @param[out] why when 0 devices: a sentence saying why ("built without CUDA", the driver's
 *                 answer such as "CUDA driver version is insufficient for CUDA runtime
 *                 version"), static storage; may be NULL.
 * @return >= 0 (never an error: a failed query counts as no device).
 */
int psk_gpu_count(const char **why);

/**
 * @brief Open device @p device: select it, create a stream and a cuBLAS handle on it.
 * @param[out] g  set on success; release with psk_gpu_close.
 * @param[out] err on failure a sentence naming the device and the CUDA error (may be NULL).
 * @return 0; PS_ENOTSUP (built without CUDA, no such device, or no cuBLAS to load: $PSD_CUBLAS
 *         when set, else libcublas.so.13 from the loader's path, $CUDA_HOME, $CUDA_PATH or
 *         /usr/local/cuda), PS_ENOMEM, PS_EIO (any other CUDA or cuBLAS error).
 */
int psk_gpu_open(psk_gpu_t **g, int device, char *err, size_t errlen);

/** @brief Wait for the stream, destroy the handle and stream. NULL is a no-op. */
void psk_gpu_close(psk_gpu_t *g);

/** @brief The device's name ("NVIDIA H200"), static within @p g. */
const char *psk_gpu_name(const psk_gpu_t *g);

/** @brief The cudaStream_t of @p g, for the kernels' psk_*_cuda launchers. */
void *psk_gpu_stream(const psk_gpu_t *g);

/**
 * @brief Allocate @p bytes of device memory (cudaMalloc: 256-byte aligned).
 * @return 0, PS_ENOMEM, or PS_EIO. *p is NULL on failure.
 * @note The caller owns *p and frees it with psk_gpu_free (which takes NULL).
 */
int psk_gpu_alloc(psk_gpu_t *g, void **p, size_t bytes);
void psk_gpu_free(psk_gpu_t *g, void *p);

/**
 * @brief Pin host memory [p, p + bytes) for the device's copies (cudaHostRegister), so that
 * uploads and downloads from it run at full speed and asynchronously.
 * @return 0, or PS_EIO (the memory stays usable, only unpinned; psk_gpu_last_error unchanged).
 * @note Call psk_gpu_host_unregister before freeing the memory.
 */
int psk_gpu_host_register(psk_gpu_t *g, void *p, size_t bytes);
void psk_gpu_host_unregister(psk_gpu_t *g, void *p);

/**
 * @brief Queue a copy host -> device (upload) or device -> host (download) on the stream.
 * @return 0 or PS_EIO. The host memory must stay valid and unchanged (upload) or untouched
 *         (download) until psk_gpu_sync returns.
 */
int psk_gpu_upload(psk_gpu_t *g, void *dev, const void *host, size_t bytes);
int psk_gpu_download(psk_gpu_t *g, void *host, const void *dev, size_t bytes);

/** @brief Queue zeroing [dev, dev + bytes) on the stream. @return 0 or PS_EIO. */
int psk_gpu_zero(psk_gpu_t *g, void *dev, size_t bytes);

/** @brief Wait for everything queued on the stream. @return 0, or PS_EIO (a kernel or copy
 *         failed; the device may need psk_gpu_close). */
int psk_gpu_sync(psk_gpu_t *g);

/**
 * @brief C = alpha * op(A) . op(B) + beta * C on the device, with the meaning of
 * cblas_sgemm(CblasRowMajor, ...): row-major matrices, op(A) [M, K], op(B) [K, N], C [M, N],
 * lda/ldb/ldc the row strides of A, B, C as stored. fp32 throughout (no TF32).
 * @return 0, PS_EINVAL (a dimension < 0 or a stride too small), or PS_EIO.
 */
int psk_gpu_sgemm(psk_gpu_t *g, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

/** @brief The last CUDA or cuBLAS error text of @p g ("" if none), for messages. A kernel
 *  launcher's PS_EIO leaves its error for the next psk_gpu_sync, which records its text. */
const char *psk_gpu_last_error(const psk_gpu_t *g);

#endif
