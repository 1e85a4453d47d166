/* coord.c: shard 0's coordinator: the job's members, membership epochs, the bsp
 * step and the hand-out of the training set in batches (coord_internal.h lists its
 * modules; this one holds the members' requests and saving the state).
 *
 * bsp: the open step has a member set (a bitmap of ranks). At the step's close —
 * the first member that reports its batch done, which it does only once every
 * shard acknowledged its pushes, so the step is applied everywhere — every
 * member's batch counts as applied, the step advances, and every member of the
 * job (joiners included) gets the next batch, in rank order. A member that goes
 * away (leave, missed heartbeats, its process gone; a connection that closes while
 * the process may live keeps the rank for heartbeat_timeout_ms, at most 15 s, for
 * the same process to come back) is taken out of the open step in a new epoch; its
 * batch is given back and handed out again; the shards learn
 * the epoch from the remaining members (MSG_EPOCH, forwarded by libps), so the
 * step completes without it. When no member is left, the step waits for the
 * next worker.
 * asp / ssp: each request is served from the cursor at once (ssp: not more than
 * `staleness` steps ahead of the slowest member).
 *
 * The persistent part (coord_saved_t) is written by every apply job on shard 0,
 * so a restarted coordinator resumes the open step, its batches and the cursor. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "coord_internal.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"

/* ---- saving the state on its own --------------------------------------------------- */

/* Every apply job commits the state with its updates. Changes that come without one (a new
 * epoch, psctl scale, the epoch bump of a restart) are committed on their own, so that a
 * restart of this shard does not take them back: a desired count would return to its old
 * value, and an epoch number handed out since would be handed out again with other members
 * (libps and the shards ignore an epoch no newer than one they know). The write is slot work:
 * the loop thread never waits for the store's one writer. A slot runs only between store
 * jobs, and a job copies the state when it starts, so the stored state never goes back. */
/* The recovery state changed: the next apply job (psd_coord_rec) or coord_save writes it. */
void psd__rec_changed(psd_coord_t *co) { co->rec_dirty = true; }

int psd__save_now(psd_store_t *st, const void *s, size_t len, const coord_rec_t *rec)
{
    psd_wtxn_t tx;
    int rc = psd_store_begin(st, &tx);
    if (rc) return rc;
    rc = psd_store_put_blob(&tx, "job", s, len);
    if (rc == 0) rc = psd_store_put_blob(&tx, "jobrec", rec, sizeof *rec);
    if (rc) {
        psd_store_abort(&tx);
        return rc;
    }
    return psd_store_commit(&tx);
}

static void save_run(psd_slot_work_t *w)
{
    coord_save_t *sv = (coord_save_t *)w;
    /* The test hooks' numbers are set by the loop thread for a later save while this one runs
     * (atomics: ThreadSanitizer, session 51). */
    psd_coord_t *co = w->srv->coord;
    if (__atomic_load_n(&co->crash_gen, __ATOMIC_ACQUIRE) == sv->gen) { /* a test hook */
        usleep(200 * 1000); /* whatever the loop sends meanwhile leaves */
        PS_LOG(PS_LOG_WARN, "coord", "killed in a save of the coordinator's state (%s)",
               __atomic_load_n(&co->crash_hook, __ATOMIC_RELAXED));
        raise(SIGKILL);
    }
    if (__atomic_load_n(&co->fail_gen, __ATOMIC_RELAXED) == sv->gen) {
        /* a test hook: as if the store refused it */
        PS_LOG(PS_LOG_WARN, "coord", "the save of a hand-out fails (PS_TEST_FAIL_HANDOUT_SAVE)");
        sv->rc = PS_ESTORE;
        return;
    }
    sv->rc = psd__save_now(&w->srv->store, sv->s, sv->len, &sv->rec);
}

/* A test hook (PS_TEST_CRASH_*_SAVE): the next save queued (now, or after the busy one) kills
 * this psd in save_run, logging @p hook. */
void psd__crash_in_next_save(psd_coord_t *co, const char *hook)
{
    __atomic_store_n(&co->crash_hook, hook, __ATOMIC_RELAXED);
    __atomic_store_n(&co->crash_gen, co->save_gen + 1, __ATOMIC_RELEASE); /* after the name */
}

/* A test hook (PS_TEST_FAIL_HANDOUT_SAVE): the next save queued fails in save_run, as if the
 * store refused it. Named before the save is queued: a pool thread may run it at once. */
void psd__fail_next_save(psd_coord_t *co)
{
    __atomic_store_n(&co->fail_gen, co->save_gen + 1, __ATOMIC_RELAXED);
}

static void save_done(psd_slot_work_t *w)
{
    psd_server_t *srv = w->srv;
    psd_coord_t *co = srv->coord;
    co->save_busy = false;
    if (co->save.rc) {
        /* Not committed: what waits for this save (hand-outs, the end, a step's batches) keeps
         * waiting, and psd_coord_tick saves again. Answered before a committed state held
         * them, a restart would hand out the same samples again, or count a batch a chunk
         * never had: a store that commits nothing holds the job instead (pushes cannot commit
         * either then). */
        co->save_failures_total++;
        if (co->save_failures++ % 16 == 0)
            PS_LOG(PS_LOG_ERROR, "coord", "cannot save the coordinator's state: %s (%u time%s in "
                   "a row); batches wait until a save commits, tried again at every cron tick",
                   psd_store_strerror(srv, co->save.rc), co->save_failures,
                   co->save_failures > 1 ? "s" : "");
        co->rec_dirty = true;
        co->save_retry = true;
        co->save_again = false; /* the retry copies the whole state, this change with it */
        return;
    }
    if (co->save_failures) {
        PS_LOG(PS_LOG_INFO, "coord", "the coordinator's state is saved again (after %u failed "
               "save%s)", co->save_failures, co->save_failures > 1 ? "s" : "");
        co->save_failures = 0;
    }
    co->saved_gen = co->save.gen;
    if (co->save_again) {
        co->save_again = false;
        psd__coord_save(srv);
    }
    psd__serve_parked(srv); /* the hand-outs this save holds */
}

