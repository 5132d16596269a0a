/* bench_conv_bwf: conv2d backward-filter on the CNN's shapes (models/cnn.yaml,
 * 3x3, stride 1, padding 1), alternatives interleaved in one process:
 *   onednn-nhwc   oneDNN's primitive as ops/onednn ran it before: NHWC src
 *                 and diff_dst, diff_weights in the layout it picks, one
 *                 reorder to ohwi (the plan's layout);
 *   onednn-8c     the same with src and diff_dst in nChw8c, their reorders
 *                 from NHWC counted;
 *   direct        ops/onednn/conv_bwf.c (chunks on OpenMP's threads, then
 *                 the ordered sum of the partials), as ops/onednn runs it.
 *
 *   bench_conv_bwf [--batch N] [--rounds R] [--threads T] [--rows G] [--chunk I] [--cpu 1]
 *
 * Each round runs every alternative once per shape; printed is the minimum
 * over the rounds (ms, GFLOP/s) and each result's max |diff| against a
 * double-precision reference, relative to max |reference|. --rows and
 * --chunk override the direct kernel's group rows and images per chunk.
 * --cpu 1 times the process's CPU time instead of the wall clock: with
 * --threads 1 on a machine shared with other jobs, that is the kernel's
 * own time (time slices given to others do not count). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <oneapi/dnnl/dnnl.h>

#include "../ops/onednn/conv_bwf.h"
#include "cnn_convs.h"

#define NALT 3
static const char *alt_names[NALT] = {"onednn-nhwc", "onednn-8c", "direct"};

static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(bench_clock, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CHECK(call)                                                               \
  do {                                                                            \
    dnnl_status_t st_ = (call);                                                   \
    if (st_ != dnnl_success) {                                                    \
      fprintf(stderr, "bench_conv_bwf: %s: status %d\n", #call, (int)st_);        \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

static void *xalloc(size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes + 64) != 0) {
    fprintf(stderr, "bench_conv_bwf: out of memory\n");
    exit(1);
  }
  memset(p, 0, bytes + 64);
  return p;
}

/* oneDNN backward-weights with src/diff_dst in `act` (nhwc or nChw8c). */
typedef struct odnn {
  dnnl_primitive_t conv, wre, xre, yre; /* xre/yre: NHWC -> act, or NULL */
  dnnl_memory_t x_user, y_user, x, y, w, w_user, scratch;
} odnn;

static void odnn_make(odnn *o, dnnl_engine_t eng, const cnn_conv *s, int64_t n,
                      dnnl_format_tag_t act) {
  memset(o, 0, sizeof *o);
  const dnnl_dims_t xd = {n, s->c, s->h, s->w}, yd = {n, s->k, s->h, s->w},
                    wd = {s->k, s->c, 3, 3}, st = {1, 1}, pad = {1, 1};
  dnnl_memory_desc_t x_nhwc, y_nhwc, x_md, y_md, w_any, w_user;
  dnnl_memory_desc_init_by_tag(&x_nhwc, 4, xd, dnnl_f32, dnnl_nhwc);
  dnnl_memory_desc_init_by_tag(&y_nhwc, 4, yd, dnnl_f32, dnnl_nhwc);
  dnnl_memory_desc_init_by_tag(&x_md, 4, xd, dnnl_f32, act);
  dnnl_memory_desc_init_by_tag(&y_md, 4, yd, dnnl_f32, act);
  dnnl_memory_desc_init_by_tag(&w_any, 4, wd, dnnl_f32, dnnl_format_tag_any);
  dnnl_memory_desc_init_by_tag(&w_user, 4, wd, dnnl_f32, dnnl_ohwi);
  dnnl_convolution_desc_t fd, bd;
  CHECK(dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct,
                                           &x_md, &w_any, NULL, &y_md, st, pad, pad));
  dnnl_primitive_desc_t hint, pd;
  CHECK(dnnl_primitive_desc_create(&hint, &fd, NULL, eng, NULL));
  CHECK(dnnl_convolution_backward_weights_desc_init(&bd, dnnl_convolution_direct, &x_md, &w_any,
                                                    NULL, &y_md, st, pad, pad));
  dnnl_primitive_attr_t attr;
  CHECK(dnnl_primitive_attr_create(&attr));
  CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
  CHECK(dnnl_primitive_desc_create(&pd, &bd, attr, eng, hint));
  const char *impl = NULL;
  dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
  const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_diff_weights_md, 0);
  const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  fprintf(stderr, "  %s %s: impl %s, scratchpad %zu bytes\n", s->name,
          act == dnnl_nhwc ? "nhwc" : "nChw8c", impl ? impl : "?", dnnl_memory_desc_get_size(smd));
  CHECK(dnnl_primitive_create(&o->conv, pd));
  CHECK(dnnl_memory_create(&o->scratch, smd, eng, xalloc(dnnl_memory_desc_get_size(smd) + 4096)));
  CHECK(dnnl_memory_create(&o->w, wmd, eng, xalloc(dnnl_memory_desc_get_size(wmd))));
  CHECK(dnnl_memory_create(&o->w_user, &w_user, eng, DNNL_MEMORY_NONE));
  CHECK(dnnl_memory_create(&o->x_user, &x_nhwc, eng, DNNL_MEMORY_NONE));
  CHECK(dnnl_memory_create(&o->y_user, &y_nhwc, eng, DNNL_MEMORY_NONE));
  dnnl_primitive_desc_t rpd;
  CHECK(dnnl_reorder_primitive_desc_create(&rpd, wmd, eng, &w_user, eng, NULL));
  CHECK(dnnl_primitive_create(&o->wre, rpd));
  dnnl_primitive_desc_destroy(rpd);
  if (act != dnnl_nhwc) {
    CHECK(dnnl_memory_create(&o->x, &x_md, eng, xalloc(dnnl_memory_desc_get_size(&x_md))));
    CHECK(dnnl_memory_create(&o->y, &y_md, eng, xalloc(dnnl_memory_desc_get_size(&y_md))));
    CHECK(dnnl_reorder_primitive_desc_create(&rpd, &x_nhwc, eng, &x_md, eng, NULL));
    CHECK(dnnl_primitive_create(&o->xre, rpd));
    dnnl_primitive_desc_destroy(rpd);
    CHECK(dnnl_reorder_primitive_desc_create(&rpd, &y_nhwc, eng, &y_md, eng, NULL));
    CHECK(dnnl_primitive_create(&o->yre, rpd));
    dnnl_primitive_desc_destroy(rpd);
  }
  dnnl_primitive_attr_destroy(attr);
  dnnl_primitive_desc_destroy(pd);
  dnnl_primitive_desc_destroy(hint);
}

