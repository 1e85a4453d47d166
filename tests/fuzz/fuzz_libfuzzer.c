/* fuzz_libfuzzer.c: fuzz.h's memory for the libFuzzer programs: malloc, so that
 * AddressSanitizer sees a read past the end. */
#include "fuzz.h"

void *fuzz_alloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) abort();
    return p;
}

void fuzz_free(void *p)
{
    free(p);
}
