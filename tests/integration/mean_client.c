/* mean_client.c: a libps worker for the test of optimizer mean (test_cluster.c, mean_*).
 *
 *   mean_client MANIFEST NUMEL STEPS [misuse | nograd | nonfinite | resume]
 *
 * With "resume", it trains a job past step 0 (no zeros to find first; its steps from the
 * first one handed out).
 * With "nograd", rank r has no gradient in step s when s % 4 == 3 (no rank has one) or
 * (s + r) % 3 == 0, and says so with ps_client_push_none: the mean is then over every member,
 * those without one counting as zeros, and a step without any gradient leaves the values as
 * they were.
 * With "nonfinite", in those steps rank r pushes a gradient holding a NaN (even steps) or an
 * infinity (odd ones) at every 1024th element (so in each chunk of at least 4 KiB) instead:
 * psd must leave each such push out as one without a gradient, the same means bit for bit, and
 * acknowledge it so (ps_client_nonfinite_pushes grows by at least one; never for a clean push).
 * With "misuse", first mistakes a caller can make, each refused without harm: a batch reported
 * done before its pushes, or one it does not hold (done_misuse); a push
 * before its first batch (PS_EINVAL; the client is not counted removed, its next_batch works),
 * and in step 0 an int8 push with error feedback of a gradient holding a NaN, which int8
 * cannot encode (sent as fp32 and left out by psd; the clean push of step 1 goes through); and
 * compressions that would destroy a PS_TENSOR_MEAN tensor's values, refused (mean_codecs); and
 * a residual kept when the compression is set again (residual_kept), and sent when error
 * feedback is turned off (residual_folded); and an fp16 pull of a parameter beyond fp16's
 * range (f16_pull_overflow).
 *
 * Joins the cluster, declares tensor "mean.t" of NUMEL floats (zeros), checks that it reads
 * zeros before any push, and then for each step s (from the coordinator, as any bsp worker
 * takes it: ps_client_next_batch) pushes a gradient that depends on its rank, s and the
 * element, pulls the step's result and checks it bit for bit against the mean psd must have
 * kept: the members' gradients summed in rank order, times 1/members. Every worker must be a
 * member of every step (ranks 0 .. members-1). Exit 0 when every pull matched, 1 with the first mismatch on stdout
 * otherwise. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps/ps_client.h"
#include "ps/ps_error.h"

/* Rank r's gradient of step s, element i: a few distinct float values per rank and step. */
static float grad_of(uint32_t r, uint64_t s, uint64_t i)
{
    return (float)(r + 1) * 0.1f * (float)(i % 7 + 1) - (float)(s % 5) * 0.03f +
           (float)(i % 11) * 1e-3f;
}

/* Push @p g of tensor @p id for step @p s, wait, and pull what step s left into @p got.
 * @return 0, or -1 with a line about tensor @p name said on stdout (the version pulled must
 * be s + 1). */
static int push_pull(ps_client_t *c, uint32_t id, const char *name, float *g, float *got,
                     uint64_t s)
{
    ps_op_t *op;
    uint64_t version = 0;
    int rc = ps_client_push(c, id, g, s, &op);
    if (rc == 0) rc = ps_op_wait(op, NULL);
    if (rc == 0) rc = ps_client_pull(c, id, got, s + 1, &op);
    if (rc == 0) rc = ps_op_wait(op, &version);
    if (rc == 0 && version == s + 1) return 0;
    printf("mean_client: %s step %" PRIu64 ": rc %d (%s), version %" PRIu64 "\n", name, s, rc,
           ps_client_error(c), version);
    return -1;
}

/* Batch @p b (just handed out, nothing pushed) reported done, and one that is not the batch
 * held: each refused (PS_EINVAL) before anything is sent, since a report closes its bsp step on
 * shard 0 (a review, session 63: a report without pushes closed a step no shard had applied,
 * and the job hung). @return 0 if so (said on stdout). */
