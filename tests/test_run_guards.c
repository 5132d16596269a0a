/* Runs that would lose work or hang (docs/reliability.md, round 3): output
 * paths naming the run's inputs or each other, output directories that
 * cannot be written, a diverging run, SIGINT and SIGTERM, the resume
 * refusal's numbering. Each command runs under `timeout`, so a hang fails
 * the test; every run is a few steps of toy data. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "run_util.h"

#define SMALL_MODEL TOY_BN_MODEL_LAYERS "train: {batch: 8, epochs: 1}\n"

extern char **environ;

/* A copy of `path`'s bytes, to compare after a refused run. */
typedef struct snapshot {
  unsigned char *bytes;
  size_t size;
} snapshot;

static snapshot take(const char *path) {
  snapshot s = {NULL, 0};
  s.bytes = read_file(path, &s.size);
  ck_assert_msg(s.bytes != NULL, "cannot read %s", path);
  return s;
}

static void unchanged(snapshot *s, const char *path) {
  size_t n = 0;
  unsigned char *now = read_file(path, &n);
  ck_assert_msg(now && n == s->size && memcmp(now, s->bytes, n) == 0, "%s was changed", path);
  free(now);
  free(s->bytes);
  s->bytes = NULL;
}

/* A refused run: exit 2, one line naming the clash, no file touched. */
static void expect_clash(run_result *r, const char *needle) {
  ck_assert_msg(r->status == 2, "status %d, want 2 (stderr: %s)", r->status, r->err);
  expect_one_line_error(r, "blueprint ", needle);
  run_free(r);
}

START_TEST(an_output_that_names_an_input_or_another_output_is_refused_untouched) {
  toy_env e = toy_env_open(SMALL_MODEL, 64, 32, 1);
  char *ck = path_in(e.dir, "ck.bin"), *labels = path_in(e.data, "t10k-labels-idx1-ubyte");
  char *f = path_in(e.dir, "both.out"), *link = path_in(e.dir, "model-link.ck");
  run_result r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--checkpoint", ck);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  snapshot model = take(e.model), lab = take(labels), cks = take(ck);
  r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--checkpoint", e.model);
  expect_clash(&r, "is the same file as the model file");
  r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--metrics", e.model);
  expect_clash(&r, "--metrics");
  r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--checkpoint", labels);
  expect_clash(&r, "is the same file as the data file");
  r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--resume", ck, "--metrics", ck);
  expect_clash(&r, "is the same file as --resume");
  r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--autotune-cache", e.model);
  expect_clash(&r, "--autotune-cache");
  r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--checkpoint", f, "--metrics", f);
  expect_clash(&r, "are the same file");
  ck_assert_int_ne(access(f, F_OK), 0); /* nothing written */
  /* through a symlink: the target is what a write would replace */
  ck_assert_int_eq(symlink("model.yaml", link), 0);
  r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--checkpoint", link);
  expect_clash(&r, "is the same file as the model file");
  r = RUN_T("plan", e.model, "--svg", e.model);
  expect_clash(&r, "is the same file as the model file");
  unchanged(&model, e.model);
  unchanged(&lab, labels);
  unchanged(&cks, ck);
  /* --checkpoint may be --resume: the run continues in place */
  r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--epochs", "2", "--resume", ck,
            "--checkpoint", ck);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  free(ck), free(labels), free(f), free(link);
  toy_env_close(&e);
}
END_TEST

START_TEST(a_symlinked_checkpoint_replaces_its_target_and_keeps_the_link) {
  toy_env e = toy_env_open(SMALL_MODEL, 64, 32, 1);
  char *link = path_in(e.dir, "ck.link"), *target = path_in(e.dir, "ck.real");
  ck_assert_int_eq(symlink("ck.real", link), 0); /* dangling until the first save */
  run_result r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--checkpoint", link);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  struct stat sb;
  ck_assert_int_eq(lstat(link, &sb), 0);
  ck_assert_msg(S_ISLNK(sb.st_mode), "the link was replaced");
  ck_assert_int_eq(lstat(target, &sb), 0);
  ck_assert(S_ISREG(sb.st_mode) && sb.st_size > 0);
  /* a second save (a resume) replaces the target again, through the link */
  r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--epochs", "2", "--resume", link,
            "--checkpoint", link);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  ck_assert_int_eq(lstat(link, &sb), 0);
  ck_assert(S_ISLNK(sb.st_mode));
  ck_assert_int_eq(temps_in(e.dir), 0);
  r = RUN_T("eval", e.model, "--data", e.data, "--quiet", "--checkpoint", target);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  free(link), free(target);
  toy_env_close(&e);
}
END_TEST

