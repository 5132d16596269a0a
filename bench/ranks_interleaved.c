/* ranks_interleaved: images/s of 1 rank, of R ranks (as threads) and of R
 * independent 1-rank trainers running at once ("jobs": what the machine
 * gives R separate jobs, the ceiling of R ranks), in one process, measured
 * in alternating slices of a few steps each. On a shared VM a core's speed
 * drifts by up to 2x from one second to the next, so two runs seconds
 * apart compare the machine's moods as much as the ranks; slices side by
 * side run at nearly the same speed. Every slice is one "epoch" of STEPS
 * global batches of the model's batch (train_limit), the evaluation after
 * it on TEST images (not in images/s). The order within a round rotates so
 * a steady drift cancels out. Prints every round, then the medians of
 * images/s and of the per-round ratios.
 *
 *   bench_ranks_interleaved MODEL [ROUNDS [STEPS [RANKS [strong|weak]]]]
 *
 * The jobs' slowest one, times R ("lockstep"), bounds what R ranks can
 * reach with free communication: ranks move in lockstep, every step at the
 * pace of the slowest core, while independent jobs each keep their own
 * core's pace (the cores of a shared VM drift apart by 5-20% for seconds).
 *
 * Defaults: 30 rounds (one more first, as a warm-up, not counted), 20
 * steps per slice, 2 ranks, strong scaling: the R ranks split the model's
 * batch B (each rank B / R). Weak scaling: the R ranks run a global batch
 * of R * B, each rank B, as each of the R jobs does (the usual measure of
 * data-parallel scaling: a fixed batch per worker). Every rank runs one
 * thread, its GEMMs included (BP_THREADS=1 unless set, bench_env.h), as bench/compare.sh --ranks
 * does. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/blueprint.h"
#include "bench_env.h"

enum { TEST = 200, MAX_JOBS = 64 };

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static long arg_or(int argc, char **argv, int i, long fallback) {
  if (argc <= i) return fallback;
  char *end = NULL;
  long v = strtol(argv[i], &end, 10);
  if (!*argv[i] || *end || v < 1 || v > 100000) {
    fprintf(stderr, "ranks_interleaved: '%s' is not a count in [1, 100000]\n", argv[i]);
    exit(2);
  }
  return v;
}

static bp_trainer *open_trainer(const char *model, bp_registry *registry, int ranks,
                                int64_t steps, int64_t batch, int64_t slices) {
  bp_train_options o;
  bp_train_options_init(&o);
  o.threads = bench_env_threads();
  o.ranks = ranks;
  o.batch = batch;
  o.train_limit = steps * batch;
  o.test_limit = TEST;
  o.epochs = slices;
  o.registry = registry;
  bp_trainer *t = NULL;
  if (bp_trainer_create_from_file(model, &o, &t) != BP_OK) {
    fprintf(stderr, "ranks_interleaved: %s\n", bp_last_error());
    exit(1);
  }
  return t;
}

static double slice(bp_trainer *t) {
  bp_epoch_report r;
  if (bp_trainer_train_epoch(t, &r) != BP_OK) {
    fprintf(stderr, "ranks_interleaved: %s\n", bp_last_error());
    exit(1);
  }
  return r.images_per_second;
}

typedef struct job {
  bp_trainer *t;
  double ips;
} job;

static void *run_job(void *arg) {
  job *j = arg;
  j->ips = slice(j->t);
  return NULL;
}

/* One slice of every job at once; their summed images/s, and the slowest
 * one's in *slowest. */
static double jobs_slice(job *jobs, int count, double *slowest) {
  pthread_t threads[MAX_JOBS];
  for (int k = 0; k < count; k++)
    if (pthread_create(&threads[k], NULL, run_job, &jobs[k]) != 0) {
      fprintf(stderr, "ranks_interleaved: cannot start a job thread\n");
      exit(1);
    }
  double sum = 0;
  *slowest = 0;
  for (int k = 0; k < count; k++) {
    pthread_join(threads[k], NULL);
    sum += jobs[k].ips;
    if (k == 0 || jobs[k].ips < *slowest) *slowest = jobs[k].ips;
  }
  return sum;
}

