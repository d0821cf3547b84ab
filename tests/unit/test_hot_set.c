/* hot_set: routing counts rank experts, persist with decay per run, and a
 * bad or foreign file is ignored with a warning. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hot_set.h"
#include "log.h"
#include "util.h"
#include "test_fs.h"

static char dir[64];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/shoal-hot-XXXXXX");
    cr_assert(mkdtemp(dir) != NULL);
}

static void remove_dir(void)
{
    cr_assert(eq(int, test_rm_rf(dir), 0), "rm -rf %s: %s", dir, strerror(errno));
}

Test(hot_set, rank_is_by_count_then_layer_then_expert)
{
    struct shoal_hot_set *h = shoal_hot_set_open(NULL, 1, 2, 3, SHOAL_HOT_SET_DECAY);
    shoal_hot_set_add(h, 1, 2, 5);   /* index 5 */
    shoal_hot_set_add(h, 0, 1, 5);   /* index 1: same count, lower layer first */
    shoal_hot_set_add(h, 1, 0, 7);   /* index 3 */
    shoal_hot_set_add(h, 9, 0, 7);   /* out of range: ignored */
    int64_t order[6];
    shoal_hot_set_rank(h, order);
    int64_t want[6] = {3, 1, 5, 0, 2, 4};
    for (int i = 0; i < 6; i++)
        cr_assert(eq(i64, order[i], want[i]), "rank %d", i);
    cr_assert(epsilon_eq(dbl, shoal_hot_set_run_total(h), 17.0, 0));
    shoal_hot_set_destroy(h);
}

Test(hot_set, counts_persist_with_decay_per_run)
{
    make_dir();
    char *path = shoal_path_join(dir, "routing_counts.json");
    struct shoal_hot_set *h = shoal_hot_set_open(path, 0xabc, 2, 2, 0.5);
    shoal_hot_set_add(h, 0, 1, 8);
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_hot_set_save(h, &err), 0), "%s", err.msg);
    shoal_hot_set_destroy(h);
    /* run 2: 8 * 0.5 + 2 = 6 */
    h = shoal_hot_set_open(path, 0xabc, 2, 2, 0.5);
    cr_assert(epsilon_eq(dbl, shoal_hot_set_count(h, 0, 1), 8.0, 0), "loaded as saved");
    shoal_hot_set_add(h, 0, 1, 2);
    shoal_hot_set_add(h, 1, 1, 1);
    cr_assert(eq(int, shoal_hot_set_save(h, &err), 0), "%s", err.msg);
    shoal_hot_set_destroy(h);
    h = shoal_hot_set_open(path, 0xabc, 2, 2, 0.5);
    cr_assert(epsilon_eq(dbl, shoal_hot_set_count(h, 0, 1), 6.0, 1e-9));
    cr_assert(epsilon_eq(dbl, shoal_hot_set_count(h, 1, 1), 1.0, 1e-9));
    shoal_hot_set_destroy(h);
    free(path);
    remove_dir();
}

static int n_warn;
static char last[1024];

static void sink(enum shoal_log_level level, const char *component, const char *line,
                 void *user)
{
    (void)user;
    (void)component;
    if (level == SHOAL_LOG_WARN) {
        n_warn++;
        snprintf(last, sizeof last, "%s", line);
    }
}

Test(hot_set, foreign_or_malformed_file_is_ignored_with_a_warning)
{
    make_dir();
    shoal_log_set_sink(sink, NULL);
    char *path = shoal_path_join(dir, "routing_counts.json");
    struct shoal_hot_set *h = shoal_hot_set_open(path, 0x111, 1, 2, 0.9);
    shoal_hot_set_add(h, 0, 0, 3);
    cr_assert(eq(int, shoal_hot_set_save(h, NULL), 0));
    shoal_hot_set_destroy(h);
    h = shoal_hot_set_open(path, 0x222, 1, 2, 0.9);   /* another container */
    cr_assert(eq(int, n_warn, 1));
    cr_assert(strstr(last, "fingerprint") != NULL, "%s", last);
    cr_assert(epsilon_eq(dbl, shoal_hot_set_count(h, 0, 0), 0.0, 0));
    shoal_hot_set_destroy(h);
    FILE *f = fopen(path, "w");
    fputs("{\"format\": \"shoal-routing-counts\", \"counts\": [[1, ", f);   /* truncated */
    fclose(f);
    h = shoal_hot_set_open(path, 0x111, 1, 2, 0.9);
    cr_assert(eq(int, n_warn, 2));
    cr_assert(strstr(last, path) != NULL, "names the file: %s", last);
    shoal_hot_set_destroy(h);
    shoal_log_set_sink(NULL, NULL);
    free(path);
    remove_dir();
}

Test(hot_set, read_only_container_uses_the_fallback_directory)
{
    /* root writes anywhere: become nobody (this test runs in its own process) */
    if (geteuid() == 0 && setuid(65534) != 0)
        cr_skip_test("running as root and cannot drop to uid 65534");
    make_dir();
    chmod(dir, 0555);
    int in_ct = 1;
    char *p = shoal_hot_set_path(dir, "/tmp/fallback", 0x1234, &in_ct);
    cr_assert(eq(int, in_ct, 0));
    cr_assert(eq(str, p, "/tmp/fallback/routing_counts-0000000000001234.json"));
    free(p);
    cr_assert(shoal_hot_set_path(dir, NULL, 1, &in_ct) == NULL);
    chmod(dir, 0755);
    remove_dir();
}

Test(hot_set, writable_container_keeps_counts_beside_it)
{
    make_dir();
    int in_ct = 0;
    char *p = shoal_hot_set_path(dir, "/tmp/fallback", 1, &in_ct);
    cr_assert(eq(int, in_ct, 1));
    cr_assert(strstr(p, "/routing_counts.json") != NULL);
    cr_assert(eq(int, strncmp(p, dir, strlen(dir)), 0));
    free(p);
    remove_dir();
}

Test(hot_set, save_creates_the_fallback_directory)
{
    make_dir();
    char sub[160];
    snprintf(sub, sizeof sub, "%s/a/b/shoal/routing_counts-1.json", dir);
    struct shoal_hot_set *h = shoal_hot_set_open(sub, 1, 1, 1, 0.9);
    shoal_hot_set_add(h, 0, 0, 1);
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_hot_set_save(h, &err), 0), "%s", err.msg);
    cr_assert(shoal_exists(sub));
    shoal_hot_set_destroy(h);
    remove_dir();
}
