/* push.c: receiving pushes into their chunk's slots: a push had already (a replay, a resend,
 * a stale step) is acknowledged without being taken again; a chunk whose step every member
 * pushed is queued for the next apply job. */
#include <stdarg.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "shard_internal.h"
#include "tcpguard.h"

/* Whether @p ch can be applied now: asp / ssp, a push is there; bsp, every member of its step
 * (*@p members) pushed, or the coordinator closed that step with none (psd__step_closed_empty). */
bool psd__chunk_ready(const psd_server_t *srv, const psd_chunk_t *ch, uint64_t *members)
{
    if (srv->m.job.consistency != PS_CONSIST_BSP) {
        *members = ~0ull;
        return ch->nfull > 0;
    }
    *members = psd_shard_members(srv, ch->version, NULL);
    return *members != 0 ? (ch->full_mask & *members) == *members
                         : psd__step_closed_empty(srv, ch->version);
}

void psd__chunk_maybe_ready(psd_server_t *srv, psd_chunk_t *ch)
{
    uint64_t members;
    if (!psd__chunk_ready(srv, ch, &members) || ch->queued) return;
    ch->queued = true;
    ch->next_ready = NULL;
    if (srv->ready_tail)
        srv->ready_tail->next_ready = ch;
    else
        srv->ready_head = ch;
    srv->ready_tail = ch;
    /* Inside a bundle or a job's end, more chunks may become ready: they go in one job
     * (one transaction) started at the end (psd_shard_kick). */
    if (srv->bundling == 0) psd__job_start_next(srv);
}

void psd_shard_kick(psd_server_t *srv) { psd__job_start_next(srv); }

/* Refuse push @p req of chunk @p ch with @p status, naming the chunk (PS_FLAG_CHUNK) and its
 * step; @p behind: PS_FLAG_BEHIND, its sender sends it again shortly. @p fmt says why. */
static void refuse_push(psd_server_t *srv, psd_conn_t *conn, uint64_t req, const psd_chunk_t *ch,
                        int status, bool behind, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static void refuse_push(psd_server_t *srv, psd_conn_t *conn, uint64_t req, const psd_chunk_t *ch,
                        int status, bool behind, const char *fmt, ...)
{
    ps_msg_t e = {.type = PS_MSG_ERROR, .req_id = req, .status = status, .shard = srv->shard,
                  .tensor = ch->tensor, .chunk = ch->chunk, .step = ch->version,
                  .flags = PS_FLAG_CHUNK | (behind ? PS_FLAG_BEHIND : 0)};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.error, sizeof e.error, fmt, ap);
    va_end(ap);
    psd_send_msg(srv, conn, &e);
}

/* Push slot @p s's data landed (or did not: @p status). */
static void push_received(psd_slot_t *s, ucs_status_t status)
{
    psd_chunk_t *ch = s->chunk;
    uint32_t rank = s->rank;
    psd_server_t *srv = s->conn->srv;
    if (status != UCS_OK) {
        PS_LOG(PS_LOG_WARN, "shard", "push of %u/%u from rank %u lost: %s", ch->tensor, ch->chunk,
               rank, ucs_status_string(status));
        /* Its sender, connected still (a receive that failed on a live endpoint: a
         * registration, memory), sends it again shortly (PS_FLAG_BEHIND), as for a copy still
         * landing. Before, it was told nothing and waited for good (a review, session 63); a
         * broken connection's sender sends it again after its reconnect anyway. */
        if (s->conn && !s->conn->dead)
            refuse_push(srv, s->conn, s->req, ch, PS_ETRANSPORT, true, "push of %u/%u from rank "
                        "%u for step %llu: its receive failed (%s)", ch->tensor, ch->chunk, rank,
                        (unsigned long long)s->step, ucs_status_string(status));
        psd__drop_slot(ch, rank);
        return;
    }
    if (srv->m.job.consistency == PS_CONSIST_BSP && s->step != ch->version) {
        /* The step was applied while this push was landing, without its rank: stale. */
        psd__stale_slot_done(srv, ch, rank);
        return;
    }
    /* A raw push's CRC-32C is checked in the apply pass, block by block while the sum reads it
     * (run_apply): one pass over the gradient less. A codec's payload is checked here. */
    if (s->codec.kind != PSK_CODEC_NONE && ps_crc32c(0, s->buf, s->len) != s->crc) {
        /* Corrupted in transit: never applied; the sender sends it again. */
        srv->crc_errors++;
        PS_LOG(PS_LOG_WARN, "shard", "checksum mismatch on the %u/%u push from rank %u: rejected",
               ch->tensor, ch->chunk, rank);
        psd_send_crc_error(srv, s->conn, s->req, ch->tensor, ch->chunk, "push");
        psd__drop_slot(ch, rank);
        return;
    }
    char why[160];
    if (s->codec.kind != PSK_CODEC_NONE &&
        psk_codec_check_why(s->buf, s->len, ch->n, &s->codec, why, sizeof why)) {
        /* Never applied: the sender hears why (what is wrong, not only that something is), the
         * step waits for a good push. */
        PS_LOG(PS_LOG_WARN, "shard", "rejected a malformed %u/%u payload from rank %u: %s",
               ch->tensor, ch->chunk, rank, why);
        psd_send_chunk_error(srv, s->conn, s->req, ch->tensor, ch->chunk, PS_EPROTO,
                             "push of %u/%u: malformed payload: %s", ch->tensor, ch->chunk, why);
        psd__drop_slot(ch, rank);
        return;
    }
    s->state = SLOT_FULL;
    ch->nfull++;
    ch->full_mask |= 1ull << rank;
    srv->pushes++;
    if (srv->trace)
        psd_trace_push(srv->trace, ch->tensor, ch->chunk, rank, s->step, s->arrived_ns,
                       ps_trace_now(), s->ext.data != NULL);
    psd__chunk_maybe_ready(srv, ch);
}

