/* asp_client.c: a libps worker for the test of pushes applied exactly once under asp
 * (test_faults.c, lost_ack_*). Test code, not part of psd.
 *
 *   asp_client MANIFEST NUMEL PUSHES [--interrupt | --enomem]
 *
 * Joins the cluster (consistency asp, optimizer sgd with lr 1), declares tensor "asp.t" of
 * NUMEL floats (zeros), pushes a gradient of -1 everywhere PUSHES times, each push waited for
 * before the next, then pulls: every push applied exactly once leaves every value equal to
 * PUSHES (sgd: p - lr * g adds 1 per update, exactly, for any count a float holds). Exit 0
 * with "PUSHES pushes, each applied once" on stdout; 1 with the first element that is off
 * (how many times it was updated) or the libps error. While its first push is in flight, a
 * second push of the tensor and a change of its compression must be refused (PS_EBUSY).
 * --enomem (with alloc_count.so preloaded and counting this program): the pushes go as fp16 with
 * error feedback (exact for -1); after the first, a change of compression to bf16 both ways
 * whose last allocation fails (alloc_count_fail_next) must fail with PS_ENOMEM and leave the
 * tensor as it was, so the pushes after it go on as before.
 * --misuse: before the pushes, calls that misuse the API (declarations psd could not hold,
 * NULL arguments, push_none under asp, encoded pushes without an encoder, without a codec or
 * with a malformed payload, a batch of a training set of 0, a handle waited for twice) must each
 * be refused with PS_EINVAL and the reason (a failing encoder's own code passed on), and change
 * nothing: the pushes then go on as usual.
 * Prints "asp_client: misuse: N calls refused" or the first call that was not.
 * --skew (2 shards, chunk_bytes 1 MiB; NUMEL 1): instead of the pushes, declares pairs of a
 * 1 MiB tensor of one chunk and a 1-value one, so that every large chunk lands on shard 1 (chunk
 * ordinals alternate between the shards), until one is refused. Exit 0 when that is
 * PS_ESTOREFULL (printed: "asp_client: skew: declaration K refused: ...").
 * --unwaited: after the PUSHES pushes (each waited for: the waiting caller drives the UCP
 * worker, and libps's comm thread stands aside for a while), one push more that is not waited
 * for must leave by itself: its chunks counted as sent (ps_client_stats) within 5 s with no
 * call into libps but that; then it is waited for, and the check counts PUSHES + 1. Prints
 * "asp_client: a push not waited for left by itself" or that it did not.
 * --refused (psd with PS_TEST_REFUSE_PUSH=1; NUMEL 1000): the pushes go as topk:0.01 with error
 * feedback; the first is refused by the shard (PS_ENOMEM, naming its chunk) and must fail, the
 * other PUSHES - 1 are taken, then NUMEL / 10 pushes of zeros empty the residual (each sends
 * the 10 largest it holds, exactly): every value must be PUSHES - 1. Before, the refused push's
 * unsent part stayed in the residual and went out too (PUSHES for all but its 10 sent values).
 * Prints "asp_client: a refused push left the residual as it was".
 * --marked (NUMEL within one chunk, PUSHES 1): the tensor compressed int8 with error feedback,
 * one push whose encoder marks its payload as a device does for a chunk holding a NaN (the kind
 * byte 0xff): the push must succeed, the shard leave the chunk out (a pull reads what one read
 * before it).
 * ASP_BEFORE=K in the environment: K pushes of -1 of an earlier worker are applied besides (one
 * that died after its push landed): every value must be PUSHES + K.
 * Before, the push was refused (PS_EINVAL) and psworker --device cuda exited. Prints
 * "asp_client: a chunk the device marked was left out". */
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps/ps_client.h"

static ps_client_t *g_client;

/* alloc_count.so's (alloc_count.c), when it is preloaded: the next allocation fails. */
void alloc_count_fail_next(void) __attribute__((weak));

