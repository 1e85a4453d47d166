/* listen.c: a shard's UCX listener: the check of its address before psd makes anything on
 * disk, listening, the drain of connection requests at a stop, and the transport's restart
 * when UCX 1.13 left it stuck. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tcpaccept.h"
#include "tcpguard.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "server.h"

/* Before the listener goes at a stop: let UCX deliver (and this shard refuse: stopping) the
 * connection requests its async thread is reading, until none came for DRAIN_QUIET_MS (at most
 * DRAIN_MAX_MS). UCX 1.13's thread hands a request's data to the listener it was accepted for
 * even after ucp_listener_destroy freed it: psd stopped at once after SIGCONT, with the
 * reconnect attempts of a worker queued while it was stopped, died there (SIGSEGV in
 * ucp_cm_server_conn_request_cb, faults:silent_shard_lost, once in ~16 runs). */
#define DRAIN_QUIET_MS 30
#define DRAIN_MAX_MS 1000
void psd_listen_drain(psd_server_t *srv)
{
    if (srv->listener == NULL || srv->ucx.worker == NULL) return;
    uint64_t t0 = psd_now_ms(), quiet_from = t0, seen = srv->conn_requests;
    for (uint64_t now = t0; now - quiet_from < DRAIN_QUIET_MS && now - t0 < DRAIN_MAX_MS;
         now = psd_now_ms()) {
        while (ucp_worker_progress(srv->ucx.worker)) {}
        if (srv->conn_requests != seen) {
            seen = srv->conn_requests;
            quiet_from = now;
        }
        usleep(1000);
    }
}

/* Whether @p sa is an address no interface of this host has (a bind of a plain socket to it,
 * port 0, fails with EADDRNOTAVAIL): UCX says only "Input/output error" then (a probe). */
static bool not_local(const struct sockaddr_storage *sa, socklen_t len)
{
    struct sockaddr_storage a = *sa;
    if (a.ss_family == AF_INET) ((struct sockaddr_in *)&a)->sin_port = 0;
    else if (a.ss_family == AF_INET6) ((struct sockaddr_in6 *)&a)->sin6_port = 0;
    else return false;
    int fd = socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    bool no = bind(fd, (struct sockaddr *)&a, len) != 0 && errno == EADDRNOTAVAIL;
    close(fd);
    return no;
}

/* "cannot listen on HOST:PORT: @p why" into @p err, and what to look at: the port held by
 * another socket (@p busy 1), or maybe by connections (2: UCX does not say which), or an
 * address not this host's. */
static void listen_refused(const ps_server_conf_t *sc, const struct sockaddr_storage *ss,
                           socklen_t sslen, const char *why, int busy, char *err, size_t errlen)
{
    snprintf(err, errlen, "cannot listen on %s:%u: %s%s", sc->host, sc->port, why,
             busy == 1 ? " (another psd or program holds it; `ss -tanp` tells which)"
             : busy ? " (the port is in use: another psd or program, or, for a minute after a psd "
                      "stopped, its connections' TIME_WAIT; `ss -tan` tells which)"
             : not_local(ss, sslen)
                 ? " (that address is not one of this host's: does the manifest name another "
                   "machine for this shard, or is --shard another one's?)"
                 : "");
}

/* Listen on this shard's address with the current UCP worker. 0, or PS_ECONFIG /
 * PS_ETRANSPORT with @p err said. */
int psd_listen_start(psd_server_t *srv, char *err, size_t errlen)
{
    const ps_server_conf_t *sc = &srv->m.servers[srv->shard];
    struct sockaddr_storage ss;
    socklen_t sslen;
    if (ps_sockaddr_resolve(sc->host, sc->port, &ss, &sslen)) {
        snprintf(err, errlen, "cannot resolve host '%s' of shard %u", sc->host, srv->shard);
        return PS_ECONFIG;
    }
    ucp_listener_params_t lp = {
        .field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
        .sockaddr = {.addr = (const struct sockaddr *)&ss, .addrlen = sslen},
        .conn_handler = {.cb = psd_conn_on_request, .arg = srv},
    };
    ps_tcpaccept_creating(1); /* its socket is UCX's: accepts there are bounded (tcpaccept.h) */
    ucs_status_t s = ucp_listener_create(srv->ucx.worker, &lp, &srv->listener);
    ps_tcpaccept_creating(0);
    if (s != UCS_OK) {
        srv->listener = NULL;
        listen_refused(sc, &ss, sslen, ucs_status_string(s), s == UCS_ERR_BUSY ? 2 : 0, err,
                       errlen);
        return PS_ETRANSPORT;
    }
    return 0;
}

