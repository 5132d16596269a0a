/* `blueprint predict MODEL --checkpoint FILE --input FILE`: classifies
 * images with a trained checkpoint, one image at a time (the batch-1
 * latency path of a deployed model), and prints the top classes with their
 * probabilities (a table, or --json: docs/predict.md).
 *
 * The plan is the training run's (the model file's settings, or --batch,
 * --eval-batch and --optimizer as given to train), so the checkpoint's plan
 * hash matches, plus an evaluation variant of batch 1: the compiler's
 * "eval_last" variant holds eval_size % eval_batch images, so an eval_size
 * of eval_batch + 1 gives it one image (with an eval batch of 1, "eval" is
 * that variant). Its graph is the evaluation forward pass; the kernels are
 * chosen as for eval (priorities, --kernels pins), so the fastest forward
 * kernels (XNNPACK where present) serve it.
 *
 * Latency: the fill of the input and the evaluation pass of each image,
 * after one untimed image (kernels pack weights and set up on their first
 * run); median, mean and minimum are printed.
 *
 * Input: an IDX image file (MNIST format, plain or gzip'd; every image, or
 * the first --limit) or a binary PGM (P5, 8-bit) of the model's input
 * size. Pixels are normalized as training did: with the statistics of the
 * training images of --data DIR, else Fashion-MNIST's.
 *
 * Exit status: 0 classified; 1 the model, the checkpoint, the input or a
 * kernel failed (one line on stderr); 2 the command line is wrong. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "blueprint/arena.h"
#include "blueprint/checkpoint.h"
#include "blueprint/data.h"
#include "blueprint/exec.h"
#include "blueprint/graph.h"
#include "blueprint/infile.h"
#include "blueprint/kernel_checks.h"
#include "blueprint/model.h"
#include "blueprint/model_onnx.h"
#include "blueprint/model_yaml.h"
#include "blueprint/registry.h"
#include "blueprint/session.h"
#include "blueprint/threads.h"
#include "cli_util.h"
#include "commands.h"
#include "env_options.h"
#include "kernel_report.h"
#include "train_args.h"

static const char usage_text[] =
    "usage: blueprint predict MODEL --checkpoint FILE --input FILE [options]\n"
    "       blueprint predict MODEL.onnx --input FILE [options]  (its initializers)\n"
    "\n"
    "Classifies the images of FILE with the checkpoint of MODEL, one image at a\n"
    "time, and prints the most likely classes with their probabilities.\n"
    "\n"
    "  --checkpoint FILE   the trained checkpoint (required; only read)\n"
    "  --input FILE        an IDX image file (MNIST format, may be gzip'd) or a\n"
    "                      binary PGM (P5, 8-bit) of the model's input size\n"
    "  --top K             classes to print per image (3; at most the classes)\n"
    "  --limit N           only the first N images of an IDX file\n"
    "  --json              one JSON object instead of the table (docs/predict.md)\n"
    "  --verbose           first print the kernel of every node of the evaluation\n"
    "                      pass (on stderr with --json)\n"
    "  --data DIR          the MNIST-format data the model was trained on: its\n"
    "                      training images' statistics normalize the pixels\n"
    "                      (default: Fashion-MNIST's; synthetic: those of\n"
    "                      uniform bytes)\n"
    "  --batch B, --eval-batch B, --optimizer NAME\n"
    "                      as in the training run, when not the model file's\n"
    "  --threads N         threads the kernels may use (default 1: one image is\n"
    "                      too little work to split)\n"
    "  --kernels PINS      pin kernels: op_glob=impl,... (default: BP_KERNELS)\n"
    "  --trust-pins        run pinned kernels unchecked (default: checked on their\n"
    "                      node's shapes first, as for train; docs/validate.md)\n"
    "  --plugin PATH       load this op module (file or directory) too\n"
    "  -h, --help          print this help\n"
    "\n"
    "Exit status: 0 ok, 1 prediction failed, 2 bad command line.\n";

#define PREDICT_PLUGINS_MAX 16

typedef struct predict_args {
  const char *model, *checkpoint, *input, *data, *pins, *optimizer;
  const char *plugins[PREDICT_PLUGINS_MAX];
  int plugin_count;
  int64_t top, limit, batch, eval_batch, threads;
  int json, help, verbose, trust_pins;
} predict_args;

static int parse_args(int argc, char **argv, predict_args *a) {
  memset(a, 0, sizeof *a);
  a->top = 3;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    const char *value = i + 1 < argc ? argv[i + 1] : NULL;
    int64_t *number = NULL;
    int64_t min = 1;
    const char **text = NULL;
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
      a->help = 1;
      return 0;
    } else if (strcmp(arg, "--json") == 0) {
      a->json = 1;
      continue;
    } else if (strcmp(arg, "--verbose") == 0) {
      a->verbose = 1;
      continue;
    } else if (strcmp(arg, "--trust-pins") == 0) {
      a->trust_pins = 1;
      continue;
    } else if (strcmp(arg, "--checkpoint") == 0) {
      text = &a->checkpoint;
    } else if (strcmp(arg, "--input") == 0) {
      text = &a->input;
    } else if (strcmp(arg, "--data") == 0) {
      text = &a->data;
    } else if (strcmp(arg, "--kernels") == 0) {
      text = &a->pins;
    } else if (strcmp(arg, "--optimizer") == 0) {
      text = &a->optimizer;
    } else if (strcmp(arg, "--plugin") == 0) {
      if (a->plugin_count == PREDICT_PLUGINS_MAX) {
        bp_cli_report("predict", "more than %d --plugin paths", PREDICT_PLUGINS_MAX);
        return -1;
      }
      text = &a->plugins[a->plugin_count++];
    } else if (strcmp(arg, "--top") == 0) {
      number = &a->top;
    } else if (strcmp(arg, "--limit") == 0) {
      number = &a->limit;
    } else if (strcmp(arg, "--threads") == 0) {
      number = &a->threads;
    } else if (strcmp(arg, "--batch") == 0) {
      number = &a->batch;
    } else if (strcmp(arg, "--eval-batch") == 0) {
      number = &a->eval_batch;
    } else if (arg[0] == '-' && arg[1] != '\0') {
      bp_cli_report("predict", "unknown option '%s' (try --help)", arg);
      return -1;
    } else {
      if (a->model) {
        bp_cli_report("predict", "one MODEL only: '%s' and '%s'", a->model, arg);
        return -1;
      }
      a->model = arg;
      continue;
    }
    if (!value) {
      bp_cli_report("predict", "%s needs a value", arg);
      return -1;
    }
    if (text) *text = value;
    if (number && bp_cli_parse_int(value, min, number) != 0) {
      bp_cli_report("predict", "%s: '%s' is not an integer >= %lld", arg, value, (long long)min);
      return -1;
    }
    i++;
  }
  const int onnx = a->model && bp_model_path_is_onnx(a->model); /* may run its initializers */
  if (!a->model || (!a->checkpoint && !onnx) || !a->input) {
    bp_cli_report("predict", "%s", !a->model                 ? "missing MODEL (try --help)"
                                   : !a->checkpoint && !onnx ? "missing --checkpoint FILE"
                                                             : "missing --input FILE");
    return -1;
  }
  return 0;
}

