/* discover_none.c: discover.h in a build without an mDNS library
 * (-Dmdns=disabled, or avahi-core not found): announcing and browsing say
 * so; the key id and the answer checks (discover.c) are still there. */
#include "discover.h"

const char *shoal_discover_backend(void)
{
    return NULL;
}

struct shoal_discover_announcer *
shoal_discover_announce_start(const struct shoal_discover_announce_params *p,
                              struct shoal_err *err)
{
    (void)p;
    shoal_err_set(err, -SHOAL_EUNSUPPORTED, "this build has no mDNS (rebuild with "
                  "avahi-core: Debian's libavahi-core-dev)");
    return NULL;
}

void shoal_discover_announce_stop(struct shoal_discover_announcer *a)
{
    (void)a;
}

int shoal_discover_browse(const struct shoal_discover_browse_params *p,
                          struct shoal_discover_worker *out, int max,
                          struct shoal_discover_stats *stats, struct shoal_err *err)
{
    (void)p, (void)out, (void)max, (void)stats;
    return shoal_err_set(err, -SHOAL_EUNSUPPORTED, "this build has no mDNS (rebuild with "
                         "avahi-core: Debian's libavahi-core-dev)");
}
