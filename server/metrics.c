/* metrics.c: psd's HTTP endpoint (servers[].metrics_port): /metrics (Prometheus text),
 * /healthz and /status (the JSON of `psctl status --json` for this shard). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "httpd.h"
#include "amguard.h"
#include "metrics.h"
#include "tcpguard.h"
#include "prom.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "server.h"

#define STR_(x) #x
#define STR(x) STR_(x)
#define PENDING_MAX_STR STR(PSD_PENDING_MAX) /* its help text says the number */

static const char *const TEXT = "text/plain; charset=utf-8";

/* Body text @p s (copied) into @p r with @p status. */
static void reply_text(psd_http_reply_t *r, int status, const char *s)
{
    r->status = status;
    r->type = TEXT;
    r->len = strlen(s);
    if ((r->body = malloc(r->len + 1)) == NULL) {
        r->status = 500;
        r->len = 0;
        return;
    }
    memcpy(r->body, s, r->len + 1);
}

/* Why this shard does not serve ("" when it does). */
static const char *unhealthy(const psd_server_t *srv)
{
    if (srv->fatal[0]) return srv->fatal;
    if (srv->stopping) return "stopping";
    if (srv->listener == NULL) return "not listening for workers";
    /* Its updates fail (a full map, a full disk): workers' pushes are refused, so it does not
     * serve them (a probe, session 48: 200 ok while every update failed). */
    if (srv->store_failing[0]) return srv->store_failing;
    return "";
}

