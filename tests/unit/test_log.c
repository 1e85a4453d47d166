/* test_log.c: ps_log_write (common/log.c), and the error codes' names (common/error.c). */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps/ps_error.h"
#include "ps/ps_log.h"

/* One line per call, whatever the message quotes: a newline and an escape sequence in a text
 * a peer chose (a tensor name) are shown as '?', so no forged line or terminal control reaches
 * the log (before, the newline started a line of the peer's making; found by a review). */
START_TEST(one_line_per_call)
{
    char path[] = "/tmp/test_log.XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    int saved = dup(2);
    ck_assert_int_eq(dup2(fd, 2), 2);
    PS_LOG(PS_LOG_ERROR, "test", "name 'a\n00:00:00.000 error server FORGED\x1b[2J'");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char buf[512] = "";
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    close(fd);
    unlink(path);
    ck_assert_int_gt(n, 0);
    buf[n] = '\0';
    ck_assert_msg(strchr(buf, '\n') == buf + n - 1, "not one line: %s", buf);
    ck_assert_msg(strstr(buf, "name 'a?00:00:00.000 error server FORGED?[2J'\n"), "%s", buf);
}
END_TEST

/* A PS_E* code has its name, a plain -errno (a file's open passes one on) errno's own: bindings
 * branch on it (psd.PsError.name; before, "UNKNOWN" for -EACCES, a review, session 71). */
START_TEST(error_names)
{
    ck_assert_str_eq(ps_err_name(PS_EPROTO), "EPROTO");
    ck_assert_str_eq(ps_err_name(-EACCES), "EACCES");
    ck_assert_str_eq(ps_err_name(-ENOTDIR), "ENOTDIR");
    ck_assert_str_eq(ps_err_name(-ENAMETOOLONG), "ENAMETOOLONG");
    ck_assert_str_eq(ps_err_name(-99999), "UNKNOWN");
    ck_assert_str_eq(ps_err_name(7), "UNKNOWN");
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("log");
    TCase *tc = tcase_create("log");
    tcase_add_test(tc, one_line_per_call);
    tcase_add_test(tc, error_names);
    suite_add_tcase(s, tc);
    return s;
}
