/* Test helpers that make and compare trainers' runs (test_device_seam.c,
 * test_graph_replay.c, test_streams.c): a trainer of small generated data,
 * the epoch reports a run trains, its metrics file's epoch lines, and its
 * state. */
#ifndef BP_TESTS_TRAINER_COMPARE_H
#define BP_TESTS_TRAINER_COMPARE_H

#include "blueprint/train.h"

/* What differs between these tests' trainers; a field left 0 takes the
 * default its comment gives. */
typedef struct run_opts {
  bp_registry *registry; /* borrowed, loaded */
  const char *device;    /* "cpu", "guarded" */
  const char *devices;   /* device indices (bp_train_options) */
  const char *kernels;   /* pins (bp_train_options) */
  int ranks, amp, adamw, no_graph;
  int streams;     /* compute streams of a device rank (0: the default, 3) */
  int constant_lr; /* 0: a cosine schedule, so that the step's scalars change every step
                      (the lr; AdamW's step counter changes too) */
  int64_t epochs;  /* 0: 2 */
  int64_t batch;      /* 0: 8 (100 images: 12 full steps and a short one, train_last) */
  int64_t eval_batch; /* 0: 8 (30 test images: 3 full batches and a short one, eval_last) */
  uint64_t seed;      /* 0: 5 */
  int64_t stop_after;  /* stop_after_steps: 0, every epoch runs */
  int64_t log_every;   /* a metrics line every N steps; 0: off */
  const char *checkpoint, *resume, *metrics; /* paths; NULL: none */
} run_opts;

/* A trainer of `model` on the first 100 training and 30 test images in
 * `data`, as r says; fails the test when creating it fails. */
bp_trainer *make_trainer(const char *model, const char *data, const run_opts *r);

/* The reports of every epoch a run trains (at most 4). */
typedef struct reports {
  bp_epoch_report r[4];
  int n;
} reports;

/* bp_trainer_train's callback: appends the report to a `reports`. */
void keep(void *user, const bp_epoch_report *r);

/* Trains t to its end, the reports into k; fails the test on an error. */
void train_all(bp_trainer *t, reports *k);

/* Reports equal bit for bit: samples, losses and accuracies (those of the
 * test NaN in both where an epoch stopped before its evaluation), loss
 * scale, skipped steps; the training loss finite. */
void same_reports(const reports *a, const reports *b);

/* Epoch line n's train_loss, test_loss and test_accuracy in two metrics
 * files (docs/metrics-jsonl.md; n counts from 0): numbers, equal bit for
 * bit. a_is, b_is: what each run was, for the message. */
void same_epoch_metrics(const char *a, const char *b, int n, const char *a_is, const char *b_is);

/* Every FP32 tensor of the state regions (B .. V: BN statistics,
 * parameters, optimizer moments; not R, not gradients), on every local
 * rank, equal bit for bit; at least two compared. */
void same_state(bp_trainer *a, bp_trainer *b);

#endif
