/* A rank of the `megamoe launch --hosts H --mpirun` test (hosts_frameworks_cases.py): reports
 * Open MPI's view (rank, size, local rank, processor name), sums the ranks with MPI_Allreduce
 * and swaps 1 MiB with the rank half a world away (on another simulated host), and says whether
 * the launcher's endpoint and token reached it. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size, len;
    char name[MPI_MAX_PROCESSOR_NAME];
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(name, &len);
    long mine = rank + 1, sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    enum { BYTES = 1 << 20 };
    unsigned char *out = malloc(BYTES), *in = malloc(BYTES);
    int peer = (rank + size / 2) % size, ok = out && in;
    for (int i = 0; ok && i < BYTES; i++) out[i] = (unsigned char)(rank * 131 + i * 7);
    if (ok)
        MPI_Sendrecv(out, BYTES, MPI_BYTE, peer, 0, in, BYTES, MPI_BYTE, peer, 0, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
    for (int i = 0; ok && i < BYTES; i++) ok = in[i] == (unsigned char)(peer * 131 + i * 7);
    const char *ep = getenv("HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT");
    const char *tok = getenv("MEGAMOE_JOB_TOKEN");
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    printf("mpiprobe rank=%d size=%d local=%s host=%s sum=%ld peer=%d exchange=%s endpoint=%s "
           "token_len=%zu\n",
           rank, size, lr ? lr : "-", name, sum, peer, ok ? "ok" : "BAD", ep ? ep : "-",
           tok ? strlen(tok) : 0);
    free(out);
    free(in);
    MPI_Finalize();
    return ok ? 0 : 1;
}
