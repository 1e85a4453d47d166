/* views.h: the membership views a libps client keeps, and which one a push carries.
 *
 * The coordinator tells workers each change of a bsp job's members as a view: from step
 * `from` on, the ranks in the bit set `members` take part; `epoch` orders views. A client keeps
 * the last PS_VIEW_RING views it learnt, the newest last, and stamps every push with the newest
 * view that covers the push's step. Not simply the newest: a later step's view may have come
 * before a push's first send (a restarted coordinator's hello reply names the step after the
 * one the worker still pushes), and a shard takes a push's view as starting at the push's step,
 * so that view must never go on it (DESIGN-NOTES.md, Membership).
 *
 * Plain data, no locks: libps touches a ring on its comm thread only. */
#ifndef PS_VIEWS_H
#define PS_VIEWS_H

#include <stddef.h>
#include <stdint.h>

#define PS_VIEW_RING 8 /* views kept; a push's step is rarely more than one view behind */

/* A membership view: @c members (bit r: rank r) take part from step @c from on. */
typedef struct {
    uint64_t epoch, from, members;
} ps_view_t;

/* The last views learnt: v[(n - 1) % PS_VIEW_RING] is the newest. Zero it to start. */
typedef struct {
    ps_view_t v[PS_VIEW_RING];
    uint32_t n; /* views learnt so far (the ring holds the last PS_VIEW_RING of them) */
} ps_views_t;

/** @brief The newest view learnt (the highest epoch), or NULL before the first. The pointer
 *  is into @p r and stays valid until the next ps_views_learn. */
static inline const ps_view_t *ps_views_newest(const ps_views_t *r)
{
    return r->n ? &r->v[(r->n - 1) % PS_VIEW_RING] : NULL;
}

/** @brief Keep view (@p epoch, @p from, @p members) as the newest if its epoch is higher than
 *  the newest's (the oldest kept view drops out of a full ring). @return 1 if kept, 0 if it is
 *  not newer (an old or repeated view: nothing changes). */
static inline int ps_views_learn(ps_views_t *r, uint64_t epoch, uint64_t from, uint64_t members)
{
    const ps_view_t *v = ps_views_newest(r);
    if (v && epoch <= v->epoch) return 0;
    ps_view_t *k = &r->v[r->n++ % PS_VIEW_RING];
    k->epoch = epoch;
    k->from = from;
    k->members = members;
    return 1;
}

/** @brief The view a push of step @p step carries: the newest kept view whose @c from is at
 *  most @p step, or NULL when none is (every such view left the ring, or none was learnt; the
 *  caller then keeps what it carried before). The pointer is into @p r. */
static inline const ps_view_t *ps_views_for_step(const ps_views_t *r, uint64_t step)
{
    uint32_t kept = r->n < PS_VIEW_RING ? r->n : PS_VIEW_RING;
    for (uint32_t k = 0; k < kept; k++) {
        const ps_view_t *v = &r->v[(r->n - 1 - k) % PS_VIEW_RING]; /* newest first */
        if (v->from <= step) return v;
    }
    return NULL;
}

#endif
