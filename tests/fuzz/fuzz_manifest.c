/* fuzz_manifest.c: a cluster manifest, any bytes (libFuzzer; tests/fuzz/README.md). It parses,
 * or it is refused with one line of text that names the file and a line in it. */

#include "fuzz.h"
#include "manifest.h"

#define FUZZ_NAME "fuzz_manifest"

static ps_manifest_t m; /* large: off the stack */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536) return 0; /* a long manifest takes the parser's time, not new paths */
    char err[512];
    memset(err, 'x', sizeof err);
    if (ps_manifest_parse(&m, "fuzz.yaml", (const char *)data, size, err, sizeof err) == 0) {
        FUZZ_CHECK(m.nservers >= 1 && m.nservers <= PS_MAX_SERVERS, "%d servers taken", m.nservers);
        return 0;
    }
    FUZZ_CHECK(memchr(err, '\0', sizeof err), "an error not terminated");
    FUZZ_CHECK(strncmp(err, "fuzz.yaml:", 10) == 0, "an error not naming the file: '%s'", err);
    FUZZ_CHECK(strchr(err, '\n') == NULL, "an error of more than one line: '%s'", err);
    return 0;
}
