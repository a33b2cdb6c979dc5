#include "exec/trainer.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/model_hash.h"
#include "core/parse_number.h"
#include "core/sys.h"
#include "exec/fixed_point.h"
#include "models/loss.h"

namespace morph {

// Small enough that the first reductions start early in the last VN's
// backward pass, large enough that per-collective latency does not dominate.
int64_t bucketBytes() {
  if (const char* s = std::getenv("MORPH_BUCKET_BYTES")) return parseInt64Or(s, "MORPH_BUCKET_BYTES", 1, int64_t{1} << 40);
  return int64_t{25} << 20;  // as DDP
}

ExactWire exactWire() {
  const char* s = std::getenv("MORPH_EXACT_WIRE");
  if (!s || std::string(s) == "auto") return ExactWire::kAuto;
  if (std::string(s) == "sharded") return ExactWire::kSharded;
  if (std::string(s) == "allreduce") return ExactWire::kAllreduce;
  throw InputError(std::string("MORPH_EXACT_WIRE: '") + s + "' is not one of auto, sharded, allreduce");
}

bool useShardedSum(int64_t values, int group) {
  const ExactWire wire = exactWire();
  return group > 1 && values >= group && wire != ExactWire::kAllreduce &&
         (wire == ExactWire::kSharded || values >= kShardedMinValues);
}

namespace {

const std::vector<char> kNoLayers;  // buildModel's `held` for a stage-local worker before placement
}  // namespace

size_t indexOf(const std::vector<torch::Tensor>& v, const torch::Tensor& t) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i].unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return i;
  MORPH_CHECK(false, "parameter not found");
}

// --- StepCore ---------------------------------------------------------------

StepCore::StepCore(const JobSpec& job, int64_t total_steps, const Dataset& train, bool stage_local)
    : job_(job),
      total_steps_(total_steps),
      train_(&train),
      model_(buildModel(job.model, job.seed, stage_local ? &kNoLayers : nullptr)),
      sampler_(job.seed, train.size(), job.global_batch, job.virtual_nodes),
      prefetch_(train, sampler_) {
  model_->train();
  params_ = model_->parameters();
  const auto shapes = model_->parameterShapes();
  std::vector<int64_t> sizes;
  for (size_t s = 0; s < params_.size(); ++s) {
    const auto& shape = shapes[params_.size() - 1 - s];
    sizes.push_back(std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>()));
  }
  bns_ = model_->batchNorms();
  bn_seg_ = sizes.size();
  for (auto* bn : bns_) {
    sizes.push_back(bn->channels());  // mean
    sizes.push_back(bn->channels());  // unbiased variance
  }
  stats_seg_ = sizes.size();
  sizes.push_back(2);  // loss sum, correct predictions
  seg_sizes_ = sizes;
  // A stage-local worker's buffer holds only the loss statistics until its
  // stage gives it its segments.
  std::vector<int64_t> acc_sizes = sizes;
  if (stage_local) std::fill(acc_sizes.begin(), acc_sizes.begin() + static_cast<std::ptrdiff_t>(stats_seg_), 0);
  opt_ = makeOptimizer(job.optim, params_);
  seg_ready_.assign(sizes.size(), 0);
  seg_need_.assign(sizes.size(), 1);

  // Each hooked leaf k (the parameters, then the tied uses' leaves) is one
  // quantised term per VN of its parameter hooked_param_[k]'s segment.
  auto hook = [this](size_t k, const torch::Tensor& grad) {
    if (!accumulating_) return;
    const size_t seg = segOf(hooked_param_[k]);
    torch::Tensor g = grad.contiguous();
    if (probe_) {
      g = g.clone();
      probe_->onGradient(step_, vn_, attempt_, g);
      if (hold_grads_) held_[k] = g;  // (as the probe left it)
    }
    // A gradient quantised earlier in this backward is garbage in its
    // leaf's grad (autograd stored it after that hook): freed now rather
    // than at the next VN, so that a VN holds no more gradients than the
    // held ones it consumes.
    for (size_t j : consumed_) hooked_[j].mutable_grad() = torch::Tensor();
    consumed_.clear();
    torch::Tensor& held = held_[k];
    if (hold_grads_) {
      // Kept: autograd stores the gradient in the leaf's grad (taking the
      // tensor, no copy), holdGrads() takes it from there.
    } else if (held.defined()) {
      const torch::Tensor a = held.contiguous();
      acc_->addPair(seg, a.data_ptr<float>(), g.data_ptr<float>());
      held = torch::Tensor();
    } else {
      acc_->add(seg, g.data_ptr<float>());
    }
    if (!hold_grads_ && free_consumed_) consumed_.push_back(k);
    ++seg_ready_[seg];
    if (on_grad_) on_grad_();
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    hooked_.push_back(params_[i]);
    hooked_param_.push_back(i);
  }
  // A tied use's gradient is quantised separately and added into the owner's
  // segment: q(a) + q(b), which a pipeline can reproduce across stages.
  for (size_t l = 0; l < model_->size(); ++l)
    for (auto& [alias, owner] : model_->layer(l).tiedLeaves()) {
      const size_t i = indexOf(params_, owner);
      ++seg_need_[segOf(i)];
      hooked_.push_back(alias);
      hooked_param_.push_back(i);
    }
  for (size_t k = 0; k < hooked_.size(); ++k)
    hooked_[k].register_hook([hook, k](const torch::Tensor& g) { hook(k, g); });
  held_.resize(hooked_.size());
  // A tied weight's segment gets two quantised terms per VN: the 32-bit
  // format's bound counts every term of a sum (docs/exact_reduction.md).
  exact_terms_ = job.virtual_nodes * *std::max_element(seg_need_.begin(), seg_need_.end());
  acc_ = std::make_unique<GradAccumulator>(acc_sizes, job.reduce_mode, job.headroom_bits, job.reduce_bits,
                                           exact_terms_);
  // One worker updates every parameter and batch norm (a pipeline stage
  // narrows these).
  own_params_.resize(params_.size());
  std::iota(own_params_.begin(), own_params_.end(), size_t{0});
  own_bns_.resize(bns_.size());
  std::iota(own_bns_.begin(), own_bns_.end(), size_t{0});
  norm_owner_.assign(params_.size(), 1);
  notePeak();
}

