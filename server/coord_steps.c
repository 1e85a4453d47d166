/* coord_steps.c: the coordinator's steps and batches: replies to batch requests, bsp steps
 * (members, hand-out, close, steps without members) and asp / ssp service from the cursor. */
#include <string.h>

#include "coord_internal.h"
#include "ps/ps_log.h"

/* ---- replies ----------------------------------------------------------------- */

void psd__reply_batch(psd_server_t *srv, uint32_t r)
{
    psd_coord_t *co = srv->coord;
    member_rt_t *rt = &co->rt[r];
    saved_member_t *m = &co->s.m[r];
    rt->parked = 0;
    rt->end_gen = 0;
    if (rt->conn == NULL) return;
    rt->late_from_ms = uv_now(srv->loop); /* it could not go on before: step_timeout_ms */
    ps_msg_t a = {.type = PS_MSG_BATCH_REPLY, .req_id = rt->park_req, .shard = 0, .rank = (int32_t)r,
                  .epoch = co->s.epoch, .workers = popcount(co->s.active)};
    /* The lowest rank of the members: the one that evaluates for the job (psworker's per-pass
     * test accuracy; before, only rank 0 did, and none once rank 0 had left: a probe). Of a
     * finished job, the one that was lowest when the first finished reply went: it may leave
     * before the others ask, and the next one would evaluate the last pass again. */
    bool lead = (co->s.active & ((1ull << r) - 1)) == 0;
    if (!co->s.finished) {
        co->final_lead = 0; /* (again: a finished job that went on) */
    } else {
        if (co->final_lead == 0)
            co->final_lead = 1 + (int32_t)__builtin_ctzll(co->s.active | 1ull << r);
        lead = co->final_lead == 1 + (int32_t)r;
    }
    if (!m->has_batch) {
        a.flags = PS_FLAG_FINISHED;
        a.step = is_bsp(srv) ? co->s.final_step : m->steps_done;
        /* The job's last pass that handed out samples (0 from a psd before session 63):
         * psworker's lead evaluates the end for it, not for the last pass it trained in (a
         * probe: under asp the lead's own last batch was of pass 2, and "epoch 2" carried the
         * final model's accuracy while pass 3 had none). */
        const ps_cursor_t *cur = &co->s.cur;
        uint64_t last = cur->offset == 0 && cur->pass > 0 ? cur->pass - 1 : cur->pass;
        a.data_epoch = cur->passes && last >= cur->passes ? cur->passes - 1 : last;
    } else {
        a.step = m->batch_step;
        a.members = is_bsp(srv) ? co->s.step_members : 1ull << r;
        a.data_epoch = m->batch.pass;
        a.batch_offset = m->batch.offset;
        a.batch_count = m->batch.count;
        a.samples = m->progress;
        a.nreplay = m->batch.nreplay; /* handed out before: where it may be applied already */
        if (!is_bsp(srv)) a.flags = PS_FLAG_BATCH; /* pushes carry the batch (push.c) */
        if (srv->test_crash_after_batch && --srv->test_crash_after_batch == 0)
            srv->test_crash_armed = true; /* psd_shard_on_push */
        memcpy(a.replay, m->batch.replay, sizeof a.replay);
        rt->batch_seen = true;
        rt->known = true;
    }
    if (lead) a.flags |= PS_FLAG_LEAD;
    psd_send_msg(srv, rt->conn, &a);
}

/* Tell every member view (@p epoch, @p step, @p members; @p flags: PS_FLAG_CLOSED for a closed
 * step's); libps forwards it to the other shards. */
static void send_view(psd_server_t *srv, uint64_t epoch, uint64_t step, uint64_t members,
                      uint32_t flags)
{
    psd_coord_t *co = srv->coord;
    ps_msg_t e = {.type = PS_MSG_EPOCH, .epoch = epoch, .step = step, .members = members,
                  .shard = 0, .flags = flags};
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++)
        if ((co->s.active >> r & 1) && co->rt[r].conn) psd_send_msg(srv, co->rt[r].conn, &e);
}

/* Tell every member the open step's members changed. */
void psd__broadcast_epoch(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    send_view(srv, co->s.epoch, co->s.step, co->s.step_members, 0);
}

/* Tell the members again the closed views a shard may still wait for (rec.told). */
void psd__tell_closed(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    for (int i = 0; i < COORD_TOLD; i++)
        if (co->rec.told[i].epoch)
            send_view(srv, co->rec.told[i].epoch, co->rec.told[i].step, co->rec.told[i].members,
                      PS_FLAG_CLOSED);
}

