/* place.h: chunk geometry and chunk -> shard placement.
 *
 * A tensor of numel fp32 values is cut into chunks of chunk_elems values (the
 * last may be shorter). The coordinator (shard 0) gives each tensor, in
 * declaration order, the ordinal of its first chunk: the number of chunks of
 * all tensors declared before it. Chunk c of that tensor has global ordinal
 * base + c and lives on shard (base + c) mod nshards. So placement is a pure
 * function of the manifest (shard count, chunk_bytes) and the tensor table,
 * every process computes it alone, shards hold equal shares to within one
 * chunk, and tensors declared later never move earlier chunks. */
#ifndef PS_PLACE_H
#define PS_PLACE_H

#include <stdint.h>

/** @brief Chunks of a tensor of @p numel values; 0 for an empty tensor. */
static inline uint32_t ps_chunk_count(uint64_t numel, uint64_t chunk_elems)
{
    return (uint32_t)((numel + chunk_elems - 1) / chunk_elems);
}

/** @brief Values in chunk @p c of a tensor (chunk_elems, or fewer for the last). */
static inline uint64_t ps_chunk_len(uint64_t numel, uint64_t chunk_elems, uint32_t c)
{
    uint64_t off = (uint64_t)c * chunk_elems;
    return numel - off < chunk_elems ? numel - off : chunk_elems;
}

/** @brief Shard that owns the chunk with global ordinal @p ordinal. */
uint32_t ps_place_shard(uint64_t ordinal, uint32_t nshards);

#endif
