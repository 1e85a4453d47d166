/* cluster.c: the integration tests' harness (see cluster.h). */
#include "cluster.h"

#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_DATASET "/usr/share/datasets/fashion-mnist"

static char g_base[CL_PATH];    /* the unchecked fixture's dir; inherited by tests */
static cl_cluster_t *g_live[8]; /* clusters the atexit handler must clean up */
static bool g_atexit_done;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static bool keep_dirs(void)
{
    const char *k = getenv("PS_INTEG_KEEP");
    return k && *k && strcmp(k, "0") != 0;
}

/* dir/name into out; a path that does not fit fails the test. */
static void path_join(char *out, size_t len, const char *dir, const char *name)
{
    int n = snprintf(out, len, "%s/%s", dir, name);
    ck_assert_msg(n >= 0 && (size_t)n < len, "path too long: %s/%s", dir, name);
}

/* ---- rm -rf -------------------------------------------------------------------------------- */

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    remove(path); /* best effort: keep going */
    return 0;
}

static void rm_rf(const char *dir)
{
    if (dir[0] == '\0') return;
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- fixture ------------------------------------------------------------------------------- */

static const char *tmp_root(void)
{
    const char *t = getenv("TMPDIR");
    return t && *t ? t : "/tmp";
}

void cl_base_setup(void)
{
    snprintf(g_base, sizeof g_base, "%s/psd-integ.XXXXXX", tmp_root());
    if (mkdtemp(g_base) == NULL) {
        fprintf(stderr, "cluster: mkdtemp %s: %s\n", g_base, strerror(errno));
        g_base[0] = '\0';
        return;
    }
    /* The workers' decoded dataset copy (worker/dscache.h) goes with the rest, removed at the
     * end: the first worker of a test writes it, the others map it. */
    setenv("PS_DATASET_CACHE", g_base, 1);
}

/* The last lines of @p path on stderr, under a header naming it. */
static void print_tail(const char *path, int max_lines)
{
    size_t len = 0;
    char *s = cl_read_file(path, &len);
    if (s == NULL) return;
    const char *from = s + len; /* back to the start of its max_lines-th line from the end */
    int lines = 0;
    if (from > s && from[-1] == '\n') from--;
    while (from > s && (from[-1] != '\n' || ++lines < max_lines)) from--;
    fprintf(stderr, "--- the last lines of %s ---\n%s%s", path, from,
            len && s[len - 1] != '\n' ? "\n" : "");
    free(s);
}

/* A test that ends cleanly destroys its clusters (their directories with them), so a cluster
 * directory still here belongs to a test that failed: print each psd's last log lines (CI
 * keeps no files), to tell a psd that died or said why from a test's own mistake. */
static void report_left_clusters(void)
{
    DIR *d = opendir(g_base);
    if (d == NULL) return;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, "cluster.", 8) != 0) continue;
        char cdir[CL_PATH];
        path_join(cdir, sizeof cdir, g_base, e->d_name);
        DIR *cd = opendir(cdir);
        if (cd == NULL) continue;
        for (struct dirent *f; (f = readdir(cd)) != NULL;) {
            size_t n = strlen(f->d_name);
            if (strncmp(f->d_name, "psd", 3) != 0 || n < 5 || strcmp(f->d_name + n - 4, ".log"))
                continue;
            char log[CL_PATH];
            path_join(log, sizeof log, cdir, f->d_name);
            print_tail(log, 12);
        }
        closedir(cd);
    }
    closedir(d);
}

void cl_base_teardown(void)
{
    if (g_base[0] == '\0') return;
    report_left_clusters();
    if (keep_dirs()) {
        fprintf(stderr, "cluster: PS_INTEG_KEEP is set: keeping %s\n", g_base);
    } else {
        /* After a failed test its children are dying of PDEATHSIG right now; give a straggler
         * that still held a file open a moment, then try again. */
        struct stat st;
        for (int i = 0; i < 50 && (rm_rf(g_base), stat(g_base, &st) == 0); i++)
            sleep_ms(20);
    }
    g_base[0] = '\0';
}

