/* client.c: libps's communication thread (the modules: client_internal.h). It runs the UCP
 * worker and a libuv loop; the caller's thread submits operations through a locked queue (and
 * an async handle when the comm thread sleeps) and waits on a condition variable, or, for a
 * small operation, drives the worker itself meanwhile (op_wait_done, client_api.c). What the
 * sections below call "comm thread" code runs under loop_mu: on the comm thread, or on a
 * caller driving the worker. */
#include "client_internal.h"

/* ---- comm thread: the timeline (PS_TRACE) ---------------------------------- */

/* Lanes of a libps trace: what an op moves. */
enum { TLANE_PUSH = 1, TLANE_PULL = 2, TLANE_CTRL = 3 };

const char *ps__op_name(int type)
{
    static const char *const names[] = {"?",     "hello", "declare", "push",   "pull", "leave",
                                        "shutdown", "batch", "echo", "forget", "values"};
    return type > 0 && type <= OP_VALUES ? names[type] : "?";
}

static int op_lane(int type)
{
    return type == OP_PUSH ? TLANE_PUSH : type == OP_PULL ? TLANE_PULL : TLANE_CTRL;
}

/* The op's span, from the hand-over to the comm thread to now (its completion): written before
 * the caller may free it. Pushes and pulls name their tensor and step and count their chunks
 * and the chunks that went directly (through the shard's shared memory). */
static void trace_op(ps_client_t *c, const ps_op_t *op)
{
    uint64_t now = mono_ns();
    uint32_t direct = 0;
    char name[32], args[96];
    if (op->type == OP_PUSH || op->type == OP_PULL)
        snprintf(name, sizeof name, "%s %u", ps__op_name(op->type), op->tensor);
    else
        snprintf(name, sizeof name, "%s", ps__op_name(op->type));
    for (uint32_t i = 0; i < op->nparts; i++) direct += op->parts[i].ck.went_direct;
    snprintf(args, sizeof args, "{\"step\":%" PRIu64 ",\"chunks\":%u,\"direct\":%u,\"ok\":%s}",
             op->step, op->nparts, direct, op->status == 0 ? "true" : "false");
    ps_trace_span(c->trace, op_lane(op->type), "op", name,
                  op->submit_ns && op->submit_ns <= now ? op->submit_ns : now, now, args);
}

/* ---- comm thread: completion ---------------------------------------------- */

/* Set op->done (release: the caller may read the op's results without the lock once it sees
 * it) and wake the caller if it sleeps; a caller still spinning in op_wait_done needs no
 * futex wake. */
