/* Continuous batching: admission, one step's plan and real work, and the
 * delivery of its outputs after the modeled time. */
#define PDX_LOG_TOPIC "sched"
#include "engine/scheduler.h"

#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include "common/clock.h"
#include "common/log.h"
#include "engine/block_alloc.h"
#include "engine/kv_seq.h"

enum req_phase {
	PHASE_QUEUED,
	PHASE_WAIT_KV,	/* remote_kv: the transfer is under way */
	PHASE_KV_READY, /* ... it ended: kv_status */
	PHASE_FIRST,	/* its first token is known: `first` */
	PHASE_PREFILL,
	PHASE_DECODE,
};

struct pdx_sched_req {
	TAILQ_ENTRY(pdx_sched_req) link; /* waiting or running */
	enum req_phase phase;
	uint32_t *prompt; /* until admitted; then in seq */
	uint32_t n_prompt, max_new;
	uint64_t cache_salt;
	uint64_t queued_ns; /* when it was submitted */
	struct pdx_kv_seq *seq;
	uint32_t n_out;		/* tokens delivered */
	uint32_t last_token;	/* the newest delivered one */
	bool has_output;	/* this step yields a token ... */
	uint32_t output;	/* ... this one */
	pdx_status_t kv_status; /* PHASE_KV_READY */
	int64_t first;		/* PHASE_KV_READY: the given first token */
	bool verify;		/* its received KV is still to be checked */
	bool in_pass;		/* has a run in this step's forward pass */
	bool posting;		/* its layers are being posted this step */
	struct pdx_sched_sink sink;
};

TAILQ_HEAD(req_list, pdx_sched_req);

struct pdx_sched {
	struct pdx_sched_params p;
	struct event *step;
	struct event *queue_ev; /* the oldest queued request's deadline */
	bool in_step; /* a step's outputs are due when the timer fires */
	/* layer-wise posting of the step's finished prefills */
	struct event *layer_ev;
	bool posting;		   /* some request's r->posting is set */
	uint32_t slot;		   /* the step's pass's event slot */
	uint32_t next_layer;	   /* layers [0, next_layer) posted */
	uint64_t step_t0, step_ns; /* the step's start and modeled time */
	struct req_list waiting, running;
	uint32_t n_waiting, n_running;
	struct pdx_synth_run *runs; /* the step's pass: max_num_seqs */
};

static void req_free(struct pdx_sched_req *r)
{
	pdx_kv_seq_free(r->seq);
	free(r->prompt);
	free(r);
}

/* The queue's bound: its timer is due when the oldest queued request
 * (the queue's head: first come, first served) has waited
 * queue_timeout_ms; none when the queue is empty or unbounded. */
static void queue_arm(struct pdx_sched *s)
{
	struct pdx_sched_req *r = TAILQ_FIRST(&s->waiting);
	uint64_t due, now;
	struct timeval tv;

	if (!r || !s->p.queue_timeout_ms) {
		evtimer_del(s->queue_ev);
		return;
	}
	now = pdx_now_ns();
	due = r->queued_ns + (uint64_t)s->p.queue_timeout_ms * 1000000;
	due = due > now ? due - now : 0;
	tv.tv_sec = (time_t)(due / 1000000000ULL);
	tv.tv_usec = (suseconds_t)(due % 1000000000ULL / 1000);
	evtimer_add(s->queue_ev, &tv);
}

/* Moves requests from the queue to the running set while a slot and all
 * their blocks are free, in arrival order. */
static void admit(struct pdx_sched *s)
{
	struct pdx_sched_req *r;
	pdx_status_t st;

	while ((r = TAILQ_FIRST(&s->waiting)) &&
	       s->n_running < s->p.max_num_seqs) {
		st = pdx_kv_seq_new(s->p.pool, r->prompt, r->n_prompt,
				    r->max_new, r->cache_salt, &r->seq);
		if (st == PDX_EAGAIN)
			break;
		TAILQ_REMOVE(&s->waiting, r, link);
		s->n_waiting--;
		if (st != PDX_OK) {
			log_warn("admitting a request: %s", pdx_status_str(st));
			r->sink.done(r->sink.arg, st);
			req_free(r);
			continue;
		}
		free(r->prompt);
		r->prompt = NULL;
		r->phase = r->sink.remote_kv ? PHASE_WAIT_KV : PHASE_PREFILL;
		TAILQ_INSERT_TAIL(&s->running, r, link);
		s->n_running++;
		if (r->sink.admitted)
			r->sink.admitted(r->sink.arg, r->seq);
	}
	queue_arm(s);
}

