/* Checkpoints: the training state of a rank's arena (parameters, optimizer
 * state, BN statistics, EMA) plus the counters that make a resume exact,
 * written atomically and guarded by a CRC and a hash of the plan.
 *
 * What is saved: the region spans that hold state, B..E_CONV_DEEP (running
 * BN statistics, FP32 master weights, EMA copies) and M_BN_BIAS..N (optimizer
 * moments, LARS norms), byte for byte at their plan offsets. Everything else
 * (FP16 copies, gradients, features, inputs) is recomputed.
 *
 * Writing: to "<path>.tmp.<pid>", fsync, rename over <path>, fsync the
 * directory; a failure leaves an existing <path> untouched.
 * Reading: the whole file is validated (magic, format version, size, CRC32,
 * plan hash) before one byte of the arena changes; a corrupt, truncated or
 * mismatched file is refused with a message naming the file and the fault. */
#ifndef BLUEPRINT_CHECKPOINT_H
#define BLUEPRINT_CHECKPOINT_H

#include <stdint.h>

#include "blueprint/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Counters of a run. The data pipeline's randomness is a pure function of
 * (seed, epoch, step) (data.h), so these are its whole RNG state. */
typedef struct bp_train_state {
  uint64_t seed;        /* run seed */
  uint64_t epoch;       /* current epoch (0-based) */
  uint64_t step;        /* steps already taken in the current epoch */
  uint64_t global_step; /* steps taken since the start of the run */
  double loss_scale;    /* AMP dynamic loss scale (1 without AMP) */
  uint64_t good_steps;  /* AMP: steps since the loss scale last changed */
} bp_train_state;

/* A 64-bit hash of everything a checkpoint depends on: the options and, for
 * every tensor of variant 0, its name, region, dtype, shape, offset and slot. */
uint64_t bp_plan_hash(const bp_plan *plan);

/* Writes the state spans of `arena` (a host copy of one rank's arena,
 * bp_plan_total_bytes long; borrowed) and `state` to `path`. */
bp_status bp_checkpoint_save(const char *path, const bp_plan *plan, const void *arena,
                             const bp_train_state *state);

/* Validates `path` against `plan`, then copies its spans into `arena` (host,
 * bp_plan_total_bytes long) and its counters into *state_out. On any error
 * neither the arena nor *state_out is touched. */
bp_status bp_checkpoint_load(const char *path, const bp_plan *plan, void *arena,
                             bp_train_state *state_out);

#ifdef __cplusplus
}
#endif
#endif
