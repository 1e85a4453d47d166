/* server.c: psd's loop: message dispatch, the cron, start and shutdown (connections: conn.c;
 * the listener: listen.c). */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ps/ps_error.h"
#include "sigignored.h"
#include "checkpoint.h"
#include "export.h"
#include "integrity.h"
#include "metrics.h"
#include "ps/ps_log.h"
#include "server.h"
#include "tcpguard.h"
#include "bundle.h"
#include "follower.h"
#include "sync.h"

/* ---- sending ------------------------------------------------------------ */

void psd_send_done(void *request, ucs_status_t status, void *user_data)
{
    psd_send_t *s = user_data;
    psd_server_t *srv = s->srv;
    psd_conn_unref(s->conn);
    s->next_free = srv->free_sends;
    srv->free_sends = s;
    if (request) ucp_request_free(request);
}

int psd_encode(const psd_server_t *srv, const psd_conn_t *conn, const ps_msg_t *msg,
               uint8_t *buf, size_t cap, size_t *len)
{
    bool seal = srv->auth->on && conn->authed;
    if (seal && srv->test_bad_seal) { /* PS_TEST_BAD_SEAL: a forger's token (a test hook) */
        uint8_t bad[PS_AUTH_SESSION];
        for (int i = 0; i < PS_AUTH_SESSION; i++) bad[i] = (uint8_t)(conn->session[i] ^ 0x5a);
        return ps_msg_encode_sealed(msg, bad, sizeof bad, buf, cap, len);
    }
    return ps_msg_encode_sealed(msg, seal ? conn->session : NULL, seal ? PS_AUTH_SESSION : 0,
                                buf, cap, len);
}

void psd_send_msg(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    if (conn->dead || conn->ep == NULL) return;
    if (psd_outbox_add(srv, conn, msg, NULL, 0) == 0) return;
    psd_outbox_flush(srv, conn); /* what was collected for it goes first */
    psd_send_t *s = srv->free_sends;
    if (s)
        srv->free_sends = s->next_free;
    else if ((s = calloc(1, sizeof *s)) == NULL)
        return;
    s->srv = srv;
    s->conn = conn;
    s->snap = NULL;
    psd_conn_ref(conn);
    size_t len;
    if (psd_encode(srv, conn, msg, s->hdr, sizeof s->hdr, &len)) {
        psd_send_done(NULL, UCS_OK, s);
        return;
    }
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.send = psd_send_done, .user_data = s};
    void *req = ucp_am_send_nbx(conn->ep, PS_AM_CTRL, s->hdr, len, NULL, 0, &p);
    if (req == NULL || UCS_PTR_IS_ERR(req)) psd_send_done(NULL, UCS_OK, s);
}

static void send_error(psd_server_t *srv, psd_conn_t *conn, ps_msg_t *m, const char *fmt,
                       va_list ap)
{
    vsnprintf(m->error, sizeof m->error, fmt, ap);
    PS_LOG(PS_LOG_DEBUG, "server", "error to %s: %s", conn->peer, m->error);
    psd_send_msg(srv, conn, m);
}

void psd_send_error(psd_server_t *srv, psd_conn_t *conn, uint64_t req_id, int status,
                    const char *fmt, ...)
{
    ps_msg_t m = {.type = PS_MSG_ERROR, .req_id = req_id, .status = status, .shard = srv->shard};
    va_list ap;
    va_start(ap, fmt);
    send_error(srv, conn, &m, fmt, ap);
    va_end(ap);
}

void psd_send_chunk_error(psd_server_t *srv, psd_conn_t *conn, uint64_t req_id, uint32_t tensor,
                          uint32_t chunk, int status, const char *fmt, ...)
{
    ps_msg_t m = {.type = PS_MSG_ERROR, .req_id = req_id, .status = status, .shard = srv->shard,
                  .tensor = tensor, .chunk = chunk, .flags = PS_FLAG_CHUNK};
    va_list ap;
    va_start(ap, fmt);
    send_error(srv, conn, &m, fmt, ap);
    va_end(ap);
}

void psd_send_crc_error(psd_server_t *srv, psd_conn_t *conn, uint64_t req_id, uint32_t tensor,
                        uint32_t chunk, const char *what)
{
    ps_msg_t m = {.type = PS_MSG_ERROR, .req_id = req_id, .status = PS_ECRC,
                  .shard = srv->shard, .tensor = tensor, .chunk = chunk, .flags = PS_FLAG_CHUNK};
    snprintf(m.error, sizeof m.error, "%s of %u/%u: CRC-32C mismatch, payload rejected", what,
             tensor, chunk);
    psd_send_msg(srv, conn, &m);
}

/* ---- messages ----------------------------------------------------------- */

bool psd_refuse_other_cluster(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg,
                              bool none_ok)
{
    if ((none_ok && msg->cluster[0] == '\0') || strcmp(msg->cluster, srv->m.cluster) == 0)
        return false;
    psd_send_error(srv, c, msg->req_id, PS_ECONFIG, "this shard serves cluster '%.100s', not "
                   "'%.100s'", srv->m.cluster, msg->cluster);
    return true;
}

/* Whether hello @p msg comes from a worker whose manifest this shard's does not fit (cluster,
 * and with PS_FLAG_CONF chunk_bytes, number of shards, which shard, consistency): a worker with
 * another would push and pull chunks this shard does not have, or wait on steps it does not
 * keep. The reason, naming both values, into @p why. */
static bool hello_misfits(const psd_server_t *srv, const ps_msg_t *msg, char *why, size_t len)
{
    const ps_manifest_t *m = &srv->m;
    const ps_server_conf_t *me = &m->servers[srv->shard];
    if (strcmp(msg->cluster, m->cluster) != 0)
        snprintf(why, len, "this shard serves cluster '%.100s', not '%.100s'", m->cluster,
                 msg->cluster);
    else if (!(msg->flags & PS_FLAG_CONF))
        return false;
    else if (msg->length != m->chunk_bytes)
        snprintf(why, len, "cluster '%s' has chunk_bytes %llu, the worker's manifest %llu",
                 m->cluster, (unsigned long long)m->chunk_bytes, (unsigned long long)msg->length);
    else if (msg->count != (uint64_t)m->nservers)
        snprintf(why, len, "cluster '%s' has %d shards, the worker's manifest lists %llu",
                 m->cluster, m->nservers, (unsigned long long)msg->count);
    else if (msg->shard != srv->shard)
        snprintf(why, len, "%s:%u is shard %u of cluster '%s', the worker's manifest lists it as "
                 "shard %u: its servers are in another order than the cluster's", me->host,
                 me->port, srv->shard, m->cluster, msg->shard);
    else if (msg->consistency != (uint32_t)m->job.consistency)
        snprintf(why, len, "cluster '%s' runs job.consistency %s, the worker's manifest %s",
                 m->cluster, ps_consistency_name(m->job.consistency),
                 ps_consistency_name((ps_consistency_t)msg->consistency));
    else
        return false;
    return true;
}

