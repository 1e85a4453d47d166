/* shardloss.c: libps's comm thread losing and regaining a shard: parts kept or failed when a
 * shard goes, reconnects with capped backoff, re-hellos and what their replies say of the
 * shard's store, heartbeats, shards that fall silent, transport restarts, and the membership
 * views forwarded between shards (client_internal.h). */
#include "client_internal.h"

/* ---- comm thread: losing and regaining a shard ----------------------------------- */

/* Fail (give_up) or keep for resending every pending part on shard i. */
static void parts_on_shard(ps_client_t *c, uint32_t i, int give_up)
{
again:
    for (ps_op_t *op = c->inflight; op; op = op->next) {
        int hit = 0;
        for (uint32_t k = 0; k < op->nparts; k++) {
            part_t *p = &op->parts[k];
            if (!p->pending || p->shard != i) continue;
            hit |= op->type == OP_LEAVE; /* done (ps__part_spared): it may complete the op */
            if (!ps__part_spared(c, p, give_up, c->shards[i].ep_gen)) {
                const cshard_t *s = &c->shards[i];
                if (s->gone && s->gone_why[0]) /* the caller's last line says why */
                    ps__op_fail(op, PS_ETRANSPORT, "shard %u (%s:%u) %s", i, c->m.servers[i].host,
                            c->m.servers[i].port, s->gone_why);
                else
                    ps__op_fail(op, PS_ETRANSPORT, "lost the connection to shard %u (%s:%u)", i,
                            c->m.servers[i].host, c->m.servers[i].port);
                hit = 1;
                break;
            }
        }
        if (!hit) continue;
        /* The op may be gone after this, and its completion may have run others (a re-hello's
         * on_done): the list is walked again from its head. A part handled here is no longer
         * pending (or waits with resend set, without completing anything), so this ends. */
        ps__op_maybe_complete(op);
        goto again;
    }
}

static void on_reconnect_timer(uv_timer_t *h);

/* A leave some shard did not answer within ps__leave_wait_ms (a stopped or hung psd): it ends
 * anyway; that shard drops this worker when the connection closes, or by its heartbeat
 * timeout. Its endpoint is closed now (on_deferred), so that a send UCX still holds (a full
 * socket towards a stopped process) completes, canceled, and cannot hold the op. */
void ps__on_leave_timer(uv_timer_t *h)
{
    ps_client_t *c = h->data;
again:
    for (ps_op_t *op = c->inflight; op; op = op->next) {
        if (op->type != OP_LEAVE || op->remaining == 0) continue;
        for (uint32_t i = 0; i < op->nparts; i++)
            if (op->parts[i].pending) {
                uint32_t s = op->parts[i].shard;
                PS_LOG(PS_LOG_WARN, "libps", "shard %u (%s:%u) did not answer the leave in %u ms",
                       s, c->m.servers[s].host, c->m.servers[s].port, ps__leave_wait_ms(c));
                ps__part_done(&op->parts[i]);
                if (c->shards[s].ep && !c->shards[s].dead)
                    c->shards[s].dead = c->shards[s].close_queued = 1;
            }
        ps__op_maybe_complete(op); /* the op may be gone after this */
        goto again;
    }
}

/* A view message on its way (ps__forward_msg): its header, which UCX reads until the send
 * completes, on c->forwards until then, so that a transport restart or the comm thread's end,
 * after which no completion comes, frees what is left (ps__forwards_free). */
typedef struct fwd_s {
    ps_client_t *c;
    struct fwd_s *prev, *next;
    uint8_t hdr[128];
} fwd_t;

static void fwd_unlink(fwd_t *f)
{
    if (f->prev) f->prev->next = f->next;
    else f->c->forwards = f->next;
    if (f->next) f->next->prev = f->prev;
}

static void on_forward_sent(void *request, ucs_status_t status, void *user_data)
{
    fwd_t *f = user_data;
    fwd_unlink(f);
    free(f);
    if (request) ucp_request_free(request);
}

/* Free the headers of view messages whose sends will never complete: call only once the UCX
 * worker that held them is gone (transport_restart, the comm thread's end). */
void ps__forwards_free(ps_client_t *c)
{
    while (c->forwards) {
        fwd_t *f = c->forwards;
        fwd_unlink(f);
        free(f);
    }
}

/* Tell shard i the membership this worker knows (MSG_EPOCH, fire and forget). */

