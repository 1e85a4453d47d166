/* storejob.c: store jobs on the loop thread: which runs next (drops, creates, then the ready
 * chunks, one transaction), and what its commit answers (acks, waiting pulls, declarations),
 * reports (non-finite pushes and parameters) and the store's health; the slot for other
 * exclusive work (psd_shard_slot_queue). */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "export.h"
#include "integrity.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "shard_internal.h"

static void answer_pulls(psd_server_t *srv, psd_chunk_t *ch)
{
    psd_wait_t **pp = &ch->pulls;
    while (*pp) {
        psd_wait_t *w = *pp;
        if (w->min_version <= ch->version) {
            *pp = w->next;
            psd__send_pull_reply(srv, w->conn, w->req_id, ch, w->codec, w->flags, w->asked_ns);
            psd_conn_unref(w->conn);
            psd__wait_put(srv, w);
        } else {
            pp = &w->next;
        }
    }
}

static void snapshot_stale(psd_server_t *srv)
{
    psd_snap_t *s = srv->snap;
    if (s == NULL) return;
    srv->snap = NULL;
    s->stale = true;
    if (s->refs == 0) psd__snap_retire(srv, s);
}

/* Pushes of @p ch by the ranks in @p odd held a NaN or an infinity and were left out: counted
 * (psd_nonfinite_pushes_total, psctl status) and logged, the 1st, 2nd, 4th, 8th ... time. */
static void nonfinite_report(psd_server_t *srv, psd_chunk_t *ch, uint64_t odd)
{
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        if (!(odd >> r & 1)) continue;
        uint64_t n = ++srv->nonfinite_pushes;
        srv->nonfinite_rank = r;
        srv->nonfinite_tensor = ch->tensor;
        if (n & (n - 1)) continue;
        PS_LOG(PS_LOG_WARN, "shard", "rank %u pushed a gradient of tensor %u '%s' (chunk %u) "
               "holding a NaN or an infinity: left out of its update%s (%llu so far; "
               "the worker is told)", r, ch->tensor, srv->tensors[ch->tensor].decl.name,
               ch->chunk, srv->m.job.consistency == PS_CONSIST_BSP
                              ? " as a push without a gradient" : "",
               (unsigned long long)n);
    }
}

/* An update of @p ch wrote its parameters (@p odd: one is a NaN or an infinity, though every
 * push it applied was finite). Becoming so is counted and logged, the 1st, 2nd, 4th ... time;
 * psctl status and psd_nonfinite_param_chunks show the chunks still so. */
static void params_odd_report(psd_server_t *srv, psd_chunk_t *ch, bool odd)
{
    bool was = ch->params_odd;
    ch->params_odd = odd;
    if (!odd || was) return;
    uint64_t n = ++srv->nonfinite_params;
    if (n & (n - 1)) return;
    PS_LOG(PS_LOG_WARN, "shard", "an update of tensor %u '%s' (chunk %u, step %llu) with finite "
           "gradients left a parameter that is a NaN or an infinity: the optimizer overflowed (a "
           "learning rate too high?) or it was so already; such a chunk stays so (%llu so far)",
           ch->tensor, srv->tensors[ch->tensor].decl.name, ch->chunk,
           (unsigned long long)ch->version, (unsigned long long)n);
}

static void ack_slot(psd_server_t *srv, psd_chunk_t *ch, uint32_t r, int rc, uint64_t version,
                     uint32_t flags)
{
    psd_slot_t *s = slot_at(ch, r);
    psd_conn_t *conn = s->conn;
    if (rc == 0 && ch->applied) psd__applied_commit(ch->applied, ch, r); /* asp / ssp */
    if (conn && rc == 0 && srv->test_lose_ack && --srv->test_lose_ack == 0) {
        PS_LOG(PS_LOG_WARN, "shard", "acknowledgement of %u/%u to rank %u lost and its "
               "connection closed (PS_TEST_LOSE_ACK)", ch->tensor, ch->chunk, r);
        conn->dead = true;
        conn->close_queued = true;
    }
    if (conn == NULL || conn->dead) { /* its sender died or is cut off; the update stands */
    } else if (rc) {
        psd_send_chunk_error(srv, conn, s->req, ch->tensor, ch->chunk, rc,
                             "update of %u/%u failed: %s", ch->tensor, ch->chunk, ps_strerror(rc));
    } else {
        ps_msg_t a = {.type = PS_MSG_PUSH_ACK, .req_id = s->req, .tensor = ch->tensor,
                      .chunk = ch->chunk, .step = version, .shard = srv->shard,
                      .flags = flags};
        psd_send_msg(srv, conn, &a);
    }
    if (conn) psd_conn_unref(conn);
    s->conn = NULL;
    psd__slot_empty(ch, r);
}

