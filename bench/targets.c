/* targets.c: the fast-path issue's targets, judged on one psbench run (see targets.h). */
#include "targets.h"

#include <stdarg.h>
#include <string.h>

/* One target's line while it is built: its cases' figures, how many there are and how many
 * miss the bar. */
typedef struct {
    char text[1024];
    size_t len;
    int cases, below;
    int unjudged; /* cases measured without a limit (no limits part, or shards elsewhere) */
} line_t;

static void add(line_t *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(line_t *l, const char *fmt, ...)
{
    if (l->len >= sizeof l->text) return; /* cut: what fitted stays */
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(l->text + l->len, sizeof l->text - l->len, fmt, ap);
    va_end(ap);
    if (k > 0) l->len += (size_t)k;
}

/* Print @p l under @p title; @return 1 when measured and not met. */
static int verdict(FILE *f, bool md, const char *title, const line_t *l)
{
    fprintf(f, "%s%s: ", md ? "- " : "  ", title);
    if (l->cases == 0) {
        fprintf(f, "%s\n", l->unjudged ? "measured without a limit in this run (no limits part, "
                                         "or shards on other hosts): not judged"
                                       : "not measured in this run");
        return 0;
    }
    if (l->below == 0)
        fprintf(f, "%s: %smet%s\n", l->text, md ? "**" : "", md ? "**" : "");
    else
        fprintf(f, "%s: not met (%d of %d below the bar)\n", l->text, l->below, l->cases);
    return l->below > 0;
}

/* Whether @p r has a limit (and so a ratio): no limits part, or shards on other hosts, leave
 * a case without one. */
static bool limited(const pb_result_t *r) { return r->ratio >= 0 && r->limit > 0; }

/* Whether @p r is a case of @p op / @p metric over @p tr (NULL: any) with a limit; one
 * without a limit is counted in @p l as not judged. */
static bool is(line_t *l, const pb_result_t *r, const char *op, pb_metric_t metric,
               const char *tr)
{
    if (strcmp(r->op, op) != 0 || r->metric != metric ||
        (tr != NULL && strcmp(r->transport, tr) != 0))
        return false;
    l->unjudged += !limited(r);
    return limited(r);
}

/* Whether @p r is one of the rounds a target takes: optimizer mean (the server only sums),
 * @p metric, over @p tr, of @p min..@p max bytes. */
static bool round_case(const pb_result_t *r, const char *tr, pb_metric_t metric, uint64_t min,
                       uint64_t max)
{
    return strcmp(r->op, "round") == 0 && r->metric == metric && strcmp(r->transport, tr) == 0 &&
           strcmp(r->optimizer, "mean") == 0 && r->size_bytes >= min && r->size_bytes <= max;
}

static bool same_layout(const pb_result_t *a, const pb_result_t *b)
{
    return a->shards == b->shards && a->workers == b->workers;
}

/* The rounds of round_case() by layout, in the order the run measured them: each case's
 * throughput ratio, or with @p latency its p50 and how many of UCX's round trips that is. */
static void rounds(line_t *l, const pb_result_t *res, size_t n, const char *tr,
                   pb_metric_t metric, uint64_t min, uint64_t max, bool latency)
{
    for (size_t i = 0; i < n; i++) {
        const pb_result_t *r = &res[i];
        if (!round_case(r, tr, metric, min, max)) continue;
        if (!limited(r)) {
            l->unjudged++;
            continue;
        }
        bool printed = false; /* with an earlier case of its layout */
        for (size_t k = 0; k < i && !printed; k++)
            printed = round_case(&res[k], tr, metric, min, max) && limited(&res[k]) &&
                      same_layout(&res[k], r);
        if (printed) continue;
        add(l, "%s%dx%d", l->cases ? "; " : "", r->shards, r->workers);
        for (size_t j = i; j < n; j++) {
            const pb_result_t *q = &res[j];
            if (!round_case(q, tr, metric, min, max) || !limited(q) || !same_layout(q, r))
                continue;
            add(l, " %s", pb_size_str(q->size_bytes));
            l->cases++;
            if (latency) { /* p50 in us and in round trips (the limit is one) */
                add(l, " %.1f us (%.1fx)", q->value, q->value / q->limit);
                l->below += q->value > PB_TARGET_SMALL_RTTS * q->limit;
            } else {
                add(l, " %.2f", q->ratio);
                l->below += q->ratio < PB_TARGET_ROUND_BW;
            }
        }
    }
}

int pb_targets_report(FILE *f, const pb_result_t *res, size_t n, bool md)
{
    static const char *const trs[][2] = {
        {"direct", "direct (shm and psd's direct pulls and pushes)"},
        {"shm", "shm (UCX only)"},
        {"tcp", "tcp"}};
    int unmet = 0;
    char title[160];
    fprintf(f, "\nTargets of the fast-path issue, judged on this run:\n");
    for (int t = 0; t < 3; t++) {
        line_t l = {.len = 0};
        rounds(&l, res, n, trs[t][0], PB_THROUGHPUT, PB_TARGET_ROUND_MIN_BYTES, UINT64_MAX,
               false);
        snprintf(title, sizeof title, "round >= %.1f x ucp_am_bw from %s, %s", PB_TARGET_ROUND_BW,
                 pb_size_str(PB_TARGET_ROUND_MIN_BYTES), trs[t][1]);
        unmet += verdict(f, md, title, &l);
    }
    for (int t = 0; t < 3; t++) {
        line_t l = {.len = 0};
        rounds(&l, res, n, trs[t][0], PB_P50, PB_TARGET_SMALL_BYTES, PB_TARGET_SMALL_BYTES,
               true);
        snprintf(title, sizeof title, "%s round p50 <= %.0f x UCX's round trip (2 x "
                 "ucp_am_lat), %s", pb_size_str(PB_TARGET_SMALL_BYTES), PB_TARGET_SMALL_RTTS,
                 trs[t][1]);
        unmet += verdict(f, md, title, &l);
    }
    line_t adam = {.len = 0};
    for (size_t i = 0; i < n; i++)
        if (strcmp(res[i].optimizer, "adam") == 0 &&
            is(&adam, &res[i], "apply_store", PB_THROUGHPUT, NULL)) {
            add(&adam, "%s%.2f", adam.cases ? ", " : "", res[i].ratio);
            adam.cases++;
            adam.below += res[i].ratio < PB_TARGET_ADAM_STORE;
        }
    snprintf(title, sizeof title, "adam through the store (psd's apply threads) >= %.1f x the "
             "in-RAM loop (one thread)", PB_TARGET_ADAM_STORE);
    unmet += verdict(f, md, title, &adam);
    line_t step = {.len = 0};
    for (size_t i = 0; i < n; i++) {
        const pb_result_t *r = &res[i];
        if (!is(&step, r, "bsp_step", PB_P50, NULL)) continue;
        add(&step, "%s%s %.1f ms (%.2fx)", step.cases ? ", " : "", r->transport,
            r->value / 1000, r->value / r->limit);
        step.cases++;
        step.below += r->value > PB_TARGET_STEP_MODEL * r->limit;
    }
    snprintf(title, sizeof title, "BSP step (adam, 2x2) <= %.1f x the model",
             PB_TARGET_STEP_MODEL);
    unmet += verdict(f, md, title, &step);
    return unmet;
}