static void op_publish_done(ps_op_t *op)
{
    ps_client_t *c = op->c;
    op->done_ns = mono_ns();
    pthread_mutex_lock(&c->mu);
    __atomic_store_n(&op->done, 1, __ATOMIC_RELEASE);
    if (c->sleepers) pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Completion is the last thing the comm thread does with an op: once done is
 * set, the caller's thread may free it. So ps__op_fail and ps__part_done only record,
 * and every comm-thread entry point calls ps__op_maybe_complete as its final use. */
void ps__op_maybe_complete(ps_op_t *op)
{
    if (op->remaining > 0 || op->ucx_refs > 0 || op->done) return;
    ps_client_t *c = op->c;
    for (ps_op_t **pp = &c->inflight; *pp; pp = &(*pp)->next)
        if (*pp == op) {
            *pp = op->next;
            break;
        }
    if (c->trace && op->type != OP_SHUTDOWN) trace_op(c, op);
    if (op->on_done) {
        op->done = 1;
        op->on_done(op);
        free(op);
        return;
    }
    op_publish_done(op);
}

void ps__op_fail(ps_op_t *op, int status, const char *fmt, ...)
{
    if (op->status == 0) {
        op->status = status;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(op->err, sizeof op->err, fmt, ap);
        va_end(ap);
    }
    for (uint32_t i = 0; i < op->nparts; i++)
        if (op->parts[i].pending) {
            op->parts[i].pending = 0;
            op->remaining--;
        }
}

/* An instant on @p p's op's lane of the timeline (PS_TRACE): "WHAT T/C" with @p args (JSON). */
static void trace_chunk(ps_client_t *c, const part_t *p, const char *what, const char *args)
{
    char name[40];
    snprintf(name, sizeof name, "%s %u/%u", what, p->op->tensor, p->chunk);
    ps_trace_instant(c->trace, op_lane(p->op->type), name, mono_ns(), args);
}

void ps__part_done(part_t *p)
{
    if (!p->pending) return;
    p->pending = 0;
    p->op->remaining--;
    p->ck.went_direct = p->ck.direct;
    ps_client_t *c = p->op->c;
    if (c->trace && (p->op->type == OP_PUSH || p->op->type == OP_PULL)) {
        /* A push's chunk acknowledged, a pull's chunk here. */
        char args[64];
        snprintf(args, sizeof args, "{\"shard\":%u,\"direct\":%s,\"ok\":%s}", p->shard,
                 p->ck.direct ? "true" : "false", p->op->status == 0 ? "true" : "false");
        trace_chunk(c, p, p->op->type == OP_PUSH ? "acked" : "landed", args);
    }
}

/* Every part of @p op bound for shard @p shard is done (a leave's answer). */
static void parts_done_on_shard(ps_op_t *op, uint32_t shard)
{
    for (uint32_t i = 0; i < op->nparts; i++)
        if (op->parts[i].shard == shard) ps__part_done(&op->parts[i]);
}

/* A part whose transport failed waits for its shard to come back, once the client has
 * joined, if it is a push, a pull, a batch request or a declaration (psd takes a tensor's
 * second declaration as the first, so sending one again is safe); anything else fails.
 * @p gen is the connection (cshard_t.ep_gen) the failed request was on: a connection's that
 * was replaced since (its close left to finish in the background) says nothing of the new
 * one, which took the part already (ps__on_rehello) or takes it now (ck.again: ps__on_rehello left
 * it to the old request's end). Returns 1 if the part will be sent again. */
static int part_defer(ps_client_t *c, part_t *p, uint32_t gen)
{
    if (!__atomic_load_n(&c->joined, __ATOMIC_ACQUIRE) || !p->pending ||
        c->shards[p->shard].gone ||
        (p->op->type != OP_PUSH && p->op->type != OP_PULL && p->op->type != OP_BATCH &&
         p->op->type != OP_DECLARE))
        return 0;
    cshard_t *s = &c->shards[p->shard];
    if (gen != s->ep_gen && s->ep && !s->down && !s->dead) {
        if (p->ck.again && !p->ck.sending) {
            p->ck.again = 0;
            ps__part_send_again(c, p->op, p);
        }
        return 1;
    }
    p->resend = 1;
    if (!s->down && !s->dead) { /* the endpoint broke before UCX told us */
        s->dead = 1;
        s->close_queued = 1;
    }
    return 1;
}

/* A part whose send failed or whose shard was lost, unless it fails its op: a leave's part is
 * done (that shard drops this worker when the connection closes; the leave's other shards still
 * get theirs), and one that can wait for its shard waits (part_defer), unless @p give_up.
 * Returns 1 if the op goes on without failing. */
int ps__part_spared(ps_client_t *c, part_t *p, int give_up, uint32_t gen)
{
    if (p->op->type == OP_LEAVE) {
        ps__part_done(p);
        return 1;
    }
    return !give_up && part_defer(c, p, gen);
}

static void send_data_part(ps_client_t *c, ps_op_t *op, part_t *p);
static void send_part(ps_client_t *c, part_t *p, const ps_msg_t *m, const void *data, size_t len,
                      unsigned am_id);

/* Send part @p p of @p op again: a control op's request as it was, a push or pull as
 * send_data_part builds it. */
void ps__part_send_again(ps_client_t *c, ps_op_t *op, part_t *p)
{
    if (op->type == OP_BATCH || op->type == OP_DECLARE || op->type == OP_LEAVE ||
        op->type == OP_FORGET)
        send_part(c, p, &op->req, NULL, 0, PS_AM_CTRL);
    else
        send_data_part(c, op, p);
}

/* A send of @p p completed (in its callback, or at once): its header (and test copy) are free
 * again; a resend that waited for that goes now, and so does the push window's next chunk to
 * the same shard. */
static void part_sent(ps_client_t *c, part_t *p)
{
    ps_op_t *op = p->op;
    p->ck.sending = 0;
    free(p->ck.copy);
    p->ck.copy = NULL;
    if (p->ck.again && p->pending) {
        p->ck.again = 0;
        ps__part_send_again(c, op, p);
    }
    /* Held parts follow every sent one of their shard (ps__start_op holds in index order),
     * whatever the shard's window is now: a reconnect over cma meanwhile (not windowed) left
     * them held for good (a review). */
    if (op->type != OP_PUSH || op->status != 0 || op->held_window == 0) return;
    for (uint32_t i = (uint32_t)(p - op->parts) + 1; i < op->nparts; i++)
        if (op->parts[i].held == HELD_WINDOW && op->parts[i].shard == p->shard) {
            send_data_part(c, op, &op->parts[i]);
            break;
        }
}

/* Part @p p arrived corrupted (the shard answered PS_ECRC, or a pull reply's CRC-32C did not
 * match): send it again, at most PS_CRC_TRIES times in a row, then fail the op. */
static void part_crc_retry(ps_client_t *c, ps_op_t *op, part_t *p, const char *what)
{
    if (++p->ck.tries > PS_CRC_TRIES) {
        ps__op_fail(op, PS_ECRC,
                    "%s of chunk %u of tensor %u (shard %u): CRC-32C mismatch %d times "
                    "in a row; giving up",
                    what, p->chunk, op->tensor, p->shard, p->ck.tries);
        return;
    }
    PS_LOG(PS_LOG_WARN, "libps", "%s of chunk %u of tensor %u (shard %u): CRC-32C mismatch, "
           "sending again (%d of %d)", what, p->chunk, op->tensor, p->shard, p->ck.tries,
           PS_CRC_TRIES);
    if (p->ck.sending)
        p->ck.again = 1;
    else
        send_data_part(c, op, p);
}

/* PS_BEHIND_RETRY_MS after a refusal as ahead of its chunk: each such part is sent again. */
static void on_behind_timer(uv_timer_t *t)
{
    ps_client_t *c = t->data;
    for (ps_op_t *op = c->inflight, *nx; op; op = nx) {
        nx = op->next;
        int touched = 0;
        for (uint32_t i = 0; op->type == OP_PUSH && i < op->nparts; i++) {
            part_t *p = &op->parts[i];
            if (!p->ck.behind) continue;
            p->ck.behind = 0;
            touched = 1;
            if (!p->pending || p->resend) continue; /* done, failed, or waiting for its shard */
            if (p->ck.sending)
                p->ck.again = 1;
            else
                send_data_part(c, op, p);
        }
        if (touched) ps__op_maybe_complete(op); /* a send that failed it */
    }
}

/* Push part @p p was refused because its chunk has not reached the push's step (PS_FLAG_BEHIND:
 * the shard is still at the step before, waiting for a view or for the pushes of members of a
 * step a restarted shard 0 closed): sent again PS_BEHIND_RETRY_MS after each refusal until
 * twice heartbeat_timeout_ms has passed since the first (the shard may wait that long for the
 * coordinator to drop a dead member), then the op fails with @p why. */
static void part_behind_retry(ps_client_t *c, ps_op_t *op, part_t *p, const char *why)
{
    uint64_t now = uv_now(&c->loop) + 1; /* never 0 */
    if (p->ck.behind_ms == 0) {
        p->ck.behind_ms = now;
        PS_LOG(PS_LOG_INFO, "libps", "shard %u: %s: sending it again until it gets there",
               p->shard, why);
    } else if (now - p->ck.behind_ms > 2 * c->m.job.heartbeat_timeout_ms) {
        ps__op_fail(op, PS_ESTALE, "shard %u: %s (for %llu ms)", p->shard, why,
                (unsigned long long)(now - p->ck.behind_ms));
        return;
    }
    p->ck.behind = 1;
    if (!uv_is_active((uv_handle_t *)&c->behind_timer))
        uv_timer_start(&c->behind_timer, on_behind_timer, PS_BEHIND_RETRY_MS, 0);
}

static void on_sent(void *request, ucs_status_t status, void *user_data)
{
    part_t *p = user_data;
    ps_op_t *op = p->op;
    uint32_t gen = p->ck.ep_gen; /* this send's connection, before part_sent sends it again */
    op->ucx_refs--;
    part_sent(op->c, p); /* a part ps__on_rehello left to this completion (ck.again) goes now */
    if (status != UCS_OK && p->pending && !ps__part_spared(op->c, p, 0, gen))
        ps__op_fail(op, ps_ucx_err(status), "send to shard %u failed: %s%s", p->shard,
                ucs_status_string(status), ps_ucx_down_hint(status));
    if (request) ucp_request_free(request);
    ps__op_maybe_complete(op);
}

/* Compressed parameters: dst = decode(payload); a malformed payload fails with @p why (the
 * caller's, 160 bytes) saying what is wrong. */
static int pull_decode(ps_client_t *c, ps_op_t *op, uint32_t chunk, const uint8_t *payload,
                       size_t len, char why[160])
{
    const ctensor_t *t = c->tensors[op->tensor];
    size_t n = ps_chunk_len(t->numel, c->chunk_elems, chunk);
    float *dst = op->buf + (uint64_t)chunk * c->chunk_elems;
    if (psk_codec_check_why(payload, len, n, &t->pull_codec, why, 160)) return PS_EPROTO;
    memset(dst, 0, n * 4);
    psk_codec_decode_add_cpu(dst, n, payload, len, &t->pull_codec, 1.0f);
    return 0;
}

static void on_pull_recv(void *request, ucs_status_t status, size_t length, void *user_data)
{
    part_t *p = user_data;
    ps_op_t *op = p->op;
    ps_client_t *c = op->c;
    const ctensor_t *t = c->tensors[op->tensor];
    char why[160];
    op->ucx_refs--;
    p->ck.receiving = 0;
    ps_tcpguard_done(p->ck.landing);
    if (status == UCS_OK) /* heard (shard_silent): a long transfer delays its heartbeat answers */
        c->shards[p->shard].heard_ms = uv_now(&c->loop);
    if (status != UCS_OK) {
        if (!part_defer(c, p, p->ck.ep_gen))
            ps__op_fail(op, ps_ucx_err(status), "pull data from shard %u lost: %s", p->shard,
                    ucs_status_string(status));
    }
    else if (ps_crc32c(0, t->pull_codec.kind != PSK_CODEC_NONE
                              ? (const void *)(t->pull_buf + p->chunk * t->pull_cap)
                              : (const void *)(op->buf + (uint64_t)p->chunk * c->chunk_elems),
                          length) != p->ck.crc)
        part_crc_retry(c, op, p, "pull");
    else if (t->pull_codec.kind != PSK_CODEC_NONE &&
             pull_decode(c, op, p->chunk, t->pull_buf + p->chunk * t->pull_cap, length, why))
        ps__op_fail(op, PS_EPROTO, "shard %u sent malformed parameters for chunk %u: %s",
                    p->shard, p->chunk, why);
    else {
        __atomic_add_fetch(&op->c->stats.bytes_pulled, length, __ATOMIC_RELAXED);
        ps__part_done(p);
    }
    if (request) ucp_request_free(request);
    ps__op_maybe_complete(op);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    cshard_t *s = arg;
    s->dead = 1;
    s->close_queued = 1;
}

/* ---- comm thread: sending -------------------------------------------------- */

static void bundle_flush(ps_client_t *c, uint32_t i);

static void send_part(ps_client_t *c, part_t *p, const ps_msg_t *m, const void *data, size_t len,
                      unsigned am_id)
{
    ps_op_t *op = p->op;
    cshard_t *s = &c->shards[p->shard];
    if (s->ep == NULL || s->dead || (s->down && op->type != OP_HELLO)) {
        if (ps__part_spared(c, p, 0, s->ep_gen)) return;
        ps__op_fail(op, PS_ETRANSPORT, "shard %u (%s:%u) is not connected", p->shard,
                c->m.servers[p->shard].host, c->m.servers[p->shard].port);
        return;
    }
    if (s->open) bundle_flush(c, p->shard); /* what was bundled for the shard goes first */
    ps_msg_t leave;
    if (m->type == PS_MSG_LEAVE) { /* its last word of the next shard: no heartbeat follows */
        leave = *m;
        ps__floor_of_next(c, p->shard, &leave);
        m = &leave;
    }
    size_t hlen;
    if (ps_msg_encode_sealed(m, s->tok.b, s->tok.len, p->hdr, sizeof p->hdr, &hlen)) {
        ps__op_fail(op, PS_EINVAL, "request header too large");
        return;
    }
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                               UCP_OP_ATTR_FIELD_USER_DATA |
                                               UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_AM_SEND_FLAG_REPLY |
                                        ps_ucx_eager_flag(s->eager_below, len),
                               .cb.send = on_sent, .user_data = p};
    op->ucx_refs++;
    p->ck.sending = 1;
    p->ck.ep_gen = s->ep_gen;
    void *req = ucp_am_send_nbx(s->ep, am_id, p->hdr, hlen, data, len, &prm);
    if (req == NULL || UCS_PTR_IS_ERR(req)) {
        ucs_status_t st = req ? UCS_PTR_STATUS(req) : UCS_OK;
        op->ucx_refs--;
        part_sent(c, p);
        if (st != UCS_OK && p->pending && !ps__part_spared(c, p, 0, s->ep_gen))
            ps__op_fail(op, ps_ucx_err(st), "send to shard %u failed: %s%s", p->shard,
                    ucs_status_string(st), ps_ucx_down_hint(st));
    }
}

/* The signals the client's own threads block (ps_client_create, ps__resolve_start). */
void ps__client_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGHUP);
    sigaddset(set, SIGQUIT);
    sigaddset(set, SIGUSR1);
    sigaddset(set, SIGUSR2);
}

