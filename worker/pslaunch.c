/* pslaunch.c: start local psworker processes for a manifest, forward SIGINT/SIGTERM/SIGHUP
 * to them and wait. Either N of them (--workers N, failing if one fails), or as many
 * as the coordinator asks for (--follow): every poll it reports how many run here and
 * starts or stops (SIGTERM) workers as told, so that `psctl scale N` takes effect and
 * several pslaunch instances share the count. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "durable.h"
#include "reqclient.h"
#include "wire.h"
#include "auth.h"
#include "manifest.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "sigignored.h"

static int g_sig;  /* SIGINT, SIGTERM or SIGHUP once received (forwarded to the workers) */
static int g_nsig; /* how many of them came: a second one kills the workers left */
static const char *g_device; /* --device, passed on to every worker (NULL: none) */

/* After the first SIGINT / SIGTERM is forwarded, the workers still running this long later
 * (one that ignores it, or hangs) are killed (SIGKILL), as they are at a second one. */
#define STOP_GRACE_S 30.0

/* --follow: the workers still running this long after the coordinator said the job is complete
 * (one SIGSTOPped, or hung) get SIGTERM and SIGCONT, then SIGKILL after STOP_GRACE_S, as after
 * a signal. Before, pslaunch waited for them for good. A test shortens it
 * (PS_TEST_FINISH_GRACE_MS). */
#define FINISH_GRACE_S 30.0

/* Start worker i: psworker --manifest M [--metrics-out DIR/worker-i.jsonl] [--device D]; its
 * @p gen-th replacement (--respawn) writes DIR/worker-i.gen.jsonl, so that the lines of the
 * one that died stay (before, a probe found, the replacement emptied its file). */
static pid_t spawn(const char *worker, const char *manifest, const char *metrics_dir, long i,
                   long gen)
{
    char mpath[PATH_MAX];
    if (metrics_dir && gen)
        snprintf(mpath, sizeof mpath, "%s/worker-%ld.%ld.jsonl", metrics_dir, i, gen);
    else if (metrics_dir)
        snprintf(mpath, sizeof mpath, "%s/worker-%ld.jsonl", metrics_dir, i);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "pslaunch: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid > 0) return pid;
    /* The child: only async-signal-safe calls until the exec (UCX's thread in --follow may have
     * held a lock at the fork). A pslaunch that dies (kill -9) takes its workers with it
     * (SIGTERM: they leave the job), and they hold none of its descriptors (its UCX sockets
     * and its connection to the coordinator would outlive it in them). */
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(127);
    close_range(3, ~0U, 0);
    signal(SIGPIPE, SIG_DFL); /* ignored in pslaunch; an ignore would pass through exec */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    const char *args[9] = {"psworker", "--manifest", manifest};
    int k = 3;
    if (metrics_dir) {
        args[k++] = "--metrics-out";
        args[k++] = mpath;
    }
    if (g_device) {
        args[k++] = "--device";
        args[k++] = g_device;
    }
    execv(worker, (char *const *)args);
    /* A program the kernel cannot run (a script without its #! line: ENOEXEC; one removed or
     * made unreadable since pslaunch's check) fails so at every start: exit 2, which pslaunch
     * takes as a refusal (no more starts; it exits 2). Before, --follow started it again every
     * few seconds for good (a probe, session 67). */
    int e = errno;
    dprintf(2, "pslaunch: exec %s: %s%s\n", worker, strerror(e),
            e == ENOEXEC ? " (a script needs a #! line naming its interpreter)" : "");
    _exit(e == ENOEXEC || e == ENOENT || e == EACCES || e == ENOTDIR || e == ELOOP ? 2 : 127);
}

/* Whether a SIGINT, SIGTERM or SIGHUP waits (blocked, not yet taken): checked before each
 * start, so that one that came meanwhile starts no more workers. */
static int stop_pending(void)
{
    sigset_t p;
    sigpending(&p);
    return sigismember(&p, SIGINT) || sigismember(&p, SIGTERM) || sigismember(&p, SIGHUP);
}

/* ps_req_set_cancel_fn's check: a request to the coordinator (its name's lookup, its answer)
 * ends as soon as a stop signal waits, which the loop then takes. */
static int signal_waits(void *arg)
{
    (void)arg;
    return stop_pending();
}

/* Takes a signal sigtimedwait / sigwaitinfo returned: a SIGINT, SIGTERM or SIGHUP is kept in
 * g_sig and counted; the first one is said (with the @p nlive workers it goes on to). */
