/* bench_forward_kernels: milliseconds per call of every forward kernel the
 * loaded op modules have (reference, cpu, blas, dnnl, onednn, xnnpack) on every
 * conv, fc and pooling layer (and one relu and one add) of models/cnn.yaml, models/resnet8.yaml and
 * models/mlp.yaml, at batch 1, 128 and 200 (the deployment, training and
 * evaluation batches).
 *
 *   bench_forward_kernels [--seconds S] [--batches 1,128,200] [--model cnn|resnet8|mlp]
 *                         [--skip-reference-above N]
 *
 * Modules are found as `blueprint plugins` finds them (beside
 * libblueprint.so). Each (layer, batch, kernel) runs once to warm up, then
 * repeatedly for at least S seconds (default 0.2, at least 2 runs); the best
 * run counts. Kernels get prepare() / release() and a parameter generation
 * that stays put (evaluation: XNNPACK packs its weights once); conv and fc
 * also get a row "xnnpack+pack" whose generation moves before every run,
 * what a training step's forward pays (weights change every step). The
 * kernels get one rank's threads, as in training: every core this process
 * may use, or BP_THREADS. The last column is the winner's speed-up over
 * the best of the others. --skip-reference-above N skips the reference
 * kernels at batches above N (they take seconds there). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "blueprint/registry.h"
#include "blueprint/threads.h"
#include "bp_abi.h"
#include "bp_abi_ops.h"

typedef enum kind { CONV, FC, MAXPOOL, AVGPOOL, GAP, RELU, ADD } kind;

/* One layer: input h x w x c; conv: k filters, kernel, stride, pad; fc: k
 * units; pools: kernel (stride = kernel). */
typedef struct layer {
  const char *model, *name;
  kind kind;
  int64_t h, w, c, k, kernel, stride, pad;
} layer;

static const layer layers[] = {
    {"cnn", "conv1", CONV, 28, 28, 1, 32, 3, 1, 1},
    {"cnn", "relu1", RELU, 28, 28, 32, 0, 0, 0, 0},
    {"cnn", "conv2", CONV, 28, 28, 32, 32, 3, 1, 1},
    {"cnn", "pool1", MAXPOOL, 28, 28, 32, 0, 2, 2, 0},
    {"cnn", "conv3", CONV, 14, 14, 32, 64, 3, 1, 1},
    {"cnn", "conv4", CONV, 14, 14, 64, 64, 3, 1, 1},
    {"cnn", "pool2", MAXPOOL, 14, 14, 64, 0, 2, 2, 0},
    {"cnn", "fc", FC, 7, 7, 64, 10, 0, 0, 0},
    {"resnet8", "stem", CONV, 28, 28, 1, 16, 3, 1, 1},
    {"resnet8", "b1_conv1,2", CONV, 28, 28, 16, 16, 3, 1, 1},
    {"resnet8", "b2_conv1", CONV, 28, 28, 16, 32, 3, 2, 1},
    {"resnet8", "b2_conv2", CONV, 14, 14, 32, 32, 3, 1, 1},
    {"resnet8", "b2_add", ADD, 14, 14, 32, 0, 0, 0, 0},
    {"resnet8", "b2_proj", CONV, 28, 28, 16, 32, 1, 2, 0},
    {"resnet8", "b3_conv1", CONV, 14, 14, 32, 64, 3, 2, 1},
    {"resnet8", "b3_conv2", CONV, 7, 7, 64, 64, 3, 1, 1},
    {"resnet8", "b3_proj", CONV, 14, 14, 32, 64, 1, 2, 0},
    {"resnet8", "pool", GAP, 7, 7, 64, 0, 0, 0, 0},
    {"resnet8", "fc", FC, 1, 1, 64, 10, 0, 0, 0},
    {"mlp", "fc1", FC, 28, 28, 1, 512, 0, 0, 0},
    {"mlp", "fc2", FC, 1, 1, 512, 512, 0, 0, 0},
    {"mlp", "fc3", FC, 1, 1, 512, 10, 0, 0, 0},
};

static const char *const impls[] = {"reference", "cpu", "blas", "dnnl", "onednn", "xnnpack"};
#define IMPLS (sizeof impls / sizeof impls[0])

/* The tensors and attributes of one layer at one batch. */
typedef struct problem {
  const char *op;
  bench_buf in[3], out[2];
  int nin, nout;
  bp_conv2d_attrs conv;
  bp_fc_attrs fc;
  bp_pool_attrs pool;
  bp_elementwise_attrs ew;
  const void *attrs;
  uint32_t attr_size;
  double flops; /* 0 for pools */
} problem;

