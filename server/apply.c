/* apply.c: a store job's write transaction, on the pool thread (or inline for a small one):
 * creating a tensor's records, summing a chunk's pushes and applying the optimizer (spread over
 * the fan-out's threads), dropping a tensor's records. */
#include <string.h>
#include <unistd.h>

#include "crc32c.h"
#include "init.h"
#include "optim_conf.h"
#include "ps/ps_error.h"
#include "shard_internal.h"

/* The update of chunk @p ch at @p step: the job's optimizer at its schedule's rate, or the
 * mean of the pushes for a tensor declared so (PS_DECL_MEAN). */
static psk_optim_t optim_at(psd_server_t *srv, const psd_chunk_t *ch, uint64_t step,
                            uint64_t total_steps)
{
    const ps_optim_conf_t *o = &srv->m.job.optimizer;
    uint64_t decay = o->decay_steps ? o->decay_steps : total_steps;
    float lr = psk_lr_at(o->schedule == PS_SCHED_COSINE, o->lr, o->min_lr, o->warmup_steps, decay,
                         step);
    psk_optim_t k = ps_optim_kernel_conf(o, lr);
    if (ch->mean) {
        k.kind = PSK_MEAN; /* its state arrays are carried through unchanged */
    } else { /* written when it changed: not a store to one shared line per chunk update */
        uint32_t bits;
        memcpy(&bits, &lr, sizeof bits);
        uint64_t v = 1ull << 32 | bits;
        if (__atomic_load_n(&srv->last_lr, __ATOMIC_RELAXED) != v)
            __atomic_store_n(&srv->last_lr, v, __ATOMIC_RELAXED);
    }
    return k;
}

bool psd_last_lr(const psd_server_t *srv, double *lr)
{
    uint64_t v = __atomic_load_n(&srv->last_lr, __ATOMIC_RELAXED);
    uint32_t bits = (uint32_t)v;
    float f;
    memcpy(&f, &bits, sizeof f);
    *lr = f;
    return v != 0;
}

/*
 * The schedule position of an update. Where the job's length is its data: the samples applied
 * before its batch (@p progress) over a planned step's samples (job.workers x batch_size), so a
 * run with fewer workers (more, smaller steps) decays its rate over the same data. Where
 * job.max_steps cuts the job shorter than its data (the tensor's planned steps, as psworker
 * declares them, are max_steps), the update's @p step: bsp's step, or under asp / ssp the
 * pushing member's own count of batches, which max_steps bounds whatever the number of
 * workers. By data, 3 workers where job.workers said 2 reached the schedule's end after two
 * thirds of their steps and trained the rest at min_lr, and 1 never reached it (a review,
 * session 72). @p version (the chunk's updates) where no batch said its samples (a plain
 * libps client: @p progress UINT64_MAX).
 */
static uint64_t sched_pos(const psd_server_t *srv, const psd_chunk_t *ch, uint64_t progress,
                          uint64_t step, uint64_t version)
{
    const ps_job_conf_t *j = &srv->m.job;
    if (progress == UINT64_MAX) return version;
    if (j->max_steps && ch->total_steps == j->max_steps) return step;
    return psk_lr_pos(progress, j->workers, j->batch_size);
}

/* Whether item @p i's reserved record @p h (of @p n params) waits for the job's fan-out: only
 * in a pooled job, and only a record on overflow pages (psd_store_record_stable), which later
 * reserves in the transaction do not move; the caller fills any other at once. */
static bool job_defer(psd_job_t *job, uint32_t i, uint32_t n, psd_chunk_hdr_t *h,
                      uint32_t *ndeferred)
{
    if (!job->pooled || !psd_store_record_stable(&job->srv->store, n, job->srv->nstate))
        return false;
    job->recs[i] = h;
    job->deferred[(*ndeferred)++] = i;
    return true;
}

/* Chunk @p c's first record into @p h: initialized parameters, the optimizer's initial state
 * (zeros; adagrad's initial_accumulator_value). */
static void create_item(psd_job_t *job, uint32_t c, psd_chunk_hdr_t *h)
{
    const psd_server_t *srv = job->srv;
    uint32_t n = job->chunks[c]->n;
    *h = (psd_chunk_hdr_t){.version = 0, .n = n, .nstate = srv->nstate};
    if (job->values)
        memcpy(psd_chunk_params(h), job->values[c], (size_t)n * sizeof(float));
    else
        psk_init_cpu(psd_chunk_params(h), n, (uint64_t)c * srv->chunk_elems, &job->init);
    psk_optim_t o = ps_optim_kernel_conf(&srv->m.job.optimizer, srv->m.job.optimizer.lr);
    psk_optim_state_init_cpu(psd_chunk_state(h), n, &o);
    psd_store_chunk_seal(h);
    job->hashes[c] = h->hash;
}

