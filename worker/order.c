/* order.c: the order of the training set in each pass (ps_batch_order, ps_client.h). */
#include <stdint.h>

#include "ps/ps_client.h"

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void ps_batch_order(uint32_t *perm, uint32_t n, uint64_t seed, uint32_t pass)
{
    /* Every worker must derive the same order from (seed, pass), so only integer
     * arithmetic with fixed widths is used. Mixing the pass through one splitmix64
     * step keeps nearby (seed, pass) pairs from yielding overlapping streams. */
    uint64_t state = seed ^ 0x6A09E667F3BCC909ull;
    state = splitmix64(&state) ^ pass;
    for (uint32_t i = 0; i < n; i++)
        perm[i] = i;
    for (uint32_t i = n; i > 1; i--) {
        /* j uniform in [0, i): the top 32 random bits scaled by i (bias below 2^-32 * n). */
        uint32_t j = (uint32_t)(((splitmix64(&state) >> 32) * i) >> 32);
        uint32_t tmp = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = tmp;
    }
}
