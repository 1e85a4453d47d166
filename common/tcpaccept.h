/* tcpaccept.h: accepts on UCX's listeners, bounded (tcpaccept.c says why and how). The socket
 * hooks (sockhooks.c) call it at socket(), accept() and close(); the makers of UCP workers and
 * listeners (common/ucx_loop.c, server/listen.c) mark the sockets UCX makes meanwhile. */
#ifndef PS_TCPACCEPT_H
#define PS_TCPACCEPT_H

/** @brief Socket @p fd was closed or made anew: it is no longer young or waiting. */
void ps_tcpaccept_reset(int fd);

/** @brief The calling thread starts (@p on 1) or ends (0) making a UCP worker: the sockets it
 *  makes meanwhile (ps_tcpaccept_made) are young until it ends, and a connection accepted on a
 *  young listener is closed at once (common/sockhooks.c: UCX 1.13 asserts that a new interface
 *  has no event yet). Calls pair up on one thread, one worker at a time per thread. */
void ps_tcpaccept_creating(int on);

/** @brief Socket @p fd was just made (socket()): young if its thread is making a worker. */
void ps_tcpaccept_made(int fd);

/** @brief Whether listener @p fd was made by a worker still being made. */
int ps_tcpaccept_young(int fd);

/** @brief Whether @p fd was made while a UCP worker or listener was made (ps_tcpaccept_creating
 *  around ucp_worker_create and ucp_listener_create): one of UCX's listeners. */
int ps_tcpaccept_ucx_listener(int fd);

/** @brief Connection @p fd was accepted on one of UCX's listeners: it waits for its connection
 *  request (ps_tcpaccept_settled) among at most 256 such; one that waited 10 s is shut down
 *  (its peer sent nothing: idle connections used up the descriptors and UCX's event table),
 *  and past 256 the oldest, while @p fd is under half the descriptor limit. Any thread (UCX's
 *  async thread accepts). @return 0, or -1 when 256 wait already and descriptors are short:
 *  the caller closes @p fd (the peer connects again). */
int ps_tcpaccept_accepted(int fd);

/** @brief Connection @p fd sent its connection request whole (tcpguard.c's frames, cmguard.c's
 *  shard port): no longer bounded by ps_tcpaccept_accepted. */
void ps_tcpaccept_settled(int fd);

#endif