/* Tag batch @p b with @p tag (ps_batch_tag), saying so when that drops its oldest tag. */
void psd__batch_tag(ps_batch_t *b, uint64_t tag)
{
    if (ps_batch_tag(b, tag))
        PS_LOG(PS_LOG_WARN, "coord", "batch of pass %llu at %llu left mid-step at more steps "
               "than its replay tags hold: its oldest replay tag dropped (a chunk that applied "
               "it then applies it again)", (unsigned long long)b->pass,
               (unsigned long long)b->offset);
}

/* Batch @p b was not applied on every chunk: give it back tagged @p tag (the step and rank
 * that had it; uncounted first if @p counted), so that a chunk that applied that step with that
 * rank's push does not apply it again (replay_had in push.c) and the others do. */
void psd__regive(psd_server_t *srv, ps_batch_t b, uint64_t tag, bool counted)
{
    psd_coord_t *co = srv->coord;
    if (counted) ps_cursor_unapplied(&co->s.cur, &b);
    psd__batch_tag(&b, tag);
    if (ps_cursor_give_back(&co->s.cur, &b))
        PS_LOG(PS_LOG_ERROR, "coord", "re-hand queue full: batch of pass %llu at %llu lost",
               (unsigned long long)b.pass, (unsigned long long)b.offset);
    psd__hold_handouts(srv); /* the next hand-out may take it, even with the same members */
    /* A close that counted it may have ended the job (no batch left): this one is left now. */
    uint64_t max = srv->m.job.max_steps;
    if (counted && co->s.finished && !(max && co->s.step >= max)) {
        co->s.finished = 0;
        PS_LOG(PS_LOG_INFO, "coord", "the job goes on for that batch");
    }
}

/* A closed view of step @p step with @p members (PS_FLAG_CLOSED: it covers that step only),
 * told to the members, who forward it to the other shards, and kept in rec.told (told again
 * with every hand-out and cron tick, tell_closed) until a report of a later step shows every
 * shard past it. The epoch after it is the open step's: no ordinary view may carry the closed
 * one's number (batch and hello replies hand out the current epoch). @return its epoch. */
static uint64_t close_view(psd_server_t *srv, uint64_t step, uint64_t members)
{
    psd_coord_t *co = srv->coord;
    psd__rec_changed(co);
    uint64_t epoch = ++co->s.epoch;
    PS_LOG(PS_LOG_INFO, "coord", "epoch %llu: closed step %llu has %u members (%#llx)",
           (unsigned long long)epoch, (unsigned long long)step, popcount(members),
           (unsigned long long)members);
    int slot = 0;
    for (int i = 0; i < COORD_TOLD; i++) {
        if (co->rec.told[i].step == step && co->rec.told[i].epoch) {
            slot = i;
            break;
        }
        if (co->rec.told[i].epoch < co->rec.told[slot].epoch) slot = i; /* free or oldest */
    }
    co->rec.told[slot].epoch = epoch;
    co->rec.told[slot].step = step;
    co->rec.told[slot].members = members;
    send_view(srv, epoch, step, members, PS_FLAG_CLOSED);
    co->s.epoch++;
    return epoch;
}

/* Rank @p r (removed: no longer active) was a member of rc_step, which this shard's restart
 * closed, and no report showed its batch of that step applied everywhere: another shard may
 * wait for its push of that step for good. That step goes on without it there (a view of it
 * without r; a shard past it ignores it), and its batch, counted at the restart, is uncounted
 * and handed to another worker tagged with (rc_step, r): a chunk that applied the step with
 * r's push does not apply it again (replay_had), one that applied it without does. The view
 * is a closed one (PS_FLAG_CLOSED), for that step only: it never stands for a later step. */
void psd__restore_closed_lost(psd_server_t *srv, uint32_t r)
{
    psd_coord_t *co = srv->coord;
    psd__rec_changed(co);
    co->rec.rc_pending &= ~(1ull << r);
    co->rec.rc_view &= ~(1ull << r);
    psd__regive(srv, co->rec.rc_batch[r], PS_REPLAY_TAG(co->rec.rc_step, r), true);
    PS_LOG(PS_LOG_WARN, "coord", "rank %u left before any report showed step %llu applied "
           "everywhere (this shard closed it when it started again): the step goes on without "
           "it where it waits, and its batch goes to another worker", r,
           (unsigned long long)co->rec.rc_step);
    /* Not learnt here, where every chunk is past that step. */
    close_view(srv, co->rec.rc_step, co->rec.rc_view);
    psd__coord_save(srv);
    psd_shard_learn_view(srv, co->s.epoch, co->s.step, co->s.step_members, false);
    psd__broadcast_epoch(srv);
}

