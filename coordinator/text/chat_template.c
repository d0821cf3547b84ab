/* chat_template: arena, parser, shoal_chat_template_parse/free and
 * tokenizer_config loading. The lexer is in chat_template_lex.c, the
 * evaluator in chat_template_eval.c and its builtins in
 * chat_template_builtins.c; chat_template_impl.h holds what they share. */
#include "chat_template.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_impl.h"
#include "gguf.h"
#include "util.h"

/* ---- arena ------------------------------------------------------------ */

#define ARENA_CHUNK (64u << 10) /* bytes; larger requests get their own chunk */

struct shoal_ct_chunk {
    struct shoal_ct_chunk *next;
    size_t size, used;          /* bytes in data / handed out */
    max_align_t data[];
};

void *shoal_ct_arena_alloc(struct shoal_ct_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    if (n > a->cap || a->used > a->cap - n)
        return NULL;
    struct shoal_ct_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > ARENA_CHUNK ? n : ARENA_CHUNK;
        c = malloc(sizeof *c + size);
        if (!c)
            return NULL;
        c->size = size;
        c->used = 0;
        /* Keep the partly used chunk in front when a big request gets its
         * own chunk, so small allocations keep filling it. */
        if (a->head && size > ARENA_CHUNK) {
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

void shoal_ct_arena_release(struct shoal_ct_arena *a)
{
    struct shoal_ct_chunk *c = a->head;
    while (c) {
        struct shoal_ct_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- parser ----------------------------------------------------------- *
 * Recursive descent over the token array, with jinja2's precedence (lowest
 * first): `a if c else b`, or, and, not, comparisons/in, + -, ~, * / // %,
 * **, unary - +, then postfix (. [] ()) and filters/tests (| is). */

#define MAX_PARSE_DEPTH 200 /* nested expressions/blocks, protects the C stack */

struct parser {
    const struct shoal_ct_token *toks;
    size_t i;
    struct shoal_ct_arena *arena;
    struct shoal_err *err;
    int depth;               /* current recursion depth */
    int loop_depth;          /* enclosing for-loops (for break/continue) */
};

static const struct shoal_ct_token *cur(const struct parser *ps) { return &ps->toks[ps->i]; }

static int tok_is_name(const struct shoal_ct_token *t, const char *name)
{
    return t->kind == SHOAL_CT_TK_NAME && t->s.n == strlen(name) &&
           memcmp(t->s.p, name, t->s.n) == 0;
}

static int tok_is_op(const struct shoal_ct_token *t, int op)
{
    return t->kind == SHOAL_CT_TK_OP && t->op == op;
}

static const char *tok_desc(const struct shoal_ct_token *t, char *buf, size_t cap)
{
    switch (t->kind) {
    case SHOAL_CT_TK_EOF:         return "end of template";
    case SHOAL_CT_TK_DATA:        return "template text";
    case SHOAL_CT_TK_VAR_BEGIN:   return "'{{'";
    case SHOAL_CT_TK_VAR_END:     return "'}}'";
    case SHOAL_CT_TK_BLOCK_BEGIN: return "'{%'";
    case SHOAL_CT_TK_BLOCK_END:   return "'%}'";
    case SHOAL_CT_TK_STRING:      return "a string";
    case SHOAL_CT_TK_INT:
    case SHOAL_CT_TK_FLOAT:       return "a number";
    case SHOAL_CT_TK_NAME:
        snprintf(buf, cap, "'%.*s'", (int)(t->s.n > 40 ? 40 : t->s.n), t->s.p);
        return buf;
    case SHOAL_CT_TK_OP:
        switch (t->op) {
        case SHOAL_CT_P_POW:      return "'**'";
        case SHOAL_CT_P_FLOORDIV: return "'//'";
        case SHOAL_CT_P_EQ:       return "'=='";
        case SHOAL_CT_P_NE:       return "'!='";
        case SHOAL_CT_P_LE:       return "'<='";
        case SHOAL_CT_P_GE:       return "'>='";
        default:
            snprintf(buf, cap, "'%c'", t->op);
            return buf;
        }
    }
    return "?";
}

static void *perror_at(struct parser *ps, const struct shoal_ct_token *t,
                       const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void *perror_at(struct parser *ps, const struct shoal_ct_token *t,
                       const char *fmt, ...)
{
    char msg[SHOAL_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    shoal_ct_syntax_error(ps->err, t->line, t->col, "%s", msg);
    return NULL;
}

static void *unexpected(struct parser *ps, const char *expected)
{
    char buf[64];
    return perror_at(ps, cur(ps), "expected %s, found %s", expected,
                     tok_desc(cur(ps), buf, sizeof buf));
}

static struct shoal_ct_node *new_node(struct parser *ps,
                                      enum shoal_ct_node_kind kind, int line)
{
    struct shoal_ct_node *n = shoal_ct_arena_alloc(ps->arena, sizeof *n);
    if (!n) {
        shoal_err_set(ps->err, SHOAL_ENOMEM, "chat template: out of memory parsing");
        return NULL;
    }
    n->kind = kind;
    n->line = line;
    return n;
}

static int expect_op(struct parser *ps, int op, const char *what)
{
    if (!tok_is_op(cur(ps), op)) {
        unexpected(ps, what);
        return -1;
    }
    ps->i++;
    return 0;
}

/* A growable list of child nodes (and keyword names) while parsing. */
struct nvec {
    struct shoal_ct_node **v;
    struct shoal_ct_str *names;
    size_t n, cap;
    int any_name;
};

static void nvec_push(struct nvec *vec, struct shoal_ct_node *node,
                      struct shoal_ct_str name)
{
    if (vec->n == vec->cap) {
        vec->cap = vec->cap ? 2 * vec->cap : 8;
        vec->v = shoal_xrealloc(vec->v, vec->cap * sizeof *vec->v);
        vec->names = shoal_xrealloc(vec->names, vec->cap * sizeof *vec->names);
    }
    vec->v[vec->n] = node;
    vec->names[vec->n] = name;
    if (name.n)
        vec->any_name = 1;
    vec->n++;
}

static void nvec_free(struct nvec *vec)
{
    free(vec->v);
    free(vec->names);
}

/* Move vec into node->args (and arg_names) in the arena; frees vec. */
static int nvec_finish(struct parser *ps, struct nvec *vec,
                       struct shoal_ct_node *node)
{
    int rc = 0;
    node->n_args = vec->n;
    if (vec->n) {
        node->args = shoal_ct_arena_alloc(ps->arena, vec->n * sizeof *node->args);
        if (vec->any_name)
            node->arg_names = shoal_ct_arena_alloc(ps->arena,
                                                   vec->n * sizeof *node->arg_names);
        if (!node->args || (vec->any_name && !node->arg_names)) {
            rc = shoal_err_set(ps->err, SHOAL_ENOMEM,
                               "chat template: out of memory parsing");
        } else {
            memcpy(node->args, vec->v, vec->n * sizeof *node->args);
            if (vec->any_name)
                memcpy(node->arg_names, vec->names, vec->n * sizeof *node->arg_names);
        }
    }
    nvec_free(vec);
    return rc;
}

static struct shoal_ct_node *parse_expr(struct parser *ps, int with_cond);
static struct shoal_ct_node *parse_or(struct parser *ps);
static struct shoal_ct_node *parse_unary(struct parser *ps, int with_filter);

static const struct shoal_ct_str no_name;

/* '(' [arg {',' arg}] ')' with arg = NAME '=' expr | expr; '(' already seen. */
static int parse_call_args(struct parser *ps, struct shoal_ct_node *node)
{
    struct nvec vec = {0};
    ps->i++; /* ( */
    while (!tok_is_op(cur(ps), ')')) {
        struct shoal_ct_str kw = no_name;
        if (cur(ps)->kind == SHOAL_CT_TK_NAME && tok_is_op(&ps->toks[ps->i + 1], '=')) {
            kw = cur(ps)->s;
            ps->i += 2;
        } else if (vec.any_name) {
            nvec_free(&vec);
            perror_at(ps, cur(ps), "positional argument follows keyword argument");
            return -1;
        }
        struct shoal_ct_node *arg = parse_expr(ps, 1);
        if (!arg) {
            nvec_free(&vec);
            return -1;
        }
        nvec_push(&vec, arg, kw);
        if (tok_is_op(cur(ps), ','))
            ps->i++;
        else if (!tok_is_op(cur(ps), ')')) {
            nvec_free(&vec);
            unexpected(ps, "',' or ')' in argument list");
            return -1;
        }
    }
    ps->i++; /* ) */
    return nvec_finish(ps, &vec, node);
}

/* Comma-separated expressions up to `close` (already past the opener).
 * For dicts, pairs: key ':' value. */
static struct shoal_ct_node *parse_sequence(struct parser *ps,
                                            enum shoal_ct_node_kind kind,
                                            int close, int line)
{
    struct shoal_ct_node *node = new_node(ps, kind, line);
    if (!node)
        return NULL;
    struct nvec vec = {0};
    while (!tok_is_op(cur(ps), close)) {
        struct shoal_ct_node *e = parse_expr(ps, 1);
        if (!e)
            goto fail;
        nvec_push(&vec, e, no_name);
        if (kind == SHOAL_CT_N_DICT) {
            if (expect_op(ps, ':', "':' after a dict key"))
                goto fail;
            if (!(e = parse_expr(ps, 1)))
                goto fail;
            nvec_push(&vec, e, no_name);
        }
        if (tok_is_op(cur(ps), ','))
            ps->i++;
        else if (!tok_is_op(cur(ps), close)) {
            unexpected(ps, close == ']' ? "',' or ']'" : close == '}' ? "',' or '}'"
                                                                     : "',' or ')'");
            goto fail;
        }
    }
    ps->i++;
    return nvec_finish(ps, &vec, node) ? NULL : node;
fail:
    nvec_free(&vec);
    return NULL;
}

static struct shoal_ct_node *lit_node(struct parser *ps, int line,
                                      struct shoal_ct_val v)
{
    struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_LIT, line);
    if (n)
        n->lit = v;
    return n;
}

static struct shoal_ct_node *parse_primary(struct parser *ps)
{
    const struct shoal_ct_token *t = cur(ps);
    struct shoal_ct_val v = {0};
    switch (t->kind) {
    case SHOAL_CT_TK_NAME:
        ps->i++;
        if (tok_is_name(t, "true") || tok_is_name(t, "True") ||
            tok_is_name(t, "false") || tok_is_name(t, "False")) {
            v.kind = SHOAL_CT_BOOL;
            v.u.b = t->s.p[0] == 't' || t->s.p[0] == 'T';
            return lit_node(ps, t->line, v);
        }
        if (tok_is_name(t, "none") || tok_is_name(t, "None")) {
            v.kind = SHOAL_CT_NONE;
            return lit_node(ps, t->line, v);
        }
        {
            struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_NAME, t->line);
            if (n)
                n->name = t->s;
            return n;
        }
    case SHOAL_CT_TK_STRING: {
        /* Adjacent string literals concatenate, as in Python. */
        size_t total = 0, k = ps->i;
        while (ps->toks[k].kind == SHOAL_CT_TK_STRING)
            total += ps->toks[k++].s.n;
        v.kind = SHOAL_CT_STR;
        if (k == ps->i + 1) {
            v.u.s = t->s;
        } else {
            char *p = shoal_ct_arena_alloc(ps->arena, total + 1);
            if (!p)
                return perror_at(ps, t, "out of memory");
            size_t o = 0;
            for (size_t j = ps->i; j < k; j++) {
                memcpy(p + o, ps->toks[j].s.p, ps->toks[j].s.n);
                o += ps->toks[j].s.n;
            }
            v.u.s.p = p;
            v.u.s.n = total;
        }
        ps->i = k;
        return lit_node(ps, t->line, v);
    }
    case SHOAL_CT_TK_INT:
        ps->i++;
        v.kind = SHOAL_CT_INT;
        v.u.i = t->i;
        return lit_node(ps, t->line, v);
    case SHOAL_CT_TK_FLOAT:
        ps->i++;
        v.kind = SHOAL_CT_FLOAT;
        v.u.f = t->f;
        return lit_node(ps, t->line, v);
    case SHOAL_CT_TK_OP:
        if (t->op == '(') {
            ps->i++;
            if (tok_is_op(cur(ps), ')')) { /* () is an empty tuple */
                ps->i++;
                return new_node(ps, SHOAL_CT_N_LIST, t->line);
            }
            struct shoal_ct_node *e = parse_expr(ps, 1);
            if (!e)
                return NULL;
            if (tok_is_op(cur(ps), ',')) { /* a tuple: (a, b, ...) */
                struct nvec vec = {0};
                nvec_push(&vec, e, no_name);
                while (tok_is_op(cur(ps), ',')) {
                    ps->i++;
                    if (tok_is_op(cur(ps), ')'))
                        break;
                    if (!(e = parse_expr(ps, 1))) {
                        nvec_free(&vec);
                        return NULL;
                    }
                    nvec_push(&vec, e, no_name);
                }
                struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_LIST, t->line);
                if (!n || nvec_finish(ps, &vec, n))
                    return NULL;
                e = n;
            }
            if (expect_op(ps, ')', "')'"))
                return NULL;
            return e;
        }
        if (t->op == '[') {
            ps->i++;
            return parse_sequence(ps, SHOAL_CT_N_LIST, ']', t->line);
        }
        if (t->op == '{') {
            ps->i++;
            return parse_sequence(ps, SHOAL_CT_N_DICT, '}', t->line);
        }
        break;
    default:
        break;
    }
    return unexpected(ps, "an expression");
}

/* '[' already current: a[b] or a[b:c:d]. */
static struct shoal_ct_node *parse_subscript(struct parser *ps,
                                             struct shoal_ct_node *obj)
{
    int line = cur(ps)->line;
    ps->i++;
    struct shoal_ct_node *parts[3] = {NULL, NULL, NULL};
    int is_slice = 0;
    for (int k = 0; k < 3; k++) {
        if (!tok_is_op(cur(ps), ':') && !tok_is_op(cur(ps), ']')) {
            if (!(parts[k] = parse_expr(ps, 1)))
                return NULL;
        }
        if (k < 2 && tok_is_op(cur(ps), ':')) {
            is_slice = 1;
            ps->i++;
            continue;
        }
        break;
    }
    if (expect_op(ps, ']', "']' after a subscript"))
        return NULL;
    if (!is_slice && !parts[0])
        return perror_at(ps, &ps->toks[ps->i - 1], "empty subscript '[]'");
    struct shoal_ct_node *n = new_node(ps, is_slice ? SHOAL_CT_N_SLICE
                                                    : SHOAL_CT_N_INDEX, line);
    if (!n)
        return NULL;
    n->a = obj;
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    return n;
}

static struct shoal_ct_node *parse_postfix(struct parser *ps,
                                           struct shoal_ct_node *node)
{
    for (;;) {
        const struct shoal_ct_token *t = cur(ps);
        if (tok_is_op(t, '.')) {
            ps->i++;
            const struct shoal_ct_token *nm = cur(ps);
            if (nm->kind == SHOAL_CT_TK_INT) { /* x.0 is x[0] */
                struct shoal_ct_val v = {.kind = SHOAL_CT_INT, .u.i = nm->i};
                struct shoal_ct_node *idx = lit_node(ps, nm->line, v);
                struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_INDEX, t->line);
                if (!idx || !n)
                    return NULL;
                ps->i++;
                n->a = node;
                n->b = idx;
                node = n;
                continue;
            }
            if (nm->kind != SHOAL_CT_TK_NAME)
                return unexpected(ps, "an attribute name after '.'");
            ps->i++;
            struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_ATTR, t->line);
            if (!n)
                return NULL;
            n->a = node;
            n->name = nm->s;
            node = n;
        } else if (tok_is_op(t, '[')) {
            if (!(node = parse_subscript(ps, node)))
                return NULL;
        } else if (tok_is_op(t, '(')) {
            struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_CALL, t->line);
            if (!n)
                return NULL;
            n->a = node;
            if (parse_call_args(ps, n))
                return NULL;
            node = n;
        } else {
            return node;
        }
    }
}

