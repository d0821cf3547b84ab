/* tokenizer_hf: build a tokenizer from a Hugging Face tokenizer.json (and
 * tokenizer_config.json when given).
 *
 * Supported: model BPE (byte-level or with byte_fallback/unk), added
 * tokens (special, lstrip, rstrip, single_word, normalized); normalizers
 * Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip;
 * pre-tokenizers Sequence, ByteLevel, Split, Metaspace, Digits, Whitespace,
 * WhitespaceSplit, Punctuation; post-processors TemplateProcessing,
 * ByteLevel, RobertaProcessing, BertProcessing, Sequence; decoders
 * ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence.
 * Anything else is refused by name (-SHOAL_EUNSUPPORTED).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "log.h"
#include "tokenizer_impl.h"
#include "unicode.h"
#include "util.h"

struct hf {
    const char *name;
    struct shoal_err *err;
    struct shoal_tokenizer *t;
    /* decoder facts, needed to render vocabulary tokens */
    int byte_level;
    int byte_fallback_dec;
    struct {
        char *from, *to;
        size_t from_len, to_len;
    } rep[8];
    size_t n_rep;
    int strip_leading;
};

#define FAIL(h, code, ...) shoal_err_set((h)->err, (code), __VA_ARGS__)

/* Integer value of v, also accepted as an integral real (files decoded
 * with JSON_DECODE_INT_AS_REAL because of a huge unrelated number).
 * Returns 1 and writes *out, or 0. */
static int int_of(json_t *v, json_int_t *out)
{
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 1;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d >= -9007199254740992.0 && d <= 9007199254740992.0 &&
            d == (double)(json_int_t)d) {
            *out = (json_int_t)d;
            return 1;
        }
    }
    return 0;
}

static const char *type_of(json_t *o)
{
    json_t *ty = json_is_object(o) ? json_object_get(o, "type") : NULL;
    return json_is_string(ty) ? json_string_value(ty) : NULL;
}

static int get_bool(json_t *o, const char *key, int dflt)
{
    json_t *v = json_object_get(o, key);
    if (json_is_boolean(v))
        return json_is_true(v);
    return dflt;
}

static const char *get_str(json_t *o, const char *key, size_t *len)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v))
        return NULL;
    if (len)
        *len = json_string_length(v);
    return json_string_value(v);
}

/* Does any node of this (possibly Sequence) component have type ty? */
static int has_type(json_t *o, const char *ty)
{
    const char *t = type_of(o);
    if (!t)
        return 0;
    if (strcmp(t, ty) == 0)
        return 1;
    if (strcmp(t, "Sequence") == 0) {
        const char *keys[] = {"pretokenizers", "decoders", "normalizers",
                              "processors"};
        for (size_t k = 0; k < 4; k++) {
            json_t *arr = json_object_get(o, keys[k]);
            size_t i;
            json_t *x;
            if (json_is_array(arr))
                json_array_foreach(arr, i, x) if (has_type(x, ty)) return 1;
        }
    }
    return 0;
}

/* Pattern object {"String": s} or {"Regex": r}. */
static int get_pattern(struct hf *h, json_t *o, const char *where,
                       const char **pat, size_t *len, int *literal)
{
    json_t *p = json_object_get(o, "pattern");
    json_t *s = json_is_object(p) ? json_object_get(p, "String") : NULL;
    json_t *r = json_is_object(p) ? json_object_get(p, "Regex") : NULL;
    if (json_is_string(s)) {
        *pat = json_string_value(s);
        *len = json_string_length(s);
        *literal = 1;
        return 0;
    }
    if (json_is_string(r)) {
        *pat = json_string_value(r);
        *len = json_string_length(r);
        *literal = 0;
        return 0;
    }
    return FAIL(h, SHOAL_EFORMAT,
                "tokenizer.json '%s': %s has no pattern {\"String\"|\"Regex\"}",
                h->name, where);
}

/* --- normalizers ------------------------------------------------------- */

