/* test_metrics.c: psd's HTTP endpoint (servers[].metrics_port): /metrics in the Prometheus
 * text format following a run, /healthz, /status, and requests a confused or hostile client
 * sends, which get an error or a close while psd keeps serving workers and other clients. */
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cluster.h"
#include "expect.h"

/* Read @p fd until EOF (at most 20 s and 1 MiB) into a malloc'd NUL-terminated string;
 * *@p reset (if not NULL) says whether it ended with an error (a reset) instead of EOF. */
static char *read_all_reset(int fd, bool *reset)
{
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap + 1);
    ck_assert(buf != NULL);
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, 20000);
        ck_assert_msg(r > 0, "no answer or close from psd's metrics port within 20 s");
        ssize_t n = read(fd, buf + len, cap - len);
        if (reset) *reset = n < 0;
        if (n <= 0) break; /* EOF, or a reset: what came so far is the answer */
        len += (size_t)n;
        ck_assert_msg(len < cap, "an answer of more than 1 MiB");
    }
    buf[len] = '\0';
    return buf;
}

static char *read_all(int fd) { return read_all_reset(fd, NULL); }

/* Send @p req (@p len bytes) and read the whole answer. Returns its status code (0 when the
 * connection closed without one); *@p answer (if not NULL) gets the malloc'd answer. */
static int http_raw(uint16_t port, const char *req, size_t len, char **answer)
{
    int fd = cl_tcp_connect(port);
    ck_assert_msg(write(fd, req, len) == (ssize_t)len, "write: %s", strerror(errno));
    char *a = read_all(fd);
    close(fd);
    int status = 0;
    if (strncmp(a, "HTTP/1.1 ", 9) == 0) status = atoi(a + 9);
    if (answer)
        *answer = a;
    else
        free(a);
    return status;
}

/* GET @p path; returns the status; *@p body gets the malloc'd body. */
static int http_get(uint16_t port, const char *path, char **body)
{
    char req[256], *a;
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path);
    int status = http_raw(port, req, (size_t)n, &a);
    const char *b = strstr(a, "\r\n\r\n");
    *body = strdup(b ? b + 4 : "");
    free(a);
    return status;
}

/* The value of the sample of metric @p name in @p text (its labels start with cluster=); -1
 * when it is missing. */
static double metric(const char *text, const char *name)
{
    char needle[128];
    snprintf(needle, sizeof needle, "\n%s{cluster=", name);
    const char *p = strstr(text, needle);
    if (p == NULL) return -1;
    p = strchr(p, '}');
    return p ? strtod(p + 1, NULL) : -1;
}

/* Every line is a # HELP, a # TYPE, or a sample `name{labels} value` whose metric had its
 * HELP and TYPE (counter or gauge) just before, and whose labels start with this cluster and
 * shard; a counter's name ends in _total. */
static void check_format(const char *text, const char *cluster, int shard)
{
    char want[160], help_of[128] = "", type_of[128] = "", type[16] = "";
    snprintf(want, sizeof want, "{cluster=\"%s\",shard=\"%d\"", cluster, shard);
    int samples = 0;
    for (const char *l = text; *l;) {
        const char *e = strchr(l, '\n');
        ck_assert_msg(e != NULL, "the last line does not end in a newline: %s", l);
        char line[1024];
        size_t n = (size_t)(e - l) < sizeof line - 1 ? (size_t)(e - l) : sizeof line - 1;
        memcpy(line, l, n);
        line[n] = '\0';
        l = e + 1;
        if (sscanf(line, "# HELP %127s", help_of) == 1) continue;
        if (sscanf(line, "# TYPE %127s %15s", type_of, type) == 2) {
            ck_assert_msg(strcmp(type_of, help_of) == 0, "TYPE without HELP: %s", line);
            ck_assert_msg(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0,
                          "unknown type: %s", line);
            continue;
        }
        char *brace = strchr(line, '{');
        ck_assert_msg(brace != NULL, "not a sample: '%s'", line);
        *brace = '\0';
        ck_assert_msg(strcmp(line, type_of) == 0, "sample of %s after the TYPE of %s", line,
                      type_of);
        size_t nl = strlen(line);
        ck_assert_msg(strcmp(type, "counter") != 0 || (nl > 6 && !strcmp(line + nl - 6, "_total")),
                      "counter %s does not end in _total", line);
        *brace = '{';
        ck_assert_msg(strncmp(brace, want, strlen(want)) == 0, "labels of '%s' lack %s", line,
                      want);
        char *close = strchr(brace, '}'), *end;
        ck_assert_msg(close && close[1] == ' ', "no value in '%s'", line);
        strtod(close + 2, &end);
        ck_assert_msg(end != close + 2 && *end == '\0', "value of '%s' is not a number", line);
        samples++;
    }
    ck_assert_msg(samples >= 20, "only %d samples", samples);
}