/* bsp: whether chunk @p ch applied step @p s with the batch of one of the ranks @p ranks (a
 * member of that apply: its push summed, or itself skipped as a replay of a batch the chunk
 * had): 1, 0, or -1 when the chunk does not remember that step (too old, or from before this
 * psd loaded the store). A step not applied here yet: 0. */
static int step_had_ranks(const psd_chunk_t *ch, uint64_t s, uint64_t ranks)
{
    if (s >= ch->version) return 0;
    if (s < ch->summed_from || ch->version - s > PSD_SUMMED_RING) return -1;
    return (ch->summed[s % PSD_SUMMED_RING] & ranks) != 0;
}

/* bsp: whether rank @p rank's push @p msg, of a batch handed out again (its replay tags: the
 * steps and ranks that had it before and left mid-step), brings a batch chunk @p ch has
 * already (step_had_ranks for a tag). A tagged step not applied here yet does not count (that
 * rank's push, no longer a member's, is dropped); one not remembered is logged and counted as
 * not applied here, as before replay tags. */
static bool replay_had(psd_server_t *srv, const psd_chunk_t *ch, uint32_t rank,
                       const ps_msg_t *msg)
{
    uint64_t s, ranks;
    for (uint32_t i = 0, at = 0; i < msg->nreplay; at = i) {
        ps_replay_next(msg->replay, msg->nreplay, &i, &s, &ranks);
        int had = step_had_ranks(ch, s, ranks);
        if (had < 0) {
            if (srv->replay_warned != msg->replay[at] + 1) /* once per tag, not per chunk */
                PS_LOG(PS_LOG_WARN, "shard", "push of %u/%u from rank %u replays the batch ranks "
                       "%#llx had at step %llu, which this shard does not remember (at step "
                       "%llu): applied", ch->tensor, ch->chunk, rank, (unsigned long long)ranks,
                       (unsigned long long)s, (unsigned long long)ch->version);
            srv->replay_warned = msg->replay[at] + 1;
        } else if (had) {
            PS_LOG(PS_LOG_DEBUG, "shard", "push of %u/%u from rank %u replays the batch ranks "
                   "%#llx had at step %llu, applied here then: not applied again", ch->tensor,
                   ch->chunk, rank, (unsigned long long)ranks, (unsigned long long)s);
            return true;
        }
    }
    return false;
}

/* bsp: whether an apply of step msg->step with members @p members (whose batches it has) has
 * the batch of rank @p rank's push @p msg: the push's own rank is one of them (a resend), or a
 * replay tag names one of them or a member of an earlier apply here (step_had_ranks; a step not
 * remembered counts as had: nothing to tell). */
static bool apply_had_batch(const psd_chunk_t *ch, uint32_t rank, const ps_msg_t *msg,
                            uint64_t members)
{
    if (members >> rank & 1) return true;
    uint64_t s, ranks;
    for (uint32_t i = 0; ps_replay_next(msg->replay, msg->nreplay, &i, &s, &ranks);)
        if (s == msg->step ? (members & ranks) != 0 : step_had_ranks(ch, s, ranks) != 0)
            return true;
    return false;
}

/* bsp: whether chunk @p ch, past step msg->step, applied that step with the batch of rank
 * @p rank's push @p msg (apply_had_batch with summed[]). A step it does not remember counts as
 * had (as before stale acknowledgements). False only for a batch that apply did not have:
 * pushed by a member of the step handed out again after every member left it (or by a rank
 * removed before this chunk's apply, whose batch went back already). */
static bool stale_push_had(const psd_chunk_t *ch, uint32_t rank, const ps_msg_t *msg)
{
    uint64_t s = msg->step;
    if (s < ch->summed_from || ch->version - s > PSD_SUMMED_RING) return true;
    return apply_had_batch(ch, rank, msg, ch->summed[s % PSD_SUMMED_RING]);
}

