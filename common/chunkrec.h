/* chunkrec.h: the layout of a chunk record in a shard's LMDB store, shared by psd (which writes
 * it, server/store.h) and by libps's same-host reader (storeview.h).
 *
 * Key "C" be32(tensor) be32(chunk) in the unnamed database; value: ps_chunk_hdr_t, params[n],
 * state[nstate * n]. */
#ifndef PS_CHUNKREC_H
#define PS_CHUNKREC_H

#include <stddef.h>
#include <stdint.h>

#define PS_CHUNK_FORMAT 3
#define PS_CHUNK_KEY_LEN 9

typedef struct {
    uint64_t version; /* steps applied to this chunk */
    uint32_t n;       /* parameters */
    uint32_t nstate;  /* optimizer state floats per parameter */
    uint32_t format;  /* PS_CHUNK_FORMAT */
    uint32_t crc32c;  /* CRC-32C of params[n] */
    uint64_t hash;    /* XXH3-64 of params[n] and state[nstate * n] in blocks (rechash.h) */
} ps_chunk_hdr_t;

/* No optimizer keeps more state arrays; a header claiming more is damaged or forged. */
#define PS_CHUNK_MAX_STATE 15

/** Bytes of a record of @p n params and @p nstate state arrays; SIZE_MAX (no record has that
 *  size) when @p nstate is beyond PS_CHUNK_MAX_STATE, so a damaged header cannot make a short
 *  record pass a size check by wrapping the product. */
static inline size_t ps_chunk_rec_bytes(uint32_t n, uint32_t nstate)
{
    if (nstate > PS_CHUNK_MAX_STATE) return SIZE_MAX;
    return sizeof(ps_chunk_hdr_t) + (size_t)n * (1 + (size_t)nstate) * sizeof(float);
}

/** The key of chunk (@p t, @p c) into @p key. */
static inline void ps_chunk_key(uint8_t key[PS_CHUNK_KEY_LEN], uint32_t t, uint32_t c)
{
    key[0] = 'C';
    for (int i = 0; i < 4; i++) {
        key[1 + i] = (uint8_t)(t >> (24 - 8 * i));
        key[5 + i] = (uint8_t)(c >> (24 - 8 * i));
    }
}

#endif
