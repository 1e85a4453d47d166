/* test_gpu.c: every CUDA twin against its CPU reference (STYLE.md 7: |gpu - ref| <= atol +
 * rtol * |ref|): gpu.h's row-major sgemm against cblas, kernels/mlp_ops.h, and the mlp's
 * train_step and eval on a device against the same model on the CPU. Skipped, saying why, where
 * no CUDA device is usable (or the build has no CUDA). Runs without fork: CUDA started in the
 * runner would not survive Check's fork.
 *
 * Built twice: test_gpu on the real device (gpu.cu), and test_gpu_emu (PSK_GPU_EMU) on
 * kernels/gpu_emu.c's host "device", where the twins are the references themselves but
 * worker/mlp.c's device path runs for real with every device pointer checked; that one runs
 * everywhere, and adds the cases only an emulation can stage (allocations that fail). */
#include <cblas.h>
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "gpu.h"
#include "mlp.h"
#include "mlp_ops.h"
#include "ps/ps_error.h"

static psk_gpu_t *g; /* opened by ps_test_setup, for the whole run */
static char open_err[256];

/* A host with a device that cannot be opened fails every case, saying why (not a skip). */
static void need_gpu(void)
{
    ck_assert_msg(g != NULL, "CUDA device 0 cannot be opened: %s", open_err);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void fill(float *p, size_t n, float a, uint64_t *s)
{
    for (size_t i = 0; i < n; i++)
        p[i] = a * (2.0f * (float)(rng_next(s) >> 40) / (float)(1 << 24) - 1.0f);
}

/* llm.c's validate_result: every element within atol + rtol * |ref|; names the first miss. */
static void assert_close(const char *what, const float *got, const float *ref, size_t n,
                         float atol, float rtol)
{
    for (size_t i = 0; i < n; i++) {
        float tol = atol + rtol * fabsf(ref[i]);
        if (!(fabsf(got[i] - ref[i]) <= tol))
            ck_abort_msg("%s: element %zu is %.9g on the device, %.9g on the CPU (tolerance %g)",
                         what, i, got[i], ref[i], tol);
    }
}

static void *dev_copy(const void *host, size_t bytes)
{
    void *d;
    ck_assert_int_eq(psk_gpu_alloc(g, &d, bytes), 0);
    ck_assert_int_eq(psk_gpu_upload(g, d, host, bytes), 0);
    return d;
}

static void host_copy(void *host, const void *dev, size_t bytes)
{
    ck_assert_int_eq(psk_gpu_download(g, host, dev, bytes), 0);
    ck_assert_int_eq(psk_gpu_sync(g), 0);
}

/* ---- sgemm ---- */

START_TEST(test_sgemm_matches_cblas)
{
    need_gpu();
    /* Odd sizes and padded strides, every transpose pair, beta 0 and 1. */
    const int M = 37, N = 53, K = 29, pad = 3;
    uint64_t s = 11;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int b1 = 0; b1 < 2; b1++) {
                int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
                size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb,
                       nc = (size_t)M * ldc;
                float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc(nc * 4),
                      *got = malloc(nc * 4);
                fill(A, na, 1.0f, &s);
                fill(B, nb, 1.0f, &s);
                fill(C, nc, 1.0f, &s);
                float *dA = dev_copy(A, na * 4), *dB = dev_copy(B, nb * 4),
                      *dC = dev_copy(C, nc * 4);
                float beta = b1 ? 1.0f : 0.0f;
                ck_assert_int_eq(psk_gpu_sgemm(g, ta, tb, M, N, K, 0.5f, dA, lda, dB, ldb, beta,
                                               dC, ldc), 0);
                host_copy(got, dC, nc * 4);
                cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                            tb ? CblasTrans : CblasNoTrans, M, N, K, 0.5f, A, lda, B, ldb, beta,
                            C, ldc);
                char what[64];
                snprintf(what, sizeof what, "sgemm ta=%d tb=%d beta=%d", ta, tb, b1);
                assert_close(what, got, C, nc, 1e-5f, 1e-4f);
                psk_gpu_free(g, dA);
                psk_gpu_free(g, dB);
                psk_gpu_free(g, dC);
                free(A);
                free(B);
                free(C);
                free(got);
            }
    /* A stride shorter than a row is refused, as cblas would. */
    ck_assert_int_eq(psk_gpu_sgemm(g, false, false, 4, 4, 4, 1.0f, NULL, 3, NULL, 4, 0.0f, NULL,
                                   4), PS_EINVAL);
}
END_TEST

