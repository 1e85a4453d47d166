/* cluster.c: psbench's clusters on 127.0.0.1 (see cluster.h). */
#include "cluster.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "optim.h"

char *const *pb_transport_env(const char *transport)
{
    /* psd and libps set the first three themselves (PLATFORM-NOTES.md section 1); they are set
     * here too so that ucx_perftest runs with exactly the same settings. "shm" and "tcp" keep
     * every byte on the UCX transport (PS_DIRECT_PULL=0, PS_DIRECT_PUSH=0); "direct" is shm
     * with the product's default on one host: workers read their pulls from the shards' stores
     * and write their pushes into the shards' push areas. Sized as start_clients' copy reads
     * them (at most 14), which gcc -O3 checks (-Warray-bounds). */
    static char *shm[16] = {"UCX_MM_ERROR_HANDLING=y", "UCX_CMA_MEMORY_INVALIDATE=y",
                            "UCX_MM_FIFO_RELEASE_FACTOR=0", "UCX_WARN_UNUSED_ENV_VARS=n",
                            "PS_DIRECT_PULL=0", "PS_DIRECT_PUSH=0", NULL};
    static char *tcp[16] = {"UCX_MM_ERROR_HANDLING=y", "UCX_CMA_MEMORY_INVALIDATE=y",
                            "UCX_MM_FIFO_RELEASE_FACTOR=0", "UCX_WARN_UNUSED_ENV_VARS=n",
                            "UCX_TLS=tcp", "PS_DIRECT_PULL=0", "PS_DIRECT_PUSH=0", NULL};
    static char *direct[16] = {"UCX_MM_ERROR_HANDLING=y", "UCX_CMA_MEMORY_INVALIDATE=y",
                               "UCX_MM_FIFO_RELEASE_FACTOR=0", "UCX_WARN_UNUSED_ENV_VARS=n",
                               "PS_DIRECT_PULL=1", "PS_DIRECT_PUSH=1", NULL};
    if (strcmp(transport, "tcp") == 0) return tcp;
    return strcmp(transport, "direct") == 0 ? direct : shm;
}

const char *pb_transport_ucx(const char *transport)
{
    /* "ucx" is shm's settings under the name for shards on other hosts (UCX picks RDMA or tcp
     * there); on one host it is shm. */
    return strcmp(transport, "direct") == 0 || strcmp(transport, "ucx") == 0 ? "shm" : transport;
}

static int nstate_of(const char *optimizer)
{
    if (strcmp(optimizer, "momentum") == 0 || strcmp(optimizer, "adagrad") == 0) return 1;
    if (strncmp(optimizer, "adam", 4) == 0) return 2;
    return 0;
}

static void write_manifest(pb_cluster_t *cl, int id)
{
    const pb_cluster_conf_t *k = &cl->conf;
    /* Each shard holds 1/S of every tensor: parameters and optimizer state, about three copies
     * of each record under copy-on-write, plus room (the "~8x" for adam). A manifest's
     * map_size_mb is used when it is larger. */
    uint64_t total = 0;
    for (int i = 0; i < k->nsizes; i++)
        total += k->sizes[i];
    uint64_t per_shard = total / (uint64_t)k->shards + k->chunk_bytes;
    uint64_t map_mb = (per_shard * (uint64_t)(1 + nstate_of(k->optimizer)) * 4 >> 20) + 64;
    if (k->map_size_mb > map_mb) map_mb = k->map_size_mb;
    snprintf(cl->manifest, sizeof cl->manifest, "%s/manifest.yaml", cl->dir);
    FILE *f = fopen(cl->manifest, "w");
    if (f == NULL) pb_die("%s: %s", cl->manifest, strerror(errno));
    fprintf(f,
            "cluster: psbench-%ld-%d\nchunk_bytes: %" PRIu64 "\nmap_size_mb: %" PRIu64
            "\nservers:\n",
            (long)getpid(), id, k->chunk_bytes, map_mb);
    for (int i = 0; i < k->shards; i++)
        fprintf(f, "  - {host: 127.0.0.1, port: %u, data_dir: %s/data%d}\n", cl->port[i], cl->dir,
                i);
    fprintf(f,
            "job:\n"
            "  model: mlp\n"
            "  batch_size: 1\n"
            "  epochs: 1\n"
            "  workers: %d\n"
            "  consistency: %s\n"
            "  optimizer: {name: %s, lr: 0.001}\n",
            k->workers, k->consistency, k->optimizer);
    if (fclose(f) != 0) pb_die("%s: %s", cl->manifest, strerror(errno));
}

static void die_with_log(pb_cluster_t *cl, pb_proc_t *p, const char *what)
{
    (void)cl;
    pb_die("%s %s; the end of its log (%s):\n%s", p->name, what, p->log, pb_proc_tail(p, 2000));
}

/* Start the W clients on cl->manifest with the transport's environment and wait until each
 * is ready (connected, tensors declared, a member of the coordinator's step). */
