/* shard_internal.h: what the modules of a shard's data path share (psd__; server.h holds the
 * state and psd_shard_*, the functions the rest of psd calls). A shard's modules:
 *   shard.c     the tensor table (chunks, push slots, the name index), loading it from the
 *               store, status and totals, membership views, waiting requests;
 *   declare.c   declarations, a model's own values sent by its declarer, dropping a tensor;
 *   pull.c      pull replies from a snapshot of the store;
 *   push.c      receiving pushes: which are taken, which were had already, when a chunk is
 *               ready to apply;
 *   apply.c     a store job's transaction on the pool (or inline): creating tensors,
 *               summing pushes and applying the optimizer, dropping a tensor's records;
 *   storejob.c  store jobs on the loop thread: which runs next, and what its commit answers
 *               (acks, pulls, declarations), reports and health; the slot for other exclusive
 *               work (psd_shard_slot_queue).
 * Everything here runs on the loop thread unless it says otherwise; what a running store job
 * calls on the pool thread (psd__job_work) reads only what the loop leaves alone while it runs:
 * its items' chunks and slots (slot_at, slot_data) and the store's geometry (psd__job_bytes,
 * psd__chunks_footprint). */
#ifndef PSD_SHARD_INTERNAL_H
#define PSD_SHARD_INTERNAL_H

#include "server.h"

/* bsp: a chunk's apply members (its summed ring), stored (key 'D', as asp's applied-push record)
 * by an apply whose members differ from the step before's: every apply after @c step had the
 * same members as it, so that a restarted shard still knows whose batches its chunks have
 * (replay_had, stale_push_had) for as many steps back as one that ran all along. Written by
 * run_apply (apply.c), read back by shard.c (summed_parse, which also reads older forms). */
typedef struct {
    uint64_t step;                     /* the apply that wrote it */
    uint64_t from;                     /* the first step known then */
    uint64_t members[PSD_SUMMED_RING]; /* at [s % ring] for s in [from, step], the last ring */
    uint64_t skipped;                  /* the chunk's skipped steps up to and with @c step */
} psd_summed_rec_t;

/* ---- push slots (shard.c) ---------------------------------------------------------------- */

/* Rank @p r's slot of @p ch, or NULL when no rank of its group pushed to the chunk yet. */
static inline psd_slot_t *slot_at(const psd_chunk_t *ch, uint32_t r)
{
    psd_slot_t *g = ch->slot_group[r / PSD_SLOT_GROUP];
    return g ? &g[r % PSD_SLOT_GROUP] : NULL;
}

/* The first allocated slot of @p ch from rank @p r on, or NULL: with SLOTS_FOR, every slot
 * that ever held a push (the others are empty). */
static inline psd_slot_t *slot_from(const psd_chunk_t *ch, uint32_t r)
{
    for (; r < PS_MAX_RANKS; r = (r / PSD_SLOT_GROUP + 1) * PSD_SLOT_GROUP)
        if (ch->slot_group[r / PSD_SLOT_GROUP]) return slot_at(ch, r);
    return NULL;
}

#define SLOTS_FOR(ch, s) for (psd_slot_t *s = slot_from(ch, 0); s; s = slot_from(ch, s->rank + 1))

/* Slot @p r's data (the slot exists): a direct push's place in its area, or its own buffer. */
static inline const uint8_t *slot_data(const psd_chunk_t *ch, uint32_t r)
{
    const psd_slot_t *s = slot_at(ch, r);
    return s->ext.data ? s->ext.data : s->buf;
}

/* Rank @p r's slot of @p ch, its group allocated (empty slots, owned by the chunk) when it has
 * none yet; NULL: out of memory. */
psd_slot_t *psd__slot_get(psd_chunk_t *ch, uint32_t r);
/* Slot @p r (it exists) is free again; a direct push's area reference is dropped. Its buffer
 * stays for the next push; its connection reference is the caller's (psd__drop_slot). */
void psd__slot_empty(psd_chunk_t *ch, uint32_t r);
/* Slot @p r is free again, its connection reference dropped too (storejob.c). */
void psd__drop_slot(psd_chunk_t *ch, uint32_t r);

/* ---- the tensor table (shard.c) ---------------------------------------------------------- */

/* Enter tensor @p d (copied) into the table with chunk states for the chunks this shard owns
 * (@p ready: created in the store already). 0, or PS_ENOMEM: what was made stays for
 * psd__tensor_forget. */
int psd__tensor_add(psd_server_t *srv, const ps_decl_t *d, bool ready);
/* Forget tensor @p id: its chunks and values are freed; its waiters stay for the caller to
 * answer. @p reuse: shard 0 hands its id out again when it is the last. */
