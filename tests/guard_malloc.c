/* A test-only malloc for LD_PRELOAD (tests/CMakeLists.txt): every block
 * ends at (or just below) a PROT_NONE page, and free() unmaps it. A write
 * (or read) past the end of any heap block of the process, or a use after
 * free, is a SIGSEGV at the faulting instruction, including in code no
 * sanitizer instruments: oneDNN's JIT kernels writing into buffers
 * ops/onednn allocates, and oneDNN's own allocations.
 *
 * Blocks start at their alignment below the guard: malloc's 16-byte
 * alignment leaves up to 15 bytes of slack before the guard, and
 * posix_memalign and friends get at most 32-byte alignment below a page
 * (enough for the 256-bit loads of AVX2 kernels; larger alignments would
 * only add slack), page alignment as asked. The slack holds a canary that
 * free() and realloc() check: a write there aborts with the block's size.
 *
 * Each block costs two pages and two mappings (VMAs), and the kernel caps a
 * process's mappings (vm.max_map_count, 65530 by default), which the CUDA
 * libraries' initializers alone would exhaust: past GUARD_LIVE_MAX live
 * guarded blocks (or when a mapping fails) blocks come unguarded from
 * glibc's own allocator. An 8-byte tag just below every block says which
 * kind it is. For test processes only. */
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define GUARD_PAGE 4096u
#define GUARD_MAGIC 0x67756172646d616cull
#define GUARD_CANARY 0xa5
#define GUARD_TAG 0x6775617264656421ull /* at p - 8: a guarded block */
#define LIBC_TAG 0x676c696263626c6bull  /* at p - 8: from glibc, size at p - 24, start at p - 16 */
#define GUARD_LIVE_MAX 20000

/* glibc's allocator under its exported internal names */
extern void *__libc_memalign(size_t align, size_t size);
extern void __libc_free(void *p);

static long live_guarded; /* atomic */

/* The page below a block's first page holds its header. */
typedef struct block_header {
  uint64_t magic;
  void *map;
  size_t map_bytes, size;
} block_header;

static void die(const char *msg) {
  (void)!write(2, msg, strlen(msg));
  __builtin_trap();
}

/* An unguarded block from glibc, tagged. */
static void *unguarded(size_t size, size_t align) {
  if (align < 32) align = 32; /* room for the tag, the start and the size */
  if (size > SIZE_MAX / 2) return NULL;
  char *q = __libc_memalign(align, size + align);
  if (!q) return NULL;
  char *p = q + align;
  memcpy(p - 8, &(uint64_t){LIBC_TAG}, 8);
  memcpy(p - 16, &q, sizeof q);
  memcpy(p - 24, &size, sizeof size);
  return p;
}

static uint64_t tag_of(const void *p) {
  uint64_t tag;
  memcpy(&tag, (const char *)p - 8, 8);
  return tag;
}

static void *guarded(size_t size, size_t align) {
  if (align < 16) align = 16;
  if (align < GUARD_PAGE && align > 32) align = 32;
  if (size > SIZE_MAX / 2) return NULL;
  if (__atomic_add_fetch(&live_guarded, 1, __ATOMIC_RELAXED) > GUARD_LIVE_MAX) {
    __atomic_sub_fetch(&live_guarded, 1, __ATOMIC_RELAXED);
    return unguarded(size, align);
  }
  /* data pages for the block and its alignment, one below for the header */
  const size_t data = (size + align + GUARD_PAGE - 1) / GUARD_PAGE * GUARD_PAGE + GUARD_PAGE;
  const size_t map_bytes = data + GUARD_PAGE;
  char *m = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED || mprotect(m + data, GUARD_PAGE, PROT_NONE) != 0) {
    if (m != MAP_FAILED) munmap(m, map_bytes);
    __atomic_sub_fetch(&live_guarded, 1, __ATOMIC_RELAXED);
    return unguarded(size, align);
  }
  const uintptr_t p = ((uintptr_t)(m + data) - size) & ~(uintptr_t)(align - 1);
  block_header *h = (block_header *)((p & ~(uintptr_t)(GUARD_PAGE - 1)) - GUARD_PAGE);
  h->magic = GUARD_MAGIC, h->map = m, h->map_bytes = map_bytes, h->size = size;
  memset((char *)p + size, GUARD_CANARY, (size_t)(m + data - ((char *)p + size)));
  memcpy((char *)p - 8, &(uint64_t){GUARD_TAG}, 8); /* below p: the header page's tail at worst */
  return (void *)p;
}

/* The block's header, after checking its canary. */
static block_header *header_of(void *p) {
  block_header *h = (block_header *)(((uintptr_t)p & ~(uintptr_t)(GUARD_PAGE - 1)) - GUARD_PAGE);
  if (h->magic != GUARD_MAGIC) die("guard_malloc: free or realloc of a pointer it did not make\n");
  const unsigned char *end = (const unsigned char *)h->map + h->map_bytes - GUARD_PAGE;
  for (const unsigned char *c = (const unsigned char *)p + h->size; c < end; c++)
    if (*c != GUARD_CANARY) {
      char msg[160];
      /* no snprintf: it may allocate */
      static const char digits[] = "0123456789";
      size_t at = 0, n = h->size;
      char num[24];
      int len = 0;
      do num[len++] = digits[n % 10], n /= 10; while (n);
      const char *head = "guard_malloc: a write past the end of a heap block of ";
      while (*head) msg[at++] = *head++;
      while (len) msg[at++] = num[--len];
      const char *tail = " bytes\n";
      while (*tail) msg[at++] = *tail++;
      msg[at] = '\0';
      die(msg);
    }
  return h;
}

void *malloc(size_t n) { return guarded(n, 16); }

/* The bytes a block was asked for. */
static size_t size_of(void *p) {
  if (tag_of(p) == LIBC_TAG) {
    size_t size;
    memcpy(&size, (char *)p - 24, sizeof size);
    return size;
  }
  return header_of(p)->size;
}

void free(void *p) {
  if (!p) return;
  if (tag_of(p) == LIBC_TAG) {
    void *q;
    memcpy(&q, (char *)p - 16, sizeof q);
    memset((char *)p - 8, 0, 8);
    __libc_free(q);
    return;
  }
  if (tag_of(p) != GUARD_TAG) die("guard_malloc: free of a pointer it did not make\n");
  block_header *h = header_of(p);
  h->magic = 0;
  munmap(h->map, h->map_bytes); /* a later use faults */
  __atomic_sub_fetch(&live_guarded, 1, __ATOMIC_RELAXED);
}

void *calloc(size_t count, size_t size) {
  if (size && count > SIZE_MAX / size) return NULL;
  void *p = guarded(count * size, 16);
  if (p && tag_of(p) == LIBC_TAG) memset(p, 0, count * size); /* fresh mappings are zero */
  return p;
}

void *realloc(void *p, size_t n) {
  if (!p) return malloc(n);
  const size_t old = size_of(p);
  void *q = malloc(n);
  if (!q) return NULL;
  memcpy(q, p, old < n ? old : n);
  free(p);
  return q;
}

int posix_memalign(void **out, size_t align, size_t n) {
  void *p = guarded(n, align);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}

void *aligned_alloc(size_t align, size_t n) { return guarded(n, align); }
void *memalign(size_t align, size_t n) { return guarded(n, align); }
void *valloc(size_t n) { return guarded(n, GUARD_PAGE); }
void *pvalloc(size_t n) { return guarded((n + GUARD_PAGE - 1) / GUARD_PAGE * GUARD_PAGE, GUARD_PAGE); }
size_t malloc_usable_size(void *p) { return p ? size_of(p) : 0; }
