/* chat_template_impl: private declarations shared by the chat_template
 * module's files: the bump arena, the value type, tokens and the AST
 * (chat_template.c parses, chat_template_lex.c lexes), and the evaluation
 * context and helpers (chat_template_value.c holds values,
 * chat_template_eval.c evaluates, chat_template_builtins.c holds the filters,
 * tests, methods and global functions, chat_template_format.c str.format). Not a public header; `shoal_ct_` is
 * the module's short internal prefix.
 *
 * Ownership: a parsed template owns one arena holding every node and every
 * literal string; a render owns a second, capped arena holding every value it
 * creates. Values are immutable once built, except namespace objects, whose
 * attribute table is replaced on `{% set ns.x = ... %}`; so values may share
 * pointers freely and nothing is freed before the arena.
 *
 * Thread: any (an arena belongs to one thread at a time).
 */
#ifndef SHOAL_CHAT_TEMPLATE_IMPL_H
#define SHOAL_CHAT_TEMPLATE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* ---- arena ------------------------------------------------------------ */

struct shoal_ct_chunk;

struct shoal_ct_arena {
    struct shoal_ct_chunk *head; /* newest chunk first */
    size_t used;                 /* bytes handed out, all chunks */
    size_t cap;                  /* refuse allocations past this many bytes */
};

/* Allocate n bytes, 16-byte aligned, zeroed. Returns NULL when the arena
 * would pass its cap or malloc fails; the caller reports the error. */
void *shoal_ct_arena_alloc(struct shoal_ct_arena *a, size_t n);

/* Release every chunk; the arena may be reused afterwards. */
void shoal_ct_arena_release(struct shoal_ct_arena *a);

/* ---- values ----------------------------------------------------------- */

enum shoal_ct_kind {
    SHOAL_CT_UNDEF = 0, /* jinja Undefined: renders "", is falsy */
    SHOAL_CT_NONE,
    SHOAL_CT_BOOL,
    SHOAL_CT_INT,
    SHOAL_CT_FLOAT,
    SHOAL_CT_STR,
    SHOAL_CT_LIST,      /* also stands in for tuples */
    SHOAL_CT_DICT,      /* insertion-ordered; keys none/bool/int/float/str */
    SHOAL_CT_NS,        /* namespace(...): a dict whose attributes can be set */
    SHOAL_CT_MACRO,     /* a {% macro %} defined by the template */
    SHOAL_CT_LOOP,      /* the `loop` object of a for loop */
    SHOAL_CT_FUNC,      /* a global function (range, namespace, ...) named
                           without a call: `range is defined` */
};

struct shoal_ct_str {
    const char *p; /* UTF-8, not necessarily NUL-terminated */
    size_t n;      /* bytes */
};

struct shoal_ct_val;

struct shoal_ct_list {
    size_t n;                   /* items */
    struct shoal_ct_val *items; /* [n] */
};

struct shoal_ct_dict {
    size_t n, cap;              /* entries used / allocated */
    struct shoal_ct_val *keys;  /* [cap] hashable values (see dict_put) */
    struct shoal_ct_val *vals;  /* [cap] */
};

struct shoal_ct_node;
struct shoal_ct_loop;

struct shoal_ct_val {
    enum shoal_ct_kind kind;
    union {
        int b;                             /* BOOL: 0 or 1 */
        int64_t i;                         /* INT */
        double f;                          /* FLOAT */
        struct shoal_ct_str s;             /* STR */
        struct shoal_ct_list *l;           /* LIST */
        struct shoal_ct_dict *d;           /* DICT, NS */
        const struct shoal_ct_node *macro; /* MACRO: the SHOAL_CT_N_MACRO node */
        const struct shoal_ct_loop *loop;  /* LOOP */
        const char *func;                  /* FUNC: static name */
    } u;
};

/* A for loop's live state; `loop.index` etc. are computed from it. */
struct shoal_ct_loop {
    int64_t index0;                    /* current iteration, from 0 */
    int64_t length;                    /* iterations in all */
    const struct shoal_ct_list *items; /* what is iterated (after the filter) */
};