/* Whether a TCP socket bound to @p host:@p port with SO_REUSEADDR (as UCX binds its listener,
 * UCX_TCP_CM_REUSEADDR, and libuv its TCP servers) is refused: EADDRINUSE or EADDRNOTAVAIL,
 * with @p ss its address; 0 for anything else (left to the listener itself). @p family: as
 * the listener resolves it (the shard's port IPv4 only, the metrics endpoint's any). */
static int bind_refused(const char *host, uint16_t port, int family, struct sockaddr_storage *ss,
                        socklen_t *sslen)
{
    if (ps_sockaddr_resolve_any(host, port, family, ss, sslen)) return 0;
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, e = 0;
    if (fd < 0) return 0;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
        bind(fd, (struct sockaddr *)ss, *sslen) != 0)
        e = errno;
    close(fd);
    return e == EADDRINUSE || e == EADDRNOTAVAIL ? e : 0;
}

/* Whether this shard's address and its metrics address can be listened on, asked before psd
 * makes anything on disk: a psd whose port was taken had made (and left) a new data_dir's
 * store by the time its listener failed. SO_REUSEADDR, so that a stopped psd's connections in
 * TIME_WAIT (which have it too) do not refuse it; a listener there does, and so does any
 * socket bound to the port without SO_REUSEADDR. 0, or PS_ETRANSPORT (the shard's port) /
 * PS_ECONFIG (the metrics port, as psd_metrics_start says) with @p err said as the listener
 * would; any other failure is left to the listeners. */
int psd_listen_probe(psd_server_t *srv, char *err, size_t errlen)
{
    const ps_server_conf_t *sc = &srv->m.servers[srv->shard];
    struct sockaddr_storage ss;
    socklen_t sslen;
    int e = bind_refused(sc->host, sc->port, AF_INET, &ss, &sslen);
    if (e) {
        listen_refused(sc, &ss, sslen,
                       e == EADDRINUSE ? "address already in use" : "address not available",
                       e == EADDRINUSE, err, errlen);
        return PS_ETRANSPORT;
    }
    if (sc->metrics_port == 0 ||
        (e = bind_refused(sc->metrics_host, sc->metrics_port, AF_UNSPEC, &ss, &sslen)) == 0)
        return 0;
    snprintf(err, errlen, "cannot listen on %s:%u for metrics: %s", sc->metrics_host,
             sc->metrics_port,
             e == EADDRINUSE ? "address already in use (another psd's or program's port: "
                               "servers[].metrics_port must be free)"
                             : "address not available (metrics_host is not one of this host's "
                               "addresses)");
    return PS_ECONFIG;
}

/* How long this shard's UCP worker may stay stuck (ps_ucx_stuck_ns) before the transport is
 * started again: a third of the heartbeat timeout, so that the workers it cannot hear meanwhile
 * are not yet dropped as silent, within [250 ms, 2 s]. */
static uint64_t stuck_limit_ns(const psd_server_t *srv)
{
    uint64_t ms = srv->m.job.heartbeat_timeout_ms / 3;
    ms = ms < 250 ? 250 : ms > 2000 ? 2000 : ms;
    return ms * 1000000u;
}

/* UCX 1.13 left this shard's transport stuck (ps_ucx_stuck_ns: a local peer killed while it
 * wrote into the shared-memory receive FIFO; nothing any local peer sends arrives any more).
 * Close every connection, start a new UCP worker and listen again on the same address: the
 * workers see their connection fail and reconnect as after any lost shard (their ranks wait
 * for them, their pushes not yet received are sent again), and this shard keeps its state.
 * From the cron (a timer callback: no UCX callback is running). */
