/* test_amguard.c: common/amguard.c checks UCP's messages only for the workers psd and libps
 * made (ps_amguard_watch). Two UCP workers in this process, connected without peer error
 * handling, as another library in a user's program may connect (torch's UCX backends): UCP
 * then names endpoints by pointers (even ids). An active message with a reply endpoint reaches
 * a worker no one watches as before, and is dropped for a watched one. */
#include <check.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

#include "amguard.h"

#define AM_ID 7

typedef struct {
    ucp_context_h ctx;
    ucp_worker_h a, b; /* a receives, b sends */
    ucp_ep_h ep;       /* b -> a */
    int got;           /* messages a took */
    int had_reply_ep;  /* ... with a reply endpoint */
} pair_t;

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    pair_t *p = arg;
    p->got++;
    p->had_reply_ep += (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0;
    return UCS_OK;
}

static void pair_open(pair_t *p, int watch_a)
{
    memset(p, 0, sizeof *p);
    ps_amguard_install();
    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
    ck_assert_int_eq(ucp_init(&params, NULL, &p->ctx), UCS_OK);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ck_assert_int_eq(ucp_worker_create(p->ctx, &wp, &p->a), UCS_OK);
    ck_assert_int_eq(ucp_worker_create(p->ctx, &wp, &p->b), UCS_OK);
    if (watch_a) ck_assert_int_eq(ps_amguard_watch(p->a), 0);
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                               UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                 .id = AM_ID, .cb = on_am, .arg = p};
    ck_assert_int_eq(ucp_worker_set_am_recv_handler(p->a, &hp), UCS_OK);
    ucp_address_t *addr;
    size_t len;
    ck_assert_int_eq(ucp_worker_get_address(p->a, &addr, &len), UCS_OK);
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                          .address = addr, .err_mode = UCP_ERR_HANDLING_MODE_NONE};
    ck_assert_int_eq(ucp_ep_create(p->b, &ep, &p->ep), UCS_OK);
    ucp_worker_release_address(p->a, addr);
}

/* Send one message with a reply endpoint and drive both workers for up to 3 s (or until it
 * arrived). */
static void send_and_drive(pair_t *p)
{
    static const char msg[] = "hello";
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER};
    void *req = ucp_am_send_nbx(p->ep, AM_ID, NULL, 0, msg, sizeof msg, &rp);
    ck_assert(!UCS_PTR_IS_ERR(req));
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        ucp_worker_progress(p->a);
        ucp_worker_progress(p->b);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (p->got == 0 && (t.tv_sec - t0.tv_sec) < 3);
    if (req) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS && (t.tv_sec - t0.tv_sec) < 4) {
            ucp_worker_progress(p->a);
            ucp_worker_progress(p->b);
            clock_gettime(CLOCK_MONOTONIC, &t);
        }
        ucp_request_free(req);
    }
}

static void pair_close(pair_t *p)
{
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *req = ucp_ep_close_nbx(p->ep, &cp);
    while (req && !UCS_PTR_IS_ERR(req) && ucp_request_check_status(req) == UCS_INPROGRESS) {
        ucp_worker_progress(p->b);
        ucp_worker_progress(p->a);
    }
    if (req && !UCS_PTR_IS_ERR(req)) ucp_request_free(req);
    ps_amguard_unwatch(p->a);
    ucp_worker_destroy(p->b);
    ucp_worker_destroy(p->a);
    ucp_cleanup(p->ctx);
}

/* One message with a reply endpoint to a worker watched (@p watch) or not: how many arrived,
 * and how many messages amguard dropped meanwhile. */
static void one_message(int watch, int *got, uint64_t *dropped)
{
    pair_t p;
    pair_open(&p, watch);
    uint64_t before = ps_amguard_refused();
    send_and_drive(&p);
    ck_assert_int_eq(p.had_reply_ep, p.got);
    *got = p.got;
    *dropped = ps_amguard_refused() - before;
    pair_close(&p);
}

START_TEST(foreign_worker_passes)
{
    int got;
    uint64_t dropped;
    one_message(0, &got, &dropped);
    ck_assert_int_eq(got, 1);
    ck_assert_uint_eq(dropped, 0);
}
END_TEST

START_TEST(watched_worker_drops_pointer_ids)
{
    int got;
    uint64_t dropped;
    one_message(1, &got, &dropped);
    ck_assert_int_eq(got, 0);
    ck_assert_uint_gt(dropped, 0);
}
END_TEST

static void put_le(uint8_t *p, uint64_t v, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Hand UCP's first-fragment handler (id 24) or middle-fragment handler (id 25), through
 * amguard's wrapper, a fragment of message @p msg from endpoint key 0x1001 (one worker @p w
 * does not have: UCP drops what passes): @p here bytes of a @p total-byte message, or @p len
 * bytes at @p offset. @return whether amguard let it through. */
static int fragment(ucp_worker_h w, int first, uint64_t msg, uint64_t a, uint64_t b)
{
    uct_am_callback_t cb = ps_amguard_handler(first ? 24 : 25);
    ck_assert(cb != NULL);
    static uint8_t m[1024];
    size_t n;
    if (first) { /* am header (user id 1), a bytes of payload, footer: msg, ep, total (b) */
        memset(m, 0, 8);
        m[0] = 1;
        n = 8 + a + 24;
        put_le(m + n - 24, msg, 8);
        put_le(m + n - 16, 0x1001, 8);
        put_le(m + n - 8, b, 8);
    } else { /* offset (a), b bytes of payload, footer: msg, ep */
        put_le(m, a, 8);
        n = 8 + b + 16;
        put_le(m + n - 16, msg, 8);
        put_le(m + n - 8, 0x1001, 8);
    }
    uint64_t before = ps_amguard_refused();
    ck_assert_int_eq(cb(w, m, n, 0), UCS_OK);
    return ps_amguard_refused() == before;
}

/* A multi-fragment message's middle fragments pass only where its bytes so far end and within
 * its total (UCP copies them to the offset they name, unchecked), after its first fragment,
 * once; a worker no one watches is not checked. */
START_TEST(middle_fragments_in_place_only)
{
    pair_t p;
    pair_open(&p, 1);
    ucp_worker_h w = p.a;
    ck_assert(fragment(w, 1, 5, 40, 100));   /* 40 of 100 bytes */
    ck_assert(!fragment(w, 1, 5, 40, 100));  /* begun already */
    ck_assert(!fragment(w, 0, 5, 80, 10));   /* a gap */
    ck_assert(!fragment(w, 0, 5, 0, 10));    /* over the first */
    ck_assert(fragment(w, 0, 5, 40, 30));    /* 70 of 100 */
    ck_assert(!fragment(w, 0, 5, 70, 40));   /* past the total */
    ck_assert(fragment(w, 0, 5, 70, 30));    /* whole */
    ck_assert(!fragment(w, 0, 5, 100, 1));   /* done: no message begun */
    ck_assert(!fragment(w, 0, 6, 0, 10));    /* never begun */
    ck_assert(fragment(w, 1, 7, 100, 100));  /* a whole message in its first fragment */
    ck_assert(!fragment(w, 0, 7, 100, 1));
    ps_amguard_unwatch(w);
    ck_assert(fragment(w, 0, 6, 1u << 20, 10)); /* not watched: UCP's own business */
    pair_close(&p);
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("amguard");
    TCase *tc = tcase_create("workers");
    tcase_add_test(tc, foreign_worker_passes);
    tcase_add_test(tc, watched_worker_drops_pointer_ids);
    tcase_add_test(tc, middle_fragments_in_place_only);
    suite_add_tcase(s, tc);
    return s;
}