static void start_clients(pb_cluster_t *cl, int id)
{
    const pb_cluster_conf_t *conf = &cl->conf;
    char *const *env = pb_transport_env(conf->transport);
    char sizes[512] = "";
    for (int i = 0, off = 0; i < conf->nsizes; i++)
        off += snprintf(sizes + off, sizeof sizes - (size_t)off, "%s%" PRIu64, i ? "," : "",
                        conf->sizes[i]);
    for (int i = 0; i < conf->workers; i++) {
        char name[32];
        snprintf(name, sizeof name, "c%d-client%d", id, i);
        char *argv[] = {(char *)conf->self, "--client", "--manifest", cl->manifest,
                        "--sizes",          sizes,      NULL};
        /* With --trace the clients' libps writes a timeline too (PS_TRACE); putenv keeps the
         * string, so each one lives in the child it is spawned into. */
        char *cenv[16];
        int ne = 0;
        for (; env && env[ne]; ne++) {
            if (ne == 14) pb_die("too many environment variables for a client");
            cenv[ne] = env[ne];
        }
        char trace[PB_PATH + 16];
        if (conf->trace_dir) {
            snprintf(trace, sizeof trace, "PS_TRACE=%s/c%d-%dx%d-%s-client%d.json",
                     conf->trace_dir, id, conf->shards, conf->workers, conf->transport, i);
            cenv[ne++] = trace;
        }
        cenv[ne] = NULL;
        cl->cli[i] = pb_spawn(name, argv, cenv, true, true);
    }
    for (int i = 0; i < conf->workers; i++) {
        char line[1024];
        if (pb_proc_readline(cl->cli[i], line, sizeof line, 120, NULL) != 0)
            die_with_log(cl, cl->cli[i], "did not become ready");
        if (strncmp(line, "ready ", 6) != 0) pb_die("%s: %s", cl->cli[i]->name, line);
        const char *l = strstr(line, " lanes: ");
        if (i == 0 && l) snprintf(cl->lanes, sizeof cl->lanes, "%s", l + 8);
    }
}

void pb_cluster_start(pb_cluster_t *cl, const pb_cluster_conf_t *conf, int id)
{
    memset(cl, 0, sizeof *cl);
    cl->conf = *conf;
    snprintf(cl->dir, sizeof cl->dir, "%s/c%d", pb_tmpdir(), id);
    if (mkdir(cl->dir, 0700) != 0) pb_die("mkdir %s: %s", cl->dir, strerror(errno));
    for (int i = 0; i < conf->shards; i++)
        cl->port[i] = pb_pick_port();
    write_manifest(cl, id);
    char *const *env = pb_transport_env(conf->transport);

    for (int i = 0; i < conf->shards; i++) {
        char name[32], shard[16];
        snprintf(name, sizeof name, "c%d-psd%d", id, i);
        snprintf(shard, sizeof shard, "%d", i);
        char trace[PB_PATH];
        char *argv[] = {(char *)conf->psd, "--manifest", cl->manifest, "--shard", shard,
                        "--log-level",     "warn",       NULL,         NULL,      NULL};
        if (conf->trace_dir) {
            snprintf(trace, sizeof trace, "%s/c%d-%dx%d-%s-shard%d.json", conf->trace_dir, id,
                     conf->shards, conf->workers, conf->transport, i);
            argv[7] = "--trace";
            argv[8] = trace;
        }
        cl->psd[i] = pb_spawn(name, argv, env, false, true);
    }
    for (int i = 0; i < conf->shards; i++) {
        char line[512], want[128];
        snprintf(want, sizeof want, "psd shard %d listening on 127.0.0.1:%u", i, cl->port[i]);
        do { /* UCX writes its warnings to stdout too: skip them */
            if (pb_proc_readline(cl->psd[i], line, sizeof line, 30, NULL) != 0)
                die_with_log(cl, cl->psd[i], "did not start");
        } while (strncmp(line, "psd shard", 9) != 0);
        if (strcmp(line, want) != 0)
            pb_die("%s said '%s', expected '%s'", cl->psd[i]->name, line, want);
    }

    start_clients(cl, id);
}

void pb_cluster_attach(pb_cluster_t *cl, const pb_cluster_conf_t *conf, const char *manifest,
                       int id)
{
    memset(cl, 0, sizeof *cl);
    cl->conf = *conf;
    cl->attached = true;
    if (snprintf(cl->manifest, sizeof cl->manifest, "%s", manifest) >= (int)sizeof cl->manifest)
        pb_die("%s: path too long", manifest);
    start_clients(cl, id);
}

/* Read one line from client @p i; die on an error line, a closed pipe or a timeout. */
static void client_line(pb_cluster_t *cl, int i, char *line, size_t len, double timeout_s)
{
    bool to;
    if (pb_proc_readline(cl->cli[i], line, len, timeout_s, &to) != 0)
        die_with_log(cl, cl->cli[i], to ? "did not answer in time" : "exited");
    if (strncmp(line, "error", 5) == 0) {
        /* The shard's side of the story is in its log. */
        for (int s = 0; s < cl->conf.shards; s++)
            if (cl->psd[s]) /* an attached cluster's logs are its own */
                fprintf(stderr, "psbench: %s log:\n%s\n", cl->psd[s]->name,
                        pb_proc_tail(cl->psd[s], 800));
        pb_die("%s: %s", cl->cli[i]->name, line);
    }
}

