/* chat_template_eval: the chat template evaluator: operators, expressions,
 * statements, scopes and shoal_chat_template_render. Values live in
 * chat_template_value.c; filters, tests, methods and global functions in
 * chat_template_builtins.c. */
#include "chat_template.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_impl.h"
#include "util.h"

/* exec() results besides 0 and negative errors: loop control in flight. */
enum { SIG_BREAK = 1, SIG_CONTINUE = 2 };

/* Variables of one frame: the template's globals, one for-loop iteration, or
 * one macro call. `{% set %}` writes the innermost frame, as in jinja2. */
struct shoal_ct_scope {
    struct shoal_ct_scope *parent;
    struct shoal_ct_dict vars;
};

/* Python ordering of numbers, strings (code point order = UTF-8 byte order)
 * and lists; *cmp < 0, 0, > 0. */
static int compare(struct shoal_ct_ctx *c, struct shoal_ct_val a,
                   struct shoal_ct_val b, const char *op, int depth, int *cmp)
{
    if (shoal_ct_is_number(a) && shoal_ct_is_number(b)) {
        if (shoal_ct_is_intlike(a) && shoal_ct_is_intlike(b)) {
            int64_t x = shoal_ct_as_int(a), y = shoal_ct_as_int(b);
            *cmp = (x > y) - (x < y);
        } else {
            double x = shoal_ct_as_float(a), y = shoal_ct_as_float(b);
            *cmp = (x > y) - (x < y);
        }
        return 0;
    }
    if (a.kind == SHOAL_CT_STR && b.kind == SHOAL_CT_STR) {
        size_t m = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int r = m ? memcmp(a.u.s.p, b.u.s.p, m) : 0;
        *cmp = r ? r : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
        return 0;
    }
    if (a.kind == SHOAL_CT_LIST && b.kind == SHOAL_CT_LIST &&
        depth <= SHOAL_CT_MAX_VALUE_DEPTH) {
        size_t m = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t k = 0; k < m; k++) {
            int rc = compare(c, a.u.l->items[k], b.u.l->items[k], op, depth + 1, cmp);
            if (rc || *cmp)
                return rc;
        }
        *cmp = (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
        return 0;
    }
    return shoal_ct_fail(c, SHOAL_EINVAL, "'%s' is not supported between %s and %s",
                         op, shoal_ct_kind_name(a.kind), shoal_ct_kind_name(b.kind));
}

/* ---- access ------------------------------------------------------------ */

static int get_item(struct shoal_ct_ctx *c, struct shoal_ct_val obj,
                    struct shoal_ct_val key, struct shoal_ct_val *out)
{
    *out = shoal_ct_undef();
    if (obj.kind == SHOAL_CT_DICT || obj.kind == SHOAL_CT_NS) {
        struct shoal_ct_val *v = shoal_ct_dict_lookup(obj.u.d, key);
        if (v)
            *out = *v;
        return 0;
    }
    if (key.kind == SHOAL_CT_STR) {
        *out = shoal_ct_get_attr(obj, key.u.s);
        return 0;
    }
    if (!shoal_ct_is_intlike(key))
        return 0;
    int64_t i = shoal_ct_as_int(key);
    if (obj.kind == SHOAL_CT_LIST) {
        int64_t n = (int64_t)obj.u.l->n;
        if (i < 0)
            i += n;
        if (i >= 0 && i < n)
            *out = obj.u.l->items[i];
    } else if (obj.kind == SHOAL_CT_STR) {
        size_t n;
        size_t *off = shoal_ct_utf8_offsets(c, obj.u.s, &n);
        if (!off)
            return c->rc;
        if (i < 0)
            i += (int64_t)n;
        if (i >= 0 && i < (int64_t)n)
            *out = shoal_ct_str_val(obj.u.s.p + off[i], off[i + 1] - off[i]);
    }
    return 0;
}

/* Python's slice.indices(): normalized start and step, and the count. */
static int slice_bounds(struct shoal_ct_ctx *c, int64_t len, struct shoal_ct_val vstart,
                        struct shoal_ct_val vstop, struct shoal_ct_val vstep,
                        int64_t *start, int64_t *step, int64_t *count)
{
    const struct shoal_ct_val *vs[3] = {&vstart, &vstop, &vstep};
    for (int k = 0; k < 3; k++)
        if (vs[k]->kind != SHOAL_CT_NONE && vs[k]->kind != SHOAL_CT_UNDEF &&
            !shoal_ct_is_intlike(*vs[k]))
            return shoal_ct_fail(c, SHOAL_EINVAL, "slice indices must be integers "
                                 "or none, found %s", shoal_ct_kind_name(vs[k]->kind));
    int64_t st = shoal_ct_is_intlike(vstep) ? shoal_ct_as_int(vstep) : 1;
    if (st == 0)
        return shoal_ct_fail(c, SHOAL_EINVAL, "slice step cannot be zero");
    int64_t lo, hi;
    if (shoal_ct_is_intlike(vstart)) {
        lo = shoal_ct_as_int(vstart);
        if (lo < 0) {
            lo += len;
            if (lo < 0)
                lo = st < 0 ? -1 : 0;
        } else if (lo >= len) {
            lo = st < 0 ? len - 1 : len;
        }
    } else {
        lo = st < 0 ? len - 1 : 0;
    }
    if (shoal_ct_is_intlike(vstop)) {
        hi = shoal_ct_as_int(vstop);
        if (hi < 0) {
            hi += len;
            if (hi < 0)
                hi = st < 0 ? -1 : 0;
        } else if (hi >= len) {
            hi = st < 0 ? len - 1 : len;
        }
    } else {
        hi = st < 0 ? -1 : len;
    }
    if (st < 0)
        *count = hi < lo ? (lo - hi - 1) / (-st) + 1 : 0;
    else
        *count = lo < hi ? (hi - lo - 1) / st + 1 : 0;
    *start = lo;
    *step = st;
    return 0;
}

