/* tokenizer: the builder the loaders use (vocabulary, merges, normalizer
 * and pre-tokenizer steps), the queries, decoding, and shoal_tokenizer_load's
 * dispatch on the kind of path; encoding is tokenizer_encode.c (see
 * tokenizer_impl.h). */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "gguf.h"
#include "tokenizer_impl.h"
#include "unicode.h"
#include "util.h"

const char shoal_tok_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
    "\\s+(?!\\S)|\\s+";

/* ------------------------------------------------------------------------
 * hashing
 */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

/* ------------------------------------------------------------------------
 * builder
 */

char *shoal_tok_memdup(const char *s, size_t n)
{
    char *p = shoal_xmalloc(n + 1);
    if (n)
        memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

struct shoal_tokenizer *shoal_tok_new_sparse(const char *name, size_t n_dense,
                                             const uint32_t *sparse_ids,
                                             size_t n_sparse)
{
    struct shoal_tokenizer *t = shoal_xcalloc(1, sizeof *t);
    t->name = shoal_xstrdup(name ? name : "(tokenizer)");
    t->n_dense = n_dense;
    t->n_slots = n_dense + n_sparse;
    t->n_vocab = n_sparse ? (size_t)sparse_ids[n_sparse - 1] + 1 : n_dense;
    if (n_sparse) {
        t->sparse_ids = shoal_xmalloc(n_sparse * sizeof *t->sparse_ids);
        memcpy(t->sparse_ids, sparse_ids, n_sparse * sizeof *t->sparse_ids);
    }
    t->vocab = shoal_xcalloc(t->n_slots ? t->n_slots : 1, sizeof *t->vocab);
    for (size_t i = 0; i < t->n_slots; i++)
        t->vocab[i].attr = SHOAL_TOK_UNUSED;
    t->unk_id = t->bos_id = t->eos_id = -1;
    for (int b = 0; b < 256; b++)
        t->byte_ids[b] = -1;
    return t;
}

struct shoal_tokenizer *shoal_tok_new(const char *name, size_t n_vocab)
{
    return shoal_tok_new_sparse(name, n_vocab, NULL, 0);
}

size_t shoal_tok_slot(const struct shoal_tokenizer *t, uint32_t id)
{
    if (id < t->n_dense)
        return id;
    size_t lo = 0, hi = t->n_slots - t->n_dense;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->sparse_ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < t->n_slots - t->n_dense && t->sparse_ids[lo] == id)
        return t->n_dense + lo;
    return SIZE_MAX;
}

const struct shoal_tok_entry *shoal_tok_sparse_entry(
    const struct shoal_tokenizer *t, uint32_t id)
{
    static const struct shoal_tok_entry unused = {.attr = SHOAL_TOK_UNUSED};
    size_t slot = shoal_tok_slot(t, id);
    return slot == SIZE_MAX ? &unused : &t->vocab[slot];
}

uint32_t shoal_tok_blob_add(struct shoal_tokenizer *t, const char *s,
                            size_t n)
{
    struct buf b = {t->blob, t->blob_len, t->blob_cap};
    buf_add(&b, s, n);
    t->blob = b.p;
    t->blob_cap = b.cap;
    uint32_t off = (uint32_t)t->blob_len;
    t->blob_len = b.len;
    return off;
}

void shoal_tok_set(struct shoal_tokenizer *t, uint32_t id, const char *text,
                   size_t text_len, const char *piece, size_t piece_len,
                   float score, uint32_t attr)
{
    struct shoal_tok_entry *e = shoal_tok_entry_mut(t, id);
    if (!e) {
        fprintf(stderr, "shoal: internal error: tokenizer '%s' has no slot "
                "for id %u\n", t->name, id);
        abort();
    }
    e->text_off = shoal_tok_blob_add(t, text, text_len);
    e->text_len = (uint32_t)text_len;
    if (piece == text && piece_len == text_len) {
        e->piece_off = e->text_off;
    } else {
        e->piece_off = shoal_tok_blob_add(t, piece, piece_len);
    }
    e->piece_len = (uint32_t)piece_len;
    e->score = score;
    e->attr = attr;
}

