/* test_ucx.c: which endpoints send data messages eagerly (ps_ucx_eager_below), which copy
 * rendezvous data themselves (ps_ucx_lanes_peer_reads), and the
 * PS_EAGER_BYTES override; the shared memory settings applied by default; the loop keeps
 * running while UCX cannot be armed (the test is linked with -Wl,--wrap=ucp_worker_arm, so it
 * decides what arming returns); a restarted worker is driven and released like the first; the
 * probe of a worker's shared-memory FIFO (ucxprobe.h) arrives, is not the owner's, and is told
 * by its nonce. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "ucx_loop.h"
#include "ucxprobe.h"

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

/* Peers that copy a rendezvous message's data out of this process themselves: over cma only
 * (psd streams the next update of a record such a peer pulled). */
START_TEST(peer_reads_over_cma_only)
{
    ck_assert_int_eq(ps_ucx_lanes_peer_reads("sysv,cma"), 1);
    ck_assert_int_eq(ps_ucx_lanes_peer_reads("cma"), 1);
    ck_assert_int_eq(ps_ucx_lanes_peer_reads("posix,cma,tcp"), 1);
    ck_assert_int_eq(ps_ucx_lanes_peer_reads("tcp"), 0);
    ck_assert_int_eq(ps_ucx_lanes_peer_reads("sysv"), 0);
    ck_assert_int_eq(ps_ucx_lanes_peer_reads("cmax,xcma"), 0);
    ck_assert_int_eq(ps_ucx_lanes_peer_reads(""), 0);
    ck_assert_int_eq(ps_ucx_lanes_peer_reads("unknown"), 0);
}
END_TEST

/* Make a worker and close it again with @p var set to @p value (NULL: unset), then unset;
 * returns the eager size it took for tcp. */
static uint32_t init_close_with(const char *var, const char *value)
{
    if (value)
        setenv(var, value, 1);
    else
        unsetenv(var);
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ps_ucx_t u;
    ck_assert_int_eq(ps_ucx_init(&u, &loop), 0);
    uint32_t below = ps_ucx_eager_below(&u, "tcp");
    ps_ucx_close(&u);
    uv_run(&loop, UV_RUN_NOWAIT); /* the handles' close callbacks */
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    unsetenv(var);
    return below;
}

