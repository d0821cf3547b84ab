/* tokenizer_tiktoken: build a tokenizer from a tiktoken BPE file (Kimi-K2's
 * tiktoken.model) and the tokenizer_config.json beside it.
 *
 * The file has one token per line: the token's bytes in base64, a space,
 * its rank ("IQ== 0"). The rank is the token id and the merge priority:
 * tiktoken splits the text with the model's regex, keeps a piece that is a
 * whole token as that token, and otherwise starts from single bytes and
 * repeatedly merges the adjacent pair whose concatenation has the lowest
 * rank (leftmost on ties). Here that becomes the shared BPE engine with one
 * merge (left, right) -> rank(left + right) for every split of every token
 * into two tokens, plus ignore_merges for the whole-piece rule.
 *
 * Special tokens follow moonshotai/Kimi-K2-Instruct's tokenization_kimi.py
 * (TikTokenTokenizer.__init__): ids n .. n + 257 after the n ranks
 * (num_reserved_special_tokens = 256, plus 2), named by
 * tokenizer_config.json's added_tokens_decoder, else
 * "<|reserved_token_{id}|>". bos/eos come from the config's bos_token /
 * eos_token; no BOS is added when encoding (the class adds none).
 *
 * Not reproduced: the class's cut of runs longer than 25,000 whitespace or
 * non-whitespace characters (and of texts over 400,000 characters) before
 * the regex, which only changes such pathological inputs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tokenizer_impl.h"
#include "util.h"

/* Kimi-K2's split pattern (pat_str of TikTokenTokenizer in
 * moonshotai/Kimi-K2-Instruct tokenization_kimi.py; the same string in the
 * re-upload GitHub ramanuja-ganesh-k/Create-Bot-V1 : tokencreate.py @
 * d9c745a39a1799bd8ba7ae3b4fb9510f87da0b35), written for PCRE2:
 *   - tiktoken's regex engine (Rust fancy-regex/regex) reads a class
 *     intersection [X&&[^\p{Han}]]; PCRE2 10.42 has none, so each becomes
 *     (?:(?!\p{sc:Han})[X]), the same set of characters;
 *   - Rust's bare \p{Han} is the Script property, PCRE2's is
 *     Script_Extensions (which adds CJK punctuation such as U+3002), so it
 *     is written \p{sc:Han}. */
#define KIMI_NOHAN_UPPER "(?:(?!\\p{sc:Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])"
#define KIMI_NOHAN_LOWER "(?:(?!\\p{sc:Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])"
#define KIMI_CONTRACTION "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
const char shoal_tok_kimi_regex[] =
    "[\\p{sc:Han}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?" KIMI_NOHAN_UPPER "*" KIMI_NOHAN_LOWER "+"
    KIMI_CONTRACTION
    "|[^\\r\\n\\p{L}\\p{N}]?" KIMI_NOHAN_UPPER "+" KIMI_NOHAN_LOWER "*"
    KIMI_CONTRACTION
    "|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";

/* Special ids after the ranks (tokenization_kimi.py: 256 reserved + 2). */
#define KIMI_N_SPECIAL 258u

#define FAIL(err, ...) shoal_err_set((err), SHOAL_EFORMAT, __VA_ARGS__)

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* Strict standard base64 (padding required to a multiple of 4). Writes
 * at most 3 * n / 4 bytes to out; returns the count, or -1. */
static long b64_decode(const char *s, size_t n, unsigned char *out)
{
    if (n == 0 || n % 4)
        return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            unsigned char c = (unsigned char)s[i + k];
            if (c == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
                continue;
            }
            if (pad || (v[k] = b64_value(c)) < 0)
                return -1;
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 |
                     (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[o++] = (unsigned char)(w >> 16);
        if (pad < 2)
            out[o++] = (unsigned char)(w >> 8);
        if (pad < 1)
            out[o++] = (unsigned char)w;
    }
    return (long)o;
}

struct line {
    const char *p;
    size_t n;
    size_t lineno;
};

/* Non-empty lines (tiktoken skips empty ones), "\r\n" tolerated. */
static struct line *split_lines(const char *text, size_t len, size_t *n_out)
{
    size_t cap = 1024, n = 0, lineno = 0;
    struct line *v = shoal_xmalloc(cap * sizeof *v);
    size_t i = 0;
    while (i < len) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - text) : len;
        size_t e = end;
        lineno++;
        if (e > i && text[e - 1] == '\r')
            e--;
        if (e > i) {
            if (n == cap) {
                cap *= 2;
                v = shoal_xrealloc(v, cap * sizeof *v);
            }
            v[n++] = (struct line){text + i, e - i, lineno};
        }
        i = end + 1;
    }
    *n_out = n;
    return v;
}

