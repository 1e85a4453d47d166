/* psworker.c: the psworker command: joins a psd cluster and trains the
 * manifest's job (the built-in mlp on Fashion-MNIST), or with --local trains
 * the same global batches in one process as a reference. */
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fmnist.h"
#include "local.h"
#include "manifest.h"
#include "mlp.h"
#include "optim.h"
#include "ps/ps_client.h"
#include "ps/ps_log.h"

typedef struct {
    const ps_manifest_t *m;
    ps_mlp_t mlp;
    ps_client_t *client;     /* NULL with --local */
    uint32_t ids[PS_MLP_MAX_TENSORS];
    ps_op_t *push_ops[PS_MLP_MAX_TENSORS];
    uint64_t step;
    int failed;
    char err[512];
    ps_local_t local;        /* --local: the cluster's work done in-process */
} trainer_t;

static volatile sig_atomic_t g_stop;
static ps_client_t *volatile g_client;
/* The step in flight is abandoned: its waits return at once and the worker leaves. */
static void on_signal(int sig)
{
    g_stop = sig;
    if (g_client) ps_client_interrupt(g_client);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Backward-pass callback: push each tensor's gradient as soon as it exists. */
static void push_grad(int t, void *arg)
{
    trainer_t *tr = arg;
    if (tr->client == NULL || tr->failed) return;
    int rc = ps_client_push(tr->client, tr->ids[t], tr->mlp.grads[t], tr->step, &tr->push_ops[t]);
    if (rc) {
        tr->failed = rc;
        tr->push_ops[t] = NULL;
        snprintf(tr->err, sizeof tr->err, "push of %s: %s", tr->mlp.tensors[t].name,
                 ps_client_error(tr->client));
    }
}

static int wait_op(trainer_t *tr, ps_op_t **op, const char *what, int t, uint64_t *version)
{
    if (*op == NULL) return 0;
    int rc = ps_op_wait(*op, version);
    *op = NULL;
    if (rc && !tr->failed) {
        tr->failed = rc;
        snprintf(tr->err, sizeof tr->err, "%s of %s: %s", what, tr->mlp.tensors[t].name,
                 ps_client_error(tr->client));
    }
    return rc;
}

/* Pull every tensor at version >= min_version, first layers first. */
static int pull_all(trainer_t *tr, uint64_t min_version, uint64_t *version)
{
    ps_op_t *ops[PS_MLP_MAX_TENSORS] = {0};
    uint64_t lowest = UINT64_MAX;
    for (int t = 0; t < tr->mlp.ntensors && !tr->failed; t++)
        if (ps_client_pull(tr->client, tr->ids[t], tr->mlp.params[t], min_version, &ops[t])) {
            tr->failed = PS_EIO;
            snprintf(tr->err, sizeof tr->err, "pull: %s", ps_client_error(tr->client));
        }
    for (int t = 0; t < tr->mlp.ntensors; t++) {
        uint64_t v = 0;
        if (ops[t] && wait_op(tr, &ops[t], "pull", t, &v) == 0 && v < lowest) lowest = v;
    }
    if (version) *version = lowest == UINT64_MAX ? 0 : lowest;
    return tr->failed;
}

static int write_params(const trainer_t *tr, const char *path, uint64_t step)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL) return -errno;
    /* "PSPARAM1", u64 step, u32 ntensors, then per tensor: u32 name length, name,
     * u64 numel, numel fp32 values (little-endian, this machine's order). */
    fwrite("PSPARAM1", 1, 8, f);
    fwrite(&step, 8, 1, f);
    uint32_t n = (uint32_t)tr->mlp.ntensors;
    fwrite(&n, 4, 1, f);
    for (int t = 0; t < tr->mlp.ntensors; t++) {
        uint32_t len = (uint32_t)strlen(tr->mlp.tensors[t].name);
        uint64_t numel = tr->mlp.tensors[t].numel;
        fwrite(&len, 4, 1, f);
        fwrite(tr->mlp.tensors[t].name, 1, len, f);
        fwrite(&numel, 8, 1, f);
        fwrite(tr->mlp.params[t], 4, numel, f);
    }
    return fclose(f) == 0 ? 0 : -errno;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: psworker --manifest FILE [--metrics-out FILE] [--params-out FILE]\n"
            "                [--codec CODEC] [--local [--rank-codec R=CODEC]...]\n"
            "  --metrics-out FILE  JSON lines: one per epoch and a final one\n"
            "  --params-out FILE   write the final parameters (PSPARAM1 format)\n"
            "  --codec CODEC       this worker pushes with CODEC instead of job.compression.codec\n"
            "  --local             train alone, computing every rank's share in this process\n"
            "                      and applying the optimizer here (the reference run)\n"
            "  --rank-codec R=C    with --local: rank R pushes with codec C\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"manifest", required_argument, 0, 'm'},
                                         {"metrics-out", required_argument, 0, 'o'},
                                         {"params-out", required_argument, 0, 'p'},
                                         {"local", no_argument, 0, 'L'},
                                         {"codec", required_argument, 0, 'c'},
                                         {"rank-codec", required_argument, 0, 'r'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *manifest = NULL, *metrics_path = NULL, *params_path = NULL;
    int local = 0, o;
    const char *codec_override = NULL;
    static const char *rank_codec[4096];
    ps_log_set_level(NULL);
    while ((o = getopt_long(argc, argv, "m:o:p:Lc:r:h", opts, NULL)) != -1) {
        switch (o) {
        case 'c':
            if (!ps_codec_name_valid(optarg)) {
                fprintf(stderr, "psworker: --codec %s: unknown codec\n", optarg);
                return 2;
            }
            codec_override = optarg;
            break;
        case 'r': {
            char *eq = strchr(optarg, '='), *end;
            unsigned long r = strtoul(optarg, &end, 10);
            if (eq == NULL || end != eq || r >= 4096 || !ps_codec_name_valid(eq + 1)) {
                fprintf(stderr, "psworker: --rank-codec %s: expected RANK=CODEC\n", optarg);
                return 2;
            }
            rank_codec[r] = eq + 1;
            break;
        }
        case 'm': manifest = optarg; break;
        case 'o': metrics_path = optarg; break;
        case 'p': params_path = optarg; break;
        case 'L': local = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (manifest == NULL || optind != argc) {
        usage(stderr);
        return 2;
    }
    static ps_manifest_t m;
    char err[1024];
    if (ps_manifest_load(&m, manifest, err, sizeof err)) {
        fprintf(stderr, "psworker: %s\n", err);
        return 2;
    }
    if (strcmp(m.job.model, "mlp") != 0) {
        fprintf(stderr, "psworker: %s: job.model '%s' is not built in (mlp is)\n", manifest,
                m.job.model);
        return 2;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    ps_dataset_t train, test;
    if (ps_fmnist_load(&train, &test, m.job.dataset, err, sizeof err)) {
        fprintf(stderr, "psworker: %s\n", err);
        return 1;
    }
    const uint32_t W = m.job.workers, B = m.job.batch_size;
    if ((uint64_t)W * B > train.n) {
        fprintf(stderr, "psworker: %s: job.workers x job.batch_size = %llu exceeds the %u "
                        "training samples\n", manifest, (unsigned long long)W * B, train.n);
        return 2;
    }
    const uint64_t spe = train.n / ((uint64_t)W * B); /* steps per epoch */
    uint64_t total = spe * m.job.epochs;
    if (m.job.max_steps && m.job.max_steps < total) total = m.job.max_steps;

    trainer_t tr = {.m = &m};
    int rc = ps_mlp_create(&tr.mlp, m.job.layers, m.job.nlayers, B > 1000 ? B : 1000);
    if (rc) {
        fprintf(stderr, "psworker: cannot build the mlp: %s\n", ps_strerror(rc));
        return 1;
    }
    int rank = 0;
    uint64_t step = 0;
    FILE *metrics = NULL;
    int exit_code = 1;
    if (metrics_path && (metrics = fopen(metrics_path, "w")) == NULL) {
        fprintf(stderr, "psworker: %s: %s\n", metrics_path, strerror(errno));
        goto out;
    }
    if (codec_override)
        snprintf(m.job.compression.codec, sizeof m.job.compression.codec, "%s", codec_override);
    if (local) {
        ps_mlp_init_params(&tr.mlp, m.job.seed);
        if ((rc = ps_local_create(&tr.local, &m, &tr.mlp, rank_codec, total)) != 0) {
            fprintf(stderr, "psworker: --local: %s\n", ps_strerror(rc));
            goto out;
        }
        ps_local_pull(&tr.local, &tr.mlp);
    } else {
        rc = ps_client_create(manifest, NULL, &tr.client, err, sizeof err);
        if (rc) {
            fprintf(stderr, "psworker: %s\n", err);
            goto out;
        }
        rank = ps_client_rank(tr.client);
        g_client = tr.client;
        for (int t = 0; t < tr.mlp.ntensors; t++) {
            const ps_mlp_tensor_t *mt = &tr.mlp.tensors[t];
            ps_tensor_desc_t d = {.name = mt->name, .ndim = mt->ndim, .init = (int)mt->init,
                                  .seed = m.job.seed, .total_steps = total};
            memcpy(d.shape, mt->shape, sizeof d.shape);
            if ((rc = ps_client_declare(tr.client, &d, &tr.ids[t])) != 0) {
                fprintf(stderr, "psworker: rank %d: declare %s: %s\n", rank, mt->name,
                        ps_client_error(tr.client));
                goto out;
            }
            const ps_compression_conf_t *cc = &m.job.compression;
            const char *codec = ps_compression_codec_for(cc, mt->name, mt->numel * 4);
            ps_compression_t comp = {
                .field_mask = PS_COMPRESSION_BLOCK | PS_COMPRESSION_STOCHASTIC |
                              PS_COMPRESSION_FP16_VALUES,
                .codec = codec, .error_feedback = cc->error_feedback, .pull = cc->pull,
                .block = cc->block, .stochastic = cc->stochastic, .fp16_values = cc->fp16_values};
            if ((rc = ps_client_set_compression(tr.client, tr.ids[t], &comp)) != 0) {
                fprintf(stderr, "psworker: %s: %s\n", mt->name, ps_client_error(tr.client));
                goto out;
            }
        }
        if (pull_all(&tr, 0, &step)) {
            fprintf(stderr, "psworker: rank %d: %s\n", rank, tr.err);
            goto out;
        }
        fprintf(stderr, "psworker: rank %d of %u joined at step %llu of %llu\n", rank, W,
                (unsigned long long)step, (unsigned long long)total);
    }

    uint32_t *perm = malloc(train.n * sizeof *perm);
    float *x = malloc((size_t)B * train.dim * sizeof *x);
    uint8_t *y = malloc(B);
    if (!perm || !x || !y) goto out_free;
    int64_t cur_epoch = -1;
    double t0 = now_s(), last_print = t0, epoch_t0 = t0;
    double loss_sum = 0;
    uint64_t loss_n = 0, samples = 0, epoch_samples = 0;
    for (; step < total && !g_stop; step++) {
        uint64_t epoch = step / spe, k = step % spe;
        if ((int64_t)epoch != cur_epoch) {
            ps_permutation(perm, train.n, m.job.seed, (uint32_t)epoch);
            cur_epoch = (int64_t)epoch;
        }
        tr.step = step;
        if (local) {
            /* Every rank's share, summed in rank order as the shards do. */
            for (uint32_t r = 0; r < W; r++) {
                ps_dataset_gather(&train, perm + (k * W + r) * B, B, x, y);
                loss_sum += ps_mlp_train_step(&tr.mlp, x, y, B, NULL, NULL);
                loss_n++;
                ps_local_push(&tr.local, r, &tr.mlp, step);
            }
            ps_local_apply(&tr.local, &tr.mlp, step);
            ps_local_pull(&tr.local, &tr.mlp);
            samples += (uint64_t)W * B;
            epoch_samples += (uint64_t)W * B;
        } else {
            ps_dataset_gather(&train, perm + (k * W + (uint32_t)rank) * B, B, x, y);
            loss_sum += ps_mlp_train_step(&tr.mlp, x, y, B, push_grad, &tr);
            loss_n++;
            /* Pushes complete when their step is applied; a refused push ends the run
             * here instead of leaving the pulls for that step waiting. */
            for (int t = 0; t < tr.mlp.ntensors; t++) wait_op(&tr, &tr.push_ops[t], "push", t, NULL);
            uint64_t want = m.job.consistency == PS_CONSIST_BSP ? step + 1 : 0;
            if (!tr.failed) pull_all(&tr, want, NULL);
            if (tr.failed && g_stop) break; /* abandoned the step: leave below */
            if (tr.failed) {
                fprintf(stderr, "psworker: rank %d: step %llu: %s\n", rank,
                        (unsigned long long)step, tr.err);
                goto out_free;
            }
            samples += B;
            epoch_samples += B;
        }
        double now = now_s();
        if (now - last_print >= 1.0) {
            fprintf(stderr, "rank %d  epoch %llu  step %llu/%llu  loss %.4f  %.0f samples/s\n",
                    rank, (unsigned long long)epoch + 1, (unsigned long long)step + 1,
                    (unsigned long long)total, loss_sum / (double)(loss_n ? loss_n : 1),
                    (double)samples / (now - t0));
            last_print = now;
        }
        if (k == spe - 1 || step + 1 == total) {
            double acc = -1;
            if (rank == 0) acc = ps_mlp_eval(&tr.mlp, test.images, test.labels, test.n) / (double)test.n;
            ps_client_stats_t st = {0};
            if (tr.client) ps_client_stats(tr.client, &st);
            double ew = now_s() - epoch_t0;
            if (rank == 0)
                fprintf(stderr, "rank 0  epoch %llu done  loss %.4f  test accuracy %.4f  %.1f s\n",
                        (unsigned long long)epoch + 1, loss_sum / (double)(loss_n ? loss_n : 1),
                        acc, ew);
            if (metrics) {
                char accs[32];
                if (acc >= 0)
                    snprintf(accs, sizeof accs, "%.4f", acc);
                else
                    snprintf(accs, sizeof accs, "null");
                fprintf(metrics,
                        "{\"epoch\": %llu, \"step\": %llu, \"train_loss\": %.6f, "
                        "\"test_accuracy\": %s, \"samples_per_s\": %.1f, \"bytes_pushed\": %llu, "
                        "\"bytes_pushed_raw\": %llu, \"bytes_pulled\": %llu, \"wall_s\": %.3f}\n",
                        (unsigned long long)epoch + 1, (unsigned long long)step + 1,
                        loss_sum / (double)(loss_n ? loss_n : 1), accs,
                        (double)epoch_samples / (ew > 0 ? ew : 1e-9),
                        (unsigned long long)st.bytes_pushed,
                        (unsigned long long)(tr.client ? st.bytes_pushed_raw : 0),
                        (unsigned long long)st.bytes_pulled,
                        now_s() - t0);
                fflush(metrics);
            }
            loss_sum = 0;
            loss_n = 0;
            epoch_samples = 0;
            epoch_t0 = now_s();
        }
    }
    if (g_stop) {
        fprintf(stderr, "psworker: rank %d: stopped by signal at step %llu\n", rank,
                (unsigned long long)step);
        exit_code = 128 + g_stop;
        goto out_free;
    }
    {
        double acc = ps_mlp_eval(&tr.mlp, test.images, test.labels, test.n) / (double)test.n;
        fprintf(stderr, "rank %d  final test accuracy %.4f after %llu steps (%.1f s)\n", rank, acc,
                (unsigned long long)step, now_s() - t0);
        if (metrics) {
            fprintf(metrics, "{\"final\": true, \"step\": %llu, \"test_accuracy\": %.4f, "
                             "\"wall_s\": %.3f}\n",
                    (unsigned long long)step, acc, now_s() - t0);
        }
        if (params_path && (rc = write_params(&tr, params_path, step)) != 0) {
            fprintf(stderr, "psworker: %s: %s\n", params_path, strerror(-rc));
            goto out_free;
        }
        exit_code = 0;
    }
out_free:
    free(perm);
    free(x);
    free(y);
out:
    for (int t = 0; t < tr.mlp.ntensors; t++)
        if (tr.push_ops[t]) ps_op_wait(tr.push_ops[t], NULL);
    g_client = NULL;
    ps_client_destroy(tr.client);
    if (metrics) fclose(metrics);
    ps_local_destroy(&tr.local);
    ps_mlp_destroy(&tr.mlp);
    ps_dataset_free(&train);
    ps_dataset_free(&test);
    return exit_code;
}
