/* Checkpoints: the plan hash, the documented file layout, round trips,
 * atomic saves that fail cleanly, and every refusal on load (truncated,
 * flipped bits, wrong magic, future version, another plan), each of which
 * leaves the arena and the counters untouched. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blueprint/checkpoint.h"
#include "blueprint/model.h"
#include "blueprint/model_yaml.h"

/* The documented layout (docs/checkpoint-format.md), restated here so that
 * the test notices when the code drifts from the document. */
#define HEADER_BYTES 384
#define TABLE_BYTES 96
#define TRAILER_BYTES 12

/* ---- helpers ---------------------------------------------------------- */

/* CRC-32 (IEEE 802.3, reflected 0xEDB88320), written out independently of
 * zlib so the format's checksum is checked against its definition. */
static uint32_t crc32_ref(const unsigned char *p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return c ^ 0xffffffffu;
}

static uint64_t le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static uint32_t le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_le64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* The final CRC of format version 3: every byte before it except the
 * header CRC (bytes 380..383), so that it depends on the whole header. */
static uint32_t body_crc(const unsigned char *img, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n - TRAILER_BYTES; i++) {
    if (i >= 380 && i < 384) continue;
    c ^= img[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return c ^ 0xffffffffu;
}

/* Recomputes both CRCs of an edited image, as a well-behaved writer would. */
static void reseal(unsigned char *img, size_t n) {
  put_le32(img + 380, crc32_ref(img, 380));
  put_le32(img + n - TRAILER_BYTES, body_crc(img, n));
}

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static unsigned char *random_arena(const bp_plan *p, uint64_t seed) {
  size_t n = (size_t)bp_plan_total_bytes(p);
  unsigned char *a = malloc(n);
  ck_assert_ptr_nonnull(a);
  /* Clearing bit 30 of every (little-endian) 32-bit word keeps each float's
   * exponent below all ones: random but finite, as load requires of state. */
  for (size_t i = 0; i < n; i++)
    a[i] = (unsigned char)(splitmix(&seed) & (i % 4 == 3 ? 0xbf : 0xff));
  return a;
}

static unsigned char *dup_bytes(const unsigned char *b, size_t n) {
  unsigned char *d = malloc(n ? n : 1);
  ck_assert_ptr_nonnull(d);
  memcpy(d, b, n);
  return d;
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "cannot create %s: %s", path, strerror(errno));
  ck_assert_uint_eq(fwrite(data, 1, n, f), n);
  ck_assert_int_eq(fclose(f), 0);
}

static unsigned char *read_file(const char *path, size_t *n_out) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s: %s", path, strerror(errno));
  ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
  long n = ftell(f);
  ck_assert_int_ge(n, 0);
  rewind(f);
  unsigned char *b = malloc((size_t)n + 1);
  ck_assert_ptr_nonnull(b);
  ck_assert_uint_eq(fread(b, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *n_out = (size_t)n;
  return b;
}

static char tmp_root[4096];

static void make_tmpdir(void) {
  const char *t = getenv("TMPDIR");
  snprintf(tmp_root, sizeof tmp_root, "%s/bp_ckpt_XXXXXX", t && t[0] ? t : "/tmp");
  ck_assert_msg(mkdtemp(tmp_root) != NULL, "mkdtemp: %s", strerror(errno));
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)ftw;
  if (flag == FTW_DP) chmod(path, 0700);
  return remove(path);
}

