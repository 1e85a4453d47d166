/* hash.h: the counter-based hash every kernel draws its random bits from. Element c of
 * a stream seeded with s is splitmix64's c-th output, so any range can be produced
 * without the elements before it (init, randomk indices, stochastic rounding). */
#ifndef PSK_HASH_H
#define PSK_HASH_H

#include <stdint.h>

#define PSK_GOLDEN_GAMMA 0x9e3779b97f4a7c15ull

/** @brief splitmix64's finalizer (Stafford's Mix13): a bijection that avalanches every bit. */
static inline uint64_t psk_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/** @brief The c-th output of splitmix64 seeded with @p seed. */
static inline uint64_t psk_hash64(uint64_t seed, uint64_t c)
{
    return psk_mix64(seed + (c + 1) * PSK_GOLDEN_GAMMA);
}

#endif
