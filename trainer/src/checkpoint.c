/* Checkpoints: the file format, an atomic save and a load that validates the
 * whole file before it changes one byte of the arena.
 *
 * File format, version 3 (also docs/checkpoint-format.md). Every integer is
 * little-endian and fixed-width, whatever the host; the double is stored as
 * its IEEE-754 binary64 bits in a u64.
 *
 *   offset  bytes  field
 *        0      6  magic "BPCKPT"
 *        6      2  u16 format version (3)
 *        8      4  u32 header bytes (384)
 *       12      4  u32 section count (2)
 *       16      8  u64 plan hash (bp_plan_hash)
 *       24      8  u64 plan total bytes (bp_plan_total_bytes; for people, not checked)
 *       32      8  u64 data bytes (sum of the sections' bytes)
 *       40      8  u64 file bytes (this whole file)
 *       48      8  u64 seed            \
 *       56      8  u64 epoch            |
 *       64      8  u64 step             | bp_train_state
 *       72      8  u64 global_step      |
 *       80      8  u64 loss_scale bits  |
 *       88      8  u64 good_steps      /
 *       96    256  identification text: UTF-8, NUL-padded, at most 255 bytes
 *                  (an optional note, then a summary of the plan)
 *      352      8  u64 optimizer_steps  \ bp_train_state, AMP only (0 without):
 *      360      8  u64 skipped_steps    / bytes that were reserved (zero) before
 *      368     12  reserved, written as zero, ignored on reading
 *      380      4  u32 CRC-32 of bytes 0..379 (the header CRC)
 *      384   48*S  section table, S entries, in file order:
 *                    16  first region name, NUL-padded ("B")
 *                    16  last region name, NUL-padded ("E_CONV_DEEP")
 *                     8  u64 offset of the span in the writer's arena (for
 *                        people: a reader puts the bytes at its own plan's)
 *                     8  u64 bytes of the span (0 is allowed and listed)
 *        D      .  data: each section's bytes, in table order, as in the arena
 *        .      4  u32 CRC-32 (zlib's crc32) of every byte before it except
 *                  the header CRC (bytes 380..383)
 *        .      8  end marker "BPCKEND\n"
 *
 * The final CRC leaves the header CRC out: the CRC-32 of any message
 * followed by its own CRC is one constant, so covering it (as version 1 did)
 * let a header spliced onto another file's body pass. Leaving it out makes
 * the final CRC depend on every header field.
 *
 * Two sections (checkpoint-impl.h): B..E_CONV_DEEP (BN statistics, master
 * weights, EMA) and M_BN_BIAS..N (moments, LARS norms). A file is
 * 384 + 2*48 + data + 12 bytes.
 *
 * Versioning: bytes 0..7 (magic and version) keep their meaning in every
 * version. A reader refuses a version newer than its own, and one older
 * than it reads, with a message that says so. Version 3 changed what the
 * plan hash covers (the state spans' layout only, plan_hash.c), so a
 * version-1 or -2 file, whose hash this build no longer computes, is
 * refused. Anything after byte 7 may change with the version number.
 *
 * Validation order on load: magic -> version -> header length -> header CRC
 * -> header consistency and counters (loss scale finite and > 0, epoch and
 * steps in the trainer's ranges, no control characters in the text) -> file
 * length -> plan hash -> body CRC -> end marker -> section table -> every
 * state value finite (the staged bytes, by tensor). The header
 * CRC makes every size in the header trustworthy before it is used, so a
 * flipped bit reads as "corrupt", not as a wrong length. Nothing is
 * allocated from a size in the file: the data is staged in a buffer sized
 * from the plan and only copied into the arena once every check has passed. */
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "blueprint/checkpoint.h"
#include "blueprint/infile.h"
#include "blueprint/outfile.h"
#include "blueprint/train.h" /* BP_TRAIN_MAX_*: the counters' ranges */
#include "bp_abi_sdk.h"
#include "checkpoint-impl.h"

#define MAGIC "BPCKPT"
#define MAGIC_BYTES 6
#define VERSION_AT 6
#define PREFIX_BYTES 8 /* magic + version: the same in every format version */
#define HEADER_BYTES 384
#define TEXT_AT 96
#define HEADER_CRC_AT 380
#define SECTION_COUNT 2
#define SECTION_BYTES 48
#define REGION_NAME_BYTES 16
#define SPAN_OFFSET_AT 32 /* within a section entry: u64 arena offset of the span */
#define SPAN_BYTES_AT 40  /* u64 bytes of the span */
#define TABLE_BYTES (SECTION_COUNT * SECTION_BYTES)
#define END_MARKER "BPCKEND\n"
#define END_MARKER_BYTES 8
#define TRAILER_BYTES (4 + END_MARKER_BYTES)
#define CHUNK_BYTES ((size_t)1 << 20)

#define AMP_STEPS_AT 352 /* optimizer_steps, skipped_steps: after the text */
_Static_assert(TEXT_AT + BP_CHECKPOINT_TEXT_MAX <= AMP_STEPS_AT, "text overlaps the AMP steps");
_Static_assert(AMP_STEPS_AT + 16 <= HEADER_CRC_AT, "the AMP steps overlap the CRC");
_Static_assert(sizeof(double) == 8, "loss_scale is stored as 64 IEEE bits");

