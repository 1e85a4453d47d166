/* gpu.cu: gpu.h on the CUDA runtime and cuBLAS. CUDA and cuBLAS codes become PS_E* here and
 * nowhere else; their text is kept in the handle for messages.
 *
 * cuBLAS is loaded by psk_gpu_open (dlopen), not linked: linked, its libraries cost every
 * psworker start about half a second of CPU (measured: 485 ms of task-clock for --help,
 * against 22 ms), also on hosts without a GPU and in CPU runs. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "gpu.h"
#include "ps/ps_error.h"
}

struct psk_gpu {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    char name[256];
    char last_error[256];
};

/* The cuBLAS entry points used here, resolved once from the library of the headers' major
 * version (the soname). */
#define PSK_STR2(x) #x
#define PSK_STR(x) PSK_STR2(x)
static const char cublas_soname[] = "libcublas.so." PSK_STR(CUBLAS_VER_MAJOR);
static struct {
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSetMathMode) set_math_mode;
    decltype(&cublasSgemm_v2) sgemm;
    char error[256]; /* why loading failed, "" if it did not */
} blas;
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_load(void)
{
    /* $PSD_CUBLAS (a path), then the loader's path, then the toolkit's usual homes. */
    char path[4096], first[200] = "";
    const char *env[] = {"CUDA_HOME", "CUDA_PATH"};
    void *h = NULL;
    const char *over = getenv("PSD_CUBLAS");
    if (over != NULL && *over != '\0') {
        /* The user's choice: its failure is said, not passed over for another library (a
         * review, session 63: its reason was lost, or a system libcublas taken silently). */
        if ((h = dlopen(over, RTLD_NOW | RTLD_LOCAL)) == NULL) {
            snprintf(blas.error, sizeof blas.error, "cannot load PSD_CUBLAS=%.100s: %.100s",
                     over, dlerror());
            return;
        }
    }
    if (h == NULL && (h = dlopen(cublas_soname, RTLD_NOW | RTLD_LOCAL)) == NULL)
        snprintf(first, sizeof first, "%s", dlerror());
    for (int i = 0; h == NULL && i < 3; i++) {
        const char *dir = i < 2 ? getenv(env[i]) : "/usr/local/cuda";
        if (dir == NULL || *dir == '\0')
            continue;
        snprintf(path, sizeof path, "%s/lib64/%s", dir, cublas_soname);
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    if (h == NULL) {
        snprintf(blas.error, sizeof blas.error,
                 "cannot load %s (%.100s; also not under $CUDA_HOME, $CUDA_PATH or "
                 "/usr/local/cuda; set PSD_CUBLAS to its path)",
                 cublas_soname, first);
        return;
    }
    *(void **)&blas.create = dlsym(h, "cublasCreate_v2");
    *(void **)&blas.destroy = dlsym(h, "cublasDestroy_v2");
    *(void **)&blas.set_stream = dlsym(h, "cublasSetStream_v2");
    *(void **)&blas.set_math_mode = dlsym(h, "cublasSetMathMode");
    *(void **)&blas.sgemm = dlsym(h, "cublasSgemm_v2");
    if (!blas.create || !blas.destroy || !blas.set_stream || !blas.set_math_mode || !blas.sgemm) {
        snprintf(blas.error, sizeof blas.error, "%s lacks a cuBLAS v2 entry point", cublas_soname);
        blas.create = NULL;
    }
    /* The library stays loaded for the life of the process, as a linked one would. */
}

static int cuda_fail(psk_gpu_t *g, cudaError_t e, const char *what)
{
    if (g != NULL)
        snprintf(g->last_error, sizeof g->last_error, "%s: %s", what, cudaGetErrorString(e));
    (void)cudaGetLastError(); /* clear a non-sticky error so the next call starts clean */
    return e == cudaErrorMemoryAllocation ? PS_ENOMEM : PS_EIO;
}

static int blas_fail(psk_gpu_t *g, cublasStatus_t s, const char *what)
{
    snprintf(g->last_error, sizeof g->last_error, "%s: cuBLAS status %d", what, (int)s);
    return s == CUBLAS_STATUS_ALLOC_FAILED ? PS_ENOMEM : PS_EIO;
}

extern "C" bool psk_gpu_built(void)
{
    return true;
}

extern "C" int psk_gpu_count(const char **why)
{
    static char text[256];
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (why != NULL) {
            /* The runtime's words for a host without the NVIDIA driver are about versions;
             * say what they mean. */
            snprintf(text, sizeof text, "%s%s", cudaGetErrorString(e),
                     e == cudaErrorInsufficientDriver
                         ? " (no NVIDIA driver is loaded, or it is older than this CUDA runtime)"
                         : "");
            *why = text;
        }
        return 0;
    }
    if (n == 0 && why != NULL)
        *why = "the driver reports no CUDA device";
    return n;
}

