/* npy: a streaming writer of 2-D float32 .npy arrays ([rows][cols]), for
 * verification tools (`shoal run --logits-out`). The header is rewritten
 * with the final row count on close.
 * Thread: one writer per thread.
 */
#ifndef SHOAL_NPY_H
#define SHOAL_NPY_H

#include <stdint.h>
#include <stdio.h>

#include "err.h"

struct shoal_npy_writer {
    FILE *f;
    int64_t cols;
    int64_t rows;
    char *path;
};

/* Open path for writing (truncates). Returns 0 or -errno with err set. */
int shoal_npy_open(struct shoal_npy_writer *w, const char *path, int64_t cols,
                   struct shoal_err *err);
/* Append one row of cols floats. */
int shoal_npy_append(struct shoal_npy_writer *w, const float *row,
                     struct shoal_err *err);
/* Rewrite the header with the row count and close. */
int shoal_npy_close(struct shoal_npy_writer *w, struct shoal_err *err);

#endif
