/* prom.c: a Prometheus text-format writer (see prom.h). */
#include "prom.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put(psd_prom_t *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(psd_prom_t *p, const char *fmt, ...)
{
    if (p->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(p->buf ? p->buf + p->len : NULL, p->buf ? p->cap - p->len : 0, fmt,
                          ap);
        va_end(ap);
        if (n < 0) {
            p->oom = true;
            return;
        }
        if (p->buf && (size_t)n < p->cap - p->len) {
            p->len += (size_t)n;
            return;
        }
        size_t cap = p->cap ? p->cap * 2 : 4096;
        while (cap < p->len + (size_t)n + 1) cap *= 2;
        char *b = realloc(p->buf, cap);
        if (b == NULL) {
            p->oom = true;
            return;
        }
        p->buf = b;
        p->cap = cap;
    }
}

void psd_prom_escape(const char *s, char *out, size_t cap)
{
    size_t o = 0;
    for (; *s && o + 3 < cap; s++) {
        if (*s == '\\' || *s == '"') {
            out[o++] = '\\';
            out[o++] = *s;
        } else if (*s == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else {
            out[o++] = *s;
        }
    }
    out[o] = '\0';
}

void psd_prom_init(psd_prom_t *p, const char *cluster, uint32_t shard)
{
    memset(p, 0, sizeof *p);
    char esc[300];
    psd_prom_escape(cluster, esc, sizeof esc);
    snprintf(p->labels, sizeof p->labels, "cluster=\"%s\",shard=\"%u\"", esc, shard);
}

static void head(psd_prom_t *p, const char *name, const char *type, const char *help)
{
    put(p, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void psd_prom_u64(psd_prom_t *p, const char *name, const char *type, const char *help,
                  uint64_t v)
{
    head(p, name, type, help);
    put(p, "%s{%s} %llu\n", name, p->labels, (unsigned long long)v);
}

void psd_prom_f64(psd_prom_t *p, const char *name, const char *help, double v)
{
    head(p, name, "gauge", help);
    /* The shortest of 15 and 17 digits that reads back as @p v (0.068, not
     * 0.068000000000000005). */
    char s[32];
    snprintf(s, sizeof s, "%.15g", v);
    if (strtod(s, NULL) != v) snprintf(s, sizeof s, "%.17g", v);
    put(p, "%s{%s} %s\n", name, p->labels, s);
}

void psd_prom_info(psd_prom_t *p, const char *name, const char *help, const char *more_labels)
{
    head(p, name, "gauge", help);
    put(p, "%s{%s,%s} 1\n", name, p->labels, more_labels);
}