void psd__coord_save(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    if (co->creating) return;
    if (co->save_busy) { /* its copy is taken: this change goes in the next write */
        co->save_again = true;
        return;
    }
    co->save_busy = true;
    co->save_retry = false;
    co->save.len = psd__state_pack(&co->s, co->m_hi, co->save.s); /* what save_now writes */
    co->save.rec = co->rec;
    co->rec_dirty = false;
    co->save.gen = ++co->save_gen;
    co->save.slot.srv = srv;
    co->save.slot.run = save_run;
    co->save.slot.done = save_done;
    psd_shard_slot_queue(srv, &co->save.slot);
}

/* Save the state with a change just made; returns the number of the save that holds it (0: none
 * needed, while psd_coord_create runs: it saves at its end, before any answer). */
uint64_t psd__coord_save_gen(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    if (co->creating) return 0;
    bool busy = co->save_busy; /* then the change goes into the next save */
    psd__coord_save(srv);
    return busy ? co->save_gen + 1 : co->save_gen;
}

/* bsp: a change a restart could not re-derive from the chunks and the last committed state (a
 * step's members, a batch given back to the cursor): save it, and answer batches (and the end)
 * only once that save is committed (handout_gen, serve_parked). */
void psd__hold_handouts(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    uint64_t gen = psd__coord_save_gen(srv);
    if (gen > co->handout_gen) co->handout_gen = gen;
}

/* How long a member whose connection closed keeps its rank (psd_coord_on_gone): the heartbeat
 * timeout, but no longer than launch grants live, so scaling never counts a member that is
 * away past its grants. */
static uint64_t grace_ms(const psd_server_t *srv)
{
    uint64_t hb = srv->m.job.heartbeat_timeout_ms;
    return hb < GRANT_TTL_MS ? hb : GRANT_TTL_MS;
}

/* Now on the loop's clock, never 0 (hold_ms 0 means no hold). */
uint64_t psd__hold_now(const psd_server_t *srv)
{
    uint64_t now = uv_now(srv->loop);
    return now ? now : 1;
}

/* A peer's host name as psd keeps it: what a host name or address may hold ([A-Za-z0-9.:_-],
 * brackets) and '?' for anything else, so that a hostile hello cannot write JSON (status) or
 * control bytes (logs, psctl) through it. */
void psd__host_safe(char *out, size_t cap, const char *s)
{
    size_t n = 0;
    for (; *s && n + 1 < cap; s++) {
        char ch = *s;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  strchr(".:_-[]", ch) != NULL;
        out[n++] = ok ? ch : '?';
    }
    out[n] = '\0';
}

/* ---- requests ----------------------------------------------------------------------- */

/* Answer member @p r's report of a batch done (PS_FLAG_REPORT): a committed state holds it. */
static void reply_report(psd_server_t *srv, uint32_t r)
{
    psd_coord_t *co = srv->coord;
    member_rt_t *rt = &co->rt[r];
    rt->reporting = 0;
    if (rt->conn == NULL) return;
    ps_msg_t a = {.type = PS_MSG_BATCH_REPLY, .req_id = rt->park_req, .shard = 0,
                  .rank = (int32_t)r, .epoch = co->s.epoch, .workers = popcount(co->s.active),
                  .step = co->s.m[r].steps_done, .flags = PS_FLAG_REPORT};
    psd_send_msg(srv, rt->conn, &a);
}

void psd__serve_parked(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        member_rt_t *rt = &co->rt[r];
        if (rt->reporting && rt->report_gen <= co->saved_gen && (co->s.active >> r & 1))
            reply_report(srv, r);
        if (!rt->parked || !(co->s.active >> r & 1)) continue;
        if (!is_bsp(srv)) {
            psd__serve_async(srv, r);
        } else if (co->handout_gen <= co->saved_gen &&
                   ((co->s.m[r].has_batch && co->s.m[r].batch_step == co->s.step) ||
                    co->s.finished)) {
            psd__reply_batch(srv, r);
        }
    }
}

static int member_of(psd_server_t *srv, psd_conn_t *c)
{
    psd_coord_t *co = srv->coord;
    int r = c->rank;
    if (r < 0 || r >= PS_MAX_RANKS || !(co->s.active >> r & 1) || co->rt[r].conn != c) return -1;
    return r;
}

/* " (epoch N)", the bsp membership view a refusal was made in, into @p buf; "" under asp /
 * ssp, which keep no views (their epoch is 0, or a restart's jump past the saved one: it read
 * "(epoch 0)" there). @return @p buf. */
static const char *epoch_words(const psd_server_t *srv, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (is_bsp(srv))
        snprintf(buf, cap, " (epoch %llu)", (unsigned long long)srv->coord->s.epoch);
    return buf;
}

