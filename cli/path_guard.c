/* Output paths against inputs and against each other (path_guard.h). */
#include "path_guard.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blueprint/outfile.h"
#include "cli_util.h"

/* One file a command reads or writes, as the guard compares it. */
typedef struct guard_file {
  const bp_path_use *use;
  char *name;     /* for messages: the path, or DIR/ENTRY of an input directory */
  int exists;     /* stat() succeeded: dev and ino hold */
  dev_t dev;
  ino_t ino;
  char *resolved; /* a missing output: realpath(its directory) + "/" + its name */
} guard_file;

typedef struct guard_list {
  guard_file *files;
  int count, cap;
} guard_list;

/* One line through bp_fail, which shortens a path of kilobytes and keeps
 * the reason at the end. */
static void report(const char *command, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(const char *command, const char *fmt, ...) {
  va_list ap, again;
  va_start(ap, fmt);
  va_copy(again, ap);
  const int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *line = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (line) {
    vsnprintf(line, (size_t)n + 1, fmt, again);
    bp_fail(BP_ERR_IO, "%s", line);
    free(line);
  } else {
    bp_fail(BP_ERR_NOMEM, "out of memory reporting a path");
  }
  va_end(again);
  bp_cli_report(command, "%s", bp_last_error());
}

static int grow(guard_list *l) {
  if (l->count < l->cap) return 0;
  int cap = l->cap ? 2 * l->cap : 16;
  guard_file *f = realloc(l->files, (size_t)cap * sizeof *f);
  if (!f) return -1;
  l->files = f;
  l->cap = cap;
  return 0;
}

static void list_free(guard_list *l) {
  for (int k = 0; k < l->count; k++) {
    free(l->files[k].name);
    free(l->files[k].resolved);
  }
  free(l->files);
}

/* Fills f for an output that does not exist yet: its directory must exist
 * and be writable; *resolved names where it would be created. Returns 0,
 * or -1 after the report. */
static int missing_output(const char *command, guard_file *f, const char *target) {
  char *dir = bp_output_dir(target);
  if (!dir) {
    report(command, "out of memory checking %s", f->use->what);
    return -1;
  }
  struct stat sb;
  int rc = -1;
  if (stat(dir, &sb) != 0) {
    report(command, "%s '%s': the directory '%s' cannot be used: %s", f->use->what,
                  f->use->path, dir, strerror(errno));
  } else if (!S_ISDIR(sb.st_mode)) {
    report(command, "%s '%s': '%s' is not a directory", f->use->what, f->use->path, dir);
  } else if (access(dir, W_OK | X_OK) != 0) {
    report(command, "%s '%s': the directory '%s' is not writable: %s", f->use->what,
                  f->use->path, dir, strerror(errno));
  } else {
    char real[PATH_MAX];
    const char *base = strrchr(target, '/');
    base = base ? base + 1 : target;
    if (!realpath(dir, real)) {
      report(command, "%s '%s': cannot resolve '%s': %s", f->use->what, f->use->path, dir,
                    strerror(errno));
    } else if ((f->resolved = malloc(strlen(real) + strlen(base) + 2)) == NULL) {
      report(command, "out of memory checking %s", f->use->what);
    } else {
      sprintf(f->resolved, "%s/%s", real, base);
      rc = 0;
    }
  }
  free(dir);
  return rc;
}

/* Adds one file of `use` named `name` (stat'ed through symbolic links). */
static int add_file(const char *command, guard_list *l, const bp_path_use *use, const char *name) {
  if (grow(l) != 0 || !(l->files[l->count].name = strdup(name))) {
    report(command, "out of memory checking %s", use->what);
    return -1;
  }
  guard_file *f = &l->files[l->count++];
  f->use = use;
  f->resolved = NULL;
  struct stat sb;
  f->exists = stat(name, &sb) == 0;
  if (f->exists) {
    f->dev = sb.st_dev;
    f->ino = sb.st_ino;
    return 0;
  }
  if (use->role != BP_PATH_OUTPUT && use->role != BP_PATH_IN_OUT) return 0; /* its reader says */
  if (errno != ENOENT) return 0; /* a symlink loop and the like: the writer refuses it */
  char *target = bp_output_target(name); /* a dangling link: where the write would go */
  if (!target) {
    report(command, "out of memory checking %s", use->what);
    return -1;
  }
  int rc = missing_output(command, f, target);
  free(target);
  return rc;
}

/* Adds every regular file of directory use->path (an input directory). */
static int add_dir(const char *command, guard_list *l, const bp_path_use *use) {
  DIR *d = opendir(use->path);
  if (!d) return 0; /* the reader reports a missing data directory */
  struct dirent *e;
  int rc = 0;
  while (rc == 0 && (e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    size_t n = strlen(use->path) + strlen(e->d_name) + 2;
    char *name = malloc(n);
    if (!name) {
      report(command, "out of memory checking %s", use->what);
      rc = -1;
      break;
    }
    snprintf(name, n, "%s/%s", use->path, e->d_name);
    struct stat sb;
    if (stat(name, &sb) == 0 && S_ISREG(sb.st_mode)) rc = add_file(command, l, use, name);
    free(name);
  }
  closedir(d);
  return rc;
}

static int is_output(const guard_file *f) {
  return f->use->role == BP_PATH_OUTPUT || f->use->role == BP_PATH_IN_OUT;
}

static int same(const guard_file *a, const guard_file *b) {
  if (a->exists && b->exists) return a->dev == b->dev && a->ino == b->ino;
  return a->resolved && b->resolved && strcmp(a->resolved, b->resolved) == 0;
}

int bp_cli_check_paths(const char *command, const bp_path_use *uses, int count) {
  guard_list l = {NULL, 0, 0};
  int rc = 0;
  for (int k = 0; k < count && rc == 0; k++) {
    if (!uses[k].path || !uses[k].path[0]) continue;
    rc = uses[k].role == BP_PATH_INPUT_DIR ? add_dir(command, &l, &uses[k])
                                           : add_file(command, &l, &uses[k], uses[k].path);
  }
  for (int i = 0; i < l.count && rc == 0; i++) {
    const guard_file *o = &l.files[i];
    if (!is_output(o)) continue;
    for (int j = 0; j < l.count && rc == 0; j++) {
      const guard_file *x = &l.files[j];
      if (j == i || !same(o, x)) continue;
      if (o->use->may_be && !strcmp(o->use->may_be, x->use->what)) continue;
      if (!is_output(x)) {
        bp_cli_report(command,
                      "%s '%s' is the same file as %s '%s': writing it would destroy an input "
                      "of the run; nothing was written",
                      o->use->what, o->name, x->use->what, x->name);
        rc = 2;
      } else if (j > i) {
        bp_cli_report(command,
                      "%s '%s' and %s '%s' are the same file: one would overwrite the other; "
                      "nothing was written",
                      o->use->what, o->name, x->use->what, x->name);
        rc = 2;
      }
    }
  }
  list_free(&l);
  return rc < 0 ? 1 : rc;
}