/* A JOB_DROP ended: the tensor leaves the table (or, the delete failed, stays as it was), and
 * its forget requests are answered. */
static void drop_done(psd_server_t *srv, psd_job_t *job)
{
    psd_tensor_t *t = &srv->tensors[job->tensor];
    psd_wait_t *forgets = t->forgets;
    t->forgets = NULL;
    if (job->rc == 0) {
        PS_LOG(PS_LOG_INFO, "shard", "tensor %u '%s' dropped (%u chunks)", job->tensor,
               job->decl.name, job->nchunks);
        /* Before psd_ckpt_after_job: a checkpoint waiting for this shard's step would take
         * its snapshot without the tensor while another shard's part has it (a review). */
        if (t->dropping_trained) psd_ckpt_tensor_dropped(srv, job->decl.name);
        if (job->drop_gen > srv->drop_gen) srv->drop_gen = job->drop_gen;
        psd__tensor_forget(srv, job->tensor, false);
    } else {
        t->dropping = t->dropping_trained = false;
        t->ready = true;
    }
    for (psd_wait_t *w = forgets, *nx; w; w = nx) {
        nx = w->next;
        if (job->rc)
            psd_send_error(srv, w->conn, w->req_id, job->rc, "cannot drop tensor '%s': %s",
                           job->decl.name, ps_strerror(job->rc));
        else
            psd_send_msg(srv, w->conn, &(ps_msg_t){.type = PS_MSG_FORGET_REPLY,
                                                    .req_id = w->req_id, .shard = srv->shard,
                                                    .tensor = job->tensor,
                                                    .flags = PS_FLAG_DONE});
        psd_conn_unref(w->conn);
        psd__wait_put(srv, w);
    }
}

/* After store job @p job: a failure is logged, counted and remembered with its reason
 * (srv->store_failing, /healthz's) and what it was for; it is forgotten once a job of that
 * kind for that tensor (and chunk, for an update) commits. Not at the first commit of any
 * job: a full map fails the large chunks' updates and takes the small ones' (a probe, session
 * 48: 200 ok while every large update failed). */
static void store_health(psd_server_t *srv, const psd_job_t *job)
{
    bool apply = job->kind == JOB_APPLY;
    uint32_t tensor = apply ? (job->nitems ? job->items[0]->tensor : UINT32_MAX) : job->tensor;
    if (job->rc == PS_ESTOREFULL)
        snprintf(srv->store_failing, sizeof srv->store_failing, "store job failed: %s "
                 "(map_size_mb is %llu)", ps_strerror(job->rc),
                 (unsigned long long)srv->m.map_size_mb);
    else if (job->rc)
        snprintf(srv->store_failing, sizeof srv->store_failing, "store job failed: %.128s%s%s",
                 job->err[0] ? job->err : "", job->err[0] ? ": " : "", ps_strerror(job->rc));
    if (job->rc) {
        PS_LOG(PS_LOG_ERROR, "shard", "%s", srv->store_failing);
        srv->store_failures++;
        srv->failing_kind = (uint32_t)job->kind;
        srv->failing_tensor = tensor;
        srv->failing_chunk = apply && job->nitems ? job->items[0]->chunk : 0;
        return;
    }
    if (srv->store_failing[0] == '\0' || (uint32_t)job->kind != srv->failing_kind) return;
    bool same = !apply && tensor == srv->failing_tensor;
    for (uint32_t i = 0; apply && i < job->nitems && !same; i++)
        same = job->items[i]->tensor == srv->failing_tensor &&
               job->items[i]->chunk == srv->failing_chunk;
    if (same) srv->store_failing[0] = '\0';
}

/* The update waits no more (@p why: logged when it did). */
static void pin_end(psd_server_t *srv, const char *why)
{
    if (srv->pinned_since_ms && why)
        PS_LOG(PS_LOG_WARN, "shard", "%s", why);
    srv->pinned_since_ms = 0;
    srv->pinned_retry = false;
    srv->pinned_said = false;
    srv->pinned_changes = 0;
}

/* The wait ended (@p why, said first): its holder let go. */
static void pin_let_go(psd_server_t *srv, const char *why)
{
    PS_LOG(PS_LOG_INFO, "shard", "%s: the old snapshot was let go after %.1f s", why,
           (double)(psd_now_ms() - srv->pinned_since_ms) / 1e3);
    pin_end(srv, NULL);
    srv->store_failing[0] = '\0';
}

/* Whether reader @p r is the holder the last check found (same process, same snapshot). */
static bool pin_holder_same(const psd_server_t *srv, const psd_store_reader_t *r)
{
    return srv->pinned_since_ms && r->pid == srv->pinned_pid && r->txnid == srv->pinned_txnid;
}

