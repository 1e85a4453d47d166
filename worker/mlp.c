/* mlp.c: the built-in "mlp" model: Linear/ReLU layers and a softmax cross-entropy head, with
 * the three GEMMs of each layer done by OpenBLAS on the CPU or by cuBLAS on a CUDA device, and
 * the steps between them by kernels/mlp_ops.h (the CPU reference or its CUDA twin). */
#include "mlp.h"

#include <assert.h>
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlp_ops.h"
#include "ps/ps_client.h" /* ps_buffer_alloc */
#include "ps/ps_error.h"

/* Activation scratch layout, per layer l = 1..L (L = nlin), for B <= max_batch rows:
 *   a_l   [B, sizes[l]]   post-ReLU output of layer l (logits for l = L)
 *   dx    [B, maxw]       dy . W^T of the layer being back-propagated
 * a_l are consecutive, each max_batch * sizes[l] floats; dx follows them. During the
 * backward pass the gradient with respect to a_l overwrites a_l once a_l is no longer
 * needed, so each layer's delta lives where its activation lived. */

static size_t act_off(const ps_mlp_t *m, int l)
{
    /* l in 1..nlin; the input a_0 is the caller's x and never stored. */
    size_t off = 0;
    for (int k = 1; k < l; k++)
        off += (size_t)m->max_batch * m->sizes[k];
    return off;
}

static float *act_at(const ps_mlp_t *m, int l)
{
    return m->act + act_off(m, l);
}

static float *dx_scratch(const ps_mlp_t *m)
{
    return act_at(m, m->nlin + 1);
}

/* Floats of the activation scratch (a_1..a_L, then dx). */
static size_t act_floats(const ps_mlp_t *m)
{
    size_t maxw = 0;
    for (int l = 1; l < m->nlin; l++)
        maxw = m->sizes[l] > maxw ? m->sizes[l] : maxw;
    return act_off(m, m->nlin + 1) + maxw * m->max_batch;
}

int ps_mlp_create(ps_mlp_t *m, const uint32_t *sizes, int nsizes, uint32_t max_batch)
{
    memset(m, 0, sizeof(*m));
    if (sizes == NULL || nsizes < 2 || nsizes > PS_MLP_MAX_LAYERS + 1 || max_batch == 0)
        return PS_EINVAL;
    /* OpenBLAS takes int dimensions. */
    if (max_batch > INT_MAX)
        return PS_EINVAL;
    for (int i = 0; i < nsizes; i++)
        if (sizes[i] == 0 || sizes[i] > INT_MAX)
            return PS_EINVAL;

    int nlin = nsizes - 1;
    size_t nparams = 0, nact = 0, maxw = 0;
    for (int l = 1; l <= nlin; l++) {
        size_t in = sizes[l - 1], out = sizes[l];
        /* Reject sizes whose products would not fit the size_t arithmetic below. */
        if (in * out / out != in || nparams + in * out + out < nparams)
            return PS_EINVAL;
        nparams += in * out + out;
        nact += out;
        if (l < nlin && out > maxw)
            maxw = out; /* dx of layer l+1 has width sizes[l]; dx of layer 1 is not needed */
    }
    nact += maxw;
    if (nparams > SIZE_MAX / (2 * sizeof(float)) || nact > SIZE_MAX / sizeof(float) / max_batch)
        return PS_EINVAL;

    /* params then grads, each contiguous, in one zeroed allocation that moves to and from
     * the shards cheaply (2 MiB pages when large). */
    float *mem = ps_buffer_alloc(2 * nparams * sizeof(float));
    float *act = malloc(nact * max_batch * sizeof(float));
    double *loss = malloc(max_batch * sizeof(double));
    if (mem == NULL || act == NULL || loss == NULL) {
        free(act);
        free(loss);
        ps_buffer_free(mem, 2 * nparams * sizeof(float));
        return PS_ENOMEM;
    }

    m->nlin = nlin;
    m->ntensors = 2 * nlin;
    memcpy(m->sizes, sizes, (size_t)nsizes * sizeof(*sizes));
    m->nparams = nparams;
    m->max_batch = max_batch;
    m->mem = mem;
    m->act = act;
    m->loss = loss;

    size_t off = 0;
    for (int l = 1; l <= nlin; l++) {
        ps_mlp_tensor_t *w = &m->tensors[2 * (l - 1)];
        ps_mlp_tensor_t *b = &m->tensors[2 * (l - 1) + 1];
        snprintf(w->name, sizeof(w->name), "fc%d.weight", l);
        w->shape[0] = sizes[l - 1];
        w->shape[1] = sizes[l];
        w->ndim = 2;
        w->numel = (size_t)sizes[l - 1] * sizes[l];
        w->init = PSK_INIT_XAVIER;
        snprintf(b->name, sizeof(b->name), "fc%d.bias", l);
        b->shape[0] = sizes[l];
        b->ndim = 1;
        b->numel = sizes[l];
        b->init = PSK_INIT_ZEROS;
        for (int t = 2 * (l - 1); t <= 2 * (l - 1) + 1; t++) {
            m->params[t] = mem + off;
            m->grads[t] = mem + nparams + off;
            off += m->tensors[t].numel;
        }
    }
    return 0;
}

