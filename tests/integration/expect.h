/* expect.h: assertions and fixtures shared by the integration suites (Check, cluster.h).
 * Every wait is generous and only bounds a hang; nothing asserts a timing. */
#ifndef PS_TEST_EXPECT_H
#define PS_TEST_EXPECT_H

#include <check.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "jsoncheck.h"

/* Upper bounds for one wait; a test's budget (CL_BUDGET_S) caps them all. */
#define READY_S 30.0 /* psd: listening */
#define RUN_S 45.0   /* a worker's whole run, a psd's exit */

#define EXPECT_EXIT(p, code)                                                                       \
    do {                                                                                           \
        int st_ = cl_wait((p), RUN_S);                                                             \
        ck_assert_msg(st_ == (code),                                                               \
                      "%s exited with status %d, want %d (-1: still running at the deadline); "    \
                      "its log: %s",                                                               \
                      (p)->name, st_, (code), cl_tail(p));                                         \
    } while (0)

#define EXPECT_LOG(p, needle)                                                                      \
    do {                                                                                           \
        char *log_ = cl_log(p);                                                                    \
        int has_ = strstr(log_, (needle)) != NULL;                                                 \
        free(log_);                                                                                \
        ck_assert_msg(has_, "%s's log lacks \"%s\"; its log: %s", (p)->name, (needle),             \
                      cl_tail(p));                                                                 \
    } while (0)

/* @p text[@p len] is one JSON value by RFC 8259 (jsoncheck.h: link jsoncheck.c); @p what names
 * where it came from. */
#define EXPECT_JSON(text, len, what)                                                               \
    do {                                                                                           \
        const char *why_ = jc_invalid((text), (len));                                              \
        ck_assert_msg(why_ == NULL, "%s is not valid JSON: %s", (what), why_);                     \
    } while (0)

/* How many times @p needle occurs in @p p's log. */
static inline int count_in_log(const cl_proc_t *p, const char *needle)
{
    char *log = cl_log(p);
    int n = 0;
    for (const char *s = log; (s = strstr(s, needle)) != NULL; s += strlen(needle))
        n++;
    free(log);
    return n;
}

/* SIGTERM each psd; each must finish and exit 0. */
static inline void stop_all(cl_proc_t **psd, int n)
{
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(cl_signal(psd[i], SIGTERM), 0);
    for (int i = 0; i < n; i++)
        EXPECT_EXIT(psd[i], 0);
}

static inline void expect_same_params(const char *a, const char *b, double rtol, double atol)
{
    char why[512];
    int rc = cl_params_compare_files(a, b, rtol, atol, why, sizeof why);
    ck_assert_msg(rc == 0, "%s vs %s: %s", a, b, why);
}

/* One test per TCase, with the parent-side fixture that removes the temp dirs. */
static inline TCase *tcase(const char *name, const TTest *t)
{
    TCase *tc = tcase_create(name);
    tcase_add_unchecked_fixture(tc, cl_base_setup, cl_base_teardown);
    /* Only a backstop: each test bounds its own waits by CL_BUDGET_S. */
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, t);
    return tc;
}

#endif
