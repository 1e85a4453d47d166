/* reqclient.c: a synchronous request/reply channel to the shards (see reqclient.h). */
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "reqclient.h"

#include "authmsg.h"
#include "lookup.h"
#include "stalltimer.h"
#include "tcpguard.h"
#include "ucx_loop.h"

typedef struct {
    ucp_ep_h ep;
    int failed;
    ucs_status_t status;
    uv_loop_t *loop;
    ps_ucx_token_t tok; /* the endpoint's session token (authmsg.h) */
    int unsealed_said;  /* a reply without tok was dropped and logged (on_am); the rest quietly */
    ps_lookup_t *lookup; /* the shard's name lookup, when one outlasted a call (lookup_shard) */
} cep_t;

struct ps_req_s {
    const ps_manifest_t *m;
    ps_auth_t auth;
    double timeout_s;
    uv_loop_t loop;
    ps_ucx_t ucx;
    uv_timer_t timer, tick;
    ps_stalltimer_t due; /* timer, not counting this process's stops (on_tick) */
    cep_t *eps;
    uint64_t next_req, want_req;
    uint32_t want_shard; /* the shard asked for want_req: its reply must carry its token */
    int got, pending, data_failed, timed_out;
    volatile sig_atomic_t *cancel; /* ps_req_set_cancel: the waits end while it is set */
    int (*cancel_fn)(void *);      /* ps_req_set_cancel_fn: the same while it returns non-zero */
    void *cancel_arg;
    int unsealed;        /* replies to want_req dropped for their token (ps_req_call says so) */
    int sending;         /* the request's send has not completed */
    uint32_t send_shard; /* the shard it goes to */
    struct send_s *send; /* that send (its header); NULL once it completed or was given up */
    ps_msg_t reply;
    uint8_t *data;
    size_t len;
};

/* One request's send: UCX reads the header until the send completes, so each send has its
 * own, freed by its completion. A send given up (its endpoint force-closed after a timeout)
 * is forgotten by the client; if its completion still comes, it frees the header and touches
 * nothing else. */
typedef struct send_s {
    ps_req_t *c;
    uint8_t hdr[PS_WIRE_HDR_MAX];
} send_t;

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    cep_t *e = arg;
    e->failed = 1;
    e->status = status;
    uv_stop(e->loop);
}

static void on_data(void *request, ucs_status_t status, size_t length, void *user_data)
{
    ps_req_t *c = user_data;
    c->pending = 0;
    ps_tcpguard_done(c->data);
    if (status != UCS_OK) c->data_failed = 1;
    if (request) ucp_request_free(request);
    uv_stop(&c->loop);
}

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    ps_req_t *c = arg;
    ps_msg_t m;
    char err[256];
    if (ps_msg_decode(&m, header, header_length, err, sizeof err) || m.req_id != c->want_req ||
        c->got)
        return UCS_OK;
    /* Not the shard's (ps_auth_from_shard: a peer without the secret answering a guessed
     * id?): not matched, the call waits on; its data is dropped unread. */
    if (!ps_auth_from_shard(&c->auth, &c->eps[c->want_shard].tok, &m)) {
        const ps_server_conf_t *sc = &c->m->servers[c->want_shard];
        c->unsealed++;
        if (!c->eps[c->want_shard].unsealed_said++)
            PS_LOG(PS_LOG_WARN, "reqclient", "shard %u (%s:%u): dropped a %s without this "
                   "connection's session token (not from the shard: a peer without the "
                   "secret?); more are dropped without a word", c->want_shard, sc->host,
                   sc->port, ps_msg_type_name(m.type));
        return UCS_OK;
    }
    c->reply = m;
    c->got = 1;
    uv_stop(&c->loop);
    if (length == 0) return UCS_OK;
    if (length != m.length || (c->data = malloc(length)) == NULL) {
        c->data_failed = 1;
        return UCS_OK;
    }
    c->len = length;
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        memcpy(c->data, data, length);
        return UCS_OK;
    }
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.recv_am = on_data, .user_data = c};
    c->pending = 1;
    ps_tcpguard_expect(c->data, length); /* a put over TCP may land there (tcpguard.c) */
    void *req = ucp_am_recv_data_nbx(c->ucx.worker, data, c->data, length, &p);
    if (req == NULL)
        on_data(NULL, UCS_OK, length, c);
    else if (UCS_PTR_IS_ERR(req))
        on_data(NULL, UCS_PTR_STATUS(req), 0, c);
    return UCS_OK;
}

static void on_sent(void *request, ucs_status_t status, void *user_data)
{
    send_t *snd = user_data;
    ps_req_t *c = snd->c;
    if (c->send == snd) { /* the send the client waits for, not one it gave up */
        c->send = NULL;
        c->sending = 0;
        uv_stop(&c->loop);
    }
    free(snd);
    if (request) ucp_request_free(request);
}