/* The state spans, in file order (checkpoint-impl.h). Each holds exactly
 * the state regions: the regions just outside them are recomputed (A, the
 * FP16 copies, follows E; R precedes M; I_A follows N). */
const bp_region bp_checkpoint_sections[BP_CHECKPOINT_SECTIONS][2] = {
    {BP_REGION_B, BP_REGION_E_CONV_DEEP},
    {BP_REGION_M_BN_BIAS, BP_REGION_N},
};
_Static_assert(SECTION_COUNT == BP_CHECKPOINT_SECTIONS, "one table of state spans");
_Static_assert(BP_REGION_B == 0, "the first state span starts the arena");
_Static_assert(BP_REGION_E_CONV_DEEP + 1 == BP_REGION_A_BN_BIAS,
               "the first state span ends where the FP16 copies begin");
_Static_assert(BP_REGION_R + 1 == BP_REGION_M_BN_BIAS,
               "the second state span begins after the results");
_Static_assert(BP_REGION_N + 1 == BP_REGION_I_A, "the second state span ends before the inputs");

/* ---- little-endian encoding ------------------------------------------- */

static void put_u16(unsigned char *p, uint16_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
}

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint16_t get_u16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t get_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static uint64_t double_bits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

static double bits_double(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

/* zlib's crc32 over any length (its length argument is 32-bit). */
static uint32_t crc_update(uint32_t crc, const void *data, uint64_t len) {
  const unsigned char *p = data;
  while (len > 0) {
    uInt n = len > (1u << 30) ? (1u << 30) : (uInt)len;
    crc = (uint32_t)crc32(crc, p, n);
    p += n;
    len -= n;
  }
  return crc;
}

static uint32_t crc_start(void) { return (uint32_t)crc32(0L, Z_NULL, 0); }

/* ---- layout of a plan's checkpoint ------------------------------------ */

typedef struct layout {
  bp_span span[SECTION_COUNT];
  uint64_t data_bytes;
  uint64_t file_bytes;
} layout;

static bp_status plan_layout(const bp_plan *plan, layout *out) {
  uint64_t data = 0;
  for (int s = 0; s < SECTION_COUNT; s++) {
    bp_status st = bp_plan_resolve(plan, bp_checkpoint_sections[s][0],
                                   bp_checkpoint_sections[s][1], &out->span[s]);
    if (st != BP_OK) return st;
    data += out->span[s].bytes; /* spans lie inside the plan: no overflow */
  }
  out->data_bytes = data;
  out->file_bytes = HEADER_BYTES + TABLE_BYTES + data + TRAILER_BYTES;
  return BP_OK;
}

uint64_t bp_checkpoint_file_bytes(const bp_plan *plan) {
  layout l;
  if (!plan || !bp_plan_is_finalized(plan) || plan_layout(plan, &l) != BP_OK) return 0;
  return l.file_bytes;
}

/* The section table this plan's checkpoint carries. */
static void encode_table(const layout *l, unsigned char out[TABLE_BYTES]) {
  memset(out, 0, TABLE_BYTES);
  for (int s = 0; s < SECTION_COUNT; s++) {
    unsigned char *e = out + s * SECTION_BYTES;
    for (int k = 0; k < 2; k++) {
      const char *name = bp_region_get(bp_checkpoint_sections[s][k])->name;
      size_t n = strlen(name);
      BP_ASSERT(n < REGION_NAME_BYTES); /* region names are short by construction */
      memcpy(e + k * REGION_NAME_BYTES, name, n);
    }
    put_u64(e + SPAN_OFFSET_AT, l->span[s].offset);
    put_u64(e + SPAN_BYTES_AT, l->span[s].bytes);
  }
}

/* Whether a file's section table names this plan's spans with their
 * sizes. The arena offsets are not compared: the bytes go to this plan's
 * spans, wherever packing put the regions before them. */
static int same_sections(const unsigned char table[TABLE_BYTES], const layout *l) {
  unsigned char ours[TABLE_BYTES];
  encode_table(l, ours);
  for (int s = 0; s < SECTION_COUNT; s++) {
    const unsigned char *a = table + s * SECTION_BYTES, *b = ours + s * SECTION_BYTES;
    if (memcmp(a, b, 2 * REGION_NAME_BYTES) != 0 ||
        memcmp(a + SPAN_BYTES_AT, b + SPAN_BYTES_AT, 8) != 0)
      return 0;
  }
  return 1;
}

/* ---- header ------------------------------------------------------------ */

typedef struct header {
  uint32_t version, header_bytes, section_count;
  uint64_t plan_hash, total_bytes, data_bytes, file_bytes;
  bp_train_state state;
  char text[BP_CHECKPOINT_TEXT_MAX];
} header;

static void encode_header(const header *h, unsigned char out[HEADER_BYTES]) {
  memset(out, 0, HEADER_BYTES);
  memcpy(out, MAGIC, MAGIC_BYTES);
  put_u16(out + VERSION_AT, (uint16_t)h->version);
  put_u32(out + 8, h->header_bytes);
  put_u32(out + 12, h->section_count);
  put_u64(out + 16, h->plan_hash);
  put_u64(out + 24, h->total_bytes);
  put_u64(out + 32, h->data_bytes);
  put_u64(out + 40, h->file_bytes);
  put_u64(out + 48, h->state.seed);
  put_u64(out + 56, h->state.epoch);
  put_u64(out + 64, h->state.step);
  put_u64(out + 72, h->state.global_step);
  put_u64(out + 80, double_bits(h->state.loss_scale));
  put_u64(out + 88, h->state.good_steps);
  put_u64(out + AMP_STEPS_AT, h->state.optimizer_steps);
  put_u64(out + AMP_STEPS_AT + 8, h->state.skipped_steps);
  size_t n = strnlen(h->text, BP_CHECKPOINT_TEXT_MAX - 1);
  memcpy(out + TEXT_AT, h->text, n);
  put_u32(out + HEADER_CRC_AT, crc_update(crc_start(), out, HEADER_CRC_AT));
}

/* Decodes bytes 8.. of a header (the caller checked the rest). */
static void decode_header(const unsigned char in[HEADER_BYTES], header *h) {
  h->version = get_u16(in + VERSION_AT);
  h->header_bytes = get_u32(in + 8);
  h->section_count = get_u32(in + 12);
  h->plan_hash = get_u64(in + 16);
  h->total_bytes = get_u64(in + 24);
  h->data_bytes = get_u64(in + 32);
  h->file_bytes = get_u64(in + 40);
  h->state.seed = get_u64(in + 48);
  h->state.epoch = get_u64(in + 56);
  h->state.step = get_u64(in + 64);
  h->state.global_step = get_u64(in + 72);
  h->state.loss_scale = bits_double(get_u64(in + 80));
  h->state.good_steps = get_u64(in + 88);
  h->state.optimizer_steps = get_u64(in + AMP_STEPS_AT);
  h->state.skipped_steps = get_u64(in + AMP_STEPS_AT + 8);
  memcpy(h->text, in + TEXT_AT, BP_CHECKPOINT_TEXT_MAX - 1);
  h->text[BP_CHECKPOINT_TEXT_MAX - 1] = '\0';
}

/* What a CRC cannot judge: values no trainer writes. A writer sanitizes
 * the text, so a control character in it means another writer. */
static bp_status check_counters(const char *path, const header *h) {
  const bp_train_state *s = &h->state;
  const char *bad = NULL;
  /* the scale lives in FP32 (S): growth stops below FP32's largest value */
  if (!(s->loss_scale > 0.0) || s->loss_scale > FLT_MAX) bad = "loss scale not a finite number > 0";
  else if (s->epoch > BP_TRAIN_MAX_EPOCHS) bad = "epoch past the trainer's range";
  else if (s->step > (uint64_t)BP_TRAIN_MAX_COUNT || s->global_step > (uint64_t)INT64_MAX)
    bad = "step counters past the trainer's range";
  else if (s->optimizer_steps > s->global_step ||
           s->skipped_steps > s->global_step - s->optimizer_steps)
    bad = "more optimizer and skipped steps than steps";
  for (const char *c = h->text; !bad && *c; c++)
    if ((unsigned char)*c < 0x20 || (unsigned char)*c == 0x7f)
      bad = "control characters in the identification text";
  if (!bad) return BP_OK;
  return bp_fail(BP_ERR_PARSE,
                 "checkpoint %s is corrupt (%s: epoch %" PRIu64 ", step %" PRIu64
                 ", loss scale %g)",
                 path, bad, s->epoch, s->step, s->loss_scale);
}

/* Control characters (and DEL) become spaces so that the text stays one line. */
static void sanitize_text(char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || (unsigned char)*s == 0x7f) *s = ' ';
}

