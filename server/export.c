/* export.c: psctl export and psctl verify, the shard's side (see export.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"

/* One connection's export snapshot. */
typedef struct xsess_s {
    psd_conn_t *conn;    /* NULL once ended (END, a new BEGIN, or the conn went away) */
    MDB_txn *txn;
    int refs;            /* chunk replies in flight that send from txn */
    uint64_t used_ms;    /* uv_now at its BEGIN or last chunk request (psd_export_cron) */
    struct xsess_s *next;
} xsess_t;

/* A reply in flight: the header bytes UCX 1.13 reads until completion, and what it pins. */
typedef struct {
    psd_server_t *srv;
    psd_conn_t *conn;
    xsess_t *sess;       /* chunk replies: the snapshot the data lives in */
    char *text;          /* verify replies: the data */
    uint8_t hdr[PS_WIRE_HDR_MAX];
} xsend_t;

typedef struct {
    uv_work_t work;
    psd_server_t *srv;
    psd_conn_t *conn;
    uint64_t req_id;
    char *text;          /* one line per mismatch */
    size_t len, cap;
    uint64_t checked;
    int rc;
} verify_job_t;

struct psd_export_s {
    xsess_t *sessions;
    int verifying;       /* verify jobs running */
};

static struct psd_export_s *state(psd_server_t *srv)
{
    if (srv->xp == NULL) srv->xp = calloc(1, sizeof *srv->xp);
    return srv->xp;
}

/* ---- sessions -------------------------------------------------------------------------- */

static void sess_maybe_free(psd_server_t *srv, xsess_t *s)
{
    if (s->conn || s->refs) return;
    for (xsess_t **pp = &srv->xp->sessions; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    mdb_txn_abort(s->txn);
    free(s);
}

static xsess_t *sess_of(psd_server_t *srv, psd_conn_t *conn)
{
    for (xsess_t *s = srv->xp ? srv->xp->sessions : NULL; s; s = s->next)
        if (s->conn == conn) return s;
    return NULL;
}

static void sess_end(psd_server_t *srv, xsess_t *s)
{
    if (s == NULL) return;
    psd_conn_unref(s->conn);
    s->conn = NULL;
    sess_maybe_free(srv, s);
}

void psd_export_drop_conn(psd_server_t *srv, psd_conn_t *conn)
{
    sess_end(srv, sess_of(srv, conn));
}

/* How long an export snapshot may go unused before psd ends it (PS_EXPORT_IDLE_MS overrides):
 * a snapshot keeps LMDB from reusing the pages every later update frees, so one held by a
 * stopped or stuck psctl would grow the store until it is full and training stops. psctl
 * asks for a chunk right after the last one landed. */
#define PSD_EXPORT_IDLE_MS 60000u

void psd_export_cron(psd_server_t *srv, uint64_t now_ms)
{
    if (srv->xp == NULL || srv->xp->sessions == NULL) return;
    const char *env = getenv("PS_EXPORT_IDLE_MS");
    uint64_t limit = env && atoi(env) > 0 ? (uint64_t)atoi(env) : PSD_EXPORT_IDLE_MS;
    for (xsess_t *s = srv->xp->sessions, *nx; s; s = nx) {
        nx = s->next;
        if (s->conn == NULL || now_ms - s->used_ms <= limit) continue;
        psd_conn_t *conn = s->conn;
        PS_LOG(PS_LOG_WARN, "export", "the export snapshot of %s was unused for %llu ms (limit "
               "%llu ms): ended, so that the store can reuse its pages%s", conn->peer,
               (unsigned long long)(now_ms - s->used_ms), (unsigned long long)limit,
               s->refs ? "; its connection is closed (a reply to it is still on its way)" : "");
        if (s->refs) { /* a peer that stopped mid-reply: the close cancels the send */
            conn->dead = true;
            conn->close_queued = true;
        }
        sess_end(srv, s); /* frees s now unless a reply still sends from it */
    }
}

bool psd_export_idle(psd_server_t *srv) { return srv->xp == NULL || srv->xp->verifying == 0; }

bool psd_export_reading(const psd_server_t *srv)
{
    return srv->xp && (srv->xp->sessions || srv->xp->verifying);
}

void psd_export_free(psd_server_t *srv)
{
    if (srv->xp == NULL) return;
    for (xsess_t *s = srv->xp->sessions, *nx; s; s = nx) {
        nx = s->next;
        mdb_txn_abort(s->txn);
        free(s);
    }
    free(srv->xp);
    srv->xp = NULL;
}

/* ---- replies --------------------------------------------------------------------------- */

static void on_sent(void *request, ucs_status_t status, void *user_data)
{
    xsend_t *x = user_data;
    if (x->sess) {
        x->sess->refs--;
        sess_maybe_free(x->srv, x->sess);
    }
    psd_conn_unref(x->conn);
    free(x->text);
    free(x);
    if (request) ucp_request_free(request);
}

/* Send @p r with @p len bytes of @p data (which stays valid: it is in @p sess's snapshot or is
 * @p text, owned by the send from here on). */
static void send_reply(psd_server_t *srv, psd_conn_t *conn, ps_msg_t *r, xsess_t *sess,
                       const void *data, size_t len, char *text)
{
    xsend_t *x = calloc(1, sizeof *x);
    size_t hlen;
    r->length = len;
    if (conn->dead || conn->ep == NULL || x == NULL ||
        psd_encode(srv, conn, r, x->hdr, sizeof x->hdr, &hlen)) {
        free(x);
        free(text);
        return;
    }
    x->srv = srv;
    x->conn = conn;
    x->sess = sess;
    x->text = text;
    psd_conn_ref(conn);
    if (sess) sess->refs++;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.send = on_sent, .user_data = x};
    void *req = ucp_am_send_nbx(conn->ep, PS_AM_DATA, x->hdr, hlen, data, len, &p);
    if (req == NULL || UCS_PTR_IS_ERR(req)) on_sent(NULL, UCS_OK, x);
}