static void forward_view(ps_client_t *c, uint32_t i)
{
    const ps_view_t *v = ps_views_newest(&c->views);
    if (v == NULL) return;
    ps_msg_t m = {.type = PS_MSG_EPOCH, .epoch = v->epoch, .step = v->from,
                  .members = v->members, .rank = rank_now(c)};
    ps__forward_msg(c, i, &m);
}

/* Send header @p hdr (@p len bytes; kept until @p cb runs) to shard @p s on the control AM id;
 * @p cb (with @p arg) runs at the send's completion, only when the send was left in flight.
 * @return whether it was. */
static bool ctrl_send(cshard_t *s, const void *hdr, size_t len, ucp_send_nbx_callback_t cb,
                      void *arg)
{
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                               UCP_OP_ATTR_FIELD_USER_DATA |
                                               UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_AM_SEND_FLAG_REPLY, .cb.send = cb, .user_data = arg};
    void *req = ucp_am_send_nbx(s->ep, PS_AM_CTRL, hdr, len, NULL, 0, &prm);
    return req != NULL && !UCS_PTR_IS_ERR(req);
}

/* Send view message @p view to shard @p i (when it is connected). */
void ps__forward_msg(ps_client_t *c, uint32_t i, const ps_msg_t *view)
{
    cshard_t *s = &c->shards[i];
    if (s->ep == NULL || s->dead || s->down) return;
    fwd_t *f = malloc(sizeof *f);
    size_t len;
    if (f == NULL ||
        ps_msg_encode_sealed(view, s->tok.b, s->tok.len, f->hdr, sizeof f->hdr, &len)) {
        free(f);
        return;
    }
    if (!ctrl_send(s, f->hdr, len, on_forward_sent, f)) {
        free(f);
        return;
    }
    /* In flight (its completion comes from a later progress call, never from this one): */
    f->c = c;
    f->prev = NULL;
    f->next = c->forwards;
    if (c->forwards) c->forwards->prev = f;
    c->forwards = f;
}

/* Adopt a newer membership (from a batch reply or MSG_EPOCH); @p forward: tell the others. */
void ps__learn_view(ps_client_t *c, uint64_t epoch, uint64_t from, uint64_t members, int forward)
{
    if (!ps_views_learn(&c->views, epoch, from, members)) return;
    if (forward)
        for (uint32_t i = 1; i < c->nshards; i++) forward_view(c, i);
}

/* The coordinator no longer counts this worker as a member: fail everything now, and
 * every later operation, with PS_ENOTMEMBER (the caller joins again with a new client). */
void ps__mark_removed(ps_client_t *c)
{
    if (c->removed) return;
    c->removed = 1;
    PS_LOG(PS_LOG_WARN, "libps", "rank %d was removed from the job", rank_now(c));
    for (ps_op_t *op = c->inflight, *nx; op; op = nx) {
        nx = op->next;
        if (op->on_done) continue;
        ps__op_fail(op, PS_ENOTMEMBER, "this worker (rank %d) was removed from the job",
                    rank_now(c));
        ps__op_maybe_complete(op);
    }
}

/* What a hello reply's run says of a store's history, into @p buf: "restored from checkpoint
 * ID at step N" (ID as psd --restore recorded it: meta.json's "checkpoint"; for a checkpoint
 * without one, its step + 1 with bit 63 set), or "never restored". */
void ps__run_said(char *buf, size_t len, uint64_t origin, uint64_t base)
{
    if (origin == 0)
        snprintf(buf, len, "never restored");
    else
        snprintf(buf, len, "restored from checkpoint %016llx at step %llu",
                 (unsigned long long)origin, (unsigned long long)base);
}

