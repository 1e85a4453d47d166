/* sigignored.h: whether a signal is ignored now: for a program that takes SIGINT, SIGTERM or
 * SIGHUP, one ignored at its start (nohup, a background job's SIGINT) stays ignored. UCX's own
 * SIGHUP handler is gone before main (ucx_loop.c), so this sees the start's disposition. */
#ifndef PS_SIGIGNORED_H
#define PS_SIGIGNORED_H

#include <signal.h>
#include <stdbool.h>

/** @brief Whether @p sig's disposition is SIG_IGN (false when it cannot be read). */
static inline bool ps_signal_ignored(int sig)
{
    struct sigaction now;
    return sigaction(sig, NULL, &now) == 0 && now.sa_handler == SIG_IGN;
}

#endif
