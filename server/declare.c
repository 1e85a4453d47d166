/* declare.c: declarations (PS_MSG_DECLARE): a tensor created in the store once, every
 * declarer answered with it; a model's own values sent by its declarer (PS_MSG_VALUES); a tensor
 * dropped (psd_shard_drop, forget.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "shard_internal.h"
#include "tcpguard.h"

/* ---- declare ------------------------------------------------------------ */

void psd__reply_declare(psd_server_t *srv, psd_conn_t *conn, uint64_t req_id, psd_tensor_t *t)
{
    ps_msg_t r = {.type = PS_MSG_DECLARE_REPLY, .req_id = req_id, .shard = srv->shard,
                  .has_decl = 1, .decl = t->decl};
    r.step = UINT64_MAX;
    for (uint32_t c = 0; c < t->nchunks; c++)
        if (t->chunks[c] && t->chunks[c]->version < r.step) r.step = t->chunks[c]->version;
    if (r.step == UINT64_MAX) r.step = 0;
    psd_send_msg(srv, conn, &r);
}

static bool same_shape(const ps_decl_t *a, const ps_decl_t *b)
{
    return a->ndim == b->ndim && memcmp(a->shape, b->shape, sizeof(uint32_t) * (size_t)a->ndim) == 0;
}

static int queue_create(psd_server_t *srv, uint32_t id)
{
    if (srv->ncreate == srv->cap_create) {
        uint32_t cap = srv->cap_create ? 2 * srv->cap_create : 16;
        uint32_t *q = realloc(srv->create_queue, cap * sizeof *q);
        if (q == NULL) return PS_ENOMEM;
        srv->create_queue = q;
        srv->cap_create = cap;
    }
    srv->create_queue[srv->ncreate++] = id;
    psd__job_start_next(srv);
    return 0;
}

/* ---- values sent by the declarer (PSK_INIT_VALUES) ---------------------------------------
 * A model's own weights (a pretrained one, psd.torch): the declaration that creates the tensor
 * here is answered with PS_FLAG_VALUES, its worker sends the values of this shard's chunks
 * (PS_MSG_VALUES) and declares again; once all came, the create job writes them instead of an
 * initializer's, and every declaration waiting is answered. Other declarers wait meanwhile, as
 * for any creation. When the sending worker goes first, the next declarer waiting is asked in
 * its place (its values, not a mix: those received are dropped); with none, the tensor is
 * forgotten and a later declaration creates it again. */

void psd__values_free(psd_tensor_t *t)
{
    psd_values_t *v = t->values;
    if (v == NULL) return;
    for (uint32_t c = 0; c < t->nchunks; c++) free(v->buf[c]);
    free(v->buf);
    if (v->giver) psd_conn_unref(v->giver);
    free(v);
    t->values = NULL;
}

/* @p t (not ready) waits for the values of its chunks here from @p conn. 0 or PS_ENOMEM. */
static int values_begin(psd_server_t *srv, psd_tensor_t *t, psd_conn_t *conn)
{
    psd_values_t *v = calloc(1, sizeof *v);
    if (v == NULL || (v->buf = calloc(t->nchunks, sizeof *v->buf)) == NULL) {
        free(v);
        return PS_ENOMEM;
    }
    psd_conn_ref(conn);
    v->giver = conn;
    v->gen = ++srv->values_gen; /* unique in this psd: a late receive is told from any other */
    v->missing = psd__local_chunks(t);
    v->last_ms = psd_now_ms();
    t->values = v;
    return 0;
}

/* Answer declaration @p req_id of @p conn: it creates @p t here; send its values. */
static void values_ask(psd_server_t *srv, psd_conn_t *conn, uint64_t req_id, const psd_tensor_t *t)
{
    psd_send_msg(srv, conn, &(ps_msg_t){.type = PS_MSG_DECLARE_REPLY, .req_id = req_id,
                                         .shard = srv->shard, .has_decl = 1, .decl = t->decl,
                                         .flags = PS_FLAG_VALUES});
}