static const char *entry_text(const struct shoal_tokenizer *t, uint32_t id)
{
    return t->blob + shoal_tok_entry(t, id)->text_off;
}

static const char *entry_piece(const struct shoal_tokenizer *t, uint32_t id)
{
    return t->blob + shoal_tok_entry(t, id)->piece_off;
}

int32_t shoal_tok_lookup(const struct shoal_tokenizer *t, const char *s,
                         size_t n)
{
    if (!t->map)
        return -1;
    size_t i = (size_t)hash_bytes(s, n) & t->map_mask;
    for (;;) {
        uint32_t id = t->map[i];
        if (id == UINT32_MAX)
            return -1;
        const struct shoal_tok_entry *e = shoal_tok_entry(t, id);
        if (e->text_len == n && memcmp(t->blob + e->text_off, s, n) == 0)
            return (int32_t)id;
        i = (i + 1) & t->map_mask;
    }
}

struct added_key {
    uint8_t first; /* first byte of the content */
    uint32_t len;  /* content length */
    uint32_t id;
};

static int cmp_added(const void *pa, const void *pb)
{
    const struct added_key *a = pa, *b = pb;
    if (a->first != b->first)
        return a->first < b->first ? -1 : 1;
    if (a->len != b->len)
        return a->len > b->len ? -1 : 1; /* longest first */
    return a->id < b->id ? -1 : (a->id > b->id);
}

int shoal_tok_build_index(struct shoal_tokenizer *t, struct shoal_err *err)
{
    /* the blob is final now: fix the sizes that depend on it */
    if (t->blob_len > UINT32_MAX)
        return shoal_err_set(err, SHOAL_ERANGE,
                             "tokenizer '%s': token texts take %zu bytes; "
                             "at most 4 GiB supported",
                             t->name, t->blob_len);
    size_t cap = pow2_at_least(t->n_slots * 2 + 1);
    free(t->map);
    t->map = shoal_xmalloc(cap * sizeof *t->map);
    memset(t->map, 0xFF, cap * sizeof *t->map);
    t->map_mask = cap - 1;
    t->max_piece_len = 0;
    for (size_t slot = 0; slot < t->n_slots; slot++) {
        const struct shoal_tok_entry *e = &t->vocab[slot];
        uint32_t id = shoal_tok_slot_id(t, slot);
        if (e->piece_len > t->max_piece_len)
            t->max_piece_len = e->piece_len;
        if (!(e->attr & SHOAL_TOK_IN_MODEL) || e->text_len == 0)
            continue;
        const char *s = t->blob + e->text_off;
        size_t i = (size_t)hash_bytes(s, e->text_len) & t->map_mask;
        int dup = 0;
        while (t->map[i] != UINT32_MAX) {
            const struct shoal_tok_entry *o = shoal_tok_entry(t, t->map[i]);
            if (o->text_len == e->text_len &&
                memcmp(t->blob + o->text_off, s, e->text_len) == 0) {
                dup = 1; /* keep the first (lowest) id */
                break;
            }
            i = (i + 1) & t->map_mask;
        }
        if (!dup)
            t->map[i] = id;
    }

    /* byte tokens: the raw byte (byte-level) or <0xXX> (byte fallback) */
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        char hex[7];
        static const char digits[] = "0123456789ABCDEF";
        hex[0] = '<', hex[1] = '0', hex[2] = 'x';
        hex[3] = digits[b >> 4], hex[4] = digits[b & 15], hex[5] = '>';
        int32_t id = -1;
        if (t->byte_level) {
            id = shoal_tok_lookup(t, &c, 1);
        } else {
            id = shoal_tok_lookup(t, hex, 6);
            if (id < 0 && t->model == SHOAL_TOK_MODEL_SPM)
                id = shoal_tok_lookup(t, &c, 1);
        }
        t->byte_ids[b] = id;
    }

    /* added tokens, bucketed by first byte, longest first */
    free(t->added);
    t->added = shoal_xmalloc((t->n_slots ? t->n_slots : 1) *
                             sizeof *t->added);
    t->n_added = 0;
    t->has_normalized_added = 0;
    struct added_key *keys =
        shoal_xmalloc((t->n_slots ? t->n_slots : 1) * sizeof *keys);
    size_t n_keys = 0;
    for (size_t slot = 0; slot < t->n_slots; slot++) {
        const struct shoal_tok_entry *e = &t->vocab[slot];
        uint32_t id = shoal_tok_slot_id(t, slot);
        if (e->piece_len == 0 ||
            !(e->attr & (SHOAL_TOK_CONTROL | SHOAL_TOK_USER_DEFINED |
                         SHOAL_TOK_UNKNOWN)))
            continue;
        keys[n_keys++] = (struct added_key){
            (uint8_t)t->blob[e->piece_off], e->piece_len, (uint32_t)id};
        if (e->attr & SHOAL_TOK_NORMALIZED)
            t->has_normalized_added = 1;
    }
    if (n_keys)
        qsort(keys, n_keys, sizeof *keys, cmp_added);
    for (size_t k = 0; k < n_keys; k++)
        t->added[k] = keys[k].id;
    t->n_added = n_keys;
    free(keys);
    size_t k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < t->n_added && b < 256 &&
               (uint8_t)t->blob[shoal_tok_entry(t, t->added[k])->piece_off] < b)
            k++;
        t->added_first[b] = (uint32_t)(b == 256 ? t->n_added : k);
    }
    return 0;
}