START_TEST(an_output_in_a_missing_or_unwritable_directory_is_refused_before_training) {
  toy_env e = toy_env_open(SMALL_MODEL, 64, 32, 1);
  char *missing = path_in(e.dir, "no/such/dir/ck.bin");
  run_result r = RUN_T("train", e.model, "--data", e.data, "--checkpoint", missing);
  expect_one_line_error(&r, "blueprint train:", "the directory");
  ck_assert_msg(strstr(r.out, "epoch") == NULL, "trained first: %s", r.out);
  run_free(&r);
  r = RUN_T("train", e.model, "--data", e.data, "--metrics", missing);
  expect_one_line_error(&r, "blueprint train:", "No such file or directory");
  run_free(&r);
  char *file = path_in(e.dir, "plain"), *under = path_in(e.dir, "plain/ck.bin");
  write_file(file, "x", 1);
  r = RUN_T("train", e.model, "--data", e.data, "--checkpoint", under);
  expect_one_line_error(&r, "blueprint train:", "plain");
  run_free(&r);
  if (geteuid() != 0) { /* root writes anywhere */
    char *ro = path_in(e.dir, "ro"), *in_ro = path_in(e.dir, "ro/ck.bin");
    ck_assert_int_eq(mkdir(ro, 0500), 0);
    r = RUN_T("train", e.model, "--data", e.data, "--checkpoint", in_ro);
    expect_one_line_error(&r, "blueprint train:", "is not writable");
    run_free(&r);
    chmod(ro, 0700);
    free(ro), free(in_ro);
  }
  free(missing), free(file), free(under);
  toy_env_close(&e);
}
END_TEST

/* Resumed with a learning rate of 1e6 the loss turns NaN: the run stops
 * with one line naming the step, exit 1, the good checkpoint stays
 * loadable and byte for byte, and no metrics line claims a save. */
START_TEST(a_diverging_run_stops_and_keeps_the_last_good_checkpoint) {
  toy_env e = toy_env_open(SMALL_MODEL, 64, 32, 1);
  char *ck = path_in(e.dir, "ck.bin"), *m = path_in(e.dir, "m.jsonl");
  run_result r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--checkpoint", ck);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  snapshot good = take(ck);
  r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--epochs", "3", "--lr", "1e6",
            "--resume", ck, "--checkpoint", ck, "--metrics", m);
  expect_one_line_error(&r, "blueprint train:", "the run diverged");
  ck_assert_msg(strstr(r.err, "by step 16 of the run (epoch 2,") != NULL, "%s", r.err);
  ck_assert_msg(strstr(r.err, "is left as it was") != NULL, "%s", r.err);
  run_free(&r);
  unchanged(&good, ck);
  size_t n = 0;
  char *lines = (char *)read_file(m, &n);
  ck_assert_ptr_nonnull(lines);
  ck_assert_msg(strstr(lines, "\"checkpointed\":true") == NULL, "metrics claim a save: %s", lines);
  ck_assert_msg(strstr(lines, "\"event\":\"epoch\"") != NULL, "no epoch line: %s", lines);
  free(lines);
  /* with step lines the step itself is named */
  r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--epochs", "3", "--lr", "1e6",
            "--resume", ck, "--checkpoint", ck, "--metrics", m, "--log-every", "1");
  expect_one_line_error(&r, "blueprint train:", " at step ");
  run_free(&r);
  /* --keep-going-nonfinite: every epoch runs, none is checkpointed, exit 1 */
  good = take(ck);
  r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--epochs", "3", "--lr", "1e6",
            "--resume", ck, "--checkpoint", ck, "--keep-going-nonfinite");
  expect_one_line_error(&r, "blueprint train:", "non-finite from epoch 2 on");
  ck_assert_msg(strstr(r.out, "epoch 3/3") && strstr(r.out, "not checkpointed"), "%s", r.out);
  run_free(&r);
  unchanged(&good, ck);
  r = RUN_T("eval", e.model, "--data", e.data, "--quiet", "--checkpoint", ck);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  free(ck), free(m);
  toy_env_close(&e);
}
END_TEST