static struct shoal_ct_node *parse_filter_expr(struct parser *ps,
                                               struct shoal_ct_node *node)
{
    for (;;) {
        const struct shoal_ct_token *t = cur(ps);
        if (tok_is_op(t, '|')) {
            ps->i++;
            if (cur(ps)->kind != SHOAL_CT_TK_NAME)
                return unexpected(ps, "a filter name after '|'");
            struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_FILTER, t->line);
            if (!n)
                return NULL;
            n->a = node;
            n->name = cur(ps)->s;
            ps->i++;
            if (tok_is_op(cur(ps), '(') && parse_call_args(ps, n))
                return NULL;
            node = n;
        } else if (tok_is_name(t, "is")) {
            ps->i++;
            struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_TEST, t->line);
            if (!n)
                return NULL;
            if (tok_is_name(cur(ps), "not")) {
                n->op = 1;
                ps->i++;
            }
            if (cur(ps)->kind != SHOAL_CT_TK_NAME)
                return unexpected(ps, "a test name after 'is'");
            n->a = node;
            n->name = cur(ps)->s;
            ps->i++;
            const struct shoal_ct_token *nx = cur(ps);
            if (tok_is_op(nx, '(')) {
                if (parse_call_args(ps, n))
                    return NULL;
            } else if ((nx->kind == SHOAL_CT_TK_NAME || nx->kind == SHOAL_CT_TK_STRING ||
                        nx->kind == SHOAL_CT_TK_INT || nx->kind == SHOAL_CT_TK_FLOAT ||
                        tok_is_op(nx, '[') || tok_is_op(nx, '{')) &&
                       !tok_is_name(nx, "else") && !tok_is_name(nx, "or") &&
                       !tok_is_name(nx, "and") && !tok_is_name(nx, "if") &&
                       !tok_is_name(nx, "in") && !tok_is_name(nx, "not")) {
                /* `x is divisibleby 3`, `x is equalto 'y'`: one bare argument */
                if (tok_is_name(nx, "is"))
                    return perror_at(ps, nx, "tests cannot be chained with 'is'");
                struct shoal_ct_node *arg = parse_primary(ps);
                if (!arg || !(arg = parse_postfix(ps, arg)))
                    return NULL;
                n->args = shoal_ct_arena_alloc(ps->arena, sizeof *n->args);
                if (!n->args)
                    return perror_at(ps, nx, "out of memory");
                n->args[0] = arg;
                n->n_args = 1;
            }
            node = n;
        } else if (tok_is_op(t, '(')) {
            struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_CALL, t->line);
            if (!n)
                return NULL;
            n->a = node;
            if (parse_call_args(ps, n))
                return NULL;
            node = n;
        } else {
            return node;
        }
    }
}

