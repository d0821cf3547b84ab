/* tokenizer: encode/decode over the shared pipeline (see tokenizer_impl.h),
 * the builder used by the loaders, and shoal_tokenizer_load's dispatch on
 * the kind of path. */
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
 * small growable buffers
 */

struct buf {
    char *p;
    size_t len, cap;
};

static void buf_reserve(struct buf *b, size_t extra)
{
    if (b->cap - b->len >= extra)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra)
        cap *= 2;
    b->p = shoal_xrealloc(b->p, cap);
    b->cap = cap;
}

static void buf_add(struct buf *b, const char *s, size_t n)
{
    buf_reserve(b, n + 1);
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
}

struct ivec {
    int32_t *v;
    size_t n, cap;
};

static void ivec_push(struct ivec *a, int32_t x)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->v = shoal_xrealloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = x;
}

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

static const struct shoal_tok_merge *merge_find(const struct shoal_tokenizer *t,
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
 * encode: scratch state
 */

struct span {
    size_t off, len;
    int origin; /* starts at offset 0 of the whole input */
};

struct spans {
    struct span *v;
    size_t n, cap;
};

static void spans_push(struct spans *s, size_t off, size_t len, int origin)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->v = shoal_xrealloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n].off = off;
    s->v[s->n].len = len;
    s->v[s->n].origin = origin;
    s->n++;
}

struct frag {
    size_t off, len;
    int32_t id; /* >= 0: an added token; -1: text */
};

struct frags {
    struct frag *v;
    size_t n, cap;
};

static void frags_push(struct frags *f, size_t off, size_t len, int32_t id)
{
    if (f->n == f->cap) {
        f->cap = f->cap ? 2 * f->cap : 16;
        f->v = shoal_xrealloc(f->v, f->cap * sizeof *f->v);
    }
    f->v[f->n].off = off;
    f->v[f->n].len = len;
    f->v[f->n].id = id;
    f->n++;
}

struct sym {
    size_t off, len; /* bytes in the piece; len 0 = merged away */
    int32_t id;      /* token, or -1 (SPM: not looked up yet) */
    int32_t prev, next;
};

struct cand {
    uint64_t key;  /* min-heap order: priority then left index */
    int32_t left, right;
    int32_t lid, rid; /* BPE: ids when pushed; SPM: rid = merged size */
    int32_t id;       /* the merged token */
};

struct work {
    pcre2_match_data *md;
    struct buf norm_a, norm_b; /* normalizer ping-pong */
    struct buf pre_a, pre_b;   /* pre-tokenizer texts */
    struct spans sp_a, sp_b;
    struct frags frags, frags2;
    struct sym *syms;
    size_t syms_cap;
    struct cand *heap;
    size_t heap_n, heap_cap;
    struct shoal_err *err;
    const char *name;
};

static void work_free(struct work *w)
{
    pcre2_match_data_free(w->md);
    free(w->norm_a.p);
    free(w->norm_b.p);
    free(w->pre_a.p);
    free(w->pre_b.p);
    free(w->sp_a.v);
    free(w->sp_b.v);
    free(w->frags.v);
    free(w->frags2.v);
    free(w->syms);
    free(w->heap);
}

static void heap_push(struct work *w, struct cand c)
{
    if (w->heap_n == w->heap_cap) {
        w->heap_cap = w->heap_cap ? 2 * w->heap_cap : 64;
        w->heap = shoal_xrealloc(w->heap, w->heap_cap * sizeof *w->heap);
    }
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (w->heap[p].key <= c.key)
            break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = c;
}

static struct cand heap_pop(struct work *w)
{
    struct cand top = w->heap[0];
    struct cand last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n)
            break;
        size_t m = (l + 1 < n && w->heap[l + 1].key < w->heap[l].key) ? l + 1
                                                                      : l;
        if (last.key <= w->heap[m].key)
            break;
        w->heap[i] = w->heap[m];
        i = m;
    }
    if (n > 0)
        w->heap[i] = last;
    return top;
}

static struct sym *syms_reserve(struct work *w, size_t n)
{
    if (w->syms_cap < n) {
        w->syms_cap = n + n / 2 + 16;
        w->syms = shoal_xrealloc(w->syms, w->syms_cap * sizeof *w->syms);
    }
    return w->syms;
}

