/* local.c: the single-process reference run (see local.h). */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "local.h"
#include "optim.h"
#include "optim_conf.h"
#include "place.h"
#include "ps/ps_error.h"

int ps_local_create(ps_local_t *l, const ps_manifest_t *m, const ps_mlp_t *mlp,
                    const char *const *rank_codec, uint64_t total_steps)
{
    memset(l, 0, sizeof *l);
    l->m = m;
    l->workers = m->job.workers;
    l->chunk_elems = m->chunk_bytes / 4;
    l->total_steps = total_steps;
    l->nparams = mlp->nparams;
    l->nstate = (uint32_t)psk_optim_state_count((psk_optim_kind_t)m->job.optimizer.name);
    const ps_compression_conf_t *cc = &m->job.compression;
    l->error_feedback = cc->error_feedback;
    if (psk_codec_parse(&l->pull, cc->pull)) return PS_EINVAL;
    l->master = malloc(l->nparams * 4);
    l->state = calloc(l->nparams * (l->nstate ? l->nstate : 1), 4);
    l->sum = calloc(l->nparams, 4);
    l->codecs = calloc((size_t)l->workers * (size_t)mlp->ntensors, sizeof *l->codecs);
    l->residual = calloc((size_t)l->workers * l->nparams, 4);
    int rc = PS_ENOMEM;
    if (!l->master || !l->state || !l->sum || !l->codecs || !l->residual) goto fail;
    memcpy(l->master, mlp->params[0], l->nparams * 4); /* the views are one allocation */
    psk_optim_t o0 = ps_optim_kernel_conf(&m->job.optimizer, m->job.optimizer.lr);
    psk_optim_state_init_cpu(l->state, l->nparams, &o0); /* the shards' first records' state */
    size_t n = l->chunk_elems, cap = 0, scr = 0;
    for (uint32_t r = 0; r < l->workers; r++) {
        ps_compression_conf_t rc_conf = *cc;
        if (rank_codec && rank_codec[r])
            snprintf(rc_conf.codec, sizeof rc_conf.codec, "%s", rank_codec[r]);
        for (int t = 0; t < mlp->ntensors; t++) {
            const ps_mlp_tensor_t *mt = &mlp->tensors[t];
            psk_codec_t *c = &l->codecs[(size_t)r * mlp->ntensors + t];
            rc = PS_EINVAL;
            if (psk_codec_parse(c, ps_compression_codec_for(&rc_conf, mt->name, mt->numel * 4)))
                goto fail;
            c->block = cc->block;
            c->stochastic = cc->stochastic;
            c->fp16_values = cc->fp16_values;
            size_t cn = mt->numel < n ? mt->numel : n;
            if (psk_codec_max_bytes(c, cn) > cap) cap = psk_codec_max_bytes(c, cn);
            if (psk_codec_scratch_bytes(c, cn) > scr) scr = psk_codec_scratch_bytes(c, cn);
        }
    }
    size_t pull_cap = psk_codec_max_bytes(&l->pull, n);
    l->payload_cap = cap > pull_cap ? cap : pull_cap;
    l->payload = malloc(l->payload_cap ? l->payload_cap : 1);
    l->scratch = scr ? malloc(scr) : NULL;
    l->decoded = malloc((n ? n : 1) * 4);
    rc = PS_ENOMEM;
    if (!l->payload || (scr && !l->scratch) || !l->decoded) goto fail;
    return 0;
fail:
    ps_local_destroy(l);
    return rc;
}

void ps_local_destroy(ps_local_t *l)
{
    free(l->master);
    free(l->state);
    free(l->sum);
    free(l->codecs);
    free(l->residual);
    free(l->payload);
    free(l->decoded);
    free(l->scratch);
    memset(l, 0, sizeof *l);
}

