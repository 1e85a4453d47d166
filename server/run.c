/* run.c: a shard store's run (see run.h). */
#include <stdio.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "ps/ps_error.h"
#include "ps/ps_log.h"
#include "run.h"

uint64_t psd_run_new_id(void)
{
    uint64_t id = 0;
    if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) {
        struct timespec ts; /* no entropy source: time and pid, still distinct per start */
        clock_gettime(CLOCK_REALTIME, &ts);
        id = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^
             ((uint64_t)getpid() << 40);
    }
    return id ? id : 1;
}

int psd_run_put(psd_wtxn_t *tx, const psd_run_t *r)
{
    return psd_store_put_blob(tx, PSD_RUN_BLOB, r, sizeof *r);
}

int psd_run_load(psd_store_t *st, uint64_t step_now, psd_run_t *out, char *err, size_t errlen)
{
    size_t len = 0;
    int rc = psd_store_get_blob(st, PSD_RUN_BLOB, out, sizeof *out, &len);
    if (rc == 0 && len == PSD_RUN_V1_BYTES && out->id != 0) out->origin = 0;
    if (rc == 0 && (len == sizeof *out || len == PSD_RUN_V1_BYTES) && out->id != 0) return 0;
    if (rc != 0 && rc != PS_ENOENT && rc != -EOVERFLOW) {
        snprintf(err, errlen, "%s: cannot read the store's run: %s", st->dir, ps_strerror(rc));
        return rc;
    }
    if (rc == 0 || rc == -EOVERFLOW)
        PS_LOG(PS_LOG_WARN, "run", "%s: the stored run is malformed (%zu bytes); starting a new "
               "one", st->dir, len);
    *out = (psd_run_t){.id = psd_run_new_id(), .base_step = step_now};
    psd_wtxn_t tx;
    if ((rc = psd_store_begin(st, &tx)) == 0) {
        if ((rc = psd_run_put(&tx, out)) != 0)
            psd_store_abort(&tx);
        else
            rc = psd_store_commit(&tx);
    }
    if (rc) snprintf(err, errlen, "%s: cannot record the store's run: %s", st->dir,
                     ps_strerror(rc));
    return rc;
}