static void create_deferred(void *arg, size_t d)
{
    psd_job_t *job = arg;
    uint32_t c = job->deferred[d];
    create_item(job, c, job->recs[c]);
}

/* Every chunk's record is reserved first and filled on the fan-out when it sits on overflow
 * pages (stable), as run_apply does; the initializer is counter-based (the chunk's offset),
 * so the order does not matter. */
static int run_create(psd_job_t *job, psd_wtxn_t *tx)
{
    psd_server_t *srv = job->srv;
    const ps_decl_t *d = &job->decl;
    if (srv->test_fail_create && --srv->test_fail_create == 0) return PS_EIO; /* a test hook */
    int rc = psd_store_put_tensor(tx, d);
    uint64_t dims1 = 1; /* at most PS_MAX_TENSOR_VALUES: a uint32 wrapped (xavier's bound) */
    for (int i = 1; i < d->ndim; i++) dims1 *= d->shape[i];
    job->init = (psk_init_t){.kind = (psk_init_kind_t)ps_decl_init_kind(d), .arg = d->init_arg,
                             .seed = psk_init_seed(d->name, d->seed), .fan_in = d->shape[0],
                             .fan_out = d->ndim > 1 ? dims1 : 1};
    uint32_t ndeferred = 0;
    for (uint32_t c = 0; rc == 0 && c < job->nchunks; c++) {
        psd_chunk_t *ch = job->chunks[c];
        if (ch == NULL) continue;
        psd_chunk_hdr_t *h;
        rc = psd_store_chunk_reserve(tx, d->id, c, ch->n, srv->nstate, &h);
        if (rc) break;
        if (!job_defer(job, c, ch->n, h, &ndeferred)) create_item(job, c, h);
    }
    if (rc == 0) psd_fanout_run(&srv->fanout, ndeferred, create_deferred, job);
    return rc;
}

/* The ranks among @p mask whose raw push's CRC-32C does not match (a separate pass). */
static uint64_t raw_crc_bad(const psd_chunk_t *ch, uint64_t mask)
{
    uint64_t bad = 0;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        const psd_slot_t *s = (mask >> r & 1) ? slot_at(ch, r) : NULL;
        if (s && s->codec.kind == PSK_CODEC_NONE &&
            ps_crc32c(0, slot_data(ch, r), s->len) != s->crc)
            bad |= 1ull << r;
    }
    return bad;
}

/* The sum of a BSP step's pushes, in rank order, when a member's push is compressed: every
 * push decoded or added straight into the chunk's one aggregation buffer (sparse adds for top-k
 * and random-k; payloads were validated on receipt). NULL when all are raw: sum_block sums them
 * span by span in the update's pass. */
static const float *slot_sum(psd_server_t *srv, psd_chunk_t *ch)
{
    uint64_t mem = ch->sum_members;
    bool raw = true;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++)
        if (mem >> r & 1) raw &= slot_at(ch, r)->codec.kind == PSK_CODEC_NONE;
    if (raw) {
        /* Summed span by span in sum_block, right before each span is applied. */
        return NULL;
    }
    memset(ch->agg, 0, (size_t)ch->n * 4);
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        if (!(mem >> r & 1)) continue;
        const psd_slot_t *s = slot_at(ch, r);
        if (s->codec.kind == PSK_CODEC_NONE)
            psk_add_cpu(ch->agg, (const float *)slot_data(ch, r), ch->n);
        else
            psk_codec_decode_add_cpu(ch->agg, ch->n, s->buf, s->len, &s->codec, 1.0f);
    }
    return ch->agg;
}

/* Before each span is applied: fold the members' raw pushes of the span into their CRC-32Cs
 * and sum them in rank order into a buffer of this thread's that stays in cache: neither a
 * push area (never written) nor a slot is written, and the sum is never written to memory. */
typedef struct {
    psd_chunk_t *ch;
    uint32_t first;
    uint32_t crc[PS_MAX_RANKS];
} blocksum_t;

static __thread float span_sum[PSD_APPLY_SPAN] __attribute__((aligned(64)));

