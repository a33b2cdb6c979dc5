#include "core/sys.h"

#include <dlfcn.h>
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <ATen/Parallel.h>  // at::set_num_threads (no need for all of torch.h)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace morph {

void pinThreads(int threads) {
  std::string n = std::to_string(threads);
  setenv("OMP_NUM_THREADS", n.c_str(), 1);
  setenv("OPENBLAS_NUM_THREADS", n.c_str(), 1);
  setenv("MKL_NUM_THREADS", n.c_str(), 1);
  at::set_num_threads(threads);
  static bool interop_set = false;  // libtorch allows setting this once per process
  if (!interop_set) {
    try {
      at::set_num_interop_threads(1);
    } catch (const std::exception&) {
    }
    interop_set = true;
  }
  using SetThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    f(threads);
}

void tuneAllocator() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

int64_t allocatorBytesInUse() {
  struct mallinfo2 mi = mallinfo2();
  return static_cast<int64_t>(mi.uordblks + mi.hblkhd);
}

std::string checkBlas(bool warn) {
  using GetConfig = char* (*)();
  if (auto f = reinterpret_cast<GetConfig>(dlsym(RTLD_DEFAULT, "openblas_get_config")))
    return std::string("openblas ") + f();
  if (warn) {
    static bool warned = false;
    if (!warned)
      std::fprintf(stderr,
                   "morph: warning: the reference BLAS is in use; training runs several times "
                   "slower than with OpenBLAS. Install it: apt-get install libopenblas0-openmp\n");
    warned = true;
  }
  return "reference";
}

int64_t peakRssBytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

int64_t currentRssBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long long pages = 0, resident = 0;
  const int n = std::fscanf(f, "%lld %lld", &pages, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

double nowSeconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace morph
