#include "exec/trainer.h"
#include "exec/optimizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/job_spec.h"
#include "data/dataset.h"
#include "plan/simulator.h"

namespace morph {
namespace {

// The planner charges a between-hosts sum by the wire the runtime picks.
static_assert(kPlanShardedMinValues == kShardedMinValues, "plan/simulator.h's wire rule differs from the runtime's");

JobSpec smallJob(const std::string& model, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> ov = {"model.name=" + model};
  ov.insert(ov.end(), extra.begin(), extra.end());
  const std::string data = model == "gpt-mini"
                               ? "dataset = \"fortunes-char\"\nseq_len = 16\n"
                               : "dataset = \"synthetic\"\ntrain_size = 200\ntest_size = 50\n";
  return parseJob(R"(
[job]
seed = 3
steps = 4
[data]
)" + data + R"(
[model]
name = "mlp"
[batch]
global = 48
virtual_nodes = 6
[optim]
lr = 0.05
momentum = 0.9
)",
                  "test.toml", ov);
}

std::vector<std::string> modelKeys(const std::string& model) {
  if (model == "mlp") return {"model.hidden=[32, 16]", "model.dropout=0.2"};
  if (model == "gpt-mini") return {"model.layers=1", "model.dim=16", "model.heads=2", "model.dropout=0.1"};
  return {"model.channels=[4, 8]", "model.fc=16"};
}

// The test seam: runs the VNs in `order` (when given) and multiplies VN 2's
// gradient at `spike_step` by 1e7, first attempt only (beyond the bound).
class Probe : public ExecutorProbe {
 public:
  Probe(std::vector<int64_t> order, int64_t spike_step) : order_(std::move(order)), spike_step_(spike_step) {}
  void onGradient(int64_t step, int64_t vn, int attempt, torch::Tensor& grad) override {
    if (attempt == 1 && step == spike_step_ && vn == 2) grad.mul_(1e7f);
  }
  std::vector<int64_t> vnOrder(std::vector<int64_t> vns) override { return order_.empty() ? vns : order_; }

 private:
  std::vector<int64_t> order_;
  int64_t spike_step_;
};

std::string train(const JobSpec& job, std::vector<int64_t> order, int64_t spike_step = -1,
                  std::vector<int>* attempts = nullptr) {
  DataPair data = loadDatasets(job.data, job.seed);
  LocalCommunicator comm;
  VnExecutor tr(job, job.steps, *data.train, comm);
  Probe probe(std::move(order), spike_step);
  tr.core().setProbe(&probe);
  while (tr.core().nextStep() < job.steps) {
    StepStats st = tr.step();
    EXPECT_TRUE(std::isfinite(st.loss));
    if (attempts) attempts->push_back(st.attempts);
  }
  return tr.hash();
}

class TrainerModels : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainerModels, SameJobSameHash) {
  JobSpec job = smallJob(GetParam(), modelKeys(GetParam()));
  EXPECT_EQ(train(job, {}), train(job, {}));
}

TEST_P(TrainerModels, VnOrderDoesNotChangeTheModel) {
  JobSpec job = smallJob(GetParam(), modelKeys(GetParam()));
  std::string ref = train(job, {});
  EXPECT_EQ(train(job, {5, 4, 3, 2, 1, 0}), ref);
  EXPECT_EQ(train(job, {2, 0, 5, 1, 3, 4}), ref);
}

TEST_P(TrainerModels, FloatModeTrainsButIsADifferentReduction) {
  JobSpec exact = smallJob(GetParam(), modelKeys(GetParam()));
  auto keys = modelKeys(GetParam());
  keys.push_back("reduce.mode=float");
  JobSpec flt = smallJob(GetParam(), keys);
  EXPECT_NE(train(exact, {}), train(flt, {}));
}

TEST_P(TrainerModels, GradientSpikeRedoesStepAndStaysOrderIndependent) {
  JobSpec job = smallJob(GetParam(), modelKeys(GetParam()));
  std::vector<int> attempts_a, attempts_b;
  std::string a = train(job, {}, 1, &attempts_a);
  std::string b = train(job, {3, 5, 1, 0, 2, 4}, 1, &attempts_b);
  EXPECT_EQ(a, b);
  ASSERT_EQ(attempts_a.size(), 4u);
  EXPECT_EQ(attempts_a[1], 2);  // the spike forced one redo
  EXPECT_EQ(attempts_a, attempts_b);
  // The redo uses the coarser scale agreed from the spike's maximum, so the
  // model differs from a run without the spike; what matters is that it
  // is the same for every order.
  EXPECT_NE(a, train(job, {}));
}