/* ---- export ---------------------------------------------------------------------------- */

static void on_begin(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    if (state(srv) == NULL) {
        psd_send_error(srv, conn, msg->req_id, PS_ENOMEM, "out of memory");
        return;
    }
    sess_end(srv, sess_of(srv, conn)); /* a new BEGIN replaces the old snapshot */
    xsess_t *s = calloc(1, sizeof *s);
    int rc = s ? psd_store_snapshot(&srv->store, &s->txn) : PS_ENOMEM;
    if (rc) {
        free(s);
        psd_send_error(srv, conn, msg->req_id, rc, "cannot open a store snapshot: %s",
                       ps_strerror(rc));
        return;
    }
    s->conn = conn;
    s->used_ms = uv_now(srv->loop);
    psd_conn_ref(conn);
    s->next = srv->xp->sessions;
    srv->xp->sessions = s;
    /* The versions as of the snapshot itself (a job may be committing right now). */
    uint64_t vmin = UINT64_MAX, vmax = 0;
    for (uint32_t i = 0; i < srv->ntensors; i++) {
        psd_tensor_t *t = &srv->tensors[i];
        for (uint32_t c = 0; t->present && t->ready && c < t->nchunks; c++) {
            const psd_chunk_hdr_t *h;
            if (t->chunks[c] == NULL || psd_store_chunk_get(&srv->store, s->txn, i, c, &h))
                continue;
            if (h->version < vmin) vmin = h->version;
            if (h->version > vmax) vmax = h->version;
        }
    }
    ps_msg_t r = {.type = PS_MSG_EXPORT_BEGIN_REPLY, .req_id = msg->req_id, .shard = srv->shard,
                  .step = vmin, .step_max = vmax, .count = srv->ntensors, /* vmin: MAX if no chunk */
                  .consistency = (uint32_t)srv->m.job.consistency};
    psd_send_msg(srv, conn, &r);
}

