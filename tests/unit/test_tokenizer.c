/* tokenizer: every llama.cpp test vector of the shared GGUF vocabularies,
 * Hugging Face reference ids for the shared tokenizer.json files, round
 * trips, streaming decode, synthetic tokenizers for the pipeline's rules,
 * malformed inputs, the CLI, and speed.
 *
 * Tests that read ../shared skip (with the path in the message) when the
 * data is not there. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <criterion/redirect.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "config.h"
#include "gguf.h"
#include "tokenizer.h"
#include "unicode.h"
#include "util.h"
#include "test_fs.h"

#ifndef SHOAL_SHARED_DIR
#define SHOAL_SHARED_DIR "../shared"
#endif
#define TOKDIR SHOAL_SHARED_DIR "/data/tokenizers"
#define VOCABDIR TOKDIR "/llama.cpp"
#define VECTOR_SEP "\n__ggml_vocab_test__\n"

/* ------------------------------------------------------------------------
 * helpers
 */

static void need_shared(const char *path)
{
    if (access(path, R_OK) != 0)
        cr_skip("shared test data not available: %s", path);
}

static struct shoal_tokenizer *load_ok(const char *path)
{
    struct shoal_err err = {0};
    struct shoal_tokenizer *t = shoal_tokenizer_load(path, &err);
    cr_assert_not_null(t, "loading %s: %s", path, err.msg);
    return t;
}

static struct shoal_tokenizer *load_json_ok(const char *json)
{
    struct shoal_err err = {0};
    struct shoal_tokenizer *t =
        shoal_tokenizer_load_hf_mem(json, strlen(json), NULL, 0, "test",
                                    &err);
    cr_assert_not_null(t, "%s", err.msg);
    return t;
}

struct ids {
    int32_t *v;
    size_t n;
};

static struct ids enc(const struct shoal_tokenizer *t, const char *s,
                      size_t len, int add_special, int parse_special)
{
    struct shoal_err err = {0};
    struct ids r = {0};
    struct shoal_tokenize_params p = {.add_special = add_special,
                                      .parse_special = parse_special};
    int rc = shoal_tokenizer_encode(t, s, len, p, &r.v, &r.n, &err);
    cr_assert(eq(int, rc, 0), "encode failed: %s", err.msg);
    return r;
}

static struct ids encs(const struct shoal_tokenizer *t, const char *s,
                       int add_special, int parse_special)
{
    return enc(t, s, strlen(s), add_special, parse_special);
}

/* Parse "1 2 3" into ids (the .out format, also used for expectations). */
static struct ids parse_ids(const char *s)
{
    struct ids r = {0};
    r.v = malloc((strlen(s) / 2 + 2) * sizeof *r.v);
    cr_assert_not_null(r.v);
    for (;;) {
        while (*s == ' ')
            s++;
        if (!*s)
            break;
        char *end;
        long v = strtol(s, &end, 10);
        cr_assert(end != s, "bad id list near '%s'", s);
        r.v[r.n++] = (int32_t)v;
        s = end;
    }
    return r;
}

static int ids_equal(struct ids a, struct ids b)
{
    return a.n == b.n && (a.n == 0 || memcmp(a.v, b.v, a.n * 4) == 0);
}

static char *ids_str(struct ids a)
{
    size_t cap = a.n * 12 + 1, o = 0;
    char *s = malloc(cap);
    cr_assert_not_null(s);
    s[0] = '\0';
    for (size_t i = 0; i < a.n; i++)
        o += (size_t)snprintf(s + o, cap - o, "%s%d", i ? " " : "",
                              (int)a.v[i]);
    return s;
}

/* Assert ids == "want", printing both on failure. */
static void expect_ids(struct ids got, const char *want, const char *what)
{
    struct ids w = parse_ids(want);
    char *gs = ids_str(got);
    cr_expect(ids_equal(got, w), "%s: expected [%s], got [%s]", what, want,
              gs);
    free(gs);
    free(w.v);
}

static char *dec(const struct shoal_tokenizer *t, struct ids a, int skip)
{
    struct shoal_err err = {0};
    char *s = shoal_tokenizer_decode(t, a.v, a.n, skip, &err);
    cr_assert_not_null(s, "decode failed: %s", err.msg);
    return s;
}

/* The inputs of a llama.cpp vocab test, split exactly as
 * tests/test-tokenizer-0.cpp does: chunks separated by
 * "\n__ggml_vocab_test__\n"; a trailing separator ends the last chunk. */
struct vectors {
    char *inp, *out;
    size_t n;
    const char *text[128];
    size_t len[128];
    const char *want[128];
};

static void read_inputs(const char *inp_path, struct vectors *v)
{
    struct shoal_err err = {0};
    size_t n;
    cr_assert(eq(int, shoal_read_file(inp_path, 1 << 20, &v->inp, &n, &err),
                 0),
              "%s", err.msg);
    size_t pos = 0, sl = strlen(VECTOR_SEP);
    v->n = 0;
    while (pos < n) {
        cr_assert(v->n < 128);
        char *next = strstr(v->inp + pos, VECTOR_SEP);
        size_t end = next ? (size_t)(next - v->inp) : n;
        v->text[v->n] = v->inp + pos;
        v->len[v->n] = end - pos;
        v->n++;
        if (!next)
            break;
        pos = end + sl;
    }
}

static void read_vectors(const char *base, struct vectors *v)
{
    char inp[600], out[600];
    struct shoal_err err = {0};
    size_t n;
    snprintf(inp, sizeof inp, "%s.inp", base);
    snprintf(out, sizeof out, "%s.out", base);
    read_inputs(inp, v);
    cr_assert(eq(int, shoal_read_file(out, 1 << 20, &v->out, &n, &err), 0),
              "%s", err.msg);
    /* one line per input (std::getline: a final newline ends the last) */
    size_t k = 0;
    char *p = v->out;
    while (*p && k < 128) {
        char *nl = strchr(p, '\n');
        if (nl)
            *nl = '\0';
        v->want[k++] = p;
        if (!nl)
            break;
        p = nl + 1;
    }
    cr_assert(eq(sz, k, v->n), "%s: %zu inputs but %zu expected lines", base,
              v->n, k);
}

static void free_vectors(struct vectors *v)
{
    free(v->inp);
    free(v->out);
}

/* ------------------------------------------------------------------------
 * llama.cpp vocab vectors (add_special = false, parse_special = false, as
 * test-tokenizer-0.cpp calls common_tokenize)
 */

static void check_vocab(const char *vocab)
{
    char path[512];
    snprintf(path, sizeof path, VOCABDIR "/ggml-vocab-%s.gguf", vocab);
    need_shared(path);
    struct shoal_tokenizer *t = load_ok(path);
    struct vectors v = {0};
    read_vectors(path, &v);
    size_t pass = 0;
    for (size_t i = 0; i < v.n; i++) {
        struct ids got = enc(t, v.text[i], v.len[i], 0, 0);
        struct ids want = parse_ids(v.want[i]);
        if (ids_equal(got, want)) {
            pass++;
        } else {
            char *gs = ids_str(got);
            cr_expect(0, "%s vector %zu '%.*s': expected [%s], got [%s]",
                      vocab, i, (int)v.len[i], v.text[i], v.want[i], gs);
            free(gs);
        }
        /* lossless: decoding gives the input back */
        char *back = dec(t, got, 0);
        cr_expect(strlen(back) == v.len[i] &&
                      memcmp(back, v.text[i], v.len[i]) == 0,
                  "%s vector %zu does not round-trip: '%.*s' -> '%s'", vocab,
                  i, (int)v.len[i], v.text[i], back);
        free(back);
        free(got.v);
        free(want.v);
    }
    cr_log_info("%s: %zu/%zu llama.cpp vectors pass", vocab, pass, v.n);
    cr_assert(eq(sz, pass, v.n), "%s: %zu of %zu vectors pass", vocab, pass,
              v.n);
    free_vectors(&v);
    shoal_tokenizer_destroy(t);
}

Test(tokenizer, llama_spm_gguf_passes_every_llama_cpp_vector)
{
    check_vocab("llama-spm");
}

Test(tokenizer, gpt2_gguf_passes_every_llama_cpp_vector)
{
    check_vocab("gpt-2");
}

Test(tokenizer, deepseek_llm_gguf_passes_every_llama_cpp_vector)
{
    check_vocab("deepseek-llm");
}

static const char *const round_trip_texts[] = {
    "Hello world",
    "  leading and trailing spaces  ",
    "multiple\n\nnewlines\r\nand\ttabs",
    "unicode: h\303\251llo w\303\266rld \342\200\224 \303\247a va? "
    "\346\227\245\346\234\254\350\252\236 \355\225\234\352\265\255\354\226\264"
    " \316\225\316\273\316\273\316\267\316\275\316\271\316\272\316\254",
    "emoji \360\237\246\231\360\237\232\200 "
    "\360\237\221\250\342\200\215\360\237\221\251\342\200\215\360\237\221\247"
    " \342\234\205",
    "code: for (int i = 0; i < n; i++) { x[i] += 3.14159; }",
    "numbers 1234567890 and 3.5e-7, 100%!",
    "",
    " ",
    "\n",
    "                    many spaces",
};

#define N_ROUND_TRIP (sizeof round_trip_texts / sizeof round_trip_texts[0])