static void on_hello(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg)
{
    char why[sizeof msg->error];
    if (hello_misfits(srv, msg, why, sizeof why)) {
        psd_send_error(srv, c, msg->req_id, PS_ECONFIG, "%s", why);
        return;
    }
    if (srv->stopping) {
        psd_send_error(srv, c, msg->req_id, PS_EBUSY, "shard %u is shutting down", srv->shard);
        return;
    }
    if (srv->test_drop_hello > 0) { /* the first hello of each of N workers */
        bool seen = false;
        for (uint32_t i = 0; i < 8 && srv->test_dropped_pid[i]; i++)
            seen |= srv->test_dropped_pid[i] == msg->pid;
        if (!seen) {
            for (uint32_t i = 0; i < 8; i++)
                if (srv->test_dropped_pid[i] == 0) {
                    srv->test_dropped_pid[i] = msg->pid;
                    break;
                }
            srv->test_drop_hello--;
            PS_LOG(PS_LOG_WARN, "server", "hello of rank %d from %s dropped unanswered "
                   "(PS_TEST_DROP_HELLO)", msg->rank, c->peer);
            return;
        }
    }
    if (srv->coord) {
        psd_coord_on_hello(srv, c, msg);
        return;
    }
    int32_t rank = msg->rank;
    if (rank < 0 || rank >= PS_MAX_RANKS) {
        psd_send_error(srv, c, msg->req_id, PS_EPROTO, "rank %d out of range [0, %d): say hello "
                       "to shard 0 first", rank, PS_MAX_RANKS);
        return;
    } else if (c->rank >= 0 && c->rank != rank) {
        /* One connection holds one rank: a second hello naming another would leave the first
         * rank pointing at this connection after it closes. */
        psd_send_error(srv, c, msg->req_id, PS_EPROTO, "this connection said hello as rank %d; "
                       "rank %d needs a connection of its own", c->rank, rank);
        return;
    } else {
        /* Shard 0 granted this rank with a join serial (samples field). A claim from an older
         * join (a removed worker that came back) is refused: it learns it was removed. A newer
         * one replaces the old connection (its worker was dropped and the rank handed on). */
        psd_conn_t *old = srv->rank_owner[rank];
        if (srv->silent_join[rank] && msg->samples == srv->silent_join[rank] &&
            srv->m.job.consistency != PS_CONSIST_BSP && srv->shard != 0) {
            /* asp / ssp: the join this shard dropped as silent (its worker stopped, or cut off,
             * past heartbeat_timeout_ms) comes back. Shard 0 dropped it too (within a cron
             * tick), or will: removed, its batch handed to another worker, which may have
             * pushed it here already. A push it still holds would then apply that batch twice,
             * and no step or view tells it apart here (bsp's pushes carry their step's
             * members). It learns it was removed and joins again; its batch is handed on as for
             * any departure. A worker continued after shard 0 dropped it but before this shard
             * did says no hello: batch_taken_again (push.c) knows its late push. Not covered:
             * a join dropped here before this psd restarted (DESIGN-NOTES.md, Failures). */
            PS_LOG(PS_LOG_WARN, "server", "rank %d (pid %u, join %llu) is back after this shard "
                   "dropped it as silent: refused (it was removed)", rank, msg->pid,
                   (unsigned long long)msg->samples);
            psd_send_error(srv, c, msg->req_id, PS_ENOTMEMBER,
                           "rank %d (join %llu) fell silent past the heartbeat timeout and was "
                           "dropped: join again", rank, (unsigned long long)msg->samples);
            return;
        }
        if (old && old != c && !old->dead && msg->samples < old->join_serial) {
            psd_send_error(srv, c, msg->req_id, PS_ENOTMEMBER,
                           "rank %d now belongs to a later worker (join %llu, this one %llu)",
                           rank, (unsigned long long)old->join_serial,
                           (unsigned long long)msg->samples);
            return;
        }
        if (old && old != c && !old->dead) {
            PS_LOG(PS_LOG_WARN, "server", "rank %d moves from pid %u to pid %u; dropping the old "
                   "connection", rank, old->pid, msg->pid);
            old->dead = true;
            old->close_queued = true;
        }
        srv->rank_owner[rank] = c;
    }
    c->rank = rank;
    c->pid = msg->pid;
    c->host_id = msg->store_id;
    c->join_serial = msg->samples;
    PS_LOG(PS_LOG_INFO, "server", "worker pid %u from %s is rank %d", c->pid, c->peer, rank);
    ps_msg_t r = {.type = PS_MSG_HELLO_REPLY, .req_id = msg->req_id, .rank = rank,
                  .epoch = psd_shard_epoch(srv), .shard = srv->shard,
                  .consistency = (uint32_t)srv->m.job.consistency,
                  .step = psd_shard_step(srv), .count = psd_shard_tensors(srv),
                  .flags = PSD_HELLO_FLAGS};
    psd_hello_store(srv, msg, &r);
    psd_hello_run(srv, &r);
    psd_hello_area(srv, c, msg, &r);
    psd_send_msg(srv, c, &r);
}

static void on_status_sent(void *request, ucs_status_t status, void *user_data)
{
    psd_send_t *s = user_data;
    psd_conn_unref(s->conn);
    s->next_free = s->srv->free_sends;
    s->srv->free_sends = s;
    if (request) ucp_request_free(request);
}

size_t psd_status_cap(void)
{
    return 8192 + 256 * (size_t)PS_MAX_RANKS + 48 * (size_t)PS_PASS_RING;
}

/* Append @p fmt to @p out (@p cap bytes, *@p len used) when it fits whole; else nothing, and
 * *@p len stays below @p cap (the other parts, psd_shard_status_json and the like, clamp theirs
 * the same way), so that no later append's cap - len wraps. */
static void status_put(char *out, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void status_put(char *out, size_t cap, size_t *len, const char *fmt, ...)
{
    if (*len >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n > 0 && (size_t)n < cap - *len) *len += (size_t)n;
    else out[*len] = '\0';
}

size_t psd_status_json(psd_server_t *srv, char *out, size_t cap)
{
    size_t len = 0;
    const ps_server_conf_t *sc = &srv->m.servers[srv->shard];
    len += (size_t)snprintf(out, cap,
                            "{\"shard\": %u, \"address\": \"%s:%u\", \"cluster\": \"%s\", "
                            "\"step\": %llu, \"consistency\": \"%s\", \"optimizer\": \"%s\", "
                            "\"pushes\": %llu, \"pulls\": %llu, \"direct_pulls\": %llu, "
                            "\"direct_pushes\": %llu, "
                            "\"bundles_received\": %llu, \"bundles_sent\": %llu, "
                            "\"updates_applied\": %llu, \"crc_errors\": %llu, "
                            "\"replays_skipped\": %llu, \"stale_acks\": %llu, "
                            "\"transport_restarts\": %llu, \"authentication\": %s, "
                            "\"auth_refused\": %llu, \"auth_forged\": %llu, "
                            "\"run\": \"%016llx\", \"run_base_step\": %llu, "
                            "\"run_origin\": \"%016llx\", \"stopping\": %s, ",
                            srv->shard, sc->host, sc->port, srv->m.cluster,
                            (unsigned long long)psd_shard_step(srv),
                            ps_consistency_name(srv->m.job.consistency),
                            ps_optim_name(srv->m.job.optimizer.name),
                            (unsigned long long)srv->pushes, (unsigned long long)srv->pulls,
                            (unsigned long long)srv->direct_pulls,
                            (unsigned long long)srv->direct_pushes,
                            (unsigned long long)srv->bundles_received,
                            (unsigned long long)srv->bundles_sent,
                            (unsigned long long)srv->applied_updates,
                            (unsigned long long)srv->crc_errors,
                            (unsigned long long)srv->replays_skipped,
                            (unsigned long long)srv->stale_acks,
                            (unsigned long long)srv->transport_restarts,
                            srv->auth->on ? "true" : "false",
                            (unsigned long long)srv->auth_refused,
                            (unsigned long long)srv->auth_forged,
                            (unsigned long long)srv->run.id,
                            (unsigned long long)srv->run.base_step,
                            (unsigned long long)srv->run.origin, srv->stopping ? "true" : "false");
    if (len >= cap) len = cap - 1; /* cut: the parts below then add nothing */
    double lr;
    if (psd_last_lr(srv, &lr)) status_put(out, cap, &len, "\"learning_rate\": %.9g, ", lr);
    else status_put(out, cap, &len, "\"learning_rate\": null, ");
    psd_shard_status_json(srv, out, cap, &len);
    psd_integrity_status_json(srv, out, cap, &len);
    psd_sync_status_json(srv, out, cap, &len);
    if (srv->coord) {
        status_put(out, cap, &len, ", ");
        psd_coord_status_json(srv, out, cap, &len);
        status_put(out, cap, &len, "}");
        return len >= cap ? cap - 1 : len;
    }
    status_put(out, cap, &len, ", \"members\": [");
    uint64_t now = psd_now_ms();
    int first = 1;
    for (psd_conn_t *m = srv->conns; m && len + 200 < cap; m = m->next) {
        if (m->rank < 0 || m->dead) continue;
        status_put(out, cap, &len,
                   "%s{\"rank\": %d, \"pid\": %u, \"peer\": \"%s\", \"last_heard_ms\": %llu}",
                   first ? "" : ", ", m->rank, m->pid, m->peer,
                   (unsigned long long)(now - m->last_seen_ms));
        first = 0;
    }
    status_put(out, cap, &len, "]}");
    return len >= cap ? cap - 1 : len;
}

/* MSG_STATUS: one JSON object describing this shard (psd_status_json), as the reply's data. */
static void send_status(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg)
{
    psd_send_t *s = srv->free_sends;
    if (s)
        srv->free_sends = s->next_free;
    else if ((s = calloc(1, sizeof *s)) == NULL)
        return;
    size_t cap = psd_status_cap();
    if (s->payload_cap < cap) {
        uint8_t *b = realloc(s->payload, cap);
        if (b == NULL) {
            s->next_free = srv->free_sends;
            srv->free_sends = s;
            return;
        }
        s->payload = b;
        s->payload_cap = cap;
    }
    char *out = (char *)s->payload;
    size_t len = psd_status_json(srv, out, cap);
    ps_msg_t r = {.type = PS_MSG_STATUS_REPLY, .req_id = msg->req_id, .shard = srv->shard,
                  .length = len};
    size_t hlen;
    if (psd_encode(srv, c, &r, s->hdr, sizeof s->hdr, &hlen) != 0) { /* not expected: said */
        PS_LOG(PS_LOG_WARN, "server", "status reply to %s: its header does not encode", c->peer);
        s->next_free = srv->free_sends;
        srv->free_sends = s;
        return;
    }
    s->srv = srv;
    s->conn = c;
    s->snap = NULL;
    psd_conn_ref(c);
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.send = on_status_sent, .user_data = s};
    void *req = ucp_am_send_nbx(c->ep, PS_AM_CTRL, s->hdr, hlen, out, len, &p);
    if (req == NULL || UCS_PTR_IS_ERR(req)) on_status_sent(NULL, UCS_OK, s);
}