/* psd stops while updates wait for an old snapshot: they are left for its next start, as a
 * partial bsp step is (their pushes unacknowledged: their workers send them again to the
 * restarted psd), instead of failing them ("the shard store is full", and the workers exited
 * with it: a probe, session 60). */
static void pin_shelve(psd_server_t *srv)
{
    for (psd_chunk_t *c = srv->ready_head; c; c = c->next_ready) c->queued = false;
    srv->ready_head = srv->ready_tail = NULL;
    if (srv->pinned_since_ms)
        PS_LOG(PS_LOG_INFO, "shard", "stopping while updates wait for an old snapshot: they are "
               "left for the next start (their workers send them again)");
    pin_end(srv, NULL);
}

/* An apply job failed with the map full (PS_ESTOREFULL): whether a reader's snapshot is old
 * enough that the pages written since cannot be reused (a worker stopped inside a direct read,
 * a pull reply of psd's own snapshot still going to a stopped worker). Then the update is not
 * refused: its pushes stay, and it is tried again at each cron tick until that reader lets go
 * (it goes on, ends, or psd drops its connection), as the data itself fits. Before, the pushes
 * failed ("the shard store is full") and the job's workers with them. A running reader may be
 * a few commits behind when a map that is too small fills: the holder (pid and snapshot) must
 * be the same at the next tick to count as stuck (then it is named); the update fails after
 * PSD_PIN_CHANGES ticks whose holder was another each time (a probe, session 60: a reader
 * running on was blamed). */
#define PSD_PIN_CHANGES 3
static bool store_pinned(psd_server_t *srv)
{
    psd_store_reader_t r;
    if (psd_store_oldest_reader(&srv->store, &r) != 0 || r.pid == 0 || r.lag < 2) {
        pin_end(srv, "the store is still full with no old snapshot held: the updates that "
                     "waited fail");
        return false;
    }
    if (srv->stopping) return true; /* left for the next start (pin_shelve) */
    bool same = pin_holder_same(srv, &r);
    if (srv->pinned_since_ms && !same && ++srv->pinned_changes >= PSD_PIN_CHANGES) {
        pin_end(srv, "the store is still full: the snapshots held were not the same one at "
                     "three ticks in a row (readers that run on); the updates that waited fail");
        return false;
    }
    if (same) srv->pinned_changes = 0;
    const psd_conn_t *who = NULL;
    for (const psd_conn_t *c = srv->conns; c && r.pid != getpid(); c = c->next)
        if ((int)c->pid == r.pid && (who == NULL || c->rank >= 0)) who = c;
    char what[200];
    bool own = r.pid == getpid();
    const char *copy = own ? psd_ckpt_copy_dir(srv) : NULL;
    if (copy) /* the copy's snapshot (a review, session 72: a pull reply was named) */
        snprintf(what, sizeof what, "psd's own, the checkpoint copy into %.64s (raise "
                 "map_size_mb to leave room for a copy beside training)", copy);
    else if (own && psd_export_reading(srv))
        snprintf(what, sizeof what, "psd's own, an export or a verify reading it, or a pull "
                 "reply still going to a slow or stopped worker");
    else if (own)
        snprintf(what, sizeof what, "psd's own (a pull reply still going to a slow or stopped "
                 "worker)");
    else if (who && who->rank >= 0)
        snprintf(what, sizeof what, "pid %d's, rank %d's (stopped inside a direct read?)", r.pid,
                 who->rank);
    else if (same && srv->pinned_rank >= 0)
        snprintf(what, sizeof what, "pid %d's, rank %d's until psd dropped it (stopped inside a "
                 "direct read?)", r.pid, srv->pinned_rank);
    else
        snprintf(what, sizeof what, "pid %d's (a process on this host stopped inside a direct "
                 "read?)", r.pid);
    if (!same) srv->pinned_rank = who ? who->rank : -1;
    snprintf(srv->store_failing, sizeof srv->store_failing, "the store is full while a "
             "snapshot %llu commits old is held, %s: updates wait for it (map_size_mb %llu)",
             (unsigned long long)r.lag, what, (unsigned long long)srv->m.map_size_mb);
    if (same && !srv->pinned_said) /* stuck: said once per holder */
        PS_LOG(PS_LOG_WARN, "shard", "%s; LMDB cannot reuse the pages written since: tried again "
               "at each cron tick until it lets go (continue or end that process)",
               srv->store_failing);
    else if (!same)
        PS_LOG(PS_LOG_INFO, "shard", "the store is full while a snapshot %llu commits old is "
               "held (pid %d's): the update is tried again at the next cron tick",
               (unsigned long long)r.lag, r.pid);
    srv->pinned_said = same;
    srv->pinned_pid = r.pid;
    srv->pinned_txnid = r.txnid;
    if (srv->pinned_since_ms == 0) srv->pinned_since_ms = psd_now_ms();
    srv->pinned_retry = false;
    return true;
}