/* Appends to a fixed buffer, cutting at its end. */
static void text_append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void text_append(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
  if (*len + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  *len = (size_t)n >= cap - *len ? cap - 1 : *len + (size_t)n;
}

/* "<note>; <summary>" or the summary alone, sanitized and cut to fit. */
static void build_text(const bp_plan *plan, const char *note, char out[BP_CHECKPOINT_TEXT_MAX]) {
  const size_t cap = BP_CHECKPOINT_TEXT_MAX;
  size_t len = 0;
  out[0] = '\0';
  if (note && note[0]) text_append(out, cap, &len, "%s; ", note);
  const bp_plan_options *o = bp_plan_get_options(plan);
  text_append(out, cap, &len, "%d tensors, %" PRIu64 " bytes, %s, amp %s, ema %s; variants",
              (int)bp_plan_tensor_count(plan), bp_plan_total_bytes(plan),
              bp_optimizer_name(o->optimizer), o->amp ? "on" : "off", o->ema ? "on" : "off");
  for (int v = 0; v < bp_plan_variant_count(plan); v++) {
    const bp_variant_info *vi = bp_plan_variant(plan, v);
    text_append(out, cap, &len, "%s %s %" PRId64 "x%" PRId64 "x%" PRId64, v ? "," : "",
                vi->name, vi->batch, vi->height, vi->width);
  }
  sanitize_text(out);
}

/* ---- save ---------------------------------------------------------------- */

/* Writes `len` bytes and folds them into *crc. */
static int write_part(FILE *f, const void *data, uint64_t len, uint32_t *crc) {
  if (len > 0 && fwrite(data, 1, (size_t)len, f) != (size_t)len) return -1;
  *crc = crc_update(*crc, data, len);
  return 0;
}

/* Makes a rename in `dir` durable. Returns 0 or an errno value. Filesystems
 * that cannot sync a directory (EINVAL) count as done. */
static int sync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = 0;
  if (fsync(fd) != 0 && errno != EINVAL) err = errno;
  close(fd);
  return err;
}

