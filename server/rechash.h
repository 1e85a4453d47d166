/* rechash.h: the XXH3-64 of a chunk record (format 3), shared by psd and psctl.
 *
 * A record is params[n] then nstate state arrays of n floats. Its hash runs over the record in
 * blocks of PSD_HASH_BLOCK values: for each block, the block of params, then the same block of
 * every state array. That order lets the apply job hash each block right after the optimizer
 * wrote it, while it is still in cache (apply.c), and gives the same value as recomputing it
 * from the stored record (verify, checkpoints, repair). */
#ifndef PSD_RECHASH_H
#define PSD_RECHASH_H

#include <stddef.h>
#include <stdint.h>
#ifndef XXH_STATIC_LINKING_ONLY
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack (xxhash.h may be included again) */
#endif
#include <xxhash.h>
#if PS_HAVE_XXH3_DISPATCH
/* The run-time dispatched update (AVX2 / AVX-512 where the CPU has them; the plain entry points
 * are built for SSE2): same value, and the apply's hashing went from 32% to ~10% of its
 * samples. Only the names used below are redirected. */
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>
#define PSD_XXH3_UPDATE XXH3_64bits_update_dispatch
#else
#define PSD_XXH3_UPDATE XXH3_64bits_update
#endif

#define PSD_HASH_BLOCK 4096 /* values per block (16 KiB of each array) */

/** @brief Feed one block of @p len values to @p st: its params at @p params (NULL: fed already,
 *  as ps_crc32c_xxh3 does), then its values of each of the @p nstate state arrays (of @p n
 *  values each), the first at @p state. */
static inline void psd_rechash_block_at(XXH3_state_t *st, const float *params, const float *state,
                                        uint32_t n, uint32_t nstate, size_t len)
{
    if (params) PSD_XXH3_UPDATE(st, params, len * sizeof(float));
    for (uint32_t c = 0; c < nstate; c++)
        PSD_XXH3_UPDATE(st, state + (size_t)c * n, len * sizeof(float));
}

/** @brief Feed block [off, off + len) of the record (@p rec = params, state follows) to @p st. */
static inline void psd_rechash_block(XXH3_state_t *st, const float *rec, uint32_t n,
                                     uint32_t nstate, size_t off, size_t len)
{
    psd_rechash_block_at(st, rec + off, rec + n + off, n, nstate, len);
}

/** @brief The record hash of params[n] and state[nstate * n] laid out from @p rec. */
static inline uint64_t psd_rechash(const float *rec, uint32_t n, uint32_t nstate)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    for (size_t off = 0; off < n; off += PSD_HASH_BLOCK)
        psd_rechash_block(&st, rec, n, nstate, off,
                          n - off < PSD_HASH_BLOCK ? n - off : PSD_HASH_BLOCK);
    return XXH3_64bits_digest(&st);
}

#endif
