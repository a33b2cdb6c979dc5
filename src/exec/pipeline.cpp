// The stage executor and pipeline set-up.
//
// A pipeline worker holds only its stage's layers (built from the job seed:
// layer l's initial weights depend on (seed, l) alone) and computes, reduces
// and updates them. Per
// step it runs its schedule's action list over its replica's VNs:
// activations go to the next stage and gradients to the previous one by
// Gloo send/recv, received by a thread per incoming channel so that compute
// overlaps transfer. Each VN's gradient is quantised into the same global
// segment layout as on a single worker, so the reductions (the stage's
// replicas; a shared weight among the stages that hold it; loss and flags
// over every rank) give the single-process bits.
#include "exec/pipeline.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <random>
#include <map>
#include <numeric>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/model_hash.h"
#include "core/sys.h"
#include "models/loss.h"
#include "exec/trainer.h"

namespace morph {

size_t indexOf(const std::vector<torch::Tensor>& v, const torch::Tensor& t);  // trainer.cpp

namespace {

constexpr int kActTag = 1, kGradTag = 2, kShapeTag = 3, kEvalTag = 4;

double unixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

// How often a stage waiting on a transfer asks whether the generation was
// aborted (a peer that died may leave a receive pending until Gloo's own
// timeout; the manager's abort frees the waiter at once).
constexpr auto kAbortPoll = std::chrono::milliseconds(20);

// Receives one channel's messages (activations from the previous stage, or
// gradients from the next) in the order the schedule consumes them, up to
// kRecvWindow ahead, on a thread of its own. The thread shares its state
// with the channel, so a thread still blocked on a dead peer when the
// channel goes (an aborted step) touches nothing freed when it returns.
class RecvChannel {
 public:
  RecvChannel(Communicator& comm, int peer, int tag, std::vector<int64_t> shape)
      : comm_(comm), peer_(peer), tag_(tag), shape_(std::move(shape)), s_(std::make_shared<State>()) {}
  ~RecvChannel() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lk(s_->mu);
      s_->stop = true;
    }
    s_->cv.notify_all();
    // A thread blocked in a receive from a dead peer returns only at Gloo's
    // timeout: leave it (it holds the state it needs).
    if (s_->done) thread_.join(); else thread_.detach();
  }
  // The micro-batches whose messages arrive this step, in order.
  void start(std::vector<int64_t> order) {
    MORPH_CHECK(!thread_.joinable(), "channel already running");
    s_->ready.clear();
    s_->done = false;
    thread_ = std::thread([s = s_, comm = &comm_, peer = peer_, tag = tag_, shape = shape_, order = std::move(order)] {
      loop(*s, *comm, peer, tag, shape, order);
    });
  }
  bool ready(int64_t m) {
    std::lock_guard<std::mutex> lk(s_->mu);
    return s_->ready.count(m) > 0;
  }
  // Waits for micro-batch m's message; CommFailure when the transfer failed
  // or the generation was aborted meanwhile.
  torch::Tensor take(int64_t m) {
    std::unique_lock<std::mutex> lk(s_->mu);
    while (!s_->cv.wait_for(lk, kAbortPoll, [&] { return s_->ready.count(m) > 0 || s_->error; })) {
      lk.unlock();
      const bool aborted = comm_.aborted();
      lk.lock();
      if (aborted) throw CommFailure("pipeline receive abandoned: the generation was aborted");
    }
    if (!s_->ready.count(m)) std::rethrow_exception(s_->error);
    torch::Tensor t = std::move(s_->ready[m]);
    s_->ready.erase(m);
    s_->cv.notify_all();
    return t;
  }
  void finish() {
    if (thread_.joinable()) thread_.join();
    if (s_->error) std::rethrow_exception(s_->error);
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::map<int64_t, torch::Tensor> ready;
    std::exception_ptr error;
    bool stop = false;
    std::atomic<bool> done{false};
  };
  static void loop(State& s, Communicator& comm, int peer, int tag, const std::vector<int64_t>& shape,
                   const std::vector<int64_t>& order) {
    for (int64_t m : order) {
      {
        std::unique_lock<std::mutex> lk(s.mu);
        s.cv.wait(lk, [&] { return s.ready.size() < kRecvWindow || s.stop; });
        if (s.stop) break;
      }
      torch::Tensor t = torch::empty(shape);
      try {
        comm.recv(t, peer, tag)->wait();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lk(s.mu);
        s.error = std::make_exception_ptr(CommFailure(std::string("pipeline receive failed: ") + e.what()));
        s.cv.notify_all();
        break;
      }
      std::lock_guard<std::mutex> lk(s.mu);
      s.ready[m] = std::move(t);
      s.cv.notify_all();
    }
    s.done = true;
  }

  Communicator& comm_;  // process groups outlive their generation (worker.cpp)
  int peer_, tag_;
  std::vector<int64_t> shape_;
  std::shared_ptr<State> s_;
  std::thread thread_;
};

