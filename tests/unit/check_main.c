/* check_main.c: shared main for the unit test executables; each one links a
 * test_<module>.c that defines ps_test_suite(). */
#include <check.h>
#include <stdlib.h>

Suite *ps_test_suite(void);

int main(void)
{
    SRunner *sr = srunner_create(ps_test_suite());
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