static int do_slice(struct shoal_ct_ctx *c, struct shoal_ct_val obj,
                    struct shoal_ct_val a, struct shoal_ct_val b,
                    struct shoal_ct_val s, struct shoal_ct_val *out)
{
    int64_t start, step, count;
    int rc;
    if (obj.kind == SHOAL_CT_LIST) {
        if ((rc = slice_bounds(c, (int64_t)obj.u.l->n, a, b, s, &start, &step, &count)))
            return rc;
        struct shoal_ct_list *l = shoal_ct_list_new(c, (size_t)count);
        if (!l)
            return c->rc;
        for (int64_t k = 0; k < count; k++)
            l->items[k] = obj.u.l->items[start + k * step];
        *out = shoal_ct_list_val(l);
        return 0;
    }
    if (obj.kind == SHOAL_CT_STR) {
        size_t n;
        size_t *off = shoal_ct_utf8_offsets(c, obj.u.s, &n);
        if (!off)
            return c->rc;
        if ((rc = slice_bounds(c, (int64_t)n, a, b, s, &start, &step, &count)))
            return rc;
        if (step == 1) {
            size_t from = off[start], to = off[start + count];
            *out = shoal_ct_str_val(obj.u.s.p + from, to - from);
            return 0;
        }
        char *p = shoal_ct_alloc(c, obj.u.s.n + 1, 1);
        if (!p)
            return c->rc;
        size_t o = 0;
        for (int64_t k = 0; k < count; k++) {
            size_t i = (size_t)(start + k * step);
            memcpy(p + o, obj.u.s.p + off[i], off[i + 1] - off[i]);
            o += off[i + 1] - off[i];
        }
        *out = shoal_ct_str_val(p, o);
        return 0;
    }
    if (obj.kind == SHOAL_CT_UNDEF) {
        *out = shoal_ct_undef();
        return 0;
    }
    return shoal_ct_fail(c, SHOAL_EINVAL, "cannot slice a %s",
                         shoal_ct_kind_name(obj.kind));
}

/* ---- operators --------------------------------------------------------- */

static const char *op_text(int op)
{
    switch (op) {
    case SHOAL_CT_OP_ADD:      return "+";
    case SHOAL_CT_OP_SUB:      return "-";
    case SHOAL_CT_OP_MUL:      return "*";
    case SHOAL_CT_OP_DIV:      return "/";
    case SHOAL_CT_OP_FLOORDIV: return "//";
    case SHOAL_CT_OP_MOD:      return "%";
    case SHOAL_CT_OP_POW:      return "**";
    case SHOAL_CT_OP_CONCAT:   return "~";
    case SHOAL_CT_OP_EQ:       return "==";
    case SHOAL_CT_OP_NE:       return "!=";
    case SHOAL_CT_OP_LT:       return "<";
    case SHOAL_CT_OP_LE:       return "<=";
    case SHOAL_CT_OP_GT:       return ">";
    case SHOAL_CT_OP_GE:       return ">=";
    case SHOAL_CT_OP_IN:       return "in";
    case SHOAL_CT_OP_NOTIN:    return "not in";
    default:                   return "?";
    }
}

static int type_error(struct shoal_ct_ctx *c, int op, struct shoal_ct_val a,
                      struct shoal_ct_val b)
{
    if (a.kind == SHOAL_CT_UNDEF || b.kind == SHOAL_CT_UNDEF)
        return shoal_ct_fail(c, SHOAL_EINVAL, "undefined value used with '%s' "
                             "(a variable or key that does not exist)", op_text(op));
    return shoal_ct_fail(c, SHOAL_EINVAL, "unsupported operand types for '%s': "
                         "%s and %s", op_text(op), shoal_ct_kind_name(a.kind),
                         shoal_ct_kind_name(b.kind));
}

static int concat_str(struct shoal_ct_ctx *c, struct shoal_ct_str a,
                      struct shoal_ct_str b, struct shoal_ct_val *out)
{
    char *p = shoal_ct_alloc(c, a.n + b.n + 1, 1);
    if (!p)
        return c->rc;
    if (a.n)
        memcpy(p, a.p, a.n);
    if (b.n)
        memcpy(p + a.n, b.p, b.n);
    *out = shoal_ct_str_val(p, a.n + b.n);
    return 0;
}

/* seq * k for strings and lists: k copies of seq, empty when k <= 0 or seq
 * is empty. An empty list has no items array (items NULL), so nothing is
 * copied from an empty sequence. */
static int repeat(struct shoal_ct_ctx *c, struct shoal_ct_val seq, int64_t k,
                  struct shoal_ct_val *out)
{
    size_t times = k > 0 ? (size_t)k : 0, n;
    if (seq.kind == SHOAL_CT_STR) {
        if (times == 0 || seq.u.s.n == 0) {
            *out = shoal_ct_str_val("", 0);
            return 0;
        }
        if (shoal_mul_overflow(times, seq.u.s.n, &n) || n == SIZE_MAX)
            return shoal_ct_fail(c, SHOAL_ERANGE, "string repetition is too large");
        char *p = shoal_ct_alloc(c, n + 1, 1);
        if (!p)
            return c->rc;
        for (size_t t = 0; t < times; t++)
            memcpy(p + t * seq.u.s.n, seq.u.s.p, seq.u.s.n);
        *out = shoal_ct_str_val(p, n);
        return 0;
    }
    if (shoal_mul_overflow(times, seq.u.l->n, &n))
        return shoal_ct_fail(c, SHOAL_ERANGE, "list repetition is too large");
    struct shoal_ct_list *l = shoal_ct_list_new(c, n);
    if (!l)
        return c->rc;
    for (size_t t = 0; n && t < times; t++)
        memcpy(l->items + t * seq.u.l->n, seq.u.l->items,
               seq.u.l->n * sizeof *l->items);
    *out = shoal_ct_list_val(l);
    return 0;
}

