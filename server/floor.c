/* floor.c: the next shard's floor (floor.h). */
#include <string.h>

#include "ps/ps_log.h"
#include "server.h"
#include "store.h"

void psd_floor_load(psd_server_t *srv)
{
    size_t len = 0;
    psd_floor_rec_t r;
    if (psd_store_get_blob(&srv->store, PSD_FLOOR_BLOB, &r, sizeof r, &len) != 0 ||
        len != sizeof r)
        r = (psd_floor_rec_t){0}; /* none yet (a store older than session 68, one shard) */
    srv->floor = srv->floor_stored = r;
    uint64_t d = 0;
    if (psd_store_get_blob(&srv->store, PSD_DROPGEN_BLOB, &d, sizeof d, &len) != 0 ||
        len != sizeof d)
        d = 0;
    srv->drop_gen = d;
}

void psd_floor_told(psd_server_t *srv, const psd_conn_t *c, const ps_msg_t *msg)
{
    if (c->rank < 0 || msg->floor_run == 0 || srv->nshards < 2) return;
    if (msg->floor_run != srv->floor.run) /* the next shard's store changed (a restore) */
        srv->floor = (psd_floor_rec_t){.run = msg->floor_run, .floor = msg->floor};
    else if (msg->floor > srv->floor.floor)
        srv->floor.floor = msg->floor;
}

/* Writes floor_saving to the store, between store jobs (slot work: the loop never waits for
 * the store's one writer). The loop does not change floor_saving while this is queued. */
static void floor_save_run(psd_slot_work_t *w)
{
    psd_server_t *srv = w->srv;
    srv->floor_save_rc = psd_store_set_blob(&srv->store, PSD_FLOOR_BLOB, &srv->floor_saving,
                                            sizeof srv->floor_saving);
}

static bool floor_unsaved(const psd_server_t *srv)
{
    return srv->floor.run != srv->floor_stored.run || srv->floor.floor != srv->floor_stored.floor;
}

void psd_floor_flush(psd_server_t *srv)
{
    if (!floor_unsaved(srv)) return;
    int rc = psd_store_set_blob(&srv->store, PSD_FLOOR_BLOB, &srv->floor, sizeof srv->floor);
    if (rc == 0)
        srv->floor_stored = srv->floor;
    else
        PS_LOG(PS_LOG_WARN, "server", "cannot record the next shard's floor at the stop: %s",
               psd_store_strerror(srv, rc));
}

int psd_floor_forget(psd_server_t *srv)
{
    psd_floor_rec_t none = {0};
    int rc = psd_store_set_blob(&srv->store, PSD_FLOOR_BLOB, &none, sizeof none);
    if (rc) return rc;
    if (srv->floor.run)
        PS_LOG(PS_LOG_WARN, "server", "--forget-floor: the floor of shard %u this shard kept "
               "(step %llu of its run %016llx) is forgotten: a joiner no longer compares that "
               "shard's store with what workers were told of it", (srv->shard + 1) % srv->nshards,
               (unsigned long long)srv->floor.floor, (unsigned long long)srv->floor.run);
    else
        PS_LOG(PS_LOG_INFO, "server", "--forget-floor: this shard kept no floor of shard %u",
               (srv->shard + 1) % srv->nshards);
    srv->floor = srv->floor_stored = none;
    return 0;
}

static void floor_save_done(psd_slot_work_t *w)
{
    psd_server_t *srv = w->srv;
    if (srv->floor_save_rc == 0) {
        if (srv->floor_saving.run != srv->floor_stored.run)
            PS_LOG(PS_LOG_INFO, "server", "the next shard's floor: its run %016llx, from step "
                   "%llu (the members' heartbeats and leaves)",
                   (unsigned long long)srv->floor_saving.run,
                   (unsigned long long)srv->floor_saving.floor);
        srv->floor_stored = srv->floor_saving;
    } else { /* the next tick tries again (quiet while updates wait for the store) */
        PS_LOG(srv->pinned_since_ms ? PS_LOG_DEBUG : PS_LOG_WARN, "server",
               "cannot record the next shard's floor: %s",
               psd_store_strerror(srv, srv->floor_save_rc));
    }
    srv->floor_saving = (psd_floor_rec_t){0};
}

void psd_floor_cron(psd_server_t *srv)
{
    if (srv->floor_saving.run != 0 || srv->stopping || srv->floor.run == 0 ||
        !floor_unsaved(srv))
        return;
    srv->floor_saving = srv->floor;
    srv->floor_save = (psd_slot_work_t){.srv = srv, .run = floor_save_run,
                                        .done = floor_save_done};
    psd_shard_slot_queue(srv, &srv->floor_save);
}

uint64_t psd_floor_key(const psd_server_t *srv)
{
    uint64_t k = srv->drop_gen ? srv->run.id ^ ps_run_mix(srv->drop_gen) : srv->run.id;
    return k ? k : 1;
}

void psd_floor_hello(const psd_server_t *srv, ps_msg_t *reply)
{
    if (srv->test_no_floor) {
        reply->flags &= ~(uint32_t)PS_FLAG_FLOOR;
        return;
    }
    reply->floor = srv->floor.floor;
    reply->floor_run = srv->floor.run;
    reply->floor_key = psd_floor_key(srv);
}
