/* psctl_repair.c: `psctl verify --against D`, `psctl repair --from D [--rollback]` and
 * `psctl restore D` (the checkpoint itself: psctl_checkpoint.c).
 *
 * verify --against: reads D/shard-J for every J here (the files, no shard is asked):
 * recomputes each record's XXH3-64 and compares it with the record's header and with
 * meta.json, and the Merkle root of the recomputed hashes with meta.json's.
 *
 * repair --from: asks every shard to verify itself (MSG_VERIFY); each chunk named is rewritten
 * from the checkpoint (MSG_REPAIR, a store job on its shard) only where the checkpoint holds
 * the same version of it; otherwise psctl says so and, with --rollback, prints the commands
 * that roll the whole cluster back to the checkpoint. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rechash.h"

#include "ckpt_meta.h"
#include "crc32c.h"
#include "jsonfield.h"
#include "merkle.h"
#include "ps/ps_error.h"
#include "psctl_client.h"
#include "store.h"

/* ---- verify --against ------------------------------------------------------------------ */

typedef struct {
    uint32_t t, c;
    uint64_t version, hash, ordinal;
} vchunk_t;

static int by_ordinal(const void *a, const void *b)
{
    uint64_t x = ((const vchunk_t *)a)->ordinal, y = ((const vchunk_t *)b)->ordinal;
    return x < y ? -1 : x > y;
}

/* meta.json's "chunks" list, sorted by (tensor, chunk) for lookups: a search of the text for
 * each chunk made verify --against and repair quadratic in the chunks (a model of 100,000
 * chunks has a meta.json of 4 MB). */
typedef struct {
    uint32_t t, c;
    uint64_t version, hash;
} mchunk_t;

typedef struct {
    mchunk_t *e;
    size_t n;
    size_t listed; /* entries in the list, parsed or not */
} mchunks_t;

static int by_tc(const void *a, const void *b)
{
    const mchunk_t *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->c < y->c ? -1 : x->c > y->c;
}

/* Parse @p json's "chunks" into @p m (entries "\n [t, c, version, \"hash\"]"; one that does not
 * parse is counted in listed, not kept: its chunk is then not found). @return 0, or -1 when out
 * of memory. */
static int mchunks_parse(const char *json, mchunks_t *m)
{
    *m = (mchunks_t){0};
    size_t cap = 0;
    const char *p = json ? strstr(json, "\"chunks\": [") : NULL;
    while (p && (p = strstr(p, "\n [")) != NULL) {
        p += 3;
        m->listed++;
        unsigned t, c;
        unsigned long long v, h;
        if (sscanf(p, "%u, %u, %llu, \"%llx\"", &t, &c, &v, &h) != 4) continue;
        if (m->n == cap) {
            cap = cap ? 2 * cap : 256;
            mchunk_t *ne = realloc(m->e, cap * sizeof *ne);
            if (ne == NULL) {
                free(m->e);
                *m = (mchunks_t){0};
                return -1;
            }
            m->e = ne;
        }
        m->e[m->n++] = (mchunk_t){t, c, v, h};
    }
    if (m->n) qsort(m->e, m->n, sizeof *m->e, by_tc);
    return 0;
}

/* meta.json's entry for (t, c): its version and hash. @return 0, -1 if absent. */
static int meta_chunk(const mchunks_t *m, uint32_t t, uint32_t c, uint64_t *version,
                      uint64_t *hash)
{
    mchunk_t key = {.t = t, .c = c};
    const mchunk_t *e = m->n ? bsearch(&key, m->e, m->n, sizeof key, by_tc) : NULL;
    if (e == NULL) return -1;
    *version = e->version;
    *hash = e->hash;
    return 0;
}

