/* fuzz_codec.c: a compressed push's payload, any bytes (libFuzzer; tests/fuzz/README.md).
 * The input's first four bytes choose the codec, the chunk's length and whether the payload
 * starts with the header psd expects for them (most inputs would fail that check at once);
 * the rest is the payload. psk_codec_check takes a payload exactly when the decoder does, and
 * a refused payload leaves the gradient sum as it was. */

#include "codec.h"
#include "fuzz.h"

#define FUZZ_NAME "fuzz_codec"

static const char *const codecs[] = {"none",      "fp16",     "bf16",        "int8",  "sign",
                                     "topk:0.01", "topk:0.5", "randomk:0.1", "topk:1"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4) return 0;
    psk_codec_t c;
    const char *name = codecs[data[0] % (sizeof codecs / sizeof *codecs)];
    if (psk_codec_parse(&c, name)) abort();
    c.fp16_values = (data[0] >> 4) & 1;
    if (data[3] & 0x80) c.block = 1 + (data[3] & 0x3f); /* int8, sign: a small block */
    size_t n = 1 + ((data[1] | (size_t)data[2] << 8) % 4096);
    int with_header = (data[3] & 0x40) == 0;
    data += 4;
    size -= 4;
    size_t len = size + (with_header ? PSK_CODEC_HEADER_BYTES : 0);
    uint8_t *p = fuzz_alloc(len);
    if (with_header) psk_codec_header(p, &c, n);
    memcpy(p + (with_header ? PSK_CODEC_HEADER_BYTES : 0), data, size);
    float *out = fuzz_alloc(n * sizeof *out), *ref = fuzz_alloc(n * sizeof *ref);
    for (size_t i = 0; i < n; i++)
        out[i] = ref[i] = 0.5f + (float)i;
    int chk = psk_codec_check(p, len, n, &c);
    int rc = psk_codec_decode_add_cpu(out, n, p, len, &c, 0.25f);
    FUZZ_CHECK((chk == 0) == (rc == 0), "%s, n %zu, %zu bytes: check %d, decode %d", name, n, len,
               chk, rc);
    if (rc)
        FUZZ_CHECK(memcmp(out, ref, n * sizeof *out) == 0, "%s: a refused payload written", name);
    else
        FUZZ_CHECK(len == psk_codec_max_bytes(&c, n), "%s: %zu bytes taken, %zu expected", name,
                   len, psk_codec_max_bytes(&c, n));
    fuzz_free(p);
    fuzz_free(out);
    fuzz_free(ref);
    return 0;
}
