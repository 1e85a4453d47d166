/* optim.c: CPU reference for the optimizer updates, learning-rate schedule and gradient sum. */
#include "optim.h"
#include "optim_impl.h"

#include <assert.h>
#include <math.h>
#include <string.h>

/*
 * The loops themselves are in optim_body.h; this file compiles them for baseline x86-64 (the
 * reference, and the only body elsewhere), and psk_optim_apply_strided_cpu() runs the AVX2
 * build of the same source (optim_avx2.c) where the CPU has it. Both give the same bits.
 */
#define PSK_OPTIM_SUFFIX base
#include "optim_body.h"

int psk_optim_state_count(psk_optim_kind_t kind)
{
    switch (kind) {
    case PSK_SGD:
    case PSK_MEAN:
        return 0;
    case PSK_MOMENTUM:
    case PSK_ADAGRAD:
        return 1;
    case PSK_ADAM:
    case PSK_ADAMW:
        return 2;
    }
    return -1; /* not a psk_optim_kind_t: a programmer error the caller asserts on */
}

const char *psk_optim_state_name(psk_optim_kind_t kind)
{
    switch (kind) {
    case PSK_SGD:
        return "none";
    case PSK_MEAN:
        return "mean gradients, no model";
    case PSK_MOMENTUM:
        return "momentum velocity";
    case PSK_ADAM:
    case PSK_ADAMW:
        return "adam moments";
    case PSK_ADAGRAD:
        return "adagrad squared-gradient sums";
    }
    return NULL;
}

void psk_optim_state_init_cpu(float *s, size_t n, const psk_optim_t *o)
{
    int k = psk_optim_state_count(o->kind);
    assert(k >= 0);
    float v = o->kind == PSK_ADAGRAD ? o->initial_accumulator : 0.0f;
    for (size_t i = 0; i < (size_t)k * n; i++)
        s[i] = v;
}

void psk_optim_apply_cpu(float *p_out, float *s_out, const float *p_in, const float *s_in,
                         const float *grad, float grad_scale, size_t n, uint64_t t,
                         const psk_optim_t *o)
{
    psk_optim_apply_strided_cpu(p_out, s_out, p_in, s_in, grad, grad_scale, n, n, t, o);
}

int psk__optim_body_available(psk__optim_body_t body)
{
    switch (body) {
    case PSK__OPTIM_BASE:
        return 1;
    case PSK__OPTIM_AVX2:
#ifdef PSK_HAVE_OPTIM_AVX2
        __builtin_cpu_init();
        /* libgcc's avx2 bit also requires the OS to save the YMM registers (XGETBV). */
        return __builtin_cpu_supports("avx2") != 0;
#else
        return 0;
#endif
    }
    return 0;
}

psk__optim_body_t psk__optim_body_chosen(void)
{
    /* Chosen once; store threads may race to choose, with the same answer (relaxed atomics). */
    static int chosen = -1;
    int c = __atomic_load_n(&chosen, __ATOMIC_RELAXED);
    if (c < 0) {
        c = psk__optim_body_available(PSK__OPTIM_AVX2) ? PSK__OPTIM_AVX2 : PSK__OPTIM_BASE;
        __atomic_store_n(&chosen, c, __ATOMIC_RELAXED);
    }
    return (psk__optim_body_t)c;
}

void psk_optim_apply_strided_cpu(float *p_out, float *s_out, const float *p_in,
                                 const float *s_in, const float *grad, float grad_scale,
                                 size_t n, size_t stride, uint64_t t, const psk_optim_t *o)
{
    psk__optim_apply_body(psk__optim_body_chosen(), p_out, s_out, p_in, s_in, grad, grad_scale,
                          n, stride, t, o);
}

void psk__optim_apply_body(psk__optim_body_t body, float *p_out, float *s_out, const float *p_in,
                           const float *s_in, const float *grad, float grad_scale, size_t n,
                           size_t stride, uint64_t t, const psk_optim_t *o)
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

    psk__optim_loop_t a = {.kind = o->kind, .in_place = in_place, .p_out = p_out, .s_out = s_out,
                           .p_in = p_in, .s_in = s_in, .grad = grad, .n = n, .stride = stride,
                           .scale = grad_scale, .lr = o->lr, .wd = o->weight_decay,
                           .mu = o->momentum, .nesterov = o->nesterov};
    if (o->kind == PSK_ADAM || o->kind == PSK_ADAMW) {
        /* Bias corrections once per call, in double: b2^t stays accurate for large t. Computed
         * here, outside the bodies, so every body gets the same constants. */
        assert(t >= 1);
        double bc1 = 1.0 - pow((double)o->beta1, (double)t);
        double bc2 = 1.0 - pow((double)o->beta2, (double)t);
        float step_size = (float)((double)o->lr / bc1);
        float bc2_sqrt = (float)sqrt(bc2);
        int decoupled = o->kind == PSK_ADAMW;
        float l2 = decoupled ? 0.0f : o->weight_decay;
        float decay = decoupled ? 1.0f - o->lr * o->weight_decay : 1.0f;
        a.adam = (psk__adam_k_t){.scale = grad_scale, .l2 = l2, .decay = decay, .b1 = o->beta1,
                                 .b2 = o->beta2, .one_b1 = 1.0f - o->beta1,
                                 .one_b2 = 1.0f - o->beta2, .eps = o->eps,
                                 .step_size = step_size, .bc2_sqrt = bc2_sqrt};
    }
    if (o->kind == PSK_ADAGRAD) {
        /* PyTorch computes clr in double (a Python float) and applies it as a float. */
        assert(t >= 1);
        float clr = (float)((double)o->lr / (1.0 + (double)(t - 1) * (double)o->lr_decay));
        a.adagrad = (psk__adagrad_k_t){
            .scale = grad_scale, .wd = o->weight_decay, .clr = clr, .eps = o->eps};
    }

    switch (body) {
    case PSK__OPTIM_BASE:
        psk__optim_loop_base(&a);
        return;
    case PSK__OPTIM_AVX2:
#ifdef PSK_HAVE_OPTIM_AVX2
        assert(psk__optim_body_available(body));
        psk__optim_loop_avx2(&a);
        return;
#else
        break;
#endif
    }
    assert(!"psk__optim_apply_body: body not built");
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
