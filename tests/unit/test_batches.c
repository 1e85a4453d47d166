/* test_batches.c: the coordinator's hand-out of the training set (common/batches.c). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "batches.h"

/* Fresh ranges in order; a pass's last batch is short; batches never span passes; the cursor is
 * exhausted after `passes` passes. */
START_TEST(test_ranges_in_order)
{
    ps_cursor_t c;
    ps_cursor_init(&c, 10, 4, 2);
    static const ps_batch_t want[] = {{0, 0, 4}, {0, 4, 4}, {0, 8, 2},
                                      {1, 0, 4}, {1, 4, 4}, {1, 8, 2}};
    ps_batch_t b;
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        ck_assert(!ps_cursor_exhausted(&c));
        ck_assert(ps_cursor_take(&c, &b));
        ck_assert_uint_eq(b.pass, want[i].pass);
        ck_assert_uint_eq(b.offset, want[i].offset);
        ck_assert_uint_eq(b.count, want[i].count);
    }
    ck_assert(!ps_cursor_take(&c, &b));
    ck_assert(ps_cursor_exhausted(&c));
}
END_TEST

/* A batch given back goes out again before any fresh one, also after the passes ran out. */
START_TEST(test_given_back_first)
{
    ps_cursor_t c;
    ps_cursor_init(&c, 8, 4, 1);
    ps_batch_t a, b, x;
    ck_assert(ps_cursor_take(&c, &a));
    ck_assert(ps_cursor_take(&c, &b));
    ck_assert(ps_cursor_exhausted(&c));
    ck_assert_int_eq(ps_cursor_give_back(&c, &a), 0);
    ck_assert(!ps_cursor_exhausted(&c));
    ck_assert(ps_cursor_take(&c, &x));
    ck_assert(memcmp(&x, &a, sizeof x) == 0);
    ck_assert_uint_eq(c.handed_again, 1);
    ck_assert(ps_cursor_exhausted(&c));
}
END_TEST

/* Applied counts per pass: every sample once makes exactly n; the ring forgets old passes. */
START_TEST(test_applied_per_pass)
{
    ps_cursor_t c;
    ps_cursor_init(&c, 10, 3, 70);
    ps_batch_t b;
    while (ps_cursor_take(&c, &b)) ps_cursor_applied(&c, &b);
    ck_assert_uint_eq(c.applied_total, 700);
    for (uint64_t p = 70 - PS_PASS_RING + 1; p < 70; p++)
        ck_assert_uint_eq(ps_cursor_pass_applied(&c, p), 10);
    ck_assert_uint_eq(ps_cursor_pass_applied(&c, 0), 0); /* out of the ring */
}
END_TEST

/* A batch counted and then uncounted (a restarted coordinator's batch of a step not applied
 * everywhere after all, coord_steps.c) leaves the counts as they were, never below zero. */
START_TEST(test_unapplied)
{
    ps_cursor_t c;
    ps_cursor_init(&c, 10, 3, 2);
    ps_batch_t a, b;
    ck_assert(ps_cursor_take(&c, &a) && ps_cursor_take(&c, &b));
    ps_cursor_applied(&c, &a);
    ps_cursor_applied(&c, &b);
    ps_cursor_unapplied(&c, &b);
    ck_assert_uint_eq(c.applied_total, a.count);
    ck_assert_uint_eq(ps_cursor_pass_applied(&c, 0), a.count);
    ps_cursor_unapplied(&c, &a);
    ps_cursor_unapplied(&c, &a); /* once too often: clamped */
    ck_assert_uint_eq(c.applied_total, 0);
    ck_assert_uint_eq(ps_cursor_pass_applied(&c, 0), 0);
}
END_TEST

/* The re-hand queue is bounded and says so. */
START_TEST(test_give_back_full)
{
    ps_cursor_t *c = malloc(sizeof *c);
    ps_cursor_init(c, 1000000, 1, 1);
    ps_batch_t b = {0, 0, 1};
    for (int i = 0; i < PS_REHAND_MAX; i++) ck_assert_int_eq(ps_cursor_give_back(c, &b), 0);
    ck_assert_int_eq(ps_cursor_give_back(c, &b), -1);
    free(c);
}
END_TEST

/* A batch keeps its last PS_REPLAY_MAX replay tags, oldest first, through the re-hand queue. */
START_TEST(test_replay_tags)
{
    ps_cursor_t *c = malloc(sizeof *c);
    ps_cursor_init(c, 100, 10, 1);
    ps_batch_t b, x;
    ck_assert(ps_cursor_take(c, &b));
    ck_assert_uint_eq(b.nreplay, 0);
    for (uint64_t i = 0; i < PS_REPLAY_MAX; i++)
        ck_assert_int_eq(ps_batch_tag(&b, PS_REPLAY_TAG(10 + i, i)), 0);
    ck_assert_int_eq(ps_batch_tag(&b, PS_REPLAY_TAG(100, 5)), 1); /* full: the oldest goes */
    ck_assert_int_eq(ps_cursor_give_back(c, &b), 0);
    ck_assert(ps_cursor_take(c, &x));
    ck_assert_uint_eq(x.offset, b.offset);
    ck_assert_uint_eq(x.nreplay, PS_REPLAY_MAX);
    ck_assert_uint_eq(x.replay[0], PS_REPLAY_TAG(11, 1));
    ck_assert_uint_eq(x.replay[PS_REPLAY_MAX - 1], PS_REPLAY_TAG(100, 5));
    ck_assert(ps_cursor_take(c, &x));
    ck_assert_uint_eq(x.nreplay, 0); /* a fresh batch has none */
    free(c);
}
END_TEST

