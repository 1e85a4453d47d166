/* test_tcpguard.c: server/tcpguard.c follows UCX 1.13's TCP transport frames as recv() returns
 * them, in pieces of any size: a well-formed stream passes whole, each crafted frame is
 * refused no later than the byte that would make it whole for UCX, and sockets that are not
 * UCX's TCP transport pass untouched. The sockets are a real loopback pair: the checks ask
 * the socket for its addresses. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcpguard.h"

#define MAGIC 0xCAFEBABE12345678ull

typedef struct {
    uint8_t b[70000 * 2];
    size_t n;
} stream_t;

static void put_le(uint8_t *p, uint64_t v, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void add(stream_t *s, const void *p, size_t n)
{
    ck_assert(s->n + n <= sizeof s->b);
    memcpy(s->b + s->n, p, n);
    s->n += n;
}

/* A frame: id, length, then @p n bytes of @p body (NULL: zeros). */
static void frame(stream_t *s, uint8_t id, uint32_t len, const void *body, size_t n)
{
    uint8_t h[5];
    h[0] = id;
    put_le(h + 1, len, 4);
    add(s, h, 5);
    ck_assert(s->n + n <= sizeof s->b);
    if (body) memcpy(s->b + s->n, body, n);
    else memset(s->b + s->n, 0, n);
    s->n += n;
}

/* A connection request (29 bytes: event 1, flags, sequence number, an IPv4 address). */
static void request(stream_t *s, uint8_t flags, uint64_t sn, uint32_t ip, uint16_t port)
{
    uint8_t r[29] = {0};
    put_le(r, 1, 4);
    r[4] = flags;
    put_le(r + 5, sn, 8);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(ip);
    memcpy(r + 13, &a, sizeof a);
    frame(s, 32, sizeof r, r, sizeof r);
}

static int g_fd[3]; /* a listener, the connecting end, the accepted end */

static void pair_open(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    g_fd[0] = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert(bind(g_fd[0], (struct sockaddr *)&a, sizeof a) == 0);
    ck_assert(listen(g_fd[0], 1) == 0);
    ck_assert(getsockname(g_fd[0], (struct sockaddr *)&a, &len) == 0);
    g_fd[1] = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert(connect(g_fd[1], (struct sockaddr *)&a, sizeof a) == 0);
    g_fd[2] = accept(g_fd[0], NULL, NULL);
    ck_assert(g_fd[2] >= 0);
    ps_tcpguard_reset(g_fd[1]);
    ps_tcpguard_reset(g_fd[2]);
}

static void pair_close(void)
{
    for (int i = 0; i < 3; i++)
        close(g_fd[i]);
}

/* Feed @p s to socket @p fd's checks in pieces of @p piece bytes. @return the offset of the
 * byte whose piece was refused, or -1 when all passed. */
static long feed(int fd, const stream_t *s, size_t piece)
{
    for (size_t at = 0; at < s->n; at += piece) {
        size_t k = s->n - at < piece ? s->n - at : piece;
        if (ps_tcpguard_received(fd, s->b + at, k) != 0) return (long)(at + k - 1);
    }
    return -1;
}

/* What a peer that connected to psd sends: the magic, a connection request, messages of up to
 * UCX's 64 KiB segment, keepalives, put acknowledgements, the request repeated. */
static void good_stream(stream_t *s, int fd)
{
    struct sockaddr_in peer;
    socklen_t len = sizeof peer;
    ck_assert(getpeername(fd, (struct sockaddr *)&peer, &len) == 0);
    s->n = 0;
    uint8_t m[8];
    put_le(m, MAGIC, 8);
    add(s, m, 8);
    request(s, 0, 7, ntohl(peer.sin_addr.s_addr), 40000);
    frame(s, 23, 100, NULL, 100);
    frame(s, 35, 0, NULL, 0);
    uint8_t ack[4] = {1, 0, 0, 0};
    frame(s, 34, 4, ack, 4);
    frame(s, 32, 4, (uint8_t[]){2, 0, 0, 0}, 4); /* a connection ack */
    request(s, 0, 7, ntohl(peer.sin_addr.s_addr), 40000);
    frame(s, 26, 65536, NULL, 65536);
}

START_TEST(well_formed_streams_pass_in_any_pieces)
{
    static const size_t pieces[] = {1, 2, 3, 5, 7, 4096, 1 << 20};
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++) {
        pair_open();
        static stream_t s;
        good_stream(&s, g_fd[2]);
        ck_assert_msg(feed(g_fd[2], &s, pieces[i]) == -1, "refused in pieces of %zu",
                      pieces[i]);
        ck_assert(!ps_tcpguard_refused(g_fd[2]));
        pair_close();
    }
}
END_TEST