/* --enomem, after the first push: a change of compression that runs out of memory at its last
 * allocation (the pull buffer) must fail and change nothing. 0 when it did. */
static int compression_change_fails(ps_client_t *c, uint32_t id)
{
    if (alloc_count_fail_next == NULL) {
        printf("asp_client: --enomem: alloc_count.so is not preloaded\n");
        return 1;
    }
    ps_compression_t bf16 = {.codec = "bf16", .pull = "bf16"};
    alloc_count_fail_next();
    int rc = ps_client_set_compression(c, id, &bf16);
    printf("asp_client: compression change without memory: %s\n",
           rc == PS_ENOMEM ? ps_client_error(c) : "not refused");
    return rc == PS_ENOMEM ? 0 : 1;
}

/* One misuse check: @p rc must be PS_EINVAL and ps_client_error() must hold @p why. */
static int refused(ps_client_t *c, const char *what, int rc, const char *why, int *n)
{
    if (rc == PS_EINVAL && strstr(ps_client_error(c), why)) {
        (*n)++;
        return 0;
    }
    printf("asp_client: misuse: %s gave %d (%s), want PS_EINVAL with \"%s\"\n", what, rc,
           ps_client_error(c), why);
    return 1;
}

/* Encoders for ps_client_push_encoded's misuse: one writes a payload of the right size whose
 * header is not its codec's, one fails. */
static int bad_payload(void *arg, uint32_t id, uint32_t chunk, uint64_t offset, size_t n,
                       const void *codec, int ef, uint8_t *out, size_t cap, size_t *len)
{
    *len = 16 + 2 * n; /* fp16's size */
    if (*len > cap) return PS_EINVAL;
    memset(out, 0x7e, *len);
    return 0;
}

static int failing_encoder(void *arg, uint32_t id, uint32_t chunk, uint64_t offset, size_t n,
                           const void *codec, int ef, uint8_t *out, size_t cap, size_t *len)
{
    return PS_EIO;
}