static void gpu_release(ps_mlp_t *m)
{
    if (m->gpu == NULL)
        return;
    psk_gpu_sync(m->gpu); /* nothing may still copy into the host memory freed next */
    psk_gpu_host_unregister(m->gpu, m->mem);
    psk_gpu_free(m->gpu, m->d_mem);
    psk_gpu_free(m->gpu, m->d_act);
    psk_gpu_free(m->gpu, m->d_x);
    psk_gpu_free(m->gpu, m->d_y);
    psk_gpu_free(m->gpu, m->d_loss);
    psk_gpu_close(m->gpu);
    m->gpu = NULL;
    m->d_mem = m->d_act = m->d_x = NULL;
    m->d_y = NULL;
    m->d_loss = NULL;
}

int ps_mlp_use_gpu(ps_mlp_t *m, int device, char *err, size_t errlen)
{
    char ignored[8];
    if (err == NULL) { /* the reason is not wanted: cut short into a scratch */
        err = ignored;
        errlen = sizeof ignored;
    }
    if (m->gpu != NULL || m->mem == NULL) {
        snprintf(err, errlen, "the model is already on a device, or was not created");
        return PS_EINVAL;
    }
    int rc = psk_gpu_open(&m->gpu, device, err, errlen);
    if (rc)
        return rc;
    const char *what = "parameters and gradients";
    rc = psk_gpu_alloc(m->gpu, (void **)&m->d_mem, 2 * m->nparams * sizeof(float));
    if (!rc) {
        what = "activations";
        rc = psk_gpu_alloc(m->gpu, (void **)&m->d_act, act_floats(m) * sizeof(float));
    }
    if (!rc) {
        what = "the batch";
        rc = psk_gpu_alloc(m->gpu, (void **)&m->d_x,
                           (size_t)m->max_batch * m->sizes[0] * sizeof(float));
    }
    if (!rc)
        rc = psk_gpu_alloc(m->gpu, (void **)&m->d_y, m->max_batch);
    if (!rc)
        rc = psk_gpu_alloc(m->gpu, (void **)&m->d_loss, m->max_batch * sizeof(double));
    if (rc) {
        snprintf(err, errlen, "%s: cannot allocate the model's %s on the device: %s",
                 psk_gpu_name(m->gpu), what, psk_gpu_last_error(m->gpu));
        gpu_release(m);
        return rc;
    }
    /* Pinned, the per-step copies run at the bus's speed; unpinned they still work. */
    (void)psk_gpu_host_register(m->gpu, m->mem, 2 * m->nparams * sizeof(float));
    m->gpu_rc = 0;
    m->gpu_err[0] = '\0';
    return 0;
}

