/* evil_peer.c: a hostile worker for the compression integration test (test_compression.c).
 *
 *   evil_peer --manifest FILE [--case NAME | --fuzz N [--seed S]]
 *
 * Speaks psd's wire protocol itself (proto/wire.h over UCX Active Messages, as libps does):
 * connects to shard 0 (client-server sockaddr, PEER error handling), says hello, declares the
 * model's last weight exactly as psworker does (worker/mlp.h: "fc<L>.weight", shape
 * [layers[L-1], layers[L]], xavier, job.seed), pulls chunk 0, and then pushes chunk 0 at the
 * chunk's version:
 *   - a well-formed topk push, which must be acknowledged (the framing below is right);
 *   - one malformed push per case (cases[] below), each of which must get MSG_ERROR with
 *     PS_EPROTO and a text naming the problem, never an acknowledgement;
 *   - a well-formed int8 push, which must be acknowledged (the refusals left the rank's slot
 *     free);
 *   - a raw push whose header's CRC-32C does not match its payload, which must get MSG_ERROR
 *     with PS_ECRC naming the chunk, and then the same push with the right CRC, acknowledged;
 * and pulls chunk 0 again: every value must be finite. Every data message carries the CRC-32C
 * of its payload (computed after a case spoils it: those payloads are malformed, not corrupted),
 * and every pull reply's CRC is checked. Both well-formed pushes carry a zero gradient. One line
 * per step on stdout (seconds since the start first); psd's error text is quoted. --case NAME
 * sends only that malformed push (for reproducing one case by hand).
 *
 * --hello-host S: its hello names host S (a hostile name for psd's status to keep harmless).
 *
 * Then control messages (controls() below): five headers that do not decode, each answered; a
 * launcher's report of 2^32 - 1 workers, refused (PS_EINVAL); with --victim-pid P, a hello on a
 * connection of its own asking for rank 0 with P (the pid of the worker that holds it) and no
 * join serial, refused (PS_ENOTMEMBER; naming the epoch under bsp only); a top-k push of a mean tensor it declares (PS_DECL_MEAN:
 * pushes are values), refused (PS_EPROTO); a declaration with an infinite init_arg, refused
 * (PS_EINVAL); and a connection that never says anything, which psd must close (after the
 * heartbeat timeout, at least 10 s).
 *
 * With --die-mid-send it asks shard 0 for its status and then kills itself (SIGKILL) in the
 * middle of its next send, inside UCX (die_mid_send below): a test of what psd does when a local
 * peer dies while writing into its shared memory.
 *
 * With --fuzz N it sends instead, after the first pull, N messages made at random from valid
 * ones (fuzz() below; a fixed seed, or --seed S), and then psd must still answer a pull of
 * chunk 0 and acknowledge a well-formed int8 push.
 *
 * Exit status: 0 when every check held, 1 when one did not, 2 on bad usage. Every wait is
 * bounded (WAIT_S). A test program: it reports, it never retries. */
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "codec.h"
#include "crc32c.h"
#include "init.h"
#include "manifest.h"
#include "place.h"
#include "ps/ps_error.h"
#include "storeview.h"
#include "ucx_loop.h"
#include "bundle.h"
#include "authmsg.h"
#include "wire.h"

#define WAIT_S 20.0          /* one reply, at most */
#define FMNIST_TRAIN_N 60000 /* training samples: psworker's steps per epoch follow from it */

typedef struct {
    uv_loop_t loop;
    ps_ucx_t ucx;
    uv_timer_t timer;
    ucp_ep_h ep;
    ps_ucx_token_t tok; /* its session token (with a secret_file) */
    int ep_failed;
    ucs_status_t ep_status;
    uint64_t next_req;
    uint64_t want_req; /* the request whose reply we wait for */
    int got_reply;
    ps_msg_t reply;
    uint8_t *data; /* the reply's data (pull replies), [data_cap] */
    size_t data_cap, data_len;
    int data_pending; /* a rendezvous receive is in flight */
    int data_failed;
    uint32_t crc_xor; /* spoils the next data message's CRC (the bad-crc case) */
    int bundles_in;   /* bundles received from psd */
    ps_msg_t hello;   /* the hello reply (its push area, server/pushshm.c) */
    int quiet;        /* --fuzz: replies to what was sent without waiting are not said */
    long unexpected;  /* replies nobody waited for */
} peer_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double g_t0;
/* --hello-host S: the host name its hello gives (libps gives gethostname()'s). */
static const char *g_hello_host;

/* One line on stdout, with the seconds since the start (for reading a log, never asserted). */
static void say(const char *fmt, ...)
{
    printf("[%7.3f] ", now_s() - g_t0);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

/* ---- UCX ------------------------------------------------------------------------------------ */

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    peer_t *p = arg;
    p->ep_failed = 1;
    p->ep_status = status;
    uv_stop(&p->loop);
}

static void on_data(void *request, ucs_status_t status, size_t length, void *user_data)
{
    peer_t *p = user_data;
    p->data_pending = 0;
    if (status != UCS_OK)
        p->data_failed = 1;
    else
        p->data_len = length;
    if (request) ucp_request_free(request);
    uv_stop(&p->loop);
}

static ucs_status_t on_msg(peer_t *p, ps_msg_t m, void *data, size_t length,
                           const ucp_am_recv_param_t *param)
{
    if (m.req_id != p->want_req || p->got_reply) {
        p->unexpected++;
        if (p->quiet) return UCS_OK;
        say("evil_peer: unexpected %s for request %llu%s%s", ps_msg_type_name(m.type),
            (unsigned long long)m.req_id, m.type == PS_MSG_ERROR ? ": " : "",
            m.type == PS_MSG_ERROR ? m.error : "");
        return UCS_OK;
    }
    p->reply = m;
    p->got_reply = 1;
    uv_stop(&p->loop); /* see wait_flag() */
    p->data_len = 0;
    if (length == 0) return UCS_OK;
    if (length > p->data_cap) {
        p->data_failed = 1;
        return UCS_OK;
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        memcpy(p->data, data, length);
        p->data_len = length;
        return UCS_OK;
    }
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                               UCP_OP_ATTR_FIELD_USER_DATA,
                               .cb.recv_am = on_data, .user_data = p};
    p->data_pending = 1;
    void *req = ucp_am_recv_data_nbx(p->ucx.worker, data, p->data, length, &prm);
    if (req == NULL)
        on_data(NULL, UCS_OK, length, p);
    else if (UCS_PTR_IS_ERR(req))
        on_data(NULL, UCS_PTR_STATUS(req), 0, p);
    return UCS_OK;
}

/* A message, or a bundle of them (proto/bundle.h: psd bundles its replies to a peer that sent
 * one): each entry is taken as if it came alone. */
static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    peer_t *p = arg;
    ps_msg_t m;
    char err[256];
    if (ps_msg_decode(&m, header, header_length, err, sizeof err)) {
        say("evil_peer: dropped an undecodable message: %s", err);
        return UCS_OK;
    }
    if (m.type != PS_MSG_BUNDLE) return on_msg(p, m, data, length, param);
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        say("evil_peer: a bundle came by rendezvous");
        return UCS_OK;
    }
    p->bundles_in++;
    ps_bundle_iter_t it;
    ps_bundle_iter_init(&it, data, length, (uint32_t)m.count);
    ucp_am_recv_param_t eager = {.recv_attr = 0};
    const void *d;
    size_t dlen;
    int rc;
    while ((rc = ps_bundle_next(&it, &m, &d, &dlen, err, sizeof err)) != 0) {
        if (rc > 0)
            on_msg(p, m, (void *)d, dlen, &eager);
        else
            say("evil_peer: a malformed bundle from psd: %s", err);
    }
    return UCS_OK;
}

static void on_timer(uv_timer_t *t) { (void)t; }

/* Run the loop until *flag is set (and no receive is pending), the endpoint fails, or
 * timeout_s passes. Returns 0 when the flag was set.
 * Whatever sets a flag also calls uv_stop(): the flag may be set by the progress the loop makes
 * before it blocks (ucx_loop.c's prepare hook), and without uv_stop() uv_run(UV_RUN_ONCE) would
 * then still block for I/O that has already been handled, until the timer. */
static int wait_flag(peer_t *p, const int *flag, double timeout_s)
{
    double end = now_s() + timeout_s;
    while (!(*flag && !p->data_pending) && !p->ep_failed) {
        double left = end - now_s();
        if (left <= 0) return -1;
        uv_timer_start(&p->timer, on_timer, (uint64_t)(left * 1000) + 1, 0);
        uv_run(&p->loop, UV_RUN_ONCE);
        uv_timer_stop(&p->timer);
    }
    return *flag && !p->data_pending ? 0 : -1;
}

