/* optim_body.h: the optimizer loops, included once by each translation unit that compiles them
 * for an instruction set (optim.c: baseline, the reference; optim_avx2.c: -mavx2). Define
 * PSK_OPTIM_SUFFIX (base, avx2) first; this defines psk__optim_loop_<suffix>().
 *
 * Each optimizer's arithmetic is written once. The pointers are restrict-qualified, so the
 * compiler vectorizes the loops without runtime alias checks. The shards update out of place
 * (copy-on-write LMDB records), so each optimizer also has a fused old -> new loop over the
 * same per-element function (psbench measured the copy-first version at 32% of an apply's
 * samples in memmove).
 *
 * What the compiler needs: GCC 12 at -O2 uses the very-cheap vectorizer cost model, which
 * skips loops of unknown length (-fvect-cost-model=cheap or -O3 lifts that), and Adam's
 * sqrtf vectorizes only with -fno-math-errno; neither changes a result. Every body is built
 * with -ffp-contract=off and none with FMA, so each multiply and add rounds on its own, as
 * written: the vector width alone differs between bodies, never a result.
 */
#ifndef PSK_OPTIM_SUFFIX
#error "define PSK_OPTIM_SUFFIX before including optim_body.h"
#endif

#include "optim_impl.h"

#include <math.h>

#define PSK_OPTIM_CAT2(a, b) a##b
#define PSK_OPTIM_CAT(a, b) PSK_OPTIM_CAT2(a, b)

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

/* Each loop is written once per nesterov value: with the choice inside, GCC does not vectorize
 * it ("control flow in loop"). The per-element arithmetic is the same. */
static void momentum_step(float *restrict p, float *restrict v, const float *restrict grad,
                          size_t n, float scale, float lr, float wd, float mu, int nesterov)
{
    if (nesterov)
        for (size_t i = 0; i < n; i++)
            momentum_elem(p[i], v[i], grad[i], scale, lr, wd, mu, 1, &p[i], &v[i]);
    else
        for (size_t i = 0; i < n; i++)
            momentum_elem(p[i], v[i], grad[i], scale, lr, wd, mu, 0, &p[i], &v[i]);
}

static void momentum_step_oop(float *restrict po, float *restrict vo, const float *restrict p,
                              const float *restrict v, const float *restrict grad, size_t n,
                              float scale, float lr, float wd, float mu, int nesterov)
{
    if (nesterov)
        for (size_t i = 0; i < n; i++)
            momentum_elem(p[i], v[i], grad[i], scale, lr, wd, mu, 1, &po[i], &vo[i]);
    else
        for (size_t i = 0; i < n; i++)
            momentum_elem(p[i], v[i], grad[i], scale, lr, wd, mu, 0, &po[i], &vo[i]);
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
/* One element: (p, m, v) -> (*po, *mo, *vo). Written once, used by both loops below. */
static inline __attribute__((always_inline)) void adam_elem(float p, float m, float v, float gr,
                                                              const psk__adam_k_t *k, float *po,
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
                      const float *restrict grad, size_t n, const psk__adam_k_t *k)
{
    for (size_t i = 0; i < n; i++)
        adam_elem(p[i], m[i], v[i], grad[i], k, &p[i], &m[i], &v[i]);
}

/* Old -> new in one pass (the shards' copy-on-write records): no copy first, every array read
 * and written once. The two sets must not overlap. */
static void adam_step_oop(float *restrict po, float *restrict mo, float *restrict vo,
                          const float *restrict p, const float *restrict m,
                          const float *restrict v, const float *restrict grad, size_t n,
                          const psk__adam_k_t *k)
{
    for (size_t i = 0; i < n; i++)
        adam_elem(p[i], m[i], v[i], grad[i], k, &po[i], &mo[i], &vo[i]);
}

/* No optimizer: p = grad * scale, the step's mean gradient. The old parameters are not read, in
 * place or out of place (the same loop serves both). */
static void mean_step(float *restrict po, const float *restrict grad, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        po[i] = grad[i] * scale;
}

/*
 * Adagrad on p[n], sum[n], as PyTorch's single-tensor Adagrad:
 *   g = grad * scale + wd * p;  sum += g * g;  p -= clr * g / (sqrt(sum) + eps)
 * with clr = lr / (1 + (t - 1) * lr_decay), computed once per call.
 */
static inline __attribute__((always_inline)) void
adagrad_elem(float p, float s, float gr, const psk__adagrad_k_t *k, float *po, float *so)
{
    float g = gr * k->scale + k->wd * p;
    float si = s + g * g;
    *so = si;
    *po = p - k->clr * g / (sqrtf(si) + k->eps);
}

static void adagrad_step(float *restrict p, float *restrict s, const float *restrict grad, size_t n,
                         const psk__adagrad_k_t *k)
{
    for (size_t i = 0; i < n; i++)
        adagrad_elem(p[i], s[i], grad[i], k, &p[i], &s[i]);
}

static void adagrad_step_oop(float *restrict po, float *restrict so, const float *restrict p,
                             const float *restrict s, const float *restrict grad, size_t n,
                             const psk__adagrad_k_t *k)
{
    for (size_t i = 0; i < n; i++)
        adagrad_elem(p[i], s[i], grad[i], k, &po[i], &so[i]);
}

void PSK_OPTIM_CAT(psk__optim_loop_, PSK_OPTIM_SUFFIX)(const psk__optim_loop_t *a)
{
    switch (a->kind) {
    case PSK_SGD:
        if (a->in_place)
            sgd_step(a->p_out, a->grad, a->n, a->scale, a->lr, a->wd);
        else
            sgd_step_oop(a->p_out, a->p_in, a->grad, a->n, a->scale, a->lr, a->wd);
        break;
    case PSK_MOMENTUM:
        if (a->in_place)
            momentum_step(a->p_out, a->s_out, a->grad, a->n, a->scale, a->lr, a->wd, a->mu,
                          a->nesterov);
        else
            momentum_step_oop(a->p_out, a->s_out, a->p_in, a->s_in, a->grad, a->n, a->scale,
                              a->lr, a->wd, a->mu, a->nesterov);
        break;
    case PSK_ADAM:
    case PSK_ADAMW:
        if (a->in_place)
            adam_step(a->p_out, a->s_out, a->s_out + a->stride, a->grad, a->n, &a->adam);
        else
            adam_step_oop(a->p_out, a->s_out, a->s_out + a->stride, a->p_in, a->s_in,
                          a->s_in + a->stride, a->grad, a->n, &a->adam);
        break;
    case PSK_ADAGRAD:
        if (a->in_place)
            adagrad_step(a->p_out, a->s_out, a->grad, a->n, &a->adagrad);
        else
            adagrad_step_oop(a->p_out, a->s_out, a->p_in, a->s_in, a->grad, a->n, &a->adagrad);
        break;
    case PSK_MEAN:
        mean_step(a->p_out, a->grad, a->n, a->scale);
        break;
    }
}