static int parse_normalizer(struct hf *h, json_t *o)
{
    struct shoal_tokenizer *t = h->t;
    if (!o || json_is_null(o))
        return 0;
    const char *ty = type_of(o);
    if (!ty)
        return FAIL(h, SHOAL_EFORMAT,
                    "tokenizer.json '%s': normalizer without a type",
                    h->name);
    if (strcmp(ty, "Sequence") == 0) {
        json_t *arr = json_object_get(o, "normalizers");
        size_t i;
        json_t *x;
        if (!json_is_array(arr))
            return FAIL(h, SHOAL_EFORMAT,
                        "tokenizer.json '%s': normalizer Sequence has no "
                        "\"normalizers\" array",
                        h->name);
        json_array_foreach(arr, i, x)
        {
            int rc = parse_normalizer(h, x);
            if (rc)
                return rc;
        }
        return 0;
    }
    static const struct {
        const char *name;
        enum shoal_tok_norm_kind kind;
    } simple[] = {{"NFC", SHOAL_TOK_NORM_NFC},
                  {"NFD", SHOAL_TOK_NORM_NFD},
                  {"NFKC", SHOAL_TOK_NORM_NFKC},
                  {"NFKD", SHOAL_TOK_NORM_NFKD},
                  {"Lowercase", SHOAL_TOK_NORM_LOWERCASE}};
    for (size_t k = 0; k < sizeof simple / sizeof simple[0]; k++)
        if (strcmp(ty, simple[k].name) == 0) {
            shoal_tok_add_norm(t, simple[k].kind);
            return 0;
        }
    if (strcmp(ty, "Prepend") == 0) {
        size_t n;
        const char *s = get_str(o, "prepend", &n);
        if (!s)
            return FAIL(h, SHOAL_EFORMAT,
                        "tokenizer.json '%s': Prepend normalizer has no "
                        "\"prepend\" string",
                        h->name);
        struct shoal_tok_norm_op *op = shoal_tok_add_norm(t, SHOAL_TOK_NORM_PREPEND);
        op->a = shoal_tok_memdup(s, n);
        op->a_len = n;
        return 0;
    }
    if (strcmp(ty, "Replace") == 0) {
        const char *pat;
        size_t pl, cl;
        int literal;
        int rc = get_pattern(h, o, "Replace normalizer", &pat, &pl, &literal);
        if (rc)
            return rc;
        const char *content = get_str(o, "content", &cl);
        if (!content)
            return FAIL(h, SHOAL_EFORMAT,
                        "tokenizer.json '%s': Replace normalizer has no "
                        "\"content\" string",
                        h->name);
        struct shoal_tok_norm_op *op = shoal_tok_add_norm(
            t, literal ? SHOAL_TOK_NORM_REPLACE : SHOAL_TOK_NORM_REPLACE_REGEX);
        op->a = shoal_tok_memdup(pat, pl);
        op->a_len = pl;
        op->b = shoal_tok_memdup(content, cl);
        op->b_len = cl;
        if (!literal) {
            char what[160];
            snprintf(what, sizeof what,
                     "tokenizer.json '%s': Replace normalizer", h->name);
            op->re = shoal_tok_regex_compile(pat, pl, 0, what, h->err);
            if (!op->re)
                return h->err ? h->err->code : SHOAL_EFORMAT;
        }
        return 0;
    }
    if (strcmp(ty, "Strip") == 0) {
        struct shoal_tok_norm_op *op = shoal_tok_add_norm(t, SHOAL_TOK_NORM_STRIP);
        op->left = get_bool(o, "strip_left", 1);
        op->right = get_bool(o, "strip_right", 1);
        return 0;
    }
    return FAIL(h, SHOAL_EUNSUPPORTED,
                "tokenizer.json '%s': normalizer '%s' is not supported; "
                "expected Sequence, NFC, NFD, NFKC, NFKD, Lowercase, "
                "Prepend, Replace or Strip",
                h->name, ty);
}

/* --- pre-tokenizers ---------------------------------------------------- */

static int add_split(struct hf *h, const char *pat, size_t len, int literal,
                     enum shoal_tok_split behavior, int invert,
                     const char *what)
{
    struct shoal_tok_pre_op *op = shoal_tok_add_pre(h->t, SHOAL_TOK_PRE_SPLIT);
    op->behavior = behavior;
    op->invert = invert;
    char w[160];
    snprintf(w, sizeof w, "tokenizer.json '%s': %s", h->name, what);
    op->re = shoal_tok_regex_compile(pat, len, literal, w, h->err);
    if (!op->re)
        return h->err && h->err->code ? h->err->code : SHOAL_EFORMAT;
    return 0;
}

static int parse_behavior(struct hf *h, json_t *o, enum shoal_tok_split dflt,
                          enum shoal_tok_split *out)
{
    const char *b = get_str(o, "behavior", NULL);
    if (!b) {
        *out = dflt;
        return 0;
    }
    static const struct {
        const char *name;
        enum shoal_tok_split v;
    } m[] = {{"Removed", SHOAL_TOK_SPLIT_REMOVED},
             {"Isolated", SHOAL_TOK_SPLIT_ISOLATED},
             {"MergedWithPrevious", SHOAL_TOK_SPLIT_MERGED_PREV},
             {"MergedWithNext", SHOAL_TOK_SPLIT_MERGED_NEXT},
             {"Contiguous", SHOAL_TOK_SPLIT_CONTIGUOUS}};
    for (size_t k = 0; k < sizeof m / sizeof m[0]; k++)
        if (strcmp(b, m[k].name) == 0) {
            *out = m[k].v;
            return 0;
        }
    return FAIL(h, SHOAL_EFORMAT,
                "tokenizer.json '%s': split behavior '%s'; expected "
                "Removed, Isolated, MergedWithPrevious, MergedWithNext or "
                "Contiguous",
                h->name, b);
}

static int add_metaspace(struct hf *h, json_t *o)
{
    size_t rl = 0;
    const char *rep = get_str(o, "replacement", &rl);
    if (!rep || rl == 0)
        rep = "\xe2\x96\x81", rl = 3;
    const char *scheme = get_str(o, "prepend_scheme", NULL);
    int prepend = 1;
    enum shoal_tok_prepend_scheme ps = SHOAL_TOK_PREPEND_ALWAYS;
    if (scheme) {
        if (strcmp(scheme, "never") == 0)
            prepend = 0;
        else if (strcmp(scheme, "first") == 0)
            ps = SHOAL_TOK_PREPEND_FIRST;
        else if (strcmp(scheme, "always") != 0)
            return FAIL(h, SHOAL_EFORMAT,
                        "tokenizer.json '%s': Metaspace prepend_scheme "
                        "'%s'; expected always, first or never",
                        h->name, scheme);
    } else {
        prepend = get_bool(o, "add_prefix_space", 1);
    }
    struct shoal_tok_pre_op *op =
        shoal_tok_add_pre(h->t, SHOAL_TOK_PRE_REPLACE_SPACE);
    op->a = shoal_tok_memdup(rep, rl);
    op->a_len = rl;
    if (prepend) {
        op = shoal_tok_add_pre(h->t, SHOAL_TOK_PRE_PREPEND);
        op->a = shoal_tok_memdup(rep, rl);
        op->a_len = rl;
        op->scheme = ps;
    }
    if (get_bool(o, "split", 1))
        return add_split(h, rep, rl, 1, SHOAL_TOK_SPLIT_MERGED_NEXT, 0,
                         "Metaspace");
    return 0;
}

