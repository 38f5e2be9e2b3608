#include "common/version.h"

#include <stdio.h>

#include "common/version_tag.h"

void pdx_version_print(const char *prog)
{
	printf("%s %s\n", prog, PDX_VERSION);
}

const char *pdx_version(void)
{
	return PDX_VERSION;
}