/* Recheck DIR/shard-J; prints its mismatches. @return mismatches, or -1 if unreadable. */
static long verify_one(const ps_manifest_t *m, const char *dir, uint32_t j, uint64_t *checked,
                       char *root_out, int *root_bad)
{
    char *meta = psd_ckpt_meta_read(dir, j);
    if (meta == NULL) {
        fprintf(stderr, "psctl: verify: %s/shard-%u/%s: cannot read it: %s\n", dir, j,
                PSD_CKPT_META, errno == EINVAL ? "not a regular file" : strerror(errno));
        return -1;
    }
    mchunks_t listed;
    if (mchunks_parse(meta, &listed)) {
        fprintf(stderr, "psctl: verify: %s/shard-%u/%s: out of memory\n", dir, j, PSD_CKPT_META);
        free(meta);
        return -1;
    }
    psd_ckpt_src_t s;
    int rc = psd_ckpt_src_open(&s, dir, j, m->map_size_mb);
    if (rc) {
        fprintf(stderr, "psctl: verify: %s/shard-%u: %s\n", dir, j, psd_ckpt_src_strerror(rc));
        free(listed.e);
        free(meta);
        return -1;
    }
    long bad = 0;
    size_t nc = 0, cap = 0;
    vchunk_t *vc = NULL;
    MDB_cursor *cur;
    MDB_val k, v;
    char name[PS_NAME_MAX + 8];
    psd_ckpt_others_t others;
    psd_ckpt_others_init(&others);
    if ((rc = mdb_cursor_open(s.txn, s.dbi, &cur)) != 0) {
        fprintf(stderr, "psctl: verify: %s/shard-%u: %s\n", dir, j, mdb_strerror(rc));
        psd_ckpt_src_close(&s);
        free(listed.e);
        free(meta);
        return -1;
    }
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        const uint8_t *kp = k.mv_data;
        psd_ckpt_others_add(&others, &k, &v);
        if (k.mv_size != 9 || kp[0] != 'C') continue;
        uint32_t t = psd_ckpt_rd32(kp + 1), c = psd_ckpt_rd32(kp + 5);
        uint8_t tk[5] = {'T', kp[1], kp[2], kp[3], kp[4]};
        MDB_val tkey = {5, tk}, tval;
        ps_decl_t d = {0};
        if (mdb_get(s.txn, s.dbi, &tkey, &tval) == 0 && tval.mv_size == sizeof d)
            memcpy(&d, tval.mv_data, sizeof d);
        snprintf(name, sizeof name, "%s", d.name[0] ? d.name : "?");
        psctl_printable(name);
        const psd_chunk_hdr_t *h = v.mv_data;
        (*checked)++;
        if (v.mv_size < sizeof *h || v.mv_size != psd_chunk_bytes(h->n, h->nstate)) {
            printf("psctl: verify: checkpoint shard %u: tensor '%s' chunk %u: malformed record "
                   "of %zu bytes\n", j, name, c, v.mv_size);
            bad++;
            continue;
        }
        /* What psd_store_chunk_hash() computes (store.c is not linked into psctl). */
        uint64_t now = psd_rechash((const float *)(h + 1), h->n, h->nstate), mv = 0, mh = 0;
        uint32_t crc = ps_crc32c(0, h + 1, (size_t)h->n * 4);
        if (now != h->hash) {
            printf("psctl: verify: checkpoint shard %u: tensor '%s' chunk %u: version %llu stored "
                   "%016llx bytes %016llx\n", j, name, c, (unsigned long long)h->version,
                   (unsigned long long)h->hash, (unsigned long long)now);
            bad++;
        } else if (crc != h->crc32c) { /* pulls are checked against it: they would fail */
            printf("psctl: verify: checkpoint shard %u: tensor '%s' chunk %u: version %llu crc32c "
                   "stored %08x bytes %08x\n", j, name, c, (unsigned long long)h->version,
                   h->crc32c, crc);
            bad++;
        } else if (meta_chunk(&listed, t, c, &mv, &mh) || mv != h->version || mh != h->hash) {
            printf("psctl: verify: checkpoint shard %u: tensor '%s' chunk %u: version %llu hash "
                   "%016llx, but %s says version %llu hash %016llx\n", j, name, c,
                   (unsigned long long)h->version, (unsigned long long)h->hash, PSD_CKPT_META,
                   (unsigned long long)mv, (unsigned long long)mh);
            bad++;
        }
        if (nc == cap) {
            cap = cap ? 2 * cap : 256;
            vchunk_t *nv = realloc(vc, cap * sizeof *vc);
            if (nv == NULL) {
                rc = ENOMEM;
                break;
            }
            vc = nv;
        }
        vc[nc++] = (vchunk_t){t, c, h->version, now, d.first_chunk + c};
    }
    mdb_cursor_close(cur);
    if (rc != MDB_NOTFOUND) { /* not the end: a page it could not read, or no memory */
        printf("psctl: verify: checkpoint shard %u: reading its store stopped: %s\n", j,
               mdb_strerror(rc));
        bad++;
    }
    char others_now[17], others_want[24] = "";
    if (!psd_ckpt_others_match(&others, meta, others_now)) {
        psd_ckpt_meta_field(meta, "others_xxh3", others_want, sizeof others_want);
        printf("psctl: verify: checkpoint shard %u: the records other than chunks (tensor "
               "table, coordinator state, applied records) hash to %s, %s says %s\n", j,
               others_now, PSD_CKPT_META, others_want);
        bad++;
    }
    qsort(vc, nc, sizeof *vc, by_ordinal);
    uint64_t *leaves = malloc((nc ? nc : 1) * sizeof *leaves);
    for (size_t i = 0; leaves && i < nc; i++) leaves[i] = vc[i].hash;
    uint64_t root = leaves ? ps_merkle_root_of(leaves, nc) : 0;
    char want[32] = "";
    psd_ckpt_meta_field(meta, "merkle_root", want, sizeof want);
    snprintf(root_out, 17, "%016llx", (unsigned long long)root);
    if (listed.listed != nc) {
        printf("psctl: verify: checkpoint shard %u: %s lists %zu chunks, the store holds %zu\n",
               j, PSD_CKPT_META, listed.listed, nc);
        bad++;
    }
    if (strcmp(want, root_out) != 0) {
        printf("psctl: verify: checkpoint shard %u: Merkle root of the bytes %s, %s says %s\n", j,
               root_out, PSD_CKPT_META, want);
        (*root_bad)++; /* reported apart: a changed chunk changes the root as well */
    }
    printf("checkpoint shard %u: step %llu, %zu chunks, merkle_root %s%s\n", j,
           (unsigned long long)psd_ckpt_meta_u64(meta, "step"), nc, root_out,
           strcmp(want, root_out) == 0 ? " (as recorded)" : "");
    free(leaves);
    free(vc);
    free(listed.e);
    psd_ckpt_src_close(&s);
    free(meta);
    return bad;
}

