/* amguard.h: checks the protocol headers of every UCP message a peer sends before UCX 1.13
 * acts on them (amguard.c says why and what). */
#ifndef PS_AMGUARD_H
#define PS_AMGUARD_H

#include <stdint.h>

#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

/** @brief Put the checks in front of UCP's message handlers of this process, once (later calls
 *  do nothing). Call before the first UCP worker is made: UCP gives its handlers to each
 *  transport when the worker opens it. Installs nothing, logging why at debug level, where
 *  the UCX library is not 1.13 (the formats checked are 1.13's). Thread-safe. */
void ps_amguard_install(void);

/** @brief Check the messages to worker @p w from now on (call right after ucp_worker_create;
 *  ps_amguard_unwatch before ucp_worker_destroy). Messages to other workers of the process pass
 *  unchecked. @return 0, or -1 (logged) when 16 workers are watched already. Thread-safe. */
int ps_amguard_watch(ucp_worker_h w);

/** @brief Stop checking the messages to worker @p w (about to be destroyed). Thread-safe. */
void ps_amguard_unwatch(ucp_worker_h w);

/** @brief The handler UCP registers for its message id @p id (UCP 1.13's ucp_am_handlers[]):
 *  amguard's wrapper once installed; NULL when there is none. For tests. */
uct_am_callback_t ps_amguard_handler(unsigned id);

/** @brief Messages refused by the checks so far in this process (each logged too, the first
 *  ones at warn level). */
uint64_t ps_amguard_refused(void);

#endif
