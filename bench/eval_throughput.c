/* bench_eval_throughput: images/s of the evaluation pass at the model's
 * evaluation batch, the batch-200 throughput figure beside PyTorch's
 * torch_infer.py.
 *
 *   bench_eval_throughput MODEL [--checkpoint FILE] [--rounds N] [--test-limit N]
 *
 * One trainer (eval only) evaluates the test set ROUNDS times (default 5)
 * after one untimed warm-up pass; each pass's images/s is the test images
 * over bp_trainer_evaluate's seconds (batch fill, the forward kernels and
 * the loss; the data set is already decoded). Prints every round, then the
 * best and the median. Without --checkpoint the weights are the
 * initialization's (the speed does not depend on them): the trainer is
 * created for training on a one-batch training set. Threads: one rank's,
 * every core or BP_THREADS. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/train.h"
#include "bench_env.h"

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  if (argc < 2 || argv[1][0] == '-') {
    fprintf(stderr, "usage: bench_eval_throughput MODEL [--checkpoint FILE] [--rounds N] "
                    "[--test-limit N]\n");
    return 2;
  }
  bp_train_options o;
  bp_train_options_init(&o);
  const bp_registry_options ro = bench_env_registry();
  o.registry_options = &ro;
  o.threads = bench_env_threads();
  o.train_limit = 1;
  int rounds = 5;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--checkpoint")) {
      o.resume_path = argv[i + 1];
      o.eval_only = 1;
    } else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--test-limit")) o.test_limit = atoll(argv[i + 1]);
    else {
      fprintf(stderr, "bench_eval_throughput: unknown option '%s'\n", argv[i]);
      return 2;
    }
  }
  if (rounds < 1 || rounds > 1000) {
    fprintf(stderr, "bench_eval_throughput: --rounds must be 1 to 1000\n");
    return 2;
  }
  bp_trainer *t = NULL;
  bp_eval_report r;
  if (bp_trainer_create_from_file(argv[1], &o, &t) != BP_OK ||
      bp_trainer_evaluate(t, &r) != BP_OK) {
    fprintf(stderr, "bench_eval_throughput: %s\n", bp_last_error());
    bp_trainer_destroy(t);
    return 1;
  }
  double *ips = calloc((size_t)rounds, sizeof *ips);
  if (!ips) return 1;
  for (int i = 0; i < rounds; i++) {
    if (bp_trainer_evaluate(t, &r) != BP_OK) {
      fprintf(stderr, "bench_eval_throughput: %s\n", bp_last_error());
      return 1;
    }
    ips[i] = (double)r.samples / r.seconds;
    printf("round %d: %lld images in %.4f s, %.0f images/s\n", i + 1, (long long)r.samples,
           r.seconds, ips[i]);
  }
  qsort(ips, (size_t)rounds, sizeof *ips, cmp_double);
  printf("best %.0f images/s, median %.0f images/s\n", ips[rounds - 1], ips[rounds / 2]);
  free(ips);
  bp_trainer_destroy(t);
  return 0;
}