void pb_cluster_case(pb_cluster_t *cl, const char *op, uint64_t size, uint64_t warm,
                     double target_s, uint64_t min_iters, uint64_t max_iters, pb_case_t *out)
{
    int w = cl->conf.workers;
    char cmd[128], line[256];
    snprintf(cmd, sizeof cmd, "case %s %" PRIu64 " %" PRIu64 "\n", op, size, warm);
    for (int i = 0; i < w; i++)
        if (pb_proc_write(cl->cli[i], cmd) != 0) die_with_log(cl, cl->cli[i], "is gone");
    double mean_ns = 0;
    for (int i = 0; i < w; i++) {
        client_line(cl, i, line, sizeof line, 120);
        double m;
        if (sscanf(line, "warm %lf", &m) != 1)
            pb_die("%s: unexpected '%s'", cl->cli[i]->name, line);
        if (m > mean_ns) mean_ns = m;
    }
    uint64_t iters = mean_ns > 0 ? (uint64_t)(target_s * 1e9 / mean_ns) : max_iters;
    if (iters < min_iters) iters = min_iters;
    if (iters > max_iters) iters = max_iters;
    snprintf(cmd, sizeof cmd, "run %" PRIu64 "\n", iters);
    pb_cpustat_t cpu0, cpu1;
    pb_cpustat_read(&cpu0);
    for (int i = 0; i < w; i++)
        if (pb_proc_write(cl->cli[i], cmd) != 0) die_with_log(cl, cl->cli[i], "is gone");

    memset(out, 0, sizeof *out);
    out->iters = iters;
    out->lat_us = malloc(iters * (uint64_t)w * sizeof *out->lat_us);
    if (out->lat_us == NULL) pb_die("out of memory");
    uint64_t first = UINT64_MAX, last = 0;
    /* Generous: the warm-up said how long one iteration takes. */
    double timeout = 120 + 20 * (double)iters * mean_ns * 1e-9;
    for (int i = 0; i < w; i++) {
        static char big[262144];
        for (;;) {
            client_line(cl, i, big, sizeof big, timeout);
            if (strncmp(big, "lat", 3) == 0) {
                char *p = big + 3, *end;
                for (;;) {
                    unsigned long long v = strtoull(p, &end, 10);
                    if (end == p) break;
                    if (out->nlat < iters * (uint64_t)w) out->lat_us[out->nlat++] = (double)v / 1e3;
                    p = end;
                }
                continue;
            }
            uint64_t t0, t1, n;
            if (sscanf(big, "res %" SCNu64 " %" SCNu64 " %" SCNu64, &t0, &t1, &n) != 3)
                pb_die("%s: unexpected '%.200s'", cl->cli[i]->name, big);
            if (t0 < first) first = t0;
            if (t1 > last) last = t1;
            break;
        }
    }
    out->seconds = (double)(last - first) * 1e-9;
    /* From "run" sent to the last result: the timed iterations plus a few ms of reporting. */
    pb_cpustat_read(&cpu1);
    out->ncpu = pb_cpustat_busy(&cpu0, &cpu1, out->cpu_busy);
}

void pb_case_free(pb_case_t *c)
{
    free(c->lat_us);
    c->lat_us = NULL;
}

int pb_failed_procs;

/* Wait up to @p timeout_s for @p p to end, then free it. Killed after that is only said (slow
 * on a loaded host); an exit status other than 0 is said with its log's end and counted (a
 * crash at exit is a bug even after good measurements). */
static void stop_proc(pb_proc_t *p, double timeout_s, const char *verb)
{
    int st = pb_proc_wait(p, timeout_s);
    if (st < 0) {
        fprintf(stderr, "psbench: %s did not %s; killed\n", p->name, verb);
    } else if (st != 0) {
        fprintf(stderr, "psbench: %s exited with status %d; the end of its log:\n%s\n", p->name,
                st, pb_proc_tail(p, 1500));
        pb_failed_procs++;
    }
    pb_proc_free(p);
}

void pb_cluster_stop(pb_cluster_t *cl)
{
    for (int i = 0; i < cl->conf.workers; i++)
        if (cl->cli[i]) pb_proc_write(cl->cli[i], "quit\n");
    for (int i = 0; i < cl->conf.workers; i++) {
        if (cl->cli[i] == NULL) continue;
        stop_proc(cl->cli[i], 5, "leave");
        cl->cli[i] = NULL;
    }
    for (int i = 0; i < cl->conf.shards; i++)
        if (cl->psd[i] && cl->psd[i]->pid > 0) kill(cl->psd[i]->pid, SIGTERM);
    for (int i = 0; i < cl->conf.shards; i++) {
        if (cl->psd[i] == NULL) continue;
        stop_proc(cl->psd[i], 10, "stop");
        cl->psd[i] = NULL;
    }
    if (cl->attached) return;
    const char *keep = getenv("PSBENCH_KEEP");
    if (!(keep && *keep && strcmp(keep, "0") != 0)) pb_rm_rf(cl->dir);
}