/* Every counter sample of @p before (a scrape of shard @p shard) is in @p after, a later scrape
 * of it, with a value not lower: counters only grow while psd runs. Returns the counters
 * compared. */
static int counters_kept(const char *before, const char *after, int shard)
{
    int n = 0;
    char type_of[128] = "", type[16] = "";
    for (const char *l = before; *l;) {
        const char *e = strchr(l, '\n');
        if (e == NULL) break;
        char line[1024];
        size_t len = (size_t)(e - l) < sizeof line - 1 ? (size_t)(e - l) : sizeof line - 1;
        memcpy(line, l, len);
        line[len] = '\0';
        l = e + 1;
        if (sscanf(line, "# TYPE %127s %15s", type_of, type) == 2 || line[0] == '#' ||
            strcmp(type, "counter") != 0)
            continue;
        char *close = strchr(line, '}');
        ck_assert_ptr_nonnull(close);
        double was = strtod(close + 1, NULL);
        close[1] = '\0'; /* name{labels} */
        char needle[1040];
        snprintf(needle, sizeof needle, "\n%s ", line);
        const char *at = strstr(after, needle);
        ck_assert_msg(at != NULL, "shard %d: counter %s gone from a later scrape", shard, line);
        double now = strtod(at + strlen(needle), NULL);
        ck_assert_msg(now >= was, "shard %d: counter %s went from %.0f down to %.0f", shard, line,
                      was, now);
        n++;
    }
    return n;
}

/* A 2 x 2 run: /metrics of both shards follows it (pushes, updates, the job's samples, the
 * same figures as /status), /healthz says ok, HEAD answers the headers alone. Under bsp a
 * chunk's step is one update, however many pushes it sums (before, updates counted the pushes:
 * twice the truth with two workers, found by a probe). */
