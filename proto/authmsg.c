/* authmsg.c: MSG_AUTH first on every client endpoint (see authmsg.h). */
#include "authmsg.h"

#include <stdlib.h>

#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "wire.h"

typedef struct {
    uint8_t hdr[256]; /* read by UCX until the send completes */
} auth_send_t;

static void auth_sent(void *request, ucs_status_t status, void *user_data)
{
    (void)status; /* a failed send fails the endpoint: its owner hears of it there */
    free(user_data);
    if (request) ucp_request_free(request);
}

_Static_assert(PS_AUTH_SESSION == PS_UCX_TOKEN_MAX && PS_AUTH_SESSION == PS_SESSION_MAX,
               "a session token fits the endpoint's token and the header's field");

static void send_proof(ps_ucx_t *u, ucp_ep_h ep, const char *host, uint16_t port, void *arg,
                       ps_ucx_token_t *token)
{
    (void)u;
    const ps_auth_t *a = arg;
    auth_send_t *s = malloc(sizeof *s);
    if (s == NULL) return; /* the shard then refuses this connection's requests, saying why */
    ps_msg_t m = {.type = PS_MSG_AUTH, .rank = -1, .auth_len = PS_AUTH_PROOF_LEN};
    size_t hlen;
    if (ps_auth_prove(a, host, port, m.auth) != 0) {
        PS_LOG(PS_LOG_ERROR, "auth", "no random bytes for a proof: the shard will refuse this "
               "connection");
        free(s);
        return;
    }
    if (ps_msg_encode(&m, s->hdr, sizeof s->hdr, &hlen)) {
        free(s);
        return;
    }
    if (token) {
        ps_auth_session(a, m.auth, token->b);
        token->len = PS_AUTH_SESSION;
        token->proven = 0;
    }
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA |
                                             UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER,
                             .cb.send = auth_sent, .user_data = s};
    void *req = ucp_am_send_nbx(ep, PS_AM_CTRL, s->hdr, hlen, NULL, 0, &p);
    if (req == NULL || UCS_PTR_IS_ERR(req)) free(s);
}

void ps_auth_attach(ps_ucx_t *u, const ps_auth_t *a)
{
    if (!a->on) return;
    u->connected = send_proof;
    u->connected_arg = (void *)a;
}

bool ps_auth_from_shard(const ps_auth_t *a, ps_ucx_token_t *tok, const ps_msg_t *m)
{
    if (!a->on) return true;
    if (m->type == PS_MSG_ERROR && m->status == PS_EAUTH && m->session_len == 0)
        return !tok->proven; /* psd refuses a proof before it seals anything on the connection */
    bool ok = tok->len && ps_auth_session_ok(tok->b, m->session, m->session_len);
    if (ok) tok->proven = 1;
    return ok;
}