/* For @p verb: shard 0's meta.json in @p dir names no number of shards psd could have taken
 * it on (1 if said). */
static int say_not_checkpoint(const char *verb, const char *dir)
{
    fprintf(stderr, "psctl: %s: %s: not a checkpoint (shard-0/%s has no valid \"nshards\", 1 to "
            "%d)\n", verb, dir, PSD_CKPT_META, PS_MAX_SERVERS);
    return 1;
}

/* Shard 0's meta.json of the checkpoint in @p dir (malloc'd), or NULL with the reason printed
 * for @p verb. */
static char *meta0_or_say(const char *verb, const char *dir)
{
    char *meta = psd_ckpt_meta_read(dir, 0);
    if (meta != NULL) return meta;
    /* Another shard's part without shard 0's: a copy that failed or stopped after psctl went
     * (checkpoint --wait ran out while they copied), not an empty place (an operator probe,
     * session 61: it said "no checkpoint there"). */
    for (uint32_t k = 1; k < PS_MAX_SERVERS; k++) {
        char *other = psd_ckpt_meta_read(dir, k);
        if (other == NULL) continue;
        free(other);
        fprintf(stderr, "psctl: %s: %s: not a whole checkpoint: shard-%u/%s is there, "
                "shard-0/%s is not (a shard's copy failed or stopped: its log says which)\n",
                verb, dir, k, PSD_CKPT_META, PSD_CKPT_META);
        return NULL;
    }
    fprintf(stderr, "psctl: %s: %s: no checkpoint there (no shard-0/%s)\n", verb, dir,
            PSD_CKPT_META);
    return NULL;
}

