/* test_elastic.c: membership changes during a run, with real processes on 127.0.0.1:
 * a worker killed (-9) or stopped past the heartbeat timeout, every worker leaving and one
 * joining, `psctl scale` with pslaunch --follow, ssp's staleness bound, and a seeded chaos
 * run. The coordinator's status (shard 0, read over the wire as psctl does) is the witness:
 * the open step, the members, the step gaps and every pass's applied-sample count. */
#include <check.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cluster.h"
#include "reqclient.h"
#include "expect.h"
#include "manifest.h"
#include "ps/ps_error.h"

/* ---- the coordinator's status ----------------------------------------------------------- */

typedef struct {
    ps_manifest_t m;
    ps_req_t *ctl;
} coord_t;

static void coord_open(coord_t *co, cl_cluster_t *c)
{
    char err[1024];
    ck_assert_msg(ps_manifest_load(&co->m, c->manifest, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(ps_req_open(&co->m, 5.0, &co->ctl, err, sizeof err) == 0, "%s", err);
}

static void coord_close(coord_t *co) { ps_req_close(co->ctl); }

/* Shard @p shard's status JSON (malloc'd, NUL-terminated), or NULL (said on stderr, with why)
 * when it did not answer. A connection that failed is made again once: psd restarts its
 * transport when a local peer stopped in the middle of a write into its shared-memory FIFO
 * (a SIGSTOPped worker; every local peer's messages wait behind it until then), which resets
 * this connection too, and the next call (a new connection) is answered. */
static char *shard_status(coord_t *co, uint32_t shard)
{
    ps_msg_t req = {.type = PS_MSG_STATUS, .rank = -1}, rep;
    void *data = NULL;
    size_t len = 0;
    char err[1024] = "";
    int rc = ps_req_call(co->ctl, shard, &req, &rep, &data, &len, err, sizeof err);
    if (rc == PS_ETRANSPORT) {
        fprintf(stderr, "shard_status: shard %u: %s; asking again\n", shard, err);
        free(data);
        data = NULL;
        rc = ps_req_call(co->ctl, shard, &req, &rep, &data, &len, err, sizeof err);
    }
    if (rc || data == NULL) {
        fprintf(stderr, "shard_status: shard %u did not answer (%s)\n", shard, err);
        free(data);
        return NULL;
    }
    char *j = realloc(data, len + 1);
    if (j == NULL) {
        free(data);
        return NULL;
    }
    j[len] = '\0';
    return j;
}

/* Shard 0's (the coordinator's) status JSON, as shard_status. */
static char *coord_status(coord_t *co) { return shard_status(co, 0); }

/* The first "key": number in @p json (-1 if absent). */
static long long jnum(const char *json, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = json ? strstr(json, pat) : NULL;
    return p ? atoll(p + strlen(pat)) : -1;
}

static long long coord_num(coord_t *co, const char *key)
{
    char *j = coord_status(co);
    long long v = jnum(j, key);
    free(j);
    return v;
}

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wait until the coordinator's @p key reaches @p want (>=, or == with exact). */
static long long wait_num(coord_t *co, const char *key, long long want, int exact, double timeout_s)
{
    double end = now_s() + timeout_s;
    long long v = -1;
    while (now_s() < end) {
        v = coord_num(co, key);
        if (exact ? v == want : v >= want) return v;
        nap_ms(20);
    }
    return v;
}

/* Every pass's applied samples: none above the training-set size (nothing counted twice);
 * passes before @p complete_before all exactly the size (nothing lost). Returns the number
 * of passes listed. */
static int expect_passes(const char *json, long long n, long long complete_before)
{
    ck_assert_msg(json != NULL, "no status from shard 0");
    const char *p = strstr(json, "\"passes\": [");
    ck_assert_msg(p != NULL, "status without passes: %s", json);
    int count = 0;
    while ((p = strstr(p, "{\"pass\": ")) != NULL) {
        long long pass = atoll(p + 9), applied = jnum(p, "applied");
        ck_assert_msg(applied <= n, "pass %lld applied %lld samples of %lld: some twice", pass,
                      applied, n);
        if (pass < complete_before)
            ck_assert_msg(applied == n, "pass %lld applied %lld samples, want all %lld", pass,
                          applied, n);
        count++;
        p++;
    }
    return count;
}

/* "final test accuracy X" from a worker's log (-1 if absent). */
/* The job is finished and its one pass applied each of its @p n samples once; then close the
 * status connection, stop shard 0 and remove the cluster. */
static void end_finished(coord_t *co, cl_proc_t *psd, cl_cluster_t *c, long long n)
{
    char *j = coord_status(co);
    ck_assert_msg(j && strstr(j, "\"finished\": true"), "job not finished: %s", j ? j : "-");
    expect_passes(j, n, 1);
    free(j);
    /* psctl scale says so (before: "desired workers: 2 (now 0)" alone). */
    char *argv[] = {(char *)cl_binary("PSCTL"), "--manifest", c->manifest, "scale", "2", NULL};
    cl_proc_t *p = cl_spawn(c, "scale-finished", argv);
    EXPECT_EXIT(p, 0);
    EXPECT_LOG(p, "desired workers: 2 (now 0; the job is finished: no worker will start)");
    coord_close(co);
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}

static double final_accuracy(const cl_proc_t *w)
{
    char *log = cl_log(w);
    const char *p = strstr(log, "final test accuracy ");
    double acc = p ? atof(p + 20) : -1;
    free(log);
    return acc;
}

/* A cluster from @p k with 2 shards and 2 psworkers started, and shard 0's status connection. */
static cl_cluster_t *start_2x2(const cl_conf_t *k, cl_proc_t *psd[2], cl_proc_t *w[2], coord_t *co)
{
    cl_cluster_t *c = cl_cluster_create(k);
    for (int i = 0; i < 2; i++) psd[i] = cl_psd_start(c, i, NULL, READY_S);
    for (int i = 0; i < 2; i++) w[i] = cl_worker_start(c, NULL, NULL, false);
    coord_open(co, c);
    return c;
}

/* ---- kill -9 --------------------------------------------------------------------------- */

/* Four workers, one killed with SIGKILL mid-epoch: the run completes with three; the step
 * stalls at most heartbeat timeout + one step; every pass applies every sample exactly once;
 * the final accuracy is within 0.5 pp of the undisturbed run with the same seed. The one
 * killed holds rank 0: the lowest rank left evaluates the later passes (session 62; before,
 * only rank 0 did, and no later pass had a test accuracy). */
START_TEST(test_kill9_one_of_four)
{
    /* Cosine decay over the planned steps: the final iterate of either run is a settled one
     * (with a constant rate, evaluation noise alone is ~0.3 pp). */
    cl_conf_t k = {.shards = 2, .workers = 4, .batch_size = 64, .epochs = 3,
                   .optimizer = "{name: adam, lr: 0.002, schedule: cosine}",
                   .job_extra = "  heartbeat_timeout_ms: 3000\n"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    cl_proc_t *w[4];
    for (int i = 0; i < 4; i++) w[i] = cl_worker_start(c, NULL, NULL, false);
    coord_t co;
    coord_open(&co, c);
    long long at = wait_num(&co, "open_step", 100, 0, RUN_S); /* mid pass 1 of 3 */
    ck_assert_msg(at >= 100 && at < 400, "the kill should land mid-run, not at step %lld", at);
    int zero = -1; /* the worker of rank 0, killed; the others are w[0..2] after the swap */
    for (int i = 0; i < 4 && zero < 0; i++) {
        char *l = cl_log(w[i]);
        if (strstr(l, "psworker: rank 0 joined at step")) zero = i;
        free(l);
    }
    ck_assert_msg(zero >= 0, "no worker joined as rank 0");
    cl_proc_t *victim = w[zero];
    w[zero] = w[3];
    w[3] = victim;
    ck_assert_int_eq(cl_signal(w[3], SIGKILL), 0);
    for (int i = 0; i < 3; i++) EXPECT_EXIT(w[i], 0);
    int evaluated = 0; /* pass 3's test accuracy, said by the lowest rank left */
    for (int i = 0; i < 3; i++) {
        char *l = cl_log(w[i]);
        evaluated += strstr(l, "epoch 3 done") != NULL;
        free(l);
    }
    ck_assert_msg(evaluated == 1, "%d workers evaluated pass 3: %s | %s | %s", evaluated,
                  cl_tail(w[0]), cl_tail(w[1]), cl_tail(w[2]));
    char *j = coord_status(&co);
    ck_assert_msg(j && strstr(j, "\"finished\": true"), "job not finished: %s", j ? j : "-");
    ck_assert_int_eq(expect_passes(j, 60000, 3), 3);
    /* Three workers after the kill: more steps than four would have taken (704). */
    ck_assert_int_gt(jnum(j, "open_step"), 704);
    long long gmax = jnum(j, "step_gap_ms_max"), gmed = jnum(j, "step_gap_ms_median");
    /* The stall the kill caused (the endpoint error is seen at once; the heartbeat timeout
     * bounds it anyway), against the run's own typical step. */
    ck_assert_msg(gmax <= 3000 + gmed + 250, "a step stalled %lld ms (median step %lld ms)", gmax,
                  gmed);
    fprintf(stderr, "kill9_one_of_four: longest step gap %lld ms, median %lld ms\n", gmax, gmed);
    free(j);
    coord_close(&co);
    cl_proc_t *ref = cl_worker_start(c, NULL, NULL, true);
    EXPECT_EXIT(ref, 0);
    double a = final_accuracy(w[0]), r = final_accuracy(ref);
    fprintf(stderr, "kill9_one_of_four: accuracy %.4f, undisturbed %.4f\n", a, r);
    ck_assert_msg(a > 0 && r > 0 && a >= r - 0.005 && a <= r + 0.005,
                  "final accuracy %.4f, undisturbed run %.4f: more than 0.5 pp apart", a, r);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* Two replay_clients (replay_client.c): @p batches batches of 8, rank 1 dies at step 5; @p
 * order: which tensor each pushes first ("ab" or "ba"). Under bsp every step takes a batch of
 * each member; under asp rank 1's step is its own count of batches, so enough must be left for
 * it to reach step 5 while rank 0 takes the others as fast as it can (40 were not once, with
 * another suite beside this one: neither died; 200, ~0.1 s of batches, were not once in a full
 * suite: rank 1 got no CPU until rank 0 had taken them all; 2000 add ~0.3 s). */
static void replay_start(cl_cluster_t *c, const char *order, const char *batches, cl_proc_t *w[2])
{
    char nb[16], bs[] = "8", die[] = "5", ord[4];
    snprintf(nb, sizeof nb, "%s", batches);
    snprintf(ord, sizeof ord, "%s", order);
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nb, bs, die, ord, NULL};
    w[0] = cl_spawn(c, "replay0", argv);
    w[1] = cl_spawn(c, "replay1", argv);
}

/* One replay_client died at step 5 as planned (SIGKILL), the other found every batch applied
 * once on both tensors (and, unless NULL, said @p unsummed). */
static void replay_expect(cl_proc_t *w[2], const char *unsummed)
{
    int st[2] = {cl_wait(w[0], RUN_S), cl_wait(w[1], RUN_S)};
    int victim = st[0] == 0 ? 1 : 0;
    ck_assert_msg(st[victim] == 128 + SIGKILL && st[1 - victim] == 0,
                  "exits %d and %d, want 0 and %d: %s / %s", st[0], st[1], 128 + SIGKILL,
                  cl_tail(w[0]), cl_tail(w[1]));
    EXPECT_LOG(w[victim], "dies at step 5 with batch");
    EXPECT_LOG(w[1 - victim], "every batch applied once on both tensors");
    if (unsummed) EXPECT_LOG(w[1 - victim], unsummed);
}

/* Two replay_clients (order @p order) on a 2x2 cluster of @p consistency with sgd lr 1; the
 * dying one's batch goes to the survivor, which finds every batch applied once; shard 0 skipped
 * @p skipped replayed pushes. Both push top-k with error feedback (REPLAY_EF): the survivor's
 * pushes psd did not sum (its replays skipped: @p unsummed, "replay.a U, replay.b U") are
 * back in its residual (before session 60, the error feedback they carried was lost: "not
 * summed: replay.a 0, replay.b 0"). */
static void replay_run(const char *consistency, const char *order, long long skipped,
                       const char *unsummed)
{
    setenv("REPLAY_EF", "1", 1); /* this case's own process: its children take it */
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 8, .consistency = consistency,
                   .optimizer = "{name: sgd, lr: 1}", .start_wait_ms = CL_TOGETHER_MS};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    cl_proc_t *w[2];
    replay_start(c, order, strcmp(consistency, "bsp") == 0 ? "40" : "2000", w);
    char said[64];
    snprintf(said, sizeof said, "not summed: %s (of ", unsummed);
    replay_expect(w, said);
    EXPECT_LOG(psd[0], ") goes to another worker");
    coord_t co;
    coord_open(&co, c);
    char *j = coord_status(&co);
    ck_assert_msg(j && jnum(j, "replays_skipped") == skipped, "shard 0 should have skipped %lld "
                  "replayed pushes: %s", skipped, j ? j : "-");
    free(j);
    coord_close(&co);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}

/* bsp: a worker killed in the middle of its step, after its push of one tensor was applied
 * (acknowledged) and before its push of the other (replay_client.c). Its batch goes to the
 * survivor a step later, tagged with the step and rank that left: shard 0's chunk, which
 * applied the batch with the dead worker's push, must not apply it again; shard 1's, which
 * never had it, must. Before, the batch was applied twice on the first tensor. */
START_TEST(test_kill9_mid_step_applied_once)
{
    replay_run("bsp", "ab", 1, "replay.a 1, replay.b 0");
}
END_TEST

/* The same under asp (each push applied on arrival, so no step tells a replay): the batch goes to
 * the survivor tagged with the rank that left, and pushes carry their batch, which each chunk
 * records per rank with the push it applied; shard 0's chunk has it from the dead rank and
 * does not apply it again. Before, it did (replay.a's element at -2). */
START_TEST(test_kill9_mid_batch_asp_applied_once)
{
    replay_run("asp", "ab", 1, "replay.a 1, replay.b 0");
}
END_TEST

/* asp: the worker dies after both its pushes of the batch were applied, before it reported the
 * batch done: the batch goes to the survivor, and neither chunk applies it again (shard 0 skips
 * replay.a's push). Before, both did. */
START_TEST(test_kill9_after_batch_asp_applied_once)
{
    replay_run("asp", "ab+", 1, "replay.a 1, replay.b 1");
}
END_TEST

/* asp or ssp (@p consistency; staleness 2): three replay_clients that each kill themselves at
 * 5 % of their batches (before their first push, between their pushes or after both, before
 * reporting the batch), replaced as they die, until the job has handed out and applied every
 * batch; then a last one checks that every batch was applied exactly once on both tensors.
 * With @p kill_shards, shards 0 and 1 are also SIGKILLed and started again in turn, six times
 * (a worker a restarted coordinator no longer knows, having joined after its last save, or one
 * that could not join while shard 0 was down, exits 3). */
static void random_deaths(const char *consistency, bool kill_shards)
{
    cl_conf_t k = {.shards = 2, .workers = 3, .batch_size = 8, .consistency = consistency,
                   .optimizer = "{name: sgd, lr: 1}",
                   .job_extra = strcmp(consistency, "ssp") == 0 ? "  staleness: 2\n" : ""};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    char nb[] = "200", bs[] = "8", die[] = "rand:5", never[] = "check", ord[] = "ab";
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nb, bs, die, ord, NULL};
    coord_t co;
    coord_open(&co, c);
    cl_proc_t *live[3] = {NULL, NULL, NULL}, *all[100];
    int nall = 0, finished = 0, shard_kills = 0;
    double t0 = now_s(), next_kill = t0 + 0.5;
    while (!finished && now_s() - t0 < 60 && nall < 100) {
        if (kill_shards && shard_kills < 6 && now_s() >= next_kill) {
            /* shards 0 and 1 in turn, started again */
            int s = shard_kills++ % 2;
            cl_signal(psd[s], SIGKILL);
            cl_wait(psd[s], RUN_S);
            psd[s] = cl_psd_start(c, s, NULL, READY_S);
            if (s == 0) {
                coord_close(&co);
                coord_open(&co, c);
            }
            next_kill = now_s() + 0.5;
        }
        for (int i = 0; i < 3; i++)
            if (live[i] == NULL || !cl_alive(live[i])) {
                char name[24];
                snprintf(name, sizeof name, "replay%d", nall);
                live[i] = all[nall++] = cl_spawn(c, name, argv);
            }
        char *j = coord_status(&co);
        finished = j && strstr(j, "\"finished\": true") != NULL;
        free(j);
        nap_ms(50);
    }
    ck_assert_msg(finished, "the job did not finish in 60 s with %d workers started", nall);
    int deaths = 0;
    for (int i = 0; i < nall; i++) {
        int st = cl_wait(all[i], RUN_S);
        /* 3: removed (a restarted coordinator's saved state predates its join), or shard 0
         * was down for the whole of its join's wait */
        ck_assert_msg(st == 0 || st == 128 + SIGKILL || (kill_shards && st == 3),
                      "%s exited %d: %s", all[i]->name, st, cl_tail(all[i]));
        deaths += st == 128 + SIGKILL;
    }
    argv[4] = never;
    cl_proc_t *check = cl_spawn(c, "check", argv);
    EXPECT_EXIT(check, 0);
    EXPECT_LOG(check, "every batch applied once on both tensors");
    ck_assert_msg(deaths > 0, "no worker died (%d started)", nall);
    coord_close(&co);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}

START_TEST(test_asp_random_deaths_applied_once) { random_deaths("asp", false); }
END_TEST

START_TEST(test_asp_random_deaths_shard_kills) { random_deaths("asp", true); }
END_TEST

START_TEST(test_ssp_random_deaths_shard_kills) { random_deaths("ssp", true); }
END_TEST

/* Two replay_clients "replay0" and "replay1" with @p argv, whose plan has both die at step 5:
 * waited for, killed (SIGKILL) there. */
static void pair_dies_at_step5(cl_cluster_t *c, char **argv)
{
    cl_proc_t *w[2] = {cl_spawn(c, "replay0", argv), cl_spawn(c, "replay1", argv)};
    for (int i = 0; i < 2; i++) {
        EXPECT_EXIT(w[i], 128 + SIGKILL);
        EXPECT_LOG(w[i], "at step 5");
    }
}

/* Two new workers (no death; argv[4] is overwritten) take over from replay_clients that died and
 * finish the job; then a checker finds every batch applied once on both tensors. Returns the
 * first new worker. */
/* A replay_client checker (argv[4] is overwritten with "check") finds every batch applied once
 * on both tensors. */
static void check_all(cl_cluster_t *c, char **argv)
{
    static char check_any[] = "check";
    argv[4] = check_any;
    cl_proc_t *check = cl_spawn(c, "check", argv);
    EXPECT_EXIT(check, 0);
    EXPECT_LOG(check, "every batch applied once on both tensors");
}

/* Two new replay_clients (argv as the first pair's) finish the job, and every batch was
 * applied once. With @p hold (a PS_TEST_SLOW_APPLY_HOLD file of shard @p held's), that file is
 * removed once both said hello there and had half a second to push: their pushes land while
 * the held apply runs, however long they took to start (a fixed 2 s slowdown was missed under
 * a full suite's load: the new workers' hellos came 1.7 s after the old ones' deaths, their
 * pushes after the apply, session 70). */
static cl_proc_t *new_workers_finish_held(cl_cluster_t *c, char **argv, const cl_proc_t *held,
                                          const char *hold)
{
    static char never[] = "1000000000";
    argv[4] = never;
    int hellos = held ? count_in_log(held, " is rank ") : 0;
    cl_proc_t *w2 = cl_spawn(c, "replay2", argv), *w3 = cl_spawn(c, "replay3", argv);
    if (hold) {
        for (int i = 0; i < 600 && count_in_log(held, " is rank ") < hellos + 2; i++) nap_ms(50);
        nap_ms(500);
        ck_assert_int_eq(unlink(hold), 0);
    }
    EXPECT_EXIT(w2, 0);
    EXPECT_EXIT(w3, 0);
    check_all(c, argv);
    return w2;
}

static cl_proc_t *new_workers_finish(cl_cluster_t *c, char **argv)
{
    return new_workers_finish_held(c, argv, NULL, NULL);
}

/* The end of a restore test: stop the shards @p psd, set their data_dirs aside, start them
 * again from checkpoint @p dir, and let two new workers finish the job with every batch applied
 * once (new_workers_finish); then stop and remove everything. */
static void restore_and_finish(cl_cluster_t *c, cl_proc_t **psd, const char *dir, char **argv)
{
    stop_all(psd, 2);
    cl_data_dirs_aside(c, "trained");
    cl_restore_start(c, c->manifest, 2, dir, psd, READY_S);
    new_workers_finish(c, argv);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}

/* psctl checkpoint --dir CLUSTER/@p name (into @p ckdir[CL_PATH]), started (not waited for),
 * with @p gap_ms between two shards' arms (PS_TEST_ARM_GAP_MS; 0: none). */
static cl_proc_t *checkpoint_spawn(cl_cluster_t *c, const char *name, int gap_ms, char *ckdir)
{
    cl_path(c, name, ckdir, CL_PATH);
    char *ck[] = {(char *)cl_binary("PSCTL"), "--manifest", c->manifest, "checkpoint", "--dir",
                  ckdir, NULL};
    char gap[16];
    snprintf(gap, sizeof gap, "%d", gap_ms);
    if (gap_ms) setenv("PS_TEST_ARM_GAP_MS", gap, 1);
    cl_proc_t *cp = cl_spawn(c, name, ck);
    unsetenv("PS_TEST_ARM_GAP_MS");
    return cp;
}

/* psctl checkpoint --dir CLUSTER/ckpt (into @p ckdir[CL_PATH]), waited for: exit 0. */
/* A file for PS_TEST_SLOW_APPLY_HOLD, created, its path into @p hold[CL_PATH] and that
 * variable: a psd started next has its slowed apply wait until the test removes it. */
static void slow_apply_hold(cl_cluster_t *c, char *hold)
{
    cl_path(c, "apply.hold", hold, CL_PATH);
    FILE *f = fopen(hold, "w");
    ck_assert(f != NULL && fclose(f) == 0);
    setenv("PS_TEST_SLOW_APPLY_HOLD", hold, 1);
}

static cl_proc_t *checkpoint_now(cl_cluster_t *c, char *ckdir)
{
    cl_proc_t *cp = checkpoint_spawn(c, "ckpt", 0, ckdir);
    EXPECT_EXIT(cp, 0);
    return cp;
}

/* Which of the two replay_clients @p w logged @p line (replay_client's plan "R@S/1s": the one
 * that stopped itself); fails the test when neither does. */
static int which_stopped(cl_proc_t *w[2], const char *line)
{
    for (int i = 0; i < (int)(RUN_S * 50); i++) {
        for (int p = 0; p < 2; p++)
            if (count_in_log(w[p], line)) return p;
        nap_ms(20);
    }
    ck_abort_msg("no worker logged \"%s\": %s | %s", line, cl_tail(w[0]), cl_tail(w[1]));
    return -1;
}

/* An asp cluster of 2 shards (sgd, lr 1, heartbeat_timeout_ms @p hb_ms) and two replay_clients
 * with plan @p plan (tensors "ab"), the one of rank 1 stopping itself at step 2 ("1@2/1s"):
 * @c stopped is that process, @c other rank 0's. @c argv stays for check_all and
 * new_workers_finish. 96 batches: under asp nothing holds rank 0 back, and on a loaded host it
 * took 36 of 40 while rank 1 took its first 4, so that rank 1 never reached a stop at step 4. */
typedef struct {
    cl_cluster_t *c;
    cl_proc_t *psd[2], *w[2], *stopped, *other;
    char nb[8], bs[8], plan[48], ord[4], hb[48];
    char *argv[7];
} asp_stop_t;

/* A 2x2 cluster of @p consistency (sgd, lr 1) and two replay_clients: @p top_extra manifest
 * lines, shard 0 started with @p env = @p val (none when @p env is NULL; "1:NAME": shard 1 with
 * NAME), @p nb batches, each taking @p nap_ms more (REPLAY_NAP_MS). */
static void replay_pair_start(asp_stop_t *r, const char *consistency, int hb_ms,
                              const char *top_extra, const char *env, const char *val,
                              const char *nb, int nap_ms, const char *plan)
{
    int on = env && strncmp(env, "1:", 2) == 0;
    if (on) env += 2;
    snprintf(r->hb, sizeof r->hb, "  heartbeat_timeout_ms: %d\n", hb_ms);
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 8, .consistency = consistency,
                   .optimizer = "{name: sgd, lr: 1}", .job_extra = r->hb,
                   .top_extra = top_extra, .start_wait_ms = CL_TOGETHER_MS};
    r->c = cl_cluster_create(&k);
    for (int i = 0; i < 2; i++)
        r->psd[i] = env && i == on ? cl_psd_start_env(r->c, i, READY_S, env, val)
                                   : cl_psd_start(r->c, i, NULL, READY_S);
    snprintf(r->nb, sizeof r->nb, "%s", nb);
    snprintf(r->bs, sizeof r->bs, "8");
    snprintf(r->plan, sizeof r->plan, "%s", plan);
    snprintf(r->ord, sizeof r->ord, "ab");
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), r->c->manifest, r->nb, r->bs, r->plan,
                    r->ord, NULL};
    memcpy(r->argv, argv, sizeof argv);
    char napv[16];
    snprintf(napv, sizeof napv, "%d", nap_ms);
    if (nap_ms) setenv("REPLAY_NAP_MS", napv, 1);
    r->w[0] = cl_spawn(r->c, "replay0", r->argv);
    r->w[1] = cl_spawn(r->c, "replay1", r->argv);
    unsetenv("REPLAY_NAP_MS");
}

