/* outbox.c: a shard's small replies to one worker fused into bundles (proto/bundle.h).
 *
 * While the loop handles a bundle from a worker, or finishes an apply job, the acks, small
 * pull replies and errors it produces for a worker that sends bundles itself are appended to
 * that connection's outbox; when the outermost of those ends, every outbox leaves as one
 * eager message. A connection's messages keep their order: anything sent to it directly
 * flushes its outbox first. */
#include <stdlib.h>
#include <string.h>

#include "bundle.h"
#include "ps/ps_error.h"
#include "server.h"

void psd_outbox_begin(psd_server_t *srv) { srv->bundling++; }

void psd_outbox_flush(psd_server_t *srv, psd_conn_t *conn)
{
    psd_send_t *s = conn->outbox;
    if (s == NULL) return;
    conn->outbox = NULL;
    if (conn->dead || conn->ep == NULL) {
        psd_send_done(NULL, UCS_OK, s);
        return;
    }
    ps_msg_t m = {.type = PS_MSG_BUNDLE, .count = s->count, .length = s->len,
                  .shard = srv->shard};
    size_t hlen;
    if (psd_encode(srv, conn, &m, s->hdr, sizeof s->hdr, &hlen)) {
        psd_send_done(NULL, UCS_OK, s);
        return;
    }
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA |
                                             UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_AM_SEND_FLAG_EAGER,
                             .cb.send = psd_send_done, .user_data = s};
    void *req = ucp_am_send_nbx(conn->ep, PS_AM_DATA, s->hdr, hlen, s->payload, s->len, &p);
    if (req == NULL || UCS_PTR_IS_ERR(req)) psd_send_done(NULL, UCS_OK, s);
    srv->bundles_sent++;
}

void psd_outbox_end(psd_server_t *srv)
{
    if (--srv->bundling > 0) return;
    while (srv->outbox_conns) {
        psd_conn_t *c = srv->outbox_conns;
        srv->outbox_conns = c->outbox_next;
        c->outbox_next = NULL;
        c->in_outbox_list = false;
        psd_outbox_flush(srv, c);
    }
}

int psd_outbox_add(psd_server_t *srv, psd_conn_t *conn, const ps_msg_t *msg, const void *data,
                   size_t dlen)
{
    size_t cap = srv->m.fusion_bytes;
    if (srv->bundling == 0 || cap == 0 || !conn->fuses || conn->dead || conn->ep == NULL ||
        dlen > PS_BUNDLE_PART_MAX || ps_bundle_entry_bytes(PS_WIRE_HDR_MAX, dlen) > cap)
        return PS_EINVAL;
    for (int tries = 0; tries < 2; tries++) {
        psd_send_t *s = conn->outbox;
        if (s == NULL) {
            if ((s = srv->free_sends) != NULL)
                srv->free_sends = s->next_free;
            else if ((s = calloc(1, sizeof *s)) == NULL)
                return PS_ENOMEM;
            if (s->payload_cap < cap) {
                uint8_t *b = realloc(s->payload, cap);
                if (b == NULL) {
                    s->next_free = srv->free_sends;
                    srv->free_sends = s;
                    return PS_ENOMEM;
                }
                s->payload = b;
                s->payload_cap = cap;
            }
            s->srv = srv;
            s->conn = conn;
            s->snap = NULL;
            s->len = 0;
            s->count = 0;
            psd_conn_ref(conn);
            conn->outbox = s;
            if (!conn->in_outbox_list) {
                conn->in_outbox_list = true;
                conn->outbox_next = srv->outbox_conns;
                srv->outbox_conns = conn;
            }
        }
        if (s->count < PS_BUNDLE_MAX_ENTRIES &&
            ps_bundle_add(s->payload, cap, &s->len, msg, data, dlen) == 0) {
            s->count++;
            return 0;
        }
        if (s->count == 0) return PS_EINVAL; /* does not fit even alone */
        psd_outbox_flush(srv, conn);        /* full: send it, start the next */
    }
    return PS_EINVAL;
}
