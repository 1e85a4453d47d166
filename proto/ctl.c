/* ctl.c: see ctl.h. */
#include "ctl.h"

#include <stdlib.h>
#include <string.h>

#include "ps/ps_error.h"
#include "ucx_loop.h"

struct ps_ctl_s {
    ps_manifest_t m;
    uint32_t shard;
    uv_loop_t loop;
    ps_ucx_t ucx;
    ucp_ep_h ep;
    int failed;            /* the endpoint broke: reconnect before the next call */
    uint64_t next_req, want_req;
    int have_reply;
    ps_msg_t reply;
    uint8_t hdr[PS_WIRE_HDR_MAX];
    uv_timer_t timer, tick;
    int timed_out;
    char *data;            /* the last reply's data, NUL-terminated */
    size_t data_len;
    int data_pending;      /* a rendezvous receive is still landing */
};

#define CTL_DATA_MAX (16u << 20)

static void on_data(void *request, ucs_status_t status, size_t length, void *user_data)
{
    ps_ctl_t *c = user_data;
    c->data_pending = 0;
    if (status != UCS_OK) c->data_len = 0;
    if (request) ucp_request_free(request);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) { ((ps_ctl_t *)arg)->failed = 1; }

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    ps_ctl_t *c = arg;
    ps_msg_t m;
    char err[256];
    if (ps_msg_decode(&m, header, header_length, err, sizeof err) || m.req_id != c->want_req)
        return UCS_OK; /* data, if any, is dropped */
    c->reply = m;
    c->have_reply = 1;
    free(c->data);
    c->data = NULL;
    c->data_len = 0;
    if (length == 0 || length > CTL_DATA_MAX || (c->data = malloc(length + 1)) == NULL)
        return UCS_OK;
    c->data[length] = '\0';
    c->data_len = length;
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        memcpy(c->data, data, length);
        return UCS_OK;
    }
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.recv_am = on_data, .user_data = c};
    c->data_pending = 1;
    void *req = ucp_am_recv_data_nbx(c->ucx.worker, data, c->data, length, &p);
    if (req == NULL) c->data_pending = 0;
    else if (UCS_PTR_IS_ERR(req)) on_data(NULL, UCS_PTR_STATUS(req), 0, c);
    return UCS_OK;
}

static void on_tick(uv_timer_t *h) {} /* wakes the loop: see ps_ctl_call */

static void on_timer(uv_timer_t *h)
{
    ps_ctl_t *c = h->data;
    c->timed_out = 1;
}

int ps_ctl_open(ps_ctl_t **out, const ps_manifest_t *m, uint32_t shard)
{
    ps_ctl_t *c = calloc(1, sizeof *c);
    if (c == NULL) return PS_ENOMEM;
    c->m = *m;
    c->shard = shard;
    if (uv_loop_init(&c->loop)) {
        free(c);
        return PS_ETRANSPORT;
    }
    if (ps_ucx_init(&c->ucx, &c->loop)) {
        uv_loop_close(&c->loop);
        free(c);
        return PS_ETRANSPORT;
    }
    ps_ucx_set_am_handler(&c->ucx, on_am, c);
    uv_timer_init(&c->loop, &c->timer);
    uv_timer_init(&c->loop, &c->tick);
    c->timer.data = c;
    *out = c;
    return 0;
}

static void drop_ep(ps_ctl_t *c)
{
    if (c->ep == NULL) return;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_EP_CLOSE_FLAG_FORCE};
    ps_ucx_wait(&c->ucx, ucp_ep_close_nbx(c->ep, &p));
    c->ep = NULL;
}

static int connect_ep(ps_ctl_t *c)
{
    if (c->ep && !c->failed) return 0;
    drop_ep(c);
    c->failed = 0;
    const ps_server_conf_t *sc = &c->m.servers[c->shard];
    return ps_ucx_connect(&c->ucx, sc->host, sc->port, on_ep_error, c, &c->ep);
}

int ps_ctl_call(ps_ctl_t *c, ps_msg_t *req, ps_msg_t *reply, uint32_t timeout_ms)
{
    int rc = connect_ep(c);
    if (rc) return rc;
    req->req_id = c->want_req = ++c->next_req;
    size_t hlen;
    if (ps_msg_encode(req, c->hdr, sizeof c->hdr, &hlen)) return PS_EINVAL;
    c->have_reply = 0;
    c->timed_out = 0;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_AM_SEND_FLAG_REPLY};
    void *sreq = ucp_am_send_nbx(c->ep, PS_AM_CTRL, c->hdr, hlen, NULL, 0, &p);
    if (UCS_PTR_IS_ERR(sreq)) {
        c->failed = 1;
        return PS_ETRANSPORT;
    }
    uv_timer_start(&c->timer, on_timer, timeout_ms, 0);
    /* A rendezvous reply's completion does not always wake the worker's event fd (seen with
     * shared memory): a 2 ms tick keeps the loop progressing while a call waits. */
    uv_timer_start(&c->tick, on_tick, 2, 2);
    while ((!c->have_reply || c->data_pending) && !c->timed_out && !c->failed)
        uv_run(&c->loop, UV_RUN_ONCE);
    uv_timer_stop(&c->timer);
    uv_timer_stop(&c->tick);
    if (sreq) { /* the header buffer is reused by the next call: the send must be over */
        if (!c->have_reply) ucp_request_cancel(c->ucx.worker, sreq);
        ps_ucx_wait(&c->ucx, sreq);
    }
    if (!c->have_reply || c->data_pending) {
        c->have_reply = 0;
        c->failed = 1; /* a late reply must not answer the next call: connect afresh */
        return c->timed_out ? PS_ETIMEDOUT : PS_ETRANSPORT;
    }
    *reply = c->reply;
    return reply->type == PS_MSG_ERROR ? (reply->status < 0 ? reply->status : PS_EPROTO) : 0;
}

const char *ps_ctl_reply_data(const ps_ctl_t *c, size_t *len)
{
    if (len) *len = c->data_len;
    return c->data_len ? c->data : NULL;
}

void ps_ctl_close(ps_ctl_t *c)
{
    if (c == NULL) return;
    drop_ep(c);
    free(c->data);
    uv_close((uv_handle_t *)&c->timer, NULL);
    uv_close((uv_handle_t *)&c->tick, NULL);
    ps_ucx_close(&c->ucx);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    uv_loop_close(&c->loop);
    free(c);
}