/* --misuse: see the top of the file. The tensor @p id is declared and nothing is in flight. */
static int misuse(ps_client_t *c, uint32_t id, float *g, float *got)
{
    int n = 0, bad = 0;
    uint32_t other;
    ps_tensor_desc_t d = {.name = "bad", .shape = {4, 0}, .ndim = 2};
    bad |= refused(c, "a zero dimension", ps_client_declare(c, &d, &other), "zero dimension", &n);
    d = (ps_tensor_desc_t){.name = "bad", .shape = {1u << 20, 1u << 20}, .ndim = 2};
    bad |= refused(c, "2^40 values", ps_client_declare(c, &d, &other), "larger than", &n);
    d = (ps_tensor_desc_t){.name = "bad", .shape = {4}, .ndim = 1, .init = 7};
    bad |= refused(c, "initializer 7", ps_client_declare(c, &d, &other), "initializer 7", &n);
    d.init = 5; /* the values one, without values: psd asked for them (a review, session 73) */
    bad |= refused(c, "initializer 5", ps_client_declare(c, &d, &other), "initializer 5", &n);
    d = (ps_tensor_desc_t){.name = "", .shape = {4}, .ndim = 1};
    bad |= refused(c, "an empty name", ps_client_declare(c, &d, &other), "empty tensor name", &n);
    d = (ps_tensor_desc_t){.name = "bad", .shape = {4}, .ndim = 1, .init = 1, .init_arg = NAN};
    bad |= refused(c, "a NaN init_arg", ps_client_declare(c, &d, &other), "non-finite", &n);
    d = (ps_tensor_desc_t){.name = "bad", .shape = {4}, .ndim = 1};
    bad |= refused(c, "a NULL id", ps_client_declare(c, &d, NULL), "id is NULL", &n);
    ps_op_t *op;
    bad |= refused(c, "a NULL gradient", ps_client_push(c, id, NULL, 0, &op), "the gradient", &n);
    bad |= refused(c, "a NULL destination", ps_client_pull(c, id, NULL, 0, &op),
                   "the destination", &n);
    bad |= refused(c, "a NULL op", ps_client_push(c, id, g, 0, NULL), "op is NULL", &n);
    bad |= refused(c, "push_none under asp", ps_client_push_none(c, id, 0, &op), "only under bsp",
                   &n);
    /* Encoded pushes: no encoder, a tensor without a codec, a payload that is not its codec's
     * (refused before it is sent), an encoder's own failure (passed on). */
    bad |= refused(c, "a NULL encoder", ps_client_push_encoded(c, id, 0, NULL, NULL, &op),
                   "the encoder is NULL", &n);
    bad |= refused(c, "an encoded push without a codec",
                   ps_client_push_encoded(c, id, 0, bad_payload, NULL, &op), "has no codec", &n);
    ps_compression_t fp16 = {.codec = "fp16", .error_feedback = 0};
    if (ps_client_set_compression(c, id, &fp16) != 0) {
        printf("asp_client: misuse: fp16: %s\n", ps_client_error(c));
        bad = 1;
    }
    bad |= refused(c, "a malformed encoded payload",
                   ps_client_push_encoded(c, id, 0, bad_payload, NULL, &op),
                   "is not a valid one of its codec", &n);
    int erc = ps_client_push_encoded(c, id, 0, failing_encoder, NULL, &op);
    if (erc != PS_EIO || !strstr(ps_client_error(c), "cannot encode chunk 0")) {
        printf("asp_client: misuse: a failing encoder gave %d (%s)\n", erc, ps_client_error(c));
        bad = 1;
    }
    ps_compression_t none = {.codec = "none"};
    if (ps_client_set_compression(c, id, &none) != 0) bad = 1;
    ps_batch_info_t b;
    bad |= refused(c, "0 samples", ps_client_next_batch(c, 0, NULL, &b), "0 samples", &n);
    char lanes[64];
    bad |= refused(c, "shard 99", ps_client_lanes(c, 99, lanes, sizeof lanes), "shard 99", &n);
    /* A handle waited for twice: the second wait is refused, and the tensor is not left busy. */
    int rc = ps_client_pull(c, id, got, 0, &op);
    if (rc == 0) rc = ps_op_wait(op, NULL);
    if (rc) {
        printf("asp_client: misuse: a pull: %s\n", ps_client_error(c));
        bad = 1;
    } else {
        bad |= refused(c, "a second wait", ps_op_wait(op, NULL), "waited for already", &n);
    }
    /* Waits on NULL handles (a push_many's skipped tensors): each status and version 0 (a
     * review, session 73: versions[i] was left as it was). */
    ps_op_t *none3[3] = {NULL, NULL, NULL};
    uint64_t vers[3] = {77, 77, 77};
    int sts[3] = {5, 5, 5};
    if (ps_op_wait_many(3, none3, vers, sts) != 0 || vers[0] || vers[1] || vers[2] || sts[0] ||
        sts[1] || sts[2]) {
        printf("asp_client: misuse: waits on NULL handles gave versions %llu %llu %llu, "
               "statuses %d %d %d\n", (unsigned long long)vers[0], (unsigned long long)vers[1],
               (unsigned long long)vers[2], sts[0], sts[1], sts[2]);
        bad = 1;
    }
    if (ps_client_error(NULL) == NULL) bad = 1;
    ps_client_interrupt(NULL);
    if (!bad) printf("asp_client: misuse: %d calls refused\n", n);
    return bad;
}

static void on_sigterm(int sig)
{
    (void)sig;
    if (g_client) ps_client_interrupt(g_client);
}