void psd_coord_on_hello(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg)
{
    psd_coord_t *co = srv->coord;
    int32_t rank = -1;
    if (c->rank >= 0 && (co->s.active >> c->rank & 1) && co->rt[c->rank].conn == c) {
        rank = c->rank; /* a second hello on the same connection */
    } else if (msg->rank >= 0) {
        /* A worker whose connection to this shard broke (or that this shard lost in a
         * restart) asks for its rank back: only the same process gets it, known by its pid and
         * the join serial its hello reply gave it (libps sends it in every hello after). The
         * pid alone named another process: in containers every worker may be pid 1, and a
         * worker dropped past the grace period took back the rank of the one that joined as
         * it with the same pid, when its network healed (a helper's probe, session 59: any
         * peer that read a pid in psctl status took a member's rank and made it leave). The
         * serial is a counter: against a hostile peer, only a secret_file holds. */
        int32_t r = msg->rank;
        if (r >= PS_MAX_RANKS || !(co->s.active >> r & 1) || co->s.m[r].pid != msg->pid ||
            co->s.m[r].join_serial != msg->samples) {
            if (r < PS_MAX_RANKS && (co->s.active >> r & 1) && co->s.m[r].pid == msg->pid &&
                !c->bad_warned) {
                c->bad_warned = true; /* once per connection: one guessing serials floods not */
                PS_LOG(PS_LOG_WARN, "coord", "%s asks for rank %d as pid %u with join serial "
                       "%llu, but that member joined as serial %llu (another process with the "
                       "same pid): refused", c->peer, r, msg->pid,
                       (unsigned long long)msg->samples,
                       (unsigned long long)co->s.m[r].join_serial);
            }
            char epoch[40];
            psd_send_error(srv, c, msg->req_id, PS_ENOTMEMBER,
                           "rank %d (pid %u, join %llu) is not a member of the job any more%s: "
                           "join again", r, msg->pid, (unsigned long long)msg->samples,
                           epoch_words(srv, epoch, sizeof epoch));
            return;
        }
        psd_conn_t *old = co->rt[r].conn;
        if (old && old != c && !old->dead) {
            PS_LOG(PS_LOG_INFO, "coord", "rank %d (pid %u) says hello again from %s: its "
                   "connection from %s is closed", r, msg->pid, c->peer, old->peer);
            old->rank = -1; /* replaced: its death must not remove the member */
            old->dead = true;
            old->close_queued = true;
        }
        if (co->rt[r].lost_ms)
            PS_LOG(PS_LOG_INFO, "coord", "rank %d (pid %u) is back after %llu ms", r, msg->pid,
                   (unsigned long long)(uv_now(srv->loop) - co->rt[r].lost_ms));
        rank = r;
        co->rt[r].conn = c;
        co->rt[r].parked = 0;
        co->rt[r].reporting = 0;
        co->rt[r].lost_ms = 0;
        co->rt[r].late_from_ms = uv_now(srv->loop); /* its resent pushes get their time */
        co->rt[r].launcher = msg->launcher;
        if (co->rt[r].joined_ms == 0) { /* restored by a restart of this shard: from now */
            co->rt[r].joined_ms = uv_now(srv->loop);
            co->rt[r].steps_at_join = co->s.m[r].steps_done;
        }
    } else {
        uint64_t taken = co->s.active | co->rec.removed_in_step | co->s.step_members;
        if (taken == ~0ull && psd__close_deserted_step(srv))
            taken = co->s.active | co->rec.removed_in_step | co->s.step_members;
        for (uint32_t r = 0; r < PS_MAX_RANKS && rank < 0; r++)
            if (!(taken >> r & 1)) rank = (int32_t)r;
        if (rank < 0) {
            /* Ranks that left the open step stay taken until it closes (their pushes of it
             * may sit in the shards' slots): with members still in it, they are free once
             * those finish it (close_deserted_step closes one without members). */
            /* Held ranks free up when the step closes: PS_EBUSY, which libps's join asks
             * again for until its reconnect timeout (a step without members closes at a join
             * once a checkpoint's hold of it ends; before, the join failed: a helper's probe,
             * a worker exited 1 while a stopped shard made the hold last 5 s). */
            uint32_t left = popcount(co->rec.removed_in_step & ~co->s.active);
            const char *why = co->s.step_members == 0
                                  ? " (by members that left the open step, which has none: it "
                                    "closes without them at a join once the checkpoint that "
                                    "holds it ends)"
                                  : " (some by members that left the open step, until it closes)";
            if (left)
                PS_LOG(PS_LOG_WARN, "coord", "a worker cannot join yet: %u of the %d ranks are "
                       "held by members that left open step %llu, until it closes%s, and the "
                       "others are members", left, PS_MAX_RANKS, (unsigned long long)co->s.step,
                       co->s.step_members == 0 ? " (a checkpoint holds it)" : "");
            psd_send_error(srv, c, msg->req_id, left ? PS_EBUSY : PS_EFULL,
                           "all %d worker ranks are taken%s", PS_MAX_RANKS, left ? why : "");
            return;
        }
        /* ssp: a newcomer starts at the slowest member's clock; from 0 it would hold every
         * other member back until it had done as many batches on its own. */
        uint64_t clock = srv->m.job.consistency == PS_CONSIST_SSP && co->s.active ? psd__slowest(co)
                                                                                 : 0;
        saved_member_t *m = &co->s.m[rank];
        memset(m, 0, sizeof *m);
        if ((uint32_t)rank >= co->m_hi) co->m_hi = (uint32_t)rank + 1; /* stored from now on */
        m->pid = msg->pid;
        m->steps_done = clock;
        if (clock)
            PS_LOG(PS_LOG_INFO, "coord", "rank %d starts at clock %llu, the slowest member's "
                   "(ssp)", rank, (unsigned long long)clock);
        m->join_serial = ++co->s.joins;
        psd__host_safe(m->host, sizeof m->host, msg->host[0] ? msg->host : c->peer);
        co->rt[rank] = (member_rt_t){.conn = c, .joined_ms = uv_now(srv->loop),
                                     .steps_at_join = clock, .known = true,
                                     .launcher = msg->launcher};
        co->s.active |= 1ull << rank;
        if (co->grant_start > 0) co->grant_start--;
        PS_LOG(PS_LOG_INFO, "coord", "worker pid %u from %s joins as rank %d at step %llu "
               "(%u members)", msg->pid, c->peer, rank, (unsigned long long)co->s.step,
               popcount(co->s.active));
    }
    c->rank = rank;
    c->pid = msg->pid;
    c->host_id = msg->store_id;
    c->join_serial = co->s.m[rank].join_serial;
    ps_msg_t r = {.type = PS_MSG_HELLO_REPLY, .req_id = msg->req_id, .rank = rank,
                  .workers = popcount(co->s.active), .epoch = co->s.epoch, .shard = 0,
                  .consistency = (uint32_t)srv->m.job.consistency, .step = co->s.step,
                  .members = co->s.step_members, .samples = co->s.m[rank].join_serial,
                  .count = psd_shard_tensors(srv), .flags = PSD_HELLO_FLAGS};
    psd_hello_store(srv, msg, &r);
    psd_hello_run(srv, &r);
    psd_hello_area(srv, c, msg, &r);
    psd_send_msg(srv, c, &r);
}

/* A member's report that the batch of msg->step was applied everywhere (its pushes were all
 * acknowledged): count it and, under bsp, close the steps up to it. A batch request or a leave
 * carries it (PS_FLAG_DONE). Returns 0, or the error to answer. */