static int arith(struct shoal_ct_ctx *c, int op, struct shoal_ct_val a,
                 struct shoal_ct_val b, struct shoal_ct_val *out)
{
    if (!shoal_ct_is_number(a) || !shoal_ct_is_number(b))
        return type_error(c, op, a, b);
    if (shoal_ct_is_intlike(a) && shoal_ct_is_intlike(b) && op != SHOAL_CT_OP_DIV) {
        int64_t x = shoal_ct_as_int(a), y = shoal_ct_as_int(b), r = 0;
        int ovf = 0;
        switch (op) {
        case SHOAL_CT_OP_ADD: ovf = __builtin_add_overflow(x, y, &r); break;
        case SHOAL_CT_OP_SUB: ovf = __builtin_sub_overflow(x, y, &r); break;
        case SHOAL_CT_OP_MUL: ovf = __builtin_mul_overflow(x, y, &r); break;
        case SHOAL_CT_OP_FLOORDIV:
        case SHOAL_CT_OP_MOD:
            if (y == 0)
                return shoal_ct_fail(c, SHOAL_EINVAL, "integer division or modulo "
                                     "by zero");
            if (x == INT64_MIN && y == -1) {
                ovf = op == SHOAL_CT_OP_FLOORDIV;
                r = 0;
                break;
            }
            /* Python rounds toward minus infinity. */
            r = x / y;
            int64_t m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                r -= 1;
                m += y;
            }
            if (op == SHOAL_CT_OP_MOD)
                r = m;
            break;
        case SHOAL_CT_OP_POW: {
            if (y < 0) {
                *out = shoal_ct_float(pow((double)x, (double)y));
                return 0;
            }
            /* Square-and-multiply; squaring only when a higher bit remains,
             * so it overflows only if the result would. */
            int64_t base = x;
            r = 1;
            for (int64_t e = y; e > 0 && !ovf; e >>= 1) {
                if (e & 1)
                    ovf = __builtin_mul_overflow(r, base, &r);
                if ((e >> 1) && !ovf)
                    ovf = __builtin_mul_overflow(base, base, &base);
            }
            break;
        }
        }
        if (ovf)
            return shoal_ct_fail(c, SHOAL_ERANGE, "integer overflow in %" PRId64
                                 " %s %" PRId64, x, op_text(op), y);
        *out = shoal_ct_int(r);
        return 0;
    }
    double x = shoal_ct_as_float(a), y = shoal_ct_as_float(b), r;
    switch (op) {
    case SHOAL_CT_OP_ADD: r = x + y; break;
    case SHOAL_CT_OP_SUB: r = x - y; break;
    case SHOAL_CT_OP_MUL: r = x * y; break;
    case SHOAL_CT_OP_POW: r = pow(x, y); break;
    default:
        if (y == 0.0)
            return shoal_ct_fail(c, SHOAL_EINVAL, "division by zero");
        if (op == SHOAL_CT_OP_DIV) {
            r = x / y;
        } else {
            double m = fmod(x, y); /* Python: the sign follows the divisor */
            if (m != 0.0 && ((m < 0) != (y < 0)))
                m += y;
            r = op == SHOAL_CT_OP_MOD ? m : floor(x / y);
        }
    }
    *out = shoal_ct_float(r);
    return 0;
}

static int contains(struct shoal_ct_ctx *c, struct shoal_ct_val item,
                    struct shoal_ct_val seq, int *found)
{
    *found = 0;
    switch (seq.kind) {
    case SHOAL_CT_STR:
        if (item.kind != SHOAL_CT_STR)
            return shoal_ct_fail(c, SHOAL_EINVAL, "'in <string>' needs a string "
                                 "on the left, found %s",
                                 shoal_ct_kind_name(item.kind));
        if (item.u.s.n == 0)
            *found = 1;
        else if (item.u.s.n <= seq.u.s.n)
            *found = memmem(seq.u.s.p, seq.u.s.n, item.u.s.p, item.u.s.n) != NULL;
        return 0;
    case SHOAL_CT_LIST:
        for (size_t k = 0; k < seq.u.l->n && !*found; k++)
            *found = shoal_ct_equal(item, seq.u.l->items[k], 0);
        return 0;
    case SHOAL_CT_DICT:
    case SHOAL_CT_NS:
        *found = shoal_ct_dict_lookup(seq.u.d, item) != NULL;
        return 0;
    case SHOAL_CT_UNDEF:
        return 0;
    default:
        return shoal_ct_fail(c, SHOAL_EINVAL, "'in' needs a string, list or dict "
                             "on the right, found %s", shoal_ct_kind_name(seq.kind));
    }
}

