/* gguf reader: well-formed files parse to the values written; truncated,
 * oversized or inconsistent files give a one-line error, never a crash or
 * a huge allocation. Files are built in memory by a small writer below. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"

#ifndef SHOAL_SHARED_DIR
#define SHOAL_SHARED_DIR "../shared"
#endif

/* --- a minimal GGUF writer (little-endian) ----------------------------- */

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

static void gw_header(struct gw *w, uint32_t version, uint64_t n_tensors,
                      uint64_t n_kv)
{
    gw_bytes(w, "GGUF", 4);
    gw_uint(w, version, 4);
    gw_uint(w, n_tensors, 8);
    gw_uint(w, n_kv, 8);
}

static void gw_key(struct gw *w, const char *key, uint32_t type)
{
    gw_str(w, key);
    gw_uint(w, type, 4);
}

/* A file with one value of every kind, plus one tensor. */
static struct gw sample(void)
{
    struct gw w = {0};
    gw_header(&w, 3, 1, 9);
    gw_key(&w, "u8", SHOAL_GGUF_TYPE_UINT8);
    gw_uint(&w, 200, 1);
    gw_key(&w, "i16", SHOAL_GGUF_TYPE_INT16);
    gw_uint(&w, (uint16_t)-7, 2);
    gw_key(&w, "u32", SHOAL_GGUF_TYPE_UINT32);
    gw_uint(&w, 123456, 4);
    gw_key(&w, "i64", SHOAL_GGUF_TYPE_INT64);
    gw_uint(&w, (uint64_t)-5, 8);
    gw_key(&w, "f32", SHOAL_GGUF_TYPE_FLOAT32);
    float f = 0.25f;
    uint32_t fb;
    memcpy(&fb, &f, 4);
    gw_uint(&w, fb, 4);
    gw_key(&w, "flag", SHOAL_GGUF_TYPE_BOOL);
    gw_uint(&w, 1, 1);
    gw_key(&w, "name", SHOAL_GGUF_TYPE_STRING);
    gw_str(&w, "hello");
    gw_key(&w, "words", SHOAL_GGUF_TYPE_ARRAY);
    gw_uint(&w, SHOAL_GGUF_TYPE_STRING, 4);
    gw_uint(&w, 3, 8);
    gw_str(&w, "a");
    gw_str(&w, "");
    gw_str(&w, "ccc");
    gw_key(&w, "nums", SHOAL_GGUF_TYPE_ARRAY);
    gw_uint(&w, SHOAL_GGUF_TYPE_INT32, 4);
    gw_uint(&w, 4, 8);
    for (int i = 0; i < 4; i++)
        gw_uint(&w, (uint32_t)(i * 10 - 1), 4);
    /* tensor "w": 2 dims [3][5], type 0, offset 0 */
    gw_str(&w, "w");
    gw_uint(&w, 2, 4);
    gw_uint(&w, 5, 8);
    gw_uint(&w, 3, 8);
    gw_uint(&w, 0, 4);
    gw_uint(&w, 0, 8);
    while (w.n % 32)
        gw_uint(&w, 0, 1);
    for (int i = 0; i < 15; i++)
        gw_uint(&w, 0, 4);
    return w;
}