/* ---- ports --------------------------------------------------------------------------------- */

/* Bind 127.0.0.1:port (0 = any) without SO_REUSEADDR, as psd's listener does; the socket stays
 * open so that one cluster never gets the same port twice. Returns the fd, or -1. */
static int bind_port(uint16_t port, uint16_t *bound)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        close(fd);
        return -1;
    }
    *bound = ntohs(a.sin_port);
    return fd;
}

int cl_hold_port(uint16_t port)
{
    uint16_t bound;
    int fd = bind_port(port, &bound);
    ck_assert_msg(fd >= 0, "cannot bind 127.0.0.1:%u: %s", port, strerror(errno));
    return fd;
}

int cl_tcp_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_msg(connect(fd, (struct sockaddr *)&a, sizeof a) == 0,
                  "connect to 127.0.0.1:%u: %s", port, strerror(errno));
    return fd;
}

/* A free TCP port on 127.0.0.1. Port 0 would hand out an ephemeral port, the same range every
 * outgoing connection and every UCX listener on the machine draws from, so one could take it
 * between our close() and psd's bind(). Ports just below the ephemeral range are only taken on
 * purpose; each pick is checked by binding it. Port 0 remains the fallback. */
static int pick_port(uint16_t *port)
{
    unsigned lo = 32768, hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%u %u", &lo, &hi) != 2) lo = 32768;
        fclose(f);
    }
    unsigned top = lo > 1024 ? lo : 32768, bottom = top > 13024 ? top - 12000 : 1024;
    static unsigned seed;
    if (seed == 0) seed = (unsigned)getpid() ^ (unsigned)(uint64_t)(now_s() * 1e6);
    for (int i = 0; i < 200; i++) {
        uint16_t want = (uint16_t)(bottom + (unsigned)rand_r(&seed) % (top - bottom)), got;
        int fd = bind_port(want, &got);
        if (fd >= 0) {
            *port = got;
            return fd;
        }
    }
    return bind_port(0, port);
}

/* ---- manifest ------------------------------------------------------------------------------ */

static void fill_defaults(cl_conf_t *k)
{
    if (k->shards <= 0) k->shards = 1;
    if (k->workers == 0) k->workers = 1;
    if (k->consistency == NULL) k->consistency = "bsp";
    if (k->optimizer == NULL) k->optimizer = "{name: sgd, lr: 0.05}";
    if (k->layers == NULL) k->layers = "[784, 256, 128, 10]";
    if (k->batch_size == 0) k->batch_size = 64;
    if (k->epochs == 0) k->epochs = 1;
    if (k->chunk_bytes == 0) k->chunk_bytes = 65536;
    /* 256 MiB: a checkpoint's copy or a frozen reader keeps its snapshot's pages while training
     * goes on, each step's copy-on-write taking new ones; with the suites run two at a time one
     * copy took 4.2 s, and 70 steps filled 64 MiB ("the shard store is full"). The file grows
     * only as pages are used. */
    if (k->map_size_mb == 0) k->map_size_mb = 256;
}

