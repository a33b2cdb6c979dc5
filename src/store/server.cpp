#include "store/server.h"

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

struct StoreServer::Impl {
  ServerOptions o;
  int listen_fd = -1;
  int port = 0;
  std::thread acceptor;
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> refused{0}, denied{0};
  std::atomic<int> pending{0};
  RateLimitedLog log;

  // The keys, and the registered workers: per id, the key its further
  // connections prove (workerKey of the registering connection's nonce).
  std::unique_ptr<Table> table;
  std::mutex mu;
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

  static bool isWrite(Op op) {
    return op == Op::kSet || op == Op::kAdd || op == Op::kCompareSet || op == Op::kDelete;
  }

  Reply apply(Role& role, const Request& req, const Conn& c) {
    if (isWrite(req.op) && role.kind != Role::kManager) {
      const std::string why = o.policy->refusal(role, req.op, req.keys.at(0), req.delta);
      if (!why.empty()) {
        ++denied;
        note("refused a write of '" + req.keys.at(0) + "' by " + c.peer + ": " + why);
        Reply rep;
        rep.status = Status::kDenied;
        rep.message = "write of '" + req.keys.at(0) + "' refused: " + why;
        return rep;
      }
    }
    Reply rep = table->apply(req);
    if (rep.status == Status::kOk && req.op == Op::kAdd && role.kind == Role::kWorker && role.worker < 0 &&
        req.keys[0] == o.policy->registrationKey()) {
      role.worker = rep.number - 1;  // this connection is that worker from now on
      std::lock_guard<std::mutex> l(mu);
      worker_keys[role.worker] = workerKey(o.token, c.client_nonce);
    }
    return rep;
  }
};

StoreServer::StoreServer(ServerOptions o) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.o = std::move(o);
  if (s.o.token.empty()) throw std::runtime_error("the store needs a job token");
  if (!s.o.policy) s.o.policy = std::make_shared<OpenPolicy>();
  s.table = std::make_unique<Table>([policy = s.o.policy](const std::string& key) { return policy->wakes(key); });
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
  s.table->stop();
  std::lock_guard<std::mutex> l(s.conns_mu);
  for (auto& c : s.conns) ::shutdown(c->fd, SHUT_RDWR);
  for (auto& c : s.conns) {
    c->thread.join();
    ::close(c->fd);
  }
}

int StoreServer::port() const { return impl_->port; }
Table& StoreServer::table() { return *impl_->table; }
int64_t StoreServer::refusedConnections() const { return impl_->refused; }
int64_t StoreServer::deniedWrites() const { return impl_->denied; }

}  // namespace store
}  // namespace morph
