/* merkle.h: a binary Merkle tree over 64-bit leaf hashes (a shard's chunk hashes, in chunk
 * ordinal order).
 *
 * Level 0 holds the leaves; each node above is XXH3-64 of its two children's hashes (16 bytes,
 * little-endian, left then right); a node without a right sibling moves up unchanged. The root
 * of one leaf is that leaf; of none, 0. Setting a leaf rehashes its path only (log2 n hashes
 * of 16 bytes). */
#ifndef PS_MERKLE_H
#define PS_MERKLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t *node;   /* every level, leaves first */
    size_t nleaves;
    int nlevels;
    size_t off[65];   /* start of each level in node[] */
    size_t len[65];   /* nodes in each level */
} ps_merkle_t;

/**
 * @brief Build the tree over @p leaves[n] (copied).
 * @return 0, or PS_ENOMEM (then @p t is empty, as after ps_merkle_close).
 * @note @p t is caller-owned; release with ps_merkle_close(). Calling it again on an open tree
 *  replaces the tree.
 */
int ps_merkle_build(ps_merkle_t *t, const uint64_t *leaves, size_t n);

/** @brief Set leaf @p i (< nleaves) to @p h and rehash the path to the root. */
void ps_merkle_set(ps_merkle_t *t, size_t i, uint64_t h);

/** @brief The root hash (0 for an empty tree). */
uint64_t ps_merkle_root(const ps_merkle_t *t);

/** @brief Free the tree's memory; it is then empty. NULL-safe for a zeroed tree. */
void ps_merkle_close(ps_merkle_t *t);

/** @brief The root of @p leaves[n] computed directly (no tree kept): what a tree built over
 *  them would report. For checkpoints and tests. @return the root, or 0 when out of memory. */
uint64_t ps_merkle_root_of(const uint64_t *leaves, size_t n);

#endif
