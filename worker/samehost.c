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
        /* Expected when the shard runs on another host. */
        PS_LOG(PS_LOG_DEBUG, "libps", "shard %u: pulls over the transport (%s)", i, err);
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
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
        ps_storeview_stat_id(&st) == s->area_offer_id &&
        (fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY)) >= 0 &&
        ps_storeview_file_id(fd) == s->area_offer_id && fstat(fd, &st) == 0 &&
        (uint64_t)st.st_size >= s->area_offer_size && s->area_offer_size > 0 &&
        (fcntl(fd, F_GET_SEALS) & AREA_SEALS) == AREA_SEALS)
        a = mmap(NULL, s->area_offer_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
                 fd, 0);
    if (fd >= 0) close(fd);
    /* A child this process forks (a data loader's) neither keeps nor writes the area. */
    if (a != MAP_FAILED) madvise(a, s->area_offer_size, MADV_DONTFORK);
    if (a == MAP_FAILED) {
        PS_LOG(PS_LOG_DEBUG, "libps", "shard %u: pushes over the transport (no push area at %s)",
               i, path);
        return;
    }
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
