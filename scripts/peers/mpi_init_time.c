/* One rank of the init-time comparison (scripts/peers/scale_init.sh): times MPI_Init and a barrier
 * (the point where every rank can talk, as oxccl::init returns), and prints the same line as
 * crates/oxccl/examples/scale_rank.rs: scale rank=R world=N init_start_ns=.. init_end_ns=..
 * ok=1. Build: mpicc -O2 -o mpi_init_time mpi_init_time.c */
#include <mpi.h>
#include <stdio.h>
#include <time.h>

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    long long start = now_ns();
    MPI_Init(&argc, &argv);
    MPI_Barrier(MPI_COMM_WORLD);
    long long end = now_ns();
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    printf("scale rank=%d world=%d init_start_ns=%lld init_end_ns=%lld ok=1\n", rank, size, start, end);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
