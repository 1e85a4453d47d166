/* test_memberviews.c: the membership views a psd shard keeps and which one decides a step
 * (server/memberviews.h). */
#include <check.h>

#include "memberviews.h"

/* Learn a view as psd_shard_learn_view does for a new epoch; @p low is the lowest chunk's step.
 * Returns 0 when the table had no room for it. */
static int learn(psd_views_t *t, uint64_t epoch, uint64_t from, uint64_t members, bool closed,
                 uint64_t low)
{
    psd_view_t nv = {epoch, from, members, closed};
    psd_view_t *v = psd_views_slot(t, &nv, low);
    if (v == NULL) return 0;
    *v = nv;
    return 1;
}

START_TEST(newest_covering_decides)
{
    psd_views_t t = {0};
    ck_assert_ptr_null(psd_views_of(&t, 0));
    ck_assert_uint_eq(psd_views_epoch(&t), 0);
    learn(&t, 1, 0, 0x3, false, 0);
    learn(&t, 2, 5, 0x1, false, 0);
    learn(&t, 3, 4, 0x2, true, 0); /* a closed view: step 4 only */
    ck_assert_uint_eq(psd_views_of(&t, 3)->members, 0x3);
    ck_assert_uint_eq(psd_views_of(&t, 4)->members, 0x2);
    ck_assert_uint_eq(psd_views_of(&t, 5)->members, 0x1);
    ck_assert_uint_eq(psd_views_of(&t, 100)->members, 0x1);
    ck_assert_uint_eq(psd_views_epoch(&t), 3);
    ck_assert_ptr_eq(psd_views_find(&t, 2), psd_views_of(&t, 5));
    ck_assert_ptr_null(psd_views_find(&t, 9));
}
END_TEST

/* The case the eviction rule is for: a closed view of step 4, which a chunk lagging at step 4
 * waits for (retold after a restart of the coordinator), then many membership changes from
 * step 5 on (workers joining one by one). The closed view must outlive them; the open views
 * that newer ones cover from step 4 on go instead. Before, the oldest epoch went: the closed
 * view was forgotten after PSD_VIEWS newer ones and the chunk waited for good. */
START_TEST(needed_closed_view_survives_many_changes)
{
    psd_views_t t = {0};
    learn(&t, 10, 4, 0x1, true, 4);
    for (uint64_t e = 11; e < 11 + 4 * PSD_VIEWS; e++)
        ck_assert_int_eq(learn(&t, e, 5, 0x3, false, 4), 1);
    ck_assert_uint_eq(t.n, PSD_VIEWS);
    const psd_view_t *v = psd_views_of(&t, 4);
    ck_assert_ptr_nonnull(v);
    ck_assert_uint_eq(v->epoch, 10);
    ck_assert(v->closed);
    ck_assert_uint_eq(psd_views_of(&t, 5)->epoch, 10 + 4 * PSD_VIEWS);
    ck_assert_uint_eq(psd_views_epoch(&t), 10 + 4 * PSD_VIEWS);
}
END_TEST

/* Once every chunk is past the closed view's step, it is dead and goes first. */
START_TEST(passed_closed_view_goes)
{
    psd_views_t t = {0};
    learn(&t, 10, 4, 0x1, true, 4);
    for (uint64_t e = 11; e < 11 + PSD_VIEWS - 1; e++) learn(&t, e, 5, 0x3, false, 4);
    ck_assert_uint_eq(t.n, PSD_VIEWS);
    ck_assert(psd_views_dead(&t, 0, 5));
    ck_assert(!psd_views_dead(&t, 0, 4));
    ck_assert_int_eq(learn(&t, 40, 6, 0x7, false, 5), 1);
    ck_assert_ptr_null(psd_views_find(&t, 10));
    ck_assert_ptr_nonnull(psd_views_find(&t, 11)); /* dead too, but the closed one went first */
}
END_TEST

/* An open view is dead only where a newer open view covers every step from the lowest chunk's
 * on: with a chunk still at step 3, epoch 1 (from 0) decides step 3 while epoch 2 starts at 5. */
START_TEST(open_view_needed_below_newer_ones)
{
    psd_views_t t = {0};
    learn(&t, 1, 0, 0x3, false, 0);
    learn(&t, 2, 5, 0x1, false, 0);
    ck_assert(!psd_views_dead(&t, 0, 3));
    ck_assert(psd_views_dead(&t, 0, 5));
    ck_assert(!psd_views_dead(&t, 1, 100)); /* the newest never */
    /* Views of the same start: the newer one decides every step the older one covers, even
     * with a chunk below them both. */
    learn(&t, 4, 5, 0x3, false, 0);
    ck_assert(psd_views_dead(&t, 1, 0));
    /* A newer closed view covers one step only: it makes no open view dead. */
    learn(&t, 3, 3, 0x2, true, 0);
    ck_assert(!psd_views_dead(&t, 0, 3));
}
END_TEST

/* Every view still needed (chunks lagging at each of PSD_VIEWS closed steps): the oldest epoch
 * goes for a newer view, and an older view than all of them is not kept; nor is a late
 * retelling of a view that would be dead on arrival (it would push out a needed one for
 * nothing): an open view a newer one covers, a closed one of a step every chunk passed. */
START_TEST(all_needed_oldest_goes)
{
    psd_views_t t = {0};
    for (uint64_t e = 1; e <= PSD_VIEWS; e++) learn(&t, 10 + 2 * e, e, 0x1, true, 1);
    ck_assert_int_eq(learn(&t, 5, 50, 0x1, true, 1), 0);
    ck_assert_ptr_null(psd_views_find(&t, 5));
    ck_assert_int_eq(learn(&t, 43, 1, 0x3, false, 1), 1); /* open from step 1: needed */
    ck_assert_ptr_null(psd_views_find(&t, 12));
    ck_assert_int_eq(learn(&t, 41, 1, 0x3, false, 1), 0); /* 43 covers it */
    ck_assert_int_eq(learn(&t, 100, 0, 0x1, true, 1), 0); /* closed, step 0 < 1 */
    ck_assert_ptr_nonnull(psd_views_find(&t, 14));
    ck_assert_int_eq(learn(&t, 100, 50, 0x1, false, 1), 1);
    ck_assert_ptr_null(psd_views_find(&t, 14));
    ck_assert_ptr_nonnull(psd_views_find(&t, 16));
    ck_assert_uint_eq(psd_views_of(&t, 1)->epoch, 43); /* step 1's closed view went */
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("memberviews");
    TCase *tc = tcase_create("memberviews");
    tcase_add_test(tc, newest_covering_decides);
    tcase_add_test(tc, needed_closed_view_survives_many_changes);
    tcase_add_test(tc, passed_closed_view_goes);
    tcase_add_test(tc, open_view_needed_below_newer_ones);
    tcase_add_test(tc, all_needed_oldest_goes);
    suite_add_tcase(s, tc);
    return s;
}
