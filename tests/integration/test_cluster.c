/* test_cluster.c: the real psd and psworker, several processes on 127.0.0.1: BSP training
 * matches the single-process reference, a data_dir serves one psd, a worker with another shape
 * is refused without harming the job, a SIGTERM'd cluster restarts where it stopped and
 * resumes training from there, and a bad manifest is refused with FILE:LINE: KEY.
 *
 * The tests assert behaviour, never timings: every wait is generous and only bounds a hang
 * (see CL_BUDGET_S in cluster.h). */
#include <check.h>
#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>
#include <unistd.h>

#include "cluster.h"
#include "expect.h"

/* The sum of every "KEY": N in @p p's log (each shard's status line has one). */
static unsigned long long sum_field(const cl_proc_t *p, const char *key)
{
    char *log = cl_log(p), want[64];
    snprintf(want, sizeof want, "\"%s\": ", key);
    unsigned long long sum = 0;
    for (const char *at = log; at && (at = strstr(at, want)) != NULL; at += strlen(want))
        sum += strtoull(at + strlen(want), NULL, 10);
    free(log);
    return sum;
}

/* psctl status --json of every shard of @p c, finished. */
static cl_proc_t *status_json(cl_cluster_t *c, const char *name)
{
    char *argv[] = {(char *)cl_binary("PSCTL"), "--manifest", c->manifest, "status", "--json",
                    NULL};
    cl_proc_t *ctl = cl_spawn(c, name, argv);
    EXPECT_EXIT(ctl, 0);
    char *out = cl_log(ctl); /* stdout and stderr: nothing but the JSON */
    EXPECT_JSON(out, strlen(out), "psctl status --json's output");
    free(out);
    return ctl;
}

/* Wait for workers @p w and check that both end with the parameters of the single-process
 * reference run with @p manifest (NULL: the cluster's). */
static void matches_local(cl_cluster_t *c, const char *manifest, cl_proc_t *w[2])
{
    EXPECT_EXIT(w[0], 0);
    EXPECT_EXIT(w[1], 0);
    cl_proc_t *ref = cl_worker_start(c, manifest, "local.params", true);
    EXPECT_EXIT(ref, 0);
    expect_same_params(w[0]->params, ref->params, 1e-5, 1e-7);
    expect_same_params(w[1]->params, ref->params, 1e-5, 1e-7);
}

/* Start two shards and two workers on @p c with @p manifest (NULL: the cluster's), wait for the
 * workers, and check that both end with the parameters of the single-process reference run
 * with the same manifest. The shards keep running: psd[]. */
static void two_by_two_matches_local(cl_cluster_t *c, const char *manifest, cl_proc_t *psd[2],
                                     cl_proc_t *w[2])
{
    psd[0] = cl_psd_start(c, 0, manifest, READY_S);
    psd[1] = cl_psd_start(c, 1, manifest, READY_S);
    w[0] = cl_worker_start(c, manifest, "w0.params", false);
    w[1] = cl_worker_start(c, manifest, "w1.params", false);
    matches_local(c, manifest, w);
}

/* (a) Two shards, two BSP workers: each ends with the parameters the single-process reference
 * computes from the same global batches (bit-identical today; the test allows float reordering). */