static void merges_insert(struct shoal_tok_merge *tab, size_t mask,
                          struct shoal_tok_merge m)
{
    size_t i = (size_t)hash_u64(m.key) & mask;
    while (tab[i].key != UINT64_MAX) {
        if (tab[i].key == m.key)
            return; /* duplicate pair: the first (best) rank wins */
        i = (i + 1) & mask;
    }
    tab[i] = m;
}

/* Resize the merge table to hold n entries at most half full. */
void shoal_tok_merges_reserve(struct shoal_tokenizer *t, size_t n)
{
    size_t cap = pow2_at_least(n * 2 + 1);
    if (t->merges && cap <= t->merges_mask + 1)
        return;
    struct shoal_tok_merge *tab = shoal_xmalloc(cap * sizeof *tab);
    for (size_t i = 0; i < cap; i++)
        tab[i].key = UINT64_MAX;
    if (t->merges)
        for (size_t i = 0; i <= t->merges_mask; i++)
            if (t->merges[i].key != UINT64_MAX)
                merges_insert(tab, cap - 1, t->merges[i]);
    free(t->merges);
    t->merges = tab;
    t->merges_mask = cap - 1;
}

const struct shoal_tok_merge *shoal_tok_merge_find(const struct shoal_tokenizer *t,
                                                  int32_t l, int32_t r)
{
    if (!t->merges)
        return NULL;
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    size_t i = (size_t)hash_u64(key) & t->merges_mask;
    for (;;) {
        const struct shoal_tok_merge *m = &t->merges[i];
        if (m->key == key)
            return m;
        if (m->key == UINT64_MAX)
            return NULL;
        i = (i + 1) & t->merges_mask;
    }
}

int shoal_tok_add_merge(struct shoal_tokenizer *t, const char *l, size_t ln,
                        const char *r, size_t rn)
{
    uint32_t rank = (uint32_t)t->n_merges++;
    int32_t li = shoal_tok_lookup(t, l, ln), ri = shoal_tok_lookup(t, r, rn);
    if (li < 0 || ri < 0)
        return 1;
    char stack[256];
    char *cat = ln + rn <= sizeof stack ? stack : shoal_xmalloc(ln + rn);
    memcpy(cat, l, ln);
    memcpy(cat + ln, r, rn);
    int32_t mi = shoal_tok_lookup(t, cat, ln + rn);
    if (cat != stack)
        free(cat);
    if (mi < 0)
        return 1;
    shoal_tok_add_merge_ranked(t, li, ri, rank, mi);
    return 0;
}