int psctl_verify_against(const ps_manifest_t *m, const char *dir)
{
    char *meta = meta0_or_say("verify", dir);
    if (meta == NULL) return 1;
    uint64_t n = psd_ckpt_meta_nshards(meta), step = psd_ckpt_meta_u64(meta, "step");
    if (n == 0) {
        free(meta);
        return say_not_checkpoint("verify", dir);
    }
    uint64_t checked = 0;
    long bad = 0;
    int failed = 0, root_bad = 0;
    char root[17], why[512], cluster[256] = "";
    psd_ckpt_meta_field(meta, "cluster", cluster, sizeof cluster);
    if (strcmp(cluster, m->cluster) != 0) /* said: repair and restore refuse it (a probe) */
        printf("psctl: verify: %s is a checkpoint of cluster '%s', not of this manifest's '%s': "
               "its files are checked all the same\n", dir, cluster, m->cluster);
    /* The shards' copies must be one checkpoint's (not renamed, mixed or from another run). */
    for (uint32_t j = 0; j < n; j++) {
        char *mj = j ? psd_ckpt_meta_read(dir, j) : meta;
        if (mj && psd_ckpt_meta_agree(meta, mj, j, why, sizeof why)) {
            printf("psctl: verify: checkpoint %s: %s\n", dir, why);
            bad++;
        }
        if (j) free(mj);
    }
    free(meta);
    for (uint32_t j = 0; j < n; j++) {
        long b = verify_one(m, dir, j, &checked, root, &root_bad);
        if (b < 0) failed = 1;
        else bad += b;
    }
    if (!failed)
        printf("psctl: verify: checkpoint %s (step %llu): %llu chunks checked on %llu shards, %ld "
               "%s\n", dir, (unsigned long long)step, (unsigned long long)checked,
               (unsigned long long)n, bad, bad == 1 ? "mismatch" : "mismatches");
    if (!failed && root_bad)
        printf("psctl: verify: the Merkle roots of %d shards differ from their %s\n", root_bad,
               PSD_CKPT_META);
    return failed || bad || root_bad ? 1 : 0;
}

/* ---- repair ---------------------------------------------------------------------------- */

/* Which checkpoint shard holds (t, c), and at which version. @return 0, -1 if none. */
static int ckpt_find(const mchunks_t *lists, uint32_t n, uint32_t t, uint32_t c, uint32_t *j,
                     uint64_t *version)
{
    uint64_t h;
    for (uint32_t k = 0; k < n; k++)
        if (meta_chunk(&lists[k], t, c, version, &h) == 0) {
            *j = k;
            return 0;
        }
    return -1;
}

/* @p s as one shell word, in @p buf (@p cap bytes): as it is when it holds only characters no
 * shell treats specially, else in single quotes (each ' written as '\''). The commands psctl
 * prints must run as printed also for paths with spaces (a probe, session 42). */
static const char *shq(const char *s, char *buf, size_t cap)
{
    if (*s && strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                        "_-./:=+@%,") == strlen(s))
        return s;
    size_t k = 0;
    if (k < cap - 1) buf[k++] = '\'';
    for (; *s && k + 5 < cap; s++) {
        if (*s == '\'') {
            memcpy(buf + k, "'\\''", 4);
            k += 4;
        } else {
            buf[k++] = *s;
        }
    }
    if (k < cap - 1) buf[k++] = '\'';
    buf[k] = '\0';
    return buf;
}

/* The psd beside this psctl (build/server, or where both are installed) into @p out, or "psd". */
static void psd_beside(char *out, size_t cap)
{
    char self[1024];
    snprintf(out, cap, "psd");
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return;
    self[len] = '\0';
    char *slash = strrchr(self, '/');
    if (slash == NULL) return;
    *slash = '\0';
    snprintf(out, cap, "%s/psd", self);
    if (access(out, X_OK) != 0) snprintf(out, cap, "psd");
}

