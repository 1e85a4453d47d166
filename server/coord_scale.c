/* coord_scale.c: psctl scale (the desired count of workers) and pslaunch's launch reports
 * (how many workers each launcher starts or stops). */
#include <stdio.h>
#include <string.h>

#include "coord_internal.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"

void psd_coord_on_scale(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg)
{
    psd_coord_t *co = srv->coord;
    if (msg->workers > PS_MAX_RANKS) {
        psd_send_error(srv, c, msg->req_id, PS_EINVAL, "cannot scale to %u workers (at most %d)",
                       msg->workers, PS_MAX_RANKS);
        return;
    }
    PS_LOG(PS_LOG_INFO, "coord", "desired workers %u -> %u", co->s.desired, msg->workers);
    co->s.desired = msg->workers;
    psd__coord_save(srv);
    /* Starts granted and not joined yet are workers on their way: still counted (zeroed, a
     * scale from 2 to 3 while 2 were starting had 3 more started). So are stops granted whose
     * workers did not leave yet: zeroed before, a second scale-down while the first one's
     * workers were still leaving had them stopped again from the others (a review, session
     * 72: 4 workers scaled to 2, twice a second apart, went to 0 and were started again). */
    ps_msg_t a = {.type = PS_MSG_SCALE_REPLY, .req_id = msg->req_id, .shard = 0,
                  .workers = popcount(co->s.active),
                  .flags = co->s.finished ? PS_FLAG_FINISHED
                           : co->capped   ? PS_FLAG_DONE
                                          : 0};
    psd_send_msg(srv, c, &a);
    if (is_bsp(srv)) psd__maybe_restart_step(srv);
}

/* A launcher reports its running workers; the answer says how many to start (> 0) or to
 * stop (< 0). Grants are counted until the workers join or leave, so several launchers
 * asking at once share the difference instead of each filling it. */
/* A launcher heard from within GRANT_TTL_MS (a slot in use). */
static bool launcher_fresh(const launcher_t *x, uint64_t now)
{
    return x->pid != 0 && now - x->last_ms <= GRANT_TTL_MS;
}

/* A fresh launcher whose reports still come: heard from within three of its polls and a second
 * (one that names no poll, an older pslaunch: fresh). One killed right after a grant held
 * grants_seen back for GRANT_TTL_MS before: the job waited ~15 s with no worker while a
 * pslaunch started in its place (as systemd or Kubernetes restart one) was granted none. */
static bool launcher_live(const launcher_t *x, uint64_t now)
{
    return launcher_fresh(x, now) &&
           (x->poll_ms == 0 || now - x->last_ms <= 3ull * x->poll_ms + 1000);
}

/* Starts granted whose workers died before they joined. Once every launcher heard from has
 * reported after the last grant (pslaunch starts its workers on the answer, so each count
 * holds them), the grants still on their way are at most the workers the launchers run that
 * are not members yet (the members whose hello named one of them: PS_LAUNCHER). Before, such a
 * grant counted until GRANT_TTL_MS: with the started workers dead, the job waited ~15 s with
 * none. And before session 58 the members counted were those on a launcher's host: one that
 * no live launcher ran (a worker started by hand, or the workers of a pslaunch stopped for
 * over GRANT_TTL_MS) cut the count, and workers still starting were started again, over the
 * desired number (a helper's probe). */
static void grants_seen(psd_server_t *srv, uint64_t now)
{
    psd_coord_t *co = srv->coord;
    if (co->grant_start <= 0) return;
    int32_t running = 0, here = 0;
    bool any = false;
    for (int i = 0; i < MAX_LAUNCHERS; i++) {
        const launcher_t *x = &co->launchers[i];
        if (!launcher_live(x, now)) continue;
        if (x->last_ms <= co->grant_ms) return; /* it may not have started them yet */
        any = true;
        running += (int32_t)x->running;
    }
    if (!any) return;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++) {
        if (!(co->s.active >> r & 1) || co->rt[r].launcher == 0) continue;
        for (int i = 0; i < MAX_LAUNCHERS; i++) {
            const launcher_t *x = &co->launchers[i];
            if (launcher_live(x, now) && x->pid == co->rt[r].launcher &&
                strcmp(x->host, co->s.m[r].host) == 0) {
                here++;
                break;
            }
        }
    }
    int32_t pending = running > here ? running - here : 0;
    if (co->grant_start > pending) {
        PS_LOG(PS_LOG_INFO, "coord", "%d worker(s) started for the job never joined (the "
               "launchers run %d, %d of them members): no longer counted",
               co->grant_start - pending, running, here);
        co->grant_start = pending;
    }
}

/* Stops granted that no member's leave will match: pslaunch stops its newest workers, and one
 * still starting (not a member yet) ends without a leave, so its grant counted as a stop on its
 * way until GRANT_TTL_MS, and the job stayed over the desired count that long (a scale-down
 * during a scale-up: 3 members and a fourth starting, scaled to 2, kept 3 for ~15 s). Once
 * every live launcher reported after the last grant, each saying its stops (PS_FLAG_REPORT),
 * a stop still on its way is a worker a launcher says it stops, or a member whose connection
 * closed and that is not removed yet (one that ended without its leave): at most @p said plus
 * those. A stopped member's leave is answered before it exits (libps waits for the reply), so
 * its launcher cannot report it ended before shard 0 removed it. */
