/* fuzz_tcpguard.c: what a peer sends psd on a TCP transport connection, any bytes (libFuzzer;
 * tests/fuzz/README.md). The input's first byte says whether UCX's magic number comes first
 * (a connection psd must follow) and how the stream is cut into reads; the rest is the stream.
 * The checks decide the same however recv() cuts the stream: fed in the input's pieces, a
 * stream is refused exactly when it is fed byte by byte, in the piece holding the byte that
 * was refused then, and a refused socket stays refused. A receive is in flight at a fixed
 * address (FUZZ_TCPGUARD_SLOT), so that put requests into it can pass. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "tcpguard.h"

#define FUZZ_NAME "fuzz_tcpguard"

static int fd = -1; /* the accepted end of a loopback connection (the checks ask its peer) */

static void pair_open(void)
{
    ps_tcpguard_init(0); /* receives in flight are followed from now on */
    void *slot =
        mmap((void *)(uintptr_t)FUZZ_TCPGUARD_SLOT, FUZZ_TCPGUARD_SLOT_BYTES,
             PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (slot == MAP_FAILED) /* the address taken (a sanitizer's shadow: TSan's): anywhere, and
                               the inputs' puts are refused instead (still a property test) */
        slot = mmap(NULL, FUZZ_TCPGUARD_SLOT_BYTES, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (slot == MAP_FAILED || ps_tcpguard_expect(slot, FUZZ_TCPGUARD_SLOT_BYTES)) abort();
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int l = socket(AF_INET, SOCK_STREAM, 0), c = socket(AF_INET, SOCK_STREAM, 0);
    if (l < 0 || c < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1) ||
        getsockname(l, (struct sockaddr *)&a, &len) || connect(c, (struct sockaddr *)&a, len))
        abort();
    fd = accept(l, NULL, NULL);
    if (fd < 0) abort();
}

/* @return the offset of the last byte of the piece refused, or -1. */
static long feed(const uint8_t *s, size_t n, const uint8_t *cuts, size_t ncuts)
{
    ps_tcpguard_reset(fd);
    size_t at = 0;
    for (size_t i = 0; at < n; i++) {
        size_t k = ncuts ? 1 + cuts[i % ncuts] % 97 : 1;
        if (k > n - at) k = n - at;
        if (ps_tcpguard_received(fd, s + at, k) != 0) {
            FUZZ_CHECK(ps_tcpguard_refused(fd) && ps_tcpguard_received(fd, "x", 1) == -1,
                       "a refused socket read again");
            return (long)(at + k - 1);
        }
        at += k;
    }
    return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    if (fd < 0) pair_open();
    size_t body = size - 1 < (1 << 17) ? size - 1 : (1 << 17), n = 0;
    uint8_t *s = fuzz_alloc(8 + body);
    if (data[0] & 1) {
        uint64_t magic = 0xCAFEBABE12345678ull;
        for (int i = 0; i < 8; i++)
            s[n++] = (uint8_t)(magic >> (8 * i));
    }
    memcpy(s + n, data + 1, body);
    n += body;
    long one = feed(s, n, NULL, 0);
    long cut = feed(s, n, data, size < 16 ? size : 16); /* pieces of 1..97 bytes */
    ps_tcpguard_reset(fd);
    long whole = ps_tcpguard_received(fd, s, n) == 0 ? -1 : 0;
    FUZZ_CHECK((one < 0) == (cut < 0) && (one < 0) == (whole < 0),
               "refused byte by byte at %ld, in pieces at %ld, whole %s", one, cut,
               whole < 0 ? "passed" : "refused");
    if (one >= 0)
        FUZZ_CHECK(cut >= one && cut - one < 97, "byte %ld refused, the piece ending at %ld", one,
                   cut);
    fuzz_free(s);
    return 0;
}