void cl_manifest_write(cl_cluster_t *c, const char *file, const cl_conf_t *conf, char *path,
                       size_t len)
{
    cl_conf_t k = *conf;
    fill_defaults(&k);
    ck_assert_msg(k.shards <= c->conf.shards, "a manifest may name at most the cluster's %d shards",
                  c->conf.shards);
    path_join(path, len, c->dir, file);
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "cannot write %s: %s", path, strerror(errno));
    const char *ds = getenv("PS_DATASET");
    fprintf(f, "cluster: %s\nchunk_bytes: %llu\nmap_size_mb: %llu\nservers:\n", c->cluster_name,
            (unsigned long long)k.chunk_bytes, (unsigned long long)k.map_size_mb);
    for (int i = 0; i < k.shards; i++)
        if (k.metrics)
            fprintf(f, "  - {host: 127.0.0.1, port: %u, metrics_port: %u, data_dir: %s}\n",
                    c->port[i], c->metrics_port[i], c->data_dir[i]);
        else
            fprintf(f, "  - {host: 127.0.0.1, port: %u, data_dir: %s}\n", c->port[i],
                    c->data_dir[i]);
    fputs(k.top_extra ? k.top_extra : "", f);
    fprintf(f,
            "job:\n"
            "  model: mlp\n"
            "  layers: %s\n"
            "  dataset: %s\n"
            "  batch_size: %u\n"
            "  epochs: %u\n"
            "  seed: %llu\n"
            "  workers: %u\n"
            "  consistency: %s\n"
            "  max_steps: %llu\n"
            "  optimizer: %s\n"
            "%s",
            k.layers, ds && *ds ? ds : DEFAULT_DATASET, k.batch_size, k.epochs,
            (unsigned long long)(k.seed ? k.seed : 1), k.workers, k.consistency, (unsigned long long)k.max_steps, k.optimizer,
            k.job_extra ? k.job_extra : "");
    if (k.start_wait_ms) fprintf(f, "  start_wait_ms: %u\n", k.start_wait_ms);
    ck_assert_msg(fclose(f) == 0, "cannot write %s: %s", path, strerror(errno));
}

/* ---- cluster ------------------------------------------------------------------------------- */

static void on_exit_cleanup(void)
{
    for (size_t i = 0; i < sizeof g_live / sizeof *g_live; i++)
        if (g_live[i]) cl_cluster_destroy(g_live[i]);
}

cl_cluster_t *cl_cluster_create(const cl_conf_t *conf)
{
    if (!g_atexit_done) {
        atexit(on_exit_cleanup);
        g_atexit_done = true;
    }
    on_exit_cleanup(); /* what a failed test left in this process (CK_FORK=no) */
    /* If Check's parent dies (meson's timeout), take this test process down too: its children
     * then follow through their own PDEATHSIG. */
    if (getppid() != 1) prctl(PR_SET_PDEATHSIG, SIGKILL);

    cl_cluster_t *c = calloc(1, sizeof *c);
    ck_assert_msg(c != NULL, "out of memory");
    size_t slot = 0;
    while (slot < sizeof g_live / sizeof *g_live && g_live[slot])
        slot++;
    ck_assert_msg(slot < sizeof g_live / sizeof *g_live, "too many live clusters");
    g_live[slot] = c;

    c->conf = *conf;
    fill_defaults(&c->conf);
    ck_assert_msg(c->conf.shards <= CL_MAX_SHARDS, "at most %d shards", CL_MAX_SHARDS);
    const char *b = getenv("PS_INTEG_BUDGET_S");
    c->deadline = now_s() + (b && atof(b) > 0 ? atof(b) : CL_BUDGET_S);

    path_join(c->dir, sizeof c->dir, g_base[0] ? g_base : tmp_root(), "cluster.XXXXXX");
    ck_assert_msg(mkdtemp(c->dir) != NULL, "mkdtemp %s: %s", c->dir, strerror(errno));
    snprintf(c->cluster_name, sizeof c->cluster_name, "itest-%ld-%s", (long)getpid(),
             strrchr(c->dir, '.') + 1);

    int fds[CL_MAX_SHARDS], mfds[CL_MAX_SHARDS];
    for (int i = 0; i < c->conf.shards; i++) {
        fds[i] = pick_port(&c->port[i]);
        ck_assert_msg(fds[i] >= 0, "no free TCP port on 127.0.0.1: %s", strerror(errno));
        mfds[i] = c->conf.metrics ? pick_port(&c->metrics_port[i]) : -1;
        ck_assert_msg(!c->conf.metrics || mfds[i] >= 0, "no free TCP port on 127.0.0.1: %s",
                      strerror(errno));
        char name[16];
        snprintf(name, sizeof name, "data%d", i);
        path_join(c->data_dir[i], sizeof c->data_dir[i], c->dir, name);
    }
    for (int i = 0; i < c->conf.shards; i++) {
        close(fds[i]);
        if (mfds[i] >= 0) close(mfds[i]);
    }
    cl_manifest_write(c, "manifest.yaml", &c->conf, c->manifest, sizeof c->manifest);
    return c;
}

