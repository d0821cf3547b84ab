/* chat_template_value: the chat template's values: the render's error and
 * memory helpers, containers, text buffers, UTF-8 helpers, Python str()/repr()
 * and float formatting, truthiness and equality, attribute access and
 * iteration. See chat_template_impl.h. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_impl.h"
#include "util.h"

/* ---- errors and memory ------------------------------------------------ */

int shoal_ct_fail(struct shoal_ct_ctx *c, int code, const char *fmt, ...)
{
    if (c->rc)
        return c->rc;
    char msg[SHOAL_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->rc = code;
    shoal_err_set(c->err, code, "chat template line %d: %s", c->line, msg);
    return code;
}

void *shoal_ct_alloc(struct shoal_ct_ctx *c, size_t count, size_t size)
{
    size_t n;
    if (shoal_mul_overflow(count, size, &n) || n > c->arena.cap - 16) {
        shoal_ct_fail(c, SHOAL_ERANGE, "a value of %zu x %zu bytes is past the "
                      "%zu-byte memory limit", count, size, c->arena.cap);
        return NULL;
    }
    void *p = shoal_ct_arena_alloc(&c->arena, n);
    if (!p) {
        if (c->arena.used + n + 16 > c->arena.cap)
            shoal_ct_fail(c, SHOAL_ERANGE, "template needs more than %zu bytes of "
                          "working memory (runaway loop?)", c->arena.cap);
        else
            shoal_ct_fail(c, SHOAL_ENOMEM, "out of memory allocating %zu bytes", n);
    }
    return p;
}

struct shoal_ct_list *shoal_ct_list_new(struct shoal_ct_ctx *c, size_t n)
{
    struct shoal_ct_list *l = shoal_ct_alloc(c, 1, sizeof *l);
    if (!l)
        return NULL;
    l->n = n;
    if (n && !(l->items = shoal_ct_alloc(c, n, sizeof *l->items)))
        return NULL;
    return l;
}

struct shoal_ct_dict *shoal_ct_dict_new(struct shoal_ct_ctx *c, size_t cap)
{
    struct shoal_ct_dict *d = shoal_ct_alloc(c, 1, sizeof *d);
    if (!d)
        return NULL;
    if (cap) {
        d->keys = shoal_ct_alloc(c, cap, sizeof *d->keys);
        d->vals = shoal_ct_alloc(c, cap, sizeof *d->vals);
        if (!d->keys || !d->vals)
            return NULL;
    }
    d->cap = cap;
    return d;
}

struct shoal_ct_val *shoal_ct_dict_get(const struct shoal_ct_dict *d,
                                       struct shoal_ct_str key)
{
    /* Linear: template dicts (messages, namespaces, frames) are small. */
    for (size_t k = 0; k < d->n; k++)
        if (d->keys[k].kind == SHOAL_CT_STR && shoal_ct_str_eq(d->keys[k].u.s, key))
            return &d->vals[k];
    return NULL;
}

struct shoal_ct_val *shoal_ct_dict_lookup(const struct shoal_ct_dict *d,
                                          struct shoal_ct_val key)
{
    if (key.kind == SHOAL_CT_STR)
        return shoal_ct_dict_get(d, key.u.s);
    for (size_t k = 0; k < d->n; k++)
        if (d->keys[k].kind != SHOAL_CT_STR && shoal_ct_equal(d->keys[k], key, 0))
            return &d->vals[k];
    return NULL;
}

int shoal_ct_dict_put(struct shoal_ct_ctx *c, struct shoal_ct_dict *d,
                      struct shoal_ct_val key, struct shoal_ct_val v)
{
    switch (key.kind) {
    case SHOAL_CT_NONE:
    case SHOAL_CT_BOOL:
    case SHOAL_CT_INT:
    case SHOAL_CT_FLOAT:
    case SHOAL_CT_STR:
        break;
    default:
        return shoal_ct_fail(c, SHOAL_EINVAL, "unhashable type: a %s cannot be a "
                             "dict key", shoal_ct_kind_name(key.kind));
    }
    struct shoal_ct_val *slot = shoal_ct_dict_lookup(d, key);
    if (slot) {
        *slot = v;
        return 0;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 4;
        struct shoal_ct_val *keys = shoal_ct_alloc(c, cap, sizeof *keys);
        struct shoal_ct_val *vals = shoal_ct_alloc(c, cap, sizeof *vals);
        if (!keys || !vals)
            return c->rc;
        if (d->n) {
            memcpy(keys, d->keys, d->n * sizeof *keys);
            memcpy(vals, d->vals, d->n * sizeof *vals);
        }
        d->keys = keys;
        d->vals = vals;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n] = v;
    d->n++;
    return 0;
}

int shoal_ct_dict_set(struct shoal_ct_ctx *c, struct shoal_ct_dict *d,
                      struct shoal_ct_str key, struct shoal_ct_val v)
{
    return shoal_ct_dict_put(c, d, shoal_ct_str_val(key.p, key.n), v);
}

/* ---- text buffers ------------------------------------------------------ */

int shoal_ct_buf_put(struct shoal_ct_ctx *c, struct shoal_ct_buf *b,
                     const char *p, size_t n)
{
    if (n == 0)
        return 0;
    if (n > c->max_output || b->n > c->max_output - n)
        return shoal_ct_fail(c, SHOAL_ERANGE, "output would pass the %zu-byte limit "
                             "(runaway loop?)", c->max_output);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q)
            return shoal_ct_fail(c, SHOAL_ENOMEM, "out of memory growing output to "
                                 "%zu bytes", cap);
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    return 0;
}