void ps__on_rehello(ps_op_t *op)
{
    ps_client_t *c = op->c;
    uint32_t i = op->parts[0].shard;
    cshard_t *s = &c->shards[i];
    if (op->status == PS_ENOTMEMBER) {
        PS_LOG(PS_LOG_WARN, "libps", "%s", op->err); /* "shard N: ..." (client.c's on_am) */
        ps__mark_removed(c);
        if (c->leaving) parts_on_shard(c, i, 1); /* a leave waiting for this hello: not a member */
        return;
    }
    if (op->status == 0 && (op->reply.flags & PS_FLAG_TENSORS) && op->reply.count == 0 &&
        (__atomic_load_n(&c->had_batch, __ATOMIC_ACQUIRE) ||
         (c->join_tensors > 0 && c->join_step > 0))) {
        /* It came back with an empty table after this worker trained, or joined a job past
         * step 0 with tensors: its store was lost (an empty or another data_dir). Its pushes would
         * fail with "no tensor with id", and a worker joining next would make it create the tensors
         * again from their initial values (found by a probe, session 40). */
        op->status = PS_ECONFIG;
        snprintf(op->err, sizeof op->err, "it came back without the model (no tensors) after "
                 "this worker trained: its " STORE_LOST);
    }
    uint64_t run = __atomic_load_n(&s->run, __ATOMIC_RELAXED);
    if (op->status == 0 && (op->reply.flags & PS_FLAG_RUN) && run != 0 && op->reply.run != run) {
        /* Its store is another than at the join: restored from a checkpoint (or replaced) while
         * this worker trained. Its steps went back to the checkpoint's; under asp the updates
         * since then were lost while counted as applied (a probe, session 40). */
        char was[96];
        ps__run_said(was, sizeof was, op->reply.run_origin, op->reply.run_base);
        op->status = PS_ECONFIG;
        snprintf(op->err, sizeof op->err, "it came back as another store (%.72s) than this "
                 "worker joined: " STORE_REMEDY, was);
    }
    if (op->status == 0 && (op->reply.flags & PS_FLAG_RUN) && run == 0)
        __atomic_store_n(&s->run, op->reply.run, __ATOMIC_RELAXED); /* the join's psd said none */
    uint64_t seen = __atomic_load_n(&s->seen_max, __ATOMIC_RELAXED);
    if (op->status == 0 && (op->reply.flags & PS_FLAG_STEPMAX) && op->reply.step_max < seen) {
        /* The same store (its run), but every chunk below a version it told this worker of
         * before, committed before it said so: its data_dir went back to an older copy of
         * itself (a VM snapshot, a backup put back). Under asp the updates since were lost
         * while counted applied, and its shard 0 handed applied batches out again; under bsp
         * the workers failed naming only the versions (a probe, session 67). */
        op->status = PS_ECONFIG;
        snprintf(op->err, sizeof op->err, "it came back at step %llu after it had told this "
                 "worker of step %llu: its data_dir went back to an older copy of itself (a "
                 "snapshot or a backup, or its host crashed since the store's last sync), and "
                 "the updates since are lost; " STORE_REMEDY,
                 (unsigned long long)op->reply.step_max, (unsigned long long)seen);
    }
    if (op->status == PS_EAUTH) {
        /* Its proof refused: a clock more than PS_AUTH_SKEW_S off (a shard restarted before its
         * host's clock synced) or the shard's replay guard pass in time, so it is asked again
         * as a shard that does not answer, until the reconnect timeout, which then names this
         * reason. Before (session 72's review), the worker was refused back for good (psworker
         * exit 2, which pslaunch does not replace) with advice to restore the shards. Another
         * secret stays refused: a worker started again then fails at its join, exit 2. */
        if (strncmp(s->refused_why, op->err, 250) != 0)
            PS_LOG(PS_LOG_WARN, "libps", "shard %u refused this worker's proof as it came back "
                   "(asking again until the reconnect timeout): %s", i, op->err);
        snprintf(s->refused_why, sizeof s->refused_why, "%.250s", op->err);
    } else if (op->status == PS_ECONFIG) {
        /* The shard came back under another configuration (a restore onto another manifest):
         * this worker's manifest no longer fits it, and asking again cannot change that. */
        PS_LOG(PS_LOG_ERROR, "libps", "shard %u refused this worker back: %s", i, op->err);
        snprintf(s->gone_why, sizeof s->gone_why, "refused this worker back: %.450s", op->err);
        s->gone = 1;
        __atomic_store_n(&c->refused_back, 1, __ATOMIC_RELAXED);
        if (s->ep && !s->dead) s->dead = s->close_queued = 1;
        parts_on_shard(c, i, 1);
        return;
    }
    if (op->status == 0 && op->reply.rank != rank_now(c)) {
        PS_LOG(PS_LOG_ERROR, "libps", "shard %u gave rank %d back, not %d", i, op->reply.rank,
               rank_now(c));
        s->gone = 1;
        op->status = PS_EPROTO;
    }
    if (op->status == 0) {
        s->refused_why[0] = '\0';
        PS_LOG(PS_LOG_INFO, "libps", "shard %u (%s:%u) is back after %llu ms", i,
               c->m.servers[i].host, c->m.servers[i].port,
               (unsigned long long)(now_ms() - s->down_since_ms));
        s->down = 0;
        s->silent = 0;
        if (i > 0) forward_view(c, i); /* a restarted shard learns the step's members */
        else if (op->reply.members) /* the coordinator's current membership, missed while away */
            ps__learn_view(c, op->reply.epoch, op->reply.step, op->reply.members, 1);
        /* Send again whatever it had not answered: a push it already applied is acked
         * and dropped, so every step is applied exactly once. */
        for (ps_op_t *o = c->inflight, *nx; o; o = nx) {
            nx = o->next;
            int sent = 0;
            for (uint32_t k = 0; k < o->nparts; k++)
                if (o->parts[k].resend && o->parts[k].shard == i && o->parts[k].pending) {
                    part_t *p = &o->parts[k];
                    p->resend = 0;
                    PS_LOG(PS_LOG_DEBUG, "libps", "shard %u: sends again part %u of op type %d "
                           "(step %llu)", i, k, o->type, (unsigned long long)o->step);
                    if (p->ck.sending || p->ck.receiving) {
                        /* The old connection's send still holds its header, or its reply
                         * still lands in the part's buffer: the part goes once that request
                         * ends (part_sent; on_pull_recv's failure, part_defer), not now. */
                        p->ck.again = 1;
                        continue;
                    }
                    ps__part_send_again(c, o, p);
                    sent = 1;
                }
            if (sent) ps__op_maybe_complete(o); /* a resend that failed at once may finish it */
        }
        return;
    }
    /* Refused or unreachable: close this endpoint (from the deferred hook, never from
     * inside a UCX callback); ps__shard_lost then schedules the next attempt. Without an
     * endpoint (the address did not resolve), schedule it here. */
    if (s->ep && !s->dead) {
        s->dead = 1;
        s->close_queued = 1;
    } else if (s->ep == NULL) {
        ps__shard_lost(c, i);
    }
}

