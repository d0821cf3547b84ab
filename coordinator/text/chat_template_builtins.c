/* chat_template_builtins: the filters, tests, methods and global functions
 * chat templates call, with jinja2 / Python semantics (transformers' tojson:
 * json.dumps with ensure_ascii=False). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "chat_template_impl.h"
#include "util.h"

/* ---- argument helpers -------------------------------------------------- */

static int name_is(struct shoal_ct_str name, const char *lit)
{
    size_t n = strlen(lit);
    return name.n == n && memcmp(name.p, lit, n) == 0;
}

/* Positional argument i, else keyword kw (may be NULL), else NULL. */
static const struct shoal_ct_val *arg_get(const struct shoal_ct_args *a, size_t i,
                                          const char *kw)
{
    if (i < a->n_pos)
        return &a->pos[i];
    for (size_t k = 0; kw && k < a->n_kw; k++)
        if (name_is(a->kw_names[k], kw))
            return &a->kw[k];
    return NULL;
}

/* At most max_pos positional arguments, and only the keywords in kws
 * (NULL-terminated list, or NULL for none). `what` is "filter" etc. */
static int check_args(struct shoal_ct_ctx *c, const char *what,
                      struct shoal_ct_str name, const struct shoal_ct_args *a,
                      size_t max_pos, const char *const *kws)
{
    if (a->n_pos > max_pos)
        return shoal_ct_fail(c, SHOAL_EINVAL, "%s '%.*s' takes at most %zu "
                             "positional arguments, got %zu", what, (int)name.n,
                             name.p, max_pos, a->n_pos);
    for (size_t k = 0; k < a->n_kw; k++) {
        int ok = 0;
        for (size_t j = 0; kws && kws[j] && !ok; j++)
            ok = name_is(a->kw_names[k], kws[j]);
        if (!ok)
            return shoal_ct_fail(c, SHOAL_EINVAL, "%s '%.*s' has no argument '%.*s'",
                                 what, (int)name.n, name.p, (int)a->kw_names[k].n,
                                 a->kw_names[k].p);
    }
    return 0;
}

/* Required string argument. */
static int arg_str(struct shoal_ct_ctx *c, const char *what, struct shoal_ct_str name,
                   const struct shoal_ct_val *v, const char *arg,
                   struct shoal_ct_str *out)
{
    if (!v)
        return shoal_ct_fail(c, SHOAL_EINVAL, "%s '%.*s' needs argument '%s'", what,
                             (int)name.n, name.p, arg);
    if (v->kind != SHOAL_CT_STR)
        return shoal_ct_fail(c, SHOAL_EINVAL, "%s '%.*s': argument '%s' must be a "
                             "string, found %s", what, (int)name.n, name.p, arg,
                             shoal_ct_kind_name(v->kind));
    *out = v->u.s;
    return 0;
}

/* Optional integer argument (absent or none gives def). */
static int arg_int(struct shoal_ct_ctx *c, const char *what, struct shoal_ct_str name,
                   const struct shoal_ct_val *v, const char *arg, int64_t def,
                   int64_t *out)
{
    *out = def;
    if (!v || v->kind == SHOAL_CT_NONE)
        return 0;
    if (v->kind == SHOAL_CT_INT || v->kind == SHOAL_CT_BOOL) {
        *out = v->kind == SHOAL_CT_INT ? v->u.i : v->u.b;
        return 0;
    }
    return shoal_ct_fail(c, SHOAL_EINVAL, "%s '%.*s': argument '%s' must be an "
                         "integer, found %s", what, (int)name.n, name.p, arg,
                         shoal_ct_kind_name(v->kind));
}

static int unknown(struct shoal_ct_ctx *c, const char *what, struct shoal_ct_str name)
{
    return shoal_ct_fail(c, SHOAL_EINVAL, "unknown %s '%.*s'", what, (int)name.n,
                         name.p);
}

/* ---- strings ------------------------------------------------------------ */

/* Decode the code point at s.p[i]; invalid bytes decode one at a time as
 * 0x110000 + byte, which matches no real character. Returns its length. */
static size_t cp_at(struct shoal_ct_str s, size_t i, int32_t *cp)
{
    utf8proc_int32_t v;
    utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t *)s.p + i,
                                          (utf8proc_ssize_t)(s.n - i), &v);
    if (n <= 0) {
        *cp = 0x110000 + (unsigned char)s.p[i];
        return 1;
    }
    *cp = v;
    return (size_t)n;
}

/* Python's str.isspace() characters. */
static int py_space(int32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) ||
           cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

static int in_set(int32_t cp, const struct shoal_ct_str *chars)
{
    if (!chars)
        return py_space(cp);
    for (size_t k = 0; k < chars->n;) {
        int32_t x;
        k += cp_at(*chars, k, &x);
        if (x == cp)
            return 1;
    }
    return 0;
}

/* str.strip/lstrip/rstrip; chars NULL strips whitespace. */
static struct shoal_ct_str strip(struct shoal_ct_str s, const struct shoal_ct_str *chars,
                                 int left, int right)
{
    size_t lo = 0, hi = s.n;
    int32_t cp;
    while (left && lo < hi) {
        size_t n = cp_at(s, lo, &cp);
        if (!in_set(cp, chars))
            break;
        lo += n;
    }
    while (right && hi > lo) {
        /* The last code point of [lo, hi): back over continuation bytes; if
         * that is not one well-formed sequence ending at hi, the last byte
         * stands alone (as the forward decoder would treat it). */
        size_t j = hi - 1;
        while (j > lo && hi - j < 4 && ((unsigned char)s.p[j] & 0xC0) == 0x80)
            j--;
        if (j + cp_at(s, j, &cp) != hi) {
            j = hi - 1;
            cp = 0x110000 + (unsigned char)s.p[j];
        }
        if (!in_set(cp, chars))
            break;
        hi = j;
    }
    return (struct shoal_ct_str){s.p + lo, hi - lo};
}

/* CASE_TITLE is Python's str.title(); CASE_WORDS is jinja2's title filter,
 * which upper-cases the first character after each run of whitespace or
 * any of - ( { [ < and lower-cases the rest. */
enum case_mode { CASE_UPPER, CASE_LOWER, CASE_CAPITALIZE, CASE_TITLE, CASE_WORDS };

static int word_break(int32_t cp)
{
    return py_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
}

static int is_cased(int32_t cp)
{
    if (cp > 0x10FFFF)
        return 0;
    utf8proc_category_t cat = utf8proc_category(cp);
    return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL ||
           cat == UTF8PROC_CATEGORY_LT;
}

/* Per-code-point case mapping (no special casing such as 'ß' -> 'SS'). */
static int map_case(struct shoal_ct_ctx *c, struct shoal_ct_str s, enum case_mode mode,
                    struct shoal_ct_val *out)
{
    /* One mapping can grow a character from 2 to 3 bytes: 2n is enough. */
    char *p = shoal_ct_alloc(c, 2 * s.n + 1, 1);
    if (!p)
        return c->rc;
    size_t o = 0;
    int first = 1, prev_cased = 0, prev_break = 1;
    for (size_t k = 0; k < s.n;) {
        int32_t cp;
        size_t n = cp_at(s, k, &cp);
        if (cp > 0x10FFFF) {
            p[o++] = s.p[k];
        } else if (cp == 0xDF && (mode == CASE_UPPER ||
                                  (mode == CASE_TITLE && !prev_cased) ||
                                  (mode == CASE_WORDS && prev_break && !word_break(cp)) ||
                                  (mode == CASE_CAPITALIZE && first))) {
            /* Python's special casing of 'ß': "SS" (title case "Ss") */
            p[o++] = 'S';
            p[o++] = mode == CASE_UPPER || mode == CASE_WORDS ? 'S' : 's';
        } else {
            int32_t m = cp;
            switch (mode) {
            case CASE_UPPER:
                m = utf8proc_toupper(cp);
                break;
            case CASE_LOWER:
                m = utf8proc_tolower(cp);
                break;
            case CASE_CAPITALIZE:
                m = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp);
                break;
            case CASE_TITLE:
                m = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
                break;
            case CASE_WORDS:
                m = prev_break && !word_break(cp) ? utf8proc_toupper(cp)
                                                  : utf8proc_tolower(cp);
                break;
            }
            o += (size_t)utf8proc_encode_char(m, (utf8proc_uint8_t *)p + o);
        }
        prev_cased = is_cased(cp);
        prev_break = word_break(cp);
        first = 0;
        k += n;
    }
    *out = shoal_ct_str_val(p, o);
    return 0;
}