static int binop(struct shoal_ct_ctx *c, int op, struct shoal_ct_val a,
                 struct shoal_ct_val b, struct shoal_ct_val *out)
{
    int r, rc;
    switch (op) {
    case SHOAL_CT_OP_ADD:
        if (a.kind == SHOAL_CT_STR && b.kind == SHOAL_CT_STR)
            return concat_str(c, a.u.s, b.u.s, out);
        if (a.kind == SHOAL_CT_LIST && b.kind == SHOAL_CT_LIST) {
            struct shoal_ct_list *l = shoal_ct_list_new(c, a.u.l->n + b.u.l->n);
            if (!l)
                return c->rc;
            if (a.u.l->n)
                memcpy(l->items, a.u.l->items, a.u.l->n * sizeof *l->items);
            if (b.u.l->n)
                memcpy(l->items + a.u.l->n, b.u.l->items, b.u.l->n * sizeof *l->items);
            *out = shoal_ct_list_val(l);
            return 0;
        }
        return arith(c, op, a, b, out);
    case SHOAL_CT_OP_MUL:
        if ((a.kind == SHOAL_CT_STR || a.kind == SHOAL_CT_LIST) && shoal_ct_is_intlike(b))
            return repeat(c, a, shoal_ct_as_int(b), out);
        if ((b.kind == SHOAL_CT_STR || b.kind == SHOAL_CT_LIST) && shoal_ct_is_intlike(a))
            return repeat(c, b, shoal_ct_as_int(a), out);
        return arith(c, op, a, b, out);
    case SHOAL_CT_OP_MOD:
        if (a.kind == SHOAL_CT_STR)
            return shoal_ct_fail(c, SHOAL_EUNSUPPORTED, "'%%' string formatting is "
                                 "not supported; use '~' or '+'");
        return arith(c, op, a, b, out);
    case SHOAL_CT_OP_SUB:
    case SHOAL_CT_OP_DIV:
    case SHOAL_CT_OP_FLOORDIV:
    case SHOAL_CT_OP_POW:
        return arith(c, op, a, b, out);
    case SHOAL_CT_OP_CONCAT: {
        struct shoal_ct_str x, y;
        if ((rc = shoal_ct_to_str(c, a, &x)) || (rc = shoal_ct_to_str(c, b, &y)))
            return rc;
        return concat_str(c, x, y, out);
    }
    case SHOAL_CT_OP_EQ:
    case SHOAL_CT_OP_NE:
        r = shoal_ct_equal(a, b, 0);
        *out = shoal_ct_bool(op == SHOAL_CT_OP_EQ ? r : !r);
        return 0;
    case SHOAL_CT_OP_LT:
    case SHOAL_CT_OP_LE:
    case SHOAL_CT_OP_GT:
    case SHOAL_CT_OP_GE:
        if ((rc = compare(c, a, b, op_text(op), 0, &r)))
            return rc;
        *out = shoal_ct_bool(op == SHOAL_CT_OP_LT ? r < 0 : op == SHOAL_CT_OP_LE ? r <= 0
                             : op == SHOAL_CT_OP_GT ? r > 0 : r >= 0);
        return 0;
    case SHOAL_CT_OP_IN:
    case SHOAL_CT_OP_NOTIN:
        if ((rc = contains(c, a, b, &r)))
            return rc;
        *out = shoal_ct_bool(op == SHOAL_CT_OP_IN ? r : !r);
        return 0;
    default:
        return shoal_ct_fail(c, SHOAL_EINVAL, "unknown operator %d", op);
    }
}

/* ---- expressions ------------------------------------------------------- */

static int eval(struct shoal_ct_ctx *c, struct shoal_ct_scope *sc,
                const struct shoal_ct_node *n, struct shoal_ct_val *out);
static int exec(struct shoal_ct_ctx *c, struct shoal_ct_scope *sc,
                const struct shoal_ct_node *n);

static struct shoal_ct_val *scope_find(struct shoal_ct_scope *sc,
                                       struct shoal_ct_str name)
{
    for (; sc; sc = sc->parent) {
        struct shoal_ct_val *v = shoal_ct_dict_get(&sc->vars, name);
        if (v)
            return v;
    }
    return NULL;
}

static struct shoal_ct_scope *scope_new(struct shoal_ct_ctx *c,
                                        struct shoal_ct_scope *parent)
{
    struct shoal_ct_scope *sc = shoal_ct_alloc(c, 1, sizeof *sc);
    if (sc)
        sc->parent = parent;
    return sc;
}

/* Count a step and a frame; every eval/exec goes through here. */
static int enter(struct shoal_ct_ctx *c, const struct shoal_ct_node *n)
{
    c->line = n->line;
    if (++c->steps > c->max_steps)
        return shoal_ct_fail(c, SHOAL_ERANGE, "template took more than %" PRIu64
                             " evaluation steps (runaway loop?)", c->max_steps);
    if (++c->depth > SHOAL_CHAT_TEMPLATE_MAX_DEPTH)
        return shoal_ct_fail(c, SHOAL_ERANGE, "template nested deeper than %d "
                             "frames (runaway recursion?)",
                             SHOAL_CHAT_TEMPLATE_MAX_DEPTH);
    return 0;
}

static int eval_args(struct shoal_ct_ctx *c, struct shoal_ct_scope *sc,
                     const struct shoal_ct_node *n, struct shoal_ct_args *a)
{
    memset(a, 0, sizeof *a);
    if (!n->n_args)
        return 0;
    a->pos = shoal_ct_alloc(c, n->n_args, sizeof *a->pos);
    a->kw = shoal_ct_alloc(c, n->n_args, sizeof *a->kw);
    a->kw_names = shoal_ct_alloc(c, n->n_args, sizeof *a->kw_names);
    if (!a->pos || !a->kw || !a->kw_names)
        return c->rc;
    for (size_t k = 0; k < n->n_args; k++) {
        int named = n->arg_names && n->arg_names[k].n;
        struct shoal_ct_val *slot = named ? &a->kw[a->n_kw] : &a->pos[a->n_pos];
        int rc = eval(c, sc, n->args[k], slot);
        if (rc)
            return rc;
        if (named)
            a->kw_names[a->n_kw++] = n->arg_names[k];
        else
            a->n_pos++;
    }
    c->line = n->line;
    return 0;
}

/* Call a template macro: arguments bind to parameters (missing ones take
 * their default or stay undefined); the body's output is the result. */
static int call_macro(struct shoal_ct_ctx *c, const struct shoal_ct_node *m,
                      const struct shoal_ct_args *a, struct shoal_ct_val *out)
{
    if (a->n_pos > m->n_args)
        return shoal_ct_fail(c, SHOAL_EINVAL, "macro '%.*s' takes %zu arguments, "
                             "got %zu", (int)m->name.n, m->name.p, m->n_args, a->n_pos);
    struct shoal_ct_scope *ms = scope_new(c, c->root);
    if (!ms)
        return c->rc;
    for (size_t k = 0; k < a->n_kw; k++) {
        size_t p = 0;
        while (p < m->n_args && !shoal_ct_str_eq(m->arg_names[p], a->kw_names[k]))
            p++;
        if (p == m->n_args)
            return shoal_ct_fail(c, SHOAL_EINVAL, "macro '%.*s' has no parameter "
                                 "'%.*s'", (int)m->name.n, m->name.p,
                                 (int)a->kw_names[k].n, a->kw_names[k].p);
    }
    int rc;
    for (size_t p = 0; p < m->n_args; p++) {
        struct shoal_ct_val v = shoal_ct_undef();
        int set = 0;
        if (p < a->n_pos) {
            v = a->pos[p];
            set = 1;
        }
        for (size_t k = 0; k < a->n_kw && !set; k++)
            if (shoal_ct_str_eq(m->arg_names[p], a->kw_names[k])) {
                v = a->kw[k];
                set = 1;
            }
        if (!set && m->args[p] && (rc = eval(c, ms, m->args[p], &v)))
            return rc;
        if ((rc = shoal_ct_dict_set(c, &ms->vars, m->arg_names[p], v)))
            return rc;
    }
    struct shoal_ct_buf b = {0}, *saved = c->out;
    c->out = &b;
    rc = exec(c, ms, m->c);
    c->out = saved;
    if (rc < 0) {
        free(b.p);
        return rc;
    }
    *out = shoal_ct_str_val("", 0);
    return shoal_ct_buf_finish(c, &b, &out->u.s);
}