/* What a hello says of this worker's manifest (PS_FLAG_CONF), for shard @p i to check. */
void ps__hello_conf(const ps_client_t *c, ps_msg_t *m, uint32_t i)
{
    m->flags |= PS_FLAG_CONF;
    m->length = c->m.chunk_bytes;
    m->consistency = (uint32_t)c->m.job.consistency;
    m->shard = i;
    m->count = c->nshards;
}

static void on_reconnect_timer(uv_timer_t *h)
{
    cshard_t *s = h->data;
    ps_client_t *c = s->c;
    ps_op_t *op = calloc(1, sizeof *op + sizeof(part_t));
    if (op == NULL) {
        uv_timer_start(&s->timer, on_reconnect_timer, 1000, 0); /* try again later */
        return;
    }
    op->c = c;
    op->type = OP_HELLO;
    op->req_id = __atomic_add_fetch(&c->next_req, 1, __ATOMIC_RELAXED);
    op->nparts = op->remaining = 1;
    op->min_version = UINT64_MAX;
    op->on_done = ps__on_rehello;
    op->submit_ns = mono_ns(); /* hello_overdue: unanswered for hello_deadline_ms */
    op->parts[0] = (part_t){.op = op, .shard = s->index, .pending = 1};
    op->req = (ps_msg_t){.type = PS_MSG_HELLO, .rank = rank_now(c), .pid = (uint32_t)getpid(),
                         .samples = c->join_serial, .store_id = ps_storeview_host_id(),
                         .launcher = c->launcher};
    ps__hello_conf(c, &op->req, s->index);
    snprintf(op->req.cluster, sizeof op->req.cluster, "%s", c->m.cluster);
    op->req.req_id = op->req_id;
    ps__start_op(c, op);
    ps_ucx_progress(&c->ucx);
}

static void shard_lost_now(ps_client_t *c, uint32_t i);

/* Shard i's endpoint is gone. Before the join that is an error; after it, pushes and
 * pulls wait while the client reconnects with capped backoff (50 ms doubling to 1 s)
 * until the connect timeout, then they fail. */
void ps__shard_lost(ps_client_t *c, uint32_t i)
{
    cshard_t *s = &c->shards[i];
    s->dead = 0;
    if (s->losing) return; /* a re-hello failed by the parts_on_shard below: handled there */
    s->losing = 1;
    shard_lost_now(c, i);
    s->losing = 0;
}