void ps_mlp_destroy(ps_mlp_t *m)
{
    if (m == NULL)
        return;
    gpu_release(m);
    free(m->act);
    free(m->loss);
    ps_buffer_free(m->mem, 2 * m->nparams * sizeof(float));
    memset(m, 0, sizeof(*m));
}

void ps_mlp_init_params(ps_mlp_t *m, uint64_t seed)
{
    for (int t = 0; t < m->ntensors; t++) {
        const ps_mlp_tensor_t *ti = &m->tensors[t];
        psk_init_t init = {
            .kind = ti->init,
            .arg = 0.0f,
            .seed = psk_init_seed(ti->name, seed),
            .fan_in = ti->shape[0],
            .fan_out = ti->ndim > 1 ? ti->shape[1] : 1,
        };
        psk_init_cpu(m->params[t], ti->numel, 0, &init);
    }
}

/* Forward pass of B rows; returns the logits [B, sizes[nlin]] (in the scratch). */
static float *forward(ps_mlp_t *m, const float *x, uint32_t B)
{
    const float *in_act = x;
    float *out_act = NULL;
    for (int l = 1; l <= m->nlin; l++) {
        int in = (int)m->sizes[l - 1], out = (int)m->sizes[l];
        const float *W = m->params[2 * (l - 1)];     /* [in, out] */
        const float *b = m->params[2 * (l - 1) + 1]; /* [out] */
        out_act = act_at(m, l);                      /* [B, out] */

        /* y = b (broadcast over rows), then y += x . W */
        psk_bias_rows_cpu(out_act, b, B, (uint32_t)out);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)B, out, in, 1.0f, in_act,
                    in, W, out, 1.0f, out_act, out);
        if (l < m->nlin)
            psk_relu_cpu(out_act, (size_t)B * out);
        in_act = out_act;
    }
    return out_act;
}

/* ---- the same passes on the device (m->gpu) ----
 * Device pointers mirror the host layout: d_mem holds params then grads at the offsets of
 * mem, d_act the activations at the offsets of act. Each device call goes through GPU(): once
 * one failed (gpu_rc, gpu_err), no later one is made until the caller saw it; a pass that
 * stops waits for what it queued before it returns (the host memory it copies from or into is
 * the caller's again then). */

static float *dev_of(const ps_mlp_t *m, const float *host)
{
    if (host >= m->mem && host < m->mem + 2 * m->nparams)
        return m->d_mem + (host - m->mem);
    return m->d_act + (host - m->act);
}

static void gpu_fail(ps_mlp_t *m, int rc, const char *what)
{
    m->gpu_rc = rc;
    /* A kernel launch's error text is the stream's, recorded by the sync. */
    if (rc == PS_EIO)
        (void)psk_gpu_sync(m->gpu);
    snprintf(m->gpu_err, sizeof m->gpu_err, "%s: %s: %s", psk_gpu_name(m->gpu), what,
             rc == PS_EIO ? psk_gpu_last_error(m->gpu) : ps_strerror(rc));
}

#define GPU(m, what, call)                                                                     \
    do {                                                                                       \
        if (!(m)->gpu_rc) {                                                                    \
            int rc_ = (call);                                                                  \
            if (rc_) gpu_fail((m), rc_, (what));                                               \
        }                                                                                      \
    } while (0)

/* A pass that stopped on a device error: wait for what it queued, then say so. */
static int gpu_stopped(ps_mlp_t *m)
{
    if (!m->gpu_rc)
        return 0;
    (void)psk_gpu_sync(m->gpu);
    return 1;
}

/* Uploads params[] and x [B, sizes[0]], then queues the forward pass; returns the device
 * logits. */