static uint32_t eager_below_with(const char *env)
{
    return init_close_with("PS_EAGER_BYTES", env);
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

/* The environment after a worker was made and closed with UCX_TLS @p tls (NULL: unset). */
static void init_close_with_tls(const char *tls)
{
    (void)init_close_with("UCX_TLS", tls);
}

static void ck_env(const char *var, const char *want)
{
    const char *v = getenv(var);
    if (want == NULL)
        ck_assert_msg(v == NULL, "%s=%s, want it unset", var, v);
    else
        ck_assert_msg(v && strcmp(v, want) == 0, "%s=%s, want %s", var, v ? v : "(unset)",
                      want);
}

/* The shared memory settings (ucx_loop.c, shm_vars) are applied where the transports use
 * shared memory, a value the environment already has is kept, and none is set for transports
 * without shared memory (UCX would warn of an unused variable). */
START_TEST(shm_settings_applied)
{
    static const char *vars[] = {"UCX_MM_ERROR_HANDLING", "UCX_CMA_MEMORY_INVALIDATE",
                                 "UCX_MM_FIFO_RELEASE_FACTOR"};
    for (int i = 0; i < 3; i++) unsetenv(vars[i]);
    init_close_with_tls("tcp");
    for (int i = 0; i < 3; i++) ck_env(vars[i], NULL);
    init_close_with_tls(NULL);
    ck_env("UCX_MM_ERROR_HANDLING", "y");
    ck_env("UCX_CMA_MEMORY_INVALIDATE", "y");
    ck_env("UCX_MM_FIFO_RELEASE_FACTOR", "0");
    setenv("UCX_MM_FIFO_RELEASE_FACTOR", "0.25", 1);
    init_close_with_tls("^tcp");
    ck_env("UCX_MM_FIFO_RELEASE_FACTOR", "0.25");
    init_close_with_tls("tcp"); /* hidden from UCX while its worker is made, then put back */
    ck_env("UCX_MM_FIFO_RELEASE_FACTOR", "0.25");
    for (int i = 0; i < 3; i++) unsetenv(vars[i]);
    init_close_with_tls("posix,cma");
    ck_env("UCX_MM_FIFO_RELEASE_FACTOR", "0");
    ck_env("UCX_CMA_MEMORY_INVALIDATE", "y");
    for (int i = 0; i < 3; i++) unsetenv(vars[i]);
}
END_TEST

/* ---- a worker that stays busy ---------------------------------------------------------- */

ucs_status_t __real_ucp_worker_arm(ucp_worker_h worker);
ucs_status_t __wrap_ucp_worker_arm(ucp_worker_h worker);

static int arm_busy; /* 1: every arm says UCS_ERR_BUSY, as UCX 1.13 once did for good */

ucs_status_t __wrap_ucp_worker_arm(ucp_worker_h worker)
{
    return arm_busy ? UCS_ERR_BUSY : __real_ucp_worker_arm(worker);
}

static void on_tick(uv_timer_t *h)
{
    int *ticks = h->data;
    if (++*ticks == 3) uv_stop(h->loop);
}

/* Three ticks of a 2 ms timer, then the loop stops: returns the ticks seen. */
static int run_ticks(uv_loop_t *loop)
{
    int ticks = 0;
    uv_timer_t t;
    uv_timer_init(loop, &t);
    t.data = &ticks;
    uv_timer_start(&t, on_tick, 2, 2);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    return ticks;
}

/* While ucp_worker_arm says busy and progress finds nothing, ps_ucx_progress goes back to the
 * loop every millisecond (its timers still run) and the loop comes back without sleeping; once
 * arming works, the loop sleeps on the worker's event fd again. Before, the loop spun inside
 * ps_ucx_progress for good: this test then hits its timeout. */
START_TEST(busy_arm_keeps_the_loop_running)
{
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ps_ucx_t u;
    ck_assert_int_eq(ps_ucx_init(&u, &loop), 0);
    arm_busy = 1;
    ck_assert_int_eq(run_ticks(&loop), 3);
    uint64_t polls = u.busy_polls;
    ck_assert_uint_gt(polls, 0);
    arm_busy = 0;
    ck_assert_int_eq(run_ticks(&loop), 3);
    uint64_t settled = u.busy_polls;
    ck_assert_uint_le(settled, polls + 1); /* at most the timer started before */
    ck_assert_int_eq(run_ticks(&loop), 3);
    ck_assert_uint_eq(u.busy_polls, settled);
    ps_ucx_close(&u);
    uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}
END_TEST

/* ps_ucx_restart makes a new worker (and event-fd watch) the loop drives as before; closing
 * afterwards releases every handle (uv_loop_close would refuse otherwise). */
START_TEST(restart_replaces_the_worker)
{
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ps_ucx_t u;
    ck_assert_int_eq(ps_ucx_init(&u, &loop), 0);
    uv_poll_t *old_poll = u.poll;
    ck_assert_int_eq(ps_ucx_restart(&u), 0);
    ck_assert_ptr_nonnull(u.worker);
    ck_assert_ptr_ne(u.poll, old_poll); /* the old handle is closing */
    ck_assert_int_eq(run_ticks(&loop), 3);
    ck_assert_int_eq(ps_ucx_restart(&u), 0);
    ck_assert_int_eq(run_ticks(&loop), 3);
    ps_ucx_close(&u);
    uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}
END_TEST

static int owner_msgs;

static ucs_status_t owner_am(void *arg, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param)
{
    (void)arg, (void)header, (void)header_length, (void)data, (void)length, (void)param;
    owner_msgs++;
    return UCS_OK;
}

/* Send a probe and drive both workers until it arrived on every lane (1) or 2 s passed (0). */
static int probe_round(ps_ucx_t *u, ps_ucxprobe_t *p)
{
    ps_ucxprobe_send(p, 1);
    for (int i = 0; i < 2000 && !ps_ucxprobe_arrived(p); i++) {
        ps_ucxprobe_progress(p);
        ps_ucx_poll(u);
        uv_sleep(1);
    }
    return ps_ucxprobe_arrived(p);
}

/* The probe goes to the worker over each of its shared-memory transports (sysv and posix
 * here) and arrives (taken before the owner's handler, which never sees it); a header with the
 * mark and another nonce, or another lane's index, is not taken; after a restart of the worker,
 * a probe opened again arrives at the new one. A context without shared memory says so
 * (shm_tls 0). */
START_TEST(probe_of_the_fifo)
{
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ps_ucx_t u;
    ck_assert_int_eq(ps_ucx_init(&u, &loop), 0);
    ck_assert_uint_eq(u.shm_tls, PS_UCX_SHM_SYSV | PS_UCX_SHM_POSIX);
    ps_ucx_set_am_handler(&u, owner_am, NULL);
    static ps_ucxprobe_t p;
    char why[160] = "";
    ck_assert_msg(ps_ucxprobe_open(&p, u.worker, u.shm_tls, why, sizeof why) == 0, "%s", why);
    ck_assert_int_eq(p.n, 2);
    ck_assert_str_eq(p.names, "sysv,posix");
    u.probe = &p;
    owner_msgs = 0;
    ck_assert_int_eq(probe_round(&u, &p), 1);
    ck_assert_int_eq(probe_round(&u, &p), 1);
    ck_assert_int_eq(owner_msgs, 0);
    uint64_t forged[3] = {p.lane[0].hdr[0], p.lane[0].hdr[1] ^ 1, 0};
    ck_assert_int_eq(ps_ucxprobe_take(&p, forged, sizeof forged), 0);
    uint64_t other[3] = {p.lane[0].hdr[0], p.lane[0].hdr[1], 7};
    ck_assert_int_eq(ps_ucxprobe_take(&p, other, sizeof other), 0);
    ck_assert_int_eq(ps_ucxprobe_take(&p, p.lane[0].hdr, 16), 0);
    ck_assert_int_eq(ps_ucxprobe_lost(&p, UINT64_MAX / 2, 1), 0); /* arrived: never lost */
    p.lane[1].arrived = 0; /* as if posix's had not come: lost once its wait passed */
    ck_assert_int_eq(ps_ucxprobe_lost(&p, p.lane[1].left_ns, 1000), 0);
    ck_assert_int_eq(ps_ucxprobe_lost(&p, p.lane[1].left_ns + 1000, 1000), 1);
    ps_ucxprobe_forget(&p); /* a late copy after the spell ended is still not the owner's */
    ck_assert_int_eq(ps_ucxprobe_take(&p, p.lane[1].hdr, sizeof p.lane[1].hdr), 1);
    u.probe = NULL;
    ps_ucxprobe_close(&p);
    ck_assert_int_eq(p.n, 0);
    ck_assert_int_eq(ps_ucx_restart(&u), 0);
    ck_assert_msg(ps_ucxprobe_open(&p, u.worker, PS_UCX_SHM_POSIX, why, sizeof why) == 0, "%s",
                  why);
    ck_assert_int_eq(p.n, 1);
    u.probe = &p;
    ck_assert_int_eq(probe_round(&u, &p), 1);
    u.probe = NULL;
    ps_ucxprobe_close(&p);
    ps_ucx_close(&u);
    uv_run(&loop, UV_RUN_NOWAIT);

    ps_ucx_t t;
    ck_assert_int_eq(ps_ucx_init_tls(&t, &loop, "tcp"), 0);
    ck_assert_uint_eq(t.shm_tls, 0); /* (psd makes no probe then: server/listen.c) */
    ps_ucx_close(&t);
    uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}
END_TEST

/* A probe lane whose send waits for room in a FIFO the probed worker never reads (full of
 * earlier messages, as behind a dead sender's slot) closes at once, without waiting on the loop
 * for a flush that cannot end, and the probed worker stays usable. */
START_TEST(probe_closes_with_a_send_queued)
{
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ps_ucx_t u;
    ck_assert_int_eq(ps_ucx_init(&u, &loop), 0);
    ps_ucx_set_am_handler(&u, owner_am, NULL);
    static ps_ucxprobe_t p;
    char why[160] = "";
    ck_assert_msg(ps_ucxprobe_open(&p, u.worker, PS_UCX_SHM_SYSV, why, sizeof why) == 0, "%s",
                  why);
    static uint64_t filler[3];
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_AM_SEND_FLAG_EAGER};
    void *last = NULL;
    for (int i = 0; i < 4096 && last == NULL; i++) { /* until one waits for room */
        void *r = ucp_am_send_nbx(p.lane[0].ep, 1, filler, sizeof filler, NULL, 0, &prm);
        ck_assert(!UCS_PTR_IS_ERR(r));
        last = r;
        ucp_worker_progress(p.lane[0].worker);
        if (last && ucp_request_check_status(last) != UCS_INPROGRESS) {
            ucp_request_free(last);
            last = NULL;
        }
    }
    ck_assert_ptr_nonnull(last);
    p.lane[0].req = last; /* as a probe still queued */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ps_ucxprobe_close(&p);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    ck_assert_msg(ms < 90, "the close took %.1f ms", ms);
    ps_ucx_poll(&u); /* the filler the worker now reads goes to the owner, harmlessly */
    ps_ucx_close(&u);
    uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("ucx");
    TCase *tc = tcase_create("eager");
    tcase_add_test(tc, eager_only_on_copying_lanes);
    tcase_add_test(tc, peer_reads_over_cma_only);
    tcase_add_test(tc, eager_bytes_env);
    tcase_add_test(tc, shm_settings_applied);
    suite_add_tcase(s, tc);
    tc = tcase_create("busy");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, busy_arm_keeps_the_loop_running);
    tcase_add_test(tc, restart_replaces_the_worker);
    tcase_add_test(tc, probe_of_the_fifo);
    tcase_add_test(tc, probe_closes_with_a_send_queued);
    suite_add_tcase(s, tc);
    return s;
}
