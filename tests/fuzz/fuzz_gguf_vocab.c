/* Fuzz target: a GGUF file's tokenizer (shoal_gguf_open_mem, then
 * shoal_tokenizer_load_gguf and an encode/decode round of a few bytes of the
 * input). gguf.h promises every count is checked against the bytes left
 * before anything is allocated, so memory stays a multiple of the input.
 * Input: the GGUF bytes, then optionally NUL and a text to encode (the
 * text is split off only when the file part still starts with "GGUF"). */
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "gguf.h"
#include "tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    /* the text lives after the last NUL followed by the marker "\0TEXT:" */
    static const char mark[] = "\0TEXT:";
    const uint8_t *text = (const uint8_t *)"Hello world, 123!";
    size_t text_len = strlen((const char *)text), file_len = n;
    for (size_t i = n >= sizeof mark - 1 ? n - (sizeof mark - 1) + 1 : 0; i-- > 0;) {
        if (!memcmp(data + i, mark, sizeof mark - 1)) {
            file_len = i;
            text = data + i + sizeof mark - 1;
            text_len = n - i - (sizeof mark - 1);
            break;
        }
    }
    struct shoal_err err = {0};
    fuzz_mem_begin();
    struct shoal_gguf *g = shoal_gguf_open_mem(data, file_len, "fuzz.gguf", &err);
    struct fuzz_mem m = fuzz_mem_now();
    fuzz_mem_check("gguf_vocab", "gguf_open_mem", m, n, 256 * n + 64 * FUZZ_KIB,
                   16 * n + 64 * FUZZ_KIB);
    if (!g) {
        fuzz_mem_end();
        FUZZ_ASSERT(err.code < 0 && err.msg[0], "no error set");
        return 0;
    }
    fuzz_mem_reset_peak();
    struct shoal_tokenizer *tok = shoal_tokenizer_load_gguf(g, "fuzz.gguf", &err);
    shoal_gguf_close(g);
    m = fuzz_mem_now();
    /* tables per token (pieces, ids, merges ranks, hash slots) and the
     * compiled pre-tokenizer regexes */
    fuzz_mem_check("gguf_vocab", "tokenizer_load_gguf", m, n, 256 * n + 4 * FUZZ_MIB,
                   64 * n + 4 * FUZZ_MIB);
    if (!tok) {
        fuzz_mem_end();
        FUZZ_ASSERT(err.code < 0 && err.msg[0], "no error set");
        return 0;
    }
    fuzz_encode_round(tok, text, text_len, 1, 4 * text_len + 8);
    shoal_tokenizer_destroy(tok);
    fuzz_mem_end();
    return 0;
}