/* The asp cluster and the two replay_clients of asp_stop_start and asp_follow_start. */
static void asp_pair_start(asp_stop_t *r, int hb_ms, const char *top_extra, const char *env,
                           const char *val, const char *nb, int nap_ms, const char *plan)
{
    replay_pair_start(r, "asp", hb_ms, top_extra, env, val, nb, nap_ms, plan);
}

static void asp_stop_start(asp_stop_t *r, int hb_ms, const char *plan)
{
    /* Each batch takes 20 ms more: with the suites two at a time, rank 0 took 95 of 96 before
     * rank 1 had its second (session 44, "no worker logged \"stops at step 2\""). */
    asp_pair_start(r, hb_ms, NULL, NULL, NULL, "96", 20, plan);
    int i = which_stopped(r->w, "stops at step 2");
    r->stopped = r->w[i];
    r->other = r->w[1 - i];
}

/* What a shard logs as a test hook kills it (the hook's name alone is in its start-up
 * warning too, so tests look for these). */
#define KILLED_AFTER_BATCH                                                                        \
    "killed at a push after a batch was handed out (PS_TEST_CRASH_AFTER_BATCH)"
#define KILLED_AFTER_APPLY                                                                        \
    "killed after an apply committed, before its acknowledgements (PS_TEST_CRASH_AFTER_APPLY)"

/* bsp: both members of step 5 die as @p plan says (replay_client's "plan:"), rank 0 before any
 * push and rank 1 after its push of replay.a, whose chunk (shard 0) applies step 5 with rank 1
 * alone. Two new workers take step 5 again with both batches. replay.a's chunk, past step 5,
 * drops their pushes and must say so for rank 0's batch, which it never had (PS_FLAG_STALE):
 * the coordinator hands that batch out again, replay.a applies it, and replay.b (which applied
 * it in the restarted step) skips it.
 * With @p slow, the same with the tensors the other way round (replay.b, on shard 1, first),
 * and that apply on shard 1 held until the new workers pushed (PS_TEST_SLOW_APPLY with its
 * hold file), so that their pushes land while it runs. (Not on shard 0: the coordinator answers the new members' batches
 * only once a state write holds them, and that write waits for its own shard's apply.) */

static void emptied_step_run(const char *plan, bool slow, bool checkpoint)
{
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 8, .consistency = "bsp",
                   .optimizer = "{name: sgd, lr: 1}", .start_wait_ms = CL_TOGETHER_MS};
    cl_cluster_t *c = cl_cluster_create(&k);
    int s = slow ? 1 : 0; /* the shard of the tensor pushed first */
    char hold[CL_PATH];
    if (slow) slow_apply_hold(c, hold); /* for shard 1 */
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S),
                         slow ? cl_psd_start_env(c, 1, READY_S, "PS_TEST_SLOW_APPLY", "6")
                              : cl_psd_start(c, 1, NULL, READY_S)};
    unsetenv("PS_TEST_SLOW_APPLY_HOLD");
    char nb[] = "40", bs[] = "8", die[64], ord[3];
    snprintf(die, sizeof die, "%s", plan);
    snprintf(ord, sizeof ord, "%s", slow ? "ba" : "ab");
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nb, bs, die, ord, NULL};
    pair_dies_at_step5(c, argv);
    /* With @p checkpoint, one asked for now, once step 5 has no members (session 47): shard 0
     * picks step 5, the open step, and says its members all left; step 5 was applied on shard
     * 0's chunk and not on shard 1's, so shard 0 says it would refuse an arm at step 5, and the
     * checkpoint is at step 6, taken once new workers finish step 5. Before, it was refused
     * ("shard 0 is already past step 5"). */
    char ckdir[CL_PATH];
    cl_proc_t *cp = NULL;
    if (checkpoint) {
        coord_t co;
        coord_open(&co, c);
        for (int i = 0; i < 3000; i++) {
            char *j = shard_status(&co, 0);
            bool gone = j && jnum(j, "open_step") == 5 && jnum(j, "open_step_members") == 0;
            free(j);
            if (gone) break;
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        coord_close(&co);
        cp = checkpoint_spawn(c, "ckpt", 0, ckdir);
        /* No new worker before the checkpoint has its step (one joining first makes step 5
         * have members again, and the checkpoint is at step 6 for that reason alone). */
        ck_assert_msg(cl_wait_log(cp, "the checkpoint waits for step 6", RUN_S) == 0,
                      "psctl never said it waits for step 6: %s", cl_tail(cp));
    }
    new_workers_finish_held(c, argv, slow ? psd[1] : NULL, slow ? hold : NULL);
    if (cp) {
        EXPECT_EXIT(cp, 0);
        EXPECT_LOG(cp, "psctl: checkpoint at step 6 in");
        EXPECT_LOG(cp, "psctl: checkpoint: the workers of step 5 left after part of it was "
                       "applied (shard 0: shard 0 is already past step 5 (at 6)): the checkpoint "
                       "waits for step 6, which new workers make");
    }
    EXPECT_LOG(psd[s], "applied that step without its batch");
    EXPECT_LOG(psd[0], "a shard had passed the step without it");
    if (slow) EXPECT_LOG(psd[s], "came while the chunk applied that step without it");
    coord_t co;
    coord_open(&co, c);
    char *j = shard_status(&co, (uint32_t)s);
    ck_assert_msg(j && jnum(j, "stale_acks") == 1, "shard %d should have acknowledged one push "
                  "as not applied: %s", s, j ? j : "-");
    free(j);
    coord_close(&co);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}

/* The same emptied step 5 (rank 0 dies before its pushes, rank 1 after its push of "replay.a",
 * which shard 0 applies alone), taken again by two new workers; shard 0 (the coordinator) is
 * killed at the first push after the 13th batch it handed out (PS_TEST_CRASH_AFTER_BATCH),
 * i.e. after it handed step 5 again, at one new worker's push, before the other's batch reply
 * has surely left. Its restart must keep step 5 open: its chunk passed step 5 long before, which
 * says nothing of the new members' pushes. Before, the restart closed it and handed out step 6:
 * the worker that never had its step 5 batch went on to step 6, and shard 1, still at step 5,
 * waited for its push for good (the chaos test with shard kills hung this way). */
static void emptied_coordinator_killed(const char *hook, const char *value, const char *killed,
                                        const char *want)
{
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 8, .consistency = "bsp",
                   .optimizer = "{name: sgd, lr: 1}", .start_wait_ms = CL_TOGETHER_MS};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start_env(c, 0, READY_S, hook, value),
                         cl_psd_start(c, 1, NULL, READY_S)};
    char nb[] = "40", bs[] = "8", die[] = "plan:0@5/0,1@5/1", ord[] = "ab";
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nb, bs, die, ord, NULL};
    pair_dies_at_step5(c, argv);
    static char never[] = "1000000000";
    argv[4] = never;
    cl_proc_t *w2 = cl_spawn(c, "replay2", argv), *w3 = cl_spawn(c, "replay3", argv);
    ck_assert_int_eq(cl_wait(psd[0], RUN_S), 128 + SIGKILL);
    EXPECT_LOG(psd[0], killed);
    psd[0] = cl_psd_start(c, 0, NULL, READY_S);
    EXPECT_EXIT(w2, 0);
    EXPECT_EXIT(w3, 0);
    EXPECT_LOG(psd[0], want);
    check_all(c, argv);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}

START_TEST(test_bsp_step_emptied_coordinator_killed)
{
    emptied_coordinator_killed("PS_TEST_CRASH_AFTER_BATCH", "13", KILLED_AFTER_BATCH,
                               "step 5 went out again after its members left: it stays open");
}
END_TEST

/* The same, with shard 0 killed in the write of its state that holds the last report of the
 * restarted step 5 (PS_TEST_CRASH_CLOSE_SAVE), the report whose close hands out step 6. The
 * batches of step 6 must not be answered before a committed state holds that close: the
 * restart sees step 5 open without that report, and the member whose report it lost asks
 * again. Before, step 6's batches left at once: that member pushed step 6, the restarted
 * coordinator counted its batch of step 5 (which shard 0 had acknowledged as not applied)
 * when it closed step 5 at the report of step 6, and handed step 6 out anew. */
START_TEST(test_bsp_step_emptied_close_not_saved)
{
    emptied_coordinator_killed("PS_TEST_CRASH_CLOSE_SAVE", "1",
                               "killed in a save of the coordinator's state "
                               "(PS_TEST_CRASH_CLOSE_SAVE)",
                               "step 5 went out again after its members left: it stays open");
}
END_TEST

/* The chunk had applied step 5 when the new workers push. Without the stale acknowledgement:
 * "replay.a[10] is 0: batch 10 applied never". */
START_TEST(test_bsp_step_emptied_after_partial_apply)
{
    emptied_step_run("plan:0@5/0,1@5/1", false, true);
}
END_TEST

/* The same step 5 on @p shards shards, but rank 1 stops itself (SIGSTOP) after its push of
 * "replay.a" instead of dying, so a checkpoint asked for now finds step 5 with a member, and
 * waits for step 6. Once rank 1 is removed as silent, step 5 has no members, and the checkpoint
 * looks whether it can be taken at step 5, the job's state, instead (as after a restore: see
 * test_integrity's checkpoint_restore_reshard). On 2 shards, shard 0 took its part at step 6
 * at once; on 1, the shard (replay.a at 6, replay.b at 5) says it is past step 5 when asked.
 * Either way it says so and waits on: the checkpoint is taken at step 6 once new workers
 * finish step 5. */
static void emptied_checkpoint_waits(int shards, const char *why)
{
    cl_conf_t k = {.shards = shards, .workers = 2, .batch_size = 8, .consistency = "bsp",
                   .optimizer = "{name: sgd, lr: 1}"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S),
                         shards > 1 ? cl_psd_start(c, 1, NULL, READY_S) : NULL};
    char nb[] = "40", bs[] = "8", plan[] = "plan:0@5/0,1@5/1s", ord[] = "ab";
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nb, bs, plan, ord, NULL};
    cl_proc_t *w[2] = {cl_spawn(c, "replay0", argv), cl_spawn(c, "replay1", argv)};
    int i = which_stopped(w, "stops at step 5");
    EXPECT_EXIT(w[1 - i], 128 + SIGKILL);
    char ckdir[CL_PATH];
    cl_proc_t *cp = checkpoint_spawn(c, "ckpt", 0, ckdir);
    ck_assert_msg(cl_wait_log(cp, "the checkpoint waits for step 6", RUN_S) == 0,
                  "psctl never said it waits for step 6: %s", cl_tail(cp));
    EXPECT_LOG(cp, "psctl: checkpoint: the workers of step 5 left after part of it was applied");
    EXPECT_LOG(cp, why);
    new_workers_finish(c, argv);
    EXPECT_EXIT(cp, 0);
    EXPECT_LOG(cp, "psctl: checkpoint at step 6 in");
    ck_assert_int_eq(cl_signal(w[i], SIGKILL), 0);
    cl_wait(w[i], RUN_S);
    stop_all(psd, shards);
    cl_cluster_destroy(c);
}

START_TEST(test_bsp_step_emptied_checkpoint_waits)
{
    emptied_checkpoint_waits(2, "(shard 0 took its part at step 6)");
}
END_TEST

START_TEST(test_bsp_step_emptied_checkpoint_waits_one_shard)
{
    emptied_checkpoint_waits(1, "shard 0 is already past step 5 (at 6)");
}
END_TEST

/* Step 5 of a job on 3 shards (replay.a on shard 0, replay.b on shard 1, none on shard 2):
 * both members stop themselves (SIGSTOP) before any push of it. A checkpoint asked for now waits
 * for step 6; shard 2, which holds no chunk, takes its part at once. Once both members are
 * removed as silent, no shard applied any of step 5, so the checkpoint moves there, the job's
 * state: shards 0 and 1 are moved, shard 2's part is removed and taken again. Before, a shard
 * with no chunk made psctl say step 5 was applied in part, and it waited until --wait ran out
 * (a review of the first version). New workers then finish the job with every batch once. */
START_TEST(test_bsp_step_emptied_checkpoint_moves_back)
{
    cl_conf_t k = {.shards = 3, .workers = 2, .batch_size = 8, .consistency = "bsp",
                   .optimizer = "{name: sgd, lr: 1}"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[3];
    for (int j = 0; j < 3; j++) psd[j] = cl_psd_start(c, j, NULL, READY_S);
    char nb[] = "40", bs[] = "8", plan[] = "plan:0@5/0s,1@5/0s", ord[] = "ab";
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nb, bs, plan, ord, NULL};
    cl_proc_t *w[2] = {cl_spawn(c, "replay0", argv), cl_spawn(c, "replay1", argv)};
    for (int j = 0; j < 2; j++)
        ck_assert_msg(cl_wait_log(w[j], "stops at step 5", RUN_S) == 0, "%s never stopped: %s",
                      w[j]->name, cl_tail(w[j]));
    char ckdir[CL_PATH];
    cl_proc_t *cp = checkpoint_spawn(c, "ckpt", 0, ckdir);
    EXPECT_EXIT(cp, 0);
    EXPECT_LOG(cp, "psctl: checkpoint at step 5 in");
    EXPECT_LOG(cp, "every member of step 5 left before any shard applied it");
    for (int j = 0; j < 3; j++) {
        char part[CL_PATH + 32];
        snprintf(part, sizeof part, "%s/shard-%d/meta.json", ckdir, j);
        char *meta = cl_read_file(part, NULL);
        ck_assert_msg(meta && strstr(meta, "\"step\": 5,"), "%s: %s", part, meta ? meta : "-");
        free(meta);
    }
    new_workers_finish(c, argv);
    for (int j = 0; j < 2; j++) {
        ck_assert_int_eq(cl_signal(w[j], SIGKILL), 0);
        cl_wait(w[j], RUN_S);
    }
    stop_all(psd, 3);
    cl_cluster_destroy(c);
}
END_TEST

/* The chunk is still applying step 5 (without the new members) when their pushes land: they
 * wait in slots, and are answered as stale when the apply passes the step. Before, the slot was
 * acknowledged plainly (the batch lost there) or, still landing, never answered. */
START_TEST(test_bsp_step_emptied_during_apply)
{
    emptied_step_run("plan:0@5/0,1@5/1n", true, false);
}
END_TEST

/* bsp: both members of the job's last step (5, of 12 batches) die after both their pushes were
 * applied, before reporting; two new workers take the step again with the two batches (every
 * chunk has them: acknowledged, not applied). The step closes only once both reported: before,
 * the first report closed it, the job had nothing left to hand out, and the second worker,
 * handed a batch it never got, kept the job from finishing for good. */
START_TEST(test_bsp_step_emptied_at_the_end)
{
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 8, .consistency = "bsp",
                   .optimizer = "{name: sgd, lr: 1}"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    char nb[] = "12", bs[] = "8", plan[] = "plan:0@5/2,1@5/2", ord[] = "ab";
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nb, bs, plan, ord, NULL};
    cl_proc_t *w[2] = {cl_spawn(c, "replay0", argv), cl_spawn(c, "replay1", argv)};
    for (int i = 0; i < 2; i++) EXPECT_EXIT(w[i], 128 + SIGKILL);
    new_workers_finish(c, argv);
    EXPECT_LOG(psd[0], "job complete at step 6");
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* bsp: 64 workers in a row take part in step 5 and die there before any push (replay_clients
 * with plan "*@5/0", in rounds of 8), as workers killed over and over inside one step: each
 * rank is held by a member that left the open step, which has no member left. Two
 * more workers must still join: step 5 closes with no member (its chunks pass it as they are)
 * and they finish the job with every batch applied once on both tensors (psd's checkpoint
 * follower meanwhile holds the hand-outs ahead, for step 15: that does not stop it; it
 * did in a first version). DESERTED_CKPT_HELD: a checkpoint holds step 5 itself for 3 s
 * meanwhile. DESERTED_RESTART:
 * shard 0 is killed while its chunk passes step 5 (held there: PS_TEST_SLOW_APPLY_HOLD) and
 * started again. Before: "all 64 worker ranks are taken (some by members that left the open
 * step, until it closes)", for good, also after a restart of shard 0. */
enum { DESERTED_PLAIN, DESERTED_RESTART, DESERTED_CKPT_HELD };
static void all_ranks_left_open_step(int mode)
{
    bool restart = mode == DESERTED_RESTART;
    /* A short start wait: a worker of a round that joins after the others died does not wait
     * for a second one (whoever gets step 5 dies, and the check allows any members). */
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 8, .consistency = "bsp",
                   .optimizer = "{name: sgd, lr: 1}", .start_wait_ms = 200,
                   .top_extra = mode != DESERTED_RESTART ? "checkpoint: {every_steps: 15}\n"
                                                         : NULL};
    cl_cluster_t *c = cl_cluster_create(&k);
    char hold[CL_PATH];
    if (restart) {
        slow_apply_hold(c, hold);
        setenv("PS_TEST_SLOW_APPLY", "6", 1);
    }
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), NULL};
    unsetenv("PS_TEST_SLOW_APPLY");
    unsetenv("PS_TEST_SLOW_APPLY_HOLD");
    psd[1] = cl_psd_start(c, 1, NULL, READY_S);
    char nb[] = "40", bs[] = "8", plan[] = "plan:*@5/0", ord[] = "ab";
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nb, bs, plan, ord, NULL};
    coord_t co;
    coord_open(&co, c);
    for (int dead = 0; dead < 64;) {
        int n = dead == 0 ? 2 : dead + 8 > 64 ? 64 - dead : 8;
        cl_proc_t *w[8];
        for (int i = 0; i < n; i++) {
            char name[16];
            snprintf(name, sizeof name, "doomed%d", dead + i);
            w[i] = cl_spawn(c, name, argv);
        }
        for (int i = 0; i < n; i++) {
            EXPECT_EXIT(w[i], 128 + SIGKILL);
            EXPECT_LOG(w[i], "at step 5");
        }
        dead += n;
        ck_assert_int_eq(wait_num(&co, "actual_workers", 0, 1, RUN_S), 0);
    }
    ck_assert_int_eq(coord_num(&co, "open_step"), 5);
    coord_close(&co);
    cl_proc_t *w2 = NULL;
    if (restart) {
        static char removable[] = "rand:0", never[] = "1000000000";
        argv[4] = removable; /* exits 3 if the restart does not know its join (not saved) */
        w2 = cl_spawn(c, "replay2", argv);
        argv[4] = never;
        int held = cl_wait_log(psd[0], "the apply of step 5 waits while ", RUN_S);
        ck_assert_int_eq(cl_signal(psd[0], SIGKILL), 0);
        cl_wait(psd[0], RUN_S);
        ck_assert(unlink(hold) == 0);
        ck_assert_msg(held == 0, "shard 0's chunk never passed step 5: %s", cl_tail(psd[0]));
        EXPECT_LOG(psd[0], "step 5: every member left it, and the 64 ranks they held until it "
                           "closes are all a worker could join with: it closes with no member");
        psd[0] = cl_psd_start(c, 0, NULL, READY_S);
        cl_proc_t *w3 = cl_spawn(c, "replay3", argv);
        EXPECT_EXIT(w3, 0);
        int st = cl_wait(w2, RUN_S);
        ck_assert_msg(st == 0 || st == 3, "replay2 exited %d: %s", st, cl_tail(w2));
        check_all(c, argv);
    } else {
        /* DESERTED_CKPT_HELD: a checkpoint now holds step 5 for 3 s (PS_TEST_ARM_GAP_MS, as a
         * slow shard would): the joiners are answered PS_EBUSY meanwhile and ask again
         * (before, they exited 1, "all 64 worker ranks are taken"); the close comes at a join
         * after the hold. psd's follower asks for step 15 meanwhile: held ahead once this
         * hold ends (before, its request ended this hold, and the checkpoint failed: "shard 1
         * is already past step 5"). */
        char ckdir[CL_PATH];
        cl_proc_t *cp = NULL;
        if (mode == DESERTED_CKPT_HELD) {
            cp = checkpoint_spawn(c, "ckpt", 3000, ckdir);
            ck_assert_msg(cl_wait_log(psd[0], "checkpoint at step 5: holding later steps",
                                      RUN_S) == 0,
                          "no hold of step 5: %s", cl_tail(psd[0]));
        }
        w2 = new_workers_finish(c, argv);
        if (cp) {
            EXPECT_EXIT(cp, 0);
            EXPECT_LOG(cp, "psctl: checkpoint at step 5 in");
            EXPECT_LOG(psd[0], "a worker cannot join yet: 64 of the 64 ranks are held by members "
                               "that left open step 5, until it closes (a checkpoint holds it)");
        }
        {
            /* The follower's checkpoint of step 15 is held ahead, or at once when its ask
             * comes with step 15 open already (once in session 54's full runs: the checkpoint
             * at step 15 was taken, held by psd_coord_ckpt_hold's path; seen in session 73
             * with the checkpoint of step 5 held too, once in 10 runs). */
            char *log = cl_log(psd[0]);
            ck_assert_msg(strstr(log, "step 15 reached: held for its checkpoint") ||
                              strstr(log, "checkpoint at step 15: holding later steps"),
                          "no hold of step 15 for the follower's checkpoint: %s", cl_tail(psd[0]));
            free(log);
        }
        EXPECT_LOG(psd[0], "step 5: every member left it, and the 64 ranks they held until it "
                           "closes are all a worker could join with: it closes with no member");
        EXPECT_LOG(psd[0], "step 5 of 0/0: the coordinator closed it with no member left; "
                           "passed as it is");
        EXPECT_LOG(psd[1], "step 5 of 1/0: the coordinator closed it with no member left; "
                           "passed as it is");
        coord_open(&co, c);
        ck_assert_int_eq(coord_num(&co, "steps_closed_without_members"), 1);
        coord_close(&co);
    }
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}

