/* test_compression.c: gradient compression across real processes on 127.0.0.1: workers
 * pushing with different codecs end with the parameters of the single-process reference that
 * encodes each rank's gradient the same way, compression cuts the bytes pushed, a hostile peer's
 * malformed payloads are refused one by one without harming the job, two ASP workers with
 * different codecs both finish, and bad job.compression keys are refused with FILE:LINE: KEY.
 *
 * The tests assert behaviour and byte counts, never timings: every wait is generous and only
 * bounds a hang (see CL_BUDGET_S in cluster.h). */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "expect.h"

/* ---- (a) mixed codecs equal the reference ------------------------------------------------ */

/*
 * Two shards, two BSP workers under job.compression @p compression: worker A (rank 0) pushes
 * with the manifest's codec, worker B (rank 1) with `--codec CODEC_B`. Both end with the
 * parameters of `psworker --local --rank-codec 1=CODEC_B` (bit-identical today; the test allows
 * 1e-6 relative), and not with those of the reference where rank 1 uses the manifest's codec
 * too: B's codec was used. With @p others_first, the shards' stores hold two other tensors
 * before (a replay_client declares them and is killed), so that their ids are not the model's
 * indices: random-k and stochastic int8 seed by the tensor's name (psk_codec_tensor_key) in
 * both; before session 60 the cluster seeded by psd's id, and the reference differed.
 */
static void mixed_codecs(const char *compression, const char *codec_b, bool others_first)
{
    char extra[256];
    snprintf(extra, sizeof extra, "  compression: %s\n", compression);
    cl_conf_t k = {.shards = 2,
                   .workers = 2,
                   .consistency = "bsp",
                   .optimizer = "{name: adam, lr: 0.001}",
                   .max_steps = 30,
                   .batch_size = 32,
                   .chunk_bytes = 65536,
                   .job_extra = extra,
                   .start_wait_ms = CL_TOGETHER_MS};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    if (others_first) {
        char nb[] = "16", bs[] = "8", mode[] = "unasked";
        char *argv[] = {(char *)cl_binary("REPLAY_CLIENT"), c->manifest, nb, bs, mode, NULL};
        cl_proc_t *o = cl_spawn(c, "others", argv);
        ck_assert_msg(cl_wait_log(o, "waits without asking for a batch", RUN_S) == 0,
                      "the other tensors were not declared: %s", cl_tail(o));
        ck_assert_int_eq(cl_signal(o, SIGKILL), 0);
        cl_wait(o, RUN_S);
        char left[48];
        snprintf(left, sizeof left, "(pid %d) left at step 0", (int)o->pid);
        ck_assert_msg(cl_wait_log(psd[0], left, RUN_S) == 0, "%s", cl_tail(psd[0]));
    }

    /* A first, joined before B starts, so that A is rank 0 and B rank 1. */
    cl_proc_t *a = cl_worker_start(c, NULL, "a.params", false);
    ck_assert_msg(cl_wait_log(a, "joined at step", RUN_S) == 0, "%s did not join; its log: %s",
                  a->name, cl_tail(a));
    EXPECT_LOG(a, "psworker: rank 0 joined at step 0 (30 planned for job.workers 2; ");
    const char *xb[] = {"--codec", codec_b, NULL};
    cl_proc_t *b = cl_worker_spawn(c, NULL, "b.params", false, xb);
    EXPECT_EXIT(a, 0);
    EXPECT_EXIT(b, 0);
    EXPECT_LOG(b, "psworker: rank 1 joined at step 0 (30 planned for job.workers 2; ");
    char said[96];
    snprintf(said, sizeof said, "psworker: --codec %s replaces job.compression.codec; ", codec_b);
    EXPECT_LOG(b, said);

    char rank_codec[64];
    snprintf(rank_codec, sizeof rank_codec, "1=%s", codec_b);
    const char *xr[] = {"--rank-codec", rank_codec, NULL};
    cl_proc_t *ref = cl_worker_spawn(c, NULL, "local.params", true, xr);
    EXPECT_EXIT(ref, 0);
    expect_same_params(a->params, ref->params, 1e-6, 0);
    expect_same_params(b->params, ref->params, 1e-6, 0);

    cl_proc_t *uniform = cl_worker_start(c, NULL, "local-uniform.params", true);
    EXPECT_EXIT(uniform, 0);
    char why[512];
    int rc = cl_params_compare_files(a->params, uniform->params, 1e-6, 0, why, sizeof why);
    ck_assert_msg(rc == 1,
                  "the cluster also matches the reference where rank 1 pushes with the manifest's "
                  "codec (compare: %d, %s): did --codec %s take effect?",
                  rc, why, codec_b);

    stop_all(psd, 2);
    cl_cluster_destroy(c);
}

