#include "common/version.h"

#include <stdio.h>

#include "common/version_tag.h"

const char *pdx_version(void)
{
	return PDX_VERSION;
}

void pdx_version_print(const char *prog)
{
	printf("%s %s\n", prog, PDX_VERSION);
}