static inline struct shoal_ct_val shoal_ct_undef(void)
{
    return (struct shoal_ct_val){.kind = SHOAL_CT_UNDEF};
}
static inline struct shoal_ct_val shoal_ct_none(void)
{
    return (struct shoal_ct_val){.kind = SHOAL_CT_NONE};
}
static inline struct shoal_ct_val shoal_ct_bool(int b)
{
    return (struct shoal_ct_val){.kind = SHOAL_CT_BOOL, .u.b = !!b};
}
static inline struct shoal_ct_val shoal_ct_int(int64_t i)
{
    return (struct shoal_ct_val){.kind = SHOAL_CT_INT, .u.i = i};
}
static inline struct shoal_ct_val shoal_ct_float(double f)
{
    return (struct shoal_ct_val){.kind = SHOAL_CT_FLOAT, .u.f = f};
}
static inline struct shoal_ct_val shoal_ct_str_val(const char *p, size_t n)
{
    return (struct shoal_ct_val){.kind = SHOAL_CT_STR, .u.s = {p, n}};
}
static inline struct shoal_ct_val shoal_ct_list_val(struct shoal_ct_list *l)
{
    return (struct shoal_ct_val){.kind = SHOAL_CT_LIST, .u.l = l};
}
static inline struct shoal_ct_val shoal_ct_dict_val(struct shoal_ct_dict *d)
{
    return (struct shoal_ct_val){.kind = SHOAL_CT_DICT, .u.d = d};
}

static inline struct shoal_ct_str shoal_ct_cstr(const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    return (struct shoal_ct_str){s, n};
}
static inline int shoal_ct_str_eq(struct shoal_ct_str a, struct shoal_ct_str b)
{
    if (a.n != b.n)
        return 0;
    for (size_t k = 0; k < a.n; k++)
        if (a.p[k] != b.p[k])
            return 0;
    return 1;
}
/* Python numbers: bool counts as int. */
static inline int shoal_ct_is_intlike(struct shoal_ct_val v)
{
    return v.kind == SHOAL_CT_INT || v.kind == SHOAL_CT_BOOL;
}
static inline int shoal_ct_is_number(struct shoal_ct_val v)
{
    return shoal_ct_is_intlike(v) || v.kind == SHOAL_CT_FLOAT;
}
static inline int64_t shoal_ct_as_int(struct shoal_ct_val v)
{
    return v.kind == SHOAL_CT_BOOL ? v.u.b : v.u.i;
}
static inline double shoal_ct_as_float(struct shoal_ct_val v)
{
    return v.kind == SHOAL_CT_FLOAT ? v.u.f : (double)shoal_ct_as_int(v);
}

/* ---- tokens (chat_template_lex.c) ------------------------------------- */

enum shoal_ct_tok_kind {
    SHOAL_CT_TK_EOF, SHOAL_CT_TK_DATA, SHOAL_CT_TK_VAR_BEGIN,
    SHOAL_CT_TK_VAR_END, SHOAL_CT_TK_BLOCK_BEGIN, SHOAL_CT_TK_BLOCK_END,
    SHOAL_CT_TK_NAME, SHOAL_CT_TK_STRING, SHOAL_CT_TK_INT, SHOAL_CT_TK_FLOAT,
    SHOAL_CT_TK_OP,
};

/* Multi-character operators; single characters are their own code. */
enum {
    SHOAL_CT_P_POW = 256, SHOAL_CT_P_FLOORDIV, SHOAL_CT_P_EQ, SHOAL_CT_P_NE,
    SHOAL_CT_P_LE, SHOAL_CT_P_GE,
};

struct shoal_ct_token {
    enum shoal_ct_tok_kind kind;
    int op;                  /* TK_OP: the character or SHOAL_CT_P_* */
    int line, col;           /* 1-based, of the first byte */
    struct shoal_ct_str s;   /* DATA (after whitespace control), NAME,
                                STRING (unescaped); points into the arena */
    int64_t i;               /* INT */
    double f;                /* FLOAT */
};

