/* merkle.c: a binary Merkle tree over 64-bit hashes (see merkle.h). */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "merkle.h"
#include "ps/ps_error.h"

static uint64_t pair(uint64_t l, uint64_t r)
{
    uint8_t b[16];
    for (int i = 0; i < 8; i++) {
        b[i] = (uint8_t)(l >> (8 * i));
        b[8 + i] = (uint8_t)(r >> (8 * i));
    }
    return XXH3_64bits(b, sizeof b);
}

/* Node j of level k from its children on level k - 1. */
static void rehash(ps_merkle_t *t, int k, size_t j)
{
    const uint64_t *below = t->node + t->off[k - 1];
    size_t l = 2 * j, r = l + 1;
    t->node[t->off[k] + j] = r < t->len[k - 1] ? pair(below[l], below[r]) : below[l];
}

int ps_merkle_build(ps_merkle_t *t, const uint64_t *leaves, size_t n)
{
    ps_merkle_close(t);
    if (n == 0) return 0;
    size_t total = 0, len = n;
    int k = 0;
    for (;;) {
        t->off[k] = total;
        t->len[k] = len;
        total += len;
        k++;
        if (len == 1) break;
        len = (len + 1) / 2;
    }
    t->node = malloc(total * sizeof *t->node);
    if (t->node == NULL) return PS_ENOMEM;
    t->nlevels = k;
    t->nleaves = n;
    memcpy(t->node, leaves, n * sizeof *leaves);
    for (int lv = 1; lv < k; lv++)
        for (size_t j = 0; j < t->len[lv]; j++) rehash(t, lv, j);
    return 0;
}

void ps_merkle_set(ps_merkle_t *t, size_t i, uint64_t h)
{
    t->node[i] = h;
    for (int lv = 1; lv < t->nlevels; lv++) {
        i /= 2;
        rehash(t, lv, i);
    }
}

uint64_t ps_merkle_root(const ps_merkle_t *t)
{
    return t->nleaves ? t->node[t->off[t->nlevels - 1]] : 0;
}

void ps_merkle_close(ps_merkle_t *t)
{
    free(t->node);
    memset(t, 0, sizeof *t);
}

uint64_t ps_merkle_root_of(const uint64_t *leaves, size_t n)
{
    ps_merkle_t t = {0};
    if (ps_merkle_build(&t, leaves, n)) return 0;
    uint64_t r = ps_merkle_root(&t);
    ps_merkle_close(&t);
    return r;
}