/* Connect to shard @p i at its address known already: the comm thread never waits for a
 * name lookup (with DNS unreachable, getaddrinfo takes seconds, in which no heartbeat went to
 * any shard and the healthy ones dropped this worker). Each attempt looks the name up again
 * in the background (one lookup at a time; the join's and the reconnect's backoff set the
 * pace), so a shard started again elsewhere under its name is reached at a later attempt; a
 * name that did not resolve yet fails the attempt (PS_ECONFIG: the join and the reconnect try
 * again). */
static int connect_shard(ps_client_t *c, uint32_t i)
{
    cshard_t *s = &c->shards[i];
    if (s->ep && !s->dead) return 0;
    const ps_server_conf_t *sc = &c->m.servers[i];
    ps__resolve_start(c, s);
    if (s->addrlen == 0) return PS_ECONFIG;
    s->moved = 0;
    int rc = ps_ucx_connect_addr(&c->ucx, (const struct sockaddr *)&s->addr, s->addrlen,
                                 sc->host, sc->port, on_ep_error, s, &s->ep, &s->tok);
    if (rc == 0) {
        s->dead = 0;
        s->ep_gen++;
        s->heard_ms = uv_now(&c->loop); /* a new connection is not silent yet (shard_silent) */
        /* A heartbeat of the old endpoint whose close was left to finish in the background
         * (ps_ucx_ep_close) may never complete: the new one must not wait for it, or this
         * shard would hear nothing more and drop the worker as silent. */
        s->hb_inflight = 0;
    }
    return rc;
}

/* The PS_TEST_CORRUPT_PUSH hook: every Nth push leaves as a copy with one byte flipped (after
 * its CRC was computed; the caller's data stays intact for the resend). A resend is not
 * corrupted (but with N = 1, every push is): with a few pushes cycling through the counter, the
 * same one could otherwise be hit every time until it gave up (seen once under asp, N = 3). */
const void *ps__test_corrupt_push(ps_client_t *c, part_t *p)
{
    if (c->test_corrupt_push == 0 || p->len == 0 || p->ck.copy != NULL ||
        (p->ck.tries > 0 && c->test_corrupt_push > 1) ||
        ++c->test_push_count % c->test_corrupt_push != 0 ||
        (p->ck.copy = malloc(p->len)) == NULL)
        return p->data;
    memcpy(p->ck.copy, p->data, p->len);
    ((uint8_t *)p->ck.copy)[p->len / 2] ^= 0x10;
    return p->ck.copy;
}

/* ---- comm thread: fusion --------------------------------------------------------- */

/* Put bundle @p b on, or take it off, c->flying. */
void ps__bundle_fly(ps_client_t *c, bundle_t *b, int on)
{
    if (on) {
        b->fly_prev = NULL;
        b->fly_next = c->flying;
        if (c->flying) c->flying->fly_prev = b;
        c->flying = b;
    } else {
        if (b->fly_prev)
            b->fly_prev->fly_next = b->fly_next;
        else
            c->flying = b->fly_next;
        if (b->fly_next) b->fly_next->fly_prev = b->fly_prev;
    }
    b->flying = (uint8_t)on;
}

static void on_bundle_sent(void *request, ucs_status_t status, void *user_data)
{
    bundle_t *b = user_data;
    ps_client_t *c = b->c;
    if (b->flying) ps__bundle_fly(c, b, 0);
    uint32_t n = b->count;
    b->count = 0;
    b->len = 0;
    b->next_free = c->free_bundles; /* reusable now: the parts' data was copied */
    c->free_bundles = b;
    for (uint32_t i = 0; i < n; i++) {
        part_t *p = b->parts[i];
        ps_op_t *op = p->op;
        op->ucx_refs--;
        if (status != UCS_OK && p->pending && !part_defer(c, p, b->ep_gen))
            ps__op_fail(op, ps_ucx_err(status), "send to shard %u failed: %s%s", p->shard,
                    ucs_status_string(status), ps_ucx_down_hint(status));
        ps__op_maybe_complete(op); /* the last use of op: it may be freed from here on */
    }
    if (request) ucp_request_free(request);
}

/* Send shard @p i's open bundle. */
static void bundle_flush(ps_client_t *c, uint32_t i)
{
    cshard_t *s = &c->shards[i];
    bundle_t *b = s->open;
    if (b == NULL) return;
    s->open = NULL;
    ps_msg_t m = {.type = PS_MSG_BUNDLE, .rank = rank_now(c), .count = b->count, .length = b->len};
    size_t hlen;
    ucs_status_t st = UCS_ERR_NOT_CONNECTED;
    void *req = NULL;
    if (s->ep && !s->dead && !s->down &&
        ps_msg_encode_sealed(&m, s->tok.b, s->tok.len, b->hdr, sizeof b->hdr, &hlen) == 0) {
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                                   UCP_OP_ATTR_FIELD_USER_DATA |
                                                   UCP_OP_ATTR_FIELD_FLAGS,
                                   .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER,
                                   .cb.send = on_bundle_sent, .user_data = b};
        b->ep_gen = s->ep_gen;
        req = ucp_am_send_nbx(s->ep, PS_AM_DATA, b->hdr, hlen, b->buf, b->len, &prm);
        st = req == NULL ? UCS_OK : UCS_PTR_IS_ERR(req) ? UCS_PTR_STATUS(req) : UCS_INPROGRESS;
    }
    if (st != UCS_INPROGRESS)
        on_bundle_sent(NULL, st, b);
    else
        ps__bundle_fly(c, b, 1);
}

/* Inside on_deferred, put a small part into its shard's bundle instead of sending it alone.
 * @return 0 when it is in a bundle; otherwise the caller sends it alone. */
static int bundle_part(ps_client_t *c, part_t *p, const ps_msg_t *m, const void *data, size_t len)
{
    cshard_t *s = &c->shards[p->shard];
    size_t cap = __atomic_load_n(&c->fusion_bytes, __ATOMIC_RELAXED);
    if (!c->fusing || cap == 0 || len > PS_BUNDLE_PART_MAX || s->ep == NULL || s->dead ||
        s->down || ps_bundle_entry_bytes(sizeof p->hdr, len) > cap)
        return -1;
    for (int tries = 0; tries < 2; tries++) {
        bundle_t *b = s->open;
        if (b == NULL) {
            if ((b = c->free_bundles) != NULL)
                c->free_bundles = b->next_free;
            else if ((b = calloc(1, sizeof *b)) == NULL)
                return -1;
            if (b->cap < cap) {
                uint8_t *nb = realloc(b->buf, cap);
                if (nb == NULL) {
                    b->next_free = c->free_bundles;
                    c->free_bundles = b;
                    return -1;
                }
                b->buf = nb;
                b->cap = cap;
            }
            b->c = c;
            b->shard = p->shard;
            b->len = 0;
            b->count = 0;
            s->open = b;
        }
        if (b->count == b->cap_parts) {
            uint32_t nc = b->cap_parts ? 2 * b->cap_parts : 64;
            part_t **np = realloc(b->parts, nc * sizeof *np);
            if (np == NULL) {
                if (b->count == 0) { /* nothing in it: back to the free list, not sent */
                    s->open = NULL;
                    b->next_free = c->free_bundles;
                    c->free_bundles = b;
                }
                return -1;
            }
            b->parts = np;
            b->cap_parts = nc;
        }
        if (b->count < PS_BUNDLE_MAX_ENTRIES &&
            ps_bundle_add(b->buf, b->cap, &b->len, m, data, len) == 0) {
            b->parts[b->count++] = p;
            p->op->ucx_refs++;
            return 0;
        }
        if (b->count == 0) return -1;
        bundle_flush(c, p->shard); /* full: send it and start the next */
    }
    return -1;
}

