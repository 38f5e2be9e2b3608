#include "common/utf8.h"

#include <stdint.h>

/* Length of the valid UTF-8 sequence at s (RFC 3629: no overlong forms,
 * no surrogates, nothing past U+10FFFF), or 0. */
static size_t seq_len(const uint8_t *s)
{
	uint8_t b = s[0], lo = 0x80, hi = 0xbf;
	size_t n;

	if (b < 0x80)
		return 1;
	if (b >= 0xc2 && b <= 0xdf)
		n = 2;
	else if (b >= 0xe0 && b <= 0xef)
		n = 3;
	else if (b >= 0xf0 && b <= 0xf4)
		n = 4;
	else
		return 0;
	if (b == 0xe0)
		lo = 0xa0;
	else if (b == 0xed)
		hi = 0x9f;
	else if (b == 0xf0)
		lo = 0x90;
	else if (b == 0xf4)
		hi = 0x8f;
	if (s[1] < lo || s[1] > hi)
		return 0; /* also stops at the NUL */
	for (size_t i = 2; i < n; i++)
		if (s[i] < 0x80 || s[i] > 0xbf)
			return 0;
	return n;
}

char *pdx_utf8_clean(const char *s, char *out, size_t outlen)
{
	const uint8_t *p = (const uint8_t *)s;
	size_t o = 0;

	while (*p) {
		size_t n = seq_len(p);

		if (o + (n ? n : 1) >= outlen)
			break;
		if (!n) {
			out[o++] = '?';
			p++;
			continue;
		}
		for (size_t i = 0; i < n; i++)
			out[o++] = (char)p[i];
		p += n;
	}
	out[o] = '\0';
	return out;
}