typedef struct {
    int done;
    ucs_status_t status;
    uv_loop_t *loop;
} sent_t;

static void on_sent(void *request, ucs_status_t status, void *user_data)
{
    sent_t *s = user_data;
    s->done = 1;
    s->status = status;
    if (request) ucp_request_free(request);
    uv_stop(s->loop);
}

/* Send the encoded header @p hdr and @p data on AM id @p am and wait (WAIT_S at most) until
 * UCX is done with both. Returns UCS_OK, the send's failure, or UCS_ERR_TIMED_OUT (the send is
 * cancelled then). Both buffers must stay put until it returns. */
static ucs_status_t send_am(peer_t *p, const uint8_t *hdr, size_t hlen, const void *data,
                            size_t len, unsigned am)
{
    /* static: a send cancelled at a timeout completes later, after this call has returned */
    static sent_t sent;
    sent = (sent_t){.loop = &p->loop};
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                               UCP_OP_ATTR_FIELD_USER_DATA |
                                               UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_AM_SEND_FLAG_REPLY,
                               .cb.send = on_sent, .user_data = &sent};
    void *req = ucp_am_send_nbx(p->ep, am, hdr, hlen, data, len, &prm);
    if (req == NULL) return UCS_OK;
    if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
    if (wait_flag(p, &sent.done, WAIT_S) != 0) {
        if (!sent.done) ucp_request_cancel(p->ucx.worker, req);
        return UCS_ERR_TIMED_OUT;
    }
    return sent.status;
}

/*
 * Send @p m (req_id set here) with @p data on AM id @p am and wait for its reply into p->reply.
 * @return 0 when a reply came; -1 (with a line said) when the send failed or no reply came.
 */
static int call(peer_t *p, ps_msg_t *m, const void *data, size_t len, unsigned am)
{
    static uint8_t hdr[PS_WIRE_HDR_MAX];
    size_t hlen;
    m->req_id = ++p->next_req;
    if (data) m->crc32c = ps_crc32c(0, data, len) ^ p->crc_xor;
    if (ps_msg_encode_sealed(m, p->tok.b, p->tok.len, hdr, sizeof hdr, &hlen)) {
        say("evil_peer: cannot encode a %s header", ps_msg_type_name(m->type));
        return -1;
    }
    p->want_req = m->req_id;
    p->got_reply = 0;
    p->data_failed = 0;
    ucs_status_t st = send_am(p, hdr, hlen, data, len, am);
    if (st != UCS_OK && st != UCS_ERR_TIMED_OUT) {
        say("evil_peer: sending %s: %s", ps_msg_type_name(m->type), ucs_status_string(st));
        return -1;
    }
    if (st != UCS_OK || wait_flag(p, &p->got_reply, WAIT_S) != 0) {
        if (p->ep_failed)
            say("evil_peer: %s: the connection to shard 0 failed: %s", ps_msg_type_name(m->type),
                ucs_status_string(p->ep_status));
        else
            say("evil_peer: %s: no reply within %.0f s", ps_msg_type_name(m->type), WAIT_S);
        return -1;
    }
    if (p->data_failed) {
        say("evil_peer: %s: the reply's data was lost or too large", ps_msg_type_name(m->type));
        return -1;
    }
    if (p->data_len && ps_crc32c(0, p->data, p->data_len) != p->reply.crc32c) {
        say("evil_peer: %s: the reply's CRC-32C does not match its data", ps_msg_type_name(m->type));
        return -1;
    }
    return 0;
}

static int connect_shard0(peer_t *p, const ps_manifest_t *m)
{
    const ps_server_conf_t *sc = &m->servers[0];
    int rc = ps_ucx_connect(&p->ucx, sc->host, sc->port, on_ep_error, p, &p->ep, &p->tok);
    if (rc) {
        say("evil_peer: cannot connect to %s:%u: %s", sc->host, sc->port, ps_strerror(rc));
        return -1;
    }
    return 0;
}

/* ---- the protocol ---------------------------------------------------------------------------- */

typedef struct {
    int rank;
    uint32_t tensor;
    uint32_t n; /* values in chunk 0 */
    uint64_t version;
} target_t;

/* Pull chunk 0 raw; every value must be finite. Returns 0, or -1 with a line said. */
static int pull_chunk0(peer_t *p, target_t *t, const char *when)
{
    ps_msg_t m = {.type = PS_MSG_PULL, .rank = t->rank, .tensor = t->tensor, .chunk = 0,
                  .step = 0, .codec = PSK_CODEC_NONE};
    if (call(p, &m, NULL, 0, PS_AM_CTRL)) return -1;
    if (p->reply.type != PS_MSG_PULL_REPLY) {
        say("evil_peer: pull %s: got %s: %s", when, ps_msg_type_name(p->reply.type),
            p->reply.error);
        return -1;
    }
    if (p->data_len != (size_t)t->n * 4) {
        say("evil_peer: pull %s: %zu bytes, want %zu", when, p->data_len, (size_t)t->n * 4);
        return -1;
    }
    const float *v = (const float *)p->data;
    uint32_t bad = 0;
    for (uint32_t i = 0; i < t->n; i++)
        bad += !isfinite(v[i]);
    if (bad) {
        say("evil_peer: pull %s: %u of %u values of chunk 0 are not finite", when, bad, t->n);
        return -1;
    }
    t->version = p->reply.step;
    say("evil_peer: pull %s: chunk 0 at version %llu, %u values, all finite", when,
        (unsigned long long)t->version, t->n);
    return 0;
}

/* A push header for chunk 0 of the target under codec @p c (kind may be any number). */
static ps_msg_t push_msg(const target_t *t, uint32_t kind, const psk_codec_t *c, uint64_t length)
{
    return (ps_msg_t){.type = PS_MSG_PUSH, .rank = t->rank, .tensor = t->tensor, .chunk = 0,
                      .step = t->version, .codec = kind, .length = length,
                      .codec_fraction = c ? c->fraction : 0, .codec_block = c ? c->block : 0,
                      .codec_flags = c && c->fp16_values ? 1 : 0};
}

/* A well-formed push of a zero gradient under @p c: it must be acknowledged. */
static int push_good(peer_t *p, target_t *t, const psk_codec_t *c, const char *what)
{
    size_t n = t->n, cap = psk_codec_max_bytes(c, n), len = 0;
    size_t scr = psk_codec_scratch_bytes(c, n);
    float *zeros = calloc(n, sizeof *zeros);
    uint8_t *buf = malloc(cap);
    void *scratch = scr ? malloc(scr) : NULL;
    int rc = -1;
    if (!zeros || !buf || (scr && !scratch) ||
        psk_codec_encode_cpu(buf, cap, &len, zeros, n, c, scratch) != 0) {
        say("evil_peer: %s: cannot encode", what);
        goto out;
    }
    ps_msg_t m = push_msg(t, c->kind, c, len);
    if (call(p, &m, buf, len, PS_AM_DATA)) goto out;
    if (p->reply.type != PS_MSG_PUSH_ACK) {
        say("evil_peer: %s: FAILED: got %s (status %d): %s", what,
            ps_msg_type_name(p->reply.type), p->reply.status, p->reply.error);
        goto out;
    }
    say("evil_peer: %s: acknowledged at version %llu", what, (unsigned long long)p->reply.step);
    t->version = p->reply.step;
    rc = 0;
out:
    free(zeros);
    free(buf);
    free(scratch);
    return rc;
}

/* ---- the malformed pushes -------------------------------------------------------------------- */

typedef struct {
    const char *name;
    uint32_t kind;     /* the header's codec number */
    psk_codec_t codec; /* encodes the payload first (kind NONE: raw fp32) */
    /* Spoil the payload: buf[*len] (room for 8 more bytes); may change *len and *hdr_len
     * (the length the header claims). */
    void (*spoil)(uint8_t *buf, size_t *len, uint64_t *hdr_len, uint32_t n, const psk_codec_t *c);
    const char *expect; /* printf format of what psd's error must contain; %u: n, %zu: bytes */
} bad_case_t;

static void st32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void stf32(uint8_t *p, float v) { memcpy(p, &v, 4); }