static void print_rollback(const ps_manifest_t *m, const char *dir, uint64_t step)
{
    printf("psctl: repair: to roll the whole cluster back to step %llu of %s: stop every psd "
           "and every worker, then on each shard's host run:\n", (unsigned long long)step, dir);
    char mabs[PATH_MAX], dabs[PATH_MAX]; /* absolute: run on each shard's host */
    const char *mp = realpath(m->path, mabs) ? mabs : m->path;
    const char *dp = realpath(dir, dabs) ? dabs : dir;
    static char q[5][2 * PATH_MAX + 8]; /* five quoted words per line */
    char psd[1100], aside[PATH_MAX + 32];
    psd_beside(psd, sizeof psd);
    for (int i = 0; i < m->nservers; i++) {
        snprintf(aside, sizeof aside, "%s.before-rollback", m->servers[i].data_dir);
        printf("  mv %s %s && %s --manifest %s --shard %d --restore %s\n",
               shq(m->servers[i].data_dir, q[0], sizeof q[0]), shq(aside, q[1], sizeof q[1]),
               shq(psd, q[2], sizeof q[2]), shq(mp, q[3], sizeof q[3]), i,
               shq(dp, q[4], sizeof q[4]));
    }
}

typedef struct {
    ps_req_t *cl;
    char (*names)[PS_NAME_MAX];
    int nt;
    const mchunks_t *lists; /* each checkpoint shard's chunks, for ckpt_find */
    uint32_t n;
    const char *dir;
    int repaired, stuck;
} repair_ctx_t;

/* One chunk shard @p i's verify named: rewritten from the checkpoint when it holds that
 * version (MSG_REPAIR), else said why not. */
static void repair_one(void *ctx, int i, unsigned t, unsigned c, const char *rest)
{
    repair_ctx_t *x = ctx;
    const char *nm = psctl_tensor_name(x->names, x->nt, t);
    unsigned long long ver;
    uint32_t j;
    uint64_t cv;
    char err[512];
    ps_msg_t r;
    if (sscanf(rest, "version %llu", &ver) != 1) {
        printf("psctl: repair: shard %d: tensor '%s' chunk %u: its record is malformed (version "
               "unknown): not repaired\n", i, nm, c);
        x->stuck++;
    } else if (ckpt_find(x->lists, x->n, t, c, &j, &cv)) {
        printf("psctl: repair: shard %d: tensor '%s' chunk %u (version %llu): the checkpoint "
               "does not hold it: not repaired\n", i, nm, c, ver);
        x->stuck++;
    } else if (cv != ver) {
        printf("psctl: repair: shard %d: tensor '%s' chunk %u is at version %llu, the checkpoint "
               "holds version %llu: not repaired (it would be at another step than its "
               "neighbours)\n", i, nm, c, ver, (unsigned long long)cv);
        x->stuck++;
    } else {
        ps_msg_t rq = {.type = PS_MSG_REPAIR, .rank = -1, .tensor = t, .chunk = c, .step = ver,
                       .workers = j};
        snprintf(rq.error, sizeof rq.error, "%.255s", x->dir);
        if (ps_req_call(x->cl, (uint32_t)i, &rq, &r, NULL, NULL, err, sizeof err)) {
            printf("psctl: repair: shard %d: tensor '%s' chunk %u: %s\n", i, nm, c, err);
            x->stuck++;
        } else {
            printf("psctl: repair: shard %d: tensor '%s' chunk %u repaired at version %llu from "
                   "%s/shard-%u\n", i, nm, c, ver, x->dir, j);
            x->repaired++;
        }
    }
}

