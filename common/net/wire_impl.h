/* wire_impl: what the wire's files share (common/net/). Internal. */
#ifndef SHOAL_WIRE_IMPL_H
#define SHOAL_WIRE_IMPL_H

#include <stdint.h>

/* A little-endian u32 (the frame length prefix). */
static inline uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#endif