static void check_round_trip(struct shoal_tokenizer *t, const char *what)
{
    for (size_t i = 0; i < N_ROUND_TRIP; i++) {
        const char *s = round_trip_texts[i];
        struct ids a = encs(t, s, 1, 0);
        char *back = dec(t, a, 1);
        cr_expect(eq(str, back, (char *)s), "%s: round trip of text %zu",
                  what, i);
        free(back);
        free(a.v);
    }
}

Test(tokenizer, gpt_neox_gguf_loads_and_round_trips)
{
    const char *path = VOCABDIR "/ggml-vocab-gpt-neox.gguf";
    need_shared(path);
    struct shoal_tokenizer *t = load_ok(path);
    cr_assert(eq(i32, shoal_tokenizer_n_vocab(t), 50432));
    /* no tokenizer.ggml.pre: llama.cpp's "default" regexes */
    struct ids a = encs(t, "Hello world", 1, 0);
    expect_ids(a, "12092 1533", "gpt-neox 'Hello world'");
    free(a.v);
    check_round_trip(t, "gpt-neox");
    shoal_tokenizer_destroy(t);
}

/* ------------------------------------------------------------------------
 * tokenizer.json files against Hugging Face tokenizers
 *
 * The expected ids below were produced by Hugging Face tokenizers 0.23.2
 * (the Rust library, through its Node binding) from the same
 * tokenizer.json files, with add_special_tokens = true (special tokens
 * written in the text are parsed, HF's default), for the 46 llama.cpp test
 * strings followed by extra_texts.
 */

/* Texts appended to the 46 llama.cpp test strings. */
static const char *const extra_texts[] = {
    "<s>Hello</s> world <unk>",
    "x</s>  y",
    "héllo 🦙 wörld\n\n  x",
    "Ünïcödé — “quotes” and ‘apostrophes’… ½ ¼ ² ﬁ",
    "\ttab\tand    many     spaces   ",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "emoji: 👨\342\200\215👩\342\200\215👧\342\200\215👦 🏳\357\270\217\342\200\215🌈 🇫🇷 ✅❌",
    "|||IP_ADDRESS||| and |||EMAIL_ADDRESS||| <|endoftext|> <|padding|>",
    "the       wide        gaps                         ",
    "Café (NFD: Cafe\314\201) Å Å ﬀ",
    "a\r\nb\rc\302\240d\343\200\200e\342\200\250f",
    "' 's 'S 'll I'M",
    " <s> leading",
    "ends with space ",
    "\302\205nel\302\205",
};
static const char *const mixtral_expected[] = {
    "1 613 286 28705 28781 28705 29039 3370",
    "1 401 7736 263",
    "1",
    "1 259",
    "1 2287",
    "1 260",
    "1 28705 12",
    "1 28705 13",
    "1 28705 13 13",
    "1 28705 13 13 13",
    "1 28705 12 13",
    "1 22557 1526",
    "1 28705 22557 1526",
    "1 22557 3304",
    "1 28705 22557 3304",
    "1 28705 22557 3304 28808",
    "1 22557 28725 1526 28808",
    "1 28705 22557 28725 1526 28808",
    "1 28705 456 349 28705 243 162 169 156 28723 5222",
    "1 275 28734 28781 28783 28705 28787 17512 17722 18099 4053 9538",
    "1 2409 6986 929 2216 11134 17260 2073",
    "1 28705 30208 29847 30078 30890 30460 31692 31196 30845 30326 "
    "31396 30326 31379 29847 31032 228 161 132 30964 31032 31396 31901",
    "1 28705 30012 325 8027 28731 28705 243 162 155 185 29274 243 162 "
    "143 174 29096 325 27772 877 6054 278 3078 6486 601 28731 28705 "
    "30129 325 5041 877 27813 369 659 871 1216 6029 28731",
    "1 22557",
    "1 28705 22557",
    "1 259 22557",
    "1 2287 22557",
    "1 260 22557",
    "1 260 22557 13 2287 22557",
    "1 28705 325",
    "1 28705 13 327",
    "1 464 4204",
    "1 22557 28725 337 28742 455 28808 1602 460 368 28705 30707 1550 "
    "29242 30023 29010 24175 29487 29089 28740 28770 28740 28781 28740 "
    "28782 28740 29354 30328",
    "1 918 3946 13915",
    "1 28705 28770",
    "1 28705 28770 28770",
    "1 28705 28770 28770 28770",
    "1 28705 28770 28770 28770 28770",
    "1 28705 28770 28770 28770 28770 28770",
    "1 28705 28770 28770 28770 28770 28770 28770",
    "1 28705 28770 28770 28770 28770 28770 28770 28770",
    "1 28705 28770 28770 28770 28770 28770 28770 28770 28770",
    "1 28705 28770 28770 28770 28770 28770 28770 28770 28770 28770",
    "1 334 30389 28708 11004 29539 28707",
    "1 28705 2312 2178",
    "1 28705 13 28705 13 13 28705 13 13 13 28705 12 28705 12 12 28705 "
    "12 13 259 13 2287 13 260 13 355 13 30012 325 8027 28731 28705 243 "
    "162 155 185 29274 243 162 143 174 29096 325 27772 877 6054 278 "
    "3078 6486 601 28731 28705 30129 28705 243 162 169 156 243 162 169 "
    "156 28705 28770 28705 28770 28770 28705 28770 28770 28770 28705 "
    "28770 28770 28770 28770 28705 28770 28770 28770 28770 28770 28705 "
    "28770 28770 28770 28770 28770 28770 28705 28770 28770 28770 28770 "
    "28770 28770 28770 28705 28770 28770 28770 28770 28770 28770 28770 "
    "28770 28705 28770 28723 28770 28705 28770 568 28770 28705 28770 "
    "1101 28770 28705 30208 29847 30078 30890 30460 31692 31196 30845 "
    "30326 31396 30326 31379 29847 31032 30707 1550 29242 30023 29010 "
    "24175 29487 29089 28740 28770 28740 28781 28740 28782 28740 29354 "
    "30328 28705 18697 965 14203 2409 6986 929 2216 11134 17260 2073 "
    "23713 25135 13940 13940 13940 28832 2539 2539 3406 568 19010 3946 "
    "8908 8908 8908 315 28742 333 750 464 28707 738 400 28742 28713 736 "
    "28725 464 896 368 1864 28804 464 28755 459 1864 315 28742 584 1038 "
    "378 28725 464 28757 368 737 741 9510 28804 816 28742 28790 28706 "
    "264 28742 28714 28758",
    "1 1 22557 2 28705 1526 28705 0",
    "1 1318 2 259 337",
    "1 295 28797 584 28709 28705 243 162 169 156 275 2024 417 13 13 "
    "28705 1318",
    "1 13156 28711 28920 28717 14697 28797 1040 981 364 4769 28838 304 "
    "3475 377 504 1506 2053 28809 28878 28705 29039 28705 29472 28705 "
    "28941 28705 30160",
    "1 28705 12 4252 12 391 2287 1287 260 10599 2287",
    "1 28705 29142 29119 30321 28993 29610 29753 29109 29123 29041 "
    "28991 29019 29019 29119 28924 29282 30779 29433 28705 240 136 144 "
    "29304 29404",
    "1 877 27813 28747 28705 243 162 148 171 29274 243 162 148 172 "
    "29274 243 162 148 170 29274 243 162 148 169 28705 243 162 146 182 "
    "29096 29274 243 162 143 139 28705 243 162 138 174 243 162 138 186 "
    "28705 30129 31200",
    "1 1636 28766 2665 28730 25100 9173 28766 304 1636 28766 28749 "
    "28297 28730 25100 9173 28766 523 28766 416 1009 772 28766 28767 "
    "523 28766 13712 28766 28767",
    "1 272 428 5335 5390 27612 359 2600",
    "1 334 2015 28797 325 28759 11858 28747 11013 1512 28949 28731 "
    "15744 15744 28705 242 175 131",
    "1 264 28801 13 28726 28801 28717 29000 28715 29351 28706 229 131 "
    "171 28722",
    "1 464 464 28713 464 28735 464 584 315 28742 28755",
    "1 259 1 28705 5374",
    "1 9675 395 2764 28705",
    "1 28705 31363 8062 31363",
};
static const char *const olmoe_expected[] = {
    "728 577 24142 2607",
    "39 26288 6554",
    "",
    "209",
    "50276",
    "50275",
    "186",
    "187",
    "535",
    "2756",
    "186 187",
    "12092 1533",
    "24387 1533",
    "12092 3645",
    "24387 3645",
    "24387 3645 2",
    "12092 13 1533 2",
    "24387 13 1533 2",
    "436 310 22692 101 236 15 14161",
    "88 27244 818 16853 16392 20505 4989 11917",
    "32520 11514 1068 8713 38177 13396 3415 9925 12559 10453 1389",
    "18081 211 18081 116 18081 230 39936 222 18081 226 39936 213 18081 "
    "233 18081 117 18081 242 39936 212 18081 242 18081 97 18081 116 "
    "18081 216 18081 212 18081 238 18081 216 39936 212 18081 220",
    "14931 237 211 313 6320 10 49042 116 325 224 14931 223 106 171 118 "
    "226 313 34263 802 13511 261 32147 456 10 3384 239 216 313 7483 802 "
    "80 8020 326 556 697 1211 10669 10",
    "12092",
    "24387",
    "50276 12092",
    "50275 12092",
    "50274 12092",
    "50274 12092 187 50274 12092",
    "313",
    "187 426",
    "8 8685",
    "12092 13 340 8 455 2 1359 403 368 49042 212 3736 15367 41197 13610 "
    "19934 41869 21275 1012 1047 18795 40120 20422 241",
    "18963 4672",
    "20",
    "1610",
    "20084",
    "26409",
    "1610 20084",
    "26409 1610",
    "26409 20084",
    "26409 26409",
    "26409 1610 20084",
    "36 6829 244 66 17721 35177 85",
    "1262 2196",
    "586 1744 33525 186 209 623 28910 187 50276 187 50275 187 50274 187 "
    "50273 187 14931 237 211 313 6320 10 49042 116 325 224 14931 223 "
    "106 171 118 226 313 34263 802 13511 261 32147 456 10 3384 239 216 "
    "22692 101 236 14931 101 236 495 5922 30057 495 20084 495 26409 "
    "30057 20084 495 26409 1610 495 26409 20084 495 15 20 495 537 20 "
    "495 1051 20 209 18081 211 18081 116 18081 230 39936 222 18081 226 "
    "39936 213 18081 233 18081 117 18081 242 39936 212 18081 242 18081 "
    "97 18081 116 18081 216 14931 235 212 3736 15367 41197 13610 19934 "
    "41869 21275 1012 1047 18795 40120 20422 241 16081 6877 12880 11514 "
    "1068 8713 38177 13396 3415 9925 12559 10453 1389 42011 35033 34842 "
    "11202 9739 9739 33021 18963 4672 25561 8220 309 1849 644 686 42618 "
    "344 434 627 13 686 1848 368 2119 32 686 46 417 2119 309 1833 1056 "
    "352 13 686 37 368 751 690 10331 32 844 8 31516 247 8 77 45",
    "29 84 31 12092 870 84 31 1533 654 3938 31",
    "89 870 84 31 50276 90",
    "73 860 48620 22692 101 236 259 6592 392 535 50276 89",
    "127 239 79 12589 68 25873 860 1905 773 371 4787 668 285 2802 522 "
    "493 1658 1041 457 2866 24142 36444 1191 112 16141 107 212",
    "186 8476 186 395 50274 20415 50273 31748 50275",
    "49868 19119 241 3917 28656 33548 38206 4746 13609 20855 20855 "
    "18957 6238 39742 166 115 244 39907 25811 216 224 33057 99 169 221 "
    "118",
    "43208 8020 27 22692 228 103 325 224 14931 228 104 325 224 14931 "
    "228 102 325 224 14931 228 101 22692 226 113 171 118 226 325 224 "
    "14931 223 219 22692 218 106 14931 218 117 3384 239 216 158 240 223",
    "0 285 209 50277 209 50279 209 1",
    "783 50271 4363 50270 72 1825 50254 209",
    "36 2320 860 313 8016 37 27 42107 860 10 17732 17732 16141 107 211",
    "66 190 187 67 190 68 575 69 19409 70 40702 71",
    "8 686 84 686 52 686 620 309 8 46",
    "654 84 31 4283",
    "1727 342 2317 209",
    "16643 8101 16643",
};