static const char *find_sub(struct shoal_ct_str s, size_t from, struct shoal_ct_str sub)
{
    if (from > s.n || sub.n > s.n - from)
        return NULL;
    return memmem(s.p + from, s.n - from, sub.p, sub.n);
}

/* str.split(sep=None, maxsplit=-1). */
static int split(struct shoal_ct_ctx *c, struct shoal_ct_str s,
                 const struct shoal_ct_str *sep, int64_t maxsplit,
                 struct shoal_ct_val *out)
{
    if (sep && sep->n == 0)
        return shoal_ct_fail(c, SHOAL_EINVAL, "split(): empty separator");
    /* Two passes: count the pieces, then fill them in. */
    struct shoal_ct_list *l = NULL;
    for (int pass = 0; pass < 2; pass++) {
        size_t n = 0, pos = 0;
        int64_t splits = 0;
        if (sep) {
            for (;;) {
                const char *hit = maxsplit < 0 || splits < maxsplit
                                  ? find_sub(s, pos, *sep) : NULL;
                size_t end = hit ? (size_t)(hit - s.p) : s.n;
                if (l)
                    l->items[n] = shoal_ct_str_val(s.p + pos, end - pos);
                n++;
                if (!hit)
                    break;
                pos = end + sep->n;
                splits++;
            }
        } else {
            for (;;) {
                int32_t cp;
                while (pos < s.n && (cp_at(s, pos, &cp), py_space(cp)))
                    pos += cp_at(s, pos, &cp);
                if (pos >= s.n)
                    break;
                size_t end = pos;
                if (maxsplit >= 0 && splits >= maxsplit) {
                    end = s.n; /* the rest, trailing whitespace included */
                } else {
                    while (end < s.n && (cp_at(s, end, &cp), !py_space(cp)))
                        end += cp_at(s, end, &cp);
                }
                if (l)
                    l->items[n] = shoal_ct_str_val(s.p + pos, end - pos);
                n++;
                splits++;
                pos = end;
            }
        }
        if (!l && !(l = shoal_ct_list_new(c, n)))
            return c->rc;
    }
    *out = shoal_ct_list_val(l);
    return 0;
}

/* str.replace(old, new, count=-1). */
static int replace(struct shoal_ct_ctx *c, struct shoal_ct_str s, struct shoal_ct_str old,
                   struct shoal_ct_str new_, int64_t count, struct shoal_ct_val *out)
{
    size_t hits = 0;
    if (old.n == 0) {
        hits = shoal_ct_utf8_len(s) + 1; /* before every character and at the end */
    } else {
        for (const char *h = find_sub(s, 0, old); h;
             h = find_sub(s, (size_t)(h - s.p) + old.n, old))
            hits++;
    }
    if (count >= 0 && (uint64_t)count < hits)
        hits = (size_t)count;
    size_t grow;
    if (shoal_mul_overflow(hits, new_.n, &grow) || grow > SIZE_MAX - s.n - 1)
        return shoal_ct_fail(c, SHOAL_ERANGE, "replace(): result is too large");
    char *p = shoal_ct_alloc(c, s.n + grow + 1, 1);
    if (!p)
        return c->rc;
    size_t o = 0, pos = 0;
    for (size_t h = 0; h < hits; h++) {
        size_t at;
        if (old.n == 0) {
            at = pos;
        } else {
            at = (size_t)(find_sub(s, pos, old) - s.p);
        }
        memcpy(p + o, s.p + pos, at - pos);
        o += at - pos;
        memcpy(p + o, new_.p, new_.n);
        o += new_.n;
        pos = at + old.n;
        if (old.n == 0 && pos < s.n) { /* copy the character we inserted before */
            int32_t cp;
            size_t n = cp_at(s, pos, &cp);
            memcpy(p + o, s.p + pos, n);
            o += n;
            pos += n;
        }
    }
    memcpy(p + o, s.p + pos, s.n - pos);
    o += s.n - pos;
    *out = shoal_ct_str_val(p, o);
    return 0;
}

static int starts_or_ends(struct shoal_ct_ctx *c, struct shoal_ct_str s,
                          struct shoal_ct_val what, int ends, int *result)
{
    const struct shoal_ct_val *opts = &what;
    size_t n = 1;
    if (what.kind == SHOAL_CT_LIST) { /* Python accepts a tuple of choices */
        opts = what.u.l->items;
        n = what.u.l->n;
    }
    *result = 0;
    for (size_t k = 0; k < n; k++) {
        if (opts[k].kind != SHOAL_CT_STR)
            return shoal_ct_fail(c, SHOAL_EINVAL, "%s(): argument must be a string, "
                                 "found %s", ends ? "endswith" : "startswith",
                                 shoal_ct_kind_name(opts[k].kind));
        struct shoal_ct_str x = opts[k].u.s;
        if (x.n <= s.n && memcmp(s.p + (ends ? s.n - x.n : 0), x.p, x.n) == 0)
            *result = 1;
    }
    return 0;
}

static int join(struct shoal_ct_ctx *c, struct shoal_ct_val seq, struct shoal_ct_str sep,
                const struct shoal_ct_str *attribute, struct shoal_ct_val *out);

/* ---- JSON (transformers' tojson = json.dumps(ensure_ascii=False)) ------ */

struct json_opts {
    int64_t indent;               /* < 0: none */
    int sort_keys;
    int ensure_ascii;
    struct shoal_ct_str item_sep; /* ", " (or "," when indenting) */
    struct shoal_ct_str key_sep;  /* ": " */
};

static int json_string(struct shoal_ct_ctx *c, struct shoal_ct_buf *b,
                       struct shoal_ct_str s, int ensure_ascii)
{
    int rc = shoal_ct_buf_put(c, b, "\"", 1);
    size_t run = 0;
    for (size_t k = 0; k < s.n && !rc;) {
        unsigned char ch = (unsigned char)s.p[k];
        char esc[16] = "";
        size_t n = 1;
        switch (ch) {
        case '"':  strcpy(esc, "\\\""); break;
        case '\\': strcpy(esc, "\\\\"); break;
        case '\n': strcpy(esc, "\\n"); break;
        case '\r': strcpy(esc, "\\r"); break;
        case '\t': strcpy(esc, "\\t"); break;
        case '\b': strcpy(esc, "\\b"); break;
        case '\f': strcpy(esc, "\\f"); break;
        default:
            if (ch < 0x20 || (ensure_ascii && ch == 0x7f)) {
                snprintf(esc, sizeof esc, "\\u%04x", ch);
            } else if (ensure_ascii && ch >= 0x80) {
                int32_t cp;
                n = cp_at(s, k, &cp);
                if (cp > 0x10FFFF)
                    cp = 0xFFFD;
                if (cp >= 0x10000) {
                    int32_t v = cp - 0x10000;
                    snprintf(esc, sizeof esc, "\\u%04x\\u%04x",
                             (unsigned)(0xD800 + (v >> 10)),
                             (unsigned)(0xDC00 + (v & 0x3FF)));
                } else {
                    snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp);
                }
            }
        }
        if (esc[0]) {
            rc = shoal_ct_buf_put(c, b, s.p + run, k - run);
            if (!rc)
                rc = shoal_ct_buf_put(c, b, esc, strlen(esc));
            run = k + n;
        }
        k += n;
    }
    if (!rc)
        rc = shoal_ct_buf_put(c, b, s.p + run, s.n - run);
    return rc ? rc : shoal_ct_buf_put(c, b, "\"", 1);
}

