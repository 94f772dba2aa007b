/* Open MPI (any MPI) through its C API: one collective, f32 sum, timed like `oxccl bench`.
 *
 *   mpicc -O2 -o ompi_bench ompi_bench.c
 *   mpirun -np N ./ompi_bench OP BYTES ITERS WARMUP
 *
 * OP: all_reduce, all_gather, reduce_scatter, broadcast, all_to_all. BYTES follows the
 * nccl-tests (and `oxccl bench`) convention: the per-rank buffer of all_reduce, broadcast and
 * all_to_all, all_gather's output, reduce_scatter's input; the element count is BYTES/4,
 * rounded down to a multiple of the world size where each rank owns one block.
 *
 * For each placement the op has (out of place, and in place with MPI_IN_PLACE; MPI_Bcast has
 * only its one, in-place, form) it checks one call against the expected values, runs WARMUP
 * untimed calls, meets at a barrier, times ITERS calls, and takes the loop mean per call; the
 * reported time is the maximum over ranks (what `oxccl bench` reports). Rank 0 prints one
 * JSON line per placement. Exit status 1 when a check failed.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, ALL_TO_ALL };
static const char *NAMES[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"};

static int rank, n;
static int op;
static long count, block; /* total elements; one rank's block where blocked */
static float *sbuf, *rbuf;

