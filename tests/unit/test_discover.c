/* discover: the key id and the checks of one mDNS answer
 * (common/net/discover.h). No network: the answers are built here, as
 * avahi would hand them over, hostile ones included. Exact asserts. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdio.h>
#include <string.h>

#include "discover.h"

static struct shoal_wire_key key_of(uint8_t b)
{
    struct shoal_wire_key k = {.set = 1};
    memset(k.bytes, b, sizeof k.bytes);
    return k;
}

#define MAX_OUT 4

struct fixture {
    struct shoal_discover_worker out[MAX_OUT];
    struct shoal_discover_set set;
    char txt_key[32];
};

static void fixture_init(struct fixture *f, int max)
{
    memset(f, 0, sizeof *f);
    struct shoal_wire_key k = key_of(7);
    cr_assert(eq(int, shoal_discover_key_id(&k, f->set.key_id), 0));
    f->set.out = f->out;
    f->set.max = max;
    snprintf(f->txt_key, sizeof f->txt_key, "keyid=%s", f->set.key_id);
}

/* one answer from "w" at 10.0.0.2:7070 with these TXT strings */
static int add_txt(struct fixture *f, const char *const *txt, const size_t *len, int n)
{
    struct shoal_discover_answer a = {.name = "w", .host = "10.0.0.2", .port = 7070,
                                      .txt = txt, .txt_len = len, .n_txt = n};
    return shoal_discover_set_add(&f->set, &a);
}

/* one answer with TXT v=1, our keyid and fp */
static int add(struct fixture *f, const char *name, const char *host, int port)
{
    const char *txt[] = {"v=1", f->txt_key, "fp=0123456789abcdef"};
    const size_t len[] = {3, strlen(f->txt_key), 19};
    struct shoal_discover_answer a = {.name = name, .host = host, .port = port, .txt = txt,
                                      .txt_len = len, .n_txt = 3};
    return shoal_discover_set_add(&f->set, &a);
}

Test(discover, key_id_is_16_hex_differs_by_key_and_needs_a_key)
{
    char a[17], b[17], a2[17];
    struct shoal_wire_key k1 = key_of(1), k2 = key_of(2), none = {0};
    cr_assert(eq(int, shoal_discover_key_id(&k1, a), 0));
    cr_assert(eq(int, shoal_discover_key_id(&k2, b), 0));
    cr_assert(eq(int, shoal_discover_key_id(&k1, a2), 0));
    cr_assert(eq(sz, strlen(a), 16));
    cr_assert(eq(str, a, a2));
    cr_assert(ne(str, a, b));
    cr_assert(eq(int, shoal_discover_key_id(&none, a), -SHOAL_EINVAL));
    /* the key's bytes are not in it */
    cr_assert(ne(str, a, "0101010101010101"));
}

Test(discover, keeps_own_cluster_with_name_and_fingerprint)
{
    struct fixture f;
    fixture_init(&f, MAX_OUT);
    cr_assert(eq(int, add(&f, "w1", "10.0.0.2", 7070), 1));
    cr_assert(eq(int, f.set.n, 1));
    cr_assert(eq(str, f.out[0].addr, "10.0.0.2:7070"));
    cr_assert(eq(str, f.out[0].name, "w1"));
    cr_assert(eq(str, f.out[0].fingerprint, "0123456789abcdef"));
}

Test(discover, other_key_is_counted_not_kept)
{
    struct fixture f;
    fixture_init(&f, MAX_OUT);
    const char *txt[] = {"v=1", "keyid=00000000deadbeef"};
    const size_t len[] = {3, 22};
    cr_assert(eq(int, add_txt(&f, txt, len, 2), 0));
    cr_assert(eq(int, f.set.n, 0));
    cr_assert(eq(int, f.set.stats.other_key, 1));
}