Test(gguf, reads_every_value_kind_and_tensor_descriptors)
{
    struct gw w = sample();
    struct shoal_err err = {0};
    struct shoal_gguf *g = shoal_gguf_open_mem(w.p, w.n, "sample", &err);
    cr_assert_not_null(g, "%s", err.msg);
    cr_assert(eq(u32, shoal_gguf_version(g), 3));
    cr_assert(eq(u64, shoal_gguf_n_kv(g), 9));
    int64_t v;
    cr_assert(eq(int, shoal_gguf_get_int(g, "u8", &v, &err), 0));
    cr_assert(eq(i64, v, 200));
    cr_assert(eq(int, shoal_gguf_get_int(g, "i16", &v, &err), 0));
    cr_assert(eq(i64, v, -7));
    cr_assert(eq(int, shoal_gguf_get_int(g, "u32", &v, &err), 0));
    cr_assert(eq(i64, v, 123456));
    cr_assert(eq(int, shoal_gguf_get_int(g, "i64", &v, &err), 0));
    cr_assert(eq(i64, v, -5));
    double d;
    cr_assert(eq(int, shoal_gguf_get_f64(g, "f32", &d, &err), 0));
    cr_assert(eq(dbl, d, 0.25));
    int b;
    cr_assert(eq(int, shoal_gguf_get_bool(g, "flag", &b, &err), 0));
    cr_assert(eq(int, b, 1));
    const char *s;
    size_t sl;
    cr_assert(eq(int, shoal_gguf_get_str(g, "name", &s, &sl, &err), 0));
    cr_assert(eq(str, (char *)s, "hello"));
    cr_assert(eq(sz, sl, 5));
    struct shoal_gguf_array a;
    cr_assert(eq(int, shoal_gguf_get_array(g, "words", &a, &err), 0));
    cr_assert(eq(u64, a.n, 3));
    cr_assert(eq(str, (char *)a.strs[2], "ccc"));
    cr_assert(eq(u64, a.str_lens[1], 0));
    cr_assert(eq(int, shoal_gguf_get_array(g, "nums", &a, &err), 0));
    cr_assert(eq(int, a.type, SHOAL_GGUF_TYPE_INT32));
    cr_assert(eq(i32, ((const int32_t *)a.data)[3], 29));
    cr_assert(eq(i32, ((const int32_t *)a.data)[0], -1));
    struct shoal_gguf_tensor t;
    cr_assert(eq(u64, shoal_gguf_n_tensors(g), 1));
    cr_assert(eq(int, shoal_gguf_tensor(g, 0, &t), 0));
    cr_assert(eq(str, (char *)t.name, "w"));
    cr_assert(eq(u32, t.n_dims, 2));
    cr_assert(eq(u64, t.ne[0], 5));
    cr_assert(eq(u64, t.ne[1], 3));
    cr_assert(eq(u64, t.ne[2], 1));
    cr_assert(eq(u64, t.offset, shoal_gguf_data_offset(g)));
    cr_assert(eq(u64, shoal_gguf_data_offset(g) % 32, 0));
    cr_assert(eq(int, shoal_gguf_tensor(g, 1, &t), SHOAL_ERANGE));
    cr_assert(eq(int, err.code, 0), "%s", err.msg);
    shoal_gguf_close(g);
    free(w.p);
}

Test(gguf, missing_key_is_notfound_and_wrong_type_is_named)
{
    struct gw w = sample();
    struct shoal_err err = {0};
    struct shoal_gguf *g = shoal_gguf_open_mem(w.p, w.n, "sample", &err);
    cr_assert_not_null(g, "%s", err.msg);
    int64_t v;
    cr_assert(eq(int, shoal_gguf_get_int(g, "absent", &v, &err),
                 SHOAL_ENOTFOUND));
    cr_assert(eq(int, err.code, 0), "a missing key is not an error");
    cr_assert(eq(int, shoal_gguf_get_int(g, "name", &v, &err),
                 SHOAL_EFORMAT));
    cr_assert_not_null(strstr(err.msg, "'name'"), "%s", err.msg);
    cr_assert_not_null(strstr(err.msg, "string"), "%s", err.msg);
    shoal_gguf_close(g);
    free(w.p);
}

Test(gguf, every_truncation_is_a_clean_error)
{
    struct gw w = sample();
    /* the tensor data is not read: cut anywhere up to the data section */
    struct shoal_err err0 = {0};
    struct shoal_gguf *g = shoal_gguf_open_mem(w.p, w.n, "s", &err0);
    cr_assert_not_null(g);
    size_t data_off = (size_t)shoal_gguf_data_offset(g);
    shoal_gguf_close(g);
    for (size_t cut = 0; cut < data_off; cut++) {
        struct shoal_err err = {0};
        g = shoal_gguf_open_mem(w.p, cut, "cut", &err);
        cr_assert_null(g, "a file cut at %zu bytes of %zu parsed", cut,
                       w.n);
        cr_assert(err.code < 0);
        cr_assert_null(strchr(err.msg, '\n'), "%s", err.msg);
    }
    free(w.p);
}

