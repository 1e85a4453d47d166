/* fuzz_json.c: a checkpoint's meta.json and a status reply, any text (libFuzzer;
 * tests/fuzz/README.md). The readers stay inside the text and their buffers, always
 * terminate what they write, and two shards' files agree or are refused with a reason. */
#include <stdint.h>

#include "ckpt_meta.h"
#include "fuzz.h"
#include "jsonfield.h"
#include "manifest.h"

#define FUZZ_NAME "fuzz_json"

static const char *const keys[] = {
    "shard",   "nshards", "cluster",         "id", "step", "consistency",
    "records", "name",    "untrained_first", ""};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Two texts: before and after the first NUL (the second is the other shard's file). */
    char *a = fuzz_text(data, size);
    const char *b = a + strlen(a) + (strlen(a) < size ? 1 : 0);
    char buf[8], big[300], err[256];
    int raw_ok = 1; /* no control byte as it is in the text (shown as it is, by design) */
    for (const char *q = a; *q; q++)
        if ((unsigned char)*q < 0x20 || *q == 0x7f) raw_ok = 0;
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        memset(buf, 'x', sizeof buf);
        if (ps_json_field(a, keys[k], buf, sizeof buf))
            FUZZ_CHECK(memchr(buf, '\0', sizeof buf), "ps_json_field: not terminated");
        memset(buf, 'x', sizeof buf);
        if (ps_json_str_field(a, keys[k], buf, sizeof buf))
            FUZZ_CHECK(memchr(buf, '\0', sizeof buf), "ps_json_str_field: not terminated");
        if (ps_json_str_field(a, keys[k], big, sizeof big) && raw_ok)
            for (const char *q = big; *q; q++)
                FUZZ_CHECK((unsigned char)*q >= 0x20 && *q != 0x7f, "an escaped control byte shown "
                                                                    "raw");
        memset(buf, 'x', sizeof buf);
        if (ps_json_str_exact(a, keys[k], buf, sizeof buf))
            FUZZ_CHECK(memchr(buf, '\0', sizeof buf), "ps_json_str_exact: not terminated");
        memset(buf, 'x', sizeof buf);
        if (psd_ckpt_meta_field(a, keys[k], buf, sizeof buf) == 0)
            FUZZ_CHECK(memchr(buf, '\0', sizeof buf), "psd_ckpt_meta_field: not terminated");
        (void)psd_ckpt_meta_u64(a, keys[k]);
    }
    uint32_t ns = psd_ckpt_meta_nshards(a);
    FUZZ_CHECK(ns <= PS_MAX_SERVERS, "%u shards", ns);
    for (uint32_t k = 0; k < 3; k++) {
        err[0] = '\0';
        if (psd_ckpt_meta_agree(a, b, k, err, sizeof err))
            FUZZ_CHECK(err[0] && memchr(err, '\0', sizeof err), "shard %u refused without a reason",
                       k);
    }
    fuzz_free(a);
    return 0;
}