void StepCore::setSlowdown(double factor) {
  MORPH_CHECK(factor >= 1.0, "a slowdown factor is >= 1");
  slowdown_ = factor;
}

void StepCore::emulateSlowdown(double compute_seconds) const {
  if (slowdown_ > 1.0)
    std::this_thread::sleep_for(std::chrono::duration<double>((slowdown_ - 1.0) * compute_seconds));
}

uint64_t StepCore::vnSeed(int64_t vn) const {
  return mixSeed(job_.seed, static_cast<uint64_t>(step_), static_cast<uint64_t>(vn), 0x766e);
}

void StepCore::reduceFlags(Communicator& comm, std::vector<double>& flags) {
  const size_t nflags = flags.size();
  flags.insert(flags.end(), control_.begin(), control_.end());
  comm.allreduceMax(flags.data(), static_cast<int64_t>(flags.size()));
  reduced_control_.assign(flags.begin() + static_cast<std::ptrdiff_t>(nflags), flags.end());
  flags.resize(nflags);
}

std::unique_ptr<PendingWork> StepCore::startSum(Communicator& comm, size_t first, size_t end) {
  GradAccumulator& acc = *acc_;
  const int64_t off = acc.segmentOffset(first);
  const int64_t n = acc.segmentOffset(end - 1) + acc.segmentSize(end - 1) - off;
  const int64_t tail = end == acc.segments() ? acc.tailSize() : 0;  // the slots ride in the last bucket
  const int64_t total = n + tail;
  if (acc.mode() == ReduceMode::kFloat) return comm.allreduceSumAsync(acc.floatBuffer() + off, total);
  // Gradients and batch-norm statistics are read as floats divided by a
  // fixed count (runStep); the loss statistics (the last segment) and the
  // slots after them are read as integers' sums, so they stay integers.
  const size_t float_end = std::min(end, stats_seg_);
  const int64_t keep = end > stats_seg_ ? acc.segmentSize(stats_seg_) + tail : 0;
  const bool sharded = float_end > first && useShardedSum(total - keep, comm.size());
  if (acc.bits() == 32) return startSum32(comm, first, end, float_end, tail, sharded);
  if (!sharded) return comm.allreduceSumAsync(acc.exactBuffer() + off, total);
  const double B = static_cast<double>(job_.global_batch * job_.targetsPerSample());
  const double V = static_cast<double>(job_.virtual_nodes);
  std::vector<double> divisors;
  for (size_t s = first; s < float_end; ++s) divisors.push_back(s < bn_seg_ ? B : V);
  acc.markFloats(first, float_end, divisors);
  const GradAccumulator* a = acc_.get();
  return startShardedSum(comm, acc.exactBuffer() + off, total, keep, scratch_[first],
                         [a, first, float_end, off, divisors](int64_t begin, const int64_t* sums, int64_t len,
                                                              float* out) {
                           a->dequantizeRange(first, float_end, divisors, off + begin, sums, len, out);
                         });
}

namespace {
// A sum whose result is unpacked once it is done (reduce.bits = 32: the
// tail's lanes joined back into its int64 values).
class UnpackedSum : public PendingWork {
 public:
  UnpackedSum(std::unique_ptr<PendingWork> inner, std::function<void()> unpack)
      : inner_(std::move(inner)), unpack_(std::move(unpack)) {}
  void advance() override { inner_->advance(); }
  void wait() override {
    inner_->wait();
    if (unpack_) std::exchange(unpack_, nullptr)();
  }

 private:
  std::unique_ptr<PendingWork> inner_;
  std::function<void()> unpack_;
};
}  // namespace

std::unique_ptr<PendingWork> StepCore::startSum32(Communicator& comm, size_t first, size_t end, size_t float_end,
                                                  int64_t tail, bool sharded) {
  // docs/exact_reduction.md, "The 32-bit format": the int32 buffer is the
  // wire. Each value of the run (its sums over every VN of the step fit in
  // int32 by the bound) is summed as it is; the tail's int64 values (slots:
  // doubles' bits among them) travel as 4 lanes of 16 bits each in the
  // lane area after the segments, which follows the run when the tail is
  // in it. One int32 sum; then (sharded) the owner's floats are in the
  // run's memory, and the lanes are joined back into the tail.
  GradAccumulator& acc = *acc_;
  const int64_t off = acc.segmentOffset(first);
  const int64_t n = acc.segmentOffset(end - 1) + acc.segmentSize(end - 1) - off;
  int32_t* run = acc.exact32Buffer() + off;
  int32_t* lanes = run + n;  // == exact32Buffer() + totalElements() when tail > 0
  int64_t* tail64 = acc.exactTail();
  splitLanes(tail64, tail, lanes);
  const int64_t len = n + 4 * tail;
  std::function<void()> join;
  if (tail > 0) join = [lanes, tail, tail64] { joinLanes(lanes, tail, tail64); };
  if (!sharded) {
    std::unique_ptr<PendingWork> work = comm.allreduceSumAsync(run, len);
    if (join) work = std::make_unique<UnpackedSum>(std::move(work), std::move(join));
    return work;
  }
  // The values after the float segments (the loss statistics and the
  // lanes) stay integers.
  const int64_t keep = len - (acc.segmentOffset(float_end - 1) + acc.segmentSize(float_end - 1) - off);
  const double B = static_cast<double>(job_.global_batch * job_.targetsPerSample());
  const double V = static_cast<double>(job_.virtual_nodes);
  std::vector<double> divisors;
  for (size_t s = first; s < float_end; ++s) divisors.push_back(s < bn_seg_ ? B : V);
  acc.markFloats(first, float_end, divisors);
  const GradAccumulator* a = acc_.get();
  std::unique_ptr<PendingWork> work =
      startShardedSum(comm, run, len, keep, scratch_[first],
                      [a, first, float_end, off, divisors](int64_t begin, const int32_t* sums, int64_t count,
                                                           float* out) {
                        a->dequantizeRange(first, float_end, divisors, off + begin, sums, count, out);
                      });
  // The floats in the run's memory as markFloats says (float i at byte 4 i).
  if (join) work = std::make_unique<UnpackedSum>(std::move(work), std::move(join));
  return work;
}

