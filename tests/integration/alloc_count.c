/* alloc_count.c: alloc_count.so, LD_PRELOAD'd into psd or a libps client by the hot-path test
 * (test_cluster.c, hot_path_allocations): counts the allocations one object's own code makes
 * (alloc_count.h says which and where). Test code, not part of psd.
 *
 * It forwards to glibc's __libc_* entry points, so it needs no dlsym (which may allocate) and
 * works from the first call on. Nothing is counted until the constructor found the object and
 * mapped the counter file (a new one: it refuses a file that exists); a process without
 * ALLOC_COUNT_FILE runs as if it were not loaded. */
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "alloc_count.h"

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);

#define MAX_RANGES 8

static alloc_count_t *counts; /* NULL: not counting */
static uintptr_t base, lo[MAX_RANGES], hi[MAX_RANGES];
static int nranges;

/* alloc_count_fail_next: the next allocation this thread makes from the object fails. */
static __thread int fail_next;

/* For a test program that runs with this library preloaded (it declares the function weak, and
 * calls it if it is there): the next allocation the calling thread makes from the object's code
 * returns NULL with errno ENOMEM, as if memory ran out there. Counting must be on. */
void alloc_count_fail_next(void);
void alloc_count_fail_next(void) { fail_next = 1; }

/* Count one allocation whose caller returns to @p ra, when that is in the object; true when it
 * is to fail (alloc_count_fail_next). */
static bool count(void *ra)
{
    alloc_count_t *c = counts;
    uintptr_t a = (uintptr_t)ra;
    int in = 0;
    for (int i = 0; i < nranges && !in; i++) in = a >= lo[i] && a < hi[i];
    if (c == NULL || !in) return false;
    if (fail_next) {
        fail_next = 0;
        return true;
    }
    __atomic_add_fetch(&c->calls, 1, __ATOMIC_RELAXED);
    uint64_t off = a - base;
    for (int i = 0; i < ALLOC_COUNT_SITES; i++) {
        uint64_t cur = __atomic_load_n(&c->site[i].off, __ATOMIC_ACQUIRE);
        if (cur == 0 && __atomic_compare_exchange_n(&c->site[i].off, &cur, off, false,
                                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            cur = off;
        if (cur == off) {
            __atomic_add_fetch(&c->site[i].n, 1, __ATOMIC_RELAXED);
            return false;
        }
    }
    __atomic_add_fetch(&c->overflow, 1, __ATOMIC_RELAXED);
    return false;
}

/* The NULL of an allocation made to fail. */
static void *failed(void)
{
    errno = ENOMEM;
    return NULL;
}

void *malloc(size_t n)
{
    if (count(__builtin_return_address(0))) return failed();
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t size)
{
    if (count(__builtin_return_address(0))) return failed();
    return __libc_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
    if (count(__builtin_return_address(0))) return failed();
    return __libc_realloc(p, n);
}

void *aligned_alloc(size_t align, size_t n)
{
    if (count(__builtin_return_address(0))) return failed();
    return __libc_memalign(align, n);
}

void *memalign(size_t align, size_t n)
{
    if (count(__builtin_return_address(0))) return failed();
    return __libc_memalign(align, n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    if (count(__builtin_return_address(0))) return ENOMEM;
    if (align < sizeof(void *) || (align & (align - 1)) != 0) return EINVAL;
    int saved = errno; /* posix_memalign leaves errno alone */
    void *p = __libc_memalign(align, n);
    errno = saved;
    if (p == NULL) return ENOMEM;
    *out = p;
    return 0;
}

/* dl_iterate_phdr: the executable segments of the first object whose path contains the wanted
 * name (the main program, listed first with an empty name, when the name is empty). */
static int find_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    const char *want = arg;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    if (*want ? strstr(name, want) == NULL : *name != '\0') return 0;
    base = (uintptr_t)info->dlpi_addr;
    for (int i = 0; i < info->dlpi_phnum && nranges < MAX_RANGES; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        lo[nranges] = base + ph->p_vaddr;
        hi[nranges] = lo[nranges] + ph->p_memsz;
        nranges++;
    }
    return 1;
}

__attribute__((constructor)) static void alloc_count_start(void)
{
    const char *path = getenv("ALLOC_COUNT_FILE"), *obj = getenv("ALLOC_COUNT_OBJ");
    if (path == NULL || *path == '\0') return;
    dl_iterate_phdr(find_object, (void *)(obj ? obj : ""));
    /* Not into the processes this one starts (psd's checkpoint follower): they would count
     * their own allocations. And a file of this process's only: O_EXCL. */
    unsetenv("LD_PRELOAD");
    if (nranges == 0) return; /* the reader sees no magic and says the object was not found */
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return;
    void *m = MAP_FAILED;
    if (ftruncate(fd, sizeof(alloc_count_t)) == 0)
        m = mmap(NULL, sizeof(alloc_count_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return;
    alloc_count_t *c = m;
    memset(c, 0, sizeof *c);
    __atomic_store_n(&c->magic, ALLOC_COUNT_MAGIC, __ATOMIC_RELEASE);
    counts = c;
}