/* ---- mlp_ops ---- */

START_TEST(test_mlp_ops_match_reference)
{
    need_gpu();
    const uint32_t B = 67, n = 301, C = 10;
    size_t bn = (size_t)B * n;
    uint64_t s = 5;
    float *b = malloc(n * 4), *x = malloc(bn * 4), *d = malloc(bn * 4), *ref = malloc(bn * 4),
          *got = malloc(bn * 4);
    fill(b, n, 1.0f, &s);
    fill(x, bn, 1.0f, &s);
    fill(d, bn, 1.0f, &s);
    float *dx = dev_copy(x, bn * 4), *dd = dev_copy(d, bn * 4), *db = dev_copy(b, n * 4);
    void *st = psk_gpu_stream(g);

    ck_assert_int_eq(psk_bias_rows_cuda(dx, db, B, n, st), 0);
    host_copy(got, dx, bn * 4);
    psk_bias_rows_cpu(ref, b, B, n);
    assert_close("bias_rows", got, ref, bn, 0.0f, 0.0f);

    ck_assert_int_eq(psk_gpu_upload(g, dx, x, bn * 4), 0);
    ck_assert_int_eq(psk_relu_cuda(dx, bn, st), 0);
    host_copy(got, dx, bn * 4);
    memcpy(ref, x, bn * 4);
    psk_relu_cpu(ref, bn);
    assert_close("relu", got, ref, bn, 0.0f, 0.0f);

    ck_assert_int_eq(psk_gpu_upload(g, dx, x, bn * 4), 0);
    ck_assert_int_eq(psk_relu_back_cuda(dx, dd, bn, st), 0);
    host_copy(got, dx, bn * 4);
    memcpy(ref, x, bn * 4);
    psk_relu_back_cpu(ref, d, bn);
    assert_close("relu_back", got, ref, bn, 0.0f, 0.0f);

    /* colsum adds the rows in order on both sides: the same floats. */
    ck_assert_int_eq(psk_colsum_cuda(db, dd, B, n, st), 0);
    host_copy(got, db, n * 4);
    psk_colsum_cpu(ref, d, B, n);
    assert_close("colsum", got, ref, n, 0.0f, 0.0f);

    /* softmax cross-entropy on B rows of C logits, one label per row. */
    uint8_t y[67];
    for (uint32_t i = 0; i < B; i++)
        y[i] = (uint8_t)(rng_next(&s) % C);
    for (size_t i = 0; i < (size_t)B * C; i++)
        x[i] *= 8.0f; /* logits far apart too */
    uint8_t *dy;
    double *dl, lref[67], lgot[67];
    ck_assert_int_eq(psk_gpu_alloc(g, (void **)&dy, B), 0);
    ck_assert_int_eq(psk_gpu_alloc(g, (void **)&dl, B * sizeof(double)), 0);
    ck_assert_int_eq(psk_gpu_upload(g, dy, y, B), 0);
    ck_assert_int_eq(psk_gpu_upload(g, dx, x, (size_t)B * C * 4), 0);
    ck_assert_int_eq(psk_softmax_xent_cuda(dx, dy, B, C, dl, st), 0);
    ck_assert_int_eq(psk_gpu_download(g, lgot, dl, B * sizeof(double)), 0);
    host_copy(got, dx, (size_t)B * C * 4);
    memcpy(ref, x, (size_t)B * C * 4);
    psk_softmax_xent_cpu(ref, y, B, C, lref);
    assert_close("softmax_xent delta", got, ref, (size_t)B * C, 1e-7f, 1e-5f);
    for (uint32_t i = 0; i < B; i++)
        ck_assert_msg(fabs(lgot[i] - lref[i]) <= 1e-9 + 1e-9 * fabs(lref[i]),
                      "row %u: loss %.17g on the device, %.17g on the CPU", i, lgot[i], lref[i]);

    /* A label past the classes: that row's loss is NaN and its delta zero (no assert there). */
    y[3] = (uint8_t)C;
    ck_assert_int_eq(psk_gpu_upload(g, dy, y, B), 0);
    ck_assert_int_eq(psk_gpu_upload(g, dx, x, (size_t)B * C * 4), 0);
    ck_assert_int_eq(psk_softmax_xent_cuda(dx, dy, B, C, dl, st), 0);
    ck_assert_int_eq(psk_gpu_download(g, lgot, dl, B * sizeof(double)), 0);
    host_copy(got, dx, (size_t)B * C * 4);
    ck_assert(isnan(lgot[3]));
    for (uint32_t j = 0; j < C; j++)
        ck_assert(got[3 * C + j] == 0.0f);

    ck_assert_int_eq(psk_colsum_cuda(db, dd, 0, n, st), PS_EINVAL);

    /* More elements than one grid covers (65535 blocks of 256): the grid-stride loop wraps. */
    size_t big = 65535u * 256u * 2u + 3u;
    float *hb = malloc(big * 4), *db2;
    for (size_t i = 0; i < big; i++)
        hb[i] = (i % 3 == 0) ? -1.0f : (float)(i % 1000);
    db2 = dev_copy(hb, big * 4);
    ck_assert_int_eq(psk_relu_cuda(db2, big, st), 0);
    host_copy(hb, db2, big * 4);
    for (size_t i = 0; i < big; i += 1) {
        float want = (i % 3 == 0) ? 0.0f : (float)(i % 1000);
        if (hb[i] != want)
            ck_abort_msg("relu over %zu values: element %zu is %g, want %g", big, i, hb[i], want);
    }
    psk_gpu_free(g, db2);
    free(hb);
    psk_gpu_free(g, dx);
    psk_gpu_free(g, dd);
    psk_gpu_free(g, db);
    psk_gpu_free(g, dy);
    psk_gpu_free(g, dl);
    free(b);
    free(x);
    free(d);
    free(ref);
    free(got);
}
END_TEST