/* Tensor @p id's creation failed (@p rc: its create job, or no memory to queue one): the
 * declarations waiting fail, and it is forgotten (a later declaration tries again). */
void psd__create_failed(psd_server_t *srv, uint32_t id, int rc)
{
    psd_tensor_t *t = &srv->tensors[id];
    for (psd_wait_t *w = t->declares, *nx; w; w = nx) {
        nx = w->next;
        psd_send_error(srv, w->conn, w->req_id, rc, "cannot create tensor '%s': %s",
                       t->decl.name, ps_strerror(rc));
        psd_conn_unref(w->conn);
        psd__wait_put(srv, w);
    }
    t->declares = NULL;
    psd__tensor_forget(srv, id, true);
}

/* The worker sending tensor @p id's values went before all came. The next declarer waiting
 * that has values of its own is asked for them; with none, a declarer waiting without values
 * (psworker's initializer, say) gets the tensor initialized as psd.torch's init="shards" would
 * (xavier for 2 or more dimensions, else zeros); with no declarer left, it is forgotten. */
void psd__values_giver_gone(psd_server_t *srv, uint32_t id)
{
    psd_tensor_t *t = &srv->tensors[id];
    psd_values_t *v = t->values;
    psd_conn_unref(v->giver);
    v->giver = NULL;
    for (uint32_t c = 0; c < t->nchunks; c++) {
        free(v->buf[c]);
        v->buf[c] = NULL;
    }
    v->missing = psd__local_chunks(t);
    v->gen = ++srv->values_gen; /* a receive of the one gone still landing is dropped */
    psd_wait_t **pp = &t->declares;
    while (*pp && !((*pp)->flags & PS_FLAG_VALUES)) pp = &(*pp)->next;
    if (*pp) {
        psd_wait_t *w = *pp;
        *pp = w->next;
        v->giver = w->conn; /* its reference moves */
        v->last_ms = psd_now_ms();
        PS_LOG(PS_LOG_WARN, "shard", "tensor %u '%s': the worker creating it left before its "
               "values came; rank %d's declaration sends them", id, t->decl.name, w->conn->rank);
        values_ask(srv, w->conn, w->req_id, t);
        psd__wait_put(srv, w);
        return;
    }
    if (t->declares) {
        psd__values_free(t);
        t->decl.init = (t->decl.init & PS_DECL_MEAN) |
                       (t->decl.ndim >= 2 ? PSK_INIT_XAVIER : PSK_INIT_ZEROS);
        t->decl.init_arg = 0;
        PS_LOG(PS_LOG_WARN, "shard", "tensor %u '%s': the worker creating it left before its "
               "values came; the declarations waiting send none: initialized by psd (%s)", id,
               t->decl.name, t->decl.ndim >= 2 ? "xavier" : "zeros");
        int rc = queue_create(srv, id);
        if (rc) psd__create_failed(srv, id, rc);
        return;
    }
    PS_LOG(PS_LOG_WARN, "shard", "tensor %u '%s' not created: the worker declaring it left "
           "before its values came", id, t->decl.name);
    psd__tensor_forget(srv, id, true);
}

void psd_shard_values_cron(psd_server_t *srv, uint64_t now_ms)
{
    uint64_t limit = srv->m.job.heartbeat_timeout_ms;
    for (uint32_t i = 0; i < srv->ntensors; i++) {
        psd_tensor_t *t = &srv->tensors[i];
        psd_values_t *v = t->present ? t->values : NULL;
        if (v == NULL || v->giver == NULL || v->missing == 0 || now_ms - v->last_ms <= limit)
            continue;
        PS_LOG(PS_LOG_WARN, "shard", "tensor %u '%s': rank %d sent none of its values for %llu "
               "ms (job.heartbeat_timeout_ms %llu): passed over", i, t->decl.name,
               v->giver->rank, (unsigned long long)(now_ms - v->last_ms),
               (unsigned long long)limit);
        psd__values_giver_gone(srv, i); /* its later values are refused: not the creator now */
    }
}

