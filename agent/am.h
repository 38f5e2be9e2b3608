/* The UCX active messages agents send each other (docs/protocol.md,
 * section 4). Each kind has its own id and its own handler, registered
 * once by push_am_register(), so no message is told apart from
 * another by the length of its header; a handler still checks the length
 * of the one header it expects, since the bytes come from a peer. */
#ifndef PDX_AGENT_AM_H
#define PDX_AGENT_AM_H

/* The peer link's protocol version, the hello's "v": 3 since "done"
 * carries the sender's meta (by UCX as its payload, which a version 2
 * receiver drops); 2 gave each kind below an id of its own (version 1
 * sent every kind with id 1). */
#define PEER_PROTOCOL_VERSION 3

enum am_id {
	AM_RUN = 1,	     /* am: a run of blocks (host_path.c) */
	AM_STAGED_CHUNK = 2, /* staged: a chunk by rendezvous (staged.c) */
	AM_STAGED_READY = 3, /* staged: a chunk in the sender's shared slot */
	AM_STAGED_FREE = 4,  /* staged: that slot is the sender's again */
	AM_DONE = 5,	     /* "done" on the ipc lane (complete.c) */
	AM_SLICE = 6,	     /* am: a TP leg's heads of blocks, packed */
};

/* Header bytes of each kind (little-endian; docs/protocol.md). */
#define AM_RUN_BYTES 24
#define AM_STAGED_CHUNK_BYTES 32
#define AM_STAGED_READY_BYTES 48
#define AM_STAGED_FREE_BYTES 20
#define AM_DONE_BYTES 40
#define AM_SLICE_BYTES AM_RUN_BYTES /* the same fields */

#endif
