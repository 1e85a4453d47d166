/* samehost.c: libps's same-host paths to a shard: the read-only view of its store that direct
 * pulls read (common/storeview.c), and the shared-memory push area direct pushes write into
 * (psd's server/pushshm.c), each opened once a hello reply offers it. */
#include <sys/stat.h>

#include "client_internal.h"

/* Open the view of shard @p s's store that its hello reply offered, or close one it no longer
 * offers (a restarted shard names its store again: a new file is opened anew). */
void ps__view_update(ps_client_t *c, cshard_t *s)
{
    if (s->view.env && (!s->view_open || s->view.id != s->store_id)) {
        ps_storeview_close(&s->view);
        __atomic_store_n(&s->view_open, 0, __ATOMIC_RELAXED); /* ps_client_direct */
    }
    if (s->view_open || !c->direct || s->store_id == 0 || s->view_tried == s->store_id) return;
    s->view_tried = s->store_id;
    char err[512];
    uint32_t i = (uint32_t)(s - c->shards);
    if (ps_storeview_open(&s->view, s->store, s->store_id, err, sizeof err) == 0) {
        __atomic_store_n(&s->view_open, 1, __ATOMIC_RELAXED);
        PS_LOG(PS_LOG_INFO, "libps", "shard %u: pulls read its store %s directly", i, s->store);
    } else {
        /* A shard offers its store only to a worker on its host (the hello's host id): a
         * cause to fix (another user, a mount this process does not see), said once per offer
         * (a review, session 72: at debug level before). */
        PS_LOG(PS_LOG_WARN, "libps", "shard %u: its store is on this host, but pulls go over "
               "the transport, slower (%s)", i, err);
    }
}

void ps__area_unmap(cshard_t *s)
{
    if (s->area) munmap(s->area, s->area_size);
    __atomic_store_n(&s->area, NULL, __ATOMIC_RELAXED); /* ps_client_direct reads it */
    s->area_size = 0;
    s->area_id = 0;
}

/* The seals psd puts on a push area (server/pushshm.c): only a memfd carries them, so a reply
 * naming some other file of this worker's (a dataset, a checkpoint) is not written into (a
 * review, session 58). */
#define AREA_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

/* Whether @p fd carries them. F_GET_SEALS fails (-1, every bit set) on a file of a filesystem
 * without seals (ext4, xfs): such a file passed before (a review, session 72). */
static bool sealed(int fd)
{
    int seals = fcntl(fd, F_GET_SEALS);
    return seals >= 0 && (seals & AREA_SEALS) == AREA_SEALS;
}

/* Map the push area shard @p s offered (its own connection's: /proc/<psd pid>/fd/<fd>), if its
 * identity is the one offered and it is sealed as psd seals it. */
void ps__area_update(ps_client_t *c, cshard_t *s)
{
    if (s->area || !c->direct_push || s->area_offer_id == 0 || s->area_tried == s->area_offer_id)
        return;
    s->area_tried = s->area_offer_id;
    uint32_t i = (uint32_t)(s - c->shards);
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/fd/%u", s->area_pid, s->area_fd);
    /* What the path names is checked before it is opened: a regular file (a memfd) with the
     * identity offered, never some other process's device or pipe. */
    struct stat st;
    void *a = MAP_FAILED;
    int fd = -1;
    const char *why = NULL;
    if (stat(path, &st) != 0)
        why = strerror(errno);
    else if (!S_ISREG(st.st_mode) || ps_storeview_stat_id(&st) != s->area_offer_id)
        why = "not the file offered";
    else if ((fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY)) < 0)
        why = strerror(errno);
    else if (ps_storeview_file_id(fd) != s->area_offer_id || fstat(fd, &st) != 0 ||
             (uint64_t)st.st_size < s->area_offer_size || s->area_offer_size == 0)
        why = "not the file offered, or not of the size offered";
    else if (!sealed(fd))
        why = "not psd's sealed memory: a plain file";
    else if ((a = mmap(NULL, s->area_offer_size, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_NORESERVE, fd, 0)) == MAP_FAILED)
        why = strerror(errno);
    if (fd >= 0) close(fd);
    if (a == MAP_FAILED) { /* offered to a worker on its host: said once per offer, as above */
        PS_LOG(PS_LOG_WARN, "libps", "shard %u: pushes go over the transport, slower: the push "
               "area it offers at %s is not one this process may write (%s)", i, path, why);
        return;
    }
    /* A child this process forks (a data loader's) neither keeps nor writes the area. */
    madvise(a, s->area_offer_size, MADV_DONTFORK);
    __atomic_store_n(&s->area, a, __ATOMIC_RELAXED);
    s->area_size = s->area_offer_size;
    s->area_id = s->area_offer_id;
    s->area_next = 0;
    s->area_gen++;
    PS_LOG(PS_LOG_INFO, "libps", "shard %u: pushes write into its shared memory directly", i);
}

/* Where chunk @p chunk of @p t (@p len bytes) goes in shard @p s's area, or UINT64_MAX when it
 * cannot go there now (no area, full, or its place may still be read by psd). */
uint64_t ps__area_place(cshard_t *s, ctensor_t *t, uint32_t chunk, uint64_t len)
{
    if (s->area == NULL || t->places == NULL) return UINT64_MAX;
    area_place_t *pl = &t->places[chunk];
    if (pl->gen != s->area_gen) {
        uint64_t need = ps_area_place_bytes(len);
        if (need > s->area_size - s->area_next) return UINT64_MAX;
        *pl = (area_place_t){.off = s->area_next, .gen = s->area_gen};
        s->area_next += need;
    }
    return pl->busy ? UINT64_MAX : pl->off;
}
