/* tcpguard.h: checks the frames of UCX 1.13's TCP transport that reach psd (tcpguard.c says
 * why and what). cmguard.c calls it from the libc calls it defines for UCX. */
#ifndef PS_TCPGUARD_H
#define PS_TCPGUARD_H

#include <stddef.h>
#include <stdint.h>

/** @brief The byte count UCX reads from environment variable @p var (its memory units: 4096,
 *  64k, 1m); 0 when it is not set, not a count, 0 or above @p max. */
uint64_t ps_ucx_env_bytes(const char *var, uint64_t max);

/** Sockets numbered below this are followed; one above passes unchecked. */
#define PS_TCPGUARD_MAX_FD 65536

/** @brief Read UCX's settings the checks depend on (UCX_TCP_RX_SEG_SIZE: the longest frame).
 *  sockhooks.c calls it once, at the first socket call or when libps hooks UCX's libraries
 *  (ps_sockhooks_got_install), which also turns the bookkeeping of ps_tcpguard_expect on. With
 *  @p limit_fds the process's open-file limit is set to the table's 65536 sockets (a socket
 *  numbered past it would pass unchecked), or to the hard limit when that is lower; libps in
 *  another program leaves that program's limit as it is. */
void ps_tcpguard_init(int limit_fds);

/** @brief A receive of @p len bytes into @p buf is about to be posted (ucp_am_recv_data_nbx):
 *  until ps_tcpguard_done(@p buf), a peer's put request may write there (UCP's rendezvous over
 *  TCP puts the data where the receiver's RTR said). The caller keeps @p buf. Nothing
 *  is kept before ps_tcpguard_init. Thread-safe.
 *  @return 0, or -1 when out of memory (puts there are then refused, and their connections
 *  closed). */
int ps_tcpguard_expect(const void *buf, size_t len);

/** @brief The receive into @p buf ended (its callback ran, or it completed or failed at once):
 *  one ps_tcpguard_expect(@p buf) is withdrawn. Thread-safe. */
void ps_tcpguard_done(const void *buf);

/** @brief @p n bytes at @p buf were sent on socket @p fd (send(), after the call). Its first
 *  bytes tell a TCP transport connection psd opened (UCX's magic number). */
void ps_tcpguard_sent(int fd, const void *buf, size_t n);

/** @brief @p n bytes at @p buf were received on socket @p fd (recv(), after the call; not a
 *  peek), in the order of the stream. @return 0 when they may go to UCX; -1 when they hold a
 *  frame UCX must not see (logged): the caller fails the read as a reset connection, and every
 *  later one. */
int ps_tcpguard_received(int fd, const void *buf, size_t n);

/** @brief A read of up to @p len bytes into @p buf on socket @p fd is about to be made (recv(),
 *  before the call). While a put's data is coming UCX reads it straight to where the put
 *  request said: that must still be a receive in flight (it may have ended, and its memory been
 *  reused, while a peer trickled the data). @return 0, or -1 (logged; the socket is refused). */
int ps_tcpguard_may_read(int fd, const void *buf, size_t len);

/** @brief Whether socket @p fd was refused by ps_tcpguard_received. */
int ps_tcpguard_refused(int fd);

/** @brief Connections refused by ps_tcpguard_received so far in this process. */
uint64_t ps_tcpguard_closed_total(void);

/** @brief Socket @p fd was closed or made anew: forget what was seen on it. */
void ps_tcpguard_reset(int fd);

/** @brief Every receive in flight ends (a transport restart destroyed the worker whose
 *  receives they were: none of their callbacks, which call ps_tcpguard_done, runs). */
void ps_tcpguard_forget_spans(void);

#endif
