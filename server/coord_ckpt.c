/* coord_ckpt.c: the coordinator's checkpoint holds: the step psctl checkpoint cuts at, held
 * from the hand-out until every shard took its snapshot (bsp: a step; asp / ssp: a drain). */

#include <stdio.h>

#include "coord_internal.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"

/* The step a checkpoint asked for now would have: the steps before the open one are applied
 * everywhere, and the open one is being applied while it has members (unless it is held). */
static uint64_t natural_step(const psd_coord_t *co)
{
    return co->s.step + (co->s.step_members != 0 && !co->s.finished && !co->held ? 1 : 0);
}

static void hold_ahead(psd_server_t *srv, uint64_t step)
{
    psd_coord_t *co = srv->coord;
    co->hold_step = step;
    co->hold_ms = 0;
    co->hold_ahead = true;
    PS_LOG(PS_LOG_INFO, "coord", "checkpoint at step %llu requested: the step will be held "
           "when reached", (unsigned long long)step);
}

/* The index of checkpoint @p id among the hold's users, or -1. */
static int hold_user(const psd_coord_t *co, uint64_t id)
{
    for (uint32_t u = 0; u < co->hold_users; u++)
        if (co->hold_user[u].id == id) return (int)u;
    return -1;
}

/* Checkpoint @p id arms the shards under the hold: until its GO, CKPT_HOLD_MS after this, or
 * until @p conn closes. Asked again (its answer was lost, and psctl asked once more, maybe over
 * a new connection) it is the same user. */
static void hold_user_add(psd_coord_t *co, uint64_t id, uint64_t now, const psd_conn_t *conn)
{
    int u = hold_user(co, id);
    if (u < 0 && co->hold_users == CKPT_USERS_MAX) { /* the oldest one gives way */
        uint32_t old = 0;
        for (uint32_t i = 1; i < co->hold_users; i++)
            if (co->hold_user[i].ms < co->hold_user[old].ms) old = i;
        co->hold_user[old] = co->hold_user[--co->hold_users];
    }
    if (u < 0) {
        u = (int)co->hold_users++;
        co->hold_user[u].id = id;
    }
    co->hold_user[u].ms = now;
    co->hold_user[u].conn = conn;
    if (co->hold_asker == conn) co->hold_asker = NULL; /* its ask is a user's now */
}

/* asp / ssp: no common step, so the cut is made by holding every new hand-out and waiting until
 * each batch handed out was reported (its pushes acknowledged, i.e. committed, on every shard)
 * or went back with its member. Then no push is in flight and none can start before the hold
 * ends, and each shard's snapshot, taken whenever it is told, holds the same batches. Asked
 * again while batches are in flight (PS_FLAG_PENDING): each ask keeps the hold alive, so a
 * psctl that died ends it CKPT_HOLD_MS after its last ask. A drained answer makes checkpoint
 * @p id a user of the hold: its GO learns whether the hold lasted for it (a cut) or lapsed. */
static uint64_t hold_async(psd_server_t *srv, uint64_t id, const psd_conn_t *conn,
                           uint32_t *flags, uint32_t *pending)
{
    psd_coord_t *co = srv->coord;
    bool was = co->hold_ms != 0;
    co->hold_step = UINT64_MAX;
    co->hold_ahead = false;
    co->hold_ms = psd__hold_now(srv);
    *pending = psd__in_flight(co);
    *flags = *pending ? PS_FLAG_PENDING : 0;
    if (*pending == 0)
        hold_user_add(co, id, co->hold_ms, conn);
    else
        co->hold_asker = conn;
    if (!was)
        PS_LOG(PS_LOG_INFO, "coord", "checkpoint: no batch handed out until it is taken; %u "
               "in flight", *pending);
    return UINT64_MAX;
}

