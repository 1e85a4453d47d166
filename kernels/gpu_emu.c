/* gpu_emu.c: gpu.h and the mlp_ops _cuda launchers on the host, for tests only (unit test
 * gpu_emu): a "device" whose memory is host memory that the emulation keeps track of, whose
 * sgemm is OpenBLAS and whose kernels are the CPU references. It runs the callers' device code
 * paths (worker/mlp.c's) where no GPU is, and checks what a GPU would punish silently or with
 * a crash: every pointer a kernel, an sgemm or a copy takes as device memory must lie inside
 * one allocation of this device (with the whole extent it touches), and the host side of a
 * copy must not. A violation aborts with the call and the pointer. The work is synchronous,
 * so it does not find ordering mistakes between queued operations. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "gpu.h"
#include "mlp_ops.h"
#include "ps/ps_error.h"

#define EMU_MAX_ALLOCS 256

struct psk_gpu {
    int open;
};

/* One emulated device per process, as the tests need. */
static struct {
    void *base[EMU_MAX_ALLOCS];
    size_t len[EMU_MAX_ALLOCS];
} dev;
static struct psk_gpu the_gpu;
static int fail_next_alloc; /* psk_gpu_emu_fail_alloc */

/* Test hooks: the nth allocation from now fails (PS_ENOMEM); how many allocations live. */
void psk_gpu_emu_fail_alloc(int nth)
{
    fail_next_alloc = nth;
}

int psk_gpu_emu_live(void)
{
    int n = 0;
    for (int i = 0; i < EMU_MAX_ALLOCS; i++)
        n += dev.base[i] != NULL;
    return n;
}

/* Whether [p, p + bytes) lies inside one device allocation. */
static int on_device(const void *p, size_t bytes)
{
    const char *c = p;
    for (int i = 0; i < EMU_MAX_ALLOCS; i++)
        if (dev.base[i] && c >= (const char *)dev.base[i] &&
            c + bytes <= (const char *)dev.base[i] + dev.len[i])
            return 1;
    return 0;
}

static void need_device(const char *call, const void *p, size_t bytes)
{
    if (bytes > 0 && !on_device(p, bytes)) {
        fprintf(stderr, "gpu_emu: %s: %p (+%zu bytes) is not device memory\n", call, p, bytes);
        abort();
    }
}

static void need_host(const char *call, const void *p, size_t bytes)
{
    if (bytes > 0 && on_device(p, 1)) {
        fprintf(stderr, "gpu_emu: %s: %p is device memory, not host memory\n", call, p);
        abort();
    }
}

bool psk_gpu_built(void)
{
    return true;
}

int psk_gpu_count(const char **why)
{
    return 1;
}

int psk_gpu_open(psk_gpu_t **g, int device, char *err, size_t errlen)
{
    *g = NULL;
    if (device != 0) {
        if (err != NULL)
            snprintf(err, errlen, "CUDA device %d does not exist (this host has 1)", device);
        return PS_ENOTSUP;
    }
    the_gpu.open++;
    *g = &the_gpu;
    return 0;
}

void psk_gpu_close(psk_gpu_t *g)
{
    if (g != NULL)
        g->open--;
}

const char *psk_gpu_name(const psk_gpu_t *g)
{
    return "host emulation";
}

void *psk_gpu_stream(const psk_gpu_t *g)
{
    return (void *)g;
}

const char *psk_gpu_last_error(const psk_gpu_t *g)
{
    return "emulated device out of memory";
}

int psk_gpu_alloc(psk_gpu_t *g, void **p, size_t bytes)
{
    *p = NULL;
    if (fail_next_alloc > 0 && --fail_next_alloc == 0)
        return PS_ENOMEM;
    for (int i = 0; i < EMU_MAX_ALLOCS; i++) {
        if (dev.base[i] != NULL)
            continue;
        /* Filled with NaN-like bytes: a read of what nothing wrote shows up in the results. */
        if ((dev.base[i] = malloc(bytes ? bytes : 1)) == NULL)
            return PS_ENOMEM;
        memset(dev.base[i], 0xff, bytes);
        dev.len[i] = bytes;
        *p = dev.base[i];
        return 0;
    }
    return PS_ENOMEM;
}

void psk_gpu_free(psk_gpu_t *g, void *p)
{
    if (p == NULL)
        return;
    for (int i = 0; i < EMU_MAX_ALLOCS; i++)
        if (dev.base[i] == p) {
            free(p);
            dev.base[i] = NULL;
            return;
        }
    fprintf(stderr, "gpu_emu: psk_gpu_free: %p was not allocated on the device\n", p);
    abort();
}

int psk_gpu_host_register(psk_gpu_t *g, void *p, size_t bytes)
{
    need_host("psk_gpu_host_register", p, bytes);
    return 0;
}

void psk_gpu_host_unregister(psk_gpu_t *g, void *p) {}

int psk_gpu_upload(psk_gpu_t *g, void *d, const void *host, size_t bytes)
{
    need_device("psk_gpu_upload", d, bytes);
    need_host("psk_gpu_upload", host, bytes);
    memcpy(d, host, bytes);
    return 0;
}

int psk_gpu_download(psk_gpu_t *g, void *host, const void *d, size_t bytes)
{
    need_device("psk_gpu_download", d, bytes);
    need_host("psk_gpu_download", host, bytes);
    memcpy(host, d, bytes);
    return 0;
}