START_TEST(test_metrics_follow_training)
{
    cl_conf_t k = {.shards = 2, .workers = 2, .max_steps = 20, .metrics = true,
                   .start_wait_ms = CL_TOGETHER_MS};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    EXPECT_LOG(psd[0], "metrics on http://127.0.0.1:");
    char *body;
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(http_get(c->metrics_port[i], "/healthz", &body), 200);
        ck_assert_str_eq(body, "ok\n");
        free(body);
    }
    ck_assert_int_eq(http_get(c->metrics_port[0], "/metrics", &body), 200);
    check_format(body, c->cluster_name, 0);
    ck_assert_msg(metric(body, "psd_pushes_total") == 0, "%s", body);
    ck_assert_msg(metric(body, "psd_job_workers_desired") == 2, "%.600s", body);
    ck_assert_msg(metric(body, "psd_job_finished") == 0, "%s", body);
    ck_assert_msg(metric(body, "psd_learning_rate") == -1, "a rate before any update: %s", body);
    free(body);

    cl_proc_t *w[2] = {cl_worker_start(c, NULL, NULL, false), cl_worker_start(c, NULL, NULL, false)};
    EXPECT_EXIT(w[0], 0);
    EXPECT_EXIT(w[1], 0);
    char *trained[2]; /* each shard's scrape after the run, for the counters later */
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(http_get(c->metrics_port[i], "/metrics", &body), 200);
        check_format(body, c->cluster_name, i);
        trained[i] = strdup(body);
        ck_assert_msg(metric(body, "psd_step") == 20, "shard %d: %.600s", i, body);
        ck_assert_msg(metric(body, "psd_pushes_total") > 0, "shard %d: %.600s", i, body);
        /* Every chunk went through the 20 steps: 20 updates each; the two workers pushed
         * each chunk's steps twice (the first worker may have started alone: at most). */
        double chunks = metric(body, "psd_chunks"), upd = metric(body, "psd_updates_applied_total");
        ck_assert_msg(metric(body, "psd_chunk_version_min") == 20 && upd == 20 * chunks,
                      "shard %d: %.0f updates of %.0f chunks in 20 steps (versions %.0f)", i,
                      upd, chunks, metric(body, "psd_chunk_version_min"));
        ck_assert_msg(metric(body, "psd_pushes_total") <= 2 * upd &&
                          metric(body, "psd_pushes_total") > upd,
                      "shard %d: %.0f pushes, %.0f updates", i, metric(body, "psd_pushes_total"),
                      upd);
        ck_assert_msg(metric(body, "psd_tensors") > 0 && metric(body, "psd_state_bytes") > 0,
                      "shard %d: %.600s", i, body);
        ck_assert_msg(metric(body, "psd_serving") == 1, "shard %d: %.600s", i, body);
        ck_assert_msg(metric(body, "psd_learning_rate") > 0, "shard %d: %.600s", i, body);
        /* The checks of peers' messages and TCP frames let a well-formed run through whole. */
        ck_assert_msg(metric(body, "psd_ucx_messages_dropped_total") == 0 &&
                          metric(body, "psd_tcp_connections_closed_total") == 0,
                      "shard %d: %.600s", i, body);
        /* The job is shard 0's alone. */
        ck_assert_msg((metric(body, "psd_job_membership_epoch") >= 0) == (i == 0),
                      "shard %d: %.600s", i, body);
        double samples = metric(body, "psd_job_samples_applied_total");
        double pushes = metric(body, "psd_pushes_total");
        free(body);
        ck_assert_int_eq(http_get(c->metrics_port[i], "/status", &body), 200);
        EXPECT_JSON(body, strlen(body), "/status");
        char want[64];
        snprintf(want, sizeof want, "{\"shard\": %d, ", i);
        ck_assert_msg(strncmp(body, want, strlen(want)) == 0 && body[strlen(body) - 1] == '}',
                      "shard %d: %.600s", i, body);
        snprintf(want, sizeof want, "\"pushes\": %.0f, ", pushes);
        ck_assert_msg(strstr(body, want), "/status lacks %s: %.600s", want, body);
        if (i == 0) {
            ck_assert_msg(samples > 20 * 64 && samples <= 2 * 20 * 64,
                          "samples applied %.0f in 20 steps of 2 x 64", samples);
            snprintf(want, sizeof want, "\"samples_applied\": %.0f, ", samples);
            ck_assert_msg(strstr(body, want), "/status lacks %s: %.600s", want, body);
        }
        free(body);
    }
    /* HEAD: the headers alone, with the length GET would send. */
    char *a;
    const char head[] = "HEAD /healthz HTTP/1.0\r\n\r\n";
    ck_assert_int_eq(http_raw(c->metrics_port[1], head, sizeof head - 1, &a), 200);
    ck_assert_msg(strstr(a, "Content-Length: 3\r\n") && strcmp(strstr(a, "\r\n\r\n"), "\r\n\r\n") == 0,
                  "%s", a);
    free(a);
    /* A head whose lines end in LF and whose empty line is CR LF (RFC 9112: a CR before a
     * line's LF is optional) is answered; before, it waited for more until closed at 5 s. */
    const char mixed[] = "GET /healthz HTTP/1.1\nHost: x\n\r\n";
    ck_assert_int_eq(http_raw(c->metrics_port[1], mixed, sizeof mixed - 1, &a), 200);
    free(a);
    /* psctl scale on the finished job commits the coordinator's state (slot work): psd's own
     * pull-reply snapshot does not age with them (session 62; before, each commit added one to
     * the gauge of an idle shard 0, a probe found). */
    for (int i = 0; i < 4; i++) {
        char n[8];
        snprintf(n, sizeof n, "%d", 3 + i);
        char *argv[] = {(char *)cl_binary("PSCTL"), "--manifest", c->manifest, "scale", n, NULL};
        cl_proc_t *s = cl_spawn(c, "psctl-scale", argv);
        EXPECT_EXIT(s, 0);
    }
    ck_assert_int_eq(http_get(c->metrics_port[0], "/metrics", &body), 200);
    ck_assert_msg(metric(body, "psd_job_workers_desired") == 6 &&
                      metric(body, "psd_store_oldest_snapshot_commits") <= 1,
                  "desired %.0f, the oldest snapshot %.0f commits old",
                  metric(body, "psd_job_workers_desired"),
                  metric(body, "psd_store_oldest_snapshot_commits"));
    ck_assert_msg(metric(body, "psd_checkpoint_copies_total") == 0 &&
                      !strstr(body, "psd_checkpoint_last_copy_step{"),
                  "%s", body);
    free(body);
    /* A checkpoint: each shard counts its part and says when, its step and bytes. */
    char *ck[] = {(char *)cl_binary("PSCTL"), "--manifest", c->manifest, "checkpoint", NULL};
    cl_proc_t *cp = cl_spawn(c, "psctl-checkpoint", ck);
    EXPECT_EXIT(cp, 0);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(http_get(c->metrics_port[i], "/metrics", &body), 200);
        check_format(body, c->cluster_name, i);
        /* Between the two scrapes: psctl scales, status requests, a checkpoint. */
        ck_assert_int_ge(counters_kept(trained[i], body, i), 10);
        free(trained[i]);
        ck_assert_msg(metric(body, "psd_checkpoint_copies_total") == 1 &&
                          metric(body, "psd_checkpoint_copies_failed_total") == 0 &&
                          metric(body, "psd_checkpoint_last_copy_step") == 20 &&
                          metric(body, "psd_checkpoint_last_copy_bytes") > 0 &&
                          metric(body, "psd_checkpoint_last_copy_time_seconds") >=
                              metric(body, "psd_start_time_seconds"),
                      "shard %d: %s", i, body);
        free(body);
    }
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* What a confused or hostile client sends gets a 4xx naming what is wrong or a close; idle
 * connections (more than psd keeps) are closed after a while; meanwhile a worker trains to its
 * end and psd keeps answering. */
