/* gothook.c: a loaded library's calls of a libc function sent to another function, by writing
 * the slots the dynamic linker filled for them (the GOT entries of its PLT, and of calls through
 * function pointers taken with -fno-plt).
 *
 * libps uses it for UCX's socket calls where the executable does not define them itself
 * (common/sockhooks.c): a library that python loads cannot interpose recv for UCX, since the
 * dynamic linker binds UCX's calls to the first definition in the global scope, libc's. The
 * slots are found from each object's dynamic section (its relocation tables, symbol and string
 * tables); glibc has already made those addresses absolute in place, which is checked against
 * the object's base (an address below it is taken as relative). */
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gothook.h"

#if defined(__x86_64__) && defined(__linux__)
typedef struct {
    const char *const *libs;
    const ps_got_hook_t *hooks;
    size_t n;
    int set;
    char *err;
    size_t errlen;
    int failed;
} walk_t;

static int wanted(const char *path, const char *const *libs)
{
    if (path == NULL || *path == '\0') return 0;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (size_t i = 0; libs[i]; i++)
        if (strncmp(base, libs[i], strlen(libs[i])) == 0) return 1;
    return 0;
}

/* One relocation table: each slot of a hooked name set. */
static int patch_table(walk_t *w, struct dl_phdr_info *info, const ElfW(Rela) *rel, size_t size,
                       const ElfW(Sym) *symtab, const char *strtab, uintptr_t relro,
                       size_t relro_len)
{
    long page = sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < size / sizeof *rel; i++) {
        unsigned long type = ELF64_R_TYPE(rel[i].r_info);
        if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT) continue;
        const char *name = strtab + symtab[ELF64_R_SYM(rel[i].r_info)].st_name;
        for (size_t h = 0; h < w->n; h++) {
            if (strcmp(name, w->hooks[h].name) != 0) continue;
            uintptr_t slot = info->dlpi_addr + rel[i].r_offset;
            uintptr_t pg = slot & ~(uintptr_t)(page - 1);
            /* Read-only are the RELRO segment's whole pages only (glibc's _dl_protect_relro:
             * its start and end rounded down); a last page it shares with data stays writable. */
            uintptr_t lo = relro & ~(uintptr_t)(page - 1);
            uintptr_t hi = (relro + relro_len) & ~(uintptr_t)(page - 1);
            int ro = relro_len && pg >= lo && pg + (uintptr_t)page <= hi;
            if (ro && mprotect((void *)pg, (size_t)page, PROT_READ | PROT_WRITE) != 0) {
                snprintf(w->err, w->errlen, "%s: mprotect of its GOT: %s", info->dlpi_name,
                         strerror(errno));
                return -1;
            }
            __atomic_store_n((void **)slot, w->hooks[h].fn, __ATOMIC_RELEASE);
            if (ro) (void)mprotect((void *)pg, (size_t)page, PROT_READ);
            w->set++;
        }
    }
    return 0;
}

static int visit(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    walk_t *w = arg;
    if (!wanted(info->dlpi_name, w->libs)) return 0;
    const ElfW(Dyn) *dyn = NULL;
    uintptr_t relro = 0;
    size_t relro_len = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(info->dlpi_addr + ph->p_vaddr);
        if (ph->p_type == PT_GNU_RELRO) {
            relro = info->dlpi_addr + ph->p_vaddr;
            relro_len = ph->p_memsz;
        }
    }
    if (dyn == NULL) return 0;
    uintptr_t symtab = 0, strtab = 0, jmprel = 0, rela = 0;
    size_t pltrelsz = 0, relasz = 0;
    long pltrel = DT_RELA;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = d->d_un.d_ptr; break;
        case DT_STRTAB: strtab = d->d_un.d_ptr; break;
        case DT_JMPREL: jmprel = d->d_un.d_ptr; break;
        case DT_PLTRELSZ: pltrelsz = d->d_un.d_val; break;
        case DT_PLTREL: pltrel = (long)d->d_un.d_val; break;
        case DT_RELA: rela = d->d_un.d_ptr; break;
        case DT_RELASZ: relasz = d->d_un.d_val; break;
        }
    }
    /* glibc relocates these in place; an address below the base is still relative. */
    uintptr_t base = info->dlpi_addr;
    if (symtab && symtab < base) symtab += base;
    if (strtab && strtab < base) strtab += base;
    if (jmprel && jmprel < base) jmprel += base;
    if (rela && rela < base) rela += base;
    if (symtab == 0 || strtab == 0 || pltrel != DT_RELA) {
        snprintf(w->err, w->errlen, "%s: no symbol table or no RELA relocations", info->dlpi_name);
        w->failed = 1;
        return 1;
    }
    const ElfW(Sym) *sym = (const ElfW(Sym) *)symtab;
    const char *str = (const char *)strtab;
    if ((jmprel && patch_table(w, info, (const ElfW(Rela) *)jmprel, pltrelsz, sym, str, relro,
                               relro_len) != 0) ||
        (rela && patch_table(w, info, (const ElfW(Rela) *)rela, relasz, sym, str, relro,
                             relro_len) != 0)) {
        w->failed = 1;
        return 1;
    }
    return 0;
}
#endif

int ps_got_hook(const char *const *libs, const ps_got_hook_t *hooks, size_t n, char *err,
                size_t errlen)
{
#if defined(__x86_64__) && defined(__linux__)
    walk_t w = {.libs = libs, .hooks = hooks, .n = n, .err = err, .errlen = errlen};
    dl_iterate_phdr(visit, &w);
    return w.failed ? -1 : w.set;
#else
    (void)libs, (void)hooks, (void)n;
    snprintf(err, errlen, "not on this platform (x86-64 Linux only)");
    return -1;
#endif
}
