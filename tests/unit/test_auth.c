/* test_auth.c: the cluster secret's file checks and the proofs a shard accepts or refuses
 * (common/auth.h). */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "ps/ps_error.h"

static char dir[64];
static ps_manifest_t m;
static char err[512];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/ps-auth-test.XXXXXX");
    ck_assert(mkdtemp(dir) != NULL);
    memset(&m, 0, sizeof m);
    snprintf(m.cluster, sizeof m.cluster, "c1");
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Write @p len bytes of @p fill as file @p name with @p mode; m.secret_file names it. */
static void secret(const char *name, size_t len, char fill, mode_t mode)
{
    snprintf(m.secret_file, sizeof m.secret_file, "%s/%s", dir, name);
    int fd = open(m.secret_file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert(fd >= 0);
    char buf[8192];
    memset(buf, fill, sizeof buf);
    ck_assert(write(fd, buf, len) == (ssize_t)len);
    close(fd);
    ck_assert_int_eq(chmod(m.secret_file, mode), 0);
}

/* @p a loaded from a fresh secret file "ok" (32 bytes of 'k', mode @p mode). */
static void load_ok(ps_auth_t *a, mode_t mode)
{
    secret("ok", 32, 'k', mode);
    ck_assert_int_eq(ps_auth_load(a, &m, err, sizeof err), 0);
    ck_assert(a->on);
}

START_TEST(no_secret_file_is_off)
{
    ps_auth_t a;
    ck_assert_int_eq(ps_auth_load(&a, &m, err, sizeof err), 0);
    ck_assert(!a.on);
}
END_TEST

START_TEST(bad_files_refused)
{
    ps_auth_t a;
    snprintf(m.secret_file, sizeof m.secret_file, "%s/missing", dir);
    ck_assert_int_eq(ps_auth_load(&a, &m, err, sizeof err), PS_ECONFIG);
    ck_assert_msg(strstr(err, "/missing: cannot open it: No such file"), "%s", err);
    secret("shared", 32, 'k', 0644);
    ck_assert_int_eq(ps_auth_load(&a, &m, err, sizeof err), PS_ECONFIG);
    ck_assert_msg(strstr(err, "readable or writable by group or others (mode 644): chmod 600"),
                  "%s", err);
    secret("short", 15, 'k', 0600);
    ck_assert_int_eq(ps_auth_load(&a, &m, err, sizeof err), PS_ECONFIG);
    ck_assert_msg(strstr(err, "15 bytes; it must hold 16 to 4096"), "%s", err);
    ck_assert(!strstr(err, "kkk")); /* never the secret's bytes */
    secret("long", 4097, 'k', 0600);
    ck_assert_int_eq(ps_auth_load(&a, &m, err, sizeof err), PS_ECONFIG);
    snprintf(m.secret_file, sizeof m.secret_file, "%s", dir);
    ck_assert_int_eq(ps_auth_load(&a, &m, err, sizeof err), PS_ECONFIG);
    ck_assert_msg(strstr(err, "not a regular file"), "%s", err);
    ck_assert(!a.on);
    /* A FIFO (nobody writing) is refused at once, not waited on. */
    snprintf(m.secret_file, sizeof m.secret_file, "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(m.secret_file, 0600), 0);
    ck_assert_int_eq(ps_auth_load(&a, &m, err, sizeof err), PS_ECONFIG);
    ck_assert_msg(strstr(err, "not a regular file"), "%s", err);
    unlink(m.secret_file);
    /* One owned by another user (who chose the key), where this test can make one (root). */
    if (geteuid() == 0) {
        secret("theirs", 32, 'k', 0600);
        ck_assert_int_eq(chown(m.secret_file, 65534, 65534), 0);
        ck_assert_int_eq(ps_auth_load(&a, &m, err, sizeof err), PS_ECONFIG);
        ck_assert_msg(strstr(err, "owned by uid 65534, neither this user (uid 0) nor root"), "%s",
                      err);
    }
}
END_TEST

START_TEST(proof_accepted_once)
{
    static ps_auth_t a;
    static ps_auth_seen_t seen;
    load_ok(&a, 0400);
    ck_assert_uint_eq(a.key_len, 32);
    uint8_t p[PS_AUTH_PROOF_LEN], q[PS_AUTH_PROOF_LEN];
    ps_auth_prove(&a, "h", 7, p);
    ps_auth_prove(&a, "h", 7, q);
    ck_assert(memcmp(p, q, sizeof p) != 0); /* fresh nonces */
    int64_t now = (int64_t)time(NULL);
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, p, sizeof p, now, err, sizeof err), 0);
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, q, sizeof q, now, err, sizeof err), 0);
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, p, sizeof p, now, err, sizeof err), PS_EAUTH);
    ck_assert_msg(strstr(err, "used before"), "%s", err);
}
END_TEST