const char *psd_store_strerror(const psd_server_t *srv, int rc)
{
    if (rc == PS_ESTOREFULL && srv->pinned_since_ms)
        return "the shard store is full while a reader holds an old snapshot (updates wait for "
               "it: see the warning that names it)";
    return ps_strerror(rc);
}

void psd_store_pin_cron(psd_server_t *srv)
{
    if (srv->pinned_since_ms == 0 || srv->job_running) return; /* a job's end decides */
    if (srv->stopping) {
        pin_shelve(srv);
        psd_server_maybe_stop(srv);
        return;
    }
    if (srv->ready_head == NULL) {
        /* Nothing to apply (the step's members left meanwhile): the wait ends with its holder,
         * or /healthz would name a holder long gone (a probe, session 60). */
        psd_store_reader_t r;
        if (psd_store_oldest_reader(&srv->store, &r) == 0 &&
            (r.pid == 0 || r.lag < 2 || !pin_holder_same(srv, &r)))
            pin_let_go(srv, "nothing is left to apply");
        return;
    }
    srv->pinned_retry = true;
    psd__job_start_next(srv);
}

/* An apply job that failed as store_pinned says: its chunks' pushes are full again,
 * unacknowledged, and their pulls wait on (nothing was written); queued again unless psd
 * stops (pin_shelve). */
static void apply_wait(psd_server_t *srv, psd_job_t *job)
{
    for (uint32_t i = 0; i < job->nitems; i++) {
        psd_chunk_t *ch = job->items[i];
        SLOTS_FOR(ch, s) {
            if (s->state != SLOT_APPLYING) continue;
            s->state = SLOT_FULL;
            ch->nfull++;
            ch->full_mask |= 1ull << s->rank;
        }
        ch->queued = false;
        ch->applying = false;
        if (!srv->stopping)
            psd__chunk_maybe_ready(srv, ch); /* queued; started by the cron's retry */
    }
    if (srv->stopping) pin_shelve(srv);
}

