/* fuzz_httphead.c: what a client sends psd's metrics endpoint, any bytes (libFuzzer;
 * tests/fuzz/README.md). The input's first byte says how the bytes are cut into reads; each
 * read is at most what the head has room for, as the endpoint reads. The head is complete or
 * refused the same way whether it comes whole, byte by byte or in the input's pieces; a
 * refusal is one of the endpoint's statuses with a reason, and a path it takes starts with '/'
 * and holds no control, space or non-ASCII byte, query or fragment. */
#include "fuzz.h"
#include "httphead.h"

#define FUZZ_NAME "fuzz_httphead"

/* Feed @p n bytes at @p d into @p h in reads of @p cut bytes (0: from @p cuts, cycling). */
static bool feed(psd_http_head_t *h, const uint8_t *d, size_t n, size_t cut, const uint8_t *cuts,
                 size_t ncuts, psd_http_req_t *req)
{
    h->len = 0;
    for (size_t at = 0, i = 0; at < n; i++) {
        size_t k = cut ? cut : 1 + (size_t)(cuts[i % ncuts] % 61);
        size_t room = PSD_HTTP_HEAD_MAX - h->len;
        if (k > n - at) k = n - at;
        if (k > room) k = room;
        memcpy(h->head + h->len, d + at, k);
        at += k;
        bool done = psd_http_head_add(h, k, req);
        FUZZ_CHECK(h->len <= PSD_HTTP_HEAD_MAX && h->head[h->len] == '\0',
                   "a head of %zu bytes, not terminated there", h->len);
        if (done) {
            FUZZ_CHECK(req->status || strcmp(req->path, "/") == 0 ||
                           (req->path >= h->head && req->path < h->head + h->len),
                       "a path outside the head");
            return true;
        }
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 3 * PSD_HTTP_HEAD_MAX) return 0;
    psd_http_req_t r[3];
    /* Each head in memory of its own, so that a read past one is seen (fuzz.h). */
    psd_http_head_t *hh[3] = {fuzz_alloc(sizeof **hh), fuzz_alloc(sizeof **hh),
                              fuzz_alloc(sizeof **hh)};
    bool done[3] = {feed(hh[0], data + 1, size - 1, PSD_HTTP_HEAD_MAX, NULL, 0, &r[0]),
                    feed(hh[1], data + 1, size - 1, 1, NULL, 0, &r[1]),
                    feed(hh[2], data + 1, size - 1, 0, data, size < 8 ? size : 8, &r[2])};
    for (int i = 1; i < 3; i++) {
        FUZZ_CHECK(done[i] == done[0], "cut %d: %s, whole: %s", i, done[i] ? "ended" : "not ended",
                   done[0] ? "ended" : "not ended");
        if (!done[0]) continue;
        FUZZ_CHECK(r[i].status == r[0].status && r[i].head_only == r[0].head_only,
                   "cut %d: status %d, whole: %d", i, r[i].status, r[0].status);
        if (r[0].status)
            FUZZ_CHECK(strcmp(r[i].why, r[0].why) == 0, "cut %d: '%s', whole: '%s'", i, r[i].why,
                       r[0].why);
        else
            FUZZ_CHECK(strcmp(r[i].path, r[0].path) == 0, "cut %d: path '%s', whole: '%s'", i,
                       r[i].path, r[0].path);
    }
    if (done[0] && r[0].status) {
        int s = r[0].status;
        FUZZ_CHECK((s == 400 || s == 405 || s == 431 || s == 501) && r[0].why && r[0].why[0],
                   "status %d", s);
    } else if (done[0]) {
        const char *p = r[0].path;
        FUZZ_CHECK(p[0] == '/', "path '%s'", p);
        for (; *p; p++)
            FUZZ_CHECK((unsigned char)*p > 0x20 && (unsigned char)*p < 0x7f && *p != '?' &&
                           *p != '#',
                       "path byte 0x%02x", (unsigned char)*p);
    }
    for (int i = 0; i < 3; i++)
        fuzz_free(hh[i]);
    return 0;
}