uint64_t psd_coord_ckpt_hold(psd_server_t *srv, uint64_t id, const psd_conn_t *conn,
                             uint32_t *flags, uint32_t *pending)
{
    psd_coord_t *co = srv->coord;
    *flags = *pending = 0;
    if (!is_bsp(srv)) return hold_async(srv, id, conn, flags, pending);
    /* Holding the hand-out of the natural step keeps every chunk at or below it. The open
     * step itself when its members all left: said (PS_FLAG_MOVE), as workers that left after
     * part of it was applied may have moved a shard past it (psctl then waits for the next). */
    uint64_t step = natural_step(co);
    if (co->s.step_members == 0 && !co->s.finished) *flags |= PS_FLAG_MOVE;
    if (co->hold_ahead && co->hold_step > step) {
        co->ahead_after = co->hold_step; /* the follower's next: held ahead again after this */
        co->ahead_asker = co->hold_asker;
        co->hold_asker = NULL; /* its ask holds nothing now */
    }
    co->hold_step = step;
    co->hold_ahead = false;
    co->hold_ms = psd__hold_now(srv);
    if (id) hold_user_add(co, id, co->hold_ms, conn);
    PS_LOG(PS_LOG_INFO, "coord", "checkpoint at step %llu: holding later steps until every "
           "shard knows it", (unsigned long long)step);
    return step;
}

int psd_coord_ckpt_hold_at(psd_server_t *srv, uint64_t step, uint64_t id,
                           const psd_conn_t *conn, uint32_t *flags, char *err, size_t errlen)
{
    psd_coord_t *co = srv->coord;
    *flags = 0;
    if (!is_bsp(srv)) {
        snprintf(err, errlen, "a checkpoint at a given step needs bsp (this job is %s)",
                 ps_consistency_name(srv->m.job.consistency));
        return PS_EINVAL;
    }
    uint64_t now = natural_step(co);
    if (step < now) {
        snprintf(err, errlen, "the job is past step %llu (a checkpoint now would be at step "
                 "%llu)", (unsigned long long)step, (unsigned long long)now);
        return PS_ECONFLICT;
    }
    if (step == now) {
        uint32_t pending;
        psd_coord_ckpt_hold(srv, id, conn, flags, &pending);
        return 0;
    }
    if (co->s.finished) { /* it will never get there */
        *flags = PS_FLAG_FINISHED;
        return 0;
    }
    if (co->hold_ms && co->hold_step < step) {
        /* A checkpoint holds an earlier step now (one taken by hand beside psd's follower):
         * its hold stays, and this one is held ahead when it ends (psd_coord_ckpt_release).
         * Before, this request ended it, and that checkpoint failed ("shard 1 is already past
         * step 5"; session 49). */
        co->ahead_after = step;
        co->ahead_asker = conn;
        *flags = PS_FLAG_PENDING;
        return 0;
    }
    if (!co->hold_ahead || co->hold_step != step) hold_ahead(srv, step);
    co->hold_asker = conn;
    *flags = PS_FLAG_PENDING;
    return 0;
}

/* bsp: hold ahead the step a request asked for while another checkpoint's hold lasted. */
static void hold_ahead_after(psd_server_t *srv, uint64_t step)
{
    psd_coord_t *co = srv->coord;
    if (step && is_bsp(srv) && !co->s.finished && !co->hold_ms && !co->hold_ahead &&
        step > natural_step(co))
        hold_ahead(srv, step);
}

void psd_coord_ckpt_release(psd_server_t *srv)
{
    psd_coord_t *co = srv->coord;
    if (co == NULL) return;
    co->hold_ahead = false;
    co->hold_users = 0;
    co->hold_asker = NULL;
    uint64_t after = co->ahead_after;
    const psd_conn_t *after_asker = co->ahead_asker;
    co->ahead_after = 0;
    co->ahead_asker = NULL;
    bool was_held = co->hold_ms != 0;
    if (was_held)
        PS_LOG(PS_LOG_INFO, "coord", "checkpoint: the hold ends after %llu ms; later steps go on",
               (unsigned long long)(psd__hold_now(srv) - co->hold_ms));
    co->hold_ms = 0;
    /* The next checkpoint's step is held ahead before the held step is handed out: after, the
     * natural step was already past it when it was the one right after (a review, session 63:
     * a hand checkpoint at step 34 lost psd's follower its 35, and the multiples after). */
    hold_ahead_after(srv, after);
    if (co->hold_ahead) co->hold_asker = after_asker;
    if (was_held) {
        if (!is_bsp(srv)) {
            psd__serve_parked(srv); /* the batch requests the hold kept waiting */
        } else if (co->held) {
            co->held = false;
            psd__hand_out(srv);
        }
    }
}

