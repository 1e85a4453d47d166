/* ucx_loop.h: a UCP context and worker driven by a libuv loop.
 *
 * The worker is created with UCS_THREAD_MODE_SINGLE and UCP_FEATURE_AM |
 * UCP_FEATURE_WAKEUP; only the loop thread may touch it. A uv_poll_t watches
 * ucp_worker_get_efd() and a uv_prepare_t drains the worker before every
 * block, so UCP calls made from timers or other callbacks are progressed too:
 *   progress until idle -> run the owner's deferred work -> arm (BUSY: again). */
#ifndef PS_UCX_LOOP_H
#define PS_UCX_LOOP_H

#include <ucp/api/ucp.h>
#include <uv.h>

typedef struct ps_ucx_s ps_ucx_t;

#define PS_UCX_TOKEN_MAX 16

/* What an endpoint's `connected` hook made for it that every header sent on the endpoint
 * carries: the session token of an authenticated connection (proto/authmsg.h); len 0: none. */
typedef struct ps_ucx_token_s {
    uint8_t len;
    uint8_t proven; /* a message sealed with it came (ps_auth_from_shard): the proof was taken */
    uint8_t b[PS_UCX_TOKEN_MAX];
} ps_ucx_token_t;


/** Runs on the loop thread outside UCX callbacks; returns nonzero if it did work. */
typedef int (*ps_ucx_deferred_cb)(ps_ucx_t *u);

struct ps_ucx_s {
    ucp_context_h context;
    ucp_worker_h worker;
    uv_loop_t *loop;
    uv_poll_t *poll;             /* the worker's event fd (a new handle for a new worker) */
    uv_prepare_t prepare;
    int efd;
    int closing;
    ps_ucx_deferred_cb deferred; /* may be NULL */
    uint64_t spin_ns;            /* busy-poll this long after the last activity; 0: never */
    uint64_t last_active_ns;
    int spin_stop;               /* set by ps_ucx_spin_stop (any thread), cleared by
                                    ps_ucx_spin_resume (loop thread) */
    int spinning;                /* 1 while ps_ucx_progress busy-polls; read by other threads
                                    (atomics): before it sleeps it clears this and runs the
                                    deferred hook once more, so work queued under a lock the
                                    hook takes, by a thread that then saw spinning == 1, is
                                    found without a wake-up */
    uv_idle_t busy_idle;         /* active while the worker stays busy: the loop does not sleep */
    uint64_t busy_polls;         /* times ps_ucx_progress left a busy worker for the loop */
    uint64_t busy_since_ns;      /* when the first of those since the worker was last armed
                                    began (0: none) */
    uint64_t stuck_since_ns;     /* the first of those episodes since the worker last
                                    delivered a message or was armed (0: none) */
    uint64_t stuck_spent_ns;     /* of the time since stuck_since_ns, how much went in them */
    int busy_warned;             /* said once that it stays busy */
    /* The owner's (may be NULL): whether another of its threads drives the worker now
     * (ps_ucx_poll, serialized with the loop by the owner's lock). Asked where the busy-poll
     * would yield and before arming: when it says so, ps_ucx_progress returns at once and leaves
     * the worker unarmed (the driver progresses it), and the owner's loop must wake again by
     * itself to take over when the driver is done (worker/client.c, comm_run). */
    int (*driven)(ps_ucx_t *u);
    int unarmed;                 /* ps_ucx_progress left the worker unarmed for a driver
                                    (driven), its event fd unwatched; cleared when it takes
                                    the worker back (written on the loop thread, atomically) */
    int rewatched;               /* the event fd was watched again since ps_ucx_wait_ms last
                                    ran: libuv adds it to its epoll set only at its next poll
                                    for events, which must come before any sleep */
    int serialized;              /* the worker takes calls from more than one thread, one at a
                                    time (UCS_THREAD_MODE_SERIALIZED; ps_ucx_init_serialized) */
    /* The owner's (may be NULL): whether it waits for nothing now (no request of its own in
     * flight). Asked, on the loop's thread, each time the worker stays busy with nothing
     * progressed for PS_UCX_IDLE_BUSY_NS; a worker whose owner waits for nothing arms at once
     * when healthy. */
    int (*owner_idle)(void *arg);
    void *owner_idle_arg;
    uint64_t idle_busy_ns;       /* the last time it was so with the owner idle all along
                                    (0: never); cleared when the worker is armed */
    int test_wedge;              /* PS_TEST_UCX_WEDGE=1 (tests): arm busy until a restart */
    uint32_t eager_below;        /* PS_EAGER_BELOW, or PS_EAGER_BYTES (ps_ucx_eager_below) */
    ucp_am_recv_callback_t am_cb; /* ps_ucx_set_am_handler's, for a restarted worker */
    void *am_arg;
    /* The owner's probe of this worker's shared-memory receive FIFOs (NULL: none; one not
     * open takes nothing): its messages are taken here, not handed to the owner
     * (common/ucxprobe.h). */
    struct ps_ucxprobe_s *probe;
    unsigned shm_tls;            /* the context's shared-memory transports, whose receive
                                    FIFOs a local sender can wedge: PS_UCX_SHM_* bits */
    void *data;                  /* the owner's */
    /* Called by ps_ucx_connect on each endpoint it made, before the caller sends anything on
     * it (proto/authmsg.h: the authentication proof), with the endpoint's token to fill (it
     * comes zeroed); NULL: nothing. */
    void (*connected)(ps_ucx_t *u, ucp_ep_h ep, const char *host, uint16_t port, void *arg,
                      struct ps_ucx_token_s *token);
    void *connected_arg;
};

