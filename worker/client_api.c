/* client_api.c: libps on the caller's thread: ps_client.h's functions (create, join,
 * push, pull, waits, batches, leave, destroy; declarations: declare.c) handing ops to the comm
 * thread (client.c; client_internal.h). */
#include "envflag.h"
#include "client_internal.h"

/* ---- caller's thread ------------------------------------------------------ */

static ps_op_t *op_init(ps_op_t *op, ps_client_t *c, int type, uint32_t nparts)
{
    memset(op, 0, sizeof *op); /* each part's state is reset below (the caller sets the rest) */
    op->c = c;
    op->type = type;
    op->req_id = __atomic_add_fetch(&c->next_req, 1, __ATOMIC_RELAXED);
    op->nparts = op->remaining = nparts;
    op->min_version = UINT64_MAX;
    for (uint32_t i = 0; i < nparts; i++) {
        op->parts[i].op = op;
        op->parts[i].pending = 1;
        op->parts[i].resend = 0; /* malloc'd or a spare: never stale */
        op->parts[i].held = 0;
        op->parts[i].data = NULL;
        op->parts[i].len = 0;
        memset(&op->parts[i].ck, 0, sizeof op->parts[i].ck);
    }
    return op;
}

static ps_op_t *op_new(ps_client_t *c, int type, uint32_t nparts)
{
    ps_op_t *op = malloc(sizeof *op + nparts * sizeof(part_t));
    return op ? op_init(op, c, type, nparts) : NULL;
}

/* The op kept in @p spare (ps_op_wait keeps finished ones there; it has room for @p nparts),
 * taken out and reset, else a new one; NULL when out of memory. Caller's thread. */
ps_op_t *ps__op_reuse(ps_client_t *c, ps_op_t **spare, int type, uint32_t nparts)
{
    ps_op_t *op = *spare;
    if (op == NULL) return op_new(c, type, nparts);
    *spare = NULL;
    return op_init(op, c, type, nparts);
}

/* Whether every part of push or pull @p op is small enough to travel in a bundle. */
static int op_fusable(const ps_client_t *c, const ps_op_t *op)
{
    if (op->type != OP_PUSH && op->type != OP_PULL) return 0;
    const ctensor_t *t = c->tensors[op->tensor];
    for (uint32_t i = 0; i < op->nparts; i++) {
        size_t len = op->type == OP_PUSH ? op->parts[i].len
                                         : ps_chunk_len(t->numel, c->chunk_elems, i) * 4;
        if (len > PS_BUNDLE_PART_MAX) return 0;
    }
    return 1;
}

/* A push or pull of a tensor of at least this many bytes whose ops take longer than the
 * busy-poll window waits asleep at once (op_wait_done). */
#define PS_WAIT_SLEEP_BYTES (256u << 10)

/* Whether @p op is small: not a push or pull of a tensor of PS_WAIT_SLEEP_BYTES or more. */
static int op_small(const ps_client_t *c, const ps_op_t *op)
{
    return (op->type != OP_PUSH && op->type != OP_PULL) ||
           c->tensors[op->tensor]->numel * 4 < PS_WAIT_SLEEP_BYTES;
}

/* After the caller queued ops (submit_head): while callers drive the worker (ps__comm_driven) and
 * the comm thread left it to them (unarmed, in its bounded wait), small ops wait in the queue
 * for the next caller that waits, which starts them with everything queued beside them in one
 * batch (on_deferred), or for the comm thread's next bounded turn (within PS_UCX_ASIDE_MS: it
 * runs the deferred hook as it stands aside): no wake-up. Else the comm thread is woken
 * unless it busy-polls (@p spinning) and will find them anyway; a large tensor's op also ends
 * the callers' turn, so that the comm thread copies and sends its chunks at once. */
static void hand_over(ps_client_t *c, int spinning, int small)
{
    if (small && ps__comm_driven(&c->ucx) && __atomic_load_n(&c->ucx.unarmed, __ATOMIC_RELAXED))
        return;
    if (!small) __atomic_store_n(&c->drove_ns, 0, __ATOMIC_RELEASE);
    if (!spinning || !small) uv_async_send(&c->wake);
}

void ps__submit(ps_client_t *c, ps_op_t *op)
{
    op->next = NULL;
    op->submit_ns = mono_ns();
    if (c->grouping && op_fusable(c, op)) {
        /* Held until ps_client_group_end hands the group over at once. */
        if (c->group_tail)
            c->group_tail->next = op;
        else
            c->group_head = op;
        c->group_tail = op;
        return;
    }
    int small = op_small(c, op); /* (read before the comm thread may take it) */
    pthread_mutex_lock(&c->mu);
    if (c->submit_tail)
        c->submit_tail->next = op;
    else
        c->submit_head = op;
    c->submit_tail = op;
    /* A comm thread busy-polling runs on_deferred again before it sleeps (ucx_loop.h). */
    int spinning = __atomic_load_n(&c->ucx.spinning, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&c->mu);
    hand_over(c, spinning, small);
}

/* End the callers' turn at the worker (drove_ns cleared) and wake the comm thread to take it
 * back, under loop_mu (its shutdown holds it, so c->wake is still open; nothing is sent once
 * the loop stopped). When the comm thread holds loop_mu it is in its turn: it sees the turn
 * ended at its next ps_ucx_progress, within PS_UCX_ASIDE_MS, without the wake-up. */
static void hand_back(ps_client_t *c)
{
    __atomic_store_n(&c->drove_ns, 0, __ATOMIC_SEQ_CST);
    if (pthread_mutex_trylock(&c->loop_mu) != 0) return;
    if (!c->loop_stop) uv_async_send(&c->wake);
    pthread_mutex_unlock(&c->loop_mu);
}

/* Under loop_mu, for a caller that drove the worker while it waited for @p mine: whether
 * something in flight needs the comm thread as soon as no caller drives: a push whose parts
 * are still to be copied, an op of the comm thread's own (on_done), or a push or pull of a
 * large tensor (its rendezvous transfers progress with the worker). Small ops, whose
 * replies only complete them, can wait for the next caller that waits or the comm thread's
 * bounded wait. */
static int loop_needs_comm(const ps_client_t *c, const ps_op_t *mine)
{
    if (c->copy_head) return 1;
    for (const ps_op_t *op = c->inflight; op; op = op->next)
        if (op != mine && (op->on_done || !op_small(c, op))) return 1;
    return 0;
}

/* Wait for the comm thread to complete op: spin for the loop's busy-poll window first (a
 * small op completes within tens of microseconds, less than a wake-up costs on a VM), then
 * sleep on the condition variable. A push or pull of a large tensor whose ops take longer than
 * the window sleeps at once: spinning would only take CPU time from the comm thread, which
 * copies and sends the op's data meanwhile, and from psd (on a 2-CPU host, a push's copy then
 * ran at half speed beside the spinning caller while the other CPU idled). Small tensors' ops
 * keep the spin even when a batch of them takes longer than the window: there the comm thread
 * has little to copy, and psbench's rounds of 32 unfused 1 KiB tensors ran at half the rate
 * without it. */
static void op_wait_done(ps_client_t *c, ps_op_t *op)
{
    uint64_t *took = NULL;
    if (!op_small(c, op)) took = &c->tensors[op->tensor]->took_ns[op->type == OP_PULL];
    if (c->ucx.spin_ns && !__atomic_load_n(&op->done, __ATOMIC_ACQUIRE) &&
        (took == NULL || *took <= c->ucx.spin_ns)) {
        uint64_t t0 = mono_ns();
        /* A small op's wait drives the worker itself; a large tensor's leaves it to the comm
         * thread, which copies and sends its chunks meanwhile (a driving caller and the comm
         * thread took turns at them: 1 MiB direct pulls ran at 0.6x). */
        int drive = took == NULL;
        int handed = 0; /* work is left that no waiting caller drives */
        int told = 0;   /* the comm thread was told to stand aside (it waited, armed) */
        if (drive)
            __atomic_add_fetch(&c->drivers, 1, __ATOMIC_ACQ_REL);
        else if (__atomic_load_n(&c->drove_ns, __ATOMIC_ACQUIRE) != 0)
            hand_back(c); /* the callers' turn ends: the comm thread copies and sends it */
        for (;;) {
            /* Drive the worker here when the comm thread is not at it (it waits for events,
             * or it saw drivers and stopped its own busy-poll): the reply is taken on this
             * thread, with no hand-over through the comm thread. */
            if (drive && pthread_mutex_trylock(&c->loop_mu) == 0) {
                if (!c->loop_stop) {
                    /* A comm thread asleep with the worker armed would stay so while this
                     * thread takes the events (a TCP socket drained here wakes no one), its
                     * timers' deadlines as they were: woken, it stands aside in its bounded
                     * wait (PS_UCX_ASIDE_MS), which sees timers started here. */
                    if (!told && !__atomic_load_n(&c->ucx.unarmed, __ATOMIC_SEQ_CST) &&
                        !__atomic_load_n(&c->ucx.spinning, __ATOMIC_SEQ_CST))
                        uv_async_send(&c->wake);
                    told = 1;
                    ps_ucx_poll(&c->ucx);
                    /* Asked once the op is done (done here, mostly): not each turn. */
                    if (__atomic_load_n(&op->done, __ATOMIC_ACQUIRE))
                        handed = loop_needs_comm(c, op);
                }
                __atomic_store_n(&c->drove_ns, mono_ns(), __ATOMIC_RELEASE);
                pthread_mutex_unlock(&c->loop_mu);
            }
            if (__atomic_load_n(&op->done, __ATOMIC_ACQUIRE)) break;
            sched_yield();
            if (__atomic_load_n(&op->done, __ATOMIC_ACQUIRE)) break;
            if (mono_ns() - t0 >= c->ucx.spin_ns) break;
        }
        int done = __atomic_load_n(&op->done, __ATOMIC_ACQUIRE);
        /* The last driver to leave hands the worker back at once where the comm thread's
         * bounded wait (PS_UCX_ASIDE_MS) would hold something up: this op, still waited for
         * (asleep below), or a transfer no caller waits for. */
        if (drive && __atomic_sub_fetch(&c->drivers, 1, __ATOMIC_ACQ_REL) == 0 &&
            (!done || handed))
            hand_back(c);
        if (done) goto done;
    }
    pthread_mutex_lock(&c->mu);
    c->sleepers++;
    while (!op->done) pthread_cond_wait(&c->cv, &c->mu);
    c->sleepers--;
    pthread_mutex_unlock(&c->mu);
done:
    /* The op's own time, hand-over to done: the caller's wake-up is not in it, so a tensor
     * whose ops got fast again is spun for again. */
    if (took && op->done_ns > op->submit_ns) {
        /* Capped, so that one slow op (a reconnect, a resend, a bsp pull waiting for the
         * step) does not keep a tensor's waits from spinning for long. */
        uint64_t ns = op->done_ns - op->submit_ns, cap = 4 * c->ucx.spin_ns;
        if (ns > cap) ns = cap;
        *took = *took ? (3 * *took + ns) / 4 : ns;
    }
}