/* Count one level of recursion; 0 to go on, -1 (err set) past the limit. */
static int enter(struct parser *ps)
{
    if (++ps->depth > MAX_PARSE_DEPTH) {
        perror_at(ps, cur(ps), "expression or block nesting deeper than %d",
                  MAX_PARSE_DEPTH);
        return -1;
    }
    return 0;
}

static struct shoal_ct_node *parse_unary(struct parser *ps, int with_filter)
{
    if (enter(ps))
        return NULL;
    const struct shoal_ct_token *t = cur(ps);
    struct shoal_ct_node *node;
    if (tok_is_op(t, '-') || tok_is_op(t, '+')) {
        ps->i++;
        node = new_node(ps, SHOAL_CT_N_UNARY, t->line);
        if (node) {
            node->op = t->op == '-' ? SHOAL_CT_OP_NEG : SHOAL_CT_OP_POS;
            if (!(node->a = parse_unary(ps, 0)))
                node = NULL;
        }
    } else {
        node = parse_primary(ps);
    }
    if (node)
        node = parse_postfix(ps, node);
    if (node && with_filter)
        node = parse_filter_expr(ps, node);
    ps->depth--;
    return node;
}

static struct shoal_ct_node *binary(struct parser *ps, int op, int line,
                                    struct shoal_ct_node *a,
                                    struct shoal_ct_node *b)
{
    if (!a || !b)
        return NULL;
    struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_BINARY, line);
    if (n) {
        n->op = op;
        n->a = a;
        n->b = b;
    }
    return n;
}

