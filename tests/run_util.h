/* Helpers of the tests that run the executable (test_cli.c, test_train*.c): running the built
 * `blueprint` executable with its output captured, temporary directories,
 * small MNIST-format datasets written on the fly, file comparison and the
 * metrics JSON lines. */
#ifndef BP_TESTS_RUN_UTIL_H
#define BP_TESTS_RUN_UTIL_H

#include <stddef.h>
#include <stdint.h>

typedef struct run_result {
  int status; /* exit status; 128 + signal when killed (a crash) */
  char *out, *err;          /* NUL-terminated */
  size_t out_len, err_len;  /* bytes of out and err */
} run_result;

/* Runs BP_BINARY_DIR/<exe> with args (NULL-terminated) and captures both
 * streams. `exe` is relative to the build directory ("blueprint"). */
run_result run_exe(const char *exe, const char *const *args);
/* Runs argv[0] (searched in PATH) with argv (NULL-terminated), captured the same way. */
run_result run_argv(const char *const *argv);
/* Runs a shell command built from fmt (echoed to stderr); returns its exit
 * status, 128 when it did not exit normally. */
int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define RUN(...) run_exe("blueprint", (const char *const[]){__VA_ARGS__, NULL})
void run_free(run_result *r);

/* Asserts a failure: non-zero status that is not a crash, nothing on
 * stdout... (stdout may hold a header), exactly one line on stderr that
 * starts with `prefix` and contains `needle` (NULL: anything). */
void expect_one_line_error(const run_result *r, const char *prefix, const char *needle);

/* For the tests that start `mpirun`: 0 (with a SKIP line on stdout) where
 * it is not installed; else sets what Open MPI needs here (as root, more
 * processes than cores, no single-copy transport, which needs ptrace rights
 * a container may lack; each only where the environment has none) and
 * returns 1. */
int mpirun_ready(void);

/* Whether this machine lets a process make a shared memory file of `bytes`
 * in /dev/shm (where mpirun ranks on one machine share their arenas'
 * collective spans; a container may have none, or a small one). */
int shm_usable(size_t bytes);

/* A fresh directory under $TMPDIR (or /tmp); removed by tmp_dir_remove. */
char *tmp_dir_create(void);
void tmp_dir_remove(char *dir); /* frees dir */
/* dir + "/" + name, malloc'ed. */
char *path_in(const char *dir, const char *name);

/* Writes train-*-idx*-ubyte and t10k-* (uncompressed) into dir: `train` and
 * `test` 28x28 images of 10 classes whose class shows as a bright bar, at
 * a row that depends on the label, over noise; learnable in a few steps. */
void write_toy_mnist(const char *dir, int train, int test, uint64_t seed);

/* A small model with every kind of state a rank or a checkpoint holds
 * (conv, batch norm, pooling, fc), for toy data; a test appends its own
 * "train: {...}" line. */
#define TOY_BN_MODEL_LAYERS                                                     \
  "name: small\n"                                                               \
  "input: {height: 28, width: 28, channels: 1, classes: 10}\n"                  \
  "layers:\n"                                                                   \
  "  - {type: conv, name: conv1, filters: 4, kernel: 3, pad: 1, bias: false}\n" \
  "  - {type: batchnorm, name: bn1}\n"                                          \
  "  - {type: relu, name: relu1}\n"                                             \
  "  - {type: maxpool, name: pool1, kernel: 2}\n"                               \
  "  - {type: fc, name: fc, units: 10}\n"                                       \
  "  - {type: softmax_ce, name: loss, label_smoothing: 0.1}\n"

/* A fresh temporary directory with toy MNIST data in dir/data
 * (write_toy_mnist(train, test, seed)), one model file written from
 * `model_text` at dir/model.yaml, and the shipped models/mlp.yaml path. */
typedef struct toy_env {
  char *dir, *data, *model, *mlp;
} toy_env;
toy_env toy_env_open(const char *model_text, int train, int test, uint64_t seed);
void toy_env_close(toy_env *e); /* removes the directory */

/* Reads a whole file (NULL when missing), NUL-terminated; *size_out its bytes. */
unsigned char *read_file(const char *path, size_t *size_out);
/* 1 when both files exist and hold the same bytes. */
int same_file(const char *a, const char *b);
/* Writes `size` bytes to path. */
void write_file(const char *path, const void *data, size_t size);

/* The number after "key": in the n-th line (from 0) of a JSONL file whose
 * "event" is `event`; NAN when absent. Counts of such lines via *count. */
double jsonl_number(const char *path, const char *event, int n, const char *key, int *count);

/* 1 when the Fashion-MNIST package's files are installed. */
int have_fashion_mnist(void);

/* The shipped model files (BP_SOURCE_DIR/models/NAME.yaml), sorted,
 * NULL-terminated; at least three. A model refused only for naming a ViT
 * layer type (layernorm, gelu_tanh, pos_embed, attention) this build lacks
 * is left out, with a note on stdout. */
char **shipped_models(void);
void shipped_models_free(char **paths);

/* A registry with the module files `paths` loaded (no discovery); fails
 * the test naming the file that does not load. */
struct bp_registry *load_modules(const char *const *paths, int count);

/* BP_BINARY_DIR/blueprint. */
const char *blueprint_path(void);
/* `blueprint ARGS...` under timeout 60 (exit 124 on a hang). */
#define RUN_T(...) \
  run_argv((const char *const[]){"timeout", "60", blueprint_path(), __VA_ARGS__, NULL})
/* Entries of `dir` whose name contains ".tmp" (a save's temporaries). */
int temps_in(const char *dir);

#endif
