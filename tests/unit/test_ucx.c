/* test_ucx.c: which endpoints send data messages eagerly (ps_ucx_eager_below) and the
 * PS_EAGER_BYTES override. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "ucx_loop.h"

/* Copying transports only: eager under the size; anything else (RDMA), or lanes not yet
 * known: UCX's choice (0). */
START_TEST(eager_only_on_copying_lanes)
{
    ps_ucx_t u;
    memset(&u, 0, sizeof u);
    u.eager_below = PS_EAGER_BELOW;
    ck_assert_uint_eq(ps_ucx_eager_below(&u, "tcp"), PS_EAGER_BELOW);
    ck_assert_uint_eq(ps_ucx_eager_below(&u, "sysv,cma"), PS_EAGER_BELOW);
    ck_assert_uint_eq(ps_ucx_eager_below(&u, "posix,cma,tcp"), PS_EAGER_BELOW);
    ck_assert_uint_eq(ps_ucx_eager_below(&u, "rc_mlx5"), 0);
    ck_assert_uint_eq(ps_ucx_eager_below(&u, "sysv,cma,rc_verbs"), 0);
    ck_assert_uint_eq(ps_ucx_eager_below(&u, "tcpx"), 0);
    ck_assert_uint_eq(ps_ucx_eager_below(&u, "cuda_ipc,tcp"), 0);
    ck_assert_uint_eq(ps_ucx_eager_below(&u, ""), 0);
    ck_assert_uint_eq(ps_ucx_eager_below(&u, "unknown"), 0);
    ck_assert_uint_eq(ps_ucx_eager_flag(PS_EAGER_BELOW, PS_EAGER_BELOW - 1),
                      UCP_AM_SEND_FLAG_EAGER);
    ck_assert_uint_eq(ps_ucx_eager_flag(PS_EAGER_BELOW, PS_EAGER_BELOW), 0);
    ck_assert_uint_eq(ps_ucx_eager_flag(0, 1), 0);
}
END_TEST

static uint32_t eager_below_with(const char *env)
{
    if (env)
        setenv("PS_EAGER_BYTES", env, 1);
    else
        unsetenv("PS_EAGER_BYTES");
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ps_ucx_t u;
    ck_assert_int_eq(ps_ucx_init(&u, &loop), 0);
    uint32_t below = ps_ucx_eager_below(&u, "tcp");
    ps_ucx_close(&u);
    uv_run(&loop, UV_RUN_NOWAIT); /* the handles' close callbacks */
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    unsetenv("PS_EAGER_BYTES");
    return below;
}

/* PS_EAGER_BYTES sets the size (0: UCX decides); a value that is not a byte count is
 * ignored (with a warning). */
START_TEST(eager_bytes_env)
{
    ck_assert_uint_eq(eager_below_with(NULL), PS_EAGER_BELOW);
    ck_assert_uint_eq(eager_below_with("4096"), 4096);
    ck_assert_uint_eq(eager_below_with("0"), 0);
    ck_assert_uint_eq(eager_below_with("lots"), PS_EAGER_BELOW);
    ck_assert_uint_eq(eager_below_with("99999999999"), PS_EAGER_BELOW);
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("ucx");
    TCase *tc = tcase_create("eager");
    tcase_add_test(tc, eager_only_on_copying_lanes);
    tcase_add_test(tc, eager_bytes_env);
    suite_add_tcase(s, tc);
    return s;
}