static float *forward_gpu(ps_mlp_t *m, const float *x, uint32_t B)
{
    void *st = psk_gpu_stream(m->gpu);
    GPU(m, "uploading the parameters",
        psk_gpu_upload(m->gpu, m->d_mem, m->mem, m->nparams * sizeof(float)));
    GPU(m, "uploading the batch",
        psk_gpu_upload(m->gpu, m->d_x, x, (size_t)B * m->sizes[0] * sizeof(float)));
    const float *in_act = m->d_x;
    float *out_act = NULL;
    for (int l = 1; l <= m->nlin; l++) {
        int in = (int)m->sizes[l - 1], out = (int)m->sizes[l];
        const float *W = dev_of(m, m->params[2 * (l - 1)]);
        const float *b = dev_of(m, m->params[2 * (l - 1) + 1]);
        out_act = dev_of(m, act_at(m, l));
        GPU(m, "bias", psk_bias_rows_cuda(out_act, b, B, (uint32_t)out, st));
        GPU(m, "forward sgemm", psk_gpu_sgemm(m->gpu, false, false, (int)B, out, in, 1.0f,
                                              in_act, in, W, out, 1.0f, out_act, out));
        if (l < m->nlin)
            GPU(m, "relu", psk_relu_cuda(out_act, (size_t)B * out, st));
        in_act = out_act;
    }
    return out_act;
}

static float train_step_gpu(ps_mlp_t *m, const float *x, const uint8_t *y, uint32_t B,
                            ps_mlp_grad_cb cb, void *arg)
{
    void *st = psk_gpu_stream(m->gpu);
    int L = m->nlin;
    uint32_t C = m->sizes[L];
    GPU(m, "uploading the labels", psk_gpu_upload(m->gpu, m->d_y, y, B));
    float *z = forward_gpu(m, x, B);
    GPU(m, "softmax", psk_softmax_xent_cuda(z, m->d_y, B, C, m->d_loss, st));

    float *dy = z;
    float *dx = dev_of(m, dx_scratch(m));
    for (int l = L; l >= 1 && !m->gpu_rc; l--) {
        int in = (int)m->sizes[l - 1], out = (int)m->sizes[l];
        int tw = 2 * (l - 1), tb = tw + 1;
        const float *xin = l > 1 ? dev_of(m, act_at(m, l - 1)) : m->d_x;
        const float *W = dev_of(m, m->params[tw]);
        float *dW = dev_of(m, m->grads[tw]), *db = dev_of(m, m->grads[tb]);
        GPU(m, "weight gradient sgemm", psk_gpu_sgemm(m->gpu, true, false, in, out, (int)B,
                                                      1.0f, xin, in, dy, out, 0.0f, dW, out));
        GPU(m, "bias gradient", psk_colsum_cuda(db, dy, B, (uint32_t)out, st));
        if (l > 1) { /* the delta of layer l-1, queued before the copies are waited for */
            float *a = dev_of(m, act_at(m, l - 1));
            GPU(m, "delta sgemm", psk_gpu_sgemm(m->gpu, false, true, (int)B, in, out, 1.0f, dy,
                                                out, W, out, 0.0f, dx, in));
            GPU(m, "relu backward", psk_relu_back_cuda(a, dx, (size_t)B * in, st));
            dy = a;
        }
        if (!(m->grads_stay >> tw & 1))
            GPU(m, "downloading a gradient", psk_gpu_download(m->gpu, m->grads[tw], dW,
                                                  m->tensors[tw].numel * sizeof(float)));
        if (!(m->grads_stay >> tb & 1))
            GPU(m, "downloading a gradient", psk_gpu_download(m->gpu, m->grads[tb], db,
                                                  m->tensors[tb].numel * sizeof(float)));
        GPU(m, "backward pass", psk_gpu_sync(m->gpu));
        if (!m->gpu_rc && cb != NULL) {
            cb(tw, arg);
            cb(tb, arg);
        }
    }
    /* The loss last: a copy into pageable memory waits for the stream, and here nothing is
     * queued behind it. */
    GPU(m, "downloading the loss", psk_gpu_download(m->gpu, m->loss, m->d_loss,
                                                    B * sizeof(double)));
    GPU(m, "the loss", psk_gpu_sync(m->gpu));
    if (gpu_stopped(m))
        return NAN;
    double loss = 0.0;
    for (uint32_t i = 0; i < B; i++)
        loss += m->loss[i];
    return (float)(loss / B);
}