Test(gguf, bad_magic_and_versions_are_refused)
{
    struct gw w = {0};
    gw_bytes(&w, "GGUX", 4);
    gw_uint(&w, 3, 4);
    gw_uint(&w, 0, 8);
    gw_uint(&w, 0, 8);
    struct shoal_err err = {0};
    cr_assert_null(shoal_gguf_open_mem(w.p, w.n, "m", &err));
    cr_assert(eq(int, err.code, SHOAL_EFORMAT));
    cr_assert_not_null(strstr(err.msg, "magic"), "%s", err.msg);

    memcpy(w.p, "GGUF", 4);
    w.p[4] = 1; /* version 1 */
    shoal_err_clear(&err);
    cr_assert_null(shoal_gguf_open_mem(w.p, w.n, "m", &err));
    cr_assert(eq(int, err.code, SHOAL_EUNSUPPORTED));
    cr_assert_not_null(strstr(err.msg, "version 1"), "%s", err.msg);

    w.p[4] = 0, w.p[7] = 3; /* 3 written big-endian */
    shoal_err_clear(&err);
    cr_assert_null(shoal_gguf_open_mem(w.p, w.n, "m", &err));
    cr_assert_not_null(strstr(err.msg, "big-endian"), "%s", err.msg);
    free(w.p);
}

Test(gguf, absurd_counts_fail_fast_without_allocating)
{
    struct shoal_err err = {0};
    /* 2^60 metadata pairs */
    struct gw w = {0};
    gw_header(&w, 3, 0, (uint64_t)1 << 60);
    gw_key(&w, "k", SHOAL_GGUF_TYPE_UINT8);
    gw_uint(&w, 1, 1);
    cr_assert_null(shoal_gguf_open_mem(w.p, w.n, "kv", &err));
    cr_assert(eq(int, err.code, SHOAL_EFORMAT));
    cr_assert_not_null(strstr(err.msg, "metadata pairs"), "%s", err.msg);
    free(w.p);

    /* an array of 2^62 strings, and of 2^61 int32 */
    uint32_t types[2] = {SHOAL_GGUF_TYPE_STRING, SHOAL_GGUF_TYPE_INT32};
    for (int k = 0; k < 2; k++) {
        w = (struct gw){0};
        gw_header(&w, 3, 0, 1);
        gw_key(&w, "tokenizer.ggml.tokens", SHOAL_GGUF_TYPE_ARRAY);
        gw_uint(&w, types[k], 4);
        gw_uint(&w, (uint64_t)1 << (62 - k), 8);
        gw_str(&w, "only one");
        shoal_err_clear(&err);
        cr_assert_null(shoal_gguf_open_mem(w.p, w.n, "arr", &err));
        cr_assert(eq(int, err.code, SHOAL_EFORMAT));
        cr_assert_not_null(strstr(err.msg, "tokenizer.ggml.tokens"), "%s",
                           err.msg);
        free(w.p);
    }

    /* a string that claims more bytes than the file has */
    w = (struct gw){0};
    gw_header(&w, 3, 0, 1);
    gw_key(&w, "s", SHOAL_GGUF_TYPE_STRING);
    gw_uint(&w, (uint64_t)-1, 8);
    shoal_err_clear(&err);
    cr_assert_null(shoal_gguf_open_mem(w.p, w.n, "str", &err));
    cr_assert(eq(int, err.code, SHOAL_EFORMAT));
    free(w.p);

    /* 2^40 tensors */
    w = (struct gw){0};
    gw_header(&w, 3, (uint64_t)1 << 40, 0);
    shoal_err_clear(&err);
    cr_assert_null(shoal_gguf_open_mem(w.p, w.n, "tensors", &err));
    cr_assert_not_null(strstr(err.msg, "tensors"), "%s", err.msg);
    free(w.p);
}

