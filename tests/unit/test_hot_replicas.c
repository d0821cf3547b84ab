/* hot_replicas: the hottest experts of each layer (top n_hot by routing
 * count, ties to the lower id, zero counts never hot), the counts files it
 * reads, and the holders they get with shoal_placement_holders: R + X for
 * hot experts, R for the rest, the R base holders kept (issue 33). */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hot_replicas.h"
#include "placement.h"

#define N_LAYER 3
#define N_EXPERT 7   /* odd, and n_hot = n_expert is an edge case */

/* layer 0: a skewed curve; layer 1: ties; layer 2: all zero (dense) */
static const double COUNTS[N_LAYER][N_EXPERT] = {
    {5, 90, 1, 40, 0, 60, 2},
    {3, 3, 3, 3, 3, 3, 3},
    {0, 0, 0, 0, 0, 0, 0},
};

Test(hot_replicas, marks_the_top_counts_per_layer_ties_to_the_lower_id)
{
    uint8_t hot[N_LAYER][N_EXPERT];
    const int64_t n = shoal_hot_replicas_mark(&COUNTS[0][0], N_LAYER, N_EXPERT, 2, &hot[0][0]);
    cr_assert(eq(i64, n, 4));
    const uint8_t want0[N_EXPERT] = {0, 1, 0, 0, 0, 1, 0};   /* 90 and 60 */
    const uint8_t want1[N_EXPERT] = {1, 1, 0, 0, 0, 0, 0};   /* ties: ids 0 and 1 */
    const uint8_t want2[N_EXPERT] = {0};
    cr_assert(eq(int, memcmp(hot[0], want0, N_EXPERT), 0));
    cr_assert(eq(int, memcmp(hot[1], want1, N_EXPERT), 0));
    cr_assert(eq(int, memcmp(hot[2], want2, N_EXPERT), 0));
}

Test(hot_replicas, zero_counts_are_never_hot_even_with_n_hot_equal_n_expert)
{
    uint8_t hot[N_LAYER][N_EXPERT];
    const int64_t n =
        shoal_hot_replicas_mark(&COUNTS[0][0], N_LAYER, N_EXPERT, N_EXPERT, &hot[0][0]);
    cr_assert(eq(i64, n, 6 + 7 + 0), "layer 0 has one zero count, layer 2 only zeros");
    cr_assert(eq(u8, hot[0][4], 0));
}

Test(hot_replicas, hot_experts_get_extra_holders_and_keep_their_base_ones)
{
    const int W = 5, R = 2, X = 2;
    uint8_t hot[N_LAYER][N_EXPERT];
    shoal_hot_replicas_mark(&COUNTS[0][0], N_LAYER, N_EXPERT, 3, &hot[0][0]);
    for (int il = 0; il < N_LAYER; il++)
        for (int ie = 0; ie < N_EXPERT; ie++) {
            int base[8], more[8];
            const int nb = shoal_placement_holders(il, ie, W, NULL, R, base);
            const int want = hot[il][ie] ? R + X : R;
            const int nm = shoal_placement_holders(il, ie, W, NULL, want, more);
            cr_assert(eq(int, nb, R));
            cr_assert(eq(int, nm, want), "layer %d expert %d", il, ie);
            /* the same ranking: the R base holders come first */
            cr_assert(eq(int, memcmp(base, more, (size_t)R * sizeof *base), 0), "layer %d expert %d", il,
                      ie);
            /* deterministic: a second call gives the same holders */
            int again[8];
            shoal_placement_holders(il, ie, W, NULL, want, again);
            cr_assert(eq(int, memcmp(more, again, (size_t)want * sizeof *more), 0));
        }
}

static char *write_tmp(const char *text)
{
    char *path = strdup("/tmp/test_hot_replicas_XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert(eq(sz, (size_t)write(fd, text, strlen(text)), strlen(text)));
    close(fd);
    return path;
}

Test(hot_replicas, reads_routing_counts_and_synth_json)
{
    double c[2 * 3];
    struct shoal_err err = {0};
    char *p = write_tmp("{\"format\":\"shoal-routing-counts\",\"counts\":[[1,2,3],[0,-4,9]]}");
    cr_assert(eq(int, shoal_hot_replicas_load(p, 2, 3, c, &err), 0), "%s", err.msg);
    const double want[6] = {1, 2, 3, 0, 0, 9};   /* negatives count as 0 */
    cr_assert(eq(int, memcmp(c, want, sizeof want), 0));
    unlink(p);
    free(p);
    p = write_tmp("{\"layers\":[{\"layer\":1,\"target_share\":[0.5,0.25,0.25]}]}");
    cr_assert(eq(int, shoal_hot_replicas_load(p, 2, 3, c, &err), 0), "%s", err.msg);
    const double want2[6] = {0, 0, 0, 0.5, 0.25, 0.25};
    cr_assert(eq(int, memcmp(c, want2, sizeof want2), 0));
    unlink(p);
    free(p);
}

Test(hot_replicas, a_file_of_another_shape_is_an_error_naming_it)
{
    double c[2 * 3];
    struct shoal_err err = {0};
    char *p = write_tmp("{\"counts\":[[1,2]]}");
    cr_assert(eq(int, shoal_hot_replicas_load(p, 2, 3, c, &err), SHOAL_EFORMAT));
    cr_assert(strstr(err.msg, p) != NULL, "%s", err.msg);
    unlink(p);
    free(p);
    struct shoal_err e2 = {0};
    cr_assert(eq(int, shoal_hot_replicas_load("/nonexistent/synth.json", 2, 3, c, &e2),
                 SHOAL_ENOTFOUND));
}