static void shard_lost_now(ps_client_t *c, uint32_t i)
{
    cshard_t *s = &c->shards[i];
    /* Leaving: no reconnect, whose hello would take the rank back at shard 0 just before the
     * connection closes for good. */
    if (!__atomic_load_n(&c->joined, __ATOMIC_ACQUIRE) || s->gone || c->leaving) {
        parts_on_shard(c, i, 1);
        return;
    }
    if (!s->down) {
        PS_LOG(PS_LOG_WARN, "libps", "lost shard %u (%s:%u); reconnecting", i,
               c->m.servers[i].host, c->m.servers[i].port);
        s->down = 1;
        s->down_since_ms = now_ms();
        s->backoff_ms = 50;
    } else if (now_ms() - s->down_since_ms >= c->reconnect_ms) {
        /* Checked as an attempt fails, so the time said is the time it took (a little more
         * than the timeout: an attempt's hello waits up to hello_deadline_ms). */
        /* Its parts fail saying so too: a program sees it in its error, not only in the log
         * (psd.torch's PsError said "lost the connection to shard 1"; a helper's probe). */
        snprintf(s->gone_why, sizeof s->gone_why, "did not come back in %llu ms (the reconnect "
                 "timeout is %u ms)%s%.300s", (unsigned long long)(now_ms() - s->down_since_ms),
                 c->reconnect_ms, s->refused_why[0] ? "; it refused this worker's proof: " : "",
                 s->refused_why);
        PS_LOG(PS_LOG_ERROR, "libps", "shard %u (%s:%u) %s", i, c->m.servers[i].host,
               c->m.servers[i].port, s->gone_why);
        s->gone = 1;
        parts_on_shard(c, i, 1);
        return;
    } else {
        s->backoff_ms = s->backoff_ms * 2 > 1000 ? 1000 : s->backoff_ms * 2;
    }
    uv_timer_start(&s->timer, on_reconnect_timer, s->backoff_ms, 0);
    parts_on_shard(c, i, 0);
}

/* Start this worker's transport again (ps_ucx_restart) and reconnect every shard: what was
 * pending on any of them waits and is sent again, as after a lost shard. For a worker whose
 * UCX was left wedged by a shard killed mid-send (see hello_overdue). */
static void transport_restart(ps_client_t *c)
{
    for (uint32_t i = 0; i < c->nshards; i++) /* their requests complete now, canceled */
        ps_ucx_ep_close(&c->ucx, &c->shards[i].ep, 1);
    /* The reconnects' hellos went out on the old endpoints: each fails, and its ps__on_rehello
     * (no endpoint now) schedules the next attempt. Completing one may complete others: the
     * walk starts again from the head each time. */
again:
    for (ps_op_t *op = c->inflight; op; op = op->next)
        if (op->type == OP_HELLO && op->on_done && op->parts[0].pending) {
            ps__op_fail(op, PS_ETIMEDOUT, "the transport was started again");
            ps__op_maybe_complete(op);
            goto again;
        }
    int rc = ps_ucx_restart(&c->ucx);
    /* No callback of the old worker comes any more: what its requests still held (a send a
     * close did not finish, a rendezvous receive, a bundle in flight) is released here;
     * ps__shard_lost below marks every part still waiting to be sent again once its shard is
     * back. */
    while (c->flying) {
        bundle_t *b = c->flying;
        ps__bundle_fly(c, b, 0);
        b->count = 0;
        b->len = 0;
        b->next_free = c->free_bundles;
        c->free_bundles = b;
    }
    c->copy_head = c->copy_tail = NULL; /* their refs go too; ps__shard_lost resends the parts */
    ps__forwards_free(c);
    for (ps_op_t *op = c->inflight; op; op = op->next) {
        op->ucx_refs = 0;
        op->held_window = 0;
        for (uint32_t k = 0; k < op->nparts; k++) {
            part_t *p = &op->parts[k];
            /* A receive the destroyed worker will not complete: its landing takes no put any
             * more (on_pull_recv's, which will not come; a review: left expected for good). */
            if (p->ck.receiving) ps_tcpguard_done(p->ck.landing);
            p->ck.sending = p->ck.receiving = p->ck.again = 0;
            p->held = 0;
        }
    }
    for (uint32_t i = 0; i < c->nshards; i++) {
        cshard_t *s = &c->shards[i];
        s->open = NULL;
        s->dead = s->close_queued = s->hb_inflight = 0;
        s->backoff_ms = 25; /* a shard already down: its next try in 50 ms */
        if (rc) { /* no transport: everything fails from now on */
            s->gone = 1;
            uv_timer_stop(&s->timer);
        }
        ps__shard_lost(c, i);
    }
    if (rc)
        PS_LOG(PS_LOG_ERROR, "libps", "cannot start the transport again: %s", ps_strerror(rc));
again_done:
    for (ps_op_t *op = c->inflight; op; op = op->next)
        if (op->remaining == 0 && !op->done) {
            ps__op_maybe_complete(op);
            goto again_done;
        }
}

