/* Datasets in memory and the IDX reader (MNIST and Fashion-MNIST files,
 * gzip'd or plain, told apart by the gzip magic 1f 8b). One rule for both:
 * bytes after the data the header promises are refused, and so is a .gz
 * whose last gzip member is followed by anything but another member
 * (zlib's gzread would skip such junk silently, so members are inflated
 * here).
 *
 * IDX layout: a big-endian magic 0x0000TTNN (TT = 0x08: unsigned bytes,
 * NN = number of dimensions), NN big-endian uint32 extents, then the
 * product of the extents in bytes. The reader never trusts the header for
 * an allocation: it grows its buffer as bytes actually arrive, so a header
 * that promises a terabyte costs nothing when the file is short. */
#include "data-impl.h"
#include "blueprint/infile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

enum {
  IDX_MAGIC_LABELS = 0x00000801, /* count */
  IDX_MAGIC_IMAGES = 0x00000803, /* count, rows, cols */
  IDX_MAGIC_IMAGES4 = 0x00000804,/* count, rows, cols, channels */
};

#define IDX_PATH_MAX 4096
#define IDX_FIRST_CHUNK (64u << 20) /* first buffer size for the data */
#define IDX_READ_CHUNK (1u << 30)   /* inflate's avail_out is an unsigned int */
#define IDX_IN_BYTES (1u << 17)     /* the compressed input buffer */

/* ---- datasets ----------------------------------------------------------- */

/* H*W*C and count*H*W*C, checked; false on overflow. */
static bool dataset_bytes(const bp_dataset_info *info, uint64_t *image_bytes, uint64_t *total) {
  uint64_t per = 0, all = 0;
  if (__builtin_mul_overflow((uint64_t)info->height, (uint64_t)info->width, &per) ||
      __builtin_mul_overflow(per, (uint64_t)info->channels, &per) ||
      __builtin_mul_overflow(per, (uint64_t)info->count, &all) || all > SIZE_MAX)
    return false;
  *image_bytes = per;
  *total = all;
  return true;
}

bp_status bp_dataset_alloc_(const bp_dataset_info *info, bp_dataset **dataset_out) {
  if (info->count < 1 || info->height < 1 || info->width < 1 || info->channels < 1)
    return bp_fail(BP_ERR_INVALID,
                   "dataset of %lld images of %lldx%lldx%lld: every extent must be >= 1",
                   (long long)info->count, (long long)info->height, (long long)info->width,
                   (long long)info->channels);
  if (info->channels > BP_DATA_MAX_CHANNELS)
    return bp_fail(BP_ERR_UNSUPPORTED,
                   "dataset images have %lld channels, at most %d are supported",
                   (long long)info->channels, BP_DATA_MAX_CHANNELS);
  if (info->classes < 1 || info->classes > 256)
    return bp_fail(BP_ERR_INVALID, "dataset classes %d is outside [1, 256] (labels are bytes)",
                   info->classes);
  uint64_t per = 0, total = 0;
  if (!dataset_bytes(info, &per, &total))
    return bp_fail(BP_ERR_OVERFLOW, "dataset of %lld images of %lldx%lldx%lld overflows memory",
                   (long long)info->count, (long long)info->height, (long long)info->width,
                   (long long)info->channels);
  bp_dataset *d = calloc(1, sizeof *d);
  if (!d) return bp_fail(BP_ERR_NOMEM, "out of memory creating a dataset");
  d->info = *info;
  d->images = malloc((size_t)total);
  d->labels = malloc((size_t)info->count);
  if (!d->images || !d->labels) {
    bp_dataset_destroy(d);
    return bp_fail(BP_ERR_NOMEM, "out of memory for a dataset of %llu image bytes",
                   (unsigned long long)total);
  }
  *dataset_out = d;
  return BP_OK;
}

void bp_dataset_destroy(bp_dataset *dataset) {
  if (!dataset) return;
  free(dataset->images);
  free(dataset->labels);
  free(dataset);
}

