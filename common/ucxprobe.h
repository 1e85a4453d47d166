/* ucxprobe.h: a message a process sends its own UCP worker over shared memory, to tell a
 * worker whose shared-memory receive FIFO a dead sender wedged from one that is only busy
 * (ucxprobe.c says why). */
#ifndef PS_UCXPROBE_H
#define PS_UCXPROBE_H

#include <stdint.h>
#include <string.h>

#include <ucp/api/ucp.h>

typedef struct ps_ucxprobe_s {
    ucp_context_h context; /* shared memory only: sysv, posix */
    ucp_worker_h worker;   /* the sender's */
    ucp_ep_h ep;           /* to the probed worker (NULL: the probe is off) */
    void *req;             /* a send still in flight, or NULL */
    uint64_t hdr[2];       /* the last probe's message: a mark and its nonce */
    uint64_t sent_ns;      /* when it was sent (0: none since ps_ucxprobe_forget) */
    int arrived;           /* the probed worker received it */
} ps_ucxprobe_t;

/** @brief Make the sender and its endpoint to @p target (a worker of this process, driven by its
 *  loop) over shared memory. @p p comes zeroed or closed. @return 0, or -1 with the reason in
 *  @p why (the probe stays off: ps_ucxprobe_close is still safe). Loop thread. */
int ps_ucxprobe_open(ps_ucxprobe_t *p, ucp_worker_h target, char *why, size_t whylen);

/** @brief Release what ps_ucxprobe_open made (a send in flight is dropped); @p p is zeroed. Call
 *  before the probed worker is destroyed. Loop thread. */
void ps_ucxprobe_close(ps_ucxprobe_t *p);

/** @brief Send a new probe (its nonce fresh), forgetting the last one. @return 0, or -1 when it
 *  could not even be queued (then it counts as sent and not arrived). Loop thread. */
int ps_ucxprobe_send(ps_ucxprobe_t *p, uint64_t now_ns);

/** @brief Progress the sender (its sends and the endpoint's wire-up). Loop thread. */
void ps_ucxprobe_progress(ps_ucxprobe_t *p);

/** @brief No probe outstanding any more (the probed worker could be armed). */
static inline void ps_ucxprobe_forget(ps_ucxprobe_t *p)
{
    p->sent_ns = 0;
    p->arrived = 0;
}

/** @brief Called by the probed worker's message handler (ucx_loop.c) with every active message's
 *  header: whether it is the probe's last message (then marked arrived, and the message is not
 *  the owner's). Inline: one length comparison for any other message. */
static inline int ps_ucxprobe_take(ps_ucxprobe_t *p, const void *header, size_t len)
{
    if (len != sizeof p->hdr || p->sent_ns == 0 || memcmp(header, p->hdr, sizeof p->hdr) != 0)
        return 0;
    p->arrived = 1;
    return 1;
}

#endif