/* --skew: see the top of the file. */
static int skew(ps_client_t *c)
{
    for (int i = 0; i < 256; i++) {
        char nm[32];
        uint32_t id;
        snprintf(nm, sizeof nm, "skew.big%d", i);
        ps_tensor_desc_t d = {.name = nm, .shape = {1u << 18}, .ndim = 1};
        int rc = ps_client_declare(c, &d, &id);
        if (rc == 0) {
            snprintf(nm, sizeof nm, "skew.pad%d", i);
            d = (ps_tensor_desc_t){.name = nm, .shape = {1}, .ndim = 1};
            rc = ps_client_declare(c, &d, &id);
        }
        if (rc == 0) continue;
        printf("asp_client: skew: declaration %d refused: %s\n", i, ps_client_error(c));
        return rc == PS_ESTOREFULL ? 0 : 1;
    }
    printf("asp_client: skew: no declaration refused\n");
    return 1;
}

/* --unwaited: push @p k without waiting for it, and wait for its chunks to be counted as
 * sent; then wait for it. 0 when it left by itself and was acknowledged. */
static int unwaited_push(ps_client_t *c, uint32_t id, const float *g, uint64_t k)
{
    ps_client_stats_t before, now;
    ps_client_stats(c, &before);
    ps_op_t *op;
    if (ps_client_push(c, id, g, k, &op) != 0) {
        printf("asp_client: unwaited push: %s\n", ps_client_error(c));
        return 1;
    }
    now = before;
    for (int ms = 0; ms < 5000 && now.pushes == before.pushes; ms += 10) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
        ps_client_stats(c, &now);
    }
    int left = now.pushes > before.pushes;
    printf("asp_client: a push not waited for %s\n",
           left ? "left by itself" : "was not sent within 5 s");
    int rc = ps_op_wait(op, NULL);
    if (rc) printf("asp_client: unwaited push: %s\n", ps_client_error(c));
    return left && rc == 0 ? 0 : 1;
}

/* --interrupt: say "ready", wait for SIGUSR1, push once and wait; SIGTERM interrupts the wait
 * (test_faults.c, sigterm_shard_stopped: the shard is stopped before SIGUSR1, so a rendezvous
 * push stays with UCX). Exit 3 when the wait ended with PS_ECANCELED. */
static int interrupted_push(ps_client_t *c, uint32_t id, const float *g)
{
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, NULL);
    printf("asp_client: ready\n");
    fflush(stdout);
    int sig;
    sigwait(&usr1, &sig);
    ps_op_t *op;
    int rc = ps_client_push(c, id, g, 0, &op);
    if (rc == 0) {
        printf("asp_client: push started\n"); /* the test's SIGTERM comes after it */
        fflush(stdout);
        rc = ps_op_wait(op, NULL);
    }
    printf("asp_client: push: %s\n", rc ? ps_client_error(c) : "acknowledged");
    fflush(stdout);
    return rc == PS_ECANCELED ? 3 : 1;
}

/* An int8 payload of @p n values as psk_codec_encode_cuda leaves it for a chunk holding a NaN:
 * its header (kind, flags, n, block) with the kind byte 0xff, the body zeros. */
static int marked_encoder(void *arg, uint32_t id, uint32_t chunk, uint64_t offset, size_t n,
                          const void *codec, int ef, uint8_t *out, size_t cap, size_t *len)
{
    uint32_t block = 256, nn = (uint32_t)n;
    *len = 16 + 4 * ((n + block - 1) / block) + n;
    if (*len > cap) return PS_EINVAL;
    memset(out, 0, *len);
    memcpy(out + 4, &nn, 4);
    memcpy(out + 8, &block, 4);
    out[0] = 0xff;
    return 0;
}

/* --marked: see the top. @p before and @p after: n floats each. */
static int marked_push(ps_client_t *c, uint32_t id, float *before, float *after, uint64_t n)
{
    ps_compression_t int8 = {.codec = "int8", .error_feedback = 1};
    ps_op_t *op;
    int rc = ps_client_pull(c, id, before, 0, &op);
    if (rc == 0) rc = ps_op_wait(op, NULL);
    if (rc == 0) rc = ps_client_set_compression(c, id, &int8);
    if (rc == 0) rc = ps_client_push_encoded(c, id, 0, marked_encoder, NULL, &op);
    if (rc == 0) rc = ps_op_wait(op, NULL);
    if (rc == 0) rc = ps_client_pull(c, id, after, 0, &op);
    if (rc == 0) rc = ps_op_wait(op, NULL);
    if (rc) {
        printf("asp_client: marked: %s\n", ps_client_error(c));
        return 1;
    }
    for (uint64_t i = 0; i < n; i++)
        if (after[i] != before[i]) {
            printf("asp_client: marked: element %" PRIu64 " went from %g to %g: applied\n", i,
                   (double)before[i], (double)after[i]);
            return 1;
        }
    printf("asp_client: a chunk the device marked was left out\n");
    return 0;
}