#define N_EXTRA (sizeof extra_texts / sizeof extra_texts[0])

static void check_hf(const char *file, const char *const *expected,
                     size_t n_expected)
{
    char path[512];
    snprintf(path, sizeof path, TOKDIR "/%s", file);
    need_shared(path);
    need_shared(VOCABDIR "/ggml-vocab-gpt-2.gguf.inp");
    struct shoal_tokenizer *t = load_ok(path);
    struct vectors v = {0};
    read_inputs(VOCABDIR "/ggml-vocab-gpt-2.gguf.inp", &v);
    cr_assert(eq(sz, v.n + N_EXTRA, n_expected));
    size_t pass = 0;
    for (size_t i = 0; i < n_expected; i++) {
        const char *s = i < v.n ? v.text[i] : extra_texts[i - v.n];
        size_t len = i < v.n ? v.len[i] : strlen(s);
        struct ids got = enc(t, s, len, 1, 1);
        struct ids want = parse_ids(expected[i]);
        if (ids_equal(got, want)) {
            pass++;
        } else {
            char *gs = ids_str(got);
            cr_expect(0, "%s text %zu '%.*s': expected [%s], got [%s]", file,
                      i, (int)len, s, expected[i], gs);
            free(gs);
        }
        free(got.v);
        free(want.v);
    }
    cr_log_info("%s: %zu/%zu reference encodings match", file, pass,
                n_expected);
    cr_assert(eq(sz, pass, n_expected));
    free_vectors(&v);
    shoal_tokenizer_destroy(t);
}

Test(tokenizer, mixtral_json_matches_hf_reference)
{
    check_hf("Mixtral-8x7B-v0.1.tokenizer.json", mixtral_expected,
             sizeof mixtral_expected / sizeof mixtral_expected[0]);
}

Test(tokenizer, olmoe_json_matches_hf_reference)
{
    check_hf("OLMoE_gpt-neox-olmo-dolma-v1_5.tokenizer.json", olmoe_expected,
             sizeof olmoe_expected / sizeof olmoe_expected[0]);
}

Test(tokenizer, mixtral_hello_world_has_the_known_ids)
{
    const char *path = TOKDIR "/Mixtral-8x7B-v0.1.tokenizer.json";
    need_shared(path);
    struct shoal_tokenizer *t = load_ok(path);
    struct ids a = encs(t, "Hello world", 1, 0);
    expect_ids(a, "1 22557 1526", "Mixtral 'Hello world' with BOS");
    free(a.v);
    a = encs(t, "Hello world", 0, 0);
    expect_ids(a, "22557 1526", "Mixtral 'Hello world' without BOS");
    free(a.v);
    /* from tokenizer_config.json beside it */
    cr_assert(eq(i32, shoal_tokenizer_bos(t), 1));
    cr_assert(eq(i32, shoal_tokenizer_eos(t), 2));
    cr_assert(eq(i32, shoal_tokenizer_n_vocab(t), 32000));
    cr_assert(eq(i32, shoal_tokenizer_token_id(t, "</s>"), 2));
    cr_assert(eq(i32, shoal_tokenizer_token_id(t, "\342\226\201Hello"),
                 22557));
    cr_assert(eq(int, shoal_tokenizer_is_special(t, 1), 1));
    cr_assert(eq(int, shoal_tokenizer_is_special(t, 22557), 0));
    /* special tokens in the text only with parse_special */
    a = encs(t, "</s>", 0, 1);
    expect_ids(a, "2", "parsed </s>");
    free(a.v);
    a = encs(t, "</s>", 0, 0);
    cr_expect(a.n > 1, "unparsed </s> must be plain text");
    free(a.v);
    shoal_tokenizer_destroy(t);
}

Test(tokenizer, json_tokenizers_round_trip_text)
{
    const char *files[] = {TOKDIR "/Mixtral-8x7B-v0.1.tokenizer.json",
                           TOKDIR
                           "/OLMoE_gpt-neox-olmo-dolma-v1_5.tokenizer.json"};
    for (size_t f = 0; f < 2; f++) {
        need_shared(files[f]);
        struct shoal_tokenizer *t = load_ok(files[f]);
        check_round_trip(t, files[f]);
        shoal_tokenizer_destroy(t);
    }
}

Test(tokenizer, olmoe_json_has_eos_and_no_bos)
{
    const char *path = TOKDIR "/OLMoE_gpt-neox-olmo-dolma-v1_5.tokenizer.json";
    need_shared(path);
    struct shoal_tokenizer *t = load_ok(path);
    cr_assert(eq(i32, shoal_tokenizer_bos(t), -1));
    cr_assert(eq(i32, shoal_tokenizer_eos(t), 50279));
    /* byte-level vocabularies are looked up as raw bytes */
    cr_assert(eq(i32, shoal_tokenizer_token_id(t, " the"), 253));
    /* a non-special added token is matched even without parse_special */
    struct ids a = encs(t, "|||IP_ADDRESS|||", 1, 0);
    expect_ids(a, "0", "non-special added token");
    free(a.v);
    shoal_tokenizer_destroy(t);
}

/* ------------------------------------------------------------------------
 * streaming decode
 */

/* Feed the ids of text one at a time: every chunk is complete UTF-8 and
 * the chunks add up to the full decode, which is text. Returns how many
 * feeds held everything back. */
static size_t check_stream(const struct shoal_tokenizer *t, const char *text,
                           int add_special)
{
    struct ids a = encs(t, text, add_special, 0);
    char *full = dec(t, a, 1);
    cr_assert(eq(str, full, (char *)text), "full decode");
    struct shoal_detok *d = shoal_detok_create(t, 1);
    size_t cap = shoal_detok_out_max(t);
    char *chunk = malloc(cap);
    char *cat = calloc(1, strlen(text) + 16);
    size_t n_cat = 0, held = 0;
    for (size_t i = 0; i < a.n; i++) {
        struct shoal_err err = {0};
        int n = shoal_detok_feed(d, a.v[i], chunk, cap, &err);
        cr_assert(n >= 0, "feed %d: %s", (int)a.v[i], err.msg);
        cr_assert(eq(sz, strlen(chunk), (size_t)n));
        cr_assert(shoal_utf8_is_valid(chunk, (size_t)n),
                  "chunk %zu of '%s' is not complete UTF-8", i, text);
        /* held back: nothing came out for an ordinary token (the first
         * two may be BOS or a stripped leading space) */
        if (n == 0 && i > 1 && !shoal_tokenizer_is_special(t, a.v[i]))
            held++;
        cr_assert(n_cat + (size_t)n <= strlen(text));
        memcpy(cat + n_cat, chunk, (size_t)n);
        n_cat += (size_t)n;
    }
    int n = shoal_detok_flush(d, chunk, cap);
    cr_assert(eq(int, n, 0), "nothing may be left after a whole text");
    cat[n_cat] = '\0';
    cr_assert(eq(str, cat, full), "streamed text differs from decode");
    free(cat);
    free(chunk);
    free(full);
    free(a.v);
    shoal_detok_destroy(d);
    return held;
}