/* Send (or send again) one chunk of a push or pull. */
static void send_data_part(ps_client_t *c, ps_op_t *op, part_t *p)
{
    const ctensor_t *t = c->tensors[op->tensor];
    uint64_t len = ps_chunk_len(t->numel, c->chunk_elems, p->chunk);
    if (c->trace) {
        /* The comm thread takes the chunk (before its CRC or copy): the op's hand-over from
         * the caller ends at the first of these (bench/round_timeline.py). */
        char args[48];
        snprintf(args, sizeof args, "{\"op\":\"%s\",\"shard\":%u}",
                 op->type == OP_PUSH ? "push" : "pull", p->shard);
        trace_chunk(c, p, "took", args);
    }
    ps_msg_t m = {.req_id = op->req_id, .rank = rank_now(c), .tensor = t->id, .chunk = p->chunk,
                  .step = op->step};
    p->resend = 0;
    if (p->held == HELD_WINDOW && op->held_window) op->held_window--;
    p->held = 0;
    if (op->type == OP_PUSH) {
        m.type = PS_MSG_PUSH;
        m.length = p->len;
        if (!p->raw) {
            m.codec = t->codec.kind;
            m.codec_fraction = t->codec.fraction;
            m.codec_block = t->codec.block;
            m.codec_flags = t->codec.fp16_values ? 1 : 0;
        }
        /* The members of its step: the newest view that covers that step. A later step's view
         * may have come already, even before the first send (a restarted coordinator's hello
         * reply names the step after the one this worker still pushes): a shard takes a push's
         * view as starting at the push's step, so such a view never goes on it. None known
         * (all older ones left the ring): the last one it carried, or none. */
        const ps_view_t *v = ps_views_for_step(&c->views, op->step);
        if (v) {
            op->view_epoch = v->epoch;
            op->view_members = v->members;
        }
        m.epoch = op->view_epoch;
        m.members = op->view_members;
        if (op->has_progress) { /* a resend carries its batch's, not a newer one's */
            m.samples = op->progress;
            m.flags |= PS_FLAG_PROGRESS;
        }
        if (op->batch_stamp) { /* asp / ssp: no step tells a batch's pushes */
            m.flags |= PS_FLAG_BATCH;
            m.data_epoch = op->batch_pass;
            m.batch_offset = op->batch_offset;
        }
        m.nreplay = op->nreplay;
        memcpy(m.replay, op->replay, op->nreplay * sizeof *m.replay);
        if (op->nograd) { /* no data: counted as this member's push, summed as nothing */
            m.flags |= PS_FLAG_NOGRAD;
            m.length = 0;
            m.codec = PSK_CODEC_NONE;
            m.codec_fraction = 0;
            m.codec_block = 0;
            m.codec_flags = 0;
            __atomic_add_fetch(&c->stats.pushes, 1, __ATOMIC_RELAXED);
            if (bundle_part(c, p, &m, NULL, 0) == 0) return;
            send_part(c, p, &m, NULL, 0, PS_AM_CTRL);
            return;
        }
        __atomic_add_fetch(&c->stats.bytes_pushed, p->len, __ATOMIC_RELAXED);
        __atomic_add_fetch(&c->stats.bytes_pushed_raw, len * 4, __ATOMIC_RELAXED);
        __atomic_add_fetch(&c->stats.pushes, 1, __ATOMIC_RELAXED);
        p->ck.direct = 0;
        uint64_t off = p->ck.have_crc || t->codec.kind != PSK_CODEC_NONE || p->raw
                           ? UINT64_MAX
                           : ps__area_place(&c->shards[p->shard], (ctensor_t *)t, p->chunk, p->len);
        if (off != UINT64_MAX) {
            /* A first send to a shard whose area is mapped here: the gradient is written into
             * it with its CRC folded into the copy, and only the header travels. Resends go
             * over the transport. Streaming stores: psd reads the chunk next, on another CPU,
             * and this copy's lines would otherwise first be taken from that CPU's cache
             * (where psd read the last step's) and then be taken back (ps_crc32c_copy_nt). */
            uint8_t *dst = c->shards[p->shard].area + off;
            p->ck.crc = ps_crc32c_copy_nt(0, dst, p->data, p->len);
            p->ck.have_crc = 1;
            p->ck.direct = 1;
            t->places[p->chunk].busy = 1;
            t->places[p->chunk].req = op->req_id;
            if (c->test_corrupt_push && p->len &&
                ++c->test_push_count % c->test_corrupt_push == 0)
                dst[p->len / 2] ^= 0x10; /* the test hook, after the CRC */
            m.flags |= PS_FLAG_DIRECT;
            m.area_offset = off;
            m.crc32c = p->ck.crc;
            __atomic_add_fetch(&c->stats.bytes_pushed_direct, p->len, __ATOMIC_RELAXED);
            /* Only a small gradient's header waits in a bundle: a large one's goes now, so psd
             * applies this chunk while the next one is copied (a bundle leaves at the end of
             * the batch, after every chunk's copy). send_part sends the shard's open bundle
             * first, so the shard still sees this connection's messages in order. */
            if (p->len <= PS_BUNDLE_PART_MAX && bundle_part(c, p, &m, NULL, 0) == 0) return;
            send_part(c, p, &m, NULL, 0, PS_AM_CTRL);
            return;
        }
        if (!p->ck.have_crc) {
            /* Here, just before the chunk's first send, rather than for every chunk on the
             * caller's thread before the op is submitted: the first chunk leaves at once and
             * the later chunks' checksums overlap the earlier ones' transfers. A resend
             * carries the same bytes, so the same CRC. */
            p->ck.crc = ps_crc32c(0, p->data, p->len);
            p->ck.have_crc = 1;
        }
        m.crc32c = p->ck.crc;
        const void *data = ps__test_corrupt_push(c, p);
        if (bundle_part(c, p, &m, data, p->len) == 0) {
            free(p->ck.copy); /* the bundle has its own copy */
            p->ck.copy = NULL;
            return;
        }
        send_part(c, p, &m, data, p->len, PS_AM_DATA);
    } else {
        m.type = PS_MSG_PULL;
        m.codec = t->pull_codec.kind;
        if (c->shards[p->shard].view_open && m.codec == PSK_CODEC_NONE) m.flags |= PS_FLAG_DIRECT;
        p->ck.direct = (m.flags & PS_FLAG_DIRECT) != 0;
        __atomic_add_fetch(&c->stats.pulls, 1, __ATOMIC_RELAXED);
        if (bundle_part(c, p, &m, NULL, 0) == 0) return;
        send_part(c, p, &m, NULL, 0, PS_AM_CTRL);
    }
}


/* How long a leave waits for the shards' answers: the hello deadline (a shard busy for a moment
 * still answers), at most PS_LEAVE_WAIT_MS. */
#define PS_LEAVE_WAIT_MS 5000u
uint32_t ps__leave_wait_ms(const ps_client_t *c)
{
    return c->hello_deadline_ms < PS_LEAVE_WAIT_MS ? c->hello_deadline_ms : PS_LEAVE_WAIT_MS;
}


/* A reconnect's hello to shard @p i is on its way. */
static int rehello_pending(const ps_client_t *c, uint32_t i)
{
    for (const ps_op_t *op = c->inflight; op; op = op->next)
        if (op->on_done == ps__on_rehello && op->parts[0].shard == i && op->parts[0].pending)
            return 1;
    return 0;
}

void ps__start_op(ps_client_t *c, ps_op_t *op)
{
    op->next = c->inflight;
    c->inflight = op;
    op->ucx_refs++; /* held until the end: nothing completes the op halfway */
    if (__atomic_load_n(&c->interrupted, __ATOMIC_ACQUIRE) && op->type != OP_LEAVE &&
        op->on_done == NULL) {
        ps__op_fail(op, PS_ECANCELED, "interrupted");
        goto done;
    }
    if (c->removed && op->type != OP_LEAVE && op->on_done == NULL) {
        ps__op_fail(op, PS_ENOTMEMBER, "this worker was removed from the job");
        goto done;
    }
    switch (op->type) {
    case OP_ECHO:
    case OP_VALUES:
        send_part(c, &op->parts[0], &op->req, op->buf, op->req.length, PS_AM_DATA);
        break;
    case OP_HELLO:
    case OP_BATCH:
    case OP_FORGET:
    case OP_DECLARE: {
        part_t *p = &op->parts[0];
        if (op->type == OP_HELLO && connect_shard(c, p->shard)) {
            /* The lookup's reason when it failed (an input probe, session 63: a name that does
             * not resolve was "cannot reach shard 0" for the whole join). */
            const cshard_t *s = &c->shards[p->shard];
            if (s->addrlen == 0 && s->gai_status != 0)
                ps__op_fail(op, PS_ETRANSPORT, "cannot resolve %s (shard %u): %s",
                            c->m.servers[p->shard].host, p->shard, gai_strerror(s->gai_status));
            else
                ps__op_fail(op, PS_ETRANSPORT, "cannot reach shard %u", p->shard);
        }
        else
            send_part(c, p, &op->req, NULL, 0, PS_AM_CTRL);
        break;
    }
    case OP_LEAVE: {
        /* Done when each shard has answered (MSG_LEAVE_REPLY), or was not reachable (its
         * part is done: ps__part_spared), or after ps__leave_wait_ms (ps__on_leave_timer). The
         * caller closes the connections only then: a close that overtook the leave would make shard
         * 0 hold the rank for a process that may come back (up to 15 s for one on another host). No
         * heartbeat follows a leave: a shard that took it would refuse one. */
        op->req.type = PS_MSG_LEAVE; /* flags and step: a batch done (ps_client_batch_done) */
        op->req.req_id = op->req_id;
        op->req.rank = rank_now(c);
        c->leaving = 1;
        for (uint32_t i = 0; i < c->nshards; i++) /* no reconnect either (ps__shard_lost) */
            uv_timer_stop(&c->shards[i].timer);
        for (uint32_t i = 0; i < op->nparts; i++) {
            part_t *p = &op->parts[i];
            if (c->shards[p->shard].down && rehello_pending(c, p->shard))
                p->resend = 1; /* its answer takes the rank back: the leave follows it */
            else
                send_part(c, p, &op->req, NULL, 0, PS_AM_CTRL);
        }
        if (op->remaining > 0)
            uv_timer_start(&c->leave_timer, ps__on_leave_timer, ps__leave_wait_ms(c), 0);
        break;
    }
    case OP_PUSH:
    case OP_PULL: {
        int copied = 0, later = 0;
        if (op->type == OP_PUSH) { /* the batch it is for: the current one (bsp: of its step) */
            op->batch_stamp = c->batch_stamp;
            op->batch_pass = c->batch_pass;
            op->batch_offset = c->batch_offset;
            op->has_progress = c->has_progress;
            op->progress = c->progress;
            op->nreplay = c->nreplay && (c->batch_stamp || op->step == c->replay_step)
                              ? c->nreplay
                              : 0;
            memcpy(op->replay, c->replay, op->nreplay * sizeof *op->replay);
        }
        for (uint32_t i = 0; i < op->nparts; i++) c->shards[op->parts[i].shard].in_window = 0;
        for (uint32_t i = 0; i < op->nparts && op->status == 0; i++) {
            part_t *p = &op->parts[i];
            cshard_t *s = &c->shards[p->shard];
            if (op->type == OP_PUSH && s->windowed && p->len > PS_BUNDLE_PART_MAX &&
                s->in_window >= PS_PUSH_WINDOW) {
                p->held = HELD_WINDOW; /* sent when an earlier one's send completes (part_sent) */
                op->held_window++;
                continue;
            }
            if (op->type == OP_PUSH && copied && p->len > PS_BUNDLE_PART_MAX && s->area) {
                /* A later large chunk bound for a mapped area: copied on a later turn of the
                 * loop (copy_turn). One for a shard without (another host's) goes now, under
                 * the push window where that applies. */
                p->held = HELD_COPY;
                later = 1;
                continue;
            }
            send_data_part(c, op, p);
            copied |= p->ck.direct && p->len > PS_BUNDLE_PART_MAX;
            /* Not completed at once (eager); a direct push's header holds no data. */
            if (p->ck.sending && !p->ck.direct) s->in_window++;
        }
        if (later) {
            op->ucx_refs++; /* released by copy_turn once every held part went */
            op->copy_at = 0;
            op->copy_next = NULL;
            if (c->copy_tail)
                c->copy_tail->copy_next = op;
            else
                c->copy_head = op;
            c->copy_tail = op;
        }
        break;
    }
    }
done:
    op->ucx_refs--;
    ps__op_maybe_complete(op);
}


