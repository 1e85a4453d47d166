/* forget.c: dropping a tensor that no push ever reached (PS_MSG_FORGET).
 *
 * Under bsp each chunk's step waits for every member's push, and a shard's step is its lowest
 * chunk's. A tensor that the job's members do not declare (one of another model, declared at
 * step 0 by a worker the coordinator then refused) stays at step 0 for good: the shards' step
 * reads 0 and no checkpoint of the job completes. Two ways out:
 *
 * - A member gives up the tensors it declared (libps, when shard 0 refused its first batch
 *   request): shard 0 would drop one that no other rank declared since psd started (none, for
 *   a tensor loaded from the store) and that no push reached. A tensor another rank declared
 *   is kept (answered without PS_FLAG_DONE).
 * - An operator drops one by name (psctl forget, PS_FLAG_FORCE), which a crash between a
 *   declaration and its refusal leaves: shard 0 only under bsp once step 1 closed (every
 *   member then pushed each chunk of its tensors, so one no push reached is in no member's
 *   model), or under asp / ssp while the job has no member; never one a push reached.
 *
 * Either way shard 0 is asked first whether it would (PS_FLAG_CHECK: nothing dropped), then
 * each other shard drops its chunks unless a push reached them, and shard 0 drops the tensor
 * last: a shard that refuses (its chunk took pushes) stops it with shard 0's declaration
 * kept, and a tensor whose chunks another shard dropped is created there again by the next
 * declaration (its values were the initial ones). A dropped tensor's id and chunk ordinals are
 * not handed out again while psd runs (another shard may still hold the tensor).
 *
 * Between shard 0's check and its drop, shard 0 holds the tensor for the asker (FORGET_HOLD_MS
 * at most; until its connection closes or it is refused): another's declaration of it is
 * refused with PS_EBUSY (libps asks again; once dropped it creates the tensor anew on every
 * shard), and the asker's drop is not checked against the job's members again. Before (session
 * 63), a worker that declared it in that window kept it on shard 0 while the other shards
 * dropped their chunks (its pushes there: "no tensor"), and a worker that joined then made
 * shard 0 refuse the drop the other shards had made.
 */
#include <string.h>

#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "server.h"

/* How long shard 0 holds a tensor for the forget whose check passed (psctl asks each shard
 * in turn at once; a slower one lets the hold lapse: then as before session 63). */
#define FORGET_HOLD_MS 5000

bool psd_forget_held(const psd_tensor_t *t, const psd_conn_t *conn)
{
    return t->forget_holder && t->forget_holder != conn && psd_now_ms() < t->forget_hold_until;
}

/* Answer @p msg for tensor @p id: @p flags PS_FLAG_DONE (it would be dropped: a check), or 0
 * (kept; @p others: the ranks that declared it besides the asker). */
static void reply(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg, uint32_t id,
                  uint32_t flags, uint64_t others)
{
    psd_send_msg(srv, conn, &(ps_msg_t){.type = PS_MSG_FORGET_REPLY, .req_id = msg->req_id,
                                         .shard = srv->shard, .tensor = id, .flags = flags,
                                         .members = others});
}

/* Shard 0, PS_FLAG_FORCE: whether the job's state lets an operator drop a tensor no push
 * reached; if not, the reason in @p why. */
static bool force_allowed(psd_server_t *srv, char *why, size_t len)
{
    if (srv->m.job.consistency == PS_CONSIST_BSP) {
        uint64_t step = psd_coord_bsp_step(srv);
        if (step >= 2) return true;
        snprintf(why, len, "the bsp job is at step %llu: a tensor its members do not push is "
                 "told from one not pushed yet only once step 1 closed", (unsigned long long)step);
        return false;
    }
    uint32_t n = psd_coord_members(srv);
    if (n == 0) return true;
    snprintf(why, len, "the %s job has %u member%s: a tensor none pushed yet may be one they "
             "use; stop its workers first", ps_consistency_name(srv->m.job.consistency), n,
             n == 1 ? "" : "s");
    return false;
}