void StepCore::abandonBuffer() {
  std::vector<int> scales = acc_->scales();
  graveyard_acc_.push_back(std::move(acc_));
  if (prepared_) prepared_acc_ = graveyard_acc_.back().get();  // (a later abandon keeps it)
  prepared_ = false;
  graveyard_scratch_.push_back(std::move(scratch_));
  scratch_.clear();
  acc_ = std::make_unique<GradAccumulator>(graveyard_acc_.back()->segmentSizes(), job_.reduce_mode, job_.headroom_bits,
                                           job_.reduce_bits, exact_terms_);
  acc_->setScales(scales);
  accumulating_ = false;
}

void StepCore::holdGrads() {
  for (size_t k = 0; k < hooked_.size(); ++k)
    if (!held_[k].defined()) held_[k] = std::move(hooked_[k].mutable_grad());
}

void StepCore::flushHeld() {
  for (size_t k = 0; k < held_.size(); ++k) {
    if (!held_[k].defined()) continue;
    const torch::Tensor g = held_[k].contiguous();
    acc_->add(segOf(hooked_param_[k]), g.data_ptr<float>());
    held_[k] = torch::Tensor();
  }
}

void StepCore::resizeBuffer(std::vector<int64_t> sizes) {
  const std::vector<int> scales = acc_->scales();
  scratch_.clear();  // no sum is in flight between steps
  acc_ = std::make_unique<GradAccumulator>(std::move(sizes), job_.reduce_mode, job_.headroom_bits, job_.reduce_bits,
                                           exact_terms_);
  acc_->setScales(scales);
}

void StepCore::holdLayers(const std::vector<char>& layers, const std::vector<size_t>& params) {
  const size_t L = model_->size();
  // Where each parameter lives; the layers to build are the held ones and
  // those owning a wanted parameter.
  std::vector<size_t> layer_of;
  for (size_t l = 0; l < L; ++l)
    for (size_t n = model_->layer(l).parameters().size(); n > 0; --n) layer_of.push_back(l);
  std::vector<char> build = layers;
  bool missing = false;
  for (size_t l = 0; l < L; ++l) missing = missing || (layers[l] && model_->isHollow(l));
  for (size_t i : params) {
    build[layer_of[i]] = 1;
    missing = missing || params_[i].numel() == 0;
  }
  torch::NoGradGuard no_grad;
  if (missing) {
    // The same initial weights as a whole-model build: layer l's come from
    // (seed, l) alone. Memory: the built layers plus one other at a time;
    // of a layer built only for a wanted parameter, only that one is kept.
    auto fresh = buildModel(job_.model, job_.seed, &build);
    const std::vector<torch::Tensor> fresh_params = fresh->parameters();
    for (size_t l = 0; l < L; ++l) {
      if (!layers[l] || !model_->isHollow(l)) continue;
      auto live_b = model_->layer(l).buffers(), new_b = fresh->layer(l).buffers();
      for (size_t k = 0; k < live_b.size(); ++k) live_b[k].set_data(new_b[k].detach());
      model_->markHeld(l);
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      const bool want = layers[layer_of[i]] || std::find(params.begin(), params.end(), i) != params.end();
      if (want && params_[i].numel() == 0) params_[i].set_data(fresh_params[i].detach());
    }
  }
  // A shared weight's alias reads its owner's storage.
  for (size_t l = 0; l < L; ++l)
    for (auto& [alias, owner] : model_->layer(l).tiedLeaves())
      if (alias.numel() != owner.numel()) alias.set_data(owner.detach());
}

void StepCore::releaseLayers(const std::vector<char>& layers, const std::vector<size_t>& params) {
  torch::NoGradGuard no_grad;
  for (size_t l = 0; l < model_->size(); ++l) {
    if (layers[l]) continue;
    Layer& m = model_->layer(l);
    for (auto& p : m.parameters()) {
      const size_t i = indexOf(params_, p);
      if (std::find(params.begin(), params.end(), i) != params.end()) continue;
      if (p.numel() > 0) params_[i].set_data(torch::empty({0}, p.options()));
      params_[i].mutable_grad() = torch::Tensor();
      opt_->dropState(i);
    }
    for (auto& b : m.buffers()) b.set_data(torch::empty({0}, b.options()));
    for (auto& [alias, owner] : m.tiedLeaves()) {
      alias.set_data(torch::empty({0}, alias.options()));
      alias.mutable_grad() = torch::Tensor();
    }
    model_->markHollow(l);
  }
}