/* A PS_MSG_VALUES being received into a buffer of its own. */
typedef struct {
    psd_server_t *srv;
    psd_conn_t *conn; /* a reference */
    uint64_t req_id, gen;
    uint32_t tensor, chunk, crc;
    float *buf;
} values_recv_t;

static void values_landed(void *request, ucs_status_t status, size_t length, void *user_data)
{
    values_recv_t *r = user_data;
    psd_server_t *srv = r->srv;
    if (request) ucp_request_free(request);
    ps_tcpguard_done(r->buf);
    psd_tensor_t *t = r->tensor < srv->ntensors && srv->tensors[r->tensor].present
                          ? &srv->tensors[r->tensor]
                          : NULL;
    psd_values_t *v = t ? t->values : NULL;
    int rc = 0;
    const char *why = "";
    if (status != UCS_OK)
        rc = ps_ucx_err(status), why = "their receive failed";
    else if (v == NULL || v->gen != r->gen || v->giver != r->conn || r->chunk >= t->nchunks ||
             t->chunks[r->chunk] == NULL || length != (size_t)t->chunks[r->chunk]->n * 4)
        rc = PS_ECONFLICT, why = "this worker no longer creates it (it was slow to send them)";
    else if (ps_crc32c(0, r->buf, length) != r->crc)
        rc = PS_ECRC, why = "their CRC-32C does not match";
    else if (!psk_all_finite(r->buf, length / sizeof(float)))
        rc = PS_EINVAL, why = "they hold a NaN or an infinity";
    if (rc == 0) {
        bool again = v->buf[r->chunk] != NULL; /* sent again (a CRC mismatch): the newer */
        free(v->buf[r->chunk]);
        v->buf[r->chunk] = r->buf;
        r->buf = NULL;
        v->last_ms = psd_now_ms();
        psd_send_msg(srv, r->conn, &(ps_msg_t){.type = PS_MSG_VALUES_REPLY, .req_id = r->req_id,
                                                .shard = srv->shard, .tensor = r->tensor,
                                                .chunk = r->chunk});
        if (!again && --v->missing == 0) {
            psd_conn_unref(v->giver); /* nothing more to come: its leaving changes nothing */
            v->giver = NULL;
            if ((rc = queue_create(srv, r->tensor)) != 0) psd__create_failed(srv, r->tensor, rc);
        }
    } else if (!r->conn->dead) {
        psd_send_error(srv, r->conn, r->req_id, rc, "values of tensor %u chunk %u: %s",
                       r->tensor, r->chunk, why);
    }
    free(r->buf);
    psd_conn_unref(r->conn);
    free(r);
}

ucs_status_t psd_shard_on_values(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg,
                                 void *data, size_t length, const ucp_am_recv_param_t *param)
{
    psd_tensor_t *t = msg->tensor < srv->ntensors && srv->tensors[msg->tensor].present
                          ? &srv->tensors[msg->tensor]
                          : NULL;
    psd_values_t *v = t ? t->values : NULL;
    const psd_chunk_t *ch = v && msg->chunk < t->nchunks ? t->chunks[msg->chunk] : NULL;
    if (v == NULL || v->giver != conn) {
        psd_send_error(srv, conn, msg->req_id, PS_EPROTO, "values of tensor %u: this worker "
                       "does not create it on shard %u (no declaration of its asked for them, or "
                       "it was passed over: it sent none for job.heartbeat_timeout_ms)",
                       msg->tensor, srv->shard);
        return UCS_OK;
    }
    if (ch == NULL || length != (size_t)ch->n * sizeof(float)) {
        psd_send_error(srv, conn, msg->req_id, PS_EPROTO, "values of '%s' chunk %u: %zu bytes, "
                       "but shard %u holds %s", t->decl.name, msg->chunk, length, srv->shard,
                       ch ? "another number of values" : "no such chunk");
        return UCS_OK;
    }
    values_recv_t *r = malloc(sizeof *r);
    float *buf = malloc(length ? length : 1);
    if (r == NULL || buf == NULL) {
        free(r);
        free(buf);
        psd_send_error(srv, conn, msg->req_id, PS_ENOMEM, "out of memory");
        return UCS_OK;
    }
    psd_conn_ref(conn);
    *r = (values_recv_t){srv, conn, msg->req_id, v->gen, msg->tensor, msg->chunk, msg->crc32c, buf};
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        memcpy(buf, data, length);
        values_landed(NULL, UCS_OK, length, r);
        return UCS_OK;
    }
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.recv_am = values_landed, .user_data = r};
    ps_tcpguard_expect(buf, length); /* a put over TCP may land there (tcpguard.c) */
    void *req = ucp_am_recv_data_nbx(srv->ucx.worker, data, buf, length, &p);
    if (req == NULL)
        values_landed(NULL, UCS_OK, length, r);
    else if (UCS_PTR_IS_ERR(req))
        values_landed(NULL, UCS_PTR_STATUS(req), 0, r);
    return UCS_OK;
}