int psctl_repair(const ps_manifest_t *m, const char *dir_in, int rollback, double timeout_s)
{
    char dir[1024], err[512];
    if (psctl_absolute(dir, sizeof dir, dir_in) != 0 || strlen(dir) >= PS_CKPT_DIR_MAX) {
        /* MSG_REPAIR carries it (checkpoint's own bound): an argument refused, exit 2 as
         * checkpoint --dir's (before, 1, after reading the checkpoint; a review) */
        fprintf(stderr, "psctl: repair: checkpoint directory '%s'%s is longer than %d bytes\n",
                dir_in, dir_in[0] == '/' ? "" : " made absolute", PS_CKPT_DIR_MAX - 1);
        return 2;
    }
    char *meta0 = meta0_or_say("repair", dir);
    if (meta0 == NULL) return 1;
    uint32_t n = psd_ckpt_meta_nshards(meta0);
    if (n == 0) {
        free(meta0);
        return say_not_checkpoint("repair", dir);
    }
    uint64_t step = psd_ckpt_meta_u64(meta0, "step");
    char **metas = calloc(n ? n : 1, sizeof *metas);
    mchunks_t *lists = calloc(n ? n : 1, sizeof *lists); /* each shard's, for ckpt_find */
    int miss = -1, miss_errno = 0; /* the first part whose meta.json cannot be read */
    for (uint32_t j = 0; metas && j < n; j++) {
        metas[j] = j ? psd_ckpt_meta_read(dir, j) : meta0;
        if (metas[j] == NULL && miss < 0) {
            miss = (int)j;
            miss_errno = errno;
        }
    }
    ps_req_t *cl = NULL;
    char(*names)[PS_NAME_MAX] = NULL;
    int ret = 1, nt;
    char cluster[256] = "";
    psd_ckpt_meta_field(meta0, "cluster", cluster, sizeof cluster);
    if (strcmp(cluster, m->cluster) != 0) { /* its chunks are another cluster's model */
        fprintf(stderr, "psctl: repair: %s is a checkpoint of cluster '%s', this manifest's "
                "cluster is '%s'\n", dir, cluster, m->cluster);
        goto out;
    }
    /* Every part, as restore asks: with one missing, its chunks read as "not held" and
     * --rollback printed the restore of a checkpoint psd refuses (a review, session 70). */
    if (miss >= 0) {
        fprintf(stderr, "psctl: repair: %s: shard-%d/%s: %s: not a whole checkpoint (no repair "
                "from it)\n", dir, miss, PSD_CKPT_META,
                miss_errno == EINVAL ? "not a regular file" : strerror(miss_errno));
        goto out;
    }
    for (uint32_t j = 0; metas && j < n; j++)
        if (psd_ckpt_meta_agree(meta0, metas[j], j, err, sizeof err)) {
            fprintf(stderr, "psctl: repair: %s: %s\n", dir, err);
            goto out;
        }
    bool nomem = metas == NULL || lists == NULL;
    for (uint32_t j = 0; !nomem && j < n; j++) nomem = mchunks_parse(metas[j], &lists[j]) != 0;
    if (nomem || ps_req_open(m, timeout_s, &cl, err, sizeof err)) {
        fprintf(stderr, "psctl: repair: %s\n", nomem ? "out of memory" : err);
        goto out;
    }
    if ((nt = psctl_tensor_names(cl, &names)) < 0) goto out;
    repair_ctx_t rc = {.cl = cl, .names = names, .nt = nt, .lists = lists, .n = n, .dir = dir};
    int failed = 0;
    uint64_t checked = 0;
    for (int i = 0; i < m->nservers; i++)
        if (psctl_verify_shard(cl, i, repair_one, &rc, &checked, err, sizeof err)) {
            fprintf(stderr, "psctl: repair: verify of shard %d: %s\n", i, err);
            failed = 1;
        }
    int repaired = rc.repaired, stuck = rc.stuck;
    if (failed) goto out;
    printf("psctl: repair: %d %s repaired, %d not repairable from %s\n", repaired,
           repaired == 1 ? "chunk" : "chunks", stuck, dir);
    if (stuck) {
        if (rollback) {
            print_rollback(m, dir, step);
        } else {
            static char q[2][2 * PATH_MAX + 8];
            printf("psctl: repair: `psctl --manifest %s repair --from %s --rollback` prints the "
                   "commands that roll the whole cluster back to step %llu\n",
                   shq(m->path, q[0], sizeof q[0]), shq(dir, q[1], sizeof q[1]),
                   (unsigned long long)step);
        }
        goto out;
    }
    ret = 0;
out:
    for (uint32_t j = 0; metas && j < n; j++) free(metas[j]);
    for (uint32_t j = 0; lists && j < n; j++) free(lists[j].e);
    if (metas == NULL) free(meta0);
    free(metas);
    free(lists);
    free(names);
    ps_req_close(cl);
    return ret;
}