/* ---- codecs: the same payload bytes, residuals and sums as the CPU, bit for bit ---- */

START_TEST(test_codecs_match_reference)
{
    need_gpu();
    const size_t n = 10007; /* partial last blocks and bytes */
    static const struct {
        const char *name;
        uint32_t block;
        int stochastic;
    } cases[] = {{"none", 0, 0}, {"fp16", 0, 0}, {"bf16", 0, 0}, {"int8", 256, 0},
                 {"int8", 100, 1}, {"int8", 1, 0}, {"sign", 256, 0}, {"sign", 13, 0}};
    uint64_t s = 17;
    float *x = malloc(n * 4), *r0 = malloc(n * 4), *rc = malloc(n * 4), *rg = malloc(n * 4);
    fill(x, n, 3.0f, &s);
    fill(r0, n, 0.01f, &s);
    /* Values fp16 cannot hold, subnormal and tiny ones (int8's tiny-block path), a -0. */
    x[1] = 70000.0f;
    x[2] = -1e-6f;
    x[3] = -0.0f;
    for (size_t i = 512; i < 768; i++)
        x[i] = (float)(i % 7) * 1e-39f;
    float *dg = dev_copy(x, n * 4), *dr;
    ck_assert_int_eq(psk_gpu_alloc(g, (void **)&dr, n * 4), 0);
    void *st = psk_gpu_stream(g);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        psk_codec_t c;
        ck_assert_int_eq(psk_codec_parse(&c, cases[k].name), 0);
        if (cases[k].block)
            c.block = cases[k].block;
        c.stochastic = cases[k].stochastic;
        c.seed = 99 + k;
        size_t cap = psk_codec_max_bytes(&c, n), lc = 0, lg = 0;
        uint8_t *pc = malloc(cap), *pg = malloc(cap), *dp;
        ck_assert_int_eq(psk_gpu_alloc(g, (void **)&dp, cap), 0);
        char what[64];
        /* plain encode */
        ck_assert_int_eq(psk_codec_encode_cpu(pc, cap, &lc, x, n, &c, NULL), 0);
        ck_assert_int_eq(psk_codec_encode_cuda(dp, cap, &lg, dg, n, &c, st), 0);
        host_copy(pg, dp, cap);
        ck_assert_uint_eq(lg, lc);
        size_t i = 0;
        while (i < lc && pg[i] == pc[i])
            i++;
        ck_assert_msg(i == lc, "%s block %u: payload byte %zu is %u on the device, %u on the "
                      "CPU", cases[k].name, c.block, i, i < cap ? pg[i] : 0, i < cap ? pc[i] : 0);
        /* decode-add of that payload onto the residual's values */
        memcpy(rc, r0, n * 4);
        ck_assert_int_eq(psk_gpu_upload(g, dr, r0, n * 4), 0);
        ck_assert_int_eq(psk_codec_decode_add_cpu(rc, n, pc, lc, &c, 0.5f), 0);
        ck_assert_int_eq(psk_codec_decode_add_cuda(dr, n, dp, lc, &c, 0.5f, st), 0);
        host_copy(rg, dr, n * 4);
        snprintf(what, sizeof what, "%s block %u decode_add", cases[k].name, c.block);
        ck_assert_msg(memcmp(rg, rc, n * 4) == 0, "%s differs", what);
        /* with error feedback: payload and residual */
        memcpy(rc, r0, n * 4);
        ck_assert_int_eq(psk_gpu_upload(g, dr, r0, n * 4), 0);
        ck_assert_int_eq(psk_codec_encode_ef_cpu(pc, cap, &lc, x, rc, n, &c, NULL), 0);
        ck_assert_int_eq(psk_codec_encode_ef_cuda(dp, cap, &lg, dg, dr, n, &c, st), 0);
        host_copy(pg, dp, cap);
        ck_assert_msg(lg == lc && memcmp(pg, pc, lc) == 0, "%s block %u: error-feedback "
                      "payloads differ",
                      cases[k].name, c.block);
        host_copy(rg, dr, n * 4);
        ck_assert_msg(memcmp(rg, rc, n * 4) == 0, "%s block %u: residuals differ",
                      cases[k].name, c.block);
        psk_gpu_free(g, dp);
        free(pc);
        free(pg);
    }
    /* A NaN where int8 cannot take one: the payload is marked (the check refuses it) and the
     * residual stays as it was. */
    psk_codec_t c;
    ck_assert_int_eq(psk_codec_parse(&c, "int8"), 0);
    size_t cap = psk_codec_max_bytes(&c, n), len = 0;
    uint8_t *p = malloc(cap), *dp;
    ck_assert_int_eq(psk_gpu_alloc(g, (void **)&dp, cap), 0);
    x[4000] = nanf("");
    ck_assert_int_eq(psk_gpu_upload(g, dg, x, n * 4), 0);
    ck_assert_int_eq(psk_gpu_upload(g, dr, r0, n * 4), 0);
    ck_assert_int_eq(psk_codec_encode_ef_cuda(dp, cap, &len, dg, dr, n, &c, st), 0);
    host_copy(p, dp, cap);
    ck_assert_int_eq(p[0], 0xff);
    ck_assert_int_ne(psk_codec_check(p, len, n, &c), 0);
    host_copy(rg, dr, n * 4);
    ck_assert_msg(memcmp(rg, r0, n * 4) == 0, "the residual changed");
    /* The sparse codecs are the host's. */
    ck_assert_int_eq(psk_codec_parse(&c, "topk:0.1"), 0);
    ck_assert_int_eq(psk_codec_encode_cuda(dp, cap, &len, dg, n, &c, st), PS_ENOTSUP);
    psk_gpu_free(g, dp);
    psk_gpu_free(g, dg);
    psk_gpu_free(g, dr);
    free(p);
    free(x);
    free(r0);
    free(rc);
    free(rg);
}
END_TEST

