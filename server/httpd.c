/* httpd.c: a small HTTP/1.1 server on a libuv loop (see httpd.h). */
#include "httpd.h"
#include "httphead.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps/ps_log.h"
#include "ucx_loop.h" /* ps_sockaddr_resolve */

typedef struct hconn_s {
    uv_tcp_t tcp;
    uv_timer_t timer;
    psd_httpd_t *h;
    int open_handles;      /* tcp and timer: freed when both are closed */
    bool closing, answered;
    bool draining;         /* answered and shut down: reading what the client still sends */
    psd_http_head_t hh;    /* the request head received so far */
    char hdr[256];         /* the status line and headers of the answer */
    char *body;
    uv_write_t wr;
    uv_shutdown_t sh;
    struct hconn_s *next, *prev;
} hconn_t;

struct psd_httpd_s {
    uv_tcp_t listen;
    /* Out of descriptors (EMFILE, ENFILE) with libuv's spare one gone (another thread took
     * its number, or the host's table is full), libuv calls on_connection with the error and
     * tries the accept again at once, for good, without returning to the loop: the listener is
     * closed then (that ends libuv's loop) and opened again PSD_HTTP_PAUSE_MS later. */
    enum { LISTEN_OPEN, LISTEN_CLOSING, LISTEN_PAUSED } lstate;
    uv_timer_t again;
    struct sockaddr_storage addr; /* where it listens (the port as bound) */
    bool again_said;              /* this pause's failed retry was logged */
    uv_tcp_t reject;   /* accepts and closes a connection when no memory for one is left */
    bool reject_busy;
    bool reject_next;  /* a connection waits to be taken once the reject handle is closed */
    unsigned test_nomem; /* PS_TEST_HTTP_NOMEM (a test hook): connections to treat as if no
                            memory were left for them */
    psd_http_handler_cb cb;
    void *arg;
    uint16_t port;
    bool closing;
    int handles; /* the listener + every open connection: freed at 0 once closing */
    int nconns;
    hconn_t *conns;
};

static void httpd_unref(psd_httpd_t *h)
{
    if (--h->handles == 0 && h->closing) free(h);
}

static void on_conn_handle_closed(uv_handle_t *hd)
{
    hconn_t *c = hd->data;
    if (--c->open_handles) return;
    psd_httpd_t *h = c->h;
    free(c->body);
    free(c);
    httpd_unref(h);
}

static void conn_close(hconn_t *c)
{
    if (c->closing) return;
    c->closing = true;
    psd_httpd_t *h = c->h;
    if (c->prev)
        c->prev->next = c->next;
    else if (h->conns == c)
        h->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    c->next = c->prev = NULL;
    h->nconns--;
    uv_close((uv_handle_t *)&c->tcp, on_conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
}

static const char *reason_of(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Unknown";
    }
}

static void on_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);
static void on_idle(uv_timer_t *t);

/* The answer is sent and the write side shut: close once the client closed its side (or after
 * PSD_HTTP_LINGER_MS), reading and dropping whatever it still sends. Closing with its bytes
 * unread would make the kernel reset the connection, and a client whose answer was still in
 * flight could lose it (a GET with a body, or bytes sent after the head). */
static void on_shutdown(uv_shutdown_t *sh, int status)
{
    hconn_t *c = sh->data;
    if (c->closing) return;
    c->draining = true;
    if (status < 0 || uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_idle, PSD_HTTP_LINGER_MS, 0);
}

static void on_written(uv_write_t *w, int status)
{
    hconn_t *c = w->data;
    if (c->closing) return;
    if (status < 0 || uv_shutdown(&c->sh, (uv_stream_t *)&c->tcp, on_shutdown) != 0)
        conn_close(c);
}

/* Send the answer (status line, headers, and the body unless @p head_only), then close. */
static void answer(hconn_t *c, const psd_http_reply_t *r, bool head_only)
{
    c->answered = true;
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_timer_start(&c->timer, on_idle, PSD_HTTP_IDLE_MS, 0); /* the answer's own time to go */
    c->body = r->body; /* freed with the connection */
    int n = snprintf(c->hdr, sizeof c->hdr,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
                     "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
                     r->status, reason_of(r->status), r->type ? r->type : "text/plain",
                     r->len, r->status == 405 ? "Allow: GET, HEAD\r\n" : "");
    uv_buf_t b[2] = {uv_buf_init(c->hdr, (unsigned)n),
                     uv_buf_init(r->body ? r->body : c->hdr, (unsigned)r->len)};
    c->wr.data = c;
    c->sh.data = c;
    if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, b, head_only || r->len == 0 ? 1 : 2,
                 on_written) != 0)
        conn_close(c);
}