static struct shoal_ct_node *parse_pow(struct parser *ps)
{
    struct shoal_ct_node *node = parse_unary(ps, 1);
    while (node && tok_is_op(cur(ps), SHOAL_CT_P_POW)) {
        int line = cur(ps)->line;
        ps->i++;
        node = binary(ps, SHOAL_CT_OP_POW, line, node, parse_unary(ps, 1));
    }
    return node;
}

static struct shoal_ct_node *parse_math2(struct parser *ps)
{
    struct shoal_ct_node *node = parse_pow(ps);
    for (;;) {
        const struct shoal_ct_token *t = cur(ps);
        int op = tok_is_op(t, '*') ? SHOAL_CT_OP_MUL
               : tok_is_op(t, '/') ? SHOAL_CT_OP_DIV
               : tok_is_op(t, SHOAL_CT_P_FLOORDIV) ? SHOAL_CT_OP_FLOORDIV
               : tok_is_op(t, '%') ? SHOAL_CT_OP_MOD : 0;
        if (!node || !op)
            return node;
        ps->i++;
        node = binary(ps, op, t->line, node, parse_pow(ps));
    }
}

static struct shoal_ct_node *parse_concat(struct parser *ps)
{
    struct shoal_ct_node *node = parse_math2(ps);
    while (node && tok_is_op(cur(ps), '~')) {
        int line = cur(ps)->line;
        ps->i++;
        node = binary(ps, SHOAL_CT_OP_CONCAT, line, node, parse_math2(ps));
    }
    return node;
}

static struct shoal_ct_node *parse_math1(struct parser *ps)
{
    struct shoal_ct_node *node = parse_concat(ps);
    for (;;) {
        const struct shoal_ct_token *t = cur(ps);
        int op = tok_is_op(t, '+') ? SHOAL_CT_OP_ADD
               : tok_is_op(t, '-') ? SHOAL_CT_OP_SUB : 0;
        if (!node || !op)
            return node;
        ps->i++;
        node = binary(ps, op, t->line, node, parse_concat(ps));
    }
}

/* Comparisons chain like Python: a < b < c is (a < b) and (b < c); the
 * middle operand is evaluated twice, which is harmless without side effects. */
static struct shoal_ct_node *parse_compare(struct parser *ps)
{
    struct shoal_ct_node *node = parse_math1(ps), *last = node;
    while (node) {
        const struct shoal_ct_token *t = cur(ps);
        int op = tok_is_op(t, SHOAL_CT_P_EQ) ? SHOAL_CT_OP_EQ
               : tok_is_op(t, SHOAL_CT_P_NE) ? SHOAL_CT_OP_NE
               : tok_is_op(t, '<') ? SHOAL_CT_OP_LT
               : tok_is_op(t, SHOAL_CT_P_LE) ? SHOAL_CT_OP_LE
               : tok_is_op(t, '>') ? SHOAL_CT_OP_GT
               : tok_is_op(t, SHOAL_CT_P_GE) ? SHOAL_CT_OP_GE
               : tok_is_name(t, "in") ? SHOAL_CT_OP_IN : 0;
        if (!op && tok_is_name(t, "not") && tok_is_name(&ps->toks[ps->i + 1], "in")) {
            op = SHOAL_CT_OP_NOTIN;
            ps->i++;
        }
        if (!op)
            return node;
        ps->i++;
        struct shoal_ct_node *rhs = parse_math1(ps);
        struct shoal_ct_node *cmp = binary(ps, op, t->line, last, rhs);
        if (!cmp)
            return NULL;
        if (node == last) {
            node = cmp;
        } else {
            struct shoal_ct_node *and = new_node(ps, SHOAL_CT_N_AND, t->line);
            if (!and)
                return NULL;
            and->a = node;
            and->b = cmp;
            node = and;
        }
        last = rhs;
    }
    return node;
}

static struct shoal_ct_node *parse_not(struct parser *ps)
{
    const struct shoal_ct_token *t = cur(ps);
    if (!tok_is_name(t, "not"))
        return parse_compare(ps);
    if (enter(ps))
        return NULL;
    ps->i++;
    struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_UNARY, t->line);
    if (n) {
        n->op = SHOAL_CT_OP_NOT;
        if (!(n->a = parse_not(ps)))
            n = NULL;
    }
    ps->depth--;
    return n;
}

static struct shoal_ct_node *parse_and(struct parser *ps)
{
    struct shoal_ct_node *node = parse_not(ps);
    while (node && tok_is_name(cur(ps), "and")) {
        struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_AND, cur(ps)->line);
        ps->i++;
        if (!n)
            return NULL;
        n->a = node;
        if (!(n->b = parse_not(ps)))
            return NULL;
        node = n;
    }
    return node;
}