/* 4 bytes more data than the header says (the header's length is the right one). */
static void spoil_longer(uint8_t *b, size_t *len, uint64_t *hdr_len, uint32_t n,
                         const psk_codec_t *c)
{
    memset(b + *len, 0, 4);
    *len += 4;
}
/* The codec header's n (bytes 4..7) one more than the chunk's. */
static void spoil_header_n(uint8_t *b, size_t *len, uint64_t *hdr_len, uint32_t n,
                           const psk_codec_t *c)
{
    st32(b + 4, n + 1);
}
/* The last topk index is n: strictly increasing still, but out of range. */
static void spoil_index_range(uint8_t *b, size_t *len, uint64_t *hdr_len, uint32_t n,
                              const psk_codec_t *c)
{
    size_t k = psk_codec_k(c, n);
    st32(b + PSK_CODEC_HEADER_BYTES + 4 * (k - 1), n);
}
/* The second topk index repeats the first. */
static void spoil_index_repeat(uint8_t *b, size_t *len, uint64_t *hdr_len, uint32_t n,
                               const psk_codec_t *c)
{
    memcpy(b + PSK_CODEC_HEADER_BYTES + 4, b + PSK_CODEC_HEADER_BYTES, 4);
}
/* The first block's scale (int8, sign) is NaN / +inf / negative. */
static void spoil_scale_nan(uint8_t *b, size_t *len, uint64_t *hdr_len, uint32_t n,
                            const psk_codec_t *c)
{
    stf32(b + PSK_CODEC_HEADER_BYTES, NAN);
}
static void spoil_scale_inf(uint8_t *b, size_t *len, uint64_t *hdr_len, uint32_t n,
                            const psk_codec_t *c)
{
    stf32(b + PSK_CODEC_HEADER_BYTES, INFINITY);
}
/* Finite, but 127 x it is not: decoded, an int8 value of 127 was an infinity. */
static void spoil_scale_huge(uint8_t *b, size_t *len, uint64_t *hdr_len, uint32_t n,
                             const psk_codec_t *c)
{
    stf32(b + PSK_CODEC_HEADER_BYTES, 1e37f);
}
static void spoil_scale_neg(uint8_t *b, size_t *len, uint64_t *hdr_len, uint32_t n,
                            const psk_codec_t *c)
{
    stf32(b + PSK_CODEC_HEADER_BYTES, -1.0f);
}
/* The first int8 value is -128, which the encoder never writes. */
static void spoil_q_min(uint8_t *b, size_t *len, uint64_t *hdr_len, uint32_t n,
                        const psk_codec_t *c)
{
    size_t nb = (n + c->block - 1) / c->block;
    b[PSK_CODEC_HEADER_BYTES + 4 * nb] = 0x80;
}
/* Raw fp32, 4 bytes short, the header agreeing with the data. */
static void spoil_raw_short(uint8_t *b, size_t *len, uint64_t *hdr_len, uint32_t n,
                            const psk_codec_t *c)
{
    *len -= 4;
    *hdr_len = *len;
}

#define TOPK {.kind = PSK_CODEC_TOPK, .fraction = 0.1f}
#define INT8 {.kind = PSK_CODEC_INT8, .block = PSK_CODEC_BLOCK_DEFAULT}
#define SIGN {.kind = PSK_CODEC_SIGN, .block = PSK_CODEC_BLOCK_DEFAULT}
#define MALFORMED "malformed payload"

/* The refusals after receipt name what is wrong (psk_codec_check_why; before, every one read
 * "malformed payload (length, indices or scales)", a review, session 71). */
static const bad_case_t cases[] = {
    {"length-mismatch", PSK_CODEC_TOPK, TOPK, spoil_longer, "carries %zu bytes (header says"},
    {"header-n", PSK_CODEC_TOPK, TOPK, spoil_header_n,
     MALFORMED ": header byte 4 is 0x"},
    {"topk-index-range", PSK_CODEC_TOPK, TOPK, spoil_index_range, MALFORMED ": index "},
    {"topk-index-repeat", PSK_CODEC_TOPK, TOPK, spoil_index_repeat, MALFORMED ": index 1 is "},
    {"int8-scale-nan", PSK_CODEC_INT8, INT8, spoil_scale_nan,
     MALFORMED ": the scale of block 0 is nan"},
    {"int8-scale-negative", PSK_CODEC_INT8, INT8, spoil_scale_neg,
     MALFORMED ": the scale of block 0 is -1"},
    {"int8-scale-huge", PSK_CODEC_INT8, INT8, spoil_scale_huge,
     MALFORMED ": the scale of block 0 is 1e+37 (0 to FLT_MAX / 127"},
    {"int8-q-128", PSK_CODEC_INT8, INT8, spoil_q_min, MALFORMED ": value 0 is -128"},
    {"sign-scale-inf", PSK_CODEC_SIGN, SIGN, spoil_scale_inf,
     MALFORMED ": the scale of block 0 is inf"},
    {"unknown-codec-9", 9, TOPK, NULL, "unknown or invalid codec 9"},
    {"raw-short", PSK_CODEC_NONE, {.kind = PSK_CODEC_NONE}, spoil_raw_short,
     "carries %zu bytes (header says %zu), expected %u"},
};

/* Malformed payloads whose refusal comes after receipt (psk_codec_check): psd logs each as
 * "rejected a malformed T/0 payload from rank R". The test counts these lines. */
static int after_receipt(const bad_case_t *bc)
{
    return strncmp(bc->expect, MALFORMED, strlen(MALFORMED)) == 0;
}

static int push_bad(peer_t *p, const target_t *t, const bad_case_t *bc)
{
    uint32_t n = t->n;
    const psk_codec_t *c = &bc->codec;
    size_t cap = (c->kind == PSK_CODEC_NONE ? (size_t)n * 4 : psk_codec_max_bytes(c, n)) + 8;
    size_t scr = psk_codec_scratch_bytes(c, n), len = 0;
    float *g = malloc((size_t)n * sizeof *g);
    uint8_t *buf = calloc(1, cap);
    void *scratch = scr ? malloc(scr) : NULL;
    int rc = -1;
    if (!g || !buf || (scr && !scratch)) {
        say("evil_peer: %s: out of memory", bc->name);
        goto out;
    }
    for (uint32_t i = 0; i < n; i++) /* any finite gradient: these pushes must never apply */
        g[i] = (float)(1e-3 * sin(0.37 * i));
    if (c->kind == PSK_CODEC_NONE) {
        memcpy(buf, g, (size_t)n * 4);
        len = (size_t)n * 4;
    } else if (psk_codec_encode_cpu(buf, cap, &len, g, n, c, scratch) != 0) {
        say("evil_peer: %s: cannot encode", bc->name);
        goto out;
    }
    uint64_t hdr_len = len;
    if (bc->spoil) bc->spoil(buf, &len, &hdr_len, n, c);
    char want[160];
    /* Only the formats below are used: "%zu ... %zu ... %u" or a prefix of it. */
    snprintf(want, sizeof want, bc->expect, len, (size_t)hdr_len, n * 4);
    ps_msg_t m = push_msg(t, bc->kind, c, hdr_len);
    if (call(p, &m, buf, len, PS_AM_DATA)) {
        say("evil_peer: case %s: FAILED: no reply", bc->name);
        goto out;
    }
    const ps_msg_t *r = &p->reply;
    if (r->type != PS_MSG_ERROR) {
        say("evil_peer: case %s: FAILED: got %s, not an error", bc->name,
            ps_msg_type_name(r->type));
        goto out;
    }
    if (r->status != PS_EPROTO || strstr(r->error, want) == NULL) {
        say("evil_peer: case %s: FAILED: error %d (%s) \"%s\", want %d and \"%s\"", bc->name,
            r->status, ps_err_name(r->status), r->error, PS_EPROTO, want);
        goto out;
    }
    say("evil_peer: case %s: refused (%s): %s", bc->name, ps_err_name(r->status), r->error);
    rc = 0;
out:
    free(g);
    free(buf);
    free(scratch);
    return rc;
}

/* A raw zero-gradient push whose CRC is wrong must be refused with PS_ECRC naming chunk 0 and
 * never applied; sent again with the right CRC it is acknowledged. */
static int push_bad_crc(peer_t *p, target_t *t)
{
    uint32_t n = t->n;
    float *zeros = calloc(n, sizeof *zeros);
    int rc = -1;
    if (zeros == NULL) return -1;
    ps_msg_t m = push_msg(t, PSK_CODEC_NONE, NULL, (uint64_t)n * 4);
    p->crc_xor = 0x1;
    int sent = call(p, &m, zeros, (size_t)n * 4, PS_AM_DATA);
    p->crc_xor = 0;
    if (sent) goto out;
    const ps_msg_t *r = &p->reply;
    if (r->type != PS_MSG_ERROR || r->status != PS_ECRC || r->chunk != 0 ||
        r->tensor != t->tensor || strstr(r->error, "CRC-32C mismatch") == NULL) {
        say("evil_peer: case bad-crc: FAILED: got %s (status %d %s) \"%s\"",
            ps_msg_type_name(r->type), r->status, ps_err_name(r->status), r->error);
        goto out;
    }
    say("evil_peer: case bad-crc: refused (%s): %s", ps_err_name(r->status), r->error);
    m = push_msg(t, PSK_CODEC_NONE, NULL, (uint64_t)n * 4);
    if (call(p, &m, zeros, (size_t)n * 4, PS_AM_DATA)) goto out;
    if (p->reply.type != PS_MSG_PUSH_ACK) {
        say("evil_peer: bad-crc push sent again: FAILED: got %s: %s",
            ps_msg_type_name(p->reply.type), p->reply.error);
        goto out;
    }
    t->version = p->reply.step;
    say("evil_peer: bad-crc push sent again with the right CRC: acknowledged");
    rc = 0;
out:
    free(zeros);
    return rc;
}