/* ------------------------------------------------------------------------
 * regex matching (PCRE2, JIT when available)
 */

/* Find the next match of re in s[0..n) at or after start.
 * Returns 1 (match at [*ms, *me)), 0 (none) or a negative status. */
static int re_next(struct work *w, pcre2_code *re, const char *s, size_t n,
                   size_t start, size_t *ms, size_t *me)
{
    if (!w->md)
        w->md = pcre2_match_data_create(4, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, start, 0, w->md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, start, PCRE2_NO_JIT, w->md,
                         NULL);
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return shoal_err_set(w->err, SHOAL_ERANGE,
                             "tokenizer '%s': regex match failed on a "
                             "%zu-byte piece: %s",
                             w->name, n, (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

static size_t char_len_at(const char *s, size_t n, size_t i)
{
    size_t l = shoal_utf8_seq_len((uint8_t)s[i]);
    return l < n - i ? l : n - i;
}

/* ------------------------------------------------------------------------
 * added-token partition
 */

static int is_space_byte(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' ||
           c == '\r';
}

/* 1 if the character ending right before s[i] (or starting at s[i]) is a
 * word character: letters, digits and '_' (ASCII or any non-ASCII letter
 * or number, judged by utf8proc). */
static int word_char_at(const char *s, size_t n, size_t i, int before)
{
    if (before) {
        if (i == 0)
            return 0;
        size_t j = i - 1;
        while (j > 0 && ((uint8_t)s[j] & 0xC0) == 0x80 && i - j < 4)
            j--;
        i = j;
    } else if (i >= n) {
        return 0;
    }
    uint32_t cp;
    if (shoal_utf8_decode(s + i, n - i, &cp) == 0)
        return 0;
    if (cp == '_')
        return 1;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

/* Split s[base..base+n) into text fragments and added-token matches,
 * leftmost-longest (as HF's added vocabulary does), honouring lstrip,
 * rstrip and single_word. normalized: which class of added tokens to
 * match (those flagged SHOAL_TOK_NORMALIZED, or the others). */
static void partition(const struct shoal_tokenizer *t, const char *s,
                      size_t base, size_t n, int parse_special,
                      int normalized, struct frags *out)
{
    size_t last = base, end = base + n, i = base;
    if (t->n_added == 0 || n == 0) {
        if (n)
            frags_push(out, base, n, -1);
        return;
    }
    while (i < end) {
        uint8_t b = (uint8_t)s[i];
        uint32_t k0 = t->added_first[b], k1 = t->added_first[b + 1];
        int32_t hit = -1;
        size_t hit_len = 0;
        for (uint32_t k = k0; k < k1; k++) {
            uint32_t id = t->added[k];
            const struct shoal_tok_entry *e = shoal_tok_entry(t, id);
            if (!!(e->attr & SHOAL_TOK_NORMALIZED) != !!normalized)
                continue;
            if (!parse_special &&
                (e->attr & (SHOAL_TOK_CONTROL | SHOAL_TOK_UNKNOWN)))
                continue;
            if (e->piece_len > end - i ||
                memcmp(s + i, t->blob + e->piece_off, e->piece_len) != 0)
                continue;
            if ((e->attr & SHOAL_TOK_SINGLE_WORD) &&
                (word_char_at(s, end, i, 1) ||
                 word_char_at(s, end, i + e->piece_len, 0)))
                continue;
            hit = (int32_t)id;
            hit_len = e->piece_len;
            break; /* longest first within the bucket */
        }
        if (hit < 0) {
            i++;
            continue;
        }
        uint32_t attr = shoal_tok_entry(t, (uint32_t)hit)->attr;
        size_t ms = i, me = i + hit_len;
        if (attr & SHOAL_TOK_LSTRIP)
            while (ms > last && is_space_byte(s[ms - 1]))
                ms--;
        if (attr & SHOAL_TOK_RSTRIP)
            while (me < end && is_space_byte(s[me]))
                me++;
        if (ms > last)
            frags_push(out, last, ms - last, -1);
        frags_push(out, ms, me - ms, hit);
        last = i = me;
    }
    if (last < end)
        frags_push(out, last, end - last, -1);
}

/* ------------------------------------------------------------------------
 * normalizers
 */

static int all_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] >= 0x80)
            return 0;
    return 1;
}

/* Unicode normalization of s into out; invalid UTF-8 bytes are copied as
 * they are and split the text into independently normalized runs. */
static void norm_unicode(const char *s, size_t n, utf8proc_option_t opts,
                         struct buf *out)
{
    if (all_ascii(s, n)) { /* every normal form keeps ASCII as it is */
        buf_add(out, s, n);
        return;
    }
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n) {
            uint32_t cp;
            size_t l = shoal_utf8_decode(s + j, n - j, &cp);
            if (l == 0)
                break;
            j += l;
        }
        if (j > i) {
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t r =
                utf8proc_map((const utf8proc_uint8_t *)s + i,
                             (utf8proc_ssize_t)(j - i), &dst, opts);
            if (r >= 0)
                buf_add(out, (const char *)dst, (size_t)r);
            else
                buf_add(out, s + i, j - i);
            free(dst);
        }
        if (j < n) { /* one invalid byte, kept */
            buf_add(out, s + j, 1);
            j++;
        }
        i = j;
    }
}

