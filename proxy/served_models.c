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

	m->known = true;
	m->n = 0;
	m->any = !json_is_array(data) || n > PDX_SERVED_MODELS_MAX;
	for (k = 0; !m->any && k < n; k++) {
		const char *id =
		    json_string_value(json_object_get(json_array_get(data, k),
						      "id"));

		if (!id || strlen(id) >= PDX_SERVED_MODEL_NAME_MAX)
			m->any = true;
		else
			strcpy(m->name[m->n++], id);
	}
	if (!m->n)
		m->any = true; /* an empty list says nothing either */
	json_decref(j);
}

bool pdx_served_models_take_known(const struct pdx_served_models *m,
				  const char *model)
{
	return model && m->known && !m->any &&
	       pdx_served_models_take(m, model);
}

bool pdx_served_models_take(const struct pdx_served_models *m,
			    const char *model)
{
	if (!model || !m->known || m->any)
		return true;
	for (unsigned k = 0; k < m->n; k++)
		if (!strcmp(m->name[k], model))
			return true;
	return false;
}