/* An error answer with a one-line text body naming what is wrong (its length only, for a
 * HEAD: @p head_only). */
static void answer_error(hconn_t *c, int status, const char *why, bool head_only)
{
    psd_http_reply_t r = {.status = status, .type = "text/plain; charset=utf-8"};
    size_t cap = strlen(why) + 64;
    if ((r.body = malloc(cap)) == NULL) {
        conn_close(c);
        return;
    }
    r.len = (size_t)snprintf(r.body, cap, "%d %s: %s\n", status, reason_of(status), why);
    answer(c, &r, head_only);
}

static void on_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    hconn_t *c = hd->data;
    if (c->draining) /* bytes read only to be dropped: the head is not looked at any more */
        *buf = uv_buf_init(c->hh.head, PSD_HTTP_HEAD_MAX);
    else
        *buf = uv_buf_init(c->hh.head + c->hh.len, (unsigned)(PSD_HTTP_HEAD_MAX - c->hh.len));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    (void)buf;
    hconn_t *c = s->data;
    if (c->closing) return;
    if (c->draining) {
        if (n < 0) conn_close(c); /* the client closed its side (or failed): done */
        return;
    }
    if (c->answered) return;
    if (n < 0) { /* EOF or an error before a whole head: nothing to answer */
        conn_close(c);
        return;
    }
    psd_http_req_t req;
    if (!psd_http_head_add(&c->hh, (size_t)n, &req)) return; /* more to come */
    if (req.status) {
        answer_error(c, req.status, req.why, req.head_only);
        return;
    }
    psd_http_reply_t r = {.status = 500, .type = "text/plain; charset=utf-8"};
    c->h->cb(c->h->arg, req.path, &r);
    if (r.body == NULL && r.len) r.len = 0;
    answer(c, &r, req.head_only);
}

static void on_idle(uv_timer_t *t)
{
    conn_close(t->data); /* slow, silent, or not reading its answer */
}

/* Accept the pending connection into the spare handle and close it at once. */
static void reject_one(psd_httpd_t *h);

static void on_reject_closed(uv_handle_t *hd)
{
    psd_httpd_t *h = hd->data;
    h->reject_busy = false;
    /* A connection that came while the spare handle was busy was left unaccepted, and libuv
     * watches the listener again only once it is taken: take it now, or the endpoint would
     * accept nothing any more. */
    if (h->reject_next && !h->closing) {
        h->reject_next = false;
        reject_one(h);
    }
    httpd_unref(h);
}

static void reject_one(psd_httpd_t *h)
{
    uv_tcp_init(h->listen.loop, &h->reject);
    h->reject.data = h;
    h->reject_busy = true;
    h->handles++;
    uv_accept((uv_stream_t *)&h->listen, (uv_stream_t *)&h->reject);
    uv_close((uv_handle_t *)&h->reject, on_reject_closed);
}

/* With every connection slot taken, the oldest connection that may make room (the list's last
 * such: new ones go first): one still waiting for its head, or one answered already and
 * lingering for its client's close; NULL when every one is sending its answer. */
static hconn_t *oldest_evictable(psd_httpd_t *h)
{
    hconn_t *old = NULL;
    for (hconn_t *c = h->conns; c; c = c->next)
        if (!c->answered || c->draining) old = c;
    return old;
}

static void on_connection(uv_stream_t *server, int status);

/* Bind and listen on h->addr with h->listen (initialized). */
static int listen_at(psd_httpd_t *h)
{
    int rc = uv_tcp_bind(&h->listen, (const struct sockaddr *)&h->addr, 0);
    return rc ? rc : uv_listen((uv_stream_t *)&h->listen, 64, on_connection);
}

static void on_paused(uv_handle_t *hd);

static void on_again(uv_timer_t *t)
{
    psd_httpd_t *h = t->data;
    uv_tcp_init(t->loop, &h->listen);
    h->listen.data = h;
    h->lstate = LISTEN_OPEN;
    int rc = listen_at(h);
    if (rc == 0) {
        PS_LOG(PS_LOG_INFO, "httpd", "metrics endpoint: listening on port %u again", h->port);
        return;
    }
    if (!h->again_said) /* once per pause: it tries again every PSD_HTTP_PAUSE_MS */
        PS_LOG(PS_LOG_WARN, "httpd", "metrics endpoint: cannot listen on port %u again yet: %s "
               "(trying every %d ms)", h->port, uv_strerror(rc), PSD_HTTP_PAUSE_MS);
    h->again_said = true;
    h->lstate = LISTEN_CLOSING;
    uv_close((uv_handle_t *)&h->listen, on_paused);
}

