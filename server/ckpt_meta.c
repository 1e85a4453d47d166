/* ckpt_meta.c: reading a checkpoint's files (see ckpt_meta.h). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_meta.h"
#include "manifest.h"
#include "optim.h"
#include "ps/ps_error.h"
#include "regfile.h"

#define META_MAX (1L << 30) /* a meta.json lists every chunk: ~40 bytes each */

int psd_ckpt_cancel_mark(char *out, size_t cap, const char *dir, uint64_t id)
{
    int n = snprintf(out, cap, "%s/%s%016llx", dir, PSD_CKPT_CANCELLED, (unsigned long long)id);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

char *psd_ckpt_meta_read(const char *dir, uint32_t j)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/shard-%u/%s", dir, j, PSD_CKPT_META);
    /* A FIFO put there would hang every reader until a writer came. */
    struct stat st;
    int fd = ps_open_regular(path, 0, &st);
    if (fd < 0 || st.st_size > META_MAX) {
        if (fd >= 0) close(fd);
        errno = fd < 0 ? -fd : EINVAL; /* EINVAL: not a regular file, or too big */
        return NULL;
    }
    FILE *f = fdopen(fd, "r");
    if (f == NULL) {
        int e = errno;
        close(fd);
        errno = e;
        return NULL;
    }
    char *b = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)n + 1)) != NULL) {
        if (fread(b, 1, (size_t)n, f) == (size_t)n) {
            b[n] = '\0';
        } else {
            free(b);
            b = NULL;
            errno = EIO;
        }
    }
    fclose(f);
    return b;
}

/* The tensor table of meta.json @p j ("tensors": [...], up to the chunks) into *@p len; NULL
 * (and 0) when it has none (an older psd's). */
static const char *tensor_table(const char *j, size_t *len)
{
    const char *a = strstr(j, "\"tensors\": ["), *b = a ? strstr(a, "\"chunks\":") : NULL;
    *len = a && b ? (size_t)(b - a) : 0;
    return a && b ? a : NULL;
}

/* The first tensor entry where tables @p a and @p b (@p la, @p lb bytes) part, as a name, into
 * @p out. */
static void table_parting(const char *a, size_t la, const char *b, size_t lb, char *out,
                          size_t cap)
{
    size_t i = 0;
    while (i < la && i < lb && a[i] == b[i]) i++;
    const char *at = i < la ? a : b;
    size_t lat = i < la ? la : lb;
    size_t j = i;
    while (j > 0 && at[j - 1] != '{' && at[j - 1] != '}') j--;
    if (j > 0 && at[j - 1] == '{') i = j - 1; /* inside an entry: that one; else the next */
    const char *name = i < lat ? strstr(at + i, "\"name\": \"") : NULL;
    if (name == NULL || name >= at + lat) {
        snprintf(out, cap, "?");
        return;
    }
    name += strlen("\"name\": \"");
    size_t n = strcspn(name, "\"");
    snprintf(out, cap, "%.*s", (int)(n < 120 ? n : 120), name);
}