/* MSG_ECHO (psworker --self-test): receive the data into a scratch buffer (its contents do not
 * matter, several echoes may share it) and answer once it is all here. */
typedef struct {
    psd_server_t *srv;
    psd_conn_t *conn;
    uint64_t req_id;
    void *own; /* its own landing place when the shared one was busy and too small */
    void *into; /* where its rendezvous receive lands, while it does (ps_tcpguard_expect) */
} echo_t;

static void echo_done(void *request, ucs_status_t status, size_t length, void *user_data)
{
    echo_t *e = user_data;
    if (e->into) ps_tcpguard_done(e->into);
    ps_msg_t r = {.type = PS_MSG_ECHO_REPLY, .req_id = e->req_id, .shard = e->srv->shard,
                  .length = length, .status = status == UCS_OK ? 0 : ps_ucx_err(status)};
    psd_send_msg(e->srv, e->conn, &r);
    psd_conn_unref(e->conn);
    if (e->own) free(e->own);
    else if (request) e->srv->echo_busy--;
    free(e);
    if (request) ucp_request_free(request);
}

#define PSD_ECHO_MAX (64u << 20)

static ucs_status_t echo_recv(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg,
                              void *data, size_t length, const ucp_am_recv_param_t *param)
{
    echo_t *e = malloc(sizeof *e);
    if (length > PSD_ECHO_MAX || e == NULL) {
        free(e);
        psd_send_error(srv, c, msg->req_id, PS_EINVAL, "echo of %zu bytes (at most %u)", length,
                       PSD_ECHO_MAX);
        return UCS_OK;
    }
    *e = (echo_t){srv, c, msg->req_id};
    psd_conn_ref(c);
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        echo_done(NULL, UCS_OK, length, e);
        return UCS_OK;
    }
    /* The shared buffer grows only while no receive lands in it; an echo that needs more
     * meanwhile (several peers' self-tests, or a confused one) gets a buffer of its own. */
    void *dst = srv->echo_buf;
    if (srv->echo_cap < length && srv->echo_busy == 0) {
        void *b = realloc(srv->echo_buf, length);
        if (b == NULL) {
            echo_done(NULL, UCS_ERR_NO_MEMORY, 0, e);
            return UCS_OK;
        }
        dst = srv->echo_buf = b;
        srv->echo_cap = length;
    } else if (srv->echo_cap < length) {
        if ((dst = e->own = malloc(length)) == NULL) {
            echo_done(NULL, UCS_ERR_NO_MEMORY, 0, e);
            return UCS_OK;
        }
    }
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.recv_am = echo_done, .user_data = e};
    bool shared = e->own == NULL; /* e is not read after the call: the callback frees it */
    e->into = dst;
    ps_tcpguard_expect(dst, length); /* a put over TCP may land there (tcpguard.c) */
    void *req = ucp_am_recv_data_nbx(srv->ucx.worker, data, dst, length, &p);
    if (req == NULL) {
        echo_done(NULL, UCS_OK, length, e);
    } else if (UCS_PTR_IS_ERR(req)) {
        echo_done(NULL, UCS_PTR_STATUS(req), 0, e);
    } else if (shared) {
        srv->echo_busy++; /* until echo_done, called with the request */
    }
    return UCS_OK;
}

/* A message or bundle entry from @p c that did not decode (@p err): counted, and logged once
 * per connection (then at debug level): one connection sending malformed headers without end
 * grew psd's log by 2.4 MB/s (a helper's probe, session 59). Its sender is answered each time
 * by the caller. */
static void bad_input_log(psd_server_t *srv, psd_conn_t *c, const char *err)
{
    srv->bad_headers++;
    PS_LOG(c->bad_warned ? PS_LOG_DEBUG : PS_LOG_WARN, "server", "from %s: %s%s", c->peer, err,
           c->bad_warned ? "" : " (more malformed messages of this connection are answered, "
                                "not logged)");
    c->bad_warned = true;
}

/* A worker's fused pushes and pulls: each entry is handled as if it came alone; the replies
 * they cause (and those of any apply they complete) go back bundled. */
static void on_bundle(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg, void *data,
                      size_t length, const ucp_am_recv_param_t *param)
{
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        psd_send_error(srv, c, msg->req_id, PS_EPROTO, "bundle sent by rendezvous, not eagerly");
        return;
    }
    if (msg->length != length || msg->count == 0 || msg->count > PS_BUNDLE_MAX_ENTRIES) {
        psd_send_error(srv, c, msg->req_id, PS_EPROTO,
                       "bundle of %llu entries in %zu bytes (header says %llu)",
                       (unsigned long long)msg->count, length, (unsigned long long)msg->length);
        return;
    }
    char err[256];
    if (ps_bundle_check(data, length, (uint32_t)msg->count, err, sizeof err)) {
        /* Refused whole: none of its entries is acted on. */
        bad_input_log(srv, c, err);
        psd_send_error(srv, c, msg->req_id, PS_EPROTO, "%s", err);
        return;
    }
    c->fuses = true;
    srv->bundles_received++;
    ucp_am_recv_param_t eager = {.recv_attr = 0};
    ps_bundle_iter_t it;
    ps_bundle_iter_init(&it, data, length, (uint32_t)msg->count);
    psd_outbox_begin(srv);
    ps_msg_t m;
    const void *d;
    size_t dlen;
    int rc;
    while ((rc = ps_bundle_next(&it, &m, &d, &dlen, err, sizeof err)) != 0 && !c->dead) {
        if (rc < 0) { /* that entry only */
            bad_input_log(srv, c, err);
            psd_send_error(srv, c, msg->req_id, PS_EPROTO, "%s", err);
        } else if (m.type == PS_MSG_PUSH) {
            psd_shard_on_push(srv, c, &m, (void *)d, dlen, &eager);
        } else if (m.type == PS_MSG_PULL && dlen == 0) {
            psd_shard_on_pull(srv, c, &m);
        } else {
            psd_send_error(srv, c, m.req_id, PS_EPROTO, "a bundle carries pushes and pulls, "
                           "not %s with %zu bytes", ps_msg_type_name(m.type), dlen);
        }
    }
    psd_shard_kick(srv); /* what the pushes made ready: one job, its acks in the bundle */
    psd_outbox_end(srv);
}