/* Both ends derive a connection's session token from its proof and the secret: the same
 * bytes from the same proof, others from another proof or another secret; the check takes only
 * the whole token. */
START_TEST(session_token_from_proof)
{
    static ps_auth_t a, b;
    static ps_auth_seen_t seen;
    load_ok(&a, 0600);
    b = a;
    b.key[0] ^= 1;
    uint8_t p[PS_AUTH_PROOF_LEN], q[PS_AUTH_PROOF_LEN];
    uint8_t tp[PS_AUTH_SESSION], tp2[PS_AUTH_SESSION], tq[PS_AUTH_SESSION], tb[PS_AUTH_SESSION];
    ps_auth_prove(&a, "h", 7, p);
    ps_auth_prove(&a, "h", 7, q);
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, p, sizeof p, (int64_t)time(NULL), err,
                                   sizeof err), 0);
    ps_auth_session(&a, p, tp);
    ps_auth_session(&a, p, tp2);
    ps_auth_session(&a, q, tq);
    ps_auth_session(&b, p, tb);
    ck_assert(ps_auth_session_ok(tp, tp2, sizeof tp2));
    ck_assert(!ps_auth_session_ok(tp, tq, sizeof tq));
    ck_assert(!ps_auth_session_ok(tp, tb, sizeof tb));
    ck_assert(!ps_auth_session_ok(tp, tp2, sizeof tp2 - 1)); /* a prefix is not the token */
    ck_assert(!ps_auth_session_ok(tp, tp2, 0));
    uint8_t flip[PS_AUTH_SESSION];
    memcpy(flip, tp, sizeof flip);
    flip[PS_AUTH_SESSION - 1] ^= 0x80;
    ck_assert(!ps_auth_session_ok(tp, flip, sizeof flip));
    static const uint8_t zero[PS_AUTH_SESSION];
    ck_assert(memcmp(tp, zero, sizeof zero) != 0 && memcmp(tp, p, sizeof tp) != 0);
}
END_TEST

/* A proof is made for one shard (its manifest address): another shard, or the same host on
 * another port, refuses it, so one seen on its way to a shard opens no other. */
START_TEST(proof_for_another_shard_refused)
{
    static ps_auth_t a;
    static ps_auth_seen_t seen;
    load_ok(&a, 0600);
    int64_t now = (int64_t)time(NULL);
    uint8_t p[PS_AUTH_PROOF_LEN];
    ps_auth_prove(&a, "h", 7, p);
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 8, p, sizeof p, now, err, sizeof err),
                     PS_EAUTH);
    ck_assert_msg(strstr(err, "for shard h:8 ("), "%s", err);
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h2", 7, p, sizeof p, now, err, sizeof err),
                     PS_EAUTH);
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, p, sizeof p, now, err, sizeof err), 0);
}
END_TEST

/* A clock past INT64_MAX is named as such, not as "0 s off". */
START_TEST(clock_past_any_time_refused)
{
    static ps_auth_t a;
    static ps_auth_seen_t seen;
    load_ok(&a, 0600);
    uint8_t p[PS_AUTH_PROOF_LEN];
    ps_auth_prove_at(&a, "h", 7, (int64_t)-5, p); /* reads as 2^64 - 5 */
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, p, sizeof p, (int64_t)time(NULL), err,
                                   sizeof err), PS_EAUTH);
    ck_assert_msg(strstr(err, "past any time"), "%s", err);
}
END_TEST