/* Queued requests that waited their bound out end with PDX_EAGAIN: the
 * engine had no room for them in time (a client gets a 503 to retry,
 * not a transfer's timeout much later). */
static void on_queue_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_sched *s = arg;
	uint64_t bound = (uint64_t)s->p.queue_timeout_ms * 1000000;
	uint64_t now = pdx_now_ns();
	struct pdx_sched_req *r;

	while ((r = TAILQ_FIRST(&s->waiting)) && now - r->queued_ns >= bound) {
		TAILQ_REMOVE(&s->waiting, r, link);
		s->n_waiting--;
		log_info("a request queued for %u ms got no room: refused",
			 s->p.queue_timeout_ms);
		r->sink.done(r->sink.arg, PDX_EAGAIN);
		req_free(r);
	}
	queue_arm(s);
}

static void end(struct pdx_sched *s, struct pdx_sched_req *r, pdx_status_t st)
{
	TAILQ_REMOVE(&s->running, r, link);
	s->n_running--;
	/* a transfer that failed because the agent went away: its blocks
	 * may still be written (http_kv.c, quarantine) */
	if ((st == PDX_OK || st == PDX_EAGENT) && r->sink.hold &&
	    r->sink.hold(r->sink.arg, r->seq))
		r->seq = NULL;
	r->sink.done(r->sink.arg, st);
	req_free(r);
}

/* The received KV of r's prompt matches its tokens (kv_pool.h: block
 * edges probed in host memory, every word on a GPU) and gives r->first
 * as the next token. */
static bool received_ok(struct pdx_sched *s, struct pdx_sched_req *r)
{
	struct pdx_kv_seq *q = r->seq;
	uint64_t wrong;
	uint32_t bad, mine;
	pdx_status_t st;

	st = pdx_kv_seq_verify(q, r->n_prompt, &wrong, &bad);
	if (st != PDX_OK) {
		log_error("checking received KV: %s", pdx_status_str(st));
		return false;
	}
	if (wrong) {
		log_warn("received KV differs at %llu position(s), the first "
			 "%u",
			 (unsigned long long)wrong, bad);
		return false;
	}
	st = pdx_kv_seq_next_token(q, s->p.model->vocab, &mine);
	if (st != PDX_OK) {
		log_error("reading the first token: %s", pdx_status_str(st));
		return false;
	}
	if (r->first < 0)
		r->first = mine;
	else if ((uint32_t)r->first != mine)
		log_warn("first token %lld given, %u read from the KV",
			 (long long)r->first, mine);
	return true;
}

/* A remote_kv request whose transfer ended. Given the prefill's first
 * token, it streams that at once and the KV is checked at the start of
 * the next step, under its modeled time (a real engine spends nothing
 * here; reading 8k tokens' block edges costs ~10 ms on this machine).
 * Else the KV is checked and read for the first token now. */
static void settle_one(struct pdx_sched *s, struct pdx_sched_req *r)
{
	pdx_status_t st = r->kv_status;

	if (st == PDX_OK) {
		pdx_kv_seq_received(r->seq, r->n_prompt);
		r->verify = r->first >= 0;
		if (r->verify || received_ok(s, r)) {
			r->phase = PHASE_FIRST;
			return;
		}
		st = PDX_EIO;
	}
	/* not into blocks a lost agent's peer may still write */
	if (r->sink.recompute && st != PDX_EAGENT) {
		log_info("transfer failed (%s): prefilling here",
			 pdx_status_str(st));
		pdx_kv_seq_unfill(r->seq); /* after a cached prefix */
		r->phase = PHASE_PREFILL;
	} else {
		end(s, r, st);
	}
}

/* Before a step: transfers that ended, and KV streamed from before it
 * was checked (a check that fails then ends the request: its first token
 * is out). */
static void settle(struct pdx_sched *s)
{
	struct pdx_sched_req *r, *next;

	for (r = TAILQ_FIRST(&s->running); r; r = next) {
		next = TAILQ_NEXT(r, link);
		if (r->phase == PHASE_KV_READY) {
			settle_one(s, r);
		} else if (r->verify && r->phase == PHASE_DECODE) {
			r->verify = false;
			if (!received_ok(s, r))
				end(s, r, PDX_EIO);
		}
	}
}

/* Plans r's part of the step (a decode token, or a prefill chunk within
 * *budget) and adds its run to the pass; false when it has none. */