/* ---- direct pushes (server/pushshm.c) ----------------------------------------------------- */

/* Send direct push @p m (no data) and expect an error with @p status whose text has @p want,
 * naming the push's chunk (PS_FLAG_CHUNK: libps then frees the push's place). */
static int direct_refused(peer_t *p, ps_msg_t *m, int status, const char *want, const char *what)
{
    if (call(p, m, NULL, 0, PS_AM_CTRL)) return -1;
    const ps_msg_t *r = &p->reply;
    if (r->type != PS_MSG_ERROR || r->status != status || strstr(r->error, want) == NULL ||
        !(r->flags & PS_FLAG_CHUNK) || r->tensor != m->tensor || r->chunk != m->chunk) {
        say("evil_peer: direct push %s: FAILED: got %s (status %d %s, flags %u, %u/%u) \"%s\"",
            what, ps_msg_type_name(r->type), r->status, ps_err_name(r->status), r->flags,
            r->tensor, r->chunk, r->error);
        return -1;
    }
    say("evil_peer: direct push %s: refused (%s): %s", what, ps_err_name(r->status), r->error);
    return 0;
}

/* Direct pushes that point outside the push area, at an unaligned place, carry data or a codec
 * (or beyond the places this shard's chunks take) are refused, each naming its reason; one whose bytes in the area do not match its CRC is
 * refused with PS_ECRC; a right one is acknowledged. */
