/* authmsg.h: the client side of peer authentication on the wire (common/auth.h). */
#ifndef PS_AUTHMSG_H
#define PS_AUTHMSG_H

#include "auth.h"
#include "ucx_loop.h"

/**
 * @brief Make every endpoint @p u connects (ps_ucx_connect) send MSG_AUTH with a fresh proof
 *  of @p a first, before anything the caller sends on it, and give it the connection's session
 *  token (ps_auth_session; ps_ucx_connect's @p token), which every later header on it must
 *  carry (ps_msg_encode_sealed): psd drops a header without it. Nothing when @p a is off.
 * @p a is borrowed: it must outlive @p u's connections. Loop thread, before the first connect.
 */
void ps_auth_attach(ps_ucx_t *u, const ps_auth_t *a);

#endif