/* A direct pull's reply: copy version >= m->step of the chunk from the shard's store. The record
 * read must be the one psd named (its CRC) when it is at that version. */
static void direct_pull(ps_client_t *c, ps_op_t *op, part_t *p, const ps_msg_t *m, uint64_t n)
{
    cshard_t *s = &c->shards[p->shard];
    int rc = PS_EPROTO;
    uint64_t version = 0;
    uint32_t crc = 0;
    if (s->view_open && s->view.id == s->store_id && m->length == 0)
        rc = ps_storeview_read(&s->view, m->tensor, m->chunk, m->step,
                               op->buf + (uint64_t)m->chunk * c->chunk_elems, (uint32_t)n,
                               &version, &crc);
    if (rc == 0 && version == m->step && crc != m->crc32c) rc = PS_ESTALE;
    if (rc == 0 && c->test_direct_fail && ++c->test_direct_count == c->test_direct_fail)
        rc = PS_ESTORE; /* the test hook: as if the store could not be read */
    if (rc == 0) {
        if (version < op->min_version) op->min_version = version;
        ps__seen_version(s, version);
        __atomic_add_fetch(&c->stats.bytes_pulled, n * 4, __ATOMIC_RELAXED);
        __atomic_add_fetch(&c->stats.bytes_pulled_direct, n * 4, __ATOMIC_RELAXED);
        ps__part_done(p);
        return;
    }
    /* The view no longer serves this shard, or the reply was not one it could use (a record
     * that fails its CRC included: the transport's own check then decides): pull this part,
     * and the rest from now on, over the transport. */
    if (s->view_open) {
        PS_LOG(PS_LOG_WARN, "libps", "shard %u: reading chunk %u of tensor %u from its store "
               "failed (%s); pulling over the transport from now on", p->shard, m->chunk,
               m->tensor, ps_strerror(rc));
        ps_storeview_close(&s->view);
        __atomic_store_n(&s->view_open, 0, __ATOMIC_RELAXED); /* ps_client_direct */
    }
    if (p->ck.sending)
        p->ck.again = 1;
    else
        send_data_part(c, op, p);
}

/*
 * One turn of the direct pushes' copies: the next HELD_COPY part of the first push on the list
 * goes (send_data_part copies it into its shard's area, or sends it over the transport if the
 * area cannot take it now). Once a push's large chunk was written directly, its later large
 * chunks bound for a mapped area are left to these turns, one per turn of the comm thread's
 * loop, so that what arrives meanwhile is handled between two copies instead of after all of
 * them: the replies of the pulls started with the push (each read from the store as soon as
 * psd applied its chunk), acknowledgements, control messages. A part that is no longer held
 * (sent again after its shard came back) or no longer pending (its op failed) is skipped; a
 * push with nothing left leaves the list and releases its ref (which may complete it).
 * Returns 1 if a part went.
 */
static int copy_turn(ps_client_t *c)
{
    while (c->copy_head) {
        ps_op_t *op = c->copy_head;
        while (op->copy_at < op->nparts && op->status == 0) {
            part_t *p = &op->parts[op->copy_at++];
            if (p->held == HELD_COPY && p->pending && !p->resend) {
                send_data_part(c, op, p);
                return 1;
            }
        }
        c->copy_head = op->copy_next;
        if (c->copy_head == NULL) c->copy_tail = NULL;
        op->ucx_refs--;
        ps__op_maybe_complete(op);
    }
    return 0;
}

/* Deferred hook: take submitted ops, close failed endpoints (outside UCX callbacks). */
static int on_deferred(ps_ucx_t *u)
{
    ps_client_t *c = u->data;
    int did = 0;
    for (uint32_t i = 0; i < c->nshards; i++) {
        cshard_t *s = &c->shards[i];
        if (s->want_lanes && s->ep && !s->dead) {
            /* Which transports the connection ended up on: said when first found or when a
             * reconnect changed them, so that a cluster that fell back to TCP is seen at
             * once. */
            s->want_lanes = 0;
            char lanes[sizeof s->lanes];
            ps_ucx_ep_lanes(s->ep, lanes, sizeof lanes);
            if (strcmp(lanes, s->lanes) != 0)
                PS_LOG(PS_LOG_INFO, "libps", "shard %u (%s:%u) over %s", i,
                       c->m.servers[i].host, c->m.servers[i].port, lanes);
            pthread_mutex_lock(&c->mu); /* ps_client_lanes reads it from any thread */
            memcpy(s->lanes, lanes, sizeof s->lanes);
            pthread_mutex_unlock(&c->mu);
            s->windowed = strstr(s->lanes, "cma") == NULL;
            s->eager_below = ps_ucx_eager_below(&c->ucx, s->lanes);
        }
        ps__view_update(c, s);
        ps__area_update(c, s);
        if (!s->close_queued) continue;
        s->close_queued = 0;
        did = 1;
        ps_ucx_ep_close(&c->ucx, &s->ep, 1);
        ps__shard_lost(c, i);
    }
    pthread_mutex_lock(&c->mu);
    ps_op_t *list = c->submit_head;
    c->submit_head = c->submit_tail = NULL;
    pthread_mutex_unlock(&c->mu);
    c->fusing = list != NULL;
    while (list) {
        ps_op_t *op = list;
        list = op->next;
        did = 1;
        if (op->type == OP_SHUTDOWN) {
            for (uint32_t i = 0; i < c->nshards; i++) bundle_flush(c, i);
            for (uint32_t i = 0; i < c->nshards; i++) ps_ucx_ep_close(&c->ucx, &c->shards[i].ep, 0);
            /* comm_run ends at its next turn (no uv_stop: run on a caller's thread, outside
             * uv_run, it would stay set and keep the closing uv_run from running at all). */
            __atomic_store_n(&c->loop_stop, 1, __ATOMIC_RELEASE);
            uv_async_send(&c->wake); /* a caller that drives ran this: the comm thread sees it */
            op_publish_done(op);
            continue;
        }
        ps__start_op(c, op);
    }
    c->fusing = 0;
    for (uint32_t i = 0; i < c->nshards; i++) bundle_flush(c, i);
    did |= copy_turn(c);
    return did;
}

/* Close shard @p i's connection: it still holds a request of an interrupted op. */
static void interrupt_close(ps_client_t *c, uint32_t i)
{
    cshard_t *s = &c->shards[i];
    if (s->ep == NULL || s->dead) return;
    PS_LOG(PS_LOG_WARN, "libps", "shard %u (%s:%u) still holds a request %u ms after the "
           "interrupt: closing its connection", i, c->m.servers[i].host, c->m.servers[i].port,
           ps__leave_wait_ms(c));
    s->dead = s->close_queued = 1;
}