void psd_forget_on_msg(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    if (srv->stopping) return; /* the endpoint closes next; the peer sees that */
    bool force = (msg->flags & PS_FLAG_FORCE) != 0, check = (msg->flags & PS_FLAG_CHECK) != 0;
    bool trained = force && (msg->flags & PS_FLAG_TRAINED) != 0;
    char why[256];
    if (force && psd_refuse_other_cluster(srv, conn, msg, false)) return;
    if (!force && (conn->rank < 0 || conn->rank >= PS_MAX_RANKS)) {
        psd_send_error(srv, conn, msg->req_id, PS_EPROTO, "forget without PS_FLAG_FORCE comes "
                       "from a member giving up its declarations, and this connection holds no "
                       "rank");
        return;
    }
    psd_tensor_t *t = NULL;
    if (msg->error[0])
        t = psd_shard_tensor_named(srv, msg->error);
    else if (msg->tensor < srv->ntensors && srv->tensors[msg->tensor].present)
        t = &srv->tensors[msg->tensor];
    if (t == NULL) {
        if (msg->error[0])
            psd_send_error(srv, conn, msg->req_id, PS_ENOENT, "shard %u holds no tensor '%.200s'",
                           srv->shard, msg->error);
        else
            psd_send_error(srv, conn, msg->req_id, PS_ENOENT, "shard %u holds no tensor %u",
                           srv->shard, msg->tensor);
        return;
    }
    uint32_t id = (uint32_t)(t - srv->tensors);
    /* The asker's own hold: this is its drop (or another check); whatever comes of it, the
     * hold ends with it. Its check vetted the job's state, and nobody declared since. */
    bool holder = t->forget_holder == conn && psd_now_ms() < t->forget_hold_until;
    if (t->forget_holder == conn) t->forget_holder = NULL;
    if (psd_forget_held(t, conn)) {
        psd_send_error(srv, conn, msg->req_id, PS_EBUSY, "tensor '%s' is being dropped by "
                       "another forget: try again in a moment", t->decl.name);
        return;
    }
    if (!t->ready && !t->dropping) {
        psd_send_error(srv, conn, msg->req_id, PS_EBUSY, "tensor '%s' is still being created on "
                       "shard %u", t->decl.name, srv->shard);
        return;
    }
    if (srv->shard == 0 && !force) {
        uint64_t me = 1ull << conn->rank;
        if (!(t->declared_ranks & me) || (t->declared_ranks & ~me)) {
            /* Not this rank's since psd started (nothing to give up), or another's too. */
            PS_LOG(PS_LOG_INFO, "forget", "rank %d gives up tensor %u '%s': kept (declared by "
                   "ranks %#llx)", conn->rank, id, t->decl.name,
                   (unsigned long long)t->declared_ranks);
            if (!check) t->declared_ranks &= ~me;
            reply(srv, conn, msg, id, 0, t->declared_ranks & ~me);
            return;
        }
        if (!check) t->declared_ranks &= ~me;
    }
    if (srv->shard == 0 && trained && !(holder && !check) && psd_coord_members(srv) != 0) {
        uint32_t n = psd_coord_members(srv);
        psd_send_error(srv, conn, msg->req_id, PS_ECONFLICT, "tensor '%s' not dropped: the job "
                       "has %u member%s, whose steps may wait for it: stop its workers first "
                       "(psctl scale 0, and pslaunch's), then forget it", t->decl.name, n,
                       n == 1 ? "" : "s");
        return;
    }
    if (srv->shard == 0 && force && !trained && !(holder && !check) &&
        !force_allowed(srv, why, sizeof why)) {
        psd_send_error(srv, conn, msg->req_id, PS_ECONFLICT, "tensor '%s' not dropped: %s",
                       t->decl.name, why);
        return;
    }
    /* --trained: a push reached it, and its values go; not while pushes or pulls of it are
     * under way (none come with no member, but their replies may be in flight). */
    if (!t->dropping && (trained ? psd_shard_tensor_busy(srv, t, why, sizeof why)
                                 : psd_shard_tensor_used(srv, t, why, sizeof why))) {
        PS_LOG(PS_LOG_INFO, "forget", "tensor %u '%s' kept: %s", id, t->decl.name, why);
        if (force)
            psd_send_error(srv, conn, msg->req_id, PS_ECONFLICT, "tensor '%s' not dropped: %s%s",
                           t->decl.name, why, trained ? "; try again"
                           : " (psctl forget --trained drops a trained tensor, its values lost, "
                             "while the job has no member)");
        else
            reply(srv, conn, msg, id, 0, 0);
        return;
    }
    if (check) { /* it would be dropped here */
        if (srv->shard == 0) { /* held for the asker until its drop here */
            t->forget_holder = conn;
            t->forget_hold_until = psd_now_ms() + FORGET_HOLD_MS;
        }
        reply(srv, conn, msg, id, PS_FLAG_DONE, 0);
        return;
    }
    if (trained) t->dropping_trained = true;
    if (psd_shard_drop(srv, id, conn, msg->req_id)) {
        psd_send_error(srv, conn, msg->req_id, PS_ENOMEM, "out of memory");
        return;
    }
    PS_LOG(PS_LOG_INFO, "forget", "tensor %u '%s' to be dropped (%s)", id, t->decl.name,
           trained ? "psctl forget --trained: its trained values go"
           : force ? "psctl forget" : "its only declarer gave it up");
}