static void run_prim(dnnl_primitive_t p, dnnl_stream_t s, int n, const dnnl_exec_arg_t *a) {
  CHECK(dnnl_primitive_execute(p, s, n, a));
  CHECK(dnnl_stream_wait(s));
}

static void odnn_run(odnn *o, dnnl_stream_t s, const float *x, const float *dy, float *dw) {
  CHECK(dnnl_memory_set_data_handle(o->x_user, (void *)x));
  CHECK(dnnl_memory_set_data_handle(o->y_user, (void *)dy));
  CHECK(dnnl_memory_set_data_handle(o->w_user, dw));
  dnnl_memory_t xm = o->x_user, ym = o->y_user;
  if (o->xre) {
    const dnnl_exec_arg_t a[] = {{DNNL_ARG_FROM, o->x_user}, {DNNL_ARG_TO, o->x}};
    run_prim(o->xre, s, 2, a);
    const dnnl_exec_arg_t b[] = {{DNNL_ARG_FROM, o->y_user}, {DNNL_ARG_TO, o->y}};
    run_prim(o->yre, s, 2, b);
    xm = o->x, ym = o->y;
  }
  const dnnl_exec_arg_t a[] = {{DNNL_ARG_SRC, xm},
                               {DNNL_ARG_DIFF_DST, ym},
                               {DNNL_ARG_DIFF_WEIGHTS, o->w},
                               {DNNL_ARG_SCRATCHPAD, o->scratch}};
  run_prim(o->conv, s, 4, a);
  const dnnl_exec_arg_t r[] = {{DNNL_ARG_FROM, o->w}, {DNNL_ARG_TO, o->w_user}};
  run_prim(o->wre, s, 2, r);
}

static void direct_run(const bwf_plan *p, const float *x, const float *dy, float *dw, void *ws) {
  const int64_t items = p->items;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < items; i++) bwf_item(p, x, dy, ws, i);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < 4; i++) bwf_reduce(p, ws, dw, NULL, 0, i, 4);
}

static void reference(const cnn_conv *s, int64_t n, const float *x, const float *dy, double *dw) {
  const int64_t H = s->h, W = s->w, C = s->c, K = s->k;
  memset(dw, 0, sizeof(double) * (size_t)(K * 9 * C));
  for (int64_t b = 0; b < n; b++)
    for (int64_t oh = 0; oh < H; oh++)
      for (int64_t ow = 0; ow < W; ow++) {
        const float *d = dy + ((b * H + oh) * W + ow) * K;
        for (int64_t r = 0; r < 3; r++) {
          const int64_t ih = oh + r - 1;
          if (ih < 0 || ih >= H) continue;
          for (int64_t q = 0; q < 3; q++) {
            const int64_t iw = ow + q - 1;
            if (iw < 0 || iw >= W) continue;
            const float *xp = x + ((b * H + ih) * W + iw) * C;
            for (int64_t k = 0; k < K; k++)
              for (int64_t c = 0; c < C; c++)
                dw[((k * 3 + r) * 3 + q) * C + c] += (double)d[k] * (double)xp[c];
          }
        }
      }
}