extern "C" int psk_gpu_open(psk_gpu_t **out, int device, char *err, size_t errlen)
{
    *out = NULL;
    const char *why = NULL;
    int n = psk_gpu_count(&why);
    if (device < 0 || device >= n) {
        if (err != NULL) {
            if (n == 0)
                snprintf(err, errlen, "no CUDA device: %s", why);
            else
                snprintf(err, errlen, "CUDA device %d does not exist (this host has %d)",
                         device, n);
        }
        return PS_ENOTSUP;
    }
    psk_gpu_t *g = (psk_gpu_t *)calloc(1, sizeof *g);
    if (g == NULL)
        return PS_ENOMEM;
    g->device = device;
    int rc = 0;
    cudaDeviceProp prop;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaGetDeviceProperties(&prop, device);
    if (e == cudaSuccess) {
        snprintf(g->name, sizeof g->name, "%s", prop.name);
        e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
    }
    if (e != cudaSuccess) {
        rc = cuda_fail(g, e, "opening the device");
    } else if (pthread_once(&blas_once, blas_load), blas.create == NULL) {
        snprintf(g->last_error, sizeof g->last_error, "%s", blas.error);
        rc = PS_ENOTSUP;
    } else {
        cublasStatus_t s = blas.create(&g->blas);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = blas.set_stream(g->blas, g->stream);
        /* Plain fp32 products: no TF32 tensor-core rounding, so results stay within fp32
         * rounding of the CPU reference. */
        if (s == CUBLAS_STATUS_SUCCESS)
            s = blas.set_math_mode(g->blas, CUBLAS_DEFAULT_MATH);
        if (s != CUBLAS_STATUS_SUCCESS)
            rc = blas_fail(g, s, "creating the cuBLAS handle");
    }
    if (rc != 0) {
        if (err != NULL)
            snprintf(err, errlen, "CUDA device %d: %s", device, g->last_error);
        psk_gpu_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

extern "C" void psk_gpu_close(psk_gpu_t *g)
{
    if (g == NULL)
        return;
    if (g->stream != NULL)
        (void)cudaStreamSynchronize(g->stream);
    if (g->blas != NULL)
        (void)blas.destroy(g->blas);
    if (g->stream != NULL)
        (void)cudaStreamDestroy(g->stream);
    (void)cudaGetLastError();
    free(g);
}

extern "C" const char *psk_gpu_name(const psk_gpu_t *g)
{
    return g->name;
}

extern "C" void *psk_gpu_stream(const psk_gpu_t *g)
{
    return (void *)g->stream;
}

extern "C" const char *psk_gpu_last_error(const psk_gpu_t *g)
{
    return g->last_error;
}

extern "C" int psk_gpu_alloc(psk_gpu_t *g, void **p, size_t bytes)
{
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes > 0 ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        return cuda_fail(g, e, "cudaMalloc");
    }
    return 0;
}

extern "C" void psk_gpu_free(psk_gpu_t *g, void *p)
{
    (void)g; /* one device per process: cudaFree needs no handle */
    if (p != NULL && cudaFree(p) != cudaSuccess)
        (void)cudaGetLastError(); /* not this handle's next operation's error */
}

extern "C" int psk_gpu_host_register(psk_gpu_t *g, void *p, size_t bytes)
{
    /* Optional (the memory works unpinned): a failure leaves no error text behind that a
     * later, unrelated failure would be reported with. */
    (void)g;
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError();
    return PS_EIO;
}

extern "C" void psk_gpu_host_unregister(psk_gpu_t *g, void *p)
{
    (void)g;
    if (p != NULL && cudaHostUnregister(p) != cudaSuccess)
        (void)cudaGetLastError(); /* it was not registered: nothing to undo */
}

extern "C" int psk_gpu_upload(psk_gpu_t *g, void *dev, const void *host, size_t bytes)
{
    cudaError_t e = cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, g->stream);
    return e == cudaSuccess ? 0 : cuda_fail(g, e, "copy to the device");
}

extern "C" int psk_gpu_download(psk_gpu_t *g, void *host, const void *dev, size_t bytes)
{
    cudaError_t e = cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, g->stream);
    return e == cudaSuccess ? 0 : cuda_fail(g, e, "copy from the device");
}

extern "C" int psk_gpu_zero(psk_gpu_t *g, void *dev, size_t bytes)
{
    cudaError_t e = cudaMemsetAsync(dev, 0, bytes, g->stream);
    return e == cudaSuccess ? 0 : cuda_fail(g, e, "zeroing device memory");
}

extern "C" int psk_gpu_sync(psk_gpu_t *g)
{
    cudaError_t e = cudaStreamSynchronize(g->stream);
    if (e == cudaSuccess)
        e = cudaGetLastError(); /* a launch that failed before running */
    return e == cudaSuccess ? 0 : cuda_fail(g, e, "device work");
}

extern "C" int psk_gpu_sgemm(psk_gpu_t *g, bool trans_a, bool trans_b, int M, int N, int K,
                             float alpha, const float *A, int lda, const float *B, int ldb,
                             float beta, float *C, int ldc)
{
    /* Row-major checks, as cblas makes them: op(A) is [M, K], stored [M, K] or [K, M]. */
    if (M < 0 || N < 0 || K < 0 || lda < (trans_a ? (M > 1 ? M : 1) : (K > 1 ? K : 1)) ||
        ldb < (trans_b ? (K > 1 ? K : 1) : (N > 1 ? N : 1)) || ldc < (N > 1 ? N : 1))
        return PS_EINVAL;
    if (M == 0 || N == 0)
        return 0;
    /* A row-major [r, c] matrix is the column-major [c, r] one: C^T = op(B)^T . op(A)^T,
     * so column-major cuBLAS computes it with the operands swapped and the same ops. */
    cublasStatus_t s = blas.sgemm(g->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb,
                                   A, lda, &beta, C, ldc);
    return s == CUBLAS_STATUS_SUCCESS ? 0 : blas_fail(g, s, "cublasSgemm");
}
