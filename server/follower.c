/* follower.c: shard 0's `psctl checkpoint --follow` child (see follower.h). */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "follower.h"
#include "ps/ps_log.h"

#define RESTART_MS 1000 /* the least time between two starts */

static void spawn(psd_server_t *srv)
{
    char self[PATH_MAX], psctl[PATH_MAX + 16];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len < 0) {
        PS_LOG(PS_LOG_ERROR, "follower", "/proc/self/exe: %s: periodic checkpoints are off",
               strerror(errno));
        srv->follower.done = true;
        return;
    }
    self[len] = '\0';
    snprintf(psctl, sizeof psctl, "%s/psctl", dirname(self));
    if (access(psctl, X_OK) != 0) {
        PS_LOG(PS_LOG_ERROR, "follower", "%s: %s: periodic checkpoints are off", psctl,
               strerror(errno));
        srv->follower.done = true;
        return;
    }
    char *argv[] = {psctl, "--manifest", srv->m.path, "checkpoint", "--follow", NULL};
    pid_t parent = getpid();
    srv->follower.started_ms = uv_now(srv->loop);
    pid_t pid = fork();
    if (pid < 0) {
        PS_LOG(PS_LOG_ERROR, "follower", "fork: %s", strerror(errno));
        return;
    }
    if (pid == 0) { /* only async-signal-safe calls until exec */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(1); /* psd died before prctl */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        dup2(STDERR_FILENO, STDOUT_FILENO); /* psd's stdout is its readiness pipe */
        close_range(3, ~0u, 0);              /* not psd's sockets, store or epoll fds */
        execv(psctl, argv);
        _exit(127);
    }
    srv->follower.pid = pid;
    srv->follower.starts++;
    PS_LOG(PS_LOG_INFO, "follower", "started `%s --manifest %s checkpoint --follow` (pid %d): "
           "periodic checkpoints every %llu steps / %llu s, keeping %u", psctl, srv->m.path,
           (int)pid, (unsigned long long)srv->m.checkpoint.every_steps,
           (unsigned long long)srv->m.checkpoint.every_s, srv->m.checkpoint.keep);
}

void psd_follower_start(psd_server_t *srv)
{
    if (srv->shard != 0 || !srv->m.checkpoint.present) return;
    spawn(srv);
}

/* Reap the follower if it exited; @return 1 when it did. */
static int reap(psd_server_t *srv, int options)
{
    int st;
    pid_t pid = srv->follower.pid;
    if (pid <= 0) return 0;
    pid_t r = waitpid(pid, &st, options);
    if (r == 0 || (r < 0 && errno == EINTR)) return 0;
    srv->follower.pid = 0;
    if (r < 0) {
        PS_LOG(PS_LOG_WARN, "follower", "waitpid %d: %s", (int)pid, strerror(errno));
        return 1;
    }
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        srv->follower.done = true;
        PS_LOG(PS_LOG_INFO, "follower", "checkpoint follower (pid %d) exited: %s", (int)pid,
               srv->stopping ? "psd is stopping" : "the job is finished");
    } else if (WIFEXITED(st)) {
        PS_LOG(PS_LOG_WARN, "follower", "checkpoint follower (pid %d) exited with status %d%s",
               (int)pid, WEXITSTATUS(st), srv->stopping ? "" : ": starting it again");
        if (WEXITSTATUS(st) == 2) srv->follower.done = true; /* a usage error: it would recur */
    } else {
        PS_LOG(PS_LOG_WARN, "follower", "checkpoint follower (pid %d) killed by signal %d%s",
               (int)pid, WTERMSIG(st), srv->stopping ? "" : ": starting it again");
    }
    return 1;
}

void psd_follower_cron(psd_server_t *srv, uint64_t now_ms)
{
    if (srv->shard != 0 || !srv->m.checkpoint.present) return;
    reap(srv, WNOHANG);
    if (srv->follower.pid == 0 && !srv->follower.done && !srv->stopping &&
        now_ms - srv->follower.started_ms >= RESTART_MS)
        spawn(srv);
}

void psd_follower_signal(psd_server_t *srv)
{
    if (srv->follower.pid > 0) kill(srv->follower.pid, SIGTERM);
}

static void on_stop_poll(uv_timer_t *t)
{
    psd_server_t *srv = t->data;
    reap(srv, WNOHANG);
}

void psd_follower_reap(psd_server_t *srv)
{
    if (srv->follower.pid <= 0) return;
    kill(srv->follower.pid, SIGTERM);
    /* The loop goes on meanwhile: a follower that stops releases its checkpoint hold with a
     * last request to this shard (psctl_follow.c), which a psd waiting here without serving
     * answered only after psctl's 5 s timeout, so every stop of shard 0 took 5 s. */
    uv_timer_t poll;
    uv_timer_init(srv->loop, &poll);
    poll.data = srv;
    uv_timer_start(&poll, on_stop_poll, 10, 10);
    uint64_t t0 = uv_now(srv->loop);
    while (srv->follower.pid > 0 && uv_now(srv->loop) - t0 < 10000)
        uv_run(srv->loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&poll, NULL);
    uv_run(srv->loop, UV_RUN_NOWAIT); /* the close completes before poll's frame goes */
    if (srv->follower.pid > 0) {
        PS_LOG(PS_LOG_WARN, "follower", "checkpoint follower (pid %d) still running after 10 s: "
               "SIGKILL", (int)srv->follower.pid);
        kill(srv->follower.pid, SIGKILL);
        reap(srv, 0);
    }
}
