#include "store/protocol.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <system_error>

namespace morph {
namespace store {

void Writer::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void Writer::u64(uint64_t v) {
  for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void Writer::raw(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  buf_.insert(buf_.end(), b, b + n);
}
void Writer::bytes(const void* p, size_t n) {
  if (n > kMaxFrame) throw ProtocolError("value of " + std::to_string(n) + " bytes exceeds the frame limit");
  u32(static_cast<uint32_t>(n));
  raw(p, n);
}

uint8_t Reader::u8() {
  if (n_ - off_ < 1) throw ProtocolError("truncated message");
  return p_[off_++];
}
uint32_t Reader::u32() {
  if (n_ - off_ < 4) throw ProtocolError("truncated message");
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p_[off_ + static_cast<size_t>(i)]) << (8 * i);
  off_ += 4;
  return v;
}
uint64_t Reader::u64() {
  if (n_ - off_ < 8) throw ProtocolError("truncated message");
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p_[off_ + static_cast<size_t>(i)]) << (8 * i);
  off_ += 8;
  return v;
}
void Reader::raw(void* out, size_t n) {
  if (n_ - off_ < n) throw ProtocolError("truncated message");
  std::memcpy(out, p_ + off_, n);
  off_ += n;
}
std::vector<uint8_t> Reader::bytes(uint32_t max) {
  const uint32_t n = u32();
  if (n > max) throw ProtocolError("field of " + std::to_string(n) + " bytes exceeds its limit of " + std::to_string(max));
  if (n_ - off_ < n) throw ProtocolError("truncated message");
  std::vector<uint8_t> v(p_ + off_, p_ + off_ + n);
  off_ += n;
  return v;
}
std::string Reader::str(uint32_t max) {
  auto b = bytes(max);
  return std::string(b.begin(), b.end());
}
void Reader::expectDone() const {
  if (!done()) throw ProtocolError(std::to_string(n_ - off_) + " trailing bytes");
}

namespace {

Op checkedOp(uint8_t b) {
  if (b < static_cast<uint8_t>(Op::kSet) || b > static_cast<uint8_t>(Op::kNumKeys))
    throw ProtocolError("unknown operation " + std::to_string(b));
  return static_cast<Op>(b);
}

}  // namespace

std::vector<uint8_t> encodeRequest(const Request& r) {
  Writer w;
  w.u8(static_cast<uint8_t>(r.op));
  switch (r.op) {
    case Op::kSet:
      w.str(r.keys.at(0));
      w.bytes(r.value.data(), r.value.size());
      break;
    case Op::kGet:
      w.str(r.keys.at(0));
      w.u64(r.timeout_ms);
      break;
    case Op::kAdd:
      w.str(r.keys.at(0));
      w.u64(static_cast<uint64_t>(r.delta));
      break;
    case Op::kCompareSet:
      w.str(r.keys.at(0));
      w.bytes(r.value.data(), r.value.size());
      w.bytes(r.value2.data(), r.value2.size());
      break;
    case Op::kCheck:
    case Op::kWait:
      w.u32(static_cast<uint32_t>(r.keys.size()));
      for (const auto& k : r.keys) w.str(k);
      if (r.op == Op::kWait) w.u64(r.timeout_ms);
      break;
    case Op::kDelete:
      w.str(r.keys.at(0));
      break;
    case Op::kNumKeys:
      break;
  }
  return w.take();
}

Request decodeRequest(const uint8_t* p, size_t n) {
  Reader rd(p, n);
  Request r;
  r.op = checkedOp(rd.u8());
  switch (r.op) {
    case Op::kSet:
      r.keys.push_back(rd.str(kMaxKeyBytes));
      r.value = rd.bytes(kMaxFrame);
      break;
    case Op::kGet:
      r.keys.push_back(rd.str(kMaxKeyBytes));
      r.timeout_ms = rd.u64();
      break;
    case Op::kAdd:
      r.keys.push_back(rd.str(kMaxKeyBytes));
      r.delta = static_cast<int64_t>(rd.u64());
      break;
    case Op::kCompareSet:
      r.keys.push_back(rd.str(kMaxKeyBytes));
      r.value = rd.bytes(kMaxFrame);
      r.value2 = rd.bytes(kMaxFrame);
      break;
    case Op::kCheck:
    case Op::kWait: {
      const uint32_t count = rd.u32();
      if (count > kMaxKeysPerRequest) throw ProtocolError(std::to_string(count) + " keys in one request");
      for (uint32_t i = 0; i < count; ++i) r.keys.push_back(rd.str(kMaxKeyBytes));
      if (r.op == Op::kWait) r.timeout_ms = rd.u64();
      break;
    }
    case Op::kDelete:
      r.keys.push_back(rd.str(kMaxKeyBytes));
      break;
    case Op::kNumKeys:
      break;
  }
  rd.expectDone();
  return r;
}

std::vector<uint8_t> encodeReply(Op op, const Reply& r) {
  Writer w;
  w.u8(static_cast<uint8_t>(r.status));
  if (r.status != Status::kOk) {
    w.str(r.message);
    return w.take();
  }
  switch (op) {
    case Op::kGet:
    case Op::kCompareSet:
      w.bytes(r.value.data(), r.value.size());
      break;
    case Op::kAdd:
    case Op::kCheck:
    case Op::kDelete:
    case Op::kNumKeys:
      w.u64(static_cast<uint64_t>(r.number));
      break;
    case Op::kSet:
    case Op::kWait:
      break;
  }
  return w.take();
}

Reply decodeReply(Op op, const uint8_t* p, size_t n) {
  Reader rd(p, n);
  Reply r;
  const uint8_t s = rd.u8();
  if (s > static_cast<uint8_t>(Status::kRejected)) throw ProtocolError("unknown status " + std::to_string(s));
  r.status = static_cast<Status>(s);
  if (r.status != Status::kOk) {
    r.message = rd.str(kMaxHandshakeFrame);
  } else {
    switch (op) {
      case Op::kGet:
      case Op::kCompareSet:
        r.value = rd.bytes(kMaxFrame);
        break;
      case Op::kAdd:
      case Op::kCheck:
      case Op::kDelete:
      case Op::kNumKeys:
        r.number = static_cast<int64_t>(rd.u64());
        break;
      case Op::kSet:
      case Op::kWait:
        break;
    }
  }
  rd.expectDone();
  return r;
}

std::vector<uint8_t> encodeHello(const Hello& h) {
  Writer w;
  w.raw(kMagic, sizeof kMagic);
  w.raw(h.nonce.data(), h.nonce.size());
  return w.take();
}
Hello decodeHello(const uint8_t* p, size_t n) {
  Reader rd(p, n);
  char magic[sizeof kMagic];
  rd.raw(magic, sizeof magic);
  if (std::memcmp(magic, kMagic, sizeof kMagic) != 0)
    throw ProtocolError("not a Morph store (bad magic); is HOST:PORT a `morph run` manager of this version?");
  Hello h;
  rd.raw(h.nonce.data(), h.nonce.size());
  rd.expectDone();
  return h;
}

std::vector<uint8_t> encodeAuth(const Auth& a) {
  Writer w;
  w.str(a.role);
  w.raw(a.nonce.data(), a.nonce.size());
  w.raw(a.mac.data(), a.mac.size());
  return w.take();
}
Auth decodeAuth(const uint8_t* p, size_t n) {
  Reader rd(p, n);
  Auth a;
  a.role = rd.str(64);
  rd.raw(a.nonce.data(), a.nonce.size());
  rd.raw(a.mac.data(), a.mac.size());
  rd.expectDone();
  return a;
}

std::vector<uint8_t> encodeVerdict(const Verdict& v) {
  Writer w;
  w.u8(static_cast<uint8_t>(v.status));
  w.str(v.message);
  w.raw(v.mac.data(), v.mac.size());
  return w.take();
}
Verdict decodeVerdict(const uint8_t* p, size_t n) {
  Reader rd(p, n);
  Verdict v;
  const uint8_t s = rd.u8();
  if (s != static_cast<uint8_t>(Status::kOk) && s != static_cast<uint8_t>(Status::kRejected))
    throw ProtocolError("unknown handshake status " + std::to_string(s));
  v.status = static_cast<Status>(s);
  v.message = rd.str(512);
  rd.raw(v.mac.data(), v.mac.size());
  rd.expectDone();
  return v;
}

namespace {

std::array<uint8_t, kMacBytes> proof(const std::string& key, const char* label,
                                     const std::array<uint8_t, kNonceBytes>& nonce, const std::string& role) {
  std::vector<uint8_t> msg(label, label + std::strlen(label));
  msg.insert(msg.end(), nonce.begin(), nonce.end());
  msg.insert(msg.end(), role.begin(), role.end());
  std::array<uint8_t, kMacBytes> out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), msg.data(), msg.size(), out.data(), &len) ||
      len != kMacBytes)
    throw std::runtime_error("HMAC-SHA-256 failed (OpenSSL)");
  return out;
}

}  // namespace