/* bsp: the flags of the ack of rank @p rank's push @p msg of a step chunk @p ch passed:
 * PS_FLAG_STALE when that step's apply did not have its batch (stale_push_had); else
 * PS_FLAG_UNSUMMED when the step is remembered and its rank was not a member of that apply
 * (the batch came from another push, named by the push's replay tags); else 0 (a resend of a
 * push that apply had; one it skipped as a replay is not told apart: the ring keeps members). */
static uint32_t stale_ack_flags(const psd_chunk_t *ch, uint32_t rank, const ps_msg_t *msg)
{
    if (!stale_push_had(ch, rank, msg)) return PS_FLAG_STALE;
    uint64_t s = msg->step;
    bool known = s >= ch->summed_from && ch->version - s <= PSD_SUMMED_RING;
    return known && !(ch->summed[s % PSD_SUMMED_RING] >> rank & 1) ? PS_FLAG_UNSUMMED : 0;
}

/* Acknowledge push @p req of @p conn (rank @p rank, for @p step) of chunk @p ch without applying
 * it: applied before (@p flags 0), or (bsp) of a step the chunk passed, with PS_FLAG_STALE when
 * that step's apply did not have its batch, so that its worker reports it and the coordinator
 * hands the batch out again; PS_FLAG_UNSUMMED: its batch was applied from another push. */
static void send_push_ack(psd_server_t *srv, psd_conn_t *conn, uint64_t req, psd_chunk_t *ch,
                          uint32_t rank, uint64_t step, uint32_t flags)
{
    ps_msg_t a = {.type = PS_MSG_PUSH_ACK, .req_id = req, .tensor = ch->tensor,
                  .chunk = ch->chunk, .step = ch->version, .shard = srv->shard, .flags = flags};
    if (flags & PS_FLAG_STALE) {
        srv->stale_acks++;
        PS_LOG(PS_LOG_INFO, "shard", "push of %u/%u from rank %u for step %llu: the chunk "
               "applied that step without its batch (it is at step %llu): not applied, and "
               "acknowledged as such", ch->tensor, ch->chunk, rank, (unsigned long long)step,
               (unsigned long long)ch->version);
    }
    if (conn && !conn->dead) psd_send_msg(srv, conn, &a);
}

/* bsp: slot @p r of @p ch holds a push of a step the chunk passed while it landed or waited
 * (a job applied the step without its rank): acknowledged as stale (stale_lack) and dropped. */
void psd__stale_slot_done(psd_server_t *srv, psd_chunk_t *ch, uint32_t r)
{
    psd_slot_t *s = slot_at(ch, r);
    PS_LOG(PS_LOG_INFO, "shard", "push of %u/%u from rank %u for step %llu came while the "
           "chunk applied that step without it (now at %llu)", ch->tensor, ch->chunk, r,
           (unsigned long long)s->step, (unsigned long long)ch->version);
    /* Never summed (its rank was not in that apply): its batch goes out again, or that apply
     * had it from another push. */
    send_push_ack(srv, s->conn, s->req, ch, r, s->step,
                  (ch->stale_lack >> r & 1) ? PS_FLAG_STALE : PS_FLAG_UNSUMMED);
    psd__drop_slot(ch, r);
}

/* Record @p a (a chunk's, or the copy an apply job stores) after the push in slot @p r of @p ch
 * committed: that push's sender, request and batch. When another process pushed before on this
 * rank, its last batch goes into the ring: a replay of a dead worker's batch is still known
 * after its rank changed hands. */
void psd__applied_commit(psd_applied_t *a, const psd_chunk_t *ch, uint32_t r)
{
    psd_done_t *d = &a->done[r];
    const psd_slot_t *s = slot_at(ch, r);
    if (d->who != s->who && d->batch != 0)
        a->orphan[a->orphan_next++ % PSD_ORPHAN_RING] = d->batch;
    *d = (psd_done_t){s->who, s->req, s->batch};
}

/* The ranks push @p msg's replay tags name, whatever their steps. */
static uint64_t tagged_ranks(const ps_msg_t *msg)
{
    uint64_t tagged = 0, step, ranks;
    for (uint32_t i = 0; ps_replay_next(msg->replay, msg->nreplay, &i, &step, &ranks);)
        tagged |= ranks;
    return tagged;
}

/* asp / ssp: the other half of batch_applied_here. A tagged push (a batch handed out again: its
 * tags name the ranks that had it and left) is remembered when this chunk takes it. A push of
 * that batch from a rank named there, whose own tags do not name its rank, is the late push of
 * a worker that held the batch before (stopped or cut off past the heartbeat timeout, then
 * continued while its connection here was still up): acknowledged, not applied a second time.
 * That is the first holder (its push is untagged) or a later one that left too (its tags name
 * only the ranks before it). A new process on a departed rank that is handed the batch pushes
 * it with that rank among its tags, so it is not turned away. True when @p msg is such a late
 * push (a tagged one is remembered by batch_remember once a slot took it: a review, session
 * 63, found one refused after it was remembered, which then turned the first holder's late push
 * away too). @p tagged: the ranks its tags name (tagged_ranks). */
