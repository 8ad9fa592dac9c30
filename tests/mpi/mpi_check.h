/*
 * mpi_check.h - the check macro of the MPI tests (test_sp, test_sp_faults),
 * which link only libsdpa_mpi and libsdpa, not the test library: each
 * counts its own checks in `passed` and `failed` and names its `rank`.
 */
#ifndef SDPA_TEST_MPI_CHECK_H
#define SDPA_TEST_MPI_CHECK_H

#include <stdio.h>

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            passed++;                                                                              \
        } else {                                                                                   \
            failed++;                                                                              \
            printf("FAIL rank %d %s:%d: ", rank, __FILE__, __LINE__);                              \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

#endif
