/* Input files (blueprint/infile.h): one checked open for every file read. */
#include "blueprint/infile.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

int bp_input_open(const char *path, uint64_t max_bytes, uint64_t *size_out, char *why,
                  size_t why_size) {
  char scratch[8];
  if (!why) why = scratch, why_size = sizeof scratch;
  why[0] = '\0';
  /* O_NONBLOCK: a FIFO opens at once (and is refused below) instead of
   * waiting for a writer; a device's open has no side effect we keep */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    snprintf(why, why_size, "%s", strerror(err));
    errno = err;
    return -1;
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    const int err = errno;
    snprintf(why, why_size, "cannot stat: %s", strerror(err));
    close(fd);
    errno = err;
    return -1;
  }
  if (S_ISDIR(sb.st_mode)) {
    snprintf(why, why_size, "not a regular file (it is a directory)");
    close(fd);
    errno = EISDIR;
    return -1;
  }
  if (!S_ISREG(sb.st_mode)) {
    snprintf(why, why_size, "not a regular file (%s)", kind_of(sb.st_mode));
    close(fd);
    errno = EINVAL;
    return -1;
  }
  if (max_bytes > 0 && (uint64_t)sb.st_size > max_bytes) {
    snprintf(why, why_size, "larger than %" PRIu64 " bytes (%" PRIu64 ")", max_bytes,
             (uint64_t)sb.st_size);
    close(fd);
    errno = EFBIG;
    return -1;
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  if (size_out) *size_out = (uint64_t)sb.st_size;
  return fd;
}

bp_status bp_input_read_all(const char *path, const char *what, uint64_t max_bytes,
                            char **text_out, size_t *size_out) {
  char why[256];
  uint64_t size = 0;
  *text_out = NULL;
  if (size_out) *size_out = 0;
  int fd = bp_input_open(path, max_bytes, &size, why, sizeof why);
  if (fd < 0) {
    const int err = errno;
    bp_status st = bp_fail(BP_ERR_IO, "%s '%s': %s", what, path, why);
    errno = err;
    return st;
  }
  if (size >= SIZE_MAX) {
    close(fd);
    return bp_fail(BP_ERR_IO, "%s '%s': too large to read", what, path);
  }
  char *text = malloc((size_t)size + 1);
  if (!text) {
    close(fd);
    return bp_fail(BP_ERR_NOMEM, "%s '%s': out of memory reading %" PRIu64 " bytes", what, path,
                   size);
  }
  /* read what fstat promised and no more: a file that grows meanwhile is
   * read to its size then */
  size_t got = 0;
  while (got < (size_t)size) {
    ssize_t n = read(fd, text + got, (size_t)size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      free(text);
      return bp_fail(BP_ERR_IO, "%s '%s': cannot read: %s", what, path, strerror(err));
    }
    if (n == 0) break; /* shrank meanwhile */
    got += (size_t)n;
  }
  close(fd);
  text[got] = '\0';
  *text_out = text;
  if (size_out) *size_out = got;
  return BP_OK;
}