/* Tokenize source (NUL-terminated) the way jinja2 does with
 * trim_blocks/lstrip_blocks. Strings land in arena; *toks ([*n_toks], ending
 * with TK_EOF) is malloc'd, owned by the caller (free()).
 * Returns 0 or SHOAL_EFORMAT ("chat template line L column C: ...") /
 * SHOAL_ENOMEM with err set. */
int shoal_ct_lex(struct shoal_ct_arena *arena, const char *source,
                 struct shoal_ct_token **toks, size_t *n_toks,
                 struct shoal_err *err);

/* Set a syntax error "chat template line L column C: <fmt>"; returns
 * SHOAL_EFORMAT. */
int shoal_ct_syntax_error(struct shoal_err *err, int line, int col,
                          const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- AST -------------------------------------------------------------- */

enum shoal_ct_op {
    SHOAL_CT_OP_ADD = 1, SHOAL_CT_OP_SUB, SHOAL_CT_OP_MUL, SHOAL_CT_OP_DIV,
    SHOAL_CT_OP_FLOORDIV, SHOAL_CT_OP_MOD, SHOAL_CT_OP_POW, SHOAL_CT_OP_CONCAT,
    SHOAL_CT_OP_EQ, SHOAL_CT_OP_NE, SHOAL_CT_OP_LT, SHOAL_CT_OP_LE,
    SHOAL_CT_OP_GT, SHOAL_CT_OP_GE, SHOAL_CT_OP_IN, SHOAL_CT_OP_NOTIN,
    SHOAL_CT_OP_NOT, SHOAL_CT_OP_NEG, SHOAL_CT_OP_POS,
};

/* Node kinds, with the fields each one uses. `args` is an array of n_args
 * nodes; `arg_names[i]` is a keyword name (n == 0 for positional). */
enum shoal_ct_node_kind {
    /* expressions */
    SHOAL_CT_N_LIT = 1, /* lit */
    SHOAL_CT_N_NAME,    /* name */
    SHOAL_CT_N_LIST,    /* args: items */
    SHOAL_CT_N_DICT,    /* args: key0, val0, key1, val1, ... */
    SHOAL_CT_N_ATTR,    /* a.name */
    SHOAL_CT_N_INDEX,   /* a[b] */
    SHOAL_CT_N_SLICE,   /* a[b:c:d]; b, c, d may be NULL */
    SHOAL_CT_N_CALL,    /* a(args) */
    SHOAL_CT_N_FILTER,  /* a | name(args) */
    SHOAL_CT_N_TEST,    /* a is [not] name(args); op = 1 when negated */
    SHOAL_CT_N_UNARY,   /* op a */
    SHOAL_CT_N_BINARY,  /* a op b */
    SHOAL_CT_N_AND,     /* a and b */
    SHOAL_CT_N_OR,      /* a or b */
    SHOAL_CT_N_COND,    /* a if b else c; c may be NULL */
    /* statements */
    SHOAL_CT_N_BODY,      /* args: statements in order */
    SHOAL_CT_N_TEXT,      /* lit: a string to copy out */
    SHOAL_CT_N_OUTPUT,    /* {{ a }} */
    SHOAL_CT_N_IF,        /* if a: b (BODY) else c (BODY, IF or NULL) */
    SHOAL_CT_N_FOR,       /* for args(NAME targets) in a [if b]: c else d */
    SHOAL_CT_N_SET,       /* set args(NAME targets) = a */
    SHOAL_CT_N_SET_ATTR,  /* set name.name2 = a */
    SHOAL_CT_N_SET_BLOCK, /* set name %} c {% endset */
    SHOAL_CT_N_MACRO,     /* macro name(arg_names = args defaults) c */
    SHOAL_CT_N_BREAK,
    SHOAL_CT_N_CONTINUE,
};

struct shoal_ct_node {
    enum shoal_ct_node_kind kind;
    int op;                        /* enum shoal_ct_op, or a flag (see kinds) */
    int line;                      /* 1-based template line, for messages */
    struct shoal_ct_str name;
    struct shoal_ct_str name2;
    struct shoal_ct_val lit;
    struct shoal_ct_node *a, *b, *c, *d;
    struct shoal_ct_node **args;   /* [n_args] */
    struct shoal_ct_str *arg_names;/* [n_args] or NULL */
    size_t n_args;
};

struct shoal_chat_template {
    struct shoal_ct_arena arena;   /* owns every node and literal */
    struct shoal_ct_node *root;    /* SHOAL_CT_N_BODY */
};

/* ---- evaluation (chat_template_value.c, chat_template_eval.c,
 *      chat_template_builtins.c) -------------------------------------- */

#define SHOAL_CT_MAX_VALUE_DEPTH 200 /* nesting when printing/comparing values */

/* Growable malloc'd text, bounded by the render's output limit. */
struct shoal_ct_buf {
    char *p;
    size_t n, cap;      /* bytes used / allocated */
};

struct shoal_ct_scope;

/* One render's state. */
struct shoal_ct_ctx {
    struct shoal_ct_arena arena;  /* every value of this render */
    struct shoal_ct_buf *out;     /* where text goes (swapped for captures) */
    struct shoal_ct_scope *root;  /* template globals; macros run under it */
    uint64_t steps, max_steps;    /* evaluation steps taken / allowed */
    size_t max_output;            /* bytes per output buffer */
    int depth;                    /* nested eval/exec frames */
    int line;                     /* template line being evaluated */
    int rc;                       /* first error, 0 if none */
    struct shoal_err *err;
    /* The last range() built: nested loops re-evaluate the same range() once
     * per outer iteration, and lists are immutable, so it is shared. */
    int64_t range_start, range_stop, range_step;
    struct shoal_ct_list *range_list;
};

/* Evaluated call arguments: positional, then keyword. Arrays in the arena. */
struct shoal_ct_args {
    size_t n_pos, n_kw;
    struct shoal_ct_val *pos;       /* [n_pos] */
    struct shoal_ct_str *kw_names;  /* [n_kw] */
    struct shoal_ct_val *kw;        /* [n_kw] */
};

/* Record the render's first error as "chat template line L: <fmt>" (the
 * current line); returns the first error's code. */
int shoal_ct_fail(struct shoal_ct_ctx *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* count * size zeroed bytes from the render arena, or NULL with the error
 * recorded (SHOAL_ERANGE past the memory limit, SHOAL_ENOMEM). */
void *shoal_ct_alloc(struct shoal_ct_ctx *c, size_t count, size_t size);

/* A list of n zeroed items from the render arena, or NULL with the error
 * recorded. An empty list's items is NULL: never offset it or memcpy from or
 * to it (undefined behaviour even for 0 bytes); guard on n. */
struct shoal_ct_list *shoal_ct_list_new(struct shoal_ct_ctx *c, size_t n);
struct shoal_ct_dict *shoal_ct_dict_new(struct shoal_ct_ctx *c, size_t cap);
/* Insert or replace a string key (the key bytes are not copied). */
int shoal_ct_dict_set(struct shoal_ct_ctx *c, struct shoal_ct_dict *d,
                      struct shoal_ct_str key, struct shoal_ct_val v);
/* Insert or replace any key, as a Python dict does: keys that compare equal
 * (1, 1.0, True) share one entry, which keeps the first key. Only none,
 * bool, int, float and string keys are hashable; others fail with
 * SHOAL_EINVAL "unhashable type". */
int shoal_ct_dict_put(struct shoal_ct_ctx *c, struct shoal_ct_dict *d,
                      struct shoal_ct_val key, struct shoal_ct_val v);
/* The value under a string key, or NULL. */
struct shoal_ct_val *shoal_ct_dict_get(const struct shoal_ct_dict *d,
                                       struct shoal_ct_str key);
/* The value under any key (Python equality: d[1] finds the key 1.0), or
 * NULL. */
struct shoal_ct_val *shoal_ct_dict_lookup(const struct shoal_ct_dict *d,
                                          struct shoal_ct_val key);

/* Append n bytes; SHOAL_ERANGE past the output limit. */
int shoal_ct_buf_put(struct shoal_ct_ctx *c, struct shoal_ct_buf *b,
                     const char *p, size_t n);
/* Move b's text into the arena as *out and free b (also on failure). */
int shoal_ct_buf_finish(struct shoal_ct_ctx *c, struct shoal_ct_buf *b,
                        struct shoal_ct_str *out);

/* Python str(v) / repr(v) appended to b. */
int shoal_ct_write_str(struct shoal_ct_ctx *c, struct shoal_ct_buf *b,
                       struct shoal_ct_val v, int depth);
int shoal_ct_write_repr(struct shoal_ct_ctx *c, struct shoal_ct_buf *b,
                        struct shoal_ct_val v, int depth);
/* str(v) as a string value (no copy when v is already a string). */
int shoal_ct_to_str(struct shoal_ct_ctx *c, struct shoal_ct_val v,
                    struct shoal_ct_str *out);
/* Python float repr ("0.5", "1e+16"); out needs 32 bytes. */
void shoal_ct_format_float(double f, char *out);

int shoal_ct_truthy(struct shoal_ct_val v);
/* Python ==; 1 if equal. Never fails (too-deep values compare unequal). */
int shoal_ct_equal(struct shoal_ct_val a, struct shoal_ct_val b, int depth);
/* The items a for loop would visit: list items, dict keys, string
 * characters; undefined gives an empty list. */
int shoal_ct_iterate(struct shoal_ct_ctx *c, struct shoal_ct_val v,
                     const struct shoal_ct_list **out);
/* obj.name (dict key, namespace attribute, loop attribute) or undefined. */
struct shoal_ct_val shoal_ct_get_attr(struct shoal_ct_val obj,
                                      struct shoal_ct_str name);
const char *shoal_ct_kind_name(enum shoal_ct_kind kind);

/* Code points in s (Python len). */
size_t shoal_ct_utf8_len(struct shoal_ct_str s);
/* Byte offsets of the len + 1 code point boundaries of s, in the arena. */
size_t *shoal_ct_utf8_offsets(struct shoal_ct_ctx *c, struct shoal_ct_str s,
                              size_t *len);

/* Builtins (chat_template_builtins.c). Each returns 0 or the recorded error;
 * an unknown name is SHOAL_EINVAL naming it. */
int shoal_ct_filter(struct shoal_ct_ctx *c, struct shoal_ct_str name,
                    struct shoal_ct_val v, const struct shoal_ct_args *a,
                    struct shoal_ct_val *out);
int shoal_ct_test(struct shoal_ct_ctx *c, struct shoal_ct_str name,
                  struct shoal_ct_val v, const struct shoal_ct_val *targs,
                  size_t n_targs, int *result);
int shoal_ct_method(struct shoal_ct_ctx *c, struct shoal_ct_val obj,
                    struct shoal_ct_str name, const struct shoal_ct_args *a,
                    struct shoal_ct_val *out);
int shoal_ct_global(struct shoal_ct_ctx *c, struct shoal_ct_str name,
                    const struct shoal_ct_args *a, struct shoal_ct_val *out);
/* Python's fmt.format(*a) (chat_template_format.c): '{}', '{0}', '{name}',
 * '{0.attr}', '{0[key]}', '!s'/'!r', '{{'/'}}'. Format specs after ':' fail
 * with SHOAL_EINVAL naming the field, as do unknown fields and mixed manual
 * and automatic numbering. */
int shoal_ct_str_format(struct shoal_ct_ctx *c, struct shoal_ct_str fmt,
                        const struct shoal_ct_args *a, struct shoal_ct_val *out);
/* The global function named name as a SHOAL_CT_FUNC value (what a bare
 * `range` evaluates to), or undefined when there is none. */
struct shoal_ct_val shoal_ct_global_lookup(struct shoal_ct_str name);

#endif