/* Each crafted frame after a well-formed start, fed byte by byte: refused by the frame's last
 * byte at the latest (UCX acts on whole frames only). */
START_TEST(crafted_frames_refused_before_whole)
{
    enum { PUT_REQ, ID_40, PUT_ACK_8, HUGE, CM_12, SECOND_REQ, TO_EP_EVEN, TO_EP_ABOVE, FAMILY,
           ACK_FIRST };
    for (int c = PUT_REQ; c <= ACK_FIRST; c++) {
        pair_open();
        static stream_t s;
        good_stream(&s, g_fd[2]);
        if (c >= CM_12 && c != SECOND_REQ) { /* a first connection frame: right after the magic */
            s.n = 0;
            uint8_t m[8];
            put_le(m, MAGIC, 8);
            add(&s, m, 8);
        }
        size_t start = s.n;
        uint8_t z[32] = {0};
        switch (c) {
        case PUT_REQ: /* 8 bytes to 0x10, where nothing is received */
            put_le(z, 0x10, 8);
            put_le(z + 8, 8, 8);
            frame(&s, 33, 20, z, 20);
            break;
        case ID_40: frame(&s, 40, 8, z, 8); break;
        case PUT_ACK_8: frame(&s, 34, 8, z, 8); break;
        case HUGE: frame(&s, 5, 65537, NULL, 65537); break;
        case CM_12: frame(&s, 32, 12, (uint8_t[12]){1}, 12); break;
        case SECOND_REQ: request(&s, 0, 8, 0x7f000001, 40000); break;
        case TO_EP_EVEN: request(&s, 1, 0x1000, 0x7f000000, 1); break;
        case TO_EP_ABOVE: request(&s, 1, 0x1001, 0x7f000002, 1); break;
        case FAMILY: {
            request(&s, 0, 7, 0x7f000001, 40000);
            s.b[s.n - 16] = 99; /* sin_family */
            break;
        }
        case ACK_FIRST: /* an ack before the request (UCX then asserts on the request) */
            frame(&s, 32, 4, (uint8_t[]){2, 0, 0, 0}, 4);
            request(&s, 0, 7, 0x7f000001, 40000);
            break;
        }
        long at = feed(g_fd[2], &s, 1);
        ck_assert_msg(at >= (long)start && at < (long)s.n, "case %d: refused at %ld of %zu..%zu",
                      c, at, start, s.n);
        ck_assert(ps_tcpguard_refused(g_fd[2]));
        ck_assert_int_eq(ps_tcpguard_received(g_fd[2], "x", 1), -1); /* and stays so */
        pair_close();
    }
}
END_TEST

/* A put request passes only into a receive psd has in flight, whole; its data (not frames)
 * is counted past, and the frames after it are followed again. */