static int eval_call(struct shoal_ct_ctx *c, struct shoal_ct_scope *sc,
                     const struct shoal_ct_node *n, struct shoal_ct_val *out)
{
    const struct shoal_ct_node *callee = n->a;
    struct shoal_ct_args a;
    struct shoal_ct_val f;
    int rc;
    if (callee->kind == SHOAL_CT_N_ATTR) { /* obj.method(...) */
        struct shoal_ct_val obj;
        if ((rc = eval(c, sc, callee->a, &obj)) || (rc = eval_args(c, sc, n, &a)))
            return rc;
        if (obj.kind == SHOAL_CT_DICT || obj.kind == SHOAL_CT_NS) {
            struct shoal_ct_val *field = shoal_ct_dict_get(obj.u.d, callee->name);
            if (field && field->kind == SHOAL_CT_MACRO)
                return call_macro(c, field->u.macro, &a, out);
        }
        return shoal_ct_method(c, obj, callee->name, &a, out);
    }
    if (callee->kind == SHOAL_CT_N_NAME) {
        struct shoal_ct_val *found = scope_find(sc, callee->name);
        if (!found) {
            if ((rc = eval_args(c, sc, n, &a)))
                return rc;
            return shoal_ct_global(c, callee->name, &a, out);
        }
        f = *found;
    } else if ((rc = eval(c, sc, callee, &f))) {
        return rc;
    }
    if (f.kind == SHOAL_CT_FUNC) {
        if ((rc = eval_args(c, sc, n, &a)))
            return rc;
        return shoal_ct_global(c, shoal_ct_cstr(f.u.func), &a, out);
    }
    if (f.kind != SHOAL_CT_MACRO)
        return shoal_ct_fail(c, SHOAL_EINVAL, "a %s is not callable",
                             shoal_ct_kind_name(f.kind));
    if ((rc = eval_args(c, sc, n, &a)))
        return rc;
    return call_macro(c, f.u.macro, &a, out);
}

static int eval_node(struct shoal_ct_ctx *c, struct shoal_ct_scope *sc,
                     const struct shoal_ct_node *n, struct shoal_ct_val *out)
{
    struct shoal_ct_val a, b, s;
    struct shoal_ct_args args;
    int rc;
    *out = shoal_ct_undef();
    switch (n->kind) {
    case SHOAL_CT_N_LIT:
        *out = n->lit;
        return 0;
    case SHOAL_CT_N_NAME: {
        struct shoal_ct_val *v = scope_find(sc, n->name);
        *out = v ? *v : shoal_ct_global_lookup(n->name);
        return 0;
    }
    case SHOAL_CT_N_LIST: {
        struct shoal_ct_list *l = shoal_ct_list_new(c, n->n_args);
        if (!l)
            return c->rc;
        for (size_t k = 0; k < n->n_args; k++)
            if ((rc = eval(c, sc, n->args[k], &l->items[k])))
                return rc;
        *out = shoal_ct_list_val(l);
        return 0;
    }
    case SHOAL_CT_N_DICT: {
        struct shoal_ct_dict *d = shoal_ct_dict_new(c, n->n_args / 2);
        if (!d)
            return c->rc;
        for (size_t k = 0; k + 1 < n->n_args; k += 2) {
            if ((rc = eval(c, sc, n->args[k], &a)) ||
                (rc = eval(c, sc, n->args[k + 1], &b)))
                return rc;
            c->line = n->line;
            if ((rc = shoal_ct_dict_put(c, d, a, b)))
                return rc;
        }
        *out = shoal_ct_dict_val(d);
        return 0;
    }
    case SHOAL_CT_N_ATTR:
        if ((rc = eval(c, sc, n->a, &a)))
            return rc;
        *out = shoal_ct_get_attr(a, n->name);
        return 0;
    case SHOAL_CT_N_INDEX:
        if ((rc = eval(c, sc, n->a, &a)) || (rc = eval(c, sc, n->b, &b)))
            return rc;
        return get_item(c, a, b, out);
    case SHOAL_CT_N_SLICE: {
        struct shoal_ct_val lo = shoal_ct_none(), hi = shoal_ct_none(),
                            st = shoal_ct_none();
        if ((rc = eval(c, sc, n->a, &a)) ||
            (n->b && (rc = eval(c, sc, n->b, &lo))) ||
            (n->c && (rc = eval(c, sc, n->c, &hi))) ||
            (n->d && (rc = eval(c, sc, n->d, &st))))
            return rc;
        c->line = n->line;
        return do_slice(c, a, lo, hi, st, out);
    }
    case SHOAL_CT_N_CALL:
        return eval_call(c, sc, n, out);
    case SHOAL_CT_N_FILTER:
        if ((rc = eval(c, sc, n->a, &a)) || (rc = eval_args(c, sc, n, &args)))
            return rc;
        c->line = n->line;
        return shoal_ct_filter(c, n->name, a, &args, out);
    case SHOAL_CT_N_TEST: {
        int r;
        if ((rc = eval(c, sc, n->a, &a)) || (rc = eval_args(c, sc, n, &args)))
            return rc;
        c->line = n->line;
        if ((rc = shoal_ct_test(c, n->name, a, args.pos, args.n_pos, &r)))
            return rc;
        *out = shoal_ct_bool(n->op ? !r : r);
        return 0;
    }
    case SHOAL_CT_N_UNARY:
        if ((rc = eval(c, sc, n->a, &a)))
            return rc;
        c->line = n->line;
        if (n->op == SHOAL_CT_OP_NOT) {
            *out = shoal_ct_bool(!shoal_ct_truthy(a));
            return 0;
        }
        if (!shoal_ct_is_number(a))
            return shoal_ct_fail(c, SHOAL_EINVAL, "bad operand type for unary %s: %s",
                                 n->op == SHOAL_CT_OP_NEG ? "-" : "+",
                                 shoal_ct_kind_name(a.kind));
        if (n->op == SHOAL_CT_OP_POS)
            *out = a.kind == SHOAL_CT_BOOL ? shoal_ct_int(a.u.b) : a;
        else if (a.kind == SHOAL_CT_FLOAT)
            *out = shoal_ct_float(-a.u.f);
        else if (shoal_ct_as_int(a) == INT64_MIN)
            return shoal_ct_fail(c, SHOAL_ERANGE, "integer overflow negating %" PRId64,
                                 shoal_ct_as_int(a));
        else
            *out = shoal_ct_int(-shoal_ct_as_int(a));
        return 0;
    case SHOAL_CT_N_BINARY:
        if ((rc = eval(c, sc, n->a, &a)) || (rc = eval(c, sc, n->b, &b)))
            return rc;
        c->line = n->line;
        return binop(c, n->op, a, b, out);
    case SHOAL_CT_N_AND:
    case SHOAL_CT_N_OR:
        /* Python semantics: the result is one of the operands. */
        if ((rc = eval(c, sc, n->a, &a)))
            return rc;
        if (shoal_ct_truthy(a) == (n->kind == SHOAL_CT_N_OR)) {
            *out = a;
            return 0;
        }
        return eval(c, sc, n->b, out);
    case SHOAL_CT_N_COND:
        if ((rc = eval(c, sc, n->b, &s)))
            return rc;
        if (shoal_ct_truthy(s))
            return eval(c, sc, n->a, out);
        return n->c ? eval(c, sc, n->c, out) : 0;
    default:
        return shoal_ct_fail(c, SHOAL_EINVAL, "node kind %d is not an expression",
                             (int)n->kind);
    }
}

