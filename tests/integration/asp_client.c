/* asp_client.c: a libps worker for the test of pushes applied exactly once under asp
 * (test_faults.c, lost_ack_*). Test code, not part of psd.
 *
 *   asp_client MANIFEST NUMEL PUSHES
 *
 * Joins the cluster (consistency asp, optimizer sgd with lr 1), declares tensor "asp.t" of
 * NUMEL floats (zeros), pushes a gradient of -1 everywhere PUSHES times, each push waited for
 * before the next, then pulls: every push applied exactly once leaves every value equal to
 * PUSHES (sgd: p - lr * g adds 1 per update, exactly, for any count a float holds). Exit 0
 * with "PUSHES pushes, each applied once" on stdout; 1 with the first element that is off
 * (how many times it was updated) or the libps error. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "ps/ps_client.h"

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: asp_client MANIFEST NUMEL PUSHES\n");
        return 2;
    }
    uint64_t n = strtoull(argv[2], NULL, 10), pushes = strtoull(argv[3], NULL, 10);
    if (n == 0 || n > (1u << 24) || pushes == 0 || pushes > (1u << 20)) {
        fprintf(stderr, "asp_client: NUMEL in [1, 2^24], PUSHES in [1, 2^20]\n");
        return 2;
    }
    char err[512];
    ps_client_t *c;
    if (ps_client_create(argv[1], NULL, &c, err, sizeof err)) {
        printf("asp_client: join: %s\n", err);
        return 1;
    }
    ps_tensor_desc_t d = {.name = "asp.t", .shape = {(uint32_t)n}, .ndim = 1, .init = 0};
    uint32_t id;
    float *g = malloc(n * sizeof *g), *got = malloc(n * sizeof *got);
    int rc = g == NULL || got == NULL ? 1 : 0;
    if (rc == 0 && ps_client_declare(c, &d, &id) != 0) {
        printf("asp_client: declare: %s\n", ps_client_error(c));
        rc = 1;
    }
    for (uint64_t i = 0; rc == 0 && i < n; i++) g[i] = -1.0f;
    ps_op_t *op;
    for (uint64_t k = 0; rc == 0 && k < pushes; k++) {
        if (ps_client_push(c, id, g, k, &op) != 0 || ps_op_wait(op, NULL) != 0) {
            printf("asp_client: push %" PRIu64 ": %s\n", k, ps_client_error(c));
            rc = 1;
        }
    }
    if (rc == 0 && (ps_client_pull(c, id, got, 0, &op) != 0 || ps_op_wait(op, NULL) != 0)) {
        printf("asp_client: pull: %s\n", ps_client_error(c));
        rc = 1;
    }
    for (uint64_t i = 0; rc == 0 && i < n; i++)
        if (got[i] != (float)pushes) {
            printf("asp_client: element %" PRIu64 " is %.9g after %" PRIu64
                   " pushes: updated %.9g times\n", i, (double)got[i], pushes, (double)got[i]);
            rc = 1;
        }
    if (rc == 0) printf("asp_client: %" PRIu64 " pushes, each applied once\n", pushes);
    fflush(stdout);
    free(g);
    free(got);
    ps_client_destroy(c);
    return rc;
}
