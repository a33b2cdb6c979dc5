#include "control/store_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <list>
#include <mutex>
#include <map>
#include <thread>
#include <unordered_map>

namespace morph {
namespace store {

namespace {

// An unauthenticated peer gets this long to complete the handshake, and at
// most this many may be handshaking at once (the rest are closed at once).
constexpr int64_t kHandshakeTimeoutMs = 5000;
constexpr int kMaxPendingHandshakes = 256;

bool isDigits(const std::string& s) {
  return !s.empty() && s.size() <= 18 && s.find_first_not_of("0123456789") == std::string::npos;
}

// "a/b/c" -> {"a", "b", "c"}
std::vector<std::string> splitKey(const std::string& k) {
  std::vector<std::string> parts;
  size_t a = 0;
  while (true) {
    const size_t b = k.find('/', a);
    parts.push_back(k.substr(a, b == std::string::npos ? std::string::npos : b - a));
    if (b == std::string::npos) return parts;
    a = b + 1;
  }
}

std::string describe(const Role& r) {
  switch (r.kind) {
    case Role::kManager: return "manager";
    case Role::kClient: return "client";
    case Role::kWorker: return r.worker < 0 ? "worker (unregistered)" : "worker " + std::to_string(r.worker);
  }
  return "?";
}

// A burst of kLogBurst lines, then at most kLogPerSecond a second reach
// stderr however hard a peer tries; the rest are counted into the next line.
constexpr double kLogBurst = 20.0, kLogPerSecond = 5.0;
// Out of file descriptors or memory: accept() is retried after this long.
constexpr auto kAcceptRetry = std::chrono::milliseconds(10);

class RateLimitedLog {
 public:
  void line(const std::string& s) {
    std::lock_guard<std::mutex> l(mu_);
    const auto now = std::chrono::steady_clock::now();
    credit_ = std::min(kLogBurst, credit_ + kLogPerSecond * std::chrono::duration<double>(now - last_).count());
    last_ = now;
    if (credit_ < 1.0) {
      ++suppressed_;
      return;
    }
    credit_ -= 1.0;
    if (suppressed_ > 0)
      std::fprintf(stderr, "morph: store: %s (and %lld similar messages)\n", s.c_str(), static_cast<long long>(suppressed_));
    else
      std::fprintf(stderr, "morph: store: %s\n", s.c_str());
    suppressed_ = 0;
  }

 private:
  std::mutex mu_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  double credit_ = kLogBurst;
  int64_t suppressed_ = 0;
};

}  // namespace

std::string jobPolicyRefusal(const Role& role, Op op, const std::string& key, int64_t delta) {
  if (role.kind == Role::kManager) return "";
  if (role.kind == Role::kClient) {
    if ((key == "ctl/resize_target" && op == Op::kSet) || (key == "ctl/resize_seq" && op == Op::kAdd)) return "";
    const auto p = splitKey(key);  // morph slow
    if (p.size() == 3 && p[0] == "ctl" && p[1] == "slow" && isDigits(p[2]) && op == Op::kSet) return "";
    return "a client may write only ctl/resize_target, ctl/resize_seq and ctl/slow/<id>";
  }
  if (role.worker < 0) {
    if (key == "workers/next_id" && op == Op::kAdd && delta == 1) return "";
    return "a worker must register (add 1 to workers/next_id) before it writes";
  }
  const std::string me = std::to_string(role.worker);
  const auto p = splitKey(key);
  if (p.size() >= 3 && p[0] == "workers" && p[1] == me) return "";
  if ((p.size() == 2 && (p[0] == "result" || p[0] == "trace") && p[1] == me)) return "";
  if (p.size() == 2 && p[0] == "metrics" && isDigits(p[1]) && op == Op::kSet) return "";
  if (key == "events" && op == Op::kAdd) return "";
  // The job's first and last step: whichever worker gets there first
  // creates them (compareSet from empty; a later one changes nothing), so a
  // job whose worker 0 died still starts. Worker 0 may also set them.
  if ((key == "job/steps" || key == "job/start_step") &&
      (op == Op::kCompareSet || (role.worker == 0 && op == Op::kSet)))
    return "";
  if (p.size() >= 3 && p[0] == "gen" && isDigits(p[1])) {
    // Its own reports of a generation, and Gloo's rendezvous of its groups.
    if (p.size() == 4 && (p[2] == "ready" || p[2] == "left" || p[2] == "line" || p[2] == "held" || p[2] == "morph") &&
        p[3] == me)
      return "";
    if (p.size() >= 4 && (p[2] == "pg" || p[2] == "stage" || p[2] == "tied" || p[2] == "pipe")) return "";
  }
  return "worker " + me + " may not write this key (only its own keys: docs/store_protocol.md)";
}

struct StoreServer::Impl {
  ServerOptions o;
  int listen_fd = -1;
  int port = 0;
  std::thread acceptor;
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> refused{0}, denied{0};
  std::atomic<int> pending{0};
  RateLimitedLog log;