/* Hellos unanswered for hello_deadline_ms. A join's fails and is tried again (below). A
 * reconnect's: a restarted psd answers at once; what was seen instead
 * (faults:psd_crash_coordinator, about 1 run in 150): a shard killed while it was sending to this
 * worker over shared memory left UCX 1.13's transport here wedged (ucp_worker_arm busy for good,
 * and the new shard's answer never came), and after heartbeat_timeout_ms the shard dropped this
 * worker. So the worker's transport starts again (transport_restart), well before that. */
static void hello_overdue(ps_client_t *c)
{
    uint64_t now = mono_ns(), limit = (uint64_t)c->hello_deadline_ms * 1000000u;
again:
    for (ps_op_t *op = c->inflight; op; op = op->next) {
        if (op->type != OP_HELLO || !op->parts[0].pending || now - op->submit_ns < limit)
            continue;
        uint32_t i = op->parts[0].shard;
        const ps_server_conf_t *sc = &c->m.servers[i];
        cshard_t *s = &c->shards[i];
        /* A join's hello fails (join() tries again until its timeout), and so does a
         * reconnect's to a shard lost because it fell silent (shard_silent), or whose name
         * resolved to another address since (the next attempt goes there), while this
         * worker's transport is not stuck: that shard is down or stopped, and ps__on_rehello tries
         * again (a transport restart would reset every other shard's connection each time).
         * Its endpoint is closed, which also ends a send UCX holds for it, so that a shard that
         * took the connection but never answers cannot hold the op for good. */
        if (op->on_done == NULL ||
            ((s->silent || s->moved) && !c->leaving && ps_ucx_stuck_ns(&c->ucx) == 0)) {
            ps__op_fail(op, PS_ETIMEDOUT, "shard %u (%s:%u) did not answer its hello in %u ms", i,
                    sc->host, sc->port, c->hello_deadline_ms);
            if (s->ep && !s->dead) s->dead = s->close_queued = 1;
            ps__op_maybe_complete(op);
            goto again;
        }
        if (c->leaving) continue; /* no reconnect any more (ps__shard_lost) */
        PS_LOG(PS_LOG_WARN, "libps", "shard %u (%s:%u) did not answer the hello of a reconnect "
               "in %u ms: starting this worker's transport again and reconnecting every shard",
               i, sc->host, sc->port, c->hello_deadline_ms);
        transport_restart(c);
        return;
    }
}

/* How long the UCX worker may stay unarmable (ucp_worker_arm busy, nothing progressing) while
 * this client has nothing in flight, before its transport starts again. */
#define UNARMABLE_NS (2000ull * 1000000u)

/* A shard killed and started again several times in a row (a probe, session 45: shard 0 three
 * times 0.5 s apart, 5 runs of 5) can leave UCX 1.13's worker busy for good though everything
 * else works: the loop never sleeps (ucx_loop.c keeps polling it), and four such workers on two
 * CPUs ran every step ~4x slower until the job's end. Nothing in flight, a healthy worker arms
 * at once; busy for UNARMABLE_NS so is the wedge: its transport starts again (as for an
 * overdue hello), which drops what the old UCP worker held. At most once a minute. */
