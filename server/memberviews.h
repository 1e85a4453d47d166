/* memberviews.h: the membership views a psd shard knows (bsp), and which one decides a step.
 *
 * Shard 0's coordinator makes a view at each change of a bsp job's members: epoch `epoch`,
 * from step `from_step` on, the ranks in `members` take part, until a higher epoch takes over;
 * a closed view (PS_FLAG_CLOSED, a step a restart of the coordinator closed) covers its own
 * step only. The other shards learn views from pushes and MSG_EPOCH. A chunk at step s is
 * complete once every member of the newest view covering s pushed it (psd_views_of).
 *
 * The table holds PSD_VIEWS views. A new one takes, in this order: a free slot; the slot of a
 * view no chunk can look up any more (a closed view of a step every chunk has passed, or an
 * open view that a newer open view covers at every step from the lowest chunk's on); else the
 * oldest epoch's slot, when the new one is newer. So a view a lagging chunk still needs (a closed
 * view retold after a restart) survives any number of newer membership changes, unless
 * PSD_VIEWS views are all still needed.
 *
 * Plain data, no locks: a shard touches it on its loop thread only. */
#ifndef PSD_MEMBERVIEWS_H
#define PSD_MEMBERVIEWS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PSD_VIEWS 16 /* membership epochs a shard remembers */

typedef struct {
    uint64_t epoch, from_step, members;
    bool closed; /* of a step the coordinator closed: covers from_step only */
} psd_view_t;

/* The known views, in no order; zero it to start. */
typedef struct {
    psd_view_t v[PSD_VIEWS];
    uint32_t n;
} psd_views_t;

/** @brief The newest view that covers step @p step (a closed one only its own step), or NULL.
 *  The pointer is into @p t, valid until the next change. */
static inline const psd_view_t *psd_views_of(const psd_views_t *t, uint64_t step)
{
    const psd_view_t *best = NULL;
    for (uint32_t i = 0; i < t->n; i++) {
        const psd_view_t *v = &t->v[i];
        if (v->closed ? v->from_step != step : v->from_step > step) continue;
        if (best == NULL || v->epoch > best->epoch) best = v;
    }
    return best;
}

/** @brief The highest epoch known, 0 before the first view. */
static inline uint64_t psd_views_epoch(const psd_views_t *t)
{
    uint64_t e = 0;
    for (uint32_t i = 0; i < t->n; i++)
        if (t->v[i].epoch > e) e = t->v[i].epoch;
    return e;
}

/** @brief The view of epoch @p epoch, or NULL. */
static inline psd_view_t *psd_views_find(psd_views_t *t, uint64_t epoch)
{
    for (uint32_t i = 0; i < t->n; i++)
        if (t->v[i].epoch == epoch) return &t->v[i];
    return NULL;
}

/* Whether a lookup from step @p low on could never return view @p v (in @p t or not) because
 * of @p t's views: a closed view of a step below @p low, or an open view that a newer open
 * view of @p t covers wherever @p v covers a step from @p low on. */
static inline bool psd_views_covered(const psd_views_t *t, const psd_view_t *v, uint64_t low)
{
    if (v->closed) return v->from_step < low;
    uint64_t first = v->from_step > low ? v->from_step : low; /* the first step it may decide */
    for (uint32_t j = 0; j < t->n; j++) {
        const psd_view_t *w = &t->v[j];
        if (!w->closed && w->epoch > v->epoch && w->from_step <= first) return true;
    }
    return false;
}

/** @brief Whether psd_views_of(@p t, s) can return view @p i for no step s >= @p low
 *  (psd_views_covered). The newest view is never dead (psd_views_epoch reports it). */
static inline bool psd_views_dead(const psd_views_t *t, uint32_t i, uint64_t low)
{
    return t->v[i].epoch != psd_views_epoch(t) && psd_views_covered(t, &t->v[i], low);
}

/**
 * @brief Where the new view @p nv (an epoch @p t does not hold yet) goes in @p t: a free slot,
 *  else a dead one (psd_views_dead, with @p low the lowest step a chunk of this shard is at),
 *  else the oldest epoch's when @p nv is newer and would not be dead itself. @p low is read
 *  only when the table is full.
 * @return the slot (the caller fills it; a free one counted in t->n), or NULL: every view is
 *  still needed, and @p nv is older than all of them or would be dead on arrival (a late
 *  message retelling a view newer ones cover): it is not kept.
 */
static inline psd_view_t *psd_views_slot(psd_views_t *t, const psd_view_t *nv, uint64_t low)
{
    if (t->n < PSD_VIEWS) return &t->v[t->n++];
    uint32_t old = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        if (psd_views_dead(t, i, low)) return &t->v[i];
        if (t->v[i].epoch < t->v[old].epoch) old = i;
    }
    if (t->v[old].epoch > nv->epoch || psd_views_covered(t, nv, low)) return NULL;
    return &t->v[old];
}

#endif