void cl_cluster_destroy(cl_cluster_t *c)
{
    if (c == NULL) return;
    for (int i = 0; i < c->nprocs; i++) {
        cl_proc_t *p = &c->procs[i];
        if (!p->reaped) {
            kill(p->pid, SIGKILL);
            int st;
            while (waitpid(p->pid, &st, 0) < 0 && errno == EINTR) {
            }
            p->reaped = true;
            p->status = 128 + SIGKILL;
        }
        if (p->out_fd >= 0) close(p->out_fd);
        p->out_fd = -1;
    }
    if (keep_dirs())
        fprintf(stderr, "cluster: PS_INTEG_KEEP is set: keeping %s\n", c->dir);
    else
        rm_rf(c->dir);
    for (size_t i = 0; i < sizeof g_live / sizeof *g_live; i++)
        if (g_live[i] == c) g_live[i] = NULL;
    free(c);
}

double cl_left(const cl_cluster_t *c)
{
    double left = c->deadline - now_s();
    return left > 0 ? left : 0;
}

/* ---- processes ----------------------------------------------------------------------------- */

const char *cl_binary(const char *var)
{
    const char *p = getenv(var);
    ck_assert_msg(p != NULL && *p, "%s is not set: run the tests through meson", var);
    return p;
}

/* Fork and exec argv[0] with stdin from /dev/null, stdout to @p out_fd, stderr to the log. */
static cl_proc_t *spawn(cl_cluster_t *c, const char *name, char *const argv[], bool pipe_stdout)
{
    ck_assert_msg(c->nprocs < CL_MAX_PROCS, "too many processes");
    cl_proc_t *p = &c->procs[c->nprocs];
    memset(p, 0, sizeof *p);
    p->c = c;
    p->out_fd = -1;
    snprintf(p->name, sizeof p->name, "%s", name);
    char file[48], log[sizeof p->log]; /* not into p->log at once: c holds both (gcc -O3's
                                           -Wrestrict) */
    snprintf(file, sizeof file, "%s.log", name);
    path_join(log, sizeof log, c->dir, file);
    memcpy(p->log, log, sizeof log);
    int logfd = open(p->log, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    ck_assert_msg(logfd >= 0, "%s: %s", p->log, strerror(errno));
    int pfd[2] = {-1, -1};
    if (pipe_stdout) ck_assert_msg(pipe2(pfd, O_CLOEXEC) == 0, "pipe: %s", strerror(errno));
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        /* Die with the test process, whatever way it ends. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) dup2(nul, 0);
        dup2(pipe_stdout ? pfd[1] : logfd, 1);
        dup2(logfd, 2);
        setenv("OPENBLAS_NUM_THREADS", "1", 0);
        execv(argv[0], argv);
        dprintf(2, "cluster: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(logfd);
    if (pipe_stdout) {
        close(pfd[1]);
        p->out_fd = pfd[0];
    }
    p->pid = pid;
    c->nprocs++;
    return p;
}

cl_proc_t *cl_psd_spawn(cl_cluster_t *c, int shard, const char *manifest)
{
    return cl_psd_spawn_with(c, shard, manifest, NULL);
}

cl_proc_t *cl_psd_spawn_with(cl_cluster_t *c, int shard, const char *manifest,
                             const char *const *extra)
{
    int again = 0;
    for (int i = 0; i < c->nprocs; i++)
        if (strncmp(c->procs[i].name, "psd", 3) == 0 && atoi(c->procs[i].name + 3) == shard)
            again++;
    char name[32], shard_s[16];
    if (again)
        snprintf(name, sizeof name, "psd%d.%d", shard, again);
    else
        snprintf(name, sizeof name, "psd%d", shard);
    snprintf(shard_s, sizeof shard_s, "%d", shard);
    char *argv[16] = {(char *)cl_binary("PSD"),
                      "--manifest",
                      (char *)(manifest ? manifest : c->manifest),
                      "--shard",
                      shard_s,
                      "--log-level",
                      getenv("PS_LOG_LEVEL") ? getenv("PS_LOG_LEVEL") : "info",
                      NULL};
    for (int i = 7, k = 0; extra && extra[k]; i++, k++) {
        ck_assert_msg(i < 15, "cl_psd_spawn_with: more than 8 extra arguments");
        argv[i] = (char *)extra[k];
    }
    return spawn(c, name, argv, true);
}

int cl_psd_wait_ready(cl_proc_t *p, double timeout_s)
{
    if (timeout_s > cl_left(p->c)) timeout_s = cl_left(p->c);
    double end = now_s() + timeout_s;
    char line[512];
    size_t n = 0;
    while (p->out_fd >= 0) {
        int ms = (int)((end - now_s()) * 1000);
        if (ms <= 0) return -1;
        struct pollfd pf = {.fd = p->out_fd, .events = POLLIN};
        int r = poll(&pf, 1, ms);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        ssize_t got = read(p->out_fd, line + n, 1); /* byte by byte: only the first line */
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1; /* it closed stdout: it is exiting */
        if (line[n] != '\n') {
            if (n + 2 < sizeof line) n++;
            continue;
        }
        line[n] = '\0';
        /* "psd shard N listening on HOST:PORT" */
        int shard = atoi(p->name + 3);
        const cl_cluster_t *c = p->c;
        char want[128];
        snprintf(want, sizeof want, "psd shard %d listening on 127.0.0.1:%u", shard,
                 c->port[shard]);
        return strcmp(line, want) == 0 ? 0 : -1;
    }
    return -1;
}