START_TEST(test_bsp_matches_local)
{
    cl_conf_t k = {.shards = 2,
                   .workers = 2,
                   .consistency = "bsp",
                   .optimizer = "{name: sgd, lr: 0.05}",
                   .max_steps = 50,
                   .batch_size = 64,
                   .start_wait_ms = CL_TOGETHER_MS};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2], *w[2];
    two_by_two_matches_local(c, NULL, psd, w);

    /* Both ranks were handed out, one to each worker. */
    char *l0 = cl_log(w[0]), *l1 = cl_log(w[1]);
    const char *r0 = "psworker: rank 0 joined at step 0 (50 planned for job.workers 2; ";
    const char *r1 = "psworker: rank 1 joined at step 0 (50 planned for job.workers 2; ";
    int ok = (strstr(l0, r0) && strstr(l1, r1)) || (strstr(l0, r1) && strstr(l1, r0));
    free(l0);
    free(l1);
    ck_assert_msg(ok, "want ranks 0 and 1 joined at step 0 of 50; logs: %s: %s; %s: %s", w[0]->name,
                  cl_tail(w[0]), w[1]->name, cl_tail(w[1]));
    /* On one host every pull and push was direct: the workers read the shards' stores and
     * wrote into their push areas themselves. */
    EXPECT_LOG(w[0], "shard 1: pulls read its store ");
    EXPECT_LOG(w[0], "shard 1: pushes write into its shared memory directly");
    cl_proc_t *ctl = status_json(c, "psctl");
    unsigned long long pulls = sum_field(ctl, "pulls"), direct = sum_field(ctl, "direct_pulls");
    ck_assert_msg(pulls > 0 && direct == pulls, "%llu pulls, %llu direct: %s", pulls, direct,
                  cl_tail(ctl));
    unsigned long long pushes = sum_field(ctl, "pushes"), dpush = sum_field(ctl, "direct_pushes");
    ck_assert_msg(pushes > 0 && dpush == pushes, "%llu pushes, %llu direct: %s", pushes, dpush,
                  cl_tail(ctl));
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* (a') fusion_bytes: 0: every small tensor travels alone, the result is the same, and the
 * shards saw no bundle. */
START_TEST(test_fusion_off_matches_local)
{
    cl_conf_t k = {.shards = 2,
                   .workers = 2,
                   .consistency = "bsp",
                   .optimizer = "{name: sgd, lr: 0.05}",
                   .max_steps = 30,
                   .batch_size = 64,
                   .top_extra = "fusion_bytes: 0\n",
                   .start_wait_ms = CL_TOGETHER_MS};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2], *w[2];
    two_by_two_matches_local(c, NULL, psd, w);
    cl_proc_t *ctl = status_json(c, "psctl");
    ck_assert_msg(sum_field(ctl, "bundles_received") == 0 && sum_field(ctl, "bundles_sent") == 0,
                  "bundles with fusion off: %s", cl_tail(ctl));
    ck_assert_msg(sum_field(ctl, "pushes") > 0, "no pushes counted: %s", cl_tail(ctl));
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* "KEY": N of shard @p shard in psctl status --json output @p p (-1: not found). */
static long long shard_field(const cl_proc_t *p, int shard, const char *key)
{
    char *log = cl_log(p), want[64], at_shard[32];
    snprintf(at_shard, sizeof at_shard, "{\"shard\": %d, ", shard);
    snprintf(want, sizeof want, "\"%s\": ", key);
    const char *o = log ? strstr(log, at_shard) : NULL, *v = o ? strstr(o, want) : NULL;
    long long n = v ? strtoll(v + strlen(want), NULL, 10) : -1;
    free(log);
    return n;
}

/* The direct-path tests' cluster: 2 shards, 2 bsp workers, 30 steps with @p optimizer, chunks
 * of @p chunk_bytes (0: the harness's 64 KiB). */
static cl_cluster_t *direct_cluster_chunks(const char *optimizer, uint64_t chunk_bytes)
{
    cl_conf_t k = {.shards = 2,
                   .workers = 2,
                   .consistency = "bsp",
                   .optimizer = optimizer,
                   .max_steps = 30,
                   .batch_size = 64,
                   .chunk_bytes = chunk_bytes,
                   .start_wait_ms = CL_TOGETHER_MS};
    return cl_cluster_create(&k);
}

static cl_cluster_t *direct_cluster(const char *optimizer)
{
    return direct_cluster_chunks(optimizer, 0);
}

/* Shard 0 of @p c (stopped) refuses to start on its data_dir with optimizer @p optimizer (a YAML
 * flow mapping), whose state is of another kind than the stored @p stored. */
static void expect_state_refused(cl_cluster_t *c, const char *optimizer, const char *stored)
{
    cl_conf_t k = c->conf;
    k.optimizer = optimizer;
    char path[CL_PATH], shard0[] = "0", want[256];
    cl_manifest_write(c, "other-optimizer.yaml", &k, path, sizeof path);
    char *argv[] = {(char *)cl_binary("PSD"), "--manifest", path, "--shard", shard0, NULL};
    cl_proc_t *b = cl_spawn(c, "psd-other-optimizer", argv);
    EXPECT_EXIT(b, 1);
    snprintf(want, sizeof want, "data_dir was made with another optimizer state kind (stored '%s', "
             "this manifest has '", stored);
    EXPECT_LOG(b, want);
}

/* psd as shard 0 of a manifest written from @p c's configuration with @p diff's shards or
 * optimizer (where set; NULL: none), or, with @p swap_to, the manifest of @p c with shard 0's
 * data_dir swapped for shard @p swap_to's: refuses to start (exit 1), saying @p says. */
static void expect_refused(cl_cluster_t *c, const char *name, const cl_conf_t *diff,
                           const char *swap_to, const char *says)
{
    cl_conf_t k = c->conf;
    if (diff && diff->shards) k.shards = diff->shards;
    if (diff && diff->optimizer) k.optimizer = diff->optimizer;
    char path[CL_PATH], shard0[] = "0";
    char saved[CL_PATH];
    if (swap_to) {
        int j = atoi(swap_to);
        snprintf(saved, sizeof saved, "%s", c->data_dir[0]);
        snprintf(c->data_dir[0], sizeof c->data_dir[0], "%s", c->data_dir[j]);
        snprintf(c->data_dir[j], sizeof c->data_dir[j], "%s", saved);
        cl_manifest_write(c, name, &k, path, sizeof path);
        snprintf(c->data_dir[j], sizeof c->data_dir[j], "%s", c->data_dir[0]);
        snprintf(c->data_dir[0], sizeof c->data_dir[0], "%s", saved);
    } else {
        cl_manifest_write(c, name, &k, path, sizeof path);
    }
    char *argv[] = {(char *)cl_binary("PSD"), "--manifest", path, "--shard", shard0, NULL};
    cl_proc_t *b = cl_spawn(c, name, argv);
    EXPECT_EXIT(b, 1);
    EXPECT_LOG(b, says);
}

/* adagrad (its lr decay, weight decay and initial accumulator all on) trains on two shards to
 * the single-process reference's parameters. Its store then refuses a manifest whose optimizer
 * keeps as many state floats but another kind of state (momentum's velocity). */
START_TEST(test_adagrad_matches_local)
{
    cl_cluster_t *c = direct_cluster("{name: adagrad, lr: 0.05, lr_decay: 0.01, "
                                     "weight_decay: 0.0001, initial_accumulator_value: 0.1}");
    cl_proc_t *psd[2], *w[2];
    two_by_two_matches_local(c, NULL, psd, w);
    EXPECT_LOG(psd[0], "workers wanted, bsp, adagrad, "); /* its start-up line */
    stop_all(psd, 2);

    expect_state_refused(c, "{name: momentum, lr: 0.05}", "adagrad squared-gradient sums");
    /* Another count of state arrays is named by the optimizers' state too (a probe, session
     * 45: "data_dir was made with optimizer state 2, this manifest has 0"). */
    expect_refused(c, "sgd.yaml", &(cl_conf_t){.optimizer = "{name: sgd, lr: 0.05}"}, NULL,
                   "data_dir was made for an optimizer that keeps 1 state arrays per parameter "
                   "(adagrad squared-gradient sums), this manifest's keeps 0 (");
    /* A data_dir opened under a manifest with other servers, or as another shard: refused,
     * naming both layouts (a probe, session 45: shard 0's data_dir of this 2-shard cluster
     * served under a 1-shard manifest, called a trained tensor untrained, and psctl forget
     * dropped it; swapped, each shard held the other's chunks). */
    expect_refused(c, "one-shard.yaml", &(cl_conf_t){.shards = 1}, NULL,
                   "data_dir was made with another layout (stored 'shard 0 of 2', this manifest "
                   "has 'shard 0 of 1'): its chunks are placed for the stored layout");
    expect_refused(c, "swapped.yaml", NULL, "1",
                   "data_dir was made with another layout (stored 'shard 1 of 2', this manifest "
                   "has 'shard 0 of 2')");
    cl_cluster_destroy(c);
}
END_TEST

/* PS_DIRECT_PULL=0 and PS_DIRECT_PUSH=0 for what starts while @p off holds (inherited). */
static void direct_off(bool off)
{
    if (off) {
        setenv("PS_DIRECT_PULL", "0", 1);
        setenv("PS_DIRECT_PUSH", "0", 1);
    } else {
        unsetenv("PS_DIRECT_PULL");
        unsetenv("PS_DIRECT_PUSH");
    }
}

/* Two mistakes a libps caller can make, refused without harm (mean_client's misuse mode, bsp,
 * one worker): a push before its first batch fails with PS_EINVAL, and the client goes on
 * (before: PS_ENOTMEMBER, and the client counted itself removed for good: its next_batch
 * failed); an int8 push with error feedback of a NaN, which int8 cannot encode, goes as fp32
 * and psd leaves it out (session 37; before, it failed at once: PS_EINVAL, and psd.torch's
 * step raised), and the next clean push of that tensor goes through (before session 31: the
 * residual took the NaN, and every later push of the tensor failed); and a PS_TENSOR_MEAN
 * tensor compressed so that its values would be zeroed or flattened (topk, int8) or carry the
 * last step's rounding (error feedback), refused (session 59; before, taken); a residual kept
 * when a tensor's compression is set again (before, zeroed); a top-k push left out for a NaN
 * gives its error feedback back (session 60; before, the residual kept its finite values); and
 * error feedback turned off (codec none, or error_feedback 0) sends what the residual held with
 * the next push (session 62; before, dropped), and an fp16 pull of a parameter beyond fp16's
 * range reads as an infinity, which psd says (session 62; before, silently). */
START_TEST(test_libps_misuse_harmless)
{
    cl_conf_t k = {.shards = 2, .workers = 1, .consistency = "bsp", .optimizer = "{name: mean}"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    char numel[] = "1000", steps[] = "2", mode[] = "misuse";
    char *argv[] = {(char *)cl_binary("MEAN_CLIENT"), c->manifest, numel, steps, mode, NULL};
    cl_proc_t *a = cl_spawn(c, "mean-misuse", argv);
    EXPECT_EXIT(a, 0);
    EXPECT_LOG(a, "a push before any batch refused: ");
    EXPECT_LOG(a, "a NaN under int8 with error feedback left out, the next push taken");
    EXPECT_LOG(a, "batches not done refused as done");
    EXPECT_LOG(a, "a mean tensor refused sparse, quantized and error-fed codecs, took fp16 and "
                  "raw");
    EXPECT_LOG(a, "the residual outlived a second ps_client_set_compression");
    EXPECT_LOG(a, "a push left out for a NaN gave its error feedback back");
    EXPECT_LOG(a, "error feedback turned off sent what its residual held");
    EXPECT_LOG(a, "an fp16 pull of 70000 read as an infinity");
    char *l0 = cl_log(psd[0]), *l1 = cl_log(psd[1]);
    const char *warned = "a pull of tensor 'mean.o' in fp16 (chunk 0): 1 of its parameters are "
                         "beyond fp16's range (up to 70000";
    ck_assert_msg(strstr(l0, warned) || strstr(l1, warned), "no shard said \"%s\": %s | %s",
                  warned, cl_tail(psd[0]), cl_tail(psd[1]));
    free(l0);
    free(l1);
    EXPECT_LOG(a, "2 steps, every pull the exact mean");
    /* A worker of another model (mean.t alone) trains on: the others stay at step 2, which
     * psctl status names (session 62: it named nothing, and every checkpoint waited). */
    char resume_mode[] = "resume", three[] = "3";
    char *ra[] = {(char *)cl_binary("MEAN_CLIENT"), c->manifest, numel, three, resume_mode, NULL};
    cl_proc_t *rs = cl_spawn(c, "mean-resume", ra);
    EXPECT_EXIT(rs, 0);
    char status[] = "status";
    char *sa[] = {(char *)cl_binary("PSCTL"), "--manifest", c->manifest, status, NULL};
    cl_proc_t *st = cl_spawn(c, "psctl-status", sa);
    EXPECT_EXIT(st, 0);
    EXPECT_LOG(st, "trained tensors stay behind the job's step (the first: 'mean.");
    EXPECT_LOG(st, "at step 2): no member pushes them (a model that no longer has them?)");
    EXPECT_LOG(st, "forget NAME --trained drops one");
    /* The job has no member now: a tensor a push reached is kept by psctl forget (naming the
     * way out) and dropped by forget --trained (session 62: a model that lost a tensor left it
     * holding every bsp step, checkpoint and export back for good, with no remedy). */
    char fname[] = "mean.e", fverb[] = "forget", trained_opt[] = "--trained";
    char *fa[] = {(char *)cl_binary("PSCTL"), "--manifest", c->manifest, fverb, fname, NULL};
    cl_proc_t *f1 = cl_spawn(c, "psctl-forget", fa);
    EXPECT_EXIT(f1, 1);
    EXPECT_LOG(f1, "took updates (psctl forget --trained drops a trained tensor, its values lost, "
                   "while the job has no member)");
    char *fb[] = {(char *)cl_binary("PSCTL"), "--manifest", c->manifest, fverb, fname, trained_opt,
                  NULL};
    cl_proc_t *f2 = cl_spawn(c, "psctl-forget-trained", fb);
    EXPECT_EXIT(f2, 0);
    EXPECT_LOG(f2, "tensor 'mean.e' dropped from 2 shards (with any values it was trained to)");
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* bsp with optimizer mean, 2 shards, 2 workers that both join step 0. */
static const cl_conf_t mean_conf = {.shards = 2,
                                    .workers = 2,
                                    .consistency = "bsp",
                                    .optimizer = "{name: mean}",
                                    .job_extra = "  heartbeat_timeout_ms: 10000\n"};

/* Two mean_clients (argument @p mode, or none) on cluster @p c for @p steps steps of a tensor
 * of @p values values, one over UCX only, one direct; both must find every pull the exact
 * mean. mean_pair: 40000 values (160000 bytes: 3 chunks of 64 KiB at most). */
static void mean_pair_of(cl_cluster_t *c, const char *values, int steps, const char *mode)
{
    char numel[24], nsteps[16], want[64];
    snprintf(numel, sizeof numel, "%s", values);
    snprintf(nsteps, sizeof nsteps, "%d", steps);
    snprintf(want, sizeof want, "%d steps, every pull the exact mean", steps);
    char *argv[] = {(char *)cl_binary("MEAN_CLIENT"), c->manifest, numel, nsteps,
                    (char *)mode, NULL};
    direct_off(true);
    cl_proc_t *a = cl_spawn(c, "mean-ucx", argv);
    direct_off(false);
    cl_proc_t *b = cl_spawn(c, "mean-direct", argv);
    EXPECT_EXIT(a, 0);
    EXPECT_EXIT(b, 0);
    EXPECT_LOG(a, want);
    EXPECT_LOG(b, want);
}

static void mean_pair(cl_cluster_t *c, int steps, const char *mode)
{
    mean_pair_of(c, "40000", steps, mode);
}

/* A member without a gradient of a tensor in a step (ps_client_push_none, torch's `.grad`
 * None) counts as a zero in the step's mean (mean_client's nograd mode: over UCX and direct,
 * 3 chunks on 2 shards), and a step in which no member has one leaves the values as they were.
 * Before, libps had no such push: a worker pushed zeros, so under momentum, adam or weight
 * decay the shards moved parameters that no worker's model had used. */
START_TEST(test_mean_push_none)
{
    cl_cluster_t *c = cl_cluster_create(&mean_conf);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    mean_pair(c, 8, "nograd");
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* A push holding a NaN or an infinity is left out of its chunk's update as one without a
 * gradient would be (mean_client's nonfinite mode: the nograd schedule, those pushes made with
 * a non-finite value in each chunk instead of push_none; the same means bit for bit, over UCX
 * and direct), acknowledged so (libps counts it), counted by psd (status, metrics, psctl status)
 * and logged. Before, psd applied it: "element 0 is nan, the mean is ...". */
START_TEST(test_mean_nonfinite_left_out)
{
    cl_cluster_t *c = cl_cluster_create(&mean_conf);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    mean_pair(c, 8, "nonfinite");
    cl_proc_t *ctl = status_json(c, "psctl");
    /* Steps 0-7 hold 8 such pushes (steps 0, 2, 5, 6: one rank; 3, 7: both), of 3 chunks. */
    unsigned long long odd = sum_field(ctl, "nonfinite_pushes");
    ck_assert_msg(odd == 24, "%llu pushes left out as not finite, want 24: %s", odd, cl_tail(ctl));
    char *argv[] = {(char *)cl_binary("PSCTL"), "--manifest", c->manifest, "status", NULL};
    cl_proc_t *st = cl_spawn(c, "psctl-text", argv);
    EXPECT_EXIT(st, 0);
    EXPECT_LOG(st, "held a NaN or an infinity and were left out of their update (the last: rank");
    EXPECT_LOG(psd[0], "holding a NaN or an infinity: left out of its update as a push without "
                       "a gradient");
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* The schedule under job.max_steps follows the steps, which max_steps counts whatever the
 * number of workers: one worker of job.workers 2 runs bsp's 300 steps (and under asp its own
 * 300 batches), and the cosine decay ends with them (the last update's rate, /status's
 * learning_rate, ~1e-6 of 0.1). By data, a planned step being 2 workers' samples, the position
 * was only half way at the end (rate ~0.05), and with 3 workers the last third of a run
 * trained at min_lr (a review, session 72). */
START_TEST(test_cosine_follows_max_steps)
{
    static const char *const modes[] = {"bsp", "asp"};
    for (int i = 0; i < 2; i++) {
        cl_conf_t k = {.shards = 1, .workers = 2, .consistency = modes[i], .max_steps = 300,
                       .layers = "[784, 16, 10]",
                       .optimizer = "{name: sgd, lr: 0.1, schedule: cosine, warmup_steps: 0}"};
        cl_cluster_t *c = cl_cluster_create(&k);
        cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
        cl_proc_t *w = cl_worker_start(c, NULL, NULL, false);
        EXPECT_EXIT(w, 0);
        cl_proc_t *ctl = status_json(c, "psctl");
        char *log = cl_log(ctl);
        const char *at = strstr(log, "\"learning_rate\": ");
        double lr = at ? strtod(at + 17, NULL) : -1;
        ck_assert_msg(lr >= 0 && lr < 1e-4, "%s: the last update's rate %g, want the decay's "
                      "end (~1e-6): %s", modes[i], lr, log);
        free(log);
        stop_all(&psd, 1);
        cl_cluster_destroy(c);
    }
}
END_TEST

/* A model that diverges (sgd with lr 1e30: the loss turns NaN within steps): psworker says so
 * once, naming the step, and --metrics-out writes that loss as null, each line one JSON value,
 * in a cluster and alone. Before, the lines said "train_loss": -nan, which no JSON reader
 * takes, and nothing said the run had diverged. */
START_TEST(test_diverged_loss_said)
{
    cl_conf_t k = {.shards = 1, .workers = 1, .optimizer = "{name: sgd, lr: 1.0e30}",
                   .max_steps = 30};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    for (int local = 0; local < 2; local++) {
        char mpath[CL_PATH];
        cl_path(c, local ? "local.jsonl" : "cluster.jsonl", mpath, sizeof mpath);
        const char *ma[] = {"--metrics-out", mpath, NULL};
        cl_proc_t *w = cl_worker_spawn(c, NULL, NULL, local, ma);
        EXPECT_EXIT(w, 0);
        ck_assert_msg(count_in_log(w, "the model diverged (a lower job.optimizer.lr may help)") == 1,
                      "want one word of the diverged loss: %s", cl_tail(w));
        EXPECT_LOG(w, "psworker: rank 0: the training loss is ");
        char *f = cl_read_file(mpath, NULL);
        ck_assert_msg(f != NULL, "%s: %s", mpath, strerror(errno));
        int lines = 0;
        for (char *l = f, *e; *l; l = e + 1, lines++) {
            e = strchr(l, '\n');
            ck_assert_msg(e != NULL, "%s: a line without its newline: %s", mpath, l);
            EXPECT_JSON(l, (size_t)(e - l), mpath);
        }
        ck_assert_msg(lines == 2 && strstr(f, "\"train_loss\": null, ") &&
                          strstr(f, "\"final\": true, "),
                      "%s: want an epoch line with a null loss and the final line: %s", mpath, f);
        free(f);
    }
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* optimizer mean: two libps workers (one over UCX only, one direct) push different gradients
 * for 6 steps of a tensor of 3 chunks on 2 shards; every pull is the exact mean of the step's
 * pushes (mean_client.c checks the bits), never a sum over steps. psworker refuses such a
 * manifest: the shards keep no model to train. */
START_TEST(test_mean_keeps_the_mean)
{
    cl_cluster_t *c = cl_cluster_create(&mean_conf);
    cl_proc_t *psd[2];
    psd[0] = cl_psd_start(c, 0, NULL, READY_S);
    psd[1] = cl_psd_start(c, 1, NULL, READY_S);
    EXPECT_LOG(psd[0], "workers wanted, bsp, mean, "); /* its start-up line */
    mean_pair(c, 6, NULL);
    /* Each worker pushed 6 steps x 3 chunks: a's over UCX, every one of b's into the push areas
     * (its first chunk of each push at once, the others on the comm thread's later turns). */
    cl_proc_t *ctl = status_json(c, "psctl");
    unsigned long long pushes = sum_field(ctl, "pushes"), dpush = sum_field(ctl, "direct_pushes");
    ck_assert_msg(pushes == 36 && dpush == 18, "%llu pushes, %llu direct, want 36 and 18: %s",
                  pushes, dpush, cl_tail(ctl));
    /* Both left right after their last step's pushes were acknowledged, without asking for
     * another batch: the leave carried that batch (ps_client_batch_done), so all 6 steps x 2
     * batches of 64 are counted. Before, the last step's 2 batches were handed out again. */
    unsigned long long applied = sum_field(ctl, "samples_applied");
    ck_assert_msg(applied == 768, "%llu samples applied, want 768: %s", applied, cl_tail(ctl));
    EXPECT_LOG(psd[0], "leaves with its batch of step 5 done");

    cl_proc_t *w = cl_worker_start(c, NULL, NULL, false);
    EXPECT_EXIT(w, 2);
    EXPECT_LOG(w, "job.optimizer.name mean keeps no model on the shards");
    stop_all(psd, 2);

    /* Its records are gradients: the data_dir does not open as sgd's model. */
    expect_state_refused(c, "{name: sgd, lr: 0.05}", "mean gradients, no model");
    cl_cluster_destroy(c);
}
END_TEST

/* Shard 0 served every one of @p key over the transport, shard 1 some (not all) directly. */
static void expect_direct_on_shard1_only(const cl_proc_t *ctl, const char *key,
                                         const char *direct_key)
{
    long long p0 = shard_field(ctl, 0, key), d0 = shard_field(ctl, 0, direct_key);
    long long p1 = shard_field(ctl, 1, key), d1 = shard_field(ctl, 1, direct_key);
    ck_assert_msg(p0 > 0 && d0 == 0 && d1 > 0 && d1 < p1,
                  "shard 0: %lld %s, %lld direct; shard 1: %lld, %lld: %s", p0, key, d0, p1, d1,
                  cl_tail(ctl));
}

/* (a'') PS_DIRECT_PULL=0 and PS_DIRECT_PUSH=0 on either side: shard 0 offers no store and no
 * push area; worker 0 opens none. Only worker 1's pulls from and pushes to shard 1 are direct,
 * and the result is the same. */
START_TEST(test_direct_off_matches_local)
{
    cl_cluster_t *c = direct_cluster("{name: adam, lr: 0.01}");
    direct_off(true);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), NULL};
    cl_proc_t *w[2] = {NULL, NULL};
    direct_off(false);
    psd[1] = cl_psd_start(c, 1, NULL, READY_S);
    direct_off(true);
    w[0] = cl_worker_start(c, NULL, "w0.params", false);
    direct_off(false);
    w[1] = cl_worker_start(c, NULL, "w1.params", false);
    matches_local(c, NULL, w);
    EXPECT_LOG(psd[0], "direct pulls off (PS_DIRECT_PULL=0)");
    EXPECT_LOG(w[1], "shard 1: pulls read its store ");
    char *l0 = cl_log(w[0]), *l1 = cl_log(w[1]);
    int w0_direct = strstr(l0, "pulls read its store") != NULL ||
                    strstr(l0, "pushes write into") != NULL;
    int w1_shard0 = strstr(l1, "shard 0: pulls read its store") != NULL ||
                    strstr(l1, "shard 0: pushes write into") != NULL;
    free(l0);
    free(l1);
    ck_assert_msg(!w0_direct && !w1_shard0, "a direct view where it was switched off: %s: %s",
                  w[0]->name, cl_tail(w[0]));
    cl_proc_t *ctl = status_json(c, "psctl");
    expect_direct_on_shard1_only(ctl, "pulls", "direct_pulls");
    expect_direct_on_shard1_only(ctl, "pushes", "direct_pushes");
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* (a'''') Direct pulls and pushes off and 1 MiB chunks: the first layer's 784 KiB chunk (on
 * shard 0) goes out by rendezvous, which each worker copies out of the shard's map by cma, and
 * psd streams the update after such a pull into the record (psd_conn_t.peer_reads, pull.c):
 * the result is still the reference's. */
START_TEST(test_cma_pulls_match_local)
{
    cl_cluster_t *c = direct_cluster_chunks("{name: adam, lr: 0.01}", 1 << 20);
    cl_proc_t *psd[2], *w[2];
    direct_off(true);
    two_by_two_matches_local(c, NULL, psd, w);
    direct_off(false);
    EXPECT_LOG(psd[0], "direct pulls off (PS_DIRECT_PULL=0)");
    /* The workers' lanes ("peer ... over sysv,cma"): a host that forbids cross-process reads
     * (ptrace restrictions) or a UCX_TLS without cma takes another rendezvous; still exact. */
    char *l = cl_log(psd[0]);
    if (strstr(l, ",cma") == NULL)
        fprintf(stderr, "cma_pulls_match_local: no cma among the lanes here: the streamed "
                        "path after cma pulls was not reached\n");
    free(l);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* (a''') The first worker to join pushes directly, the second (PS_DIRECT_PUSH=0) over the
 * transport: a step's sum then starts from a push in a push area (psd sums into its apply
 * thread's span buffer, never writing the area), and the result is the reference's. (The
 * other order is direct_off_matches_local's.) */
START_TEST(test_direct_push_mixed)
{
    cl_cluster_t *c = direct_cluster("{name: adam, lr: 0.01}");
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    cl_proc_t *w[2];
    w[0] = cl_worker_start(c, NULL, "w0.params", false);
    ck_assert_msg(cl_wait_log(w[0], "joined at step", RUN_S) == 0, "w0 never joined: %s",
                  cl_tail(w[0]));
    setenv("PS_DIRECT_PUSH", "0", 1);
    w[1] = cl_worker_start(c, NULL, "w1.params", false);
    unsetenv("PS_DIRECT_PUSH");
    matches_local(c, NULL, w);
    EXPECT_LOG(w[0], "rank 0 joined at step");
    cl_proc_t *ctl = status_json(c, "psctl");
    unsigned long long pushes = sum_field(ctl, "pushes"), dpush = sum_field(ctl, "direct_pushes");
    ck_assert_msg(dpush > 0 && dpush < pushes, "%llu pushes, %llu direct: %s", pushes, dpush,
                  cl_tail(ctl));
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* (a'''') A worker whose read of a shard's store fails mid-run (PS_TEST_DIRECT_FAIL: its 40th
 * direct read) says so, pulls that chunk and every later one from that shard over the
 * transport, and still ends with the reference's parameters. */
START_TEST(test_direct_fails_over)
{
    cl_cluster_t *c = direct_cluster("{name: sgd, lr: 0.05}");
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    setenv("PS_TEST_DIRECT_FAIL", "40", 1); /* the workers' only */
    cl_proc_t *w[2] = {cl_worker_start(c, NULL, "w0.params", false),
                       cl_worker_start(c, NULL, "w1.params", false)};
    unsetenv("PS_TEST_DIRECT_FAIL");
    matches_local(c, NULL, w);
    EXPECT_LOG(w[0], "from its store failed (shard store error); pulling over the transport");
    EXPECT_LOG(w[1], "from its store failed (shard store error); pulling over the transport");
    cl_proc_t *ctl = status_json(c, "psctl");
    unsigned long long pulls = sum_field(ctl, "pulls"), direct = sum_field(ctl, "direct_pulls");
    ck_assert_msg(direct > 0 && direct < pulls, "%llu pulls, %llu direct: %s", pulls, direct,
                  cl_tail(ctl));
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* (a'''''') A shard that offers a plain file as a worker's push area (PS_TEST_AREA_FILE: as a
 * confused shard, or a process on its port, could name a file of the worker's user): libps
 * does not write into it, says why, and pushes over the transport. Before, a file on a
 * filesystem without seals (ext4 here) passed the seal check (F_GET_SEALS's -1 has every bit
 * set) and the worker's gradients overwrote its first bytes (a review, session 72). */
START_TEST(test_direct_push_plain_file_refused)
{
    cl_conf_t k = {.shards = 1, .workers = 1, .max_steps = 10};
    cl_cluster_t *c = cl_cluster_create(&k);
    char plain[CL_PATH];
    cl_path(c, "plain.bin", plain, sizeof plain); /* under the test's directory: not tmpfs */
    static const char keep[] = "the user's data, not a push area";
    FILE *f = fopen(plain, "w");
    ck_assert_msg(f && fwrite(keep, 1, sizeof keep, f) == sizeof keep && fclose(f) == 0, "%s: %s",
                  plain, strerror(errno));
    cl_proc_t *psd = cl_psd_start_env(c, 0, READY_S, "PS_TEST_AREA_FILE", plain);
    cl_proc_t *w = cl_worker_start(c, NULL, NULL, false);
    EXPECT_EXIT(w, 0);
    EXPECT_LOG(w, "shard 0: pushes go over the transport, slower: the push area it offers at "
                  "/proc/");
    EXPECT_LOG(w, "is not one this process may write (not psd's sealed memory: a plain file)");
    char *after = cl_read_file(plain, NULL);
    ck_assert_msg(after && memcmp(after, keep, sizeof keep) == 0, "%s was written into: '%.40s'",
                  plain, after ? after : "(gone)");
    free(after);
    cl_proc_t *ctl = status_json(c, "psctl");
    ck_assert_msg(sum_field(ctl, "pushes") > 0 && sum_field(ctl, "direct_pushes") == 0,
                  "pushes went into the file: %s", cl_tail(ctl));
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* (a''''') Over TCP only (UCX_TLS=tcp for every process), 32 KiB chunks, so every shard gets
 * several chunks of the larger tensors, and training still ends with the reference's
 * parameters. With @p eager, psd's and libps's default: data messages under 512 KiB are sent
 * eagerly on tcp (PS_EAGER_BELOW), and sends may complete at once instead of in a callback,
 * which libps's push window must follow. Without, PS_EAGER_BYTES=0 leaves the choice to UCX, which sends these chunks by rendezvous: libps keeps at most PS_PUSH_WINDOW of
 * them in flight to a shard and sends the next as one completes. */
static void tcp_matches_local(bool eager)
{
    setenv("UCX_TLS", "tcp", 1); /* this test's process (forked) and what it starts */
    setenv("PS_DIRECT_PULL", "0", 1); /* pulls and pushes cross tcp too, not shared memory */
    setenv("PS_DIRECT_PUSH", "0", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1); /* the shm settings psd sets go unused */
    if (!eager) setenv("PS_EAGER_BYTES", "0", 1);
    cl_conf_t k = {.shards = 2,
                   .workers = 2,
                   .consistency = "bsp",
                   .optimizer = "{name: adam, lr: 0.01}",
                   .max_steps = 20,
                   .batch_size = 64,
                   .chunk_bytes = 32768,
                   .start_wait_ms = CL_TOGETHER_MS};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2], *w[2];
    two_by_two_matches_local(c, NULL, psd, w);
    EXPECT_LOG(psd[0], ") over tcp");
    EXPECT_LOG(psd[1], ") over tcp");
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}

/* The hot path allocates nothing (issue #3: no malloc per chunk or per message): psd's own code
 * and libps's make no allocation in 200 steps of an adam model (a tensor of 3 chunks over two
 * shards and a small one fused with it, one worker) after 20 steps of warm-up. @p mode: bsp over
 * psd's direct path ("direct"), UCX's shared memory ("shm") or tcp ("tcp"); "topk": bsp with
 * compression (direct path); "asp": asp on the direct path. alloc_count.so, preloaded, counts
 * the allocations whose caller is in psd's executable or in hot_client's (libps is a static
 * library: its code is there, and hot_client's own allocates nothing during the steps); what
 * UCX, LMDB and libuv allocate inside is theirs (alloc_count.h). hot_client reads the counts
 * between the steps and names the sites. */
static void hot_path_allocations(const char *mode)
{
    if (strcmp(mode, "shm") == 0 || strcmp(mode, "tcp") == 0) direct_off(true);
    if (strcmp(mode, "topk") == 0) setenv("HOT_CODEC", "topk:0.05", 1);
    if (strcmp(mode, "tcp") == 0) {
        setenv("UCX_TLS", "tcp", 1);
        setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    }
    cl_conf_t k = {.shards = 2,
                   .workers = 1,
                   .consistency = strcmp(mode, "asp") == 0 ? "asp" : "bsp",
                   .optimizer = "{name: adam, lr: 0.001}",
                   .chunk_bytes = 65536};
    cl_cluster_t *c = cl_cluster_create(&k);
    char counts[3][CL_PATH];
    cl_proc_t *psd[2];
    setenv("LD_PRELOAD", cl_binary("ALLOC_COUNT_SO"), 1);
    setenv("ALLOC_COUNT_OBJ", "", 1); /* the main program: psd, and hot_client with libps */
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "psd%d.counts", i);
        cl_path(c, name, counts[i], sizeof counts[i]);
        setenv("ALLOC_COUNT_FILE", counts[i], 1);
        psd[i] = cl_psd_start(c, i, NULL, READY_S);
    }
    cl_path(c, "client.counts", counts[2], sizeof counts[2]);
    setenv("ALLOC_COUNT_FILE", counts[2], 1);
    char numel[] = "40000", warm[] = "20", steps[] = "200"; /* 3 chunks of 64 KiB at most */
    char *argv[] = {(char *)cl_binary("HOT_CLIENT"), c->manifest, numel, warm, steps,
                    counts[0], counts[1], NULL};
    cl_proc_t *w = cl_spawn(c, "hot-client", argv);
    unsetenv("LD_PRELOAD");
    EXPECT_EXIT(w, 0);
    EXPECT_LOG(w, "libps made 0 allocations in 200 steps");
    EXPECT_LOG(w, "psd0.counts made 0 allocations in 200 steps");
    EXPECT_LOG(w, "psd1.counts made 0 allocations in 200 steps");
    if (strcmp(mode, "topk") == 0) EXPECT_LOG(w, " 0 of hot.big's pulled values are not bf16");
    if (strcmp(mode, "direct") == 0 || strcmp(mode, "asp") == 0) { /* the direct path */
        cl_proc_t *ctl = status_json(c, "psctl");
        ck_assert_msg(sum_field(ctl, "direct_pushes") > 0 && sum_field(ctl, "direct_pulls") > 0,
                      "no direct pushes or pulls: %s", cl_tail(ctl));
    }
    stop_all(psd, 2);
    cl_cluster_destroy(c);
    direct_off(false);
    const char *vars[] = {"HOT_CODEC", "UCX_TLS", "UCX_WARN_UNUSED_ENV_VARS", "ALLOC_COUNT_FILE",
                          "ALLOC_COUNT_OBJ"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

START_TEST(test_hot_path_allocations_direct) { hot_path_allocations("direct"); }
END_TEST

START_TEST(test_hot_path_allocations_shm) { hot_path_allocations("shm"); }
END_TEST

START_TEST(test_hot_path_allocations_tcp) { hot_path_allocations("tcp"); }
END_TEST

/* The same with compression: top-k pushes with error feedback and bf16 pulls, int8 pushes of
 * the small tensor. */
START_TEST(test_hot_path_allocations_topk) { hot_path_allocations("topk"); }
END_TEST

/* And under asp, where each push is applied on its own as it lands (direct path). */
START_TEST(test_hot_path_allocations_asp) { hot_path_allocations("asp"); }
END_TEST

START_TEST(test_tcp_matches_local) { tcp_matches_local(false); }
END_TEST

START_TEST(test_tcp_eager_matches_local) { tcp_matches_local(true); }
END_TEST

/* (b) A second psd on a data_dir in use is refused, naming the dir; the first one keeps
 * serving. */
START_TEST(test_data_dir_in_use)
{
    cl_conf_t k = {.shards = 1, .workers = 1, .max_steps = 5};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *first = cl_psd_start(c, 0, NULL, READY_S);

    cl_proc_t *second = cl_psd_spawn(c, 0, NULL);
    ck_assert_msg(cl_psd_wait_ready(second, READY_S) != 0,
                  "a second psd on %s said it is listening", c->data_dir[0]);
    int st = cl_wait(second, RUN_S);
    ck_assert_msg(st > 0 && st < 128, "the second psd: status %d, want an exit > 0; its log: %s",
                  st, cl_tail(second));
    EXPECT_LOG(second, c->data_dir[0]);
    EXPECT_LOG(second, "in use by another psd");

    ck_assert_msg(cl_alive(first), "the first psd died; its log: %s", cl_tail(first));
    cl_proc_t *w = cl_worker_start(c, NULL, NULL, false);
    EXPECT_EXIT(w, 0);
    EXPECT_LOG(w, "psworker: rank 0 joined at step 0 (5 planned for job.workers 1; ");
    stop_all(&first, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* A worker whose manifest cuts tensors into other chunks, or runs another consistency, than
 * the cluster's is refused at its hello with both values named (exit 2, a manifest error: not
 * one pslaunch --respawn replaces), one of another job.seed or job.batch_size at its first
 * batch request; the shard serves on.
 * Before, the first was admitted and failed with ~25 "has no chunk N" warnings that never said
 * why, and the second was admitted silently. */
/* A worker on manifest @p file written from @p conf exits 2, its log saying @p says. */
static void worker_refused(cl_cluster_t *c, const char *file, const cl_conf_t *conf,
                           const char *says)
{
    char path[CL_PATH];
    cl_manifest_write(c, file, conf, path, sizeof path);
    cl_proc_t *w = cl_worker_start(c, path, NULL, false);
    EXPECT_EXIT(w, 2);
    EXPECT_LOG(w, says);
}

START_TEST(test_worker_manifest_mismatch_refused)
{
    cl_conf_t k = {.shards = 1, .workers = 1, .max_steps = 5};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    cl_conf_t other = c->conf;
    other.chunk_bytes = 16384;
    worker_refused(c, "other-chunks.yaml", &other,
                   "has chunk_bytes 65536, the worker's manifest 16384");
    other = c->conf;
    other.consistency = "asp";
    worker_refused(c, "other-consistency.yaml", &other,
                   "runs job.consistency bsp, the worker's manifest asp");
    /* Another seed (each pass's order: its batches would name other samples than the
     * others') or batch_size (it took fewer samples than a batch holds: it wrote past its
     * buffers) is refused at the batch request (an operator probe, session 61; before, both
     * were taken without a word). */
    other = c->conf;
    other.seed = 2;
    /* ... also with a smaller training set: a request refused names no set for the job (a
     * review, session 63: it did, for good, and w3 below was refused "the job's has 640"). */
    other.job_extra = "  train_samples: 640\n";
    worker_refused(c, "other-seed.yaml", &other, "this worker's job.seed is 2, the job's 1");
    other.job_extra = NULL;
    other = c->conf;
    other.batch_size = 32;
    worker_refused(c, "other-batch.yaml", &other, "this worker's job.batch_size is 32, the job's "
                   "64 (as it was made");
    cl_proc_t *w3 = cl_worker_start(c, NULL, NULL, false); /* and it still serves */
    EXPECT_EXIT(w3, 0);
    /* Another model (a restore under a manifest with other layers, a probe, session 46): its
     * tensors are refused, and it exits 2, which pslaunch does not start again (was 1). */
    other = c->conf;
    other.layers = "[784, 64, 10]";
    worker_refused(c, "other-layers.yaml", &other,
                   "declared with shape [784, 64], but it exists with shape [784, 256]");
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
    /* The servers listed in another order: the first hello reaches shard 1 as "shard 0". */
    cl_conf_t k2 = {.shards = 2, .workers = 1, .max_steps = 5};
    c = cl_cluster_create(&k2);
    cl_proc_t *two[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    char path[CL_PATH];
    char *text = cl_read_file(c->manifest, NULL);
    char *a = strstr(text, "  - {host:"); /* the two server lines, swapped */
    cl_path(c, "swapped.yaml", path, sizeof path);
    ck_assert_ptr_nonnull(a);
    char *b = strchr(a, '\n') + 1, *rest = strchr(b, '\n') + 1;
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%.*s%.*s%.*s%s", (int)(a - text), text, (int)(rest - b), b, (int)(b - a), a, rest);
    fclose(f);
    char one[CL_PATH]; /* shard 0's line alone: a manifest of one shard */
    cl_path(c, "one-shard.yaml", one, sizeof one);
    f = fopen(one, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%.*s%s", (int)(b - text), text, rest);
    fclose(f);
    free(text);
    cl_proc_t *w5 = cl_worker_start(c, one, NULL, false);
    EXPECT_EXIT(w5, 2);
    EXPECT_LOG(w5, "has 2 shards, the worker's manifest lists 1");
    cl_proc_t *w4 = cl_worker_start(c, path, NULL, false);
    EXPECT_EXIT(w4, 2);
    EXPECT_LOG(w4, "is shard 1 of cluster");
    EXPECT_LOG(w4, "the worker's manifest lists it as shard 0: its servers are in another order");
    char *st[] = {(char *)cl_binary("PSCTL"), "--manifest", path, "status", NULL};
    cl_proc_t *ctl = cl_spawn(c, "psctl-swapped", st); /* says so too (before: a normal table) */
    EXPECT_EXIT(ctl, 1);
    EXPECT_LOG(ctl, "answered as shard 1: this manifest lists the cluster's servers in another "
                    "order");
    stop_all(two, 2);
    /* A shard whose host is not this machine's (192.0.2.1, TEST-NET-1): psd says so (a probe,
     * session 45: UCX's "Input/output error" alone). */
    text = cl_read_file(c->manifest, NULL);
    a = strstr(text, "127.0.0.1");
    ck_assert_ptr_nonnull(a);
    cl_path(c, "elsewhere.yaml", path, sizeof path);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%.*s192.0.2.1%s", (int)(a - text), text, a + strlen("127.0.0.1"));
    fclose(f);
    free(text);
    char shard0[] = "0";
    char *el[] = {(char *)cl_binary("PSD"), "--manifest", path, "--shard", shard0, NULL};
    cl_proc_t *e = cl_spawn(c, "psd-elsewhere", el);
    EXPECT_EXIT(e, 1);
    EXPECT_LOG(e, "cannot listen on 192.0.2.1:");
    EXPECT_LOG(e, "(that address is not one of this host's: does the manifest name another "
                  "machine for this shard");
    /* A relative data_dir: psctl check says that psd and psctl each take it from their own
     * working directory (an operator probe, session 61: psctl checkpoint's default directory
     * was then not psd's). */
    text = cl_read_file(c->manifest, NULL);
    a = strstr(text, c->data_dir[0]);
    ck_assert_ptr_nonnull(a);
    cl_path(c, "relative.yaml", path, sizeof path);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%.*srel/data0%s", (int)(a - text), text, a + strlen(c->data_dir[0]));
    fclose(f);
    free(text);
    char *ck[] = {(char *)cl_binary("PSCTL"), "--manifest", path, "check", NULL};
    cl_proc_t *chk = cl_spawn(c, "psctl-check-relative", ck);
    EXPECT_EXIT(chk, 0);
    EXPECT_LOG(chk, "data_dir rel/data0 (relative: each psd and psctl takes it from its own "
                    "working directory");
    cl_cluster_destroy(c);
}
END_TEST

/* A finished job whose manifest's job.epochs was raised goes on for the passes it adds once
 * psd starts again (as for a raised job.max_steps), each pass applying every sample once.
 * Before, it stayed finished and the workers only evaluated (an operator probe, session 61). */
START_TEST(test_epochs_raised_goes_on)
{
    cl_conf_t k = {.shards = 1, .workers = 1, .epochs = 1, .job_extra = "  train_samples: 640\n"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    cl_proc_t *w = cl_worker_start(c, NULL, NULL, false);
    EXPECT_EXIT(w, 0);
    stop_all(&psd, 1);
    cl_conf_t k2 = c->conf;
    k2.epochs = 2;
    cl_manifest_write(c, "manifest.yaml", &k2, c->manifest, sizeof c->manifest);
    psd = cl_psd_start(c, 0, NULL, READY_S);
    EXPECT_LOG(psd, "job.epochs raised from 1 to 2: the job goes on for the passes it adds");
    EXPECT_LOG(psd, "the job ended at step 10; job.max_steps is 0 and job.epochs 2 now: it goes "
                    "on");
    cl_proc_t *w2 = cl_worker_start(c, NULL, NULL, false);
    EXPECT_EXIT(w2, 0);
    EXPECT_LOG(w2, "joined at step 10");
    cl_proc_t *st = status_json(c, "status-after");
    EXPECT_LOG(st, "{\"pass\": 0, \"applied\": 640}");
    EXPECT_LOG(st, "{\"pass\": 1, \"applied\": 640}");
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* (c) A worker whose model has another shape is refused with both shapes named; the job goes
 * on, and the rank it held is given to the next worker. The job wants 3 workers: with 2, the
 * refused one's hello could complete the first step's members, and the first worker then
 * trained all 20 steps alone after it left (1 run in 40), before the next one joined. With 3
 * the first step waits for the next one (or a heartbeat timeout). */
START_TEST(test_conflicting_shape)
{
    cl_conf_t k = {.shards = 2, .workers = 3, .consistency = "bsp", .max_steps = 20};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};

    cl_proc_t *a = cl_worker_start(c, NULL, NULL, false);
    ck_assert_msg(cl_wait_log(a, "joined at step", RUN_S) == 0, "%s did not join; its log: %s",
                  a->name, cl_tail(a));
    EXPECT_LOG(a, "psworker: rank 0 joined at step 0 (20 planned for job.workers 3; ");

    /* Same cluster, only job.layers differs: fc1.weight is [784, 128], not [784, 256]. */
    cl_conf_t kb = k;
    kb.layers = "[784, 128, 10]";
    char mb[CL_PATH];
    cl_manifest_write(c, "manifest-b.yaml", &kb, mb, sizeof mb);
    cl_proc_t *b = cl_worker_start(c, mb, NULL, false);
    int st = cl_wait(b, RUN_S);
    ck_assert_msg(st > 0 && st < 128, "%s (other shape): status %d, want an exit > 0; its log: %s",
                  b->name, st, cl_tail(b));
    EXPECT_LOG(b, "'fc1.weight'");
    EXPECT_LOG(b, "[784, 128]");
    EXPECT_LOG(b, "[784, 256]");

    /* Its rank is free again once shard 0 has seen it go. */
    char left[96];
    snprintf(left, sizeof left, "rank 1 (pid %ld) left", (long)b->pid);
    ck_assert_msg(cl_wait_log(psd[0], left, RUN_S) == 0, "psd0 never logged \"%s\"; its log: %s",
                  left, cl_tail(psd[0]));
    ck_assert_msg(cl_alive(a), "%s died with the refused worker; its log: %s", a->name, cl_tail(a));

    cl_proc_t *w = cl_worker_start(c, NULL, NULL, false);
    EXPECT_EXIT(a, 0);
    EXPECT_EXIT(w, 0);
    /* The rank is the point; the step is 0 unless the job's start wait (3 s) ran out first
     * (a loaded host). */
    EXPECT_LOG(w, "psworker: rank 1 joined at step ");
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* Two shards and two BSP adam workers train 30 steps (worker 0 writes @p params0, may be
 * NULL), then SIGTERM stops both shards, which must exit 0. */
static cl_cluster_t *train_30_and_stop(cl_proc_t **psd, const char *params0)
{
    cl_conf_t k = {.shards = 2,
                   .workers = 2,
                   .consistency = "bsp",
                   .optimizer = "{name: adam, lr: 0.001}",
                   .max_steps = 30,
                   .start_wait_ms = CL_TOGETHER_MS};
    cl_cluster_t *c = cl_cluster_create(&k);
    psd[0] = cl_psd_start(c, 0, NULL, READY_S);
    psd[1] = cl_psd_start(c, 1, NULL, READY_S);
    cl_proc_t *w[2] = {cl_worker_start(c, NULL, params0, false),
                       cl_worker_start(c, NULL, NULL, false)};
    EXPECT_EXIT(w[0], 0);
    EXPECT_EXIT(w[1], 0);
    stop_all(psd, 2);
    return c;
}

/* (d) SIGTERM stops both shards cleanly; restarted on the same data_dirs, they serve the
 * parameters they stopped with, at the step they stopped at. */
START_TEST(test_sigterm_restart)
{
    cl_proc_t *psd[2];
    cl_cluster_t *c = train_30_and_stop(psd, "w0.params");
    char w0[CL_PATH];
    cl_path(c, "w0.params", w0, sizeof w0);
    cl_params_t p;
    char err[512];
    ck_assert_msg(cl_params_read(&p, w0, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(p.step, 30);
    cl_params_free(&p);

    psd[0] = cl_psd_start(c, 0, NULL, READY_S);
    psd[1] = cl_psd_start(c, 1, NULL, READY_S);

    cl_proc_t *again = cl_worker_start(c, NULL, "again.params", false);
    EXPECT_EXIT(again, 0);
    EXPECT_LOG(again, "joined at step 30 (30 planned");
    /* The very values stored at step 30: nothing is recomputed. */
    expect_same_params(again->params, w0, 0, 0);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* (f) A restarted cluster resumes: stopped at step 30, given max_steps 40, two workers carry on
 * from step 30 and end where an uninterrupted single-process run of 40 steps ends (the adam
 * state and the step count survive the restart). */
START_TEST(test_restart_resumes)
{
    cl_proc_t *psd[2], *w[2];
    cl_cluster_t *c = train_30_and_stop(psd, NULL);

    cl_conf_t k40 = c->conf;
    k40.max_steps = 40;
    char m40[CL_PATH];
    cl_manifest_write(c, "manifest-40.yaml", &k40, m40, sizeof m40);
    two_by_two_matches_local(c, m40, psd, w);
    EXPECT_LOG(w[0], "joined at step 30 (40 planned");
    EXPECT_LOG(w[1], "joined at step 30 (40 planned");
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* (e) An unknown manifest key: psd (and psworker) exit 2 naming FILE:LINE: KEY. */
START_TEST(test_bad_manifest)
{
    cl_conf_t k = {.shards = 1, .job_extra = "  learning_rate: 0.1\n"};
    cl_cluster_t *c = cl_cluster_create(&k);
    int line = cl_line_of(c->manifest, "learning_rate");
    ck_assert_int_gt(line, 0);
    char want[CL_PATH + 96];
    snprintf(want, sizeof want, "%s:%d: job.learning_rate: unknown key", c->manifest, line);

    cl_proc_t *s = cl_psd_spawn(c, 0, NULL);
    EXPECT_EXIT(s, 2);
    EXPECT_LOG(s, want);
    cl_proc_t *w = cl_worker_start(c, NULL, NULL, false);
    EXPECT_EXIT(w, 2);
    EXPECT_LOG(w, want);
    cl_cluster_destroy(c);
    /* Layers the dataset does not fit: psworker says which (with --local too, no shard needed).
     * Before, [784, 32, 5] aborted on the first label above 4, [4000, 32, 10] read past the
     * images (SIGSEGV), and [100, 32, 10] trained on rows that were not images. */
    const char *const bad[] = {"[784, 32, 5]", "[4000, 32, 10]", "[100, 32, 10]"};
    for (int i = 0; i < 3; i++) {
        cl_conf_t kl = {.shards = 1, .layers = bad[i], .max_steps = 3};
        cl_cluster_t *cl = cl_cluster_create(&kl);
        cl_proc_t *l = cl_worker_start(cl, NULL, NULL, true);
        EXPECT_EXIT(l, 2);
        /* A last layer other than 10 is the manifest's own error now (psctl check says it). */
        EXPECT_LOG(l, i == 0 ? "job.layers[2]: the mlp's last layer gives Fashion-MNIST's 10 "
                               "classes: must be 10, got 5"
                             : "the first must be 784 and the last 10");
        cl_cluster_destroy(cl);
    }
    /* A cosine warm-up as long as the job's steps, where the decay ends by default: the rate
     * only climbed (a review, session 71). psworker refuses it as a manifest to fix. */
    cl_conf_t kw = {.shards = 1, .max_steps = 50,
                    .optimizer = "{name: sgd, lr: 0.05, schedule: cosine, warmup_steps: 50}"};
    cl_cluster_t *cw = cl_cluster_create(&kw);
    cl_proc_t *l = cl_worker_start(cw, NULL, NULL, false);
    EXPECT_EXIT(l, 2);
    EXPECT_LOG(l, "job.optimizer.warmup_steps 50 is not below the job's 50 steps, where schedule "
                  "cosine's decay ends (decay_steps 0): the rate would only warm up");
    cl_cluster_destroy(cw);
}
END_TEST


/* psworker with cluster @p c's manifest plus @p job_extra (written as @p file); --local or not. */
static cl_proc_t *worker_job_extra(cl_cluster_t *c, const char *file, const char *job_extra,
                                   bool local)
{
    cl_conf_t k = c->conf;
    k.job_extra = job_extra;
    char path[CL_PATH];
    cl_manifest_write(c, file, &k, path, sizeof path);
    return cl_worker_start(c, path, NULL, local);
}

/* psworker options that were taken wrongly (found by a probe): "--rank-codec =int8" meant rank
 * 0, a rank past job.workers and --rank-codec or --self-test in the wrong mode were ignored
 * (exit 2 now); an unwritable --params-out failed only after the whole training (now before
 * it, with no file left: exit 2 for a directory that is not there, as for an argument refused;
 * 1 for one it cannot write in); metrics that could not be written ended with exit 0. And
 * --device: a device that is not there is refused before any training (exit 2). */
START_TEST(test_psworker_options)
{
    cl_conf_t k = {.shards = 1, .workers = 2, .max_steps = 2};
    cl_cluster_t *c = cl_cluster_create(&k);
    static const struct {
        const char *args[5];
        bool local;
        int exit;
        const char *says;
        bool untrained; /* it failed before the training */
    } cases[] = {
        {{"--rank-codec", "=int8"}, true, 2, "expected RANK=CODEC"},
        {{"--rank-codec", "1=topk:2"}, true, 2, "unknown codec 'topk:2': none, fp16, "},
        {{"--rank-codec", "1=int8", "--rank-codec", "1=fp16"}, true, 2,
         "--rank-codec 1=fp16: rank 1 has a codec already (int8)", true},
        {{"--rank-codec", "2=int8"}, true, 2, "job.workers = 2 ranks"},
        {{"--rank-codec", "1=int8"}, false, 2, "--rank-codec is for --local"},
        {{"--self-test"}, true, 2, "does not go with --local"},
        {{"--params-out", "/nonexistent-psd-dir/params.bin"}, true, 2,
         "--params-out /nonexistent-psd-dir/params.bin: its directory /nonexistent-psd-dir: No "
         "such file or directory", true},
        {{"--metrics-out", "/dev/full"}, true, 1, "/dev/full: writing the metrics failed"},
        /* --device: a name it does not know, a device this host lacks (no GPU here, or fewer
         * than 1001), and the transport self-test, which computes nothing. */
        {{"--device", "gpu"}, true, 2, "--device gpu: expected cpu, cuda or cuda:N", true},
        {{"--device", "cuda:1000"}, true, 2, "psworker: --device cuda:1000: ", true},
        {{"--self-test", "--device", "cuda"}, false, 2, "does not go with --device", true},
        {{"--device", "cpu"}, true, 0, "final test accuracy"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cl_proc_t *w = cl_worker_spawn(c, NULL, NULL, cases[i].local, cases[i].args);
        EXPECT_EXIT(w, cases[i].exit);
        EXPECT_LOG(w, cases[i].says);
        if (cases[i].untrained)
            ck_assert_msg(strstr(cl_tail(w), "final test accuracy") == NULL, "%s", cl_tail(w));
    }
    /* --params-out naming a FIFO (or a device): refused before training, the node left as it
     * is (a probe, session 45: the rename put a regular file in its place; as root, the same
     * made /dev/null a regular file). A symlink to a file: the file is written, the link
     * stays. */
    char fifo[CL_PATH], real[CL_PATH], link[CL_PATH];
    cl_path(c, "params.fifo", fifo, sizeof fifo);
    cl_path(c, "params.real", real, sizeof real);
    cl_path(c, "params.link", link, sizeof link);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    const char *fa[] = {"--params-out", fifo, NULL};
    cl_proc_t *fw = cl_worker_spawn(c, NULL, NULL, true, fa);
    EXPECT_EXIT(fw, 2);
    EXPECT_LOG(fw, "is a FIFO, not a regular file: a file renamed there would replace it");
    ck_assert_msg(strstr(cl_tail(fw), "final test accuracy") == NULL, "%s", cl_tail(fw));
    struct stat fs;
    ck_assert(lstat(fifo, &fs) == 0 && S_ISFIFO(fs.st_mode));
    FILE *rf = fopen(real, "w");
    ck_assert_ptr_nonnull(rf);
    fclose(rf);
    ck_assert_int_eq(symlink(real, link), 0);
    const char *la[] = {"--params-out", link, NULL};
    cl_proc_t *lw = cl_worker_spawn(c, NULL, NULL, true, la);
    EXPECT_EXIT(lw, 0);
    ck_assert(lstat(link, &fs) == 0 && S_ISLNK(fs.st_mode));
    ck_assert_msg(stat(real, &fs) == 0 && fs.st_size > 0, "%s is empty", real);
    /* --metrics-out a FIFO nobody reads: the open blocks, and SIGTERM ends it (a probe,
     * session 45: the handler's restart kept it waiting until SIGKILL). */
    char mfifo[CL_PATH];
    cl_path(c, "metrics.fifo", mfifo, sizeof mfifo);
    ck_assert_int_eq(mkfifo(mfifo, 0600), 0);
    const char *ma[] = {"--metrics-out", mfifo, NULL};
    cl_proc_t *mw = cl_worker_spawn(c, NULL, NULL, true, ma);
    char wchan[64] = "";
    for (int i = 0; i < 500 && strcmp(wchan, "fifo_open") != 0; i++) { /* blocked in the open */
        char wp[64];
        snprintf(wp, sizeof wp, "/proc/%d/wchan", (int)mw->pid);
        FILE *wf = fopen(wp, "r");
        if (wf && fgets(wchan, sizeof wchan, wf) == NULL) wchan[0] = '\0';
        if (wf) fclose(wf);
        if (strcmp(wchan, "fifo_open") != 0) usleep(20000);
    }
    ck_assert_int_eq(cl_signal(mw, SIGTERM), 0);
    int mst = cl_wait(mw, RUN_S);
    ck_assert_msg(mst == 128 + SIGTERM || mst == 1, "psworker blocked opening a FIFO: "
                  "status %d after SIGTERM (wchan '%s'): %s", mst, wchan, cl_tail(mw));
    /* A job.dataset with no dataset in it (a typo): the message names job.dataset (a probe,
     * session 56: only the Debian package was named). Exit 1, not 2: a dataset on a mount
     * not there yet may come, and pslaunch --follow would end for good on a 2. */
    char nods[CL_PATH];
    cl_path(c, "no-dataset-here", nods, sizeof nods);
    const char *was = getenv("PS_DATASET");
    char keep[CL_PATH] = "";
    if (was) snprintf(keep, sizeof keep, "%s", was);
    setenv("PS_DATASET", nods, 1);
    cl_proc_t *nd = worker_job_extra(c, "manifest-nods.yaml", "", true);
    if (was) setenv("PS_DATASET", keep, 1);
    else unsetenv("PS_DATASET");
    EXPECT_EXIT(nd, 1);
    EXPECT_LOG(nd, "no-dataset-here/train-images-idx3-ubyte.gz: not found (job.dataset names ");
    /* More training samples asked for than the dataset has: all are used, and it says so. */
    cl_proc_t *l = worker_job_extra(c, "manifest-many.yaml", "  train_samples: 100000\n", true);
    EXPECT_EXIT(l, 0);
    EXPECT_LOG(l, "job.train_samples 100000 is more than the 60000 training images of ");
    /* A worker the shards refuse at its batch request (another training set than the job's)
     * exits 2 as at its hello, so that pslaunch --respawn does not start it again (exit 1
     * before). */
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    cl_proc_t *a = cl_worker_start(c, NULL, NULL, false);
    EXPECT_EXIT(a, 0);
    cl_proc_t *b = worker_job_extra(c, "manifest-small.yaml", "  train_samples: 1000\n", false);
    EXPECT_EXIT(b, 2);
    EXPECT_LOG(b, "this worker's training set has 1000 samples, the job's has 60000");
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* psctl status: every shard answers with its step, tensors, chunks and members. */
/* psctl status and scale run by another user than psd's (nobody; psd runs as root here): the
 * operator's tools leave shared memory out of their transports (PS_UCX_TLS_CONTROL), which
 * only psd's user may attach. Before, UCX failed "shmat(...) failed: Permission denied" and
 * psctl exited 1 (a psd run as a service's user answered nobody else but root). Skipped where
 * this does not run as root, or nobody cannot reach psctl (runuser: 126 / 127). */
static void psctl_as_nobody(cl_cluster_t *c)
{
    if (geteuid() != 0) {
        fprintf(stderr, "psctl_status: not root: psctl as another user not tried\n");
        return;
    }
    char base[CL_PATH];
    snprintf(base, sizeof base, "%s", c->dir);
    ck_assert(chmod(c->dir, 0711) == 0 && chmod(dirname(base), 0711) == 0); /* to the manifest */
    const char *verbs[][3] = {{"status", NULL, NULL}, {"scale", "1", NULL}};
    for (int i = 0; i < 2; i++) {
        char *as[] = {"/usr/sbin/runuser", "-u", "nobody", "--", (char *)cl_binary("PSCTL"),
                      "--manifest", c->manifest, (char *)verbs[i][0], (char *)verbs[i][1], NULL};
        cl_proc_t *o = cl_spawn(c, i ? "psctl-nobody-scale" : "psctl-nobody", as);
        int st = cl_wait(o, 60);
        if (st == 126 || st == 127) {
            fprintf(stderr, "psctl_status: nobody cannot run psctl here (%d): not tried\n", st);
            return;
        }
        ck_assert_msg(st == 0, "psctl %s as nobody: exit %d: %s", verbs[i][0], st, cl_tail(o));
        ck_assert_msg(!strstr(cl_tail(o), "Permission denied"), "%s", cl_tail(o));
    }
}

START_TEST(test_psctl_status)
{
    cl_conf_t k = {.shards = 2, .workers = 1, .max_steps = 20};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    cl_proc_t *w = cl_worker_start(c, NULL, NULL, false);
    EXPECT_EXIT(w, 0);
    char *argv[] = {(char *)cl_binary("PSCTL"), "--manifest", c->manifest, "status", "--json",
                    NULL};
    cl_proc_t *ctl = cl_spawn(c, "psctl", argv);
    EXPECT_EXIT(ctl, 0);
    EXPECT_LOG(ctl, "{\"shard\": 0, ");
    EXPECT_LOG(ctl, "{\"shard\": 1, ");
    EXPECT_LOG(ctl, "\"step\": 20, ");
    EXPECT_LOG(ctl, "\"tensors\": 6, ");
    /* The small tensors (biases, the last layer) went fused: both ways. */
    ck_assert_msg(sum_field(ctl, "bundles_received") > 0 && sum_field(ctl, "bundles_sent") > 0,
                  "no bundles in the status: %s", cl_tail(ctl));
    psctl_as_nobody(c);
    /* One shard down: psctl names it and fails. */
    ck_assert_int_eq(cl_signal(psd[1], SIGTERM), 0);
    EXPECT_EXIT(psd[1], 0);
    char *argv2[] = {(char *)cl_binary("PSCTL"), "--manifest", c->manifest, "status",
                     "--timeout", "2", NULL};
    cl_proc_t *ctl2 = cl_spawn(c, "psctl2", argv2);
    EXPECT_EXIT(ctl2, 1);
    EXPECT_LOG(ctl2, "psctl: shard 1 (127.0.0.1:");
    stop_all(psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* psworker --self-test: every shard's transports and measured bandwidth, then it leaves. psd
 * logs the transports of each peer at its hello. */
START_TEST(test_self_test)
{
    cl_conf_t k = {.shards = 2, .workers = 1};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    char *argv[] = {(char *)cl_binary("PSWORKER"), "--manifest", c->manifest, "--self-test", NULL};
    cl_proc_t *t = cl_spawn(c, "selftest", argv);
    EXPECT_EXIT(t, 0);
    EXPECT_LOG(t, "shard 0 (127.0.0.1:");
    EXPECT_LOG(t, "shard 1 (127.0.0.1:");
    EXPECT_LOG(t, "GB/s with 4 MiB messages");
    EXPECT_LOG(t, "on this host: pulls read its store directly, pushes into its shared memory");
    char *log = cl_log(t);
    ck_assert_msg(strstr(log, "over unknown") == NULL, "transports not recognised: %s", log);
    free(log);
    EXPECT_LOG(psd[0], ") over ");
    /* A manifest of another cluster: refused, exit 2 as a training worker's refused join (the
     * code pslaunch does not start again on); before, 1. */
    char other[CL_PATH];
    cl_manifest_other_cluster(c, other);
    char *argv2[] = {(char *)cl_binary("PSWORKER"), "--manifest", other, "--self-test", NULL};
    t = cl_spawn(c, "selftest-other", argv2);
    EXPECT_EXIT(t, 2);
    EXPECT_LOG(t, "', not 'other-");
    /* psctl checkpoint --follow with it: exit 1 at the refusal, as the other verbs (before, it
     * asked again every second for good; a review, session 71). */
    FILE *f = fopen(other, "a");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "checkpoint: {every_s: 1}\n");
    fclose(f);
    char *argv4[] = {(char *)cl_binary("PSCTL"), "--manifest", other, "checkpoint", "--follow",
                     NULL};
    cl_proc_t *fo = cl_spawn(c, "follow-other", argv4);
    EXPECT_EXIT(fo, 1);
    EXPECT_LOG(fo, "', not 'other-");
    EXPECT_LOG(fo, "psctl: follow: stopping at that error after 0 checkpoints");
    stop_all(psd, 2);
    /* psd with it, on this cluster's data_dir: refused, naming both clusters (before, the
     * stored one only: a README audit, session 48). */
    char shard0[] = "0", want[2 * CL_PATH];
    char *argv3[] = {(char *)cl_binary("PSD"), "--manifest", other, "--shard", shard0, NULL};
    cl_proc_t *o = cl_spawn(c, "psd-other", argv3);
    EXPECT_EXIT(o, 1);
    snprintf(want, sizeof want, "data_dir was made with another cluster (stored '%s', this "
             "manifest has 'other-%s')", c->cluster_name, c->cluster_name);
    EXPECT_LOG(o, want);
    cl_cluster_destroy(c);
}
END_TEST

/* The value of "KEY": in one line of a trace file, into @p out (a string's characters, or a
 * number's text); "" when the line has no such key. */
static void trace_field(const char *line, const char *key, char *out, size_t cap)
{
    char want[32];
    snprintf(want, sizeof want, "\"%s\":", key);
    const char *at = strstr(line, want);
    out[0] = '\0';
    if (at == NULL) return;
    at += strlen(want);
    size_t n = 0;
    if (*at == '"')
        for (at++; *at && *at != '"' && n + 1 < cap; at++) out[n++] = *at;
    else
        for (; *at && *at != ',' && *at != '}' && n + 1 < cap; at++) out[n++] = *at;
    out[n] = '\0';
}

/* What a test counts in a trace file (psd --trace, libps PS_TRACE). */
typedef struct {
    unsigned long long names;       /* "ph" M: the process and its lanes */
    unsigned long long push, push_direct, push_span; /* psd: pushes landed ("push T/C") */
    unsigned long long pull, pull_direct;            /* psd: pull spans ("pull T/C") */
    unsigned long long applies;     /* psd: apply jobs */
    unsigned long long push_ops, pull_ops, acked, landed; /* libps: ops, chunks */
    unsigned long long took_push, took_pull; /* libps: chunks its comm thread took to send */
    unsigned long long spans, ended;
} trace_count_t;

/* Read trace @p path and check its form: a JSON array, one event per line, each one psd or
 * libps writes, every async span's end at or after its start; count what it holds. */
static trace_count_t trace_read(const char *path)
{
    trace_count_t k = {0};
    size_t len;
    char *text = cl_read_file(path, &len);
    ck_assert_msg(text != NULL && len > 0, "no trace at %s", path);
    size_t nlines = 1;
    for (size_t i = 0; i < len; i++) nlines += text[i] == '\n';
    double *begun = calloc(nlines + 1, sizeof *begun); /* by async span id */
    ck_assert_ptr_nonnull(begun);
    char *save = NULL, ph[8], name[64], cat[16], direct[8], num[32];
    int lineno = 0;
    bool closed = false;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        if (lineno == 1) {
            ck_assert_msg(strcmp(line, "[") == 0, "%s: line 1 is not '[': %s", path, line);
            continue;
        }
        if (strcmp(line, "]") == 0) {
            closed = true;
            continue;
        }
        size_t n = strlen(line);
        if (n && line[n - 1] == ',') line[--n] = '\0';
        ck_assert_msg(!closed && n > 2 && line[0] == '{' && line[n - 1] == '}',
                      "%s: line %d is not one event: %s", path, lineno, line);
        trace_field(line, "ph", ph, sizeof ph);
        trace_field(line, "name", name, sizeof name);
        trace_field(line, "cat", cat, sizeof cat);
        trace_field(line, "direct", direct, sizeof direct);
        trace_field(line, "ts", num, sizeof num);
        double ts = atof(num);
        trace_field(line, "local", num, sizeof num); /* "id2":{"local":"0x..."} */
        unsigned long long id = strtoull(num, NULL, 0);
        ck_assert_msg(ph[0] == 'M' || ts > 0, "%s: line %d has no time: %s", path, lineno, line);
        bool is_direct = strcmp(direct, "true") == 0;
        if (ph[0] == 'M') {
            k.names++;
        } else if (strncmp(name, "push ", 5) == 0 && strcmp(cat, "op") == 0) {
            k.push_ops += ph[0] == 'b';
        } else if (strncmp(name, "pull ", 5) == 0 && strcmp(cat, "op") == 0) {
            k.pull_ops += ph[0] == 'b';
        } else if (strncmp(name, "push ", 5) == 0 && (ph[0] == 'i' || ph[0] == 'b')) {
            k.push++;
            k.push_direct += is_direct;
            k.push_span += ph[0] == 'b';
        } else if (strncmp(name, "pull ", 5) == 0 && ph[0] == 'b') {
            k.pull++;
            k.pull_direct += is_direct;
        } else if (strcmp(name, "apply") == 0 && ph[0] == 'X') {
            trace_field(line, "dur", num, sizeof num);
            ck_assert_msg(num[0] && atof(num) >= 0, "%s: line %d: %s", path, lineno, line);
            k.applies++;
        } else if (strncmp(name, "acked ", 6) == 0 && ph[0] == 'i') {
            k.acked++;
        } else if (strncmp(name, "landed ", 7) == 0 && ph[0] == 'i') {
            k.landed++;
        } else if (strncmp(name, "took ", 5) == 0 && ph[0] == 'i') {
            trace_field(line, "op", num, sizeof num);
            k.took_push += strcmp(num, "push") == 0;
            k.took_pull += strcmp(num, "pull") == 0;
        } else if (ph[0] != 'e' && strcmp(cat, "op") != 0) {
            ck_abort_msg("%s: line %d is no event psd or libps writes: %s", path, lineno, line);
        }
        if (ph[0] == 'b') {
            ck_assert_msg(id > 0 && id <= nlines && begun[id] == 0 && cat[0] != '\0',
                          "%s: line %d: a span's id is not new: %s", path, lineno, line);
            begun[id] = ts;
            k.spans++;
        } else if (ph[0] == 'e') {
            ck_assert_msg(id > 0 && id <= nlines && begun[id] > 0 && ts >= begun[id],
                          "%s: line %d ends a span that did not start before it: %s", path,
                          lineno, line);
            begun[id] = -1;
            k.ended++;
        }
    }
    free(begun);
    free(text);
    ck_assert_msg(closed, "%s: no closing ']' after the process exited", path);
    ck_assert_msg(k.names == 4, "%s: %llu lane names, want the process and 3 lanes", path,
                  k.names);
    ck_assert_msg(k.ended == k.spans, "%s: %llu spans ended of %llu", path, k.ended, k.spans);
    return k;
}

/* psd --trace FILE and libps's PS_TRACE: timelines in Chrome's trace event format. One worker
 * pushes and pulls directly, one over UCX; each trace is a JSON array of one event per line
 * whose spans all end after they start. psd's holds one push event per push it took and one
 * pull span per pull it answered (as psctl status counts them), of both kinds, the UCX pushes'
 * rendezvous receives as spans, and each step's update as an apply job. The workers' traces
 * ("%p": one file each) hold their push and pull ops, and as many chunks acknowledged and
 * landed as psd took pushes and answered pulls. */
START_TEST(test_trace_timeline)
{
    cl_conf_t k = {.shards = 1,
                   .workers = 2,
                   .consistency = "bsp",
                   .optimizer = "{name: sgd, lr: 0.05}",
                   .max_steps = 20,
                   .batch_size = 64,
                   .chunk_bytes = 1 << 20, /* the first layer's 784 KiB go by rendezvous */
                   .start_wait_ms = CL_TOGETHER_MS}; /* w1 starts once w0 joined */
    cl_cluster_t *c = cl_cluster_create(&k);
    char trace[CL_PATH], wtrace[CL_PATH];
    cl_path(c, "psd0.trace.json", trace, sizeof trace);
    cl_path(c, "w%p.trace.json", wtrace, sizeof wtrace);
    const char *extra[] = {"--trace", trace, NULL};
    cl_proc_t *psd = cl_psd_spawn_with(c, 0, NULL, extra);
    ck_assert_msg(cl_psd_wait_ready(psd, READY_S) == 0, "psd --trace did not start: %s",
                  cl_tail(psd));
    setenv("PS_TRACE", wtrace, 1);
    cl_proc_t *w[2];
    w[0] = cl_worker_start(c, NULL, NULL, false);
    ck_assert_msg(cl_wait_log(w[0], "joined at step", RUN_S) == 0, "w0 never joined: %s",
                  cl_tail(w[0]));
    setenv("PS_DIRECT_PUSH", "0", 1);
    setenv("PS_DIRECT_PULL", "0", 1);
    w[1] = cl_worker_start(c, NULL, NULL, false);
    unsetenv("PS_DIRECT_PUSH");
    unsetenv("PS_DIRECT_PULL");
    unsetenv("PS_TRACE");
    EXPECT_EXIT(w[0], 0);
    EXPECT_EXIT(w[1], 0);
    cl_proc_t *ctl = status_json(c, "psctl");
    unsigned long long pushes = sum_field(ctl, "pushes"), pulls = sum_field(ctl, "pulls");
    stop_all(&psd, 1);

    trace_count_t t = trace_read(trace);
    ck_assert_msg(pushes > 0 && t.push == pushes,
                  "%s: %llu push events, psctl status counted %llu pushes", trace, t.push, pushes);
    ck_assert_msg(pulls > 0 && t.pull == pulls,
                  "%s: %llu pull spans, psctl status counted %llu pulls", trace, t.pull, pulls);
    ck_assert_msg(t.push_direct > 0 && t.push_direct < t.push && t.push_span > 0,
                  "%s: %llu pushes, %llu direct, %llu rendezvous spans: want both kinds", trace,
                  t.push, t.push_direct, t.push_span);
    ck_assert_msg(t.pull_direct > 0 && t.pull_direct < t.pull,
                  "%s: %llu pulls, %llu direct: want both kinds", trace, t.pull, t.pull_direct);
    ck_assert_msg(t.applies >= 20, "%s: %llu apply jobs for 20 steps", trace, t.applies);
    unsigned long long acked = 0, landed = 0, events = t.spans * 2 + t.push - t.push_span +
                                                     t.applies + t.names;
    char wpath[2][CL_PATH];
    for (int i = 0; i < 2; i++) {
        char name[64], *path = wpath[i];
        snprintf(name, sizeof name, "w%ld.trace.json", (long)w[i]->pid);
        cl_path(c, name, path, CL_PATH);
        trace_count_t u = trace_read(path);
        events += u.spans * 2 + u.acked + u.landed + u.took_push + u.took_pull + u.names;
        /* Each chunk acknowledged or landed was taken to be sent (once, or again to resend). */
        ck_assert_msg(u.took_push >= u.acked && u.took_pull >= u.landed && u.acked > 0,
                      "%s: %llu push and %llu pull chunks taken, %llu acknowledged, %llu landed",
                      path, u.took_push, u.took_pull, u.acked, u.landed);
        ck_assert_msg(u.push_ops >= 20 && u.pull_ops >= 20,
                      "%s: %llu push and %llu pull ops for 20 steps", path, u.push_ops,
                      u.pull_ops);
        acked += u.acked;
        landed += u.landed;
    }
    ck_assert_msg(acked == pushes && landed == pulls,
                  "the workers' traces: %llu chunks acknowledged, %llu landed; psd took %llu "
                  "pushes and answered %llu pulls", acked, landed, pushes, pulls);
    /* bench/trace_merge.sh makes one trace of the three: every event, one array. */
    char merged[CL_PATH];
    cl_path(c, "merged.json", merged, sizeof merged);
    char *argv[] = {(char *)cl_binary("TRACE_MERGE"), merged, trace, wpath[0], wpath[1], NULL};
    EXPECT_EXIT(cl_spawn(c, "merge", argv), 0);
    size_t len;
    char *text = cl_read_file(merged, &len);
    ck_assert_msg(text && len > 4 && strncmp(text, "[\n", 2) == 0 &&
                      strcmp(text + len - 2, "]\n") == 0,
                  "%s is not one array", merged);
    unsigned long long objects = 0, commas = 0; /* events, and lines ending in a comma */
    char *save = NULL;
    for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        objects += l[0] == '{';
        commas += l[strlen(l) - 1] == ',';
    }
    free(text);
    ck_assert_msg(objects == events && commas == events - 1,
                  "%s: %llu events, %llu commas; the traces hold %llu events", merged, objects,
                  commas, events);
    cl_cluster_destroy(c);
}
END_TEST

/* The median that bench/round_timeline.py printed for @p name in @p log ("  NAME   VALUE"). */
static double timeline_value(const char *log, const char *name)
{
    char want[64];
    snprintf(want, sizeof want, "  %s ", name);
    const char *at = strstr(log, want);
    ck_assert_msg(at != NULL, "round_timeline printed no \"%s\": %s", name, log);
    return strtod(at + strlen(want), NULL);
}

/* bench/round_timeline.py reads psbench --trace's files of the rounds' cluster (c1: psbench's
 * second) and prints where a round's time goes: medians of events that happen in this order
 * in every round (libps's comm thread takes the push, it lands, its update ends, then its
 * acknowledgement and the pull of the new version reach the client), one apply job a round
 * for a one-chunk tensor. A case
 * with no files, or a tensor with no ops, is named (exit 1). */
START_TEST(test_round_timeline)
{
    cl_conf_t k = {.shards = 1, .workers = 1};
    cl_cluster_t *c = cl_cluster_create(&k);
    char dir[CL_PATH];
    cl_path(c, "tr", dir, sizeof dir);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    char *bench[] = {(char *)cl_binary("PSBENCH"), "--quick", "--only", "ops", "--shards", "1",
                     "--workers", "1", "--transports", "shm", "--sizes", "64K", "--trace",
                     dir, NULL};
    EXPECT_EXIT(cl_spawn(c, "psbench", bench), 0);
    /* Every trace psbench's processes wrote (each psd's and each client's, all stopped
     * cleanly) is one JSON array: what chrome://tracing and Perfetto load. */
    const char *const traces[] = {"c1-1x1-shm-shard0.json", "c1-1x1-shm-client0.json"};
    for (int i = 0; i < 2; i++) {
        char path[CL_PATH + 64];
        snprintf(path, sizeof path, "%s/%s", dir, traces[i]);
        size_t tlen;
        char *t = cl_read_file(path, &tlen);
        ck_assert_msg(t != NULL, "%s: %s", path, strerror(errno));
        EXPECT_JSON(t, tlen, path);
        free(t);
    }
    char *tl[] = {(char *)cl_binary("ROUND_TIMELINE"), dir, "c1-1x1-shm", NULL};
    cl_proc_t *p = cl_spawn(c, "timeline", tl);
    EXPECT_EXIT(p, 0);
    char *log = cl_log(p);
    const char *r = strstr(log, "c1-1x1-shm, tensor 0 (1 chunks): ");
    ck_assert_msg(r && atoi(r + 33) >= 20, "want tensor 0 and at least 20 rounds: %s", log);
    double took = timeline_value(log, "comm thread took the push"),
           first = timeline_value(log, "first push at psd"),
           landed = timeline_value(log, "last push data landed"),
           applied = timeline_value(log, "last apply ended"),
           acked = timeline_value(log, "last ack at the client"),
           pulled = timeline_value(log, "last pull chunk landed"),
           round = timeline_value(log, "round");
    ck_assert_msg(took >= 0 && took <= first && first <= landed && landed <= applied &&
                      applied <= acked && applied <= pulled && pulled <= round,
                  "the round's events out of order: %s", log);
    ck_assert_int_eq((int)timeline_value(log, "apply jobs"), 1);
    free(log);
    char *none[] = {(char *)cl_binary("ROUND_TIMELINE"), dir, "c7-2x2-tcp", NULL};
    p = cl_spawn(c, "timeline-none", none);
    EXPECT_EXIT(p, 1);
    EXPECT_LOG(p, "round_timeline: no c7-2x2-tcp-client0.json or no c7-2x2-tcp-shard*.json in ");
    char *other[] = {(char *)cl_binary("ROUND_TIMELINE"), dir, "c1-1x1-shm", "99", NULL};
    p = cl_spawn(c, "timeline-99", other);
    EXPECT_EXIT(p, 1);
    EXPECT_LOG(p, "round_timeline: no push or pull of tensor 99 in ");
    cl_cluster_destroy(c);
}
END_TEST

/* The throughput row of @p op at @p size over @p tr with @p shards x @p workers in psbench's
 * JSON @p j: its value, or -1 when there is none. */
static double bench_value(const char *j, const char *op, unsigned size, int shards, int workers,
                          const char *tr)
{
    char want[256];
    snprintf(want, sizeof want,
             "{\"op\": \"%s\", \"metric\": \"throughput\", \"size_bytes\": %u, \"shards\": %d, "
             "\"workers\": %d, \"transport\": \"%s\", ",
             op, size, shards, workers, tr);
    const char *at = strstr(j, want), *v = at ? strstr(at, "\"value\": ") : NULL;
    return v ? strtod(v + 9, NULL) : -1;
}

/* psbench --attach on @p c's running shards with @p extra arguments (NULL-terminated, at most
 * 8), its JSON into dir/NAME.json. Not waited for. */
static cl_proc_t *psbench_attach(cl_cluster_t *c, const char *name, const char *const *extra)
{
    static char json[CL_PATH]; /* lives until the spawn returns */
    char file[64];
    snprintf(file, sizeof file, "%s.json", name);
    cl_path(c, file, json, sizeof json);
    char *argv[24] = {(char *)cl_binary("PSBENCH"), "--attach", "--manifest", c->manifest,
                      "--json", json};
    int n = 6;
    for (int i = 0; extra && extra[i] && i < 8; i++) argv[n++] = (char *)extra[i];
    argv[n] = NULL;
    return cl_spawn(c, name, argv);
}

/* psbench --attach measures shards it did not start: push, pull and the bsp round over UCX
 * and over psd's direct paths, with the cluster's own optimizer (adagrad here, not psbench's
 * default), as 2 shards x the manifest's
 * 2 workers. The shards keep running and served the clients (their counters say so), and the
 * clients left. A cluster that a job uses is refused, with the reason: while its worker is a
 * member, and after it, for the job's training set. */
START_TEST(test_psbench_attach)
{
    cl_conf_t k = {.shards = 2,
                   .workers = 2,
                   .consistency = "bsp",
                   .optimizer = "{name: adagrad, lr: 0.01}",
                   .job_extra = "  heartbeat_timeout_ms: 10000\n"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    /* 1 MiB: buffers mapped on 2 MiB pages, freed at the client's exit (a free() of them
     * crashed every client; psbench now exits 1 when one of its processes ends badly). */
    const char *args[] = {"--quick", "--only", "ops", "--sizes", "4K,1M", "--transports",
                          "shm,direct", NULL};
    cl_proc_t *b = psbench_attach(c, "psbench", args);
    EXPECT_EXIT(b, 0);
    EXPECT_LOG(b, "attached to cluster ");
    char json[CL_PATH];
    cl_path(c, "psbench.json", json, sizeof json);
    size_t jlen;
    char *j = cl_read_file(json, &jlen);
    ck_assert_msg(j != NULL, "no %s: %s", json, cl_tail(b));
    EXPECT_JSON(j, jlen, json);
    char want[160];
    snprintf(want, sizeof want, "\"attached\": \"%s\"", c->cluster_name);
    ck_assert_msg(strstr(j, want) != NULL, "%s lacks %s", json, want);
    static const char *const ops[] = {"push", "pull", "round"}, *const trs[] = {"shm", "direct"};
    for (int t = 0; t < 2; t++)
        for (int o = 0; o < 3; o++)
            for (unsigned size = 4096; size <= 1048576; size *= 256) {
                double v = bench_value(j, ops[o], size, 2, 2, trs[t]);
                ck_assert_msg(v > 0, "no %s of %u bytes over %s, 2x2, in %s", ops[o], size,
                              trs[t], json);
            }
    for (int t = 0; t < 2; t++) {
        snprintf(want, sizeof want, "\"workers\": 2, \"transport\": \"%s\", \"optimizer\": "
                 "\"adagrad\", ", trs[t]);
        ck_assert_msg(strstr(j, want) != NULL, "%s: no push or round with adagrad over %s", json,
                      trs[t]);
    }
    /* The pushes' notes name each shard's transports, and the direct paths where used. */
    ck_assert_msg(strstr(j, "update commits; shard 0 over ") != NULL &&
                      strstr(j, " + direct pulls and pushes; shard 1 over ") != NULL,
                  "%s: no shard's transports in the push notes", json);
    free(j);
    ck_assert(cl_alive(psd[0]) && cl_alive(psd[1]));
    cl_proc_t *ctl = status_json(c, "psctl");
    EXPECT_LOG(ctl, "\"actual_workers\": 0, ");
    ck_assert_msg(sum_field(ctl, "pushes") > sum_field(ctl, "direct_pushes") &&
                      sum_field(ctl, "direct_pushes") > 0 && sum_field(ctl, "direct_pulls") > 0,
                  "the shards served no UCX or no direct pushes: %s", cl_tail(ctl));
    stop_all(psd, 2);
    cl_cluster_destroy(c);

    /* A job's cluster: refused while its worker trains, and after it. */
    cl_conf_t kj = {.shards = 1, .workers = 1, .consistency = "asp", .epochs = 50};
    c = cl_cluster_create(&kj);
    psd[0] = cl_psd_start(c, 0, NULL, READY_S);
    cl_proc_t *w = cl_worker_start(c, NULL, NULL, false);
    ck_assert_msg(cl_wait_log(psd[0], "joins as rank 0", RUN_S) == 0, "the worker did not join: %s",
                  cl_tail(psd[0]));
    const char *ops_only[] = {"--only", "ops", "--sizes", "4K", NULL};
    b = psbench_attach(c, "psbench-member", ops_only);
    EXPECT_EXIT(b, 1);
    EXPECT_LOG(b, "workers in its job: psbench's clients would join its steps");
    /* Killed once the job has its training set (the worker's first batch request): killed
     * right after its join, it had none at times, and the job then looked unused (an ASan run
     * of session 51). */
    bool has_set = false;
    for (int i = 0; i < RUN_S * 10 && !has_set; i++) {
        char name[32];
        snprintf(name, sizeof name, "psctl-set-%d", i);
        has_set = sum_field(status_json(c, name), "samples") > 0;
        if (!has_set) usleep(100000);
    }
    ck_assert_msg(has_set, "the job never got its training set: %s", cl_tail(psd[0]));
    ck_assert_int_eq(cl_signal(w, SIGKILL), 0);
    ck_assert_int_eq(cl_wait(w, RUN_S), 128 + SIGKILL);
    ck_assert_msg(cl_wait_log(psd[0], "left at step", RUN_S) == 0, "the worker was not removed: %s",
                  cl_tail(psd[0]));
    b = psbench_attach(c, "psbench-job", ops_only);
    EXPECT_EXIT(b, 1);
    EXPECT_LOG(b, "holds a job (a training set of ");
    stop_all(psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* psd's anonymous memory (RssAnon) in KiB, or -1. */
static long rss_anon_kib(pid_t pid)
{
    char path[64], *st, *at;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    if ((st = cl_read_file(path, NULL)) == NULL) return -1;
    long kib = (at = strstr(st, "RssAnon:")) != NULL ? strtol(at + 8, NULL, 10) : -1;
    free(st);
    return kib;
}

/* psd's memory per chunk is the chunk's, not the cluster's most ranks': a model of 8192 chunks
 * of 1 KiB (one tensor, 1 shard, two mean_clients, one over UCX with its pushes in slots, one
 * direct) takes less than 8 KiB of psd's anonymous memory a chunk after two steps, its one UCX
 * slot (1 KiB) included; and every pull is the exact mean. Before, each chunk kept 16 arrays
 * sized for 64 ranks whatever job.workers was: ~16 KB a chunk (a limits probe, session 34). */
START_TEST(test_chunk_bookkeeping_small)
{
    cl_conf_t k = mean_conf;
    k.shards = 1;
    k.chunk_bytes = 1024;
    k.map_size_mb = 256;
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[1] = {cl_psd_start(c, 0, NULL, READY_S)};
    long before = rss_anon_kib(psd[0]->pid);
    ck_assert_msg(before > 0, "no RssAnon for psd");
    mean_pair_of(c, "2097152", 2, NULL);
    long after = rss_anon_kib(psd[0]->pid);
    double per_chunk = (double)(after - before) * 1024.0 / 8192.0;
    fprintf(stderr, "chunk_bookkeeping_small: psd RssAnon %ld -> %ld KiB: %.0f bytes a chunk\n",
            before, after, per_chunk);
#if defined(__has_feature)
#if __has_feature(address_sanitizer) /* clang's spelling */
#define PS_TEST_ASAN 1
#endif
#endif
#if !defined(__SANITIZE_ADDRESS__) && !defined(PS_TEST_ASAN) /* ASan's allocator: ~8 KB a chunk */
    ck_assert_msg(per_chunk < 8192.0, "psd took %.0f bytes a chunk (RssAnon %ld -> %ld KiB)",
                  per_chunk, before, after);
#endif
    stop_all(psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("cluster");
    suite_add_tcase(s, tcase("bsp_matches_local", test_bsp_matches_local));
    suite_add_tcase(s, tcase("fusion_off_matches_local", test_fusion_off_matches_local));
    suite_add_tcase(s, tcase("direct_off_matches_local", test_direct_off_matches_local));
    suite_add_tcase(s, tcase("cma_pulls_match_local", test_cma_pulls_match_local));
    suite_add_tcase(s, tcase("direct_push_mixed", test_direct_push_mixed));
    suite_add_tcase(s, tcase("direct_fails_over", test_direct_fails_over));
    suite_add_tcase(s, tcase("direct_push_plain_file_refused",
                             test_direct_push_plain_file_refused));
    suite_add_tcase(s, tcase("adagrad_matches_local", test_adagrad_matches_local));
    suite_add_tcase(s, tcase("mean_keeps_the_mean", test_mean_keeps_the_mean));
    suite_add_tcase(s, tcase("mean_push_none", test_mean_push_none));
    suite_add_tcase(s, tcase("mean_nonfinite_left_out", test_mean_nonfinite_left_out));
    suite_add_tcase(s, tcase("diverged_loss_said", test_diverged_loss_said));
    suite_add_tcase(s, tcase("cosine_follows_max_steps", test_cosine_follows_max_steps));
    suite_add_tcase(s, tcase("psworker_options", test_psworker_options));
    suite_add_tcase(s, tcase("libps_misuse_harmless", test_libps_misuse_harmless));
    suite_add_tcase(s, tcase("tcp_matches_local", test_tcp_matches_local));
    suite_add_tcase(s, tcase("tcp_eager_matches_local", test_tcp_eager_matches_local));
    suite_add_tcase(s, tcase("hot_path_allocations_direct", test_hot_path_allocations_direct));
    suite_add_tcase(s, tcase("hot_path_allocations_shm", test_hot_path_allocations_shm));
    suite_add_tcase(s, tcase("hot_path_allocations_tcp", test_hot_path_allocations_tcp));
    suite_add_tcase(s, tcase("hot_path_allocations_topk", test_hot_path_allocations_topk));
    suite_add_tcase(s, tcase("hot_path_allocations_asp", test_hot_path_allocations_asp));
    suite_add_tcase(s, tcase("data_dir_in_use", test_data_dir_in_use));
    suite_add_tcase(s, tcase("conflicting_shape", test_conflicting_shape));
    suite_add_tcase(s, tcase("epochs_raised_goes_on", test_epochs_raised_goes_on));
    suite_add_tcase(s, tcase("worker_manifest_mismatch_refused",
                             test_worker_manifest_mismatch_refused));
    suite_add_tcase(s, tcase("sigterm_restart", test_sigterm_restart));
    suite_add_tcase(s, tcase("restart_resumes", test_restart_resumes));
    suite_add_tcase(s, tcase("bad_manifest", test_bad_manifest));
    suite_add_tcase(s, tcase("psctl_status", test_psctl_status));
    suite_add_tcase(s, tcase("self_test", test_self_test));
    suite_add_tcase(s, tcase("trace_timeline", test_trace_timeline));
    suite_add_tcase(s, tcase("psbench_attach", test_psbench_attach));
    suite_add_tcase(s, tcase("round_timeline", test_round_timeline));
    suite_add_tcase(s, tcase("chunk_bookkeeping_small", test_chunk_bookkeeping_small));
    return s;
}
