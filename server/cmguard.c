/* cmguard.c: keeps stray bytes on a shard's port from aborting psd inside UCX 1.13.
 *
 * UCX 1.13's TCP connection manager (tcp_sockcm), which owns the port psd listens on, reads a
 * connecting peer's messages (a 16-byte header whose first 8 bytes are the length of the data
 * that follows, then that data) with recv() calls of up to its whole buffer, and asserts that
 * it never read past the message its header announced: 17 zero bytes abort the process
 * (tcp_sockcm_ep.c:825, "offset <= length"), as does a length that wraps when 16 is added.
 * psd cannot check the bytes itself: UCX accepts and reads the connection.
 *
 * So psd's executable defines accept, accept4, recv, close and socket, which the dynamic
 * linker binds UCX's calls to (psd is linked with export_dynamic), each calling libc's. A
 * connection accepted on the shard's port is marked; on a marked one, recv never returns bytes
 * past the end of the current message (it reads a header first, then at most the length it
 * announced), and a message UCX's client does not send (a request shorter than CM_REQ_MIN or
 * longer than UCX's buffer, one whose error-handling or address mode byte is not a psd
 * client's, a second message with data, a third one) reads as the end of the connection, which
 * UCX handles as a peer that went away. A request of the right shape with crafted contents
 * still reaches UCP, which does not check them all (an assertion in address.c aborts on some):
 * this stops stray bytes (scanners, health checks, other protocols), not a deliberate attack
 * on UCX. Every other
 * descriptor (UCX's data connections, files, the HTTP port) passes through after one array
 * lookup. */
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cmguard.h"

#define CM_MAX_FD 65536
#define CM_HDR 16                 /* uct_tcp_sockcm_priv_data_hdr_t: size_t length, status */
#define CM_MSG_MAX 2048           /* UCX's buffer (UCX_TCP_CM_PRIV_DATA_LEN, 2 KiB): a longer
                                     message fills it and UCX then spins on 0-byte reads */
#define CM_REQ_MIN 16             /* a connection request: UCP's endpoint id, modes and an
                                     address (47 bytes on this host); 0 reads stale memory */

typedef struct {
    uint8_t on;      /* accepted on the guarded port (atomic: set and cleared by other calls) */
    uint8_t dead;    /* a header was refused: every read is the end of the connection */
    uint8_t hdr_got; /* header bytes of the current message read so far */
    uint8_t hdr[CM_HDR];
    uint8_t msgs;    /* messages whose header was read */
    uint64_t left;   /* data bytes of the current message still to read */
} cm_fd_t;

static cm_fd_t g_fd[CM_MAX_FD];
static struct sockaddr_storage g_addr; /* the guarded listening address (psd_cmguard_listen) */
static int g_on;                       /* g_addr is set (atomic) */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static uint64_t g_msg_max = CM_MSG_MAX; /* UCX_TCP_CM_PRIV_DATA_LEN when set */

static ssize_t (*real_recv)(int, void *, size_t, int);
static int (*real_accept)(int, struct sockaddr *, socklen_t *);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
static int (*real_close)(int);
static int (*real_socket)(int, int, int);

static void resolve_once(void)
{
    real_recv = (ssize_t (*)(int, void *, size_t, int))dlsym(RTLD_NEXT, "recv");
    real_accept = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
    real_accept4 = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
    real_close = (int (*)(int))dlsym(RTLD_NEXT, "close");
    real_socket = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
}

static void resolve(void)
{
    pthread_once(&g_once, resolve_once);
}

void psd_cmguard_listen(const struct sockaddr *sa, socklen_t len)
{
    resolve();
    const char *e = getenv("UCX_TCP_CM_PRIV_DATA_LEN"); /* UCX's memory units: 4k, 1m... */
    if (e && *e) {
        char *end;
        unsigned long long v = strtoull(e, &end, 10);
        unsigned long long unit = (*end == 'k' || *end == 'K') ? 1ull << 10
                                : (*end == 'm' || *end == 'M') ? 1ull << 20 : 1;
        if (v > 0 && v * unit <= (1ull << 30)) g_msg_max = v * unit;
    }
    if (len > sizeof g_addr) return;
    memcpy(&g_addr, sa, len);
    __atomic_store_n(&g_on, 1, __ATOMIC_RELEASE);
}

/* Whether @p a (a listening socket's own address) is the guarded one: the same family and port,
 * and the same IP unless the guarded one is a wildcard. UCX's data transport listens on
 * ephemeral ports of each interface: the same number on another IP is not psd's port. */