StepStats StepCore::runStep(const std::function<void(int attempt)>& run,
                            const std::function<void(std::vector<double>& flags)>& reduce,
                            Communicator* norm_world) {
  MORPH_CHECK_LT(step_, total_steps_);
  StepStats st;
  st.step = step_;
  st.lr = learningRate(job_.optim, step_, total_steps_);
  const double t0 = nowSeconds();
  prepared_acc_ = nullptr;
  for (st.attempts = 1;; ++st.attempts) {
    acc_->beginStep();
    prepared_ = false;
    attempt_ = st.attempts;
    run(st.attempts);
    const double r0 = nowSeconds();
    // Flags after the sum: `reduce` reads them from the summed buffer.
    std::vector<double> flags = flags_after_sum_ ? std::vector<double>() : acc_->flagsAndMax();
    reduce(flags);
    if (GradAccumulator::nonfiniteOf(flags))
      throw JobError("non-finite gradient (Inf or NaN) at step " + std::to_string(step_) +
                     "; the last committed step is " + std::to_string(step_ - 1) +
                     " (lower optim.lr or set optim.clip_norm)");
    acc_->updateScales(flags);
    st.reduce_seconds += nowSeconds() - r0;
    if (!GradAccumulator::overflowOf(flags)) break;
    MORPH_CHECK_LT(st.attempts, 8);
    // Redo with the scales from the exact maxima just agreed.
  }
  prepared_ = false;
  if (local_sgd_) {
    finishLocal(*acc_, st);
  } else {
    finishStep(*acc_, st, true, norm_world);
  }
  st.seconds = nowSeconds() - t0;
  return st;
}

void StepCore::markPrepared(const std::vector<double>& flags) {
  prepared_ = !GradAccumulator::nonfiniteOf(flags) && !GradAccumulator::overflowOf(flags) &&
              job_.optim.clip_norm <= 0.0;
  prepared_flags_ = flags;
}

void StepCore::finishPrepared() {
  MORPH_CHECK(prepared_acc_, "no prepared step to finish");
  GradAccumulator& acc = *prepared_acc_;
  prepared_acc_ = nullptr;
  acc.updateScales(prepared_flags_);  // as runStep did on the members that committed
  StepStats st;
  st.step = step_;
  st.lr = learningRate(job_.optim, step_, total_steps_);
  finishStep(acc, st, false, nullptr);
  acc_->setScales(acc.scales());
}

void StepCore::finishStep(GradAccumulator& acc, StepStats& st, bool stats, Communicator* norm_world) {
  // Means over all loss terms of the step (samples x targets per sample).
  // A pipeline stage reads and updates its own parameters and batch norms.
  const double B = static_cast<double>(job_.global_batch * job_.targetsPerSample());
  const double V = static_cast<double>(job_.virtual_nodes);
  for (size_t i : own_params_) {
    torch::Tensor& g = params_[i].mutable_grad();
    if (!g.defined()) g = torch::empty_like(params_[i]);
    acc.read(segOf(i), B, g.data_ptr<float>());
  }
  for (size_t k : own_bns_) {
    torch::Tensor mean = torch::empty({bns_[k]->channels()}), var = torch::empty({bns_[k]->channels()});
    acc.read(bn_seg_ + 2 * k, V, mean.data_ptr<float>());
    acc.read(bn_seg_ + 2 * k + 1, V, var.data_ptr<float>());
    bns_[k]->commitRunningStats(mean, var);
  }
  if (stats) {
    st.loss = acc.readScalar(stats_seg_, 0) / B;
    st.train_accuracy = acc.readScalar(stats_seg_, 1) / B;
  }
  if (job_.optim.clip_norm > 0.0) {
    MORPH_CHECK(stats, "a clipped step is never finished from a prepared buffer");
    // Every tensor's sum of squares, added in parameter order. In a
    // pipeline each comes from the stage that owns it (the others hold 0).
    std::vector<double> sq(params_.size(), 0.0);
    for (size_t i = 0; i < params_.size(); ++i)
      if (norm_owner_[i]) sq[i] = squaredNorm(params_[i].grad());
    if (norm_world) norm_world->allreduceMax(sq.data(), static_cast<int64_t>(sq.size()));
    st.grad_norm = normOfSquares(sq);
    clipToNorm(params_, st.grad_norm, job_.optim.clip_norm);
  }
  opt_->step(st.lr);  // parameters without a gradient (other stages') stay
  ++step_;
}

void StepCore::finishLocal(GradAccumulator& acc, StepStats& st) {
  const double B = static_cast<double>(job_.global_batch * job_.targetsPerSample());
  torch::NoGradGuard no_grad;
  for (size_t i : own_params_) {
    torch::Tensor& g = params_[i].mutable_grad();
    if (!g.defined()) g = torch::empty_like(params_[i]);
    acc.read(segOf(i), B, g.data_ptr<float>());
    params_[i].add_(g, -st.lr);
  }
  st.loss = acc.readScalar(stats_seg_, 0) / B;
  st.train_accuracy = acc.readScalar(stats_seg_, 1) / B;
  ++step_;
}

std::vector<StepCore::Segment> StepCore::segments() const {
  std::vector<Segment> out(seg_sizes_.size());
  for (size_t i = 0; i < params_.size(); ++i) out[segOf(i)] = {Segment::kParam, params_[i], 0.0};
  for (size_t k = 0; k < bns_.size(); ++k) {
    out[bn_seg_ + 2 * k] = {Segment::kBnMean, bns_[k]->runningMean(), bns_[k]->momentum()};
    out[bn_seg_ + 2 * k + 1] = {Segment::kBnVar, bns_[k]->runningVar(), bns_[k]->momentum()};
  }
  out[stats_seg_] = {Segment::kStats, torch::Tensor(), 0.0};
  return out;
}