static void unarmable(ps_client_t *c)
{
    uint64_t now = mono_ns(), since = c->ucx.busy_since_ns;
    if (since == 0 || now - since < UNARMABLE_NS) return;
    /* Nothing in flight now, or seen busy while it had nothing in flight within the last 2 s
     * (ucx_loop.c's idle_busy_ns): a worker that always has a step's op out at a tick
     * (psworker's run left one at no tick of a 9 s run, 1 run in 4) is still seen. */
    uint64_t seen = c->ucx.idle_busy_ns;
    if (c->inflight != NULL && (seen == 0 || now - seen >= UNARMABLE_NS)) return;
    if (c->unarmable_restart_ns && now - c->unarmable_restart_ns < 60ull * 1000000000u) return;
    c->unarmable_restart_ns = now;
    PS_LOG(PS_LOG_WARN, "libps", "the UCX worker could not be put to sleep for %.1f s, busy "
           "also with nothing in flight (UCX left busy by a shard that went away): starting this "
           "worker's transport again and reconnecting every shard", (double)(now - since) / 1e9);
    transport_restart(c);
}

/* ps_ucx_t's owner_idle: whether this client waits for nothing (comm thread). */
int ps__waits_for_nothing(void *arg)
{
    const ps_client_t *c = arg;
    return c->inflight == NULL;
}

static void on_heartbeat_sent(void *request, ucs_status_t status, void *user_data)
{
    cshard_t *s = user_data;
    s->hb_inflight = 0;
    if (request) ucp_request_free(request);
}

/* The caller's ops (pushes, pulls, batch requests, declarations) that have waited for a shard
 * longer than 4 heartbeat timeouts (at least 5 s) are said once each, naming the shard: a
 * stopped or hung coordinator, or a step waiting for a member that does not push, would
 * otherwise leave the worker silent (it waits, as it should, until the shard answers or is
 * given up). */
static void ops_overdue(ps_client_t *c)
{
    uint64_t now = mono_ns(), limit = (uint64_t)c->m.job.heartbeat_timeout_ms * 4000000u;
    if (limit < 5000000000ull) limit = 5000000000ull;
    for (uint32_t i = 0; i < c->nshards; i++) {
        /* One line per shard for the ops that passed the limit since the last tick (a step's
         * pushes wait together: each said its own line before, a probe found). */
        const ps_op_t *first = NULL;
        uint32_t more = 0;
        for (ps_op_t *op = c->inflight; op; op = op->next) {
            if (op->on_done || op->slow_said || op->done || op->submit_ns == 0 ||
                op->submit_ns > now || now - op->submit_ns < limit)
                continue;
            uint32_t k = 0;
            while (k < op->nparts && !op->parts[k].pending) k++;
            if (k == op->nparts || op->parts[k].shard != i) continue; /* said for its own */
            op->slow_said = 1;
            if (first == NULL)
                first = op;
            else
                more++;
        }
        if (first == NULL) continue;
        char also[48] = "";
        if (more) snprintf(also, sizeof also, " (and %u more operations)", more);
        bool report = first->type == OP_BATCH && (first->req.flags & PS_FLAG_REPORT);
        PS_LOG(PS_LOG_WARN, "libps", "a %s has waited %llu s for shard %u (%s:%u)%s%s; still "
               "waiting", report ? "report of a batch done" : ps__op_name(first->type),
               (unsigned long long)((now - first->submit_ns) / 1000000000u), i,
               c->m.servers[i].host, c->m.servers[i].port, also,
               i == 0 && report
                   ? " (the coordinator: it answers once its state is saved; it is stopped or "
                     "overloaded, or its store cannot commit)"
               : i == 0 && first->type == OP_BATCH
                   ? " (the coordinator: its step waits for other members, or it is stopped "
                     "or overloaded)"
                   : "");
    }
}

/* A shard that answers heartbeats (PS_FLAG_ANSWER) and that nothing came from for
 * silent_ms (2 heartbeat timeouts, at least 2 s) while connected: a dead host, a cut network
 * or a stopped psd, which UCX alone would notice only when TCP gives up (about 15 minutes,
 * tcp_retries2) or never (a stopped process keeps its sockets). Its connection is closed and
 * it is reconnected as a lost shard: what waits on it is sent again if it comes back within
 * the reconnect timeout, and fails after it. Before, such a shard was waited on without a
 * bound (found by a review, session 39). */
static void shard_silent(ps_client_t *c, cshard_t *s)
{
    uint64_t now = uv_now(&c->loop); /* a timer callback's: fresh */
    if (!s->answers_hb || s->ep == NULL || s->dead || s->down || s->gone || c->leaving ||
        now - s->heard_ms < c->silent_ms)
        return;
    uint32_t i = (uint32_t)(s - c->shards);
    PS_LOG(PS_LOG_WARN, "libps", "shard %u (%s:%u) answered nothing for %llu ms, heartbeats "
           "included (a dead host, a cut network or a stopped psd): closing its connection",
           i, c->m.servers[i].host, c->m.servers[i].port,
           (unsigned long long)(now - s->heard_ms));
    s->silent = 1;
    s->dead = s->close_queued = 1; /* on_deferred closes it and calls ps__shard_lost */
}

