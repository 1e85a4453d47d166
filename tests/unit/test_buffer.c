/* test_buffer.c: ps_buffer_alloc, the memory for tensors that travel: zeroed, writable to its
 * last byte, 2 MiB-aligned and advised to huge pages from 1 MiB up, released by size. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps/ps_client.h"

#define MIB ((size_t)1 << 20)

/* Whether the mapping that holds @p p carries VM_HUGEPAGE ("hg" in smaps' VmFlags). */
static int advised_huge(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    ck_assert_ptr_nonnull(f);
    char line[512];
    int in = 0, hg = -1;
    uintptr_t a = (uintptr_t)p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            in = a >= lo && a < hi;
        else if (in && strncmp(line, "VmFlags:", 8) == 0) {
            hg = strstr(line, " hg") != NULL;
            break;
        }
    }
    fclose(f);
    ck_assert_int_ge(hg, 0); /* the mapping was found */
    return hg;
}

START_TEST(test_sizes_zeroed_writable)
{
    const size_t sizes[] = {0, 4, 4096, MIB - 4, MIB, 2 * MIB - 4, 2 * MIB, 2 * MIB + 4,
                           65 * MIB + 12};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        unsigned char *b = ps_buffer_alloc(n);
        ck_assert_msg(b != NULL, "%zu bytes", n);
        if (n >= MIB) ck_assert_msg(((uintptr_t)b & (2 * MIB - 1)) == 0, "%zu bytes", n);
        for (size_t j = 0; j < n; j += 4093) ck_assert_msg(b[j] == 0, "%zu bytes: byte %zu", n, j);
        if (n) {
            ck_assert_int_eq(b[n - 1], 0);
            memset(b, 0xa5, n); /* every byte is the caller's */
            ck_assert_int_eq(b[n - 1], 0xa5);
        }
        ps_buffer_free(b, n);
    }
    ck_assert_ptr_null(ps_buffer_alloc(SIZE_MAX)); /* refused, not wrapped to a small map */
    ck_assert_ptr_null(ps_buffer_alloc(SIZE_MAX - (1u << 20)));
    ps_buffer_free(NULL, 0);
    ps_buffer_free(NULL, 64 * MIB);
}
END_TEST

START_TEST(test_large_advised_huge)
{
    unsigned char *big = ps_buffer_alloc(8 * MIB);
    unsigned char *small = ps_buffer_alloc(MIB - 4);
    unsigned char *one = ps_buffer_alloc(MIB);
    ck_assert_ptr_nonnull(big);
    ck_assert_ptr_nonnull(small);
    ck_assert_ptr_nonnull(one);
    big[0] = small[0] = one[0] = 1;
    /* madvise(MADV_HUGEPAGE) is refused only by a kernel built without THP (whatever the
     * sysfs mode, the advice sticks to the mapping). */
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0) {
        ck_assert_msg(advised_huge(big), "the buffer is not advised to huge pages");
        ck_assert_msg(advised_huge(big + 8 * MIB - 1), "the advice does not cover its end");
        ck_assert_msg(advised_huge(one), "a 1 MiB buffer is not advised");
        ck_assert_msg(!advised_huge(small), "a buffer under 1 MiB is plain heap memory");
    } else {
        fprintf(stderr, "# no THP in this kernel: advice not checked\n");
    }
    ps_buffer_free(big, 8 * MIB);
    ps_buffer_free(small, MIB - 4);
    ps_buffer_free(one, MIB);
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("buffer");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_sizes_zeroed_writable);
    tcase_add_test(tc, test_large_advised_huge);
    suite_add_tcase(s, tc);
    return s;
}