/* Parse "BASE64 RANK" into bytes (tmp, at least n bytes) and a rank. */
static int parse_line(const struct line *l, const char *name,
                      unsigned char *tmp, long *tok_len, size_t *rank,
                      struct shoal_err *err)
{
    const char *sp = memchr(l->p, ' ', l->n);
    if (!sp || sp == l->p || (size_t)(sp - l->p) + 1 >= l->n)
        return FAIL(err, "tiktoken.model '%s' line %zu: expected \"<base64 "
                    "token> <rank>\", found '%.40s'%s",
                    name, l->lineno, l->p, l->n > 40 ? "..." : "");
    size_t bn = (size_t)(sp - l->p);
    *tok_len = b64_decode(l->p, bn, tmp);
    if (*tok_len <= 0)
        return FAIL(err, "tiktoken.model '%s' line %zu: '%.*s' is not "
                    "base64 of a non-empty token",
                    name, l->lineno, (int)(bn > 40 ? 40 : bn), l->p);
    const char *r = sp + 1, *end = l->p + l->n;
    size_t v = 0;
    if (r == end)
        return FAIL(err, "tiktoken.model '%s' line %zu: no rank after the "
                    "token", name, l->lineno);
    for (const char *q = r; q < end; q++) {
        if (*q < '0' || *q > '9' || v > SHOAL_TOK_MAX_VOCAB)
            return FAIL(err, "tiktoken.model '%s' line %zu: rank '%.*s' is "
                        "not an integer 0..%u",
                        name, l->lineno, (int)(end - r > 20 ? 20 : end - r),
                        r, SHOAL_TOK_MAX_VOCAB);
        v = v * 10 + (size_t)(*q - '0');
    }
    *rank = v;
    return 0;
}

/* added_tokens_decoder of tokenizer_config.json onto the special ids. */
static int apply_added(struct shoal_tokenizer *t, json_t *cfg, size_t n_base,
                       const char *name, struct shoal_err *err)
{
    json_t *dec = json_is_object(cfg) ? json_object_get(cfg, "added_tokens_decoder")
                                      : NULL;
    const char *key;
    json_t *v;
    if (dec && !json_is_object(dec))
        return FAIL(err, "tokenizer_config.json for '%s': added_tokens_decoder "
                    "is not an object", name);
    json_object_foreach(dec, key, v)
    {
        char *end;
        unsigned long id = strtoul(key, &end, 10);
        json_t *c = json_object_get(v, "content");
        if (!*key || *end || id < n_base || id >= n_base + KIMI_N_SPECIAL)
            return FAIL(err, "tokenizer_config.json for '%s': added token id "
                        "'%s' is not a special id %zu..%zu (after the %zu "
                        "tiktoken ranks)", name, key, n_base,
                        n_base + KIMI_N_SPECIAL - 1, n_base);
        if (!json_is_string(c) || json_string_length(c) == 0)
            return FAIL(err, "tokenizer_config.json for '%s': added token %lu "
                        "has no \"content\" string", name, id);
        json_t *sp = json_object_get(v, "special");
        uint32_t attr = json_is_false(sp) ? SHOAL_TOK_USER_DEFINED
                                          : SHOAL_TOK_CONTROL;
        if (json_is_true(json_object_get(v, "lstrip")))
            attr |= SHOAL_TOK_LSTRIP;
        if (json_is_true(json_object_get(v, "rstrip")))
            attr |= SHOAL_TOK_RSTRIP;
        if (json_is_true(json_object_get(v, "single_word")))
            attr |= SHOAL_TOK_SINGLE_WORD;
        shoal_tok_set(t, (uint32_t)id, json_string_value(c),
                      json_string_length(c), json_string_value(c),
                      json_string_length(c), 0.0f, attr);
    }
    return 0;
}