/* Ticks come every heartbeat_timeout_ms / 4: a gap of more than half of silent_ms says that
 * this process did not run (stopped, as by SIGSTOP, or not scheduled), not that its shards fell
 * silent or left its operations unanswered. The time it did not run is taken out of its
 * shards' silence (shard_silent) and its operations' waits (hello_overdue, ops_overdue, a
 * push's retries while its chunk is behind: part_behind_retry):
 * before, a worker stopped for two heartbeat timeouts blamed every shard ("a dead host, a cut
 * network or a stopped psd") and reconnected to all (a helper's soak, session 59). */
static void stopped_gap(ps_client_t *c)
{
    uv_update_time(&c->loop); /* not the time cached before the timers ran: a stop between */
    uint64_t now = uv_now(&c->loop), tick = c->m.job.heartbeat_timeout_ms / 4;
    uint64_t last = c->hb_last_ms;
    c->hb_last_ms = now;
    if (now - last <= c->silent_ms / 2) return;
    uint64_t gap = now - last - tick; /* beyond the tick that was due */
    PS_LOG(PS_LOG_INFO, "libps", "this worker's heartbeat thread did not run for %llu ms (the "
           "process was stopped or not scheduled): not counted as its shards' silence",
           (unsigned long long)(now - last));
    for (uint32_t i = 0; i < c->nshards; i++) {
        cshard_t *s = &c->shards[i];
        s->heard_ms = s->heard_ms + gap < now ? s->heard_ms + gap : now;
    }
    /* Not past now: an op handed over after the stop (the caller ran before this tick) would
     * have waited a negative time ("a push has waited 18446744072 s": a probe, session 60). */
    uint64_t now_ns = mono_ns();
    for (ps_op_t *op = c->inflight; op; op = op->next) {
        if (op->submit_ns)
            op->submit_ns = op->submit_ns + gap * 1000000u < now_ns ? op->submit_ns + gap * 1000000u
                                                                    : now_ns;
        for (uint32_t k = 0; k < op->nparts; k++) { /* part_behind_retry's deadline */
            uint64_t *b = &op->parts[k].ck.behind_ms;
            if (*b) *b = *b + gap < now ? *b + gap : now;
        }
    }
}

/* Every heartbeat_timeout_ms / 4, from the comm thread, so a worker busy computing is
 * still heard; a hung (stopped) process falls silent and its shards drop it. During the join,
 * to the shards that answered its hello already: a join that waits for a shard starting late
 * must not fall silent at shard 0, which would drop it as hung and give its rank away (the
 * worker learnt at its first step that it was removed). */
void ps__on_heartbeat(uv_timer_t *h)
{
    ps_client_t *c = h->data;
    stopped_gap(c);
    hello_overdue(c);
    ops_overdue(c);
    if (c->leaving) return;
    int joined = __atomic_load_n(&c->joined, __ATOMIC_ACQUIRE);
    if (joined) {
        ps_ucx_check_armable(&c->ucx); /* while callers drive it: is it wedged? */
        unarmable(c);
    }
    for (uint32_t i = 0; i < c->nshards; i++) {
        cshard_t *s = &c->shards[i];
        if (joined) shard_silent(c, s);
        if (s->ep == NULL || s->dead || s->down || s->hb_inflight || !(joined || s->greeted))
            continue;
        /* The rank is shard 0's answer, set by the joining thread; shards read none here. */
        ps_msg_t m = {.type = PS_MSG_HEARTBEAT,
                      .rank = rank_now(c),
                      .flags = s->answers_hb ? PS_FLAG_ANSWER : 0,
                      .joined_runs = __atomic_load_n(&c->runs_digest, __ATOMIC_RELAXED)};
        ps__floor_of_next(c, i, &m);
        size_t len;
        if (ps_msg_encode_sealed(&m, s->tok.b, s->tok.len, s->hb_hdr, sizeof s->hb_hdr, &len))
            continue;
        s->hb_inflight = ctrl_send(s, s->hb_hdr, len, on_heartbeat_sent, s);
    }
    ps_ucx_progress(&c->ucx);
}