/* MSG_AUTH, the first message of a client's connection: its proof of the cluster secret. A
 * refused proof's reason is kept for the refusals of what follows; a later good one still opens
 * the connection. A shard without a secret refuses a connection that sent one: its replies go
 * unsealed, which such a client drops (psctl's scale was applied while psctl reported no
 * answer; a probe, session 41). */
static void on_auth(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg)
{
    if (!srv->auth->on) { /* its requests are refused, saying why (on_am) */
        snprintf(c->auth_why, sizeof c->auth_why, "shard %u has no secret_file, but this peer "
                 "proved one: give every manifest of the cluster the same secret_file (or none)",
                 srv->shard);
        return;
    }
    if (c->authed) return;
    const ps_server_conf_t *me = &srv->m.servers[srv->shard]; /* proofs are made for it */
    c->authed = ps_auth_check(srv->auth, &srv->auth_seen, me->host, me->port, msg->auth,
                              msg->auth_len, (int64_t)time(NULL) + srv->test_clock_ahead_s,
                              c->auth_why,
                              sizeof c->auth_why) == 0;
    if (c->authed) ps_auth_session(srv->auth, msg->auth, c->session);
}

/* A header on a proven connection without its session token (or one that does not decode):
 * UCX names the sender's connection by an endpoint id the sender writes itself, so this may be
 * a peer without the secret that guessed it, speaking as this connection. Dropped unanswered
 * (an answer would go to the connection's owner); logged once per connection, counted. */
static void forged_drop(psd_server_t *srv, psd_conn_t *c, const char *type, const char *what)
{
    srv->auth_forged++;
    if (c->forged_warned) return;
    c->forged_warned = true;
    PS_LOG(PS_LOG_WARN, "server", "peer %s: %s %s: dropped (a peer without the secret that "
           "guessed this connection's UCX endpoint id?)", c->peer, type, what);
}

/* ---- the runs digest (ps_runs_digest, proto/wire.h) ----------------------------------- */

static void joined_set(psd_server_t *srv, uint64_t digest);

/* Writes joined_saving to the store, between store jobs (slot work: the loop never waits for
 * the store's one writer). The loop does not change joined_saving while this is queued. */
static void joined_save_run(psd_slot_work_t *w)
{
    psd_server_t *srv = w->srv;
    srv->joined_save_rc = psd_store_set_blob(&srv->store, PSD_JOINED_BLOB, &srv->joined_saving,
                                             sizeof srv->joined_saving);
}

static void joined_save_done(psd_slot_work_t *w)
{
    psd_server_t *srv = w->srv;
    uint64_t saved = srv->joined_saving;
    srv->joined_saving = 0;
    if (srv->joined_save_rc) /* the next heartbeat asks again (quiet while updates wait) */
        PS_LOG(srv->pinned_since_ms ? PS_LOG_DEBUG : PS_LOG_WARN, "server",
               "cannot record the stores' runs digest: %s",
               psd_store_strerror(srv, srv->joined_save_rc));
    else
        srv->joined_stored = saved;
    if (srv->joined_save_rc == 0)
        PS_LOG(PS_LOG_INFO, "server", "the stores' runs digest of the workers' joins is now "
               "%016llx", (unsigned long long)saved);
    if (srv->joined_save_rc == 0 && srv->joined_runs != saved)
        joined_set(srv, srv->joined_runs); /* changed meanwhile */
}

/* A member's heartbeat says the runs digest of its join (every shard's run then): kept, so
 * that a join after this shard or another was restored or replaced alone finds the shards
 * disagreeing (libps's join_runs_check). Written once per change. */
static void joined_set(psd_server_t *srv, uint64_t digest)
{
    srv->joined_runs = digest;
    if (srv->joined_saving) return; /* joined_save_done writes the newest */
    srv->joined_saving = digest;
    srv->joined_save = (psd_slot_work_t){.srv = srv, .run = joined_save_run,
                                         .done = joined_save_done};
    psd_shard_slot_queue(srv, &srv->joined_save);
}

/* A request on a connection that has not proved the cluster secret: the first is refused with
 * the reason (its sender's call ends with it) and logged; the rest are dropped unanswered until
 * a good proof (before, each got an answer that a peer not reading them left in psd's memory:
 * 300,000 junk headers grew it by 330 MB, found by a review). Such a connection is closed
 * auth_deadline_ms after it came (server_cron). */