/* An interrupted op that UCX still holds (a rendezvous push to a shard that is stopped or
 * cut off never completes): each shard that holds one of its requests (a part's send or
 * rendezvous receive, a bundle carrying one of its parts) gets its connection closed, which
 * cancels them, so the caller's wait ends. Healthy shards finished theirs long before: their
 * connections stay for the leave. */
static void on_interrupt_timer(uv_timer_t *h)
{
    ps_client_t *c = h->data;
    for (ps_op_t *op = c->inflight; op; op = op->next) {
        if (op->on_done || op->type == OP_LEAVE || op->done || op->ucx_refs == 0) continue;
        for (uint32_t i = 0; i < op->nparts; i++)
            if (op->parts[i].ck.sending || op->parts[i].ck.receiving)
                interrupt_close(c, op->parts[i].shard);
        for (bundle_t *b = c->flying; b; b = b->fly_next)
            for (uint32_t k = 0; k < b->count; k++)
                if (b->parts[k]->op == op) interrupt_close(c, b->shard);
    }
}

static void on_wake(uv_async_t *h)
{
    ps_ucx_t *u = h->data;
    ps_client_t *c = u->data;
    if (__atomic_load_n(&c->interrupted, __ATOMIC_ACQUIRE)) {
        /* Everything in flight fails now (ps__start_op fails what comes later). */
        int held = 0;
        for (ps_op_t *op = c->inflight, *nx; op; op = nx) {
            nx = op->next;
            if (op->on_done || op->type == OP_LEAVE) continue; /* a leave is how it ends */
            ps__op_fail(op, PS_ECANCELED, "interrupted");
            held |= op->ucx_refs > 0;
            ps__op_maybe_complete(op);
        }
        if (held && !uv_is_active((uv_handle_t *)&c->interrupt_timer))
            uv_timer_start(&c->interrupt_timer, on_interrupt_timer, ps__leave_wait_ms(c), 0);
    }
    ps_ucx_progress(u);
}

/* ---- comm thread: receiving ------------------------------------------------- */

static ps_op_t *find_op(ps_client_t *c, uint64_t req_id)
{
    for (ps_op_t *op = c->inflight; op; op = op->next)
        if (op->req_id == req_id) return op;
    return NULL;
}