/* Starts `blueprint ARGS` with stdout and stderr in files under dir. */
static pid_t spawn_bp(const char *dir, const char *const *args) {
  const char *argv[64];
  int argc = 0;
  argv[argc++] = blueprint_path();
  for (int k = 0; args[k]; k++) argv[argc++] = args[k];
  argv[argc] = NULL;
  char *out = path_in(dir, "run.out"), *err = path_in(dir, "run.err");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid;
  ck_assert_int_eq(posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  free(out), free(err);
  return pid;
}

/* Waits until `path` holds `needle` (60 s at most). */
static void wait_for(const char *path, const char *needle) {
  for (int k = 0; k < 6000; k++) {
    size_t n = 0;
    char *s = (char *)read_file(path, &n);
    const int found = s && strstr(s, needle);
    free(s);
    if (found) return;
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  ck_abort_msg("%s never held '%s'", path, needle);
}

/* The exit status of pid (128 + signal when killed), within 60 s. */
static int reap(pid_t pid) {
  for (int k = 0; k < 6000; k++) {
    int ws;
    pid_t got = waitpid(pid, &ws, WNOHANG);
    if (got == pid) return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  ck_abort_msg("the run did not stop within 60 s of the signal");
  return -1;
}

/* SIGINT, then SIGTERM, of a long run: each ends after its step with the
 * checkpoint written, one line saying where and how to resume, no
 * temporary, exit 130 / 143; the resumed run goes on from there. Two
 * signals at once end it by the signal. */
START_TEST(sigint_and_sigterm_checkpoint_and_say_how_to_resume) {
  toy_env e = toy_env_open(SMALL_MODEL, 64, 32, 1);
  char *ck = path_in(e.dir, "ck.bin"), *m = path_in(e.dir, "m.jsonl");
  char *err = path_in(e.dir, "run.err");
  const int sigs[] = {SIGINT, SIGTERM};
  for (int k = 0; k < 2; k++) {
    unlink(m);
    const char *fresh[] = {"train", e.model, "--data", e.data, "--quiet", "--epochs", "100000",
                           "--checkpoint", ck, "--metrics", m, "--log-every", "1", NULL};
    const char *resumed[] = {"train", e.model, "--data", e.data, "--quiet", "--epochs", "100000",
                             "--checkpoint", ck, "--metrics", m, "--log-every", "1",
                             "--resume", ck, NULL};
    pid_t pid = spawn_bp(e.dir, k == 0 ? fresh : resumed);
    wait_for(m, "\"event\":\"step\"");
    ck_assert_int_eq(kill(pid, sigs[k]), 0);
    ck_assert_int_eq(reap(pid), 128 + sigs[k]);
    size_t n = 0;
    char *text = (char *)read_file(err, &n);
    ck_assert_ptr_nonnull(text);
    ck_assert_msg(strstr(text, k == 0 ? "stopped by SIGINT at epoch" : "stopped by SIGTERM") &&
                      strstr(text, "continue with --resume") && strchr(text, '\n') == text + n - 1,
                  "stderr: %s", text);
    free(text);
    ck_assert_int_eq(temps_in(e.dir), 0);
    run_result r = RUN_T("eval", e.model, "--data", e.data, "--quiet", "--checkpoint", ck);
    ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
    run_free(&r);
  }
  /* a second signal does not wait for the step */
  const char *again[] = {"train", e.model, "--data", e.data, "--quiet", "--epochs", "100000",
                         "--metrics", m, "--log-every", "1", NULL};
  unlink(m);
  pid_t pid = spawn_bp(e.dir, again);
  wait_for(m, "\"event\":\"step\"");
  ck_assert_int_eq(kill(pid, SIGINT), 0);
  ck_assert_int_eq(kill(pid, SIGINT), 0);
  const int st = reap(pid);
  ck_assert_msg(st == 128 + SIGINT, "status %d", st);
  free(ck), free(m), free(err);
  toy_env_close(&e);
}
END_TEST

/* The refusal of a checkpoint that does not fit the run counts epochs as
 * the resume line does ("resumed at epoch 1 step 3"). */
START_TEST(the_resume_refusal_numbers_epochs_as_the_resume_line) {
  toy_env e = toy_env_open(SMALL_MODEL, 64, 32, 1);
  char *ck = path_in(e.dir, "ck.bin");
  run_result r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--checkpoint", ck,
                       "--stop-after-steps", "3");
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--resume", ck);
  ck_assert_msg(r.status == 0 && strstr(r.out, "resumed at epoch 1 step 3"), "%s%s", r.out, r.err);
  run_free(&r);
  r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--resume", ck, "--train-limit", "16");
  expect_one_line_error(&r, "blueprint train:", "stands at epoch 1 step 3 (0 epochs done)");
  run_free(&r);
  free(ck);
  toy_env_close(&e);
}
END_TEST

/* The smaller findings: --seed on --resume says which seed the run uses;
 * a NAME.gz beside a different NAME is refused naming both (the same data
 * in both is used); a FIFO as the model file is refused at once. */
START_TEST(a_resume_names_its_seed_and_a_stale_gz_is_refused) {
  toy_env e = toy_env_open(SMALL_MODEL, 64, 32, 1);
  char *ck = path_in(e.dir, "ck.bin");
  run_result r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--checkpoint", ck);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--epochs", "2", "--resume", ck,
            "--seed", "5");
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  ck_assert_msg(strstr(r.out, "--seed 5 is not used: a resumed run keeps its checkpoint's seed 1"),
                "%s", r.out);
  run_free(&r);
  /* labels.gz that inflates to other labels than the plain file's */
  char *plain = path_in(e.data, "t10k-labels-idx1-ubyte");
  char *gz = path_in(e.data, "t10k-labels-idx1-ubyte.gz");
  size_t n = 0;
  unsigned char *bytes = read_file(plain, &n);
  ck_assert_ptr_nonnull(bytes);
  gzFile z = gzopen(gz, "wb");
  ck_assert_ptr_nonnull(z);
  ck_assert_int_eq(gzwrite(z, bytes, (unsigned)n), (int)n);
  ck_assert_int_eq(gzclose(z), Z_OK);
  r = RUN_T("train", e.model, "--data", e.data, "--quiet"); /* the same data: used */
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  bytes[n - 1] = (unsigned char)((bytes[n - 1] + 1) % 10); /* one label differs */
  z = gzopen(gz, "wb");
  ck_assert_int_eq(gzwrite(z, bytes, (unsigned)n), (int)n);
  ck_assert_int_eq(gzclose(z), Z_OK);
  r = RUN_T("train", e.model, "--data", e.data, "--quiet");
  expect_one_line_error(&r, "blueprint train:", "both exist and hold different data");
  ck_assert_msg(strstr(r.err, "t10k-labels-idx1-ubyte.gz and ") != NULL, "%s", r.err);
  run_free(&r);
  unlink(gz);
  char *fifo = path_in(e.dir, "fifo.yaml");
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  r = RUN_T("train", fifo, "--data", e.data, "--quiet");
  expect_one_line_error(&r, "blueprint train:", "not a regular file (a FIFO)");
  run_free(&r);
  free(bytes), free(plain), free(gz), free(ck), free(fifo);
  toy_env_close(&e);
}
END_TEST

/* predict: a PGM sample above its maxval is refused (it was clamped and
 * classified); --limit 1 on an IDX that inflates to 784 MB reads one
 * image (it reached 1 GB before refusing). */
START_TEST(predict_refuses_a_pgm_above_maxval_and_bounds_a_gzip_bomb) {
  toy_env e = toy_env_open(SMALL_MODEL, 64, 32, 1);
  char *ck = path_in(e.dir, "ck.bin");
  run_result r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--checkpoint", ck);
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  char *pgm = path_in(e.dir, "hot.pgm");
  unsigned char img[64 + 28 * 28];
  const int head = snprintf((char *)img, sizeof img, "P5 28 28 100\n");
  memset(img + head, 50, 28 * 28);
  img[head + 28 * 3 + 4] = 200;
  write_file(pgm, img, (size_t)head + 28 * 28);
  r = RUN_T("predict", e.model, "--checkpoint", ck, "--input", pgm, "--data", e.data);
  expect_one_line_error(&r, "blueprint predict: ", "x 4, y 3 is 200, above the maxval 100");
  run_free(&r);
  char *bomb = path_in(e.dir, "bomb.idx.gz");
  gzFile z = gzopen(bomb, "wb1");
  ck_assert_ptr_nonnull(z);
  const unsigned char hdr[16] = {0, 0, 8, 3, 0, 0x0f, 0x42, 0x40, 0, 0, 0, 28, 0, 0, 0, 28};
  ck_assert_int_eq(gzwrite(z, hdr, sizeof hdr), (int)sizeof hdr); /* 1,000,000 images */
  /* 784 MB of zeros: more than the 600 MB a child may reach below */
  static unsigned char zeros[1 << 20];
  for (int k = 0; k < 748; k++)
    ck_assert_int_eq(gzwrite(z, zeros, sizeof zeros), (int)sizeof zeros);
  ck_assert_int_eq(gzclose(z), Z_OK);
  r = RUN_T("predict", e.model, "--checkpoint", ck, "--input", bomb, "--data", e.data,
            "--limit", "1");
  ck_assert_msg(r.status == 0, "status %d: %s", r.status, r.err);
  run_free(&r);
  struct rusage ru;
  ck_assert_int_eq(getrusage(RUSAGE_CHILDREN, &ru), 0);
  ck_assert_msg(ru.ru_maxrss < 600 * 1024, "a child reached %ld KiB", ru.ru_maxrss);
  free(ck), free(pgm), free(bomb);
  toy_env_close(&e);
}
END_TEST

/* tests/modules/hostile.c, built as case k. */
static char *hostile(int k) {
  char name[64];
  snprintf(name, sizeof name, "hostile/hostile%d.so", k);
  return path_in(BP_TEST_MODULES, name);
}

/* A kernel that segfaults or aborts in train: one line naming rank, node,
 * op, impl and module, then the signal; one that calls exit(0) mid-step:
 * the same report and exit status 70, never 0. */
START_TEST(a_kernel_that_crashes_or_exits_in_train_is_named) {
  toy_env e = toy_env_open(SMALL_MODEL, 64, 32, 1);
  static const struct {
    int k, status;
    const char *what;
  } cases[] = {{1, 128 + SIGSEGV, "SIGSEGV in a kernel: "},
               {2, 128 + SIGABRT, "SIGABRT in a kernel: "},
               {3, 70, "a kernel called exit() during a step: "}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *mod = hostile(cases[i].k);
    /* unchecked: the pin check would meet the crash first (test_validate_pins) */
    run_result r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--plugin", mod,
                         "--kernels", "relu.fwd=hostile", "--trust-pins");
    ck_assert_msg(r.status == cases[i].status, "case %d: status %d (stderr: %s)", cases[i].k,
                  r.status, r.err);
    char want[4300];
    snprintf(want, sizeof want,
             "blueprint train: %srank 0, variant 'train', node 'relu1.fwd', op relu.fwd, impl "
             "hostile, module %s\n",
             cases[i].what, mod);
    ck_assert_msg(strstr(r.err, want) != NULL, "want [%s] in [%s]", want, r.err);
    run_free(&r);
    free(mod);
  }
  toy_env_close(&e);
}
END_TEST

