/* batches.h: the coordinator's hand-out of the training set in batches.
 *
 * Each pass (data epoch) over the n training samples follows its own seeded
 * permutation; a batch is a range [offset, offset + count) of one pass's
 * permutation. The cursor hands out fresh ranges in order, but first any batch
 * given back (its worker died before the batch was applied), so every sample of
 * a pass goes into exactly one applied gradient. The coordinator (server/coord.c)
 * and the single-process reference (worker/local.c) share this code, so a
 * cluster with stable membership trains on exactly the reference's batches. */
#ifndef PS_BATCHES_H
#define PS_BATCHES_H

#include <stdbool.h>
#include <stdint.h>

/* Batches waiting to be handed out again. Never full: a fresh range goes out only while the
 * queue is empty (ps_cursor_take), so the batches out at once (held by members, queued, or
 * counted at a restart of shard 0 and given back later) never outnumber those out when the last
 * fresh range went: one held per rank plus one per member of the step a restart closed, at most
 * 2 x PS_MAX_RANKS (128). */
#define PS_REHAND_MAX 256
#define PS_REPLAY_MAX 16  /* replay tag words a batch carries (its last departures mid-step) */

/* Replay tags (ps_batch_t.replay, ps_msg_t.replay): the steps and ranks that had a batch and
 * left it mid-step. A word is one tag, step << PS_REPLAY_RANK_BITS | rank (asp and ssp: step 0,
 * only the rank counts), or, with PS_REPLAY_MERGED set, the first of two: that step, then the
 * bitmap of every rank that had the batch at that step (ps_batch_tag merges the departures of
 * one step so; ps_replay_next reads both kinds). Steps stay below 2^57. */
#define PS_REPLAY_RANK_BITS 6
#define PS_REPLAY_MERGED (1ull << 63)
#define PS_REPLAY_TAG(step, rank) ((uint64_t)(step) << PS_REPLAY_RANK_BITS | (uint64_t)(rank))
#define PS_REPLAY_STEP(tag) (((tag) & ~PS_REPLAY_MERGED) >> PS_REPLAY_RANK_BITS)
#define PS_REPLAY_RANK(tag) ((uint32_t)((tag) & 63))

/** @brief The next tag of the @p n words @p tags from word *@p i (advanced past it): its step
 *  and the ranks it names (one, or a merged tag's bitmap; a merged word without its bitmap, as
 *  a peer could send, names its rank bits' rank). @return false past the last. */
static inline bool ps_replay_next(const uint64_t *tags, uint32_t n, uint32_t *i, uint64_t *step,
                                  uint64_t *ranks)
{
    if (*i >= n) return false;
    uint64_t t = tags[(*i)++];
    *step = PS_REPLAY_STEP(t);
    *ranks = (t & PS_REPLAY_MERGED) && *i < n ? tags[(*i)++] : 1ull << PS_REPLAY_RANK(t);
    return true;
}
#define PS_PASS_RING 64   /* passes whose applied counts are kept */

typedef struct {
    uint64_t pass;    /* data epoch */
    uint64_t offset;  /* first position in that pass's permutation */
    uint32_t count;   /* samples, >= 1 */
    /* bsp: the batch was handed out before, to members that left in the middle of its step
     * (PS_REPLAY_TAG words, oldest first, a step's departures merged): a chunk that applied
     * such a step with such a rank's push has the batch already (server/push.c). */
    uint32_t nreplay;
    uint64_t replay[PS_REPLAY_MAX];
    uint32_t left; /* workers that had it (a batch reply) and left before it was applied */
} ps_batch_t;

/* Plain data (stored as is by the coordinator, up to rehand[nrehand]): no pointers. */
typedef struct {
    uint64_t n;                 /* training-set size, 0 until known */
    uint32_t batch;             /* samples per batch */
    uint64_t passes;            /* the job's epochs: the cursor is exhausted at pass == passes */
    uint64_t pass, offset;      /* the next fresh sample */
    uint32_t nrehand;
    uint64_t applied[PS_PASS_RING]; /* samples applied, pass p at [p % PS_PASS_RING] */
    uint64_t applied_total;
    uint64_t handed_again;      /* batches given back and handed out again */
    ps_batch_t rehand[PS_REHAND_MAX]; /* last: a stored state ends after the queued ones */
} ps_cursor_t;

/** @brief A batch's key: (pass, offset) packed, + 1 so that 0 means none; 0 also when they do not
 *  fit (pass >= 2^23 or offset >= 2^40). A batch handed out again keeps its key. */
static inline uint64_t ps_batch_key(uint64_t pass, uint64_t offset)
{
    return pass < (1ull << 23) && offset < (1ull << 40) ? (pass << 40 | offset) + 1 : 0;
}

/** @brief A cursor over @p passes passes of @p n samples in batches of @p batch. */
void ps_cursor_init(ps_cursor_t *c, uint64_t n, uint32_t batch, uint64_t passes);

/**
 * @brief Take the next batch: a given-back one first, else the next fresh range
 * (a pass's last batch may be short; a batch never spans two passes).
 * @return true with *out set, false when nothing is left to hand out.
 */
bool ps_cursor_take(ps_cursor_t *c, ps_batch_t *out);

/** @brief Give back a batch that was handed out but never applied.
 *  @return 0, or -1 when the re-hand queue is full (the batch is lost; logged by callers). */
int ps_cursor_give_back(ps_cursor_t *c, const ps_batch_t *b);

/** @brief Add replay tag @p tag (PS_REPLAY_TAG) to @p b: into its tag of the same step (a
 *  single one becomes a merged pair), else as a new one, dropping its oldest tags while the
 *  words would be more than PS_REPLAY_MAX. Any number of departures in one step take at most
 *  two words. @return 1 when a tag was dropped, else 0. */
int ps_batch_tag(ps_batch_t *b, uint64_t tag);
/** @brief Count @p b as applied (its gradient is in a committed step). */
void ps_cursor_applied(ps_cursor_t *c, const ps_batch_t *b);

/** @brief Take back ps_cursor_applied(@p b): it was counted before its step was known to be
 *  applied everywhere, and it is handed out again. */
void ps_cursor_unapplied(ps_cursor_t *c, const ps_batch_t *b);

/** @brief Samples of pass @p pass applied so far (0 for passes out of the ring). */
uint64_t ps_cursor_pass_applied(const ps_cursor_t *c, uint64_t pass);

/** @brief True when every fresh range was handed out and nothing waits to go again. */
bool ps_cursor_exhausted(const ps_cursor_t *c);

/** @brief Steps of a run with @p workers workers that each take one batch a step:
 *  ceil(passes * n / (workers * batch)). */
uint64_t ps_cursor_planned_steps(uint64_t n, uint32_t batch, uint64_t passes, uint32_t workers);

#endif
