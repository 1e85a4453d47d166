/* psworker.c: the psworker command: joins a psd cluster and trains the
 * manifest's job (the built-in mlp on Fashion-MNIST), or with --local trains
 * the same global batches in one process as a reference. */
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "batches.h"
#include "durable.h"
#include "fmnist.h"
#include "local.h"
#include "manifest.h"
#include "mlp.h"
#include "optim.h"
#include "ps/ps_client.h"
#include "ps/ps_log.h"
#include "sigignored.h"

typedef struct {
    const ps_manifest_t *m;
    ps_mlp_t mlp;
    ps_client_t *client;     /* NULL with --local */
    uint32_t ids[PS_MLP_MAX_TENSORS];
    ps_op_t *push_ops[PS_MLP_MAX_TENSORS];
    ps_op_t *pull_ops[PS_MLP_MAX_TENSORS];
    uint64_t step;
    uint64_t total;          /* planned steps (learning-rate schedule) */
    int failed;
    char err[512];
    ps_local_t local;        /* --local: the cluster's work done in-process */
    /* --device with a dense lossy codec: gradients encoded on the device (device_encode) */
    uint8_t *d_stage;        /* one chunk's payload on the device */
    size_t stage_cap;
    float *d_residual;       /* error feedback, laid out as the mlp's gradients (zeros first) */
    float *h_back;           /* [2 * chunk] host copies of a chunk's residual and gradient
                                (device_put_back) */
    ps_client_stats_t before; /* the counters of the clients dropped to join again: the
                                 metrics' bytes are this process's (a probe saw them restart
                                 at 0 after a rejoin) */
} trainer_t;

/* What --codec and --rank-codec take (as the manifest's compression.codec). */
#define CODEC_FORMS "none, fp16, bf16, int8, sign, topk:F or randomk:F with F in (0, 1]"

static volatile sig_atomic_t g_stop;
static ps_client_t *volatile g_client;
/* The step in flight is abandoned: its waits return at once and the worker leaves. */
static void on_signal(int sig)
{
    g_stop = sig;
    if (g_client) ps_client_interrupt(g_client);
}

/* fopen(@p path, "w") that a stop signal ends while it blocks: a FIFO's open waits for a
 * reader, and on_signal (installed with restart) let it go on waiting after SIGTERM (a probe,
 * session 45: only SIGKILL ended such a psworker). The signals' default actions hold for the
 * open; a handler that was not on_signal (SIGHUP ignored under nohup) is left alone. */
static FILE *open_out(const char *path)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    bool ours[3];
    for (int i = 0; i < 3; i++) {
        struct sigaction cur;
        ours[i] = sigaction(sigs[i], NULL, &cur) == 0 && cur.sa_handler == on_signal;
        if (ours[i]) signal(sigs[i], SIG_DFL);
    }
    FILE *f;
    if (g_stop) { /* one came before: no wait at all (a FIFO without a reader: ENXIO) */
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC, 0644);
        f = fd < 0 ? NULL : fdopen(fd, "w");
        if (f == NULL && fd >= 0) close(fd);
    } else {
        f = fopen(path, "w");
    }
    for (int i = 0; i < 3; i++)
        if (ours[i]) signal(sigs[i], on_signal);
    return f;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ps_push_encoder_t for gradients that stay on the device: encode the chunk there, bring only
 * its payload to the host. */
static int device_encode(void *arg, uint32_t id, uint32_t chunk, uint64_t offset, size_t n,
                         const void *codec, int error_feedback, uint8_t *out, size_t cap,
                         size_t *len)
{
    trainer_t *tr = arg;
    int t = 0;
    while (t < tr->mlp.ntensors && tr->ids[t] != id) t++;
    size_t bytes = psk_codec_max_bytes(codec, n);
    if (t == tr->mlp.ntensors || bytes == 0 || bytes > tr->stage_cap || bytes > cap)
        return PS_EINVAL;
    psk_gpu_t *g = tr->mlp.gpu;
    const float *dg = ps_mlp_device_grad(&tr->mlp, t) + offset;
    int rc = error_feedback
                 ? psk_codec_encode_ef_cuda(tr->d_stage, tr->stage_cap, len, dg,
                                            tr->d_residual + (tr->mlp.grads[t] - tr->mlp.grads[0]) +
                                                offset,
                                            n, codec, psk_gpu_stream(g))
                 : psk_codec_encode_cuda(tr->d_stage, tr->stage_cap, len, dg, n, codec,
                                         psk_gpu_stream(g));
    if (!rc) rc = psk_gpu_download(g, out, tr->d_stage, *len);
    if (!rc) rc = psk_gpu_sync(g);
    if (rc && !tr->mlp.gpu_rc) { /* said as any device failure (device_failed) */
        if (rc == PS_EIO) (void)psk_gpu_sync(g); /* a launch's error text is the sync's */
        tr->mlp.gpu_rc = rc;
        snprintf(tr->mlp.gpu_err, sizeof tr->mlp.gpu_err, "%s: encoding %s: %s", psk_gpu_name(g),
                 tr->mlp.tensors[t].name, rc == PS_EIO ? psk_gpu_last_error(g) : ps_strerror(rc));
    }
    return rc;
}

/* ps_push_put_back_t for device_encode's pushes: a chunk its shard did not sum gives its push
 * back to the device's residual, r += decode(payload) - g, as libps does for its own (the same
 * function on the host: the chunk's residual and gradient come down, the residual goes back;
 * rare, so no kernel of its own). */
static int device_put_back(void *arg, uint32_t id, uint32_t chunk, uint64_t offset, size_t n,
                           const void *codec, const uint8_t *payload, size_t len)
{
    trainer_t *tr = arg;
    int t = 0;
    while (t < tr->mlp.ntensors && tr->ids[t] != id) t++;
    if (t == tr->mlp.ntensors || tr->d_residual == NULL || tr->h_back == NULL ||
        n > tr->m->chunk_bytes / 4)
        return PS_EINVAL;
    (void)chunk;
    if (tr->mlp.gpu_rc) return tr->mlp.gpu_rc; /* the device failed already: said once */
    psk_gpu_t *g = tr->mlp.gpu;
    float *dr = tr->d_residual + (tr->mlp.grads[t] - tr->mlp.grads[0]) + offset;
    float *r = tr->h_back, *grad = tr->h_back + tr->m->chunk_bytes / 4;
    int rc = psk_gpu_download(g, r, dr, n * sizeof *r);
    if (!rc) rc = psk_gpu_download(g, grad, ps_mlp_device_grad(&tr->mlp, t) + offset,
                                   n * sizeof *grad);
    if (!rc) rc = psk_gpu_sync(g);
    if (!rc) {
        int pb = psk_codec_ef_put_back_cpu(r, grad, n, payload, len, codec);
        if (pb) return pb; /* not the device's: a payload not of its codec */
    }
    if (!rc) rc = psk_gpu_upload(g, dr, r, n * sizeof *r);
    if (!rc) rc = psk_gpu_sync(g);
    if (rc && !tr->mlp.gpu_rc) { /* said as any device failure (device_failed) */
        tr->mlp.gpu_rc = rc;
        snprintf(tr->mlp.gpu_err, sizeof tr->mlp.gpu_err, "%s: giving back a push of %s: %s",
                 psk_gpu_name(g), tr->mlp.tensors[t].name,
                 rc == PS_EIO ? psk_gpu_last_error(g) : ps_strerror(rc));
    }
    return rc;
}

