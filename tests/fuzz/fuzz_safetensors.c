/* Fuzz target: one .safetensors file (shoal_safetensors_open_file): the
 * u64 header length, the JSON header, every dtype, shape and data offset.
 * Every tensor it accepts must lie inside the file with the byte count its
 * shape needs; memory is the JSON tree's plus at most a copy of the data
 * section (misaligned tensors are copied), a multiple of the input. */
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    const char *path = fuzz_as_file(data, n);
    struct shoal_err err = {0};
    fuzz_mem_begin();
    struct shoal_safetensors *st = shoal_safetensors_open_file(path, &err);
    struct fuzz_mem m = fuzz_mem_now();
    if (!st) {
        fuzz_mem_end();
        fuzz_mem_check("safetensors", "open (refused)", m, n, 256 * n + 64 * FUZZ_KIB,
                       4 * n + 64 * FUZZ_KIB);
        FUZZ_ASSERT(err.code < 0 && err.msg[0], "no error set");
        return 0;
    }
    fuzz_mem_check("safetensors", "open", m, n, 256 * n + 64 * FUZZ_KIB, 4 * n + 64 * FUZZ_KIB);
    for (size_t i = 0; i < shoal_safetensors_count(st); i++) {
        struct shoal_st_tensor *t = shoal_safetensors_at(st, i);
        FUZZ_ASSERT(t->name && shoal_safetensors_find(st, t->name) == t, "lookup of #%zu", i);
        FUZZ_ASSERT(t->n_dims >= 0 && t->n_dims <= SHOAL_MAX_DIMS, "n_dims %d", t->n_dims);
        FUZZ_ASSERT(t->nbytes <= n, "tensor '%s' of %zu bytes in a %zu-byte file", t->name,
                    t->nbytes, n);
        if (t->nbytes && t->mapped) {
            /* touch the first and last byte: they must be inside the mapping */
            volatile uint8_t x = ((const uint8_t *)t->data)[0];
            x ^= ((const uint8_t *)t->data)[t->nbytes - 1];
            (void)x;
        }
    }
    shoal_safetensors_close(st);
    fuzz_mem_end();
    return 0;
}