static void transport_restart(psd_server_t *srv, uint64_t stuck_ns, const char *seen)
{
    srv->transport_restarts++;
    PS_LOG(PS_LOG_WARN, "server", "the UCX transport has been stuck for %.1f s (%s): closing "
           "every connection and starting it again", (double)stuck_ns / 1e9, seen);
    /* As at the stop: the requests UCX's thread is reading are delivered and refused before
     * the listener goes (UCX 1.13 hands one to a destroyed listener: SIGSEGV in its async
     * thread, seen in a review's run with joiners and a psctl loop at a restart). */
    srv->restarting = true;
    for (psd_conn_t *c = srv->conns, *nx; c; c = nx) { /* not taken yet: their peers retry */
        nx = c->next;
        if (c->conn_request == NULL) continue;
        ucp_listener_reject(srv->listener, c->conn_request);
        c->conn_request = NULL;
        c->dead = true;
        psd_conn_free_if_done(c);
    }
    psd_listen_drain(srv);
    ucp_listener_destroy(srv->listener);
    srv->listener = NULL;
    srv->restarting = false;
    psd_conns_close_all(srv);
    ps_ucxprobe_close(&srv->probe); /* its endpoints go to the worker about to be destroyed */
    srv->probe_suspect_ns = 0;      /* (the closes above may have set it) */
    char err[256] = "";
    int rc = ps_ucx_restart(&srv->ucx);
    /* No callback of the old worker runs any more: what its receives held is released here,
     * and no put may land there (a review, session 63: their spans stayed allowed for good). */
    psd_shard_receives_lost(srv);
    ps_tcpguard_forget_spans();
    srv->echo_busy = 0;
    if (rc == 0) rc = psd_listen_start(srv, err, sizeof err);
    if (rc) {
        snprintf(srv->fatal, sizeof srv->fatal, "cannot start the transport again after it was "
                 "stuck: %.190s", err[0] ? err : ps_strerror(rc));
        PS_LOG(PS_LOG_ERROR, "server", "%s; stopping this shard", srv->fatal);
        srv->stopping = true;
        psd_server_maybe_stop(srv);
        return;
    }
    srv->probe_off = false; /* made again at the next busy spell */
    int held = 0; /* by a request whose callback never ran: they stay (closed) for good */
    for (psd_conn_t *c = srv->conns; c; c = c->next) held += c->ep == NULL && c->refs > 0;
    if (held)
        PS_LOG(PS_LOG_WARN, "server", "%d closed connections are still held by requests of the "
               "old transport", held);
    PS_LOG(PS_LOG_INFO, "server", "transport started again; listening on %s:%u",
           srv->m.servers[srv->shard].host, srv->m.servers[srv->shard].port);
}

/* Whether the probe sent at probe->sent_ns is lost (ps_ucxprobe_lost) after whatever the
 * senders still hold went out and whatever the worker has unread was read, boundedly (busy
 * local peers may keep it fed; the cron's progress may have left early: spin_stop). Then the
 * transport restarts, saying so. @return whether it did. */
static bool probe_judged_lost(psd_server_t *srv, uint64_t now, uint64_t wait, uint64_t stuck_ns,
                              const char *after)
{
    ps_ucxprobe_t *p = &srv->probe;
    if (!ps_ucxprobe_lost(p, now, wait)) return false;
    for (int round = 0; round < 2; round++) {
        ps_ucxprobe_progress(p);
        for (int k = 0; k < 4096 && ucp_worker_progress(srv->ucx.worker); k++) {
        }
    }
    now = ps_trace_now();
    if (!ps_ucxprobe_lost(p, now, wait)) return false;
    char missing[32], seen[256];
    ps_ucxprobe_missing(p, missing, sizeof missing);
    snprintf(seen, sizeof seen, "%s, and a message it sent itself over %s %.1f s ago did not "
             "arrive: a local peer killed while it wrote there leaves it so for good", after,
             missing, (double)(now - p->sent_ns) / 1e9);
    transport_restart(srv, stuck_ns ? stuck_ns : now - p->sent_ns, seen);
    return true;
}