static int done_misuse(ps_client_t *c, const ps_batch_info_t *b)
{
    ps_batch_info_t forged = *b, out;
    forged.offset++;
    int rc1 = ps_client_next_batch(c, 1ull << 40, b, &out);
    int ok1 = rc1 == PS_EINVAL && strstr(ps_client_error(c), "no push of this client");
    printf("mean_client: a batch reported done before its pushes: rc %d (%s)\n", rc1,
           ps_client_error(c));
    int rc2 = ps_client_next_batch(c, 1ull << 40, &forged, &out);
    int ok2 = rc2 == PS_EINVAL && strstr(ps_client_error(c), "is not the one this client");
    printf("mean_client: a batch it does not hold reported done: rc %d (%s)\n", rc2,
           ps_client_error(c));
    if (ok1 && ok2) printf("mean_client: batches not done refused as done\n");
    return !(ok1 && ok2);
}

/* Tensor "mean.e" (64 floats) with int8 and error feedback, which cannot encode a NaN: in
 * step 0 (@p k) a push holding one goes as fp32 and psd leaves it out (acknowledged so; the
 * step passes, zeros stay); in step 1 the clean push after it is applied (its residual took
 * no NaN). @p id: declared at step 0. @return 0 if so (said on stdout). */
static int ef_nan_left_out(ps_client_t *c, uint64_t s, uint64_t k, uint32_t *id)
{
    ps_tensor_desc_t d = {.name = "mean.e", .shape = {64}, .ndim = 1, .init = 0};
    ps_compression_t cc = {.codec = "int8", .error_feedback = 1};
    static float e[64], got[64];
    for (int i = 0; i < 64; i++) e[i] = 0.5f;
    int rc = 0;
    if (k == 0) {
        rc = ps_client_declare(c, &d, id);
        if (rc == 0) rc = ps_client_set_compression(c, *id, &cc);
        if (rc) {
            printf("mean_client: mean.e: %s\n", ps_client_error(c));
            return 1;
        }
        e[7] = (float)NAN;
    }
    uint64_t odd = ps_client_nonfinite_pushes(c);
    if (push_pull(c, *id, "mean.e", e, got, s)) return 1;
    if (ps_client_nonfinite_pushes(c) != odd + (k == 0)) {
        printf("mean_client: mean.e step %" PRIu64 ": %" PRIu64 " pushes left out (%" PRIu64
               " before)\n", s, ps_client_nonfinite_pushes(c), odd);
        return 1;
    }
    for (int i = 0; i < 64; i++)
        if (k == 0 ? got[i] != 0.0f : !(fabsf(got[i] - 0.5f) < 0.01f)) {
            printf("mean_client: mean.e step %" PRIu64 ": value %d is %.9g\n", s, i,
                   (double)got[i]);
            return 1;
        }
    if (k == 1)
        printf("mean_client: a NaN under int8 with error feedback left out, the next push "
               "taken\n");
    return 0;
}

/* Tensor "mean.n" (64 floats) with top-k and error feedback: in step 0 (@p k) a push holding a
 * NaN is left out by psd (acknowledged so; the step passes, zeros stay), and libps gives it back
 * to the residual: it reads what it was before the push (0 everywhere). Before session 60 the
 * residual kept the gradient's finite values (top-k's encode keeps x whole when its payload
 * holds a NaN), and later steps sent them although psd had dropped the push. In step 1 a clean
 * push is applied. @p id: declared at step 0. @return 0 if so (said on stdout). */
static int ef_nan_given_back(ps_client_t *c, uint64_t s, uint64_t k, uint32_t *id)
{
    ps_tensor_desc_t d = {.name = "mean.n", .shape = {64}, .ndim = 1, .init = 0};
    ps_compression_t cc = {.codec = "topk:0.25", .error_feedback = 1};
    static float g[64], got[64], r[64];
    for (int i = 0; i < 64; i++) g[i] = 0.5f;
    if (k == 0) {
        int rc = ps_client_declare(c, &d, id);
        if (rc == 0) rc = ps_client_set_compression(c, *id, &cc);
        if (rc) {
            printf("mean_client: mean.n: %s\n", ps_client_error(c));
            return 1;
        }
        g[7] = (float)NAN;
    }
    if (push_pull(c, *id, "mean.n", g, got, s)) return 1;
    if (ps_client_residual(c, *id, r)) {
        printf("mean_client: mean.n: %s\n", ps_client_error(c));
        return 1;
    }
    for (int i = 0; k == 0 && i < 64; i++)
        if (got[i] != 0.0f || r[i] != 0.0f) {
            printf("mean_client: mean.n step %" PRIu64 ": value %d is %.9g, its residual %.9g\n",
                   s, i, (double)got[i], (double)r[i]);
            return 1;
        }
    if (k == 1)
        printf("mean_client: a push left out for a NaN gave its error feedback back\n");
    return 0;
}

