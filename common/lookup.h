/* lookup.h: a host name looked up on a detached thread of its own, so that no caller waits for
 * DNS longer than it chooses to (libps's reconnects, the operator tools' requests). */
#ifndef PS_LOOKUP_H
#define PS_LOOKUP_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

typedef struct ps_lookup_s ps_lookup_t;

/**
 * @brief Look @p host : @p port up (IPv4, as psd listens: ps_sockaddr_resolve) on a detached
 *  thread that has the signals of @p block (NULL: none more than the caller's) blocked.
 * @param notify when not NULL: called on that thread once the lookup ended, with @p arg, unless
 *  the job was abandoned first (under the job's lock: ps_lookup_abandon waits for it to return).
 * @return the job, the caller's until ps_lookup_take or ps_lookup_abandon; NULL when there is no
 *  memory or no thread for it (errno set).
 */
ps_lookup_t *ps_lookup_start(const char *host, uint16_t port, const sigset_t *block,
                             void (*notify)(void *), void *arg);

/** @brief Whether @p l ended, waiting up to @p ms milliseconds for it (0: only look). */
bool ps_lookup_wait(ps_lookup_t *l, unsigned ms);

/**
 * @brief The result of a lookup that ended (ps_lookup_wait said so): getaddrinfo's status, and
 *  on 0 the first address in @p ss (@p len 0 when it does not fit). Frees @p l.
 */
int ps_lookup_take(ps_lookup_t *l, struct sockaddr_storage *ss, socklen_t *len);

/** @brief Give @p l up (NULL: no-op): freed here if it ended, else by its thread when it does;
 *  its notify is not called after this returns. */
void ps_lookup_abandon(ps_lookup_t *l);

#endif