void shoal_tok_add_merge_ranked(struct shoal_tokenizer *t, int32_t left,
                                int32_t right, uint32_t rank, int32_t merged)
{
    if (!t->merges || (t->n_merges_used + 1) * 2 > t->merges_mask + 1)
        shoal_tok_merges_reserve(t, 2 * (t->n_merges_used + 1));
    struct shoal_tok_merge m = {
        ((uint64_t)(uint32_t)left << 32) | (uint32_t)right, rank, merged};
    merges_insert(t->merges, t->merges_mask, m);
    t->n_merges_used++;
}

pcre2_code *shoal_tok_regex_compile(const char *pattern, size_t len,
                                    int literal, const char *what,
                                    struct shoal_err *err)
{
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY |
                    PCRE2_MATCH_INVALID_UTF;
    if (literal)
        opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | PCRE2_LITERAL;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pattern, len, opts, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        shoal_err_set(err, SHOAL_EFORMAT,
                      "%s: regex /%.*s/ does not compile at offset %zu: %s",
                      what, (int)(len > 120 ? 120 : len), pattern,
                      (size_t)eo, (const char *)msg);
        return NULL;
    }
    /* JIT is an optimization only: matching falls back when it fails */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}

struct shoal_tok_norm_op *shoal_tok_add_norm(struct shoal_tokenizer *t,
                                             enum shoal_tok_norm_kind kind)
{
    t->norm = shoal_xrealloc(t->norm, (t->n_norm + 1) * sizeof *t->norm);
    struct shoal_tok_norm_op *op = &t->norm[t->n_norm++];
    memset(op, 0, sizeof *op);
    op->kind = kind;
    return op;
}

struct shoal_tok_pre_op *shoal_tok_add_pre(struct shoal_tokenizer *t,
                                           enum shoal_tok_pre_kind kind)
{
    t->pre = shoal_xrealloc(t->pre, (t->n_pre + 1) * sizeof *t->pre);
    struct shoal_tok_pre_op *op = &t->pre[t->n_pre++];
    memset(op, 0, sizeof *op);
    op->kind = kind;
    return op;
}

void shoal_tok_add_prefix(struct shoal_tokenizer *t, int32_t id)
{
    t->prefix = shoal_xrealloc(t->prefix, (t->n_prefix + 1) * sizeof(int32_t));
    t->prefix[t->n_prefix++] = id;
}

void shoal_tok_add_suffix(struct shoal_tokenizer *t, int32_t id)
{
    t->suffix = shoal_xrealloc(t->suffix, (t->n_suffix + 1) * sizeof(int32_t));
    t->suffix[t->n_suffix++] = id;
}

void shoal_tokenizer_destroy(struct shoal_tokenizer *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n_norm; i++) {
        free(t->norm[i].a);
        free(t->norm[i].b);
        pcre2_code_free(t->norm[i].re);
    }
    free(t->norm);
    for (size_t i = 0; i < t->n_pre; i++) {
        free(t->pre[i].a);
        pcre2_code_free(t->pre[i].re);
    }
    free(t->pre);
    free(t->prefix);
    free(t->suffix);
    free(t->added);
    free(t->merges);
    free(t->map);
    free(t->blob);
    free(t->vocab);
    free(t->sparse_ids);
    free(t->name);
    free(t);
}

/* ------------------------------------------------------------------------
 * queries
 */

int32_t shoal_tokenizer_n_vocab(const struct shoal_tokenizer *t)
{
    return (int32_t)t->n_vocab;
}

int32_t shoal_tokenizer_bos(const struct shoal_tokenizer *t)
{
    return t->bos_id;
}

int32_t shoal_tokenizer_eos(const struct shoal_tokenizer *t)
{
    return t->eos_id;
}