/* Data messages shorter than this go eagerly on an endpoint whose transports are all copying
 * ones (tcp, shared memory, cma). UCX 1.13 switches to rendezvous at ~20 KiB on tcp (its "auto"
 * threshold) and earlier on shared memory, which costs a hand-shake per message and, there,
 * saves at most one copy: on this VM psbench's 64 KiB rounds were 2x faster eagerly on tcp and
 * 1.3x on shared memory, 256 KiB ones 1.15x and 1.45x, 512 KiB ones even, 1 MiB ones slower on
 * tcp. RDMA endpoints keep UCX's choice. PS_EAGER_BYTES overrides (0: UCX decides). */
#define PS_EAGER_BELOW (512u << 10)

/**
 * @brief Create the UCP context and worker and start driving them from @p loop.
 * Applies the settings UCX 1.13 needs for shared memory under peer error
 * handling (UCX_MM_ERROR_HANDLING=y, UCX_CMA_MEMORY_INVALIDATE=y) unless the
 * environment already sets them.
 * @return 0 or PS_ETRANSPORT / a libuv error; on failure nothing is left to release.
 */
int ps_ucx_init(ps_ucx_t *u, uv_loop_t *loop);

/** @brief ps_ucx_init for an owner whose other threads also drive the worker (ps_ucx_poll),
 *  one at a time under the owner's lock: the worker is made (and remade by ps_ucx_restart)
 *  UCS_THREAD_MODE_SERIALIZED. */
int ps_ucx_init_serialized(ps_ucx_t *u, uv_loop_t *loop);

/**
 * @brief ps_ucx_init with the transports @p tls (UCX_TLS's syntax, e.g. "^sm": all but shared
 * memory) unless the environment sets UCX_TLS, which wins. The shared-memory settings above are
 * applied only where shared memory may be used. @p tls is read during the call only.
 * @return as ps_ucx_init.
 */
int ps_ucx_init_tls(ps_ucx_t *u, uv_loop_t *loop, const char *tls);

/** The transports of the operator's tools (psctl, pslaunch's requests): no shared memory or
 * cma, which need the shard's user (shmat: "Permission denied"; a psd run as a service's user
 * refused a psctl run by anyone else but root). Their messages are small but for an export. */
#define PS_UCX_TLS_CONTROL "^sm"

/** @brief Busy-poll @p us microseconds after activity before arming and sleeping (0: never;
 *  the default is 0); the environment variable PS_SPIN_US, when set, wins. Loop thread, or
 *  before other threads look at the handle. */
void ps_ucx_set_spin(ps_ucx_t *u, uint32_t us);

/** @brief Progress the worker until idle and re-arm it (loop thread only); returns at once
 *  while ps_ucx_spin_stop is in effect. */
void ps_ucx_progress(ps_ucx_t *u);

/** @brief Loop thread, while the worker is left to another thread (unarmed, driven) with a
 *  busy spell on record (busy_since_ns): try to arm it once; if it can be, the spell ends
 *  (the worker is not wedged), else it goes on counting. A wedge then shows as it would with
 *  the loop at the worker (ps_ucx_stuck_ns, the owner's checks of busy_since_ns), and a
 *  spell from before callers drove does not outlive them. Cheap: call it from a timer. */
void ps_ucx_check_armable(ps_ucx_t *u);

/** @brief One pass from a thread other than the loop's, under the owner's lock that also
 *  covers every run of the loop: progress the worker until idle and run the deferred hook,
 *  without arming or spinning (the caller loops). Nothing when there is no worker or it is
 *  closing. */
void ps_ucx_poll(ps_ucx_t *u);