/* Tensor "mean.v" (64 floats, PS_TENSOR_MEAN: its pushes are values): in step 0 (@p k) the
 * compressions that would zero or flatten its values are refused (topk, int8, fp16 with error
 * feedback), fp16 alone is taken, and ps_client_use_job_compression leaves it raw; in each step
 * a push of 0.25 everywhere, as fp16 in step 0 and raw in step 1, must read back exactly.
 * @p id: declared at step 0. @return 0 if so (said on stdout). */
static int mean_codecs(ps_client_t *c, uint64_t s, uint64_t k, uint32_t *id)
{
    ps_tensor_desc_t d = {.name = "mean.v", .shape = {64}, .ndim = 1, .init = PS_TENSOR_MEAN};
    static float v[64], got[64];
    for (int i = 0; i < 64; i++) v[i] = 0.25f;
    if (k == 0) {
        static const ps_compression_t refused[] = {{.codec = "topk:0.1"},
                                                   {.codec = "int8"},
                                                   {.codec = "fp16", .error_feedback = 1}};
        if (ps_client_declare(c, &d, id)) {
            printf("mean_client: mean.v: %s\n", ps_client_error(c));
            return 1;
        }
        for (int i = 0; i < 3; i++) {
            int rc = ps_client_set_compression(c, *id, &refused[i]);
            if (rc != PS_EINVAL || strstr(ps_client_error(c), "is a mean tensor") == NULL) {
                printf("mean_client: mean.v as %s%s: rc %d (%s), want PS_EINVAL\n",
                       refused[i].codec, refused[i].error_feedback ? " with error feedback" : "",
                       rc, ps_client_error(c));
                return 1;
            }
        }
        ps_compression_t fp16 = {.codec = "fp16"};
        int rc = ps_client_use_job_compression(c, *id, "mean.v");
        if (rc == 0) rc = ps_client_set_compression(c, *id, &fp16);
        if (rc) {
            printf("mean_client: mean.v as fp16: %s\n", ps_client_error(c));
            return 1;
        }
    } else {
        ps_compression_t none = {.codec = "none"};
        if (ps_client_set_compression(c, *id, &none)) {
            printf("mean_client: mean.v raw again: %s\n", ps_client_error(c));
            return 1;
        }
    }
    if (push_pull(c, *id, "mean.v", v, got, s)) return 1;
    for (int i = 0; i < 64; i++)
        if (got[i] != 0.25f) {
            printf("mean_client: mean.v step %" PRIu64 ": value %d is %.9g\n", s, i,
                   (double)got[i]);
            return 1;
        }
    if (k == 1)
        printf("mean_client: a mean tensor refused sparse, quantized and error-fed codecs, took "
               "fp16 and raw\n");
    return 0;
}

/* Tensor "mean.r" (64 floats, topk:0.25 with error feedback; the job's optimizer is mean, so a
 * step leaves the decoded push): in step 0 (@p k) it pushes 1..64, of which 49..64 go and
 * 1..48 stay in the residual; in step 1, after ps_client_set_compression is called again (the
 * same codec, a pull codec added), it pushes zeros, and the top 16 of the residual (33..48)
 * must go: the residual was kept (before session 59 it was zeroed, and zeros went). @p id:
 * declared at step 0. @return 0 if so (said on stdout). */