void ps_local_pull(ps_local_t *l, ps_mlp_t *mlp)
{
    float *view = mlp->params[0];
    if (l->pull.kind == PSK_CODEC_NONE) {
        memcpy(view, l->master, l->nparams * 4);
        return;
    }
    /* Chunk by chunk, as the shards encode and libps decodes. */
    size_t off = 0;
    for (int t = 0; t < mlp->ntensors; t++) {
        size_t numel = mlp->tensors[t].numel;
        for (uint32_t c = 0; c < ps_chunk_count(numel, l->chunk_elems); c++) {
            size_t n = ps_chunk_len(numel, l->chunk_elems, c), len;
            size_t at = off + (size_t)c * l->chunk_elems;
            int rc = psk_codec_encode_cpu(l->payload, l->payload_cap, &len, l->master + at, n,
                                          &l->pull, NULL);
            assert(rc == 0); /* sized for the largest chunk in ps_local_create */
            (void)rc;
            memset(view + at, 0, n * 4);
            psk_codec_decode_add_cpu(view + at, n, l->payload, len, &l->pull, 1.0f);
        }
        off += numel;
    }
}

void ps_local_push(ps_local_t *l, uint32_t rank, const ps_mlp_t *mlp, uint64_t step)
{
    size_t off = 0;
    float *res = l->residual + (size_t)rank * l->nparams;
    for (int t = 0; t < mlp->ntensors; t++) {
        size_t numel = mlp->tensors[t].numel;
        psk_codec_t c = l->codecs[(size_t)rank * mlp->ntensors + t];
        for (uint32_t k = 0; k < ps_chunk_count(numel, l->chunk_elems); k++) {
            size_t n = ps_chunk_len(numel, l->chunk_elems, k), len = 0;
            size_t at = off + (size_t)k * l->chunk_elems;
            const float *g = mlp->grads[t] + (size_t)k * l->chunk_elems;
            /* A push whose values as psd decodes them hold a NaN or an infinity is left out of
             * the sum, as every shard leaves it out: an encode refused (int8, sign: libps sends
             * it as fp32, the residual as it was; before, the previous chunk's payload was
             * added again here, a review of session 71), and a payload that decodes so (fp16
             * of 65520 and more, a NaN top-k kept), whose error feedback libps puts back when
             * psd says so. Before, this looked at the gradient alone: an fp16 overflow was
             * added as infinities, and a NaN's push left out kept what its encode took from the
             * residual (a review, session 72). */
            if (c.kind == PSK_CODEC_NONE) {
                if (psk_all_finite(g, n)) psk_add_cpu(l->sum + at, g, n);
                continue;
            }
            c.seed = psk_codec_push_seed(step, psk_codec_tensor_key(mlp->tensors[t].name), k);
            int rc = l->error_feedback
                         ? psk_codec_encode_ef_cpu(l->payload, l->payload_cap, &len, g, res + at,
                                                   n, &c, l->scratch)
                         : psk_codec_encode_cpu(l->payload, l->payload_cap, &len, g, n, &c,
                                                l->scratch);
            if (rc != 0) continue;
            memset(l->decoded, 0, n * 4);
            psk_codec_decode_add_cpu(l->decoded, n, l->payload, len, &c, 1.0f);
            if (!psk_all_finite(l->decoded, n)) {
                if (l->error_feedback)
                    psk_codec_ef_put_back_cpu(res + at, g, n, l->payload, len, &c);
                continue;
            }
            psk_add_cpu(l->sum + at, l->decoded, n);
        }
        off += numel;
    }
}

void ps_local_apply(ps_local_t *l, const ps_mlp_t *mlp, uint64_t step, uint32_t members,
                    uint64_t progress)
{
    const ps_optim_conf_t *o = &l->m->job.optimizer;
    uint64_t decay = o->decay_steps ? o->decay_steps : l->total_steps;
    /* The position as psd takes it (server/apply.c sched_pos): by data, or by step where
     * job.max_steps cuts the job shorter than its data. */
    uint64_t pos = l->m->job.max_steps && l->total_steps == l->m->job.max_steps
                       ? step
                       : psk_lr_pos(progress, l->m->job.workers, l->m->job.batch_size);
    psk_optim_t oc = ps_optim_kernel_conf(
        o, psk_lr_at(o->schedule == PS_SCHED_COSINE, o->lr, o->min_lr, o->warmup_steps, decay,
                     pos));
    size_t off = 0;
    for (int t = 0; t < mlp->ntensors; t++) {
        size_t n = mlp->tensors[t].numel;
        float *s = l->nstate ? l->state + off * l->nstate : NULL;
        psk_optim_apply_cpu(l->master + off, s, l->master + off, s, l->sum + off,
                            1.0f / (float)members, n, step + 1, &oc);
        off += n;
    }
    memset(l->sum, 0, l->nparams * 4);
}