static void norm_lower(const char *s, size_t n, struct buf *out)
{
    size_t i = 0;
    buf_reserve(out, n + 1);
    while (i < n) {
        uint8_t c = (uint8_t)s[i];
        if (c < 0x80) {
            char lc = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
            buf_add(out, &lc, 1);
            i++;
            continue;
        }
        uint32_t cp;
        size_t l = shoal_utf8_decode(s + i, n - i, &cp);
        if (l == 0) {
            buf_add(out, s + i, 1);
            i++;
            continue;
        }
        char enc[4];
        size_t el = shoal_utf8_encode(
            (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), enc);
        buf_add(out, enc, el);
        i += l;
    }
}

static void replace_literal(const char *s, size_t n, const char *a,
                            size_t an, const char *b, size_t bn,
                            struct buf *out)
{
    size_t i = 0;
    if (an == 0) {
        buf_add(out, s, n);
        return;
    }
    while (i < n) {
        const char *hit = memmem(s + i, n - i, a, an);
        if (!hit) {
            buf_add(out, s + i, n - i);
            break;
        }
        size_t at = (size_t)(hit - s);
        buf_add(out, s + i, at - i);
        buf_add(out, b, bn);
        i = at + an;
    }
}

static int replace_regex(struct work *w, pcre2_code *re, const char *s,
                         size_t n, const char *b, size_t bn, struct buf *out)
{
    size_t pos = 0, last = 0;
    while (pos <= n) {
        size_t ms, me;
        int rc = re_next(w, re, s, n, pos, &ms, &me);
        if (rc < 0)
            return rc;
        if (rc == 0)
            break;
        if (me == ms) { /* empty match: nothing to replace, move on */
            if (ms >= n)
                break;
            pos = ms + char_len_at(s, n, ms);
            continue;
        }
        buf_add(out, s + last, ms - last);
        buf_add(out, b, bn);
        last = pos = me;
    }
    buf_add(out, s + last, n - last);
    return 0;
}

/* Run the normalizer ops over s[0..n). *res points at the result (s itself
 * when there are no ops). */
static int normalize(const struct shoal_tokenizer *t, struct work *w,
                     const char *s, size_t n, const char **res,
                     size_t *res_n)
{
    const char *cur = s;
    size_t cur_n = n;
    struct buf *dst = &w->norm_a, *other = &w->norm_b;
    for (size_t k = 0; k < t->n_norm; k++) {
        const struct shoal_tok_norm_op *op = &t->norm[k];
        dst->len = 0;
        switch (op->kind) {
        case SHOAL_TOK_NORM_NFC:
            norm_unicode(cur, cur_n, UTF8PROC_STABLE | UTF8PROC_COMPOSE, dst);
            break;
        case SHOAL_TOK_NORM_NFD:
            norm_unicode(cur, cur_n, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
                         dst);
            break;
        case SHOAL_TOK_NORM_NFKC:
            norm_unicode(cur, cur_n,
                         UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
                         dst);
            break;
        case SHOAL_TOK_NORM_NFKD:
            norm_unicode(cur, cur_n,
                         UTF8PROC_STABLE | UTF8PROC_DECOMPOSE |
                             UTF8PROC_COMPAT,
                         dst);
            break;
        case SHOAL_TOK_NORM_LOWERCASE:
            norm_lower(cur, cur_n, dst);
            break;
        case SHOAL_TOK_NORM_PREPEND:
            if (cur_n > 0)
                buf_add(dst, op->a, op->a_len);
            buf_add(dst, cur, cur_n);
            break;
        case SHOAL_TOK_NORM_REPLACE:
            replace_literal(cur, cur_n, op->a, op->a_len, op->b, op->b_len,
                            dst);
            break;
        case SHOAL_TOK_NORM_REPLACE_REGEX: {
            int rc = replace_regex(w, op->re, cur, cur_n, op->b, op->b_len,
                                   dst);
            if (rc)
                return rc;
            break;
        }
        case SHOAL_TOK_NORM_STRIP: {
            size_t a = 0, z = cur_n;
            if (op->left)
                while (a < z && is_space_byte(cur[a]))
                    a++;
            if (op->right)
                while (z > a && is_space_byte(cur[z - 1]))
                    z--;
            buf_add(dst, cur + a, z - a);
            break;
        }
        }
        cur = dst->p ? dst->p : "";
        cur_n = dst->len;
        struct buf *tmp = dst;
        dst = other;
        other = tmp;
    }
    *res = cur;
    *res_n = cur_n;
    return 0;
}

