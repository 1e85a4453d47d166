/* ucx_loop.c: drive a UCP worker from a libuv loop (see ucx_loop.h). */
#include <errno.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <signal.h>
#include <time.h>

#include <ucs/config/global_opts.h>
#include <ucs/debug/debug.h>

#include "amguard.h"
#include "tcpaccept.h"
#include "tcpguard.h"
#include "ucxprobe.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "ucx_loop.h"

/* UCX 1.13 takes SIGHUP when libucs loads (UCX_DEBUG_SIGNO, by default SIGHUP): its handler
 * turns UCX's trace logging on and lets the process run on. So a program linking this code
 * whose terminal closed went on: pslaunch then started replacements for the workers the hangup
 * ended, and a libps program of a user's ran on unseen. Unless the user asked for UCX's debug
 * signal (the variable set), SIGHUP gets back the disposition it had before UCX: the default
 * (the process ends), or an ignore it was started with (nohup). Runs when this object loads,
 * after libucs (a library it depends on) took the signal, before main or dlopen returns;
 * programs that handle SIGHUP (psd, psworker) install their handlers later as before. */
__attribute__((constructor)) static void sighup_from_ucx(void)
{
    struct sigaction now;
    if (getenv("UCX_DEBUG_SIGNO") == NULL && ucs_global_opts.debug_signo == SIGHUP &&
        sigaction(SIGHUP, NULL, &now) == 0 && now.sa_handler != SIG_DFL &&
        now.sa_handler != SIG_IGN) /* not given back already (a second copy of this code) */
        ucs_debug_disable_signal(SIGHUP);
}

int ps_ucx_err(ucs_status_t s)
{
    switch (s) {
    case UCS_OK: return 0;
    case UCS_ERR_NO_MEMORY: return PS_ENOMEM;
    case UCS_ERR_CANCELED: return PS_ECANCELED;
    case UCS_ERR_TIMED_OUT: return PS_ETIMEDOUT;
    default: return PS_ETRANSPORT;
    }
}

static void on_efd(uv_poll_t *h, int status, int events)
{
    ps_ucx_progress(h->data);
}

static void on_prepare(uv_prepare_t *h)
{
    ps_ucx_progress(h->data);
}

/* Runs while the worker stays busy (ps_ucx_progress): an active idle handle keeps the loop from
 * sleeping, and its prepare hook progresses the worker again. (Not progressed from here: a
 * handle that restarts itself from its own callback would keep the loop's timers waiting.) */
static void on_busy_idle(uv_idle_t *h)
{
    (void)h;
}

/* No busy spell on record any more (the worker was armed, or is seen armable). */
static void busy_forget(ps_ucx_t *u)
{
    uv_idle_stop(&u->busy_idle);
    u->busy_since_ns = 0;
    u->idle_busy_ns = 0;
    u->stuck_since_ns = 0;
    u->stuck_spent_ns = 0;
}

/* The worker could be armed (or will not be tried again): the loop may sleep again. */
static void busy_end(ps_ucx_t *u)
{
    busy_forget(u);
    __atomic_store_n(&u->unarmed, 0, __ATOMIC_SEQ_CST);
}

/* For ps_ucx_t.driven: the worker is left unarmed to another thread that polls it. Its event
 * fd is not watched meanwhile: it may stay readable (a wake-up signal that only the next arm
 * drains), and the loop would find it so on every turn. The deferred hook runs once more, as
 * before any sleep (spinning): work queued by a thread that saw spinning is not left over. */