/* ---- bsp steps ------------------------------------------------------------------ */

static bool can_start(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    uint32_t n = popcount(co->s.active);
    if (n == 0) return false;
    if (n >= co->s.desired) return true;
    /* Fewer than desired: start after a grace period rather than wait forever. */
    uint32_t grace = srv->m.job.start_wait_ms ? srv->m.job.start_wait_ms
                                              : srv->m.job.heartbeat_timeout_ms;
    return co->waiting_since_ms && uv_now(srv->loop) - co->waiting_since_ms >= grace;
}

void psd__set_members(psd_server_t *srv, uint64_t members)
{
    psd_coord_t *co = srv->coord;
    if (members != co->s.step_members || co->s.epoch == 0) {
        if ((members & ~co->s.step_members) && srv->test_crash_join_save &&
            srv->test_crash_join_save-- == 1)
            psd__crash_in_next_save(co, "PS_TEST_CRASH_JOIN_SAVE"); /* hold_handouts' save below */
        uint64_t now = uv_now(srv->loop);
        for (uint32_t r = 0; r < PS_MAX_RANKS; r++) /* new members' deadlines start now */
            if ((members & ~co->s.step_members) >> r & 1) co->rt[r].late_from_ms = now;
        co->s.epoch++;
        co->s.step_members = members;
        PS_LOG(PS_LOG_INFO, "coord", "epoch %llu: step %llu has %u members (%#llx)",
               (unsigned long long)co->s.epoch, (unsigned long long)co->s.step, popcount(members),
               (unsigned long long)members);
        /* The batches of a step whose members changed (a hand-out, or a removal mid-step) are
         * answered once a committed state holds them. A restart re-derives an unchanged step's
         * hand-out from its chunks and its saved members, in rank order from the saved cursor,
         * but not a changed one: a join it never saw (the join writes nothing) lost its batch
         * to another member, after a shard had applied it with the joiner's push. */
        psd__hold_handouts(srv);
    }
    psd_shard_learn_view(srv, co->s.epoch, co->s.step, members, false);
}

/* Hand every member of the job a batch of the open step, in rank order. */
void psd__hand_out(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    if ((co->hold_ms || co->hold_ahead) && co->s.step >= co->hold_step) {
        co->held = true; /* every shard must know the checkpoint's step first */
        if (co->hold_ahead) { /* the 10 s limit runs from here */
            co->hold_ahead = false;
            co->hold_ms = psd__hold_now(srv);
            PS_LOG(PS_LOG_INFO, "coord", "step %llu reached: held for its checkpoint",
                   (unsigned long long)co->s.step);
        }
        return;
    }
    uint64_t members = 0;
    uint64_t max = srv->m.job.max_steps;
    for (uint32_t r = 0; r < PS_MAX_RANKS && !(max && co->s.step >= max); r++) {
        saved_member_t *m = &co->s.m[r];
        if (!(co->s.active >> r & 1) || (co->rec.removed_in_step >> r & 1)) continue;
        if (!m->has_batch) {
            if (!ps_cursor_take(&co->s.cur, &m->batch)) break;
            co->rt[r].batch_seen = false;
        }
        if (!(co->s.step_members >> r & 1) && m->steps_done == 0)
            PS_LOG(PS_LOG_INFO, "coord", "rank %u takes part from step %llu", r,
                   (unsigned long long)co->s.step);
        m->has_batch = 1;
        m->batch_step = co->s.step;
        m->progress = co->s.cur.applied_total;
        members |= 1ull << r;
    }
    /* Every batch counted is not yet every batch applied: one that a restart of this shard
     * counted with its step (rc_pending, rc_unsettled) goes out again if a shard turns out to
     * lack it, so the job waits for those reports (or removals) before it is complete; a worker
     * that asks meanwhile waits, rather than hear of an end that is taken back. */
    bool unsettled = is_bsp(srv) && (co->rec.rc_pending || co->rec.rc_unsettled);
    if (members == 0 && !co->s.finished &&
        ((ps_cursor_exhausted(&co->s.cur) && !unsettled) || (max && co->s.step >= max))) {
        co->s.finished = 1;
        co->s.final_step = co->s.step;
        memset(co->rec.told, 0, sizeof co->rec.told); /* no step is reported any more */
        psd__rec_changed(co);
        PS_LOG(PS_LOG_INFO, "coord", "job complete at step %llu: %llu samples applied",
               (unsigned long long)co->s.step, (unsigned long long)co->s.cur.applied_total);
    }
    if (members) psd__tell_closed(srv); /* before the batches, which lead to pushes */
    psd__set_members(srv, members);
    co->waiting_since_ms = 0;
    psd__serve_parked(srv);
}