/* ---- the mlp on a device ---- */

static int order_cpu[32], order_gpu[32], n_cpu, n_gpu;
static void rec_cpu(int t, void *arg) { order_cpu[n_cpu++] = t; }
static void rec_gpu(int t, void *arg)
{
    /* The gradient handed over is final: compare it at once with the CPU's. */
    ps_mlp_t *const *pair = arg;
    order_gpu[n_gpu++] = t;
    assert_close(pair[1]->tensors[t].name, pair[0]->grads[t], pair[1]->grads[t],
                 pair[0]->tensors[t].numel, 1e-5f, 1e-3f);
}

START_TEST(test_mlp_train_step_matches_cpu)
{
    need_gpu();
    /* Batches smaller than max_batch (64 and, every fifth step, 1): the strides are the
     * layer widths, the row counts the batch's. */
    const uint32_t sizes[] = {50, 32, 16, 10}, maxb = 100;
    ps_mlp_t cpu, gpu;
    ck_assert_int_eq(ps_mlp_create(&cpu, sizes, 4, maxb), 0);
    ck_assert_int_eq(ps_mlp_create(&gpu, sizes, 4, maxb), 0);
    char err[256];
    ck_assert_int_eq(ps_mlp_use_gpu(&gpu, 0, err, sizeof err), 0);
    ck_assert_int_eq(ps_mlp_use_gpu(&gpu, 0, err, sizeof err), PS_EINVAL); /* already there */
    ps_mlp_init_params(&cpu, 3);
    ps_mlp_init_params(&gpu, 3);
    float *x = malloc((size_t)maxb * sizes[0] * 4);
    uint8_t y[100];
    uint64_t s = 9;
    ps_mlp_t *pair[2] = {&gpu, &cpu};
    /* Twenty SGD steps on both: the same losses and gradients along the way, within fp32. */
    for (int step = 0; step < 20; step++) {
        uint32_t B = step % 5 == 4 ? 1 : 64;
        fill(x, (size_t)B * sizes[0], 1.0f, &s);
        for (uint32_t i = 0; i < B; i++)
            y[i] = (uint8_t)(rng_next(&s) % 10);
        n_cpu = n_gpu = 0;
        float lc = ps_mlp_train_step(&cpu, x, y, B, rec_cpu, NULL);
        float lg = ps_mlp_train_step(&gpu, x, y, B, rec_gpu, pair);
        ck_assert_msg(gpu.gpu_rc == 0, "%s", gpu.gpu_err);
        ck_assert_msg(fabsf(lg - lc) <= 1e-5f * fabsf(lc), "step %d: loss %.9g on the device, "
                      "%.9g on the CPU", step, lg, lc);
        ck_assert_int_eq(n_gpu, cpu.ntensors);
        ck_assert_int_eq(n_cpu, n_gpu);
        ck_assert_mem_eq(order_cpu, order_gpu, sizeof(int) * (size_t)n_cpu);
        for (size_t i = 0; i < cpu.nparams; i++) {
            cpu.params[0][i] -= 0.1f * cpu.grads[0][i];
            gpu.params[0][i] -= 0.1f * gpu.grads[0][i];
        }
    }
    assert_close("parameters after 20 steps", gpu.params[0], cpu.params[0], cpu.nparams, 1e-4f,
                 1e-3f);
    free(x);
    ps_mlp_destroy(&cpu);
    ps_mlp_destroy(&gpu);
}
END_TEST