static void remove_tmpdir(void) {
  chmod(tmp_root, 0700);
  nftw(tmp_root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void in_tmp(char *out, size_t size, const char *name) {
  snprintf(out, size, "%s/%s", tmp_root, name);
}

/* Number of entries of `dir` whose name contains ".tmp.". */
static int temp_files_in(const char *dir) {
  DIR *d = opendir(dir);
  ck_assert_msg(d != NULL, "opendir %s: %s", dir, strerror(errno));
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strstr(e->d_name, ".tmp.")) n++;
  closedir(d);
  return n;
}

static const bp_init kaiming = {BP_INIT_KAIMING_NORMAL, 0, 0, 1};
static const bp_init zeros = {BP_INIT_ZEROS, 0, 0, 0};
static const bp_init ones = {BP_INIT_ONES, 0, 0, 0};

/* A small conv-BN-FC net with tensors in every kind of region; `fc_in`
 * changes one parameter's shape. Variants 4x4 images, batches[v]. */
static bp_plan *net_plan(bp_plan_options o, int64_t fc_in, const int64_t *batches, int n) {
  bp_plan *p = NULL;
  ck_assert_int_eq(bp_plan_create(&o, &p), BP_OK);
  for (int v = 0; v < n; v++) {
    char name[16];
    snprintf(name, sizeof name, "v%d", v);
    int64_t b = batches[v];
    ck_assert_int_eq(bp_plan_begin_variant(p, name, b, 4, 4), BP_OK);
    int32_t two[2], id;
    bp_param_ids ids;
    bp_dtype feat = o.amp ? BP_DTYPE_FP16 : BP_DTYPE_FP32;
    ck_assert_int_eq(bp_plan_alloc_input(p, "input", (bp_shape){b, 4, 4, 1}, BP_DTYPE_FP32, two),
                     BP_OK);
    ck_assert_int_eq(bp_plan_alloc_input(p, "label", (bp_shape){b, 1, 1, 1}, BP_DTYPE_INT32, two),
                     BP_OK);
    ck_assert_int_eq(bp_plan_alloc_bn_stats(p, "bn1", 6, two), BP_OK);
    ck_assert_int_eq(bp_plan_alloc_param(p, BP_PARAM_CONV_FIRST, "conv1.w",
                                         (bp_shape){6, 3, 3, 1}, kaiming, &ids),
                     BP_OK);
    ck_assert_int_eq(bp_plan_alloc_param(p, BP_PARAM_BN_WEIGHT, "bn1.gamma",
                                         (bp_shape){1, 1, 1, 6}, ones, &ids),
                     BP_OK);
    ck_assert_int_eq(bp_plan_alloc_param(p, BP_PARAM_BN_BIAS, "bn1.beta", (bp_shape){1, 1, 1, 6},
                                         zeros, &ids),
                     BP_OK);
    ck_assert_int_eq(bp_plan_alloc_param(p, BP_PARAM_FC_WEIGHT, "fc.w",
                                         (bp_shape){10, 1, 1, fc_in}, kaiming, &ids),
                     BP_OK);
    ck_assert_int_eq(bp_plan_alloc_param(p, BP_PARAM_FC_BIAS, "fc.b", (bp_shape){1, 1, 1, 10},
                                         zeros, &ids),
                     BP_OK);
    ck_assert_int_eq(bp_plan_alloc_feature(p, "conv1.out", (bp_shape){b, 4, 4, 6}, feat, &id),
                     BP_OK);
    ck_assert_int_eq(bp_plan_alloc_feature(p, "fc.out", (bp_shape){b, 1, 1, 10}, feat, &id),
                     BP_OK);
    ck_assert_int_eq(bp_plan_alloc_result(p, "loss", (bp_shape){1, 1, 1, 2}, &id), BP_OK);
    ck_assert_int_eq(bp_plan_alloc_scalar(p, "lr", BP_DTYPE_FP32, zeros, &id), BP_OK);
    ck_assert_int_eq(bp_plan_alloc_temp(p, "ws", (bp_shape){1, 1, 1, 64}, BP_DTYPE_FP32, &id),
                     BP_OK);
    ck_assert_int_eq(bp_plan_end_variant(p), BP_OK);
  }
  ck_assert_int_eq(bp_plan_finalize(p), BP_OK);
  return p;
}

static const int64_t default_batches[] = {8, 3};

static bp_plan *default_plan(bp_plan_options o) { return net_plan(o, 24, default_batches, 2); }

static bp_plan *mlp_plan_packed(int ema, int no_reuse) {
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_msg(src != NULL, "BP_SOURCE_DIR is not set (run through CTest)");
  char path[4096];
  snprintf(path, sizeof path, "%s/models/mlp.yaml", src);
  bp_model *m = NULL;
  ck_assert_msg(bp_model_load(path, &m) == BP_OK, "%s", bp_last_error());
  bp_compile_options co = bp_compile_options_from_model(m);
  co.plan.ema = ema;
  co.no_reuse = no_reuse;
  bp_plan *p = NULL;
  ck_assert_msg(bp_model_compile(m, &co, &p) == BP_OK, "%s", bp_last_error());
  bp_model_destroy(m);
  return p;
}

static bp_plan *mlp_plan(int ema) { return mlp_plan_packed(ema, 0); }

static const bp_train_state sample_state = {
    .seed = 0x0123456789abcdefull,
    .epoch = 7,
    .step = 123,
    .global_step = 3290,
    .loss_scale = 32768.5,
    .good_steps = 0xfedcba9876543210ull,
    .optimizer_steps = 3200,
    .skipped_steps = 17,
};

static void assert_state_eq(const bp_train_state *a, const bp_train_state *b) {
  ck_assert_uint_eq(a->seed, b->seed);
  ck_assert_uint_eq(a->epoch, b->epoch);
  ck_assert_uint_eq(a->step, b->step);
  ck_assert_uint_eq(a->global_step, b->global_step);
  ck_assert_int_eq(memcmp(&a->loss_scale, &b->loss_scale, sizeof(double)), 0);
  ck_assert_uint_eq(a->good_steps, b->good_steps);
  ck_assert_uint_eq(a->optimizer_steps, b->optimizer_steps);
  ck_assert_uint_eq(a->skipped_steps, b->skipped_steps);
}

static void state_spans(const bp_plan *p, bp_span out[2]) {
  ck_assert_int_eq(bp_plan_resolve(p, BP_REGION_B, BP_REGION_E_CONV_DEEP, &out[0]), BP_OK);
  ck_assert_int_eq(bp_plan_resolve(p, BP_REGION_M_BN_BIAS, BP_REGION_N, &out[1]), BP_OK);
}

static int in_spans(const bp_span s[2], uint64_t at) {
  for (int i = 0; i < 2; i++)
    if (at >= s[i].offset && at < s[i].offset + s[i].bytes) return 1;
  return 0;
}

/* Saves a checkpoint of `p` with a random arena, then loads it into another
 * random arena: state spans come back byte for byte, nothing else moves. */
static void round_trip(const bp_plan *p, const char *file) {
  char path[4200];
  in_tmp(path, sizeof path, file);
  size_t total = (size_t)bp_plan_total_bytes(p);
  unsigned char *src = random_arena(p, 1);
  ck_assert_msg(bp_checkpoint_save(path, p, src, &sample_state) == BP_OK, "%s", bp_last_error());

  size_t n = 0;
  unsigned char *img = read_file(path, &n);
  ck_assert_uint_eq(n, bp_checkpoint_file_bytes(p));
  free(img);

  unsigned char *dst = random_arena(p, 2);
  unsigned char *before = dup_bytes(dst, total);
  bp_train_state got;
  memset(&got, 0, sizeof got);
  ck_assert_msg(bp_checkpoint_load(path, p, dst, &got) == BP_OK, "%s", bp_last_error());
  assert_state_eq(&got, &sample_state);
  bp_span s[2];
  state_spans(p, s);
  for (int i = 0; i < 2; i++)
    ck_assert_int_eq(memcmp(dst + s[i].offset, src + s[i].offset, (size_t)s[i].bytes), 0);
  /* everything outside the spans: before the first, between, after the last */
  uint64_t gaps[3][2] = {{0, s[0].offset},
                         {s[0].offset + s[0].bytes, s[1].offset},
                         {s[1].offset + s[1].bytes, total}};
  for (int i = 0; i < 3; i++) {
    ck_assert_uint_le(gaps[i][0], gaps[i][1]);
    ck_assert_msg(memcmp(dst + gaps[i][0], before + gaps[i][0], gaps[i][1] - gaps[i][0]) == 0,
                  "bytes %" PRIu64 "..%" PRIu64 " outside the state spans changed", gaps[i][0],
                  gaps[i][1]);
  }
  ck_assert_int_eq(temp_files_in(tmp_root), 0);
  free(src);
  free(dst);
  free(before);
}

/* ---- the plan hash ------------------------------------------------------ */

START_TEST(hash_is_stable_and_sensitive) {
  const bp_plan_options sgd = {0, 0, BP_OPT_SGD};
  bp_plan *a = default_plan(sgd), *b = default_plan(sgd);
  ck_assert_uint_eq(bp_plan_hash(a), bp_plan_hash(b));
  /* Pinned: the serialization is documented and must not drift between
   * builds or machines (a change here orphans every existing checkpoint).
   * The value was checked against an independent Python implementation of
   * the serialization in docs/checkpoint-format.md. */
  ck_assert_uint_eq(bp_plan_hash(a), UINT64_C(0x5e617d719858a24d));

  bp_plan *shape = net_plan(sgd, 25, default_batches, 2);
  ck_assert_uint_ne(bp_plan_hash(a), bp_plan_hash(shape));
  bp_plan *ema = default_plan((bp_plan_options){0, 1, BP_OPT_SGD});
  bp_plan *amp = default_plan((bp_plan_options){1, 0, BP_OPT_SGD});
  bp_plan *adamw = default_plan((bp_plan_options){0, 0, BP_OPT_ADAMW});
  bp_plan *lars = default_plan((bp_plan_options){0, 0, BP_OPT_LARS});
  const bp_plan *all[] = {a, shape, ema, amp, adamw, lars};
  for (int i = 0; i < 6; i++)
    for (int j = i + 1; j < 6; j++) ck_assert_uint_ne(bp_plan_hash(all[i]), bp_plan_hash(all[j]));
  /* amp 2 is amp on: options are hashed by meaning */
  bp_plan *amp2 = default_plan((bp_plan_options){2, 0, BP_OPT_SGD});
  ck_assert_uint_eq(bp_plan_hash(amp), bp_plan_hash(amp2));
  /* another variant that enlarges no slot leaves the layout, and the hash, alone */
  const int64_t three[] = {8, 3, 5};
  bp_plan *more = net_plan(sgd, 24, three, 3);
  ck_assert_uint_eq(bp_plan_total_bytes(more), bp_plan_total_bytes(a));
  ck_assert_uint_eq(bp_plan_hash(more), bp_plan_hash(a));
  /* another training batch: the step counters count other steps */
  const int64_t big[] = {64, 3};
  bp_plan *bigger = net_plan(sgd, 24, big, 2);
  ck_assert_uint_ne(bp_plan_hash(bigger), bp_plan_hash(a));
  /* larger feature slots (an evaluation batch of 50) move every slot after
   * the state spans and the plan's size, not what a checkpoint holds */
  const int64_t wide[] = {8, 50};
  bp_plan *wider = net_plan(sgd, 24, wide, 2);
  ck_assert_uint_gt(bp_plan_total_bytes(wider), bp_plan_total_bytes(a));
  ck_assert_uint_eq(bp_plan_hash(wider), bp_plan_hash(a));
  ck_assert_uint_eq(bp_plan_hash(NULL), 0);
  bp_plan *all_destroy[] = {a, b, shape, ema, amp, adamw, lars, amp2, more, bigger, wider};
  for (int i = 0; i < 11; i++) bp_plan_destroy(all_destroy[i]);
}
END_TEST

START_TEST(hash_of_compiled_models) {
  bp_plan *a = mlp_plan(0), *b = mlp_plan(0), *e = mlp_plan(1);
  ck_assert_uint_eq(bp_plan_hash(a), bp_plan_hash(b));
  ck_assert_uint_ne(bp_plan_hash(a), bp_plan_hash(e));
  bp_plan *hand = default_plan((bp_plan_options){0, 0, BP_OPT_SGD});
  ck_assert_uint_ne(bp_plan_hash(a), bp_plan_hash(hand));
  bp_plan_destroy(a);
  bp_plan_destroy(b);
  bp_plan_destroy(e);
  bp_plan_destroy(hand);
}
END_TEST

/* ---- the file layout ------------------------------------------------------ */

START_TEST(file_layout_is_as_documented) {
  bp_plan *p = default_plan((bp_plan_options){0, 1, BP_OPT_ADAMW});
  char path[4200];
  in_tmp(path, sizeof path, "layout.ckpt");
  unsigned char *arena = random_arena(p, 3);
  ck_assert_msg(bp_checkpoint_save_note(path, p, arena, &sample_state, "net\tv1\nrun 3") == BP_OK,
                "%s", bp_last_error());
  size_t n = 0;
  unsigned char *img = read_file(path, &n);
  bp_span s[2];
  state_spans(p, s);
  ck_assert_uint_gt(s[0].bytes, 0);
  ck_assert_uint_gt(s[1].bytes, 0);
  ck_assert_uint_eq(n, HEADER_BYTES + TABLE_BYTES + s[0].bytes + s[1].bytes + TRAILER_BYTES);

  ck_assert_int_eq(memcmp(img, "BPCKPT", 6), 0);
  ck_assert_int_eq(img[6], 3); /* u16 version 3, little-endian */
  ck_assert_int_eq(img[7], 0);
  ck_assert_uint_eq(le32(img + 8), HEADER_BYTES);
  ck_assert_uint_eq(le32(img + 12), 2);
  ck_assert_uint_eq(le64(img + 16), bp_plan_hash(p));
  ck_assert_uint_eq(le64(img + 24), bp_plan_total_bytes(p));
  ck_assert_uint_eq(le64(img + 32), s[0].bytes + s[1].bytes);
  ck_assert_uint_eq(le64(img + 40), n);
  ck_assert_uint_eq(le64(img + 48), sample_state.seed);
  ck_assert_uint_eq(le64(img + 56), sample_state.epoch);
  ck_assert_uint_eq(le64(img + 64), sample_state.step);
  ck_assert_uint_eq(le64(img + 72), sample_state.global_step);
  ck_assert_uint_eq(le64(img + 80), UINT64_C(0x40e0001000000000)); /* 32768.5 */
  ck_assert_uint_eq(le64(img + 88), sample_state.good_steps);
  /* the note, one line, then the plan summary */
  const char *text = (const char *)img + 96;
  ck_assert_uint_lt(strnlen(text, 256), 256);
  ck_assert_msg(strncmp(text, "net v1 run 3; ", 14) == 0, "text: %s", text);
  ck_assert_msg(strstr(text, "adamw, amp off, ema on; variants v0 8x4x4, v1 3x4x4") != NULL,
                "text: %s", text);
  ck_assert_uint_eq(le64(img + 352), sample_state.optimizer_steps);
  ck_assert_uint_eq(le64(img + 360), sample_state.skipped_steps);
  for (int i = 368; i < 380; i++) ck_assert_int_eq(img[i], 0);
  ck_assert_uint_eq(le32(img + 380), crc32_ref(img, 380));
  /* section table */
  const unsigned char *t = img + HEADER_BYTES;
  ck_assert_str_eq((const char *)t, "B");
  ck_assert_str_eq((const char *)t + 16, "E_CONV_DEEP");
  ck_assert_uint_eq(le64(t + 32), s[0].offset);
  ck_assert_uint_eq(le64(t + 40), s[0].bytes);
  ck_assert_str_eq((const char *)t + 48, "M_BN_BIAS");
  ck_assert_str_eq((const char *)t + 64, "N");
  ck_assert_uint_eq(le64(t + 80), s[1].offset);
  ck_assert_uint_eq(le64(t + 88), s[1].bytes);
  /* data, then the CRC of everything before it but the header CRC, then the end marker */
  const unsigned char *d = t + TABLE_BYTES;
  ck_assert_int_eq(memcmp(d, arena + s[0].offset, (size_t)s[0].bytes), 0);
  ck_assert_int_eq(memcmp(d + s[0].bytes, arena + s[1].offset, (size_t)s[1].bytes), 0);
  ck_assert_uint_eq(le32(img + n - 12), body_crc(img, n));
  ck_assert_int_eq(memcmp(img + n - 8, "BPCKEND\n", 8), 0);

  bp_checkpoint_info info;
  ck_assert_msg(bp_checkpoint_read_info(path, &info) == BP_OK, "%s", bp_last_error());
  ck_assert_uint_eq(info.format_version, 3);
  ck_assert_uint_eq(info.plan_hash, bp_plan_hash(p));
  ck_assert_uint_eq(info.plan_total_bytes, bp_plan_total_bytes(p));
  ck_assert_uint_eq(info.data_bytes, s[0].bytes + s[1].bytes);
  ck_assert_uint_eq(info.file_bytes, n);
  assert_state_eq(&info.state, &sample_state);
  ck_assert_str_eq(info.text, text);
  free(img);
  free(arena);
  bp_plan_destroy(p);
}
END_TEST

START_TEST(a_long_note_is_cut_to_the_field) {
  bp_plan *p = default_plan((bp_plan_options){0, 0, BP_OPT_SGD});
  char path[4200], note[1000];
  in_tmp(path, sizeof path, "note.ckpt");
  memset(note, 'x', sizeof note - 1);
  note[sizeof note - 1] = '\0';
  unsigned char *arena = random_arena(p, 4);
  ck_assert_int_eq(bp_checkpoint_save_note(path, p, arena, &sample_state, note), BP_OK);
  bp_checkpoint_info info;
  ck_assert_int_eq(bp_checkpoint_read_info(path, &info), BP_OK);
  ck_assert_uint_eq(strlen(info.text), BP_CHECKPOINT_TEXT_MAX - 1);
  free(arena);
  bp_plan_destroy(p);
}
END_TEST

/* ---- round trips --------------------------------------------------------- */

START_TEST(round_trip_every_option_set) {
  const bp_plan_options sets[] = {
      {0, 0, BP_OPT_SGD}, {0, 1, BP_OPT_ADAMW}, {1, 1, BP_OPT_LARS}, {1, 0, BP_OPT_ADAMW}};
  for (int i = 0; i < 4; i++) {
    bp_plan *p = default_plan(sets[i]);
    round_trip(p, "net.ckpt");
    bp_plan_destroy(p);
  }
}
END_TEST

START_TEST(round_trip_compiled_mlp) {
  bp_plan *p = mlp_plan(1);
  round_trip(p, "mlp.ckpt");
  /* the spans really hold the parameters and their moments */
  bp_span s[2];
  state_spans(p, s);
  const bp_dtensor *w = bp_plan_tensor(p, 0, bp_plan_find_tensor(p, "fc1.w"));
  ck_assert_ptr_nonnull(w);
  ck_assert(in_spans(s, w->offset));
  bp_plan_destroy(p);
}
END_TEST

/* Each state tensor of `b` holds the bytes of the same-named one of `a`. */
static void assert_same_state_bytes(const bp_plan *a, const unsigned char *arena_a,
                                    const bp_plan *b, const unsigned char *arena_b) {
  bp_span s[2];
  state_spans(b, s);
  int compared = 0;
  for (int32_t id = 0; id < bp_plan_tensor_count(b); id++) {
    const bp_dtensor *tb = bp_plan_tensor(b, 0, id);
    if (!in_spans(s, tb->offset)) continue;
    const bp_dtensor *ta = bp_plan_tensor(a, 0, bp_plan_find_tensor(a, tb->name));
    ck_assert_uint_eq(ta->slot_bytes, tb->slot_bytes);
    ck_assert_msg(memcmp(arena_a + ta->offset, arena_b + tb->offset, (size_t)tb->slot_bytes) == 0,
                  "'%s' differs", tb->name);
    compared++;
  }
  ck_assert_int_gt(compared, 8);
}

/* Plans that differ only in how their features are packed (here liveness
 * reuse on and off; fusion is the other case, tests/test_fusion.c) read
 * each other's checkpoints: the hash covers the state spans alone. */
START_TEST(a_plan_that_packs_features_otherwise_reads_the_checkpoint) {
  bp_plan *packed = mlp_plan_packed(1, 0), *plain = mlp_plan_packed(1, 1);
  ck_assert_uint_lt(bp_plan_total_bytes(packed), bp_plan_total_bytes(plain));
  ck_assert_uint_eq(bp_plan_hash(packed), bp_plan_hash(plain));
  const bp_plan *from[] = {packed, plain}, *to[] = {plain, packed};
  char path[4200];
  in_tmp(path, sizeof path, "cross.ckpt");
  for (int k = 0; k < 2; k++) {
    unsigned char *src = random_arena(from[k], 20 + (uint64_t)k);
    ck_assert_int_eq(bp_checkpoint_save(path, from[k], src, &sample_state), BP_OK);
    unsigned char *dst = random_arena(to[k], 30 + (uint64_t)k);
    bp_train_state got;
    ck_assert_msg(bp_checkpoint_load(path, to[k], dst, &got) == BP_OK, "%s", bp_last_error());
    assert_state_eq(&got, &sample_state);
    assert_same_state_bytes(from[k], src, to[k], dst);
    free(src);
    free(dst);
  }
  bp_plan_destroy(packed);
  bp_plan_destroy(plain);
}
END_TEST

START_TEST(save_replaces_an_existing_checkpoint) {
  bp_plan *p = default_plan((bp_plan_options){0, 0, BP_OPT_SGD});
  char path[4200];
  in_tmp(path, sizeof path, "again.ckpt");
  unsigned char *a = random_arena(p, 5), *b = random_arena(p, 6);
  bp_train_state later = sample_state;
  later.epoch = 8;
  later.loss_scale = 1.0;
  ck_assert_int_eq(bp_checkpoint_save(path, p, a, &sample_state), BP_OK);
  ck_assert_int_eq(bp_checkpoint_save(path, p, b, &later), BP_OK);
  unsigned char *dst = random_arena(p, 7);
  bp_train_state got;
  ck_assert_int_eq(bp_checkpoint_load(path, p, dst, &got), BP_OK);
  assert_state_eq(&got, &later);
  bp_span s[2];
  state_spans(p, s);
  ck_assert_int_eq(memcmp(dst + s[0].offset, b + s[0].offset, (size_t)s[0].bytes), 0);
  ck_assert_int_eq(temp_files_in(tmp_root), 0);
  /* a relative path (no directory part) works too */
  char cwd[4096];
  ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
  ck_assert_int_eq(chdir(tmp_root), 0);
  ck_assert_msg(bp_checkpoint_save("relative.ckpt", p, a, &sample_state) == BP_OK, "%s",
                bp_last_error());
  ck_assert_int_eq(bp_checkpoint_load("relative.ckpt", p, dst, &got), BP_OK);
  ck_assert_int_eq(chdir(cwd), 0);
  free(a);
  free(b);
  free(dst);
  bp_plan_destroy(p);
}
END_TEST

/* ---- atomic saves -------------------------------------------------------- */

/* Saving to `path` fails with BP_ERR_IO and a message naming `path` and
 * containing `why`. */
static void expect_save_fails(const char *path, const bp_plan *p, const void *arena,
                              const char *why) {
  bp_status st = bp_checkpoint_save(path, p, arena, &sample_state);
  const char *msg = bp_last_error();
  ck_assert_msg(st == BP_ERR_IO, "saving %s: status %s (%s)", path, bp_status_str(st), msg);
  ck_assert_msg(strstr(msg, path) != NULL, "message lacks the path: %s", msg);
  ck_assert_msg(strstr(msg, why) != NULL, "message lacks \"%s\": %s", why, msg);
  ck_assert_msg(strchr(msg, '\n') == NULL, "message is not one line: %s", msg);
}

START_TEST(failed_saves_leave_the_old_checkpoint) {
  bp_plan *p = default_plan((bp_plan_options){0, 0, BP_OPT_SGD});
  unsigned char *arena = random_arena(p, 8), *other = random_arena(p, 9);
  char good[4200], path[4400], sub[4200];
  in_tmp(good, sizeof good, "good.ckpt");
  ck_assert_int_eq(bp_checkpoint_save(good, p, arena, &sample_state), BP_OK);
  size_t n0 = 0;
  unsigned char *orig = read_file(good, &n0);

  /* a directory that does not exist */
  in_tmp(path, sizeof path, "no/such/dir/x.ckpt");
  expect_save_fails(path, p, other, strerror(ENOENT));
  /* a "directory" that is a regular file (also refused to root) */
  snprintf(path, sizeof path, "%s/sub.ckpt", good);
  expect_save_fails(path, p, other, strerror(ENOTDIR));

  /* the target is a non-empty directory: refused before any temporary file
   * is written (blueprint/outfile.h) */
  in_tmp(sub, sizeof sub, "busy");
  ck_assert_int_eq(mkdir(sub, 0700), 0);
  char inside[4300];
  snprintf(inside, sizeof inside, "%s/keep", sub);
  write_file(inside, "k", 1);
  expect_save_fails(sub, p, other, "is a directory");
  ck_assert_int_eq(temp_files_in(tmp_root), 0);

  /* writing fails halfway (a file size limit): the old file is intact */
  struct rlimit old_limit, small;
  ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
  small = old_limit;
  small.rlim_cur = (rlim_t)(n0 / 2);
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
  expect_save_fails(good, p, other, strerror(EFBIG));
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  signal(SIGXFSZ, old_handler);
  ck_assert_int_eq(temp_files_in(tmp_root), 0);

  /* a directory without write permission (root may write anyway) */
  char ro[4200], ro_file[4300];
  in_tmp(ro, sizeof ro, "readonly");
  ck_assert_int_eq(mkdir(ro, 0700), 0);
  snprintf(ro_file, sizeof ro_file, "%s/x.ckpt", ro);
  ck_assert_int_eq(bp_checkpoint_save(ro_file, p, arena, &sample_state), BP_OK);
  ck_assert_int_eq(chmod(ro, 0500), 0);
  if (geteuid() != 0) {
    expect_save_fails(ro_file, p, other, strerror(EACCES));
    ck_assert_int_eq(temp_files_in(ro), 0);
  }
  ck_assert_int_eq(chmod(ro, 0700), 0);
  size_t n1 = 0;
  unsigned char *now = read_file(ro_file, &n1);
  ck_assert_uint_eq(n1, n0);
  ck_assert_int_eq(memcmp(now, orig, n0), 0);
  free(now);

  now = read_file(good, &n1);
  ck_assert_uint_eq(n1, n0);
  ck_assert_int_eq(memcmp(now, orig, n0), 0);
  ck_assert_int_eq(temp_files_in(tmp_root), 0);
  /* and it still loads */
  bp_train_state got;
  ck_assert_int_eq(bp_checkpoint_load(good, p, other, &got), BP_OK);
  free(now);
  free(orig);
  free(arena);
  free(other);
  bp_plan_destroy(p);
}
END_TEST

/* ---- refusals ---------------------------------------------------------- */

typedef struct fixture {
  bp_plan *plan;
  unsigned char *image; /* a valid checkpoint of plan */
  size_t image_bytes;
  unsigned char *arena, *arena_copy;
  char path[4200];
} fixture;

static void fixture_init(fixture *f, bp_plan_options o) {
  f->plan = default_plan(o);
  char good[4200];
  in_tmp(good, sizeof good, "source.ckpt");
  unsigned char *src = random_arena(f->plan, 10);
  ck_assert_int_eq(bp_checkpoint_save(good, f->plan, src, &sample_state), BP_OK);
  free(src);
  f->image = read_file(good, &f->image_bytes);
  f->arena = random_arena(f->plan, 11);
  f->arena_copy = dup_bytes(f->arena, (size_t)bp_plan_total_bytes(f->plan));
  in_tmp(f->path, sizeof f->path, "bad.ckpt");
}

static void fixture_free(fixture *f) {
  free(f->image);
  free(f->arena);
  free(f->arena_copy);
  bp_plan_destroy(f->plan);
}

/* Loading `bytes` fails with `want` (any failure when want is BP_OK), a
 * one-line message naming the file and containing `needle` (if any), and
 * neither the arena nor the counters change. */
static void expect_refused_(fixture *f, const unsigned char *bytes, size_t n, bp_status want,
                            const char *needle, const char *what) {
  write_file(f->path, bytes, n);
  bp_train_state out;
  memset(&out, 0xa5, sizeof out);
  bp_status st = bp_checkpoint_load(f->path, f->plan, f->arena, &out);
  const char *msg = bp_last_error();
  if (want == BP_OK)
    ck_assert_msg(st != BP_OK, "%s: loaded", what);
  else
    ck_assert_msg(st == want, "%s: status %s, want %s (%s)", what, bp_status_str(st),
                  bp_status_str(want), msg);
  ck_assert_msg(strstr(msg, f->path) != NULL, "%s: message lacks the file: %s", what, msg);
  if (needle)
    ck_assert_msg(strstr(msg, needle) != NULL, "%s: message lacks \"%s\": %s", what, needle, msg);
  ck_assert_msg(strchr(msg, '\n') == NULL, "%s: message is not one line: %s", what, msg);
  for (size_t i = 0; i < sizeof out; i++)
    ck_assert_msg(((unsigned char *)&out)[i] == 0xa5, "%s: state_out written", what);
  ck_assert_msg(memcmp(f->arena, f->arena_copy, (size_t)bp_plan_total_bytes(f->plan)) == 0,
                "%s: arena written", what);
}

START_TEST(truncated_files_are_refused) {
  fixture f;
  fixture_init(&f, (bp_plan_options){0, 1, BP_OPT_ADAMW});
  size_t m = f.image_bytes, crc_at = m - TRAILER_BYTES;
  size_t mid_data = HEADER_BYTES + TABLE_BYTES + (crc_at - HEADER_BYTES - TABLE_BYTES) / 2;
  const size_t cuts[] = {0, 1, 5, 6, 7, 8, 10, HEADER_BYTES - 1, HEADER_BYTES, HEADER_BYTES + 50,
                         mid_data, crc_at - 1, crc_at, crc_at + 2, m - 1};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    char needle[128], what[64];
    snprintf(needle, sizeof needle, "is truncated (%zu of %zu bytes)", cuts[i], m);
    snprintf(what, sizeof what, "cut at %zu", cuts[i]);
    expect_refused_(&f, f.image, cuts[i], BP_ERR_PARSE, needle, what);
  }
  /* one byte too many is not silently ignored */
  unsigned char *longer = malloc(m + 1);
  memcpy(longer, f.image, m);
  longer[m] = 0;
  expect_refused_(&f, longer, m + 1, BP_ERR_PARSE, "is corrupt", "one byte appended");
  free(longer);
  fixture_free(&f);
}
END_TEST

