/* pull.c: pull replies, sent from a snapshot of the store (a read transaction kept while
 * replies of it are in flight), or the version to read for a direct pull. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "shard_internal.h"

/* A retired snapshot's read transaction is reset, not freed, and renewed for the next one. */
void psd__snap_retire(psd_server_t *srv, psd_snap_t *s)
{
    mdb_txn_reset(s->txn);
    s->next_free = srv->free_snaps;
    srv->free_snaps = s;
}

static void snap_release(psd_server_t *srv, psd_snap_t *s)
{
    if (--s->refs == 0 && s->stale) psd__snap_retire(srv, s);
}

static psd_snap_t *snap_current(psd_server_t *srv)
{
    if (srv->snap) return srv->snap;
    psd_snap_t *s = srv->free_snaps;
    if (s) {
        srv->free_snaps = s->next_free;
        if (psd_store_snapshot_renew(s->txn)) {
            mdb_txn_abort(s->txn);
            free(s);
            s = NULL;
        }
    }
    if (s == NULL) {
        s = calloc(1, sizeof *s);
        if (s == NULL || psd_store_snapshot(&srv->store, &s->txn)) {
            free(s);
            return NULL;
        }
    }
    s->refs = 0;
    s->stale = false;
    srv->snap = s;
    return s;
}

static void on_pull_sent(void *request, ucs_status_t status, void *user_data)
{
    psd_send_t *s = user_data;
    psd_server_t *srv = s->srv;
    if (status != UCS_OK && !s->conn->dead)
        PS_LOG(PS_LOG_WARN, "shard", "pull reply to %s failed: %s", s->conn->peer,
               ucs_status_string(status));
    if (srv->trace) /* every reply counted in srv->pulls, failed or not */
        psd_trace_pull(srv->trace, s->tensor, s->chunk, s->version, s->asked_ns, s->answered_ns,
                       ps_trace_now(), false, status == UCS_OK);
    snap_release(srv, s->snap);
    psd_conn_unref(s->conn);
    s->next_free = srv->free_sends;
    srv->free_sends = s;
    if (request) ucp_request_free(request);
}

/* The PS_TEST_CORRUPT_PULL hook: a copy of the reply's data with one byte flipped, in the
 * send's own buffer (the snapshot is never written). NULL when out of memory. */
static const void *test_corrupt(psd_send_t *s, const void *data, size_t dlen)
{
    if (dlen == 0) return data;
    if (data != s->payload) {
        if (dlen > s->payload_cap) {
            uint8_t *b = realloc(s->payload, dlen);
            if (b == NULL) return NULL;
            s->payload = b;
            s->payload_cap = dlen;
        }
        memcpy(s->payload, data, dlen);
    }
    s->payload[dlen / 2] ^= 0x10;
    return s->payload;
}

/* The first pull of a chunk since this psd loaded its store checks the parameters of record
 * @p h against their stored CRC-32C (what the worker checks them with), so that parameters
 * damaged at rest are refused with the reason rather than sent: the worker would take the
 * mismatch for the transport's, pull again and give up saying "corrupted in transit". A CRC of
 * the params only, on the loop thread (the record's full hash, state included, is the first
 * update's, on the apply threads: run_apply); once per chunk per run while it matches, at every
 * pull while it does not. Returns true (and says so once per chunk) for damaged parameters. */
static bool params_damaged(psd_server_t *srv, psd_chunk_t *ch, const psd_chunk_hdr_t *h)
{
    if (ch->params_checked) return false;
    if (psd_store_params_crc(h) == h->crc32c) {
        ch->params_checked = true;
        return false;
    }
    if (!ch->damage_logged)
        PS_LOG(PS_LOG_ERROR, "shard", "chunk %u of tensor '%s' (version %llu) in this shard's "
               "store: its parameters do not match their CRC-32C (corrupted at rest); refused "
               "to every pull; psctl verify names the damaged chunks, psctl repair --from "
               "CHECKPOINT rewrites them", ch->chunk, srv->tensors[ch->tensor].decl.name,
               (unsigned long long)h->version);
    ch->damage_logged = true;
    return true;
}

/* An fp16 pull reply @p payload of @p n parameters @p x: counts and says (the 1st, 2nd, 4th
 * ... time) when one reads as an infinity though it is finite (65520 or more in magnitude:
 * fp16's largest is 65504), which the worker would compute with (a probe). */
static void f16_overflow(psd_server_t *srv, const psd_chunk_t *ch, const uint8_t *payload,
                         const float *x, uint32_t n)
{
    const uint8_t *body = payload + PSK_CODEC_HEADER_BYTES;
    uint32_t any = 0;
    for (uint32_t i = 0; i < n; i++) /* an exponent of all ones: vectorized */
        any |= (uint32_t)((body[2 * i + 1] & 0x7c) == 0x7c);
    if (!any) return;
    uint32_t over = 0;
    float top = 0;
    for (uint32_t i = 0; i < n; i++)
        if ((body[2 * i + 1] & 0x7c) == 0x7c && isfinite(x[i])) {
            over++;
            if (fabsf(x[i]) > top) top = fabsf(x[i]);
        }
    if (over == 0) return; /* the parameters themselves are not finite (said elsewhere) */
    uint64_t k = ++srv->f16_overflow_pulls;
    if ((k & (k - 1)) == 0)
        PS_LOG(PS_LOG_WARN, "shard", "a pull of tensor '%s' in fp16 (chunk %u): %u of its "
               "parameters are beyond fp16's range (up to %g; fp16 reaches 65504) and reach the "
               "worker as infinities: pull it as bf16 or none (%llu such replies so far)",
               srv->tensors[ch->tensor].decl.name, ch->chunk, over, (double)top,
               (unsigned long long)k);
}