static int json_newline(struct shoal_ct_ctx *c, struct shoal_ct_buf *b,
                        const struct json_opts *o, int level)
{
    int rc = shoal_ct_buf_put(c, b, "\n", 1);
    for (int64_t k = 0; k < o->indent * level && !rc; k++)
        rc = shoal_ct_buf_put(c, b, " ", 1);
    return rc;
}

struct kv_ref {
    struct shoal_ct_val orig;       /* the dict's key (sorted by this) */
    struct shoal_ct_str key;        /* as json.dumps writes it */
    const struct shoal_ct_val *val;
};

/* Python's order of two keys of one class (both strings or both numbers;
 * json_write refuses other mixes as Python's sort does). */
static int kv_cmp(const void *pa, const void *pb)
{
    const struct kv_ref *a = pa, *b = pb;
    if (a->orig.kind != SHOAL_CT_STR) {
        if (shoal_ct_is_intlike(a->orig) && shoal_ct_is_intlike(b->orig)) {
            int64_t x = shoal_ct_as_int(a->orig), y = shoal_ct_as_int(b->orig);
            return (x > y) - (x < y);
        }
        double x = shoal_ct_as_float(a->orig), y = shoal_ct_as_float(b->orig);
        return (x > y) - (x < y);
    }
    size_t m = a->key.n < b->key.n ? a->key.n : b->key.n;
    int r = m ? memcmp(a->key.p, b->key.p, m) : 0;
    return r ? r : (a->key.n > b->key.n) - (a->key.n < b->key.n);
}

/* A dict key as json.dumps writes it: strings as they are, numbers as
 * Python prints them, True/False/None as true/false/null. */
static int json_key(struct shoal_ct_ctx *c, struct shoal_ct_val k,
                    struct shoal_ct_str *out)
{
    switch (k.kind) {
    case SHOAL_CT_STR:  *out = k.u.s; return 0;
    case SHOAL_CT_NONE: *out = shoal_ct_cstr("null"); return 0;
    case SHOAL_CT_BOOL: *out = shoal_ct_cstr(k.u.b ? "true" : "false"); return 0;
    default:            return shoal_ct_to_str(c, k, out);
    }
}

static int json_write(struct shoal_ct_ctx *c, struct shoal_ct_buf *b,
                      struct shoal_ct_val v, const struct json_opts *o, int level)
{
    char tmp[40];
    int rc;
    if (level > SHOAL_CT_MAX_VALUE_DEPTH)
        return shoal_ct_fail(c, SHOAL_ERANGE, "tojson: value nested deeper than %d "
                             "levels", SHOAL_CT_MAX_VALUE_DEPTH);
    switch (v.kind) {
    case SHOAL_CT_UNDEF: /* lenient: jinja2 would fail to serialize it */
    case SHOAL_CT_NONE:
        return shoal_ct_buf_put(c, b, "null", 4);
    case SHOAL_CT_BOOL:
        return v.u.b ? shoal_ct_buf_put(c, b, "true", 4)
                     : shoal_ct_buf_put(c, b, "false", 5);
    case SHOAL_CT_INT:
        snprintf(tmp, sizeof tmp, "%" PRId64, v.u.i);
        return shoal_ct_buf_put(c, b, tmp, strlen(tmp));
    case SHOAL_CT_FLOAT:
        if (isnan(v.u.f))
            strcpy(tmp, "NaN");
        else if (isinf(v.u.f))
            strcpy(tmp, v.u.f < 0 ? "-Infinity" : "Infinity");
        else
            shoal_ct_format_float(v.u.f, tmp);
        return shoal_ct_buf_put(c, b, tmp, strlen(tmp));
    case SHOAL_CT_STR:
        return json_string(c, b, v.u.s, o->ensure_ascii);
    case SHOAL_CT_LIST:
        if (v.u.l->n == 0)
            return shoal_ct_buf_put(c, b, "[]", 2);
        rc = shoal_ct_buf_put(c, b, "[", 1);
        for (size_t k = 0; k < v.u.l->n && !rc; k++) {
            if (k)
                rc = shoal_ct_buf_put(c, b, o->item_sep.p, o->item_sep.n);
            if (!rc && o->indent >= 0)
                rc = json_newline(c, b, o, level + 1);
            if (!rc)
                rc = json_write(c, b, v.u.l->items[k], o, level + 1);
        }
        if (!rc && o->indent >= 0)
            rc = json_newline(c, b, o, level);
        return rc ? rc : shoal_ct_buf_put(c, b, "]", 1);
    case SHOAL_CT_DICT: {
        size_t n = v.u.d->n;
        if (n == 0)
            return shoal_ct_buf_put(c, b, "{}", 2);
        struct kv_ref *kv = shoal_ct_alloc(c, n, sizeof *kv);
        if (!kv)
            return c->rc;
        int n_str = 0, n_num = 0;
        for (size_t k = 0; k < n; k++) {
            kv[k].orig = v.u.d->keys[k];
            kv[k].val = &v.u.d->vals[k];
            if ((rc = json_key(c, kv[k].orig, &kv[k].key)))
                return rc;
            n_str += kv[k].orig.kind == SHOAL_CT_STR;
            n_num += shoal_ct_is_number(kv[k].orig);
        }
        if (o->sort_keys && (size_t)n_str != n && (size_t)n_num != n)
            return shoal_ct_fail(c, SHOAL_EINVAL, "tojson(sort_keys=true): cannot "
                                 "order keys of different types (strings, numbers, "
                                 "none) in one dict, as Python cannot");
        if (o->sort_keys)
            qsort(kv, n, sizeof *kv, kv_cmp);
        rc = shoal_ct_buf_put(c, b, "{", 1);
        for (size_t k = 0; k < n && !rc; k++) {
            if (k)
                rc = shoal_ct_buf_put(c, b, o->item_sep.p, o->item_sep.n);
            if (!rc && o->indent >= 0)
                rc = json_newline(c, b, o, level + 1);
            if (!rc)
                rc = json_string(c, b, kv[k].key, o->ensure_ascii);
            if (!rc)
                rc = shoal_ct_buf_put(c, b, o->key_sep.p, o->key_sep.n);
            if (!rc)
                rc = json_write(c, b, *kv[k].val, o, level + 1);
        }
        if (!rc && o->indent >= 0)
            rc = json_newline(c, b, o, level);
        return rc ? rc : shoal_ct_buf_put(c, b, "}", 1);
    }
    default:
        return shoal_ct_fail(c, SHOAL_EINVAL, "tojson: a %s is not JSON serializable",
                             shoal_ct_kind_name(v.kind));
    }
}

/* tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False),
 * transformers' argument order. */