INSTANTIATE_TEST_SUITE_P(Models, TrainerModels, ::testing::Values("mlp", "cnn", "gpt-mini"));

// The tied head owns no parameter: the embedding's weight is counted once
// and receives the gradient of both of its uses.
// A layer held by another stage, then by this one (a pipeline morph): the
// optimiser state read while the parameter was hollow must not stay
// empty once the parameter holds values again, or a checkpoint or transfer
// could not fill it.
TEST(Optimizer, StateReadWhileHollowFollowsTheParameter) {
  for (const char* name : {"adamw", "sgd"}) {
    OptimSpec spec;
    spec.name = name;
    spec.momentum = 0.9;
    torch::Tensor p = torch::empty({0});
    auto opt = makeOptimizer(spec, {p});
    for (auto& [n, st] : opt->paramState(0)) EXPECT_EQ(st.numel(), 0) << name << " " << n;
    {
      torch::NoGradGuard no_grad;
      p.set_data(torch::ones({4}));
    }
    auto state = opt->paramState(0);
    ASSERT_FALSE(state.empty()) << name;
    for (auto& [n, st] : state) {
      EXPECT_EQ(st.numel(), 4) << name << " " << n;
      st.fill_(0.5);  // as a checkpoint import would
    }
    p.mutable_grad() = torch::ones({4});
    opt->step(0.1);  // used to fail: a size-0 state against a size-4 gradient
    for (auto& [n, st] : opt->paramState(0)) EXPECT_EQ(st.numel(), 4) << name << " " << n;
  }
}

TEST(Trainer, GptMiniTiesTheHeadToTheEmbedding) {
  JobSpec job = smallJob("gpt-mini", modelKeys("gpt-mini"));
  DataPair data = loadDatasets(job.data, job.seed);
  LocalCommunicator comm;
  VnExecutor tr(job, job.steps, *data.train, comm);
  LayerList& model = tr.core().model();
  int64_t embed_params = 0, head_params = 0;
  for (size_t l = 0; l < model.size(); ++l) {
    int64_t n = static_cast<int64_t>(model.layer(l).parameters().size());
    if (model.layerName(l) == "embed") embed_params = n;
    if (model.layerName(l) == "head") head_params = n;
  }
  EXPECT_EQ(embed_params, 2);  // token, position
  EXPECT_EQ(head_params, 0);
  StepStats st = tr.step();
  EXPECT_TRUE(std::isfinite(st.loss));
  EXPECT_GT(st.loss, 3.0);  // about ln(256) = 5.5 at the start
}

TEST(Trainer, LearnsSyntheticTask) {
  JobSpec job = smallJob("mlp", {"model.hidden=[64]", "job.steps=30"});
  DataPair data = loadDatasets(job.data, job.seed);
  LocalCommunicator comm;
  VnExecutor tr(job, job.steps, *data.train, comm);
  double first = tr.step().loss, last = 0;
  while (tr.core().nextStep() < job.steps) last = tr.step().loss;
  EXPECT_LT(last, first * 0.5);
  EXPECT_GT(tr.evaluate(*data.test, 16).accuracy, 0.8);
}

TEST(Trainer, AccumulatorMemoryIsConstantInVnCount) {
  JobSpec a = smallJob("cnn", {"batch.virtual_nodes=1"}), b = smallJob("cnn", {"batch.virtual_nodes=48"});
  DataPair data = loadDatasets(a.data, a.seed);
  LocalCommunicator comm;
  VnExecutor ta(a, 1, *data.train, comm), tb(b, 1, *data.train, comm);
  EXPECT_EQ(ta.core().accumulator().bufferBytes(), tb.core().accumulator().bufferBytes());
  // One int64 per parameter plus the batch-norm statistics and two scalars.
  EXPECT_LT(ta.core().accumulator().bufferBytes(), 2 * ta.core().modelBytes() + 4096);
}

