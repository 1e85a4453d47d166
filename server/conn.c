/* conn.c: a shard's connections: admission (at most PSD_PENDING_MAX without a rank), their
 * endpoints made and closed outside UCX callbacks, references, and the deadlines the cron
 * checks (a proof of the secret, a first message, heartbeats). */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export.h"
#include "ps/ps_log.h"
#include "server.h"

void psd_conn_ref(psd_conn_t *c) { c->refs++; }

void psd_conn_free_if_done(psd_conn_t *c)
{
    if (c->refs > 0 || !c->dead || c->ep != NULL) return;
    psd_server_t *srv = c->srv;
    /* No rank may stay with a freed connection, whatever path its hello and close took. */
    for (uint32_t r = 0; srv->rank_owner && r < PS_MAX_RANKS; r++)
        if (srv->rank_owner[r] == c) srv->rank_owner[r] = NULL;
    for (psd_conn_t **pp = &srv->conns; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    psd_area_unref(c->area);
    free(c);
}

void psd_conn_unref(psd_conn_t *c)
{
    c->refs--;
    psd_conn_free_if_done(c);
}

void psd_conn_release_rank(psd_server_t *srv, psd_conn_t *c, const char *why, bool may_return)
{
    if (srv->coord) {
        psd_coord_on_gone(srv, c, why, may_return);
    } else if (c->rank >= 0 && c->rank < PS_MAX_RANKS && srv->rank_owner[c->rank] == c) {
        srv->rank_owner[c->rank] = NULL;
        PS_LOG(PS_LOG_INFO, "server", "rank %d (pid %u) left: %s", c->rank, c->pid, why);
    }
}

/* Called from UCX when a peer's endpoint fails or closes: only mark it; the
 * endpoint is closed later from the deferred hook, outside UCX callbacks. */
static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    psd_conn_t *c = arg;
    /* A member's at info; a connection without a rank (psctl, pslaunch, a worker before its
     * join) at debug: every psctl call ends with one, which UCX reports over TCP as "Endpoint
     * timeout", and a monitoring loop of psctl status filled the log with them. */
    if (!c->dead)
        PS_LOG(c->rank >= 0 ? PS_LOG_INFO : PS_LOG_DEBUG, "server",
               "peer %s (rank %d) disconnected: %s", c->peer, c->rank, ucs_status_string(status));
    /* It may have died inside a send into this shard's shared memory: an idle shard would not
     * see that (listen.c, psd_transport_check). A peer over other transports only is not. */
    if (!c->dead && (c->lanes[0] == '\0' || ps_ucx_lanes_shm(c->lanes)))
        c->srv->probe_suspect_ns = ps_trace_now();
    c->dead = true;
    c->close_queued = true;
}

/* @p peer_gone: the peer's endpoint failed or closed; false when this shard closes every
 * connection itself (psd_conns_close_all: a transport restart, the stop). */
static void conn_close_ep_from(psd_server_t *srv, psd_conn_t *c, bool peer_gone)
{
    c->close_queued = false;
    c->dead = true;
    psd_conn_release_rank(srv, c,
                      c->late     ? "it held the others past job.step_timeout_ms"
                      : c->silent ? "missed heartbeats"
                                  : "its connection closed",
                      !c->silent && !c->late);
    psd_shard_drop_conn(srv, c);
    psd_export_drop_conn(srv, c);
    psd_coord_drop_conn(srv, c, peer_gone);
    ps_ucx_ep_close(&srv->ucx, &c->ep, 1);
    psd_conn_free_if_done(c);
}

static void conn_close_ep(psd_server_t *srv, psd_conn_t *c) { conn_close_ep_from(srv, c, true); }

/* How long a connection may go without a good proof: the heartbeat timeout, at least 1 s. */
static uint64_t auth_deadline_ms(const psd_server_t *srv)
{
    uint64_t t = srv->m.job.heartbeat_timeout_ms;
    return t < 1000 ? 1000 : t;
}

/* How long a connection may go without a first message (every peer of psd speaks first): the
 * heartbeat timeout, at least 10 s. */
static uint64_t quiet_deadline_ms(const psd_server_t *srv)
{
    uint64_t t = srv->m.job.heartbeat_timeout_ms;
    return t < 10000 ? 10000 : t;
}

static int conns_pending(const psd_server_t *srv)
{
    int n = 0;
    for (const psd_conn_t *c = srv->conns; c; c = c->next) n += c->rank < 0 && !c->dead;
    return n;
}

/* PSD_PENDING_MAX connections without a rank are open: close the one idle longest (nothing
 * from it since its request or its last message) when that is longer than quiet_deadline_ms,
 * so that a peer holding the slots with one message each does not lock every new worker,
 * psctl and launcher out for good (a review, session 59). @return whether one was closed. */
static bool pending_evict(psd_server_t *srv)
{
    psd_conn_t *idle = NULL;
    uint64_t oldest = UINT64_MAX, now = psd_now_ms();
    for (psd_conn_t *c = srv->conns; c; c = c->next) {
        if (c->rank >= 0 || c->dead || c->ep == NULL) continue;
        uint64_t t = c->last_seen_ms > c->born_ms ? c->last_seen_ms : c->born_ms;
        if (t < oldest) oldest = t, idle = c;
    }
    if (idle == NULL || now - oldest <= quiet_deadline_ms(srv)) return false;
    PS_LOG(PS_LOG_INFO, "server", "peer %s: closed: idle for %llu ms while %d connections "
           "without a rank were open", idle->peer, (unsigned long long)(now - oldest),
           PSD_PENDING_MAX);
    idle->dead = true;
    idle->close_queued = true;
    return true;
}