START_TEST(puts_only_into_receives_in_flight)
{
    static uint8_t slot[4096];
    ps_tcpguard_init(1); /* as sockhooks.c does: receives are kept from now on */
    pair_open();
    static stream_t s;
    good_stream(&s, g_fd[2]);
    uint8_t put[20] = {0};
    put_le(put, (uintptr_t)(slot + 1024), 8);
    put_le(put + 8, 3072, 8);
    frame(&s, 33, 20, put, 20);
    size_t data = s.n;
    s.n += 3072;
    memset(s.b + data, 33, 3072); /* data that would read as put request headers */
    frame(&s, 23, 10, NULL, 10);
    memset(put, 0, sizeof put); /* UCX's flush: a put of nothing to address 0 */
    frame(&s, 33, 20, put, 20);
    frame(&s, 35, 0, NULL, 0);
    ck_assert_int_eq(ps_tcpguard_expect(slot, sizeof slot), 0);
    ck_assert_int_eq(feed(g_fd[2], &s, 1000), -1);
    ps_tcpguard_done(slot);
    pair_close();

    static const struct {
        uintptr_t at;
        uint64_t len;
    } out[] = {{0x10, 8}, {1025, 3072}, {4097, 8}, {0, 4097}, {4000, 100}, {8, UINT64_MAX}};
    for (size_t i = 0; i < sizeof out / sizeof *out; i++) {
        pair_open();
        good_stream(&s, g_fd[2]);
        size_t start = s.n;
        uintptr_t at = out[i].at < 4097 && i ? (uintptr_t)slot + out[i].at : out[i].at;
        put_le(put, at, 8);
        put_le(put + 8, out[i].len, 8);
        frame(&s, 33, 20, put, 20);
        ck_assert_int_eq(ps_tcpguard_expect(slot, sizeof slot), 0);
        long bad = feed(g_fd[2], &s, 1);
        ck_assert_msg(bad >= (long)start && bad < (long)s.n, "put %zu refused at %ld", i, bad);
        ps_tcpguard_done(slot);
        pair_close();
    }
    /* A put whose data trickles in: UCX reads the rest straight to its target, which must
     * still be a receive in flight when each read is made. */
    pair_open();
    good_stream(&s, g_fd[2]);
    put_le(put, (uintptr_t)slot, 8);
    put_le(put + 8, 4096, 8);
    frame(&s, 33, 20, put, 20);
    ck_assert_int_eq(ps_tcpguard_expect(slot, sizeof slot), 0);
    ck_assert_int_eq(feed(g_fd[2], &s, 4096), -1);
    ck_assert_int_eq(ps_tcpguard_may_read(g_fd[2], slot, 4096), 0);
    ps_tcpguard_done(slot); /* the receive ended before the data came */
    ck_assert_int_eq(ps_tcpguard_may_read(g_fd[2], slot, 4096), -1);
    ck_assert(ps_tcpguard_refused(g_fd[2]));
    pair_close();

    pair_open(); /* after the receive ended */
    good_stream(&s, g_fd[2]);
    put_le(put, (uintptr_t)slot, 8);
    put_le(put + 8, 8, 8);
    frame(&s, 33, 20, put, 20);
    ck_assert(feed(g_fd[2], &s, 7) >= 0);
    pair_close();
}
END_TEST

/* A second request for a new endpoint (the sequence number changes) is refused because UCX
 * asserts it repeats the first; a request to an endpoint from below psd's address, with a key,
 * passes. */
START_TEST(connect_to_endpoint_from_below_passes)
{
    pair_open();
    static stream_t s;
    s.n = 0;
    uint8_t m[8];
    put_le(m, MAGIC, 8);
    add(&s, m, 8);
    request(&s, 1, 0x1001, 0x7f000000, 1); /* 127.0.0.0: below 127.0.0.1 */
    ck_assert_int_eq(feed(g_fd[2], &s, 3), -1);
    pair_close();
}
END_TEST

/* A connection psd opened (its first bytes sent are the magic): the peer's frames from the
 * first byte; a connection request there is refused, an ack passes. Bytes of other protocols
 * pass and are never looked at again. */
START_TEST(opened_and_other_sockets)
{
    pair_open();
    uint8_t m[8];
    put_le(m, MAGIC, 8);
    ps_tcpguard_sent(g_fd[1], m, 3);
    ps_tcpguard_sent(g_fd[1], m + 3, 5);
    static stream_t s;
    s.n = 0;
    frame(&s, 32, 4, (uint8_t[]){2, 0, 0, 0}, 4);
    frame(&s, 23, 10, NULL, 10);
    ck_assert_int_eq(feed(g_fd[1], &s, 2), -1);
    s.n = 0;
    request(&s, 0, 7, 0x7f000001, 40000);
    ck_assert(feed(g_fd[1], &s, 1) >= 0);
    pair_close();

    pair_open();
    const char *http = "GET /metrics HTTP/1.1\r\n\r\n";
    ck_assert_int_eq(ps_tcpguard_received(g_fd[2], http, strlen(http)), 0);
    s.n = 0;
    frame(&s, 33, 20, NULL, 20); /* not a UCX connection: not looked at */
    ck_assert_int_eq(feed(g_fd[2], &s, 1), -1);
    ps_tcpguard_sent(g_fd[1], "PSD", 3); /* sends that are not the magic */
    ck_assert_int_eq(feed(g_fd[1], &s, 1), -1);
    pair_close();
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("tcpguard");
    TCase *tc = tcase_create("frames");
    tcase_add_test(tc, well_formed_streams_pass_in_any_pieces);
    tcase_add_test(tc, crafted_frames_refused_before_whole);
    tcase_add_test(tc, connect_to_endpoint_from_below_passes);
    tcase_add_test(tc, puts_only_into_receives_in_flight);
    tcase_add_test(tc, opened_and_other_sockets);
    suite_add_tcase(s, tc);
    return s;
}