START_TEST(test_bsp_all_ranks_left_open_step) { all_ranks_left_open_step(DESERTED_PLAIN); }
END_TEST

START_TEST(test_bsp_all_ranks_left_open_step_restart)
{
    all_ranks_left_open_step(DESERTED_RESTART);
}
END_TEST

START_TEST(test_bsp_all_ranks_left_open_step_ckpt_held)
{
    all_ranks_left_open_step(DESERTED_CKPT_HELD);
}
END_TEST

/* bsp: step 5's members die (rank 0 before its pushes, rank 1 after its push of "replay.a",
 * which shard 0's chunk applies with it alone: its batch goes back tagged (5, 1)); then 10
 * workers in a row join and are handed step 5, each alone (by shard 0's tick after the start
 * wait, or at its request), and die there. With @p asked false they are killed before they
 * asked for a batch (replay_client "unasked"), as joiners that give up on a shard that stays
 * away: they never had a batch reply, so they pushed nothing, their ranks are free at once and
 * the batches go back without a tag of theirs. With @p asked they ask, are answered and die
 * before any push (plan "*@5/0"): each tags the batch it had, (5, rank), and the tags of step 5
 * merge into one. Either way two new workers then finish with every batch applied once. Before
 * (session 48), each joiner held its rank until step 5 closed and added a tag, so rank 1's
 * batch lost its tag after 4 more (PS_REPLAY_MAX) and replay.a applied it twice. Without @p
 * asked, shard 0 is restarted before the two finish: it must not hold the joiners' rank. */
static void joiners_in_emptied_step(bool asked)
{
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 8, .consistency = "bsp",
                   .optimizer = "{name: sgd, lr: 1}", .start_wait_ms = 200};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    char nb[] = "40", bs[] = "8", plan[] = "plan:0@5/0,1@5/1", ord[] = "ab";
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nb, bs, plan, ord, NULL};
    pair_dies_at_step5(c, argv);
    coord_t co;
    coord_open(&co, c);
    static char unasked[] = "unasked", dies[] = "plan:*@5/0";
    argv[4] = asked ? dies : unasked;
    for (int i = 0; i < 10; i++) {
        char name[16];
        snprintf(name, sizeof name, "joiner%d", i);
        cl_proc_t *j = cl_spawn(c, name, argv);
        if (!asked) {
            ck_assert_int_eq(cl_wait_log(j, "waits without asking for a batch", RUN_S), 0);
            ck_assert_int_eq(wait_num(&co, "open_step_members", 1, 1, RUN_S), 1);
            ck_assert_int_eq(cl_signal(j, SIGKILL), 0);
        }
        ck_assert_int_eq(cl_wait(j, RUN_S), 128 + SIGKILL);
        if (asked) EXPECT_LOG(j, "at step 5");
        ck_assert_int_eq(wait_num(&co, "actual_workers", 0, 1, RUN_S), 0);
    }
    ck_assert_int_eq(coord_num(&co, "open_step"), 5);
    coord_close(&co);
    if (!asked) {
        /* A restart of shard 0 holds rank 2 (the unasked joiners') no more than it was: the
         * next joiner gets it (before the fix of a review: rank 3, as the restart rebuilt the
         * held ranks from the last joiner's saved batch). */
        ck_assert_int_eq(cl_signal(psd[0], SIGTERM), 0);
        ck_assert_int_eq(cl_wait(psd[0], RUN_S), 0);
        psd[0] = cl_psd_start(c, 0, NULL, READY_S);
    }
    new_workers_finish(c, argv);
    if (!asked) EXPECT_LOG(psd[0], "joins as rank 2 at step 5");
    char *log = cl_log(psd[0]);
    ck_assert_msg(strstr(log, "oldest replay tag dropped") == NULL,
                  "a batch lost a replay tag: %s", cl_tail(psd[0]));
    /* The joiners that asked had the two batches in turn, five each: each is named once three
     * workers left with it (rank 0 or 1, then two joiners). The unasked ones never had them:
     * neither reaches three. */
    const char *named = "(8 samples: positions ";
    ck_assert_msg((strstr(log, named) != NULL) == asked, "the batches %s named: %s",
                  asked ? "were not" : "were", cl_tail(psd[0]));
    if (asked) EXPECT_LOG(psd[0], "went to 3 workers that each left with it");
    free(log);
    coord_open(&co, c);
    ck_assert_int_eq(coord_num(&co, "batches_suspect"), asked ? 2 : 0);
    coord_close(&co);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}

START_TEST(test_bsp_unasked_joiners_leave_no_tag) { joiners_in_emptied_step(false); }
END_TEST

START_TEST(test_bsp_joiners_tags_merge) { joiners_in_emptied_step(true); }
END_TEST

START_TEST(test_bsp_random_deaths_applied_once) { random_deaths("bsp", false); }
END_TEST

START_TEST(test_bsp_random_deaths_shard_kills) { random_deaths("bsp", true); }
END_TEST


/* asp: shard 0 (the coordinator) killed by test hook @p hook=@p value (a line @p said in its
 * log) and started again; two replay clients must finish with every batch applied once, and,
 * with @p finished, shard 0 must say the job is finished. With @p save_fails, the save holding
 * the 9th hand-out fails once besides (PS_TEST_FAIL_HANDOUT_SAVE). */
static void coordinator_killed_asp(const char *hook, const char *value, const char *said,
                                   bool save_fails, bool finished)
{
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 8, .consistency = "asp",
                   .optimizer = "{name: sgd, lr: 1}"};
    cl_cluster_t *c = cl_cluster_create(&k);
    if (save_fails) setenv("PS_TEST_FAIL_HANDOUT_SAVE", "9", 1);
    cl_proc_t *psd[2] = {cl_psd_start_env(c, 0, READY_S, hook, value), NULL};
    unsetenv("PS_TEST_FAIL_HANDOUT_SAVE"); /* shard 0 has its copy */
    psd[1] = cl_psd_start(c, 1, NULL, READY_S);
    char nb[] = "40", bs[] = "8", die[] = "1000000", ord[] = "ab";
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nb, bs, die, ord, NULL};
    cl_proc_t *w[2] = {cl_spawn(c, "replay0", argv), cl_spawn(c, "replay1", argv)};
    ck_assert_int_eq(cl_wait(psd[0], RUN_S), 128 + SIGKILL);
    EXPECT_LOG(psd[0], said);
    cl_proc_t *killed = psd[0];
    psd[0] = cl_psd_start(c, 0, NULL, READY_S);
    EXPECT_EXIT(w[0], 0);
    EXPECT_EXIT(w[1], 0);
    /* Rank 0 checks, whichever process joined first. */
    ck_assert_int_eq(count_in_log(w[0], "every batch applied once on both tensors") +
                         count_in_log(w[1], "every batch applied once on both tensors"),
                     1);
    if (save_fails) { /* and the hand-out waited for the save that came after the failed one */
        EXPECT_LOG(killed, "the save of a hand-out fails (PS_TEST_FAIL_HANDOUT_SAVE)");
        EXPECT_LOG(killed, "batches wait until a save commits");
        EXPECT_LOG(killed, "the coordinator's state is saved again (after 1 failed save)");
    }
    if (finished) {
        EXPECT_LOG(killed, "job complete");
        coord_t co;
        coord_open(&co, c);
        char *j = shard_status(&co, 0);
        ck_assert_msg(j && strstr(j, "\"finished\": true"), "the job is not finished: %s",
                      j ? j : "-");
        free(j);
        coord_close(&co);
    }
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}

/* Shard 0 killed right after it handed out a batch, at the next push it gets
 * (PS_TEST_CRASH_AFTER_BATCH). The worker pushes that batch when the shard is back; the
 * restarted coordinator must not hand the same samples out again (they would be applied twice)
 * nor hand the worker its batch before it (the same). Hand-outs under asp and ssp are answered
 * once the state holding them is committed. Before, the restart forgot the hand-out:
 * replay.a's element of that batch ended at -2. */
START_TEST(test_asp_coordinator_restart_after_handout)
{
    coordinator_killed_asp("PS_TEST_CRASH_AFTER_BATCH", "9", KILLED_AFTER_BATCH, false, false);
}
END_TEST

/* The same, with the save that holds that hand-out failing (PS_TEST_FAIL_HANDOUT_SAVE, as if
 * the store refused the write). The batch must wait for a save that commits (psd_coord_tick
 * tries again). Before, a failed save answered what waited for it ("a hand-out never waits for
 * good"), the restart forgot the hand-out, and the batch was applied twice. */
START_TEST(test_asp_handout_save_failed)
{
    coordinator_killed_asp("PS_TEST_CRASH_AFTER_BATCH", "9", KILLED_AFTER_BATCH, true, false);
}
END_TEST

/* Shard 0 killed in the save of its first answer "the job is complete"
 * (PS_TEST_CRASH_FINISH_SAVE). That answer goes out only once a save holds it: the workers had
 * not been told, ask the restarted shard again, and the job completes with every batch applied
 * once. Before (a probe, session 47), shard 0 answered at once and the last reports were not
 * saved yet: killed then, it came back with those batches in flight, every worker gone, and
 * the job unfinished for good. */
START_TEST(test_asp_finish_not_saved)
{
    coordinator_killed_asp("PS_TEST_CRASH_FINISH_SAVE", "1",
                           "killed in a save of the coordinator's state "
                           "(PS_TEST_CRASH_FINISH_SAVE)",
                           false, true);
}
END_TEST

/* A worker whose join reached shard 0 before another worker declared the model, and shard 1
 * after that worker trained the job through (PS_TEST_JOIN_HOLD between the two), asks shard 0
 * again and finds every batch applied once (it joined first: rank 0, which checks). Before, it was refused as
 * if shard 0 had lost its store ("shard 1 ... holds 2 tensors at step 1, shard 0 0 tensors at
 * step 0: shard 0's store was lost or replaced"), seen with the suites run two at a time. */
START_TEST(test_join_beside_first_declare)
{
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 8, .consistency = "asp",
                   .optimizer = "{name: sgd, lr: 1}",
                   .job_extra = "  heartbeat_timeout_ms: 60000\n"}; /* the held one stays */
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    char nb[] = "40", bs[] = "8", die[] = "1000000", ord[] = "ab", hold[CL_PATH];
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nb, bs, die, ord, NULL};
    cl_path(c, "join.hold", hold, sizeof hold);
    FILE *f = fopen(hold, "w");
    ck_assert(f != NULL && fclose(f) == 0);
    setenv("PS_TEST_JOIN_HOLD", hold, 1);
    cl_proc_t *late = cl_spawn(c, "replay-late", argv);
    unsetenv("PS_TEST_JOIN_HOLD");
    ck_assert_msg(cl_wait_log(psd[0], "joins as rank 0", RUN_S) == 0, "%s", cl_tail(psd[0]));
    cl_proc_t *first = cl_spawn(c, "replay-first", argv);
    EXPECT_EXIT(first, 0);
    ck_assert(unlink(hold) == 0);
    EXPECT_EXIT(late, 0);
    EXPECT_LOG(late, "shard 0 held none when it answered: asking shard 0 again");
    EXPECT_LOG(late, "every batch applied once on both tensors");
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* asp: rank 1 stops (SIGSTOP) between its two pushes of a batch, past the heartbeat timeout;
 * both shards drop it, shard 0 hands its batch to rank 0, which pushes it to both tensors and
 * finishes the job. Continued, rank 1's libps connects again and would push the batch's second
 * tensor once more: shard 1 refuses the join it dropped as silent, so the stopped worker learns
 * it was removed and that batch is applied once. Before, shard 1 took the old join back, and
 * when its hello was answered before shard 0's refusal the push was applied a second time
 * ("replay.b[...] is -2: batch ... applied twice"). */
START_TEST(test_asp_stopped_member_refused)
{
    asp_stop_t r;
    asp_stop_start(&r, 1000, "plan:1@2/1s");
    cl_proc_t **psd = r.psd, *s = r.stopped;
    EXPECT_EXIT(r.other, 0); /* the job done without it */
    ck_assert_msg(cl_wait_log(psd[1], "dropping it", RUN_S) == 0, "shard 1 kept rank 1: %s",
                  cl_tail(psd[1]));
    /* Shard 0 stopped meanwhile, so that shard 1 answers the continued worker's hello first
     * (else shard 0's refusal may come first, and nothing is pushed again either way). */
    ck_assert_int_eq(cl_signal(psd[0], SIGSTOP), 0);
    ck_assert_int_eq(cl_signal(s, SIGCONT), 0);
    char back[64];
    snprintf(back, sizeof back, "worker pid %d from", (int)s->pid);
    for (int i = 0; i < (int)(RUN_S * 20); i++) { /* shard 1 refused it, or took it back */
        if (count_in_log(psd[1], "dropped it as silent: refused") ||
            count_in_log(psd[1], back) > 1)
            break;
        nap_ms(50);
    }
    nap_ms(200); /* a push sent again after a hello taken back lands */
    ck_assert_int_eq(cl_signal(psd[0], SIGCONT), 0);
    EXPECT_EXIT(s, 1);
    EXPECT_LOG(s, "continued");
    EXPECT_LOG(s, "was removed from the job");
    check_all(r.c, r.argv);
    EXPECT_LOG(psd[1], "is back after this shard dropped it as silent: refused");
    EXPECT_LOG(s, "fell silent past the heartbeat timeout and was dropped: join again");
    stop_all(psd, 2);
    cl_cluster_destroy(r.c);
}
END_TEST

/* The same, with the other tensor first, and shard 1 (not the coordinator) killed right after
 * it committed that step with the dying worker's push (PS_TEST_CRASH_AFTER_APPLY: its 6th apply
 * is step 5 of "replay.b", its one chunk) and started again before the batch comes back: the
 * restarted shard still knows whose batches its chunk has (the apply members it stored where
 * they changed), so it does not apply the batch again. Before, it did not remember and did. */
START_TEST(test_kill9_mid_step_shard_restarted)
{
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 8, .optimizer = "{name: sgd, lr: 1}",
                   .start_wait_ms = CL_TOGETHER_MS};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S),
                         cl_psd_start_env(c, 1, READY_S, "PS_TEST_CRASH_AFTER_APPLY", "6")};
    cl_proc_t *w[2];
    replay_start(c, "ba", "40", w);
    ck_assert_int_eq(cl_wait(psd[1], RUN_S), 128 + SIGKILL);
    EXPECT_LOG(psd[1], KILLED_AFTER_APPLY);
    psd[1] = cl_psd_start(c, 1, NULL, READY_S);
    replay_expect(w, NULL);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* Three workers; ranks 1 and 2 die at step 5 after their pushes of "replay.b" (shard 1 applies
 * step 5 with all three), before "replay.a". Their batches go to rank 0, alone, at steps 6 and
 * 7, tagged (5, 1) and (5, 2). Shard 1 is killed right after it committed step 6
 * (PS_TEST_CRASH_AFTER_APPLY: its 7th apply), whose members differ from step 5's, and started
 * again before the batch of step 7 comes: it must still know that its step 5 had rank 2's batch.
 * Before, it stored only the members from the last change on (step 6): a replay of an earlier
 * step counted as not known and was applied again ("replay.b[k] ... applied twice"). */
START_TEST(test_kill9_shard_restarted_after_members_changed)
{
    cl_conf_t k = {.shards = 2, .workers = 3, .batch_size = 8, .consistency = "bsp",
                   .optimizer = "{name: sgd, lr: 1}", .start_wait_ms = CL_TOGETHER_MS};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S),
                         cl_psd_start_env(c, 1, READY_S, "PS_TEST_CRASH_AFTER_APPLY", "7")};
    char nb[] = "40", bs[] = "8", plan[] = "plan:1@5/1,2@5/1", ord[] = "ba";
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nb, bs, plan, ord, NULL};
    cl_proc_t *w[3] = {cl_spawn(c, "replay0", argv), cl_spawn(c, "replay1", argv),
                       cl_spawn(c, "replay2", argv)};
    ck_assert_int_eq(cl_wait(psd[1], RUN_S), 128 + SIGKILL);
    EXPECT_LOG(psd[1], KILLED_AFTER_APPLY);
    psd[1] = cl_psd_start(c, 1, NULL, READY_S);
    int died = 0, checked = 0;
    for (int i = 0; i < 3; i++) {
        int st = cl_wait(w[i], RUN_S);
        ck_assert_msg(st == 0 || st == 128 + SIGKILL, "replay%d exited %d: %s", i, st,
                      cl_tail(w[i]));
        died += st == 128 + SIGKILL;
        checked += count_in_log(w[i], "every batch applied once on both tensors");
    }
    ck_assert_int_eq(died, 2);
    ck_assert_int_eq(checked, 1);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* Shard 0 (the coordinator) killed right after it committed step 5 with both workers' pushes of
 * "replay.a" (PS_TEST_CRASH_AFTER_APPLY: its 6th apply), before its acknowledgements, and
 * started again; then the worker of rank 1 dies before pushing "replay.b" of step 5. The restart
 * closed step 5 (its apply had committed there) while shard 1 still waits for rank 1's push of
 * it. Shard 0 remembers that step's members and batches until reports show it applied
 * everywhere: rank 1's removal gives shard 1 a view of step 5 without it, and its batch goes to
 * the survivor tagged (step 5, rank 1), so "replay.a" keeps it once and "replay.b" gets it once.
 * Before, shard 1 waited for good (the removal named step 6 only) and the survivor hung. */
START_TEST(test_kill9_mid_step_coordinator_restarted)
{
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 8, .optimizer = "{name: sgd, lr: 1}",
                   .start_wait_ms = CL_TOGETHER_MS};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start_env(c, 0, READY_S, "PS_TEST_CRASH_AFTER_APPLY", "6"),
                         cl_psd_start(c, 1, NULL, READY_S)};
    cl_proc_t *w[2];
    replay_start(c, "ab", "40", w);
    ck_assert_int_eq(cl_wait(psd[0], RUN_S), 128 + SIGKILL);
    EXPECT_LOG(psd[0], KILLED_AFTER_APPLY);
    psd[0] = cl_psd_start(c, 0, NULL, READY_S);
    replay_expect(w, NULL);
    EXPECT_LOG(psd[0], "left before any report showed step 5 applied everywhere");
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* Two replay_clients of @p nb batches (DIE_STEP @p plan, order "ab") on a new 2x2 cluster (sgd
 * lr 1), started into @p psd and @p w, with REPLAY_IDLE=@p idle, REPLAY_IDLE_UNTIL=@p until and
 * REPLAY_NAP_MS=@p nap in their environment (NULL: not set): tensors no member pushes on shard 0
 * (replay_client.c). */
static cl_cluster_t *idle_replay_start(const char *nb, const char *plan, const char *idle,
                                       const char *until, const char *nap, cl_proc_t *psd[2],
                                       cl_proc_t *w[2])
{
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 8, .optimizer = "{name: sgd, lr: 1}",
                   .start_wait_ms = CL_TOGETHER_MS};
    cl_cluster_t *c = cl_cluster_create(&k);
    psd[0] = cl_psd_start(c, 0, NULL, READY_S);
    psd[1] = cl_psd_start(c, 1, NULL, READY_S);
    char nbs[16], bs[] = "8", plans[32], ord[] = "ab";
    snprintf(nbs, sizeof nbs, "%s", nb);
    snprintf(plans, sizeof plans, "%s", plan);
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nbs, bs, plans, ord, NULL};
    const char *names[] = {"REPLAY_IDLE", "REPLAY_IDLE_UNTIL", "REPLAY_NAP_MS"};
    const char *values[] = {idle, until, nap};
    for (int i = 0; i < 3; i++)
        if (values[i]) setenv(names[i], values[i], 1);
    w[0] = cl_spawn(c, "replay0", argv);
    w[1] = cl_spawn(c, "replay1", argv);
    for (int i = 0; i < 3; i++) unsetenv(names[i]);
    return c;
}

/* Shard 0 also holds a tensor no member pushes (replay.idle, declared by both workers and never
 * pushed, REPLAY_IDLE: as a tensor of another model, or a head no longer trained), with
 * replay.a on shard 1 and replay.b on shard 0. Rank 1 stops at step 5 after its push of
 * replay.a (applied on shard 1 with both workers' pushes); shard 0, waiting for its replay.b,
 * is SIGKILLed at once, the stopped worker too, and shard 0 started again. Its committed state
 * is of step 4 (its apply of step 4 wrote it), its replay.b chunk at 5. Before (a probe,
 * session 68), the restarted coordinator took the step it applied from its lowest chunk
 * version, the idle tensor's 0: step 4 stayed open, and rank 1's batch of step 5, applied on
 * shard 1, went out again untagged and was applied there twice ("replay.a[...] applied
 * twice"). The same with replay.idle pushed until step 3 (REPLAY_IDLE_UNTIL=4: a head that
 * stops being trained), its chunk at 4, the saved open step: a restart took step 4 for not
 * applied there too, so its close is saved before step 5 goes out (a review, session 68). */
START_TEST(test_kill9_coordinator_idle_tensor)
{
    for (int until = 0; until <= 4; until += 4) {
        cl_proc_t *psd[2], *w[2];
        cl_cluster_t *c = idle_replay_start("40", "plan:1@5/1s", "1", until ? "4" : NULL, NULL,
                                            psd, w);
        int v = -1;
        for (int i = 0; i < (int)(RUN_S * 100) && v < 0; i++) {
            for (int j = 0; j < 2 && v < 0; j++)
                if (count_in_log(w[j], "rank 1 stops at step 5")) v = j;
            if (v < 0) nap_ms(10);
        }
        ck_assert_msg(v >= 0, "rank 1 did not stop: %s / %s", cl_tail(w[0]), cl_tail(w[1]));
        ck_assert_int_eq(cl_signal(psd[0], SIGKILL), 0); /* before it drops the stopped rank */
        ck_assert_int_eq(cl_signal(w[v], SIGKILL), 0);
        cl_wait(psd[0], RUN_S);
        psd[0] = cl_psd_start(c, 0, NULL, READY_S);
        EXPECT_EXIT(w[v], 128 + SIGKILL);
        EXPECT_EXIT(w[1 - v], 0);
        EXPECT_LOG(w[1 - v], "every batch applied once on both tensors");
        stop_all(psd, 2);
        cl_cluster_destroy(c);
    }
}
END_TEST

/* Shard 0 holds no chunk a member pushes (REPLAY_IDLE=2: two tensors no member pushes there,
 * replay.a and replay.b both on shard 1), and is SIGKILLed while the job trains and started
 * again: the workers finish, every batch applied once. Before (a probe, session 68), no apply
 * on shard 0 ever wrote the coordinator's state past the job's start, so the restart resumed
 * at step 0: the workers failed "rank 0 reports step N done, but the open step is 0", and a
 * joiner was refused as if shard 0's data_dir had gone back. Now a close that no apply here
 * took part in is saved before the next step's batches are answered. */
