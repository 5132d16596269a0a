/* Discovery: which files bp_registry_discover tries, in which order
 * (registry.h). Never the current directory: relative and empty
 * BP_PLUGIN_PATH entries are recorded and skipped, and every path handed
 * to dlopen is absolute (a bare name would make dlopen search the library
 * path instead). */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "registry-impl.h"

/* Anchor inside libblueprint.so for dladdr. */
static const char library_anchor = 0;

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_candidate(const char *name) {
  size_t n = strlen(name);
  return name[0] != '.' && n > 3 && strcmp(name + n - 3, ".so") == 0;
}

/* Adds `dir` (absolute) to the searched list, unless an equal path is
 * there already (returns 1 then: do not scan it twice). */
static int note_dir(bp_registry *r, const char *dir, const char *source, int exists) {
  for (int i = 0; i < r->dirs.count; i++) {
    const bp_search_dir *d = r->dirs.items[i];
    if (strcmp(d->path, dir) == 0) return 1;
  }
  bp_search_dir *d = calloc(1, sizeof *d);
  char *copy = bp_strdup(dir);
  if (!d || !copy || bp_ptr_list_push(&r->dirs, d) != 0) {
    free(d);
    free(copy);
    return 0; /* only the listing loses it */
  }
  d->path = copy;
  d->source = source;
  d->exists = exists;
  return 0;
}

/* Loads every candidate of a directory in name order. Failures of single
 * modules are recorded, not returned; *loaded and *refused count them. */
static bp_status scan_dir(bp_registry *r, const char *dir, int *loaded, int *refused) {
  DIR *dp = opendir(dir);
  if (!dp)
    return bp_registry_note(r, dir, BP_LOAD_REFUSED, BP_ERR_IO, "cannot read directory: %s",
                            strerror(errno));
  bp_ptr_list names = {0};
  bp_status st = BP_OK;
  struct dirent *e;
  while ((e = readdir(dp)) != NULL) {
    if (!is_candidate(e->d_name)) continue;
    char *name = bp_strdup(e->d_name);
    if (!name || bp_ptr_list_push(&names, name) != 0) {
      free(name);
      st = bp_fail(BP_ERR_NOMEM, "out of memory listing %s", dir);
      break;
    }
  }
  closedir(dp);
  if (names.count) qsort(names.items, (size_t)names.count, sizeof *names.items, by_name);
  for (int i = 0; i < names.count && st == BP_OK; i++) {
    size_t n = strlen(dir) + strlen(names.items[i]) + 2;
    char *path = malloc(n);
    if (!path) {
      st = bp_fail(BP_ERR_NOMEM, "out of memory listing %s", dir);
      break;
    }
    snprintf(path, n, "%s/%s", dir, (char *)names.items[i]);
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
      if (bp_registry_load(r, path) == BP_OK)
        ++*loaded;
      else if (bp_registry_record_count(r) > 0 &&
               bp_registry_record(r, bp_registry_record_count(r) - 1)->outcome ==
                   BP_LOAD_REFUSED)
        ++*refused;
    }
    free(path);
  }
  for (int i = 0; i < names.count; i++) free(names.items[i]);
  free(names.items);
  return st;
}

/* The message of the first refused record from index `from` on. */
static const char *first_refusal(const bp_registry *r, int from) {
  for (int i = from; i < bp_registry_record_count(r); i++) {
    const bp_load_record *rec = bp_registry_record(r, i);
    if (rec->outcome == BP_LOAD_REFUSED) return rec->message ? rec->message : "";
  }
  return "";
}

/* A file or a directory. `quiet_missing`: a default directory that does
 * not exist is normal and not recorded. */