void psd__tensor_forget(psd_server_t *srv, uint32_t id, bool reuse);
/* This shard's chunks of @p t. */
uint32_t psd__local_chunks(const psd_tensor_t *t);
/* The chunks this shard holds, of every tensor present. */
uint32_t psd__held_chunks(const psd_server_t *srv);
/* The map bytes (a lower bound) of the records of a tensor's @p nchunks @p chunks here (NULL:
 * another shard's). Also on the pool thread (psd__job_bytes). */
uint64_t psd__chunks_footprint(const psd_server_t *srv, psd_chunk_t *const *chunks,
                               uint32_t nchunks);
/* A lower bound of the map bytes the records of tensor @p d take on shard @p shard. */
uint64_t psd__records_bytes(const psd_server_t *srv, const ps_decl_t *d, uint32_t shard);
/* bsp: whether the coordinator closed step @p step with no member left (a chunk at it passes
 * it as it is). */
bool psd__step_closed_empty(const psd_server_t *srv, uint64_t step);

/* ---- waiting requests (shard.c) ---------------------------------------------------------- */

/* Put request @p req_id of @p conn (a reference taken) at the head of @p list, from the free
 * list or malloc'd. 0, or PS_ENOMEM with nothing taken. */
int psd__wait_add(psd_server_t *srv, psd_wait_t **list, psd_conn_t *conn, uint64_t req_id,
                  uint64_t min_version, uint32_t codec, uint32_t flags, uint64_t asked_ns);
/* @p w (out of its list, its connection reference dropped by the caller) back to the free list. */
void psd__wait_put(psd_server_t *srv, psd_wait_t *w);
/* Remove @p conn's requests from @p list, unanswered (its references dropped). */
void psd__waits_drop_conn(psd_server_t *srv, psd_wait_t **list, psd_conn_t *conn);

/* ---- declarations (declare.c) ------------------------------------------------------------ */

/* Answer declaration @p req_id of @p conn with tensor @p t and its lowest chunk version here. */
void psd__reply_declare(psd_server_t *srv, psd_conn_t *conn, uint64_t req_id, psd_tensor_t *t);
/* Free the values sent for @p t's creation (if any) and its giver's reference. */
void psd__values_free(psd_tensor_t *t);
/* Tensor @p id's creation failed (@p rc): the declarations waiting fail, and it is forgotten. */
void psd__create_failed(psd_server_t *srv, uint32_t id, int rc);
/* The worker sending tensor @p id's values went before all came: another declarer is asked,
 * or the tensor is initialized, or forgotten. */
void psd__values_giver_gone(psd_server_t *srv, uint32_t id);

/* ---- pulls (pull.c) ---------------------------------------------------------------------- */

/* Answer pull @p req_id of @p conn with chunk @p ch's committed record (from the current
 * snapshot; @p codec, @p flags PS_FLAG_DIRECT: the version to read only). Nothing of the
 * caller's is kept; @p conn's reference stays the caller's. */
void psd__send_pull_reply(psd_server_t *srv, psd_conn_t *conn, uint64_t req_id, psd_chunk_t *ch,
                          uint32_t codec, uint32_t flags, uint64_t asked_ns);
/* A retired snapshot's read transaction is reset, not freed, and renewed for the next one. */
void psd__snap_retire(psd_server_t *srv, psd_snap_t *s);
/* The chunk @p msg names, or NULL after refusing the message. */
psd_chunk_t *psd__find_chunk(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg);

/* ---- pushes (push.c) --------------------------------------------------------------------- */

/* Whether @p ch can be applied now; bsp: *@p members, its step's members. */
bool psd__chunk_ready(const psd_server_t *srv, const psd_chunk_t *ch, uint64_t *members);
/* Queue @p ch for the next apply job when it is ready (and not queued); a job starts unless
 * inside a bundle. */
void psd__chunk_maybe_ready(psd_server_t *srv, psd_chunk_t *ch);
/* bsp: slot @p r of @p ch holds a push of a step the chunk passed: acknowledged as stale and
 * dropped. */
void psd__stale_slot_done(psd_server_t *srv, psd_chunk_t *ch, uint32_t r);
/* Record @p a after the push in slot @p r of @p ch committed (sender, request, batch). Loop
 * thread, or an apply job on a copy. */
void psd__applied_commit(psd_applied_t *a, const psd_chunk_t *ch, uint32_t r);

/* ---- store jobs (apply.c, storejob.c) ---------------------------------------------------- */

/* Run store job @p w->data (srv->job) in one write transaction: on the pool thread, or inline
 * on the loop thread (job->pooled false). Sets job->rc; touches nothing the loop changes while
 * the job runs. */
void psd__job_work(uv_work_t *w);
/* The record bytes an apply job reads and writes (its items' params and state). Loop thread,
 * or the pool thread from psd__job_work. */
size_t psd__job_bytes(const psd_server_t *srv, const psd_job_t *job);
/* Start the next store job (a drop, a create, then the ready chunks) unless one or the slot's
 * work runs. */
void psd__job_start_next(psd_server_t *srv);

#endif