START_TEST(test_mlp_eval_matches_cpu)
{
    need_gpu();
    /* More samples than max_batch, so eval runs in slices on the device too. Each sample is
     * labelled with the class the CPU model predicts for it alone, so the CPU counts all n and
     * the device must agree on each (give or take a near tie). */
    const uint32_t sizes[] = {20, 24, 10}, n = 1000;
    ps_mlp_t cpu, gpu;
    ck_assert_int_eq(ps_mlp_create(&cpu, sizes, 3, 128), 0);
    ck_assert_int_eq(ps_mlp_create(&gpu, sizes, 3, 128), 0);
    char err[256];
    ck_assert_int_eq(ps_mlp_use_gpu(&gpu, 0, err, sizeof err), 0);
    ps_mlp_init_params(&cpu, 4);
    ps_mlp_init_params(&gpu, 4);
    float *x = malloc((size_t)n * sizes[0] * 4);
    uint8_t *y = malloc(n);
    uint64_t s = 21;
    fill(x, (size_t)n * sizes[0], 2.0f, &s);
    for (uint32_t i = 0; i < n; i++) {
        int hits = 0;
        for (uint8_t c = 0; c < 10 && !hits; c++)
            if (ps_mlp_eval(&cpu, x + (size_t)i * sizes[0], &c, 1) == 1) {
                y[i] = c;
                hits = 1;
            }
        ck_assert(hits);
    }
    uint32_t c = ps_mlp_eval(&cpu, x, y, n), d = ps_mlp_eval(&gpu, x, y, n);
    ck_assert_msg(gpu.gpu_rc == 0, "%s", gpu.gpu_err);
    ck_assert_uint_eq(c, n);
    ck_assert_msg(d + 3 >= n, "the device got %u of %u right", d, n);
    free(x);
    free(y);
    ps_mlp_destroy(&cpu);
    ps_mlp_destroy(&gpu);
}
END_TEST