static const float *sum_block(void *arg, size_t off, size_t len)
{
    blocksum_t *b = arg;
    uint64_t mem = b->ch->sum_members;
    const float *first = (const float *)slot_data(b->ch, b->first) + off;
    if (mem == 1ull << b->first) { /* one member: its push is the sum */
        b->crc[b->first] = ps_crc32c(b->crc[b->first], first, len * 4);
        return first;
    }
    b->crc[b->first] = ps_crc32c_copy(b->crc[b->first], span_sum, first, len * 4);
    for (uint32_t r = b->first + 1; r < PS_MAX_RANKS; r++)
        if (mem >> r & 1)
            b->crc[r] = ps_crc32c(b->crc[r], (const float *)slot_data(b->ch, r) + off, len * 4);
    for (uint32_t r = b->first + 1; r < PS_MAX_RANKS; r++)
        if (mem >> r & 1) psk_add_cpu(span_sum, (const float *)slot_data(b->ch, r) + off, len);
    return span_sum;
}

/* The ranks among @p mask whose push holds a NaN or an infinity (compressed ones decoded into
 * ch->agg first): the slow path, after an update wrote a parameter that is not finite. */
static uint64_t nonfinite_pushes(psd_chunk_t *ch, uint64_t mask)
{
    uint64_t odd = 0;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        if (!(mask >> r & 1)) continue;
        const psd_slot_t *s = slot_at(ch, r);
        const float *g = (const float *)slot_data(ch, r);
        if (s->codec.kind != PSK_CODEC_NONE) {
            memset(ch->agg, 0, (size_t)ch->n * 4);
            psk_codec_decode_add_cpu(ch->agg, ch->n, s->buf, s->len, &s->codec, 1.0f);
            g = ch->agg;
        }
        if (!psk_all_finite(g, ch->n)) odd |= 1ull << r;
    }
    return odd;
}

/* Whether a worker's CPU read @p ch's record since its last update (a pull reply sets it): the
 * update that takes it (every pass of one apply_item) streams the params (store.h). Taken
 * back, so that updates nobody read in between (pushes without pulls) keep their records in
 * this CPU's cache. */
static bool take_read_by_peer(psd_chunk_t *ch)
{
    return __atomic_exchange_n(&ch->read_by_peer, false, __ATOMIC_RELAXED);
}

/* A bsp step of item @p i: the members' pushes (ch->sum_members) summed and applied to @p old
 * into @p h (its header a copy of old's), its params streamed with @p stream. @return whether
 * every parameter written is finite; job->bad[i]: the ranks whose push failed its CRC (then
 * @p h is old's record again). */
static bool bsp_update(psd_job_t *job, uint32_t i, const psd_chunk_hdr_t *old, psd_chunk_hdr_t *h,
                       bool stream)
{
    psd_server_t *srv = job->srv;
    psd_chunk_t *ch = job->items[i];
    const float *p_in = psd_chunk_params((psd_chunk_hdr_t *)old);
    const float *s_in = psd_chunk_state((psd_chunk_hdr_t *)old);
    /* Sum in rank order, so the result does not depend on arrival order. */
    const float *sum = slot_sum(srv, ch);
    /* The schedule follows the data (sched_pos); every member's push of the step says the
     * same samples and step. */
    uint64_t pos = sched_pos(srv, ch, ch->has_progress ? ch->progress : UINT64_MAX,
                             slot_at(ch, (uint32_t)__builtin_ctzll(ch->sum_members))->step,
                             h->version);
    psk_optim_t o = optim_at(srv, ch, pos, ch->total_steps);
    /* The mean over the members with a gradient and those without (zeros), as torch's DDP
     * averages a parameter some ranks did not use (mean_of: counted when the job was formed;
     * the loop thread changes skip_mask for other ranks' pushes meanwhile). */
    float scale = 1.0f / (float)ch->mean_of;
    blocksum_t bs = {.ch = ch, .first = (uint32_t)__builtin_ctzll(ch->sum_members)};
    bool raw = sum == NULL, finite = true; /* raw pushes: summed span by span in the pass */
    if (!raw) job->bad[i] = raw_crc_bad(ch, ch->sum_members);
    if (job->bad[i] == 0)
        finite = psd_store_chunk_update(h, p_in, s_in, sum, scale, &o,
                                        h->version + 1 - ch->skipped, raw ? sum_block : NULL,
                                        &bs, stream);
    for (uint32_t r = 0; raw && r < PS_MAX_RANKS; r++)
        if ((ch->sum_members >> r & 1) && bs.crc[r] != slot_at(ch, r)->crc)
            job->bad[i] |= 1ull << r;
    if (job->bad[i]) /* not applied: the new record is the old one again */
        memcpy(h, old, psd_chunk_bytes(ch->n, srv->nstate));
    return finite;
}