static bool batch_taken_again(psd_server_t *srv, psd_chunk_t *ch, uint32_t rank,
                              const ps_msg_t *msg, uint64_t key, uint64_t tagged)
{
    if (!(tagged >> rank & 1))
        for (uint32_t k = 0; k < PSD_AGAIN_RING; k++)
            if (ch->again_key[k] == key && (ch->again_ranks[k] >> rank & 1)) {
                PS_LOG(PS_LOG_INFO, "shard", "push of %u/%u from rank %u brings the batch of pass "
                       "%llu at %llu, which this chunk took from the worker it was handed to "
                       "again: acknowledged, not applied twice", ch->tensor, ch->chunk, rank,
                       (unsigned long long)msg->data_epoch, (unsigned long long)msg->batch_offset);
                srv->replays_skipped++;
                return true;
            }
    return false;
}

/* Chunk @p ch took a push of batch @p key whose tags name @p tagged (nothing when 0). */
static void batch_remember(psd_chunk_t *ch, uint64_t key, uint64_t tagged)
{
    if (key == 0 || tagged == 0) return;
    uint32_t k = ch->again_next++ % PSD_AGAIN_RING;
    ch->again_key[k] = key;
    ch->again_ranks[k] = tagged;
}

/* asp / ssp: whether push @p msg from rank @p rank, of a batch handed out again (its replay tags
 * name the ranks that had it and left), brings a batch chunk @p ch applied already: a tagged
 * rank's record of the pushes it applied here holds the batch (or its slot, the push waiting to
 * be applied or being applied), or another process that held a rank here applied it last
 * (the orphan ring). Pushes are applied on arrival, so there is no step to tell; the batch's
 * key is. A worker's pushes of one batch end before it asks for the next, so a dead rank's
 * last push here is of its last batch. @p who: the pusher's (psd_conn_who); @p tagged: the
 * ranks its tags name (tagged_ranks). */
static bool batch_applied_here(psd_server_t *srv, const psd_chunk_t *ch, uint32_t rank,
                               uint64_t who, const ps_msg_t *msg, uint64_t key, uint64_t tagged)
{
    const psd_applied_t *a = ch->applied;
    bool orphaned = false; /* a process whose rank changed hands applied it here last */
    for (uint32_t o = 0; o < PSD_ORPHAN_RING; o++) orphaned |= a->orphan[o] == key;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        if (!(tagged >> r & 1)) continue;
        /* The pusher's own record does not count (a second push of the batch is the caller's
         * choice); the tagged rank may be its own, held before by the process that died. */
        const psd_slot_t *s = slot_at(ch, r); /* NULL: rank r never pushed here */
        bool in_slot = s && (s->state == SLOT_FULL || s->state == SLOT_APPLYING) &&
                       s->batch == key && s->who != who; /* being applied */
        if (!orphaned && !in_slot && (a->done[r].who == who || a->done[r].batch != key))
            continue;
        PS_LOG(PS_LOG_DEBUG, "shard", "push of %u/%u from rank %u replays the batch of pass %llu "
               "at %llu, which rank %u applied here already: acknowledged, not applied again",
               ch->tensor, ch->chunk, rank, (unsigned long long)msg->data_epoch,
               (unsigned long long)msg->batch_offset, r);
        srv->replays_skipped++;
        return true;
    }
    return false;
}

/* asp / ssp: whether chunk @p ch has the batch of push @p msg (PS_FLAG_BATCH) from rank @p rank
 * already: applied from an earlier holder, when the batch was handed out again (its tags:
 * batch_applied_here), or taken from a later holder, when this is an earlier holder's late
 * push (batch_taken_again). @p who: psd_conn_who. When not, *@p key and *@p tagged are what
 * batch_remember takes once a slot took the push. */
static bool batch_had(psd_server_t *srv, psd_chunk_t *ch, uint32_t rank, uint64_t who,
                      const ps_msg_t *msg, uint64_t *key, uint64_t *tagged)
{
    *key = ps_batch_key(msg->data_epoch, msg->batch_offset);
    *tagged = 0;
    if (*key == 0) return false; /* no key to tell batches by */
    *tagged = tagged_ranks(msg); /* 0: an untagged push */
    if (*tagged && batch_applied_here(srv, ch, rank, who, msg, *key, *tagged)) return true;
    return batch_taken_again(srv, ch, rank, msg, *key, *tagged);
}