/* --refused: see the top. 0 when every value is pushes - 1. */
static int refused_push(ps_client_t *c, uint32_t id, float *g, float *got, uint64_t n,
                        uint64_t pushes)
{
    ps_compression_t topk = {.codec = "topk:0.01", .error_feedback = 1};
    if (ps_client_set_compression(c, id, &topk) != 0) {
        printf("asp_client: compression: %s\n", ps_client_error(c));
        return 1;
    }
    ps_op_t *op;
    for (uint64_t k = 0; k < pushes + n / 10; k++) {
        if (k == pushes) memset(g, 0, n * sizeof *g); /* the residual's turn */
        int rc = ps_client_push(c, id, g, k, &op);
        if (rc == 0) rc = ps_op_wait(op, NULL);
        if (k == 0 && rc == PS_ENOMEM) {
            printf("asp_client: push 0 refused: %s\n", ps_client_error(c));
            continue;
        }
        if (rc != 0 || k == 0) {
            printf("asp_client: push %" PRIu64 ": %s\n", k, rc ? ps_client_error(c)
                                                               : "taken (not refused)");
            return 1;
        }
    }
    if (ps_client_pull(c, id, got, 0, &op) != 0 || ps_op_wait(op, NULL) != 0) {
        printf("asp_client: pull: %s\n", ps_client_error(c));
        return 1;
    }
    uint64_t off = 0;
    for (uint64_t i = 0; i < n; i++) off += got[i] != (float)(pushes - 1);
    for (uint64_t i = 0; i < n && off; i++)
        if (got[i] != (float)(pushes - 1)) {
            printf("asp_client: %" PRIu64 " values off, element %" PRIu64 " is %.9g, want %"
                   PRIu64 "\n", off, i, (double)got[i], pushes - 1);
            return 1;
        }
    printf("asp_client: a refused push left the residual as it was\n");
    return 0;
}

