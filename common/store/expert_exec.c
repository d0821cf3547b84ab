/* expert_exec: a layer's routed experts from an expert store, batch by
 * batch (see expert_exec.h). */
#include "expert_exec.h"

#include "util.h"

int shoal_expert_exec_run(struct shoal_expert_store *store, int64_t il, const int32_t *ids,
                          int64_t n, struct shoal_expert_ffn_job *jobs,
                          struct shoal_expert_weights *ew,
                          const struct shoal_expert_exec_hooks *hooks,
                          struct shoal_expert_exec_times *times, struct shoal_err *err)
{
    struct shoal_expert_exec_times t = {0};
    for (int64_t i0 = 0; i0 < n;) {
        if (hooks && hooks->before_start)
            hooks->before_start(hooks->user, i0);
        const double t0 = shoal_time_s();
        /* submit this batch's reads; hints queue behind them; then wait */
        int nb = shoal_expert_store_acquire_start(store, il, ids + i0, n - i0, err);
        if (nb < 0)
            return nb;
        if (hooks && hooks->started)
            hooks->started(hooks->user, i0);
        int rc = shoal_expert_store_acquire_wait(store, ew, err);
        if (rc < 0)
            return rc;
        const double t1 = shoal_time_s();
        t.acquire += t1 - t0;
        for (int64_t i = i0; i < i0 + nb; i++)
            jobs[i].w = &ew[i - i0];
        shoal_expert_ffn_batch(jobs + i0, nb);
        shoal_expert_store_release_batch(store, il, ids + i0, nb);
        t.compute += shoal_time_s() - t1;
        i0 += nb;
    }
    if (times)
        *times = t;
    return 0;
}