START_TEST(test_kill9_coordinator_no_trained_chunk)
{
    cl_proc_t *psd[2], *w[2];
    cl_cluster_t *c = idle_replay_start("200", "plan:9@9999/0", "2", NULL, "20", psd, w);
    ck_assert_msg(cl_wait_log(w[0], "at step 20", RUN_S) == 0, "no step 20: %s", cl_tail(w[0]));
    ck_assert_int_eq(cl_signal(psd[0], SIGKILL), 0);
    cl_wait(psd[0], RUN_S);
    psd[0] = cl_psd_start(c, 0, NULL, READY_S);
    for (int i = 0; i < 2; i++) EXPECT_EXIT(w[i], 0);
    ck_assert_int_eq(count_in_log(w[0], "every batch applied once on both tensors") +
                     count_in_log(w[1], "every batch applied once on both tensors"), 1);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* The same crash of shard 0 right after it committed step 5 of "replay.a", but both workers die
 * there, after their pushes of "replay.a" and before "replay.b": no member of step 5 is left.
 * The restart closed step 5; shard 1, still at it, gets a view of it with no members followed
 * by the next step's, passes it as it is, and the two batches, given back tagged (step 5, rank),
 * are applied on "replay.b" and not again on "replay.a" by two new workers. With @p slow_pass,
 * shard 1's pass takes 2 s (PS_TEST_SLOW_APPLY), so their pushes of step 6 come while it is at
 * step 5: refused as ahead (PS_FLAG_BEHIND), they are sent again until it gets there. */
static void whole_step_run(bool slow_pass, bool last)
{
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 8, .optimizer = "{name: sgd, lr: 1}",
                   .job_extra = "  heartbeat_timeout_ms: 3000\n", .start_wait_ms = CL_TOGETHER_MS};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start_env(c, 0, READY_S, "PS_TEST_CRASH_AFTER_APPLY", "6"),
                         slow_pass ? cl_psd_start_env(c, 1, READY_S, "PS_TEST_SLOW_APPLY", "6")
                                   : cl_psd_start(c, 1, NULL, READY_S)};
    char nb[8], bs[] = "8", plan[] = "plan:0@5/1,1@5/1", ord[] = "ab";
    snprintf(nb, sizeof nb, "%s", last ? "12" : "40"); /* 12: step 5 is the job's last */
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nb, bs, plan, ord, NULL};
    cl_proc_t *w[2] = {cl_spawn(c, "replay0", argv), cl_spawn(c, "replay1", argv)};
    ck_assert_int_eq(cl_wait(psd[0], RUN_S), 128 + SIGKILL);
    EXPECT_LOG(psd[0], KILLED_AFTER_APPLY);
    psd[0] = cl_psd_start(c, 0, NULL, READY_S);
    for (int i = 0; i < 2; i++) {
        EXPECT_EXIT(w[i], 128 + SIGKILL);
        EXPECT_LOG(w[i], "at step 5");
    }
    cl_proc_t *w2 = new_workers_finish(c, argv);
    EXPECT_LOG(psd[0], "left before any report showed step 5 applied everywhere");
    EXPECT_LOG(psd[1], "closed it with no member left");
    if (slow_pass) EXPECT_LOG(w2, "sending it again until it gets there");
    if (last) { /* complete only once the batches shard 1 lacked were applied */
        char *log = cl_log(psd[0]);
        const char *left = strstr(log, "left before any report showed step 5");
        const char *done = strstr(log, "job complete at step");
        ck_assert_msg(left && done && left < done, "the job was complete before its last "
                      "step's batches were known applied everywhere: %s", log);
        free(log);
    }
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}

/* Before, shard 1 waited at step 5 for good (an empty view was not even learnt), refusing every
 * push of step 6, and the workers failed one after another. */
START_TEST(test_kill9_whole_step_coordinator_restarted) { whole_step_run(false, false); }
END_TEST

/* Before, the new workers' pushes of step 6 failed ("but the chunk is at step 5"). */
START_TEST(test_kill9_whole_step_slow_pass) { whole_step_run(true, false); }
END_TEST

/* The same at the job's last step: the restart counts both batches, and the job is complete
 * only once their members are gone and shard 1 applied them. Before, the restart said "job
 * complete at step 6" at once: a worker that asked then was told so and left (the chaos test's
 * check then found a batch applied never on "replay.b"). */
START_TEST(test_kill9_last_step_coordinator_restarted) { whole_step_run(false, true); }
END_TEST

/* bsp: one worker; a second joins while shard 0 (the coordinator) applies step 5, whose apply
 * job took the coordinator's state before the join (PS_TEST_SLOW_APPLY: it takes 2 s). The close
 * of step 5 hands out step 6 to both, and shard 0 is killed in the write of its state that holds
 * that hand-out (PS_TEST_CRASH_JOIN_SAVE=2: the job's start was the first), then started again.
 * Its restart knows neither the join nor the newcomer's batch, so that batch must not have been
 * answered before the write was committed. Before, it was: the newcomer pushed it to replay.b
 * first, shard 1 applied step 6 with it, and the restart handed step 6 out without the newcomer
 * and its batch to the survivor at step 7 ("replay.b[7] is -1.5: batch 7 applied twice"; the
 * chaos test with shard kills lost a batch the same way, "replay.a[49] is 0", about 1 run in
 * 2900). */
START_TEST(test_kill9_join_handout_not_saved)
{
    cl_conf_t k = {.shards = 2, .workers = 1, .batch_size = 8, .consistency = "bsp",
                   .optimizer = "{name: sgd, lr: 1}"};
    cl_cluster_t *c = cl_cluster_create(&k);
    char hold[CL_PATH];
    slow_apply_hold(c, hold);
    setenv("PS_TEST_SLOW_APPLY", "6", 1);
    cl_proc_t *psd[2] = {cl_psd_start_env(c, 0, READY_S, "PS_TEST_CRASH_JOIN_SAVE", "2"), NULL};
    unsetenv("PS_TEST_SLOW_APPLY");
    unsetenv("PS_TEST_SLOW_APPLY_HOLD");
    psd[1] = cl_psd_start(c, 1, NULL, READY_S);
    char nb[] = "40", bs[] = "8", mode[] = "check", ord[] = "ba";
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nb, bs, mode, ord, NULL};
    cl_proc_t *w = cl_spawn(c, "replay0", argv);
    ck_assert_int_eq(cl_wait_log(psd[0], "the apply of step 5 waits while ", RUN_S), 0);
    static char removable[] = "rand:0"; /* exits 3 if the restart removed it */
    argv[4] = removable;
    cl_proc_t *joiner = cl_spawn(c, "joiner", argv);
    /* Released once the joiner is in (it had 2 s: a joiner slow to start missed them). */
    int joined = cl_wait_log(psd[0], "joins as rank 1 at step 5", RUN_S);
    ck_assert(unlink(hold) == 0);
    ck_assert_msg(joined == 0, "the joiner never joined: %s", cl_tail(psd[0]));
    ck_assert_int_eq(cl_wait(psd[0], RUN_S), 128 + SIGKILL);
    EXPECT_LOG(psd[0], "joins as rank 1 at step 5"); /* within the slowed apply */
    EXPECT_LOG(psd[0], "killed in a save of the coordinator's state (PS_TEST_CRASH_JOIN_SAVE)");
    EXPECT_LOG(psd[0], "takes part from step 6");
    psd[0] = cl_psd_start(c, 0, NULL, READY_S);
    EXPECT_EXIT(w, 0);
    EXPECT_LOG(w, "every batch applied once on both tensors");
    int st = cl_wait(joiner, RUN_S);
    ck_assert_msg(st == 0 || st == 3, "the joiner exited %d: %s", st, cl_tail(joiner));
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* asp: the same stop, but the worker is continued while shard 1 still holds its connection
 * (shard 1 was stopped until shard 0 had dropped the worker, and its late cron then skips one
 * heartbeat check): no hello, so nothing refuses it, and its push of the batch's second tensor
 * comes after rank 0, handed the batch again, pushed it there. Shard 1 remembers the tagged
 * push it took and acknowledges the late one without applying it. Before, "replay.b[...] is
 * -2: batch ... applied twice". */
START_TEST(test_asp_stopped_member_late_push)
{
    asp_stop_t r;
    /* Shard 1 drops the stopped worker one heartbeat timeout after its own SIGCONT, and the
     * worker must be continued before that: 1000 ms left ~0.9 s for a loaded host. */
    asp_stop_start(&r, 3000, "plan:1@2/1s");
    cl_proc_t **psd = r.psd, *s = r.stopped;
    ck_assert_int_eq(cl_signal(psd[1], SIGSTOP), 0);
    ck_assert_msg(cl_wait_log(psd[0], "missed heartbeats", RUN_S) == 0, "shard 0 kept rank 1: %s",
                  cl_tail(psd[0]));
    ck_assert_int_eq(cl_signal(psd[1], SIGCONT), 0);
    char *log = cl_log(s);
    const char *at = strstr(log, "stops at step 2 with batch ");
    unsigned long long j = at ? strtoull(at + strlen("stops at step 2 with batch "), NULL, 10) : 0;
    free(log);
    char handed[64];
    snprintf(handed, sizeof handed, "got batch %llu at step", j);
    ck_assert_msg(cl_wait_log(r.other, handed, RUN_S) == 0, "batch %llu was not handed on: %s", j,
                  cl_tail(r.other));
    nap_ms(100); /* its pushes of that batch land */
    ck_assert_int_eq(cl_signal(s, SIGCONT), 0);
    EXPECT_EXIT(s, 1);
    EXPECT_LOG(s, "was removed from the job");
    EXPECT_EXIT(r.other, 0);
    check_all(r.c, r.argv);
    EXPECT_LOG(psd[1], "which this chunk took from the worker it was handed to again");
    stop_all(psd, 2);
    cl_cluster_destroy(r.c);
}
END_TEST

/* psd --restore from a checkpoint whose step a member left part-way (bsp): rank 1 pushed
 * replay.a at step 4 and died before pushing replay.b, and the checkpoint (asked for while shard
 * 0 applied step 4, slowed by PS_TEST_SLOW_APPLY, so at step 5) has replay.a with rank 1's batch
 * and replay.b without it; the coordinator's state in it still names rank 1 as a member holding
 * that batch. Restored, with new workers, every batch must still be applied once on both: the
 * batch goes out again, and replay.a, which has it, skips it. Before, the restore kept only the
 * chunks and the coordinator's state, not the chunks' records of whose pushes they summed
 * (key 'D') nor the recovery state ("jobrec"), and the restarted coordinator counted the step
 * as applied everywhere: "replay.b[...] is 0: batch ... applied never". */
START_TEST(test_restore_after_member_left_mid_step)
{
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 8, .consistency = "bsp",
                   .optimizer = "{name: sgd, lr: 1}",
                   .job_extra = "  heartbeat_timeout_ms: 1000\n",
                   .start_wait_ms = CL_TOGETHER_MS};
    cl_cluster_t *c = cl_cluster_create(&k);
    char hold[CL_PATH];
    slow_apply_hold(c, hold);
    cl_proc_t *psd[2] = {cl_psd_start_env(c, 0, READY_S, "PS_TEST_SLOW_APPLY", "5"), NULL};
    unsetenv("PS_TEST_SLOW_APPLY_HOLD");
    psd[1] = cl_psd_start(c, 1, NULL, READY_S);
    char nb[] = "40", bs[] = "8", plan[] = "plan:1@4/1", ord[] = "ab";
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nb, bs, plan, ord, NULL};
    cl_proc_t *w[2] = {cl_spawn(c, "replay0", argv), cl_spawn(c, "replay1", argv)};
    ck_assert_int_eq(cl_wait_log(psd[0], "the apply of step 4 waits while ", RUN_S), 0);
    char ckdir[CL_PATH];
    cl_proc_t *cp = checkpoint_spawn(c, "ckpt", 0, ckdir);
    /* Released once both shards are armed (it had 2 s, which a loaded host can miss). */
    int armed = cl_wait_log(psd[0], " armed: at step 5,", RUN_S) == 0 &&
                cl_wait_log(psd[1], " armed: at step 5,", RUN_S) == 0;
    ck_assert(unlink(hold) == 0);
    ck_assert_msg(armed, "not armed at step 5: %s | %s", cl_tail(psd[0]), cl_tail(psd[1]));
    EXPECT_EXIT(cp, 0);
    EXPECT_LOG(cp, "checkpoint at step 5 ");
    for (int i = 0; i < 2; i++) EXPECT_LOG(w[i], "at step 4");
    /* Rank 1 (whichever process joined second) died; the run itself ends with every batch
     * once (rank 0 checks). */
    int st[2] = {cl_wait(w[0], RUN_S), cl_wait(w[1], RUN_S)};
    ck_assert_msg(st[0] + st[1] == 128 + SIGKILL && (st[0] == 0 || st[1] == 0),
                  "the workers exited %d and %d: %s | %s", st[0], st[1], cl_tail(w[0]),
                  cl_tail(w[1]));
    EXPECT_LOG(w[st[0] == 0 ? 0 : 1], "every batch applied once on both tensors");
    restore_and_finish(c, psd, ckdir, argv);
}
END_TEST

/* bsp: a checkpoint taken while two workers train (nobody leaves), restored with new workers.
 * The checkpoint's coordinator state has its last step open (saved as that step's apply
 * began), so the restored coordinator took every member of it as possibly not applied
 * everywhere; none came back, and each removal handed its batch out again as a replay that
 * every chunk skipped: a step of batches spent for nothing and one more step than the job has.
 * The chunks' applied records (every part's) say both ranks' pushes of it were applied: the
 * job ends at its 20th step with no replay skipped. */
START_TEST(test_restore_clean_bsp_no_replays)
{
    asp_stop_t r; /* a plan for a step the job never reaches: no death, each step logged */
    replay_pair_start(&r, "bsp", 1000, NULL, NULL, NULL, "40", 150, "plan:1@1000/1");
    cl_cluster_t *c = r.c;
    for (int i = 0; i < 2; i++)
        ck_assert_msg(cl_wait_log(r.w[i], "at step 3", RUN_S) == 0, "%s", cl_tail(r.w[i]));
    char ckdir[CL_PATH];
    checkpoint_now(c, ckdir);
    for (int i = 0; i < 2; i++) {
        cl_signal(r.w[i], SIGKILL);
        cl_wait(r.w[i], RUN_S);
    }
    stop_all(r.psd, 2);
    cl_data_dirs_aside(c, "trained");
    cl_restore_start(c, c->manifest, 2, ckdir, r.psd, READY_S);
    EXPECT_LOG(r.psd[0], "with the pushes of 2 of its 2 members on every chunk");
    new_workers_finish(c, r.argv);
    coord_t co;
    coord_open(&co, c);
    for (uint32_t s = 0; s < 2; s++) {
        char *j = shard_status(&co, s);
        ck_assert_msg(j && jnum(j, "replays_skipped") == 0 && jnum(j, "step") == 20,
                      "shard %u: want step 20 and no replay skipped: %s", s, j ? j : "-");
        free(j);
    }
    coord_close(&co);
    stop_all(r.psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* The same under asp: rank 1 stops (SIGSTOP) after its push of replay.a of a batch, rank 0
 * before its pushes of a later one, and a checkpoint is asked for meanwhile. It waits for the
 * batches in flight (an asp checkpoint is a cut), i.e. until both are dropped after the
 * heartbeat timeout and their batches go back: replay.a has rank 1's batch, replay.b not, and
 * the coordinator's state has it to hand out again tagged. Restored, with new workers, it goes
 * out so: replay.a, whose record of each rank's last push came with it, skips it. Before, that
 * record stayed behind: "replay.a[...] is -2: batch ... applied twice". */
START_TEST(test_restore_asp_batch_part_pushed)
{
    asp_stop_t r;
    asp_stop_start(&r, 3000, "plan:1@2/1s,0@6/0s");
    /* Both stopped where they said (not inside a send). */
    ck_assert_msg(cl_wait_log(r.other, "stops at step 6", RUN_S) == 0, "rank 0 never stopped: %s",
                  cl_tail(r.other));
    char ckdir[CL_PATH];
    cl_proc_t *cp = checkpoint_now(r.c, ckdir);
    EXPECT_LOG(cp, "batches in flight to be applied");
    for (int p = 0; p < 2; p++) {
        cl_signal(r.w[p], SIGKILL);
        cl_signal(r.w[p], SIGCONT);
        cl_wait(r.w[p], RUN_S);
    }
    restore_and_finish(r.c, r.psd, ckdir, r.argv);
}
END_TEST

/* @p key's number in @p dir/shard-@p j/meta.json, or -1. */
static long long meta_num(const char *dir, int j, const char *key)
{
    char path[CL_PATH + 32], k[64];
    snprintf(path, sizeof path, "%s/shard-%d/meta.json", dir, j);
    snprintf(k, sizeof k, "\"%s\": ", key);
    char *meta = cl_read_file(path, NULL);
    const char *at = meta ? strstr(meta, k) : NULL;
    long long v = at ? strtoll(at + strlen(k), NULL, 10) : -1;
    free(meta);
    return v;
}

/* An asp checkpoint is a cut across shards: psctl arms shard 1 a second after shard 0
 * (PS_TEST_ARM_GAP_MS) while two workers train without a pause, and the shards' snapshots must
 * still hold the same batches. The coordinator holds every hand-out from the checkpoint's start
 * and answers "pending" until the batches in flight are applied everywhere; the hold ends after
 * the last shard is armed. Restored, with new workers, every batch is applied once on both
 * tensors. Before, each shard snapshot at once when armed and the workers went on in between:
 * shard 1's copy held batches the coordinator in shard 0's had not handed out yet, handed out
 * again after the restore: "replay.b[...] is -2: batch ... applied twice". */
START_TEST(test_restore_asp_checkpoint_is_cut)
{
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 8, .consistency = "asp",
                   .optimizer = "{name: sgd, lr: 1}",
                   .job_extra = "  heartbeat_timeout_ms: 3000\n"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    /* A plan for a rank that never joins: no death, and each batch logged with its step. */
    char nb[] = "4096", bs[] = "8", plan[] = "plan:63@0/0", ord[] = "ab";
    char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nb, bs, plan, ord, NULL};
    cl_proc_t *w[2] = {cl_spawn(c, "replay0", argv), cl_spawn(c, "replay1", argv)};
    ck_assert_msg(cl_wait_log(w[0], " at step 50\n", RUN_S) == 0, "no progress: %s",
                  cl_tail(w[0]));
    char ckdir[CL_PATH];
    cl_proc_t *cp = checkpoint_spawn(c, "ckpt", 1000, ckdir);
    EXPECT_EXIT(cp, 0);
    EXPECT_LOG(cp, "checkpoint at step ");
    long long at = meta_num(ckdir, 1, "step_max");
    ck_assert_msg(at > 0 && at < 4096, "the checkpoint should land mid-run, not at %lld", at);
    for (int i = 0; i < 2; i++) EXPECT_EXIT(w[i], 0); /* rank 0 checked every batch */
    restore_and_finish(c, psd, ckdir, argv);
}
END_TEST

/* An asp cluster of 2 shards (sgd, lr 1, heartbeat_timeout_ms @p hb_ms) with psd's periodic
 * checkpoints every second, shard 0 started with the test hook @p env = @p val, and two
 * replay_clients of 4096 batches with plan @p plan (tensors "ab") that nap 1 ms a batch, so the
 * run outlasts the first checkpoint. @c argv stays for new_workers_finish. */
static void asp_follow_start(asp_stop_t *r, int hb_ms, const char *env, const char *val,
                             const char *plan)
{
    asp_pair_start(r, hb_ms, "checkpoint: {every_s: 1, keep: 100}\n", env, val, "4096", 1, plan);
}

/* The same with psd's own periodic checkpoints (`checkpoint: {every_s: 1}`, its follower
 * asked again while batches are in flight) and a 300 ms gap between the arms: every
 * checkpoint taken mid-run restores to a run that applies every batch once. The workers nap
 * 1 ms a batch, so the run outlasts the first checkpoint. */
START_TEST(test_periodic_asp_checkpoints_are_cuts)
{
    asp_stop_t r;
    asp_follow_start(&r, 3000, "PS_TEST_ARM_GAP_MS", "300", "check");
    cl_cluster_t *c = r.c;
    cl_proc_t **psd = r.psd;
    for (int i = 0; i < 2; i++) EXPECT_EXIT(r.w[i], 0); /* each checked every batch */
    ck_assert_msg(cl_wait_log(psd[0], "job complete", RUN_S) == 0, "%s", cl_tail(psd[0]));
    nap_ms(500); /* a checkpoint begun at the end finishes */
    ck_assert_msg(count_in_log(psd[0], "failed; going on") == 0, "a checkpoint failed: %s",
                  cl_tail(psd[0]));
    /* The first checkpoint taken mid-run (the lowest step_max under 4096). */
    char base[CL_PATH], pick[CL_PATH] = "";
    cl_path(c, "checkpoints", base, sizeof base);
    DIR *d = opendir(base);
    ck_assert_msg(d != NULL, "no checkpoints in %s", base);
    long long best = 4096;
    int taken = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, "time-", 5) != 0) continue;
        char dir[CL_PATH];
        snprintf(dir, sizeof dir, "%.*s/%.60s", (int)(CL_PATH - 64), base, e->d_name);
        long long at = meta_num(dir, 1, "step_max");
        taken++;
        if (at > 0 && at < best) {
            best = at;
            snprintf(pick, sizeof pick, "%s", dir);
        }
    }
    closedir(d);
    ck_assert_msg(pick[0], "none of the %d checkpoints was taken mid-run", taken);
    restore_and_finish(c, psd, pick, r.argv);
}
END_TEST

/* Under asp, `every_steps` counts planned steps of samples applied (job.workers x batch_size
 * each). Before, it counted the coordinator's open_step, the fastest worker's steps ever: a
 * worker that replaced one killed at its 130th batch started from 0, and no periodic
 * checkpoint came until it had passed 130 steps itself. Here the replacement stops at its
 * 70th batch, past the multiple 150 of the job's samples. Also: asp checkpoint directories
 * were named by the second (time-<s>), so a second checkpoint within it failed. */
