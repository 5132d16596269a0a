/* Fuzz entry functions (entries.h). Inputs that name files go through a
 * memfd, so the readers run exactly as they do on a file. */
#include "entries.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "blueprint/checkpoint.h"
#include "blueprint/data.h"
#include "blueprint/model.h"
#include "blueprint/model_onnx.h"
#include "blueprint/model_yaml.h"
#include "blueprint/plan.h"
#include "elf-check-impl.h"
#include "train_args.h"

/* A memfd holding the bytes; its path (/proc/self/fd/N) goes to `path`. */
static int memfile(const uint8_t *data, size_t size, char path[64]) {
  int fd = memfd_create("bp-fuzz", MFD_CLOEXEC);
  if (fd < 0) return -1;
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) {
      close(fd);
      return -1;
    }
    done += (size_t)n;
  }
  snprintf(path, 64, "/proc/self/fd/%d", fd);
  return fd;
}

int bp_fuzz_model(const uint8_t *data, size_t size) {
  bp_model *m = NULL;
  if (bp_model_parse((const char *)data, size, "fuzz.yaml", &m) != BP_OK) return 0;
  bp_compile_options co = bp_compile_options_from_model(m);
  /* the model's own batch may be huge: planning is arithmetic only */
  bp_plan *p = NULL;
  if (bp_model_compile(m, &co, &p) == BP_OK) bp_plan_destroy(p);
  bp_model_destroy(m);
  return 0;
}

int bp_fuzz_onnx(const uint8_t *data, size_t size) {
  bp_model *m = NULL;
  if (bp_onnx_parse(data, size, "fuzz.onnx", &m) != BP_OK) return 0;
  bp_compile_options co = bp_compile_options_from_model(m);
  bp_plan *p = NULL;
  if (bp_model_compile(m, &co, &p) == BP_OK) bp_plan_destroy(p);
  bp_model_destroy(m);
  return 0;
}

int bp_fuzz_idx(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  size_t split = (size_t)(data[0] | data[1] << 8);
  data += 2;
  size -= 2;
  if (split > size) split = size;
  char images[64], labels[64];
  int fi = memfile(data, split, images);
  int fl = memfile(data + split, size - split, labels);
  if (fi >= 0 && fl >= 0) {
    bp_dataset *d = NULL;
    if (bp_dataset_load_idx(images, labels, 0, &d) == BP_OK) bp_dataset_destroy(d);
  }
  if (fi >= 0) close(fi);
  if (fl >= 0) close(fl);
  return 0;
}

int bp_fuzz_elf(const uint8_t *data, size_t size) {
  char why[512];
  (void)bp_elf_check_mem(data, size, why, sizeof why);
  return 0;
}

int bp_fuzz_cli(const uint8_t *data, size_t size) {
  if (size < 1 || size > 4096) return 0;
  int eval = data[0] & 1;
  char *text = malloc(size); /* the arguments, NUL-terminated */
  char **argv = calloc(size + 2, sizeof *argv);
  if (!text || !argv) {
    free(text);
    free(argv);
    return 0;
  }
  memcpy(text, data + 1, size - 1);
  text[size - 1] = '\0';
  int argc = 0;
  argv[argc++] = eval ? "eval" : "train";
  for (size_t i = 0; i < size - 1;) {
    argv[argc++] = text + i;
    i += strlen(text + i) + 1;
  }
  argv[argc] = NULL;
  bp_cli_train_args a;
  (void)bp_cli_train_parse(argc, argv, eval, &a);
  free(argv);
  free(text);
  return 0;
}

int bp_fuzz_checkpoint(const uint8_t *data, size_t size) {
  char path[64];
  int fd = memfile(data, size, path);
  if (fd < 0) return 0;
  bp_checkpoint_info info;
  (void)bp_checkpoint_read_info(path, &info);
  close(fd);
  return 0;
}

const bp_fuzz_target bp_fuzz_targets[] = {
    {.name = "model", .run = bp_fuzz_model},
    {.name = "idx", .run = bp_fuzz_idx},
    {.name = "elf", .run = bp_fuzz_elf},
    {.name = "cli", .run = bp_fuzz_cli},
    {.name = "checkpoint", .run = bp_fuzz_checkpoint},
    {.name = "onnx", .run = bp_fuzz_onnx},
    {.name = NULL, .run = NULL},
};
