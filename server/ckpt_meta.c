/* ckpt_meta.c: reading a checkpoint's files (see ckpt_meta.h). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_meta.h"
#include "manifest.h"

char *psd_ckpt_meta_read(const char *dir, uint32_t j)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/shard-%u/%s", dir, j, PSD_CKPT_META);
    FILE *f = fopen(path, "r");
    if (f == NULL) return NULL;
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

/* Whether the data file of the environment open in @p s holds every page it uses (the last
 * page of the read transaction's snapshot). */
static bool src_whole(const psd_ckpt_src_t *s, const char *path)
{
    MDB_envinfo info;
    MDB_stat st;
    char file[1300];
    struct stat fs;
    snprintf(file, sizeof file, "%s/data.mdb", path);
    if (mdb_env_info(s->env, &info) || mdb_env_stat(s->env, &st) || stat(file, &fs)) return false;
    return (uint64_t)fs.st_size >= ((uint64_t)info.me_last_pgno + 1) * st.ms_psize;
}

int psd_ckpt_src_open(psd_ckpt_src_t *s, const char *dir, uint32_t j, uint64_t map_mb)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/shard-%u", dir, j);
    memset(s, 0, sizeof *s);
    int rc;
    if ((rc = mdb_env_create(&s->env)) != 0) return rc;
    if ((rc = mdb_env_set_mapsize(s->env, (size_t)map_mb << 20)) != 0 ||
        (rc = mdb_env_open(s->env, path, MDB_RDONLY | MDB_NOLOCK, 0600)) != 0 ||
        (rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &s->txn)) != 0 ||
        (rc = src_whole(s, path) ? 0 : MDB_CORRUPTED) != 0 ||
        (rc = mdb_dbi_open(s->txn, NULL, 0, &s->dbi)) != 0)
        psd_ckpt_src_close(s);
    return rc;
}

void psd_ckpt_src_close(psd_ckpt_src_t *s)
{
    if (s->txn) mdb_txn_abort(s->txn);
    if (s->env) mdb_env_close(s->env);
    memset(s, 0, sizeof *s);
}
