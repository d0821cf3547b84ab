/* chat_template_format: Python's str.format for chat templates
 * ('{} {}'.format(a, b), '{0}{1}{0}', '{name}', '{0.role}', '{0[key]}',
 * '{!r}', '{{' and '}}'), as jinja2's sandbox runs it. Format specs after ':'
 * are refused with an error naming them: rendering a different string than
 * transformers would is worse than stopping. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_impl.h"

/* Python's manual vs automatic field numbering; they must not be mixed. */
enum numbering { NUM_NONE, NUM_AUTO, NUM_MANUAL };

struct fmt_state {
    struct shoal_ct_ctx *c;
    const struct shoal_ct_args *a;
    enum numbering numbering;
    size_t next_auto;      /* the next '{}' index */
    struct shoal_ct_str fmt;
};

static int is_digits(struct shoal_ct_str s)
{
    if (s.n == 0)
        return 0;
    for (size_t k = 0; k < s.n; k++)
        if (s.p[k] < '0' || s.p[k] > '9')
            return 0;
    return 1;
}

static int fmt_fail(struct fmt_state *st, const char *why, struct shoal_ct_str field)
{
    return shoal_ct_fail(st->c, SHOAL_EINVAL, "str.format of '%.*s': %s '{%.*s}'",
                         (int)(st->fmt.n > 80 ? 80 : st->fmt.n), st->fmt.p, why,
                         (int)field.n, field.p);
}

/* The argument a field names: '' (next automatic index), digits (an index)
 * or a keyword. */
static int fmt_arg(struct fmt_state *st, struct shoal_ct_str first,
                   struct shoal_ct_str field, struct shoal_ct_val *out)
{
    const struct shoal_ct_args *a = st->a;
    if (first.n == 0 || is_digits(first)) {
        enum numbering want = first.n ? NUM_MANUAL : NUM_AUTO;
        if (st->numbering != NUM_NONE && st->numbering != want)
            return fmt_fail(st, want == NUM_AUTO
                            ? "cannot switch from manual field numbering to "
                              "automatic field numbering at"
                            : "cannot switch from automatic field numbering to "
                              "manual field numbering at", field);
        st->numbering = want;
        size_t i = st->next_auto;
        if (want == NUM_MANUAL) {
            if (first.n > 9)
                return fmt_fail(st, "index too large in", field);
            i = (size_t)strtoul(first.p, NULL, 10); /* digits end before '}' */
        } else {
            st->next_auto++;
        }
        if (i >= a->n_pos)
            return shoal_ct_fail(st->c, SHOAL_EINVAL, "str.format of '%.*s': "
                                 "replacement index %zu out of range (%zu positional "
                                 "argument%s)", (int)(st->fmt.n > 80 ? 80 : st->fmt.n),
                                 st->fmt.p, i, a->n_pos, a->n_pos == 1 ? "" : "s");
        *out = a->pos[i];
        return 0;
    }
    for (size_t k = 0; k < a->n_kw; k++)
        if (shoal_ct_str_eq(a->kw_names[k], first)) {
            *out = a->kw[k];
            return 0;
        }
    return fmt_fail(st, "no keyword argument named by", field);
}

/* Follow '.attr' and '[key]' parts after the argument name, the way the
 * sandbox does (a missing attribute or key is undefined). */
static int fmt_access(struct fmt_state *st, struct shoal_ct_str rest,
                      struct shoal_ct_str field, struct shoal_ct_val *v)
{
    size_t k = 0;
    while (k < rest.n) {
        char kind = rest.p[k++];
        size_t from = k;
        if (kind == '.') {
            while (k < rest.n && rest.p[k] != '.' && rest.p[k] != '[')
                k++;
        } else if (kind == '[') {
            while (k < rest.n && rest.p[k] != ']')
                k++;
            if (k == rest.n)
                return fmt_fail(st, "missing ']' in", field);
        } else {
            return fmt_fail(st, "only '.' or '[' may follow the argument name in",
                            field);
        }
        struct shoal_ct_str part = {rest.p + from, k - from};
        if (part.n == 0)
            return fmt_fail(st, "empty attribute or index in", field);
        if (kind == '[')
            k++; /* the ']' */
        if (kind == '[' && is_digits(part) && part.n <= 18) {
            size_t i = (size_t)strtoull(part.p, NULL, 10);
            if (v->kind == SHOAL_CT_LIST) {
                *v = i < v->u.l->n ? v->u.l->items[i] : shoal_ct_undef();
                continue;
            }
            if (v->kind == SHOAL_CT_DICT || v->kind == SHOAL_CT_NS) {
                struct shoal_ct_val *x = shoal_ct_dict_lookup(
                    v->u.d, shoal_ct_int((int64_t)i));
                *v = x ? *x : shoal_ct_undef();
                continue;
            }
        }
        *v = shoal_ct_get_attr(*v, part);
    }
    return 0;
}