/* The asp / ssp pushes of item @p i (ch->applying_mask) but those in @p skip, in rank order,
 * from @p old into @p h (its header a copy of old's); those in @p odd (of skip) count as updates
 * that changed nothing, each in its place (the record's version moves past it, so the updates
 * after it have the number they would have had); the last one's params streamed with
 * @p stream. @return whether every parameter the last update wrote is finite. */
static bool asp_update(psd_job_t *job, uint32_t i, const psd_chunk_hdr_t *old, psd_chunk_hdr_t *h,
                       uint64_t skip, uint64_t odd, bool stream)
{
    psd_server_t *srv = job->srv;
    psd_chunk_t *ch = job->items[i];
    const float *p_in = psd_chunk_params((psd_chunk_hdr_t *)old);
    const float *s_in = psd_chunk_state((psd_chunk_hdr_t *)old);
    float *p = psd_chunk_params(h), *s = psd_chunk_state(h);
    uint64_t applying = ch->applying_mask; /* not slot_state: the loop thread writes others' */
    uint32_t left = (uint32_t)__builtin_popcountll(applying & ~skip);
    bool finite = true;
    if (left == 0) /* nothing to apply (every push refused): the old record again */
        memcpy(h, old, psd_chunk_bytes(ch->n, srv->nstate));
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        if (!(applying >> r & 1)) continue;
        if (odd >> r & 1) h->version++;
        if ((skip >> r & 1) || left == 0) continue;
        /* The schedule follows the data here too (sched_pos): each push at the samples
         * applied before its batch was handed out (W workers' pushes of one planned step share
         * a position); under job.max_steps at its member's own count of batches. */
        const psd_slot_t *sl = slot_at(ch, r);
        uint64_t pos = sched_pos(srv, ch, sl->progress, sl->step, h->version);
        psk_optim_t o = optim_at(srv, ch, pos, ch->total_steps);
        const float *g = (const float *)slot_data(ch, r);
        if (sl->codec.kind != PSK_CODEC_NONE) {
            memset(ch->agg, 0, (size_t)ch->n * 4);
            psk_codec_decode_add_cpu(ch->agg, ch->n, sl->buf, sl->len, &sl->codec, 1.0f);
            g = ch->agg;
        }
        if (--left == 0) { /* the last one seals the record in its pass */
            finite = psd_store_chunk_update(h, p_in, s_in, g, 1.0f, &o, h->version + 1, NULL,
                                            NULL, stream);
            continue; /* later ranks in odd still count */
        }
        psk_optim_apply_cpu(p, s, p_in, s_in, g, 1.0f, ch->n, h->version + 1, &o);
        if (o.kind == PSK_MEAN && s != s_in) /* it writes no state: carried through */
            memcpy(s, s_in, (size_t)ch->n * srv->nstate * sizeof(float));
        p_in = p; /* later updates of this batch go in place on the new record */
        s_in = s;
        h->version++;
    }
    return finite;
}

/*
 * Apply item @p i of @p job: the old record @p old -> the reserved @p h. Touches only that chunk
 * and the job's entries i, so items run on any thread of the fan-out at once.
 * A push holding a NaN or an infinity is left out (job->nonfinite[i]), as one without a gradient
 * would be: the update writes the record, the CRC pass finds a parameter that is not finite, the
 * pushes are looked at (only then) and the update runs again from @p old without those. One
 * worker's exploding gradient does not reach everyone's parameters. A parameter that is not
 * finite with no such push (the optimizer overflowed, or it was so already) stays as written.
 */
