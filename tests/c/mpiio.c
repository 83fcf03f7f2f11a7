/* MPI-IO through ROMIO's POSIX ("ufs") driver, for tests/preload.rs: every rank writes its
 * block of a shared file with a collective write, then every rank writes a strided,
 * interleaved pattern through a file view (ROMIO's data sieving and two-phase I/O), and
 * each rank reads both back and checks every byte. Prints "mpiio ok <ranks> <bytes>" on
 * rank 0 when all is right; exits non-zero otherwise. Usage: mpiio DIRECTORY */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK (1 << 20)
#define RECORD 1000
#define RECORDS 64

static void check(int code, const char *what) {
    if (code != MPI_SUCCESS) {
        char message[MPI_MAX_ERROR_STRING];
        int length = 0;
        MPI_Error_string(code, message, &length);
        fprintf(stderr, "%s: %s\n", what, message);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

static unsigned char byte_at(int rank, long offset) { return (unsigned char)((offset * 7 + rank * 31) % 251); }

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, ranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (argc < 2) {
        fprintf(stderr, "usage: mpiio DIRECTORY\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    char blocks[4096], strided[4096];
    snprintf(blocks, sizeof blocks, "%s/blocks", argv[1]);
    snprintf(strided, sizeof strided, "%s/strided", argv[1]);
    MPI_File file;
    MPI_Status status;
    unsigned char *mine = malloc(BLOCK), *back = malloc(BLOCK);
    for (long i = 0; i < BLOCK; i++) mine[i] = byte_at(rank, i);

    /* 1. Blocks: rank r owns [r * BLOCK, (r + 1) * BLOCK). */
    check(MPI_File_open(MPI_COMM_WORLD, blocks, MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &file), "open blocks");
    check(MPI_File_write_at_all(file, (MPI_Offset)rank * BLOCK, mine, BLOCK, MPI_BYTE, &status), "write_at_all");
    check(MPI_File_sync(file), "sync");
    MPI_Barrier(MPI_COMM_WORLD);
    int neighbour = (rank + 1) % ranks;
    check(MPI_File_read_at_all(file, (MPI_Offset)neighbour * BLOCK, back, BLOCK, MPI_BYTE, &status), "read_at_all");
    for (long i = 0; i < BLOCK; i++)
        if (back[i] != byte_at(neighbour, i)) {
            fprintf(stderr, "rank %d: blocks byte %ld of rank %d is %d, expected %d\n", rank, i, neighbour, back[i], byte_at(neighbour, i));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    MPI_Offset size = 0;
    check(MPI_File_get_size(file, &size), "get_size");
    if (size != (MPI_Offset)ranks * BLOCK) {
        fprintf(stderr, "blocks is %lld bytes, expected %lld\n", (long long)size, (long long)ranks * BLOCK);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    check(MPI_File_close(&file), "close blocks");

    /* 2. Interleaved records: record k of rank r at ((k * ranks) + r) * RECORD, written
     * through a strided file view (non-contiguous in the file). */
    MPI_Datatype record, spread;
    MPI_Type_contiguous(RECORD, MPI_BYTE, &record);
    MPI_Type_create_resized(record, 0, (MPI_Aint)RECORD * ranks, &spread);
    MPI_Type_commit(&spread);
    check(MPI_File_open(MPI_COMM_WORLD, strided, MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &file), "open strided");
    check(MPI_File_set_view(file, (MPI_Offset)rank * RECORD, MPI_BYTE, spread, "native", MPI_INFO_NULL), "set_view");
    check(MPI_File_write_all(file, mine, RECORD * RECORDS, MPI_BYTE, &status), "write_all strided");
    check(MPI_File_sync(file), "sync strided");
    MPI_Barrier(MPI_COMM_WORLD);
    memset(back, 0, BLOCK);
    check(MPI_File_set_view(file, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL), "plain view");
    long total = (long)RECORD * RECORDS * ranks;
    check(MPI_File_read_at(file, 0, back, (int)total, MPI_BYTE, &status), "read strided");
    for (long offset = 0; offset < total; offset++) {
        long slot = offset / RECORD, within = offset % RECORD;
        int owner = (int)(slot % ranks);
        long source = (slot / ranks) * RECORD + within;
        if (back[offset] != byte_at(owner, source)) {
            fprintf(stderr, "rank %d: strided byte %ld is %d, expected %d (rank %d's)\n", rank, offset, back[offset], byte_at(owner, source), owner);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    check(MPI_File_close(&file), "close strided");
    MPI_Type_free(&spread);
    MPI_Type_free(&record);
    if (rank == 0) printf("mpiio ok %d %ld\n", ranks, (long)ranks * BLOCK + total);
    free(mine);
    free(back);
    MPI_Finalize();
    return 0;
}
