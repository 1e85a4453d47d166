/* report.c: results, percentiles, JSON and tables (see report.h). */
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc.h"

/* Fixed capacity, so that a pointer pb_result_add returned stays valid for the whole run. */
#define MAX_RESULTS PB_MAX_RESULTS
static pb_result_t g_res[MAX_RESULTS];
static size_t g_n;

pb_result_t *pb_result_add(const char *op, pb_metric_t metric, uint64_t size, int shards,
                           int workers, const char *transport, double value)
{
    if (g_n == MAX_RESULTS) pb_die("more than %d results", MAX_RESULTS);
    pb_result_t *r = &g_res[g_n++];
    memset(r, 0, sizeof *r);
    snprintf(r->op, sizeof r->op, "%s", op);
    r->metric = metric;
    r->size_bytes = size;
    r->shards = shards;
    r->workers = workers;
    snprintf(r->transport, sizeof r->transport, "%s", transport);
    r->value = value;
    r->limit = r->ratio = r->extra = r->concurrent_limit = r->concurrent_ratio = -1;
    return r;
}

pb_result_t *pb_results(size_t *n)
{
    *n = g_n;
    return g_res;
}

pb_result_t *pb_result_find(const char *op, pb_metric_t metric, uint64_t size,
                            const char *transport, const char *optimizer)
{
    for (size_t i = 0; i < g_n; i++) {
        pb_result_t *r = &g_res[i];
        if (op && strcmp(r->op, op) != 0) continue;
        if (r->metric != metric || r->size_bytes != size) continue;
        if (transport && strcmp(r->transport, transport) != 0) continue;
        if (optimizer && strcmp(r->optimizer, optimizer) != 0) continue;
        return r;
    }
    return NULL;
}

const char *pb_unit(pb_metric_t m)
{
    return m == PB_THROUGHPUT ? "GB/s" : "us";
}

void pb_result_limit(pb_result_t *r, double limit, const char *limit_of)
{
    if (!(limit > 0) || !(r->value > 0)) return;
    r->limit = limit;
    snprintf(r->limit_of, sizeof r->limit_of, "%s", limit_of);
    r->ratio = r->metric == PB_THROUGHPUT ? r->value / limit : limit / r->value;
}

void pb_result_concurrent(pb_result_t *r, double limit, const char *limit_of)
{
    if (!(limit > 0) || !(r->value > 0) || r->metric != PB_THROUGHPUT) return;
    r->concurrent_limit = limit;
    snprintf(r->concurrent_of, sizeof r->concurrent_of, "%s", limit_of);
    r->concurrent_ratio = r->value / limit;
}

void pb_result_cpu(pb_result_t *r, const float *busy, int n)
{
    if (n < 0 || n > PB_MAX_CPUS) n = 0;
    r->ncpu = n;
    memcpy(r->cpu_busy, busy, (size_t)n * sizeof *busy);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double pb_quantile(double *v, size_t n, double q)
{
    if (n == 0) return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    size_t k = (size_t)ceil(q * (double)n);
    if (k < 1) k = 1;
    if (k > n) k = n;
    return v[k - 1];
}

const char *pb_size_str(uint64_t b)
{
    static char bufs[8][24];
    static int next;
    char *s = bufs[next];
    next = (next + 1) % 8;
    if (b >= (1u << 20) && b % (1u << 20) == 0)
        snprintf(s, sizeof bufs[0], "%llu MiB", (unsigned long long)(b >> 20));
    else if (b >= 1024 && b % 1024 == 0)
        snprintf(s, sizeof bufs[0], "%llu KiB", (unsigned long long)(b >> 10));
    else
        snprintf(s, sizeof bufs[0], "%llu B", (unsigned long long)b);
    return s;
}

/* ---- JSON ---------------------------------------------------------------------------------- */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v)
{
    if (v < 0 || !isfinite(v))
        fprintf(f, "null");
    else
        fprintf(f, "%.6g", v);
}

static const char *metric_name(pb_metric_t m)
{
    return m == PB_THROUGHPUT ? "throughput" : m == PB_P50 ? "p50" : "p99";
}

