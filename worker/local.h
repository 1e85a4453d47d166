/* local.h: the reference run. One process does what the shards and every rank's
 * libps do in a cluster: chunked compression with error feedback per rank, the
 * rank-ordered sum, the optimizer on fp32 masters, and compressed pulls. Same
 * kernels, same order, so a cluster's parameters can be compared bit for bit. */
#ifndef PS_LOCAL_H
#define PS_LOCAL_H

#include <stdint.h>

#include "codec.h"
#include "manifest.h"
#include "mlp.h"

typedef struct {
    const ps_manifest_t *m;
    uint32_t workers;
    uint64_t chunk_elems;
    uint64_t total_steps;
    size_t nparams;
    uint32_t nstate;
    float *master;       /* [nparams] fp32 parameters, as the shards hold them */
    float *state;        /* [nparams * nstate] optimizer state */
    float *sum;          /* [nparams] this step's gradient sum */
    psk_codec_t *codecs; /* [workers * ntensors] push codec of each rank and tensor */
    float *residual;     /* [workers * nparams] error feedback, where a codec is lossy */
    int error_feedback;
    psk_codec_t pull;    /* parameters on the way back */
    uint8_t *payload;    /* one encoded chunk */
    float *decoded;      /* [chunk_elems] one pushed chunk decoded, checked as psd checks it */
    void *scratch;
    size_t payload_cap;
} ps_local_t;

/**
 * @brief Set up the reference for @p mlp (its tensors and initial parameters).
 * @param rank_codec [workers] codec names overriding job.compression.codec per rank, entries
 *        may be NULL; the array may be NULL.
 * @return 0, PS_EINVAL (bad codec name) or PS_ENOMEM. Release with ps_local_destroy.
 */
int ps_local_create(ps_local_t *l, const ps_manifest_t *m, const ps_mlp_t *mlp,
                    const char *const *rank_codec, uint64_t total_steps);
void ps_local_destroy(ps_local_t *l);

/** @brief What the workers see: mlp->params = the masters, through the pull codec. */
void ps_local_pull(ps_local_t *l, ps_mlp_t *mlp);

/** @brief Add rank @p rank's gradients (mlp->grads) of step @p step to the sum, as that rank's
 *  libps would send them and the shards decode them. Call for ranks 0, 1, ... in order. */
void ps_local_push(ps_local_t *l, uint32_t rank, const ps_mlp_t *mlp, uint64_t step);

/** @brief Apply the step: masters -= optimizer(sum / members), @p members = the ranks that
 *  pushed this step, @p progress = samples applied before it (the learning-rate schedule's
 *  position, as the shards compute it); clears the sum. */
void ps_local_apply(ps_local_t *l, const ps_mlp_t *mlp, uint64_t step, uint32_t members,
                    uint64_t progress);

#endif
