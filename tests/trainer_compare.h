/* Test helpers that compare two trainers' runs (test_device_seam.c,
 * test_graph_replay.c): the epoch reports a run trains, and its state. */
#ifndef BP_TESTS_TRAINER_COMPARE_H
#define BP_TESTS_TRAINER_COMPARE_H

#include "blueprint/train.h"

/* The reports of every epoch a run trains (at most 4). */
typedef struct reports {
  bp_epoch_report r[4];
  int n;
} reports;

/* bp_trainer_train's callback: appends the report to a `reports`. */
void keep(void *user, const bp_epoch_report *r);

/* Trains t to its end, the reports into k; fails the test on an error. */
void train_all(bp_trainer *t, reports *k);

/* Every FP32 tensor of the state regions (B .. V: BN statistics,
 * parameters, optimizer moments; not R, not gradients), on every local
 * rank, equal bit for bit; at least two compared. */
void same_state(bp_trainer *a, bp_trainer *b);

#endif
