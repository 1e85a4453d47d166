/* replay_client.c: a libps worker for the test of a batch applied exactly once on every chunk
 * when its worker dies in the middle of its step (test_elastic.c, kill9_mid_step_*, and under
 * asp kill9_mid_batch_asp_applied_once).
 * Test code, not part of psd.
 *
 *   replay_client MANIFEST NBATCH BATCH DIE_STEP [ORDER]
 *
 * Joins the cluster (bsp, optimizer sgd with lr 1), declares tensors "replay.a" and
 * "replay.b" of NBATCH floats each (zeros; one chunk each, so on shards 0 and 1), and trains
 * one pass of NBATCH batches of BATCH samples from the coordinator: for batch j (its offset /
 * BATCH) it pushes a gradient of 1 at element j, 0 elsewhere, to both tensors. psd applies a
 * step's mean (bsp), so a batch applied once leaves its element at -1 (alone in its step) or
 * -1/2 (with the other worker's; asp: each push alone, -1); twice leaves it at -3/2 or below;
 * never, at 0.
 * The worker of rank 1, at step DIE_STEP, pushes only "replay.a", waits for its
 * acknowledgement (the step is applied there, with its gradient) and kills itself (SIGKILL)
 * before pushing "replay.b": its batch is handed to the survivor, whose push of it must be
 * applied on "replay.b" and not again on "replay.a".
 * Rank 0 pulls both tensors once the job is finished and checks every element: exit 0 with
 * "every batch applied once on both tensors"; 1 with the first element that is off.
 * ORDER "ba": every worker pushes "replay.b" first (the dying one then skips "replay.a").
 * A third character "+" ("ab+"): the dying one pushes both tensors (both acknowledged) and dies
 * before it reports the batch done: its batch is handed out again, and neither chunk may apply
 * it again.
 * DIE_STEP "rand:P" (any rank): at each batch, with probability P percent, the worker kills
 * itself before its first push, between its pushes or after both (before reporting the batch),
 * one of the three at random (seeded by its pid); one removed from the job (a restarted
 * coordinator whose saved state predates its join), or one that cannot join (shard 0 is down
 * and does not come back within the join's wait), exits 3.
 * DIE_STEP "plan:R@S/K[,R@S/K...]": the worker of rank R kills itself at step S after K of its
 * pushes (0, 1 or 2; each waited for), before reporting the batch; R "*": whatever its rank. "R@S/1n": it sends its first
 * push, does not wait for its acknowledgement, and dies 300 ms later. "R@S/Ks" (K 0 or 1): after
 * K pushes it stops itself (SIGSTOP) and, once continued, goes on with the batch.
 * REPLAY_NAP_MS=N in the environment: each batch takes N ms more (its "computation"), so that
 * a run lasts long enough for what a test does meanwhile.
 * DIE_STEP "unasked": it joins and declares, prints "waits without asking for a batch" and
 * waits for good (the test kills it), never asking for a batch.
 * DIE_STEP "check": no death, and the check at the end whatever this worker's rank (one that
 * joins a finished job may find rank 0 still held by members a restarted coordinator awaits).
 * REPLAY_EF=1 in the environment: both tensors push top-k of one value (fraction 0.5 / NBATCH),
 * as fp16, with error feedback, and the gradient's element is 1 + 2^-12: it goes out as 1 (so
 * the values applied are as without it; the residuals of earlier elements, 2^-12, never
 * outrank it) and leaves 2^-12 in the residual, unless the push is acknowledged as not summed
 * (its batch applied from another push), when libps takes it back (the residual there is 0).
 * The check then also reads both residuals (ps_client_residual) and prints how many of this
 * worker's pushes were not summed ("not summed: replay.a U, replay.b U"); an element that is
 * neither 0 nor 2^-12 is an error.
 * REPLAY_IDLE=1 in the environment: first declares "replay.idle" (one chunk, so on shard 0, and
 * "replay.a" then on shard 1, "replay.b" on shard 0), which it never pushes: a tensor that stays
 * at step 0 beside the trained ones (one of another model, a head no longer trained).
 * REPLAY_IDLE_UNTIL=K (with REPLAY_IDLE): "replay.idle" is pushed (a zero gradient) at the
 * steps below K, then never again: a head that stops being trained at step K.
 * REPLAY_IDLE=2: also "replay.idle2" (one chunk, on shard 0) between "replay.a" and "replay.b",
 * both then on shard 1: shard 0 holds no chunk a member pushes. */
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ps/ps_client.h"
#include "ps/ps_log.h"

