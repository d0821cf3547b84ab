/* Fuzz target: a GGUF file's tensor descriptors and the ggml block
 * decoders (shoal_gguf_open_mem, then shoal_ggml_dequant_row over the first
 * blocks of every tensor whose type has a dequantization). gguf.h promises
 * that an accepted tensor's bytes lie inside the file, its offset is
 * aligned and its byte count is whole blocks; this checks all three, and
 * the decoders run on whatever bytes the input holds there.
 * Input: the GGUF bytes. */
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "ggml_types.h"
#include "gguf.h"

#define MAX_ELEMS 1024 /* dequantized per tensor: 4 blocks of 256 */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    struct shoal_err err = {0};
    fuzz_mem_begin();
    struct shoal_gguf *g = shoal_gguf_open_mem(data, n, "fuzz.gguf", &err);
    struct fuzz_mem m = fuzz_mem_now();
    fuzz_mem_check("gguf", "gguf_open_mem", m, n, 256 * n + 64 * FUZZ_KIB,
                   16 * n + 64 * FUZZ_KIB);
    if (!g) {
        fuzz_mem_end();
        FUZZ_ASSERT(err.code < 0 && err.msg[0], "no error set");
        FUZZ_ASSERT(!strchr(err.msg, '\n'), "message has a newline: %s", err.msg);
        return 0;
    }
    static float out[MAX_ELEMS];
    const uint64_t align = shoal_gguf_alignment(g);
    const uint64_t data_off = shoal_gguf_data_offset(g);
    for (uint64_t i = 0; i < shoal_gguf_n_tensors(g); i++) {
        struct shoal_gguf_tensor t;
        FUZZ_ASSERT(shoal_gguf_tensor(g, i, &t) == 0, "tensor %llu", (unsigned long long)i);
        const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(t.type);
        FUZZ_ASSERT(ti, "accepted unknown type %u", t.type);
        FUZZ_ASSERT(t.offset >= data_off && (t.offset - data_off) % align == 0,
                    "tensor %s offset %llu", t.name, (unsigned long long)t.offset);
        FUZZ_ASSERT(t.offset <= n && t.nbytes <= n - t.offset, "tensor %s past the end",
                    t.name);
        FUZZ_ASSERT(t.ne[0] % ti->block_size == 0, "tensor %s partial block", t.name);
        if (!ti->dequant || t.nbytes == 0)
            continue;
        uint64_t blocks = t.nbytes / ti->type_size;
        uint64_t max_blocks = MAX_ELEMS / ti->block_size;
        if (blocks > max_blocks)
            blocks = max_blocks;
        FUZZ_ASSERT(shoal_ggml_dequant_row(t.type, data + t.offset, out,
                                           blocks * ti->block_size, &err) == 0,
                    "dequant %s: %s", ti->name, err.msg);
    }
    shoal_gguf_close(g);
    fuzz_mem_end();
    return 0;
}