static struct shoal_ct_node *parse_or(struct parser *ps)
{
    struct shoal_ct_node *node = parse_and(ps);
    while (node && tok_is_name(cur(ps), "or")) {
        struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_OR, cur(ps)->line);
        ps->i++;
        if (!n)
            return NULL;
        n->a = node;
        if (!(n->b = parse_and(ps)))
            return NULL;
        node = n;
    }
    return node;
}

static struct shoal_ct_node *parse_expr(struct parser *ps, int with_cond)
{
    if (enter(ps))
        return NULL;
    struct shoal_ct_node *node = parse_or(ps);
    while (with_cond && node && tok_is_name(cur(ps), "if")) {
        struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_COND, cur(ps)->line);
        ps->i++;
        if (!n || !(n->b = parse_or(ps))) {
            node = NULL;
            break;
        }
        n->a = node;
        if (tok_is_name(cur(ps), "else")) {
            ps->i++;
            if (!(n->c = parse_expr(ps, 1))) {
                node = NULL;
                break;
            }
        }
        node = n;
    }
    ps->depth--;
    return node;
}

/* ---- statements ------------------------------------------------------- */

static struct shoal_ct_node *parse_body(struct parser *ps, const char *const *ends,
                                        const char *opener, int open_line);

static int expect_block_end(struct parser *ps)
{
    if (cur(ps)->kind != SHOAL_CT_TK_BLOCK_END) {
        unexpected(ps, "'%}'");
        return -1;
    }
    ps->i++;
    return 0;
}

/* After a body stopped at `{% <end>`: return the end tag's name (current
 * token) and consume it. */
static const struct shoal_ct_token *take_end_tag(struct parser *ps)
{
    const struct shoal_ct_token *t = cur(ps);
    ps->i++;
    return t;
}

static struct shoal_ct_node *parse_if(struct parser *ps, int line)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_IF, line);
    if (!n || !(n->a = parse_expr(ps, 1)) || expect_block_end(ps))
        return NULL;
    if (!(n->b = parse_body(ps, ends, "if", line)))
        return NULL;
    const struct shoal_ct_token *end = take_end_tag(ps);
    if (tok_is_name(end, "elif")) {
        if (!(n->c = parse_if(ps, end->line)))
            return NULL;
        return n; /* the nested if consumed endif */
    }
    if (tok_is_name(end, "else")) {
        static const char *const ends2[] = {"endif", NULL};
        if (expect_block_end(ps) || !(n->c = parse_body(ps, ends2, "if", line)))
            return NULL;
        take_end_tag(ps);
    }
    return expect_block_end(ps) ? NULL : n;
}

/* NAME {',' NAME} as a list of NAME nodes in node->args. */
static int parse_targets(struct parser *ps, struct shoal_ct_node *node)
{
    struct nvec vec = {0};
    do {
        if (vec.n)
            ps->i++; /* , */
        const struct shoal_ct_token *t = cur(ps);
        if (t->kind != SHOAL_CT_TK_NAME) {
            nvec_free(&vec);
            unexpected(ps, "a variable name");
            return -1;
        }
        struct shoal_ct_node *nm = new_node(ps, SHOAL_CT_N_NAME, t->line);
        if (!nm) {
            nvec_free(&vec);
            return -1;
        }
        nm->name = t->s;
        ps->i++;
        nvec_push(&vec, nm, no_name);
    } while (tok_is_op(cur(ps), ','));
    return nvec_finish(ps, &vec, node);
}

static struct shoal_ct_node *parse_for(struct parser *ps, int line)
{
    static const char *const ends[] = {"else", "endfor", NULL};
    static const char *const ends2[] = {"endfor", NULL};
    struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_FOR, line);
    if (!n || parse_targets(ps, n))
        return NULL;
    if (!tok_is_name(cur(ps), "in"))
        return unexpected(ps, "'in' in a for loop");
    ps->i++;
    if (!(n->a = parse_expr(ps, 0)))
        return NULL;
    if (tok_is_name(cur(ps), "if")) {
        ps->i++;
        if (!(n->b = parse_expr(ps, 0)))
            return NULL;
    }
    if (tok_is_name(cur(ps), "recursive"))
        return perror_at(ps, cur(ps), "recursive for loops are not supported");
    if (expect_block_end(ps))
        return NULL;
    ps->loop_depth++;
    n->c = parse_body(ps, ends, "for", line);
    ps->loop_depth--;
    if (!n->c)
        return NULL;
    if (tok_is_name(take_end_tag(ps), "else")) {
        if (expect_block_end(ps) || !(n->d = parse_body(ps, ends2, "for", line)))
            return NULL;
        take_end_tag(ps);
    }
    return expect_block_end(ps) ? NULL : n;
}

static struct shoal_ct_node *parse_set(struct parser *ps, int line)
{
    const struct shoal_ct_token *t = cur(ps);
    if (t->kind != SHOAL_CT_TK_NAME)
        return unexpected(ps, "a variable name after 'set'");
    if (tok_is_op(&ps->toks[ps->i + 1], '.')) { /* set ns.attr = expr */
        const struct shoal_ct_token *attr = &ps->toks[ps->i + 2];
        if (attr->kind != SHOAL_CT_TK_NAME) {
            ps->i += 2;
            return unexpected(ps, "an attribute name after '.'");
        }
        struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_SET_ATTR, line);
        if (!n)
            return NULL;
        n->name = t->s;
        n->name2 = attr->s;
        ps->i += 3;
        if (expect_op(ps, '=', "'=' in a set statement") ||
            !(n->a = parse_expr(ps, 1)) || expect_block_end(ps))
            return NULL;
        return n;
    }
    if (ps->toks[ps->i + 1].kind == SHOAL_CT_TK_BLOCK_END) { /* {% set x %}...{% endset %} */
        static const char *const ends[] = {"endset", NULL};
        struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_SET_BLOCK, line);
        if (!n)
            return NULL;
        n->name = t->s;
        ps->i += 2;
        if (!(n->c = parse_body(ps, ends, "set", line)))
            return NULL;
        take_end_tag(ps);
        return expect_block_end(ps) ? NULL : n;
    }
    struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_SET, line);
    if (!n || parse_targets(ps, n) || expect_op(ps, '=', "'=' in a set statement"))
        return NULL;
    if (!(n->a = parse_expr(ps, 1)))
        return NULL;
    if (tok_is_op(cur(ps), ',')) { /* set a, b = x, y */
        struct nvec vec = {0};
        nvec_push(&vec, n->a, no_name);
        while (tok_is_op(cur(ps), ',')) {
            ps->i++;
            struct shoal_ct_node *e = parse_expr(ps, 1);
            if (!e) {
                nvec_free(&vec);
                return NULL;
            }
            nvec_push(&vec, e, no_name);
        }
        struct shoal_ct_node *tuple = new_node(ps, SHOAL_CT_N_LIST, line);
        if (!tuple || nvec_finish(ps, &vec, tuple))
            return NULL;
        n->a = tuple;
    }
    return expect_block_end(ps) ? NULL : n;
}