static const char *const stream_texts[] = {
    " this is \360\237\246\231.cpp",
    "ied 4 \302\275 months",
    "\341\236\200\341\236\266\341\236\223\341\237\213\341\236\217\341\237\202"
    "\341\236\226\341\236\267\341\236\237\341\237\201\341\236\237",
    "\360\237\232\200 (normal) "
    "\360\237\230\266\342\200\215\360\237\214\253\357\270\217 (multiple)",
    "\346\210\221\346\203\263\345\234\250apple\345\267\245\344\275\2341314151"
    "\345\244\251\357\275\236",
};

Test(tokenizer, streaming_decode_never_emits_partial_utf8)
{
    const char *files[] = {
        VOCABDIR "/ggml-vocab-llama-spm.gguf",
        VOCABDIR "/ggml-vocab-gpt-2.gguf",
        VOCABDIR "/ggml-vocab-deepseek-llm.gguf",
        TOKDIR "/Mixtral-8x7B-v0.1.tokenizer.json",
        TOKDIR "/OLMoE_gpt-neox-olmo-dolma-v1_5.tokenizer.json",
    };
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        need_shared(files[f]);
        struct shoal_tokenizer *t = load_ok(files[f]);
        size_t held = 0;
        for (size_t k = 0; k < sizeof stream_texts / sizeof stream_texts[0];
             k++)
            held += check_stream(t, stream_texts[k], k % 2);
        /* the texts do split characters across tokens in every family */
        cr_assert(held > 0, "%s: no character was split across tokens",
                  files[f]);
        shoal_tokenizer_destroy(t);
    }
}

Test(tokenizer, detok_holds_byte_fallback_bytes_until_complete)
{
    const char *path = VOCABDIR "/ggml-vocab-llama-spm.gguf";
    need_shared(path);
    struct shoal_tokenizer *t = load_ok(path);
    /* U+1F999 = F0 9F A6 99 = <0xF0> <0x9F> <0xA6> <0x99> */
    const int32_t llama[] = {243, 162, 169, 156};
    struct shoal_detok *d = shoal_detok_create(t, 1);
    char out[64];
    struct shoal_err err = {0};
    for (int i = 0; i < 3; i++)
        cr_assert(eq(int, shoal_detok_feed(d, llama[i], out, sizeof out, &err),
                     0));
    cr_assert(eq(int, shoal_detok_feed(d, llama[3], out, sizeof out, &err),
                 4));
    cr_assert(eq(str, out, "\360\237\246\231"));
    shoal_detok_destroy(d);

    /* an unfinished sequence is flushed as one U+FFFD */
    d = shoal_detok_create(t, 1);
    shoal_detok_feed(d, 243, out, sizeof out, &err);
    shoal_detok_feed(d, 162, out, sizeof out, &err);
    cr_assert(eq(int, shoal_detok_flush(d, out, sizeof out), 3));
    cr_assert(eq(str, out, "\357\277\275"));
    shoal_detok_destroy(d);

    /* a byte that can never start a sequence becomes U+FFFD at once */
    d = shoal_detok_create(t, 1);
    cr_assert(eq(int, shoal_detok_feed(d, 3 + 0xFF, out, sizeof out, &err),
                 3));
    cr_assert(eq(str, out, "\357\277\275"));
    shoal_detok_destroy(d);
    shoal_tokenizer_destroy(t);
}

Test(tokenizer, detok_rejects_bad_ids_and_short_buffers_keep_state)
{
    const char *path = VOCABDIR "/ggml-vocab-llama-spm.gguf";
    need_shared(path);
    struct shoal_tokenizer *t = load_ok(path);
    struct shoal_detok *d = shoal_detok_create(t, 0);
    char out[64];
    struct shoal_err err = {0};
    cr_assert(eq(int, shoal_detok_feed(d, -1, out, sizeof out, &err),
                 SHOAL_ERANGE));
    cr_assert_not_null(strstr(err.msg, "-1"), "%s", err.msg);
    shoal_err_clear(&err);
    cr_assert(eq(int, shoal_detok_feed(d, 32000, out, sizeof out, &err),
                 SHOAL_ERANGE));
    cr_assert_not_null(strstr(err.msg, "32000"), "%s", err.msg);
    /* 15043 = "▁Hello": too small a buffer is an error and consumes
     * nothing, so the leading-space strip still applies on retry */
    shoal_err_clear(&err);
    cr_assert(eq(int, shoal_detok_feed(d, 15043, out, 3, &err),
                 SHOAL_ERANGE));
    cr_assert(eq(int, shoal_detok_feed(d, 15043, out, sizeof out, &err), 5));
    cr_assert(eq(str, out, "Hello"));
    cr_assert(eq(int, shoal_detok_feed(d, 15043, out, sizeof out, &err), 6));
    cr_assert(eq(str, out, " Hello"));
    /* decode reports a bad id too */
    int32_t bad[] = {15043, 99999};
    shoal_err_clear(&err);
    cr_assert_null(shoal_tokenizer_decode(t, bad, 2, 0, &err));
    cr_assert(eq(int, err.code, SHOAL_ERANGE));
    shoal_detok_destroy(d);
    shoal_detok_destroy(NULL);
    shoal_tokenizer_destroy(t);
    shoal_tokenizer_destroy(NULL);
}

Test(tokenizer, special_tokens_render_unless_skipped)
{
    const char *path = TOKDIR "/Mixtral-8x7B-v0.1.tokenizer.json";
    need_shared(path);
    struct shoal_tokenizer *t = load_ok(path);
    struct ids a = encs(t, "Hello world", 1, 0);
    char *s = dec(t, a, 0);
    cr_assert(eq(str, s, "<s> Hello world"));
    free(s);
    s = dec(t, a, 1);
    cr_assert(eq(str, s, "Hello world"));
    free(s);
    free(a.v);
    shoal_tokenizer_destroy(t);
}

/* ------------------------------------------------------------------------
 * synthetic tokenizer.json: added tokens, splits, normalizers
 */

/* chars a b c, space; merges a+b, ab+c, " "+a; added tokens <x> (special,
 * lstrip, rstrip), <unk>, zz (not special), cab (single word) */
static const char tiny_json[] =
    "{\"version\":\"1.0\",\"added_tokens\":["
    "{\"id\":7,\"content\":\"<x>\",\"special\":true,\"lstrip\":true,"
    "\"rstrip\":true,\"single_word\":false,\"normalized\":false},"
    "{\"id\":8,\"content\":\"<unk>\",\"special\":true,\"normalized\":false},"
    "{\"id\":9,\"content\":\"zz\",\"special\":false,\"normalized\":false},"
    "{\"id\":10,\"content\":\"cab\",\"special\":false,\"single_word\":true,"
    "\"normalized\":false}],"
    "\"normalizer\":null,"
    "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},"
    "\"behavior\":\"MergedWithNext\",\"invert\":false},"
    "\"post_processor\":null,\"decoder\":null,"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":false,"
    "\"byte_fallback\":false,"
    "\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\" \":3,\"ab\":4,\"abc\":5,\" a\":6},"
    "\"merges\":[[\"a\",\"b\"],\"ab c\",[\" \",\"a\"]]}}";

/* Ids far past the file's token count (a toy vocabulary with a model's
 * special tokens at their real ids, or one id near 2^24) are kept in a
 * sparse table: they encode, merge, decode and answer the id queries like
 * dense ones, an id in the hole between is an empty, non-special token, and
 * the id space still ends at the largest id. (The memory this saves is
 * measured on a real process by tests/cli/test_tokenizer_ids.py.) */
