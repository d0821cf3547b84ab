/* Criterion's new/assert.h operators for the shim (see criterion.h there).
 * eq(T, a, b) dispatches on the type tag T by token pasting. */
#ifndef SHOAL_CRITERION_SHIM_NEW_ASSERT_H
#define SHOAL_CRITERION_SHIM_NEW_ASSERT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../criterion.h"

#define CRS_TAG_i8 int8_t
#define CRS_TAG_i16 int16_t
#define CRS_TAG_i32 int32_t
#define CRS_TAG_i64 int64_t
#define CRS_TAG_u8 uint8_t
#define CRS_TAG_u16 uint16_t
#define CRS_TAG_u32 uint32_t
#define CRS_TAG_u64 uint64_t
#define CRS_TAG_int int
#define CRS_TAG_uint unsigned int
#define CRS_TAG_long long
#define CRS_TAG_ulong unsigned long
#define CRS_TAG_llong long long
#define CRS_TAG_ullong unsigned long long
#define CRS_TAG_sz size_t
#define CRS_TAG_iptr intptr_t
#define CRS_TAG_uptr uintptr_t
#define CRS_TAG_chr char
#define CRS_TAG_bool _Bool
#define CRS_TAG_flt float
#define CRS_TAG_dbl double
#define CRS_TAG_ldbl long double
#define CRS_TAG_ptr const void *

/* str compares contents; every other tag converts both sides to its type */
#define CRS_CMP(T, Op, A, B) CRS_CMP_##T(Op, A, B)
#define CRS_CMP_GEN(T, Op, A, B) ((CRS_TAG_##T)(A) Op (CRS_TAG_##T)(B))
#define CRS_CMP_str(Op, A, B) (crs_str_cmp((A), (B)) Op 0)
#define CRS_CMP_i8(Op, A, B) CRS_CMP_GEN(i8, Op, A, B)
#define CRS_CMP_i16(Op, A, B) CRS_CMP_GEN(i16, Op, A, B)
#define CRS_CMP_i32(Op, A, B) CRS_CMP_GEN(i32, Op, A, B)
#define CRS_CMP_i64(Op, A, B) CRS_CMP_GEN(i64, Op, A, B)
#define CRS_CMP_u8(Op, A, B) CRS_CMP_GEN(u8, Op, A, B)
#define CRS_CMP_u16(Op, A, B) CRS_CMP_GEN(u16, Op, A, B)
#define CRS_CMP_u32(Op, A, B) CRS_CMP_GEN(u32, Op, A, B)
#define CRS_CMP_u64(Op, A, B) CRS_CMP_GEN(u64, Op, A, B)
#define CRS_CMP_int(Op, A, B) CRS_CMP_GEN(int, Op, A, B)
#define CRS_CMP_uint(Op, A, B) CRS_CMP_GEN(uint, Op, A, B)
#define CRS_CMP_long(Op, A, B) CRS_CMP_GEN(long, Op, A, B)
#define CRS_CMP_ulong(Op, A, B) CRS_CMP_GEN(ulong, Op, A, B)
#define CRS_CMP_llong(Op, A, B) CRS_CMP_GEN(llong, Op, A, B)
#define CRS_CMP_ullong(Op, A, B) CRS_CMP_GEN(ullong, Op, A, B)
#define CRS_CMP_sz(Op, A, B) CRS_CMP_GEN(sz, Op, A, B)
#define CRS_CMP_iptr(Op, A, B) CRS_CMP_GEN(iptr, Op, A, B)
#define CRS_CMP_uptr(Op, A, B) CRS_CMP_GEN(uptr, Op, A, B)
#define CRS_CMP_chr(Op, A, B) CRS_CMP_GEN(chr, Op, A, B)
#define CRS_CMP_bool(Op, A, B) CRS_CMP_GEN(bool, Op, A, B)
#define CRS_CMP_flt(Op, A, B) CRS_CMP_GEN(flt, Op, A, B)
#define CRS_CMP_dbl(Op, A, B) CRS_CMP_GEN(dbl, Op, A, B)
#define CRS_CMP_ldbl(Op, A, B) CRS_CMP_GEN(ldbl, Op, A, B)
#define CRS_CMP_ptr(Op, A, B) CRS_CMP_GEN(ptr, Op, A, B)

#define eq(T, A, B) CRS_CMP(T, ==, A, B)
#define ne(T, A, B) CRS_CMP(T, !=, A, B)
#define lt(T, A, B) CRS_CMP(T, <, A, B)
#define le(T, A, B) CRS_CMP(T, <=, A, B)
#define gt(T, A, B) CRS_CMP(T, >, A, B)
#define ge(T, A, B) CRS_CMP(T, >=, A, B)
#define not(X) (!(X))
#define all(...) crs_all((int[]){__VA_ARGS__}, sizeof((int[]){__VA_ARGS__}) / sizeof(int))
#define any(...) crs_any((int[]){__VA_ARGS__}, sizeof((int[]){__VA_ARGS__}) / sizeof(int))
#define zero(T, A) CRS_CMP(T, ==, A, 0)

#define epsilon_eq(T, A, B, Eps) \
    (fabsl((long double)(CRS_TAG_##T)(A) - (long double)(CRS_TAG_##T)(B)) <= (long double)(Eps))
#define ieee_ulp_eq(T, A, B, Ulp) crs_ulp_eq_##T((A), (B), (Ulp))

int crs_str_cmp(const char *a, const char *b);
int crs_all(const int *v, size_t n);
int crs_any(const int *v, size_t n);
int crs_ulp_eq_flt(float a, float b, int ulp);
int crs_ulp_eq_dbl(double a, double b, int ulp);

#endif
