/* fuzz_bundle.c: a received bundle, any bytes and any entry count (libFuzzer;
 * tests/fuzz/README.md). Reading it ends within count + 1 calls, every entry's data lies in
 * the bundle, and a bundle ps_bundle_check takes reads as exactly its count entries (one whose
 * header does not decode spoils only itself). */

#include "bundle.h"
#include "fuzz.h"

#define FUZZ_NAME "fuzz_bundle"

static ps_msg_t m;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    uint32_t count = data[0] | (uint32_t)data[1] << 8; /* the bundle header's count */
    data += 2;
    size -= 2;
    /* The bundle as the receiver holds it: exactly its bytes. */
    uint8_t *buf = fuzz_alloc(size);
    memcpy(buf, data, size);
    char err[256];
    int checked = ps_bundle_check(buf, size, count, err, sizeof err);
    ps_bundle_iter_t it;
    ps_bundle_iter_init(&it, buf, size, count);
    const void *d;
    size_t dl;
    uint32_t calls = 0;
    int rc;
    while ((rc = ps_bundle_next(&it, &m, &d, &dl, err, sizeof err)) != 0) {
        FUZZ_CHECK(++calls <= count + 1, "a bundle of %u entries not ended after %u calls", count,
                   calls);
        if (rc > 0) {
            FUZZ_CHECK((const uint8_t *)d >= buf && (const uint8_t *)d + dl <= buf + size,
                       "entry data outside the bundle");
            FUZZ_CHECK(m.type != PS_MSG_BUNDLE, "a nested bundle read as an entry");
        } else {
            FUZZ_CHECK(err[0], "an entry refused without a reason");
        }
    }
    if (checked == 0)
        FUZZ_CHECK(calls == count, "the check took %u entries, %u read", count, calls);
    fuzz_free(buf);
    return 0;
}