static void apply_item(psd_job_t *job, uint32_t i, const psd_chunk_hdr_t *old, psd_chunk_hdr_t *h)
{
    psd_server_t *srv = job->srv;
    psd_chunk_t *ch = job->items[i];
    job->bad[i] = job->nonfinite[i] = 0;
    *h = *old;
    bool stream = take_read_by_peer(ch);
    if (srv->m.job.consistency == PS_CONSIST_BSP) {
        bool finite = ch->sum_members == 0 || bsp_update(job, i, old, h, stream);
        uint64_t odd = finite || job->bad[i] ? 0 : nonfinite_pushes(ch, ch->sum_members);
        if (odd) {
            /* Counted as zeros in the mean, as a push without a gradient (of a mean tensor:
             * not counted); the loop thread reads sum_members after the job. */
            job->nonfinite[i] = odd;
            ch->sum_members &= ~odd;
            if (ch->mean) ch->mean_of = (uint32_t)__builtin_popcountll(ch->sum_members);
            *h = *old;
            finite = ch->sum_members == 0 || bsp_update(job, i, old, h, stream);
        }
        if (ch->sum_members == 0) {
            /* Every push of the step replays a batch applied here before, has no gradient
             * (PS_FLAG_NOGRAD) or was left out: the step passes with the record as it was. */
            memcpy(h, old, psd_chunk_bytes(ch->n, srv->nstate));
            h->version++;
        }
        job->params_odd[i] = ch->sum_members == 0 || job->bad[i] ? PSD_PARAMS_KEPT
                             : finite                           ? PSD_PARAMS_FINITE
                                                                : PSD_PARAMS_ODD;
        job->hashes[i] = h->hash;
        return;
    }
    job->bad[i] = raw_crc_bad(ch, ch->applying_mask); /* those are skipped */
    uint64_t live = ch->applying_mask & ~job->bad[i];
    /* A mean tensor's update only takes the push's values (PSK_MEAN; optimizer mean is bsp
     * only), so the job's next push would overwrite an earlier one's NaN unseen: its pushes
     * are looked at first. */
    bool overwrites = ch->mean;
    uint64_t odd = overwrites ? nonfinite_pushes(ch, live) : 0;
    bool finite = asp_update(job, i, old, h, job->bad[i] | odd, odd, stream);
    if (!finite && !overwrites && (odd = nonfinite_pushes(ch, live)) != 0) {
        *h = *old; /* updates that changed nothing */
        finite = asp_update(job, i, old, h, job->bad[i] | odd, odd, stream);
    }
    job->nonfinite[i] = odd;
    job->params_odd[i] = (live & ~odd) == 0 ? PSD_PARAMS_KEPT
                         : finite            ? PSD_PARAMS_FINITE
                                             : PSD_PARAMS_ODD;
    job->hashes[i] = h->hash;
}

/* The fan-out's item: the deferred record d of the job. */
static void apply_deferred(void *arg, size_t d)
{
    psd_job_t *job = arg;
    uint32_t i = job->deferred[d];
    apply_item(job, i, job->olds[i], job->recs[i]);
}

/*
 * Every record of the job is reserved first (LMDB has one writer: this thread). A record on
 * overflow pages keeps its address while later records are reserved (PLATFORM-NOTES.md
 * section 4; psd_store_chunk_reserve), so those updates wait and then run at once on the
 * fan-out's threads; a small record, which later puts may move within its leaf page, is
 * updated right away. An inline job (small, on the loop thread) runs everything here.
 */
