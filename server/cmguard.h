/* cmguard.h: guards UCX 1.13's connection manager on psd's port against malformed bytes
 * (cmguard.c says how). */
#ifndef PSD_CMGUARD_H
#define PSD_CMGUARD_H

#include <sys/socket.h>

/** @brief Guard the connections accepted from now on on listening address @p sa (the one psd
 *  gives UCX's listener; a wildcard address guards its port on every address). Call once,
 *  before the UCX listener is created. */
void psd_cmguard_listen(const struct sockaddr *sa, socklen_t len);

#endif
