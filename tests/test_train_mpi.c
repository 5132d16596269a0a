/* One rank per process under mpirun (comm.h, ops/allreduce): `mpirun -np
 * N blueprint train` ends with the same bits as `--ranks N` threads, with
 * the arenas' spans in shared memory ("threads" kernels over them) and
 * apart ("mpi" kernels): every all-reduce kernel does the same float
 * operations in the same order (allreduce-impl.h). Compared as checkpoint
 * files (every parameter, BN statistic and optimizer moment, and the
 * counters); only rank 0 prints and writes; --ranks under mpirun is
 * refused in one line; a failure on one process ends them all.
 * Skips (exit 77) where mpirun is missing or blueprint was built without
 * MPI. Open MPI runs as root here only with its two opt-in variables, and
 * --oversubscribe lets 3 processes share 2 cores. */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "run_util.h"

static const char bn_model[] =
    TOY_BN_MODEL_LAYERS
    "train: {batch: 50, eval_batch: 40, epochs: 2, lr: 0.02}\n";

/* `blueprint train model` under `mpirun -np np` (np > 0) or alone (np 0),
 * with extra arguments (NULL-terminated). */
static run_result train(int np, const char *model, const char *data, const char *const *extra) {
  char exe[4096], nps[16];
  snprintf(exe, sizeof exe, "%s/blueprint", getenv("BP_BINARY_DIR"));
  snprintf(nps, sizeof nps, "%d", np);
  const char *argv[64];
  int n = 0;
  if (np > 0) {
    argv[n++] = "mpirun";
    argv[n++] = "--timeout"; /* a rank left waiting fails the test, not the suite's clock */
    argv[n++] = "120";
    argv[n++] = "--oversubscribe";
    argv[n++] = "-np";
    argv[n++] = nps;
  }
  const char *common[] = {exe,      "train",  model,    "--data", data, "--seed", "5",
                          "--test-limit", "40", "--epochs", "2"};
  for (size_t i = 0; i < sizeof common / sizeof common[0]; i++) argv[n++] = common[i];
  for (int i = 0; extra[i]; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  if (np == 0) return run_argv(argv);
  /* Open MPI's own allocations outlive MPI_Finalize, so a sanitizer build
   * checks leaks in the threads runs only */
  const char *old = getenv("ASAN_OPTIONS");
  char *saved = old ? strdup(old) : NULL, asan[1024];
  snprintf(asan, sizeof asan, "%s%sdetect_leaks=0", old ? old : "", old && *old ? ":" : "");
  setenv("ASAN_OPTIONS", asan, 1);
  run_result r = run_argv(argv);
  if (saved)
    setenv("ASAN_OPTIONS", saved, 1);
  else
    unsetenv("ASAN_OPTIONS");
  free(saved);
  return r;
}

/* Files of blueprint's shared arenas left in /dev/shm (their names go as
 * soon as every process has them open). */
static int shm_leftovers(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) n += strncmp(e->d_name, "blueprint-", 10) == 0;
  closedir(d);
  return n;
}

static int count_lines_with(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, needle)) != NULL; p++) n++;
  return n;
}

/* N processes vs N threads: the same checkpoint bytes, one report; the
 * processes' arenas in shared memory (the default on one machine) and,
 * with BP_MPI_SHARED=0, apart (the "mpi" kernels' messages). */
static void check_same_bits(const char *model_text, int use_mlp, int np, const char *batch) {
  toy_env e = toy_env_open(model_text, 260, 60, 3);
  const char *model = use_mlp ? e.mlp : e.model;
  char *ck_threads = path_in(e.dir, "threads.ckpt"), *ck_mpi = path_in(e.dir, "mpi.ckpt");
  char ranks[16], transport[64];
  snprintf(ranks, sizeof ranks, "%d", np);
  run_result t = train(0, model, e.data,
                       (const char *const[]){"--ranks", ranks, "--batch", batch, "--checkpoint",
                                             ck_threads, NULL});
  ck_assert_msg(t.status == 0, "--ranks %d: %s", np, t.err);
  snprintf(transport, sizeof transport, "%d ranks (threads)", np);
  ck_assert_msg(strstr(t.out, transport) != NULL, "stdout: %s", t.out);
  static const char *const shared[] = {"1", "0"};
  /* where /dev/shm is small the default may fall back to messages: either
   * transport then, the same bits all the same */
  const char *const said[] = {shm_usable(64u << 20) ? "mpi shared memory" : "mpi",
                              "mpi messages"};
  for (int i = 0; i < 2; i++) {
    setenv("BP_MPI_SHARED", shared[i], 1);
    remove(ck_mpi);
    run_result m = train(np, model, e.data,
                         (const char *const[]){"--batch", batch, "--checkpoint", ck_mpi, NULL});
    unsetenv("BP_MPI_SHARED");
    ck_assert_msg(m.status == 0, "mpirun -np %d (%s): status %d\n%s\n%s", np, said[i], m.status,
                  m.out, m.err);
    snprintf(transport, sizeof transport, "%d ranks (%s", np, said[i]);
    ck_assert_msg(strstr(m.out, transport) != NULL, "stdout: %s", m.out);
    ck_assert_msg(same_file(ck_threads, ck_mpi),
                  "mpirun -np %d (%s) and --ranks %d (batch %s) ended with different checkpoints",
                  np, said[i], np, batch);
    /* rank 0 alone reports, with the same accuracy as the threads */
    ck_assert_int_eq(count_lines_with(m.out, "test accuracy"), 1);
    const char *a = strstr(t.out, "test accuracy"), *b = strstr(m.out, "test accuracy");
    ck_assert(a && b);
    ck_assert_msg(strncmp(a, b, 24) == 0, "threads '%.24s', mpi '%.24s'", a, b);
    ck_assert_int_eq(shm_leftovers(), 0);
    run_free(&m);
  }
  run_free(&t);
  free(ck_threads);
  free(ck_mpi);
  toy_env_close(&e);
}

