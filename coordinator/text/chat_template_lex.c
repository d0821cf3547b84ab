/* chat_template_lex: the chat template lexer (see chat_template_impl.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_impl.h"
#include "util.h"

/* ---- lexer ------------------------------------------------------------
 * Mirrors jinja2's lexer with trim_blocks and lstrip_blocks on: the source's
 * newlines are normalized to "\n" and one trailing newline is dropped; text
 * before `{%-`/`{{-`/`{#-` loses its trailing whitespace, text after
 * `-%}`/`-}}`/`-#}` its leading whitespace; a block or comment tag alone on
 * its line (after spaces/tabs) takes the indentation with it, and the newline
 * right after `%}` or `#}` is dropped; `{%+` and `+%}` turn those two off. */

#define MAX_BRACKETS 64 /* open ( [ { inside one tag */

struct lexer {
    const char *src;         /* normalized source, in the template arena */
    size_t n;                /* bytes */
    size_t pos;
    int line;                /* line of pos */
    size_t line_start;       /* offset of the first byte of that line */
    struct shoal_ct_token *toks;      /* [n_toks], xrealloc'd */
    size_t n_toks, cap_toks;
    size_t open[MAX_BRACKETS];     /* token index of each open bracket */
    struct shoal_ct_arena *arena;
    struct shoal_err *err;
};

int shoal_ct_syntax_error(struct shoal_err *err, int line, int col,
                          const char *fmt, ...)
{
    char msg[SHOAL_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return shoal_err_set(err, SHOAL_EFORMAT,
                         "chat template line %d column %d: %s", line, col, msg);
}

/* Syntax error at line/col of this template; returns SHOAL_EFORMAT. */
#define lx_fail(lx, line, col, ...) shoal_ct_syntax_error((lx)->err, line, col, __VA_ARGS__)

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' ||
           c == '\f';
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Bytes >= 0x80 count as letters: jinja2 accepts Unicode identifiers. */
static int is_name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           (unsigned char)c >= 0x80;
}

static int is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/* Move pos forward to `to`, keeping line/line_start current. */
static void lx_advance(struct lexer *lx, size_t to)
{
    for (size_t k = lx->pos; k < to; k++)
        if (lx->src[k] == '\n') {
            lx->line++;
            lx->line_start = k + 1;
        }
    lx->pos = to;
}

static int lx_col(const struct lexer *lx)
{
    return (int)(lx->pos - lx->line_start) + 1;
}

static struct shoal_ct_token *lx_push(struct lexer *lx, enum shoal_ct_tok_kind kind)
{
    if (lx->n_toks == lx->cap_toks) {
        lx->cap_toks = lx->cap_toks ? 2 * lx->cap_toks : 64;
        lx->toks = shoal_xrealloc(lx->toks, lx->cap_toks * sizeof *lx->toks);
    }
    struct shoal_ct_token *t = &lx->toks[lx->n_toks++];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->line = lx->line;
    t->col = lx_col(lx);
    return t;
}

static void lx_data(struct lexer *lx, size_t from, size_t to)
{
    if (to <= from)
        return;
    struct shoal_ct_token *t = lx_push(lx, SHOAL_CT_TK_DATA);
    t->s.p = lx->src + from;
    t->s.n = to - from;
}

static int starts(const struct lexer *lx, size_t at, const char *lit)
{
    size_t k = strlen(lit);
    return at <= lx->n && lx->n - at >= k && memcmp(lx->src + at, lit, k) == 0;
}

/* Apply jinja's OptionalLStrip to the text [from, *to) that precedes a tag
 * with whitespace-control sign `sign`; lstrip only for block/comment tags. */
static void strip_before_tag(const struct lexer *lx, size_t from, size_t *to,
                             char sign, int lstrip, int line_starting)
{
    size_t end = *to;
    if (sign == '-') {
        while (end > from && is_ws(lx->src[end - 1]))
            end--;
    } else if (sign != '+' && lstrip) {
        size_t l = end;
        while (l > from && lx->src[l - 1] != '\n')
            l--;
        if ((l > from || line_starting) && l < end) {
            size_t k = l;
            while (k < end && is_ws(lx->src[k]))
                k++;
            if (k == end)
                end = l;
        }
    }
    *to = end;
}