START_TEST(every_flipped_bit_is_refused) {
  fixture f;
  fixture_init(&f, (bp_plan_options){0, 1, BP_OPT_ADAMW});
  size_t m = f.image_bytes;
  unsigned char *img = dup_bytes(f.image, m);
  int tried = 0;
  for (size_t at = 0; at < m; at++) {
    /* every byte of header, table and trailer; ~300 spread over the data */
    int structural = at < HEADER_BYTES + TABLE_BYTES || at >= m - TRAILER_BYTES;
    size_t data_step = (m - HEADER_BYTES - TABLE_BYTES - TRAILER_BYTES) / 300 + 1;
    if (!structural && (at - HEADER_BYTES - TABLE_BYTES) % data_step != 0) continue;
    unsigned bit = (unsigned)((at * 5 + 3) % 8);
    img[at] ^= (unsigned char)(1u << bit);
    char what[64];
    snprintf(what, sizeof what, "bit %u of byte %zu", bit, at);
    if (at < 6)
      expect_refused_(&f, img, m, BP_ERR_PARSE, "is not a blueprint checkpoint (wrong magic)",
                      what);
    else if (at < 8) /* the version: refused as too new or as version 0 */
      expect_refused_(&f, img, m, BP_OK, "format version", what);
    else if (at < HEADER_BYTES)
      expect_refused_(&f, img, m, BP_ERR_PARSE, "is corrupt (header CRC mismatch)", what);
    else if (at < m - 8)
      expect_refused_(&f, img, m, BP_ERR_PARSE, "is corrupt (CRC mismatch)", what);
    else
      expect_refused_(&f, img, m, BP_ERR_PARSE, "is corrupt (no end marker)", what);
    img[at] ^= (unsigned char)(1u << bit);
    tried++;
  }
  ck_assert_int_gt(tried, 700);
  /* and the untouched image still loads */
  bp_train_state got;
  write_file(f.path, img, m);
  ck_assert_int_eq(bp_checkpoint_load(f.path, f.plan, f.arena, &got), BP_OK);
  free(img);
  fixture_free(&f);
}
END_TEST