START_TEST(wrong_proofs_refused)
{
    static ps_auth_t a, other_key, other_cluster;
    static ps_auth_seen_t seen;
    load_ok(&a, 0600);
    secret("other", 32, 'j', 0600);
    ck_assert_int_eq(ps_auth_load(&other_key, &m, err, sizeof err), 0);
    secret("ok", 32, 'k', 0600);
    snprintf(m.cluster, sizeof m.cluster, "c2");
    ck_assert_int_eq(ps_auth_load(&other_cluster, &m, err, sizeof err), 0);
    int64_t now = (int64_t)time(NULL);
    uint8_t p[PS_AUTH_PROOF_LEN];
    ps_auth_prove(&other_key, "h", 7, p);
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, p, sizeof p, now, err, sizeof err), PS_EAUTH);
    ck_assert_msg(strstr(err, "not signed with this cluster's secret"), "%s", err);
    ps_auth_prove(&other_cluster, "h", 7, p);
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, p, sizeof p, now, err, sizeof err), PS_EAUTH);
    ps_auth_prove(&a, "h", 7, p);
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, p, sizeof p - 1, now, err, sizeof err), PS_EAUTH);
    ck_assert_msg(strstr(err, "a proof of 56 bytes"), "%s", err);
    p[PS_AUTH_PROOF_LEN - 1] ^= 1; /* one bit of the signature */
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, p, sizeof p, now, err, sizeof err), PS_EAUTH);
    p[PS_AUTH_PROOF_LEN - 1] ^= 1;
    p[9] ^= 1; /* one bit of the nonce: the signature no longer fits */
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, p, sizeof p, now, err, sizeof err), PS_EAUTH);
    p[9] ^= 1;
    /* A clock too far either way. */
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, p, sizeof p, now + PS_AUTH_SKEW_S + 5, err,
                                   sizeof err), PS_EAUTH);
    ck_assert_msg(strstr(err, "clock is -30"), "%s", err);
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, p, sizeof p, now - PS_AUTH_SKEW_S - 5, err,
                                   sizeof err), PS_EAUTH);
    ck_assert_msg(strstr(err, "clock is 30"), "%s", err);
    /* None of those was taken: the genuine proof still is, once. */
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, p, sizeof p, now, err, sizeof err), 0);
}
END_TEST

/* Once more proofs came within the window than the shard remembers, one older than the newest
 * it forgot is refused (it could be a replay of a forgotten one); newer ones still pass. */
START_TEST(forgotten_window_refused)
{
    static ps_auth_t a;
    static ps_auth_seen_t seen;
    load_ok(&a, 0600);
    int64_t now = (int64_t)time(NULL);
    uint8_t first[PS_AUTH_PROOF_LEN], p[PS_AUTH_PROOF_LEN];
    ps_auth_prove(&a, "h", 7, first);
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, first, sizeof first, now, err, sizeof err), 0);
    for (int i = 0; i < PS_AUTH_SEEN; i++) {
        ps_auth_prove(&a, "h", 7, p);
        ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, p, sizeof p, now, err, sizeof err), 0);
    }
    /* first was forgotten: its replay is refused, though not as "used before". */
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, first, sizeof first, now, err, sizeof err),
                     PS_EAUTH);
    ck_assert_msg(strstr(err, "older than the replays"), "%s", err);
    sleep(1); /* a proof of a later second passes */
    ps_auth_prove(&a, "h", 7, p);
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, p, sizeof p, now + 1, err, sizeof err), 0);
}
END_TEST

/* A peer whose clock runs ahead is remembered longest: when the shard forgets proofs it forgets
 * the oldest, so that peer's proof does not make every current one look too old. */
START_TEST(clock_ahead_does_not_lock_out)
{
    static ps_auth_t a;
    static ps_auth_seen_t seen;
    load_ok(&a, 0600);
    int64_t now = 1800000000;
    uint8_t p[PS_AUTH_PROOF_LEN];
    ps_auth_prove_at(&a, "h", 7, now + 200, p); /* 200 s ahead: within the allowed skew */
    ck_assert_int_eq(ps_auth_check(&a, &seen, "h", 7, p, sizeof p, now, err, sizeof err), 0);
    for (int i = 0; i < PS_AUTH_SEEN + 10; i++) { /* 20 connections a second for 205 s */
        ps_auth_prove_at(&a, "h", 7, now - 250 + i / 20, p);
        ck_assert_msg(ps_auth_check(&a, &seen, "h", 7, p, sizeof p, now, err, sizeof err) == 0,
                      "proof %d: %s", i, err);
    }
    ps_auth_prove_at(&a, "h", 7, now + 1, p);
    ck_assert_msg(ps_auth_check(&a, &seen, "h", 7, p, sizeof p, now + 1, err, sizeof err) == 0, "%s",
                  err);
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("auth");
    TCase *tc = tcase_create("auth");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, no_secret_file_is_off);
    tcase_add_test(tc, bad_files_refused);
    tcase_add_test(tc, proof_accepted_once);
    tcase_add_test(tc, session_token_from_proof);
    tcase_add_test(tc, wrong_proofs_refused);
    tcase_add_test(tc, proof_for_another_shard_refused);
    tcase_add_test(tc, clock_past_any_time_refused);
    tcase_add_test(tc, forgotten_window_refused);
    tcase_add_test(tc, clock_ahead_does_not_lock_out);
    suite_add_tcase(s, tc);
    return s;
}
