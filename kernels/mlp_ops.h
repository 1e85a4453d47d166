/* mlp_ops.h: the element-wise and row-wise steps of the built-in mlp between its GEMMs
 * (worker/mlp.c). Each has the CPU reference (mlp_ops.c) and its CUDA twin (mlp_ops.cu), with
 * one meaning:
 *   bias_rows      y[B, n] = b[n] broadcast over the B rows
 *   relu           x[n] = max(x, 0)
 *   relu_back      a[n] = a > 0 ? d : 0     (the delta through a ReLU whose output was a)
 *   softmax_xent   z[B, C] logits -> d(mean loss)/dz = (softmax(z) - onehot(y)) / B, in
 *                  place; loss[i] = logsumexp(z_i) - z_i[y_i] (computed in double); a
 *                  label >= C gives its row a NaN loss and a zero delta
 *   colsum         s[n] = sum over the B rows of d[B, n]
 * The _cuda launchers take device pointers and a cudaStream_t as `void *`, queue the work and
 * return PS_EINVAL on a bad argument, PS_EIO on a launch failure, PS_ENOTSUP in a build without
 * CUDA; completion is the stream's (psk_gpu_sync). */
#ifndef PSK_MLP_OPS_H
#define PSK_MLP_OPS_H

#include <stddef.h>
#include <stdint.h>

void psk_bias_rows_cpu(float *y, const float *b, uint32_t B, uint32_t n);
void psk_relu_cpu(float *x, size_t n);
void psk_relu_back_cpu(float *a, const float *d, size_t n);
void psk_softmax_xent_cpu(float *z, const uint8_t *y, uint32_t B, uint32_t C, double *loss);
void psk_colsum_cpu(float *s, const float *d, uint32_t B, uint32_t n);

int psk_bias_rows_cuda(float *y, const float *b, uint32_t B, uint32_t n, void *stream);
int psk_relu_cuda(float *x, size_t n, void *stream);
int psk_relu_back_cuda(float *a, const float *d, size_t n, void *stream);
int psk_softmax_xent_cuda(float *z, const uint8_t *y, uint32_t B, uint32_t C, double *loss,
                          void *stream);
int psk_colsum_cuda(float *s, const float *d, uint32_t B, uint32_t n, void *stream);

#endif
