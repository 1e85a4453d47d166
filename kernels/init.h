/* init.h: deterministic tensor initializers. Element i of a tensor depends only
 * on (seed, tensor name hash, i), so a shard can initialize any chunk alone and
 * get the same values as a single process initializing the whole tensor. */
#ifndef PSK_INIT_H
#define PSK_INIT_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    PSK_INIT_ZEROS = 0,
    PSK_INIT_NORMAL = 1,
    PSK_INIT_UNIFORM = 2,
    PSK_INIT_XAVIER = 3,
    PSK_INIT_CONSTANT = 4, /* every element = arg (a norm layer's scale starts at 1) */
    PSK_INIT_VALUES = 5    /* the values a worker sends (psd: PS_MSG_VALUES, a model's own
                              weights); psk_init_cpu does not make them */
} psk_init_kind_t;

typedef struct {
    psk_init_kind_t kind;
    float arg;          /* normal: std; uniform: a (values in [-a, a)); constant: the value;
                           unused otherwise */
    uint64_t seed;      /* the tensor's seed, already mixed with its name */
    uint32_t fan_in;    /* xavier: shape[0] (or 1) */
    uint64_t fan_out;   /* xavier: product of shape[1..] (or 1; up to 2^34) */
} psk_init_t;

/**
 * @brief out[j] = init value of element (first + j), j < n.
 * uniform and xavier give values in [-a, a) on a grid of 2^24 steps; xavier uses
 * a = sqrt(6 / (fan_in + fan_out)), counting a zero fan as 1. normal has mean 0 and uses
 * Box-Muller on two hashes of the element index (tails to about 8.6 std).
 * @note Bit-identical for any split into chunks on one machine; normal goes through libm's
 *       log and cos, so another libm may differ in a rare last bit.
 */
void psk_init_cpu(float *out, size_t n, uint64_t first, const psk_init_t *init);

/** @brief 64-bit hash of a tensor name mixed with a seed (for psk_init_t.seed). */
uint64_t psk_init_seed(const char *name, uint64_t seed);

#endif
