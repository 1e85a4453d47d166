/* batches.c: see batches.h. */
#include "batches.h"

#include <string.h>

void ps_cursor_init(ps_cursor_t *c, uint64_t n, uint32_t batch, uint64_t passes)
{
    memset(c, 0, sizeof *c);
    c->n = n;
    c->batch = batch ? batch : 1;
    c->passes = passes;
}

bool ps_cursor_take(ps_cursor_t *c, ps_batch_t *out)
{
    if (c->nrehand > 0) {
        *out = c->rehand[0];
        memmove(c->rehand, c->rehand + 1, (c->nrehand - 1) * sizeof *c->rehand);
        c->nrehand--;
        c->handed_again++;
        return true;
    }
    if (c->n == 0 || c->pass >= c->passes) return false;
    uint64_t left = c->n - c->offset;
    *out = (ps_batch_t){.pass = c->pass, .offset = c->offset,
                        .count = (uint32_t)(left < c->batch ? left : c->batch)};
    c->offset += out->count;
    if (c->offset == c->n) {
        c->pass++;
        c->offset = 0;
        c->applied[c->pass % PS_PASS_RING] = 0; /* the slot of a pass 64 passes back */
    }
    return true;
}

int ps_cursor_give_back(ps_cursor_t *c, const ps_batch_t *b)
{
    if (c->nrehand == PS_REHAND_MAX) return -1;
    c->rehand[c->nrehand++] = *b;
    return 0;
}

/* Drop @p b's oldest tag (its first one or two words). */
static void drop_oldest_tag(ps_batch_t *b)
{
    uint32_t i = 0;
    uint64_t step, ranks;
    ps_replay_next(b->replay, b->nreplay, &i, &step, &ranks);
    memmove(b->replay, b->replay + i, (b->nreplay - i) * sizeof *b->replay);
    b->nreplay -= i;
}

int ps_batch_tag(ps_batch_t *b, uint64_t tag)
{
    uint64_t step = PS_REPLAY_STEP(tag), bit = 1ull << PS_REPLAY_RANK(tag), s, ranks;
    uint64_t words[2] = {tag & ~PS_REPLAY_MERGED, 0};
    uint32_t nwords = 1;
    for (uint32_t at = 0, i = 0; i < b->nreplay; at = i) {
        ps_replay_next(b->replay, b->nreplay, &i, &s, &ranks);
        if (s != step) continue;
        if (ranks & bit) return 0; /* named already */
        if (i - at == 2) {         /* a merged tag: one more rank */
            b->replay[at + 1] |= bit;
            return 0;
        }
        /* A single tag of that step: out, and back as a merged pair with this rank. */
        memmove(b->replay + at, b->replay + i, (b->nreplay - i) * sizeof *b->replay);
        b->nreplay -= i - at;
        words[0] = PS_REPLAY_MERGED | PS_REPLAY_TAG(step, 0);
        words[1] = ranks | bit;
        nwords = 2;
        break;
    }
    int dropped = 0;
    while (b->nreplay + nwords > PS_REPLAY_MAX) {
        drop_oldest_tag(b);
        dropped = 1;
    }
    for (uint32_t k = 0; k < nwords; k++) b->replay[b->nreplay++] = words[k];
    return dropped;
}

void ps_cursor_applied(ps_cursor_t *c, const ps_batch_t *b)
{
    c->applied[b->pass % PS_PASS_RING] += b->count;
    c->applied_total += b->count;
}

void ps_cursor_unapplied(ps_cursor_t *c, const ps_batch_t *b)
{
    uint64_t *p = &c->applied[b->pass % PS_PASS_RING];
    *p = *p >= b->count ? *p - b->count : 0;
    c->applied_total = c->applied_total >= b->count ? c->applied_total - b->count : 0;
}

uint64_t ps_cursor_pass_applied(const ps_cursor_t *c, uint64_t pass)
{
    if (pass > c->pass || c->pass - pass >= PS_PASS_RING) return 0;
    return c->applied[pass % PS_PASS_RING];
}

bool ps_cursor_exhausted(const ps_cursor_t *c)
{
    return c->nrehand == 0 && (c->n == 0 ? false : c->pass >= c->passes);
}

uint64_t ps_cursor_planned_steps(uint64_t n, uint32_t batch, uint64_t passes, uint32_t workers)
{
    uint64_t per_step = (uint64_t)batch * (workers ? workers : 1);
    return (passes * n + per_step - 1) / per_step;
}