static int batch_done(psd_server_t *srv, uint32_t r, const ps_msg_t *msg, char *err,
                      size_t errlen)
{
    psd_coord_t *co = srv->coord;
    saved_member_t *m = &co->s.m[r];
    if (is_bsp(srv) && msg->step > co->s.step + 1) {
        /* Nothing has handed out that step: closing steps up to it would count batches no
         * shard applied (and, held for a checkpoint, never end). */
        snprintf(err, errlen, "rank %u reports step %llu done, but the open step is %llu", r,
                 (unsigned long long)msg->step, (unsigned long long)co->s.step);
        return PS_EPROTO;
    }
    PS_LOG(PS_LOG_DEBUG, "coord", "rank %u reports step %llu done%s (open step %llu)", r,
           (unsigned long long)msg->step, msg->flags & PS_FLAG_STALE ? ", stale" : "",
           (unsigned long long)co->s.step);
    bool settled = false; /* a stale report taken care of here */
    if (is_bsp(srv) && (co->rec.rc_unsettled >> r & 1) && msg->step >= co->rec.rc_step) {
        /* Its own report of the restarted step rc_step settles its batch: a later step's
         * (that report lost) cannot tell, and gives it back too. */
        psd__rec_changed(co);
        co->rec.rc_unsettled &= ~(1ull << r);
        if ((msg->flags & PS_FLAG_STALE) || msg->step > co->rec.rc_step) {
            psd__regive(srv, co->rec.rc_batch[r], PS_REPLAY_TAG(co->rec.rc_step, r), true);
            PS_LOG(PS_LOG_INFO, "coord", "rank %u's batch of step %llu, a step handed out again "
                   "after its members left: %s; it goes to another worker", r,
                   (unsigned long long)co->rec.rc_step,
                   msg->step > co->rec.rc_step ? "its report was lost"
                                               : "a shard had passed the step without it");
        }
        settled = true;
    }
    if (is_bsp(srv) && msg->step >= co->rec.rc_step) {
        /* Every shard acknowledged r's pushes of rc_step (or a later step): they ack a push at
         * its step's apply, so rc_step is applied on every chunk, with whoever it had. */
        if (co->rec.rc_pending) psd__rec_changed(co);
        co->rec.rc_pending = 0;
    }
    for (int i = 0; is_bsp(srv) && i < COORD_TOLD; i++)
        if (co->rec.told[i].epoch && msg->step > co->rec.told[i].step) {
            /* r's pushes of a later step were acknowledged everywhere: no shard is at it. */
            psd__rec_changed(co);
            co->rec.told[i].epoch = 0;
        }
    bool again = is_bsp(srv) && co->rec.emptied_step1 == co->s.step + 1 &&
                 msg->step == co->s.step && (co->s.step_members >> r & 1) &&
                 ((m->has_batch && m->batch_step == msg->step) ||
                  (co->rec.again_reported >> r & 1));
    if (again) {
        /* A step handed out again after every member left: a chunk that had passed it
         * acknowledges pushes without applying them, so one report does not show it applied
         * everywhere. It closes once every member reported it (or left). */
        psd__rec_changed(co);
        co->rec.again_reported |= 1ull << r;
        if (msg->flags & PS_FLAG_STALE) co->rec.again_stale |= 1ull << r;
        m->has_batch = 0; /* kept in m->batch for the close; not handed again meanwhile */
        /* No apply job may come before the close (every chunk may be past the step): saved
         * now, so that a restart of this shard meanwhile still knows the report. */
        bool last = (co->s.step_members & ~co->rec.again_reported) == 0;
        if (last && srv->test_crash_close_save && srv->test_crash_close_save-- == 1)
            psd__crash_in_next_save(co, "PS_TEST_CRASH_CLOSE_SAVE"); /* the coord_save below */
        psd__coord_save(srv);
        if (!co->s.finished && (co->s.step_members & ~co->rec.again_reported) == 0)
            psd__close_step(srv);
    } else if (is_bsp(srv)) {
        if (co->rec.emptied_step1 == co->s.step + 1 && msg->step > co->s.step &&
            (co->s.step_members >> r & 1) && !(co->rec.again_reported >> r & 1))
            /* Not expected: the next step's batches are answered only once the close of a step
             * handed out again is committed (close_step). Closed here, its batch counts. */
            PS_LOG(PS_LOG_WARN, "coord", "rank %u reports step %llu while step %llu, handed out "
                   "again, still waits for its report", r, (unsigned long long)msg->step,
                   (unsigned long long)co->s.step);
        /* Its pushes of that step were acknowledged by every shard: the step is applied
         * everywhere. (After a restart of this shard a report may be one step ahead.) */
        while (!co->s.finished && co->s.step <= msg->step && (co->s.step_members >> r & 1))
            psd__close_step(srv);
        if ((msg->flags & PS_FLAG_STALE) && !settled)
            PS_LOG(PS_LOG_WARN, "coord", "rank %u reports its batch of step %llu (pass %llu at "
                   "%llu) dropped unapplied by a shard that had passed the step, which was not "
                   "handed out again after its members left: counted as applied", r,
                   (unsigned long long)msg->step, (unsigned long long)msg->data_epoch,
                   (unsigned long long)msg->batch_offset);
    } else if (m->has_batch && m->batch_step == msg->step) {
        ps_cursor_applied(&co->s.cur, &m->batch);
        m->has_batch = 0;
        m->steps_done++;
        co->rt[r].last_done_ms = uv_now(srv->loop);
        if (co->s.step < m->steps_done) co->s.step = m->steps_done; /* the fastest */
    }
    return 0;
}

void psd_coord_on_leave_done(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg)
{
    psd_coord_t *co = srv->coord;
    int r = member_of(srv, c);
    char err[160];
    if (r < 0 || msg->samples != co->s.cur.n) return; /* not a member, or not this job's set */
    if (batch_done(srv, (uint32_t)r, msg, err, sizeof err))
        PS_LOG(PS_LOG_WARN, "coord", "leave: %s", err);
    else
        PS_LOG(PS_LOG_INFO, "coord", "rank %d (pid %u) leaves with its batch of step %llu done",
               r, c->pid, (unsigned long long)msg->step);
}

/* bsp: a chunk's step waits for every member's push, so a member that declared other tensors
 * than the rest (another model) would hold every step of the tensors it lacks for good, and
 * its own of the tensors only it has. Its first batch request is refused instead (PS_ECONFIG,
 * naming both counts), so it leaves and the others go on. Only the first: a set that grows
 * mid-job (every worker declaring one more tensor) is the program's business. A request
 * without a set (an older libps) is not checked. Whether @p msg was refused. */
