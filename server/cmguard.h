/* cmguard.h: guards UCX 1.13's connection manager on psd's port against malformed bytes
 * (cmguard.c says how). */
#ifndef PSD_CMGUARD_H
#define PSD_CMGUARD_H

#include <stdint.h>

/** @brief Guard the connections accepted from now on on TCP port @p port (0: none). Call before
 *  the UCX listener is created; any thread. */
void psd_cmguard_port(uint16_t port);

#endif