/* The open step is applied everywhere: count its batches, advance, hand out the next. */
void psd__close_step(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    bool again = co->rec.emptied_step1 == co->s.step + 1; /* chunks may have passed it before */
    /* A restart derives this close from this shard's chunks only when one of their applies of
     * the step committed the state of it here, and no chunk here is still at the step (every
     * pushed one applied it before any report: one at it is a tensor whose pushes stopped just
     * there, which a restart would take for the step not applied: a review, session 68). Not
     * when no chunk here takes the members' pushes (a small model whose chunks are all on
     * other shards beside tensors no member pushes: a probe, session 68, lost the whole job to
     * a SIGKILL of shard 0, its state never written past step 0). One walk of the chunks. */
    bool derived = co->creating || (co->chunks_saved_step == co->s.step &&
                                    psd_shard_step_from(srv, co->s.step) > co->s.step);
    if (again || co->rec.removed_in_step || co->rec.emptied_step1) psd__rec_changed(co);
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        saved_member_t *m = &co->s.m[r];
        /* A member that reported a step handed out again keeps its batch in m->batch with
         * has_batch cleared (so that it is not handed the same batch again meanwhile). */
        bool reported = again && (co->rec.again_reported >> r & 1);
        if (!(co->s.step_members >> r & 1) ||
            (!reported && (!m->has_batch || m->batch_step != co->s.step)))
            continue;
        if (reported && (co->rec.again_stale >> r & 1)) {
            /* A chunk that had passed the step dropped its push without having its batch. */
            psd__regive(srv, m->batch, PS_REPLAY_TAG(co->s.step, r), false);
            PS_LOG(PS_LOG_INFO, "coord", "rank %u's batch of step %llu (pass %llu at %llu), a "
                   "step handed out again after its members left: a shard had passed the step "
                   "without it; it goes to another worker", r, (unsigned long long)co->s.step,
                   (unsigned long long)m->batch.pass, (unsigned long long)m->batch.offset);
        } else {
            ps_cursor_applied(&co->s.cur, &m->batch);
        }
        m->has_batch = 0;
        m->steps_done++;
        co->rt[r].last_done_ms = uv_now(srv->loop);
    }
    co->s.step++;
    co->rec.removed_in_step = 0;
    co->rec.emptied_step1 = 0;
    co->rec.again_reported = co->rec.again_stale = 0;
    uint64_t now = uv_now(srv->loop);
    if (co->last_close_ms) {
        uint64_t g = now - co->last_close_ms;
        co->gaps[co->ngaps++ % GAP_RING] = g;
        int low = 0; /* replace the smallest of the top gaps */
        for (int i = 1; i < 16; i++)
            if (co->top[i].ms < co->top[low].ms) low = i;
        if (g > co->top[low].ms) {
            co->top[low].ms = g;
            co->top[low].step = co->s.step - 1; /* the step that took this long */
        }
    }
    co->last_close_ms = now;
    if (!again && derived) {
        psd__hand_out(srv);
        return;
    }
    /* The close of a step handed out again follows its members' reports, not an apply on this
     * shard (and so does one no apply here took part in): a restart could not derive it from
     * this shard's chunks, so the next step's batches are answered only once a committed state
     * holds the close and the hand-out. Before that, a restart saw the step open, and a member
     * handed the next step's batch with its report of this one lost made the two states differ:
     * batches went uncounted or twice. */
    if (!again)
        PS_LOG(PS_LOG_DEBUG, "coord", "step %llu closed with no apply here: its hand-out waits "
               "for a save", (unsigned long long)(co->s.step - 1));
    co->handout_gen = UINT64_MAX; /* hand_out's serve_parked answers nothing yet */
    psd__hand_out(srv);
    co->handout_gen = psd__coord_save_gen(srv);
    psd__serve_parked(srv); /* answers now only when no save was needed (psd_coord_create) */
}