/* The tags of @p b as (step, ranks) pairs into @p step / @p ranks; returns how many. */
static int tags_of(const ps_batch_t *b, uint64_t *step, uint64_t *ranks)
{
    int n = 0;
    for (uint32_t i = 0; ps_replay_next(b->replay, b->nreplay, &i, &step[n], &ranks[n]);) n++;
    return n;
}

/* Departures at one step merge into one tag of two words, whatever their number: a batch
 * passed among 64 members of one step that each left keeps every one of them (before, it kept
 * the last 4, and a chunk that applied it with an earlier one's push applied it again). A tag
 * named already changes nothing; a single tag of a step that gets a second rank becomes a
 * pair, dropping the oldest tag when the words run out. A batch left by two members at each of
 * 8 steps keeps every tag (before session 50, 4 words: the first of 3 such steps went). */
START_TEST(test_replay_tags_merge)
{
    ps_batch_t b = {.count = 1};
    uint64_t step[PS_REPLAY_MAX], ranks[PS_REPLAY_MAX];
    for (uint32_t r = 0; r < 64; r++) ck_assert_int_eq(ps_batch_tag(&b, PS_REPLAY_TAG(7, r)), 0);
    ck_assert_uint_eq(b.nreplay, 2);
    ck_assert_int_eq(tags_of(&b, step, ranks), 1);
    ck_assert_uint_eq(step[0], 7);
    ck_assert_uint_eq(ranks[0], ~0ull);
    ck_assert_int_eq(ps_batch_tag(&b, PS_REPLAY_TAG(7, 9)), 0); /* named already */
    ck_assert_uint_eq(b.nreplay, 2);
    for (uint64_t s = 8; s < 8 + PS_REPLAY_MAX - 2; s++)
        ck_assert_int_eq(ps_batch_tag(&b, PS_REPLAY_TAG(s, 3)), 0);
    ck_assert_uint_eq(b.nreplay, PS_REPLAY_MAX);
    ck_assert_int_eq(ps_batch_tag(&b, PS_REPLAY_TAG(9, 3)), 0); /* named already */
    /* Step 8 gets a second rank: its single tag becomes a pair (1 word more than the words
     * allow): the oldest tag, step 7's pair, goes. */
    ck_assert_int_eq(ps_batch_tag(&b, PS_REPLAY_TAG(8, 5)), 1);
    int n = tags_of(&b, step, ranks);
    ck_assert_int_eq(n, PS_REPLAY_MAX - 2);
    ck_assert_uint_eq(step[0], 9);
    ck_assert_uint_eq(ranks[0], 1ull << 3);
    ck_assert_uint_eq(step[n - 1], 8);
    ck_assert_uint_eq(ranks[n - 1], 1ull << 3 | 1ull << 5);
    ck_assert_uint_eq(b.nreplay, PS_REPLAY_MAX - 1);
    /* Two members left it at each of 8 steps: 8 pairs, every one kept. */
    ps_batch_t e = {.count = 1};
    for (uint64_t s = 30; s < 30 + PS_REPLAY_MAX / 2; s++)
        for (uint32_t r = 1; r <= 2; r++)
            ck_assert_int_eq(ps_batch_tag(&e, PS_REPLAY_TAG(s, r)), 0);
    ck_assert_int_eq(tags_of(&e, step, ranks), PS_REPLAY_MAX / 2);
    ck_assert_uint_eq(step[0], 30);
    ck_assert_uint_eq(ranks[0], 6);
    /* asp / ssp tag at step 0: every rank in one tag. */
    ps_batch_t a = {.count = 1};
    for (uint32_t r = 10; r < 20; r++) ck_assert_int_eq(ps_batch_tag(&a, PS_REPLAY_TAG(0, r)), 0);
    ck_assert_int_eq(tags_of(&a, step, ranks), 1);
    ck_assert_uint_eq(ranks[0], 0x3FFull << 10);
    /* A merged word without its bitmap (as a peer could send) names its own rank bits. */
    uint64_t words[1] = {PS_REPLAY_MERGED | PS_REPLAY_TAG(5, 2)}, s, rk;
    uint32_t i = 0;
    ck_assert(ps_replay_next(words, 1, &i, &s, &rk));
    ck_assert_uint_eq(s, 5);
    ck_assert_uint_eq(rk, 1ull << 2);
    ck_assert(!ps_replay_next(words, 1, &i, &s, &rk));
}
END_TEST

START_TEST(test_planned_steps)
{
    ck_assert_uint_eq(ps_cursor_planned_steps(60000, 64, 10, 4), 2344); /* 600000 / 256 up */
    ck_assert_uint_eq(ps_cursor_planned_steps(10, 4, 2, 1), 5);
    ck_assert_uint_eq(ps_cursor_planned_steps(10, 4, 2, 0), 5); /* 0 workers counts as 1 */
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("batches");
    TCase *tc = tcase_create("cursor");
    tcase_add_test(tc, test_ranges_in_order);
    tcase_add_test(tc, test_given_back_first);
    tcase_add_test(tc, test_applied_per_pass);
    tcase_add_test(tc, test_unapplied);
    tcase_add_test(tc, test_give_back_full);
    tcase_add_test(tc, test_replay_tags);
    tcase_add_test(tc, test_replay_tags_merge);
    tcase_add_test(tc, test_planned_steps);
    suite_add_tcase(s, tc);
    return s;
}