static bool plan(struct pdx_sched_req *r, uint32_t *budget,
		 struct pdx_synth_work *w, struct pdx_synth_run *run)
{
	struct pdx_kv_seq *q = r->seq;
	uint32_t chunk;

	if (r->phase == PHASE_DECODE) {
		pdx_kv_seq_push(q, r->last_token);
		pdx_synth_work_decode(w, q->filled + 1);
		*run = pdx_kv_seq_run(q, q->filled + 1, true);
		return true;
	}
	if (r->phase != PHASE_PREFILL || *budget == 0)
		return false;
	chunk = r->n_prompt - q->filled;
	if (chunk > *budget)
		chunk = *budget;
	pdx_synth_work_prefill(w, q->filled, chunk);
	*budget -= chunk;
	*run = pdx_kv_seq_run(q, q->filled + chunk,
			      q->filled + chunk == r->n_prompt);
	return true;
}

/* The real work of one step, one forward pass as a GPU runs it: decode
 * tokens for every request in decode and prefill chunks within the
 * token budget, written layer by layer over the whole batch, then the
 * tokens they yield. Adds it to w. */
static bool step_work(struct pdx_sched *s, struct pdx_synth_work *w)
{
	uint32_t budget = s->p.max_prefill_tokens, n = 0, i = 0;
	struct pdx_sched_req *r, *next;
	bool any = false;
	pdx_status_t st;

	TAILQ_FOREACH(r, &s->running, link)
	{
		r->in_pass = false;
		if (r->phase == PHASE_FIRST) {
			r->output = (uint32_t)r->first;
			r->has_output = any = true;
		} else if (plan(r, &budget, w, &s->runs[n])) {
			r->in_pass = true;
			n++;
		}
	}
	st = pdx_kv_pool_pass(s->p.pool, s->runs, n, s->p.model->vocab,
			      &s->slot);
	if (st == PDX_OK && n && s->p.mirror)
		st = s->p.mirror->pass(s->p.mirror->arg, s->runs, n);
	if (st != PDX_OK)
		log_error("forward pass of %u sequence(s): %s", n,
			  pdx_status_str(st));
	for (r = TAILQ_FIRST(&s->running); r; r = next) {
		struct pdx_synth_run *run;

		next = TAILQ_NEXT(r, link);
		if (!r->in_pass)
			continue;
		run = &s->runs[i++];
		if (st != PDX_OK) {
			end(s, r, st);
			continue;
		}
		if (!run->want_token)
			continue;
		r->output = run->token;
		if (r->phase == PHASE_PREFILL) {
			r->posting = r->sink.layer_done != NULL;
			s->posting |= r->posting;
			if (r->posting && r->sink.first_token)
				r->sink.first_token(r->sink.arg, r->output);
		}
		r->has_output = any = true;
	}
	return any || w->tokens > 0;
}

/* Posts every layer due by now (all of them when all), for the requests
 * whose last prefill chunk is in this step: layer l is due when the
 * step's modeled time reaches (l + 1) / layers. Arms the layer timer for
 * the next. */
static void post_layers(struct pdx_sched *s, bool all)
{
	uint32_t layers = s->p.model->layers;
	uint64_t el = pdx_now_ns() - s->step_t0, due;
	struct pdx_sched_req *r;
	struct timeval tv;

	if (!s->posting)
		return; /* no finished prefill to announce: no timer */
	for (; s->next_layer < layers; s->next_layer++) {
		due = s->step_ns * (s->next_layer + 1) / layers;
		if (!all && due > el) {
			due -= el;
			tv.tv_sec = (time_t)(due / 1000000000ULL);
			tv.tv_usec = (suseconds_t)(due % 1000000000ULL / 1000);
			evtimer_add(s->layer_ev, &tv);
			return;
		}
		TAILQ_FOREACH(r, &s->running, link)
		{
			if (r->posting)
				r->sink.layer_done(r->sink.arg, s->next_layer,
						   s->slot);
		}
	}
	evtimer_del(s->layer_ev);
	TAILQ_FOREACH(r, &s->running, link)
	{
		r->posting = false;
	}
	s->posting = false;
}

static void on_layer(evutil_socket_t fd, short what, void *arg)
{
	post_layers(arg, false);
}

/* Delivers the outputs of the step that just ended; ends finished
 * requests. */