START_TEST(not_a_checkpoint_and_future_versions) {
  fixture f;
  fixture_init(&f, (bp_plan_options){0, 0, BP_OPT_SGD});
  size_t m = f.image_bytes;
  const char *text = "model: mlp\nlayers: []\n";
  expect_refused_(&f, (const unsigned char *)text, strlen(text), BP_ERR_PARSE,
                  "is not a blueprint checkpoint (wrong magic)", "a YAML file");
  expect_refused_(&f, (const unsigned char *)"BPX", 3, BP_ERR_PARSE, "wrong magic", "3 bytes");
  unsigned char *img = dup_bytes(f.image, m);
  memcpy(img, "BPCKPU", 6);
  expect_refused_(&f, img, m, BP_ERR_PARSE, "wrong magic", "BPCKPU");

  /* a later format, properly sealed by its writer */
  const uint16_t versions[] = {4, 0x100, 0xffff};
  for (int i = 0; i < 3; i++) {
    memcpy(img, f.image, m);
    img[6] = (unsigned char)versions[i];
    img[7] = (unsigned char)(versions[i] >> 8);
    reseal(img, m);
    char needle[96];
    snprintf(needle, sizeof needle, "has format version %u, newer than this build reads (3)",
             (unsigned)versions[i]);
    expect_refused_(&f, img, m, BP_ERR_UNSUPPORTED, needle, "future version");
  }
  /* ...even cut short after its version */
  expect_refused_(&f, img, 8, BP_ERR_UNSUPPORTED, "newer", "future version, 8 bytes");

  /* a sealed header whose sizes disagree (a broken writer) */
  memcpy(img, f.image, m);
  put_le64(img + 40, le64(img + 40) + 256);
  reseal(img, m);
  expect_refused_(&f, img, m, BP_ERR_PARSE, "is corrupt (inconsistent header", "file bytes");

  /* a missing file and a directory */
  char missing[4200];
  in_tmp(missing, sizeof missing, "missing.ckpt");
  bp_train_state out;
  ck_assert_int_eq(bp_checkpoint_load(missing, f.plan, f.arena, &out), BP_ERR_IO);
  ck_assert(strstr(bp_last_error(), missing) != NULL);
  ck_assert(strstr(bp_last_error(), strerror(ENOENT)) != NULL);
  ck_assert_int_eq(bp_checkpoint_load(tmp_root, f.plan, f.arena, &out), BP_ERR_IO);
  ck_assert(strstr(bp_last_error(), "not a regular file") != NULL);
  ck_assert_int_eq(memcmp(f.arena, f.arena_copy, (size_t)bp_plan_total_bytes(f.plan)), 0);
  free(img);
  fixture_free(&f);
}
END_TEST

