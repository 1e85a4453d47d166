/* sync.c: periodic mdb_env_sync on the thread pool (see sync.h). */
#include <stdio.h>

#include "ps/ps_log.h"
#include "sync.h"

static void sync_work(uv_work_t *w)
{
    psd_server_t *srv = w->data;
    srv->sync.rc = mdb_env_sync(srv->store.env, 1);
}

static void sync_done(uv_work_t *w, int status)
{
    psd_server_t *srv = w->data;
    srv->sync.running = false;
    if (srv->sync.rc)
        PS_LOG(PS_LOG_ERROR, "sync", "mdb_env_sync: %s", mdb_strerror(srv->sync.rc));
    else
        srv->sync.last_ms = srv->sync.started_ms;
    psd_server_maybe_stop(srv);
}

void psd_sync_cron(psd_server_t *srv, uint64_t now_ms)
{
    uint64_t every = srv->m.sync_interval_s * 1000;
    if (every == 0 || srv->sync.running || srv->stopping) return;
    uint64_t since = srv->sync.last_ms ? srv->sync.last_ms : srv->sync.opened_ms;
    if (now_ms - since < every) return;
    srv->sync.work.data = srv;
    srv->sync.started_ms = now_ms;
    if (uv_queue_work(srv->loop, &srv->sync.work, sync_work, sync_done) == 0)
        srv->sync.running = true;
}

bool psd_sync_idle(psd_server_t *srv) { return !srv->sync.running; }

void psd_sync_status_json(psd_server_t *srv, char *out, size_t cap, size_t *len)
{
    long long ago = srv->sync.last_ms ? (long long)(uv_now(srv->loop) - srv->sync.last_ms) : -1;
    int n = snprintf(out + *len, cap - *len, ", \"sync_interval_s\": %llu, \"last_sync_ms_ago\": %lld",
                     (unsigned long long)srv->m.sync_interval_s, ago);
    if (n > 0 && (size_t)n < cap - *len) *len += (size_t)n;
}
