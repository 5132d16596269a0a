/* `blueprint export MODEL --checkpoint FILE -o OUT.onnx`: writes a trained
 * network as an ONNX inference graph (model_onnx.h; docs/onnx.md): the
 * weights `blueprint eval` would use (the EMA copies when the run kept
 * them), FP32, BatchNormalization with the running statistics, and the
 * input's normalization in the file's metadata.
 *
 * The plan must be the checkpoint's, as for eval: pass the training run's
 * --batch, --eval-batch, --ranks, --optimizer, --ema and --amp when they
 * differ from the model file's.
 *
 * Exit status: 0 written; 1 the model, the checkpoint or the write
 * failed; 2 the command line is wrong. */
#include <stdio.h>
#include <string.h>

#include "blueprint/model_onnx.h"
#include "blueprint/train.h"
#include "cli_util.h"
#include "commands.h"
#include "path_guard.h"
#include "train_args.h"

static const char usage_text[] =
    "usage: blueprint export MODEL --checkpoint FILE -o OUT.onnx [options]\n"
    "\n"
    "Writes the network of MODEL with the weights of the checkpoint FILE as an\n"
    "ONNX inference graph (opset 17, FP32; input [N, C, H, W] normalized as\n"
    "the file's metadata says, output the logits [N, classes]; docs/onnx.md).\n"
    "\n"
    "  --checkpoint FILE   the trained checkpoint (required; only read). An\n"
    "                      ONNX MODEL may go without: its own initializers\n"
    "  -o, --output FILE   the ONNX file to write (required; replaced atomically)\n"
    "  --data DIR          the training set whose statistics normalized the\n"
    "                      input (default: Fashion-MNIST's published values)\n"
    "  --batch B, --eval-batch B, --ranks R, --optimizer NAME, --ema, --amp\n"
    "                      as in the training run, when not the model file's\n"
    "  --plugin PATH       as for train\n"
    "  -h, --help          print this help\n"
    "\n"
    "Exit status: 0 written, 1 export failed, 2 bad command line.\n";

typedef struct export_reader {
  const bp_trainer *trainer;
  int ema; /* 1: read each parameter's EMA copy where it has one */
} export_reader;

static bp_status read_tensor(void *user, const char *name, float *dst, uint64_t count) {
  const export_reader *r = user;
  char ema[BP_NAME_MAX + 8];
  snprintf(ema, sizeof ema, "%s.ema", name);
  if (r->ema && bp_plan_find_tensor(bp_trainer_plan(r->trainer), ema) >= 0)
    return bp_trainer_read_tensor(r->trainer, ema, dst, count);
  return bp_trainer_read_tensor(r->trainer, name, dst, count);
}

/* The input's normalization, as the trainer applied it (train.c load_data). */
static bp_status input_norm(const bp_cli_train_args *a, const bp_model *m,
                            bp_onnx_export_options *o) {
  bp_data_norm norm = {
      .channels = 1, .mean = {BP_FASHION_MNIST_MEAN}, .std = {BP_FASHION_MNIST_STD}};
  if (a->options.data_dir) {
    bp_dataset *train = NULL;
    const bp_dataset_info shape = {1, m->height, m->width, m->channels, (int)m->classes};
    bp_status st = bp_dataset_open(a->options.data_dir, BP_DATA_TRAIN, &shape, &train);
    if (st == BP_OK) st = bp_dataset_stats(train, &norm);
    bp_dataset_destroy(train);
    if (st != BP_OK) return st;
  }
  if (norm.channels > BP_ONNX_MAX_CHANNELS)
    return bp_fail(BP_ERR_UNSUPPORTED,
                   "ONNX export states the normalization of at most %d "
                   "channels; the data has %d",
                   BP_ONNX_MAX_CHANNELS, norm.channels);
  o->channels = norm.channels;
  for (int c = 0; c < norm.channels; c++) o->mean[c] = norm.mean[c], o->std[c] = norm.std[c];
  return BP_OK;
}

int bp_cmd_export(int argc, char **argv) {
  /* -o FILE is export's own; the rest are eval's options */
  const char *out = NULL;
  char *rest[argc > 0 ? argc : 1];
  int n = 0;
  for (int i = 0; i < argc; i++) {
    if (i > 0 && (strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0)) {
      if (i + 1 >= argc) {
        bp_cli_report("export", "%s needs a file name", argv[i]);
        return BP_CLI_EXIT_USAGE;
      }
      out = argv[++i];
      continue;
    }
    rest[n++] = argv[i];
  }
  int help = 0;
  for (int i = 1; i < n; i++) help |= strcmp(rest[i], "-h") == 0 || strcmp(rest[i], "--help") == 0;
  if (help) {
    fputs(usage_text, stdout);
    return fflush(stdout) == 0 ? 0 : BP_CLI_EXIT_RUN;
  }
  bp_cli_train_args a;
  if (bp_cli_train_parse(n, rest, 1, &a) != 0) return BP_CLI_EXIT_USAGE;
  if (!out) {
    bp_cli_report("export", "-o FILE is required (the ONNX file to write)");
    return BP_CLI_EXIT_USAGE;
  }
  if (!bp_onnx_available()) {
    bp_cli_report("export",
                  "this blueprint was built without ONNX support (install "
                  "libprotobuf-c-dev, protobuf-c-compiler and libonnx-dev, then configure again)");
    return BP_CLI_EXIT_RUN;
  }
  const bp_path_use uses[] = {
      {a.model_path, "the model file", BP_PATH_INPUT, NULL},
      {a.options.checkpoint_path, "--checkpoint", BP_PATH_INPUT, NULL},
      {a.options.data_dir, "--data", BP_PATH_INPUT_DIR, NULL},
      {out, "-o", BP_PATH_OUTPUT, NULL},
  };
  const int clash = bp_cli_check_paths("export", uses, 4);
  if (clash) return clash;
  a.options.resume_path = a.options.checkpoint_path; /* read, never written */
  a.options.checkpoint_path = NULL;
  a.options.eval_only = 1;
  bp_trainer *t = NULL;
  bp_status st = bp_trainer_create_from_file(a.model_path, &a.options, &t);
  const bp_model *m = st == BP_OK ? bp_trainer_model(t) : NULL;
  const int ema = m && m->train.ema && a.options.eval_ema != 0;
  bp_onnx_export_options o = {
      .source = a.options.resume_path ? a.options.resume_path : a.model_path,
      .weights = ema ? "ema" : "master"};
  if (st == BP_OK) st = input_norm(&a, m, &o);
  export_reader r = {.trainer = t, .ema = ema};
  if (st == BP_OK) st = bp_onnx_save(m, read_tensor, &r, &o, out);
  if (st != BP_OK) {
    bp_cli_report("export", "%s", bp_last_error());
    bp_trainer_destroy(t);
    return BP_CLI_EXIT_RUN;
  }
  printf("wrote %s: %s, %d layers, %s weights, input (pixel / 255 - %.4f) / %.4f\n", out, m->name,
         m->layer_count, o.weights, (double)o.mean[0], (double)o.std[0]);
  bp_trainer_destroy(t);
  return fflush(stdout) == 0 ? 0 : BP_CLI_EXIT_RUN;
}