Test(tokenizer, sparse_ids_far_past_the_token_count_work)
{
    struct shoal_tokenizer *t = load_json_ok(
        "{\"version\":\"1.0\",\"added_tokens\":["
        "{\"id\":16000000,\"content\":\"<x>\",\"special\":true,\"normalized\":false},"
        "{\"id\":12000000,\"content\":\"c\",\"special\":false,\"normalized\":false}],"
        "\"normalizer\":null,\"pre_tokenizer\":null,\"post_processor\":null,"
        "\"decoder\":null,\"model\":{\"type\":\"BPE\",\"unk_token\":null,"
        "\"vocab\":{\"a\":0,\"b\":1,\"ab\":9000000,\"c\":12000000},"
        "\"merges\":[\"a b\"]}}");
    cr_assert(eq(i32, shoal_tokenizer_n_vocab(t), 16000001));
    struct ids a = encs(t, "abc<x>ba", 0, 1);
    expect_ids(a, "9000000 12000000 16000000 1 0", "'abc<x>ba'");
    char *s = dec(t, a, 0);
    cr_assert(eq(str, s, "abc<x>ba"));
    free(s);
    s = dec(t, a, 1);
    cr_assert(eq(str, s, "abcba"));
    free(s);
    free(a.v);
    cr_assert(eq(i32, shoal_tokenizer_token_id(t, "<x>"), 16000000));
    cr_assert(eq(i32, shoal_tokenizer_token_id(t, "ab"), 9000000));
    cr_assert(eq(int, shoal_tokenizer_is_special(t, 16000000), 1));
    cr_assert(eq(int, shoal_tokenizer_is_special(t, 12000000), 0));
    cr_assert(eq(int, shoal_tokenizer_is_special(t, 15000000), 0));
    const char *text = NULL;
    size_t len = 99;
    cr_assert(eq(int, shoal_tokenizer_token_text(t, 9000000, &text, &len), 0));
    cr_assert(eq(sz, len, 2));
    cr_assert(eq(int, memcmp(text, "ab", 2), 0));
    cr_assert(eq(int, shoal_tokenizer_token_text(t, 15000000, &text, &len), 0));
    cr_assert(eq(sz, len, 0), "a hole has no text");
    cr_assert(eq(int, shoal_tokenizer_token_text(t, 16000001, &text, &len),
                 SHOAL_ERANGE));
    int32_t hole[] = {0, 15000000, 1};
    struct shoal_err err = {0};
    s = shoal_tokenizer_decode(t, hole, 3, 0, &err);
    cr_assert_not_null(s, "%s", err.msg);
    cr_assert(eq(str, s, "ab"));
    free(s);
    int32_t past[] = {0, 16000001};
    cr_assert_null(shoal_tokenizer_decode(t, past, 2, 0, &err));
    cr_assert(eq(int, err.code, SHOAL_ERANGE));
    shoal_tokenizer_destroy(t);
}

Test(tokenizer, bpe_merges_by_rank_within_pieces)
{
    struct shoal_tokenizer *t = load_json_ok(tiny_json);
    struct ids a = encs(t, "abc abc", 1, 0);
    /* "abc" -> a b c -> ab c -> abc; " abc": " "+a (rank 2) loses to
     * a+b (rank 0), then ab+c */
    expect_ids(a, "5 3 5", "'abc abc'");
    char *s = dec(t, a, 1);
    cr_assert(eq(str, s, "abc abc"));
    free(s);
    free(a.v);
    a = encs(t, " a", 1, 0);
    expect_ids(a, "6", "' a'");
    free(a.v);
    shoal_tokenizer_destroy(t);
}

Test(tokenizer, added_tokens_strip_and_parse_special)
{
    struct shoal_tokenizer *t = load_json_ok(tiny_json);
    /* <x> eats the spaces on both sides */
    struct ids a = encs(t, "a <x> b", 0, 1);
    expect_ids(a, "0 7 1", "parsed <x> with lstrip/rstrip");
    free(a.v);
    /* not parsed: plain text, unknown characters become <unk> */
    a = encs(t, "a <x> b", 0, 0);
    expect_ids(a, "0 3 8 8 8 3 1", "unparsed <x>");
    free(a.v);
    /* a non-special added token is always matched */
    a = encs(t, "zzazz", 0, 0);
    expect_ids(a, "9 0 9", "non-special added token");
    free(a.v);
    /* single_word: only as a whole word */
    a = encs(t, "a cab b", 0, 0);
    expect_ids(a, "0 3 10 3 1", "single word 'cab'");
    free(a.v);
    a = encs(t, "xcab", 0, 0);
    expect_ids(a, "8 2 4", "'cab' inside a word");
    free(a.v);
    cr_assert(eq(i32, shoal_tokenizer_token_id(t, "zz"), 9));
    cr_assert(eq(i32, shoal_tokenizer_token_id(t, "nope"), -1));
    cr_assert(eq(int, shoal_tokenizer_is_special(t, 7), 1));
    cr_assert(eq(int, shoal_tokenizer_is_special(t, 9), 0));
    shoal_tokenizer_destroy(t);
}

/* vocab a b - and the pairs a-, -b, --: each split behavior shows in
 * which pairs can merge */
static struct shoal_tokenizer *split_tok(const char *behavior, int invert)
{
    char json[1024];
    snprintf(json, sizeof json,
             "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":"
             "\"-\"},\"behavior\":\"%s\",\"invert\":%s},"
             "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"-\":2,"
             "\"a-\":3,\"-b\":4,\"--\":5},"
             "\"merges\":[\"a -\",\"- b\",\"- -\"]}}",
             behavior, invert ? "true" : "false");
    return load_json_ok(json);
}

Test(tokenizer, split_behaviors_follow_hf)
{
    static const struct {
        const char *behavior;
        int invert;
        const char *text, *want;
    } cases[] = {
        {"Isolated", 0, "a-b", "0 2 1"},
        {"Removed", 0, "a-b", "0 1"},
        {"MergedWithPrevious", 0, "a-b", "3 1"},
        {"MergedWithNext", 0, "a-b", "0 4"},
        {"Contiguous", 0, "a--b", "0 5 1"},
        {"Isolated", 0, "a--b", "0 2 2 1"},
        {"Removed", 1, "a-b", "2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct shoal_tokenizer *t = split_tok(cases[i].behavior,
                                              cases[i].invert);
        struct ids a = encs(t, cases[i].text, 0, 0);
        char what[128];
        snprintf(what, sizeof what, "%s%s on '%s'", cases[i].behavior,
                 cases[i].invert ? " (inverted)" : "", cases[i].text);
        expect_ids(a, cases[i].want, what);
        free(a.v);
        shoal_tokenizer_destroy(t);
    }
}