static int buf_puts(struct shoal_ct_ctx *c, struct shoal_ct_buf *b, const char *s)
{
    return shoal_ct_buf_put(c, b, s, strlen(s));
}

int shoal_ct_buf_finish(struct shoal_ct_ctx *c, struct shoal_ct_buf *b,
                        struct shoal_ct_str *out)
{
    char *p = shoal_ct_alloc(c, b->n + 1, 1);
    if (p && b->n)
        memcpy(p, b->p, b->n);
    if (p) {
        out->p = p;
        out->n = b->n;
    }
    free(b->p);
    memset(b, 0, sizeof *b);
    return p ? 0 : c->rc;
}

/* ---- UTF-8 ------------------------------------------------------------- */

size_t shoal_ct_utf8_len(struct shoal_ct_str s)
{
    size_t n = 0;
    for (size_t k = 0; k < s.n; k++)
        n += ((unsigned char)s.p[k] & 0xC0) != 0x80;
    return n;
}

size_t *shoal_ct_utf8_offsets(struct shoal_ct_ctx *c, struct shoal_ct_str s,
                              size_t *len)
{
    size_t n = shoal_ct_utf8_len(s);
    size_t *off = shoal_ct_alloc(c, n + 1, sizeof *off);
    if (!off)
        return NULL;
    size_t j = 0;
    for (size_t k = 0; k < s.n; k++)
        if (((unsigned char)s.p[k] & 0xC0) != 0x80)
            off[j++] = k;
    off[n] = s.n;
    *len = n;
    return off;
}

/* ---- str / repr -------------------------------------------------------- */

const char *shoal_ct_kind_name(enum shoal_ct_kind kind)
{
    switch (kind) {
    case SHOAL_CT_UNDEF: return "undefined";
    case SHOAL_CT_NONE:  return "none";
    case SHOAL_CT_BOOL:  return "bool";
    case SHOAL_CT_INT:   return "int";
    case SHOAL_CT_FLOAT: return "float";
    case SHOAL_CT_STR:   return "string";
    case SHOAL_CT_LIST:  return "list";
    case SHOAL_CT_DICT:  return "dict";
    case SHOAL_CT_NS:    return "namespace";
    case SHOAL_CT_MACRO: return "macro";
    case SHOAL_CT_LOOP:  return "loop";
    case SHOAL_CT_FUNC:  return "function";
    }
    return "?";
}