static void auth_refuse(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *msg)
{
    const char *why = c->auth_why[0] ? c->auth_why
                                     : "no proof of the cluster secret came first (the peer's "
                                       "manifest has no secret_file?)";
    if (c->auth_warned) return;
    c->auth_warned = true;
    srv->auth_refused++;
    PS_LOG(PS_LOG_WARN, "server", "peer %s: %s refused: %s", c->peer,
           ps_msg_type_name(msg->type), why);
    psd_send_error(srv, c, msg->req_id, PS_EAUTH, "authentication refused: %s", why);
}

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    psd_server_t *srv = arg;
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return UCS_OK;
    psd_conn_t *c = psd_conn_by_ep(srv, param->reply_ep);
    if (c == NULL || c->dead) return UCS_OK;
    ps_msg_t msg;
    char err[256];
    bool proven = srv->auth->on && c->authed;
    if (ps_msg_decode(&msg, header, header_length, err, sizeof err)) {
        if (proven) { /* its session token cannot be told: not answered */
            forged_drop(srv, c, "a header", err);
            return UCS_OK;
        }
        bool unproven = !c->authed && srv->auth->on;
        if (unproven && c->auth_warned) return UCS_OK; /* see auth_refuse */
        c->auth_warned |= unproven;
        bad_input_log(srv, c, err);
        /* The request's id when the header got that far (0 otherwise), so that its sender's
         * call ends with the reason instead of waiting for an answer. */
        psd_send_error(srv, c, msg.req_id, PS_EPROTO, "%s", err);
        return UCS_OK;
    }
    c->spoke = true; /* quiet_deadline_ms */
    if (msg.type == PS_MSG_AUTH) {
        on_auth(srv, c, &msg);
        return UCS_OK;
    }
    if (proven && !ps_auth_session_ok(c->session, msg.session, msg.session_len)) {
        forged_drop(srv, c, ps_msg_type_name(msg.type),
                    msg.session_len ? "with another session token" : "without a session token");
        return UCS_OK; /* its data, if any, is dropped unread */
    }
    /* Heard from (heartbeat_timeout_ms): only now, so that a forged header cannot keep a hung
     * worker's connection alive. Not the loop's cached time: the loop may have stalled. */
    c->last_seen_ms = psd_now_ms();
    if ((!c->authed && srv->auth->on) || (!srv->auth->on && c->auth_why[0])) {
        auth_refuse(srv, c, &msg); /* its data, if any, is dropped unread */
        return UCS_OK;
    }
    if (msg.type == PS_MSG_STATUS) {
        send_status(srv, c, &msg);
        return UCS_OK;
    }
    if ((msg.type == PS_MSG_SCALE || msg.type == PS_MSG_LAUNCH) && length == 0) {
        /* Operator requests: no hello needed, like status; but for this cluster (a manifest of
         * another one that names this address must not scale this job). */
        if (psd_refuse_other_cluster(srv, c, &msg, false)) return UCS_OK;
        if (srv->coord == NULL)
            psd_send_error(srv, c, msg.req_id, PS_EPROTO, "%s goes to shard 0, not shard %u "
                           "(the manifest lists the servers in another order?)",
                           ps_msg_type_name(msg.type), srv->shard);
        else if (msg.type == PS_MSG_SCALE)
            psd_coord_on_scale(srv, c, &msg);
        else
            psd_coord_on_launch(srv, c, &msg);
        return UCS_OK;
    }
    if (msg.type == PS_MSG_FORGET && length == 0) { /* psctl forget, or a member's give-up */
        psd_forget_on_msg(srv, c, &msg);
        return UCS_OK;
    }
    if (msg.type >= PS_MSG_CKPT_BEGIN && length == 0) { /* psctl checkpoint / repair */
        if (!psd_refuse_other_cluster(srv, c, &msg, true)) psd_ckpt_on_msg(srv, c, &msg);
        return UCS_OK;
    }
    if (msg.type >= PS_MSG_EXPORT_BEGIN) { /* psctl export / verify: no hello, no data */
        if (!psd_refuse_other_cluster(srv, c, &msg, true)) psd_export_on_msg(srv, c, &msg);
        return UCS_OK;
    }
    if (msg.type == PS_MSG_EPOCH && length == 0) {
        /* Forwarded by a member (maybe before its hello here): the coordinator changed the
         * open step's members, or told those of a step it closed (PS_FLAG_CLOSED; with no
         * members, a chunk still at it passes it: psd__step_closed_empty, shard.c). Carries no
         * rank state, so no hello is needed. */
        if (srv->coord == NULL && msg.epoch != 0 && (msg.members != 0 || (msg.flags & PS_FLAG_CLOSED)))
            psd_shard_learn_view(srv, msg.epoch, msg.step, msg.members,
                                 (msg.flags & PS_FLAG_CLOSED) != 0);
        return UCS_OK;
    }
    if (msg.type != PS_MSG_HELLO && c->rank < 0) {
        psd_send_error(srv, c, msg.req_id, PS_EPROTO, "%s before hello",
                       ps_msg_type_name(msg.type));
        return UCS_OK;
    }
    if (msg.type == PS_MSG_ECHO) return echo_recv(srv, c, &msg, data, length, param);
    if (msg.type == PS_MSG_BUNDLE) {
        on_bundle(srv, c, &msg, data, length, param);
        return UCS_OK;
    }
    if (msg.type == PS_MSG_VALUES) return psd_shard_on_values(srv, c, &msg, data, length, param);
    if (msg.type != PS_MSG_PUSH && length > 0) {
        psd_send_error(srv, c, msg.req_id, PS_EPROTO, "%s carries unexpected data",
                       ps_msg_type_name(msg.type));
        return UCS_OK;
    }
    if (msg.type == PS_MSG_HELLO && c->lanes[0] == '\0') c->want_lanes = true; /* conn.c */
    switch (msg.type) {
    case PS_MSG_HELLO: on_hello(srv, c, &msg); break;
    case PS_MSG_DECLARE: psd_shard_on_declare(srv, c, &msg); break;
    case PS_MSG_PUSH: return psd_shard_on_push(srv, c, &msg, data, length, param);
    case PS_MSG_PULL: psd_shard_on_pull(srv, c, &msg); break;
    case PS_MSG_HEARTBEAT:
        if (msg.joined_runs != 0 && c->rank >= 0 &&
            (msg.joined_runs != srv->joined_runs || srv->joined_runs != srv->joined_stored))
            joined_set(srv, msg.joined_runs);
        psd_floor_told(srv, c, &msg);
        if (msg.flags & PS_FLAG_ANSWER) { /* the worker tells a silent shard by it */
            ps_msg_t r = {.type = PS_MSG_HEARTBEAT, .req_id = msg.req_id, .rank = c->rank,
                          .shard = srv->shard};
            psd_send_msg(srv, c, &r);
        }
        break;
    case PS_MSG_BATCH:
        if (srv->coord)
            psd_coord_on_batch(srv, c, &msg);
        else
            psd_send_error(srv, c, msg.req_id, PS_EPROTO, "batches come from shard 0");
        break;
    case PS_MSG_LEAVE:
        PS_LOG(PS_LOG_INFO, "server", "rank %d (pid %u) says leave", c->rank, c->pid);
        if (srv->coord && (msg.flags & PS_FLAG_DONE)) psd_coord_on_leave_done(srv, c, &msg);
        psd_floor_told(srv, c, &msg); /* its last word of the next shard: no heartbeat follows */
        psd_conn_release_rank(srv, c, "it said leave", false);
        c->rank = -1; /* it may not push for that rank any more */
        /* Answered: the worker closes its connection only after this, so the close cannot
         * overtake the leave and make the rank wait for a process that said it goes
         * (elastic:leave_while_coordinator_stopped). */
        psd_send_msg(srv, c, &(ps_msg_t){.type = PS_MSG_LEAVE_REPLY, .req_id = msg.req_id,
                                         .shard = srv->shard});
        break;
    default:
        psd_send_error(srv, c, msg.req_id, PS_EPROTO, "unexpected %s",
                       ps_msg_type_name(msg.type));
    }
    return UCS_OK;
}

/* The cron: the connections' deadlines (psd_conns_cron: a joined worker silent past
 * job.heartbeat_timeout_ms is dropped like a dead one), the coordinator's tick, the store's
 * and the transport's checks, syncs, the checkpoint follower and exports. */
static void on_cron(uv_timer_t *h)
{
    psd_server_t *srv = h->data;
    uint64_t limit = srv->m.job.heartbeat_timeout_ms;
    /* Read what is queued first: after a stall of this loop the heartbeats wait unread. */
    ps_ucx_progress(&srv->ucx);
    uint64_t now = psd_now_ms();
    bool stalled = now - srv->last_cron_ms > limit / 2;
    srv->last_cron_ms = now;
    if (stalled) {
        /* This loop itself did not run for a while (a long close, the host descheduled us):
         * silence then says nothing about the peers; give them one more period. */
        PS_LOG(PS_LOG_WARN, "server", "cron ran late; heartbeat checks skipped once");
        for (psd_conn_t *c = srv->conns; c; c = c->next) {
            c->last_seen_ms = now;
            if (c->rank < 0) c->born_ms = now; /* nor their first message's deadlines */
        }
        srv->late_floor_ms = uv_now(srv->loop); /* nor is a member's lateness (step_timeout) */
        if (srv->coord) psd_coord_stalled(srv); /* nor the absence of a closed connection */
    }
    int dropped = psd_conns_cron(srv, now);
    if (srv->coord) psd_coord_tick(srv);
    psd_direct_reap(srv); /* also a reader that exited unnoticed: its slot would pin pages */
    psd_store_pin_cron(srv); /* updates waiting for an old snapshot: tried again */
    /* Ready chunks or queued creations a job start left for lack of memory (a review, session
     * 63: under bsp no later push may come to start them); nothing when a job runs. */
    if (!srv->stopping && srv->pinned_since_ms == 0 && (srv->ready_head || srv->ncreate))
        psd_shard_kick(srv);
    psd_shard_test_tick(srv);
    psd_shard_values_cron(srv, now);
    if (dropped) ps_ucx_progress(&srv->ucx);
    psd_transport_check(srv);
    psd_sync_cron(srv, uv_now(srv->loop));
    psd_floor_cron(srv);
    psd_follower_cron(srv, uv_now(srv->loop));
    psd_export_cron(srv, uv_now(srv->loop));
}

/* ---- start and stop ----------------------------------------------------- */

void psd_server_maybe_stop(psd_server_t *srv)
{
    if (!srv->stopping || !psd_shard_idle(srv) || !psd_export_idle(srv) || !psd_sync_idle(srv) ||
        !psd_ckpt_idle(srv) || srv->stop_said)
        return;
    /* Once: the loop ends its iteration after uv_stop, and what runs in it (a member's leave)
     * may ask again (the stop was logged twice: an ASan run's churn, session 67). */
    srv->stop_said = true;
    PS_LOG(PS_LOG_INFO, "server", "shard %u stopping at step %llu", srv->shard,
           (unsigned long long)psd_shard_step(srv));
    uv_stop(srv->loop);
}

static void on_signal(uv_signal_t *h, int signum)
{
    psd_server_t *srv = h->data;
    if (srv->stopping) return;
    PS_LOG(PS_LOG_INFO, "server", "%s: finishing what is in flight",
           signum == SIGINT ? "SIGINT" : signum == SIGHUP ? "SIGHUP" : "SIGTERM");
    srv->stopping = true;
    psd_follower_signal(srv);
    /* Complete steps still being applied; partial steps are left for a restart. */
    psd_server_maybe_stop(srv);
}

/* Test hook @p name's value from the environment: a positive count (at most @p max, when not 0),
 * or 0 when it is not set. */
static uint32_t test_hook(const char *name, uint32_t max)
{
    const char *v = getenv(name);
    int n = v ? atoi(v) : 0;
    if (n <= 0) return 0;
    return max && (uint32_t)n > max ? max : (uint32_t)n;
}

