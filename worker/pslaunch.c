/* pslaunch.c: start N local psworker processes for a manifest, forward
 * SIGINT/SIGTERM to them, wait, and fail if any worker failed. */
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int g_sig; /* SIGINT or SIGTERM once received (forwarded to the workers) */

/* Start worker i: psworker --manifest M [--metrics-out DIR/worker-i.jsonl]. */
static pid_t spawn(const char *worker, const char *manifest, const char *metrics_dir, long i)
{
    char mpath[PATH_MAX];
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "pslaunch: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid > 0) return pid;
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (metrics_dir) {
        snprintf(mpath, sizeof mpath, "%s/worker-%ld.jsonl", metrics_dir, i);
        execl(worker, "psworker", "--manifest", manifest, "--metrics-out", mpath, (char *)NULL);
    } else {
        execl(worker, "psworker", "--manifest", manifest, (char *)NULL);
    }
    fprintf(stderr, "pslaunch: exec %s: %s\n", worker, strerror(errno));
    _exit(127);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: pslaunch --manifest FILE --workers N [--metrics-dir DIR] [--respawn N]\n"
               "                [--psworker PATH]\n"
               "Start N psworker processes; with --metrics-dir, worker i writes\n"
               "DIR/worker-i.jsonl. With --respawn N, a worker that dies (a signal or a\n"
               "non-zero exit) is replaced, up to N times in all; the replacement takes over\n"
               "its rank at the step in flight. Exits non-zero if a worker failed for good.\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"manifest", required_argument, 0, 'm'},
                                         {"workers", required_argument, 0, 'n'},
                                         {"metrics-dir", required_argument, 0, 'd'},
                                         {"psworker", required_argument, 0, 'w'},
                                         {"respawn", required_argument, 0, 'r'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *manifest = NULL, *metrics_dir = NULL, *worker = NULL;
    long n = -1, respawn = 0;
    int o;
    while ((o = getopt_long(argc, argv, "m:n:d:w:r:h", opts, NULL)) != -1) {
        switch (o) {
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
            if (*optarg == '\0' || *end != '\0' || n < 1 || n > 4096) {
                fprintf(stderr, "pslaunch: --workers %s: expected 1..4096\n", optarg);
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
    if (manifest == NULL || n < 1 || optind != argc) {
        usage(stderr);
        return 2;
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
    if (access(worker, X_OK) != 0) {
        fprintf(stderr, "pslaunch: %s: %s\n", worker, strerror(errno));
        return 1;
    }
    /* SIGINT, SIGTERM and SIGCHLD stay blocked and are taken with sigwaitinfo: no signal
     * can slip in between a check and the wait (the children get an empty mask). */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, NULL);

    pid_t *pids = calloc((size_t)n, sizeof *pids);
    if (pids == NULL) return 1;
    long started = 0;
    for (long i = 0; i < n && !g_sig; i++) {
        if ((pids[i] = spawn(worker, manifest, metrics_dir, i)) < 0) break;
        started++;
    }
    int failed = started < n, forwarded = 0;
    long left = started;
    while (left > 0) {
        if (g_sig && !forwarded) {
            for (long i = 0; i < started; i++)
                if (pids[i] > 0) kill(pids[i], g_sig);
            forwarded = 1;
        }
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid == 0) { /* nobody exited yet: sleep until a child does or a signal comes */
            int sig = sigwaitinfo(&set, NULL);
            if (sig == SIGINT || sig == SIGTERM) g_sig = sig;
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
                if ((!WIFEXITED(st) || WEXITSTATUS(st) != 0) && !g_sig && respawn > 0) {
                    fprintf(stderr, "pslaunch: worker %ld (pid %d) %s %d; starting a replacement\n",
                            i, (int)pid, WIFSIGNALED(st) ? "killed by signal" : "exited with",
                            WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
                    respawn--;
                    if ((pids[i] = spawn(worker, manifest, metrics_dir, i)) > 0) {
                        left++;
                        continue;
                    }
                }
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                    failed = 1;
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
    if (g_sig) return 128 + g_sig;
    return failed ? 1 : 0;
}
