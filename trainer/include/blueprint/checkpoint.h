/* Checkpoints: the training state of a rank's arena (parameters, optimizer
 * state, BN statistics, EMA) plus the counters that make a resume exact,
 * written atomically and guarded by a CRC and a hash of the plan.
 *
 * What is saved: the region spans that hold state, B..E_CONV_DEEP (running
 * BN statistics, FP32 master weights, EMA copies) and M_BN_BIAS..N (optimizer
 * moments, LARS norms), byte for byte. Everything else (FP16 copies,
 * gradients, features, inputs) is recomputed. A file loads into any plan
 * whose state spans are laid out alike (bp_plan_hash), however its features
 * are packed: a plan with batchnorm + relu fused reads an unfused plan's
 * checkpoints and the other way round.
 *
 * Writing: to "<path>.tmp.<pid>", fsync, rename over <path>, fsync the
 * directory; a failure leaves an existing <path> untouched.
 * Reading: the whole file is validated (magic, format version, size, CRC32,
 * plan hash) before one byte of the arena changes; a corrupt, truncated or
 * mismatched file is refused with a message naming the file and the fault.
 *
 * The file format (version 3) is documented in trainer/src/checkpoint.c and
 * docs/checkpoint-format.md. Refusals and their status:
 *   BP_ERR_IO          the file cannot be opened or read, or written
 *   BP_ERR_PARSE       not a checkpoint (wrong magic), truncated, corrupt
 *                      (a CRC, the end marker or the header does not hold)
 *   BP_ERR_UNSUPPORTED a format version newer than this build reads, or older
 *                      (1 and 2: an older plan hash)
 *   BP_ERR_SHAPE       written for another plan (hash or state spans differ)
 *   BP_ERR_INVALID     a NULL argument;  BP_ERR_STATE  plan not finalized
 *   BP_ERR_NOMEM       the staging buffer could not be allocated */
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
  uint64_t good_steps;  /* AMP: clean steps since the loss scale last changed */
  uint64_t optimizer_steps; /* AMP: updates applied (steps not skipped); 0 without AMP */
  uint64_t skipped_steps;   /* AMP: steps skipped on overflow; 0 without AMP */
} bp_train_state;

/* The format version this build writes (and the newest it reads). */
#define BP_CHECKPOINT_FORMAT_VERSION 3
/* Bytes of the identification text field, NUL included. */
#define BP_CHECKPOINT_TEXT_MAX 256

/* A 64-bit hash of everything a checkpoint stores and depends on: the
 * options, the training batch (variant 0's: the step counters count its
 * steps), the sizes of the state spans and, for every tensor in them, its
 * name, region, dtype, shape, padded_c, offset within its span and slot.
 * Feature and gradient slots are left out, so plans that pack them
 * differently hash alike. FNV-1a over a canonical little-endian
 * serialization (trainer/src/plan_hash.c, docs/checkpoint-format.md): equal on
 * every run, build and machine for equal state layouts. 0 for NULL. */
uint64_t bp_plan_hash(const bp_plan *plan);

/* Writes the state spans of `arena` (a host copy of one rank's arena,
 * bp_plan_total_bytes long; borrowed) and `state` to `path`. On failure the
 * temporary file is removed, an existing `path` is left as it was, and the
 * message names `path` and the system's reason. */
bp_status bp_checkpoint_save(const char *path, const bp_plan *plan, const void *arena,
                             const bp_train_state *state);

/* As bp_checkpoint_save, with `note` (borrowed; NULL for none), e.g. the
 * model file or run name, recorded in the file's identification text ahead
 * of a summary of the plan. Control characters become spaces; the text is
 * cut at BP_CHECKPOINT_TEXT_MAX - 1 bytes. bp_checkpoint_save is this with
 * a NULL note. */
bp_status bp_checkpoint_save_note(const char *path, const bp_plan *plan, const void *arena,
                                  const bp_train_state *state, const char *note);

/* How a checkpoint reaches an arena that the host may not address (a
 * device's): read and write `bytes` at arena `offset`, returning BP_OK or
 * a failure with its message. The trainer's go through the device plugin's
 * copies; the functions above use memcpy on their host copy. */
typedef struct bp_arena_access {
  bp_status (*read)(void *user, uint64_t offset, void *dst, uint64_t bytes);
  bp_status (*write)(void *user, uint64_t offset, const void *src, uint64_t bytes);
  void *user;
} bp_arena_access;

/* bp_checkpoint_save_note reading the arena through `arena->read` (in
 * chunks of at most 1 MiB). A failed read fails the save as a failed write
 * does, with the accessor's status. */
bp_status bp_checkpoint_save_access(const char *path, const bp_plan *plan,
                                    const bp_arena_access *arena, const bp_train_state *state,
                                    const char *note);

/* Bytes of a checkpoint of `plan` (finalized); 0 on an invalid plan. */
uint64_t bp_checkpoint_file_bytes(const bp_plan *plan);

/* What a checkpoint says about itself. */
typedef struct bp_checkpoint_info {
  uint32_t format_version;
  uint64_t plan_hash;        /* bp_plan_hash of the plan it was written for */
  uint64_t plan_total_bytes; /* that plan's bp_plan_total_bytes (not checked on load) */
  uint64_t data_bytes;       /* bytes of state data it holds */
  uint64_t file_bytes;       /* bytes of the file */
  bp_train_state state;
  char text[BP_CHECKPOINT_TEXT_MAX]; /* identification text, NUL-terminated */
} bp_checkpoint_info;

/* Reads and verifies `path` (magic, version, size, both CRCs, end marker)
 * without a plan, and describes it in *info_out (written only on success).
 * Memory use does not depend on the file's size. */
bp_status bp_checkpoint_read_info(const char *path, bp_checkpoint_info *info_out);

/* Validates `path` against `plan`, then copies its spans into `arena` (host,
 * bp_plan_total_bytes long) and its counters into *state_out. A state value
 * that is NaN or infinite (a diverged run) is refused, naming the tensor
 * (docs/checkpoint-format.md, "Reading"). On any error
 * neither the arena nor *state_out is touched. The data is staged in a
 * buffer the size of the state spans (sized from the plan, never from the
 * file) until every check has passed. */
bp_status bp_checkpoint_load(const char *path, const bp_plan *plan, void *arena,
                             bp_train_state *state_out);
/* bp_checkpoint_load writing the arena through `arena->write`, once every
 * check has passed. Should a write fail (a device error), the arena may be
 * partly written and *state_out is not touched. */
bp_status bp_checkpoint_load_access(const char *path, const bp_plan *plan,
                                    const bp_arena_access *arena, bp_train_state *state_out);

#ifdef __cplusplus
}
#endif
#endif
