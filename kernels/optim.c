/* optim.c: CPU reference for the optimizer updates, learning-rate schedule and gradient sum. */
#include "optim.h"

#include <assert.h>
#include <math.h>
#include <string.h>

/*
 * Each optimizer's arithmetic is written once. The pointers are restrict-qualified, so the
 * compiler vectorizes the loops without runtime alias checks. The shards update out of place
 * (copy-on-write LMDB records), so each optimizer also has a fused old -> new loop over the
 * same per-element function (psbench measured the copy-first version at 32% of an apply's
 * samples in memmove).
 *
 * What the compiler needs: GCC 12 at -O2 uses the very-cheap vectorizer cost model, which
 * skips loops of unknown length (-fvect-cost-model=cheap or -O3 lifts that), and Adam's
 * sqrtf vectorizes only with -fno-math-errno; neither changes a result.
 */

/* SGD, one element: p - lr * (grad * scale + wd * p). */
static inline __attribute__((always_inline)) void sgd_elem(float p, float gr, float scale,
                                                             float lr, float wd, float *po)
{
    float g = gr * scale + wd * p;
    *po = p - lr * g;
}

/* In place on p[n]. */
static void sgd_step(float *restrict p, const float *restrict grad, size_t n, float scale,
                     float lr, float wd)
{
    for (size_t i = 0; i < n; i++)
        sgd_elem(p[i], grad[i], scale, lr, wd, &p[i]);
}

/* Old p[n] -> new po[n] in one pass (disjoint buffers). */
static void sgd_step_oop(float *restrict po, const float *restrict p, const float *restrict grad,
                         size_t n, float scale, float lr, float wd)
{
    for (size_t i = 0; i < n; i++)
        sgd_elem(p[i], grad[i], scale, lr, wd, &po[i]);
}

/*
 * PyTorch SGD with momentum mu and dampening 0; v[n] starts at zero, so step 1 gives v = g
 * as PyTorch's first-step buffer does.
 *   g = grad * scale + wd * p;  v = mu * v + g;  p -= lr * (nesterov ? g + mu * v : v)
 */
static inline __attribute__((always_inline)) void momentum_elem(float p, float v, float gr,
                                                                  float scale, float lr, float wd,
                                                                  float mu, int nesterov,
                                                                  float *po, float *vo)
{
    float g = gr * scale + wd * p;
    float vi = mu * v + g;
    *vo = vi;
    *po = p - lr * (nesterov ? g + mu * vi : vi);
}

static void momentum_step(float *restrict p, float *restrict v, const float *restrict grad,
                          size_t n, float scale, float lr, float wd, float mu, int nesterov)
{
    for (size_t i = 0; i < n; i++)
        momentum_elem(p[i], v[i], grad[i], scale, lr, wd, mu, nesterov, &p[i], &v[i]);
}

static void momentum_step_oop(float *restrict po, float *restrict vo, const float *restrict p,
                              const float *restrict v, const float *restrict grad, size_t n,
                              float scale, float lr, float wd, float mu, int nesterov)
{
    for (size_t i = 0; i < n; i++)
        momentum_elem(p[i], v[i], grad[i], scale, lr, wd, mu, nesterov, &po[i], &vo[i]);
}

/*
 * Adam and AdamW on p[n], m[n], v[n]. l2 is Adam's weight decay (added to the gradient);
 * decay is AdamW's decoupled factor (1 - lr * wd) applied to p before the update. The
 * caller passes l2 = 0 for AdamW and decay = 1 for Adam, so both are exact no-ops.
 * As in PyTorch's single-tensor Adam:
 *   m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g * g
 *   p -= step_size * m / (sqrt(v) / bc2_sqrt + eps)
 * with step_size = lr / (1 - b1^t) and bc2_sqrt = sqrt(1 - b2^t), which equals
 * p -= lr * mhat / (sqrt(vhat) + eps).
 */
typedef struct {
    float scale, l2, decay, b1, b2, one_b1, one_b2, eps, step_size, bc2_sqrt;
} adam_k_t;

/* One element: (p, m, v) -> (*po, *mo, *vo). Written once, used by both loops below. */
static inline __attribute__((always_inline)) void adam_elem(float p, float m, float v, float gr,
                                                              const adam_k_t *k, float *po,
                                                              float *mo, float *vo)
{
    float g = gr * k->scale + k->l2 * p;
    float mi = k->b1 * m + k->one_b1 * g;
    float vi = k->b2 * v + k->one_b2 * g * g;
    *mo = mi;
    *vo = vi;
    *po = p * k->decay - k->step_size * mi / (sqrtf(vi) / k->bc2_sqrt + k->eps);
}

/* In place: p[n], m[n], v[n] updated where they are. */
static void adam_step(float *restrict p, float *restrict m, float *restrict v,
                      const float *restrict grad, size_t n, const adam_k_t *k)
{
    for (size_t i = 0; i < n; i++)
        adam_elem(p[i], m[i], v[i], grad[i], k, &p[i], &m[i], &v[i]);
}

