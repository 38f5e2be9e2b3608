/* The model names an instance serves (see served_models.h). */
#include "proxy/served_models.h"

#include <jansson.h>
#include <string.h>

void pdx_served_models_read(struct pdx_served_models *m, const char *body,
			    size_t len)
{
	json_t *j = json_loadb(body, len, 0, NULL);
	json_t *data = json_object_get(j, "data");
	size_t k, n = json_array_size(data);

	pdx_served_models_free(m);
	m->known = true;
	m->n = 0;
	m->any = !json_is_array(data) || n > PDX_SERVED_MODELS_MAX;
	if (!m->any)
		m->entries = json_array();
	m->any = m->any || !m->entries;
	for (k = 0; !m->any && k < n; k++) {
		json_t *e = json_array_get(data, k);
		const char *id = json_string_value(json_object_get(e, "id"));

		if (!id || strlen(id) >= PDX_SERVED_MODEL_NAME_MAX ||
		    json_array_append(m->entries, e))
			m->any = true;
		else
			strcpy(m->name[m->n++], id);
	}
	if (!m->n)
		m->any = true; /* an empty list says nothing either */
	if (m->any)
		pdx_served_models_free(m);
	json_decref(j);
}

void pdx_served_models_set_any(struct pdx_served_models *m)
{
	pdx_served_models_free(m);
	*m = (struct pdx_served_models){.known = true, .any = true};
}

void pdx_served_models_free(struct pdx_served_models *m)
{
	json_decref(m->entries);
	m->entries = NULL;
}

static bool has_id(const json_t *list, const char *id)
{
	size_t k;
	json_t *e;

	json_array_foreach(list, k, e)
		if (!strcmp(json_string_value(json_object_get(e, "id")), id))
			return true;
	return false;
}

bool pdx_served_models_merge(const struct pdx_served_models *m, json_t *list)
{
	if (!m->known || m->any)
		return false;
	for (unsigned k = 0; k < m->n; k++)
		if (!has_id(list, m->name[k]))
			json_array_append(list, json_array_get(m->entries, k));
	return true;
}

/* Whether m's list (read now or before) has model by name. */
static bool listed(const struct pdx_served_models *m, const char *model)
{
	for (unsigned k = 0; k < m->n; k++)
		if (!strcmp(m->name[k], model))
			return true;
	return false;
}

bool pdx_served_models_take_known(const struct pdx_served_models *m,
				  const char *model)
{
	return model && m->known && !m->any && listed(m, model);
}

bool pdx_served_models_named(const struct pdx_served_models *m,
			     const char *model)
{
	return model && !m->any && listed(m, model);
}

bool pdx_served_models_take(const struct pdx_served_models *m,
			    const char *model)
{
	return !model || !m->known || m->any || listed(m, model);
}
