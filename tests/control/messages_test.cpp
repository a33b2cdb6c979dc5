// The typed messages between the manager and its workers
// (control/protocol/): their wire form (docs/distributed.md, "Store
// keys"), round trips, and decoders that name what is wrong.
#include <gtest/gtest.h>

#include "control/protocol/generation_plan.h"
#include "control/protocol/generation_want.h"
#include "control/protocol/resize_request.h"
#include "control/protocol/worker_label.h"
#include "control/protocol/member_report.h"
#include "control/protocol/reach_report.h"
#include "control/protocol/message.h"

namespace morph {
namespace {

using json = nlohmann::json;

GenerationPlan pipelinePlan() {
  GenerationPlan p;
  p.generation = 3;
  p.members = {4, 1, 0, 2};
  p.source = 1;
  p.vn_ranges = {{0, 6}, {0, 6}, {6, 12}, {6, 12}};
  PipelineLayout l;
  l.stages = 2;
  l.replicas = 2;
  l.cuts = {0, 3, 6};
  l.schedule = "1f1b";
  l.replica_ranges = {{0, 6}, {6, 12}};
  p.pipeline = l;
  PipelineMorph m;
  m.step = 40;
  m.from = {3, 1};
  m.to = {2, 2};
  m.to_cuts = {0, 3, 6};
  m.chosen_by = "rule";
  m.planning_seconds = 0.25;
  m.meta_source = 1;
  m.transfers = {{0, 1, 0}, {3, 2, 3}};
  m.expected_bytes = 4096;
  m.finishing = {2};
  p.morph = m;
  return p;
}

TEST(GenerationPlan, WireFormIsTheDocumentedOne) {
  GenerationPlan p;
  p.generation = 1;
  p.members = {0, 2};
  p.released = {3};
  p.source = 1;
  p.vn_ranges = {{0, 3}, {3, 4}};
  p.slowdown = {1.0, 2.0};
  EXPECT_EQ(p.toJson(), json::parse(R"({"generation": 1, "members": [0, 2], "released": [3], "source": 1,
                                        "vn_ranges": [[0, 3], [3, 4]], "slowdown": [1.0, 2.0]})"));
  const json j = pipelinePlan().toJson();
  EXPECT_EQ(j.at("pipeline"), json::parse(R"({"stages": 2, "replicas": 2, "cuts": [0, 3, 6], "schedule": "1f1b",
      "recompute": false, "trace": false, "replica_ranges": [[0, 6], [6, 12]]})"));
  EXPECT_EQ(j.at("morph"), json::parse(R"({"live": true, "step": 40, "from_shape": [3, 1], "to_shape": [2, 2],
      "to_cuts": [0, 3, 6], "chosen_by": "rule", "planning_seconds": 0.25, "meta_source": 1,
      "transfers": [[0, 1, 0], [3, 2, 3]], "expected_bytes": 4096, "finishing": [2]})"));
  PipelineMorph ck = *pipelinePlan().morph;
  ck.live = false;
  ck.checkpoint = "/ck/step-000000000032";
  ck.steps_redone = 8;
  const json cj = ck.toJson();
  EXPECT_EQ(cj.at("checkpoint"), "/ck/step-000000000032");
  EXPECT_EQ(cj.at("steps_redone"), 8);
  EXPECT_FALSE(cj.contains("transfers"));
}

TEST(GenerationPlan, RoundTripsAndAnswersByRank) {
  const GenerationPlan p = pipelinePlan();
  const GenerationPlan q = GenerationPlan::fromJson(json::parse(p.toJson().dump()));
  EXPECT_EQ(q.toJson(), p.toJson());
  EXPECT_EQ(q.rankOf(0), 2);
  EXPECT_EQ(q.rankOf(9), -1);
  EXPECT_FALSE(q.releases(0));
  EXPECT_EQ(q.shares(), (std::vector<int64_t>{6, 6, 6, 6}));
  EXPECT_EQ(q.pipeline->replicaShares(), (std::vector<int64_t>{6, 6}));
  EXPECT_EQ(q.morph->transfers[1].dst, 3);
  EXPECT_EQ(q.slowdownOf(3), 1.0);
}

// A decoder error names the message and the field.
void expectRefused(const json& j, const std::string& says) {
  try {
    GenerationPlan::fromJson(j);
    ADD_FAILURE() << "accepted " << j.dump();
  } catch (const MessageError& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(GenerationPlan, RefusesWhatTheManagerCouldNotHaveWritten) {
  const json good = pipelinePlan().toJson();
  expectRefused(json::array(), "generation plan: expected a JSON object");
  json j = good;
  j.erase("source");
  expectRefused(j, "missing 'source'");
  j = good;
  j["source"] = 4;
  expectRefused(j, "'source': 4 is outside [0, 3]");
  j = good;
  j["members"] = {4, 1, 0, 4};
  expectRefused(j, "listed twice");
  j = good;
  j["vn_ranges"] = {{0, 6}, {0, 6}, {6, 12}};
  expectRefused(j, "3 VN ranges for 4 members");
  j = good;
  j["vn_ranges"][0] = {6, 6};
  expectRefused(j, "empty range");
  j = good;
  j["pipeline"]["stages"] = 3;
  expectRefused(j, "3 cuts for 3 stages");
  j = good;
  j["pipeline"]["schedule"] = "zigzag";
  expectRefused(j, "unknown pipeline schedule 'zigzag'");
  j = good;
  j["pipeline"]["cuts"] = {0, 3, 3};
  expectRefused(j, "not strictly increasing");
  j = good;
  j["morph"]["transfers"][0] = {0, 1, 7};
  expectRefused(j, "'transfers': 7 is outside [0, 3]");
  j = good;
  j["morph"]["finishing"] = {-1};
  expectRefused(j, "'finishing': -1 is outside");
  j = good;
  j["morph"]["live"] = false;
  expectRefused(j, "missing 'checkpoint'");
  j = good;
  j["slowdown"] = {1.0, 1.0};
  expectRefused(j, "one factor per member");
  j = good;
  j["slowdown"] = {1.0, 1.0, 0.5, 1.0};
  expectRefused(j, "not a factor >= 1");
  j = good;
  j.erase("pipeline");
  expectRefused(j, "'morph' without 'pipeline'");
  j = good;
  j["generation"] = "3";
  expectRefused(j, "expected a whole number");
}

TEST(MemberReport, RoundTripsWithAndWithoutLayers) {
  MemberReport r;
  r.committed = 12;
  r.line = {{"step", 11}, {"loss", 0.5}};
  EXPECT_EQ(r.toJson(), json::parse(R"({"committed": 12, "line": {"step": 11, "loss": 0.5}})"));
  MemberReport back = MemberReport::fromJson(r.toJson());
  EXPECT_EQ(back.committed, 12);
  EXPECT_EQ(back.line, r.line);
  EXPECT_FALSE(back.held);

  MemberReport p;
  p.committed = 7;
  p.held = HeldLayers{2, 5, true};
  EXPECT_EQ(p.toJson(), json::parse(R"({"committed": 7, "held": [2, 5], "prepared": true})"));
  back = MemberReport::fromJson(p.toJson());
  ASSERT_TRUE(back.held);
  EXPECT_EQ(back.held->lo, 2u);
  EXPECT_EQ(back.held->hi, 5u);
  EXPECT_TRUE(back.held->prepared);
  EXPECT_TRUE(back.line.is_null());
}

TEST(MemberReport, RefusesMalformedReports) {
  for (const char* bad : {R"("7")", R"({})", R"({"committed": -1})", R"({"committed": 7, "held": [5, 2], "prepared": false})",
                          R"({"committed": 7, "held": [2, 5]})", R"({"committed": 7, "held": [2]})",
                          R"({"committed": 7, "line": {"loss": 1}})", R"({"committed": 7, "line": 3})"})
    EXPECT_THROW(MemberReport::fromJson(json::parse(bad)), MessageError) << bad;
}

TEST(ReachReport, RoundTripsAndRefusesMalformedReports) {
  const ReachReport r{4, {0, 2}};
  EXPECT_EQ(r.toJson(), json::parse(R"({"generation": 4, "unreachable": [0, 2]})"));
  const ReachReport back = ReachReport::fromJson(r.toJson());
  EXPECT_EQ(back.generation, 4);
  EXPECT_EQ(back.unreachable, std::vector<int64_t>({0, 2}));
  EXPECT_TRUE(ReachReport::fromJson(json::parse(R"({"generation": 0, "unreachable": []})")).unreachable.empty());
  for (const char* bad : {R"([])", R"({"generation": 1})", R"({"unreachable": [1]})", R"({"generation": -1, "unreachable": []})",
                          R"({"generation": 1, "unreachable": [2, 1]})", R"({"generation": 1, "unreachable": [1, 1]})",
                          R"({"generation": 1, "unreachable": [-3]})", R"({"generation": 1, "unreachable": "1"})",
                          R"({"generation": 1.5, "unreachable": []})"})
    EXPECT_THROW(ReachReport::fromJson(json::parse(bad)), MessageError) << bad;
}

// A job never slowed reads the bare number it always did; `morph slow`'s
// factors ride on the same value.
TEST(GenerationWant, BareNumberUntilAWorkerIsSlowed) {
  GenerationWant w;
  w.generation = 7;
  EXPECT_EQ(w.encode(), "7");
  EXPECT_EQ(GenerationWant::decode("7").generation, 7);
  EXPECT_TRUE(GenerationWant::decode("7").slowdown.empty());
  w.slowdown = {{1, 40.0}, {12, 2.5}};
  EXPECT_EQ(json::parse(w.encode()), json::parse(R"({"generation": 7, "slowdown": {"1": 40.0, "12": 2.5}})"));
  const GenerationWant back = GenerationWant::decode(w.encode());
  EXPECT_EQ(back.generation, 7);
  EXPECT_EQ(back.slowdown, w.slowdown);
  EXPECT_EQ(back.slowdownOf(1), 40.0);
  EXPECT_EQ(back.slowdownOf(0), 1.0);
}

TEST(GenerationWant, RefusesWhatTheManagerCouldNotHaveWritten) {
  for (const char* bad : {"", "-1", "7x", "[7]", R"({"slowdown": {}})", R"({"generation": 1, "slowdown": 4})",
                          R"({"generation": 1, "slowdown": {"x": 4}})", R"({"generation": 1, "slowdown": {"01": 4}})",
                          R"({"generation": 1, "slowdown": {"1": 0.5}})", R"({"generation": 1, "slowdown": {"1": 2000}})",
                          R"({"generation": 1, "slowdown": {"1": "4"}})", R"({"generation": -2})"})
    EXPECT_THROW(GenerationWant::decode(bad), MessageError) << bad;
}

// `morph resize` writes the bare count it always did unless it names
// workers to release first.
TEST(ResizeRequest, BareCountUnlessWorkersAreNamed) {
  ResizeRequest r;
  r.workers = 3;
  EXPECT_EQ(r.encode(), "3");
  EXPECT_EQ(ResizeRequest::decode("3").workers, 3);
  EXPECT_TRUE(ResizeRequest::decode("3").release.empty());
  r.release = {0, 4};
  EXPECT_EQ(json::parse(r.encode()), json::parse(R"({"workers": 3, "release": [0, 4]})"));
  const ResizeRequest back = ResizeRequest::decode(r.encode());
  EXPECT_EQ(back.workers, 3);
  EXPECT_EQ(back.release, r.release);
}

TEST(ResizeRequest, RefusesWhatTheClientCouldNotHaveWritten) {
  for (const char* bad : {"", "0", "-1", "3x", "[3]", R"({"release": [1]})", R"({"workers": 0, "release": [1]})",
                          R"({"workers": 2, "release": []})", R"({"workers": 2, "release": [3, 1]})",
                          R"({"workers": 2, "release": [1, 1]})", R"({"workers": 2, "release": [-1]})",
                          R"({"workers": 2, "release": 1})", R"({"workers": "2", "release": [1]})"})
    EXPECT_THROW(ResizeRequest::decode(bad), MessageError) << bad;
}

// `morph worker --label`: the text as given, checked on the command line
// and again by the manager that reads it.
TEST(WorkerLabel, TheTextAsGiven) {
  for (const std::string& ok : {std::string("n1"), std::string("node-2.rack_a"), std::string("A"), std::string(64, 'x')}) {
    EXPECT_EQ(WorkerLabel::problem(ok), "") << ok;
    EXPECT_EQ(WorkerLabel{ok}.encode(), ok);
    EXPECT_EQ(WorkerLabel::decode(WorkerLabel{ok}.encode()).text, ok);
  }
}

TEST(WorkerLabel, RefusesWhatTheWorkerCouldNotHaveWritten) {
  for (const std::string& bad : {std::string(), std::string(65, 'x'), std::string("n 1"), std::string("n1/fast"),
                                std::string("\"n1\""), std::string("n1\n"), std::string("n\0001", 3), std::string("é")}) {
    EXPECT_NE(WorkerLabel::problem(bad), "") << bad;
    EXPECT_THROW(WorkerLabel::decode(bad), MessageError) << bad;
  }
}

}  // namespace
}  // namespace morph