START_TEST(test_mixed_topk_int8)
{
    mixed_codecs("{codec: \"topk:0.1\", pull: bf16}", "int8", false);
}
END_TEST

START_TEST(test_mixed_randomk_sign)
{
    mixed_codecs("{codec: \"randomk:0.05\", error_feedback: true, pull: fp16}", "sign", true);
}
END_TEST

/* ---- (b) compression cuts the bytes pushed ----------------------------------------------- */

/* The value of "KEY": N in a JSON line, or -1. */
static long long json_uint(const char *line, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *s = strstr(line, pat);
    if (s == NULL) return -1;
    char *end;
    long long v = strtoll(s + strlen(pat), &end, 10);
    return end == s + strlen(pat) ? -1 : v;
}

/* Pushes the shards leave out as not finite once decoded, in a cluster and in its reference
 * alone: fp16 without error feedback, where a gradient of 65520 or more encodes as an infinity
 * (sgd, lr 5, diverging), and random-k with error feedback, where a NaN push's residual is put
 * back (lr 200). `psworker --local` decodes each push as psd does and puts back what libps
 * puts back: both workers end with its parameters. Before, the reference looked at the raw
 * gradient alone: it added the infinities, and kept what a left-out push took from the
 * residual (8624 and 3594 of fc1's 12544 values differed; a review, session 72). */
START_TEST(test_left_out_pushes_match_local)
{
    static const char *const runs[][2] = {
        {"{codec: fp16, error_feedback: false}", "{name: sgd, lr: 5}"},
        {"{codec: \"randomk:0.2\", error_feedback: true}", "{name: sgd, lr: 200}"},
    };
    for (int i = 0; i < 2; i++) {
        char extra[128];
        snprintf(extra, sizeof extra, "  compression: %s\n", runs[i][0]);
        cl_conf_t k = {.shards = 2, .workers = 2, .consistency = "bsp", .optimizer = runs[i][1],
                       .max_steps = 150, .batch_size = 32, .layers = "[784, 16, 10]",
                       .chunk_bytes = 16384,
                       .job_extra = extra, .start_wait_ms = CL_TOGETHER_MS};
        cl_cluster_t *c = cl_cluster_create(&k);
        cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S),
                             cl_psd_start(c, 1, NULL, READY_S)};
        cl_proc_t *w[2] = {cl_worker_start(c, NULL, "a.params", false),
                           cl_worker_start(c, NULL, "b.params", false)};
        EXPECT_EXIT(w[0], 0);
        EXPECT_EXIT(w[1], 0);
        ck_assert_msg(count_in_log(psd[0], "holding a NaN or an infinity") +
                              count_in_log(psd[1], "holding a NaN or an infinity") > 0,
                      "%s: no push was left out (the test's premise): %s", runs[i][0],
                      cl_tail(psd[0]));
        cl_proc_t *ref = cl_worker_start(c, NULL, "local.params", true);
        EXPECT_EXIT(ref, 0);
        expect_same_params(w[0]->params, ref->params, 1e-6, 0);
        expect_same_params(w[1]->params, ref->params, 1e-6, 0);
        stop_all(psd, 2);
        cl_cluster_destroy(c);
    }
}
END_TEST

/* topk:0.01 on the two weights above min_bytes: the last epoch line of --metrics-out counts
 * every step's raw bytes, and under a tenth of them on the wire. */