static double rel_diff(const float *a, const double *ref, int64_t m) {
  double mx = 0, rmax = 0;
  for (int64_t i = 0; i < m; i++) {
    const double d = fabs((double)a[i] - ref[i]);
    if (d > mx || d != d) mx = d;
    if (fabs(ref[i]) > rmax) rmax = fabs(ref[i]);
  }
  return mx / (rmax > 1 ? rmax : 1);
}

int main(int argc, char **argv) {
  int64_t n = 128, rounds = 15, rows = 0, chunk = 0;
  int threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--batch")) n = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--rounds")) rounds = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--rows")) rows = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--chunk")) chunk = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--cpu"))
      bench_clock = atoi(argv[i + 1]) ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC;
    else {
      fprintf(stderr, "bench_conv_bwf: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  omp_set_num_threads(threads);
  dnnl_engine_t eng;
  dnnl_stream_t strm;
  CHECK(dnnl_engine_create(&eng, dnnl_cpu, 0));
  CHECK(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));
  printf("conv2d.bwd_filter, batch %lld, %d threads, min over %lld rounds of %s time\n",
         (long long)n, threads, (long long)rounds,
         bench_clock == CLOCK_MONOTONIC ? "wall" : "CPU");
  printf("%-20s %-12s %9s %8s %10s\n", "shape", "impl", "ms", "GFLOP/s", "rel.diff");
  uint64_t rng = 88172645463325252u;
  for (size_t si = 0; si < CNN_CONVS; si++) {
    const cnn_conv *s = &cnn_convs[si];
    const int64_t nx = n * s->h * s->w * s->c, ny = n * s->h * s->w * s->k, nw = s->k * 9 * s->c;
    float *x = xalloc(sizeof(float) * (size_t)nx), *dy = xalloc(sizeof(float) * (size_t)ny);
    for (int64_t i = 0; i < nx; i++) {
      rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
      x[i] = (float)((double)(rng >> 11) / 9007199254740992.0 * 2 - 1);
    }
    for (int64_t i = 0; i < ny; i++) {
      rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
      dy[i] = (float)((double)(rng >> 11) / 9007199254740992.0 * 2 - 1);
    }
    double *ref = xalloc(sizeof(double) * (size_t)nw);
    reference(s, n, x, dy, ref);
    float *dw[NALT];
    for (int a = 0; a < NALT; a++) dw[a] = xalloc(sizeof(float) * (size_t)nw);
    odnn o[2];
    odnn_make(&o[0], eng, s, n, dnnl_nhwc);
    odnn_make(&o[1], eng, s, n, dnnl_nChw8c);
    bwf_plan p;
    if (!bwf_plan_make(&p, n, s->h, s->w, s->c, s->k, s->h, s->w, 3, 3, 1, 1, 1, 1, 0)) {
      fprintf(stderr, "bench_conv_bwf: no AVX2/FMA\n");
      return 1;
    }
    bwf_plan_tune(&p, rows, chunk);
    fprintf(stderr, "  direct: group rows %lld, %lld chunks of %lld images, workspace %llu\n",
            (long long)p.group_rows, (long long)p.chunks, (long long)p.chunk_images,
            (unsigned long long)bwf_workspace_bytes(&p));
    void *ws = xalloc(bwf_workspace_bytes(&p));
    double best[NALT];
    for (int a = 0; a < NALT; a++) best[a] = 1e30;
    for (int64_t round = 0; round <= rounds; round++)
      for (int a = 0; a < NALT; a++) {
        const double t0 = now_s();
        if (a < 2) odnn_run(&o[a], strm, x, dy, dw[a]);
        else direct_run(&p, x, dy, dw[a], ws);
        const double t = now_s() - t0;
        if (round > 0 && t < best[a]) best[a] = t; /* round 0 warms up */
      }
    const double flop = 2.0 * (double)n * (double)(s->h * s->w) * (double)(s->k * 9 * s->c);
    for (int a = 0; a < NALT; a++)
      printf("%-20s %-12s %9.3f %8.1f %10.2e\n", s->name, alt_names[a], best[a] * 1e3,
             flop / best[a] * 1e-9, rel_diff(dw[a], ref, nw));
    fflush(stdout);
    free(x), free(dy), free(ref), free(ws);
    for (int a = 0; a < NALT; a++) free(dw[a]);
  }
  return 0;
}