START_TEST(test_asp_every_steps_after_death)
{
    cl_conf_t k = {.shards = 1, .workers = 1, .consistency = "asp", .layers = "[784, 16, 10]",
                   .job_extra = "  heartbeat_timeout_ms: 1000\n",
                   .top_extra = "checkpoint: {every_steps: 50, keep: 10}\n"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    const char *held = "checkpoint: no batch handed out until it is taken";
    setenv("PS_TEST_STOP_AT", "batch:130", 1);
    cl_proc_t *a = cl_worker_start(c, NULL, NULL, false);
    unsetenv("PS_TEST_STOP_AT");
    ck_assert_msg(cl_wait_log(a, "stops at its batch:130", RUN_S) == 0, "%s", cl_tail(a));
    ck_assert_int_eq(cl_signal(a, SIGKILL), 0);
    /* A checkpoint past step 100 (each holds the hand-outs first): the next multiple is 150. */
    long last = -1;
    while (last < 100 && cl_left(c) > 10) {
        nap_ms(50);
        char *log = cl_log(psd);
        for (const char *q = log; (q = strstr(q, "psctl: checkpoint at step ")) != NULL; q++)
            last = atol(q + strlen("psctl: checkpoint at step "));
        free(log);
    }
    ck_assert_msg(last >= 100 && last < 150, "the last checkpoint at step %ld: %s", last,
                  cl_tail(psd));
    int n0 = count_in_log(psd, held);
    setenv("PS_TEST_STOP_AT", "batch:70", 1);
    cl_proc_t *b = cl_worker_start(c, NULL, NULL, false);
    unsetenv("PS_TEST_STOP_AT");
    ck_assert_msg(cl_wait_log(b, "stops at its batch:70", RUN_S) == 0, "%s", cl_tail(b));
    while (count_in_log(psd, held) == n0 && cl_left(c) > 10) nap_ms(50);
    ck_assert_msg(count_in_log(psd, held) > n0, "no checkpoint asked for after 198 planned "
                  "steps of samples (129 + 69): %s", cl_tail(psd));
    /* None failed: two in one second were named alike (time-<s>), and the second failed. */
    ck_assert_msg(count_in_log(psd, "failed; going on") == 0, "a checkpoint failed: %s",
                  cl_tail(psd));
    ck_assert_int_eq(cl_signal(b, SIGKILL), 0);
    cl_cluster_destroy(c);
}
END_TEST

/* asp_pair_start's pair of 4096 batches checked ("check", 1 ms naps), shard 0 with test hook
 * @p env = @p val (none when NULL), once 400 samples are applied: a job mid-run. */
static void asp_pair_running(asp_stop_t *r, const char *env, const char *val)
{
    asp_pair_start(r, 3000, NULL, env, val, "4096", 1, "check");
    coord_t co;
    coord_open(&co, r->c);
    ck_assert_int_ge(wait_num(&co, "samples_applied", 400, 0, RUN_S), 400);
    coord_close(&co);
}

/* Two asp checkpoints at once share the coordinator's hold: psctl B arms shard 1 two seconds
 * after shard 0, and psctl A, started meanwhile, ends (armed or refused as busy) and sends its
 * GO first. The hold must last until B's GO too, so B's checkpoint is still a cut: restored,
 * every batch once. Before, A's GO ended the hold and the workers went on during B's gap:
 * "replay.b[...] is -2: batch ... applied twice". */
START_TEST(test_asp_checkpoints_at_once)
{
    asp_stop_t r;
    asp_pair_running(&r, NULL, NULL);
    char dir_b[CL_PATH], dir_a[CL_PATH];
    cl_proc_t *b = checkpoint_spawn(r.c, "ckpt-b", 2000, dir_b);
    nap_ms(700);
    cl_proc_t *a = checkpoint_spawn(r.c, "ckpt-a", 0, dir_a);
    cl_wait(a, RUN_S); /* armed, or refused: shard 0 was busy with B's */
    EXPECT_EXIT(b, 0);
    long long at = meta_num(dir_b, 1, "step_max");
    ck_assert_msg(at > 0 && at < 4096, "the checkpoint should land mid-run, not at %lld", at);
    for (int i = 0; i < 2; i++) EXPECT_EXIT(r.w[i], 0); /* each checked every batch */
    restore_and_finish(r.c, r.psd, dir_b, r.argv);
}
END_TEST

/* Two checkpoints at once under bsp, each waited for (exit 0), and every batch applied once by
 * the replay_clients. TWO_GAP: psctl B arms shard 1 two seconds after shard 0, and psctl A,
 * started 0.3 s after B's first arm, takes its checkpoint or is refused as busy, and sends its
 * GO first; the hold of B's step must last until B's GO, so that no chunk passes it before B
 * armed its shard (before session 50, any GO ended a bsp hold: "ckpt-b exited with status 1
 * ... shard 1 is already past step 7 (at 80)"). TWO_SLOW0: shard 0 still copies B's
 * (PS_TEST_SLOW_COPY_MS 2 s) when A asks, refuses A's arm as busy, and A waits for it and
 * takes its own (before: exit 1, "a checkpoint into ... is in progress here"; a helper's probe:
 * hand checkpoints beside psd's `every_steps: 40` failed 4 times in 15). TWO_SLOW1: the same
 * on shard 1 only, once shard 0 is done with B's, so that A's arm of shard 0 was taken: it is
 * cancelled, and A asks again (a review: before, exit 1 there). */
enum { TWO_GAP, TWO_SLOW0, TWO_SLOW1 };
static void two_checkpoints(int mode)
{
    asp_stop_t r;
    const char *env = mode == TWO_SLOW0 ? "PS_TEST_SLOW_COPY_MS"
                      : mode == TWO_SLOW1 ? "1:PS_TEST_SLOW_COPY_MS" : NULL;
    replay_pair_start(&r, "bsp", 2000, NULL, env, "2000", "160", 20, "check");
    coord_t co;
    coord_open(&co, r.c);
    ck_assert_int_ge(wait_num(&co, "samples_applied", 80, 0, RUN_S), 80);
    coord_close(&co);
    char dir_b[CL_PATH], dir_a[CL_PATH];
    cl_proc_t *b = checkpoint_spawn(r.c, "ckpt-b", mode == TWO_GAP ? 2000 : 0, dir_b);
    const char *wait = mode == TWO_SLOW1 ? " chunks, " : "armed: at step";
    ck_assert_msg(cl_wait_log(r.psd[0], wait, RUN_S) == 0, "shard 0 never logged '%s': %s", wait,
                  cl_tail(r.psd[0]));
    if (mode != TWO_SLOW1) nap_ms(300);
    cl_proc_t *a = checkpoint_spawn(r.c, "ckpt-a", 0, dir_a);
    EXPECT_EXIT(b, 0);
    EXPECT_EXIT(a, 0);
    if (mode != TWO_GAP) EXPECT_LOG(a, "is in progress here: waiting for it to end");
    for (int i = 0; i < 2; i++) EXPECT_EXIT(r.w[i], 0); /* each checked every batch */
    stop_all(r.psd, 2);
    cl_cluster_destroy(r.c);
}

START_TEST(test_bsp_checkpoints_share_hold) { two_checkpoints(TWO_GAP); }
END_TEST

START_TEST(test_checkpoint_waits_for_busy_shard) { two_checkpoints(TWO_SLOW0); }
END_TEST

START_TEST(test_checkpoint_waits_for_busy_shard1) { two_checkpoints(TWO_SLOW1); }
END_TEST

/* Whether shard 0's status says its checkpoint hold is on. */
static bool hold_on(coord_t *co)
{
    char *j = coord_status(co);
    ck_assert_msg(j && strstr(j, "\"checkpoint_hold\": "), "no checkpoint_hold in %s", j);
    bool on = strstr(j, "\"checkpoint_hold\": true") != NULL;
    free(j);
    return on;
}

/* A bsp pair of replay workers (@p env=@p val for psd, or NULL) 80 samples into its job, and
 * psctl checkpoint "ckpt-a" into @p dir_a[CL_PATH] (PS_TEST_ARM_GAP_MS @p gap_ms between its
 * arms) once shard 0 is armed by it: its hold is on. */
static cl_proc_t *bsp_checkpoint_arming(asp_stop_t *r, const char *env, const char *val,
                                        int gap_ms, char *dir_a)
{
    replay_pair_start(r, "bsp", 2000, NULL, env, val, "160", 20, "check");
    coord_t co;
    coord_open(&co, r->c);
    ck_assert_int_ge(wait_num(&co, "samples_applied", 80, 0, RUN_S), 80);
    coord_close(&co);
    cl_proc_t *a = checkpoint_spawn(r->c, "ckpt-a", gap_ms, dir_a);
    ck_assert_msg(cl_wait_log(r->psd[0], "armed: at step", RUN_S) == 0, "shard 0 not armed: %s",
                  cl_tail(r->psd[0]));
    return a;
}

/* bsp: a psctl stopped (SIGSTOP: its connection stays) after its BEGIN stays a user of the hold
 * until its own lapse (3 s here, PS_TEST_CKPT_HOLD_MS), though another checkpoint's BEGIN and
 * GO came meanwhile; the hold then ends at that lapse. Before (a review), it lasted until the
 * global lapse, counted from the later BEGIN: "checkpoint hold of step ... not released within
 * 3000 ms". */
START_TEST(test_bsp_checkpoint_hold_ends_with_dead_user)
{
    asp_stop_t r;
    char dir_b[CL_PATH], dir_a[CL_PATH];
    cl_proc_t *a = bsp_checkpoint_arming(&r, "PS_TEST_CKPT_HOLD_MS", "3000", 8000, dir_a);
    ck_assert_int_eq(cl_signal(a, SIGSTOP), 0);
    nap_ms(1000);
    cl_proc_t *b = checkpoint_spawn(r.c, "ckpt-b", 0, dir_b);
    EXPECT_EXIT(b, 0);
    ck_assert_msg(cl_wait_log(r.psd[0], "no checkpoint uses it any more: releasing it", RUN_S) == 0,
                  "the hold did not end with its last user's lapse: %s", cl_tail(r.psd[0]));
    for (int i = 0; i < 2; i++) EXPECT_EXIT(r.w[i], 0);
    ck_assert_int_eq(cl_signal(a, SIGKILL), 0);
    cl_wait(a, RUN_S);
    ck_assert_msg(count_in_log(r.psd[0], "not released within") == 0,
                  "the hold lasted to its own lapse: %s", cl_tail(r.psd[0]));
    stop_all(r.psd, 2);
    cl_cluster_destroy(r.c);
}
END_TEST

/* bsp: a psctl killed after its BEGIN (while it arms the shards): its connection to shard 0
 * closes, and the hold it used ends then, not at its lapse (CKPT_HOLD_MS, 10 s, left as it is
 * here). Before, the job stood until that lapse: "checkpoint hold of step N not released within
 * 10000 ms" (session 50's soak: a 10.4 s step). The next checkpoint works. */
START_TEST(test_bsp_checkpoint_hold_ends_with_killed_psctl)
{
    asp_stop_t r;
    char dir_b[CL_PATH], dir_a[CL_PATH];
    cl_proc_t *a = bsp_checkpoint_arming(&r, NULL, NULL, 8000, dir_a);
    coord_t co;
    coord_open(&co, r.c);
    ck_assert(hold_on(&co));
    ck_assert_int_eq(cl_signal(a, SIGKILL), 0);
    cl_wait(a, RUN_S);
    ck_assert_msg(cl_wait_log(r.psd[0], "the psctl that asked for it is gone", RUN_S) == 0,
                  "the hold did not end with its psctl: %s", cl_tail(r.psd[0]));
    ck_assert_msg(!hold_on(&co), "the hold outlived its psctl");
    ck_assert_int_eq(coord_num(&co, "checkpoint_hold_users"), 0);
    coord_close(&co);
    cl_proc_t *b = checkpoint_spawn(r.c, "ckpt-b", 0, dir_b);
    EXPECT_EXIT(b, 0);
    for (int i = 0; i < 2; i++) EXPECT_EXIT(r.w[i], 0);
    ck_assert_msg(!count_in_log(r.psd[0], "not released within") &&
                      !count_in_log(r.psd[0], "no GO within"),
                  "the hold lasted to its lapse: %s", cl_tail(r.psd[0]));
    stop_all(r.psd, 2);
    cl_cluster_destroy(r.c);
}
END_TEST

/* bsp: shard 0 starts its transport again while a live psctl arms the shards (a local peer died
 * in the middle of a send, as in faults:peer_killed_mid_send), closing psctl's connection
 * itself: the psctl is not gone, and its checkpoint keeps the hold until its GO. A first version
 * of the hold's end with its psctl's connection released it here: "shard 1 is already past
 * step 7" (a review, 3 runs of 3). */
START_TEST(test_bsp_checkpoint_survives_transport_restart)
{
    asp_stop_t r;
    char dir_a[CL_PATH];
    cl_proc_t *a = bsp_checkpoint_arming(&r, NULL, NULL, 3000, dir_a);
    char *argv[] = {(char *)cl_binary("EVIL_PEER"), "--manifest", r.c->manifest,
                    "--die-mid-send", NULL};
    cl_wait(cl_spawn(r.c, "evil_peer", argv), RUN_S);
    ck_assert_msg(cl_wait_log(r.psd[0], "transport started again", RUN_S) == 0,
                  "shard 0's transport did not start again: %s", cl_tail(r.psd[0]));
    EXPECT_EXIT(a, 0);
    for (int i = 0; i < 2; i++) EXPECT_EXIT(r.w[i], 0);
    ck_assert_msg(count_in_log(r.psd[0], "the psctl that asked for it is gone") == 0,
                  "a live psctl's hold was ended: %s", cl_tail(r.psd[0]));
    stop_all(r.psd, 2);
    cl_cluster_destroy(r.c);
}
END_TEST

/* One checkpoint ask of shard 0 for checkpoint @p id (@p type MSG_CKPT_BEGIN or MSG_CKPT_GO):
 * the reply's flags. */
static uint32_t ckpt_ask(coord_t *co, ps_msg_type_t type, uint64_t id)
{
    ps_msg_t q = {.type = type, .rank = -1, .count = id}, r;
    char err[512];
    ck_assert_msg(ps_req_call(co->ctl, 0, &q, &r, NULL, NULL, err, sizeof err) == 0, "%s: %s",
                  ps_msg_type_name(type), err);
    return r.flags;
}

/* A checkpoint asked for again after its drained answer (as psctl does when that answer was
 * lost) is still one user of the hold: its GO ends the hold, and hears that the hold lasted for
 * it. Before, each drained answer counted one more user, so the hold outlived the GO (up to
 * 10 s, or for good while psd's follower asked every second). */
START_TEST(test_asp_checkpoint_asked_again_one_user)
{
    asp_stop_t r;
    asp_pair_running(&r, NULL, NULL);
    coord_t co;
    coord_open(&co, r.c);
    const uint64_t id = 0x5eed5eed5eedULL;
    uint32_t f = PS_FLAG_PENDING;
    for (int i = 0; i < 500 && (f & PS_FLAG_PENDING); i++, nap_ms(f & PS_FLAG_PENDING ? 20 : 0))
        f = ckpt_ask(&co, PS_MSG_CKPT_BEGIN, id);
    ck_assert_msg(!(f & PS_FLAG_PENDING), "the batches in flight never drained");
    ckpt_ask(&co, PS_MSG_CKPT_BEGIN, id); /* again: the first answer "was lost" */
    ck_assert(hold_on(&co));
    long long applied = coord_num(&co, "samples_applied");
    nap_ms(300); /* held: nothing more is handed out, so nothing more is applied */
    ck_assert_int_eq(coord_num(&co, "samples_applied"), applied);
    f = ckpt_ask(&co, PS_MSG_CKPT_GO, id);
    ck_assert_msg(!hold_on(&co), "the hold outlived the checkpoint's GO");
    ck_assert_msg(f & PS_FLAG_DONE, "the GO did not hear that the hold lasted for it");
    ck_assert_int_eq(coord_num(&co, "checkpoint_hold_users"), 0);
    /* A GO with no hold left is told so (its copies would be no cut). */
    ck_assert_int_eq(ckpt_ask(&co, PS_MSG_CKPT_GO, id) & PS_FLAG_DONE, 0);
    coord_close(&co);
    for (int i = 0; i < 2; i++) EXPECT_EXIT(r.w[i], 0); /* each checked every batch */
    stop_all(r.psd, 2);
    cl_cluster_destroy(r.c);
}
END_TEST

/* The hold lapses while psctl arms the shards (here: shard 0 ends holds after 300 ms,
 * PS_TEST_CKPT_HOLD_MS, and psctl pauses 1.5 s between two arms): batches went out between
 * the two shards' snapshots, so psctl must not keep them as a checkpoint. Before, it did
 * (exit 0), and a restore from it applied some batches twice or never. */
START_TEST(test_asp_checkpoint_hold_lapsed_refused)
{
    asp_stop_t r;
    asp_pair_running(&r, "PS_TEST_CKPT_HOLD_MS", "300");
    char ckdir[CL_PATH];
    cl_proc_t *cp = checkpoint_spawn(r.c, "ckpt", 1500, ckdir);
    EXPECT_EXIT(cp, 1);
    EXPECT_LOG(cp, "hold of the hand-outs lapsed before every shard was armed");
    EXPECT_LOG(cp, "removed the inconsistent checkpoint");
    ck_assert_msg(access(ckdir, F_OK) != 0, "%s is still there", ckdir);
    EXPECT_LOG(r.psd[0], "no GO within 300 ms of its last ask");
    for (int i = 0; i < 2; i++) EXPECT_EXIT(r.w[i], 0); /* the job went on: every batch once */
    stop_all(r.psd, 2);
    cl_cluster_destroy(r.c);
}
END_TEST

/* asp: as bsp_checkpoint_hold_ends_with_killed_psctl, a psctl killed while it arms the shards
 * (after its drained answer): the hand-outs go on when its connection closes, not CKPT_HOLD_MS
 * after its last ask; the job ends with every batch once (the workers check). */
START_TEST(test_asp_checkpoint_hold_ends_with_killed_psctl)
{
    asp_stop_t r;
    asp_pair_running(&r, NULL, NULL);
    char ckdir[CL_PATH];
    cl_proc_t *cp = checkpoint_spawn(r.c, "ckpt", 8000, ckdir);
    ck_assert_msg(cl_wait_log(r.psd[0], "armed: now", RUN_S) == 0, "shard 0 not armed: %s",
                  cl_tail(r.psd[0]));
    ck_assert_int_eq(cl_signal(cp, SIGKILL), 0);
    cl_wait(cp, RUN_S);
    ck_assert_msg(cl_wait_log(r.psd[0], "the psctl that asked for it is gone", RUN_S) == 0,
                  "the hold did not end with its psctl: %s", cl_tail(r.psd[0]));
    for (int i = 0; i < 2; i++) EXPECT_EXIT(r.w[i], 0);
    ck_assert_msg(!count_in_log(r.psd[0], "not released or asked for again") &&
                      !count_in_log(r.psd[0], "no GO within"),
                  "the hold lasted to its lapse: %s", cl_tail(r.psd[0]));
    stop_all(r.psd, 2);
    cl_cluster_destroy(r.c);
}
END_TEST

/* The highest "at step N" in @p p's log (replay_client's plan mode logs each batch so). */
static long long last_step(cl_proc_t *p)
{
    char *log = cl_log(p);
    long long best = -1;
    for (const char *at = log; at && (at = strstr(at, " at step ")) != NULL; at += 9) {
        long long v = strtoll(at + 9, NULL, 10);
        if (v > best) best = v;
    }
    free(log);
    return best;
}

/* A worker that stops holding a batch (SIGSTOP, well within its heartbeat timeout) would hold
 * an asp job for as long as psd's follower waits for the batches in flight: past its limit
 * (checkpoint.drain_s: 30 s by default, 2 s here) the checkpoint is skipped and the hold
 * released, so the other worker goes on; continued, the stopped one finishes, every batch
 * applied once. */
START_TEST(test_periodic_asp_checkpoint_skipped_when_stuck)
{
    asp_stop_t r;
    asp_pair_start(&r, 60000, "checkpoint: {every_s: 1, keep: 100, drain_s: 2}\n", NULL, NULL,
                   "4096", 1, "plan:1@2/0s");
    cl_proc_t **psd = r.psd, **w = r.w;
    int i = which_stopped(w, "stops at step 2");
    cl_proc_t *stopped = w[i], *other = w[1 - i];
    coord_t co; /* the hold shows in the status while the follower waits */
    coord_open(&co, r.c);
    char *j = NULL;
    for (double end = now_s() + RUN_S; now_s() < end; nap_ms(20)) {
        free(j);
        j = coord_status(&co);
        if (j && strstr(j, "\"checkpoint_hold\": true")) break;
    }
    ck_assert_msg(j && strstr(j, "\"checkpoint_hold\": true"), "no hold seen: %s", j ? j : "-");
    free(j);
    coord_close(&co);
    ck_assert_msg(cl_wait_log(psd[0], "checkpoint skipped: 1 batches still in flight", RUN_S) == 0,
                  "%s", cl_tail(psd[0]));
    long long at = last_step(other);
    char want[64];
    snprintf(want, sizeof want, " at step %lld\n", at + 50);
    ck_assert_msg(cl_wait_log(other, want, RUN_S) == 0, "rank 0 stayed at step %lld: %s", at,
                  cl_tail(other));
    ck_assert_int_eq(cl_signal(stopped, SIGCONT), 0);
    for (int p = 0; p < 2; p++) EXPECT_EXIT(w[p], 0); /* rank 0 checked every batch */
    stop_all(psd, 2);
    cl_cluster_destroy(r.c);
}
END_TEST

/* ---- SIGSTOP -------------------------------------------------------------------------- */

/* Once both workers are members and @p co's open step reaches 30 (returned), worker @p w is
 * SIGSTOPped; returns when shard 0 @p psd0 dropped it: for its missed heartbeats ("dropping
 * it"), or, when psd restarted its transport meanwhile (a loaded host), for a connection that
 * closed and did not come back: either way coord logs the removal as "(pid P) left at step".
 * Before, a worker that joined late (a helper delayed its start 1.5 s: the 500 ms start wait
 * had gone) was stopped before it was a member, and "left at step" matched the other's leave
 * at the end of the job. */
static long long stopped_and_dropped(coord_t *co, cl_proc_t *psd0, cl_proc_t *w)
{
    ck_assert_int_eq(wait_num(co, "actual_workers", 2, 1, RUN_S), 2);
    long long at = wait_num(co, "open_step", 30, 0, RUN_S);
    ck_assert_int_eq(cl_signal(w, SIGSTOP), 0);
    char left[48];
    snprintf(left, sizeof left, "(pid %d) left at step", (int)w->pid);
    ck_assert_msg(cl_wait_log(psd0, left, RUN_S) == 0,
                  "shard 0 never dropped the stopped worker: %s", cl_tail(psd0));
    return at;
}

/* A stopped worker is dropped after the heartbeat timeout and the other carries on alone; on
 * SIGCONT it learns it was removed and joins again as a new member; the run completes with
 * every sample of every pass applied once. Stopped past its own silence limit (2 s here), it
 * knows it was the one stopped: it blamed every shard before ("answered nothing for", when its
 * heartbeat tick came before the shards' closes). The one stopped holds rank 0: every pass is
 * evaluated once, by the lowest rank at its end (session 62: one that joined again in a later
 * pass evaluated the pass it had been in a second time). */
START_TEST(test_sigstop_rejoins)
{
    /* 4 passes of 24000 samples: the other worker alone takes ~6 s for them here (~900 steps/s),
     * well past the stop (~3.5 s). With 12000 (3000 steps) it finished the job before the
     * SIGCONT once (the full suite, session 65: "pass 4 evaluated 2 times", by it and by the
     * stopped one, which joined again as rank 0 into the finished job). */
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 16, .epochs = 4,
                   .job_extra = "  heartbeat_timeout_ms: 500\n  train_samples: 24000\n",
                   .start_wait_ms = CL_TOGETHER_MS};
    cl_proc_t *psd[2], *w[2];
    coord_t co;
    /* Pulls over the transport: a worker stopped in a direct read of a shard's store holds its
     * LMDB snapshot, and at this model's step rate the 256 MB map filled in the 3 s stop (the
     * other worker failed "the shard store is full": 2 runs in ~60; DESIGN-NOTES). The update
     * waits for it since session 60 (stopped_direct_reader_waits); this test is about the
     * heartbeats. */
    setenv("PS_DIRECT_PULL", "0", 1);
    cl_cluster_t *c = start_2x2(&k, psd, w, &co);
    unsetenv("PS_DIRECT_PULL");
    int zero = -1; /* w[1] becomes the worker of rank 0 */
    for (int t = 0; t < 600 && zero < 0; t++) {
        for (int i = 0; i < 2 && zero < 0; i++) {
            char *l = cl_log(w[i]);
            if (strstr(l, "psworker: rank 0 joined at step")) zero = i;
            free(l);
        }
        if (zero < 0) usleep(50 * 1000);
    }
    ck_assert_msg(zero >= 0, "no worker joined as rank 0");
    if (zero == 0) {
        cl_proc_t *x = w[0];
        w[0] = w[1];
        w[1] = x;
    }
    long long at = stopped_and_dropped(&co, psd[0], w[1]);
    ck_assert_msg(at >= 30 && at < 700, "the stop should land mid-run, not at step %lld", at);
    ck_assert_int_eq(wait_num(&co, "actual_workers", 1, 1, RUN_S), 1);
    long long s0 = coord_num(&co, "open_step");
    ck_assert_int_gt(wait_num(&co, "open_step", s0 + 20, 0, RUN_S), s0 + 19); /* goes on alone */
    /* Past the stopped worker's silence limit (a loop: a signal may cut a usleep short). */
    for (double end = now_s() + 2.5; now_s() < end;) usleep(50 * 1000);
    ck_assert_int_eq(cl_signal(w[1], SIGCONT), 0);
    EXPECT_EXIT(w[0], 0);
    EXPECT_EXIT(w[1], 0);
    EXPECT_LOG(w[1], "was removed from the job; joining again");
    /* Not its "heartbeat thread did not run" line: on SIGCONT the shards' closes may come
     * first (libuv runs I/O before timers), and it learns it was removed and drops that
     * client before a tick (1 run in 10). */
    ck_assert_msg(count_in_log(w[1], "answered nothing for") == 0,
                  "the stopped worker blamed its shards: %s", cl_tail(w[1]));
    ck_assert_int_ge(count_in_log(w[1], "joined at step"), 2);
    for (int pass = 1; pass <= 4; pass++) {
        char done[32];
        snprintf(done, sizeof done, "epoch %d done", pass);
        int n = count_in_log(w[0], done) + count_in_log(w[1], done);
        ck_assert_msg(n == 1, "pass %d evaluated %d times: %s | %s", pass, n, cl_tail(w[0]),
                      cl_tail(w[1]));
    }
    char *j = coord_status(&co);
    ck_assert_msg(j && strstr(j, "\"finished\": true"), "job not finished: %s", j ? j : "-");
    expect_passes(j, 24000, 4);
    free(j);
    coord_close(&co);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* The end of cl_stopped_reader_start's tests: both workers exit 0 (the other never saw the
 * store full), the job finished with both passes of 12000 samples applied once; then shard
 * @p psd stops and @p c goes. */
