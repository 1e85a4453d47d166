/* durable.c: see durable.h. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "durable.h"
#include "regfile.h"

int ps_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = fsync(fd) ? -errno : 0;
    close(fd);
    return rc;
}

int ps_mkdir_durable(const char *dir)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp) return -ENAMETOOLONG;
    size_t len = strlen(tmp);
    if (len == 0) return -ENOENT;
    while (len > 1 && tmp[len - 1] == '/') tmp[--len] = '\0';
    for (char *p = tmp + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        int made = mkdir(tmp, 0700) == 0, there = 0;
        if (!made && errno == EEXIST && c == '\0') {
            /* The directory asked for was there: made by someone else (psctl's mark of a
             * checkpoint, a user) maybe without a sync of its entry, which a power loss would
             * take with what is then written under it (a review). Synced here as if new, as
             * far as its parent lets (one we may not read, or a filesystem that syncs no
             * directory, refused what worked before: a review). */
            struct stat st;
            if (stat(tmp, &st) != 0) return -errno;
            if (!S_ISDIR(st.st_mode)) return -ENOTDIR;
            made = there = 1;
        }
        if (made) {
            /* A new entry: its parent is synced, so the path survives a power loss. */
            char *slash = strrchr(tmp, '/');
            int rc;
            if (slash == NULL) {
                rc = ps_fsync_dir(".");
            } else if (slash == tmp) {
                rc = ps_fsync_dir("/");
            } else {
                *slash = '\0';
                rc = ps_fsync_dir(tmp);
                *slash = '/';
            }
            if (rc && !(there && (rc == -EACCES || rc == -EINVAL || rc == -EPERM))) return rc;
        } else if (errno != EEXIST) {
            return -errno;
        } else {
            struct stat st;
            if (stat(tmp, &st) != 0) return -errno;
            if (!S_ISDIR(st.st_mode)) return -ENOTDIR;
        }
        *p = c;
        if (c == '\0') break;
    }
    return 0;
}

int ps_rename_durable(const char *tmp, const char *path)
{
    if (rename(tmp, path)) return -errno;
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else if ((size_t)(slash - path) < sizeof dir)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else
        return -ENAMETOOLONG;
    return ps_fsync_dir(dir);
}

/* ps_out_file_check without the store rule. */
static int out_file_node(const char *path, char *out, size_t outcap, char *err, size_t errlen)
{
    struct stat l, st;
    int rc = 0;
    if (lstat(path, &l) != 0) {
        if (errno != ENOENT) {
            rc = -errno;
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            return rc;
        }
        l.st_mode = S_IFREG; /* absent: made */
    }
    if (S_ISLNK(l.st_mode)) {
        char *target = NULL;
        if (stat(path, &st) != 0) {
            rc = -errno;
            if (errno == ENOENT)
                snprintf(err, errlen, "%s is a symlink to nothing: give the path of a file", path);
            else
                snprintf(err, errlen, "%s: %s", path, strerror(errno));
            return rc;
        }
        if (!S_ISREG(st.st_mode)) {
            snprintf(err, errlen, "%s is a symlink to %s, not to a regular file: a file renamed "
                     "there would replace it; give the path of a file", path,
                     ps_file_kind(&st));
            return -EEXIST;
        }
        if ((target = realpath(path, NULL)) == NULL) {
            rc = -errno;
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            return rc;
        }
        if (strlen(target) >= outcap) rc = -ENAMETOOLONG;
        else snprintf(out, outcap, "%s", target);
        free(target);
        if (rc) snprintf(err, errlen, "%s: the file it links to has too long a path", path);
        return rc;
    }
    if (!S_ISREG(l.st_mode)) {
        snprintf(err, errlen, "%s is %s, not a regular file: a file renamed there would replace "
                 "it; give the path of a file", path, ps_file_kind(&l));
        return -EEXIST;
    }
    if (strlen(path) >= outcap) {
        snprintf(err, errlen, "%s: path too long", path);
        return -ENAMETOOLONG;
    }
    snprintf(out, outcap, "%s", path);
    return 0;
}

