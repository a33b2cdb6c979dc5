// The manager's decisions (src/control/manager/) on an in-memory store
// (store::LocalStore) with a fake clock and fake worker processes: no
// process is started and no deadline is waited for. Each test drives the
// store as workers would (ids, pids, heartbeats, reports) and checks what
// Membership and Generations decide.
#include <gtest/gtest.h>

#include <deque>

#include "control/manager/generations.h"
#include "control/manager/membership.h"
#include "control/manager/pipeline_morph.h"
#include "control/protocol/generation_plan.h"
#include "control/protocol/keys.h"
#include "control/protocol/member_report.h"
#include "control/protocol/reach_report.h"
#include "store/local_store.h"
#include "store/table.h"

namespace morph {
namespace {

using json = nlohmann::json;

class FakeClock : public Clock {
 public:
  double now() const override { return t; }
  double t = 1000;
};

class FakeProcesses : public WorkerProcesses {
 public:
  pid_t start() override { return next_pid++; }
  void kill(pid_t pid) override { killed.push_back(pid); }
  std::optional<Exit> reap() override {
    if (exits.empty()) return std::nullopt;
    Exit e = exits.front();
    exits.pop_front();
    return e;
  }
  void wait(pid_t) override {}
  void waitAll() override {}
  pid_t next_pid = 500;
  std::vector<pid_t> killed;
  std::deque<Exit> exits;
};

void put(c10d::Store& s, const std::string& k, const std::string& v) { s.set(k, std::vector<uint8_t>(v.begin(), v.end())); }
std::string read(c10d::Store& s, const std::string& k) {
  const auto v = s.get(k);
  return std::string(v.begin(), v.end());
}

// A job's manager side, without its processes: the store, the clock and
// the collaborators the manager coordinates.
struct Harness {
  explicit Harness(const std::string& toml, int workers, int stages = 1)
      : job(parseJob(toml, "", {})), store(table, std::chrono::milliseconds(50)) {
    o.workers = workers;
    o.stages = stages;
    o.quiet = true;
    pipeline = std::make_unique<PipelineMorpher>(o, job);
    pipeline->setUp(workers);
    membership = std::make_unique<Membership>(procs, Membership::Options{0.1, 2.0, true, 0}, json::object());
    generations = std::make_unique<Generations>(o, job, *membership, *pipeline, table);
    generations->writeWant(store, 0);
  }
  // Worker `id` registers (takes the next id), announces its pid and is
  // ready (data loaded).
  void registerWorker(int64_t id) {
    ASSERT_EQ(store.add(keys::kNextWorkerId, 1) - 1, id);
    put(store, keys::workerPid(id), std::to_string(9000 + id));
    put(store, keys::workerReady(id), "1");
  }
  // A member's report leaving the current generation.
  void report(int64_t id, int64_t committed, std::optional<HeldLayers> held = std::nullopt) {
    MemberReport r;
    r.committed = committed;
    r.line = {{"step", committed - 1}};
    r.held = held;
    put(store, keys::genReport(generations->current(), "ready", id), r.toJson().dump());
    store.add(keys::kEvents, 1);
  }
  void poll() { membership->pollRegistrations(store, clock); }
  // Workers 0..n-1 register and generation 0 starts with them.
  void startWith(int n) {
    for (int64_t id = 0; id < n; ++id) registerWorker(id);
    poll();
    generations->maybeStart(store, clock, clock.t);
  }
  // The coordinator's markDead.
  void kill(int64_t id, const std::string& why) {
    if (membership->markDead(store, id, why) == Membership::Dead::kPlaceable)
      generations->onDeath(store, clock, id, why, false);
  }
  GenerationPlan planOf(int64_t g) { return GenerationPlan::fromJson(json::parse(read(store, keys::genPlan(g)))); }