/* ------------------------------------------------------------------------
 * pre-tokenizers: pieces are spans of one text buffer
 */

/* Emit the spans [a, b) of piece p as pieces, with HF's behaviors. */
struct seg {
    size_t off, len;
    int match;
};

static void emit_segments(const struct seg *sg, size_t n_sg,
                          enum shoal_tok_split behavior, int origin_off,
                          size_t piece_off, struct spans *out)
{
    /* origin: only a piece that starts where the input started keeps it */
#define PUSH(o, l) spans_push(out, (o), (l), origin_off && (o) == piece_off)
    size_t i = 0;
    switch (behavior) {
    case SHOAL_TOK_SPLIT_REMOVED:
        for (i = 0; i < n_sg; i++)
            if (!sg[i].match)
                PUSH(sg[i].off, sg[i].len);
        break;
    case SHOAL_TOK_SPLIT_ISOLATED:
        for (i = 0; i < n_sg; i++)
            PUSH(sg[i].off, sg[i].len);
        break;
    case SHOAL_TOK_SPLIT_CONTIGUOUS:
        for (i = 0; i < n_sg;) {
            size_t j = i + 1;
            if (sg[i].match)
                while (j < n_sg && sg[j].match)
                    j++;
            PUSH(sg[i].off, sg[j - 1].off + sg[j - 1].len - sg[i].off);
            i = j;
        }
        break;
    case SHOAL_TOK_SPLIT_MERGED_PREV: {
        /* a match joins the piece before it */
        size_t start = 0;
        int open = 0;
        for (i = 0; i < n_sg; i++) {
            if (sg[i].match) {
                if (!open)
                    start = sg[i].off;
                PUSH(start, sg[i].off + sg[i].len - start);
                open = 0;
            } else {
                if (open)
                    PUSH(start, sg[i].off - start);
                start = sg[i].off;
                open = 1;
            }
        }
        if (open)
            PUSH(start, sg[n_sg - 1].off + sg[n_sg - 1].len - start);
        break;
    }
    case SHOAL_TOK_SPLIT_MERGED_NEXT: {
        /* a match starts a new piece that runs until the next match */
        size_t start = 0;
        int open = 0;
        for (i = 0; i < n_sg; i++) {
            if (sg[i].match) {
                if (open)
                    PUSH(start, sg[i].off - start);
                start = sg[i].off;
                open = 1;
            } else if (!open) {
                start = sg[i].off;
                open = 1;
            }
        }
        if (open)
            PUSH(start, sg[n_sg - 1].off + sg[n_sg - 1].len - start);
        break;
    }
    }
#undef PUSH
}