Test(gguf, nested_arrays_unknown_types_and_duplicates_are_refused)
{
    struct shoal_err err = {0};
    struct gw w = {0};
    gw_header(&w, 3, 0, 1);
    gw_key(&w, "a", SHOAL_GGUF_TYPE_ARRAY);
    gw_uint(&w, SHOAL_GGUF_TYPE_ARRAY, 4);
    gw_uint(&w, 0, 8);
    cr_assert_null(shoal_gguf_open_mem(w.p, w.n, "nested", &err));
    cr_assert(eq(int, err.code, SHOAL_EUNSUPPORTED));
    free(w.p);

    w = (struct gw){0};
    gw_header(&w, 3, 0, 1);
    gw_key(&w, "x", 99);
    shoal_err_clear(&err);
    cr_assert_null(shoal_gguf_open_mem(w.p, w.n, "type", &err));
    cr_assert_not_null(strstr(err.msg, "99"), "%s", err.msg);
    free(w.p);

    w = (struct gw){0};
    gw_header(&w, 3, 0, 2);
    for (int i = 0; i < 2; i++) {
        gw_key(&w, "dup", SHOAL_GGUF_TYPE_UINT8);
        gw_uint(&w, 1, 1);
    }
    shoal_err_clear(&err);
    cr_assert_null(shoal_gguf_open_mem(w.p, w.n, "dup", &err));
    cr_assert_not_null(strstr(err.msg, "duplicate"), "%s", err.msg);
    free(w.p);
}

Test(gguf, bad_tensor_descriptors_are_refused)
{
    struct shoal_err err = {0};
    /* 5 dims */
    struct gw w = {0};
    gw_header(&w, 3, 1, 0);
    gw_str(&w, "t");
    gw_uint(&w, 5, 4);
    for (int i = 0; i < 5; i++)
        gw_uint(&w, 2, 8);
    gw_uint(&w, 0, 4);
    gw_uint(&w, 0, 8);
    cr_assert_null(shoal_gguf_open_mem(w.p, w.n, "dims", &err));
    cr_assert_not_null(strstr(err.msg, "5 dims"), "%s", err.msg);
    free(w.p);

    /* offset past the end of the file */
    w = (struct gw){0};
    gw_header(&w, 3, 1, 0);
    gw_str(&w, "t");
    gw_uint(&w, 1, 4);
    gw_uint(&w, 4, 8);
    gw_uint(&w, 0, 4);
    gw_uint(&w, (uint64_t)1 << 40, 8);
    shoal_err_clear(&err);
    cr_assert_null(shoal_gguf_open_mem(w.p, w.n, "off", &err));
    cr_assert_not_null(strstr(err.msg, "offset"), "%s", err.msg);
    free(w.p);
}

Test(gguf, opens_a_real_vocab_file)
{
    const char *path =
        SHOAL_SHARED_DIR "/data/tokenizers/llama.cpp/ggml-vocab-gpt-2.gguf";
    if (access(path, R_OK) != 0)
        cr_skip("shared data not available: %s", path);
    struct shoal_err err = {0};
    struct shoal_gguf *g = shoal_gguf_open(path, &err);
    cr_assert_not_null(g, "%s", err.msg);
    const char *model;
    cr_assert(eq(int, shoal_gguf_get_str(g, "tokenizer.ggml.model", &model,
                                         NULL, &err),
                 0));
    cr_assert(eq(str, (char *)model, "gpt2"));
    struct shoal_gguf_array a;
    cr_assert(eq(int,
                 shoal_gguf_get_array(g, "tokenizer.ggml.tokens", &a, &err),
                 0));
    cr_assert(eq(u64, a.n, 50257));
    cr_assert(eq(str, (char *)a.strs[0], "!"));
    shoal_gguf_close(g);
}

