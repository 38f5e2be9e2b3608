/* The build's version: `git describe --always --dirty` when it was built
 * from a git checkout, else the meson project version (common/meson.build
 * generates version_tag.h; only version.c includes it, so a new commit
 * recompiles one file). */
#ifndef PDX_COMMON_VERSION_H
#define PDX_COMMON_VERSION_H

/* What every program's --version prints on stdout: "PROG VERSION\n". */
void pdx_version_print(const char *prog);

/* VERSION alone (each /metrics' build_info says it). */
const char *pdx_version(void);

#endif
