/* sockhooks.h: the libc socket calls UCX makes, checked (sockhooks.c says how and why). */
#ifndef PS_SOCKHOOKS_H
#define PS_SOCKHOOKS_H

#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

/** A program's own checks of some sockets (psd's of its shard's port, server/cmguard.c). Each
 *  hook runs inside the libc call it names, on the caller's thread. */
typedef struct {
    void (*accepted)(int lfd, int fd); /* accept/accept4 returned @p fd from listener @p lfd */
    void (*reset)(int fd);             /* close(@p fd) is about to run, or socket() made it */
    /* recv on @p fd: returns 1 with the call's result in *ret when it took the call (its own
     * sockets), 0 to leave it to the frame checks (tcpguard.c). */
    int (*recv)(int fd, void *buf, size_t len, int flags, ssize_t *ret);
} ps_sockhooks_port_t;

/** @brief Put @p p's hooks in the calls (once, before UCX is set up; @p p is kept). */
void ps_sockhooks_port(const ps_sockhooks_port_t *p);

/** @brief libc's recv, for a hook that reads from its own sockets. */
ssize_t ps_sockhooks_real_recv(int fd, void *buf, size_t len, int flags);

/** @brief libps's build (PS_SOCKHOOKS_GOT): put the hooks into UCX's libraries' call slots
 *  (libucs, libuct, libucp; gothook.c), once per process, before UCX opens its sockets; any
 *  thread, any number of times. Nothing where the executable defines the hooks itself
 *  (psworker) or PS_UCX_FRAME_CHECKS=0; where the slots cannot be set it warns (the frames
 *  then pass unchecked). */
void ps_sockhooks_got_install(void);

#endif