static void leave_unarmed(ps_ucx_t *u)
{
    if (u->poll && uv_is_active((uv_handle_t *)u->poll)) uv_poll_stop(u->poll);
    uv_idle_stop(&u->busy_idle); /* no busy worker keeps the loop awake: the driver polls it */
    /* A busy spell (busy_since_ns) stays: only an arm that succeeds ends it, here or in
     * ps_ucx_check_armable while callers drive. */
    __atomic_store_n(&u->unarmed, 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&u->spinning, 0, __ATOMIC_SEQ_CST);
    if (u->deferred && !u->closing) u->deferred(u);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* How long ps_ucx_progress keeps calling a busy ucp_worker_arm, with nothing progressed, before
 * it lets the loop run its timers once (and comes back at once), and how long the worker may
 * go without being armed, so leaving it again and again, before that is said (once). */
#define PS_UCX_BUSY_NS 1000000ull
#define PS_UCX_CLOSE_NS 2000000000ull /* ps_ucx_ep_close waits at most this long */
#define PS_UCX_BUSY_WARN_NS 1000000000ull
/* Busy this long with nothing progressed while the owner waits for nothing: seen wedged
 * (idle_busy_ns). Short: between two steps a worker may wait for nothing for well under 1 ms. */
#define PS_UCX_IDLE_BUSY_NS 100000ull

void ps_ucx_progress(ps_ucx_t *u)
{
    if (u->worker == NULL) { /* a failed ps_ucx_restart: the owner's queued work still runs */
        if (u->deferred && !u->closing) u->deferred(u);
        return;
    }
    /* A pool job finished and its completion is on its way (ps_ucx_spin_stop): let the loop
     * reach it first. One progress call can copy a whole rendezvous chunk (CMA: ~0.1 ms per
     * MiB), and the completion starts the next job and sends the replies, so it goes first;
     * the completion's resume brings the loop back here. */
    if (__atomic_load_n(&u->spin_stop, __ATOMIC_ACQUIRE)) return;
    if (u->driven && u->driven(u)) { /* another thread polls it now: leave it to that one */
        leave_unarmed(u);
        return;
    }
    if (u->unarmed) { /* taken over again: its event fd is watched again (registered by the
                        * loop's next poll for events: rewatched) */
        __atomic_store_n(&u->unarmed, 0, __ATOMIC_SEQ_CST);
        if (u->poll && !uv_is_active((uv_handle_t *)u->poll)) {
            uv_poll_start(u->poll, UV_READABLE, on_efd);
            u->rewatched = 1;
        }
    }
    uint64_t start = 0;
    int spin = u->spin_ns != 0;
    uint64_t busy_since = 0;
    int idle_from_start = 0; /* the owner waited for nothing when busy_since began */
    for (;;) {
        int active = 0, to_loop = 0;
        while (ucp_worker_progress(u->worker)) {
            active = 1;
            /* A pool job finished (ps_ucx_spin_stop): go back to the loop after each step, so
             * that its completion runs (and starts the next job) instead of waiting until
             * every transfer in flight has landed. Not armed: the completion's async wakes
             * the loop at once; its callback resumes (ps_ucx_spin_resume) and the prepare
             * hook brings the loop back here. */
            if (__atomic_load_n(&u->spin_stop, __ATOMIC_ACQUIRE)) {
                to_loop = 1;
                break;
            }
        }
        if (u->deferred && !to_loop && u->deferred(u)) active = 1;
        /* Not stuck: only a message that reached the owner says so (am_arrived). */
        if (to_loop) break;
        if (u->closing) break;
        if (u->driven && u->driven(u)) { /* another thread polls it now: left unarmed */
            leave_unarmed(u);
            break;
        }
        /* Busy-poll for a while after the last activity: a reply or the next request usually
         * follows within tens of microseconds, and sleeping on the event fd costs a wake-up
         * on the other vCPU (~20-45 us on a VM) each time. The yield leaves the CPU to any
         * runnable thread; the window is bounded, so an idle loop goes to sleep. One call
         * spins at most twice the window, so a steady stream of messages cannot keep the
         * loop from its timers, signals and pool completions. */
        if (spin) {
            uint64_t now = now_ns();
            if (start == 0) start = now;
            if (active) u->last_active_ns = now;
            if (__atomic_load_n(&u->spin_stop, __ATOMIC_ACQUIRE) ||
                now - start >= 2 * u->spin_ns) {
                spin = 0;
                u->last_active_ns = now - u->spin_ns;
            }
            if (spin && now - u->last_active_ns < u->spin_ns) {
                __atomic_store_n(&u->spinning, 1, __ATOMIC_SEQ_CST);
                sched_yield();
                continue;
            }
        }
        if (active) {
            busy_since = 0;
            continue;
        }
        if (__atomic_load_n(&u->spinning, __ATOMIC_RELAXED)) {
            /* Other threads skip their wake-up while we spin (see spinning): clear the flag,
             * then look at their queue once more before sleeping. */
            __atomic_store_n(&u->spinning, 0, __ATOMIC_SEQ_CST);
            continue;
        }
        ucs_status_t s = u->test_wedge ? UCS_ERR_BUSY : ucp_worker_arm(u->worker);
        if (s != UCS_ERR_BUSY) {
            if (s != UCS_OK)
                PS_LOG(PS_LOG_ERROR, "ucx", "ucp_worker_arm: %s", ucs_status_string(s));
            busy_end(u);
            break;
        }
        /* Busy: events wait, or a transfer is under way (a CMA copy progresses a segment per
         * call and counts only when it completes); progress again. UCX 1.13 can also stay busy
         * for good with nothing that progress takes: a worker whose shard was killed mid-run
         * (faults:psd_crash_coordinator, about 1 run in 150) spun here, and its timers
         * (heartbeats, reconnects) never ran again. So after PS_UCX_BUSY_NS go back to the loop,
         * which runs its timers and comes back without sleeping (busy_idle) until it can arm. */
        uint64_t now = now_ns();
        if (busy_since == 0) {
            busy_since = now;
            idle_from_start = u->owner_idle && u->owner_idle(u->owner_idle_arg);
        }
        /* Idle at both ends, nothing progressed between: idle throughout (the owner's ops
         * enter its list on this thread, through deferred, which counts as activity). */
        if (idle_from_start && now - busy_since >= PS_UCX_IDLE_BUSY_NS &&
            u->owner_idle(u->owner_idle_arg))
            u->idle_busy_ns = now;
        if (now - busy_since >= PS_UCX_BUSY_NS) {
            u->busy_polls++;
            if (u->busy_since_ns == 0) u->busy_since_ns = busy_since;
            if (u->stuck_since_ns == 0) u->stuck_since_ns = busy_since;
            u->stuck_spent_ns += now - busy_since;
            if (!u->busy_warned && now - u->busy_since_ns >= PS_UCX_BUSY_WARN_NS) {
                u->busy_warned = 1;
                PS_LOG(PS_LOG_WARN, "ucx", "the UCX worker could not be put to sleep for %.1f s "
                       "(busy, with nothing progressed for 1 ms at a time); the loop keeps "
                       "polling it", (double)(now - u->busy_since_ns) / 1e9);
            }
            uv_idle_start(&u->busy_idle, on_busy_idle);
            break;
        }
    }
    __atomic_store_n(&u->spinning, 0, __ATOMIC_SEQ_CST);
}

void ps_ucx_check_armable(ps_ucx_t *u)
{
    if (!u->unarmed || u->worker == NULL || u->closing || u->busy_since_ns == 0) return;
    ucs_status_t s = u->test_wedge ? UCS_ERR_BUSY : ucp_worker_arm(u->worker);
    if (s == UCS_OK) busy_forget(u); /* armable: no wedge (it stays unwatched, left aside) */
}

void ps_ucx_poll(ps_ucx_t *u)
{
    if (u->worker == NULL || u->closing) return;
    uv_update_time(u->loop); /* timers its handlers start count from now, not the loop's turn */
    int did = 0;
    while (ucp_worker_progress(u->worker)) did = 1;
    if (u->deferred && u->deferred(u)) did = 1;
    if (did) u->last_active_ns = now_ns(); /* the loop's busy-poll goes on from here */
}

int ps_ucx_wait_ms(ps_ucx_t *u, int timeout_ms)
{
    if (u->unarmed && (timeout_ms < 0 || timeout_ms > PS_UCX_ASIDE_MS))
        timeout_ms = PS_UCX_ASIDE_MS;
    if (u->rewatched) { /* taken back in a callback after this turn's poll for events: the */
        u->rewatched = 0; /* event fd joins libuv's epoll set at the next one, not before */
        timeout_ms = 0;
    }
    return timeout_ms;
}

uint64_t ps_ucx_stuck_ns(const ps_ucx_t *u)
{
    if (u->worker == NULL || u->stuck_since_ns == 0) return 0;
    uint64_t span = now_ns() - u->stuck_since_ns;
    return u->stuck_spent_ns * 2 >= span ? span : 0;
}

void ps_ucx_set_spin(ps_ucx_t *u, uint32_t us)
{
    const char *env = getenv("PS_SPIN_US");
    if (env && *env) {
        /* As the manifest's spin_us: 0..10000. Unchecked, -1 read as 4294967295 us, and the
         * loop busy-polled for an hour without its timers or signals (psd ignored SIGTERM:
         * an input probe, session 63); "abc" read as 0. */
        char *end;
        errno = 0;
        unsigned long v = strtoul(env, &end, 10);
        if (*end || errno || env[0] == '-' || env[0] == '+' || v > 10000)
            PS_LOG(PS_LOG_WARN, "ucx", "PS_SPIN_US: want microseconds 0..10000, got '%s'; "
                   "keeping %u", env, us);
        else
            us = (uint32_t)v;
    }
    u->spin_ns = (uint64_t)us * 1000u;
}

/* Create the UCP worker of u->context and watch its event fd from u->loop. */
static int worker_start(ps_ucx_t *u)
{
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = u->serialized ? UCS_THREAD_MODE_SERIALIZED : UCS_THREAD_MODE_SINGLE,
    };
    ps_tcpaccept_creating(1); /* a connection accepted inside would abort UCX (tcpaccept.h) */
    ucs_status_t s = ucp_worker_create(u->context, &wp, &u->worker);
    ps_tcpaccept_creating(0);
    if (s != UCS_OK) {
        u->worker = NULL;
        PS_LOG(PS_LOG_ERROR, "ucx", "worker setup: %s", ucs_status_string(s));
        return PS_ETRANSPORT;
    }
    ps_amguard_watch(u->worker); /* before any endpoint or listener */
    s = ucp_worker_get_efd(u->worker, &u->efd);
    int rc = s == UCS_OK ? 0 : PS_ETRANSPORT;
    if (rc == 0 && (u->poll = malloc(sizeof *u->poll)) == NULL) rc = PS_ENOMEM;
    if (rc == 0 && (rc = uv_poll_init(u->loop, u->poll, u->efd)) != 0) {
        free(u->poll);
        u->poll = NULL;
    }
    if (rc) {
        PS_LOG(PS_LOG_ERROR, "ucx", "worker setup: %s",
               s != UCS_OK ? ucs_status_string(s) : ps_strerror(rc));
        ucp_worker_destroy(u->worker);
        ps_amguard_unwatch(u->worker);
        u->worker = NULL;
        return rc;
    }
    u->poll->data = u;
    uv_poll_start(u->poll, UV_READABLE, on_efd);
    return 0;
}

