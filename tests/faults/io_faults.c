/* An LD_PRELOAD shim for tests/test_io_faults.c: fails the I/O of a file
 * being written through a temporary ("*.tmp.*": checkpoints) the way a
 * full disk or a broken file system does. BP_IO_FAULT selects the fault:
 *   enospc  the first write to the temporary fails with ENOSPC
 *   short   the first write to the temporary writes half and then ENOSPC
 *   fsync   fsync of the temporary fails with EIO
 *   rename  rename of the temporary fails with EIO
 * The calls are libblueprint's own (through its PLT), so both stdio's
 * fwrite and write are covered; everything else passes through. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REAL(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

static int fault_is(const char *what) {
  const char *f = getenv("BP_IO_FAULT");
  return f && strcmp(f, what) == 0;
}

/* Whether fd names a temporary being written ("*.tmp.*"). */
static int is_temp(int fd) {
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = '\0';
  return strstr(path, ".tmp.") != NULL;
}

ssize_t write(int fd, const void *buf, size_t n) {
  if ((fault_is("enospc") || fault_is("short")) && is_temp(fd)) {
    if (fault_is("short") && n > 1) return REAL(write)(fd, buf, n / 2) > 0 ? (ssize_t)(n / 2) : -1;
    errno = ENOSPC;
    return -1;
  }
  return REAL(write)(fd, buf, n);
}

size_t fwrite(const void *buf, size_t size, size_t count, FILE *f) {
  if ((fault_is("enospc") || fault_is("short")) && size * count > 0 && is_temp(fileno(f))) {
    size_t half = fault_is("short") ? count / 2 : 0;
    if (half) REAL(fwrite)(buf, size, half, f);
    errno = ENOSPC;
    return half;
  }
  return REAL(fwrite)(buf, size, count, f);
}

int fsync(int fd) {
  if (fault_is("fsync") && is_temp(fd)) {
    errno = EIO;
    return -1;
  }
  return REAL(fsync)(fd);
}

int rename(const char *from, const char *to) {
  if (fault_is("rename") && strstr(from, ".tmp.")) {
    errno = EIO;
    return -1;
  }
  return REAL(rename)(from, to);
}