/* Writes a checkpoint of `other` and checks that `f`'s plan refuses it. */
static void expect_other_plan_refused(fixture *f, bp_plan *other, const char *what) {
  unsigned char *src = random_arena(other, 12);
  char path[4200];
  in_tmp(path, sizeof path, "other.ckpt");
  ck_assert_int_eq(bp_checkpoint_save(path, other, src, &sample_state), BP_OK);
  size_t n = 0;
  unsigned char *img = read_file(path, &n);
  char needle[160];
  snprintf(needle, sizeof needle,
           "was written for another plan (hash %016" PRIx64 ", this plan %016" PRIx64 ")",
           bp_plan_hash(other), bp_plan_hash(f->plan));
  expect_refused_(f, img, n, BP_ERR_SHAPE, needle, what);
  free(img);
  free(src);
}

/* The header of one valid checkpoint joined to the body of another of the
 * same layout (another epoch, other weights): format version 1 accepted
 * it, as its final CRC also covered the header CRC, whose residue is one
 * constant; versions 2 and later refuse it. */
START_TEST(a_header_spliced_onto_another_body_is_refused) {
  fixture f;
  fixture_init(&f, (bp_plan_options){0, 0, BP_OPT_SGD});
  size_t m = f.image_bytes;
  char other_path[4200];
  in_tmp(other_path, sizeof other_path, "other.ckpt");
  unsigned char *other_arena = random_arena(f.plan, 99);
  bp_train_state later = sample_state;
  later.epoch += 1;
  later.global_step += 100;
  ck_assert_int_eq(bp_checkpoint_save(other_path, f.plan, other_arena, &later), BP_OK);
  size_t n = 0;
  unsigned char *other = read_file(other_path, &n);
  ck_assert_uint_eq(n, m);
  unsigned char *img = dup_bytes(other, m);
  memcpy(img, f.image, HEADER_BYTES); /* header of f.image, body of `other` */
  expect_refused_(&f, img, m, BP_ERR_PARSE, "is corrupt (CRC mismatch)", "spliced header");
  memcpy(img, other, HEADER_BYTES); /* and the other way round */
  memcpy(img + HEADER_BYTES, f.image + HEADER_BYTES, m - HEADER_BYTES);
  expect_refused_(&f, img, m, BP_ERR_PARSE, "is corrupt (CRC mismatch)", "spliced body");
  free(img);
  free(other);
  free(other_arena);
  fixture_free(&f);
}
END_TEST