Test(gguf, missing_file_names_the_path)
{
    struct shoal_err err = {0};
    cr_assert_null(shoal_gguf_open("/nonexistent/x.gguf", &err));
    cr_assert(err.code < 0);
    cr_assert_not_null(strstr(err.msg, "/nonexistent/x.gguf"), "%s",
                       err.msg);
}

/* --- tensors: types, byte counts, ranges ----------------------------------- */

struct tdesc {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    uint64_t offset; /* relative to the data section */
};

/* A file with the given alignment key (0: none), the tensors, and
 * data_bytes bytes of data after the aligned data section. */
static struct gw with_tensors(uint32_t alignment, const struct tdesc *t, int n,
                              uint64_t data_bytes)
{
    struct gw w = {0};
    gw_header(&w, 3, (uint64_t)n, alignment ? 2 : 1);
    gw_key(&w, "general.architecture", SHOAL_GGUF_TYPE_STRING);
    gw_str(&w, "qwen3moe");
    if (alignment) {
        gw_key(&w, "general.alignment", SHOAL_GGUF_TYPE_UINT32);
        gw_uint(&w, alignment, 4);
    }
    for (int i = 0; i < n; i++) {
        gw_str(&w, t[i].name);
        gw_uint(&w, t[i].n_dims, 4);
        for (uint32_t d = 0; d < t[i].n_dims; d++)
            gw_uint(&w, t[i].ne[d], 8);
        gw_uint(&w, t[i].type, 4);
        gw_uint(&w, t[i].offset, 8);
    }
    uint32_t a = alignment ? alignment : 32;
    while (w.n % a)
        gw_uint(&w, 0, 1);
    for (uint64_t i = 0; i < data_bytes; i++)
        gw_uint(&w, (uint8_t)i, 1);
    return w;
}

/* token_embd F32 [4][64], a Q4_K expert tensor [2 experts][3 rows][256] and
 * a Q8_0 [32][2], laid out one after another at 64-byte alignment. */
static const struct tdesc moe_tensors[] = {
    {"token_embd.weight", 2, {64, 4}, 0, 0},                     /* 1024 bytes */
    {"blk.0.ffn_gate_exps.weight", 3, {256, 3, 2}, 12, 1024},    /* 864 bytes */
    {"blk.0.attn_q.weight", 2, {32, 2}, 8, 1920},                /* 68 bytes */
};

Test(gguf, tensors_carry_type_byte_count_and_absolute_offset)
{
    struct gw w = with_tensors(64, moe_tensors, 3, 1920 + 68);
    struct shoal_err err = {0};
    struct shoal_gguf *g = shoal_gguf_open_mem(w.p, w.n, "moe", &err);
    cr_assert_not_null(g, "%s", err.msg);
    cr_assert(eq(u64, shoal_gguf_alignment(g), 64));
    cr_assert(eq(u64, shoal_gguf_file_size(g), w.n));
    uint64_t data = shoal_gguf_data_offset(g);
    cr_assert(eq(u64, data % 64, 0));
    const uint64_t want_bytes[3] = {1024, 864, 68};
    for (int i = 0; i < 3; i++) {
        struct shoal_gguf_tensor t;
        cr_assert(eq(int, shoal_gguf_tensor(g, (uint64_t)i, &t), 0));
        cr_assert(eq(str, (char *)t.name, (char *)moe_tensors[i].name));
        cr_assert(eq(u32, t.type, moe_tensors[i].type));
        cr_assert(eq(u64, t.nbytes, want_bytes[i]), "%s", t.name);
        cr_assert(eq(u64, t.offset, data + moe_tensors[i].offset), "%s", t.name);
        cr_assert(t.offset + t.nbytes <= w.n);
    }
    shoal_gguf_close(g);
    free(w.p);
}