/* Whether the worker's shared-memory FIFOs are read, once it has been unarmable
 * (busy_since_ns) for half the limit: a probe goes to it over each of them (ucxprobe.h; made
 * at the first such spell, ~20 ms per transport, and again after a transport restart), and
 * again half a limit after each one arrived while it stays so; a probe sent within the spell
 * that has not arrived half a limit later says a FIFO is wedged. Messages that arrive
 * meanwhile say nothing: they may come over tcp (psctl, pslaunch, psd's checkpoint follower,
 * remote workers), and counting them kept a wedged shard deaf to every local peer for as long
 * as they came (CI of session 64: the follower's status requests every second; a review: two
 * tcp workers training on). Without shared memory, or a probe: ps_ucx_stuck_ns.
 *
 * A peer that may have written there and whose connection failed (probe_suspect_ns, conn.c)
 * has it probed at once, busy or not: a peer killed inside its send leaves an idle shard
 * armable, and nothing showed the wedge until the next local peer's message waited behind the
 * dead slot (that peer's connection then closed under it by the restart). From the cron. */
void psd_transport_check(psd_server_t *srv)
{
    if (srv->stopping) return;
    uint64_t limit = stuck_limit_ns(srv);
    uint64_t since = srv->ucx.busy_since_ns, now = ps_trace_now();
    uint64_t suspect = srv->probe_suspect_ns;
    ps_ucxprobe_t *p = &srv->probe;
    if (suspect && (!srv->ucx.shm_tls || srv->probe_off)) /* no probe: the clock alone */
        suspect = srv->probe_suspect_ns = 0;
    if (srv->ucx.shm_tls && !srv->probe_off && p->n == 0 &&
        (suspect || (since && now - since >= limit / 2))) {
        char why[160];
        if (ps_ucxprobe_open(p, srv->ucx.worker, srv->ucx.shm_tls, why, sizeof why)) {
            srv->probe_off = true;
            srv->probe_suspect_ns = 0;
            PS_LOG(PS_LOG_WARN, "server", "cannot probe the shared-memory transport (%s): a "
                   "stuck one is told by what stops arriving", why);
        } else if (since) {
            PS_LOG(PS_LOG_INFO, "server", "the UCX worker has been busy for %.1f s: probing "
                   "its shared-memory queues (%s)", (double)(now - since) / 1e9, p->names);
        } else {
            PS_LOG(PS_LOG_INFO, "server", "a local peer's connection failed: probing the "
                   "shared-memory queues (%s)", p->names);
        }
        now = ps_trace_now(); /* (~20 ms per transport) */
    }
    /* With the probe, this clock still ends a spell in which nothing at all arrives, long
     * after (a worker left unarmable for good though its queues are read kept the loop
     * polling at full speed). */
    uint64_t stuck = ps_ucx_stuck_ns(&srv->ucx);
    if (stuck >= (p->n ? 4 * limit : limit)) {
        transport_restart(srv, stuck, p->n ? "busy, with nothing arriving at all though its "
                          "shared-memory queues are read" : "busy, with nothing to progress: a "
                          "local peer killed while it wrote into this shard's shared memory "
                          "leaves it so for good");
        return;
    }
    if (p->n == 0) return;
    if (since == 0) { /* armable: not wedged (a send still queued goes out now) */
        ps_ucxprobe_progress(p);
        if (srv->probe_suspect_ns == 0) {
            ps_ucxprobe_forget(p);
        } else if (p->sent_ns < srv->probe_suspect_ns &&
                   (p->sent_ns == 0 || ps_ucxprobe_arrived(p))) {
            /* One probe per failure, but not over one still out: a new one restarted its
             * clock, so failures closer than half a limit (a psctl loop: every call's close
             * counts) hid the wedge for as long as they came (a review). */
            ps_ucxprobe_send(p, now);
        } else if (ps_ucxprobe_arrived(p)) {
            srv->probe_suspect_ns = 0;
            ps_ucxprobe_forget(p);
        } else {
            probe_judged_lost(srv, now, limit / 2, 0, "a local peer's connection failed");
        }
        return;
    }
    /* A probe sent for a failure before the spell began is judged too (a message behind the
     * dead slot made the worker unarmable before its judgement: a review). */
    bool in_spell = p->sent_ns >= since ||
                    (srv->probe_suspect_ns && p->sent_ns >= srv->probe_suspect_ns);
    if (in_spell && probe_judged_lost(srv, now, limit / 2, now - since, "busy")) return;
    ps_ucxprobe_progress(p);
    if (now - since >= limit / 2 &&
        (!in_spell || (ps_ucxprobe_arrived(p) && now - p->sent_ns >= limit / 2)))
        ps_ucxprobe_send(p, now);
}
