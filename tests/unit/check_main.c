/* check_main.c: shared main for the unit test executables; each one links a
 * test_<module>.c that defines ps_test_suite(), and may define ps_test_setup(). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

Suite *ps_test_suite(void);

/* Optional: adjust the runner (e.g. no fork: CUDA does not survive a fork after its start),
 * or return why the whole suite is skipped (TAP "1..0 # SKIP why"). */
const char *ps_test_setup(SRunner *sr) __attribute__((weak));

int main(void)
{
    SRunner *sr = srunner_create(ps_test_suite());
    const char *skip = ps_test_setup != NULL ? ps_test_setup(sr) : NULL;
    if (skip != NULL) {
        printf("1..0 # SKIP %s\n", skip);
        srunner_free(sr);
        return EXIT_SUCCESS;
    }
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
