/* tcpaccept.c: what the socket hooks (sockhooks.c) do at an accept on one of UCX's listeners,
 * so that a peer connecting to UCX's ports can neither abort the process nor use up its
 * descriptors:
 *   - a connection that comes while a UCP worker or listener is being made is closed at once
 *     (UCX 1.13 asserts that a new interface has no event yet);
 *   - accepted connections that have not sent their connection request yet are bounded in
 *     number and time (idle ones used up psd's descriptors and UCX's event table).
 * tcpguard.c (UCX's TCP frames) and server/cmguard.c (psd's shard port) say when a connection
 * sent its request whole: ps_tcpaccept_settled. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#include "ps/ps_log.h"
#include "tcpaccept.h"
#include "tcpguard.h"

#define TG_MAX_FD PS_TCPGUARD_MAX_FD
#define TG_LOG_WARN_FIRST 20

static uint8_t g_young[TG_MAX_FD]; /* see below */

static void pending_drop(int fd);

void ps_tcpaccept_reset(int fd)
{
    if (fd < 0 || fd >= TG_MAX_FD) return;
    __atomic_store_n(&g_young[fd], 0, __ATOMIC_RELEASE);
    pending_drop(fd);
}

/* ---- sockets made while a UCP worker or listener is made ----
 *
 * ucp_worker_create opens each TCP interface (its socket listens from then on), and then, still
 * inside, asserts that a first look at the interface finds no event (ucp_worker.c:691,
 * `progress_count == 0`, compiled in by Debian's UCX): a connection UCX's async thread accepted
 * in between aborts the process. A peer that connects in that window (a port scan; the test of
 * crafted frames, which connects as soon as the port listens: under load psd's follower died so
 * several times in a row, session 63) is closed at its accept instead, and connects again.
 * g_young[fd]: the maker's token while its creation runs, then TG_UCX_MADE: UCX's socket (its
 * listeners are the ones whose accepts are bounded below). */
#define TG_UCX_MADE 0xff
static uint8_t g_token_next;      /* atomic */
static __thread uint8_t tl_token; /* this thread's, while it makes a worker; else 0 */

void ps_tcpaccept_creating(int on)
{
    if (on) {
        uint8_t t;
        do t = __atomic_add_fetch(&g_token_next, 1, __ATOMIC_RELAXED);
        while (t == 0 || t == TG_UCX_MADE);
        tl_token = t;
        return;
    }
    uint8_t t = tl_token;
    tl_token = 0;
    if (t == 0) return;
    for (size_t fd = 0; fd < TG_MAX_FD; fd++) /* 64 KiB, once per worker or listener made */
        if (__atomic_load_n(&g_young[fd], __ATOMIC_RELAXED) == t)
            __atomic_store_n(&g_young[fd], TG_UCX_MADE, __ATOMIC_RELEASE);
}

void ps_tcpaccept_made(int fd)
{
    if (tl_token && fd >= 0 && fd < TG_MAX_FD)
        __atomic_store_n(&g_young[fd], tl_token, __ATOMIC_RELEASE);
}

int ps_tcpaccept_young(int fd)
{
    if (fd < 0 || fd >= TG_MAX_FD) return 0;
    uint8_t t = __atomic_load_n(&g_young[fd], __ATOMIC_ACQUIRE);
    return t != 0 && t != TG_UCX_MADE;
}

/* ---- connections accepted and not yet settled ----
 *
 * A connection accepted on one of UCX's listeners (its TCP transport's ports, psd's shard port)
 * takes a descriptor and a slot of UCX's async event table (1024) until UCX closes it, which it
 * does only when the peer goes: idle connections that never sent their connection request used
 * up psd's descriptors, and UCX lost its TCP listener to EMFILE for good (clients then found
 * its advertised port refused), or filled the event table and every new client was reset (a
 * review, session 63). At most TG_PENDING_MAX (and an eighth of the descriptor limit)
 * accepted connections wait for their connection request here: one that waited TG_PENDING_MS
 * with nothing unread is shut down at the next accept (UCX sees its peer go and closes it).
 * Past the bound the oldest idle one is shut down for the new one while the new one's number is
 * under half the descriptor limit (numbers are handed out lowest first: it tells how many are
 * open), so a client is not locked out by idle ones; nearer the limit the new one is closed at
 * once (its peer connects again): a shut-down connection's descriptor is freed only once UCX
 * reads its end, and its async thread accepts a whole backlog (up to 4096) before it reads any.
 * Within TG_FD_RESERVE of the limit every accepted connection is closed at once, settled ones
 * too, so that UCX's own accept never meets EMFILE. */