int32_t shoal_tokenizer_token_id(const struct shoal_tokenizer *t,
                                 const char *text)
{
    size_t n = strlen(text);
    /* added tokens first: their content is what a user writes */
    for (size_t k = 0; k < t->n_added; k++) {
        const struct shoal_tok_entry *e = shoal_tok_entry(t, t->added[k]);
        if (e->piece_len == n && memcmp(t->blob + e->piece_off, text, n) == 0)
            return (int32_t)t->added[k];
    }
    return shoal_tok_lookup(t, text, n);
}

int shoal_tokenizer_is_special(const struct shoal_tokenizer *t, int32_t id)
{
    if (id < 0 || (size_t)id >= t->n_vocab)
        return 0;
    return (shoal_tok_entry(t, (uint32_t)id)->attr &
            (SHOAL_TOK_CONTROL | SHOAL_TOK_UNKNOWN)) != 0;
}

int shoal_tokenizer_token_text(const struct shoal_tokenizer *t, int32_t id,
                               const char **text, size_t *len)
{
    if (id < 0 || (size_t)id >= t->n_vocab)
        return SHOAL_ERANGE;
    *text = entry_text(t, (uint32_t)id);
    *len = shoal_tok_entry(t, (uint32_t)id)->text_len;
    return 0;
}

/* ------------------------------------------------------------------------
 * streaming decode
 */

struct shoal_detok {
    const struct shoal_tokenizer *tok;
    int skip_special;
    int at_start;   /* the decoder's leading-space strip is still pending */
    char pend[4];   /* held-back bytes of an unfinished UTF-8 sequence */
    size_t n_pend;
};

struct shoal_detok *shoal_detok_create(const struct shoal_tokenizer *tok,
                                       int skip_special)
{
    struct shoal_detok *d = shoal_xcalloc(1, sizeof *d);
    d->tok = tok;
    d->skip_special = skip_special;
    d->at_start = 1;
    return d;
}

void shoal_detok_destroy(struct shoal_detok *d)
{
    free(d);
}

size_t shoal_detok_out_max(const struct shoal_tokenizer *tok)
{
    /* held bytes + one piece, each byte possibly becoming U+FFFD, + NUL */
    return 3 * ((size_t)tok->max_piece_len + 4) + 1;
}

/* Rendered bytes of id for this stream (may be empty). */
static void detok_piece(const struct shoal_detok *d, int32_t id,
                        const char **p, size_t *n)
{
    const struct shoal_tokenizer *t = d->tok;
    const struct shoal_tok_entry *e = shoal_tok_entry(t, (uint32_t)id);
    *p = entry_piece(t, (uint32_t)id);
    *n = e->piece_len;
    if ((e->attr & SHOAL_TOK_UNUSED) ||
        (d->skip_special && (e->attr & (SHOAL_TOK_CONTROL |
                                        SHOAL_TOK_UNKNOWN))))
        *n = 0;
}

/* Emit pend + s[0..n) up to the last complete sequence; keep the rest.
 * flush: emit everything (an unfinished tail becomes U+FFFD). */
static int detok_emit(struct shoal_detok *d, const char *s, size_t n,
                      int flush, char *out, size_t out_cap,
                      struct shoal_err *err)
{
    size_t total = d->n_pend + n;
    char stack[512];
    char *all = total <= sizeof stack ? stack : shoal_xmalloc(total);
    memcpy(all, d->pend, d->n_pend);
    if (n)
        memcpy(all + d->n_pend, s, n);
    size_t ready = flush ? total : shoal_utf8_complete_prefix(all, total);
    /* sanitize into a scratch area first so a short out changes nothing */
    char stack2[1536];
    size_t need = 3 * ready;
    char *san = need <= sizeof stack2 ? stack2 : shoal_xmalloc(need ? need : 1);
    size_t m = shoal_utf8_sanitize(all, ready, san);
    int rc;
    if (!out || m + 1 > out_cap) {
        rc = shoal_err_set(err, SHOAL_ERANGE,
                           "detokenizer: output needs %zu bytes plus the "
                           "terminator; buffer holds %zu",
                           m, out_cap);
    } else {
        memcpy(out, san, m);
        out[m] = '\0';
        d->n_pend = total - ready;
        memmove(d->pend, all + ready, d->n_pend);
        rc = (int)m;
    }
    if (san != stack2)
        free(san);
    if (all != stack)
        free(all);
    return rc;
}