/* grads_stay: a staying tensor's gradient is not downloaded (its host copy keeps what it
 * held), and its device copy is final when its callback runs (psworker encodes it there). */
static float stay_got[16 * 8];
static void rec_stay(int t, void *arg)
{
    ps_mlp_t *m = arg;
    if (t == 0)
        host_copy(stay_got, ps_mlp_device_grad(m, 0), m->tensors[0].numel * sizeof(float));
}

START_TEST(test_grads_stay_on_device)
{
    need_gpu();
    const uint32_t sizes[] = {16, 8, 4}, B = 5;
    ps_mlp_t cpu, gpu;
    ck_assert_int_eq(ps_mlp_create(&cpu, sizes, 3, B), 0);
    ck_assert_int_eq(ps_mlp_create(&gpu, sizes, 3, B), 0);
    char err[256];
    ck_assert_int_eq(ps_mlp_use_gpu(&gpu, 0, err, sizeof err), 0);
    ck_assert_ptr_null(ps_mlp_device_grad(&cpu, 0));
    ps_mlp_init_params(&cpu, 8);
    ps_mlp_init_params(&gpu, 8);
    float x[5 * 16];
    uint8_t y[5] = {0, 1, 2, 3, 1};
    uint64_t s = 4;
    fill(x, sizeof x / sizeof x[0], 1.0f, &s);
    gpu.grads_stay = 1; /* tensor 0, fc1.weight */
    for (size_t i = 0; i < gpu.tensors[0].numel; i++)
        gpu.grads[0][i] = 1234.0f;
    ps_mlp_train_step(&cpu, x, y, B, NULL, NULL);
    ps_mlp_train_step(&gpu, x, y, B, rec_stay, &gpu);
    ck_assert_msg(gpu.gpu_rc == 0, "%s", gpu.gpu_err);
    for (size_t i = 0; i < gpu.tensors[0].numel; i++)
        ck_assert_msg(gpu.grads[0][i] == 1234.0f, "the staying gradient was downloaded");
    assert_close("the device gradient at its callback", stay_got, cpu.grads[0],
                 cpu.tensors[0].numel, 1e-5f, 1e-3f);
    assert_close("a downloaded gradient", gpu.grads[1], cpu.grads[1], cpu.tensors[1].numel,
                 1e-5f, 1e-3f);
    ps_mlp_destroy(&cpu);
    ps_mlp_destroy(&gpu);
}
END_TEST

START_TEST(test_no_such_device)
{
    need_gpu();
    int n = psk_gpu_count(NULL);
    ck_assert_int_ge(n, 1);
    const uint32_t sizes[] = {4, 3};
    ps_mlp_t m;
    ck_assert_int_eq(ps_mlp_create(&m, sizes, 2, 2), 0);
    char err[256] = "";
    ck_assert_int_eq(ps_mlp_use_gpu(&m, n, err, sizeof err), PS_ENOTSUP);
    ck_assert_msg(strstr(err, "does not exist") != NULL, "%s", err);
    ck_assert_ptr_null(m.gpu);
    ps_mlp_destroy(&m);
}
END_TEST

