/* sockhooks.c: accept, accept4, recv, send, close and socket for UCX's calls. They hand every
 * socket's bytes to tcpguard.c, which follows the frames of UCX's TCP transport and fails a read
 * that brings one UCX would trust to the process's harm (a put request outside a receive in
 * flight, an assertion's bait), and a program's own checks of some sockets first
 * (ps_sockhooks_port: psd's shard port, server/cmguard.c). Each calls libc's.
 *
 * Built two ways:
 * - into an executable (psd, psworker, pslaunch, psctl), linked with export_dynamic: this file
 *   defines the libc names themselves, and the dynamic linker binds UCX's calls to them (libc's
 *   found with dlsym RTLD_NEXT);
 * - into libps with PS_SOCKHOOKS_GOT (worker/meson.build): a library cannot do that (in one
 *   that python loads the calls would not reach UCX's, and in one linked into a user's program
 *   they would take that program's sockets), so ps_sockhooks_got_install() writes the same
 *   functions into the GOT slots of UCX's own libraries (gothook.c), which libps's client does
 *   once per process where the executable has no hooks of its own (psd.torch in python, a
 *   user's C program). libc's functions are then the ones the dynamic linker gives (RTLD_DEFAULT).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "envflag.h"
#include "ps/ps_log.h"
#include "sockhooks.h"
#include "tcpaccept.h"
#include "tcpguard.h"
#ifdef PS_SOCKHOOKS_GOT
#include "gothook.h"
#define REAL_NEXT RTLD_DEFAULT
#else
#define REAL_NEXT RTLD_NEXT
#endif

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
    real_recv = (ssize_t (*)(int, void *, size_t, int))dlsym(REAL_NEXT, "recv");
    real_send = (ssize_t (*)(int, const void *, size_t, int))dlsym(REAL_NEXT, "send");
    real_accept = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(REAL_NEXT, "accept");
    real_accept4 = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(REAL_NEXT, "accept4");
    real_close = (int (*)(int))dlsym(REAL_NEXT, "close");
    real_socket = (int (*)(int, int, int))dlsym(REAL_NEXT, "socket");
#ifndef PS_SOCKHOOKS_GOT
    ps_tcpguard_init(1); /* UCX's settings the frame checks depend on */
#endif
}

static const ps_sockhooks_port_t *resolve(void)
{
    pthread_once(&g_once, resolve_once);
    return __atomic_load_n(&g_port, __ATOMIC_ACQUIRE);
}

#ifndef PS_SOCKHOOKS_GOT
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
#endif

/* A socket made or accepted: nothing seen on its number before counts. */
static void fresh(const ps_sockhooks_port_t *p, int fd)
{
    if (fd < 0) return;
    ps_tcpguard_reset(fd);
    ps_tcpaccept_reset(fd);
    if (p && p->reset) p->reset(fd);
}

/* A socket UCX made or accepted, @p fd: returned as is, or, where the process's open-file limit
 * was left as it was (libps in another program: GOT mode) and the number is past tcpguard's
 * table (it would pass unchecked), closed and refused as if the process had no more files. */
static int numbered(int fd)
{
#ifdef PS_SOCKHOOKS_GOT
    if (fd >= PS_TCPGUARD_MAX_FD) {
        real_close(fd);
        errno = EMFILE;
        return -1;
    }
#endif
    return fd;
}

/* Listener @p lfd of a UCP worker still being made (ps_tcpaccept_young), or one with as many
 * accepted connections waiting for their request as tcpaccept takes (@p full): the connections
 * waiting there are accepted and closed (their peers connect again), and the caller told there
 * are none, so that UCX's check of the new interface finds no event, or UCX's descriptors stay
 * bounded. */
static int backlog_closed(int lfd, bool full)
{
    int flags = fcntl(lfd, F_GETFL), n = 0;
    for (int fd; (fd = real_accept(lfd, NULL, NULL)) >= 0;) {
        fresh(resolve(), fd);
        real_close(fd);
        n++;
        if (flags < 0 || !(flags & O_NONBLOCK)) break; /* the next accept would wait */
    }
    if (n && !full)
        PS_LOG(PS_LOG_INFO, "tcp", "closed %d connection%s to UCX's TCP transport that came "
               "while its worker or listener was being made", n, n == 1 ? "" : "s");
    static uint64_t closed_full; /* UCX's async thread only */
    if (full) {
        uint64_t was = closed_full;
        closed_full += (uint64_t)n + 1; /* and the one the caller closed */
        if ((was ^ closed_full) > was) /* a power of two passed: 1, 2, 4 ... said */
            PS_LOG(PS_LOG_WARN, "tcp", "closed connections to UCX's ports at once: many accepted "
                   "ones wait for their connection request already, or descriptors run short "
                   "(%llu so far)",
                   (unsigned long long)closed_full);
    }
    errno = EAGAIN;
    return -1;
}

/* After accept/accept4 on listener @p lfd returned @p fd: UCX's listeners bound (tcpaccept.c),
 * the program's own hook told. Returns what the call returns. */
