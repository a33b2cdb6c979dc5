// The job's key policy (control/protocol/job_key_policy.h): a table of writes
// and whether each role may make them, then the same policy enforced by a
// real store server over its protocol.
#include "control/protocol/job_key_policy.h"

#include <gtest/gtest.h>

#include "control/protocol/keys.h"
#include "control/store_access.h"
#include "core/error.h"
#include "store/client.h"
#include "store/server.h"

namespace {

using namespace morph;
using namespace morph::store;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

Role manager() { return {Role::kManager, -1}; }
Role client() { return {Role::kClient, -1}; }
Role unregistered() { return {Role::kWorker, -1}; }
Role worker(int64_t id) { return {Role::kWorker, id}; }

struct Write {
  Role role;
  Op op;
  std::string key;
  bool allowed;
  int64_t delta = 1;
};

TEST(JobKeyPolicy, WhoMayWriteWhat) {
  const std::vector<Write> table = {
      // The manager writes every key.
      {manager(), Op::kSet, keys::kGenCurrent, true},
      {manager(), Op::kDelete, keys::metrics(3), true},
      {manager(), Op::kSet, keys::workerRefused(2), true},
      // A client: its requests only.
      {client(), Op::kSet, keys::kResizeTarget, true},
      {client(), Op::kAdd, keys::kResizeSeq, true},
      {client(), Op::kSet, keys::slow(4), true},
      {client(), Op::kSet, keys::kSlowPrefix + "x", false},
      {client(), Op::kAdd, keys::kResizeTarget, false},
      {client(), Op::kSet, keys::kResizeSeq, false},
      {client(), Op::kSet, keys::kGenCurrent, false},
      {client(), Op::kAdd, keys::kNextWorkerId, false},
      // An unregistered worker: add 1 to workers/next_id, nothing else.
      {unregistered(), Op::kAdd, keys::kNextWorkerId, true},
      {unregistered(), Op::kAdd, keys::kNextWorkerId, false, 2},
      {unregistered(), Op::kSet, keys::kNextWorkerId, false},
      {unregistered(), Op::kSet, keys::workerPid(0), false},
      // Worker 1: its own keys, its reports, its groups' rendezvous, the
      // shared keys.
      {worker(1), Op::kSet, keys::workerPid(1), true},
      {worker(1), Op::kSet, keys::workerHeartbeat(1), true},
      {worker(1), Op::kSet, keys::workerStartError(1), true},
      {worker(1), Op::kSet, keys::result(1), true},
      {worker(1), Op::kSet, keys::trace(1), true},
      {worker(1), Op::kSet, keys::genReport(7, "ready", 1), true},
      {worker(1), Op::kSet, keys::genReport(7, "left", 1), true},
      {worker(1), Op::kSet, keys::genReport(7, "line", 1), false},  // in its report since issue 32
      {worker(1), Op::kSet, keys::genReport(7, "held", 1), false},
      {worker(1), Op::kSet, keys::genReport(7, "morph", 1), true},
      {worker(1), Op::kSet, keys::gen(7) + "/pg/0", true},
      {worker(1), Op::kSet, keys::gen(7) + "/stage/1/0", true},
      {worker(1), Op::kSet, keys::gen(7) + "/tied/0", true},
      {worker(1), Op::kSet, keys::gen(7) + "/pipe/0/1", true},
      {worker(1), Op::kSet, keys::metrics(12), true},
      {worker(1), Op::kAdd, keys::kEvents, true},
      {worker(1), Op::kCompareSet, keys::kJobSteps, true},
      {worker(1), Op::kCompareSet, keys::kJobStartStep, true},
      // ... and nothing of the manager's, a client's or another worker's.
      {worker(1), Op::kSet, keys::kJobSteps, false},
      {worker(0), Op::kSet, keys::kJobSteps, true},  // worker 0 may set them
      {worker(1), Op::kAdd, keys::kNextWorkerId, false},
      {worker(1), Op::kSet, keys::workerPid(2), false},
      {worker(1), Op::kSet, keys::workerHeartbeat(11), false},
      {worker(1), Op::kSet, keys::result(2), false},
      {worker(1), Op::kSet, keys::genReport(7, "ready", 2), false},
      {worker(1), Op::kSet, keys::genReport(7, "other", 1), false},
      {worker(1), Op::kSet, keys::kGenPrefix + "x/ready/1", false},
      {worker(1), Op::kSet, keys::gen(7) + "/pg", false},
      {worker(1), Op::kSet, keys::genPlan(7), false},
      {worker(1), Op::kSet, keys::genAbort(7), false},
      {worker(1), Op::kSet, keys::kGenCurrent, false},
      {worker(1), Op::kSet, keys::kGenWant, false},
      {worker(1), Op::kSet, keys::kJobText, false},
      {worker(1), Op::kSet, keys::kJobFinished, false},
      {worker(1), Op::kSet, keys::kStatus, false},
      {worker(1), Op::kSet, keys::kResizeTarget, false},
      {worker(1), Op::kSet, keys::slow(1), false},  // a client's knob, not a worker's
      {worker(1), Op::kAdd, keys::metrics(3), false},
      {worker(1), Op::kSet, keys::kMetricsPrefix + "3a", false},
      {worker(1), Op::kSet, keys::kEvents, false},
  };
  const JobKeyPolicy policy;
  for (const Write& w : table) {
    const std::string why = policy.refusal(w.role, w.op, w.key, w.delta);
    EXPECT_EQ(why.empty(), w.allowed) << w.key << " by role " << w.role.kind << "/" << w.role.worker << ": " << why;
  }
  EXPECT_EQ(policy.registrationKey(), keys::kNextWorkerId);
  EXPECT_FALSE(policy.wakes(keys::workerHeartbeat(3)));
  EXPECT_TRUE(policy.wakes(keys::workerReady(3)));
  EXPECT_TRUE(policy.wakes(keys::metrics(3)));
}

class JobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.token = "job-token-for-tests";
    o.manager_key = "manager-key-for-tests";
    o.log = false;
    o.policy = std::make_shared<JobKeyPolicy>();
    server_ = std::make_unique<StoreServer>(o);
  }
  c10::intrusive_ptr<StoreClient> client(const std::string& role, const std::string& key = "job-token-for-tests") {
    return c10::make_intrusive<StoreClient>("127.0.0.1", server_->port(), key, role, std::chrono::seconds(5));
  }
  c10::intrusive_ptr<StoreClient> manager() { return client("manager", "manager-key-for-tests"); }
  std::unique_ptr<StoreServer> server_;
};

TEST_F(JobStoreTest, RolesWriteOnlyTheirKeys) {
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

}  // namespace

// Numbers read from the store (control/store_access.h): the whole value or an error
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