static int residual_kept(ps_client_t *c, uint64_t s, uint64_t k, uint32_t *id)
{
    ps_tensor_desc_t d = {.name = "mean.r", .shape = {64}, .ndim = 1, .init = 0};
    ps_compression_t topk = {.codec = "topk:0.25", .error_feedback = 1};
    static float g[64], got[64];
    for (int i = 0; i < 64; i++) g[i] = k == 0 ? (float)(i + 1) : 0.0f;
    if (k == 0 && ps_client_declare(c, &d, id) != 0) {
        printf("mean_client: mean.r: %s\n", ps_client_error(c));
        return 1;
    }
    if (k == 1) topk.pull = "fp16";
    if (ps_client_set_compression(c, *id, &topk)) {
        printf("mean_client: mean.r as topk:0.25: %s\n", ps_client_error(c));
        return 1;
    }
    if (push_pull(c, *id, "mean.r", g, got, s)) return 1;
    for (int i = 0; i < 64; i++) {
        float want = k == 0 ? (i >= 48 ? (float)(i + 1) : 0.0f)
                            : (i >= 32 && i < 48 ? (float)(i + 1) : 0.0f);
        if (got[i] != want) {
            printf("mean_client: mean.r step %" PRIu64 ": value %d is %.9g, want %g\n", s, i,
                   (double)got[i], (double)want);
            return 1;
        }
    }
    if (k == 1)
        printf("mean_client: the residual outlived a second ps_client_set_compression\n");
    return 0;
}

/* Tensors "mean.f" and "mean.h" (64 floats): step 0 (@p k) pushes 1 .. 64 as topk:0.25 with
 * error feedback (49 .. 64 applied, 1 .. 48 kept in the residual); step 1 turns error feedback
 * off, mean.f with codec none, mean.h with topk:0.25 without it, and pushes zeros: what the
 * residual held goes with it (mean.f: 1 .. 48; mean.h: its top quarter, 33 .. 48). Before, a
 * probe found, the residual was dropped (zeros applied). @p ids: declared at step 0.
 * @return 0 if so (said on stdout). */
static int residual_folded(ps_client_t *c, uint64_t s, uint64_t k, uint32_t ids[2])
{
    static const char *names[2] = {"mean.f", "mean.h"};
    static float g[64], got[64];
    for (int t = 0; t < 2; t++) {
        ps_tensor_desc_t d = {.name = names[t], .shape = {64}, .ndim = 1, .init = 0};
        ps_compression_t cc = {.codec = "topk:0.25", .error_feedback = 1};
        if (k == 1) {
            cc.codec = t == 0 ? "none" : "topk:0.25";
            cc.error_feedback = t == 0;
        }
        if ((k == 0 && ps_client_declare(c, &d, &ids[t]) != 0) ||
            ps_client_set_compression(c, ids[t], &cc) != 0) {
            printf("mean_client: %s: %s\n", names[t], ps_client_error(c));
            return 1;
        }
        for (int i = 0; i < 64; i++) g[i] = k == 0 ? (float)(i + 1) : 0.0f;
        if (push_pull(c, ids[t], names[t], g, got, s)) return 1;
        for (int i = 0; i < 64; i++) {
            int sent = k == 0 ? i >= 48 : t == 0 ? i < 48 : i >= 32 && i < 48;
            if (got[i] != (sent ? (float)(i + 1) : 0.0f)) {
                printf("mean_client: %s step %" PRIu64 ": value %d is %.9g, want %g\n",
                       names[t], s, i, (double)got[i], sent ? (double)(i + 1) : 0.0);
                return 1;
            }
        }
    }
    if (k == 1)
        printf("mean_client: error feedback turned off sent what its residual held\n");
    return 0;
}

/* Tensor "mean.o" (64 floats) pulled as fp16: in step 0 (@p k) value 0 is 70000, beyond
 * fp16's range, and reads as an infinity (psd warns: the test reads its log), the others as
 * sent; in step 1 zeros read as zeros. @p id: declared at step 0. @return 0 if so (said). */
static int f16_pull_overflow(ps_client_t *c, uint64_t s, uint64_t k, uint32_t *id)
{
    ps_tensor_desc_t d = {.name = "mean.o", .shape = {64}, .ndim = 1, .init = 0};
    ps_compression_t cc = {.codec = "none", .pull = "fp16"};
    static float g[64], got[64];
    if (k == 0 && (ps_client_declare(c, &d, id) != 0 ||
                   ps_client_set_compression(c, *id, &cc) != 0)) {
        printf("mean_client: mean.o: %s\n", ps_client_error(c));
        return 1;
    }
    for (int i = 0; i < 64; i++) g[i] = k ? 0.0f : i ? 0.5f : 70000.0f;
    if (push_pull(c, *id, "mean.o", g, got, s)) return 1;
    for (int i = 0; i < 64; i++)
        if (k == 0 && i == 0 ? got[i] != INFINITY : got[i] != g[i]) {
            printf("mean_client: mean.o step %" PRIu64 ": value %d is %.9g\n", s, i,
                   (double)got[i]);
            return 1;
        }
    if (k == 1) printf("mean_client: an fp16 pull of 70000 read as an infinity\n");
    return 0;
}

