/* proc.c: psbench's child processes, temp directory and clean-up (see proc.h). */
#include "proc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_PROCS 256

volatile sig_atomic_t pb_interrupted;

static pb_proc_t *g_procs[MAX_PROCS];
static char g_tmp[PB_PATH];
static pid_t g_main_pid;

double pb_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t pb_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- clean-up ------------------------------------------------------------------------------ */

static void on_signal(int sig)
{
    /* Only async-signal-safe work here: kill every child now, unwind later. */
    pb_interrupted = sig;
    for (int i = 0; i < MAX_PROCS; i++) {
        pb_proc_t *p = g_procs[i];
        if (p && p->pid > 0) kill(p->pid, SIGKILL);
    }
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    remove(path); /* best effort: keep going */
    return 0;
}

void pb_rm_rf(const char *dir)
{
    if (dir[0] == '\0') return;
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

void pb_proc_cleanup(void)
{
    if (getpid() != g_main_pid) return; /* a forked child between fork and exec */
    for (int i = 0; i < MAX_PROCS; i++)
        if (g_procs[i]) pb_proc_free(g_procs[i]);
    if (g_tmp[0] == '\0') return;
    const char *keep = getenv("PSBENCH_KEEP");
    if (keep && *keep && strcmp(keep, "0") != 0)
        fprintf(stderr, "psbench: PSBENCH_KEEP is set: keeping %s\n", g_tmp);
    else
        pb_rm_rf(g_tmp);
    g_tmp[0] = '\0';
}

void pb_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "psbench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    pb_proc_cleanup();
    exit(pb_interrupted ? 128 + pb_interrupted : 1);
}

void pb_proc_init(const char *root)
{
    g_main_pid = getpid();
    struct sigaction sa = {.sa_handler = on_signal}; /* no SA_RESTART: waits see EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); /* a dead client's stdin: write() fails with EPIPE instead */
    atexit(pb_proc_cleanup);
    snprintf(g_tmp, sizeof g_tmp, "%s/psbench.XXXXXX", root);
    if (mkdtemp(g_tmp) == NULL) {
        char want[PB_PATH];
        snprintf(want, sizeof want, "%s", g_tmp);
        g_tmp[0] = '\0';
        pb_die("mkdtemp %s: %s", want, strerror(errno));
    }
}

const char *pb_tmpdir(void)
{
    return g_tmp;
}

/* ---- processes ----------------------------------------------------------------------------- */

pb_proc_t *pb_spawn(const char *name, char *const argv[], char *const env_set[], bool pipe_in,
                    bool pipe_out)
{
    int slot = 0;
    while (slot < MAX_PROCS && g_procs[slot])
        slot++;
    if (slot == MAX_PROCS) pb_die("too many child processes");
    pb_proc_t *p = calloc(1, sizeof *p);
    if (p == NULL) pb_die("out of memory");
    snprintf(p->name, sizeof p->name, "%s", name);
    p->in_fd = p->out_fd = -1;
    snprintf(p->log, sizeof p->log, "%s/%s.log", g_tmp, name);
    int logfd = open(p->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (logfd < 0) pb_die("%s: %s", p->log, strerror(errno));
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    if ((pipe_in && pipe2(in, O_CLOEXEC) != 0) || (pipe_out && pipe2(out, O_CLOEXEC) != 0))
        pb_die("pipe: %s", strerror(errno));
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) pb_die("fork: %s", strerror(errno));
    if (pid == 0) {
        /* Die with psbench, however it ends. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        int nul = open("/dev/null", O_RDONLY);
        dup2(pipe_in ? in[0] : nul, 0);
        dup2(pipe_out ? out[1] : logfd, 1);
        dup2(logfd, 2);
        for (int i = 0; env_set && env_set[i]; i++)
            putenv(env_set[i]);
        execv(argv[0], argv);
        dprintf(2, "psbench: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(logfd);
    if (pipe_in) {
        close(in[0]);
        p->in_fd = in[1];
    }
    if (pipe_out) {
        close(out[1]);
        p->out_fd = out[0];
    }
    p->pid = pid;
    g_procs[slot] = p;
    return p;
}

static bool try_reap(pb_proc_t *p, int flags)
{
    if (p->pid <= 0) return true;
    int st;
    pid_t r = waitpid(p->pid, &st, flags);
    if (r == 0) return false;
    if (r < 0) {
        if (errno == EINTR) return false;
        p->status = 255; /* ECHILD: call it gone */
    } else if (WIFEXITED(st)) {
        p->status = WEXITSTATUS(st);
    } else if (WIFSIGNALED(st)) {
        p->status = 128 + WTERMSIG(st);
    } else {
        return false;
    }
    p->pid = 0;
    return true;
}