static int direct_pushes(peer_t *p, target_t *t)
{
    const ps_msg_t *h = &p->hello;
    if (h->area_id == 0 || h->area_size < (uint64_t)t->n * 4) {
        say("evil_peer: direct push: FAILED: the hello reply offered no push area");
        return -1;
    }
    int failed = 0, refused = 0;
    uint64_t len = (uint64_t)t->n * 4;
    ps_msg_t m = push_msg(t, PSK_CODEC_NONE, NULL, len);
    m.flags = PS_FLAG_DIRECT;
    m.area_offset = (h->area_size - len + 64) & ~63ull; /* runs past the end */
    refused += direct_refused(p, &m, PS_EPROTO, "not inside the push area", "past the area") == 0;
    m.area_offset = ~0ull - 63;
    refused += direct_refused(p, &m, PS_EPROTO, "not inside the push area", "at 2^64-64") == 0;
    m.area_offset = 8;
    refused += direct_refused(p, &m, PS_EPROTO, "not 64-byte aligned", "unaligned") == 0;
    /* Inside the area, far beyond what this shard's chunks take: reading it would make psd
     * allocate pages nobody wrote (a review, session 58). */
    m.area_offset = (h->area_size - len) & ~4095ull;
    refused += direct_refused(p, &m, PS_EPROTO, "beyond the places this shard's chunks take",
                              "beyond the chunks' places") == 0;
    m.area_offset = 0;
    float zero[16] = {0};
    if (call(p, &m, zero, sizeof zero, PS_AM_DATA) == 0 && p->reply.type == PS_MSG_ERROR &&
        strstr(p->reply.error, "carries no data")) {
        say("evil_peer: direct push with data: refused: %s", p->reply.error);
        refused++;
    } else {
        say("evil_peer: direct push with data: FAILED: got %s: %s",
            ps_msg_type_name(p->reply.type), p->reply.error);
    }
    psk_codec_t topk = TOPK;
    m = push_msg(t, topk.kind, &topk, psk_codec_max_bytes(&topk, t->n));
    m.flags = PS_FLAG_DIRECT;
    refused += direct_refused(p, &m, PS_EPROTO, "only raw fp32", "with a codec") == 0;
    /* Refused before psd finds a chunk: still named, so libps frees the place. */
    m = push_msg(t, PSK_CODEC_NONE, NULL, len);
    m.flags = PS_FLAG_DIRECT;
    m.chunk = 1u << 30;
    refused += direct_refused(p, &m, PS_EPROTO, "has no chunk", "of no chunk") == 0;
    m.chunk = 0;
    m.tensor = 1u << 20;
    refused += direct_refused(p, &m, PS_ENOENT, "no tensor with id", "of no tensor") == 0;
    say("evil_peer: %d of 8 malformed direct pushes refused as expected", refused);
    failed += refused != 8;

    char path[64];
    snprintf(path, sizeof path, "/proc/%u/fd/%u", h->pid, h->area_fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    uint8_t *area = fd < 0 ? MAP_FAILED
                           : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (area == MAP_FAILED) {
        say("evil_peer: direct push: FAILED: cannot map %s", path);
        return -1;
    }
    memset(area, 0, len); /* a zero gradient at offset 0 */
    m = push_msg(t, PSK_CODEC_NONE, NULL, len);
    m.flags = PS_FLAG_DIRECT;
    m.crc32c = ps_crc32c(0, area, len) ^ 1;
    if (call(p, &m, NULL, 0, PS_AM_CTRL) || p->reply.type != PS_MSG_ERROR ||
        p->reply.status != PS_ECRC) {
        say("evil_peer: direct push with a wrong CRC: FAILED: got %s: %s",
            ps_msg_type_name(p->reply.type), p->reply.error);
        failed++;
    } else {
        say("evil_peer: direct push with a wrong CRC: refused (ECRC)");
    }
    m = push_msg(t, PSK_CODEC_NONE, NULL, len);
    m.flags = PS_FLAG_DIRECT;
    m.crc32c = ps_crc32c(0, area, len);
    if (call(p, &m, NULL, 0, PS_AM_CTRL) || p->reply.type != PS_MSG_PUSH_ACK) {
        say("evil_peer: direct push: FAILED: got %s: %s", ps_msg_type_name(p->reply.type),
            p->reply.error);
        failed++;
    } else {
        t->version = p->reply.step;
        say("evil_peer: direct push: acknowledged");
    }
    munmap(area, len);
    return failed ? -1 : 0;
}

/* ---- values sent with a declaration (PSK_INIT_VALUES) ------------------------------------- */

/* Send values @p m with @p len bytes of @p data; expect an error with @p status whose text has
 * @p want. */
static int values_refused(peer_t *p, ps_msg_t *m, const void *data, size_t len, int status,
                          const char *want, const char *what)
{
    m->length = len;
    if (call(p, m, data, len, PS_AM_DATA)) return -1;
    const ps_msg_t *r = &p->reply;
    if (r->type != PS_MSG_ERROR || r->status != status || strstr(r->error, want) == NULL) {
        say("evil_peer: values %s: FAILED: got %s (%s) \"%s\"", what,
            ps_msg_type_name(r->type), ps_err_name(r->status), r->error);
        return -1;
    }
    say("evil_peer: values %s: refused (%s): %s", what, ps_err_name(r->status), r->error);
    return 0;
}

/* evil_peer --case values: values for a tensor that exists, and for one its declaration
 * creates: short, of no chunk, with a wrong CRC, holding a NaN; each is refused naming why.
 * Then the right ones: acknowledged, the tensor is created from them (the declaration again
 * is answered) and a pull returns them. */
static int values(peer_t *p, const target_t *t)
{
    enum { N = 200 };
    static float v[N], nan_v[N];
    uint32_t n = t->n < N ? t->n : N;
    size_t len = (size_t)n * 4;
    for (uint32_t i = 0; i < n; i++) v[i] = nan_v[i] = 0.25f * (float)i - 3.0f;
    nan_v[n / 2] = NAN;
    int refused = 0;
    ps_msg_t m = {.type = PS_MSG_VALUES, .rank = t->rank, .tensor = t->tensor};
    refused += values_refused(p, &m, v, len, PS_EPROTO, "does not create it",
                              "of a tensor held") == 0;
    ps_msg_t decl = {.type = PS_MSG_DECLARE, .rank = t->rank, .has_decl = 1};
    snprintf(decl.decl.name, sizeof decl.decl.name, "evil.values");
    decl.decl.ndim = 1;
    decl.decl.shape[0] = n;
    decl.decl.init = PSK_INIT_VALUES;
    if (call(p, &decl, NULL, 0, PS_AM_CTRL) || p->reply.type != PS_MSG_DECLARE_REPLY ||
        !(p->reply.flags & PS_FLAG_VALUES) || !p->reply.decl.assigned) {
        say("evil_peer: values: FAILED: the declaration got %s (flags %u): %s",
            ps_msg_type_name(p->reply.type), p->reply.flags, p->reply.error);
        return -1;
    }
    decl.decl = p->reply.decl;
    m.tensor = decl.decl.id;
    refused += values_refused(p, &m, v, len - 4, PS_EPROTO, "another number of values",
                              "one value short") == 0;
    m.chunk = 1;
    refused += values_refused(p, &m, v, len, PS_EPROTO, "no such chunk", "of no chunk") == 0;
    m.chunk = 0;
    p->crc_xor = 1; /* call() sets the CRC of the data it sends */
    refused += values_refused(p, &m, v, len, PS_ECRC, "CRC-32C", "with a wrong CRC") == 0;
    p->crc_xor = 0;
    refused += values_refused(p, &m, nan_v, len, PS_EINVAL, "NaN", "holding a NaN") == 0;
    say("evil_peer: %d of 5 malformed values refused as expected", refused);
    m.length = len;
    if (call(p, &m, v, len, PS_AM_DATA) || p->reply.type != PS_MSG_VALUES_REPLY) {
        say("evil_peer: values: FAILED: got %s: %s", ps_msg_type_name(p->reply.type),
            p->reply.error);
        return -1;
    }
    if (call(p, &decl, NULL, 0, PS_AM_CTRL) || p->reply.type != PS_MSG_DECLARE_REPLY ||
        (p->reply.flags & PS_FLAG_VALUES)) {
        say("evil_peer: values: FAILED: the second declaration got %s (flags %u): %s",
            ps_msg_type_name(p->reply.type), p->reply.flags, p->reply.error);
        return -1;
    }
    ps_msg_t pull = {.type = PS_MSG_PULL, .rank = t->rank, .tensor = m.tensor, .chunk = 0,
                     .codec = PSK_CODEC_NONE};
    if (call(p, &pull, NULL, 0, PS_AM_CTRL) || p->reply.type != PS_MSG_PULL_REPLY ||
        p->data_len != len || memcmp(p->data, v, len) != 0) {
        say("evil_peer: values: FAILED: the pull got %s (%zu bytes): %s",
            ps_msg_type_name(p->reply.type), p->data_len, p->reply.error);
        return -1;
    }
    say("evil_peer: tensor created from the values sent: a pull returns them");
    return refused == 5 ? 0 : -1;
}

/* ---- bundles (proto/bundle.h) ------------------------------------------------------------ */

/* One entry's bytes, written by hand (a malformed one needs lengths the writer refuses). */
static size_t put_entry(uint8_t *b, const ps_msg_t *m, uint32_t claim_dlen, const void *data,
                        size_t dlen)
{
    uint8_t hdr[PS_WIRE_HDR_MAX];
    size_t hlen = 0;
    ps_msg_encode(m, hdr, sizeof hdr, &hlen);
    uint32_t h32 = (uint32_t)hlen;
    memcpy(b, &h32, 4);
    memcpy(b + 4, &claim_dlen, 4);
    memcpy(b + 8, hdr, hlen);
    size_t at = 8 + ((hlen + 7) & ~(size_t)7);
    if (dlen) memcpy(b + at, data, dlen);
    return at + ((dlen + 7) & ~(size_t)7);
}

/* Send a bundle of @p count entries (@p len bytes at @p buf) eagerly and wait for the reply to
 * request @p req (the bundle's own id, which call() gives it). */
static int call_bundle(peer_t *p, uint64_t count, const uint8_t *buf, size_t len)
{
    ps_msg_t m = {.type = PS_MSG_BUNDLE, .count = count, .length = len};
    return call(p, &m, len ? buf : NULL, len, PS_AM_DATA);
}

/* Malformed bundles are refused (PS_EPROTO, naming the problem) and apply nothing; a
 * well-formed one with a zero-gradient push is acknowledged, the ack coming back bundled. */
static int bundles(peer_t *p, target_t *t)
{
    uint32_t n = t->n;
    size_t cap = 4096 + (size_t)n * 4;
    uint8_t *b = calloc(1, cap);
    float *zeros = calloc(n, sizeof *zeros);
    int failed = 0;
    if (b == NULL || zeros == NULL) {
        free(b);
        free(zeros);
        return -1;
    }
    uint64_t req = p->next_req + 1; /* the id call() gives the bundle: entries' errors carry it */
    ps_msg_t pull = {.type = PS_MSG_PULL, .rank = t->rank, .tensor = t->tensor, .chunk = 0};
    ps_msg_t hello = {.type = PS_MSG_HELLO, .rank = t->rank};
    ps_msg_t nested = {.type = PS_MSG_BUNDLE, .count = 1};
    size_t len = 0;
    int k = 0;
    for (int c = 0; c < 5; c++) {
        req = p->next_req + 1;
        pull.req_id = hello.req_id = nested.req_id = req;
        memset(b, 0, cap);
        const char *name = NULL, *expect = NULL;
        uint64_t count = 1;
        switch (c) {
        case 0:
            name = "bundle-truncated";
            len = put_entry(b, &pull, 1u << 20, NULL, 0);
            expect = "has header";
            break;
        case 1:
            name = "bundle-trailing-bytes";
            len = put_entry(b, &pull, 0, NULL, 0) + 8;
            expect = "8 bytes after the last entry";
            break;
        case 2:
            name = "bundle-nested";
            len = put_entry(b, &nested, 0, NULL, 0);
            expect = "is a bundle itself";
            break;
        case 3:
            name = "bundle-hello-inside";
            len = put_entry(b, &hello, 0, NULL, 0);
            expect = "a bundle carries pushes and pulls, not hello";
            break;
        case 4:
            name = "bundle-count-zero";
            len = put_entry(b, &pull, 0, NULL, 0);
            count = 0;
            expect = "bundle of 0 entries";
            break;
        }
        k++;
        if (call_bundle(p, count, b, len)) {
            say("evil_peer: case %s: FAILED: no reply", name);
            failed++;
            continue;
        }
        const ps_msg_t *r = &p->reply;
        if (r->type != PS_MSG_ERROR || r->status != PS_EPROTO || strstr(r->error, expect) == NULL) {
            say("evil_peer: case %s: FAILED: got %s (status %d) \"%s\", want \"%s\"", name,
                ps_msg_type_name(r->type), r->status, r->error, expect);
            failed++;
            continue;
        }
        say("evil_peer: case %s: refused (%s): %s", name, ps_err_name(r->status), r->error);
    }
    say("evil_peer: %d of %d malformed bundles refused as expected", k - failed, k);
    /* Well-formed: one zero-gradient push of chunk 0 at its version. */
    req = p->next_req + 1;
    ps_msg_t push = push_msg(t, PSK_CODEC_NONE, NULL, (uint64_t)n * 4);
    push.req_id = req;
    push.crc32c = ps_crc32c(0, zeros, (size_t)n * 4);
    len = 0;
    int in0 = p->bundles_in;
    if (ps_bundle_add(b, cap, &len, &push, zeros, (size_t)n * 4) || call_bundle(p, 1, b, len)) {
        say("evil_peer: well-formed bundle: FAILED: no reply");
        failed++;
    } else if (p->reply.type != PS_MSG_PUSH_ACK || p->bundles_in == in0) {
        say("evil_peer: well-formed bundle: FAILED: got %s%s (%s)", ps_msg_type_name(p->reply.type),
            p->bundles_in == in0 ? " not bundled" : "", p->reply.error);
        failed++;
    } else {
        t->version = p->reply.step;
        say("evil_peer: well-formed bundle with a push: acknowledged in a bundle");
    }
    free(b);
    free(zeros);
    return failed ? -1 : 0;
}

/* ---- main ---------------------------------------------------------------------------------- */

/* ---- random messages (--fuzz N) -------------------------------------------------------------- */

static uint64_t fz_state = 0x9E3779B97F4A7C15ull;

static uint64_t fz(void)
{
    fz_state ^= fz_state << 13;
    fz_state ^= fz_state >> 7;
    fz_state ^= fz_state << 17;
    return fz_state;
}

/* Send @p m with @p data on AM id @p am without waiting for a reply (whatever comes is counted
 * in p->unexpected); waits only for the send itself. Returns 0, or -1 when it failed. */
static int send_only(peer_t *p, ps_msg_t *m, const void *data, size_t len, unsigned am)
{
    static uint8_t hdr[PS_WIRE_HDR_MAX];
    size_t hlen;
    if (ps_msg_encode_sealed(m, p->tok.b, p->tok.len, hdr, sizeof hdr, &hlen))
        return 0; /* not encodable: nothing sent */
    p->want_req = 0;
    if (send_am(p, hdr, hlen, data, len, am) != UCS_OK) return -1;
    uv_run(&p->loop, UV_RUN_NOWAIT); /* take in what came back meanwhile */
    return 0;
}

/* Connect again and say hello after psd dropped the connection; the new rank goes to @p t. */
static int rejoin(peer_t *p, const ps_manifest_t *m, target_t *t)
{
    ps_ucx_ep_close(&p->ucx, &p->ep, 1);
    p->ep_failed = 0;
    if (connect_shard0(p, m)) return -1;
    ps_msg_t hello = {.type = PS_MSG_HELLO, .rank = -1, .pid = (uint32_t)getpid()};
    snprintf(hello.cluster, sizeof hello.cluster, "%s", m->cluster);
    if (call(p, &hello, NULL, 0, PS_AM_CTRL) || p->reply.type != PS_MSG_HELLO_REPLY) {
        say("evil_peer: hello again: %s", p->reply.error);
        return -1;
    }
    t->rank = p->reply.rank;
    return 0;
}

/*
 * @p n messages of the kinds a worker (or a confused peer) sends, each made from a valid one
 * with up to four fields set at random (rank, tensor, chunk, step, length, codec and its
 * parameters, flags, epoch, count, the push area's offset, a declaration's shape), with no
 * data, data of the length the header claims, or of another length, on either AM id. What
 * comes back is not checked: psd must only keep serving, which run() checks afterwards.
 * Raw payloads are small finite floats (a peer may push any gradient; this one keeps the
 * model usable for the worker training beside it).
 */
static int fuzz(peer_t *p, const ps_manifest_t *m, target_t *t, long n)
{
    static const ps_msg_type_t types[] = {
        PS_MSG_HELLO,     PS_MSG_HELLO_REPLY, PS_MSG_DECLARE,   PS_MSG_DECLARE_REPLY,
        PS_MSG_PUSH,      PS_MSG_PUSH,        PS_MSG_PUSH,      PS_MSG_PUSH_ACK,
        PS_MSG_PULL,      PS_MSG_PULL,        PS_MSG_PULL_REPLY, PS_MSG_ERROR,
        PS_MSG_HEARTBEAT, PS_MSG_STATUS,      PS_MSG_STATUS_REPLY, PS_MSG_BATCH,
        PS_MSG_BATCH_REPLY, PS_MSG_EPOCH,     PS_MSG_ECHO,      PS_MSG_ECHO_REPLY,
        PS_MSG_BUNDLE,    PS_MSG_LEAVE_REPLY, PS_MSG_FORGET,   PS_MSG_VALUES};
    size_t cap = (size_t)t->n * 8 + 64;
    uint8_t *buf = malloc(cap);
    if (buf == NULL) return -1;
    p->quiet = 1;
    long sent = 0, rejoins = 0;
    for (long i = 0; i < n; i++) {
        if (p->ep_failed) {
            if (rejoin(p, m, t)) break;
            rejoins++;
        }
        ps_msg_t msg = {.type = types[fz() % (sizeof types / sizeof *types)],
                        .req_id = ++p->next_req, .rank = t->rank, .tensor = t->tensor,
                        .step = t->version, .length = (uint64_t)t->n * 4};
        for (int k = (int)(fz() % 5); k > 0; k--) {
            switch (fz() % 14) {
            case 0: msg.rank = (int32_t)(fz() % 72) - 4; break;
            case 1: msg.tensor = fz() % 3 ? (uint32_t)(fz() % 12) : (uint32_t)fz(); break;
            case 2: msg.chunk = fz() % 3 ? (uint32_t)(fz() % 4) : (uint32_t)fz(); break;
            case 3: msg.step = fz() % 2 ? t->version + fz() % 5 - 2 : fz(); break;
            case 4: msg.length = fz() % 2 ? fz() % cap : fz(); break;
            case 5: msg.codec = (uint32_t)(fz() % 9); break;
            case 6: msg.codec_fraction = (float)(fz() % 2000) / 1000.0f - 0.5f; break;
            case 7: msg.codec_block = (uint32_t)(fz() % 3 ? fz() % 512 : fz()); break;
            case 8: msg.flags = (uint32_t)fz(); break;
            case 9: msg.epoch = fz() % 4; break;
            case 10: msg.count = fz() % 3 ? fz() % 70 : fz(); break;
            case 11: msg.area_offset = fz(), msg.area_size = fz() % 4 ? fz() % cap : fz(); break;
            case 12:
                msg.has_decl = 1;
                snprintf(msg.decl.name, sizeof msg.decl.name, "fz%u", (unsigned)(fz() % 6));
                msg.decl.ndim = 1 + (int)(fz() % PS_MAX_DIMS);
                /* At most a few million values: psd creates what it accepts. */
                for (int d = 0; d < msg.decl.ndim; d++)
                    msg.decl.shape[d] = 1 + (uint32_t)(fz() % (d == 0 && fz() % 4 == 0 ? 70000
                                                                                     : 40));
                msg.decl.init = (uint32_t)(fz() % 4);
                break;
            default: msg.members = fz(); break;
            }
        }
        size_t len = fz() % 3 == 0 ? 0 : fz() % 2 ? (size_t)(msg.length < cap ? msg.length : 0)
                                                  : (size_t)(fz() % cap);
        for (size_t b = 0; b + 4 <= len; b += 4)
            stf32(buf + b, msg.codec ? (float)(int)(fz() % 200) * 1e-4f - 0.01f
                                     : (float)(int)(fz() % 2001) * 1e-6f - 1e-3f);
        if (msg.codec && fz() % 2)
            for (size_t b = 0; b < len; b++) buf[b] = (uint8_t)fz(); /* any bytes */
        msg.crc32c = len ? ps_crc32c(0, buf, len) : (uint32_t)fz();
        if (send_only(p, &msg, len ? buf : NULL, len, fz() % 2 ? PS_AM_DATA : PS_AM_CTRL) == 0)
            sent++;
    }
    /* Take in the replies still on their way (a push being applied answers last) until none
     * came for 300 ms: a push of this rank still in its slot would refuse the well-formed one
     * that follows as a second push. */
    for (long seen = -1; seen != p->unexpected && !p->ep_failed;) {
        seen = p->unexpected;
        uv_timer_start(&p->timer, on_timer, 300, 0);
        while (uv_is_active((uv_handle_t *)&p->timer) && !p->ep_failed)
            uv_run(&p->loop, UV_RUN_ONCE);
    }
    p->quiet = 0;
    free(buf);
    say("evil_peer: %ld random messages sent, %ld replies taken in, %ld reconnects", sent,
        p->unexpected, rejoins);
    if (p->ep_failed && rejoin(p, m, t)) return -1;
    return sent == n ? 0 : -1;
}

/* ---- dying in the middle of a send (--die-mid-send) ------------------------------------------ */

/* A generic datatype whose pack callback kills this process: UCX calls it while it writes the
 * message into the receiver's transport, over shared memory after claiming a slot of psd's
 * receive FIFO and before marking it written. The slot stays claimed for good: a receiver that
 * reads its FIFO in order reads nothing after it (what a worker SIGKILLed at that instant
 * leaves; PLATFORM-NOTES.md). */
static void *dm_start_pack(void *context, const void *buffer, size_t count)
{
    (void)buffer;
    (void)count;
    return context;
}

static size_t dm_packed_size(void *state)
{
    (void)state;
    return 64;
}

static size_t dm_pack(void *state, size_t offset, void *dest, size_t max_length)
{
    (void)state;
    (void)offset;
    (void)dest;
    (void)max_length;
    say("evil_peer: dying in the middle of a send");
    raise(SIGKILL);
    return 0;
}

static void dm_finish(void *state)
{
    (void)state;
}

static int die_mid_send(peer_t *p)
{
    static const ucp_generic_dt_ops_t ops = {.start_pack = dm_start_pack,
                                             .packed_size = dm_packed_size,
                                             .pack = dm_pack,
                                             .finish = dm_finish};
    ucp_datatype_t dt;
    if (ucp_dt_create_generic(&ops, p, &dt) != UCS_OK) {
        say("evil_peer: cannot make a generic datatype");
        return -1;
    }
    static uint8_t hdr[PS_WIRE_HDR_MAX];
    ps_msg_t m = {.type = PS_MSG_STATUS, .req_id = ++p->next_req, .rank = -1};
    size_t hlen;
    ps_msg_encode_sealed(&m, p->tok.b, p->tok.len, hdr, sizeof hdr, &hlen);
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE |
                                               UCP_OP_ATTR_FIELD_FLAGS,
                               .datatype = dt,
                               .flags = UCP_AM_SEND_FLAG_EAGER};
    void *req = ucp_am_send_nbx(p->ep, PS_AM_CTRL, hdr, hlen, p, 1, &prm);
    for (int i = 0; i < 1000 && req && !UCS_PTR_IS_ERR(req); i++) ucp_worker_progress(p->ucx.worker);
    say("evil_peer: the send that should have killed this process did not pack its data");
    return -1;
}