/* ---- input -------------------------------------------------------------------- */

/* Skips blanks and '#' comments of a PGM header. */
static int pgm_skip(FILE *f) {
  int ch;
  while ((ch = fgetc(f)) != EOF) {
    if (ch == '#') {
      while ((ch = fgetc(f)) != EOF && ch != '\n') {
      }
    } else if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') {
      ungetc(ch, f);
      return 1;
    }
  }
  return 0;
}

static int pgm_number(FILE *f, long *out) {
  if (!pgm_skip(f)) return 0;
  int ch, digits = 0;
  long v = 0;
  while ((ch = fgetc(f)) != EOF && ch >= '0' && ch <= '9') {
    if (v > 1000000) return 0;
    v = v * 10 + (ch - '0');
    digits++;
  }
  *out = v;
  return digits > 0 && (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r');
}

/* A binary PGM ("P5", maxval < 256) as a one-image dataset. */
/* `path` through the checked open (infile.h: a FIFO or a device is refused,
 * never read), as a stream. */
static bp_status open_input(const char *path, FILE **out) {
  char why[256];
  const int fd = bp_input_open(path, 0, NULL, why, sizeof why);
  if (fd < 0) return bp_fail(BP_ERR_IO, "%s: cannot open: %s", path, why);
  *out = fdopen(fd, "rb");
  if (!*out) {
    const int err = errno;
    close(fd);
    return bp_fail(BP_ERR_IO, "%s: cannot open: %s", path, strerror(err));
  }
  return BP_OK;
}

static bp_status load_pgm(const char *path, bp_dataset **out) {
  FILE *f = NULL;
  bp_status opened = open_input(path, &f);
  if (opened != BP_OK) return opened;
  long w = 0, h = 0, maxval = 0;
  bp_status st = BP_OK;
  uint8_t *pixels = NULL;
  if (fgetc(f) != 'P' || fgetc(f) != '5') {
    st = bp_fail(BP_ERR_PARSE, "%s: not a binary PGM (no P5 magic)", path);
  } else if (!pgm_number(f, &w) || !pgm_number(f, &h) || !pgm_number(f, &maxval) || w < 1 ||
             h < 1 || maxval < 1 || maxval > 255) {
    st = bp_fail(BP_ERR_PARSE,
                 "%s: bad PGM header (want width, height and a maxval of 1..255 for 8-bit pixels)",
                 path);
  } else if (!(pixels = malloc((size_t)(w * h)))) {
    st = bp_fail(BP_ERR_NOMEM, "out of memory reading %s", path);
  } else {
    const size_t got = fread(pixels, 1, (size_t)(w * h), f);
    if (got != (size_t)(w * h)) {
      st = bp_fail(BP_ERR_PARSE, "%s: truncated: %zu of %ld pixel bytes", path, got, w * h);
    } else if (fgetc(f) != EOF) {
      st = bp_fail(BP_ERR_PARSE, "%s: trailing bytes after %ldx%ld pixels", path, w, h);
    } else {
      long bad = -1; /* a sample above maxval: not a valid PGM, never clamped */
      for (long i = 0; i < w * h && bad < 0; i++)
        if (pixels[i] > maxval) bad = i;
      if (bad >= 0) {
        st = bp_fail(BP_ERR_PARSE, "%s: the sample at x %ld, y %ld is %u, above the maxval %ld",
                     path, bad % w, bad / w, (unsigned)pixels[bad], maxval);
        goto done;
      }
      /* a maxval below 255 is scaled to 0..255, as the training images are */
      if (maxval != 255)
        for (long i = 0; i < w * h; i++) pixels[i] = (uint8_t)(pixels[i] * 255 / maxval);
      const uint8_t label = 0;
      const bp_dataset_info info = {.count = 1, .height = h, .width = w, .channels = 1,
                                    .classes = 1};
      st = bp_dataset_create(&info, pixels, &label, out);
    }
  }
done:
  free(pixels);
  fclose(f);
  return st;
}

/* IDX or PGM by the first bytes. */
static bp_status load_input(const char *path, int64_t limit, bp_dataset **out) {
  FILE *f = NULL;
  bp_status opened = open_input(path, &f);
  if (opened != BP_OK) return opened;
  char magic[2] = {0, 0};
  const size_t n = fread(magic, 1, 2, f);
  fclose(f);
  if (n == 2 && magic[0] == 'P' && magic[1] == '5') return load_pgm(path, out);
  /* --limit N: only N images are read (a gzip bomb stops there) */
  return bp_dataset_load_idx_images_first(path, limit, out);
}

/* ---- the run --------------------------------------------------------------------- */

typedef struct predictor {
  bp_registry *registry;
  bp_model *model;
  bp_session *session;
  const bp_plan *plan; /* the session's */
  bp_arena *arena;
  bp_threads *threads;
  bp_exec *exec;
  char *base;
  int variant;                    /* the batch-1 evaluation variant */
  const bp_dtensor *image, *label, *logits;
  bp_data_norm norm;
} predictor;

static void predictor_destroy(predictor *p) {
  bp_exec_destroy(p->exec);
  bp_threads_destroy(p->threads);
  bp_arena_destroy(p->arena);
  bp_session_destroy(p->session);
  bp_model_destroy(p->model);
  bp_registry_destroy(p->registry);
}

/* The model's initial values (an ONNX file's initializers) into the
 * arena: FP32 tensors of this host's arena, compact as the plan lays
 * FP32 out (no channel padding). */
static bp_status write_inits(predictor *p) {
  const bp_model *m = p->model;
  for (int i = 0; i < m->init_count; i++) {
    const bp_model_init *v = &m->inits[i];
    const int32_t id = bp_plan_find_tensor(p->plan, v->name);
    const bp_dtensor *d = id >= 0 ? bp_plan_tensor(p->plan, 0, id) : NULL;
    if (!d || d->dtype != BP_DTYPE_FP32 || bp_dtensor_host_elems(d) != v->count ||
        d->padded_c != d->shape.c)
      return bp_fail(BP_ERR_SHAPE, "model '%s': initial value '%s' fits no FP32 tensor of the plan",
                     m->name, v->name);
    memcpy(p->base + d->offset, v->values, (size_t)v->count * sizeof *v->values);
  }
  return bp_exec_run(p->exec, p->variant, BP_SEGMENT_INIT, 0); /* the copies of W */
}

static bp_status predictor_open(const predict_args *a, predictor *p) {
  memset(p, 0, sizeof *p);
  bp_status st = bp_registry_create_with(&bp_cli_env_get()->registry, &p->registry);
  if (st != BP_OK) return st;
  if ((st = bp_registry_discover(p->registry, a->plugins, a->plugin_count)) != BP_OK) return st;
  /* pinned kernels checked at bind, as for train (kernel_checks.h) */
  if ((st = bp_kernel_checks_install(p->registry, !a->trust_pins)) != BP_OK) return st;
  if ((st = bp_model_load_file(a->model, p->registry, &p->model)) != BP_OK) return st;
  bp_model *m = p->model;
  if (m->layer_count < 2 || m->layers[m->layer_count - 1].type != BP_LAYER_SOFTMAX_CE)
    return bp_fail(BP_ERR_INVALID, "model '%s' does not end in a softmax_ce layer", m->name);
  bp_train_settings *s = &m->train;
  if (a->batch) s->batch = a->batch;
  if (a->eval_batch) s->eval_batch = a->eval_batch;
  if (a->optimizer && bp_optimizer_from_name(a->optimizer, &s->optimizer) != 0)
    return bp_fail(BP_ERR_INVALID, "--optimizer '%s' is not sgd, adamw or lars", a->optimizer);

  const char *pins = bp_registry_resolve_pins(p->registry, a->pins, NULL, NULL);
  bp_session_options so;
  bp_session_options_init(&so, m);
  so.compile.batch = s->batch;
  so.compile.eval_batch = s->eval_batch;
  so.compile.train_size = s->train_size;
  so.compile.eval_size = s->eval_batch > 1 ? s->eval_batch + 1 : 0; /* "eval_last" of 1 image */
  /* batchnorm + relu fused where the kernels are, as in training */
  so.compile.fuse_bn_relu = so.compile.fuse_bn_relu && !bp_cli_env_get()->no_fuse;
  so.registry = p->registry;
  so.pins = pins;
  so.graph.eval_ema = s->ema;
  if ((st = bp_session_create(m, &so, &p->session)) != BP_OK) return st;
  p->plan = bp_session_plan(p->session);
  p->variant = bp_plan_find_variant(p->plan, s->eval_batch > 1 ? "eval_last" : "eval");
  if (p->variant < 0 || bp_plan_variant(p->plan, p->variant)->batch != 1)
    return bp_fail(BP_ERR_STATE, "the plan of '%s' has no evaluation variant of batch 1", m->name);
  if ((st = bp_arena_create(p->plan, bp_host_allocator(), 0, &p->arena)) != BP_OK) return st;
  p->base = bp_arena_base(p->arena);
  /* one image is too little work to split: threads only add hand-offs
   * (measured: bench/RESULTS.md, issue 14) */
  const int threads = a->threads ? (int)(a->threads < 1024 ? a->threads : 1024) : 1;
  if ((st = bp_threads_create(threads, &p->threads)) != BP_OK) return st;
  bp_exec_options eo = {.device = "cpu",
                        .pins = pins && *pins ? pins : NULL,
                        .rank = 0,
                        .world = 1,
                        .threads = bp_threads_abi(p->threads)};
  if ((st = bp_session_bind(p->session, p->registry, p->base, &eo, &p->exec)) != BP_OK) return st;

  bp_train_state state;
  if (a->checkpoint) st = bp_checkpoint_load(a->checkpoint, p->plan, p->base, &state);
  else st = write_inits(p); /* an ONNX model's own initializers */
  if (st != BP_OK) return st;
  bp_exec_params_changed(p->exec); /* packed weights follow the loaded ones */
  /* FP16 working copies (amp) from the loaded weights */
  if ((st = bp_exec_run(p->exec, p->variant, BP_SEGMENT_CAST, 0)) != BP_OK) return st;

  const int32_t image = bp_plan_find_tensor(p->plan, "input.a");
  const int32_t label = bp_plan_find_tensor(p->plan, "label.a");
  char name[BP_NAME_MAX + 8];
  snprintf(name, sizeof name, "%s.out", m->layers[m->layers[m->layer_count - 1].inputs[0]].name);
  const int32_t logits = bp_plan_find_tensor(p->plan, name);
  if (image < 0 || label < 0 || logits < 0)
    return bp_fail(BP_ERR_STATE, "the plan of '%s' lacks input.a, label.a or %s", m->name, name);
  p->image = bp_plan_tensor(p->plan, p->variant, image);
  p->label = bp_plan_tensor(p->plan, p->variant, label);
  p->logits = bp_plan_tensor(p->plan, p->variant, logits);

  if (a->data) {
    bp_dataset *train = NULL;
    const bp_dataset_info shape = {1, m->height, m->width, m->channels, (int)m->classes};
    if ((st = bp_dataset_open(a->data, BP_DATA_TRAIN, &shape, &train)) != BP_OK) return st;
    st = bp_dataset_stats(train, &p->norm);
    bp_dataset_destroy(train);
    if (st != BP_OK) return st;
  } else {
    p->norm.channels = 1;
    p->norm.mean[0] = BP_FASHION_MNIST_MEAN;
    p->norm.std[0] = BP_FASHION_MNIST_STD;
  }
  return BP_OK;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Class probabilities of image `index`: fill, run, softmax of the logits
 * (in double). *ms: the time of the fill and the run. */
static bp_status classify(predictor *p, const bp_dataset *d, int64_t index, double *prob,
                          double *ms) {
  const double t0 = now_ms();
  const bp_data_fill_options fo = {.norm = &p->norm};
  bp_status st = bp_data_fill(d, &index, 1, &fo, p->image, p->base + p->image->offset, p->label,
                              p->base + p->label->offset);
  if (st == BP_OK) st = bp_exec_run(p->exec, p->variant, BP_SEGMENT_EVAL, 0);
  *ms = now_ms() - t0;
  if (st != BP_OK) return st;
  const int64_t k = p->logits->shape.c;
  const char *y = p->base + p->logits->offset;
  double max = -INFINITY, sum = 0;
  for (int64_t c = 0; c < k; c++) {
    prob[c] = p->logits->dtype == BP_DTYPE_FP16
                  ? bp_fp16_to_fp32(((const uint16_t *)(const void *)y)[c])
                  : ((const float *)(const void *)y)[c];
    if (prob[c] > max) max = prob[c];
  }
  for (int64_t c = 0; c < k; c++) sum += prob[c] = exp(prob[c] - max);
  for (int64_t c = 0; c < k; c++) prob[c] /= sum;
  return BP_OK;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The `top` most likely classes, highest first (ties: the lower class). */
static void top_classes(const double *prob, int64_t k, int64_t top, int64_t *out) {
  for (int64_t t = 0; t < top; t++) {
    int64_t best = -1;
    for (int64_t c = 0; c < k; c++) {
      int taken = 0;
      for (int64_t u = 0; u < t; u++) taken |= out[u] == c;
      if (!taken && (best < 0 || prob[c] > prob[best])) best = c;
    }
    out[t] = best;
  }
}

int bp_cmd_predict(int argc, char **argv) {
  predict_args a;
  if (parse_args(argc, argv, &a) != 0) return BP_CLI_EXIT_USAGE;
  if (a.help) {
    fputs(usage_text, stdout);
    return fflush(stdout) == 0 ? 0 : BP_CLI_EXIT_RUN;
  }
  predictor p;
  bp_dataset *d = NULL;
  double *prob = NULL, *lat = NULL;
  int64_t *top = NULL;
  bp_status st = predictor_open(&a, &p);
  if (st == BP_OK && a.verbose)
    bp_cli_exec_kernel_table(a.json ? stderr : stdout, p.exec, p.variant, BP_SEGMENT_EVAL,
                             bp_registry_resolve_pins(p.registry, a.pins, NULL, NULL), 1);
  if (st == BP_OK && a.verbose)
    bp_cli_kernel_warnings(a.json ? stderr : stdout, bp_kernel_checks_warnings(p.registry));
  if (st == BP_OK) st = load_input(a.input, a.limit, &d);
  const bp_model *m = p.model;
  if (st == BP_OK) {
    const bp_dataset_info *i = bp_dataset_get_info(d);
    if (i->height != m->height || i->width != m->width || i->channels != m->channels)
      st = bp_fail(BP_ERR_SHAPE, "%s: images of %lldx%lldx%lld; model '%s' takes %lldx%lldx%lld",
                   a.input, (long long)i->height, (long long)i->width, (long long)i->channels,
                   m->name, (long long)m->height, (long long)m->width, (long long)m->channels);
  }
  int64_t count = 0, k = 0, ktop = 0;
  if (st == BP_OK) {
    count = bp_dataset_get_info(d)->count;
    if (a.limit && a.limit < count) count = a.limit;
    k = p.logits->shape.c;
    ktop = a.top < k ? a.top : k;
    prob = malloc(sizeof *prob * (size_t)k);
    lat = malloc(sizeof *lat * (size_t)count);
    top = malloc(sizeof *top * (size_t)(count * ktop));
    if (!prob || !lat || !top) st = bp_fail(BP_ERR_NOMEM, "out of memory for %lld images",
                                            (long long)count);
  }
  /* one untimed image first: the kernels pack their weights and set up
   * their operators on the first run, which a deployed model does once */
  if (st == BP_OK && count > 0) {
    double ms;
    st = classify(&p, d, 0, prob, &ms);
  }
  if (st == BP_OK && a.json)
    printf("{\"model\":\"%s\",\"images\":%lld,\"classes\":%lld,\"top\":%lld,\"predictions\":[",
           m->name, (long long)count, (long long)k, (long long)ktop);
  else if (st == BP_OK)
    printf("%6s  %3s  %5s  %11s\n", "image", "top", "class", "probability");
  for (int64_t i = 0; st == BP_OK && i < count; i++) {
    if ((st = classify(&p, d, i, prob, &lat[i])) != BP_OK) break;
    top_classes(prob, k, ktop, top + i * ktop);
    if (a.json) {
      printf("%s{\"image\":%lld,\"top\":[", i ? "," : "", (long long)i);
      for (int64_t t = 0; t < ktop; t++)
        printf("%s{\"class\":%lld,\"probability\":%.6g}", t ? "," : "",
               (long long)top[i * ktop + t], prob[top[i * ktop + t]]);
      printf("]}");
    } else {
      for (int64_t t = 0; t < ktop; t++)
        printf("%6lld  %3lld  %5lld  %11.4f\n", (long long)i, (long long)(t + 1),
               (long long)top[i * ktop + t], prob[top[i * ktop + t]]);
    }
  }
  if (st == BP_OK) {
    double mean = 0;
    for (int64_t i = 0; i < count; i++) mean += lat[i] / (double)count;
    qsort(lat, (size_t)count, sizeof *lat, cmp_double);
    const double median = count ? lat[count / 2] : 0, min = count ? lat[0] : 0;
    if (a.json)
      printf("],\"latency_ms\":{\"median\":%.6g,\"mean\":%.6g,\"min\":%.6g}}\n", median, mean,
             min);
    else
      printf("%lld images, one at a time: latency median %.3f ms, mean %.3f ms, min %.3f ms\n",
             (long long)count, median, mean, min);
  }
  if (st != BP_OK) {
    fflush(stdout);
    bp_cli_report("predict", "%s", bp_last_error());
  }
  free(prob);
  free(lat);
  free(top);
  bp_dataset_destroy(d);
  predictor_destroy(&p);
  if (st != BP_OK) return BP_CLI_EXIT_RUN;
  if (fflush(stdout) != 0 || ferror(stdout)) {
    bp_cli_report("predict", "cannot write to standard output: %s", strerror(errno));
    return BP_CLI_EXIT_RUN;
  }
  return 0;
}
