/* auth.h: peer authentication with the cluster secret (manifest `secret_file`).
 *
 * Every connection a client opens to a shard starts with one proof (ps_auth_prove): a fresh
 * random nonce and the client's clock, signed with HMAC-SHA256 under the cluster's secret and
 * bound to the cluster name and to the shard it is for (its manifest address "host:port"), so
 * that a proof seen on its way to one shard opens no connection to another. The shard checks it (ps_auth_check) before it serves anything else
 * on that connection: the signature (so the secret never travels), the clock (within
 * PS_AUTH_SKEW_S of the shard's) and the nonce (not seen within that window: a recorded proof
 * cannot be replayed). Both ends then derive the connection's session token from the proof
 * (ps_auth_session), which every later header on it carries: psd tells a message's connection by
 * UCX's reply endpoint, whose id the sender writes itself, so without the token a peer that
 * guessed an authenticated connection's id could speak as it. The secret is read from a file only its owner may read; it never
 * appears in a log, an argument or an error. */
#ifndef PS_AUTH_H
#define PS_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "manifest.h"

#define PS_AUTH_VERSION 3 /* 2: signs the shard (host:port) too; 3: every later header carries
                             the session token (ps_auth_session) */
#define PS_AUTH_NONCE 16
#define PS_AUTH_MAC 32
/* version (1) + Unix time in seconds, big-endian (8) + nonce + HMAC-SHA256 */
#define PS_AUTH_PROOF_LEN (1 + 8 + PS_AUTH_NONCE + PS_AUTH_MAC)
#define PS_AUTH_SESSION 16 /* bytes of a connection's session token */
#define PS_AUTH_SKEW_S 300      /* how far a peer's clock may be from this one */
#define PS_AUTH_KEY_MIN 16      /* bytes of secret at least */
#define PS_AUTH_KEY_MAX 4096
#define PS_AUTH_SEEN 4096       /* nonces a shard remembers (ps_auth_seen_t) */

typedef struct {
    bool on;                     /* the manifest names a secret_file */
    uint8_t key[PS_AUTH_KEY_MAX];
    size_t key_len;
    char cluster[128];
} ps_auth_t;

/* The nonces a shard has accepted, for replay refusal (loop thread). */
typedef struct {
    struct {
        int64_t t;
        uint8_t nonce[PS_AUTH_NONCE];
    } e[PS_AUTH_SEEN];
    uint32_t n;
    int64_t floor; /* the time of the newest proof forgotten (always the oldest remembered at
                      that moment): proofs no newer cannot be told from replays */
} ps_auth_seen_t;

/**
 * @brief Read @p m's secret_file into @p a (a->on false when the manifest has none).
 * @return 0, or PS_ECONFIG with @p err naming the file and what is wrong (unreadable, not a
 *  regular file, readable by group or others, shorter than PS_AUTH_KEY_MIN or longer than
 *  PS_AUTH_KEY_MAX bytes); the secret's bytes never appear in it.
 */
int ps_auth_load(ps_auth_t *a, const ps_manifest_t *m, char *err, size_t errlen);

/** @brief Write a fresh proof for now, for the shard at @p host : @p port (as the manifest
 *  names it), into @p out (PS_AUTH_PROOF_LEN bytes). @p a must be on.
 *  @return 0, or PS_EIO when no random nonce could be had (OpenSSL's RAND_bytes failed). */
int ps_auth_prove(const ps_auth_t *a, const char *host, uint16_t port,
                  uint8_t out[PS_AUTH_PROOF_LEN]);
/** @brief ps_auth_prove with the clock reading @p when (Unix seconds): for tests. */
int ps_auth_prove_at(const ps_auth_t *a, const char *host, uint16_t port, int64_t when,
                     uint8_t out[PS_AUTH_PROOF_LEN]);

/**
 * @brief Check a peer's proof @p proof of @p len bytes, for this shard at @p host : @p port (its
 *  manifest address), at Unix time @p now; an accepted one's nonce goes into @p seen.
 * @return 0, or PS_EAUTH with @p why saying what is wrong (length or version, the signature,
 *  the clock skew, a replayed or too old proof).
 */
int ps_auth_check(const ps_auth_t *a, ps_auth_seen_t *seen, const char *host, uint16_t port,
                  const uint8_t *proof, size_t len, int64_t now, char *why, size_t whylen);

/**
 * @brief The session token of the connection that proof @p proof opened: the first
 *  PS_AUTH_SESSION bytes of HMAC-SHA256(key, "psd-session" 0 proof), into @p out. The client
 *  computes it from the proof it sent, the shard from the one it accepted; a peer without the
 *  secret cannot, even having seen the proof. @p a must be on. No allocation.
 */
void ps_auth_session(const ps_auth_t *a, const uint8_t proof[PS_AUTH_PROOF_LEN],
                     uint8_t out[PS_AUTH_SESSION]);

/** @brief Whether @p got (@p len bytes) is session token @p want, compared in constant time. */
bool ps_auth_session_ok(const uint8_t want[PS_AUTH_SESSION], const uint8_t *got, size_t len);

/** @brief Zero the key in memory (at exit). */
void ps_auth_wipe(ps_auth_t *a);

#endif