START_TEST(test_metrics_hostile_clients)
{
    cl_conf_t k = {.shards = 1, .workers = 1, .max_steps = 30, .metrics = true};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start(c, 0, NULL, READY_S);
    uint16_t port = c->metrics_port[0];
    static const struct {
        const char *req;
        size_t len;
        int status;
        const char *says;
    } bad[] = {
#define R(s) s, sizeof s - 1
        {R("garbage\r\n\r\n"), 400, "the request line is not METHOD PATH HTTP/1.x"},
        {R("GET /metrics\r\n\r\n"), 400, "the request line is not METHOD PATH HTTP/1.x"},
        {R("GET /metrics HTTP/2.0\r\n\r\n"), 400, "the request line is not METHOD PATH"},
        {R("get /metrics HTTP/1.1\r\n\r\n"), 400, "the method is not a word in capitals"},
        {R("POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"), 405, "only GET and HEAD"},
        {R("GET metrics HTTP/1.1\r\n\r\n"), 400, "the path does not start with '/'"},
        {R("GET /a\x01 HTTP/1.1\r\n\r\n"), 400, "control or non-ASCII byte"},
        {R("GET /metrics HTTP/1.1\r\nX: \0\r\n\r\n"), 400, "holds a NUL byte"},
        {R("GET /secrets HTTP/1.1\r\n\r\n"), 404, "no /secrets here"},
        {R("BREW /metrics HTTP/1.1\r\n\r\n"), 501, "only GET and HEAD"},
        /* As RFC 9112 asks: an empty line first is ignored, the absolute form is its path. */
        {R("\r\nGET /healthz HTTP/1.1\r\n\r\n"), 200, NULL},
        {R("GET http://127.0.0.1/healthz?x HTTP/1.1\r\n\r\n"), 200, NULL},
        {R("GET /metrics\r\n"), 0, NULL}, /* then EOF: no whole request, a close */
#undef R
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int fd = cl_tcp_connect(port);
        ck_assert(write(fd, bad[i].req, bad[i].len) == (ssize_t)bad[i].len);
        shutdown(fd, SHUT_WR);
        char *a = read_all(fd);
        close(fd);
        int status = strncmp(a, "HTTP/1.1 ", 9) == 0 ? atoi(a + 9) : 0;
        ck_assert_msg(status == bad[i].status && (!bad[i].says || strstr(a, bad[i].says)),
                      "request %zu: want %d \"%s\", got: %s", i, bad[i].status,
                      bad[i].says ? bad[i].says : "", a);
        free(a);
    }
    /* A head longer than 8 KiB: 431, whatever follows. */
    static char big[20000];
    memset(big, 'A', sizeof big);
    memcpy(big, "GET /", 5);
    char *a;
    int fd = cl_tcp_connect(port);
    ck_assert(write(fd, big, 9000) == 9000);
    a = read_all(fd);
    close(fd);
    ck_assert_msg(strncmp(a, "HTTP/1.1 431 ", 13) == 0, "%s", a);
    free(a);

    /* Empty lines before the request line in a read of their own are ignored too. */
    fd = cl_tcp_connect(port);
    ck_assert(write(fd, "\r\n\r\n", 4) == 4);
    usleep(100000);
    ck_assert(write(fd, "GET /healthz HTTP/1.1\r\n\r\n", 25) == 25);
    a = read_all(fd);
    close(fd);
    ck_assert_msg(strncmp(a, "HTTP/1.1 200 ", 13) == 0, "CRLF CRLF, then a GET: %s", a);
    free(a);

    /* A GET with a body psd does not read, from a client that reads the answer slowly (a small
     * receive buffer, and it reads only after it sent everything): the answer arrives whole
     * and ends with an EOF. Before, psd closed with the body unread, and the kernel answered
     * that with a reset that dropped what was not sent yet of the answer. */
    static char withbody[16384];
    int hl = snprintf(withbody, sizeof withbody,
                      "GET /metrics HTTP/1.1\r\nContent-Length: %zu\r\n\r\n", sizeof withbody);
    memset(withbody + hl, 'x', sizeof withbody - (size_t)hl);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int small = 2048;
    ck_assert(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small) == 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_msg(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "%s", strerror(errno));
    ck_assert(write(fd, withbody, sizeof withbody) == (ssize_t)sizeof withbody);
    usleep(300000); /* psd answers, shuts its side down and (before) closed */
    bool reset;
    a = read_all_reset(fd, &reset);
    close(fd);
    const char *b = strstr(a, "\r\n\r\n"), *cl = strstr(a, "Content-Length: ");
    long want = cl ? atol(cl + 16) : -1;
    size_t got = b ? strlen(b + 4) : 0;
    ck_assert_msg(b && want > 0 && got == (size_t)want && !reset,
                  "a GET with a body: %zu of the answer's %ld bytes, then %s: %.300s", got, want,
                  reset ? "a reset" : "EOF", a);
    free(a);

    /* 40 connections that send nothing (psd keeps 32: each one past them closes the oldest)
     * while a worker trains to its end; meanwhile a scrape is answered (before, every other
     * client was refused as long as 32 idle ones were held open). */
    int idle[40];
    for (int i = 0; i < 40; i++) idle[i] = cl_tcp_connect(port);
    char *body;
    ck_assert_int_eq(http_get(port, "/healthz", &body), 200);
    free(body);
    cl_proc_t *w = cl_worker_start(c, NULL, NULL, false);
    EXPECT_EXIT(w, 0);
    for (int i = 0; i < 40; i++) { /* each is closed by psd: EOF, never an answer */
        a = read_all(idle[i]);
        ck_assert_msg(a[0] == '\0', "idle connection %d got an answer: %s", i, a);
        free(a);
        close(idle[i]);
    }
    ck_assert_int_eq(http_get(port, "/metrics", &body), 200);
    ck_assert_msg(metric(body, "psd_step") == 30, "%s", body);
    free(body);
    ck_assert_int_eq(http_get(port, "/healthz", &body), 200);
    free(body);
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* Connections that find no memory left for them (PS_TEST_HTTP_NOMEM=5, a test hook), coming in
 * a burst: each is taken and closed, and the endpoint serves the next one. Before, a connection
 * that came while the spare handle closed the one before it was never taken, and libuv stopped
 * watching the listener: those hung, and the endpoint accepted nothing any more. */
START_TEST(test_metrics_no_memory_for_a_connection)
{
    cl_conf_t k = {.shards = 1, .workers = 1, .metrics = true};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd = cl_psd_start_env(c, 0, READY_S, "PS_TEST_HTTP_NOMEM", "5");
    uint16_t port = c->metrics_port[0];
    int fd[5];
    for (int i = 0; i < 5; i++) fd[i] = cl_tcp_connect(port);
    for (int i = 0; i < 5; i++) { /* each closed (read_all fails the test after 20 s) */
        char *a = read_all(fd[i]);
        ck_assert_msg(a[0] == '\0', "connection %d got an answer: %s", i, a);
        free(a);
        close(fd[i]);
    }
    char *body;
    ck_assert_int_eq(http_get(port, "/healthz", &body), 200);
    free(body);
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* Shard 0's figures that must not lie after what goes wrong: a coordinator state save that
 * failed once and was retried is counted for good (before, the counter held the failures in a
 * row: 0 again a millisecond later), and a member's steps/s after a restart of shard 0 counts
 * from its return (before, 0.00: its steps over the machine's uptime). Found by a probe. */
START_TEST(test_metrics_after_failures)
{
    cl_conf_t k = {.shards = 2, .workers = 1, .max_steps = 600, .metrics = true,
                   .consistency = "asp"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start_env(c, 0, READY_S, "PS_TEST_FAIL_HANDOUT_SAVE", "5"),
                         cl_psd_start(c, 1, NULL, READY_S)};
    cl_proc_t *w = cl_worker_start(c, NULL, NULL, false);
    ck_assert_msg(cl_wait_log(psd[0], "is saved again", RUN_S) == 0, "no failed save: %s",
                  cl_tail(psd[0]));
    char *body;
    ck_assert_int_eq(http_get(c->metrics_port[0], "/metrics", &body), 200);
    ck_assert_msg(metric(body, "psd_job_state_save_failures_total") == 1 &&
                      metric(body, "psd_job_state_save_failing") == 0, "failures %.0f, failing %.0f",
                  metric(body, "psd_job_state_save_failures_total"),
                  metric(body, "psd_job_state_save_failing"));
    free(body);
    ck_assert_int_eq(http_get(c->metrics_port[0], "/status", &body), 200);
    ck_assert_msg(strstr(body, "\"state_save_failures\": 1, \"state_save_failing\": 0, "),
                  "%.300s", strstr(body, "state_save") ? strstr(body, "state_save") : body);
    free(body);
    /* Shard 0 killed and started again while the worker trains: its rate counts again. */
    ck_assert_int_eq(cl_signal(psd[0], SIGKILL), 0);
    ck_assert_int_eq(cl_wait(psd[0], RUN_S), 128 + SIGKILL);
    psd[0] = cl_psd_start(c, 0, NULL, READY_S);
    double rate = 0;
    for (int tries = 0; tries < 100 && rate < 1; tries++) {
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
        if (http_get(c->metrics_port[0], "/status", &body) != 200) continue;
        char *at = strstr(body, "\"steps_per_s\": ");
        rate = at ? strtod(at + strlen("\"steps_per_s\": "), NULL) : 0;
        free(body);
    }
    ck_assert_msg(rate >= 1, "steps/s of the member after the restart: %.2f", rate);
    EXPECT_EXIT(w, 0);
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* A shard whose store cannot take an update (its map full: 16 MiB for ~14 MiB of adam state)
 * says so on /healthz (503 and why), psd_serving 0, and counts the failed jobs. Before: 200 ok
 * and psd_serving 1 while every update failed (a probe, session 48). */
START_TEST(test_metrics_store_full_unhealthy)
{
    cl_conf_t k = {.shards = 2, .workers = 1, .max_steps = 20, .metrics = true,
                   .layers = "[784, 1280, 1024, 10]", .map_size_mb = 16, .chunk_bytes = 1 << 20,
                   .optimizer = "{name: adam, lr: 0.001}"};
    cl_cluster_t *c = cl_cluster_create(&k);
    cl_proc_t *psd[2] = {cl_psd_start(c, 0, NULL, READY_S), cl_psd_start(c, 1, NULL, READY_S)};
    cl_proc_t *w = cl_worker_start(c, NULL, NULL, false);
    int st = cl_wait(w, RUN_S);
    ck_assert_msg(st == 1, "the worker exited %d: %s", st, cl_tail(w));
    EXPECT_LOG(w, "the shard store is full");
    int full = 0;
    for (int i = 0; i < 2; i++) {
        char *body;
        if (count_in_log(psd[i], "the shard store is full") == 0) continue;
        full++;
        ck_assert_int_eq(http_get(c->metrics_port[i], "/healthz", &body), 503);
        ck_assert_msg(strstr(body, "store job failed: the shard store is full: raise "
                                   "map_size_mb (map_size_mb is 16)"), "%s", body);
        free(body);
        ck_assert_int_eq(http_get(c->metrics_port[i], "/metrics", &body), 200);
        ck_assert_msg(metric(body, "psd_serving") == 0 &&
                          metric(body, "psd_store_job_failures_total") >= 1,
                      "shard %d: serving %.0f, store job failures %.0f", i,
                      metric(body, "psd_serving"), metric(body, "psd_store_job_failures_total"));
        free(body);
    }
    ck_assert_msg(full > 0, "no shard's store was full: %s | %s", cl_tail(psd[0]),
                  cl_tail(psd[1]));
    stop_all(psd, 2);
    cl_cluster_destroy(c);
}
END_TEST

/* A store full only because a worker stopped inside a direct read holds an old snapshot
 * (PS_TEST_DIRECT_STOP): /healthz is 503 and names the wait ("updates wait for it"), not
 * "raise map_size_mb"; once both workers are killed (the stopped one's read slot is cleared by
 * psd's cron, and no update is left to try again) it is 200 again. Before, it stayed 503
 * naming a dead holder until some later update committed (a probe, session 60). */
START_TEST(test_metrics_store_pinned_healthz)
{
    cl_proc_t *psd, *w[2];
    cl_cluster_t *c = cl_stopped_reader_start(true, &psd, w);
    ck_assert_msg(cl_wait_log(psd, "updates wait for it", RUN_S) == 0, "%s", cl_tail(psd));
    char *body;
    ck_assert_int_eq(http_get(c->metrics_port[0], "/healthz", &body), 503);
    ck_assert_msg(strstr(body, "updates wait for it") && !strstr(body, "raise map_size_mb"),
                  "%s", body);
    free(body);
    ck_assert_int_eq(http_get(c->metrics_port[0], "/metrics", &body), 200);
    ck_assert_msg(metric(body, "psd_store_updates_waiting") == 1 &&
                      metric(body, "psd_store_oldest_snapshot_commits") >= 2,
                  "waiting %.0f, oldest snapshot %.0f commits old",
                  metric(body, "psd_store_updates_waiting"),
                  metric(body, "psd_store_oldest_snapshot_commits"));
    /* The map's high-water mark reached its size (16 MiB): what an alert watches. */
    ck_assert_msg(metric(body, "psd_store_map_bytes") == 16 << 20 &&
                      metric(body, "psd_store_map_high_water_bytes") >
                          0.9 * metric(body, "psd_store_map_bytes"),
                  "map %.0f bytes, high-water %.0f", metric(body, "psd_store_map_bytes"),
                  metric(body, "psd_store_map_high_water_bytes"));
    free(body);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(cl_signal(w[i], SIGKILL), 0);
        cl_wait(w[i], RUN_S);
    }
    int st = 0;
    for (int t = 0; t < 200 && st != 200; t++) { /* the cron's ticks: 62 ms */
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
        st = http_get(c->metrics_port[0], "/healthz", &body);
        if (st != 200 && t == 199) fprintf(stderr, "healthz: %s", body);
        free(body);
    }
    ck_assert_msg(st == 200, "/healthz stayed %d after the holder died: %s", st, cl_tail(psd));
    ck_assert_int_eq(http_get(c->metrics_port[0], "/metrics", &body), 200);
    ck_assert_msg(metric(body, "psd_store_updates_waiting") == 0 &&
                      metric(body, "psd_store_oldest_snapshot_commits") < 2,
                  "waiting %.0f, oldest snapshot %.0f commits old",
                  metric(body, "psd_store_updates_waiting"),
                  metric(body, "psd_store_oldest_snapshot_commits"));
    free(body);
    stop_all(&psd, 1);
    cl_cluster_destroy(c);
}
END_TEST

/* The metrics port taken by another program: psd refuses to start, says which address, and
 * leaves no store behind in a data_dir that was not there (it checked the port only after
 * loading the store, before session 59). */
START_TEST(test_metrics_port_in_use)
{
    cl_conf_t k = {.shards = 1, .workers = 1, .metrics = true};
    cl_cluster_t *c = cl_cluster_create(&k);
    int fd = cl_hold_port(c->metrics_port[0]);
    cl_proc_t *psd = cl_psd_spawn(c, 0, NULL);
    EXPECT_EXIT(psd, 1);
    char want[128];
    snprintf(want, sizeof want, "cannot listen on 127.0.0.1:%u for metrics: address already in use",
             c->metrics_port[0]);
    EXPECT_LOG(psd, want);
    ck_assert_msg(access(c->data_dir[0], F_OK) != 0, "%s made", c->data_dir[0]);
    close(fd);
    cl_cluster_destroy(c);
}
END_TEST

/* The shard's own port taken by another program: psd refuses to start, says so, and leaves
 * no store behind in a data_dir that was not there (it made one, then found the port taken). */
START_TEST(test_shard_port_in_use)
{
    cl_conf_t k = {.shards = 1, .workers = 1};
    cl_cluster_t *c = cl_cluster_create(&k);
    int fd = cl_hold_port(c->port[0]);
    cl_proc_t *psd = cl_psd_spawn(c, 0, NULL);
    EXPECT_EXIT(psd, 1);
    char want[160];
    snprintf(want, sizeof want, "cannot listen on 127.0.0.1:%u: address already in use "
             "(another psd or program holds it", c->port[0]);
    EXPECT_LOG(psd, want);
    ck_assert_msg(access(c->data_dir[0], F_OK) != 0, "%s made", c->data_dir[0]);
    close(fd);
    cl_cluster_destroy(c);
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("metrics");
    suite_add_tcase(s, tcase("metrics_follow_training", test_metrics_follow_training));
    suite_add_tcase(s, tcase("metrics_hostile_clients", test_metrics_hostile_clients));
    suite_add_tcase(s, tcase("metrics_port_in_use", test_metrics_port_in_use));
    suite_add_tcase(s, tcase("shard_port_in_use", test_shard_port_in_use));
    suite_add_tcase(s, tcase("metrics_after_failures", test_metrics_after_failures));
    suite_add_tcase(s, tcase("metrics_store_full_unhealthy", test_metrics_store_full_unhealthy));
    suite_add_tcase(s, tcase("metrics_store_pinned_healthz", test_metrics_store_pinned_healthz));
    suite_add_tcase(s, tcase("metrics_no_memory_for_a_connection",
                             test_metrics_no_memory_for_a_connection));
    return s;
}
