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
#include "control/internal.h"
#include "control/store_client.h"
#include "control/store_server.h"

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

TEST_F(StoreTest, RolesWriteOnlyTheirKeys) {
  auto m = manager();
  m->set("gen/current", bytes("0"));
  auto w = client("worker");
  EXPECT_THROW(w->set("workers/0/pid", bytes("1")), StoreError);  // not registered yet
  EXPECT_EQ(w->add("workers/next_id", 1), 1);                    // worker 0
  auto w1 = client("worker");
  EXPECT_EQ(w1->add("workers/next_id", 1), 2);  // worker 1
  EXPECT_THROW(client("worker/0"), StoreAuthError);  // the token alone does not make one worker 0
  // A second connection of worker 0, with the key only its registering connection can derive.
  auto hb = client("worker/0", workerKey("job-token-for-tests", w->sessionNonce()));
  EXPECT_THROW(client("worker/1", workerKey("job-token-for-tests", w->sessionNonce())), StoreAuthError);
  hb->set("workers/0/hb", bytes("1"));
  w->set("workers/0/pid", bytes("123"));
  w->set("result/0", bytes("{}"));
  w->set("gen/0/ready/0", bytes("3"));
  w->set("gen/0/pg/0", bytes("addr"));
  w->set("metrics/7", bytes("{}"));
  w->add("events", 1);
  w->set("job/steps", bytes("10"));  // worker 0 only
  for (const char* k : {"gen/current", "gen/want", "gen/0/plan", "gen/0/abort", "job/out", "job/text", "job/resume",
                        "job/finished", "status", "result/1", "workers/1/hb", "gen/0/ready/1", "ctl/resize_target"})
    EXPECT_THROW(w->set(k, bytes("x")), StoreError) << k;
  EXPECT_THROW(w1->set("job/steps", bytes("1")), StoreError);
  // Any worker may create them (the first one wins), none may change them.
  EXPECT_EQ(text(w1->compareSet("job/steps", {}, bytes("1"))), "10");
  EXPECT_EQ(text(w1->compareSet("job/start_step", {}, bytes("0"))), "0");
  EXPECT_EQ(text(w1->get("job/steps")), "10");
  EXPECT_THROW(w->add("workers/next_id", 1), StoreError);  // registers once
  EXPECT_THROW(w->deleteKey("gen/current"), StoreError);
  EXPECT_THROW(w->compareSet("gen/current", bytes("0"), bytes("9")), StoreError);
  EXPECT_EQ(text(w->get("gen/current")), "0");  // reads are open to every role
  auto c = client("client");
  c->set("ctl/resize_target", bytes("3"));
  c->add("ctl/resize_seq", 1);
  c->set("ctl/slow/1", bytes("4"));  // morph slow
  EXPECT_THROW(c->set("gen/current", bytes("5")), StoreError);
  EXPECT_THROW(c->add("workers/next_id", 1), StoreError);
  EXPECT_THROW(c->set("ctl/slow/x", bytes("4")), StoreError);
  EXPECT_THROW(w->set("ctl/slow/0", bytes("4")), StoreError);  // a client's knob, not a worker's
  EXPECT_EQ(text(m->get("gen/current")), "0");
  EXPECT_EQ(server_->deniedWrites(), 22);
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

// Numbers read from the store (internal.h): the whole value or an error
// naming the key.
TEST(StoreValues, WholeNumbersAreParsedStrictly) {
  using morph::detail::parseStoreInt;
  EXPECT_EQ(parseStoreInt("gen/current", "12"), 12);
  EXPECT_EQ(parseStoreInt("gen/current", "-1"), -1);
  for (const char* bad : {"12abc", "", " 1", "1 ", "-", "+1", "1.5", "99999999999999999999"})
    EXPECT_THROW(parseStoreInt("gen/current", bad), morph::JobError) << bad;
  try {
    parseStoreInt("job/steps", "12abc");
  } catch (const morph::JobError& e) {
    EXPECT_NE(std::string(e.what()).find("'12abc' under job/steps"), std::string::npos) << e.what();
  }
}