/* One call of the op; in place uses MPI_IN_PLACE (rbuf is the one buffer). */
static void run(int in_place) {
    switch (op) {
    case ALL_REDUCE:
        MPI_Allreduce(in_place ? MPI_IN_PLACE : sbuf, rbuf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case ALL_GATHER:
        if (in_place)
            MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, rbuf, (int)block, MPI_FLOAT, MPI_COMM_WORLD);
        else
            MPI_Allgather(sbuf, (int)block, MPI_FLOAT, rbuf, (int)block, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case REDUCE_SCATTER:
        /* In place the input is rbuf (count elements) and the result its first block. */
        MPI_Reduce_scatter_block(in_place ? MPI_IN_PLACE : sbuf, rbuf, (int)block, MPI_FLOAT, MPI_SUM,
                                 MPI_COMM_WORLD);
        break;
    case BROADCAST:
        MPI_Bcast(rbuf, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
    case ALL_TO_ALL:
        if (in_place)
            MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, rbuf, (int)block, MPI_FLOAT, MPI_COMM_WORLD);
        else
            MPI_Alltoall(sbuf, (int)block, MPI_FLOAT, rbuf, (int)block, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    }
}

/* Fills the inputs (small integers, exact in f32) and poisons the outputs. */
static void fill(int in_place) {
    float *in = in_place ? rbuf : sbuf;
    for (long i = 0; i < count; i++) rbuf[i] = -1.0f;
    switch (op) {
    case ALL_REDUCE:
        for (long i = 0; i < count; i++) in[i] = (float)(rank + 1);
        break;
    case ALL_GATHER: /* my block: rank+1 (in place it sits at my offset of the output) */
        for (long i = 0; i < block; i++) (in_place ? rbuf + rank * block : sbuf)[i] = (float)(rank + 1);
        break;
    case REDUCE_SCATTER: /* block j of rank r: (r+1)*(j+1) */
    case ALL_TO_ALL:     /* block j of rank r: r*n + j */
        for (long j = 0; j < n; j++)
            for (long i = 0; i < block; i++)
                in[j * block + i] = op == REDUCE_SCATTER ? (float)((rank + 1) * (j + 1)) : (float)(rank * n + j);
        break;
    case BROADCAST:
        for (long i = 0; i < count; i++) rbuf[i] = rank == 0 ? 7.0f : -1.0f;
        break;
    }
}

/* Whether this rank's result is right. */
static int check(void) {
    float tri = (float)n * (n + 1) / 2;
    switch (op) {
    case ALL_REDUCE:
        for (long i = 0; i < count; i++) if (rbuf[i] != tri) return 0;
        return 1;
    case ALL_GATHER:
        for (long j = 0; j < n; j++)
            for (long i = 0; i < block; i++) if (rbuf[j * block + i] != (float)(j + 1)) return 0;
        return 1;
    case REDUCE_SCATTER:
        for (long i = 0; i < block; i++) if (rbuf[i] != tri * (rank + 1)) return 0;
        return 1;
    case BROADCAST:
        for (long i = 0; i < count; i++) if (rbuf[i] != 7.0f) return 0;
        return 1;
    case ALL_TO_ALL: /* block s comes from rank s: s*n + rank */
        for (long s = 0; s < n; s++)
            for (long i = 0; i < block; i++) if (rbuf[s * block + i] != (float)(s * n + rank)) return 0;
        return 1;
    }
    return 0;
}

/* This process's CPU affinity as a list ("0-1", "1"). */
static void affinity(char *out, size_t len) {
    cpu_set_t set;
    out[0] = 0;
    if (sched_getaffinity(0, sizeof set, &set) != 0) { snprintf(out, len, "?"); return; }
    size_t k = 0;
    for (int c = 0; c < CPU_SETSIZE && k + 16 < len; c++) {
        if (!CPU_ISSET(c, &set)) continue;
        int e = c;
        while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, &set)) e++;
        k += (size_t)snprintf(out + k, len - k, k ? ",%d" : "%d", c);
        if (e > c) k += (size_t)snprintf(out + k, len - k, "-%d", e);
        c = e;
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc != 5) {
        if (rank == 0) fprintf(stderr, "usage: %s OP BYTES ITERS WARMUP\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    op = -1;
    for (int i = 0; i < 5; i++) if (strcmp(argv[1], NAMES[i]) == 0) op = i;
    if (op < 0) {
        if (rank == 0) fprintf(stderr, "unknown op %s\n", argv[1]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long bytes = atol(argv[2]);
    int iters = atoi(argv[3]), warmup = atoi(argv[4]);
    if (iters < 1) iters = 1;
    count = bytes / 4;
    int blocked = op == ALL_GATHER || op == REDUCE_SCATTER || op == ALL_TO_ALL;
    if (blocked) count -= count % n;
    block = count / n;
    /* Out of place all_gather reads one block and reduce_scatter writes one; the buffers are
       allocated at full size anyway (the in-place pass needs it). */
    sbuf = malloc((size_t)(count > 0 ? count : 1) * sizeof(float));
    rbuf = malloc((size_t)(count > 0 ? count : 1) * sizeof(float));
    char aff[256], allaff[64][256];
    affinity(aff, sizeof aff);
    MPI_Gather(aff, 256, MPI_CHAR, n <= 64 ? allaff : NULL, 256, MPI_CHAR, 0, MPI_COMM_WORLD);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int vlen;
    MPI_Get_library_version(version, &vlen);
    for (int i = 0; i < vlen; i++) if (version[i] == '\n' || version[i] == '"' || version[i] == '\\') version[i] = ' ';
    while (vlen > 0 && version[vlen - 1] == ' ') version[--vlen] = 0;

    int failed = 0;
    int places = op == BROADCAST ? 1 : 2;
    for (int p = 0; p < places; p++) {
        int in_place = op == BROADCAST ? 1 : p;
        fill(in_place);
        run(in_place);
        int ok = check(), all_ok;
        MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
        failed |= !all_ok;
        for (int i = 0; i < warmup; i++) run(in_place);
        MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime();
        for (int i = 0; i < iters; i++) run(in_place);
        t = (MPI_Wtime() - t) / iters * 1e6;
        double tmax;
        MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            printf("{\"op\": \"%s\", \"bytes\": %ld, \"count\": %ld, \"world\": %d, \"in_place\": %s, "
                   "\"time_us\": %.3f, \"iters\": %d, \"warmup\": %d, \"ok\": %s, \"version\": \"%s\", \"affinity\": [",
                   NAMES[op], count * 4, count, n, in_place ? "true" : "false", tmax, iters, warmup,
                   all_ok ? "true" : "false", version);
            for (int r = 0; r < n && r < 64; r++) printf("%s\"%s\"", r ? ", " : "", allaff[r]);
            printf("]}\n");
            fflush(stdout);
        }
    }
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return failed;
}