static bp_status load_path(bp_registry *r, const char *path, const char *source,
                           int quiet_missing) {
  struct stat sb;
  if (stat(path, &sb) != 0) {
    int err = errno;
    if (quiet_missing) {
      note_dir(r, path, source, 0);
      return BP_OK;
    }
    return bp_registry_note(r, path, BP_LOAD_REFUSED, BP_ERR_IO, "%s (from %s)", strerror(err),
                            source);
  }
  if (!S_ISDIR(sb.st_mode)) return bp_registry_load(r, path);
  char *real = realpath(path, NULL);
  if (!real)
    return bp_registry_note(r, path, BP_LOAD_REFUSED, BP_ERR_IO, "%s (from %s)",
                            strerror(errno), source);
  bp_status st = BP_OK;
  int loaded = 0, refused = 0, from = bp_registry_record_count(r);
  if (!note_dir(r, real, source, 1)) st = scan_dir(r, real, &loaded, &refused);
  /* a directory named on purpose whose every module was refused is an
   * error, not a quiet success (the records say why for each) */
  if (st == BP_OK && !quiet_missing && refused > 0 && loaded == 0 &&
      strcmp(source, "explicit") == 0)
    st = bp_fail(BP_ERR_IO, "%s: no module loaded: all %d refused (first: %s)", real, refused,
                 first_refusal(r, from));
  free(real);
  return st;
}

/* <dir of libblueprint.so>/blueprint/modules, or NULL. Caller frees. */
static char *beside_library(void) {
  Dl_info info;
  if (!dladdr(&library_anchor, &info) || !info.dli_fname) return NULL;
  char *lib = realpath(info.dli_fname, NULL);
  if (!lib) return NULL;
  char *slash = strrchr(lib, '/');
  if (!slash || lib[0] != '/') {
    free(lib);
    return NULL;
  }
  *slash = '\0';
  size_t n = strlen(lib) + sizeof "/blueprint/modules";
  char *dir = malloc(n);
  if (dir) snprintf(dir, n, "%s/blueprint/modules", lib);
  free(lib);
  return dir;
}

/* Each entry of the registry's search path (bp_registry_options; the CLI's
 * BP_PLUGIN_PATH, whose name the records keep); only absolute ones are
 * searched. */
static void load_search_path(bp_registry *r) {
  if (!r->search_path) return;
  char *copy = bp_strdup(r->search_path);
  if (!copy) return;
  /* strtok_r would merge "a::b"; the empty entry must be seen and refused */
  char *entry = copy;
  for (;;) {
    char *colon = strchr(entry, ':');
    if (colon) *colon = '\0';
    if (entry[0] == '\0')
      (void)bp_registry_note(r, "", BP_LOAD_SKIPPED, BP_OK,
                             "empty BP_PLUGIN_PATH entry ignored (it would mean the current "
                             "directory)");
    else if (entry[0] != '/')
      (void)bp_registry_note(r, entry, BP_LOAD_SKIPPED, BP_OK,
                             "relative BP_PLUGIN_PATH entry ignored (only absolute directories "
                             "are searched, never the current directory)");
    else
      (void)load_path(r, entry, "BP_PLUGIN_PATH", 0);
    if (!colon) break;
    entry = colon + 1;
  }
  free(copy);
}

bp_status bp_registry_discover(bp_registry *r, const char *const *paths, int path_count) {
  if (!r || path_count < 0 || (path_count > 0 && !paths))
    return bp_fail(BP_ERR_INVALID, "bp_registry_discover: bad arguments");
  bp_status first = BP_OK;
  char first_msg[BP_REASON_MAX * 2] = "";
  r->loading_source = "explicit"; /* every record says where it was found */
  for (int i = 0; i < path_count; i++) {
    if (!paths[i]) continue;
    bp_status st = load_path(r, paths[i], "explicit", 0);
    if (st != BP_OK && first == BP_OK) {
      first = st;
      snprintf(first_msg, sizeof first_msg, "%s", bp_last_error());
    }
  }
  r->loading_source = "BP_PLUGIN_PATH";
  load_search_path(r);
#ifdef BP_MODULE_INSTALL_DIR
  r->loading_source = "install";
  (void)load_path(r, BP_MODULE_INSTALL_DIR, "install", 1);
#endif
  r->loading_source = "library";
  char *beside = beside_library();
  if (beside) (void)load_path(r, beside, "library", 1);
  free(beside);
  r->loading_source = NULL;
  if (first != BP_OK) return bp_fail(first, "%s", first_msg);
  return BP_OK;
}