// The state round-trips, scale exponents included (in extra.bin's
// `exact/scales`); a version-1 state with them in the meta loads the same.
TEST(Trainer, StateRoundTripsWithScales) {
  JobSpec job = smallJob("cnn", modelKeys("cnn"));
  DataPair data = loadDatasets(job.data, job.seed);
  LocalCommunicator comm;
  VnExecutor a(job, job.steps, *data.train, comm);
  a.step();
  a.step();
  const CheckpointData saved = snapshotCheckpoint(a.exportState());
  VnExecutor b(job, job.steps, *data.train, comm), c(job, job.steps, *data.train, comm);
  b.importState(saved);
  EXPECT_EQ(b.core().stateMeta(), a.core().stateMeta());
  CheckpointData v1 = saved;
  v1.extra.clear();
  v1.meta["scales"] = a.core().accumulator().scales();
  c.importState(v1);
  EXPECT_EQ(c.core().stateMeta(), a.core().stateMeta());
  a.step();
  b.step();
  c.step();
  EXPECT_EQ(b.hash(), a.hash());
  EXPECT_EQ(c.hash(), a.hash());
  CheckpointData none = saved;
  none.extra.clear();
  EXPECT_THROW(c.importState(none), InputError);  // no scale state at all
}

// A WSP VW's local update (docs/wsp.md, "What a VW does within a wave"):
// with VNs [0, 2) of 6, "share" moves the weights by lr G / B (its share of
// the step's mean gradient), "own" by lr G / B_v = 3x that (a full step on
// its own 2 VNs' samples); the same gradient (the same weights and samples)
// either way. A checkpoint records the rule; one without it (written
// before the key) was trained with "share", which an "own" job refuses.
TEST(Trainer, AWspLocalStepIsItsShareOrAFullStepOnItsOwnSamples) {
  JobSpec share = smallJob("mlp");
  share.sync_mode = SyncMode::kWsp;
  EXPECT_EQ(share.local_step, "own");  // the default
  JobSpec own = share;
  share.local_step = "share";
  DataPair data = loadDatasets(share.data, share.seed);
  LocalCommunicator comm;
  VnExecutor a(share, share.steps, *data.train, comm), b(own, own.steps, *data.train, comm);
  a.setVnRange(0, 2);
  b.setVnRange(0, 2);
  std::vector<torch::Tensor> before;
  for (const auto& s : a.core().segments())
    if (s.kind == StepCore::Segment::kParam) before.push_back(s.state.detach().clone());
  a.localStep();
  b.localStep();
  size_t i = 0;
  double moved = 0.0;
  for (size_t k = 0; k < a.core().segments().size(); ++k) {
    const StepCore::Segment sa = a.core().segments()[k], sb = b.core().segments()[k];
    if (sa.kind != StepCore::Segment::kParam) continue;
    const torch::Tensor da = sa.state.detach() - before[i], db = sb.state.detach() - before[i];
    ++i;
    EXPECT_TRUE(torch::allclose(db, da * 3.0, 1e-4, 1e-7)) << "segment " << k;
    moved += da.abs().sum().item<double>();
  }
  EXPECT_GT(moved, 0.0);
  CheckpointData saved = snapshotCheckpoint(b.exportState());
  EXPECT_EQ(saved.meta.at("job").at("sync.local_step"), "own");
  saved.meta["job"].erase("sync.local_step");
  try {
    b.importState(saved);
    ADD_FAILURE() << "a checkpoint without sync.local_step resumed under \"own\"";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("sync.local_step (checkpoint \"share\", now \"own\")"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(a.importState(saved));  // "share" reads the missing key so
}

// A WSP checkpoint records sync.stale_update; one without it (written
// before, when the default "bypass" was recorded by omission) was trained
// with "bypass": a "bypass_squared" job refuses it naming the key, a
// "bypass" job resumes it and refuses a "bypass_squared" checkpoint
// (docs/wsp.md, "Stale pushes").
TEST(Trainer, AWspCheckpointWithoutTheStaleRuleMeansBypass) {
  JobSpec job = smallJob("cnn", modelKeys("cnn"));
  job.sync_mode = SyncMode::kWsp;
  job.staleness = 1;
  job.stale_update = "bypass_squared";
  DataPair data = loadDatasets(job.data, job.seed);
  LocalCommunicator comm;
  VnExecutor a(job, job.steps, *data.train, comm);
  a.step();
  CheckpointData saved = snapshotCheckpoint(a.exportState());
  EXPECT_EQ(saved.meta.at("job").at("sync.stale_update"), "bypass_squared");
  CheckpointData old = saved;
  old.meta["job"].erase("sync.stale_update");
  VnExecutor b(job, job.steps, *data.train, comm);
  b.importState(saved);
  try {
    b.importState(old);
    ADD_FAILURE() << "a checkpoint without sync.stale_update resumed under bypass_squared";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("sync.stale_update (checkpoint \"bypass\", now \"bypass_squared\")"),
              std::string::npos)
        << e.what();
  }
  JobSpec bypass = job;
  bypass.stale_update = "bypass";
  VnExecutor c(bypass, job.steps, *data.train, comm);
  c.importState(old);
  EXPECT_THROW(c.importState(saved), InputError);
}

// The inputs of a worker's next VN are gathered on the prefetcher's
// thread while its current VN computes. A data set that records each
// gather (its samples and thread) and a probe that, in the backward pass of
// VN k, waits until VN k + 1's samples were gathered on another thread: a
// prefetcher that gathered synchronously (in take(), on the training
// thread) would never get there while the training thread waits.
class RecordingDataset : public Dataset {
 public:
  explicit RecordingDataset(const Dataset& inner) : inner_(inner) {}
  int64_t size() const override { return inner_.size(); }
  Batch gather(const int64_t* idx, int64_t n) const override {
    Batch b = inner_.gather(idx, n);
    {
      std::lock_guard<std::mutex> l(mu_);
      gathered_.push_back({std::vector<int64_t>(idx, idx + n), std::this_thread::get_id()});
    }
    cv_.notify_all();
    return b;
  }
  // Whether `idx` is gathered, by a thread other than `not_on`, within `wait`.
  bool gatheredElsewhere(const std::vector<int64_t>& idx, std::thread::id not_on, std::chrono::seconds wait) const {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, wait, [&] {
      for (const auto& [got, on] : gathered_)
        if (got == idx && on != not_on) return true;
      return false;
    });
  }

 private:
  const Dataset& inner_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable std::vector<std::pair<std::vector<int64_t>, std::thread::id>> gathered_;
};

