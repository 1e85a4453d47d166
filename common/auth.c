/* auth.c: HMAC-SHA256 proofs of the cluster secret (see auth.h). */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ps/ps_error.h"
#include "regfile.h"

int ps_auth_load(ps_auth_t *a, const ps_manifest_t *m, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    snprintf(a->cluster, sizeof a->cluster, "%s", m->cluster);
    if (m->secret_file[0] == '\0') return 0;
    const char *f = m->secret_file;
    /* May be a link (Kubernetes mounts secrets so); a FIFO must not block the open. */
    struct stat st;
    int fd = ps_open_regular(f, 0, &st);
    if (fd == -EINVAL) {
        snprintf(err, errlen, "secret_file %s: not a regular file (%s)", f, ps_file_kind(&st));
        return PS_ECONFIG;
    }
    if (fd < 0) {
        snprintf(err, errlen, "secret_file %s: cannot open it: %s", f, strerror(-fd));
        return PS_ECONFIG;
    }
    int rc = PS_ECONFIG;
    if (st.st_uid != geteuid() && st.st_uid != 0) {
        /* Its owner chose the key: one who is neither this user nor root could make psd (root,
         * say) take a key of theirs. */
        snprintf(err, errlen, "secret_file %s: owned by uid %u, neither this user (uid %u) nor "
                 "root: chown it", f, (unsigned)st.st_uid, (unsigned)geteuid());
    } else if (st.st_mode & 077) {
        snprintf(err, errlen, "secret_file %s: readable or writable by group or others (mode "
                 "%03o): chmod 600 it", f, (unsigned)(st.st_mode & 0777));
    } else if (st.st_size < PS_AUTH_KEY_MIN || st.st_size > PS_AUTH_KEY_MAX) {
        snprintf(err, errlen, "secret_file %s: %lld bytes; it must hold %d to %d (e.g. head -c 32 "
                 "/dev/urandom > FILE)", f, (long long)st.st_size, PS_AUTH_KEY_MIN,
                 PS_AUTH_KEY_MAX);
    } else {
        size_t got = 0;
        while (got < (size_t)st.st_size) {
            ssize_t n = read(fd, a->key + got, (size_t)st.st_size - got);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            got += (size_t)n;
        }
        if (got != (size_t)st.st_size) {
            snprintf(err, errlen, "secret_file %s: short read", f);
        } else {
            a->key_len = got;
            a->on = true;
            rc = 0;
        }
    }
    close(fd);
    if (rc) ps_auth_wipe(a);
    return rc;
}

/* HMAC-SHA256(key, "psd-auth" 0 cluster 0 "host:port" 0 version time nonce) into @p mac. */
static void sign(const ps_auth_t *a, const char *host, uint16_t port, const uint8_t *head,
                 uint8_t mac[PS_AUTH_MAC])
{
    char target[PS_HOST_MAX + 16];
    uint8_t msg[16 + sizeof a->cluster + sizeof target + 8 + PS_AUTH_NONCE];
    size_t n = 0, cl = strlen(a->cluster);
    int tl = snprintf(target, sizeof target, "%s:%u", host, (unsigned)port);
    if (tl < 0 || (size_t)tl >= sizeof target) tl = (int)sizeof target - 1;
    memcpy(msg, "psd-auth", 9); /* with its NUL */
    n = 9;
    memcpy(msg + n, a->cluster, cl + 1);
    n += cl + 1;
    memcpy(msg + n, target, (size_t)tl);
    n += (size_t)tl;
    msg[n++] = 0;
    memcpy(msg + n, head, 1 + 8 + PS_AUTH_NONCE);
    n += 1 + 8 + PS_AUTH_NONCE;
    unsigned len = PS_AUTH_MAC;
    HMAC(EVP_sha256(), a->key, (int)a->key_len, msg, n, mac, &len);
}

int ps_auth_prove(const ps_auth_t *a, const char *host, uint16_t port,
                  uint8_t out[PS_AUTH_PROOF_LEN])
{
    return ps_auth_prove_at(a, host, port, (int64_t)time(NULL), out);
}

int ps_auth_prove_at(const ps_auth_t *a, const char *host, uint16_t port, int64_t when,
                     uint8_t out[PS_AUTH_PROOF_LEN])
{
    out[0] = PS_AUTH_VERSION;
    uint64_t t = (uint64_t)when;
    for (int i = 0; i < 8; i++) out[1 + i] = (uint8_t)(t >> (56 - 8 * i));
    if (RAND_bytes(out + 9, PS_AUTH_NONCE) != 1) return PS_EIO;
    sign(a, host, port, out, out + 9 + PS_AUTH_NONCE);
    return 0;
}