int shoal_detok_feed(struct shoal_detok *d, int32_t id, char *out,
                     size_t out_cap, struct shoal_err *err)
{
    const struct shoal_tokenizer *t = d->tok;
    if (id < 0 || (size_t)id >= t->n_vocab)
        return shoal_err_set(err, SHOAL_ERANGE,
                             "token id %d is outside the vocabulary of "
                             "'%s' (0..%zu)",
                             (int)id, t->name, t->n_vocab - 1);
    const char *p;
    size_t n;
    detok_piece(d, id, &p, &n);
    int strip = 0;
    if (d->at_start && n > 0) {
        strip = t->dec_strip_leading && p[0] == ' ';
        p += strip;
        n -= (size_t)strip;
    }
    int rc = detok_emit(d, p, n, 0, out, out_cap, err);
    if (rc >= 0 && (n > 0 || strip))
        d->at_start = 0;
    return rc;
}

int shoal_detok_flush(struct shoal_detok *d, char *out, size_t out_cap)
{
    return detok_emit(d, NULL, 0, 1, out, out_cap, NULL);
}

char *shoal_tokenizer_decode(const struct shoal_tokenizer *tok,
                             const int32_t *ids, size_t n_ids,
                             int skip_special, struct shoal_err *err)
{
    return shoal_tokenizer_decode_len(tok, ids, n_ids, skip_special, NULL, err);
}

char *shoal_tokenizer_decode_len(const struct shoal_tokenizer *tok,
                                 const int32_t *ids, size_t n_ids,
                                 int skip_special, size_t *len, struct shoal_err *err)
{
    struct shoal_detok *d = shoal_detok_create(tok, skip_special);
    size_t cap = shoal_detok_out_max(tok);
    char *piece = shoal_xmalloc(cap);
    struct buf res = {0};
    buf_reserve(&res, 1);
    for (size_t i = 0; i < n_ids; i++) {
        int n = shoal_detok_feed(d, ids[i], piece, cap, err);
        if (n < 0) {
            free(res.p);
            res.p = NULL;
            goto done;
        }
        buf_add(&res, piece, (size_t)n);
    }
    int n = shoal_detok_flush(d, piece, cap);
    if (n > 0)
        buf_add(&res, piece, (size_t)n);
    res.p[res.len] = '\0';
    if (len)
        *len = res.len;
done:
    free(piece);
    shoal_detok_destroy(d);
    return res.p;
}

/* ------------------------------------------------------------------------
 * loading: dispatch on the path
 */

#define SHOAL_TOK_MAX_JSON ((size_t)512 << 20)
#define SHOAL_TOK_MAX_TIKTOKEN ((size_t)256 << 20) /* Kimi-K2's: 2.8 MB */

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int has_gguf_magic(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    char m[4] = {0};
    size_t got = fread(m, 1, 4, f);
    fclose(f);
    return got == 4 && memcmp(m, "GGUF", 4) == 0;
}

/* Read the tokenizer_config.json beside path ("dir/<name>" ->
 * "dir/tokenizer_config.json", "X.<name>" -> "X.tokenizer_config.json"),
 * if there is one: 0 with *cfg NULL when absent, or -errno with err set. */
static int read_sibling_config(const char *path, const char *name,
                               char **cfg, size_t *cfg_len,
                               struct shoal_err *err)
{
    *cfg = NULL;
    *cfg_len = 0;
    if (!ends_with(path, name))
        return 0;
    size_t base = strlen(path) - strlen(name);
    char *cfg_path = shoal_xmalloc(base + sizeof "tokenizer_config.json");
    memcpy(cfg_path, path, base);
    strcpy(cfg_path + base, "tokenizer_config.json");
    int rc = shoal_exists(cfg_path)
                 ? shoal_read_file(cfg_path, SHOAL_TOK_MAX_JSON, cfg, cfg_len, err)
                 : 0;
    free(cfg_path);
    return rc;
}

