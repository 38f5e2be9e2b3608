/* CURVE keys, the peers file and the ZAP handler (curve.h). */
#define PDX_LOG_TOPIC "curve"
#include "agent/curve.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <pdx/engine.h>

#include "common/log.h"

#define ZAP_DOMAIN "pdx"

struct member {
	char addr[PDX_ADDR_MAX];
	char key[PDX_CURVE_KEY_LEN + 1];
};

struct pdx_curve {
	char public_key[PDX_CURVE_KEY_LEN + 1];
	char secret_key[PDX_CURVE_KEY_LEN + 1];
	char peers_file[4096];
	struct stat peers_st; /* as last read */
	struct member *members;
	size_t n_members;
};

static bool z85_key(const char *s)
{
	uint8_t bin[32];

	return strlen(s) == PDX_CURVE_KEY_LEN && zmq_z85_decode(bin, s) != NULL;
}

/* The quoted value after `name = ` on a line of a certificate file. */
static int cert_value(const char *line, const char *name, char *out)
{
	const char *p = strstr(line, name), *q;

	if (!p)
		return -1;
	p = strchr(p + strlen(name), '"');
	q = p ? strchr(p + 1, '"') : NULL;
	if (!q || q - p - 1 != PDX_CURVE_KEY_LEN)
		return -1;
	memcpy(out, p + 1, PDX_CURVE_KEY_LEN);
	out[PDX_CURVE_KEY_LEN] = '\0';
	return z85_key(out) ? 0 : -1;
}

static pdx_status_t read_key_file(struct pdx_curve *c, const char *path,
				  char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	char line[512];
	struct stat st;

	if (!f) {
		snprintf(err, errlen, "CURVE key %s: %s", path, strerror(errno));
		return PDX_EINVAL;
	}
	if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "CURVE key %s: not a regular file", path);
		fclose(f);
		return PDX_EINVAL;
	}
	if (st.st_mode & 077)
		log_warn("CURVE key %s is readable by others (mode %03o): "
			 "chmod 600 it", path, (unsigned)(st.st_mode & 0777));
	while (fgets(line, sizeof(line), f)) {
		cert_value(line, "public-key", c->public_key);
		cert_value(line, "secret-key", c->secret_key);
	}
	fclose(f);
	if (!c->public_key[0] || !c->secret_key[0]) {
		snprintf(err, errlen, "CURVE key %s: needs public-key and "
			 "secret-key lines with 40-character Z85 keys", path);
		return PDX_EINVAL;
	}
	return PDX_OK;
}

/* Reads the peers file anew; on a bad line keeps the old list. */
static pdx_status_t read_peers(struct pdx_curve *c, char *err, size_t errlen)
{
	FILE *f = fopen(c->peers_file, "r");
	struct member *m = NULL;
	size_t n = 0, cap = 0;
	char line[PDX_ADDR_MAX + 128];
	int no = 0;

	if (!f) {
		snprintf(err, errlen, "CURVE peers %s: %s", c->peers_file,
			 strerror(errno));
		return PDX_EINVAL;
	}
	if (fstat(fileno(f), &c->peers_st) != 0 ||
	    !S_ISREG(c->peers_st.st_mode)) {
		snprintf(err, errlen, "CURVE peers %s: not a regular file",
			 c->peers_file);
		fclose(f);
		return PDX_EINVAL;
	}
	while (fgets(line, sizeof(line), f)) {
		char addr[PDX_ADDR_MAX], key[64] = "";
		const char *why = NULL;
		int got;

		no++;
		got = sscanf(line, " %255s %63s", addr, key);
		if (got < 1 || addr[0] == '#')
			continue;
		if (strncmp(addr, "tcp://", 6) != 0)
			why = "the address does not start with tcp://";
		else if (got < 2)
			why = "no public key after the address";
		else if (!z85_key(key))
			/* Z85 has '$': an unquoted here-document expands it */
			why = "the key is not 40 characters of Z85 (written by "
			      "a shell here-document? quote its word: <<'EOF')";
		if (why) {
			snprintf(err, errlen, "CURVE peers %s line %d: want "
				 "\"tcp://HOST:PORT PUBLIC-KEY\": %s",
				 c->peers_file, no, why);
			fclose(f);
			free(m);
			return PDX_EINVAL;
		}
		if (n == cap) {
			struct member *g = realloc(m, (cap = cap ? 2 * cap : 8) *
							  sizeof(*m));
			if (!g) {
				fclose(f);
				free(m);
				return PDX_ENOMEM;
			}
			m = g;
		}
		snprintf(m[n].addr, sizeof(m[n].addr), "%s", addr);
		snprintf(m[n].key, sizeof(m[n].key), "%s", key);
		n++;
	}
	fclose(f);
	free(c->members);
	c->members = m;
	c->n_members = n;
	return PDX_OK;
}

