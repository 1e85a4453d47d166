/* pushshm.c: direct pushes, psd's side.
 *
 * A worker on this shard's host may write a raw gradient chunk into shared memory and send only
 * the header (PS_FLAG_DIRECT, area_offset): no rendezvous, no CMA read on psd's loop thread, and
 * the worker folds the CRC-32C into its copy (ps_crc32c_copy) instead of reading the gradient
 * once more. Each worker connection gets its own area, a sealed memfd (it cannot shrink under
 * psd) that psd maps read-only and the worker opens through /proc/<psd pid>/fd/<fd>. A slot
 * filled that way points into the area and holds a reference on it, so the area outlives a
 * dropped connection for as long as a push of it waits to be applied; a confused or late peer
 * can only write into its own area, which reaches nothing but its own pushes. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "envflag.h"
#include "ps/ps_log.h"
#include "server.h"
#include "storeview.h"

struct psd_area_s {
    uint8_t *base; /* mapped read-only */
    size_t size;
    int fd;
    int refs;
    uint64_t id; /* ps_storeview_file_id of the memfd */
};

bool psd_push_direct_enabled(void)
{
    return !ps_env_off("PS_DIRECT_PUSH");
}

static psd_area_t *area_new(size_t size)
{
    psd_area_t *a = calloc(1, sizeof *a);
    if (a == NULL) return NULL;
    /* PS_TEST_AREA_FILE (a test hook): offer that plain file, unsealed, as a confused shard
     * would; libps must not write into it. */
    const char *plain = getenv("PS_TEST_AREA_FILE");
    bool sealed = plain == NULL || *plain == '\0';
    a->fd = sealed ? memfd_create("psd-push-area", MFD_CLOEXEC | MFD_ALLOW_SEALING)
                   : open(plain, O_RDWR | O_CLOEXEC);
    if (a->fd < 0 || ftruncate(a->fd, (off_t)size) != 0 ||
        (sealed && fcntl(a->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) ||
        (a->id = ps_storeview_file_id(a->fd)) == 0)
        goto fail;
    a->base = mmap(NULL, size, PROT_READ, MAP_SHARED | MAP_NORESERVE, a->fd, 0);
    if (a->base == MAP_FAILED) goto fail;
    a->size = size;
    a->refs = 1;
    return a;
fail:
    PS_LOG(PS_LOG_WARN, "server", "no push area (%s): this worker pushes over the transport",
           strerror(errno));
    if (a->fd >= 0) close(a->fd);
    free(a);
    return NULL;
}

void psd_area_ref(psd_area_t *a) { a->refs++; }

void psd_area_unref(psd_area_t *a)
{
    if (a == NULL || --a->refs > 0) return;
    munmap(a->base, a->size);
    close(a->fd);
    free(a);
}

/* An area's bytes: the store's map size (more than the shard's parameters), at most 64 GiB of
 * address space per connection (only what a worker writes takes memory). */
#define AREA_MAX (64ull << 30)

void psd_hello_area(psd_server_t *srv, psd_conn_t *c, const ps_msg_t *hello, ps_msg_t *reply)
{
    if (hello->store_id == 0 || hello->store_id != ps_storeview_host_id())
        return; /* a worker on another host, or a host that cannot tell */
    uint64_t size = (uint64_t)srv->m.map_size_mb << 20;
    if (size > AREA_MAX) size = AREA_MAX;
    if (c->area == NULL && srv->push_direct) c->area = area_new((size_t)size);
    if (c->area == NULL) return;
    reply->pid = (uint32_t)getpid();
    reply->area_fd = (uint32_t)c->area->fd;
    reply->area_id = c->area->id;
    reply->area_size = c->area->size;
}

const uint8_t *psd_area_data(psd_conn_t *c, uint64_t offset, uint64_t len, uint64_t need,
                             psd_area_t **area, const char **why)
{
    psd_area_t *a = c->area;
    if (a == NULL)
        *why = "this connection has no push area";
    else if (offset % 64 != 0)
        *why = "the offset is not 64-byte aligned";
    else if (offset > a->size || len > a->size - offset)
        *why = "the bytes are not inside the push area";
    else if (offset > need || len > need - offset)
        /* A page psd reads takes memory even when nobody wrote it: pushes spread over the
         * whole area (up to 64 GiB) made psd allocate it (a review, session 58). libps
         * places each chunk once per area, page-rounded, one after the other. */
        *why = "the bytes lie beyond the places this shard's chunks take in a push area";
    else {
        *area = a;
        return a->base + offset;
    }
    return NULL;
}