static void on_push_recv(void *request, ucs_status_t status, size_t length, void *user_data)
{
    psd_slot_t *slot = user_data;
    psd_server_t *srv = slot->conn->srv;
    if (request) ucp_request_free(request);
    ps_tcpguard_done(slot->buf);
    if (slot == srv->test_late_ref) { /* PS_TEST_LATE_RNDV: seen only later (psd_shard_test_tick) */
        srv->test_late_status = status;
        srv->test_late_due_ms = psd_now_ms() + 3000;
        return;
    }
    push_received(slot, status);
}

void psd_shard_test_tick(psd_server_t *srv)
{
    psd_slot_t *ref = srv->test_late_ref;
    if (ref == NULL || srv->test_late_due_ms == 0 || psd_now_ms() < srv->test_late_due_ms) return;
    srv->test_late_ref = NULL;
    if (ref->state != SLOT_RECEIVING ||        /* receives_lost took it */
        ref->req != srv->test_late_req)         /* and another landed since */
        return;
    PS_LOG(PS_LOG_WARN, "shard", "the receive of %u/%u from rank %u completes now (%s), 3 s "
           "late (PS_TEST_LATE_RNDV)", ref->chunk->tensor, ref->chunk->chunk, ref->rank,
           ucs_status_string(srv->test_late_status));
    push_received(ref, srv->test_late_status);
}

void psd_shard_receives_lost(psd_server_t *srv)
{
    for (uint32_t i = 0; i < srv->ntensors; i++) {
        psd_tensor_t *t = &srv->tensors[i];
        if (!t->present) continue;
        for (uint32_t c = 0; c < t->nchunks; c++) {
            psd_chunk_t *ch = t->chunks[c];
            if (ch == NULL) continue;
            SLOTS_FOR(ch, s)
                if (s->state == SLOT_RECEIVING) push_received(s, UCS_ERR_CANCELED);
        }
    }
}

/* bsp: rank @p r pushed a chunk here for step @p step. Shard 0's coordinator drops a member
 * whose push of the open step has not come job.step_timeout_ms after the first one did
 * (coord.c, late_members). */
static void step_pushed(psd_server_t *srv, uint32_t r, uint64_t step)
{
    if (step > srv->sp_step || srv->sp_mask == 0) {
        srv->sp_step = step;
        srv->sp_mask = 0;
        srv->sp_first_ms = uv_now(srv->loop);
    }
    if (step == srv->sp_step) srv->sp_mask |= 1ull << r;
}