std::array<uint8_t, kMacBytes> clientProof(const std::string& key, const std::array<uint8_t, kNonceBytes>& nonce,
                                           const std::string& role) {
  return proof(key, "morph-store-v1 client", nonce, role);
}
std::array<uint8_t, kMacBytes> serverProof(const std::string& key, const std::array<uint8_t, kNonceBytes>& nonce,
                                           const std::string& role) {
  return proof(key, "morph-store-v1 server", nonce, role);
}
std::string workerKey(const std::string& token, const std::array<uint8_t, kNonceBytes>& registering_nonce) {
  const auto k = proof(token, "morph-store-v1 worker", registering_nonce, "");
  return std::string(k.begin(), k.end());
}
bool macEqual(const std::array<uint8_t, kMacBytes>& a, const std::array<uint8_t, kMacBytes>& b) {
  return CRYPTO_memcmp(a.data(), b.data(), kMacBytes) == 0;
}

std::array<uint8_t, kNonceBytes> randomNonce() {
  std::array<uint8_t, kNonceBytes> n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) throw std::runtime_error("no random bytes (OpenSSL RAND_bytes)");
  return n;
}

std::string randomToken() {
  const auto b = randomNonce();
  static const char* hex = "0123456789abcdef";
  std::string t;
  for (uint8_t c : b) {
    t += hex[c >> 4];
    t += hex[c & 15];
  }
  return t;
}

