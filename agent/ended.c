/* Recently ended transfers: a ring of `cap` slots, indexed by a hash
 * table over the used ones. */
#include "agent/ended.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>

struct ended {
	struct pdx_xfer_id id;
	UT_hash_handle hh;
	char peer[PDX_ADDR_MAX];
	char reason[PDX_REASON_MAX];
};

struct pdx_ended {
	struct ended *slots;
	struct ended *table;
	uint32_t cap, next, used;
};

struct pdx_ended *pdx_ended_new(uint32_t cap)
{
	struct pdx_ended *s = cap ? calloc(1, sizeof(*s)) : NULL;

	if (!s)
		return NULL;
	s->cap = cap;
	s->slots = calloc(cap, sizeof(*s->slots));
	if (!s->slots) {
		free(s);
		return NULL;
	}
	return s;
}

void pdx_ended_free(struct pdx_ended *s)
{
	if (!s)
		return;
	HASH_CLEAR(hh, s->table);
	free(s->slots);
	free(s);
}

void pdx_ended_add(struct pdx_ended *s, const struct pdx_xfer_id *id,
		   const char *peer, const char *reason)
{
	struct ended *e = NULL;

	HASH_FIND(hh, s->table, id->b, sizeof(id->b), e);
	if (!e) {
		e = &s->slots[s->next];
		if (s->used == s->cap)
			HASH_DEL(s->table, e); /* the oldest makes room */
		else
			s->used++;
		s->next = (s->next + 1) % s->cap;
		e->id = *id;
		HASH_ADD(hh, s->table, id.b, sizeof(e->id.b), e);
	}
	snprintf(e->peer, sizeof(e->peer), "%s", peer);
	snprintf(e->reason, sizeof(e->reason), "%s", reason);
}

const char *pdx_ended_find(const struct pdx_ended *s,
			   const struct pdx_xfer_id *id, const char *peer)
{
	struct ended *e = NULL;

	HASH_FIND(hh, s->table, id->b, sizeof(id->b), e);
	return e && (!peer || !e->peer[0] || strcmp(e->peer, peer) == 0)
		   ? e->reason
		   : NULL;
}