START_TEST(test_topk_cuts_bytes)
{
    const uint64_t steps = 20;
    cl_conf_t k = {.shards = 1,
                   .workers = 1,
                   .optimizer = "{name: adam, lr: 0.001}",
                   .max_steps = steps,
                   .batch_size = 32,
                   .layers = "[784, 256, 128, 10]",
                   .job_extra = "  compression: {codec: \"topk:0.01\"}\n"};
    /* 784*256 + 256 + 256*128 + 128 + 128*10 + 10 parameters, 4 bytes each, every step. */
    const long long raw_per_step = 4LL * 235146;
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    char metrics[CL_PATH];
    cl_path(c, "metrics.jsonl", metrics, sizeof metrics);
    const char *x[] = {"--metrics-out", metrics, NULL};
    cl_proc_t *w = cl_worker_spawn(c, NULL, NULL, false, x);
    EXPECT_EXIT(w, 0);
    stop_all(&psd, 1);

    char *text = cl_read_file(metrics, NULL);
    ck_assert_msg(text != NULL, "%s: cannot read", metrics);
    char *last = NULL;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        if (strstr(line, "\"epoch\": ")) last = line;
    ck_assert_msg(last != NULL, "%s has no epoch line", metrics);
    long long pushed = json_uint(last, "bytes_pushed");
    long long raw = json_uint(last, "bytes_pushed_raw");
    long long step = json_uint(last, "step");
    char line[512];
    snprintf(line, sizeof line, "%s", last);
    free(text);
    ck_assert_msg(step == (long long)steps, "last epoch line at step %lld, want %llu: %s", step,
                  (unsigned long long)steps, line);
    ck_assert_msg(raw == (long long)steps * raw_per_step,
                  "bytes_pushed_raw %lld, want %llu steps x %lld: %s", raw,
                  (unsigned long long)steps, raw_per_step, line);
    ck_assert_msg(pushed > 0 && pushed * 10 < raw,
                  "bytes_pushed %lld is not under a tenth of bytes_pushed_raw %lld: %s", pushed,
                  raw, line);
    cl_cluster_destroy(c);
}
END_TEST

/* ---- (c) a hostile peer ------------------------------------------------------------------ */

/*
 * One shard, job.workers 2 under ASP: a real worker (rank 0) trains alone while evil_peer
 * (rank 1, see evil_peer.c) sends one malformed push of fc3.weight's chunk 0 per case, each of
 * which must come back as an error naming the problem; a well-formed push before and after is
 * acknowledged, and chunk 0 stays finite. The worker finishes, psd survives and stops cleanly,
 * and psd logged a rejection for each payload refused after receipt (never applied). A push
 * whose CRC-32C does not match its payload is refused with PS_ECRC and never applied. Direct
 * pushes (server/pushshm.c) that point outside the peer's push area, at an unaligned place,
 * carry data or a codec are refused; one whose bytes do not match its CRC too; a right one is
 * acknowledged. Control messages: undecodable headers are each answered and logged once; a
 * launcher's report of 2^32 - 1 workers is refused; a hello asking for the worker's rank with
 * its pid but not its join serial is refused (the worker keeps it); a connection that never
 * says anything is closed.
 */
/* One asp shard of two ranks with a worker training @p steps joined as rank 0; the other rank
 * is left for evil_peer. */
static cl_cluster_t *shard_with_worker(uint64_t steps, cl_proc_t **psd, cl_proc_t **w)
{
    cl_conf_t k = {.shards = 1,
                   .workers = 2,
                   .consistency = "asp",
                   .optimizer = "{name: adam, lr: 0.001}",
                   .max_steps = steps,
                   .batch_size = 32,
                   .layers = "[784, 256, 128, 10]"};
    cl_cluster_t *c = cl_cluster_create(&k);
    *psd = cl_psd_start(c, 0, NULL, READY_S);
    *w = cl_worker_start(c, NULL, "w.params", false);
    ck_assert_msg(cl_wait_log(*w, "joined at step", RUN_S) == 0, "%s did not join; its log: %s",
                  (*w)->name, cl_tail(*w));
    return c;
}