static int filter_tojson(struct shoal_ct_ctx *c, struct shoal_ct_str name,
                         struct shoal_ct_val v, const struct shoal_ct_args *a,
                         struct shoal_ct_val *out)
{
    static const char *const kws[] = {"ensure_ascii", "indent", "separators",
                                      "sort_keys", NULL};
    int rc = check_args(c, "filter", name, a, 4, kws);
    if (rc)
        return rc;
    const struct shoal_ct_val *ea = arg_get(a, 0, "ensure_ascii");
    const struct shoal_ct_val *sep = arg_get(a, 2, "separators");
    const struct shoal_ct_val *sk = arg_get(a, 3, "sort_keys");
    struct json_opts o = {
        .ensure_ascii = ea && shoal_ct_truthy(*ea),
        .sort_keys = sk && shoal_ct_truthy(*sk),
    };
    if ((rc = arg_int(c, "filter", name, arg_get(a, 1, "indent"), "indent", -1,
                      &o.indent)))
        return rc;
    if (o.indent > 64)
        return shoal_ct_fail(c, SHOAL_EINVAL, "tojson: indent %" PRId64 " is "
                             "larger than 64", o.indent);
    o.item_sep = shoal_ct_cstr(o.indent >= 0 ? "," : ", ");
    o.key_sep = shoal_ct_cstr(": ");
    if (sep && sep->kind != SHOAL_CT_NONE) {
        if (sep->kind != SHOAL_CT_LIST || sep->u.l->n != 2 ||
            sep->u.l->items[0].kind != SHOAL_CT_STR ||
            sep->u.l->items[1].kind != SHOAL_CT_STR)
            return shoal_ct_fail(c, SHOAL_EINVAL, "tojson: separators must be a "
                                 "pair of strings");
        o.item_sep = sep->u.l->items[0].u.s;
        o.key_sep = sep->u.l->items[1].u.s;
    }
    struct shoal_ct_buf b = {0};
    if ((rc = json_write(c, &b, v, &o, 0))) {
        free(b.p);
        return rc;
    }
    *out = shoal_ct_str_val("", 0);
    return shoal_ct_buf_finish(c, &b, &out->u.s);
}

/* ---- tests ------------------------------------------------------------- */

static int cmp_test(struct shoal_ct_ctx *c, struct shoal_ct_str name, int op,
                    struct shoal_ct_val v, const struct shoal_ct_val *targs,
                    size_t n, int *result);

int shoal_ct_test(struct shoal_ct_ctx *c, struct shoal_ct_str name,
                  struct shoal_ct_val v, const struct shoal_ct_val *targs,
                  size_t n_targs, int *result)
{
    enum shoal_ct_kind k = v.kind;
    size_t want = 0;
    int r = 0;
    if (name_is(name, "defined"))        r = k != SHOAL_CT_UNDEF;
    else if (name_is(name, "undefined")) r = k == SHOAL_CT_UNDEF;
    else if (name_is(name, "none"))      r = k == SHOAL_CT_NONE;
    else if (name_is(name, "string"))    r = k == SHOAL_CT_STR;
    else if (name_is(name, "mapping"))   r = k == SHOAL_CT_DICT;
    else if (name_is(name, "iterable"))
        r = k == SHOAL_CT_LIST || k == SHOAL_CT_DICT || k == SHOAL_CT_STR ||
            k == SHOAL_CT_UNDEF; /* jinja2's Undefined iterates as empty */
    else if (name_is(name, "sequence"))
        r = k == SHOAL_CT_LIST || k == SHOAL_CT_DICT || k == SHOAL_CT_STR;
    else if (name_is(name, "number"))    r = shoal_ct_is_number(v);
    else if (name_is(name, "integer"))   r = k == SHOAL_CT_INT;
    else if (name_is(name, "float"))     r = k == SHOAL_CT_FLOAT;
    else if (name_is(name, "boolean"))   r = k == SHOAL_CT_BOOL;
    else if (name_is(name, "true"))      r = k == SHOAL_CT_BOOL && v.u.b;
    else if (name_is(name, "false"))     r = k == SHOAL_CT_BOOL && !v.u.b;
    else if (name_is(name, "callable"))  r = k == SHOAL_CT_MACRO || k == SHOAL_CT_FUNC;
    else if (name_is(name, "odd") || name_is(name, "even")) {
        if (k != SHOAL_CT_INT && k != SHOAL_CT_BOOL)
            return shoal_ct_fail(c, SHOAL_EINVAL, "test '%.*s' needs an integer, "
                                 "found %s", (int)name.n, name.p, shoal_ct_kind_name(k));
        int64_t i = k == SHOAL_CT_INT ? v.u.i : v.u.b;
        r = (i % 2 != 0) == name_is(name, "odd");
    } else if (name_is(name, "divisibleby")) {
        want = 1;
        if (n_targs == 1 && k == SHOAL_CT_INT && targs[0].kind == SHOAL_CT_INT) {
            if (targs[0].u.i == 0)
                return shoal_ct_fail(c, SHOAL_EINVAL, "divisibleby 0");
            r = v.u.i % targs[0].u.i == 0;
        } else if (n_targs == 1) {
            return shoal_ct_fail(c, SHOAL_EINVAL, "test 'divisibleby' needs integers");
        }
    } else if (name_is(name, "eq") || name_is(name, "equalto") ||
               name_is(name, "==") || name_is(name, "sameas")) {
        want = 1;
        if (n_targs == 1)
            r = shoal_ct_equal(v, targs[0], 0);
    } else if (name_is(name, "ne") || name_is(name, "!=")) {
        want = 1;
        if (n_targs == 1)
            r = !shoal_ct_equal(v, targs[0], 0);
    } else if (name_is(name, "lt") || name_is(name, "lessthan")) {
        return cmp_test(c, name, -2, v, targs, n_targs, result);
    } else if (name_is(name, "le")) {
        return cmp_test(c, name, -1, v, targs, n_targs, result);
    } else if (name_is(name, "gt") || name_is(name, "greaterthan")) {
        return cmp_test(c, name, 2, v, targs, n_targs, result);
    } else if (name_is(name, "ge")) {
        return cmp_test(c, name, 1, v, targs, n_targs, result);
    } else if (name_is(name, "in")) {
        want = 1;
        if (n_targs == 1) {
            const struct shoal_ct_val *seq = &targs[0];
            if (seq->kind == SHOAL_CT_STR && k == SHOAL_CT_STR)
                r = v.u.s.n == 0 || (v.u.s.n <= seq->u.s.n &&
                                     memmem(seq->u.s.p, seq->u.s.n, v.u.s.p, v.u.s.n));
            else if (seq->kind == SHOAL_CT_LIST)
                for (size_t j = 0; j < seq->u.l->n && !r; j++)
                    r = shoal_ct_equal(v, seq->u.l->items[j], 0);
            else if (seq->kind == SHOAL_CT_DICT)
                r = shoal_ct_dict_lookup(seq->u.d, v) != NULL;
        }
    } else if (name_is(name, "lower") || name_is(name, "upper")) {
        if (k != SHOAL_CT_STR) {
            r = 0;
        } else {
            struct shoal_ct_val m;
            int rc = map_case(c, v.u.s, name_is(name, "lower") ? CASE_LOWER
                                                                : CASE_UPPER, &m);
            if (rc)
                return rc;
            r = m.u.s.n == v.u.s.n && memcmp(m.u.s.p, v.u.s.p, v.u.s.n) == 0;
        }
    } else {
        return unknown(c, "test", name);
    }
    if (n_targs != want)
        return shoal_ct_fail(c, SHOAL_EINVAL, "test '%.*s' takes %zu argument%s, "
                             "got %zu", (int)name.n, name.p, want, want == 1 ? "" : "s",
                             n_targs);
    *result = r;
    return 0;
}

/* lt/le/gt/ge tests: op -2 <, -1 <=, 1 >=, 2 >. */
static int cmp_test(struct shoal_ct_ctx *c, struct shoal_ct_str name, int op,
                    struct shoal_ct_val v, const struct shoal_ct_val *targs,
                    size_t n, int *result)
{
    if (n != 1)
        return shoal_ct_fail(c, SHOAL_EINVAL, "test '%.*s' takes 1 argument, got %zu",
                             (int)name.n, name.p, n);
    double x, y;
    if (shoal_ct_is_number(v) && shoal_ct_is_number(targs[0])) {
        x = shoal_ct_as_float(v);
        y = shoal_ct_as_float(targs[0]);
    } else if (v.kind == SHOAL_CT_STR && targs[0].kind == SHOAL_CT_STR) {
        size_t m = v.u.s.n < targs[0].u.s.n ? v.u.s.n : targs[0].u.s.n;
        int r = m ? memcmp(v.u.s.p, targs[0].u.s.p, m) : 0;
        x = r ? r : (double)v.u.s.n;
        y = r ? 0 : (double)targs[0].u.s.n;
    } else {
        return shoal_ct_fail(c, SHOAL_EINVAL, "test '%.*s' cannot compare %s and %s",
                             (int)name.n, name.p, shoal_ct_kind_name(v.kind),
                             shoal_ct_kind_name(targs[0].kind));
    }
    *result = op == -2 ? x < y : op == -1 ? x <= y : op == 1 ? x >= y : x > y;
    return 0;
}

