/* ctl.h: one operator request at a time to one shard, synchronously (psctl scale,
 * pslaunch's polling). Owns its own loop and UCP worker; reconnects when the shard
 * went away between calls. Not for the training path (that is libps). */
#ifndef PS_CTL_H
#define PS_CTL_H

#include <stdint.h>

#include "manifest.h"
#include "wire.h"

typedef struct ps_ctl_s ps_ctl_t;

/** @brief A handle for requests to shard @p shard of @p m (copied). Connects lazily.
 *  @return 0, PS_ENOMEM or PS_ETRANSPORT (UCX did not start). Release with ps_ctl_close. */
int ps_ctl_open(ps_ctl_t **out, const ps_manifest_t *m, uint32_t shard);

/**
 * @brief Send @p req (its req_id is set here) and wait for the reply with the same id.
 * @param[out] reply the reply header; a MSG_ERROR reply is returned as its status.
 * @return 0, the error reply's status, PS_ETIMEDOUT, PS_ETRANSPORT (the shard is
 *         unreachable; the next call connects again).
 */
int ps_ctl_call(ps_ctl_t *c, ps_msg_t *req, ps_msg_t *reply, uint32_t timeout_ms);

/** @brief The data of the last reply (e.g. status JSON, NUL-terminated), or NULL; owned by
 *  @p c, valid until the next call. */
const char *ps_ctl_reply_data(const ps_ctl_t *c, size_t *len);

/** @brief Close the connection and free the handle. NULL is a no-op. */
void ps_ctl_close(ps_ctl_t *c);

#endif
