/* Fuzz target: arbitrary bytes as blocks of every ggml type, through every
 * decoder a GGUF file's tensor bytes reach: the scalar dequantization
 * (shoal_ggml_dequant_row), the block scale check
 * (shoal_ggml_check_scales), the integer form (shoal_ggml_iblock_decode,
 * shoal_ggml_iblock_scales) and the dot products (shoal_ggml_dot, the
 * scalar rows and the active ISA's rows through shoal_ggml_linear_part).
 *
 * A block's bytes are never checked before these run (a file's scales are
 * checked, its codes are not: every byte pattern of a code is a valid
 * block), so arbitrary scales and codes must not crash or read out of
 * bounds; NaN and infinite results are fine. Checked here:
 *   - each type's blocks lie in a buffer of exactly their size (ASan sees
 *     one byte too far) and nothing is allocated by any of the calls (the
 *     thread's activation tile is allocated once, before them);
 *   - dequant_row accepts whole blocks of every type with a dequantization;
 *   - check_scales returns 0 or -SHOAL_EFORMAT with a one-line message;
 *     when it returns 0 (and the type is not MXFP4, whose finite scales
 *     reach 2^126), the dequantized weights and the dot products with
 *     finite activations are finite: what the check is for;
 *   - the integer form keeps ggml_dot.h's bounds (|c| <= 127, so never
 *     -128, which the SIMD rows' sign trick cannot take; |sc| <= 63; m in
 *     0..63; no min: m = 0 and DMIN = 0), and iblock_scales agrees with
 *     iblock_decode bit for bit;
 *   - the active ISA's rows, the scalar rows and shoal_ggml_dot give the
 *     same bits (DESIGN contract 1), or NaN on every side.
 * Input: byte 0 the case (tokens 1..3 from its low bits, an activation
 * scale from bits 2..5, bit 6 puts a NaN in the last token's activations),
 * then the block bytes, read as blocks of each type in turn. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "ggml_dot.h"
#include "ggml_types.h"
#include "quant.h"

#define MAX_ELEMS 1024 /* per type: 4 blocks of 256, 32 of 32 */

int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* the best ISA of this CPU, chosen once, as shoal's main() does */
    shoal_quant_init(SHOAL_QUANT_ISA_AUTO, NULL);
    /* this thread's activation tile, allocated once as a thread's first
     * linear does (quant.h): the calls below then allocate nothing */
    if (shoal_act_tile() == NULL)
        abort();
    return 0;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* same bits, or NaN on both sides */
static int same(float a, float b) { return bits_of(a) == bits_of(b) || (isnan(a) && isnan(b)); }

/* the integer form of every block: ggml_dot.h's bounds, and iblock_scales
 * the same as iblock_decode's scales */
static void check_iform(enum shoal_ggml_type type, const uint8_t *w, uint64_t n_blocks)
{
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(type);
    const uint32_t n16 = ti->block_size / 16;
    for (uint64_t b = 0; b < n_blocks; b++) {
        const uint8_t *blk = w + b * ti->type_size;
        struct shoal_ggml_iblock ib, is;
        shoal_ggml_iblock_decode(type, blk, &ib);
        shoal_ggml_iblock_scales(type, blk, &is);
        for (uint32_t i = 0; i < ti->block_size; i++)
            FUZZ_ASSERT(ib.c[i] >= -127, "%s block %llu: code %u is %d", ti->name,
                        (unsigned long long)b, i, ib.c[i]);
        for (uint32_t k = 0; k < n16; k++) {
            FUZZ_ASSERT(ib.sc[k] >= -63 && ib.sc[k] <= 63 && ib.m[k] >= 0 && ib.m[k] <= 63,
                        "%s block %llu: 16 #%u has sc %d m %d", ti->name,
                        (unsigned long long)b, k, ib.sc[k], ib.m[k]);
            FUZZ_ASSERT(ib.has_min || ib.m[k] == 0, "%s: a min without has_min", ti->name);
            FUZZ_ASSERT(is.sc[k] == ib.sc[k] && is.m[k] == ib.m[k],
                        "%s block %llu: iblock_scales differs at 16 #%u", ti->name,
                        (unsigned long long)b, k);
        }
        FUZZ_ASSERT(ib.has_min || bits_of(ib.dmin) == 0, "%s: DMIN without has_min", ti->name);
        FUZZ_ASSERT(is.has_min == ib.has_min && bits_of(is.d) == bits_of(ib.d) &&
                        bits_of(is.dmin) == bits_of(ib.dmin),
                    "%s block %llu: iblock_scales' D, DMIN differ", ti->name,
                    (unsigned long long)b);
    }
}

/* rows x cols of type at w (exactly its bytes) against n_tok tokens x:
 * the active ISA, the scalar rows and shoal_ggml_dot agree; finite when
 * the scales passed and x is finite (finite_ok) */
