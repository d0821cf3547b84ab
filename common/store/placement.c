#include "placement.h"

#include <math.h>
#include <stddef.h>

/* splitmix64's finaliser: a bijection of 64-bit words whose output bits
 * each depend on every input bit. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t shoal_placement_key(int64_t il, int64_t ie)
{
    return (uint64_t)il << 32 | (uint64_t)(uint32_t)ie;
}

double shoal_placement_score(uint64_t key, uint64_t seed, double w)
{
    if (!(w > 0))
        return -1.0;
    uint64_t h = mix64(key * 0x9e3779b97f4a7c15ull ^ mix64(seed));
    double u = ((double)(h >> 11) + 0.5) * 0x1p-53;   /* (0, 1), never 0 or 1 */
    return -w / log(u);                                /* > 0 */
}

int shoal_placement_best(uint64_t key, const uint64_t *seeds, const double *weights, int n,
                         uint64_t exclude)
{
    int any_pos = 0;
    for (int i = 0; i < n; i++)
        if (!(exclude >> i & 1u) && weights[i] > 0)
            any_pos = 1;
    int best = -1;
    double best_score = 0;
    for (int i = 0; i < n; i++) {
        if (exclude >> i & 1u)
            continue;
        double score = shoal_placement_score(key, seeds[i], any_pos ? weights[i] : 1.0);
        if (best < 0 || score > best_score) {
            best = i;
            best_score = score;
        }
    }
    return best;
}

int shoal_placement_holders(int64_t il, int64_t ie, int n_workers, const double *weights,
                            int replicas, int *out)
{
    if (n_workers < 1)
        return 0;
    if (replicas < 1)
        replicas = 1;
    if (replicas > n_workers)
        replicas = n_workers;
    int n_pos = 0;
    for (int i = 0; weights && i < n_workers; i++)
        n_pos += weights[i] > 0;
    const int all_equal = !weights || n_pos == 0;
    if (!all_equal && replicas > n_pos)
        replicas = n_pos;
    const uint64_t key = shoal_placement_key(il, ie);
    /* selection of the top `replicas` scores: n_workers is a cluster size
     * (tens), so O(n_workers * replicas) is cheaper than sorting; strict >
     * keeps the lower index on ties */
    double last = INFINITY;
    int last_ix = -1;
    for (int r = 0; r < replicas; r++) {
        int best = -1;
        double best_score = 0;
        for (int i = 0; i < n_workers; i++) {
            double w = all_equal ? 1.0 : weights[i];
            if (!(w > 0))
                continue;
            double s = shoal_placement_score(key, (uint64_t)i, w);
            /* only candidates ranked after the previous pick: lower score,
             * or an equal score at a higher index */
            if (s > last || (s == last && i <= last_ix))
                continue;
            if (best < 0 || s > best_score) {
                best = i;
                best_score = s;
            }
        }
        if (best < 0)
            return r;
        out[r] = best;
        last = best_score;
        last_ix = best;
    }
    return replicas;
}