static int push_wait(ps_client_t *c, uint32_t id, const float *g, uint64_t step)
{
    ps_op_t *op;
    int rc = ps_client_push(c, id, g, step, &op);
    return rc ? rc : ps_op_wait(op, NULL);
}

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* rand:P mode: die (SIGKILL) after @p pushes of batch @p j's two. */
static void random_death(int rank, uint64_t j, int pushes)
{
    printf("replay_client: rank %d dies with batch %" PRIu64 " after %d of its pushes\n", rank,
           j, pushes);
    fflush(stdout);
    raise(SIGKILL);
}

/* DIE_STEP "plan:...": the pushes after which rank @p rank dies at step @p step, or -1;
 * *@p nowait: the last of them is not waited for; *@p stop: it stops (SIGSTOP) instead of
 * dying, and carries on when continued. */
static int planned_death(const char *plan, int rank, uint64_t step, int *nowait, int *stop)
{
    for (const char *p = plan; p && *p;) {
        int r = -1, k, n = 0;
        unsigned long long s;
        bool any = *p == '*'; /* "*@S/K": whatever the rank */
        if ((any ? sscanf(p, "*@%llu/%d%n", &s, &k, &n) == 2
                 : sscanf(p, "%d@%llu/%d%n", &r, &s, &k, &n) == 3) &&
            (any || r == rank) && s == step) {
            *nowait = p[n] == 'n';
            *stop = p[n] == 's';
            return k;
        }
        p = strchr(p, ',');
        if (p) p++;
    }
    return -1;
}

/* DIE_STEP "plan:R@S/Ks": stop (SIGSTOP) after @p pushes of batch @p j's two, and carry on
 * when continued. Returns -1 (no death after it). */
static int stop_here(int rank, uint64_t step, uint64_t j, int pushes)
{
    printf("replay_client: rank %d stops at step %" PRIu64 " with batch %" PRIu64 " after %d of "
           "its pushes\n", rank, step, j, pushes);
    fflush(stdout);
    raise(SIGSTOP);
    printf("replay_client: rank %d continued\n", rank);
    fflush(stdout);
    return -1;
}

/* Whether an element was applied once: -1 / m for the m members whose mean its step applied
 * (bsp; asp applies each push alone: -1). Twice gives a sum of two such (-1/3 - 1/3, -1/2 - 1,
 * ...), which is none of them but for -1/2 - 1/2 (taken as once: the check cannot tell). */
static int applied_once(float x)
{
    for (int m = 1; m <= 8; m++)
        if (fabsf(x + 1.0f / (float)m) <= 1e-6f) return 1;
    return 0;
}

/* REPLAY_EF: of @p pushes[t] pushes of each tensor, those whose error feedback is back in the
 * residual (not summed); @p got: scratch. */
static int check_residuals(ps_client_t *c, const uint32_t id[2], uint64_t nb,
                           const uint64_t pushes[2], float *got)
{
    uint64_t unsummed[2];
    for (int t = 0; t < 2; t++) {
        if (ps_client_residual(c, id[t], got)) {
            printf("replay_client: residual: %s\n", ps_client_error(c));
            return 1;
        }
        uint64_t kept = 0;
        for (uint64_t j = 0; j < nb; j++) {
            if (got[j] != 0.0f && got[j] != 0x1p-12f) {
                printf("replay_client: replay.%c's residual at %" PRIu64 " is %a, want 0 or "
                       "0x1p-12\n", "ab"[t], j, (double)got[j]);
                return 1;
            }
            kept += got[j] != 0.0f;
        }
        unsummed[t] = pushes[t] - kept;
    }
    printf("replay_client: not summed: replay.a %" PRIu64 ", replay.b %" PRIu64 " (of %" PRIu64
           " and %" PRIu64 " pushes)\n", unsummed[0], unsummed[1], pushes[0], pushes[1]);
    return 0;
}