/* Whether the transports @p tls (UCX_TLS's syntax: names separated by commas, or all but those
 * after a leading '^'; NULL or empty: UCX's default, all) include a transport: one of @p in is
 * named, or, after '^', none of @p out (the aliases that leave all of it out). NULL-ended. */
static bool tls_uses(const char *tls, const char *const *in, const char *const *out)
{
    if (tls == NULL || *tls == '\0') return true;
    bool except = tls[0] == '^', named = false;
    const char *const *names = except ? out : in;
    for (const char *p = tls + except; *p; p += *p == ',') {
        size_t n = strcspn(p, ",");
        for (int i = 0; names[i] && !named; i++)
            named = strlen(names[i]) == n && strncmp(p, names[i], n) == 0;
        p += n;
    }
    return except ? !named : named;
}

/* psd's and libps's settings of UCX's shared memory transports, each with its value and the
 * transports that read it (set unless the environment sets them):
 * - the two UCX 1.13 needs for shared memory under PEER error handling (PLATFORM-NOTES.md
 *   section 1);
 * - the receive FIFO's tail published at every message read, not every half FIFO (UCX's
 *   default release factor 0.5: 32 of 64 places). Where replies from several shards filled
 *   a worker's FIFO (psbench's round_many_single 2x2: 32 small replies from each shard a
 *   round), rounds stalled 2-6 ms with every process asleep (p99 1.2-4 ms against a p50 of
 *   0.2); published at every read, p99 0.3 ms (docs/PERFORMANCE.md, session 55). */
