/* Helpers of the training tests; see run_util.h. */
#include "run_util.h"

#include "blueprint/data.h"
#include "blueprint/model_yaml.h"
#include "blueprint/registry.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static void append(char **buf, size_t *len, const char *src, size_t n) {
  char *grown = realloc(*buf, *len + n + 1);
  ck_assert_ptr_nonnull(grown);
  memcpy(grown + *len, src, n);
  *len += n;
  grown[*len] = '\0';
  *buf = grown;
}

char *path_in(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *p = malloc(a + b + 2);
  ck_assert_ptr_nonnull(p);
  memcpy(p, dir, a);
  p[a] = '/';
  memcpy(p + a + 1, name, b + 1);
  return p;
}

run_result run_exe(const char *exe_name, const char *const *args) {
  const char *bin = getenv("BP_BINARY_DIR");
  ck_assert_msg(bin && *bin, "BP_BINARY_DIR is not set (run through ctest)");
  char *exe = path_in(bin, exe_name);
  const char *argv[96];
  int argc = 0;
  argv[argc++] = exe;
  for (int i = 0; args[i]; i++) {
    ck_assert_int_lt(argc, 95);
    argv[argc++] = args[i];
  }
  argv[argc] = NULL;
  run_result r = run_argv(argv);
  free(exe);
  return r;
}

run_result run_argv(const char *const *argv) {
  int po[2], pe[2];
  ck_assert_int_eq(pipe(po), 0);
  ck_assert_int_eq(pipe(pe), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, po[1], 1);
  posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
  posix_spawn_file_actions_addclose(&fa, po[0]);
  posix_spawn_file_actions_addclose(&fa, pe[0]);
  pid_t pid;
  int rc = posix_spawnp(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  ck_assert_msg(rc == 0, "cannot run %s: %s", argv[0], strerror(rc));
  close(po[1]);
  close(pe[1]);
  run_result r = {0, NULL, NULL, 0, 0};
  append(&r.out, &r.out_len, "", 0);
  append(&r.err, &r.err_len, "", 0);
  struct pollfd fds[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) {
      ck_assert_int_eq(errno, EINTR);
      continue;
    }
    for (int k = 0; k < 2; k++) {
      if (fds[k].fd < 0 || !(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      ssize_t n = read(fds[k].fd, buf, sizeof buf);
      if (n > 0) {
        if (k)
          append(&r.err, &r.err_len, buf, (size_t)n);
        else
          append(&r.out, &r.out_len, buf, (size_t)n);
      } else if (n == 0 || errno != EINTR) {
        close(fds[k].fd);
        fds[k].fd = -1;
        open_fds--;
      }
    }
  }
  int ws;
  while (waitpid(pid, &ws, 0) < 0) ck_assert_int_eq(errno, EINTR);
  r.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
  return r;
}

int sh(const char *fmt, ...) {
  char cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  fprintf(stderr, "+ %s\n", cmd);
  int rc = system(cmd);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

void run_free(run_result *r) {
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
}

void expect_one_line_error(const run_result *r, const char *prefix, const char *needle) {
  ck_assert_msg(r->status != 0 && r->status < 128, "status %d (stderr: %s)", r->status, r->err);
  const size_t n = strlen(r->err);
  ck_assert_msg(n > 0 && r->err[n - 1] == '\n' && strchr(r->err, '\n') == r->err + n - 1,
                "stderr is not exactly one line: [%s]", r->err);
  ck_assert_msg(strncmp(r->err, prefix, strlen(prefix)) == 0, "stderr lacks the prefix '%s': %s",
                prefix, r->err);
  if (needle)
    ck_assert_msg(strstr(r->err, needle) != NULL, "stderr lacks '%s': %s", needle, r->err);
}

char *tmp_dir_create(void) {
  const char *base = getenv("TMPDIR");
  char *templ = path_in(base && *base ? base : "/tmp", "bp-train-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(templ));
  return templ;
}

void tmp_dir_remove(char *dir) {
  if (!dir) return;
  char *cmd = malloc(strlen(dir) + 16);
  ck_assert_ptr_nonnull(cmd);
  sprintf(cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
  free(cmd);
  free(dir);
}

static void put_be32(FILE *f, uint32_t v) {
  const unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                              (unsigned char)(v >> 8), (unsigned char)v};
  ck_assert_int_eq(fwrite(b, 1, 4, f), 4);
}

static void write_split(const char *dir, const char *images, const char *labels, int count,
                        uint64_t *state) {
  char *ip = path_in(dir, images), *lp = path_in(dir, labels);
  FILE *fi = fopen(ip, "wb"), *fl = fopen(lp, "wb");
  ck_assert_ptr_nonnull(fi);
  ck_assert_ptr_nonnull(fl);
  put_be32(fi, 0x00000803);
  put_be32(fi, (uint32_t)count);
  put_be32(fi, 28);
  put_be32(fi, 28);
  put_be32(fl, 0x00000801);
  put_be32(fl, (uint32_t)count);
  unsigned char img[28 * 28];
  for (int i = 0; i < count; i++) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    const int label = (int)((*state >> 33) % 10);
    for (int p = 0; p < 28 * 28; p++) {
      *state = *state * 6364136223846793005ull + 1442695040888963407ull;
      img[p] = (unsigned char)((*state >> 40) % 64);
    }
    for (int x = 2; x < 26; x++) img[(2 + 2 * label) * 28 + x] = 255;
    ck_assert_int_eq(fwrite(img, 1, sizeof img, fi), sizeof img);
    const unsigned char l = (unsigned char)label;
    ck_assert_int_eq(fwrite(&l, 1, 1, fl), 1);
  }
  ck_assert_int_eq(fclose(fi), 0);
  ck_assert_int_eq(fclose(fl), 0);
  free(ip);
  free(lp);
}

void write_toy_mnist(const char *dir, int train, int test, uint64_t seed) {
  uint64_t state = seed * 2654435761ull + 1;
  write_split(dir, "train-images-idx3-ubyte", "train-labels-idx1-ubyte", train, &state);
  write_split(dir, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", test, &state);
}

unsigned char *read_file(const char *path, size_t *size_out) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *buf = NULL;
  size_t len = 0;
  char chunk[65536];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) append((char **)&buf, &len, chunk, n);
  fclose(f);
  if (!buf) append((char **)&buf, &len, "", 0);
  *size_out = len;
  return buf;
}

int same_file(const char *a, const char *b) {
  size_t na = 0, nb = 0;
  unsigned char *x = read_file(a, &na), *y = read_file(b, &nb);
  const int same = x && y && na == nb && memcmp(x, y, na) == 0;
  free(x);
  free(y);
  return same;
}

void write_file(const char *path, const void *data, size_t size) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fwrite(data, 1, size, f), size);
  ck_assert_int_eq(fclose(f), 0);
}

