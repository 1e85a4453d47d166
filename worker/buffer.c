/* buffer.c: memory for tensors that travel (ps_buffer_alloc), backed by 2 MiB pages where the
 * kernel allows.
 *
 * A same-host transfer (UCX cma) is a process_vm_readv by the receiver, which pins the
 * sender's pages one page table entry at a time: with 4 KiB pages, pinning costs about half
 * as much as the copy itself (perf, psbench's bsp step). A transparent huge page is pinned
 * in one step. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "ps/ps_client.h"

#define HUGE_BYTES ((size_t)2 << 20)
/* From here up a buffer gets whole huge pages of its own: a 1 MiB one takes a 2 MiB page
 * (1 MiB round 1x1 shm +22%, push +33% against 4 KiB pages, psbench). */
#define MAPPED_MIN ((size_t)1 << 20)

/* Large buffers are mapped whole (zeroed pages, faulted in on first touch), so the size
 * tells ps_buffer_free which kind it is. */
static size_t mapped_len(size_t bytes)
{
    return bytes < MAPPED_MIN ? 0 : (bytes + HUGE_BYTES - 1) & ~(HUGE_BYTES - 1);
}

void *ps_buffer_alloc(size_t bytes)
{
    if (bytes > SIZE_MAX - 2 * HUGE_BYTES) return NULL; /* the rounding below would wrap */
    size_t len = mapped_len(bytes);
    if (len == 0) return calloc(1, bytes ? bytes : 1);
    /* Map one huge page more and trim, so the buffer starts on a 2 MiB boundary. */
    uint8_t *m = mmap(NULL, len + HUGE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    if (m == MAP_FAILED) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)m + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
    size_t head = (size_t)(p - m); /* < HUGE_BYTES, so the tail is never empty */
    if (head) munmap(m, head);
    munmap(p + len, HUGE_BYTES - head);
    /* Advice only: it fails on a kernel without THP, and with THP "never" it is ignored;
     * either way 4 KiB pages serve. */
    (void)madvise(p, len, MADV_HUGEPAGE);
    return p;
}

void ps_buffer_free(void *p, size_t bytes)
{
    if (p == NULL) return;
    size_t len = mapped_len(bytes);
    if (len == 0)
        free(p);
    else
        munmap(p, len);
}
