/* optim.h: optimizer update kernels applied by the shards (one C signature,
 * CPU reference in optim.c; the same loops built with AVX2 in optim_avx2.c, picked at run
 * time, give identical bits). Formulas follow PyTorch's SGD, Adam, AdamW and Adagrad.
 *
 * State layout per parameter element, stored after the parameters of a chunk:
 *   sgd: none; momentum: v[n]; adam/adamw: m[n] then v[n]; adagrad: sum[n] (of squared
 *   gradients); mean: none.
 *
 * PSK_MEAN is the server that only aggregates (as BytePS's summation servers do): a step's new
 * "parameters" are the step's summed gradient times grad_scale (1/workers: the mean), and the
 * workers run their own optimizer on what they pull. It reads no old parameters, so it is also
 * the cheapest update a shard can make. */
#ifndef PSK_OPTIM_H
#define PSK_OPTIM_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    PSK_SGD = 0,
    PSK_MOMENTUM = 1,
    PSK_ADAM = 2,
    PSK_ADAMW = 3,
    PSK_ADAGRAD = 4,
    PSK_MEAN = 5 /* no optimizer: the new params are the gradient's mean, grad * grad_scale */
} psk_optim_kind_t;

#define PSK_OPTIM_KINDS 6 /* psk_optim_kind_t values: 0 .. PSK_OPTIM_KINDS - 1 */

typedef struct {
    psk_optim_kind_t kind;
    float lr;           /* the learning rate for this step (already scheduled) */
    float beta1, beta2, eps;
    float momentum;
    int nesterov;
    float weight_decay;
    float lr_decay;            /* adagrad: lr / (1 + (t - 1) * lr_decay) at step t */
    float initial_accumulator; /* adagrad: the sum's value before step 1 */
} psk_optim_t;

/**
 * @brief State floats per parameter: 0 (sgd, mean), 1 (momentum, adagrad), 2 (adam, adamw).
 * @return the count, or -1 if @p kind is not a psk_optim_kind_t.
 */
int psk_optim_state_count(psk_optim_kind_t kind);

/**
 * @brief What an optimizer's state holds, in a few words: "none" (sgd), "momentum velocity",
 * "adam moments" (adam and adamw share it), "adagrad squared-gradient sums", "mean gradients,
 * no model" (mean: its records hold gradients, so no other optimizer takes them over). Two optimizers may
 * take over each other's state exactly when these are equal (a store or checkpoint made with
 * one and opened with the other). A static string; NULL if @p kind is not a psk_optim_kind_t.
 * psd records it in every shard's store and compares it byte for byte when the store is opened
 * again: never reword one.
 */
const char *psk_optim_state_name(psk_optim_kind_t kind);

/**
 * @brief Fill the state of @p n parameters before their first step: zeros, except adagrad's
 * sum, which starts at o->initial_accumulator (PyTorch's initial_accumulator_value).
 * @param s [k*n] (k = psk_optim_state_count); not touched when k == 0. Nothing is kept.
 */
void psk_optim_state_init_cpu(float *s, size_t n, const psk_optim_t *o);

/**
 * @brief One optimizer step on n elements, old -> new (may be the same buffers).
 * @param p_out   [n] new parameters
 * @param s_out   [k*n] new state (k = psk_optim_state_count), NULL when k == 0
 * @param p_in    [n] old parameters
 * @param s_in    [k*n] old state; for step 1 what psk_optim_state_init_cpu() wrote
 * @param grad    [n] summed gradient; the kernel uses grad * grad_scale (1/workers for a mean)
 * @param t       1-based step number of this update (Adam's bias correction, Adagrad's lr
 *                decay); must be >= 1
 * @note p_out may be p_in and s_out may be s_in (in-place update); otherwise the outputs must
 *       not overlap the inputs. Out of place, every optimizer runs one fused old -> new pass
 *       (each array read and written once, as the shards' copy-on-write records need).
 *       Nothing is kept: all buffers are borrowed for the call only, and it is thread-safe.
 * @note On x86-64 CPUs with AVX2 the loops run in their AVX2 build (checked once, on the first
 *       call); the results are bit-identical to the baseline build, the reference.
 */
void psk_optim_apply_cpu(float *p_out, float *s_out, const float *p_in, const float *s_in,
                         const float *grad, float grad_scale, size_t n, uint64_t t,
                         const psk_optim_t *o);

/**
 * @brief psk_optim_apply_cpu on a slice: state component c of element i is at
 * s[c * stride + i] (stride >= n), so a caller can walk a record [p | m | v] of stride values
 * each in cache-sized blocks, hashing each block right after it is written.
 */
void psk_optim_apply_strided_cpu(float *p_out, float *s_out, const float *p_in,
                                 const float *s_in, const float *grad, float grad_scale,
                                 size_t n, size_t stride, uint64_t t, const psk_optim_t *o);

/**
 * @brief Learning rate at 0-based step @p step: constant, or linear warm-up over
 * warmup_steps then cosine from lr to min_lr until decay_steps (constant min_lr after).
 * Warm-up gives lr * (step + 1) / warmup_steps, so step 0 already trains and step
 * warmup_steps - 1 reaches lr. If decay_steps <= warmup_steps there is no decay: lr after
 * the warm-up.
 * @param schedule 0 constant, 1 warm-up + cosine.
 */
float psk_lr_at(int schedule, float lr, float min_lr, uint64_t warmup_steps,
                uint64_t decay_steps, uint64_t step);

/** @brief The schedule position of a step that starts after @p samples applied samples, with
 *  @p workers x @p batch samples a planned step: samples / (workers * batch). A run whose
 *  steps are smaller (fewer workers) moves through the schedule by data, not by steps. */
static inline uint64_t psk_lr_pos(uint64_t samples, uint32_t workers, uint32_t batch)
{
    uint64_t per = (uint64_t)workers * batch;
    return per ? samples / per : 0;
}

/** @brief out[i] += in[i] for n elements (gradient aggregation); in may equal out. */
void psk_add_cpu(float *out, const float *in, size_t n);


#endif