cl_proc_t *cl_psd_start(cl_cluster_t *c, int shard, const char *manifest, double timeout_s)
{
    cl_proc_t *p = cl_psd_spawn(c, shard, manifest);
    if (cl_psd_wait_ready(p, timeout_s) != 0) {
        /* Let it finish writing why, if it is exiting. */
        int st = cl_wait(p, 2);
        ck_abort_msg("%s did not become ready (exit status %d, -1 = still running); its log: %s",
                     p->name, st, cl_tail(p));
    }
    return p;
}

cl_cluster_t *cl_stopped_reader_start(bool metrics, cl_proc_t **psd, cl_proc_t *w[2])
{
    cl_conf_t k = {.shards = 1, .workers = 2, .batch_size = 16, .epochs = 2, .map_size_mb = 16,
                   .metrics = metrics,
                   .job_extra = "  heartbeat_timeout_ms: 500\n  train_samples: 12000\n",
                   .start_wait_ms = CL_TOGETHER_MS};
    cl_cluster_t *c = cl_cluster_create(&k);
    *psd = cl_psd_start(c, 0, NULL, 30.0);
    w[0] = cl_worker_start(c, NULL, NULL, false);
    setenv("PS_TEST_DIRECT_STOP", "300", 1); /* this worker's only */
    w[1] = cl_worker_start(c, NULL, NULL, false);
    unsetenv("PS_TEST_DIRECT_STOP");
    return c;
}

cl_proc_t *cl_psd_start_env(cl_cluster_t *c, int shard, double timeout_s, const char *name,
                            const char *value)
{
    if (value) setenv(name, value, 1);
    cl_proc_t *p = cl_psd_spawn(c, shard, NULL);
    if (value) unsetenv(name); /* the spawned psd has its copy */
    if (cl_psd_wait_ready(p, timeout_s) != 0) {
        int st = cl_wait(p, 2);
        ck_abort_msg("%s did not become ready (exit status %d, -1 = still running); its log: %s",
                     p->name, st, cl_tail(p));
    }
    return p;
}