bool psd_coord_ckpt_release_until(psd_server_t *srv, uint64_t next, uint64_t id,
                                  const psd_conn_t *conn)
{
    psd_coord_t *co = srv->coord;
    bool held = true;
    if (co) {
        /* Two checkpoints at once (psctl by hand beside psd's follower) share the hold: the
         * first one's end must not let the job on while the other is still arming shards. A
         * GO from one that never armed (it gave up waiting, or found a shard busy with the
         * other) ends nothing of theirs. bsp: before session 50 any GO ended the hold, and
         * the other checkpoint failed ("shard 1 is already past step 7"). */
        int u = hold_user(co, id);
        if (!is_bsp(srv)) held = u >= 0 && co->hold_ms;
        if (u >= 0) co->hold_user[u] = co->hold_user[--co->hold_users];
        if (co->hold_ms && co->hold_users > 0) {
            if (!is_bsp(srv))
                co->hold_ms = psd__hold_now(srv);
            else if (next && next > co->hold_step) {
                co->ahead_after = next; /* held ahead once the others' hold ends */
                co->ahead_asker = conn;
            }
            return held;
        }
        /* bsp: the hold is at a step another's ask held ahead and reached (psd's follower,
         * whose BEGIN has not come yet): a checkpoint that used the hold in between (by hand)
         * ends nothing of that ask. Before (a review, session 63), its GO let the job on, and
         * the follower then found the job past its step and lost it and the multiples after
         * it. The hold lapses as any does if that BEGIN never comes (CKPT_HOLD_MS). */
        if (is_bsp(srv) && co->hold_ms && co->hold_users == 0 && co->hold_asker &&
            co->hold_asker != conn && co->hold_step == natural_step(co)) {
            PS_LOG(PS_LOG_INFO, "coord", "checkpoint %016llx done: the hold of step %llu stays "
                   "for the checkpoint that asked for that step", (unsigned long long)id,
                   (unsigned long long)co->hold_step);
            if (next && next > co->hold_step) {
                co->ahead_after = next;
                co->ahead_asker = conn;
            }
            return held;
        }
    }
    psd_coord_ckpt_release(srv);
    if (co && next && is_bsp(srv) && !co->s.finished && next > natural_step(co)) {
        hold_ahead(srv, next);
        co->hold_asker = conn;
    }
    return held;
}

void psd_coord_drop_conn(psd_server_t *srv, const psd_conn_t *c, bool peer_gone)
{
    psd_coord_t *co = srv->coord;
    if (co == NULL) return;
    if (!peer_gone) {
        /* This shard closed it (its transport started again): the psctl may live and ask over a
         * new connection, so its checkpoints keep the hold until their GO or CKPT_HOLD_MS, as
         * before. Releasing here failed a live psctl's checkpoint (a review: "shard 1 is
         * already past step 7"). */
        for (uint32_t u = 0; u < co->hold_users; u++)
            if (co->hold_user[u].conn == c) co->hold_user[u].conn = NULL;
        if (co->hold_asker == c) co->hold_asker = NULL;
        if (co->ahead_asker == c) co->ahead_asker = NULL;
        return;
    }
    if (co->ahead_asker == c) { /* its follower died; started again, it asks for its own next */
        co->ahead_asker = NULL;
        co->ahead_after = 0;
    }
    bool dropped = false, asker = co->hold_asker == c;
    for (uint32_t u = 0; u < co->hold_users;) {
        if (co->hold_user[u].conn != c) {
            u++;
            continue;
        }
        PS_LOG(PS_LOG_WARN, "coord", "checkpoint %016llx: the connection of its psctl closed "
               "before its GO: the hand-outs are no longer held for it",
               (unsigned long long)co->hold_user[u].id);
        co->hold_user[u] = co->hold_user[--co->hold_users];
        dropped = true;
    }
    if (asker) co->hold_asker = NULL;
    /* The hold ends now when nobody is left to use it or to ask for it again, not at its
     * lapse: before, a psctl killed after its BEGIN held a bsp job for CKPT_HOLD_MS. */
    if ((dropped || asker) && co->hold_users == 0 && co->hold_asker == NULL &&
        (co->hold_ms || co->hold_ahead)) {
        PS_LOG(PS_LOG_WARN, "coord", "checkpoint hold%s: the psctl that asked for it is gone "
               "(its connection closed): releasing it", co->hold_ahead ? " ahead" : "");
        psd_coord_ckpt_release(srv);
    }
}