void ps_client_group_begin(ps_client_t *c) { c->grouping++; }

/* Hand over what a group holds now (a wait inside the group would wait for ever). */
static void ps_client_group_end_all(ps_client_t *c)
{
    int depth = c->grouping;
    c->grouping = 1;
    ps_client_group_end(c);
    c->grouping = depth;
}

void ps_client_group_end(ps_client_t *c)
{
    if (c->grouping == 0 || --c->grouping > 0 || c->group_head == NULL) return;
    uint64_t now = mono_ns(); /* handed over now: the time held is the caller's, not the op's */
    int small = 1; /* (read before the comm thread may take them) */
    for (ps_op_t *op = c->group_head; op; op = op->next) {
        op->submit_ns = now;
        small &= op_small(c, op);
    }
    pthread_mutex_lock(&c->mu);
    if (c->submit_tail)
        c->submit_tail->next = c->group_head;
    else
        c->submit_head = c->group_head;
    c->submit_tail = c->group_tail;
    int spinning = __atomic_load_n(&c->ucx.spinning, __ATOMIC_SEQ_CST); /* as in ps__submit() */
    pthread_mutex_unlock(&c->mu);
    c->group_head = c->group_tail = NULL;
    hand_over(c, spinning, small);
}

void ps_client_set_fusion(ps_client_t *c, uint64_t bytes)
{
    __atomic_store_n(&c->fusion_bytes, bytes, __ATOMIC_RELAXED);
}

/* An encoded push's chunks acknowledged as not summed (marked by ps__ef_put_back): the
 * tensor's put-back, on the caller's thread, while the payloads are still the push's. */
static int put_back_encoded(ps_client_t *c, ps_op_t *op)
{
    const ctensor_t *t = c->tensors[op->tensor];
    int first = 0; /* every chunk is given back; the first failure is said */
    for (uint32_t i = 0; i < op->nparts; i++) {
        part_t *p = &op->parts[i];
        if (!p->unsummed) continue;
        p->unsummed = 0;
        if (t->put_back == NULL) { /* the encoder's residual keeps what psd did not sum */
            if (!c->put_back_said)
                PS_LOG(PS_LOG_WARN, "libps", "chunk %u of tensor %u: a shard did not sum this "
                       "encoded push, and the tensor has no put-back (ps_client_set_put_back): "
                       "its error feedback is not given back (said once)", p->chunk, t->id);
            c->put_back_said = 1;
            continue;
        }
        int rc = t->put_back(t->put_back_arg, t->id, p->chunk, (uint64_t)p->chunk * c->chunk_elems,
                             ps_chunk_len(t->numel, c->chunk_elems, p->chunk), &t->codec, p->data,
                             p->len);
        if (rc && first == 0) {
            snprintf(c->err, sizeof c->err, "chunk %u of tensor %u: giving back a push its shard "
                     "did not sum failed: %s", p->chunk, t->id, ps_strerror(rc));
            first = rc;
        }
    }
    return first;
}

int ps_op_wait(ps_op_t *op, uint64_t *version)
{
    if (op == NULL) return PS_EINVAL;
    ps_client_t *c = op->c;
    if (op->waited) { /* kept for reuse after its wait (below), not handed out again yet */
        snprintf(c->err, sizeof c->err, "this %s was waited for already", ps__op_name(op->type));
        return PS_EINVAL;
    }
    if (c->grouping && c->group_head) ps_client_group_end_all(c); /* never wait on a held op */
    op_wait_done(c, op);
    int rc = op->status;
    /* Also for an op that failed otherwise: the chunks marked were not summed. */
    if (op->type == OP_PUSH && op->buf == NULL) {
        int pb = put_back_encoded(c, op);
        if (rc == 0) rc = pb;
    }
    if (op->status) snprintf(c->err, sizeof c->err, "%s", op->err);
    if (version) *version = op->min_version == UINT64_MAX ? 0 : op->min_version;
    /* Keep one push and one pull op per tensor, and one control op (a batch request, a
     * declaration): steady training allocates nothing. */
    ps_op_t **spare = NULL;
    if (op->type == OP_PUSH || op->type == OP_PULL) {
        ctensor_t *t = c->tensors[op->tensor];
        t->busy[op->type == OP_PULL]--;
        if (op->type == OP_PUSH && rc == 0) c->acked_pushes++; /* done_refused */
        spare = &t->spare[op->type == OP_PULL];
    }
    else if (op->nparts == 1)
        spare = &c->ctrl_spare;
    op->waited = 1;
    if (spare && *spare == NULL)
        *spare = op;
    else
        free(op);
    return rc;
}

/* Send one control request to one shard and wait for its reply. */
int ps__ctrl_call(ps_client_t *c, int type, uint32_t shard, ps_msg_t *req, ps_msg_t *reply)
{
    if (c->group_head) ps_client_group_end_all(c); /* held pushes and pulls go first */
    ps_op_t *op = ps__op_reuse(c, &c->ctrl_spare, type, 1); /* ps_op_wait below keeps it again */
    if (op == NULL) { /* said: the error text was the previous call's (a review, session 71) */
        snprintf(c->err, sizeof c->err, "out of memory for a %s", ps__op_name(type));
        return PS_ENOMEM;
    }
    op->parts[0].shard = shard;
    req->req_id = op->req_id;
    op->req = *req;
    ps__submit(c, op);
    op_wait_done(c, op);
    *reply = op->reply;
    return ps_op_wait(op, NULL);
}

/* Sleep @p ms, in steps of 10 ms at most; returns 1 as soon as *@p cancel is set. */
static int nap_or_cancel(uint32_t ms, const volatile sig_atomic_t *cancel)
{
    for (uint32_t slept = 0; slept < ms; slept += 10) {
        if (cancel && *cancel) return 1;
        usleep((ms - slept < 10 ? ms - slept : 10) * 1000);
    }
    return cancel && *cancel;
}

/* How long a join waits for a shard before it says so (and goes on waiting). */
#define JOIN_SAY_MS 2000
/* At a join, shard @p i's hello reply @p rep against shard 0's table (@p t0 tensors; -1 when
 * its psd did not say): a shard that lost its store (started again from an empty or another
 * data_dir) while the others kept theirs. Every shard holds the cluster's whole tensor table
 * once the declarations completed (while they run, a shard may hold a tensor shard 0 has not
 * committed yet), so shard 0 without tensors while another holds trained ones (its lowest
 * chunk version past 0) lost its store: its job would start again at step 0 and, under bsp,
 * the other shards acknowledge the pushes of the steps they applied as applied and drop them,
 * silently (found by a review, session 39). The other way, a shard without tensors once the
 * job is past step 0 would create them again from their initial values at the declarations,
 * silently under asp (a probe, session 40). (Comparing steps alone was tried first: clients
 * that push without batch requests, psbench, advance chunk versions without the
 * coordinator's step.) @return 0, or PS_ECONFIG with c->err said. */
static int join_store_check(ps_client_t *c, uint32_t i, const ps_msg_t *rep, int64_t t0)
{
    if (!(rep->flags & PS_FLAG_TENSORS) || t0 < 0) return 0;
    uint32_t lost;
    if (t0 == 0 && rep->count > 0 && rep->step > 0)
        lost = 0;
    else if (t0 > 0 && rep->count == 0 && c->join_step > 0)
        lost = i;
    else
        return 0;
    snprintf(c->err, sizeof c->err, "shard %u (%.64s:%u) holds %llu tensors at step %llu, shard 0 "
             "%lld tensors at step %llu: shard %u's " STORE_LOST " or every one empty", i,
             c->m.servers[i].host, c->m.servers[i].port,
             (unsigned long long)rep->count, (unsigned long long)rep->step, (long long)t0,
             (unsigned long long)c->join_step, lost);
    return PS_ECONFIG;
}

/* At a join, shard @p i's hello reply @p rep against shard 0's: stores restored from different
 * checkpoints, or one restored and the other not. A shard restored alone from a checkpoint
 * while the others kept their newer stores goes back to the checkpoint's steps: under bsp the
 * workers failed at once with "the chunk is at 278" (nothing named the cause), under asp they
 * trained on and that shard's updates since the checkpoint were lost while counted as applied
 * (a probe, session 40). Every shard restored from one checkpoint has its id as the origin of
 * its run (psd --restore, server/run.h). Records the run (@p i's cshard). @return 0, or
 * PS_ECONFIG with c->err said. */
static int join_run_check(ps_client_t *c, uint32_t i, const ps_msg_t *rep)
{
    cshard_t *s = &c->shards[i], *s0 = &c->shards[0];
    if (!(rep->flags & PS_FLAG_RUN)) return 0; /* an older psd: it does not say */
    __atomic_store_n(&s->run, rep->run, __ATOMIC_RELAXED);
    s->run_origin = rep->run_origin;
    s->run_base = rep->run_base;
    s->joined_runs = rep->joined_runs;
    if (i == 0 || __atomic_load_n(&s0->run, __ATOMIC_RELAXED) == 0 ||
        s->run_origin == s0->run_origin)
        return 0;
    char mine[96], zero[96];
    ps__run_said(mine, sizeof mine, s->run_origin, s->run_base);
    ps__run_said(zero, sizeof zero, s0->run_origin, s0->run_base);
    snprintf(c->err, sizeof c->err, "shard %u (%.64s:%u) holds a store %s, shard 0 one %s: a "
             "shard restored alone loses the updates the others kept since; " STORE_REMEDY, i,
             c->m.servers[i].host, c->m.servers[i].port, mine, zero);
    return PS_ECONFIG;
}

/* Once every shard answered the join: the runs digest each keeps (of the last join a worker told
 * it of by its heartbeats, or its restore's mark) against this join's (ps_runs_digest). A
 * shard restored alone from the checkpoint the whole cluster was restored from before has the
 * same origin as the others (join_run_check passes it), but the others keep the digest of the
 * runs they were joined with since, which its new run changed: under asp its updates since
 * were lost while counted applied, and a shard 0 so restored applied batches twice (a probe,
 * session 41). A shard that kept none (0: never joined, a store older than session 41) or its
 * restore's mark fits any. Sets c->runs_digest. @return 0, or PS_ECONFIG with c->err said. */