int main(int argc, char **argv)
{
    int interrupt = argc == 5 && strcmp(argv[4], "--interrupt") == 0;
    int enomem = argc == 5 && strcmp(argv[4], "--enomem") == 0;
    int misused = argc == 5 && strcmp(argv[4], "--misuse") == 0;
    int skewed = argc == 5 && strcmp(argv[4], "--skew") == 0;
    int unwaited = argc == 5 && strcmp(argv[4], "--unwaited") == 0;
    int refused = argc == 5 && strcmp(argv[4], "--refused") == 0;
    int marked = argc == 5 && strcmp(argv[4], "--marked") == 0;
    if (argc != 4 && !interrupt && !enomem && !misused && !skewed && !unwaited && !refused &&
        !marked) {
        fprintf(stderr, "usage: asp_client MANIFEST NUMEL PUSHES [--interrupt | --enomem | "
                "--misuse | --skew | --unwaited | --refused | --marked]\n");
        return 2;
    }
    uint64_t n = strtoull(argv[2], NULL, 10), pushes = strtoull(argv[3], NULL, 10);
    if (n == 0 || n > (1u << 24) || pushes == 0 || pushes > (1u << 20)) {
        fprintf(stderr, "asp_client: NUMEL in [1, 2^24], PUSHES in [1, 2^20]\n");
        return 2;
    }
    char err[512];
    ps_client_t *c;
    if (ps_client_create(argv[1], NULL, &c, err, sizeof err)) {
        printf("asp_client: join: %s\n", err);
        return 1;
    }
    ps_tensor_desc_t d = {.name = "asp.t", .shape = {(uint32_t)n}, .ndim = 1, .init = 0};
    uint32_t id;
    float *g = malloc(n * sizeof *g), *got = malloc(n * sizeof *got);
    int rc = g == NULL || got == NULL ? 1 : 0;
    if (rc == 0 && ps_client_declare(c, &d, &id) != 0) {
        printf("asp_client: declare: %s\n", ps_client_error(c));
        rc = 1;
    }
    for (uint64_t i = 0; rc == 0 && i < n; i++) g[i] = -1.0f;
    ps_compression_t fp16_ef = {.codec = "fp16", .error_feedback = 1};
    if (rc == 0 && enomem && ps_client_set_compression(c, id, &fp16_ef) != 0) {
        printf("asp_client: compression: %s\n", ps_client_error(c));
        rc = 1;
    }
    if (rc == 0 && misused) rc = misuse(c, id, g, got);
    if (skewed || refused || marked) {
        if (rc == 0)
            rc = skewed    ? skew(c)
                 : refused ? refused_push(c, id, g, got, n, pushes)
                           : marked_push(c, id, g, got, n);
        ps_client_destroy(c);
        free(g);
        free(got);
        return rc;
    }
    if (rc == 0 && interrupt) {
        g_client = c;
        struct sigaction sa = {.sa_handler = on_sigterm};
        sigaction(SIGTERM, &sa, NULL);
        rc = interrupted_push(c, id, g);
        ps_client_destroy(c); /* says leave (the stopped shard cannot answer it) */
        free(g);
        free(got);
        return rc;
    }
    ps_op_t *op, *again;
    for (uint64_t k = 0; rc == 0 && k < pushes; k++) {
        if (ps_client_push(c, id, g, k, &op) != 0) {
            printf("asp_client: push %" PRIu64 ": %s\n", k, ps_client_error(c));
            rc = 1;
            break;
        }
        /* The first push not waited for yet: a second one, or a change of compression, is
         * refused (they would share the push's buffers) and changes nothing. */
        ps_compression_t fp16 = {.codec = "fp16"};
        if (k == 0 && (ps_client_push(c, id, g, k, &again) != PS_EBUSY ||
                       ps_client_set_compression(c, id, &fp16) != PS_EBUSY)) {
            printf("asp_client: a second push or a compression change during a push was taken "
                   "(%s)\n", ps_client_error(c));
            rc = 1;
        }
        if (k == 0 && rc == 0) printf("asp_client: busy: %s\n", ps_client_error(c));
        if (ps_op_wait(op, NULL) != 0) {
            printf("asp_client: push %" PRIu64 ": %s\n", k, ps_client_error(c));
            rc = 1;
        }
        if (rc == 0 && enomem && k == 0) rc = compression_change_fails(c, id);
    }
    if (rc == 0 && unwaited) {
        rc = unwaited_push(c, id, g, pushes);
        pushes++;
    }
    if (rc == 0 && (ps_client_pull(c, id, got, 0, &op) != 0 || ps_op_wait(op, NULL) != 0)) {
        printf("asp_client: pull: %s\n", ps_client_error(c));
        rc = 1;
    }
    const char *before = getenv("ASP_BEFORE");
    uint64_t want = pushes + (before ? strtoull(before, NULL, 10) : 0);
    for (uint64_t i = 0; rc == 0 && i < n; i++)
        if (got[i] != (float)want) {
            printf("asp_client: element %" PRIu64 " is %.9g after %" PRIu64
                   " pushes: updated %.9g times\n", i, (double)got[i], pushes, (double)got[i]);
            rc = 1;
        }
    if (rc == 0) printf("asp_client: %" PRIu64 " pushes, each applied once\n", pushes);
    fflush(stdout);
    free(g);
    free(got);
    ps_client_destroy(c);
    return rc;
}
