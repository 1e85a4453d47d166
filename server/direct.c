/* direct.c: direct pulls, psd's side. A worker on this shard's host may read the parameters it
 * pulls straight from the shard's store (common/storeview.h): psd tells it where the store is
 * in the hello reply and answers its pulls with the version to read (pull.c,
 * psd__send_pull_reply). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envflag.h"
#include "ps/ps_log.h"
#include "server.h"
#include "storeview.h"

void psd_direct_init(psd_server_t *srv, const char *data_dir)
{
    srv->store_path[0] = '\0';
    srv->store_id = 0;
    if (ps_env_off("PS_DIRECT_PULL")) {
        PS_LOG(PS_LOG_INFO, "server", "direct pulls off (PS_DIRECT_PULL=%s)",
               getenv("PS_DIRECT_PULL"));
        return;
    }
    char real[PATH_MAX];
    int fd;
    if (realpath(data_dir, real) == NULL || strlen(real) >= sizeof srv->store_path ||
        mdb_env_get_fd(srv->store.env, &fd) != 0 || (srv->store_id = ps_storeview_file_id(fd)) == 0) {
        PS_LOG(PS_LOG_INFO, "server", "direct pulls off: the path of %s is unusable", data_dir);
        return;
    }
    memcpy(srv->store_path, real, strlen(real) + 1);
}

void psd_hello_store(const psd_server_t *srv, const ps_msg_t *hello, ps_msg_t *reply)
{
    if (!srv->store_path[0] || hello->store_id == 0 || hello->store_id != ps_storeview_host_id())
        return; /* elsewhere, or a host that cannot tell (ps_storeview_host_id) */
    memcpy(reply->store, srv->store_path, sizeof reply->store);
    reply->store_id = srv->store_id;
}

void psd_direct_reap(psd_server_t *srv)
{
    int dead = 0;
    if (srv->store_path[0] && mdb_reader_check(srv->store.env, &dead) == 0 && dead > 0)
        PS_LOG(PS_LOG_INFO, "server", "cleared %d read slots of exited workers", dead);
}