/* --device: the tensors whose codec the device encodes (fp16, bf16, int8, sign) keep their
 * gradients there; the others (none, topk, randomk) are downloaded and pushed as on the CPU.
 * Returns how many stay, or a negative PS_E* code (device memory). */
static int device_codecs(trainer_t *tr)
{
    const ps_compression_conf_t *cc = &tr->m->job.compression;
    uint64_t stay = 0;
    for (int t = 0; t < tr->mlp.ntensors; t++) {
        const ps_mlp_tensor_t *mt = &tr->mlp.tensors[t];
        psk_codec_t pc;
        if (psk_codec_parse(&pc, ps_compression_codec_for(cc, mt->name, mt->numel * 4)) == 0 &&
            (pc.kind == PSK_CODEC_FP16 || pc.kind == PSK_CODEC_BF16 ||
             pc.kind == PSK_CODEC_INT8 || pc.kind == PSK_CODEC_SIGN))
            stay |= 1ull << t;
    }
    psk_gpu_t *g = tr->mlp.gpu;
    size_t n = tr->m->chunk_bytes / 4, bytes = 2 * tr->mlp.nparams * sizeof(float);
    if (stay && tr->d_stage == NULL) {
        /* Room for any dense payload of a chunk: a header and 4 bytes a value, 4 a scale. */
        tr->stage_cap = PSK_CODEC_HEADER_BYTES + 8 * n + 8;
        int rc = psk_gpu_alloc(g, (void **)&tr->d_stage, tr->stage_cap);
        if (rc) return rc;
    }
    if (stay && cc->error_feedback && tr->d_residual == NULL) {
        int rc = psk_gpu_alloc(g, (void **)&tr->d_residual, bytes / 2);
        if (rc) return rc;
    }
    /* Zeros at every join, as a new client's residual on the host: a worker dropped and back
     * as a new member does not add what it kept from before (the lost push's error too). */
    if (stay && tr->d_residual != NULL) {
        int rc = psk_gpu_zero(g, tr->d_residual, bytes / 2);
        if (rc) return rc;
        if (tr->h_back == NULL && (tr->h_back = malloc(2 * n * sizeof *tr->h_back)) == NULL)
            return PS_ENOMEM;
        for (int t = 0; t < tr->mlp.ntensors && tr->client; t++)
            if ((stay >> t & 1) && (rc = ps_client_set_put_back(tr->client, tr->ids[t],
                                                                device_put_back, tr)) != 0)
                return rc;
    }
    tr->mlp.grads_stay = stay;
    return __builtin_popcountll(stay);
}

/* Backward-pass callback: push each tensor's gradient as soon as it exists. The backward pass
 * runs inside a group (see the training loop): the small gradients (biases, the last layers) are
 * held and leave fused at its end, a large one leaves at once, overlapping the rest. */
static void push_grad(int t, void *arg)
{
    trainer_t *tr = arg;
    if (tr->client == NULL || tr->failed) return;
    int rc = tr->mlp.grads_stay >> t & 1
                 ? ps_client_push_encoded(tr->client, tr->ids[t], tr->step, device_encode, tr,
                                          &tr->push_ops[t])
                 : ps_client_push(tr->client, tr->ids[t], tr->mlp.grads[t], tr->step,
                                  &tr->push_ops[t]);
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

/* Start pulling every tensor at version >= min_version, first layers first. */
static int pull_start(trainer_t *tr, uint64_t min_version)
{
    ps_client_group_begin(tr->client); /* the small ones leave fused */
    for (int t = 0; t < tr->mlp.ntensors && !tr->failed; t++)
        if (ps_client_pull(tr->client, tr->ids[t], tr->mlp.params[t], min_version,
                           &tr->pull_ops[t])) {
            tr->failed = PS_EIO;
            tr->pull_ops[t] = NULL;
            snprintf(tr->err, sizeof tr->err, "pull: %s", ps_client_error(tr->client));
        }
    ps_client_group_end(tr->client);
    return tr->failed;
}

/* Wait for the pulls; *version = the lowest chunk version received. */
static int pull_finish(trainer_t *tr, uint64_t *version)
{
    uint64_t lowest = UINT64_MAX;
    for (int t = 0; t < tr->mlp.ntensors; t++) {
        uint64_t v = 0;
        if (tr->pull_ops[t] && wait_op(tr, &tr->pull_ops[t], "pull", t, &v) == 0 && v < lowest)
            lowest = v;
    }
    if (version) *version = lowest;
    return tr->failed;
}

static int pull_all(trainer_t *tr, uint64_t min_version, uint64_t *version)
{
    pull_start(tr, min_version);
    return pull_finish(tr, version);
}

/* PS_TEST_STOP_AT=WHERE (tests only): the first time the worker is at WHERE ("hello": its
 * join answered, before the declarations; "final": before the final pull; "batch:N": before
 * its Nth batch request, N from 1), it stops itself (SIGSTOP), so that a test can have the
 * shards drop it there. */
/* Whether test hook @p env names @p where and has not fired yet (then it fires: once). */
static int test_at(const char *env, const char *where, int *done)
{
    const char *at = getenv(env);
    if (*done || at == NULL || strcmp(at, where) != 0) return 0;
    *done = 1;
    return 1;
}

static void test_stop(const char *where)
{
    static int done;
    if (!test_at("PS_TEST_STOP_AT", where, &done)) return;
    fprintf(stderr, "psworker: stops at its %s (PS_TEST_STOP_AT)\n", where);
    raise(SIGSTOP);
}

static volatile sig_atomic_t g_hang_end;

static void on_hang_end(int sig)
{
    (void)sig;
    g_hang_end = 1;
}

/* PS_TEST_HANG_AT=WHERE (tests only; the places of PS_TEST_STOP_AT, and "train:N": its Nth batch
 * in hand and its parameters pulled, before it trains on it): the first time the worker is
 * there, its training thread sleeps PS_TEST_HANG_MS milliseconds (default 3000) while libps's
 * thread goes on (its heartbeats too): a worker hung in its training loop. SIGUSR2 ends the
 * hang early (a test that saw what it waited for); its handler is set only for a hang. */
static void test_hang(const char *where)
{
    static int done;
    if (!test_at("PS_TEST_HANG_AT", where, &done)) return;
    const char *ms = getenv("PS_TEST_HANG_MS");
    long n = ms ? atol(ms) : 3000;
    signal(SIGUSR2, on_hang_end); /* before the line a test waits for */
    fprintf(stderr, "psworker: hangs %ld ms at its %s (PS_TEST_HANG_AT)\n", n, where);
    /* 10 ms naps: the signal may land on libps's thread and wake no nap of this one. */
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long left = n; left > 0 && !g_stop && !g_hang_end;) {
        struct timespec nap = {0, (left < 10 ? left : 10) * 1000000L};
        nanosleep(&nap, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t);
        left = n - ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
    }
    if (g_hang_end) fprintf(stderr, "psworker: the hang ended early (SIGUSR2)\n");
}

