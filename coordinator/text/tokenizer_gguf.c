/* tokenizer_gguf: build a tokenizer from GGUF metadata (tokenizer.ggml.*).
 *
 * "llama": SentencePiece BPE by scores (llama.cpp's llm_tokenizer_spm):
 *   spaces become "▁", a "▁" is prepended to each text fragment
 *   (add_space_prefix, default true), unknown bytes become <0xXX> tokens.
 * "gpt2":  byte-level BPE by merge ranks; text is first split by the
 *   regexes llama.cpp lists for tokenizer.ggml.pre (each regex splits the
 *   pieces of the previous one; matches and the text between them are both
 *   kept), as in llama-vocab.cpp's llm_tokenizer_bpe constructor.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "tokenizer_impl.h"
#include "unicode.h"
#include "util.h"

/* llama.cpp's GGUF token types */
enum {
    GGUF_TOKEN_UNDEFINED = 0,
    GGUF_TOKEN_NORMAL = 1,
    GGUF_TOKEN_UNKNOWN = 2,
    GGUF_TOKEN_CONTROL = 3,
    GGUF_TOKEN_USER_DEFINED = 4,
    GGUF_TOKEN_UNUSED = 5,
    GGUF_TOKEN_BYTE = 6,
};

/* --- pre-tokenizer regexes per tokenizer.ggml.pre ---------------------- */

#define RE_GPT2                                                             \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"   \
    "\\s+(?!\\S)"
#define RE_CONTRACTIONS                                                     \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3                                                           \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "         \
                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"          \
                    "\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                            \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "              \
                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"          \
                    "\\s+(?!\\S)|\\s+"
#define RE_CJK_DS "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
#define RE_CJK_KANA                                                         \
    "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+"
#define RE_PUNCT_ASCII "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~]"
#define RE_BLOOM                                                            \
    " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}"   \
    "\\x{60C})]+"

static const char *const re_default[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]",
    NULL};
static const char *const re_gpt2[] = {RE_GPT2, NULL};
static const char *const re_llama3[] = {RE_LLAMA3, NULL};
static const char *const re_jais2[] = {
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                    "\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|"
                    "\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|"
                    "\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
    NULL};
static const char *const re_deepseek_llm[] = {
    "[\r\n]",
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}"
    "\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}"
    "\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}"
    "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-"
    "\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"
    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-"
    "\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}"
    "\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-"
    "\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-"
    "\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-"
    "\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}"
    "\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-"
    "\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}"
    "\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}"
    "\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}"
    "\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-"
    "\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}"
    "\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-"
    "\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"
    "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}"
    "\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}"
    "\\x{3000}-\\x{3002}]+",
    "\\s+$",
    RE_CJK_DS,
    "\\p{N}+",
    NULL};
static const char *const re_deepseek3[] = {
    "\\p{N}{1,3}", RE_CJK_KANA,
    RE_PUNCT_ASCII "[A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
                   "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const re_spark2_5[] = {
    "\\p{N}{1,3}", RE_CJK_KANA,
    RE_PUNCT_ASCII "[A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
                   "?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
    "\\p{N}", NULL};
