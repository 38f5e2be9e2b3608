/* The engine link's direct lane frames (docs/protocol.md, "The direct
 * lane"): a 4-byte big-endian length, then that many bytes of one msgpack
 * map, the same maps the ZeroMQ link carries one per frame. Shared by the
 * agent (agent/engine_direct.c) and libpdx (lib/direct.c). */
#ifndef PDX_COMMON_LANE_FRAME_H
#define PDX_COMMON_LANE_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define PDX_LANE_HDR 4
#define PDX_LANE_MAX_BYTES (64u << 20) /* as the ZeroMQ link's bound */
#define PDX_LANE_TOKEN_BYTES 16

/* {"op": "direct"} in msgpack: each side's last message on ZeroMQ */
#define PDX_LANE_MARKER "\x81\xa2" "op" "\xa6" "direct"
#define PDX_LANE_MARKER_BYTES (sizeof(PDX_LANE_MARKER) - 1)

static inline void pdx_lane_hdr_put(uint8_t hdr[PDX_LANE_HDR], uint32_t len)
{
	hdr[0] = (uint8_t)(len >> 24);
	hdr[1] = (uint8_t)(len >> 16);
	hdr[2] = (uint8_t)(len >> 8);
	hdr[3] = (uint8_t)len;
}

static inline uint32_t pdx_lane_hdr_get(const uint8_t hdr[PDX_LANE_HDR])
{
	return (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 |
	       (uint32_t)hdr[2] << 8 | hdr[3];
}

/* The next frame in have bytes beginning at buf (its header in the first
 * PDX_LANE_HDR of them, where there are that many): the whole frame's
 * bytes when it is all there, 0 while it is not, -1 as soon as its header
 * says a body over max bytes (the lane is broken). */
static inline int64_t pdx_lane_frame_len(const uint8_t *buf, size_t have,
					 uint32_t max)
{
	uint32_t body;

	if (have < PDX_LANE_HDR)
		return 0;
	body = pdx_lane_hdr_get(buf);
	if (body > max)
		return -1;
	return have >= PDX_LANE_HDR + (size_t)body ? PDX_LANE_HDR + (int64_t)body
						   : 0;
}

#endif
