/* mlp.c: the built-in "mlp" model on the CPU: Linear/ReLU layers and a softmax
 * cross-entropy head, with the three GEMMs of each layer done by OpenBLAS. */
#include "mlp.h"

#include <assert.h>
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps/ps_client.h" /* ps_buffer_alloc */
#include "ps/ps_error.h"

/* Activation scratch layout, per layer l = 1..L (L = nlin), for B <= max_batch rows:
 *   a_l   [B, sizes[l]]   post-ReLU output of layer l (logits for l = L)
 *   dx    [B, maxw]       dy . W^T of the layer being back-propagated
 * a_l are consecutive, each max_batch * sizes[l] floats; dx follows them. During the
 * backward pass the gradient with respect to a_l overwrites a_l once a_l is no longer
 * needed, so each layer's delta lives where its activation lived. */

static float *act_at(const ps_mlp_t *m, int l)
{
    /* l in 1..nlin; the input a_0 is the caller's x and never stored. */
    size_t off = 0;
    for (int k = 1; k < l; k++)
        off += (size_t)m->max_batch * m->sizes[k];
    return m->act + off;
}

static float *dx_scratch(const ps_mlp_t *m)
{
    return act_at(m, m->nlin + 1);
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
    if (mem == NULL || act == NULL) {
        free(act);
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

void ps_mlp_destroy(ps_mlp_t *m)
{
    if (m == NULL)
        return;
    free(m->act);
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
        for (uint32_t i = 0; i < B; i++)
            memcpy(out_act + (size_t)i * out, b, (size_t)out * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)B, out, in, 1.0f, in_act,
                    in, W, out, 1.0f, out_act, out);
        if (l < m->nlin) {
            size_t n = (size_t)B * out;
            for (size_t i = 0; i < n; i++)
                out_act[i] = out_act[i] > 0.0f ? out_act[i] : 0.0f;
        }
        in_act = out_act;
    }
    return out_act;
}

float ps_mlp_train_step(ps_mlp_t *m, const float *x, const uint8_t *y, uint32_t B,
                        ps_mlp_grad_cb cb, void *arg)
{
    assert(B >= 1 && B <= m->max_batch);
    int L = m->nlin;
    int C = (int)m->sizes[L];
    float *z = forward(m, x, B); /* [B, C] logits */

    /* Softmax cross-entropy, stable via log-sum-exp; z becomes dloss/dz in place:
     * d(mean loss)/dz_ij = (softmax_ij - [j == y_i]) / B. */
    double loss = 0.0;
    float inv_b = 1.0f / (float)B;
    for (uint32_t i = 0; i < B; i++) {
        float *zi = z + (size_t)i * C;
        assert(y[i] < C);
        float zmax = zi[0];
        for (int j = 1; j < C; j++)
            zmax = zi[j] > zmax ? zi[j] : zmax;
        double sum = 0.0;
        for (int j = 0; j < C; j++)
            sum += exp((double)(zi[j] - zmax));
        double lse = (double)zmax + log(sum);
        loss += lse - (double)zi[y[i]];
        for (int j = 0; j < C; j++)
            zi[j] = (float)exp((double)zi[j] - lse) * inv_b;
        zi[y[i]] -= inv_b;
    }

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
        float *db = m->grads[tb];
        memcpy(db, dy, (size_t)out * sizeof(float));
        for (uint32_t i = 1; i < B; i++) {
            const float *row = dy + (size_t)i * out;
            for (int j = 0; j < out; j++)
                db[j] += row[j];
        }
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
        size_t n = (size_t)B * in;
        for (size_t i = 0; i < n; i++)
            a[i] = a[i] > 0.0f ? dx[i] : 0.0f;
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
        const float *z = forward(m, x + (size_t)start * dim, B);
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