static struct shoal_ct_node *parse_macro(struct parser *ps, int line)
{
    static const char *const ends[] = {"endmacro", NULL};
    const struct shoal_ct_token *t = cur(ps);
    if (t->kind != SHOAL_CT_TK_NAME)
        return unexpected(ps, "a macro name");
    struct shoal_ct_node *n = new_node(ps, SHOAL_CT_N_MACRO, line);
    if (!n)
        return NULL;
    n->name = t->s;
    ps->i++;
    if (expect_op(ps, '(', "'(' after the macro name"))
        return NULL;
    struct nvec vec = {0};
    while (!tok_is_op(cur(ps), ')')) {
        const struct shoal_ct_token *p = cur(ps);
        if (p->kind != SHOAL_CT_TK_NAME) {
            nvec_free(&vec);
            return unexpected(ps, "a parameter name");
        }
        ps->i++;
        struct shoal_ct_node *def = NULL;
        if (tok_is_op(cur(ps), '=')) {
            ps->i++;
            if (!(def = parse_expr(ps, 1))) {
                nvec_free(&vec);
                return NULL;
            }
        }
        nvec_push(&vec, def, p->s);
        if (tok_is_op(cur(ps), ','))
            ps->i++;
        else if (!tok_is_op(cur(ps), ')')) {
            nvec_free(&vec);
            return unexpected(ps, "',' or ')' in the parameter list");
        }
    }
    ps->i++;
    vec.any_name = 1;
    if (nvec_finish(ps, &vec, n) || expect_block_end(ps))
        return NULL;
    int saved_loops = ps->loop_depth;
    ps->loop_depth = 0;
    n->c = parse_body(ps, ends, "macro", line);
    ps->loop_depth = saved_loops;
    if (!n->c)
        return NULL;
    take_end_tag(ps);
    return expect_block_end(ps) ? NULL : n;
}

/* Parse one `{% ... %}` statement; BLOCK_BEGIN already consumed and the
 * current token is its name. */
static struct shoal_ct_node *parse_statement(struct parser *ps)
{
    const struct shoal_ct_token *t = cur(ps);
    char buf[64];
    if (t->kind != SHOAL_CT_TK_NAME)
        return unexpected(ps, "a tag name after '{%'");
    ps->i++;
    if (tok_is_name(t, "if"))
        return parse_if(ps, t->line);
    if (tok_is_name(t, "for"))
        return parse_for(ps, t->line);
    if (tok_is_name(t, "set"))
        return parse_set(ps, t->line);
    if (tok_is_name(t, "macro"))
        return parse_macro(ps, t->line);
    if (tok_is_name(t, "break") || tok_is_name(t, "continue")) {
        if (ps->loop_depth == 0)
            return perror_at(ps, t, "'%.*s' outside a for loop", (int)t->s.n, t->s.p);
        struct shoal_ct_node *n = new_node(ps, tok_is_name(t, "break")
                                                   ? SHOAL_CT_N_BREAK
                                                   : SHOAL_CT_N_CONTINUE, t->line);
        return !n || expect_block_end(ps) ? NULL : n;
    }
    if (tok_is_name(t, "generation")) {
        /* transformers' assistant-mask marker: render the body as is */
        static const char *const ends[] = {"endgeneration", NULL};
        struct shoal_ct_node *body;
        if (expect_block_end(ps) || !(body = parse_body(ps, ends, "generation", t->line)))
            return NULL;
        take_end_tag(ps);
        return expect_block_end(ps) ? NULL : body;
    }
    static const char *const known_unsupported[] = {
        "call", "filter", "with", "include", "import", "from", "extends",
        "block", "autoescape", "do", NULL};
    for (size_t k = 0; known_unsupported[k]; k++)
        if (tok_is_name(t, known_unsupported[k]))
            return perror_at(ps, t, "tag '%s' is not supported by shoal's chat "
                             "template renderer", known_unsupported[k]);
    return perror_at(ps, t, "unknown tag %s", tok_desc(t, buf, sizeof buf));
}

static int name_in(const struct shoal_ct_token *t, const char *const *names)
{
    for (size_t k = 0; names && names[k]; k++)
        if (tok_is_name(t, names[k]))
            return 1;
    return 0;
}

/* Parse statements until `{% <one of ends>` (left current, '{%' consumed)
 * or end of template (an error when ends is not NULL). */