/* Rank 0 at the end: every element of both tensors applied exactly once. */
static int check(ps_client_t *c, const uint32_t id[2], uint64_t nb, uint64_t step, float *got)
{
    for (int t = 0; t < 2; t++) {
        ps_op_t *op;
        int rc = ps_client_pull(c, id[t], got, step, &op);
        if (rc == 0) rc = ps_op_wait(op, NULL);
        if (rc) {
            printf("replay_client: pull: %s\n", ps_client_error(c));
            return 1;
        }
        for (uint64_t j = 0; j < nb; j++)
            if (!applied_once(got[j])) {
                printf("replay_client: replay.%c[%" PRIu64 "] is %g: batch %" PRIu64
                       " applied %s\n",
                       "ab"[t], j, (double)got[j], j, got[j] == 0.0f ? "never" : "twice");
                return 1;
            }
    }
    printf("replay_client: every batch applied once on both tensors\n");
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* a killed client's last lines are in its log too */
    ps_log_set_level(NULL);           /* PS_LOG_LEVEL, as psworker */
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: replay_client MANIFEST NBATCH BATCH DIE_STEP [ab|ba|ab+|ba+]\n");
        return 2;
    }
    int first = argc == 6 && strncmp(argv[5], "ba", 2) == 0; /* the tensor pushed first */
    int both = argc == 6 && (strcmp(argv[5], "ab+") == 0 || strcmp(argv[5], "ba+") == 0);
    uint64_t nb = strtoull(argv[2], NULL, 10), batch = strtoull(argv[3], NULL, 10);
    uint64_t die = strtoull(argv[4], NULL, 10);
    int die_pct = strncmp(argv[4], "rand:", 5) == 0 ? atoi(argv[4] + 5) : -1;
    const char *plan = strncmp(argv[4], "plan:", 5) == 0 ? argv[4] + 5 : NULL;
    int check_any = strcmp(argv[4], "check") == 0;
    if (die_pct >= 0 || plan || check_any) die = UINT64_MAX; /* no death at a step of rank 1's */
    srand((unsigned)getpid());
    if (nb == 0 || nb > 4096 || batch == 0) {
        fprintf(stderr, "replay_client: NBATCH in [1, 4096], BATCH >= 1\n");
        return 2;
    }
    char err[512];
    ps_client_t *c;
    int rc = ps_client_create(argv[1], NULL, &c, err, sizeof err);
    if (rc) {
        printf("replay_client: join: %s\n", err);
        return die_pct >= 0 ? 3 : 1;
    }
    int rank = ps_client_rank(c), bad = 0;
    uint32_t id[2], idle;
    float *g = calloc(nb, sizeof *g), *got = calloc(nb, sizeof *got);
    const char *idles = getenv("REPLAY_IDLE");
    ps_tensor_desc_t di = {.name = "replay.idle", .shape = {1}, .ndim = 1};
    if (idles && atoi(idles) > 0 && ps_client_declare(c, &di, &idle)) {
        printf("replay_client: declare: %s\n", ps_client_error(c));
        bad = 1;
    }
    for (int t = 0; t < 2 && g && got && !bad; t++) {
        ps_tensor_desc_t d = {.name = t ? "replay.b" : "replay.a", .shape = {(uint32_t)nb},
                              .ndim = 1};
        di.name = "replay.idle2";
        if (t == 1 && idles && atoi(idles) > 1 && ps_client_declare(c, &di, &idle)) {
            printf("replay_client: declare: %s\n", ps_client_error(c));
            bad = 1;
            break;
        }
        rc = ps_client_declare(c, &d, &id[t]);
        if (rc) {
            printf("replay_client: declare: %s\n", ps_client_error(c));
            bad = rc == PS_ENOTMEMBER && die_pct >= 0 ? 3 : 1;
        }
    }
    bad |= g == NULL || got == NULL;
    const char *efs = getenv("REPLAY_EF");
    bool ef = efs && atoi(efs) > 0;
    for (int t = 0; t < 2 && ef && !bad; t++) {
        char topk[32];
        snprintf(topk, sizeof topk, "topk:%.9g", 0.5 / (double)nb); /* k = 1 */
        ps_compression_t cfg = {.field_mask = PS_COMPRESSION_FP16_VALUES, .codec = topk,
                                .error_feedback = 1, .fp16_values = 1};
        if (ps_client_set_compression(c, id[t], &cfg)) {
            printf("replay_client: compression: %s\n", ps_client_error(c));
            bad = 1;
        }
    }
    uint64_t pushes[2] = {0, 0}; /* acknowledged, of each tensor */
    if (!bad && strcmp(argv[4], "unasked") == 0) {
        printf("replay_client: rank %d waits without asking for a batch\n", rank);
        for (;;) pause();
    }
    ps_batch_info_t b, prev;
    const char *nap = getenv("REPLAY_NAP_MS");
    for (int k = 0; !bad; k++) {
        rc = ps_client_next_batch(c, nb * batch, k ? &prev : NULL, &b);
        if (rc == PS_ENOTMEMBER && die_pct >= 0) {
            printf("replay_client: rank %d was removed from the job\n", rank);
            bad = 3;
            break;
        }
        if (rc) {
            printf("replay_client: rank %d: next batch: %s\n", rank, ps_client_error(c));
            bad = 1;
            break;
        }
        if (b.finished) {
            if (rank == 0 || check_any) bad = check(c, id, nb, b.step, got);
            if (!bad && ef && (rank == 0 || check_any))
                bad = check_residuals(c, id, nb, pushes, got);
            break;
        }
        uint64_t j = b.offset / batch;
        if (b.pass != 0 || j >= nb) {
            printf("replay_client: batch of pass %" PRIu64 " at %" PRIu64 ": not in the pass\n",
                   b.pass, b.offset);
            bad = 1;
            break;
        }
        const char *until = getenv("REPLAY_IDLE_UNTIL");
        static const float zero[1];
        if (until && idles && atoi(idles) > 0 && b.step < strtoull(until, NULL, 10) &&
            (rc = push_wait(c, idle, zero, b.step)) != 0) {
            printf("replay_client: push of replay.idle: %s\n", ps_client_error(c));
            bad = 1;
            break;
        }
        memset(g, 0, nb * sizeof *g);
        g[j] = ef ? 1.0f + 0x1p-12f : 1.0f;
        if (nap && atoi(nap) > 0) nap_ms(atoi(nap));
        if (die_pct > 0) /* for the post-mortem of a failed run: who had which batch */
            printf("replay_client: pid %d rank %d got batch %" PRIu64 "\n", (int)getpid(), rank, j);
        int at = die_pct > 0 && rand() % 100 < die_pct ? rand() % 3 : -1; /* pushes done first */
        int nowait = 0, stop = 0;
        if (plan) {
            at = planned_death(plan, rank, b.step, &nowait, &stop);
            printf("replay_client: pid %d rank %d got batch %" PRIu64 " at step %" PRIu64 "\n",
                   (int)getpid(), rank, j, b.step);
        }
        if (at == 0 && stop) at = stop_here(rank, b.step, j, 0);
        if (at == 0) random_death(rank, j, at);
        if (at == 1 && nowait) { /* sent, not waited for: it lands, and this worker dies */
            ps_op_t *op;
            rc = ps_client_push(c, id[first], g, b.step, &op);
            nap_ms(300);
            random_death(rank, j, at);
        }
        rc = push_wait(c, id[first], g, b.step);
        pushes[first] += rc == 0;
        if (rc == 0 && at == 1 && stop) at = stop_here(rank, b.step, j, 1);
        if (rc == 0 && at == 1) random_death(rank, j, at);
        if (rc == 0 && at == 2) rc = push_wait(c, id[1 - first], g, b.step);
        if (rc == 0 && at == 2) random_death(rank, j, at);
        if (rc == 0 && both) rc = push_wait(c, id[1 - first], g, b.step);
        pushes[1 - first] += rc == 0 && both;
        if (rc == 0 && rank == 1 && b.step == die && both) {
            printf("replay_client: rank 1 dies at step %" PRIu64 " with batch %" PRIu64
                   " pushed to both, not reported\n", b.step, j);
            fflush(stdout);
            raise(SIGKILL);
        }
        if (rc == 0 && rank == 1 && b.step == die) {
            printf("replay_client: rank 1 dies at step %" PRIu64 " with batch %" PRIu64
                   " pushed to replay.%c only\n", b.step, j, "ab"[first]);
            fflush(stdout);
            raise(SIGKILL);
        }
        if (rc == 0 && !both) {
            rc = push_wait(c, id[1 - first], g, b.step);
            pushes[1 - first] += rc == 0;
        }
        if (rc) {
            printf("replay_client: rank %d step %" PRIu64 ": %s\n", rank, b.step,
                   ps_client_error(c));
            bad = rc == PS_ENOTMEMBER && die_pct >= 0 ? 3 : 1;
            break;
        }
        ps_client_batch_done(c, &b);
        prev = b;
    }
    fflush(stdout);
    ps_client_destroy(c);
    free(g);
    free(got);
    return bad;
}
