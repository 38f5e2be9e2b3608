/* A main() for the fuzz targets where libFuzzer is not available (gcc):
 * runs LLVMFuzzerTestOneInput() once on each file named, or on each file
 * of each directory named, e.g. a target's corpus. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	long n;

	if (!f || fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 ||
	    fseek(f, 0, SEEK_SET))
		goto fail;
	buf = malloc(n ? (size_t)n : 1);
	if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n)
		goto fail;
	fclose(f);
	LLVMFuzzerTestOneInput(buf, (size_t)n);
	free(buf);
	return 0;
fail:
	fprintf(stderr, "cannot read %s\n", path);
	free(buf);
	if (f)
		fclose(f);
	return 1;
}

int main(int argc, char **argv)
{
	int bad = 0, runs = 0;

	for (int i = 1; i < argc; i++) {
		struct dirent *e;
		struct stat st;
		DIR *d;

		if (argv[i][0] == '-')
			continue; /* a libFuzzer flag */
		if (stat(argv[i], &st) || !S_ISDIR(st.st_mode)) {
			bad += run_file(argv[i]);
			runs++;
			continue;
		}
		d = opendir(argv[i]);
		while (d && (e = readdir(d))) {
			char path[4096];

			if (e->d_name[0] == '.')
				continue;
			snprintf(path, sizeof(path), "%s/%s", argv[i],
				 e->d_name);
			bad += run_file(path);
			runs++;
		}
		if (d)
			closedir(d);
	}
	printf("%d inputs run\n", runs);
	return bad ? 1 : 0;
}