/* Leave (the client's destroy) and forget the client; its pull ops were waited for. */
static void drop_client(trainer_t *tr)
{
    ps_client_stats_t st;
    ps_client_stats(tr->client, &st);
    tr->before.bytes_pushed += st.bytes_pushed;
    tr->before.bytes_pushed_raw += st.bytes_pushed_raw;
    tr->before.bytes_pulled += st.bytes_pulled;
    g_client = NULL;
    ps_client_destroy(tr->client);
    tr->client = NULL;
    tr->failed = 0;
}

/* Connect, declare the model's tensors and set their compression. */
static int join_once(trainer_t *tr, const char *manifest, char *err, size_t errlen)
{
    const ps_manifest_t *m = tr->m;
    /* A SIGINT or SIGTERM while the join waits for a shard ends it (exit 128 + the signal). */
    ps_client_opts_t o = {.field_mask = PS_CLIENT_OPT_CANCEL, .cancel = &g_stop};
    int rc = ps_client_create(manifest, &o, &tr->client, err, errlen);
    if (rc) return rc;
    g_client = tr->client;
    test_stop("hello");
    int rank = ps_client_rank(tr->client);
    for (int t = 0; t < tr->mlp.ntensors; t++) {
        const ps_mlp_tensor_t *mt = &tr->mlp.tensors[t];
        ps_tensor_desc_t d = {.name = mt->name, .ndim = mt->ndim, .init = (int)mt->init,
                              .seed = m->job.seed, .total_steps = tr->total};
        memcpy(d.shape, mt->shape, sizeof d.shape);
        if ((rc = ps_client_declare(tr->client, &d, &tr->ids[t])) != 0) {
            snprintf(err, errlen, "rank %d: declare %s: %s", rank, mt->name,
                     ps_client_error(tr->client));
            /* A tensor the shards hold otherwise (another shape: another model, or a store
             * restored under other job.layers) is this manifest refused: exit 2, not started
             * again by pslaunch (a probe, session 46: exit 1, respawned). */
            return rc == PS_ECONFLICT ? PS_ECONFIG : rc;
        }
        const ps_compression_conf_t *cc = &m->job.compression;
        const char *codec = ps_compression_codec_for(cc, mt->name, mt->numel * 4);
        ps_compression_t comp = {
            .field_mask = PS_COMPRESSION_BLOCK | PS_COMPRESSION_STOCHASTIC |
                          PS_COMPRESSION_FP16_VALUES,
            .codec = codec, .error_feedback = cc->error_feedback, .pull = cc->pull,
            .block = cc->block, .stochastic = cc->stochastic, .fp16_values = cc->fp16_values};
        if ((rc = ps_client_set_compression(tr->client, tr->ids[t], &comp)) != 0) {
            snprintf(err, errlen, "%s: %s", mt->name, ps_client_error(tr->client));
            return rc;
        }
    }
    if (tr->mlp.gpu != NULL) {
        int on = device_codecs(tr);
        if (on < 0) {
            snprintf(err, errlen, "cannot allocate the device's codec buffers: %s",
                     psk_gpu_last_error(tr->mlp.gpu));
            return on;
        }
        if (on > 0)
            fprintf(stderr, "psworker: rank %d: %d of %d tensors are compressed on the device\n",
                    rank, on, tr->mlp.ntensors);
    }
    /* The planned steps are the learning-rate schedule's, the samples over job.workers x
     * batch_size: the job's actual members (psctl scale, joins, departures) and each pass's
     * last batches, smaller than batch_size, change how many steps it takes (a few more: a
     * worker may join at a step past them). */
    fprintf(stderr, "psworker: rank %d joined at step %llu (%llu planned for job.workers %u; "
            "%u members now)\n", rank, (unsigned long long)ps_client_join_step(tr->client),
            (unsigned long long)tr->total, m->job.workers, ps_client_workers(tr->client));
    return 0;
}

/* join_once, again as a new member when the shards dropped this worker before its
 * declarations were done (stopped past the heartbeat timeout right after its hello, or a
 * restarted coordinator that never committed the join gave its rank to another): before, the
 * worker exited 1 there, where a drop later on joins again. */
static int join_cluster(trainer_t *tr, const char *manifest, char *err, size_t errlen)
{
    for (int tries = 1;; tries++) {
        int rc = join_once(tr, manifest, err, errlen);
        if (rc != PS_ENOTMEMBER || tries == 5 || g_stop) return rc;
        fprintf(stderr, "psworker: %s; joining again\n", err);
        drop_client(tr);
    }
}

/* The shards dropped this worker (PS_ENOTMEMBER; @p when, @p why say where): it says so,
 * leaves and joins again as a new member. Its pull ops were waited for. @return 0, or the
 * join's error (said). */
static int rejoin(trainer_t *tr, const char *manifest, const char *when, const char *why)
{
    fprintf(stderr, "psworker: rank %d was removed from the job%s; joining again%s\n",
            ps_client_rank(tr->client), when, why);
    drop_client(tr);
    char err[1024];
    int rc = join_cluster(tr, manifest, err, sizeof err);
    if (rc) fprintf(stderr, "psworker: %s\n", err);
    return rc;
}

/* The fraction of @p d that @p m classifies right, in slices of m->max_batch rows standardized
 * into @p x ([max_batch, dim], the caller's). */
