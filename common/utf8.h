/* UTF-8 for texts that go into JSON: jansson refuses a string that is not
 * valid UTF-8, so an error message quoting a client's bytes (a JSON parse
 * error's "near '...'", a name cut at 100 bytes) would make its error body
 * fail to build. Pure; any thread. */
#ifndef PDX_COMMON_UTF8_H
#define PDX_COMMON_UTF8_H

#include <stddef.h>

/* Copies s into out (outlen > 0 bytes, NUL-terminated, cut short on a
 * character boundary), with '?' for each byte that does not start a
 * valid UTF-8 sequence. Returns out. */
char *pdx_utf8_clean(const char *s, char *out, size_t outlen);

#endif