int psctl_restore(const ps_manifest_t *m, const char *dir_in)
{
    char dir[1024];
    if (psctl_absolute(dir, sizeof dir, dir_in) != 0) {
        fprintf(stderr, "psctl: restore: cannot make '%s' absolute (the working directory is "
                "gone, or its path too long): give an absolute one\n", dir_in);
        return 2;
    }
    char *meta = meta0_or_say("restore", dir);
    if (meta == NULL) return 1;
    char cl[256] = "";
    uint32_t n = psd_ckpt_meta_nshards(meta);
    uint64_t step = psd_ckpt_meta_u64(meta, "step");
    psd_ckpt_meta_field(meta, "cluster", cl, sizeof cl);
    if (n == 0) {
        free(meta);
        return say_not_checkpoint("restore", dir);
    }
    if (step == UINT64_MAX) {
        fprintf(stderr, "psctl: restore: %s: not a checkpoint (shard-0/%s has no \"step\")\n",
                dir, PSD_CKPT_META);
        free(meta);
        return 1;
    }
    if (strcmp(cl, m->cluster) != 0) {
        fprintf(stderr, "psctl: restore: %s is a checkpoint of cluster '%s', %s's cluster is "
                "'%s'\n", dir, cl, m->path, m->cluster);
        free(meta);
        return 1;
    }
    /* What psd --restore checks of the manifest (chunk_bytes, the optimizer's state, the
     * consistency): before, the commands were printed, after the advice to stop the shards and
     * move their data_dirs aside, and each psd then refused (a review, session 72). */
    char why[512];
    if (psd_ckpt_meta_fits(meta, m, why, sizeof why) != 0) {
        fprintf(stderr, "psctl: restore: %s: %s (psd --restore would refuse it)\n", dir, why);
        free(meta);
        return 1;
    }
    /* Every shard's part must be there and of this checkpoint: psd --restore refuses an
     * incomplete one only once started (a probe, session 40: a checkpoint whose shard 1 was
     * stopped kept shard 0's part alone, and restore printed its commands, exit 0). */
    for (uint32_t j = 1; j < n; j++) {
        char *mj = psd_ckpt_meta_read(dir, j), err[512] = "";
        int bad = mj == NULL || psd_ckpt_meta_agree(meta, mj, j, err, sizeof err) != 0;
        if (mj == NULL)
            snprintf(err, sizeof err, "shard-%u/%s: %s", j, PSD_CKPT_META,
                     errno == EINVAL ? "not a regular file" : strerror(errno));
        free(mj);
        if (bad) {
            fprintf(stderr, "psctl: restore: %s: %s: not a whole checkpoint (pick another)\n",
                    dir, err);
            free(meta);
            return 1;
        }
    }
    char psd[1100];
    psd_beside(psd, sizeof psd);
    printf("# checkpoint at step %llu of %u shards. Stop every psd and worker of %s, move each "
           "shard's data_dir aside (mv DIR DIR.old: psd restores only into an empty or missing "
           "one), then start each shard (on its host; each runs until stopped):\n",
           (unsigned long long)step, n, m->path);
    /* Absolute paths: the commands run on each shard's host, from anywhere (a relative
     * manifest path given to psctl worked only from its directory; a probe, session 41). */
    char mabs[PATH_MAX], dabs[PATH_MAX];
    const char *mp = realpath(m->path, mabs) ? mabs : m->path;
    const char *dp = realpath(dir, dabs) ? dabs : dir;
    static char q[3][2 * PATH_MAX + 8];
    for (int i = 0; i < m->nservers; i++)
        printf("%s --manifest %s --shard %d --restore %s\n", shq(psd, q[0], sizeof q[0]),
               shq(mp, q[1], sizeof q[1]), i, shq(dp, q[2], sizeof q[2]));
    free(meta);
    return 0;
}