/* Whether a chunk of @p t here took updates (@p updates) or has pushes, an update or a pull
 * under way; if so, which in @p why. */
static bool tensor_touched(const psd_server_t *srv, const psd_tensor_t *t, bool updates,
                           char *why, size_t len)
{
    for (uint32_t c = 0; c < t->nchunks; c++) {
        const psd_chunk_t *ch = t->chunks[c];
        if (ch == NULL) continue;
        /* A rank's push came (updates), or one is landing now (busy: a full one, of a rank
         * that left, would wait for an update that never comes: a review; the drop lets it
         * go, psd__tensor_forget). */
        bool slots = false;
        for (uint32_t g = 0; g < PS_MAX_RANKS / PSD_SLOT_GROUP; g++)
            for (uint32_t k = 0; ch->slot_group[g] && k < (updates ? 1 : PSD_SLOT_GROUP); k++)
                slots |= updates || ch->slot_group[g][k].state == SLOT_RECEIVING;
        if ((ch->version == 0 || !updates) && !slots && !ch->queued && !ch->applying &&
            ch->pulls == NULL)
            continue;
        snprintf(why, len, "its chunk %u on shard %u %s", c, srv->shard,
                 ch->version && updates        ? "took updates"
                 : slots || ch->queued || ch->applying ? "took pushes"
                                               : "has a pull waiting");
        return true;
    }
    return false;
}

bool psd_shard_tensor_used(const psd_server_t *srv, const psd_tensor_t *t, char *why, size_t len)
{
    return tensor_touched(srv, t, true, why, len);
}

bool psd_shard_tensor_busy(const psd_server_t *srv, const psd_tensor_t *t, char *why, size_t len)
{
    return tensor_touched(srv, t, false, why, len);
}

int psd_shard_drop(psd_server_t *srv, uint32_t id, psd_conn_t *conn, uint64_t req_id)
{
    psd_tensor_t *t = &srv->tensors[id];
    if (psd__wait_add(srv, &t->forgets, conn, req_id, 0, 0, 0, 0)) return PS_ENOMEM;
    if (t->dropping) return 0; /* asked twice: both answered by the one job */
    int rc = queue_create(srv, id | PSD_QUEUE_DROP);
    if (rc) {
        psd__waits_drop_conn(srv, &t->forgets, conn);
        return rc;
    }
    t->dropping = true;
    t->ready = false;
    return 0;
}

