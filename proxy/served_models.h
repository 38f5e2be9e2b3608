/* The model names an instance serves, read from its GET /v1/models
 * (health.c asks once it passes a health check), so that a request
 * naming a model goes to an instance that serves it whenever one can
 * take it (pdx_pool_pick). Without this, an instance of another model,
 * put in a pool by mistake, answered every request 404 at once; a 404
 * is the client's fault to a breaker, and least-loaded then sent it
 * most of them, since its load was always the least.
 *
 * Pure data: no I/O.
 */
#ifndef PDX_PROXY_SERVED_MODELS_H
#define PDX_PROXY_SERVED_MODELS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define PDX_SERVED_MODELS_MAX 8	    /* names kept per instance */
#define PDX_SERVED_MODEL_NAME_MAX 128 /* bytes of a name, with its NUL */

struct pdx_served_models {
	bool known; /* its list was read (else: not asked yet, or again) */
	/* the list could not be kept (not one, more names than
	 * PDX_SERVED_MODELS_MAX, a name too long): it takes any */
	bool any;
	unsigned n;
	char name[PDX_SERVED_MODELS_MAX][PDX_SERVED_MODEL_NAME_MAX];
	/* the list's entries as the instance gave them (id, max_model_len
	 * ...), name[k] the id of the k-th; NULL when any */
	json_t *entries;
	int refused; /* the last other answer's status, said once (health.c) */
};

/* Reads an OpenAI model list, {"data": [{"id": NAME}, ...]}, of len
 * bytes into m (known afterwards, any when it cannot be kept). */
void pdx_served_models_read(struct pdx_served_models *m, const char *body,
			    size_t len);

/* It serves any model it is asked for (its engine has no
 * GET /v1/models): known, any. */
void pdx_served_models_set_any(struct pdx_served_models *m);

/* Frees what m holds (an instance freed). */
void pdx_served_models_free(struct pdx_served_models *m);

/* Adds to the JSON array list the entries of m whose ids list lacks
 * (GET /v1/models through the proxy: each decode instance's, once). False
 * when m does not name what it serves (unknown, or any). */
bool pdx_served_models_merge(const struct pdx_served_models *m, json_t *list);

/* May a request naming model (NULL: none) go to an instance serving m?
 * Yes unless m is known, not any, and lacks it. */
bool pdx_served_models_take(const struct pdx_served_models *m,
			    const char *model);

/* Is model (NULL: none) one m is known to serve by name? */
bool pdx_served_models_take_known(const struct pdx_served_models *m,
				  const char *model);

/* Did the last list read into m name model (NULL: none), known now or
 * forgotten since (a failed health check forgets it: the instance may
 * come back serving another)? While its instance is down, a request for
 * that model is the instance's to wait for, not another model's. */
bool pdx_served_models_named(const struct pdx_served_models *m,
			     const char *model);

#endif