int psd_ckpt_meta_agree(const char *j0, const char *jk, uint32_t k, char *err, size_t errlen)
{
    uint64_t shard = psd_ckpt_meta_u64(jk, "shard"), n0 = psd_ckpt_meta_u64(j0, "nshards");
    uint64_t nk = psd_ckpt_meta_u64(jk, "nshards");
    char a[256] = "", b[256] = "";
    if (shard != k) {
        snprintf(err, errlen, "shard-%u/%s says it is shard %lld (directories renamed or mixed "
                 "up?)", k, PSD_CKPT_META, shard == UINT64_MAX ? -1LL : (long long)shard);
        return -1;
    }
    if (nk != n0) {
        snprintf(err, errlen, "shard-%u was taken on %lld shards, shard-0 on %lld: not one "
                 "checkpoint", k, nk == UINT64_MAX ? -1LL : (long long)nk,
                 n0 == UINT64_MAX ? -1LL : (long long)n0);
        return -1;
    }
    static const char *const keys[] = {"cluster", "checkpoint"}; /* "run" is each store's own */
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        a[0] = b[0] = '\0';
        psd_ckpt_meta_field(j0, keys[i], a, sizeof a);
        psd_ckpt_meta_field(jk, keys[i], b, sizeof b);
        if (strcmp(a, b) != 0) {
            snprintf(err, errlen, "shard-%u is of %s '%s', shard-0 of %s '%s': not one "
                     "checkpoint", k, keys[i], b, keys[i], a);
            return -1;
        }
    }
    /* Every shard holds the cluster's whole tensor table: parts whose tables differ were taken
     * on either side of a declaration or a forget (a review, session 63: such a checkpoint was
     * reported complete and verified, and its restore failed on one shard after the other had
     * restored). */
    size_t l0, lk;
    const char *t0 = tensor_table(j0, &l0), *tk = tensor_table(jk, &lk);
    if ((t0 == NULL) != (tk == NULL) || l0 != lk || (t0 && memcmp(t0, tk, l0) != 0)) {
        char name[128] = "?";
        if (t0 && tk) table_parting(t0, l0, tk, lk, name, sizeof name);
        snprintf(err, errlen, "shard-%u holds another tensor table than shard-0 (first "
                 "difference at tensor '%s'): taken across a tensor's declaration or drop, not "
                 "one checkpoint", k, name);
        return -1;
    }
    /* bsp: every shard's chunks at the step (one that holds none may say another). */
    psd_ckpt_meta_field(j0, "consistency", a, sizeof a);
    uint64_t s0 = psd_ckpt_meta_u64(j0, "step"), sk = psd_ckpt_meta_u64(jk, "step");
    if (strcmp(a, "bsp") == 0 && sk != s0 && psd_ckpt_meta_u64(jk, "records_bytes") != 0) {
        snprintf(err, errlen, "shard-%u is at step %llu, shard-0 at step %llu: not one "
                 "checkpoint", k, (unsigned long long)sk, (unsigned long long)s0);
        return -1;
    }
    return 0;
}

void psd_ckpt_others_init(psd_ckpt_others_t *o) { XXH3_64bits_reset(&o->st); }

void psd_ckpt_others_add(psd_ckpt_others_t *o, const MDB_val *k, const MDB_val *v)
{
    const uint8_t *kp = k->mv_data;
    if (k->mv_size == 9 && kp[0] == 'C') return;
    uint32_t kl = (uint32_t)k->mv_size;
    uint64_t vl = v->mv_size;
    XXH3_64bits_update(&o->st, &kl, sizeof kl);
    XXH3_64bits_update(&o->st, k->mv_data, k->mv_size);
    XXH3_64bits_update(&o->st, &vl, sizeof vl);
    XXH3_64bits_update(&o->st, v->mv_data, v->mv_size);
}

uint64_t psd_ckpt_others_digest(const psd_ckpt_others_t *o) { return XXH3_64bits_digest(&o->st); }

bool psd_ckpt_others_match(const psd_ckpt_others_t *o, const char *json, char now[17])
{
    char want[24];
    snprintf(now, 17, "%016llx", (unsigned long long)psd_ckpt_others_digest(o));
    return psd_ckpt_meta_field(json, "others_xxh3", want, sizeof want) != 0 ||
           strcmp(want, now) == 0;
}

int psd_ckpt_meta_field(const char *json, const char *key, char *out, size_t cap)
{
    char pat[80];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(json, pat);
    if (p == NULL) return -1;
    p += strlen(pat);
    if (*p == '"') p++;
    size_t n = strcspn(p, "\",}\n");
    if (n >= cap) return -1;
    memcpy(out, p, n);
    out[n] = '\0';
    return 0;
}

