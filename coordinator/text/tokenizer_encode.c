/* tokenizer_encode: text to token ids over the shared pipeline (see
 * tokenizer_impl.h): added tokens split out, normalizer, pre-tokenizer
 * steps, then byte-level BPE or SentencePiece merges per piece. */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer_impl.h"
#include "unicode.h"
#include "util.h"

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
    const struct shoal_tok_merge *m = shoal_tok_merge_find(t, sy[l].id, sy[r].id);
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