static void check_dot(enum shoal_ggml_type type, const uint8_t *w, int64_t rows, int64_t cols,
                      size_t w_bytes, const float *x, int64_t n_tok, int finite_ok)
{
    const struct shoal_ggml_matrix m = {type, rows, cols, w};
    struct shoal_err err = {0};
    FUZZ_ASSERT(shoal_ggml_matrix_check(&m, w_bytes, &err) == 0, "%s [%lld][%lld]: %s",
                shoal_ggml_type_name(type), (long long)rows, (long long)cols, err.msg);
    const size_t tok_bytes = shoal_ggml_act_bytes(type, cols);
    FUZZ_ASSERT(tok_bytes > 0, "%s: no activation bytes for %lld", shoal_ggml_type_name(type),
                (long long)cols);
    void *abuf = malloc(tok_bytes * (size_t)n_tok);
    float *y = malloc((size_t)(rows * n_tok) * sizeof *y);
    float *ys = malloc((size_t)(rows * n_tok) * sizeof *ys);
    FUZZ_ASSERT(abuf && y && ys, "malloc");
    struct shoal_ggml_act a;
    fuzz_mem_begin();
    shoal_ggml_act_init(&a, type, cols, n_tok, abuf);
    shoal_ggml_act_quantize(&a, x, n_tok);
    shoal_ggml_linear_part(y, x, n_tok, &m, 0, 1);
    shoal_ggml_rows_scalar(ys, &a, n_tok, &m, 0, rows);
    const size_t rb = w_bytes / (size_t)rows;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < rows; r++) {
            const float want = shoal_ggml_dot(&a, t, w + (size_t)r * rb);
            const float got = y[t * rows + r], got_s = ys[t * rows + r];
            FUZZ_ASSERT(same(got, want) && same(got_s, want),
                        "%s [%lld][%lld] t %lld r %lld: %s rows %a, scalar rows %a, dot %a",
                        shoal_ggml_type_name(type), (long long)rows, (long long)cols,
                        (long long)t, (long long)r, shoal_quant_ops_name(), (double)got,
                        (double)got_s, (double)want);
            FUZZ_ASSERT(!finite_ok || isfinite(want) || (t == n_tok - 1 && finite_ok == 2),
                        "%s: scales passed, x finite, dot t %lld r %lld is %a",
                        shoal_ggml_type_name(type), (long long)t, (long long)r, (double)want);
        }
    const struct fuzz_mem mem = fuzz_mem_end();
    FUZZ_ASSERT(mem.count_here == 0, "%s: the dot products allocated %zu times",
                shoal_ggml_type_name(type), mem.count_here);
    free(ys);
    free(y);
    free(abuf);
}

/* the blocks data[n] of type id: every decoder there is for it */
static void check_type(uint32_t id, const uint8_t *data, size_t n, uint8_t mode)
{
    const struct shoal_ggml_type_info *ti = shoal_ggml_type_info(id);
    if (!ti)
        return;
    uint64_t n_blocks = n / ti->type_size;
    if (n_blocks > MAX_ELEMS / ti->block_size)
        n_blocks = MAX_ELEMS / ti->block_size;
    if (n_blocks == 0)
        return;
    const size_t w_bytes = (size_t)n_blocks * ti->type_size;
    const uint64_t n_elems = n_blocks * ti->block_size;
    uint8_t *w = malloc(w_bytes);   /* exactly the blocks: ASan sees a byte past */
    float *deq = malloc(n_elems * sizeof *deq);
    FUZZ_ASSERT(w && deq, "malloc");
    memcpy(w, data, w_bytes);

    struct shoal_err err = {0};
    fuzz_mem_begin();
    const int rc = shoal_ggml_check_scales(id, w, n_blocks, "fuzz.w", 0, &err);
    FUZZ_ASSERT(rc == 0 || (rc == SHOAL_EFORMAT && err.msg[0] && !strchr(err.msg, '\n') &&
                            strstr(err.msg, "fuzz.w")),
                "%s: check_scales %d: %s", ti->name, rc, err.msg);
    /* the types whose every scale check_scales reads (not F32 .. BF16, not
     * MXFP4: 2^126 * 12 is past f32) */
    const int scaled = rc == 0 && ti->block_size > 1 && id != SHOAL_GGML_TYPE_MXFP4;
    if (ti->dequant) {
        err = (struct shoal_err){0};
        FUZZ_ASSERT(shoal_ggml_dequant_row(id, w, deq, n_elems, &err) == 0, "%s: %s",
                    ti->name, err.msg);
        for (uint64_t i = 0; scaled && i < n_elems; i++)
            FUZZ_ASSERT(isfinite(deq[i]), "%s: scales passed, weight %llu is %a", ti->name,
                        (unsigned long long)i, (double)deq[i]);
    }
    if (shoal_ggml_iform(id))
        check_iform((enum shoal_ggml_type)id, w, n_blocks);
    const struct fuzz_mem mem = fuzz_mem_end();
    FUZZ_ASSERT(mem.count_here == 0, "%s: the block decoders allocated %zu times", ti->name,
                mem.count_here);

    if (shoal_ggml_dot_supported(id)) {
        /* two blocks a row when they pair up, else one; x from the bytes */
        const int64_t bpr = n_blocks % 2 == 0 ? 2 : 1;
        const int64_t rows = (int64_t)n_blocks / bpr, cols = bpr * ti->block_size;
        const int64_t n_tok = 1 + mode % 3;
        float *x = malloc((size_t)(n_tok * cols) * sizeof *x);
        FUZZ_ASSERT(x, "malloc");
        const float unit = ldexpf(1.0f, ((mode >> 2) & 15) - 8);
        for (int64_t i = 0; i < n_tok * cols; i++)
            x[i] = (float)(int8_t)data[(size_t)(i * 7 + 3) % n] * unit;
        if (mode & 0x40)
            x[n_tok * cols - 1] = NAN;
        check_dot((enum shoal_ggml_type)id, w, rows, cols, w_bytes, x, n_tok,
                  scaled ? (mode & 0x40 ? 2 : 1) : 0);
        free(x);
    }
    free(deq);
    free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (n < 2)
        return 0;
    for (uint32_t id = 0; id < SHOAL_GGML_TYPE_COUNT; id++)
        check_type(id, data + 1, n - 1, data[0]);
    return 0;
}