uint64_t psd_ckpt_meta_u64(const char *json, const char *key)
{
    char v[64];
    return psd_ckpt_meta_field(json, key, v, sizeof v) ? UINT64_MAX : strtoull(v, NULL, 10);
}

uint32_t psd_ckpt_meta_nshards(const char *json)
{
    char v[64], *end;
    if (psd_ckpt_meta_field(json, "nshards", v, sizeof v) || v[0] < '0' || v[0] > '9') return 0;
    unsigned long long n = strtoull(v, &end, 10);
    return *end == '\0' && n >= 1 && n <= PS_MAX_SERVERS ? (uint32_t)n : 0;
}

/* A checkpoint's data.mdb shorter than the pages its environment uses (a copy cut short) faults
 * (SIGBUS) where LMDB reads past its end: while a source is open the fault ends the process with
 * the file's name and the reason (exit 1) instead of a crash. LMDB itself cannot tell: it may
 * legitimately leave the file short of its last page numbers (loose pages it never writes), so
 * comparing the size with them would refuse good checkpoints. */
static char bus_file[1300];
static size_t bus_len;
static int bus_users;
static struct sigaction bus_old;

__thread sigjmp_buf *psd_ckpt_bus_jmp;
static char bus_unlink[PSD_CKPT_BUS_UNLINK][1300]; /* psd_ckpt_bus_unlink */
static volatile int bus_nunlink;

void psd_ckpt_bus_unlink(const char *dir, const char *const *files, int n)
{
    if (dir == NULL || n > PSD_CKPT_BUS_UNLINK) n = dir ? PSD_CKPT_BUS_UNLINK : 0;
    bus_nunlink = 0; /* none named while the paths change */
    for (int i = 0; i < n; i++)
        snprintf(bus_unlink[i], sizeof bus_unlink[i], "%s/%s", dir, files[i]);
    bus_nunlink = n;
}

/* Remove the files psd_ckpt_bus_unlink named (a restore's new ones; async-signal-safe). */
static void unlink_named(void)
{
    for (int i = 0; i < bus_nunlink; i++) unlink(bus_unlink[i]);
}

int psd_ckpt_bus_unlink_now(void)
{
    int n = bus_nunlink;
    unlink_named();
    return n;
}

static void on_sigbus(int sig)
{
    (void)sig;
    sigjmp_buf *back = psd_ckpt_bus_jmp;
    if (back) { /* a serving psd's reader: it refuses that source and goes on */
        psd_ckpt_bus_jmp = NULL;
        siglongjmp(*back, 1);
    }
    unlink_named();
    static const char why[] = ": a page lies past the end of the file (a checkpoint copy cut "
                              "short or damaged): not a checkpoint psd can read\n";
    if (write(2, bus_file, bus_len) < 0 || write(2, why, sizeof why - 1) < 0) _exit(1);
    _exit(1);
}

/* LMDB asserts, and aborts, on some damage a walk meets (a byte flipped in a branch page:
 * "mdb.c:5921: Assertion 'IS_LEAF(mp)' failed in mdb_cursor_next()", psd --restore exit 134
 * with the restore's files left: a probe, session 46). Handled as a page past the end is: a
 * serving psd's reader refuses the source; else the restore's new files go and the process
 * ends naming the file (exit 1). Never returns (LMDB aborts when it does). */
static void on_mdb_assert(MDB_env *env, const char *msg)
{
    sigjmp_buf *back = psd_ckpt_bus_jmp;
    if (back) {
        psd_ckpt_bus_jmp = NULL;
        siglongjmp(*back, 2);
    }
    unlink_named();
    const char *dir = NULL;
    if (mdb_env_get_path(env, &dir) != 0 || dir == NULL) dir = "a checkpoint";
    fprintf(stderr, "%s/data.mdb: damaged, LMDB cannot walk it (%s): not a checkpoint psd can "
            "read (psctl verify --against names the damage)\n", dir, msg);
    _exit(1);
}

