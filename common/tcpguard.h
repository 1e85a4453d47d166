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

/** @brief The calling thread starts (@p on 1) or ends (0) making a UCP worker: the sockets it
 *  makes meanwhile (ps_tcpguard_made) are young until it ends, and a connection accepted on a
 *  young listener is closed at once (common/sockhooks.c: UCX 1.13 asserts that a new interface
 *  has no event yet). Calls pair up on one thread, one worker at a time per thread. */
void ps_tcpguard_creating(int on);

/** @brief Socket @p fd was just made (socket()): young if its thread is making a worker. */
void ps_tcpguard_made(int fd);

/** @brief Whether listener @p fd was made by a worker still being made. */
int ps_tcpguard_young(int fd);

/** @brief Whether @p fd was made while a UCP worker or listener was made (ps_tcpguard_creating
 *  around ucp_worker_create and ucp_listener_create): one of UCX's listeners. */
int ps_tcpguard_ucx_listener(int fd);

/** @brief Connection @p fd was accepted on one of UCX's listeners: it waits for its connection
 *  request (ps_tcpguard_settled) among at most 256 such; one that waited 10 s is shut down
 *  (its peer sent nothing: idle connections used up the descriptors and UCX's event table),
 *  and past 256 the oldest, while @p fd is under half the descriptor limit. Any thread (UCX's
 *  async thread accepts). @return 0, or -1 when 256 wait already and descriptors are short:
 *  the caller closes @p fd (the peer connects again). */
int ps_tcpguard_accepted(int fd);

/** @brief Connection @p fd sent its connection request whole (tcpguard's frames, cmguard.c's
 *  shard port): no longer bounded by ps_tcpguard_accepted. */
void ps_tcpguard_settled(int fd);

#endif