/* ---- filters ------------------------------------------------------------ */

/* Follow a dotted attribute path ("function.name", "0.role"). */
static struct shoal_ct_val attr_path(struct shoal_ct_val v, struct shoal_ct_str path)
{
    size_t from = 0;
    while (from <= path.n) {
        const char *dot = memchr(path.p + from, '.', path.n - from);
        size_t end = dot ? (size_t)(dot - path.p) : path.n;
        struct shoal_ct_str part = {path.p + from, end - from};
        int digits = part.n > 0;
        for (size_t k = 0; k < part.n; k++)
            digits &= part.p[k] >= '0' && part.p[k] <= '9';
        if (digits && v.kind == SHOAL_CT_LIST) {
            size_t i = (size_t)strtoull(part.p, NULL, 10);
            v = i < v.u.l->n ? v.u.l->items[i] : shoal_ct_undef();
        } else {
            v = shoal_ct_get_attr(v, part);
        }
        if (!dot)
            break;
        from = end + 1;
    }
    return v;
}

static int join(struct shoal_ct_ctx *c, struct shoal_ct_val seq, struct shoal_ct_str sep,
                const struct shoal_ct_str *attribute, struct shoal_ct_val *out)
{
    const struct shoal_ct_list *items;
    int rc = shoal_ct_iterate(c, seq, &items);
    if (rc)
        return rc;
    struct shoal_ct_buf b = {0};
    for (size_t k = 0; k < items->n && !rc; k++) {
        struct shoal_ct_val item = items->items[k];
        if (attribute)
            item = attr_path(item, *attribute);
        if (k)
            rc = shoal_ct_buf_put(c, &b, sep.p, sep.n);
        if (!rc)
            rc = shoal_ct_write_str(c, &b, item, 0);
    }
    if (rc) {
        free(b.p);
        return rc;
    }
    *out = shoal_ct_str_val("", 0);
    return shoal_ct_buf_finish(c, &b, &out->u.s);
}

/* The empty list that select/reject/map give for a falsy input: jinja2's
 * filters start with `if value:`, so none, undefined, 0, '' and [] all give
 * no items (before the arguments are even looked at). */
static int empty_list(struct shoal_ct_ctx *c, struct shoal_ct_val *out)
{
    struct shoal_ct_list *l = shoal_ct_list_new(c, 0);
    if (!l)
        return c->rc;
    *out = shoal_ct_list_val(l);
    return 0;
}

/* select/reject/selectattr/rejectattr: keep items whose (attribute) value
 * passes the test (or is truthy when no test is named). */
static int filter_select(struct shoal_ct_ctx *c, struct shoal_ct_str name,
                         struct shoal_ct_val v, const struct shoal_ct_args *a,
                         int by_attr, int keep_if, struct shoal_ct_val *out)
{
    const struct shoal_ct_list *items;
    struct shoal_ct_str attr = {0}, test = {0};
    size_t next = 0;
    if (!shoal_ct_truthy(v))
        return empty_list(c, out);
    int rc = check_args(c, "filter", name, a, SIZE_MAX, NULL);
    if (rc || (rc = shoal_ct_iterate(c, v, &items)))
        return rc;
    if (by_attr && (rc = arg_str(c, "filter", name, arg_get(a, next++, NULL),
                                 "attribute", &attr)))
        return rc;
    if (next < a->n_pos && (rc = arg_str(c, "filter", name, &a->pos[next++], "test",
                                         &test)))
        return rc;
    struct shoal_ct_list *l = shoal_ct_list_new(c, items->n);
    if (!l)
        return c->rc;
    size_t n = 0;
    for (size_t k = 0; k < items->n; k++) {
        struct shoal_ct_val x = by_attr ? attr_path(items->items[k], attr)
                                        : items->items[k];
        int pass;
        if (test.n) {
            if ((rc = shoal_ct_test(c, test, x, a->pos + next, a->n_pos - next, &pass)))
                return rc;
        } else {
            pass = shoal_ct_truthy(x);
        }
        if (pass == keep_if)
            l->items[n++] = items->items[k];
    }
    l->n = n;
    *out = shoal_ct_list_val(l);
    return 0;
}

/* map(attribute='x', default=...) or map('filter', args...). */
static int filter_map(struct shoal_ct_ctx *c, struct shoal_ct_str name,
                      struct shoal_ct_val v, const struct shoal_ct_args *a,
                      struct shoal_ct_val *out)
{
    const struct shoal_ct_list *items;
    if (!shoal_ct_truthy(v))
        return empty_list(c, out);
    int rc = shoal_ct_iterate(c, v, &items);
    if (rc)
        return rc;
    const struct shoal_ct_val *attr = arg_get(a, SIZE_MAX, "attribute");
    struct shoal_ct_str fname = {0}, apath = {0};
    struct shoal_ct_args sub = *a;
    if (attr) {
        static const char *const kws[] = {"attribute", "default", NULL};
        if ((rc = check_args(c, "filter", name, a, 0, kws)) ||
            (rc = arg_str(c, "filter", name, attr, "attribute", &apath)))
            return rc;
    } else {
        if ((rc = arg_str(c, "filter", name, arg_get(a, 0, NULL), "filter name",
                          &fname)))
            return rc;
        sub.pos++;
        sub.n_pos--;
    }
    struct shoal_ct_list *l = shoal_ct_list_new(c, items->n);
    if (!l)
        return c->rc;
    const struct shoal_ct_val *def = arg_get(a, SIZE_MAX, "default");
    for (size_t k = 0; k < items->n; k++) {
        if (attr) {
            l->items[k] = attr_path(items->items[k], apath);
            if (l->items[k].kind == SHOAL_CT_UNDEF && def)
                l->items[k] = *def;
        } else if ((rc = shoal_ct_filter(c, fname, items->items[k], &sub,
                                         &l->items[k]))) {
            return rc;
        }
    }
    *out = shoal_ct_list_val(l);
    return 0;
}

static int filter_items(struct shoal_ct_ctx *c, struct shoal_ct_val v,
                        struct shoal_ct_val *out)
{
    if (v.kind == SHOAL_CT_UNDEF)
        return empty_list(c, out);
    if (v.kind != SHOAL_CT_DICT && v.kind != SHOAL_CT_NS)
        return shoal_ct_fail(c, SHOAL_EINVAL, "items needs a dict, found %s",
                             shoal_ct_kind_name(v.kind));
    struct shoal_ct_list *l = shoal_ct_list_new(c, v.u.d->n);
    if (!l)
        return c->rc;
    for (size_t k = 0; k < v.u.d->n; k++) {
        struct shoal_ct_list *pair = shoal_ct_list_new(c, 2);
        if (!pair)
            return c->rc;
        pair->items[0] = v.u.d->keys[k];
        pair->items[1] = v.u.d->vals[k];
        l->items[k] = shoal_ct_list_val(pair);
    }
    *out = shoal_ct_list_val(l);
    return 0;
}