static void bus_guard(const char *path)
{
    snprintf(bus_file, sizeof bus_file, "%s/data.mdb", path);
    bus_len = strlen(bus_file);
    if (__atomic_fetch_add(&bus_users, 1, __ATOMIC_ACQ_REL) == 0) {
        struct sigaction sa = {.sa_handler = on_sigbus};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, &bus_old);
    }
}

static void bus_unguard(void)
{
    if (__atomic_sub_fetch(&bus_users, 1, __ATOMIC_ACQ_REL) == 0) sigaction(SIGBUS, &bus_old, NULL);
}

/* LMDB 0.9's meta pages (lmdb's mdb.c; x86-64): a 16-byte page header, then MDB_meta's magic,
 * version, address, map size and the free DB's record, whose first word is the page size. */
#define LMDB_MAGIC 0xBEEFC0DEu
#define LMDB_VERSION 1u
#define META_MAGIC_AT 16
#define META_VERSION_AT 20
#define META_PSIZE_AT 40

static uint32_t rd32_at(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* DIR/shard-J/data.mdb before LMDB opens it, which trusts its header: a FIFO hung the open, a
 * page size of 0 divided by zero (SIGFPE). A regular file, not empty, whose two meta pages
 * carry LMDB's magic and version and one page size (a power of two, 512 to 65536) that the
 * file holds twice. Returns 0 or a PSD_CKPT_E* code. */
static int check_data_file(const char *path)
{
    struct stat st;
    int fd = ps_open_regular(path, 0, &st);
    if (fd < 0) return fd == -EINVAL ? PSD_CKPT_ENOTREG : -fd;
    int rc = 0;
    uint8_t m0[64], m1[64];
    uint32_t psize = 0;
    if (st.st_size == 0)
        rc = PSD_CKPT_EEMPTY;
    else if (pread(fd, m0, sizeof m0, 0) != (ssize_t)sizeof m0)
        rc = PSD_CKPT_EHEADER;
    else if ((psize = rd32_at(m0 + META_PSIZE_AT)) < 512 || psize > 65536 ||
             (psize & (psize - 1)) || (uint64_t)st.st_size < 2 * (uint64_t)psize ||
             pread(fd, m1, sizeof m1, psize) != (ssize_t)sizeof m1)
        rc = PSD_CKPT_EHEADER;
    else if (rd32_at(m0 + META_MAGIC_AT) != LMDB_MAGIC || rd32_at(m1 + META_MAGIC_AT) != LMDB_MAGIC ||
             rd32_at(m0 + META_VERSION_AT) != LMDB_VERSION ||
             rd32_at(m1 + META_VERSION_AT) != LMDB_VERSION || rd32_at(m1 + META_PSIZE_AT) != psize)
        rc = PSD_CKPT_EHEADER;
    close(fd);
    return rc;
}

const char *psd_ckpt_src_strerror(int rc)
{
    switch (rc) {
    case PSD_CKPT_ENOTREG: return "data.mdb is not a regular file";
    case PSD_CKPT_EEMPTY: return "data.mdb is empty";
    case PSD_CKPT_EHEADER:
        return "data.mdb's header is not an LMDB 0.9 environment's (magic, version or page "
               "size wrong, or the file shorter than its two meta pages)";
    default: return mdb_strerror(rc);
    }
}

int psd_ckpt_src_open(psd_ckpt_src_t *s, const char *dir, uint32_t j, uint64_t map_mb)
{
    char path[1200], data[1220];
    snprintf(path, sizeof path, "%s/shard-%u", dir, j);
    snprintf(data, sizeof data, "%s/data.mdb", path);
    memset(s, 0, sizeof *s);
    int rc;
    if ((rc = check_data_file(data)) != 0) return rc;
    if ((rc = mdb_env_create(&s->env)) != 0) return rc;
    mdb_env_set_assert(s->env, on_mdb_assert);
    if ((rc = mdb_env_set_mapsize(s->env, (size_t)map_mb << 20)) != 0 ||
        (rc = mdb_env_open(s->env, path, MDB_RDONLY | MDB_NOLOCK, 0600)) != 0 ||
        (rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &s->txn)) != 0)
        goto fail;
    /* A fault ends a process without a reader's jump (psctl) at _exit: what it printed before
     * goes out first (verify --against lost shard 0's lines to shard 1's fault: a review). */
    fflush(stdout);
    bus_guard(path); /* from the first read of a page on */
    s->guarded = 1;
    if ((rc = mdb_dbi_open(s->txn, NULL, 0, &s->dbi)) == 0) return 0;
fail:
    psd_ckpt_src_close(s);
    return rc;
}