Test(tokenizer, normalizers_run_in_sequence)
{
    /* NFKC turns fullwidth letters into ASCII, then Lowercase, then
     * runs of spaces collapse */
    const char *json =
        "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":["
        "{\"type\":\"NFKC\"},{\"type\":\"Lowercase\"},"
        "{\"type\":\"Replace\",\"pattern\":{\"Regex\":\" {2,}\"},"
        "\"content\":\" \"}]},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,"
        "\" \":3},\"merges\":[\"a b\"]}}";
    struct shoal_tokenizer *t = load_json_ok(json);
    struct ids a = encs(t, "\357\274\241B    ab", 0, 0); /* "ＡB    ab" */
    expect_ids(a, "2 3 2", "normalized text");
    free(a.v);
    shoal_tokenizer_destroy(t);
}

Test(tokenizer, metaspace_prepends_per_scheme)
{
    const char *fmt =
        "{\"added_tokens\":[{\"id\":5,\"content\":\"<x>\",\"special\":true,"
        "\"normalized\":false}],"
        "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":"
        "\"\342\226\201\",\"prepend_scheme\":\"%s\",\"split\":true},"
        "\"decoder\":{\"type\":\"Metaspace\",\"replacement\":"
        "\"\342\226\201\",\"prepend_scheme\":\"%s\",\"split\":true},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"\342\226\201\":0,\"a\":1,"
        "\"b\":2,\"\342\226\201a\":3,\"\342\226\201b\":4},"
        "\"merges\":[\"\342\226\201 a\",\"\342\226\201 b\"]}}";
    char json[1024];
    snprintf(json, sizeof json, fmt, "first", "first");
    struct shoal_tokenizer *t = load_json_ok(json);
    struct ids a = encs(t, "a b", 0, 0);
    expect_ids(a, "3 4", "Metaspace first on 'a b'");
    char *s = dec(t, a, 1);
    cr_assert(eq(str, s, "a b"));
    free(s);
    free(a.v);
    /* "first": only the text at the start of the input gets "▁" */
    a = encs(t, "a<x>b", 0, 1);
    expect_ids(a, "3 5 2", "Metaspace first around a special token");
    free(a.v);
    shoal_tokenizer_destroy(t);

    snprintf(json, sizeof json, fmt, "always", "always");
    t = load_json_ok(json);
    a = encs(t, "a<x>b", 0, 1);
    expect_ids(a, "3 5 4", "Metaspace always around a special token");
    free(a.v);
    shoal_tokenizer_destroy(t);
}

Test(tokenizer, template_processing_and_config_set_bos_eos)
{
    const char *json =
        "{\"added_tokens\":[{\"id\":0,\"content\":\"<s>\",\"special\":true},"
        "{\"id\":1,\"content\":\"</s>\",\"special\":true}],"
        "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":["
        "{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
        "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
        "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[0],"
        "\"tokens\":[\"<s>\"]}}},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"<s>\":0,\"</s>\":1,"
        "\"a\":2},\"merges\":[]}}";
    struct shoal_err err = {0};
    struct shoal_tokenizer *t = load_json_ok(json);
    struct ids a = encs(t, "a", 1, 0);
    expect_ids(a, "0 2", "template BOS");
    free(a.v);
    cr_assert(eq(i32, shoal_tokenizer_bos(t), 0));
    cr_assert(eq(i32, shoal_tokenizer_eos(t), 1), "guessed from '</s>'");
    shoal_tokenizer_destroy(t);

    /* tokenizer_config.json turns BOS off and EOS on */
    const char *cfg = "{\"add_bos_token\":false,\"add_eos_token\":true,"
                      "\"bos_token\":\"<s>\",\"eos_token\":{\"content\":"
                      "\"</s>\"},\"model_max_length\":"
                      "1000000000000000019884624838656}";
    t = shoal_tokenizer_load_hf_mem(json, strlen(json), cfg, strlen(cfg),
                                    "cfg", &err);
    cr_assert_not_null(t, "%s", err.msg);
    a = encs(t, "a", 1, 0);
    expect_ids(a, "2 1", "config: no BOS, EOS");
    free(a.v);
    shoal_tokenizer_destroy(t);
}

/* ------------------------------------------------------------------------
 * synthetic GGUF tokenizers
 */

struct gw {
    unsigned char *p;
    size_t n, cap;
};

static void gw_bytes(struct gw *w, const void *s, size_t n)
{
    if (w->n + n > w->cap) {
        w->cap = (w->n + n) * 2 + 64;
        w->p = realloc(w->p, w->cap);
        cr_assert_not_null(w->p);
    }
    memcpy(w->p + w->n, s, n);
    w->n += n;
}

static void gw_uint(struct gw *w, uint64_t v, unsigned bytes)
{
    unsigned char b[8];
    for (unsigned i = 0; i < bytes; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    gw_bytes(w, b, bytes);
}

static void gw_str(struct gw *w, const char *s)
{
    gw_uint(w, strlen(s), 8);
    gw_bytes(w, s, strlen(s));
}

static void gw_kv_str(struct gw *w, const char *k, const char *v)
{
    gw_str(w, k);
    gw_uint(w, SHOAL_GGUF_TYPE_STRING, 4);
    gw_str(w, v);
}

static void gw_kv_bool(struct gw *w, const char *k, int v)
{
    gw_str(w, k);
    gw_uint(w, SHOAL_GGUF_TYPE_BOOL, 4);
    gw_uint(w, (uint64_t)v, 1);
}

static void gw_kv_strs(struct gw *w, const char *k, const char *const *v,
                       size_t n)
{
    gw_str(w, k);
    gw_uint(w, SHOAL_GGUF_TYPE_ARRAY, 4);
    gw_uint(w, SHOAL_GGUF_TYPE_STRING, 4);
    gw_uint(w, n, 8);
    for (size_t i = 0; i < n; i++)
        gw_str(w, v[i]);
}

static void gw_kv_nums(struct gw *w, const char *k, uint32_t type,
                       const void *v, size_t n)
{
    gw_str(w, k);
    gw_uint(w, SHOAL_GGUF_TYPE_ARRAY, 4);
    gw_uint(w, type, 4);
    gw_uint(w, n, 8);
    gw_bytes(w, v, n * 4); /* host is little-endian in these tests */
}

static struct shoal_tokenizer *gguf_tok(struct gw *w, struct shoal_err *err)
{
    struct shoal_gguf *g = shoal_gguf_open_mem(w->p, w->n, "synthetic", err);
    cr_assert_not_null(g, "%s", err->msg);
    struct shoal_tokenizer *t = shoal_tokenizer_load_gguf(g, "synthetic", err);
    shoal_gguf_close(g);
    return t;
}

/* SentencePiece vocabulary: <unk> <s> </s>, 256 byte tokens, then pieces */
static struct gw spm_gguf(float score_ab, float score_bc, int space_prefix)
{
    static const char *const pieces[] = {"\342\226\201", "a", "b", "c",
                                         "ab", "bc"};
    enum { N = 3 + 256 + 6 };
    static char bytes[256][7];
    const char *tokens[N];
    float scores[N];
    int32_t types[N];
    tokens[0] = "<unk>", tokens[1] = "<s>", tokens[2] = "</s>";
    types[0] = 2, types[1] = types[2] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        tokens[3 + b] = bytes[b];
        types[3 + b] = 6;
    }
    for (int i = 0; i < 6; i++) {
        tokens[259 + i] = pieces[i];
        types[259 + i] = 1;
    }
    for (int i = 0; i < N; i++)
        scores[i] = -100.0f;
    scores[259 + 4] = score_ab;
    scores[259 + 5] = score_bc;
    struct gw w = {0};
    gw_bytes(&w, "GGUF", 4);
    gw_uint(&w, 3, 4);
    gw_uint(&w, 0, 8);
    gw_uint(&w, space_prefix ? 4 : 5, 8);
    gw_kv_str(&w, "tokenizer.ggml.model", "llama");
    gw_kv_strs(&w, "tokenizer.ggml.tokens", tokens, N);
    gw_kv_nums(&w, "tokenizer.ggml.scores", SHOAL_GGUF_TYPE_FLOAT32, scores,
               N);
    gw_kv_nums(&w, "tokenizer.ggml.token_type", SHOAL_GGUF_TYPE_INT32, types,
               N);
    if (!space_prefix)
        gw_kv_bool(&w, "tokenizer.ggml.add_space_prefix", 0);
    return w;
}

Test(tokenizer, spm_merges_the_best_scoring_pair_first)
{
    struct shoal_err err = {0};
    struct gw w = spm_gguf(-1.0f, -2.0f, 0);
    struct shoal_tokenizer *t = gguf_tok(&w, &err);
    cr_assert_not_null(t, "%s", err.msg);
    struct ids a = encs(t, "abc", 0, 0);
    expect_ids(a, "263 262", "'ab' scores higher: [ab, c]");
    free(a.v);
    /* BOS by default for SentencePiece ("llama") vocabularies */
    a = encs(t, "abc", 1, 0);
    expect_ids(a, "1 263 262", "with BOS");
    free(a.v);
    /* bytes without a piece fall back to <0xXX> tokens */
    a = encs(t, "\303\251", 0, 0);
    expect_ids(a, "198 172", "'é' as <0xC3> <0xA9>");
    char *s = dec(t, a, 1);
    cr_assert(eq(str, s, "\303\251"));
    free(s);
    free(a.v);
    shoal_tokenizer_destroy(t);
    free(w.p);

    w = spm_gguf(-2.0f, -1.0f, 0);
    t = gguf_tok(&w, &err);
    cr_assert_not_null(t, "%s", err.msg);
    a = encs(t, "abc", 0, 0);
    expect_ids(a, "260 264", "'bc' scores higher: [a, bc]");
    free(a.v);
    shoal_tokenizer_destroy(t);
    free(w.p);
}

Test(tokenizer, spm_space_prefix_is_added_and_stripped_again)
{
    struct shoal_err err = {0};
    struct gw w = spm_gguf(-1.0f, -2.0f, 1);
    struct shoal_tokenizer *t = gguf_tok(&w, &err);
    cr_assert_not_null(t, "%s", err.msg);
    struct ids a = encs(t, "a b", 0, 0);
    expect_ids(a, "259 260 259 261", "'▁a▁b'");
    char *s = dec(t, a, 1);
    cr_assert(eq(str, s, "a b"));
    free(s);
    free(a.v);
    shoal_tokenizer_destroy(t);
    free(w.p);
}

static struct gw bpe_gguf(const char *pre)
{
    static const char *const tokens[] = {"a", "b", "ab", "\304\240"};
    static const char *const merges[] = {"a b"};
    struct gw w = {0};
    gw_bytes(&w, "GGUF", 4);
    gw_uint(&w, 3, 4);
    gw_uint(&w, 0, 8);
    gw_uint(&w, pre ? 4 : 3, 8);
    gw_kv_str(&w, "tokenizer.ggml.model", "gpt2");
    if (pre)
        gw_kv_str(&w, "tokenizer.ggml.pre", pre);
    gw_kv_strs(&w, "tokenizer.ggml.tokens", tokens, 4);
    gw_kv_strs(&w, "tokenizer.ggml.merges", merges, 1);
    return w;
}

Test(tokenizer, gguf_bpe_uses_the_pre_tokenizer_table)
{
    struct shoal_err err = {0};
    struct gw w = bpe_gguf("qwen2");
    struct shoal_tokenizer *t = gguf_tok(&w, &err);
    cr_assert_not_null(t, "%s", err.msg);
    /* "Ġ" is the byte-level space */
    struct ids a = encs(t, "ab ab", 1, 0);
    expect_ids(a, "2 3 2", "'ab ab'");
    char *s = dec(t, a, 0);
    cr_assert(eq(str, s, "ab ab"));
    free(s);
    free(a.v);
    cr_assert(eq(i32, shoal_tokenizer_bos(t), -1));
    shoal_tokenizer_destroy(t);
    free(w.p);
}

Test(tokenizer, gguf_unknown_pre_is_named_with_the_supported_list)
{
    struct shoal_err err = {0};
    struct gw w = bpe_gguf("no-such-pre");
    cr_assert_null(gguf_tok(&w, &err));
    cr_assert(eq(int, err.code, SHOAL_EUNSUPPORTED));
    cr_assert_not_null(strstr(err.msg, "'no-such-pre'"), "%s", err.msg);
    cr_assert_not_null(strstr(err.msg, "llama-bpe"), "%s", err.msg);
    cr_assert_not_null(strstr(err.msg, "qwen2"), "%s", err.msg);
    free(w.p);
}

Test(tokenizer, gguf_without_tokenizer_or_with_other_models_is_refused)
{
    struct shoal_err err = {0};
    struct gw w = {0};
    gw_bytes(&w, "GGUF", 4);
    gw_uint(&w, 3, 4);
    gw_uint(&w, 0, 8);
    gw_uint(&w, 1, 8);
    gw_kv_str(&w, "general.architecture", "llama");
    cr_assert_null(gguf_tok(&w, &err));
    cr_assert(eq(int, err.code, SHOAL_EFORMAT));
    cr_assert_not_null(strstr(err.msg, "tokenizer.ggml.model"), "%s",
                       err.msg);
    free(w.p);

    w = (struct gw){0};
    gw_bytes(&w, "GGUF", 4);
    gw_uint(&w, 3, 4);
    gw_uint(&w, 0, 8);
    gw_uint(&w, 1, 8);
    gw_kv_str(&w, "tokenizer.ggml.model", "bert");
    shoal_err_clear(&err);
    cr_assert_null(gguf_tok(&w, &err));
    cr_assert(eq(int, err.code, SHOAL_EUNSUPPORTED));
    cr_assert_not_null(strstr(err.msg, "'bert'"), "%s", err.msg);
    free(w.p);
}

/* ------------------------------------------------------------------------
 * malformed input
 */

static void expect_clean_error(const char *json, int code, const char *needle)
{
    struct shoal_err err = {0};
    struct shoal_tokenizer *t =
        shoal_tokenizer_load_hf_mem(json, strlen(json), NULL, 0, "bad", &err);
    cr_assert_null(t, "accepted: %s", json);
    cr_assert(err.code < 0);
    if (code)
        cr_assert(eq(int, err.code, code), "%s -> %s", json, err.msg);
    cr_assert(strlen(err.msg) > 0);
    cr_assert_null(strchr(err.msg, '\n'), "%s", err.msg);
    if (needle)
        cr_assert_not_null(strstr(err.msg, needle), "'%s' not in: %s",
                           needle, err.msg);
}

Test(tokenizer, malformed_tokenizer_json_is_a_clean_error)
{
    expect_clean_error("", SHOAL_EFORMAT, "invalid JSON");
    expect_clean_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {", SHOAL_EFORMAT,
                       "line 1");
    expect_clean_error("[]", SHOAL_EFORMAT, "not an object");
    expect_clean_error("{\"model\":5}", SHOAL_EFORMAT, "model");
    expect_clean_error("{\"model\":{\"type\":\"BPE\",\"vocab\":[]}}",
                       SHOAL_EFORMAT, "vocab");
    expect_clean_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{}}}",
                       SHOAL_EFORMAT, "empty");
    expect_clean_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1}}}",
                       SHOAL_EFORMAT, "'a'");
    expect_clean_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"0\"}}}",
                       SHOAL_EFORMAT, "not an integer");
    expect_clean_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":"
                       "99999999999}}}",
                       SHOAL_EFORMAT, "out of range");
    expect_clean_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,"
                       "\"b\":0}}}",
                       SHOAL_EFORMAT, "id 0");
    expect_clean_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},"
                       "\"merges\":\"a b\"}}",
                       SHOAL_EFORMAT, "merges");
    expect_clean_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},"
                       "\"merges\":[\"ab\"]}}",
                       SHOAL_EFORMAT, "merge 0");
    expect_clean_error("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}",
                       SHOAL_EUNSUPPORTED, "WordPiece");
    expect_clean_error("{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}",
                       SHOAL_EUNSUPPORTED, "Unigram");
    expect_clean_error("{\"normalizer\":{\"type\":\"BertNormalizer\"},"
                       "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}",
                       SHOAL_EUNSUPPORTED, "BertNormalizer");
    expect_clean_error("{\"pre_tokenizer\":{\"type\":\"CharDelimiterSplit\"},"
                       "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}",
                       SHOAL_EUNSUPPORTED, "CharDelimiterSplit");
    expect_clean_error("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":"
                       "{\"Regex\":\"(\"},\"behavior\":\"Isolated\"},"
                       "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}",
                       SHOAL_EFORMAT, "regex");
    expect_clean_error("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":"
                       "{\"Regex\":\"a\"},\"behavior\":\"Sideways\"},"
                       "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}",
                       SHOAL_EFORMAT, "Sideways");
    expect_clean_error("{\"decoder\":{\"type\":\"WordPiece\"},"
                       "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}",
                       SHOAL_EUNSUPPORTED, "WordPiece");
    expect_clean_error("{\"added_tokens\":[{\"id\":1}],"
                       "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}",
                       SHOAL_EFORMAT, "content");
    expect_clean_error("{\"post_processor\":{\"type\":\"TemplateProcessing\","
                       "\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}}],"
                       "\"special_tokens\":{}},"
                       "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}",
                       SHOAL_EFORMAT, "<s>");
    expect_clean_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},"
                       "\"unk_token\":\"<unk>\"}}",
                       SHOAL_EFORMAT, "<unk>");
}

