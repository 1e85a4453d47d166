/* reqclient.h: a synchronous request/reply channel to the shards of a manifest, for the
 * operator tools (psctl's verbs, pslaunch --follow) and tests. One request at a time; an
 * endpoint per shard is made on first use and made again after it failed. Owns its own libuv
 * loop and UCP worker. Every wait is bounded by the timeout given at open. Not for the training
 * path (that is libps). */
#ifndef PS_REQCLIENT_H
#define PS_REQCLIENT_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "manifest.h"
#include "wire.h"

typedef struct ps_req_s ps_req_t;

/**
 * @brief Start UCX for talking to the shards of @p m (borrowed: it must outlive the client).
 * @param timeout_s  the longest one call may wait for its reply, counting only the time
 *  this process ran: a stall of the process (stopped by SIGSTOP or Ctrl-Z, or given no CPU)
 *  of more than 0.2 s is added to it.
 * @return 0, or PS_ETRANSPORT / PS_ENOMEM with @p err set. Release with ps_req_close().
 */
int ps_req_open(const ps_manifest_t *m, double timeout_s, ps_req_t **out, char *err,
                size_t errlen);

/**
 * @brief Send @p req (req_id set here) to shard @p shard and wait for its reply. A shard not
 *  connected yet has its name looked up first, within the same timeout (PS_ETIMEDOUT when DNS
 *  does not answer in time; the lookup goes on for the next call). The header
 *  carries the connection's session token (authmsg.h), unless @p req has one of its own
 *  (session_len > 0: sent as it is, for tests of psd's check). With a secret_file, a reply
 *  is taken only when its header carries that connection's token (psd seals what it sends,
 *  as libps checks): one without it, or with another, is dropped (logged once per
 *  connection, naming the shard) and the call waits on, so a peer without the secret cannot
 *  answer it; except a PS_EAUTH error without a token (psd refusing the proof). Without a
 *  secret any reply to the request's id is taken.
 * @param[out] reply  the reply's header (an MSG_ERROR reply is returned as its status).
 * @param[out] data   when not NULL: the reply's data, malloc'd (the caller frees it; NULL when
 *                    there is none), its size in @p len.
 * @return 0; the shard's negative status for MSG_ERROR (text in @p err); PS_ETIMEDOUT or
 *  PS_ETRANSPORT when no reply came (@p err names the shard, and says how many replies were
 *  dropped for their token; the next call connects again); PS_ECANCELED (ps_req_set_cancel).
 */
int ps_req_call(ps_req_t *c, uint32_t shard, ps_msg_t *req, ps_msg_t *reply, void **data,
                size_t *len, char *err, size_t errlen);

/**
 * @brief While *@p flag (borrowed; NULL: none) is non-zero, a call returns PS_ECANCELED within
 *  a few milliseconds instead of waiting for its reply (a signal handler sets it: psctl
 *  checkpoint's Ctrl-C). A reply that comes later is dropped. Set it to NULL again for calls
 *  that must be waited for.
 */
void ps_req_set_cancel(ps_req_t *c, volatile sig_atomic_t *flag);

/**
 * @brief The same as ps_req_set_cancel for a caller that cannot set a flag (its signals are
 *  blocked and taken with sigwaitinfo: pslaunch --follow): while @p fn (NULL: none) returns
 *  non-zero for @p arg (borrowed), waits end with PS_ECANCELED. Called every few milliseconds
 *  of a wait, on the caller's thread.
 */
void ps_req_set_cancel_fn(ps_req_t *c, int (*fn)(void *), void *arg);

/** @brief Close the endpoints and stop UCX. NULL is a no-op. */
void ps_req_close(ps_req_t *c);

#endif