void StepCore::scoreBatch(const torch::Tensor& out, const torch::Tensor& targets, double& loss, int64_t& correct) const {
  loss += lossSum(job_.model, out, targets).item<double>();
  correct += correctPredictions(job_.model, out, targets);
}

std::vector<std::string> StepCore::layerHashes(size_t lo, size_t hi) const {
  std::vector<std::string> out;
  for (size_t l = lo; l < hi; ++l) out.push_back(modelHash(model_->layer(l)));
  return out;
}

nlohmann::json StepCore::meaning() const {
  const JobSpec& j = job_;
  nlohmann::json m = {
      {"job.seed", j.seed},
      {"job.threads", j.threads},
      {"data.dataset", j.data.dataset},
      {"data.seq_len", j.data.seq_len},
      {"data.train_size", j.data.train_size},
      {"data.test_size", j.data.test_size},
      {"model.name", j.model.name},
      {"model.hidden", j.model.hidden},
      {"model.channels", j.model.channels},
      {"model.fc", j.model.fc},
      {"model.layers", j.model.layers},
      {"model.dim", j.model.dim},
      {"model.heads", j.model.heads},
      {"model.dropout", j.model.dropout},
      {"batch.global", j.global_batch},
      {"batch.virtual_nodes", j.virtual_nodes},
      {"optim.name", j.optim.name},
      {"optim.lr", j.optim.lr},
      {"optim.momentum", j.optim.momentum},
      {"optim.nesterov", j.optim.nesterov},
      {"optim.weight_decay", j.optim.weight_decay},
      {"optim.beta1", j.optim.beta1},
      {"optim.beta2", j.optim.beta2},
      {"optim.eps", j.optim.eps},
      {"optim.warmup_steps", j.optim.warmup_steps},
      {"optim.schedule", j.optim.schedule},
      {"optim.min_lr", j.optim.min_lr},
      {"optim.clip_norm", j.optim.clip_norm},
      {"reduce.mode", toString(j.reduce_mode)},
      {"reduce.headroom_bits", j.headroom_bits},
      {"reduce.bits", j.reduce_bits},
  };
  // Only npy jobs carry these, so checkpoints of the built-in datasets
  // written before they existed still resume.
  if (j.data.dataset == "npy") {
    m["data.mean"] = j.data.mean;
    m["data.std"] = j.data.std;
    m["model.input"] = j.model.input;
    m["model.classes"] = j.model.classes;
  }
  // Only WSP jobs carry these (the same reason): the staleness bound and the
  // wave change what is trained.
  if (j.sync_mode == SyncMode::kWsp) {
    m["sync.mode"] = toString(j.sync_mode);
    m["sync.staleness"] = j.staleness;
    m["sync.wave"] = j.wave;
    // Always, so that a "bypass" job refuses a "bypass_squared" checkpoint;
    // WSP checkpoints written before recorded the default "bypass" by
    // omission (importState() reads its absence so).
    m["sync.stale_update"] = j.stale_update;
    // Recorded the same way; WSP checkpoints from before it were trained "per_clock".
    m["sync.server_steps"] = j.server_steps;
  }
  // Only TorchScript jobs carry these (the same reason): the module file's
  // bytes are its architecture and initial weights.
  if (j.model.name == "torchscript") {
    m["model.loss"] = j.model.loss;
    m["model.file_xxh64"] = j.model.digest;
    if (!j.model.cuts.empty()) m["model.cuts"] = j.model.cuts;
  }
  // The step count shapes only a cosine schedule: elsewhere a resumed job
  // may run longer than it was first meant to.
  if (j.optim.schedule == "cosine") m["job.steps"] = total_steps_;
  return m;
}

std::string StepCore::jobId() const {
  return job_.name + "/" + job_.model.name + "/" + std::to_string(job_.seed);
}

CheckpointData StepCore::exportState(size_t lo, size_t hi) const {
  CheckpointData d;
  d.step = step_;
  d.job_id = jobId();
  d.meta = {{"format", "morph-train-state"},
            {"version", 2},
            {"step", step_},
            {"optim_steps", opt_->stepCount()},
            {"job", meaning()}};
  // The exact reduction's scale state: one exponent per segment of the
  // whole model's layout (the same on every worker).
  const std::vector<int>& scales = acc_->scales();
  d.extra.emplace_back("exact/scales", torch::tensor(std::vector<int32_t>(scales.begin(), scales.end()), torch::kInt32));
  d.first_layer = static_cast<int64_t>(lo);
  for (size_t l = lo; l < hi; ++l) d.layers.emplace_back(model_->layerName(l), layerState(l));
  return d;
}

std::vector<size_t> StepCore::heldLayers() const {
  std::vector<size_t> out;
  for (size_t l = 0; l < model_->size(); ++l) {
    bool held = !model_->isHollow(l);
    for (const auto& p : model_->layer(l).parameters()) held = held || p.numel() > 0;
    if (held) out.push_back(l);
  }
  return out;
}

NamedTensors StepCore::layerState(size_t l) const {
  NamedTensors layer;
  Layer& m = model_->layer(l);
  for (const auto& p : m.named_parameters(true)) {
    layer.emplace_back("param/" + p.key(), p.value());
    for (auto& [sname, st] : opt_->paramState(indexOf(params_, p.value())))
      layer.emplace_back("optim/" + p.key() + "/" + sname, st);
  }
  for (const auto& b : m.named_buffers(true)) layer.emplace_back("buffer/" + b.key(), b.value());
  return layer;
}