static double eval_accuracy(ps_mlp_t *m, const ps_dataset_t *d, float *x)
{
    uint32_t correct = 0;
    for (uint32_t first = 0; first < d->n; first += m->max_batch) {
        uint32_t count = d->n - first < m->max_batch ? d->n - first : m->max_batch;
        ps_dataset_rows(d, first, count, x);
        correct += ps_mlp_eval(m, x, d->labels + first, count);
    }
    return d->n ? correct / (double)d->n : 0.0;
}

/* Per-pass progress: a metrics line when the batches move on to the next pass. */
typedef struct {
    FILE *metrics;
    const ps_dataset_t *test;
    float *eval_x; /* [max_batch, dim]: the test rows of one evaluation slice */
    double t0, epoch_t0, last_print;
    double loss_sum;
    uint64_t loss_n, samples, samples_total;
    int64_t pass;
    bool loss_odd_said; /* a loss that is not finite was said (once a run) */
} epoch_log_t;

/* Count one batch's training @p loss at @p step; the first one that is not finite (a model that
 * diverged) is said once. */
static void epoch_log_loss(epoch_log_t *l, const trainer_t *tr, uint64_t step, double loss)
{
    l->loss_sum += loss;
    l->loss_n++;
    if (isfinite(loss) || l->loss_odd_said) return;
    l->loss_odd_said = true;
    fprintf(stderr,
            "psworker: rank %d: the training loss is %f at step %llu: the model diverged (a "
            "lower job.optimizer.lr may help); --metrics-out writes such a loss as null\n",
            tr->client ? ps_client_rank(tr->client) : 0, loss, (unsigned long long)step + 1);
}

/* Pass @p pass's first batch here (INT64_MAX: the job's end): the open pass's line is written,
 * its test accuracy evaluated when @p eval (the job's lead). A batch of a pass older than the
 * open one (handed out again under asp after its first holder died) stays in the open pass:
 * before, it closed the open pass and opened the old one again, so passes were evaluated twice
 * and a worker's epoch lines went backwards (a scaling probe, session 63). @p eval 2: write the
 * open pass's line also when this worker trained no batch of it (the lead at the job's end). */
static void epoch_log_pass(epoch_log_t *l, trainer_t *tr, int64_t pass, uint64_t step, int eval)
{
    if (pass == l->pass || (pass < l->pass && l->pass != INT64_MAX)) return;
    if (l->pass >= 0 && (l->loss_n > 0 || (eval == 2 && l->pass != INT64_MAX))) {
        double acc = -1;
        if (eval)
            acc = eval_accuracy(&tr->mlp, l->test, l->eval_x);
        if (tr->mlp.gpu_rc) acc = -1; /* a device error: no figure; the next step says why */
        ps_client_stats_t st = {0};
        if (tr->client) ps_client_stats(tr->client, &st);
        st.bytes_pushed += tr->before.bytes_pushed;
        st.bytes_pushed_raw += tr->before.bytes_pushed_raw;
        st.bytes_pulled += tr->before.bytes_pulled;
        double ew = now_s() - l->epoch_t0;
        if (acc >= 0 && l->loss_n)
            fprintf(stderr, "epoch %lld done  loss %.4f  test accuracy %.4f  %.1f s\n",
                    (long long)l->pass + 1, l->loss_sum / (double)l->loss_n, acc, ew);
        else if (acc >= 0) /* eval 2: the job's last pass, none of its batches here */
            fprintf(stderr, "epoch %lld done  (no batch of it here)  test accuracy %.4f\n",
                    (long long)l->pass + 1, acc);
        if (l->metrics) {
            char accs[32];
            if (acc >= 0)
                snprintf(accs, sizeof accs, "%.4f", acc);
            else
                snprintf(accs, sizeof accs, "null");
            char loss[32] = "null"; /* none trained here (eval 2), or not finite: JSON has no NaN */
            double mean = l->loss_n > 0 ? l->loss_sum / (double)l->loss_n : NAN;
            if (isfinite(mean)) snprintf(loss, sizeof loss, "%.6f", mean);
            fprintf(l->metrics,
                    "{\"epoch\": %lld, \"step\": %llu, \"train_loss\": %s, "
                    "\"test_accuracy\": %s, \"samples\": %llu, \"samples_per_s\": %.1f, "
                    "\"bytes_pushed\": %llu, \"bytes_pushed_raw\": %llu, \"bytes_pulled\": %llu, "
                    "\"wall_s\": %.3f}\n",
                    (long long)l->pass + 1, (unsigned long long)step,
                    loss, accs, (unsigned long long)l->samples,
                    (double)l->samples / (ew > 0 ? ew : 1e-9),
                    (unsigned long long)st.bytes_pushed, (unsigned long long)st.bytes_pushed_raw,
                    (unsigned long long)st.bytes_pulled, now_s() - l->t0);
            fflush(l->metrics);
        }
    }
    l->samples_total += l->samples;
    l->pass = pass;
    l->loss_sum = 0;
    l->loss_n = 0;
    l->samples = 0;
    l->epoch_t0 = now_s();
}

static void epoch_log_tick(epoch_log_t *l, trainer_t *tr, uint64_t step)
{
    double now = now_s();
    if (now - l->last_print < 1.0) return;
    fprintf(stderr, "rank %d  pass %lld  step %llu of ~%llu  loss %.4f  %.0f samples/s\n",
            tr->client ? ps_client_rank(tr->client) : 0, (long long)l->pass + 1,
            (unsigned long long)step + 1, (unsigned long long)tr->total,
            l->loss_sum / (double)(l->loss_n ? l->loss_n : 1),
            (double)(l->samples_total + l->samples) / (now - l->t0));
    l->last_print = now;
}

/* Writes the parameters to @p f (opened at the start as @p tmp, so that an unwritable path
 * fails before the training, not after it) and renames it to @p path: a failed write leaves
 * an older file there as it was. Closes @p f. */
static int write_params(const trainer_t *tr, FILE *f, const char *tmp, const char *path,
                        uint64_t step)
{
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
    int rc = ferror(f) ? -EIO : 0;
    if (fclose(f) != 0 && rc == 0) rc = errno ? -errno : -EIO;
    if (rc == 0 && rename(tmp, path) != 0) rc = -errno;
    if (rc) unlink(tmp);
    return rc;
}

/* --self-test: join, then measure the path to every shard (transports and bandwidth), leave. */
/* Whether @p rc is the shards' refusal of this worker's manifest (or secret): exit 2, the code
 * pslaunch does not start a worker again on. */
