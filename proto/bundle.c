/* bundle.c: see bundle.h. */
#include "bundle.h"

#include <stdio.h>
#include <string.h>

#include "ps/ps_error.h"

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

int ps_bundle_add(uint8_t *buf, size_t cap, size_t *used, const ps_msg_t *m, const void *data,
                  size_t dlen)
{
    uint8_t hdr[PS_WIRE_HDR_MAX];
    size_t hlen;
    if (ps_msg_encode(m, hdr, sizeof hdr, &hlen)) return PS_EINVAL;
    size_t at = *used, need = ps_bundle_entry_bytes(hlen, dlen);
    if (dlen > UINT32_MAX || at > cap || cap - at < need) return PS_EINVAL;
    uint32_t h32 = (uint32_t)hlen, d32 = (uint32_t)dlen;
    uint8_t *p = buf + at;
    memcpy(p, &h32, 4);
    memcpy(p + 4, &d32, 4);
    memcpy(p + 8, hdr, hlen);
    memset(p + 8 + hlen, 0, pad8(hlen) - hlen);
    p += 8 + pad8(hlen);
    if (dlen) memcpy(p, data, dlen);
    memset(p + dlen, 0, pad8(dlen) - dlen);
    *used = at + need;
    return 0;
}

/* The framing of the entry at it->off: 0 and its lengths, or PS_EPROTO. */
static int frame(const ps_bundle_iter_t *it, uint32_t *h32, uint32_t *d32, char *err,
                 size_t errlen)
{
    size_t rest = it->len - it->off;
    if (rest < 8) {
        snprintf(err, errlen, "bundle: truncated at byte %zu (%u entries missing)", it->off,
                 it->left);
        return PS_EPROTO;
    }
    memcpy(h32, it->buf + it->off, 4);
    memcpy(d32, it->buf + it->off + 4, 4);
    if (*h32 == 0 || *h32 > PS_WIRE_HDR_MAX || ps_bundle_entry_bytes(*h32, *d32) > rest) {
        snprintf(err, errlen, "bundle: entry at byte %zu has header %u and data %u bytes, "
                 "%zu bytes left", it->off, *h32, *d32, rest);
        return PS_EPROTO;
    }
    return 0;
}

int ps_bundle_check(const void *buf, size_t len, uint32_t count, char *err, size_t errlen)
{
    ps_bundle_iter_t it;
    ps_bundle_iter_init(&it, buf, len, count);
    for (; it.left > 0; it.left--) {
        uint32_t h32, d32;
        if (frame(&it, &h32, &d32, err, errlen)) return PS_EPROTO;
        it.off += ps_bundle_entry_bytes(h32, d32);
    }
    if (it.off != len) {
        snprintf(err, errlen, "bundle: %zu bytes after the last entry", len - it.off);
        return PS_EPROTO;
    }
    return 0;
}

void ps_bundle_iter_init(ps_bundle_iter_t *it, const void *buf, size_t len, uint32_t count)
{
    *it = (ps_bundle_iter_t){.buf = buf, .len = len, .off = 0, .left = count};
}

int ps_bundle_next(ps_bundle_iter_t *it, ps_msg_t *m, const void **data, size_t *dlen, char *err,
                   size_t errlen)
{
    if (it->left == 0) {
        if (it->off == it->len) return 0;
        snprintf(err, errlen, "bundle: %zu bytes after the last entry", it->len - it->off);
        it->off = it->len; /* said once: the next call ends the bundle */
        return PS_EPROTO;
    }
    uint32_t h32, d32;
    if (frame(it, &h32, &d32, err, errlen)) {
        it->off = it->len; /* the framing is broken: nothing after this can be read */
        it->left = 0;
        return PS_EPROTO;
    }
    const uint8_t *h = it->buf + it->off + 8;
    size_t at = it->off;
    it->off += ps_bundle_entry_bytes(h32, d32); /* past it, whatever it holds */
    it->left--;
    char why[200];
    if (ps_msg_decode(m, h, h32, why, sizeof why)) {
        snprintf(err, errlen, "bundle: entry at byte %zu: %s", at, why);
        return PS_EPROTO;
    }
    if (m->type == PS_MSG_BUNDLE) {
        snprintf(err, errlen, "bundle: entry at byte %zu is a bundle itself", at);
        return PS_EPROTO;
    }
    *data = h + pad8(h32);
    *dlen = d32;
    return 1;
}