static void on_tensor(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    if (msg->tensor < srv->ntensors && srv->tensors[msg->tensor].present &&
        !srv->tensors[msg->tensor].ready) {
        /* Not "absent": the checkpoint follower drops a tensor a shard lacks (psctl_follow.c
         * drop_part_declared), and this one's declaration is under way here. */
        psd_send_error(srv, conn, msg->req_id, PS_EBUSY, "tensor %u is still being created on "
                       "shard %u", msg->tensor, srv->shard);
        return;
    }
    if (msg->tensor >= srv->ntensors || !srv->tensors[msg->tensor].present) {
        psd_send_error(srv, conn, msg->req_id, PS_ENOENT, "shard %u has no tensor %u", srv->shard,
                       msg->tensor);
        return;
    }
    ps_msg_t r = {.type = PS_MSG_EXPORT_TENSOR_REPLY, .req_id = msg->req_id, .shard = srv->shard,
                  .tensor = msg->tensor, .has_decl = 1, .decl = srv->tensors[msg->tensor].decl};
    psd_send_msg(srv, conn, &r);
}

static void on_chunk(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    xsess_t *s = sess_of(srv, conn);
    if (s == NULL) {
        psd_send_error(srv, conn, msg->req_id, PS_EPROTO, "export_chunk without a snapshot: "
                       "none was begun, or it went unused too long and was ended");
        return;
    }
    s->used_ms = uv_now(srv->loop);
    if (msg->tensor >= srv->ntensors || !srv->tensors[msg->tensor].present ||
        msg->chunk >= srv->tensors[msg->tensor].nchunks ||
        srv->tensors[msg->tensor].chunks[msg->chunk] == NULL) {
        psd_send_error(srv, conn, msg->req_id, PS_ENOENT, "shard %u holds no chunk %u/%u",
                       srv->shard, msg->tensor, msg->chunk);
        return;
    }
    const psd_chunk_hdr_t *h;
    int rc = psd_store_chunk_get(&srv->store, s->txn, msg->tensor, msg->chunk, &h);
    if (rc) {
        psd_send_error(srv, conn, msg->req_id, rc, "chunk %u/%u is not in the snapshot: %s",
                       msg->tensor, msg->chunk, ps_strerror(rc));
        return;
    }
    /* Parameters damaged at rest are refused with the reason, as pulls refuse them (pull.c):
     * sent with their stored CRC, psctl took the mismatch for the transport's and gave up
     * "CRC-32C mismatch 6 times in a row" (an operator probe, session 61). Not the hot path:
     * checked at every export. */
    if (psd_store_params_crc(h) != h->crc32c) {
        psd_send_error(srv, conn, msg->req_id, PS_ECORRUPT, "chunk %u of tensor '%s' (version "
                       "%llu): %s on shard %u (psctl verify; psctl repair --from CHECKPOINT)",
                       msg->chunk, srv->tensors[msg->tensor].decl.name,
                       (unsigned long long)h->version, ps_strerror(PS_ECORRUPT), srv->shard);
        return;
    }
    ps_msg_t r = {.type = PS_MSG_EXPORT_CHUNK_REPLY, .req_id = msg->req_id, .shard = srv->shard,
                  .tensor = msg->tensor, .chunk = msg->chunk, .step = h->version,
                  .length = (uint64_t)h->n * 4, .crc32c = h->crc32c};
    /* Straight from the snapshot: it stays pinned until the send completes. */
    send_reply(srv, conn, &r, s, psd_chunk_params((psd_chunk_hdr_t *)h), (size_t)h->n * 4, NULL);
}

/* ---- verify ---------------------------------------------------------------------------- */

