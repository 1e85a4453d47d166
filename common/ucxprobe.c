/* ucxprobe.c: a probe of a UCP worker's shared-memory receive FIFO, from a second UCP worker of
 * the same process (see ucxprobe.h).
 *
 * UCX 1.13's shared-memory transports (sysv, posix) take a slot of the receiver's FIFO and then
 * mark it written; a sender killed in between leaves the receiver waiting on that slot for
 * good, and every later message of every local peer behind it (DESIGN-NOTES, "psd's transport
 * left stuck"). Its owner cannot tell that from a loaded worker by what arrives: messages over
 * tcp (psctl, pslaunch, psd's checkpoint follower, remote workers) still come and are
 * progressed. So the owner sends its own worker a message over shared memory when the worker
 * has stayed unarmable for a while: one that arrives says the FIFO is read; one that does not
 * within the owner's limit says it is wedged. The sender has its own context (shared memory
 * only: no listening socket) and worker, progressed by the owner's timer. */
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "ucx_loop.h"
#include "ucxprobe.h"

#define PROBE_MARK 0x65626f7270647370ull /* "psdprobe" */
#define PROBE_AM_ID 1                    /* PS_AM_CTRL (proto/wire.h): a handler every owner has */
#define PROBE_CLOSE_NS 100000000ull      /* a close waits at most this long */

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int ps_ucxprobe_open(ps_ucxprobe_t *p, ucp_worker_h target, char *why, size_t whylen)
{
    memset(p, 0, sizeof *p);
    ucp_config_t *config;
    ucs_status_t s = ucp_config_read(NULL, NULL, &config);
    if (s == UCS_OK) {
        s = ucp_config_modify(config, "TLS", "sysv,posix");
        ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                               .features = UCP_FEATURE_AM};
        if (s == UCS_OK) s = ucp_init(&params, config, &p->context);
        ucp_config_release(config);
    }
    if (s != UCS_OK) {
        p->context = NULL;
        snprintf(why, whylen, "its UCX context: %s", ucs_status_string(s));
        return -1;
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if ((s = ucp_worker_create(p->context, &wp, &p->worker)) != UCS_OK) {
        p->worker = NULL;
        snprintf(why, whylen, "its UCX worker: %s", ucs_status_string(s));
        ps_ucxprobe_close(p);
        return -1;
    }
    ucp_address_t *addr;
    size_t alen;
    if ((s = ucp_worker_get_address(target, &addr, &alen)) != UCS_OK) {
        snprintf(why, whylen, "the address of the worker probed: %s", ucs_status_string(s));
        ps_ucxprobe_close(p);
        return -1;
    }
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                          .address = addr,
                          .err_mode = UCP_ERR_HANDLING_MODE_NONE};
    s = ucp_ep_create(p->worker, &ep, &p->ep);
    ucp_worker_release_address(target, addr);
    if (s != UCS_OK) {
        p->ep = NULL;
        snprintf(why, whylen, "its endpoint: %s", ucs_status_string(s));
        ps_ucxprobe_close(p);
        return -1;
    }
    char lanes[64];
    ps_ucx_ep_lanes(p->ep, lanes, sizeof lanes);
    if (!ps_ucx_lanes_shm(lanes)) { /* the probed worker has no shared memory: nothing to wedge */
        snprintf(why, whylen, "its endpoint goes over %s, not shared memory", lanes);
        ps_ucxprobe_close(p);
        return -1;
    }
    return 0;
}

void ps_ucxprobe_close(ps_ucxprobe_t *p)
{
    if (p->req) ucp_request_free(p->req); /* released by UCX when it completes, or below */
    p->req = NULL;
    if (p->ep) {
        /* A flush, not UCP_EP_CLOSE_FLAG_FORCE: that needs UCP_ERR_HANDLING_MODE_PEER on both
         * sides (UCX asserts it where it discards lanes). Bounded: a wedged receiver may never
         * take a queued send; the worker's destruction releases what is left. */
        ucp_request_param_t prm = {.op_attr_mask = 0};
        void *r = ucp_ep_close_nbx(p->ep, &prm);
        if (r && !UCS_PTR_IS_ERR(r)) {
            uint64_t t0 = mono_ns();
            while (ucp_request_check_status(r) == UCS_INPROGRESS &&
                   mono_ns() - t0 < PROBE_CLOSE_NS)
                ucp_worker_progress(p->worker);
            ucp_request_free(r);
        }
    }
    if (p->worker) ucp_worker_destroy(p->worker);
    if (p->context) ucp_cleanup(p->context);
    memset(p, 0, sizeof *p);
}

int ps_ucxprobe_send(ps_ucxprobe_t *p, uint64_t now_ns)
{
    if (p->req) { /* the last one is still queued (a full FIFO): dropped */
        ucp_request_free(p->req);
        p->req = NULL;
    }
    uint64_t nonce;
    if (getrandom(&nonce, sizeof nonce, GRND_NONBLOCK) != (ssize_t)sizeof nonce)
        nonce = mono_ns() * 0x9E3779B97F4A7C15ull ^ p->hdr[1];
    p->hdr[0] = PROBE_MARK;
    p->hdr[1] = nonce;
    p->sent_ns = now_ns ? now_ns : 1;
    p->arrived = 0;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_AM_SEND_FLAG_EAGER};
    void *r = ucp_am_send_nbx(p->ep, PROBE_AM_ID, p->hdr, sizeof p->hdr, NULL, 0, &prm);
    if (UCS_PTR_IS_ERR(r)) return -1;
    p->req = r;
    ps_ucxprobe_progress(p);
    return 0;
}

void ps_ucxprobe_progress(ps_ucxprobe_t *p)
{
    if (p->worker == NULL) return;
    while (ucp_worker_progress(p->worker)) {
    }
    if (p->req && ucp_request_check_status(p->req) != UCS_INPROGRESS) {
        ucp_request_free(p->req);
        p->req = NULL;
    }
}