/* ---- control messages ----------------------------------------------------------------------- */

typedef struct {
    int closed;
    uv_loop_t *loop;
} quiet_t;

static void on_quiet_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    (void)status;
    quiet_t *q = arg;
    q->closed = 1;
    uv_stop(q->loop); /* see wait_flag() */
}

/* Refused with @p status naming @p want: 0, or -1 with a line said. */
static int refused(peer_t *p, int status, const char *want, const char *what)
{
    if (p->reply.type != PS_MSG_ERROR || p->reply.status != status ||
        strstr(p->reply.error, want) == NULL) {
        say("evil_peer: %s: got %s (status %d): %s", what, ps_msg_type_name(p->reply.type),
            p->reply.status, p->reply.error);
        return -1;
    }
    say("evil_peer: %s: refused (%s)", what, ps_strerror(status));
    return 0;
}

/*
 * Control messages of a confused or hostile peer, on shard 0 (evil_peer.c's head says which);
 * @p victim_pid is the pid of the worker that holds rank 0 (0: that check is left out). A
 * second connection that never says anything is open meanwhile and must be closed by psd.
 * Returns the number of checks that failed.
 */
static int controls(peer_t *p, const ps_manifest_t *m, uint32_t victim_pid)
{
    const ps_server_conf_t *sc = &m->servers[0];
    int failed = 0;
    quiet_t q = {.loop = &p->loop};
    ucp_ep_h quiet = NULL;
    ps_ucx_token_t quiet_tok, tok = p->tok;
    if (ps_ucx_connect(&p->ucx, sc->host, sc->port, on_quiet_error, &q, &quiet, &quiet_tok)) {
        say("evil_peer: cannot open the quiet connection");
        return 1;
    }
    p->tok = tok;

    /* Undecodable headers: each answered (PS_EPROTO; the request id is not known, so they
     * come as replies nobody waits for), psd logs the first only. The launch below comes
     * after them on the same connection. */
    static const uint8_t junk[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                     0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    long before = p->unexpected;
    p->quiet = 1;
    for (int i = 0; i < 5; i++)
        if (send_am(p, junk, sizeof junk, NULL, 0, PS_AM_CTRL) != UCS_OK) failed++;

    /* A launcher that says it runs 2^32 - 1 workers (-1 as a signed count). */
    ps_msg_t launch = {.type = PS_MSG_LAUNCH, .rank = -1, .workers = UINT32_MAX,
                       .pid = (uint32_t)getpid(), .poll_ms = 1000};
    snprintf(launch.cluster, sizeof launch.cluster, "%s", m->cluster);
    snprintf(launch.host, sizeof launch.host, "evil");
    if (call(p, &launch, NULL, 0, PS_AM_CTRL) ||
        refused(p, PS_EINVAL, "a launcher that runs 4294967295 workers", "launch of -1 workers"))
        failed++;
    p->quiet = 0;
    if (p->unexpected - before != 5) {
        say("evil_peer: 5 undecodable headers: %ld answers", p->unexpected - before);
        failed++;
    } else {
        say("evil_peer: 5 undecodable headers: each answered");
    }

    /* Rank 0 asked for by the pid of the worker that holds it, on a connection of its own,
     * without its join serial. */
    if (victim_pid) {
        ucp_ep_h ep = p->ep;
        int ep_failed = p->ep_failed;
        p->ep = NULL;
        if (connect_shard0(p, m)) {
            failed++;
        } else {
            ps_msg_t hello = {.type = PS_MSG_HELLO, .rank = 0, .pid = victim_pid, .samples = 0};
            snprintf(hello.cluster, sizeof hello.cluster, "%s", m->cluster);
            bool bsp = m->job.consistency == PS_CONSIST_BSP;
            if (call(p, &hello, NULL, 0, PS_AM_CTRL) ||
                refused(p, PS_ENOTMEMBER, "is not a member of the job any more",
                        "hello for rank 0 with its worker's pid and no join serial")) {
                failed++;
            } else if ((strstr(p->reply.error, "(epoch ") != NULL) != bsp) {
                /* The epoch is bsp's membership view: under asp / ssp it read "(epoch 0)". */
                say("evil_peer: the refusal %s an epoch under %s: %s", bsp ? "names no" : "names",
                    bsp ? "bsp" : "asp / ssp", p->reply.error);
                failed++;
            }
            ps_ucx_ep_close(&p->ucx, &p->ep, 1);
        }
        p->ep = ep;
        p->tok = tok;
        p->ep_failed = ep_failed; /* that connection's end is not this one's */
    }

    /* A mean tensor (its pushes are values) pushed as top-k: refused (libps refuses first). */
    ps_msg_t decl = {.type = PS_MSG_DECLARE, .rank = p->hello.rank, .has_decl = 1};
    snprintf(decl.decl.name, sizeof decl.decl.name, "evil.mean");
    decl.decl.ndim = 1;
    decl.decl.shape[0] = 64;
    decl.decl.init = PS_DECL_MEAN;
    if (call(p, &decl, NULL, 0, PS_AM_CTRL) || p->reply.type != PS_MSG_DECLARE_REPLY ||
        !p->reply.has_decl) {
        say("evil_peer: declare evil.mean: got %s: %s", ps_msg_type_name(p->reply.type),
            p->reply.error);
        failed++;
    } else {
        target_t mt = {.rank = p->hello.rank, .tensor = p->reply.decl.id, .n = 64};
        psk_codec_t tk = TOPK;
        static float zeros[64];
        static uint8_t buf[4096];
        size_t len = 0, scr = psk_codec_scratch_bytes(&tk, 64);
        void *scratch = scr ? malloc(scr) : NULL;
        int bad = (scr && scratch == NULL) ||
                  psk_codec_encode_cpu(buf, sizeof buf, &len, zeros, 64, &tk, scratch) != 0;
        free(scratch);
        ps_msg_t push = push_msg(&mt, tk.kind, &tk, len);
        if (bad) say("evil_peer: evil.mean: cannot encode");
        if (bad || call(p, &push, buf, len, PS_AM_DATA) ||
            refused(p, PS_EPROTO, "a mean tensor's pushes are values",
                    "top-k push of a mean tensor"))
            failed++;
    }

    /* A declaration whose initializer would make every value infinite: refused by psd too,
     * not only by libps (a review, session 73). */
    ps_msg_t inf = {.type = PS_MSG_DECLARE, .rank = p->hello.rank, .has_decl = 1};
    snprintf(inf.decl.name, sizeof inf.decl.name, "evil.inf");
    inf.decl.ndim = 1;
    inf.decl.shape[0] = 8;
    inf.decl.init = 4; /* constant init_arg */
    inf.decl.init_arg = INFINITY;
    if (call(p, &inf, NULL, 0, PS_AM_CTRL) ||
        refused(p, PS_EINVAL, "non-finite init_arg", "a declaration with init_arg inf"))
        failed++;

    /* The quiet connection: closed by psd (a connection that says nothing). Meanwhile this
     * one says it is alive, as libps's heartbeats do. */
    double t0 = now_s();
    ps_msg_t beat = {.type = PS_MSG_HEARTBEAT, .rank = p->hello.rank, .flags = PS_FLAG_ANSWER};
    while (!q.closed && !p->ep_failed && now_s() - t0 < 60.0) {
        if (call(p, &beat, NULL, 0, PS_AM_CTRL)) break;
        wait_flag(p, &q.closed, 1.0); /* a pause, or the close */
    }
    if (!q.closed) {
        say("evil_peer: the connection that said nothing is still open after %.0f s",
            now_s() - t0);
        failed++;
    } else {
        say("evil_peer: the connection that said nothing: closed by psd after %.0f s",
            now_s() - t0);
    }
    ps_ucx_ep_close(&p->ucx, &quiet, 1);
    return failed;
}

static int run(peer_t *p, const ps_manifest_t *m, const char *only, long nfuzz, int die,
               uint32_t victim_pid)
{
    if (connect_shard0(p, m)) return -1;
    if (die) {
        /* Not a member: a status request and its answer set the connection up (shared
         * memory, where psd runs on this host), then the send that kills this process. */
        p->data_cap = 1u << 20;
        if ((p->data = malloc(p->data_cap)) == NULL) return -1;
        ps_msg_t st = {.type = PS_MSG_STATUS, .rank = -1};
        call(p, &st, NULL, 0, PS_AM_CTRL); /* its JSON carries no CRC: "does not match" */
        if (!p->got_reply || p->reply.type != PS_MSG_STATUS_REPLY) {
            say("evil_peer: status: no answer");
            return -1;
        }
        return die_mid_send(p);
    }

    /* Hello: shard 0 hands out the rank. */
    ps_msg_t hello = {.type = PS_MSG_HELLO, .rank = -1, .pid = (uint32_t)getpid(),
                      .store_id = ps_storeview_host_id()}; /* this host: offer the push area */
    snprintf(hello.cluster, sizeof hello.cluster, "%s", m->cluster);
    if (g_hello_host) snprintf(hello.host, sizeof hello.host, "%s", g_hello_host);
    if (call(p, &hello, NULL, 0, PS_AM_CTRL)) return -1;
    if (p->reply.type != PS_MSG_HELLO_REPLY) {
        say("evil_peer: hello: got %s: %s", ps_msg_type_name(p->reply.type), p->reply.error);
        return -1;
    }
    target_t t = {.rank = p->reply.rank};
    p->hello = p->reply;
    say("evil_peer: hello: rank %d of %u", t.rank, p->reply.workers);

    /* Declare the last weight as psworker does (worker/mlp.h, worker/psworker.c). */
    const ps_job_conf_t *j = &m->job;
    int nlin = j->nlayers - 1;
    uint64_t spe = FMNIST_TRAIN_N / ((uint64_t)j->workers * j->batch_size);
    uint64_t total = spe * j->epochs;
    if (j->max_steps && j->max_steps < total) total = j->max_steps;
    ps_msg_t decl = {.type = PS_MSG_DECLARE, .rank = t.rank, .has_decl = 1};
    snprintf(decl.decl.name, sizeof decl.decl.name, "fc%d.weight", nlin);
    decl.decl.ndim = 2;
    decl.decl.shape[0] = j->layers[nlin - 1];
    decl.decl.shape[1] = j->layers[nlin];
    decl.decl.init = PSK_INIT_XAVIER;
    decl.decl.seed = j->seed;
    decl.decl.total_steps = total;
    if (call(p, &decl, NULL, 0, PS_AM_CTRL)) return -1;
    if (p->reply.type != PS_MSG_DECLARE_REPLY || !p->reply.has_decl || !p->reply.decl.assigned) {
        say("evil_peer: declare %s: got %s: %s", decl.decl.name, ps_msg_type_name(p->reply.type),
            p->reply.error);
        return -1;
    }
    const ps_decl_t *d = &p->reply.decl;
    if (ps_place_shard(d->first_chunk, (uint32_t)m->nservers) != 0) {
        say("evil_peer: chunk 0 of %s is not on shard 0: use a single-shard manifest", d->name);
        return -1;
    }
    uint64_t chunk_elems = m->chunk_bytes / 4;
    t.tensor = d->id;
    t.n = (uint32_t)ps_chunk_len(ps_decl_numel(d), chunk_elems, 0);
    say("evil_peer: declared %s [%u, %u]: tensor %u, chunk 0 of %u values", d->name, d->shape[0],
        d->shape[1], t.tensor, t.n);
    free(p->data);
    p->data_cap = (size_t)t.n * 4;
    if ((p->data = malloc(p->data_cap)) == NULL) return -1;

    if (pull_chunk0(p, &t, "before")) return -1;
    if (only && strcmp(only, "values") == 0) return values(p, &t);
    psk_codec_t topk = TOPK, int8 = INT8;
    if (nfuzz > 0) {
        /* Random messages, then psd must still answer a pull and acknowledge a push. */
        int bad = fuzz(p, m, &t, nfuzz);
        if (!bad) bad = pull_chunk0(p, &t, "after the random messages");
        if (!bad) bad = push_good(p, &t, &int8, "well-formed push after the random messages");
        return bad ? -1 : 0;
    }
    if (push_good(p, &t, &topk, "well-formed topk push")) return -1;
    int failed = 0, nreceipt = 0;
    int ncases = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (only && strcmp(only, cases[i].name) != 0) continue;
        ncases++;
        /* Each at the chunk's current version: "the right step". */
        if (push_bad(p, &t, &cases[i])) failed++;
        nreceipt += after_receipt(&cases[i]);
        if (p->ep_failed) break;
    }
    say("evil_peer: %d of %d malformed pushes refused as expected (%d after receipt)",
        ncases - failed, ncases, nreceipt);
    if (push_good(p, &t, &int8, "well-formed int8 push after them")) failed++;
    if (push_bad_crc(p, &t)) failed++;
    if (!only && direct_pushes(p, &t)) failed++;
    if (!only && bundles(p, &t)) failed++;
    if (!only) failed += controls(p, m, victim_pid);
    if (pull_chunk0(p, &t, "after")) failed++;

    /* Leave as libps does: the shard answers before the connection closes. */
    ps_msg_t leave = {.type = PS_MSG_LEAVE, .rank = t.rank};
    if (!p->ep_failed && call(p, &leave, NULL, 0, PS_AM_CTRL) != 0) {
        failed++;
    } else if (!p->ep_failed && p->reply.type != PS_MSG_LEAVE_REPLY) {
        say("evil_peer: leave answered by %s, not leave_reply", ps_msg_type_name(p->reply.type));
        failed++;
    }
    return failed ? -1 : 0;
}

