/* test_httpd.c: psd's HTTP endpoint (server/httpd.c) on a loop of its own, out of file
 * descriptors. libuv keeps a spare descriptor to accept and drop connections at EMFILE; once it
 * is gone (another of psd's threads took its number, or the host's table is full: ENFILE),
 * libuv calls the connection callback with the error and tries the accept again at once, for
 * good, without returning to the loop: psd's loop thread spun there, its UCX data path and
 * timers stopped (found by a review, session 70). The endpoint now closes its listener at that
 * error and listens again PSD_HTTP_PAUSE_MS later: the loop returns, and once descriptors are
 * free again a request is answered; closed while paused, it leaves no handle behind. And a
 * HEAD's refusal carries no body. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "httpd.h"

static void handler(void *arg, const char *path, psd_http_reply_t *r)
{
    (void)path;
    r->status = 200;
    r->type = "text/plain";
    r->body = strdup("ok\n");
    r->len = r->body ? 3 : 0;
    (*(int *)arg)++;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A client connected to 127.0.0.1:@p port (the kernel completes it from the backlog). */
static int connect_to(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* Run @p loop without blocking for @p secs. */
static void spin(uv_loop_t *loop, double secs)
{
    for (double t0 = now_s(); now_s() - t0 < secs;) {
        uv_run(loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
}

/* @p req on a new connection, running @p loop until the answer is whole (the server closes):
 * the answer, NUL-terminated, in @p buf. */
static void ask(uv_loop_t *loop, uint16_t port, const char *req, char *buf, size_t cap)
{
    int fd = connect_to(port);
    ck_assert_int_eq(send(fd, req, strlen(req), 0), (ssize_t)strlen(req));
    ck_assert_int_eq(fcntl(fd, F_SETFL, O_NONBLOCK), 0);
    size_t got = 0;
    for (double t0 = now_s(); now_s() - t0 < 5;) {
        uv_run(loop, UV_RUN_NOWAIT);
        ssize_t n = recv(fd, buf + got, cap - 1 - got, 0);
        if (n == 0) break;
        if (n > 0) got += (size_t)n;
        else usleep(1000);
    }
    buf[got] = '\0';
    close(fd);
}

static void get(uv_loop_t *loop, uint16_t port, char *buf, size_t cap)
{
    ask(loop, port, "GET /x HTTP/1.1\r\nHost: t\r\n\r\n", buf, cap);
}

/* The endpoint on a new loop @p loop, its handler counting into *@p served. */
static psd_httpd_t *start(uv_loop_t *loop, int *served)
{
    char err[256];
    ck_assert_int_eq(uv_loop_init(loop), 0);
    psd_httpd_t *h = psd_httpd_start(loop, "127.0.0.1", 0, handler, served, err, sizeof err);
    ck_assert_msg(h != NULL, "%s", err);
    return h;
}

/* Close @p h and @p loop: every handle closed (uv_loop_close says UV_EBUSY if not). */
static void stop(psd_httpd_t *h, uv_loop_t *loop)
{
    psd_httpd_close(h);
    ck_assert_int_eq(uv_run(loop, UV_RUN_DEFAULT), 0);
    ck_assert_int_eq(uv_loop_close(loop), 0);
}

/* _i 0: descriptors come back and a request is answered; 1: closed while paused. */
START_TEST(out_of_descriptors_pauses_the_listener)
{
    alarm(20); /* the loop that never returns ends the test (SIGALRM) instead of hanging it */
    uv_loop_t loop;
    int served = 0;
    char ans[1024];
    psd_httpd_t *h = start(&loop, &served);
    uint16_t port = psd_httpd_port(h);
    get(&loop, port, ans, sizeof ans);
    ck_assert_msg(strncmp(ans, "HTTP/1.1 200 ", 13) == 0, "first answer: '%s'", ans);
    /* libuv's spare descriptor gone, and no descriptor left for an accept. */
    if (loop.emfile_fd != -1) {
        close(loop.emfile_fd);
        loop.emfile_fd = -1;
    }
    struct rlimit was, low;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &was), 0);
    int waiting = connect_to(port), fds[512], nfds = 0;
    low = was;
    low.rlim_cur = (rlim_t)waiting + 64 < was.rlim_cur ? (rlim_t)waiting + 64 : was.rlim_cur;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
    while (nfds < 512 && (fds[nfds] = dup(0)) >= 0) nfds++;
    ck_assert_msg(nfds < 512 && errno == EMFILE, "the table did not fill (%d dups)", nfds);
    spin(&loop, 0.2); /* before: on_connection(EMFILE) over and over, never returning */
    for (int i = 0; i < nfds; i++) close(fds[i]);
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &was), 0);
    close(waiting); /* it waited in the closed listener's backlog: reset */
    if (_i == 0) {
        spin(&loop, PSD_HTTP_PAUSE_MS / 1000.0 + 0.3);
        get(&loop, port, ans, sizeof ans);
        ck_assert_msg(strncmp(ans, "HTTP/1.1 200 ", 13) == 0, "answer after the pause: '%s'",
                      ans);
        ck_assert_int_eq(served, 2);
    }
    stop(h, &loop);
    alarm(0);
}
END_TEST

/* A HEAD refused for its path is answered with the refusal's length and no body (RFC 9110,
 * 9.3.2); the GET of the same path gets the body (before, both did). */
START_TEST(head_refusal_has_no_body)
{
    uv_loop_t loop;
    int served = 0;
    char ans[1024];
    psd_httpd_t *h = start(&loop, &served);
    for (int head = 0; head < 2; head++) {
        ask(&loop, psd_httpd_port(h), head ? "HEAD x HTTP/1.1\r\n\r\n" : "GET x HTTP/1.1\r\n\r\n",
            ans, sizeof ans);
        ck_assert_msg(strncmp(ans, "HTTP/1.1 400 ", 13) == 0, "%s", ans);
        const char *end = strstr(ans, "\r\n\r\n");
        ck_assert_ptr_nonnull(end);
        ck_assert_msg(head ? end[4] == '\0' : strstr(end, "does not start with '/'") != NULL,
                      "%s: '%s'", head ? "HEAD" : "GET", ans);
    }
    ck_assert_int_eq(served, 0);
    stop(h, &loop);
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("httpd");
    TCase *tc = tcase_create("descriptors");
    tcase_add_loop_test(tc, out_of_descriptors_pauses_the_listener, 0, 2);
    suite_add_tcase(s, tc);
    TCase *th = tcase_create("head");
    tcase_add_test(th, head_refusal_has_no_body);
    suite_add_tcase(s, th);
    return s;
}