static const struct {
    const char *var, *value;
    const char *in[8], *out[4];
} shm_vars[] = {
    {"UCX_MM_ERROR_HANDLING", "y", {"all", "sm", "shm", "mm", "posix", "sysv", NULL},
     {"sm", "shm", "mm", NULL}},
    {"UCX_CMA_MEMORY_INVALIDATE", "y", {"all", "sm", "shm", "cma", NULL},
     {"sm", "shm", "cma", NULL}},
    {"UCX_MM_FIFO_RELEASE_FACTOR", "0", {"all", "sm", "shm", "mm", "posix", "sysv", NULL},
     {"sm", "shm", "mm", NULL}},
};
#define SHM_VARS (sizeof shm_vars / sizeof shm_vars[0])

static int init_with(ps_ucx_t *u, uv_loop_t *loop, const char *tls, int serialized);

static bool lanes_has(const char *list, const char *name, size_t n);

/* Context @p ctx's shared-memory transports (PS_UCX_SHM_* bits): ucp_context_print_info names
 * each resource on a line "#      resource 3  :  md 2  dev 3  flags -- sysv/memory". Unknown
 * (no memory for the text): sysv, UCX's choice on one host. */
static unsigned context_shm(ucp_context_h ctx)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f == NULL) return PS_UCX_SHM_SYSV;
    ucp_context_print_info(ctx, f);
    fclose(f);
    unsigned shm = 0;
    for (const char *l = text; l && (l = strstr(l, "-- ")) != NULL; l += 3) {
        size_t n = strcspn(l + 3, "/\n");
        if (l[3 + n] != '/') continue;
        shm |= lanes_has("sysv", l + 3, n) ? PS_UCX_SHM_SYSV
             : lanes_has("posix", l + 3, n) ? PS_UCX_SHM_POSIX
             : lanes_has("xpmem", l + 3, n) ? PS_UCX_SHM_XPMEM : 0;
    }
    free(text);
    return shm;
}