static bool refused(int rc) { return rc == PS_ECONFIG || rc == PS_EAUTH; }

/* The exit code of a join (or a join again) that failed with @p rc: a signal's, 2 for the
 * shards' refusal (a store restored alone, another manifest: pslaunch does not start it
 * again), else 1. */
static int join_exit_code(int rc)
{
    if (g_stop) return 128 + g_stop; /* a signal ended the join */
    return refused(rc) ? 2 : 1;
}

static int run_self_test(const char *manifest, const ps_manifest_t *m)
{
    char err[1024];
    ps_client_t *c;
    int rc = ps_client_create(manifest, NULL, &c, err, sizeof err);
    if (rc) {
        fprintf(stderr, "psworker: %s\n", err);
        return refused(rc) ? 2 : 1;
    }
    int bad = 0;
    for (uint32_t i = 0; i < ps_client_shards(c); i++) {
        double small = 0, big = 0;
        char lanes[64] = "";
        rc = ps_client_self_test(c, i, 4096, 200, &small, NULL, 0);
        if (rc == 0) rc = ps_client_self_test(c, i, 4u << 20, 16, &big, lanes, sizeof lanes);
        if (rc) {
            fprintf(stderr, "psworker: self-test: shard %u: %s\n", i, ps_client_error(c));
            bad = 1;
            continue;
        }
        int d = ps_client_direct(c, i);
        printf("shard %u (%s:%u) over %s: %.2f GB/s with 4 MiB messages, %.0f us per 4 KiB "
               "message and reply; on this host: pulls %s, pushes %s\n", i, m->servers[i].host,
               m->servers[i].port, lanes, big, 4096.0 / (small * 1e9) * 1e6,
               d & PS_DIRECT_PULLS ? "read its store directly" : "over the transport",
               d & PS_DIRECT_PUSHES ? "into its shared memory" : "over the transport");
    }
    ps_client_destroy(c);
    return bad;
}

/* --device: -1 for "cpu", N for "cuda" (0) or "cuda:N"; -2 for anything else. */
static int parse_device(const char *s)
{
    if (strcmp(s, "cpu") == 0) return -1;
    if (strcmp(s, "cuda") == 0) return 0;
    if (strncmp(s, "cuda:", 5) != 0 || s[5] < '0' || s[5] > '9') return -2;
    char *end;
    errno = 0;
    long n = strtol(s + 5, &end, 10);
    return *end != '\0' || errno || n > 1024 ? -2 : (int)n;
}