static void took(int sig, long nlive)
{
    if (sig != SIGINT && sig != SIGTERM && sig != SIGHUP) return;
    if (g_nsig++ == 0)
        fprintf(stderr, "pslaunch: %s: passing it on to the %ld worker(s) running and waiting "
                "for them to leave\n", sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP"
                : "SIGTERM", nlive);
    g_sig = sig;
}

/* --follow with --metrics-dir: the first index from *@p next whose DIR/worker-i.jsonl did not
 * exist, made now (empty), so that instances sharing DIR (several hosts, or one run after
 * another) never write one file twice; *@p next moves past it. */
static long claim_index(const char *metrics_dir, long *next)
{
    for (;; (*next)++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/worker-%ld.jsonl", metrics_dir, *next);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) close(fd);
        if (fd >= 0 || errno != EEXIST) return (*next)++; /* another error: psworker says it */
    }
}

/* A monotonic clock in seconds. */
static double mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define FOLLOW_MAX PS_LAUNCH_MAX /* worker processes alive at once, stopping ones included */

/* One that dies at once (a binary that fails, a host short of memory) would be started again
 * hundreds of times a second: once two in a row (the first worker counts) died within a second
 * of their start, wait 0.1 s before the next start, doubling to 5 s while they keep dying so.
 * @p quick counts them; @p died_quick: the one just dead did (--follow counts more as such:
 * EARLY_S). Returns the wait (s). */
static double quick_death_wait(int *quick, bool died_quick)
{
    *quick = died_quick ? *quick + 1 : 0;
    double d = *quick > 1 ? 0.1 * (double)(1L << (*quick < 8 ? *quick - 2 : 6)) : 0;
    return d > 5.0 ? 5.0 : d;
}

/* --follow: a worker that exited non-zero (not by a signal) within EARLY_S of its start
 * counts as a quick death too: a program that cannot start yet (a Python worker without its
 * package on the path, a device this host lacks) was started again every ~2 s for good, as a
 * Python one's start outlasts the second (a probe, session 67). Started again all the same,
 * after the doubling wait: what fails may clear up (a dataset mounted late, psworker's exit 1
 * says so; a GPU another process still holds), so --follow does not give up (a review). A
 * psworker that waits out a shard down exits after its reconnect timeout (30 s): not one. */
#define EARLY_S 10.0

/* A launch report to the coordinator (@p ctl's shard 0) of manifest @p m: this launcher
 * (pid, @p host) runs @p running workers, stops @p stopping more (told to stop, not ended yet:
 * shard 0 counts them as leaving; PS_FLAG_REPORT says so) and polls every @p poll_ms;
 * @p flags: PS_FLAG_DONE, it exits. @return ps_req_call's, its answer in *@p rep (@p err says
 * why otherwise). */
static int launch_report(ps_req_t *ctl, const ps_manifest_t *m, const char *host, int running,
                         int stopping, long poll_ms, uint32_t flags, ps_msg_t *rep, char *err,
                         size_t errlen)
{
    ps_msg_t req = {.type = PS_MSG_LAUNCH, .workers = (uint32_t)running,
                    .count = (uint64_t)stopping, .pid = (uint32_t)getpid(), .rank = -1,
                    .poll_ms = (uint32_t)poll_ms, .flags = flags | PS_FLAG_REPORT};
    snprintf(req.host, sizeof req.host, "%s", host);
    snprintf(req.cluster, sizeof req.cluster, "%s", m->cluster);
    return ps_req_call(ctl, 0, &req, rep, NULL, NULL, err, errlen);
}

