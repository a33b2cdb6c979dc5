// The control-plane store in one process: a StoreServer on loopback and
// StoreClients (and raw sockets speaking the protocol badly) on threads.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <system_error>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "comm/communicator.h"
#include "store/client.h"
#include "store/server.h"

namespace {

using namespace morph;
using namespace morph::store;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.token = "job-token-for-tests";
    o.manager_key = "manager-key-for-tests";
    o.log = false;
    server_ = std::make_unique<StoreServer>(o);
  }
  c10::intrusive_ptr<StoreClient> client(const std::string& role, const std::string& key = "job-token-for-tests") {
    return c10::make_intrusive<StoreClient>("127.0.0.1", server_->port(), key, role, std::chrono::seconds(5));
  }
  c10::intrusive_ptr<StoreClient> manager() { return client("manager", "manager-key-for-tests"); }
  // A raw TCP connection to the server.
  int dial() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(server_->port()));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    return fd;
  }
  // True when the server closes `fd` (end of file or reset) within 5 s.
  static bool closedByServer(int fd) {
    std::vector<uint8_t> buf;
    try {
      while (readFrame(fd, kMaxFrame, buf, 5000)) {
      }
      return true;
    } catch (const std::system_error&) {
      return true;
    } catch (const ProtocolError& e) {
      return std::string(e.what()).find("timed out") == std::string::npos;
    }
  }
  std::unique_ptr<StoreServer> server_;
};

TEST_F(StoreTest, OperationsBehaveLikeC10dStores) {
  auto m = manager();
  m->set("a", bytes("1"));
  EXPECT_EQ(text(m->get("a")), "1");
  EXPECT_EQ(m->add("n", 5), 5);
  EXPECT_EQ(m->add("n", -2), 3);
  EXPECT_EQ(text(m->get("n")), "3");
  EXPECT_TRUE(m->check({"a", "n"}));
  EXPECT_FALSE(m->check({"a", "missing"}));
  EXPECT_EQ(text(m->compareSet("c", {}, bytes("x"))), "x");        // created
  EXPECT_EQ(text(m->compareSet("c", bytes("y"), bytes("z"))), "x");  // mismatch: current
  EXPECT_EQ(text(m->compareSet("c", bytes("x"), bytes("z"))), "z");
  EXPECT_EQ(m->getNumKeys(), 3);
  EXPECT_TRUE(m->deleteKey("c"));
  EXPECT_FALSE(m->deleteKey("c"));
  m->set("s", bytes("abc"));
  EXPECT_THROW(m->add("s", 1), StoreError);  // not a number
  // get and wait block until another connection sets the key.
  auto other = manager();
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    other->set("late", bytes("v"));
  });
  EXPECT_EQ(text(m->get("late")), "v");
  later.join();
  m->wait({"late", "a"}, std::chrono::milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(m->wait({"never"}, std::chrono::milliseconds(200)), StoreError);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(190));
  m->set("after", bytes("ok"));  // a timeout leaves the connection usable
  EXPECT_EQ(text(m->get("after")), "ok");
  // Large values cross whole.
  std::vector<uint8_t> big(3 << 20, 7);
  m->set("big", big);
  EXPECT_EQ(m->get("big"), big);
}

TEST_F(StoreTest, MissingWrongOrReplayedProofIsRefused) {
  EXPECT_THROW(client("worker", "wrong-token"), StoreAuthError);
  EXPECT_THROW(client("manager", "job-token-for-tests"), StoreAuthError);  // the token is not the manager key
  EXPECT_THROW(client("worker/0"), StoreAuthError);                        // no worker 0 registered yet
  EXPECT_THROW(client("root"), StoreAuthError);

  // No proof at all: a request instead of the handshake closes the connection.
  {
    int fd = dial();
    Request r;
    r.op = Op::kGet;
    r.keys = {"job/text"};
    writeFrame(fd, encodeRequest(r));
    EXPECT_TRUE(closedByServer(fd));
    close(fd);
  }
  // Replay: the proof for one connection's nonce, sent on another.
  int a = dial(), b = dial();
  std::vector<uint8_t> buf;
  ASSERT_TRUE(readFrame(a, kMaxHandshakeFrame, buf, 5000));
  Auth auth;
  auth.role = "worker";
  auth.mac = clientProof("job-token-for-tests", decodeHello(buf.data(), buf.size()).nonce, "worker");
  ASSERT_TRUE(readFrame(b, kMaxHandshakeFrame, buf, 5000));
  writeFrame(b, encodeAuth(auth));
  ASSERT_TRUE(readFrame(b, kMaxHandshakeFrame, buf, 5000));
  EXPECT_EQ(decodeVerdict(buf.data(), buf.size()).status, Status::kRejected);
  EXPECT_TRUE(closedByServer(b));
  writeFrame(a, encodeAuth(auth));  // on its own connection it verifies
  ASSERT_TRUE(readFrame(a, kMaxHandshakeFrame, buf, 5000));
  EXPECT_EQ(decodeVerdict(buf.data(), buf.size()).status, Status::kOk);
  close(a);
  close(b);
  EXPECT_GE(server_->refusedConnections(), 6);
}