static bool tensor_set_differs(psd_server_t *srv, psd_conn_t *c, uint32_t r, const ps_msg_t *msg)
{
    psd_coord_t *co = srv->coord;
    if (!is_bsp(srv) || msg->tensor_set == 0) return false;
    member_rt_t *me = &co->rt[r];
    for (uint32_t o = 0; me->tensor_set == 0 && o < PS_MAX_RANKS; o++) {
        const member_rt_t *other = &co->rt[o];
        if (o == r || !(co->s.active >> o & 1) || other->tensor_set == 0 ||
            other->tensor_set == msg->tensor_set)
            continue;
        PS_LOG(PS_LOG_WARN, "coord", "rank %u (pid %u) refused: it declared %llu tensors, rank "
               "%u %llu, not the same set", r, c->pid, (unsigned long long)msg->count, o,
               (unsigned long long)other->tensor_count);
        psd_send_error(srv, c, msg->req_id, PS_ECONFIG,
                       "this worker declared %llu tensors and rank %u of the job %llu%s: under "
                       "bsp every worker must declare the same tensors (the same model), since "
                       "each step waits for every member's push of each",
                       (unsigned long long)msg->count, o, (unsigned long long)other->tensor_count,
                       msg->count == other->tensor_count ? ", but not the same ones" : "");
        return true;
    }
    me->tensor_set = msg->tensor_set;
    me->tensor_count = msg->count;
    return false;
}

uint64_t psd_coord_bsp_step(const psd_server_t *srv)
{
    return srv->coord && is_bsp(srv) ? srv->coord->s.step : 0;
}

uint32_t psd_coord_members(const psd_server_t *srv)
{
    return srv->coord ? popcount(srv->coord->s.active) : 0;
}

uint32_t psd_coord_desired(const psd_server_t *srv)
{
    return srv->coord ? srv->coord->s.desired : srv->m.job.workers;
}

void psd_coord_on_batch(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg)
{
    psd_coord_t *co = srv->coord;
    int r = member_of(srv, c);
    if (r < 0) {
        char epoch[40];
        psd_send_error(srv, c, msg->req_id, PS_ENOTMEMBER,
                       "rank %d is not a member of the job%s: join again", c->rank,
                       epoch_words(srv, epoch, sizeof epoch));
        return;
    }
    if (msg->samples == 0) { /* libps refuses it first; a raw peer may not */
        psd_send_error(srv, c, msg->req_id, PS_ECONFIG,
                       "a batch request names a training set of 0 samples");
        return;
    }
    if (co->s.cur.n != 0 && msg->samples != co->s.cur.n) {
        /* Fixed for the job by its first batch request: the cursor's batches are ranges of it.
         * Who named it is said, so that a worker started with the wrong data is found (a
         * helper's probe, session 59: one that asked first locked every other out). */
        psd_send_error(srv, c, msg->req_id, PS_ECONFIG,
                       "this worker's training set has %llu samples, the job's has %llu (named "
                       "by %s; every worker of a job trains on one set: a new set is a new job, "
                       "in an empty data_dir)",
                       (unsigned long long)msg->samples, (unsigned long long)co->s.cur.n,
                       co->set_by[0] ? co->set_by : "its first batch request, stored with the job");
        return;
    }
    /* The job settings that decide what a batch names on the worker (libps sends them since
     * session 61; 0: an older one). The seed orders each pass on every worker, so one of
     * another seed trained other samples than those the batch counts (some twice, some never)
     * without a word; the batch size is the job's as it was made (kept in the cursor), and a
     * worker of a smaller one wrote past its buffers (an operator probe, session 61). */
    if (msg->job_seed1 && msg->job_seed1 != srv->m.job.seed + 1) {
        psd_send_error(srv, c, msg->req_id, PS_ECONFIG,
                       "this worker's job.seed is %llu, the job's %llu: the seed orders each "
                       "pass's samples, so its batches would name other samples than the "
                       "others'; every worker of a job needs the job's manifest",
                       (unsigned long long)(msg->job_seed1 - 1),
                       (unsigned long long)srv->m.job.seed);
        return;
    }
    if (msg->job_batch && msg->job_batch != co->s.cur.batch) {
        psd_send_error(srv, c, msg->req_id, PS_ECONFIG,
                       "this worker's job.batch_size is %u, the job's %u (as it was made: kept in "
                       "its store; a new batch_size is a new job, in empty data_dirs)",
                       msg->job_batch, co->s.cur.batch);
        return;
    }
    if (tensor_set_differs(srv, c, (uint32_t)r, msg)) return;
    if ((msg->flags & PS_FLAG_REPORT) && (!(msg->flags & PS_FLAG_DONE) || co->s.cur.n == 0)) {
        psd_send_error(srv, c, msg->req_id, PS_EPROTO, "a report of a batch done names no batch, "
                       "or comes before any batch was asked for");
        return;
    }
    /* One answer waits per member (libps makes one call at a time): a second would take the
     * first one's request id (a review, session 64: a hostile peer's parked request was then
     * never answered). */
    if ((co->rt[r].parked || co->rt[r].reporting) && co->rt[r].park_req != msg->req_id) {
        psd_send_error(srv, c, msg->req_id, PS_EPROTO, "rank %d's %s waits for its answer "
                       "already: one request at a time", r,
                       co->rt[r].parked ? "batch request" : "report of a batch done");
        return;
    }
    const saved_member_t *sm = &co->s.m[r];
    if ((msg->flags & PS_FLAG_REPORT) && !is_bsp(srv) && msg->step >= sm->steps_done &&
        !(sm->has_batch && sm->batch_step == msg->step)) {
        /* Not its batch, nor one it reported already (a report sent again after a restart of
         * this shard): answered as taken, its worker would think it reported (a review). */
        psd_send_error(srv, c, msg->req_id, PS_EPROTO, "rank %d reports its batch of step %llu "
                       "done, but it holds %s", r, (unsigned long long)msg->step,
                       sm->has_batch ? "another" : "none");
        return;
    }
    char err[160];
    if ((msg->flags & PS_FLAG_DONE) && batch_done(srv, (uint32_t)r, msg, err, sizeof err)) {
        psd_send_error(srv, c, msg->req_id, PS_EPROTO, "%s", err);
        return;
    }
    if (msg->flags & PS_FLAG_REPORT) {
        /* A batch done reported alone (psd.torch under asp / ssp, at the end of step()): a
         * checkpoint's cut, and ssp's slowest member, wait for nothing more of it while its
         * worker evaluates or saves before its next request (a probe, session 64: a worker
         * that evaluated for 12 s between batches stopped the others for 9 s at each
         * periodic checkpoint, then had it skipped, "slow or hung"). Answered once a
         * committed state holds it, as a hand-out is: a restart of this shard before would
         * hand the batch to its worker again. */
        co->rt[r].reporting = 1;
        co->rt[r].park_req = msg->req_id;
        co->rt[r].report_gen = psd__coord_save_gen(srv);
        psd__serve_parked(srv);
        return;
    }
    if (co->s.cur.n == 0) {
        /* Only a request taken names the set: one refused above (another seed, batch size or
         * model) fixed it for good before (a review, session 63: every right worker was then
         * refused, also after a restart, until the data_dirs were emptied). */
        co->s.cur.n = msg->samples;
        snprintf(co->set_by, sizeof co->set_by, "rank %d (pid %u on %s)", r, co->s.m[r].pid,
                 co->s.m[r].host);
    }
    co->rt[r].parked = 1;
    co->rt[r].park_req = msg->req_id;
    if (is_bsp(srv)) psd__maybe_restart_step(srv);
    psd__serve_parked(srv);
}