START_TEST(test_hostile_peer)
{
    cl_proc_t *psd, *w;
    /* 900 steps: the worker still holds rank 0 when evil_peer asks for it (the test of
     * that hello needs a member; 300 steps ended 0.7 s after it in a run). */
    cl_cluster_t *c = shard_with_worker(900, &psd, &w);
    EXPECT_LOG(w, "psworker: rank 0 joined at step 0 (900 planned for job.workers 2; ");

    char victim[16];
    snprintf(victim, sizeof victim, "%d", (int)w->pid);
    char *argv[] = {(char *)cl_binary("EVIL_PEER"), "--manifest", c->manifest, "--victim-pid",
                    victim, NULL};
    cl_proc_t *evil = cl_spawn(c, "evil_peer", argv);
    EXPECT_EXIT(evil, 0);
    EXPECT_LOG(evil, "evil_peer: 11 of 11 malformed pushes refused as expected (8 after receipt)");
    EXPECT_LOG(evil, "evil_peer: case bad-crc: refused (ECRC)");
    EXPECT_LOG(evil, "evil_peer: bad-crc push sent again with the right CRC: acknowledged");
    EXPECT_LOG(evil, "evil_peer: 8 of 8 malformed direct pushes refused as expected");
    EXPECT_LOG(evil, "evil_peer: direct push with a wrong CRC: refused (ECRC)");
    EXPECT_LOG(evil, "evil_peer: direct push: acknowledged");
    EXPECT_LOG(evil, "evil_peer: 5 of 5 malformed bundles refused as expected");
    EXPECT_LOG(evil, "evil_peer: well-formed bundle with a push: acknowledged in a bundle");
    EXPECT_LOG(evil, "evil_peer: 5 undecodable headers: each answered");
    EXPECT_LOG(evil, "evil_peer: launch of -1 workers: refused (");
    EXPECT_LOG(evil, "evil_peer: hello for rank 0 with its worker's pid and no join serial: "
                     "refused (");
    EXPECT_LOG(evil, "evil_peer: top-k push of a mean tensor: refused (");
    EXPECT_LOG(evil, "evil_peer: a declaration with init_arg inf: refused (");
    EXPECT_LOG(evil, "evil_peer: the connection that said nothing: closed by psd");
    EXPECT_LOG(evil, "evil_peer: every check held");
    EXPECT_EXIT(w, 0);
    EXPECT_LOG(w, "after 900 steps");

    /* fc3.weight is tensor 4 (the worker declared fc1.weight .. fc3.bias in order). */
    int rejected = count_in_log(psd, "rejected a malformed 4/0 payload from rank");
    ck_assert_msg(rejected == 8, "psd logged %d rejected payloads, want 8; its log: %s", rejected,
                  cl_tail(psd));
    ck_assert_int_eq(count_in_log(psd, "rejected a malformed"), 8);
    /* Each says what is wrong: an int8 scale whose 127-fold is no float (accepted before). */
    ck_assert_int_eq(count_in_log(psd, "payload from rank 1: the scale of block 0 is 1e+37 (0 to "
                                       "FLT_MAX / 127, so that 127 x scale is finite)"), 1);
    /* The bad-crc push and the direct push with a wrong CRC. */
    ck_assert_int_eq(count_in_log(psd, "checksum mismatch on the 4/0 push from rank 1"), 2);
    /* The malformed bundles and the undecodable headers came on one connection: logged once
     * (each was answered); the worker kept its rank. */
    ck_assert_int_eq(count_in_log(psd, "more malformed messages of this connection are "
                                       "answered, not logged"), 1);
    ck_assert_int_eq(count_in_log(psd, "says hello again"), 0);
    EXPECT_LOG(psd, "with join serial 0, but that member joined as serial 1");
    EXPECT_LOG(psd, "closed: it said nothing within");
    ck_assert_msg(cl_alive(psd), "psd died; its log: %s", cl_tail(psd));
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* A peer sending 3000 messages made at random from valid ones (evil_peer --fuzz: wrong ranks,
 * tensors, chunks, steps, lengths, codecs, flags, declarations, replies sent to the server,
 * data on the wrong AM id) while a worker trains: psd keeps serving both, answers the peer's
 * pull and acknowledges its push afterwards, and the worker finishes. */
START_TEST(test_random_peer)
{
    cl_proc_t *psd, *w;
    cl_cluster_t *c = shard_with_worker(200, &psd, &w);
    char n[] = "3000";
    char *argv[] = {(char *)cl_binary("EVIL_PEER"), "--manifest", c->manifest, "--fuzz", n, NULL};
    cl_proc_t *evil = cl_spawn(c, "evil_peer", argv);
    EXPECT_EXIT(evil, 0);
    EXPECT_LOG(evil, "evil_peer: 3000 random messages sent");
    EXPECT_LOG(evil, "evil_peer: pull after the random messages: chunk 0 at version");
    EXPECT_LOG(evil, "evil_peer: well-formed push after the random messages: acknowledged");
    EXPECT_EXIT(w, 0);
    EXPECT_LOG(w, "after 200 steps");
    ck_assert_msg(cl_alive(psd), "psd died; its log: %s", cl_tail(psd));
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* ---- (e) ASP with compressed pushes from two workers ------------------------------------ */

/* Every value of a PSPARAM1 file is finite. */
static void expect_finite(const char *path)
{
    cl_params_t p;
    char err[512];
    ck_assert_msg(cl_params_read(&p, path, err, sizeof err) == 0, "%s", err);
    for (uint32_t t = 0; t < p.ntensors; t++) {
        uint64_t bad = 0;
        for (uint64_t i = 0; i < p.t[t].numel; i++)
            bad += !isfinite(p.t[t].v[i]);
        ck_assert_msg(bad == 0, "%s: %s has %llu values that are not finite", path, p.t[t].name,
                      (unsigned long long)bad);
    }
    cl_params_free(&p);
}

/* One shard, two ASP workers pushing the same chunks at once, rank 0 with topk:0.1 and rank 1
 * with int8: shard updates overlap with pushes arriving for the chunks being updated. Both
 * finish every step and end with finite parameters (ASP results depend on arrival order, so
 * nothing more is compared). */
START_TEST(test_asp_mixed_codecs)
{
    cl_conf_t k = {.shards = 1,
                   .workers = 2,
                   .consistency = "asp",
                   .optimizer = "{name: adam, lr: 0.001}",
                   .max_steps = 100,
                   .batch_size = 32,
                   .job_extra = "  compression: {codec: \"topk:0.1\", min_bytes: 0}\n"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    cl_proc_t *a = cl_worker_start(c, NULL, "a.params", false);
    const char *xb[] = {"--codec", "int8", NULL};
    cl_proc_t *b = cl_worker_spawn(c, NULL, "b.params", false, xb);
    EXPECT_EXIT(a, 0);
    EXPECT_EXIT(b, 0);
    EXPECT_LOG(a, "after 100 steps");
    EXPECT_LOG(b, "after 100 steps");
    expect_finite(a->params);
    expect_finite(b->params);
    ck_assert_msg(cl_alive(psd), "psd died; its log: %s", cl_tail(psd));
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* ---- (d) bad compression settings -------------------------------------------------------- */

/* psd and psworker exit 2 naming FILE:LINE: job.compression.KEY and the value. */
static void bad_compression(const char *key, const char *value)
{
    char extra[128];
    snprintf(extra, sizeof extra, "  compression:\n    %s: \"%s\"\n", key, value);
    cl_conf_t k = {.shards = 1, .job_extra = extra};
    cl_cluster_t *c = cl_cluster_create(&k);
    char at[32];
    snprintf(at, sizeof at, "%s: \"%s\"", key, value);
    int line = cl_line_of(c->manifest, at);
    ck_assert_int_gt(line, 0);
    char want[CL_PATH + 96];
    snprintf(want, sizeof want, "%s:%d: job.compression.%s: ", c->manifest, line, key);

    cl_proc_t *s = cl_psd_spawn(c, 0, NULL);
    EXPECT_EXIT(s, 2);
    EXPECT_LOG(s, want);
    EXPECT_LOG(s, value);
    cl_proc_t *w = cl_worker_start(c, NULL, NULL, false);
    EXPECT_EXIT(w, 2);
    EXPECT_LOG(w, want);
    cl_cluster_destroy(c);
}

START_TEST(test_bad_codec)
{
    bad_compression("codec", "topk:2");
}
END_TEST

START_TEST(test_bad_pull)
{
    bad_compression("pull", "int8");
}
END_TEST

/* psworker --codec with a bad name: exit 2 naming it, before anything starts. */
START_TEST(test_bad_codec_flag)
{
    cl_conf_t k = {.shards = 1};
    cl_cluster_t *c = cl_cluster_create(&k);
    const char *x[] = {"--codec", "topk:2", NULL};
    cl_proc_t *w = cl_worker_spawn(c, NULL, NULL, false, x);
    EXPECT_EXIT(w, 2);
    EXPECT_LOG(w, "--codec topk:2: unknown codec: none, fp16, bf16, int8, sign, topk:F or "
                  "randomk:F with F in (0, 1]");
    cl_cluster_destroy(c);
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("compression");
    suite_add_tcase(s, tcase("mixed_topk_int8", test_mixed_topk_int8));
    suite_add_tcase(s, tcase("mixed_randomk_sign", test_mixed_randomk_sign));
    suite_add_tcase(s, tcase("left_out_pushes_match_local", test_left_out_pushes_match_local));
    suite_add_tcase(s, tcase("topk_cuts_bytes", test_topk_cuts_bytes));
    suite_add_tcase(s, tcase("hostile_peer", test_hostile_peer));
    suite_add_tcase(s, tcase("random_peer", test_random_peer));
    suite_add_tcase(s, tcase("asp_mixed_codecs", test_asp_mixed_codecs));
    suite_add_tcase(s, tcase("bad_codec", test_bad_codec));
    suite_add_tcase(s, tcase("bad_pull", test_bad_pull));
    suite_add_tcase(s, tcase("bad_codec_flag", test_bad_codec_flag));
    return s;
}