#define TG_PENDING_MAX 256
#define TG_PENDING_MS 10000
#define TG_FD_RESERVE 64 /* descriptors kept free of accepted connections */
static pthread_mutex_t g_pend_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_pend_fd[TG_PENDING_MAX];
static uint64_t g_pend_ms[TG_PENDING_MAX];
static uint32_t g_npend;
static uint8_t g_pend_on[TG_MAX_FD]; /* atomic: in g_pend_fd */
static uint64_t g_pend_shut;         /* connections shut down so (for the log) */

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Entry @p i of the set leaves it (the lock held). */
static void pending_remove_at(uint32_t i)
{
    __atomic_store_n(&g_pend_on[g_pend_fd[i]], 0, __ATOMIC_RELEASE);
    g_pend_fd[i] = g_pend_fd[--g_npend];
    g_pend_ms[i] = g_pend_ms[g_npend];
}

static void pending_drop(int fd)
{
    if (!__atomic_load_n(&g_pend_on[fd], __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&g_pend_lock);
    for (uint32_t i = 0; i < g_npend; i++)
        if (g_pend_fd[i] == fd) {
            pending_remove_at(i);
            break;
        }
    pthread_mutex_unlock(&g_pend_lock);
}

int ps_tcpaccept_ucx_listener(int fd)
{
    return fd >= 0 && fd < TG_MAX_FD && __atomic_load_n(&g_young[fd], __ATOMIC_ACQUIRE) != 0;
}

/* Whether connection @p fd has bytes UCX has not read yet (its request may be among them: a
 * backlog accepted whole before UCX reads any, a process resumed after SIGSTOP; a review found
 * such connections shut as idle). */
static bool unread(int fd)
{
    int n = 0;
    return ioctl(fd, FIONREAD, &n) == 0 && n > 0;
}

int ps_tcpaccept_accepted(int fd)
{
    if (fd < 0 || fd >= TG_MAX_FD) return 0;
    struct rlimit rl;
    rlim_t lim = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : 1024;
    if (lim > TG_MAX_FD) lim = TG_MAX_FD;
    /* Descriptors are handed out lowest first: one numbered this near the limit says the
     * process has nearly none left, and UCX's next accept would fail with EMFILE, after which it
     * drops the listener for good. Whatever comes, settled or not (a peer that sends its
     * connection request and then idles is not counted below: a review found 700 such take a
     * psd of 600 descriptors down), is closed at once while so. */
    if ((rlim_t)fd + TG_FD_RESERVE >= lim) return -1;
    uint32_t cap = (uint32_t)(lim / 8); /* a small limit: fewer wait, or they lock clients out */
    if (cap > TG_PENDING_MAX) cap = TG_PENDING_MAX;
    if (cap < 16) cap = 16;
    uint64_t now = mono_ms();
    uint32_t shut = 0;
    pthread_mutex_lock(&g_pend_lock);
    for (uint32_t i = 0; i < g_npend;) {
        if (now - g_pend_ms[i] < TG_PENDING_MS || unread(g_pend_fd[i])) {
            i++;
            continue;
        }
        shutdown(g_pend_fd[i], SHUT_RDWR); /* still open: a close takes it out first */
        pending_remove_at(i);
        shut++;
    }
    bool full = g_npend >= cap;
    if (full && (rlim_t)fd < lim / 2) {
        uint32_t old = UINT32_MAX; /* room for the new one: the oldest idle one goes */
        for (uint32_t i = 0; i < g_npend; i++)
            if ((old == UINT32_MAX || g_pend_ms[i] < g_pend_ms[old]) && !unread(g_pend_fd[i]))
                old = i;
        if (old != UINT32_MAX) {
            shutdown(g_pend_fd[old], SHUT_RDWR);
            pending_remove_at(old);
            shut++;
        }
        full = false; /* (every one had bytes to read: taken past the cap, the fd check bounds) */
    }
    if (!full && g_npend < TG_PENDING_MAX) {
        g_pend_fd[g_npend] = fd;
        g_pend_ms[g_npend++] = now;
        __atomic_store_n(&g_pend_on[fd], 1, __ATOMIC_RELEASE);
    }
    uint64_t total = g_pend_shut += shut;
    pthread_mutex_unlock(&g_pend_lock);
    if (shut && (total - shut < TG_LOG_WARN_FIRST || (total & (total - 1)) == 0))
        PS_LOG(PS_LOG_WARN, "tcp", "shut %u connection%s to UCX's ports that sent nothing within "
               "%u s, or the oldest of %u that wait (%llu so far)", shut,
               shut == 1 ? "" : "s", TG_PENDING_MS / 1000, cap, (unsigned long long)total);
    return full ? -1 : 0;
}

void ps_tcpaccept_settled(int fd)
{
    if (fd >= 0 && fd < TG_MAX_FD) pending_drop(fd);
}