static int join_runs_check(ps_client_t *c)
{
    uint64_t runs[PS_MAX_SERVERS];
    for (uint32_t i = 0; i < c->nshards; i++)
        if ((runs[i] = __atomic_load_n(&c->shards[i].run, __ATOMIC_RELAXED)) == 0)
            return 0; /* an older psd: it does not say */
    uint64_t h = ps_runs_digest(runs, c->nshards);
    for (uint32_t i = 0; i < c->nshards; i++) {
        const cshard_t *s = &c->shards[i];
        if (s->joined_runs == 0 || s->joined_runs == h ||
            s->joined_runs == ps_run_restored_mark(s->run_origin))
            continue;
        snprintf(c->err, sizeof c->err, "shard %u (%.64s:%u) last served beside other stores "
                 "than these shards hold now: a shard was restored or replaced alone since, and "
                 "its updates would be lost or applied twice; " STORE_REMEDY, i,
                 c->m.servers[i].host, c->m.servers[i].port);
        return PS_ECONFIG;
    }
    __atomic_store_n(&c->runs_digest, h, __ATOMIC_RELAXED);
    return 0;
}

/* bsp: shard @p i's hello reply @p rep names chunks at step_max past shard 0's open step
 * (c->join_step) + 1, where no chunk can be: its pushes of a step follow their batches,
 * handed out by shard 0 once it opened that step. Shard 0's store went back to an older copy
 * of itself (a snapshot, a backup put back) after the job went on: it hands out steps and
 * batches again that shard @p i applied already, whose pushes there are acknowledged as
 * applied and dropped, so that part of the model trains no more (a probe, session 67: a worker
 * joined such a cluster and trained 2,457 steps with shard 1's updates dropped). Shard 0 is
 * asked once more first (by @p req, answered after shard @p i: the job may have moved on since
 * its first answer), and only when both its step and its own chunks' step_max are still more
 * than one behind is the join refused (a shard 0 restarted while tensors no member trains held
 * its lowest chunk version back resumed its coordinator a step low until session 68: a
 * review). From step 0 on: a copy taken before the first step counts too. @return 0, or
 * PS_ECONFIG with c->err said. A shard whose every chunk lags (a tensor no member trains)
 * names a lower step_max: not refused here, as nothing is lost by it. */
static int join_ahead_check(ps_client_t *c, uint32_t i, const ps_msg_t *rep, ps_msg_t *req)
{
    if (c->m.job.consistency != PS_CONSIST_BSP || i == 0 ||
        !(rep->flags & PS_FLAG_STEPMAX) || rep->step_max <= c->join_step + 1)
        return 0;
    ps_msg_t r0;
    ps__hello_conf(c, req, 0);
    if (ps__ctrl_call(c, OP_HELLO, 0, req, &r0) != 0 || r0.step + 1 >= rep->step_max ||
        ((r0.flags & PS_FLAG_STEPMAX) && r0.step_max + 1 >= rep->step_max))
        return 0; /* not answered: the other checks and the pushes decide */
    snprintf(c->err, sizeof c->err, "shard %u (%.64s:%u) holds chunks at step %llu, shard 0 "
             "hands out step %llu: shard 0's data_dir went back to an older copy of itself (a "
             "snapshot or a backup), and the steps since would be trained again where shard %u "
             "drops them as applied; " STORE_REMEDY, i, c->m.servers[i].host,
             c->m.servers[i].port, (unsigned long long)rep->step_max,
             (unsigned long long)r0.step, i);
    return PS_ECONFIG;
}

/* The join's hello to shard @p i, into @p req. */
static void hello_req(ps_client_t *c, uint32_t i, ps_msg_t *req)
{
    *req = (ps_msg_t){.type = PS_MSG_HELLO, .rank = c->rank, .pid = (uint32_t)getpid(),
                      .samples = c->join_serial, .store_id = ps_storeview_host_id(),
                      .launcher = c->launcher};
    ps__hello_conf(c, req, i);
    snprintf(req->cluster, sizeof req->cluster, "%s", c->m.cluster);
    gethostname(req->host, sizeof req->host - 1);
}

/* Once every shard answered the join (and the run checks passed): shard i's floor of the next
 * shard n (i + 1; the last one's: shard 0), the highest chunk version of n's run that a member
 * told i of by its heartbeats (server/floor.h), against n's highest now. Below it, n's data_dir
 * went back to an older copy of itself (a snapshot, a backup, a host crash since its last
 * sync) while no worker that ran through its restart was left to tell (those refuse it:
 * ps__on_rehello): under asp / ssp the updates since were lost unnoticed, and the joiner
 * trained on; under bsp its first push failed naming only the versions (a probe, session 67).
 * Shard n is asked once more first: it answered before shard i (shard 0 for the last shard),
 * and may have gone on past its answer since. The floor raises n's seen_max: n coming back
 * below it later is refused as for a version n told this worker of itself. @return 0, or
 * PS_ECONFIG with c->err said. */
static int join_floor_check(ps_client_t *c)
{
    for (uint32_t i = 0; i < c->nshards && c->nshards > 1; i++) {
        const cshard_t *s = &c->shards[i];
        uint32_t k = (i + 1) % c->nshards;
        cshard_t *n = &c->shards[k];
        uint64_t key = __atomic_load_n(&n->floor_key, __ATOMIC_ACQUIRE);
        if (s->floor_run == 0 || s->floor_run != key)
            continue; /* none, of another store of n (the run checks tell those) or from before
                         a drop of a trained tensor there, or n is an older psd (key 0), whose
                         drops lower its step_max unsaid */
        if (n->join_max < s->floor) {
            ps_msg_t req, rep;
            hello_req(c, k, &req);
            if (ps__ctrl_call(c, OP_HELLO, k, &req, &rep) != 0) {
                ps__seen_version(n, s->floor); /* its reconnect's hello is compared with it */
                continue;
            }
            if (!(rep.flags & PS_FLAG_STEPMAX) || !(rep.flags & PS_FLAG_FLOOR) ||
                rep.floor_key != key)
                continue; /* an older psd now, or another store (its run is refused then) */
            if (rep.step_max < s->floor) {
                snprintf(c->err, sizeof c->err, "shard %u (%.48s:%u) holds chunks up to step "
                         "%llu, but told workers of step %llu (shard %u keeps that): its "
                         "data_dir went back to an older copy of itself (a snapshot, a backup, "
                         "a host crash since its last sync), and the updates since are lost; "
                         STORE_REMEDY ", or take the loss: start shard %u once with "
                         "--forget-floor", k, c->m.servers[k].host,
                         c->m.servers[k].port, (unsigned long long)rep.step_max,
                         (unsigned long long)s->floor, i, i);
                return PS_ECONFIG;
            }
            n->join_max = rep.step_max;
            ps__seen_version(n, rep.step_max);
        }
        ps__seen_version(n, s->floor);
    }
    return 0;
}

static int join(ps_client_t *c, uint32_t timeout_ms, const volatile sig_atomic_t *cancel)
{
    uint64_t start = now_ms(), deadline = start + timeout_ms;
    uint32_t backoff = 50;
    bool asked_again = false; /* shard 0, once more, after join_store_check blamed it */
    for (uint32_t i = 0; i < c->nshards; i++) {
        bool said = false;
        for (;;) {
            ps_msg_t req, rep;
            hello_req(c, i, &req);
            int rc = ps__ctrl_call(c, OP_HELLO, i, &req, &rep);
            if (rc == 0) {
                if (i == 0) {
                    __atomic_store_n(&c->rank, rep.rank, __ATOMIC_RELAXED); /* ps__on_heartbeat */
                    c->workers = rep.workers;
                    c->join_step = rep.step;
                    c->join_serial = rep.samples;
                    c->join_tensors = rep.flags & PS_FLAG_TENSORS ? (int64_t)rep.count : -1;
                    /* PS_TEST_JOIN_HOLD=FILE (tests only): wait here while FILE exists (up to
                     * 60 s), so that another worker declares and pushes before the other
                     * shards answer. */
                    const char *hold = asked_again ? NULL : getenv("PS_TEST_JOIN_HOLD");
                    for (int t = 0; hold && access(hold, F_OK) == 0 && t < 6000; t++)
                        if (nap_or_cancel(10, cancel)) {
                            snprintf(c->err, sizeof c->err, "the join was canceled");
                            return PS_ECANCELED;
                        }
                } else if (join_store_check(c, i, &rep, c->join_tensors)) {
                    if (c->join_tensors != 0 || asked_again) return PS_ECONFIG;
                    /* Shard 0 had no tensors when it answered, shard i has them at a step past
                     * 0: lost, or another worker declared and pushed between the two answers
                     * (seen with the suites run two at a time: a worker joining beside the
                     * first one was refused). Shard 0 is asked once more, now with the rank
                     * and join serial it gave (the coordinator keeps them, on this connection
                     * or another), and so are the shards after it. */
                    PS_LOG(PS_LOG_INFO, "libps", "shard %u holds %llu tensors at step %llu, shard "
                           "0 held none when it answered: asking shard 0 again (another worker "
                           "may have declared them meanwhile)", i, (unsigned long long)rep.count,
                           (unsigned long long)rep.step);
                    asked_again = true;
                    i = 0;
                    continue;
                }
                if (join_run_check(c, i, &rep)) return PS_ECONFIG;
                if (join_ahead_check(c, i, &rep, &req)) return PS_ECONFIG;
                if (rep.flags & PS_FLAG_STEPMAX)
                    ps__seen_version(&c->shards[i], rep.step_max);
                c->shards[i].join_max = rep.flags & PS_FLAG_STEPMAX ? rep.step_max : UINT64_MAX;
                c->shards[i].floor = rep.flags & PS_FLAG_FLOOR ? rep.floor : 0;
                c->shards[i].floor_run = rep.flags & PS_FLAG_FLOOR ? rep.floor_run : 0;
                break;
            }
            /* PS_EBUSY: a shard shutting down, or shard 0's free ranks held until its open
             * step closes: for a while, as an unreachable shard. */
            bool again = rc == PS_ETRANSPORT || rc == PS_ETIMEDOUT || rc == PS_EBUSY;
            if (!again || now_ms() >= deadline) {
                char why[256], took[96] = "";
                snprintf(why, sizeof why, "%.200s", c->err);
                /* Out of time: say how long it tried, as a reconnect that gives up does (a
                 * worker that lost a shard can be dropped by shard 0 meanwhile and end here,
                 * in its join again, instead: faults:silent_shard_lost, CI of session 47). */
                if (again)
                    snprintf(took, sizeof took, " in %llu ms (the reconnect timeout is %u ms)",
                             (unsigned long long)(now_ms() - start), timeout_ms);
                snprintf(c->err, sizeof c->err, "cannot join shard %u (%.64s:%u)%s: %s", i,
                         c->m.servers[i].host, c->m.servers[i].port, took, why);
                return rc;
            }
            /* Not at once: a psd still starting is usual. But a wait of up to timeout_ms
             * (30 s by default) in silence looked hung. */
            if (!said && now_ms() - start >= JOIN_SAY_MS) {
                said = true;
                PS_LOG(PS_LOG_WARN, "libps", "cannot join shard %u (%s:%u) yet: %s; trying "
                       "again for up to %u ms in all", i, c->m.servers[i].host,
                       c->m.servers[i].port, c->err, timeout_ms);
            }
            if (nap_or_cancel(backoff, cancel)) {
                snprintf(c->err, sizeof c->err, "the join was canceled while shard %u (%.64s:%u) "
                         "did not answer: %.200s", i, c->m.servers[i].host, c->m.servers[i].port,
                         ps_strerror(rc));
                return PS_ECANCELED;
            }
            backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
        }
    }
    int rc = join_runs_check(c);
    return rc ? rc : join_floor_check(c);
}

