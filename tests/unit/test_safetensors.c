#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "safetensors.h"
#include "test_fs.h"

static char dir[64];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/shoal-st-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void rm_dir(void)
{
    cr_assert(eq(int, test_rm_rf(dir), 0), "rm -rf %s: %s", dir, strerror(errno));
}

/* Write a safetensors file: header JSON + data bytes. If header_len_override
 * is nonzero, write that length instead of the real one. */
static char *write_st(const char *name, const char *header, const void *data,
                      size_t data_len, unsigned long long header_len_override)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    unsigned long long n = header_len_override ? header_len_override : strlen(header);
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    if (data_len)
        fwrite(data, 1, data_len, f);
    fclose(f);
    return path;
}

TestSuite(safetensors, .init = make_dir, .fini = rm_dir);

Test(safetensors, reads_dtype_shape_and_data)
{
    float data[6] = {1, 2, 3, 4, 5, 6};
    const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                    "\"__metadata__\":{\"format\":\"pt\"}}    ";
    char *p = write_st("m.safetensors", h, data, sizeof data, 0);
    struct shoal_err err = {0};
    struct shoal_safetensors *st = shoal_safetensors_open_file(p, &err);
    cr_assert_not_null(st, "%s", err.msg);
    struct shoal_st_tensor *t = shoal_safetensors_find(st, "a");
    cr_assert_not_null(t);
    cr_assert(eq(int, t->n_dims, 2));
    cr_assert(eq(i64, t->shape[0], 2));
    cr_assert(eq(i64, t->shape[1], 3));
    cr_assert(eq(int, t->dtype, SHOAL_DTYPE_F32));
    cr_assert(eq(flt, ((const float *)t->data)[5], 6.0f));
    cr_assert_null(shoal_safetensors_find(st, "b"));
    shoal_safetensors_close(st);
}

Test(safetensors, refuses_header_length_beyond_file)
{
    char *p = write_st("m.safetensors", "{}", NULL, 0, 1000000);
    struct shoal_err err = {0};
    cr_assert_null(shoal_safetensors_open_file(p, &err));
    cr_assert(eq(int, err.code, SHOAL_EFORMAT));
    cr_assert_not_null(strstr(err.msg, "header length 1000000"), "%s", err.msg);
}

Test(safetensors, refuses_truncated_data)
{
    float data[2] = {1, 2};
    const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    char *p = write_st("m.safetensors", h, data, sizeof data, 0);
    struct shoal_err err = {0};
    cr_assert_null(shoal_safetensors_open_file(p, &err));
    cr_assert_not_null(strstr(err.msg, "'a'"), "%s", err.msg);
    cr_assert_not_null(strstr(err.msg, "truncated"), "%s", err.msg);
}

Test(safetensors, refuses_byte_count_that_disagrees_with_shape)
{
    float data[4] = {0};
    const char *h = "{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    char *p = write_st("m.safetensors", h, data, sizeof data, 0);
    struct shoal_err err = {0};
    cr_assert_null(shoal_safetensors_open_file(p, &err));
    cr_assert_not_null(strstr(err.msg, "expected 8"), "%s", err.msg);
}

Test(safetensors, refuses_malformed_json_and_unknown_dtype)
{
    char *p = write_st("m.safetensors", "{\"a\":", NULL, 0, 0);
    struct shoal_err err = {0};
    cr_assert_null(shoal_safetensors_open_file(p, &err));
    cr_assert_not_null(strstr(err.msg, "malformed JSON"), "%s", err.msg);
    shoal_err_clear(&err);
    p = write_st("n.safetensors",
                 "{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}", "x", 1, 0);
    cr_assert_null(shoal_safetensors_open_file(p, &err));
    cr_assert_not_null(strstr(err.msg, "unknown dtype 'Q4'"), "%s", err.msg);
}

Test(safetensors, lists_but_flags_unsupported_dtypes)
{
    long long v = 7;
    const char *h = "{\"ids\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}";
    char *p = write_st("m.safetensors", h, &v, sizeof v, 0);
    struct shoal_err err = {0};
    struct shoal_safetensors *st = shoal_safetensors_open_file(p, &err);
    cr_assert_not_null(st, "%s", err.msg);
    struct shoal_st_tensor *t = shoal_safetensors_find(st, "ids");
    cr_assert_not_null(t);
    cr_assert(eq(int, t->dtype_ok, 0));
    cr_assert(eq(str, t->dtype_name, "I64"));
    shoal_safetensors_close(st);
}

Test(safetensors, sharded_index_must_match_shards)
{
    float d = 1;
    write_st("s1.safetensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", &d, 4, 0);
    write_st("s2.safetensors",
             "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", &d, 4, 0);
    char path[160];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}", f);
    fclose(f);
    struct shoal_err err = {0};
    struct shoal_safetensors *st = shoal_safetensors_open_dir(dir, &err);
    cr_assert_not_null(st, "%s", err.msg);
    cr_assert_not_null(shoal_safetensors_find(st, "a"));
    cr_assert_not_null(shoal_safetensors_find(st, "b"));
    shoal_safetensors_close(st);

    f = fopen(path, "w");
    fputs("{\"weight_map\":{\"a\":\"s2.safetensors\",\"b\":\"s2.safetensors\"}}", f);
    fclose(f);
    cr_assert_null(shoal_safetensors_open_dir(dir, &err));
    cr_assert_not_null(strstr(err.msg, "tensor 'a'"), "%s", err.msg);
}