static int pre_split(struct work *w, const struct shoal_tok_pre_op *op,
                     const char *text, const struct spans *in,
                     struct spans *out)
{
    struct seg *sg = NULL;
    size_t n_sg = 0, cap_sg = 0;
    int rc = 0;
    out->n = 0;
    for (size_t p = 0; p < in->n; p++) {
        const char *s = text + in->v[p].off;
        size_t n = in->v[p].len, pos = 0, last = 0;
        n_sg = 0;
        while (pos <= n) {
            size_t ms, me;
            rc = re_next(w, op->re, s, n, pos, &ms, &me);
            if (rc < 0)
                goto done;
            if (rc == 0)
                break;
            if (n_sg + 2 > cap_sg) {
                cap_sg = cap_sg ? 2 * cap_sg : 64;
                sg = shoal_xrealloc(sg, cap_sg * sizeof *sg);
            }
            if (ms > last)
                sg[n_sg++] = (struct seg){in->v[p].off + last, ms - last, 0};
            if (me > ms)
                sg[n_sg++] = (struct seg){in->v[p].off + ms, me - ms, 1};
            last = me;
            if (me == ms) { /* empty match: a split point; step one char */
                if (ms >= n)
                    break;
                pos = ms + char_len_at(s, n, ms);
            } else {
                pos = me;
            }
        }
        rc = 0;
        if (last < n) {
            if (n_sg + 1 > cap_sg) {
                cap_sg = cap_sg ? 2 * cap_sg : 64;
                sg = shoal_xrealloc(sg, cap_sg * sizeof *sg);
            }
            sg[n_sg++] = (struct seg){in->v[p].off + last, n - last, 0};
        }
        if (op->invert)
            for (size_t i = 0; i < n_sg; i++)
                sg[i].match = !sg[i].match;
        if (n_sg)
            emit_segments(sg, n_sg, op->behavior, in->v[p].origin,
                          in->v[p].off, out);
    }
done:
    free(sg);
    return rc;
}

/* Rewrite every piece into a new text (Metaspace's replace, prepend). */
static void pre_rewrite(const struct shoal_tok_pre_op *op, const char *text,
                        const struct spans *in, struct buf *dst,
                        struct spans *out)
{
    dst->len = 0;
    out->n = 0;
    for (size_t p = 0; p < in->n; p++) {
        const char *s = text + in->v[p].off;
        size_t n = in->v[p].len, start = dst->len;
        if (op->kind == SHOAL_TOK_PRE_REPLACE_SPACE) {
            replace_literal(s, n, " ", 1, op->a, op->a_len, dst);
        } else {
            int want = op->scheme == SHOAL_TOK_PREPEND_ALWAYS ||
                       in->v[p].origin;
            if (want && !(n >= op->a_len && memcmp(s, op->a, op->a_len) == 0))
                buf_add(dst, op->a, op->a_len);
            buf_add(dst, s, n);
        }
        spans_push(out, start, dst->len - start, in->v[p].origin);
    }
}

/* ------------------------------------------------------------------------
 * models
 */

static uint64_t bpe_key(uint32_t rank, int32_t left)
{
    return ((uint64_t)rank << 32) | (uint32_t)left;
}

static void bpe_try(const struct shoal_tokenizer *t, struct work *w,
                    int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    const struct sym *sy = w->syms;
    if (sy[l].id < 0 || sy[r].id < 0)
        return;
    const struct shoal_tok_merge *m = merge_find(t, sy[l].id, sy[r].id);
    if (!m)
        return;
    struct cand c = {bpe_key(m->rank, l), l, r, sy[l].id, sy[r].id, m->id};
    heap_push(w, c);
}