/* A device error in the last train_step or eval: said once, and the run ends (exit 1). */
static int device_failed(const ps_mlp_t *mlp)
{
    if (mlp->gpu_rc == 0) return 0;
    fprintf(stderr, "psworker: the CUDA device failed: %s\n", mlp->gpu_err);
    return 1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: psworker --manifest FILE [--metrics-out FILE] [--params-out FILE]\n"
            "                [--codec CODEC] [--local [--rank-codec R=CODEC]...] [--self-test]\n"
            "                [--device cpu|cuda[:N]]\n"
            "  --metrics-out FILE  JSON lines: one per epoch and a final one (also when stopped\n"
            "                      by a signal: \"stopped_by_signal\", no test accuracy)\n"
            "  --params-out FILE   write the final parameters (PSPARAM1 format)\n"
            "  --codec CODEC       this worker pushes with CODEC instead of job.compression.codec\n"
            "                      (its rules and min_bytes still choose where they apply)\n"
            "  --local             train alone, computing every rank's share in this process\n"
            "                      and applying the optimizer here (the reference run)\n"
            "  --rank-codec R=C    with --local: rank R pushes with codec C\n"
            "  --device D          compute the gradients on the CPU (the default) or on CUDA device\n"
            "                      N (cuda = cuda:0), with cuBLAS\n"
            "  --self-test         join, print each shard's transports and measured bandwidth\n"
            "                      and round-trip time, leave (no training)\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"manifest", required_argument, 0, 'm'},
                                         {"metrics-out", required_argument, 0, 'o'},
                                         {"params-out", required_argument, 0, 'p'},
                                         {"local", no_argument, 0, 'L'},
                                         {"codec", required_argument, 0, 'c'},
                                         {"rank-codec", required_argument, 0, 'r'},
                                         {"self-test", no_argument, 0, 'T'},
                                         {"device", required_argument, 0, 'd'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *manifest = NULL, *metrics_path = NULL, *params_path = NULL;
    int local = 0, o;
    const char *codec_override = NULL;
    static const char *rank_codec[4096];
    long max_rank_codec = -1; /* the highest rank --rank-codec names */
    ps_log_set_level(NULL);
    int self_test = 0, device = -1; /* -1: the CPU */
    while ((o = getopt_long(argc, argv, "m:o:p:Lc:r:Td:h", opts, NULL)) != -1) {
        switch (o) {
        case 'T': self_test = 1; break;
        case 'd':
            if ((device = parse_device(optarg)) < -1) {
                fprintf(stderr, "psworker: --device %s: expected cpu, cuda or cuda:N\n", optarg);
                return 2;
            }
            break;
        case 'c':
            if (!ps_codec_name_valid(optarg)) {
                fprintf(stderr, "psworker: --codec %s: unknown codec: %s\n", optarg,
                        CODEC_FORMS);
                return 2;
            }
            codec_override = optarg;
            break;
        case 'r': {
            char *eq = strchr(optarg, '='), *end;
            unsigned long r = strtoul(optarg, &end, 10);
            if (eq == NULL || end != eq || end == optarg || r >= 4096) {
                /* "=int8" was taken as rank 0 */
                fprintf(stderr, "psworker: --rank-codec %s: expected RANK=CODEC\n", optarg);
                return 2;
            }
            if (!ps_codec_name_valid(eq + 1)) {
                fprintf(stderr, "psworker: --rank-codec %s: unknown codec '%s': %s\n", optarg,
                        eq + 1, CODEC_FORMS);
                return 2;
            }
            if (rank_codec[r]) { /* the second one won, silently */
                fprintf(stderr, "psworker: --rank-codec %s: rank %lu has a codec already (%s)\n",
                        optarg, r, rank_codec[r]);
                return 2;
            }
            rank_codec[r] = eq + 1;
            if ((long)r > max_rank_codec) max_rank_codec = (long)r;
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
        if (manifest == NULL)
            fprintf(stderr, "psworker: --manifest FILE is required\n");
        else
            fprintf(stderr, "psworker: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if ((metrics_path && !*metrics_path) || (params_path && !*params_path)) {
        /* Found only at the job's end before (an input probe, session 63): exit 1, which
         * pslaunch --respawn took for a crash. */
        fprintf(stderr, "psworker: --%s '': an empty file name; give the path of a file\n",
                metrics_path && !*metrics_path ? "metrics-out" : "params-out");
        return 2;
    }
    if (self_test && device >= 0) {
        fprintf(stderr, "psworker: --self-test measures the transport: it does not go with "
                        "--device\n");
        return 2;
    }
    if ((max_rank_codec >= 0 && !local) || (self_test && local)) { /* each was ignored */
        fprintf(stderr, "psworker: %s\n", self_test && local
                ? "--self-test measures the cluster: it does not go with --local"
                : "--rank-codec is for --local (in a cluster each worker takes --codec)");
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
    if (max_rank_codec >= (long)m.job.workers) {
        fprintf(stderr, "psworker: --rank-codec %ld: --local runs job.workers = %u ranks "
                "(0 to %u)\n", max_rank_codec, m.job.workers, m.job.workers - 1);
        return 2;
    }
    if (m.job.optimizer.name == PS_OPT_MEAN && !self_test) {
        /* psd would hold the step's mean gradient, not the model: nothing to train or join. */
        fprintf(stderr,
                "psworker: %s: job.optimizer.name mean keeps no model on the shards (each step's "
                "mean gradient only), so psworker cannot train with it; it is for libps clients "
                "that run their own optimizer. Use sgd, momentum, adam, adamw or adagrad\n",
                manifest);
        return 2;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    /* A hangup (its terminal or session gone) leaves as SIGTERM does, as psd stops on it. Also
     * takes SIGHUP from UCX, which installs its own handler for it when loaded (UCX_DEBUG_SIGNO,
     * default HUP): that turned UCX's debug logging on for the rest of the run (a probe,
     * session 42: 600 to 2,250 "UCX DEBUG" lines on stderr) and the worker went on. One
     * ignored at the start (nohup; UCX's handler is gone by now, ucx_loop.c) stays ignored. */
    if (!ps_signal_ignored(SIGHUP)) signal(SIGHUP, on_signal);
    if (self_test) return run_self_test(manifest, &m);

    ps_dataset_t train, test;
    if (ps_fmnist_load(&train, &test, m.job.dataset, err, sizeof err)) {
        /* Exit 1, not 2 (a manifest refused): a dataset on a mount that is not there yet (a
         * host's boot) may come, and pslaunch --follow (exit 2 ends it, and its systemd unit
         * then stays down) starts the worker again after its back-off. */
        fprintf(stderr, "psworker: %s\n", err);
        return 1;
    }
    uint32_t first = m.job.layers[0], last = m.job.layers[m.job.nlayers - 1];
    if (first != train.dim || last != PS_FMNIST_CLASSES) {
        /* Before, the mlp read past each image (a larger first layer), read rows that were not
         * images (a smaller one), or met a label its last layer has no output for (abort). */
        fprintf(stderr, "psworker: %s: job.layers [%u, ..., %u]: the mlp takes the dataset's %u "
                "pixels and gives its %d classes, so the first must be %u and the last %d\n",
                manifest, first, last, train.dim, PS_FMNIST_CLASSES, train.dim,
                PS_FMNIST_CLASSES);
        ps_dataset_free(&train);
        ps_dataset_free(&test);
        return 2;
    }
    if (m.job.train_samples && m.job.train_samples < train.n) train.n = (uint32_t)m.job.train_samples;
    else if (m.job.train_samples > train.n) /* not an error: every sample is used, once said */
        fprintf(stderr, "psworker: job.train_samples %llu is more than the %u training images of "
                "%s: all %u are used\n", (unsigned long long)m.job.train_samples, train.n,
                m.job.dataset, train.n);
    const uint32_t W = m.job.workers, B = m.job.batch_size;
    /* The learning-rate schedule's length: the steps job.workers workers would take. */
    uint64_t total = ps_cursor_planned_steps(train.n, B, m.job.epochs, W);
    if (m.job.max_steps && m.job.max_steps < total) total = m.job.max_steps;
    const ps_optim_conf_t *oc = &m.job.optimizer;
    if (oc->schedule == PS_SCHED_COSINE && oc->decay_steps == 0 && oc->warmup_steps >= total) {
        /* As psd refuses such a declaration: said here first, as a manifest to fix (exit 2). */
        fprintf(stderr, "psworker: %s: job.optimizer.warmup_steps %llu is not below the job's "
                "%llu steps, where schedule cosine's decay ends (decay_steps 0): the rate would "
                "only warm up; lower warmup_steps or set decay_steps\n", manifest,
                (unsigned long long)oc->warmup_steps, (unsigned long long)total);
        ps_dataset_free(&train);
        ps_dataset_free(&test);
        return 2;
    }

    trainer_t tr = {.m = &m, .total = total};
    int rc = ps_mlp_create(&tr.mlp, m.job.layers, m.job.nlayers, B > 1000 ? B : 1000);
    if (rc) {
        fprintf(stderr, "psworker: cannot build the mlp: %s\n", ps_strerror(rc));
        return 1;
    }
    if (device >= 0 && (rc = ps_mlp_use_gpu(&tr.mlp, device, err, sizeof err)) != 0) {
        fprintf(stderr, "psworker: --device cuda:%d: %s\n", device, err);
        ps_mlp_destroy(&tr.mlp); /* still on the CPU: the failed use_gpu released the device */
        ps_dataset_free(&train);
        ps_dataset_free(&test);
        return rc == PS_ENOTSUP ? 2 : 1;
    }
    if (device >= 0)
        fprintf(stderr, "psworker: computing on CUDA device %d (%s)\n", device,
                psk_gpu_name(tr.mlp.gpu));
    uint64_t step = 0;
    FILE *metrics = NULL, *params = NULL;
    static char params_tmp[4200];
    int exit_code = 1;
    uint32_t *perm = malloc(train.n * sizeof *perm);
    float *x = malloc((size_t)B * train.dim * sizeof *x);
    float *eval_x = malloc((size_t)tr.mlp.max_batch * test.dim * sizeof *eval_x);
    uint8_t *y = malloc(B);
    if (!perm || !x || !eval_x || !y) { /* exit 1 without a word before */
        fprintf(stderr, "psworker: out of memory for the batch buffers (job.batch_size %u, "
                "%u training samples)\n", B, train.n);
        goto out;
    }
    if (params_path) {
        static char params_file[PATH_MAX];
        char perr[PATH_MAX + 256];
        if (ps_out_file_check(params_path, params_file, sizeof params_file, perr,
                              sizeof perr) != 0) {
            fprintf(stderr, "psworker: --params-out %s\n", perr);
            exit_code = 2;
            goto out;
        }
        params_path = params_file;
        int n = snprintf(params_tmp, sizeof params_tmp, "%s.tmp.%ld", params_path,
                         (long)getpid());
        if (n < 0 || (size_t)n >= sizeof params_tmp ||
            (params = fopen(params_tmp, "wb")) == NULL) {
            fprintf(stderr, "psworker: %s: %s\n", params_path,
                    n < 0 || (size_t)n >= sizeof params_tmp ? "path too long" : strerror(errno));
            goto out;
        }
    }
    /* After --params-out's check: a refused one leaves no emptied metrics file. */
    if (metrics_path && (metrics = open_out(metrics_path)) == NULL) {
        fprintf(stderr, "psworker: %s: %s\n", metrics_path, strerror(errno));
        goto out;
    }
    if (codec_override) {
        snprintf(m.job.compression.codec, sizeof m.job.compression.codec, "%s", codec_override);
        /* It replaces job.compression.codec only: said, since a rule or min_bytes that takes
         * every tensor leaves it nothing to do (a probe, session 47, found it silent). */
        if (m.job.compression.nrules > 0 || m.job.compression.min_bytes > 0)
            fprintf(stderr, "psworker: --codec %s replaces job.compression.codec; its rules and "
                    "min_bytes still choose for the tensors they take\n", codec_override);
    }
    epoch_log_t log = {.metrics = metrics, .test = &test, .eval_x = eval_x, .t0 = now_s(),
                       .pass = -1};
    log.epoch_t0 = log.t0;
    int64_t perm_pass = -1, last_pass = -1; /* last_pass: the job's, from its finished reply */
    if (local) {
        ps_mlp_init_params(&tr.mlp, m.job.seed);
        if ((rc = ps_local_create(&tr.local, &m, &tr.mlp, rank_codec, total)) != 0) {
            fprintf(stderr, "psworker: --local: %s\n", ps_strerror(rc));
            goto out;
        }
        ps_local_pull(&tr.local, &tr.mlp);
        /* The coordinator's hand-out with job.workers steady members: each step, ranks 0..W-1
         * take the next batches in order; the shards sum them in rank order. */
        ps_cursor_t cur;
        ps_cursor_init(&cur, train.n, B, m.job.epochs);
        uint64_t progress = 0, next_progress = 0; /* samples applied before the step */
        for (; !(m.job.max_steps && step >= m.job.max_steps) && !g_stop; step++) {
            uint32_t nm = 0;
            ps_batch_t b;
            for (uint32_t r = 0; r < W && ps_cursor_take(&cur, &b); r++, nm++) {
                epoch_log_pass(&log, &tr, (int64_t)b.pass, step, 1);
                if ((int64_t)b.pass != perm_pass) {
                    ps_batch_order(perm, train.n, m.job.seed, (uint32_t)b.pass);
                    perm_pass = (int64_t)b.pass;
                }
                ps_dataset_gather(&train, perm + b.offset, b.count, x, y);
                double loss = ps_mlp_train_step(&tr.mlp, x, y, b.count, NULL, NULL);
                if (device_failed(&tr.mlp)) goto out;
                epoch_log_loss(&log, &tr, step, loss);
                log.samples += b.count;
                next_progress += b.count;
                ps_local_push(&tr.local, r, &tr.mlp, step);
            }
            if (nm == 0) break;
            ps_local_apply(&tr.local, &tr.mlp, step, nm, progress);
            progress = next_progress;
            ps_local_pull(&tr.local, &tr.mlp);
            epoch_log_tick(&log, &tr, step);
        }
    } else {
        if ((rc = join_cluster(&tr, manifest, err, sizeof err)) != 0) {
            fprintf(stderr, "psworker: %s\n", err);
            exit_code = join_exit_code(rc);
            goto out;
        }
        ps_batch_info_t b, done = {0};
        int have_done = 0, pulled_ahead = 0;
        uint64_t pulled_version = UINT64_MAX;
        for (long requests = 1;; requests++) {
            if (g_stop) break;
            char at[32];
            snprintf(at, sizeof at, "batch:%ld", requests);
            test_stop(at);
            test_hang(at);
            rc = ps_client_next_batch(tr.client, train.n, have_done ? &done : NULL, &b);
            if (rc == 0 && !b.finished) {
                /* Under bsp the parameters of the batch's step; pulled already when the
                 * step is the one after the last (the usual case). */
                uint64_t want = m.job.consistency == PS_CONSIST_BSP ? b.step : 0;
                if (pulled_ahead) rc = pull_finish(&tr, &pulled_version);
                pulled_ahead = 0;
                if (rc == 0 && (pulled_version == UINT64_MAX || pulled_version < want)) {
                    if ((rc = pull_start(&tr, want)) == 0) rc = pull_finish(&tr, &pulled_version);
                }
            }
            if (rc == PS_ENOTMEMBER && !g_stop) {
                /* Dropped (e.g. stopped past the heartbeat timeout): join again as new. */
                if (pulled_ahead) pull_finish(&tr, NULL);
                pulled_ahead = have_done = 0;
                pulled_version = UINT64_MAX;
                if ((rc = rejoin(&tr, manifest, "", "")) != 0) {
                    exit_code = join_exit_code(rc);
                    goto out;
                }
                /* The pass it was in went on without it (its batches to others): its loss so
                 * far is not a pass's to report, and a later pass's first batch must not have
                 * it evaluate that pass again with later parameters (a soak: twice a pass). */
                log.samples_total += log.samples;
                log.samples = 0;
                log.loss_sum = 0;
                log.loss_n = 0;
                continue;
            }
            if (rc) {
                if (g_stop) break;
                fprintf(stderr, "psworker: rank %d: batch: %s\n", ps_client_rank(tr.client),
                        tr.failed ? tr.err : ps_client_error(tr.client));
                if (!tr.failed && refused(rc))
                    exit_code = 2; /* refused (another training set or model): not again */
                goto out;
            }
            if (b.finished) {
                step = b.step;
                last_pass = (int64_t)b.pass; /* 0 from an older psd */
                break;
            }
            step = b.step;
            tr.step = b.step;
            snprintf(at, sizeof at, "train:%ld", requests); /* its batch in hand, not pushed */
            test_hang(at);
            /* The lowest-ranked member evaluates (rank 0 against an older psd). */
            epoch_log_pass(&log, &tr, (int64_t)b.pass, step,
                           ps_client_leads(tr.client) || ps_client_rank(tr.client) == 0);
            if ((int64_t)b.pass != perm_pass) {
                ps_batch_order(perm, train.n, m.job.seed, (uint32_t)b.pass);
                perm_pass = (int64_t)b.pass;
            }
            ps_dataset_gather(&train, perm + b.offset, b.count, x, y);
            ps_client_group_begin(tr.client); /* the small gradients leave fused, at the end */
            double loss = ps_mlp_train_step(&tr.mlp, x, y, b.count, push_grad, &tr);
            ps_client_group_end(tr.client);
            if (device_failed(&tr.mlp)) goto out;
            epoch_log_loss(&log, &tr, step, loss);
            /* Pushes complete when their step is applied on every shard. */
            for (int t = 0; t < tr.mlp.ntensors; t++) wait_op(&tr, &tr.push_ops[t], "push", t, NULL);
            if (tr.failed) {
                rc = tr.failed;
                if (g_stop) break;
                if (rc == PS_ENOTMEMBER) {
                    /* The next request fails the same way and joins again. */
                    have_done = 0;
                    tr.failed = 0;
                    continue;
                }
                if (device_failed(&tr.mlp)) goto out; /* the device's words, not libps's */
                fprintf(stderr, "psworker: rank %d: step %llu: %s\n", ps_client_rank(tr.client),
                        (unsigned long long)step, tr.err);
                goto out;
            }
            log.samples += b.count;
            done = b;
            have_done = 1;
            ps_client_batch_done(tr.client, &done); /* a leave before the next request says it */
            /* Fetch the next step's parameters while the coordinator answers. */
            pulled_version = UINT64_MAX;
            if (pull_start(&tr, m.job.consistency == PS_CONSIST_BSP ? b.step + 1 : 0) == 0)
                pulled_ahead = 1;
            epoch_log_tick(&log, &tr, step);
        }
        if (pulled_ahead) pull_finish(&tr, NULL);
        uint64_t final = m.job.consistency == PS_CONSIST_BSP ? step : 0;
        test_stop("final");
        rc = g_stop ? 0 : pull_all(&tr, final, NULL);
        if (rc == PS_ENOTMEMBER && !g_stop) {
            /* Dropped as silent right as the job finished: the parameters are still there
             * for a new member to pull (a job complete hands it no batch). */
            if ((rc = rejoin(&tr, manifest, " before its final pull", " to pull")) != 0) {
                exit_code = join_exit_code(rc);
                goto out;
            }
            rc = pull_all(&tr, final, NULL);
        }
        if (rc && !g_stop) {
            fprintf(stderr, "psworker: final pull: %s\n", tr.err);
            goto out;
        }
    }
    if (g_stop) {
        fprintf(stderr, "psworker: rank %d: stopped by signal at step %llu\n",
                tr.client ? ps_client_rank(tr.client) : 0, (unsigned long long)step);
        if (metrics) /* not evaluated: a stop is not to wait for the test set */
            fprintf(metrics, "{\"final\": true, \"stopped_by_signal\": %d, \"step\": %llu, "
                             "\"test_accuracy\": null, \"samples\": %llu, \"wall_s\": %.3f}\n",
                    (int)g_stop, (unsigned long long)step,
                    (unsigned long long)(log.samples_total + log.samples), now_s() - log.t0);
        exit_code = 128 + g_stop;
        goto out;
    }
    {
        int rank = tr.client ? ps_client_rank(tr.client) : 0;
        int lead = rank == 0 || (tr.client && ps_client_leads(tr.client));
        if (lead && last_pass > log.pass && log.pass >= 0) {
            /* The job's last pass had no batch here: the pass open here is closed without a
             * figure (its parameters are gone), and the last one is evaluated for it. */
            epoch_log_pass(&log, &tr, last_pass, step, 0);
            epoch_log_pass(&log, &tr, INT64_MAX, step, 2);
        } else {
            epoch_log_pass(&log, &tr, INT64_MAX, step, lead);
        }
        double acc = eval_accuracy(&tr.mlp, &test, eval_x);
        if (device_failed(&tr.mlp)) goto out;
        fprintf(stderr, "rank %d  final test accuracy %.4f after %llu steps (%.1f s)\n", rank, acc,
                (unsigned long long)step, now_s() - log.t0);
        if (metrics) {
            fprintf(metrics, "{\"final\": true, \"step\": %llu, \"test_accuracy\": %.4f, "
                             "\"samples\": %llu, \"wall_s\": %.3f}\n",
                    (unsigned long long)step, acc, (unsigned long long)log.samples_total,
                    now_s() - log.t0);
        }
        if (params) {
            rc = write_params(&tr, params, params_tmp, params_path, step);
            params = NULL;
            if (rc) {
                fprintf(stderr, "psworker: %s: %s\n", params_path, strerror(-rc));
                goto out;
            }
        }
        exit_code = 0;
    }
out:
    /* A shard refused this worker back (its store lost, restored alone, gone back to an older
     * copy): exit as refused, 2, so that pslaunch starts no worker again, which its join would
     * refuse, or which under asp would train on a store that lost updates (session 67). */
    if (exit_code == 1 && !g_stop && ps_client_refused_back(tr.client)) {
        fprintf(stderr, "psworker: a shard refused this worker back: exit 2 (restore every shard "
                "from one checkpoint before starting workers again)\n");
        exit_code = 2;
    }
    free(perm);
    free(x);
    free(eval_x);
    free(y);
    for (int t = 0; t < tr.mlp.ntensors; t++)
        if (tr.push_ops[t]) ps_op_wait(tr.push_ops[t], NULL);
    g_client = NULL;
    ps_client_destroy(tr.client);
    if (params) { /* not written: the temporary file goes */
        fclose(params);
        unlink(params_tmp);
    }
    int metrics_bad = metrics && ferror(metrics);
    if (metrics && fclose(metrics) != 0) metrics_bad = 1;
    if (metrics_bad && exit_code == 0) {
        /* Every line was flushed as written, unchecked: a full disk lost them silently. */
        fprintf(stderr, "psworker: %s: writing the metrics failed\n", metrics_path);
        exit_code = 1;
    }
    ps_local_destroy(&tr.local);
    if (tr.mlp.gpu != NULL) {
        psk_gpu_free(tr.mlp.gpu, tr.d_stage);
        psk_gpu_free(tr.mlp.gpu, tr.d_residual);
        free(tr.h_back);
    }
    ps_mlp_destroy(&tr.mlp);
    ps_dataset_free(&train);
    ps_dataset_free(&test);
    return exit_code;
}
