/* test_gothook.c: common/gothook.c sets a loaded library's slots of a function, those the
 * dynamic linker left writable (lazy binding's PLT slots) and those in its RELRO segment (the
 * GLOB_DAT slot of a function's address; every slot of a library linked with -z now, as Fedora
 * and RHEL build UCX), puts the RELRO pages back to read-only, and leaves other libraries alone.
 * The libraries are tests/unit/gotfix.c built twice. Each case runs in its own process: the
 * hooks of one must not reach the next, so check's fork mode is set here (CK_FORK=no in the
 * environment, as some runs use, would otherwise carry them over). */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gothook.h"

pid_t gotfix_lazy_call(void);
void *gotfix_lazy_addr(void);
pid_t gotfix_now_call(void);
void *gotfix_now_addr(void);

#define FAKE_PID 424242

static pid_t fake_getppid(void) { return FAKE_PID; }
static pid_t fake_getpgrp(void) { return FAKE_PID + 1; }

/* The fixtures call getppid (a PLT slot) and take getpgrp's address (a GLOB_DAT slot). */
static const ps_got_hook_t hooks[] = {{"getppid", (void *)fake_getppid},
                                      {"getpgrp", (void *)fake_getpgrp}};

/* Each page of the mappings of @p lib in /proc/self/maps with its permissions, one line per page
 * ("addr perms"), so that a mapping split by mprotect and merged again compares equal. */
static char *pages_of(const char *lib)
{
    FILE *f = fopen("/proc/self/maps", "r");
    ck_assert_ptr_nonnull(f);
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap), line[512];
    ck_assert_ptr_nonnull(out);
    out[0] = '\0';
    long page = sysconf(_SC_PAGESIZE);
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, lib) == NULL) continue;
        unsigned long lo, hi;
        char perms[8];
        ck_assert_int_eq(sscanf(line, "%lx-%lx %7s", &lo, &hi, perms), 3);
        for (unsigned long a = lo; a < hi; a += (unsigned long)page) {
            if (len + 64 > cap) {
                out = realloc(out, cap *= 2);
                ck_assert_ptr_nonnull(out);
            }
            len += (size_t)snprintf(out + len, cap - len, "%lx %s\n", a, perms);
        }
    }
    fclose(f);
    ck_assert_msg(len > 0, "%s is not mapped", lib);
    return out;
}

/* Hook getppid and getpgrp in @p lib only: its call of the one and its address of the other are
 * the hooks' after, the other library's stay libc's, and @p lib's pages keep their permissions. */
static void hook_one(const char *lib, pid_t (*call)(void), void *(*addr)(void),
                     pid_t (*other_call)(void), void *(*other_addr)(void))
{
    pid_t real = getppid();
    ck_assert_int_eq(call(), real);
    ck_assert_ptr_eq(addr(), (void *)&getpgrp);
    char *before = pages_of(lib);
    ck_assert_msg(strstr(before, " r--p") != NULL, "%s has no read-only pages", lib);
    const char *libs[] = {lib, NULL};
    char err[256] = "";
    int n = ps_got_hook(libs, hooks, 2, err, sizeof err);
    ck_assert_msg(n == 2, "%s: %d slots set, not 2 (%s)", lib, n, err);
    ck_assert_int_eq(call(), FAKE_PID);
    ck_assert_ptr_eq(addr(), (void *)fake_getpgrp);
    char *after = pages_of(lib);
    ck_assert_str_eq(after, before); /* the RELRO pages read-only again */
    ck_assert_int_eq(other_call(), real);
    ck_assert_ptr_eq(other_addr(), (void *)&getpgrp);
    ck_assert_int_eq(getppid(), real); /* the executable's own calls are not touched */
    free(before);
    free(after);
}

START_TEST(lazy_library_slots_set)
{
    hook_one("libgotfix_lazy", gotfix_lazy_call, gotfix_lazy_addr, gotfix_now_call,
             gotfix_now_addr);
}
END_TEST

START_TEST(relro_library_slots_set)
{
    hook_one("libgotfix_now", gotfix_now_call, gotfix_now_addr, gotfix_lazy_call,
             gotfix_lazy_addr);
}
END_TEST

/* A second hook over the first (libps's install runs once, but nothing breaks if not), and a
 * name no loaded object starts with: nothing set, no error. */
START_TEST(again_and_absent)
{
    const char *libs[] = {"libgotfix_now", NULL};
    char err[256] = "";
    ck_assert_int_eq(ps_got_hook(libs, hooks, 2, err, sizeof err), 2);
    ck_assert_int_eq(ps_got_hook(libs, hooks, 2, err, sizeof err), 2);
    ck_assert_int_eq(gotfix_now_call(), FAKE_PID);
    ck_assert_ptr_eq(gotfix_now_addr(), (void *)fake_getpgrp);
    const char *none[] = {"libno-such-object", NULL};
    ck_assert_int_eq(ps_got_hook(none, hooks, 2, err, sizeof err), 0);
    ps_got_hook_t other = {"no_such_function_here", (void *)fake_getppid};
    ck_assert_int_eq(ps_got_hook(libs, &other, 1, err, sizeof err), 0);
}
END_TEST

const char *ps_test_setup(SRunner *sr)
{
    srunner_set_fork_status(sr, CK_FORK);
    return NULL;
}

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("gothook");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, lazy_library_slots_set);
    tcase_add_test(tc, relro_library_slots_set);
    tcase_add_test(tc, again_and_absent);
    suite_add_tcase(s, tc);
    return s;
}