static void stops_seen(psd_server_t *srv, uint64_t now, int32_t said)
{
    psd_coord_t *co = srv->coord;
    if (co->grant_stop <= 0) return;
    bool any = false;
    for (int i = 0; i < MAX_LAUNCHERS; i++) {
        const launcher_t *x = &co->launchers[i];
        if (!launcher_live(x, now)) continue;
        if (!x->says_stops || x->last_ms <= co->grant_ms) return;
        any = true;
    }
    if (!any) return;
    int32_t lost = 0;
    for (uint32_t r = 0; r < PS_MAX_RANKS; r++)
        lost += (co->s.active >> r & 1) && co->rt[r].conn == NULL;
    if (co->grant_stop > said + lost) {
        PS_LOG(PS_LOG_INFO, "coord", "%d stop(s) granted matched no leave (a worker stopped "
               "before it joined; the launchers stop %d, %d member(s) gone without a leave): "
               "members stopped in their place", co->grant_stop - said - lost, said, lost);
        co->grant_stop = said + lost;
    }
}

void psd_coord_on_launch(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg)
{
    psd_coord_t *co = srv->coord;
    uint64_t now = uv_now(srv->loop);
    if (msg->workers > PS_LAUNCH_MAX) {
        /* Summed as signed counts below: 0xffffffff was -1, and answered a scale-down with a
         * start (a helper's probe, session 59). */
        psd_send_error(srv, c, msg->req_id, PS_EINVAL, "a launcher that runs %u workers: at "
                       "most %d run at once", msg->workers, PS_LAUNCH_MAX);
        return;
    }
    if (msg->count > PS_LAUNCH_MAX) {
        psd_send_error(srv, c, msg->req_id, PS_EINVAL, "a launcher that stops %llu workers: at "
                       "most %d run at once", (unsigned long long)msg->count, PS_LAUNCH_MAX);
        return;
    }
    launcher_t *l = NULL, *free_l = NULL;
    char host[sizeof l->host];
    psd__host_safe(host, sizeof host, msg->host);
    for (int i = 0; i < MAX_LAUNCHERS; i++) {
        launcher_t *x = &co->launchers[i];
        if (x->pid == msg->pid && strcmp(x->host, host) == 0) l = x;
        if (free_l == NULL && !launcher_fresh(x, now)) free_l = x;
    }
    int32_t actual = (int32_t)popcount(co->s.active), want = (int32_t)co->s.desired, delta = 0;
    if (msg->flags & PS_FLAG_DONE) {
        /* It exits: its slot no longer holds the grants of the others back (grants_seen), and
         * it is granted nothing (also without a slot: every one taken by fresher launchers). */
        PS_LOG(PS_LOG_INFO, "coord", "launcher pid %u on %s exits", msg->pid, host);
        if (l) memset(l, 0, sizeof *l);
        goto reply;
    }
    if (l == NULL && (l = free_l) != NULL) {
        memset(l, 0, sizeof *l);
        snprintf(l->host, sizeof l->host, "%s", host);
        l->pid = msg->pid;
    }
    if (l) {
        l->running = msg->workers;
        l->stopping = (uint32_t)msg->count;
        l->poll_ms = msg->poll_ms;
        l->says_stops = (msg->flags & PS_FLAG_REPORT) != 0;
        l->last_ms = now;
    }
    grants_seen(srv, now);
    /* Right after this shard started, the grants it made before are forgotten, but the
     * workers the launchers run (members and ones still starting) are on their way: counted.
     * Not later: a hung worker dropped as silent still runs, and must be replaced. Only a
     * launcher still reporting: one that exited or died (its workers with it) counted for
     * GRANT_TTL_MS, and the job sat with no worker for up to 15 s (a probe, session 46).
     * Stops on their way: those granted and not matched by a leave yet, or more where the live
     * launchers say they stop more (a worker that takes longer than GRANT_TTL_MS to leave:
     * its grant lapsed, and another was stopped in its place before). */
    int32_t running = 0, have = actual + co->grant_start, said = 0;
    for (int i = 0; i < MAX_LAUNCHERS; i++)
        if (launcher_live(&co->launchers[i], now)) {
            running += (int32_t)co->launchers[i].running;
            said += (int32_t)co->launchers[i].stopping;
        }
    stops_seen(srv, now, said);
    if (now - co->started_ms <= GRANT_TTL_MS && running > have) have = running;
    int32_t stops = said > co->grant_stop ? said : co->grant_stop;
    if (!co->s.finished && !co->capped) {
        if (want > have) {
            delta = want - have;
            co->grant_start += delta;
            co->grant_ms = now;
        } else if (want < actual - stops && msg->workers > 0) {
            delta = actual - stops - want;
            if (delta > (int32_t)msg->workers) delta = (int32_t)msg->workers;
            co->grant_stop += delta;
            co->grant_ms = now;
            delta = -delta;
        }
    }
reply:;
    ps_msg_t a = {.type = PS_MSG_LAUNCH_REPLY, .req_id = msg->req_id, .shard = 0,
                  .status = delta, .workers = co->s.desired, .count = (uint64_t)actual,
                  .flags = co->s.finished ? PS_FLAG_FINISHED : 0};
    psd_send_msg(srv, c, &a);
}