/* A lookup missed: the file may have gained the member since. */
static void reread_if_changed(struct pdx_curve *c)
{
	struct stat st;
	char err[512];

	if (stat(c->peers_file, &st) != 0 ||
	    (st.st_mtim.tv_sec == c->peers_st.st_mtim.tv_sec &&
	     st.st_mtim.tv_nsec == c->peers_st.st_mtim.tv_nsec &&
	     st.st_size == c->peers_st.st_size))
		return;
	if (read_peers(c, err, sizeof(err)))
		log_warn("%s (keeping the previous list)", err);
	else
		log_info("CURVE peers %s read again: %zu members",
			 c->peers_file, c->n_members);
}

pdx_status_t pdx_curve_new(const char *key_file, const char *peers_file,
			   struct pdx_curve **out, char *err, size_t errlen)
{
	struct pdx_curve *c;
	pdx_status_t st;

	if (!zmq_has("curve")) {
		snprintf(err, errlen, "this libzmq has no CURVE support");
		return PDX_EINVAL;
	}
	if (!peers_file) {
		snprintf(err, errlen, "--curve-key needs --curve-peers");
		return PDX_EINVAL;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return PDX_ENOMEM;
	snprintf(c->peers_file, sizeof(c->peers_file), "%s", peers_file);
	st = read_key_file(c, key_file, err, errlen);
	if (!st)
		st = read_peers(c, err, errlen);
	if (st) {
		pdx_curve_free(c);
		return st;
	}
	*out = c;
	return PDX_OK;
}

void pdx_curve_free(struct pdx_curve *c)
{
	if (!c)
		return;
	explicit_bzero(c->secret_key, sizeof(c->secret_key));
	free(c->members);
	free(c);
}

static const char *find(struct pdx_curve *c, const char *s, bool by_addr)
{
	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < c->n_members; i++) {
			const struct member *m = &c->members[i];

			if (strcmp(by_addr ? m->addr : m->key, s) == 0)
				return by_addr ? m->key : m->addr;
		}
		if (pass == 0)
			reread_if_changed(c);
	}
	return NULL;
}

const char *pdx_curve_key_of(struct pdx_curve *c, const char *addr)
{
	return find(c, addr, true);
}

const char *pdx_curve_addr_of(struct pdx_curve *c, const char *key)
{
	return find(c, key, false);
}

int pdx_curve_server(struct pdx_curve *c, void *sock)
{
	int on = 1;

	return zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &on, sizeof(on)) ||
	       zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, c->secret_key,
			      PDX_CURVE_KEY_LEN) ||
	       zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, ZAP_DOMAIN,
			      strlen(ZAP_DOMAIN)) ? -1 : 0;
}

int pdx_curve_client(struct pdx_curve *c, void *sock, const char *addr)
{
	const char *key = pdx_curve_key_of(c, addr);

	if (!key) {
		log_warn("no CURVE key for peer %s in %s", addr, c->peers_file);
		return -1;
	}
	return zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, key,
			      PDX_CURVE_KEY_LEN) ||
	       zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, c->public_key,
			      PDX_CURVE_KEY_LEN) ||
	       zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, c->secret_key,
			      PDX_CURVE_KEY_LEN) ? -1 : 0;
}

