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
 * longer than CM_MSG_MAX bytes, a second message with data, a third one) reads as the end of
 * the connection, which UCX handles as a peer that went away. A message of the right shape
 * with crafted contents still reaches UCP, which does not check them all: this stops stray
 * bytes (scanners, health checks, other protocols), not a deliberate attack on UCX. Every other
 * descriptor (UCX's data connections, files, the HTTP port) passes through after one array
 * lookup. */
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cmguard.h"

#define CM_MAX_FD 65536
#define CM_HDR 16                 /* uct_tcp_sockcm_priv_data_hdr_t: size_t length, status */
#define CM_MSG_MAX (1u << 20)     /* UCX's private data is a few KiB */
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
static uint16_t g_port; /* host order; 0: not guarding */

static ssize_t (*real_recv)(int, void *, size_t, int);
static int (*real_accept)(int, struct sockaddr *, socklen_t *);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
static int (*real_close)(int);
static int (*real_socket)(int, int, int);

static void resolve(void)
{
    if (real_recv == NULL)
        real_recv = (ssize_t (*)(int, void *, size_t, int))dlsym(RTLD_NEXT, "recv");
    if (real_accept == NULL)
        real_accept = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
    if (real_accept4 == NULL)
        real_accept4 = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT,
                                                                                "accept4");
    if (real_close == NULL) real_close = (int (*)(int))dlsym(RTLD_NEXT, "close");
    if (real_socket == NULL) real_socket = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
}

void psd_cmguard_port(uint16_t port)
{
    resolve();
    __atomic_store_n(&g_port, port, __ATOMIC_RELEASE);
}

/* A connection accepted on listening socket @p lfd: marked when that is the guarded port. */
static void accepted(int lfd, int fd)
{
    uint16_t port = __atomic_load_n(&g_port, __ATOMIC_ACQUIRE);
    if (fd < 0 || fd >= CM_MAX_FD || port == 0) return;
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(lfd, (struct sockaddr *)&ss, &len) != 0) return;
    uint16_t p = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
               : ss.ss_family == AF_INET  ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
                                          : 0;
    cm_fd_t *s = &g_fd[fd];
    memset(s, 0, sizeof *s);
    __atomic_store_n(&s->on, p == port, __ATOMIC_RELEASE);
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
            bool ok = s->msgs == 0 ? length >= CM_REQ_MIN && length <= CM_MSG_MAX
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
        s->left -= (uint64_t)n;
        if (s->left == 0) s->hdr_got = 0;
    }
    return n;
}
