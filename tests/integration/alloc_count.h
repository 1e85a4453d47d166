/* alloc_count.h: the counter file that alloc_count.so (LD_PRELOAD) keeps for one process, and
 * how a test reads it (test code, not part of psd).
 *
 * alloc_count.so counts the allocations (malloc, calloc, realloc, aligned_alloc, memalign,
 * posix_memalign) that one object's own code makes: those whose caller's return address lies
 * in an executable segment of the object named by ALLOC_COUNT_OBJ (a substring of its path,
 * e.g. "libucp"; empty or unset: the main program). Allocations that the object's code leaves to
 * another library (UCX, LMDB, libuv, libc's strdup) are not counted. The counts live in the
 * file ALLOC_COUNT_FILE, mapped shared, so another process can read them while this one runs.
 * A program that runs with it preloaded can also make the next allocation of its calling thread
 * from the object fail (alloc_count_fail_next, declared weak there: faults' asp_client).
 */
#ifndef PS_TEST_ALLOC_COUNT_H
#define PS_TEST_ALLOC_COUNT_H

#include <stdint.h>

#define ALLOC_COUNT_SITES 512 /* distinct sites; psd makes ~100 while it starts */

typedef struct {
    uint64_t magic;    /* ALLOC_COUNT_MAGIC once the object was found and counting began */
    uint64_t calls;    /* allocations made from the object's code */
    uint64_t overflow; /* of those, the ones from a site that found no free entry below */
    struct {
        uint64_t off; /* the return address's offset in the object (for addr2line); 0: free */
        uint64_t n;
    } site[ALLOC_COUNT_SITES];
} alloc_count_t;

#define ALLOC_COUNT_MAGIC 0x74636f6c6c61ull /* "alloct" */

#endif