static struct shoal_ct_node *parse_body(struct parser *ps, const char *const *ends,
                                        const char *opener, int open_line)
{
    struct shoal_ct_node *body = new_node(ps, SHOAL_CT_N_BODY, cur(ps)->line);
    if (!body || enter(ps))
        return NULL;
    struct nvec vec = {0};
    char buf[64];
    for (;;) {
        const struct shoal_ct_token *t = cur(ps);
        struct shoal_ct_node *st = NULL;
        if (t->kind == SHOAL_CT_TK_EOF) {
            if (ends) {
                size_t last = 0;
                while (ends[last + 1])
                    last++;
                perror_at(ps, t, "unexpected end of template; '%s' opened at line %d "
                          "needs '{%% %s %%}'", opener, open_line, ends[last]);
                goto fail;
            }
            break;
        }
        if (t->kind == SHOAL_CT_TK_DATA) {
            st = new_node(ps, SHOAL_CT_N_TEXT, t->line);
            if (!st)
                goto fail;
            st->lit.kind = SHOAL_CT_STR;
            st->lit.u.s = t->s;
            ps->i++;
        } else if (t->kind == SHOAL_CT_TK_VAR_BEGIN) {
            ps->i++;
            st = new_node(ps, SHOAL_CT_N_OUTPUT, t->line);
            if (!st || !(st->a = parse_expr(ps, 1)))
                goto fail;
            if (cur(ps)->kind != SHOAL_CT_TK_VAR_END) {
                unexpected(ps, "'}}'");
                goto fail;
            }
            ps->i++;
        } else if (t->kind == SHOAL_CT_TK_BLOCK_BEGIN) {
            const struct shoal_ct_token *nm = &ps->toks[ps->i + 1];
            if (name_in(nm, ends)) {
                ps->i++;
                break;
            }
            static const char *const closers[] = {
                "endif", "endfor", "elif", "else", "endset", "endmacro",
                "endgeneration", "endraw", NULL};
            if (name_in(nm, closers)) {
                if (ends)
                    perror_at(ps, nm, "unexpected %s inside '%s' opened at line %d",
                              tok_desc(nm, buf, sizeof buf), opener, open_line);
                else
                    perror_at(ps, nm, "unexpected %s with no open block",
                              tok_desc(nm, buf, sizeof buf));
                goto fail;
            }
            ps->i++;
            if (!(st = parse_statement(ps)))
                goto fail;
        } else {
            unexpected(ps, "text or a tag");
            goto fail;
        }
        nvec_push(&vec, st, no_name);
    }
    ps->depth--;
    return nvec_finish(ps, &vec, body) ? NULL : body;
fail:
    nvec_free(&vec);
    return NULL;
}

/* ---- public API ------------------------------------------------------- */

struct shoal_chat_template *shoal_chat_template_parse(const char *source,
                                                      struct shoal_err *err)
{
    if (!source) {
        shoal_err_set(err, SHOAL_EINVAL, "chat template source is NULL");
        return NULL;
    }
    struct shoal_chat_template *t = shoal_xcalloc(1, sizeof *t);
    t->arena.cap = SIZE_MAX;
    struct shoal_ct_token *toks = NULL;
    size_t n_toks = 0;
    if (shoal_ct_lex(&t->arena, source, &toks, &n_toks, err))
        goto fail;
    struct parser ps = {.toks = toks, .arena = &t->arena, .err = err};
    t->root = parse_body(&ps, NULL, NULL, 0);
    if (!t->root)
        goto fail;
    free(toks);
    return t;
fail:
    free(toks);
    shoal_chat_template_free(t);
    return NULL;
}

void shoal_chat_template_free(struct shoal_chat_template *t)
{
    if (!t)
        return;
    shoal_ct_arena_release(&t->arena);
    free(t);
}

/* ---- tokenizer_config.json ------------------------------------------- */

#define MAX_CONFIG_BYTES (64u << 20)

/* A special token is a string or an AddedToken object {"content": "..."}.
 * Sets *out to a malloc'd copy or NULL (absent / null). */
static int config_token(const char *path, json_t *root, const char *key,
                        char **out, struct shoal_err *err)
{
    *out = NULL;
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return 0;
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!json_is_string(v))
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "%s: field '%s' has the wrong type; expected a string "
                             "or an object with a string 'content'", path, key);
    *out = shoal_xstrdup(json_string_value(v));
    return 0;
}

/* Read chat_template.jinja next to the config, if present. */
static int sibling_template(const char *path, char **out, struct shoal_err *err)
{
    const char *slash = strrchr(path, '/');
    size_t dir_n = slash ? (size_t)(slash - path) : 0;
    char *dir = shoal_xmalloc(dir_n + 2);
    if (slash) {
        memcpy(dir, path, dir_n);
        dir[dir_n] = '\0';
    } else {
        strcpy(dir, ".");
    }
    char *jinja = shoal_path_join(dir, "chat_template.jinja");
    free(dir);
    int rc = SHOAL_ENOTFOUND; /* no file: the caller words the error */
    if (shoal_exists(jinja)) {
        size_t n;
        rc = shoal_read_file(jinja, MAX_CONFIG_BYTES, out, &n, err);
    }
    free(jinja);
    return rc;
}

/* A loader's results into its out-parameters (bos / eos freed when the
 * caller does not want them). */
static void give_loaded(char *tmpl, char *bos, char *eos, char **template_source,
                        char **bos_token, char **eos_token)
{
    *template_source = tmpl;
    if (bos_token)
        *bos_token = bos;
    else
        free(bos);
    if (eos_token)
        *eos_token = eos;
    else
        free(eos);
}

int shoal_chat_template_load_config(const char *tokenizer_config_path,
                                    char **template_source, char **bos_token,
                                    char **eos_token, struct shoal_err *err)
{
    const char *path = tokenizer_config_path;
    char *text = NULL, *tmpl = NULL, *bos = NULL, *eos = NULL;
    json_t *root = NULL;
    size_t len;
    int rc;
    if (!path || !template_source)
        return shoal_err_set(err, SHOAL_EINVAL, "chat template config: path and "
                             "template_source must not be NULL");
    rc = shoal_read_file(path, MAX_CONFIG_BYTES, &text, &len, err);
    if (rc)
        return rc;
    json_error_t jerr;
    /* Some configs hold integers past 64 bits (Mixtral's model_max_length). */
    root = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &jerr);
    if (!root) {
        rc = shoal_err_set(err, SHOAL_EFORMAT, "%s: not valid JSON: %s (line %d "
                           "column %d)", path, jerr.text, jerr.line, jerr.column);
        goto fail;
    }
    if (!json_is_object(root)) {
        rc = shoal_err_set(err, SHOAL_EFORMAT, "%s: expected a JSON object at the "
                           "top level", path);
        goto fail;
    }
    json_t *ct = json_object_get(root, "chat_template");
    if (json_is_array(ct)) { /* [{"name": ..., "template": ...}, ...] */
        json_t *pick = NULL, *item;
        size_t k;
        json_array_foreach(ct, k, item) {
            json_t *name = json_object_get(item, "name");
            if (!pick || (json_is_string(name) &&
                          strcmp(json_string_value(name), "default") == 0))
                pick = item;
        }
        ct = pick ? json_object_get(pick, "template") : NULL;
        if (!json_is_string(ct)) {
            rc = shoal_err_set(err, SHOAL_EFORMAT, "%s: field 'chat_template' is a "
                               "list without a string 'template' entry", path);
            goto fail;
        }
    }
    if (json_is_string(ct)) {
        tmpl = shoal_xstrdup(json_string_value(ct));
    } else if (ct && !json_is_null(ct)) {
        rc = shoal_err_set(err, SHOAL_EFORMAT, "%s: field 'chat_template' has the "
                           "wrong type; expected a string or a list", path);
        goto fail;
    } else {
        rc = sibling_template(path, &tmpl, err);
        if (rc == SHOAL_ENOTFOUND) {
            rc = shoal_err_set(err, SHOAL_ENOTFOUND, "%s: no 'chat_template' field "
                               "and no chat_template.jinja next to it (a base "
                               "model?)", path);
            goto fail;
        }
        if (rc)
            goto fail;
    }
    if ((rc = config_token(path, root, "bos_token", &bos, err)) ||
        (rc = config_token(path, root, "eos_token", &eos, err)))
        goto fail;
    json_decref(root);
    free(text);
    give_loaded(tmpl, bos, eos, template_source, bos_token, eos_token);
    return 0;