#ifdef PSK_GPU_EMU
void psk_gpu_emu_fail_alloc(int nth);
int psk_gpu_emu_live(void);

START_TEST(test_use_gpu_out_of_memory)
{
    /* Each of ps_mlp_use_gpu's five device allocations failing in turn: PS_ENOMEM naming what
     * it was for, nothing left allocated, and the model still on the CPU, training as before. */
    const uint32_t sizes[] = {6, 9, 4}, B = 8;
    float x[8 * 6];
    uint8_t y[8];
    uint64_t s = 3;
    fill(x, sizeof x / sizeof x[0], 1.0f, &s);
    for (uint32_t i = 0; i < B; i++)
        y[i] = (uint8_t)(rng_next(&s) % 4);
    for (int nth = 1; nth <= 5; nth++) {
        ps_mlp_t m, ref;
        ck_assert_int_eq(ps_mlp_create(&m, sizes, 3, B), 0);
        ck_assert_int_eq(ps_mlp_create(&ref, sizes, 3, B), 0);
        ps_mlp_init_params(&m, 1);
        ps_mlp_init_params(&ref, 1);
        int live = psk_gpu_emu_live();
        char err[256] = "";
        psk_gpu_emu_fail_alloc(nth);
        ck_assert_int_eq(ps_mlp_use_gpu(&m, 0, err, sizeof err), PS_ENOMEM);
        ck_assert_msg(strstr(err, "cannot allocate the model's") != NULL, "%s", err);
        ck_assert_ptr_null(m.gpu);
        ck_assert_int_eq(psk_gpu_emu_live(), live);
        ck_assert(ps_mlp_train_step(&m, x, y, B, NULL, NULL) ==
                  ps_mlp_train_step(&ref, x, y, B, NULL, NULL));
        ck_assert_mem_eq(m.grads[0], ref.grads[0], m.nparams * sizeof(float));
        ps_mlp_destroy(&m);
        ps_mlp_destroy(&ref);
    }
    /* And a model on the device gives all of it back. */
    ps_mlp_t m;
    int live = psk_gpu_emu_live();
    ck_assert_int_eq(ps_mlp_create(&m, sizes, 3, B), 0);
    char err[256];
    ck_assert_int_eq(ps_mlp_use_gpu(&m, 0, err, sizeof err), 0);
    ck_assert_int_eq(psk_gpu_emu_live(), live + 5);
    ps_mlp_destroy(&m);
    ck_assert_int_eq(psk_gpu_emu_live(), live);
}
END_TEST
#endif

const char *ps_test_setup(SRunner *sr)
{
    static char why[512];
    const char *reason = NULL;
    if (psk_gpu_count(&reason) == 0) {
        const char *req = getenv("PSD_REQUIRE_GPU");
        if (req == NULL || strcmp(req, "1") != 0) {
            snprintf(why, sizeof why, "no GPU: %s", reason);
            return why;
        }
        /* On a machine that has one: not finding it is a failure of every case. */
        snprintf(open_err, sizeof open_err, "PSD_REQUIRE_GPU=1 but no GPU: %s", reason);
        srunner_set_fork_status(sr, CK_NOFORK);
        return NULL;
    }
    (void)psk_gpu_open(&g, 0, open_err, sizeof open_err);
    srunner_set_fork_status(sr, CK_NOFORK);
    return NULL;
}

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("gpu");
    TCase *tc = tcase_create("twins");
    tcase_add_test(tc, test_sgemm_matches_cblas);
    tcase_add_test(tc, test_mlp_ops_match_reference);
    tcase_add_test(tc, test_codecs_match_reference);
    tcase_add_test(tc, test_mlp_train_step_matches_cpu);
    tcase_add_test(tc, test_mlp_eval_matches_cpu);
    tcase_add_test(tc, test_no_such_device);
    tcase_add_test(tc, test_grads_stay_on_device);
#ifdef PSK_GPU_EMU
    tcase_add_test(tc, test_use_gpu_out_of_memory);
#endif
    suite_add_tcase(s, tc);
    return s;
}