static int filter_number(struct shoal_ct_ctx *c, struct shoal_ct_str name,
                         struct shoal_ct_val v, const struct shoal_ct_args *a,
                         int to_float, struct shoal_ct_val *out)
{
    static const char *const kws[] = {"default", "base", NULL};
    int rc = check_args(c, "filter", name, a, to_float ? 1 : 2, kws);
    if (rc)
        return rc;
    const struct shoal_ct_val *def = arg_get(a, 0, "default");
    double f = 0;
    int ok = 1;
    switch (v.kind) {
    case SHOAL_CT_INT:   f = (double)v.u.i; break;
    case SHOAL_CT_BOOL:  f = v.u.b; break;
    case SHOAL_CT_FLOAT: f = v.u.f; break;
    case SHOAL_CT_STR: {
        char tmp[64];
        struct shoal_ct_str s = strip(v.u.s, NULL, 1, 1);
        if (s.n == 0 || s.n >= sizeof tmp) {
            ok = 0;
            break;
        }
        memcpy(tmp, s.p, s.n);
        tmp[s.n] = '\0';
        char *end;
        if (!to_float) {
            long long i = strtoll(tmp, &end, 10);
            if (*end == '\0') {
                *out = shoal_ct_int(i);
                return 0;
            }
        }
        f = strtod(tmp, &end);
        ok = *end == '\0';
        break;
    }
    default:
        ok = 0;
    }
    if (ok && !to_float && v.kind == SHOAL_CT_INT) {
        *out = v;
    } else if (ok && !to_float) {
        if (!(f > -9.3e18 && f < 9.3e18))
            ok = 0;
        else
            *out = shoal_ct_int((int64_t)f);
    } else if (ok) {
        *out = shoal_ct_float(f);
    }
    if (!ok)
        *out = def ? *def : to_float ? shoal_ct_float(0.0) : shoal_ct_int(0);
    return 0;
}

int shoal_ct_filter(struct shoal_ct_ctx *c, struct shoal_ct_str name,
                    struct shoal_ct_val v, const struct shoal_ct_args *a,
                    struct shoal_ct_val *out)
{
    struct shoal_ct_str s = {0}, x = {0}, y = {0};
    int64_t i;
    int rc;
    if (name_is(name, "tojson"))
        return filter_tojson(c, name, v, a, out);
    if (name_is(name, "selectattr") || name_is(name, "rejectattr"))
        return filter_select(c, name, v, a, 1, name_is(name, "selectattr"), out);
    if (name_is(name, "select") || name_is(name, "reject"))
        return filter_select(c, name, v, a, 0, name_is(name, "select"), out);
    if (name_is(name, "map"))
        return filter_map(c, name, v, a, out);
    if (name_is(name, "int") || name_is(name, "float"))
        return filter_number(c, name, v, a, name_is(name, "float"), out);
    if (name_is(name, "default") || name_is(name, "d")) {
        static const char *const kws[] = {"default_value", "boolean", NULL};
        if ((rc = check_args(c, "filter", name, a, 2, kws)))
            return rc;
        const struct shoal_ct_val *dv = arg_get(a, 0, "default_value");
        const struct shoal_ct_val *boolean = arg_get(a, 1, "boolean");
        int use_default = v.kind == SHOAL_CT_UNDEF ||
                          (boolean && shoal_ct_truthy(*boolean) && !shoal_ct_truthy(v));
        *out = !use_default ? v : dv ? *dv : shoal_ct_str_val("", 0);
        return 0;
    }
    if (name_is(name, "join")) {
        static const char *const kws[] = {"d", "attribute", NULL};
        const struct shoal_ct_val *sep = arg_get(a, 0, "d");
        const struct shoal_ct_val *attr = arg_get(a, 1, "attribute");
        struct shoal_ct_str sep_s = {"", 0}, attr_s;
        if ((rc = check_args(c, "filter", name, a, 2, kws)) ||
            (sep && (rc = shoal_ct_to_str(c, *sep, &sep_s))) ||
            (attr && (rc = arg_str(c, "filter", name, attr, "attribute", &attr_s))))
            return rc;
        return join(c, v, sep_s, attr ? &attr_s : NULL, out);
    }
    if (name_is(name, "items")) {
        if ((rc = check_args(c, "filter", name, a, 0, NULL)))
            return rc;
        return filter_items(c, v, out);
    }
    if (name_is(name, "length") || name_is(name, "count")) {
        if ((rc = check_args(c, "filter", name, a, 0, NULL)))
            return rc;
        switch (v.kind) {
        case SHOAL_CT_UNDEF: *out = shoal_ct_int(0); return 0;
        case SHOAL_CT_STR:   *out = shoal_ct_int((int64_t)shoal_ct_utf8_len(v.u.s)); return 0;
        case SHOAL_CT_LIST:  *out = shoal_ct_int((int64_t)v.u.l->n); return 0;
        case SHOAL_CT_DICT:  *out = shoal_ct_int((int64_t)v.u.d->n); return 0;
        default:
            return shoal_ct_fail(c, SHOAL_EINVAL, "a %s has no length",
                                 shoal_ct_kind_name(v.kind));
        }
    }
    if (name_is(name, "first") || name_is(name, "last")) {
        const struct shoal_ct_list *items;
        if ((rc = check_args(c, "filter", name, a, 0, NULL)) ||
            (rc = shoal_ct_iterate(c, v, &items)))
            return rc;
        *out = items->n == 0 ? shoal_ct_undef()
             : items->items[name_is(name, "first") ? 0 : items->n - 1];
        return 0;
    }
    if (name_is(name, "list")) {
        const struct shoal_ct_list *items;
        if ((rc = check_args(c, "filter", name, a, 0, NULL)) ||
            (rc = shoal_ct_iterate(c, v, &items)))
            return rc;
        /* Lists are never mutated once built, so sharing is safe. */
        *out = shoal_ct_list_val((struct shoal_ct_list *)items);
        return 0;
    }
    if (name_is(name, "reverse")) {
        if ((rc = check_args(c, "filter", name, a, 0, NULL)))
            return rc;
        if (v.kind == SHOAL_CT_STR) {
            size_t n;
            size_t *off = shoal_ct_utf8_offsets(c, v.u.s, &n);
            char *p = off ? shoal_ct_alloc(c, v.u.s.n + 1, 1) : NULL;
            if (!p)
                return c->rc;
            size_t o = 0;
            for (size_t k = n; k-- > 0;) {
                memcpy(p + o, v.u.s.p + off[k], off[k + 1] - off[k]);
                o += off[k + 1] - off[k];
            }
            *out = shoal_ct_str_val(p, o);
            return 0;
        }
        const struct shoal_ct_list *items;
        if ((rc = shoal_ct_iterate(c, v, &items)))
            return rc;
        struct shoal_ct_list *l = shoal_ct_list_new(c, items->n);
        if (!l)
            return c->rc;
        for (size_t k = 0; k < items->n; k++)
            l->items[k] = items->items[items->n - 1 - k];
        *out = shoal_ct_list_val(l);
        return 0;
    }
    if (name_is(name, "abs")) {
        if ((rc = check_args(c, "filter", name, a, 0, NULL)))
            return rc;
        if (v.kind == SHOAL_CT_FLOAT)
            *out = shoal_ct_float(fabs(v.u.f));
        else if (v.kind == SHOAL_CT_INT && v.u.i != INT64_MIN)
            *out = shoal_ct_int(v.u.i < 0 ? -v.u.i : v.u.i);
        else if (v.kind == SHOAL_CT_BOOL)
            *out = shoal_ct_int(v.u.b);
        else
            return shoal_ct_fail(c, SHOAL_EINVAL, "abs needs a number, found %s",
                                 shoal_ct_kind_name(v.kind));
        return 0;
    }
    if (name_is(name, "safe")) { /* no autoescaping here: identity */
        *out = v;
        return check_args(c, "filter", name, a, 0, NULL);
    }
    /* The rest work on str(v). */
    if (!(name_is(name, "string") || name_is(name, "trim") || name_is(name, "upper") ||
          name_is(name, "lower") || name_is(name, "capitalize") ||
          name_is(name, "title") || name_is(name, "replace")))
        return unknown(c, "filter", name);
    if ((rc = shoal_ct_to_str(c, v, &s)))
        return rc;
    if (name_is(name, "string")) {
        *out = shoal_ct_str_val(s.p, s.n);
        return check_args(c, "filter", name, a, 0, NULL);
    }
    if (name_is(name, "trim")) {
        static const char *const kws[] = {"chars", NULL};
        const struct shoal_ct_val *chars = arg_get(a, 0, "chars");
        if ((rc = check_args(c, "filter", name, a, 1, kws)))
            return rc;
        if (chars && chars->kind != SHOAL_CT_NONE &&
            (rc = arg_str(c, "filter", name, chars, "chars", &x)))
            return rc;
        s = strip(s, chars && chars->kind != SHOAL_CT_NONE ? &x : NULL, 1, 1);
        *out = shoal_ct_str_val(s.p, s.n);
        return 0;
    }
    if (name_is(name, "replace")) {
        static const char *const kws[] = {"old", "new", "count", NULL};
        if ((rc = check_args(c, "filter", name, a, 3, kws)) ||
            (rc = arg_str(c, "filter", name, arg_get(a, 0, "old"), "old", &x)) ||
            (rc = arg_str(c, "filter", name, arg_get(a, 1, "new"), "new", &y)) ||
            (rc = arg_int(c, "filter", name, arg_get(a, 2, "count"), "count", -1, &i)))
            return rc;
        return replace(c, s, x, y, i, out);
    }
    if ((rc = check_args(c, "filter", name, a, 0, NULL)))
        return rc;
    return map_case(c, s, name_is(name, "upper") ? CASE_UPPER
                          : name_is(name, "lower") ? CASE_LOWER
                          : name_is(name, "title") ? CASE_WORDS : CASE_CAPITALIZE, out);
}