static int problem_new(problem *p, const layer *l, int64_t n, uint64_t *rng) {
  memset(p, 0, sizeof *p);
  int ok = bench_buf_new(&p->in[0], BP_ABI_DTYPE_FP32, n, l->h, l->w, l->c, rng);
  switch (l->kind) {
    case CONV: {
      const int64_t oh = (l->h + 2 * l->pad - l->kernel) / l->stride + 1;
      const int64_t ow = (l->w + 2 * l->pad - l->kernel) / l->stride + 1;
      p->op = "conv2d.fwd";
      p->conv = (bp_conv2d_attrs){.kernel_h = (int32_t)l->kernel, .kernel_w = (int32_t)l->kernel,
                                  .stride_h = (int32_t)l->stride, .stride_w = (int32_t)l->stride,
                                  .pad_h = (int32_t)l->pad, .pad_w = (int32_t)l->pad,
                                  .dilation_h = 1, .dilation_w = 1, .groups = 1};
      p->attrs = &p->conv, p->attr_size = sizeof p->conv;
      ok = ok &&
           bench_buf_new(&p->in[1], BP_ABI_DTYPE_FP32, l->k, l->kernel, l->kernel, l->c, rng) &&
           bench_buf_new(&p->out[0], BP_ABI_DTYPE_FP32, n, oh, ow, l->k, rng);
      p->nin = 2, p->nout = 1;
      p->flops = 2.0 * (double)(n * oh * ow * l->k) * (double)(l->kernel * l->kernel * l->c);
      break;
    }
    case FC:
      p->op = "fc.fwd";
      p->fc = (bp_fc_attrs){.has_bias = 1};
      p->attrs = &p->fc, p->attr_size = sizeof p->fc;
      ok = ok &&
           bench_buf_new(&p->in[1], BP_ABI_DTYPE_FP32, l->k, 1, 1, l->h * l->w * l->c, rng) &&
           bench_buf_new(&p->in[2], BP_ABI_DTYPE_FP32, 1, 1, 1, l->k, rng) &&
           bench_buf_new(&p->out[0], BP_ABI_DTYPE_FP32, n, 1, 1, l->k, rng);
      p->nin = 3, p->nout = 1;
      p->flops = 2.0 * (double)(n * l->k) * (double)(l->h * l->w * l->c);
      break;
    case MAXPOOL:
    case AVGPOOL: {
      const int64_t oh = (l->h - l->kernel) / l->stride + 1, ow = (l->w - l->kernel) / l->stride + 1;
      p->op = l->kind == MAXPOOL ? "maxpool.fwd" : "avgpool.fwd";
      p->pool = (bp_pool_attrs){.kernel_h = (int32_t)l->kernel, .kernel_w = (int32_t)l->kernel,
                                .stride_h = (int32_t)l->stride, .stride_w = (int32_t)l->stride};
      p->attrs = &p->pool, p->attr_size = sizeof p->pool;
      ok = ok && bench_buf_new(&p->out[0], BP_ABI_DTYPE_FP32, n, oh, ow, l->c, rng);
      p->nin = 1, p->nout = 1;
      if (l->kind == MAXPOOL) {
        ok = ok && bench_buf_new(&p->out[1], BP_ABI_DTYPE_INT8, n, oh, ow, l->c, rng);
        p->nout = 2;
      }
      break;
    }
    case RELU:
    case ADD:
      p->op = l->kind == RELU ? "relu.fwd" : "add.fwd";
      p->attrs = &p->ew, p->attr_size = sizeof p->ew;
      p->nin = l->kind == RELU ? 1 : 2, p->nout = 1;
      ok = ok &&
           (p->nin == 1 ||
            bench_buf_new(&p->in[1], BP_ABI_DTYPE_FP32, n, l->h, l->w, l->c, rng)) &&
           bench_buf_new(&p->out[0], BP_ABI_DTYPE_FP32, n, l->h, l->w, l->c, rng);
      break;
    case GAP:
      p->op = "global_avgpool.fwd";
      p->attrs = &p->ew, p->attr_size = sizeof p->ew;
      ok = ok && bench_buf_new(&p->out[0], BP_ABI_DTYPE_FP32, n, 1, 1, l->c, rng);
      p->nin = 1, p->nout = 1;
      break;
  }
  return ok;
}