/* SIGINT, SIGTERM or SIGHUP before the loop's handlers are set (the arguments and the
 * manifest, the shard's host resolved, the store's load, a format upgrade or a restore, which
 * a large store makes long, and the ports' start): psd stops at
 * once, the store as its last commit left it, and exits 0 as its stop does later (nothing was
 * in flight); before, their default action ended it (exit 128 + the signal). During a
 * --restore the restore's files go first, as after a failed one (the same command may run
 * again), and the exit is 128 + the signal: the restore did not happen (a review). A handler,
 * not the default action: as PID 1 (a container's, `exec psd`) psd ignored a signal it had no
 * handler for, and a pod deleted during a long load waited its whole grace period for its
 * SIGKILL (a review of deploy/, session 66). */
static void early_signal(int sig)
{
    static const char msg[] = "psd: a signal before serving: stopped (the store as its last "
                              "commit left it)\n";
    static const char undone[] = "psd: a signal during --restore: stopped, the restore's files "
                                 "removed (run the same psd --restore again)\n";
    bool restoring = psd_ckpt_bus_unlink_now() > 0;
    if (ps_log_level < PS_LOG_OFF) {
        ssize_t n = restoring ? write(STDERR_FILENO, undone, sizeof undone - 1)
                              : write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)n;
    }
    _exit(restoring ? 128 + sig : 0);
}

void psd_early_signals(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    struct sigaction sa = {.sa_handler = early_signal};
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        if (!ps_signal_ignored(sigs[i])) /* (nohup's stays ignored) */
            sigaction(sigs[i], &sa, NULL);
}

