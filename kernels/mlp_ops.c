/* mlp_ops.c: the CPU reference of mlp_ops.h (plain loops; mlp_ops.cu is the CUDA twin). */
#include "mlp_ops.h"

#include <math.h>
#include <string.h>

void psk_bias_rows_cpu(float *y, const float *b, uint32_t B, uint32_t n)
{
    /* y [B, n], b [n] */
    for (uint32_t i = 0; i < B; i++)
        memcpy(y + (size_t)i * n, b, (size_t)n * sizeof(float));
}

void psk_relu_cpu(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void psk_relu_back_cpu(float *a, const float *d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] = a[i] > 0.0f ? d[i] : 0.0f;
}

void psk_softmax_xent_cpu(float *z, const uint8_t *y, uint32_t B, uint32_t C, double *loss)
{
    /* z [B, C] logits, y [B] labels, loss [B]; stable through log-sum-exp. */
    float inv_b = 1.0f / (float)B;
    for (uint32_t i = 0; i < B; i++) {
        float *zi = z + (size_t)i * C;
        if (y[i] >= C) { /* no such class: the row says so by its loss, and moves nothing */
            loss[i] = nan("");
            memset(zi, 0, (size_t)C * sizeof(float));
            continue;
        }
        float zmax = zi[0];
        for (uint32_t j = 1; j < C; j++)
            zmax = zi[j] > zmax ? zi[j] : zmax;
        double sum = 0.0;
        for (uint32_t j = 0; j < C; j++)
            sum += exp((double)(zi[j] - zmax));
        double lse = (double)zmax + log(sum);
        loss[i] = lse - (double)zi[y[i]];
        for (uint32_t j = 0; j < C; j++)
            zi[j] = (float)exp((double)zi[j] - lse) * inv_b;
        zi[y[i]] -= inv_b;
    }
}

void psk_colsum_cpu(float *s, const float *d, uint32_t B, uint32_t n)
{
    /* s [n] = sum_i d [B, n], rows in order */
    memcpy(s, d, (size_t)n * sizeof(float));
    for (uint32_t i = 1; i < B; i++) {
        const float *row = d + (size_t)i * n;
        for (uint32_t j = 0; j < n; j++)
            s[j] += row[j];
    }
}