static void member_remove(psd_server_t *srv, uint32_t r, const char *why)
{
    psd_coord_t *co = srv->coord;
    saved_member_t *m = &co->s.m[r];
    /* bsp: a member whose open step's batch reply never went out (handed the batch by a tick,
     * or by the step's close, before it asked: a joiner that died, or gave up on another shard,
     * first; a member leaving with its last batch's report, which closed the step and handed it
     * the next) cannot have pushed the open step: its rank is free at once, and its batch goes
     * back without a replay tag of it. Before, each such member held its rank until the step
     * closed and added a tag, so a batch passed among such joiners lost the tag of the member
     * that had pushed it (PS_REPLAY_MAX) and was applied twice there; and until session 73 a
     * member that had had batches before did so at every leave at a step's end (a review).
     * Only where this process knows every reply it had (`known`): a restart of this shard
     * hands out again, unseen here, a batch its member had from the process before and may
     * have pushed (a first try of this change applied such a batch twice:
     * elastic:kill9_coordinator_idle_tensor). */
    bool unsent = is_bsp(srv) && co->rt[r].known && !co->rt[r].batch_seen && m->has_batch &&
                  m->batch_step == co->s.step;
    co->s.active &= ~(1ull << r);
    psd__rec_changed(co);
    if ((co->s.step_members >> r & 1) && !unsent)
        co->rec.removed_in_step |= 1ull << r; /* its pushes of this step may sit in slots */
    co->rt[r].parked = 0;
    co->rt[r].reporting = 0;
    co->rt[r].conn = NULL;
    co->rt[r].lost_ms = 0;
    if (co->grant_stop > 0) co->grant_stop--;
    bool again = is_bsp(srv) && co->rec.emptied_step1 == co->s.step + 1;
    if (again && (co->rec.again_reported >> r & 1)) { /* its report settled its batch */
        if (co->rec.again_stale >> r & 1)
            psd__regive(srv, m->batch, PS_REPLAY_TAG(co->s.step, r), false);
        else
            ps_cursor_applied(&co->s.cur, &m->batch);
    }
    co->rec.again_reported &= ~(1ull << r);
    co->rec.again_stale &= ~(1ull << r);
    bool rc_lost = is_bsp(srv) && (co->rec.rc_pending >> r & 1);
    if (is_bsp(srv) && (co->rec.rc_unsettled >> r & 1)) {
        co->rec.rc_unsettled &= ~(1ull << r);
        if (!rc_lost) /* else restore_closed_lost gives it back */
            psd__regive(srv, co->rec.rc_batch[r], PS_REPLAY_TAG(co->rec.rc_step, r), true);
    }
    if (rc_lost) psd__restore_closed_lost(srv, r);
    bool given_back = false;
    if (m->has_batch) {
        /* Not applied (bsp: its step is still open): someone else takes it. Some of its pushes
         * may have been applied (bsp: a chunk applies the step once every member's push of it
         * is there; asp / ssp: each push on arrival): the batch carries this step and rank
         * (asp / ssp: the rank), so those chunks do not apply it again (replay_had and
         * batch_applied_here in push.c). A member that never had a batch reply pushed
         * nothing: no tag, and nothing for a restart to hold its rank for. */
        bool tag = is_bsp(srv) ? m->batch_step == co->s.step &&
                                     (co->s.step_members >> r & 1) && !unsent
                               : true;
        /* asp / ssp: step 0 (only the rank counts there), so that its tags merge into one. */
        if (tag) psd__batch_tag(&m->batch, PS_REPLAY_TAG(is_bsp(srv) ? m->batch_step : 0, r));
        if (co->rt[r].batch_seen && ++m->batch.left >= POISON_LEFT) {
            co->suspect += m->batch.left == POISON_LEFT; /* counted once, said each time */
            PS_LOG(PS_LOG_WARN, "coord", "the batch of pass %llu at %llu (%u samples: positions "
                   "%llu to %llu of that pass's order) went to %u workers that each left with it, "
                   "the last rank %u (pid %u): are its samples what makes workers fail?",
                   (unsigned long long)m->batch.pass, (unsigned long long)m->batch.offset,
                   m->batch.count, (unsigned long long)m->batch.offset,
                   (unsigned long long)(m->batch.offset + m->batch.count - 1), m->batch.left, r,
                   m->pid);
        }
        if (ps_cursor_give_back(&co->s.cur, &m->batch))
            PS_LOG(PS_LOG_ERROR, "coord", "re-hand queue full: batch of pass %llu at %llu lost",
                   (unsigned long long)m->batch.pass, (unsigned long long)m->batch.offset);
        m->has_batch = 0;
        if (unsent) m->batch.count = 0; /* psd_coord_create's rebuild of removed_in_step */
        given_back = true;
        if (co->s.finished && !is_bsp(srv)) co->s.finished = 0;
    }
    char gone[96] = "";
    if (given_back)
        snprintf(gone, sizeof gone, "; its batch (pass %llu at %llu) goes to another worker",
                 (unsigned long long)m->batch.pass, (unsigned long long)m->batch.offset);
    PS_LOG(PS_LOG_INFO, "coord", "rank %u (pid %u) left at step %llu: %s%s (%u members)", r,
           m->pid, (unsigned long long)co->s.step, why, gone, popcount(co->s.active));
    if (is_bsp(srv) && (co->s.step_members >> r & 1)) {
        uint64_t left = co->s.step_members & ~(1ull << r);
        if (left == 0) co->rec.emptied_step1 = co->s.step + 1; /* hand_out; saved with: */
        psd__set_members(srv, left);
        psd__broadcast_epoch(srv);
        if (again && left && (left & ~co->rec.again_reported) == 0)
            psd__close_step(srv); /* every member left reported the step handed out again */
        psd__maybe_restart_step(srv);
    } else {
        psd__maybe_restart_step(srv);
    }
    psd__async_maybe_finished(srv); /* the others may all have done their steps */
    /* Committed now, not with the next update: after the job's last one there is none, and a
     * restart showed (and waited for) members that had left long before. */
    psd__coord_save(srv);
    psd__serve_parked(srv);
}