void cl_restore_start(cl_cluster_t *c, const char *manifest, int n, const char *dir,
                      cl_proc_t **psd, double timeout_s)
{
    for (int i = 0; i < n; i++) {
        char shard[16], name[48];
        snprintf(shard, sizeof shard, "%d", i);
        char *argv[] = {(char *)cl_binary("PSD"), "--manifest", (char *)manifest, "--shard", shard,
                        "--restore", (char *)dir, "--log-level", "info", NULL};
        snprintf(name, sizeof name, "restored%d-%d", n, i);
        psd[i] = cl_spawn(c, name, argv);
    }
    for (int i = 0; i < n; i++)
        ck_assert_msg(cl_wait_log(psd[i], "listening on", timeout_s) == 0,
                      "%s did not start: %s", psd[i]->name, cl_tail(psd[i]));
}

void cl_data_dirs_aside(cl_cluster_t *c, const char *tag)
{
    for (int i = 0; i < c->conf.shards; i++) {
        char to[CL_PATH + 32];
        snprintf(to, sizeof to, "%s.%s", c->data_dir[i], tag);
        rename(c->data_dir[i], to);
    }
}

cl_proc_t *cl_worker_start(cl_cluster_t *c, const char *manifest, const char *params, bool local)
{
    return cl_worker_spawn(c, manifest, params, local, NULL);
}

cl_proc_t *cl_worker_spawn(cl_cluster_t *c, const char *manifest, const char *params, bool local,
                           const char *const *extra)
{
    char name[32], params_path[CL_PATH];
    snprintf(name, sizeof name, "worker%d", c->nworkers_started++);
    char *argv[24];
    int k = 0;
    argv[k++] = (char *)cl_binary("PSWORKER");
    argv[k++] = "--manifest";
    argv[k++] = (char *)(manifest ? manifest : c->manifest);
    if (params) {
        path_join(params_path, sizeof params_path, c->dir, params);
        argv[k++] = "--params-out";
        argv[k++] = params_path;
    }
    if (local) argv[k++] = "--local";
    for (int i = 0; extra && extra[i]; i++) {
        ck_assert_msg(k + 1 < (int)(sizeof argv / sizeof *argv), "too many worker arguments");
        argv[k++] = (char *)extra[i];
    }
    argv[k] = NULL;
    cl_proc_t *p = spawn(c, name, argv, false);
    if (params) snprintf(p->params, sizeof p->params, "%s", params_path);
    return p;
}

cl_proc_t *cl_spawn(cl_cluster_t *c, const char *name, char *const argv[])
{
    return spawn(c, name, argv, false);
}

void cl_path(const cl_cluster_t *c, const char *file, char *out, size_t len)
{
    path_join(out, len, c->dir, file);
}

static bool try_reap(cl_proc_t *p)
{
    if (p->reaped) return true;
    int st;
    pid_t r = waitpid(p->pid, &st, WNOHANG);
    if (r == 0 || (r < 0 && errno == EINTR)) return false;
    if (r < 0) /* ECHILD: cannot happen for our own children; call it gone */
        p->status = 255;
    else if (WIFEXITED(st))
        p->status = WEXITSTATUS(st);
    else if (WIFSIGNALED(st))
        p->status = 128 + WTERMSIG(st);
    else
        return false;
    p->reaped = true;
    if (p->out_fd >= 0) close(p->out_fd);
    p->out_fd = -1;
    return true;
}

int cl_wait(cl_proc_t *p, double timeout_s)
{
    if (timeout_s > cl_left(p->c)) timeout_s = cl_left(p->c);
    double end = now_s() + timeout_s;
    for (;;) {
        if (try_reap(p)) return p->status;
        if (now_s() >= end) return -1;
        sleep_ms(10);
    }
}