static int verify_chunk(void *arg, uint32_t t, uint32_t c, const void *val, size_t len)
{
    verify_job_t *j = arg;
    const psd_chunk_hdr_t *h = val;
    char line[160];
    int n = 0;
    j->checked++;
    if (len < sizeof *h || len != psd_chunk_bytes(h->n, h->nstate) ||
        h->format != PSD_CHUNK_FORMAT) {
        n = snprintf(line, sizeof line, "%u %u malformed record of %zu bytes\n", t, c, len);
    } else {
        uint64_t now = psd_store_chunk_hash(h);
        uint32_t crc;
        if (now != h->hash)
            n = snprintf(line, sizeof line, "%u %u version %llu stored %016llx bytes %016llx\n", t,
                         c, (unsigned long long)h->version, (unsigned long long)h->hash,
                         (unsigned long long)now);
        else if ((crc = psd_store_params_crc(h)) != h->crc32c) /* pulls would fail for good */
            n = snprintf(line, sizeof line, "%u %u version %llu crc32c stored %08x bytes %08x\n",
                         t, c, (unsigned long long)h->version, h->crc32c, crc);
    }
    if (n <= 0) return 0;
    if (j->len + (size_t)n + 1 > j->cap) {
        size_t cap = j->cap ? 2 * j->cap : 4096;
        char *b = realloc(j->text, cap);
        if (b == NULL) return PS_ENOMEM;
        j->text = b;
        j->cap = cap;
    }
    memcpy(j->text + j->len, line, (size_t)n + 1);
    j->len += (size_t)n;
    return 0;
}

static void verify_work(uv_work_t *w)
{
    verify_job_t *j = w->data;
    MDB_txn *txn;
    j->rc = psd_store_snapshot(&j->srv->store, &txn);
    if (j->rc) return;
    j->rc = psd_store_chunks_each(&j->srv->store, txn, verify_chunk, j);
    mdb_txn_abort(txn);
}

static void verify_done(uv_work_t *w, int status)
{
    verify_job_t *j = w->data;
    psd_server_t *srv = j->srv;
    srv->xp->verifying--;
    if (j->rc) {
        psd_send_error(srv, j->conn, j->req_id, j->rc, "verify failed: %s", ps_strerror(j->rc));
        free(j->text);
    } else {
        PS_LOG(j->len ? PS_LOG_WARN : PS_LOG_INFO, "export",
               "verify: %llu chunks checked, %s", (unsigned long long)j->checked,
               j->len ? "some do not match their stored hash" : "all match");
        ps_msg_t r = {.type = PS_MSG_VERIFY_REPLY, .req_id = j->req_id, .shard = srv->shard,
                      .count = j->checked};
        send_reply(srv, j->conn, &r, NULL, j->text, j->len, j->text);
    }
    psd_conn_unref(j->conn);
    free(j);
    psd_server_maybe_stop(srv);
}

static void on_verify(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    verify_job_t *j = calloc(1, sizeof *j);
    if (state(srv) == NULL || j == NULL) {
        free(j);
        psd_send_error(srv, conn, msg->req_id, PS_ENOMEM, "out of memory");
        return;
    }
    *j = (verify_job_t){.srv = srv, .conn = conn, .req_id = msg->req_id};
    j->work.data = j;
    int rc = uv_queue_work(srv->loop, &j->work, verify_work, verify_done);
    if (rc) {
        free(j);
        psd_send_error(srv, conn, msg->req_id, PS_EIO, "cannot start verify: %s", uv_strerror(rc));
        return;
    }
    psd_conn_ref(conn);
    srv->xp->verifying++;
}

void psd_export_on_msg(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    if (srv->stopping && (msg->type == PS_MSG_EXPORT_BEGIN || msg->type == PS_MSG_VERIFY)) {
        psd_send_error(srv, conn, msg->req_id, PS_EBUSY, "shard %u is shutting down", srv->shard);
        return;
    }
    switch (msg->type) {
    case PS_MSG_EXPORT_BEGIN: on_begin(srv, conn, msg); break;
    case PS_MSG_EXPORT_TENSOR: on_tensor(srv, conn, msg); break;
    case PS_MSG_EXPORT_CHUNK: on_chunk(srv, conn, msg); break;
    case PS_MSG_EXPORT_END: sess_end(srv, sess_of(srv, conn)); break;
    case PS_MSG_VERIFY: on_verify(srv, conn, msg); break;
    default:
        psd_send_error(srv, conn, msg->req_id, PS_EPROTO, "unexpected %s",
                       ps_msg_type_name(msg->type));
    }
}