static void stopped_reader_finish(cl_cluster_t *c, cl_proc_t *psd, cl_proc_t *w[2])
{
    EXPECT_EXIT(w[0], 0);
    EXPECT_EXIT(w[1], 0);
    ck_assert_msg(count_in_log(w[0], "store is full") == 0, "%s", cl_tail(w[0]));
    coord_t co;
    coord_open(&co, c);
    char *j = coord_status(&co);
    ck_assert_msg(j && strstr(j, "\"finished\": true"), "job not finished: %s", j ? j : "-");
    expect_passes(j, 12000, 2);
    free(j);
    coord_close(&co);
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}

/* A worker stopped inside a direct read of the shard's store (PS_TEST_DIRECT_STOP: its 300th
 * read raises SIGSTOP there) holds its LMDB snapshot, so the pages written since cannot be
 * reused: the other worker goes on alone, and the 16 MB map fills within some steps. psd does
 * not fail the update: it says who holds the snapshot and tries again at each cron tick; on
 * SIGCONT the read ends, the update commits, and the job completes with every sample applied
 * once. Before, the other worker's push failed "the shard store is full" and it exited 1
 * (DESIGN-NOTES, Direct pulls; session 59 turned direct pulls off in sigstop_rejoins for it). */
START_TEST(test_stopped_direct_reader_waits)
{
    cl_proc_t *psd, *w[2];
    cl_cluster_t *c = cl_stopped_reader_start(false, &psd, w);
    ck_assert_msg(cl_wait_log(w[1], "stops inside direct read 300", RUN_S) == 0,
                  "the worker never stopped in a read: %s", cl_tail(w[1]));
    char held[64];
    snprintf(held, sizeof held, "pid %d's", (int)w[1]->pid);
    ck_assert_msg(cl_wait_log(psd, "updates wait for it", RUN_S) == 0,
                  "the store never filled, or the update failed: %s", cl_tail(psd));
    EXPECT_LOG(psd, held);
    ck_assert_msg(cl_wait(w[0], 1.0) == -1, "the other worker ended while the update waited: %s",
                  cl_tail(w[0]));
    ck_assert_int_eq(cl_signal(w[1], SIGCONT), 0);
    ck_assert_msg(cl_wait_log(psd, "the store takes updates again", RUN_S) == 0,
                  "the update never went through: %s", cl_tail(psd));
    stopped_reader_finish(c, psd, w);
}
END_TEST

/* The same wait, and psd stopped meanwhile (SIGTERM, as for a restart): it exits 0 at once and
 * leaves the waiting updates for its next start, as a partial step (their pushes are sent
 * again); started again, it waits for the same holder; on SIGCONT the job completes with every
 * sample applied once. Before the mend (a probe, session 60), the stop failed the waiting
 * updates and the other worker exited 1 with "the shard store is full". */
START_TEST(test_stopped_direct_reader_psd_restarted)
{
    cl_proc_t *psd, *w[2];
    cl_cluster_t *c = cl_stopped_reader_start(false, &psd, w);
    ck_assert_msg(cl_wait_log(psd, "updates wait for it", RUN_S) == 0, "%s", cl_tail(psd));
    ck_assert_int_eq(cl_signal(psd, SIGTERM), 0);
    ck_assert_msg(cl_wait(psd, 10.0) == 0, "psd did not stop: %s", cl_tail(psd));
    EXPECT_LOG(psd, "left for the next start");
    psd = cl_psd_start(c, 0, NULL, READY_S);
    ck_assert_msg(cl_wait_log(psd, "updates wait for it", RUN_S) == 0, "%s", cl_tail(psd));
    ck_assert_int_eq(cl_signal(w[1], SIGCONT), 0);
    ck_assert_msg(cl_wait_log(psd, "the store takes updates again", RUN_S) == 0, "%s",
                  cl_tail(psd));
    stopped_reader_finish(c, psd, w);
}
END_TEST

/* A worker dropped while stopped whose join again is refused (its manifest now names another
 * cluster: edited meanwhile) exits 2, as a first join refused so does, and pslaunch does not
 * start it again; before, 1 ("a refused rejoin exits 1", the probe of session 41). */
START_TEST(test_sigstop_rejoin_refused_exits_2)
{
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 16, .epochs = 4,
                   .job_extra = "  heartbeat_timeout_ms: 500\n  train_samples: 12000\n",
                   .start_wait_ms = CL_TOGETHER_MS};
    cl_proc_t *psd[2], *w[2];
    coord_t co;
    cl_cluster_t *c = start_2x2(&k, psd, w, &co);
    stopped_and_dropped(&co, psd[0], w[1]);
    char other[CL_PATH];
    cl_manifest_other_cluster(c, other);
    ck_assert_int_eq(rename(other, c->manifest), 0);
    ck_assert_int_eq(cl_signal(w[1], SIGCONT), 0);
    EXPECT_EXIT(w[1], 2);
    EXPECT_LOG(w[1], "was removed from the job; joining again");
    EXPECT_EXIT(w[0], 0);
    coord_close(&co);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* A request connection left idle for longer than its timeout still gets answers (its loop's
 * clock stood still meanwhile: every call used to time out at once after such a spell). */