/* "nograd": whether rank @p r has a gradient in step @p s. */
static int has_grad(int nograd, uint32_t r, uint64_t s)
{
    return !nograd || (s % 4 != 3 && (s + r) % 3 != 0);
}

int main(int argc, char **argv)
{
    int misuse = argc == 5 && strcmp(argv[4], "misuse") == 0;
    int nonfinite = argc == 5 && strcmp(argv[4], "nonfinite") == 0;
    int nograd = (argc == 5 && strcmp(argv[4], "nograd") == 0) || nonfinite;
    int resume = argc == 5 && strcmp(argv[4], "resume") == 0;
    if (argc != 4 && !misuse && !nograd && !resume) {
        fprintf(stderr, "usage: mean_client MANIFEST NUMEL STEPS [misuse | nograd | "
                "nonfinite | resume]\n");
        return 2;
    }
    uint64_t n = strtoull(argv[2], NULL, 10), steps = strtoull(argv[3], NULL, 10);
    if (n == 0 || n > (1u << 26) || steps == 0) {
        fprintf(stderr, "mean_client: NUMEL in [1, 2^26], STEPS >= 1\n");
        return 2;
    }
    char err[512];
    ps_client_t *c;
    int rc = ps_client_create(argv[1], NULL, &c, err, sizeof err);
    if (rc) {
        printf("mean_client: join: %s\n", err);
        return 1;
    }
    uint32_t rank = (uint32_t)ps_client_rank(c), w = 0; /* the members, from the first step */
    uint32_t eid = 0, vid = 0, rid = 0, nid = 0; /* misuse: mean.e, mean.v, mean.r, mean.n */
    uint32_t fid[2] = {0, 0}, oid = 0;            /* mean.f, mean.h; mean.o */
    ps_tensor_desc_t d = {.name = "mean.t", .shape = {(uint32_t)n}, .ndim = 1, .init = 0};
    uint32_t id;
    float *g = malloc(n * sizeof *g), *got = malloc(n * sizeof *got),
          *want = malloc(n * sizeof *want);
    int bad = g == NULL || got == NULL || want == NULL;
    if (!bad && (rc = ps_client_declare(c, &d, &id)) != 0) {
        printf("mean_client: declare: %s\n", ps_client_error(c));
        bad = 1;
    }
    ps_op_t *op;
    uint64_t version = 0;
    if (!bad && !resume) { /* zeros (init 0) before the first step */
        rc = ps_client_pull(c, id, got, 0, &op);
        if (rc == 0) rc = ps_op_wait(op, NULL);
        for (uint64_t i = 0; rc == 0 && !bad && i < n; i++)
            if (got[i] != 0.0f) {
                printf("mean_client: rank %u: before any push element %" PRIu64 " is %.9g\n",
                       rank, i, (double)got[i]);
                bad = 1;
            }
        if (rc) {
            printf("mean_client: first pull: %s\n", ps_client_error(c));
            bad = 1;
        }
    }
    if (!bad && misuse) { /* a push before any batch: refused, and the client still a member */
        memset(g, 0, n * sizeof *g);
        rc = ps_client_push(c, id, g, ps_client_join_step(c), &op);
        if (rc == 0) rc = ps_op_wait(op, NULL);
        if (rc != PS_EINVAL || strstr(ps_client_error(c), "holds no batch") == NULL) {
            printf("mean_client: a push before any batch: rc %d (%s), want PS_EINVAL\n", rc,
                   ps_client_error(c));
            bad = 1;
        } else {
            printf("mean_client: a push before any batch refused: %s\n", ps_client_error(c));
        }
    }
    ps_batch_info_t b, prev;
    uint64_t s0 = 0; /* the first step (0 but with "resume") */
    for (uint64_t k = 0; k < steps && !bad; k++) {
        rc = ps_client_next_batch(c, 1ull << 40, k ? &prev : NULL, &b);
        if (k == 0 && rc == 0) w = b.members;
        if (k == 0 && rc == 0 && resume) s0 = b.step;
        /* "resume": alone in the job, at whatever rank it got (rank 0 may still be held) */
        uint32_t r0 = resume ? rank : 0;
        if (rc || b.finished || b.step != s0 + k || b.members != w || rank >= r0 + w ||
            (resume && w != 1)) {
            printf("mean_client: rank %u: batch %" PRIu64 ": %s (step %" PRIu64
                   ", %u members, finished %d)\n",
                   rank, k, rc ? ps_client_error(c) : "not the step wanted", b.step, b.members,
                   b.finished);
            bad = 1;
            break;
        }
        prev = b;
        uint64_t s = b.step;
        if (misuse && k == 0 && done_misuse(c, &b)) {
            bad = 1;
            break;
        }
        if (misuse && k < 2 && (ef_nan_left_out(c, s, k, &eid) || mean_codecs(c, s, k, &vid) ||
                                residual_kept(c, s, k, &rid) || ef_nan_given_back(c, s, k, &nid) ||
                                residual_folded(c, s, k, fid) || f16_pull_overflow(c, s, k, &oid))) {
            bad = 1;
            break;
        }
        int any = 0;
        for (uint32_t r = r0; r < r0 + w; r++) any |= has_grad(nograd, r, s);
        for (uint64_t i = 0; i < n && any; i++) {
            g[i] = grad_of(rank, s, i);
            float sum = 0; /* psd sums in rank order the pushes with data, then scales */
            int first = 1;
            for (uint32_t r = r0; r < r0 + w; r++) {
                if (!has_grad(nograd, r, s)) continue;
                sum = first ? grad_of(r, s, i) : sum + grad_of(r, s, i);
                first = 0;
            }
            want[i] = sum * (1.0f / (float)w);
        }
        if (!any) memcpy(want, got, n * sizeof *want); /* as it was */
        ps_op_t *push, *pull;
        int odd = nonfinite && !has_grad(nograd, rank, s);
        uint64_t odd_before = ps_client_nonfinite_pushes(c);
        if (odd) /* rank's gradient with a NaN or an infinity in each chunk */
            for (uint64_t i = 0; i < n; i++)
                g[i] = i % 1024 != s % 1024 ? grad_of(rank, s, i)
                       : s % 2 ? (i % 2048 ? -INFINITY : INFINITY) : NAN;
        rc = has_grad(nograd, rank, s) || odd ? ps_client_push(c, id, g, s, &push)
                                              : ps_client_push_none(c, id, s, &push);
        if (rc == 0) rc = ps_op_wait(push, NULL);
        if (rc == 0 && nonfinite && (ps_client_nonfinite_pushes(c) > odd_before) != odd) {
            printf("mean_client: rank %u step %" PRIu64 ": %s push, %" PRIu64 " acknowledged "
                   "as not finite (%" PRIu64 " before)\n", rank, s, odd ? "a non-finite" : "a clean",
                   ps_client_nonfinite_pushes(c), odd_before);
            bad = 1;
            break;
        }
        if (rc == 0) rc = ps_client_pull(c, id, got, s + 1, &pull);
        if (rc == 0) rc = ps_op_wait(pull, &version);
        if (rc) {
            printf("mean_client: rank %u step %" PRIu64 ": %s\n", rank, s, ps_client_error(c));
            bad = 1;
            break;
        }
        if (version != s + 1) {
            printf("mean_client: rank %u step %" PRIu64 ": pulled version %" PRIu64 "\n", rank,
                   s, version);
            bad = 1;
        }
        ps_client_batch_done(c, &b); /* the last one: the leave reports it */
        for (uint64_t i = 0; i < n && !bad; i++)
            if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
                printf("mean_client: rank %u step %" PRIu64 ": element %" PRIu64
                       " is %.9g, the mean is %.9g\n",
                       rank, s, i, (double)got[i], (double)want[i]);
                bad = 1;
            }
    }
    if (!bad)
        printf("mean_client: rank %u of %u: %" PRIu64 " steps, every pull the exact mean "
               "(%" PRIu64 " chunk pushes left out as not finite)\n", rank, w, steps,
               ps_client_nonfinite_pushes(c));
    fflush(stdout);
    ps_client_destroy(c);
    free(g);
    free(got);
    free(want);
    return bad;
}