/* Give up the send in flight: its shard's endpoint is force-closed, which cancels it (its
 * completion, if UCX still brings one, frees its header and touches nothing else: on_sent). */
static void send_give_up(ps_req_t *c)
{
    /* Forgotten first: the forced close completes the send (on_sent), which must not find it
     * and stop the loop from outside uv_run (the stop would end ps_req_close's last run at
     * once, leaving the loop's handles open). */
    c->send = NULL;
    c->sending = 0;
    ps_ucx_ep_close(&c->ucx, &c->eps[c->send_shard].ep, 1);
}

static void on_timer(uv_timer_t *t)
{
    ps_req_t *c = t->data;
    c->timed_out = 1;
    uv_stop(&c->loop);
}

/* Every 2 ms while a call waits: wakes the loop (see ps_req_call), and keeps a stop of this
 * process out of the call's time (stalltimer.h). */
static void on_tick(uv_timer_t *h)
{
    ps_req_t *c = h->data;
    ps_stalltimer_tick(&c->due);
}

/* Start the timeout of a call (or a send's settling) and its tick, from the loop's time now. */
static void wait_start(ps_req_t *c)
{
    /* The loop's clock stood still while nobody ran it (between calls): without this the
     * timeout is due at once after an idle spell longer than itself. */
    uv_update_time(&c->loop);
    ps_stalltimer_start(&c->due, &c->timer, on_timer, (uint64_t)(c->timeout_s * 1000));
    /* A rendezvous reply's completion does not always wake the worker's event fd (seen with
     * shared memory): a 2 ms tick keeps the loop progressing while a call waits. */
    uv_timer_start(&c->tick, on_tick, 2, 2);
}

/* Block every signal on the calling thread while UCX may start a thread of its own (its async
 * thread, made when the UCP worker or an endpoint needs it), so the thread inherits the mask and
 * the caller's handlers (psctl's stop flags, read by its main thread) run on the caller's
 * thread alone: a handler setting a flag on UCX's thread was a data race (a ThreadSanitizer
 * run, session 72). @p was receives the mask to put back with signals_restore. */
static void signals_block(sigset_t *was)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, was);
}

static void signals_restore(const sigset_t *was)
{
    pthread_sigmask(SIG_SETMASK, was, NULL);
}

int ps_req_open(const ps_manifest_t *m, double timeout_s, ps_req_t **out, char *err,
                      size_t errlen)
{
    ps_req_t *c = calloc(1, sizeof *c);
    if (c == NULL || (c->eps = calloc((size_t)m->nservers, sizeof *c->eps)) == NULL) {
        free(c);
        snprintf(err, errlen, "out of memory");
        return PS_ENOMEM;
    }
    c->m = m;
    c->timeout_s = timeout_s;
    int rc = ps_auth_load(&c->auth, m, err, errlen);
    if (rc) {
        free(c->eps);
        free(c);
        return rc;
    }
    sigset_t was;
    signals_block(&was); /* see signals_block */
    bool started = uv_loop_init(&c->loop) == 0 &&
                   ps_ucx_init_tls(&c->ucx, &c->loop, PS_UCX_TLS_CONTROL) == 0;
    signals_restore(&was);
    if (!started) {
        free(c->eps);
        free(c);
        snprintf(err, errlen, "cannot start the UCX transport");
        return PS_ETRANSPORT;
    }
    ps_ucx_set_am_handler(&c->ucx, on_am, c);
    ps_auth_attach(&c->ucx, &c->auth);
    uv_timer_init(&c->loop, &c->timer);
    uv_timer_init(&c->loop, &c->tick);
    c->timer.data = c->tick.data = c;
    *out = c;
    return 0;
}

/* Let the last request's send complete (UCX 1.13 reads its header until then) for at most the
 * call timeout: a shard that stopped reading (SIGSTOP, a hung host) never completes it, and then
 * its endpoint is closed, which cancels the send, so that no call or close waits for it for
 * good. */
static void send_settle(ps_req_t *c)
{
    if (!c->sending) return;
    c->timed_out = 0;
    wait_start(c);
    while (c->sending && !c->timed_out) uv_run(&c->loop, UV_RUN_ONCE);
    uv_timer_stop(&c->timer);
    uv_timer_stop(&c->tick);
    if (c->sending) send_give_up(c);
}

/* Whether the caller asked the waits to end (ps_req_set_cancel, ps_req_set_cancel_fn). */
static int cancelled(const ps_req_t *c)
{
    return (c->cancel && *c->cancel) || (c->cancel_fn && c->cancel_fn(c->cancel_arg));
}

