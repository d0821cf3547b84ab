/* placement: weighted rendezvous hashing of experts onto workers (shares
 * follow the weights, stability when a worker leaves, replicas, clamps,
 * fixed values) and its agreement with the expert store's source choice. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <math.h>
#include <string.h>

#include "expert_store.h"
#include "placement.h"

#define N_LAYER_KEYS 200     /* keys: 200 layers x 1000 experts */
#define N_EXPERT_KEYS 1000
#define N_KEYS (N_LAYER_KEYS * N_EXPERT_KEYS)
#define SHARE_TOL 0.01       /* absolute tolerance on a share over N_KEYS keys */

Test(placement, key_packs_layer_high_and_expert_low)
{
    cr_assert(eq(u64, shoal_placement_key(3, 7), 0x300000007ull));
    cr_assert(eq(u64, shoal_placement_key(0, 0), 0));
    cr_assert(ne(u64, shoal_placement_key(1, 0), shoal_placement_key(0, 1)));
}

Test(placement, first_holder_shares_follow_the_weights)
{
    const double weights[4] = {1, 2, 3, 4};
    long n[4] = {0};
    int out[1];
    for (int il = 0; il < N_LAYER_KEYS; il++)
        for (int ie = 0; ie < N_EXPERT_KEYS; ie++) {
            cr_assert(eq(int, shoal_placement_holders(il, ie, 4, weights, 1, out), 1));
            n[out[0]]++;
        }
    for (int i = 0; i < 4; i++) {
        double share = (double)n[i] / N_KEYS, want = weights[i] / 10.0;
        cr_assert(epsilon_eq(dbl, share, want, SHARE_TOL), "worker %d: share %.4f, want %.2f",
                  i, share, want);
    }
}

Test(placement, equal_weights_give_equal_shares_with_replicas)
{
    /* 5 workers, 2 replicas: each worker holds 2/5 of the experts */
    long n[5] = {0};
    int out[2];
    for (int il = 0; il < N_LAYER_KEYS; il++)
        for (int ie = 0; ie < N_EXPERT_KEYS; ie++) {
            cr_assert(eq(int, shoal_placement_holders(il, ie, 5, NULL, 2, out), 2));
            cr_assert(ne(int, out[0], out[1]), "layer %d expert %d: holders distinct", il, ie);
            n[out[0]]++;
            n[out[1]]++;
        }
    for (int i = 0; i < 5; i++)
        cr_assert(epsilon_eq(dbl, (double)n[i] / N_KEYS, 0.4, SHARE_TOL), "worker %d: %.4f",
                  i, (double)n[i] / N_KEYS);
}

Test(placement, replicas_extend_the_single_holder)
{
    /* the holder with 1 replica is the first of the R holders: adding
     * replicas never moves an expert's preferred worker */
    const double weights[6] = {2, 1, 1, 3, 1, 0.5};
    for (int ie = 0; ie < 5000; ie++) {
        int one[1], three[3];
        shoal_placement_holders(7, ie, 6, weights, 1, one);
        cr_assert(eq(int, shoal_placement_holders(7, ie, 6, weights, 3, three), 3));
        cr_assert(eq(int, three[0], one[0]), "expert %d", ie);
        cr_assert(three[0] != three[1] && three[1] != three[2] && three[0] != three[2]);
    }
}

Test(placement, zero_weight_worker_moves_only_its_experts)
{
    const double before[4] = {3, 1, 2, 5};
    const double after[4] = {3, 0, 2, 5};   /* worker 1 leaves */
    long moved = 0, owned = 0;
    for (int il = 0; il < N_LAYER_KEYS; il++)
        for (int ie = 0; ie < N_EXPERT_KEYS; ie++) {
            int a[1], b[1];
            shoal_placement_holders(il, ie, 4, before, 1, a);
            shoal_placement_holders(il, ie, 4, after, 1, b);
            owned += a[0] == 1;
            cr_assert(ne(int, b[0], 1));
            if (a[0] != 1)
                cr_assert(eq(int, b[0], a[0]), "layer %d expert %d moved from %d to %d", il,
                          ie, a[0], b[0]);
            moved += a[0] != b[0];
        }
    cr_assert(eq(i64, moved, owned));
    cr_assert(owned > N_KEYS / 20, "worker 1 owned its share (%ld)", owned);
}

