/* sockhooks.c: accept, accept4, recv, send, close and socket for an executable linked with this
 * file and export_dynamic (psd, psworker, pslaunch): the dynamic linker binds UCX's calls to
 * these, each of which calls libc's (dlsym RTLD_NEXT). They hand every socket's bytes to
 * tcpguard.c, which follows the frames of UCX's TCP transport and fails a read that brings one
 * UCX would trust to the process's harm (a put request outside a receive in flight, an
 * assertion's bait), and a program's own checks of some sockets first (ps_sockhooks_port: psd's
 * shard port, server/cmguard.c). Only executables: in a library that python loads the calls
 * would not reach UCX's, and in one linked into a user's program they would take that
 * program's sockets. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>

#include "sockhooks.h"
#include "tcpguard.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const ps_sockhooks_port_t *g_port; /* atomic */

static ssize_t (*real_recv)(int, void *, size_t, int);
static ssize_t (*real_send)(int, const void *, size_t, int);
static int (*real_accept)(int, struct sockaddr *, socklen_t *);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
static int (*real_close)(int);
static int (*real_socket)(int, int, int);

static void resolve_once(void)
{
    real_recv = (ssize_t (*)(int, void *, size_t, int))dlsym(RTLD_NEXT, "recv");
    real_send = (ssize_t (*)(int, const void *, size_t, int))dlsym(RTLD_NEXT, "send");
    real_accept = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
    real_accept4 = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
    real_close = (int (*)(int))dlsym(RTLD_NEXT, "close");
    real_socket = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
    ps_tcpguard_init(); /* UCX's settings the frame checks depend on */
}

static const ps_sockhooks_port_t *resolve(void)
{
    pthread_once(&g_once, resolve_once);
    return __atomic_load_n(&g_port, __ATOMIC_ACQUIRE);
}

void ps_sockhooks_port(const ps_sockhooks_port_t *p)
{
    resolve();
    __atomic_store_n(&g_port, p, __ATOMIC_RELEASE);
}

ssize_t ps_sockhooks_real_recv(int fd, void *buf, size_t len, int flags)
{
    resolve();
    return real_recv(fd, buf, len, flags);
}

/* A socket made or accepted: nothing seen on its number before counts. */
static void fresh(const ps_sockhooks_port_t *p, int fd)
{
    if (fd < 0) return;
    ps_tcpguard_reset(fd);
    if (p && p->reset) p->reset(fd);
}

int accept(int lfd, struct sockaddr *addr, socklen_t *len)
{
    const ps_sockhooks_port_t *p = resolve();
    int fd = real_accept(lfd, addr, len);
    fresh(p, fd);
    if (fd >= 0 && p && p->accepted) p->accepted(lfd, fd);
    return fd;
}

int accept4(int lfd, struct sockaddr *addr, socklen_t *len, int flags)
{
    const ps_sockhooks_port_t *p = resolve();
    int fd = real_accept4(lfd, addr, len, flags);
    fresh(p, fd);
    if (fd >= 0 && p && p->accepted) p->accepted(lfd, fd);
    return fd;
}

int close(int fd)
{
    fresh(resolve(), fd);
    return real_close(fd);
}

int socket(int domain, int type, int protocol)
{
    const ps_sockhooks_port_t *p = resolve();
    int fd = real_socket(domain, type, protocol);
    fresh(p, fd);
    return fd;
}

ssize_t send(int fd, const void *buf, size_t len, int flags)
{
    resolve();
    ssize_t n = real_send(fd, buf, len, flags);
    if (n > 0) ps_tcpguard_sent(fd, buf, (size_t)n);
    return n;
}

ssize_t recv(int fd, void *buf, size_t len, int flags)
{
    const ps_sockhooks_port_t *p = resolve();
    if ((flags & MSG_PEEK) || len == 0) return real_recv(fd, buf, len, flags);
    ssize_t ret;
    if (p && p->recv && p->recv(fd, buf, len, flags, &ret)) return ret;
    if (ps_tcpguard_refused(fd) || ps_tcpguard_may_read(fd, buf, len) != 0) {
        errno = ECONNRESET;
        return -1;
    }
    ssize_t n = real_recv(fd, buf, len, flags);
    if (n > 0 && ps_tcpguard_received(fd, buf, (size_t)n) != 0) {
        errno = ECONNRESET; /* UCX closes the connection */
        return -1;
    }
    return n;
}