/* Shard @p i's address, looked up on a thread of its own and waited for at most the call's
 * timeout: getaddrinfo with DNS not answering took ~19 s, and a Ctrl-C to pslaunch --follow,
 * whose signals wait until its request returns, was passed on only after it (a review,
 * session 70). A lookup that outlasts the call goes on, and the next call waits for the same
 * one instead of starting another. */
static int lookup_shard(ps_req_t *c, uint32_t i, struct sockaddr_storage *ss, socklen_t *len,
                        char *err, size_t errlen)
{
    cep_t *e = &c->eps[i];
    const ps_server_conf_t *sc = &c->m->servers[i];
    if (e->lookup == NULL) {
        sigset_t all; /* the caller's handlers run on its own thread, not on the lookup's */
        sigfillset(&all);
        e->lookup = ps_lookup_start(sc->host, sc->port, &all, NULL, NULL);
        if (e->lookup == NULL) {
            snprintf(err, errlen, "shard %u: no thread to look %s up: %s", i, sc->host,
                     strerror(errno));
            return PS_ETRANSPORT;
        }
    }
    uint64_t t0 = uv_hrtime();
    while (!ps_lookup_wait(e->lookup, 2)) {
        if (cancelled(c)) {
            snprintf(err, errlen, "shard %u (%s:%u): interrupted while its name was looked up",
                     i, sc->host, sc->port);
            return PS_ECANCELED;
        }
        if ((double)(uv_hrtime() - t0) * 1e-9 >= c->timeout_s) {
            snprintf(err, errlen, "shard %u: looking %s up gave no answer within %g s (does "
                     "DNS answer?)", i, sc->host, c->timeout_s);
            return PS_ETIMEDOUT;
        }
    }
    int status = ps_lookup_take(e->lookup, ss, len);
    e->lookup = NULL;
    if (status || *len == 0) { /* a name not resolvable yet (DNS not up, a pod not made yet) */
        snprintf(err, errlen, "shard %u: cannot resolve %s%s%s", i, sc->host,
                 status ? ": " : "", status ? gai_strerror(status) : "");
        return PS_ETRANSPORT; /* not the shard's refusal: the caller may ask again */
    }
    return 0;
}

static int connect_shard(ps_req_t *c, uint32_t i, char *err, size_t errlen)
{
    cep_t *e = &c->eps[i];
    if (e->ep && !e->failed) return 0;
    e->loop = &c->loop;
    const ps_server_conf_t *sc = &c->m->servers[i];
    /* A connection that failed (the call that saw it said so) is made again: a shard
     * started again, or whose transport was (psd's transport_restart), answers a new one. */
    ps_ucx_ep_close(&c->ucx, &e->ep, 1);
    e->failed = 0;
    e->unsealed_said = 0; /* a new connection: its first dropped reply is said again */
    struct sockaddr_storage ss;
    socklen_t sslen;
    int rc = lookup_shard(c, i, &ss, &sslen, err, errlen);
    if (rc) return rc;
    sigset_t was;
    signals_block(&was);
    rc = ps_ucx_connect_addr(&c->ucx, (const struct sockaddr *)&ss, sslen, sc->host, sc->port,
                             on_ep_error, e, &e->ep, &e->tok);
    signals_restore(&was);
    if (rc)
        snprintf(err, errlen, "shard %u (%s:%u): cannot create an endpoint", i, sc->host,
                 sc->port);
    return rc;
}