/* --follow: poll the coordinator with this host's running count; start or stop as told. */
static int follow(const char *manifest, const char *worker, const char *metrics_dir, long poll_ms,
                  const sigset_t *set)
{
    static ps_manifest_t m;
    char err[1024], host[64] = "";
    if (ps_manifest_load(&m, manifest, err, sizeof err)) {
        fprintf(stderr, "pslaunch: %s\n", err);
        return 2;
    }
    gethostname(host, sizeof host - 1);
    ps_req_t *ctl;
    int orc = ps_req_open(&m, 2.0, &ctl, err, sizeof err);
    if (orc) { /* a secret_file it refuses is the manifest's: exit 2, not to be run again */
        fprintf(stderr, "pslaunch: %s\n", err);
        return orc == PS_ECONFIG ? 2 : 1;
    }
    ps_req_set_cancel_fn(ctl, signal_waits, NULL);
    pid_t pids[FOLLOW_MAX];
    int stopping[FOLLOW_MAX];
    double born[FOLLOW_MAX], hold_until = 0; /* starts, and no start before (quick deaths) */
    /* A worker stopped for a scale-down: when it got SIGTERM (SIGKILL STOP_GRACE_S later, as
     * after a forwarded signal; 0: not such a stop, or killed already). */
    double stop_sent[FOLLOW_MAX];
    int nlive = 0, finished = 0, failures = 0, answered = 0, refused = 0, quick = 0;
    long next_index = 0;
    time_t silent_since = 0, said = 0; /* the coordinator unreachable since, and said at */
    double forwarded_at = 0; /* the first SIGINT / SIGTERM forwarded (mono_s) */
    double finished_at = 0;  /* when the coordinator said the job is complete (mono_s) */
    const char *grace_env = getenv("PS_TEST_FINISH_GRACE_MS");
    const double finish_grace = grace_env ? atof(grace_env) / 1000.0 : FINISH_GRACE_S;
    const char *stop_env = getenv("PS_TEST_STOP_GRACE_MS"); /* a scale-down's SIGKILL */
    const double stop_grace = stop_env ? atof(stop_env) / 1000.0 : STOP_GRACE_S;
    int killed = 0;
    while (!(finished && nlive == 0) && !(refused && nlive == 0)) {
        if (g_sig && forwarded_at == 0) { /* forward once, then wait for everyone */
            for (int i = 0; i < nlive; i++)
                if (!stopping[i]) kill(pids[i], g_sig), stopping[i] = 1;
            for (int i = 0; i < nlive; i++) kill(pids[i], SIGCONT); /* a stopped one too */
            forwarded_at = mono_s();
            finished = 1;
        }
        if (finished_at && forwarded_at == 0 && nlive > 0 &&
            mono_s() - finished_at >= finish_grace) {
            fprintf(stderr, "pslaunch: the job is complete, and %d worker(s) still run %.0f s "
                    "later (stopped or hung): SIGTERM\n", nlive, finish_grace);
            for (int i = 0; i < nlive; i++) {
                if (!stopping[i]) kill(pids[i], SIGTERM), stopping[i] = 1;
                kill(pids[i], SIGCONT); /* a stopped one takes it */
            }
            forwarded_at = mono_s(); /* SIGKILL after STOP_GRACE_S, below */
        }
        if (forwarded_at && !killed && (g_nsig > 1 || mono_s() - forwarded_at >= STOP_GRACE_S)) {
            fprintf(stderr, "pslaunch: %s: killing the %d worker(s) still running\n",
                    g_nsig > 1 ? "a second signal" : "30 s after the SIGTERM", nlive);
            for (int i = 0; i < nlive; i++) kill(pids[i], SIGKILL);
            killed = 1;
        }
        for (int i = 0; i < nlive && !killed; i++)
            if (stop_sent[i] && mono_s() - stop_sent[i] >= stop_grace) {
                fprintf(stderr, "pslaunch: worker pid %d still runs %.0f s after its SIGTERM "
                        "(the job was scaled down; stopped or hung): SIGKILL\n", (int)pids[i],
                        stop_grace);
                kill(pids[i], SIGKILL);
                stop_sent[i] = 0;
            }
        /* refused: the ones running go on; none is started. While workers die at once, ask
         * (and start) only after the wait. */
        if (!finished && !refused && mono_s() >= hold_until) {
            int running = 0;
            for (int i = 0; i < nlive; i++) running += !stopping[i];
            ps_msg_t rep;
            int rc = launch_report(ctl, &m, host, running, nlive - running, poll_ms, 0, &rep,
                                   err, sizeof err);
            if (rc == PS_ECANCELED) { /* a stop signal waits: taken now, passed on above */
                struct timespec none = {0, 0};
                took(sigtimedwait(set, NULL, &none), nlive);
                continue;
            }
            /* It keeps asking (a coordinator restarted answers again), and says so at the
             * first failure and every 10 s, so that a cluster down or a wrong manifest is
             * seen at once. */
            time_t now = time(NULL);
            if (rc == PS_ECONFIG || ((rc == PS_EAUTH || rc == PS_EPROTO) && !answered)) {
                /* As psworker: a secret, a clock or a manifest (another cluster's, or its
                 * servers in another order) to fix at the start, not to wait out. Once it was
                 * answered, a refusal of the proof (a clock stepped) is asked again with a fresh
                 * one like any other failure; another cluster's shard 0 (started again from
                 * another manifest) stays a reason to stop. */
                fprintf(stderr, "pslaunch: %s\n", err);
                ps_req_close(ctl);
                return 2;
            }
            answered |= rc == 0;
            if (rc && silent_since == 0) silent_since = now;
            if (rc && (said == 0 || now - said >= 10)) {
                fprintf(stderr, "pslaunch: the coordinator %s (for %lld s; asking again every "
                        "%ld ms): %s\n",
                        rc == PS_ETRANSPORT || rc == PS_ETIMEDOUT ? "does not answer" : "refuses",
                        (long long)(now - silent_since), poll_ms, err);
                said = now;
            } else if (rc == 0 && silent_since) {
                fprintf(stderr, "pslaunch: the coordinator answers again after %lld s\n",
                        (long long)(now - silent_since));
                silent_since = said = 0;
            }
            if (rc == 0 && (rep.flags & PS_FLAG_FINISHED)) {
                fprintf(stderr, "pslaunch: the job is complete\n");
                finished = 1;
                finished_at = mono_s();
            } else if (rc == 0) {
                int nstarted = 0;
                for (; nstarted < rep.status && nlive < FOLLOW_MAX && !stop_pending();
                     nstarted++) {
                    long index = metrics_dir ? claim_index(metrics_dir, &next_index)
                                             : next_index++;
                    pid_t pid = spawn(worker, manifest, metrics_dir, index, 0);
                    if (pid < 0) break;
                    born[nlive] = mono_s();
                    pids[nlive] = pid;
                    stop_sent[nlive] = 0;
                    stopping[nlive++] = 0;
                }
                /* Stop the newest first: the oldest have the most warmed-up state. SIGCONT: a
                 * stopped one takes the SIGTERM (before, it stayed stopped, counted as
                 * stopping, for the rest of the job); one that does not end gets SIGKILL after
                 * STOP_GRACE_S, below. */
                for (int k = 0, i = nlive - 1; k < -rep.status && i >= 0; i--)
                    if (!stopping[i]) {
                        kill(pids[i], SIGTERM);
                        kill(pids[i], SIGCONT);
                        stopping[i] = 1;
                        stop_sent[i] = mono_s();
                        k++;
                    }
                /* A stop is for the job's members over the desired count, wherever they were
                 * started (another pslaunch, by hand), not for this host's: the reply's count
                 * is the members (an older psd sends none: at least desired + the stops). */
                uint64_t members = rep.count ? rep.count
                                             : (uint64_t)rep.workers + (uint32_t)-rep.status;
                if (rep.status > 0) /* the ones started (a full table, a failed fork: fewer) */
                    fprintf(stderr, "pslaunch: starting %d worker(s) (desired %u)%s\n",
                            nstarted, rep.workers,
                            nstarted < rep.status ? ", fewer than granted" : "");
                else if (rep.status < 0)
                    fprintf(stderr, "pslaunch: stopping %d of the %d worker(s) running here: the "
                            "job has %s%llu members, %u desired (workers started elsewhere count "
                            "too)\n", -rep.status, running, rep.count ? "" : "at least ",
                            (unsigned long long)members, rep.workers);
            }
        }
        /* Until the next poll, or sooner the next deadline above: a --poll-ms longer than the
         * graces delayed their SIGTERM and SIGKILL to the next poll (a review, session 70). */
        double wake = (double)poll_ms / 1000.0, now = mono_s();
        double due[3] = {finished_at && !forwarded_at ? finished_at + finish_grace : 0,
                         forwarded_at && !killed ? forwarded_at + STOP_GRACE_S : 0,
                         !finished && !refused && hold_until > now ? hold_until : 0};
        for (int i = 0; i < nlive && !killed; i++)
            if (stop_sent[i] && (due[0] == 0 || stop_sent[i] + stop_grace < due[0]))
                due[0] = stop_sent[i] + stop_grace;
        for (int d = 0; d < 3; d++)
            if (due[d] > 0 && due[d] - now < wake) wake = due[d] - now;
        if (wake < 0.001) wake = 0.001;
        struct timespec ts = {(time_t)wake, (long)((wake - (double)(time_t)wake) * 1e9)};
        took(sigtimedwait(set, NULL, &ts), nlive);
        int st;
        pid_t pid;
        while ((pid = waitpid(-1, &st, WNOHANG)) > 0)
            for (int i = 0; i < nlive; i++) {
                if (pids[i] != pid) continue;
                if (!stopping[i] && WIFEXITED(st) && WEXITSTATUS(st) == 2) {
                    /* psworker's code for a manifest or arguments it refuses (a cluster that
                     * does not fit, ...): every worker started would exit so. */
                    if (!refused)
                        fprintf(stderr, "pslaunch: worker pid %d refused its manifest or "
                                "arguments (exit 2; its log says why): starting no more, and "
                                "exiting 2 once the running ones end\n", (int)pid);
                    refused = 1;
                } else if (!stopping[i] && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
                    failures++;
                    fprintf(stderr, "pslaunch: worker pid %d %s %d\n", (int)pid,
                            WIFSIGNALED(st) ? "killed by signal" : "exited with",
                            WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
                    double lived = mono_s() - born[i];
                    double d = quick_death_wait(&quick, lived < 1.0 ||
                                                            (WIFEXITED(st) && lived < EARLY_S));
                    if (d > 0) {
                        hold_until = mono_s() + d;
                        fprintf(stderr, "pslaunch: workers %s of their start: the next starts in "
                                "%.1f s\n", lived < 1.0 ? "die within a second"
                                                        : "exit within 10 s", d);
                    }
                } else if (!stopping[i]) {
                    quick = 0;
                }
                /* Keep the start order (the newest last). */
                memmove(pids + i, pids + i + 1, (size_t)(nlive - i - 1) * sizeof *pids);
                memmove(stopping + i, stopping + i + 1, (size_t)(nlive - i - 1) * sizeof *stopping);
                memmove(born + i, born + i + 1, (size_t)(nlive - i - 1) * sizeof *born);
                memmove(stop_sent + i, stop_sent + i + 1,
                        (size_t)(nlive - i - 1) * sizeof *stop_sent);
                nlive--;
                break;
            }
    }
    if (answered) {
        /* Its last report: this launcher leaves (PS_FLAG_DONE). Before, it counted as one that
         * might still start what it was granted for GRANT_TTL_MS (15 s): a pslaunch run again
         * at once, after one whose workers never joined, waited that long for its first start
         * (a probe, session 67). Not waited for past the request's timeout. */
        ps_msg_t rep;
        (void)launch_report(ctl, &m, host, 0, 0, poll_ms, PS_FLAG_DONE, &rep, err, sizeof err);
    }
    ps_req_close(ctl);
    if (failures)
        fprintf(stderr, "pslaunch: %d worker(s) died%s\n", failures,
                refused ? " besides (none replaced once one refused its manifest: exit 2)"
                : g_sig ? ""
                        : " (the coordinator grants replacements while the job needs them)");
    return g_sig ? 128 + g_sig : refused ? 2 : 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: pslaunch --manifest FILE --workers N [--metrics-dir DIR] [--respawn N]\n"
               "                [--psworker PATH] [--device cpu|cuda[:N]]\n"
               "       pslaunch --manifest FILE --follow [--poll-ms MS] [--metrics-dir DIR]\n"
               "                [--psworker PATH] [--device cpu|cuda[:N]]\n"
               "Start N psworker processes; with --metrics-dir, worker i writes\n"
               "DIR/worker-i.jsonl (DIR is made if missing). With --respawn N, a worker that\n"
               "dies (a signal or a non-zero exit other than 2, psworker's code for a manifest\n"
               "or argument it refuses) is replaced, up to N times in all (the k-th replacement\n"
               "of worker i writes DIR/worker-i.k.jsonl). Exits 2 if a worker refused its\n"
               "manifest or arguments (exit 2), else 1 if a\n"
               "worker failed for good. SIGINT/SIGTERM/SIGHUP are passed on to the workers; a\n"
               "second one, or 30 s without their exit, kills (SIGKILL) the ones left; then\n"
               "pslaunch exits 128 + the signal (130, 143, 129), in both modes.\n"
               "With --follow, start and stop (SIGTERM) workers as the coordinator says until\n"
               "the job has the number `psctl scale` set (initially job.workers); exits 0 when\n"
               "the job is complete and its workers have exited, 2 when a worker refuses its\n"
               "manifest (exit 2) or shard 0 serves another cluster.\n"
               "--device is passed on to every worker (psworker --device).\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"manifest", required_argument, 0, 'm'},
                                         {"workers", required_argument, 0, 'n'},
                                         {"metrics-dir", required_argument, 0, 'd'},
                                         {"psworker", required_argument, 0, 'w'},
                                         {"respawn", required_argument, 0, 'r'},
                                         {"follow", no_argument, 0, 'f'},
                                         {"poll-ms", required_argument, 0, 'p'},
                                         {"device", required_argument, 0, 'D'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    ps_log_set_level(NULL); /* PS_LOG_LEVEL, as the other programs (its UCX and request lines) */
    const char *manifest = NULL, *metrics_dir = NULL, *worker = NULL;
    long n = -1, respawn = 0, poll_ms = 250;
    int o, follow_mode = 0, poll_set = 0;
    while ((o = getopt_long(argc, argv, "m:n:d:w:r:fp:D:h", opts, NULL)) != -1) {
        switch (o) {
        case 'D': {
            /* Checked here as psworker checks it (cpu, cuda, cuda:N with N <= 1024), so that a
             * typo fails once, not per worker. */
            const char *d = optarg;
            char *end = NULL;
            long dn = strncmp(d, "cuda:", 5) == 0 && d[5] >= '0' && d[5] <= '9'
                          ? (errno = 0, strtol(d + 5, &end, 10))
                          : -1;
            if (strcmp(d, "cpu") != 0 && strcmp(d, "cuda") != 0 &&
                (dn < 0 || dn > 1024 || errno || end == NULL || *end != '\0')) {
                fprintf(stderr, "pslaunch: --device %s: expected cpu, cuda or cuda:N\n", d);
                return 2;
            }
            g_device = d;
            break;
        }
        case 'f': follow_mode = 1; break;
        case 'p': {
            char *end;
            poll_ms = strtol(optarg, &end, 10);
            poll_set = 1;
            if (*optarg == '\0' || *end != '\0' || poll_ms < 10 || poll_ms > 600000) {
                fprintf(stderr, "pslaunch: --poll-ms %s: expected 10..600000\n", optarg);
                return 2;
            }
            break;
        }
        case 'r': {
            char *end;
            respawn = strtol(optarg, &end, 10);
            if (*optarg == '\0' || *end != '\0' || respawn < 0 || respawn > 1000000) {
                fprintf(stderr, "pslaunch: --respawn %s: expected 0..1000000\n", optarg);
                return 2;
            }
            break;
        }
        case 'm': manifest = optarg; break;
        case 'n': {
            char *end;
            n = strtol(optarg, &end, 10);
            if (*optarg == '\0' || *end != '\0' || n < 1 || n > PS_MAX_RANKS) {
                /* A job has at most PS_MAX_RANKS members: more would be refused at the join. */
                fprintf(stderr, "pslaunch: --workers %s: expected 1..%d (a job's most "
                        "workers)\n", optarg, PS_MAX_RANKS);
                return 2;
            }
            break;
        }
        case 'd': metrics_dir = optarg; break;
        case 'w': worker = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (manifest == NULL || (n < 1) == !follow_mode || optind != argc) {
        if (manifest == NULL)
            fprintf(stderr, "pslaunch: --manifest FILE is required\n");
        else if (optind != argc)
            fprintf(stderr, "pslaunch: unexpected argument '%s'\n", argv[optind]);
        else if (follow_mode)
            fprintf(stderr, "pslaunch: --workers N and --follow: one or the other\n");
        else
            fprintf(stderr, "pslaunch: --workers N or --follow is required\n");
        usage(stderr);
        return 2;
    }
    if (follow_mode && respawn) {
        fprintf(stderr, "pslaunch: --respawn is for --workers (with --follow the coordinator "
                "has a worker that died replaced)\n");
        return 2;
    }
    /* The workers' hellos name this pslaunch (libps reads PS_LAUNCHER): shard 0 tells the
     * members it runs from others on this host (server/coord_scale.c, grants_seen). Set before any
     * fork: the child calls nothing but async-signal-safe functions until its exec. */
    char me[16];
    snprintf(me, sizeof me, "%d", (int)getpid());
    setenv("PS_LAUNCHER", me, 1);
    if (!follow_mode && poll_set) {
        fprintf(stderr, "pslaunch: --poll-ms is for --follow\n");
        return 2;
    }
    if (!follow_mode) {
        /* Read as the workers will: one refused is said once, exit 2, before any worker starts
         * (a probe, session 50: pslaunch exited 1 after its psworker's exit 2). --follow reads
         * it itself. */
        static ps_manifest_t m;
        char err[1024];
        if (ps_manifest_load(&m, manifest, err, sizeof err)) {
            fprintf(stderr, "pslaunch: %s\n", err);
            return 2;
        }
        /* Its secret_file too, as each worker reads it (--follow's request client does): a
         * refused one made every worker exit 2 and pslaunch 1 (an operator probe, session 61). */
        static ps_auth_t a;
        if (m.secret_file[0] && ps_auth_load(&a, &m, err, sizeof err)) {
            fprintf(stderr, "pslaunch: %s\n", err);
            return 2;
        }
        ps_auth_wipe(&a);
    }
    char self[PATH_MAX], path[PATH_MAX + 16];
    if (worker == NULL) {
        /* psworker is installed (and built) beside pslaunch. */
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        if (len < 0) {
            fprintf(stderr, "pslaunch: /proc/self/exe: %s\n", strerror(errno));
            return 1;
        }
        self[len] = '\0';
        snprintf(path, sizeof path, "%s/psworker", dirname(self));
        worker = path;
    }
    struct stat wst;
    if (access(worker, X_OK) != 0 || stat(worker, &wst) != 0) {
        fprintf(stderr, "pslaunch: %s: %s\n", worker, strerror(errno));
        return 1;
    }
    if (!S_ISREG(wst.st_mode)) { /* a directory passed X_OK: every worker then exited 127 */
        fprintf(stderr, "pslaunch: %s is not a program (a directory?)\n", worker);
        return 2;
    }
    /* The workers' metrics files go there: made now, so that a missing one is one clear error
     * here rather than every worker failing to open its file. */
    int mrc = metrics_dir ? ps_mkdir_durable(metrics_dir) : 0;
    if (mrc) {
        fprintf(stderr, "pslaunch: --metrics-dir %s: %s\n", metrics_dir, strerror(-mrc));
        return 1;
    }
    if (metrics_dir) { /* and files can be made in it (not /proc, not read-only) */
        char probe[PATH_MAX];
        snprintf(probe, sizeof probe, "%s/.pslaunch-probe-%d", metrics_dir, (int)getpid());
        int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) {
            fprintf(stderr, "pslaunch: --metrics-dir %s: cannot make a file in it: %s\n",
                    metrics_dir, strerror(errno));
            return 1;
        }
        close(fd);
        unlink(probe);
    }
    /* Whatever the parent left: a SIGCHLD ignored would have the kernel reap the workers
     * unseen (no SIGCHLD, waitpid ECHILD: pslaunch waited for good), and a SIGPIPE (a `| tee`
     * ended by Ctrl-C) must not end pslaunch before its workers. */
    signal(SIGCHLD, SIG_DFL);
    signal(SIGPIPE, SIG_IGN);
    /* SIGINT, SIGTERM and SIGCHLD stay blocked and are taken with sigwaitinfo: no signal
     * can slip in between a check and the wait (the children get an empty mask). */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGCHLD);
    /* SIGHUP (its terminal closed) stops the workers as SIGTERM does, unless it was ignored at
     * the start (nohup): the workers inherit that ignore. Before, UCX's own handler had it
     * (ps_ucx gives it back, ucx_loop.c) and pslaunch ran on, starting replacements for the
     * workers the hangup ended. */
    if (!ps_signal_ignored(SIGHUP)) sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, NULL);

    if (follow_mode) return follow(manifest, worker, metrics_dir, poll_ms, &set);
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    double *born = calloc((size_t)n, sizeof *born); /* each worker's start (mono_s) */
    long *gen = calloc((size_t)n, sizeof *gen);     /* each worker's replacements so far */
    if (pids == NULL || born == NULL || gen == NULL) return 1;
    long started = 0;
    int quick = 0; /* replacements in a row that died within a second */
    for (long i = 0; i < n && !stop_pending(); i++) {
        born[i] = mono_s();
        if ((pids[i] = spawn(worker, manifest, metrics_dir, i, 0)) < 0) break;
        started++;
    }
    if (stop_pending()) /* ahead of SIGCHLD: a lower number */
        took(sigwaitinfo(&set, NULL), started);
    int failed = started < n && !g_sig, killed = 0;
    int refused = 0; /* a worker exited 2: psworker refused its manifest or arguments */
    double forwarded_at = 0;
    /* When waitpid last found no child exited: one reaped later died after it. Its lifetime
     * is taken as from its start to then (at most its real one): a worker reaped only after
     * another's wait (below) counted that wait as its life, and the doubling wait started
     * over at 0 for every death but the first (a review, session 70: 28 starts in 4.9 s). */
    double clear_at = mono_s();
    long left = started;
    while (left > 0) {
        if (g_sig && forwarded_at == 0) {
            for (long i = 0; i < started; i++)
                if (pids[i] > 0) kill(pids[i], g_sig), kill(pids[i], SIGCONT);
            forwarded_at = mono_s();
        }
        if (forwarded_at && !killed && (g_nsig > 1 || mono_s() - forwarded_at >= STOP_GRACE_S)) {
            fprintf(stderr, "pslaunch: %s: killing the %ld worker(s) still running\n",
                    g_nsig > 1 ? "a second signal" : "30 s after the signal", left);
            for (long i = 0; i < started; i++)
                if (pids[i] > 0) kill(pids[i], SIGKILL);
            killed = 1;
        }
        int st;
        double before = mono_s();
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid == 0) { /* nobody exited yet: sleep until a child does or a signal comes */
            clear_at = before;
            if (forwarded_at && !killed) { /* the grace's end wakes it too */
                double w = forwarded_at + STOP_GRACE_S - mono_s();
                w = w < 0.01 ? 0.01 : w;
                struct timespec ts = {(time_t)w, (long)((w - (double)(time_t)w) * 1e9)};
                took(sigtimedwait(&set, NULL, &ts), left);
            } else {
                took(sigwaitinfo(&set, NULL), left);
            }
            continue;
        }
        if (pid < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (long i = 0; i < started; i++)
            if (pids[i] == pid) {
                pids[i] = -1;
                left--;
                /* Exit 2 is psworker's for a manifest or an argument it refuses: a replacement
                 * would be refused the same way. */
                if ((!WIFEXITED(st) || (WEXITSTATUS(st) != 0 && WEXITSTATUS(st) != 2)) && !g_sig &&
                    respawn > 0) {
                    fprintf(stderr, "pslaunch: worker %ld (pid %d) %s %d; starting a replacement\n",
                            i, (int)pid, WIFSIGNALED(st) ? "killed by signal" : "exited with",
                            WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
                    respawn--;
                    double lived = clear_at > born[i] ? clear_at - born[i] : 0;
                    double d = quick_death_wait(&quick, lived < 1.0);
                    if (d > 0)
                        fprintf(stderr, "pslaunch: workers die within a second of their start: "
                                "the next starts in %.1f s\n", d);
                    for (double end = mono_s() + d, now; !g_sig && (now = mono_s()) < end;) {
                        /* Another child's exit is reaped below. Every 0.1 s: whether none
                         * exited yet (not reaping: WNOWAIT), which bounds their lives as
                         * the loop's waitpid does (clear_at). */
                        double w = end - now < 0.1 ? end - now : 0.1;
                        struct timespec ts = {(time_t)w, (long)((w - (double)(time_t)w) * 1e9)};
                        double seen = mono_s();
                        siginfo_t si = {0};
                        if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                            si.si_pid == 0)
                            clear_at = seen;
                        took(sigtimedwait(&set, NULL, &ts), left);
                    }
                    born[i] = mono_s();
                    if (!g_sig && !stop_pending() &&
                        (pids[i] = spawn(worker, manifest, metrics_dir, i, ++gen[i])) > 0) {
                        left++;
                        continue;
                    }
                }
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                    failed = 1;
                    refused |= WIFEXITED(st) && WEXITSTATUS(st) == 2;
                    if (WIFSIGNALED(st))
                        fprintf(stderr, "pslaunch: worker %ld (pid %d) killed by signal %d\n", i,
                                (int)pid, WTERMSIG(st));
                    else
                        fprintf(stderr, "pslaunch: worker %ld (pid %d) exited with %d\n", i,
                                (int)pid, WEXITSTATUS(st));
                }
            }
    }
    free(pids);
    free(born);
    free(gen);
    if (g_sig) return 128 + g_sig;
    /* As --follow: a refusal is 2, which a supervisor takes as "do not start again". */
    return refused ? 2 : failed ? 1 : 0;
}