int psd_server_run(const ps_manifest_t *m, const ps_auth_t *auth, uint32_t shard,
                   const char *restore, const char *trace, bool forget_floor, char *err,
                   size_t errlen)
{
    psd_server_t *srv = calloc(1, sizeof *srv);
    if (srv == NULL) return PS_ENOMEM;
    int rc;
    srv->m = *m;
    srv->auth = auth;
    srv->shard = shard;
    srv->nshards = (uint32_t)m->nservers;
    srv->chunk_elems = m->chunk_bytes / 4;
    srv->optim = (psk_optim_kind_t)m->job.optimizer.name;
    srv->nstate = (uint32_t)psk_optim_state_count(srv->optim);
    srv->loop = uv_default_loop();
    srv->rank_owner = calloc(PS_MAX_RANKS, sizeof *srv->rank_owner);
    if (srv->rank_owner == NULL) {
        free(srv);
        snprintf(err, errlen, "out of memory");
        return PS_ENOMEM;
    }
    const ps_server_conf_t *sc = &m->servers[shard];
    /* Test hooks (tests only; each logged as a warning). */
    if ((srv->test_clock_ahead_s = test_hook("PS_TEST_CLOCK_AHEAD_S", 0)))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_CLOCK_AHEAD_S=%u: proofs are checked as if this "
               "shard's clock ran %u s ahead (a test hook)", srv->test_clock_ahead_s,
               srv->test_clock_ahead_s);
    if ((srv->test_corrupt_pull = test_hook("PS_TEST_CORRUPT_PULL", 0)))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_CORRUPT_PULL=%u: every %uth pull reply is "
               "corrupted on purpose (a test hook)", srv->test_corrupt_pull,
               srv->test_corrupt_pull);
    if ((srv->test_lose_ack = test_hook("PS_TEST_LOSE_ACK", 0)))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_LOSE_ACK=%u: push acknowledgement %u is lost and "
               "its connection closed on purpose (a test hook)", srv->test_lose_ack,
               srv->test_lose_ack);
    if ((srv->test_crash_after_apply = test_hook("PS_TEST_CRASH_AFTER_APPLY", 0)))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_CRASH_AFTER_APPLY=%u: this shard kills itself "
               "after apply job %u commits (a test hook)", srv->test_crash_after_apply,
               srv->test_crash_after_apply);
    if ((srv->test_crash_after_batch = test_hook("PS_TEST_CRASH_AFTER_BATCH", 0)))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_CRASH_AFTER_BATCH=%u: this shard kills itself at "
               "the first push after it handed out batch %u (a test hook)",
               srv->test_crash_after_batch, srv->test_crash_after_batch);
    if ((srv->test_crash_finish_save = test_hook("PS_TEST_CRASH_FINISH_SAVE", 0)))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_CRASH_FINISH_SAVE=%u: this shard kills itself in the "
               "save of asp / ssp answer %u that ends a worker's run (a test hook)",
               srv->test_crash_finish_save, srv->test_crash_finish_save);
    if ((srv->test_crash_close_save = test_hook("PS_TEST_CRASH_CLOSE_SAVE", 0)))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_CRASH_CLOSE_SAVE=%u: this shard kills itself in the "
               "save of the last report of a step handed out again (a test hook)",
               srv->test_crash_close_save);
    if ((srv->test_crash_join_save = test_hook("PS_TEST_CRASH_JOIN_SAVE", 0)))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_CRASH_JOIN_SAVE=%u: this shard kills itself in the "
               "save of bsp hand-out %u that brings in a new member (a test hook)",
               srv->test_crash_join_save, srv->test_crash_join_save);
    if ((srv->test_fail_handout_save = test_hook("PS_TEST_FAIL_HANDOUT_SAVE", 0)))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_FAIL_HANDOUT_SAVE=%u: the save of hand-out %u "
               "fails once on purpose (a test hook)", srv->test_fail_handout_save,
               srv->test_fail_handout_save);
    if ((srv->test_fail_create = test_hook("PS_TEST_FAIL_CREATE", 0)))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_FAIL_CREATE=%u: tensor creation %u fails on "
               "purpose (a test hook)", srv->test_fail_create, srv->test_fail_create);
    if ((srv->test_slow_apply = test_hook("PS_TEST_SLOW_APPLY", 0))) {
        const char *hold = getenv("PS_TEST_SLOW_APPLY_HOLD");
        srv->test_slow_apply_hold = hold && *hold ? hold : NULL;
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_SLOW_APPLY=%u: the first apply job of step %u "
               "takes %s longer on purpose (a test hook)", srv->test_slow_apply - 1,
               srv->test_slow_apply - 1, srv->test_slow_apply_hold ? "while a file exists" : "2 s");
    }
    if ((srv->test_no_floor = test_hook("PS_TEST_NO_FLOOR", 0) != 0))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_NO_FLOOR: this shard answers as a psd before "
               "session 68 (no PS_FLAG_FLOOR, its drops not kept: a test hook)");
    if ((srv->test_ckpt_hold_ms = test_hook("PS_TEST_CKPT_HOLD_MS", 0)))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_CKPT_HOLD_MS=%u: a checkpoint's hold of the "
               "hand-outs ends after %u ms (a test hook)", srv->test_ckpt_hold_ms,
               srv->test_ckpt_hold_ms);
    if ((srv->test_slow_copy_ms = test_hook("PS_TEST_SLOW_COPY_MS", 60000)))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_SLOW_COPY_MS=%u: each checkpoint copy takes %u "
               "ms longer (a test hook)", srv->test_slow_copy_ms, srv->test_slow_copy_ms);
    if ((srv->test_copy_read_fail = test_hook("PS_TEST_COPY_READ_FAIL", 0)))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_COPY_READ_FAIL=%u: the next checkpoint copy's "
               "read %u of the store fails (a test hook)", srv->test_copy_read_fail,
               srv->test_copy_read_fail);
    if ((srv->test_refuse_push = test_hook("PS_TEST_REFUSE_PUSH", 0)))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_REFUSE_PUSH=%u: compressed push chunk %u is "
               "refused as out of memory (a test hook)", srv->test_refuse_push,
               srv->test_refuse_push);
    if ((srv->test_late_rndv = test_hook("PS_TEST_LATE_RNDV", 0)))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_LATE_RNDV=%u: rendezvous push %u loses its "
               "connection while it lands, and its end is seen 3 s late (a test hook)",
               srv->test_late_rndv, srv->test_late_rndv);
    if ((srv->test_bad_seal = test_hook("PS_TEST_BAD_SEAL", 1) != 0))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_BAD_SEAL=1: what this shard sends to proven "
               "connections carries a wrong session token (a test hook)");
    if ((srv->test_confused = test_hook("PS_TEST_CONFUSED", 3)))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_CONFUSED=%u: %s (a test hook)", srv->test_confused,
               srv->test_confused == 1   ? "a new declaration is answered with another shape"
               : srv->test_confused == 2 ? "a pull of a chunk 0 is answered by a declare reply "
                                           "first"
                                         : "a pull of a chunk 0 is answered naming the version "
                                           "before the chunk's");
    if ((srv->test_drop_hello = test_hook("PS_TEST_DROP_HELLO", 8)))
        PS_LOG(PS_LOG_WARN, "server", "PS_TEST_DROP_HELLO=%u: the first hello of each of %u "
               "workers goes unanswered on purpose (a test hook)",
               srv->test_drop_hello, srv->test_drop_hello);

    unsigned threads;
    if ((rc = psd_fanout_threads_env(m->apply_threads, &threads, err, errlen)) != 0)
        goto fail_store;
    if ((rc = psd_fanout_init(&srv->fanout, threads)) != 0) {
        snprintf(err, errlen, "cannot start %u apply threads: %s", psd_fanout_threads(threads),
                 ps_strerror(rc));
        goto fail_store;
    }
    if ((rc = psd_store_in_use(sc->data_dir, err, errlen)) != 0 ||
        (rc = psd_listen_probe(srv, err, errlen)) != 0)
        goto fail_store;
    if ((rc = psd_ckpt_dir_check(m, err, errlen)) != 0) goto fail_store;
    if (restore &&
        (rc = psd_restore_check(m, sc->data_dir, restore, err, errlen)) != 0)
        goto fail_store;
    char restoring[PS_PATH_MAX];
    if (!restore && psd_restore_marked(sc->data_dir, restoring, sizeof restoring)) {
        snprintf(err, errlen, "%s holds a restore from %s that did not finish (psd stopped during "
                 "it): remove the data_dir and run psd --restore again", sc->data_dir,
                 restoring[0] ? restoring : "a checkpoint");
        rc = PS_ECONFIG;
        goto fail_store;
    }
    if (restore && (rc = psd_restore_mark(sc->data_dir, restore, err, errlen)) != 0) goto fail_store;
    /* From the mark on, a stop signal removes what the restore made (early_signal: exit 128 +
     * the signal); before, one until the fill exited 0 and left the mark and the new store,
     * which the same --restore then refused (a review, session 72). */
    if (restore) psd_restore_mark_on_fault(sc->data_dir);
    if (restore && test_hook("PS_TEST_CRASH_IN_RESTORE", 0) == 3) {
        PS_LOG(PS_LOG_WARN, "restore", "a SIGTERM right after the mark (PS_TEST_CRASH_IN_RESTORE"
               "=3, a test hook)");
        raise(SIGTERM);
    }
    rc = psd_store_open(&srv->store, sc->data_dir, m->map_size_mb, m->cluster, m->chunk_bytes,
                        srv->nstate, err, errlen);
    if (rc) {
        /* Only the mark: what is there may be another psd's that won the data_dir. */
        if (restore) {
            psd_restore_undo_on_fault(NULL);
            psd_restore_unmark(sc->data_dir);
        }
        goto fail_store;
    }
    if (restore) psd_restore_undo_on_fault(sc->data_dir); /* the store is this psd's now */
    if (restore && test_hook("PS_TEST_CRASH_IN_RESTORE", 0) == 2) {
        PS_LOG(PS_LOG_WARN, "restore", "killed right after the store was made "
               "(PS_TEST_CRASH_IN_RESTORE=2, a test hook)");
        raise(SIGKILL);
    }
    /* The state count alone lets momentum's velocity pass for adagrad's sums. */
    rc = psd_store_identity(&srv->store, "optimizer state kind", psk_optim_state_name(srv->optim),
                            err, errlen);
    /* A data_dir holds the chunks placed for its shard of its number of shards: opened as
     * another shard or under a manifest with other servers, its chunks are not where the
     * workers and psctl look (a probe, session 45: a 2-shard data_dir under a 1-shard manifest
     * served, called a trained tensor untrained, and psctl forget dropped it). Stores older
     * than the record take it at their next start. */
    char layout[64];
    snprintf(layout, sizeof layout, "shard %u of %u", shard, m->nservers);
    if (rc == 0 && (rc = psd_store_identity(&srv->store, "layout", layout, err, errlen)) ==
                       PS_ECONFIG) {
        size_t el = strlen(err);
        snprintf(err + el, errlen - el, ": its chunks are placed for the stored layout; start "
                 "it with the manifest it was made with, or restore a checkpoint into empty "
                 "data_dirs (psd --restore places the chunks for another number of shards)");
    }
    /* bsp counts steps, asp and ssp each member's batches: a store trained under one and opened
     * under the other took its chunks' versions for the other's counts (a review, session 72:
     * an asp store opened as bsp closed 261 steps without a push and called the job complete,
     * 16640 samples never trained). Stores older than the record take it at their next start. */
    if (rc == 0 &&
        (rc = psd_store_identity(&srv->store, "consistency",
                                 m->job.consistency == PS_CONSIST_BSP ? "bsp" : "asp or ssp", err,
                                 errlen)) == PS_ECONFIG) {
        size_t el = strlen(err);
        snprintf(err + el, errlen - el, ": bsp counts steps, asp and ssp each worker's batches, "
                 "so its chunks' versions mean another thing; train it on with the consistency "
                 "it was made with");
    }
    /* Once the data_dir is ours: a second psd of this shard must not truncate a live trace. */
    if (rc == 0 && trace) rc = psd_trace_open(&srv->trace, trace, shard, err, errlen);
    if (rc) {
        psd_store_close(&srv->store);
        if (restore) psd_restore_undo(sc->data_dir); /* refused before the fill: empty again */
        goto fail_store;
    }
    size_t restoring_len = 0;
    int brc = restore ? PS_ENOENT
                      : psd_store_get_blob(&srv->store, PSD_RESTORING, restoring,
                                           sizeof restoring - 1, &restoring_len);
    if (brc != 0 && brc != PS_ENOENT && brc != -EOVERFLOW) {
        snprintf(err, errlen, "%s: cannot read the store's restore mark: %s", sc->data_dir,
                 ps_strerror(brc));
        psd_store_close(&srv->store);
        rc = brc;
        goto fail_store;
    }
    if (brc == 0 || brc == -EOVERFLOW) { /* -EOVERFLOW: a longer path than fits here */
        restoring[brc == 0 ? restoring_len : 0] = '\0';
        snprintf(err, errlen, "%s holds a restore from %s that did not finish (psd stopped during "
                 "it): remove the data_dir and run psd --restore again", sc->data_dir,
                 restoring[0] ? restoring : "a checkpoint");
        psd_store_close(&srv->store);
        rc = PS_ECONFIG;
        goto fail_store;
    }
    if (restore && (rc = psd_restore_fill(srv, restore, err, errlen)) != 0) {
        if (err[0] == '\0') /* a failure without words of its own (out of memory, a put) */
            snprintf(err, errlen, "--restore %s: %s", restore, ps_strerror(rc));
        psd_store_close(&srv->store);
        psd_restore_undo(sc->data_dir); /* empty again: the same command may be tried again */
        goto fail_store;
    }
    psd_restore_undo_on_fault(NULL);
    if (restore) psd_restore_unmark(sc->data_dir);
    psd_direct_init(srv, sc->data_dir);
    srv->push_direct = psd_push_direct_enabled();
    if ((rc = psd_shard_load(srv)) != 0) {
        snprintf(err, errlen, "%s: cannot read the shard store: %s", sc->data_dir,
                 ps_strerror(rc));
        goto fail_shard;
    }
    if ((rc = psd_run_load(&srv->store, psd_shard_step_max(srv), &srv->run, err, errlen)) != 0)
        goto fail_shard;
    size_t jlen = 0;
    if (psd_store_get_blob(&srv->store, PSD_JOINED_BLOB, &srv->joined_runs,
                           sizeof srv->joined_runs, &jlen) != 0 || jlen != sizeof srv->joined_runs)
        srv->joined_runs = 0; /* none yet (a store older than session 41, or never joined) */
    srv->joined_stored = srv->joined_runs;
    psd_floor_load(srv);
    if (forget_floor && (rc = psd_floor_forget(srv)) != 0) {
        snprintf(err, errlen, "%s: --forget-floor: %s", sc->data_dir, ps_strerror(rc));
        goto fail_shard;
    }
    if (shard == 0) {
        /* The coordinator's state, as the last apply job committed it. */
        _Alignas(uint64_t) static uint8_t saved[PSD_COORD_STATE_MAX];
        _Alignas(uint64_t) static uint8_t rec[PSD_COORD_REC_MAX];
        size_t saved_len = 0, rec_len = 0;
        int jrc = psd_store_get_blob(&srv->store, "job", saved, sizeof saved, &saved_len);
        int rrc = psd_store_get_blob(&srv->store, "jobrec", rec, sizeof rec, &rec_len);
        if ((jrc && jrc != PS_ENOENT) || (rrc && rrc != PS_ENOENT)) {
            /* Not taken as none: a fresh coordinator over trained chunks (a review). */
            snprintf(err, errlen, "%s: the coordinator's %s record cannot be read: %s%s",
                     sc->data_dir, jrc ? "state (Mjob)" : "recovery (Mjobrec)",
                     ps_strerror(jrc ? jrc : rrc),
                     (jrc ? jrc : rrc) == -EOVERFLOW ? " (larger than this psd's: a store of a "
                                                       "newer psd?)" : "");
            rc = PS_ESTORE;
            goto fail_shard;
        }
        if (jrc) saved_len = 0;
        if (rrc) rec_len = 0;
        if ((rc = psd_coord_create(srv, saved_len ? saved : NULL, saved_len,
                                   rec_len ? rec : NULL, rec_len)) != 0) {
            snprintf(err, errlen, "cannot create the coordinator: %s", ps_strerror(rc));
            goto fail_shard;
        }
    }
    /* A restarted psd must get its port back even while old connections sit in TIME_WAIT. */
    setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
    if ((rc = ps_ucx_init(&srv->ucx, srv->loop)) != 0) {
        snprintf(err, errlen, "cannot initialize UCX: %s", ps_strerror(rc));
        goto fail_shard;
    }
    srv->ucx.deferred = psd_conns_deferred;
    ps_ucx_set_spin(&srv->ucx, srv->m.spin_us);
    srv->ucx.data = srv;
    srv->ucx.probe = &srv->probe; /* closed (n 0) until listen.c makes it: takes nothing */
    ps_ucx_set_am_handler(&srv->ucx, on_am, srv);

    if ((rc = psd_listen_start(srv, err, errlen)) != 0) goto fail_ucx;
    if ((rc = psd_metrics_start(srv, err, errlen)) != 0) {
        ucp_listener_destroy(srv->listener);
        srv->listener = NULL;
        goto fail_ucx;
    }
    uv_signal_init(srv->loop, &srv->sigint);
    uv_signal_init(srv->loop, &srv->sigterm);
    uv_signal_init(srv->loop, &srv->sighup);
    srv->sigint.data = srv->sigterm.data = srv->sighup.data = srv;
    uv_signal_start(&srv->sigint, on_signal, SIGINT);
    uv_signal_start(&srv->sigterm, on_signal, SIGTERM);
    /* SIGHUP (its terminal closed, an orphaned process group) stops psd as SIGTERM does. UCX
     * takes it at load time for its debug mode (UCX_DEBUG_SIGNO, read before main), which left
     * psd running with every UCX debug line in its log for good (a probe, session 40). One
     * ignored at the start (nohup; UCX's handler is gone by now, ucx_loop.c) stays ignored. */
    if (!ps_signal_ignored(SIGHUP)) uv_signal_start(&srv->sighup, on_signal, SIGHUP);
    uv_timer_init(srv->loop, &srv->cron);
    srv->cron.data = srv;
    srv->sync.opened_ms = uv_now(srv->loop);
    uint64_t tick = m->job.heartbeat_timeout_ms / 8; /* a silent worker goes within timeout + tick */
    if (m->sync_interval_s && m->sync_interval_s * 1000 < tick) tick = m->sync_interval_s * 1000;
    /* From now: a stall before the first tick (a loaded host, a SIGSTOP) is one too. Left 0,
     * the first cron took any silence for the peers' own (a shard stopped within its first
     * tick dropped every worker on its continue). */
    srv->last_cron_ms = psd_now_ms();
    uv_timer_start(&srv->cron, on_cron, tick, tick);

    printf("psd shard %u listening on %s:%u\n", shard, sc->host, sc->port);
    fflush(stdout);
    PS_LOG(PS_LOG_INFO, "server",
           "cluster '%s', %u shards, %u workers wanted%s, %s, %s, %u apply threads", m->cluster,
           srv->nshards, psd_coord_desired(srv),
           psd_coord_desired(srv) != m->job.workers ? " (psctl scale's; job.workers says "
                                                      "otherwise)" : "",
           ps_consistency_name(m->job.consistency),
           ps_optim_name(m->job.optimizer.name), srv->fanout.nthreads);
    if (sc->data_dir[0] != '/') { /* psctl takes it from its own working directory (psctl.c) */
        char *abs = realpath(sc->data_dir, NULL);
        PS_LOG(PS_LOG_WARN, "server", "data_dir '%s' is relative: this psd's is %s; psctl, run "
               "from another directory, puts its default checkpoints elsewhere (an absolute "
               "data_dir in the manifest is safer)", sc->data_dir, abs ? abs : "?");
        free(abs);
    }
    psd_follower_start(srv);
    uv_run(srv->loop, UV_RUN_DEFAULT);
    psd_follower_reap(srv);

    /* Stopping: pushes and declares are no longer taken. A job started in this last loop
     * iteration must end before anything it reads is freed. */
    while (srv->job_running || srv->slot_running || !psd_export_idle(srv) ||
           !psd_sync_idle(srv) || !psd_ckpt_idle(srv))
        uv_run(srv->loop, UV_RUN_ONCE);
    psd_metrics_close(srv);
    psd_listen_drain(srv);
    if (srv->listener) ucp_listener_destroy(srv->listener);
    psd_conns_close_all(srv);
    while (srv->job_running || srv->slot_running) uv_run(srv->loop, UV_RUN_ONCE);
    psd_floor_flush(srv); /* the cron writes none while stopping */
    for (psd_snap_t *sn = srv->snap; sn; sn = NULL) {
        mdb_txn_abort(sn->txn);
        free(sn);
    }
    srv->snap = NULL;
    uv_close((uv_handle_t *)&srv->sigint, NULL);
    uv_close((uv_handle_t *)&srv->sigterm, NULL);
    uv_close((uv_handle_t *)&srv->sighup, NULL);
    uv_close((uv_handle_t *)&srv->cron, NULL);
    rc = 0;
    if (srv->fatal[0]) {
        snprintf(err, errlen, "%s", srv->fatal);
        rc = PS_ETRANSPORT;
    }
fail_ucx:
    psd_shard_unregister(srv);
    ps_ucxprobe_close(&srv->probe);
    ps_ucx_close(&srv->ucx);
    uv_run(srv->loop, UV_RUN_NOWAIT);
fail_shard:
    psd_coord_free(srv);
    psd_export_free(srv);
    psd_ckpt_free(srv);
    psd_shard_free(srv);
    psd_store_close(&srv->store);
fail_store:
    psd_fanout_close(&srv->fanout);
    ps_trace_close(srv->trace);
    for (psd_conn_t *c = srv->conns, *nx; c; c = nx) {
        nx = c->next;
        psd_area_unref(c->area);
        free(c);
    }
    for (psd_send_t *sd = srv->free_sends, *nx; sd; sd = nx) {
        nx = sd->next_free;
        free(sd->payload);
        free(sd);
    }
    free(srv->rank_owner);
    free(srv->echo_buf);
    free(srv);
    return rc;
}