void StepCore::importState(const CheckpointData& d, bool partial) {
  if (d.job_id != jobId())
    throw InputError("checkpoint of step " + std::to_string(d.step) + " belongs to job '" + d.job_id +
                     "', not to '" + jobId() + "'");
  if (d.meta.contains("job") && d.meta.at("job").is_object()) {
    // Every key that changes the model must be what the checkpoint was
    // trained with; the others (evaluation, logging, checkpoints, output
    // and data folders) may change.
    const nlohmann::json mine = meaning(), theirs = d.meta.at("job");
    std::string changed;
    for (const auto& [key, value] : mine.items()) {
      // Checkpoints from before reduce.bits were all 64-bit; WSP ones without
      // sync.stale_update were trained with its default, "bypass", and those
      // without sync.server_steps with one server step per clock.
      const nlohmann::json was = theirs.contains(key)               ? theirs.at(key)
                                 : key == "reduce.bits"             ? nlohmann::json(64)
                                 : key == "sync.stale_update"       ? nlohmann::json("bypass")
                                 : key == "sync.server_steps"       ? nlohmann::json("per_clock")
                                                                    : nlohmann::json();
      if (was != value) changed += (changed.empty() ? "" : ", ") + key + " (checkpoint " + was.dump() + ", now " + value.dump() + ")";
    }
    if (!changed.empty())
      throw InputError("checkpoint of step " + std::to_string(d.step) +
                       " was trained with other values of keys that change the model: " + changed);
  }
  const size_t L = model_->size();
  const size_t first = static_cast<size_t>(d.first_layer);
  if (d.first_layer < 0 || first + d.layers.size() > L)
    throw InputError("checkpoint has layers " + std::to_string(d.first_layer) + ".." +
                     std::to_string(d.first_layer + static_cast<int64_t>(d.layers.size()) - 1) + ", the model " +
                     std::to_string(L));
  if (!partial && (first != 0 || d.layers.size() != L))
    throw InputError("checkpoint has " + std::to_string(d.layers.size()) + " layers, the model " + std::to_string(L));
  for (size_t k = 0; k < d.layers.size(); ++k) {
    const size_t l = first + k;
    const auto& [got_name, got] = d.layers[k];
    if (got_name != model_->layerName(l))
      throw InputError("checkpoint layer " + std::to_string(l) + " is '" + got_name + "'; the model's is '" +
                       model_->layerName(l) + "'");
    try {
      importLayer(l, got);
    } catch (const InputError& e) {
      throw InputError(std::string("checkpoint ") + e.what());
    }
  }
  std::vector<int> scales;
  if (d.meta.contains("scales")) {
    scales = d.meta.at("scales").get<std::vector<int>>();  // version 1 kept them in the meta
  } else {
    for (const auto& [name, t] : d.extra)
      if (name == "exact/scales" && t.scalar_type() == torch::kInt32 && t.dim() == 1)
        scales.assign(t.data_ptr<int32_t>(), t.data_ptr<int32_t>() + t.numel());
  }
  if (scales.size() != acc_->scales().size())
    throw InputError("checkpoint of step " + std::to_string(d.step) + " holds " + std::to_string(scales.size()) +
                     " scale exponents, the model's exact reduction " + std::to_string(acc_->scales().size()));
  step_ = d.meta.at("step").get<int64_t>();
  opt_->setStepCount(d.meta.at("optim_steps").get<int64_t>());
  acc_->setScales(scales);
  notePeak();
}

void StepCore::importLayer(size_t l, const NamedTensors& got) {
  const std::string& name = model_->layerName(l);
  const NamedTensors want = layerState(l);
  if (got.size() != want.size())
    throw InputError("layer " + std::to_string(l) + " ('" + name + "') comes with " + std::to_string(got.size()) +
                     " tensors; the model's has " + std::to_string(want.size()));
  torch::NoGradGuard no_grad;
  for (size_t t = 0; t < want.size(); ++t) {
    const torch::Tensor& live = want[t].second;
    if (got[t].first != want[t].first || got[t].second.scalar_type() != live.scalar_type())
      throw InputError("tensor " + name + "/" + got[t].first + " does not match the model's " + name + "/" +
                       want[t].first);
    if (live.numel() == 0 && got[t].second.numel() != 0) continue;  // a tensor this worker does not hold
    if (!got[t].second.sizes().equals(live.sizes()))
      throw InputError("tensor " + name + "/" + got[t].first + " has shape " + c10::str(got[t].second.sizes()) +
                       ", the model's " + c10::str(live.sizes()));
    live.copy_(got[t].second);
  }
}

std::vector<torch::Tensor> StepCore::stateTensors() const {
  std::vector<torch::Tensor> out;
  for (const auto& [name, layer] : exportState(0, model_->size()).layers)
    for (const auto& [tname, t] : layer) out.push_back(t);
  return out;
}

std::vector<int64_t> StepCore::stateMeta() const {
  std::vector<int64_t> m{step_, opt_->stepCount()};
  for (int s : acc_->scales()) m.push_back(s);
  return m;
}

void StepCore::setStateMeta(const std::vector<int64_t>& m) {
  MORPH_CHECK_EQ(m.size(), 2 + acc_->scales().size());
  step_ = m[0];
  opt_->setStepCount(m[1]);
  acc_->setScales(std::vector<int>(m.begin() + 2, m.end()));
}

int64_t StepCore::modelBytes() const {
  int64_t bytes = 0;
  for (const auto& p : params_) bytes += p.numel() * p.element_size();
  return bytes;
}

// --- VnExecutor -------------------------------------------------------------

