/* Fuzz target: a Hugging Face tokenizer.json (shoal_tokenizer_load_hf_mem)
 * and the encoding of a text with it, then decoding the ids back.
 * Input: the tokenizer.json text, NUL, the text to encode (raw bytes, any
 * UTF-8 validity), optionally NUL and a tokenizer_config.json; without a
 * NUL a fixed sentence is encoded. Memory is
 * bounded by a multiple of the input (JSON tree, the compiled pre-tokenizer
 * regexes) plus tables per entry: ids below twice the file's token count +
 * 1024 are indexed directly, the rest kept sparse, so an id near 2^24 in a
 * small file costs one entry; the ids stay inside the vocabulary. */
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "tokenizer.h"
#include "tokenizer_impl.h"

#define PER_ID 64   /* bytes: an entry, its hash slots, its added-token share */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    const uint8_t *json, *text;
    size_t json_len, text_len;
    const uint8_t *config = NULL;
    size_t config_len = 0;
    if (!fuzz_split(data, n, &json, &json_len, &text, &text_len)) {
        text = (const uint8_t *)"Hello world, it's 2024!\n  \xe2\x96\x81" "caf\xc3\xa9";
        text_len = strlen((const char *)text);
    } else if (fuzz_split(text, text_len, &text, &text_len, &config, &config_len)) {
        /* a third part: tokenizer_config.json */
    } else {
        config = NULL;
    }
    struct shoal_err err = {0};
    fuzz_mem_begin();
    struct shoal_tokenizer *tok = shoal_tokenizer_load_hf_mem((const char *)json, json_len,
                                                              (const char *)config, config_len,
                                                              "fuzz tokenizer.json", &err);
    struct fuzz_mem m = fuzz_mem_now();
    /* the tables hold the directly indexed ids (up to 2 x tokens + 1024)
     * and the sparse ones (at most the tokens): a token takes at least 5
     * bytes of JSON ("":0,), so fewer than n + 1024 entries of PER_ID bytes,
     * whatever the largest id */
    const size_t n_vocab = n + 1024;
    fuzz_mem_check("tokenizer_hf", "load", m, n, 256 * n + 4 * FUZZ_MIB + PER_ID * n_vocab,
                   64 * n + 4 * FUZZ_MIB + PER_ID * n_vocab);
    if (!tok) {
        fuzz_mem_end();
        FUZZ_ASSERT(err.code < 0 && err.msg[0], "no error set");
        return 0;
    }
    fuzz_mem_reset_peak();
    /* specials: at most the post-processor's, whose template is in the JSON */
    for (int special = 0; special < 2; special++)
        fuzz_encode_round(tok, text, text_len, special, 4 * text_len + json_len + 8);
    m = fuzz_mem_now();
    fuzz_mem_check("tokenizer_hf", "encode + decode", m, n,
                   256 * n + 4 * FUZZ_MIB + PER_ID * n_vocab,
                   64 * n + 4 * FUZZ_MIB + PER_ID * n_vocab);
    shoal_tokenizer_destroy(tok);
    fuzz_mem_end();
    return 0;
}
