/* fuzz_seeds.c: fuzz_seeds DIR writes every harness's seeds and regression inputs (seeds.c)
 * as files, DIR/TARGET/NAME, the corpus run.sh starts libFuzzer from. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "fuzz.h"

static void write_one(const char *target, const char *name, const void *p, size_t n, void *arg)
{
    const char *root = arg;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, target);
    if ((mkdir(root, 0777) && errno != EEXIST) || (mkdir(path, 0777) && errno != EEXIST)) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof path, "%s/%s/%s", root, target, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(p, 1, n, f) != n || fclose(f)) {
        perror(path);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_seeds DIR\n");
        return 2;
    }
    fuzz_seeds(write_one, argv[1]);
    return 0;
}