/* ---- methods ------------------------------------------------------------ */

static int str_method(struct shoal_ct_ctx *c, struct shoal_ct_str s,
                      struct shoal_ct_str name, const struct shoal_ct_args *a,
                      struct shoal_ct_val *out)
{
    struct shoal_ct_str x = {0}, y = {0};
    int64_t i;
    int rc, r;
    if (name_is(name, "format"))
        return shoal_ct_str_format(c, s, a, out);
    if (name_is(name, "strip") || name_is(name, "lstrip") || name_is(name, "rstrip")) {
        const struct shoal_ct_val *chars = arg_get(a, 0, NULL);
        if ((rc = check_args(c, "method", name, a, 1, NULL)))
            return rc;
        int has = chars && chars->kind != SHOAL_CT_NONE;
        if (has && (rc = arg_str(c, "method", name, chars, "chars", &x)))
            return rc;
        s = strip(s, has ? &x : NULL, name.p[0] != 'r', name.p[0] != 'l');
        *out = shoal_ct_str_val(s.p, s.n);
        return 0;
    }
    if (name_is(name, "startswith") || name_is(name, "endswith")) {
        const struct shoal_ct_val *what = arg_get(a, 0, NULL);
        if ((rc = check_args(c, "method", name, a, 1, NULL)))
            return rc;
        if (!what)
            return shoal_ct_fail(c, SHOAL_EINVAL, "%.*s() needs an argument",
                                 (int)name.n, name.p);
        if ((rc = starts_or_ends(c, s, *what, name.p[0] == 'e', &r)))
            return rc;
        *out = shoal_ct_bool(r);
        return 0;
    }
    if (name_is(name, "split")) {
        static const char *const kws[] = {"sep", "maxsplit", NULL};
        const struct shoal_ct_val *sep = arg_get(a, 0, "sep");
        int has = sep && sep->kind != SHOAL_CT_NONE;
        if ((rc = check_args(c, "method", name, a, 2, kws)) ||
            (has && (rc = arg_str(c, "method", name, sep, "sep", &x))) ||
            (rc = arg_int(c, "method", name, arg_get(a, 1, "maxsplit"), "maxsplit",
                          -1, &i)))
            return rc;
        return split(c, s, has ? &x : NULL, i, out);
    }
    if (name_is(name, "replace")) {
        if ((rc = check_args(c, "method", name, a, 3, NULL)) ||
            (rc = arg_str(c, "method", name, arg_get(a, 0, NULL), "old", &x)) ||
            (rc = arg_str(c, "method", name, arg_get(a, 1, NULL), "new", &y)) ||
            (rc = arg_int(c, "method", name, arg_get(a, 2, NULL), "count", -1, &i)))
            return rc;
        return replace(c, s, x, y, i, out);
    }
    if (name_is(name, "upper") || name_is(name, "lower") || name_is(name, "title") ||
        name_is(name, "capitalize")) {
        if ((rc = check_args(c, "method", name, a, 0, NULL)))
            return rc;
        return map_case(c, s, name_is(name, "upper") ? CASE_UPPER
                              : name_is(name, "lower") ? CASE_LOWER
                              : name_is(name, "title") ? CASE_TITLE : CASE_CAPITALIZE,
                        out);
    }
    if (name_is(name, "find") || name_is(name, "count")) {
        if ((rc = check_args(c, "method", name, a, 1, NULL)) ||
            (rc = arg_str(c, "method", name, arg_get(a, 0, NULL), "sub", &x)))
            return rc;
        if (name_is(name, "find")) {
            const char *hit = find_sub(s, 0, x);
            *out = shoal_ct_int(hit ? (int64_t)shoal_ct_utf8_len(
                                          (struct shoal_ct_str){s.p, (size_t)(hit - s.p)})
                                    : -1);
            return 0;
        }
        int64_t n = 0;
        if (x.n == 0) {
            n = (int64_t)shoal_ct_utf8_len(s) + 1;
        } else {
            for (const char *h = find_sub(s, 0, x); h;
                 h = find_sub(s, (size_t)(h - s.p) + x.n, x))
                n++;
        }
        *out = shoal_ct_int(n);
        return 0;
    }
    if (name_is(name, "join")) {
        const struct shoal_ct_val *seq = arg_get(a, 0, NULL);
        if ((rc = check_args(c, "method", name, a, 1, NULL)))
            return rc;
        if (!seq)
            return shoal_ct_fail(c, SHOAL_EINVAL, "join() needs an argument");
        return join(c, *seq, s, NULL, out);
    }
    return shoal_ct_fail(c, SHOAL_EINVAL, "unknown method '%.*s' on a string",
                         (int)name.n, name.p);
}

static int dict_method(struct shoal_ct_ctx *c, struct shoal_ct_val obj,
                       struct shoal_ct_str name, const struct shoal_ct_args *a,
                       struct shoal_ct_val *out)
{
    const struct shoal_ct_dict *d = obj.u.d;
    int rc;
    if (name_is(name, "get")) {
        const struct shoal_ct_val *key = arg_get(a, 0, NULL);
        const struct shoal_ct_val *def = arg_get(a, 1, NULL);
        if ((rc = check_args(c, "method", name, a, 2, NULL)))
            return rc;
        if (!key)
            return shoal_ct_fail(c, SHOAL_EINVAL, "get() needs a key");
        struct shoal_ct_val *v = shoal_ct_dict_lookup(d, *key);
        *out = v ? *v : def ? *def : shoal_ct_none();
        return 0;
    }
    if ((rc = check_args(c, "method", name, a, 0, NULL)))
        return rc;
    if (name_is(name, "items"))
        return filter_items(c, obj, out);
    if (name_is(name, "keys") || name_is(name, "values")) {
        struct shoal_ct_list *l = shoal_ct_list_new(c, d->n);
        if (!l)
            return c->rc;
        for (size_t k = 0; k < d->n; k++)
            l->items[k] = name_is(name, "keys")
                          ? d->keys[k] : d->vals[k];
        *out = shoal_ct_list_val(l);
        return 0;
    }
    return shoal_ct_fail(c, SHOAL_EINVAL, "unknown method '%.*s' on a %s", (int)name.n,
                         name.p, shoal_ct_kind_name(obj.kind));
}