namespace {

// Waits until fd is readable or the deadline passes (deadline 0: forever).
void awaitReadable(int fd, std::chrono::steady_clock::time_point deadline, bool bounded) {
  if (!bounded) return;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) throw ProtocolError("timed out waiting for a message");
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (r > 0) return;
    if (r < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
  }
}

// Reads exactly n bytes; returns the count read before an orderly close.
size_t readFull(int fd, uint8_t* p, size_t n, std::chrono::steady_clock::time_point deadline, bool bounded) {
  size_t got = 0;
  while (got < n) {
    awaitReadable(fd, deadline, bounded);
    const ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r == 0) return got;
    if (r < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "recv");
    }
    got += static_cast<size_t>(r);
  }
  return got;
}

}  // namespace

bool readFrame(int fd, uint32_t max, std::vector<uint8_t>& out, int64_t timeout_ms) {
  const bool bounded = timeout_ms > 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  uint8_t h[4];
  const size_t got = readFull(fd, h, 4, deadline, bounded);
  if (got == 0) return false;
  if (got < 4) throw ProtocolError("connection closed inside a frame header");
  const uint32_t len = static_cast<uint32_t>(h[0]) | static_cast<uint32_t>(h[1]) << 8 |
                       static_cast<uint32_t>(h[2]) << 16 | static_cast<uint32_t>(h[3]) << 24;
  if (len > max)
    throw ProtocolError("frame of " + std::to_string(len) + " bytes exceeds the limit of " + std::to_string(max));
  out.resize(len);
  if (readFull(fd, out.data(), len, deadline, bounded) != len) throw ProtocolError("connection closed inside a frame");
  return true;
}

void writeFrame(int fd, const std::vector<uint8_t>& payload) {
  if (payload.size() > kMaxFrame) throw ProtocolError("frame of " + std::to_string(payload.size()) + " bytes exceeds the limit");
  const uint32_t len = static_cast<uint32_t>(payload.size());
  std::vector<uint8_t> buf = {static_cast<uint8_t>(len), static_cast<uint8_t>(len >> 8), static_cast<uint8_t>(len >> 16),
                              static_cast<uint8_t>(len >> 24)};
  buf.insert(buf.end(), payload.begin(), payload.end());
  size_t off = 0;
  while (off < buf.size()) {
    const ssize_t r = ::send(fd, buf.data() + off, buf.size() - off, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "send");
    }
    off += static_cast<size_t>(r);
  }
}

}  // namespace store
}  // namespace morph
