/* test_views.c: the membership views libps keeps and the one each push carries (views.h). */
#include <check.h>

#include "views.h"

START_TEST(empty)
{
    ps_views_t r = {0};
    ck_assert_ptr_null(ps_views_newest(&r));
    ck_assert_ptr_null(ps_views_for_step(&r, 0));
    ck_assert_ptr_null(ps_views_for_step(&r, UINT64_MAX));
}
END_TEST

/* Only a higher epoch is learnt: a view told again (every worker forwards what it learns, so
 * shards and peers repeat views) or an older one arriving late changes nothing. */
START_TEST(learns_newer_only)
{
    ps_views_t r = {0};
    ck_assert_int_eq(ps_views_learn(&r, 3, 10, 0x3), 1);
    ck_assert_int_eq(ps_views_learn(&r, 3, 12, 0x1), 0);
    ck_assert_int_eq(ps_views_learn(&r, 2, 8, 0x7), 0);
    ck_assert_uint_eq(r.n, 1);
    const ps_view_t *v = ps_views_newest(&r);
    ck_assert_uint_eq(v->epoch, 3);
    ck_assert_uint_eq(v->from, 10);
    ck_assert_uint_eq(v->members, 0x3);
    ck_assert_int_eq(ps_views_learn(&r, 4, 12, 0x1), 1);
    ck_assert_uint_eq(ps_views_newest(&r)->epoch, 4);
}
END_TEST

/* The case the rule is for: ranks 0 and 1 push step 6; rank 1 dies and the coordinator's view
 * of step 7 (rank 0 alone) reaches rank 0 before its push of step 6 first leaves (a restarted
 * coordinator's hello reply names step 7). That push must carry step 6's members: a shard
 * takes a push's view as starting at the push's step, and with {0} it would apply step 6
 * without rank 1's push. The newest view would be the wrong one here. */
START_TEST(push_carries_its_steps_view)
{
    ps_views_t r = {0};
    ps_views_learn(&r, 1, 0, 0x3); /* both from step 0 */
    ps_views_learn(&r, 2, 7, 0x1); /* rank 0 alone from step 7 */
    ck_assert_uint_eq(ps_views_newest(&r)->epoch, 2);
    const ps_view_t *v = ps_views_for_step(&r, 6);
    ck_assert_ptr_nonnull(v);
    ck_assert_uint_eq(v->epoch, 1);
    ck_assert_uint_eq(v->members, 0x3);
    ck_assert_uint_eq(ps_views_for_step(&r, 7)->epoch, 2);
    ck_assert_uint_eq(ps_views_for_step(&r, 1000)->epoch, 2);
    ck_assert_uint_eq(ps_views_for_step(&r, 0)->epoch, 1);
}
END_TEST

/* Epochs and steps need not move together: a restarted coordinator goes back to the step its
 * last committed state holds, so a view can name an earlier step than the one before it. The
 * newest covering view wins, not the one with the highest from. */
START_TEST(newest_covering_wins)
{
    ps_views_t r = {0};
    ps_views_learn(&r, 1, 5, 0x1);
    ps_views_learn(&r, 2, 9, 0x3);
    ps_views_learn(&r, 3, 6, 0x7);
    ck_assert_uint_eq(ps_views_for_step(&r, 5)->epoch, 1);
    ck_assert_uint_eq(ps_views_for_step(&r, 6)->epoch, 3);
    ck_assert_uint_eq(ps_views_for_step(&r, 9)->epoch, 3);
    ck_assert_ptr_null(ps_views_for_step(&r, 4));
}
END_TEST

/* The ring keeps the last PS_VIEW_RING views: older ones drop out, the newest stays newest
 * across the wrap, and a step only dropped views covered finds none. */
START_TEST(ring_wraps)
{
    ps_views_t r = {0};
    const uint32_t total = 3 * PS_VIEW_RING + 1;
    for (uint32_t i = 1; i <= total; i++) {
        ck_assert_int_eq(ps_views_learn(&r, i, 10ull * i, i), 1);
        ck_assert_uint_eq(ps_views_newest(&r)->epoch, i);
        /* every kept view is found at its own step and just before the next one's */
        uint32_t oldest = i > PS_VIEW_RING ? i - PS_VIEW_RING + 1 : 1;
        for (uint32_t e = oldest; e <= i; e++) {
            ck_assert_uint_eq(ps_views_for_step(&r, 10ull * e)->epoch, e);
            ck_assert_uint_eq(ps_views_for_step(&r, 10ull * e + 9)->epoch, e);
        }
        if (oldest > 1) ck_assert_ptr_null(ps_views_for_step(&r, 10ull * oldest - 1));
    }
    ck_assert_uint_eq(r.n, total);
    ck_assert_int_eq(ps_views_learn(&r, total, 0, 0), 0); /* old news after the wrap too */
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("views");
    TCase *tc = tcase_create("views");
    tcase_add_test(tc, empty);
    tcase_add_test(tc, learns_newer_only);
    tcase_add_test(tc, push_carries_its_steps_view);
    tcase_add_test(tc, newest_covering_wins);
    tcase_add_test(tc, ring_wraps);
    suite_add_tcase(s, tc);
    return s;
}