float *ps_mlp_device_grad(const ps_mlp_t *m, int t)
{
    return m->gpu != NULL ? dev_of(m, m->grads[t]) : NULL;
}

float ps_mlp_train_step(ps_mlp_t *m, const float *x, const uint8_t *y, uint32_t B,
                        ps_mlp_grad_cb cb, void *arg)
{
    assert(B >= 1 && B <= m->max_batch);
    if (m->gpu != NULL)
        return train_step_gpu(m, x, y, B, cb, arg);
    int L = m->nlin;
    int C = (int)m->sizes[L];
    float *z = forward(m, x, B); /* [B, C] logits */

    /* Softmax cross-entropy; z becomes d(mean loss)/dz in place. */
    psk_softmax_xent_cpu(z, y, B, (uint32_t)C, m->loss);
    double loss = 0.0;
    for (uint32_t i = 0; i < B; i++)
        loss += m->loss[i];

    /* Backward, last layer first. dy is the delta of layer l's output. */
    float *dy = z;
    float *dx = dx_scratch(m);
    for (int l = L; l >= 1; l--) {
        int in = (int)m->sizes[l - 1], out = (int)m->sizes[l];
        int tw = 2 * (l - 1), tb = tw + 1;
        const float *xin = l > 1 ? act_at(m, l - 1) : x; /* [B, in] */
        const float *W = m->params[tw];                  /* [in, out] */

        /* dW [in, out] = x^T . dy */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, (int)B, 1.0f, xin, in, dy,
                    out, 0.0f, m->grads[tw], out);
        /* db [out] = sum over rows of dy */
        psk_colsum_cpu(m->grads[tb], dy, B, (uint32_t)out);
        if (cb != NULL) {
            cb(tw, arg);
            cb(tb, arg);
        }
        if (l == 1)
            break;

        /* dx [B, in] = dy . W^T, then through the ReLU: the delta of a_{l-1} replaces
         * a_{l-1} (dW above was its last use). a > 0 exactly where the ReLU input was. */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)B, in, out, 1.0f, dy, out, W,
                    out, 0.0f, dx, in);
        float *a = act_at(m, l - 1);
        psk_relu_back_cpu(a, dx, (size_t)B * in);
        dy = a;
    }
    return (float)(loss / B);
}

uint32_t ps_mlp_eval(ps_mlp_t *m, const float *x, const uint8_t *y, uint32_t n)
{
    int C = (int)m->sizes[m->nlin];
    size_t dim = m->sizes[0];
    uint32_t correct = 0;
    for (uint32_t start = 0; start < n; start += m->max_batch) {
        uint32_t B = n - start < m->max_batch ? n - start : m->max_batch;
        const float *z;
        if (m->gpu != NULL) {
            /* The logits come back into their host twin's place in the scratch. */
            float *host = act_at(m, m->nlin), *dz = forward_gpu(m, x + (size_t)start * dim, B);
            GPU(m, "downloading the logits",
                psk_gpu_download(m->gpu, host, dz, (size_t)B * C * sizeof(float)));
            GPU(m, "evaluation", psk_gpu_sync(m->gpu));
            if (gpu_stopped(m))
                return 0;
            z = host;
        } else {
            z = forward(m, x + (size_t)start * dim, B);
        }
        for (uint32_t i = 0; i < B; i++) {
            const float *zi = z + (size_t)i * C;
            int best = 0;
            for (int j = 1; j < C; j++)
                if (zi[j] > zi[best])
                    best = j;
            correct += best == y[start + i];
        }
    }
    return correct;
}
