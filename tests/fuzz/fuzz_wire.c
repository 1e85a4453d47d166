/* fuzz_wire.c: a peer's message header, any bytes (libFuzzer; tests/fuzz/README.md).
 * wire.c's own unpacking and protobuf-c's generic unpacking (the reference) must agree: both
 * refuse, or both give the same ps_msg_t. A header that decodes packs again (wire.c's packer
 * and protobuf-c's give the same bytes) and decodes to the same ps_msg_t. */

#include "fuzz.h"
#include "wire.h"

#define FUZZ_NAME "fuzz_wire"

static ps_msg_t a, b, c; /* large: off the stack */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char ea[256], eb[256];
    ps_wire_use_protobuf(false);
    ea[0] = '\0';
    int ra = ps_msg_decode(&a, data, size, ea, sizeof ea);
    ps_wire_use_protobuf(true);
    eb[0] = '\0';
    int rb = ps_msg_decode(&b, data, size, eb, sizeof eb);
    ps_wire_use_protobuf(false);
    FUZZ_CHECK((ra == 0) == (rb == 0), "wire.c %s (%s), protobuf-c %s (%s)",
               ra ? "refuses" : "takes", ea, rb ? "refuses" : "takes", eb);
    if (ra) {
        FUZZ_CHECK(ea[0] && memchr(ea, '\0', sizeof ea), "refused without a reason");
        return 0;
    }
    FUZZ_CHECK(memcmp(&a, &b, sizeof a) == 0, "wire.c and protobuf-c decode to different messages");
    FUZZ_CHECK(ps_msg_type_valid(a.type), "type %d taken", (int)a.type);
    FUZZ_CHECK(memchr(a.host, '\0', sizeof a.host) && memchr(a.error, '\0', sizeof a.error) &&
                   memchr(a.store, '\0', sizeof a.store) &&
                   memchr(a.cluster, '\0', sizeof a.cluster),
               "a string not terminated");
    FUZZ_CHECK(a.nreplay <= PS_REPLAY_MAX && a.auth_len <= sizeof a.auth &&
                   (a.session_len == 0 || a.session_len == PS_SESSION_MAX),
               "a count out of range");
    if (a.has_decl)
        FUZZ_CHECK(a.decl.ndim >= 1 && a.decl.ndim <= PS_MAX_DIMS &&
                       memchr(a.decl.name, '\0', sizeof a.decl.name),
                   "a declaration out of range");

    /* Packed again by both packers: the same bytes, decoding to the same message. */
    static uint8_t pa[PS_WIRE_HDR_MAX * 2], pb[PS_WIRE_HDR_MAX * 2];
    size_t la = 0, lb = 0;
    FUZZ_CHECK(ps_msg_encode(&a, pa, sizeof pa, &la) == 0, "a decoded message does not pack");
    ps_wire_use_protobuf(true);
    FUZZ_CHECK(ps_msg_encode(&a, pb, sizeof pb, &lb) == 0, "protobuf-c does not pack it");
    ps_wire_use_protobuf(false);
    FUZZ_CHECK(la == lb && memcmp(pa, pb, la) == 0, "the packers differ (%zu, %zu bytes)", la, lb);
    if (la > PS_WIRE_HDR_MAX) return 0; /* fields repeated in the input (the last one counts) */
    /* proto3 leaves a float field of -0.0 out (it is zero), so it comes back as +0.0. */
    if (a.codec_fraction == 0) a.codec_fraction = 0;
    if (a.has_decl && a.decl.init_arg == 0) a.decl.init_arg = 0;
    FUZZ_CHECK(ps_msg_decode(&c, pa, la, ea, sizeof ea) == 0, "packed again, refused: %s", ea);
    FUZZ_CHECK(memcmp(&a, &c, sizeof a) == 0, "packed again, decodes to another message");
    return 0;
}