static int run_apply(psd_job_t *job, psd_wtxn_t *tx)
{
    psd_server_t *srv = job->srv;
    uint32_t ndeferred = 0;
    for (uint32_t i = 0; i < job->nitems; i++) {
        psd_chunk_t *ch = job->items[i];
        const psd_chunk_hdr_t *old;
        int rc = psd_store_chunk_get(&srv->store, tx->r, ch->tensor, ch->chunk, &old);
        if (rc) return rc;
        if (old->n != ch->n || old->nstate != srv->nstate) return PS_ESTORE;
        if (!__atomic_load_n(&ch->hash_checked, __ATOMIC_RELAXED)) {
            /* The first update since psd loaded the store: an update reads the old record and
             * seals the new one with a fresh hash, so bytes damaged at rest (on disk, before a
             * restart) would pass every later check. One hash per chunk per run. */
            if (psd_store_chunk_hash(old) != old->hash) {
                snprintf(job->err, sizeof job->err, "chunk %u/%u (version %llu)", ch->tensor,
                         ch->chunk, (unsigned long long)old->version);
                return PS_ECORRUPT;
            }
            __atomic_store_n(&ch->hash_checked, true, __ATOMIC_RELAXED);
        }
        psd_chunk_hdr_t *h;
        rc = psd_store_chunk_reserve(tx, ch->tensor, ch->chunk, ch->n, srv->nstate, &h);
        if (rc) return rc;
        job->olds[i] = old;
        if (!job_defer(job, i, ch->n, h, &ndeferred)) apply_item(job, i, old, h);
    }
    psd_fanout_run(&srv->fanout, ndeferred, apply_deferred, job);
    if (srv->m.job.consistency == PS_CONSIST_BSP) {
        /* The summed ring with this step's apply in it, where its members differ from the step
         * before's (or that is not known), or where the step is skipped (no update: the count
         * changes): nothing is written while the membership stays and steps update. The loop
         * thread writes ch->summed and ch->skipped only in job_done, after this job. */
        for (uint32_t i = 0; i < job->nitems; i++) {
            psd_chunk_t *ch = job->items[i];
            uint64_t v = ch->version;
            bool known = v > ch->summed_from, skip = ch->sum_members == 0;
            if (job->bad[i] ||
                (known && !skip && ch->summed[(v - 1) % PSD_SUMMED_RING] == ch->step_members))
                continue;
            psd_summed_rec_t rec = {.step = v, .from = ch->summed_from < v ? ch->summed_from : v,
                                .skipped = ch->skipped + skip};
            memcpy(rec.members, ch->summed, sizeof rec.members);
            rec.members[v % PSD_SUMMED_RING] = ch->step_members;
            int rc = psd_store_put_applied(tx, ch->tensor, ch->chunk, &rec, sizeof rec);
            if (rc) return rc;
        }
        return 0;
    }
    /* asp / ssp: which push each rank last applied goes into the same transaction, so that a
     * resend after a crash between this commit and the acknowledgement is still known (a bsp
     * resend is known by its step). ack_slot makes ch->applied the same after the commit (in
     * the same rank order; only the loop thread writes it, and not while this job runs). */
    for (uint32_t i = 0; i < job->nitems; i++) {
        psd_chunk_t *ch = job->items[i];
        psd_applied_t a = *ch->applied;
        bool any = false;
        for (uint32_t r = 0; r < PS_MAX_RANKS; r++)
            if ((ch->applying_mask >> r & 1) && !(job->bad[i] >> r & 1)) {
                psd__applied_commit(&a, ch, r);
                any = true;
            }
        int rc = any ? psd_store_put_applied(tx, ch->tensor, ch->chunk, &a, sizeof a) : 0;
        if (rc) return rc;
    }
    return 0;
}

/* PS_TEST_SLOW_APPLY's wait, on the pool thread: while @p hold exists (up to 60 s), or 2 s
 * without one. */
static void slow_apply_wait(const char *hold)
{
    if (hold == NULL) {
        uv_sleep(2000);
        return;
    }
    for (int t = 0; t < 6000 && access(hold, F_OK) == 0; t++) uv_sleep(10);
}

void psd__job_work(uv_work_t *w)
{
    psd_job_t *job = w->data;
    psd_wtxn_t tx;
    job->begin_ns = job->srv->trace ? ps_trace_now() : 0; /* read by job_done, after us */
    /* Its disk blocks first (a full disk: PS_ENOSPC, not a fault): its records, and as much
     * again for the pages LMDB cannot reuse while readers hold the old ones. psd_store_begin
     * allocates PSD_STORE_AHEAD itself, more than an apply job of a few threads writes. */
    uint64_t need = 2 * (uint64_t)psd__job_bytes(job->srv, job);
    job->rc = need > PSD_STORE_AHEAD ? psd_store_ahead(&job->srv->store, need) : 0;
    if (job->rc == 0) job->rc = psd_store_begin(&job->srv->store, &tx);
    if (job->rc == 0) {
        job->rc = job->kind == JOB_CREATE ? run_create(job, &tx)
                  : job->kind == JOB_DROP ? psd_store_del_tensor(&tx, job->tensor, job->nchunks)
                                          : run_apply(job, &tx);
        if (job->rc == 0 && job->kind == JOB_DROP && job->drop_gen)
            job->rc = psd_store_put_blob(&tx, PSD_DROPGEN_BLOB, &job->drop_gen,
                                         sizeof job->drop_gen);
        if (job->slow) slow_apply_wait(job->srv->test_slow_apply_hold);
        if (job->rc == 0 && job->kind == JOB_APPLY && job->coord_len)
            job->rc = psd_store_put_blob(&tx, "job", job->coord_state, job->coord_len);
        if (job->rc == 0 && job->kind == JOB_APPLY && job->coord_rec_len)
            job->rc = psd_store_put_blob(&tx, "jobrec", job->coord_rec, job->coord_rec_len);
        if (job->rc)
            psd_store_abort(&tx);
        else
            job->rc = psd_store_commit(&tx);
    }
    job->end_ns = job->begin_ns ? ps_trace_now() : 0;
    /* From the pool, job_done comes next through an uv_async: stop the loop's busy-poll. */
    if (job->pooled) ps_ucx_spin_stop(&job->srv->ucx);
}