static const char *config_token(json_t *cfg, const char *key)
{
    json_t *v = json_is_object(cfg) ? json_object_get(cfg, key) : NULL;
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* Every split of every token into two tokens is a merge at the token's
 * rank: the lowest-ranked adjacent concatenation merges first. */
static void derive_merges(struct shoal_tokenizer *t, size_t n_base)
{
    size_t n = 0;
    for (size_t id = 0; id < n_base; id++)
        n += t->vocab[id].text_len > 1 ? t->vocab[id].text_len - 1 : 0;
    shoal_tok_merges_reserve(t, n);
    for (size_t id = 0; id < n_base; id++) {
        const struct shoal_tok_entry *e = &t->vocab[id];
        const char *s = t->blob + e->text_off;
        for (uint32_t k = 1; k < e->text_len; k++) {
            int32_t l = shoal_tok_lookup(t, s, k);
            int32_t r = l >= 0 ? shoal_tok_lookup(t, s + k, e->text_len - k) : -1;
            if (r >= 0)
                shoal_tok_add_merge_ranked(t, l, r, (uint32_t)id, (int32_t)id);
        }
    }
    t->n_merges = n_base;
}

struct shoal_tokenizer *shoal_tok_load_tiktoken(const char *model,
                                                size_t model_len,
                                                const char *config,
                                                size_t config_len,
                                                const char *name,
                                                struct shoal_err *err)
{
    size_t n_lines;
    struct line *lines = split_lines(model, model_len, &n_lines);
    struct shoal_tokenizer *t = NULL;
    json_t *cfg = NULL;
    unsigned char *tmp = NULL;
    uint32_t *seen = NULL;
    if (n_lines == 0) {
        FAIL(err, "tiktoken.model '%s': no tokens (expected lines \"<base64 "
             "token> <rank>\")", name);
        goto fail;
    }
    if (n_lines > SHOAL_TOK_MAX_VOCAB - KIMI_N_SPECIAL) {
        shoal_err_set(err, SHOAL_ERANGE, "tiktoken.model '%s': %zu tokens, "
                      "more than the %u supported", name, n_lines,
                      SHOAL_TOK_MAX_VOCAB - KIMI_N_SPECIAL);
        goto fail;
    }
    if (config) {
        json_error_t je;
        cfg = json_loadb(config, config_len,
                         JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
        if (!json_is_object(cfg)) {
            FAIL(err, "tokenizer_config.json for '%s': invalid JSON at line %d "
                 "column %d: %s", name, je.line, je.column,
                 cfg ? "top level is not an object" : je.text);
            goto fail;
        }
    }
    t = shoal_tok_new(name, n_lines + KIMI_N_SPECIAL);
    size_t max_len = 0;
    for (size_t i = 0; i < n_lines; i++)
        if (lines[i].n > max_len)
            max_len = lines[i].n;
    tmp = shoal_xmalloc(max_len + 3);
    seen = shoal_xcalloc(n_lines, sizeof *seen); /* rank -> line number */
    for (size_t i = 0; i < n_lines; i++) {
        long tl = 0;
        size_t rank = 0;
        if (parse_line(&lines[i], name, tmp, &tl, &rank, err))
            goto fail;
        if (rank >= n_lines) {
            FAIL(err, "tiktoken.model '%s' line %zu: rank %zu out of range "
                 "0..%zu (ranks must number the %zu tokens densely)",
                 name, lines[i].lineno, rank, n_lines - 1, n_lines);
            goto fail;
        }
        if (seen[rank]) {
            FAIL(err, "tiktoken.model '%s' line %zu: rank %zu was already "
                 "given on line %u", name, lines[i].lineno, rank, seen[rank]);
            goto fail;
        }
        seen[rank] = (uint32_t)lines[i].lineno;
        shoal_tok_set(t, (uint32_t)rank, (const char *)tmp, (size_t)tl,
                      (const char *)tmp, (size_t)tl, 0.0f,
                      SHOAL_TOK_NORMAL | SHOAL_TOK_IN_MODEL);
    }
    for (size_t id = n_lines; id < n_lines + KIMI_N_SPECIAL; id++) {
        char nm[48];
        int nl = snprintf(nm, sizeof nm, "<|reserved_token_%zu|>", id);
        shoal_tok_set(t, (uint32_t)id, nm, (size_t)nl, nm, (size_t)nl, 0.0f,
                      SHOAL_TOK_CONTROL);
    }
    if (apply_added(t, cfg, n_lines, name, err))
        goto fail;
    t->model = SHOAL_TOK_MODEL_BPE;
    t->byte_level = 1;
    t->ignore_merges = 1;
    for (size_t id = 0; id < t->n_vocab; id++) /* no normalizer */
        t->vocab[id].attr &= ~(uint32_t)SHOAL_TOK_NORMALIZED;
    if (shoal_tok_build_index(t, err))
        goto fail;
    /* two lines with the same bytes: the index keeps one, so look back */
    for (size_t id = 0; id < n_lines; id++) {
        const struct shoal_tok_entry *e = &t->vocab[id];
        int32_t got = shoal_tok_lookup(t, t->blob + e->text_off, e->text_len);
        if (got != (int32_t)id) {
            FAIL(err, "tiktoken.model '%s' line %u: token of rank %zu repeats "
                 "the bytes of rank %d (line %u)", name, seen[id], id,
                 (int)got, got >= 0 ? seen[got] : 0);
            goto fail;
        }
    }
    derive_merges(t, n_lines);
    char what[160];
    snprintf(what, sizeof what, "tiktoken '%s': split pattern", name);
    struct shoal_tok_pre_op *op = shoal_tok_add_pre(t, SHOAL_TOK_PRE_SPLIT);
    op->behavior = SHOAL_TOK_SPLIT_ISOLATED;
    op->re = shoal_tok_regex_compile(shoal_tok_kimi_regex,
                                     strlen(shoal_tok_kimi_regex), 0, what, err);
    if (!op->re)
        goto fail;
    const char *keys[2] = {"bos_token", "eos_token"};
    int32_t *ids[2] = {&t->bos_id, &t->eos_id};
    for (int k = 0; k < 2; k++) {
        const char *s = config_token(cfg, keys[k]);
        if (!s)
            continue;
        *ids[k] = shoal_tokenizer_token_id(t, s);
        if (*ids[k] < 0) {
            FAIL(err, "tokenizer_config.json for '%s': %s '%s' is not a token",
                 name, keys[k], s);
            goto fail;
        }
    }
    free(lines);
    free(tmp);
    free(seen);
    json_decref(cfg);
    return t;
fail:
    free(lines);
    free(tmp);
    free(seen);
    json_decref(cfg);
    shoal_tokenizer_destroy(t);
    return NULL;
}