static void job_done(uv_work_t *w, int status)
{
    psd_job_t *job = w->data;
    psd_server_t *srv = job->srv;
    if (job->pooled) ps_ucx_spin_resume(&srv->ucx); /* psd__job_work stopped it */
    /* job_running stays set until the end: psd__chunk_maybe_ready below must not start the
     * next job in this struct while its items are still being finished. */
    bool was_pinned = srv->pinned_since_ms != 0;
    bool pinned = job->kind == JOB_APPLY && job->rc == PS_ESTOREFULL && store_pinned(srv);
    if (pinned) {
        srv->store_failures += !was_pinned; /* one failure per wait; store_failing says it */
    } else {
        if (was_pinned && job->kind == JOB_APPLY && job->rc == 0)
            pin_let_go(srv, "the store takes updates again");
        store_health(srv, job);
    }
    job->err[0] = '\0';
    if (job->rc && job->coord_rec_len) psd_coord_rec_unsaved(srv); /* not committed */
    if (job->rc == 0 && job->kind == JOB_APPLY && job->coord_len)
        psd_coord_state_committed(srv, job->coord_step);
    if (srv->trace && job->kind == JOB_APPLY && job->nitems > 0)
        psd_trace_apply(srv->trace, job->begin_ns, job->end_ns, job->nitems,
                        job->items[0]->tensor, job->items[0]->chunk, psd__job_bytes(srv, job),
                        job->pooled, job->rc == 0);
    if (job->kind == JOB_APPLY && job->rc == 0 && srv->test_crash_after_apply &&
        --srv->test_crash_after_apply == 0) {
        PS_LOG(PS_LOG_WARN, "shard", "killed after an apply committed, before its "
               "acknowledgements (PS_TEST_CRASH_AFTER_APPLY)");
        raise(SIGKILL);
    }
    psd_outbox_begin(srv); /* the acks and pull replies of this job leave bundled */
    snapshot_stale(srv);
    if (job->kind == JOB_CREATE) {
        psd_tensor_t *t = &srv->tensors[job->tensor];
        psd__values_free(t); /* written (or not: then forgotten below) */
        job->values = NULL;
        t->ready = job->rc == 0;
        if (job->rc) {
            psd__create_failed(srv, job->tensor, job->rc); /* a later declaration tries again */
        } else {
            uint64_t here = 0;
            for (uint32_t c = 0; c < t->nchunks; c++)
                if (t->chunks[c]) {
                    t->chunks[c]->hash = job->hashes[c];
                    here += t->chunks[c]->n;
                }
            psd_integrity_stale(srv);
            PS_LOG(PS_LOG_INFO, "shard", "tensor %u '%s' initialized: %.1f MiB of parameters here "
                   "in %.1f ms", job->tensor, t->decl.name, (double)here * 4 / (1 << 20),
                   (double)(uv_hrtime() - job->start_ns) / 1e6);
            for (psd_wait_t *d = t->declares, *nx; d; d = nx) {
                nx = d->next;
                psd__reply_declare(srv, d->conn, d->req_id, t);
                psd_conn_unref(d->conn);
                psd__wait_put(srv, d);
            }
            t->declares = NULL;
        }
    } else if (job->kind == JOB_DROP) {
        drop_done(srv, job);
    } else if (pinned) {
        apply_wait(srv, job);
    } else {
        bool bsp = srv->m.job.consistency == PS_CONSIST_BSP;
        for (uint32_t i = 0; i < job->nitems; i++) {
            psd_chunk_t *ch = job->items[i];
            uint64_t bad = job->rc == 0 ? job->bad[i] : 0;
            if (bad) {
                /* Corrupted in transit: never applied; only its sender sends it again. Under
                 * bsp the step's other pushes of the chunk were not applied either (the step
                 * is applied whole): they are full again, unacknowledged (neither a slot nor a
                 * push area was written by the sum), and the chunk is applied when the
                 * corrupted ones are back. */
                srv->crc_errors += (uint64_t)__builtin_popcountll(bad);
                SLOTS_FOR(ch, s) {
                    uint32_t r = s->rank;
                    if (s->state != SLOT_APPLYING) continue;
                    if (!(bad >> r & 1)) {
                        if (bsp) {
                            s->state = SLOT_FULL;
                            ch->nfull++;
                            ch->full_mask |= 1ull << r;
                        }
                        continue;
                    }
                    PS_LOG(PS_LOG_WARN, "shard", "checksum mismatch on the %u/%u push from "
                           "rank %u: rejected", ch->tensor, ch->chunk, r);
                    if (s->conn)
                        psd_send_crc_error(srv, s->conn, s->req, ch->tensor, ch->chunk, "push");
                    psd__drop_slot(ch, r);
                }
            }
            uint32_t applied = 0;
            SLOTS_FOR(ch, s) applied += s->state == SLOT_APPLYING;
            if (job->rc == 0 && !(bsp && bad)) {
                if (bsp) ch->summed[ch->version % PSD_SUMMED_RING] = ch->step_members;
                if (bsp) ch->skipped += ch->sum_members == 0; /* the step made no update */
                ch->version += bsp ? 1 : applied;
                psd_integrity_chunk_hashed(srv, ch, job->hashes[i]);
            }
            uint64_t odd = job->rc == 0 && !(bsp && bad) ? job->nonfinite[i] : 0;
            if (odd) nonfinite_report(srv, ch, odd);
            if (job->rc == 0 && job->params_odd[i] != PSD_PARAMS_KEPT)
                params_odd_report(srv, ch, job->params_odd[i] == PSD_PARAMS_ODD);
            /* A bsp replay skipped (skip_mask: its bit stays while its slot applies) is
             * acknowledged as not summed: its worker's error feedback takes it back. */
            SLOTS_FOR(ch, s)
                if (s->state == SLOT_APPLYING)
                    ack_slot(srv, ch, s->rank, job->rc, ch->version,
                             ((odd >> s->rank & 1) ? PS_FLAG_NONFINITE : 0) |
                                 (bsp && (ch->skip_mask >> s->rank & 1) ? PS_FLAG_UNSUMMED : 0));
            SLOTS_FOR(ch, s)
                if (bsp && s->state == SLOT_FULL && s->step < ch->version) {
                    /* Landed during the apply for the step just applied without it: dropped,
                     * like any stale push. */
                    ch->nfull--;
                    ch->full_mask &= ~(1ull << s->rank);
                    psd__stale_slot_done(srv, ch, s->rank);
                }
            ch->queued = false;
            ch->applying = false;
            /* Updates the optimizer applied: under bsp one per step (of all its pushes) that
             * had a gradient, under asp / ssp one per push; none when the job failed. */
            if (job->rc == 0 && !(bsp && bad))
                srv->applied_updates += bsp ? ch->sum_members != 0 /* a step with no gradient
                                                                    passes: no update */
                                            : applied - (uint32_t)__builtin_popcountll(odd);
            if (job->rc) {
                for (psd_wait_t *w = ch->pulls, *nx; w; w = nx) {
                    nx = w->next;
                    psd_send_error(srv, w->conn, w->req_id, job->rc,
                                   "update of %u/%u failed: %s", ch->tensor, ch->chunk,
                                   ps_strerror(job->rc));
                    psd_conn_unref(w->conn);
                    psd__wait_put(srv, w);
                }
                ch->pulls = NULL;
            }
            answer_pulls(srv, ch);
            psd__chunk_maybe_ready(srv, ch);
        }
    }
    psd_ckpt_after_job(srv); /* a checkpoint waiting for this step takes its snapshot next */
    psd_outbox_end(srv);
    srv->job_running = false;
    psd__job_start_next(srv);
    if (!srv->job_running && !srv->slot_running) psd_server_maybe_stop(srv);
}

