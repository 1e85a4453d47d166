/* prom.h: a Prometheus text-format (0.0.4) writer for psd's /metrics.
 *
 * Every sample carries the same label set (the writer's labels, e.g. cluster and shard); each
 * metric gets its # HELP and # TYPE lines. The text grows in one malloc'd buffer. */
#ifndef PSD_PROM_H
#define PSD_PROM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *buf;        /* malloc'd text, NUL-terminated; the caller takes it (free) */
    size_t len, cap;
    bool oom;         /* an append ran out of memory: the text is incomplete */
    char labels[512]; /* `name="value",...` for every sample (psd_prom_init) */
} psd_prom_t;

/**
 * @brief Start an empty text whose samples all carry the labels cluster=@p cluster and
 *  shard=@p shard (values escaped as the format wants).
 */
void psd_prom_init(psd_prom_t *p, const char *cluster, uint32_t shard);

/** @brief Append an unsigned metric: @p type is "counter" or "gauge"; a counter's @p name
 *  ends in _total. */
void psd_prom_u64(psd_prom_t *p, const char *name, const char *type, const char *help,
                  uint64_t v);

/** @brief Append a real-valued gauge. */
void psd_prom_f64(psd_prom_t *p, const char *name, const char *help, double v);

/** @brief Append a gauge of value 1 with more labels (`key="value"`, already escaped by
 *  psd_prom_escape), for facts like the job's settings. */
void psd_prom_info(psd_prom_t *p, const char *name, const char *help, const char *more_labels);

/** @brief Write @p s into @p out (@p cap bytes) escaped for a label value (\\, \", \\n). */
void psd_prom_escape(const char *s, char *out, size_t cap);

#endif
