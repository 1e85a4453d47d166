/* integrity.h: a shard's chunk hashes as one Merkle root (in memory), for psctl status and
 * checkpoints. The hashes themselves are written into each chunk record by the store job that
 * writes it (psd_store_chunk_seal); the loop thread copies them into psd_chunk_t.hash when the
 * job's transaction has committed and keeps the tree current from there. Loop thread only. */
#ifndef PSD_INTEGRITY_H
#define PSD_INTEGRITY_H

#include "server.h"

/**
 * @brief Lay the tree out again over every chunk this shard holds, in global chunk ordinal
 *  order (tensor first_chunk + index), from their psd_chunk_t.hash. After loading the store.
 * @return 0 or PS_ENOMEM (the tree may then be empty: it stays stale, and the next read of
 *  the root tries again).
 */
int psd_integrity_rebuild(psd_server_t *srv);

/** @brief A tensor's creation committed, or one was forgotten: the tree is laid out again
 *  when its root is next read (psd_integrity_status_json), not at once: a rebuild sorts every
 *  chunk, and one per declaration made declaring many tensors quadratic on the loop. */
void psd_integrity_stale(psd_server_t *srv);

/** @brief Chunk @p ch committed with record hash @p hash: update its leaf and the root. */
void psd_integrity_chunk_hashed(psd_server_t *srv, psd_chunk_t *ch, uint64_t hash);

/** @brief Append `, "merkle_root": "<16 hex digits>"` to the status JSON in @p out. */
void psd_integrity_status_json(psd_server_t *srv, char *out, size_t cap, size_t *len);

/** @brief Free the tree. */
void psd_integrity_free(psd_server_t *srv);

#endif