static struct shoal_tokenizer *load_json_file(const char *path,
                                              struct shoal_err *err)
{
    char *json = NULL, *cfg = NULL;
    size_t json_len = 0, cfg_len = 0;
    struct shoal_tokenizer *t = NULL;
    if (shoal_read_file(path, SHOAL_TOK_MAX_JSON, &json, &json_len, err))
        return NULL;
    if (!read_sibling_config(path, "tokenizer.json", &cfg, &cfg_len, err))
        t = shoal_tok_load_hf(json, json_len, cfg, cfg_len, path, err);
    free(cfg);
    free(json);
    return t;
}

/* "dir/tiktoken.model" with "dir/tokenizer_config.json" when present. */
static struct shoal_tokenizer *load_tiktoken_file(const char *path,
                                                  struct shoal_err *err)
{
    char *model = NULL, *cfg = NULL;
    size_t model_len = 0, cfg_len = 0;
    struct shoal_tokenizer *t = NULL;
    if (shoal_read_file(path, SHOAL_TOK_MAX_TIKTOKEN, &model, &model_len, err))
        return NULL;
    if (!read_sibling_config(path, "tiktoken.model", &cfg, &cfg_len, err))
        t = shoal_tok_load_tiktoken(model, model_len, cfg, cfg_len, path, err);
    free(cfg);
    free(model);
    return t;
}

int shoal_tokenizer_present(const char *dir)
{
    static const char *const names[] = {"tokenizer.json", "tiktoken.model", "tokenizer.gguf"};
    for (size_t k = 0; k < 3; k++) {
        char *p = shoal_path_join(dir, names[k]);
        int ok = shoal_exists(p);
        free(p);
        if (ok)
            return 1;
    }
    return 0;
}

struct shoal_tokenizer *shoal_tokenizer_load(const char *path,
                                             struct shoal_err *err)
{
    if (!path)
        return shoal_err_set(err, SHOAL_EINVAL, "tokenizer: no path given"),
               NULL;
    if (shoal_is_dir(path)) {
        char *p = shoal_path_join(path, "tokenizer.json");
        char *tk = shoal_path_join(path, "tiktoken.model");
        char *tg = shoal_path_join(path, "tokenizer.gguf");
        struct shoal_tokenizer *t = NULL;
        if (shoal_exists(p)) {
            t = load_json_file(p, err);
        } else if (shoal_exists(tk)) {
            t = load_tiktoken_file(tk, err);
        } else if (shoal_exists(tg)) {   /* a converted GGUF's vocabulary */
            t = shoal_tokenizer_load(tg, err);
        } else {
            shoal_err_set(err, SHOAL_ENOTFOUND,
                          "tokenizer: directory '%s' has no tokenizer.json, "
                          "tiktoken.model or tokenizer.gguf",
                          path);
        }
        free(p);
        free(tk);
        free(tg);
        return t;
    }
    if (!shoal_exists(path)) {
        shoal_err_set(err, SHOAL_ENOTFOUND, "tokenizer: '%s' does not exist",
                      path);
        return NULL;
    }
    if (ends_with(path, ".gguf") || has_gguf_magic(path)) {
        struct shoal_gguf *g = shoal_gguf_open(path, err);
        if (!g)
            return NULL;
        struct shoal_tokenizer *t = shoal_tokenizer_load_gguf(g, path, err);
        shoal_gguf_close(g);
        return t;
    }
    if (ends_with(path, "tiktoken.model"))
        return load_tiktoken_file(path, err);
    return load_json_file(path, err);
}

struct shoal_tokenizer *shoal_tokenizer_load_hf_mem(const char *json,
                                                    size_t json_len,
                                                    const char *config,
                                                    size_t config_len,
                                                    const char *name,
                                                    struct shoal_err *err)
{
    return shoal_tok_load_hf(json, json_len, config, config_len,
                             name ? name : "(memory)", err);
}