/* bsp: open step s has no member (every member left it) and the ranks of those who left are
 * held until it closes (removed_in_step), so that no joiner's push of s is taken for theirs:
 * when they are all the ranks a joiner could get (64 deaths in one step after their batch
 * replies, such as workers killed over and over while they compute), s closes with no member
 * instead. A chunk still at s passes it as it is (a closed view with none, as
 * restore_closed_lost's: one update fewer there); a chunk that applied s with a push of a
 * member that then left keeps it, and that member's batch, given back tagged (s, rank), is
 * not applied there again. Before, no worker could join again, also after a restart (the held
 * ranks are saved). @return whether it closed s. */
bool psd__close_deserted_step(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    uint64_t s = co->s.step, left = co->rec.removed_in_step & ~co->s.active;
    /* Not under a checkpoint's hold of this step (it ends within CKPT_HOLD_MS); one asked for
     * a later step (psd's follower asks for its next one all the time) is held as before. */
    if (!is_bsp(srv) || co->s.finished || co->s.step_members != 0 || left == 0 ||
        co->hold_ms || (co->hold_ahead && co->hold_step <= s))
        return false;
    PS_LOG(PS_LOG_WARN, "coord", "step %llu: every member left it, and the %u ranks they held "
           "until it closes are all a worker could join with: it closes with no member (its "
           "chunks not past it pass it without an update; the batches of those who left go to "
           "other workers)", (unsigned long long)s, popcount(left));
    uint64_t epoch = close_view(srv, s, 0);
    psd_shard_learn_view(srv, epoch, s, 0, true); /* this shard's chunks at s pass it */
    co->deserted++;
    psd__close_step(srv); /* frees the ranks (removed_in_step); its hand-out waits for its save */
    psd__coord_save(srv);
    return true;
}

/* A step with no members left: hand it out again once workers are there. */
void psd__maybe_restart_step(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    if (!is_bsp(srv) || co->s.step_members != 0 || co->s.finished) return;
    if (popcount(co->s.active) > 0 && co->waiting_since_ms == 0)
        co->waiting_since_ms = uv_now(srv->loop);
    /* Nothing left to hand out: the end needs no worker (the last report that settled a batch
     * a restart counted may come with a leave). */
    bool done = ps_cursor_exhausted(&co->s.cur) && !co->rec.rc_pending && !co->rec.rc_unsettled;
    if (!can_start(srv) && !done) return;
    /* removed_in_step stays: slots may still hold pushes of the ranks that left this step. */
    psd__hand_out(srv);
}

/* ---- asp / ssp ------------------------------------------------------------------- */

uint64_t psd__slowest(const psd_coord_t *co)
{
    uint64_t low = UINT64_MAX;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++)
        if ((co->s.active >> r & 1) && co->s.m[r].steps_done < low) low = co->s.m[r].steps_done;
    return low == UINT64_MAX ? 0 : low;
}

/* asp / ssp: the batches handed out and not yet reported (their pushes may be part-way). */
uint32_t psd__in_flight(const psd_coord_t *co)
{
    uint32_t n = 0;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++)
        n += (co->s.active >> r & 1) && co->s.m[r].has_batch;
    return n;
}

/* asp / ssp with job.max_steps (a cap on each worker's steps): once every member has done its
 * steps, the job is complete, so that pslaunch --follow stops starting workers and status says
 * so. A worker that joins later is told the job is finished. */
void psd__async_maybe_finished(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    uint64_t max = srv->m.job.max_steps;
    if (is_bsp(srv) || max == 0 || co->s.finished) return;
    if (co->s.active == 0) {
        /* No member left, and since one did its steps no start is granted (capped): nobody
         * would ever come, so the job is over. Before, it waited for good with no worker. */
        if (!co->capped) return; /* none joined yet, or pslaunch replaces one that died */
        co->s.finished = 1;
        PS_LOG(PS_LOG_INFO, "coord", "job complete: every worker did its %llu steps or left "
               "(%llu samples applied)", (unsigned long long)max,
               (unsigned long long)co->s.cur.applied_total);
        psd__coord_save(srv);
        return;
    }
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++)
        if ((co->s.active >> r & 1) && (co->s.m[r].steps_done < max || co->s.m[r].has_batch))
            return;
    co->s.finished = 1;
    /* Per worker: the members now; others may have left before theirs (a scaling probe,
     * session 63: "every worker" read as all of them). */
    uint32_t n = popcount(co->s.active);
    PS_LOG(PS_LOG_INFO, "coord", "job complete: %s %u member%s did its %llu steps (job."
           "max_steps counts per worker under %s; %llu samples applied; members that did theirs "
           "earlier left then)", n == 1 ? "its" : "each of its", n, n == 1 ? "" : "s",
           (unsigned long long)max, ps_consistency_name(srv->m.job.consistency),
           (unsigned long long)co->s.cur.applied_total);
}