VnExecutor::VnExecutor(const JobSpec& job, int64_t total_steps, const Dataset& train, Communicator& comm)
    : Executor(job, total_steps, train, /*stage_local=*/false), comm_(&comm) {
  const std::vector<int64_t>& sizes = core_.seg_sizes_;
  // Bytes on the wire per value: the bucket size is DDP's.
  const int64_t elem = job.reduce_mode == ReduceMode::kExact && job.reduce_bits == 64 ? 8 : 4;
  const int64_t kBucketBytes = bucketBytes();
  for (size_t s = 0; s < core_.bn_seg_;) {
    Bucket b{s, s};
    int64_t bytes = 0;
    while (b.end_seg < core_.bn_seg_ && (bytes == 0 || bytes + sizes[b.end_seg] * elem <= kBucketBytes))
      bytes += sizes[b.end_seg++] * elem;
    buckets_.push_back(b);
    s = b.end_seg;
  }
  // The batch-norm statistics and the loss statistics, added after the
  // last VN's backward, are summed with the last gradient bucket (one
  // collective fewer per step: on loopback each costs a round trip of
  // thread wake-ups, bench/float_breakdown.py). In exact mode the sharded
  // sum keeps the loss statistics and the slots as integers (startSum).
  if (!buckets_.empty()) {
    buckets_.back().end_seg = sizes.size();
  } else {
    buckets_.push_back({core_.bn_seg_, sizes.size()});
  }
  core_.on_grad_ = [this] {
    if (launching_) launchReadyBuckets(false);
  };
  core_.flags_after_sum_ = true;
  setVnRange(0, job.virtual_nodes);
}

void VnExecutor::setVnRange(int64_t begin, int64_t end) {
  // At least one VN: a worker's buckets start at the end of its last VN
  // (every plan gives each member one or more).
  MORPH_CHECK(0 <= begin && begin < end && end <= core_.job_.virtual_nodes, "bad VN range");
  vn_begin_ = begin;
  vn_end_ = end;
}

void VnExecutor::abandonStep() {
  for (auto& w : inflight_) graveyard_work_.push_back(std::move(w));
  inflight_.clear();
  core_.abandonBuffer();
  launching_ = false;
}

void VnExecutor::launchReadyBuckets(bool all) {
  while (next_bucket_ < buckets_.size()) {
    const Bucket& b = buckets_[next_bucket_];
    if (!all)
      for (size_t s = b.first_seg; s < b.end_seg; ++s)
        if (core_.seg_ready_[s] < core_.seg_need_[s]) return;
    inflight_.push_back(core_.startSum(*comm_, b.first_seg, b.end_seg));
    ++next_bucket_;
  }
}

void VnExecutor::runVn(int64_t vn, bool last, bool hold) {
  StepCore& c = core_;
  const double t0 = nowSeconds();
  Batch b = c.prefetch_.take(c.step_, vn);
  for (auto& p : c.hooked_) p.mutable_grad() = torch::Tensor();  // (a tied use's leaf too)
  std::fill(c.seg_ready_.begin(), c.seg_ready_.end(), 0);
  // (b, classes), or (b, T, vocab) for a language model, or an mse target's values.
  // The VN's own random streams: the same draws wherever and whenever it runs.
  torch::Tensor out = c.model_->forwardRange(b.x, 0, c.model_->size(), c.vnSeed(vn));
  torch::Tensor loss = lossSum(c.job_.model, out, b.y);
  c.vn_ = vn;
  c.accumulating_ = true;
  c.hold_grads_ = hold && !last;
  c.free_consumed_ = true;
  launching_ = last;
  loss.backward();
  c.accumulating_ = launching_ = false;
  for (size_t j : c.consumed_) c.hooked_[j].mutable_grad() = torch::Tensor();
  c.consumed_.clear();
  c.free_consumed_ = false;
  if (c.hold_grads_) {
    c.holdGrads();
  } else {
    // A gradient held from the VN before and met by none of this VN's (a
    // parameter this VN did not use) is quantised alone.
    c.flushHeld();
  }
  c.hold_grads_ = false;
  size_t seg = c.bn_seg_;
  for (auto* bn : c.bns_) {
    c.acc_->add(seg++, bn->lastMean().contiguous().data_ptr<float>());
    c.acc_->add(seg++, bn->lastVar().contiguous().data_ptr<float>());
  }
  float stats[2];
  {
    torch::NoGradGuard no_grad;
    stats[0] = loss.item<float>();
    stats[1] = static_cast<float>(correctPredictions(c.job_.model, out, b.y));
  }
  c.acc_->add(c.stats_seg_, stats);
  c.emulateSlowdown(nowSeconds() - t0);
  if (last) {
    writeSlots();
    launchReadyBuckets(true);
  }
}

size_t VnExecutor::slotValues() const {
  const StepCore& c = core_;
  return c.control_.size() + (c.acc_->mode() == ReduceMode::kExact ? 2 + c.acc_->segments() : 0);
}

void VnExecutor::writeSlots() {
  StepCore& c = core_;
  if (speed_slot_ >= 0 && run_vns_ > 0)
    c.control_.at(static_cast<size_t>(speed_slot_)) = (nowSeconds() - run_start_) / static_cast<double>(run_vns_);
  const bool exact = c.acc_->mode() == ReduceMode::kExact;
  std::vector<double> v = exact ? c.acc_->flagsAndMax() : std::vector<double>();
  v.insert(v.end(), c.control_.begin(), c.control_.end());
  MORPH_CHECK_EQ(v.size(), slotValues());
  MORPH_CHECK_EQ(c.acc_->tailSize(), static_cast<int64_t>(v.size()) * comm_->size());
  const size_t at = static_cast<size_t>(comm_->rank()) * v.size();
  for (size_t j = 0; j < v.size(); ++j) {
    if (exact) {
      std::memcpy(c.acc_->exactTail() + at + j, &v[j], sizeof(double));  // its bits: + 0 keeps them
    } else {
      c.acc_->floatTail()[at + j] = static_cast<float>(v[j]);
    }
  }
}

