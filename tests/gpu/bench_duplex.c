/* The ceiling of the staged path when both of its ends share one GPU
 * (docs/gpu.md): one process copying device to pinned host while another
 * copies pinned host to device, as the sending and receiving agents do,
 * against each copy alone.
 *   bench_duplex [MiB] [chunk MiB]      (defaults 1024, 16)
 * Each side copies MiB in chunks, REPS times; the two start together (a
 * pipe is their barrier). Prints GB/s of D2H alone, H2D alone, and of each
 * while the other runs. Exits 77 without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#define REPS 5

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One side: GB/s of its copies; -1 on a CUDA error. Waits for a byte on
 * go (if >= 0) after setting up. */
static double side(int d2h, size_t len, size_t chunk, int go)
{
	void *dev, *host;
	cudaStream_t s;
	double t0, t;
	char c;

	if (cudaMalloc(&dev, len) || cudaMallocHost(&host, len) ||
	    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) ||
	    cudaMemset(dev, 1, len) || cudaDeviceSynchronize())
		return -1;
	if (go >= 0 && read(go, &c, 1) != 1)
		return -1;
	t0 = now_s();
	for (int r = 0; r < REPS; r++)
		for (size_t o = 0; o < len; o += chunk) {
			size_t n = len - o < chunk ? len - o : chunk;

			if (cudaMemcpyAsync(d2h ? (char *)host + o : (char *)dev + o,
					    d2h ? (char *)dev + o : (char *)host + o,
					    n,
					    d2h ? cudaMemcpyDeviceToHost :
						  cudaMemcpyHostToDevice,
					    s))
				return -1;
		}
	if (cudaStreamSynchronize(s))
		return -1;
	t = now_s() - t0;
	cudaFree(dev);
	cudaFreeHost(host);
	return (double)len * REPS / t / 1e9;
}

/* Both sides in child processes (CUDA does not survive fork: the parent
 * never touches it), started together; their GB/s in out[0] (D2H) and
 * out[1] (H2D). */
static int together(size_t len, size_t chunk, double out[2])
{
	int go[2], res[2][2];
	pid_t pid[2];

	if (pipe(go))
		return -1;
	for (int d = 0; d < 2; d++) {
		if (pipe(res[d]))
			return -1;
		pid[d] = fork();
		if (pid[d] == 0) {
			double v = side(d == 0, len, chunk, go[0]);

			if (write(res[d][1], &v, sizeof(v)) != sizeof(v))
				_exit(1);
			_exit(v < 0);
		}
	}
	sleep(2); /* both set up */
	if (write(go[1], "gg", 2) != 2)
		return -1;
	for (int d = 0; d < 2; d++) {
		if (read(res[d][0], &out[d], sizeof(out[d])) != sizeof(out[d]))
			return -1;
		waitpid(pid[d], NULL, 0);
	}
	return out[0] < 0 || out[1] < 0 ? -1 : 0;
}

static double alone(int d2h, size_t len, size_t chunk)
{
	int res[2];
	double v = -1;
	pid_t pid;

	if (pipe(res))
		return -1;
	pid = fork();
	if (pid == 0) {
		v = side(d2h, len, chunk, -1);
		if (write(res[1], &v, sizeof(v)) != sizeof(v))
			_exit(1);
		_exit(0);
	}
	if (read(res[0], &v, sizeof(v)) != sizeof(v))
		v = -1;
	waitpid(pid, NULL, 0);
	return v;
}

int main(int argc, char **argv)
{
	size_t len = (size_t)(argc > 1 ? atoi(argv[1]) : 1024) << 20;
	size_t chunk = (size_t)(argc > 2 ? atoi(argv[2]) : 16) << 20;
	double d2h, h2d, both[2];
	int status;
	pid_t pid = fork();

	/* is there a GPU? asked in a child, for the same reason */
	if (pid == 0) {
		int count = 0;

		_exit(cudaGetDeviceCount(&count) == cudaSuccess && count ? 0 : 77);
	}
	waitpid(pid, &status, 0);
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		printf("no CUDA device: skipped\n");
		return 77;
	}
	if (!len || !chunk)
		return 2;
	d2h = alone(1, len, chunk);
	h2d = alone(0, len, chunk);
	if (d2h < 0 || h2d < 0 || together(len, chunk, both)) {
		fprintf(stderr, "bench_duplex: a CUDA call failed\n");
		return 1;
	}
	printf("%zu MiB in %zu MiB chunks, %d times\n", len >> 20, chunk >> 20,
	       REPS);
	printf("d2h alone           %7.1f GB/s\n", d2h);
	printf("h2d alone           %7.1f GB/s\n", h2d);
	printf("d2h beside h2d      %7.1f GB/s\n", both[0]);
	printf("h2d beside d2h      %7.1f GB/s\n", both[1]);
	printf("{\"d2h_gbps\": %.2f, \"h2d_gbps\": %.2f, \"d2h_duplex_gbps\": %.2f, "
	       "\"h2d_duplex_gbps\": %.2f}\n",
	       d2h, h2d, both[0], both[1]);
	return 0;
}