/* One message from a shard (alone, or an entry of a bundle with @p param saying eager). */
static ucs_status_t handle_msg(ps_client_t *c, const ps_msg_t *mp, void *data, size_t length,
                               const ucp_am_recv_param_t *param)
{
    ps_msg_t m = *mp;
    if (m.shard < c->nshards) c->shards[m.shard].heard_ms = uv_now(&c->loop); /* shard_silent */
    if (m.type == PS_MSG_HEARTBEAT) return UCS_OK; /* an answer: heard, nothing else */
    if (m.type == PS_MSG_EPOCH) {
        if (m.shard == 0 && (m.flags & PS_FLAG_CLOSED)) {
            /* A closed step's members, for the shards that may still be at it: forwarded,
             * not this worker's view (it never stands for a later step). */
            ps_msg_t f = {.type = PS_MSG_EPOCH, .epoch = m.epoch, .step = m.step,
                          .members = m.members, .rank = rank_now(c), .flags = PS_FLAG_CLOSED};
            for (uint32_t i = 1; i < c->nshards; i++) ps__forward_msg(c, i, &f);
        } else if (m.shard == 0) {
            ps__learn_view(c, m.epoch, m.step, m.members, 1);
        }
        return UCS_OK;
    }
    if ((m.type == PS_MSG_PUSH_ACK || (m.type == PS_MSG_ERROR && (m.flags & PS_FLAG_CHUNK))) &&
        m.tensor < PS_CLIENT_MAX_TENSORS) {
        /* Whoever the ack (or the refusal naming the chunk) is for now, also one whose op has
         * failed meanwhile: psd holds nothing of that push, so its place is free again. */
        ctensor_t *t = c->tensors[m.tensor];
        if (t && t->places && m.chunk < t->nchunks && t->places[m.chunk].req == m.req_id)
            t->places[m.chunk].busy = 0;
    }
    ps_op_t *op = find_op(c, m.req_id);
    if (op == NULL) {
        /* An error for no op in flight (a late one, or a confused shard's): said, but a flood
         * of them is not a flood of lines (the first 20, then each power of two). */
        uint64_t n = m.type == PS_MSG_ERROR ? ++c->stray_errors : 0;
        if (n && (n <= 20 || (n & (n - 1)) == 0))
            PS_LOG(PS_LOG_WARN, "libps", "shard %u: %s%s", m.shard, m.error,
                   n == 20 ? " (more such errors for no operation in flight: said at powers of "
                             "two)" : "");
        return UCS_OK;
    }
    if (op->type == OP_LEAVE) { /* a refusal answers a leave too */
        if (m.type == PS_MSG_LEAVE_REPLY || m.type == PS_MSG_ERROR)
            parts_done_on_shard(op, m.shard);
        ps__op_maybe_complete(op);
        return UCS_OK;
    }
    switch (m.type) {
    case PS_MSG_ERROR: {
        /* The push's part the refusal names, still waiting: sent again after a CRC mismatch
         * or a "behind" (p), else refused for good. */
        part_t *named = NULL;
        for (uint32_t i = 0; op->type == OP_PUSH && m.tensor == c->tensors[op->tensor]->id &&
                             i < op->nparts; i++)
            if (op->parts[i].chunk == m.chunk && op->parts[i].shard == m.shard &&
                op->parts[i].pending)
                named = &op->parts[i];
        int behind = (m.flags & PS_FLAG_BEHIND) != 0;
        part_t *p = m.status == PS_ECRC || behind ? named : NULL;
        /* bsp: a push refused as not of a member of its step, by a worker that never was one
         * (no view learnt: no batch taken yet), is its caller's mistake, not a removal. */
        bool never = m.status == PS_ENOTMEMBER && op->type == OP_PUSH && c->views.n == 0 &&
                     c->m.job.consistency == PS_CONSIST_BSP;
        /* A push chunk the shard refused for good (naming it) was not summed: its error
         * feedback goes back into the residual, as for one acknowledged unsummed. Before, a
         * caller that pushed the same gradient again after the failure counted it twice (a
         * review, session 71). */
        if (named && !p && (m.flags & PS_FLAG_CHUNK)) ps__ef_put_back(c, op, named);
        if (p && behind)
            part_behind_retry(c, op, p, m.error);
        else if (p)
            part_crc_retry(c, op, p, "push");
        else if (never)
            ps__op_fail(op, PS_EINVAL, "shard %u: %s (this worker holds no batch of that step: "
                    "ps_client_next_batch hands them out)", m.shard, m.error);
        else
            ps__op_fail(op, m.status < 0 ? m.status : PS_EPROTO, "shard %u: %s", m.shard, m.error);
        if (m.status == PS_ENOTMEMBER && !never) {
            ps__op_maybe_complete(op);
            ps__mark_removed(c);
            return UCS_OK;
        }
        break;
    }
    case PS_MSG_ECHO_REPLY:
        if (op->type != OP_ECHO || op->parts[0].shard != m.shard) return UCS_OK;
        if (m.status) ps__op_fail(op, m.status, "shard %u: echo failed", m.shard);
        ps__part_done(&op->parts[0]);
        break;
    case PS_MSG_BATCH_REPLY:
        if (op->type != OP_BATCH || m.shard != 0) return UCS_OK;
        op->reply = m;
        if (m.flags & PS_FLAG_REPORT) { /* a report's answer: the batch held stays as it is */
            ps__part_done(&op->parts[0]);
            break;
        }
        __atomic_store_n(&c->leads, (m.flags & PS_FLAG_LEAD) != 0, __ATOMIC_RELAXED);
        c->batch_stamp = (m.flags & (PS_FLAG_BATCH | PS_FLAG_FINISHED)) == PS_FLAG_BATCH;
        c->batch_pass = m.data_epoch;
        c->batch_offset = m.batch_offset;
        if (!(m.flags & PS_FLAG_FINISHED)) {
            ps__learn_view(c, m.epoch, m.step, m.members, 0);
            c->progress = m.samples;
            c->has_progress = 1;
            c->replay_step = m.step;
            c->nreplay = m.nreplay;
            memcpy(c->replay, m.replay, sizeof c->replay);
        }
        ps__part_done(&op->parts[0]);
        break;
    case PS_MSG_VALUES_REPLY:
        if (op->type != OP_VALUES || op->parts[0].shard != m.shard) return UCS_OK;
        ps__part_done(&op->parts[0]);
        break;
    case PS_MSG_FORGET_REPLY:
        if (op->type != OP_FORGET || op->parts[0].shard != m.shard) return UCS_OK;
        op->reply = m;
        ps__part_done(&op->parts[0]);
        break;
    case PS_MSG_HELLO_REPLY:
    case PS_MSG_DECLARE_REPLY:
        /* Each answers its own kind of op only: a declare reply taken for a pull or a push
         * counted that op's first part done without its data or acknowledgement (a review,
         * session 64: a pull succeeded with its chunk never written). */
        if (op->type != (m.type == PS_MSG_HELLO_REPLY ? OP_HELLO : OP_DECLARE) ||
            op->parts[0].shard != m.shard)
            return UCS_OK;
        if (op->type == OP_HELLO) /* a new endpoint after a reconnect may use others */
            c->shards[m.shard].want_lanes = 1; /* found in on_deferred, outside UCX callbacks */
        if (op->type == OP_HELLO) {
            cshard_t *s = &c->shards[m.shard];
            s->greeted = 1;
            __atomic_store_n(&s->knows_values, (m.flags & PS_FLAG_VALUES) != 0,
                             __ATOMIC_RELEASE);
            __atomic_store_n(&s->leaves_nonfinite, (m.flags & PS_FLAG_NONFINITE) != 0,
                             __ATOMIC_RELEASE);
            s->answers_hb = (m.flags & PS_FLAG_ANSWER) != 0;
            __atomic_store_n(&s->floor_key, m.flags & PS_FLAG_FLOOR ? m.floor_key : 0,
                             __ATOMIC_RELEASE);
            __atomic_store_n(&s->takes_reports, (m.flags & PS_FLAG_REPORT) != 0,
                             __ATOMIC_RELEASE);
            memcpy(s->store, m.store, sizeof s->store);
            s->store_id = m.store[0] ? m.store_id : 0; /* opened in on_deferred (ps__view_update) */
            /* Another store (a restored shard): no pull may read the old one from now on, not
             * even those resent before on_deferred closes it. */
            if (s->view_open && s->view.id != s->store_id)
                __atomic_store_n(&s->view_open, 0, __ATOMIC_RELAXED); /* ps_client_direct */
            s->area_pid = m.pid;
            s->area_fd = m.area_fd;
            s->area_offer_id = m.area_id; /* 0: none offered */
            s->area_offer_size = m.area_size;
            if (s->area && s->area_id != s->area_offer_id)
                ps__area_unmap(s); /* another connection */
        }
        op->reply = m;
        ps__part_done(&op->parts[0]);
        break;
    case PS_MSG_PUSH_ACK:
    case PS_MSG_PULL_REPLY: {
        int is_pull = m.type == PS_MSG_PULL_REPLY;
        if (op->type != (is_pull ? OP_PULL : OP_PUSH) || m.tensor != c->tensors[op->tensor]->id)
            return UCS_OK;
        const ctensor_t *t = c->tensors[op->tensor];
        part_t *p = NULL;
        for (uint32_t i = 0; i < op->nparts; i++)
            if (op->parts[i].chunk == m.chunk && op->parts[i].pending) p = &op->parts[i];
        if (p == NULL || p->shard != m.shard) return UCS_OK;
        if (is_pull && m.step < op->step && c->m.job.consistency == PS_CONSIST_BSP) {
            /* psd answers a bsp pull at or past the version asked for only (it waits for
             * it): parameters from before it would be trained on as if they were the step's. */
            ps__op_fail(op, PS_EPROTO, "shard %u answered the pull of chunk %u of tensor %u "
                        "at version %llu, below the %llu asked for", m.shard, m.chunk,
                        m.tensor, (unsigned long long)m.step, (unsigned long long)op->step);
            break;
        }
        if (is_pull && (m.flags & PS_FLAG_DIRECT)) {
            /* Only a pull that asked for it gets a direct reply: one that did not would be
             * sent again and again. direct_pull records the version it reads. */
            if (!p->ck.direct || length != 0 || t->pull_codec.kind != PSK_CODEC_NONE) {
                ps__op_fail(op, PS_EPROTO, "shard %u answered the pull of chunk %u of tensor %u "
                        "with a direct reply it was not asked for", m.shard, m.chunk, m.tensor);
                break;
            }
            direct_pull(c, op, p, &m, ps_chunk_len(t->numel, c->chunk_elems, m.chunk));
            break;
        }
        if (m.step < op->min_version) op->min_version = m.step;
        ps__seen_version(&c->shards[m.shard], m.step);
        if (!is_pull)
            PS_LOG(PS_LOG_DEBUG, "libps", "shard %u acks the push of chunk %u of tensor %u for "
                   "step %llu (chunk at %llu, flags %#x)", m.shard, m.chunk, m.tensor,
                   (unsigned long long)op->step, (unsigned long long)m.step, m.flags);
        if (!is_pull && (m.flags & PS_FLAG_STALE)) {
            PS_LOG(PS_LOG_INFO, "libps", "shard %u passed step %llu without this worker's batch "
                   "(chunk %u of tensor %u): reported with the batch, which goes out again",
                   m.shard, (unsigned long long)op->step, m.chunk, m.tensor);
            __atomic_store_n(&c->stale_step1, op->step + 1, __ATOMIC_RELEASE);
        }
        if (!is_pull && (m.flags & (PS_FLAG_STALE | PS_FLAG_UNSUMMED | PS_FLAG_NONFINITE)))
            ps__ef_put_back(c, op, p);
        if (!is_pull && (m.flags & PS_FLAG_NONFINITE)) {
            uint64_t n = __atomic_add_fetch(&c->nonfinite_pushes, 1, __ATOMIC_RELAXED);
            /* fp16 without error feedback writes a finite value past its range (65520 and
             * more in magnitude) as an infinity, as a cast does: named, as the likelier cause
             * (a review, session 71: "a NaN or an infinity" sent users looking for one). */
            const ctensor_t *t = c->tensors[m.tensor];
            bool half = !t->error_feedback &&
                        (t->codec.kind == PSK_CODEC_FP16 ||
                         ((t->codec.kind == PSK_CODEC_TOPK || t->codec.kind == PSK_CODEC_RANDOMK) &&
                          t->codec.fp16_values));
            if ((n & (n - 1)) == 0) /* the 1st, 2nd, 4th, 8th ... */
                PS_LOG(PS_LOG_WARN, "libps", "shard %u left this worker's push of chunk %u of "
                       "tensor %u out of its update: the gradient held a NaN or an infinity%s "
                       "(%llu so far)", m.shard, m.chunk, m.tensor,
                       half ? ", or a value fp16 cannot hold (65520 or more in magnitude), which "
                              "it sends as an infinity without error feedback (bf16, or "
                              "error_feedback, keep such values)" : "",
                       (unsigned long long)n);
        }
        if (!is_pull) {
            ps__part_done(p);
            if (p->ck.direct) {
                c->tensors[op->tensor]->places[m.chunk].busy = 0; /* psd is done with it */
                p->ck.direct = 0;
            }
            break;
        }
        p->ck.direct = 0; /* asked for a direct reply or not, this one came over UCX */
        uint64_t n = ps_chunk_len(t->numel, c->chunk_elems, m.chunk);
        uint64_t want =
            t->pull_codec.kind == PSK_CODEC_NONE ? n * 4 : psk_codec_max_bytes(&t->pull_codec, n);
        if (length != want || m.length != want || m.codec != t->pull_codec.kind) {
            ps__op_fail(op, PS_EPROTO,
                        "shard %u sent %zu bytes for chunk %u of tensor %u, expected %llu", m.shard,
                        length, m.chunk, m.tensor, (unsigned long long)want);
            break;
        }
        void *dst = op->buf + (uint64_t)m.chunk * c->chunk_elems;
        if (t->pull_codec.kind != PSK_CODEC_NONE) dst = t->pull_buf + m.chunk * t->pull_cap;
        p->ck.crc = m.crc32c;
        if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
            /* Eager: raw parameters are copied into the caller's buffer with their CRC folded
             * into the copy (a mismatch asks again, and the answer overwrites them). */
            uint32_t crc = t->pull_codec.kind == PSK_CODEC_NONE
                               ? ps_crc32c_copy(0, dst, data, length)
                               : ps_crc32c(0, data, length);
            if (crc != m.crc32c) {
                part_crc_retry(c, op, p, "pull");
                break;
            }
            if (t->pull_codec.kind != PSK_CODEC_NONE) {
                char why[160];
                if (pull_decode(c, op, m.chunk, data, length, why))
                    ps__op_fail(op, PS_EPROTO, "shard %u sent malformed parameters for chunk %u: "
                                "%s", m.shard, m.chunk, why);
                else
                    ps__part_done(p);
                break;
            }
            __atomic_add_fetch(&c->stats.bytes_pulled, length, __ATOMIC_RELAXED);
            ps__part_done(p);
            break;
        }
        /* Rendezvous: the parameters land directly in the caller's buffer. */
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                                   UCP_OP_ATTR_FIELD_USER_DATA,
                                   .cb.recv_am = on_pull_recv, .user_data = p};
        op->ucx_refs++;
        p->ck.receiving = 1;
        p->ck.ep_gen = c->shards[p->shard].ep_gen; /* the reply's connection */
        p->ck.landing = dst;
        ps_tcpguard_expect(dst, length); /* psd's put over TCP lands there (tcpguard.c) */
        void *req = ucp_am_recv_data_nbx(c->ucx.worker, data, dst, length, &prm);
        if (req == NULL)
            on_pull_recv(NULL, UCS_OK, length, p); /* completes the op if it was the last */
        else if (UCS_PTR_IS_ERR(req))
            on_pull_recv(NULL, UCS_PTR_STATUS(req), 0, p);
        return UCS_OK;
    }
    default:
        return UCS_OK;
    }
    ps__op_maybe_complete(op);
    return UCS_OK;
}