  // The keys.
  std::mutex mu;
  std::condition_variable changed;
  std::condition_variable wrote;  // writes changed (waitForWrite)
  int64_t writes = 0;
  std::unordered_map<std::string, std::vector<uint8_t>> kv;
  // Per registered worker id: the key its further connections prove
  // (workerKey of the registering connection's nonce).
  std::map<int64_t, std::string> worker_keys;

  struct Conn {
    int fd = -1;
    std::string peer;
    std::array<uint8_t, kNonceBytes> client_nonce{};  // from its handshake
    std::thread thread;
    std::atomic<bool> done{false};
  };
  std::mutex conns_mu;
  std::list<std::unique_ptr<Conn>> conns;

  void note(const std::string& s) {
    if (o.log) log.line(s);
  }

  void acceptLoop() {
    while (!stopping) {
      sockaddr_in addr{};
      socklen_t len = sizeof addr;
      const int fd = ::accept(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
      if (fd < 0) {
        if (stopping) return;
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          note(std::string("accept: ") + std::strerror(errno));
          std::this_thread::sleep_for(kAcceptRetry);
          continue;
        }
        return;  // the listening socket was shut down
      }
      char ip[INET_ADDRSTRLEN] = "?";
      inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof ip);
      const std::string peer = std::string(ip) + ":" + std::to_string(ntohs(addr.sin_port));
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      std::lock_guard<std::mutex> l(conns_mu);
      for (auto it = conns.begin(); it != conns.end();) {  // reap finished connections
        if ((*it)->done) {
          (*it)->thread.join();
          ::close((*it)->fd);
          it = conns.erase(it);
        } else {
          ++it;
        }
      }
      if (pending >= kMaxPendingHandshakes) {
        ++refused;
        note("closing " + peer + ": too many connections are handshaking at once");
        ::close(fd);
        continue;
      }
      ++pending;
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->peer = peer;
      Conn* raw = c.get();
      conns.push_back(std::move(c));
      raw->thread = std::thread([this, raw] {
        serve(*raw);
        ::shutdown(raw->fd, SHUT_RDWR);  // the peer sees the end now; the fd is closed when reaped
        raw->done = true;
      });
    }
  }

  // The handshake: true with `role` set, or false (the connection is to be closed).
  bool handshake(Conn& c, Role& role) {
    Hello hello;
    hello.nonce = randomNonce();
    writeFrame(c.fd, encodeHello(hello));
    std::vector<uint8_t> buf;
    if (!readFrame(c.fd, kMaxHandshakeFrame, buf, kHandshakeTimeoutMs)) {
      ++refused;
      note("connection from " + c.peer + " closed before authenticating");
      return false;
    }
    const Auth auth = decodeAuth(buf.data(), buf.size());
    std::string key = o.token;
    bool known = true;
    if (auth.role == "manager") {
      role.kind = Role::kManager;
      key = o.manager_key;
      known = !key.empty();
    } else if (auth.role == "client") {
      role.kind = Role::kClient;
    } else if (auth.role == "worker") {
      role.kind = Role::kWorker;
    } else if (auth.role.rfind("worker/", 0) == 0 && isDigits(auth.role.substr(7))) {
      role.kind = Role::kWorker;
      role.worker = std::stoll(auth.role.substr(7));
      std::lock_guard<std::mutex> l(mu);
      auto it = worker_keys.find(role.worker);
      known = it != worker_keys.end();
      if (known) key = it->second;
    } else {
      known = false;
    }
    if (!known || !macEqual(auth.mac, clientProof(key, hello.nonce, auth.role))) {
      ++refused;
      note("refused " + c.peer + " (role '" + auth.role + "'): " +
           (known ? "wrong token proof" : "unknown role or unregistered worker id"));
      Verdict v;
      v.status = Status::kRejected;
      v.message = known ? "wrong token for this job" : "unknown role or unregistered worker id";
      writeFrame(c.fd, encodeVerdict(v));
      return false;
    }
    c.client_nonce = auth.nonce;
    Verdict v;
    v.mac = serverProof(key, auth.nonce, auth.role);
    writeFrame(c.fd, encodeVerdict(v));
    return true;
  }