static int eval(struct shoal_ct_ctx *c, struct shoal_ct_scope *sc,
                const struct shoal_ct_node *n, struct shoal_ct_val *out)
{
    int rc = enter(c, n);
    if (!rc)
        rc = eval_node(c, sc, n, out);
    c->depth--;
    return rc;
}

/* ---- statements -------------------------------------------------------- */

/* Bind for/set targets: one name takes v; several unpack a list of as many. */
static int bind_targets(struct shoal_ct_ctx *c, struct shoal_ct_scope *sc,
                        const struct shoal_ct_node *n, struct shoal_ct_val v)
{
    if (n->n_args == 1)
        return shoal_ct_dict_set(c, &sc->vars, n->args[0]->name, v);
    if (v.kind != SHOAL_CT_LIST || v.u.l->n != n->n_args)
        return shoal_ct_fail(c, SHOAL_EINVAL, "cannot unpack a %s into %zu names",
                             v.kind == SHOAL_CT_LIST ? "list of another length"
                                                     : shoal_ct_kind_name(v.kind),
                             n->n_args);
    for (size_t k = 0; k < n->n_args; k++) {
        int rc = shoal_ct_dict_set(c, &sc->vars, n->args[k]->name, v.u.l->items[k]);
        if (rc)
            return rc;
    }
    return 0;
}