namespace {
LinkEmulation g_link;  // the harness's seam (pipeline.h); zero in the shipped binary
}  // namespace

void setLinkEmulation(const LinkEmulation& e) { g_link = e; }
LinkEmulation linkEmulation() { return g_link; }

// Sends one channel's messages in order on a thread of its own, which waits
// for each transfer and then drops the tensor. Under a LinkEmulation (the
// test and bench harness only) each message is held back delay_ms +-
// jitter_ms (uniform, order kept) before it is sent: an emulated slow link
// where the kernel has no netem. It changes timing only, never results.
class SendChannel {
 public:
  SendChannel(Communicator& comm, int peer, int tag) : comm_(comm), peer_(peer), tag_(tag) {
    const LinkEmulation link = linkEmulation();
    delay_ms_ = link.delay_ms;
    jitter_ms_ = link.jitter_ms;
    if (delay_ms_ > 0 || jitter_ms_ > 0) {
      rng_.seed(static_cast<unsigned>(getpid()) * 2654435761u + static_cast<unsigned>(tag));
    }
    thread_ = std::thread([this] { loop(); });
  }
  ~SendChannel() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (idle_) thread_.join(); else thread_.detach();  // blocked on a dead peer: do not wait
  }
  void send(torch::Tensor t) {
    double due = 0;
    if (delay_ms_ > 0 || jitter_ms_ > 0) {
      std::uniform_real_distribution<double> u(-jitter_ms_, jitter_ms_);
      due = std::max(last_due_, unixSeconds() + std::max(0.0, delay_ms_ + u(rng_)) / 1000.0);
      last_due_ = due;
    }
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back({std::move(t), due});
    idle_ = false;
    cv_.notify_all();
  }
  // Waits until every message handed over so far has been delivered.
  // CommFailure when a send failed, or the generation was aborted meanwhile.
  void flush() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!cv_.wait_for(lk, kAbortPoll, [&] { return (queue_.empty() && idle_) || error_; })) {
      lk.unlock();
      const bool aborted = comm_.aborted();
      lk.lock();
      if (aborted) throw CommFailure("pipeline send abandoned: the generation was aborted");
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  struct Msg {
    torch::Tensor t;
    double due;
  };
  void loop() {
    while (true) {
      Msg m;
      {
        std::unique_lock<std::mutex> lk(mu_);
        idle_ = queue_.empty();
        cv_.notify_all();
        cv_.wait(lk, [&] { return !queue_.empty() || stop_; });
        if (queue_.empty()) return;
        m = std::move(queue_.front());
        queue_.pop_front();
      }
      const double wait = m.due - unixSeconds();
      if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      try {
        comm_.send(m.t, peer_, tag_)->wait();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lk(mu_);
        error_ = std::make_exception_ptr(CommFailure(std::string("pipeline send failed: ") + e.what()));
        idle_ = true;
        cv_.notify_all();
        return;
      }
    }
  }

  Communicator& comm_;
  int peer_, tag_;
  double delay_ms_ = 0, jitter_ms_ = 0, last_due_ = 0;
  std::mt19937 rng_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Msg> queue_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::atomic<bool> idle_{true};
  std::thread thread_;
};

void SendChannelDeleter::operator()(SendChannel* c) const { delete c; }

StageExecutor::StageExecutor(const JobSpec& job, int64_t total_steps, const Dataset& train)
    : Executor(job, total_steps, train, /*stage_local=*/true) {}

StageExecutor::~StageExecutor() = default;