/* BPE by merge ranks over one piece (HF BPE / llama.cpp llm_tokenizer_bpe). */
static void encode_bpe(const struct shoal_tokenizer *t, struct work *w,
                       const char *s, size_t n, struct ivec *out)
{
    if (n == 0)
        return;
    if (t->ignore_merges) {
        int32_t id = shoal_tok_lookup(t, s, n);
        if (id >= 0) {
            ivec_push(out, id);
            return;
        }
    }
    struct sym *sy = syms_reserve(w, n);
    int32_t ns = 0;
    size_t i = 0;
    while (i < n) {
        size_t l = t->byte_level ? 1 : char_len_at(s, n, i);
        int32_t id = t->byte_level ? t->byte_ids[(uint8_t)s[i]]
                                   : shoal_tok_lookup(t, s + i, l);
        if (id >= 0) {
            sy[ns] = (struct sym){i, l, id, ns - 1, ns + 1};
            ns++;
        } else if (t->byte_fallback && !t->byte_level) {
            for (size_t k = 0; k < l; k++) {
                int32_t bid = t->byte_ids[(uint8_t)s[i + k]];
                sy[ns] = (struct sym){i + k, 1, bid >= 0 ? bid : t->unk_id,
                                      ns - 1, ns + 1};
                ns++;
            }
        } else if (t->unk_id >= 0) {
            if (t->fuse_unk && ns > 0 && sy[ns - 1].id == t->unk_id &&
                sy[ns - 1].off + sy[ns - 1].len == i) {
                sy[ns - 1].len += l;
            } else {
                sy[ns] = (struct sym){i, l, t->unk_id, ns - 1, ns + 1};
                ns++;
            }
        } /* else: no way to represent it; dropped like HF does */
        i += l;
    }
    if (ns == 0)
        return;
    sy[ns - 1].next = -1;
    w->heap_n = 0;
    for (int32_t k = 0; k + 1 < ns; k++)
        bpe_try(t, w, k, k + 1);
    while (w->heap_n > 0) {
        struct cand c = heap_pop(w);
        struct sym *L = &sy[c.left], *R = &sy[c.right];
        /* stale if either side changed since the pair was queued */
        if (L->len == 0 || R->len == 0 || L->next != c.right ||
            L->id != c.lid || R->id != c.rid)
            continue;
        L->len += R->len;
        L->id = c.id;
        R->len = 0;
        L->next = R->next;
        if (R->next >= 0)
            sy[R->next].prev = c.left;
        bpe_try(t, w, L->prev, c.left);
        bpe_try(t, w, c.left, L->next);
    }
    for (int32_t k = 0; k >= 0; k = sy[k].next)
        if (sy[k].id >= 0)
            ivec_push(out, sy[k].id);
}

/* Sortable key of a float: larger score -> smaller key. */
static uint32_t score_key(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* ascending order */
    return ~u;                                       /* descending */
}

static void spm_try(const struct shoal_tokenizer *t, struct work *w,
                    const char *s, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    const struct sym *sy = w->syms;
    size_t size = sy[l].len + sy[r].len;
    int32_t id = shoal_tok_lookup(t, s + sy[l].off, size);
    if (id < 0)
        return;
    struct cand c = {((uint64_t)score_key(shoal_tok_entry(t, (uint32_t)id)->score) << 32) |
                         (uint32_t)l,
                     l, r, 0, (int32_t)size, id};
    heap_push(w, c);
}

/* SentencePiece BPE by scores (llama.cpp llm_tokenizer_spm): merge the
 * adjacent pair whose concatenation is the best-scoring token, leftmost on
 * ties; characters that end up unmerged and are not tokens become bytes. */
static void encode_spm(const struct shoal_tokenizer *t, struct work *w,
                       const char *s, size_t n, struct ivec *out)
{
    if (n == 0)
        return;
    struct sym *sy = syms_reserve(w, n);
    int32_t ns = 0;
    for (size_t i = 0; i < n;) {
        size_t l = char_len_at(s, n, i);
        sy[ns] = (struct sym){i, l, -1, ns - 1, ns + 1};
        ns++;
        i += l;
    }
    sy[ns - 1].next = -1;
    w->heap_n = 0;
    for (int32_t k = 0; k + 1 < ns; k++)
        spm_try(t, w, s, k, k + 1);
    while (w->heap_n > 0) {
        struct cand c = heap_pop(w);
        struct sym *L = &sy[c.left], *R = &sy[c.right];
        if (L->len == 0 || R->len == 0 || L->next != c.right ||
            L->len + R->len != (size_t)c.rid)
            continue;
        L->len += R->len;
        L->id = c.id;
        R->len = 0;
        L->next = R->next;
        if (R->next >= 0)
            sy[R->next].prev = c.left;
        spm_try(t, w, s, L->prev, c.left);
        spm_try(t, w, s, c.left, L->next);
    }
    for (int32_t k = 0; k >= 0; k = sy[k].next) {
        int32_t id = sy[k].id >= 0 ? sy[k].id
                                   : shoal_tok_lookup(t, s + sy[k].off,
                                                      sy[k].len);
        if (id >= 0) {
            ivec_push(out, id);
            continue;
        }
        for (size_t b = 0; b < sy[k].len; b++) {
            int32_t bid = t->byte_ids[(uint8_t)s[sy[k].off + b]];
            if (bid < 0)
                bid = t->unk_id;
            if (bid >= 0)
                ivec_push(out, bid);
        }
    }
}

