/* cuda_none.c: gpu.h and the kernels' _cuda launchers in a build without nvcc. There is no
 * device: every call that would need one says so (PS_ENOTSUP, "built without CUDA"), so callers
 * carry no #ifdef. */
#include <stdio.h>

#include "codec.h"
#include "gpu.h"
#include "mlp_ops.h"
#include "ps/ps_error.h"

/* PSK_CUDA_DISABLED: configured with -Dcuda=disabled (kernels/meson.build); else nvcc, cuBLAS or
 * the static CUDA runtime was not found. */
static const char built_without[] =
#ifdef PSK_CUDA_DISABLED
    "this build has no CUDA kernels (it was configured with -Dcuda=disabled; "
    "see meson option cuda)";
#else
    "this build has no CUDA kernels (nvcc, cuBLAS or the static CUDA runtime was not found "
    "when it was configured; see meson option cuda)";
#endif

bool psk_gpu_built(void)
{
    return false;
}

int psk_gpu_count(const char **why)
{
    if (why != NULL)
        *why = built_without;
    return 0;
}

int psk_gpu_open(psk_gpu_t **g, int device, char *err, size_t errlen)
{
    *g = NULL;
    if (err != NULL)
        snprintf(err, errlen, "no CUDA device: %s", built_without);
    return PS_ENOTSUP;
}

/* No psk_gpu_t can exist in this build, so the rest is unreachable with a valid handle. */
void psk_gpu_close(psk_gpu_t *g) {}
const char *psk_gpu_name(const psk_gpu_t *g) { return ""; }
void *psk_gpu_stream(const psk_gpu_t *g) { return NULL; }
const char *psk_gpu_last_error(const psk_gpu_t *g) { return built_without; }
int psk_gpu_alloc(psk_gpu_t *g, void **p, size_t bytes)
{
    *p = NULL;
    return PS_ENOTSUP;
}
void psk_gpu_free(psk_gpu_t *g, void *p) {}
int psk_gpu_host_register(psk_gpu_t *g, void *p, size_t bytes) { return PS_ENOTSUP; }
void psk_gpu_host_unregister(psk_gpu_t *g, void *p) {}
int psk_gpu_upload(psk_gpu_t *g, void *dev, const void *host, size_t bytes) { return PS_ENOTSUP; }
int psk_gpu_download(psk_gpu_t *g, void *host, const void *dev, size_t bytes)
{
    return PS_ENOTSUP;
}
int psk_gpu_zero(psk_gpu_t *g, void *dev, size_t bytes) { return PS_ENOTSUP; }
int psk_gpu_sync(psk_gpu_t *g) { return PS_ENOTSUP; }
int psk_gpu_sgemm(psk_gpu_t *g, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    return PS_ENOTSUP;
}

int psk_bias_rows_cuda(float *y, const float *b, uint32_t B, uint32_t n, void *stream)
{
    return PS_ENOTSUP;
}
int psk_relu_cuda(float *x, size_t n, void *stream) { return PS_ENOTSUP; }
int psk_relu_back_cuda(float *a, const float *d, size_t n, void *stream) { return PS_ENOTSUP; }
int psk_softmax_xent_cuda(float *z, const uint8_t *y, uint32_t B, uint32_t C, double *loss,
                          void *stream)
{
    return PS_ENOTSUP;
}
int psk_colsum_cuda(float *s, const float *d, uint32_t B, uint32_t n, void *stream)
{
    return PS_ENOTSUP;
}

int psk_codec_encode_cuda(uint8_t *out, size_t cap, size_t *len, const float *in, size_t n,
                          const psk_codec_t *c, void *stream)
{
    return PS_ENOTSUP;
}
int psk_codec_encode_ef_cuda(uint8_t *out, size_t cap, size_t *len, const float *g,
                             float *residual, size_t n, const psk_codec_t *c, void *stream)
{
    return PS_ENOTSUP;
}
int psk_codec_decode_add_cuda(float *out, size_t n, const uint8_t *payload, size_t len,
                              const psk_codec_t *c, float weight, void *stream)
{
    return PS_ENOTSUP;
}