bp_status bp_checkpoint_save(const char *path, const bp_plan *plan, const void *arena,
                             const bp_train_state *state) {
  return bp_checkpoint_save_note(path, plan, arena, state, NULL);
}

/* The accessor of a host copy of an arena. */
static bp_status host_read(void *user, uint64_t offset, void *dst, uint64_t bytes) {
  memcpy(dst, (const unsigned char *)user + offset, (size_t)bytes);
  return BP_OK;
}

static bp_status host_write(void *user, uint64_t offset, const void *src, uint64_t bytes) {
  memcpy((unsigned char *)user + offset, src, (size_t)bytes);
  return BP_OK;
}

bp_status bp_checkpoint_save_note(const char *path, const bp_plan *plan, const void *arena,
                                  const bp_train_state *state, const char *note) {
  if (!arena) return bp_fail(BP_ERR_INVALID, "bp_checkpoint_save: NULL argument");
  const bp_arena_access access = {host_read, NULL, (void *)arena};
  return bp_checkpoint_save_access(path, plan, &access, state, note);
}

/* Writes `bytes` of the arena at `offset` through `a`, in chunks staged in
 * `chunk` (CHUNK_BYTES). Returns 0, 1 for a failed write (errno), or 2 for
 * a failed read (the accessor's status in *st). */
static int write_arena_part(FILE *f, const bp_arena_access *a, uint64_t offset, uint64_t bytes,
                            unsigned char *chunk, uint32_t *crc, bp_status *st) {
  for (uint64_t at = 0; at < bytes; at += CHUNK_BYTES) {
    const uint64_t n = bytes - at < CHUNK_BYTES ? bytes - at : CHUNK_BYTES;
    if ((*st = a->read(a->user, offset + at, chunk, n)) != BP_OK) return 2;
    if (write_part(f, chunk, n, crc)) return 1;
  }
  return 0;
}

/* Writes the checkpoint to `target`, the file `path` names (a symlink's
 * target: bp_output_target); messages name `path`. */
static bp_status save_to(const char *path, const char *target, const bp_plan *plan,
                         const bp_arena_access *arena, const bp_train_state *state,
                         const char *note);

bp_status bp_checkpoint_save_access(const char *path, const bp_plan *plan,
                                    const bp_arena_access *arena, const bp_train_state *state,
                                    const char *note) {
  if (!path || !plan || !arena || !arena->read || !state)
    return bp_fail(BP_ERR_INVALID, "bp_checkpoint_save: NULL argument");
  char *target = bp_output_target(path); /* a symlink's target is replaced, not the link */
  if (!target) return bp_fail(BP_ERR_NOMEM, "out of memory saving checkpoint %s", path);
  bp_status st = save_to(path, target, plan, arena, state, note);
  free(target);
  return st;
}