/* Issue 12 item 7: a malformed merge after good ones returned without
 * freeing the merge decode buffer. The ASan run (detect_leaks=1) fails this
 * test on a leak; the assertions check the error itself. */
Test(tokenizer, malformed_merge_after_good_ones_is_a_clean_error_without_leak)
{
    static const struct { const char *file, *needle; } cases[] = {
        {"tokenizer-bad-merge-string.json", "merge 2 'abc' is not \"left right\""},
        {"tokenizer-bad-merge-pair.json", "merge 2 is neither"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/tests/unit/fixtures/%s", SHOAL_SOURCE_ROOT,
                 cases[i].file);
        struct shoal_err err = {0};
        cr_assert_null(shoal_tokenizer_load(path, &err), "%s was accepted", path);
        cr_assert(eq(int, err.code, SHOAL_EFORMAT), "%s", err.msg);
        cr_assert_not_null(strstr(err.msg, cases[i].needle), "'%s' not in: %s",
                           cases[i].needle, err.msg);
    }
}

static char tmpdir[64];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/shoal-tok-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void rm_tmpdir(void)
{
    cr_assert(eq(int, test_rm_rf(tmpdir), 0), "rm -rf %s: %s", tmpdir, strerror(errno));
}

static char *tmp_write(const char *name, const void *data, size_t n)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert(eq(sz, fwrite(data, 1, n, f), n));
    cr_assert(eq(int, fclose(f), 0));
    return path;
}

Test(tokenizer, bad_files_and_paths_are_clean_errors, .init = make_tmpdir,
     .fini = rm_tmpdir)
{
    struct shoal_err err = {0};
    /* a checkpoint directory without tokenizer.json */
    cr_assert_null(shoal_tokenizer_load(tmpdir, &err));
    cr_assert(eq(int, err.code, SHOAL_ENOTFOUND));
    cr_assert_not_null(strstr(err.msg, tmpdir), "%s", err.msg);
    /* a malformed tokenizer.json in a directory */
    tmp_write("tokenizer.json", "{\"model\": {", 11);
    shoal_err_clear(&err);
    cr_assert_null(shoal_tokenizer_load(tmpdir, &err));
    cr_assert(eq(int, err.code, SHOAL_EFORMAT));
    cr_assert_not_null(strstr(err.msg, "tokenizer.json"), "%s", err.msg);
    /* a missing file */
    shoal_err_clear(&err);
    cr_assert_null(shoal_tokenizer_load("/nonexistent/tokenizer.json", &err));
    cr_assert(err.code < 0);
    /* a file that only claims to be GGUF */
    char *p = tmp_write("x.gguf", "GGUF\3\0\0\0", 8);
    shoal_err_clear(&err);
    cr_assert_null(shoal_tokenizer_load(p, &err));
    cr_assert(eq(int, err.code, SHOAL_EFORMAT));
    cr_assert_not_null(strstr(err.msg, "truncated"), "%s", err.msg);
    /* added_tokens that is not a list is named, not ignored */
    static const char added_obj[] =
        "{\"added_tokens\": {\"id\": 0}, \"model\": {\"type\": \"BPE\", "
        "\"vocab\": {\"a\": 0}, \"merges\": []}}";
    p = tmp_write("tokenizer.json", added_obj, sizeof added_obj - 1);
    shoal_err_clear(&err);
    cr_assert_null(shoal_tokenizer_load(p, &err));
    cr_assert(eq(int, err.code, SHOAL_EFORMAT));
    cr_assert_not_null(strstr(err.msg, "added_tokens is not a list"), "%s", err.msg);
}

Test(tokenizer, truncated_gguf_vocab_is_a_clean_error, .init = make_tmpdir,
     .fini = rm_tmpdir)
{
    const char *path = VOCABDIR "/ggml-vocab-gpt-2.gguf";
    need_shared(path);
    struct shoal_err err = {0};
    char *data;
    size_t n;
    cr_assert(eq(int, shoal_read_file(path, 64 << 20, &data, &n, &err), 0));
    const size_t cuts[] = {3, 4, 8, 23, 24, 100, 1000, 100000, n / 2, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char *p = tmp_write("cut.gguf", data, cuts[i]);
        shoal_err_clear(&err);
        struct shoal_tokenizer *t = shoal_tokenizer_load(p, &err);
        cr_assert_null(t, "a copy cut to %zu of %zu bytes loaded", cuts[i], n);
        cr_assert(err.code < 0);
        cr_assert_null(strchr(err.msg, '\n'), "%s", err.msg);
    }
    /* an absurd count patched into the token array: the 4th KV of this
     * file's header is found by parsing, then its count is overwritten */
    struct shoal_gguf *g = shoal_gguf_open(path, &err);
    cr_assert_not_null(g, "%s", err.msg);
    shoal_gguf_close(g);
    const char key[] = "tokenizer.ggml.tokens";
    char *at = memmem(data, n, key, sizeof key - 1);
    cr_assert_not_null(at);
    /* key | u32 type (9) | u32 elem type (8) | u64 count */
    size_t count_off = (size_t)(at - data) + sizeof key - 1 + 8;
    for (int b = 0; b < 8; b++)
        data[count_off + b] = (char)(b == 7 ? 0x10 : 0);
    char *p = tmp_write("absurd.gguf", data, n);
    shoal_err_clear(&err);
    cr_assert_null(shoal_tokenizer_load(p, &err));
    cr_assert(eq(int, err.code, SHOAL_EFORMAT));
    cr_assert_not_null(strstr(err.msg, "tokenizer.ggml.tokens"), "%s",
                       err.msg);
    free(data);
}