void shoal_ct_format_float(double f, char *out)
{
    if (isnan(f)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(out, f < 0 ? "-inf" : "inf");
        return;
    }
    /* Python's repr: the shortest digits that round-trip, written
     * positionally when -4 <= exponent < 16, else as d.ddde+XX. */
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    char digits[24];
    size_t nd = 0;
    const char *p = tmp;
    int neg = *p == '-';
    if (neg)
        p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    char *o = out;
    if (neg)
        *o++ = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            o += sprintf(o, "0.");
            for (int k = -1; k > exp; k--)
                *o++ = '0';
            o += sprintf(o, "%s", digits);
        } else {
            for (int k = 0; k <= exp; k++)
                *o++ = (size_t)k < nd ? digits[k] : '0';
            *o++ = '.';
            if ((size_t)exp + 1 < nd)
                o += sprintf(o, "%s", digits + exp + 1);
            else
                *o++ = '0';
        }
        *o = '\0';
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            o += sprintf(o, "%s", digits + 1);
        }
        sprintf(o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

static int write_scalar(struct shoal_ct_ctx *c, struct shoal_ct_buf *b,
                        struct shoal_ct_val v)
{
    char tmp[40];
    switch (v.kind) {
    case SHOAL_CT_NONE:  return buf_puts(c, b, "None");
    case SHOAL_CT_BOOL:  return buf_puts(c, b, v.u.b ? "True" : "False");
    case SHOAL_CT_INT:
        snprintf(tmp, sizeof tmp, "%" PRId64, v.u.i);
        return buf_puts(c, b, tmp);
    case SHOAL_CT_FLOAT:
        shoal_ct_format_float(v.u.f, tmp);
        return buf_puts(c, b, tmp);
    case SHOAL_CT_MACRO:
        snprintf(tmp, sizeof tmp, "<Macro '%.24s'>", v.u.macro->name.p);
        return buf_puts(c, b, tmp);
    case SHOAL_CT_LOOP:
        snprintf(tmp, sizeof tmp, "<LoopContext %" PRId64 "/%" PRId64 ">",
                 v.u.loop->index0 + 1, v.u.loop->length);
        return buf_puts(c, b, tmp);
    case SHOAL_CT_FUNC: /* jinja2 adds the object's address; we cannot */
        snprintf(tmp, sizeof tmp, "<function %.24s>", v.u.func);
        return buf_puts(c, b, tmp);
    default:
        return 0;
    }
}

static int write_str_repr(struct shoal_ct_ctx *c, struct shoal_ct_buf *b,
                          struct shoal_ct_str s)
{
    /* Python picks single quotes unless the text has ' and no ". */
    char q = memchr(s.p, '\'', s.n) && !memchr(s.p, '"', s.n) ? '"' : '\'';
    int rc = shoal_ct_buf_put(c, b, &q, 1);
    size_t run = 0;
    for (size_t k = 0; k < s.n && !rc; k++) {
        unsigned char ch = (unsigned char)s.p[k];
        char esc[8] = "";
        if (ch == '\\' || ch == (unsigned char)q)
            snprintf(esc, sizeof esc, "\\%c", ch);
        else if (ch == '\n')
            strcpy(esc, "\\n");
        else if (ch == '\r')
            strcpy(esc, "\\r");
        else if (ch == '\t')
            strcpy(esc, "\\t");
        else if (ch < 0x20 || ch == 0x7f)
            snprintf(esc, sizeof esc, "\\x%02x", ch);
        if (!esc[0])
            continue;
        rc = shoal_ct_buf_put(c, b, s.p + run, k - run);
        if (!rc)
            rc = buf_puts(c, b, esc);
        run = k + 1;
    }
    if (!rc)
        rc = shoal_ct_buf_put(c, b, s.p + run, s.n - run);
    return rc ? rc : shoal_ct_buf_put(c, b, &q, 1);
}

static int too_deep(struct shoal_ct_ctx *c, int depth)
{
    if (depth <= SHOAL_CT_MAX_VALUE_DEPTH)
        return 0;
    return shoal_ct_fail(c, SHOAL_ERANGE, "value nested deeper than %d levels "
                         "(does a namespace contain itself?)",
                         SHOAL_CT_MAX_VALUE_DEPTH);
}

int shoal_ct_write_repr(struct shoal_ct_ctx *c, struct shoal_ct_buf *b,
                        struct shoal_ct_val v, int depth)
{
    int rc = too_deep(c, depth);
    if (rc)
        return rc;
    switch (v.kind) {
    case SHOAL_CT_UNDEF:
        return buf_puts(c, b, "Undefined"); /* inside a list or dict */
    case SHOAL_CT_STR:
        return write_str_repr(c, b, v.u.s);
    case SHOAL_CT_LIST:
        rc = buf_puts(c, b, "[");
        for (size_t k = 0; k < v.u.l->n && !rc; k++) {
            if (k)
                rc = buf_puts(c, b, ", ");
            if (!rc)
                rc = shoal_ct_write_repr(c, b, v.u.l->items[k], depth + 1);
        }
        return rc ? rc : buf_puts(c, b, "]");
    case SHOAL_CT_DICT:
    case SHOAL_CT_NS:
        rc = buf_puts(c, b, v.kind == SHOAL_CT_NS ? "<Namespace {" : "{");
        for (size_t k = 0; k < v.u.d->n && !rc; k++) {
            if (k)
                rc = buf_puts(c, b, ", ");
            if (!rc)
                rc = shoal_ct_write_repr(c, b, v.u.d->keys[k], depth + 1);
            if (!rc)
                rc = buf_puts(c, b, ": ");
            if (!rc)
                rc = shoal_ct_write_repr(c, b, v.u.d->vals[k], depth + 1);
        }
        return rc ? rc : buf_puts(c, b, v.kind == SHOAL_CT_NS ? "}>" : "}");
    default:
        return write_scalar(c, b, v);
    }
}

int shoal_ct_write_str(struct shoal_ct_ctx *c, struct shoal_ct_buf *b,
                       struct shoal_ct_val v, int depth)
{
    if (v.kind == SHOAL_CT_STR)
        return shoal_ct_buf_put(c, b, v.u.s.p, v.u.s.n);
    if (v.kind == SHOAL_CT_UNDEF)
        return 0;
    return shoal_ct_write_repr(c, b, v, depth);
}

int shoal_ct_to_str(struct shoal_ct_ctx *c, struct shoal_ct_val v,
                    struct shoal_ct_str *out)
{
    if (v.kind == SHOAL_CT_STR) {
        *out = v.u.s;
        return 0;
    }
    struct shoal_ct_buf b = {0};
    int rc = shoal_ct_write_str(c, &b, v, 0);
    if (rc) {
        free(b.p);
        return rc;
    }
    return shoal_ct_buf_finish(c, &b, out);
}

/* ---- truthiness and equality ------------------------------------------- */

int shoal_ct_truthy(struct shoal_ct_val v)
{
    switch (v.kind) {
    case SHOAL_CT_UNDEF:
    case SHOAL_CT_NONE:  return 0;
    case SHOAL_CT_BOOL:  return v.u.b;
    case SHOAL_CT_INT:   return v.u.i != 0;
    case SHOAL_CT_FLOAT: return v.u.f != 0.0;
    case SHOAL_CT_STR:   return v.u.s.n != 0;
    case SHOAL_CT_LIST:  return v.u.l->n != 0;
    case SHOAL_CT_DICT:  return v.u.d->n != 0;
    default:             return 1;
    }
}

int shoal_ct_equal(struct shoal_ct_val a, struct shoal_ct_val b, int depth)
{
    if (depth > SHOAL_CT_MAX_VALUE_DEPTH)
        return 0;
    if (shoal_ct_is_number(a) && shoal_ct_is_number(b)) {
        if (shoal_ct_is_intlike(a) && shoal_ct_is_intlike(b))
            return shoal_ct_as_int(a) == shoal_ct_as_int(b);
        return shoal_ct_as_float(a) == shoal_ct_as_float(b);
    }
    if (a.kind != b.kind)
        return 0;
    switch (a.kind) {
    case SHOAL_CT_UNDEF:
    case SHOAL_CT_NONE:
        return 1;
    case SHOAL_CT_STR:
        return shoal_ct_str_eq(a.u.s, b.u.s);
    case SHOAL_CT_LIST:
        if (a.u.l->n != b.u.l->n)
            return 0;
        for (size_t k = 0; k < a.u.l->n; k++)
            if (!shoal_ct_equal(a.u.l->items[k], b.u.l->items[k], depth + 1))
                return 0;
        return 1;
    case SHOAL_CT_DICT:
        if (a.u.d->n != b.u.d->n)
            return 0;
        for (size_t k = 0; k < a.u.d->n; k++) {
            struct shoal_ct_val *other = shoal_ct_dict_lookup(b.u.d, a.u.d->keys[k]);
            if (!other || !shoal_ct_equal(a.u.d->vals[k], *other, depth + 1))
                return 0;
        }
        return 1;
    case SHOAL_CT_NS:
        return a.u.d == b.u.d; /* identity, like Python objects */
    case SHOAL_CT_MACRO:
        return a.u.macro == b.u.macro;
    case SHOAL_CT_LOOP:
        return a.u.loop == b.u.loop;
    case SHOAL_CT_FUNC:
        return a.u.func == b.u.func;
    default:
        return 0;
    }
}

/* ---- access ------------------------------------------------------------ */

static struct shoal_ct_val loop_attr(const struct shoal_ct_loop *l,
                                     struct shoal_ct_str name)
{
    int64_t i = l->index0, n = l->length;
    if (shoal_ct_str_eq(name, shoal_ct_cstr("index")))     return shoal_ct_int(i + 1);
    if (shoal_ct_str_eq(name, shoal_ct_cstr("index0")))    return shoal_ct_int(i);
    if (shoal_ct_str_eq(name, shoal_ct_cstr("revindex")))  return shoal_ct_int(n - i);
    if (shoal_ct_str_eq(name, shoal_ct_cstr("revindex0"))) return shoal_ct_int(n - i - 1);
    if (shoal_ct_str_eq(name, shoal_ct_cstr("first")))     return shoal_ct_bool(i == 0);
    if (shoal_ct_str_eq(name, shoal_ct_cstr("last")))      return shoal_ct_bool(i == n - 1);
    if (shoal_ct_str_eq(name, shoal_ct_cstr("length")))    return shoal_ct_int(n);
    if (shoal_ct_str_eq(name, shoal_ct_cstr("depth")))     return shoal_ct_int(1);
    if (shoal_ct_str_eq(name, shoal_ct_cstr("depth0")))    return shoal_ct_int(0);
    if (shoal_ct_str_eq(name, shoal_ct_cstr("previtem")) && i > 0)
        return l->items->items[i - 1];
    if (shoal_ct_str_eq(name, shoal_ct_cstr("nextitem")) && i + 1 < n)
        return l->items->items[i + 1];
    return shoal_ct_undef();
}

struct shoal_ct_val shoal_ct_get_attr(struct shoal_ct_val obj,
                                      struct shoal_ct_str name)
{
    if (obj.kind == SHOAL_CT_DICT || obj.kind == SHOAL_CT_NS) {
        struct shoal_ct_val *v = shoal_ct_dict_get(obj.u.d, name);
        return v ? *v : shoal_ct_undef();
    }
    if (obj.kind == SHOAL_CT_LOOP)
        return loop_attr(obj.u.loop, name);
    /* Lenient where jinja2 raises: an attribute of undefined is undefined. */
    return shoal_ct_undef();
}

int shoal_ct_iterate(struct shoal_ct_ctx *c, struct shoal_ct_val v,
                     const struct shoal_ct_list **out)
{
    static const struct shoal_ct_list empty;
    struct shoal_ct_list *l;
    switch (v.kind) {
    case SHOAL_CT_UNDEF:
        *out = &empty;
        return 0;
    case SHOAL_CT_LIST:
        *out = v.u.l;
        return 0;
    case SHOAL_CT_DICT:
        if (!(l = shoal_ct_list_new(c, v.u.d->n)))
            return c->rc;
        for (size_t k = 0; k < v.u.d->n; k++)
            l->items[k] = v.u.d->keys[k];
        *out = l;
        return 0;
    case SHOAL_CT_STR: {
        size_t n;
        size_t *off = shoal_ct_utf8_offsets(c, v.u.s, &n);
        if (!off || !(l = shoal_ct_list_new(c, n)))
            return c->rc;
        for (size_t k = 0; k < n; k++)
            l->items[k] = shoal_ct_str_val(v.u.s.p + off[k], off[k + 1] - off[k]);
        *out = l;
        return 0;
    }
    default:
        return shoal_ct_fail(c, SHOAL_EINVAL, "cannot iterate over a %s",
                             shoal_ct_kind_name(v.kind));
    }
}