bool cl_alive(cl_proc_t *p)
{
    return !try_reap(p);
}

int cl_signal(cl_proc_t *p, int sig)
{
    if (p->reaped) return -ESRCH;
    return kill(p->pid, sig) == 0 ? 0 : -errno;
}

int cl_wait_log(cl_proc_t *p, const char *needle, double timeout_s)
{
    if (timeout_s > cl_left(p->c)) timeout_s = cl_left(p->c);
    double end = now_s() + timeout_s;
    for (;;) {
        /* Check exit first, so a last line written just before exiting is still seen. */
        bool gone = !cl_alive(p);
        char *s = cl_log(p);
        bool found = strstr(s, needle) != NULL;
        free(s);
        if (found) return 0;
        if (gone || now_s() >= end) return -1;
        sleep_ms(20);
    }
}

/* ---- files --------------------------------------------------------------------------------- */

void cl_manifest_other_cluster(cl_cluster_t *c, char *out)
{
    cl_path(c, "other.yaml", out, CL_PATH);
    char *text = cl_read_file(c->manifest, NULL);
    const char *at = text ? strstr(text, "cluster: ") : NULL;
    ck_assert_ptr_nonnull(at);
    FILE *f = fopen(out, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%.*scluster: other-%s", (int)(at - text), text, at + strlen("cluster: "));
    fclose(f);
    free(text);
}

char *cl_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        char *nb = realloc(buf, cap * 2);
        if (nb == NULL) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int err = ferror(f) ? EIO : 0;
    fclose(f);
    if (buf == NULL || err) {
        free(buf);
        errno = err ? err : ENOMEM;
        return NULL;
    }
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

char *cl_log(const cl_proc_t *p)
{
    char *s = cl_read_file(p->log, NULL);
    if (s == NULL) s = strdup("");
    ck_assert_msg(s != NULL, "out of memory");
    return s;
}

const char *cl_tail(const cl_proc_t *p)
{
    static char bufs[4][1600];
    static int next;
    char *out = bufs[next];
    next = (next + 1) % 4;
    size_t len = 0;
    char *s = cl_read_file(p->log, &len);
    if (s == NULL) {
        snprintf(out, sizeof bufs[0], "(%s: %s)", p->log, strerror(errno));
        return out;
    }
    /* One line: a TAP "not ok" line must not be broken by the log's newlines. */
    size_t keep = 1200, o = 0;
    const char *from = len > keep ? s + len - keep : s;
    if (len > keep) o += (size_t)snprintf(out, sizeof bufs[0], "... ");
    for (; *from && o + 4 < sizeof bufs[0]; from++) {
        if (*from == '\n') {
            if (from[1]) out[o++] = ' ', out[o++] = '|', out[o++] = ' ';
        } else {
            out[o++] = *from;
        }
    }
    out[o] = '\0';
    free(s);
    return out;
}

int cl_line_of(const char *path, const char *needle)
{
    char *s = cl_read_file(path, NULL);
    if (s == NULL) return 0;
    int line = 0;
    char *hit = strstr(s, needle);
    if (hit) {
        line = 1;
        for (char *q = s; q < hit; q++)
            line += *q == '\n';
    }
    free(s);
    return line;
}

/* ---- PSPARAM1 ------------------------------------------------------------------------------ */

void cl_params_free(cl_params_t *p)
{
    for (uint32_t i = 0; p->t && i < p->ntensors; i++)
        free(p->t[i].v);
    free(p->t);
    memset(p, 0, sizeof *p);
}

int cl_params_read(cl_params_t *p, const char *path, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    size_t len;
    char *buf = cl_read_file(path, &len);
    if (buf == NULL) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    size_t off = 0;
#define TAKE(dst, n)                                                                               \
    do {                                                                                           \
        if (len - off < (size_t)(n)) goto short_file;                                              \
        memcpy((dst), buf + off, (n));                                                             \
        off += (n);                                                                                \
    } while (0)
    char magic[8];
    TAKE(magic, 8);
    if (memcmp(magic, "PSPARAM1", 8) != 0) {
        snprintf(err, errlen, "%s: not a PSPARAM1 file", path);
        goto fail;
    }
    TAKE(&p->step, 8);
    TAKE(&p->ntensors, 4);
    if (p->ntensors > 1024) {
        snprintf(err, errlen, "%s: %u tensors?", path, p->ntensors);
        goto fail;
    }
    p->t = calloc(p->ntensors ? p->ntensors : 1, sizeof *p->t);
    if (p->t == NULL) goto oom;
    for (uint32_t i = 0; i < p->ntensors; i++) {
        cl_tensor_t *t = &p->t[i];
        uint32_t nlen;
        TAKE(&nlen, 4);
        if (nlen >= sizeof t->name) {
            snprintf(err, errlen, "%s: tensor %u: name of %u bytes", path, i, nlen);
            goto fail;
        }
        TAKE(t->name, nlen);
        TAKE(&t->numel, 8);
        if (t->numel > (len - off) / 4) goto short_file;
        t->v = malloc(t->numel ? t->numel * 4 : 4);
        if (t->v == NULL) goto oom;
        TAKE(t->v, t->numel * 4);
    }
    if (off != len) {
        snprintf(err, errlen, "%s: %zu bytes after the last tensor", path, len - off);
        goto fail;
    }
#undef TAKE
    free(buf);
    return 0;
short_file:
    snprintf(err, errlen, "%s: truncated at byte %zu of %zu", path, off, len);
    goto fail;
oom:
    snprintf(err, errlen, "%s: out of memory", path);
fail:
    free(buf);
    cl_params_free(p);
    return -1;
}

int cl_params_compare_files(const char *a, const char *b, double rtol, double atol, char *why,
                            size_t len)
{
    cl_params_t pa, pb;
    if (cl_params_read(&pa, a, why, len)) return -1;
    if (cl_params_read(&pb, b, why, len)) {
        cl_params_free(&pa);
        return -1;
    }
    int rc = 1;
    if (pa.step != pb.step) {
        snprintf(why, len, "step %llu in %s, %llu in %s", (unsigned long long)pa.step, a,
                 (unsigned long long)pb.step, b);
        goto out;
    }
    if (pa.ntensors != pb.ntensors) {
        snprintf(why, len, "%u tensors in %s, %u in %s", pa.ntensors, a, pb.ntensors, b);
        goto out;
    }
    for (uint32_t i = 0; i < pa.ntensors; i++) {
        const cl_tensor_t *x = &pa.t[i], *y = &pb.t[i];
        if (strcmp(x->name, y->name) != 0 || x->numel != y->numel) {
            snprintf(why, len, "tensor %u is '%s' (%llu values) in %s, '%s' (%llu) in %s", i,
                     x->name, (unsigned long long)x->numel, a, y->name,
                     (unsigned long long)y->numel, b);
            goto out;
        }
        uint64_t bad = 0, first = 0;
        double worst = 0;
        for (uint64_t k = 0; k < x->numel; k++) {
            double u = x->v[k], v = y->v[k], d = fabs(u - v);
            double lim = atol + rtol * fmax(fabs(u), fabs(v));
            if (!(d <= lim)) { /* also catches NaN */
                if (bad++ == 0) first = k;
                if (!(d <= worst)) worst = d;
            }
        }
        if (bad) {
            snprintf(why, len,
                     "%s: %llu of %llu values differ beyond rtol %g atol %g; first at [%llu]: "
                     "%.9g vs %.9g; largest difference %.3g",
                     x->name, (unsigned long long)bad, (unsigned long long)x->numel, rtol, atol,
                     (unsigned long long)first, x->v[first], y->v[first], worst);
            goto out;
        }
    }
    rc = 0;
    snprintf(why, len, "equal");
out:
    cl_params_free(&pa);
    cl_params_free(&pb);
    return rc;
}