/* Open the image, expect failure with code and every needle in the message. */
static void expect_error(const struct gw *w, int code, const char *n1, const char *n2)
{
    struct shoal_err err = {0};
    struct shoal_gguf *g = shoal_gguf_open_mem(w->p, w->n, "bad.gguf", &err);
    cr_assert_null(g, "a bad file parsed");
    cr_assert(eq(int, err.code, code), "%s", err.msg);
    cr_assert_not_null(strstr(err.msg, "bad.gguf"), "%s", err.msg);
    cr_assert_null(strchr(err.msg, '\n'), "%s", err.msg);
    if (n1)
        cr_assert_not_null(strstr(err.msg, n1), "'%s' not in: %s", n1, err.msg);
    if (n2)
        cr_assert_not_null(strstr(err.msg, n2), "'%s' not in: %s", n2, err.msg);
}

Test(gguf, tensor_data_past_the_end_is_refused)
{
    /* the last tensor's 68 bytes need one more byte than the file has */
    struct gw w = with_tensors(64, moe_tensors, 3, 1920 + 67);
    expect_error(&w, SHOAL_EFORMAT, "blk.0.attn_q.weight", "68 bytes");
    free(w.p);
    /* every cut inside the data section fails too */
    struct gw full = with_tensors(64, moe_tensors, 3, 1920 + 68);
    for (size_t cut = full.n - 1988; cut < full.n; cut += 97) {
        struct gw c = {.p = full.p, .n = cut};
        struct shoal_err err = {0};
        cr_assert_null(shoal_gguf_open_mem(c.p, c.n, "cut", &err), "cut %zu", cut);
    }
    free(full.p);
}

Test(gguf, unaligned_offsets_and_bad_alignment_are_refused)
{
    struct tdesc t[1] = {{"x", 1, {32}, 0, 16}};
    struct gw w = with_tensors(64, t, 1, 1024);
    expect_error(&w, SHOAL_EFORMAT, "'x'", "alignment 64");
    free(w.p);
    w = with_tensors(48, t, 1, 1024); /* not a power of two */
    expect_error(&w, SHOAL_EFORMAT, "general.alignment", "48");
    free(w.p);
}

Test(gguf, unknown_types_partial_blocks_and_huge_dims_are_refused)
{
    struct tdesc t[1] = {{"blk.0.ffn_down_exps.weight", 2, {256, 4}, 4, 0}};
    struct gw w = with_tensors(0, t, 1, 4096);
    expect_error(&w, SHOAL_EUNSUPPORTED, "blk.0.ffn_down_exps.weight", "ggml type 4");
    free(w.p);
    t[0].type = 77;
    w = with_tensors(0, t, 1, 4096);
    expect_error(&w, SHOAL_EUNSUPPORTED, "77", NULL);
    free(w.p);
    /* a Q4_K row of 100 elements is not whole blocks */
    t[0] = (struct tdesc){"r", 2, {100, 4}, 12, 0};
    w = with_tensors(0, t, 1, 4096);
    expect_error(&w, SHOAL_ESHAPE, "'r'", "Q4_K");
    free(w.p);
    /* a byte count past 2^63 */
    t[0] = (struct tdesc){"h", 3, {(uint64_t)1 << 30, (uint64_t)1 << 20, (uint64_t)1 << 12}, 0, 0};
    w = with_tensors(0, t, 1, 64);
    struct shoal_err err = {0};
    cr_assert_null(shoal_gguf_open_mem(w.p, w.n, "h", &err));
    cr_assert(err.code < 0);
    free(w.p);
}

Test(gguf, duplicate_tensor_names_are_refused)
{
    struct tdesc t[2] = {{"a", 1, {32}, 0, 0}, {"a", 1, {32}, 0, 128}};
    struct gw w = with_tensors(0, t, 2, 256);
    expect_error(&w, SHOAL_EFORMAT, "duplicate tensor name 'a'", NULL);
    free(w.p);
}