static bp_status save_to(const char *path, const char *target, const bp_plan *plan,
                         const bp_arena_access *arena, const bp_train_state *state,
                         const char *note) {
  if (!path[0]) return bp_fail(BP_ERR_INVALID, "bp_checkpoint_save: empty path");
  if (!bp_plan_is_finalized(plan))
    return bp_fail(BP_ERR_STATE, "cannot save checkpoint %s: the plan is not finalized", path);
  layout l;
  bp_status st = plan_layout(plan, &l);
  if (st != BP_OK) return st;

  header h;
  memset(&h, 0, sizeof h);
  h.version = BP_CHECKPOINT_FORMAT_VERSION;
  h.header_bytes = HEADER_BYTES;
  h.section_count = SECTION_COUNT;
  h.plan_hash = bp_plan_hash(plan);
  h.total_bytes = bp_plan_total_bytes(plan);
  h.data_bytes = l.data_bytes;
  h.file_bytes = l.file_bytes;
  h.state = *state;
  build_text(plan, note, h.text);
  unsigned char head[HEADER_BYTES], table[TABLE_BYTES], trailer[TRAILER_BYTES];
  encode_header(&h, head);
  encode_table(&l, table);

  if ((st = bp_output_prepare(path, "checkpoint")) != BP_OK) return st; /* outfile.h */
  if (strcmp(target, path) != 0) (void)bp_output_sweep_temps(target);
  size_t tmp_cap = strlen(target) + 32;
  char *tmp = malloc(tmp_cap);
  if (!tmp) return bp_fail(BP_ERR_NOMEM, "out of memory saving checkpoint %s", path);
  snprintf(tmp, tmp_cap, "%s.tmp.%ld", target, (long)getpid());

  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    st = bp_fail(BP_ERR_IO, "cannot write checkpoint %s: cannot create %s: %s", path, tmp,
                 strerror(err));
    free(tmp);
    return st;
  }
  FILE *f = fdopen(fd, "wb");
  if (!f) {
    int err = errno;
    close(fd);
    unlink(tmp);
    st = bp_fail(BP_ERR_IO, "cannot write checkpoint %s: %s", path, strerror(err));
    free(tmp);
    return st;
  }

  unsigned char *chunk = malloc(CHUNK_BYTES);
  uint32_t head_crc = crc_start(); /* unused: the final CRC leaves the header CRC out */
  uint32_t crc = crc_update(crc_start(), head, HEADER_CRC_AT);
  const char *stage = "writing";
  int failed = !chunk || write_part(f, head, HEADER_BYTES, &head_crc) ||
               write_part(f, table, TABLE_BYTES, &crc);
  bp_status read_st = chunk ? BP_OK : bp_fail(BP_ERR_NOMEM, "out of memory saving %s", path);
  for (int s = 0; s < SECTION_COUNT && !failed; s++)
    failed = write_arena_part(f, arena, l.span[s].offset, l.span[s].bytes, chunk, &crc, &read_st);
  free(chunk);
  if (read_st != BP_OK) { /* the arena could not be read: its message stands */
    char why[1024];
    snprintf(why, sizeof why, "%s", bp_last_error());
    fclose(f);
    unlink(tmp);
    free(tmp);
    return bp_fail(read_st, "cannot write checkpoint %s: %s", path, why);
  }
  if (!failed) {
    put_u32(trailer, crc);
    memcpy(trailer + 4, END_MARKER, END_MARKER_BYTES);
    failed = fwrite(trailer, 1, TRAILER_BYTES, f) != TRAILER_BYTES;
  }
  if (!failed && fflush(f) != 0) failed = 1;
  if (!failed && fsync(fileno(f)) != 0) {
    failed = 1;
    stage = "syncing";
  }
  int err = failed ? errno : 0;
  if (fclose(f) != 0 && !failed) {
    failed = 1;
    err = errno;
    stage = "closing";
  }
  if (failed) {
    unlink(tmp);
    st = bp_fail(BP_ERR_IO, "cannot write checkpoint %s: %s %s: %s", path, stage, tmp,
                 strerror(err));
    free(tmp);
    return st;
  }
  if (rename(tmp, target) != 0) {
    err = errno;
    unlink(tmp);
    st = bp_fail(BP_ERR_IO, "cannot write checkpoint %s: cannot rename %s over it: %s", path, tmp,
                 strerror(err));
    free(tmp);
    return st;
  }
  free(tmp);
  char *dir = bp_output_dir(target);
  if (!dir) return bp_fail(BP_ERR_NOMEM, "out of memory saving checkpoint %s", path);
  err = sync_dir(dir);
  if (err) {
    st = bp_fail(BP_ERR_IO,
                 "checkpoint %s was written, but its directory %s could not be synced: %s", path,
                 dir, strerror(err));
    free(dir);
    return st;
  }
  free(dir);
  return BP_OK;
}

/* ---- load -------------------------------------------------------------- */

/* Reads up to `len` bytes; *got says how many came before end of file.
 * Returns 0 or an errno value. */
static int read_full(int fd, void *buf, uint64_t len, uint64_t *got) {
  unsigned char *p = buf;
  uint64_t done = 0;
  while (done < len) {
    uint64_t want = len - done;
    if (want > ((uint64_t)1 << 30)) want = (uint64_t)1 << 30;
    ssize_t n = read(fd, p + done, (size_t)want);
    if (n < 0) {
      if (errno == EINTR) continue;
      *got = done;
      return errno;
    }
    if (n == 0) break;
    done += (uint64_t)n;
  }
  *got = done;
  return 0;
}

static bp_status truncated(const char *path, uint64_t have, uint64_t want) {
  if (want == 0) /* no plan to say how long it should be */
    return bp_fail(BP_ERR_PARSE,
                   "checkpoint %s is truncated (%" PRIu64 " bytes, less than its %d-byte header)",
                   path, have, HEADER_BYTES);
  return bp_fail(BP_ERR_PARSE, "checkpoint %s is truncated (%" PRIu64 " of %" PRIu64 " bytes)",
                 path, have, want);
}

static bp_status read_error(const char *path, int err) {
  return bp_fail(BP_ERR_IO, "cannot read checkpoint %s: %s", path, strerror(err));
}

/* An open checkpoint whose header has been verified. */
typedef struct opened {
  int fd;
  unsigned char raw[HEADER_BYTES];
  header h;
} opened;

