/* test_fanout.c: the apply jobs' fan-out (server/fanout.h): every item of a batch runs exactly
 * once whatever the thread count, batches follow each other on the same helpers, and the
 * items of one batch really run at once on different threads. */
#include <check.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "fanout.h"

typedef struct {
    unsigned count[128];
    pthread_t who[128];
} tally_t;

static void count_item(void *arg, size_t i)
{
    tally_t *t = arg;
    __atomic_fetch_add(&t->count[i], 1, __ATOMIC_RELAXED);
    t->who[i] = pthread_self();
}

START_TEST(every_item_once)
{
    for (unsigned threads = 1; threads <= 4; threads++) {
        psd_fanout_t f;
        ck_assert_int_eq(psd_fanout_init(&f, threads), 0);
        ck_assert_uint_eq(f.nthreads, threads);
        for (int batch = 0; batch < 200; batch++) {
            size_t n = (size_t)(batch * 7) % 129;
            tally_t t;
            memset(&t, 0, sizeof t);
            psd_fanout_run(&f, n, count_item, &t);
            for (size_t i = 0; i < 128; i++)
                ck_assert_msg(t.count[i] == (i < n), "threads %u batch %d: item %zu ran %u times",
                              threads, batch, i, t.count[i]);
        }
        psd_fanout_close(&f);
        psd_fanout_close(&f); /* idempotent */
    }
}
END_TEST

/* Two items that each wait until the other has started: done only if they run at once. */
typedef struct {
    int started[2];
    int saw_other[2];
} meet_t;

static void meet_item(void *arg, size_t i)
{
    meet_t *m = arg;
    __atomic_store_n(&m->started[i], 1, __ATOMIC_RELEASE);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        if (__atomic_load_n(&m->started[1 - i], __ATOMIC_ACQUIRE)) {
            m->saw_other[i] = 1;
            return;
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (t.tv_sec - t0.tv_sec < 20); /* a bound, not a measurement: never reached if it works */
}

START_TEST(items_run_at_once)
{
    psd_fanout_t f;
    ck_assert_int_eq(psd_fanout_init(&f, 2), 0);
    for (int rep = 0; rep < 20; rep++) {
        meet_t m;
        memset(&m, 0, sizeof m);
        psd_fanout_run(&f, 2, meet_item, &m);
        ck_assert_msg(m.saw_other[0] && m.saw_other[1], "batch %d: the two items did not overlap",
                      rep);
    }
    psd_fanout_close(&f);
}
END_TEST

START_TEST(single_thread_runs_on_caller)
{
    psd_fanout_t f;
    ck_assert_int_eq(psd_fanout_init(&f, 1), 0);
    tally_t t;
    memset(&t, 0, sizeof t);
    psd_fanout_run(&f, 50, count_item, &t);
    for (size_t i = 0; i < 50; i++) {
        ck_assert_uint_eq(t.count[i], 1);
        ck_assert(pthread_equal(t.who[i], pthread_self()));
    }
    psd_fanout_close(&f);
}
END_TEST

START_TEST(thread_counts)
{
    ck_assert_uint_eq(psd_fanout_threads(3), 3);
    unsigned d = psd_fanout_threads(0);
    ck_assert(d >= 1 && d <= 8);
    psd_fanout_t f;
    ck_assert_int_ne(psd_fanout_init(&f, PSD_FANOUT_MAX_THREADS + 1), 0);
    psd_fanout_close(NULL);
    unsigned t;
    char err[128];
    unsetenv("PS_APPLY_THREADS");
    ck_assert_int_eq(psd_fanout_threads_env(5, &t, err, sizeof err), 0);
    ck_assert_uint_eq(t, 5);
    setenv("PS_APPLY_THREADS", "2", 1);
    ck_assert_int_eq(psd_fanout_threads_env(5, &t, err, sizeof err), 0);
    ck_assert_uint_eq(t, 2);
    setenv("PS_APPLY_THREADS", "2x", 1);
    ck_assert_int_ne(psd_fanout_threads_env(5, &t, err, sizeof err), 0);
    ck_assert_str_eq(err, "PS_APPLY_THREADS: must be a number in [0, 64], got '2x'");
    unsetenv("PS_APPLY_THREADS");
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("fanout");
    TCase *tc = tcase_create("fanout");
    tcase_add_test(tc, every_item_once);
    tcase_add_test(tc, items_run_at_once);
    tcase_add_test(tc, single_thread_runs_on_caller);
    tcase_add_test(tc, thread_counts);
    suite_add_tcase(s, tc);
    return s;
}
