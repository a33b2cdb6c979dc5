// The wire format of Morph's control-plane store (docs/store_protocol.md):
// length-prefixed frames, the challenge-response handshake, requests and
// replies. Plain C++ with no libtorch, so the decoder can be fuzzed alone.
// Every decoder here takes untrusted bytes: it never reads past the buffer,
// never allocates more than the frame it was given, and throws
// ProtocolError for anything malformed.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace morph {
namespace store {

class ProtocolError : public std::runtime_error {
 public:
  explicit ProtocolError(const std::string& what) : std::runtime_error(what) {}
};

constexpr char kMagic[8] = {'M', 'O', 'R', 'P', 'H', 'S', 'T', '1'};
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;  // HMAC-SHA-256
// Frame payload limits (bytes): before authentication a frame is a
// handshake and tiny; after it, values (the job text, a pipeline trace)
// may be large but never unbounded.
constexpr uint32_t kMaxHandshakeFrame = 1024;
constexpr uint32_t kMaxFrame = 64u << 20;
constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint32_t kMaxKeysPerRequest = 1024;

enum class Op : uint8_t {
  kSet = 1,
  kGet = 2,        // waits for the key up to timeout_ms
  kAdd = 3,
  kCompareSet = 4,
  kCheck = 5,
  kWait = 6,       // waits for every key up to timeout_ms
  kDelete = 7,
  kNumKeys = 8,
};

enum class Status : uint8_t {
  kOk = 0,
  kTimeout = 1,    // get/wait: the key(s) did not appear in time
  kDenied = 2,     // the connection's role may not write this key
  kBad = 3,        // a well-formed request the store cannot serve (add to a non-number)
  kRejected = 4,   // handshake: the token proof did not verify
};

struct Request {
  Op op = Op::kGet;
  std::vector<std::string> keys;     // one key, except check/wait
  std::vector<uint8_t> value;        // set: value; compareSet: expected
  std::vector<uint8_t> value2;       // compareSet: desired
  int64_t delta = 0;                 // add
  uint64_t timeout_ms = 0;           // get, wait
};

struct Reply {
  Status status = Status::kOk;
  std::vector<uint8_t> value;  // get, compareSet
  int64_t number = 0;          // add, check (0/1), delete (0/1), numKeys
  std::string message;         // when status != kOk
};

// Little-endian field encoder.
class Writer {
 public:
  void u8(uint8_t v) { buf_.push_back(v); }
  void u32(uint32_t v);
  void u64(uint64_t v);
  void bytes(const void* p, size_t n);  // u32 length + bytes
  void raw(const void* p, size_t n);    // bytes only
  void str(const std::string& s) { bytes(s.data(), s.size()); }
  const std::vector<uint8_t>& data() const { return buf_; }
  std::vector<uint8_t> take() { return std::move(buf_); }

 private:
  std::vector<uint8_t> buf_;
};

// Bounds-checked decoder over one frame's payload.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  uint8_t u8();
  uint32_t u32();
  uint64_t u64();
  std::vector<uint8_t> bytes(uint32_t max);
  std::string str(uint32_t max);
  void raw(void* out, size_t n);
  bool done() const { return off_ == n_; }
  void expectDone() const;

 private:
  const uint8_t* p_;
  size_t n_, off_ = 0;
};

std::vector<uint8_t> encodeRequest(const Request& r);
Request decodeRequest(const uint8_t* p, size_t n);
std::vector<uint8_t> encodeReply(Op op, const Reply& r);
Reply decodeReply(Op op, const uint8_t* p, size_t n);

// Handshake frames. Server -> client: hello (magic, server nonce).
// Client -> server: auth (role, client nonce, mac over the server nonce).
// Server -> client: verdict (status, message, mac over the client nonce).
struct Hello {
  std::array<uint8_t, kNonceBytes> nonce{};
};
struct Auth {
  std::string role;
  std::array<uint8_t, kNonceBytes> nonce{};
  std::array<uint8_t, kMacBytes> mac{};
};
struct Verdict {
  Status status = Status::kOk;
  std::string message;
  std::array<uint8_t, kMacBytes> mac{};  // the server's proof (kOk only)
};
std::vector<uint8_t> encodeHello(const Hello& h);
Hello decodeHello(const uint8_t* p, size_t n);
std::vector<uint8_t> encodeAuth(const Auth& a);
Auth decodeAuth(const uint8_t* p, size_t n);
std::vector<uint8_t> encodeVerdict(const Verdict& v);
Verdict decodeVerdict(const uint8_t* p, size_t n);

// The proofs. Client: HMAC-SHA-256(key, "morph-store-v1 client" || server
// nonce || role); server: HMAC-SHA-256(key, "morph-store-v1 server" ||
// client nonce || role). The key is the token's bytes.
std::array<uint8_t, kMacBytes> clientProof(const std::string& key, const std::array<uint8_t, kNonceBytes>& nonce,
                                           const std::string& role);
std::array<uint8_t, kMacBytes> serverProof(const std::string& key, const std::array<uint8_t, kNonceBytes>& nonce,
                                           const std::string& role);
// The key a registered worker's further connections prove (role
// "worker/<id>"): HMAC-SHA-256(token, "morph-store-v1 worker" || the client
// nonce of the connection that registered it), 32 raw bytes. Only the
// registering process (and whoever saw that handshake) can make it, so a
// worker cannot claim another's id.
std::string workerKey(const std::string& token, const std::array<uint8_t, kNonceBytes>& registering_nonce);
bool macEqual(const std::array<uint8_t, kMacBytes>& a, const std::array<uint8_t, kMacBytes>& b);  // constant time
std::array<uint8_t, kNonceBytes> randomNonce();
// A fresh job token: 32 random bytes as 64 hex digits.
std::string randomToken();

// Blocking frame I/O on a socket. readFrame returns false on an orderly
// close before the first byte; throws ProtocolError on a short or oversized
// frame, std::system_error on socket errors. `timeout_ms` > 0 bounds the
// wait for the whole frame (ProtocolError when it passes); 0 waits as long
// as it takes.
bool readFrame(int fd, uint32_t max, std::vector<uint8_t>& out, int64_t timeout_ms = 0);
void writeFrame(int fd, const std::vector<uint8_t>& payload);

}  // namespace store
}  // namespace morph