/* The first tensor of `region` in the plan. */
static const bp_dtensor *first_in(const bp_plan *p, bp_region region) {
  for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
    const bp_dtensor *t = bp_plan_tensor(p, 0, id);
    if (t->region == region) return t;
  }
  ck_abort_msg("no tensor in region %s", bp_region_get(region)->name);
  return NULL;
}

/* Element (n, 0, 0, c) of an FP32 tensor in a host arena. */
static void put_f32(unsigned char *arena, const bp_dtensor *t, int64_t n, int64_t c, float v) {
  memcpy(arena + t->offset + 4 * (uint64_t)(n * t->dev_stride[0] + c * t->dev_stride[3]), &v,
         sizeof v);
}

/* A properly sealed checkpoint of a diverged run: one NaN or infinity in a
 * weight, an EMA copy, a BN statistic or a moment is refused with a line
 * naming the file and the tensor; a NaN in a tensor's padding is not one of
 * its values and loads. */
START_TEST(non_finite_state_is_refused_by_tensor_name) {
  fixture f;
  fixture_init(&f, (bp_plan_options){0, 1, BP_OPT_ADAMW});
  const struct {
    bp_region region;
    float value;
  } cases[] = {
      {BP_REGION_W_CONV_FIRST, NAN},  {BP_REGION_W_FC_BIAS, -INFINITY},
      {BP_REGION_E_FC_WEIGHT, INFINITY}, {BP_REGION_B, NAN},
      {BP_REGION_M_BN_WEIGHT, NAN},   {BP_REGION_V_FC_WEIGHT, INFINITY},
  };
  unsigned char *src = random_arena(f.plan, 40);
  char sealed[4200];
  in_tmp(sealed, sizeof sealed, "diverged.ckpt");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const bp_dtensor *t = first_in(f.plan, cases[i].region);
    const int64_t n = t->shape.n - 1, c = t->shape.c - 1; /* the last element of a row */
    float keep;
    memcpy(&keep, src + t->offset + 4 * (uint64_t)(n * t->dev_stride[0] + c * t->dev_stride[3]),
           sizeof keep);
    put_f32(src, t, n, c, cases[i].value);
    ck_assert_int_eq(bp_checkpoint_save(sealed, f.plan, src, &sample_state), BP_OK);
    put_f32(src, t, n, c, keep);
    size_t m = 0;
    unsigned char *img = read_file(sealed, &m);
    char want[256];
    snprintf(want, sizeof want, "holds non-finite values in '%s' (a diverged run?)", t->name);
    expect_refused_(&f, img, m, BP_ERR_PARSE, want, bp_region_get(cases[i].region)->name);
    free(img);
  }
  /* padding: the bytes after conv1.w's 54 values, up to the next tensor
   * (offsets are multiples of 256) */
  const bp_dtensor *w = first_in(f.plan, BP_REGION_W_CONV_FIRST);
  const uint64_t end = w->offset + 4 * (uint64_t)(w->shape.n * w->dev_stride[0]);
  ck_assert_uint_ne(end % 256, 0);
  const float nan = NAN;
  memcpy(src + end, &nan, sizeof nan);
  ck_assert_int_eq(bp_checkpoint_save(sealed, f.plan, src, &sample_state), BP_OK);
  bp_train_state got;
  ck_assert_msg(bp_checkpoint_load(sealed, f.plan, f.arena, &got) == BP_OK, "%s",
                bp_last_error());
  free(src);
  fixture_free(&f);
}
END_TEST