/* ------------------------------------------------------------------------
 * shoal tokenize / shoal detokenize
 */

static void cli_setup(void)
{
    make_tmpdir();
    tmp_write("tokenizer.json", tiny_json, strlen(tiny_json));
    cr_redirect_stdout();
    cr_redirect_stderr();
}

static int run_cmd(int (*fn)(int, char **), const char *const *args)
{
    char *argv[16];
    int argc = 0;
    for (; args[argc]; argc++)
        argv[argc] = (char *)args[argc];
    argv[argc] = NULL;
    int rc = fn(argc, argv);
    fflush(stdout);
    fflush(stderr);
    return rc;
}

Test(tokenizer_cli, tokenize_prints_ids_on_one_line, .init = cli_setup,
     .fini = rm_tmpdir)
{
    const char *args[] = {"tokenize", "--model", tmpdir, "--text",
                          "abc abc", NULL};
    cr_assert(eq(int, run_cmd(shoal_cmd_tokenize, args), 0));
    cr_assert_stdout_eq_str("5 3 5\n");
}

Test(tokenizer_cli, tokenize_parse_special_and_file_input,
     .init = cli_setup, .fini = rm_tmpdir)
{
    char *p = tmp_write("in.txt", "a <x> b", 7);
    const char *args[] = {"tokenize",        "--model", tmpdir, "--file", p,
                          "--parse-special", "--no-bos", NULL};
    cr_assert(eq(int, run_cmd(shoal_cmd_tokenize, args), 0));
    cr_assert_stdout_eq_str("0 7 1\n");
}

Test(tokenizer_cli, detokenize_accepts_spaces_and_commas, .init = cli_setup,
     .fini = rm_tmpdir)
{
    const char *a1[] = {"detokenize", "--model", tmpdir, "--ids", "5 3 5",
                        NULL};
    const char *a2[] = {"detokenize", "--model", tmpdir, "--ids", "5,3,5",
                        "-n", NULL};
    cr_assert(eq(int, run_cmd(shoal_cmd_detokenize, a1), 0));
    cr_assert(eq(int, run_cmd(shoal_cmd_detokenize, a2), 0));
    cr_assert_stdout_eq_str("abc abc\nabc abc");
}

/* Byte-level vocabularies have a token for byte 0 (the bundled model's id
 * 0, "\u0100"): decoded text can hold NUL bytes, and its length must count
 * them (a NUL once cut serve's whole replies and detokenize's output). */
Test(tokenizer, decode_len_counts_nul_bytes)
{
    struct shoal_tokenizer *t =
        load_ok(SHOAL_SOURCE_ROOT "/models/shakespeare-moe/tokenizer.json");
    const int32_t ids[] = {72, 0, 414, 0, 111};   /* H \0 ell \0 o */
    struct shoal_err err = {0};
    size_t n = 99;
    char *s = shoal_tokenizer_decode_len(t, ids, 5, 0, &n, &err);
    cr_assert_not_null(s, "%s", err.msg);
    cr_assert(eq(sz, n, 7));
    cr_assert(eq(int, memcmp(s, "H\0ell\0o", 8), 0), "decoded bytes differ");
    free(s);
    s = shoal_tokenizer_decode(t, ids, 5, 0, &err);   /* the string form: up to the NUL */
    cr_assert(eq(str, s, "H"));
    free(s);
    shoal_tokenizer_destroy(t);
}

Test(tokenizer_cli, detokenize_writes_nul_bytes, .init = cli_setup, .fini = rm_tmpdir)
{
    const char *args[] = {"detokenize", "--model", SHOAL_SOURCE_ROOT "/models/shakespeare-moe",
                          "--ids", "72,0,414", "-n", NULL};
    cr_assert(eq(int, run_cmd(shoal_cmd_detokenize, args), 0));
    FILE *f = cr_get_redirected_stdout();
    cr_assert_not_null(f);
    char buf[16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    cr_assert(eq(sz, n, 5));
    cr_assert(eq(int, memcmp(buf, "H\0ell", 5), 0), "detokenize's bytes differ");
}

Test(tokenizer_cli, bad_usage_exits_2_and_bad_files_exit_1,
     .init = cli_setup, .fini = rm_tmpdir)
{
    const char *no_text[] = {"tokenize", "--model", tmpdir, NULL};
    const char *both[] = {"tokenize", "--model", tmpdir, "--text", "a",
                          "--file", "x", NULL};
    const char *unknown[] = {"tokenize", "--frobnicate", NULL};
    const char *no_value[] = {"tokenize", "--text", NULL};
    const char *bad_ids[] = {"detokenize", "--model", tmpdir, "--ids",
                             "5 x 3", NULL};
    const char *no_ids[] = {"detokenize", "--model", tmpdir, NULL};
    cr_assert(eq(int, run_cmd(shoal_cmd_tokenize, no_text), 2));
    cr_assert(eq(int, run_cmd(shoal_cmd_tokenize, both), 2));
    cr_assert(eq(int, run_cmd(shoal_cmd_tokenize, unknown), 2));
    cr_assert(eq(int, run_cmd(shoal_cmd_tokenize, no_value), 2));
    cr_assert(eq(int, run_cmd(shoal_cmd_detokenize, bad_ids), 2));
    cr_assert(eq(int, run_cmd(shoal_cmd_detokenize, no_ids), 2));

    const char *no_model[] = {"tokenize", "--model", "/nonexistent/m",
                              "--text", "a", NULL};
    const char *no_file[] = {"tokenize", "--model", tmpdir, "--file",
                             "/nonexistent/in.txt", NULL};
    const char *out_of_vocab[] = {"detokenize", "--model", tmpdir, "--ids",
                                  "5 999", NULL};
    /* a missing model path is a usage error, as for run, convert and inspect */
    cr_assert(eq(int, run_cmd(shoal_cmd_tokenize, no_model), 2));
    /* a missing input file is a usage error, as for run and perplexity */
    cr_assert(eq(int, run_cmd(shoal_cmd_tokenize, no_file), 2));
    cr_assert(eq(int, run_cmd(shoal_cmd_detokenize, out_of_vocab), 1));
    cr_assert_stdout_eq_str("", "errors print nothing on stdout");
}

/* ------------------------------------------------------------------------
 * scale: 1 MB of mixed text
 */

/* A megabyte of mixed text (llama.cpp's gpt-2 vocab test input, repeated)
 * encodes and decodes back to the same bytes with each tokenizer kind. No
 * assertion on time (TESTING.md): the .timeout is a watchdog, far above the
 * ~0.1-0.4 s each takes here, that an encoder gone quadratic in the text
 * length (~1e12 steps for 1 MiB) would not meet. */
Test(tokenizer, encodes_a_megabyte_and_decodes_it_back, .timeout = 120)
{
    const char *files[] = {VOCABDIR "/ggml-vocab-llama-spm.gguf",
                           VOCABDIR "/ggml-vocab-deepseek-llm.gguf",
                           TOKDIR "/Mixtral-8x7B-v0.1.tokenizer.json",
                           TOKDIR
                           "/OLMoE_gpt-neox-olmo-dolma-v1_5.tokenizer.json"};
    const char *inp = VOCABDIR "/ggml-vocab-gpt-2.gguf.inp";
    need_shared(inp);
    struct shoal_err err = {0};
    char *src;
    size_t n;
    cr_assert(eq(int, shoal_read_file(inp, 1 << 20, &src, &n, &err), 0));
    size_t mb = (size_t)1 << 20;
    char *text = malloc(mb + 1);
    for (size_t i = 0; i < mb; i++)
        text[i] = src[i % n];
    text[mb] = 0;
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        need_shared(files[f]);
        struct shoal_tokenizer *t = load_ok(files[f]);
        struct ids a = enc(t, text, mb, 1, 0);
        cr_log_info("%s: 1 MiB -> %zu ids", files[f], a.n);
        cr_expect(a.n > mb / 8 && a.n <= mb + 1, "%s: %zu ids for 1 MiB", files[f], a.n);
        char *back = dec(t, a, 1);
        size_t bn = strlen(back), at = 0;
        while (at < bn && at < mb && back[at] == text[at])
            at++;
        cr_expect(bn == mb && at == mb, "%s: 1 MiB decodes back to %zu bytes, first "
                  "difference at byte %zu", files[f], bn, at);
        free(back);
        free(a.v);
        shoal_tokenizer_destroy(t);
    }
    free(text);
    free(src);
}
