/* discover.c: what every backend shares (discover.h): the key id and the
 * checks of one answer. No mDNS here: the packets are the library's. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "discover.h"

/* the label keeps the key id apart from every other use of the key (the
 * handshake's MACs have labels of their own) */
static const char KEY_ID_LABEL[] = "shoal discovery key id v1";

int shoal_discover_key_id(const struct shoal_wire_key *key,
                          char out[SHOAL_DISCOVER_KEY_ID_HEX + 1])
{
    if (!key || !key->set)
        return -SHOAL_EINVAL;
    unsigned char mac[crypto_auth_hmacsha256_BYTES];
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key->bytes, sizeof key->bytes);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)KEY_ID_LABEL,
                                  sizeof KEY_ID_LABEL - 1);
    crypto_auth_hmacsha256_final(&st, mac);
    sodium_bin2hex(out, SHOAL_DISCOVER_KEY_ID_HEX + 1, mac, SHOAL_DISCOVER_KEY_ID_HEX / 2);
    sodium_memzero(&st, sizeof st);
    return 0;
}

static int is_hex16(const char *v, size_t len)
{
    if (len != 16)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!((v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'f')))
            return 0;
    return 1;
}

/* The value of TXT key k (len bytes "k=value"), or NULL. */
static const char *txt_value(const struct shoal_discover_answer *a, const char *k,
                             size_t *vlen)
{
    const size_t kl = strlen(k);
    for (int i = 0; i < a->n_txt; i++) {
        if (a->txt_len[i] > kl && !memcmp(a->txt[i], k, kl) && a->txt[i][kl] == '=') {
            *vlen = a->txt_len[i] - kl - 1;
            return a->txt[i] + kl + 1;
        }
    }
    return NULL;
}

int shoal_discover_set_add(struct shoal_discover_set *set,
                           const struct shoal_discover_answer *a)
{
    /* a TXT string is one length byte on the wire: longer is not DNS */
    for (int i = 0; i < a->n_txt; i++)
        if (a->txt_len[i] > 255)
            goto malformed;
    size_t vl = 0, kl = 0, fl = 0;
    const char *v = txt_value(a, "v", &vl);
    const char *keyid = txt_value(a, "keyid", &kl);
    const char *fp = txt_value(a, "fp", &fl);
    if (!v || vl != 1 || v[0] != '1' || !keyid || !is_hex16(keyid, kl) ||
        (fp && !is_hex16(fp, fl)))
        goto malformed;
    if (memcmp(keyid, set->key_id, SHOAL_DISCOVER_KEY_ID_HEX)) {
        set->stats.other_key++;
        return 0;
    }
    if (!a->name || !a->host || a->port < 1 || a->port > 65535)
        goto malformed;
    /* numeric addresses only: a name would be resolved again, elsewhere */
    char addr[SHOAL_DISCOVER_ADDR_MAX];
    struct in_addr v4;
    struct in6_addr v6;
    int is_v4 = 0;
    if (inet_pton(AF_INET, a->host, &v4) == 1) {
        is_v4 = 1;
        snprintf(addr, sizeof addr, "%s:%d", a->host, a->port);
    } else if (inet_pton(AF_INET6, a->host, &v6) == 1) {
        /* fe80::/10 needs a scope id, which HOST:PORT cannot carry */
        if (v6.s6_addr[0] == 0xfe && (v6.s6_addr[1] & 0xc0) == 0x80)
            goto malformed;
        char buf[INET6_ADDRSTRLEN];
        inet_ntop(AF_INET6, &v6, buf, sizeof buf);
        snprintf(addr, sizeof addr, "[%s]:%d", buf, a->port);
    } else {
        goto malformed;
    }
    char name[SHOAL_DISCOVER_NAME_MAX + 1];
    size_t i = 0;
    for (; a->name[i] && i < SHOAL_DISCOVER_NAME_MAX; i++)
        name[i] = a->name[i] >= 0x20 && a->name[i] < 0x7f ? a->name[i] : '?';
    name[i] = 0;
    struct shoal_discover_worker *w = NULL;
    for (int j = 0; j < set->n; j++)
        if (!strcmp(set->out[j].name, name) || !strcmp(set->out[j].addr, addr)) {
            /* the same instance again (another interface or family) */
            if (!is_v4 || set->out[j].addr[0] != '[')
                return 0;
            w = &set->out[j];
        }
    if (!w) {
        if (set->n >= set->max) {
            set->stats.dropped++;
            return 0;
        }
        w = &set->out[set->n++];
    }
    memcpy(w->addr, addr, sizeof addr);
    memcpy(w->name, name, sizeof name);
    w->fingerprint[0] = 0;
    if (fp) {
        memcpy(w->fingerprint, fp, 16);
        w->fingerprint[16] = 0;
    }
    return 1;
malformed:
    set->stats.malformed++;
    return 0;
}

static int cmp_addr(const void *a, const void *b)
{
    return strcmp(((const struct shoal_discover_worker *)a)->addr,
                  ((const struct shoal_discover_worker *)b)->addr);
}

void shoal_discover_set_sort(struct shoal_discover_set *set)
{
    qsort(set->out, (size_t)set->n, sizeof set->out[0], cmp_addr);
}