  void serve(Conn& c) {
    Role role;
    bool authenticated = false;
    try {
      authenticated = handshake(c, role);
    } catch (const std::exception& e) {
      authenticated = false;
      ++refused;
      note("closing " + c.peer + " during the handshake: " + e.what());
    }
    --pending;
    if (!authenticated) return;
    std::vector<uint8_t> buf;
    while (!stopping) {
      try {
        if (!readFrame(c.fd, kMaxFrame, buf)) return;
      } catch (const std::exception& e) {
        ++refused;
        note("closing " + c.peer + " (" + describe(role) + "): " + e.what());
        return;
      }
      Request req;
      try {
        req = decodeRequest(buf.data(), buf.size());
      } catch (const ProtocolError& e) {
        ++refused;
        note("closing " + c.peer + " (" + describe(role) + "): malformed request: " + e.what());
        return;
      }
      Reply rep = apply(role, req, c);
      try {
        writeFrame(c.fd, encodeReply(req.op, rep));
      } catch (const std::exception&) {
        return;  // the peer went away
      }
    }
  }

  // "workers/<id>/hb": read by the manager on its own clock, so it wakes nobody.
  static bool isHeartbeat(const std::string& key) {
    return key.size() > 3 && key.compare(key.size() - 3, 3, "/hb") == 0 && key.rfind("workers/", 0) == 0;
  }

  static bool isWrite(Op op) {
    return op == Op::kSet || op == Op::kAdd || op == Op::kCompareSet || op == Op::kDelete;
  }

  Reply apply(Role& role, const Request& req, const Conn& c) {
    Reply rep;
    if (isWrite(req.op) && o.policy == KeyPolicy::kJob) {
      const std::string why = jobPolicyRefusal(role, req.op, req.keys.at(0), req.delta);
      if (!why.empty()) {
        ++denied;
        note("refused a write of '" + req.keys.at(0) + "' by " + c.peer + ": " + why);
        rep.status = Status::kDenied;
        rep.message = "write of '" + req.keys.at(0) + "' refused: " + why;
        return rep;
      }
    }
    std::unique_lock<std::mutex> l(mu);
    // add(key, 0) reads a counter (the manager's polls): not a write here.
    if (isWrite(req.op) && !(req.op == Op::kAdd && req.delta == 0) && !isHeartbeat(req.keys.at(0))) {
      // Woken after this write applies: the waiter needs `mu` too.
      ++writes;
      wrote.notify_all();
    }
    auto waitFor = [&](const std::vector<std::string>& keys, uint64_t timeout_ms) {
      auto all = [&] {
        if (stopping) return true;
        for (const auto& k : keys)
          if (!kv.count(k)) return false;
        return true;
      };
      // timeout 0 = wait as long as it takes (c10d's kNoTimeout)
      if (timeout_ms == 0) {
        changed.wait(l, all);
      } else {
        changed.wait_for(l, std::chrono::milliseconds(std::min<uint64_t>(timeout_ms, uint64_t{1} << 40)), all);
      }
      for (const auto& k : keys)
        if (!kv.count(k)) return false;
      return true;
    };
    switch (req.op) {
      case Op::kSet:
        kv[req.keys[0]] = req.value;
        changed.notify_all();
        break;
      case Op::kGet:
        if (!waitFor(req.keys, req.timeout_ms)) {
          rep.status = Status::kTimeout;
          rep.message = "key '" + req.keys[0] + "' did not appear in time";
        } else {
          rep.value = kv[req.keys[0]];
        }
        break;
      case Op::kAdd: {
        int64_t v = 0;
        auto it = kv.find(req.keys[0]);
        if (it != kv.end()) {
          const std::string s(it->second.begin(), it->second.end());
          char* end = nullptr;
          errno = 0;
          v = std::strtoll(s.c_str(), &end, 10);
          if (s.empty() || errno != 0 || *end != '\0') {
            rep.status = Status::kBad;
            rep.message = "add to '" + req.keys[0] + "', which does not hold a number";
            return rep;
          }
        }
        v = static_cast<int64_t>(static_cast<uint64_t>(v) + static_cast<uint64_t>(req.delta));
        const std::string s = std::to_string(v);
        kv[req.keys[0]] = std::vector<uint8_t>(s.begin(), s.end());
        rep.number = v;
        if (role.kind == Role::kWorker && role.worker < 0 && req.keys[0] == "workers/next_id") {
          role.worker = v - 1;  // this connection is that worker from now on
          worker_keys[role.worker] = workerKey(o.token, c.client_nonce);
        }
        changed.notify_all();
        break;
      }
      case Op::kCompareSet: {
        // c10d's semantics: a missing key is created when `expected` is
        // empty; the reply is the value the key holds afterwards (or the
        // expected value, for a missing key that was not created).
        auto it = kv.find(req.keys[0]);
        if (it == kv.end()) {
          if (req.value.empty()) {
            kv[req.keys[0]] = req.value2;
            rep.value = req.value2;
            changed.notify_all();
          } else {
            rep.value = req.value;
          }
        } else if (it->second == req.value) {
          it->second = req.value2;
          rep.value = req.value2;
          changed.notify_all();
        } else {
          rep.value = it->second;
        }
        break;
      }
      case Op::kCheck: {
        rep.number = 1;
        for (const auto& k : req.keys)
          if (!kv.count(k)) rep.number = 0;
        break;
      }
      case Op::kWait:
        if (!waitFor(req.keys, req.timeout_ms)) {
          rep.status = Status::kTimeout;
          rep.message = "keys did not appear in time";
        }
        break;
      case Op::kDelete:
        rep.number = kv.erase(req.keys[0]) ? 1 : 0;
        break;
      case Op::kNumKeys:
        rep.number = static_cast<int64_t>(kv.size());
        break;
    }
    if (stopping) {
      rep.status = Status::kBad;
      rep.message = "the store is shutting down";
    }
    return rep;
  }
};

StoreServer::StoreServer(ServerOptions o) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.o = std::move(o);
  if (s.o.token.empty()) throw std::runtime_error("the store needs a job token");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(s.o.port));
  if (inet_pton(AF_INET, s.o.bind_addr.c_str(), &addr.sin_addr) != 1)
    throw std::runtime_error("'" + s.o.bind_addr + "' is not an IPv4 address to listen on");
  s.listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s.listen_fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  setsockopt(s.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(s.listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(s.listen_fd, 512) != 0) {
    const std::string err = std::strerror(errno);
    ::close(s.listen_fd);
    throw std::runtime_error("cannot listen on " + s.o.bind_addr + ":" + std::to_string(s.o.port) + ": " + err);
  }
  socklen_t len = sizeof addr;
  getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  s.port = ntohs(addr.sin_port);
  s.acceptor = std::thread([&s] { s.acceptLoop(); });
}

