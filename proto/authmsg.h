/* authmsg.h: the client side of peer authentication on the wire (common/auth.h). */
#ifndef PS_AUTHMSG_H
#define PS_AUTHMSG_H

#include <stdbool.h>

#include "auth.h"
#include "ucx_loop.h"
#include "wire.h"

/**
 * @brief Make every endpoint @p u connects (ps_ucx_connect) send MSG_AUTH with a fresh proof
 *  of @p a first, before anything the caller sends on it, and give it the connection's session
 *  token (ps_auth_session; ps_ucx_connect's @p token), which every later header on it must
 *  carry (ps_msg_encode_sealed): psd drops a header without it. Nothing when @p a is off.
 * @p a is borrowed: it must outlive @p u's connections. Loop thread, before the first connect.
 */
void ps_auth_attach(ps_ucx_t *u, const ps_auth_t *a);

/**
 * @brief Whether message @p m, received on a connection to a shard whose session token is
 *  @p tok (ps_ucx_connect's; empty: none made), is the shard's: with @p a on, psd seals all it
 *  sends on a proven connection, and a client's UCP worker takes connections from any peer, so
 *  a message without the token (a peer without the secret answering a guessed request id) is
 *  not. A PS_EAUTH error without a token is the refusal of the proof (made before any token)
 *  and passes until a message sealed with the token came (@p tok's `proven`, set here): after
 *  that, psd seals its refusals too, and an unsealed one is a forger's (a review, session 72:
 *  one such message, for a guessed request id, made psworker exit 2 for good). Always true
 *  when @p a is off. Constant time in the token (ps_auth_session_ok). libps, the request
 *  client and psctl status drop what fails.
 */
bool ps_auth_from_shard(const ps_auth_t *a, ps_ucx_token_t *tok, const ps_msg_t *m);

#endif
