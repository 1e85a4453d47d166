/* optim_impl.h: internal to kernels/ (and white-box tests). The optimizer loops are compiled
 * more than once (optim_body.h): for baseline x86-64 in optim.c, the reference, and with AVX2
 * in optim_avx2.c on x86-64; psk_optim_apply_strided_cpu() picks one at run time. Every body
 * does the same float operations in the same order per element, so results are identical. */
#ifndef PSK_OPTIM_IMPL_H
#define PSK_OPTIM_IMPL_H

#include "optim.h"

/* Adam's per-call constants (see adam_elem in optim_body.h). */
typedef struct {
    float scale, l2, decay, b1, b2, one_b1, one_b2, eps, step_size, bc2_sqrt;
} psk__adam_k_t;

/* Adagrad's per-call constants (see adagrad_elem in optim_body.h). */
typedef struct {
    float scale, wd, clr, eps;
} psk__adagrad_k_t;

/* One call's loop: the arrays as in psk_optim_apply_strided_cpu, after its copies. in_place: the
 * update runs on p_out / s_out alone (p_in and s_in are not read); otherwise p_out and s_out
 * get the new values of p_in and s_in in one pass, and the two sets do not overlap. */
typedef struct {
    psk_optim_kind_t kind;
    int in_place;
    float *p_out, *s_out;
    const float *p_in, *s_in, *grad;
    size_t n, stride;
    float scale, lr, wd, mu; /* sgd and momentum */
    int nesterov;
    psk__adam_k_t adam; /* adam and adamw */
    psk__adagrad_k_t adagrad;
} psk__optim_loop_t;

/* The compiled bodies of optim_body.h. */
void psk__optim_loop_base(const psk__optim_loop_t *a);
#ifdef PSK_HAVE_OPTIM_AVX2
void psk__optim_loop_avx2(const psk__optim_loop_t *a);
#endif

typedef enum { PSK__OPTIM_BASE = 0, PSK__OPTIM_AVX2 = 1 } psk__optim_body_t;

/** @brief 1 if @p body was built and this CPU can run it (PSK__OPTIM_BASE always), else 0. */
int psk__optim_body_available(psk__optim_body_t body);

/** @brief The body psk_optim_apply_strided_cpu() uses: the fastest available, chosen once. */
psk__optim_body_t psk__optim_body_chosen(void);

/**
 * @brief psk_optim_apply_strided_cpu() run by @p body, which must be available (asserted).
 * Same arguments, rules and results; it lets the tests compare the bodies bit for bit.
 */
void psk__optim_apply_body(psk__optim_body_t body, float *p_out, float *s_out, const float *p_in,
                           const float *s_in, const float *grad, float grad_scale, size_t n,
                           size_t stride, uint64_t t, const psk_optim_t *o);

#endif