/* Whether new tensor @p d cannot fit in the stores, refused then (PS_ESTOREFULL, naming the
 * sizes): its records on a shard, with those of the tensors there, take more than map_size_mb.
 * Before, the create filled the map first, holding the store's writes up for as long (about a
 * minute for tens of GiB). Shard 0, where every declaration starts and which holds every
 * tensor, checks every shard's share with what it holds (decl_bytes), so that no other shard
 * refuses one it took: before, it did not count the others' tensors, a shard that was fuller
 * refused, and shard 0 kept the tensor (psctl export then failed on it). Each shard checks its
 * own again. Counted as tensors are added, not summed over every chunk at each declaration
 * (which made many declarations quadratic). A lower bound (leaf
 * pages, the tree's branch pages and the free list not counted), and an update writes a
 * chunk's new record before the old one's pages are free (copy-on-write), so a tensor near
 * the limit still fails at its first update ("the shard store is full"). */
static bool declare_too_big(psd_server_t *srv, psd_conn_t *conn, uint64_t req_id,
                            const ps_decl_t *d)
{
    uint64_t map = srv->m.map_size_mb << 20;
    for (uint32_t k = 0; k < srv->nshards && k < PS_MAX_SERVERS; k++) {
        if (srv->shard != 0 && k != srv->shard) continue;
        uint64_t need = psd__records_bytes(srv, d, k), have = srv->decl_bytes[k];
        if (have + need <= map) continue;
        char shape[64], was[96] = "";
        ps_shape_str(d->shape, d->ndim, shape, sizeof shape);
        if (have * 10 >= 1 << 20) /* 0.1 MiB or more */
            snprintf(was, sizeof was, ", and its tensors hold %.1f MiB already",
                     (double)have / (1 << 20));
        PS_LOG(PS_LOG_WARN, "shard", "refused declaration of '%s' %s: %.1f MiB on shard %u%s, "
               "map_size_mb %llu", d->name, shape, (double)need / (1 << 20), k, was,
               (unsigned long long)srv->m.map_size_mb);
        psd_send_error(srv, conn, req_id, PS_ESTOREFULL,
                       "cannot declare '%s' %s: its records need %.1f MiB on shard %u (the "
                       "parameters%s%s)%s, more than map_size_mb %llu: raise map_size_mb in "
                       "the manifest or add shards", d->name, shape, (double)need / (1 << 20),
                       k, srv->nstate ? " and the state of " : "",
                       srv->nstate ? ps_optim_name(srv->m.job.optimizer.name) : "", was,
                       (unsigned long long)srv->m.map_size_mb);
        return true;
    }
    return false;
}

