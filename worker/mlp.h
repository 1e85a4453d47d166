/* mlp.h: the built-in "mlp" model: Linear layers with ReLU between them and a
 * softmax cross-entropy head, on the CPU with OpenBLAS sgemm, or on a CUDA device with cuBLAS
 * (ps_mlp_use_gpu) and the kernels of kernels/mlp_ops.h.
 *
 * Tensors, in declaration order, for layer l = 1..L:
 *   "fc<l>.weight"  shape [in, out] row-major (y = x . W + b), init xavier
 *   "fc<l>.bias"    shape [out], init zeros
 * so tensor index 2(l-1) is a weight and 2(l-1)+1 its bias. */
#ifndef PS_MLP_H
#define PS_MLP_H

#include <stddef.h>
#include <stdint.h>

#include "gpu.h"
#include "init.h"

#define PS_MLP_MAX_LAYERS 15
#define PS_MLP_MAX_TENSORS (2 * PS_MLP_MAX_LAYERS)

typedef struct {
    char name[32];
    uint32_t shape[4];
    int ndim;
    size_t numel;
    psk_init_kind_t init; /* xavier for weights, zeros for biases */
} ps_mlp_tensor_t;

/** Called as soon as the gradient of tensor @p t is complete (last layer first). */
typedef void (*ps_mlp_grad_cb)(int t, void *arg);

typedef struct {
    int nlin;                           /* number of Linear layers */
    uint32_t sizes[PS_MLP_MAX_LAYERS + 1];
    int ntensors;                       /* 2 * nlin */
    ps_mlp_tensor_t tensors[PS_MLP_MAX_TENSORS];
    float *params[PS_MLP_MAX_TENSORS];  /* views into one allocation */
    float *grads[PS_MLP_MAX_TENSORS];   /* views into one allocation */
    size_t nparams;                     /* total parameter count */
    uint32_t max_batch;
    float *act;                         /* activation / delta scratch for max_batch */
    float *mem;                         /* params then grads: params[0] == mem,
                                           grads[0] == mem + nparams, each contiguous */
    double *loss;                       /* [max_batch] each row's loss of the last step */
    /* On a device (ps_mlp_use_gpu): params[] and grads[] stay the host copies the caller
     * reads and writes; each train_step uploads params[] and downloads grads[] (but those of
     * the tensors in grads_stay, which stay on the device: ps_mlp_device_grad). */
    psk_gpu_t *gpu;                     /* NULL on the CPU */
    float *d_mem, *d_act, *d_x;         /* device twins of mem and act; the batch's inputs */
    uint8_t *d_y;                       /* [max_batch] labels */
    double *d_loss;                     /* [max_batch] */
    uint64_t grads_stay;                /* bit t: grads[t] is not downloaded; cb(t) means its
                                           device gradient (ps_mlp_device_grad) is final */
    int gpu_rc;                         /* the first device error (0: none); see gpu_err */
    char gpu_err[320];
} ps_mlp_t;

/**
 * @brief Build the model for layer sizes sizes[0..nsizes-1] (input, hidden..., classes).
 * Parameters start at zero; call ps_mlp_init_params or fill params[] from the shards.
 * @param[out] m  zeroed first, so a failed create leaves nothing to release.
 * @param[in] max_batch  the largest batch train_step and each eval slice will see (>= 1).
 * @return 0, PS_EINVAL (fewer than 2 sizes, more than PS_MLP_MAX_LAYERS+1, a zero size,
 *         max_batch 0, or a size or max_batch above INT_MAX, OpenBLAS's dimension type)
 *         or PS_ENOMEM.
 * @note The model owns its memory; release it with ps_mlp_destroy (a no-op on NULL).
 */
int ps_mlp_create(ps_mlp_t *m, const uint32_t *sizes, int nsizes, uint32_t max_batch);
void ps_mlp_destroy(ps_mlp_t *m);

/**
 * @brief Move the model's arithmetic to CUDA device @p device: open it, allocate the device
 * twins of the parameters, gradients and activations, and pin the host parameters and
 * gradients for the copies. train_step and eval then run there; params[] and grads[] keep
 * their meaning on the host.
 * @param[out] err on failure, a sentence naming the device and what failed (no device, built
 *                 without CUDA, out of device memory, ...).
 * @return 0; PS_ENOTSUP (no such device, or built without CUDA), PS_ENOMEM, PS_EIO. On
 *         failure the model stays on the CPU, unchanged.
 * @note ps_mlp_destroy releases the device too.
 */
int ps_mlp_use_gpu(ps_mlp_t *m, int device, char *err, size_t errlen);

/** @brief Tensor @p t's gradient on the device (NULL on the CPU): final once cb(t) ran, valid
 *  until the next train_step. */
float *ps_mlp_device_grad(const ps_mlp_t *m, int t);

/**
 * @brief Initialize every tensor as the shards would: psk_init_cpu from element 0 with
 * seed psk_init_seed(name, seed), fan_in = shape[0], fan_out = shape[1] (1 for a bias).
 */
void ps_mlp_init_params(ps_mlp_t *m, uint64_t seed);

/**
 * @brief Forward and backward pass on a batch; grads[] receive the gradient of the
 * mean loss over the batch (overwritten, not accumulated).
 * @param[in] x  [B, sizes[0]] inputs
 * @param[in] y  [B] labels, each < sizes[nlin]
 * @param[in] B  1 <= B <= max_batch
 * @param[in] cb  may be NULL; otherwise called once per tensor, on the calling thread, as
 *                soon as that tensor's gradient is final: fc<L>.weight, fc<L>.bias, then
 *                fc<L-1>.weight, fc<L-1>.bias, ..., fc1.bias (tensor indices 2L-2, 2L-1,
 *                2L-4, 2L-3, ..., 0, 1).
 * @return the mean cross-entropy loss of the batch.
 * @note grads[t] is not written again in this call once cb(t) has run, so cb may hand it
 *       off (e.g. start a push); it is overwritten by the next train_step. params[] must
 *       not change until the call returns: the backward pass still reads the weights.
 *       Uses m->act as scratch, so one model serves one thread at a time.
 *       On a device: a device error makes the call return NaN with m->gpu_rc and m->gpu_err
 *       set (check gpu_rc after each call); cb then is not called for the tensors left.
 */
float ps_mlp_train_step(ps_mlp_t *m, const float *x, const uint8_t *y, uint32_t B,
                        ps_mlp_grad_cb cb, void *arg);

/**
 * @brief Count of correct argmax predictions (first maximum on ties) over n samples of
 * x [n, sizes[0]] and y [n], evaluated in slices of max_batch; n may be 0.
 * @note Overwrites m->act, not grads[]. On a device error it returns 0 with m->gpu_rc set.
 */
uint32_t ps_mlp_eval(ps_mlp_t *m, const float *x, const uint8_t *y, uint32_t n);

#endif