static void metrics_text(psd_server_t *srv, psd_http_reply_t *r)
{
    psd_prom_t p;
    psd_prom_init(&p, srv->m.cluster, srv->shard);
    char more[256];
    snprintf(more, sizeof more, "consistency=\"%s\",optimizer=\"%s\"",
             ps_consistency_name(srv->m.job.consistency), ps_optim_name(srv->m.job.optimizer.name));
    psd_prom_info(&p, "psd_info", "This shard's job settings", more);
    psd_prom_f64(&p, "psd_start_time_seconds", "When this psd started (Unix time)",
                 srv->started_unix);
    psd_prom_u64(&p, "psd_serving", "gauge", "1 while this shard serves workers (/healthz 200)",
                 unhealthy(srv)[0] == '\0');
    psd_prom_u64(&p, "psd_step", "gauge", "This shard's step: its lowest chunk version",
                 psd_shard_step(srv));
    psd_prom_u64(&p, "psd_store_job_failures_total", "counter",
                 "Store jobs (updates, creations, drops) that failed to commit", srv->store_failures);
    psd_store_reader_t rd;
    psd_prom_u64(&p, "psd_store_oldest_snapshot_commits", "gauge",
                 "Commits since the snapshot of the store's oldest reader (a worker's direct read, "
                 "psd's pull replies): a few while readers run on; one stopped inside its read "
                 "keeps the pages written since from reuse",
                 psd_store_oldest_reader(&srv->store, &rd) == 0 ? rd.lag : 0);
    psd_prom_u64(&p, "psd_store_updates_waiting", "gauge",
                 "1 while updates wait for an old snapshot to be let go (the store filled while a "
                 "reader held it)", srv->pinned_since_ms != 0);
    uint64_t used, size;
    if (psd_store_map_use(&srv->store, &used, &size) == 0) { /* else left out: not a 0 */
        psd_prom_u64(&p, "psd_store_map_bytes", "gauge", "The store's map: map_size_mb", size);
        psd_prom_u64(&p, "psd_store_map_high_water_bytes", "gauge",
                     "The store's map up to the highest page a commit used (never goes down; "
                     "freed pages below it are reused): near psd_store_map_bytes, the store may "
                     "fill", used);
    }
    uint64_t conns = 0, members = 0;
    for (const psd_conn_t *c = srv->conns; c; c = c->next) {
        if (c->dead || c->ep == NULL) continue;
        conns++;
        members += c->rank >= 0;
    }
    psd_prom_u64(&p, "psd_connections", "gauge", "Open connections of workers and tools", conns);
    psd_prom_u64(&p, "psd_member_connections", "gauge",
                 "Connections of workers that hold a rank", members);
    psd_shard_totals_t t;
    psd_shard_totals(srv, &t);
    psd_prom_u64(&p, "psd_tensors", "gauge", "Tensors declared (the cluster's table)", t.tensors);
    psd_prom_u64(&p, "psd_chunks", "gauge", "Chunks held by this shard", t.chunks);
    psd_prom_u64(&p, "psd_state_bytes", "gauge",
                 "Bytes of parameters and optimizer state held by this shard", t.state_bytes);
    psd_prom_u64(&p, "psd_chunk_version_min", "gauge", "Lowest chunk version", t.version_min);
    psd_prom_u64(&p, "psd_chunk_version_max", "gauge", "Highest chunk version", t.version_max);
    psd_prom_u64(&p, "psd_untrained_tensors", "gauge",
                 "bsp: tensors no push reached while chunks here passed step 1 (psctl forget)",
                 t.untrained);
    psd_prom_u64(&p, "psd_behind_tensors", "gauge",
                 "bsp: trained tensors whose chunks here stay 2 or more steps behind the job's "
                 "(no member pushes them: psctl forget --trained)", t.behind);
    psd_prom_u64(&p, "psd_pushes_total", "counter", "Gradient pushes received", srv->pushes);
    psd_prom_u64(&p, "psd_direct_pushes_total", "counter",
                 "Pushes taken from a worker's shared-memory area on this host",
                 srv->direct_pushes);
    psd_prom_u64(&p, "psd_pulls_total", "counter", "Parameter pulls answered", srv->pulls);
    psd_prom_u64(&p, "psd_direct_pulls_total", "counter",
                 "Pulls answered by pointing a worker on this host at the store",
                 srv->direct_pulls);
    psd_prom_u64(&p, "psd_updates_applied_total", "counter",
                 "Chunk updates applied by the optimizer", srv->applied_updates);
    double lr;
    if (psd_last_lr(srv, &lr)) /* none before the first update */
        psd_prom_f64(&p, "psd_learning_rate", "The learning rate of the last update applied "
                     "(job.optimizer's schedule at its position)", lr);
    psd_prom_u64(&p, "psd_bundles_received_total", "counter",
                 "Fused bundles of small messages received", srv->bundles_received);
    psd_prom_u64(&p, "psd_bundles_sent_total", "counter", "Fused bundles of small replies sent",
                 srv->bundles_sent);
    psd_prom_u64(&p, "psd_crc_errors_total", "counter",
                 "Pushes refused for a CRC-32C mismatch", srv->crc_errors);
    psd_prom_u64(&p, "psd_nonfinite_pushes_total", "counter",
                 "Pushes holding a NaN or an infinity, left out of their update",
                 srv->nonfinite_pushes);
    psd_prom_u64(&p, "psd_nonfinite_param_chunks", "gauge",
                 "Chunks whose last update left a parameter that is a NaN or an infinity "
                 "with finite gradients (the optimizer overflowed)", t.odd_chunks);
    psd_prom_u64(&p, "psd_nonfinite_param_updates_total", "counter",
                 "Updates with finite gradients that left a chunk's parameters not finite",
                 srv->nonfinite_params);
    psd_prom_u64(&p, "psd_fp16_pull_overflows_total", "counter",
                 "Pull replies in fp16 holding an infinity made of a finite parameter "
                 "(65520 or more in magnitude: pull that tensor as bf16 or none)",
                 srv->f16_overflow_pulls);
    psd_prom_u64(&p, "psd_checkpoint_copies_total", "counter",
                 "This shard's parts of checkpoints written whole (psctl checkpoint, the "
                 "periodic ones)", srv->ckpt_stats.copies);
    psd_prom_u64(&p, "psd_checkpoint_copies_failed_total", "counter",
                 "This shard's parts of checkpoints that failed (the log says why)",
                 srv->ckpt_stats.failed);
    psd_prom_u64(&p, "psd_checkpoint_copies_cancelled_total", "counter",
                 "This shard's parts of checkpoints stopped because psctl gave the checkpoint up",
                 srv->ckpt_stats.cancelled);
    if (srv->ckpt_stats.copies) {
        psd_prom_f64(&p, "psd_checkpoint_last_copy_time_seconds",
                     "When this shard's last part of a checkpoint was written whole (Unix time)",
                     srv->ckpt_stats.last_unix);
        psd_prom_f64(&p, "psd_checkpoint_last_copy_duration_seconds",
                     "How long writing that part took, from its arm",
                     (double)srv->ckpt_stats.last_ms / 1000.0);
        psd_prom_u64(&p, "psd_checkpoint_last_copy_step", "gauge",
                     "The step of that checkpoint (its lowest chunk version)",
                     srv->ckpt_stats.last_step);
        psd_prom_u64(&p, "psd_checkpoint_last_copy_bytes", "gauge",
                     "The bytes of that part (its data.mdb)", srv->ckpt_stats.last_bytes);
    }
    psd_prom_u64(&p, "psd_replays_skipped_total", "counter",
                 "Pushes of a batch handed out again that a chunk had applied already (bsp: "
                 "by its replay tags; asp / ssp: by the batches it took), acknowledged and not "
                 "applied (a resend of one may count again)",
                 srv->replays_skipped);
    psd_prom_u64(&p, "psd_stale_acks_total", "counter",
                 "bsp: pushes of a step a chunk had applied without their batch, acknowledged "
                 "as such (PS_FLAG_STALE: the batch goes out again); resends of a push applied "
                 "with its step are not counted",
                 srv->stale_acks);
    psd_prom_u64(&p, "psd_auth_refused_total", "counter",
                 "Connections refused for a missing or wrong proof of the cluster secret",
                 srv->auth_refused);
    psd_prom_u64(&p, "psd_auth_forged_total", "counter",
                 "Headers on a proven connection without its session token, dropped",
                 srv->auth_forged);
    psd_prom_u64(&p, "psd_malformed_messages_total", "counter",
                 "Messages and bundle entries from peers that did not decode, refused",
                 srv->bad_headers);
    psd_prom_u64(&p, "psd_connections_refused_total", "counter",
                 "Connection requests refused while " PENDING_MAX_STR
                 " connections without a rank were open and none idle",
                 srv->conns_refused);
    psd_prom_u64(&p, "psd_ucx_messages_dropped_total", "counter",
                 "UCP messages from peers dropped unread: ids or lengths UCX would trust",
                 ps_amguard_refused());
    psd_prom_u64(&p, "psd_tcp_connections_closed_total", "counter",
                 "Connections to UCX's TCP transport closed for a frame UCX would trust",
                 ps_tcpguard_closed_total());
    psd_prom_u64(&p, "psd_transport_restarts_total", "counter",
                 "Times the UCX transport was found stuck and started again",
                 srv->transport_restarts);
    if (srv->sync.last_ms)
        psd_prom_f64(&p, "psd_last_sync_age_seconds",
                     "Seconds since the store was last synced to disk",
                     (double)(uv_now(srv->loop) - srv->sync.last_ms) / 1e3);
    if (srv->coord) psd_coord_metrics(srv, &p);
    if (p.oom) {
        free(p.buf);
        reply_text(r, 500, "out of memory\n");
        return;
    }
    r->status = 200;
    r->type = "text/plain; version=0.0.4; charset=utf-8";
    r->body = p.buf;
    r->len = p.len;
}

