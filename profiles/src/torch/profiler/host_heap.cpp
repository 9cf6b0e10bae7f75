#include "zeroplan/profiles/host_heap.h"

#include <limits>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace zeroplan {

void retain_freed_host_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_MAX, 0);                                  // large blocks from the heap, not mmap
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());  // freed memory stays in the heap
#endif
}

}  // namespace zeroplan