START_TEST(mpi_bn_two_processes_match_two_threads) { check_same_bits(bn_model, 0, 2, "50"); }
END_TEST

START_TEST(mpi_mlp_two_processes_match_two_threads) { check_same_bits(bn_model, 1, 2, "64"); }
END_TEST

/* 3 processes on 2 cores, an uneven split: 64 = 22 + 21 + 21, the last
 * batch of 4 = 2 + 1 + 1 */
START_TEST(mpi_bn_three_processes_uneven_match_three_threads) {
  check_same_bits(bn_model, 0, 3, "64");
}
END_TEST

START_TEST(mpi_refuses_ranks_option) {
  toy_env e = toy_env_open(bn_model, 100, 40, 3);
  run_result r = train(2, e.model, e.data, (const char *const[]){"--ranks", "2", NULL});
  ck_assert_int_ne(r.status, 0);
  ck_assert_msg(strstr(r.err, "one rank per process") != NULL, "stderr: %s", r.err);
  run_free(&r);
  toy_env_close(&e);
}
END_TEST

/* Runs 2 processes with `option` naming a file whose name is too long to
 * create (ENAMETOOLONG; a missing directory is refused by every process
 * before any work: cli/path_guard.c), which only rank 0 opens: it fails
 * alone, the other rank goes on. The run must end every process with rank
 * 0's reason (`says`), within mpirun's time limit (no rank left waiting). */
static void check_rank0_failure_ends_run(const char *option, const char *says) {
  toy_env e = toy_env_open(bn_model, 100, 40, 3);
  char name[300];
  memset(name, 'n', sizeof name - 1);
  name[sizeof name - 1] = '\0';
  char *path = path_in(e.dir, name);
  run_result r = train(2, e.model, e.data, (const char *const[]){option, path, NULL});
  ck_assert_int_ne(r.status, 0);
  ck_assert_msg(strstr(r.err, says) != NULL, "stderr: %s", r.err);
  ck_assert_msg(strstr(r.err, "time limit") == NULL, "a rank was left waiting: %s", r.err);
  ck_assert_int_eq(shm_leftovers(), 0);
  run_free(&r);
  free(path);
  toy_env_close(&e);
}

/* Rank 0 alone writes the checkpoint; when that fails after the others
 * have trained on, MPI_Abort ends every process (no rank is left waiting in
 * an all-reduce). */
START_TEST(mpi_failure_ends_every_process) {
  check_rank0_failure_ends_run("--checkpoint", "cannot write checkpoint");
}
END_TEST

/* Rank 0 alone fails while the trainer is created, after the shared
 * arenas exist (its metrics file cannot be opened): freeing its arena must
 * not wait for its peers, which go on to train. */
START_TEST(mpi_failure_after_shared_arenas_ends_every_process) {
  check_rank0_failure_ends_run("--metrics", "metrics file");
}
END_TEST

/* The process of `mpirun` (pid `root`, any depth below it) whose
 * environment says OMPI_COMM_WORLD_RANK=`rank` (Open MPI, as the skip
 * rule assumes); 0 when none. */
static pid_t rank_process(pid_t root, int rank) {
  char want[64];
  snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank);
  DIR *d = opendir("/proc");
  if (!d) return 0;
  pid_t found = 0;
  for (struct dirent *e; !found && (e = readdir(d)) != NULL;) {
    const pid_t p = (pid_t)atol(e->d_name);
    if (p <= 0 || p == root) continue;
    /* a descendant of root: follow the parents (/proc/P/stat's 4th field) */
    pid_t up = p;
    for (int depth = 0; depth < 8 && up > 1 && up != root; depth++) {
      char path[64], buf[512];
      snprintf(path, sizeof path, "/proc/%ld/stat", (long)up);
      FILE *f = fopen(path, "r");
      size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
      if (f) fclose(f);
      buf[n] = 0;
      const char *paren = strrchr(buf, ')'); /* the name may hold spaces */
      long parent = 0;
      if (!paren || sscanf(paren + 1, " %*c %ld", &parent) != 1) break;
      up = (pid_t)parent;
    }
    if (up != root) continue;
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/environ", (long)p);
    size_t n = 0;
    char *env = (char *)read_file(path, &n);
    for (size_t at = 0; env && at < n && !found; at += strlen(env + at) + 1)
      if (strcmp(env + at, want) == 0) found = p;
    free(env);
  }
  closedir(d);
  return found;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* kill -9 of rank 1 mid-run, after the first checkpoint: mpirun ends with a
 * non-zero status and a line naming the lost rank within 30 s (no survivor
 * left waiting in a collective), and the last checkpoint still loads. */