void psd__send_pull_reply(psd_server_t *srv, psd_conn_t *conn, uint64_t req_id, psd_chunk_t *ch,
                          uint32_t codec, uint32_t flags, uint64_t asked_ns)
{
    if (conn->dead) return;
    if (snap_current(srv) == NULL) {
        psd_send_error(srv, conn, req_id, PS_ESTORE, "cannot open a store snapshot");
        return;
    }
    const psd_chunk_hdr_t *h;
    int rc = psd_store_chunk_get(&srv->store, srv->snap->txn, ch->tensor, ch->chunk, &h);
    if (rc) {
        psd_send_error(srv, conn, req_id, rc, "chunk %u/%u unreadable: %s", ch->tensor, ch->chunk,
                       ps_strerror(rc));
        return;
    }
    if (params_damaged(srv, ch, h)) {
        psd_send_error(srv, conn, req_id, PS_ECORRUPT, "pull of chunk %u of tensor '%s': %s on "
                       "shard %u (psctl verify; psctl repair --from CHECKPOINT)", ch->chunk,
                       srv->tensors[ch->tensor].decl.name, ps_strerror(PS_ECORRUPT), srv->shard);
        return;
    }
    /* The version the reply names: a test hook's lie for chunk 0 (libps must refuse it) */
    uint64_t version = h->version - (srv->test_confused == 3 && ch->chunk == 0 && h->version);
    if (flags & PS_FLAG_DIRECT) {
        /* Relaxed: an apply job on the pool may take it meanwhile; either order is correct.
         * Set, never cleared here: any worker's read since the last update counts. */
        __atomic_store_n(&ch->read_by_peer, true, __ATOMIC_RELAXED);
        /* The committed version and its CRC; the worker reads that record or a later one. */
        ps_msg_t r = {.type = PS_MSG_PULL_REPLY, .req_id = req_id, .tensor = ch->tensor,
                      .chunk = ch->chunk, .step = version, .shard = srv->shard,
                      .crc32c = h->crc32c, .flags = PS_FLAG_DIRECT};
        if (psd_outbox_add(srv, conn, &r, NULL, 0) != 0) psd_send_msg(srv, conn, &r);
        srv->pulls++;
        srv->direct_pulls++;
        if (srv->trace) {
            uint64_t now = ps_trace_now();
            psd_trace_pull(srv->trace, ch->tensor, ch->chunk, h->version, asked_ns, now, now,
                           true, true);
        }
        return;
    }
    psd_send_t *s = srv->free_sends;
    if (s)
        srv->free_sends = s->next_free;
    else if ((s = calloc(1, sizeof *s)) == NULL) {
        psd_send_error(srv, conn, req_id, PS_ENOMEM, "out of memory"); /* was left unanswered */
        return;
    }
    const float *params = psd_chunk_params((psd_chunk_hdr_t *)h);
    const void *data = params;
    size_t dlen = (size_t)h->n * 4;
    psk_codec_t c = {.kind = (psk_codec_kind_t)codec};
    if (codec != PSK_CODEC_NONE) {
        /* Compressed pull: encode from the snapshot into this send's own buffer. */
        dlen = psk_codec_max_bytes(&c, h->n);
        if (dlen > s->payload_cap) {
            uint8_t *b = realloc(s->payload, dlen);
            if (b == NULL) {
                s->next_free = srv->free_sends;
                srv->free_sends = s;
                psd_send_error(srv, conn, req_id, PS_ENOMEM, "out of memory");
                return;
            }
            s->payload = b;
            s->payload_cap = dlen;
        }
        psk_codec_encode_cpu(s->payload, s->payload_cap, &dlen, params, h->n, &c, NULL);
        data = s->payload;
        if (codec == PSK_CODEC_FP16) f16_overflow(srv, ch, s->payload, params, h->n);
    }
    ps_msg_t r = {.type = PS_MSG_PULL_REPLY, .req_id = req_id, .tensor = ch->tensor,
                  .chunk = ch->chunk, .step = version, .length = dlen,
                  .codec = codec, .shard = srv->shard,
                  .crc32c = data == params ? h->crc32c : ps_crc32c(0, data, dlen)};
    if (srv->test_corrupt_pull && ++srv->test_pull_count % srv->test_corrupt_pull == 0 &&
        (data = test_corrupt(s, data, dlen)) == NULL) {
        s->next_free = srv->free_sends;
        srv->free_sends = s;
        psd_send_error(srv, conn, req_id, PS_ENOMEM, "out of memory");
        return;
    }
    if (psd_outbox_add(srv, conn, &r, data, dlen) == 0) { /* copied into the bundle */
        s->next_free = srv->free_sends;
        srv->free_sends = s;
        srv->pulls++;
        if (srv->trace) {
            uint64_t now = ps_trace_now();
            psd_trace_pull(srv->trace, ch->tensor, ch->chunk, h->version, asked_ns, now, now,
                           false, true);
        }
        return;
    }
    psd_outbox_flush(srv, conn);
    s->srv = srv;
    s->conn = conn;
    s->snap = srv->snap;
    s->snap->refs++;
    psd_conn_ref(conn);
    if (srv->trace) {
        s->tensor = ch->tensor;
        s->chunk = ch->chunk;
        s->version = h->version;
        s->asked_ns = asked_ns;
        s->answered_ns = ps_trace_now();
    }
    size_t len;
    psd_encode(srv, conn, &r, s->hdr, sizeof s->hdr, &len);
    uint32_t eager = ps_ucx_eager_flag(conn->eager_below, dlen);
    /* The peer copies the record out of the map (cma): its lines end in the peer's CPU's cache,
     * and the next update's plain stores would take each back first (DESIGN-NOTES.md,
     * "Streaming stores where another CPU reads next"). Not over tcp, eagerly (psd reads the
     * record itself then) or where UCX picks the protocol (eager_below 0: lanes besides the
     * copying ones, or PS_EAGER_BYTES=0). */
    if (data == params && conn->eager_below && eager == 0 && conn->peer_reads)
        __atomic_store_n(&ch->read_by_peer, true, __ATOMIC_RELAXED);
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA |
                                             UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = eager,
                             .cb.send = on_pull_sent, .user_data = s};
    /* The data is the committed record in the snapshot: immutable until released. */
    void *req = ucp_am_send_nbx(conn->ep, PS_AM_DATA, s->hdr, len, data, dlen, &p);
    if (req == NULL)
        on_pull_sent(NULL, UCS_OK, s);
    else if (UCS_PTR_IS_ERR(req))
        on_pull_sent(NULL, UCS_PTR_STATUS(req), s);
    srv->pulls++;
}