int ps_ucx_init(ps_ucx_t *u, uv_loop_t *loop)
{
    return init_with(u, loop, NULL, 0);
}

int ps_ucx_init_serialized(ps_ucx_t *u, uv_loop_t *loop)
{
    return init_with(u, loop, NULL, 1);
}

int ps_ucx_init_tls(ps_ucx_t *u, uv_loop_t *loop, const char *tls)
{
    return init_with(u, loop, tls, 0);
}

static int init_with(ps_ucx_t *u, uv_loop_t *loop, const char *tls, int serialized)
{
    memset(u, 0, sizeof *u);
    u->loop = loop;
    u->serialized = serialized;
    u->eager_below = PS_EAGER_BELOW;
    /* Tests only: ucp_worker_arm answers busy until the worker is started again, as UCX 1.13's
     * was seen to after a shard restarted several times (worker/shardloss.c, unarmable). */
    const char *wedge = getenv("PS_TEST_UCX_WEDGE");
    u->test_wedge = wedge != NULL && strcmp(wedge, "1") == 0;
    const char *eb = getenv("PS_EAGER_BYTES");
    if (eb && *eb) {
        char *end;
        unsigned long v = strtoul(eb, &end, 10);
        if (*end || v > (1ul << 30))
            PS_LOG(PS_LOG_WARN, "ucx", "PS_EAGER_BYTES: want a byte count up to 2^30, got "
                   "'%s'; keeping %u", eb, u->eager_below);
        else
            u->eager_below = (uint32_t)v;
    }
    const char *env_tls = getenv("UCX_TLS");
    if (env_tls && *env_tls) tls = NULL; /* the user's choice, as UCX reads it */
    /* UCX 1.13 leaves shared memory out under PEER error handling unless these are set;
     * without them a local cluster silently runs on TCP. Where the transports leave a setting's
     * transport out it is hidden from UCX until its worker is made (where UCX warns of unused
     * variables, on stdout: into psctl status --json), then put back for the children: a
     * parent set it (ours, in a python process that loaded libps and runs psctl), or the
     * user for the workers. */
    const char *eff = tls ? tls : env_tls;
    char *kept[SHM_VARS] = {NULL};
    for (size_t i = 0; i < SHM_VARS; i++) {
        const char *v = getenv(shm_vars[i].var);
        if (tls_uses(eff, shm_vars[i].in, shm_vars[i].out))
            setenv(shm_vars[i].var, shm_vars[i].value, 0);
        else if (v && (kept[i] = strdup(v)) != NULL)
            unsetenv(shm_vars[i].var);
    }

    ps_amguard_install(); /* before any worker opens a transport */
    ucp_config_t *config;
    ucs_status_t s = ucp_config_read(NULL, NULL, &config);
    if (s == UCS_OK && tls && (s = ucp_config_modify(config, "TLS", tls)) != UCS_OK)
        ucp_config_release(config);
    /* One lane for a message's eager fragments (UCX's default, pinned): they arrive in order,
     * which amguard.c's check of multi-fragment messages counts on. */
    if (s == UCS_OK && (s = ucp_config_modify(config, "MAX_EAGER_RAILS", "1")) != UCS_OK)
        ucp_config_release(config);
    if (s == UCS_OK) {
        ucp_params_t params = {
            .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
            .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
            .mt_workers_shared = 0,
        };
        s = ucp_init(&params, config, &u->context);
        ucp_config_release(config);
        if (s == UCS_OK) u->shm_tls = context_shm(u->context);
    }
    int rc = s == UCS_OK ? worker_start(u) : PS_ETRANSPORT; /* UCX reads the unused here */
    for (size_t i = 0; i < SHM_VARS; i++) {
        if (kept[i]) setenv(shm_vars[i].var, kept[i], 1);
        free(kept[i]);
    }
    if (s != UCS_OK) {
        PS_LOG(PS_LOG_ERROR, "ucx", "UCX setup (transports '%s'): %s", eff ? eff : "all",
               ucs_status_string(s));
        u->context = NULL;
        return PS_ETRANSPORT;
    }
    if (rc) {
        ucp_cleanup(u->context);
        u->context = NULL;
        return rc;
    }
    uv_prepare_init(loop, &u->prepare);
    u->prepare.data = u;
    uv_idle_init(loop, &u->busy_idle);
    u->busy_idle.data = u;
    uv_prepare_start(&u->prepare, on_prepare);
    return 0;
}