/* ZAP (ZeroMQ RFC 27): version, request id, domain, address, routing id,
 * mechanism, then the credentials: for CURVE the client's 32-byte public
 * key. The reply: version, request id, status, text, user id, metadata. */
enum { ZAP_FRAMES = 7 };

static void zap_reply(void *rep, const zmq_msg_t *req_id, const char *code,
		      const char *text, const char *user)
{
	zmq_send(rep, "1.0", 3, ZMQ_SNDMORE);
	zmq_send(rep, zmq_msg_data((zmq_msg_t *)req_id),
		 zmq_msg_size((zmq_msg_t *)req_id), ZMQ_SNDMORE);
	zmq_send(rep, code, 3, ZMQ_SNDMORE);
	zmq_send(rep, text, strlen(text), ZMQ_SNDMORE);
	zmq_send(rep, user, strlen(user), ZMQ_SNDMORE);
	zmq_send(rep, "", 0, 0);
}

int pdx_curve_zap_drain(struct pdx_curve *c, void *rep)
{
	int n = 0;

	for (;;) {
		zmq_msg_t f[ZAP_FRAMES + 1];
		int got = 0, more = 1;
		size_t more_len = sizeof(more);
		char key[PDX_CURVE_KEY_LEN + 1] = "", addr[64] = "";
		const char *member = NULL;

		while (more) {
			zmq_msg_t *m = &f[got < ZAP_FRAMES ? got : ZAP_FRAMES];

			zmq_msg_init(m);
			if (zmq_msg_recv(m, rep, ZMQ_DONTWAIT) < 0) {
				zmq_msg_close(m);
				if (got == 0)
					return n;
				break;
			}
			if (got >= ZAP_FRAMES)
				zmq_msg_close(m); /* beyond the protocol */
			got++;
			zmq_getsockopt(rep, ZMQ_RCVMORE, &more, &more_len);
		}
		if (got > ZAP_FRAMES)
			got = ZAP_FRAMES;
		if (got == ZAP_FRAMES && zmq_msg_size(&f[6]) == 32)
			zmq_z85_encode(key, zmq_msg_data(&f[6]), 32);
		if (got >= 4)
			snprintf(addr, sizeof(addr), "%.*s",
				 (int)zmq_msg_size(&f[3]),
				 (const char *)zmq_msg_data(&f[3]));
		if (key[0])
			member = pdx_curve_addr_of(c, key);
		if (got >= 2) {
			if (member) {
				zap_reply(rep, &f[1], "200", "OK", member);
			} else {
				log_warn("connection from %s refused: its key "
					 "is not in %s", addr, c->peers_file);
				zap_reply(rep, &f[1], "400", "unknown key", "");
			}
		}
		for (int i = 0; i < got; i++)
			zmq_msg_close(&f[i]);
		n++;
	}
}

pdx_status_t pdx_curve_keygen(const char *path, char *err, size_t errlen)
{
	char pub[PDX_CURVE_KEY_LEN + 1], sec[PDX_CURVE_KEY_LEN + 1];
	int fd;
	FILE *f;

	if (zmq_curve_keypair(pub, sec)) {
		snprintf(err, errlen, "no CURVE support in this libzmq");
		return PDX_EINVAL;
	}
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	f = fd >= 0 ? fdopen(fd, "w") : NULL;
	if (!f) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return PDX_EINVAL;
	}
	fprintf(f, "#   pdx-agent CURVE secret certificate: keep it private\n"
		   "metadata\ncurve\n    public-key = \"%s\"\n"
		   "    secret-key = \"%s\"\n", pub, sec);
	explicit_bzero(sec, sizeof(sec));
	if (fclose(f)) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return PDX_EIO;
	}
	printf("%s\n", pub);
	return PDX_OK;
}