const bp_dataset_info *bp_dataset_get_info(const bp_dataset *dataset) {
  return dataset ? &dataset->info : NULL;
}
const uint8_t *bp_dataset_images(const bp_dataset *dataset) {
  return dataset ? dataset->images : NULL;
}
const uint8_t *bp_dataset_labels(const bp_dataset *dataset) {
  return dataset ? dataset->labels : NULL;
}

bp_status bp_dataset_create(const bp_dataset_info *info, const uint8_t *images,
                            const uint8_t *labels, bp_dataset **dataset_out) {
  if (!info || !images || !labels || !dataset_out)
    return bp_fail(BP_ERR_INVALID, "bp_dataset_create: NULL argument");
  bp_dataset *d = NULL;
  bp_status st = bp_dataset_alloc_(info, &d);
  if (st != BP_OK) return st;
  for (int64_t i = 0; i < info->count; i++) {
    if (labels[i] >= info->classes) {
      bp_dataset_destroy(d);
      return bp_fail(BP_ERR_INVALID, "label %u of sample %lld is out of range [0, %d)",
                     (unsigned)labels[i], (long long)i, info->classes);
    }
  }
  uint64_t per = 0, total = 0;
  dataset_bytes(info, &per, &total);
  memcpy(d->images, images, (size_t)total);
  memcpy(d->labels, labels, (size_t)info->count);
  *dataset_out = d;
  return BP_OK;
}

bp_status bp_dataset_subset(const bp_dataset *dataset, int64_t first, int64_t count,
                            bp_dataset **dataset_out) {
  if (!dataset || !dataset_out) return bp_fail(BP_ERR_INVALID, "bp_dataset_subset: NULL argument");
  if (first < 0 || count < 1 || first > dataset->info.count - count)
    return bp_fail(BP_ERR_INVALID, "subset [%lld, %lld + %lld) is outside the %lld samples",
                   (long long)first, (long long)first, (long long)count,
                   (long long)dataset->info.count);
  bp_dataset_info info = dataset->info;
  info.count = count;
  bp_dataset *d = NULL;
  if (dataset->synthetic) { /* the same streams, from `first` on */
    bp_status st = bp_dataset_synthetic(&info, (bp_data_split)dataset->split, &d);
    if (st != BP_OK) return st;
    d->first = dataset->first + first;
    *dataset_out = d;
    return BP_OK;
  }
  bp_status st = bp_dataset_alloc_(&info, &d);
  if (st != BP_OK) return st;
  uint64_t per = 0, total = 0;
  dataset_bytes(&info, &per, &total);
  memcpy(d->images, dataset->images + (size_t)first * per, (size_t)total);
  memcpy(d->labels, dataset->labels + first, (size_t)count);
  *dataset_out = d;
  return BP_OK;
}

/* ---- IDX files ---------------------------------------------------------- */

typedef struct idx_file {
  const char *path;   /* borrowed */
  int fd;             /* -1 when closed */
  int gzip;           /* 1: gzip members, inflated through zs */
  int zs_live;        /* zs initialized */
  int member_done;    /* the current gzip member ended */
  int in_eof;         /* the file has no more bytes */
  int cut;            /* a gzip member ends early */
  z_stream zs;
  uint8_t *in;        /* IDX_IN_BYTES of file bytes; zs.next_in/avail_in the unread part */
  uint32_t magic;
  int ndims;
  uint32_t dims[4];
  uint64_t data_bytes; /* product of dims */
  uint64_t got;        /* bytes read so far, header included */
} idx_file;

/* Moves the unread input to the front and reads more; 0 or an errno. */
static int idx_fill(idx_file *f) {
  if (f->zs.avail_in && f->zs.next_in != f->in) memmove(f->in, f->zs.next_in, f->zs.avail_in);
  f->zs.next_in = f->in;
  while (!f->in_eof && f->zs.avail_in < IDX_IN_BYTES) {
    ssize_t r = read(f->fd, f->in + f->zs.avail_in, IDX_IN_BYTES - f->zs.avail_in);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno;
    if (r == 0) f->in_eof = 1;
    f->zs.avail_in += (uInt)r;
    if (r > 0) break;
  }
  return 0;
}