Test(discover, malformed_answers_are_dropped)
{
    struct fixture f;
    fixture_init(&f, MAX_OUT);
    char huge[300];
    memset(huge, 'a', sizeof huge);
    memcpy(huge, "fp=", 3);
    const char *bad_txt[][3] = {
        {"v=2", f.txt_key, "fp=0123456789abcdef"},          /* unknown version */
        {"v=1", "keyid=0123", "fp=0123456789abcdef"},        /* short keyid */
        {"v=1", "keyid=0123456789ABCDEF", "fp=x"},           /* upper case, bad fp */
        {"v=1", f.txt_key, huge},                            /* > 255 bytes */
        {"v=1", "fp=0123456789abcdef", "x"},                 /* no keyid */
    };
    for (size_t i = 0; i < sizeof bad_txt / sizeof bad_txt[0]; i++) {
        size_t len[3];
        for (int j = 0; j < 3; j++)
            len[j] = bad_txt[i][j] == huge ? sizeof huge : strlen(bad_txt[i][j]);
        cr_assert(eq(int, add_txt(&f, bad_txt[i], len, 3), 0), "answer %zu", i);
    }
    cr_assert(eq(int, add(&f, "w", "not-an-address", 7070), 0));
    cr_assert(eq(int, add(&f, "w", "fe80::1", 7070), 0));     /* needs a scope id */
    cr_assert(eq(int, add(&f, "w", "10.0.0.2", 0), 0));
    cr_assert(eq(int, add(&f, "w", "10.0.0.2", 70000), 0));
    cr_assert(eq(int, f.set.n, 0));
    cr_assert(eq(int, f.set.stats.malformed, 9));
}

Test(discover, a_txt_value_with_a_nul_inside_is_malformed)
{
    struct fixture f;
    fixture_init(&f, MAX_OUT);
    char keyid[23];
    memcpy(keyid, f.txt_key, 22);
    keyid[10] = 0;   /* "keyid=" + 4 hex, NUL, rest */
    const char *txt[] = {"v=1", keyid};
    const size_t len[] = {3, 22};
    cr_assert(eq(int, add_txt(&f, txt, len, 2), 0));
    cr_assert(eq(int, f.set.stats.malformed, 1));
}

Test(discover, names_are_cut_and_unprintable_bytes_replaced)
{
    struct fixture f;
    fixture_init(&f, MAX_OUT);
    char name[200];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = 0;
    name[0] = '\n';
    name[1] = (char)0xc3;
    cr_assert(eq(int, add(&f, name, "10.0.0.2", 7070), 1));
    cr_assert(eq(sz, strlen(f.out[0].name), SHOAL_DISCOVER_NAME_MAX));
    cr_assert(eq(chr, f.out[0].name[0], '?'));
    cr_assert(eq(chr, f.out[0].name[1], '?'));
}

Test(discover, hundreds_of_answers_keep_at_most_max)
{
    struct fixture f;
    fixture_init(&f, 3);
    for (int i = 0; i < 500; i++) {
        char name[16], host[32];
        snprintf(name, sizeof name, "w%d", i);
        snprintf(host, sizeof host, "10.0.%d.%d", i / 200, i % 200 + 1);
        add(&f, name, host, 7070);
    }
    cr_assert(eq(int, f.set.n, 3));
    cr_assert(eq(int, f.set.stats.dropped, 497));
}

Test(discover, one_instance_once_ipv4_preferred_sorted)
{
    struct fixture f;
    fixture_init(&f, MAX_OUT);
    cr_assert(eq(int, add(&f, "b", "2001:db8::2", 7071), 1));
    cr_assert(eq(int, add(&f, "a", "10.0.0.9", 7070), 1));
    cr_assert(eq(int, add(&f, "a", "10.0.0.9", 7070), 0));       /* again: kept once */
    cr_assert(eq(int, add(&f, "b", "10.0.0.3", 7071), 1));       /* v4 replaces v6 */
    cr_assert(eq(int, add(&f, "b", "2001:db8::2", 7071), 0));    /* not back */
    cr_assert(eq(int, f.set.n, 2));
    shoal_discover_set_sort(&f.set);
    cr_assert(eq(str, f.out[0].addr, "10.0.0.3:7071"));
    cr_assert(eq(str, f.out[1].addr, "10.0.0.9:7070"));
}