int ps_out_file_check(const char *path, char *out, size_t outcap, char *err, size_t errlen)
{
    if (path[0] == '\0') { /* psworker trained a whole job, then failed "No such file" */
        snprintf(err, errlen, "'': an empty file name; give the path of a file");
        return -EINVAL;
    }
    int rc = out_file_node(path, out, outcap, err, errlen);
    if (rc) return rc;
    /* Never into an LMDB environment: a psd data_dir or a checkpoint's part, whose data.mdb the
     * rename replaced (a probe, session 50: `psctl export --out DATA_DIR/data.mdb` exited 0,
     * and the shard's store was gone at its next start, "File is not an LMDB file"). */
    char beside[PATH_MAX + 16]; /* data.mdb in the file's directory */
    const char *slash = strrchr(out, '/');
    const char *base = slash ? slash + 1 : out;
    if (slash)
        snprintf(beside, sizeof beside, "%.*s/data.mdb", (int)(slash - out), out);
    else
        snprintf(beside, sizeof beside, "data.mdb");
    struct stat st;
    /* The file is written beside its name and renamed there: its directory must be one
     * (before, `psctl export --out nodir/x` snapshotted every shard first and then failed,
     * exit 1 where every other refused --out is 2; a review, session 71). */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash == out ? 1 : slash - out) : 1,
             slash ? out : ".");
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        int e = errno;
        if (stat(dir, &st) == 0) {
            snprintf(err, errlen, "%s: its directory %s is %s, not a directory", path, dir,
                     ps_file_kind(&st));
            return -ENOTDIR;
        }
        snprintf(err, errlen, "%s: its directory %s: %s", path, dir, strerror(e));
        return -e;
    }
    if (strcmp(base, "data.mdb") == 0 || strcmp(base, "lock.mdb") == 0 ||
        lstat(beside, &st) == 0) {
        snprintf(err, errlen, "%s is in an LMDB store's directory (a psd data_dir or a "
                 "checkpoint's part holds data.mdb and lock.mdb): a file written there could "
                 "replace the store; give a path outside it", path);
        return -EEXIST;
    }
    return 0;
}

/* @p path (PATH_MAX bytes) rewritten in place by its names: repeated slashes and "." names
 * dropped, and "X/.." taken out where X does not exist (it will be made as a directory, so
 * that is where ".." then leads); a ".." after an X that exists is left for the kernel (X may
 * be a link elsewhere). Without this the walk up the absent names below passed over "A/X/.."
 * to A, not to A/..'s target: the default "<data_dir>/../checkpoints" of a shard whose
 * data_dir was not made yet was taken with a file at <data_dir's parent>/checkpoints (a README
 * audit, session 73), and every checkpoint failed later. An empty result is "/" or ".". */
static void drop_absent_dotdot(char *path)
{
    char out[PATH_MAX];
    size_t len = 0;
    bool abs = path[0] == '/';
    if (abs) out[len++] = '/';
    out[len] = '\0';
    for (char *name = path, *end; *name; name = end) {
        while (*name == '/') name++;
        end = name + strcspn(name, "/");
        size_t n = (size_t)(end - name);
        if (n == 0 || (n == 1 && name[0] == '.')) continue;
        const char *last = strrchr(out, '/');
        last = last ? last + 1 : out; /* the name out ends with ("" for none) */
        struct stat st;
        if (n == 2 && name[0] == '.' && name[1] == '.' && *last && strcmp(last, "..") != 0 &&
            stat(out, &st) != 0 && errno == ENOENT) {
            len = (size_t)(last - out); /* X out, and its slash unless it is the root's */
            if (len > (abs ? 1u : 0u)) len--;
            out[len] = '\0';
            continue;
        }
        if (len + (len > (abs ? 1u : 0u)) + n >= sizeof out) return; /* cannot grow: as it was */
        if (len > (abs ? 1u : 0u)) out[len++] = '/';
        memcpy(out + len, name, n);
        out[len += n] = '\0';
    }
    snprintf(path, PATH_MAX, "%s", len ? out : ".");
}

int ps_dir_makeable(const char *dir, char *err, size_t errlen)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
        snprintf(err, errlen, "%.200s...: path too long", dir);
        return -ENAMETOOLONG;
    }
    drop_absent_dotdot(path);
    for (;;) {
        size_t len = strlen(path); /* "a/f/" is "a/f": a file there is in the way too */
        while (len > 1 && path[len - 1] == '/') path[--len] = '\0';
        struct stat st;
        if (stat(path, &st) == 0) {
            if (!S_ISDIR(st.st_mode)) {
                snprintf(err, errlen, "%s is %s, not a directory", path, ps_file_kind(&st));
                return -ENOTDIR;
            }
            if (access(path, W_OK | X_OK) != 0) {
                int e = errno;
                snprintf(err, errlen, "%s: cannot make anything in it: %s", path, strerror(e));
                return -e;
            }
            return 0;
        }
        if ((errno != ENOENT && errno != ENOTDIR) || strcmp(path, ".") == 0 ||
            strcmp(path, "/") == 0) { /* never absent, but a loop must end */
            int e = errno;
            snprintf(err, errlen, "%s: %s", path, strerror(e));
            return -e;
        }
        /* Absent (or under a file, found further up): look at its parent. */
        char *slash = strrchr(path, '/');
        if (slash == NULL) {
            snprintf(path, sizeof path, ".");
            continue;
        }
        if (slash == path) slash[1] = '\0'; /* "/" */
        else *slash = '\0';
    }
}