/* How long an owner's loop that drives libuv itself (uv_run(UV_RUN_NOWAIT), then a wait on
 * its backend fd) sleeps at most while the worker is left to callers (driven): its bound for
 * taking the worker back once none has driven it for the busy-poll window. */
#define PS_UCX_ASIDE_MS 1

/** @brief Loop thread, for such an owner's loop: its wait after a turn, given libuv's
 *  @p timeout_ms (uv_backend_timeout; -1: none): at most PS_UCX_ASIDE_MS while the worker is
 *  left unarmed to callers, and 0 (one more turn) when the event fd was watched again since
 *  the last call (libuv registers it only at a poll for events). */
int ps_ucx_wait_ms(ps_ucx_t *u, int timeout_ms);

/** @brief From any thread: another event source of the loop (a uv_queue_work job, an
 *  uv_async) is about to fire, so stop busy-polling and let the loop run it: until
 *  ps_ucx_spin_resume, ps_ucx_progress does not start a progress call (one can copy a whole
 *  rendezvous chunk) and returns to the loop after the one it is in, instead of draining
 *  every transfer first. Whoever calls it must make sure the loop then runs a callback that
 *  calls ps_ucx_spin_resume (the job's done callback): the worker is not re-armed meanwhile. */
static inline void ps_ucx_spin_stop(ps_ucx_t *u)
{
    __atomic_store_n(&u->spin_stop, 1, __ATOMIC_RELEASE);
}

/** @brief Loop thread, from the callback ps_ucx_spin_stop announced: progress as usual again. */
static inline void ps_ucx_spin_resume(ps_ucx_t *u)
{
    __atomic_store_n(&u->spin_stop, 0, __ATOMIC_RELAXED);
}

/**
 * @brief How long the worker has been stuck, or 0: since it last received an active message or
 * was armed, ucp_worker_arm has said busy
 * every time, and at least half of that time went in ps_ucx_progress's episodes of a busy
 * worker with nothing progressed. What stays so for good is UCX 1.13's shared-memory receive
 * FIFO after a sender was killed between taking a slot and marking it written: the reader
 * waits on that slot, and every later message of every local peer sits behind it (the remedy
 * is ps_ucx_restart). A loaded worker progresses; one whose only traffic is a local peer that
 * stopped reading (SIGSTOP) with sends queued to it can look the same. Loop thread.
 */
uint64_t ps_ucx_stuck_ns(const ps_ucx_t *u);

/** @brief Stop the uv handles (closed asynchronously with the loop) and destroy the worker
 *  and context. Endpoints must be closed first. */
void ps_ucx_close(ps_ucx_t *u);

/**
 * @brief Wait for a UCP request (or status pointer) on the loop thread by progressing the
 * worker; for setup and teardown only, never from a UCX callback.
 * @return the request's final status.
 */
ucs_status_t ps_ucx_wait(ps_ucx_t *u, void *req);

/**
 * @brief Close *@p ep (nothing when it is NULL), wait for the close on this thread as
 * ps_ucx_wait() does but for at most 2 s (then say so and leave the request to UCX), and set
 * *@p ep to NULL. @p force: UCP_EP_CLOSE_FLAG_FORCE (the peer is gone or not worth a flush).
 * For teardown and reconnects, never from a UCX callback.
 */
void ps_ucx_ep_close(ps_ucx_t *u, ucp_ep_h *ep, int force);

/**
 * @brief Replace the UCP worker with a new one of the same context, for a worker UCX left
 * wedged (ps_ucx_progress's busy state; libps calls this when a restarted shard's answer never
 * arrives). Every endpoint and request of the old worker is gone afterwards, and no callback of
 * it runs any more: the caller closes its endpoints first (ps_ucx_ep_close with force, which
 * completes their requests if the close finishes) and releases whatever the old worker's
 * requests still held. The AM handlers are set again on the new one. Not from a UCX callback
 * nor from inside ps_ucx_progress (a libuv timer callback is fine).
 * @return 0, or PS_ETRANSPORT / PS_ENOMEM / a libuv error: then there is no worker;
 *  ps_ucx_progress then only runs the deferred hook, ps_ucx_connect fails, and the caller
 *  should fail what it had in flight.
 */
int ps_ucx_restart(ps_ucx_t *u);

/** @brief A short description of the transports an endpoint uses ("tcp", "sysv,cma", ...). */
void ps_ucx_ep_lanes(ucp_ep_h ep, char *buf, size_t len);

/** @brief Whether @p lanes (ps_ucx_ep_lanes's) name a shared-memory transport (sysv, posix,
 *  xpmem): the peer is on this host and sends through the worker's shared-memory FIFO. */
int ps_ucx_lanes_shm(const char *lanes);