int main(int argc, char **argv) {
  if (argc < 2 || argc > 6 || (argc == 6 && strcmp(argv[5], "strong") != 0 &&
                                strcmp(argv[5], "weak") != 0)) {
    fprintf(stderr,
            "usage: bench_ranks_interleaved MODEL [ROUNDS [STEPS [RANKS [strong|weak]]]]\n");
    return 2;
  }
  const int weak = argc == 6 && strcmp(argv[5], "weak") == 0;
  const int rounds = (int)arg_or(argc, argv, 2, 30);
  const int64_t steps = arg_or(argc, argv, 3, 20);
  const int ranks = (int)arg_or(argc, argv, 4, 2);
  if (ranks > MAX_JOBS) {
    fprintf(stderr, "ranks_interleaved: at most %d ranks\n", MAX_JOBS);
    return 2;
  }
  setenv("BP_THREADS", "1", 0);
  bp_model *m = NULL;
  bp_registry *registry = NULL;
  const bp_registry_options ro = bench_env_registry();
  if (bp_model_load(argv[1], &m) != BP_OK || bp_registry_create_with(&ro, &registry) != BP_OK ||
      bp_registry_discover(registry, NULL, 0) != BP_OK) {
    fprintf(stderr, "ranks_interleaved: %s\n", bp_last_error());
    return 1;
  }
  const int64_t batch = m->train.batch;
  bp_model_destroy(m);
  const int64_t slices = rounds + 1;
  bp_trainer *one = open_trainer(argv[1], registry, 1, steps, batch, slices);
  bp_trainer *many = open_trainer(argv[1], registry, ranks, steps, weak ? ranks * batch : batch,
                                  slices);
  job jobs[MAX_JOBS];
  for (int k = 0; k < ranks; k++)
    jobs[k] = (job){open_trainer(argv[1], registry, 1, steps, batch, slices), 0};
  double *v = calloc((size_t)rounds * 7, sizeof *v);
  if (!v) {
    fprintf(stderr, "ranks_interleaved: out of memory\n");
    return 1;
  }
  double *ips1 = v, *ipsr = v + rounds, *ipsj = v + 2 * rounds, *ratio = v + 3 * rounds,
         *ceiling = v + 4 * rounds, *lockstep = v + 5 * rounds, *of_lockstep = v + 6 * rounds;
  printf("%s: %d rounds of %lld steps of batch %lld: 1 rank, %d ranks (%s scaling: global "
         "batch %lld), %d 1-rank jobs at once\n",
         argv[1], rounds, (long long)steps, (long long)batch, ranks, weak ? "weak" : "strong",
         (long long)(weak ? ranks * batch : batch), ranks);
  printf("round  1 rank img/s  %d ranks img/s  %d jobs img/s  lockstep img/s  ranks/1  jobs/1  "
         "ranks/lockstep\n",
         ranks, ranks);
  for (int r = -1; r < rounds; r++) {
    double a = 0, b = 0, c = 0, slowest = 0;
    for (int k = 0; k < 3; k++) { /* the round's order: rotated by one each round */
      const int which = (k + r + 3) % 3;
      if (which == 0) a = slice(one);
      if (which == 1) b = slice(many);
      if (which == 2) c = jobs_slice(jobs, ranks, &slowest);
    }
    if (r < 0) continue; /* the warm-up round */
    ips1[r] = a, ipsr[r] = b, ipsj[r] = c, ratio[r] = b / a, ceiling[r] = c / a;
    lockstep[r] = ranks * slowest, of_lockstep[r] = b / lockstep[r];
    printf("%5d  %12.0f  %13.0f  %12.0f  %14.0f  %7.2f  %6.2f  %14.2f\n", r + 1, a, b, c,
           lockstep[r], ratio[r], ceiling[r], of_lockstep[r]);
  }
  printf("median: 1 rank %.0f img/s, %d ranks %.0f img/s, %d jobs %.0f img/s, lockstep %.0f "
         "img/s\n",
         median(ips1, rounds), ranks, median(ipsr, rounds), ranks, median(ipsj, rounds),
         median(lockstep, rounds));
  printf("median of the rounds' ratios: %d ranks / 1 rank %.2fx, %d jobs / 1 rank %.2fx, "
         "ranks / lockstep %.2f\n",
         ranks, median(ratio, rounds), ranks, median(ceiling, rounds),
         median(of_lockstep, rounds));
  free(v);
  for (int k = 0; k < ranks; k++) bp_trainer_destroy(jobs[k].t);
  bp_trainer_destroy(many);
  bp_trainer_destroy(one);
  bp_registry_destroy(registry);
  return 0;
}