static void problem_free(problem *p) {
  for (int i = 0; i < 3; i++) free(p->in[i].p);
  for (int o = 0; o < 2; o++) free(p->out[o].p);
}

static const bp_abi_threads *bench_threads;

/* Best milliseconds of one run of k on p; < 0 when it refuses or fails.
 * repack: the generation moves before every run. */
static double time_kernel(const bp_abi_kernel *k, problem *p, double seconds, int repack) {
  bench_node n;
  double best = -1;
  if (bench_node_open(&n, k, p->in, p->nin, p->out, p->nout, p->attrs, p->attr_size,
                      bench_threads))
    best = bench_node_best(&n, seconds, repack);
  bench_node_close(&n);
  return best < 0 ? -1 : best * 1e3;
}

static void usage(void) {
  fprintf(stderr,
          "usage: bench_forward_kernels [--seconds S] [--batches 1,128,200] [--model NAME]\n"
          "                             [--skip-reference-above N]\n");
}

int main(int argc, char **argv) {
  double seconds = 0.2;
  int64_t batches[8] = {1, 128, 200}, skip_ref_above = INT64_MAX;
  int nb = 3;
  const char *only = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = atof(argv[++i]);
    } else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else if (strcmp(argv[i], "--skip-reference-above") == 0 && i + 1 < argc) {
      skip_ref_above = atoll(argv[++i]);
    } else if (strcmp(argv[i], "--batches") == 0 && i + 1 < argc) {
      nb = 0;
      for (char *s = argv[++i]; *s && nb < 8;) {
        char *end;
        batches[nb++] = strtoll(s, &end, 10);
        s = *end == ',' ? end + 1 : end;
        if (end == s && *s) break;
      }
    } else {
      usage();
      return 2;
    }
  }
  for (int b = 0; b < nb; b++)
    if (batches[b] < 1) {
      usage();
      return 2;
    }
  bp_registry *r = NULL;
  bp_threads *pool = NULL;
  if (!bench_discover("bench_forward_kernels", &r, &pool)) return 1;
  bench_threads = bp_threads_abi(pool);
  printf("forward kernels, FP32, milliseconds per call (best of >= %.2f s); threads: %d\n",
         seconds, bench_threads->count);
  printf("%-8s %-11s %5s %10s %10s %10s %10s %10s %10s %12s  %s\n", "model", "layer", "batch",
         "reference", "cpu", "blas", "dnnl", "onednn", "xnnpack", "xnnpack+pack", "fastest");
  uint64_t rng = 42;
  for (size_t li = 0; li < sizeof layers / sizeof layers[0]; li++) {
    const layer *l = &layers[li];
    if (only && strcmp(only, l->model) != 0) continue;
    for (int b = 0; b < nb; b++) {
      problem p;
      if (!problem_new(&p, l, batches[b], &rng)) {
        fprintf(stderr, "bench_forward_kernels: out of memory\n");
        return 1;
      }
      double ms[IMPLS + 1];
      int best = -1;
      for (size_t i = 0; i <= IMPLS; i++) {
        const int repack = i == IMPLS;
        const bp_abi_kernel *k = bench_find_kernel(r, p.op, impls[repack ? IMPLS - 1 : i]);
        ms[i] = -1;
        if (!k || (repack && p.flops == 0) ||
            (strcmp(impls[i < IMPLS ? i : 0], "reference") == 0 && !repack &&
             batches[b] > skip_ref_above))
          continue;
        ms[i] = time_kernel(k, &p, seconds, repack);
        if (ms[i] >= 0 && !repack && (best < 0 || ms[i] < ms[best])) best = (int)i;
      }
      double second = INFINITY;
      for (size_t i = 0; i < IMPLS; i++)
        if ((int)i != best && ms[i] >= 0 && ms[i] < second) second = ms[i];
      printf("%-8s %-11s %5lld", l->model, l->name, (long long)batches[b]);
      for (size_t i = 0; i <= IMPLS; i++) {
        if (ms[i] < 0)
          printf(" %*s", i == IMPLS ? 12 : 10, "-");
        else
          printf(" %*.4f", i == IMPLS ? 12 : 10, ms[i]);
      }
      if (best >= 0 && isfinite(second))
        printf("  %s %.1fx\n", impls[best], second / ms[best]);
      else
        printf("  %s\n", best >= 0 ? impls[best] : "-");
      fflush(stdout);
      problem_free(&p);
    }
  }
  bp_threads_destroy(pool);
  bp_registry_destroy(r);
  return 0;
}