/* The listener closed for a pause (or for good, when psd_httpd_close came meanwhile). */
static void on_paused(uv_handle_t *hd)
{
    psd_httpd_t *h = hd->data;
    if (h->closing) {
        httpd_unref(h);
        return;
    }
    h->lstate = LISTEN_PAUSED;
    uv_timer_start(&h->again, on_again, PSD_HTTP_PAUSE_MS, 0);
}

static void on_connection(uv_stream_t *server, int status)
{
    psd_httpd_t *h = server->data;
    if (h->closing || h->lstate != LISTEN_OPEN) return;
    if (status == UV_EMFILE || status == UV_ENFILE) {
        h->again_said = false;
        PS_LOG(PS_LOG_WARN, "httpd", "metrics endpoint: out of file descriptors (%s): not "
               "listening for %d ms (psd's other connections are not affected)",
               uv_strerror(status), PSD_HTTP_PAUSE_MS);
        h->lstate = LISTEN_CLOSING;
        uv_close((uv_handle_t *)&h->listen, on_paused);
        return;
    }
    if (status < 0) return;
    hconn_t *c = NULL;
    if (h->test_nomem)
        h->test_nomem--;
    else
        c = calloc(1, sizeof *c);
    if (c == NULL) {
        /* A connection left unaccepted would stop libuv from watching the listener: take it
         * and close it (if even the spare handle is busy, on_reject_closed takes it). */
        if (h->reject_busy)
            h->reject_next = true;
        else
            reject_one(h);
        return;
    }
    /* Every slot taken: the oldest connection without a whole head, or done with its answer,
     * makes room (a client holding connections open must not lock the others out). */
    hconn_t *old = h->nconns >= PSD_HTTP_CONNS ? oldest_evictable(h) : NULL;
    if (old) conn_close(old);
    c->h = h;
    uv_tcp_init(server->loop, &c->tcp);
    uv_timer_init(server->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->open_handles = 2;
    h->handles++;
    h->nconns++;
    c->next = h->conns;
    if (h->conns) h->conns->prev = c;
    h->conns = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0 || h->nconns > PSD_HTTP_CONNS ||
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_idle, PSD_HTTP_IDLE_MS, 0);
}

static void on_listen_closed(uv_handle_t *hd)
{
    httpd_unref(hd->data);
}

static void on_again_closed(uv_handle_t *hd)
{
    httpd_unref(hd->data);
}

psd_httpd_t *psd_httpd_start(uv_loop_t *loop, const char *host, uint16_t port,
                             psd_http_handler_cb cb, void *arg, char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t sslen;
    if (ps_sockaddr_resolve_any(host, port, AF_UNSPEC, &ss, &sslen)) {
        snprintf(err, errlen, "cannot resolve metrics host '%s'", host);
        return NULL;
    }
    psd_httpd_t *h = calloc(1, sizeof *h);
    if (h == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    h->cb = cb;
    h->arg = arg;
    h->handles = 2; /* the listener and the timer of a pause */
    const char *nomem = getenv("PS_TEST_HTTP_NOMEM"); /* a test hook: see test_nomem */
    if (nomem) h->test_nomem = (unsigned)strtoul(nomem, NULL, 10);
    uv_timer_init(loop, &h->again);
    h->again.data = h;
    uv_tcp_init(loop, &h->listen);
    h->listen.data = h;
    memcpy(&h->addr, &ss, sslen);
    int rc = listen_at(h);
    int gotlen = sizeof h->addr;
    if (rc == 0) rc = uv_tcp_getsockname(&h->listen, (struct sockaddr *)&h->addr, &gotlen);
    if (rc != 0) {
        snprintf(err, errlen, "cannot listen on %s:%u for metrics: %s%s", host, port,
                 uv_strerror(rc),
                 rc == UV_EADDRINUSE ? " (another psd's or program's port: servers[].metrics_port "
                                       "must be free)" : "");
        h->closing = true;
        uv_close((uv_handle_t *)&h->listen, on_listen_closed);
        uv_close((uv_handle_t *)&h->again, on_again_closed);
        return NULL;
    }
    h->port = ntohs(h->addr.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&h->addr)->sin6_port
                                                  : ((struct sockaddr_in *)&h->addr)->sin_port);
    return h;
}

uint16_t psd_httpd_port(const psd_httpd_t *h)
{
    return h->port;
}

void psd_httpd_close(psd_httpd_t *h)
{
    if (h == NULL || h->closing) return;
    h->closing = true;
    while (h->conns) conn_close(h->conns);
    if (h->lstate == LISTEN_OPEN)
        uv_close((uv_handle_t *)&h->listen, on_listen_closed);
    else if (h->lstate == LISTEN_PAUSED) /* closed already (LISTEN_CLOSING: on_paused drops it) */
        httpd_unref(h);
    uv_close((uv_handle_t *)&h->again, on_again_closed);
}
