/* psctl_forget.c: dropping a tensor that no push reached from every shard (psctl forget NAME,
 * and the checkpoint follower's strays). Shard 0 is asked first whether it would drop it (it
 * checks the job's state: server/forget.c), then every other shard drops its chunks, then
 * shard 0 the tensor; a shard that refuses stops it there, shard 0's declaration kept. A shard
 * that does not hold the tensor (dropped there before, by a give-up or forget that did not reach
 * every shard) is passed. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "ps/ps_error.h"
#include "psctl_client.h"

int psctl_forget(ps_req_t *cl, const ps_manifest_t *m, const char *name, bool trained,
                 int *dropped, char *err, size_t errlen)
{
    int held0 = 1;
    *dropped = 0;
    for (int k = 0; k <= m->nservers; k++) {
        int i = k == m->nservers ? 0 : k; /* shard 0: asked first, dropped last */
        if (k == m->nservers && !held0) break;
        ps_msg_t q = {.type = PS_MSG_FORGET, .rank = -1,
                      .flags = PS_FLAG_FORCE | (k == 0 ? PS_FLAG_CHECK : 0) |
                               (trained ? PS_FLAG_TRAINED : 0)}, r;
        snprintf(q.cluster, sizeof q.cluster, "%s", m->cluster);
        snprintf(q.error, sizeof q.error, "%s", name);
        int rc = ps_req_call(cl, (uint32_t)i, &q, &r, NULL, NULL, err, errlen);
        if (rc == PS_ENOENT) {
            held0 &= k != 0;
        } else if (rc) {
            return rc;
        } else if (k > 0) {
            (*dropped)++;
        } else if (getenv("PS_TEST_FORGET_PAUSE_MS")) {
            /* tests only: a pause after shard 0's check, as a slow shard makes, in which shard
             * 0 holds the tensor (server/forget.c) */
            fprintf(stderr, "psctl: forget: shard 0 checked '%s' (PS_TEST_FORGET_PAUSE_MS)\n",
                    name);
            usleep((useconds_t)atoi(getenv("PS_TEST_FORGET_PAUSE_MS")) * 1000);
        }
    }
    if (*dropped == 0) {
        snprintf(err, errlen, "no shard holds a tensor '%s'", name);
        return PS_ENOENT;
    }
    return 0;
}