StoreServer::~StoreServer() {
  Impl& s = *impl_;
  s.stopping = true;
  ::shutdown(s.listen_fd, SHUT_RDWR);
  s.acceptor.join();
  ::close(s.listen_fd);
  {
    std::lock_guard<std::mutex> l(s.mu);
    s.changed.notify_all();
  }
  std::lock_guard<std::mutex> l(s.conns_mu);
  for (auto& c : s.conns) ::shutdown(c->fd, SHUT_RDWR);
  for (auto& c : s.conns) {
    c->thread.join();
    ::close(c->fd);
  }
}

int StoreServer::port() const { return impl_->port; }
int64_t StoreServer::writes() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->writes;
}
Reply StoreServer::localCall(const Request& r) {
  Impl::Conn c;
  c.peer = "the manager (in process)";
  Role role;
  role.kind = Role::kManager;
  return impl_->apply(role, r, c);
}

int64_t StoreServer::erase(const std::string& key) {
  std::lock_guard<std::mutex> l(impl_->mu);
  return static_cast<int64_t>(impl_->kv.erase(key));
}

int64_t StoreServer::erasePrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> l(impl_->mu);
  int64_t n = 0;
  for (auto it = impl_->kv.begin(); it != impl_->kv.end();) {
    if (it->first.compare(0, prefix.size(), prefix) == 0) {
      it = impl_->kv.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

int64_t StoreServer::waitForWrite(int64_t seen, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(impl_->mu);
  impl_->wrote.wait_for(l, timeout, [&] { return impl_->writes != seen || impl_->stopping; });
  return impl_->writes;
}
int64_t StoreServer::refusedConnections() const { return impl_->refused; }
int64_t StoreServer::deniedWrites() const { return impl_->denied; }

}  // namespace store
}  // namespace morph