/* Encode code point cp as UTF-8 into out (4 bytes room); returns bytes. */
static size_t utf8_put(char *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int hex_val(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Lex a quoted string at lx->pos, unescaping like Python's unicode-escape
 * codec (which jinja2 applies): \n \t \r \\ \' \" \a \b \f \v, octal, \xHH,
 * \uHHHH, \UHHHHHHHH, backslash-newline; other escapes stay as written. */
static int lx_string(struct lexer *lx)
{
    const char *s = lx->src;
    char q = s[lx->pos];
    int line = lx->line, col = lx_col(lx);
    size_t k = lx->pos + 1;
    while (k < lx->n && s[k] != q) {
        if (s[k] == '\\' && k + 1 < lx->n)
            k++;
        k++;
    }
    if (k >= lx->n)
        return lx_fail(lx, line, col, "unterminated string literal");
    size_t body = lx->pos + 1, body_n = k - body;
    /* Unescaping never grows the text (\x, \u, \U take at least as many
     * source bytes as their UTF-8), so body_n bytes suffice. */
    char *out = shoal_ct_arena_alloc(lx->arena, body_n + 1);
    if (!out)
        return shoal_err_set(lx->err, SHOAL_ENOMEM,
                             "chat template: out of memory lexing a string");
    size_t o = 0;
    for (size_t j = body; j < k; j++) {
        char c = s[j];
        if (c != '\\') {
            out[o++] = c;
            continue;
        }
        char e = s[++j];
        int ndig = 0;
        switch (e) {
        case '\n': break;
        case '\\': out[o++] = '\\'; break;
        case '\'': out[o++] = '\''; break;
        case '"':  out[o++] = '"'; break;
        case 'n':  out[o++] = '\n'; break;
        case 't':  out[o++] = '\t'; break;
        case 'r':  out[o++] = '\r'; break;
        case 'a':  out[o++] = '\a'; break;
        case 'b':  out[o++] = '\b'; break;
        case 'f':  out[o++] = '\f'; break;
        case 'v':  out[o++] = '\v'; break;
        case 'x':  ndig = 2; break;
        case 'u':  ndig = 4; break;
        case 'U':  ndig = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = 0;
                int m = 0;
                while (m < 3 && j < k && s[j] >= '0' && s[j] <= '7') {
                    v = v * 8 + (uint32_t)(s[j] - '0');
                    j++;
                    m++;
                }
                j--;
                o += utf8_put(out + o, v);
            } else {
                out[o++] = '\\';
                out[o++] = e;
            }
        }
        if (ndig) {
            uint32_t v = 0;
            for (int m = 0; m < ndig; m++) {
                int h = j + 1 + (size_t)m < k ? hex_val(s[j + 1 + m]) : -1;
                if (h < 0)
                    return lx_fail(lx, line, col,
                                   "truncated \\%c escape in string literal; "
                                   "expected %d hex digits", e, ndig);
                v = v * 16 + (uint32_t)h;
            }
            if (v > 0x10FFFF)
                return lx_fail(lx, line, col,
                               "escape \\U%08X is past U+10FFFF", (unsigned)v);
            j += (size_t)ndig;
            o += utf8_put(out + o, v);
        }
    }
    out[o] = '\0';
    struct shoal_ct_token *t = lx_push(lx, SHOAL_CT_TK_STRING);
    t->line = line;
    t->col = col;
    t->s.p = out;
    t->s.n = o;
    lx_advance(lx, k + 1);
    return 0;
}

/* Digits with optional '_' separators (Python style); returns the end. */
static size_t scan_digits(const char *s, size_t k, size_t n, int base)
{
    while (k < n) {
        char c = s[k];
        int v = c == '_' ? 0 : hex_val(c);
        if (c != '_' && (v < 0 || v >= base))
            break;
        k++;
    }
    return k;
}

static int lx_number(struct lexer *lx)
{
    const char *s = lx->src;
    size_t start = lx->pos, k = start, n = lx->n;
    int line = lx->line, col = lx_col(lx);
    int base = 10, is_float = 0;
    if (s[k] == '0' && k + 1 < n && s[k + 1] && strchr("xXoObB", s[k + 1])) {
        char b = (char)(s[k + 1] | 0x20);
        base = b == 'x' ? 16 : b == 'o' ? 8 : 2;
        k = scan_digits(s, k + 2, n, base);
    } else {
        k = scan_digits(s, k, n, 10);
        if (k + 1 < n && s[k] == '.' && is_digit(s[k + 1])) {
            is_float = 1;
            k = scan_digits(s, k + 1, n, 10);
        }
        if (k < n && (s[k] == 'e' || s[k] == 'E')) {
            size_t e = k + 1;
            if (e < n && (s[e] == '+' || s[e] == '-'))
                e++;
            if (e < n && is_digit(s[e])) {
                is_float = 1;
                k = scan_digits(s, e, n, 10);
            }
        }
    }
    char buf[128];
    size_t m = 0;
    for (size_t j = base == 10 ? start : start + 2; j < k && m + 1 < sizeof buf; j++)
        if (s[j] != '_')
            buf[m++] = s[j];
    buf[m] = '\0';
    struct shoal_ct_token *t = lx_push(lx, is_float ? SHOAL_CT_TK_FLOAT : SHOAL_CT_TK_INT);
    t->line = line;
    t->col = col;
    errno = 0;
    if (is_float) {
        t->f = strtod(buf, NULL);
    } else {
        char *end;
        t->i = strtoll(buf, &end, base);
        if (errno == ERANGE || m == 0)
            return lx_fail(lx, line, col,
                           "integer literal '%.*s' is not a 64-bit integer",
                           (int)(k - start), s + start);
    }
    lx_advance(lx, k);
    return 0;
}

static int lx_operator(struct lexer *lx, int *depth)
{
    static const struct { const char *text; int op; } multi[] = {
        {"**", SHOAL_CT_P_POW}, {"//", SHOAL_CT_P_FLOORDIV},
        {"==", SHOAL_CT_P_EQ},  {"!=", SHOAL_CT_P_NE},
        {"<=", SHOAL_CT_P_LE},  {">=", SHOAL_CT_P_GE},
    };
    for (size_t m = 0; m < sizeof multi / sizeof multi[0]; m++)
        if (starts(lx, lx->pos, multi[m].text)) {
            lx_push(lx, SHOAL_CT_TK_OP)->op = multi[m].op;
            lx_advance(lx, lx->pos + 2);
            return 0;
        }
    char c = lx->src[lx->pos];
    if (!strchr("+-*/%~<>=()[]{}.:,|", c) || c == '\0')
        return lx_fail(lx, lx->line, lx_col(lx),
                       "unexpected character '%c' (0x%02x) inside a tag",
                       c >= 0x20 && c < 0x7f ? c : '?', (unsigned char)c);
    if (c == '(' || c == '[' || c == '{') {
        if (*depth == MAX_BRACKETS)
            return lx_fail(lx, lx->line, lx_col(lx),
                           "brackets nested deeper than %d",
                           MAX_BRACKETS);
        lx->open[(*depth)++] = lx->n_toks;
    } else if (c == ')' || c == ']' || c == '}') {
        if (*depth == 0)
            return lx_fail(lx, lx->line, lx_col(lx),
                           "unexpected '%c'", c);
        int want = lx->toks[lx->open[*depth - 1]].op;
        want = want == '(' ? ')' : want == '[' ? ']' : '}';
        if (c != want)
            return lx_fail(lx, lx->line, lx_col(lx),
                           "unexpected '%c'; expected '%c'", c, want);
        (*depth)--;
    }
    lx_push(lx, SHOAL_CT_TK_OP)->op = c;
    lx_advance(lx, lx->pos + 1);
    return 0;
}

/* Lex the inside of a `{{` or `{%` tag up to its end delimiter. Returns 0
 * and sets *line_starting from the delimiter's last consumed byte. */
static int lx_tag(struct lexer *lx, int is_block, int open_line, int open_col,
                  int *line_starting)
{
    int depth = 0;
    const char *close = is_block ? "%}" : "}}";
    for (;;) {
        size_t p = lx->pos;
        if (p >= lx->n && depth > 0) {
            const struct shoal_ct_token *t = &lx->toks[lx->open[depth - 1]];
            return lx_fail(lx, t->line, t->col,
                           "'%c' is never closed", t->op);
        }
        if (p >= lx->n)
            return lx_fail(lx, open_line, open_col,
                           "'%s' tag is never closed; expected '%s'",
                           is_block ? "{%" : "{{", close);
        if (depth == 0) {
            size_t end = 0;
            if (is_block && lx->src[p] == '+' && starts(lx, p + 1, close)) {
                end = p + 3;
            } else if (lx->src[p] == '-' && starts(lx, p + 1, close)) {
                end = p + 3;
                while (end < lx->n && is_ws(lx->src[end]))
                    end++;
            } else if (starts(lx, p, close)) {
                end = p + 2;
                if (is_block && end < lx->n && lx->src[end] == '\n')
                    end++; /* trim_blocks */
            }
            if (end) {
                lx_push(lx, is_block ? SHOAL_CT_TK_BLOCK_END : SHOAL_CT_TK_VAR_END);
                *line_starting = lx->src[end - 1] == '\n';
                lx_advance(lx, end);
                return 0;
            }
        }
        char c = lx->src[p];
        int rc = 0;
        if (is_ws(c)) {
            size_t k = p;
            while (k < lx->n && is_ws(lx->src[k]))
                k++;
            lx_advance(lx, k);
        } else if (is_digit(c)) {
            rc = lx_number(lx);
        } else if (is_name_start(c)) {
            size_t k = p;
            while (k < lx->n && is_name_char(lx->src[k]))
                k++;
            struct shoal_ct_token *t = lx_push(lx, SHOAL_CT_TK_NAME);
            t->s.p = lx->src + p;
            t->s.n = k - p;
            lx_advance(lx, k);
        } else if (c == '\'' || c == '"') {
            rc = lx_string(lx);
        } else {
            rc = lx_operator(lx, &depth);
        }
        if (rc)
            return rc;
    }
}

/* `{% raw %}...{% endraw %}`: returns 1 and emits the body as data if the
 * block tag whose name starts at p opens a raw block, 0 if it does not, <0
 * on error. */
static int lx_raw(struct lexer *lx, size_t p, int *line_starting)
{
    size_t k = p;
    while (k < lx->n && is_ws(lx->src[k]))
        k++;
    if (!starts(lx, k, "raw") || (k + 3 < lx->n && is_name_char(lx->src[k + 3])))
        return 0;
    k += 3;
    while (k < lx->n && is_ws(lx->src[k]))
        k++;
    if (starts(lx, k, "-%}")) {
        k += 3;
        while (k < lx->n && is_ws(lx->src[k]))
            k++;
    } else if (starts(lx, k, "%}")) {
        k += 2;
    } else {
        return 0;
    }
    int line = lx->line, col = lx_col(lx);
    /* find {%[-+]? \s* endraw \s* [+-]?%} */
    for (size_t q = k; q + 1 < lx->n; q++) {
        if (lx->src[q] != '{' || lx->src[q + 1] != '%')
            continue;
        size_t r = q + 2;
        char sign = 0;
        if (r < lx->n && (lx->src[r] == '-' || lx->src[r] == '+'))
            sign = lx->src[r++];
        while (r < lx->n && is_ws(lx->src[r]))
            r++;
        if (!starts(lx, r, "endraw"))
            continue;
        r += 6;
        while (r < lx->n && is_ws(lx->src[r]))
            r++;
        size_t end;
        if (starts(lx, r, "+%}")) {
            end = r + 3;
        } else if (starts(lx, r, "-%}")) {
            end = r + 3;
            while (end < lx->n && is_ws(lx->src[end]))
                end++;
        } else if (starts(lx, r, "%}")) {
            end = r + 2;
            if (end < lx->n && lx->src[end] == '\n')
                end++;
        } else {
            continue;
        }
        size_t text_end = q;
        strip_before_tag(lx, k, &text_end, sign, 1, 0);
        lx_advance(lx, k);
        lx_data(lx, k, text_end);
        lx_advance(lx, end);
        *line_starting = lx->src[end - 1] == '\n';
        return 1;
    }
    return lx_fail(lx, line, col, "'{%% raw %%}' block is never closed; "
                   "expected '{%% endraw %%}'");
}

static int lex_all(struct lexer *lx)
{
    int line_starting = 1;
    while (lx->pos < lx->n) {
        size_t pos = lx->pos, tag = pos;
        while (tag + 1 < lx->n &&
               !(lx->src[tag] == '{' &&
                 (lx->src[tag + 1] == '{' || lx->src[tag + 1] == '%' ||
                  lx->src[tag + 1] == '#')))
            tag++;
        if (tag + 1 >= lx->n) {
            lx_data(lx, pos, lx->n);
            lx_advance(lx, lx->n);
            break;
        }
        char kind = lx->src[tag + 1];
        char sign = 0;
        if (tag + 2 < lx->n && (lx->src[tag + 2] == '-' || lx->src[tag + 2] == '+'))
            sign = lx->src[tag + 2];
        size_t text_end = tag;
        strip_before_tag(lx, pos, &text_end, sign, kind != '{', line_starting);
        lx_data(lx, pos, text_end);
        lx_advance(lx, tag);
        int open_line = lx->line, open_col = lx_col(lx);
        size_t p = tag + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t q = p;
            while (q + 1 < lx->n && !(lx->src[q] == '#' && lx->src[q + 1] == '}'))
                q++;
            if (q + 1 >= lx->n)
                return lx_fail(lx, open_line, open_col,
                               "comment is never closed; expected '#}'");
            size_t end = q + 2;
            if (q > p && lx->src[q - 1] == '-') {
                while (end < lx->n && is_ws(lx->src[end]))
                    end++;
            } else if (!(q > p && lx->src[q - 1] == '+')) {
                if (end < lx->n && lx->src[end] == '\n')
                    end++; /* trim_blocks applies to comments too */
            }
            line_starting = lx->src[end - 1] == '\n';
            lx_advance(lx, end);
            continue;
        }
        if (kind == '%') {
            int rc = lx_raw(lx, p, &line_starting);
            if (rc < 0)
                return rc;
            if (rc > 0)
                continue;
        }
        lx_push(lx, kind == '%' ? SHOAL_CT_TK_BLOCK_BEGIN : SHOAL_CT_TK_VAR_BEGIN);
        lx_advance(lx, p);
        int rc = lx_tag(lx, kind == '%', open_line, open_col, &line_starting);
        if (rc)
            return rc;
    }
    lx_push(lx, SHOAL_CT_TK_EOF);
    return 0;
}