static int exec_for(struct shoal_ct_ctx *c, struct shoal_ct_scope *sc,
                    const struct shoal_ct_node *n)
{
    struct shoal_ct_val seq;
    const struct shoal_ct_list *items;
    int rc;
    if ((rc = eval(c, sc, n->a, &seq)))
        return rc;
    c->line = n->line;
    if ((rc = shoal_ct_iterate(c, seq, &items)))
        return rc;
    /* One frame for the whole loop, emptied at each iteration: a `set` in
     * the body does not survive to the next iteration, as in jinja2. */
    struct shoal_ct_scope *it = scope_new(c, sc);
    if (!it)
        return c->rc;
    if (n->b) { /* for x in xs if cond: filter first, so loop.length fits */
        struct shoal_ct_list *kept = shoal_ct_list_new(c, items->n);
        if (!kept)
            return c->rc;
        size_t k_out = 0;
        for (size_t k = 0; k < items->n; k++) {
            struct shoal_ct_val keep;
            it->vars.n = 0;
            if ((rc = bind_targets(c, it, n, items->items[k])) ||
                (rc = eval(c, it, n->b, &keep)))
                return rc;
            if (shoal_ct_truthy(keep))
                kept->items[k_out++] = items->items[k];
        }
        kept->n = k_out;
        items = kept;
    }
    if (items->n == 0) {
        if (!n->d)
            return 0;
        it->vars.n = 0;
        return exec(c, it, n->d);
    }
    struct shoal_ct_loop *loop = shoal_ct_alloc(c, 1, sizeof *loop);
    if (!loop)
        return c->rc;
    loop->length = (int64_t)items->n;
    loop->items = items;
    struct shoal_ct_val loop_val = {.kind = SHOAL_CT_LOOP, .u.loop = loop};
    for (size_t k = 0; k < items->n; k++) {
        if (++c->steps > c->max_steps)
            return shoal_ct_fail(c, SHOAL_ERANGE, "template took more than %" PRIu64
                                 " evaluation steps (runaway loop?)", c->max_steps);
        loop->index0 = (int64_t)k;
        it->vars.n = 0;
        if ((rc = bind_targets(c, it, n, items->items[k])) ||
            (rc = shoal_ct_dict_set(c, &it->vars, shoal_ct_cstr("loop"), loop_val)))
            return rc;
        rc = exec(c, it, n->c);
        if (rc == SIG_BREAK)
            break;
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int exec_node(struct shoal_ct_ctx *c, struct shoal_ct_scope *sc,
                     const struct shoal_ct_node *n)
{
    struct shoal_ct_val v;
    int rc;
    switch (n->kind) {
    case SHOAL_CT_N_BODY:
        for (size_t k = 0; k < n->n_args; k++)
            if ((rc = exec(c, sc, n->args[k])))
                return rc; /* an error, or break/continue on its way out */
        return 0;
    case SHOAL_CT_N_TEXT:
        return shoal_ct_buf_put(c, c->out, n->lit.u.s.p, n->lit.u.s.n);
    case SHOAL_CT_N_OUTPUT:
        if ((rc = eval(c, sc, n->a, &v)))
            return rc;
        return shoal_ct_write_str(c, c->out, v, 0);
    case SHOAL_CT_N_IF:
        if ((rc = eval(c, sc, n->a, &v)))
            return rc;
        if (shoal_ct_truthy(v))
            return exec(c, sc, n->b);
        return n->c ? exec(c, sc, n->c) : 0;
    case SHOAL_CT_N_FOR:
        return exec_for(c, sc, n);
    case SHOAL_CT_N_SET:
        if ((rc = eval(c, sc, n->a, &v)))
            return rc;
        c->line = n->line;
        return bind_targets(c, sc, n, v);
    case SHOAL_CT_N_SET_ATTR: {
        struct shoal_ct_val *ns = scope_find(sc, n->name);
        if (!ns || ns->kind != SHOAL_CT_NS)
            return shoal_ct_fail(c, SHOAL_EINVAL, "cannot set '%.*s.%.*s': "
                                 "attributes can only be set on a namespace(), "
                                 "'%.*s' is a %s", (int)n->name.n, n->name.p,
                                 (int)n->name2.n, n->name2.p, (int)n->name.n,
                                 n->name.p,
                                 shoal_ct_kind_name(ns ? ns->kind : SHOAL_CT_UNDEF));
        struct shoal_ct_dict *d = ns->u.d;
        if ((rc = eval(c, sc, n->a, &v)))
            return rc;
        return shoal_ct_dict_set(c, d, n->name2, v);
    }
    case SHOAL_CT_N_SET_BLOCK: {
        struct shoal_ct_buf b = {0}, *saved = c->out;
        c->out = &b;
        rc = exec(c, sc, n->c);
        c->out = saved;
        if (rc < 0) {
            free(b.p);
            return rc;
        }
        v = shoal_ct_str_val("", 0);
        if ((rc = shoal_ct_buf_finish(c, &b, &v.u.s)))
            return rc;
        return shoal_ct_dict_set(c, &sc->vars, n->name, v);
    }
    case SHOAL_CT_N_MACRO:
        v.kind = SHOAL_CT_MACRO;
        v.u.macro = n;
        return shoal_ct_dict_set(c, &sc->vars, n->name, v);
    case SHOAL_CT_N_BREAK:
        return SIG_BREAK;
    case SHOAL_CT_N_CONTINUE:
        return SIG_CONTINUE;
    default:
        return shoal_ct_fail(c, SHOAL_EINVAL, "node kind %d is not a statement",
                             (int)n->kind);
    }
}

static int exec(struct shoal_ct_ctx *c, struct shoal_ct_scope *sc,
                const struct shoal_ct_node *n)
{
    int rc = enter(c, n);
    if (!rc)
        rc = exec_node(c, sc, n);
    c->depth--;
    return rc;
}

/* ---- rendering --------------------------------------------------------- */

static int from_json(struct shoal_ct_ctx *c, json_t *j, struct shoal_ct_val *out)
{
    int rc;
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        struct shoal_ct_dict *d = shoal_ct_dict_new(c, json_object_size(j));
        const char *key;
        json_t *v;
        if (!d)
            return c->rc;
        json_object_foreach(j, key, v) {
            struct shoal_ct_val item;
            size_t kn = strlen(key);
            char *k = shoal_ct_alloc(c, kn + 1, 1);
            if (!k)
                return c->rc;
            memcpy(k, key, kn);
            if ((rc = from_json(c, v, &item)) ||
                (rc = shoal_ct_dict_set(c, d, (struct shoal_ct_str){k, kn}, item)))
                return rc;
        }
        *out = shoal_ct_dict_val(d);
        return 0;
    }
    case JSON_ARRAY: {
        struct shoal_ct_list *l = shoal_ct_list_new(c, json_array_size(j));
        if (!l)
            return c->rc;
        for (size_t k = 0; k < l->n; k++)
            if ((rc = from_json(c, json_array_get(j, k), &l->items[k])))
                return rc;
        *out = shoal_ct_list_val(l);
        return 0;
    }
    case JSON_STRING: {
        size_t n = json_string_length(j);
        char *p = shoal_ct_alloc(c, n + 1, 1);
        if (!p)
            return c->rc;
        memcpy(p, json_string_value(j), n);
        *out = shoal_ct_str_val(p, n);
        return 0;
    }
    case JSON_INTEGER: *out = shoal_ct_int(json_integer_value(j)); return 0;
    case JSON_REAL:    *out = shoal_ct_float(json_real_value(j)); return 0;
    case JSON_TRUE:    *out = shoal_ct_bool(1); return 0;
    case JSON_FALSE:   *out = shoal_ct_bool(0); return 0;
    default:           *out = shoal_ct_none(); return 0;
    }
}

static int set_global(struct shoal_ct_ctx *c, const char *name, struct shoal_ct_val v)
{
    return shoal_ct_dict_set(c, &c->root->vars, shoal_ct_cstr(name), v);
}

/* The `messages` variable from a JSON array of message objects (each with a
 * string "role"; every other member kept as the template sees it). */