int psk_gpu_zero(psk_gpu_t *g, void *d, size_t bytes)
{
    need_device("psk_gpu_zero", d, bytes);
    memset(d, 0, bytes);
    return 0;
}

int psk_gpu_sync(psk_gpu_t *g)
{
    return 0;
}

int psk_gpu_sgemm(psk_gpu_t *g, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    if (M < 0 || N < 0 || K < 0 || lda < (trans_a ? (M > 1 ? M : 1) : (K > 1 ? K : 1)) ||
        ldb < (trans_b ? (K > 1 ? K : 1) : (N > 1 ? N : 1)) || ldc < (N > 1 ? N : 1))
        return PS_EINVAL;
    if (M == 0 || N == 0)
        return 0;
    /* The extent each operand spans, as stored (rows x row stride, the last row short). */
    int ra = trans_a ? K : M, ca = trans_a ? M : K, rb = trans_b ? N : K, cb = trans_b ? K : N;
    need_device("psk_gpu_sgemm A", A, ((size_t)(ra - 1) * lda + ca) * 4);
    need_device("psk_gpu_sgemm B", B, ((size_t)(rb - 1) * ldb + cb) * 4);
    need_device("psk_gpu_sgemm C", C, ((size_t)(M - 1) * ldc + N) * 4);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return 0;
}

int psk_bias_rows_cuda(float *y, const float *b, uint32_t B, uint32_t n, void *stream)
{
    need_device("psk_bias_rows_cuda y", y, (size_t)B * n * 4);
    need_device("psk_bias_rows_cuda b", b, (size_t)n * 4);
    psk_bias_rows_cpu(y, b, B, n);
    return 0;
}

int psk_relu_cuda(float *x, size_t n, void *stream)
{
    need_device("psk_relu_cuda", x, n * 4);
    psk_relu_cpu(x, n);
    return 0;
}

int psk_relu_back_cuda(float *a, const float *d, size_t n, void *stream)
{
    need_device("psk_relu_back_cuda a", a, n * 4);
    need_device("psk_relu_back_cuda d", d, n * 4);
    psk_relu_back_cpu(a, d, n);
    return 0;
}

int psk_softmax_xent_cuda(float *z, const uint8_t *y, uint32_t B, uint32_t C, double *loss,
                          void *stream)
{
    if (C == 0)
        return PS_EINVAL;
    need_device("psk_softmax_xent_cuda z", z, (size_t)B * C * 4);
    need_device("psk_softmax_xent_cuda y", y, B);
    need_device("psk_softmax_xent_cuda loss", loss, (size_t)B * 8);
    psk_softmax_xent_cpu(z, y, B, C, loss);
    return 0;
}

int psk_colsum_cuda(float *s, const float *d, uint32_t B, uint32_t n, void *stream)
{
    if (B == 0)
        return PS_EINVAL;
    need_device("psk_colsum_cuda s", s, (size_t)n * 4);
    need_device("psk_colsum_cuda d", d, (size_t)B * n * 4);
    psk_colsum_cpu(s, d, B, n);
    return 0;
}

/* The codecs: the CPU reference on the "device" memory, with the device's contract (PS_ENOTSUP
 * for the sparse codecs; non-finite input marked in the payload's kind byte, not returned). */
static int emu_encode(uint8_t *out, size_t cap, size_t *len, const float *g, float *r, size_t n,
                      const psk_codec_t *c)
{
    size_t bytes = psk_codec_max_bytes(c, n);
    if (bytes == 0 || cap < bytes)
        return PS_EINVAL;
    if (c->kind == PSK_CODEC_TOPK || c->kind == PSK_CODEC_RANDOMK)
        return PS_ENOTSUP;
    need_device("psk_codec_encode_cuda out", out, bytes);
    need_device("psk_codec_encode_cuda in", g, n * 4);
    if (r != NULL)
        need_device("psk_codec_encode_ef_cuda residual", r, n * 4);
    int rc = r != NULL ? psk_codec_encode_ef_cpu(out, cap, len, g, r, n, c, NULL)
                       : psk_codec_encode_cpu(out, cap, len, g, n, c, NULL);
    if (rc == PS_EINVAL) { /* a non-finite value: the device marks the payload instead */
        psk_codec_header(out, c, n);
        out[0] = 0xff;
    }
    *len = bytes;
    return 0;
}

int psk_codec_encode_cuda(uint8_t *out, size_t cap, size_t *len, const float *in, size_t n,
                          const psk_codec_t *c, void *stream)
{
    return emu_encode(out, cap, len, in, NULL, n, c);
}

int psk_codec_encode_ef_cuda(uint8_t *out, size_t cap, size_t *len, const float *g,
                             float *residual, size_t n, const psk_codec_t *c, void *stream)
{
    return emu_encode(out, cap, len, g, residual, n, c);
}

int psk_codec_decode_add_cuda(float *out, size_t n, const uint8_t *payload, size_t len,
                              const psk_codec_t *c, float weight, void *stream)
{
    size_t bytes = psk_codec_max_bytes(c, n);
    if (bytes == 0 || len != bytes)
        return PS_EINVAL;
    if (c->kind == PSK_CODEC_TOPK || c->kind == PSK_CODEC_RANDOMK)
        return PS_ENOTSUP;
    need_device("psk_codec_decode_add_cuda out", out, n * 4);
    need_device("psk_codec_decode_add_cuda payload", payload, len);
    return psk_codec_decode_add_cpu(out, n, payload, len, c, weight) == 0 ? 0 : PS_EIO;
}