static void free_handle(uv_handle_t *h)
{
    free(h);
}

/* Destroy the UCP worker (with whatever endpoints are left) and stop watching its event fd. */
static void worker_stop(ps_ucx_t *u)
{
    uv_poll_stop(u->poll);
    uv_close((uv_handle_t *)u->poll, free_handle);
    u->poll = NULL;
    ucp_worker_destroy(u->worker); /* checked to the end (messages it handles on the way) */
    ps_amguard_unwatch(u->worker);
    u->worker = NULL;
}

void ps_ucx_close(ps_ucx_t *u)
{
    if (u->context == NULL) return;
    u->closing = 1;
    uv_prepare_stop(&u->prepare);
    uv_idle_stop(&u->busy_idle);
    uv_close((uv_handle_t *)&u->prepare, NULL);
    uv_close((uv_handle_t *)&u->busy_idle, NULL);
    if (u->worker) worker_stop(u);
    ucp_cleanup(u->context);
    u->context = NULL;
}

int ps_ucx_restart(ps_ucx_t *u)
{
    if (u->worker) worker_stop(u);
    busy_end(u);
    u->busy_warned = 0;
    u->test_wedge = 0;
    u->last_active_ns = 0;
    int rc = worker_start(u);
    if (rc == 0 && u->am_cb) ps_ucx_set_am_handler(u, u->am_cb, u->am_arg);
    return rc;
}

