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
 * within the owner's limit says it is wedged. Each shared-memory transport has its own FIFO
 * (a peer killed over posix wedges that one: a probe over sysv alone still arrived, a review),
 * so there is a sender per transport, each with its own context (that transport only: no
 * listening socket) and worker, progressed by the owner's timer. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "tracefile.h"
#include "ucx_loop.h"
#include "ucxprobe.h"

#define PROBE_AM_ID 1                    /* PS_AM_CTRL (proto/wire.h): a handler every owner has */
#define PROBE_CLOSE_NS 100000000ull      /* a close waits at most this long */

static const char *const g_tl[PS_UCXPROBE_LANES] = {"sysv", "posix", "xpmem"}; /* PS_UCX_SHM_* */

static void lane_close(ps_ucxprobe_lane_t *l)
{
    bool queued = l->req && ucp_request_check_status(l->req) == UCS_INPROGRESS;
    if (l->req) ucp_request_free(l->req); /* released by UCX when it completes, or below */
    l->req = NULL;
    if (l->ep && !queued) {
        /* A flush, not UCP_EP_CLOSE_FLAG_FORCE: that needs UCP_ERR_HANDLING_MODE_PEER on both
         * sides (UCX asserts it where it discards lanes). With a send still waiting for room
         * in a (wedged) FIFO the flush would wait its whole bound, on the loop, for each lane:
         * the worker's destruction below releases the endpoint and its queue instead. */
        ucp_request_param_t prm = {.op_attr_mask = 0};
        void *r = ucp_ep_close_nbx(l->ep, &prm);
        if (r && !UCS_PTR_IS_ERR(r)) {
            uint64_t t0 = ps_trace_now();
            while (ucp_request_check_status(r) == UCS_INPROGRESS &&
                   ps_trace_now() - t0 < PROBE_CLOSE_NS)
                ucp_worker_progress(l->worker);
            ucp_request_free(r);
        }
    }
    if (l->worker) ucp_worker_destroy(l->worker);
    if (l->context) ucp_cleanup(l->context);
    memset(l, 0, sizeof *l);
}

/* Lane @p l over transport @p tl to @p target: 0, or -1 with the reason in @p why. */
static int lane_open(ps_ucxprobe_lane_t *l, const char *tl, ucp_worker_h target, char *why,
                     size_t whylen)
{
    ucp_config_t *config;
    ucs_status_t s = ucp_config_read(NULL, NULL, &config);
    if (s == UCS_OK) {
        s = ucp_config_modify(config, "TLS", tl);
        ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                               .features = UCP_FEATURE_AM};
        if (s == UCS_OK) s = ucp_init(&params, config, &l->context);
        ucp_config_release(config);
    }
    if (s != UCS_OK) {
        l->context = NULL;
        snprintf(why, whylen, "%s: its UCX context: %s", tl, ucs_status_string(s));
        return -1;
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if ((s = ucp_worker_create(l->context, &wp, &l->worker)) != UCS_OK) {
        l->worker = NULL;
        snprintf(why, whylen, "%s: its UCX worker: %s", tl, ucs_status_string(s));
        return -1;
    }
    ucp_address_t *addr;
    size_t alen;
    if ((s = ucp_worker_get_address(target, &addr, &alen)) != UCS_OK) {
        snprintf(why, whylen, "the address of the worker probed: %s", ucs_status_string(s));
        return -1;
    }
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                          .address = addr,
                          .err_mode = UCP_ERR_HANDLING_MODE_NONE};
    s = ucp_ep_create(l->worker, &ep, &l->ep);
    ucp_worker_release_address(target, addr);
    if (s != UCS_OK) {
        l->ep = NULL;
        snprintf(why, whylen, "%s: its endpoint: %s", tl, ucs_status_string(s));
        return -1;
    }
    char lanes[64];
    ps_ucx_ep_lanes(l->ep, lanes, sizeof lanes);
    if (strcmp(lanes, tl) != 0) {
        snprintf(why, whylen, "%s: its endpoint goes over %s", tl, lanes);
        return -1;
    }
    return 0;
}