/* Whether a member's process may still run: 0 only when it ran on this host (by name) and
 * /proc shows its pid gone or a zombie. Elsewhere (or in another pid namespace that shares
 * the host name: then this may err either way) it cannot be told. */
static int may_live(const saved_member_t *m)
{
    char host[sizeof m->host];
    if (gethostname(host, sizeof host) != 0 || strncmp(host, m->host, sizeof host) != 0) return 1;
    char path[64], stat[256];
    snprintf(path, sizeof path, "/proc/%u/stat", m->pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) return 0;
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[n] = '\0';
    const char *paren = strrchr(stat, ')'); /* "pid (comm) S ...": comm may hold spaces */
    return !(paren && paren[1] == ' ' && paren[2] == 'Z');
}

void psd_coord_on_gone(psd_server_t *srv, psd_conn_t *c, const char *why, bool may_return)
{
    psd_coord_t *co = srv->coord;
    int r = member_of(srv, c);
    if (r < 0) return;
    /* A connection that closed while its process may live (its transport was started again,
     * the network broke): the same process gets its rank back if it says hello within
     * grace_ms (psd_coord_tick). Meanwhile the open step waits for it. */
    if (may_return && may_live(&co->s.m[r])) {
        co->rt[r].conn = NULL;
        co->rt[r].parked = 0; /* that request went with the connection: it asks again */
        co->rt[r].reporting = 0;
        /* The time now, not the loop's cached one: after a stall of this process (a SIGSTOP),
         * closes are seen before the loop reads the clock again, and a stamp from before the
         * stall had the grace used up at the next tick (a probe, session 40: every member of
         * a coordinator stopped for 4 s was dropped when it resumed). */
        uv_update_time(srv->loop);
        co->rt[r].lost_ms = uv_now(srv->loop);
        PS_LOG(PS_LOG_INFO, "coord", "rank %d (pid %u): %s; its rank waits %llu ms for it to "
               "come back", r, co->s.m[r].pid, why, (unsigned long long)grace_ms(srv));
        return;
    }
    member_remove(srv, (uint32_t)r, why);
}

/* Close member @p r's connection here as a silent one's (conn_close_ep: member_remove with
 * "it held the others past job.step_timeout_ms"). */
static void drop_late(psd_server_t *srv, uint32_t r)
{
    psd_conn_t *c = srv->coord->rt[r].conn;
    srv->late_drops++;
    c->dead = c->late = c->close_queued = true; /* closed from the deferred hook */
}

/*
 * bsp with job.step_timeout_ms: a member of the open step none of whose pushes of it reached
 * this shard job.step_timeout_ms after the first member's did holds every other one for as
 * long as it stays (a worker hung in its training loop while libps's thread heartbeats). It is
 * dropped as a silent one is: its connection here closes (conn_close_ep: member_remove, the
 * step goes on without it), and if it goes on it learns it was removed and joins again. Only
 * this shard's chunks are watched (a member's pushes of a step leave together: the hang comes
 * between steps); with no chunk here nothing is dropped.
 */
static void late_members(psd_server_t *srv, uint64_t now)
{
    psd_coord_t *co = srv->coord;
    uint64_t limit = srv->m.job.step_timeout_ms;
    uint64_t late = co->s.step_members & ~srv->sp_mask;
    if (co->s.finished || srv->sp_step != co->s.step || srv->sp_mask == 0 || late == 0 ||
        now - srv->sp_first_ms <= limit)
        return;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        psd_conn_t *c = co->rt[r].conn;
        /* One whose connection closed has its grace to come back (psd_coord_tick); one that
         * became a member of the step, or came back, later than the first push has its own
         * deadline (a step handed out again after its members left keeps sp_first_ms). */
        if (!(late >> r & 1) || !(co->s.active >> r & 1) || c == NULL || c->dead ||
            co->rt[r].parked) /* it waits for its batch's answer from us: not hung */
            continue;
        uint64_t from = co->rt[r].late_from_ms > srv->sp_first_ms ? co->rt[r].late_from_ms
                                                                   : srv->sp_first_ms;
        if (srv->late_floor_ms > from) from = srv->late_floor_ms;
        if (now - from <= limit) continue;
        PS_LOG(PS_LOG_WARN, "coord", "rank %u (pid %u) has not pushed step %llu %llu ms after "
               "the first member did (job.step_timeout_ms %llu): dropping it", r,
               co->s.m[r].pid, (unsigned long long)co->s.step,
               (unsigned long long)(now - srv->sp_first_ms), (unsigned long long)limit);
        drop_late(srv, r);
    }
}

