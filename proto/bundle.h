/* bundle.h: many small messages fused into one Active Message.
 *
 * A bundle is one PS_AM_DATA message whose header is a ps_msg_t of type PS_MSG_BUNDLE
 * (count = entries, length = bytes of data) and whose data is a sequence of entries:
 *
 *     u32 hlen | u32 dlen | header[hlen] | pad to 8 | data[dlen] | pad to 8
 *
 * each header an encoded ps_msg_t (wire.h) and each data its payload (a push's gradient, a
 * pull reply's parameters; empty for a pull request or an ack). Bundles are sent eagerly, so
 * the receiver holds all of it in its AM callback and handles each entry as if it had come
 * alone. Writers and the parser here only touch the caller's buffer: no allocation. */
#ifndef PS_BUNDLE_H
#define PS_BUNDLE_H

#include <stddef.h>
#include <stdint.h>

#include "wire.h"

#define PS_BUNDLE_MAX_ENTRIES 4096    /* a bundle with more is malformed */
#define PS_BUNDLE_DEFAULT_BYTES 65536 /* manifest fusion_bytes when not set */
#define PS_BUNDLE_PART_MAX 16384      /* larger payloads go alone (rendezvous, no copy) */

/** @brief Bytes an entry with a @p hlen-byte header and @p dlen bytes of data takes. */
static inline size_t ps_bundle_entry_bytes(size_t hlen, size_t dlen)
{
    return 8 + ((hlen + 7) & ~(size_t)7) + ((dlen + 7) & ~(size_t)7);
}

/**
 * @brief Append @p m with @p dlen bytes at @p data to the bundle in @p buf.
 * @param[in,out] used bytes of @p buf in use (the entry goes there).
 * @return 0; PS_EINVAL when it does not fit in @p cap (nothing written) or @p m does not encode.
 * @note @p data is copied; the caller keeps it.
 */
int ps_bundle_add(uint8_t *buf, size_t cap, size_t *used, const ps_msg_t *m, const void *data,
                  size_t dlen);

typedef struct {
    const uint8_t *buf;
    size_t len, off;
    uint32_t left; /* entries the bundle header announced and not read yet */
} ps_bundle_iter_t;

/**
 * @brief Check the framing of a received bundle (entry lengths, @p count entries exactly
 * filling @p len bytes) without decoding the headers, so that a malformed bundle can be
 * refused whole before any entry is acted on.
 * @return 0, or PS_EPROTO with @p err saying what is wrong.
 */
int ps_bundle_check(const void *buf, size_t len, uint32_t count, char *err, size_t errlen);

/** @brief Start reading a received bundle of @p count entries in @p len bytes at @p buf. */
void ps_bundle_iter_init(ps_bundle_iter_t *it, const void *buf, size_t len, uint32_t count);

/**
 * @brief The next entry: its decoded header in @p m, its data (pointing into the bundle, valid
 * while the bundle is) in @p data / @p dlen.
 * @return 1 for an entry, 0 at the end (every entry read and no byte left over), or PS_EPROTO
 *         with @p err saying what is malformed. A header that does not decode, or a nested
 *         bundle, spoils only its entry: the next call goes on with the one after it. Broken
 *         framing (truncated, lengths out of range, bytes after the last entry) ends the
 *         bundle: the next call returns 0.
 */
int ps_bundle_next(ps_bundle_iter_t *it, ps_msg_t *m, const void **data, size_t *dlen, char *err,
                   size_t errlen);

#endif