static bool guarded(const struct sockaddr_storage *a)
{
    const struct sockaddr_storage *g = &g_addr;
    if (a->ss_family != g->ss_family) return false;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)g;
        return x->sin_port == y->sin_port && (y->sin_addr.s_addr == htonl(INADDR_ANY) ||
                                              x->sin_addr.s_addr == y->sin_addr.s_addr);
    }
    if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)g;
        return x->sin6_port == y->sin6_port &&
               (IN6_IS_ADDR_UNSPECIFIED(&y->sin6_addr) ||
                memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0);
    }
    return false;
}

/* A connection accepted on listening socket @p lfd: marked when that is the guarded address. */
static void accepted(int lfd, int fd)
{
    if (fd < 0 || fd >= CM_MAX_FD) return;
    cm_fd_t *s = &g_fd[fd];
    memset(s, 0, sizeof *s);
    if (!__atomic_load_n(&g_on, __ATOMIC_ACQUIRE)) return;
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(lfd, (struct sockaddr *)&ss, &len) != 0) return;
    __atomic_store_n(&s->on, guarded(&ss), __ATOMIC_RELEASE);
}

int accept(int lfd, struct sockaddr *addr, socklen_t *len)
{
    resolve();
    int fd = real_accept(lfd, addr, len);
    accepted(lfd, fd);
    return fd;
}

int accept4(int lfd, struct sockaddr *addr, socklen_t *len, int flags)
{
    resolve();
    int fd = real_accept4(lfd, addr, len, flags);
    accepted(lfd, fd);
    return fd;
}

int close(int fd)
{
    resolve();
    if (fd >= 0 && fd < CM_MAX_FD) __atomic_store_n(&g_fd[fd].on, 0, __ATOMIC_RELEASE);
    return real_close(fd);
}

/* A new socket never inherits a mark (should a marked one have been closed some other way). */
int socket(int domain, int type, int protocol)
{
    resolve();
    int fd = real_socket(domain, type, protocol);
    if (fd >= 0 && fd < CM_MAX_FD) __atomic_store_n(&g_fd[fd].on, 0, __ATOMIC_RELEASE);
    return fd;
}

ssize_t recv(int fd, void *buf, size_t len, int flags)
{
    resolve();
    if (fd < 0 || fd >= CM_MAX_FD || !__atomic_load_n(&g_fd[fd].on, __ATOMIC_ACQUIRE) ||
        (flags & MSG_PEEK) || len == 0)
        return real_recv(fd, buf, len, flags);
    cm_fd_t *s = &g_fd[fd];
    if (s->dead) return 0;
    size_t cap = s->hdr_got < CM_HDR ? (size_t)(CM_HDR - s->hdr_got) : (size_t)s->left;
    if (len > cap) len = cap;
    ssize_t n = real_recv(fd, buf, len, flags);
    if (n <= 0) return n;
    if (s->hdr_got < CM_HDR) {
        memcpy(s->hdr + s->hdr_got, buf, (size_t)n);
        s->hdr_got = (uint8_t)(s->hdr_got + n);
        if (s->hdr_got == CM_HDR) {
            uint64_t length;
            memcpy(&length, s->hdr, sizeof length);
            /* A client sends two messages: its connection request, then a header alone (the
             * notification that it connected). Anything else is not UCX's client. */
            bool ok = s->msgs == 0 ? length >= CM_REQ_MIN && length <= g_msg_max
                    : s->msgs == 1 ? length == 0
                                   : false;
            s->msgs++;
            if (!ok) {
                s->dead = 1; /* UCX sees the peer go away before its header was whole */
                return 0;
            }
            s->left = length;
            if (length == 0) s->hdr_got = 0; /* a header alone: the next message starts */
        }
    } else {
        /* The connection request's fixed fields (UCP's sockaddr data): the error handling mode
         * at byte 8 is PEER (1) for every psd client; the address mode at byte 9 is one of
         * UCP's four. Random contents rarely pass; a deliberate message still can. */
        uint64_t length;
        memcpy(&length, s->hdr, sizeof length);
        uint64_t at = length - s->left; /* offset of buf[0] in the message's data */
        bool bad = false;
        if (s->msgs == 1 && at <= 8 && at + (uint64_t)n > 8) bad |= ((uint8_t *)buf)[8 - at] != 1;
        if (s->msgs == 1 && at <= 9 && at + (uint64_t)n > 9) bad |= ((uint8_t *)buf)[9 - at] > 3;
        if (bad) {
            s->dead = 1;
            return 0;
        }
        s->left -= (uint64_t)n;
        if (s->left == 0) s->hdr_got = 0;
    }
    return n;
}