int pb_report_json(const char *path, const char *meta_json)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) return -errno;
    fprintf(f, "{\n  \"meta\": {%s},\n  \"results\": [\n", meta_json);
    for (size_t i = 0; i < g_n; i++) {
        const pb_result_t *r = &g_res[i];
        fprintf(f, "    {\"op\": ");
        json_str(f, r->op);
        fprintf(f,
                ", \"metric\": \"%s\", \"size_bytes\": %llu, \"shards\": %d, \"workers\": %d, "
                "\"transport\": ",
                metric_name(r->metric), (unsigned long long)r->size_bytes, r->shards, r->workers);
        json_str(f, r->transport);
        if (r->optimizer[0]) {
            fprintf(f, ", \"optimizer\": ");
            json_str(f, r->optimizer);
        }
        fprintf(f, ", \"value\": ");
        json_num(f, r->value);
        fprintf(f, ", \"unit\": \"%s\", \"limit\": ", pb_unit(r->metric));
        json_num(f, r->limit);
        fprintf(f, ", \"limit_of\": ");
        if (r->limit > 0)
            json_str(f, r->limit_of);
        else
            fprintf(f, "null");
        fprintf(f, ", \"ratio\": ");
        json_num(f, r->ratio);
        if (r->concurrent_limit > 0) {
            fprintf(f, ", \"concurrent_limit\": ");
            json_num(f, r->concurrent_limit);
            fprintf(f, ", \"concurrent_limit_of\": ");
            json_str(f, r->concurrent_of);
            fprintf(f, ", \"concurrent_ratio\": ");
            json_num(f, r->concurrent_ratio);
        }
        if (r->extra >= 0) {
            fprintf(f, ", \"transport_gbps\": ");
            json_num(f, r->extra);
        }
        /* The issue asks apply throughput in params/s too: fp32 parameters, 4 bytes each. */
        if (r->metric == PB_THROUGHPUT && r->value > 0 &&
            (strncmp(r->op, "apply", 5) == 0 || strncmp(r->op, "optim_ram", 9) == 0)) {
            fprintf(f, ", \"params_per_s\": ");
            json_num(f, r->value * 1e9 / 4);
        }
        fprintf(f, ", \"iters\": %llu", (unsigned long long)r->iters);
        if (r->ncpu) {
            fprintf(f, ", \"cpu_busy\": [");
            for (int c = 0; c < r->ncpu; c++) fprintf(f, "%s%.2f", c ? ", " : "", r->cpu_busy[c]);
            fprintf(f, "], \"one_cpu\": %s", pb_cpustat_one_cpu(r->cpu_busy, r->ncpu) ? "true"
                                                                                      : "false");
        }
        if (r->note[0]) {
            fprintf(f, ", \"note\": ");
            json_str(f, r->note);
        }
        fprintf(f, "}%s\n", i + 1 < g_n ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    return fclose(f) == 0 ? 0 : -errno;
}

/* ---- tables -------------------------------------------------------------------------------- */

/* One row per case: the throughput record and, where measured, its p50 / p99 companions. */
typedef struct {
    const pb_result_t *tp, *p50, *p99;
} row_t;

static bool same_case(const pb_result_t *a, const pb_result_t *b)
{
    return strcmp(a->op, b->op) == 0 && a->size_bytes == b->size_bytes && a->shards == b->shards &&
           a->workers == b->workers && strcmp(a->transport, b->transport) == 0 &&
           strcmp(a->optimizer, b->optimizer) == 0;
}

/* Group the records into rows (at most one per record); returns the count. */
static size_t rows(row_t *out)
{
    size_t n = 0;
    for (size_t i = 0; i < g_n; i++) {
        const pb_result_t *r = &g_res[i];
        size_t k = 0;
        for (; k < n; k++) {
            const pb_result_t *first = out[k].tp ? out[k].tp : out[k].p50 ? out[k].p50 : out[k].p99;
            if (same_case(first, r)) break;
        }
        if (k == n) out[n++] = (row_t){0};
        if (r->metric == PB_THROUGHPUT)
            out[k].tp = r;
        else if (r->metric == PB_P50)
            out[k].p50 = r;
        else
            out[k].p99 = r;
    }
    return n;
}

static void fmt_num(char *buf, size_t len, double v, int prec)
{
    if (v < 0 || !isfinite(v))
        snprintf(buf, len, "-");
    else
        snprintf(buf, len, "%.*f", prec, v);
}

/* The columns of one row, as strings. */
typedef struct {
    char op[48], layout[12], tr[8], size[16], gbps[16], p50[16], p99[16], limit[96], ratio[32],
        cpu[40];
} cols_t;

static void row_cols(const row_t *rw, cols_t *c)
{
    const pb_result_t *any = rw->tp ? rw->tp : rw->p50 ? rw->p50 : rw->p99;
    if (any->optimizer[0])
        snprintf(c->op, sizeof c->op, "%s(%s)", any->op, any->optimizer);
    else
        snprintf(c->op, sizeof c->op, "%s", any->op);
    if (any->shards)
        snprintf(c->layout, sizeof c->layout, "%dx%d", any->shards, any->workers);
    else
        snprintf(c->layout, sizeof c->layout, "-");
    snprintf(c->tr, sizeof c->tr, "%s", any->transport);
    snprintf(c->size, sizeof c->size, "%s", pb_size_str(any->size_bytes));
    fmt_num(c->gbps, sizeof c->gbps, rw->tp ? rw->tp->value : -1, 3);
    if (rw->tp && rw->tp->extra >= 0) {
        size_t l = strlen(c->gbps);
        snprintf(c->gbps + l, sizeof c->gbps - l, " (%.2f)", rw->tp->extra);
    }
    /* Each CPU's busy percentage, "!" when one of them sat idle (see cpustat.h). */
    c->cpu[0] = 0;
    for (int k = 0; k < any->ncpu; k++) {
        size_t l = strlen(c->cpu);
        snprintf(c->cpu + l, sizeof c->cpu - l, "%s%.0f", k ? "/" : "", 100 * any->cpu_busy[k]);
    }
    if (any->ncpu && pb_cpustat_one_cpu(any->cpu_busy, any->ncpu)) {
        size_t l = strlen(c->cpu);
        snprintf(c->cpu + l, sizeof c->cpu - l, " !");
    }
    if (c->cpu[0] == 0) snprintf(c->cpu, sizeof c->cpu, "-");
    fmt_num(c->p50, sizeof c->p50, rw->p50 ? rw->p50->value : -1, 1);
    fmt_num(c->p99, sizeof c->p99, rw->p99 ? rw->p99->value : -1, 1);
    /* The limit and ratio of the throughput, or of p50 when only latency has one. */
    const pb_result_t *lr = rw->tp && rw->tp->limit > 0 ? rw->tp : rw->p50;
    if (lr && lr->limit > 0) {
        snprintf(c->limit, sizeof c->limit, "%.3g %s %s", lr->limit, pb_unit(lr->metric),
                 lr->limit_of);
        snprintf(c->ratio, sizeof c->ratio, "%.2g", lr->ratio);
        if (rw->tp && rw->tp->limit > 0 && rw->p50 && rw->p50->limit > 0) {
            size_t l = strlen(c->ratio);
            snprintf(c->ratio + l, sizeof c->ratio - l, " / %.2g", rw->p50->ratio);
        }
        if (rw->tp && rw->tp->concurrent_limit > 0) {
            /* [against the same transport with as many busy processes] */
            size_t l = strlen(c->ratio);
            snprintf(c->ratio + l, sizeof c->ratio - l, " [%.2g]", rw->tp->concurrent_ratio);
        }
    } else {
        snprintf(c->limit, sizeof c->limit, "-");
        snprintf(c->ratio, sizeof c->ratio, "-");
    }
}

void pb_report_table(void)
{
    row_t *rw = calloc(g_n ? g_n : 1, sizeof *rw);
    if (rw == NULL) return;
    size_t n = rows(rw);
    printf("%-18s %-6s %-4s %-8s %-16s %-10s %-10s %-32s %-24s %s\n", "op", "layout", "tr",
           "size", "GB/s (transport)", "p50 us", "p99 us", "limit", "ratio (tp / p50 [pairs])",
           "CPUs busy %");
    for (size_t i = 0; i < n; i++) {
        cols_t c;
        row_cols(&rw[i], &c);
        printf("%-18s %-6s %-4s %-8s %-16s %-10s %-10s %-32s %-24s %s\n", c.op, c.layout, c.tr,
               c.size, c.gbps, c.p50, c.p99, c.limit, c.ratio, c.cpu);
    }
    size_t measured = 0, one = 0;
    for (size_t i = 0; i < n; i++) {
        const pb_result_t *any = rw[i].tp ? rw[i].tp : rw[i].p50 ? rw[i].p50 : rw[i].p99;
        if (any->ncpu == 0) continue;
        measured++;
        one += pb_cpustat_one_cpu(any->cpu_busy, any->ncpu) != 0;
    }
    if (one)
        printf("%zu of %zu cluster cases ran with one CPU (nearly) idle (!): the host parked a "
               "vCPU or the case never needed two; compare them with care\n",
               one, measured);
    free(rw);
}

int pb_report_markdown(const char *path)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) return -errno;
    row_t *rw = calloc(g_n ? g_n : 1, sizeof *rw);
    if (rw == NULL) {
        fclose(f);
        return -ENOMEM;
    }
    size_t n = rows(rw);
    fprintf(f, "| op | layout | tr | size | GB/s (transport) | p50 us | p99 us | limit | ratio "
               "(tp / p50 [pairs]) | CPUs busy %% |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < n; i++) {
        cols_t c;
        row_cols(&rw[i], &c);
        fprintf(f, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c.op, c.layout, c.tr,
                c.size, c.gbps, c.p50, c.p99, c.limit, c.ratio, c.cpu);
    }
    free(rw);
    return fclose(f) == 0 ? 0 : -errno;
}