START_TEST(mpi_a_killed_rank_ends_the_run_and_the_checkpoint_loads) {
  toy_env e = toy_env_open(bn_model, 600, 40, 3);
  char *ck = path_in(e.dir, "run.ckpt"), *log = path_in(e.dir, "mpirun.log");
  char exe[4096];
  snprintf(exe, sizeof exe, "%s/blueprint", getenv("BP_BINARY_DIR"));
  const char *argv[] = {"mpirun", "--timeout", "300", "--oversubscribe", "-np", "2",
                        exe, "train", e.model, "--data", e.data, "--seed", "5",
                        "--test-limit", "40", "--epochs", "500", "--batch", "50",
                        "--checkpoint", ck, NULL};
  const pid_t run = fork();
  ck_assert_int_ge(run, 0);
  if (run == 0) {
    const int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(126);
    execvp(argv[0], (char *const *)argv);
    _exit(127);
  }
  /* the first checkpoint (renamed into place whole), then rank 1 */
  const double start = now_s();
  struct stat sb;
  int status = 0;
  pid_t victim = 0;
  while (now_s() - start < 240 && waitpid(run, &status, WNOHANG) == 0) {
    if (stat(ck, &sb) == 0 && (victim = rank_process(run, 1)) != 0) break;
    usleep(20000);
  }
  ck_assert_msg(victim != 0, "no checkpoint or no rank 1 within 240 s (mpirun %s)",
                waitpid(run, &status, WNOHANG) == run ? "ended" : "still runs");
  ck_assert_int_eq(kill(victim, SIGKILL), 0);
  const double killed = now_s();
  pid_t done = 0;
  while ((done = waitpid(run, &status, WNOHANG)) == 0 && now_s() - killed < 30) usleep(20000);
  if (done == 0) { /* a survivor hangs: end it, then fail */
    kill(run, SIGKILL);
    waitpid(run, &status, 0);
  }
  size_t n = 0;
  char *out = (char *)read_file(log, &n);
  ck_assert_msg(done == run, "mpirun still ran 30 s after rank 1 was killed:\n%s", out);
  ck_assert_msg(!WIFEXITED(status) || WEXITSTATUS(status) != 0, "mpirun exited 0:\n%s", out);
  ck_assert_msg(strstr(out, "rank 1") != NULL && strstr(out, "signal 9") != NULL,
                "no line names the lost rank:\n%s", out);
  const char *line = strstr(out, "rank 1");
  while (line > out && line[-1] != '\n') line--;
  printf("mpirun ended %.1f s after rank 1 was killed: %.*s\n", now_s() - killed,
         (int)strcspn(line, "\n"), line);
  free(out);
  /* the last checkpoint is whole: eval (one process, the run's 2 ranks as
   * threads: the same plan) reads it */
  run_result r = RUN("eval", e.model, "--data", e.data, "--test-limit", "40", "--batch", "50",
                     "--ranks", "2", "--checkpoint", ck);
  ck_assert_msg(r.status == 0, "eval of the last checkpoint: %s", r.err);
  run_free(&r);
  free(ck);
  free(log);
  toy_env_close(&e);
}
END_TEST

int main(void) {
#ifndef BP_TEST_WITH_MPI
  printf("SKIP: blueprint was built without MPI (BP_WITH_MPI=OFF)\n");
  return 77;
#endif
  if (!mpirun_ready()) return 77;
  if (!shm_usable(64u << 20))
    printf("note: /dev/shm has less than 64 MiB free: mpirun may fall back to messages\n");
  setenv("BP_THREADS", "1", 0); /* one thread per rank (GEMMs included) in both runs */
  Suite *s = suite_create("train_mpi");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, mpi_bn_two_processes_match_two_threads);
  tcase_add_test(tc, mpi_mlp_two_processes_match_two_threads);
  tcase_add_test(tc, mpi_bn_three_processes_uneven_match_three_threads);
  tcase_add_test(tc, mpi_refuses_ranks_option);
  tcase_add_test(tc, mpi_failure_ends_every_process);
  tcase_add_test(tc, mpi_failure_after_shared_arenas_ends_every_process);
  tcase_add_test(tc, mpi_a_killed_rank_ends_the_run_and_the_checkpoint_loads);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