static void step_deliver(struct pdx_sched *s)
{
	struct pdx_sched_req *r, *next;
	bool last;

	post_layers(s, true);

	for (r = TAILQ_FIRST(&s->running); r; r = next) {
		next = TAILQ_NEXT(r, link);
		if (!r->has_output)
			continue;
		r->has_output = false;
		r->phase = PHASE_DECODE;
		r->last_token = r->output;
		last = ++r->n_out == r->max_new;
		r->sink.token(r->sink.arg, r->output, r->n_out - 1, last);
		if (!last)
			continue;
		end(s, r, PDX_OK);
	}
}

/* Starts a step if there is work: does its real work now and arms the
 * timer for what is left of its modeled time. */
static void step_start(struct pdx_sched *s)
{
	struct pdx_synth_work w = {0};
	uint64_t t0 = pdx_now_ns(), model_ns = 0, spent;
	struct timeval tv;

	admit(s);
	settle(s);
	if (!step_work(s, &w))
		return;
	if (s->p.time_scale > 0 && w.tokens > 0)
		model_ns = pdx_synth_step_ns(s->p.model, &s->p.gpu, &w);
	spent = pdx_now_ns() - t0;
	log_debug("step: %llu tokens, modeled %.3f ms, real work %.3f ms",
		  (unsigned long long)w.tokens, model_ns / 1e6, spent / 1e6);
	model_ns = model_ns > spent ? model_ns - spent : 0;
	tv.tv_sec = (time_t)(model_ns / 1000000000ULL);
	tv.tv_usec = (suseconds_t)(model_ns % 1000000000ULL / 1000);
	s->in_step = true;
	/* libevent times a timer from the loop's cached clock, read before
	 * this callback began: without a fresh one the step would end early
	 * by the real work just done */
	event_base_update_cache_time(s->p.base);
	evtimer_add(s->step, &tv);
	s->step_t0 = t0;
	s->step_ns = model_ns + spent;
	s->next_layer = 0;
	post_layers(s, false);
}

static const struct timeval now = {0, 0};

/* A step ends: its outputs are delivered, and the next step starts one
 * loop turn later, after the writes they queued (the step timer has the
 * lowest priority): else the next step's real work, milliseconds at long
 * contexts, would hold every token it follows, the first one too. */
static void on_step(evutil_socket_t fd, short what, void *arg)
{
	struct pdx_sched *s = arg;

	if (s->in_step) {
		if (s->p.mirror && !s->p.mirror->caught_up(s->p.mirror->arg))
			return; /* pdx_sched_resume() */
		s->in_step = false;
		step_deliver(s);
		evtimer_add(s->step, &now);
		return;
	}
	step_start(s);
}

/* Runs a step soon unless one is under way: from the loop, not from the
 * caller's stack, so submissions of one loop turn share a step. */
static void kick(struct pdx_sched *s)
{
	if (!s->in_step && !evtimer_pending(s->step, NULL))
		evtimer_add(s->step, &now);
}

/* Blocks came free (block_alloc.h), wherever they were held: a queued
 * request may fit now. Without this, blocks a held prefill's KV gave back
 * when its transfer ended (or its lease expired) would wait for the next
 * submission to be noticed. */
static void on_blocks_free(void *arg)
{
	struct pdx_sched *s = arg;

	if (s->n_waiting)
		kick(s);
}

pdx_status_t pdx_sched_new(const struct pdx_sched_params *p,
			   struct pdx_sched **out)
{
	struct pdx_sched *s = calloc(1, sizeof(*s));

	if (!s)
		return PDX_ENOMEM;
	s->p = *p;
	s->p.gpu.scale = p->time_scale;
	TAILQ_INIT(&s->waiting);
	TAILQ_INIT(&s->running);
	s->step = evtimer_new(p->base, on_step, s);
	s->layer_ev = evtimer_new(p->base, on_layer, s);
	s->queue_ev = evtimer_new(p->base, on_queue_timeout, s);
	s->runs = calloc(p->max_num_seqs, sizeof(*s->runs));
	if (!s->step || !s->layer_ev || !s->queue_ev || !s->runs) {
		if (s->step)
			event_free(s->step);
		if (s->layer_ev)
			event_free(s->layer_ev);
		if (s->queue_ev)
			event_free(s->queue_ev);
		free(s->runs);
		free(s);
		return PDX_ENOMEM;
	}
	pdx_block_alloc_on_free(pdx_kv_pool_blocks(p->pool), on_blocks_free,
				s);
	if (event_base_get_npriorities(p->base) > 1)
		event_priority_set(s->step,
				   event_base_get_npriorities(p->base) - 1);
	*out = s;
	return PDX_OK;
}