/* validate: the parent kills a child that outlives --case-timeout, whatever
 * it does with its signals, and every failed row says why (a timeout, the
 * signal, an exit(0) before the case finished). */
START_TEST(validate_kills_a_hanging_kernel_and_names_every_failure) {
  static const struct {
    int k;
    const char *why;
  } cases[] = {{4, "timed out after 0.5 s"},
               {3, "the kernel ended the process (exit status 0) before the case finished"},
               {1, "crashed with SIGSEGV"},
               {2, "crashed with signal 6"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *mod = hostile(cases[i].k);
    const time_t t0 = time(NULL);
    run_result r = RUN_T("validate", "--plugin", mod, "--impl", "hostile", "--op", "relu.fwd",
                         "--case-timeout", "0.5");
    ck_assert_msg(r.status == 1, "case %d: status %d (stderr: %s)", cases[i].k, r.status, r.err);
    ck_assert_msg(strstr(r.out, cases[i].why) != NULL, "want '%s' in: %s", cases[i].why, r.out);
    ck_assert_msg(strstr(r.out, "FAIL\n") == NULL, "a bare FAIL: %s", r.out);
    ck_assert_msg(time(NULL) - t0 < 30, "case %d took %lld s", cases[i].k,
                  (long long)(time(NULL) - t0));
    run_free(&r);
    free(mod);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("run_guards");
  TCase *tc = tcase_create("run_guards");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, an_output_that_names_an_input_or_another_output_is_refused_untouched);
  tcase_add_test(tc, a_symlinked_checkpoint_replaces_its_target_and_keeps_the_link);
  tcase_add_test(tc, an_output_in_a_missing_or_unwritable_directory_is_refused_before_training);
  tcase_add_test(tc, a_diverging_run_stops_and_keeps_the_last_good_checkpoint);
  tcase_add_test(tc, sigint_and_sigterm_checkpoint_and_say_how_to_resume);
  tcase_add_test(tc, the_resume_refusal_numbers_epochs_as_the_resume_line);
  tcase_add_test(tc, a_kernel_that_crashes_or_exits_in_train_is_named);
  tcase_add_test(tc, a_resume_names_its_seed_and_a_stale_gz_is_refused);
  tcase_add_test(tc, predict_refuses_a_pgm_above_maxval_and_bounds_a_gzip_bomb);
  tcase_add_test(tc, validate_kills_a_hanging_kernel_and_names_every_failure);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