/* Values a CRC cannot judge, in a properly sealed header: refused. And a
 * version-1 or -2 file (sealed by its own rule), whose plan hash this build
 * no longer computes, is refused with one line that says so. */
START_TEST(counters_no_trainer_writes_and_older_versions_are_refused) {
  fixture f;
  fixture_init(&f, (bp_plan_options){0, 0, BP_OPT_SGD});
  size_t m = f.image_bytes;
  unsigned char *img = dup_bytes(f.image, m);
  static const struct {
    size_t at;
    uint64_t value;
    const char *needle;
  } bad[] = {
      {80, UINT64_C(0x7ff8000000000000), "loss scale not a finite number > 0"}, /* NaN */
      {80, UINT64_C(0xbff0000000000000), "loss scale"},                         /* -1 */
      {80, 0, "loss scale"},                                                    /* 0 */
      {56, UINT64_C(1) << 62, "epoch past the trainer's range"},
      {64, UINT64_C(1) << 62, "step counters"},
      {80, UINT64_C(0x47f0000000000000), "loss scale"}, /* 2^128: past FP32 */
      {352, 3291, "more optimizer and skipped steps than steps"},
      {360, 91, "more optimizer and skipped steps than steps"}, /* 3200 + 91 > 3290 */
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    memcpy(img, f.image, m);
    put_le64(img + bad[k].at, bad[k].value);
    reseal(img, m);
    expect_refused_(&f, img, m, BP_ERR_PARSE, bad[k].needle, bad[k].needle);
  }
  memcpy(img, f.image, m);
  img[96 + 3] = '\n';
  reseal(img, m);
  expect_refused_(&f, img, m, BP_ERR_PARSE, "control characters", "a newline in the text");
  /* version 1: the final CRC covers the header CRC too; version 2 as 3 */
  for (int version = 1; version <= 2; version++) {
    memcpy(img, f.image, m);
    img[6] = (unsigned char)version;
    put_le32(img + 380, crc32_ref(img, 380));
    put_le32(img + m - TRAILER_BYTES,
             version == 1 ? crc32_ref(img, m - TRAILER_BYTES) : body_crc(img, m));
    char needle[96];
    snprintf(needle, sizeof needle, "has format version %d, older than this build reads (3",
             version);
    expect_refused_(&f, img, m, BP_ERR_UNSUPPORTED, needle, "an older version");
    bp_checkpoint_info info;
    ck_assert_int_eq(bp_checkpoint_read_info(f.path, &info), BP_ERR_UNSUPPORTED);
  }
  free(img);
  fixture_free(&f);
}
END_TEST