Test(gguf, unprintable_keys_and_tensor_names_are_refused_escaped)
{
    struct gw w = {0};
    gw_header(&w, 3, 0, 1);
    gw_key(&w, "qwen\x0b" "3moe.block_count", SHOAL_GGUF_TYPE_UINT32);
    gw_uint(&w, 6, 4);
    expect_error(&w, SHOAL_EFORMAT, "metadata key 0 has byte 0x0b at 4", "(\"qwen\" before it)");
    struct shoal_err err = {0};
    cr_assert_null(shoal_gguf_open_mem(w.p, w.n, "bad.gguf", &err));
    cr_assert_null(strchr(err.msg, '\x0b'), "the raw byte reached the message: %s", err.msg);
    free(w.p);
    struct tdesc t[1] = {{"blk.0.\x1b" "ffn", 1, {32}, 0, 0}};
    w = with_tensors(0, t, 1, 128);
    expect_error(&w, SHOAL_EFORMAT, "tensor name 0 has byte 0x1b at 6", NULL);
    free(w.p);
    /* a NUL inside a key would cut it silently */
    w = (struct gw){0};
    gw_header(&w, 3, 0, 1);
    gw_uint(&w, 9, 8);
    gw_bytes(&w, "ab\0cdefgh", 9);
    gw_uint(&w, SHOAL_GGUF_TYPE_UINT8, 4);
    gw_uint(&w, 1, 1);
    expect_error(&w, SHOAL_EFORMAT, "metadata key 0 has byte 0x00 at 2", NULL);
    free(w.p);
    /* a UTF-8 tensor name is text (the spec allows it); a key is ASCII */
    struct tdesc u[1] = {{"blk.0.\xc3\xa9", 1, {32}, 0, 0}};
    w = with_tensors(0, u, 1, 128);
    struct shoal_gguf *g = shoal_gguf_open_mem(w.p, w.n, "utf8.gguf", &err);
    cr_assert_not_null(g, "%s", err.msg);
    shoal_gguf_close(g);
    free(w.p);
}

Test(gguf, a_header_past_the_limit_is_refused_without_reading_it)
{
    /* a string array claiming more bytes than the header may span, in a
     * memory image that is larger still (only its size is looked at) */
    size_t big = (size_t)SHOAL_GGUF_MAX_HEADER_BYTES + 4096;
    unsigned char *p = calloc(1, big);
    cr_assert_not_null(p);
    struct gw w = {0};
    gw_header(&w, 3, 0, 1);
    gw_key(&w, "k", SHOAL_GGUF_TYPE_STRING);
    gw_uint(&w, SHOAL_GGUF_MAX_HEADER_BYTES, 8);
    memcpy(p, w.p, w.n);
    struct shoal_err err = {0};
    cr_assert_null(shoal_gguf_open_mem(p, big, "huge", &err));
    cr_assert(eq(int, err.code, SHOAL_EFORMAT));
    cr_assert_not_null(strstr(err.msg, "header limit"), "%s", err.msg);
    free(w.p);
    free(p);
}

/* --- split files ------------------------------------------------------------ */

Test(gguf, split_names_parse)
{
    size_t pl;
    uint32_t no, count;
    cr_assert(eq(int, shoal_gguf_split_name("/m/Kimi-K2-Q2_K-00002-of-00005.gguf", &pl, &no, &count), 0));
    cr_assert(eq(sz, pl, strlen("/m/Kimi-K2-Q2_K")));
    cr_assert(eq(u32, no, 2));
    cr_assert(eq(u32, count, 5));
    cr_assert(eq(int, shoal_gguf_split_name("model.gguf", &pl, &no, &count), SHOAL_ENOTFOUND));
    cr_assert(eq(int, shoal_gguf_split_name("m-00000-of-00002.gguf", &pl, &no, &count),
                 SHOAL_ENOTFOUND));
    cr_assert(eq(int, shoal_gguf_split_name("m-00003-of-00002.gguf", &pl, &no, &count),
                 SHOAL_ENOTFOUND));
    cr_assert(eq(int, shoal_gguf_split_name("m-0001-of-00002.gguf", &pl, &no, &count),
                 SHOAL_ENOTFOUND));
}

