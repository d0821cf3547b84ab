#include "tensor.h"

#include <math.h>

const char *shoal_dtype_name(enum shoal_dtype t)
{
    switch (t) {
    case SHOAL_DTYPE_F32: return "F32";
    case SHOAL_DTYPE_F16: return "F16";
    case SHOAL_DTYPE_BF16: return "BF16";
    default: return "?";
    }
}

float shoal_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else {
            /* subnormal: value = man * 2^-24 */
            float f = ldexpf((float)man, -24);
            memcpy(&u, &f, sizeof u);
            u |= sign;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

void shoal_to_f32(float *dst, const void *src, enum shoal_dtype t, size_t n)
{
    switch (t) {
    case SHOAL_DTYPE_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case SHOAL_DTYPE_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = shoal_bf16_to_f32(s[i]);
        break;
    }
    case SHOAL_DTYPE_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = shoal_f16_to_f32(s[i]);
        break;
    }
    default:
        break;
    }
}