/* asp / ssp: whether an answer that ends member @p r's run (the job is complete, or it did its
 * job.max_steps) may go: once a committed state holds what it follows from (the last reports,
 * the end), as a hand-out waits for one. Before (a probe, session 47), shard 0 answered at
 * once; killed before its next save, it came back without the last reports, with every worker
 * gone, and the job stayed unfinished for good. The first call queues the save. */
static bool end_committed(psd_server_t *srv, uint32_t r)
{
    psd_coord_t *co = srv->coord;
    member_rt_t *rt = &co->rt[r];
    if (rt->end_gen == 0) {
        rt->end_gen = UINT64_MAX; /* a save_done run inside coord_save must not answer */
        if (srv->test_crash_finish_save && srv->test_crash_finish_save-- == 1)
            psd__crash_in_next_save(co, "PS_TEST_CRASH_FINISH_SAVE"); /* the save queued here */
        rt->end_gen = psd__coord_save_gen(srv);
        if (rt->end_gen == 0) return true; /* psd_coord_create saves before any answer */
    }
    return rt->end_gen <= co->saved_gen;
}

void psd__serve_async(psd_server_t *srv, uint32_t r)
{
    psd_coord_t *co = srv->coord;
    saved_member_t *m = &co->s.m[r];
    if (!co->s.started) {
        /* As under bsp, the job starts with job.workers workers (or, with fewer, after one
         * heartbeat timeout), so the first worker does not run away with the first batches. */
        if (co->waiting_since_ms == 0) co->waiting_since_ms = uv_now(srv->loop);
        if (!can_start(srv)) return;
        co->s.started = 1;
        co->waiting_since_ms = 0;
    }
    if (!m->has_batch) {
        uint64_t max = srv->m.job.max_steps, total = co->s.cur.applied_total;
        if (max && m->steps_done >= max) {
            co->capped = true;
            psd__async_maybe_finished(srv);
            if (end_committed(srv, r)) /* else save_done answers */
                psd__reply_batch(srv, r);   /* asp / ssp: job.max_steps caps each worker's steps */
            return;
        }
        if (max && co->s.finished) {
            if (end_committed(srv, r)) /* joined after every member did its steps */
                psd__reply_batch(srv, r);
            return;
        }
        if (srv->m.job.consistency == PS_CONSIST_SSP &&
            m->steps_done > psd__slowest(co) + srv->m.job.staleness)
            return; /* too far ahead: wait for the slowest */
        if (co->hold_ms) return; /* a checkpoint drains the batches in flight (hold_async) */
        if (!ps_cursor_take(&co->s.cur, &m->batch)) {
            if (psd__in_flight(co) > 0) return; /* may be handed out again */
            if (!co->s.finished) {
                co->s.finished = 1;
                PS_LOG(PS_LOG_INFO, "coord", "job complete: %llu samples applied",
                       (unsigned long long)total);
            }
            if (end_committed(srv, r)) psd__reply_batch(srv, r); /* finished */
            return;
        }
        co->rt[r].batch_seen = false;
        m->has_batch = 1;
        m->batch_step = m->steps_done;
        m->progress = co->s.cur.applied_total;
        /* Answered once a committed state holds the hand-out: a restart of this shard before
         * that would hand the same samples out again (and its worker the batch before), and
         * they would be applied twice. Apply jobs copy the state when they start, so this
         * save. */
        co->rt[r].batch_gen = UINT64_MAX; /* a save_done run inside coord_save must not answer */
        if (srv->test_fail_handout_save && srv->test_fail_handout_save-- == 1)
            psd__fail_next_save(co); /* the save coord_save_gen queues */
        co->rt[r].batch_gen = psd__coord_save_gen(srv);
    }
    if (co->rt[r].batch_gen > co->saved_gen) return; /* save_done answers */
    psd__reply_batch(srv, r);
}