/* Opens `path` and verifies everything up to and including the file length:
 * magic, version, header CRC, header consistency. `expect_bytes` (0 if
 * unknown) is the length reported for a file cut inside its header. On
 * success o->fd is open; on failure it is closed. */
static bp_status open_checked(const char *path, uint64_t expect_bytes, opened *o) {
  /* the checked open (infile.h): a FIFO is refused, not waited on */
  char why[256];
  uint64_t file_size = 0;
  o->fd = bp_input_open(path, 0, &file_size, why, sizeof why);
  if (o->fd < 0)
    return bp_fail(BP_ERR_IO, "cannot %s checkpoint %s: %s",
                   errno == EISDIR || errno == EINVAL ? "read" : "open", path, why);
  bp_status st = BP_OK;
  uint64_t got = 0;
  int err;
  if ((err = read_full(o->fd, o->raw, HEADER_BYTES, &got)) != 0) {
    st = read_error(path, err);
    goto fail;
  }
  if (memcmp(o->raw, MAGIC, got < MAGIC_BYTES ? (size_t)got : MAGIC_BYTES) != 0) {
    st = bp_fail(BP_ERR_PARSE, "checkpoint %s is not a blueprint checkpoint (wrong magic)", path);
    goto fail;
  }
  if (got < PREFIX_BYTES) {
    st = truncated(path, got, expect_bytes);
    goto fail;
  }
  uint16_t version = get_u16(o->raw + VERSION_AT);
  if (version > BP_CHECKPOINT_FORMAT_VERSION) {
    st = bp_fail(BP_ERR_UNSUPPORTED,
                 "checkpoint %s has format version %u, newer than this build reads (%d)", path,
                 (unsigned)version, BP_CHECKPOINT_FORMAT_VERSION);
    goto fail;
  }
  if (version == 0) {
    st = bp_fail(BP_ERR_PARSE, "checkpoint %s is corrupt (format version 0)", path);
    goto fail;
  }
  if (version < BP_CHECKPOINT_FORMAT_VERSION) { /* an older plan hash (see the top) */
    st = bp_fail(BP_ERR_UNSUPPORTED,
                 "checkpoint %s has format version %u, older than this build reads (%d, whose "
                 "plan hash covers the saved state only): load it with the build that wrote it",
                 path, (unsigned)version, BP_CHECKPOINT_FORMAT_VERSION);
    goto fail;
  }
  if (got < HEADER_BYTES) {
    st = truncated(path, got, expect_bytes);
    goto fail;
  }
  if (get_u32(o->raw + HEADER_CRC_AT) != crc_update(crc_start(), o->raw, HEADER_CRC_AT)) {
    st = bp_fail(BP_ERR_PARSE, "checkpoint %s is corrupt (header CRC mismatch)", path);
    goto fail;
  }
  decode_header(o->raw, &o->h);
  const header *h = &o->h;
  /* The header CRC held, so these only fail for a file of a broken writer. */
  uint64_t want = 0;
  if (h->header_bytes != HEADER_BYTES || h->section_count != SECTION_COUNT ||
      __builtin_add_overflow(h->data_bytes, HEADER_BYTES + TABLE_BYTES + TRAILER_BYTES, &want) ||
      want != h->file_bytes) {
    st = bp_fail(BP_ERR_PARSE,
                 "checkpoint %s is corrupt (inconsistent header: %u header bytes, %u sections, "
                 "%" PRIu64 " data bytes, %" PRIu64 " file bytes)",
                 path, (unsigned)h->header_bytes, (unsigned)h->section_count, h->data_bytes,
                 h->file_bytes);
    goto fail;
  }
  if ((st = check_counters(path, h)) != BP_OK) goto fail;
  uint64_t size = file_size;
  if (size < h->file_bytes) {
    st = truncated(path, size, h->file_bytes);
    goto fail;
  }
  if (size > h->file_bytes) {
    st = bp_fail(BP_ERR_PARSE,
                 "checkpoint %s is corrupt (%" PRIu64 " bytes where its header says %" PRIu64 ")",
                 path, size, h->file_bytes);
    goto fail;
  }
  return BP_OK;
fail:
  close(o->fd);
  o->fd = -1;
  return st;
}

/* Reads the section table, the data and the trailer of an opened file and
 * verifies the body CRC and the end marker. The data goes to `data` (sized
 * h.data_bytes by the caller) or, when `data` is NULL, through a bounded
 * buffer that only feeds the CRC. */