int main(int argc, char **argv)
{
    g_t0 = now_s();
    static const struct option opts[] = {{"manifest", required_argument, 0, 'm'},
                                         {"case", required_argument, 0, 'c'},
                                         {"fuzz", required_argument, 0, 'f'},
                                         {"seed", required_argument, 0, 's'},
                                         {"die-mid-send", no_argument, 0, 'd'},
                                         {"hello-host", required_argument, 0, 'h'},
                                         {"victim-pid", required_argument, 0, 'v'},
                                         {0, 0, 0, 0}};
    const char *manifest = NULL, *only = NULL;
    long nfuzz = 0;
    int o, die = 0;
    uint32_t victim_pid = 0;
    while ((o = getopt_long(argc, argv, "m:c:f:s:", opts, NULL)) != -1) {
        if (o == 'm')
            manifest = optarg;
        else if (o == 'c')
            only = optarg;
        else if (o == 'f')
            nfuzz = atol(optarg);
        else if (o == 'd')
            die = 1;
        else if (o == 'h')
            g_hello_host = optarg;
        else if (o == 'v')
            victim_pid = (uint32_t)strtoul(optarg, NULL, 10);
        else if (o == 's')
            fz_state ^= strtoull(optarg, NULL, 0) * 0xBF58476D1CE4E5B9ull; /* never 0 for 0 */
        else
            manifest = NULL, optind = argc + 1;
    }
    if (manifest == NULL || optind != argc || nfuzz < 0) {
        fprintf(stderr, "usage: evil_peer --manifest FILE [--case NAME | --fuzz N [--seed S] | "
                "--die-mid-send] [--hello-host S] [--victim-pid P]\n");
        return 2;
    }
    static ps_manifest_t m;
    char err[1024];
    if (ps_manifest_load(&m, manifest, err, sizeof err)) {
        fprintf(stderr, "evil_peer: %s\n", err);
        return 2;
    }
    if (m.job.nlayers < 2) {
        fprintf(stderr, "evil_peer: %s: job.layers too short\n", manifest);
        return 2;
    }
    static peer_t p;
    if (uv_loop_init(&p.loop) != 0) return 1;
    if (ps_ucx_init(&p.ucx, &p.loop) != 0) {
        fprintf(stderr, "evil_peer: cannot start UCX\n");
        return 1;
    }
    static ps_auth_t auth;
    if (ps_auth_load(&auth, &m, err, sizeof err)) {
        fprintf(stderr, "evil_peer: %s\n", err);
        return 2;
    }
    ps_auth_attach(&p.ucx, &auth);
    uv_timer_init(&p.loop, &p.timer);
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                               UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                 .cb = on_am, .arg = &p};
    hp.id = PS_AM_CTRL;
    ucp_worker_set_am_recv_handler(p.ucx.worker, &hp);
    hp.id = PS_AM_DATA;
    ucp_worker_set_am_recv_handler(p.ucx.worker, &hp);

    int rc = run(&p, &m, only, nfuzz, die, victim_pid);

    ps_ucx_ep_close(&p.ucx, &p.ep, 1);
    uv_close((uv_handle_t *)&p.timer, NULL);
    ps_ucx_close(&p.ucx);
    uv_run(&p.loop, UV_RUN_DEFAULT);
    uv_loop_close(&p.loop);
    free(p.data);
    say("evil_peer: %s", rc == 0 ? "every check held" : "FAILED");
    return rc == 0 ? 0 : 1;
}