int pb_proc_wait(pb_proc_t *p, double timeout_s)
{
    double end = pb_now() + timeout_s;
    for (;;) {
        if (try_reap(p, WNOHANG)) return p->status;
        if (pb_interrupted) pb_die("interrupted");
        if (pb_now() >= end) return -1;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
}

void pb_proc_kill(pb_proc_t *p)
{
    if (p->pid <= 0) return;
    kill(p->pid, SIGKILL);
    while (!try_reap(p, 0)) {
    }
}

void pb_proc_free(pb_proc_t *p)
{
    if (p == NULL) return;
    pb_proc_kill(p);
    if (p->in_fd >= 0) close(p->in_fd);
    if (p->out_fd >= 0) close(p->out_fd);
    for (int i = 0; i < MAX_PROCS; i++)
        if (g_procs[i] == p) g_procs[i] = NULL;
    free(p);
}

int pb_proc_readline(pb_proc_t *p, char *line, size_t len, double timeout_s, bool *timed_out)
{
    double end = pb_now() + timeout_s;
    if (timed_out) *timed_out = false;
    for (;;) {
        char *nl = memchr(p->buf, '\n', p->blen);
        if (nl) {
            size_t n = (size_t)(nl - p->buf);
            size_t c = n < len - 1 ? n : len - 1;
            memcpy(line, p->buf, c);
            line[c] = '\0';
            memmove(p->buf, nl + 1, p->blen - n - 1);
            p->blen -= n + 1;
            return 0;
        }
        if (p->blen == sizeof p->buf) pb_die("%s: output line too long", p->name);
        if (p->out_fd < 0) return -1;
        if (pb_interrupted) pb_die("interrupted");
        int ms = (int)((end - pb_now()) * 1000);
        if (ms <= 0) {
            if (timed_out) *timed_out = true;
            return -1;
        }
        struct pollfd pf = {.fd = p->out_fd, .events = POLLIN};
        int r = poll(&pf, 1, ms);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) pb_die("poll: %s", strerror(errno));
        if (r == 0) continue;
        ssize_t got = read(p->out_fd, p->buf + p->blen, sizeof p->buf - p->blen);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            close(p->out_fd);
            p->out_fd = -1;
            return -1;
        }
        p->blen += (size_t)got;
    }
}

int pb_proc_write(pb_proc_t *p, const char *s)
{
    size_t len = strlen(s), off = 0;
    while (off < len) {
        ssize_t w = write(p->in_fd, s + off, len - off);
        if (w < 0 && errno == EINTR) {
            if (pb_interrupted) pb_die("interrupted");
            continue;
        }
        if (w <= 0) return -1;
        off += (size_t)w;
    }
    return 0;
}

const char *pb_proc_tail(const pb_proc_t *p, size_t max)
{
    static char out[8192];
    if (max >= sizeof out) max = sizeof out - 1;
    out[0] = '\0';
    int fd = open(p->log, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return out;
    off_t size = lseek(fd, 0, SEEK_END);
    off_t from = size > (off_t)max ? size - (off_t)max : 0;
    ssize_t n = pread(fd, out, max, from);
    close(fd);
    out[n > 0 ? n : 0] = '\0';
    return out;
}

/* ---- ports --------------------------------------------------------------------------------- */

/* Ports just below the ephemeral range are only taken on purpose (the same choice as the
 * integration tests' harness): outgoing connections and UCX's own listeners draw from the
 * ephemeral range, so a port picked there could be taken between our check and the bind. */
uint16_t pb_pick_port(void)
{
    unsigned lo = 32768, hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%u %u", &lo, &hi) != 2) lo = 32768;
        fclose(f);
    }
    unsigned top = lo > 1024 ? lo : 32768, bottom = top > 13024 ? top - 12000 : 1024;
    static unsigned seed;
    if (seed == 0) seed = (unsigned)getpid() ^ (unsigned)pb_now_ns();
    static uint16_t used[512];
    static int nused;
    for (int i = 0; i < 500; i++) {
        uint16_t want = (uint16_t)(bottom + (unsigned)rand_r(&seed) % (top - bottom));
        bool again = false;
        for (int k = 0; k < nused; k++)
            again |= used[k] == want;
        if (again) continue; /* TIME_WAIT leftovers of an earlier run of ours */
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) break;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(want)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok) {
            if (nused < (int)(sizeof used / sizeof *used)) used[nused++] = want;
            return want;
        }
    }
    pb_die("no free TCP port on 127.0.0.1");
}

bool pb_port_listening(uint16_t port)
{
    static const char *files[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(files[i], "r");
        if (f == NULL) continue;
        char line[512];
        bool found = false;
        while (!found && fgets(line, sizeof line, f)) {
            /* "  0: 0100007F:1F90 00000000:0000 0A ..." : local address, remote, state */
            char local[128], remote[128];
            unsigned st;
            if (sscanf(line, "%*s %127s %127s %x", local, remote, &st) != 3) continue;
            char *colon = strrchr(local, ':');
            if (colon && st == 0x0A && strtoul(colon + 1, NULL, 16) == port) found = true;
        }
        fclose(f);
        if (found) return true;
    }
    return false;
}
