/* ZeroMQ CURVE on the peer link (docs/security.md): every agent has its
 * own key pair; a peers file names each member agent by its peer address
 * and public key. An agent accepts a connection only from a key in that
 * file (its ZAP handler), takes the connection's messages only when their
 * "from" is the address listed for that key, and connects to a peer only
 * with the peer's listed key, so both ends are authenticated and the link
 * is encrypted. The peers file is read again when it changed and a lookup
 * misses: members are added without restarting anyone. */
#ifndef PDX_AGENT_CURVE_H
#define PDX_AGENT_CURVE_H

#include <stddef.h>

#include <pdx/status.h>

#define PDX_CURVE_KEY_LEN 40 /* Z85 text of a 32-byte key */

struct pdx_curve;

/* Reads our key pair from key_file (the ZeroMQ certificate format:
 * `public-key = "…"` and `secret-key = "…"` lines, as pyzmq's
 * zmq.auth.create_certificates() and `pdx-agent --curve-keygen` write)
 * and the peers file (lines `ADDRESS PUBLIC-KEY`; `#` comments). On
 * failure writes why to err. */
pdx_status_t pdx_curve_new(const char *key_file, const char *peers_file,
			   struct pdx_curve **out, char *err, size_t errlen);
void pdx_curve_free(struct pdx_curve *c);

/* The public key listed for a peer address, NULL when none. */
const char *pdx_curve_key_of(struct pdx_curve *c, const char *addr);
/* The peer address listed for a public key (Z85), NULL when none. */
const char *pdx_curve_addr_of(struct pdx_curve *c, const char *key);

/* Socket options before bind (ROUTER: CURVE server, ZAP domain "pdx") or
 * connect (DEALER to addr: its key as the server key, ours as client).
 * -1 when addr has no key (after a reload). */
int pdx_curve_server(struct pdx_curve *c, void *sock);
int pdx_curve_client(struct pdx_curve *c, void *sock, const char *addr);

/* Answers every ZAP request waiting on rep (the REP socket bound at
 * inproc://zeromq.zap.01): 200 with the key's listed address as User-Id,
 * else 400. Returns how many. */
int pdx_curve_zap_drain(struct pdx_curve *c, void *rep);

/* Writes a new key pair to path (mode 0600) and its public key to
 * stdout. */
pdx_status_t pdx_curve_keygen(const char *path, char *err, size_t errlen);

#endif