START_TEST(another_plan_is_refused) {
  fixture f;
  fixture_init(&f, (bp_plan_options){0, 0, BP_OPT_SGD});
  bp_plan *ema = default_plan((bp_plan_options){0, 1, BP_OPT_SGD});
  expect_other_plan_refused(&f, ema, "ema on");
  bp_plan *adamw = default_plan((bp_plan_options){0, 0, BP_OPT_ADAMW});
  expect_other_plan_refused(&f, adamw, "adamw");
  bp_plan *shape = net_plan((bp_plan_options){0, 0, BP_OPT_SGD}, 23, default_batches, 2);
  expect_other_plan_refused(&f, shape, "fc.w of another shape");
  bp_plan *mlp = mlp_plan(0);
  expect_other_plan_refused(&f, mlp, "the mlp model");
  /* the message says what each plan is */
  ck_assert(strstr(bp_last_error(), "this plan: ") != NULL);
  ck_assert(strstr(bp_last_error(), "variants") != NULL);

  /* same hash, but a section table that disagrees with the plan: a span's
   * size or name */
  unsigned char *img = dup_bytes(f.image, f.image_bytes);
  put_le64(img + HEADER_BYTES + 88, le64(img + HEADER_BYTES + 88) + 256);
  put_le64(img + HEADER_BYTES + 40, le64(img + HEADER_BYTES + 40) - 256);
  reseal(img, f.image_bytes);
  expect_refused_(&f, img, f.image_bytes, BP_ERR_SHAPE, "state sections differ", "span sizes");
  memcpy(img, f.image, f.image_bytes);
  img[HEADER_BYTES + 64] = 'V';
  reseal(img, f.image_bytes);
  expect_refused_(&f, img, f.image_bytes, BP_ERR_SHAPE, "state sections differ", "span name");
  /* where a span lay in the writer's arena does not matter */
  memcpy(img, f.image, f.image_bytes);
  put_le64(img + HEADER_BYTES + 80, le64(img + HEADER_BYTES + 80) + 256);
  reseal(img, f.image_bytes);
  write_file(f.path, img, f.image_bytes);
  bp_train_state out;
  ck_assert_msg(bp_checkpoint_load(f.path, f.plan, f.arena, &out) == BP_OK, "%s",
                bp_last_error());
  free(img);
  bp_plan_destroy(ema);
  bp_plan_destroy(adamw);
  bp_plan_destroy(shape);
  bp_plan_destroy(mlp);
  fixture_free(&f);

  /* and the other way round: an mlp plan refuses the small net's file */
  fixture g;
  bp_plan *net = default_plan((bp_plan_options){0, 0, BP_OPT_SGD});
  g.plan = mlp_plan(1);
  g.arena = random_arena(g.plan, 13);
  g.arena_copy = dup_bytes(g.arena, (size_t)bp_plan_total_bytes(g.plan));
  g.image = NULL;
  in_tmp(g.path, sizeof g.path, "bad.ckpt");
  expect_other_plan_refused(&g, net, "small net into mlp");
  bp_plan_destroy(net);
  fixture_free(&g);
}
END_TEST

START_TEST(read_info_refuses_what_load_refuses) {
  fixture f;
  fixture_init(&f, (bp_plan_options){0, 0, BP_OPT_SGD});
  bp_checkpoint_info info;
  memset(&info, 0x5a, sizeof info);
  unsigned char *img = dup_bytes(f.image, f.image_bytes);
  img[f.image_bytes / 2] ^= 4;
  write_file(f.path, img, f.image_bytes);
  ck_assert_int_eq(bp_checkpoint_read_info(f.path, &info), BP_ERR_PARSE);
  ck_assert(strstr(bp_last_error(), "CRC mismatch") != NULL);
  ck_assert_int_eq(((unsigned char *)&info)[0], 0x5a);
  write_file(f.path, f.image, 100);
  ck_assert_int_eq(bp_checkpoint_read_info(f.path, &info), BP_ERR_PARSE);
  ck_assert(strstr(bp_last_error(), "is truncated (100 bytes") != NULL);
  write_file(f.path, f.image, f.image_bytes - 1);
  ck_assert_int_eq(bp_checkpoint_read_info(f.path, &info), BP_ERR_PARSE);
  ck_assert(strstr(bp_last_error(), "is truncated") != NULL);
  write_file(f.path, f.image, f.image_bytes);
  ck_assert_int_eq(bp_checkpoint_read_info(f.path, &info), BP_OK);
  ck_assert_uint_eq(info.plan_hash, bp_plan_hash(f.plan));
  free(img);
  fixture_free(&f);
}
END_TEST

START_TEST(misuse_is_refused) {
  bp_plan *p = default_plan((bp_plan_options){0, 0, BP_OPT_SGD});
  unsigned char *arena = random_arena(p, 14);
  char path[4200];
  in_tmp(path, sizeof path, "x.ckpt");
  bp_train_state s = sample_state;
  ck_assert_int_eq(bp_checkpoint_save(NULL, p, arena, &s), BP_ERR_INVALID);
  ck_assert_int_eq(bp_checkpoint_save(path, NULL, arena, &s), BP_ERR_INVALID);
  ck_assert_int_eq(bp_checkpoint_save(path, p, NULL, &s), BP_ERR_INVALID);
  ck_assert_int_eq(bp_checkpoint_save(path, p, arena, NULL), BP_ERR_INVALID);
  ck_assert_int_eq(bp_checkpoint_save("", p, arena, &s), BP_ERR_INVALID);
  ck_assert_int_eq(bp_checkpoint_load(NULL, p, arena, &s), BP_ERR_INVALID);
  ck_assert_int_eq(bp_checkpoint_load(path, NULL, arena, &s), BP_ERR_INVALID);
  ck_assert_int_eq(bp_checkpoint_load(path, p, NULL, &s), BP_ERR_INVALID);
  ck_assert_int_eq(bp_checkpoint_load(path, p, arena, NULL), BP_ERR_INVALID);
  ck_assert_int_eq(bp_checkpoint_read_info(NULL, NULL), BP_ERR_INVALID);
  bp_plan *open = NULL;
  bp_plan_options o = {0, 0, BP_OPT_SGD};
  ck_assert_int_eq(bp_plan_create(&o, &open), BP_OK);
  ck_assert_int_eq(bp_checkpoint_save(path, open, arena, &s), BP_ERR_STATE);
  ck_assert_int_eq(bp_checkpoint_load(path, open, arena, &s), BP_ERR_STATE);
  ck_assert_uint_eq(bp_checkpoint_file_bytes(open), 0);
  ck_assert_uint_eq(bp_checkpoint_file_bytes(NULL), 0);
  ck_assert_int_eq(access(path, F_OK), -1); /* nothing was written */
  bp_plan_destroy(open);
  free(arena);
  bp_plan_destroy(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("checkpoint");
  TCase *tc = tcase_create("checkpoint");
  tcase_add_checked_fixture(tc, make_tmpdir, remove_tmpdir);
  tcase_set_timeout(tc, 120); /* hundreds of loads, slow under sanitizers */
  tcase_add_test(tc, hash_is_stable_and_sensitive);
  tcase_add_test(tc, hash_of_compiled_models);
  tcase_add_test(tc, file_layout_is_as_documented);
  tcase_add_test(tc, a_long_note_is_cut_to_the_field);
  tcase_add_test(tc, round_trip_every_option_set);
  tcase_add_test(tc, round_trip_compiled_mlp);
  tcase_add_test(tc, a_plan_that_packs_features_otherwise_reads_the_checkpoint);
  tcase_add_test(tc, save_replaces_an_existing_checkpoint);
  tcase_add_test(tc, failed_saves_leave_the_old_checkpoint);
  tcase_add_test(tc, truncated_files_are_refused);
  tcase_add_test(tc, every_flipped_bit_is_refused);
  tcase_add_test(tc, not_a_checkpoint_and_future_versions);
  tcase_add_test(tc, a_header_spliced_onto_another_body_is_refused);
  tcase_add_test(tc, non_finite_state_is_refused_by_tensor_name);
  tcase_add_test(tc, counters_no_trainer_writes_and_older_versions_are_refused);
  tcase_add_test(tc, another_plan_is_refused);
  tcase_add_test(tc, read_info_refuses_what_load_refuses);
  tcase_add_test(tc, misuse_is_refused);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