static bp_status idx_open(idx_file *f, const char *path) {
  memset(f, 0, sizeof *f);
  f->path = path;
  f->fd = -1;
  /* the checked open (infile.h): a FIFO is refused instead of waited on */
  char why[256];
  int fd = bp_input_open(path, 0, NULL, why, sizeof why);
  if (fd < 0)
    return bp_fail(BP_ERR_IO, "cannot %s %s: %s",
                   errno == EISDIR || errno == EINVAL ? "read" : "open", path, why);
  f->fd = fd;
  f->in = malloc(IDX_IN_BYTES);
  if (!f->in) return bp_fail(BP_ERR_NOMEM, "out of memory reading %s", path);
  f->zs.next_in = f->in;
  int err = idx_fill(f);
  if (err == 0 && f->zs.avail_in < 2 && !f->in_eof) err = idx_fill(f);
  if (err) return bp_fail(BP_ERR_IO, "cannot read %s: %s", path, strerror(err));
  f->gzip = f->zs.avail_in >= 2 && f->in[0] == 0x1f && f->in[1] == 0x8b;
  if (f->gzip) {
    if (inflateInit2(&f->zs, 16 + MAX_WBITS) != Z_OK)
      return bp_fail(BP_ERR_NOMEM, "out of memory reading %s", path);
    f->zs_live = 1;
  }
  return BP_OK;
}

static void idx_close(idx_file *f) {
  if (f->zs_live) inflateEnd(&f->zs);
  f->zs_live = 0;
  if (f->fd >= 0) close(f->fd);
  f->fd = -1;
  free(f->in);
  f->in = NULL;
}

/* Plain: bytes from the buffer, then from the file. */
static bp_status idx_read_plain(idx_file *f, uint8_t *buf, uint64_t len, uint64_t *n_out) {
  uint64_t n = 0;
  while (n < len) {
    if (f->zs.avail_in) {
      uint64_t k = f->zs.avail_in < len - n ? f->zs.avail_in : len - n;
      memcpy(buf + n, f->zs.next_in, (size_t)k);
      f->zs.next_in += k;
      f->zs.avail_in -= (uInt)k;
      n += k;
      continue;
    }
    if (f->in_eof) break;
    uint64_t want = len - n < IDX_READ_CHUNK ? len - n : IDX_READ_CHUNK;
    ssize_t r = read(f->fd, buf + n, (size_t)want);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return bp_fail(BP_ERR_IO, "cannot read %s: %s", f->path, strerror(errno));
    if (r == 0) f->in_eof = 1;
    n += (uint64_t)r;
  }
  *n_out = n;
  return BP_OK;
}

/* Gzip: members one after another; anything else after a member is junk. */
static bp_status idx_read_gzip(idx_file *f, uint8_t *buf, uint64_t len, uint64_t *n_out) {
  uint64_t n = 0;
  while (n < len) {
    if (f->zs.avail_in < 2 && !f->in_eof) {
      int err = idx_fill(f);
      if (err) return bp_fail(BP_ERR_IO, "cannot read %s: %s", f->path, strerror(err));
    }
    if (f->member_done) {
      if (f->zs.avail_in == 0 && f->in_eof) break; /* the end of the last member */
      if (f->zs.avail_in < 2 || f->zs.next_in[0] != 0x1f || f->zs.next_in[1] != 0x8b)
        return bp_fail(BP_ERR_PARSE,
                       "%s: trailing bytes after its gzip data (not another gzip member); "
                       "like a plain IDX file with bytes past its data, it is refused",
                       f->path);
      inflateReset(&f->zs);
      f->member_done = 0;
    }
    uint64_t want = len - n < IDX_READ_CHUNK ? len - n : IDX_READ_CHUNK;
    f->zs.next_out = buf + n;
    f->zs.avail_out = (uInt)want;
    int rc = inflate(&f->zs, Z_NO_FLUSH);
    uint64_t made = want - f->zs.avail_out;
    n += made;
    if (rc == Z_STREAM_END) {
      f->member_done = 1;
    } else if (rc == Z_MEM_ERROR) {
      return bp_fail(BP_ERR_NOMEM, "out of memory reading %s", f->path);
    } else if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT || rc == Z_STREAM_ERROR) {
      return bp_fail(BP_ERR_PARSE, "%s: corrupt gzip data (%s)", f->path,
                     f->zs.msg ? f->zs.msg : "invalid stream");
    } else if (made == 0 && f->zs.avail_in == 0 && f->in_eof) {
      f->cut = 1; /* the member ends early */
      break;
    }
  }
  *n_out = n;
  return BP_OK;
}

