#include "control/worker/reachability.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/error.h"

namespace morph {

namespace {

bool parseAddress(const std::string& a, sockaddr_in& out) {
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= a.size()) return false;
  const std::string host = a.substr(0, colon), port = a.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return false;
  const int p = std::stoi(port);
  if (p < 1 || p > 65535) return false;
  out = sockaddr_in{};
  out.sin_family = AF_INET;
  out.sin_port = htons(static_cast<uint16_t>(p));
  return inet_pton(AF_INET, host.c_str(), &out.sin_addr) == 1;
}

}  // namespace

ProbeListener::ProbeListener(const std::string& addr) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1)
    throw InputError("cannot listen for reachability probes on '" + addr + "': not an IPv4 address");
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t len = sizeof sa;
  if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd_, 64) != 0 ||
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    const std::string why = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    throw InputError("cannot listen for reachability probes on " + addr + ": " + why);
  }
  address_ = addr + ":" + std::to_string(ntohs(sa.sin_port));
  thread_ = std::thread([this] {
    while (!stop_.load()) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) ::close(c);
    }
  });
}

ProbeListener::~ProbeListener() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
}

std::vector<size_t> unreachable(const std::vector<std::string>& addresses, bool refused_counts, double timeout_s) {
  const size_t n = addresses.size();
  std::vector<int> fds(n, -1);
  std::vector<bool> done(n, false), ok(n, false);
  for (size_t i = 0; i < n; ++i) {
    sockaddr_in sa{};
    if (!parseAddress(addresses[i], sa)) {
      done[i] = true;
      continue;
    }
    fds[i] = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fds[i] < 0) {
      done[i] = true;
      continue;
    }
    if (::connect(fds[i], reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
      done[i] = ok[i] = true;
    } else if (errno != EINPROGRESS) {
      done[i] = true;
      ok[i] = !refused_counts && errno == ECONNREFUSED;  // the host answered
    }
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    std::vector<pollfd> p;
    std::vector<size_t> which;
    for (size_t i = 0; i < n; ++i)
      if (!done[i]) {
        p.push_back({fds[i], POLLOUT, 0});
        which.push_back(i);
      }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (p.empty() || left.count() <= 0) break;
    if (::poll(p.data(), p.size(), static_cast<int>(left.count())) < 0 && errno != EINTR) break;
    for (size_t k = 0; k < p.size(); ++k) {
      if (!p[k].revents) continue;
      const size_t i = which[k];
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &err, &len);
      done[i] = true;
      ok[i] = err == 0 || (!refused_counts && err == ECONNREFUSED);
    }
  }
  std::vector<size_t> out;
  for (size_t i = 0; i < n; ++i) {
    if (fds[i] >= 0) ::close(fds[i]);
    if (!ok[i]) out.push_back(i);
  }
  return out;
}

}  // namespace morph