int ps_auth_check(const ps_auth_t *a, ps_auth_seen_t *seen, const char *host, uint16_t port,
                  const uint8_t *proof, size_t len, int64_t now, char *why, size_t whylen)
{
    if (len != PS_AUTH_PROOF_LEN || proof[0] != PS_AUTH_VERSION) {
        snprintf(why, whylen, "a proof of %zu bytes, version %u (this build: %d bytes, version %d)",
                 len, len ? proof[0] : 0, PS_AUTH_PROOF_LEN, PS_AUTH_VERSION);
        return PS_EAUTH;
    }
    uint8_t mac[PS_AUTH_MAC];
    sign(a, host, port, proof, mac);
    if (CRYPTO_memcmp(mac, proof + 9 + PS_AUTH_NONCE, PS_AUTH_MAC) != 0) {
        snprintf(why, whylen, "the proof is not signed with this cluster's secret for shard "
                 "%s:%u (another secret_file or cluster name, or a manifest naming this shard "
                 "otherwise)", host, (unsigned)port);
        return PS_EAUTH;
    }
    uint64_t ut = 0;
    for (int i = 0; i < 8; i++) ut = ut << 8 | proof[1 + i];
    int64_t t = (int64_t)ut;
    if (ut > INT64_MAX) {
        snprintf(why, whylen, "the peer's clock reads %llu, past any time this shard can tell: "
                 "synchronize the hosts' clocks", (unsigned long long)ut);
        return PS_EAUTH;
    }
    if (t < now - PS_AUTH_SKEW_S || t > now + PS_AUTH_SKEW_S) {
        snprintf(why, whylen, "the peer's clock is %lld s off this shard's (at most %d): "
                 "synchronize the hosts' clocks", (long long)(t - now), PS_AUTH_SKEW_S);
        return PS_EAUTH;
    }
    if (t <= seen->floor) {
        snprintf(why, whylen, "the proof is older than the replays this shard can still tell "
                 "(many connections within %d s): connect again", PS_AUTH_SKEW_S);
        return PS_EAUTH;
    }
    const uint8_t *nonce = proof + 9;
    for (uint32_t i = 0; i < seen->n; i++)
        if (memcmp(seen->e[i].nonce, nonce, PS_AUTH_NONCE) == 0) {
            snprintf(why, whylen, "the proof was used before (a replayed connection)");
            return PS_EAUTH;
        }
    uint32_t slot = seen->n;
    if (seen->n == PS_AUTH_SEEN) { /* full: forget the oldest proof; older ones are refused */
        slot = 0;
        for (uint32_t i = 1; i < PS_AUTH_SEEN; i++)
            if (seen->e[i].t < seen->e[slot].t) slot = i;
        if (seen->e[slot].t > seen->floor) seen->floor = seen->e[slot].t;
    } else {
        seen->n++;
    }
    seen->e[slot].t = t;
    memcpy(seen->e[slot].nonce, nonce, PS_AUTH_NONCE);
    return 0;
}

void ps_auth_session(const ps_auth_t *a, const uint8_t proof[PS_AUTH_PROOF_LEN],
                     uint8_t out[PS_AUTH_SESSION])
{
    uint8_t msg[12 + PS_AUTH_PROOF_LEN], mac[PS_AUTH_MAC];
    memcpy(msg, "psd-session", 12); /* with its NUL */
    memcpy(msg + 12, proof, PS_AUTH_PROOF_LEN);
    unsigned len = PS_AUTH_MAC;
    HMAC(EVP_sha256(), a->key, (int)a->key_len, msg, sizeof msg, mac, &len);
    memcpy(out, mac, PS_AUTH_SESSION);
    OPENSSL_cleanse(mac, sizeof mac);
}

bool ps_auth_session_ok(const uint8_t want[PS_AUTH_SESSION], const uint8_t *got, size_t len)
{
    return len == PS_AUTH_SESSION && CRYPTO_memcmp(want, got, PS_AUTH_SESSION) == 0;
}

void ps_auth_wipe(ps_auth_t *a)
{
    OPENSSL_cleanse(a->key, sizeof a->key);
    a->key_len = 0;
    a->on = false;
}