/* Reads up to `len` bytes into buf; *n_out < len only at the end of data. */
static bp_status idx_read(idx_file *f, uint8_t *buf, uint64_t len, uint64_t *n_out) {
  bp_status st = f->gzip ? idx_read_gzip(f, buf, len, n_out) : idx_read_plain(f, buf, len, n_out);
  if (st == BP_OK) f->got += *n_out;
  return st;
}

/* " (the gzip stream ends early)" when a gzip member was cut off. */
static const char *idx_cut_note(idx_file *f) {
  return f->cut ? " (the gzip stream ends early)" : "";
}

static uint32_t be32(const uint8_t *b) {
  return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

/* What a file of this magic holds, for messages. */
static const char *idx_kind(uint32_t magic) {
  return magic == IDX_MAGIC_LABELS ? "an IDX1 label file" : "an IDX3 image file";
}

/* Reads and checks the magic and the extents. */
static bp_status idx_read_header(idx_file *f, uint32_t want, uint32_t also) {
  uint8_t b[16];
  uint64_t n = 0;
  bp_status st = idx_read(f, b, 4, &n);
  if (st != BP_OK) return st;
  if (n < 4)
    return bp_fail(BP_ERR_PARSE, "%s is truncated: %llu bytes, fewer than the 4-byte IDX magic%s",
                   f->path, (unsigned long long)n, idx_cut_note(f));
  f->magic = be32(b);
  if (f->magic != want && (also == 0 || f->magic != also))
    return bp_fail(BP_ERR_PARSE, "%s: wrong magic 0x%08x, expected 0x%08x (%s)", f->path,
                   (unsigned)f->magic, (unsigned)want, idx_kind(want));
  f->ndims = (int)(f->magic & 0xff);
  st = idx_read(f, b, 4u * (unsigned)f->ndims, &n);
  if (st != BP_OK) return st;
  if (n < 4u * (unsigned)f->ndims)
    return bp_fail(BP_ERR_PARSE,
                   "%s is truncated: its header of %d dimensions needs %d bytes, the file ends "
                   "after %llu%s",
                   f->path, f->ndims, 4 + 4 * f->ndims, (unsigned long long)f->got,
                   idx_cut_note(f));
  uint64_t bytes = 1;
  bool overflow = false;
  for (int i = 0; i < f->ndims; i++) {
    f->dims[i] = be32(b + 4 * i);
    if (f->dims[i] == 0)
      return bp_fail(BP_ERR_PARSE, "%s: dimension %d of its header is 0 (an empty IDX file)",
                     f->path, i);
    overflow = overflow || __builtin_mul_overflow(bytes, (uint64_t)f->dims[i], &bytes);
  }
  if (overflow || bytes > BP_IDX_MAX_BYTES) {
    char dims[64];
    int len = 0;
    for (int i = 0; i < f->ndims; i++)
      len += snprintf(dims + len, sizeof dims - (size_t)len, "%s%u", i ? "x" : "",
                      (unsigned)f->dims[i]);
    return bp_fail(BP_ERR_OVERFLOW, "%s: absurd dimensions %s (more than %llu data bytes)",
                   f->path, dims, (unsigned long long)BP_IDX_MAX_BYTES);
  }
  f->data_bytes = bytes;
  return BP_OK;
}

/* Reads the data the header promises, exactly: fewer bytes is a truncated
 * file, more is trailing garbage. *data_out is malloc'd. */
/* Reads the data the header promises (all of it: `first` 0; else only its
 * first `first` bytes, the rest left unread and unchecked). */
static bp_status idx_read_data_first(idx_file *f, const char *what, uint64_t first,
                                     uint8_t **data_out);

static bp_status idx_read_data(idx_file *f, const char *what, uint8_t **data_out) {
  return idx_read_data_first(f, what, 0, data_out);
}

static bp_status idx_read_data_first(idx_file *f, const char *what, uint64_t first,
                                     uint8_t **data_out) {
  const uint64_t want = first && first < f->data_bytes ? first : f->data_bytes;
  const int whole = want == f->data_bytes;
  const uint64_t header = f->got;
  if (want > SIZE_MAX)
    return bp_fail(BP_ERR_OVERFLOW, "%s: %s do not fit in memory", f->path, what);
  uint64_t cap = want < IDX_FIRST_CHUNK ? want : IDX_FIRST_CHUNK;
  uint8_t *buf = malloc((size_t)cap);
  if (!buf) return bp_fail(BP_ERR_NOMEM, "out of memory reading %s", f->path);
  uint64_t got = 0;
  bp_status st = BP_OK;
  for (;;) {
    uint64_t n = 0;
    st = idx_read(f, buf + got, cap - got, &n);
    if (st != BP_OK) goto fail;
    got += n;
    if (got < cap || got == want) break; /* end of data, or all of it */
    uint64_t grown = cap > want / 2 ? want : 2 * cap;
    uint8_t *bigger = realloc(buf, (size_t)grown);
    if (!bigger) {
      st = bp_fail(BP_ERR_NOMEM, "out of memory reading %s", f->path);
      goto fail;
    }
    buf = bigger;
    cap = grown;
  }
  if (got < want) {
    st = bp_fail(BP_ERR_PARSE,
                 "%s is truncated: its header promises %llu data bytes (%s), the file holds "
                 "%llu%s",
                 f->path, (unsigned long long)want, what, (unsigned long long)got,
                 idx_cut_note(f));
    goto fail;
  }
  if (!whole) { /* the first images only: the rest stays unread */
    *data_out = buf;
    return BP_OK;
  }
  uint8_t extra[64];
  uint64_t n = 0;
  st = idx_read(f, extra, sizeof extra, &n);
  if (st != BP_OK) goto fail;
  if (n > 0) {
    st = bp_fail(BP_ERR_PARSE,
                 "%s: trailing bytes after the %llu data bytes its header promises (%s); the "
                 "file holds more than %llu bytes",
                 f->path, (unsigned long long)want, what,
                 (unsigned long long)(header + want));
    goto fail;
  }
  *data_out = buf;
  return BP_OK;
fail:
  free(buf);
  return st;
}

/* The images of an IDX file whose header fi has read: their extents as a
 * dataset (`classes` as given), checked for a channel count the batches
 * can hold, and the pixels (the caller frees *pixels_out). */
static bp_status idx_read_images_first(idx_file *fi, const char *path, int classes,
                                       int64_t limit, bp_dataset_info *info_out,
                                       uint8_t **pixels_out);

static bp_status idx_read_images(idx_file *fi, const char *path, int classes,
                                 bp_dataset_info *info_out, uint8_t **pixels_out) {
  return idx_read_images_first(fi, path, classes, 0, info_out, pixels_out);
}

static bp_status idx_read_images_first(idx_file *fi, const char *path, int classes,
                                       int64_t limit, bp_dataset_info *info_out,
                                       uint8_t **pixels_out) {
  bp_dataset_info info = {.count = fi->dims[0],
                          .height = fi->dims[1],
                          .width = fi->dims[2],
                          .channels = fi->ndims == 4 ? fi->dims[3] : 1,
                          .classes = classes};
  if (info.channels > BP_DATA_MAX_CHANNELS)
    return bp_fail(BP_ERR_UNSUPPORTED, "%s: images of %lld channels, at most %d are supported",
                   path, (long long)info.channels, BP_DATA_MAX_CHANNELS);
  char what[96];
  snprintf(what, sizeof what, "%lld images of %lldx%lldx%lld", (long long)info.count,
           (long long)info.height, (long long)info.width, (long long)info.channels);
  uint64_t first = 0;
  if (limit > 0 && limit < info.count) {
    first = (uint64_t)limit * (fi->data_bytes / (uint64_t)info.count); /* whole images */
    info.count = limit;
  }
  *info_out = info;
  return idx_read_data_first(fi, what, first, pixels_out);
}

bp_status bp_dataset_load_idx(const char *images_path, const char *labels_path, int classes,
                              bp_dataset **dataset_out) {
  if (!images_path || !labels_path || !dataset_out)
    return bp_fail(BP_ERR_INVALID, "bp_dataset_load_idx: NULL argument");
  if (classes < 0 || classes > 256)
    return bp_fail(BP_ERR_INVALID, "classes %d is outside [0, 256]", classes);
  idx_file fi, fl;
  memset(&fl, 0, sizeof fl);
  fl.fd = -1; /* not opened yet: idx_close leaves it */
  uint8_t *pixels = NULL, *labels = NULL;
  bp_dataset *d = NULL;
  bp_status st = idx_open(&fi, images_path);
  if (st != BP_OK) goto done;
  st = idx_read_header(&fi, IDX_MAGIC_IMAGES, IDX_MAGIC_IMAGES4);
  if (st != BP_OK) goto done;
  st = idx_open(&fl, labels_path);
  if (st != BP_OK) goto done;
  st = idx_read_header(&fl, IDX_MAGIC_LABELS, 0);
  if (st != BP_OK) goto done;
  if (fi.dims[0] != fl.dims[0]) {
    st = bp_fail(BP_ERR_SHAPE, "mislabeled count: %s holds %u images but %s holds %u labels",
                 images_path, (unsigned)fi.dims[0], labels_path, (unsigned)fl.dims[0]);
    goto done;
  }
  bp_dataset_info info;
  st = idx_read_images(&fi, images_path, 256, &info, &pixels);
  if (st != BP_OK) goto done;
  char what[96];
  snprintf(what, sizeof what, "%lld labels", (long long)info.count);
  st = idx_read_data(&fl, what, &labels);
  if (st != BP_OK) goto done;
  int max_label = 0;
  for (int64_t i = 0; i < info.count; i++) {
    if (classes > 0 && labels[i] >= classes) {
      st = bp_fail(BP_ERR_PARSE, "%s: label %u of sample %lld is out of range [0, %d)",
                   labels_path, (unsigned)labels[i], (long long)i, classes);
      goto done;
    }
    if (labels[i] > max_label) max_label = labels[i];
  }
  info.classes = classes > 0 ? classes : max_label + 1;
  d = calloc(1, sizeof *d);
  if (!d) {
    st = bp_fail(BP_ERR_NOMEM, "out of memory creating a dataset");
    goto done;
  }
  d->info = info;
  d->images = pixels; /* handed over */
  d->labels = labels;
  pixels = labels = NULL;
  *dataset_out = d;
done:
  free(pixels);
  free(labels);
  idx_close(&fi);
  idx_close(&fl);
  return st;
}

/* dir/name.gz when it exists, else dir/name when it exists. */
/* 1 when the gzip file `gz` inflates to exactly the bytes of `plain`, 0
 * when they differ (or either cannot be read: no judgment, so no pick). */
static int same_inflated(const char *gz, const char *plain) {
  int zfd = bp_input_open(gz, 0, NULL, NULL, 0), pfd = bp_input_open(plain, 0, NULL, NULL, 0);
  gzFile z = zfd >= 0 ? gzdopen(zfd, "rb") : NULL;
  if (!z && zfd >= 0) close(zfd);
  unsigned char *a = malloc(1 << 16), *b = malloc(1 << 16);
  int same = z && pfd >= 0 && a && b;
  while (same) {
    const int n = gzread(z, a, 1 << 16);
    if (n < 0) {
      same = 0;
      break;
    }
    size_t got = 0; /* as many plain bytes as inflated ones */
    while (got < (size_t)n) {
      const ssize_t r = read(pfd, b + got, (size_t)n - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      got += (size_t)r;
    }
    if (got != (size_t)n || memcmp(a, b, (size_t)n) != 0) same = 0;
    if (n == 0) { /* the end of both? */
      same = same && read(pfd, b, 1) == 0;
      break;
    }
  }
  free(a);
  free(b);
  if (z) gzclose(z);
  if (pfd >= 0) close(pfd);
  return same;
}

static bp_status pick_file(const char *dir, const char *name, int is_default, char *out,
                           size_t cap) {
  struct stat sb;
  int len = snprintf(out, cap, "%s/%s.gz", dir, name);
  if (len < 0 || (size_t)len >= cap)
    return bp_fail(BP_ERR_INVALID, "data directory path is too long: %s", dir);
  if (stat(out, &sb) == 0) {
    /* NAME beside NAME.gz: used when it holds the same data, else refused
     * (a stale copy of either would silently win) */
    char plain[IDX_PATH_MAX];
    snprintf(plain, sizeof plain, "%s/%s", dir, name);
    if (stat(plain, &sb) == 0 && !same_inflated(out, plain))
      return bp_fail(BP_ERR_INVALID,
                     "%s and %s both exist and hold different data (a stale copy?); remove "
                     "the one that is not meant",
                     out, plain);
    return BP_OK;
  }
  if (errno != ENOENT) /* e.g. a symlink loop: the .gz is there but broken */
    return bp_fail(BP_ERR_IO, "cannot open %s: %s", out, strerror(errno));
  snprintf(out, cap, "%s/%s", dir, name);
  if (stat(out, &sb) == 0) return BP_OK;
  return bp_fail(BP_ERR_IO, "cannot open %s/%s.gz (nor %s/%s): %s%s", dir, name, dir, name,
                 strerror(errno),
                 is_default ? " (install the dataset-fashion-mnist package, or give another "
                              "MNIST-format directory)"
                            : "");
}

bp_status bp_dataset_load_mnist(const char *dir, bp_data_split split, bp_dataset **dataset_out) {
  static const char *const names[2][2] = {
      {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"},
      {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"},
  };
  if (!dataset_out) return bp_fail(BP_ERR_INVALID, "bp_dataset_load_mnist: NULL argument");
  if (split != BP_DATA_TRAIN && split != BP_DATA_TEST)
    return bp_fail(BP_ERR_INVALID, "unknown data split %d", (int)split);
  int is_default = dir == NULL;
  if (!dir) dir = BP_DATA_DEFAULT_DIR;
  char images[IDX_PATH_MAX], labels[IDX_PATH_MAX];
  bp_status st = pick_file(dir, names[split][0], is_default, images, sizeof images);
  if (st != BP_OK) return st;
  st = pick_file(dir, names[split][1], is_default, labels, sizeof labels);
  if (st != BP_OK) return st;
  return bp_dataset_load_idx(images, labels, 10, dataset_out);
}

bp_status bp_dataset_load_idx_images(const char *images_path, bp_dataset **dataset_out) {
  return bp_dataset_load_idx_images_first(images_path, 0, dataset_out);
}

bp_status bp_dataset_load_idx_images_first(const char *images_path, int64_t limit,
                                           bp_dataset **dataset_out) {
  if (!images_path || !dataset_out || limit < 0)
    return bp_fail(BP_ERR_INVALID, "bp_dataset_load_idx_images: NULL argument or limit < 0");
  idx_file fi;
  uint8_t *pixels = NULL, *labels = NULL;
  bp_dataset *d = NULL;
  bp_status st = idx_open(&fi, images_path);
  if (st != BP_OK) goto done;
  st = idx_read_header(&fi, IDX_MAGIC_IMAGES, IDX_MAGIC_IMAGES4);
  if (st != BP_OK) goto done;
  bp_dataset_info info;
  st = idx_read_images_first(&fi, images_path, 1, limit, &info, &pixels);
  if (st != BP_OK) goto done;
  labels = calloc((size_t)info.count > 0 ? (size_t)info.count : 1, 1);
  d = calloc(1, sizeof *d);
  if (!labels || !d) {
    free(d);
    st = bp_fail(BP_ERR_NOMEM, "out of memory creating a dataset");
    goto done;
  }
  d->info = info;
  d->images = pixels; /* handed over */
  d->labels = labels;
  pixels = labels = NULL;
  *dataset_out = d;
done:
  free(pixels);
  free(labels);
  idx_close(&fi);
  return st;
}