int shoal_ct_method(struct shoal_ct_ctx *c, struct shoal_ct_val obj,
                    struct shoal_ct_str name, const struct shoal_ct_args *a,
                    struct shoal_ct_val *out)
{
    switch (obj.kind) {
    case SHOAL_CT_STR:
        return str_method(c, obj.u.s, name, a, out);
    case SHOAL_CT_DICT:
    case SHOAL_CT_NS:
        return dict_method(c, obj, name, a, out);
    case SHOAL_CT_LOOP:
        if (name_is(name, "cycle") && a->n_kw == 0) {
            if (a->n_pos == 0)
                return shoal_ct_fail(c, SHOAL_EINVAL, "loop.cycle() needs arguments");
            *out = a->pos[(size_t)obj.u.loop->index0 % a->n_pos];
            return 0;
        }
        break;
    case SHOAL_CT_UNDEF:
        return shoal_ct_fail(c, SHOAL_EINVAL, "cannot call '%.*s()' on an undefined "
                             "value (a variable or key that does not exist)",
                             (int)name.n, name.p);
    default:
        break;
    }
    return shoal_ct_fail(c, SHOAL_EINVAL, "unknown method '%.*s' on a %s", (int)name.n,
                         name.p, shoal_ct_kind_name(obj.kind));
}

/* ---- global functions --------------------------------------------------- */

static int global_range(struct shoal_ct_ctx *c, struct shoal_ct_str name,
                        const struct shoal_ct_args *a, struct shoal_ct_val *out)
{
    int64_t v[3] = {0, 0, 1};
    int rc = check_args(c, "function", name, a, 3, NULL);
    if (rc)
        return rc;
    if (a->n_pos == 0)
        return shoal_ct_fail(c, SHOAL_EINVAL, "range() needs 1 to 3 arguments");
    for (size_t k = 0; k < a->n_pos; k++) {
        if (a->pos[k].kind != SHOAL_CT_INT && a->pos[k].kind != SHOAL_CT_BOOL)
            return shoal_ct_fail(c, SHOAL_EINVAL, "range() arguments must be "
                                 "integers, found %s",
                                 shoal_ct_kind_name(a->pos[k].kind));
        v[a->n_pos == 1 ? 1 : k] = a->pos[k].kind == SHOAL_CT_INT ? a->pos[k].u.i
                                                                  : a->pos[k].u.b;
    }
    int64_t start = v[0], stop = v[1], step = v[2];
    if (step == 0)
        return shoal_ct_fail(c, SHOAL_EINVAL, "range() step must not be zero");
    /* Count in floating point first: the int64 difference may overflow. */
    double span = step > 0 ? (double)stop - (double)start : (double)start - (double)stop;
    double fcount = span <= 0 ? 0 : ceil(span / fabs((double)step));
    if (fcount > (double)c->max_steps)
        return shoal_ct_fail(c, SHOAL_ERANGE, "range() of %.0f items is past the "
                             "%" PRIu64 "-step limit (runaway loop?)", fcount,
                             c->max_steps);
    if (c->range_list && c->range_start == start && c->range_stop == stop &&
        c->range_step == step) {
        *out = shoal_ct_list_val(c->range_list);
        return 0;
    }
    size_t n = (size_t)fcount;
    struct shoal_ct_list *l = shoal_ct_list_new(c, n);
    if (!l)
        return c->rc;
    for (size_t k = 0; k < n; k++)
        l->items[k] = shoal_ct_int(start + (int64_t)k * step);
    c->range_start = start;
    c->range_stop = stop;
    c->range_step = step;
    c->range_list = l;
    *out = shoal_ct_list_val(l);
    return 0;
}

/* namespace(...) / dict(...): from keyword arguments and/or one dict. */
static int global_dict(struct shoal_ct_ctx *c, struct shoal_ct_str name,
                       const struct shoal_ct_args *a, enum shoal_ct_kind kind,
                       struct shoal_ct_val *out)
{
    int rc;
    if (a->n_pos > 1)
        return shoal_ct_fail(c, SHOAL_EINVAL, "%.*s() takes at most 1 positional "
                             "argument, got %zu", (int)name.n, name.p, a->n_pos);
    struct shoal_ct_dict *d = shoal_ct_dict_new(c, a->n_kw + 4);
    if (!d)
        return c->rc;
    if (a->n_pos == 1) {
        const struct shoal_ct_val *src = &a->pos[0];
        if (src->kind != SHOAL_CT_DICT && src->kind != SHOAL_CT_NS)
            return shoal_ct_fail(c, SHOAL_EINVAL, "%.*s() takes a dict, found %s",
                                 (int)name.n, name.p, shoal_ct_kind_name(src->kind));
        for (size_t k = 0; k < src->u.d->n; k++)
            if ((rc = shoal_ct_dict_put(c, d, src->u.d->keys[k], src->u.d->vals[k])))
                return rc;
    }
    for (size_t k = 0; k < a->n_kw; k++)
        if ((rc = shoal_ct_dict_set(c, d, a->kw_names[k], a->kw[k])))
            return rc;
    out->kind = kind;
    out->u.d = d;
    return 0;
}

int shoal_ct_global(struct shoal_ct_ctx *c, struct shoal_ct_str name,
                    const struct shoal_ct_args *a, struct shoal_ct_val *out)
{
    int rc;
    if (name_is(name, "namespace") || name_is(name, "dict"))
        return global_dict(c, name, a, name_is(name, "namespace") ? SHOAL_CT_NS
                                                                  : SHOAL_CT_DICT, out);
    if (name_is(name, "range"))
        return global_range(c, name, a, out);
    if (name_is(name, "raise_exception")) {
        struct shoal_ct_str msg = shoal_ct_cstr("(no message)");
        if (a->n_pos && (rc = shoal_ct_to_str(c, a->pos[0], &msg)))
            return rc;
        if (!c->rc) {
            c->rc = SHOAL_EINVAL;
            shoal_err_set(c->err, SHOAL_EINVAL, "chat template raised an exception "
                          "at line %d: %.*s", c->line, (int)msg.n, msg.p);
        }
        return c->rc;
    }
    if (name_is(name, "strftime_now")) {
        struct shoal_ct_str fmt = {0};
        if ((rc = check_args(c, "function", name, a, 1, NULL)) ||
            (rc = arg_str(c, "function", name, arg_get(a, 0, NULL), "format", &fmt)))
            return rc;
        char f[128], buf[256];
        if (fmt.n >= sizeof f)
            return shoal_ct_fail(c, SHOAL_EINVAL, "strftime_now(): format longer "
                                 "than %zu bytes", sizeof f - 1);
        memcpy(f, fmt.p, fmt.n);
        f[fmt.n] = '\0';
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(buf, sizeof buf, f, &tm);
        char *p = shoal_ct_alloc(c, n + 1, 1);
        if (!p)
            return c->rc;
        memcpy(p, buf, n);
        *out = shoal_ct_str_val(p, n);
        return 0;
    }
    return unknown(c, "function", name);
}

struct shoal_ct_val shoal_ct_global_lookup(struct shoal_ct_str name)
{
    /* The names shoal_ct_global implements: jinja2's defaults that chat
     * templates call, and the two transformers adds. */
    static const char *const names[] = {"namespace", "dict", "range",
                                        "raise_exception", "strftime_now"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (name_is(name, names[k]))
            return (struct shoal_ct_val){.kind = SHOAL_CT_FUNC, .u.func = names[k]};
    return shoal_ct_undef();
}