static void on_request(void *arg, const char *path, psd_http_reply_t *r)
{
    psd_server_t *srv = arg;
    if (strcmp(path, "/metrics") == 0) {
        metrics_text(srv, r);
    } else if (strcmp(path, "/healthz") == 0) {
        const char *why = unhealthy(srv);
        char text[sizeof ((psd_server_t *)0)->store_failing + 8];
        snprintf(text, sizeof text, "%s\n", why[0] ? why : "ok");
        reply_text(r, why[0] ? 503 : 200, text);
    } else if (strcmp(path, "/status") == 0) {
        size_t cap = psd_status_cap();
        if ((r->body = malloc(cap)) == NULL) {
            reply_text(r, 500, "out of memory\n");
            return;
        }
        r->len = psd_status_json(srv, r->body, cap);
        r->status = 200;
        r->type = "application/json";
    } else if (strcmp(path, "/") == 0) {
        reply_text(r, 200, "psd: /metrics (Prometheus), /healthz, /status (JSON)\n");
    } else {
        char text[PSD_HTTP_HEAD_MAX + 64];
        snprintf(text, sizeof text, "no %s here: /metrics, /healthz or /status\n", path);
        reply_text(r, 404, text);
    }
}

int psd_metrics_start(psd_server_t *srv, char *err, size_t errlen)
{
    srv->started_unix = (double)time(NULL);
    const ps_server_conf_t *sc = &srv->m.servers[srv->shard];
    if (sc->metrics_port == 0) return 0;
    srv->httpd = psd_httpd_start(srv->loop, sc->metrics_host, sc->metrics_port, on_request, srv,
                                 err, errlen);
    if (srv->httpd == NULL) return PS_ECONFIG;
    PS_LOG(PS_LOG_INFO, "server", "metrics on http://%s:%u/metrics (and /healthz, /status)",
           sc->metrics_host, psd_httpd_port(srv->httpd));
    return 0;
}

void psd_metrics_close(psd_server_t *srv)
{
    psd_httpd_close(srv->httpd);
    srv->httpd = NULL;
}
