/* follower.h: psd shard 0 runs the manifest's periodic checkpoints (the `checkpoint:` section)
 * as a child process, `psctl --manifest M checkpoint --follow`, with the psctl binary found
 * beside psd's own executable (/proc/self/exe). Shards do not talk to each other, and the
 * checkpoint fan-out (BEGIN to shard 0, ARM to every shard, GO) is psctl's; so psd starts it
 * and users need nothing more than the manifest. The child gets PR_SET_PDEATHSIG(SIGTERM) so
 * it never outlives psd, writes its lines to psd's stderr, is started again (at most once a
 * second) when it dies while psd runs, and is told to stop (SIGTERM) and reaped when psd stops.
 * It exits 0 by itself once the job is finished; then it is not started again. Loop thread. */
#ifndef PSD_FOLLOWER_H
#define PSD_FOLLOWER_H

#include "server.h"

/** @brief Shard 0 with a checkpoint section: start the follower (a no-op otherwise). */
void psd_follower_start(psd_server_t *srv);

/** @brief From the cron: reap a follower that exited; start it again unless it finished. */
void psd_follower_cron(psd_server_t *srv, uint64_t now_ms);

/** @brief psd is stopping: SIGTERM the follower (it leaves no checkpoint hold behind). */
void psd_follower_signal(psd_server_t *srv);

/** @brief After the loop: wait for the follower to exit (SIGKILL after 10 s) and reap it,
 *  running the loop meanwhile (the follower's last request is answered). */
void psd_follower_reap(psd_server_t *srv);

#endif