/* Pre-tokenize normalized text s[0..n) and run the model on each piece. */
static int encode_normalized(const struct shoal_tokenizer *t, struct work *w,
                             const char *s, size_t n, int origin,
                             struct ivec *out)
{
    struct spans *in = &w->sp_a, *nx = &w->sp_b;
    struct buf *tb = &w->pre_a, *ob = &w->pre_b;
    const char *text = s;
    in->n = 0;
    spans_push(in, 0, n, origin);
    for (size_t k = 0; k < t->n_pre; k++) {
        const struct shoal_tok_pre_op *op = &t->pre[k];
        if (op->kind == SHOAL_TOK_PRE_SPLIT) {
            int rc = pre_split(w, op, text, in, nx);
            if (rc)
                return rc;
        } else {
            pre_rewrite(op, text, in, tb, nx);
            text = tb->p ? tb->p : "";
            struct buf *tmp = tb;
            tb = ob;
            ob = tmp;
        }
        struct spans *tmp = in;
        in = nx;
        nx = tmp;
    }
    for (size_t p = 0; p < in->n; p++) {
        if (t->model == SHOAL_TOK_MODEL_SPM)
            encode_spm(t, w, text + in->v[p].off, in->v[p].len, out);
        else
            encode_bpe(t, w, text + in->v[p].off, in->v[p].len, out);
    }
    return 0;
}

struct shoal_tokenize_params shoal_tokenize_params_default(void)
{
    return (struct shoal_tokenize_params){.add_special = 1,
                                          .parse_special = 0};
}

int shoal_tokenizer_encode(const struct shoal_tokenizer *t, const char *text,
                           size_t len, struct shoal_tokenize_params params,
                           int32_t **ids, size_t *n_ids,
                           struct shoal_err *err)
{
    struct work w = {.err = err, .name = t->name};
    struct ivec out = {0};
    int rc = 0;
    if (!text && len > 0)
        return shoal_err_set(err, SHOAL_EINVAL,
                             "tokenizer '%s': NULL text of %zu bytes",
                             t->name, len);
    if (params.add_special)
        for (size_t i = 0; i < t->n_prefix; i++)
            ivec_push(&out, t->prefix[i]);
    partition(t, text, 0, len, params.parse_special, 0, &w.frags);
    for (size_t f = 0; f < w.frags.n && rc == 0; f++) {
        struct frag fr = w.frags.v[f];
        if (fr.id >= 0) {
            ivec_push(&out, fr.id);
            continue;
        }
        const char *ns;
        size_t nn;
        if ((rc = normalize(t, &w, text + fr.off, fr.len, &ns, &nn)))
            break;
        int origin = fr.off == 0;
        if (!t->has_normalized_added) {
            rc = encode_normalized(t, &w, ns, nn, origin, &out);
            continue;
        }
        /* normalized added tokens: match them in the normalized text; the
         * text is copied since the normalizer buffers are reused */
        char *copy = shoal_tok_memdup(ns, nn);
        w.frags2.n = 0;
        partition(t, copy, 0, nn, params.parse_special, 1, &w.frags2);
        for (size_t g = 0; g < w.frags2.n && rc == 0; g++) {
            struct frag f2 = w.frags2.v[g];
            if (f2.id >= 0)
                ivec_push(&out, f2.id);
            else
                rc = encode_normalized(t, &w, copy + f2.off, f2.len,
                                       origin && f2.off == 0, &out);
        }
        free(copy);
    }
    if (rc == 0 && params.add_special)
        for (size_t i = 0; i < t->n_suffix; i++)
            ivec_push(&out, t->suffix[i]);
    work_free(&w);
    if (rc) {
        free(out.v);
        return rc;
    }
    if (!out.v)
        out.v = shoal_xmalloc(sizeof(int32_t));
    *ids = out.v;
    *n_ids = out.n;
    return 0;
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
    static const char *const names[] = {"tokenizer.json", "tiktoken.model"};
    for (size_t k = 0; k < 2; k++) {
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
        struct shoal_tokenizer *t = NULL;
        if (shoal_exists(p)) {
            t = load_json_file(p, err);
        } else if (shoal_exists(tk)) {
            t = load_tiktoken_file(tk, err);
        } else {
            shoal_err_set(err, SHOAL_ENOTFOUND,
                          "tokenizer: directory '%s' has no tokenizer.json "
                          "or tiktoken.model",
                          path);
        }
        free(p);
        free(tk);
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