void psd_conn_on_request(ucp_conn_request_h req, void *arg)
{
    psd_server_t *srv = arg;
    srv->conn_requests++;
    psd_conn_t *c = calloc(1, sizeof *c);
    bool closing = srv->stopping || srv->restarting;
    bool full = !closing && conns_pending(srv) >= PSD_PENDING_MAX && !pending_evict(srv);
    if (c == NULL || closing || full) {
        free(c);
        ucp_listener_reject(srv->listener, req);
        srv->conns_refused += full;
        if (full && (srv->conns_refused & (srv->conns_refused - 1)) == 0) /* 1st, 2nd, 4th... */
            PS_LOG(PS_LOG_WARN, "server", "a connection refused: %d connections without a rank "
                   "are open (%llu refused so far; a peer that opens them without end?)",
                   PSD_PENDING_MAX, (unsigned long long)srv->conns_refused);
        return;
    }
    c->srv = srv;
    c->rank = -1;
    c->conn_request = req;
    c->born_ms = psd_now_ms();
    ucp_conn_request_attr_t a = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
    if (ucp_conn_request_query(req, &a) == UCS_OK) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)&a.client_address;
        char ip[INET6_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof ip);
        snprintf(c->peer, sizeof c->peer, "%s:%u", ip, ntohs(sin->sin_port));
    }
    c->next = srv->conns;
    srv->conns = c; /* the endpoint is created from the deferred hook */
}

/* Deferred work outside UCX callbacks: create endpoints for new connections,
 * close failed ones. Returns nonzero when it did something. */
int psd_conns_deferred(ps_ucx_t *u)
{
    psd_server_t *srv = u->data;
    int did = 0;
again:
    /* Closing an endpoint progresses the worker, whose callbacks may free other conns:
     * after each close, walk the list again from its head. */
    for (psd_conn_t *c = srv->conns, *nx; c; c = nx) {
        nx = c->next;
        if (c->conn_request) {
            ucp_ep_params_t ep = {
                .field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                              UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                .conn_request = c->conn_request,
                .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                .err_handler = {.cb = on_ep_error, .arg = c},
            };
            c->conn_request = NULL;
            ucs_status_t s = ucp_ep_create(srv->ucx.worker, &ep, &c->ep);
            if (s != UCS_OK) {
                PS_LOG(PS_LOG_WARN, "server", "endpoint for %s: %s", c->peer,
                       ucs_status_string(s));
                c->ep = NULL;
                c->dead = true;
                psd_conn_free_if_done(c);
            }
            did = 1;
        } else if (c->want_lanes && c->ep && !c->dead) {
            c->want_lanes = false;
            ps_ucx_ep_lanes(c->ep, c->lanes, sizeof c->lanes);
            c->eager_below = ps_ucx_eager_below(&srv->ucx, c->lanes);
            c->peer_reads = ps_ucx_lanes_peer_reads(c->lanes) != 0;
            PS_LOG(PS_LOG_INFO, "server", "peer %s (pid %u) over %s", c->peer, c->pid, c->lanes);
            did = 1;
        } else if (c->close_queued) {
            conn_close_ep(srv, c);
            did = 1;
            goto again;
        }
    }
    return did;
}

psd_conn_t *psd_conn_by_ep(psd_server_t *srv, ucp_ep_h ep)
{
    for (psd_conn_t *c = srv->conns; c; c = c->next)
        if (c->ep == ep) return c;
    return NULL;
}

/* Close every connection with an endpoint (their ranks may come back, as after any lost
 * connection), for the shutdown and for transport_restart. */
void psd_conns_close_all(psd_server_t *srv)
{
    for (;;) {
        psd_conn_t *c = srv->conns;
        while (c && c->ep == NULL) c = c->next;
        if (c == NULL) break;
        c->refs++; /* keep it while closing; the walk restarts from the head */
        conn_close_ep_from(srv, c, false);
        psd_conn_unref(c); /* freed now if nothing else holds it (a bare refs-- kept it, its
                              push area's memfd and mapping with it, for good) */
    }
}

int psd_conns_cron(psd_server_t *srv, uint64_t now)
{
    uint64_t limit = srv->m.job.heartbeat_timeout_ms;
    bool dropped = false;
    for (psd_conn_t *c = srv->conns; c; c = c->next) {
        if (srv->auth->on && !c->authed && !c->dead && c->ep && c->rank < 0 &&
            now - c->born_ms > auth_deadline_ms(srv)) {
            PS_LOG(PS_LOG_INFO, "server", "peer %s: closed: no proof of the cluster secret "
                   "within %llu ms", c->peer, (unsigned long long)auth_deadline_ms(srv));
            c->dead = true;
            c->close_queued = true;
            dropped = true;
            continue;
        }
        if (!c->spoke && !c->dead && c->ep && c->rank < 0 &&
            now - c->born_ms > quiet_deadline_ms(srv)) {
            PS_LOG(PS_LOG_INFO, "server", "peer %s: closed: it said nothing within %llu ms",
                   c->peer, (unsigned long long)quiet_deadline_ms(srv));
            c->dead = true;
            c->close_queued = true;
            dropped = true;
            continue;
        }
        if (c->dead || c->rank < 0 || c->ep == NULL || now - c->last_seen_ms <= limit) continue;
        PS_LOG(PS_LOG_WARN, "server", "rank %d (pid %u) silent for %llu ms (heartbeat timeout "
               "%llu ms): dropping it", c->rank, c->pid,
               (unsigned long long)(now - c->last_seen_ms), (unsigned long long)limit);
        c->dead = true;
        c->silent = true;
        c->close_queued = true;
        dropped = true;
        if (c->rank < PS_MAX_RANKS) srv->silent_join[c->rank] = c->join_serial;
    }
    return dropped;
}