void pdx_sched_free(struct pdx_sched *s)
{
	struct pdx_sched_req *r;

	if (!s)
		return;
	pdx_block_alloc_on_free(pdx_kv_pool_blocks(s->p.pool), NULL, NULL);
	while ((r = TAILQ_FIRST(&s->waiting))) {
		TAILQ_REMOVE(&s->waiting, r, link);
		req_free(r);
	}
	while ((r = TAILQ_FIRST(&s->running))) {
		TAILQ_REMOVE(&s->running, r, link);
		req_free(r);
	}
	event_free(s->step);
	event_free(s->layer_ev);
	event_free(s->queue_ev);
	free(s->runs);
	free(s);
}

pdx_status_t pdx_sched_submit(struct pdx_sched *s, const uint32_t *prompt,
			      uint32_t n_prompt, uint32_t max_new,
			      uint64_t cache_salt,
			      const struct pdx_sched_sink *sink,
			      struct pdx_sched_req **out)
{
	struct pdx_block_stats bs;
	struct pdx_sched_req *r;

	pdx_block_alloc_stats(pdx_kv_pool_blocks(s->p.pool), &bs);
	if (pdx_kv_seq_blocks_for(s->p.pool, n_prompt, max_new) > bs.total)
		return PDX_ETOOBIG;
	/* the queue holds max_waiting beyond the free running slots */
	if (s->n_waiting >= s->p.max_waiting + s->p.max_num_seqs - s->n_running)
		return PDX_EAGAIN;
	r = calloc(1, sizeof(*r));
	if (!r)
		return PDX_ENOMEM;
	r->prompt = malloc(sizeof(*prompt) * n_prompt);
	if (!r->prompt) {
		free(r);
		return PDX_ENOMEM;
	}
	memcpy(r->prompt, prompt, sizeof(*prompt) * n_prompt);
	r->n_prompt = n_prompt;
	r->max_new = max_new;
	r->cache_salt = cache_salt;
	r->sink = *sink;
	r->phase = PHASE_QUEUED;
	r->queued_ns = pdx_now_ns();
	TAILQ_INSERT_TAIL(&s->waiting, r, link);
	s->n_waiting++;
	if (s->n_waiting == 1)
		queue_arm(s);
	kick(s);
	*out = r;
	return PDX_OK;
}

void pdx_sched_abort(struct pdx_sched *s, struct pdx_sched_req *r)
{
	/* a receive still under way: its blocks are the transfer's until
	 * its event (sink.hold) */
	if (r->phase == PHASE_WAIT_KV && r->sink.hold &&
	    r->sink.hold(r->sink.arg, r->seq))
		r->seq = NULL;
	if (r->phase == PHASE_QUEUED) {
		TAILQ_REMOVE(&s->waiting, r, link);
		s->n_waiting--;
		queue_arm(s);
	} else {
		TAILQ_REMOVE(&s->running, r, link);
		s->n_running--;
	}
	req_free(r);
}

void pdx_sched_kv_ready(struct pdx_sched *s, struct pdx_sched_req *r,
			pdx_status_t status, int64_t first)
{
	if (r->phase != PHASE_WAIT_KV)
		return;
	r->phase = PHASE_KV_READY;
	r->kv_status = status;
	r->first = first;
	kick(s);
}

void pdx_sched_kv_failed_queued(struct pdx_sched *s, struct pdx_sched_req *r,
				pdx_status_t status)
{
	if (r->phase != PHASE_QUEUED || !r->sink.remote_kv)
		return;
	/* no blocks yet: none a lost agent's peer may write (PDX_EAGENT
	 * too, as http_gen.c prefills one whose agent is away at its start) */
	if (r->sink.recompute) {
		log_info("transfer failed while queued (%s): prefilling here "
			 "once admitted", pdx_status_str(status));
		r->sink.remote_kv = false;
		return;
	}
	TAILQ_REMOVE(&s->waiting, r, link);
	s->n_waiting--;
	queue_arm(s);
	r->sink.done(r->sink.arg, status);
	req_free(r);
}

void pdx_sched_stats(const struct pdx_sched *s, struct pdx_sched_stats *out)
{
	out->running = s->n_running;
	out->waiting = s->n_waiting;
}

void pdx_sched_resume(struct pdx_sched *s)
{
	if (s->in_step && !evtimer_pending(s->step, NULL))
		evtimer_add(s->step, &now);
}
