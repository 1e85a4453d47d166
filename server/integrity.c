/* integrity.c: the shard's Merkle tree over its chunk hashes (see integrity.h). */
#include <stdio.h>
#include <stdlib.h>

#include "integrity.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"

typedef struct {
    uint64_t ordinal;
    psd_chunk_t *ch;
} leaf_t;

static int by_ordinal(const void *a, const void *b)
{
    uint64_t x = ((const leaf_t *)a)->ordinal, y = ((const leaf_t *)b)->ordinal;
    return x < y ? -1 : x > y;
}

int psd_integrity_rebuild(psd_server_t *srv)
{
    size_t n = 0;
    for (uint32_t i = 0; i < srv->ntensors; i++)
        for (uint32_t c = 0; srv->tensors[i].present && c < srv->tensors[i].nchunks; c++)
            n += srv->tensors[i].chunks[c] != NULL;
    leaf_t *l = malloc((n ? n : 1) * sizeof *l);
    uint64_t *h = malloc((n ? n : 1) * sizeof *h);
    int rc = PS_ENOMEM;
    if (l && h) {
        size_t k = 0;
        for (uint32_t i = 0; i < srv->ntensors; i++)
            for (uint32_t c = 0; srv->tensors[i].present && c < srv->tensors[i].nchunks; c++)
                if (srv->tensors[i].chunks[c])
                    l[k++] = (leaf_t){srv->tensors[i].decl.first_chunk + c,
                                      srv->tensors[i].chunks[c]};
        qsort(l, n, sizeof *l, by_ordinal);
        for (size_t k2 = 0; k2 < n; k2++) {
            l[k2].ch->leaf = (uint32_t)k2;
            h[k2] = l[k2].ch->hash;
        }
        rc = ps_merkle_build(&srv->merkle, h, n);
        if (rc == 0) srv->merkle_stale = false;
    }
    if (rc) PS_LOG(PS_LOG_ERROR, "integrity", "cannot build the Merkle tree: out of memory");
    free(l);
    free(h);
    return rc;
}

void psd_integrity_stale(psd_server_t *srv) { srv->merkle_stale = true; }

void psd_integrity_chunk_hashed(psd_server_t *srv, psd_chunk_t *ch, uint64_t hash)
{
    ch->hash = hash;
    /* A stale tree's leaves are not laid out for every chunk: the rebuild reads ch->hash. */
    if (!srv->merkle_stale && ch->leaf < srv->merkle.nleaves)
        ps_merkle_set(&srv->merkle, ch->leaf, hash);
}

void psd_integrity_status_json(psd_server_t *srv, char *out, size_t cap, size_t *len)
{
    if (srv->merkle_stale) psd_integrity_rebuild(srv); /* a failure is logged; tried again */
    int n = snprintf(out + *len, cap - *len, ", \"merkle_root\": \"%016llx\"",
                     (unsigned long long)ps_merkle_root(&srv->merkle));
    if (n > 0 && (size_t)n < cap - *len) *len += (size_t)n;
}

void psd_integrity_free(psd_server_t *srv) { ps_merkle_close(&srv->merkle); }