void ps_client_job(const ps_client_t *c, ps_job_info_t *out)
{
    out->consistency = (int)c->m.job.consistency;
    out->seed = c->m.job.seed;
    out->batch_size = c->m.job.batch_size;
    out->epochs = c->m.job.epochs;
    out->max_steps = c->m.job.max_steps;
    out->workers = c->m.job.workers;
}

/* ps_manifest_cluster and ps_manifest_optimizer: the manifest at @p path's cluster name, or
 * with @p optimizer its job's optimizer's name, into @p out. */
static int manifest_name(const char *path, bool optimizer, char *out, size_t outlen, char *err,
                         size_t errlen)
{
    ps_manifest_t *m = malloc(sizeof *m);
    if (m == NULL) {
        snprintf(err, errlen, "out of memory");
        return PS_ENOMEM;
    }
    int rc = ps_manifest_load(m, path, err, errlen);
    const char *name = rc ? "" : optimizer ? ps_optim_name(m->job.optimizer.name) : m->cluster;
    if (rc == 0 && (size_t)snprintf(out, outlen, "%s", name) >= outlen) rc = PS_EINVAL;
    free(m);
    return rc;
}

int ps_manifest_cluster(const char *path, char *out, size_t outlen, char *err, size_t errlen)
{
    return manifest_name(path, false, out, outlen, err, errlen);
}

int ps_manifest_optimizer(const char *path, char *out, size_t outlen, char *err, size_t errlen)
{
    return manifest_name(path, true, out, outlen, err, errlen);
}

/* Clients whose comm thread runs in this process (atomic), and how many did in the process
 * this one was forked from. UCX's state does not survive a fork while a client is open: in
 * the child a new client's connections never completed, and its join timed out saying the
 * shard did not answer (a helper's probe, session 58; one closed before the fork is fine). */
static int live_clients, forked_with;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void)
{
    if (live_clients) forked_with = live_clients; /* kept in a child's children too */
    live_clients = 0;                             /* the parent's have no thread here */
}

static void fork_watch(void) { pthread_atfork(NULL, NULL, on_fork_child); }