/* Write split file i of n holding tensor "t<i>" (F32 [32]). */
static void write_split(const char *dir, int i, int n, int no_key, int tensors_total)
{
    struct gw w = {0};
    gw_header(&w, 3, 1, i == 0 ? 3 : 2);
    gw_key(&w, "split.no", SHOAL_GGUF_TYPE_UINT16);
    gw_uint(&w, (uint64_t)no_key, 2);
    gw_key(&w, "split.count", SHOAL_GGUF_TYPE_UINT16);
    gw_uint(&w, (uint64_t)n, 2);
    if (i == 0) {
        gw_key(&w, "split.tensors.count", SHOAL_GGUF_TYPE_INT32);
        gw_uint(&w, (uint64_t)tensors_total, 4);
    }
    char name[16];
    snprintf(name, sizeof name, "t%d", i);
    gw_str(&w, name);
    gw_uint(&w, 1, 4);
    gw_uint(&w, 32, 8);
    gw_uint(&w, 0, 4);
    gw_uint(&w, 0, 8);
    while (w.n % 32)
        gw_uint(&w, 0, 1);
    for (int k = 0; k < 128; k++)
        gw_uint(&w, 0, 1);
    char path[512];
    snprintf(path, sizeof path, "%s/m-%05d-of-%05d.gguf", dir, i + 1, n);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert(eq(sz, fwrite(w.p, 1, w.n, f), w.n));
    fclose(f);
    free(w.p);
}

Test(gguf, split_sets_open_from_any_file_and_check_their_keys)
{
    char dir[] = "/tmp/shoal_gguf_split_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    for (int i = 0; i < 3; i++)
        write_split(dir, i, 3, i, 3);
    char path[512];
    snprintf(path, sizeof path, "%s/m-00002-of-00003.gguf", dir);
    struct shoal_err err = {0};
    struct shoal_gguf_files *f = shoal_gguf_files_open(path, &err);
    cr_assert_not_null(f, "%s", err.msg);
    cr_assert(eq(u32, shoal_gguf_files_count(f), 3));
    for (uint32_t i = 0; i < 3; i++) {
        struct shoal_gguf_tensor t;
        cr_assert(eq(int, shoal_gguf_tensor(shoal_gguf_files_get(f, i), 0, &t), 0));
        char want[8];
        snprintf(want, sizeof want, "t%u", i);
        cr_assert(eq(str, (char *)t.name, want));
        cr_assert_not_null(strstr(shoal_gguf_files_path(f, i), "-of-00003.gguf"));
    }
    shoal_gguf_files_close(f);

    /* file 3 says it is split 1 */
    write_split(dir, 2, 3, 1, 3);
    cr_assert_null(shoal_gguf_files_open(path, &err));
    cr_assert_not_null(strstr(err.msg, "m-00003-of-00003.gguf"), "%s", err.msg);
    cr_assert_not_null(strstr(err.msg, "split.no"), "%s", err.msg);
    /* a missing file is named */
    snprintf(path, sizeof path, "%s/m-00003-of-00003.gguf", dir);
    unlink(path);
    shoal_err_clear(&err);
    snprintf(path, sizeof path, "%s/m-00001-of-00003.gguf", dir);
    cr_assert_null(shoal_gguf_files_open(path, &err));
    cr_assert_not_null(strstr(err.msg, "m-00003-of-00003.gguf"), "%s", err.msg);
    /* the first file's tensor count disagrees */
    write_split(dir, 0, 3, 0, 5);
    write_split(dir, 2, 3, 2, 3);
    shoal_err_clear(&err);
    cr_assert_null(shoal_gguf_files_open(path, &err));
    cr_assert_not_null(strstr(err.msg, "split.tensors.count"), "%s", err.msg);
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/m-%05d-of-00003.gguf", dir, i + 1);
        unlink(path);
    }
    rmdir(dir);
}