static int messages_from_json(struct shoal_ct_ctx *c, const char *text,
                              struct shoal_ct_val *out)
{
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    const char *why = !j ? jerr.text : !json_is_array(j) ? "not an array" : NULL;
    for (size_t k = 0; !why && k < json_array_size(j); k++) {
        json_t *m = json_array_get(j, k);
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role"))) {
            c->rc = shoal_err_set(c->err, SHOAL_EFORMAT, "chat template messages: "
                                  "message %zu of %zu is not an object with a "
                                  "string \"role\"", k, json_array_size(j));
            json_decref(j);
            return c->rc;
        }
    }
    if (why) {
        json_decref(j);
        c->rc = shoal_err_set(c->err, SHOAL_EFORMAT, "chat template messages: "
                              "expected a JSON array of message objects: %s", why);
        return c->rc;
    }
    int rc = from_json(c, j, out);
    json_decref(j);
    return rc;
}

/* messages, bos/eos, add_generation_prompt, tools/documents, extra_json. */
static int set_globals(struct shoal_ct_ctx *c, const struct shoal_chat_message *msgs,
                       size_t n_msgs, const struct shoal_chat_template_vars *vars)
{
    int rc;
    if (vars && vars->messages_json) {
        if (n_msgs)
            return shoal_ct_fail(c, SHOAL_EINVAL, "chat template render: both "
                                 "messages_json and %zu messages given", n_msgs);
        struct shoal_ct_val mv;
        if ((rc = messages_from_json(c, vars->messages_json, &mv)) ||
            (rc = set_global(c, "messages", mv)))
            return rc;
    }
    struct shoal_ct_list *l = shoal_ct_list_new(c, n_msgs);
    if (!l)
        return c->rc;
    for (size_t k = 0; k < n_msgs; k++) {
        if (!msgs[k].role)
            return shoal_ct_fail(c, SHOAL_EINVAL, "message %zu of %zu has no role "
                                 "(role is NULL)", k, n_msgs);
        struct shoal_ct_dict *d = shoal_ct_dict_new(c, 2);
        if (!d)
            return c->rc;
        struct shoal_ct_val content = msgs[k].content
            ? shoal_ct_str_val(msgs[k].content, strlen(msgs[k].content))
            : shoal_ct_none();
        if ((rc = shoal_ct_dict_set(c, d, shoal_ct_cstr("role"), shoal_ct_str_val(
                 msgs[k].role, strlen(msgs[k].role)))) ||
            (rc = shoal_ct_dict_set(c, d, shoal_ct_cstr("content"), content)))
            return rc;
        l->items[k] = shoal_ct_dict_val(d);
    }
    if ((!(vars && vars->messages_json) &&
         (rc = set_global(c, "messages", shoal_ct_list_val(l)))) ||
        (rc = set_global(c, "add_generation_prompt",
                         shoal_ct_bool(vars && vars->add_generation_prompt))) ||
        (rc = set_global(c, "tools", shoal_ct_none())) ||
        (rc = set_global(c, "documents", shoal_ct_none())))
        return rc;
    if (vars && vars->bos_token &&
        (rc = set_global(c, "bos_token", shoal_ct_str_val(vars->bos_token,
                                                          strlen(vars->bos_token)))))
        return rc;
    if (vars && vars->eos_token &&
        (rc = set_global(c, "eos_token", shoal_ct_str_val(vars->eos_token,
                                                          strlen(vars->eos_token)))))
        return rc;
    if (vars && vars->extra_json) {
        json_error_t jerr;
        json_t *j = json_loads(vars->extra_json, 0, &jerr);
        if (!j || !json_is_object(j)) {
            json_decref(j);
            c->rc = shoal_err_set(c->err, SHOAL_EFORMAT, "chat template extra_json "
                                  "is not a JSON object%s%s", j ? "" : ": ",
                                  j ? "" : jerr.text);
            return c->rc;
        }
        struct shoal_ct_val v;
        rc = from_json(c, j, &v);
        json_decref(j);
        if (rc)
            return rc;
        for (size_t k = 0; k < v.u.d->n; k++)
            if ((rc = shoal_ct_dict_put(c, &c->root->vars, v.u.d->keys[k],
                                        v.u.d->vals[k])))
                return rc;
    }
    return 0;
}

int shoal_chat_template_render(const struct shoal_chat_template *t,
                               const struct shoal_chat_message *msgs,
                               size_t n_msgs,
                               const struct shoal_chat_template_vars *vars,
                               char **out, struct shoal_err *err)
{
    if (!t || !out || (n_msgs && !msgs))
        return shoal_err_set(err, SHOAL_EINVAL, "chat template render: template, "
                             "out and messages must not be NULL (n_msgs=%zu)", n_msgs);
    struct shoal_ct_buf text = {0};
    struct shoal_ct_ctx c = {
        .arena = {.cap = SHOAL_CHAT_TEMPLATE_MAX_MEMORY},
        .out = &text,
        .max_steps = vars && vars->max_steps ? vars->max_steps
                                             : SHOAL_CHAT_TEMPLATE_MAX_STEPS,
        .max_output = vars && vars->max_output_bytes ? vars->max_output_bytes
                                                     : SHOAL_CHAT_TEMPLATE_MAX_OUTPUT,
        .err = err,
    };
    int rc;
    if (!(c.root = scope_new(&c, NULL)) || (rc = set_globals(&c, msgs, n_msgs, vars))) {
        rc = c.rc;
        goto fail;
    }
    rc = exec(&c, c.root, t->root);
    if (rc < 0)
        goto fail;
    if (!text.p && !(text.p = malloc(1))) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "chat template: out of memory");
        goto fail;
    }
    text.p[text.n] = '\0'; /* buf_put keeps room for it */
    shoal_ct_arena_release(&c.arena);
    *out = text.p;
    return 0;
fail:
    free(text.p);
    shoal_ct_arena_release(&c.arena);
    return rc < 0 ? rc : SHOAL_EINVAL;
}
