/* An agent for the fuzz targets: agent/engine_link.c, the peer link,
 * xfer.c, the data paths and notify.c as they are, with main.c's sockets (and its
 * xfer_ops and settle), zsend.c, ZeroMQ and the UCX transport replaced by
 * stubs in agent_harness.c (no socket, no shared memory: a "shm" region
 * named /fuzz... is a memfd of FA_SHM_BYTES).
 *
 * An input is one config byte and then records:
 *
 *   u8 channel, u16 length (little-endian), length bytes
 *
 * (a length past the end takes what is left). Channels, modulo 6:
 *   0  a frame from the engine (engine link)
 *   1  a frame from a peer agent (peer link)
 *   2  an eager active message: 24-byte header, then payload
 *   3  the same, rendezvous
 *   4  every transfer's timeout fires
 *   5  every UCX endpoint reports its peer dead
 * After each record the transport's pending operations complete, as
 * pdx_ucx_progress() would complete them.
 *
 * The config byte's low two bits pick --data-path (auto, ipc, put, am).
 *
 * The stubs check what the agent hands the transport: data moved only
 * from and to registered blocks, every frame it sends a msgpack map with
 * an op. A violation aborts, so the fuzzer reports it. */
#ifndef PDX_TESTS_FUZZ_AGENT_HARNESS_H
#define PDX_TESTS_FUZZ_AGENT_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "agent/agent.h"

#define FA_SHM_BYTES (64u << 10)
#define FA_PEER "tcp://peer.fuzz:7000"
#define FA_SELF "tcp://self.fuzz:7000"
#define FA_HOST "fuzzhost"

/* The layout the harness registers: 4 layers x 2 tensors, 64 blocks of 64
 * bytes, packed, in one region of 32 KiB. */
void fa_layout(struct pdx_kv_layout *l);

/* A fresh agent (data path from cfg's low bits); nothing registered. */
void fa_init(struct agent *a, uint8_t cfg);
/* Everything freed; the stubs check that nothing is left over. */
void fa_free(struct agent *a);

/* The engine registers fa_layout() in shm region "/fuzz-kv". */
void fa_register(struct agent *a);
/* FA_PEER says hello with fa_layout() (same host, shm): a ready peer. */
void fa_hello(struct agent *a);

/* Runs the records of an input (after its config byte). */
void fa_feed(struct agent *a, const uint8_t *data, size_t size);

#endif