/* The chunk @p msg names, or NULL after refusing it. The refusal names the chunk the message
 * named (PS_FLAG_CHUNK): nothing of the message is held, so a push's place in the sender's
 * push area is free again. */
psd_chunk_t *psd__find_chunk(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    if (msg->tensor >= srv->ntensors || !srv->tensors[msg->tensor].present ||
        !srv->tensors[msg->tensor].ready) {
        psd_send_chunk_error(srv, conn, msg->req_id, msg->tensor, msg->chunk, PS_ENOENT,
                             "no tensor with id %u", msg->tensor);
        return NULL;
    }
    psd_tensor_t *t = &srv->tensors[msg->tensor];
    if (msg->chunk >= t->nchunks || t->chunks[msg->chunk] == NULL) {
        psd_send_chunk_error(srv, conn, msg->req_id, msg->tensor, msg->chunk, PS_EPROTO,
                             "tensor '%s' has no chunk %u on shard %u", t->decl.name,
                             msg->chunk, srv->shard);
        return NULL;
    }
    return t->chunks[msg->chunk];
}

void psd_shard_on_pull(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg)
{
    psd_chunk_t *ch = psd__find_chunk(srv, conn, msg);
    if (ch == NULL) return;
    if (srv->test_confused == 2 && msg->chunk == 0) /* a test hook: libps ignores it */
        psd_send_msg(srv, conn, &(ps_msg_t){.type = PS_MSG_DECLARE_REPLY, .req_id = msg->req_id,
                                             .shard = srv->shard});
    uint64_t asked = srv->trace ? ps_trace_now() : 0;
    if (!psk_codec_elementwise(msg->codec)) {
        psd_send_error(srv, conn, msg->req_id, PS_EPROTO,
                       "pull of %u/%u: parameters travel as none, fp16 or bf16, not codec %u",
                       ch->tensor, ch->chunk, msg->codec);
        return;
    }
    /* A raw pull from a worker that opened this shard's store (PS_FLAG_DIRECT) is answered
     * with the version alone: the worker copies the record itself (storeview.h). */
    uint32_t direct = srv->store_path[0] && msg->codec == PSK_CODEC_NONE
                          ? msg->flags & PS_FLAG_DIRECT : 0;
    if (ch->version >= msg->step || srv->m.job.consistency != PS_CONSIST_BSP) {
        psd__send_pull_reply(srv, conn, msg->req_id, ch, msg->codec, direct, asked);
        return;
    }
    if (msg->step > ch->version + 1) {
        psd_send_error(srv, conn, msg->req_id, PS_ESTALE,
                       "pull of %u/%u at version %llu, but the chunk is at %llu", ch->tensor,
                       ch->chunk, (unsigned long long)msg->step, (unsigned long long)ch->version);
        return;
    }
    if (psd__wait_add(srv, &ch->pulls, conn, msg->req_id, msg->step, msg->codec, direct, asked))
        psd_send_error(srv, conn, msg->req_id, PS_ENOMEM, "out of memory");
}