int ps_ucxprobe_open(ps_ucxprobe_t *p, ucp_worker_h target, unsigned shm, char *why,
                     size_t whylen)
{
    memset(p, 0, sizeof *p);
    for (int t = 0; t < PS_UCXPROBE_LANES; t++) {
        if (!(shm & (1u << t))) continue;
        if (lane_open(&p->lane[p->n], g_tl[t], target, why, whylen)) {
            lane_close(&p->lane[p->n]);
            ps_ucxprobe_close(p);
            return -1;
        }
        p->lane[p->n++].tl = g_tl[t];
        size_t off = strlen(p->names);
        snprintf(p->names + off, sizeof p->names - off, "%s%s", off ? "," : "", g_tl[t]);
    }
    if (p->n == 0) {
        snprintf(why, whylen, "no shared-memory transport");
        return -1;
    }
    return 0;
}

void ps_ucxprobe_close(ps_ucxprobe_t *p)
{
    for (int i = 0; i < p->n; i++) lane_close(&p->lane[i]);
    memset(p, 0, sizeof *p);
}

void ps_ucxprobe_send(ps_ucxprobe_t *p, uint64_t now_ns)
{
    uint64_t nonce;
    if (getrandom(&nonce, sizeof nonce, GRND_NONBLOCK) != (ssize_t)sizeof nonce)
        nonce = ps_trace_now() * 0x9E3779B97F4A7C15ull ^ p->lane[0].hdr[1];
    p->sent_ns = now_ns ? now_ns : 1;
    for (int i = 0; i < p->n; i++) {
        ps_ucxprobe_lane_t *l = &p->lane[i];
        if (l->req) { /* still waiting for room in the FIFO: it is this probe too (only a new
                         * spell sends while one waits: counted from now) */
            l->queued_ns = p->sent_ns;
            continue;
        }
        l->hdr[0] = PS_UCXPROBE_MARK;
        l->hdr[1] = nonce;
        l->hdr[2] = (uint64_t)i;
        l->arrived = 0;
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                   .flags = UCP_AM_SEND_FLAG_EAGER};
        void *r = ucp_am_send_nbx(l->ep, PROBE_AM_ID, l->hdr, sizeof l->hdr, NULL, 0, &prm);
        l->req = UCS_PTR_IS_ERR(r) ? NULL : r; /* an error: it never arrives */
        l->queued_ns = l->req ? p->sent_ns : 0;
        l->left_ns = l->req ? 0 : p->sent_ns;
    }
    ps_ucxprobe_progress(p);
}

int ps_ucxprobe_lost(const ps_ucxprobe_t *p, uint64_t now_ns, uint64_t wait_ns)
{
    for (int i = 0; i < p->n; i++) {
        const ps_ucxprobe_lane_t *l = &p->lane[i];
        if (l->arrived) continue;
        if (l->req ? now_ns >= l->queued_ns + 2 * wait_ns : now_ns >= l->left_ns + wait_ns)
            return 1;
    }
    return 0;
}

void ps_ucxprobe_progress(ps_ucxprobe_t *p)
{
    for (int i = 0; i < p->n; i++) {
        ps_ucxprobe_lane_t *l = &p->lane[i];
        while (ucp_worker_progress(l->worker)) {
        }
        if (l->req && ucp_request_check_status(l->req) != UCS_INPROGRESS) {
            ucp_request_free(l->req);
            l->req = NULL;
            l->queued_ns = 0;
            l->left_ns = ps_trace_now();
        }
    }
}

void ps_ucxprobe_missing(const ps_ucxprobe_t *p, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < p->n && off + 1 < len; i++) {
        if (!p->lane[i].arrived)
            off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? "," : "", p->lane[i].tl);
    }
}
