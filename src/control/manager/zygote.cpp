#include "control/manager/zygote.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "control/store_access.h"

namespace morph {

namespace {

MainFunction g_main = nullptr;
char* g_area = nullptr;  // argv[0] .. the end of the last argument: contiguous
size_t g_area_len = 0;
WorkerZygote* g_zygote = nullptr;

constexpr size_t kMaxRequest = 16384;

int threadCount() {
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return -1;
  int n = 0;
  while (const dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

// Copies now, while this process runs one thread, every private writable
// page it still shares with the zygote: written later, each would be a
// copy-on-write fault with a TLB shootdown across the worker's threads
// (measured: 0.15 s of system time per worker). Only pages present in the
// zygote and not yet this process's own (/proc/self/pagemap bits 63 and
// 56): populating whole mappings would allocate, among others, the BLAS's
// untouched static buffers (200 MB more resident per worker).
void breakCopyOnWrite() {
#ifdef MADV_POPULATE_WRITE
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return;
  const int pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<uint64_t> entries;
  char line[512];
  while (pagemap >= 0 && std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || std::strcmp(perms, "rw-p") != 0) continue;
    const uint64_t pages = (hi - lo) / page;
    entries.resize(pages);
    const ssize_t got = pread(pagemap, entries.data(), pages * 8, static_cast<off_t>(lo / page * 8));
    if (got != static_cast<ssize_t>(pages * 8)) continue;
    uint64_t run = 0;  // pages in the current run of shared present pages
    for (uint64_t i = 0; i <= pages; ++i) {
      const bool shared = i < pages && (entries[i] >> 63 & 1) && !(entries[i] >> 56 & 1);
      if (shared) {
        ++run;
      } else if (run > 0) {
        madvise(reinterpret_cast<void*>(lo + (i - run) * page), run * page, MADV_POPULATE_WRITE);
        run = 0;
      }
    }
  }
  if (pagemap >= 0) close(pagemap);
  std::fclose(maps);
#endif
}

size_t bytesOf(const std::vector<std::string>& args) {
  size_t n = 0;
  for (const std::string& a : args) n += a.size() + 1;
  return n;
}

// In the worker: what exec would have done, then main(). Never returns.
[[noreturn]] void becomeWorker(pid_t manager, const char* request, size_t len) {
  // The intermediate process exits at once; then the manager (a subreaper)
  // is this process's parent, and its death must reach the worker.
  for (int i = 0; getppid() != manager; ++i) {
    if (i > 100000) _exit(3);  // 10 s: the manager is gone
    usleep(100);
  }
  prctl(PR_SET_PDEATHSIG, detail::kManagerDeathSignal);
  if (getppid() != manager) _exit(3);
  breakCopyOnWrite();
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction sa {};
    if (sigaction(s, nullptr, &sa) == 0 && sa.sa_handler != SIG_IGN && sa.sa_handler != SIG_DFL) {
      sa.sa_handler = SIG_DFL;
      sa.sa_flags = 0;
      sigaction(s, &sa, nullptr);
    }
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  // The command line in /proc: the arguments, NUL-separated, then NULs.
  std::memset(g_area, 0, g_area_len);
  std::memcpy(g_area, request, len);
  std::vector<char*> argv;
  for (size_t at = 0; at < len; at += std::strlen(g_area + at) + 1) argv.push_back(g_area + at);
  argv.push_back(nullptr);
  std::exit(g_main(static_cast<int>(argv.size()) - 1, argv.data()));
}

[[noreturn]] void zygoteLoop(int fd, pid_t manager) {
  std::vector<char> buf(kMaxRequest);
  for (;;) {
    ssize_t n;
    do n = recv(fd, buf.data(), buf.size(), 0);
    while (n < 0 && errno == EINTR);
    if (n <= 0) _exit(0);  // the manager closed its end, or died
    // A middle process forks the worker and exits: the worker is then an
    // orphan, which the kernel hands to the manager (a subreaper), before
    // the zygote's waitpid returns and so before the manager hears its pid.
    int pids[2];
    int32_t reply = -1;
    if (pipe2(pids, O_CLOEXEC) == 0) {
      const pid_t mid = fork();
      if (mid == 0) {
        close(pids[0]);
        const pid_t w = fork();
        if (w == 0) {
          close(pids[1]);
          close(fd);
          becomeWorker(manager, buf.data(), static_cast<size_t>(n));
        }
        const int32_t child = w;
        if (write(pids[1], &child, sizeof child) != static_cast<ssize_t>(sizeof child)) _exit(1);
        _exit(0);
      }
      close(pids[1]);
      if (mid > 0) {
        while (waitpid(mid, nullptr, 0) < 0 && errno == EINTR) {
        }
        ssize_t got;
        do got = read(pids[0], &reply, sizeof reply);
        while (got < 0 && errno == EINTR);
        if (got != static_cast<ssize_t>(sizeof reply)) reply = -1;
      }
      close(pids[0]);
    }
    send(fd, &reply, sizeof reply, MSG_NOSIGNAL);
  }
}

}  // namespace

void registerMain(int argc, char** argv, MainFunction main_fn) {
  g_main = main_fn;
  // The area /proc shows as the command line: usable only when the
  // arguments lie end to end, as the kernel lays them out.
  for (int i = 0; i + 1 < argc; ++i)
    if (argv[i] + std::strlen(argv[i]) + 1 != argv[i + 1]) return;
  if (argc > 0) {
    g_area = argv[0];
    g_area_len = static_cast<size_t>(argv[argc - 1] + std::strlen(argv[argc - 1]) + 1 - argv[0]);
  }
}

void WorkerZygote::start() {
  if (g_zygote != nullptr || g_main == nullptr || g_area == nullptr) return;
  const char* env = std::getenv("MORPH_ZYGOTE");
  if (env != nullptr && std::strcmp(env, "0") == 0) return;
  if (threadCount() != 1) return;  // fork keeps one thread: only safe before any other starts
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) return;
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    close(fds[0]);
    close(fds[1]);
    return;
  }
  std::fflush(nullptr);
  const pid_t manager = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != manager) _exit(0);
    zygoteLoop(fds[1], manager);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    prctl(PR_SET_CHILD_SUBREAPER, 0);
    return;
  }
  g_zygote = new WorkerZygote(pid, fds[0]);
}

WorkerZygote* WorkerZygote::get() { return g_zygote; }

pid_t WorkerZygote::spawn(const std::vector<std::string>& args) {
  if (fd_ < 0 || args.empty()) return -1;
  const size_t len = bytesOf(args);
  if (len > g_area_len || len > kMaxRequest) return -1;  // exec: the command line would not fit
  std::string request;
  for (const std::string& a : args) request.append(a.c_str(), a.size() + 1);
  ssize_t sent;
  do sent = send(fd_, request.data(), request.size(), MSG_NOSIGNAL);
  while (sent < 0 && errno == EINTR);
  int32_t reply = -1;
  ssize_t got = -1;
  if (sent == static_cast<ssize_t>(request.size())) {
    do got = recv(fd_, &reply, sizeof reply, 0);
    while (got < 0 && errno == EINTR);
  }
  if (got != static_cast<ssize_t>(sizeof reply)) {
    // The zygote died, or the exchange broke half way: never use it again
    // (a late answer would be taken for the next worker's pid).
    stop();
    return -1;
  }
  return reply;
}

void WorkerZygote::stop() {
  if (fd_ < 0) return;
  close(fd_);
  fd_ = -1;
  while (pid_ > 0 && waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

}  // namespace morph