void psd__drop_slot(psd_chunk_t *ch, uint32_t r)
{
    psd_slot_t *s = slot_at(ch, r);
    if (s->conn) psd_conn_unref(s->conn);
    s->conn = NULL;
    psd__slot_empty(ch, r);
}

/* Room for @p n hashes in the job (grows only: steady training allocates nothing). */
static int job_hashes_reserve(psd_job_t *job, uint32_t n)
{
    if (n <= job->cap_hashes) return 0;
    uint64_t *h = realloc(job->hashes, n * sizeof *h);
    if (h == NULL) return PS_ENOMEM;
    job->hashes = h;
    uint64_t *b = realloc(job->bad, n * sizeof *b);
    if (b == NULL) return PS_ENOMEM;
    job->bad = b;
    b = realloc(job->nonfinite, n * sizeof *b);
    if (b == NULL) return PS_ENOMEM;
    job->nonfinite = b;
    uint8_t *po = realloc(job->params_odd, n * sizeof *po);
    if (po == NULL) return PS_ENOMEM;
    job->params_odd = po;
    const psd_chunk_hdr_t **o = realloc(job->olds, n * sizeof *o);
    if (o == NULL) return PS_ENOMEM;
    job->olds = o;
    psd_chunk_hdr_t **r = realloc(job->recs, n * sizeof *r);
    if (r == NULL) return PS_ENOMEM;
    job->recs = r;
    uint32_t *d = realloc(job->deferred, n * sizeof *d);
    if (d == NULL) return PS_ENOMEM;
    job->deferred = d;
    job->cap_hashes = n;
    return 0;
}

/* ---- the slot for other exclusive work ------------------------------------ */

static void slot_work(uv_work_t *w)
{
    psd_slot_work_t *s = w->data;
    s->run(s);
    ps_ucx_spin_stop(&s->srv->ucx);
}

static void slot_done(uv_work_t *w, int status)
{
    psd_slot_work_t *s = w->data;
    psd_server_t *srv = s->srv;
    ps_ucx_spin_resume(&srv->ucx); /* slot_work stopped it */
    srv->slot_running = false;
    /* It may have committed (the coordinator's state, a repair): pull replies take a snapshot
     * of that, not the one before (a probe saw psd's own reader age with every psctl scale
     * on an idle shard 0: psd_store_oldest_snapshot_commits). */
    snapshot_stale(srv);
    s->done(s); /* may free s */
    psd__job_start_next(srv);
    if (!srv->job_running && !srv->slot_running) psd_server_maybe_stop(srv);
}

void psd_shard_slot_queue(psd_server_t *srv, psd_slot_work_t *w)
{
    w->next = NULL;
    if (srv->slot_tail)
        srv->slot_tail->next = w;
    else
        srv->slot_head = w;
    srv->slot_tail = w;
    psd__job_start_next(srv);
}

/* Run the first queued slot work if the slot is free. @return true when it started. */
static bool slot_start(psd_server_t *srv)
{
    psd_slot_work_t *s = srv->slot_head;
    if (s == NULL) return false;
    srv->slot_head = s->next;
    if (srv->slot_head == NULL) srv->slot_tail = NULL;
    s->work.data = s;
    srv->slot_running = true;
    int rc = uv_queue_work(srv->loop, &s->work, slot_work, slot_done);
    if (rc) { /* run it here rather than lose it: the slot is ours anyway */
        PS_LOG(PS_LOG_ERROR, "shard", "uv_queue_work: %s", uv_strerror(rc));
        s->run(s);
        srv->slot_running = false;
        snapshot_stale(srv);
        s->done(s);
        return false;
    }
    return true;
}

/* The record bytes an apply job reads and writes (its items' params and state). */
size_t psd__job_bytes(const psd_server_t *srv, const psd_job_t *job)
{
    size_t b = 0;
    if (job->kind == JOB_CREATE) /* its own copy of the chunks: srv->tensors may move */
        return psd__chunks_footprint(srv, job->chunks, job->nchunks);
    if (job->kind == JOB_DROP) return 0; /* deletes only */
    for (uint32_t i = 0; i < job->nitems; i++)
        b += psd_chunk_bytes(job->items[i]->n, srv->nstate);
    return b;
}

