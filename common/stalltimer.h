/* stalltimer.h: the timeout of a wait on a libuv loop that does not count the spells in which
 * its own process did not run (stopped by SIGSTOP or Ctrl-Z, or given no CPU). An answer may
 * have come meanwhile and wait unread in the transport; after such a spell the loop runs its
 * due timers before it reads, and the timeout said "no answer" for the waiter's own stop (a
 * helper's probe, session 52: psctl checkpoint stopped between two arms blamed a shard).
 * A tick of the same loop, every few milliseconds while the wait lasts, sees the spell as a gap
 * between two ticks and moves the timeout by it. Ticks were due before a timeout that comes
 * due in the same turn, so libuv runs them first and the timeout moves before it can fire.
 * Loop thread only. */
#ifndef PS_STALLTIMER_H
#define PS_STALLTIMER_H

#include <stdint.h>
#include <uv.h>

/* A gap between two ticks longer than this counts as a spell the process did not run. */
#define PS_STALL_MS 200

typedef struct {
    uv_timer_t *timer; /* the timeout (borrowed: the caller's, initialized on the loop) */
    uv_timer_cb cb;    /* its callback */
    uint64_t due_ms;   /* the loop's time at which it fires */
    uint64_t seen_ms;  /* the loop's time of the start or the last tick */
} ps_stalltimer_t;

/** @brief Start @p timer (callback @p cb) to fire @p ms after the loop's time now. */
static inline void ps_stalltimer_start(ps_stalltimer_t *t, uv_timer_t *timer, uv_timer_cb cb,
                                       uint64_t ms)
{
    t->timer = timer;
    t->cb = cb;
    t->seen_ms = uv_now(timer->loop);
    t->due_ms = t->seen_ms + ms;
    uv_timer_start(timer, cb, ms, 0);
}

/** @brief From the wait's tick: a gap over PS_STALL_MS since the last one (or the start) moves
 *  the timeout, while it is still pending, by the gap. */
static inline void ps_stalltimer_tick(ps_stalltimer_t *t)
{
    uint64_t now = uv_now(t->timer->loop);
    if (now - t->seen_ms > PS_STALL_MS && uv_is_active((uv_handle_t *)t->timer)) {
        t->due_ms += now - t->seen_ms;
        uv_timer_start(t->timer, t->cb, t->due_ms > now ? t->due_ms - now : 0, 0);
    }
    t->seen_ms = now;
}

#endif