/** @brief Whether @p lanes (ps_ucx_ep_lanes's) name cma: a rendezvous message's data to such a
 *  peer is copied out of this process's memory by the peer's own CPU (process_vm_readv), as a
 *  direct pull reads a shard's store (psd streams the next update of such a record). */
int ps_ucx_lanes_peer_reads(const char *lanes);

/* ps_ucx_t.shm_tls's bits (in ucxprobe.c's order). */
#define PS_UCX_SHM_SYSV 1u
#define PS_UCX_SHM_POSIX 2u
#define PS_UCX_SHM_XPMEM 4u

/** @brief The size under which data messages to an endpoint whose transports are @p lanes
 *  (ps_ucx_ep_lanes) are sent eagerly (ps_ucx_eager_flag): PS_EAGER_BELOW when every one of
 *  them copies (tcp, sysv, posix, cma), else 0 (UCX chooses; RDMA, or lanes still unknown). */
uint32_t ps_ucx_eager_below(const ps_ucx_t *u, const char *lanes);

/** @brief The flag to add to ucp_am_send_nbx for @p len data bytes to an endpoint whose
 *  ps_ucx_eager_below() is @p below: UCP_AM_SEND_FLAG_EAGER when @p len is under it, else 0. */
static inline uint32_t ps_ucx_eager_flag(uint32_t below, size_t len)
{
    return len < below ? UCP_AM_SEND_FLAG_EAGER : 0;
}

/** @brief Route both psd Active Message ids (control and data) to @p cb with @p arg. */
void ps_ucx_set_am_handler(ps_ucx_t *u, ucp_am_recv_callback_t cb, void *arg);

/** @brief Resolve @p host : @p port into @p ss: its first IPv4 address (UCX 1.13's TCP
 *  transport corrupts memory with IPv6 peers: shards and their clients use IPv4 only).
 *  @return 0 or PS_ECONFIG when the host has no IPv4 address. */
int ps_sockaddr_resolve(const char *host, uint16_t port, struct sockaddr_storage *ss,
                        socklen_t *len);
/** @brief As ps_sockaddr_resolve, in address family @p family (AF_UNSPEC: the first of any;
 *  psd's metrics endpoint, which is not UCX's). */
int ps_sockaddr_resolve_any(const char *host, uint16_t port, int family,
                            struct sockaddr_storage *ss, socklen_t *len);

/**
 * @brief Create a client endpoint to @p host : @p port (sockaddr connection, peer error
 * handling; @p cb with @p arg is called on the loop thread if the endpoint fails), and set
 * *@p token to what every header sent on it must carry (ps_msg_encode_sealed; len 0 when @p u
 * has no `connected` hook or the hook made none). @p token is the caller's and may be NULL
 * only when @p u has no hook.
 * @return 0, PS_ECONFIG (@p host does not resolve) or PS_ETRANSPORT (*ep is NULL then).
 */
int ps_ucx_connect(ps_ucx_t *u, const char *host, uint16_t port, ucp_err_handler_cb_t cb,
                   void *arg, ucp_ep_h *ep, ps_ucx_token_t *token);

/**
 * @brief ps_ucx_connect to an address resolved already (@p sa, @p salen: read during the
 *  call), for a caller that must not block in a name lookup (libps's comm thread resolves on
 *  a thread of its own). @p host : @p port is the manifest's name of the shard, for the
 *  `connected` hook (the authentication proof is bound to it).
 * @return 0 or PS_ETRANSPORT (*ep is NULL then).
 */
int ps_ucx_connect_addr(ps_ucx_t *u, const struct sockaddr *sa, socklen_t salen,
                        const char *host, uint16_t port, ucp_err_handler_cb_t cb, void *arg,
                        ucp_ep_h *ep, ps_ucx_token_t *token);

/** @brief Map a UCS status to a PS_E* code. */
int ps_ucx_err(ucs_status_t s);

/** @brief What to add to UCX's words for status @p s of a request to a shard that failed: a
 *  connection that could not be made or was reset says " (is psd running there?)", one whose
 *  peer stopped answering (UCX's keepalive: "Endpoint timeout", as when psd was killed while
 *  the connection was idle) says so too, others "". A static string. */
static inline const char *ps_ucx_down_hint(ucs_status_t s)
{
    return s == UCS_ERR_NOT_CONNECTED || s == UCS_ERR_UNREACHABLE ||
                   s == UCS_ERR_CONNECTION_RESET
               ? " (is psd running there?)"
           : s == UCS_ERR_ENDPOINT_TIMEOUT ? " (psd there stopped answering: killed, stopped or "
                                             "cut off?)"
                                           : "";
}

#endif