int ps_req_call(ps_req_t *c, uint32_t shard, ps_msg_t *req, ps_msg_t *reply,
                      void **data, size_t *len, char *err, size_t errlen)
{
    if (data) *data = NULL;
    if (len) *len = 0;
    send_settle(c); /* an old send after a timeout (it may close that shard's endpoint) */
    int rc = connect_shard(c, shard, err, errlen);
    if (rc) return rc;
    cep_t *e = &c->eps[shard];
    const ps_server_conf_t *sc = &c->m->servers[shard];
    req->req_id = ++c->next_req;
    /* Every request names the manifest's cluster: a shard of another cluster refuses it
     * (server.c) instead of checkpointing or exporting itself under this manifest's name. */
    if (req->cluster[0] == '\0') snprintf(req->cluster, sizeof req->cluster, "%s", c->m->cluster);
    size_t hlen;
    send_t *snd = malloc(sizeof *snd);
    if (snd == NULL) {
        snprintf(err, errlen, "out of memory");
        return PS_ENOMEM;
    }
    snd->c = c;
    /* A request that carries a token of its own is sent as it is (a test of psd's check). */
    int sealed = req->session_len
                     ? ps_msg_encode(req, snd->hdr, sizeof snd->hdr, &hlen)
                     : ps_msg_encode_sealed(req, e->tok.b, e->tok.len, snd->hdr,
                                            sizeof snd->hdr, &hlen);
    if (sealed) {
        free(snd);
        snprintf(err, errlen, "request header too large");
        return PS_EINVAL;
    }
    c->want_req = req->req_id;
    c->want_shard = shard;
    c->got = c->pending = c->data_failed = c->timed_out = c->unsealed = 0;
    free(c->data);
    c->data = NULL;
    c->len = 0;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS |
                                             UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .flags = UCP_AM_SEND_FLAG_REPLY, .cb.send = on_sent,
                             .user_data = snd};
    void *sreq = ucp_am_send_nbx(e->ep, PS_AM_CTRL, snd->hdr, hlen, NULL, 0, &p);
    c->sending = sreq != NULL && !UCS_PTR_IS_ERR(sreq);
    c->send_shard = shard;
    if (c->sending)
        c->send = snd; /* on_sent frees it */
    else
        free(snd); /* done at once (or failed): no callback comes */
    wait_start(c);
    /* Wait for the send too: UCX 1.13 reads the header buffer until it completes. Whatever
     * sets a flag also calls uv_stop(), so UV_RUN_ONCE never sleeps past it. */
    bool stop = false; /* the 2 ms tick ends each UV_RUN_ONCE: a cancel is seen soon */
    while (!(c->got && !c->pending && !c->sending) && !e->failed && !c->timed_out &&
           !(stop = !c->got && cancelled(c))) /* not with its data on the way */
        uv_run(&c->loop, UV_RUN_ONCE);
    uv_timer_stop(&c->timer);
    uv_timer_stop(&c->tick);
    if (stop) {
        if (c->sending) send_give_up(c); /* as after a timeout */
        c->want_req = 0; /* a late reply matches nothing */
        snprintf(err, errlen, "shard %u (%s:%u): interrupted before its answer", shard, sc->host,
                 sc->port);
        return PS_ECANCELED;
    }
    if (c->timed_out && c->sending) {
        /* The shard does not take even the request (stopped, hung): its endpoint goes now, which
         * cancels the send, rather than at the next call after a second timeout. */
        send_give_up(c);
    }
    if (!c->got || c->pending) {
        if (e->failed)
            snprintf(err, errlen, "shard %u (%s:%u): %s%s", shard, sc->host, sc->port,
                     ucs_status_string(e->status), ps_ucx_down_hint(e->status));
        else if (c->unsealed)
            snprintf(err, errlen, "shard %u (%s:%u): no answer within %g s (%d dropped: not "
                     "sealed with this connection's session token)", shard, sc->host, sc->port,
                     c->timeout_s, c->unsealed);
        else
            snprintf(err, errlen, "shard %u (%s:%u): no answer within %g s", shard, sc->host,
                     sc->port, c->timeout_s);
        return e->failed ? PS_ETRANSPORT : PS_ETIMEDOUT;
    }
    if (c->data_failed) {
        snprintf(err, errlen, "shard %u: the reply's data was lost", shard);
        return PS_ETRANSPORT;
    }
    *reply = c->reply;
    if (reply->type == PS_MSG_ERROR) {
        snprintf(err, errlen, "shard %u: %s", shard, reply->error);
        /* The connection's one proof was refused (a clock off, say): the next call connects
         * again with a fresh one, so a caller that keeps asking recovers once it is fixed. */
        if (reply->status == PS_EAUTH) c->eps[shard].failed = 1;
        return reply->status < 0 ? reply->status : PS_EPROTO;
    }
    if (data) {
        *data = c->data;
        c->data = NULL;
    }
    if (len) *len = c->len;
    return 0;
}

void ps_req_set_cancel(ps_req_t *c, volatile sig_atomic_t *flag) { c->cancel = flag; }

void ps_req_set_cancel_fn(ps_req_t *c, int (*fn)(void *), void *arg)
{
    c->cancel_fn = fn;
    c->cancel_arg = arg;
}

void ps_req_close(ps_req_t *c)
{
    if (c == NULL) return;
    send_settle(c);
    for (int i = 0; i < c->m->nservers; i++) {
        ps_ucx_ep_close(&c->ucx, &c->eps[i].ep, 1);
        ps_lookup_abandon(c->eps[i].lookup); /* its thread frees it when DNS answers */
    }
    uv_close((uv_handle_t *)&c->timer, NULL);
    uv_close((uv_handle_t *)&c->tick, NULL);
    ps_ucx_close(&c->ucx);
    /* A uv_stop from a UCX callback run outside uv_run (an endpoint's error) ends a run at
     * once; run until every handle is closed, or the loop's memory and descriptors leak. */
    uv_run(&c->loop, UV_RUN_DEFAULT);
    for (int i = 0; i < 100 && uv_loop_close(&c->loop) == UV_EBUSY; i++)
        uv_run(&c->loop, UV_RUN_NOWAIT); /* bounded: never wait on a handle left open */
    free(c->data);
    free(c->eps);
    ps_auth_wipe(&c->auth);
    free(c);
}
