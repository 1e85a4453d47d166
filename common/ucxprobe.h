/* ucxprobe.h: messages a process sends its own UCP worker over each shared-memory transport, to
 * tell a worker whose shared-memory receive FIFO a dead sender wedged from one that is only busy
 * (ucxprobe.c says why). */
#ifndef PS_UCXPROBE_H
#define PS_UCXPROBE_H

#include <stdint.h>
#include <string.h>

#include <ucp/api/ucp.h>

#define PS_UCXPROBE_LANES 3 /* sysv, posix, xpmem: each has its own FIFO */

/* A sender over one shared-memory transport. */
typedef struct ps_ucxprobe_lane_s {
    ucp_context_h context; /* that transport only */
    ucp_worker_h worker;
    ucp_ep_h ep;           /* to the probed worker */
    void *req;             /* a send still in flight, or NULL */
    uint64_t hdr[3];       /* the last probe's message: a mark, its nonce, the lane's index
                              (read by UCX until its send completes: unchanged while req) */
    int arrived;           /* the probed worker received it */
    uint64_t queued_ns;    /* while req waits for room in the FIFO: since when */
    uint64_t left_ns;      /* when the last probe went into the FIFO (0: not yet) */
    const char *tl;        /* the transport's name */
} ps_ucxprobe_lane_t;

typedef struct ps_ucxprobe_s {
    ps_ucxprobe_lane_t lane[PS_UCXPROBE_LANES];
    int n;            /* lanes open (0: the probe is off) */
    uint64_t sent_ns; /* when the last probe was sent (0: none since ps_ucxprobe_forget) */
    char names[32];   /* the transports, for the log: "sysv,posix" */
} ps_ucxprobe_t;

/** @brief Make a sender and its endpoint to @p target (a worker of this process, driven by its
 *  loop) for each shared-memory transport in @p shm (ps_ucx_t.shm_tls's bits). @p p comes
 *  zeroed or closed. @return 0, or -1 with the reason in @p why and nothing left open. Costs
 *  ~20 ms per transport (a UCP worker each). Loop thread. */
int ps_ucxprobe_open(ps_ucxprobe_t *p, ucp_worker_h target, unsigned shm, char *why,
                     size_t whylen);

/** @brief Release what ps_ucxprobe_open made (a send in flight is dropped); @p p is zeroed. Call
 *  before the probed worker is destroyed. Loop thread. */
void ps_ucxprobe_close(ps_ucxprobe_t *p);

/** @brief Send a new probe (a fresh nonce) on every lane whose last one left (a lane whose
 *  send still waits for room in the FIFO keeps that one: it is this probe too). Loop thread. */
void ps_ucxprobe_send(ps_ucxprobe_t *p, uint64_t now_ns);

/** @brief Whether the last probe is lost on some lane at @p now_ns: not arrived @p wait_ns after
 *  it was sent into the FIFO, or twice that while it still waits for room there (a FIFO kept
 *  full by busy local peers, not yet written into). */
int ps_ucxprobe_lost(const ps_ucxprobe_t *p, uint64_t now_ns, uint64_t wait_ns);

/** @brief Progress the senders (their sends and endpoints' wire-up). Loop thread. */
void ps_ucxprobe_progress(ps_ucxprobe_t *p);

/** @brief Whether the last probe arrived on every lane. */
static inline int ps_ucxprobe_arrived(const ps_ucxprobe_t *p)
{
    for (int i = 0; i < p->n; i++)
        if (!p->lane[i].arrived) return 0;
    return 1;
}

/** @brief The transports the last probe has not arrived over yet, for the log. */
void ps_ucxprobe_missing(const ps_ucxprobe_t *p, char *buf, size_t len);

/** @brief No probe outstanding any more (the probed worker could be armed). */
static inline void ps_ucxprobe_forget(ps_ucxprobe_t *p)
{
    p->sent_ns = 0;
}

#define PS_UCXPROBE_MARK 0x65626f7270647370ull /* "psdprobe" */

/** @brief Called by the probed worker's message handler (ucx_loop.c) with every active message's
 *  header: whether it is a lane's last probe (then marked arrived, also after
 *  ps_ucxprobe_forget, and the message is not the owner's). Inline: one length comparison for
 *  any other message. */
static inline int ps_ucxprobe_take(ps_ucxprobe_t *p, const void *header, size_t len)
{
    uint64_t h[3];
    if (len != sizeof h) return 0;
    memcpy(h, header, sizeof h);
    if (h[0] != PS_UCXPROBE_MARK || h[2] >= PS_UCXPROBE_LANES || h[2] >= (uint64_t)p->n) return 0;
    ps_ucxprobe_lane_t *l = &p->lane[h[2]];
    if (h[1] != l->hdr[1]) return 0;
    l->arrived = 1;
    return 1;
}

#endif