/* Normalize \r\n and \r to \n and drop one trailing newline (jinja2's
 * keep_trailing_newline=False). Returns a copy in the arena. */
static char *normalize_source(struct shoal_ct_arena *a, const char *src,
                              size_t *out_n)
{
    size_t n = strlen(src);
    char *out = shoal_ct_arena_alloc(a, n + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t k = 0; k < n; k++) {
        if (src[k] == '\r') {
            out[o++] = '\n';
            if (k + 1 < n && src[k + 1] == '\n')
                k++;
        } else {
            out[o++] = src[k];
        }
    }
    if (o > 0 && out[o - 1] == '\n')
        o--;
    out[o] = '\0';
    *out_n = o;
    return out;
}

int shoal_ct_lex(struct shoal_ct_arena *arena, const char *source,
                 struct shoal_ct_token **toks, size_t *n_toks,
                 struct shoal_err *err)
{
    struct lexer lx = {.arena = arena, .err = err, .line = 1};
    lx.src = normalize_source(arena, source, &lx.n);
    if (!lx.src)
        return shoal_err_set(err, SHOAL_ENOMEM, "chat template: out of memory "
                             "copying %zu bytes of source", strlen(source));
    int rc = lex_all(&lx);
    if (rc) {
        free(lx.toks);
        return rc;
    }
    *toks = lx.toks;
    *n_toks = lx.n_toks;
    return 0;
}