void psd_ckpt_src_close(psd_ckpt_src_t *s)
{
    if (s->txn) mdb_txn_abort(s->txn);
    if (s->env) mdb_env_close(s->env);
    if (s->guarded) bus_unguard();
    memset(s, 0, sizeof *s);
}

/* What the state of optimizer @p name (a checkpoint's meta.json) holds; "unknown" for a name
 * this build does not know. */
static const char *state_of(const char *name)
{
    for (int k = 0; k < PSK_OPTIM_KINDS; k++)
        if (strcmp(name, ps_optim_name((ps_optim_kind_t)k)) == 0)
            return psk_optim_state_name((psk_optim_kind_t)k);
    return "unknown";
}

int psd_ckpt_meta_fits(const char *j0, const ps_manifest_t *m, char *why, size_t len)
{
    char cl[256] = "", opt[64] = "", cons[16] = "";
    psd_ckpt_meta_field(j0, "cluster", cl, sizeof cl);
    psd_ckpt_meta_field(j0, "optimizer", opt, sizeof opt);
    psd_ckpt_meta_field(j0, "consistency", cons, sizeof cons); /* "" in none: not compared */
    uint64_t cb = psd_ckpt_meta_u64(j0, "chunk_bytes"), ns = psd_ckpt_meta_u64(j0, "optimizer_state");
    psk_optim_kind_t kind = (psk_optim_kind_t)m->job.optimizer.name;
    uint32_t nstate = (uint32_t)psk_optim_state_count(kind);
    bool cons_bsp = strcmp(cons, "bsp") == 0, want_bsp = m->job.consistency == PS_CONSIST_BSP;
    if (strcmp(cl, m->cluster) != 0)
        snprintf(why, len, "the checkpoint is of cluster '%s', this manifest's cluster is '%s'",
                 cl, m->cluster);
    else if (cb != m->chunk_bytes)
        snprintf(why, len, "the checkpoint has chunk_bytes %llu, this manifest %llu",
                 (unsigned long long)cb, (unsigned long long)m->chunk_bytes);
    else if (ns != nstate)
        snprintf(why, len, "the checkpoint's optimizer %s keeps %llu state floats per parameter, "
                 "this manifest's %s keeps %u", opt, (unsigned long long)ns,
                 ps_optim_name(m->job.optimizer.name), nstate);
    else if (strcmp(state_of(opt), psk_optim_state_name(kind)) != 0)
        snprintf(why, len, "the checkpoint's optimizer %s keeps %s, this manifest's %s keeps %s",
                 opt, state_of(opt), ps_optim_name(m->job.optimizer.name),
                 psk_optim_state_name(kind));
    else if (cons[0] && cons_bsp != want_bsp) /* a review, session 72: restored silently */
        snprintf(why, len, "the checkpoint was taken under %s, this manifest's job is %s: bsp "
                 "counts steps, asp and ssp each worker's batches, so its chunks' versions "
                 "would mean another thing", cons, ps_consistency_name(m->job.consistency));
    else
        return 0;
    return PS_ECONFIG;
}
