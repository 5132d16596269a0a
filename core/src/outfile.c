/* Output files (blueprint/outfile.h): refuse to replace what is not a
 * regular file, and sweep the temporaries of dead writers. */
#include "blueprint/outfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

bp_status bp_output_check(const char *path, const char *what) {
  struct stat sb;
  if (!path || !path[0]) return bp_fail(BP_ERR_INVALID, "%s: empty output path", what);
  if (stat(path, &sb) != 0) {
    if (errno == ENOENT) return BP_OK;
    if (errno == ELOOP)
      return bp_fail(BP_ERR_IO, "%s '%s': a symbolic link loop; not replacing it", what, path);
    return BP_OK; /* the write itself reports other problems */
  }
  if (S_ISREG(sb.st_mode)) return BP_OK;
  return bp_fail(BP_ERR_IO, "%s '%s' exists and is %s; refusing to replace it", what, path,
                 kind_of(sb.st_mode));
}

int bp_output_sweep_temps(const char *path) {
  if (!path || !path[0]) return 0;
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  char *dir = bp_output_dir(path);
  if (!dir) return 0;
  size_t base_len = strlen(base);
  int removed = 0;
  DIR *dp = opendir(dir);
  if (dp) {
    int dfd = dirfd(dp);
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
      const char *n = e->d_name;
      if (strncmp(n, base, base_len) != 0 || strncmp(n + base_len, ".tmp.", 5) != 0) continue;
      const char *digits = n + base_len + 5;
      char *end;
      errno = 0;
      long pid = strtol(digits, &end, 10);
      if (!digits[0] || *end || errno || pid <= 0 || (long)(pid_t)pid != pid) continue;
      if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
      struct stat sb;
      if (fstatat(dfd, n, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode)) continue;
      if (unlinkat(dfd, n, 0) == 0) removed++;
    }
    closedir(dp);
  }
  free(dir);
  return removed;
}

bp_status bp_output_prepare(const char *path, const char *what) {
  bp_status st = bp_output_check(path, what);
  if (st == BP_OK) (void)bp_output_sweep_temps(path);
  return st;
}

int bp_output_open(const char *path, const char *what, int append) {
  if (bp_output_check(path, what) != BP_OK) return -1;
  /* O_NONBLOCK: a FIFO that appeared meanwhile fails or opens at once;
   * no O_TRUNC before fstat says the file is regular */
  int fd = open(path, O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC | O_NOCTTY |
                          (append ? O_APPEND : 0), 0644);
  if (fd < 0) {
    int err = errno;
    bp_fail(BP_ERR_IO, "%s '%s': %s", what, path, strerror(err));
    return -1;
  }
  struct stat sb = {0};
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    bp_fail(BP_ERR_IO, "%s '%s' is %s; refusing to write it", what, path,
            kind_of(sb.st_mode));
    close(fd);
    return -1;
  }
  int flags = fcntl(fd, F_GETFL);
  if ((!append && ftruncate(fd, 0) != 0) || flags < 0 ||
      fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    int err = errno;
    bp_fail(BP_ERR_IO, "%s '%s': %s", what, path, strerror(err));
    close(fd);
    return -1;
  }
  return fd;
}

char *bp_output_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  const size_t n = slash == path ? 1 : (size_t)(slash - path); /* "/x" lives in "/" */
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, path, n);
    d[n] = '\0';
  }
  return d;
}

char *bp_output_target(const char *path) {
  if (!path) return NULL;
  char *cur = strdup(path);
  for (int hops = 0; cur && hops < 40; hops++) {
    struct stat sb;
    if (lstat(cur, &sb) != 0 || !S_ISLNK(sb.st_mode)) return cur;
    char link[4096];
    ssize_t n = readlink(cur, link, sizeof link - 1);
    if (n <= 0) return cur;
    link[n] = '\0';
    const char *slash = strrchr(cur, '/');
    const size_t dir_len = link[0] == '/' || !slash ? 0 : (size_t)(slash - cur) + 1;
    char *next = malloc(dir_len + (size_t)n + 1);
    if (next) {
      memcpy(next, cur, dir_len); /* a relative target lives in the link's directory */
      memcpy(next + dir_len, link, (size_t)n + 1);
    }
    free(cur);
    cur = next;
  }
  if (!cur) return NULL;
  free(cur);
  return strdup(path);
}