/*
 * ssp with job.step_timeout_ms: while a member waits because it is more than job.staleness
 * batches ahead of the slowest (job.staleness + 1 done), a slowest member that reported no
 * batch for job.step_timeout_ms (nor joined or came back within it) is dropped as
 * late_members drops one under bsp.
 */
static void late_slowest(psd_server_t *srv, uint64_t now)
{
    psd_coord_t *co = srv->coord;
    uint64_t low = psd__slowest(co), limit = srv->m.job.step_timeout_ms;
    bool waits = false;
    if (co->s.finished) return; /* a member parked then waits for nothing (the end) */
    for (uint32_t r = 0; r < PS_MAX_RANKS && !waits; r++)
        waits = (co->s.active >> r & 1) && co->rt[r].parked && !co->s.m[r].has_batch &&
                co->s.m[r].steps_done > low + srv->m.job.staleness;
    for (uint32_t r = 0; waits && r < PS_MAX_RANKS; r++) {
        const member_rt_t *rt = &co->rt[r];
        if (!(co->s.active >> r & 1) || co->s.m[r].steps_done != low || rt->conn == NULL ||
            rt->conn->dead || rt->parked) /* waiting for our answer (a checkpoint's hold) */
            continue;
        uint64_t from = rt->last_done_ms;
        if (rt->joined_ms > from) from = rt->joined_ms;
        if (rt->late_from_ms > from) from = rt->late_from_ms; /* its last batch's answer */
        if (srv->late_floor_ms > from) from = srv->late_floor_ms;
        if (now - from <= limit) continue;
        PS_LOG(PS_LOG_WARN, "coord", "rank %u (pid %u) reported no batch for %llu ms while a "
               "member waits for it, %u batches ahead (job.step_timeout_ms %llu): dropping it",
               r, co->s.m[r].pid, (unsigned long long)(now - from),
               (unsigned)srv->m.job.staleness + 1, (unsigned long long)limit);
        drop_late(srv, r);
    }
}

void psd_coord_stalled(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    uint64_t now = uv_now(srv->loop);
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++)
        if ((co->s.active >> r & 1) && co->rt[r].conn == NULL && co->rt[r].lost_ms)
            co->rt[r].lost_ms = now ? now : 1;
}

void psd_coord_tick(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    uint64_t now = uv_now(srv->loop);
    uint64_t limit = srv->m.job.heartbeat_timeout_ms;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        if (!(co->s.active >> r & 1) || co->rt[r].conn != NULL) continue;
        if (co->rt[r].lost_ms && !may_live(&co->s.m[r])) /* exited since */
            member_remove(srv, r, "its connection closed and its process ended");
        else if (co->rt[r].lost_ms && now - co->rt[r].lost_ms > grace_ms(srv))
            member_remove(srv, r, "its connection closed and it did not come back");
        else if (co->rt[r].lost_ms == 0 && now - co->started_ms > limit)
            member_remove(srv, r, "did not come back after the coordinator restarted");
    }
    if (co->save_retry && !co->save_busy) psd__coord_save(srv); /* a save failed (save_done) */
    if (co->grant_ms && now - co->grant_ms > GRANT_TTL_MS) {
        co->grant_start = co->grant_stop = 0; /* launches that never showed up */
        co->grant_ms = 0;
    }
    const uint64_t hold_limit = srv->test_ckpt_hold_ms ? srv->test_ckpt_hold_ms : CKPT_HOLD_MS;
    bool lapsed = false;
    for (uint32_t u = 0; u < co->hold_users;) {
        if (now - co->hold_user[u].ms <= hold_limit) {
            u++;
            continue;
        }
        /* Its BEGIN answer was lost, or its psctl died: its GO will hear that the hold lapsed. */
        PS_LOG(PS_LOG_WARN, "coord", "checkpoint %016llx: no GO within %llu ms of its last ask: "
               "the hand-outs are no longer held for it", (unsigned long long)co->hold_user[u].id,
               (unsigned long long)hold_limit);
        co->hold_user[u] = co->hold_user[--co->hold_users];
        lapsed = true;
    }
    if (lapsed && is_bsp(srv) && co->hold_ms && co->hold_users == 0) {
        /* bsp: the last checkpoint using the hold lapsed (its psctl died after its BEGIN, and
         * the others' GOs kept the hold for it): the hold ends now, not at its own lapse,
         * which a later BEGIN had put off (a review, session 50: training stood 11 s). */
        PS_LOG(PS_LOG_WARN, "coord", "checkpoint hold of step %llu: no checkpoint uses it any "
               "more: releasing it", (unsigned long long)co->hold_step);
        psd_coord_ckpt_release(srv);
    }
    if (co->hold_ms && now - co->hold_ms > hold_limit) {
        if (is_bsp(srv))
            PS_LOG(PS_LOG_WARN, "coord", "checkpoint hold of step %llu not released within %llu "
                   "ms: releasing it", (unsigned long long)co->hold_step,
                   (unsigned long long)hold_limit);
        else
            PS_LOG(PS_LOG_WARN, "coord", "checkpoint hold of the hand-outs not released or asked "
                   "for again within %llu ms: releasing it", (unsigned long long)hold_limit);
        psd_coord_ckpt_release(srv);
    }
    if (is_bsp(srv) && srv->m.job.step_timeout_ms) late_members(srv, now);
    if (srv->m.job.consistency == PS_CONSIST_SSP && srv->m.job.step_timeout_ms)
        late_slowest(srv, now);
    if (is_bsp(srv)) {
        if (co->told_unlearnt) {
            /* After a restart: the closed views kept (rec.told) pass this shard's chunks still
             * at their steps (a step closed with no member, whose save committed before this
             * shard's pass of it). Not in psd_coord_create: such a view makes a chunk ready
             * without a push, and an apply job must not start before the loop does. */
            co->told_unlearnt = false;
            for (int i = 0; i < COORD_TOLD; i++)
                if (co->rec.told[i].epoch)
                    psd_shard_learn_view(srv, co->rec.told[i].epoch, co->rec.told[i].step,
                                         co->rec.told[i].members, true);
        }
        psd__tell_closed(srv); /* a shard that missed them, or restarted since */
        psd__maybe_restart_step(srv);
    } else if (!co->s.started)
        psd__serve_parked(srv); /* the start's grace may have run out */
}