std::vector<double> VnExecutor::readSlots() const {
  const StepCore& c = core_;
  const bool exact = c.acc_->mode() == ReduceMode::kExact;
  const size_t n = slotValues();
  std::vector<double> out(n, 0.0);
  for (int r = 0; r < comm_->size(); ++r)
    for (size_t j = 0; j < n; ++j) {
      const size_t i = static_cast<size_t>(r) * n + j;
      double v;
      if (exact) {
        std::memcpy(&v, c.acc_->exactTail() + i, sizeof(double));
      } else {
        v = c.acc_->floatTail()[i];
      }
      if (r == 0 || v > out[j]) out[j] = v;
    }
  return out;
}

StepStats VnExecutor::step() {
  std::vector<int64_t> order(static_cast<size_t>(vn_end_ - vn_begin_));
  std::iota(order.begin(), order.end(), vn_begin_);
  if (core_.probe_) {
    std::vector<int64_t> sorted = order;
    order = core_.probe_->vnOrder(order);
    std::vector<int64_t> check = order;
    std::sort(check.begin(), check.end());
    MORPH_CHECK(check == sorted, "a VN order must permute the worker's VN range");
  }
  // The flags, maxima and control values ride in the last bucket's sum,
  // each worker's in its own slots (writeSlots): no MAX all-reduce, one
  // collective fewer per step.
  core_.acc_->setTail(static_cast<int64_t>(slotValues()) * comm_->size());
  run_vns_ = static_cast<int64_t>(order.size());
  auto run = [&](int attempt) {
    if (core_.probe_ && attempt == 1) core_.probe_->atPoint("compute", core_.step_);
    run_start_ = nowSeconds();
    next_bucket_ = 0;
    core_.dropHeld();  // (an attempt redone, or abandoned, may leave some)
    // Exact mode quantises the VNs' gradients in pairs (docs/exact_reduction.md,
    // "Two VNs in one pass"): each even-numbered VN's are held for the next.
    const bool pairs = core_.acc_->mode() == ReduceMode::kExact;
    for (size_t k = 0; k < order.size(); ++k) {
      if (k + 1 < order.size()) core_.prefetch_.request(core_.step_, order[k + 1]);
      runVn(order[k], k + 1 == order.size(), pairs && k % 2 == 0);
    }
  };
  // The buffer's buckets are in flight (started during the last VN's
  // backward). The flags and maxima decide whether their sum is usable.
  auto reduce = [&](std::vector<double>& flags) {
    const bool first = core_.attempt_ == 1;
    if (core_.probe_ && first) core_.probe_->atPoint("reduce", core_.step_);
    for (auto& w : inflight_) w->advance();
    for (auto& w : inflight_) w->wait();
    inflight_.clear();
    if (core_.probe_ && first) core_.probe_->atPoint("reduced", core_.step_);
    std::vector<double> g = readSlots();
    const size_t nflags = g.size() - core_.control_.size();
    core_.reduced_control_.assign(g.begin() + static_cast<std::ptrdiff_t>(nflags), g.end());
    if (core_.acc_->mode() == ReduceMode::kExact) {
      g.resize(nflags);
      flags = std::move(g);
    } else {
      // A non-finite value on any worker makes the sum non-finite, and
      // every worker holds the same sum: all of them see the same flags.
      flags = core_.acc_->flagsAndMax();
    }
    if (!order.empty() && core_.step_ + 1 < core_.total_steps_) core_.prefetch_.request(core_.step_ + 1, order.front());
  };
  const int64_t bytes0 = comm_->bytesReduced();
  StepStats st = core_.runStep(run, reduce, nullptr);
  st.reduced_bytes = comm_->bytesReduced() - bytes0;
  return st;
}

StepStats VnExecutor::localStep() {
  Communicator* world = comm_;
  comm_ = &alone_;
  core_.setLocalSgd(true);
  struct Restore {
    VnExecutor* ex;
    Communicator* world;
    ~Restore() {
      ex->comm_ = world;
      ex->core_.setLocalSgd(false);
    }
  } restore{this, world};
  StepStats st = step();
  // Means over this worker's own samples (finishLocal divides by the global batch).
  const double share = static_cast<double>(core_.job_.virtual_nodes) / static_cast<double>(vn_end_ - vn_begin_);
  st.loss *= share;
  st.train_accuracy *= share;
  return st;
}

EvalStats VnExecutor::evaluate(const Dataset& test, int64_t batch) {
  const double t0 = nowSeconds();
  torch::NoGradGuard no_grad;
  LayerList& model = *core_.model_;
  model.eval();
  int64_t correct = 0;
  double loss = 0.0;
  const int64_t n = test.size();
  for (int64_t i = 0; i < n; i += batch) {
    Batch b = test.range(i, std::min(n, i + batch));
    core_.scoreBatch(model.forward(b.x), b.y, loss, correct);
  }
  model.train();
  const double targets = static_cast<double>(n * core_.job_.targetsPerSample());
  return {static_cast<double>(correct) / targets, loss / targets, nowSeconds() - t0};
}

std::string VnExecutor::hash() const {
  std::vector<std::pair<std::string, std::string>> layers;
  const std::vector<std::string> h = layerHashes();
  for (size_t l = 0; l < h.size(); ++l) layers.emplace_back(core_.model_->layerName(l), h[l]);
  return layeredHash(layers);
}

}  // namespace morph