static bp_status read_body(const char *path, const opened *o, unsigned char table[TABLE_BYTES],
                           unsigned char *data) {
  const header *h = &o->h;
  uint32_t crc = crc_update(crc_start(), o->raw, HEADER_CRC_AT); /* not the header CRC */
  uint64_t pos = HEADER_BYTES, got = 0;
  int err;
  if ((err = read_full(o->fd, table, TABLE_BYTES, &got)) != 0) return read_error(path, err);
  if (got < TABLE_BYTES) return truncated(path, pos + got, h->file_bytes);
  crc = crc_update(crc, table, TABLE_BYTES);
  pos += TABLE_BYTES;
  if (data) {
    if ((err = read_full(o->fd, data, h->data_bytes, &got)) != 0) return read_error(path, err);
    if (got < h->data_bytes) return truncated(path, pos + got, h->file_bytes);
    crc = crc_update(crc, data, h->data_bytes);
    pos += h->data_bytes;
  } else {
    uint64_t left = h->data_bytes;
    size_t cap = left < CHUNK_BYTES ? (size_t)left : CHUNK_BYTES;
    unsigned char *chunk = malloc(cap ? cap : 1);
    if (!chunk) return bp_fail(BP_ERR_NOMEM, "out of memory reading checkpoint %s", path);
    while (left > 0) {
      uint64_t want = left < cap ? left : cap;
      if ((err = read_full(o->fd, chunk, want, &got)) != 0) {
        free(chunk);
        return read_error(path, err);
      }
      crc = crc_update(crc, chunk, got);
      pos += got;
      left -= got;
      if (got < want) {
        free(chunk);
        return truncated(path, pos, h->file_bytes);
      }
    }
    free(chunk);
  }
  unsigned char trailer[TRAILER_BYTES];
  if ((err = read_full(o->fd, trailer, TRAILER_BYTES, &got)) != 0) return read_error(path, err);
  if (got < TRAILER_BYTES) return truncated(path, pos + got, h->file_bytes);
  if (get_u32(trailer) != crc)
    return bp_fail(BP_ERR_PARSE, "checkpoint %s is corrupt (CRC mismatch)", path);
  if (memcmp(trailer + 4, END_MARKER, END_MARKER_BYTES) != 0)
    return bp_fail(BP_ERR_PARSE, "checkpoint %s is corrupt (no end marker)", path);
  return BP_OK;
}

bp_status bp_checkpoint_read_info(const char *path, bp_checkpoint_info *info_out) {
  if (!path || !info_out) return bp_fail(BP_ERR_INVALID, "bp_checkpoint_read_info: NULL argument");
  opened o;
  bp_status st = open_checked(path, 0, &o);
  if (st != BP_OK) return st;
  unsigned char table[TABLE_BYTES];
  st = read_body(path, &o, table, NULL);
  close(o.fd);
  if (st != BP_OK) return st;
  uint64_t sum = 0;
  for (int s = 0; s < SECTION_COUNT; s++) {
    const unsigned char *e = table + s * SECTION_BYTES;
    if (e[REGION_NAME_BYTES - 1] != 0 || e[2 * REGION_NAME_BYTES - 1] != 0 ||
        __builtin_add_overflow(sum, get_u64(e + SPAN_BYTES_AT), &sum))
      return bp_fail(BP_ERR_PARSE, "checkpoint %s is corrupt (section table)", path);
  }
  if (sum != o.h.data_bytes)
    return bp_fail(BP_ERR_PARSE, "checkpoint %s is corrupt (section table)", path);
  bp_checkpoint_info info;
  memset(&info, 0, sizeof info);
  info.format_version = o.h.version;
  info.plan_hash = o.h.plan_hash;
  info.plan_total_bytes = o.h.total_bytes;
  info.data_bytes = o.h.data_bytes;
  info.file_bytes = o.h.file_bytes;
  info.state = o.h.state;
  memcpy(info.text, o.h.text, sizeof info.text);
  sanitize_text(info.text);
  *info_out = info;
  return BP_OK;
}

/* Refuses state that holds a NaN or an infinity: the weights, EMA copies, BN
 * statistics and optimizer state of a diverged run, which no CRC objects to
 * and which would only spread through every later step. Reads the staged
 * (host) bytes, before anything reaches an arena; every state region is FP32
 * (region.h), and only a tensor's elements are read, never its padding.
 * Names the first such tensor in arena order. */
/* The first FP32 tensor of section `s` holding a NaN or an infinity among
 * its elements (never its padding), or NULL; `bytes` holds the section's
 * span as staged on the host. */
static const bp_dtensor *first_non_finite(const bp_plan *plan, const layout *l, int s,
                                          const unsigned char *bytes) {
  const int32_t count = bp_plan_tensor_count(plan);
  const int first = (int)bp_checkpoint_sections[s][0], last = (int)bp_checkpoint_sections[s][1];
  for (int r = first; r <= last; r++) {
    for (int32_t id = 0; id < count; id++) {
      const bp_dtensor *t = bp_plan_tensor(plan, 0, id);
      if (!t || (int)t->region != r || t->dtype != BP_DTYPE_FP32) continue;
      const unsigned char *p = bytes + (t->offset - l->span[s].offset);
      const bp_shape sh = t->shape;
      for (int64_t n = 0; n < sh.n; n++)
        for (int64_t h = 0; h < sh.h; h++)
          for (int64_t w = 0; w < sh.w; w++) {
            const int64_t at = n * t->dev_stride[0] + h * t->dev_stride[1] + w * t->dev_stride[2];
            for (int64_t c = 0; c < sh.c; c++) {
              float v;
              memcpy(&v, p + 4 * (at + c * t->dev_stride[3]), sizeof v); /* any alignment */
              if (!isfinite(v)) return t;
            }
          }
    }
  }
  return NULL;
}