ucs_status_t psd_shard_on_push(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg,
                               void *data, size_t length, const ucp_am_recv_param_t *param)
{
    if (srv->stopping) return UCS_OK; /* not received, not acked: sent again after a restart */
    if (srv->test_crash_armed) {
        PS_LOG(PS_LOG_WARN, "shard", "killed at a push after a batch was handed out "
               "(PS_TEST_CRASH_AFTER_BATCH)");
        raise(SIGKILL);
    }
    if (conn->rank < 0 || msg->rank != conn->rank) {
        psd_send_chunk_error(srv, conn, msg->req_id, msg->tensor, msg->chunk, PS_EPROTO,
                             "push from rank %d, but this peer is rank %d", msg->rank,
                             conn->rank);
        return UCS_OK;
    }
    psd_chunk_t *ch = psd__find_chunk(srv, conn, msg);
    if (ch == NULL) return UCS_OK;
    if (srv->test_refuse_push && msg->codec != PSK_CODEC_NONE && --srv->test_refuse_push == 0) {
        psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_ENOMEM,
                             "push of %u/%u: out of memory (PS_TEST_REFUSE_PUSH)", ch->tensor,
                             ch->chunk);
        return UCS_OK;
    }
    uint32_t rank = (uint32_t)conn->rank;
    psk_codec_t codec = {.kind = (psk_codec_kind_t)msg->codec, .fraction = msg->codec_fraction,
                         .block = msg->codec_block, .fp16_values = msg->codec_flags & 1};
    bool bsp = srv->m.job.consistency == PS_CONSIST_BSP;
    /* A push without a gradient (bsp): headers only, summed as nothing (apply_item). */
    bool nograd = (msg->flags & PS_FLAG_NOGRAD) != 0;
    if (nograd && (!bsp || msg->codec != PSK_CODEC_NONE || (msg->flags & PS_FLAG_DIRECT) ||
                   msg->length || length)) {
        psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_EPROTO,
                       "push of %u/%u without a gradient: %s", ch->tensor, ch->chunk,
                       !bsp ? "only under bsp (asp / ssp: push nothing)"
                            : "it carries no data, codec or push area");
        return UCS_OK;
    }
    /* Raw fp32 travels without a codec header; every codec's size follows from (codec, n). */
    uint64_t want = nograd ? 0
                    : msg->codec == PSK_CODEC_NONE ? (uint64_t)ch->n * 4
                                                   : psk_codec_max_bytes(&codec, ch->n);
    if ((want == 0 && !nograd) || msg->codec > PSK_CODEC_SIGN) {
        psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_EPROTO,
                       "push of %u/%u: unknown or invalid codec %u (fraction %g, block %u)",
                       ch->tensor, ch->chunk, msg->codec, (double)msg->codec_fraction,
                       msg->codec_block);
        return UCS_OK;
    }
    /* A mean tensor's pushes are values (apply.c: the parameters become their mean): a sparse
     * or quantized one would zero or flatten them (a review, session 59; libps refuses them
     * first). fp16 and bf16 only round them. */
    if (ch->mean && !nograd && !psk_codec_elementwise(msg->codec)) {
        static const char *const kinds[] = {"none", "fp16", "bf16", "int8", "topk", "randomk",
                                            "sign"}; /* msg->codec <= PSK_CODEC_SIGN: above */
        psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_EPROTO,
                       "push of %u/%u: a mean tensor's pushes are values, raw, fp16 or bf16, "
                       "not %s", ch->tensor, ch->chunk, kinds[msg->codec]);
        return UCS_OK;
    }
    /* A direct push carries no data: the gradient is at area_offset of the sender's area. */
    bool direct = (msg->flags & PS_FLAG_DIRECT) != 0;
    const uint8_t *ext = NULL;
    psd_area_t *area = NULL;
    const char *why = NULL;
    if (direct && msg->codec != PSK_CODEC_NONE)
        why = "only raw fp32 pushes may be direct";
    else if (direct && length != 0)
        why = "a direct push carries no data";
    else if (direct)
        ext = psd_area_data(conn, msg->area_offset, want, srv->area_need, &area, &why);
    if (direct && ext == NULL) {
        psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_EPROTO,
                       "direct push of %u/%u (%llu bytes at offset %llu): %s", ch->tensor,
                       ch->chunk, (unsigned long long)want,
                       (unsigned long long)msg->area_offset, why);
        return UCS_OK;
    }
    if (msg->length != want || (!direct && length != msg->length)) {
        psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_EPROTO,
                       "push of %u/%u carries %zu bytes (header says %llu), expected %llu",
                       ch->tensor, ch->chunk, length, (unsigned long long)msg->length,
                       (unsigned long long)want);
        return UCS_OK;
    }
    if (bsp && msg->step < ch->version) {
        PS_LOG(PS_LOG_DEBUG, "shard", "push of %u/%u from rank %u (pid %u) for step %llu: the "
               "chunk is at step %llu", ch->tensor, ch->chunk, rank, conn->pid,
               (unsigned long long)msg->step, (unsigned long long)ch->version);
        /* The step was applied already (this is a resend after a reconnect, the push of a
         * rank removed mid-step, or one of a step handed out again after every member left
         * it): acknowledge and drop it. When that apply did not have its batch, the ack says
         * so: the worker reports it, and the coordinator hands the batch out again. */
        send_push_ack(srv, conn, msg->req_id, ch, rank, msg->step, stale_ack_flags(ch, rank, msg));
        step_pushed(srv, rank, msg->step); /* a step handed out again: its member is here */
        return UCS_OK;
    }
    if (bsp && msg->step != ch->version) {
        /* One step ahead: the chunk lags (a step a restarted shard 0 closed, passed as soon as
         * its members' pushes or its view come): the worker sends it again (PS_FLAG_BEHIND). */
        refuse_push(srv, conn, msg->req_id, ch, PS_ESTALE, msg->step == ch->version + 1,
                    "push of %u/%u for step %llu, but the chunk is at step %llu", ch->tensor,
                    ch->chunk, (unsigned long long)msg->step, (unsigned long long)ch->version);
        return UCS_OK;
    }
    if (bsp) {
        /* The push says which members its step has, as the coordinator told its sender. */
        if (msg->epoch && msg->members) psd_shard_learn_view(srv, msg->epoch, msg->step, msg->members, false);
        uint64_t epoch, members = psd_shard_members(srv, msg->step, &epoch);
        PS_LOG(PS_LOG_DEBUG, "shard", "push of %u/%u from rank %u (pid %u) for step %llu, its "
               "view %llu (%#llx), this shard's %llu (%#llx), %u replay tags", ch->tensor,
               ch->chunk, rank, conn->pid, (unsigned long long)msg->step,
               (unsigned long long)msg->epoch, (unsigned long long)msg->members,
               (unsigned long long)epoch, (unsigned long long)members, msg->nreplay);
        if (!(members >> rank & 1)) {
            psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_ENOTMEMBER,
                           "push of %u/%u for step %llu: rank %u is not a member of that step "
                           "(epoch %llu)", ch->tensor, ch->chunk, (unsigned long long)msg->step,
                           rank, (unsigned long long)epoch);
            return UCS_OK;
        }
        step_pushed(srv, rank, msg->step);
    }
    bool replay = bsp && msg->nreplay > 0 && replay_had(srv, ch, rank, msg);
    if (replay) srv->replays_skipped++;
    if (!bsp && msg->req_id != 0 && msg->req_id == ch->applied->done[rank].req &&
        psd_conn_who(conn) == ch->applied->done[rank].who) {
        /* asp / ssp: this push's update committed, but its acknowledgement was lost with the
         * connection and the worker sent it again. bsp needs no record of it: the step check
         * above acknowledges any push of a step the chunk passed. */
        PS_LOG(PS_LOG_INFO, "shard", "push of %u/%u from rank %u (pid %u, request %llu) was "
               "applied already: acknowledged again, not applied twice", ch->tensor, ch->chunk,
               rank, conn->pid, (unsigned long long)msg->req_id);
        send_push_ack(srv, conn, msg->req_id, ch, rank, msg->step, 0);
        return UCS_OK;
    }
    uint64_t again_key = 0, again_tagged = 0; /* batch_remember's, once a slot takes it */
    if (!bsp && (msg->flags & PS_FLAG_BATCH) &&
        batch_had(srv, ch, rank, psd_conn_who(conn), msg, &again_key, &again_tagged)) {
        /* its batch came from another push: this one's error feedback goes back (libps) */
        send_push_ack(srv, conn, msg->req_id, ch, rank, msg->step, PS_FLAG_UNSUMMED);
        return UCS_OK;
    }
    psd_slot_t *slot = psd__slot_get(ch, rank); /* its group allocated at its first push here */
    if (slot == NULL) {
        psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_ENOMEM,
                             "out of memory");
        return UCS_OK;
    }
    bool orphan = (slot->state == SLOT_FULL || slot->state == SLOT_APPLYING) &&
                  (slot->conn == NULL || slot->conn->dead);
    if (orphan && slot->state == SLOT_FULL &&
        (slot->who != psd_conn_who(conn) || slot->step != msg->step)) {
        /* Left by another process that held this rank (it is gone): not this push's data. */
        ch->nfull--;
        ch->full_mask &= ~(1ull << rank);
        psd__drop_slot(ch, rank);
        orphan = false;
    }
    if (orphan && slot->who == psd_conn_who(conn) && slot->step == msg->step) {
        /* The same rank's push of this step is here already (maybe being applied): its
         * connection broke and it sent the push again. The same process (who) on the same
         * rank and step: the same gradient; acknowledge this copy when the step is applied. */
        if (slot->conn) psd_conn_unref(slot->conn);
        slot->conn = conn;
        /* libps sends an op's every copy with its one request id: written only when another
         * client's differs, since a job applying the slot reads it (psd__applied_commit). */
        if (slot->req != msg->req_id) slot->req = msg->req_id;
        psd_conn_ref(conn);
        return UCS_OK;
    }
    if (slot->state == SLOT_RECEIVING && slot->conn != conn &&
        slot->who == psd_conn_who(conn) && slot->step == msg->step) {
        /* The same push is still landing from a connection of its sender that broke (UCX has
         * not called that receive back yet): the sender tries again shortly (PS_FLAG_BEHIND),
         * and by then that copy has landed (this one is then acknowledged with it, above) or
         * is lost (this one lands). Before, this copy was refused as a second push. */
        refuse_push(srv, conn, msg->req_id, ch, PS_ESTALE, true, "push of %u/%u from rank %u "
                    "for step %llu: its copy from a broken connection is still landing",
                    ch->tensor, ch->chunk, rank, (unsigned long long)msg->step);
        return UCS_OK;
    }
    if (slot->state != SLOT_EMPTY && slot->who != psd_conn_who(conn)) {
        /* The push of another process (or an earlier client of this one) that held this rank
         * is still here: landing from its connection, or being applied (asp: a push that
         * landed is applied, also after its sender died). It will be gone shortly: the sender
         * tries again (PS_FLAG_BEHIND). Before, a worker started in the place of one that died
         * mid-push, with its rank, had its first push refused as a second one (PS_EPROTO; a
         * review, session 73). */
        refuse_push(srv, conn, msg->req_id, ch, PS_ESTALE, true, "push of %u/%u from rank %u "
                    "for step %llu: the push of the rank's previous holder is still %s",
                    ch->tensor, ch->chunk, rank, (unsigned long long)msg->step,
                    slot->state == SLOT_RECEIVING ? "landing"
                    : slot->state == SLOT_FULL    ? "waiting to be applied"
                                                  : "being applied");
        return UCS_OK;
    }
    if (slot->state != SLOT_EMPTY) {
        psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_EPROTO,
                       "second push of %u/%u from rank %u for step %llu", ch->tensor, ch->chunk,
                       rank, (unsigned long long)msg->step);
        return UCS_OK;
    }
    if (replay)
        ch->skip_mask |= 1ull << rank;
    else
        ch->skip_mask &= ~(1ull << rank);
    ch->nograd_mask = (ch->nograd_mask & ~(1ull << rank)) | (uint64_t)nograd << rank;
    /* A job applying this step without this rank (its member left, and the step went out
     * again): if it passes the step, this push is stale; whether that apply has its batch is
     * known now, from the push's tags (psd__stale_slot_done). */
    bool lacks = bsp && ch->applying && !apply_had_batch(ch, rank, msg, ch->step_members);
    ch->stale_lack = (ch->stale_lack & ~(1ull << rank)) | (uint64_t)lacks << rank;
    if (direct) {
        psd_area_ref(area);
        slot->ext = (psd_slot_ext_t){ext, area};
        length = (size_t)want;
    } else if (slot->cap < length) {
        /* Sized for raw fp32 (or a larger codec payload) once; reused every step. */
        size_t cap = length > (size_t)ch->n * 4 ? length : (size_t)ch->n * 4;
        if (slot->memh) {
            ucp_mem_unmap(srv->ucx.context, slot->memh);
            slot->memh = NULL;
        }
        uint8_t *b = realloc(slot->buf, cap);
        if (b == NULL) {
            psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_ENOMEM, "out of memory");
            return UCS_OK;
        }
        slot->buf = b;
        slot->cap = cap;
        slot->map_failed = false; /* registered at its first rendezvous receive */
    }
    if (codec.kind != PSK_CODEC_NONE && ch->agg == NULL &&
        (ch->agg = malloc((size_t)ch->n * 4)) == NULL) {
        psd_send_chunk_error(srv, conn, msg->req_id, ch->tensor, ch->chunk, PS_ENOMEM, "out of memory");
        return UCS_OK;
    }
    slot->codec = codec;
    slot->len = length;
    if (!ch->applying) { /* every member's push of a step says the same; a job reads them */
        ch->has_progress = (msg->flags & PS_FLAG_PROGRESS) != 0;
        ch->progress = msg->samples;
    }
    slot->state = SLOT_RECEIVING;
    slot->req = msg->req_id;
    slot->crc = msg->crc32c;
    slot->step = msg->step;
    slot->who = psd_conn_who(conn);
    slot->batch = !bsp && (msg->flags & PS_FLAG_BATCH)
                      ? ps_batch_key(msg->data_epoch, msg->batch_offset)
                      : 0;
    slot->progress = msg->flags & PS_FLAG_PROGRESS ? msg->samples : UINT64_MAX;
    slot->conn = conn;
    psd_conn_ref(conn);
    batch_remember(ch, again_key, again_tagged);
    if (srv->trace) /* a rendezvous receive's span starts now; any other push is an instant */
        slot->arrived_ns = !direct && (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)
                               ? ps_trace_now()
                               : 0;
    if (direct) { /* written by the sender before it sent the header */
        srv->direct_pushes++;
        push_received(slot, UCS_OK);
        return UCS_OK;
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        if (length) memcpy(slot->buf, data, length); /* small chunk sent eagerly */
        push_received(slot, UCS_OK);
        return UCS_OK;
    }
    /* Rendezvous: the gradient lands directly in the rank's slot, registered once, at its
     * first: every later rendezvous into it reuses the registration (RDMA lands without a
     * registration-cache lookup; without one UCX registers on the fly). A slot only eager
     * pushes fill (shared memory and tcp below the senders' eager limit) is never registered:
     * a registration costs ~0.5 KB of psd's memory. Decided per receive, not by the lanes of
     * the connection that sized it: another process may hold the rank later, over RDMA. */
    if (slot->memh == NULL && !slot->map_failed) {
        ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                                 UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                                   .address = slot->buf, .length = slot->cap};
        if (ucp_mem_map(srv->ucx.context, &mp, &slot->memh) != UCS_OK) {
            slot->memh = NULL;
            slot->map_failed = true;
        }
    }
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.recv_am = on_push_recv, .user_data = slot};
    if (slot->memh) {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        p.memh = slot->memh;
    }
    if (srv->test_late_rndv && --srv->test_late_rndv == 0) {
        /* Its connection breaks while the data lands, and the receive's end is seen only
         * 3 s later: the window in which the sender, connected again, sends it again. */
        PS_LOG(PS_LOG_WARN, "shard", "rendezvous push of %u/%u from rank %u: its connection "
               "closed while it lands (PS_TEST_LATE_RNDV)", ch->tensor, ch->chunk, rank);
        srv->test_late_ref = slot;
        srv->test_late_req = msg->req_id;
        conn->dead = true;
        conn->close_queued = true;
    }
    ps_tcpguard_expect(slot->buf, length); /* a put over TCP may land there (tcpguard.c) */
    void *req = ucp_am_recv_data_nbx(srv->ucx.worker, data, slot->buf, length, &p);
    if (req == NULL)
        on_push_recv(NULL, UCS_OK, length, slot);
    else if (UCS_PTR_IS_ERR(req))
        on_push_recv(NULL, UCS_PTR_STATUS(req), length, slot);
    return UCS_OK;
}