Test(placement, dropping_the_last_worker_moves_only_its_experts)
{
    long moved = 0, owned = 0;
    for (int il = 0; il < N_LAYER_KEYS; il++)
        for (int ie = 0; ie < N_EXPERT_KEYS; ie++) {
            int a[2], b[2];
            shoal_placement_holders(il, ie, 5, NULL, 2, a);
            shoal_placement_holders(il, ie, 4, NULL, 2, b);
            int had4 = a[0] == 4 || a[1] == 4;
            owned += had4;
            if (!had4)
                cr_assert(a[0] == b[0] && a[1] == b[1], "layer %d expert %d", il, ie);
            else   /* the other holder stays */
                cr_assert(b[0] == (a[0] == 4 ? a[1] : a[0]) || b[1] == (a[0] == 4 ? a[1] : a[0]));
            moved += !(a[0] == b[0] && a[1] == b[1]);
        }
    cr_assert(eq(i64, moved, owned));
}

Test(placement, values_are_fixed)
{
    /* the hash is part of the on-disk placement: these must never change */
    static const struct { int il, ie, want[5]; } cases[] = {
        {0, 0, {4, 3, 1, 2, 0}}, {0, 1, {4, 0, 2, 3, 1}}, {0, 2, {4, 2, 0, 1, 3}},
        {0, 3, {1, 3, 2, 4, 0}}, {1, 0, {2, 0, 1, 3, 4}}, {1, 1, {4, 0, 2, 1, 3}},
        {1, 2, {4, 3, 0, 2, 1}}, {1, 3, {4, 1, 3, 0, 2}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int out[5];
        cr_assert(eq(int, shoal_placement_holders(cases[c].il, cases[c].ie, 5, NULL, 5, out), 5));
        for (int r = 0; r < 5; r++)
            cr_assert(eq(int, out[r], cases[c].want[r]), "layer %d expert %d rank %d",
                      cases[c].il, cases[c].ie, r);
    }
    cr_assert(epsilon_eq(dbl, shoal_placement_score(shoal_placement_key(3, 7), 2, 1.5),
                         2.093567544678185, 1e-12));
}

Test(placement, clamps_replicas_and_skips_non_positive_weights)
{
    int out[4] = {-1, -1, -1, -1};
    cr_assert(eq(int, shoal_placement_holders(0, 0, 3, NULL, 0, out), 1), "replicas 0 -> 1");
    cr_assert(eq(int, shoal_placement_holders(0, 0, 3, NULL, 9, out), 3), "replicas 9 -> 3");
    cr_assert(out[0] != out[1] && out[1] != out[2] && out[0] != out[2]);
    const double w[3] = {0, 1, -2};
    for (int ie = 0; ie < 100; ie++) {
        cr_assert(eq(int, shoal_placement_holders(0, ie, 3, w, 2, out), 1),
                  "one positive weight: one holder");
        cr_assert(eq(int, out[0], 1));
    }
    const double zero[3] = {0, 0, 0};
    cr_assert(eq(int, shoal_placement_holders(5, 5, 3, zero, 3, out), 3), "all zero: equal");
    int again[3];
    shoal_placement_holders(5, 5, 3, NULL, 3, again);
    cr_assert(out[0] == again[0] && out[1] == again[1] && out[2] == again[2]);
    cr_assert(eq(int, shoal_placement_holders(0, 0, 0, NULL, 1, out), 0));
}

Test(placement, store_rendezvous_is_the_same_score)
{
    const uint64_t seeds[3] = {9, 8, 7};
    const double weights[3] = {1, 2, 3};
    for (uint64_t k = 0; k < 10000; k++) {
        int best = 0;
        double bs = -2;
        for (int i = 0; i < 3; i++) {
            double s = shoal_placement_score(k, seeds[i], weights[i]);
            if (s > bs) {
                bs = s;
                best = i;
            }
        }
        cr_assert(eq(int, shoal_expert_store_rendezvous(k, seeds, weights, 3), best));
        cr_assert(eq(int, shoal_placement_best(k, seeds, weights, 3, 0), best));
    }
    cr_assert(eq(int, shoal_placement_best(1, seeds, weights, 3, 7), -1), "all excluded");
    cr_assert(eq(int, shoal_placement_best(1, seeds, weights, 3, 6), 0));
}