/* Progress until @p req completes or @p limit_ns passes (then UCS_INPROGRESS), and release it
 * (UCX frees one still in flight when it completes). */
static ucs_status_t wait_req(ps_ucx_t *u, void *req, uint64_t limit_ns)
{
    if (req == NULL) return UCS_OK;
    if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
    uint64_t t0 = now_ns();
    ucs_status_t s;
    while ((s = ucp_request_check_status(req)) == UCS_INPROGRESS && now_ns() - t0 < limit_ns)
        ucp_worker_progress(u->worker);
    ucp_request_free(req);
    return s;
}

ucs_status_t ps_ucx_wait(ps_ucx_t *u, void *req)
{
    return wait_req(u, req, UINT64_MAX);
}

void ps_ucx_ep_close(ps_ucx_t *u, ucp_ep_h *ep, int force)
{
    if (*ep == NULL) return;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0};
    void *req = ucp_ep_close_nbx(*ep, &p);
    *ep = NULL;
    /* Bounded: a close that waits on a peer that never answers (a flush to a dead process, or
     * a worker UCX left wedged) must not hold the loop for good. */
    if (wait_req(u, req, PS_UCX_CLOSE_NS) == UCS_INPROGRESS)
        PS_LOG(PS_LOG_WARN, "ucx", "an endpoint's close did not complete in %llu ms; left to "
               "finish in the background", (unsigned long long)(PS_UCX_CLOSE_NS / 1000000));
}

/* Every active message passes here on its way to the owner's handler: one that arrived means
 * the worker is not stuck (ps_ucx_stuck_ns). Other progress does not: connection requests,
 * endpoint errors and closes (joiners whose hellos sit behind a dead sender's shared-memory
 * FIFO slot connect, time out and close again every 1-2 s) counted as progress before, and
 * kept such a wedged worker from ever being seen stuck (a probe, session 47). The owner's
 * probe (ucxprobe.h) is taken here. */
static ucs_status_t am_arrived(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param)
{
    ps_ucx_t *u = arg;
    if (u->probe && ps_ucxprobe_take(u->probe, header, header_length)) return UCS_OK;
    u->stuck_since_ns = u->stuck_spent_ns = 0;
    return u->am_cb(u->am_arg, header, header_length, data, length, param);
}

void ps_ucx_set_am_handler(ps_ucx_t *u, ucp_am_recv_callback_t cb, void *arg)
{
    u->am_cb = cb; /* set again on the worker ps_ucx_restart makes */
    u->am_arg = arg;
    /* The ids match proto/wire.h: PS_AM_CTRL = 1, PS_AM_DATA = 2. */
    for (unsigned id = 1; id <= 2; id++) {
        ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                                   UCP_AM_HANDLER_PARAM_FIELD_CB |
                                                   UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                     .id = id, .cb = am_arrived, .arg = u};
        ucp_worker_set_am_recv_handler(u->worker, &hp);
    }
}