static bp_status check_finite(const char *path, const bp_plan *plan, const layout *l,
                              const unsigned char *staging) {
  uint64_t base = 0; /* the span's first byte in staging */
  for (int s = 0; s < SECTION_COUNT; s++) {
    const bp_dtensor *t = first_non_finite(plan, l, s, staging + base);
    if (t)
      return bp_fail(BP_ERR_PARSE,
                     "checkpoint %s holds non-finite values in '%s' (a diverged run?)", path,
                     t->name);
    base += l->span[s].bytes;
  }
  return BP_OK;
}

bp_status bp_checkpoint_state_finite(const bp_plan *plan, const bp_arena_access *arena,
                                     const char **tensor_out) {
  *tensor_out = NULL;
  layout l;
  bp_status st = plan_layout(plan, &l);
  if (st != BP_OK) return st;
  uint64_t most = 0;
  for (int s = 0; s < SECTION_COUNT; s++)
    if (l.span[s].bytes > most) most = l.span[s].bytes;
  if (most == 0) return BP_OK;
  unsigned char *staging = malloc((size_t)most);
  if (!staging)
    return bp_fail(BP_ERR_NOMEM, "out of memory checking %" PRIu64 " bytes of state", most);
  for (int s = 0; s < SECTION_COUNT && st == BP_OK && !*tensor_out; s++) {
    if (!l.span[s].bytes) continue;
    st = arena->read(arena->user, l.span[s].offset, staging, l.span[s].bytes);
    if (st == BP_OK) {
      const bp_dtensor *t = first_non_finite(plan, &l, s, staging);
      if (t) *tensor_out = t->name;
    }
  }
  free(staging);
  return st;
}

bp_status bp_checkpoint_load(const char *path, const bp_plan *plan, void *arena,
                             bp_train_state *state_out) {
  if (!arena) return bp_fail(BP_ERR_INVALID, "bp_checkpoint_load: NULL argument");
  const bp_arena_access access = {NULL, host_write, arena};
  return bp_checkpoint_load_access(path, plan, &access, state_out);
}

bp_status bp_checkpoint_load_access(const char *path, const bp_plan *plan,
                                    const bp_arena_access *arena, bp_train_state *state_out) {
  if (!path || !plan || !arena || !arena->write || !state_out)
    return bp_fail(BP_ERR_INVALID, "bp_checkpoint_load: NULL argument");
  if (!bp_plan_is_finalized(plan))
    return bp_fail(BP_ERR_STATE, "cannot load checkpoint %s: the plan is not finalized", path);
  layout l;
  bp_status st = plan_layout(plan, &l);
  if (st != BP_OK) return st;
  uint64_t hash = bp_plan_hash(plan);

  opened o;
  if ((st = open_checked(path, l.file_bytes, &o)) != BP_OK) return st;
  /* the plan's total size is not compared: feature packing (fusion,
   * liveness reuse) may differ, the state spans' layout may not */
  if (o.h.plan_hash != hash || o.h.data_bytes != l.data_bytes) {
    close(o.fd);
    char theirs[BP_CHECKPOINT_TEXT_MAX], ours[BP_CHECKPOINT_TEXT_MAX];
    memcpy(theirs, o.h.text, sizeof theirs);
    sanitize_text(theirs);
    build_text(plan, NULL, ours);
    return bp_fail(BP_ERR_SHAPE,
                   "checkpoint %s was written for another plan (hash %016" PRIx64
                   ", this plan %016" PRIx64 "); it holds: %s; this plan: %s",
                   path, o.h.plan_hash, hash, theirs, ours);
  }
  /* Sized from the plan, never from the file (whose data_bytes equals it). */
  unsigned char *staging = malloc(l.data_bytes ? (size_t)l.data_bytes : 1);
  if (!staging) {
    close(o.fd);
    return bp_fail(BP_ERR_NOMEM, "out of memory staging %" PRIu64 " bytes of checkpoint %s",
                   l.data_bytes, path);
  }
  unsigned char table[TABLE_BYTES];
  st = read_body(path, &o, table, staging);
  close(o.fd);
  if (st == BP_OK && !same_sections(table, &l))
    st = bp_fail(BP_ERR_SHAPE,
                 "checkpoint %s was written for another plan (its state sections differ from "
                 "this plan's)",
                 path);
  if (st == BP_OK) st = check_finite(path, plan, &l, staging);
  if (st != BP_OK) {
    free(staging);
    return st;
  }
  /* Every check passed: now, and only now, the arena and the counters. */
  uint64_t at = 0;
  for (int s = 0; s < SECTION_COUNT && st == BP_OK; s++) {
    if (l.span[s].bytes)
      st = arena->write(arena->user, l.span[s].offset, staging + at, l.span[s].bytes);
    at += l.span[s].bytes;
  }
  free(staging);
  if (st != BP_OK) return st; /* the device failed: the arena may be partly written */
  *state_out = o.h.state;
  return BP_OK;
}