double jsonl_number(const char *path, const char *event, int n, const char *key, int *count) {
  size_t size = 0;
  char *text = (char *)read_file(path, &size);
  ck_assert_msg(text != NULL, "no metrics file %s", path);
  char ev[64], k[80];
  snprintf(ev, sizeof ev, "\"event\":\"%s\"", event);
  snprintf(k, sizeof k, "\"%s\":", key);
  double value = NAN;
  int seen = 0;
  for (char *line = text; line && *line;) {
    char *end = strchr(line, '\n');
    if (end) *end = '\0';
    if (strstr(line, ev)) {
      if (seen == n) {
        const char *at = strstr(line, k);
        if (at && strncmp(at + strlen(k), "null", 4) != 0) value = strtod(at + strlen(k), NULL);
      }
      seen++;
    }
    line = end ? end + 1 : NULL;
  }
  free(text);
  if (count) *count = seen;
  return value;
}

int have_fashion_mnist(void) {
  return access(BP_DATA_DEFAULT_DIR "/train-images-idx3-ubyte.gz", R_OK) == 0 &&
         access(BP_DATA_DEFAULT_DIR "/t10k-images-idx3-ubyte.gz", R_OK) == 0;
}

toy_env toy_env_open(const char *model_text, int train, int test, uint64_t seed) {
  toy_env e;
  e.dir = tmp_dir_create();
  e.data = path_in(e.dir, "data");
  ck_assert_int_eq(mkdir(e.data, 0700), 0);
  write_toy_mnist(e.data, train, test, seed);
  e.model = path_in(e.dir, "model.yaml");
  write_file(e.model, model_text, strlen(model_text));
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_msg(src && *src, "BP_SOURCE_DIR is not set (run through ctest)");
  e.mlp = path_in(src, "models/mlp.yaml");
  return e;
}

void toy_env_close(toy_env *e) {
  free(e->data);
  free(e->model);
  free(e->mlp);
  tmp_dir_remove(e->dir);
}

int mpirun_ready(void) {
  if (system("command -v mpirun >/dev/null 2>&1") != 0) {
    printf("SKIP: mpirun is not installed (apt-get install openmpi-bin)\n");
    return 0;
  }
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0); /* CI runs as root: Open MPI asks twice */
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  return 1;
}

int shm_usable(size_t bytes) {
  char name[64];
  snprintf(name, sizeof name, "/blueprint-test-%ld", (long)getpid());
  const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return 0;
  const int ok = posix_fallocate(fd, 0, (off_t)bytes) == 0;
  close(fd);
  shm_unlink(name);
  return ok;
}

/* The shipped model files (models/NAME.yaml), sorted, NULL-terminated. */
char **shipped_models(void) {
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_msg(src && *src, "BP_SOURCE_DIR is not set (run through ctest)");
  char *dir = path_in(src, "models");
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  char **names = calloc(64, sizeof *names);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL && n < 63;) {
    const size_t len = strlen(e->d_name);
    if (len <= 5 || strcmp(e->d_name + len - 5, ".yaml") != 0) continue;
    names[n++] = path_in(dir, e->d_name);
  }
  closedir(d);
  free(dir);
  for (int i = 0; i < n; i++) /* sorted: a stable report */
    for (int j = i + 1; j < n; j++)
      if (strcmp(names[j], names[i]) < 0) {
        char *t = names[i];
        names[i] = names[j];
        names[j] = t;
      }
  ck_assert_int_ge(n, 3);
  return names;
}

void shipped_models_free(char **names) {
  for (int i = 0; names[i]; i++) free(names[i]);
  free(names);
}

bp_registry *load_modules(const char *const *paths, int count) {
  bp_registry *r = NULL;
  ck_assert_int_eq(bp_registry_create(&r), BP_OK);
  for (int i = 0; i < count; i++)
    ck_assert_msg(bp_registry_load(r, paths[i]) == BP_OK, "loading %s: %s", paths[i],
                  bp_last_error());
  return r;
}

const char *blueprint_path(void) {
  static char path[4096];
  const char *dir = getenv("BP_BINARY_DIR");
  ck_assert_msg(dir != NULL, "BP_BINARY_DIR is not set (run through ctest)");
  snprintf(path, sizeof path, "%s/blueprint", dir);
  return path;
}

int temps_in(const char *dir) {
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) n += strstr(e->d_name, ".tmp") != NULL;
  closedir(d);
  return n;
}