/* With a secret_file, whether @p m carries the session token of this worker's connection to
 * the shard it names (psd_encode seals all it sends): a message that does not is not that
 * shard's. This worker's UCP worker takes connections from any peer (UCX's TCP transport
 * listens on every worker), and requests are answered by id, so a peer without the secret
 * could otherwise send a pull reply for a guessed request id and have its values trained on.
 * A message from a connection closed since (its old token) is dropped too: what it answered
 * is sent again on the new one. */
static bool from_shard(ps_client_t *c, const ps_msg_t *m)
{
    static ps_ucx_token_t none; /* a shard index it does not have: only an auth refusal (never
                                   proven: nothing sealed passes with it) */
    return ps_auth_from_shard(&c->auth, m->shard < c->nshards ? &c->shards[m->shard].tok : &none,
                              m);
}

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    ps_client_t *c = arg;
    ps_msg_t m;
    char err[256];
    if (ps_msg_decode(&m, header, header_length, err, sizeof err)) {
        PS_LOG(PS_LOG_WARN, "libps", "dropped a message: %s", err);
        return UCS_OK;
    }
    if (!from_shard(c, &m)) { /* its data, if any, is dropped unread */
        if (!c->unsealed_said++)
            PS_LOG(PS_LOG_WARN, "libps", "dropped a %s said to be from shard %u without this "
                   "worker's session token for it (a peer without the secret, or a connection "
                   "closed since); more are dropped without a word", ps_msg_type_name(m.type),
                   m.shard);
        return UCS_OK;
    }
    if (m.type != PS_MSG_BUNDLE) return handle_msg(c, &m, data, length, param);
    /* A shard's replies fused into one message (proto/bundle.h): one at a time. */
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || m.length != length ||
        m.count == 0 || m.count > PS_BUNDLE_MAX_ENTRIES) {
        PS_LOG(PS_LOG_WARN, "libps", "dropped a malformed bundle from shard %u (%llu entries, "
               "%zu bytes)", m.shard, (unsigned long long)m.count, length);
        return UCS_OK;
    }
    ps_bundle_iter_t it;
    ps_bundle_iter_init(&it, data, length, (uint32_t)m.count);
    ucp_am_recv_param_t eager = {.recv_attr = 0};
    ps_msg_t e;
    const void *d;
    size_t dlen;
    int rc;
    while ((rc = ps_bundle_next(&it, &e, &d, &dlen, err, sizeof err)) != 0) {
        if (rc > 0 && e.shard != m.shard) {
            /* Only the bundle's header carries the session token: an entry speaks for the
             * shard that sealed it, or not at all (a review, session 64: shard 1 answered a
             * pull of shard 0's chunk with values of its own, taken). */
            if (!c->unsealed_said++)
                PS_LOG(PS_LOG_WARN, "libps", "dropped a %s said to be from shard %u inside a "
                       "bundle of shard %u; more are dropped without a word",
                       ps_msg_type_name(e.type), e.shard, m.shard);
        } else if (rc > 0) {
            handle_msg(c, &e, (void *)d, dlen, &eager);
        } else
            PS_LOG(PS_LOG_WARN, "libps", "shard %u: %s", m.shard, err);
    }
    return UCS_OK;
}

/* ps_ucx_t.driven: a caller drives the worker now, or did within the busy-poll window (it is
 * likely to wait again soon: a training step's ops come in a burst). */
int ps__comm_driven(ps_ucx_t *u)
{
    ps_client_t *c = u->data;
    if (__atomic_load_n(&c->drivers, __ATOMIC_ACQUIRE) > 0) return 1;
    uint64_t at = __atomic_load_n(&c->drove_ns, __ATOMIC_ACQUIRE);
    return at && mono_ns() - at < u->spin_ns;
}

/* The comm thread's loop, with loop_mu held (uv_run(UV_RUN_DEFAULT) but for that): each turn
 * runs what is due without blocking, then waits for the loop's next event (its backend fd)
 * with loop_mu released, so that a caller may drive the worker meanwhile. While the worker is
 * left to callers the wait is bounded (ps_ucx_wait_ms, PS_UCX_ASIDE_MS): a later turn takes
 * it back (progresses and arms) once none has driven it for the busy-poll window. Until the
 * shutdown (loop_stop). */
static void comm_run(ps_client_t *c)
{
    struct pollfd pfd = {.fd = uv_backend_fd(&c->loop), .events = POLLIN};
    while (!c->loop_stop) {
        uv_run(&c->loop, UV_RUN_NOWAIT);
        if (c->loop_stop) break;
        int timeout = ps_ucx_wait_ms(&c->ucx, uv_backend_timeout(&c->loop));
        pthread_mutex_unlock(&c->loop_mu);
        if (timeout != 0) poll(&pfd, 1, timeout);
        pthread_mutex_lock(&c->loop_mu);
    }
}

void *ps__comm_main(void *arg)
{
    ps_client_t *c = arg;
    pthread_mutex_lock(&c->loop_mu); /* held but while comm_run waits, until the end */
    int rc = uv_loop_init(&c->loop);
    bool looped = rc == 0;
    if (rc == 0) rc = ps_ucx_init_serialized(&c->ucx, &c->loop);
    if (rc == 0) {
        c->ucx.deferred = on_deferred;
        c->ucx.driven = ps__comm_driven;
        ps_auth_attach(&c->ucx, &c->auth);
        ps_ucx_set_spin(&c->ucx, c->m.spin_us);
        c->ucx.data = c;
        c->ucx.owner_idle = ps__waits_for_nothing;
        c->ucx.owner_idle_arg = c;
        ps_ucx_set_am_handler(&c->ucx, on_am, c);
        for (uint32_t i = 0; i < c->nshards; i++) {
            c->shards[i].c = c;
            c->shards[i].index = i;
            uv_timer_init(&c->loop, &c->shards[i].timer);
            c->shards[i].timer.data = &c->shards[i];
        }
        uint64_t tick = c->m.job.heartbeat_timeout_ms / 4;
        uv_timer_init(&c->loop, &c->heartbeat);
        c->heartbeat.data = c;
        uv_update_time(&c->loop); /* not uv_loop_init's: UCX's start took a while since */
        c->hb_last_ms = uv_now(&c->loop); /* a stop before the first tick is one too */
        uv_timer_start(&c->heartbeat, ps__on_heartbeat, tick, tick);
        uv_timer_init(&c->loop, &c->leave_timer);
        c->leave_timer.data = c;
        uv_timer_init(&c->loop, &c->interrupt_timer);
        c->interrupt_timer.data = c;
        uv_timer_init(&c->loop, &c->behind_timer);
        c->behind_timer.data = c;
        uv_async_init(&c->loop, &c->wake, on_wake);
        c->wake.data = &c->ucx;
        uv_async_init(&c->loop, &c->resolved, ps__on_resolved);
        c->resolved.data = c;
    }
    pthread_mutex_lock(&c->mu);
    c->started = 1;
    c->start_rc = rc;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (rc) {
        /* Its epoll fd and signal pipe go too (a review: kept by every failed create); a
         * handle UCX's failed start left on it keeps them (UV_EBUSY), as before. */
        if (looped) uv_loop_close(&c->loop);
        __atomic_store_n(&c->loop_stop, 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&c->loop_mu);
        return NULL;
    }
    comm_run(c);
    ps__resolve_abandon(c);
    uv_close((uv_handle_t *)&c->wake, NULL);
    uv_close((uv_handle_t *)&c->resolved, NULL);
    for (uint32_t i = 0; i < c->nshards; i++) uv_close((uv_handle_t *)&c->shards[i].timer, NULL);
    uv_close((uv_handle_t *)&c->heartbeat, NULL);
    uv_close((uv_handle_t *)&c->leave_timer, NULL);
    uv_close((uv_handle_t *)&c->interrupt_timer, NULL);
    uv_close((uv_handle_t *)&c->behind_timer, NULL);
    ps_ucx_close(&c->ucx);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    uv_loop_close(&c->loop);
    /* No UCX completion comes any more: what only this thread owned and was still waiting for
     * one is freed (a view message whose close was left to finish in the background; a
     * reconnect's hello the shutdown overtook). The callers' ops are theirs. */
    ps__forwards_free(c);
    for (ps_op_t **pp = &c->inflight; *pp;) {
        ps_op_t *op = *pp;
        if (op->on_done == NULL) {
            pp = &op->next;
            continue;
        }
        *pp = op->next;
        free(op);
    }
    pthread_mutex_unlock(&c->loop_mu);
    return NULL;
}