void psd_shard_on_declare(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    if (srv->stopping) return; /* the endpoint closes next; the worker sees that */
    if (!msg->has_decl) {
        psd_send_error(srv, conn, msg->req_id, PS_EPROTO, "declare without a tensor");
        return;
    }
    ps_decl_t d = msg->decl;
    if (!isfinite(d.init_arg)) {
        /* Its initializer would make every value NaN or infinite: libps refuses it, and psd
         * too, against a peer that is not libps (a review, session 73). Here, not in the
         * decoder: a declaration an older psd stored with one must stay readable. */
        psd_send_error(srv, conn, msg->req_id, PS_EINVAL, "tensor '%s' has a non-finite "
                       "init_arg", d.name);
        return;
    }
    char want[64], have[64];
    /* Find the tensor by name: the name is the identity users see. */
    psd_tensor_t *t = psd_shard_tensor_named(srv, d.name);
    if (srv->test_confused == 1 && t == NULL && !d.assigned && d.ndim > 0 &&
        d.shape[0] < (1u << 20))
        d.shape[0] *= 2; /* a test hook: a confused shard (libps refuses its answer) */
    if (t && (t->dropping || psd_forget_held(t, conn))) {
        psd_send_error(srv, conn, msg->req_id, PS_EBUSY, "tensor '%s' is being dropped (the "
                       "workers that declared it gave it up, or psctl forget): declare it again "
                       "in a moment", d.name);
        return;
    }
    if (t) {
        if (ps_decl_mean(&d) != ps_decl_mean(&t->decl)) {
            psd_send_error(srv, conn, msg->req_id, PS_ECONFLICT, "tensor '%s' declared as %s, "
                           "but it exists as %s", d.name,
                           ps_decl_mean(&d) ? "a mean of the pushes" : "the optimizer's",
                           ps_decl_mean(&t->decl) ? "a mean of the pushes" : "the optimizer's");
            return;
        }
        if (!same_shape(&t->decl, &d)) {
            ps_shape_str(d.shape, d.ndim, want, sizeof want);
            ps_shape_str(t->decl.shape, t->decl.ndim, have, sizeof have);
            PS_LOG(PS_LOG_WARN, "shard", "refused declaration of '%s' as %s from rank %d: it exists as %s",
                   d.name, want, conn->rank, have);
            psd_send_error(srv, conn, msg->req_id, PS_ECONFLICT,
                           "tensor '%s' declared with shape %s, but it exists with shape %s",
                           d.name, want, have);
            return;
        }
        if (d.assigned && (d.id != t->decl.id || d.first_chunk != t->decl.first_chunk)) {
            psd_send_error(srv, conn, msg->req_id, PS_ECONFLICT,
                           "tensor '%s' declared as id %u at chunk %llu, but it is id %u at chunk %llu",
                           d.name, d.id, (unsigned long long)d.first_chunk, t->decl.id,
                           (unsigned long long)t->decl.first_chunk);
            return;
        }
        if (srv->shard == 0 && d.total_steps != t->decl.total_steps && !t->steps_said) {
            /* The first declaration's length stays (each chunk's learning-rate schedule): said
             * once, as workers of other manifests, or a job restored under another
             * job.workers, train on it (a review, session 73: taken without a word). */
            PS_LOG(PS_LOG_WARN, "shard", "tensor '%s' declared by rank %d with a schedule of "
                   "%llu steps, but it holds %llu (its first declaration's), which stays",
                   d.name, conn->rank, (unsigned long long)d.total_steps,
                   (unsigned long long)t->decl.total_steps);
            t->steps_said = true;
        }
        if (srv->shard == 0 && conn->rank >= 0 && conn->rank < PS_MAX_RANKS)
            t->declared_ranks |= 1ull << conn->rank;
        if (t->values && t->values->giver == conn && t->values->missing > 0)
            values_ask(srv, conn, msg->req_id, t); /* some did not come (a CRC mismatch) */
        else if (t->ready)
            psd__reply_declare(srv, conn, msg->req_id, t);
        else if (psd__wait_add(srv, &t->declares, conn, msg->req_id, 0, 0,
                               ps_decl_init_kind(&d) == PSK_INIT_VALUES ? PS_FLAG_VALUES : 0, 0))
            psd_send_error(srv, conn, msg->req_id, PS_ENOMEM, "out of memory");
        return;
    }
    if (srv->shard == 0 && srv->ntensors >= PSD_MAX_TENSORS) {
        psd_send_error(srv, conn, msg->req_id, PS_EINVAL,
                       "cannot declare '%s': the cluster already holds %u tensors", d.name,
                       PSD_MAX_TENSORS);
        return;
    }
    const ps_optim_conf_t *o = &srv->m.job.optimizer;
    if (o->schedule == PS_SCHED_COSINE && o->decay_steps == 0 && d.total_steps &&
        o->warmup_steps >= d.total_steps && !ps_decl_mean(&d)) {
        /* The decay ends at the planned steps by default: at or before the warm-up's end the
         * rate only climbed, to warmup_steps / total of lr, and never decayed, without a word
         * (a review, session 71; the manifest refuses decay_steps written out so). */
        psd_send_error(srv, conn, msg->req_id, PS_EINVAL,
                       "cannot declare '%s': job.optimizer.warmup_steps %llu is not below the "
                       "%llu steps it plans, where schedule cosine's decay ends (decay_steps 0): "
                       "the rate would only warm up; lower warmup_steps or set decay_steps",
                       d.name, (unsigned long long)o->warmup_steps,
                       (unsigned long long)d.total_steps);
        return;
    }
    if (srv->shard == 0 && psd_coord_bsp_step(srv) > 0) {
        /* Its chunks would start at step 0, and under bsp a chunk takes only the pushes of the
         * step it is at: every member's push of the job's step would be refused as ahead of
         * it, and the shards' step (the lowest chunk's) would read 0 for good. Before, it was
         * created and left so, as by a worker of another model that the coordinator then
         * refused (psd.torch on a store holding another job). */
        PS_LOG(PS_LOG_WARN, "shard", "refused declaration of new tensor '%s' from rank %d: the "
               "bsp job is at step %llu", d.name, conn->rank,
               (unsigned long long)psd_coord_bsp_step(srv));
        psd_send_error(srv, conn, msg->req_id, PS_ECONFLICT,
                       "cannot declare '%s': this cluster's bsp job is at step %llu and holds "
                       "its tensors already; one declared now could not take part in its steps "
                       "(declare every tensor before the first step; another model's job needs "
                       "its own data_dirs)", d.name, (unsigned long long)psd_coord_bsp_step(srv));
        return;
    }
    if (srv->shard == 0) {
        /* The coordinator numbers tensors and their chunks in declaration order. */
        d.id = srv->ntensors;
        d.first_chunk = srv->next_chunk;
        d.assigned = 1;
    } else if (!d.assigned) {
        psd_send_error(srv, conn, msg->req_id, PS_EPROTO,
                       "tensor '%s' must be declared to shard 0 first", d.name);
        return;
    } else if (d.id < srv->ntensors && srv->tensors[d.id].present) {
        psd_send_error(srv, conn, msg->req_id, PS_ECONFLICT, "tensor id %u is '%s', not '%s'",
                       d.id, srv->tensors[d.id].decl.name, d.name);
        return;
    } else if (d.id >= PSD_MAX_TENSORS) {
        psd_send_error(srv, conn, msg->req_id, PS_EPROTO, "tensor id %u out of range", d.id);
        return;
    }
    if (declare_too_big(srv, conn, msg->req_id, &d)) return;
    int rc = psd__tensor_add(srv, &d, false);
    if (rc == 0 && srv->shard == 0 && conn->rank >= 0 && conn->rank < PS_MAX_RANKS)
        srv->tensors[d.id].declared_ranks = 1ull << conn->rank;
    /* Values sent by the declarer: asked for first, created once they all came. */
    bool ask = rc == 0 && ps_decl_init_kind(&d) == PSK_INIT_VALUES &&
               psd__local_chunks(&srv->tensors[d.id]) > 0;
    if (ask)
        rc = values_begin(srv, &srv->tensors[d.id], conn);
    else if (rc == 0)
        rc = psd__wait_add(srv, &srv->tensors[d.id].declares, conn, msg->req_id, 0, 0, 0, 0);
    if (rc == 0 && !ask) rc = queue_create(srv, d.id);
    if (rc) {
        /* Nothing half-made stays: a present tensor never created would hold every later
         * declaration of its name waiting, and its records counted in decl_bytes. */
        if (d.id < srv->cap_tensors) { /* not when the table could not grow to it */
            psd_tensor_t *t = &srv->tensors[d.id];
            for (psd_wait_t *w = t->declares, *nx; w; w = nx) {
                nx = w->next;
                psd_conn_unref(w->conn);
                psd__wait_put(srv, w);
            }
            t->declares = NULL;
            psd__tensor_forget(srv, d.id, true);
        }
        psd_send_error(srv, conn, msg->req_id, rc, "cannot create tensor '%s': %s", d.name,
                       ps_strerror(rc));
        return;
    }
    if (ask) values_ask(srv, conn, msg->req_id, &srv->tensors[d.id]);
    ps_shape_str(d.shape, d.ndim, want, sizeof want);
    PS_LOG(PS_LOG_INFO, "shard", "tensor %u '%s' %s: %u chunks from ordinal %llu%s", d.id, d.name,
           want, srv->tensors[d.id].nchunks, (unsigned long long)d.first_chunk,
           ask ? ", values asked for" : "");
}