  RunOptions o;
  JobSpec job;
  FakeClock clock;
  FakeProcesses procs;
  store::Table table;
  store::LocalStore store;
  std::unique_ptr<PipelineMorpher> pipeline;
  std::unique_ptr<Membership> membership;
  std::unique_ptr<Generations> generations;
};

const char* const kMlpJob = R"(
[job]
name = "logic"
seed = 1
steps = 100
[data]
dataset = "synthetic"
train_size = 96
test_size = 16
[model]
name = "mlp"
hidden = [16, 16, 16]
[batch]
global = 48
virtual_nodes = 6
[optim]
lr = 0.1
)";

// A worker that took an id and died before announcing its pid is skipped
// once kAnnounceDeadlineS has passed on the manager's clock, and later
// ids are not held up by it (a real run waited 10 s for this).
TEST(ManagerLogic, UnannouncedIdIsSkippedAtItsDeadline) {
  Harness h(kMlpJob, 2);
  h.store.add(keys::kNextWorkerId, 1);  // id 0 taken, never announced
  h.registerWorker(1);
  h.poll();
  EXPECT_EQ(h.membership->unannounced(), 1u);
  ASSERT_TRUE(h.membership->workers().count(1));
  EXPECT_TRUE(h.membership->workers().at(1).placeable);  // not held up by id 0
  h.clock.t += kAnnounceDeadlineS - 0.01;
  h.poll();
  EXPECT_EQ(h.membership->unannounced(), 1u) << "skipped before its deadline";
  EXPECT_FALSE(h.membership->workers().count(0));
  h.clock.t += 0.02;
  h.poll();
  EXPECT_EQ(h.membership->unannounced(), 0u);
  ASSERT_TRUE(h.membership->workers().count(0));
  EXPECT_FALSE(h.membership->workers().at(0).alive);
  EXPECT_FALSE(h.membership->workers().at(0).announced);
  ASSERT_EQ(h.membership->startFailures().size(), 1u);
  EXPECT_NE(h.membership->startFailures()[0].find("did not announce itself within 10 s"), std::string::npos);
  // Generation 0 goes on with the worker that could start.
  h.generations->maybeStart(h.store, h.clock, h.clock.t);
  ASSERT_EQ(h.generations->current(), 0);
  EXPECT_EQ(h.planOf(0).members, std::vector<int64_t>({1}));
}

// A member that has not answered a generation change but still
// heart-beats is waited for, and declared dead only once kStuckFactor x the
// regroup deadline has passed (a real run waited minutes for this).
TEST(ManagerLogic, HeartBeatingMemberIsStuckOnlyAfterItsDeadline) {
  Harness h(kMlpJob, 2);
  h.startWith(2);
  ASSERT_EQ(h.generations->current(), 0);
  h.report(1, 10);  // worker 1 regroups; worker 0 is busy
  h.generations->watchMembership(h.store, h.clock, false);
  ASSERT_TRUE(h.generations->inTransition());
  const double start = h.clock.t;
  const double stuck_after = kStuckFactor * h.generations->regroupDeadline();
  EXPECT_EQ(h.generations->regroupDeadline(), kRegroupFloorS);
  int beat = 0;
  for (double t = start; t < start + stuck_after; t += 7.5) {
    h.clock.t = t;
    put(h.store, keys::workerHeartbeat(0), std::to_string(++beat));
    put(h.store, keys::workerHeartbeat(1), std::to_string(beat));
    EXPECT_TRUE(h.membership->pollHeartbeats(h.store, h.clock, 0).empty()) << "at +" << t - start << " s";
    const Generations::Answered a = h.generations->transitionComplete(h.store, h.clock);
    EXPECT_FALSE(a.complete) << "at +" << t - start << " s";
    EXPECT_TRUE(a.stuck.empty()) << "at +" << t - start << " s";
  }
  h.clock.t = start + stuck_after + 0.01;
  const Generations::Answered a = h.generations->transitionComplete(h.store, h.clock);
  ASSERT_EQ(a.stuck.size(), 1u);
  EXPECT_EQ(a.stuck[0].id, 0);
  EXPECT_NE(a.stuck[0].why.find("declared dead although it heart-beats"), std::string::npos);
  EXPECT_TRUE(a.complete);
}

// A member killed mid-step: its generation is aborted (the survivors leave
// their collectives), and the next plan keeps exactly the survivors, with
// the VNs split evenly between them and the state sent from the one that
// committed the most.
TEST(ManagerLogic, DeathMidStepPlanKeepsTheSurvivors) {
  Harness h(kMlpJob, 3);
  for (int64_t id : {0, 1, 2}) h.registerWorker(id);
  h.poll();
  h.generations->maybeStart(h.store, h.clock, h.clock.t);
  ASSERT_EQ(h.planOf(0).members, std::vector<int64_t>({0, 1, 2}));
  h.kill(1, "was killed by signal 9");
  EXPECT_EQ(h.procs.killed, std::vector<pid_t>());  // not a local child
  EXPECT_TRUE(h.store.check({keys::genAbort(0)}));
  ASSERT_TRUE(h.generations->inTransition());
  h.report(0, 7);
  EXPECT_FALSE(h.generations->transitionComplete(h.store, h.clock).complete);  // worker 2 has not answered
  h.report(2, 8);
  ASSERT_TRUE(h.generations->transitionComplete(h.store, h.clock).complete);
  const GenerationPlan p = h.generations->publish(h.store, 0);
  EXPECT_EQ(p.generation, 1);
  EXPECT_EQ(p.members, std::vector<int64_t>({0, 2}));
  EXPECT_EQ(p.shares(), std::vector<int64_t>({3, 3}));
  EXPECT_EQ(p.source, 1);  // worker 2 committed the most
  EXPECT_EQ(h.planOf(1).members, p.members);
  EXPECT_EQ(read(h.store, keys::kGenCurrent), "1");
  EXPECT_FALSE(h.generations->inTransition());
}

// A worker that becomes ready while a pipeline morph is under way (a
// member of 2 stages x 2 replicas died) is placed in it: the morph keeps
// the shape, is live (every layer has a holder among the survivors) and
// sends the joiner the layers of the stage it takes.
TEST(ManagerLogic, JoinDuringPipelineMorphIsPlaced) {
  Harness h(kMlpJob, 4, 2);
  ASSERT_TRUE(h.pipeline->pipelined());
  const std::vector<size_t> cuts = h.pipeline->layout()->cuts;
  for (int64_t id : {0, 1, 2, 3}) h.registerWorker(id);
  h.poll();
  h.generations->maybeStart(h.store, h.clock, h.clock.t);
  ASSERT_EQ(h.planOf(0).members, std::vector<int64_t>({0, 1, 2, 3}));
  h.kill(3, "exited with code 1");  // stage 1 of replica 1
  ASSERT_TRUE(h.generations->inTransition());
  auto held = [&](int stage) { return HeldLayers{cuts[static_cast<size_t>(stage)], cuts[static_cast<size_t>(stage) + 1], false}; };
  h.report(0, 20, held(0));
  h.report(1, 20, held(1));
  h.report(2, 20, held(0));
  h.registerWorker(4);  // joins while the morph waits
  h.poll();
  ASSERT_TRUE(h.generations->transitionComplete(h.store, h.clock).complete);
  const GenerationPlan p = h.generations->publish(h.store, 0);
  ASSERT_TRUE(p.morph);
  EXPECT_TRUE(p.morph->live);
  EXPECT_EQ(p.morph->to.stages, 2);
  EXPECT_EQ(p.morph->to.replicas, 2);
  ASSERT_EQ(p.members.size(), 4u);
  const int joiner = p.rankOf(4);
  ASSERT_GE(joiner, 0);
  EXPECT_EQ(p.rankOf(3), -1);
  size_t moved = 0;
  for (const MorphTransfer& t : p.morph->transfers)
    if (t.dst == joiner) {
      ++moved;
      EXPECT_GE(t.layer, cuts[static_cast<size_t>(joiner % 2)]);
      EXPECT_LT(t.layer, cuts[static_cast<size_t>(joiner % 2) + 1]);
    }
  EXPECT_EQ(moved, cuts[static_cast<size_t>(joiner % 2) + 1] - cuts[static_cast<size_t>(joiner % 2)]);
}

// Who can reach whom: the largest group whose members all reach each
// other, a pair cut when either side reports it; ties by speed, then by the
// lowest ids.
TEST(ManagerLogic, LargestReachableGroup) {
  using Cut = std::map<int64_t, std::vector<int64_t>>;
  const std::vector<int64_t> three = {0, 1, 2};
  EXPECT_EQ(largestReachableGroup(three, {}), three);
  // 2 is cut off from 0 and 1 (reported by 2 only): 0 and 1 go on.
  EXPECT_EQ(largestReachableGroup(three, Cut{{2, {0, 1}}}), std::vector<int64_t>({0, 1}));
  // ... reported by 0 and 1 only.
  EXPECT_EQ(largestReachableGroup(three, Cut{{0, {2}}, {1, {2}}}), std::vector<int64_t>({0, 1}));
  // Two workers that cannot reach each other: the lowest id, unless the
  // other is faster.
  EXPECT_EQ(largestReachableGroup({0, 1}, Cut{{1, {0}}}), std::vector<int64_t>({0}));
  EXPECT_EQ(largestReachableGroup({0, 1}, Cut{{0, {1}}}, {{0, 1.0}, {1, 2.0}}), std::vector<int64_t>({1}));
  // 0-1 cut, 2-3 cut: groups of two, {0,2} has the lowest ids.
  EXPECT_EQ(largestReachableGroup({3, 2, 1, 0}, Cut{{0, {1}}, {2, {3}}}), std::vector<int64_t>({2, 0}));
  // A chain 0-1-2-3 where only neighbours reach each other: two of size 2.
  EXPECT_EQ(largestReachableGroup({0, 1, 2, 3}, Cut{{0, {2, 3}}, {1, {3}}}), std::vector<int64_t>({0, 1}));
  // Five workers, {1, 2, 4} all reach each other and nothing bigger does.
  EXPECT_EQ(largestReachableGroup({0, 1, 2, 3, 4}, Cut{{0, {1, 2}}, {3, {1, 2, 4}}}), std::vector<int64_t>({1, 2, 4}));
}

// A partition of a 3-worker job: worker 2 reports that it cannot reach the
// others. The generation is aborted, the next plan keeps 0 and 1 (2 is not
// waited for, not released and not killed), and 2 is admitted again as a
// joiner once it reports that it reaches every member.
TEST(ManagerLogic, PartitionKeepsTheLargestGroupAndReadmitsTheOther) {
  Harness h(kMlpJob, 3);
  for (int64_t id : {0, 1, 2}) h.registerWorker(id);
  h.poll();
  h.generations->maybeStart(h.store, h.clock, h.clock.t);
  ASSERT_EQ(h.generations->current(), 0);
  auto reach = [&](int64_t id, int64_t g, std::vector<int64_t> cut) {
    put(h.store, keys::workerReach(id), ReachReport{g, std::move(cut)}.toJson().dump());
  };
  reach(2, 0, {});  // nothing cut: no decision
  h.generations->watchPartitions(h.store, h.clock);
  EXPECT_FALSE(h.generations->inTransition());
  reach(1, 0, {2});  // one side's report: the manager waits for the other's
  h.generations->watchPartitions(h.store, h.clock);
  EXPECT_FALSE(h.generations->inTransition());
  h.clock.t += 1;
  reach(2, 0, {0, 1});
  h.generations->watchPartitions(h.store, h.clock);
  EXPECT_FALSE(h.generations->inTransition());
  h.clock.t += Partitions::kSettleS;  // both reports in: keep {0, 1} (on 1's alone, {0, 2} and {0, 1} tie)
  h.generations->watchPartitions(h.store, h.clock);
  EXPECT_TRUE(h.store.check({keys::genAbort(0)}));
  ASSERT_TRUE(h.generations->inTransition());
  h.report(0, 50);
  h.report(1, 50);  // worker 2 may answer or not: it is not waited for
  ASSERT_TRUE(h.generations->transitionComplete(h.store, h.clock).complete);
  h.report(2, 50);  // it left its collective too: still not a survivor
  const GenerationPlan p = h.generations->publish(h.store, 0);
  EXPECT_EQ(p.members, std::vector<int64_t>({0, 1}));
  EXPECT_TRUE(p.released.empty());  // released workers exit; this one waits
  EXPECT_TRUE(h.membership->workers().at(2).alive);
  EXPECT_EQ(h.procs.killed, std::vector<pid_t>());
  // Still cut off (it probed generation 1's members): stays aside, the job
  // does not grow back.
  reach(2, 1, {0});
  h.generations->watchPartitions(h.store, h.clock);
  h.generations->watchMembership(h.store, h.clock, false);
  EXPECT_FALSE(h.generations->inTransition());
  // Healed: it reaches 0 and 1, and joins.
  reach(2, 1, {});
  h.generations->watchPartitions(h.store, h.clock);
  h.generations->watchMembership(h.store, h.clock, false);
  ASSERT_TRUE(h.generations->inTransition());
  h.report(0, 60);
  h.report(1, 60);
  ASSERT_TRUE(h.generations->transitionComplete(h.store, h.clock).complete);
  EXPECT_EQ(h.generations->publish(h.store, 0).members, std::vector<int64_t>({0, 1, 2}));
}

// A resize request whose new worker registers as the last step commits
// (seen in cluster.LiveFourJobsSameHashes under load: the job waited 3 min
// for answers from members that had finished): once every step is
// committed no growth starts; and a transition started just before the
// members finished the last step does not keep the job from ending when
// their results of the generation are posted.
TEST(ManagerLogic, JoinerAtTheLastStepDoesNotHoldTheEnd) {
  Harness h(kMlpJob, 2);
  h.startWith(2);
  ASSERT_EQ(h.generations->current(), 0);
  put(h.store, keys::kResizeTarget, "3");
  h.store.add(keys::kResizeSeq, 1);
  EXPECT_EQ(h.generations->pollResizeRequests(h.store), 1);  // one worker to start
  h.registerWorker(2);
  h.poll();
  h.generations->watchMembership(h.store, h.clock, true);  // every step committed
  EXPECT_FALSE(h.generations->inTransition());
  // The request came before the last step committed; the members finished it anyway.
  h.generations->watchMembership(h.store, h.clock, false);
  ASSERT_TRUE(h.generations->inTransition());
  EXPECT_FALSE(h.generations->resultsPosted(h.store));
  put(h.store, keys::result(0), json({{"generation", 0}, {"model_hash", "a"}}).dump());
  EXPECT_FALSE(h.generations->resultsPosted(h.store));  // worker 1's is missing
  put(h.store, keys::result(1), json({{"generation", -1}, {"model_hash", "a"}}).dump());
  EXPECT_FALSE(h.generations->resultsPosted(h.store));  // a stale one does not count
  put(h.store, keys::result(1), json({{"generation", 0}, {"model_hash", "a"}}).dump());
  EXPECT_TRUE(h.generations->resultsPosted(h.store));
  EXPECT_FALSE(h.generations->transitionComplete(h.store, h.clock).complete);  // nobody answers it
}

}  // namespace
}  // namespace morph