START_TEST(test_status_after_idle)
{
    cl_conf_t k = {.shards = 1, .workers = 1};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    ps_manifest_t m;
    char err[1024];
    ck_assert_msg(ps_manifest_load(&m, c->manifest, err, sizeof err) == 0, "%s", err);
    ps_req_t *ctl;
    ck_assert_msg(ps_req_open(&m, 1.0, &ctl, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < 2; i++) {
        if (i) sleep(2); /* idle: twice the timeout */
        ps_msg_t req = {.type = PS_MSG_STATUS, .rank = -1}, rep;
        void *data = NULL;
        size_t len = 0;
        int rc = ps_req_call(ctl, 0, &req, &rep, &data, &len, err, sizeof err);
        free(data);
        ck_assert_msg(rc == 0, "status call %d: %s", i, err);
    }
    ps_req_close(ctl);
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* asp with job.max_steps, which caps each worker's steps: once both workers did theirs, the job
 * is complete (status "finished": true), so that pslaunch --follow starts no replacements, and
 * a worker that joins afterwards is told so and trains nothing. Before, it stayed unfinished:
 * every new worker got max_steps more. */
START_TEST(test_asp_max_steps_finishes)
{
    cl_conf_t k = {.shards = 1, .workers = 2, .consistency = "asp", .max_steps = 30};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    cl_proc_t *w[2] = {cl_worker_start(c, NULL, NULL, false), cl_worker_start(c, NULL, NULL,
                                                                              false)};
    for (int i = 0; i < 2; i++) EXPECT_EXIT(w[i], 0);
    /* Each worker leaves once it did its steps: the first may be gone when the second ends
     * (CI, session 64: "its 1 member"). */
    EXPECT_LOG(psd, " did its 30 steps (job.max_steps counts per worker under asp;");
    coord_t co;
    coord_open(&co, c);
    char *st = coord_status(&co);
    ck_assert_msg(st && strstr(st, "\"finished\": true"), "status: %s", st ? st : "(none)");
    free(st);
    cl_proc_t *late = cl_worker_start(c, NULL, NULL, false);
    EXPECT_EXIT(late, 0);
    EXPECT_LOG(late, "after 0 steps");
    coord_close(&co);
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* asp, job.max_steps 60, one shard and two workers (heartbeat timeout 60 s): worker 1 stopped
 * (SIGSTOP) once both are members, worker 0 done with its 60 steps and gone. @p co is open. */
static cl_cluster_t *asp_capped_start(cl_proc_t **psd, cl_proc_t *w[2], coord_t *co)
{
    cl_conf_t k = {.shards = 1, .workers = 2, .consistency = "asp", .max_steps = 60,
                   .layers = "[784, 64, 10]", .job_extra = "  heartbeat_timeout_ms: 60000\n"};
    cl_cluster_t *c = cl_cluster_create(&k);
    *psd = cl_psd_start(c, 0, NULL, READY_S);
    /* A worker stopped inside a pull pins the store's pages (its direct read's snapshot, or
     * the pull reply's until its send ends: DESIGN-NOTES, Known limits), so the store grows
     * by the model each step until it is dropped: 60 steps of a 0.2 MB model fit a 64 MiB map
     * (with the default 0.94 MB one the map filled at step 36 in one run of 4; the tests' maps
     * are 256 MiB since). */
    w[0] = cl_worker_start(c, NULL, NULL, false);
    w[1] = cl_worker_start(c, NULL, NULL, false);
    coord_open(co, c);
    ck_assert_int_ge(wait_num(co, "actual_workers", 2, 1, RUN_S), 2);
    ck_assert_int_eq(cl_signal(w[1], SIGSTOP), 0);
    EXPECT_EXIT(w[0], 0);
    EXPECT_LOG(w[0], "after 60 steps");
    return c;
}

/* The same, but one worker hangs (SIGSTOP, within its heartbeat timeout) while the other does
 * its steps and leaves, and is then killed. Once one did its steps no start is granted (a
 * replacement would do as many again), so with no member left the job is complete. Before, it
 * waited for good with no worker ("finished": false, pslaunch --follow idle). */
START_TEST(test_asp_max_steps_member_died_finishes)
{
    cl_proc_t *psd, *w[2];
    coord_t co;
    cl_cluster_t *c = asp_capped_start(&psd, w, &co);
    ck_assert_int_eq(coord_num(&co, "actual_workers"), 1); /* the stopped one is still a member */
    ck_assert_int_eq(cl_signal(w[1], SIGKILL), 0);
    cl_signal(w[1], SIGCONT);
    cl_wait(w[1], RUN_S);
    ck_assert_msg(cl_wait_log(psd, "job complete: every worker did its 60 steps or left",
                              RUN_S) == 0, "the job never ended: %s", cl_tail(psd));
    char *st = coord_status(&co);
    ck_assert_msg(st && strstr(st, "\"finished\": true"), "status: %s", st ? st : "(none)");
    free(st);
    coord_close(&co);
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* A launcher (pid @p pid) on @p host that runs @p running workers, stops @p stopping more and
 * polls every @p poll_ms asks shard 0: its answer (> 0: start that many, < 0: stop). */
static int32_t launch_report_flags(coord_t *co, const char *host, uint32_t pid, uint32_t running,
                                   uint32_t stopping, uint32_t poll_ms, uint32_t flags)
{
    ps_msg_t q = {.type = PS_MSG_LAUNCH, .rank = -1, .pid = pid, .workers = running,
                  .count = stopping, .poll_ms = poll_ms, .flags = flags}, r;
    snprintf(q.host, sizeof q.host, "%s", host);
    snprintf(q.cluster, sizeof q.cluster, "%s", co->m.cluster);
    char err[512];
    int rc = -1;
    for (int i = 0; i < 3 && rc; i++) /* a call that finds the shard restarted connects again */
        rc = ps_req_call(co->ctl, 0, &q, &r, NULL, NULL, err, sizeof err);
    ck_assert_msg(rc == 0, "%s", err);
    return r.status;
}

/* A report of a launcher that names its stops but not as every report (session 72's
 * pslaunch: no PS_FLAG_REPORT). */
static int32_t launch_report_as(coord_t *co, const char *host, uint32_t pid, uint32_t running,
                                uint32_t stopping, uint32_t poll_ms)
{
    return launch_report_flags(co, host, pid, running, stopping, poll_ms, 0);
}

/* The same as pid 424242, which names neither its stops nor its poll (an older pslaunch). */
static int32_t launch_report(coord_t *co, const char *host, uint32_t running)
{
    return launch_report_as(co, host, 424242, running, 0, 0);
}

/* The starts a launcher with no worker running (pslaunch --follow's ask) would get now. */
static int32_t launch_grant(coord_t *co) { return launch_report(co, "test-host", 0); }

/* asp with job.max_steps: once a worker did its steps no start is granted (a replacement would
 * do as many again), and a restart of shard 0 keeps it so. Before, the restart forgot it: a
 * launcher was granted a start for the finished worker's place, which did max_steps more. */
START_TEST(test_asp_max_steps_cap_survives_restart)
{
    cl_proc_t *psd, *w[2];
    coord_t co;
    cl_cluster_t *c = asp_capped_start(&psd, w, &co);
    ck_assert_int_eq(launch_grant(&co), 0); /* capped: 1 of 2 desired, none granted */
    /* A scale (to the same 2) saves the state without rank 0, which left: the restart then has
     * one member, and (uncapped) would grant a start for the other place. */
    ps_msg_t q = {.type = PS_MSG_SCALE, .rank = -1, .workers = 2}, r;
    snprintf(q.cluster, sizeof q.cluster, "%s", co.m.cluster);
    char err[512];
    ck_assert_msg(ps_req_call(co.ctl, 0, &q, &r, NULL, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(coord_num(&co, "actual_workers"), 1);
    nap_ms(300); /* the save commits */
    ck_assert_int_eq(cl_signal(psd, SIGKILL), 0);
    cl_wait(psd, RUN_S);
    psd = cl_psd_start(c, 0, NULL, READY_S);
    ck_assert_int_eq(launch_grant(&co), 0); /* still: before, 1 */
    /* psctl scale says why no worker will start (before, only "(now 1)"). */
    char *sc[] = {(char *)cl_binary("PSCTL"), "--manifest", c->manifest, "scale", "2", NULL};
    cl_proc_t *ps = cl_spawn(c, "psctl-scale", sc);
    EXPECT_EXIT(ps, 0);
    EXPECT_LOG(ps, "desired workers: 2 (now 1; no worker will start: a member did job.max_steps");
    ck_assert_int_eq(cl_signal(w[1], SIGKILL), 0);
    cl_signal(w[1], SIGCONT);
    cl_wait(w[1], RUN_S);
    coord_close(&co);
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* Workers a launcher started that died before joining are started again at its next report
 * (it counts them no more). Before, their grants counted for GRANT_TTL_MS: the job waited
 * ~15 s with no worker (found by a chaos probe: pslaunch --follow, members and their
 * replacements killed). */
START_TEST(test_launch_again_when_started_died)
{
    cl_conf_t k = {.shards = 1, .workers = 2};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    coord_t co;
    coord_open(&co, c);
    ck_assert_int_eq(launch_grant(&co), 2);
    nap_ms(50);
    ck_assert_int_eq(launch_grant(&co), 2); /* it runs none: both died (before: 0) */
    EXPECT_LOG(psd, "2 worker(s) started for the job never joined");
    coord_close(&co);
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* A member that no live launcher runs (a worker started by hand; or the workers of a pslaunch
 * stopped for over GRANT_TTL_MS) on a launcher's host was counted as one of that launcher's:
 * the workers it had just started, not joined yet, were taken for dead ("never joined") and
 * started again, over the desired number (a helper's probe, session 58). Members now count
 * for the launcher their hello names (PS_LAUNCHER, set by pslaunch). */
START_TEST(test_launch_not_again_for_others_members)
{
    cl_conf_t k = {.shards = 1, .workers = 1, .max_steps = 1000000};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    cl_proc_t *w = cl_worker_start(c, NULL, NULL, false); /* by hand: no PS_LAUNCHER */
    ck_assert_msg(cl_wait_log(w, "joined at step", RUN_S) == 0, "no join: %s", cl_tail(w));
    coord_t co;
    coord_open(&co, c);
    char host[64] = "";
    gethostname(host, sizeof host - 1); /* the worker's host, as its hello names it */
    ps_msg_t q = {.type = PS_MSG_SCALE, .rank = -1, .workers = 3}, r;
    snprintf(q.cluster, sizeof q.cluster, "%s", co.m.cluster);
    char err[512];
    ck_assert_msg(ps_req_call(co.ctl, 0, &q, &r, NULL, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(launch_report(&co, host, 0), 2);
    nap_ms(50);
    ck_assert_int_eq(launch_report(&co, host, 2), 0); /* it runs them, still starting: before, 1 */
    ck_assert_int_eq(count_in_log(psd, "never joined"), 0);
    coord_close(&co);
    ck_assert_int_eq(cl_signal(w, SIGKILL), 0);
    cl_wait(w, RUN_S);
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* A worker stopped at @p where (PS_TEST_STOP_AT) until shard @p psd dropped it as silent,
 * then continued; it must finish (exit 0). */
static cl_proc_t *worker_dropped_at(cl_cluster_t *c, cl_proc_t *psd, const char *where)
{
    setenv("PS_TEST_STOP_AT", where, 1);
    cl_proc_t *w = cl_worker_start(c, NULL, NULL, false);
    unsetenv("PS_TEST_STOP_AT");
    ck_assert_msg(cl_wait_log(w, "(PS_TEST_STOP_AT)", RUN_S) == 0, "%s", cl_tail(w));
    int dropped = count_in_log(psd, "dropping it");
    for (int i = 0; i < (int)(RUN_S * 20) && count_in_log(psd, "dropping it") == dropped; i++)
        nap_ms(50);
    ck_assert_msg(count_in_log(psd, "dropping it") > dropped, "%s", cl_tail(psd));
    ck_assert_int_eq(cl_signal(w, SIGCONT), 0);
    EXPECT_EXIT(w, 0);
    return w;
}

/* A worker dropped as silent between its hello and the end of its declarations (stopped
 * there past the heartbeat timeout; or a restarted coordinator gave its rank to another) joins
 * again and does the job; so does one dropped before its final pull, to pull. Before, both
 * exited 1 ("declare ...: this worker (rank 0) was removed from the job"; "final pull: ..."),
 * where a drop in between joins again (found by a chaos probe). */
START_TEST(test_dropped_at_declare_or_final_pull)
{
    cl_conf_t k = {.shards = 1, .workers = 1, .max_steps = 5,
                   .job_extra = "  heartbeat_timeout_ms: 600\n"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    cl_proc_t *w = worker_dropped_at(c, psd, "hello");
    EXPECT_LOG(w, "was removed from the job; joining again");
    EXPECT_LOG(w, "after 5 steps");
    w = worker_dropped_at(c, psd, "final"); /* the job is complete: only the final pull */
    EXPECT_LOG(w, "was removed from the job before its final pull; joining again to pull");
    EXPECT_LOG(w, "after 5 steps");
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* ssp: a worker that joins a running job starts at the slowest member's clock. From 0, every
 * other member would wait (staleness 2) until it had done as many batches on its own. */
START_TEST(test_ssp_joiner_starts_at_slowest)
{
    cl_conf_t k = {.shards = 1, .workers = 2, .batch_size = 32, .epochs = 1,
                   .consistency = "ssp",
                   .job_extra = "  staleness: 2\n  train_samples: 30000\n"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    cl_proc_t *w[3] = {cl_worker_start(c, NULL, NULL, false), cl_worker_start(c, NULL, NULL,
                                                                              false)};
    coord_t co;
    coord_open(&co, c);
    ck_assert_int_ge(wait_num(&co, "samples_applied", 1280, 0, RUN_S), 1280); /* 40 batches */
    w[2] = cl_worker_start(c, NULL, NULL, false);
    ck_assert_msg(cl_wait_log(psd, "rank 2 starts at clock ", RUN_S) == 0, "no clock for the "
                  "newcomer: %s", cl_tail(psd));
    char *log = cl_log(psd);
    const char *at = strstr(log, "rank 2 starts at clock ");
    long long clock = at ? atoll(at + strlen("rank 2 starts at clock ")) : -1;
    free(log);
    ck_assert_msg(clock >= 15, "the newcomer started at clock %lld, want the slowest's (>= 15)",
                  clock);
    for (int i = 0; i < 3; i++) EXPECT_EXIT(w[i], 0);
    end_finished(&co, psd, c, 30000);
}
END_TEST

/* ---- a confused member ---------------------------------------------------------------------- */

/* A member (the test itself, over the wire) that says more than a worker would:
 * - on shard 0, after taking the batch of step 0, that a step a million ahead is done: refused
 *   with the open step named. Before, shard 0 closed every step up to it, counting batches no
 *   shard applied, and the job was over at once ("finished": true).
 * - on shard 1, a second hello on the same connection that names another rank: refused. Before,
 *   it was taken, and the first rank kept pointing at the connection after it was freed. */
START_TEST(test_confused_member_refused)
{
    cl_conf_t k = {.shards = 2, .workers = 1, .max_steps = 50};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    coord_t co;
    coord_open(&co, c);
    char err[1024] = "";
    ps_msg_t rep, hello = {.type = PS_MSG_HELLO, .rank = -1, .pid = (uint32_t)getpid()};
    snprintf(hello.cluster, sizeof hello.cluster, "%s", co.m.cluster);
    ck_assert_msg(ps_req_call(co.ctl, 0, &hello, &rep, NULL, NULL, err, sizeof err) == 0 &&
                  rep.type == PS_MSG_HELLO_REPLY, "hello to shard 0: %s", err);
    int32_t rank = rep.rank;
    ps_msg_t batch = {.type = PS_MSG_BATCH, .rank = rank, .samples = 60000};
    ck_assert_msg(ps_req_call(co.ctl, 0, &batch, &rep, NULL, NULL, err, sizeof err) == 0 &&
                  rep.step == 0, "the batch of step 0: %s (step %llu)", err,
                  (unsigned long long)rep.step);
    batch.flags = PS_FLAG_DONE;
    batch.step = 1000000;
    int rc = ps_req_call(co.ctl, 0, &batch, &rep, NULL, NULL, err, sizeof err);
    ck_assert_msg(rc == PS_EPROTO && strstr(err, "reports step 1000000 done, but the open step "
                                                 "is 0"), "a step far ahead: %d %s", rc, err);
    char *st = coord_status(&co);
    ck_assert_msg(st && strstr(st, "\"finished\": false") && jnum(st, "open_step") == 0,
                  "shard 0 after it: %s", st ? st : "(no status)");
    free(st);

    ps_msg_t h1 = hello;
    h1.rank = 1;
    ck_assert_msg(ps_req_call(co.ctl, 1, &h1, &rep, NULL, NULL, err, sizeof err) == 0 &&
                  rep.type == PS_MSG_HELLO_REPLY && rep.rank == 1, "hello to shard 1: %s", err);
    h1.rank = 2;
    rc = ps_req_call(co.ctl, 1, &h1, &rep, NULL, NULL, err, sizeof err);
    ck_assert_msg(rc == PS_EPROTO && strstr(err, "this connection said hello as rank 1"),
                  "a second hello naming rank 2: %d %s", rc, err);
    coord_close(&co);
    for (int i = 0; i < 2; i++) ck_assert_msg(cl_alive(psd[i]), "psd%d: %s", i, cl_tail(psd[i]));
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* ---- a leave the coordinator takes late -------------------------------------------------- */

/* A worker leaves (SIGTERM) while shard 0 is stopped: its leave waits in the transport. Shard 0,
 * running again, must take the leave (the rank goes at once, "says leave") rather than see the
 * connection close first and hold the rank for a process that may come back (grace: up to 15 s
 * for a worker on another host), as it did when the worker closed right after sending. Then a leave
 * that a stopped shard cannot answer ends after the hello deadline (a third of the heartbeat
 * timeout, here 4 s): the worker exits while that shard is still stopped. */
START_TEST(test_leave_while_coordinator_stopped)
{
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 16, .epochs = 10000,
                   .job_extra = "  heartbeat_timeout_ms: 12000\n  train_samples: 3000\n"};
    cl_proc_t *psd[2], *w[2];
    coord_t co;
    cl_cluster_t *c = start_2x2(&k, psd, w, &co);
    ck_assert_int_ge(wait_num(&co, "open_step", 20, 0, RUN_S), 20);
    ck_assert_int_eq(cl_signal(psd[0], SIGSTOP), 0);
    ck_assert_int_eq(cl_signal(w[1], SIGTERM), 0);
    nap_ms(500);
    ck_assert_int_eq(cl_signal(psd[0], SIGCONT), 0);
    EXPECT_EXIT(w[1], 128 + SIGTERM);
    char want[64];
    snprintf(want, sizeof want, "(pid %d) says leave", (int)w[1]->pid);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(cl_wait_log(psd[i], want, 5.0) == 0, "shard %d did not take the leave "
                      "(\"%s\"): %s", i, want, cl_tail(psd[i]));
    char *log = cl_log(psd[0]);
    ck_assert_msg(strstr(log, "for it to come back") == NULL, "shard 0 held the rank of a worker "
                  "that said leave: %s", cl_tail(psd[0]));
    free(log);
    ck_assert_int_eq(wait_num(&co, "actual_workers", 1, 1, RUN_S), 1);
    long long s0 = coord_num(&co, "open_step");
    ck_assert_int_gt(wait_num(&co, "open_step", s0 + 20, 0, RUN_S), s0 + 19); /* goes on alone */
    ck_assert_int_eq(cl_signal(psd[1], SIGSTOP), 0);
    ck_assert_int_eq(cl_signal(w[0], SIGTERM), 0);
    int st = cl_wait(w[0], 20.0); /* 4 s for the leave, 2 s for each close */
    ck_assert_msg(st == 128 + SIGTERM, "the last worker did not exit (%d) while shard 1 was "
                  "stopped: %s", st, cl_tail(w[0]));
    ck_assert_msg(cl_alive(psd[1]), "shard 1 exited");
    EXPECT_LOG(w[0], "did not answer the leave in 4000 ms");
    ck_assert_int_eq(cl_signal(psd[1], SIGCONT), 0);
    ck_assert_int_eq(wait_num(&co, "actual_workers", 0, 1, RUN_S), 0);
    coord_close(&co);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* ---- everyone leaves ---------------------------------------------------------------------- */

/* Both workers leave (SIGTERM); the cluster waits at its step; a new worker joins and finishes
 * the run from there. */
START_TEST(test_all_leave_then_one_joins)
{
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 16, .epochs = 2,
                   .job_extra = "  heartbeat_timeout_ms: 500\n  train_samples: 12000\n"};
    cl_proc_t *psd[2], *w[2];
    coord_t co;
    cl_cluster_t *c = start_2x2(&k, psd, w, &co);
    long long at = wait_num(&co, "open_step", 40, 0, RUN_S);
    ck_assert_msg(at >= 40 && at < 600, "the leave should land mid-run, not at step %lld", at);
    for (int i = 0; i < 2; i++) ck_assert_int_eq(cl_signal(w[i], SIGTERM), 0);
    for (int i = 0; i < 2; i++) EXPECT_EXIT(w[i], 128 + SIGTERM);
    ck_assert_int_eq(wait_num(&co, "actual_workers", 0, 1, RUN_S), 0);
    long long s = coord_num(&co, "open_step");
    nap_ms(300);
    ck_assert_int_eq(coord_num(&co, "open_step"), s); /* nobody: the step waits */
    cl_proc_t *late = cl_worker_start(c, NULL, NULL, false);
    EXPECT_EXIT(late, 0);
    char want[64];
    snprintf(want, sizeof want, "joined at step %lld (", s);
    EXPECT_LOG(late, want);
    char *j = coord_status(&co);
    ck_assert_msg(j && strstr(j, "\"finished\": true"), "job not finished: %s", j ? j : "-");
    expect_passes(j, 12000, 2);
    free(j);
    coord_close(&co);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* ---- psctl scale ----------------------------------------------------------------------- */

static void psctl_scale(cl_cluster_t *c, int n)
{
    char num[16];
    snprintf(num, sizeof num, "%d", n);
    char *argv[] = {(char *)cl_binary("PSCTL"), "--manifest", c->manifest, "scale", num, NULL};
    cl_proc_t *p = cl_spawn(c, "psctl", argv);
    EXPECT_EXIT(p, 0);
}

/* A manifest of another cluster that names these shards' addresses: psctl scale and pslaunch
 * --follow are refused with the reason (exit 1 and 2) and the job's desired workers stay; psctl
 * status shows no shard of it (before, it showed their table and exited 0).
 * Before, psctl scale 5 set this job's desired workers (exit 0), and pslaunch --follow started
 * workers that each exited 2 ("this shard serves cluster ..."), 5 more every 15 s, for good. */
START_TEST(test_scale_other_cluster_refused)
{
    cl_conf_t k = {.shards = 2, .workers = 2};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    char other[CL_PATH];
    cl_manifest_other_cluster(c, other);
    char *sc[] = {(char *)cl_binary("PSCTL"), "--manifest", other, "scale", "5", NULL};
    cl_proc_t *p = cl_spawn(c, "psctl-other", sc);
    EXPECT_EXIT(p, 1);
    EXPECT_LOG(p, "this shard serves cluster '");
    char cl_not[3 * sizeof c->cluster_name + 64];
    snprintf(cl_not, sizeof cl_not, "psctl: shard 0 (127.0.0.1:%u): this shard serves cluster "
             "'%s', not 'other-%s'", c->port[0], c->cluster_name, c->cluster_name);
    char *st[] = {(char *)cl_binary("PSCTL"), "--manifest", other, "status", NULL};
    p = cl_spawn(c, "psctl-other-status", st);
    EXPECT_EXIT(p, 1);
    EXPECT_LOG(p, cl_not);
    ck_assert_msg(count_in_log(p, "merkle_root") == 0, "%s", cl_tail(p));
    /* export, verify and checkpoint too (before: exit 0, the export's metadata naming the
     * other cluster, a checkpoint of this one under that name; a probe, session 42). */
    char out[CL_PATH], ck[CL_PATH];
    cl_path(c, "other.safetensors", out, sizeof out);
    cl_path(c, "ckpt-other", ck, sizeof ck);
    char *ex[] = {(char *)cl_binary("PSCTL"), "--manifest", other, "export", "--out", out, NULL};
    char *ve[] = {(char *)cl_binary("PSCTL"), "--manifest", other, "verify", NULL};
    char *cp[] = {(char *)cl_binary("PSCTL"), "--manifest", other, "checkpoint", "--dir", ck,
                  NULL};
    char **others[] = {ex, ve, cp};
    for (int i = 0; i < 3; i++) {
        p = cl_spawn(c, i == 0 ? "psctl-other-export" : i == 1 ? "psctl-other-verify"
                                                               : "psctl-other-checkpoint",
                     others[i]);
        EXPECT_EXIT(p, 1);
        EXPECT_LOG(p, "this shard serves cluster '");
    }
    ck_assert_msg(access(out, F_OK) != 0 && access(ck, F_OK) != 0, "an export or a checkpoint "
                  "was made under the other cluster's name");
    char *ln[] = {(char *)cl_binary("PSLAUNCH"), "--manifest", other, "--follow", "--poll-ms",
                  "100", NULL};
    cl_proc_t *l = cl_spawn(c, "pslaunch-other", ln);
    EXPECT_EXIT(l, 2);
    EXPECT_LOG(l, "this shard serves cluster '");
    coord_t co;
    coord_open(&co, c);
    ck_assert_int_eq(coord_num(&co, "desired_workers"), 2);
    ck_assert_int_eq(coord_num(&co, "actual_workers"), 0);
    coord_close(&co);
    /* Workers that refuse their manifest (exit 2, as psworker does) are not started again and
     * again: pslaunch --follow stops and exits 2. The first worker fails otherwise (exit 1):
     * pslaunch's last line counts it without promising a replacement (before: "(the
     * coordinator grants replacements while the job needs them)" after it said it exits 2). */
    char refuse[CL_PATH];
    cl_path(c, "refuse.sh", refuse, sizeof refuse);
    FILE *f = fopen(refuse, "w");
    fputs("#!/bin/sh\nmkdir \"$0.first\" 2>/dev/null && exit 1\nsleep 0.3\nexit 2\n", f);
    fclose(f);
    ck_assert_int_eq(chmod(refuse, 0700), 0);
    char *lr[] = {(char *)cl_binary("PSLAUNCH"), "--manifest", c->manifest, "--follow",
                  "--poll-ms", "100", "--psworker", refuse, NULL};
    cl_proc_t *l2 = cl_spawn(c, "pslaunch-refused", lr);
    EXPECT_EXIT(l2, 2);
    EXPECT_LOG(l2, "refused its manifest or arguments (exit 2");
    EXPECT_LOG(l2, "1 worker(s) died besides (none replaced once one refused its manifest");
    ck_assert_msg(count_in_log(l2, "grants replacements") == 0, "%s", cl_tail(l2));
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* Workers that left after the job's last step are gone for a restarted coordinator too: shard 0
 * stopped and started again shows no member (before, both came back from its state, were
 * shown for about 3 s and then dropped as "did not come back": a leave was saved only with the
 * next update, and after the last step there is none). Found by a probe. Asked at once after
 * the restart, before any such drop could happen. */
START_TEST(test_leaves_survive_coordinator_restart)
{
    cl_conf_t k = {.shards = 2, .workers = 2, .max_steps = 20};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    cl_proc_t *w[2] = {cl_worker_start(c, NULL, NULL, false), cl_worker_start(c, NULL, NULL, false)};
    EXPECT_EXIT(w[0], 0);
    EXPECT_EXIT(w[1], 0);
    ck_assert_int_eq(cl_signal(psd[0], SIGTERM), 0);
    EXPECT_EXIT(psd[0], 0);
    psd[0] = cl_psd_start(c, 0, NULL, READY_S);
    coord_t co;
    coord_open(&co, c);
    ck_assert_int_eq(coord_num(&co, "actual_workers"), 0);
    coord_close(&co);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* pslaunch --follow: workers that die at once (exit 1) are started again after a wait that
 * doubles, not at every poll: before, 760 deaths in 30 s (found by a probe); here at most
 * about 8 in 3 s (0.1 + 0.2 + 0.4 + 0.8 + 1.6 s of waits). */
START_TEST(test_follow_quick_deaths_wait)
{
    cl_conf_t k = {.shards = 1, .workers = 2};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    char die[CL_PATH];
    cl_path(c, "die.sh", die, sizeof die);
    FILE *f = fopen(die, "w");
    fputs("#!/bin/sh\nexit 1\n", f);
    fclose(f);
    ck_assert_int_eq(chmod(die, 0700), 0);
    char *ld[] = {(char *)cl_binary("PSLAUNCH"), "--manifest", c->manifest, "--follow",
                  "--poll-ms", "10", "--psworker", die, NULL};
    cl_proc_t *l3 = cl_spawn(c, "pslaunch-dying", ld);
    nap_ms(3000);
    ck_assert_int_eq(cl_signal(l3, SIGTERM), 0);
    EXPECT_EXIT(l3, 128 + SIGTERM);
    int deaths = count_in_log(l3, "exited with 1");
    ck_assert_msg(deaths >= 2 && deaths <= 14, "%d workers died in 3 s: %s", deaths, cl_tail(l3));
    EXPECT_LOG(l3, "workers die within a second of their start: the next starts in");
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* pslaunch --follow on @p c's manifest, asking every 100 ms (started, not waited for). */
static cl_proc_t *follow_launcher(cl_cluster_t *c, const char *name)
{
    char *argv[] = {(char *)cl_binary("PSLAUNCH"), "--manifest", c->manifest, "--follow",
                    "--poll-ms", "100", NULL};
    return cl_spawn(c, name, argv);
}

/* Every "joins as rank R at step J" in shard 0's log is followed by "rank R takes part from
 * step S" with S - J <= 2 (a joiner is in the next step). Returns the joins seen. */
static int expect_prompt_admission(const cl_proc_t *psd0)
{
    char *log = cl_log(psd0);
    int joins = 0;
    for (const char *p = log; (p = strstr(p, " joins as rank ")) != NULL; p++) {
        int r = atoi(p + 15);
        const char *at = strstr(p, " at step ");
        ck_assert_ptr_nonnull(at);
        long long j = atoll(at + 9);
        char want[64], again[64];
        snprintf(want, sizeof want, "rank %d takes part from step ", r);
        snprintf(again, sizeof again, " joins as rank %d ", r);
        const char *t = strstr(p, want), *next = strstr(p + 1, again);
        if (t == NULL || (next && next < t)) continue; /* stopped before its first step */
        long long s = atoll(t + strlen(want));
        ck_assert_msg(s - j <= 2, "rank %d joined at step %lld but took part only from %lld", r,
                      j, s);
        joins++;
    }
    free(log);
    return joins;
}

/* Two pslaunch --follow instances keep the workers at the number psctl scale sets:
 * 2 -> 5 -> 1 -> 3, without fighting: exactly 2 + 3 + 2 workers are ever started. */
START_TEST(test_scale_2_5_1_3)
{
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 16, .epochs = 10000,
                   .job_extra = "  heartbeat_timeout_ms: 1000\n  train_samples: 3000\n"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    cl_proc_t *launch[2] = {follow_launcher(c, "pslaunch0"), follow_launcher(c, "pslaunch1")};
    coord_t co;
    coord_open(&co, c);
    static const int seq[] = {2, 5, 1, 3};
    for (int i = 0; i < 4; i++) {
        if (i) psctl_scale(c, seq[i]);
        long long got = wait_num(&co, "actual_workers", seq[i], 1, 20);
        ck_assert_msg(got == seq[i], "scaled to %d, but %lld workers are members", seq[i], got);
        long long s = coord_num(&co, "open_step");
        ck_assert_int_gt(wait_num(&co, "open_step", s + 10, 0, 20), s + 9); /* no deadlock */
        fprintf(stderr, "scale: %d workers at step %lld\n", seq[i], s);
    }
    for (int i = 0; i < 2; i++) ck_assert_int_eq(cl_signal(launch[i], SIGTERM), 0);
    for (int i = 0; i < 2; i++) EXPECT_EXIT(launch[i], 128 + SIGTERM);
    ck_assert_int_eq(wait_num(&co, "actual_workers", 0, 1, RUN_S), 0);
    char *j = coord_status(&co);
    long long passes = expect_passes(j, 3000, 0);
    expect_passes(j, 3000, jnum(j, "pass") >= 0 ? passes - 2 : 0);
    free(j);
    ck_assert_int_ge(expect_prompt_admission(psd[0]), 5);
    int started = count_in_log(launch[0], "joined at step") + count_in_log(launch[1], "joined at step");
    /* 5 -> 1: a launcher stops some of its workers and says the job's members, not its own. */
    static const char stop_said[] = " worker(s) running here: the job has ",
                      guessed[] = "the job has at least "; /* an older psd's reply: no count */
    ck_assert_msg(count_in_log(launch[0], stop_said) + count_in_log(launch[1], stop_said) >= 1 &&
                      count_in_log(launch[0], guessed) + count_in_log(launch[1], guessed) == 0,
                  "%s\n%s", cl_tail(launch[0]), cl_tail(launch[1]));
    ck_assert_msg(started == 7, "the launchers started %d workers for 2 -> 5 -> 1 -> 3, not 7",
                  started);
    coord_close(&co);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* Stops and starts on their way, as launchers report them (a review, session 72), with three
 * members that launchers made up here stand for:
 * - A launcher that says it stops 2 workers (their grants lapsed after GRANT_TTL_MS while they
 *   were leaving) is granted no more stops: before, it was told to stop one more.
 * - A second psctl scale to the same count keeps the stops granted: before, it cleared them,
 *   and the next report was told to stop them again (4 workers scaled to 2 twice went to 0).
 * - A launcher killed right after a start grant holds no other back once it is silent for three
 *   of its polls and a second: before, one started in its place got nothing for ~15 s. */
START_TEST(test_launch_stops_counted_once)
{
    cl_conf_t k = {.shards = 1, .workers = 3, .batch_size = 16, .epochs = 10000,
                   .job_extra = "  train_samples: 3000\n"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S), *w[3];
    for (int i = 0; i < 3; i++) w[i] = cl_worker_start(c, NULL, NULL, false);
    coord_t co;
    coord_open(&co, c);
    ck_assert_int_eq(wait_num(&co, "actual_workers", 3, 1, 20), 3);
    psctl_scale(c, 1);
    ck_assert_int_eq(launch_report_as(&co, "host-a", 1001, 1, 2, 100), 0); /* before: -1 */
    ck_assert_int_eq(launch_report_as(&co, "host-a", 1001, 3, 0, 100), -2);
    psctl_scale(c, 1);
    ck_assert_int_eq(launch_report_as(&co, "host-a", 1001, 3, 0, 100), 0); /* before: -2 */
    psctl_scale(c, 4);
    ck_assert_int_eq(launch_report_as(&co, "host-c", 1003, 0, 0, 100), 1);
    nap_ms(1500); /* 1003 (and 1001) silent: gone */
    ck_assert_int_eq(launch_report_as(&co, "host-d", 1004, 0, 0, 100), 1); /* before: 0 */
    EXPECT_LOG(psd, "1 worker(s) started for the job never joined");
    /* Scaled to 2 while 1004's worker is still starting: the stop granted lands on that one
     * (pslaunch stops its newest), which ends without a leave. 1004's next report, saying it
     * stops none (PS_FLAG_REPORT), has a member stopped: before, the job kept 3 until the
     * grant lapsed (~15 s). Without the flag the grant still counts. */
    psctl_scale(c, 2);
    const uint32_t says = PS_FLAG_REPORT;
    nap_ms(20); /* each report a poll after the last grant, as pslaunch's */
    ck_assert_int_eq(launch_report_flags(&co, "host-d", 1004, 2, 0, 100, says), -1);
    nap_ms(20);
    ck_assert_int_eq(launch_report_as(&co, "host-d", 1004, 1, 0, 100), 0);
    nap_ms(20);
    ck_assert_int_eq(launch_report_flags(&co, "host-d", 1004, 1, 0, 100, says), -1);
    EXPECT_LOG(psd, "1 stop(s) granted matched no leave (a worker stopped before it joined");
    /* Its stop of a member on its way (said) is kept: no second one. */
    nap_ms(20);
    ck_assert_int_eq(launch_report_flags(&co, "host-d", 1004, 0, 1, 100, says), 0);
    ck_assert_int_eq(coord_num(&co, "actual_workers"), 3); /* the made-up ones stopped none */
    coord_close(&co);
    for (int i = 0; i < 3; i++) ck_assert_int_eq(cl_signal(w[i], SIGTERM), 0);
    for (int i = 0; i < 3; i++) cl_wait(w[i], RUN_S);
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* The last child process of @p pid (the newest: /proc/PID/task/PID/children lists them as
 * started), or -1. */
static pid_t last_child(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    char *text = cl_read_file(path, NULL);
    pid_t child = -1;
    for (char *p = text, *end; p && *p; p = end) {
        long v = strtol(p, &end, 10);
        if (end == p) break;
        child = (pid_t)v;
    }
    free(text);
    return child;
}

/* Whether process @p pid has exited and waits to be reaped. */
static bool is_zombie(pid_t pid)
{
    char path[64], st = 0;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    char *text = cl_read_file(path, NULL);
    const char *rp = text ? strrchr(text, ')') : NULL;
    if (rp && rp[1] == ' ') st = rp[2];
    free(text);
    return st == 'Z';
}

/* pslaunch --follow outlives a restart of shard 0 (kill -9, started again): its next poll
 * connects again (proto/reqclient.c), so a psctl scale after the restart is still followed.
 * Before, every poll after the restart failed on the dead connection: the launcher never
 * started another worker, nor learnt that the job ended. It says when the coordinator stops
 * answering and when it answers again. And a stopped worker it stops for a scale-down ends. */
START_TEST(test_launcher_survives_coordinator_restart)
{
    cl_conf_t k = {.shards = 1, .workers = 1, .batch_size = 16, .epochs = 10000,
                   .job_extra = "  train_samples: 3000\n"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    cl_proc_t *launch = follow_launcher(c, "pslaunch");
    coord_t co;
    coord_open(&co, c);
    ck_assert_int_eq(wait_num(&co, "open_step", 5, 0, 20) >= 5, 1);
    ck_assert_int_eq(cl_signal(psd, SIGKILL), 0);
    cl_wait(psd, RUN_S);
    psd = cl_psd_start(c, 0, NULL, READY_S);
    /* The status connection failed with the shard: the helper's next call connects again. */
    ck_assert_int_eq(wait_num(&co, "actual_workers", 1, 1, 20), 1);
    psctl_scale(c, 2);
    long long got = wait_num(&co, "actual_workers", 2, 1, 20);
    ck_assert_msg(got == 2, "scaled to 2 after the restart, but %lld workers are members: %s",
                  got, cl_tail(launch));
    /* Scaled down to 1 with the newest worker stopped (SIGSTOP): the one pslaunch stops (the
     * newest) gets SIGCONT with its SIGTERM and ends. Before, it stayed stopped, counted as
     * stopping, for the rest of the job (a review, session 70). */
    pid_t newest = last_child(launch->pid);
    ck_assert_int_gt(newest, 0);
    ck_assert_int_eq(kill(newest, SIGSTOP), 0);
    psctl_scale(c, 1);
    ck_assert_msg(cl_wait_log(launch, "pslaunch: stopping 1 of the 2 worker(s)", RUN_S) == 0,
                  "%s", cl_tail(launch));
    for (int i = 0; i < 200 && kill(newest, 0) == 0 && !is_zombie(newest); i++) nap_ms(100);
    ck_assert_msg(kill(newest, 0) != 0 || is_zombie(newest),
                  "the stopped worker (pid %d) still runs 20 s after the scale-down: %s",
                  (int)newest, cl_tail(launch));
    ck_assert_int_eq(cl_signal(launch, SIGTERM), 0);
    EXPECT_EXIT(launch, 128 + SIGTERM);
    /* It said that shard 0 was away, and that it was back (before, it said nothing). */
    EXPECT_LOG(launch, "pslaunch: the coordinator does not answer (for 0 s; asking again every "
                       "100 ms): ");
    EXPECT_LOG(launch, "pslaunch: the coordinator answers again after ");
    coord_close(&co);
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* The first child process of @p pid (/proc/PID/task/PID/children), or -1. */
static pid_t first_child(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    char *text = cl_read_file(path, NULL);
    pid_t child = text && *text ? (pid_t)atoi(text) : -1;
    free(text);
    return child;
}

/* pslaunch --follow whose worker was SIGSTOPped (dropped by the shards) while the other trains
 * the job to its end: once the coordinator says the job is complete and the grace passed
 * (PS_TEST_FINISH_GRACE_MS: 1 s here, 30 s by default), the stopped worker gets SIGTERM and
 * SIGCONT, leaves, and pslaunch exits 0. Before, pslaunch waited for it for good (a probe,
 * session 42). */
START_TEST(test_follow_finish_with_stopped_worker)
{
    cl_conf_t k = {.shards = 1, .workers = 2, .batch_size = 16, .max_steps = 300,
                   .map_size_mb = 256, .job_extra = "  heartbeat_timeout_ms: 1000\n"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    /* Pulls over the transport: a worker stopped inside a direct pull would pin the store's
     * pages for good (DESIGN-NOTES, Known limits) and fill it ("the shard store is full": the
     * job never ended, 1 run in ~5); psd's own snapshot for a reply ends with the drop. */
    setenv("PS_TEST_FINISH_GRACE_MS", "1000", 1);
    setenv("PS_DIRECT_PULL", "0", 1);
    cl_proc_t *launch = follow_launcher(c, "pslaunch");
    unsetenv("PS_TEST_FINISH_GRACE_MS");
    unsetenv("PS_DIRECT_PULL");
    coord_t co;
    coord_open(&co, c);
    ck_assert_int_eq(wait_num(&co, "actual_workers", 2, 1, 20), 2);
    pid_t w = first_child(launch->pid);
    ck_assert_msg(w > 0, "no worker under pslaunch: %s", cl_tail(launch));
    ck_assert_int_eq(kill(w, SIGSTOP), 0);
    EXPECT_EXIT(launch, 0);
    EXPECT_LOG(launch, "pslaunch: the job is complete\n");
    EXPECT_LOG(launch, "pslaunch: the job is complete, and 1 worker(s) still run 1 s later "
                       "(stopped or hung): SIGTERM");
    ck_assert_msg(kill(w, 0) != 0, "the stopped worker %d is still there", (int)w);
    coord_close(&co);
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* The workers pslaunch --follow started in @p launch's log ("starting N worker(s)"), summed. */
static int started_by(cl_proc_t *launch)
{
    char *log = cl_log(launch);
    int n = 0;
    for (const char *p = log; (p = strstr(p, "pslaunch: starting ")) != NULL; p++)
        n += atoi(p + strlen("pslaunch: starting "));
    free(log);
    return n;
}

/* psctl scale 3 while the 2 workers pslaunch --follow started for job.workers 2 are still on
 * their way (not members yet): one more is started, not three. Before, the scale forgot the
 * starts granted and not joined yet: 5 started, then 2 stopped (extra joins and leaves, each
 * a membership change under bsp). */
START_TEST(test_scale_while_starting)
{
    cl_conf_t k = {.shards = 1, .workers = 2, .batch_size = 16, .epochs = 10000,
                   .job_extra = "  train_samples: 3000\n"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    cl_proc_t *launch = follow_launcher(c, "pslaunch");
    ck_assert_msg(cl_wait_log(launch, "pslaunch: starting 2 worker(s)", RUN_S) == 0, "%s",
                  cl_tail(launch));
    psctl_scale(c, 3);
    coord_t co;
    coord_open(&co, c);
    ck_assert_int_eq(wait_num(&co, "actual_workers", 3, 1, 20), 3);
    nap_ms(1000); /* a few more asks of the launcher: no more starts, no stops */
    ck_assert_int_eq(coord_num(&co, "actual_workers"), 3);
    ck_assert_msg(started_by(launch) == 3, "%d workers started for 3: %s", started_by(launch),
                  cl_tail(launch));
    ck_assert_int_eq(count_in_log(launch, "pslaunch: stopping"), 0);
    ck_assert_int_eq(cl_signal(launch, SIGTERM), 0);
    EXPECT_EXIT(launch, 128 + SIGTERM);
    coord_close(&co);
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* ---- ssp ---------------------------------------------------------------------------------- */

/* The coordinator's state changes that come without a step (psctl scale, and the epoch bump
 * of a restart) survive restarts of shard 0 with no worker: the desired count stays 5, and
 * each restart's epoch is past the last one's. Before, both came back as they were before
 * (only apply jobs saved the state): desired 2 again, and the same epoch twice. */
START_TEST(test_coordinator_state_kept_without_steps)
{
    cl_conf_t k = {.shards = 1, .workers = 2};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    psctl_scale(c, 5);
    ck_assert_int_eq(cl_signal(psd, SIGTERM), 0);
    EXPECT_EXIT(psd, 0);
    long long epoch[2];
    for (int i = 0; i < 2; i++) {
        psd = cl_psd_start(c, 0, NULL, READY_S);
        coord_t co;
        coord_open(&co, c);
        char *j = coord_status(&co);
        coord_close(&co);
        ck_assert_msg(j && jnum(j, "desired_workers") == 5, "restart %d: %s", i + 1, j ? j : "-");
        epoch[i] = jnum(j, "epoch");
        free(j);
        ck_assert_int_eq(cl_signal(psd, SIGKILL), 0); /* its start saved the state */
        cl_wait(psd, RUN_S);
    }
    ck_assert_msg(epoch[1] > epoch[0], "epochs %lld then %lld", epoch[0], epoch[1]);
    cl_cluster_destroy(c);
}
END_TEST

/* ssp with staleness 2: with one worker stopped, the other runs at most 2 steps ahead of it
 * (plus the batch in its hands: 3 finished steps apart), then waits; both finish once it
 * resumes. */
START_TEST(test_ssp_staleness)
{
    cl_conf_t k = {.shards = 1, .workers = 2, .batch_size = 32, .epochs = 1,
                   .consistency = "ssp",
                   .job_extra = "  staleness: 2\n  heartbeat_timeout_ms: 20000\n"
                                "  train_samples: 6000\n"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    cl_proc_t *w[2] = {cl_worker_start(c, NULL, NULL, false), cl_worker_start(c, NULL, NULL, false)};
    coord_t co;
    coord_open(&co, c);
    ck_assert_int_ge(wait_num(&co, "samples_applied", 320, 0, RUN_S), 320);
    ck_assert_int_eq(cl_signal(w[1], SIGSTOP), 0);
    nap_ms(800);
    long long lo = -1, hi = -1;
    for (int t = 0; t < 10; t++) {
        char *j = coord_status(&co);
        const char *p = j ? strstr(j, "\"members\": [") : NULL;
        lo = hi = -1;
        while (p && (p = strstr(p, "\"steps\": ")) != NULL) {
            long long s = atoll(p + 9);
            if (lo < 0 || s < lo) lo = s;
            if (s > hi) hi = s;
            p++;
        }
        free(j);
        ck_assert_msg(lo >= 0 && hi - lo <= 3, "steps %lld and %lld: more than staleness 2 apart",
                      lo, hi);
        nap_ms(50);
    }
    ck_assert_int_eq(cl_signal(w[1], SIGCONT), 0);
    EXPECT_EXIT(w[0], 0);
    EXPECT_EXIT(w[1], 0);
    end_finished(&co, psd, c, 6000);
}
END_TEST

/* A worker whose training loop hangs while libps's thread heartbeats (PS_TEST_HANG_AT: 5 s at
 * its 40th batch request) held a bsp job for as long as it hung (every step waits for every
 * member), and an ssp one once the others were job.staleness batches ahead. With
 * job.step_timeout_ms shard 0 drops it (bsp: its pushes of the open step 1500 ms late; ssp: no
 * batch reported for 1500 ms while another waits for it): the other worker goes on meanwhile,
 * the hung one learns it was removed when it goes on and joins again, and every pass is
 * applied exactly once. Without the option the job does not move on during the hang. The hang
 * ends (SIGUSR2) once that is seen, the 5 s being its bound. Returns
 * how far the open step (ssp: the fastest worker's batches) moved in 3 s of the hang (with the
 * option: by when it moved 4, or 4.5 s of the hang). */
static long long steps_during_hang(const char *consistency, const char *extra, int staleness,
                                   int workers, const char *at)
{
    char job[200], bound[32] = ""; /* staleness: read by ssp only (the manifest refuses it
                                        elsewhere) */
    if (strcmp(consistency, "ssp") == 0)
        snprintf(bound, sizeof bound, "  staleness: %d\n", staleness);
    snprintf(job, sizeof job, "  heartbeat_timeout_ms: 1000\n  train_samples: 6400\n%s%s", bound,
             extra);
    cl_conf_t k = {.shards = 2, .workers = (uint32_t)workers, .batch_size = 32, .epochs = 3,
                   .consistency = consistency, .layers = "[784, 16, 10]", .job_extra = job};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    cl_proc_t *a = cl_worker_start(c, NULL, NULL, false);
    cl_proc_t *a2 = workers > 2 ? cl_worker_start(c, NULL, NULL, false) : NULL;
    /* The others are members before the hung one starts: on a loaded host (CI, session 58) a
     * started late, b joined first and hung as the only member, so no step was late to drop
     * it for and a's first step waited for b's hang to end. */
    ck_assert_msg(cl_wait_log(a, "joined at step", RUN_S) == 0, "a: %s", cl_tail(a));
    if (a2) ck_assert_msg(cl_wait_log(a2, "joined at step", RUN_S) == 0, "a2: %s", cl_tail(a2));
    setenv("PS_TEST_HANG_AT", at, 1);
    setenv("PS_TEST_HANG_MS", "5000", 1);
    cl_proc_t *b = cl_worker_start(c, NULL, NULL, false);
    unsetenv("PS_TEST_HANG_AT");
    unsetenv("PS_TEST_HANG_MS");
    ck_assert_msg(cl_wait_log(b, "(PS_TEST_HANG_AT)", RUN_S) == 0, "%s", cl_tail(b));
    coord_t co;
    coord_open(&co, c);
    nap_ms(300); /* bsp: the step b pushed last is closed by then (a's next batch request) */
    char *j = coord_status(&co);
    long long from = jnum(j, "open_step");
    free(j);
    /* Without the option: 3 s of the hang (1.7 s left then). With it (1.5 s): until the step
     * moved 4, or 4.5 s of the hang: under a full suite's load the drop and the others' steps
     * came later than 3 s (moved 0: a flake since session 63). */
    long long moved = 0;
    for (double t0 = now_s(); extra[0] && moved < 4 && now_s() - t0 < 4.5; nap_ms(100)) {
        j = coord_status(&co);
        moved = jnum(j, "open_step") - from;
        free(j);
    }
    if (!extra[0]) {
        nap_ms(3000);
        j = coord_status(&co);
        moved = jnum(j, "open_step") - from;
        free(j);
    }
    /* Seen what it waited for: the hang ends now, not after its 5 s (psworker's SIGUSR2). Under
     * the option b was dropped by then (moving 2 takes it), so it goes on as a removed one. */
    ck_assert_int_eq(cl_signal(b, SIGUSR2), 0);
    EXPECT_EXIT(a, 0);
    if (a2) EXPECT_EXIT(a2, 0);
    EXPECT_EXIT(b, 0);
    j = coord_status(&co);
    ck_assert_msg(j && strstr(j, "\"finished\": true"), "job not finished: %s", j ? j : "-");
    ck_assert_int_eq(expect_passes(j, 6400, 3), 3);
    ck_assert_int_eq(jnum(j, "samples_applied"), 3 * 6400);
    free(j);
    coord_close(&co);
    if (extra[0]) {
        const char *why = strcmp(consistency, "bsp") == 0 ? "has not pushed step"
                                                          : "while a member waits for it";
        /* The hung worker only: the other, and the hung one once back, were never late. */
        ck_assert_msg(count_in_log(psd[0], why) == 1, "%d drops for \"%s\": %s",
                      count_in_log(psd[0], why), why, cl_tail(psd[0]));
        EXPECT_LOG(psd[0], "it held the others past job.step_timeout_ms");
        EXPECT_LOG(b, "was removed from the job; joining again");
    }
    fprintf(stderr, "hung_worker (%s, staleness %d, %d workers, %s, at %s): moved %lld in 3 s of "
            "the hang\n", consistency, staleness, workers,
            extra[0] ? "step_timeout_ms 1500" : "no step timeout", at, moved);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
    return moved;
}

START_TEST(test_hung_worker_dropped_after_step_timeout)
{
    long long moved = steps_during_hang("bsp", "  step_timeout_ms: 1500\n", 2, 2, "batch:40");
    ck_assert_msg(moved >= 2, "bsp: the open step moved %lld during the hang", moved);
    moved = steps_during_hang("bsp", "", 2, 2, "batch:40");
    /* At most the close of the step b had pushed, on a loaded host later than the nap. */
    ck_assert_msg(moved <= 1, "bsp without step_timeout_ms: the open step moved %lld during the "
                  "hang (the test does not hang the worker?)", moved);
    moved = steps_during_hang("ssp", "  step_timeout_ms: 1500\n", 2, 2, "batch:40");
    ck_assert_msg(moved >= 4, "ssp: the fastest worker moved %lld batches during the hang", moved);
    moved = steps_during_hang("ssp", "", 2, 2, "batch:40");
    /* a runs at most staleness + 1 batches ahead of b, which stopped at its 39th. */
    ck_assert_msg(moved <= 3, "ssp without step_timeout_ms: the fastest worker moved %lld "
                  "batches during the hang", moved);
    /* Three workers, staleness 0: the two that waited behind the hung one get their batches
     * together once it is dropped, and the first to finish waits for the other at once; that
     * one's clock runs from its batch's answer, not from when it waited (it was dropped too). */
    moved = steps_during_hang("ssp", "  step_timeout_ms: 1500\n", 0, 3, "batch:40");
    ck_assert_msg(moved >= 4, "ssp, 3 workers: the fastest moved %lld batches", moved);
    /* Hung with its batch in hand: that batch goes to the other worker (replay-tagged), and
     * the hung one's pushes of it, once it goes on, are refused (it was removed): every pass
     * still applied exactly once (steps_during_hang checks). */
    moved = steps_during_hang("bsp", "  step_timeout_ms: 1500\n", 2, 2, "train:40");
    ck_assert_msg(moved >= 2, "bsp, hung with its batch: the open step moved %lld", moved);
    moved = steps_during_hang("ssp", "  step_timeout_ms: 1500\n", 2, 2, "train:40");
    ck_assert_msg(moved >= 4, "ssp, hung with its batch: the fastest moved %lld", moved);
}
END_TEST

/* ---- chaos ------------------------------------------------------------------------------ */

/* Seeded random joins, graceful leaves and kill -9 for PS_CHAOS_S seconds (default 12; the
 * issue's 2-minute run: PS_CHAOS_S=120 PS_INTEG_BUDGET_S=300 PS_CHAOS_EPOCHS=80): whenever a
 * worker is alive the step advances, and the run ends with every pass applied exactly once
 * and an accuracy near the undisturbed run's. */
START_TEST(test_chaos)
{
    double chaos_s = getenv("PS_CHAOS_S") ? atof(getenv("PS_CHAOS_S")) : 12;
    unsigned seed = getenv("PS_CHAOS_SEED") ? (unsigned)atoi(getenv("PS_CHAOS_SEED")) : 7;
    uint32_t epochs = getenv("PS_CHAOS_EPOCHS") ? (uint32_t)atoi(getenv("PS_CHAOS_EPOCHS")) : 15;
    cl_conf_t k = {.shards = 2, .workers = 2, .batch_size = 16, .epochs = epochs,
                   .job_extra = "  heartbeat_timeout_ms: 1000\n  train_samples: 12000\n"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    coord_t co;
    coord_open(&co, c);
    cl_proc_t *live[8];
    int nlive = 0, joins = 0, leaves = 0, kills = 0;
    live[nlive++] = cl_worker_start(c, NULL, NULL, false);
    live[nlive++] = cl_worker_start(c, NULL, NULL, false);
    double t0 = now_s(), next = t0 + 1.0, since_alive = t0, last_adv = t0;
    long long last_step = -1;
    int finished = 0;
    while (now_s() - t0 < chaos_s && !finished) {
        char *j = coord_status(&co);
        long long step = jnum(j, "open_step"), actual = jnum(j, "actual_workers");
        finished = j && strstr(j, "\"finished\": true");
        double now = now_s();
        if (step != last_step) last_adv = now;
        last_step = step;
        if (actual < 1) since_alive = now;
        /* With a member for a while (its batch in hand), the step must move. */
        ck_assert_msg(finished || now - since_alive < 3.0 || now - last_adv < 3.0,
                      "step %lld has not advanced for %.1f s with %lld members; shard 0: %s",
                      step, now - last_adv, actual, j ? j : "-");
        free(j);
        for (int i = 0; i < nlive; i++) /* forget the ones that ended */
            if (!cl_alive(live[i])) live[i--] = live[--nlive];
        if (now >= next) {
            int r = rand_r(&seed) % 10;
            if (nlive == 0 || (r < 4 && nlive < 5)) {
                live[nlive++] = cl_worker_start(c, NULL, NULL, false);
                joins++;
            } else if (r < 7) {
                int v = rand_r(&seed) % nlive;
                cl_signal(live[v], SIGTERM);
                leaves++;
            } else {
                int v = rand_r(&seed) % nlive;
                cl_signal(live[v], SIGKILL);
                kills++;
            }
            next = now + 0.3 + (rand_r(&seed) % 700) / 1000.0;
        }
        nap_ms(50);
    }
    fprintf(stderr, "chaos: %.1f s, %d joins, %d leaves, %d kills\n", now_s() - t0, joins, leaves,
            kills);
    /* Calm: two workers finish the run. */
    for (int i = 0; i < nlive; i++)
        if (!cl_alive(live[i])) live[i--] = live[--nlive];
    while (nlive < 2 && !finished) live[nlive++] = cl_worker_start(c, NULL, NULL, false);
    cl_proc_t *last = NULL;
    for (int i = 0; i < nlive; i++) {
        int st = cl_wait(live[i], RUN_S);
        ck_assert_msg(st == 0 || st == 128 + SIGTERM, "%s ended with %d: %s", live[i]->name, st,
                      cl_tail(live[i]));
        if (st == 0) last = live[i];
    }
    char *j = coord_status(&co);
    ck_assert_msg(j && strstr(j, "\"finished\": true"), "job not finished: %s", j ? j : "-");
    /* Every pass exactly once (status lists the last 63 passes; the total covers all). */
    ck_assert_int_eq(expect_passes(j, 12000, epochs), epochs < 63 ? (int)epochs : 63);
    ck_assert_int_eq(jnum(j, "samples_applied"), (long long)epochs * 12000);
    free(j);
    coord_close(&co);
    if (last) {
        cl_proc_t *ref = cl_worker_start(c, NULL, NULL, true);
        EXPECT_EXIT(ref, 0);
        double a = final_accuracy(last), r = final_accuracy(ref);
        fprintf(stderr, "chaos: accuracy %.4f, undisturbed %.4f\n", a, r);
        ck_assert_msg(a >= r - 0.02, "accuracy %.4f after the chaos, %.4f undisturbed", a, r);
    }
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("elastic");
#define ADD(name) suite_add_tcase(s, tcase(#name, test_##name))
    ADD(kill9_one_of_four);
    ADD(hung_worker_dropped_after_step_timeout);
    ADD(kill9_mid_step_applied_once);
    ADD(kill9_mid_batch_asp_applied_once);
    ADD(kill9_after_batch_asp_applied_once);
    ADD(asp_random_deaths_applied_once);
    ADD(asp_random_deaths_shard_kills);
    ADD(ssp_random_deaths_shard_kills);
    ADD(bsp_step_emptied_after_partial_apply);
    ADD(bsp_step_emptied_checkpoint_waits);
    ADD(bsp_step_emptied_checkpoint_waits_one_shard);
    ADD(bsp_step_emptied_checkpoint_moves_back);
    ADD(bsp_step_emptied_during_apply);
    ADD(bsp_step_emptied_at_the_end);
    ADD(bsp_all_ranks_left_open_step);
    ADD(bsp_all_ranks_left_open_step_restart);
    ADD(bsp_all_ranks_left_open_step_ckpt_held);
    ADD(bsp_unasked_joiners_leave_no_tag);
    ADD(bsp_joiners_tags_merge);
    ADD(bsp_step_emptied_coordinator_killed);
    ADD(bsp_step_emptied_close_not_saved);
    ADD(bsp_random_deaths_applied_once);
    ADD(bsp_random_deaths_shard_kills);
    ADD(asp_coordinator_restart_after_handout);
    ADD(asp_handout_save_failed);
    ADD(asp_finish_not_saved);
    ADD(join_beside_first_declare);
    ADD(asp_stopped_member_refused);
    ADD(asp_stopped_member_late_push);
    ADD(kill9_mid_step_shard_restarted);
    ADD(kill9_shard_restarted_after_members_changed);
    ADD(kill9_mid_step_coordinator_restarted);
    ADD(kill9_coordinator_idle_tensor);
    ADD(kill9_coordinator_no_trained_chunk);
    ADD(kill9_whole_step_coordinator_restarted);
    ADD(kill9_whole_step_slow_pass);
    ADD(kill9_last_step_coordinator_restarted);
    ADD(kill9_join_handout_not_saved);
    ADD(restore_after_member_left_mid_step);
    ADD(restore_clean_bsp_no_replays);
    ADD(restore_asp_batch_part_pushed);
    ADD(restore_asp_checkpoint_is_cut);
    ADD(asp_checkpoint_asked_again_one_user);
    ADD(asp_checkpoint_hold_lapsed_refused);
    ADD(periodic_asp_checkpoints_are_cuts);
    ADD(asp_every_steps_after_death);
    ADD(periodic_asp_checkpoint_skipped_when_stuck);
    ADD(asp_checkpoints_at_once);
    ADD(bsp_checkpoints_share_hold);
    ADD(checkpoint_waits_for_busy_shard);
    ADD(checkpoint_waits_for_busy_shard1);
    ADD(bsp_checkpoint_hold_ends_with_dead_user);
    ADD(bsp_checkpoint_hold_ends_with_killed_psctl);
    ADD(asp_checkpoint_hold_ends_with_killed_psctl);
    ADD(bsp_checkpoint_survives_transport_restart);
    ADD(sigstop_rejoins);
    ADD(sigstop_rejoin_refused_exits_2);
    ADD(stopped_direct_reader_waits);
    ADD(stopped_direct_reader_psd_restarted);
    ADD(all_leave_then_one_joins);
    ADD(confused_member_refused);
    ADD(ssp_joiner_starts_at_slowest);
    ADD(asp_max_steps_finishes);
    ADD(asp_max_steps_member_died_finishes);
    ADD(asp_max_steps_cap_survives_restart);
    ADD(launch_again_when_started_died);
    ADD(launch_not_again_for_others_members);
    ADD(dropped_at_declare_or_final_pull);
    ADD(leave_while_coordinator_stopped);
    ADD(scale_2_5_1_3);
    ADD(launch_stops_counted_once);
    ADD(scale_other_cluster_refused);
    ADD(follow_quick_deaths_wait);
    ADD(leaves_survive_coordinator_restart);
    ADD(launcher_survives_coordinator_restart);
    ADD(follow_finish_with_stopped_worker);
    ADD(scale_while_starting);
    ADD(coordinator_state_kept_without_steps);
    ADD(ssp_staleness);
    ADD(chaos);
    ADD(status_after_idle);
#undef ADD
    return s;
}