// The server knows no key of its own: its KeyPolicy decides every write
// (the job's: tests/control/job_key_policy_test.cpp), and its registration key
// makes a worker connection that worker.
class OwnKeysPolicy : public KeyPolicy {
 public:
  std::string refusal(const Role& role, Op, const std::string& key, int64_t) const override {
    if (role.kind == Role::kWorker && role.worker < 0) return key == "register" ? "" : "register first";
    if (role.kind == Role::kWorker && key == "mine/" + std::to_string(role.worker)) return "";
    return "not yours";
  }
  std::string registrationKey() const override { return "register"; }
  bool wakes(const std::string& key) const override { return key != "mine/0"; }
};

TEST(StoreServerPolicy, ThePolicyDecidesEveryWriteAndRegistration) {
  ServerOptions o;
  o.token = "t";
  o.manager_key = "m";
  o.log = false;
  o.policy = std::make_shared<OwnKeysPolicy>();
  StoreServer server(o);
  auto connect = [&](const std::string& role, const std::string& key) {
    return c10::make_intrusive<StoreClient>("127.0.0.1", server.port(), key, role, std::chrono::seconds(5));
  };
  auto w = connect("worker", "t");
  EXPECT_THROW(w->set("mine/0", bytes("x")), StoreError);  // not registered yet
  EXPECT_EQ(w->add("register", 1), 1);                    // worker 0
  const int64_t before = server.table().writes();
  w->set("mine/0", bytes("x"));                           // its own key; it does not wake anyone
  EXPECT_EQ(server.table().writes(), before);
  EXPECT_THROW(w->set("mine/1", bytes("x")), StoreError);
  auto second = connect("worker/0", workerKey("t", w->sessionNonce()));
  second->set("mine/0", bytes("y"));
  EXPECT_THROW(connect("client", "t")->set("mine/0", bytes("z")), StoreError);
  auto m = connect("manager", "m");
  m->set("anything", bytes("1"));  // the manager's role writes every key
  EXPECT_EQ(server.table().writes(), before + 1);
  EXPECT_EQ(text(m->get("mine/0")), "y");
  EXPECT_EQ(server.deniedWrites(), 3);
}

TEST_F(StoreTest, MalformedFramesCloseOnlyTheirConnection) {
  auto m = manager();
  m->set("k", bytes("v"));
  auto sendRaw = [&](const std::vector<uint8_t>& raw, bool authenticate) {
    int fd = dial();
    std::vector<uint8_t> buf;
    EXPECT_TRUE(readFrame(fd, kMaxHandshakeFrame, buf, 5000));
    if (authenticate) {
      Auth a;
      a.role = "client";
      a.mac = clientProof("job-token-for-tests", decodeHello(buf.data(), buf.size()).nonce, "client");
      writeFrame(fd, encodeAuth(a));
      EXPECT_TRUE(readFrame(fd, kMaxHandshakeFrame, buf, 5000));
    }
    EXPECT_EQ(send(fd, raw.data(), raw.size(), MSG_NOSIGNAL), static_cast<ssize_t>(raw.size()));
    shutdown(fd, SHUT_WR);  // truncated frames end here
    EXPECT_TRUE(closedByServer(fd));
    close(fd);
  };
  const std::vector<uint8_t> garbage = {'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P', '/', '1', '.', '1', '\r', '\n'};
  const std::vector<uint8_t> oversized = {0xff, 0xff, 0xff, 0x7f, 1, 2, 3};
  const std::vector<uint8_t> truncated = {10, 0, 0, 0, 2, 1};
  const std::vector<uint8_t> bad_op = {1, 0, 0, 0, 99};
  const std::vector<uint8_t> long_key = {9, 0, 0, 0, 2, 0xff, 0xff, 0, 0, 0, 0, 0, 0};  // key length 65535 > frame
  const std::vector<uint8_t> trailing = {3, 0, 0, 0, 8, 0, 0};
  for (bool auth : {false, true})
    for (const auto& raw : {garbage, oversized, truncated, bad_op, long_key, trailing}) sendRaw(raw, auth);
  // 200 connections opened and dropped at once.
  std::vector<int> fds;
  for (int i = 0; i < 200; ++i) fds.push_back(dial());
  for (int fd : fds) close(fd);
  EXPECT_EQ(text(m->get("k")), "v");
  auto again = client("client");
  EXPECT_EQ(text(again->get("k")), "v");
}

// Gloo's rendezvous over the store: a 2-rank group reduces.
TEST_F(StoreTest, GlooProcessGroupFormsOverIt) {
  std::vector<int64_t> got(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      auto w = client("worker");
      w->add("workers/next_id", 1);
      GlooOptions go;
      go.interface_addr = "127.0.0.1";
      auto comm = makeGlooCommunicator(c10::make_intrusive<c10d::PrefixStore>("gen/0/pg", w), r, 2, go);
      int64_t v = r + 1;
      comm->allreduceSumAsync(&v, 1)->wait();
      got[static_cast<size_t>(r)] = v;
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(got, (std::vector<int64_t>{3, 3}));
}

}  // namespace