int ps_sockaddr_resolve_any(const char *host, uint16_t port, int family,
                            struct sockaddr_storage *ss, socklen_t *len)
{
    struct addrinfo hints = {.ai_family = family, .ai_socktype = SOCK_STREAM}, *res;
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    if (getaddrinfo(host, ps, &hints, &res) != 0) return PS_ECONFIG;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

int ps_sockaddr_resolve(const char *host, uint16_t port, struct sockaddr_storage *ss,
                        socklen_t *len)
{
    /* IPv4 only: UCX 1.13.1's TCP transport writes an IPv6 peer's address past a struct
     * sockaddr_in (uct_tcp_ep_set_dest_addr): psd listening on ::1 died of heap corruption at
     * its first client (an input probe, session 63). */
    return ps_sockaddr_resolve_any(host, port, AF_INET, ss, len);
}

/* Whether the comma-separated list @p list has the name @p name (@p n bytes). */
static bool lanes_has(const char *list, const char *name, size_t n)
{
    for (const char *l = list; *l;) {
        size_t k = strcspn(l, ",");
        if (k == n && strncmp(l, name, n) == 0) return true;
        l += k + (l[k] == ',');
    }
    return false;
}

void ps_ucx_ep_lanes(ucp_ep_h ep, char *buf, size_t len)
{
    /* ucp_ep_print_info writes a table with a line per lane naming its transport:
     * "lane[1]:  3:sysv/memory.0 md[2] -> ..." (1.13; older ones leave out "3:"). Keep each
     * transport's name once, in the order of the lanes, whatever the transport. */
    buf[0] = '\0';
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    if (f == NULL) return;
    ucp_ep_print_info(ep, f);
    fclose(f);
    size_t off = 0;
    for (const char *l = text; l && (l = strstr(l, "lane[")) != NULL; l++) {
        const char *p = strstr(l, "]:");
        if (p == NULL) break;
        p += 2;
        p += strspn(p, " ");
        if (*p >= '0' && *p <= '9') {
            p += strspn(p, "0123456789");
            if (*p++ != ':') continue;
        }
        size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
        if (n == 0 || p[n] != '/' || n >= 32) continue;
        if (lanes_has(buf, p, n) || off + n + 2 > len) continue; /* named already, or no room */
        off += (size_t)snprintf(buf + off, len - off, "%s%.*s", off ? "," : "", (int)n, p);
    }
    if (off == 0) snprintf(buf, len, "unknown");
    free(text);
}

/* Whether any transport of @p lanes (comma-separated) is one of @p list's. */
static int lanes_any(const char *lanes, const char *list)
{
    for (const char *l = lanes; *l;) {
        size_t n = strcspn(l, ",");
        if (lanes_has(list, l, n)) return 1;
        l += n + (l[n] == ',');
    }
    return 0;
}

int ps_ucx_lanes_shm(const char *lanes)
{
    return lanes_any(lanes, "sysv,posix,xpmem");
}

int ps_ucx_lanes_peer_reads(const char *lanes)
{
    return lanes_any(lanes, "cma");
}

uint32_t ps_ucx_eager_below(const ps_ucx_t *u, const char *lanes)
{
    if (lanes[0] == '\0') return 0;
    for (const char *l = lanes; *l;) { /* "unknown" is not a copying transport either */
        size_t n = strcspn(l, ",");
        if (!lanes_has("tcp,sysv,posix,cma", l, n)) return 0;
        l += n + (l[n] == ',');
    }
    return u->eager_below;
}

int ps_ucx_connect(ps_ucx_t *u, const char *host, uint16_t port, ucp_err_handler_cb_t cb,
                   void *arg, ucp_ep_h *ep, ps_ucx_token_t *token)
{
    struct sockaddr_storage ss;
    socklen_t sslen;
    *ep = NULL;
    if (token) memset(token, 0, sizeof *token);
    if (u->worker == NULL) return PS_ETRANSPORT; /* a failed ps_ucx_restart */
    if (ps_sockaddr_resolve(host, port, &ss, &sslen)) return PS_ECONFIG;
    return ps_ucx_connect_addr(u, (const struct sockaddr *)&ss, sslen, host, port, cb, arg, ep,
                               token);
}

int ps_ucx_connect_addr(ps_ucx_t *u, const struct sockaddr *sa, socklen_t salen,
                        const char *host, uint16_t port, ucp_err_handler_cb_t cb, void *arg,
                        ucp_ep_h *ep, ps_ucx_token_t *token)
{
    *ep = NULL;
    if (token) memset(token, 0, sizeof *token);
    if (u->worker == NULL) return PS_ETRANSPORT; /* a failed ps_ucx_restart */
    ucp_ep_params_t p = {
        .field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
        .sockaddr = {.addr = sa, .addrlen = salen},
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = cb, .arg = arg},
    };
    if (ucp_ep_create(u->worker, &p, ep) != UCS_OK) {
        *ep = NULL;
        return PS_ETRANSPORT;
    }
    if (u->connected) u->connected(u, *ep, host, port, u->connected_arg, token);
    return 0;
}