namespace {

// Per weight shared between layers: its index in `params` and the layers
// that hold it, its owner's first.
std::vector<std::pair<size_t, std::vector<size_t>>> sharedWeightLayers(LayerList& model,
                                                                       const std::vector<torch::Tensor>& params) {
  std::vector<std::pair<size_t, std::vector<size_t>>> out;
  const size_t L = model.size();
  for (size_t l = 0; l < L; ++l)
    for (auto& [alias, owner] : model.layer(l).tiedLeaves()) {
      const size_t i = indexOf(params, owner);
      auto it = std::find_if(out.begin(), out.end(), [&](const auto& w) { return w.first == i; });
      if (it == out.end()) {
        size_t owner_layer = L;
        for (size_t k = 0; k < L && owner_layer == L; ++k)
          for (const auto& p : model.layer(k).parameters())
            if (p.unsafeGetTensorImpl() == owner.unsafeGetTensorImpl()) owner_layer = k;
        MORPH_CHECK(owner_layer < L, "a shared weight's owner is no layer's parameter");
        out.push_back({i, {owner_layer}});
        it = out.end() - 1;
      }
      if (std::find(it->second.begin(), it->second.end(), l) == it->second.end()) it->second.push_back(l);
    }
  return out;
}

// The stages (sorted, once each) that run `layers` under `cuts`.
std::vector<int> stagesOf(const std::vector<size_t>& layers, const std::vector<size_t>& cuts) {
  std::vector<int> out;
  for (size_t l : layers) {
    int k = 0;
    while (cuts[static_cast<size_t>(k) + 1] <= l) ++k;
    out.push_back(k);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

std::vector<std::vector<int>> StageExecutor::tiedStageSets(const std::vector<size_t>& cuts) {
  std::vector<std::vector<int>> out;
  for (const auto& [i, layers] : sharedWeightLayers(*core_.model_, core_.params_)) {
    std::vector<int> set = stagesOf(layers, cuts);
    if (set.size() > 1 && std::find(out.begin(), out.end(), set) == out.end()) out.push_back(std::move(set));
  }
  std::sort(out.begin(), out.end());
  return out;
}

void StageExecutor::place(const PipelinePlacement& pl, int64_t vn_begin, int64_t vn_end, const PipelineComms& comms) {
  const size_t L = core_.model_->size();
  MORPH_CHECK(pl.stages >= 1 && 0 <= pl.stage && pl.stage < pl.stages, "bad pipeline placement");
  MORPH_CHECK(pl.replicas >= 1 && 0 <= pl.replica && pl.replica < pl.replicas, "bad replica");
  MORPH_CHECK(pl.cuts.size() == static_cast<size_t>(pl.stages) + 1 && pl.cuts.front() == 0 && pl.cuts.back() == L,
              "cuts must cover the model");
  for (int k = 0; k < pl.stages; ++k) MORPH_CHECK(pl.cuts[k] < pl.cuts[k + 1], "empty stage");
  MORPH_CHECK(0 <= vn_begin && vn_begin < vn_end && vn_end <= core_.job_.virtual_nodes, "bad VN range");
  MORPH_CHECK(comms.world && comms.pipe, "a pipeline needs world and pipe communicators");
  pipe_ = pl;
  pcomm_ = comms;
  // Channels of a previous placement send on its generation's groups.
  if (act_out_) old_channels_.push_back(std::move(act_out_));
  if (grad_out_) old_channels_.push_back(std::move(grad_out_));
  vn_begin_ = vn_begin;
  vn_end_ = vn_end;
  ScheduleOptions so{pl.schedule, pl.stages, vn_end - vn_begin, pl.recompute};
  Schedule sched = makeSchedule(so);
  validateSchedule(sched, so);
  actions_ = sched[static_cast<size_t>(pl.stage)];

  const size_t lo = pl.cuts[static_cast<size_t>(pl.stage)], hi = pl.cuts[static_cast<size_t>(pl.stage) + 1];
  std::vector<int> layer_stage(L, 0);
  for (int k = 0; k < pl.stages; ++k)
    for (size_t l = pl.cuts[k]; l < pl.cuts[k + 1]; ++l) layer_stage[l] = k;
  core_.own_params_.clear();
  core_.norm_owner_.assign(core_.params_.size(), 0);
  for (size_t l = lo; l < hi; ++l)
    for (const auto& p : core_.model_->layer(l).parameters()) {
      const size_t i = indexOf(core_.params_, p);
      core_.own_params_.push_back(i);
      core_.norm_owner_[i] = 1;
    }
  // A weight used on several stages (a head tied to the embedding, on any
  // stages): each quantises its part of the gradient into the owner's
  // segment; the stages that hold it sum it among themselves (exactly, as
  // any other segment), and each updates its copy alike.
  tied_segs_.clear();
  for (const auto& [i, layers] : sharedWeightLayers(*core_.model_, core_.params_)) {
    std::vector<int> set = stagesOf(layers, pl.cuts);
    if (set.size() < 2 || std::find(set.begin(), set.end(), pl.stage) == set.end()) continue;
    MORPH_CHECK(comms.tied.count(set), "no process group for the stages that share a weight");
    tied_segs_.push_back({core_.segOf(i), set});
    if (layer_stage[layers.front()] != pl.stage) core_.own_params_.push_back(i);  // the copy this stage updates
  }
  std::sort(tied_segs_.begin(), tied_segs_.end());
  // Free what a previous placement held and this one does not; build what
  // this stage holds if it was created holding nothing: its layers, and the
  // weight it shares with another stage.
  {
    std::vector<char> held(L, 0);
    for (size_t l = lo; l < hi; ++l) held[l] = 1;
    core_.releaseLayers(held, core_.own_params_);
    core_.holdLayers(held, core_.own_params_);
    core_.notePeak();
  }
  core_.own_bns_.clear();
  for (size_t l = lo; l < hi; ++l)
    for (const auto& m : core_.model_->layer(l).modules(/*include_self=*/true))
      if (auto* bn = dynamic_cast<VnBatchNorm*>(m.get()))
        for (size_t k = 0; k < core_.bns_.size(); ++k)
          if (core_.bns_[k] == bn) core_.own_bns_.push_back(k);
  // Segments reduced among the stage's replicas, as runs of consecutive ones.
  std::vector<size_t> segs;
  for (size_t i : core_.own_params_)
    if (std::find_if(tied_segs_.begin(), tied_segs_.end(), [&](const auto& t) { return t.first == core_.segOf(i); }) ==
        tied_segs_.end())
      segs.push_back(core_.segOf(i));
  for (size_t k : core_.own_bns_) {
    segs.push_back(core_.bn_seg_ + 2 * k);
    segs.push_back(core_.bn_seg_ + 2 * k + 1);
  }
  std::sort(segs.begin(), segs.end());
  own_runs_.clear();
  for (size_t s : segs) {
    if (!own_runs_.empty() && own_runs_.back().second == s) own_runs_.back().second = s + 1;
    else own_runs_.push_back({s, s + 1});
  }
  // The gradient buffer holds this stage's segments only (and the loss
  // statistics); the other segments keep their index, with size 0, so that
  // scales and flags stay in the single-worker layout.
  {
    std::vector<int64_t> sizes(core_.seg_sizes_.size(), 0);
    for (size_t i : core_.own_params_) sizes[core_.segOf(i)] = core_.params_[i].numel();
    for (size_t k : core_.own_bns_) sizes[core_.bn_seg_ + 2 * k] = sizes[core_.bn_seg_ + 2 * k + 1] = core_.bns_[k]->channels();
    sizes[core_.stats_seg_] = 2;
    core_.resizeBuffer(std::move(sizes));
  }
  // The shape of one VN's activation at this stage's cuts: each stage
  // learns its input's from the previous one and dry-runs its own layers
  // (no stage holds the others' layers).
  cut_shapes_.assign(static_cast<size_t>(pl.stages) - 1, {});
  {
    torch::NoGradGuard no_grad;
    constexpr int64_t kMaxDims = 8;
    const int64_t vn_size = core_.job_.global_batch / core_.job_.virtual_nodes;
    torch::Tensor x = core_.train_->range(0, vn_size).x;
    const size_t k = static_cast<size_t>(pl.stage);
    if (k > 0) {
      torch::Tensor msg = torch::zeros({kMaxDims + 1}, torch::kInt64);
      pcomm_.pipe->recv(msg, pl.stage - 1, kShapeTag)->wait();
      auto* m = msg.data_ptr<int64_t>();
      cut_shapes_[k - 1].assign(m + 1, m + 1 + m[0]);
      x = torch::zeros(cut_shapes_[k - 1], torch::kFloat32);
    }
    if (k + 1 < static_cast<size_t>(pl.stages)) {
      x = core_.model_->forwardRange(x, lo, hi);
      MORPH_CHECK(x.scalar_type() == torch::kFloat32, "stage outputs must be float32");
      MORPH_CHECK(x.dim() <= kMaxDims, "stage outputs have at most 8 dimensions");
      cut_shapes_[k] = x.sizes().vec();
      torch::Tensor msg = torch::zeros({kMaxDims + 1}, torch::kInt64);
      msg[0] = x.dim();
      for (int64_t d = 0; d < x.dim(); ++d) msg[d + 1] = x.size(d);
      pcomm_.pipe->send(msg, pl.stage + 1, kShapeTag)->wait();
    }
  }
  core_.notePeak();
}

std::pair<size_t, size_t> StageExecutor::layerRange() const {
  return {pipe_.cuts[static_cast<size_t>(pipe_.stage)], pipe_.cuts[static_cast<size_t>(pipe_.stage) + 1]};
}

void StageExecutor::importLayers(const std::map<size_t, NamedTensors>& layers) {
  for (const auto& [l, state] : layers) {
    const auto [lo, hi] = layerRange();
    bool held = lo <= l && l < hi;  // its own (perhaps without any tensor)
    for (const auto& p : core_.model_->layer(l).parameters()) held = held || p.numel() > 0;
    MORPH_CHECK(held, "received layer " + std::to_string(l) + ", which this stage does not hold");
    core_.importLayer(l, state);
  }
  core_.notePeak();
}

std::map<size_t, NamedTensors> moveLayers(const StepCore& core, Communicator& world,
                                          const std::vector<LayerTransfer>& transfers, int64_t* bytes_in) {
  // Tags 2i (length) and 2i + 1 (bytes) for transfer i; every send is
  // posted before the first receive, so no order of the list can deadlock.
  constexpr int kMoveTagBase = 64;
  std::vector<std::unique_ptr<PendingWork>> sends;
  std::vector<torch::Tensor> keep;  // alive until their sends complete
  for (size_t i = 0; i < transfers.size(); ++i) {
    const LayerTransfer& t = transfers[i];
    if (t.src != world.rank()) continue;
    MORPH_CHECK(t.dst != t.src, "a layer moves to its own holder");
    const std::string bytes = encodeTensorFile(core.layerState(t.layer));
    torch::Tensor len = torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kInt64);
    torch::Tensor body = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
    std::memcpy(body.data_ptr<uint8_t>(), bytes.data(), bytes.size());
    sends.push_back(world.send(len, t.dst, kMoveTagBase + 2 * static_cast<int>(i)));
    sends.push_back(world.send(body, t.dst, kMoveTagBase + 2 * static_cast<int>(i) + 1));
    keep.push_back(len);
    keep.push_back(body);
  }
  std::map<size_t, NamedTensors> got;
  for (size_t i = 0; i < transfers.size(); ++i) {
    const LayerTransfer& t = transfers[i];
    if (t.dst != world.rank()) continue;
    torch::Tensor len = torch::zeros({1}, torch::kInt64);
    world.recv(len, t.src, kMoveTagBase + 2 * static_cast<int>(i))->wait();
    const int64_t n = len.item<int64_t>();
    MORPH_CHECK(n > 0 && n < (int64_t{1} << 40), "layer message of " + std::to_string(n) + " bytes");
    torch::Tensor body = torch::empty({n}, torch::kUInt8);
    world.recv(body, t.src, kMoveTagBase + 2 * static_cast<int>(i) + 1)->wait();
    got[t.layer] = decodeTensorFile(std::string(reinterpret_cast<const char*>(body.data_ptr<uint8_t>()),
                                                static_cast<size_t>(n)),
                                    "layer " + std::to_string(t.layer) + " from world rank " + std::to_string(t.src));
    if (bytes_in) *bytes_in += n;
  }
  for (auto& w : sends) w->wait();
  return got;
}

EvalStats StageExecutor::evaluate(const Dataset& test, int64_t batch) {
  const double t0 = nowSeconds();
  torch::NoGradGuard no_grad;
  core_.model_->eval();
  // Back to training mode however evaluation ends: a peer lost mid-way
  // (CommFailure) must not leave dropout off for the steps after a morph.
  struct TrainAgain {
    LayerList& m;
    ~TrainAgain() { m.train(); }
  } train_again{*core_.model_};
  const int P = pipe_.stages, k = pipe_.stage, D = pipe_.replicas, d = pipe_.replica;
  const size_t lo = pipe_.cuts[static_cast<size_t>(k)], hi = pipe_.cuts[static_cast<size_t>(k) + 1];
  const int64_t n = test.size(), batches = (n + batch - 1) / batch;
  double loss = 0.0;
  int64_t correct = 0;
  // This replica's batches; each goes through the stages in order, one at
  // a time (eval is a small part of a run; no overlap needed).
  for (int64_t ib = batches * d / D; ib < batches * (d + 1) / D; ++ib) {
    const int64_t i = ib * batch, e = std::min(n, i + batch);
    Batch b = test.range(i, e);
    torch::Tensor x = b.x;
    if (k > 0) {
      std::vector<int64_t> shape = cut_shapes_[static_cast<size_t>(k) - 1];
      shape[0] = e - i;
      x = torch::empty(shape, torch::kFloat32);
      pcomm_.pipe->recv(x, k - 1, kEvalTag)->wait();
    }
    x = core_.model_->forwardRange(x, lo, hi);
    if (k + 1 < P) {
      pcomm_.pipe->send(x.contiguous(), k + 1, kEvalTag)->wait();
      continue;
    }
    core_.scoreBatch(x, b.y, loss, correct);
  }
  // Each replica's last stage fills its own slots; MAX over the world (the
  // others hold 0, and both sums are >= 0) gives every rank all of them,
  // added in replica order.
  std::vector<double> sums(2 * static_cast<size_t>(D), 0.0);
  if (k + 1 == P) sums[2 * static_cast<size_t>(d)] = loss, sums[2 * static_cast<size_t>(d) + 1] = static_cast<double>(correct);
  pcomm_.world->allreduceMax(sums.data(), static_cast<int64_t>(sums.size()));
  double total_loss = 0, total_correct = 0;
  for (int r = 0; r < D; ++r) total_loss += sums[2 * static_cast<size_t>(r)], total_correct += sums[2 * static_cast<size_t>(r) + 1];
  const double targets = static_cast<double>(n * core_.job_.targetsPerSample());
  return {total_correct / targets, total_loss / targets, nowSeconds() - t0};
}

std::vector<std::string> StageExecutor::layerHashes() const {
  return core_.layerHashes(pipe_.cuts[static_cast<size_t>(pipe_.stage)], pipe_.cuts[static_cast<size_t>(pipe_.stage) + 1]);
}

CheckpointData StageExecutor::exportState() const {
  return core_.exportState(pipe_.cuts[static_cast<size_t>(pipe_.stage)], pipe_.cuts[static_cast<size_t>(pipe_.stage) + 1]);
}

StepStats StageExecutor::step() {
  MORPH_CHECK(pcomm_.world, "place() the stage before its first step");
  // The groups this rank reduces in (pcomm_.pipe only sends and receives).
  auto reduced = [this] {
    int64_t b = pcomm_.world->bytesReduced();
    if (pcomm_.stage && pcomm_.stage != pcomm_.world) b += pcomm_.stage->bytesReduced();
    for (const auto& [set, c] : pcomm_.tied)
      if (c != pcomm_.world) b += c->bytesReduced();
    return b;
  };
  const int64_t bytes0 = reduced();
  StepStats st = core_.runStep([this](int) { runSchedule(); }, [this](std::vector<double>& flags) { reduce(flags); },
                               pcomm_.world);
  st.reduced_bytes = reduced() - bytes0;
  return st;
}

void StageExecutor::abandonStep() { core_.abandonBuffer(); }

// Stage gradients among replicas and shared weights among the stages that
// hold them, with flags and control values (MAX) over every rank while they run;
// then loss statistics (SUM) over every rank. That sum comes last: a rank
// finishes it only if every rank entered it, that is, had finished its own
// stage's sums. Started together, a replica killed between the world's sum
// and its stage's would leave one stage committed at step S + 1 and another
// only at S, and no live morph could put a model together from them. A rank
// killed inside the last sum can still leave it done on some ranks only:
// the others' step is prepared by then (StepCore::prepared()) and a morph
// finishes it (docs/pipeline.md, "One step for every stage").
void StageExecutor::reduce(std::vector<double>& flags) {
  std::vector<std::unique_ptr<PendingWork>> works;
  auto launch = [&](Communicator* c, size_t first, size_t end) { works.push_back(core_.startSum(*c, first, end)); };
  auto finish = [&] {
    for (auto& w : works) w->advance();
    for (auto& w : works) w->wait();
    works.clear();
  };
  if (pcomm_.stage)
    for (auto [a, b] : own_runs_) launch(pcomm_.stage, a, b);
  for (const auto& [s, set] : tied_segs_) launch(pcomm_.tied.at(set), s, s + 1);
  core_.reduceFlags(*pcomm_.world, flags);
  finish();
  core_.markPrepared(flags);
  launch(pcomm_.world, core_.stats_seg_, core_.stats_seg_ + 1);  // zeros but on the last stage
  finish();
  if (core_.probe_ && core_.attempt_ == 1) core_.probe_->atPoint("last-sum", core_.step_);
}

void StageExecutor::runSchedule() {
  const int s = pipe_.stage, P = pipe_.stages;
  const bool first = s == 0, last = s == P - 1;
  const size_t lo = pipe_.cuts[static_cast<size_t>(s)], hi = pipe_.cuts[static_cast<size_t>(s) + 1];
  const int64_t M = vn_end_ - vn_begin_;
  struct Live {
    torch::Tensor in, out, loss, grad;
  };
  std::vector<Live> live(static_cast<size_t>(M));
  std::vector<Action> acts = actions_;
  std::vector<int64_t> act_order, grad_order;
  for (const Action& a : acts) {
    if (a.kind == ActionKind::kRecvAct) act_order.push_back(a.vn);
    if (a.kind == ActionKind::kRecvGrad) grad_order.push_back(a.vn);
  }
  std::unique_ptr<RecvChannel> act_in, grad_in;
  if (!first) {
    act_in = std::make_unique<RecvChannel>(*pcomm_.pipe, s - 1, kActTag, cut_shapes_[static_cast<size_t>(s) - 1]);
    act_in->start(act_order);
  }
  if (!last) {
    grad_in = std::make_unique<RecvChannel>(*pcomm_.pipe, s + 1, kGradTag, cut_shapes_[static_cast<size_t>(s)]);
    grad_in->start(grad_order);
  }
  if (!first && !grad_out_) grad_out_.reset(new SendChannel(*pcomm_.pipe, s - 1, kGradTag));
  if (!last && !act_out_) act_out_.reset(new SendChannel(*pcomm_.pipe, s + 1, kActTag));
  if (first || last) core_.prefetch_.request(core_.step_, vn_begin_);
  auto data = [&](int64_t vn) {
    Batch b = core_.prefetch_.take(core_.step_, vn);
    if (vn + 1 < vn_end_) core_.prefetch_.request(core_.step_, vn + 1);
    return b;
  };
  const bool varuna = pipe_.schedule == ScheduleKind::kVaruna;
  const int64_t stash_bound = runStashBound({pipe_.schedule, P, M, pipe_.recompute}, s);
  StageTiming timing{core_.step_, unixSeconds(), 0.0, 0.0};
  for (size_t i = 0; i < acts.size(); ++i) {
    // Varuna's opportunistic choice: when the gradient this rank waits for
    // is not there yet, run the first later action that can move ahead
    // without breaking the list and whose input is already here.
    if (varuna && acts[i].kind == ActionKind::kRecvGrad && !grad_in->ready(acts[i].vn)) {
      const size_t j = opportunisticMove(
          acts, i,
          [&](const Action& c) { return c.kind == ActionKind::kRecvAct ? act_in->ready(c.vn) : grad_in->ready(c.vn); },
          stash_bound);
      std::rotate(acts.begin() + static_cast<std::ptrdiff_t>(i), acts.begin() + static_cast<std::ptrdiff_t>(j),
                  acts.begin() + static_cast<std::ptrdiff_t>(j) + 1);
    }
    const Action a = acts[i];
    Live& v = live[static_cast<size_t>(a.vn)];
    const int64_t vn = vn_begin_ + a.vn;
    const double a0 = unixSeconds();
    bool compute = false;
    switch (a.kind) {
      case ActionKind::kRecvAct:
        v.in = act_in->take(a.vn);
        break;
      case ActionKind::kRecvGrad:
        v.grad = grad_in->take(a.vn);
        break;
      case ActionKind::kForward: {
        compute = true;
        torch::Tensor y;
        if (first) v.in = data(vn).x;
        if (last) y = data(vn).y;
        if (!first) v.in.requires_grad_(true);
        if (pipe_.recompute && !last) {
          torch::NoGradGuard no_grad;  // only the input is stashed
          v.out = core_.model_->forwardRange(v.in, lo, hi, core_.vnSeed(vn));
        } else {
          v.out = core_.model_->forwardRange(v.in, lo, hi, core_.vnSeed(vn));
        }
        for (size_t k : core_.own_bns_) {
          core_.acc_->add(core_.bn_seg_ + 2 * k, core_.bns_[k]->lastMean().contiguous().data_ptr<float>());
          core_.acc_->add(core_.bn_seg_ + 2 * k + 1, core_.bns_[k]->lastVar().contiguous().data_ptr<float>());
        }
        if (last) {
          v.loss = lossSum(core_.job_.model, v.out, y);
          float stats[2];
          {
            torch::NoGradGuard no_grad;
            stats[0] = v.loss.item<float>();
            stats[1] = static_cast<float>(correctPredictions(core_.job_.model, v.out, y));
          }
          core_.acc_->add(core_.stats_seg_, stats);
        }
        break;
      }
      case ActionKind::kSendAct:
        act_out_->send(v.out.detach().contiguous());
        if (pipe_.recompute) v.out = torch::Tensor();
        break;
      case ActionKind::kRecompute:
        compute = true;
        v.out = core_.model_->forwardRange(v.in, lo, hi, core_.vnSeed(vn));
        break;
      case ActionKind::kBackward:
        compute = true;
        for (size_t p : core_.own_params_) core_.params_[p].mutable_grad() = torch::Tensor();
        core_.vn_ = vn;
        core_.accumulating_ = true;
        if (last) v.loss.backward();
        else if (v.out.requires_grad()) v.out.backward(v.grad);  // else a first stage without parameters
        core_.accumulating_ = false;
        v.out = v.loss = v.grad = torch::Tensor();
        if (first) v.in = torch::Tensor();
        break;
      case ActionKind::kSendGrad:
        grad_out_->send(v.in.grad().contiguous());
        v.in = torch::Tensor();
        break;
    }
    if (compute) core_.emulateSlowdown(unixSeconds() - a0);
    const double a1 = unixSeconds();
    if (compute) timing.busy += a1 - a0;
    if (tracing_) trace_.push_back({toString(a.kind) + " vn " + std::to_string(vn), core_.step_, a0, a1});
  }
  timing.end = unixSeconds();
  if (speed_slot_ >= 0 && M > 0) core_.control_.at(static_cast<size_t>(speed_slot_)) = timing.busy / static_cast<double>(M);
  if (act_out_) act_out_->flush();
  if (grad_out_) grad_out_->flush();
  if (act_in) act_in->finish();
  if (grad_in) grad_in->finish();
  timings_.push_back(timing);
}

std::vector<size_t> evenCuts(size_t layers, int stages) {
  if (stages < 1 || static_cast<size_t>(stages) > layers)
    throw InputError("--stages " + std::to_string(stages) + ": the model has " + std::to_string(layers) +
                     " layers (each stage needs at least one)");
  std::vector<size_t> cuts;
  for (int k = 0; k <= stages; ++k) cuts.push_back(layers * static_cast<size_t>(k) / static_cast<size_t>(stages));
  return cuts;
}

namespace {
int64_t bytesOf(const std::vector<torch::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) n += t.numel() * t.element_size();
  return n;
}
}  // namespace

std::vector<StageMemory> estimateStageMemory(const JobSpec& job, const std::vector<size_t>& cuts,
                                             const ScheduleOptions& so, const Dataset& train) {
  const int64_t runtime = currentRssBytes();
  // Every layer's size from a build that keeps none of them; then one stage
  // at a time is built, as its worker builds it.
  const std::vector<char> none;
  auto shapes_only = buildModel(job.model, job.seed, &none);
  const size_t L = shapes_only->size();
  std::vector<int64_t> layer_bytes(L, 0);
  {
    const auto shapes = shapes_only->parameterShapes();
    size_t i = 0;
    for (size_t l = 0; l < L; ++l)
      for (size_t n = shapes_only->layer(l).parameters().size(); n > 0; --n, ++i)
        layer_bytes[l] += 4 * std::accumulate(shapes[i].begin(), shapes[i].end(), int64_t{1}, std::multiplies<int64_t>());
  }
  int64_t state_per_param = 0;  // optimiser state tensors per parameter tensor
  if (job.optim.name == "adamw") state_per_param = 2;
  else if (job.optim.momentum > 0.0) state_per_param = 1;
  const int64_t elem = job.reduce_mode == ReduceMode::kExact && job.reduce_bits == 64 ? 8 : 4;
  const int64_t vn_size = job.global_batch / job.virtual_nodes;
  Batch b = train.range(0, vn_size);
  torch::Tensor x = b.x;
  std::vector<StageMemory> out;
  for (int k = 0; k < so.stages; ++k) {
    StageMemory m;
    std::vector<char> held(L, 0);
    for (size_t l = cuts[k]; l < cuts[k + 1]; ++l) held[l] = 1;
    // A weight owned by another stage's layer: that layer is built too.
    for (size_t l = cuts[k]; l < cuts[k + 1]; ++l)
      for (auto& [alias, owner] : shapes_only->layer(l).tiedLeaves())
        for (size_t o = 0; o < L; ++o)
          for (const auto& p : shapes_only->layer(o).parameters())
            if (p.unsafeGetTensorImpl() == owner.unsafeGetTensorImpl()) held[o] = 1;
    auto model = buildModel(job.model, job.seed, &held);
    model->train();
    // The stage's parameters, plus the copy of a weight it shares with another stage.
    std::vector<torch::Tensor> own;
    int64_t bn_values = 0, buffer_bytes = 0;
    for (size_t l = cuts[k]; l < cuts[k + 1]; ++l) {
      for (const auto& p : model->layer(l).parameters()) own.push_back(p);
      for (const auto& t : model->layer(l).buffers()) buffer_bytes += t.numel() * t.element_size();
      for (auto& [alias, owner] : model->layer(l).tiedLeaves()) {
        bool held_here = false;  // the owner's layer is on this stage, or a copy is counted already
        for (size_t o = cuts[k]; o < cuts[k + 1]; ++o)
          for (const auto& p : model->layer(o).parameters())
            held_here = held_here || p.unsafeGetTensorImpl() == owner.unsafeGetTensorImpl();
        for (const auto& p : own) held_here = held_here || p.unsafeGetTensorImpl() == owner.unsafeGetTensorImpl();
        if (!held_here) own.push_back(owner);
      }
      for (const auto& sub : model->layer(l).modules(true))
        if (auto* bn = dynamic_cast<VnBatchNorm*>(sub.get())) bn_values += 2 * bn->channels();
    }
    m.grad_bytes = bytesOf(own);
    m.runtime_bytes = runtime;
    // While building, one other layer at a time exists before it is freed.
    for (size_t l = 0; l < L; ++l)
      if (!held[l]) m.init_bytes = std::max(m.init_bytes, layer_bytes[l]);
    m.model_bytes = bytesOf(own) + buffer_bytes;
    m.optimizer_bytes = state_per_param * bytesOf(own);
    // A checkpoint step's snapshot: a copy of the stage's state for its writer.
    if (job.checkpoint_every > 0) m.snapshot_bytes = m.model_bytes + m.optimizer_bytes;
    int64_t own_values = 2 + bn_values;
    for (const auto& p : own) own_values += p.numel();
    m.accumulator_bytes = own_values * elem;
    // Exact mode among D > 1 replicas: the sharded sum's scratch, a chunk
    // of n / D int64s received and its n / D floats (StepCore::startSum),
    // at most 6 bytes per value (D = 2). Counted whether or not the stage
    // has replicas: an estimate that must not be low.
    if (job.reduce_mode == ReduceMode::kExact) m.accumulator_bytes += own_values * 6;
    m.vn_input_bytes = x.numel() * x.element_size();
    torch::Tensor in = x.is_floating_point() ? x.detach().requires_grad_(k > 0) : x;
    const int64_t before = allocatorBytesInUse();
    torch::Tensor y = model->forwardRange(in, cuts[k], cuts[k + 1], 0);
    if (k + 1 == so.stages) y = lossSum(job.model, y, b.y);
    m.vn_activation_bytes = std::max<int64_t>(allocatorBytesInUse() - before, 0);
    m.live_vns = runStashBound(so, k);  // Varuna's run-time moves included
    const bool stashes_input = so.recompute && k + 1 < so.stages;
    // Stashed VNs, plus the VNs received ahead of use on each channel.
    const int64_t recv = (k > 0 ? static_cast<int64_t>(kRecvWindow) * m.vn_input_bytes : 0);
    m.activation_bytes = stashes_input ? m.live_vns * m.vn_input_bytes + m.vn_activation_bytes
                                       : m.live_vns * m.vn_activation_bytes;
    m.activation_bytes += recv;
    out.push_back(m);
    torch::NoGradGuard no_grad;
    x = model->forwardRange(x, cuts[k], cuts[k + 1]);
  }
  return out;
}

}  // namespace morph
