/* main.c: the psd command: one shard server of a cluster manifest. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "cmguard.h"
#include "manifest.h"
#include "ucx_loop.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"

int psd_server_run(const ps_manifest_t *m, const ps_auth_t *auth, uint32_t shard,
                   const char *restore, const char *trace, bool forget_floor, char *err,
                   size_t errlen);
/* SIGINT, SIGTERM and SIGHUP (those not ignored at the start) stop psd at once until the
 * serving loop sets its own handlers (server.c): call first. */
void psd_early_signals(void);

static void usage(FILE *f)
{
    fprintf(f, "usage: psd --manifest FILE --shard N [--restore DIR] [--trace FILE] "
               "[--forget-floor] [--log-level debug|info|warn|error|off]\n"
               "Serve shard N of the cluster described by FILE until SIGINT, SIGTERM or SIGHUP.\n"
               "  --restore DIR  first fill the (empty) data_dir from the checkpoint in DIR\n"
               "                 (psctl checkpoint), placing its chunks for this manifest\n"
               "  --trace FILE   write a timeline of pushes landing, apply jobs and pulls to\n"
               "                 FILE (Chrome trace format: chrome://tracing, ui.perfetto.dev)\n"
               "  --forget-floor forget the highest version of the next shard's store this one\n"
               "                 keeps (workers refuse a shard whose store went back below it):\n"
               "                 take the loss of that shard's updates since, and train on\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"manifest", required_argument, 0, 'm'},
                                         {"shard", required_argument, 0, 's'},
                                         {"log-level", required_argument, 0, 'l'},
                                         {"restore", required_argument, 0, 'r'},
                                         {"trace", required_argument, 0, 't'},
                                         {"forget-floor", no_argument, 0, 'f'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    /* From the first line: before, a signal in the arguments' or the manifest's parse took
     * its default action (exit 128 + the signal; ignored by a psd that is PID 1). */
    psd_early_signals();
    const char *manifest = NULL, *shard_s = NULL, *restore = NULL, *trace = NULL;
    bool forget_floor = false;
    ps_log_set_level(NULL);
    int o;
    while ((o = getopt_long(argc, argv, "m:s:l:r:t:h", opts, NULL)) != -1) {
        switch (o) {
        case 'm': manifest = optarg; break;
        case 's': shard_s = optarg; break;
        case 'r': restore = optarg; break;
        case 't': trace = optarg; break;
        case 'f': forget_floor = true; break;
        case 'l':
            if (ps_log_set_level(optarg)) {
                fprintf(stderr, "psd: unknown log level '%s'\n", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (manifest == NULL || shard_s == NULL || optind != argc) {
        if (optind != argc)
            fprintf(stderr, "psd: unexpected argument '%s'\n", argv[optind]);
        else
            fprintf(stderr, "psd: %s is required\n", manifest ? "--shard N" : "--manifest FILE");
        usage(stderr);
        return 2;
    }
    if (restore && restore[0] == '\0') {
        fprintf(stderr, "psd: --restore: an empty directory name\n");
        return 2;
    }
    static ps_manifest_t m;
    char err[1024];
    if (ps_manifest_load(&m, manifest, err, sizeof err)) {
        fprintf(stderr, "psd: %s\n", err);
        return 2;
    }
    char *end;
    unsigned long shard = strtoul(shard_s, &end, 10);
    if (*shard_s == '\0' || *end != '\0' || shard >= (unsigned long)m.nservers) {
        fprintf(stderr, "psd: --shard %s: the manifest %s has shards 0..%d\n", shard_s, manifest,
                m.nservers - 1);
        return 2;
    }
    static ps_auth_t auth;
    if (ps_auth_load(&auth, &m, err, sizeof err)) {
        fprintf(stderr, "psd: %s\n", err);
        return 2;
    }
    struct sockaddr_storage ss; /* before UCX listens there */
    socklen_t sslen;
    if (ps_sockaddr_resolve(m.servers[shard].host, m.servers[shard].port, &ss, &sslen) != 0) {
        /* Before the store is made: an input probe (session 63) found a fresh store left in
         * the data_dir of a psd that then failed on its host. */
        fprintf(stderr, "psd: shard %lu: cannot resolve %s to an IPv4 address (the manifest's "
                "servers[%lu].host)\n", shard, m.servers[shard].host, shard);
        ps_auth_wipe(&auth);
        return 1; /* not 2: a name not resolvable yet at boot is tried again (systemd, Slurm) */
    }
    psd_cmguard_listen((const struct sockaddr *)&ss, sslen);
    int rc = psd_server_run(&m, &auth, (uint32_t)shard, restore, trace, forget_floor, err,
                            sizeof err);
    ps_auth_wipe(&auth);
    if (rc) {
        fprintf(stderr, "psd: shard %lu: %s\n", shard, err);
        return 1;
    }
    return 0;
}