int ps_client_create(const char *manifest_path, const ps_client_opts_t *opts, ps_client_t **out,
                     char *err, size_t errlen)
{
    *out = NULL;
    pthread_once(&fork_once, fork_watch);
    int forked = __atomic_load_n(&forked_with, __ATOMIC_RELAXED);
    if (forked) {
        if (err)
            snprintf(err, errlen, "this process was forked from one with %d libps client%s "
                     "open, and UCX's state does not survive that (a client made here could "
                     "not connect): close them before forking, or start this process anew "
                     "(exec; python multiprocessing's 'spawn' or 'forkserver' start method)",
                     forked, forked == 1 ? "" : "s");
        return PS_ENOTSUP;
    }
    /* UCX's TCP frames checked in this process (python with psd.torch, a user's program),
     * before any UCX socket (common/sockhooks.c). */
    ps_sockhooks_got_install();
    ps_client_t *c = calloc(1, sizeof *c);
    if (c == NULL) {
        if (err) snprintf(err, errlen, "out of memory");
        return PS_ENOMEM;
    }
    char e[1024] = "";
    int rc = ps_manifest_load(&c->m, manifest_path, e, sizeof e);
    if (rc == 0) rc = ps_auth_load(&c->auth, &c->m, e, sizeof e);
    if (rc) {
        if (err) snprintf(err, errlen, "%s", e);
        free(c);
        return rc;
    }
    c->nshards = (uint32_t)c->m.nservers;
    c->chunk_elems = c->m.chunk_bytes / 4;
    c->fusion_bytes = c->m.fusion_bytes;
    c->rank = -1;
    const char *lp = getenv("PS_LAUNCHER"); /* set by pslaunch for the workers it starts */
    c->launcher = lp ? (uint32_t)strtoul(lp, NULL, 10) : 0;
    c->direct = !ps_env_off("PS_DIRECT_PULL");
    c->direct_push = !ps_env_off("PS_DIRECT_PUSH");
    const char *tf = getenv("PS_TEST_DIRECT_FAIL");
    if (tf && atoi(tf) > 0) {
        c->test_direct_fail = (uint32_t)atoi(tf);
        PS_LOG(PS_LOG_WARN, "libps", "PS_TEST_DIRECT_FAIL=%u: direct read %u fails on purpose "
               "(a test hook)", c->test_direct_fail, c->test_direct_fail);
    }
    const char *tc = getenv("PS_TEST_CORRUPT_PUSH");
    if (tc && atoi(tc) > 0) {
        c->test_corrupt_push = (uint32_t)atoi(tc);
        PS_LOG(PS_LOG_WARN, "libps", "PS_TEST_CORRUPT_PUSH=%u: every %uth push is corrupted on "
               "purpose (a test hook)", c->test_corrupt_push, c->test_corrupt_push);
    }
    const char *tr = getenv("PS_TRACE");
    if (tr && *tr) {
        /* A process's later clients (a worker that joins again) write FILE.2, FILE.3, ...:
         * the trace up to the rejoin is what one wants to read. */
        static int clients;
        int n = __atomic_add_fetch(&clients, 1, __ATOMIC_RELAXED);
        static const char *const lanes[] = {"pushes", "pulls", "control"};
        char process[48], path[1024];
        snprintf(process, sizeof process, "libps pid %ld", (long)getpid());
        if (n > 1)
            snprintf(path, sizeof path, "%s.%d", tr, n);
        else
            snprintf(path, sizeof path, "%s", tr);
        rc = ps_trace_open(&c->trace, path, (uint32_t)getpid(), process, lanes, 3, e, sizeof e);
        if (rc) {
            if (err) snprintf(err, errlen, "PS_TRACE: %s", e);
            ps_auth_wipe(&c->auth); /* the key is wiped when the client is done with it */
            free(c);
            return rc;
        }
    }
    /* Set before the comm thread starts, which reads them. */
    uint32_t timeout = c->m.job.reconnect_timeout_ms;
    if (opts && (opts->field_mask & PS_CLIENT_OPT_CONNECT_TIMEOUT))
        timeout = opts->connect_timeout_ms;
    c->reconnect_ms = timeout;
    /* A third of the heartbeat timeout: the shard must hear from the restarted transport
     * before it drops this worker as silent. At least 1 s: with a short heartbeat timeout
     * (elastic:sigstop_rejoins has 500 ms) a shard busy for a moment would otherwise make
     * hellos time out again and again, each a transport restart; there the shard drops the
     * worker first and it joins again. */
    c->hello_deadline_ms = c->m.job.heartbeat_timeout_ms / 3;
    if (c->hello_deadline_ms < 1000) c->hello_deadline_ms = 1000;
    c->silent_ms = 2 * c->m.job.heartbeat_timeout_ms; /* shard_silent */
    if (c->silent_ms < 2000) c->silent_ms = 2000;
    c->shards = calloc(c->nshards, sizeof *c->shards);
    c->tensors = calloc(PS_CLIENT_MAX_TENSORS, sizeof *c->tensors);
    /* The shards' addresses, here on the caller's thread (a name that does not resolve yet is
     * looked up again in the background by the comm thread: connect_shard). */
    for (uint32_t i = 0; c->shards && i < c->nshards; i++)
        if (ps_sockaddr_resolve(c->m.servers[i].host, c->m.servers[i].port,
                                &c->shards[i].addr, &c->shards[i].addrlen))
            c->shards[i].addrlen = 0;
    pthread_mutex_init(&c->loop_mu, NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    /* The comm thread (and UCX's async thread, which it starts) block the signals that end or
     * interrupt a process, so they reach the application's threads: a handler that calls
     * ps_client_interrupt, or destroys the client, never runs on a thread of the client. */
    sigset_t block, was;
    ps__client_signals(&block);
    pthread_sigmask(SIG_BLOCK, &block, &was);
    __atomic_add_fetch(&live_clients, 1, __ATOMIC_RELAXED); /* before: a fork meanwhile */
    int started =
        c->shards && c->tensors && pthread_create(&c->thread, NULL, ps__comm_main, c) == 0;
    pthread_sigmask(SIG_SETMASK, &was, NULL);
    if (!started) {
        __atomic_sub_fetch(&live_clients, 1, __ATOMIC_RELAXED);
        free(c->shards);
        free(c->tensors);
        ps_trace_close(c->trace);
        ps_auth_wipe(&c->auth);
        free(c);
        if (err) snprintf(err, errlen, "out of memory, or no thread, for the client's transport");
        return PS_ENOMEM;
    }
    pthread_mutex_lock(&c->mu);
    while (!c->started) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    if (c->start_rc) {
        rc = c->start_rc;
        pthread_join(c->thread, NULL);
        __atomic_sub_fetch(&live_clients, 1, __ATOMIC_RELAXED);
        if (err) snprintf(err, errlen, "cannot start the UCX transport: %s", ps_strerror(rc));
        free(c->shards);
        free(c->tensors);
        ps_trace_close(c->trace);
        ps_auth_wipe(&c->auth);
        free(c);
        return rc;
    }
    rc = join(c, timeout, opts && (opts->field_mask & PS_CLIENT_OPT_CANCEL) ? opts->cancel : NULL);
    if (rc) {
        if (err) snprintf(err, errlen, "%s", c->err);
        ps_client_destroy(c);
        return rc;
    }
    __atomic_store_n(&c->joined, 1, __ATOMIC_RELEASE);
    *out = c;
    return 0;
}

/* Whether @p a and @p b name the same batch. */
static bool same_batch(const ps_batch_info_t *a, const ps_batch_info_t *b)
{
    return a->step == b->step && a->pass == b->pass && a->offset == b->offset &&
           a->count == b->count;
}

/* Why @p done cannot be reported as this client's batch done, or NULL. A report closes its
 * step under bsp (shard 0 takes it as "every shard acknowledged this member's pushes of it")
 * and counts its samples as trained: under bsp one without pushes (a batch skipped, say for a
 * NaN loss, and passed on as done) closed a step no shard had applied, and the job waited for
 * good for the pushes of that step (a review, session 63); another client's, or an older one,
 * counted samples this worker never trained. Under asp / ssp a batch without pushes is a
 * caller's choice (psd.torch pushes nothing for a step without gradients), not refused. */
static const char *done_refused(const ps_client_t *c, const ps_batch_info_t *done, char *why,
                                size_t len)
{
    const ps_batch_info_t *h = &c->held;
    if (!c->has_held)
        snprintf(why, len, "this client holds no batch to report done (none was handed to it, "
                 "or the job finished)");
    else if (!same_batch(done, h))
        snprintf(why, len, "the batch reported done (step %llu, pass %llu at %llu, %u samples) "
                 "is not the one this client was handed last (step %llu, pass %llu at %llu, %u "
                 "samples)", (unsigned long long)done->step, (unsigned long long)done->pass,
                 (unsigned long long)done->offset, done->count, (unsigned long long)h->step,
                 (unsigned long long)h->pass, (unsigned long long)h->offset, h->count);
    else if (c->acked_pushes == c->held_acked && c->m.job.consistency == PS_CONSIST_BSP)
        snprintf(why, len, "the batch of step %llu is reported done, but no push of this client "
                 "was acknowledged since it was handed out: push its gradients "
                 "(ps_client_push_none for a tensor without one) and wait for them first",
                 (unsigned long long)done->step);
    else
        return NULL;
    return why;
}

/* PS_FLAG_STALE when a push of step @p step was acknowledged as not applied, else 0. */
static uint32_t stale_flag(ps_client_t *c, uint64_t step)
{
    return __atomic_load_n(&c->stale_step1, __ATOMIC_ACQUIRE) == step + 1 ? PS_FLAG_STALE : 0;
}

/* Free what tensor @p t (may be NULL) holds sized by its shape, and zero it. */
void ps__ctensor_free_bufs(ctensor_t *t)
{
    if (t == NULL) return;
    free(t->residual);
    ps_buffer_free(t->payload, t->chunk_cap * t->nchunks);
    free(t->scratch);
    free(t->pull_buf);
    free(t->spare[0]);
    free(t->spare[1]);
    free(t->places);
    *t = (ctensor_t){0};
}

void ps_client_destroy(ps_client_t *c)
{
    if (c == NULL) return;
    if (c->group_head) ps_client_group_end_all(c); /* nothing held is left unsent */
    if (c->rank >= 0) {
        ps_op_t *op = op_new(c, OP_LEAVE, c->nshards);
        if (op) {
            for (uint32_t i = 0; i < c->nshards; i++) op->parts[i].shard = i;
            char why[320];
            if (c->has_leave_done && done_refused(c, &c->leave_done, why, sizeof why)) {
                PS_LOG(PS_LOG_WARN, "libps", "the leave does not report a batch done: %s", why);
                c->has_leave_done = 0; /* its batch goes to another worker */
            }
            if (c->has_leave_done) { /* the coordinator counts the batch before the leave */
                op->req.flags = PS_FLAG_DONE | stale_flag(c, c->leave_done.step);
                op->req.step = c->leave_done.step;
                op->req.samples = c->batch_samples;
                op->req.data_epoch = c->leave_done.pass;
                op->req.batch_offset = c->leave_done.offset;
                op->req.batch_count = c->leave_done.count;
            }
            ps__submit(c, op);
            ps_op_wait(op, NULL);
        }
    }
    /* On the stack (it has no parts): a shutdown that failed to allocate would leave the join
     * below waiting for a comm thread nobody stops. */
    ps_op_t stop;
    pthread_mutex_lock(&c->loop_mu); /* the comm thread cannot end (close c->wake) meanwhile */
    ps__submit(c, op_init(&stop, c, OP_SHUTDOWN, 0));
    pthread_mutex_unlock(&c->loop_mu);
    op_wait_done(c, &stop);
    pthread_join(c->thread, NULL);
    __atomic_sub_fetch(&live_clients, 1, __ATOMIC_RELAXED);
    ps_trace_close(c->trace); /* its writers (under loop_mu) are done: the comm thread ended */
    pthread_mutex_destroy(&c->loop_mu);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    for (uint32_t i = 0; c->tensors && i < PS_CLIENT_MAX_TENSORS; i++) {
        ps__ctensor_free_bufs(c->tensors[i]);
        free(c->tensors[i]);
    }
    free(c->tensors);
    free(c->nan_chunk);
    free(c->ctrl_spare);
    for (uint32_t i = 0; c->shards && i < c->nshards; i++) {
        ps_storeview_close(&c->shards[i].view);
        ps__area_unmap(&c->shards[i]);
    }
    free(c->shards);
    while (c->flying) { /* none: closing the endpoints completed every send */
        bundle_t *b = c->flying;
        ps__bundle_fly(c, b, 0);
        b->next_free = c->free_bundles;
        c->free_bundles = b;
    }
    for (bundle_t *b = c->free_bundles, *nx; b; b = nx) {
        nx = b->next_free;
        free(b->buf);
        free(b->parts);
        free(b);
    }
    ps_auth_wipe(&c->auth); /* the comm thread has ended: nothing reads it any more */
    free(c);
}

void ps_client_interrupt(ps_client_t *c)
{
    if (c == NULL) return;
    __atomic_store_n(&c->interrupted, 1, __ATOMIC_RELEASE);
    uv_async_send(&c->wake); /* async-signal-safe */
}

int ps_client_direct(const ps_client_t *c, uint32_t shard)
{
    if (shard >= c->nshards) return 0;
    const cshard_t *s = &c->shards[shard];
    return (__atomic_load_n(&s->view_open, __ATOMIC_RELAXED) ? PS_DIRECT_PULLS : 0) |
           (__atomic_load_n(&s->area, __ATOMIC_RELAXED) ? PS_DIRECT_PUSHES : 0);
}

int ps_client_rank(const ps_client_t *c) { return c->rank; }
int ps_client_leads(const ps_client_t *c) { return __atomic_load_n(&c->leads, __ATOMIC_RELAXED); }
uint32_t ps_client_workers(const ps_client_t *c) { return c->workers; }
uint64_t ps_client_join_step(const ps_client_t *c) { return c->join_step; }
int ps_client_refused_back(const ps_client_t *c)
{
    return c ? __atomic_load_n(&c->refused_back, __ATOMIC_RELAXED) : 0;
}
uint32_t ps_client_shards(const ps_client_t *c) { return c->nshards; }
const char *ps_client_error(const ps_client_t *c) { return c ? c->err : "no client (NULL)"; }

void ps_client_stats(const ps_client_t *c, ps_client_stats_t *out)
{
    out->bytes_pushed = __atomic_load_n(&c->stats.bytes_pushed, __ATOMIC_RELAXED);
    out->bytes_pulled = __atomic_load_n(&c->stats.bytes_pulled, __ATOMIC_RELAXED);
    out->bytes_pushed_raw = __atomic_load_n(&c->stats.bytes_pushed_raw, __ATOMIC_RELAXED);
    out->pushes = __atomic_load_n(&c->stats.pushes, __ATOMIC_RELAXED);
    out->pulls = __atomic_load_n(&c->stats.pulls, __ATOMIC_RELAXED);
    out->bytes_pulled_direct = __atomic_load_n(&c->stats.bytes_pulled_direct, __ATOMIC_RELAXED);
    out->bytes_pushed_direct = __atomic_load_n(&c->stats.bytes_pushed_direct, __ATOMIC_RELAXED);
}

uint64_t ps_client_nonfinite_pushes(const ps_client_t *c)
{
    return __atomic_load_n(&c->nonfinite_pushes, __ATOMIC_RELAXED);
}

/* Whether every shard leaves a push holding a NaN or an infinity out (its hello reply said
 * PS_FLAG_NONFINITE): only then may a chunk int8 or sign cannot encode go as fp32. */
/* chunk_elems NaNs, made once per client (the payload of a chunk a device marked as not
 * finite); NULL without memory. */
static const float *nan_chunk(ps_client_t *c)
{
    float *have = __atomic_load_n(&c->nan_chunk, __ATOMIC_ACQUIRE);
    if (have) return have;
    float *mine = malloc(c->chunk_elems * sizeof *mine);
    if (mine == NULL) return NULL;
    for (uint64_t i = 0; i < c->chunk_elems; i++) mine[i] = NAN;
    if (__atomic_compare_exchange_n(&c->nan_chunk, &have, mine, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        return mine;
    free(mine); /* another thread's came first */
    return have;
}

static int all_leave_nonfinite(const ps_client_t *c)
{
    for (uint32_t sh = 0; sh < c->nshards; sh++)
        if (!__atomic_load_n(&c->shards[sh].leaves_nonfinite, __ATOMIC_ACQUIRE)) return 0;
    return 1;
}

/* Tensor @p t's residual once the push that carried it (fold 2) was waited for: freed (the
 * caller's thread, no push of @p t in flight). */
static void fold_done(ctensor_t *t)
{
    if (t->fold != 2 || t->busy[0]) return;
    free(t->residual);
    t->residual = NULL;
    t->fold = 0;
}

/* r[n] += g[n] if every sum is finite (true); else r unchanged (false). */
static bool fold_into(float *restrict r, const float *restrict g, size_t n)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) { /* as psk_all_finite, of the sums */
        float x = r[i] + g[i];
        uint32_t b;
        memcpy(&b, &x, 4);
        bad |= (uint32_t)((b & 0x7f800000u) == 0x7f800000u);
    }
    if (bad) return false;
    for (size_t i = 0; i < n; i++) r[i] += g[i];
    return true;
}

static int data_op(ps_client_t *c, int type, uint32_t id, float *buf, uint64_t step,
                   ps_push_encoder_t enc, void *enc_arg, ps_op_t **out)
{
    if (c == NULL) return PS_EINVAL;
    bool nograd = type == OP_PUSH_NONE;
    if (nograd) {
        type = OP_PUSH;
        if (c->m.job.consistency != PS_CONSIST_BSP) {
            snprintf(c->err, sizeof c->err, "push_none of tensor %u: only under bsp (where a "
                     "step waits for every member's push); under asp / ssp push nothing", id);
            return PS_EINVAL;
        }
    }
    if ((buf == NULL && !nograd && enc == NULL) || out == NULL) {
        snprintf(c->err, sizeof c->err, "%s of tensor %u: %s is NULL", ps__op_name(type), id,
                 buf == NULL ? (type == OP_PUSH ? "the gradient" : "the destination") : "op");
        return PS_EINVAL;
    }
    if (id >= PS_CLIENT_MAX_TENSORS || c->tensors[id] == NULL || c->tensors[id]->nchunks == 0) {
        snprintf(c->err, sizeof c->err, "tensor %u was not declared by this client", id);
        return PS_EINVAL;
    }
    ctensor_t *t = c->tensors[id];
    if (enc != NULL && t->codec.kind == PSK_CODEC_NONE) {
        snprintf(c->err, sizeof c->err, "encoded push of tensor %u: it has no codec (push the "
                 "gradient itself)", id);
        return PS_EINVAL;
    }
    if (type == OP_PUSH && t->busy[0]) {
        snprintf(c->err, sizeof c->err, "tensor %u: a push of it is in flight; wait for it "
                 "before pushing it again", id);
        return PS_EBUSY;
    }
    if (type == OP_PULL && t->busy[1] && t->pull_codec.kind != PSK_CODEC_NONE) {
        snprintf(c->err, sizeof c->err, "tensor %u: a compressed pull of it is in flight (they "
                 "land in one buffer); wait for it first", id);
        return PS_EBUSY;
    }
    ps_op_t *op = ps__op_reuse(c, &t->spare[type == OP_PULL], type, t->nchunks);
    if (op == NULL) {
        snprintf(c->err, sizeof c->err, "tensor %u: out of memory for a %s", id,
                 ps__op_name(type));
        return PS_ENOMEM;
    }
    op->tensor = id;
    op->buf = buf;
    op->step = step;
    op->nograd = nograd;
    /* What error feedback had not sent when it was turned off goes with this push: the
     * chunks are made from residual + gradient (kept in the residual until waited for). Not
     * with a gradient holding a NaN or an infinity (psd would leave the sums out too): the
     * next push then. */
    const float *src = buf;
    if (type == OP_PUSH) fold_done(t);
    if (type == OP_PUSH && !nograd && enc == NULL && t->fold == 1 &&
        fold_into(t->residual, buf, t->numel)) {
        src = t->residual;
        t->fold = 2;
    }
    /* A NaN or an infinity int8 or sign cannot encode: a chunk holding one goes as fp32 where
     * every shard leaves such a push out (below); else the push is refused whole. */
    if (type == OP_PUSH && !nograd && enc == NULL && t->error_feedback &&
        psk_codec_needs_finite(&t->codec) && !all_leave_nonfinite(c) &&
        !psk_all_finite(buf, t->numel)) {
        /* Checked whole before any chunk is encoded: an encoded chunk's residual already
         * counts its payload as sent. */
        snprintf(c->err, sizeof c->err, "tensor %u: the gradient holds a NaN or an infinity, "
                 "which its codec cannot encode: push refused (nothing sent; the error-feedback "
                 "residual unchanged)", id);
        free(op);
        return PS_EINVAL;
    }
    for (uint32_t i = 0; i < t->nchunks; i++) {
        part_t *p = &op->parts[i];
        p->chunk = i;
        p->shard = ps_place_shard(t->first_chunk + i, c->nshards);
        p->raw = 0;
        p->unsummed = 0;
        if (type != OP_PUSH || nograd) continue; /* nograd: no data, len 0 */
        size_t n = ps_chunk_len(t->numel, c->chunk_elems, i);
        const float *g = enc == NULL ? src + (uint64_t)i * c->chunk_elems : NULL;
        if (t->codec.kind == PSK_CODEC_NONE) {
            p->data = g;
            p->len = n * 4; /* its CRC-32C: at its first send (send_data_part) */
            continue;
        }
        /* Compress on the caller's thread, before the gradient leaves. */
        psk_codec_t cc = t->codec;
        cc.seed = psk_codec_push_seed(step, t->seed_key, i);
        uint8_t *out = t->payload + (size_t)i * t->chunk_cap;
        int rc;
        if (enc != NULL) {
            /* The caller's encoder (a device's), checked as psd will check it. */
            p->len = 0;
            rc = enc(enc_arg, id, i, (uint64_t)i * c->chunk_elems, n, &cc, t->error_feedback,
                     out, t->chunk_cap, &p->len);
            if (rc == 0 && p->len >= 1 && p->len <= t->chunk_cap && out[0] == 0xff &&
                psk_codec_needs_finite(&cc) && all_leave_nonfinite(c)) {
                /* The device's mark of a chunk holding a NaN or an infinity, which int8 or
                 * sign cannot encode (its residual left as it was, codec.h): sent as fp32 NaNs
                 * for the shards to leave out, as the host path sends such a chunk. Before,
                 * the push was refused and psworker --device cuda exited (a review, session
                 * 71). */
                const float *nan = nan_chunk(c);
                if (nan == NULL) {
                    snprintf(c->err, sizeof c->err, "out of memory");
                    free(op);
                    return PS_ENOMEM;
                }
                p->raw = 1;
                p->data = nan;
                p->len = n * 4;
                continue;
            }
            char why[160] = "longer than the chunk's room";
            if (rc == 0 && (p->len > t->chunk_cap ||
                            psk_codec_check_why(out, p->len, n, &cc, why, sizeof why))) {
                snprintf(c->err, sizeof c->err, "chunk %u of tensor %u: the encoder's payload "
                         "is not a valid one of its codec: %s%s", i, id, why,
                         out[0] == 0xff ? " (the device marks a chunk holding a NaN or an "
                                          "infinity, which int8 or sign cannot encode, so)"
                                        : "");
                free(op);
                return PS_EINVAL;
            }
        } else {
            rc = t->error_feedback
                     ? psk_codec_encode_ef_cpu(out, t->chunk_cap, &p->len, g,
                                               t->residual + (uint64_t)i * c->chunk_elems, n, &cc,
                                               t->scratch)
                     : psk_codec_encode_cpu(out, t->chunk_cap, &p->len, g, n, &cc, t->scratch);
            if (rc == PS_EINVAL && psk_codec_needs_finite(&cc) && all_leave_nonfinite(c) &&
                !psk_all_finite(g, n)) {
                /* Refused with the residual as it was: the chunk goes as fp32, and the shard
                 * leaves it out (acknowledged PS_FLAG_NONFINITE). */
                p->raw = 1;
                p->data = g;
                p->len = n * 4;
                continue;
            }
        }
        if (rc) {
            snprintf(c->err, sizeof c->err, "cannot encode chunk %u of tensor %u: %s", i, id,
                     ps_strerror(rc));
            free(op);
            return rc;
        }
        p->data = out;
    }
    t->busy[type == OP_PULL]++;
    ps__submit(c, op);
    *out = op;
    return 0;
}

void ps__ef_put_back(ps_client_t *c, ps_op_t *op, part_t *p)
{
    ctensor_t *t = c->tensors[op->tensor];
    /* Not: one without a gradient, a chunk sent as fp32 (its residual was left as it was). An
     * encoder's push (op->buf NULL: its residual is the caller's) is marked for ps_op_wait. */
    if (t == NULL || !t->error_feedback || t->codec.kind == PSK_CODEC_NONE || op->nograd ||
        p->raw || p->data == NULL)
        return;
    if (op->buf == NULL) {
        p->unsummed = 1;
        return;
    }
    size_t n = ps_chunk_len(t->numel, c->chunk_elems, p->chunk);
    float *r = t->residual + (uint64_t)p->chunk * c->chunk_elems;
    const float *g = op->buf + (uint64_t)p->chunk * c->chunk_elems;
    if (psk_codec_ef_put_back_cpu(r, g, n, p->data, p->len, &t->codec) != 0)
        return; /* not reached: libps encoded it */
    PS_LOG(PS_LOG_DEBUG, "libps", "the push of chunk %u of tensor %u for step %llu was not "
           "summed: its error feedback is back in the residual", p->chunk, t->id,
           (unsigned long long)op->step);
}

int ps_client_set_put_back(ps_client_t *c, uint32_t id, ps_push_put_back_t fn, void *arg)
{
    if (c == NULL || id >= PS_CLIENT_MAX_TENSORS || c->tensors[id] == NULL ||
        c->tensors[id]->nchunks == 0) {
        if (c) snprintf(c->err, sizeof c->err, "tensor %u was not declared by this client", id);
        return PS_EINVAL;
    }
    c->tensors[id]->put_back = fn;
    c->tensors[id]->put_back_arg = arg;
    return 0;
}

int ps_client_residual(ps_client_t *c, uint32_t id, float *out)
{
    if (c == NULL || out == NULL || id >= PS_CLIENT_MAX_TENSORS || c->tensors[id] == NULL ||
        c->tensors[id]->nchunks == 0) {
        if (c) snprintf(c->err, sizeof c->err, "tensor %u was not declared by this client", id);
        return PS_EINVAL;
    }
    ctensor_t *t = c->tensors[id];
    if (!t->error_feedback || t->residual == NULL) {
        snprintf(c->err, sizeof c->err, "tensor %u has no error feedback", id);
        return PS_EINVAL;
    }
    if (t->busy[0]) {
        snprintf(c->err, sizeof c->err, "tensor %u: a push of it is in flight; wait for it "
                 "before reading its residual", id);
        return PS_EBUSY;
    }
    memcpy(out, t->residual, t->numel * sizeof *out);
    return 0;
}

int ps_client_set_compression(ps_client_t *c, uint32_t id, const ps_compression_t *cfg)
{
    const char *codec = cfg->codec, *pull_codec = cfg->pull;
    int error_feedback = cfg->error_feedback;
    if (id >= PS_CLIENT_MAX_TENSORS || c->tensors[id] == NULL || c->tensors[id]->nchunks == 0) {
        snprintf(c->err, sizeof c->err, "tensor %u was not declared by this client", id);
        return PS_EINVAL;
    }
    ctensor_t *t = c->tensors[id];
    if (t->busy[0] || t->busy[1]) {
        snprintf(c->err, sizeof c->err, "tensor %u: a push or pull of it is in flight; wait for "
                 "it before changing its compression", id);
        return PS_EBUSY;
    }
    psk_codec_t pc, pl;
    if (psk_codec_parse(&pc, codec ? codec : "none")) {
        snprintf(c->err, sizeof c->err, "unknown codec '%s'", codec);
        return PS_EINVAL;
    }
    if (cfg->field_mask & PS_COMPRESSION_BLOCK) {
        if (cfg->block == 0) {
            snprintf(c->err, sizeof c->err, "codec block size must be at least 1");
            return PS_EINVAL;
        }
        pc.block = cfg->block;
    }
    if (cfg->field_mask & PS_COMPRESSION_STOCHASTIC) pc.stochastic = cfg->stochastic != 0;
    if (cfg->field_mask & PS_COMPRESSION_FP16_VALUES) pc.fp16_values = cfg->fp16_values != 0;
    bool fed = pc.kind != PSK_CODEC_NONE && error_feedback;
    if (t->mean && (!psk_codec_elementwise(pc.kind) || fed)) {
        /* psd sets a mean tensor to the mean of its pushes' values: a sparse or quantized one
         * would zero or flatten them (99 % of a running variance 0 under topk:0.01), and
         * error feedback would add one step's rounding to the next step's values (a review,
         * session 59; psd refuses the codecs too). */
        snprintf(c->err, sizeof c->err, "tensor %u is a mean tensor (its pushes are values): "
                 "it travels raw, fp16 or bf16, without error feedback, not as '%s'%s", id,
                 codec, psk_codec_elementwise(pc.kind) ? " with error feedback" : "");
        return PS_EINVAL;
    }
    if (psk_codec_parse(&pl, pull_codec ? pull_codec : "none") ||
        !psk_codec_elementwise(pl.kind)) {
        snprintf(c->err, sizeof c->err, "parameters travel as none, fp16 or bf16, not '%s'",
                 pull_codec);
        return PS_EINVAL;
    }
    /* Every buffer first, then the tensor changes at once: a failed allocation leaves it as
     * it was (a half-changed one pushed with the old codec into the new buffers). */
    size_t n = t->numel < c->chunk_elems ? t->numel : c->chunk_elems; /* the largest chunk */
    bool push = pc.kind != PSK_CODEC_NONE, pull = pl.kind != PSK_CODEC_NONE;
    size_t cap = push ? psk_codec_max_bytes(&pc, n) : 0;
    size_t scr = push ? psk_codec_scratch_bytes(&pc, n) : 0;
    size_t pull_cap = pull ? psk_codec_max_bytes(&pl, n) : 0;
    uint8_t *payload = push ? ps_buffer_alloc(cap * t->nchunks) : NULL; /* read by the shards */
    void *scratch = scr ? malloc(scr) : NULL;
    /* The residual is fp32 whatever the codec: kept while error feedback stays on (a change
     * of the pull codec, the block, or the push codec dropped what the last pushes carried
     * over: a review, session 59), and when it is turned off, added to the next push (fold;
     * before, a probe found, a switch to none or error_feedback 0 dropped it). */
    fold_done(t);
    bool had = t->residual && (t->error_feedback || t->fold == 1);
    bool keep_res = push && error_feedback && had;
    bool fold = !(push && error_feedback) && had && !t->mean;
    float *res = push && error_feedback && !keep_res ? calloc(t->numel, sizeof *res) : NULL;
    uint8_t *pull_buf = pull ? malloc(pull_cap * t->nchunks) : NULL;
    if ((push && !payload) || (scr && !scratch) || (push && error_feedback && !keep_res && !res) ||
        (pull && !pull_buf)) {
        ps_buffer_free(payload, cap * t->nchunks);
        free(scratch);
        free(res);
        free(pull_buf);
        snprintf(c->err, sizeof c->err, "tensor %u: out of memory for its compression buffers "
                 "(its compression is unchanged)", id);
        return PS_ENOMEM;
    }
    if (!keep_res && !fold) {
        free(t->residual);
        t->residual = res;
    }
    t->fold = fold;
    if (push) {
        ps_buffer_free(t->payload, t->chunk_cap * t->nchunks);
        free(t->scratch);
        t->payload = payload;
        t->scratch = scratch;
        t->chunk_cap = cap;
    }
    if (pull) {
        free(t->pull_buf);
        t->pull_buf = pull_buf;
        t->pull_cap = pull_cap;
    }
    t->codec = pc;
    t->error_feedback = error_feedback && push;
    t->pull_codec = pl;
    return 0;
}

int ps_client_use_job_compression(ps_client_t *c, uint32_t id, const char *name)
{
    if (c == NULL || name == NULL) return PS_EINVAL;
    if (id >= PS_CLIENT_MAX_TENSORS || c->tensors[id] == NULL || c->tensors[id]->nchunks == 0) {
        snprintf(c->err, sizeof c->err, "tensor %u was not declared by this client", id);
        return PS_EINVAL;
    }
    /* As psworker: the first rule matching the name, else none below min_bytes, else the
     * job's codec. A mean tensor's pushes are its values: none (as psd.torch does). */
    if (c->tensors[id]->mean) return 0;
    const ps_compression_conf_t *cc = &c->m.job.compression;
    ps_compression_t comp = {
        .field_mask = PS_COMPRESSION_BLOCK | PS_COMPRESSION_STOCHASTIC | PS_COMPRESSION_FP16_VALUES,
        .codec = ps_compression_codec_for(cc, name, c->tensors[id]->numel * 4),
        .error_feedback = cc->error_feedback, .pull = cc->pull, .block = cc->block,
        .stochastic = cc->stochastic, .fp16_values = cc->fp16_values};
    return ps_client_set_compression(c, id, &comp);
}

void ps_client_batch_done(ps_client_t *c, const ps_batch_info_t *done)
{
    if (c->held_reported && same_batch(done, &c->held)) return; /* said already */
    c->leave_done = *done;
    c->has_leave_done = 1;
}

static int batch_taken(ps_client_t *c, uint64_t samples, const ps_msg_t *r,
                       ps_batch_info_t *out);

/* The batch request's fields that every one carries: the checks shard 0 makes of a worker's
 * job settings (psd_coord_on_batch). */
static ps_msg_t batch_request(const ps_client_t *c, uint64_t samples)
{
    return (ps_msg_t){.type = PS_MSG_BATCH, .rank = c->rank, .samples = samples,
                      .tensor_set = psk_mix64(c->tensor_set) | 1, .count = c->ntensor_set,
                      .job_seed1 = c->m.job.seed + 1, .job_batch = c->m.job.batch_size};
}

/* @p req reports @p done (PS_FLAG_DONE). */
static void batch_request_done(ps_client_t *c, ps_msg_t *req, const ps_batch_info_t *done)
{
    req->flags |= PS_FLAG_DONE | stale_flag(c, done->step);
    req->step = done->step;
    req->data_epoch = done->pass;
    req->batch_offset = done->offset;
    req->batch_count = done->count;
}

int ps_client_report_done(ps_client_t *c, uint64_t samples, const ps_batch_info_t *done)
{
    if (c == NULL) return PS_EINVAL;
    char why[320];
    if (samples == 0 || done == NULL) {
        snprintf(c->err, sizeof c->err, "report done: %s", done == NULL ? "done is NULL"
                 : "a training set of 0 samples has no batch");
        return PS_EINVAL;
    }
    if (c->held_reported && same_batch(done, &c->held)) return 0; /* said already */
    if (done_refused(c, done, why, sizeof why)) {
        snprintf(c->err, sizeof c->err, "report done: %s", why);
        return PS_EINVAL;
    }
    ps_client_batch_done(c, done); /* the leave says it, if this does not */
    if (!__atomic_load_n(&c->shards[0].takes_reports, __ATOMIC_ACQUIRE))
        return 0; /* a psd before session 64: the next request or the leave says it */
    ps_msg_t req = batch_request(c, samples), rep;
    req.flags = PS_FLAG_REPORT;
    batch_request_done(c, &req, done);
    int rc = ps__ctrl_call(c, OP_BATCH, 0, &req, &rep);
    if (rc) return rc; /* kept for the next request or the leave: twice is harmless */
    c->held_reported = 1;
    c->has_leave_done = 0;
    if (!(rep.flags & PS_FLAG_REPORT)) {
        /* An older psd took it for a request (shard 0 was restarted as one while the report
         * was resent: a review, session 64): it counted the batch and handed out the next,
         * which the next ps_client_next_batch returns without asking. */
        c->handed = rep;
        c->has_handed = 1;
        __atomic_store_n(&c->shards[0].takes_reports, 0, __ATOMIC_RELEASE);
    }
    return 0;
}

/* Shard 0 refused this worker's first batch request (another model than the job's, or
 * another training set): give up the tensors it declared. One that only this worker declared
 * was created by its declaration at step 0 and, no member pushing it, would stay there for
 * good under bsp, holding the shards' step and every checkpoint of the job. Shard 0 drops one
 * that no other rank declared and no push reached (server/forget.c); then the other shards
 * theirs. Best effort: the refusal stays this worker's error. */
void ps_client_give_up(ps_client_t *c)
{
    if (c == NULL || !__atomic_load_n(&c->shards[0].knows_values, __ATOMIC_ACQUIRE))
        return; /* an older psd: it would not answer (server/forget.c is of session 36) */
    char err[sizeof c->err];
    memcpy(err, c->err, sizeof err);
    uint32_t dropped = 0, kept = 0;
    for (uint32_t id = 0; id < PS_CLIENT_MAX_TENSORS; id++) {
        if (c->tensors[id] == NULL || c->tensors[id]->nchunks == 0) continue;
        /* Shard 0 is asked whether it would, the others drop their chunks, shard 0 last. */
        ps_msg_t q = {.type = PS_MSG_FORGET, .rank = c->rank, .tensor = id,
                      .flags = PS_FLAG_CHECK}, r;
        if (ps__ctrl_call(c, OP_FORGET, 0, &q, &r) != 0 || !(r.flags & PS_FLAG_DONE)) {
            kept++;
            continue;
        }
        q.flags = 0;
        int rc = 0;
        for (uint32_t i = 1; i < c->nshards && rc == 0; i++) {
            if ((rc = ps__ctrl_call(c, OP_FORGET, i, &q, &r)) != 0 && rc != PS_ENOENT) {
                PS_LOG(PS_LOG_WARN, "libps", "tensor %u not dropped by shard %u: %s", id, i,
                       c->err);
            } else if (rc == 0 && !(r.flags & PS_FLAG_DONE)) {
                /* Kept there: a push reached its chunk. So is the tensor, shard 0's
                 * declaration with it. Before, only an error stopped the drop, and shard 0
                 * (which sees its own chunks only, and a rank, not a process: a worker of
                 * another model given a trained tensor's last declarer's rank) dropped a
                 * trained tensor whose chunks are on other shards; the job's workers were then
                 * refused "declared as id 2 at chunk 2, but it is id 1 at chunk 1" (a helper's
                 * probe, session 48). */
                PS_LOG(PS_LOG_INFO, "libps", "tensor %u kept: shard %u holds pushes of it", id,
                       i);
                rc = PS_EBUSY; /* in use: the loop ends, shard 0 is not asked */
            } else {
                rc = 0;
            }
        }
        if (rc == 0 && ps__ctrl_call(c, OP_FORGET, 0, &q, &r) == 0 && (r.flags & PS_FLAG_DONE))
            dropped++;
        else
            kept++;
    }
    if (dropped)
        PS_LOG(PS_LOG_INFO, "libps", "gave up the tensors this worker declared: %u only it had "
               "declared were dropped, %u kept (the job's)", dropped, kept);
    memcpy(c->err, err, sizeof err);
}

int ps_client_next_batch(ps_client_t *c, uint64_t samples, const ps_batch_info_t *done,
                         ps_batch_info_t *out)
{
    if (c == NULL) return PS_EINVAL;
    if (samples == 0 || out == NULL) {
        snprintf(c->err, sizeof c->err, "next batch: %s", out == NULL ? "out is NULL"
                 : "a training set of 0 samples has no batch");
        return PS_EINVAL;
    }
    /* With the set of tensors declared: under bsp each step waits for every member's push of
     * every tensor a member pulls, so a member with another model would hold the job for good;
     * shard 0 refuses it instead (never 0: 0 is "not sent", from an older libps). */
    /* With the job settings that decide what a batch's offsets name on this worker: its seed
     * (each pass's order) and batch_size (the most samples it takes); shard 0 refuses others
     * than the job's (a probe, session 61: a worker of another seed trained other samples
     * without a word, one of a smaller batch_size wrote past its buffers). */
    ps_msg_t req = batch_request(c, samples), rep;
    char why[320];
    if (done && c->held_reported && same_batch(done, &c->held))
        done = NULL; /* ps_client_report_done said it */
    if (c->has_handed && done == NULL) { /* an older psd handed it out for a report */
        c->has_handed = 0;
        return batch_taken(c, samples, &c->handed, out);
    }
    if (done && done_refused(c, done, why, sizeof why)) {
        snprintf(c->err, sizeof c->err, "next batch: %s", why);
        return PS_EINVAL;
    }
    if (done) batch_request_done(c, &req, done);
    int rc = ps__ctrl_call(c, OP_BATCH, 0, &req, &rep);
    if (rc == PS_ECONFIG && done == NULL && !c->had_batch) ps_client_give_up(c);
    if (rc) return rc; /* a batch done stays for the leave: reporting it twice is harmless */
    return batch_taken(c, samples, &rep, out);
}

/* Shard 0's batch reply @p rep to a request (or a report an older psd took for one) naming a
 * training set of @p samples: this client holds its batch, @p out. */
static int batch_taken(ps_client_t *c, uint64_t samples, const ps_msg_t *r, ps_batch_info_t *out)
{
    ps_msg_t rep = *r;
    /* Only a request shard 0 took: the leave reports a batch done under the training set's
     * size, and one refused (another size: ECONFIG) would make shard 0 drop that report. */
    c->batch_samples = samples;
    __atomic_store_n(&c->had_batch, 1, __ATOMIC_RELEASE); /* ps__on_rehello reads it */
    c->has_leave_done = 0; /* reported, or superseded by the batch handed out now */
    *out = (ps_batch_info_t){.step = rep.step, .pass = rep.data_epoch,
                             .offset = rep.batch_offset, .count = rep.batch_count,
                             .members = (uint32_t)__builtin_popcountll(rep.members),
                             .epoch = rep.epoch, .finished = (rep.flags & PS_FLAG_FINISHED) != 0};
    c->held = *out;
    c->has_held = !out->finished;
    c->held_reported = 0;
    c->held_acked = c->acked_pushes;
    if (!out->finished && out->count == 0) {
        snprintf(c->err, sizeof c->err, "shard 0 handed out an empty batch");
        return PS_EPROTO;
    }
    /* Samples [offset, offset + count) index the caller's training set and fill buffers of
     * its job.batch_size: a batch larger (an older shard 0's, of another batch_size) or past
     * the set's end (a coordinator whose stored cursor was damaged) made psworker write or
     * read past them (SIGSEGV; an operator probe and a probe of damaged stores, session 61). */
    if (!out->finished && out->count > c->m.job.batch_size) {
        snprintf(c->err, sizeof c->err, "shard 0 handed out a batch of %u samples; this "
                 "manifest's job.batch_size is %u (the job was made with another batch_size: a "
                 "new batch_size is a new job, in empty data_dirs)", out->count,
                 c->m.job.batch_size);
        return PS_ECONFIG;
    }
    if (!out->finished && (out->offset >= samples || out->count > samples - out->offset)) {
        snprintf(c->err, sizeof c->err, "shard 0 handed out samples %llu to %llu of a training "
                 "set of %llu (its job state is damaged?)", (unsigned long long)out->offset,
                 (unsigned long long)out->offset + out->count - 1, (unsigned long long)samples);
        return PS_EPROTO;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int ps_client_self_test(ps_client_t *c, uint32_t shard, size_t bytes, int reps, double *gbps,
                        char *lanes, size_t lanes_len)
{
    if (shard >= c->nshards || bytes == 0 || bytes > (64u << 20) || reps < 1 || reps > 1000000) {
        snprintf(c->err, sizeof c->err, "self-test: shard %u, %zu bytes, %d reps: out of range",
                 shard, bytes, reps);
        return PS_EINVAL;
    }
    if (c->group_head) ps_client_group_end_all(c); /* held ops first, as the header says */
    float *buf = calloc(1, bytes);
    if (buf == NULL) {
        snprintf(c->err, sizeof c->err, "self-test: out of memory for %zu bytes", bytes);
        return PS_ENOMEM;
    }
    int rc = 0;
    double t0 = 0;
    for (int i = 0; i <= reps && rc == 0; i++) { /* the first one warms the path up */
        if (i == 1) t0 = now_s();
        ps_op_t *op = ps__op_reuse(c, &c->ctrl_spare, OP_ECHO, 1);
        if (op == NULL) {
            rc = PS_ENOMEM;
            break;
        }
        op->parts[0].shard = shard;
        op->buf = buf;
        op->req = (ps_msg_t){.type = PS_MSG_ECHO, .req_id = op->req_id, .rank = c->rank,
                             .length = bytes};
        ps__submit(c, op);
        rc = ps_op_wait(op, NULL);
    }
    double secs = now_s() - t0;
    free(buf);
    if (rc) return rc;
    *gbps = secs > 0 ? (double)bytes * reps / secs / 1e9 : 0;
    if (lanes) ps_client_lanes(c, shard, lanes, lanes_len);
    return 0;
}

int ps_client_lanes(ps_client_t *c, uint32_t shard, char *out, size_t len)
{
    if (out && len) out[0] = '\0';
    if (c == NULL || (out == NULL && len)) return PS_EINVAL;
    if (shard >= c->nshards) {
        snprintf(c->err, sizeof c->err, "lanes: shard %u: the cluster has shards 0..%u", shard,
                 c->nshards - 1);
        return PS_EINVAL;
    }
    pthread_mutex_lock(&c->mu); /* the comm thread rewrites it after a reconnect */
    if (len) snprintf(out, len, "%s", c->shards[shard].lanes);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

int ps_client_push(ps_client_t *c, uint32_t id, const float *grad, uint64_t step, ps_op_t **op)
{
    return data_op(c, OP_PUSH, id, (float *)grad, step, NULL, NULL, op); /* only read */
}

int ps_client_push_none(ps_client_t *c, uint32_t id, uint64_t step, ps_op_t **op)
{
    return data_op(c, OP_PUSH_NONE, id, NULL, step, NULL, NULL, op);
}

int ps_client_pull(ps_client_t *c, uint32_t id, float *dst, uint64_t min_version, ps_op_t **op)
{
    return data_op(c, OP_PULL, id, dst, min_version, NULL, NULL, op);
}

/* @p n data ops of @p type (a NULL buffer of a push: its push_none) as one group. */
static int data_many(ps_client_t *c, int type, uint32_t n, const uint32_t *ids,
                     float *const *bufs, uint64_t step, ps_op_t **ops)
{
    if (c == NULL) return PS_EINVAL;
    if (n && (ids == NULL || bufs == NULL || ops == NULL)) {
        snprintf(c->err, sizeof c->err, "%s of %u tensors: %s is NULL", ps__op_name(type), n,
                 ids == NULL ? "ids" : bufs == NULL ? "the buffers" : "ops");
        return PS_EINVAL;
    }
    for (uint32_t i = 0; i < n; i++) ops[i] = NULL;
    int rc = 0;
    ps_client_group_begin(c);
    for (uint32_t i = 0; i < n && rc == 0; i++)
        rc = data_op(c, type == OP_PUSH && bufs[i] == NULL ? OP_PUSH_NONE : type, ids[i],
                     bufs[i], step, NULL, NULL, &ops[i]);
    ps_client_group_end(c);
    return rc;
}

int ps_client_push_many(ps_client_t *c, uint32_t n, const uint32_t *ids,
                        const float *const *bufs, uint64_t step, ps_op_t **ops)
{
    return data_many(c, OP_PUSH, n, ids, (float *const *)bufs, step, ops); /* only read */
}

int ps_client_pull_many(ps_client_t *c, uint32_t n, const uint32_t *ids, float *const *dsts,
                        uint64_t min_version, ps_op_t **ops)
{
    return data_many(c, OP_PULL, n, ids, dsts, min_version, ops);
}

int ps_op_wait_many(uint32_t n, ps_op_t **ops, uint64_t *versions, int *statuses)
{
    if (n && ops == NULL) return PS_EINVAL;
    int first = 0;
    ps_client_t *failed = NULL;
    char err[sizeof failed->err];
    for (uint32_t i = 0; i < n; i++) {
        ps_client_t *c = ops[i] ? ops[i]->c : NULL;
        if (versions) versions[i] = 0; /* a NULL op's too (a review: left unwritten) */
        int rc = ops[i] ? ps_op_wait(ops[i], versions ? &versions[i] : NULL) : 0;
        ops[i] = NULL;
        if (statuses) statuses[i] = rc;
        if (rc && first == 0) {
            first = rc;
            failed = c;
            memcpy(err, c->err, sizeof err);
        }
    }
    if (failed) memcpy(failed->err, err, sizeof err); /* the first failure's reason */
    return first;
}

int ps_client_push_encoded(ps_client_t *c, uint32_t id, uint64_t step, ps_push_encoder_t enc,
                           void *arg, ps_op_t **op)
{
    if (c != NULL && enc == NULL) {
        snprintf(c->err, sizeof c->err, "encoded push of tensor %u: the encoder is NULL", id);
        return PS_EINVAL;
    }
    return data_op(c, OP_PUSH, id, NULL, step, enc, arg, op);
}