class AheadProbe : public ExecutorProbe {
 public:
  AheadProbe(const RecordingDataset& data, const GlobalSampler& sampler, int64_t vns)
      : data_(data), sampler_(sampler), vns_(vns) {}
  // In VN k's backward (the first of its gradients): VN k + 1 of the step.
  void onGradient(int64_t step, int64_t vn, int, torch::Tensor&) override {
    if (std::make_pair(step, vn) == last_ || vn + 1 == vns_) return;
    last_ = {step, vn};
    expectAhead(step, vn + 1);
  }
  // Before a step's first VN: its VN 0, requested once the previous
  // step's sums were in flight.
  void atPoint(const char* point, int64_t step) override {
    if (std::string(point) == "compute" && step > 0) expectAhead(step, 0);
  }
  void expectAhead(int64_t step, int64_t vn) {
    ++checked_;
    if (!data_.gatheredElsewhere(sampler_.vnIndices(step, vn), std::this_thread::get_id(), std::chrono::seconds(5)))
      missed_.push_back({step, vn});
  }
  int checked_ = 0;
  std::vector<std::pair<int64_t, int64_t>> missed_;  // (step, VN) not gathered ahead

 private:
  const RecordingDataset& data_;
  const GlobalSampler& sampler_;
  int64_t vns_;
  std::pair<int64_t, int64_t> last_{-1, -1};
};

TEST(Trainer, PrefetcherGathersTheNextVnWhileThisOneComputes) {
  JobSpec job = smallJob("mlp", {"model.hidden=[16]", "job.steps=2"});
  DataPair data = loadDatasets(job.data, job.seed);
  RecordingDataset recording(*data.train);
  const GlobalSampler sampler(job.seed, recording.size(), job.global_batch, job.virtual_nodes);
  LocalCommunicator comm;
  VnExecutor tr(job, job.steps, recording, comm);
  AheadProbe probe(recording, sampler, job.virtual_nodes);
  tr.core().setProbe(&probe);
  tr.step();
  tr.step();
  EXPECT_EQ(probe.checked_, 2 * 5 + 1);  // VNs 1-5 of both steps, and step 1's VN 0
  EXPECT_EQ(probe.missed_, (std::vector<std::pair<int64_t, int64_t>>{})) << "(step, VN) not gathered ahead";
}

}  // namespace
}  // namespace morph