static const char *const re_youtu[] = {
    "[\\x{AC00}-\\x{D7A3}\\x{3131}-\\x{318E}]+|[\\x{FF01}\\x{2026}\\x{201C}"
    "\\x{201D}\\x{2018}\\x{2019}\\x{2014}\\x{FF1A}\\x{FF1B}\\x{FF0C}"
    "\\x{3001}-\\x{303F}\\x{FE30}-\\x{FE4F}]+|[\\x{3105}-\\x{312F}]+|["
    "\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" RE_CONTRACTIONS "?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" RE_CONTRACTIONS "?|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const re_deepseek_coder[] = {
    "[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK_DS, "\\p{N}", NULL};
static const char *const re_falcon[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]", NULL};
static const char *const re_starcoder[] = {"\\p{N}", RE_GPT2, NULL};
static const char *const re_qwen2[] = {RE_QWEN2, NULL};
static const char *const re_qwen35[] = {
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
                    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                    "\\s+(?!\\S)|\\s+",
    NULL};
static const char *const re_bloom[] = {RE_BLOOM, NULL};
static const char *const re_viking[] = {RE_BLOOM, "\\p{N}", NULL};
static const char *const re_tekken[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|"
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const re_chameleon[] = {
    "<sentinel:[0-9]+>",
    "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    "([\\t\\n]|    |  )",
    "\\p{N}",
    "[\\p{P}!-/:-@\\[-`{-~]",
    RE_GPT2,
    NULL};
static const char *const re_gpt4o[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
    RE_CONTRACTIONS "?|"
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
    RE_CONTRACTIONS "?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|"
    "\\s+",
    NULL};
static const char *const re_granite_multi[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*"
    "((?=[\\p{L}\\p{M}])([^A-Z]))+" RE_CONTRACTIONS "?|"
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+"
    "((?=[\\p{L}\\p{M}])([^A-Z]))*" RE_CONTRACTIONS "?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|"
    "\\s+",
    NULL};
static const char *const re_tiny_aya[] = {
    "\\d{1,3}(?=(?:\\d{3})*\\b)",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" RE_CONTRACTIONS "?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" RE_CONTRACTIONS "?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|"
    "\\s+",
    NULL};
static const char *const re_superbpe[] = {"\\p{N}+", "(?=(\\d{3})+(?!\\d))",
                                          NULL};
static const char *const re_bailingmoe[] = {
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?"
    "\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|"
    "\\s+",
    NULL};
static const char *const re_seed_coder[] = {
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| "
                    "?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|"
                    "\\s+",
    NULL};
static const char *const re_ufakzeka[] = {
    "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const re_laguna[] = {"[^\\n]+|[\\n]+", RE_QWEN2, NULL};
static const char *const re_exaone_moe[] = {
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: "
                    "\\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
                    "[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const re_minicpm5[] = {
    "\\p{N}{1,3}",
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| "
                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                    "\\s+(?!\\S)|\\s+",
    NULL};

enum {
    PRE_IGNORE_MERGES = 1 << 0, /* a piece that is a token is kept whole */
    PRE_ADD_BOS = 1 << 1,       /* add_bos defaults to true */
    PRE_NO_BOS = 1 << 2,        /* the family has no BOS token */
};

struct pre_type {
    const char *name;
    const char *const *regexes;
    unsigned flags;
};

/* tokenizer.ggml.pre values, as llama.cpp maps them (llama-vocab.cpp) */
static const struct pre_type pre_types[] = {
    {"default", re_default, 0},
    {"gpt-2", re_gpt2, 0},
    {"llama-bpe", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"llama3", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"qwen2", re_qwen2, 0},
    {"qwen35", re_qwen35, 0},
    {"deepseek-llm", re_deepseek_llm, 0},
    {"deepseek-coder", re_deepseek_coder, 0},
    {"deepseek-v3", re_deepseek3, 0},
    {"gpt-4o", re_gpt4o, 0},
    {"tekken", re_tekken, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"falcon", re_falcon, 0},
    {"mpt", re_gpt2, 0},
    {"starcoder", re_starcoder, 0},
    {"refact", re_starcoder, 0},
    {"command-r", re_starcoder, 0},
    {"stablelm2", re_qwen2, 0},
    {"olmo", re_gpt2, 0},
    {"dbrx", re_llama3, 0},
    {"smaug-bpe", re_llama3, 0},
    {"chatglm-bpe", re_llama3, PRE_NO_BOS},
    {"bailingmoe", re_bailingmoe, 0},
    {"seed-coder", re_seed_coder, 0},
    {"superbpe", re_superbpe, 0},
    {"trillion", re_gpt2, 0},
    {"exaone", re_starcoder, 0},
    {"chameleon", re_chameleon, PRE_ADD_BOS},
    {"minerva-7b", re_starcoder, 0},
    {"poro-chat", re_bloom, 0},
    {"bloom", re_bloom, 0},
    {"viking", re_viking, 0},
    {"jais", re_gpt2, 0},
    {"llama-v3", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"falcon3", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"falcon-h1", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"pixtral", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"midm-2.0", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"lfm2", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"jina-v5-nano", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"jais-2", re_jais2, 0},
    {"hunyuan-dense", re_deepseek3, 0},
    {"joyai-llm", re_deepseek3, 0},
    {"hy_v4", re_deepseek3, 0},
    {"spark2_5", re_spark2_5, 0},
    {"youtu", re_youtu, PRE_IGNORE_MERGES},
    {"smollm", re_starcoder, 0},
    {"codeshell", re_starcoder, 0},
    {"mellum2", re_starcoder, 0},
    {"gpt2", re_gpt2, 0},
    {"phi-2", re_gpt2, 0},
    {"jina-es", re_gpt2, 0},
    {"jina-de", re_gpt2, 0},
    {"gigachat", re_gpt2, 0},
    {"jina-v2-es", re_gpt2, 0},
    {"jina-v2-de", re_gpt2, 0},
    {"jina-v1-en", re_gpt2, 0},
    {"jina-v2-code", re_gpt2, 0},
    {"roberta-bpe", re_gpt2, 0},
    {"a.x-4.0", re_gpt2, 0},
    {"mellum", re_gpt2, 0},
    {"modern-bert", re_gpt2, 0},
    {"exaone4", re_gpt2, 0},
    {"granite-docling", re_gpt2, 0},
    {"deepseek-r1-qwen", re_qwen2, 0},
    {"kormo", re_qwen2, 0},
    {"f2llmv2", re_qwen2, 0},
    {"megrez", re_qwen2, 0},
    {"hunyuan", re_qwen2, 0},
    {"solar-open", re_qwen2, 0},
    {"grok-2", re_qwen2, 0},
    {"gpt3-finnish", re_bloom, 0},
    {"glm4", re_llama3, PRE_NO_BOS},
    {"llama4", re_gpt4o, 0},
    {"kanana2", re_gpt4o, 0},
    {"talkie", re_gpt4o, 0},
    {"minimax-m2", re_gpt4o, 0},
    {"granite-embed-multi-97m", re_granite_multi, PRE_IGNORE_MERGES},
    {"tiny_aya", re_tiny_aya, 0},
    {"cohere2moe", re_tiny_aya, 0},
    {"bailingmoe2", re_bailingmoe, 0},
    {"llada-moe", re_bailingmoe, 0},
    {"ufakzeka", re_ufakzeka, 0},
    {"laguna", re_laguna, 0},
    {"exaone-moe", re_exaone_moe, 0},
    {"minicpm5", re_minicpm5, PRE_IGNORE_MERGES},
};

#define N_PRE_TYPES (sizeof pre_types / sizeof pre_types[0])

static const struct pre_type *pre_find(const char *name)
{
    for (size_t i = 0; i < N_PRE_TYPES; i++)
        if (strcmp(pre_types[i].name, name) == 0)
            return &pre_types[i];
    return NULL;
}

/* --- loader ------------------------------------------------------------ */

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

/* Fetch an optional array of n >= n_tokens elements of one of two types. */
static int get_token_array(const struct shoal_gguf *g, const char *name,
                           const char *key, enum shoal_gguf_type t1,
                           enum shoal_gguf_type t2, size_t n_tokens,
                           struct shoal_gguf_array *a, struct shoal_err *err)
{
    int rc = shoal_gguf_get_array(g, key, a, err);
    if (rc == SHOAL_ENOTFOUND)
        return 1;
    if (rc)
        return rc;
    if (a->type != t1 && a->type != t2)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "gguf '%s': %s has elements of type %s; "
                             "expected %s",
                             name, key, shoal_gguf_type_name(a->type),
                             shoal_gguf_type_name(t1));
    if (a->n < n_tokens)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "gguf '%s': %s has %" PRIu64
                             " entries; expected %zu (one per token)",
                             name, key, a->n, n_tokens);
    return 0;
}

/* Optional special id: dflt (or -1 when dflt is no token) when absent. An
 * id the file sets outside the vocabulary is a damaged file, refused with
 * SHOAL_ERANGE in *rc (as the chat template's loader refuses it; llama.cpp
 * warns and takes the default). */
static int32_t get_id(const struct shoal_gguf *g, const char *name,
                      const char *key, int32_t dflt, size_t n_vocab, int strict,
                      struct shoal_err *err, int *rc)
{
    int64_t v;
    int r = shoal_gguf_get_int(g, key, &v, err);
    if (r == SHOAL_ENOTFOUND)
        return dflt >= 0 && (size_t)dflt < n_vocab ? dflt : -1;
    if (r) {
        *rc = r;
        return -1;
    }
    if ((v < 0 || (uint64_t)v >= n_vocab) && !strict)
        return -1;   /* unset, as llama.cpp reads it (it only warns) */
    if (v < 0 || (uint64_t)v >= n_vocab) {
        *rc = shoal_err_set(err, SHOAL_ERANGE,
                            "gguf '%s': %s is %" PRId64 "; expected a token "
                            "id 0 to %zu (tokenizer.ggml.tokens holds %zu)",
                            name, key, v, n_vocab - 1, n_vocab);
        return -1;
    }
    return (int32_t)v;
}

/* Comma-separated supported names, as many as fit in cap bytes (the table
 * starts with the common ones), then "and N more". */
static void list_pre_names(char *out, size_t cap)
{
    size_t o = 0, i = 0;
    out[0] = '\0';
    for (; i < N_PRE_TYPES; i++) {
        size_t need = strlen(pre_types[i].name) + 2;
        if (o + need + 24 >= cap)
            break;
        o += (size_t)snprintf(out + o, cap - o, "%s%s", i ? ", " : "",
                              pre_types[i].name);
    }
    if (i < N_PRE_TYPES)
        snprintf(out + o, cap - o, " and %zu more", N_PRE_TYPES - i);
}

struct shoal_tokenizer *shoal_tokenizer_load_gguf(const struct shoal_gguf *g,
                                                  const char *name,
                                                  struct shoal_err *err)
{
    struct shoal_tokenizer *t = NULL;
    const char *model = NULL, *pre = "default";
    struct shoal_gguf_array tokens, scores, types, merges;
    int have_scores, have_types, rc = 0;
    char *tmp = NULL;
    name = name ? name : "(gguf)";

    if (shoal_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL, err)) {
        if (!err || err->code == 0)
            shoal_err_set(err, SHOAL_EFORMAT,
                          "gguf '%s': no tokenizer.ggml.model; this file "
                          "carries no tokenizer",
                          name);
        return NULL;
    }
    int spm = strcmp(model, "llama") == 0;
    if (!spm && strcmp(model, "gpt2") != 0) {
        shoal_err_set(err, SHOAL_EUNSUPPORTED,
                      "gguf '%s': tokenizer.ggml.model '%s' is not "
                      "supported; expected 'llama' (SentencePiece) or "
                      "'gpt2' (byte-level BPE)",
                      name, model);
        return NULL;
    }
    const struct pre_type *pt = NULL;
    if (!spm) {
        rc = shoal_gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL, err);
        if (rc == SHOAL_ENOTFOUND)
            pre = "default";
        else if (rc)
            return NULL;
        pt = pre_find(pre);
        if (!pt) {
            char names[320];
            list_pre_names(names, sizeof names);
            shoal_err_set(err, SHOAL_EUNSUPPORTED,
                          "gguf '%s': tokenizer.ggml.pre '%s' is not "
                          "supported; supported: %s",
                          name, pre, names);
            return NULL;
        }
    }

    rc = shoal_gguf_get_array(g, "tokenizer.ggml.tokens", &tokens, err);
    if (rc == SHOAL_ENOTFOUND) {
        shoal_err_set(err, SHOAL_EFORMAT,
                      "gguf '%s': tokenizer.ggml.tokens is missing", name);
        return NULL;
    }
    if (rc)
        return NULL;
    if (tokens.type != SHOAL_GGUF_TYPE_STRING || tokens.n == 0 ||
        tokens.n > SHOAL_TOK_MAX_VOCAB) {
        shoal_err_set(err, SHOAL_EFORMAT,
                      "gguf '%s': tokenizer.ggml.tokens holds %" PRIu64
                      " %s elements; expected 1..%u strings",
                      name, tokens.n, shoal_gguf_type_name(tokens.type),
                      SHOAL_TOK_MAX_VOCAB);
        return NULL;
    }
    size_t n = (size_t)tokens.n;
    have_scores = get_token_array(g, name, "tokenizer.ggml.scores",
                                  SHOAL_GGUF_TYPE_FLOAT32,
                                  SHOAL_GGUF_TYPE_INT32, n, &scores, err);
    have_types = get_token_array(g, name, "tokenizer.ggml.token_type",
                                 SHOAL_GGUF_TYPE_INT32, SHOAL_GGUF_TYPE_INT32,
                                 n, &types, err);
    if (have_scores < 0 || have_types < 0)
        return NULL;
    have_scores = have_scores == 0;
    have_types = have_types == 0;

    t = shoal_tok_new(name, n);
    t->model = spm ? SHOAL_TOK_MODEL_SPM : SHOAL_TOK_MODEL_BPE;
    t->byte_level = !spm;
    t->ignore_merges = pt && (pt->flags & PRE_IGNORE_MERGES);
    size_t max_len = 0;
    for (size_t i = 0; i < n; i++)
        if (tokens.str_lens[i] > max_len)
            max_len = (size_t)tokens.str_lens[i];
    tmp = shoal_xmalloc(max_len * 3 + 4);

    for (size_t i = 0; i < n; i++) {
        const char *s = tokens.strs[i];
        size_t sl = (size_t)tokens.str_lens[i];
        int32_t ty = have_types ? ((const int32_t *)types.data)[i]
                                : GGUF_TOKEN_NORMAL;
        float score = 0.0f;
        if (have_scores)
            score = scores.type == SHOAL_GGUF_TYPE_FLOAT32
                        ? ((const float *)scores.data)[i]
                        : (float)((const int32_t *)scores.data)[i];
        uint32_t attr = SHOAL_TOK_IN_MODEL;
        switch (ty) {
        case GGUF_TOKEN_NORMAL: attr |= SHOAL_TOK_NORMAL; break;
        case GGUF_TOKEN_UNKNOWN: attr |= SHOAL_TOK_UNKNOWN; break;
        case GGUF_TOKEN_CONTROL: attr |= SHOAL_TOK_CONTROL; break;
        case GGUF_TOKEN_USER_DEFINED: attr |= SHOAL_TOK_USER_DEFINED; break;
        case GGUF_TOKEN_BYTE: attr |= SHOAL_TOK_BYTE; break;
        default: attr |= SHOAL_TOK_UNUSED; break; /* unused, undefined */
        }
        uint8_t byte;
        if ((attr & SHOAL_TOK_BYTE) && parse_byte_token(s, sl, &byte)) {
            shoal_tok_set(t, (uint32_t)i, s, sl, (const char *)&byte, 1,
                          score, attr);
        } else if ((attr & SHOAL_TOK_NORMAL) && !spm) {
            /* byte-level: store the bytes the token stands for; a text
             * outside the GPT-2 alphabet is kept as written */
            long dl = shoal_bytelevel_decode(s, sl, tmp);
            if (dl >= 0)
                shoal_tok_set(t, (uint32_t)i, tmp, (size_t)dl, tmp,
                              (size_t)dl, score, attr);
            else
                shoal_tok_set(t, (uint32_t)i, s, sl, s, sl, score, attr);
        } else if ((attr & SHOAL_TOK_NORMAL) && spm) {
            /* rendered with "▁" as a space */
            size_t pn = 0;
            for (size_t k = 0; k < sl;) {
                if (k + 3 <= sl && memcmp(s + k, "\xe2\x96\x81", 3) == 0) {
                    tmp[pn++] = ' ';
                    k += 3;
                } else {
                    tmp[pn++] = s[k++];
                }
            }
            shoal_tok_set(t, (uint32_t)i, s, sl, tmp, pn, score, attr);
        } else {
            shoal_tok_set(t, (uint32_t)i, s, sl, s, sl, score, attr);
        }
    }
    if (shoal_tok_build_index(t, err))
        goto fail;

    if (!spm) {
        rc = shoal_gguf_get_array(g, "tokenizer.ggml.merges", &merges, err);
        if (rc == SHOAL_ENOTFOUND) {
            shoal_err_set(err, SHOAL_EFORMAT,
                          "gguf '%s': tokenizer.ggml.merges is missing; a "
                          "gpt2 tokenizer needs it",
                          name);
            goto fail;
        }
        if (rc)
            goto fail;
        if (merges.type != SHOAL_GGUF_TYPE_STRING) {
            shoal_err_set(err, SHOAL_EFORMAT,
                          "gguf '%s': tokenizer.ggml.merges has %s "
                          "elements; expected strings",
                          name, shoal_gguf_type_name(merges.type));
            goto fail;
        }
        shoal_tok_merges_reserve(t, (size_t)merges.n);
        size_t cap = 0;
        char *a = NULL;
        for (uint64_t i = 0; i < merges.n; i++) {
            const char *s = merges.strs[i];
            size_t sl = (size_t)merges.str_lens[i];
            /* "left right": split at the first space after the first
             * byte, as llama.cpp does */
            const char *sp = sl > 1 ? memchr(s + 1, ' ', sl - 1) : NULL;
            if (!sp) {
                t->n_merges++; /* keep ranks aligned with the list */
                continue;
            }
            size_t ln = (size_t)(sp - s), rn = sl - ln - 1;
            if (cap < sl) {
                cap = sl;
                a = shoal_xrealloc(a, cap);
            }
            long dl = shoal_bytelevel_decode(s, ln, a);
            long dr = dl >= 0 ? shoal_bytelevel_decode(sp + 1, rn, a + dl)
                              : -1;
            if (dl < 0 || dr < 0)
                shoal_tok_add_merge(t, s, ln, sp + 1, rn);
            else
                shoal_tok_add_merge(t, a, (size_t)dl, a + dl, (size_t)dr);
        }
        free(a);
    }

    /* special ids (llama.cpp's defaults for SentencePiece: 1, 2, 0) */
    rc = 0;
    /* a bos or eos past the vocabulary is refused (the text would be
     * wrong); an unk there is taken for unset, as llama.cpp does (BPE
     * vocabularies do not use it, and converted files carry stray ones) */
    t->bos_id = get_id(g, name, "tokenizer.ggml.bos_token_id", spm ? 1 : -1,
                       n, 1, err, &rc);
    t->eos_id = get_id(g, name, "tokenizer.ggml.eos_token_id", spm ? 2 : -1,
                       n, 1, err, &rc);
    t->unk_id = get_id(g, name, "tokenizer.ggml.unknown_token_id",
                       spm ? 0 : -1, n, 0, err, &rc);
    if (rc)
        goto fail;
    if (pt && (pt->flags & PRE_NO_BOS))
        t->bos_id = -1;

    int add_bos = spm || (pt && (pt->flags & PRE_ADD_BOS)), add_eos = 0;
    int add_space_prefix = spm;
    if ((rc = shoal_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos,
                                  err)) &&
        rc != SHOAL_ENOTFOUND)
        goto fail;
    if ((rc = shoal_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &add_eos,
                                  err)) &&
        rc != SHOAL_ENOTFOUND)
        goto fail;
    if ((rc = shoal_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix",
                                  &add_space_prefix, err)) &&
        rc != SHOAL_ENOTFOUND)
        goto fail;
    if (add_bos && t->bos_id < 0) {
        shoal_err_set(err, SHOAL_EFORMAT,
                      "gguf '%s': tokenizer.ggml.add_bos_token is true but "
                      "tokenizer.ggml.bos_token_id is not set",
                      name);
        goto fail;
    }
    if (add_eos && t->eos_id < 0) {
        shoal_err_set(err, SHOAL_EFORMAT,
                      "gguf '%s': tokenizer.ggml.add_eos_token is true but "
                      "tokenizer.ggml.eos_token_id is not set",
                      name);
        goto fail;
    }
    if (add_bos)
        shoal_tok_add_prefix(t, t->bos_id);
    if (add_eos)
        shoal_tok_add_suffix(t, t->eos_id);

    if (spm) {
        /* llama.cpp: " " + fragment, then every space -> "▁" */
        if (add_space_prefix) {
            struct shoal_tok_norm_op *op =
                shoal_tok_add_norm(t, SHOAL_TOK_NORM_PREPEND);
            op->a = shoal_tok_memdup(" ", 1);
            op->a_len = 1;
        }
        struct shoal_tok_norm_op *op =
            shoal_tok_add_norm(t, SHOAL_TOK_NORM_REPLACE);
        op->a = shoal_tok_memdup(" ", 1);
        op->a_len = 1;
        op->b = shoal_tok_memdup("\xe2\x96\x81", 3);
        op->b_len = 3;
        t->dec_strip_leading = add_space_prefix;
        t->byte_fallback = 1;
    } else {
        for (const char *const *re = pt->regexes; *re; re++) {
            struct shoal_tok_pre_op *op =
                shoal_tok_add_pre(t, SHOAL_TOK_PRE_SPLIT);
            op->behavior = SHOAL_TOK_SPLIT_ISOLATED;
            char what[160];
            snprintf(what, sizeof what,
                     "gguf '%s': tokenizer.ggml.pre '%s'", name, pre);
            op->re = shoal_tok_regex_compile(*re, strlen(*re), 0, what, err);
            if (!op->re)
                goto fail;
        }
    }
    free(tmp);
    return t;
fail:
    free(tmp);
    shoal_tokenizer_destroy(t);
    return NULL;
}