static int accepted(const ps_sockhooks_port_t *p, int lfd, int fd)
{
    fresh(p, fd);
    if (fd >= 0 && ps_tcpaccept_ucx_listener(lfd) && ps_tcpaccept_accepted(fd) != 0) {
        fresh(p, fd); /* as a close does */
        real_close(fd);
        return backlog_closed(lfd, true);
    }
    if (fd >= 0 && p && p->accepted) p->accepted(lfd, fd);
    return fd;
}

static int sh_accept(int lfd, struct sockaddr *addr, socklen_t *len)
{
    const ps_sockhooks_port_t *p = resolve();
    if (ps_tcpaccept_young(lfd)) return backlog_closed(lfd, false);
    return accepted(p, lfd, numbered(real_accept(lfd, addr, len)));
}

static int sh_accept4(int lfd, struct sockaddr *addr, socklen_t *len, int flags)
{
    const ps_sockhooks_port_t *p = resolve();
    if (ps_tcpaccept_young(lfd)) return backlog_closed(lfd, false);
    return accepted(p, lfd, numbered(real_accept4(lfd, addr, len, flags)));
}

static int sh_close(int fd)
{
    fresh(resolve(), fd);
    return real_close(fd);
}

static int sh_socket(int domain, int type, int protocol)
{
    const ps_sockhooks_port_t *p = resolve();
    int fd = numbered(real_socket(domain, type, protocol));
    fresh(p, fd);
    ps_tcpaccept_made(fd);
    return fd;
}

static ssize_t sh_send(int fd, const void *buf, size_t len, int flags)
{
    resolve();
    ssize_t n = real_send(fd, buf, len, flags);
    if (n > 0) ps_tcpguard_sent(fd, buf, (size_t)n);
    return n;
}

static ssize_t sh_recv(int fd, void *buf, size_t len, int flags)
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

#ifndef PS_SOCKHOOKS_GOT
/* The libc names, for UCX's calls (the executable's definitions come first). */
int accept(int lfd, struct sockaddr *addr, socklen_t *len) { return sh_accept(lfd, addr, len); }

int accept4(int lfd, struct sockaddr *addr, socklen_t *len, int flags)
{
    return sh_accept4(lfd, addr, len, flags);
}

int close(int fd) { return sh_close(fd); }

int socket(int domain, int type, int protocol) { return sh_socket(domain, type, protocol); }

ssize_t send(int fd, const void *buf, size_t len, int flags)
{
    return sh_send(fd, buf, len, flags);
}

ssize_t recv(int fd, void *buf, size_t len, int flags) { return sh_recv(fd, buf, len, flags); }
#else
static pthread_once_t g_install_once = PTHREAD_ONCE_INIT;

static void install(void)
{
    /* An executable built with this file the other way (psworker) checks UCX's calls itself. */
    if (dlsym(RTLD_DEFAULT, "ps_sockhooks_port") != NULL) return;
    if (ps_env_off("PS_UCX_FRAME_CHECKS")) {
        PS_LOG(PS_LOG_INFO, "libps", "PS_UCX_FRAME_CHECKS=%s: UCX's TCP frames are not checked "
               "in this process", getenv("PS_UCX_FRAME_CHECKS"));
        return;
    }
    resolve();
    /* The slots will point into libps: a shared libps must stay loaded (a dlclose would leave
     * UCX calling unmapped code); one linked into the executable (its link map's name empty)
     * stays anyway. */
    Dl_info self;
    struct link_map *lm = NULL;
    if (dladdr1((void *)sh_recv, &self, (void **)&lm, RTLD_DL_LINKMAP) && lm && lm->l_name &&
        lm->l_name[0] && dlopen(lm->l_name, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) == NULL) {
        PS_LOG(PS_LOG_WARN, "libps", "UCX's TCP frames are not checked in this process (%s "
               "cannot be kept loaded: %s)", lm->l_name, dlerror());
        return;
    }
    if (!real_recv || !real_send || !real_accept || !real_accept4 || !real_close ||
        !real_socket) {
        PS_LOG(PS_LOG_WARN, "libps", "libc's socket calls not found: UCX's TCP frames are not "
               "checked in this process");
        return;
    }
    static const char *const libs[] = {"libucs.so", "libuct.so", "libucp.so", NULL};
    const ps_got_hook_t hooks[] = {
        {"recv", (void *)sh_recv},       {"send", (void *)sh_send},
        {"accept", (void *)sh_accept},   {"accept4", (void *)sh_accept4},
        {"close", (void *)sh_close},     {"socket", (void *)sh_socket},
    };
    ps_tcpguard_init(0); /* UCX's settings the frame checks depend on; the fd limit is not ours */
    char err[256] = "";
    int n = ps_got_hook(libs, hooks, sizeof hooks / sizeof hooks[0], err, sizeof err);
    if (n <= 0) {
        PS_LOG(PS_LOG_WARN, "libps", "UCX's TCP frames are not checked in this process (%s)",
               n < 0 ? err : "no socket call of UCX's libraries found");
        return;
    }
    PS_LOG(PS_LOG_DEBUG, "libps", "UCX's TCP frames checked: %d call slots of UCX's libraries "
           "hooked", n);
}

void ps_sockhooks_got_install(void)
{
    pthread_once(&g_install_once, install);
}
#endif