/* One replacement field (the text between '{' and '}') appended to b. */
static int fmt_field(struct fmt_state *st, struct shoal_ct_buf *b,
                     struct shoal_ct_str field)
{
    size_t end = 0;
    while (end < field.n && field.p[end] != '!' && field.p[end] != ':')
        end++;
    struct shoal_ct_str name = {field.p, end};
    char conv = 's';
    if (end < field.n && field.p[end] == '!') {
        if (end + 1 >= field.n || (end + 2 < field.n && field.p[end + 2] != ':'))
            return fmt_fail(st, "expected one conversion character after '!' in",
                            field);
        conv = field.p[end + 1];
        if (conv != 's' && conv != 'r')
            return fmt_fail(st, "only the conversions !s and !r are supported, "
                            "not in", field);
        end += 2;
    }
    if (end < field.n) /* ':' and a format spec, possibly empty */
        if (end + 1 < field.n)
            return fmt_fail(st, "format specs (after ':') are not supported; "
                            "found", field);
    size_t first_n = 0;
    while (first_n < name.n && name.p[first_n] != '.' && name.p[first_n] != '[')
        first_n++;
    struct shoal_ct_str first = {name.p, first_n};
    struct shoal_ct_str rest = {name.p + first_n, name.n - first_n};
    struct shoal_ct_val v;
    int rc = fmt_arg(st, first, field, &v);
    if (!rc)
        rc = fmt_access(st, rest, field, &v);
    if (rc)
        return rc;
    return conv == 'r' ? shoal_ct_write_repr(st->c, b, v, 0)
                       : shoal_ct_write_str(st->c, b, v, 0);
}

int shoal_ct_str_format(struct shoal_ct_ctx *c, struct shoal_ct_str fmt,
                        const struct shoal_ct_args *a, struct shoal_ct_val *out)
{
    struct fmt_state st = {.c = c, .a = a, .fmt = fmt};
    struct shoal_ct_buf b = {0};
    size_t k = 0, run = 0;
    int rc = 0;
    while (k < fmt.n && !rc) {
        char ch = fmt.p[k];
        if (ch != '{' && ch != '}') {
            k++;
            continue;
        }
        rc = shoal_ct_buf_put(c, &b, fmt.p + run, k - run);
        if (rc)
            break;
        if (k + 1 < fmt.n && fmt.p[k + 1] == ch) { /* '{{' or '}}' */
            rc = shoal_ct_buf_put(c, &b, &ch, 1);
            k += 2;
            run = k;
            continue;
        }
        if (ch == '}') {
            rc = shoal_ct_fail(c, SHOAL_EINVAL, "str.format of '%.*s': single '}' "
                               "encountered (write '}}' for a brace)",
                               (int)(fmt.n > 80 ? 80 : fmt.n), fmt.p);
            break;
        }
        const char *close = memchr(fmt.p + k + 1, '}', fmt.n - k - 1);
        const char *open = memchr(fmt.p + k + 1, '{', fmt.n - k - 1);
        if (!close) {
            rc = shoal_ct_fail(c, SHOAL_EINVAL, "str.format of '%.*s': single '{' "
                               "encountered (write '{{' for a brace)",
                               (int)(fmt.n > 80 ? 80 : fmt.n), fmt.p);
            break;
        }
        struct shoal_ct_str field = {fmt.p + k + 1, (size_t)(close - fmt.p) - k - 1};
        if (open && open < close) { /* '{:{width}}': a nested field */
            rc = fmt_fail(&st, "nested fields in format specs are not supported;"
                          " found", field);
            break;
        }
        rc = fmt_field(&st, &b, field);
        k = (size_t)(close - fmt.p) + 1;
        run = k;
    }
    if (!rc)
        rc = shoal_ct_buf_put(c, &b, fmt.p + run, fmt.n - run);
    if (rc) {
        free(b.p);
        return rc;
    }
    *out = shoal_ct_str_val("", 0);
    return shoal_ct_buf_finish(c, &b, &out->u.s);
}
