// The raw reference for oxccl's overhead: ncclAllReduce called directly, in the same loop
// `oxccl bench` runs (float sum, in place, every call waited for), on one GPU per rank.
//
// Ranks are separate processes started by scripts/gpu/gpu_check.sh with RANK and WORLD_SIZE set
// (and NCCL_HOSTID per rank, so several ranks can share the one GPU). Rank 0 writes the NCCL
// unique id to the file named by NCCL_ID_FILE; the others wait for it.
//
// Build: nvcc -O2 -o nccl_allreduce nccl_allreduce.cu -lnccl
// Output: one line per size, like nccl-tests:
//   size(B) count  time_sync(us)  time_queued(us)  algbw(GB/s)  busbw(GB/s)
// time_sync: loop mean with cudaStreamSynchronize after each call (what a blocking oxccl call
// does); time_queued: calls queued back to back, synchronized once.

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK_CUDA(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); exit(1); } } while (0)
#define CHECK_NCCL(x) do { ncclResult_t r = (x); if (r != ncclSuccess) { \
  fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, ncclGetErrorString(r)); exit(1); } } while (0)

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  return v ? atoi(v) : fallback;
}

int main(void) {
  int rank = env_int("RANK", 0), n = env_int("WORLD_SIZE", 1);
  int iters = env_int("ITERS", 50), warmup = env_int("WARMUP", 5);
  size_t max_bytes = (size_t)env_int("MAX_MB", 64) << 20;
  const char* id_file = getenv("NCCL_ID_FILE");
  ncclUniqueId id;
  if (n > 1 && !id_file) { fprintf(stderr, "set NCCL_ID_FILE for more than one rank\n"); return 64; }
  if (rank == 0) {
    CHECK_NCCL(ncclGetUniqueId(&id));
    if (n > 1) {
      char tmp[4096];
      snprintf(tmp, sizeof tmp, "%s.tmp", id_file);
      FILE* f = fopen(tmp, "wb");
      if (!f || fwrite(&id, sizeof id, 1, f) != 1) { perror("writing the id"); return 1; }
      fclose(f);
      rename(tmp, id_file);
    }
  } else {
    FILE* f = NULL;
    for (int i = 0; i < 600 && !(f = fopen(id_file, "rb")); i++) usleep(100000);
    if (!f || fread(&id, sizeof id, 1, f) != 1) { fprintf(stderr, "no id in %s\n", id_file); return 1; }
    fclose(f);
  }
  CHECK_CUDA(cudaSetDevice(0));
  ncclComm_t comm;
  CHECK_NCCL(ncclCommInitRank(&comm, n, id, rank));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float* buf;
  CHECK_CUDA(cudaMalloc((void**)&buf, max_bytes));
  CHECK_CUDA(cudaMemset(buf, 0, max_bytes));
  if (rank == 0) printf("%12s %12s %14s %16s %12s %12s\n", "size(B)", "count", "time_sync(us)", "time_queued(us)", "algbw(GB/s)", "busbw(GB/s)");
  for (size_t bytes = 8; bytes <= max_bytes; bytes *= 8) {
    size_t count = bytes / sizeof(float);
    for (int i = 0; i < warmup; i++) {
      CHECK_NCCL(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, s));
      CHECK_CUDA(cudaStreamSynchronize(s));
    }
    double t0 = now_us();
    for (int i = 0; i < iters; i++) {
      CHECK_NCCL(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, s));
      CHECK_CUDA(cudaStreamSynchronize(s));
    }
    double sync_us = (now_us() - t0) / iters;
    t0 = now_us();
    for (int i = 0; i < iters; i++) CHECK_NCCL(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    double queued_us = (now_us() - t0) / iters;
    double algbw = bytes / sync_us / 1e3;
    double busbw = algbw * (n > 1 ? 2.0 * (n - 1) / n : 1.0);
    if (rank == 0) printf("%12zu %12zu %14.2f %16.2f %12.3f %12.3f\n", bytes, count, sync_us, queued_us, algbw, busbw);
  }
  CHECK_NCCL(ncclCommDestroy(comm));
  CHECK_CUDA(cudaFree(buf));
  return 0;
}