static int parse_pre(struct hf *h, json_t *o, int last)
{
    if (!o || json_is_null(o))
        return 0;
    const char *ty = type_of(o);
    if (!ty)
        return FAIL(h, SHOAL_EFORMAT,
                    "tokenizer.json '%s': pre_tokenizer without a type",
                    h->name);
    if (strcmp(ty, "Sequence") == 0) {
        json_t *arr = json_object_get(o, "pretokenizers");
        size_t i, n;
        json_t *x;
        if (!json_is_array(arr))
            return FAIL(h, SHOAL_EFORMAT,
                        "tokenizer.json '%s': pre_tokenizer Sequence has "
                        "no \"pretokenizers\" array",
                        h->name);
        n = json_array_size(arr);
        json_array_foreach(arr, i, x)
        {
            int rc = parse_pre(h, x, last && i + 1 == n);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (strcmp(ty, "ByteLevel") == 0) {
        /* The byte mapping itself is implicit (vocabularies are stored as
         * raw bytes), which is only right when nothing splits after it. */
        if (!last)
            return FAIL(h, SHOAL_EUNSUPPORTED,
                        "tokenizer.json '%s': a ByteLevel pre-tokenizer "
                        "followed by other pre-tokenizers is not supported",
                        h->name);
        h->byte_level = 1;
        if (get_bool(o, "add_prefix_space", 0)) {
            struct shoal_tok_pre_op *op =
                shoal_tok_add_pre(h->t, SHOAL_TOK_PRE_PREPEND);
            op->a = shoal_tok_memdup(" ", 1);
            op->a_len = 1;
            op->scheme = SHOAL_TOK_PREPEND_ALWAYS;
        }
        if (get_bool(o, "use_regex", 1))
            return add_split(h, shoal_tok_gpt2_regex,
                             strlen(shoal_tok_gpt2_regex), 0,
                             SHOAL_TOK_SPLIT_ISOLATED, 0, "ByteLevel");
        return 0;
    }
    if (strcmp(ty, "Split") == 0) {
        const char *pat;
        size_t pl;
        int literal, rc;
        enum shoal_tok_split b;
        if ((rc = get_pattern(h, o, "Split pre-tokenizer", &pat, &pl,
                              &literal)) ||
            (rc = parse_behavior(h, o, SHOAL_TOK_SPLIT_ISOLATED, &b)))
            return rc;
        return add_split(h, pat, pl, literal, b, get_bool(o, "invert", 0),
                         "Split pre-tokenizer");
    }
    if (strcmp(ty, "Metaspace") == 0)
        return add_metaspace(h, o);
    if (strcmp(ty, "Digits") == 0) {
        const char *re = get_bool(o, "individual_digits", 0) ? "\\p{N}"
                                                            : "\\p{N}+";
        return add_split(h, re, strlen(re), 0, SHOAL_TOK_SPLIT_ISOLATED, 0,
                         "Digits");
    }
    if (strcmp(ty, "Whitespace") == 0) {
        const char *re = "\\w+|[^\\w\\s]+";
        return add_split(h, re, strlen(re), 0, SHOAL_TOK_SPLIT_REMOVED, 1,
                         "Whitespace");
    }
    if (strcmp(ty, "WhitespaceSplit") == 0) {
        const char *re = "\\s+";
        return add_split(h, re, strlen(re), 0, SHOAL_TOK_SPLIT_REMOVED, 0,
                         "WhitespaceSplit");
    }
    if (strcmp(ty, "Punctuation") == 0) {
        enum shoal_tok_split b;
        int rc = parse_behavior(h, o, SHOAL_TOK_SPLIT_ISOLATED, &b);
        const char *re = "[\\p{P}!-/:-@\\[-`{-~]";
        return rc ? rc
                  : add_split(h, re, strlen(re), 0, b, 0, "Punctuation");
    }
    return FAIL(h, SHOAL_EUNSUPPORTED,
                "tokenizer.json '%s': pre-tokenizer '%s' is not supported; "
                "expected Sequence, ByteLevel, Split, Metaspace, Digits, "
                "Whitespace, WhitespaceSplit or Punctuation",
                h->name, ty);
}

/* --- decoders ---------------------------------------------------------- */

static int parse_decoder(struct hf *h, json_t *o)
{
    if (!o || json_is_null(o))
        return 0;
    const char *ty = type_of(o);
    if (!ty)
        return FAIL(h, SHOAL_EFORMAT,
                    "tokenizer.json '%s': decoder without a type", h->name);
    if (strcmp(ty, "Sequence") == 0) {
        json_t *arr = json_object_get(o, "decoders");
        size_t i;
        json_t *x;
        if (!json_is_array(arr))
            return FAIL(h, SHOAL_EFORMAT,
                        "tokenizer.json '%s': decoder Sequence has no "
                        "\"decoders\" array",
                        h->name);
        json_array_foreach(arr, i, x)
        {
            int rc = parse_decoder(h, x);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (strcmp(ty, "ByteLevel") == 0) {
        h->byte_level = 1;
        return 0;
    }
    if (strcmp(ty, "ByteFallback") == 0) {
        h->byte_fallback_dec = 1;
        return 0;
    }
    if (strcmp(ty, "Fuse") == 0)
        return 0; /* pieces are always concatenated */
    if (strcmp(ty, "Replace") == 0 || strcmp(ty, "Metaspace") == 0) {
        const char *from, *to = " ";
        size_t fl, tl = 1;
        if (strcmp(ty, "Replace") == 0) {
            int literal, rc = get_pattern(h, o, "Replace decoder", &from,
                                          &fl, &literal);
            if (rc)
                return rc;
            if (!literal)
                return FAIL(h, SHOAL_EUNSUPPORTED,
                            "tokenizer.json '%s': a Replace decoder with a "
                            "Regex pattern is not supported",
                            h->name);
            to = get_str(o, "content", &tl);
            if (!to)
                return FAIL(h, SHOAL_EFORMAT,
                            "tokenizer.json '%s': Replace decoder has no "
                            "\"content\" string",
                            h->name);
        } else {
            from = get_str(o, "replacement", &fl);
            if (!from || fl == 0)
                from = "\xe2\x96\x81", fl = 3;
            const char *scheme = get_str(o, "prepend_scheme", NULL);
            int prepend = scheme ? strcmp(scheme, "never") != 0
                                 : get_bool(o, "add_prefix_space", 1);
            if (prepend)
                h->strip_leading = 1;
        }
        if (h->n_rep == sizeof h->rep / sizeof h->rep[0])
            return FAIL(h, SHOAL_EUNSUPPORTED,
                        "tokenizer.json '%s': more than %zu Replace "
                        "decoders",
                        h->name, sizeof h->rep / sizeof h->rep[0]);
        h->rep[h->n_rep].from = shoal_tok_memdup(from, fl);
        h->rep[h->n_rep].from_len = fl;
        h->rep[h->n_rep].to = shoal_tok_memdup(to, tl);
        h->rep[h->n_rep].to_len = tl;
        h->n_rep++;
        return 0;
    }
    if (strcmp(ty, "Strip") == 0) {
        size_t cl = 0;
        const char *content = get_str(o, "content", &cl);
        json_t *js = json_object_get(o, "start"), *je = json_object_get(o, "stop");
        json_int_t start = 0, stop = 0;
        int_of(js, &start);
        int_of(je, &stop);
        if (!content || cl != 1 || content[0] != ' ' || start > 1 ||
            start < 0 || stop != 0)
            return FAIL(h, SHOAL_EUNSUPPORTED,
                        "tokenizer.json '%s': Strip decoder supported only "
                        "as content \" \", start 0 or 1, stop 0",
                        h->name);
        if (start == 1)
            h->strip_leading = 1;
        return 0;
    }
    return FAIL(h, SHOAL_EUNSUPPORTED,
                "tokenizer.json '%s': decoder '%s' is not supported; "
                "expected Sequence, ByteLevel, ByteFallback, Fuse, Replace, "
                "Strip or Metaspace",
                h->name, ty);
}

/* --- post-processor ---------------------------------------------------- */

static int32_t token_by_content(struct shoal_tokenizer *t, const char *s)
{
    return shoal_tokenizer_token_id(t, s);
}

static int post_token(struct hf *h, const char *what, json_t *pair,
                      int32_t *id)
{
    /* ["<s>", 0] */
    json_t *v = json_is_array(pair) ? json_array_get(pair, 1) : NULL;
    json_int_t x;
    if (!int_of(v, &x) || x < 0 || (size_t)x >= h->t->n_vocab)
        return FAIL(h, SHOAL_EFORMAT,
                    "tokenizer.json '%s': post_processor %s is not a "
                    "[token, id] pair with an id inside the vocabulary",
                    h->name, what);
    *id = (int32_t)x;
    return 0;
}

static int parse_post(struct hf *h, json_t *o)
{
    struct shoal_tokenizer *t = h->t;
    if (!o || json_is_null(o))
        return 0;
    const char *ty = type_of(o);
    if (!ty)
        return FAIL(h, SHOAL_EFORMAT,
                    "tokenizer.json '%s': post_processor without a type",
                    h->name);
    if (strcmp(ty, "ByteLevel") == 0)
        return 0;
    if (strcmp(ty, "Sequence") == 0) {
        json_t *arr = json_object_get(o, "processors");
        size_t i;
        json_t *x;
        if (!json_is_array(arr))
            return FAIL(h, SHOAL_EFORMAT,
                        "tokenizer.json '%s': post_processor Sequence has "
                        "no \"processors\" array",
                        h->name);
        json_array_foreach(arr, i, x)
        {
            int rc = parse_post(h, x);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (strcmp(ty, "RobertaProcessing") == 0 ||
        strcmp(ty, "BertProcessing") == 0) {
        int32_t cls = -1, sep = -1;
        int rc;
        if ((rc = post_token(h, "cls", json_object_get(o, "cls"), &cls)) ||
            (rc = post_token(h, "sep", json_object_get(o, "sep"), &sep)))
            return rc;
        shoal_tok_add_prefix(t, cls);
        shoal_tok_add_suffix(t, sep);
        return 0;
    }
    if (strcmp(ty, "TemplateProcessing") == 0) {
        json_t *single = json_object_get(o, "single");
        json_t *specials = json_object_get(o, "special_tokens");
        size_t i;
        json_t *item;
        int after = 0;
        if (!json_is_array(single))
            return FAIL(h, SHOAL_EFORMAT,
                        "tokenizer.json '%s': TemplateProcessing has no "
                        "\"single\" array",
                        h->name);
        json_array_foreach(single, i, item)
        {
            if (json_object_get(item, "Sequence")) {
                after = 1;
                continue;
            }
            json_t *st = json_object_get(item, "SpecialToken");
            const char *sid = json_is_object(st) ? get_str(st, "id", NULL)
                                                 : NULL;
            if (!sid)
                return FAIL(h, SHOAL_EFORMAT,
                            "tokenizer.json '%s': TemplateProcessing item "
                            "%zu is neither Sequence nor SpecialToken",
                            h->name, i);
            json_t *spec = json_object_get(specials, sid);
            json_t *ids = json_is_object(spec) ? json_object_get(spec, "ids")
                                               : NULL;
            size_t k;
            json_t *idv;
            if (!json_is_array(ids)) {
                /* no table entry: look the token up by its content */
                int32_t id = token_by_content(t, sid);
                if (id < 0)
                    return FAIL(h, SHOAL_EFORMAT,
                                "tokenizer.json '%s': TemplateProcessing "
                                "special token '%s' is unknown",
                                h->name, sid);
                if (after)
                    shoal_tok_add_suffix(t, id);
                else
                    shoal_tok_add_prefix(t, id);
                continue;
            }
            json_array_foreach(ids, k, idv)
            {
                json_int_t v = -1;
                int_of(idv, &v);
                if (v < 0 || (size_t)v >= t->n_vocab)
                    return FAIL(h, SHOAL_EFORMAT,
                                "tokenizer.json '%s': TemplateProcessing "
                                "special token '%s' has id %" JSON_INTEGER_FORMAT
                                " outside the vocabulary (0..%zu)",
                                h->name, sid, (json_int_t)v, t->n_vocab - 1);
                if (after)
                    shoal_tok_add_suffix(t, (int32_t)v);
                else
                    shoal_tok_add_prefix(t, (int32_t)v);
            }
        }
        return 0;
    }
    return FAIL(h, SHOAL_EUNSUPPORTED,
                "tokenizer.json '%s': post_processor '%s' is not supported; "
                "expected TemplateProcessing, ByteLevel, RobertaProcessing, "
                "BertProcessing or Sequence",
                h->name, ty);
}

/* --- vocabulary -------------------------------------------------------- */

static int parse_byte_token(const char *s, size_t n, uint8_t *out)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return 0;
    unsigned v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else
            return 0;
    }
    *out = (uint8_t)v;
    return 1;
}

/* Render a vocabulary token through the decoder's per-token steps. */
static void render(struct hf *h, const char *s, size_t n, char **out,
                   size_t *out_n)
{
    char *cur = shoal_tok_memdup(s, n);
    size_t cur_n = n;
    for (size_t r = 0; r < h->n_rep; r++) {
        size_t fl = h->rep[r].from_len, tl = h->rep[r].to_len, cnt = 0;
        for (size_t i = 0; i + fl <= cur_n;)
            if (memcmp(cur + i, h->rep[r].from, fl) == 0)
                cnt++, i += fl;
            else
                i++;
        if (cnt == 0)
            continue;
        char *nx = shoal_xmalloc(cur_n + cnt * tl + 1);
        size_t o = 0;
        for (size_t i = 0; i < cur_n;) {
            if (i + fl <= cur_n && memcmp(cur + i, h->rep[r].from, fl) == 0) {
                memcpy(nx + o, h->rep[r].to, tl);
                o += tl;
                i += fl;
            } else {
                nx[o++] = cur[i++];
            }
        }
        free(cur);
        cur = nx;
        cur_n = o;
    }
    *out = cur;
    *out_n = cur_n;
}

static int id_of(struct hf *h, json_t *v, const char *what, const char *tok,
                 json_int_t *id)
{
    json_int_t x;
    int is_int = int_of(v, &x);
    if (!is_int || x < 0 || x >= (json_int_t)SHOAL_TOK_MAX_VOCAB)
        return FAIL(h, SHOAL_EFORMAT,
                    "tokenizer.json '%s': %s '%.60s' has id %s; expected "
                    "an integer in 0..%u",
                    h->name, what, tok,
                    is_int ? "out of range" : "not an integer",
                    SHOAL_TOK_MAX_VOCAB - 1);
    *id = x;
    return 0;
}

/* Ids below 2 x the file's token count + HF_DENSE_SLACK are stored in a
 * table indexed by id; the few above (a toy vocabulary with a model's
 * special tokens at their real ids, e.g. gpt-oss's 199998..200018) in a
 * sorted side table. Real files number their vocab 0..n-1 and put added
 * tokens just above it, so they are all dense; one id near 2^24 in a small
 * file costs one sparse entry instead of a 2^24-entry table. */
#define HF_DENSE_SLACK 1024u

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int load_vocab(struct hf *h, json_t *model, json_t *added)
{
    json_t *vocab = json_object_get(model, "vocab");
    const char *key;
    json_t *v;
    size_t i;
    json_int_t max_id = -1, id = 0;
    if (!json_is_object(vocab))
        return FAIL(h, SHOAL_EFORMAT,
                    "tokenizer.json '%s': model.vocab is not an object",
                    h->name);
    json_object_foreach(vocab, key, v)
    {
        int rc = id_of(h, v, "vocab token", key, &id);
        if (rc)
            return rc;
        if (id > max_id)
            max_id = id;
    }
    if (added && !json_is_array(added) && !json_is_null(added))
        return FAIL(h, SHOAL_EFORMAT,
                    "tokenizer.json '%s': added_tokens is not a list",
                    h->name);
    if (json_is_array(added))
        json_array_foreach(added, i, v)
        {
            const char *c = get_str(v, "content", NULL);
            int rc = id_of(h, json_object_get(v, "id"), "added token",
                           c ? c : "?", &id);
            if (rc)
                return rc;
            if (id > max_id)
                max_id = id;
        }
    if (max_id < 0)
        return FAIL(h, SHOAL_EFORMAT,
                    "tokenizer.json '%s': the vocabulary is empty", h->name);

    /* the table by id stops at the dense limit; ids past it are sparse */
    size_t n_tokens = json_object_size(vocab) +
                      (json_is_array(added) ? json_array_size(added) : 0);
    size_t n_dense = (size_t)max_id + 1, n_sparse = 0;
    if (n_dense > 2 * n_tokens + HF_DENSE_SLACK)
        n_dense = 2 * n_tokens + HF_DENSE_SLACK;
    uint32_t *sparse = shoal_xmalloc((n_tokens ? n_tokens : 1) * sizeof *sparse);
    json_object_foreach(vocab, key, v)
    {
        int_of(v, &id);
        if ((size_t)id >= n_dense)
            sparse[n_sparse++] = (uint32_t)id;
    }
    if (json_is_array(added))
        json_array_foreach(added, i, v)
        {
            int_of(json_object_get(v, "id"), &id);
            if ((size_t)id >= n_dense)
                sparse[n_sparse++] = (uint32_t)id;
        }
    if (n_sparse)
        qsort(sparse, n_sparse, sizeof *sparse, cmp_u32);
    size_t n_distinct = 0;   /* an added token may repeat a vocab id */
    for (size_t k = 0; k < n_sparse; k++)
        if (n_distinct == 0 || sparse[n_distinct - 1] != sparse[k])
            sparse[n_distinct++] = sparse[k];
    struct shoal_tokenizer *t = shoal_tok_new_sparse(h->name, n_dense, sparse,
                                                     n_distinct);
    free(sparse);
    h->t = t;
    int byte_fallback = get_bool(model, "byte_fallback", 0);
    char *tmp = NULL;
    size_t tmp_cap = 0;
    json_object_foreach(vocab, key, v)
    {
        size_t kl = strlen(key);
        int_of(v, &id);
        if (shoal_tok_entry(t, (uint32_t)id)->attr != SHOAL_TOK_UNUSED) {
            free(tmp);
            return FAIL(h, SHOAL_EFORMAT,
                        "tokenizer.json '%s': id %" JSON_INTEGER_FORMAT
                        " is given to two vocab tokens",
                        h->name, id);
        }
        uint32_t attr = SHOAL_TOK_NORMAL | SHOAL_TOK_IN_MODEL;
        uint8_t byte;
        if (h->byte_level) {
            if (tmp_cap < kl + 1) {
                tmp_cap = kl + 1;
                tmp = shoal_xrealloc(tmp, tmp_cap);
            }
            long dl = shoal_bytelevel_decode(key, kl, tmp);
            if (dl >= 0)
                shoal_tok_set(t, (uint32_t)id, tmp, (size_t)dl, tmp,
                              (size_t)dl, 0.0f, attr);
            else
                shoal_tok_set(t, (uint32_t)id, key, kl, key, kl, 0.0f, attr);
        } else if (byte_fallback && parse_byte_token(key, kl, &byte)) {
            shoal_tok_set(t, (uint32_t)id, key, kl, (const char *)&byte, 1,
                          0.0f, SHOAL_TOK_BYTE | SHOAL_TOK_IN_MODEL);
        } else {
            char *piece;
            size_t pn;
            render(h, key, kl, &piece, &pn);
            shoal_tok_set(t, (uint32_t)id, key, kl, piece, pn, 0.0f, attr);
            free(piece);
        }
    }
    free(tmp);

    if (json_is_array(added))
        json_array_foreach(added, i, v)
        {
            size_t cl;
            const char *c = get_str(v, "content", &cl);
            int_of(json_object_get(v, "id"), &id);
            if (!c)
                return FAIL(h, SHOAL_EFORMAT,
                            "tokenizer.json '%s': added token %" JSON_INTEGER_FORMAT
                            " has no \"content\" string",
                            h->name, id);
            int special = get_bool(v, "special", 0);
            uint32_t attr = special ? SHOAL_TOK_CONTROL : SHOAL_TOK_USER_DEFINED;
            if (get_bool(v, "lstrip", 0))
                attr |= SHOAL_TOK_LSTRIP;
            if (get_bool(v, "rstrip", 0))
                attr |= SHOAL_TOK_RSTRIP;
            if (get_bool(v, "single_word", 0))
                attr |= SHOAL_TOK_SINGLE_WORD;
            if (get_bool(v, "normalized", !special))
                attr |= SHOAL_TOK_NORMALIZED;
            struct shoal_tok_entry *e = shoal_tok_entry_mut(t, (uint32_t)id);
            if (e->attr & SHOAL_TOK_IN_MODEL) {
                /* also a model token: keep its model text, render and
                 * match it by the added content */
                e->piece_off = shoal_tok_blob_add(t, c, cl);
                e->piece_len = (uint32_t)cl;
                e->attr = attr | SHOAL_TOK_IN_MODEL;
            } else {
                shoal_tok_set(t, (uint32_t)id, c, cl, c, cl, 0.0f, attr);
            }
        }
    return 0;
}

static int load_merges(struct hf *h, json_t *model)
{
    struct shoal_tokenizer *t = h->t;
    json_t *merges = json_object_get(model, "merges");
    size_t i;
    json_t *m;
    char *buf = NULL;
    size_t cap = 0, skipped = 0;
    if (!merges || json_is_null(merges))
        return 0;
    if (!json_is_array(merges))
        return FAIL(h, SHOAL_EFORMAT,
                    "tokenizer.json '%s': model.merges is not an array",
                    h->name);
    shoal_tok_merges_reserve(t, json_array_size(merges));
    json_array_foreach(merges, i, m)
    {
        const char *l, *r;
        size_t ln, rn;
        if (json_is_string(m)) {
            const char *s = json_string_value(m);
            size_t sl = json_string_length(m);
            const char *sp = sl > 1 ? memchr(s + 1, ' ', sl - 1) : NULL;
            if (!sp) {
                free(buf);
                return FAIL(h, SHOAL_EFORMAT,
                            "tokenizer.json '%s': merge %zu '%.60s' is not "
                            "\"left right\"",
                            h->name, i, s);
            }
            l = s, ln = (size_t)(sp - s), r = sp + 1, rn = sl - ln - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            l = json_string_value(json_array_get(m, 0));
            ln = json_string_length(json_array_get(m, 0));
            r = json_string_value(json_array_get(m, 1));
            rn = json_string_length(json_array_get(m, 1));
        } else {
            free(buf);
            return FAIL(h, SHOAL_EFORMAT,
                        "tokenizer.json '%s': merge %zu is neither \"left "
                        "right\" nor [left, right]",
                        h->name, i);
        }
        if (h->byte_level) {
            if (cap < ln + rn) {
                cap = ln + rn;
                buf = shoal_xrealloc(buf, cap);
            }
            long dl = shoal_bytelevel_decode(l, ln, buf);
            long dr = dl >= 0 ? shoal_bytelevel_decode(r, rn, buf + dl) : -1;
            if (dl >= 0 && dr >= 0) {
                skipped += (size_t)shoal_tok_add_merge(t, buf, (size_t)dl,
                                                       buf + dl, (size_t)dr);
                continue;
            }
        }
        skipped += (size_t)shoal_tok_add_merge(t, l, ln, r, rn);
    }
    free(buf);
    /* a merge of tokens missing from the vocabulary can never apply; HF
     * refuses such files, llama.cpp ignores them: ignore, but say so */
    if (skipped)
        shoal_log(SHOAL_LOG_DEBUG, "tokenizer",
                  "file=%s skipped_merges=%zu (unknown tokens)", h->name,
                  skipped);
    return 0;
}

/* --- tokenizer_config.json ---------------------------------------------- */

static const char *config_token(json_t *cfg, const char *key)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_object(v))
        return get_str(v, "content", NULL);
    return NULL;
}

static void list_remove(int32_t *v, size_t *n, int32_t id)
{
    size_t o = 0;
    for (size_t i = 0; i < *n; i++)
        if (v[i] != id)
            v[o++] = v[i];
    *n = o;
}

static int apply_config(struct hf *h, json_t *cfg)
{
    struct shoal_tokenizer *t = h->t;
    const char *bos = json_is_object(cfg) ? config_token(cfg, "bos_token")
                                          : NULL;
    const char *eos = json_is_object(cfg) ? config_token(cfg, "eos_token")
                                          : NULL;
    if (bos) {
        t->bos_id = shoal_tokenizer_token_id(t, bos);
        if (t->bos_id < 0)
            return FAIL(h, SHOAL_EFORMAT,
                        "tokenizer_config.json for '%s': bos_token '%s' is "
                        "not in the vocabulary",
                        h->name, bos);
    } else if (t->n_prefix > 0) {
        t->bos_id = t->prefix[0];
    }
    if (eos) {
        t->eos_id = shoal_tokenizer_token_id(t, eos);
        if (t->eos_id < 0)
            return FAIL(h, SHOAL_EFORMAT,
                        "tokenizer_config.json for '%s': eos_token '%s' is "
                        "not in the vocabulary",
                        h->name, eos);
    } else if (t->n_suffix > 0) {
        t->eos_id = t->suffix[t->n_suffix - 1];
    } else {
        static const char *const guesses[] = {
            "</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>",
            "<｜end▁of▁sentence｜>", "<eos>"};
        for (size_t k = 0; k < sizeof guesses / sizeof guesses[0]; k++) {
            int32_t id = shoal_tokenizer_token_id(t, guesses[k]);
            if (id >= 0 && shoal_tokenizer_is_special(t, id)) {
                t->eos_id = id;
                break;
            }
        }
    }
    if (!json_is_object(cfg))
        return 0;
    /* add_bos_token / add_eos_token rebuild the template's ends the way
     * transformers' Llama tokenizers do */
    json_t *ab = json_object_get(cfg, "add_bos_token");
    if (json_is_boolean(ab) && t->bos_id >= 0) {
        list_remove(t->prefix, &t->n_prefix, t->bos_id);
        if (json_is_true(ab)) {
            shoal_tok_add_prefix(t, t->bos_id);
            memmove(t->prefix + 1, t->prefix,
                    (t->n_prefix - 1) * sizeof *t->prefix);
            t->prefix[0] = t->bos_id;
        }
    }
    json_t *ae = json_object_get(cfg, "add_eos_token");
    if (json_is_boolean(ae) && t->eos_id >= 0) {
        list_remove(t->suffix, &t->n_suffix, t->eos_id);
        if (json_is_true(ae))
            shoal_tok_add_suffix(t, t->eos_id);
    }
    return 0;
}

/* --- entry point -------------------------------------------------------- */

struct shoal_tokenizer *shoal_tok_load_hf(const char *json, size_t json_len,
                                          const char *config,
                                          size_t config_len,
                                          const char *name,
                                          struct shoal_err *err)
{
    struct hf h = {.name = name, .err = err};
    json_error_t je;
    json_t *root = json_loadb(json, json_len, JSON_ALLOW_NUL, &je);
    if (!root && strstr(je.text, "too big integer"))
        /* a number beyond 64 bits somewhere (e.g. a max length): ids are
         * still exact as reals (int_of checks) */
        root = json_loadb(json, json_len,
                          JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
    json_t *cfg = NULL;
    int rc = 0;
    if (!root) {
        shoal_err_set(err, SHOAL_EFORMAT,
                      "tokenizer.json '%s': invalid JSON at line %d column "
                      "%d: %s",
                      name, je.line, je.column, je.text);
        return NULL;
    }
    if (config) {
        /* model_max_length is often 1e30 written as an integer */
        cfg = json_loadb(config, config_len,
                         JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
        if (!cfg || !json_is_object(cfg)) {
            shoal_err_set(err, SHOAL_EFORMAT,
                          "tokenizer_config.json for '%s': invalid JSON at "
                          "line %d column %d: %s",
                          name, je.line, je.column,
                          cfg ? "top level is not an object" : je.text);
            goto fail;
        }
    }
    if (!json_is_object(root)) {
        shoal_err_set(err, SHOAL_EFORMAT,
                      "tokenizer.json '%s': top level is not an object",
                      name);
        goto fail;
    }
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) {
        shoal_err_set(err, SHOAL_EFORMAT,
                      "tokenizer.json '%s': \"model\" is missing or not an "
                      "object",
                      name);
        goto fail;
    }
    const char *mtype = type_of(model);
    if (!mtype && json_object_get(model, "merges"))
        mtype = "BPE";
    if (!mtype || strcmp(mtype, "BPE") != 0) {
        shoal_err_set(err, SHOAL_EUNSUPPORTED,
                      "tokenizer.json '%s': model type '%s' is not "
                      "supported; expected BPE",
                      name, mtype ? mtype : "(none)");
        goto fail;
    }
    size_t pl;
    const char *csp = get_str(model, "continuing_subword_prefix", &pl);
    const char *eow = get_str(model, "end_of_word_suffix", NULL);
    if ((csp && pl) || (eow && *eow)) {
        shoal_err_set(err, SHOAL_EUNSUPPORTED,
                      "tokenizer.json '%s': BPE with continuing_subword_"
                      "prefix or end_of_word_suffix is not supported",
                      name);
        goto fail;
    }

    json_t *pre = json_object_get(root, "pre_tokenizer");
    json_t *dec = json_object_get(root, "decoder");
    h.byte_level = has_type(pre, "ByteLevel") || has_type(dec, "ByteLevel");
    if ((rc = parse_decoder(&h, dec)))
        goto fail;
    if ((rc = load_vocab(&h, model, json_object_get(root, "added_tokens"))))
        goto fail;
    struct shoal_tokenizer *t = h.t;
    t->model = SHOAL_TOK_MODEL_BPE;
    t->byte_level = h.byte_level;
    t->byte_fallback = get_bool(model, "byte_fallback", 0);
    t->fuse_unk = get_bool(model, "fuse_unk", 0);
    t->ignore_merges = get_bool(model, "ignore_merges", 0);
    t->dec_strip_leading = h.strip_leading;
    if ((rc = parse_normalizer(&h, json_object_get(root, "normalizer"))))
        goto fail;
    if (t->n_norm == 0) /* nothing to normalize: match everything raw */
        for (size_t slot = 0; slot < t->n_slots; slot++)
            t->vocab[slot].attr &= ~(uint32_t)SHOAL_TOK_NORMALIZED;
    if ((rc = shoal_tok_build_index(t, err)))
        goto fail;
    if ((rc = load_merges(&h, model)))
        goto fail;
    const char *unk = get_str(model, "unk_token", NULL);
    if (unk) {
        t->unk_id = shoal_tokenizer_token_id(t, unk);
        if (t->unk_id < 0) {
            shoal_err_set(err, SHOAL_EFORMAT,
                          "tokenizer.json '%s': unk_token '%s' is not in "
                          "the vocabulary",
                          name, unk);
            goto fail;
        }
    }
    if ((rc = parse_pre(&h, pre, 1)))
        goto fail;
    if ((rc = parse_post(&h, json_object_get(root, "post_processor"))))
        goto fail;
    if ((rc = apply_config(&h, cfg)))
        goto fail;
    for (size_t r = 0; r < h.n_rep; r++) {
        free(h.rep[r].from);
        free(h.rep[r].to);
    }
    json_decref(cfg);
    json_decref(root);
    return t;
fail:
    for (size_t r = 0; r < h.n_rep; r++) {
        free(h.rep[r].from);
        free(h.rep[r].to);
    }
    shoal_tokenizer_destroy(h.t);
    json_decref(cfg);
    json_decref(root);
    return NULL;
}