fail:
    free(eos);
    free(bos);
    free(tmpl);
    json_decref(root);
    free(text);
    return rc;
}

/* ---- GGUF metadata ------------------------------------------------------- */

/* The text of the token whose id the integer key id_key holds, looked up
 * in tokenizer.ggml.tokens, into *out (malloc'd; NULL when the key is
 * absent). Returns 0 or a negative status with err set. */
static int gguf_token_text(const struct shoal_gguf *g, const char *path, const char *id_key,
                           char **out, struct shoal_err *err)
{
    int64_t id = -1;
    int rc = shoal_gguf_get_int(g, id_key, &id, err);
    *out = NULL;
    if (rc == SHOAL_ENOTFOUND)
        return 0;
    if (rc)
        return shoal_err_set(err, rc, "%s: %s", path, err->msg);
    struct shoal_gguf_array a = {0};
    rc = shoal_gguf_get_array(g, "tokenizer.ggml.tokens", &a, err);
    if (rc == SHOAL_ENOTFOUND)
        return shoal_err_set(err, SHOAL_EFORMAT, "%s: %s is set but tokenizer.ggml.tokens "
                             "is missing", path, id_key);
    if (rc)
        return shoal_err_set(err, rc, "%s: %s", path, err->msg);
    if (a.type != SHOAL_GGUF_TYPE_STRING || !a.strs)
        return shoal_err_set(err, SHOAL_EFORMAT, "%s: tokenizer.ggml.tokens holds %s; "
                             "expected strings", path, shoal_gguf_type_name(a.type));
    if (id < 0 || (uint64_t)id >= a.n)
        return shoal_err_set(err, SHOAL_ERANGE, "%s: %s is %lld; expected a token id "
                             "0 to %llu (tokenizer.ggml.tokens holds %llu)", path, id_key,
                             (long long)id, (unsigned long long)(a.n ? a.n - 1 : 0),
                             (unsigned long long)a.n);
    const size_t len = a.str_lens ? (size_t)a.str_lens[id] : strlen(a.strs[id]);
    if (memchr(a.strs[id], 0, len))
        return shoal_err_set(err, SHOAL_EFORMAT, "%s: token %lld of tokenizer.ggml.tokens "
                             "(%s) holds a NUL byte", path, (long long)id, id_key);
    *out = shoal_xmalloc(len + 1);
    memcpy(*out, a.strs[id], len);
    (*out)[len] = 0;
    return 0;
}

int shoal_chat_template_load_gguf(const struct shoal_gguf *g, const char *path,
                                  char **template_source, char **bos_token,
                                  char **eos_token, struct shoal_err *err)
{
    if (!g || !path || !template_source)
        return shoal_err_set(err, SHOAL_EINVAL, "chat template GGUF: g, path and "
                             "template_source must not be NULL");
    const char *src = NULL;
    size_t len = 0;
    int rc = shoal_gguf_get_str(g, "tokenizer.chat_template", &src, &len, err);
    if (rc == SHOAL_ENOTFOUND)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "%s: no 'tokenizer.chat_template' key "
                             "in its metadata (a base model?)", path);
    if (rc)
        return shoal_err_set(err, rc, "%s: %s", path, err->msg);
    if (memchr(src, 0, len))
        return shoal_err_set(err, SHOAL_EFORMAT, "%s: tokenizer.chat_template holds a NUL "
                             "byte", path);
    char *bos = NULL, *eos = NULL;
    if ((rc = gguf_token_text(g, path, "tokenizer.ggml.bos_token_id", &bos, err)) ||
        (rc = gguf_token_text(g, path, "tokenizer.ggml.eos_token_id", &eos, err))) {
        free(bos);
        return rc;
    }
    char *tmpl = shoal_xmalloc(len + 1);
    memcpy(tmpl, src, len);
    tmpl[len] = 0;
    give_loaded(tmpl, bos, eos, template_source, bos_token, eos_token);
    return 0;
}

int shoal_chat_template_load_model(const char *model_path, const struct shoal_gguf *gguf,
                                   char **template_source, char **bos_token,
                                   char **eos_token, struct shoal_err *err)
{
    if (gguf)
        return shoal_chat_template_load_gguf(gguf, model_path, template_source, bos_token,
                                             eos_token, err);
    if (!model_path)
        return shoal_err_set(err, SHOAL_EINVAL, "chat template: model_path must not be NULL");
    char *cfg = shoal_path_join(model_path, "tokenizer_config.json");
    char *tg = shoal_path_join(model_path, "tokenizer.gguf");
    int rc;
    if (!shoal_exists(cfg) && shoal_exists(tg)) {
        /* a container converted from a GGUF: its metadata, as the GGUF's run reads it */
        struct shoal_gguf *g = shoal_gguf_open(tg, err);
        rc = g ? shoal_chat_template_load_gguf(g, model_path, template_source, bos_token,
                                               eos_token, err)
               : (err && err->code ? err->code : SHOAL_EFORMAT);
        shoal_gguf_close(g);
    } else {
        rc = shoal_chat_template_load_config(cfg, template_source, bos_token, eos_token, err);
    }
    free(cfg);
    free(tg);
    return rc;
}