/* Old -> new in one pass (the shards' copy-on-write records): no copy first, every array read
 * and written once. The two sets must not overlap. */
static void adam_step_oop(float *restrict po, float *restrict mo, float *restrict vo,
                          const float *restrict p, const float *restrict m,
                          const float *restrict v, const float *restrict grad, size_t n,
                          const adam_k_t *k)
{
    for (size_t i = 0; i < n; i++)
        adam_elem(p[i], m[i], v[i], grad[i], k, &po[i], &mo[i], &vo[i]);
}

int psk_optim_state_count(psk_optim_kind_t kind)
{
    switch (kind) {
    case PSK_SGD:
        return 0;
    case PSK_MOMENTUM:
        return 1;
    case PSK_ADAM:
    case PSK_ADAMW:
        return 2;
    }
    return -1; /* not a psk_optim_kind_t: a programmer error the caller asserts on */
}

void psk_optim_apply_cpu(float *p_out, float *s_out, const float *p_in, const float *s_in,
                         const float *grad, float grad_scale, size_t n, uint64_t t,
                         const psk_optim_t *o)
{
    psk_optim_apply_strided_cpu(p_out, s_out, p_in, s_in, grad, grad_scale, n, n, t, o);
}

void psk_optim_apply_strided_cpu(float *p_out, float *s_out, const float *p_in,
                                 const float *s_in, const float *grad, float grad_scale,
                                 size_t n, size_t stride, uint64_t t, const psk_optim_t *o)
{
    int k = psk_optim_state_count(o->kind);
    assert(k >= 0);
    assert(k == 0 || (s_out != NULL && s_in != NULL));

    /* The fused loops need two disjoint sets; a call sharing only one buffer copies the
     * other set's old values over first and runs in place. */
    int in_place = p_out == p_in || (k > 0 && s_out == s_in);
    if (in_place) {
        if (p_out != p_in)
            memmove(p_out, p_in, n * sizeof(float));
        for (int c = 0; c < k && s_out != s_in; c++)
            memmove(s_out + (size_t)c * stride, s_in + (size_t)c * stride, n * sizeof(float));
    }

    switch (o->kind) {
    case PSK_SGD:
        if (in_place)
            sgd_step(p_out, grad, n, grad_scale, o->lr, o->weight_decay);
        else
            sgd_step_oop(p_out, p_in, grad, n, grad_scale, o->lr, o->weight_decay);
        break;
    case PSK_MOMENTUM:
        if (in_place)
            momentum_step(p_out, s_out, grad, n, grad_scale, o->lr, o->weight_decay, o->momentum,
                          o->nesterov);
        else
            momentum_step_oop(p_out, s_out, p_in, s_in, grad, n, grad_scale, o->lr,
                              o->weight_decay, o->momentum, o->nesterov);
        break;
    case PSK_ADAM:
    case PSK_ADAMW: {
        /* Bias corrections once per call, in double: b2^t stays accurate for large t. */
        assert(t >= 1);
        double bc1 = 1.0 - pow((double)o->beta1, (double)t);
        double bc2 = 1.0 - pow((double)o->beta2, (double)t);
        float step_size = (float)((double)o->lr / bc1);
        float bc2_sqrt = (float)sqrt(bc2);
        int decoupled = o->kind == PSK_ADAMW;
        float l2 = decoupled ? 0.0f : o->weight_decay;
        float decay = decoupled ? 1.0f - o->lr * o->weight_decay : 1.0f;
        adam_k_t ak = {.scale = grad_scale, .l2 = l2, .decay = decay, .b1 = o->beta1,
                       .b2 = o->beta2, .one_b1 = 1.0f - o->beta1, .one_b2 = 1.0f - o->beta2,
                       .eps = o->eps, .step_size = step_size, .bc2_sqrt = bc2_sqrt};
        if (in_place)
            adam_step(p_out, s_out, s_out + stride, grad, n, &ak);
        else
            adam_step_oop(p_out, s_out, s_out + stride, p_in, s_in, s_in + stride, grad, n, &ak);
        break;
    }
    }
}

float psk_lr_at(int schedule, float lr, float min_lr, uint64_t warmup_steps,
                uint64_t decay_steps, uint64_t step)
{
    static const double pi = 3.14159265358979323846;

    assert(schedule == 0 || schedule == 1);
    if (schedule == 0)
        return lr;
    /* Step 0 already trains, at lr / warmup_steps; step warmup_steps - 1 reaches lr. */
    if (step < warmup_steps)
        return (float)((double)lr * (double)(step + 1) / (double)warmup_steps);
    if (decay_steps > warmup_steps) {
        double progress = (double)(step - warmup_steps) / (double)(decay_steps - warmup_steps);
        if (progress > 1.0)
            progress = 1.0;
        return (float)(min_lr + 0.5 * ((double)lr - min_lr) * (1.0 + cos(pi * progress)));
    }
    return lr;
}

/* out[n] += in[n]. in may equal out (doubles it); partial overlap is not supported. */
void psk_add_cpu(float *out, const float *in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] += in[i];
}