void psd__job_start_next(psd_server_t *srv)
{
    if (srv->job_running || srv->slot_running) return;
    if (slot_start(srv)) return;
    psd_job_t *job = &srv->job;
    job->srv = srv;
    job->rc = 0;
    job->work.data = job;
    if (srv->ncreate > 0 && (srv->create_queue[0] & PSD_QUEUE_DROP)) {
        job->kind = JOB_DROP;
        job->tensor = srv->create_queue[0] & ~PSD_QUEUE_DROP;
        memmove(srv->create_queue, srv->create_queue + 1, (srv->ncreate - 1) * sizeof(uint32_t));
        srv->ncreate--;
        job->decl = srv->tensors[job->tensor].decl;
        job->nchunks = srv->tensors[job->tensor].nchunks;
        job->drop_gen = 0; /* a trained one (a chunk past version 0) changes the floor key */
        for (uint32_t c = 0; c < job->nchunks && !srv->test_no_floor && !job->drop_gen; c++) {
            const psd_chunk_t *ch = srv->tensors[job->tensor].chunks[c];
            if (ch && ch->version > 0) job->drop_gen = srv->drop_gen + 1;
        }
    } else if (srv->ncreate > 0) {
        job->kind = JOB_CREATE;
        job->start_ns = uv_hrtime();
        job->tensor = srv->create_queue[0];
        memmove(srv->create_queue, srv->create_queue + 1, (srv->ncreate - 1) * sizeof(uint32_t));
        srv->ncreate--;
        job->decl = srv->tensors[job->tensor].decl;
        job->chunks = srv->tensors[job->tensor].chunks;
        job->nchunks = srv->tensors[job->tensor].nchunks;
        job->values = srv->tensors[job->tensor].values ? srv->tensors[job->tensor].values->buf
                                                       : NULL;
        if (job_hashes_reserve(job, job->nchunks)) {
            srv->create_queue[srv->ncreate++] = job->tensor; /* tried again after the next job */
            return;
        }
    } else if (srv->ready_head && (srv->pinned_since_ms == 0 || srv->pinned_retry)) {
        /* (while updates wait for an old snapshot: only at the cron's tick, store_pinned) */
        job->kind = JOB_APPLY;
        job->nitems = 0;
        /* Take the ready chunks (up to max_bytes): one transaction, one commit. */
        uint32_t cap = 0;
        for (psd_chunk_t *c = srv->ready_head; c; c = c->next_ready) cap++;
        if (cap > srv->cap_items) {
            /* Room for every chunk this shard holds, the most one job can take: grown by the
             * first steps, not later, when more chunks happen to be ready at once (seen in a
             * CI run, session 50: hot_path_allocations_tcp, one realloc here in 200 steps). */
            uint32_t all = psd__held_chunks(srv);
            if (all < cap) all = cap;
            psd_chunk_t **items = realloc(job->items, all * sizeof *items);
            if (items == NULL) return;
            job->items = items;
            srv->cap_items = all;
        }
        if (job_hashes_reserve(job, srv->cap_items)) return;
        bool bsp = srv->m.job.consistency == PS_CONSIST_BSP;
        size_t bytes = 0, max_bytes = (size_t)PSD_JOB_MAX_BYTES * srv->fanout.nthreads;
        psd_chunk_t *c = srv->ready_head;
        for (; c; c = c->next_ready) {
            /* At most PSD_JOB_MAX_BYTES of records per job and thread: its acks and the pulls
             * waiting for its chunks go out at its commit, while the rest is applied in the
             * next one. */
            if (job->nitems > 0 && bytes >= max_bytes) break;
            uint64_t members;
            if (!psd__chunk_ready(srv, c, &members)) {
                c->queued = false; /* no longer ready; queued again when it is */
                continue;
            }
            if (bsp && members == 0)
                PS_LOG(PS_LOG_INFO, "shard", "step %llu of %u/%u: the coordinator closed it with "
                       "no member left; passed as it is", (unsigned long long)c->version,
                       c->tensor, c->chunk);
            PS_LOG(PS_LOG_DEBUG, "shard", "applies step %llu of %u/%u: members %#llx, pushed "
                   "%#llx, replays skipped %#llx", (unsigned long long)c->version, c->tensor,
                   c->chunk, (unsigned long long)members, (unsigned long long)c->full_mask,
                   (unsigned long long)(c->skip_mask & members));
            job->items[job->nitems++] = c;
            bytes += psd_chunk_bytes(c->n, srv->nstate);
            c->step_members = members;
            c->applying = true;
            c->sum_members = members & ~c->skip_mask & ~c->nograd_mask;
            /* A mean tensor's values: the mean of those pushed (no "zero" from a member
             * without one). */
            c->mean_of = (uint32_t)__builtin_popcountll(c->mean ? c->sum_members
                                                                : members & ~c->skip_mask);
            c->applying_mask = 0;
            SLOTS_FOR(c, s) {
                uint32_t r = s->rank;
                if (s->state != SLOT_FULL) continue;
                c->nfull--;
                c->full_mask &= ~(1ull << r);
                if (members >> r & 1) {
                    s->state = SLOT_APPLYING;
                    c->applying_mask |= 1ull << r;
                } else {
                    /* Pushed by a rank that left the step (removed mid-step): never applied. */
                    if (s->conn) /* per chunk: a direct push's place is let go (libps) */
                        psd_send_chunk_error(srv, s->conn, s->req, c->tensor, c->chunk,
                                             PS_ENOTMEMBER, "push of %u/%u for step %llu: rank "
                                             "%u is not a member of that step any more",
                                             c->tensor, c->chunk,
                                             (unsigned long long)c->version, r);
                    psd__drop_slot(c, r);
                }
            }
        }
        srv->ready_head = c; /* the chunks left for the next job, still queued */
        if (c == NULL) srv->ready_tail = NULL;
        if (job->nitems == 0) return;
        if (srv->coord) {
            /* The coordinator's step, members and cursor commit with the updates. */
            size_t len;
            if (job->coord_state == NULL) job->coord_state = malloc(PSD_COORD_STATE_MAX);
            if (job->coord_state) job->coord_len = psd_coord_state_pack(srv, job->coord_state);
            job->coord_step = psd_coord_bsp_step(srv);
            job->coord_rec_len = 0;
            const void *rec = psd_coord_rec(srv, &len); /* only when it changed */
            if (rec && job->coord_rec == NULL) job->coord_rec = malloc(PSD_COORD_REC_MAX);
            if (rec && job->coord_rec) {
                memcpy(job->coord_rec, rec, len);
                job->coord_rec_len = len;
            } else if (rec) {
                psd_coord_rec_unsaved(srv); /* no memory now: the next job takes it */
            }
        }
    } else {
        return;
    }
    srv->job_running = true;
    /* Run an update on the loop thread when the pool buys nothing: a small one costs less than
     * the pool's two thread hand-offs (~45 us each on a 2-vCPU VM), and one of a single record
     * cannot be spread over the fan-out anyway. On that VM the single-record rule made psbench's
     * 1x1 rounds 15-30 % faster at 4 and 16 MiB on shm and tcp (1 MiB sgd chunks: ~60 us of
     * apply against ~90 us of hand-offs); records of several chunks still go to the pool, where
     * the fan-out applies them in parallel. Not nested: a job that becomes ready while this one
     * finishes goes to the pool. */
    size_t bytes = job->kind == JOB_APPLY ? psd__job_bytes(srv, job) : SIZE_MAX;
    job->slow = job->kind == JOB_APPLY && srv->test_slow_apply &&
                job->items[0]->version + 1 == srv->test_slow_apply;
    if (job->slow) {
        srv->test_slow_apply = 0; /* once; on the pool, so the loop goes on */
        if (srv->test_slow_apply_hold)
            PS_LOG(PS_LOG_WARN, "shard", "the apply of step %llu waits while %s exists "
                   "(PS_TEST_SLOW_APPLY_HOLD)", (unsigned long long)job->items[0]->version,
                   srv->test_slow_apply_hold);
        else
            PS_LOG(PS_LOG_WARN, "shard", "the apply of step %llu takes 2 s longer "
                   "(PS_TEST_SLOW_APPLY)", (unsigned long long)job->items[0]->version);
    }
    if (!srv->job_inline && !job->slow && (bytes <= PSD_INLINE_APPLY_BYTES ||
                             (job->nitems == 1 && bytes <= PSD_INLINE_RECORD_BYTES))) {
        srv->job_inline = true;
        job->pooled = false;
        psd__job_work(&job->work);
        job_done(&job->work, 0);
        srv->job_inline = false;
        return;
    }
    job->pooled = true; /* read by psd__job_work on the pool thread: set before it is queued */
    int rc = uv_queue_work(srv->loop, &job->work, psd__job_work, job_done);
    if (rc) {
        PS_LOG(PS_LOG_ERROR, "shard", "uv_queue_work: %s", uv_strerror(rc));
        srv->job_running = false;
        if (job->coord_rec_len) psd_coord_rec_unsaved(srv); /* its copy is not written */
    }
}
