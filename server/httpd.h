/* httpd.h: a small HTTP/1.1 server on a libuv loop, for psd's /metrics, /healthz and /status.
 *
 * One request per connection (every answer says Connection: close). Only GET and HEAD; the
 * request head may be at most PSD_HTTP_HEAD_MAX bytes; a connection that has not sent its
 * whole head within PSD_HTTP_IDLE_MS is closed, and so is one whose answer is not taken within
 * PSD_HTTP_IDLE_MS more; at most PSD_HTTP_CONNS are open at once (a new one then closes the
 * oldest still without a whole head, or, when every one is being answered, is closed itself).
 * After its answer a connection lingers up to PSD_HTTP_LINGER_MS for the client's close,
 * dropping what it still sends. Whatever a client sends gets an answer or a close, never a
 * crash, and leaves the loop serving everything else. Out of file descriptors, the endpoint
 * stops listening for PSD_HTTP_PAUSE_MS at a time (libuv would otherwise retry the accept in a
 * loop that never returns once its spare descriptor is gone). Loop thread only. */
#ifndef PSD_HTTPD_H
#define PSD_HTTPD_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "httphead.h" /* PSD_HTTP_HEAD_MAX */

#define PSD_HTTP_IDLE_MS 5000
#define PSD_HTTP_CONNS 32
#define PSD_HTTP_LINGER_MS 2000
#define PSD_HTTP_PAUSE_MS 1000 /* out of descriptors: the listener closed this long */

/* What the handler answers: status (200, 404, 503...), content type, and a body the server
 * frees with free() once written (NULL with len 0 for none). */
typedef struct {
    int status;
    const char *type; /* a static string */
    char *body;       /* malloc'd, or NULL */
    size_t len;
} psd_http_reply_t;

/* Called for each well-formed GET or HEAD with the path (no query string; NUL-terminated, at
 * most PSD_HTTP_HEAD_MAX bytes). Fills @p r. For HEAD the body is dropped after. */
typedef void (*psd_http_handler_cb)(void *arg, const char *path, psd_http_reply_t *r);

typedef struct psd_httpd_s psd_httpd_t;

/**
 * @brief Listen on @p host:@p port (port 0: an ephemeral one) on @p loop.
 * @param err  on failure, the reason ("cannot listen on HOST:PORT for metrics: ...").
 * @return the server (owned by the caller: psd_httpd_close), or NULL with @p err said.
 */
psd_httpd_t *psd_httpd_start(uv_loop_t *loop, const char *host, uint16_t port,
                             psd_http_handler_cb cb, void *arg, char *err, size_t errlen);

/** @brief The port it listens on (the ephemeral one when started with 0). */
uint16_t psd_httpd_port(const psd_httpd_t *h);

/**
 * @brief Stop listening and close every connection. The memory goes once the loop has run
 *  the close callbacks (a uv_run after this call). NULL is a no-op.
 */
void psd_httpd_close(psd_httpd_t *h);

#endif
